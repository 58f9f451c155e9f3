/*
 * control.c - the control-plane RPCs of proto/colld.proto (attach, unique ids, communicator
 * join/destroy/error, status), served through the gRPC wrapper in server/rpc/.
 *
 * Every request names its session by id and token; the token was handed out on the session
 * socket, so the caller's identity is the SO_PEERCRED identity of that socket. Handlers run on
 * the gRPC thread and take daemon->lock; CommInit is answered later, when all ranks have joined.
 */
#include "server/daemon.h"

#include "colld.pb-c.h"
#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DAEMON_VERSION "0.1.0"

/* Look up the session of a request (lock held). Answers the call with an error and returns NULL
 * when the reference is missing or unknown. */
static colld_session_t *session_of(colld_daemon_t *d, const Colld__V1__SessionRef *ref, int32_t *status,
                                   const char **detail)
{
    colld_session_t *s = NULL;
    if (ref && ref->token.len == COLLD_WIRE_TOKEN_BYTES)
        s = colld_session_find(d, ref->id, ref->token.data);
    if (!s) {
        *status = COLLD_ERR_PERMISSION_DENIED;
        *detail = "unknown or ended session: connect the session socket first (colld_connect)";
    }
    return s;
}

/* Send the CommInit answers collected under the lock. */
void colld_replies_send(colld_reply_t *list)
{
    while (list) {
        colld_reply_t *r = list;
        list = r->next;
        Colld__V1__CommInitResponse resp = COLLD__V1__COMM_INIT_RESPONSE__INIT;
        resp.status = r->status;
        resp.detail = r->detail;
        resp.handle = r->handle;
        resp.comm_id = r->comm_id;
        resp.timeout_ms = r->timeout_ms;
        colld_rpc_reply(r->call, &resp.base);
        free(r);
    }
}

static void on_attach(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__AttachRequest *req = (const Colld__V1__AttachRequest *)msg;
    Colld__V1__AttachResponse resp = COLLD__V1__ATTACH_RESPONSE__INIT;
    const char *detail = "";
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, req->session, &resp.status, &detail);
    if (s) {
        if (req->api_version != COLLD_API_VERSION) {
            resp.status = COLLD_ERR_PROTOCOL;
            detail = "client API version differs from the daemon's; use matching libcolld and colld";
        } else
            s->attached = true;
    }
    resp.api_version = COLLD_API_VERSION;
    resp.default_timeout_ms = (uint32_t)d->cfg.timeout_ms;
    pthread_mutex_unlock(&d->lock);
    resp.detail = (char *)detail;
    resp.daemon_version = (char *)DAEMON_VERSION;
    colld_rpc_reply(call, &resp.base);
}

static void on_get_unique_id(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__GetUniqueIdRequest *req = (const Colld__V1__GetUniqueIdRequest *)msg;
    Colld__V1__GetUniqueIdResponse resp = COLLD__V1__GET_UNIQUE_ID_RESPONSE__INIT;
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    const char *detail = "";
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, req->session, &resp.status, &detail);
    if (s) {
        resp.status = colld_comm_issue_uid(d, s, uid);
        if (resp.status == COLLD_OK) {
            resp.unique_id.data = uid;
            resp.unique_id.len = sizeof(uid);
        } else if (resp.status == COLLD_ERR_QUOTA_EXCEEDED)
            detail = "too many unused unique ids in this session";
        else
            detail = "daemon cannot create a unique id";
    }
    pthread_mutex_unlock(&d->lock);
    resp.detail = (char *)detail;
    colld_rpc_reply(call, &resp.base);
}

static void on_comm_init(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__CommInitRequest *req = (const Colld__V1__CommInitRequest *)msg;
    colld_reply_t *replies = NULL;
    int32_t status = COLLD_OK;
    const char *detail = "";
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, req->session, &status, &detail);
    if (s && req->unique_id.len != COLLD_WIRE_UNIQUE_ID_BYTES) {
        status = COLLD_ERR_INVALID_ARGUMENT;
        detail = "malformed unique id";
    }
    if (status == COLLD_OK)
        colld_comm_join(d, s, req->unique_id.data, req->nranks, req->rank, req->timeout_ms, req->name, call,
                        &replies);
    else
        colld_reply_add(&replies, call, status, detail);
    pthread_mutex_unlock(&d->lock);
    colld_replies_send(replies);
    colld_engine_wake(d); /* a join deadline may be new */
}

