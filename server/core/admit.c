/*
 * admit.c - admission: every descriptor a session posts is validated before anything touches
 * memory, then queued on its rank (or failed at once).
 *
 * A descriptor is the tenant's bytes (copied out of shared memory by the engine first): the handle
 * must be a communicator this session joined, the sequence number the rank's next one (with a
 * side path such as the fast area, at least that), kind, dtype, op and root in range, the scalar
 * word of a premultiplied sum (zero aux words otherwise), count x size x nranks without overflow,
 * each buffer a registration of this session, in bounds, at an offset that is a multiple of the
 * element size, the rank's two buffers apart or in place as NCCL defines it, device memory only in
 * stream-ordered collectives (whose own checks are their backend's `admit`). A bad descriptor fails
 * with COLLD_ERR_INVALID_ARGUMENT (or NOT_SUPPORTED) and a detail naming the rank and the field,
 * and breaks its communicator, so that no peer waits for a collective that cannot run. An admitted
 * collective goes to its rank's queue of collectives (match.c), a send or receive to its queue of
 * point-to-point operations (p2p.c); both carry the collective ordinal in d.seq and the operation
 * id in `id` (proto/wire.h). All functions run with daemon->lock held.
 */
#include "server/core/daemon.h"

#include "common/log.h"
#include "common/util.h"
#include "kernels/cpu/reduce.h"

#include <stdio.h>

bool colld_kind_has_root(unsigned kind)
{
    return kind == COLLD_KIND_BROADCAST || kind == COLLD_KIND_REDUCE || kind == COLLD_KIND_GATHER ||
           kind == COLLD_KIND_SCATTER;
}

bool colld_kind_has_op(unsigned kind)
{
    return kind == COLLD_KIND_ALLREDUCE || kind == COLLD_KIND_REDUCE || kind == COLLD_KIND_REDUCESCATTER;
}

/* Resolve a buffer reference of `bytes` bytes to a pointer in a registration of the session.
 * Returns 0, or -1 with err. */
static int resolve_buf(colld_session_t *s, const colld_wire_buf_t *b, uint64_t bytes, size_t align, const char *which,
                       colld_reg_t **reg, void **ptr, colld_err_t *err)
{
    *reg = NULL;
    *ptr = NULL;
    if (bytes == 0)
        return 0;
    colld_reg_t *r = colld_session_find_reg(s, b->reg_id);
    if (!r) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      "%s buffer: registration %u is not one of this process's buffers", which, b->reg_id);
        return -1;
    }
    if (b->offset > r->size || bytes > r->size - b->offset) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      "%s buffer: %llu bytes at offset %llu overrun its %llu-byte registration", which,
                      (unsigned long long)bytes, (unsigned long long)b->offset, (unsigned long long)r->size);
        return -1;
    }
    /* Registrations start on a page, so an aligned offset is an aligned address: the kernels
     * load whole elements. */
    if (b->offset % align) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      "%s buffer: offset %llu is not a multiple of the element size (%zu bytes)", which,
                      (unsigned long long)b->offset, align);
        return -1;
    }
    r->refs++;
    *reg = r;
    *ptr = (char *)r->base + b->offset;
    return 0;
}

/* A rank's two buffers either do not overlap or are in place as NCCL defines it (the same buffer;
 * for all-gather the send buffer is the rank's slice of the receive buffer, for reduce-scatter the
 * receive buffer is the rank's slice of the send buffer). Anything else would have the host
 * backend copy between overlapping ranges. */
static bool in_place_or_apart(const colld_wire_sqe_t *d, const colld_op_t *op, uint64_t send_bytes, uint64_t recv_bytes,
                              uint64_t bytes, int rank)
{
    if (!op->send_reg || op->send_reg != op->recv_reg)
        return true;
    uint64_t so = d->send.offset, ro = d->recv.offset; /* in bounds: resolve_buf checked them */
    if (so + send_bytes <= ro || ro + recv_bytes <= so)
        return true;
    uint64_t slice = (uint64_t)rank * bytes;
    switch (d->kind) {
    case COLLD_KIND_ALLGATHER:
    case COLLD_KIND_GATHER: /* at the root: its block of recvbuf */
        return so == ro + slice;
    case COLLD_KIND_REDUCESCATTER:
    case COLLD_KIND_SCATTER: /* at the root: its block of sendbuf */
        return ro == so + slice;
    case COLLD_KIND_ALLTOALL: /* no in place: every block goes elsewhere */
        return false;
    default:
        return so == ro;
    }
}

