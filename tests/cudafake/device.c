/*
 * device.c - devices, their attributes, primary contexts, each thread's context stack and peer
 * access in the CUDA driver test double.
 *
 * The double has only primary contexts (cuCtxCreate is not offered: colld never calls it). A
 * primary context is created by the retain that takes its count from 0 to 1 and destroyed by
 * the release that brings it back to 0, or by cuDevicePrimaryCtxReset: then its streams stop
 * (queued work is dropped), its events become invalid handles, its cuMemAlloc memory is freed and
 * its IPC mappings closed and its host registrations dropped, peer access to and from it is
 * disabled, and a sticky error is cleared. VMM allocations and mappings and loaded libraries are
 * not tied to a context and survive (README.md).
 */
#include "tests/cudafake/fake.h"

#include <stdio.h>
#include <string.h>

static __thread fk_ctx_t *tls_stack[FK_CTX_STACK];
static __thread int tls_depth;

/* ============================================================================================
 * Devices
 * ========================================================================================== */

const fk_device_spec_t *fk_dev(int dev)
{
    return dev >= 0 && dev < fk.cfg.ndev ? &fk.cfg.dev[dev] : NULL;
}

/* The ordinal of the device with this UUID, -1 if it is not visible here. */
int fk_dev_by_uuid(const unsigned char *uuid)
{
    for (int i = 0; i < fk.cfg.ndev; i++)
        if (memcmp(fk.cfg.dev[i].uuid.bytes, uuid, 16) == 0)
            return i;
    return -1;
}

/* Can device a reach device b's memory (distinct devices of one peer group)? */
bool fk_dev_peer_capable(int a, int b)
{
    const fk_device_spec_t *da = fk_dev(a), *db = fk_dev(b);
    return da && db && a != b && da->peer_group == db->peer_group;
}

/* The value of a device attribute; false for an attribute the double does not model. */
static bool attribute(int dev, int attr, int *out)
{
    const fk_device_spec_t *d = fk_dev(dev);
    for (int i = 0; i < d->nattrs; i++)
        if (d->attrs[i].attr == attr) {
            *out = d->attrs[i].value;
            return true;
        }
    int v;
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = d->sms; break;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = CU_COMPUTEMODE_DEFAULT; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x18 + dev; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 50 << 20; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 3; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = d->cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = d->cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 0; break; /* cuMemAllocManaged is not offered */
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1: v = d->memops_v1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1: v = d->memops_v1 && d->memops64; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1: v = d->memops_v1 && d->wait_nor; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES: v = d->flush; break;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = d->vmm; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = d->vmm && d->posix_fd; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 0; break; /* cuMemAllocAsync is not offered */
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: v = d->memops && d->memops64; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: v = d->memops && d->wait_nor; break;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: v = 0; break; /* cuIpcGetEventHandle is not offered */
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MPS_ENABLED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_NUMA_CONFIG: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: v = 0; break;
    default: return false;
    }
    *out = v;
    return true;
}

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    FK_BEGIN(cuDeviceGetCount);
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = fk.cfg.ndev;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    FK_BEGIN(cuDeviceGet);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_dev(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    FK_BEGIN(cuDeviceGetName);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", fk_dev(dev)->name);
    return CUDA_SUCCESS;
}

/* The double has no MIG instances: both variants give the device's UUID. */
CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    FK_BEGIN(cuDeviceGetUuid);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *uuid = fk_dev(dev)->uuid;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid_v2(uuid, dev);
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    FK_BEGIN(cuDeviceGetAttribute);
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!attribute(dev, (int)attrib, pi)) {
        fk_log("device attribute %d is not modelled by the double: add it to tests/cudafake/device.c", (int)attrib);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    FK_BEGIN(cuDeviceTotalMem);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = fk_dev(dev)->total_mem;
    return CUDA_SUCCESS;
}

/* As the driver: 0 for a device and itself. */
CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    FK_BEGIN(cuDeviceCanAccessPeer);
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_dev(dev) || !fk_dev(peerDev))
        return CUDA_ERROR_INVALID_DEVICE;
    *canAccessPeer = fk_dev_peer_capable(dev, peerDev);
    return CUDA_SUCCESS;
}

/* ============================================================================================
 * Contexts
 * ========================================================================================== */

static fk_ctx_t *ctx_of(CUcontext h)
{
    fk_ctx_t *c = (fk_ctx_t *)h;
    if (c < &fk.ctx[0] || c >= &fk.ctx[fk.cfg.ndev] || (uintptr_t)((char *)c - (char *)&fk.ctx[0]) % sizeof(*c))
        return NULL;
    return c;
}

/* The top of this thread's context stack. */
fk_ctx_t *fk_ctx_current(void)
{
    return tls_depth ? tls_stack[tls_depth - 1] : NULL;
}

/* Can ctx be used? Its sticky error, or CUDA_ERROR_CONTEXT_IS_DESTROYED (lock held). */
CUresult fk_ctx_check(fk_ctx_t *ctx)
{
    if (!ctx->active)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return ctx->sticky;
}

/* The current context, checked (CUDA_ERROR_INVALID_CONTEXT when there is none). */
CUresult fk_ctx_get(fk_ctx_t **out)
{
    fk_ctx_t *c = fk_ctx_current();
    *out = c;
    return c ? fk_ctx_check(c) : CUDA_ERROR_INVALID_CONTEXT;
}

/* Make r the context's sticky error (the first one stays), and say so. */
void fk_ctx_set_sticky(fk_ctx_t *ctx, CUresult r, const char *why)
{
    if (ctx->sticky != CUDA_SUCCESS || !ctx->active)
        return;
    ctx->sticky = r;
    fk_log("device %d: sticky error %s (%s): every call on this context fails until cuDevicePrimaryCtxReset",
           ctx->dev, fk_result_name(r) ? fk_result_name(r) : "?", why);
    pthread_cond_broadcast(&fk.cv);
}

