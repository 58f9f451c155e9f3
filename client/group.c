/*
 * group.c - group calls (colld_group_start / colld_group_end), as NCCL's.
 *
 * Between start and end, collectives are validated and routed at once (coll.c) but not posted:
 * they wait in a per-thread list and colld_group_end starts them all with their paths' posters
 * (engine_path.c, fast.c, cuda.c), in call order per communicator. Engine
 * collectives of one client are posted in one batch with one wake-up of the daemon; fast-path
 * collectives (fast.c) are started as soon as their communicator has nothing else in flight, so
 * one thread can drive several ranks (one communicator handle each) in one group without waiting
 * on itself. Groups nest; only the outermost end starts anything. A call that fails validation
 * inside a group returns its error at once and poisons the group (colld__comm_error, here, records
 * a call's failure on its communicator and in the group): colld_group_end then starts nothing and
 * returns that first error. Sequence numbers are given at start, so a discarded group
 * leaves every communicator exactly as it was. A stream-ordered collective (cuda.c) is validated
 * and its buffers registered when it is called; at the end it is posted on its own, in order with
 * the other ops of its communicator, once its stream operations are enqueued; if that fails,
 * colld_group_end returns the error.
 *
 * Sends and receives of a group run concurrently, as in NCCL: colld_group_end posts a
 * communicator's sends and receives after its collectives of the group, as one batch (each but
 * the last with COLLD_SQE_LINK, proto/wire.h), so that e.g. two ranks that each send to the other
 * and receive from it never wait for each other. A batch on GPU buffers (stream-ordered) is posted
 * at once by cuda.c (colld__gpu_post_batch): its streams are joined, and one ready write and one
 * wait stand for the whole batch, so that no send waits on its stream for a receive of the same
 * group. A batch is all stream-ordered or all on host buffers (batch_streams). The daemon may need
 * every operation of a batch at once, so the point-to-point operations of one group on one
 * connection must fit its rings: more than the ring's entries are refused
 * (COLLD_ERR_INVALID_USAGE, nothing posted).
 */
#include "client/client_internal.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    colld_comm_t *comm;
    colld_wire_sqe_t sqe;
    colld_pending_t *pending;
    bool fast; /* a fast-path collective: the buffers below instead of sqe's references */
    bool gpu;  /* a stream-ordered collective: gop */
    bool done;
    colld_gpu_op_t gop;
    const void *send;
    void *recv;
    size_t send_bytes, recv_bytes;
} queued_t;

typedef struct {
    int depth;
    colld_status_t error; /* first error inside the group */
    queued_t *ops;
    size_t n, cap;
} group_t;

static _Thread_local group_t group;

bool colld__group_active(void)
{
    return group.depth > 0;
}

void colld__group_fail(colld_status_t st)
{
    if (group.depth > 0 && group.error == COLLD_OK)
        group.error = st;
}

/* Record a call's failure: its detail on the communicator (errors.c) and, inside a group, the
 * group's first error. Returns st. */
colld_status_t colld__comm_error(colld_comm_t *comm, colld_status_t st, const char *fmt, ...)
{
    char text[COLLD_CLIENT_DETAIL_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    colld__group_fail(st);
    return colld__comm_note(comm, st, "%s", text);
}

/* Room for one more queued op; false (group poisoned) when memory is out. */
static bool group_grow(void)
{
    if (group.n < group.cap)
        return true;
    size_t cap = group.cap ? group.cap * 2 : 64;
    queued_t *ops = realloc(group.ops, cap * sizeof(*ops));
    if (!ops) {
        colld__group_fail(COLLD_ERR_NO_MEMORY);
        return false;
    }
    group.ops = ops;
    group.cap = cap;
    return true;
}

colld_status_t colld__group_queue(colld_comm_t *comm, const colld_wire_sqe_t *sqe, colld_pending_t *pending,
                                  const colld_gpu_op_t *gpu, colld_err_t *err)
{
    if (!group_grow()) {
        colld__engine_discard(comm, pending);
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "cannot queue the collective: out of memory");
    }
    group.ops[group.n++] = (queued_t){ .comm = comm, .sqe = *sqe, .pending = pending, .gpu = gpu != NULL };
    if (gpu) {
        group.ops[group.n - 1].gop = *gpu;
        group.ops[group.n - 1].gop.cur = NULL; /* posted later, perhaps with another context current */
    }
    return COLLD_OK;
}

