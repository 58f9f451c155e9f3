/*
 * cuda.c - the CUDA backend of the daemon: the GPUs, and the operations table that puts GPU
 * registrations, stream flags and stream-ordered collectives behind the backend interface
 * (server/core/backend.h). Built only with the CUDA toolkit; a daemon built without it simply
 * does not have this backend (server/registry.c.in), and answers GPU requests with the reason.
 *
 * GPUs: at start the driver is loaded at run time (common/cudadrv); every visible GPU's primary
 * context is retained and peer access is enabled between every pair the driver says can reach
 * each other; the kernels (kernels/cuda: an embedded fatbin launched through the driver API) are
 * loaded and checked against the driver and every GPU. A daemon without a driver, a GPU, or a
 * driver and GPUs that can run its kernels serves host collectives only: the backend is then
 * absent, and GPU requests get COLLD_ERR_NOT_SUPPORTED with the reason (d->device_none).
 *
 * The files and the one way they call are listed in cuda.h.
 *
 * Registrations (cuda_mem.c, cuda_seg.c): an IPC handle is opened once per session, a VMM allocation arrives
 * as a POSIX fd (both through transport/cuda_ipc); either way the daemon bounds-checks each
 * reference against the size of the allocation it really mapped (never the size the client
 * claimed), and releases the mapping on deregistration or session end once no collective uses it.
 *
 * Stream-ordered collectives (COLLD_SQE_STREAM; the flag protocol is in proto/wire.h; cuda_coll.c
 * and cuda_launch.c; sends and receives alike, cuda_p2p.c):
 *
 *   matched   every rank posted the descriptor; the collective waits in `pending` (FIFO)
 *   ready     every rank's `ready` slot of the collective holds its flag value (marked taken):
 *             the engine thread launches it (outside the lock) on the communicator's stream of each GPU involved, then
 *             the lead GPU's stream writes every rank's `done` flag and records an event
 *   running   the engine polls the event; when it has fired the completions are posted
 *
 * The daemon launches only when every rank's stream got there (host-side check of the flags),
 * instead of making its own stream wait for them: a wait enqueued on a GPU stream cannot be
 * cancelled, and a kernel must never run on the buffers of a rank that died or never got there.
 * It also lets the time-out name the ranks whose stream never reached the collective.
 *
 * A collective captured into a CUDA graph is a persistent plan (cuda_plan.c): registered once when
 * it is captured, run once per replay of the graph when every rank's graph reaches it.
 *
 * A sticky CUDA error in the daemon's context of a GPU (cuda_recover.c) fails that GPU's work with
 * COLLD_ERR_DEVICE, resets its primary context and brings it back, while other GPUs and host work
 * go on; a GPU that keeps faulting is given up.
 *
 * Failure release: a collective that fails, and every rank of a communicator that breaks, gets
 * its `done` flag set to (last sequence number + COLLD_WIRE_GPU_RELEASE) so that no application
 * stream waits forever; this is deferred while a collective of the communicator is being launched
 * or runs (its stream write of `done` would otherwise move the flag backwards): a collective counts
 * as running from the moment it leaves `pending`. A launch that fails part-way waits for what it
 * enqueued before the collective fails (cuda_launch.c drain_streams).
 */
#include "server/backends/cuda/cuda.h"
#include "server/backends/cuda/cuda_plan.h"

#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Without the watcher thread (cuda_watch.c): how long the engine busy-polls GPU flags and events
 * before it polls them once a millisecond. */
#define GPU_SPIN_NS 2000000ull

/* ============================================================================================
 * Start and stop
 * ========================================================================================== */

