/*
 * p2p.c - point-to-point operations: sends and receives between two ranks of a single-node
 * communicator, matched and run by the engine.
 *
 * Order (MPI's rule): the k-th send of rank a to rank b meets the k-th receive of rank b from rank
 * a, and nothing else orders a rank's sends and receives among themselves: a send to b never waits
 * behind an unmatched send to c, nor a receive behind a send (issue 25: torch 2.x posts CPU sends
 * and receives one at a time, so a ring of isend to the right and irecv from the left, outside a
 * group, must run). Against its rank's collectives a send or receive keeps its place: its d.seq is
 * the ordinal of the rank's next collective (proto/wire.h). It is *released* once the collectives
 * the rank posted before it have completed (no collective of the communicator runs and none before
 * it waits in the rank's queue of collectives), and the rank's next collective waits until the
 * point-to-point operations posted before it have completed (colld_p2p_holds, match.c). Releases
 * follow posting order, so a rank's released operations are a prefix of its queue (member
 * p2p_open: the first one not released).
 *
 * Batches. Operations posted inside one group (colld_group_start/end) are linked (COLLD_SQE_LINK):
 * a batch is the run of a rank's operations up to and including the first without the flag; an
 * operation outside a group is a batch of one. On host buffers a batch is nothing more: each of its
 * operations meets its peer on its own. A stream-ordered batch (GPU buffers) is all or nothing: the
 * CUDA backend takes it as ready when its rank's stream has reached its last operation and writes
 * its `done` once all of it has finished, so it goes only as its rank's head batch (every operation
 * the rank posted before it has completed), and then its operations meet their peers in any order.
 *
 * Matching, O(1) per arrival (issue 26). At admission every send and receive goes into the index of
 * its communicator: a hash table of pairs of ranks (src, dst), each holding the unmatched sends of
 * src to dst and the unmatched receives of dst from src in posting order (an operation's place in
 * its list is its per-pair sequence number, so only the two heads can meet). An operation *may go*
 * once it is released (and, stream-ordered, in its rank's head batch). Whatever can let two heads
 * meet (an operation queued at a head, released, made a head, or part of a head batch) puts the pair
 * on the communicator's list of pairs to look at; the engine looks at those and at nothing else:
 * nothing is rescanned when a transfer completes. The heads must have the same dtype and count,
 * else the communicator fails with COLLD_ERR_MISMATCH naming both calls; both on host buffers or
 * both on GPU buffers (stream-ordered), else COLLD_ERR_NOT_SUPPORTED. Each engine pass a tenant's
 * matching work (operations released, pairs looked at, transfers started) is bounded
 * (COLLD_P2P_BUDGET, counted over all its communicators); the rest waits for the next pass, so one
 * tenant's backlog cannot hold the daemon lock for long.
 *
 * A matched pair is a transfer (colld_xfer_t) handed to the first backend that runs transfers and
 * claims the send: the host backend copies outside the lock, straight from the sender's mapped
 * buffer into the receiver's (zero copy, as the collectives); the CUDA backend copies GPU buffers on
 * its stream once both ranks' streams have reached the operations
 * (server/backends/cuda/cuda_p2p.c), and times out those whose streams never get there (this
 * file's time-out covers operations still unmatched).
 *
 * Completions go out in each rank's posting order: an operation whose transfer is done stays in
 * its rank's queue until the ones before it are done too, so a client's "every operation up to N
 * has completed" stays true. An operation that waits for its peer longer than the communicator's
 * time-out fails it with COLLD_ERR_TIMEOUT naming what is missing ("rank 3 never sent to rank 5
 * ..."): the unmatched operations are kept in arrival order, so the oldest is at hand.
 * All functions run with daemon->lock held.
 */
#include "server/core/counters.h"
#include "server/core/daemon.h"

#include "common/log.h"
#include "common/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define FIRST_BUCKETS 64u

/* ============================================================================================
 * The index: pairs of ranks and their unmatched operations
 * ========================================================================================== */

