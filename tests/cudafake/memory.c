/*
 * memory.c - device memory in the CUDA driver test double: the address arena, cuMemAlloc and
 * cuMemFree, what a device may access (the check every kernel, copy and stream memory operation
 * passes before it touches memory), pointer attributes, address ranges, the synchronous copies
 * and memset, and host memory registration.
 *
 * At cuInit the double reserves one range of address space (PROT_NONE, COLLD_CUDAFAKE_ARENA
 * bytes). Every device allocation is a memfd mapped at an address inside it, so device pointers
 * are ordinary host addresses that the host builds of the kernels dereference, and a legacy IPC
 * handle or a VMM POSIX fd can carry the memory to another process. Allocations are 4 KiB
 * aligned and separated by 64 KiB of PROT_NONE guard, and a freed range is PROT_NONE again, so
 * an overrun or a use after free by host code faults; device code is checked instead
 * (fk_mem_access): the device of the stream must own the memory, have peer access to it, or have
 * been granted access by cuMemSetAccess, and the whole range must be live.
 *
 * Registered host memory is device-accessible at its own address (as on every 64-bit Linux
 * system with unified addressing: CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 1), only with
 * CU_MEMHOSTREGISTER_DEVICEMAP, and only while it stays registered; other host memory is not
 * (a device without pageable memory access). A registration belongs to the context it was made
 * in (current at cuMemHostRegister): it ends when that context is destroyed.
 */
#include "tests/cudafake/fake.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096ul
#define GUARD (64ul << 10)
#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

typedef struct hostreg {
    struct hostreg *next;
    uintptr_t base;
    size_t size;
    unsigned flags;
    fk_ctx_t *ctx;
    uint64_t id;
} hostreg_t;

static struct {
    uintptr_t base;
    size_t size;
    fk_region_t *regions; /* sorted by base */
    hostreg_t *hostregs;
} mem;

/* ============================================================================================
 * The arena and its regions (lock held)
 * ========================================================================================== */

CUresult fk_arena_init(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        fk_log("cannot reserve %zu bytes of address space for device memory: %s", bytes, strerror(errno));
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    mem.base = (uintptr_t)p;
    mem.size = bytes;
    return CUDA_SUCCESS;
}

/* First fit of `size` bytes at `align`, keeping GUARD bytes from every other region. */
uintptr_t fk_arena_take(size_t size, size_t align)
{
    uintptr_t cand = ALIGN_UP(mem.base + GUARD, align);
    for (fk_region_t *r = mem.regions; r; r = r->next) {
        if (cand + size + GUARD <= r->base)
            break;
        if (r->base + r->size + GUARD > cand)
            cand = ALIGN_UP(r->base + r->size + GUARD, align);
    }
    if (size > mem.size || cand + size > mem.base + mem.size - GUARD)
        return 0;
    return cand;
}

/* Make [base, base + size) inaccessible address space again. */
void fk_arena_give(uintptr_t base, size_t size)
{
    if (mmap((void *)base, size, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) ==
        MAP_FAILED)
        fk_log("cannot release device address range 0x%lx (%zu bytes): %s", (unsigned long)base, size,
               strerror(errno));
}

/* A memfd of `size` bytes named `name` (the name identifies it to other processes); -1 on failure. */
int fk_memfd(const char *name, size_t size)
{
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)size) < 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Every region, sorted by address. */
fk_region_t *fk_regions(void)
{
    return mem.regions;
}

/* The region whose address range holds p, or NULL. */
fk_region_t *fk_region_find(uintptr_t p)
{
    for (fk_region_t *r = mem.regions; r && r->base <= p; r = r->next)
        if (p < r->base + r->size)
            return r;
    return NULL;
}

/* Take `size` bytes (page-rounded) of the arena for a new region; NULL when the arena is full. */
fk_region_t *fk_region_new(fk_rkind_t kind, size_t size, size_t align)
{
    size = ALIGN_UP(size, PAGE);
    uintptr_t at = size ? fk_arena_take(size, align < PAGE ? PAGE : align) : 0;
    fk_region_t *r = at ? calloc(1, sizeof(*r)) : NULL;
    if (!r)
        return NULL;
    *r = (fk_region_t){ .kind = kind, .base = at, .size = size, .fd = -1, .dev = -1 };
    fk_region_t **pp = &mem.regions;
    while (*pp && (*pp)->base < at)
        pp = &(*pp)->next;
    r->next = *pp;
    *pp = r;
    return r;
}