/* Validation, step 1: the descriptor's own fields (kind, dtype, op, root or peer, count) against
 * the communicator's nranks; the per-rank payload in *bytes and all ranks' in *all. */
static colld_status_t check_fields(const colld_wire_sqe_t *d, int nranks, uint64_t *bytes, uint64_t *all,
                                   colld_err_t *err)
{
    if (d->kind < COLLD_KIND_ALLREDUCE || d->kind > COLLD_KIND_MAX)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "unknown collective kind %u", d->kind);
    if (d->dtype >= COLLD_DTYPE_COUNT)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "unknown dtype %u", d->dtype);
    if (colld_kind_has_op(d->kind) && d->redop >= COLLD_WIRE_REDOPS)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "unknown reduction op %u", d->redop);
    /* The premultiplied sum's scalar word (proto/wire.h): one value of the dtype, nothing past it;
     * no other descriptor (fast-path records included) carries one. */
    bool premul = colld_kind_has_op(d->kind) && d->redop == COLLD_REDOP_PREMUL_SUM && !(d->flags & COLLD_SQE_FAST);
    uint64_t word = colld_wire_sqe_scalar(d);
    if (premul && !colld_cpu_scalar_word_ok((colld_dtype_t)d->dtype, word))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "premultiplied-sum scalar word 0x%016llx (send.aux, recv.aux) has bytes past its "
                             "%zu-byte %s value",
                             (unsigned long long)word, colld_dtype_size((colld_dtype_t)d->dtype),
                             colld_dtype_name(d->dtype));
    if (!premul && word)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "send.aux and recv.aux are 0x%x and 0x%x: they must be 0 outside a premultiplied sum",
                             d->send.aux, d->recv.aux);
    if (colld_kind_has_root(d->kind) && (d->root < 0 || d->root >= nranks))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "root %d is out of range for %d ranks", d->root, nranks);
    if (colld_kind_is_p2p(d->kind) && (d->root < 0 || d->root >= nranks))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "peer %d is out of range for %d ranks", d->root, nranks);
    if (colld_kind_is_p2p(d->kind) && (d->flags & ~(COLLD_SQE_LINK | COLLD_SQE_STREAM)))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "%s with flags 0x%x: only the group link and the GPU stream flag are allowed",
                             colld_kind_name(d->kind), d->flags);
    if (d->flags & ~(COLLD_SQE_FAST | COLLD_SQE_STREAM | COLLD_SQE_LINK | COLLD_SQE_PLAN))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "%s with unknown flags 0x%x", colld_kind_name(d->kind),
                             d->flags);
    if ((d->flags & COLLD_SQE_PLAN) && !(d->flags & COLLD_SQE_STREAM))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "%s with the plan flag but not the GPU stream flag (a plan is a captured GPU "
                             "collective)",
                             colld_kind_name(d->kind));
    if (!colld_kind_is_p2p(d->kind) && (d->flags & COLLD_SQE_LINK))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "%s with the group link flag (point-to-point only)",
                             colld_kind_name(d->kind));
    if (!colld_mul_ok(d->count, colld_dtype_size((colld_dtype_t)d->dtype), bytes) ||
        !colld_mul_ok(*bytes, (uint64_t)nranks, all))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "count %llu overflows", (unsigned long long)d->count);
    return COLLD_OK;
}

/* Validation, step 2: the bytes each of the rank's buffers must hold, by NCCL's rules: a non-root's
 * broadcast send buffer and reduce receive buffer are not used; all-gather receives and
 * reduce-scatter sends nranks x count; gather's root receives and scatter's root sends nranks x
 * count (the others' buffers on that side are not used); all-to-all sends and receives nranks x
 * count; a send uses only its send buffer and a receive only its receive buffer. */
static void buffer_sizes(const colld_wire_sqe_t *d, int rank, uint64_t bytes, uint64_t all, uint64_t *send_bytes,
                         uint64_t *recv_bytes)
{
    *send_bytes = bytes;
    *recv_bytes = bytes;
    switch (d->kind) {
    case COLLD_KIND_BROADCAST:
        *send_bytes = rank == d->root ? bytes : 0;
        break;
    case COLLD_KIND_REDUCE:
        *recv_bytes = rank == d->root ? bytes : 0;
        break;
    case COLLD_KIND_ALLGATHER:
        *recv_bytes = all;
        break;
    case COLLD_KIND_REDUCESCATTER:
        *send_bytes = all;
        break;
    case COLLD_KIND_GATHER:
        *recv_bytes = rank == d->root ? all : 0;
        break;
    case COLLD_KIND_SCATTER:
        *send_bytes = rank == d->root ? all : 0;
        break;
    case COLLD_KIND_ALLTOALL:
        *send_bytes = all;
        *recv_bytes = all;
        break;
    case COLLD_KIND_SEND:
        *recv_bytes = 0;
        break;
    case COLLD_KIND_RECV:
        *send_bytes = 0;
        break;
    default:
        break;
    }
}

