/*
 * engine.c - the progress engine: one thread that drains every session's submission ring, has
 * each descriptor admitted (admit.c), matches the ranks of each communicator by sequence number
 * (match.c), hands each matched collective to the backend that claims it (backend.h) and lets the
 * backends progress and run what they hold; completions are written back by completion.c.
 *
 * One round, under the daemon lock except where a backend runs a collective: drain, join
 * time-outs, the backends' progress, then per ready communicator its point-to-point operations
 * (p2p.c), the modules' judgement (the fast area), the backends' ordering, matching, and the
 * time-out of the collective it waits for.
 *
 * Idle policy: after the last piece of work the thread busy-polls for spin_us (longer while a
 * backend has work that only polling finds done), then sets need_wakeup in every session's ring
 * and sleeps in epoll on the sessions' eventfds (and its own wake eventfd), with a timeout at the
 * next collective/join deadline. An idle daemon therefore uses no CPU, and a client posting to an
 * awake daemon makes no system call.
 */
#include "server/core/daemon.h"

#include "common/log.h"
#include "common/util.h"
#include "server/core/counters.h"
#include "transport/shm/ring.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* ============================================================================================
 * Draining the submission rings
 * ========================================================================================== */

/* A session whose client leaves its completions unread while more descriptors wait cannot make
 * progress: the engine must not spin on it. It sets cq.need_wakeup, and the client, having read
 * completions (advanced cq.tail), writes the session eventfd when it sees the flag; until then the
 * session does not count as pending work (session_pending). */
static void cq_wait_set(colld_session_t *s)
{
    if (s->cq_wait)
        return;
    s->cq_wait = true;
    COLLD_STORE_SC(&s->shm->cq.need_wakeup, 1);
}

/* The client freed completion space (or the engine looks again anyway): clear the flag. */
static void cq_wait_clear(colld_session_t *s)
{
    if (!s->cq_wait)
        return;
    s->cq_wait = false;
    COLLD_STORE_SC(&s->shm->cq.need_wakeup, 0);
}

/* True when the engine can take a descriptor of the session now: one is waiting and a completion
 * slot is free for it (lock held). Re-read after need_wakeup is published, so a client that freed
 * completion space just before seeing the flag is not missed. */
static bool session_pending(colld_session_t *s)
{
    if (!s->shm || s->dead || s->kill_requested)
        return false;
    int64_t avail = colld_ring_avail(&s->shm->sq, s->sq_tail, s->entries);
    int64_t space = colld_ring_space(&s->shm->cq, s->cq_head, s->entries);
    return avail != 0 && (avail < 0 || space < 0 || (int64_t)s->in_flight < space);
}

/* Drain one session's submission ring as far as its completion ring has room. Returns the number
 * of descriptors taken. */
static int drain_session(colld_daemon_t *d, colld_session_t *s)
{
    if (s->dead || s->kill_requested || !s->shm)
        return 0;
    int64_t avail = colld_ring_avail(&s->shm->sq, s->sq_tail, s->entries);
    int64_t space = colld_ring_space(&s->shm->cq, s->cq_head, s->entries);
    if (avail < 0 || space < 0) {
        colld_session_kill(s, "corrupt ring counters");
        return 0;
    }
    /* Take a descriptor only with a completion slot reserved for it. `space` is read again each
     * time: descriptors that fail at admission post their completion at once. */
    int taken = 0;
    cq_wait_clear(s);
    while (avail > 0 && (int64_t)s->in_flight < space) {
        colld_wire_sqe_t sqe;
        memcpy(&sqe, &s->sqes[s->sq_tail & (s->entries - 1)], sizeof(sqe)); /* copy, then validate */
        s->sq_tail++;
        avail--;
        s->in_flight++;
        taken++;
        colld_admit(d, s, &sqe);
        if (s->dead || s->kill_requested)
            break;
        space = colld_ring_space(&s->shm->cq, s->cq_head, s->entries);
    }
    if (taken)
        COLLD_STORE_REL(&s->shm->sq.tail, s->sq_tail);
    if (avail > 0 && !s->dead && !s->kill_requested)
        cq_wait_set(s);
    return taken;
}

/* ============================================================================================
 * Handing collectives to backends
 * ========================================================================================== */

colld_op_t *colld_coll_lead(const colld_coll_t *k)
{
    for (int r = 0; r < k->comm->nranks; r++)
        if (k->ops[r])
            return k->ops[r];
    return NULL;
}

/* The first local rank's next descriptor, NULL when it has none (lock held). */
static const colld_op_t *next_op(const colld_dcomm_t *c)
{
    for (int r = 0; r < c->nranks; r++)
        if (!c->ranks[r].remote)
            return c->ranks[r].head;
    return NULL;
}

