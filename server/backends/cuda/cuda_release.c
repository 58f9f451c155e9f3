/*
 * cuda_release.c - the CUDA backend's driver calls that unpin or unmap memory, made outside the
 * daemon's lock (issue 15 F4).
 *
 * cuIpcCloseMemHandle, cuMemUnmap and cuMemHostUnregister take hundreds of microseconds on
 * hardware (they synchronize, and change page tables), and they were made under daemon->lock: a
 * registration's last reference goes under it (a deregistration, a collective completing, a
 * session ending), and so does a session's flag area. Meanwhile every other tenant's work waited
 * for the lock (the engine, host collectives, the control plane). Now such a release only queues
 * what it lets go (the registration's backend part, the flag area: neither is reachable from
 * anything else any more) and wakes the recovery thread, which makes the driver calls with the
 * lock dropped. Registering happens without the lock too, on the loop thread (cuda_mem.c:
 * cuIpcOpenMemHandle and cuMemMap always did; a new flag area's cuMemHostRegister does now, and so
 * does registering the flag areas again after a reset, on the recovery thread).
 *
 * Why the recovery thread: its reset of a GPU must not cross a close of a mapping in that GPU's
 * context. Being the same thread, a close never runs during a reset; a legacy IPC mapping of GPU
 * i still queued when i is reset is closed by the reset itself (cuda_recover.c take_drops), and a
 * flag area registered in i's context is marked unregistered (the reset dropped it). VMM
 * mappings are no context's and survive a reset.
 *
 * Bounded: each entry was a registration or a session, whose counts are bounded per tenant; the
 * entries are the freed objects themselves, so queuing needs no memory and cannot fail.
 *
 * The closes and frees themselves are here too, for whoever makes them with the lock dropped (a
 * registration that could not be published, an assembly given up): cuda_mem_close, cuda_reg_free,
 * cuda_seg_free.
 */
#include "server/backends/cuda/cuda.h"

#include "common/log.h"
#include "common/util.h"
#include "transport/cuda_ipc/cuda_ipc.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

void cuda_mem_close(const colld_gpus_t *g, const gpu_reg_t *gr)
{
    CU_CHECK(g->cu, cuCtxPushCurrent, g->gpu[gr->gpu].ctx);
    if (gr->nseg > 1)
        colld_cuda_ipc_close_segments(g->cu, gr->p, gr->seg, gr->nseg);
    else
        colld_cuda_ipc_close(g->cu, gr->how, gr->p, gr->size);
    CU_CHECK(g->cu, cuCtxPopCurrent, NULL);
}

void cuda_reg_free(gpu_reg_t *gr)
{
    if (gr)
        free(gr->seg);
    free(gr);
}

void cuda_seg_free(const colld_gpus_t *g, gpu_pending_t *p)
{
    if (!p)
        return;
    if (p->got) {
        CU_CHECK(g->cu, cuCtxPushCurrent, g->gpu[p->gpu].ctx);
        for (unsigned i = 0; i < p->got; i++)
            CU_CHECK(g->cu, cuMemRelease, p->h[i]);
        CU_CHECK(g->cu, cuCtxPopCurrent, NULL);
    }
    free(p->sizes);
    free(p->h);
    free(p);
}

void cuda_release_reg(colld_gpus_t *g, gpu_reg_t *gr)
{
    gr->reg = NULL;
    gr->prev = NULL;
    gr->next = g->dead_regs;
    g->dead_regs = gr;
    pthread_cond_broadcast(&g->recover_cv);
}

void cuda_release_session(colld_gpus_t *g, gpu_session_t *gs)
{
    gs->prev = NULL;
    gs->next = g->dead_sessions;
    g->dead_sessions = gs;
    pthread_cond_broadcast(&g->recover_cv);
}

bool cuda_release_pending(const colld_gpus_t *g)
{
    return g->dead_regs || g->dead_sessions || g->dead_pending;
}

/* Unregister a flag area from the context it was registered in, unmap it, free it. */
static void release_flags(const colld_gpus_t *g, gpu_session_t *gs)
{
    if (gs->registered) {
        CU_CHECK(g->cu, cuCtxPushCurrent, g->gpu[gs->reg_gpu].ctx);
        CU_CHECK(g->cu, cuMemHostUnregister, gs->flags);
        CU_CHECK(g->cu, cuCtxPopCurrent, NULL);
    }
    (void)SYS_CHECK(GPU, munmap(gs->flags, gs->size));
    close(gs->fd);
    free(gs->plan_line); /* its plans held a reference on the session: none is left */
    free(gs);
}

/* The queued objects are reachable from nothing but the queue, and only this thread (the recovery
 * thread, which also makes the resets) writes their fields once queued (take_drops, recover_gpu):
 * they are read here with the lock dropped. */
void cuda_release_run(colld_gpus_t *g)
{
    colld_daemon_t *d = g->b->d;
    while (cuda_release_pending(g)) {
        gpu_reg_t *regs = g->dead_regs;
        gpu_session_t *sessions = g->dead_sessions;
        gpu_pending_t *pending = g->dead_pending;
        g->dead_regs = NULL;
        g->dead_sessions = NULL;
        g->dead_pending = NULL;
        pthread_mutex_unlock(&d->lock);
        for (gpu_pending_t *p = pending, *next; p; p = next) {
            next = p->next;
            cuda_seg_free(g, p); /* imported allocations of an assembly its session left */
        }
        unsigned nregs = 0, nsessions = 0;
        for (gpu_reg_t *gr = regs, *next; gr; gr = next, nregs++) {
            next = gr->next;
            if (!gr->lost) /* else its mapping went with its GPU's reset */
                cuda_mem_close(g, gr);
            cuda_reg_free(gr);
        }
        for (gpu_session_t *gs = sessions, *next; gs; gs = next, nsessions++) {
            next = gs->next;
            release_flags(g, gs);
        }
        LOG_DEBUG(GPU, "released %u GPU mapping(s) and %u flag area(s) outside the daemon's lock", nregs, nsessions);
        pthread_mutex_lock(&d->lock);
    }
}
