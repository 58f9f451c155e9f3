/*
 * recorder.c - every communicator's flight recorder and straggler statistics.
 *
 * The recorder keeps the last trace_cap collectives of a communicator: what was called, when
 * each rank posted it, when it ran, how it ended. A collective the communicator failed on while
 * waiting (timeout, peer lost, mismatch, abort) is recorded too, with the ranks that never
 * posted it left at 0: after a hang, `collctl trace` shows at a glance who was late or absent.
 * Straggler statistics (per rank: mean and max lateness behind the first rank) are kept on the
 * members over the executed collectives. All functions run with daemon->lock held.
 */
#include "server/core/daemon.h"

#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

const char *colld_kind_name(unsigned kind)
{
    switch (kind) {
    case COLLD_KIND_ALLREDUCE:
        return "allreduce";
    case COLLD_KIND_BROADCAST:
        return "broadcast";
    case COLLD_KIND_REDUCE:
        return "reduce";
    case COLLD_KIND_ALLGATHER:
        return "allgather";
    case COLLD_KIND_REDUCESCATTER:
        return "reducescatter";
    }
    return "unknown";
}

const char *colld_dtype_name(unsigned dtype)
{
    static const char *const names[] = { "int8",    "uint8",    "int32",   "uint32",  "int64",
                                         "uint64", "float16", "bfloat16", "float32", "float64" };
    _Static_assert(sizeof(names) / sizeof(names[0]) == COLLD_DTYPE_COUNT, "one name per dtype");
    return dtype < COLLD_DTYPE_COUNT ? names[dtype] : "unknown";
}

const char *colld_redop_name(unsigned redop)
{
    static const char *const names[] = { "sum", "prod", "min", "max", "avg" };
    _Static_assert(sizeof(names) / sizeof(names[0]) == COLLD_REDOP_COUNT, "one name per op");
    return redop < COLLD_REDOP_COUNT ? names[redop] : "unknown";
}

/* Allocate the recorder of a communicator that has formed (trace-entries records of nranks
 * arrival times each; 0 disables it): not before, so a communicator that never forms costs none. */
int colld_recorder_init(colld_daemon_t *d, colld_dcomm_t *c)
{
    unsigned cap = (unsigned)d->cfg.trace_entries;
    if (cap == 0)
        return 0;
    c->trace = calloc(cap, sizeof(*c->trace));
    c->trace_arrivals = calloc((size_t)cap * (size_t)c->nranks, sizeof(*c->trace_arrivals));
    if (!c->trace || !c->trace_arrivals) {
        colld_recorder_free(c);
        return -1;
    }
    c->trace_cap = cap;
    return 0;
}

void colld_recorder_free(colld_dcomm_t *c)
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

uint64_t colld_recorder_executed(colld_dcomm_t *c, colld_op_t *const *ops, uint64_t start_ns, uint64_t end_ns,
                                 colld_status_t st)
{
    uint64_t first = UINT64_MAX;
    const colld_op_t *lead = NULL; /* remote ranks (multi-node) have no op here */
    for (int r = 0; r < c->nranks; r++)
        if (ops[r]) {
            first = COLLD_MIN(first, ops[r]->arrival_ns);
            if (!lead)
                lead = ops[r];
        }
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
        return first;
    uint64_t *arrivals;
    colld_trace_rec_t *t = next_rec(c, &arrivals);
    fill_call(t, &lead->d);
    t->status = st;
    t->first_ns = first;
    t->start_ns = start_ns;
    t->end_ns = end_ns;
    for (int r = 0; r < c->nranks; r++)
        arrivals[r] = ops[r] ? ops[r]->arrival_ns : 0;
    return first;
}

void colld_recorder_failed(colld_dcomm_t *c, colld_status_t st, uint64_t now)
{
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