/* A communicator's next collective waits while another backend still has collectives of it in
 * flight, so that each rank's completions stay in sequence order (and it is not timed out
 * meanwhile) (lock held). */
static bool held_by_other_backend(colld_daemon_t *d, const colld_dcomm_t *c)
{
    const colld_op_t *next = next_op(c);
    if (!next)
        return false;
    const colld_backend_t *claimer = NULL; /* looked up only when a backend is busy with c */
    for (int i = 0; i < d->nbackends; i++) {
        const colld_backend_t *b = &d->backends[i];
        if (!b->ops->comm_busy || !b->ops->comm_busy(b, c))
            continue;
        if (!claimer)
            claimer = colld_backend_claim(d, c, &next->d);
        if (b != claimer)
            return true;
    }
    return false;
}

/* Give a matched collective to the first backend that claims it (lock held). */
static void dispatch(colld_daemon_t *d, colld_coll_t *k)
{
    colld_backend_t *b = colld_backend_claim(d, k->comm, &colld_coll_lead(k)->d);
    if (!b || !b->ops->submit) {
        k->status = COLLD_ERR_NOT_SUPPORTED;
        colld_engine_finish(d, k);
        return;
    }
    k->backend = b;
    b->ops->submit(b, k);
}

/* Post the results of an executed collective and release everything it held (lock held). */
void colld_engine_finish(colld_daemon_t *d, colld_coll_t *k)
{
    colld_dcomm_t *c = k->comm;
    colld_status_t st = k->status;
    uint64_t first = UINT64_MAX;
    for (int r = 0; r < c->nranks; r++)
        if (k->ops[r])
            first = COLLD_MIN(first, k->ops[r]->arrival_ns);
    colld_hooks_finished(d, c, k->ops, first, k->start_ns, k->end_ns, st);
    colld_count_latency(d, colld_coll_lead(k)->d.kind, k->end_ns - first);
    for (int r = 0; r < c->nranks; r++)
        if (k->ops[r])
            colld_op_retire(k->ops[r], st);
    if (st == COLLD_OK)
        c->ops_completed++;
    else
        c->ops_failed++;
    c->colls_running--;
    c->p2p_dirty = true; /* sends and receives posted after it are released now */
    colld_comm_unref(d, c);
    free(k);
}

/* ============================================================================================
 * The thread
 * ========================================================================================== */

/* One pass over all sessions and communicators: admit, match, hand over, time out, and the
 * backends' progress. Returns how much work was found and the next deadline in *next_deadline
 * (lock held). */
static int engine_pass(colld_daemon_t *d, uint64_t *next_deadline)
{
    int work = 0;
    colld_p2p_pass_begin(d);
    for (colld_session_t *s = d->sessions; s; s = s->next)
        work += drain_session(d, s);
    uint64_t now = colld_now_ns();
    uint64_t next = colld_comm_check_join_timeouts(d, now);
    uint64_t look = colld_deadlock_check(d, now);
    if (look < next)
        next = look;
    for (int i = 0; i < d->nbackends; i++)
        if (d->backends[i].ops->progress)
            work += d->backends[i].ops->progress(&d->backends[i], now, &next);
    for (colld_dcomm_t *c = d->comms; c; c = c->next) {
        if (c->notices_pending)
            colld_complete_notices(c);
        /* Sends and receives run in a communicator closing because a rank left, too. */
        if (c->p2p_queued && (c->state == COLLD_COMM_READY || c->state == COLLD_COMM_CLOSING))
            work += colld_p2p_progress(d, c, now, &next);
        if (c->state != COLLD_COMM_READY)
            continue;
        if (!colld_hooks_judge(d, c, now, &next))
            continue; /* a module (the fast area) holds it this pass, time-outs included */
        if (held_by_other_backend(d, c))
            continue;
        colld_coll_t *k = colld_match(d, c);
        if (k) {
            dispatch(d, k);
            work++;
            continue;
        }
        uint64_t dl = colld_match_timeouts(d, c, now);
        if (dl < next)
            next = dl;
    }
    *next_deadline = next;
    return work;
}

/* True if any session has descriptors the engine can take now (lock held). */
static bool any_pending(colld_daemon_t *d)
{
    for (colld_session_t *s = d->sessions; s; s = s->next)
        if (session_pending(s))
            return true;
    return false;
}

/* Set or clear need_wakeup in every session's submission ring (lock held). */
static void set_need_wakeup(colld_daemon_t *d, uint32_t v)
{
    for (colld_session_t *s = d->sessions; s; s = s->next)
        if (s->shm)
            COLLD_STORE_SC(&s->shm->sq.need_wakeup, v);
}

