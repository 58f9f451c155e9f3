/*
 * coll.c - libcolld's collectives: the router. A call is checked (the communicator, dtype, op,
 * root, sizes, buffers), then routed to exactly one path, whose poster makes it happen:
 *
 *   GPU stream  with a CUDA stream, or on device buffers with stream NULL (the legacy default
 *               stream, as NCCL): colld__gpu_prepare, then colld__gpu_post (cuda.c)
 *   fast        host buffers whose per-rank input fits the communicator's fast area:
 *               colld__fast_post (fast.c), the ranks run it themselves
 *   engine      everything else, staged when not from colld_mem_alloc (staging.c):
 *               colld__engine_post (engine_path.c), the daemon's engine runs it
 *
 * Sends and receives (colld_send, colld_recv) take the engine path on host buffers and the GPU
 * stream path on device buffers or with a stream (never the fast path); inside a group, group.c
 * posts a communicator's sends and receives as one batch.
 *
 * Inside a group (group.c) the call is checked and routed now, and queued; colld_group_end runs
 * the same posters. Device pointers are only looked for when the CUDA driver is loaded in the
 * process, and never for buffers inside host registrations, so host programs pay nothing for the
 * GPU path. Whatever a path posts, every rank of the communicator takes the same path for the same
 * call (the choice depends only on the call and the communicator).
 */
#include "client/client_internal.h"

#include "common/util.h"

#include <stdio.h>
#include <string.h>

/* A collective as the caller made it, checked. */
typedef struct {
    colld_kind_t kind;
    const void *send;
    size_t send_bytes; /* bytes each buffer must hold on this rank (0: not used here) */
    void *recv;
    size_t recv_bytes;
    size_t count;
    colld_dtype_t dtype;
    colld_redop_t op;
    uint8_t wire_op; /* op as the descriptor has it (redop.c) */
    uint64_t scalar; /* a premultiplied sum: this rank's scalar word; else 0 */
    int root;
    bool reduces;
    void *stream;
    colld_wire_sqe_t sqe; /* the descriptor: its buffers where the router resolved them */
    int ls, lr;           /* colld__client_lookup2's verdicts on the two buffers */
} call_t;

typedef enum { PATH_GPU, PATH_FAST, PATH_ENGINE } path_t;

/* Check what every collective needs: a live daemon, a communicator not broken, a known dtype.
 * Returns COLLD_OK or the error (recorded). */
static colld_status_t check_common(colld_comm_t *comm, colld_dtype_t dtype)
{
    if (atomic_load(&comm->client->lost))
        return colld__comm_error(comm, COLLD_ERR_DAEMON_LOST, "%s", colld__lost_detail(comm->client));
    colld_status_t err = __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED);
    if (err != COLLD_OK) {
        colld__group_fail(err);
        return colld__comm_fail_async(comm, err); /* broken: fail fast with the first error */
    }
    if ((unsigned)dtype >= COLLD_DTYPE_COUNT)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "unknown dtype %d", (int)dtype);
    return COLLD_OK;
}

/* Fill the signature fields of the call's descriptor. */
static void describe(call_t *k, const colld_comm_t *comm)
{
    k->sqe.count = k->count;
    k->sqe.comm = comm->handle;
    k->sqe.kind = (uint8_t)k->kind;
    k->sqe.dtype = (uint8_t)k->dtype;
    k->sqe.redop = k->reduces ? k->wire_op : 0;
    k->sqe.root = k->root;
    colld_wire_sqe_set_scalar(&k->sqe, k->scalar);
}

