/*
 * cuda_ipc.c - GPU memory shared between processes, the importing side (see cuda_ipc.h).
 */
#include "transport/cuda_ipc/cuda_ipc.h"

#include "proto/wire.h"

#include <stdint.h>
#include <string.h>

/* The minimum granularity of an allocation's mappings. */
static CUresult granularity(const colld_cu_t *cu, CUmemGenericAllocationHandle h, size_t *gran)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    CUresult r = CU_CHECK(cu, cuMemGetAllocationPropertiesFromHandle, &prop, h);
    if (r == CUDA_SUCCESS)
        r = CU_CHECK(cu, cuMemGetAllocationGranularity, gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    return r;
}

/* Unmap the first n segments mapped back to back from p. */
static void unmap_first(const colld_cu_t *cu, CUdeviceptr p, const size_t *sizes, unsigned n)
{
    size_t off = 0;
    for (unsigned i = 0; i < n; i++) {
        CU_CHECK(cu, cuMemUnmap, p + off, sizes[i]);
        off += sizes[i];
    }
}

CUresult colld_cuda_ipc_map_segments(const colld_cu_t *cu, const CUmemGenericAllocationHandle *h, const size_t *sizes,
                                     unsigned n, const CUdevice *access, int naccess, CUdeviceptr *out)
{
    size_t gran = 0, total = 0;
    CUresult r = n ? granularity(cu, h[0], &gran) : CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n && r == CUDA_SUCCESS; i++) {
        if (sizes[i] == 0 || (gran && sizes[i] % gran) || total + sizes[i] < total)
            r = CUDA_ERROR_INVALID_VALUE;
        total += sizes[i];
    }
    if (r != CUDA_SUCCESS)
        return r;
    CUdeviceptr p = 0;
    if ((r = CU_CHECK(cu, cuMemAddressReserve, &p, total, gran, 0, 0)) != CUDA_SUCCESS)
        return r;
    CUmemAccessDesc acc[64];
    int na = 0;
    for (int j = 0; j < naccess && na < 64; j++) {
        acc[na].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc[na].location.id = (int)access[j];
        acc[na].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        na++;
    }
    /* cuMemMap refuses a size beyond the allocation: that is each segment's bounds check. Access
     * is set per mapping (one call over several mappings is not documented for every driver). */
    unsigned mapped = 0;
    size_t off = 0;
    for (; mapped < n && r == CUDA_SUCCESS; mapped++) {
        if ((r = CU_CHECK(cu, cuMemMap, p + off, sizes[mapped], 0, h[mapped], 0)) != CUDA_SUCCESS)
            break;
        if ((r = CU_CHECK(cu, cuMemSetAccess, p + off, sizes[mapped], acc, (size_t)na)) != CUDA_SUCCESS) {
            mapped++; /* mapped, without its access */
            break;
        }
        off += sizes[mapped];
    }
    if (r != CUDA_SUCCESS) {
        unmap_first(cu, p, sizes, mapped);
        CU_CHECK(cu, cuMemAddressFree, p, total);
        return r;
    }
    *out = p;
    return CUDA_SUCCESS;
}

void colld_cuda_ipc_close_segments(const colld_cu_t *cu, CUdeviceptr p, const size_t *sizes, unsigned n)
{
    size_t total = 0;
    for (unsigned i = 0; i < n; i++)
        total += sizes[i];
    unmap_first(cu, p, sizes, n);
    CU_CHECK(cu, cuMemAddressFree, p, total);
}

CUresult colld_cuda_ipc_import(const colld_cu_t *cu, int fd, CUmemGenericAllocationHandle *h, int *dev)
{
    CUresult r = CU_CHECK(cu, cuMemImportFromShareableHandle, h, (void *)(uintptr_t)fd,
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS)
        return r;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    if ((r = CU_CHECK(cu, cuMemGetAllocationPropertiesFromHandle, &prop, *h)) != CUDA_SUCCESS ||
        prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
        CU_CHECK(cu, cuMemRelease, *h);
        return r != CUDA_SUCCESS ? r : CUDA_ERROR_INVALID_VALUE;
    }
    *dev = prop.location.id;
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
            r = colld_cuda_ipc_map_segments(cu, &h, &bytes, 1, access, naccess, &p);
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