/* Give a region's range back (inaccessible again) and close its memfd. */
void fk_region_free(fk_region_t *r)
{
    for (fk_region_t **pp = &mem.regions; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    fk_arena_give(r->base, r->size);
    if (r->fd >= 0)
        close(r->fd);
    free(r);
}

/* The VMM mapping of reservation r that holds p, or NULL. */
fk_map_t *fk_map_find(const fk_region_t *r, uintptr_t p)
{
    for (fk_map_t *m = r ? r->maps : NULL; m; m = m->next)
        if (p >= m->base && p < m->base + m->size)
            return m;
    return NULL;
}

/* Account `bytes` of device dev's memory; false when it does not have them. */
bool fk_dev_mem_take(int dev, size_t bytes)
{
    const fk_device_spec_t *d = fk_dev(dev);
    if (!d || bytes > d->total_mem - fk.dev_used[dev])
        return false;
    fk.dev_used[dev] += bytes;
    return true;
}

/* Give back what fk_dev_mem_take took. */
void fk_dev_mem_give(int dev, size_t bytes)
{
    fk.dev_used[dev] -= bytes;
}

/* ============================================================================================
 * What a device may access (lock held)
 * ========================================================================================== */

static const hostreg_t *hostreg_find(uintptr_t p)
{
    for (const hostreg_t *h = mem.hostregs; h; h = h->next)
        if (p >= h->base && p < h->base + h->size)
            return h;
    return NULL;
}

/* Why [p, p + len) is not accessible to ctx's device, or NULL when it is. */
static const char *inaccessible(fk_ctx_t *ctx, uintptr_t p, size_t len, bool write)
{
    int dev = ctx->dev;
    if (p + len < p)
        return "the range wraps around the address space";
    const fk_region_t *r = fk_region_find(p);
    if (r && (r->kind == FK_R_ALLOC || r->kind == FK_R_IPC)) {
        if (p + len > r->base + r->bytes)
            return "it runs past the end of its allocation";
        bool lazy = r->kind == FK_R_IPC && (r->ipc_flags & CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) &&
                    fk_dev_peer_capable(dev, r->dev);
        if (r->dev != dev && !(ctx->peer & (1u << r->dev)) && !lazy)
            return "it is memory of another device and peer access to it is not enabled";
        return NULL;
    }
    if (r && r->kind == FK_R_RESERVE) {
        for (uintptr_t at = p; at < p + len;) {
            const fk_map_t *m = fk_map_find(r, at);
            if (!m)
                return "part of it is reserved address space with no memory mapped (cuMemMap)";
            if (!((write ? m->write : m->read) & (1u << dev)))
                return write ? "this device was not given read-write access to it (cuMemSetAccess)"
                             : "this device was not given access to it (cuMemSetAccess)";
            at = m->base + m->size;
        }
        return NULL;
    }
    if (r)
        return "unknown region";
    const hostreg_t *h = hostreg_find(p);
    if (!h)
        return "it is neither device memory nor registered host memory";
    if (p + len > h->base + h->size)
        return "it runs past the end of its host registration";
    if (!(h->flags & CU_MEMHOSTREGISTER_DEVICEMAP))
        return "the host registration has no CU_MEMHOSTREGISTER_DEVICEMAP";
    if (!(h->flags & CU_MEMHOSTREGISTER_PORTABLE) && h->ctx != ctx)
        return "the host memory was registered in another context without CU_MEMHOSTREGISTER_PORTABLE";
    if (write && (h->flags & CU_MEMHOSTREGISTER_READ_ONLY))
        return "the host memory was registered read-only";
    return NULL;
}

/* May ctx's device access [p, p + len)? CUDA_ERROR_ILLEGAL_ADDRESS (and a message naming `what`
 * and why) when not. */
CUresult fk_mem_access(fk_ctx_t *ctx, uintptr_t p, size_t len, bool write, const char *what)
{
    if (len == 0)
        return CUDA_SUCCESS;
    const char *why = inaccessible(ctx, p, len, write);
    if (!why)
        return CUDA_SUCCESS;
    fk_log("%s on device %d %s 0x%lx (%zu bytes): illegal address: %s", what, ctx->dev, write ? "writes" : "reads",
           (unsigned long)p, len, why);
    return CUDA_ERROR_ILLEGAL_ADDRESS;
}

/* ============================================================================================
 * cuMemAlloc / cuMemFree
 * ========================================================================================== */

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    FK_BEGIN(cuMemAlloc);
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    if (r == CUDA_SUCCESS)
        r = fk_capture_unsafe("cuMemAlloc");
    size_t size = ALIGN_UP(bytesize, PAGE);
    fk_region_t *reg = NULL;
    if (r == CUDA_SUCCESS && (size < bytesize || !fk_dev_mem_take(ctx->dev, size)))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else if (r == CUDA_SUCCESS && !(reg = fk_region_new(FK_R_ALLOC, size, PAGE))) {
        fk_dev_mem_give(ctx->dev, size);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) {
        char name[64];
        reg->buffer_id = ++fk.next_buffer_id;
        snprintf(name, sizeof(name), "cudafake-alloc:%d:%llu", (int)getpid(), (unsigned long long)reg->buffer_id);
        reg->fd = fk_memfd(name, size);
        if (reg->fd < 0 ||
            mmap((void *)reg->base, size, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_SHARED, reg->fd, 0) == MAP_FAILED) {
            fk_log("cuMemAlloc of %zu bytes: %s", bytesize, strerror(errno));
            fk_region_free(reg);
            fk_dev_mem_give(ctx->dev, size);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            reg->bytes = bytesize;
            reg->dev = ctx->dev;
            reg->ctx = ctx;
            *dptr = (CUdeviceptr)reg->base;
        }
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* Free one cuMemAlloc region (lock held). */
static void alloc_free(fk_region_t *reg)
{
    fk_dev_mem_give(reg->dev, reg->size);
    fk_region_free(reg);
}

/* cuMemFree synchronizes implicitly ("may perform implicit synchronization"): the memory is
 * unmapped only after the work enqueued before the call has finished, so that no earlier kernel
 * loses it under its feet; work enqueued later that touches it faults. */
CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    FK_BEGIN(cuMemFree);
    if (dptr == 0)
        return CUDA_SUCCESS;
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    if (r == CUDA_SUCCESS)
        r = fk_capture_unsafe("cuMemFree");
    fk_region_t *reg = fk_region_find((uintptr_t)dptr);
    if (r == CUDA_SUCCESS && (!reg || reg->kind != FK_R_ALLOC || reg->base != (uintptr_t)dptr))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        fk_sync_all("cuMemFree");
        reg = fk_region_find((uintptr_t)dptr); /* the lock was dropped: look again */
        if (reg && reg->kind == FK_R_ALLOC && reg->base == (uintptr_t)dptr)
            alloc_free(reg);
        else
            r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* A context's cuMemAlloc memory and its host registrations go with it. */
void fk_mem_ctx_destroyed(fk_ctx_t *ctx)
{
    for (fk_region_t *r = mem.regions, *next; r; r = next) {
        next = r->next;
        if (r->kind == FK_R_ALLOC && r->ctx == ctx)
            alloc_free(r);
    }
    for (hostreg_t **pp = &mem.hostregs; *pp;) {
        hostreg_t *h = *pp;
        if (h->ctx != ctx) {
            pp = &h->next;
            continue;
        }
        *pp = h->next;
        free(h);
    }
}

/* ============================================================================================
 * Pointer attributes
 * ========================================================================================== */

typedef struct {
    unsigned memtype;
    fk_ctx_t *ctx;
    uintptr_t dptr, hptr;
    uint64_t buffer_id, block_id;
    int ordinal;
    bool ipc_capable, mapped, known;
    uintptr_t range_start, map_base;
    size_t range_size, map_size;
    uint64_t handle_types;
    unsigned access;
} ptrinfo_t;

/* What the driver knows of p (lock held); pi->known is false for memory it does not know. */
static void ptr_info(uintptr_t p, fk_ctx_t *cur, ptrinfo_t *pi)
{
    memset(pi, 0, sizeof(*pi));
    fk_region_t *r = fk_region_find(p);
    if (r && (r->kind == FK_R_ALLOC || r->kind == FK_R_IPC) && p < r->base + r->bytes) {
        *pi = (ptrinfo_t){ .memtype = CU_MEMORYTYPE_DEVICE, .ctx = r->ctx, .dptr = p, .buffer_id = r->buffer_id,
                           .block_id = r->buffer_id, .ordinal = r->dev, .ipc_capable = r->kind == FK_R_ALLOC,
                           .mapped = true, .known = true, .range_start = r->base, .range_size = r->bytes,
                           .map_base = r->base, .map_size = r->bytes };
        pi->access = cur && (cur->dev == r->dev || (cur->peer & (1u << r->dev))) ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
                                                                                  : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
        return;
    }
    if (r && r->kind == FK_R_RESERVE) {
        const fk_map_t *m = fk_map_find(r, p);
        pi->range_start = r->base;
        pi->range_size = r->size;
        if (!m)
            return; /* reserved, nothing mapped: no memory there */
        pi->memtype = CU_MEMORYTYPE_DEVICE;
        pi->dptr = p;
        pi->buffer_id = m->buffer_id;
        pi->block_id = m->phys->block_id;
        pi->ordinal = m->phys->dev;
        pi->mapped = pi->known = true;
        pi->map_base = m->base;
        pi->map_size = m->size;
        pi->handle_types = (uint64_t)m->phys->prop.requestedHandleTypes;
        int d = cur ? cur->dev : -1;
        pi->access = d >= 0 && (m->write & (1u << d))  ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
                     : d >= 0 && (m->read & (1u << d)) ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
                                                       : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
        return;
    }
    const hostreg_t *h = r ? NULL : hostreg_find(p);
    if (h)
        *pi = (ptrinfo_t){ .memtype = CU_MEMORYTYPE_HOST, .ctx = h->ctx, .dptr = p, .hptr = p, .buffer_id = h->id,
                           .block_id = h->id, .ordinal = h->ctx->dev, .mapped = true, .known = true,
                           .range_start = h->base, .range_size = h->size, .map_base = h->base, .map_size = h->size,
                           .access = (h->flags & CU_MEMHOSTREGISTER_READ_ONLY) ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
                                                                               : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE };
}

/* Write one attribute at its documented width (booleans are one byte, as in the driver). Returns
 * false for an attribute the double does not model, or one that p has no value for when `strict`. */
static bool put_attr(CUpointer_attribute a, const ptrinfo_t *pi, void *data, bool strict)
{
#define PUT(type, value)                                                                                     \
    do {                                                                                                     \
        type v_ = (type)(value);                                                                             \
        memcpy(data, &v_, sizeof(v_));                                                                       \
    } while (0)
    bool have = pi->known;
    switch ((int)a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: PUT(CUcontext, pi->ctx); have = pi->ctx != NULL; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: PUT(unsigned int, pi->memtype); break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: PUT(CUdeviceptr, pi->dptr); break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: PUT(void *, pi->hptr); have = pi->hptr != 0; break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: PUT(bool, false); break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: PUT(unsigned long long, pi->buffer_id); break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: PUT(bool, false); break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: PUT(int, pi->ordinal); break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: PUT(bool, pi->ipc_capable); break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: PUT(CUdeviceptr, pi->range_start); have = pi->range_size != 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: PUT(size_t, pi->range_size); have = pi->range_size != 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: PUT(bool, pi->mapped); have = true; break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: PUT(unsigned long long, pi->handle_types); break;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: PUT(bool, false); break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: PUT(unsigned int, pi->access); break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: PUT(void *, NULL); break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: PUT(size_t, pi->map_size); break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: PUT(void *, pi->map_base); break;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: PUT(unsigned long long, pi->block_id); break;
    default:
        fk_log("pointer attribute %d is not modelled by the double: add it to tests/cudafake/memory.c", (int)a);
        return false;
    }
#undef PUT
    return have || !strict;
}

CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    FK_BEGIN(cuPointerGetAttribute);
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    ptrinfo_t pi;
    pthread_mutex_lock(&fk.mu);
    ptr_info((uintptr_t)ptr, fk_ctx_current(), &pi);
    pthread_mutex_unlock(&fk.mu);
    return put_attr(attribute, &pi, data, true) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Unlike the singular call, memory the driver does not know is not an error: every attribute
 * gets its zero value. */
CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                        CUdeviceptr ptr)
{
    FK_BEGIN(cuPointerGetAttributes);
    if (numAttributes == 0 || !attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    ptrinfo_t pi;
    pthread_mutex_lock(&fk.mu);
    ptr_info((uintptr_t)ptr, fk_ctx_current(), &pi);
    pthread_mutex_unlock(&fk.mu);
    for (unsigned i = 0; i < numAttributes; i++)
        if (!data[i] || !put_attr(attributes[i], &pi, data[i], false))
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* The allocation (cuMemAlloc, an IPC mapping) or the VMM mapping that holds dptr. */
CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    FK_BEGIN(cuMemGetAddressRange);
    CUresult r = CUDA_ERROR_NOT_FOUND;
    uintptr_t base = 0;
    size_t size = 0;
    pthread_mutex_lock(&fk.mu);
    const fk_region_t *reg = fk_region_find((uintptr_t)dptr);
    if (reg && (reg->kind == FK_R_ALLOC || reg->kind == FK_R_IPC) && (uintptr_t)dptr < reg->base + reg->bytes) {
        base = reg->base;
        size = reg->bytes;
        r = CUDA_SUCCESS;
    } else if (reg && reg->kind == FK_R_RESERVE) {
        const fk_map_t *m = fk_map_find(reg, (uintptr_t)dptr);
        if (m) {
            base = m->base;
            size = m->size;
            r = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&fk.mu);
    if (r == CUDA_SUCCESS && pbase)
        *pbase = (CUdeviceptr)base;
    if (r == CUDA_SUCCESS && psize)
        *psize = size;
    return r;
}

/* ============================================================================================
 * Copies and memset (the synchronous ones on the legacy default stream of the current context)
 * ========================================================================================== */

/* Enqueue a copy or a memset on the current context's legacy stream; with `wait`, return once
 * it has run (the call then returns what happened to the context). */
static CUresult legacy_op(fk_op_t *op, bool wait, const char *what)
{
    fk_ctx_t *ctx;
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    if (r == CUDA_SUCCESS)
        r = fk_capture_unsafe(what);
    if (r == CUDA_SUCCESS)
        r = fk_stream_resolve(CU_STREAM_LEGACY, &s, true);
    if (r != CUDA_SUCCESS) {
        fk_op_free(op);
        pthread_mutex_unlock(&fk.mu);
        return r;
    }
    r = fk_enqueue(s, op); /* takes op */
    if (r == CUDA_SUCCESS && wait) {
        r = fk_stream_wait(s, s->enqueued);
        if (r == CUDA_SUCCESS)
            r = fk_ctx_check(ctx);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    FK_BEGIN(cuMemcpyHtoD);
    if (ByteCount && !srcHost)
        return CUDA_ERROR_INVALID_VALUE;
    fk_op_t *op = fk_op_new(FK_OP_COPY);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.copy = (__typeof__(op->u.copy)){ .host = (void *)srcHost, .dev = (uintptr_t)dstDevice, .bytes = ByteCount,
                                           .to_device = true };
    return legacy_op(op, true, "cuMemcpyHtoD");
}

CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    FK_BEGIN(cuMemcpyDtoH);
    if (ByteCount && !dstHost)
        return CUDA_ERROR_INVALID_VALUE;
    fk_op_t *op = fk_op_new(FK_OP_COPY);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.copy = (__typeof__(op->u.copy)){ .host = dstHost, .dev = (uintptr_t)srcDevice, .bytes = ByteCount,
                                           .to_device = false };
    return legacy_op(op, true, "cuMemcpyDtoH");
}

/* An asynchronous copy between host and device memory on hStream (NULL / CU_STREAM_LEGACY: the
 * legacy default stream, with its synchronisation; a captured stream records it). Stream-ordered
 * and asynchronous with respect to the host, for pageable host memory too: the driver then may
 * stage or synchronise (its documentation leaves it open), the double never does, so a caller that
 * needs a truly asynchronous copy registers its host memory, as it must with the driver. */
static CUresult async_copy(void *host, CUdeviceptr dev, size_t bytes, bool to_device, CUstream hStream)
{
    if (bytes && !host)
        return CUDA_ERROR_INVALID_VALUE;
    fk_op_t *op = fk_op_new(FK_OP_COPY);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.copy = (__typeof__(op->u.copy)){ .host = host, .dev = (uintptr_t)dev, .bytes = bytes,
                                           .to_device = to_device };
    fk_ctx_t *ctx;
    fk_stream_t *s = NULL;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    if (r == CUDA_SUCCESS)
        r = fk_ctx_check(ctx);
    if (r == CUDA_SUCCESS)
        r = fk_stream_resolve(hStream, &s, true);
    if (r == CUDA_SUCCESS)
        r = fk_enqueue(s, op); /* takes op */
    else
        fk_op_free(op);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    FK_BEGIN(cuMemcpyHtoDAsync);
    return async_copy((void *)srcHost, dstDevice, ByteCount, true, hStream);
}

CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    FK_BEGIN(cuMemcpyDtoHAsync);
    return async_copy(dstHost, srcDevice, ByteCount, false, hStream);
}

/* Asynchronous with respect to the host for device memory, as the driver documents it. */
CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    FK_BEGIN(cuMemsetD8);
    fk_op_t *op = fk_op_new(FK_OP_SET);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.set = (__typeof__(op->u.set)){ .dev = (uintptr_t)dstDevice, .value = uc, .bytes = N };
    return legacy_op(op, false, "cuMemsetD8");
}

/* ============================================================================================
 * Host memory registration
 * ========================================================================================== */

/* Is every page of [p, p + n) mapped in this process? */
static bool host_mapped(uintptr_t p, size_t n)
{
    uintptr_t a = p & ~(PAGE - 1), end = ALIGN_UP(p + n, PAGE);
    unsigned char vec[64];
    for (; a < end;) {
        size_t pages = (end - a) / PAGE;
        if (pages > sizeof(vec))
            pages = sizeof(vec);
        if (mincore((void *)a, pages * PAGE, vec) < 0)
            return false;
        a += pages * PAGE;
    }
    return true;
}

CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    FK_BEGIN(cuMemHostRegister);
    const unsigned known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY |
                           CU_MEMHOSTREGISTER_READ_ONLY;
    if (!p || bytesize == 0 || (Flags & ~known) || (uintptr_t)p + bytesize < (uintptr_t)p)
        return CUDA_ERROR_INVALID_VALUE;
    if (Flags & CU_MEMHOSTREGISTER_IOMEMORY)
        return CUDA_ERROR_NOT_SUPPORTED;
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    if (r == CUDA_SUCCESS)
        r = fk_capture_unsafe("cuMemHostRegister");
    uintptr_t a = (uintptr_t)p;
    for (const hostreg_t *h = mem.hostregs; h && r == CUDA_SUCCESS; h = h->next)
        if (a < h->base + h->size && h->base < a + bytesize)
            r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    if (r == CUDA_SUCCESS && (fk_region_find(a) || !host_mapped(a, bytesize)))
        r = CUDA_ERROR_INVALID_VALUE;
    hostreg_t *h = r == CUDA_SUCCESS ? calloc(1, sizeof(*h)) : NULL;
    if (r == CUDA_SUCCESS && !h)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        *h = (hostreg_t){ .next = mem.hostregs, .base = a, .size = bytesize, .flags = Flags, .ctx = ctx,
                          .id = ++fk.next_buffer_id };
        mem.hostregs = h;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* The CUDA 4.0 variant: page-aligned ranges only. */
CUresult CUDAAPI cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    if ((uintptr_t)p % PAGE || bytesize % PAGE)
        return CUDA_ERROR_INVALID_VALUE;
    return cuMemHostRegister_v2(p, bytesize, Flags);
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    FK_BEGIN(cuMemHostUnregister);
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    if (r == CUDA_SUCCESS)
        r = fk_capture_unsafe("cuMemHostUnregister");
    hostreg_t **pp = &mem.hostregs;
    while (*pp && (*pp)->base != (uintptr_t)p)
        pp = &(*pp)->next;
    if (r == CUDA_SUCCESS && (!p || !*pp))
        r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (r == CUDA_SUCCESS) {
        hostreg_t *h = *pp;
        *pp = h->next;
        free(h);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    FK_BEGIN(cuMemHostGetDevicePointer);
    if (!pdptr || !p || Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    const hostreg_t *h = hostreg_find((uintptr_t)p);
    if (r == CUDA_SUCCESS && (!h || !(h->flags & CU_MEMHOSTREGISTER_DEVICEMAP)))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *pdptr = (CUdeviceptr)(uintptr_t)p;
    pthread_mutex_unlock(&fk.mu);
    return r;
}