/* Destroy a context's resources (lock held; dropped and retaken while its streams stop). */
static void ctx_destroy(fk_ctx_t *ctx)
{
    fk_streams_ctx_destroyed(ctx);
    fk_ipc_ctx_destroyed(ctx);
    fk_mem_ctx_destroyed(ctx);
    for (int i = 0; i < fk.cfg.ndev; i++)
        fk.ctx[i].peer &= ~(1u << ctx->dev);
    ctx->peer = 0;
    ctx->sticky = CUDA_SUCCESS;
    ctx->generation++;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    FK_BEGIN(cuDevicePrimaryCtxRetain);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fk.mu);
    fk_ctx_t *c = &fk.ctx[dev];
    if (c->retains++ == 0)
        c->active = true;
    pthread_mutex_unlock(&fk.mu);
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    FK_BEGIN(cuDevicePrimaryCtxRelease);
    if (!fk_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fk.mu);
    fk_ctx_t *c = &fk.ctx[dev];
    CUresult r = CUDA_SUCCESS;
    if (c->retains == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--c->retains == 0) {
        ctx_destroy(c);
        c->active = false;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return cuDevicePrimaryCtxRelease_v2(dev);
}

/* Destroy every resource of the primary context now and clear its sticky error; it stays
 * retained (and active, if it was) for the next use. */
CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    FK_BEGIN(cuDevicePrimaryCtxReset);
    if (!fk_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fk.mu);
    fk_ctx_t *c = &fk.ctx[dev];
    ctx_destroy(c);
    c->flags = 0;
    pthread_mutex_unlock(&fk.mu);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
    return cuDevicePrimaryCtxReset_v2(dev);
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    FK_BEGIN(cuDevicePrimaryCtxGetState);
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fk.mu);
    *flags = fk.ctx[dev].flags;
    *active = fk.ctx[dev].active;
    pthread_mutex_unlock(&fk.mu);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    FK_BEGIN(cuDevicePrimaryCtxSetFlags);
    const unsigned known = CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX | CU_CTX_COREDUMP_ENABLE |
                           CU_CTX_USER_COREDUMP_ENABLE | CU_CTX_SYNC_MEMOPS;
    if (!fk_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if ((flags & ~known) || (flags & CU_CTX_SCHED_MASK) == (CU_CTX_SCHED_MASK & ~0u) ||
        __builtin_popcount(flags & CU_CTX_SCHED_MASK) > 1)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    fk.ctx[dev].flags = flags;
    pthread_mutex_unlock(&fk.mu);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    FK_BEGIN(cuCtxSetCurrent);
    fk_ctx_t *c = NULL;
    if (ctx && !(c = ctx_of(ctx)))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!c) {
        if (tls_depth)
            tls_depth--;
        return CUDA_SUCCESS;
    }
    if (tls_depth == 0)
        tls_depth = 1;
    tls_stack[tls_depth - 1] = c;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    FK_BEGIN(cuCtxGetCurrent);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)fk_ctx_current();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    FK_BEGIN(cuCtxPushCurrent);
    fk_ctx_t *c = ctx_of(ctx);
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_depth == FK_CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    tls_stack[tls_depth++] = c;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    FK_BEGIN(cuCtxPopCurrent);
    if (tls_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    fk_ctx_t *c = tls_stack[--tls_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

/* A context's id, unique for the life of the process as the driver's: a primary context reset or
 * destroyed and made again gets another (its generation is part of it), its handle staying the same. */
CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    FK_BEGIN(cuCtxGetId);
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *c = ctx ? ctx_of(ctx) : fk_ctx_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fk.mu);
    CUresult r = c->active ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (r == CUDA_SUCCESS)
        *id = c->generation * FK_MAX_DEVICES + (unsigned long long)c->dev + 1;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    FK_BEGIN(cuCtxGetDevice);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *c = ctx ? ctx_of(ctx) : fk_ctx_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_check(c);
    pthread_mutex_unlock(&fk.mu);
    if (r == CUDA_SUCCESS)
        *device = c->dev;
    return r;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
    return cuCtxGetDevice_v2(device, NULL);
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    FK_BEGIN(cuCtxEnablePeerAccess);
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *peer = ctx_of(peerContext), *cur;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&cur);
    if (r == CUDA_SUCCESS && (!peer || !peer->active))
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (r == CUDA_SUCCESS && peer->dev == cur->dev)
        r = CUDA_ERROR_INVALID_DEVICE;
    else if (r == CUDA_SUCCESS && !fk_dev_peer_capable(cur->dev, peer->dev))
        r = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    else if (r == CUDA_SUCCESS && (cur->peer & (1u << peer->dev)))
        r = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    if (r == CUDA_SUCCESS)
        cur->peer |= 1u << peer->dev;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext)
{
    FK_BEGIN(cuCtxDisablePeerAccess);
    fk_ctx_t *peer = ctx_of(peerContext), *cur;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&cur);
    if (r == CUDA_SUCCESS && !peer)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (r == CUDA_SUCCESS && !(cur->peer & (1u << peer->dev)))
        r = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    if (r == CUDA_SUCCESS)
        cur->peer &= ~(1u << peer->dev);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    FK_BEGIN(cuCtxSynchronize);
    fk_ctx_t *c = ctx ? ctx_of(ctx) : fk_ctx_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_capture_unsafe("cuCtxSynchronize");
    if (r == CUDA_SUCCESS)
        r = fk_ctx_check(c);
    if (r == CUDA_SUCCESS)
        r = fk_ctx_synchronize(c);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
    return cuCtxSynchronize_v2(NULL);
}
