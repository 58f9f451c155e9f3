/*
 * cuda_mem.c - the CUDA backend's memory: GPU registrations (COLLD_MSG_REG_CUDA), opened through
 * transport/cuda_ipc and bounded by what the driver really mapped, each session's GPU stream flag
 * area (COLLD_MSG_GPU_FLAGS), a sealed memfd registered with CUDA by both sides, and the pools of
 * host blocks registered for the words the kernels write (--nan-check's, the hand-offs').
 */
#include "server/backends/cuda/cuda.h"
#include "server/core/tenant.h"

#include "common/log.h"
#include "common/util.h"
#include "transport/cuda_ipc/cuda_ipc.h"
#include "transport/shm/shm.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ============================================================================================
 * Registrations
 * ========================================================================================== */

int cuda_gpu_by_uuid(const colld_gpus_t *g, const uint8_t *uuid)
{
    for (int i = 0; i < g->n; i++)
        if (memcmp(g->gpu[i].uuid.bytes, uuid, sizeof(g->gpu[i].uuid.bytes)) == 0)
            return i;
    return -1;
}

/* Registration, step 1: the message's own fields and the GPU it names. Returns the GPU's index,
 * or -1 with err. */
static int check_request(const colld_gpus_t *g, const colld_wire_msg_t *m, int fd, colld_err_t *err)
{
    unsigned how = m->u.reg_cuda.how;
    if (how != COLLD_CUDA_EXPORT_IPC && how != COLLD_CUDA_EXPORT_FD) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "unknown GPU export kind %u", how);
        return -1;
    }
    if (m->u.reg_cuda.bytes == 0) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "GPU registration of 0 bytes");
        return -1;
    }
    if ((how == COLLD_CUDA_EXPORT_FD) != (fd >= 0)) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      how == COLLD_CUDA_EXPORT_FD ? "VMM registration without a file descriptor"
                                                  : "IPC registration with a file descriptor");
        return -1;
    }
    int gi = cuda_gpu_by_uuid(g, m->u.reg_cuda.uuid);
    if (gi < 0)
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      "the buffer's GPU is not visible to the daemon (is CUDA_VISIBLE_DEVICES narrower for colld?)");
    return gi;
}

/* Registration, step 2: the same IPC allocation registered again by this session is the same
 * registration (one more user). True when it was. */
static bool reuse_ipc(colld_session_t *s, const colld_wire_msg_t *m, uint32_t *reg_id)
{
    colld_daemon_t *d = s->daemon;
    bool found = false;
    pthread_mutex_lock(&d->lock);
    for (colld_reg_t *r = s->regs; r && !found; r = r->next) {
        const gpu_reg_t *gr = r->bpriv;
        if (r->device && gr && gr->how == COLLD_CUDA_EXPORT_IPC &&
            memcmp(gr->ipc, m->u.reg_cuda.ipc, COLLD_WIRE_CUDA_IPC_BYTES) == 0) {
            r->users++;
            *reg_id = r->id;
            found = true;
        }
    }
    pthread_mutex_unlock(&d->lock);
    return found;
}

/* Close an allocation opened on GPU gi. */
static void close_on(const colld_gpus_t *g, int gi, int how, CUdeviceptr p, size_t size)
{
    CU_CHECK(g->cu, cuCtxPushCurrent, g->gpu[gi].ctx);
    colld_cuda_ipc_close(g->cu, how, p, size);
    CU_CHECK(g->cu, cuCtxPopCurrent, NULL);
}

/* The daemon's GPU whose device is `ordinal`, or -1. */
static int gpu_by_ordinal(const colld_gpus_t *g, int ordinal)
{
    for (int i = 0; i < g->n; i++)
        if ((int)g->gpu[i].dev == ordinal)
            return i;
    return -1;
}

/* Registration, step 3b (issue 15 C5): the memory the daemon mapped must live on the GPU the
 * client named. The client's UUID only picks the context to open it in; where the memory really
 * is, the daemon's driver says (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL of the mapping). A client that
 * names another GPU (a bug, or a lie to get its buffer run on a GPU it was not given) is refused.
 * Lock not held; the mapping's context current. */
