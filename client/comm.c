/*
 * comm.c - libcolld communicators and collectives.
 *
 * Joining and destroying go through the control plane (gRPC); collectives are descriptors posted
 * on the submission ring, matched by the daemon across ranks by sequence number. Each
 * communicator keeps its first error (sticky, as NCCL's async error): once broken, calls on it
 * fail fast with that status, and colld_comm_last_error explains it.
 *
 * Which path a collective takes: with a CUDA stream, or on device buffers with stream NULL (the
 * legacy default stream, as NCCL), it is stream-ordered (cuda.c); otherwise host buffers go to
 * the communicator's fast area when small (fast.c), else to the engine, staged when they are not
 * from colld_mem_alloc (staging.c). Device pointers are only looked for when the CUDA driver is
 * loaded in the process, and never for buffers inside host registrations, so host programs pay
 * nothing for the GPU path.
 */
#include "client/client_internal.h"

#include "colld.pb-c.h"
#include "common/log.h"
#include "common/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOIN_RPC_MARGIN_MS 5000
#define ABORT_RPC_TIMEOUT_MS 2000

/* Record a client-side error on a communicator and return it. */
static colld_status_t comm_error(colld_comm_t *comm, colld_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static colld_status_t comm_error(colld_comm_t *comm, colld_status_t st, const char *fmt, ...)
{
    colld__group_fail(st);
    va_list ap;
    int n = snprintf(comm->last_error, sizeof(comm->last_error), "%s: ", colld_status_name(st));
    va_start(ap, fmt);
    vsnprintf(comm->last_error + n, sizeof(comm->last_error) - (size_t)n, fmt, ap);
    va_end(ap);
    comm->detail_fetched = true;
    LOG_INFO(CLIENT, "%s: %s", colld_status_name(st), comm->last_error);
    return st;
}

colld_status_t colld_get_unique_id(colld_client_t *c, colld_unique_id_t *id)
{
    if (!c || !id)
        return COLLD_ERR_INVALID_ARGUMENT;
    Colld__V1__GetUniqueIdRequest req = COLLD__V1__GET_UNIQUE_ID_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    Colld__V1__GetUniqueIdResponse *resp = NULL;
    char detail[256] = "";
    colld_status_t st = colld__client_rpc(c, "/colld.v1.Colld/GetUniqueId", &req.base,
                                          &colld__v1__get_unique_id_response__descriptor, COLLD_CLIENT_RPC_TIMEOUT_MS,
                                          (ProtobufCMessage **)&resp, detail, sizeof(detail));
    if (st != COLLD_OK) {
        LOG_WARN(CLIENT, "colld_get_unique_id: %s: %s", colld_status_name(st), detail);
        return st;
    }
    if (resp->unique_id.len != COLLD_WIRE_UNIQUE_ID_BYTES) {
        protobuf_c_message_free_unpacked(&resp->base, NULL);
        return COLLD_ERR_PROTOCOL;
    }
    memset(id, 0, sizeof(*id));
    memcpy(id->internal, resp->unique_id.data, resp->unique_id.len);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return COLLD_OK;
}

colld_status_t colld_comm_init_rank(colld_client_t *c, colld_comm_t **comm, int nranks, colld_unique_id_t id,
                                    int rank, const colld_comm_config_t *cfg)
{
    if (!c || !comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    *comm = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        LOG_WARN(CLIENT, "colld_comm_init_rank: rank %d / nranks %d out of range", rank, nranks);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    int timeout_ms = 0;
    const char *name = NULL;
    if (cfg) {
        if (cfg->size < offsetof(colld_comm_config_t, name) + sizeof(cfg->name) || cfg->version == 0 ||
            cfg->version > COLLD_API_VERSION) {
            LOG_WARN(CLIENT, "colld_comm_init_rank: config not initialised with COLLD_COMM_CONFIG_INIT");
            return COLLD_ERR_INVALID_ARGUMENT;
        }
        if (cfg->timeout_ms < 0) {
            LOG_WARN(CLIENT, "colld_comm_init_rank: negative timeout_ms %d", cfg->timeout_ms);
            return COLLD_ERR_INVALID_ARGUMENT;
        }
        timeout_ms = cfg->timeout_ms;
        name = cfg->name;
    }
    colld_comm_t *cm = calloc(1, sizeof(*cm));
    if (!cm)
        return COLLD_ERR_NO_MEMORY;
    char cname[64] = "";
    colld_strlcpy(cname, name, sizeof(cname));
    for (size_t n = strlen(cname); n > 0 && name && name[n] && ((unsigned char)name[n] & 0xc0) == 0x80;)
        cname[--n] = '\0'; /* cut before the character the copy split, not inside it */

    Colld__V1__CommInitRequest req = COLLD__V1__COMM_INIT_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    req.unique_id.data = (uint8_t *)id.internal;
    req.unique_id.len = COLLD_WIRE_UNIQUE_ID_BYTES;
    req.nranks = nranks;
    req.rank = rank;
    req.timeout_ms = timeout_ms;
    req.name = cname;
    int wait_ms = (timeout_ms ? timeout_ms : c->default_timeout_ms) + JOIN_RPC_MARGIN_MS;
    Colld__V1__CommInitResponse *resp = NULL;
    char detail[512] = "";
    colld_status_t st = colld__client_rpc(c, "/colld.v1.Colld/CommInit", &req.base,
                                          &colld__v1__comm_init_response__descriptor, wait_ms,
                                          (ProtobufCMessage **)&resp, detail, sizeof(detail));
    if (st != COLLD_OK) {
        LOG_WARN(CLIENT, "colld_comm_init_rank(rank %d of %d): %s: %s", rank, nranks, colld_status_name(st), detail);
        free(cm);
        /* No communicator to hold the detail: the client's last error does (e.g. a draining
         * daemon's refusal). */
        return colld__client_error(c, st, "colld_comm_init_rank(rank %d of %d): %s", rank, nranks,
                                   *detail ? detail : colld_status_string(st));
    }
    cm->client = c;
    cm->handle = resp->handle;
    cm->comm_id = resp->comm_id;
    cm->timeout_ms = resp->timeout_ms;
    cm->rank = rank;
    cm->nranks = nranks;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    if (colld__client_add_comm(c, cm) < 0) {
        free(cm); /* the daemon sees this rank leave when the session ends */
        return COLLD_ERR_NO_MEMORY;
    }
    colld__fast_attach(cm);
    *comm = cm;
    return COLLD_OK;
}

colld_status_t colld_comm_destroy(colld_comm_t *comm)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    colld_client_t *c = comm->client;
    if (!atomic_load(&c->lost))
        (void)colld__client_wait(c, comm); /* issued work finishes (or fails) first */
    if (!atomic_load(&c->lost)) {
        Colld__V1__CommDestroyRequest req = COLLD__V1__COMM_DESTROY_REQUEST__INIT;
        Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
        colld__client_session_ref(c, &ref);
        req.session = &ref;
        req.handle = comm->handle;
        Colld__V1__CommDestroyResponse *resp = NULL;
        char detail[256] = "";
        colld_status_t st = colld__client_rpc(c, "/colld.v1.Colld/CommDestroy", &req.base,
                                              &colld__v1__comm_destroy_response__descriptor,
                                              COLLD_CLIENT_RPC_TIMEOUT_MS, (ProtobufCMessage **)&resp, detail,
                                              sizeof(detail));
        if (resp)
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        if (st != COLLD_OK && st != COLLD_ERR_DAEMON_LOST)
            LOG_WARN(CLIENT, "colld_comm_destroy: %s: %s", colld_status_name(st), detail);
    }
    colld__client_remove_comm(c, comm);
    pthread_mutex_lock(&c->mu);
    colld__pending_drop_all(c, comm);
    pthread_mutex_unlock(&c->mu);
    colld__fast_detach(comm);
    free(comm);
    return COLLD_OK;
}

colld_status_t colld_comm_abort(colld_comm_t *comm)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    colld_client_t *c = comm->client;
    /* This handle fails fast from now on, whatever the daemon answers (the first error stays). */
    colld_status_t ok = COLLD_OK;
    __atomic_compare_exchange_n(&comm->async_error, &ok, COLLD_ERR_ABORTED, false, __ATOMIC_RELAXED,
                                __ATOMIC_RELAXED);
    if (atomic_load(&c->lost))
        return COLLD_OK; /* no daemon, no peers to tell: every rank already sees DAEMON_LOST */
    Colld__V1__CommAbortRequest req = COLLD__V1__COMM_ABORT_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    req.handle = comm->handle;
    Colld__V1__CommAbortResponse *resp = NULL;
    char detail[256] = "";
    /* The daemon breaks the communicator under its lock and answers at once; it never waits for
     * peers, and the deadline bounds this call even if the daemon is stuck. */
    colld_status_t st = colld__client_rpc(c, "/colld.v1.Colld/CommAbort", &req.base,
                                          &colld__v1__comm_abort_response__descriptor, ABORT_RPC_TIMEOUT_MS,
                                          (ProtobufCMessage **)&resp, detail, sizeof(detail));
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    if (st == COLLD_ERR_DAEMON_LOST)
        return COLLD_OK;
    if (st != COLLD_OK)
        LOG_WARN(CLIENT, "colld_comm_abort: the daemon did not confirm: %s: %s", colld_status_name(st), detail);
    return st;
}