/* Peer access where the topology allows it (the driver's verdict, not /sys). */
static void enable_peers(colld_gpus_t *g)
{
    const colld_cu_t *cu = g->cu;
    int n = g->n;
    for (int i = 0; i < n; i++) {
        g->peer[i * n + i] = true;
        for (int j = 0; j < n; j++) {
            int can = 0;
            if (i == j || CU_CHECK(cu, cuDeviceCanAccessPeer, &can, g->gpu[i].dev, g->gpu[j].dev) != CUDA_SUCCESS ||
                !can)
                continue;
            CU_CHECK(cu, cuCtxSetCurrent, g->gpu[i].ctx);
            CUresult r = CU_CHECK_EXPECT(cu, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, cuCtxEnablePeerAccess,
                                         g->gpu[j].ctx, 0);
            g->peer[i * n + j] = r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        }
    }
    CU_CHECK(cu, cuCtxSetCurrent, NULL);
}

/* Take GPU i: its device, UUID and primary context, its name and flush attribute. Returns
 * CUDA_SUCCESS or the error that keeps the backend from using it. */
static CUresult take_gpu(const colld_cu_t *cu, int i, gpu_t *gpu)
{
    CUresult r;
    if ((r = CU_CHECK(cu, cuDeviceGet, &gpu->dev, i)) != CUDA_SUCCESS ||
        (r = CU_CHECK(cu, cuDeviceGetUuid, &gpu->uuid, gpu->dev)) != CUDA_SUCCESS ||
        (r = CU_CHECK(cu, cuDevicePrimaryCtxRetain, &gpu->ctx, gpu->dev)) != CUDA_SUCCESS)
        return r;
    if (CU_CHECK(cu, cuDeviceGetName, gpu->name, (int)sizeof(gpu->name), gpu->dev) != CUDA_SUCCESS)
        snprintf(gpu->name, sizeof(gpu->name), "GPU %d", i);
    int v = 0;
    if (CU_CHECK(cu, cuDeviceGetAttribute, &v, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, gpu->dev) == CUDA_SUCCESS)
        gpu->flush_remote = v != 0;
    return CUDA_SUCCESS;
}

/* The watcher's question (cuda_watch.c): can cuda_progress move a collective, a plan's run or a
 * transfer now (lock held)? */
static bool cuda_movable(colld_backend_t *b)
{
    return gpus_of(b) && (cuda_coll_movable(b) || cuda_plan_movable(b) || cuda_p2p_movable(b));
}

/* Load the driver and take every visible GPU; none is fine (the backend is absent and
 * d->device_none says why). Returns -1 only without memory. */
