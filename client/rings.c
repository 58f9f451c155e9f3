/*
 * rings.c - the client's side of the shared-memory rings: posting descriptors on the submission
 * ring (one head store and at most one wake-up of the daemon per batch), reaping the completion
 * ring into the communicators (staged outputs copied out first), and waiting for what was posted
 * to the engine: poll the completion doorbell for as long as this communicator's completions
 * usually take to come (at most 50 us pausing, 200 us yielding; spin.h), then sleep on it. A wait
 * for one operation finishes a fast-path collective in flight before it through the client's hook
 * (client->hooks): the rings sit below the fast path and never name it.
 */
#include "client/client_internal.h"

#include "common/log.h"
#include "common/util.h"
#include "transport/shm/ring.h"

#include <time.h>
#include <unistd.h>

#define WAIT_SLICE_NS 50000000 /* a sleeping waiter re-checks at least this often */
#define NAP_MIN_NS 2000        /* a waiter for ring space naps this long first... */
#define NAP_MAX_NS 1000000     /* ...doubling up to this */

/* Reap completions into their communicators (mu held). */
static void reap(colld_client_t *c)
{
    int64_t avail = colld_ring_avail(&c->shm->cq, c->cq_tail, c->entries);
    if (avail < 0) {
        if (!atomic_exchange(&c->lost, true))
            LOG_ERROR(CLIENT, "corrupt completion ring; treating the daemon as lost");
        return;
    }
    for (int64_t i = 0; i < avail; i++) {
        colld_wire_cqe_t e = c->cqes[c->cq_tail & (c->entries - 1)];
        c->cq_tail++;
        colld_comm_t *comm = e.comm < c->ncomms_slots ? c->comms[e.comm] : NULL;
        if (!comm)
            continue;
        if (e.seq == 0) { /* a notice: the communicator broke, nothing completed */
            if (e.status != COLLD_OK && __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED) == COLLD_OK)
                __atomic_store_n(&comm->async_error, (colld_status_t)e.status, __ATOMIC_RELAXED);
            continue; /* what is in flight still gets its own completion */
        }
        if (comm->pending)
            colld__pending_complete(c, comm, e.seq, (colld_status_t)e.status);
        if (e.status != COLLD_OK && __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED) == COLLD_OK)
            __atomic_store_n(&comm->async_error, (colld_status_t)e.status, __ATOMIC_RELAXED);
        if (e.status != COLLD_OK)
            colld__seq_lower(&comm->failed_seq, e.seq);
        colld__seq_raise(&comm->done_upto, e.seq);
        __atomic_add_fetch(&comm->completed, 1, __ATOMIC_RELEASE);
    }
    if (!avail)
        return;
    COLLD_STORE_SC(&c->shm->cq.tail, c->cq_tail);
    /* The daemon holds descriptors back until completion space frees up: tell it. */
    if (COLLD_LOAD_SC(&c->shm->cq.need_wakeup)) {
        uint64_t one = 1;
        ssize_t rc = write(c->efd, &one, sizeof(one));
        (void)rc; /* EAGAIN: the counter is saturated, the daemon is being woken anyway */
    }
}

/* Reap completions without waiting. */
void colld__client_poll(colld_client_t *c)
{
    pthread_mutex_lock(&c->mu);
    reap(c);
    pthread_mutex_unlock(&c->mu);
}

/* Sleep on the completion doorbell, at most timeout_ns, unless something is already there (no
 * lost wake-up: the value is read before the ring is re-checked). */
static void sleep_on_doorbell(colld_client_t *c, uint64_t timeout_ns)
{
    uint32_t v = COLLD_LOAD_SC(&c->shm->cq.doorbell);
    __atomic_add_fetch(&c->shm->cq.waiters, 1, __ATOMIC_SEQ_CST);
    if (colld_ring_avail(&c->shm->cq, c->cq_tail, c->entries) == 0 && !atomic_load(&c->lost))
        colld_futex_wait(&c->shm->cq.doorbell, v, timeout_ns);
    __atomic_sub_fetch(&c->shm->cq.waiters, 1, __ATOMIC_SEQ_CST);
}

void colld__ring_nap(colld_client_t *c, uint64_t timeout_ns)
{
    sleep_on_doorbell(c, timeout_ns);
}

/* One step of a wait for completions that started at *start (0: this is its first step; set
 * here, with *plan): poll the doorbell while within the wait's window (spin.h), else sleep on it.
 * `bell` is the doorbell's value read before the caller last reaped. */
static void wait_step(colld_client_t *c, colld_comm_t *comm, uint32_t bell, uint64_t *start, colld_spin_plan_t *plan)
{
    uint64_t now = colld_now_ns();
    if (!*start) {
        *start = now;
        *plan = colld__spin_plan(&comm->ring_spin, &c->load, comm->crowded, now);
    }
    while (now - *start < plan->window_ns) {
        for (int i = 0; i < (plan->yield ? 1 : 64); i++) {
            if (COLLD_LOAD_SC(&c->shm->cq.doorbell) != bell || atomic_load(&c->lost))
                return;
            colld__spin_between(plan);
        }
        now = colld_now_ns();
    }
    sleep_on_doorbell(c, WAIT_SLICE_NS);
}

/* A wait that started at `start` as `plan` said ended: learn how long it took. */
static void wait_done(colld_comm_t *comm, uint64_t start, const colld_spin_plan_t *plan)
{
    colld__spin_record(&comm->ring_spin, plan->window_ns, colld_now_ns() - start);
}

/* Back off while waiting for the daemon to take descriptors (no doorbell rings for that): a few
 * polls while a CPU is free, then naps of growing length. */
