/*
 * completion.c - operation records and what the engine writes back to the sessions: completion
 * records, break notices, and the retirement of every operation, whether it executed, failed, or
 * was a fast-path record the ranks completed themselves.
 *
 * The engine takes a descriptor only with a free completion slot reserved for it (s->in_flight
 * counts them), so posting a completion never waits; a full completion ring here means the client
 * moved its tail backwards, and its session is dropped. All functions run with daemon->lock held.
 */
#include "server/core/counters.h"
#include "server/core/daemon.h"

#include "common/util.h"
#include "transport/shm/ring.h"

#include <stdlib.h>
#include <string.h>

/* Operation records are recycled through a free list, so the per-collective path does not call
 * the allocator for them. */
#define OP_FREE_MAX 4096

colld_op_t *colld_op_alloc(colld_daemon_t *d)
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

/* Put a record back on the free list (or free it when the list is full). */
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

void colld_op_free_all(colld_daemon_t *d)
{
    while (d->op_free) {
        colld_op_t *op = d->op_free;
        d->op_free = op->next;
        free(op);
    }
    d->op_free_n = 0;
}

/* Post one completion to a session's completion ring and ring its doorbell (lock held). The
 * engine admitted this operation only with a free completion slot reserved for it, so a full ring
 * here means the client moved its tail backwards: a protocol violation. */
void colld_complete_post(colld_session_t *s, uint32_t handle, uint64_t seq, colld_status_t st)
{
    s->in_flight--;
    if (s->dead || s->kill_requested)
        return;
    int64_t space = colld_ring_space(&s->shm->cq, s->cq_head, s->entries);
    if (space <= 0) {
        colld_session_kill(s, "completion ring overrun (corrupt tail)");
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
void colld_complete_notices(colld_dcomm_t *c)
{
    for (int r = 0; r < c->nranks && c->notices_pending > 0; r++) {
        colld_member_t *m = &c->ranks[r];
        colld_session_t *s = m->session;
        if (!m->notify || !s)
            continue;
        if (!s->dead && !s->kill_requested) {
            int64_t space = colld_ring_space(&s->shm->cq, s->cq_head, s->entries);
            if (space <= (int64_t)s->in_flight)
                continue;   /* no unreserved slot yet */
            s->in_flight++; /* colld_complete_post counts it back */
            colld_complete_post(s, m->handle, 0, c->error);
        }
        m->notify = false;
        c->notices_pending--;
    }
}

/* The payload per rank of a descriptor, for the counters (0 when its fields are garbage). */
static uint64_t payload_bytes(const colld_wire_sqe_t *d)
{
    uint64_t bytes;
    if (d->dtype >= COLLD_DTYPE_COUNT || !colld_mul_ok(d->count, colld_dtype_size((colld_dtype_t)d->dtype), &bytes))
        return 0;
    return bytes;
}

/* Post the completion of operation `id`, or for a fast-path record (which the ranks completed
 * themselves) just give back the completion slot reserved for it (lock held). */
static void retire(colld_session_t *s, const colld_wire_sqe_t *sqe, uint64_t id, colld_status_t st)
{
    if (sqe->flags & COLLD_SQE_FAST)
        s->in_flight--;
    else
        colld_complete_post(s, sqe->comm, id, st);
}

/* A stream-ordered descriptor (operation `id`) that fails: its rank's GPU stream must not wait for
 * it (lock held). */
static void release_stream(colld_session_t *s, const colld_wire_sqe_t *sqe, uint64_t id, colld_status_t st)
{
    if (!(sqe->flags & COLLD_SQE_STREAM) || st == COLLD_OK)
        return;
    colld_backends_stream_failed(s->daemon, s, sqe, id, st);
}

void colld_complete_sqe(colld_daemon_t *d, colld_session_t *s, const colld_wire_sqe_t *sqe, uint64_t id,
                        colld_status_t st)
{
    if (!(sqe->flags & COLLD_SQE_FAST))
        colld_count_op(d, sqe->kind, sqe->dtype, payload_bytes(sqe), st);
    release_stream(s, sqe, id, st);
    retire(s, sqe, id, st);
}

void colld_op_retire(colld_op_t *op, colld_status_t st)
{
    /* A failed record is that rank's collective failing (a finished one is dropped by
     * colld_op_drop_record, and the ranks count those themselves). */
    colld_daemon_t *d = op->session->daemon;
    colld_count_op(d, op->d.kind, op->d.dtype, payload_bytes(&op->d), st);
    release_stream(op->session, &op->d, op->id, st);
    retire(op->session, &op->d, op->id, st);
    if (op->send_reg)
        colld_session_release_reg(op->send_reg);
    if (op->recv_reg)
        colld_session_release_reg(op->recv_reg);
    colld_session_unref(op->session);
    op_release(d, op);
}

void colld_op_drop_record(colld_daemon_t *d, colld_op_t *op)
{
    op->session->in_flight--;
    colld_session_unref(op->session);
    op_release(d, op);
}
