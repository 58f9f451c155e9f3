/*
 * cuda_reg.c - libcolld's cache of GPU registrations (cuda_internal.h).
 *
 * A device pointer is resolved to the allocation that holds it, and that allocation is registered
 * with the daemon once per client (COLLD_MSG_REG_CUDA); a buffer reference is then (registration,
 * byte offset from the allocation's start). The cache is keyed by address and
 * CU_POINTER_ATTRIBUTE_BUFFER_ID: the buffer id is unique over the life of the process, so an
 * allocation freed and another one made at the same address is recognised, the stale
 * registration is dropped and the new one registered. Memory from cudaMalloc / cuMemAlloc goes
 * as a legacy CUDA IPC handle of the allocation; cuMem (VMM) memory as a POSIX file descriptor
 * (cuMemExportToShareableHandle, passed with SCM_RIGHTS), which requires the allocation to have
 * been created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR. For VMM memory a registration covers
 * the mapped range that holds the pointer (cuMemGetAddressRange), and assumes that this range maps
 * its physical allocation from offset 0 (cuMemMap's offset must be 0 today).
 *
 * A buffer that runs past its mapping into the next mapping of the same reservation (PyTorch's
 * expandable segments map one allocation after another; issue 15 D2) is registered as one
 * registration of every allocation it spans (COLLD_MSG_REG_CUDA_SEG, one message and fd per
 * allocation, at most COLLD_WIRE_CUDA_MAX_SEGMENTS): the daemon maps them back to back, so the
 * buffer is one range there too. Every fd is exported before the first message goes, so a
 * failure here sends nothing; a failure in the daemon drops its assembly.
 *
 * Managed memory and cudaMallocAsync pool memory are not supported.
 */
#include "client/client_internal.h"

#ifndef COLLD_HAVE_CUDA
typedef int colld_cuda_reg_unused_t; /* a build without the CUDA toolkit: nothing here */
#else

#include "client/cuda_internal.h"
#include "common/log.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ============================================================================================
 * Exporting and registering
 * ========================================================================================== */

/* The UUID of device `ordinal`. */
static colld_status_t device_uuid(const colld_cu_t *cu, int ordinal, uint8_t *out, colld_err_t *err)
{
    CUdevice dev;
    CUuuid uuid;
    CUresult r = CU_CHECK(cu, cuDeviceGet, &dev, ordinal);
    if (r == CUDA_SUCCESS)
        r = CU_CHECK(cu, cuDeviceGetUuid, &uuid, dev);
    if (r != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_DEVICE, r, "the UUID of device %d", ordinal);
    memcpy(out, uuid.bytes, sizeof(uuid.bytes));
    return COLLD_OK;
}