colld_status_t cuda_check_device(const colld_gpus_t *g, int gi, CUdeviceptr p, colld_err_t *err)
{
    int ordinal = -1;
    CUpointer_attribute at = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
    void *data = &ordinal;
    CUresult r = CU_CHECK(g->cu, cuPointerGetAttributes, 1, &at, &data, p);
    if (r != CUDA_SUCCESS) {
        char buf[160];
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "the daemon cannot tell which GPU the buffer is on: %s",
                             colld_cu_describe(g->cu, r, buf, sizeof(buf)));
    }
    if (ordinal == (int)g->gpu[gi].dev)
        return COLLD_OK;
    int real = gpu_by_ordinal(g, ordinal);
    if (real < 0)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "the registration names GPU %d (%s), but the buffer is on device %d, which the daemon "
                             "does not drive",
                             gi, g->gpu[gi].name, ordinal);
    return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                         "the registration names GPU %d (%s), but the buffer is on GPU %d (%s): the UUID sent with it "
                         "is not its device's",
                         gi, g->gpu[gi].name, real, g->gpu[real].name);
}

int cuda_access_list(const colld_gpus_t *g, int gi, CUdevice *access, int max)
{
    int n = 0;
    for (int j = 0; j < g->n && n < max; j++)
        if (g->peer[j * g->n + gi])
            access[n++] = g->gpu[j].dev;
    return n;
}

/* Registration, step 3: open the allocation on its GPU, accessible to every GPU with peer access
 * to it, and check that it lives there. Returns COLLD_OK with its address, or the error. */
static colld_status_t open_alloc(colld_gpus_t *g, int gi, const colld_wire_msg_t *m, int fd, CUdeviceptr *p,
                                 colld_err_t *err)
{
    const colld_cu_t *cu = g->cu;
    unsigned how = m->u.reg_cuda.how;
    uint64_t bytes = m->u.reg_cuda.bytes;
    CUdevice access[64];
    int naccess = cuda_access_list(g, gi, access, 64);
    size_t mapped = 0;
    CU_CHECK(cu, cuCtxPushCurrent, g->gpu[gi].ctx);
    CUresult r = colld_cuda_ipc_open(cu, (int)how, m->u.reg_cuda.ipc, fd, bytes, access, naccess, p, &mapped);
    if (r == CUDA_SUCCESS && how == COLLD_CUDA_EXPORT_IPC && mapped < bytes) {
        colld_cuda_ipc_close(cu, (int)how, *p, mapped);
        CU_CHECK(cu, cuCtxPopCurrent, NULL);
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "GPU registration of %llu bytes, but the allocation behind the handle has %llu",
                             (unsigned long long)bytes, (unsigned long long)mapped);
    }
    if (r == CUDA_SUCCESS && cuda_check_device(g, gi, *p, err) != COLLD_OK) {
        colld_cuda_ipc_close(cu, (int)how, *p, mapped ? mapped : bytes);
        CU_CHECK(cu, cuCtxPopCurrent, NULL);
        return err->status;
    }
    CU_CHECK(cu, cuCtxPopCurrent, NULL);
    if (r != CUDA_SUCCESS) {
        char buf[160];
        cuda_gpu_fault(g, gi, r);
        if (cuda_sticky(r))
            return colld_err_set(err, COLLD_ERR_DEVICE,
                                 "the daemon cannot open the GPU buffer: GPU %d (%s) has a CUDA error in the daemon's "
                                 "context (%s); it is being reset: try again",
                                 gi, g->gpu[gi].name, colld_cu_describe(cu, r, buf, sizeof(buf)));
        return colld_err_set(err, r == CUDA_ERROR_OUT_OF_MEMORY ? COLLD_ERR_NO_MEMORY : COLLD_ERR_INVALID_ARGUMENT,
                             "the daemon cannot open the GPU buffer (%s): %s",
                             how == COLLD_CUDA_EXPORT_IPC ? "CUDA IPC handle" : "VMM POSIX fd",
                             colld_cu_describe(cu, r, buf, sizeof(buf)));
    }
    return COLLD_OK;
}