colld_status_t colld_comm_get_async_error(colld_comm_t *comm, colld_status_t *err)
{
    if (!comm || !err)
        return COLLD_ERR_INVALID_ARGUMENT;
    colld__client_poll(comm->client);
    *err = __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED);
    if (*err == COLLD_OK && atomic_load(&comm->client->lost))
        *err = COLLD_ERR_DAEMON_LOST;
    return COLLD_OK;
}

const char *colld_comm_last_error(colld_comm_t *comm)
{
    if (!comm)
        return "invalid communicator (NULL)";
    colld_client_t *c = comm->client;
    if (comm->async_error != COLLD_OK && !comm->detail_fetched) {
        Colld__V1__CommErrorRequest req = COLLD__V1__COMM_ERROR_REQUEST__INIT;
        Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
        colld__client_session_ref(c, &ref);
        req.session = &ref;
        req.handle = comm->handle;
        Colld__V1__CommErrorResponse *resp = NULL;
        char detail[256] = "";
        colld_status_t st = colld__client_rpc(c, "/colld.v1.Colld/CommError", &req.base,
                                              &colld__v1__comm_error_response__descriptor, COLLD_CLIENT_RPC_TIMEOUT_MS,
                                              (ProtobufCMessage **)&resp, detail, sizeof(detail));
        if (st == COLLD_OK) {
            snprintf(comm->last_error, sizeof(comm->last_error), "%s: %s", colld_status_name(comm->async_error),
                     resp->comm_detail);
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        } else
            snprintf(comm->last_error, sizeof(comm->last_error), "%s (no detail: %s)",
                     colld_status_name(comm->async_error), colld_status_name(st));
        comm->detail_fetched = true;
    }
    if (atomic_load(&c->lost) && comm->async_error == COLLD_OK && !comm->last_error[0])
        return "COLLD_ERR_DAEMON_LOST: the connection to the colld daemon was lost";
    return comm->last_error;
}