static unsigned pair_hash(const colld_dcomm_t *c, int src, int dst)
{
    uint64_t k = (uint64_t)(uint32_t)src * (uint64_t)(uint32_t)c->nranks + (uint32_t)dst;
    return (unsigned)((k * 0x9e3779b97f4a7c15ull) >> 32) & (c->p2p_nbuckets - 1);
}

static colld_p2p_pair_t *pair_find(const colld_dcomm_t *c, int src, int dst)
{
    if (!c->p2p_nbuckets)
        return NULL;
    for (colld_p2p_pair_t *p = c->p2p_buckets[pair_hash(c, src, dst)]; p; p = p->hnext)
        if (p->src == src && p->dst == dst)
            return p;
    return NULL;
}

/* Twice the buckets (the first FIRST_BUCKETS), rehashed; without memory the chains just grow. */
static void index_grow(colld_dcomm_t *c)
{
    unsigned n = c->p2p_nbuckets ? 2 * c->p2p_nbuckets : FIRST_BUCKETS;
    colld_p2p_pair_t **b = n > c->p2p_nbuckets ? calloc(n, sizeof(*b)) : NULL;
    if (!b)
        return;
    colld_p2p_pair_t **old = c->p2p_buckets;
    unsigned oldn = c->p2p_nbuckets;
    c->p2p_buckets = b;
    c->p2p_nbuckets = n;
    for (unsigned i = 0; i < oldn; i++)
        for (colld_p2p_pair_t *p = old[i], *next; p; p = next) {
            next = p->hnext;
            unsigned h = pair_hash(c, p->src, p->dst);
            p->hnext = b[h];
            b[h] = p;
        }
    free(old);
}

/* The pair (src, dst), made when it is not in the index; NULL without memory. */
static colld_p2p_pair_t *pair_get(colld_dcomm_t *c, int src, int dst)
{
    colld_p2p_pair_t *p = pair_find(c, src, dst);
    if (p)
        return p;
    if (c->p2p_npairs >= c->p2p_nbuckets)
        index_grow(c);
    if (!c->p2p_nbuckets || !(p = calloc(1, sizeof(*p))))
        return NULL;
    p->src = src;
    p->dst = dst;
    unsigned h = pair_hash(c, src, dst);
    p->hnext = c->p2p_buckets[h];
    c->p2p_buckets[h] = p;
    c->p2p_npairs++;
    return p;
}

/* Put a pair on the communicator's list of pairs to look at (once). */
static void look_add(colld_dcomm_t *c, colld_p2p_pair_t *p)
{
    if (p->listed)
        return;
    p->listed = true;
    p->cnext = NULL;
    p->cprev = c->p2p_look_tail;
    if (c->p2p_look_tail)
        c->p2p_look_tail->cnext = p;
    else
        c->p2p_look = p;
    c->p2p_look_tail = p;
}

static void look_remove(colld_dcomm_t *c, colld_p2p_pair_t *p)
{
    if (!p->listed)
        return;
    p->listed = false;
    if (p->cprev)
        p->cprev->cnext = p->cnext;
    else
        c->p2p_look = p->cnext;
    if (p->cnext)
        p->cnext->cprev = p->cprev;
    else
        c->p2p_look_tail = p->cprev;
    p->cprev = p->cnext = NULL;
}

/* A pair without unmatched operations leaves the index (and a large index empties). */
static void pair_drop_if_empty(colld_dcomm_t *c, colld_p2p_pair_t *p)
{
    if (p->sends || p->recvs)
        return;
    look_remove(c, p);
    colld_p2p_pair_t **pp = &c->p2p_buckets[pair_hash(c, p->src, p->dst)];
    while (*pp != p)
        pp = &(*pp)->hnext;
    *pp = p->hnext;
    free(p);
    if (--c->p2p_npairs == 0 && c->p2p_nbuckets > FIRST_BUCKETS) {
        free(c->p2p_buckets);
        c->p2p_buckets = NULL;
        c->p2p_nbuckets = 0;
    }
}

