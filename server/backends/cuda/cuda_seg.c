/*
 * cuda_seg.c - GPU registrations across several VMM allocations (issue 15 D2).
 *
 * An allocator that grows a reservation by mapping one allocation after another (PyTorch's
 * expandable segments) gives buffers that run across allocations. The client sends such a buffer's
 * allocations as the segments of one registration (COLLD_MSG_REG_CUDA_SEG, proto/wire.h), in
 * order, one message and one POSIX fd each; the daemon imports each as it arrives and, at the
 * last, maps them back to back in one range of its own, so its kernels see one buffer.
 *
 * Every field is the client's word: copied, then checked. The count is bounded
 * (COLLD_WIRE_CUDA_MAX_SEGMENTS), each segment must follow the one before (index, offset), belong
 * to the same registration (cookie, count, total, GPU) and fit in the announced total, which the
 * last must fill exactly; every allocation must live on the GPU the registration names (its
 * properties, then the mapping's device as for one allocation, issue 15 C5); cuMemMap refuses a
 * segment larger than its allocation. The tenant was charged the total at the first segment
 * (server/core/session.c). One assembly per session: a new first segment drops the one under way,
 * and any failure, or the session's end, drops it too, releasing what was imported (nothing stays
 * half-registered).
 *
 * Locking: the assemblies' list is under the daemon's lock; an assembly taken off it belongs to the
 * session's message being served (the loop thread serves one message of a session at a time), so
 * the driver calls are made with the lock dropped.
 */
#include "server/backends/cuda/cuda.h"

#include "common/log.h"
#include "common/util.h"
#include "transport/cuda_ipc/cuda_ipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Take the session's assembly off the list (NULL when none). */
static gpu_pending_t *take(colld_gpus_t *g, colld_session_t *s)
{
    pthread_mutex_lock(&g->b->d->lock);
    gpu_pending_t *p = NULL;
    for (gpu_pending_t **pp = &g->assembling; *pp; pp = &(*pp)->next)
        if ((*pp)->s == s) {
            p = *pp;
            *pp = p->next;
            p->next = NULL;
            break;
        }
    pthread_mutex_unlock(&g->b->d->lock);
    return p;
}

/* Put an assembly back for the session's next segment. */
static void put_back(colld_gpus_t *g, gpu_pending_t *p)
{
    pthread_mutex_lock(&g->b->d->lock);
    p->next = g->assembling;
    g->assembling = p;
    pthread_mutex_unlock(&g->b->d->lock);
}

void cuda_seg_session_gone(colld_gpus_t *g, colld_session_t *s)
{
    for (gpu_pending_t **pp = &g->assembling; *pp; pp = &(*pp)->next)
        if ((*pp)->s == s) {
            gpu_pending_t *p = *pp;
            *pp = p->next;
            p->next = g->dead_pending; /* released by the recovery thread (cuda_release.c) */
            g->dead_pending = p;
            pthread_cond_broadcast(&g->recover_cv);
            return;
        }
}

/* The first segment: a new assembly on the GPU it names. NULL with err. */
static gpu_pending_t *begin(colld_gpus_t *g, colld_session_t *s, const colld_wire_msg_t *m, colld_err_t *err)
{
    int gi = cuda_gpu_by_uuid(g, m->u.reg_cuda_seg.uuid);
    if (gi < 0) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      "the buffer's GPU is not visible to the daemon (is CUDA_VISIBLE_DEVICES narrower for colld?)");
        return NULL;
    }
    unsigned count = m->u.reg_cuda_seg.count;
    gpu_pending_t *p = calloc(1, sizeof(*p));
    size_t *sizes = calloc(count, sizeof(*sizes));
    CUmemGenericAllocationHandle *h = calloc(count, sizeof(*h));
    if (!p || !sizes || !h) {
        free(p), free(sizes), free(h);
        colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
        return NULL;
    }
    *p = (gpu_pending_t){ .s = s,
                          .cookie = m->u.reg_cuda_seg.cookie,
                          .total = m->u.reg_cuda_seg.total,
                          .count = count,
                          .gpu = gi,
                          .sizes = sizes,
                          .h = h };
    memcpy(p->uuid, m->u.reg_cuda_seg.uuid, sizeof(p->uuid));
    return p;
}