colld_status_t colld_comm_count(const colld_comm_t *comm, int *nranks)
{
    if (!comm || !nranks)
        return COLLD_ERR_INVALID_ARGUMENT;
    *nranks = comm->nranks;
    return COLLD_OK;
}

colld_status_t colld_comm_user_rank(const colld_comm_t *comm, int *rank)
{
    if (!comm || !rank)
        return COLLD_ERR_INVALID_ARGUMENT;
    *rank = comm->rank;
    return COLLD_OK;
}

/* ============================================================================================
 * Collectives
 * ========================================================================================== */

/* Check the common arguments of a collective; returns COLLD_OK or the error (recorded). */
static colld_status_t check_common(colld_comm_t *comm, colld_dtype_t dtype)
{
    if (atomic_load(&comm->client->lost))
        return comm_error(comm, COLLD_ERR_DAEMON_LOST, "the connection to the colld daemon was lost");
    colld_status_t err = __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED);
    if (err != COLLD_OK) {
        colld__group_fail(err);
        return err; /* broken: fail fast with the first error */
    }
    if ((unsigned)dtype >= COLLD_DTYPE_COUNT)
        return comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "unknown dtype %d", (int)dtype);
    return COLLD_OK;
}

/* Fill the signature fields of a descriptor. */
static void describe(colld_wire_sqe_t *sqe, const colld_comm_t *comm, colld_kind_t kind, size_t count,
                     colld_dtype_t dtype, colld_redop_t op, bool reduces, int root)
{
    sqe->count = count;
    sqe->comm = comm->handle;
    sqe->kind = (uint8_t)kind;
    sqe->dtype = (uint8_t)dtype;
    sqe->redop = reduces ? (uint8_t)op : 0;
    sqe->root = root;
}

/* Post a stream-ordered collective (stream NULL: the legacy default stream). Its buffers are
 * resolved and its stream checked now, also inside a group, so that errors come from this call. */
