/*
 * cuda_recover.c - a GPU whose context in the daemon has a sticky error is recovered instead of
 * poisoning every communicator of every tenant on it until colld restarts (issue 15 F3).
 *
 * A sticky error (an illegal address, a failed launch, an uncorrectable ECC error, ...) leaves the
 * daemon's primary context of that GPU unusable: every later call in it fails with the same error,
 * the registration of a new client's flag area included. The backend's recovery thread brings the
 * GPU back while the other GPUs and all host work go on:
 *
 *   detect   a driver call of the daemon returns a sticky error (cuda_sticky) in GPU i's context:
 *            cuda_gpu_fault records the first one and wakes the recovery thread (both cuda_base.c)
 *   fail     GPU i is marked GPU_FAULTED: registrations on it are refused (COLLD_ERR_DEVICE, "being
 *            reset: try again"); its matched collectives fail with COLLD_ERR_DEVICE naming the GPU
 *            and the CUDA error (cuda_coll.c; their communicators break and release every rank's
 *            stream); those launched on it fail when their event reports the error
 *   quiesce  the reset waits until nothing the daemon launched that uses GPU i is in flight and no
 *            registration is being opened on it; when GPU i is the home GPU (the sessions' flag
 *            areas are registered in its context, which the reset drops) no GPU launches meanwhile
 *            (g->hold): their streams would write `done` into an unregistered area
 *   drop     in GPU i's context, in this order: the communicators' streams, the legacy IPC
 *            mappings (those registrations are marked lost: a collective that uses one fails with a
 *            message to register the buffer again); VMM mappings and the kernels' library are not
 *            a context's and stay; the launches' events went with their collectives
 *   reset    cuDevicePrimaryCtxReset, the primary context retained again (its handle may change),
 *            the kernels made ready in it (colld_cuda_kernels_attach), peer access enabled again,
 *            a probe (a stream created and destroyed); the flag areas registered again
 *   back     GPU_OK: new communicators, registrations and collectives on it work
 *
 * Bounded: a fault within GPU_RESET_WINDOW_NS of the GPU's last reset is a strike, as is a reset
 * or probe that fails (retried after a back-off of a second per strike); after GPU_MAX_STRIKES
 * strikes in a row the GPU is given up (GPU_FAILED; a fault gets a last reset first, which frees
 * what its context held): every request for it fails with COLLD_ERR_DEVICE saying to restart
 * colld once the GPU is healthy; the flag areas move to another GPU if it held them. NVIDIA documents several
 * sticky errors as needing a new process; where a reset does not clear one, this is how it ends.
 * The quiesce waits at most GPU_QUIESCE_NS (a kernel that never ends), then resets anyway.
 *
 * Locking: the state (gpu_t.state, .opening, the lists) is under the daemon's lock; the driver
 * calls of a reset (and of the flag areas' registrations after it) are made with it dropped, so
 * the engine (host collectives, other GPUs) never waits for a reset. The same thread closes the
 * mappings and flag areas let go (cuda_release.c), so a close never crosses a reset. gpu_t.fault
 * is atomic: any thread records a fault in any lock state.
 */
#include "server/backends/cuda/cuda.h"

#include "common/log.h"
#include "common/util.h"
#include "transport/cuda_ipc/cuda_ipc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GPU_MAX_STRIKES 3
#define GPU_RESET_WINDOW_NS (60ull * 1000000000ull)
#define GPU_QUIESCE_NS (10ull * 1000000000ull)

/* ============================================================================================
 * What a reset drops
 * ========================================================================================== */

/* Register again, in the home GPU's context, every flag area a reset (or a new home GPU) left
 * unregistered (lock held; dropped while the driver pins them, issue 15 F4). The areas are the
 * sessions' at the time of the call: one freed meanwhile is queued for release, which only this
 * thread does (after this), and unregisters it. */