colld_status_t cuda_reg_publish(colld_backend_t *b, colld_session_t *s, gpu_reg_t *gr, uint64_t bytes, uint32_t *reg_id,
                                colld_err_t *err)
{
    colld_daemon_t *d = s->daemon;
    colld_gpus_t *g = gpus_of(b);
    int gi = gr->gpu;
    colld_reg_t *reg = calloc(1, sizeof(*reg));
    if (!reg) {
        cuda_mem_close(g, gr);
        cuda_reg_free(gr);
        pthread_mutex_lock(&d->lock);
        g->gpu[gi].opening--;
        pthread_cond_broadcast(&g->recover_cv);
        pthread_mutex_unlock(&d->lock);
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
    }
    gr->reg = reg;
    reg->device = true;
    reg->backend = b;
    reg->bpriv = gr;
    reg->daemon = d;
    reg->base = (void *)(uintptr_t)gr->p;
    reg->size = bytes; /* references are checked against what the client registered (<= mapped) */
    reg->refs = 1;
    reg->users = 1;
    pthread_mutex_lock(&d->lock);
    reg->id = ++s->next_reg_id;
    reg->next = s->regs;
    s->regs = reg;
    cuda_track_reg(g, gr, true); /* a reset that waited for it will find it */
    g->gpu[gi].opening--;
    pthread_cond_broadcast(&g->recover_cv);
    pthread_mutex_unlock(&d->lock);
    *reg_id = reg->id;
    return COLLD_OK;
}

colld_status_t cuda_mem_register(colld_backend_t *b, colld_session_t *s, const colld_wire_msg_t *m, int fd,
                                 uint32_t *reg_id, colld_err_t *err)
{
    colld_daemon_t *d = s->daemon;
    colld_gpus_t *g = gpus_of(b);
    if (!g)
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "no GPU here: %s", d->device_none);
    int gi = check_request(g, m, fd, err);
    if (gi < 0)
        return err->status;
    unsigned how = m->u.reg_cuda.how;
    uint64_t bytes = m->u.reg_cuda.bytes;
    if (how == COLLD_CUDA_EXPORT_IPC && reuse_ipc(s, m, reg_id))
        return COLLD_OK;
    /* Not on a GPU being reset (or given up); a reset waits for the registrations being opened. */
    char why[sizeof(g->gpu[0].why) + 64];
    pthread_mutex_lock(&d->lock);
    const char *unusable = cuda_gpu_unusable(g, gi, why, sizeof(why));
    if (!unusable) /* a drained GPU (cuda_health.c) takes no new registration either */
        unusable = cuda_gpu_drained(g, gi, why, sizeof(why));
    if (!unusable)
        g->gpu[gi].opening++;
    pthread_mutex_unlock(&d->lock);
    if (unusable)
        return colld_err_set(err, COLLD_ERR_DEVICE, "%s", unusable);
    CUdeviceptr p = 0;
    colld_status_t st = open_alloc(g, gi, m, fd, &p, err);
    gpu_reg_t *gr = st == COLLD_OK ? calloc(1, sizeof(*gr)) : NULL;
    if (st == COLLD_OK && !gr) {
        close_on(g, gi, (int)how, p, bytes);
        st = colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
    }
    if (st != COLLD_OK) {
        pthread_mutex_lock(&d->lock);
        g->gpu[gi].opening--;
        pthread_cond_broadcast(&g->recover_cv);
        pthread_mutex_unlock(&d->lock);
        return st;
    }
    gr->gpu = gi;
    gr->how = (int)how;
    gr->p = p;
    gr->size = bytes;
    if (how == COLLD_CUDA_EXPORT_IPC)
        memcpy(gr->ipc, m->u.reg_cuda.ipc, sizeof(gr->ipc));
    if ((st = cuda_reg_publish(b, s, gr, bytes, reg_id, err)) != COLLD_OK)
        return st;
    LOG_DEBUG(GPU, "session %llu: registered %llu bytes of GPU %d memory as %u (%s)", (unsigned long long)s->id,
              (unsigned long long)bytes, gi, *reg_id, how == COLLD_CUDA_EXPORT_IPC ? "IPC" : "VMM fd");
    return COLLD_OK;
}