static colld_status_t post_gpu(colld_comm_t *comm, colld_kind_t kind, const void *sendbuf, size_t send_bytes,
                               void *recvbuf, size_t recv_bytes, size_t count, colld_dtype_t dtype, colld_redop_t op,
                               bool reduces, int root, void *stream)
{
    /* A fast-path collective still in flight finishes first (the daemon sees sequence numbers in
     * order). */
    colld_status_t st;
    if (!colld__group_active() && (st = colld__fast_finish(comm, true)) != COLLD_OK)
        return st;
    colld_wire_sqe_t sqe;
    memset(&sqe, 0, sizeof(sqe));
    colld_gpu_op_t gop;
    char why[400];
    st = colld__gpu_prepare(comm, stream, sendbuf, send_bytes, recvbuf, recv_bytes, &sqe, &gop, why, sizeof(why));
    if (st != COLLD_OK)
        return comm_error(comm, st, "%s", why);
    describe(&sqe, comm, kind, count, dtype, op, reduces, root);
    st = colld__enqueue(comm, &sqe, NULL, &gop, why, sizeof(why));
    return st == COLLD_OK ? st : comm_error(comm, st, "%s", why);
}

/* Validate and post one collective. send_elems/recv_elems are the elements each buffer must hold
 * on this rank (0: the buffer is not used here and may be NULL). */
static colld_status_t post(colld_comm_t *comm, colld_kind_t kind, const void *sendbuf, size_t send_elems,
                           void *recvbuf, size_t recv_elems, size_t count, colld_dtype_t dtype, colld_redop_t op,
                           int root, void *stream)
{
    colld_status_t st = check_common(comm, dtype);
    if (st != COLLD_OK)
        return st;
    bool reduces = kind == COLLD_KIND_ALLREDUCE || kind == COLLD_KIND_REDUCE || kind == COLLD_KIND_REDUCESCATTER;
    if (reduces && (unsigned)op >= COLLD_REDOP_COUNT)
        return comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "unknown reduction op %d", (int)op);
    if ((kind == COLLD_KIND_BROADCAST || kind == COLLD_KIND_REDUCE) && (root < 0 || root >= comm->nranks))
        return comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "root %d is out of range for %d ranks", root, comm->nranks);
    size_t es = colld_dtype_size(dtype), send_bytes, recv_bytes;
    if (__builtin_mul_overflow(send_elems, es, &send_bytes) || __builtin_mul_overflow(recv_elems, es, &recv_bytes))
        return comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "count %zu overflows", count);
    if (stream)
        return post_gpu(comm, kind, sendbuf, send_bytes, recvbuf, recv_bytes, count, dtype, op, reduces, root, stream);
    if ((send_bytes && !sendbuf) || (recv_bytes && !recvbuf))
        return comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "%s is NULL", send_bytes && !sendbuf ? "sendbuf" : "recvbuf");
    colld_wire_sqe_t sqe;
    memset(&sqe, 0, sizeof(sqe));
    int ls, lr;
    colld__client_lookup2(comm->client, sendbuf, send_bytes, recvbuf, recv_bytes, &sqe.send, &sqe.recv, &ls, &lr);
    if (ls == -2 || lr == -2)
        return comm_error(comm, COLLD_ERR_INVALID_ARGUMENT, "%s (%p): %zu bytes run past the end of its buffer",
                          ls == -2 ? "sendbuf" : "recvbuf", ls == -2 ? sendbuf : (const void *)recvbuf,
                          ls == -2 ? send_bytes : recv_bytes);
    /* Memory outside the host registrations may be device memory when the application uses CUDA:
     * device buffers with stream NULL are stream-ordered on the legacy default stream. */
    if ((ls == -1 || lr == -1) && colld__gpu_maybe_device(comm->client)) {
        bool sdev = ls == -1 && colld__gpu_is_device(comm->client, sendbuf);
        bool rdev = lr == -1 && colld__gpu_is_device(comm->client, recvbuf);
        bool shost = send_bytes && !sdev, rhost = recv_bytes && !rdev;
        if ((sdev || rdev) && (shost || rhost))
            return comm_error(comm, COLLD_ERR_INVALID_ARGUMENT,
                              "%s (%p) is device memory but %s (%p) is host memory: both buffers of a collective "
                              "must be device memory (stream-ordered) or both host memory",
                              sdev ? "sendbuf" : "recvbuf", sdev ? sendbuf : (const void *)recvbuf,
                              sdev ? "recvbuf" : "sendbuf", sdev ? (const void *)recvbuf : sendbuf);
        if (sdev || rdev)
            return post_gpu(comm, kind, sendbuf, send_bytes, recvbuf, recv_bytes, count, dtype, op, reduces, root,
                            NULL);
    }
    /* The daemon takes only element-aligned offsets (its kernels load whole elements): memory of
     * colld_mem_alloc at a misaligned address is staged like any other pointer. */
    if (ls == 0 && send_bytes && sqe.send.offset % es) {
        ls = -1;
        memset(&sqe.send, 0, sizeof(sqe.send));
    }
    if (lr == 0 && recv_bytes && sqe.recv.offset % es) {
        lr = -1;
        memset(&sqe.recv, 0, sizeof(sqe.recv));
    }
    char why[256];
    if (colld__fast_eligible(comm, kind, count, dtype)) {
        if (colld__group_active()) {
            st = colld__group_queue_fast(comm, kind, sendbuf, send_bytes, recvbuf, recv_bytes, count, dtype, op, root);
            return st == COLLD_OK ? st : comm_error(comm, st, "cannot queue the collective: %s", colld_status_string(st));
        }
        /* Everything issued before on this communicator finishes first: its outputs may be
         * this call's inputs, and the fast area holds one collective per rank at a time. */
        if ((st = colld__client_wait(comm->client, comm)) != COLLD_OK)
            return st;
        st = colld__fast_start(comm, kind, sendbuf, send_bytes, recvbuf, recv_bytes, count, dtype, op, root, why,
                               sizeof(why));
        return st == COLLD_OK ? st : comm_error(comm, st, "%s", why);
    }
    /* A fast-path collective still in flight finishes first (its output may be this input). */
    if (!colld__group_active() && (st = colld__fast_finish(comm, true)) != COLLD_OK)
        return st;
    colld_pending_t *pending;
    st = colld__stage(comm, sendbuf, send_bytes, recvbuf, recv_bytes, ls, lr, &sqe.send, &sqe.recv, &pending, why,
                      sizeof(why));
    if (st != COLLD_OK)
        return comm_error(comm, st, "%s", why);
    describe(&sqe, comm, kind, count, dtype, op, reduces, root);
    st = colld__enqueue(comm, &sqe, pending, NULL, why, sizeof(why));
    if (st != COLLD_OK)
        return comm_error(comm, st, "%s", why);
    return COLLD_OK;
}