void colld_p2p_comm_free(colld_dcomm_t *c)
{
    for (unsigned i = 0; i < c->p2p_nbuckets; i++)
        for (colld_p2p_pair_t *p = c->p2p_buckets[i], *next; p; p = next) {
            next = p->hnext;
            free(p);
        }
    free(c->p2p_buckets);
    c->p2p_buckets = NULL;
    c->p2p_nbuckets = c->p2p_npairs = 0;
    c->p2p_look = c->p2p_look_tail = NULL;
}

/* Take an operation out of its pair's list and the list of unmatched ones (it met its peer or
 * failed). Returns its pair, NULL when it was in none. */
static colld_p2p_pair_t *op_unlink(colld_dcomm_t *c, colld_op_t *op)
{
    colld_p2p_pair_t *p = op->p2p_pair;
    if (!p)
        return NULL;
    bool send = op->d.kind == COLLD_KIND_SEND;
    if (op->pair_prev)
        op->pair_prev->pair_next = op->pair_next;
    else if (send)
        p->sends = op->pair_next;
    else
        p->recvs = op->pair_next;
    if (op->pair_next)
        op->pair_next->pair_prev = op->pair_prev;
    else if (send)
        p->sends_tail = op->pair_prev;
    else
        p->recvs_tail = op->pair_prev;
    if (op->wait_prev)
        op->wait_prev->wait_next = op->wait_next;
    else
        c->p2p_wait_head = op->wait_next;
    if (op->wait_next)
        op->wait_next->wait_prev = op->wait_prev;
    else
        c->p2p_wait_tail = op->wait_prev;
    op->p2p_pair = NULL;
    op->pair_prev = op->pair_next = op->wait_prev = op->wait_next = NULL;
    return p;
}

/* ============================================================================================
 * Queues, releases and batches
 * ========================================================================================== */

/* Whether the collectives rank m posted before op have completed: none of the communicator runs
 * (a running one was posted by every rank before any point-to-point operation still queued, or it
 * would not have matched) and none waits in m's queue before it. */
static bool released_now(const colld_dcomm_t *c, const colld_member_t *m, const colld_op_t *op)
{
    return c->colls_running == 0 && (!m->head || m->head->d.seq >= op->d.seq);
}

/* Whether an operation may meet its peer now: released, and a stream-ordered one in its rank's
 * head batch. */
static bool may_go(const colld_op_t *op)
{
    if (!op->p2p_released)
        return false;
    if (!(op->d.flags & COLLD_SQE_STREAM))
        return true;
    const colld_op_t *h = op->member->p2p_head;
    return h && h->p2p_batch == op->p2p_batch;
}

/* An operation may go now: its pair is looked at when it heads its list. */
static void became_ready(colld_dcomm_t *c, colld_op_t *op)
{
    if (op->p2p_pair && !op->pair_prev)
        look_add(c, op->p2p_pair);
}

/* Release rank m's operations in posting order while the collectives before them have completed,
 * at most `budget` of them. Returns how many. */
static int release(colld_dcomm_t *c, colld_member_t *m, int budget)
{
    int n = 0;
    while (m->p2p_open && n < budget && released_now(c, m, m->p2p_open)) {
        colld_op_t *op = m->p2p_open;
        m->p2p_open = op->next;
        op->p2p_released = true;
        if (op->p2p_state == COLLD_P2P_QUEUED && may_go(op))
            became_ready(c, op);
        n++;
    }
    return n;
}

/* Rank m's head moved to another batch: a stream-ordered one may go now (each batch is looked at
 * once; its later operations are looked at as they are posted or released). */
static void head_moved(colld_dcomm_t *c, colld_member_t *m)
{
    const colld_op_t *h = m->p2p_head;
    if (!h || !(h->d.flags & COLLD_SQE_STREAM) || m->p2p_walked == h->p2p_batch)
        return;
    m->p2p_walked = h->p2p_batch;
    for (colld_op_t *op = m->p2p_head; op && op->p2p_batch == h->p2p_batch; op = op->next)
        if (op->p2p_state == COLLD_P2P_QUEUED && op->p2p_released)
            became_ready(c, op);
}

