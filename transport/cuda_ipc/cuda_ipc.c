/*
 * cuda_ipc.c - GPU memory shared between processes, the importing side (see cuda_ipc.h).
 */
#include "transport/cuda_ipc/cuda_ipc.h"

#include "proto/wire.h"

#include <stdint.h>
#include <string.h>

/* Map an imported VMM allocation of `bytes` into a fresh range, accessible to every device in
 * access[naccess]. Returns CUDA_SUCCESS or the failing call's error. */
static CUresult vmm_map(const colld_cu_t *cu, CUmemGenericAllocationHandle h, size_t bytes, const CUdevice *access,
                        int naccess, CUdeviceptr *out)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    CUresult r = CU_CHECK(cu, cuMemGetAllocationPropertiesFromHandle, &prop, h);
    size_t gran = 0;
    if (r == CUDA_SUCCESS)
        r = CU_CHECK(cu, cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS)
        return r;
    if (gran && bytes % gran)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = 0;
    if ((r = CU_CHECK(cu, cuMemAddressReserve, &p, bytes, gran, 0, 0)) != CUDA_SUCCESS)
        return r;
    if ((r = CU_CHECK(cu, cuMemMap, p, bytes, 0, h, 0)) != CUDA_SUCCESS) {
        CU_CHECK(cu, cuMemAddressFree, p, bytes);
        return r;
    }
    CUmemAccessDesc acc[64];
    int na = 0;
    for (int j = 0; j < naccess && na < 64; j++) {
        acc[na].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc[na].location.id = (int)access[j];
        acc[na].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        na++;
    }
    if ((r = CU_CHECK(cu, cuMemSetAccess, p, bytes, acc, (size_t)na)) != CUDA_SUCCESS) {
        CU_CHECK(cu, cuMemUnmap, p, bytes);
        CU_CHECK(cu, cuMemAddressFree, p, bytes);
        return r;
    }
    *out = p;
    return CUDA_SUCCESS;
}

CUresult colld_cuda_ipc_open(const colld_cu_t *cu, int how, const uint8_t *ipc, int fd, size_t bytes,
                             const CUdevice *access, int naccess, CUdeviceptr *out, size_t *mapped)
{
    CUdeviceptr p = 0;
    CUresult r;
    *mapped = 0;
    if (how == COLLD_CUDA_EXPORT_IPC) {
        CUipcMemHandle h;
        memcpy(h.reserved, ipc, sizeof(h.reserved));
        r = CU_CHECK(cu, cuIpcOpenMemHandle, &p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (r == CUDA_SUCCESS) {
            /* Bounds come from what the driver mapped, not from what the client said. */
            CUdeviceptr base = 0;
            size_t size = 0;
            if (CU_CHECK(cu, cuMemGetAddressRange, &base, &size, p) == CUDA_SUCCESS && base == p)
                *mapped = size;
        }
    } else {
        CUmemGenericAllocationHandle h = 0;
        r = CU_CHECK(cu, cuMemImportFromShareableHandle, &h, (void *)(uintptr_t)fd,
                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r == CUDA_SUCCESS) {
            /* cuMemMap refuses a size beyond the allocation: that is the bounds check. The
             * mapping holds the memory; the handle is released at once. */
            r = vmm_map(cu, h, bytes, access, naccess, &p);
            CU_CHECK(cu, cuMemRelease, h);
            *mapped = bytes;
        }
    }
    *out = p;
    return r;
}

void colld_cuda_ipc_close(const colld_cu_t *cu, int how, CUdeviceptr p, size_t size)
{
    if (how == COLLD_CUDA_EXPORT_IPC) {
        CU_CHECK(cu, cuIpcCloseMemHandle, p);
    } else {
        CU_CHECK(cu, cuMemUnmap, p, size);
        CU_CHECK(cu, cuMemAddressFree, p, size);
    }
}