/* count * n without overflow, or SIZE_MAX (which then fails the buffer check). */
static size_t times(size_t count, int n)
{
    size_t r;
    return __builtin_mul_overflow(count, (size_t)n, &r) ? SIZE_MAX : r;
}

colld_status_t colld_allreduce(const void *sendbuf, void *recvbuf, size_t count, colld_dtype_t dtype,
                               colld_redop_t op, colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return post(comm, COLLD_KIND_ALLREDUCE, sendbuf, count, recvbuf, count, count, dtype, op, 0, stream);
}

colld_status_t colld_broadcast(const void *sendbuf, void *recvbuf, size_t count, colld_dtype_t dtype, int root,
                               colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return post(comm, COLLD_KIND_BROADCAST, sendbuf, comm->rank == root ? count : 0, recvbuf, count, count, dtype,
                COLLD_SUM, root, stream);
}

colld_status_t colld_reduce(const void *sendbuf, void *recvbuf, size_t count, colld_dtype_t dtype,
                            colld_redop_t op, int root, colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return post(comm, COLLD_KIND_REDUCE, sendbuf, count, recvbuf, comm->rank == root ? count : 0, count, dtype, op,
                root, stream);
}

colld_status_t colld_allgather(const void *sendbuf, void *recvbuf, size_t sendcount, colld_dtype_t dtype,
                               colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return post(comm, COLLD_KIND_ALLGATHER, sendbuf, sendcount, recvbuf, times(sendcount, comm->nranks), sendcount,
                dtype, COLLD_SUM, 0, stream);
}

colld_status_t colld_reducescatter(const void *sendbuf, void *recvbuf, size_t recvcount, colld_dtype_t dtype,
                                   colld_redop_t op, colld_comm_t *comm, void *stream)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    return post(comm, COLLD_KIND_REDUCESCATTER, sendbuf, times(recvcount, comm->nranks), recvbuf, recvcount,
                recvcount, dtype, op, 0, stream);
}

colld_status_t colld_comm_synchronize(colld_comm_t *comm)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    if (colld__group_active())
        return comm_error(comm, COLLD_ERR_INVALID_USAGE, "colld_comm_synchronize inside a group: call colld_group_end first");
    return colld__client_wait(comm->client, comm);
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
        return err;
    if (atomic_load(&comm->client->lost))
        return COLLD_ERR_DAEMON_LOST; /* even with nothing pending: the communicator is unusable */
    if (__atomic_load_n(&comm->completed, __ATOMIC_ACQUIRE) >= comm->issued)
        return COLLD_OK;
    return COLLD_INPROGRESS;
}