/* How long the engine busy-polls after the last progress while backends have outstanding work
 * that only polling finds done; 0 when none has (lock held). */
static uint64_t poll_spin_ns(const colld_daemon_t *d)
{
    uint64_t ns = 0;
    for (int i = 0; i < d->nbackends; i++) {
        const colld_backend_t *b = &d->backends[i];
        if (b->ops->outstanding && b->ops->outstanding(b))
            ns = COLLD_MAX(ns, b->ops->poll_spin_ns);
    }
    return ns;
}

/* One round of the engine: admit, match, hand over what is ready, then let each backend run what
 * it holds outside the lock. Returns the work found, or -1 once the engine is stopping;
 * *next_deadline and *polling_ns say when it must look again (engine thread, lock not held). */
static int engine_round(colld_daemon_t *d, uint64_t *next_deadline, uint64_t *polling_ns)
{
    pthread_mutex_lock(&d->lock);
    if (!d->engine_running) {
        for (int i = 0; i < d->nbackends; i++)
            if (d->backends[i].ops->drain && d->backends[i].state)
                d->backends[i].ops->drain(&d->backends[i]);
        colld_daemon_unlock(d);
        return -1;
    }
    int work = engine_pass(d, next_deadline);
    *polling_ns = poll_spin_ns(d);
    colld_daemon_unlock(d);

    for (int i = 0; i < d->nbackends; i++) {
        colld_backend_t *b = &d->backends[i];
        if (!b->ops->run_unlocked || !b->ops->run_unlocked(b))
            continue;
        work++; /* a backend that still holds work (a tenant's queued jobs) keeps the engine going */
        pthread_mutex_lock(&d->lock);
        if (b->ops->after_run)
            b->ops->after_run(b);
        colld_daemon_unlock(d);
    }
    return work;
}

int colld_engine_run_once(colld_daemon_t *d)
{
    uint64_t next_deadline, polling_ns;
    return engine_round(d, &next_deadline, &polling_ns);
}

static void *engine_main(void *arg)
{
    colld_daemon_t *d = arg;
    uint64_t last_work = colld_now_ns();
    uint64_t spin_ns = (uint64_t)d->cfg.spin_us * 1000ull;
    for (;;) {
        uint64_t next_deadline, polling_ns;
        int work = engine_round(d, &next_deadline, &polling_ns);
        if (work < 0)
            break;
        uint64_t now = colld_now_ns();
        if (work) {
            last_work = now;
            continue;
        }
        /* While a backend has outstanding work that only polling finds done, the engine polls:
         * busy for a while (small collectives finish within it), then at next_deadline. */
        if (now - last_work < COLLD_MAX(spin_ns, polling_ns)) {
            sched_yield();
            continue;
        }
        /* Sleep: announce it, re-check (a client may have posted just before seeing the flag). */
        pthread_mutex_lock(&d->lock);
        set_need_wakeup(d, 1);
        bool pending = any_pending(d) || !d->engine_running;
        pthread_mutex_unlock(&d->lock);
        if (!pending) {
            int timeout_ms = 1000;
            if (next_deadline != UINT64_MAX) {
                uint64_t left = next_deadline > now ? next_deadline - now : 0;
                timeout_ms = (int)COLLD_MIN(left / 1000000ull + 1, 1000ull);
            }
            colld_engine_sleep(d, timeout_ms);
        }
        pthread_mutex_lock(&d->lock);
        set_need_wakeup(d, 0);
        pthread_mutex_unlock(&d->lock);
        last_work = colld_now_ns();
    }
    return NULL;
}

/* Create the epoll set and the engine thread (the backends have started). Returns 0 or -1. */
int colld_engine_start(colld_daemon_t *d)
{
    if (colld_engine_wake_init(d) < 0)
        return -1;
    d->engine_running = true;
    if (pthread_create(&d->engine_thread, NULL, engine_main, d) != 0) {
        d->engine_running = false;
        return -1;
    }
    pthread_setname_np(d->engine_thread, "colld-engine"); /* in top -H, and for tests (/proc/PID/task) */
    return 0;
}

/* Stop the engine thread. Sessions must already be gone; the backends stop after it. */
void colld_engine_stop(colld_daemon_t *d)
{
    if (d->engine_running) {
        pthread_mutex_lock(&d->lock);
        d->engine_running = false;
        pthread_mutex_unlock(&d->lock);
        colld_engine_wake(d);
        pthread_join(d->engine_thread, NULL);
    }
    colld_op_free_all(d);
    colld_deadlock_free(d);
    colld_engine_wake_fini(d);
}