/* Route, step 1: the arguments (op, root, sizes without overflow). */
static colld_status_t check_args(colld_comm_t *comm, call_t *k, size_t send_elems, size_t recv_elems)
{
    colld_status_t st = check_common(comm, k->dtype);
    if (st != COLLD_OK)
        return st;
    k->reduces = k->kind == COLLD_KIND_ALLREDUCE || k->kind == COLLD_KIND_REDUCE || k->kind == COLLD_KIND_REDUCESCATTER;
    if (k->reduces && (st = colld__redop_resolve(comm, k->op, k->dtype, &k->wire_op, &k->scalar)) != COLLD_OK)
        return st;
    bool rooted = k->kind == COLLD_KIND_BROADCAST || k->kind == COLLD_KIND_REDUCE || k->kind == COLLD_KIND_GATHER ||
                  k->kind == COLLD_KIND_SCATTER;
    if (rooted && (k->root < 0 || k->root >= comm->nranks))
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "root %d is out of range for %d ranks", k->root,
                                 comm->nranks);
    if (colld_kind_is_p2p(k->kind) && (k->root < 0 || k->root >= comm->nranks))
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "%s: peer %d is out of range for %d ranks",
                                 k->kind == COLLD_KIND_SEND ? "colld_send" : "colld_recv", k->root, comm->nranks);
    size_t es = colld_dtype_size(k->dtype);
    if (__builtin_mul_overflow(send_elems, es, &k->send_bytes) ||
        __builtin_mul_overflow(recv_elems, es, &k->recv_bytes))
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "count %zu overflows", k->count);
    return COLLD_OK;
}

/* Route, step 2: host buffers are found in the registrations (or will be staged); memory outside
 * them may be device memory when the application uses CUDA, and device buffers with stream NULL
 * are stream-ordered on the legacy default stream. Sets *path. */
static colld_status_t resolve_host(colld_comm_t *comm, call_t *k, path_t *path)
{
    *path = PATH_ENGINE;
    if ((k->send_bytes && !k->send) || (k->recv_bytes && !k->recv))
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "%s is NULL",
                                 k->send_bytes && !k->send ? "sendbuf" : "recvbuf");
    colld__client_lookup2(comm->client, k->send, k->send_bytes, k->recv, k->recv_bytes, &k->sqe.send, &k->sqe.recv,
                          &k->ls, &k->lr);
    if (k->ls == -2 || k->lr == -2)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "%s (%p): %zu bytes run past the end of its buffer",
                                 k->ls == -2 ? "sendbuf" : "recvbuf", k->ls == -2 ? k->send : (const void *)k->recv,
                                 k->ls == -2 ? k->send_bytes : k->recv_bytes);
    if ((k->ls == -1 || k->lr == -1) && colld__gpu_maybe_device(comm->client)) {
        bool sdev = k->ls == -1 && colld__gpu_is_device(comm->client, k->send);
        bool rdev = k->lr == -1 && colld__gpu_is_device(comm->client, k->recv);
        bool shost = k->send_bytes && !sdev, rhost = k->recv_bytes && !rdev;
        if ((sdev || rdev) && (shost || rhost))
            return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT,
                                     "%s (%p) is device memory but %s (%p) is host memory: both buffers of a "
                                     "collective must be device memory (stream-ordered) or both host memory",
                                     sdev ? "sendbuf" : "recvbuf", sdev ? k->send : (const void *)k->recv,
                                     sdev ? "recvbuf" : "sendbuf", sdev ? (const void *)k->recv : k->send);
        if (sdev || rdev) {
            *path = PATH_GPU;
            return COLLD_OK;
        }
    }
    /* The daemon takes only element-aligned offsets (its kernels load whole elements): memory of
     * colld_mem_alloc at a misaligned address is staged like any other pointer. */
    size_t es = colld_dtype_size(k->dtype);
    if (k->ls == 0 && k->send_bytes && k->sqe.send.offset % es) {
        k->ls = -1;
        memset(&k->sqe.send, 0, sizeof(k->sqe.send));
    }
    if (k->lr == 0 && k->recv_bytes && k->sqe.recv.offset % es) {
        k->lr = -1;
        memset(&k->sqe.recv, 0, sizeof(k->sqe.recv));
    }
    if (colld__fast_eligible(comm, k->kind, k->count, k->dtype))
        *path = PATH_FAST;
    return COLLD_OK;
}

/* The GPU stream path. Its buffers are resolved and its stream checked now, also inside a group,
 * so that errors come from this call. */