colld_status_t colld__group_queue_fast(colld_comm_t *comm, colld_kind_t kind, const void *send, size_t send_bytes,
                                       void *recv, size_t recv_bytes, size_t count, colld_dtype_t dtype, uint8_t redop,
                                       uint64_t scalar, int root)
{
    if (!group_grow())
        return COLLD_ERR_NO_MEMORY;
    queued_t q = {
        .comm = comm, .fast = true, .send = send, .recv = recv, .send_bytes = send_bytes, .recv_bytes = recv_bytes
    };
    q.sqe.kind = (uint8_t)kind;
    q.sqe.dtype = (uint8_t)dtype;
    q.sqe.redop = redop;
    q.sqe.root = root;
    q.sqe.count = count;
    colld_wire_sqe_set_scalar(&q.sqe, scalar); /* the operator may be destroyed before the group ends */
    group.ops[group.n++] = q;
    return COLLD_OK;
}

/* Forget the queued operations (the group is over); release what was never posted. */
static void group_reset(bool posted)
{
    for (size_t i = 0; i < group.n && !posted; i++)
        colld__engine_discard(group.ops[i].comm, group.ops[i].pending);
    free(group.ops);
    memset(&group, 0, sizeof(group));
}

/* A communicator's batch is stream-ordered when one of its sends and receives is (a device buffer or
 * a stream): the daemon runs a batch all on GPU buffers or all on host buffers. Sends and receives of
 * nothing (count 0: no buffer, nothing staged) that were routed to the host become stream-ordered on
 * the stream of the batch's last stream-ordered one (colld_alltoallv with stream NULL on device
 * buffers has such ones); any other mix is refused (COLLD_ERR_INVALID_USAGE), nothing posted. */
static colld_status_t batch_streams(void)
{
    for (size_t i = 0; i < group.n; i++) {
        queued_t *q = &group.ops[i];
        if (!q->gpu || !colld_kind_is_p2p(q->sqe.kind))
            continue;
        const colld_gpu_op_t *gop = NULL; /* the last stream-ordered one of q's communicator */
        for (size_t j = 0; j < group.n; j++)
            if (group.ops[j].comm == q->comm && group.ops[j].gpu && colld_kind_is_p2p(group.ops[j].sqe.kind))
                gop = &group.ops[j].gop;
        for (size_t j = 0; j < group.n; j++) {
            queued_t *h = &group.ops[j];
            if (h->comm != q->comm || h->gpu || !colld_kind_is_p2p(h->sqe.kind))
                continue;
            if (h->sqe.count != 0 || h->pending) {
                return colld__comm_note(q->comm, COLLD_ERR_INVALID_USAGE,
                                        "a group holds sends and receives on one communicator both on GPU buffers (or "
                                        "with a stream) and on host buffers: use one kind per group and communicator "
                                        "(nothing was posted)");
            }
            h->gpu = true;
            h->gop = *gop;
            memset(&h->sqe.send, 0, sizeof(h->sqe.send));
            memset(&h->sqe.recv, 0, sizeof(h->sqe.recv));
        }
    }
    return COLLD_OK;
}

/* Post the group's sends and receives after its other operations (keeping the order of each kind),
 * and link each to the next one of its communicator: one batch per communicator. Returns COLLD_OK,
 * or COLLD_ERR_INVALID_USAGE when a connection's share does not fit its rings. */
