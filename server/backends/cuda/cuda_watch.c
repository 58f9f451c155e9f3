/*
 * cuda_watch.c - the CUDA backend's watcher (issue 15 F5): while stream-ordered collectives are
 * outstanding, a thread of its own looks every WATCH_PERIOD_NS whether one of them can move (every
 * rank's stream wrote its `ready` slot, or a launched collective's event fired: the `movable`
 * function cuda.c hands it) and wakes the engine when one can. cuda_watch_kick (cuda_base.c) wakes
 * it when GPU work becomes outstanding.
 *
 * Without it the engine itself polled the GPUs: it busy-waited 2 ms after its last progress, then
 * slept 1-2 ms between looks (its sleep has millisecond granularity), so when the host ran ahead
 * of the GPU (every training step: the collective is posted long before its inputs are produced)
 * each collective started up to 2 ms after its streams got there. Now the engine sleeps until it
 * is woken, and the watcher's look costs a few loads of the flag areas and one cuEventQuery per
 * communicator with a launched collective, under the daemon's lock, 50 000 times a second at most
 * while GPU work is outstanding; none while there is none (it waits on a condition variable).
 *
 * While hand-offs without the host (issue 28) are on the GPU it busy-polls, bounded (WATCH_SPIN_NS).
 *
 * While persistent plans (collectives captured into CUDA graphs, cuda_plan.c) exist it looks too,
 * since a graph may be replayed at any time: a plan's ready flags are read like a collective's.
 *
 * The look happens under the daemon's lock because what it reads (the flag areas, the events,
 * the pending and running lists) lives and dies under it. The engine keeps a 250 ms look of its
 * own (cuda_progress) in case the watcher is slow to be scheduled, and falls back to polling
 * every millisecond if the thread cannot be started.
 */
#include "server/backends/cuda/cuda.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

/* How often the watcher looks while GPU work is outstanding, and the timer slack it asks for (the
 * default 50 us slack would stretch each sleep to about 70 us). */
#define WATCH_PERIOD_NS 20000L
#define WATCH_SLACK_NS 2000L
/* While hand-offs without the host (issue 28, cuda_handoff.c) are on the GPU, the watcher
 * busy-polls (sched_yield between looks) for up to this long after each change it sees (a hand-off
 * launched or finished, an engine woken), then goes back to its period: bounded, so that a
 * collective whose ranks' streams are far behind costs no CPU beyond it. 200 us: several times a
 * small collective's time on a GPU once its ranks are there (to be measured: docs/performance.md). */
#define WATCH_SPIN_NS 200000ull

static void *watch_main(void *arg)
{
    colld_gpus_t *g = arg;
    colld_daemon_t *d = g->b->d;
    (void)SYS_CHECK(GPU, prctl(PR_SET_TIMERSLACK, WATCH_SLACK_NS, 0, 0, 0));
    uint64_t woke_round = 0, spin_until = 0;
    unsigned seen_handoffs = 0;
    bool woke = false;
    pthread_mutex_lock(&d->lock);
    while (!g->watch_stop) {
        if (!g->outstanding && !g->plans) { /* a plan (cuda_plan.c) may be replayed at any time */
            woke = false;
            pthread_cond_wait(&g->watch_cv, &d->lock);
            continue;
        }
        /* Wake the engine once per state it can act on: a collective that stays movable until
         * the engine's next round must not make the watcher write the eventfd 50 000 times. */
        if ((!woke || g->rounds != woke_round) && g->movable(g->b)) {
            woke = true;
            woke_round = g->rounds;
            g->watch_wakes++;
            /* Under the lock: the engine's eventfd is closed once the engine has stopped, which
             * it says under the lock (colld_engine_stop). */
            if (d->engine_running)
                colld_engine_wake(d);
            spin_until = colld_now_ns() + WATCH_SPIN_NS;
        }
        if (g->handoffs != seen_handoffs) {
            seen_handoffs = g->handoffs;
            spin_until = colld_now_ns() + WATCH_SPIN_NS;
        }
        bool spin = g->handoffs && colld_now_ns() < spin_until;
        pthread_mutex_unlock(&d->lock);
        if (spin) {
            sched_yield();
        } else {
            struct timespec ts = { .tv_sec = 0, .tv_nsec = WATCH_PERIOD_NS };
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&d->lock);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

int cuda_watch_start(colld_gpus_t *g, bool (*movable)(colld_backend_t *b))
{
    g->movable = movable;
    int rc = pthread_cond_init(&g->watch_cv, NULL);
    if (rc == 0 && (rc = pthread_create(&g->watch_thread, NULL, watch_main, g)) != 0)
        pthread_cond_destroy(&g->watch_cv);
    if (rc != 0) {
        LOG_WARN(GPU, "cannot start the GPU watcher thread (%s): the engine polls the GPUs every millisecond instead",
                 strerror(rc));
        return -1;
    }
    pthread_setname_np(g->watch_thread, "colld-gpuwatch");
    g->watching = true;
    return 0;
}

void cuda_watch_stop(colld_gpus_t *g)
{
    if (!g->watching)
        return;
    pthread_mutex_lock(&g->b->d->lock);
    g->watch_stop = true;
    pthread_cond_broadcast(&g->watch_cv);
    pthread_mutex_unlock(&g->b->d->lock);
    pthread_join(g->watch_thread, NULL);
    pthread_cond_destroy(&g->watch_cv);
    g->watching = false;
}
