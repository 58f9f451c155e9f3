/*
 * cuda_ipc.h - GPU memory shared between processes, the importing side: what the daemon does with
 * the CUDA IPC handle of a cuMemAlloc/cudaMalloc allocation or the POSIX fd of a VMM (cuMemCreate)
 * allocation that a client sent it (COLLD_MSG_REG_CUDA, proto/wire.h).
 *
 * Built only where the CUDA toolkit's headers are found (COLLD_HAVE_CUDA). The caller has made the
 * GPU's context current. Every driver call goes through CU_CHECK (common/cudadrv.h).
 */
#ifndef COLLD_TRANSPORT_CUDA_IPC_H
#define COLLD_TRANSPORT_CUDA_IPC_H

#include "common/cudadrv.h"

#include <stddef.h>
#include <stdint.h>

/* Open an allocation: `how` is COLLD_CUDA_EXPORT_IPC (ipc: the handle's bytes) or
 * COLLD_CUDA_EXPORT_FD (fd: the shareable handle, mapped into a fresh range of `bytes` that the
 * devices in access[naccess] may read and write). On success *out is the address and *mapped what
 * really lies behind it (an IPC allocation's own size: the bounds of every reference; a VMM mapping
 * is refused beyond the allocation, so it is `bytes`). Returns CUDA_SUCCESS or the failing call's
 * error (nothing stays open). */
CUresult colld_cuda_ipc_open(const colld_cu_t *cu, int how, const uint8_t *ipc, int fd, size_t bytes,
                             const CUdevice *access, int naccess, CUdeviceptr *out, size_t *mapped);
/* Close what colld_cuda_ipc_open opened (size: the `bytes` it was opened with). */
void colld_cuda_ipc_close(const colld_cu_t *cu, int how, CUdeviceptr p, size_t size);

/* A buffer across several VMM allocations (COLLD_MSG_REG_CUDA_SEG, proto/wire.h), in two steps.
 * Import one allocation's POSIX fd (not mapped): its handle in *h (the caller releases it with
 * cuMemRelease, or lets colld_cuda_ipc_map_segments map it) and the device it lives on in *dev.
 * CUDA_SUCCESS or the failing call's error (nothing held). */
CUresult colld_cuda_ipc_import(const colld_cu_t *cu, int fd, CUmemGenericAllocationHandle *h, int *dev);
/* Map n imported allocations back to back into one fresh range: the first sizes[i] bytes of h[i]
 * at *out + the sizes before it, each readable and writable by the devices in access[naccess].
 * The mappings hold the memory; the handles stay the caller's. CUDA_SUCCESS, or the failing call's
 * error with nothing left mapped or reserved. */
CUresult colld_cuda_ipc_map_segments(const colld_cu_t *cu, const CUmemGenericAllocationHandle *h, const size_t *sizes,
                                     unsigned n, const CUdevice *access, int naccess, CUdeviceptr *out);
/* Unmap what colld_cuda_ipc_map_segments mapped and free its range. */
void colld_cuda_ipc_close_segments(const colld_cu_t *cu, CUdeviceptr p, const size_t *sizes, unsigned n);

#endif /* COLLD_TRANSPORT_CUDA_IPC_H */