/* A registration's last reference went (lock held): its mapping is queued for the recovery thread
 * to close with the lock dropped (cuda_release.c, issue 15 F4), unless a reset of its GPU took it.
 * Once the backend has stopped there is no context left to close it in. */
void cuda_mem_release(colld_backend_t *b, colld_reg_t *r)
{
    colld_gpus_t *g = gpus_of(b);
    gpu_reg_t *gr = r->bpriv;
    r->bpriv = NULL;
    if (!gr)
        return;
    if (!g) {
        cuda_reg_free(gr);
        return;
    }
    cuda_track_reg(g, gr, false);
    cuda_release_reg(g, gr);
}

/* ============================================================================================
 * The session's flag area
 * ========================================================================================== */

/* The bytes of a session's flag area. */
static uint64_t flags_bytes(const colld_daemon_t *d)
{
    return COLLD_WIRE_GPU_AREA_BYTES(d->cfg.max_comms_per_session, (uint32_t)d->cfg.max_plans_per_session);
}

CUresult cuda_flags_register(colld_gpus_t *g, int gi, void *flags, size_t size, uint64_t *dptr)
{
    const colld_cu_t *cu = g->cu;
    CUdeviceptr dp = 0;
    CU_CHECK(cu, cuCtxPushCurrent, g->gpu[gi].ctx);
    CUresult r = CU_CHECK(cu, cuMemHostRegister, flags, size,
                          CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    if (r == CUDA_SUCCESS && (r = CU_CHECK(cu, cuMemHostGetDevicePointer, &dp, flags, 0)) != CUDA_SUCCESS)
        CU_CHECK(cu, cuMemHostUnregister, flags);
    CU_CHECK(cu, cuCtxPopCurrent, NULL);
    cuda_gpu_fault(g, gi, r);
    *dptr = (uint64_t)dp;
    return r;
}

/* ============================================================================================
 * Host blocks for the kernels' words (--nan-check's, the hand-offs'), pooled per GPU
 * ========================================================================================== */

#define HOSTBLK_PAGE 4096u

int cuda_hostpool_init(cuda_hostpool_t *p, int ngpus, size_t bytes)
{
    p->size = (bytes + HOSTBLK_PAGE - 1) / HOSTBLK_PAGE * HOSTBLK_PAGE;
    p->free = calloc((size_t)ngpus, sizeof(*p->free));
    return p->free ? 0 : -1;
}

/* A new block of p's size, registered in GPU gi's context; NULL with *r the error. */
static cuda_hostblk_t *hostblk_new(colld_gpus_t *g, const cuda_hostpool_t *p, int gi, CUresult *r)
{
    cuda_hostblk_t *x = calloc(1, sizeof(*x));
    *r = CUDA_ERROR_OUT_OF_MEMORY;
    if (!x || posix_memalign(&x->mem, HOSTBLK_PAGE, p->size) != 0) {
        free(x);
        return NULL;
    }
    x->size = p->size;
    x->gpu = gi;
    pthread_mutex_lock(&g->hostblk_mu);
    x->epoch = g->hostblk_epoch[gi];
    pthread_mutex_unlock(&g->hostblk_mu);
    if ((*r = cuda_flags_register(g, gi, x->mem, x->size, &x->dptr)) != CUDA_SUCCESS) {
        free(x->mem);
        free(x);
        return NULL;
    }
    return x;
}

cuda_hostblk_t *cuda_hostblk_get(colld_gpus_t *g, cuda_hostpool_t *p, int gi, CUresult *r)
{
    pthread_mutex_lock(&g->hostblk_mu);
    cuda_hostblk_t *x = p->free[gi];
    if (x)
        p->free[gi] = x->next;
    pthread_mutex_unlock(&g->hostblk_mu);
    if (!x && !(x = hostblk_new(g, p, gi, r)))
        return NULL;
    x->next = NULL;
    return x;
}

void cuda_hostblk_put(colld_gpus_t *g, cuda_hostpool_t *p, cuda_hostblk_t *x)
{
    pthread_mutex_lock(&g->hostblk_mu);
    bool valid = x->epoch == g->hostblk_epoch[x->gpu];
    if (valid) {
        x->next = p->free[x->gpu];
        p->free[x->gpu] = x;
    }
    pthread_mutex_unlock(&g->hostblk_mu);
    if (!valid) { /* its registration went with a reset of its GPU's context */
        free(x->mem);
        free(x);
    }
}

/* Free a list of blocks, unregistering each first (unregister: its context is still there). */
static void hostblk_free_list(colld_gpus_t *g, cuda_hostblk_t *x, bool unregister)
{
    while (x) {
        cuda_hostblk_t *next = x->next;
        if (unregister) {
            CU_CHECK(g->cu, cuCtxPushCurrent, g->gpu[x->gpu].ctx);
            CU_CHECK(g->cu, cuMemHostUnregister, x->mem);
            CU_CHECK(g->cu, cuCtxPopCurrent, NULL);
        }
        free(x->mem);
        free(x);
        x = next;
    }
}

void cuda_hostblk_gpu_reset(colld_gpus_t *g, int gi)
{
    cuda_hostpool_t *pools[] = { &g->nan_blocks, &g->ho_blocks };
    cuda_hostblk_t *drop[2];
    pthread_mutex_lock(&g->hostblk_mu);
    for (int i = 0; i < 2; i++) {
        drop[i] = pools[i]->free[gi];
        pools[i]->free[gi] = NULL;
    }
    g->hostblk_epoch[gi]++;
    pthread_mutex_unlock(&g->hostblk_mu);
    for (int i = 0; i < 2; i++)
        hostblk_free_list(g, drop[i], false);
}

void cuda_hostblk_free_all(colld_gpus_t *g)
{
    cuda_hostpool_t *pools[] = { &g->nan_blocks, &g->ho_blocks };
    for (int i = 0; i < 2; i++) {
        if (!pools[i]->free)
            continue;
        for (int gi = 0; gi < g->n; gi++) {
            hostblk_free_list(g, pools[i]->free[gi], true);
            pools[i]->free[gi] = NULL;
        }
        free(pools[i]->free);
        pools[i]->free = NULL;
    }
}

/* Make the session's flag area: a sealed memfd of one line per communicator handle and the plan
 * lines of its captured collectives (--max-plans-per-session, proto/wire.h), registered with CUDA
 * as portable and device-mapped in GPU gi's context (the home GPU's) so that every GPU's stream
 * can write `done` into it. Lock NOT held (issue 15 F4: pinning takes hundreds of microseconds on
 * hardware); the caller publishes it. Returns it, or NULL with err. */
static gpu_session_t *flags_create(colld_gpus_t *g, colld_session_t *s, int gi, colld_err_t *err)
{
    colld_daemon_t *d = s->daemon;
    uint32_t plans = (uint32_t)d->cfg.max_plans_per_session;
    uint64_t bytes = flags_bytes(d);
    gpu_session_t *gs = calloc(1, sizeof(*gs));
    struct gpu_plan_part **plan_line = calloc(plans ? plans : 1, sizeof(*plan_line));
    int fd = -1;
    void *p;
    if (!gs || !plan_line || colld_shm_create("colld-gpu-flags", bytes, &fd, &p) < 0) {
        colld_err_set(err, COLLD_ERR_SYSTEM, "cannot create the GPU flag area: %s",
                      gs && plan_line ? strerror(errno) : "out of memory");
        free(gs);
        free(plan_line);
        return NULL;
    }
    gs->flags = p;
    gs->size = bytes;
    gs->fd = fd;
    gs->lines = (uint32_t)COLLD_WIRE_GPU_LINES(d->cfg.max_comms_per_session);
    gs->plans = plans;
    gs->plan_line = plan_line;
    CUresult r = cuda_flags_register(g, gi, p, bytes, &gs->dptr);
    if (r != CUDA_SUCCESS) {
        char buf[160];
        colld_err_set(err, COLLD_ERR_DEVICE, "cannot register the GPU flag area with CUDA on GPU %d (%s): %s", gi,
                      g->gpu[gi].name, colld_cu_describe(g->cu, r, buf, sizeof(buf)));
        (void)SYS_CHECK(GPU, munmap(p, bytes));
        close(fd);
        free(gs->plan_line);
        free(gs);
        return NULL;
    }
    gs->registered = true;
    gs->reg_gpu = gi;
    return gs;
}

/* The session's flag area, made on its first request: with the lock dropped while it is made and
 * registered, the home GPU counted as `opening` so that a reset of it waits for the registration
 * (and a reset that did not wait leaves the area marked unregistered, as its other areas). Session
 * messages are served one at a time per session (the loop thread), so no other request of s
 * makes one meanwhile. */
int cuda_sync_area(colld_backend_t *b, colld_session_t *s, uint64_t *size, uint32_t *lines, uint32_t *plans,
                   colld_err_t *err)
{
    colld_daemon_t *d = s->daemon;
    colld_gpus_t *g = gpus_of(b);
    if (!g) {
        colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "no GPU here: %s", d->device_none);
        return -1;
    }
    pthread_mutex_lock(&d->lock);
    gpu_session_t *gs = gpu_session_of(b, s);
    if (!gs) {
        char why[sizeof(g->gpu[0].why) + 64];
        int home = g->home;
        const char *unusable = cuda_gpu_unusable(g, home, why, sizeof(why));
        if (unusable) {
            colld_err_set(err, COLLD_ERR_DEVICE, "cannot register the GPU flag area with CUDA: %s", unusable);
            pthread_mutex_unlock(&d->lock);
            return -1;
        }
        /* Pinned memory of the daemon's, made for this tenant: charged to it until the session
         * ends (cuda_session_free). */
        if (colld_tenant_charge_mem(d, s->uid, flags_bytes(d), err) != COLLD_OK) {
            pthread_mutex_unlock(&d->lock);
            return -1;
        }
        unsigned resets = g->gpu[home].resets;
        g->gpu[home].opening++;
        pthread_mutex_unlock(&d->lock);
        gs = flags_create(g, s, home, err);
        pthread_mutex_lock(&d->lock);
        g->gpu[home].opening--;
        pthread_cond_broadcast(&g->recover_cv);
        if (!gs) {
            colld_tenant_uncharge_mem(d, s->uid, flags_bytes(d));
            pthread_mutex_unlock(&d->lock);
            return -1;
        }
        if (g->gpu[home].resets != resets || g->home != home)
            gs->registered = false; /* a reset that did not wait for it dropped it */
        cuda_track_session(g, gs, true);
        s->bslot[b->slot] = gs;
    }
    int fd = dup(gs->fd);
    *size = gs->size;
    *lines = gs->lines;
    *plans = gs->plans;
    pthread_mutex_unlock(&d->lock);
    if (fd < 0)
        colld_err_set(err, COLLD_ERR_SYSTEM, "dup: %s", strerror(errno));
    return fd;
}

/* The session's last reference went (lock held): its flag area is queued for the recovery thread
 * to unregister and unmap with the lock dropped (cuda_release.c, issue 15 F4); once the backend has
 * stopped it is only unmapped. */
void cuda_session_free(colld_backend_t *b, colld_session_t *s)
{
    colld_gpus_t *g = gpus_of(b);
    gpu_session_t *gs = gpu_session_of(b, s);
    if (!gs)
        return;
    s->bslot[b->slot] = NULL;
    colld_tenant_uncharge_mem(s->daemon, s->uid, gs->size);
    if (g) {
        cuda_track_session(g, gs, false);
        cuda_release_session(g, gs);
        return;
    }
    (void)SYS_CHECK(GPU, munmap(gs->flags, gs->size));
    close(gs->fd);
    free(gs->plan_line); /* its plans held a reference on the session: none is left */
    free(gs);
}
