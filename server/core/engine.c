/*
 * engine.c - the progress engine: one thread that drains every session's submission ring,
 * validates each descriptor, matches the ranks of a communicator by sequence number, runs the
 * collective on the host backend and posts completions.
 *
 * Idle policy: after the last piece of work the thread busy-polls for spin_us, then sets
 * need_wakeup in every session's ring and sleeps in epoll on the sessions' eventfds (and its own
 * wake eventfd), with a timeout at the next collective/join deadline. An idle daemon therefore
 * uses no CPU, and a client posting to an awake daemon makes no system call.
 */
#include "server/core/daemon.h"

#include "common/log.h"
#include "transport/shm/ring.h"
#include "common/util.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef colld_coll_t coll_t;

/* Operation records are recycled through a free list (lock held), so the per-collective path does
 * not call the allocator for them. */
#define OP_FREE_MAX 4096

/* How long the engine busy-polls GPU flags and events before it polls them once a millisecond. */
#define GPU_SPIN_NS 2000000ull

static colld_op_t *op_alloc(colld_daemon_t *d)
{
    colld_op_t *op = d->op_free;
    if (op) {
        d->op_free = op->next;
        d->op_free_n--;
        memset(op, 0, sizeof(*op));
        return op;
    }
    return calloc(1, sizeof(*op));
}

static void op_release(colld_daemon_t *d, colld_op_t *op)
{
    if (d->op_free_n >= OP_FREE_MAX) {
        free(op);
        return;
    }
    op->next = d->op_free;
    d->op_free = op;
    d->op_free_n++;
}

/* ============================================================================================
 * Completions
 * ========================================================================================== */

/* Ask the loop thread to drop a session that broke the ring protocol. */
static void session_kill(colld_session_t *s, const char *why)
{
    if (s->kill_requested)
        return;
    LOG_WARN_RL(ENGINE, "session %llu (pid %d): %s; dropping it", (unsigned long long)s->id, (int)s->pid, why);
    s->kill_requested = true;
    uv_async_send(&s->daemon->async);
}

/* Post one completion to a session's completion ring and ring its doorbell (lock held). The
 * engine admitted this operation only with a free completion slot reserved for it, so a full ring
 * here means the client moved its tail backwards: a protocol violation. */
void colld_engine_complete(colld_session_t *s, uint32_t handle, uint64_t seq, colld_status_t st)
{
    s->in_flight--;
    if (s->dead || s->kill_requested)
        return;
    int64_t space = colld_ring_space(&s->shm->cq, s->cq_head, s->entries);
    if (space <= 0) {
        session_kill(s, "completion ring overrun (corrupt tail)");
        return;
    }
    colld_wire_cqe_t *e = &s->cqes[s->cq_head & (s->entries - 1)];
    e->seq = seq;
    e->comm = handle;
    e->status = st;
    s->cq_head++;
    COLLD_STORE_REL(&s->shm->cq.head, s->cq_head);
    colld_doorbell_ring(&s->shm->cq);
}

/* Post the notices a broken communicator owes its ranks (completion records with sequence
 * number 0), each only into a free completion slot not reserved for an admitted operation;
 * the rest are retried by the engine (lock held). */
void colld_engine_post_notices(colld_dcomm_t *c)
{
    for (int r = 0; r < c->nranks && c->notices_pending > 0; r++) {
        colld_member_t *m = &c->ranks[r];
        colld_session_t *s = m->session;
        if (!m->notify || !s)
            continue;
        if (!s->dead && !s->kill_requested) {
            int64_t space = colld_ring_space(&s->shm->cq, s->cq_head, s->entries);
            if (space <= (int64_t)s->in_flight)
                continue; /* no unreserved slot yet */
            s->in_flight++; /* colld_engine_complete counts it back */
            colld_engine_complete(s, m->handle, 0, c->error);
        }
        m->notify = false;
        c->notices_pending--;
    }
}

/* The payload per rank of a descriptor, for the metrics (0 when its fields are garbage). */
static uint64_t payload_bytes(const colld_wire_sqe_t *d)
{
    uint64_t bytes;
    if (d->dtype >= COLLD_DTYPE_COUNT || !colld_mul_ok(d->count, colld_dtype_size((colld_dtype_t)d->dtype), &bytes))
        return 0;
    return bytes;
}

/* Post a descriptor's completion, or for a fast-path record (which the ranks completed
 * themselves) just give back the completion slot reserved for it (lock held). */
static void retire(colld_session_t *s, const colld_wire_sqe_t *sqe, colld_status_t st)
{
    if (sqe->flags & COLLD_SQE_FAST)
        s->in_flight--;
    else
        colld_engine_complete(s, sqe->comm, sqe->seq, st);
}

/* A stream-ordered descriptor that fails: its rank's GPU stream must not wait for it (lock held). */
static void release_stream(colld_session_t *s, const colld_wire_sqe_t *sqe, colld_status_t st)
{
    if (!(sqe->flags & COLLD_SQE_STREAM) || st == COLLD_OK)
        return;
    colld_member_t *m = colld_comm_member(s, sqe->comm);
    if (m)
        colld_gpu_owe_release(m->comm, m->rank, sqe->reserved + (uint32_t)sqe->seq, st);
}