static colld_status_t batch_p2p(void)
{
    size_t n = group.n, k = 0, np = 0;
    for (size_t i = 0; i < n; i++)
        np += colld_kind_is_p2p(group.ops[i].sqe.kind);
    if (np == 0) /* a group of collectives only (the common one): nothing to reorder or link */
        return COLLD_OK;
    queued_t *sorted = malloc(n * sizeof(*sorted));
    if (!sorted)
        return COLLD_ERR_NO_MEMORY;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++)
            if (colld_kind_is_p2p(group.ops[i].sqe.kind) == (pass == 1))
                sorted[k++] = group.ops[i];
    memcpy(group.ops, sorted, n * sizeof(*sorted));
    free(sorted);
    for (size_t i = 0; i < n; i++) {
        queued_t *q = &group.ops[i];
        if (!colld_kind_is_p2p(q->sqe.kind))
            continue;
        size_t same_client = 0;
        for (size_t j = 0; j < n; j++)
            same_client += colld_kind_is_p2p(group.ops[j].sqe.kind) && group.ops[j].comm->client == q->comm->client;
        if (same_client > q->comm->client->entries) {
            return colld__comm_note(q->comm, COLLD_ERR_INVALID_USAGE,
                                    "a group holds %zu sends and receives on one connection to colld; at most %u fit "
                                    "its rings (the daemon's --ring-entries): split the group",
                                    same_client, q->comm->client->entries);
        }
        for (size_t j = i + 1; j < n; j++)
            if (group.ops[j].comm == q->comm && colld_kind_is_p2p(group.ops[j].sqe.kind)) {
                q->sqe.flags |= COLLD_SQE_LINK;
                break;
            }
    }
    return COLLD_OK;
}

colld_status_t colld_group_start(void)
{
    group.depth++;
    return COLLD_OK;
}

/* Post a batch of numbered engine collectives of one client; the first error wins. */
static void flush(colld_client_t *c, colld_wire_sqe_t *batch, size_t *k, colld_status_t *first)
{
    if (!*k)
        return;
    colld_status_t st = colld__client_submit(c, batch, *k);
    if (st != COLLD_OK && *first == COLLD_OK)
        *first = st; /* the daemon is lost: the counters no longer matter */
    *k = 0;
}

/* Post the stream-ordered batch of sends and receives that starts at queued op i (every later one of
 * its communicator: batch_p2p put them last), as one (colld__gpu_post_batch). Marks the others done
 * and counts them in *also. */
static colld_status_t post_gpu_batch(size_t i, size_t *also, colld_err_t *err)
{
    queued_t *q = &group.ops[i];
    size_t n = 0;
    for (size_t j = i; j < group.n; j++)
        n += group.ops[j].comm == q->comm && !group.ops[j].done;
    colld_wire_sqe_t *sqes = calloc(n, sizeof(*sqes));
    colld_gpu_op_t *gops = calloc(n, sizeof(*gops));
    colld_status_t st = COLLD_ERR_NO_MEMORY;
    colld_err_set(err, st, "cannot post the group's sends and receives: out of memory");
    if (sqes && gops) {
        size_t k = 0;
        for (size_t j = i; j < group.n; j++)
            if (group.ops[j].comm == q->comm && !group.ops[j].done) {
                sqes[k] = group.ops[j].sqe;
                gops[k++] = group.ops[j].gop;
                if (j != i) {
                    group.ops[j].done = true;
                    (*also)++;
                }
            }
        st = colld__gpu_post_batch(q->comm, sqes, gops, n, err);
    }
    free(sqes);
    free(gops);
    return st;
}

/* Try to start queued op i: COLLD_INPROGRESS while its communicator has something in flight that
 * must finish first, else the op is done (started, or failed with the returned error); a
 * stream-ordered batch of sends and receives is posted at once, its other ops counted in *also. A
 * stream-ordered op that cannot be posted also records its error in *late. */