static void flags_register_all(colld_gpus_t *g)
{
    colld_daemon_t *d = g->b->d;
    size_t n = 0;
    for (gpu_session_t *gs = g->sessions; gs; gs = gs->next)
        n += !gs->registered;
    if (!n)
        return;
    gpu_session_t **todo = calloc(n, sizeof(*todo));
    uint64_t *dptr = calloc(n, sizeof(*dptr));
    CUresult *res = calloc(n, sizeof(*res));
    if (!todo || !dptr || !res) {
        free(todo), free(dptr), free(res);
        LOG_ERROR(GPU,
                  "out of memory: %zu GPU flag area(s) not registered again; their clients' GPU collectives fail "
                  "until they reconnect",
                  n);
        return;
    }
    size_t k = 0;
    for (gpu_session_t *gs = g->sessions; gs && k < n; gs = gs->next)
        if (!gs->registered)
            todo[k++] = gs;
    int home = g->home;
    pthread_mutex_unlock(&d->lock);
    for (size_t i = 0; i < k; i++)
        res[i] = cuda_flags_register(g, home, todo[i]->flags, todo[i]->size, &dptr[i]); /* immutable fields */
    pthread_mutex_lock(&d->lock);
    int failed = 0;
    CUresult last = CUDA_SUCCESS;
    for (size_t i = 0; i < k; i++) {
        if (res[i] != CUDA_SUCCESS) {
            failed++;
            last = res[i];
            continue;
        }
        todo[i]->registered = true;
        todo[i]->reg_gpu = home;
        todo[i]->dptr = dptr[i];
    }
    free(todo), free(dptr), free(res);
    if (failed) {
        char buf[160];
        LOG_ERROR(GPU,
                  "%d GPU flag area(s) could not be registered again on GPU %d: %s; their clients' GPU "
                  "collectives fail until they reconnect",
                  failed, home, colld_cu_describe(g->cu, last, buf, sizeof(buf)));
    }
}

/* What the reset of one GPU drops, taken from the lists under the lock. */
typedef struct {
    CUstream *streams;
    size_t nstreams;
    struct {
        int how;
        CUdeviceptr p;
        size_t size;
    } * maps;
    size_t nmaps;
} drop_t;

/* Take GPU gi's streams and legacy IPC mappings off the communicators and registrations (lock
 * held): the registrations are lost from now on, the streams are the reset's to destroy. Returns
 * false without memory (nothing taken). */
static bool take_drops(colld_gpus_t *g, int gi, drop_t *dr)
{
    size_t ns = 0, nm = 0;
    for (gpu_comm_t *gc = g->comms; gc; gc = gc->next)
        ns += gc->stream[gi] != NULL;
    for (gpu_reg_t *gr = g->regs; gr; gr = gr->next)
        nm += gr->gpu == gi && !gr->lost && gr->how == COLLD_CUDA_EXPORT_IPC;
    for (gpu_reg_t *gr = g->dead_regs; gr; gr = gr->next) /* queued for release (cuda_release.c) */
        nm += gr->gpu == gi && !gr->lost && gr->how == COLLD_CUDA_EXPORT_IPC;
    dr->streams = calloc(ns + 1, sizeof(*dr->streams));
    dr->maps = calloc(nm + 1, sizeof(*dr->maps));
    if (!dr->streams || !dr->maps) {
        free(dr->streams), free(dr->maps);
        return false;
    }
    dr->nstreams = dr->nmaps = 0;
    for (gpu_comm_t *gc = g->comms; gc; gc = gc->next)
        if (gc->stream[gi]) {
            dr->streams[dr->nstreams++] = gc->stream[gi];
            gc->stream[gi] = NULL; /* created again at the communicator's next launch on gi */
        }
    for (int dead = 0; dead < 2; dead++)
        for (gpu_reg_t *gr = dead ? g->dead_regs : g->regs; gr; gr = gr->next)
            if (gr->gpu == gi && !gr->lost && gr->how == COLLD_CUDA_EXPORT_IPC) {
                gr->lost = true; /* a queued one is then only freed */
                dr->maps[dr->nmaps].how = gr->how;
                dr->maps[dr->nmaps].p = gr->p;
                dr->maps[dr->nmaps].size = gr->size;
                dr->nmaps++;
            }
    return true;
}

/* ============================================================================================
 * The reset (lock NOT held)
 * ========================================================================================== */