/* Does segment m follow the assembly p (the same registration, the next index and offset, within
 * its total)? COLLD_OK or err. */
static colld_status_t follows(const gpu_pending_t *p, const colld_wire_msg_t *m, colld_err_t *err)
{
    unsigned index = m->u.reg_cuda_seg.index;
    uint64_t offset = m->u.reg_cuda_seg.offset, bytes = m->u.reg_cuda_seg.bytes;
    if (!p)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "GPU segment %u of a registration that is not being assembled (its first segment was "
                             "refused, or never sent)",
                             index);
    if (m->u.reg_cuda_seg.cookie != p->cookie || m->u.reg_cuda_seg.count != p->count ||
        m->u.reg_cuda_seg.total != p->total || memcmp(m->u.reg_cuda_seg.uuid, p->uuid, sizeof(p->uuid)) != 0)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "GPU segment %u does not belong to the registration being assembled (its cookie, "
                             "count, total or GPU differ)",
                             index);
    if (index != p->got)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "GPU segment %u arrived out of order: segment %u was expected", index, p->got);
    if (offset != p->next_off || bytes > p->total - p->next_off)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "GPU segment %u (%llu bytes at offset %llu) does not follow the segments before it "
                             "(%llu bytes) within the registration's %llu bytes",
                             index, (unsigned long long)bytes, (unsigned long long)offset,
                             (unsigned long long)p->next_off, (unsigned long long)p->total);
    return COLLD_OK;
}

/* Import the segment's allocation, which must live on the registration's GPU. */
static colld_status_t import(colld_gpus_t *g, gpu_pending_t *p, int fd, uint64_t bytes, colld_err_t *err)
{
    const colld_cu_t *cu = g->cu;
    CUmemGenericAllocationHandle h = 0;
    int dev = -1;
    char buf[160];
    CU_CHECK(cu, cuCtxPushCurrent, g->gpu[p->gpu].ctx);
    CUresult r = colld_cuda_ipc_import(cu, fd, &h, &dev);
    if (r == CUDA_SUCCESS && dev != (int)g->gpu[p->gpu].dev) {
        CU_CHECK(cu, cuMemRelease, h);
        r = CUDA_ERROR_INVALID_DEVICE;
    }
    CU_CHECK(cu, cuCtxPopCurrent, NULL);
    if (r == CUDA_ERROR_INVALID_DEVICE && dev >= 0)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "GPU segment %u is on device %d, but the registration names GPU %d (%s)", p->got, dev,
                             p->gpu, g->gpu[p->gpu].name);
    if (r != CUDA_SUCCESS) {
        cuda_gpu_fault(g, p->gpu, r);
        return colld_err_set(err, r == CUDA_ERROR_OUT_OF_MEMORY ? COLLD_ERR_NO_MEMORY : COLLD_ERR_INVALID_ARGUMENT,
                             "GPU segment %u: the daemon cannot import its VMM POSIX fd: %s", p->got,
                             colld_cu_describe(cu, r, buf, sizeof(buf)));
    }
    p->h[p->got] = h;
    p->sizes[p->got] = (size_t)bytes;
    p->got++;
    p->next_off += bytes;
    return COLLD_OK;
}

/* The last segment arrived: map every allocation back to back in one range on the registration's
 * GPU, check where the memory lives, and make the registration (p is consumed on success). */