int colld_p2p_enqueue(colld_dcomm_t *c, colld_member_t *m, colld_op_t *op)
{
    bool send = op->d.kind == COLLD_KIND_SEND;
    colld_p2p_pair_t *p = pair_get(c, send ? m->rank : op->d.root, send ? op->d.root : m->rank);
    if (!p)
        return -1;
    op->arrival_ns = colld_now_ns();
    op->p2p_state = COLLD_P2P_QUEUED;
    op->p2p_status = COLLD_OK;
    op->p2p_released = false;
    op->p2p_batch = m->p2p_linked ? m->p2p_batches : ++m->p2p_batches;
    m->p2p_linked = op->d.flags & COLLD_SQE_LINK;
    /* Its rank's queue, in posting order. */
    op->next = NULL;
    if (m->p2p_tail)
        m->p2p_tail->next = op;
    else
        m->p2p_head = op;
    m->p2p_tail = op;
    /* Its pair's list, in posting order. */
    colld_op_t **tail = send ? &p->sends_tail : &p->recvs_tail;
    op->p2p_pair = p;
    op->pair_next = NULL;
    op->pair_prev = *tail;
    if (*tail)
        (*tail)->pair_next = op;
    else if (send)
        p->sends = op;
    else
        p->recvs = op;
    *tail = op;
    /* The unmatched operations, in arrival order. */
    op->wait_next = NULL;
    op->wait_prev = c->p2p_wait_tail;
    if (c->p2p_wait_tail)
        c->p2p_wait_tail->wait_next = op;
    else
        c->p2p_wait_head = op;
    c->p2p_wait_tail = op;
    c->p2p_queued++;
    /* Released at once when nothing before it holds it back. */
    if (!m->p2p_open) {
        if (released_now(c, m, op))
            op->p2p_released = true;
        else
            m->p2p_open = op;
    }
    if (m->p2p_head->p2p_batch == op->p2p_batch)
        m->p2p_walked = op->p2p_batch; /* its batch is the head batch: each operation looked at as it comes */
    if (may_go(op))
        became_ready(c, op);
    return 0;
}

bool colld_p2p_holds(const colld_member_t *m, uint64_t ord)
{
    return m->p2p_head && m->p2p_head->d.seq <= ord;
}

/* Post the completions of rank m's leading operations that are done, in posting order. */
static void flush(colld_dcomm_t *c, colld_member_t *m)
{
    bool moved = false;
    while (m->p2p_head && m->p2p_head->p2p_state == COLLD_P2P_DONE) {
        colld_op_t *op = m->p2p_head;
        m->p2p_head = op->next;
        if (m->p2p_open == op)
            m->p2p_open = op->next;
        c->p2p_queued--;
        colld_op_retire(op, op->p2p_status);
        moved = true;
    }
    if (!m->p2p_head)
        m->p2p_tail = NULL;
    else if (moved)
        head_moved(c, m);
}