/* Peer access between gi and every GPU it had it with, again (the reset disabled it both ways;
 * g->peer, the topology, does not change). */
static void peers_again(colld_gpus_t *g, int gi, CUcontext ctx)
{
    const colld_cu_t *cu = g->cu;
    for (int j = 0; j < g->n; j++) {
        if (j == gi)
            continue;
        for (int dir = 0; dir < 2; dir++) {
            int from = dir ? j : gi, to = dir ? gi : j;
            if (!g->peer[from * g->n + to])
                continue;
            CU_CHECK(cu, cuCtxPushCurrent, dir ? g->gpu[j].ctx : ctx);
            CU_CHECK_EXPECT(cu, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, cuCtxEnablePeerAccess,
                            dir ? ctx : g->gpu[j].ctx, 0);
            CU_CHECK(cu, cuCtxPopCurrent, NULL);
        }
    }
}

/* Drop what the context held, reset it, retain it again, make the kernels ready in it, enable
 * peer access and probe it. Returns CUDA_SUCCESS with the new context in *ctx, or the error with
 * what failed in why. */
static CUresult reset_gpu(colld_gpus_t *g, int gi, const drop_t *dr, CUcontext *ctx, char *why, size_t len)
{
    const colld_cu_t *cu = g->cu;
    const gpu_t *gpu = &g->gpu[gi];
    char buf[160];
    CUresult r;
    /* In the failed context: what it held. Each may fail with the sticky error (logged): the
     * reset below drops it anyway. */
    CU_CHECK(cu, cuCtxPushCurrent, gpu->ctx);
    for (size_t i = 0; i < dr->nstreams; i++)
        CU_CHECK(cu, cuStreamDestroy, dr->streams[i]);
    for (size_t i = 0; i < dr->nmaps; i++)
        colld_cuda_ipc_close(cu, dr->maps[i].how, dr->maps[i].p, dr->maps[i].size);
    CU_CHECK(cu, cuCtxPopCurrent, NULL);
    if ((r = CU_CHECK(cu, cuDevicePrimaryCtxReset, gpu->dev)) != CUDA_SUCCESS) {
        snprintf(why, len, "cuDevicePrimaryCtxReset failed: %s", colld_cu_describe(cu, r, buf, sizeof(buf)));
        return r;
    }
    /* The daemon's retain survives the reset; retaining again gives the context's handle now. */
    if ((r = CU_CHECK(cu, cuDevicePrimaryCtxRetain, ctx, gpu->dev)) != CUDA_SUCCESS) {
        snprintf(why, len, "cuDevicePrimaryCtxRetain after the reset failed: %s",
                 colld_cu_describe(cu, r, buf, sizeof(buf)));
        return r;
    }
    CU_CHECK(cu, cuDevicePrimaryCtxRelease, gpu->dev);
    if (colld_cuda_kernels_attach(g->kernels, *ctx, gi, why, len) != COLLD_OK)
        return CUDA_ERROR_UNKNOWN;
    peers_again(g, gi, *ctx);
    CUstream probe = NULL;
    CU_CHECK(cu, cuCtxPushCurrent, *ctx);
    r = CU_CHECK(cu, cuStreamCreate, &probe, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS)
        r = CU_CHECK(cu, cuStreamQuery, probe);
    if (probe)
        CU_CHECK(cu, cuStreamDestroy, probe);
    CU_CHECK(cu, cuCtxPopCurrent, NULL);
    if (r != CUDA_SUCCESS)
        snprintf(why, len, "the reset context fails at once: %s", colld_cu_describe(cu, r, buf, sizeof(buf)));
    return r;
}

/* ============================================================================================
 * The recovery thread
 * ========================================================================================== */

/* Wait on the recovery condition for at most ms (lock held). */
static void recover_wait(colld_gpus_t *g, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    int rc = pthread_cond_timedwait(&g->recover_cv, &g->b->d->lock, &ts);
    (void)rc; /* ETIMEDOUT or woken: the caller looks again either way */
}

/* Does anything the daemon launched still use GPU gi (any GPU, with the hold), or is a
 * registration being opened on it? (lock held) */