/* Complete a descriptor that was never queued, and count it (lock held). */
static void complete_sqe(colld_daemon_t *d, colld_session_t *s, const colld_wire_sqe_t *sqe, colld_status_t st)
{
    if (!(sqe->flags & COLLD_SQE_FAST))
        colld_metrics_op(d, sqe->kind, sqe->dtype, payload_bytes(sqe), st);
    release_stream(s, sqe, st);
    retire(s, sqe, st);
}

/* Complete a queued op with a status and free it (lock held). */
void colld_engine_fail_op(colld_op_t *op, colld_status_t st)
{
    /* A failed record is that rank's collective failing (a finished one is retired by
     * drop_record, and the ranks count those themselves). */
    colld_metrics_op(op->session->daemon, op->d.kind, op->d.dtype, payload_bytes(&op->d), st);
    release_stream(op->session, &op->d, st);
    retire(op->session, &op->d, st);
    if (op->send_reg)
        colld_session_release_reg(op->send_reg);
    if (op->recv_reg)
        colld_session_release_reg(op->recv_reg);
    colld_daemon_t *d = op->session->daemon;
    colld_session_unref(op->session);
    op_release(d, op);
}

/* ============================================================================================
 * Admission: validate a descriptor before anything touches memory
 * ========================================================================================== */

/* Resolve a buffer reference of `bytes` bytes to a pointer in a registration of the session.
 * Returns 0, or -1 with a detail. */
static int resolve_buf(colld_session_t *s, const colld_wire_buf_t *b, uint64_t bytes, size_t align,
                       const char *which, colld_reg_t **reg, void **ptr, char *detail, size_t len)
{
    *reg = NULL;
    *ptr = NULL;
    if (bytes == 0)
        return 0;
    colld_reg_t *r = colld_session_find_reg(s, b->reg_id);
    if (!r) {
        snprintf(detail, len, "%s buffer: registration %u is not one of this process's buffers", which, b->reg_id);
        return -1;
    }
    if (b->offset > r->size || bytes > r->size - b->offset) {
        snprintf(detail, len, "%s buffer: %llu bytes at offset %llu overrun its %llu-byte registration", which,
                 (unsigned long long)bytes, (unsigned long long)b->offset, (unsigned long long)r->size);
        return -1;
    }
    /* Registrations start on a page, so an aligned offset is an aligned address: the kernels
     * load whole elements. */
    if (b->offset % align) {
        snprintf(detail, len, "%s buffer: offset %llu is not a multiple of the element size (%zu bytes)", which,
                 (unsigned long long)b->offset, align);
        return -1;
    }
    r->refs++;
    *reg = r;
    *ptr = (char *)r->base + b->offset;
    return 0;
}

/* True for the collectives whose root matters. */
static bool has_root(unsigned kind)
{
    return kind == COLLD_KIND_BROADCAST || kind == COLLD_KIND_REDUCE;
}

/* True for the collectives that take a reduction op. */
static bool has_op(unsigned kind)
{
    return kind == COLLD_KIND_ALLREDUCE || kind == COLLD_KIND_REDUCE || kind == COLLD_KIND_REDUCESCATTER;
}

/* A rank's two buffers either do not overlap or are in place as NCCL defines it (the same buffer;
 * for all-gather the send buffer is the rank's slice of the receive buffer, for reduce-scatter the
 * receive buffer is the rank's slice of the send buffer). Anything else would have the host
 * backend copy between overlapping ranges. */
static bool in_place_or_apart(const colld_wire_sqe_t *d, const colld_op_t *op, uint64_t send_bytes,
                              uint64_t recv_bytes, uint64_t bytes, int rank)
{
    if (!op->send_reg || op->send_reg != op->recv_reg)
        return true;
    uint64_t so = d->send.offset, ro = d->recv.offset; /* in bounds: resolve_buf checked them */
    if (so + send_bytes <= ro || ro + recv_bytes <= so)
        return true;
    uint64_t slice = (uint64_t)rank * bytes;
    switch (d->kind) {
    case COLLD_KIND_ALLGATHER:
        return so == ro + slice;
    case COLLD_KIND_REDUCESCATTER:
        return ro == so + slice;
    default:
        return so == ro;
    }
}

/* Check a descriptor's own fields and buffers: the bytes each buffer must hold depend on the
 * collective, the rank and the root (NCCL's rules: a non-root's broadcast send buffer and reduce
 * receive buffer are not used; all-gather receives and reduce-scatter sends nranks x count).
 * Returns COLLD_OK or an error with a detail. */