static int cuda_start(colld_backend_t *b)
{
    colld_daemon_t *d = b->d;
    char err[256];
    const colld_cu_t *cu = colld_cu_load(err, sizeof(err));
    if (!cu) {
        colld_strlcpy(d->device_none, err, sizeof(d->device_none));
        LOG_INFO(GPU, "no CUDA backend: %s", err);
        return 0;
    }
    int n = 0;
    CUresult r = CU_CHECK(cu, cuDeviceGetCount, &n);
    if (r != CUDA_SUCCESS || n <= 0) {
        char buf[160];
        snprintf(d->device_none, sizeof(d->device_none), "no GPU visible to the daemon%s%s",
                 r != CUDA_SUCCESS ? ": " : " (check CUDA_VISIBLE_DEVICES and the driver)",
                 r != CUDA_SUCCESS ? colld_cu_describe(cu, r, buf, sizeof(buf)) : "");
        LOG_INFO(GPU, "no CUDA backend: %s", d->device_none);
        return 0;
    }
    colld_gpus_t *g = calloc(1, sizeof(*g));
    gpu_t *gpu = calloc((size_t)n, sizeof(*gpu));
    bool *peer = calloc((size_t)n * (size_t)n, sizeof(*peer));
    uint64_t *hostblk_epoch = calloc((size_t)n, sizeof(*hostblk_epoch));
    if (!g || !gpu || !peer || !hostblk_epoch ||
        cuda_hostpool_init(&g->nan_blocks, n, (size_t)n * COLLD_CUDA_MAX_RANKS * sizeof(unsigned long long)) != 0 ||
        cuda_hostpool_init(&g->ho_blocks, n, COLLD_CUDA_HANDOFF_WORDS * sizeof(uint32_t)) != 0) {
        if (g)
            free(g->nan_blocks.free), free(g->ho_blocks.free);
        free(g), free(gpu), free(peer), free(hostblk_epoch);
        colld_strlcpy(d->device_none, "out of memory", sizeof(d->device_none));
        return -1;
    }
    g->b = b;
    g->cu = cu;
    g->gpu = gpu;
    g->peer = peer;
    g->hostblk_epoch = hostblk_epoch;
    pthread_mutex_init(&g->hostblk_mu, NULL);
    for (int i = 0; i < n; i++) {
        if ((r = take_gpu(cu, i, &gpu[i])) != CUDA_SUCCESS) {
            char buf[160];
            snprintf(d->device_none, sizeof(d->device_none), "GPU %d: %s", i,
                     colld_cu_describe(cu, r, buf, sizeof(buf)));
            LOG_ERROR(GPU, "no CUDA backend: %s", d->device_none);
            for (int j = 0; j < i; j++)
                CU_CHECK(cu, cuDevicePrimaryCtxRelease, gpu[j].dev);
            free(g->nan_blocks.free), free(g->ho_blocks.free), free(g->hostblk_epoch), free(g), free(gpu), free(peer);
            return 0;
        }
        g->n = i + 1;
    }
    enable_peers(g);
    /* The kernels, checked against the driver and every GPU now, not at the first collective. */
    CUcontext *ctx = calloc((size_t)n, sizeof(*ctx));
    CUdevice *dev = calloc((size_t)n, sizeof(*dev));
    char why[sizeof(d->device_none)];
    colld_status_t st = COLLD_ERR_NO_MEMORY;
    snprintf(why, sizeof(why), "out of memory");
    for (int i = 0; ctx && dev && i < n; i++) {
        ctx[i] = gpu[i].ctx;
        dev[i] = gpu[i].dev;
    }
    if (ctx && dev)
        st = colld_cuda_kernels_load(cu, ctx, dev, n, &g->kernels, why, sizeof(why));
    free(ctx), free(dev);
    if (st != COLLD_OK) {
        colld_strlcpy(d->device_none, why, sizeof(d->device_none));
        LOG_ERROR(GPU, "no CUDA backend: %s", d->device_none);
        for (int i = 0; i < n; i++)
            CU_CHECK(cu, cuDevicePrimaryCtxRelease, gpu[i].dev);
        free(g->nan_blocks.free), free(g->ho_blocks.free), free(g->hostblk_epoch), free(g), free(gpu), free(peer);
        return 0;
    }
    if (cuda_recover_start(g) != 0) {
        colld_strlcpy(d->device_none, "cannot start the GPU recovery thread", sizeof(d->device_none));
        colld_cuda_kernels_unload(g->kernels);
        for (int i = 0; i < n; i++)
            CU_CHECK(cu, cuDevicePrimaryCtxRelease, gpu[i].dev);
        free(g->nan_blocks.free), free(g->ho_blocks.free), free(g->hostblk_epoch), free(g), free(gpu), free(peer);
        return 0;
    }
    (void)cuda_watch_start(g, cuda_movable); /* without it the engine polls (cuda_outstanding) */
    b->state = g;
    if (cuda_health_start(g) != 0)
        LOG_WARN(GPU, "no GPU health: out of memory");
    b->present = true;
    LOG_INFO(GPU, "CUDA backend: %d GPU(s), driver %d.%d, first: %s", n, cu->driver_version / 1000,
             cu->driver_version % 1000 / 10, gpu[0].name);
    return 0;
}