static bool gpu_busy(const colld_gpus_t *g, int gi)
{
    if (g->launch || g->gpu[gi].opening || cuda_p2p_busy(g, gi, g->hold))
        return true;
    for (const colld_coll_t *k = g->running; k; k = k->next) {
        bool used[64] = { false };
        cuda_coll_gpus(k, used, g->n < 64 ? g->n : 64);
        if (g->hold || (gi < 64 && used[gi]))
            return true;
    }
    return false;
}

/* A GPU given up: its work fails from now on; if it held the flag areas, another GPU does (lock
 * held). */
static void give_up(colld_gpus_t *g, int gi, const char *what)
{
    gpu_t *gpu = &g->gpu[gi];
    char text[sizeof(gpu->why)];
    snprintf(text, sizeof(text), "%s", what);
    snprintf(gpu->why, sizeof(gpu->why), "%.*s after %u reset(s)", (int)sizeof(gpu->why) - 32, text, gpu->resets);
    gpu->state = GPU_FAILED;
    LOG_ERROR(GPU,
              "GPU %d (%s) given up: %s; its collectives and registrations fail with COLLD_ERR_DEVICE until "
              "colld is restarted (check the GPU first: nvidia-smi, the kernel log for Xid errors)",
              gi, gpu->name, gpu->why);
    if (gi == g->home) {
        /* The flag areas' registrations went with its reset (or, when the reset failed, stay in its
         * context: registering them again then fails, and is logged). */
        for (int j = 0; j < g->n; j++)
            if (g->gpu[j].state == GPU_OK) {
                g->home = j;
                for (gpu_session_t *gs = g->sessions; gs; gs = gs->next)
                    gs->registered = false;
                flags_register_all(g);
                LOG_WARN(GPU, "the GPU flag areas are registered on GPU %d now", j);
                break;
            }
    }
    g->hold = false;
    colld_engine_wake(g->b->d);
}