static colld_status_t finish(colld_backend_t *b, colld_session_t *s, gpu_pending_t *p, uint32_t *reg_id,
                             colld_err_t *err)
{
    colld_daemon_t *d = s->daemon;
    colld_gpus_t *g = gpus_of(b);
    const colld_cu_t *cu = g->cu;
    int gi = p->gpu;
    if (p->next_off != p->total)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "the %u GPU segments add up to %llu bytes, not the %llu the registration announced",
                             p->count, (unsigned long long)p->next_off, (unsigned long long)p->total);
    gpu_reg_t *gr = calloc(1, sizeof(*gr));
    if (!gr)
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
    char why[sizeof(g->gpu[0].why) + 64];
    pthread_mutex_lock(&d->lock);
    const char *unusable = cuda_gpu_unusable(g, gi, why, sizeof(why));
    if (!unusable)
        g->gpu[gi].opening++; /* a reset waits for it */
    pthread_mutex_unlock(&d->lock);
    if (unusable) {
        free(gr);
        return colld_err_set(err, COLLD_ERR_DEVICE, "%s", unusable);
    }
    CUdevice access[64];
    int naccess = cuda_access_list(g, gi, access, 64);
    CUdeviceptr addr = 0;
    colld_status_t st = COLLD_OK;
    CU_CHECK(cu, cuCtxPushCurrent, g->gpu[gi].ctx);
    CUresult r = colld_cuda_ipc_map_segments(cu, p->h, p->sizes, p->count, access, naccess, &addr);
    if (r == CUDA_SUCCESS && (st = cuda_check_device(g, gi, addr, err)) != COLLD_OK)
        colld_cuda_ipc_close_segments(cu, addr, p->sizes, p->count);
    CU_CHECK(cu, cuCtxPopCurrent, NULL);
    if (r != CUDA_SUCCESS) {
        char buf[160];
        cuda_gpu_fault(g, gi, r);
        st = colld_err_set(err, r == CUDA_ERROR_OUT_OF_MEMORY ? COLLD_ERR_NO_MEMORY : COLLD_ERR_INVALID_ARGUMENT,
                           "the daemon cannot map the %u GPU segments back to back (a segment larger than its "
                           "allocation, or not a multiple of its granularity?): %s",
                           p->count, colld_cu_describe(cu, r, buf, sizeof(buf)));
    }
    if (st != COLLD_OK) {
        free(gr);
        pthread_mutex_lock(&d->lock);
        g->gpu[gi].opening--;
        pthread_cond_broadcast(&g->recover_cv);
        pthread_mutex_unlock(&d->lock);
        return st;
    }
    *gr = (gpu_reg_t){
        .gpu = gi, .how = COLLD_CUDA_EXPORT_FD, .p = addr, .size = (size_t)p->total, .nseg = p->count, .seg = p->sizes
    };
    p->sizes = NULL;
    uint64_t total = p->total;
    unsigned count = p->count;
    cuda_seg_free(g, p); /* the handles: the mappings hold the memory */
    if ((st = cuda_reg_publish(b, s, gr, total, reg_id, err)) != COLLD_OK)
        return st;
    LOG_DEBUG(GPU, "session %llu: registered %llu bytes of GPU %d memory in %u VMM allocations as %u",
              (unsigned long long)s->id, (unsigned long long)total, gi, count, *reg_id);
    return COLLD_OK;
}

colld_status_t cuda_seg_register(colld_backend_t *b, colld_session_t *s, const colld_wire_msg_t *m, int fd,
                                 uint32_t *reg_id, colld_err_t *err)
{
    colld_gpus_t *g = gpus_of(b);
    unsigned index = m->u.reg_cuda_seg.index, count = m->u.reg_cuda_seg.count;
    uint64_t bytes = m->u.reg_cuda_seg.bytes, total = m->u.reg_cuda_seg.total;
    colld_status_t st = COLLD_OK;
    *reg_id = 0;
    gpu_pending_t *p = take(g, s);
    if (fd < 0)
        st = colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "GPU segment %u without a file descriptor", index);
    else if (count < 2 || count > COLLD_WIRE_CUDA_MAX_SEGMENTS)
        st = colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                           "a GPU registration of %u segments: colld takes 2 to %u (a buffer across more VMM "
                           "allocations cannot be registered)",
                           count, COLLD_WIRE_CUDA_MAX_SEGMENTS);
    else if (index >= count || bytes == 0 || total == 0)
        st = colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "GPU segment %u of %u, %llu bytes of %llu: out of range",
                           index, count, (unsigned long long)bytes, (unsigned long long)total);
    if (st == COLLD_OK && index == 0) {
        cuda_seg_free(g, p); /* an assembly under way is given up */
        p = begin(g, s, m, err);
        st = p ? COLLD_OK : err->status;
    }
    if (st == COLLD_OK)
        st = follows(p, m, err);
    if (st == COLLD_OK)
        st = import(g, p, fd, bytes, err);
    if (st == COLLD_OK && p->got == p->count) {
        st = finish(b, s, p, reg_id, err);
        if (st == COLLD_OK)
            p = NULL; /* consumed */
    }
    if (st != COLLD_OK) {
        cuda_seg_free(g, p); /* nothing stays half-registered */
        return st;
    }
    if (p)
        put_back(g, p);
    return COLLD_OK;
}