static void on_comm_destroy(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__CommDestroyRequest *req = (const Colld__V1__CommDestroyRequest *)msg;
    Colld__V1__CommDestroyResponse resp = COLLD__V1__COMM_DESTROY_RESPONSE__INIT;
    colld_reply_t *replies = NULL;
    char detail[COLLD_DETAIL_LEN] = "";
    const char *sdetail = NULL;
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, req->session, &resp.status, &sdetail);
    if (s)
        resp.status = colld_comm_leave(d, s, req->handle, detail, sizeof(detail), &replies);
    pthread_mutex_unlock(&d->lock);
    colld_replies_send(replies);
    colld_engine_wake(d);
    resp.detail = sdetail ? (char *)sdetail : detail;
    colld_rpc_reply(call, &resp.base);
}

static void on_comm_error(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__CommErrorRequest *req = (const Colld__V1__CommErrorRequest *)msg;
    Colld__V1__CommErrorResponse resp = COLLD__V1__COMM_ERROR_RESPONSE__INIT;
    char comm_detail[COLLD_DETAIL_LEN] = "";
    const char *detail = "";
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, req->session, &resp.status, &detail);
    if (s) {
        colld_member_t *m = colld_comm_member(s, req->handle);
        if (!m) {
            resp.status = COLLD_ERR_INVALID_ARGUMENT;
            detail = "unknown communicator handle";
        } else {
            resp.comm_status = m->comm->error;
            colld_strlcpy(comm_detail, m->comm->error_detail, sizeof(comm_detail));
        }
    }
    pthread_mutex_unlock(&d->lock);
    resp.detail = (char *)detail;
    resp.comm_detail = comm_detail;
    colld_rpc_reply(call, &resp.base);
}

/* Status: sessions and communicators. An admin (root or the daemon's own uid) sees all of them,
 * anyone else only their own tenant's. */