/* A POSIX fd of the cuMem (VMM) allocation mapped at base. */
static colld_status_t export_fd(const colld_cu_t *cu, CUdeviceptr base, int *fd, colld_err_t *err)
{
    CUmemGenericAllocationHandle h;
    *fd = -1;
    CUresult r = CU_CHECK(cu, cuMemRetainAllocationHandle, &h, (void *)(uintptr_t)base);
    if (r != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_NOT_SUPPORTED, r,
                      "device memory at 0x%llx is neither a cudaMalloc/cuMemAlloc allocation nor a cuMem (VMM) "
                      "mapping (cudaMallocAsync pool memory is not supported); cuMemRetainAllocationHandle",
                      (unsigned long long)base);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    bool exportable = CU_CHECK(cu, cuMemGetAllocationPropertiesFromHandle, &prop, h) != CUDA_SUCCESS ||
                      (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    r = exportable ? CU_CHECK(cu, cuMemExportToShareableHandle, fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
                   : CUDA_ERROR_NOT_SUPPORTED;
    CU_CHECK(cu, cuMemRelease, h);
    if (r != CUDA_SUCCESS || *fd < 0) {
        *fd = -1;
        return cu_say(cu, err, COLLD_ERR_NOT_SUPPORTED, r,
                      "the cuMem (VMM) allocation at 0x%llx cannot be exported as a POSIX file descriptor: create "
                      "it with CUmemAllocationProp.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
                      (unsigned long long)base);
    }
    return COLLD_OK;
}

/* Send m (with fd) and check the daemon's REG_REPLY: its status, the cookie. */
static colld_status_t reg_request(colld_client_t *c, colld_wire_msg_t *m, int fd, uint64_t cookie, CUdeviceptr base,
                                  size_t size, colld_wire_msg_t *rep, colld_err_t *err)
{
    memset(rep, 0, sizeof(*rep));
    colld_status_t st = colld__sock_request(c, m, fd, COLLD_MSG_REG_REPLY, rep, NULL, 0);
    if (st != COLLD_OK)
        return colld_err_set(err, st, "registering %zu bytes of GPU memory with colld: %s", size,
                             colld_status_string(st));
    char detail[COLLD_WIRE_DETAIL_BYTES];
    if ((st = colld__reply_status(rep, detail)) != COLLD_OK)
        return colld_err_set(err, st, "colld refused the GPU buffer at 0x%llx (%zu bytes): %s",
                             (unsigned long long)base, size, detail);
    if (rep->u.reg_reply.cookie != cookie)
        return colld_err_set(err, COLLD_ERR_PROTOCOL, "colld answered a GPU registration with another cookie");
    return COLLD_OK;
}

/* Export one allocation and register it with the daemon. */
static colld_status_t register_alloc(colld_client_t *c, const colld_cu_t *cu, const ptr_info_t *pi, CUdeviceptr base,
                                     size_t size, uint32_t *reg_id, colld_err_t *err)
{
    colld_wire_msg_t m, rep;
    memset(&m, 0, sizeof(m));
    m.type = COLLD_MSG_REG_CUDA;
    m.u.reg_cuda.bytes = size;
    m.u.reg_cuda.cookie = base;
    colld_status_t st = device_uuid(cu, pi->ordinal, m.u.reg_cuda.uuid, err);
    if (st != COLLD_OK)
        return st;
    int fd = -1;
    if (pi->ipc) {
        CUipcMemHandle h;
        bool pushed;
        CUresult r = ctx_enter(cu, pi->ctx, &pushed);
        if (r == CUDA_SUCCESS)
            r = CU_CHECK(cu, cuIpcGetMemHandle, &h, base);
        ctx_leave(cu, pushed);
        if (r != CUDA_SUCCESS)
            return cu_say(cu, err, COLLD_ERR_DEVICE, r, "cuIpcGetMemHandle(0x%llx)", (unsigned long long)base);
        m.u.reg_cuda.how = COLLD_CUDA_EXPORT_IPC;
        memcpy(m.u.reg_cuda.ipc, h.reserved, sizeof(m.u.reg_cuda.ipc));
    } else {
        if ((st = export_fd(cu, base, &fd, err)) != COLLD_OK)
            return st;
        m.u.reg_cuda.how = COLLD_CUDA_EXPORT_FD;
    }
    st = reg_request(c, &m, fd, base, base, size, &rep, err);
    if (fd >= 0)
        close(fd);
    if (st == COLLD_OK)
        *reg_id = rep.u.reg_reply.reg_id;
    return st;
}

/* Register n VMM allocations mapped back to back (seg[], total bytes) as one registration: every
 * fd exported first, then one segment message each, in order (proto/wire.h). */
static colld_status_t register_segments(colld_client_t *c, const colld_cu_t *cu, int ordinal, const gpu_seg_t *seg,
                                        unsigned n, size_t total, uint32_t *reg_id, colld_err_t *err)
{
    colld_wire_msg_t m, rep;
    memset(&m, 0, sizeof(m));
    m.type = COLLD_MSG_REG_CUDA_SEG;
    m.u.reg_cuda_seg.total = total;
    m.u.reg_cuda_seg.cookie = seg[0].base;
    m.u.reg_cuda_seg.count = n;
    int *fds = malloc(n * sizeof(*fds));
    if (!fds)
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "out of memory");
    for (unsigned i = 0; i < n; i++)
        fds[i] = -1;
    colld_status_t st = device_uuid(cu, ordinal, m.u.reg_cuda_seg.uuid, err);
    for (unsigned i = 0; i < n && st == COLLD_OK; i++)
        st = export_fd(cu, seg[i].base, &fds[i], err);
    uint64_t off = 0;
    for (unsigned i = 0; i < n && st == COLLD_OK; i++) {
        m.u.reg_cuda_seg.index = i;
        m.u.reg_cuda_seg.offset = off;
        m.u.reg_cuda_seg.bytes = seg[i].size;
        st = reg_request(c, &m, fds[i], seg[0].base, seg[0].base, total, &rep, err);
        if (st == COLLD_OK && (rep.u.reg_reply.reg_id != 0) != (i == n - 1))
            st = colld_err_set(err, COLLD_ERR_PROTOCOL, "colld answered GPU segment %u of %u with registration %u", i,
                               n, rep.u.reg_reply.reg_id);
        off += seg[i].size;
    }
    for (unsigned i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
    if (st == COLLD_OK)
        *reg_id = rep.u.reg_reply.reg_id;
    return st;
}

void colld__gpu_free_owned(const colld_cu_t *cu, const gpu_reg_t *e)
{
    if (e->own == OWN_VMM) {
        CU_CHECK(cu, cuMemUnmap, e->base, e->own_size);
        CU_CHECK(cu, cuMemAddressFree, e->base, e->own_size);
    } else if (e->own == OWN_MEMALLOC) {
        bool pushed;
        if (ctx_enter(cu, e->own_ctx, &pushed) == CUDA_SUCCESS)
            CU_CHECK(cu, cuMemFree, e->base);
        ctx_leave(cu, pushed);
    }
}

/* ============================================================================================
 * The cache
 * ========================================================================================== */

/* The buffer id of the allocation of entry e that holds address a (a in e's range). */
static unsigned long long seg_buffer_id(const gpu_reg_t *e, CUdeviceptr a)
{
    for (unsigned i = 0; e->seg && i < e->nseg; i++)
        if (a >= e->seg[i].base && a - e->seg[i].base < e->seg[i].size)
            return e->seg[i].buffer_id;
    return e->buffer_id;
}

/* Device memory with this buffer id at base? (cuPointerGetAttributes answers a freed address with
 * zeroes, not an error.) Two attributes, not ptr_query's eight: it runs on every stream-ordered
 * call. */
static bool block_alive(const colld_cu_t *cu, CUdeviceptr base, unsigned long long id)
{
    CUpointer_attribute attrs[2] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_BUFFER_ID };
    unsigned int memtype = 0;
    unsigned long long buffer_id = 0;
    void *data[2] = { &memtype, &buffer_id };
    return CU_CHECK(cu, cuPointerGetAttributes, 2, attrs, data, base) == CUDA_SUCCESS &&
           memtype == CU_MEMORYTYPE_DEVICE && buffer_id == id;
}

/* Is every allocation of a cached registration still there? */
static bool alloc_alive(const colld_cu_t *cu, const gpu_reg_t *e)
{
    if (!e->seg)
        return block_alive(cu, e->base, e->buffer_id);
    for (unsigned i = 0; i < e->nseg; i++)
        if (!block_alive(cu, e->seg[i].base, e->seg[i].buffer_id))
            return false;
    return true;
}

colld_status_t colld__gpu_reg_remove(colld_client_t *c, colld_gpu_t *g, size_t i)
{
    gpu_reg_t e = g->regs[i];
    g->regs[i] = g->regs[--g->nregs];
    free(e.seg);
    return colld__deregister(c, e.reg_id);
}

/* Drop the registrations that overlap [base, base + size) and whose allocations are gone (freed,
 * the addresses reused): colld_mem_alloc memory released behind colld's back (cudaFree) included,
 * nothing left to free. A registration pinned by colld_mem_register stays until its
 * colld_mem_deregister. */
static void drop_stale(colld_client_t *c, colld_gpu_t *g, const colld_cu_t *cu, CUdeviceptr base, size_t size)
{
    for (size_t i = 0; i < g->nregs;) {
        const gpu_reg_t *e = &g->regs[i];
        bool overlaps = e->base < base + size && base < e->base + e->size;
        if (!overlaps || e->pins || alloc_alive(cu, e)) {
            i++;
            continue;
        }
        LOG_DEBUG(GPU, "GPU registration %u (0x%llx, %zu bytes) is stale: its memory was freed", e->reg_id,
                  (unsigned long long)e->base, e->size);
        colld__gpu_reg_remove(c, g, i);
    }
}

/* The rule for implicit registrations (issue 15 C1/D4). libcolld registers an application's
 * allocation with the daemon the first time a collective uses it and caches the registration;
 * the application frees it without telling colld, and the daemon's mapping would keep it (legacy
 * IPC: a mapping of freed memory; VMM: the memory itself, GPU memory lost until the client
 * leaves). A cached registration whose allocation is gone (the driver no longer reports device
 * memory with its buffer id at its base; of every allocation, for one across several) is dropped
 * here and deregistered: the daemon closes its mapping once no collective uses it. Checks up to
 * `max` entries from a rotating cursor: every stream-ordered post SWEEP_PER_POST, every new
 * registration and every communicator's destruction all of them, so a freed buffer's mapping goes
 * at the latest at the next new registration or communicator destruction, and within nregs /
 * SWEEP_PER_POST posts. colld_mem_alloc memory is colld's own (colld_mem_free releases it), and
 * a registration pinned by colld_mem_register is the application's to release. */
void colld__gpu_sweep_freed(colld_client_t *c, colld_gpu_t *g, const colld_cu_t *cu, size_t max)
{
    size_t n = g->nregs < max ? g->nregs : max;
    for (size_t k = 0; k < n && g->nregs; k++) {
        if (g->sweep >= g->nregs)
            g->sweep = 0;
        const gpu_reg_t *e = &g->regs[g->sweep];
        bool seen = !g->no_cache && g->post_now && e->seen == g->post_now;
        if (e->own != OWN_NONE || e->pins || seen || alloc_alive(cu, e)) {
            g->sweep++;
            continue;
        }
        LOG_DEBUG(GPU, "GPU registration %u (0x%llx, %zu bytes): the application freed its memory; deregistered",
                  e->reg_id, (unsigned long long)e->base, e->size);
        colld__gpu_reg_remove(c, g, g->sweep); /* the moved entry is looked at next */
    }
}

void colld__gpu_comm_destroyed(colld_client_t *c)
{
    colld_gpu_t *g = c->gpu;
    pthread_mutex_lock(&g->mu);
    if (g->cu)
        colld__gpu_sweep_freed(c, g, g->cu, SIZE_MAX);
    pthread_mutex_unlock(&g->mu);
}

/* A cached registration that holds [a, a + bytes) with the allocation of buffer id `id` at a. */
static gpu_reg_t *lookup(colld_gpu_t *g, CUdeviceptr a, size_t bytes, unsigned long long id)
{
    for (size_t i = 0; id && i < g->nregs; i++) {
        gpu_reg_t *e = &g->regs[i];
        if (a >= e->base && a - e->base < e->size && bytes <= e->size - (a - e->base) && seg_buffer_id(e, a) == id)
            return e;
    }
    return NULL;
}

gpu_reg_t *colld__gpu_lookup(colld_gpu_t *g, const void *p, size_t bytes, unsigned long long id)
{
    return lookup(g, (CUdeviceptr)(uintptr_t)p, bytes, id);
}

gpu_reg_t *colld__gpu_lookup_owned(colld_gpu_t *g, const void *p, size_t bytes)
{
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)p;
    for (size_t i = 0; i < g->nregs; i++) {
        gpu_reg_t *e = &g->regs[i];
        bool known = e->pins || e->own != OWN_NONE;
        if (known && a >= e->base && a - e->base < e->limit && bytes <= e->limit - (a - e->base))
            return e;
    }
    return NULL;
}