static colld_status_t go_gpu(colld_comm_t *comm, call_t *k)
{
    /* A fast-path collective still in flight finishes first (the daemon sees sequence numbers in
     * order). */
    colld_status_t st;
    if (!colld__group_active() && (st = colld__fast_finish(comm, true)) != COLLD_OK)
        return st;
    colld_gpu_op_t gop;
    colld_err_t err = COLLD_ERR_INIT;
    memset(&k->sqe, 0, sizeof(k->sqe));
    st = colld__gpu_prepare(comm, k->stream, colld__group_active(), k->send, k->send_bytes, k->recv, k->recv_bytes,
                            &k->sqe, &gop, &err);
    if (st != COLLD_OK)
        return colld__comm_error(comm, st, "%s", err.msg);
    if (gop.capture && colld_kind_is_p2p(k->kind))
        return colld__comm_error(comm, COLLD_ERR_NOT_SUPPORTED,
                                 "%s on stream %p, which is being captured into a CUDA graph: capturing a send or "
                                 "receive is not supported yet (nothing was enqueued)",
                                 k->kind == COLLD_KIND_SEND ? "colld_send" : "colld_recv", k->stream);
    describe(k, comm);
    st = colld__group_active() ? colld__group_queue(comm, &k->sqe, NULL, &gop, &err)
                               : colld__gpu_post(comm, &k->sqe, &gop, &err);
    return st == COLLD_OK ? st : colld__comm_error(comm, st, "%s", err.msg);
}

/* The fast path. */
static colld_status_t go_fast(colld_comm_t *comm, call_t *k)
{
    colld_status_t st;
    colld_err_t err = COLLD_ERR_INIT;
    if (colld__group_active()) {
        st = colld__group_queue_fast(comm, k->kind, k->send, k->send_bytes, k->recv, k->recv_bytes, k->count, k->dtype,
                                     k->wire_op, k->scalar, k->root);
        return st == COLLD_OK ? st
                              : colld__comm_error(comm, st, "cannot queue the collective: %s", colld_status_string(st));
    }
    /* Everything issued before on this communicator finishes first: its outputs may be this call's
     * inputs, and the fast area holds one collective per rank at a time. */
    if ((st = colld__comm_wait(comm)) != COLLD_OK)
        return st;
    st = colld__fast_post(comm, k->kind, k->send, k->send_bytes, k->recv, k->recv_bytes, k->count, k->dtype, k->wire_op,
                          k->scalar, k->root, &err);
    return st == COLLD_OK ? st : colld__comm_error(comm, st, "%s", err.msg);
}

/* The engine path: memory not from colld_mem_alloc is staged. */
static colld_status_t go_engine(colld_comm_t *comm, call_t *k)
{
    colld_status_t st;
    colld_err_t err = COLLD_ERR_INIT;
    /* A fast-path collective still in flight finishes first (its output may be this input). */
    if (!colld__group_active() && (st = colld__fast_finish(comm, true)) != COLLD_OK)
        return st;
    colld_pending_t *pending;
    st = colld__stage(comm, k->send, k->send_bytes, k->recv, k->recv_bytes, k->ls, k->lr, &k->sqe.send, &k->sqe.recv,
                      &pending, &err);
    if (st != COLLD_OK)
        return colld__comm_error(comm, st, "%s", err.msg);
    describe(k, comm);
    st = colld__group_active() ? colld__group_queue(comm, &k->sqe, pending, NULL, &err)
                               : colld__engine_post(comm, &k->sqe, pending, &err);
    return st == COLLD_OK ? st : colld__comm_error(comm, st, "%s", err.msg);
}

/* Check one collective and route it to its path. send_elems/recv_elems are the elements each
 * buffer must hold on this rank (0: the buffer is not used here and may be NULL). */