/* Wait for every GPU's work, release the contexts (after the engine has stopped). */
static void cuda_stop(colld_backend_t *b)
{
    colld_gpus_t *g = gpus_of(b);
    if (!g)
        return;
    cuda_health_stop(g);
    cuda_watch_stop(g);
    cuda_recover_stop(g);
    pthread_mutex_lock(&b->d->lock);
    while (g->assembling) { /* registrations of sessions still open, never finished */
        gpu_pending_t *p = g->assembling;
        g->assembling = p->next;
        p->next = g->dead_pending;
        g->dead_pending = p;
    }
    cuda_release_run(g); /* what was let go since the recovery thread's last round */
    /* A hand-off still waiting for a rank's stream (issue 28) would keep the GPU busy: abandoned. */
    for (colld_coll_t *k = g->running; k; k = k->next)
        cuda_handoff_cancel(k);
    for (colld_coll_t *k = g->launch; k; k = k->next)
        cuda_handoff_cancel(k);
    pthread_mutex_unlock(&b->d->lock);
    for (int i = 0; i < g->n; i++) {
        CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[i].ctx);
        CU_CHECK(g->cu, cuCtxSynchronize);
    }
    cuda_plans_free_all(b); /* what they hold (sessions, registrations) goes before the contexts */
    cuda_hostblk_free_all(g); /* --nan-check's and the hand-offs' blocks */
    CU_CHECK(g->cu, cuCtxSetCurrent, NULL);
    colld_cuda_kernels_unload(g->kernels);
    for (int i = 0; i < g->n; i++)
        CU_CHECK(g->cu, cuDevicePrimaryCtxRelease, g->gpu[i].dev);
    pthread_mutex_destroy(&g->hostblk_mu);
    free(g->hostblk_epoch);
    free(g->gpu);
    free(g->peer);
    free(g);
    b->state = NULL;
}

/* The banner: the GPUs it drives, or why there are none. */
static void cuda_describe(const colld_backend_t *b, char *buf, size_t len)
{
    const colld_gpus_t *g = gpus_of(b);
    if (g)
        snprintf(buf, len, "CUDA backend on %d GPU(s)", g->n);
    else
        snprintf(buf, len, "no CUDA backend: %s", b->d->device_none);
}

/* It runs the stream-ordered collectives, and the stream-ordered sends and receives (a transfer is
 * claimed by its send's descriptor: p2p.c). */
static bool cuda_claims(const colld_backend_t *b, const colld_dcomm_t *c, const colld_wire_sqe_t *sqe)
{
    (void)b, (void)c;
    return sqe->flags & COLLD_SQE_STREAM;
}

/* ============================================================================================
 * Operations
 * ========================================================================================== */

/* Poll the GPU work (lock held): the collectives whose kernels are done finish, the transfers
 * progress, the collectives every rank's stream has reached go to the launch list (in order per
 * communicator) and the others time out, then the plans progress. Returns the work done. */
static int cuda_progress(colld_backend_t *b, uint64_t now, uint64_t *deadline)
{
    colld_gpus_t *g = gpus_of(b);
    if (!g || (!g->outstanding && !g->plans))
        return 0;
    g->rounds++;
    bool broke;
    int work = cuda_coll_fired(b);
    work += cuda_p2p_progress(b, now, deadline); /* stream-ordered sends and receives (cuda_p2p.c) */
    work += cuda_coll_progress(b, now, deadline, &broke);
    if (broke) /* the lists may have changed: look again next round */
        return work;
    work += cuda_plan_progress(b, now, deadline);
    /* Look again soon while GPU work is outstanding: the watcher wakes the engine when something
     * can move, this is only in case it is slow to be scheduled; without it, poll. */
    uint64_t soon = now + (g->watching ? 250000000ull : 1000000ull);
    if ((g->outstanding || g->plans) && soon < *deadline)
        *deadline = soon;
    return work;
}

/* Work that only polling finds done: GPU work outstanding while no watcher thread wakes the
 * engine for it (cuda_watch.c). */
static bool cuda_outstanding(const colld_backend_t *b)
{
    const colld_gpus_t *g = gpus_of(b);
    return g && (g->outstanding > 0 || g->plans) && !g->watching;
}

static bool cuda_run_unlocked(colld_backend_t *b)
{
    bool colls = cuda_launch(b);
    bool xfers = cuda_p2p_launch(b);
    return colls || xfers;
}

static void cuda_after_run(colld_backend_t *b)
{
    cuda_launched(b);
    cuda_p2p_launched(b);
}