colld_status_t colld__gpu_reg_ref(const gpu_reg_t *e, const void *p, size_t bytes, const char *which,
                                  colld_wire_buf_t *out, colld_err_t *err)
{
    size_t off = (size_t)((CUdeviceptr)(uintptr_t)p - e->base);
    memset(out, 0, sizeof(*out));
    if (off >= e->limit || bytes > e->limit - off)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "%s (%p): %zu bytes run past the end of its %zu-byte GPU buffer", which, p, bytes,
                             e->limit);
    out->reg_id = e->reg_id;
    out->offset = off;
    return COLLD_OK;
}

/* Device memory of device `ordinal` with its buffer id at a? */
static bool device_block(const colld_cu_t *cu, CUdeviceptr a, int ordinal, unsigned long long *id)
{
    CUpointer_attribute attrs[3] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                     CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL };
    unsigned int memtype = 0;
    int dev = -1;
    void *data[3] = { &memtype, id, &dev };
    *id = 0;
    return CU_CHECK(cu, cuPointerGetAttributes, 3, attrs, data, a) == CUDA_SUCCESS && memtype == CU_MEMORYTYPE_DEVICE &&
           dev == ordinal;
}

/* The allocations [a, a + bytes) spans: one (legacy IPC memory: the allocation; VMM: the mapping
 * that holds a), or consecutive VMM mappings of one reservation on the same device, up to
 * COLLD_WIRE_CUDA_MAX_SEGMENTS. *segs is malloc'ed (the caller's). */