static colld_status_t route(colld_comm_t *comm, colld_kind_t kind, const void *sendbuf, size_t send_elems,
                            void *recvbuf, size_t recv_elems, size_t count, colld_dtype_t dtype, colld_redop_t op,
                            int root, void *stream)
{
    call_t k = { .kind = kind,
                 .send = sendbuf,
                 .recv = recvbuf,
                 .count = count,
                 .dtype = dtype,
                 .op = op,
                 .root = root,
                 .stream = stream };
    colld_status_t st = check_args(comm, &k, send_elems, recv_elems);
    if (st != COLLD_OK)
        return st;
    path_t path = PATH_GPU;
    if (!stream && (st = resolve_host(comm, &k, &path)) != COLLD_OK)
        return st;
    if (kind == COLLD_KIND_ALLTOALL && k.send_bytes && (const char *)sendbuf < (const char *)recvbuf + k.recv_bytes &&
        (const char *)recvbuf < (const char *)sendbuf + k.send_bytes)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT,
                                 "colld_alltoall: sendbuf (%p) and recvbuf (%p) overlap: all-to-all has no in-place "
                                 "form",
                                 sendbuf, (const void *)recvbuf);
    switch (path) {
    case PATH_GPU:
        return go_gpu(comm, &k);
    case PATH_FAST:
        return go_fast(comm, &k);
    case PATH_ENGINE:
        break;
    }
    return go_engine(comm, &k);
}

/* count * n without overflow, or SIZE_MAX (which then fails the buffer check). */
static size_t times(size_t count, int n)
{
    size_t r;
    return __builtin_mul_overflow(count, (size_t)n, &r) ? SIZE_MAX : r;
}

colld_status_t colld_allreduce(const void *sendbuf, void *recvbuf, size_t count, colld_dtype_t dtype, colld_redop_t op,
                               colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return route(comm, COLLD_KIND_ALLREDUCE, sendbuf, count, recvbuf, count, count, dtype, op, 0, stream);
}

colld_status_t colld_broadcast(const void *sendbuf, void *recvbuf, size_t count, colld_dtype_t dtype, int root,
                               colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return route(comm, COLLD_KIND_BROADCAST, sendbuf, comm->rank == root ? count : 0, recvbuf, count, count, dtype,
                 COLLD_SUM, root, stream);
}

colld_status_t colld_reduce(const void *sendbuf, void *recvbuf, size_t count, colld_dtype_t dtype, colld_redop_t op,
                            int root, colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return route(comm, COLLD_KIND_REDUCE, sendbuf, count, recvbuf, comm->rank == root ? count : 0, count, dtype, op,
                 root, stream);
}

colld_status_t colld_allgather(const void *sendbuf, void *recvbuf, size_t sendcount, colld_dtype_t dtype,
                               colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return route(comm, COLLD_KIND_ALLGATHER, sendbuf, sendcount, recvbuf, times(sendcount, comm->nranks), sendcount,
                 dtype, COLLD_SUM, 0, stream);
}

colld_status_t colld_reducescatter(const void *sendbuf, void *recvbuf, size_t recvcount, colld_dtype_t dtype,
                                   colld_redop_t op, colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return route(comm, COLLD_KIND_REDUCESCATTER, sendbuf, times(recvcount, comm->nranks), recvbuf, recvcount, recvcount,
                 dtype, op, 0, stream);
}

colld_status_t colld_gather(const void *sendbuf, void *recvbuf, size_t sendcount, colld_dtype_t dtype, int root,
                            colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return route(comm, COLLD_KIND_GATHER, sendbuf, sendcount, recvbuf,
                 comm->rank == root ? times(sendcount, comm->nranks) : 0, sendcount, dtype, COLLD_SUM, root, stream);
}

colld_status_t colld_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, colld_dtype_t dtype, int root,
                             colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return route(comm, COLLD_KIND_SCATTER, sendbuf, comm->rank == root ? times(recvcount, comm->nranks) : 0, recvbuf,
                 recvcount, recvcount, dtype, COLLD_SUM, root, stream);
}

colld_status_t colld_alltoall(const void *sendbuf, void *recvbuf, size_t count, colld_dtype_t dtype, colld_comm_t *comm,
                              void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return route(comm, COLLD_KIND_ALLTOALL, sendbuf, times(count, comm->nranks), recvbuf, times(count, comm->nranks),
                 count, dtype, COLLD_SUM, 0, stream);
}