/* Gather, scatter, all-to-all and point-to-point never run on the fast area nor across nodes; on GPU
 * buffers they are stream-ordered (the CUDA backend's admit checks them, issue 16). A batch of sends
 * and receives (the operations of one group, COLLD_SQE_LINK) is all stream-ordered or all not: the
 * CUDA backend takes a stream-ordered batch as ready when its last operation's ready slot is written
 * (proto/wire.h). */
static colld_status_t check_host_only(const colld_op_t *op, colld_err_t *err)
{
    const colld_wire_sqe_t *d = &op->d;
    if (d->kind < COLLD_KIND_GATHER)
        return COLLD_OK;
    const colld_op_t *prev = op->member->p2p_tail; /* the rank's last send or receive still queued */
    if (colld_kind_is_p2p(d->kind) && prev && (prev->d.flags & COLLD_SQE_LINK) &&
        ((prev->d.flags ^ d->flags) & COLLD_SQE_STREAM))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "%s in a group whose %s before it is %s: the sends and receives of one group on a "
                             "communicator must all be on GPU buffers (stream-ordered) or all on host buffers",
                             colld_kind_name(d->kind), colld_kind_name(prev->d.kind),
                             (prev->d.flags & COLLD_SQE_STREAM) ? "stream-ordered (GPU buffers)" : "on host buffers");
    if (d->flags & COLLD_SQE_FAST)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "%s never runs on the fast area",
                             colld_kind_name(d->kind));
    if (colld_comm_multi_node(op->member->comm))
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "%s on a communicator spanning nodes is not supported yet",
                             colld_kind_name(d->kind));
    return COLLD_OK;
}

/* Validation, step 3: a stream-ordered descriptor is checked by the backend that runs stream-
 * ordered collectives (its flag line, its flag base); without one it is not supported here. */
static colld_status_t check_stream(colld_op_t *op, colld_err_t *err)
{
    colld_daemon_t *d = op->session->daemon;
    colld_backend_t *b = colld_backend_claim(d, op->member->comm, &op->d);
    if (b && b->ops->admit)
        return b->ops->admit(b, op, err);
    return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "GPU collective, but no GPU here: %.160s", d->device_none);
}

/* Validation, step 4: device memory only in stream-ordered collectives, host memory only in the
 * others, so that the host backend never dereferences a device address; and the two buffers apart
 * or in place. */
static colld_status_t check_memory(const colld_op_t *op, uint64_t send_bytes, uint64_t recv_bytes, uint64_t bytes,
                                   int rank, colld_err_t *err)
{
    const colld_wire_sqe_t *d = &op->d;
    bool stream = d->flags & COLLD_SQE_STREAM;
    if ((op->send_reg && op->send_reg->device != stream) || (op->recv_reg && op->recv_reg->device != stream))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             stream ? "GPU collective on a host buffer (registration %u)"
                                    : "host collective on a GPU buffer (registration %u)",
                             op->send_reg && op->send_reg->device != stream ? d->send.reg_id : d->recv.reg_id);
    if (!in_place_or_apart(d, op, send_bytes, recv_bytes, bytes, rank))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "send (offset %llu, %llu bytes) and recv (offset %llu, %llu bytes) overlap without "
                             "being in place (in place: the same buffer%s)",
                             (unsigned long long)d->send.offset, (unsigned long long)send_bytes,
                             (unsigned long long)d->recv.offset, (unsigned long long)recv_bytes,
                             d->kind == COLLD_KIND_ALLGATHER || d->kind == COLLD_KIND_GATHER
                                 ? ", or sendbuf at the rank's slice of recvbuf"
                             : d->kind == COLLD_KIND_REDUCESCATTER || d->kind == COLLD_KIND_SCATTER
                                 ? ", or recvbuf at the rank's slice of sendbuf"
                             : d->kind == COLLD_KIND_ALLTOALL ? "; all-to-all has no in-place form"
                                                              : "");
    return COLLD_OK;
}