static colld_status_t validate(colld_session_t *s, colld_op_t *op, char *detail, size_t len)
{
    const colld_wire_sqe_t *d = &op->d;
    int rank = op->member->rank, nranks = op->member->comm->nranks;
    if (d->kind < COLLD_KIND_ALLREDUCE || d->kind > COLLD_KIND_REDUCESCATTER) {
        snprintf(detail, len, "unknown collective kind %u", d->kind);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (d->dtype >= COLLD_DTYPE_COUNT) {
        snprintf(detail, len, "unknown dtype %u", d->dtype);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (has_op(d->kind) && d->redop >= COLLD_REDOP_COUNT) {
        snprintf(detail, len, "unknown reduction op %u", d->redop);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (has_root(d->kind) && (d->root < 0 || d->root >= nranks)) {
        snprintf(detail, len, "root %d is out of range for %d ranks", d->root, nranks);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    uint64_t bytes, all;
    if (!colld_mul_ok(d->count, colld_dtype_size((colld_dtype_t)d->dtype), &bytes) ||
        !colld_mul_ok(bytes, (uint64_t)nranks, &all)) {
        snprintf(detail, len, "count %llu overflows", (unsigned long long)d->count);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (d->flags & COLLD_SQE_FAST) {
        /* A record: the ranks used their fast area, no buffer of theirs is touched here. */
        if (!op->member->comm->fast) {
            snprintf(detail, len, "fast-path record on a communicator without a fast area");
            return COLLD_ERR_INVALID_ARGUMENT;
        }
        return COLLD_OK;
    }
    uint64_t send_bytes = bytes, recv_bytes = bytes;
    switch (d->kind) {
    case COLLD_KIND_BROADCAST:
        send_bytes = rank == d->root ? bytes : 0;
        break;
    case COLLD_KIND_REDUCE:
        recv_bytes = rank == d->root ? bytes : 0;
        break;
    case COLLD_KIND_ALLGATHER:
        recv_bytes = all;
        break;
    case COLLD_KIND_REDUCESCATTER:
        send_bytes = all;
        break;
    default:
        break;
    }
    bool stream = d->flags & COLLD_SQE_STREAM;
    if (stream) {
        colld_daemon_t *dm = s->daemon;
        if (!dm->gpus) {
            snprintf(detail, len, "GPU collective, but no GPU here: %.160s", dm->gpu_none);
            return COLLD_ERR_NOT_SUPPORTED;
        }
        if (op->member->comm->x) {
            snprintf(detail, len, "GPU collectives on a multi-node communicator are not supported yet");
            return COLLD_ERR_NOT_SUPPORTED;
        }
        if (!s->gpu_flags || d->comm >= s->gpu_lines) {
            snprintf(detail, len, "GPU collective without a GPU flag line for communicator handle %u", d->comm);
            return COLLD_ERR_INVALID_ARGUMENT;
        }
        colld_member_t *m = op->member;
        if (m->gpu_base_set && d->reserved != m->gpu_base) {
            snprintf(detail, len, "GPU collective with flag base %u where the communicator uses %u", d->reserved,
                     m->gpu_base);
            return COLLD_ERR_INVALID_ARGUMENT;
        }
        m->gpu_base_set = true;
        m->gpu_base = d->reserved;
        m->gpu_last = d->reserved + (uint32_t)d->seq;
    }
    size_t es = colld_dtype_size((colld_dtype_t)d->dtype);
    if (resolve_buf(s, &d->send, send_bytes, es, "send", &op->send_reg, &op->send_ptr, detail, len) < 0 ||
        resolve_buf(s, &d->recv, recv_bytes, es, "recv", &op->recv_reg, &op->recv_ptr, detail, len) < 0)
        return COLLD_ERR_INVALID_ARGUMENT;
    /* GPU memory only in stream-ordered collectives, host memory only in the others: the host
     * backend never dereferences a device address. */
    if ((op->send_reg && op->send_reg->cuda != stream) || (op->recv_reg && op->recv_reg->cuda != stream)) {
        snprintf(detail, len, stream ? "GPU collective on a host buffer (registration %u)"
                                     : "host collective on a GPU buffer (registration %u)",
                 op->send_reg && op->send_reg->cuda != stream ? d->send.reg_id : d->recv.reg_id);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (!in_place_or_apart(d, op, send_bytes, recv_bytes, bytes, rank)) {
        snprintf(detail, len, "send (offset %llu, %llu bytes) and recv (offset %llu, %llu bytes) overlap without being "
                 "in place (in place: the same buffer%s)", (unsigned long long)d->send.offset,
                 (unsigned long long)send_bytes, (unsigned long long)d->recv.offset, (unsigned long long)recv_bytes,
                 d->kind == COLLD_KIND_ALLGATHER       ? ", or sendbuf at the rank's slice of recvbuf"
                 : d->kind == COLLD_KIND_REDUCESCATTER ? ", or recvbuf at the rank's slice of sendbuf"
                                                       : "");
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    return COLLD_OK;
}

/* Admit one descriptor: queue it on its rank, or complete it at once with an error. A rank whose
 * descriptor is invalid breaks the communicator for every rank, so no peer waits for it. */
static void admit(colld_daemon_t *d, colld_session_t *s, const colld_wire_sqe_t *sqe, colld_reply_t **replies)
{
    char detail[COLLD_DETAIL_LEN / 2] = ""; /* leaves room for the rank prefix in `why` */
    colld_member_t *m = colld_comm_member(s, sqe->comm);
    if (!m) {
        LOG_INFO_RL(ENGINE, "session %llu: descriptor for unknown communicator handle %u", (unsigned long long)s->id,
                 sqe->comm);
        complete_sqe(d, s, sqe, COLLD_ERR_INVALID_ARGUMENT);
        return;
    }
    colld_dcomm_t *c = m->comm;
    if (c->state != COLLD_COMM_READY) {
        c->ops_failed++;
        complete_sqe(d, s, sqe, c->state == COLLD_COMM_JOINING ? COLLD_ERR_INVALID_USAGE : c->error);
        return;
    }
    /* With a fast area, the sequence numbers of collectives the ranks ran there without waiting
     * are skipped. */
    if (c->fast ? sqe->seq < m->next_seq : sqe->seq != m->next_seq) {
        snprintf(detail, sizeof(detail), "rank %d (pid %d) posted sequence number %llu where %s%llu was due", m->rank,
                 (int)s->pid, (unsigned long long)sqe->seq, c->fast ? "at least " : "",
                 (unsigned long long)m->next_seq);
        complete_sqe(d, s, sqe, COLLD_ERR_INVALID_ARGUMENT);
        colld_comm_break(d, c, COLLD_ERR_INVALID_ARGUMENT, m->rank, detail, replies);
        return;
    }
    m->next_seq = sqe->seq + 1;
    colld_op_t *op = op_alloc(d);
    if (!op) {
        complete_sqe(d, s, sqe, COLLD_ERR_NO_MEMORY);
        colld_comm_break(d, c, COLLD_ERR_NO_MEMORY, -1, "daemon out of memory", replies);
        return;
    }
    op->d = *sqe;
    op->session = s;
    op->member = m;
    s->refs++;
    colld_status_t st = validate(s, op, detail, sizeof(detail));
    if (st != COLLD_OK) {
        char why[COLLD_DETAIL_LEN];
        snprintf(why, sizeof(why), "rank %d (pid %d), collective #%llu: %s", m->rank, (int)s->pid,
                 (unsigned long long)sqe->seq, detail);
        LOG_INFO_RL(ENGINE, "invalid descriptor: %s", why);
        c->ops_failed++;
        colld_engine_fail_op(op, st);
        colld_comm_break(d, c, st, m->rank, why, replies);
        return;
    }
    op->arrival_ns = colld_now_ns();
    /* A record carries the rank's own arrival time (it may be drained late); a time in the
     * future is not believed. */
    if ((sqe->flags & COLLD_SQE_FAST) && sqe->send.offset && sqe->send.offset < op->arrival_ns)
        op->arrival_ns = sqe->send.offset;
    if (m->tail)
        m->tail->next = op;
    else
        m->head = op;
    m->tail = op;
}

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
static int drain_session(colld_daemon_t *d, colld_session_t *s, colld_reply_t **replies)
{
    if (s->dead || s->kill_requested || !s->shm)
        return 0;
    int64_t avail = colld_ring_avail(&s->shm->sq, s->sq_tail, s->entries);
    int64_t space = colld_ring_space(&s->shm->cq, s->cq_head, s->entries);
    if (avail < 0 || space < 0) {
        session_kill(s, "corrupt ring counters");
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
        admit(d, s, &sqe, replies);
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
 * Matching and time-outs
 * ========================================================================================== */

/* The same call (what the signature check compares). */
static bool same_call(const colld_wire_sqe_t *a, const colld_wire_sqe_t *b)
{
    return a->kind == b->kind && a->dtype == b->dtype && a->count == b->count &&
           (!has_op(a->kind) || a->redop == b->redop) && (!has_root(a->kind) || a->root == b->root) &&
           (a->flags & COLLD_SQE_STREAM) == (b->flags & COLLD_SQE_STREAM);
}

/* Describe one rank's call for a mismatch report. */
static int describe_call(char *buf, size_t len, int rank, const colld_wire_sqe_t *d)
{
    return snprintf(buf, len, "%srank %d: %s(%s, %s, count %llu, root %d%s)", rank ? "; " : "", rank,
                    colld_kind_name(d->kind), colld_dtype_name(d->dtype), has_op(d->kind) ? colld_redop_name(d->redop) : "-",
                    (unsigned long long)d->count, d->root, d->flags & COLLD_SQE_STREAM ? ", GPU stream" : "");
}

/* If every rank of c has posted its next collective, take them out as one coll (signatures
 * agreeing) or fail them all with MISMATCH. Returns the coll or NULL. */
static coll_t *match_comm(colld_daemon_t *d, colld_dcomm_t *c, colld_reply_t **replies)
{
    const colld_wire_sqe_t *a = NULL;
    for (int r = 0; r < c->nranks; r++) {
        if (c->ranks[r].remote)
            continue; /* another node matches its own ranks */
        if (!c->ranks[r].head)
            return NULL;
        if (!a)
            a = &c->ranks[r].head->d;
    }
    if (!a)
        return NULL;
    bool same = true;
    for (int r = 0; r < c->nranks && same; r++) {
        if (c->ranks[r].remote)
            continue;
        same = same_call(a, &c->ranks[r].head->d);
    }
    if (!same) {
        char why[COLLD_DETAIL_LEN];
        int off = snprintf(why, sizeof(why), "collective #%llu differs between ranks: ", (unsigned long long)a->seq);
        for (int r = 0; r < c->nranks && off < (int)sizeof(why) - 1; r++)
            if (!c->ranks[r].remote)
                off += describe_call(why + off, sizeof(why) - (size_t)off, r, &c->ranks[r].head->d);
        colld_comm_break(d, c, COLLD_ERR_MISMATCH, -1, why, replies);
        return NULL;
    }
    coll_t *k = malloc(sizeof(*k) + (size_t)c->nranks * sizeof(k->ops[0]));
    if (!k) {
        colld_comm_break(d, c, COLLD_ERR_NO_MEMORY, -1, "daemon out of memory", replies);
        return NULL;
    }
    for (int r = 0; r < c->nranks; r++) {
        colld_member_t *m = &c->ranks[r];
        k->ops[r] = m->head;
        if (m->remote)
            continue;
        m->head = m->head->next;
        if (!m->head)
            m->tail = NULL;
        k->ops[r]->next = NULL;
    }
    k->comm = c;
    k->status = COLLD_OK;
    k->next = NULL;
    c->refs++;
    c->exec_seq = a->seq + 1;
    return k;
}

/* Fail collectives whose first rank arrived more than the timeout ago, naming the missing ranks.
 * Returns the next deadline (ns) among the waiting ones. */
static uint64_t check_op_timeouts(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now, colld_reply_t **replies)
{
    uint64_t first = UINT64_MAX;
    for (int r = 0; r < c->nranks; r++)
        if (!c->ranks[r].remote && c->ranks[r].head && c->ranks[r].head->arrival_ns < first)
            first = c->ranks[r].head->arrival_ns;
    if (first == UINT64_MAX)
        return UINT64_MAX;
    uint64_t deadline = first + (uint64_t)c->timeout_ms * 1000000ull;
    if (now < deadline)
        return deadline;
    char why[COLLD_DETAIL_LEN];
    int off = snprintf(why, sizeof(why), "collective #%llu timed out after %d ms: rank(s)",
                       (unsigned long long)c->exec_seq, c->timeout_ms);
    for (int r = 0; r < c->nranks && off < (int)sizeof(why) - 64; r++)
        if (!c->ranks[r].head && !c->ranks[r].remote)
            off += snprintf(why + off, sizeof(why) - (size_t)off, " %d", r);
    off += snprintf(why + off, sizeof(why) - (size_t)off, " never arrived; waiting:");
    for (int r = 0; r < c->nranks && off < (int)sizeof(why) - 40; r++)
        if (c->ranks[r].head)
            off += snprintf(why + off, sizeof(why) - (size_t)off, " rank %d %llu ms", r,
                            (unsigned long long)((now - c->ranks[r].head->arrival_ns) / 1000000ull));
    colld_comm_break(d, c, COLLD_ERR_TIMEOUT, -1, why, replies);
    return UINT64_MAX;
}

/* ============================================================================================
 * Execution
 * ========================================================================================== */

/* Run one matched collective on the host backend (lock not held). */
static colld_status_t execute(colld_daemon_t *d, coll_t *k)
{
    int n = k->comm->nranks;
    const void *in[COLLD_MAX_RANKS];
    void *out[COLLD_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        in[r] = k->ops[r]->send_ptr;
        out[r] = k->ops[r]->recv_ptr;
    }
    const colld_wire_sqe_t *a = &k->ops[0]->d;
    colld_host_job_t job = {
        .kind = (colld_kind_t)a->kind,
        .dtype = (colld_dtype_t)a->dtype,
        .op = (colld_redop_t)a->redop,
        .root = a->root,
        .count = a->count,
        .n = n,
        .in = in,
        .out = out,
    };
    return colld_host_pool_run(d->pool, &job);
}

/* The first local op of a collective. */
colld_op_t *colld_coll_lead(const colld_coll_t *k)
{
    for (int r = 0; r < k->comm->nranks; r++)
        if (k->ops[r])
            return k->ops[r];
    return NULL;
}

/* Free a record without posting anything (lock held). */
static void drop_record(colld_daemon_t *d, colld_op_t *op)
{
    op->session->in_flight--;
    colld_session_unref(op->session);
    op_release(d, op);
}

/* Where a rank stands in the collective resolve_fast looks at. */
enum { AT_ABSENT = 0, AT_ENGINE, AT_RECORD, AT_SLOT, AT_PASSED };

/* A communicator with a fast area: the ranks run small collectives there and skip their sequence
 * numbers here; a rank that waited posts a record. Look at the lowest sequence number queued,
 * seq, and at every rank's slots for it:
 *  - engine descriptors of every rank: returns true, match_comm runs it;
 *  - engine descriptors of some ranks while others ran or posted seq on the fast area (or recorded
 *    a different call): MISMATCH naming each rank's call;
 *  - records only, every rank there (a record, its slot, or gone past seq): the collective
 *    happened; the records go into the flight recorder and are retired;
 *  - otherwise it waits; past the time-out (from the first arrival) it fails naming the ranks
 *    that never came. *deadline gets the time to look again (the slots change without a wake-up).
 * Returns false unless match_comm should run (lock held). */
static bool resolve_fast(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now, uint64_t *deadline,
                         colld_reply_t **replies)
{
    uint64_t seq = UINT64_MAX;
    for (int r = 0; r < c->nranks; r++)
        if (c->ranks[r].head && c->ranks[r].head->d.seq < seq)
            seq = c->ranks[r].head->d.seq;
    if (seq == UINT64_MAX)
        return false;
    c->exec_seq = seq;
    /* The common case first, without reading the slots: every rank posted seq to the engine. */
    bool all_engine = true;
    for (int r = 0; r < c->nranks && all_engine; r++) {
        const colld_op_t *h = c->ranks[r].head;
        all_engine = h && h->d.seq == seq && !(h->d.flags & COLLD_SQE_FAST);
    }
    if (all_engine)
        return true;
    int n = c->nranks, engine = 0, fast = 0, absent = 0;
    const colld_wire_sqe_t *ref = NULL;
    bool differ = false;
    uint64_t first = UINT64_MAX;
    colld_wire_sqe_t *calls = calloc((size_t)n, sizeof(*calls));
    uint64_t *arrivals = calloc((size_t)n, sizeof(*arrivals));
    signed char *where = calloc((size_t)n, 1); /* AT_* */
    if (!calls || !arrivals || !where) {
        free(calls);
        free(arrivals);
        free(where);
        return false; /* try again on the next pass */
    }
    for (int r = 0; r < n; r++) {
        const colld_op_t *h = c->ranks[r].head;
        if (h && h->d.seq == seq) {
            calls[r] = h->d;
            arrivals[r] = h->arrival_ns;
            where[r] = (h->d.flags & COLLD_SQE_FAST) ? AT_RECORD : AT_ENGINE;
        } else if (h) {
            where[r] = AT_PASSED; /* its next descriptor is later: it ran seq on the fast area */
        } else {
            colld_fast_seen_t at = colld_fast_rank_at(c, r, seq, &calls[r], &arrivals[r]);
            where[r] = at == COLLD_FAST_PUBLISHED ? AT_SLOT : at == COLLD_FAST_PASSED ? AT_PASSED : AT_ABSENT;
            if (arrivals[r] > now)
                arrivals[r] = now; /* the tenant's own clock values are not believed blindly */
        }
        if (where[r] == AT_ENGINE)
            engine++;
        else if (where[r] == AT_ABSENT)
            absent++;
        else
            fast++;
        /* Only records are compared: a rank that sees a different call in a peer's slot posts
         * one itself, so the daemon never judges a call from slot bytes it reads under the
         * writer's feet. */
        if (where[r] == AT_RECORD) {
            if (!ref)
                ref = &calls[r];
            else if (!same_call(ref, &calls[r]))
                differ = true;
        }
        if (where[r] != AT_ABSENT && where[r] != AT_PASSED && arrivals[r] && arrivals[r] < first)
            first = arrivals[r];
    }
    bool engine_path = false;
    int slot_only = 0;   /* ranks seen on the fast area that have not posted their record yet */
    bool slot_differs = false; /* ... one of them with another call: its record is coming */
    for (int r = 0; r < n; r++)
        if (where[r] == AT_SLOT) {
            slot_only++;
            slot_differs |= ref && !same_call(ref, &calls[r]);
        }
    if ((engine && fast && slot_only && !differ) || (!engine && !differ && slot_differs)) {
        /* A mismatch; its report names each call from the ranks' own records, so wait the moment
         * (about 0.25 ms) until the ranks seen only on the fast area post theirs. */
        *deadline = COLLD_MIN(now + 1000000ull, *deadline);
    } else if ((engine && fast) || differ) {
        char why[COLLD_DETAIL_LEN];
        int off = snprintf(why, sizeof(why), "collective #%llu differs between ranks: ", (unsigned long long)seq);
        for (int r = 0; r < n && off < (int)sizeof(why) - 1; r++) {
            if (where[r] == AT_ENGINE || where[r] == AT_RECORD)
                off += describe_call(why + off, sizeof(why) - (size_t)off, r, &calls[r]);
            else
                off += snprintf(why + off, sizeof(why) - (size_t)off, "%srank %d: %s", r ? "; " : "", r,
                                where[r] == AT_ABSENT ? "nothing yet" : "a small collective on the fast area");
        }
        colld_comm_break(d, c, COLLD_ERR_MISMATCH, -1, why, replies);
    } else if (engine) {
        engine_path = true; /* match_comm and the engine's time-out take it from here */
    } else if (!absent) {
        /* Everyone ran it: record it and retire the records. */
        colld_op_t **ops = calloc((size_t)n, sizeof(*ops));
        colld_op_t *seen = calloc((size_t)n, sizeof(*seen)); /* the recorder's view of each rank */
        if (ops && seen) {
            /* A rank already past it (its slot reused) arrived too, at a time no longer known:
             * it is shown with the first arrival rather than as absent. */
            for (int r = 0; r < n; r++) {
                seen[r].d = where[r] == AT_RECORD ? calls[r] : *ref;
                seen[r].arrival_ns = arrivals[r] && where[r] != AT_PASSED ? arrivals[r] : first;
                ops[r] = &seen[r];
            }
            colld_recorder_executed(c, ops, now, now, COLLD_OK);
        }
        free(ops);
        free(seen);
        for (int r = 0; r < n; r++) {
            colld_member_t *m = &c->ranks[r];
            if (where[r] != AT_RECORD)
                continue;
            colld_op_t *op = m->head;
            m->head = op->next;
            if (!m->head)
                m->tail = NULL;
            drop_record(d, op);
        }
        c->exec_seq = seq + 1;
    } else {
        uint64_t dl = first == UINT64_MAX ? now : first + (uint64_t)c->timeout_ms * 1000000ull;
        if (now >= dl) {
            char why[COLLD_DETAIL_LEN];
            int off = snprintf(why, sizeof(why), "collective #%llu timed out after %d ms: rank(s)",
                               (unsigned long long)seq, c->timeout_ms);
            for (int r = 0; r < n && off < (int)sizeof(why) - 64; r++)
                if (where[r] == AT_ABSENT)
                    off += snprintf(why + off, sizeof(why) - (size_t)off, " %d", r);
            snprintf(why + off, sizeof(why) - (size_t)off, " never arrived (fast area)");
            colld_comm_break(d, c, COLLD_ERR_TIMEOUT, -1, why, replies);
        } else {
            uint64_t look = now + 10000000ull; /* slots change without waking the engine */
            *deadline = COLLD_MIN(COLLD_MIN(dl, look), *deadline);
        }
    }
    free(calls);
    free(arrivals);
    free(where);
    return engine_path;
}

void colld_engine_settle_fast(colld_daemon_t *d, colld_dcomm_t *c, colld_reply_t **replies)
{
    uint64_t now = colld_now_ns(), deadline = UINT64_MAX;
    while (c->fast && c->state == COLLD_COMM_READY) {
        uint64_t before = c->exec_seq;
        if (resolve_fast(d, c, now, &deadline, replies) || c->exec_seq == before)
            break;
    }
}

/* Post the results of an executed collective and release everything it held (lock held). */
void colld_engine_finish(colld_daemon_t *d, coll_t *k)
{
    colld_dcomm_t *c = k->comm;
    colld_status_t st = k->status;
    uint64_t first = colld_recorder_executed(c, k->ops, k->start_ns, k->end_ns, st);
    colld_metrics_latency(d, colld_coll_lead(k)->d.kind, k->end_ns - first);
    for (int r = 0; r < c->nranks; r++)
        if (k->ops[r])
            colld_engine_fail_op(k->ops[r], st);
    if (st == COLLD_OK)
        c->ops_completed++;
    else
        c->ops_failed++;
    colld_comm_unref(d, c);
    free(k);
}

/* ============================================================================================
 * The thread
 * ========================================================================================== */

/* The first local rank's next descriptor is a host collective (lock held). */
static bool host_next(const colld_dcomm_t *c)
{
    for (int r = 0; r < c->nranks; r++)
        if (!c->ranks[r].remote)
            return c->ranks[r].head && !(c->ranks[r].head->d.flags & COLLD_SQE_STREAM);
    return false;
}

/* One pass over all sessions and communicators: admit, match, time out, progress the GPU
 * collectives. Returns how much work was found, the matched host collectives in *batch, the GPU
 * collectives to launch in *gpu_launch and the next deadline in *next_deadline. */
static int engine_pass(colld_daemon_t *d, coll_t **batch, coll_t **gpu_launch, uint64_t *next_deadline,
                       colld_reply_t **replies)
{
    int work = 0;
    for (colld_session_t *s = d->sessions; s; s = s->next)
        work += drain_session(d, s, replies);
    uint64_t now = colld_now_ns();
    uint64_t next = colld_comm_check_join_timeouts(d, now, replies);
    work += colld_gpu_progress(d, now, &next, gpu_launch, replies);
    for (colld_dcomm_t *c = d->comms; c; c = c->next) {
        if (c->notices_pending)
            colld_engine_post_notices(c);
        if (c->state != COLLD_COMM_READY)
            continue;
        if (c->fast && !resolve_fast(d, c, now, &next, replies))
            continue;
        /* A host collective after GPU ones of the same communicator waits for them to finish,
         * so each rank's completions stay in sequence order (and it is not timed out meanwhile). */
        if (colld_gpu_busy(c) && host_next(c))
            continue;
        coll_t *k = match_comm(d, c, replies);
        if (k && c->x) {
            colld_cluster_submit(d, k); /* the network thread runs it */
            work++;
            continue;
        }
        if (k && (colld_coll_lead(k)->d.flags & COLLD_SQE_STREAM)) {
            colld_gpu_submit(d, k); /* launched once every rank's stream reached it */
            work++;
            continue;
        }
        if (k) {
            k->next = *batch;
            *batch = k;
            work++;
            continue;
        }
        uint64_t dl = check_op_timeouts(d, c, now, replies);
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

/* One round of the engine: admit, match, launch and execute what is ready, finish it. Returns
 * the work found, or -1 once the engine is stopping; *next_deadline and *gpu_waiting say when
 * it must look again (engine thread, lock not held). */
static int engine_round(colld_daemon_t *d, uint64_t *next_deadline, bool *gpu_waiting)
{
    coll_t *batch = NULL, *gpu_launch = NULL;
    colld_reply_t *replies = NULL;
    pthread_mutex_lock(&d->lock);
    if (!d->engine_running) {
        pthread_mutex_unlock(&d->lock);
        return -1;
    }
    int work = engine_pass(d, &batch, &gpu_launch, next_deadline, &replies);
    *gpu_waiting = colld_gpu_outstanding(d);
    pthread_mutex_unlock(&d->lock);
    colld_replies_send(replies);

    if (gpu_launch) {
        colld_gpu_launch(d, gpu_launch); /* kernels are queued asynchronously */
        replies = NULL;
        pthread_mutex_lock(&d->lock);
        colld_gpu_launched(d, gpu_launch, &replies);
        pthread_mutex_unlock(&d->lock);
        colld_replies_send(replies);
    }

    if (batch) {
        for (coll_t *k = batch; k; k = k->next) {
            k->start_ns = colld_now_ns();
            k->status = execute(d, k);
            k->end_ns = colld_now_ns();
        }
        pthread_mutex_lock(&d->lock);
        while (batch) {
            coll_t *k = batch;
            batch = k->next;
            colld_engine_finish(d, k);
        }
        pthread_mutex_unlock(&d->lock);
    }
    return work;
}

int colld_engine_run_once(colld_daemon_t *d)
{
    uint64_t next_deadline;
    bool gpu_waiting;
    return engine_round(d, &next_deadline, &gpu_waiting);
}

static void *engine_main(void *arg)
{
    colld_daemon_t *d = arg;
    uint64_t last_work = colld_now_ns();
    uint64_t spin_ns = (uint64_t)d->cfg.spin_us * 1000ull;
    for (;;) {
        uint64_t next_deadline;
        bool gpu_waiting;
        int work = engine_round(d, &next_deadline, &gpu_waiting);
        if (work < 0)
            break;
        uint64_t now = colld_now_ns();
        if (work) {
            last_work = now;
            continue;
        }
        /* While GPU work is outstanding the engine polls its flags and events: busy for a
         * while (small collectives finish within it), then every millisecond (next_deadline). */
        if (now - last_work < (gpu_waiting ? COLLD_MAX(spin_ns, GPU_SPIN_NS) : spin_ns)) {
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
            struct epoll_event ev[64];
            int n = epoll_wait(d->epfd, ev, 64, timeout_ms);
            if (n < 0 && errno != EINTR)
                LOG_ERROR(ENGINE, "epoll_wait: %s", strerror(errno));
        }
        pthread_mutex_lock(&d->lock);
        set_need_wakeup(d, 0);
        pthread_mutex_unlock(&d->lock);
        last_work = colld_now_ns();
    }
    return NULL;
}

/* Wake the engine from another thread. */
void colld_engine_wake(colld_daemon_t *d)
{
    uint64_t one = 1;
    ssize_t rc = write(d->wake_fd, &one, sizeof(one));
    (void)rc; /* EAGAIN only when the counter is saturated: the engine is awake anyway */
}

/* Watch a session's eventfd (lock held). Edge-triggered: each client write is an event, and the
 * counter never needs reading. */
int colld_engine_add_session(colld_daemon_t *d, colld_session_t *s)
{
    struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.u64 = s->id };
    if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, s->efd, &ev) < 0) {
        LOG_ERROR(ENGINE, "epoll_ctl: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* Stop watching a session's eventfd (lock held). */
void colld_engine_remove_session(colld_daemon_t *d, colld_session_t *s)
{
    if (s->efd >= 0)
        epoll_ctl(d->epfd, EPOLL_CTL_DEL, s->efd, NULL);
}

/* Create the epoll set, the host worker pool and the engine thread. Returns 0 or -1. */
int colld_engine_start(colld_daemon_t *d)
{
    d->epfd = epoll_create1(EPOLL_CLOEXEC);
    d->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (d->epfd < 0 || d->wake_fd < 0) {
        LOG_ERROR(ENGINE, "cannot create the engine's epoll set: %s", strerror(errno));
        return -1;
    }
    struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.u64 = 0 };
    if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, d->wake_fd, &ev) < 0)
        return -1;
    if (colld_host_pool_create((int)d->cfg.workers, d->cfg.parallel_min_bytes, &d->pool) < 0) {
        LOG_ERROR(ENGINE, "cannot start %lld host workers", (long long)d->cfg.workers);
        return -1;
    }
    d->engine_running = true;
    if (pthread_create(&d->engine_thread, NULL, engine_main, d) != 0) {
        d->engine_running = false;
        return -1;
    }
    return 0;
}

/* Stop the engine thread and the pool. Sessions must already be gone. */
void colld_engine_stop(colld_daemon_t *d)
{
    if (d->engine_running) {
        pthread_mutex_lock(&d->lock);
        d->engine_running = false;
        pthread_mutex_unlock(&d->lock);
        colld_engine_wake(d);
        pthread_join(d->engine_thread, NULL);
    }
    colld_host_pool_destroy(d->pool);
    d->pool = NULL;
    while (d->op_free) {
        colld_op_t *op = d->op_free;
        d->op_free = op->next;
        free(op);
    }
    d->op_free_n = 0;
    if (d->epfd >= 0)
        close(d->epfd);
    if (d->wake_fd >= 0)
        close(d->wake_fd);
    d->epfd = d->wake_fd = -1;
}
