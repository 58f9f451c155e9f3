/*
 * recorder.c - every communicator's flight recorder and straggler statistics.
 *
 * The recorder keeps the last trace_cap collectives of a communicator: what was called, when
 * each rank posted it, when it ran, how it ended. A collective the communicator failed on while
 * waiting (timeout, peer lost, mismatch, abort) is recorded too, with the ranks that never
 * posted it left at 0: after a hang, `collctl trace` shows at a glance who was late or absent.
 * Straggler statistics (per rank: mean and max lateness behind the first rank) are kept on the
 * members over the executed collectives. The recorder is a module told of every communicator's
 * life (colld_recorder_hooks, backend.h). All functions run with daemon->lock held.
 */
#include "server/observability/recorder.h"

#include "server/core/daemon.h"

#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

/* Allocate the recorder of a communicator that has formed (trace-entries records of nranks
 * arrival times each; 0 disables it): not before, so a communicator that never forms costs none. */
static void recorder_free(colld_dcomm_t *c);

static int recorder_init(colld_daemon_t *d, colld_dcomm_t *c)
{
    unsigned cap = (unsigned)d->cfg.trace_entries;
    if (cap == 0)
        return 0;
    c->trace = calloc(cap, sizeof(*c->trace));
    c->trace_arrivals = calloc((size_t)cap * (size_t)c->nranks, sizeof(*c->trace_arrivals));
    if (!c->trace || !c->trace_arrivals) {
        recorder_free(c);
        return -1;
    }
    c->trace_cap = cap;
    return 0;
}

/* Free the recorder of a communicator. */
static void recorder_free(colld_dcomm_t *c)
{
    free(c->trace);
    free(c->trace_arrivals);
    c->trace = NULL;
    c->trace_arrivals = NULL;
    c->trace_cap = 0;
}

/* The next record to write, its arrival row cleared. */
static colld_trace_rec_t *next_rec(colld_dcomm_t *c, uint64_t **arrivals)
{
    size_t slot = (size_t)(c->trace_count % c->trace_cap);
    c->trace_count++;
    *arrivals = &c->trace_arrivals[slot * (size_t)c->nranks];
    memset(*arrivals, 0, (size_t)c->nranks * sizeof(**arrivals));
    colld_trace_rec_t *t = &c->trace[slot];
    memset(t, 0, sizeof(*t));
    return t;
}

static void fill_call(colld_trace_rec_t *t, const colld_wire_sqe_t *d)
{
    t->seq = d->seq;
    t->count = d->count;
    t->kind = (uint8_t)d->kind;
    t->dtype = (uint8_t)d->dtype;
    t->redop = (uint8_t)d->redop;
    t->flags = d->flags & COLLD_SQE_FAST;
    t->root = d->root;
}

/* A collective ended: ops[nranks] by rank (NULL for remote ranks), its execution window and
 * status, the first rank's arrival: the stragglers' lateness, and a record. */
static void recorder_finished(colld_daemon_t *d, colld_dcomm_t *c, colld_op_t *const *ops, uint64_t first,
                              uint64_t start_ns, uint64_t end_ns, colld_status_t st)
{
    (void)d;
    const colld_op_t *lead = NULL; /* remote ranks (multi-node) have no op here */
    for (int r = 0; r < c->nranks && !lead; r++)
        lead = ops[r];
    for (int r = 0; r < c->nranks; r++) {
        colld_member_t *m = &c->ranks[r];
        if (!ops[r])
            continue;
        uint64_t late = ops[r]->arrival_ns - first;
        m->late_sum_ns += late;
        m->late_max_ns = COLLD_MAX(m->late_max_ns, late);
        m->late_samples++;
    }
    if (!c->trace_cap)
        return;
    uint64_t *arrivals;
    colld_trace_rec_t *t = next_rec(c, &arrivals);
    fill_call(t, &lead->d);
    t->status = st;
    t->first_ns = first;
    t->start_ns = start_ns;
    t->end_ns = end_ns;
    if (c->slow_link[0])
        t->flags |= COLLD_TRACE_SLOW_LINK;
    for (int r = 0; r < c->nranks; r++)
        arrivals[r] = ops[r] ? ops[r]->arrival_ns : 0;
}

/* The communicator fails while waiting for collective exec_seq (a break, a rank leaving): record
 * the ranks that had posted it, once per collective. */
static void recorder_failing(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st)
{
    (void)d;
    uint64_t now = colld_now_ns();
    if (!c->trace_cap || c->trace_failed_seq == c->exec_seq)
        return;
    const colld_op_t *first = NULL;
    for (int r = 0; r < c->nranks; r++) {
        const colld_op_t *op = c->ranks[r].head;
        if (op && op->d.seq == c->exec_seq && (!first || op->arrival_ns < first->arrival_ns))
            first = op;
    }
    if (!first)
        return; /* nobody had posted it: nothing was waiting */
    c->trace_failed_seq = c->exec_seq;
    uint64_t *arrivals;
    colld_trace_rec_t *t = next_rec(c, &arrivals);
    fill_call(t, &first->d);
    t->status = st;
    t->first_ns = first->arrival_ns;
    t->end_ns = now;
    for (int r = 0; r < c->nranks; r++) {
        const colld_op_t *op = c->ranks[r].head;
        if (op && op->d.seq == c->exec_seq)
            arrivals[r] = op->arrival_ns;
    }
}

/* The rank with the largest mean lateness (see recorder.h). */
int colld_recorder_slowest(const colld_dcomm_t *c)
{
    int slowest = -1;
    if (!c->ranks)
        return -1; /* forming: nothing has run */
    uint64_t worst = COLLD_STRAGGLER_MIN_NS;
    for (int r = 0; r < c->nranks; r++) {
        const colld_member_t *m = &c->ranks[r];
        if (!m->late_samples)
            continue;
        uint64_t mean = m->late_sum_ns / m->late_samples;
        if (mean >= worst) {
            worst = mean;
            slowest = r;
        }
    }
    return slowest;
}

/* The communicator formed: its recorder is made now (without memory for it, it runs without). */
static void recorder_formed(colld_daemon_t *d, colld_dcomm_t *c)
{
    if (recorder_init(d, c) < 0)
        LOG_WARN(COLL, "communicator %llu (%s): no memory for its flight recorder; it runs without one",
                 (unsigned long long)c->id, c->name);
}

static void recorder_freed(colld_daemon_t *d, colld_dcomm_t *c)
{
    (void)d;
    recorder_free(c);
}

const colld_comm_hooks_t colld_recorder_hooks = {
    .name = "flight recorder",
    .formed = recorder_formed,
    .failing = recorder_failing,
    .finished = recorder_finished,
    .freed = recorder_freed,
};