static colld_status_t span(const colld_cu_t *cu, const ptr_info_t *pi, CUdeviceptr a, size_t bytes, const char *which,
                           gpu_seg_t **segs, unsigned *n, colld_err_t *err)
{
    const void *p = (const void *)(uintptr_t)a;
    CUdeviceptr base = 0;
    size_t size = 0;
    if (pi->ipc) {
        base = pi->range_start;
        size = pi->range_size;
    }
    /* VMM: the mapped range (the range attributes give the whole reservation); and the fallback. */
    if (!pi->ipc || !base || !size) {
        CUresult r = CU_CHECK(cu, cuMemGetAddressRange, &base, &size, a);
        if (r != CUDA_SUCCESS)
            return cu_say(cu, err, COLLD_ERR_INVALID_ARGUMENT, r, "%s (%p): cuMemGetAddressRange", which, p);
    }
    if (a < base || a - base >= size)
        return colld_err_set(err, COLLD_ERR_DEVICE,
                             "%s (%p): the driver places it outside its allocation (0x%llx, %zu bytes)", which, p,
                             (unsigned long long)base, size);
    unsigned cap = 4;
    gpu_seg_t *s = malloc(cap * sizeof(*s));
    if (!s)
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "out of memory");
    s[0] = (gpu_seg_t){ .base = base, .size = size, .buffer_id = pi->buffer_id };
    unsigned k = 1;
    CUdeviceptr end = base + size;
    colld_status_t st = COLLD_OK;
    /* Legacy IPC memory is one allocation; a VMM buffer may go on into the next mapping. */
    while (st == COLLD_OK && bytes > end - a) {
        unsigned long long id = 0;
        CUdeviceptr next = 0;
        size_t next_size = 0;
        if (pi->ipc || !device_block(cu, end, pi->ordinal, &id) ||
            CU_CHECK_EXPECT(cu, CUDA_ERROR_NOT_FOUND, cuMemGetAddressRange, &next, &next_size, end) != CUDA_SUCCESS ||
            next != end || next_size == 0) {
            st = colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                               "%s (%p): %zu bytes run past the end of its %zu-byte GPU buffer (%s)", which, p, bytes,
                               (size_t)(end - a),
                               k == 1 ? "one allocation" : "its VMM allocations mapped back to back on its device");
            break;
        }
        if (k == COLLD_WIRE_CUDA_MAX_SEGMENTS) {
            st = colld_err_set(err, COLLD_ERR_NOT_SUPPORTED,
                               "%s (%p): %zu bytes across more than %u VMM allocations: colld registers at most %u "
                               "(register smaller buffers, or make the allocator's segments larger)",
                               which, p, bytes, COLLD_WIRE_CUDA_MAX_SEGMENTS, COLLD_WIRE_CUDA_MAX_SEGMENTS);
            break;
        }
        if (k == cap) {
            gpu_seg_t *t = realloc(s, 2 * cap * sizeof(*s));
            if (!t) {
                st = colld_err_set(err, COLLD_ERR_NO_MEMORY, "out of memory");
                break;
            }
            s = t;
            cap *= 2;
        }
        s[k++] = (gpu_seg_t){ .base = next, .size = next_size, .buffer_id = id };
        end = next + next_size;
    }
    if (st != COLLD_OK) {
        free(s);
        return st;
    }
    *segs = s;
    *n = k;
    return COLLD_OK;
}