static void on_status(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__StatusRequest *req = (const Colld__V1__StatusRequest *)msg;
    Colld__V1__StatusResponse resp = COLLD__V1__STATUS_RESPONSE__INIT;
    Colld__V1__SessionInfo *sinfo = NULL, **sptr = NULL;
    Colld__V1__CommInfo *cinfo = NULL, **cptr = NULL;
    Colld__V1__CommMemberInfo *minfo = NULL, **mptr = NULL;
    const char *detail = "";
    size_t ns = 0, nc = 0, nm = 0;

    pthread_mutex_lock(&d->lock);
    colld_session_t *me = session_of(d, req->session, &resp.status, &detail);
    if (!me)
        goto unlock;
    bool admin = me->uid == 0 || me->uid == getuid();
    for (colld_session_t *s = d->sessions; s; s = s->next)
        ns++;
    for (colld_dcomm_t *c = d->comms; c; c = c->next) {
        nc++;
        nm += (size_t)c->nranks;
    }
    sinfo = calloc(ns + 1, sizeof(*sinfo));
    sptr = calloc(ns + 1, sizeof(*sptr));
    cinfo = calloc(nc + 1, sizeof(*cinfo));
    cptr = calloc(nc + 1, sizeof(*cptr));
    minfo = calloc(nm + 1, sizeof(*minfo));
    mptr = calloc(nm + 1, sizeof(*mptr));
    if (!sinfo || !sptr || !cinfo || !cptr || !minfo || !mptr) {
        resp.status = COLLD_ERR_NO_MEMORY;
        detail = "daemon out of memory";
        goto unlock;
    }
    for (colld_session_t *s = d->sessions; s; s = s->next) {
        if (!admin && s->uid != me->uid)
            continue;
        Colld__V1__SessionInfo *i = &sinfo[resp.n_sessions];
        colld__v1__session_info__init(i);
        i->id = s->id;
        i->pid = s->pid;
        i->uid = s->uid;
        i->gid = s->gid;
        i->attached_unix_ms = s->attached_ms;
        i->process_name = strdup(s->name);
        i->comms = s->ncomms;
        i->registered_bytes = s->registered_bytes;
        i->admin = s->role == COLLD_ROLE_ADMIN;
        sptr[resp.n_sessions++] = i;
    }
    size_t mi = 0;
    for (colld_dcomm_t *c = d->comms; c; c = c->next) {
        if (!admin && c->tenant != me->uid)
            continue;
        Colld__V1__CommInfo *i = &cinfo[resp.n_comms];
        colld__v1__comm_info__init(i);
        i->id = c->id;
        i->name = strdup(c->name);
        i->nranks = c->nranks;
        i->joined = c->present;
        i->state = (char *)colld_comm_state_name(c->state);
        i->ops_completed = c->ops_completed;
        i->ops_failed = c->ops_failed;
        i->uid = c->tenant;
        i->timeout_ms = c->timeout_ms;
        i->last_error = strdup(c->error_detail);
        i->members = &mptr[mi];
        for (int r = 0; r < c->nranks; r++) {
            colld_member_t *m = &c->ranks[r];
            if (!m->session)
                continue;
            Colld__V1__CommMemberInfo *x = &minfo[mi];
            colld__v1__comm_member_info__init(x);
            x->rank = r;
            x->session_id = m->session->id;
            x->pid = m->pid;
            mptr[mi++] = x;
            i->n_members++;
        }
        cptr[resp.n_comms++] = i;
    }
    resp.sessions = sptr;
    resp.comms = cptr;
    resp.pid = getpid();
    resp.started_unix_ms = d->started_ms;
    resp.socket = d->cfg.socket;
unlock:
    pthread_mutex_unlock(&d->lock);
    resp.detail = (char *)detail;
    resp.daemon_version = (char *)DAEMON_VERSION;
    colld_rpc_reply(call, &resp.base);
    for (size_t k = 0; k < resp.n_sessions; k++)
        free(sinfo[k].process_name);
    for (size_t k = 0; k < resp.n_comms; k++) {
        free(cinfo[k].name);
        free(cinfo[k].last_error);
    }
    free(sinfo);
    free(sptr);
    free(cinfo);
    free(cptr);
    free(minfo);
    free(mptr);
}

static const colld_rpc_method_t methods[] = {
    { .path = "/colld.v1.Colld/Attach", .request = &colld__v1__attach_request__descriptor, .handler = on_attach },
    { .path = "/colld.v1.Colld/GetUniqueId",
      .request = &colld__v1__get_unique_id_request__descriptor,
      .handler = on_get_unique_id },
    { .path = "/colld.v1.Colld/CommInit", .request = &colld__v1__comm_init_request__descriptor, .handler = on_comm_init },
    { .path = "/colld.v1.Colld/CommDestroy",
      .request = &colld__v1__comm_destroy_request__descriptor,
      .handler = on_comm_destroy },
    { .path = "/colld.v1.Colld/CommError", .request = &colld__v1__comm_error_request__descriptor, .handler = on_comm_error },
    { .path = "/colld.v1.Colld/Status", .request = &colld__v1__status_request__descriptor, .handler = on_status },
};

/* Start the gRPC server on <socket>.rpc. Returns 0 or -1. */
int colld_control_start(colld_daemon_t *d)
{
    char err[256] = "";
    if (colld_rpc_server_create(d->rpc_addr, methods, COLLD_ARRAY_SIZE(methods), d, &d->rpc, err, sizeof(err)) < 0 ||
        colld_rpc_server_start(d->rpc) < 0) {
        LOG_ERROR(RPC, "cannot serve the control plane on %s: %s", d->rpc_addr, err);
        return -1;
    }
    return 0;
}

/* Stop the gRPC server; deferred CommInit calls are released by the wrapper. */
void colld_control_stop(colld_daemon_t *d)
{
    colld_rpc_server_destroy(d->rpc);
    d->rpc = NULL;
}