colld_status_t colld_send(const void *sendbuf, size_t count, colld_dtype_t dtype, int peer, colld_comm_t *comm,
                          void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return route(comm, COLLD_KIND_SEND, sendbuf, count, NULL, 0, count, dtype, COLLD_SUM, peer, stream);
}

colld_status_t colld_recv(void *recvbuf, size_t count, colld_dtype_t dtype, int peer, colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return route(comm, COLLD_KIND_RECV, NULL, 0, recvbuf, count, count, dtype, COLLD_SUM, peer, stream);
}

colld_status_t colld_barrier(colld_comm_t *comm)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    if (colld__group_active())
        return colld__comm_error(comm, COLLD_ERR_INVALID_USAGE,
                                 "colld_barrier inside a group: call colld_group_end first");
    /* An all-reduce of nothing completes only once every rank has posted it; waiting for it (not
     * for the communicator) keeps a fault that comes after it out of its result. */
    colld_status_t st = colld_allreduce(NULL, NULL, 0, COLLD_INT8, COLLD_SUM, comm, NULL);
    return st == COLLD_OK ? colld__ring_wait_op(comm->client, comm, comm->seq, true) : st;
}

colld_status_t colld_comm_last_op(colld_comm_t *comm, uint64_t *op)
{
    if (!comm || !op)
        return COLLD_ERR_INVALID_ARGUMENT;
    if (colld__group_active())
        return colld__comm_error(comm, COLLD_ERR_INVALID_USAGE,
                                 "colld_comm_last_op inside a group: the group's collectives get their ids at "
                                 "colld_group_end");
    *op = comm->seq;
    return COLLD_OK;
}

/* The checks of colld_op_query and colld_op_wait. */
static colld_status_t check_op(colld_comm_t *comm, uint64_t op, const char *what)
{
    if (op == 0 || op > comm->seq)
        return colld__comm_error(comm, COLLD_ERR_INVALID_ARGUMENT,
                                 "%s: operation %llu was not issued on this communicator (the last is %llu)", what,
                                 (unsigned long long)op, (unsigned long long)comm->seq);
    if (colld__group_active())
        return colld__comm_error(comm, COLLD_ERR_INVALID_USAGE, "%s inside a group: call colld_group_end first", what);
    return COLLD_OK;
}

colld_status_t colld_op_query(colld_comm_t *comm, uint64_t op)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    colld_status_t st = check_op(comm, op, "colld_op_query");
    return st != COLLD_OK ? st : colld__comm_fail_async(comm, colld__ring_wait_op(comm->client, comm, op, false));
}

colld_status_t colld_op_wait(colld_comm_t *comm, uint64_t op)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    colld_status_t st = check_op(comm, op, "colld_op_wait");
    return st != COLLD_OK ? st : colld__comm_fail_async(comm, colld__ring_wait_op(comm->client, comm, op, true));
}

colld_status_t colld_comm_synchronize(colld_comm_t *comm)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    if (colld__group_active())
        return colld__comm_error(comm, COLLD_ERR_INVALID_USAGE,
                                 "colld_comm_synchronize inside a group: call colld_group_end first");
    return colld__comm_fail_async(comm, colld__comm_wait(comm));
}

colld_status_t colld_comm_query(colld_comm_t *comm)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    colld__client_poll(comm->client);
    if (colld__fast_finish(comm, false) == COLLD_INPROGRESS)
        return COLLD_INPROGRESS;
    colld_status_t err = __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED);
    if (err != COLLD_OK)
        return colld__comm_fail_async(comm, err);
    if (atomic_load(&comm->client->lost))
        return COLLD_ERR_DAEMON_LOST; /* even with nothing pending: the communicator is unusable */
    if (__atomic_load_n(&comm->completed, __ATOMIC_ACQUIRE) >= comm->issued)
        return COLLD_OK;
    return COLLD_INPROGRESS;
}