colld_status_t colld__gpu_resolve(colld_client_t *c, colld_gpu_t *g, const colld_cu_t *cu, const void *p, size_t bytes,
                                  const ptr_info_t *pi, const char *which, colld_wire_buf_t *out, gpu_reg_t **entry,
                                  colld_err_t *err)
{
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)p;
    memset(out, 0, sizeof(*out));
    gpu_reg_t *e = lookup(g, a, bytes, pi->buffer_id);
    if (!e) {
        colld__gpu_sweep_freed(c, g, cu, SIZE_MAX); /* a new registration: let the freed ones go first */
        gpu_seg_t *seg = NULL;
        unsigned n = 0;
        colld_status_t st = span(cu, pi, a, bytes, which, &seg, &n, err);
        if (st != COLLD_OK)
            return st;
        CUdeviceptr base = seg[0].base;
        size_t size = (size_t)(seg[n - 1].base + seg[n - 1].size - base);
        drop_stale(c, g, cu, base, size);
        if (g->nregs == g->cap) {
            size_t cap = g->cap ? g->cap * 2 : 16;
            gpu_reg_t *t = realloc(g->regs, cap * sizeof(*t));
            if (!t) {
                free(seg);
                return colld_err_set(err, COLLD_ERR_NO_MEMORY, "out of memory");
            }
            g->regs = t;
            g->cap = cap;
        }
        uint32_t reg_id;
        st = n == 1 ? register_alloc(c, cu, pi, base, size, &reg_id, err)
                    : register_segments(c, cu, pi->ordinal, seg, n, size, &reg_id, err);
        if (st != COLLD_OK) {
            free(seg);
            return st;
        }
        e = &g->regs[g->nregs++];
        *e = (gpu_reg_t){ .base = base,
                          .size = size,
                          .limit = size,
                          .buffer_id = seg[0].buffer_id,
                          .reg_id = reg_id,
                          .ordinal = pi->ordinal,
                          .nseg = n,
                          .seg = n > 1 ? seg : NULL };
        if (n == 1)
            free(seg);
        LOG_DEBUG(GPU, "registered GPU %d memory 0x%llx (%zu bytes, %s, %u allocation(s)) as %u", pi->ordinal,
                  (unsigned long long)base, size, pi->ipc ? "IPC" : "VMM fd", n, reg_id);
    }
    e->seen = g->post_now;
    colld_status_t st = colld__gpu_reg_ref(e, p, bytes, which, out, err);
    if (st != COLLD_OK)
        return st;
    if (entry)
        *entry = e;
    return COLLD_OK;
}

#endif /* COLLD_HAVE_CUDA */