static void nap(colld_client_t *c, unsigned *round)
{
    if (*round < 32 && !colld__cpus_busy(&c->load, colld_now_ns())) {
        for (int i = 0; i < 64; i++)
            colld__cpu_relax();
        (*round)++;
        return;
    }
    unsigned k = *round < 32 ? 0 : *round - 32;
    long ns = k >= 9 ? NAP_MAX_NS : COLLD_MIN((long)NAP_MIN_NS << k, NAP_MAX_NS);
    struct timespec ts = { 0, ns };
    nanosleep(&ts, NULL);
    if (*round < 32)
        *round = 32;
    else
        (*round)++;
}

/* Post descriptors in order; a full ring is drained by the daemon as completions are consumed. */
colld_status_t colld__client_submit(colld_client_t *c, const colld_wire_sqe_t *sqes, size_t n)
{
    size_t done = 0;
    unsigned round = 0;
    while (done < n) {
        if (atomic_load(&c->lost))
            return COLLD_ERR_DAEMON_LOST;
        pthread_mutex_lock(&c->mu);
        int64_t space = colld_ring_space(&c->shm->sq, c->sq_head, c->entries);
        if (space < 0) {
            pthread_mutex_unlock(&c->mu);
            atomic_store(&c->lost, true);
            return COLLD_ERR_PROTOCOL;
        }
        if (space > 0) {
            /* Publish as many as fit, then one head store and at most one wake-up. */
            for (; space > 0 && done < n; space--, done++) {
                c->sqes[c->sq_head & (c->entries - 1)] = sqes[done];
                c->sq_head++;
            }
            COLLD_STORE_SC(&c->shm->sq.head, c->sq_head);
            if (COLLD_LOAD_SC(&c->shm->sq.need_wakeup)) {
                uint64_t one = 1;
                ssize_t rc = write(c->efd, &one, sizeof(one));
                (void)rc; /* EAGAIN: the counter is saturated, the daemon is being woken anyway */
            }
            pthread_mutex_unlock(&c->mu);
            round = 0;
            continue;
        }
        /* Ring full: the daemon drains it as completions are consumed, so reap and retry. */
        reap(c);
        pthread_mutex_unlock(&c->mu);
        nap(c, &round);
    }
    return COLLD_OK;
}

bool colld__ring_wait_taken(colld_client_t *c, int timeout_ms)
{
    pthread_mutex_lock(&c->mu);
    uint64_t head = c->sq_head;
    pthread_mutex_unlock(&c->mu);
    uint64_t deadline = 0;
    unsigned round = 0;
    for (;;) {
        uint64_t tail = COLLD_LOAD_ACQ(&c->shm->sq.tail);
        if ((int64_t)(tail - head) >= 0 || atomic_load(&c->lost))
            return true;
        /* The daemon takes a descriptor only with a completion slot free for it: consume. */
        pthread_mutex_lock(&c->mu);
        reap(c);
        pthread_mutex_unlock(&c->mu);
        uint64_t now = colld_now_ns();
        if (!deadline)
            deadline = now + (uint64_t)timeout_ms * 1000000ull;
        if (now >= deadline)
            return false;
        nap(c, &round);
    }
}

/* Whether collective `seq` of comm has completed (mu held): it is not the fast-path one in flight,
 * and no engine collective up to it is outstanding. */
static bool op_done(const colld_comm_t *comm, uint64_t seq)
{
    if (comm->fop.active && comm->fop.seq <= seq)
        return false;
    return seq <= __atomic_load_n(&comm->done_upto, __ATOMIC_ACQUIRE) ||
           __atomic_load_n(&comm->completed, __ATOMIC_ACQUIRE) >= comm->issued;
}

colld_status_t colld__ring_wait_op(colld_client_t *c, colld_comm_t *comm, uint64_t seq, bool block)
{
    uint64_t start = 0;
    colld_spin_plan_t plan = { 0, false };
    for (;;) {
        uint32_t bell = COLLD_LOAD_SC(&c->shm->cq.doorbell);
        pthread_mutex_lock(&c->mu);
        reap(c);
        colld_status_t err = comm->async_error;
        uint64_t first_failed = __atomic_load_n(&comm->failed_seq, __ATOMIC_ACQUIRE);
        bool failed = first_failed && seq >= first_failed;
        bool done = op_done(comm, seq);
        pthread_mutex_unlock(&c->mu);
        if (failed)
            return err;
        if (done) {
            if (start)
                wait_done(comm, start, &plan);
            return COLLD_OK;
        }
        if (atomic_load(&c->lost))
            return COLLD_ERR_DAEMON_LOST;
        if (comm->fop.active && comm->fop.seq <= seq) {
            /* its failure is the communicator's, seen on the next turn (fast.c, through the hook) */
            if (c->hooks.fast_finish(comm, block) == COLLD_INPROGRESS)
                return COLLD_INPROGRESS;
            continue;
        }
        if (!block)
            return COLLD_INPROGRESS;
        wait_step(c, comm, bell, &start, &plan);
    }
}

/* Wait until every collective posted to the engine on comm has completed; returns the
 * communicator's error (its first), or DAEMON_LOST. */
colld_status_t colld__ring_wait(colld_client_t *c, colld_comm_t *comm)
{
    uint64_t start = 0;
    colld_spin_plan_t plan = { 0, false };
    for (;;) {
        uint32_t bell = COLLD_LOAD_SC(&c->shm->cq.doorbell);
        pthread_mutex_lock(&c->mu);
        reap(c);
        bool done = comm->completed >= comm->issued;
        colld_status_t err = comm->async_error;
        pthread_mutex_unlock(&c->mu);
        if (done) {
            if (start && err == COLLD_OK)
                wait_done(comm, start, &plan);
            return err;
        }
        if (atomic_load(&c->lost))
            return COLLD_ERR_DAEMON_LOST;
        wait_step(c, comm, bell, &start, &plan);
    }
}