/* Check a descriptor's fields and resolve its buffers (steps 1 to 4 above). Returns COLLD_OK or
 * an error with what is wrong in err. */
static colld_status_t validate(colld_session_t *s, colld_op_t *op, colld_err_t *err)
{
    const colld_wire_sqe_t *d = &op->d;
    int rank = op->member->rank, nranks = op->member->comm->nranks;
    uint64_t bytes = 0, all = 0, send_bytes, recv_bytes;
    colld_status_t st = check_fields(d, nranks, &bytes, &all, err);
    if (st == COLLD_OK)
        st = check_host_only(op, err);
    if (st != COLLD_OK)
        return st;
    if (d->flags & COLLD_SQE_FAST) {
        /* A record: the ranks ran it beside the engine, no buffer of theirs is touched here. */
        if (!op->member->comm->side_path)
            return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                                 "fast-path record on a communicator without a fast area");
        return COLLD_OK;
    }
    buffer_sizes(d, rank, bytes, all, &send_bytes, &recv_bytes);
    if ((d->flags & COLLD_SQE_STREAM) && (st = check_stream(op, err)) != COLLD_OK)
        return st;
    size_t es = colld_dtype_size((colld_dtype_t)d->dtype);
    if (resolve_buf(s, &d->send, send_bytes, es, "send", &op->send_reg, &op->send_ptr, err) < 0 ||
        resolve_buf(s, &d->recv, recv_bytes, es, "recv", &op->recv_reg, &op->recv_ptr, err) < 0)
        return COLLD_ERR_INVALID_ARGUMENT;
    return check_memory(op, send_bytes, recv_bytes, bytes, rank, err);
}

/* Queue an admitted op at the end of its rank's FIFO, with its arrival time. */
static void enqueue(colld_member_t *m, colld_op_t *op)
{
    op->arrival_ns = colld_now_ns();
    /* A record carries the rank's own arrival time (it may be drained late); a time in the
     * future is not believed. */
    if ((op->d.flags & COLLD_SQE_FAST) && op->d.send.offset && op->d.send.offset < op->arrival_ns)
        op->arrival_ns = op->d.send.offset;
    if (m->tail)
        m->tail->next = op;
    else
        m->head = op;
    m->tail = op;
}

/* What an operation is called in a detail: "collective #N" (its ordinal) or "send to rank 3
 * (operation #N)" (its id). */
static void name_op(char *buf, size_t len, const colld_wire_sqe_t *q, uint64_t id)
{
    if (colld_kind_is_p2p(q->kind))
        colld_p2p_op_text(buf, len, colld_kind_name(q->kind), q->kind == COLLD_KIND_SEND, NULL, q->root, id);
    else
        snprintf(buf, len, "collective #%llu", (unsigned long long)q->seq);
}

