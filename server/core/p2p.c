/*
 * p2p.c - point-to-point operations: sends and receives between two ranks of a single-node
 * communicator, matched and run by the engine, in the order each rank posted them.
 *
 * A send or receive is queued on its rank's own queue of point-to-point operations (member
 * p2p_head), apart from its collectives. Its d.seq is the ordinal of the rank's next collective
 * (proto/wire.h), which orders the two queues: a rank's point-to-point operation runs only once
 * the collectives it posted before it have completed (no collective of the communicator runs and
 * its queue of collectives has nothing before it), and its next collective waits until the
 * point-to-point operations before it have completed (colld_p2p_holds, match.c).
 *
 * Batches. Operations posted inside one group (colld_group_start/end) are linked
 * (COLLD_SQE_LINK): a batch is the run of operations from the rank's first one up to and
 * including the first without the flag; an operation outside a group is a batch of one. Only the
 * rank's first batch (its head batch) runs, and its operations run concurrently, in any order:
 * as in NCCL, a send and a receive of one group never wait for each other, while without a group
 * each operation waits for the one before it.
 *
 * Matching: the k-th send of rank a to rank b meets the k-th receive of rank b from rank a. Since
 * batches complete in order, it is enough to pair, within the head batches of a and b, a's first
 * unmatched send to b with b's first unmatched receive from a. Both must have the same dtype and
 * count, else the communicator fails with COLLD_ERR_MISMATCH naming both calls; both on host
 * buffers or both on GPU buffers (stream-ordered), else COLLD_ERR_NOT_SUPPORTED. A matched pair is a
 * transfer (colld_xfer_t) handed to the first backend that runs transfers and claims the send: the
 * host backend copies outside the lock, straight from the sender's mapped buffer into the
 * receiver's (zero copy, as the collectives); the CUDA backend copies GPU buffers on its stream
 * once both ranks' streams have reached the operations (server/backends/cuda/cuda_p2p.c), and
 * times out those whose streams never get there (this file's time-out covers operations still
 * unmatched).
 *
 * Completions go out in each rank's posting order: an operation whose transfer is done stays at
 * the head of its queue until the ones before it are done too, so a client's "every operation up
 * to N has completed" stays true. An operation that waits longer than the communicator's time-out
 * fails it with COLLD_ERR_TIMEOUT naming what is missing ("rank 3 never sent to rank 5 ...").
 * All functions run with daemon->lock held.
 */
#include "server/core/counters.h"
#include "server/core/daemon.h"

#include "common/log.h"
#include "common/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ============================================================================================
 * Queues and batches
 * ========================================================================================== */

void colld_p2p_enqueue(colld_dcomm_t *c, colld_member_t *m, colld_op_t *op)
{
    op->arrival_ns = colld_now_ns();
    op->p2p_state = COLLD_P2P_QUEUED;
    op->p2p_status = COLLD_OK;
    op->next = NULL;
    if (m->p2p_tail)
        m->p2p_tail->next = op;
    else
        m->p2p_head = op;
    m->p2p_tail = op;
    c->p2p_queued++;
    c->p2p_dirty = true;
}

bool colld_p2p_holds(const colld_member_t *m, uint64_t ord)
{
    return m->p2p_head && m->p2p_head->d.seq <= ord;
}

/* The operation after op in its rank's head batch, NULL at the batch's end (or where the rest of
 * the batch has not been posted yet). */
static colld_op_t *batch_next(const colld_op_t *op)
{
    return (op->d.flags & COLLD_SQE_LINK) ? op->next : NULL;
}

/* Whether rank m's head batch may run: the collectives it posted before it have completed (none of
 * the communicator runs: a running one was posted by every rank before any point-to-point
 * operation still queued, or it would not have matched; and none waits in m's queue). */
static bool rank_free(const colld_dcomm_t *c, const colld_member_t *m)
{
    const colld_op_t *h = m->p2p_head;
    return h && c->colls_running == 0 && (!m->head || m->head->d.seq >= h->d.seq);
}

/* Post the completions of rank m's leading operations that are done, in posting order. */
static void flush(colld_dcomm_t *c, colld_member_t *m)
{
    while (m->p2p_head && m->p2p_head->p2p_state == COLLD_P2P_DONE) {
        colld_op_t *op = m->p2p_head;
        m->p2p_head = op->next;
        c->p2p_queued--;
        colld_op_retire(op, op->p2p_status);
    }
    if (!m->p2p_head)
        m->p2p_tail = NULL;
}