static colld_status_t try_start(size_t i, colld_wire_sqe_t *batch, size_t *k, colld_client_t **batch_client,
                                colld_status_t *first, colld_status_t *late, size_t *also)
{
    queued_t *q = &group.ops[i];
    colld_comm_t *comm = q->comm;
    colld_status_t st = __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED);
    if (st == COLLD_OK && atomic_load(&comm->client->lost))
        st = COLLD_ERR_DAEMON_LOST;
    if (st != COLLD_OK) {
        colld__engine_discard(comm, q->pending); /* the communicator broke meanwhile: its error is reported */
        return colld__comm_fail_async(comm, st);
    }
    st = colld__fast_finish(comm, false);
    if (st != COLLD_OK) {
        if (st != COLLD_INPROGRESS)
            colld__engine_discard(comm, q->pending);
        return st;
    }
    if (q->gpu) {
        /* On its own, after the batch: its stream operations carry its sequence number. */
        flush(*batch_client, batch, k, first);
        colld_err_t err = COLLD_ERR_INIT;
        st = colld_kind_is_p2p(q->sqe.kind) ? post_gpu_batch(i, also, &err)
                                            : colld__gpu_post(comm, &q->sqe, &q->gop, &err);
        if (st != COLLD_OK) {
            colld__comm_note(comm, st, "%.400s", err.msg);
            if (*late == COLLD_OK)
                *late = st;
        }
        return st;
    }
    if (!q->fast) {
        if (*batch_client != comm->client)
            flush(*batch_client, batch, k, first);
        *batch_client = comm->client;
        batch[*k] = q->sqe;
        colld__engine_number(comm, &batch[(*k)++], q->pending);
        return COLLD_OK;
    }
    colld__client_poll(comm->client);
    if (__atomic_load_n(&comm->completed, __ATOMIC_ACQUIRE) < comm->issued) {
        flush(*batch_client, batch, k, first); /* it may be waiting for ops still in the batch */
        return COLLD_INPROGRESS;
    }
    colld_err_t err = COLLD_ERR_INIT;
    st = colld__fast_post(comm, (colld_kind_t)q->sqe.kind, q->send, q->send_bytes, q->recv, q->recv_bytes, q->sqe.count,
                          (colld_dtype_t)q->sqe.dtype, q->sqe.redop, colld_wire_sqe_scalar(&q->sqe), q->sqe.root, &err);
    if (st != COLLD_OK)
        colld__comm_note(comm, st, "%.400s", err.msg);
    return st;
}

colld_status_t colld_group_end(void)
{
    if (group.depth == 0)
        return COLLD_ERR_INVALID_USAGE;
    if (--group.depth > 0)
        return COLLD_OK;
    colld_status_t st = group.error;
    if (st == COLLD_OK)
        st = batch_p2p();
    if (st == COLLD_OK)
        st = batch_streams();
    if (st != COLLD_OK) {
        group_reset(false);
        return st;
    }
    colld_wire_sqe_t *batch = group.n ? malloc(group.n * sizeof(*batch)) : NULL;
    if (group.n && !batch) {
        group_reset(false);
        return COLLD_ERR_NO_MEMORY;
    }
    /* Passes over the list: an op starts once the ops before it on the same communicator have
     * started and its communicator has nothing in flight that it must wait for. Every wait ends:
     * peers arrive, or the daemon fails the communicator (time-out, lost peer, abort). */
    size_t left = group.n, k = 0;
    colld_client_t *batch_client = NULL;
    colld_status_t late = COLLD_OK;
    for (unsigned idle = 0; left > 0 && st == COLLD_OK;) {
        bool progress = false;
        colld_comm_t *waiting = NULL; /* the first communicator an op waits on */
        for (size_t i = 0; i < group.n && st == COLLD_OK; i++) {
            if (group.ops[i].done)
                continue;
            bool blocked = false;
            for (size_t j = 0; j < i && !blocked; j++)
                blocked = !group.ops[j].done && group.ops[j].comm == group.ops[i].comm;
            if (blocked)
                continue;
            size_t also = 0;
            colld_status_t r = try_start(i, batch, &k, &batch_client, &st, &late, &also);
            if (r == COLLD_INPROGRESS) {
                if (!waiting)
                    waiting = group.ops[i].comm;
                continue;
            }
            if (r == COLLD_ERR_DAEMON_LOST)
                st = r;
            group.ops[i].done = true;
            left -= 1 + also;
            progress = true;
        }
        flush(batch_client, batch, &k, &st);
        if (progress)
            idle = 0;
        else if (waiting)
            colld__fast_nap(waiting, idle++);
    }
    /* Ops never started (the daemon was lost) release what they staged. */
    for (size_t i = 0; i < group.n; i++)
        if (!group.ops[i].done)
            colld__engine_discard(group.ops[i].comm, group.ops[i].pending);
    free(batch);
    group_reset(true);
    return st != COLLD_OK ? st : late;
}