void colld_p2p_fail_queue(colld_dcomm_t *c, colld_member_t *m, colld_status_t st, bool all)
{
    for (colld_op_t *op = m->p2p_head; op; op = op->next)
        if (op->p2p_state == COLLD_P2P_QUEUED &&
            (all || m->left || c->ranks[op->d.root].left || (op->d.flags & COLLD_SQE_STREAM))) {
            colld_p2p_pair_t *p = op_unlink(c, op);
            op->p2p_state = COLLD_P2P_DONE;
            op->p2p_status = st;
            c->ops_failed++;
            if (p) {
                look_add(c, p); /* its new heads may meet (a closing communicator goes on) */
                pair_drop_if_empty(c, p);
            }
        }
    flush(c, m);
    c->p2p_dirty = true; /* its collectives failed: what they held back is released */
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

/* Whether op is released, or would be now (its release may wait for the next pass). */
static bool released_or_due(const colld_dcomm_t *c, const colld_op_t *op)
{
    return op->p2p_released || released_now(c, op->member, op);
}

/* Whether op could meet its peer now (released or due, and a stream-ordered one in its head batch). */
static bool can_go(const colld_dcomm_t *c, const colld_op_t *op)
{
    if (!released_or_due(c, op))
        return false;
    const colld_op_t *h = op->member->p2p_head;
    return !(op->d.flags & COLLD_SQE_STREAM) || (h && h->p2p_batch == op->p2p_batch);
}

int colld_p2p_describe_rank(char *buf, size_t len, const colld_dcomm_t *c, int r)
{
    const colld_member_t *m = &c->ranks[r];
    if (m->left || !m->session)
        return put(buf, len, "has left the communicator");
    if (m->p2p_head && !released_or_due(c, m->p2p_head) && m->head)
        return put(buf, len, "has point-to-point operations queued behind %s (collective #%llu), which has not run",
                   colld_kind_name(m->head->d.kind), (unsigned long long)m->head->d.seq);
    if (m->p2p_head) {
        /* Its released operations still waiting for their peers, in posting order. */
        int off = put(buf, len, "waits in its own point-to-point operations:");
        int shown = 0;
        for (const colld_op_t *op = m->p2p_head; op && shown < 4 && released_or_due(c, op); op = op->next) {
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
    char name[192];
    colld_p2p_op_text(name, sizeof(name), send ? "send" : "receive", send, size, b, op->id);
    int off = put(buf, len, "rank %d (pid %d) waited %llu ms to %s; ", a, (int)op->session->pid,
                  (unsigned long long)(now > op->arrival_ns ? (now - op->arrival_ns) / 1000000ull : 0), name);
    if (!can_go(c, op)) {
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

/* The deadlock check's candidates: ordered by rank, then operation id (stable reports). */
static int by_rank_id(const void *a, const void *b)
{
    const colld_op_t *x = *(const colld_op_t *const *)a, *y = *(const colld_op_t *const *)b;
    if (x->member->rank != y->member->rank)
        return x->member->rank < y->member->rank ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Whether op, the head of its pair's list, waits for its peer: it may go, its rank is here, and the
 * other list has no head that may go (they would meet in the next look). */
static bool head_waits(const colld_op_t *op, const colld_op_t *other)
{
    const colld_member_t *m = op->member;
    return may_go(op) && !m->remote && m->session && !(other && may_go(other));
}

void colld_p2p_waits(const colld_dcomm_t *c, void (*fn)(void *arg, const colld_op_t *op), void *arg)
{
    /* One edge per pair at most: the head of its list that waits (those behind it wait for the same
     * peer), so the check's work follows the pairs in use, not the operations queued. */
    const colld_op_t **found = c->p2p_npairs ? calloc(c->p2p_npairs, sizeof(*found)) : NULL;
    size_t n = 0;
    for (unsigned i = 0; i < c->p2p_nbuckets; i++)
        for (const colld_p2p_pair_t *p = c->p2p_buckets[i]; p; p = p->hnext) {
            const colld_op_t *op = NULL;
            if (p->sends && head_waits(p->sends, p->recvs))
                op = p->sends;
            else if (p->recvs && head_waits(p->recvs, p->sends))
                op = p->recvs;
            if (!op)
                continue;
            if (found && n < c->p2p_npairs)
                found[n++] = op;
            else
                fn(arg, op); /* without memory: unordered */
        }
    if (n > 1)
        qsort(found, n, sizeof(*found), by_rank_id);
    for (size_t i = 0; i < n; i++)
        fn(arg, found[i]);
    free(found);
}

uint64_t colld_p2p_describe_wait(char *buf, size_t len, const colld_dcomm_t *c, uint64_t now)
{
    const colld_op_t *op = c->p2p_wait_head;
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

/* Hand a matched send and receive (out of the index already) to the backend that runs them.
 * Returns 0, or -1 when the communicator broke (no memory, no backend). */
static int start_xfer(colld_daemon_t *d, colld_dcomm_t *c, colld_op_t *s, colld_op_t *r)
{
    /* On failure s and r are still queued (out of the index): the break fails them. */
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

/* Let the heads of pair p meet while both may go, within the tenant's budget (*left: one unit per
 * transfer started). Returns the transfers started, or -1 when the communicator broke (p may be
 * gone then). */
static int match_pair(colld_daemon_t *d, colld_dcomm_t *c, colld_p2p_pair_t *p, int *left)
{
    int started = 0;
    for (;;) {
        colld_op_t *s = p->sends, *r = p->recvs;
        if (!s || !r || !may_go(s) || !may_go(r))
            return started;
        if (*left <= 0) {
            look_add(c, p); /* the next pass goes on */
            return started;
        }
        if (r->d.dtype != s->d.dtype || r->d.count != s->d.count || ((r->d.flags ^ s->d.flags) & COLLD_SQE_STREAM)) {
            report_mismatch(d, c, s, r);
            return -1;
        }
        op_unlink(c, s);
        op_unlink(c, r);
        bool last = !p->sends && !p->recvs;
        if (last)
            pair_drop_if_empty(c, p);
        (*left)--;
        if (start_xfer(d, c, s, r) < 0)
            return -1;
        started++;
        if (last)
            return started;
    }
}

/* The matching budget of c's tenant in this pass: shared by its communicators (the first
 * COLLD_P2P_TENANTS tenants of a pass; a further one's is per communicator, in *own). */
static int *budget_of(colld_daemon_t *d, const colld_dcomm_t *c, int *own)
{
    int whole = d->p2p_budget > 0 ? d->p2p_budget : COLLD_P2P_BUDGET;
    for (unsigned i = 0; i < d->p2p_ntenants; i++)
        if (d->p2p_tenants[i].uid == c->tenant)
            return &d->p2p_tenants[i].left;
    if (d->p2p_ntenants < COLLD_P2P_TENANTS) {
        unsigned i = d->p2p_ntenants++;
        d->p2p_tenants[i].uid = c->tenant;
        d->p2p_tenants[i].left = whole;
        return &d->p2p_tenants[i].left;
    }
    *own = whole;
    return own;
}

void colld_p2p_pass_begin(colld_daemon_t *d)
{
    d->p2p_ntenants = 0;
}

int colld_p2p_progress(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now, uint64_t *deadline)
{
    int own = 0, work = 0;
    int *left = budget_of(d, c, &own);
    /* A collective completed: release what it held back, rank by rank. */
    if (c->p2p_dirty && *left > 0) {
        bool all = true;
        for (int r = 0; r < c->nranks && all; r++) {
            colld_member_t *m = &c->ranks[r];
            if (m->remote || !m->p2p_open)
                continue;
            int n = release(c, m, *left);
            *left -= n;
            work += n;
            all = !m->p2p_open || !released_now(c, m, m->p2p_open);
        }
        c->p2p_dirty = !all;
    }
    /* The pairs whose heads may meet: one unit to look at each. */
    while (c->p2p_look && *left > 0) {
        colld_p2p_pair_t *p = c->p2p_look;
        look_remove(c, p);
        (*left)--;
        int n = match_pair(d, c, p, left);
        if (n < 0)
            return work + 1;
        work += n;
    }
    if (c->p2p_dirty || c->p2p_look) {
        /* Out of budget: the rest in the next pass, at once (time-outs wait until it is done). */
        *deadline = now;
        return work + 1;
    }
    const colld_op_t *oldest = c->p2p_wait_head;
    if (!oldest)
        return work;
    uint64_t due = oldest->arrival_ns + (uint64_t)c->timeout_ms * 1000000ull;
    if (due <= now) {
        report_timeout(d, c, oldest, now);
        return work + 1;
    }
    if (due < *deadline)
        *deadline = due;
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
    /* Nothing else to look at: the operations behind them meet their peers on their own; a
     * stream-ordered batch that becomes its rank's head batch is made ready by flush. */
    flush(c, s->member);
    flush(c, r->member);
    colld_comm_unref(d, c);
    free(x);
}