void colld_p2p_fail_queue(colld_dcomm_t *c, colld_member_t *m, colld_status_t st, bool all)
{
    for (colld_op_t *op = m->p2p_head; op; op = op->next)
        if (op->p2p_state == COLLD_P2P_QUEUED &&
            (all || m->left || c->ranks[op->d.root].left || (op->d.flags & COLLD_SQE_STREAM))) {
            op->p2p_state = COLLD_P2P_DONE;
            op->p2p_status = st;
            c->ops_failed++;
        }
    flush(c, m);
    c->p2p_dirty = true; /* the rank may be free now, or its next batch matchable */
}

/* ============================================================================================
 * Details: what a rank is doing, a call
 * ========================================================================================== */

/* "1024 x float32 (4096 B)". */
static int describe_size(char *buf, size_t len, const colld_wire_sqe_t *d)
{
    uint64_t bytes = 0;
    if (!colld_mul_ok(d->count, colld_dtype_size((colld_dtype_t)d->dtype), &bytes))
        bytes = UINT64_MAX;
    return snprintf(buf, len, "%llu x %s (%llu B)", (unsigned long long)d->count, colld_dtype_name(d->dtype),
                    (unsigned long long)bytes);
}

/* snprintf, returning what it wrote (never more than len - 1), so that offsets stay in bounds. */
static int put(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int put(char *buf, size_t len, const char *fmt, ...)
{
    if (len == 0)
        return 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return n < 0 ? 0 : n >= (int)len ? (int)len - 1 : n;
}

int colld_p2p_describe_rank(char *buf, size_t len, const colld_dcomm_t *c, int r)
{
    const colld_member_t *m = &c->ranks[r];
    if (m->left || !m->session)
        return put(buf, len, "has left the communicator");
    if (m->p2p_head && !rank_free(c, m) && m->head)
        return put(buf, len, "has point-to-point operations queued behind %s (collective #%llu), which has not run",
                   colld_kind_name(m->head->d.kind), (unsigned long long)m->head->d.seq);
    if (m->p2p_head) {
        int off = put(buf, len, "waits in its own point-to-point operations:");
        int shown = 0;
        for (const colld_op_t *op = m->p2p_head; op && shown < 4; op = batch_next(op)) {
            if (op->p2p_state != COLLD_P2P_QUEUED)
                continue;
            off += put(buf + off, len - (size_t)off, "%s %s %s rank %d", shown ? "," : "", colld_kind_name(op->d.kind),
                       op->d.kind == COLLD_KIND_SEND ? "to" : "from", op->d.root);
            shown++;
        }
        if (!shown)
            off += put(buf + off, len - (size_t)off, " transfers still running");
        return off;
    }
    if (m->head)
        return put(buf, len, "is waiting in %s (collective #%llu)", colld_kind_name(m->head->d.kind),
                   (unsigned long long)m->head->d.seq);
    return put(buf, len, "has nothing posted");
}

/* ============================================================================================
 * Faults: a mismatch, a time-out
 * ========================================================================================== */

/* Where an operation's buffer is, for a detail. */
static const char *where(const colld_op_t *op)
{
    return (op->d.flags & COLLD_SQE_STREAM) ? " of GPU memory (stream-ordered)" : " of host memory";
}

/* A send and the receive it meets disagree in dtype or count: MISMATCH naming both calls. One from
 * GPU memory (stream-ordered) and the other of host memory is not supported: no backend runs it. */
static void report_mismatch(colld_daemon_t *d, colld_dcomm_t *c, const colld_op_t *s, const colld_op_t *r)
{
    char why[COLLD_DETAIL_LEN], ssz[96], rsz[96];
    int a = s->member->rank, b = r->member->rank;
    bool mixed = (s->d.flags ^ r->d.flags) & COLLD_SQE_STREAM;
    describe_size(ssz, sizeof(ssz), &s->d);
    describe_size(rsz, sizeof(rsz), &r->d);
    snprintf(why, sizeof(why),
             "point-to-point from rank %d to rank %d %s: rank %d sends %s%s (operation #%llu), rank %d receives "
             "%s%s (operation #%llu)",
             a, b, mixed ? "between GPU and host memory is not supported" : "differs", a, ssz, mixed ? where(s) : "",
             (unsigned long long)s->id, b, rsz, mixed ? where(r) : "", (unsigned long long)r->id);
    colld_comm_break(d, c, mixed ? COLLD_ERR_NOT_SUPPORTED : COLLD_ERR_MISMATCH, -1, why);
}

/* What op waits for, since when, and what its peer does instead: "rank 0 (pid 812) waited 1500 ms
 * to receive ... from rank 1 (operation #1); rank 1 never sent to rank 0: it is waiting in ...".
 * Returns what it wrote. */
static int describe_op_wait(char *buf, size_t len, const colld_dcomm_t *c, const colld_op_t *op, uint64_t now)
{
    char size[96];
    int a = op->member->rank, b = op->d.root;
    bool send = op->d.kind == COLLD_KIND_SEND;
    describe_size(size, sizeof(size), &op->d);
    int off = put(buf, len, "rank %d (pid %d) waited %llu ms to %s %s %s rank %d (operation #%llu); ", a,
                  (int)op->session->pid,
                  (unsigned long long)(now > op->arrival_ns ? (now - op->arrival_ns) / 1000000ull : 0),
                  send ? "send" : "receive", size, send ? "to" : "from", b, (unsigned long long)op->id);
    if (!rank_free(c, op->member)) {
        /* It never got to run: say where both ranks stand. */
        off += put(buf + off, len - (size_t)off, "rank %d ", a);
        off += colld_p2p_describe_rank(buf + off, len - (size_t)off, c, a);
        if (b != a) {
            off += put(buf + off, len - (size_t)off, "; rank %d ", b);
            off += colld_p2p_describe_rank(buf + off, len - (size_t)off, c, b);
        }
        return off;
    }
    if (send)
        off += put(buf + off, len - (size_t)off, "rank %d never posted the receive from rank %d: it ", b, a);
    else
        off += put(buf + off, len - (size_t)off, "rank %d never sent to rank %d: it ", b, a);
    return off + colld_p2p_describe_rank(buf + off, len - (size_t)off, c, b);
}

/* An operation waited longer than the time-out: TIMEOUT naming it and what its peer does. */
static void report_timeout(colld_daemon_t *d, colld_dcomm_t *c, const colld_op_t *op, uint64_t now)
{
    char why[COLLD_DETAIL_LEN];
    int off = put(why, sizeof(why), "point-to-point timed out after %d ms: ", c->timeout_ms);
    describe_op_wait(why + off, sizeof(why) - (size_t)off, c, op, now);
    colld_comm_break(d, c, COLLD_ERR_TIMEOUT, -1, why);
}

/* The oldest operation still waiting for its peer in a head batch, NULL when none waits. */
static const colld_op_t *oldest_waiting(const colld_dcomm_t *c)
{
    const colld_op_t *oldest = NULL;
    for (int r = 0; r < c->nranks; r++)
        for (const colld_op_t *op = c->ranks[r].p2p_head; op; op = batch_next(op))
            if (op->p2p_state == COLLD_P2P_QUEUED && (!oldest || op->arrival_ns < oldest->arrival_ns))
                oldest = op;
    return oldest;
}

void colld_p2p_waits(const colld_dcomm_t *c, void (*fn)(void *arg, const colld_op_t *op), void *arg)
{
    for (int r = 0; r < c->nranks; r++) {
        const colld_member_t *m = &c->ranks[r];
        if (m->remote || !m->session || !rank_free(c, m))
            continue;
        for (const colld_op_t *op = m->p2p_head; op; op = batch_next(op))
            if (op->p2p_state == COLLD_P2P_QUEUED)
                fn(arg, op);
    }
}

uint64_t colld_p2p_describe_wait(char *buf, size_t len, const colld_dcomm_t *c, uint64_t now)
{
    const colld_op_t *op = c->p2p_queued ? oldest_waiting(c) : NULL;
    if (len)
        buf[0] = '\0';
    if (!op)
        return 0;
    describe_op_wait(buf, len, c, op, now);
    return now > op->arrival_ns ? now - op->arrival_ns : 0;
}

/* ============================================================================================
 * Matching and transfers
 * ========================================================================================== */

/* Rank m's first unmatched receive from rank `from` in its head batch, NULL when there is none. */
static colld_op_t *find_recv(colld_member_t *m, int from)
{
    for (colld_op_t *op = m->p2p_head; op; op = batch_next(op))
        if (op->p2p_state == COLLD_P2P_QUEUED && op->d.kind == COLLD_KIND_RECV && op->d.root == from)
            return op;
    return NULL;
}

/* The first backend that runs transfers and claims the send's descriptor, NULL when none does. */
static colld_backend_t *xfer_backend(colld_daemon_t *d, const colld_dcomm_t *c, const colld_op_t *s)
{
    for (int i = 0; i < d->nbackends; i++) {
        colld_backend_t *b = &d->backends[i];
        if (b->ops->xfer_submit && (!b->ops->claims || b->ops->claims(b, c, &s->d)))
            return b;
    }
    return NULL;
}

/* Hand a matched send and receive to the backend that runs them. Returns 0, or -1 when the
 * communicator broke (no memory). */
static int start_xfer(colld_daemon_t *d, colld_dcomm_t *c, colld_op_t *s, colld_op_t *r)
{
    colld_xfer_t *x = calloc(1, sizeof(*x));
    if (!x) {
        colld_comm_break(d, c, COLLD_ERR_NO_MEMORY, -1, "daemon out of memory");
        return -1;
    }
    x->comm = c;
    x->send = s;
    x->recv = r;
    x->status = COLLD_OK;
    colld_backend_t *b = xfer_backend(d, c, s);
    if (!b) {
        free(x);
        colld_comm_break(d, c, COLLD_ERR_NOT_SUPPORTED, -1, "no backend of this daemon runs point-to-point transfers");
        return -1;
    }
    s->p2p_state = r->p2p_state = COLLD_P2P_RUNNING;
    c->refs++;
    colld_comm_state_t state = c->state;
    colld_status_t error = c->error;
    b->ops->xfer_submit(b, x);
    /* A backend that broke the communicator may have finished the transfer (and freed s and r)
     * already: the caller must not go on with them. */
    return c->state != state || c->error != error ? -1 : 0;
}

/* Pair every send of a free rank's head batch with its receive where the receiver is free too.
 * Returns the transfers started, or -1 when the communicator broke. */
static int match_all(colld_daemon_t *d, colld_dcomm_t *c)
{
    int started = 0;
    for (int a = 0; a < c->nranks; a++) {
        colld_member_t *ma = &c->ranks[a];
        if (ma->remote || !rank_free(c, ma))
            continue;
        for (colld_op_t *s = ma->p2p_head; s; s = batch_next(s)) {
            if (s->p2p_state != COLLD_P2P_QUEUED || s->d.kind != COLLD_KIND_SEND)
                continue;
            colld_member_t *mb = &c->ranks[s->d.root]; /* in range: admission checked it */
            if (mb->remote || !rank_free(c, mb))
                continue;
            colld_op_t *r = find_recv(mb, a);
            if (!r)
                continue;
            if (r->d.dtype != s->d.dtype || r->d.count != s->d.count ||
                ((r->d.flags ^ s->d.flags) & COLLD_SQE_STREAM)) {
                report_mismatch(d, c, s, r);
                return -1;
            }
            if (start_xfer(d, c, s, r) < 0)
                return -1;
            started++;
        }
    }
    return started;
}

int colld_p2p_progress(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now, uint64_t *deadline)
{
    int work = 0;
    if (c->p2p_dirty) {
        c->p2p_dirty = false;
        work = match_all(d, c);
        if (work < 0)
            return 1;
        const colld_op_t *oldest = oldest_waiting(c);
        c->p2p_deadline = oldest ? oldest->arrival_ns + (uint64_t)c->timeout_ms * 1000000ull : UINT64_MAX;
    }
    if (c->p2p_deadline <= now) {
        const colld_op_t *oldest = oldest_waiting(c);
        if (oldest && oldest->arrival_ns + (uint64_t)c->timeout_ms * 1000000ull <= now) {
            report_timeout(d, c, oldest, now);
            return work + 1;
        }
        c->p2p_deadline = oldest ? oldest->arrival_ns + (uint64_t)c->timeout_ms * 1000000ull : UINT64_MAX;
    }
    if (c->p2p_deadline < *deadline)
        *deadline = c->p2p_deadline;
    return work;
}

void colld_p2p_finish(colld_daemon_t *d, colld_xfer_t *x)
{
    colld_dcomm_t *c = x->comm;
    colld_op_t *s = x->send, *r = x->recv;
    s->p2p_state = r->p2p_state = COLLD_P2P_DONE;
    s->p2p_status = r->p2p_status = x->status;
    if (x->status == COLLD_OK) {
        c->ops_completed++;
        uint64_t first = COLLD_MIN(s->arrival_ns, r->arrival_ns);
        if (x->end_ns > first)
            colld_count_latency(d, COLLD_KIND_SEND, x->end_ns - first);
    } else {
        c->ops_failed++;
    }
    flush(c, s->member);
    flush(c, r->member);
    c->p2p_dirty = true; /* the next operations of both ranks may run now */
    colld_comm_unref(d, c);
    free(x);
}
