/*
 * comm.c - libcolld communicators: joining and destroying through the control plane (gRPC),
 * aborting, and waiting for what a communicator has in flight. A communicator's errors and their
 * detail are errors.c's, the collectives themselves coll.c's.
 */
#include "client/client_internal.h"

#include "colld.pb-c.h"
#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOIN_RPC_MARGIN_MS 5000
#define ABORT_RPC_TIMEOUT_MS 2000

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

colld_status_t colld_comm_init_rank(colld_client_t *c, colld_comm_t **comm, int nranks, colld_unique_id_t id, int rank,
                                    const colld_comm_config_t *cfg)
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
    bool nan_check = false, verify = false;
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
        /* nan_check came later: a config of an older size has none. */
        if (cfg->size >= offsetof(colld_comm_config_t, nan_check) + sizeof(cfg->nan_check)) {
            if (cfg->nan_check != 0 && cfg->nan_check != 1) {
                LOG_WARN(CLIENT, "colld_comm_init_rank: nan_check %d is neither 0 nor 1", cfg->nan_check);
                return COLLD_ERR_INVALID_ARGUMENT;
            }
            nan_check = cfg->nan_check == 1;
        }
        /* verify_results came later still. */
        if (cfg->size >= offsetof(colld_comm_config_t, verify_results) + sizeof(cfg->verify_results)) {
            if (cfg->verify_results != 0 && cfg->verify_results != 1) {
                LOG_WARN(CLIENT, "colld_comm_init_rank: verify_results %d is neither 0 nor 1", cfg->verify_results);
                return COLLD_ERR_INVALID_ARGUMENT;
            }
            verify = cfg->verify_results == 1;
        }
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
    req.nan_check = nan_check;
    req.verify_results = verify;
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
    cm->crowded = colld__spin_crowded(&c->load, nranks);
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
        (void)colld__comm_wait(comm); /* issued work finishes (or fails) first */
    if (!atomic_load(&c->lost)) {
        Colld__V1__CommDestroyRequest req = COLLD__V1__COMM_DESTROY_REQUEST__INIT;
        Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
        colld__client_session_ref(c, &ref);
        req.session = &ref;
        req.handle = comm->handle;
        Colld__V1__CommDestroyResponse *resp = NULL;
        char detail[256] = "";
        colld_status_t st = colld__client_rpc(
            c, "/colld.v1.Colld/CommDestroy", &req.base, &colld__v1__comm_destroy_response__descriptor,
            COLLD_CLIENT_RPC_TIMEOUT_MS, (ProtobufCMessage **)&resp, detail, sizeof(detail));
        if (resp)
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        if (st != COLLD_OK && st != COLLD_ERR_DAEMON_LOST)
            LOG_WARN(CLIENT, "colld_comm_destroy: %s: %s", colld_status_name(st), detail);
    }
    colld__mem_comm_destroyed(comm); /* colld_mem_register's, as NCCL's ncclCommDestroy */
    colld__client_remove_comm(c, comm);
    pthread_mutex_lock(&c->mu);
    colld__pending_drop_all(c, comm);
    pthread_mutex_unlock(&c->mu);
    colld__fast_detach(comm);
    free(comm->premul); /* the premultiplied-sum operators (redop.c): one plain allocation */
    free(comm);
    if (!atomic_load(&c->lost))
        colld__gpu_comm_destroyed(c);
    return COLLD_OK;
}

colld_status_t colld_comm_abort(colld_comm_t *comm)
{
    if (!comm)
        return COLLD_ERR_INVALID_ARGUMENT;
    colld_client_t *c = comm->client;
    /* This handle fails fast from now on, whatever the daemon answers (the first error stays). */
    colld_status_t ok = COLLD_OK;
    __atomic_compare_exchange_n(&comm->async_error, &ok, COLLD_ERR_ABORTED, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
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

/* Wait for everything this rank has in flight on the communicator: the fast-area collective, then
 * what went to the engine. Returns the communicator's error (its first), or DAEMON_LOST. */
colld_status_t colld__comm_wait(colld_comm_t *comm)
{
    (void)colld__fast_finish(comm, true); /* a failure is the communicator's error, returned below */
    return colld__ring_wait(comm->client, comm);
}