/* Recover GPU gi, whose fault was seen (lock held; dropped during the reset). */
static void recover_gpu(colld_gpus_t *g, int gi)
{
    colld_daemon_t *d = g->b->d;
    gpu_t *gpu = &g->gpu[gi];
    char buf[160], why[sizeof(gpu->why)];
    uint64_t now = colld_now_ns();
    CUresult fault = (CUresult)__atomic_load_n(&gpu->fault, __ATOMIC_ACQUIRE);
    if (gpu->state == GPU_OK) {
        gpu->strikes = gpu->reset_ns && now - gpu->reset_ns < GPU_RESET_WINDOW_NS ? gpu->strikes + 1 : 1;
        snprintf(gpu->why, sizeof(gpu->why), "%s", colld_cu_describe(g->cu, fault, buf, sizeof(buf)));
        gpu->state = GPU_FAULTED;
        LOG_ERROR(GPU,
                  "GPU %d (%s): %s in the daemon's context: failing its collectives with COLLD_ERR_DEVICE and "
                  "resetting it (fault %u in a row, at most %d%s)",
                  gi, gpu->name, gpu->why, gpu->strikes, GPU_MAX_STRIKES,
                  gpu->strikes > GPU_MAX_STRIKES ? ": a last reset frees what it holds, then it is given up" : "");
    }
    /* Fail its matched work (the engine does, cuda_coll.c) and stop launches where the reset
     * drops the flag areas' registration. */
    g->hold = gi == g->home;
    colld_engine_wake(d);
    uint64_t until = now + GPU_QUIESCE_NS;
    while (!g->recover_stop && gpu_busy(g, gi) && colld_now_ns() < until)
        recover_wait(g, 20);
    if (g->recover_stop)
        return;
    if (gpu_busy(g, gi))
        LOG_WARN(GPU, "GPU %d: work still in flight after %llu s; resetting it anyway", gi,
                 (unsigned long long)(GPU_QUIESCE_NS / 1000000000ull));
    drop_t dr;
    if (!take_drops(g, gi, &dr)) {
        recover_wait(g, 1000); /* out of memory: try again */
        return;
    }
    for (int dead = 0; dead < 2; dead++) /* the reset drops the flag areas registered in its context */
        for (gpu_session_t *gs = dead ? g->dead_sessions : g->sessions; gs; gs = gs->next)
            if (gs->registered && gs->reg_gpu == gi)
                gs->registered = false;
    cuda_hostblk_gpu_reset(g, gi); /* --nan-check's and the hand-offs' blocks registered in it go too */
    gpu->state = GPU_RESETTING;
    pthread_mutex_unlock(&d->lock);
    CUcontext ctx = NULL;
    CUresult r = reset_gpu(g, gi, &dr, &ctx, why, sizeof(why));
    free(dr.streams), free(dr.maps);
    pthread_mutex_lock(&d->lock);
    if (ctx)
        __atomic_store_n(&gpu->ctx, ctx, __ATOMIC_RELAXED); /* cuda_gpu_fault reads it without the lock */
    gpu->resets++;
    gpu->reset_ns = colld_now_ns();
    if (r == CUDA_SUCCESS && gpu->strikes > GPU_MAX_STRIKES) {
        /* Too many faults in a row: its context is clean now (nothing of it holds the flag areas
         * or the registrations any more), and it takes no more work. */
        snprintf(why, sizeof(why), "%.*s again within %llu s of its reset", (int)sizeof(why) - 48, gpu->why,
                 (unsigned long long)(GPU_RESET_WINDOW_NS / 1000000000ull));
        give_up(g, gi, why);
        return;
    }
    if (r == CUDA_SUCCESS) {
        __atomic_store_n(&gpu->fault, 0, __ATOMIC_RELEASE);
        if (gi == g->home)
            flags_register_all(g);
        gpu->state = GPU_OK;
        g->hold = false;
        LOG_WARN(GPU,
                 "GPU %d (%s) recovered: its context was reset after %s (reset %u since start); new "
                 "communicators on it work",
                 gi, gpu->name, gpu->why, gpu->resets);
        colld_engine_wake(d);
        return;
    }
    LOG_ERROR(GPU, "GPU %d (%s): the reset failed: %s", gi, gpu->name, why);
    if (++gpu->strikes > GPU_MAX_STRIKES) {
        give_up(g, gi, why);
        return;
    }
    gpu->state = GPU_FAULTED; /* again, after a back-off */
    for (unsigned i = 0; i < gpu->strikes && !g->recover_stop; i++)
        recover_wait(g, 1000);
}

static void *recover_main(void *arg)
{
    colld_gpus_t *g = arg;
    colld_daemon_t *d = g->b->d;
    pthread_mutex_lock(&d->lock);
    while (!g->recover_stop) {
        if (cuda_release_pending(g)) {
            cuda_release_run(g); /* mappings and flag areas let go (cuda_release.c) */
            continue;
        }
        int gi = -1;
        for (int i = 0; i < g->n && gi < 0; i++)
            if (g->gpu[i].state == GPU_FAULTED ||
                (g->gpu[i].state == GPU_OK && __atomic_load_n(&g->gpu[i].fault, __ATOMIC_ACQUIRE)))
                gi = i;
        if (gi >= 0)
            recover_gpu(g, gi);
        else
            recover_wait(g, 1000);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

int cuda_recover_start(colld_gpus_t *g)
{
    int rc = pthread_cond_init(&g->recover_cv, NULL);
    if (rc == 0 && (rc = pthread_create(&g->recover_thread, NULL, recover_main, g)) != 0)
        pthread_cond_destroy(&g->recover_cv);
    if (rc != 0) {
        LOG_ERROR(GPU, "cannot start the GPU recovery thread: %s", strerror(rc));
        return -1;
    }
    g->recover_started = true;
    return 0;
}

void cuda_recover_stop(colld_gpus_t *g)
{
    if (!g->recover_started)
        return;
    pthread_mutex_lock(&g->b->d->lock);
    g->recover_stop = true;
    pthread_cond_broadcast(&g->recover_cv);
    pthread_mutex_unlock(&g->b->d->lock);
    pthread_join(g->recover_thread, NULL);
    pthread_cond_destroy(&g->recover_cv);
    g->recover_started = false;
}