void colld_admit(colld_daemon_t *d, colld_session_t *s, const colld_wire_sqe_t *sqe)
{
    colld_err_t err = COLLD_ERR_INIT;
    colld_member_t *m = colld_comm_member(s, sqe->comm);
    if (!m) {
        LOG_INFO_RL(ENGINE, "session %llu: descriptor for unknown communicator handle %u", (unsigned long long)s->id,
                    sqe->comm);
        colld_complete_sqe(d, s, sqe, sqe->seq, COLLD_ERR_INVALID_ARGUMENT);
        return;
    }
    colld_dcomm_t *c = m->comm;
    /* The collective ordinal (proto/wire.h): the operation id less the point-to-point operations
     * the rank posted before it. A descriptor refused below completes with its operation id, the
     * value its GPU stream waits for. */
    colld_wire_sqe_t q = *sqe;
    q.seq = sqe->seq > m->p2p_posted ? sqe->seq - m->p2p_posted : 0;
    /* A communicator closing because a rank left still runs sends and receives between the
     * others (comm.c), on host buffers: the break released every rank's GPU stream already. */
    bool p2p_open = c->state == COLLD_COMM_CLOSING && colld_kind_is_p2p(sqe->kind) &&
                    !(sqe->flags & COLLD_SQE_STREAM) && !m->left && sqe->root >= 0 && sqe->root < c->nranks &&
                    !c->ranks[sqe->root].left;
    if (c->state != COLLD_COMM_READY && !p2p_open) {
        /* Refused, but numbered: the sends and receives that still run on a closing communicator
         * must find the numbering in step (a refused descriptor is as good as posted). */
        if (c->state == COLLD_COMM_CLOSING && (c->side_path ? sqe->seq >= m->next_seq : sqe->seq == m->next_seq)) {
            m->next_seq = sqe->seq + 1;
            if (colld_kind_is_p2p(sqe->kind))
                m->p2p_posted++;
        }
        c->ops_failed++;
        colld_complete_sqe(d, s, &q, sqe->seq, c->state == COLLD_COMM_JOINING ? COLLD_ERR_INVALID_USAGE : c->error);
        return;
    }
    /* With a side path, the sequence numbers of collectives the ranks ran there without waiting
     * are skipped. */
    if (c->side_path ? sqe->seq < m->next_seq : sqe->seq != m->next_seq) {
        char detail[COLLD_DETAIL_LEN / 2];
        snprintf(detail, sizeof(detail), "rank %d (pid %d) posted sequence number %llu where %s%llu was due", m->rank,
                 (int)s->pid, (unsigned long long)sqe->seq, c->side_path ? "at least " : "",
                 (unsigned long long)m->next_seq);
        colld_complete_sqe(d, s, &q, sqe->seq, COLLD_ERR_INVALID_ARGUMENT);
        colld_comm_break(d, c, COLLD_ERR_INVALID_ARGUMENT, m->rank, detail);
        return;
    }
    m->next_seq = sqe->seq + 1;
    if (colld_kind_is_p2p(sqe->kind))
        m->p2p_posted++; /* the client counted it when it numbered it: the ordinals stay in step */
    colld_op_t *op = colld_op_alloc(d);
    if (!op) {
        colld_complete_sqe(d, s, &q, sqe->seq, COLLD_ERR_NO_MEMORY);
        colld_comm_break(d, c, COLLD_ERR_NO_MEMORY, -1, "daemon out of memory");
        return;
    }
    op->d = q;
    op->id = sqe->seq;
    op->session = s;
    op->member = m;
    s->refs++;
    colld_status_t st = validate(s, op, &err);
    if (st != COLLD_OK) {
        /* The detail keeps room for the rank prefix: at most COLLD_DETAIL_LEN / 2 - 1 bytes of it. */
        char why[COLLD_DETAIL_LEN], what[96];
        name_op(what, sizeof(what), &q, sqe->seq);
        snprintf(why, sizeof(why), "rank %d (pid %d), %s: %.*s", m->rank, (int)s->pid, what, COLLD_DETAIL_LEN / 2 - 1,
                 err.msg);
        LOG_INFO_RL(ENGINE, "invalid descriptor: %s", why);
        c->ops_failed++;
        colld_op_retire(op, st);
        colld_comm_break(d, c, st, m->rank, why);
        return;
    }
    if (!colld_kind_is_p2p(op->d.kind)) {
        enqueue(m, op);
    } else if (colld_p2p_enqueue(c, m, op) < 0) {
        c->ops_failed++;
        colld_op_retire(op, COLLD_ERR_NO_MEMORY);
        colld_comm_break(d, c, COLLD_ERR_NO_MEMORY, -1, "daemon out of memory");
    }
}

/* ============================================================================================
 * Signatures: what matching compares and a mismatch report names
 * ========================================================================================== */

/* The premultiplied sum is one op whatever each rank's scalar (send.aux, recv.aux: not compared). */
bool colld_same_call(const colld_wire_sqe_t *a, const colld_wire_sqe_t *b)
{
    return a->kind == b->kind && a->dtype == b->dtype && a->count == b->count &&
           (!colld_kind_has_op(a->kind) || a->redop == b->redop) &&
           (!colld_kind_has_root(a->kind) || a->root == b->root) &&
           (a->flags & (COLLD_SQE_STREAM | COLLD_SQE_PLAN)) == (b->flags & (COLLD_SQE_STREAM | COLLD_SQE_PLAN));
}

int colld_describe_call(char *buf, size_t len, int rank, const colld_wire_sqe_t *d)
{
    return snprintf(buf, len, "%srank %d: %s(%s, %s, count %llu, root %d%s)", rank ? "; " : "", rank,
                    colld_kind_name(d->kind), colld_dtype_name(d->dtype),
                    colld_kind_has_op(d->kind) ? colld_redop_name(d->redop) : "-", (unsigned long long)d->count,
                    d->root,
                    d->flags & COLLD_SQE_PLAN     ? ", captured into a CUDA graph"
                    : d->flags & COLLD_SQE_STREAM ? ", GPU stream"
                                                  : "");
}