/* A GPU registration: of one allocation (cuda_mem.c), or a segment of one across several VMM
 * allocations (cuda_seg.c). */
static colld_status_t cuda_register(colld_backend_t *b, colld_session_t *s, const colld_wire_msg_t *m, int fd,
                                    uint32_t *reg_id, colld_err_t *err)
{
    if (gpus_of(b) && m->type == COLLD_MSG_REG_CUDA_SEG)
        return cuda_seg_register(b, s, m, fd, reg_id, err);
    return cuda_mem_register(b, s, m, fd, reg_id, err);
}

/* The session's last reference went (lock held): a registration it was assembling, its flag area. */
static void cuda_session_gone(colld_backend_t *b, colld_session_t *s)
{
    colld_gpus_t *g = gpus_of(b);
    if (g)
        cuda_seg_session_gone(g, s);
    cuda_session_free(b, s);
}

/* A session holding GPU memory on a drained GPU (cuda_health.c) joins no new communicator (lock
 * held). */
static const char *cuda_join_refused(colld_backend_t *b, const colld_session_t *s, char *why, size_t len)
{
    colld_gpus_t *g = gpus_of(b);
    if (!g)
        return NULL;
    for (const colld_reg_t *r = s->regs; r; r = r->next)
        if (r->device && r->backend == b && cuda_gpu_drained(g, cuda_reg_gpu(r), why, len))
            return why;
    return NULL;
}

/* ============================================================================================
 * Hooks (given the daemon: they find the backend)
 * ========================================================================================== */

/* The communicator broke (lock held): its plans' replays are released from now on, its transfers
 * and collectives not launched fail, its ranks' streams are released. */
static void cuda_comm_broken(colld_daemon_t *d, colld_dcomm_t *c)
{
    colld_backend_t *b = colld_backend_find(d, &colld_cuda_backend);
    if (!b || !gpu_comm_of(b, c))
        return; /* it never had a stream-ordered collective */
    cuda_plan_comm_broken(b, c);
    /* The collectives and transfers failed below may hold the last references. */
    c->refs++;
    cuda_p2p_comm_broken(b, c);
    cuda_coll_comm_broken(b, c);
    colld_comm_unref(d, c);
}

/* The communicator is freed: no collective of it is in flight any more (each held a reference). */
static void cuda_comm_gone(colld_daemon_t *d, colld_dcomm_t *c)
{
    colld_backend_t *b = colld_backend_find(d, &colld_cuda_backend);
    if (b)
        cuda_comm_freed(b, c);
}

/* COLLD_MSG_PLAN_FREE (cuda_plan.c). */
static int cuda_session_msg(colld_session_t *s, const colld_wire_msg_t *m)
{
    return cuda_plan_session_msg(colld_backend_find(s->daemon, &colld_cuda_backend), s, m);
}

static const colld_comm_hooks_t cuda_hooks = {
    .name = "cuda",
    .broken = cuda_comm_broken,
    .freed = cuda_comm_gone,
    .session_msg = cuda_session_msg,
};

const colld_backend_ops_t colld_cuda_backend = {
    .name = "cuda",
    .start = cuda_start,
    .stop = cuda_stop,
    .describe = cuda_describe,
    .claims = cuda_claims,
    .admit = cuda_admit,
    .submit = cuda_submit,
    .xfer_submit = cuda_xfer_submit,
    .progress = cuda_progress,
    .outstanding = cuda_outstanding,
    .poll_spin_ns = GPU_SPIN_NS,
    .run_unlocked = cuda_run_unlocked,
    .after_run = cuda_after_run,
    .comm_busy = cuda_comm_busy,
    .stream_failed = cuda_stream_failed,
    .waiting = cuda_waiting,
    .xfer_waits = cuda_p2p_waits,
    .mem_register = cuda_register,
    .mem_release = cuda_mem_release,
    .sync_area = cuda_sync_area,
    .session_free = cuda_session_gone,
    .join_refused = cuda_join_refused,
    .hooks = &cuda_hooks,
};
