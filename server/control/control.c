/*
 * control.c - the control-plane RPCs of proto/colld.proto (attach, unique ids, communicator
 * join/destroy/abort/error, status, policy, flight-recorder trace, event stream), served through
 * the gRPC wrapper in server/control/rpc/.
 *
 * Every request names its session by id and token; the token was handed out on the session
 * socket, so the caller's identity is the SO_PEERCRED identity of that socket. Handlers run on
 * the gRPC thread and take daemon->lock; CommInit is answered later, when all ranks have joined.
 */
#include "server/control/control.h"

#include "server/core/daemon.h"
#include "server/core/tenant.h"
#include "server/core/verify.h"
#include "server/net/net.h"
#include "server/observability/events.h"
#include "server/observability/recorder.h"
#include "transport/tcp/tcp.h"

#include "colld.pb-c.h"
#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DAEMON_VERSION COLLD_VERSION_STRING /* the CMake project version */

/* Look up the session of a request (lock held). Answers the call with an error and returns NULL
 * when the reference is missing or unknown. */
static colld_session_t *session_of(colld_daemon_t *d, const colld_rpc_call_t *call, const Colld__V1__SessionRef *ref,
                                   int32_t *status, const char **detail)
{
    colld_session_t *s = NULL;
    if (ref && ref->token.len == COLLD_WIRE_TOKEN_BYTES)
        s = colld_session_find(d, ref->id, ref->token.data);
    if (!s) {
        *status = COLLD_ERR_PERMISSION_DENIED;
        *detail = "unknown or ended session: connect the session socket first (colld_connect)";
        return NULL;
    }
    /* The token proves the session; the connection's own credentials must agree, so a token that
     * leaked to another user is worth nothing to it. */
    uid_t uid;
    pid_t pid;
    if (colld_rpc_call_peer(call, &uid, &pid) == 0 && uid != s->uid) {
        *status = COLLD_ERR_PERMISSION_DENIED;
        *detail = "this session belongs to another user than the one calling: use your own session";
        return NULL;
    }
    return s;
}

/* Admins (root or the daemon's own uid) see and may change everything; other sessions only
 * their own tenant's communicators. */
static bool is_admin(const colld_session_t *s)
{
    return colld_uid_is_admin(s->uid);
}

/* The communicator with this id, if the session may see it (lock held). */
static colld_dcomm_t *comm_by_id(colld_daemon_t *d, const colld_session_t *s, uint64_t id)
{
    for (colld_dcomm_t *c = d->comms; c; c = c->next)
        if (c->id == id && (is_admin(s) || c->tenant == s->uid))
            return c;
    return NULL;
}

static void on_attach(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__AttachRequest *req = (const Colld__V1__AttachRequest *)msg;
    Colld__V1__AttachResponse resp = COLLD__V1__ATTACH_RESPONSE__INIT;
    const char *detail = "";
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, call, req->session, &resp.status, &detail);
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
    colld_session_t *s = session_of(d, call, req->session, &resp.status, &detail);
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
    int32_t status = COLLD_OK;
    const char *detail = "";
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, call, req->session, &status, &detail);
    if (s && req->unique_id.len != COLLD_WIRE_UNIQUE_ID_BYTES) {
        status = COLLD_ERR_INVALID_ARGUMENT;
        detail = "malformed unique id";
    } else if (s && d->draining) {
        status = COLLD_ERR_DAEMON_UNAVAILABLE;
        detail = "colld is draining before it stops (a restart or an upgrade): it forms no new communicators; the "
                 "running ones go on until they finish or the drain deadline. Create the communicator once the "
                 "daemon is back";
    }
    char refused[256];
    for (int i = 0; s && status == COLLD_OK && i < d->nbackends; i++) {
        colld_backend_t *b = &d->backends[i];
        if (b->present && b->ops->join_refused && b->ops->join_refused(b, s, refused, sizeof(refused))) {
            status = COLLD_ERR_DEVICE;
            detail = refused;
        }
    }
    if (status == COLLD_OK)
        colld_comm_join(d, s, req->unique_id.data, req->nranks, req->rank, req->timeout_ms, req->name,
                        (req->nan_check ? COLLD_JOIN_NAN_CHECK : 0u) | (req->verify_results ? COLLD_JOIN_VERIFY : 0u),
                        call, NULL);
    else
        colld_reply_add(d, call, status, detail);
    colld_daemon_unlock(d);
    colld_engine_wake(d); /* a join deadline may be new */
}

static void on_comm_destroy(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__CommDestroyRequest *req = (const Colld__V1__CommDestroyRequest *)msg;
    Colld__V1__CommDestroyResponse resp = COLLD__V1__COMM_DESTROY_RESPONSE__INIT;
    colld_err_t err = COLLD_ERR_INIT;
    const char *sdetail = NULL;
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, call, req->session, &resp.status, &sdetail);
    if (s)
        resp.status = colld_comm_leave(d, s, req->handle, &err);
    colld_daemon_unlock(d);
    colld_engine_wake(d);
    resp.detail = sdetail ? (char *)sdetail : err.msg;
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
    colld_session_t *s = session_of(d, call, req->session, &resp.status, &detail);
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
    colld_gpu_health_t *gh = NULL;
    int ngh = 0;
    char gh_none[sizeof(d->gpu_health_none)] = "";

    pthread_mutex_lock(&d->lock);
    colld_session_t *me = session_of(d, call, req->session, &resp.status, &detail);
    if (!me)
        goto unlock;
    bool admin = is_admin(me);
    for (colld_session_t *s = d->sessions; s; s = s->next)
        ns++;
    for (colld_dcomm_t *c = d->comms; c; c = c->next) {
        nc++;
        nm += (size_t)colld_comm_nslots(c); /* a forming communicator: only the ranks that joined */
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
        i->joined = c->present; /* ranks here, plus (multi-node) those on other nodes */
        for (int k = 0; k < colld_comm_nslots(c); k++)
            i->joined += colld_comm_slot(c, k)->remote;
        i->state = (char *)colld_comm_state_name(c->state);
        i->ops_completed = c->ops_completed;
        i->ops_failed = c->ops_failed;
        i->uid = c->tenant;
        i->timeout_ms = c->timeout_ms;
        i->last_error = strdup(c->error_detail);
        i->slowest_rank = colld_recorder_slowest(c);
        char wait[COLLD_DETAIL_LEN];
        i->p2p_waited_ms = (int64_t)(colld_p2p_describe_wait(wait, sizeof(wait), c, colld_now_ns()) / 1000000ull);
        i->p2p_wait = strdup(wait);
        int absent;
        i->coll_waited_ms = (int64_t)(colld_match_describe_wait(wait, sizeof(wait), c, colld_now_ns(), &absent) /
                                      1000000ull);
        i->coll_wait = strdup(wait);
        i->verify_results = colld_comm_verifies(d, c);
        i->members = &mptr[mi];
        for (int k = 0; k < colld_comm_nslots(c); k++) {
            colld_member_t *m = colld_comm_slot(c, k);
            int r = m->rank;
            if (!m->session && !m->remote)
                continue;
            Colld__V1__CommMemberInfo *x = &minfo[mi];
            colld__v1__comm_member_info__init(x);
            x->rank = r;
            x->session_id = m->session ? m->session->id : 0;
            x->pid = m->pid;
            x->node = (char *)colld_cluster_rank_node(c, r);
            x->samples = m->late_samples;
            x->mean_late_us = m->late_samples ? m->late_sum_ns / m->late_samples / 1000 : 0;
            x->max_late_us = m->late_max_ns / 1000;
            mptr[mi++] = x;
            i->n_members++;
        }
        cptr[resp.n_comms++] = i;
    }
    /* GPU health (the device backend's records, copied under the lock). */
    ngh = d->ngpu_health < COLLD_GPU_HEALTH_MAX ? d->ngpu_health : COLLD_GPU_HEALTH_MAX;
    gh = ngh ? calloc((size_t)ngh, sizeof(*gh)) : NULL;
    if (gh)
        memcpy(gh, d->gpu_health, (size_t)ngh * sizeof(*gh));
    else
        ngh = 0;
    for (int k = 0; !admin && k < ngh; k++) /* other tenants' communicators: for operators only */
        if (gh[k].users[0])
            colld_strlcpy(gh[k].users, "(admin only)", sizeof(gh[k].users));
    colld_strlcpy(gh_none, d->gpu_health_none, sizeof(gh_none));
    resp.sessions = sptr;
    resp.comms = cptr;
    resp.pid = getpid();
    resp.started_unix_ms = d->started_ms;
    resp.socket = d->cfg.socket;
unlock:
    pthread_mutex_unlock(&d->lock);
    /* peer daemons: the transport's own snapshot, taken without daemon->lock */
    colld_net_peer_info_t peers[64];
    Colld__V1__PeerInfo pinfo[64], *pptr[64];
    if (me && colld_cluster_running(d)) {
        size_t np = colld_cluster_peers(d, peers, 64, &resp.net_payload_sent, &resp.net_payload_received,
                                        &resp.net_refused);
        resp.node_name = (char *)colld_cluster_node_name(d);
        resp.listen = (char *)colld_cluster_listen_addr(d);
        for (size_t k = 0; k < np && k < 64; k++) {
            Colld__V1__PeerInfo *x = &pinfo[k];
            colld__v1__peer_info__init(x);
            x->name = peers[k].name;
            x->addr = peers[k].addr;
            x->state = (char *)peers[k].state;
            x->conns = peers[k].conns;
            x->bytes_sent = peers[k].bytes_sent;
            x->bytes_received = peers[k].bytes_received;
            x->send_rate = peers[k].send_rate;
            x->recv_rate = peers[k].recv_rate;
            /* Why a link failed (refused, silent, not colld) tells whether a port is open: for
             * operators only, as a tenant names the roots this daemon dials. */
            x->last_error = admin ? peers[k].last_error : (char *)(peers[k].last_error[0] ? "(admin only)" : "");
            x->tx_rate = peers[k].tx_rate;
            x->rx_rate = peers[k].rx_rate;
            x->rtt_ms = peers[k].rtt_ms;
            x->tcp_rtt_us = peers[k].tcp_rtt_us;
            x->tcp_lost = peers[k].tcp_lost;
            x->retrans = peers[k].retrans;
            x->losses = peers[k].losses;
            x->rx_bytes = peers[k].rx_bytes;
            x->rx_busy_us = peers[k].rx_busy_ns / 1000;
            x->transport = peers[k].transport;
            x->transport_note = peers[k].transport_note;
            pptr[resp.n_peers++] = x;
        }
        resp.peers = pptr;
    }
    Colld__V1__GpuHealth *ginfo = ngh ? calloc((size_t)ngh, sizeof(*ginfo)) : NULL;
    Colld__V1__GpuHealth **gptr = ngh ? calloc((size_t)ngh, sizeof(*gptr)) : NULL;
    for (int k = 0; ginfo && gptr && k < ngh; k++) {
        Colld__V1__GpuHealth *x = &ginfo[k];
        const colld_gpu_health_t *h = &gh[k];
        colld__v1__gpu_health__init(x);
        x->index = h->index;
        x->name = (char *)h->name;
        x->uuid = (char *)h->uuid;
        x->status = (char *)h->status;
        x->ecc_uncorrected = h->ecc_uncorrected;
        x->ecc_uncorrected_new = h->ecc_uncorrected_new;
        x->retired_pending = h->retired_pending;
        x->remap_pending = h->remap_pending;
        x->remap_failure = h->remap_failure;
        x->pcie_replay = h->pcie_replay;
        x->nvlink_errors = h->nvlink_errors;
        x->xid_count = h->xid_count;
        x->last_xid = h->last_xid;
        x->last_xid_unix_ms = h->last_xid_ms;
        x->throttle_reasons = h->throttle;
        x->thermal = h->thermal;
        x->power = h->power;
        x->since_unix_ms = h->since_ms;
        x->drained = h->drained;
        x->drain_reason = (char *)h->drain_why;
        x->drained_unix_ms = h->drained_ms;
        x->users = (char *)h->users;
        x->passes = h->passes;
        x->pass_ns = h->pass_ns;
        x->nvml = h->nvml;
        gptr[resp.n_gpus++] = x;
    }
    resp.gpus = gptr;
    resp.gpu_health_none = gh_none;
    resp.net_transport = d->cfg.net_transport_text ? d->cfg.net_transport_text : (char *)"auto";
    resp.ib_device = (char *)colld_cluster_ib_device(d);
    resp.ib_none = (char *)colld_cluster_ib_none(d);
    resp.detail = (char *)detail;
    resp.daemon_version = (char *)DAEMON_VERSION;
    colld_rpc_reply(call, &resp.base);
    free(ginfo);
    free(gptr);
    free(gh);
    for (size_t k = 0; k < resp.n_sessions; k++)
        free(sinfo[k].process_name);
    for (size_t k = 0; k < resp.n_comms; k++) {
        free(cinfo[k].name);
        free(cinfo[k].last_error);
        free(cinfo[k].p2p_wait);
        free(cinfo[k].coll_wait);
    }
    free(sinfo);
    free(sptr);
    free(cinfo);
    free(cptr);
    free(minfo);
    free(mptr);
}

/* CommAbort: by a rank (handle) or by an operator (comm_id). */
static void on_comm_abort(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__CommAbortRequest *req = (const Colld__V1__CommAbortRequest *)msg;
    Colld__V1__CommAbortResponse resp = COLLD__V1__COMM_ABORT_RESPONSE__INIT;
    char detail[COLLD_DETAIL_LEN] = "";
    const char *sdetail = NULL;
    char reason[128]; /* the caller's words go into every rank's error detail and the events */
    colld_str_sanitize(reason, sizeof(reason), req->reason ? req->reason : "", SIZE_MAX);
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, call, req->session, &resp.status, &sdetail);
    if (s) {
        char who[COLLD_DETAIL_LEN / 2];
        colld_dcomm_t *c = NULL;
        int rank = -1;
        if (req->handle) {
            colld_member_t *m = colld_comm_member(s, req->handle);
            if (m) {
                c = m->comm;
                rank = m->rank;
                snprintf(who, sizeof(who), "rank %d (pid %d)%s%s", m->rank, (int)s->pid, *reason ? ": " : "", reason);
            } else
                snprintf(detail, sizeof(detail), "unknown communicator handle %u", req->handle);
        } else {
            c = comm_by_id(d, s, req->comm_id);
            if (c)
                snprintf(who, sizeof(who), "an operator (pid %d, uid %u, %s)%s%s", (int)s->pid, (unsigned)s->uid, s->name,
                         *reason ? ": " : "", reason);
            else
                snprintf(detail, sizeof(detail), "no communicator %llu visible to uid %u", (unsigned long long)req->comm_id,
                         (unsigned)s->uid);
        }
        if (c)
            colld_dcomm_abort(d, c, rank, who);
        else
            resp.status = COLLD_ERR_INVALID_ARGUMENT;
    }
    colld_daemon_unlock(d);
    colld_engine_wake(d);
    resp.detail = sdetail ? (char *)sdetail : detail;
    colld_rpc_reply(call, &resp.base);
}

/* SetPolicy (admin): a tenant's timeout cap, multi-node algorithm and resource limit overrides, or
 * with clear all of them removed. Every part is checked before any is applied. */
static void on_set_policy(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__SetPolicyRequest *req = (const Colld__V1__SetPolicyRequest *)msg;
    Colld__V1__SetPolicyResponse resp = COLLD__V1__SET_POLICY_RESPONSE__INIT;
    char detail[COLLD_DETAIL_LEN] = "";
    const char *sdetail = NULL;
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, call, req->session, &resp.status, &sdetail);
    if (!s)
        goto out;
    if (!is_admin(s)) {
        resp.status = COLLD_ERR_PERMISSION_DENIED;
        snprintf(detail, sizeof(detail), "only root or the daemon's user may change policy (caller uid %u)",
                 (unsigned)s->uid);
        goto out;
    }
    if (!req->policy) {
        resp.status = COLLD_ERR_INVALID_ARGUMENT;
        snprintf(detail, sizeof(detail), "no policy given");
        goto out;
    }
    const Colld__V1__TenantPolicy *pol = req->policy;
    uid_t uid = pol->uid;
    if (req->clear) {
        colld_policy_clear(d, uid);
        for (int i = 0; i < COLLD_LIMIT_COUNT; i++)
            if (colld_tenant_overridden(d, uid, (colld_limit_t)i))
                colld_tenant_set_limit(d, uid, (colld_limit_t)i, UINT64_MAX); /* its record exists: no allocation */
        LOG_INFO(RPC, "policy of uid %u cleared by pid %d", (unsigned)uid, (int)s->pid);
        goto out;
    }
    const char *algo_text = pol->net_algo;
    int algo = algo_text && *algo_text ? colld_net_algo_parse(algo_text) : -2;
    if (algo == -1) {
        resp.status = COLLD_ERR_INVALID_ARGUMENT;
        snprintf(detail, sizeof(detail), "net_algo '%.32s' is not auto, ring or rd", algo_text);
        goto out;
    }
    int cap = pol->max_timeout_ms;
    if (cap < 0 || cap > d->cfg.max_timeout_ms) {
        resp.status = COLLD_ERR_INVALID_ARGUMENT;
        snprintf(detail, sizeof(detail), "max_timeout_ms %d is out of range (1..%lld, the daemon's max-timeout-ms)",
                 cap, (long long)d->cfg.max_timeout_ms);
        goto out;
    }
    int which[COLLD_LIMIT_COUNT];
    if (pol->n_limits > COLLD_LIMIT_COUNT) {
        resp.status = COLLD_ERR_INVALID_ARGUMENT;
        snprintf(detail, sizeof(detail), "%zu limits given; there are %d", pol->n_limits, COLLD_LIMIT_COUNT);
        goto out;
    }
    for (size_t i = 0; i < pol->n_limits; i++) {
        const Colld__V1__TenantLimit *l = pol->limits[i];
        int w = colld_limit_by_name(l->name);
        for (size_t j = 0; w >= 0 && j < i; j++)
            if (which[j] == w)
                w = -1; /* named twice */
        if (w < 0 || (!l->reset && l->limit == UINT64_MAX)) {
            resp.status = COLLD_ERR_INVALID_ARGUMENT;
            snprintf(detail, sizeof(detail),
                     "limit %zu ('%.48s'): not a per-tenant limit, named twice, or out of range (known: "
                     "max-sessions-per-tenant, max-comms-per-tenant, max-joining-ranks-per-tenant, "
                     "max-regs-per-tenant, max-registered-bytes-per-tenant, max-event-followers-per-tenant, "
                     "max-rpc-conns-per-tenant)",
                     i, l->name ? l->name : "");
            goto out;
        }
        which[i] = w;
    }
    if (cap == 0 && algo == -2 && pol->n_limits == 0) {
        resp.status = COLLD_ERR_INVALID_ARGUMENT;
        snprintf(detail, sizeof(detail), "nothing to set: give max_timeout_ms, net_algo or a limit");
        goto out;
    }
    if (cap > 0 || algo >= 0) {
        if (colld_policy_set(d, uid, cap ? cap : colld_policy_cap(d, uid)) < 0)
            goto nomem;
        for (colld_policy_t *p = d->policies; p && algo >= 0; p = p->next)
            if (p->uid == uid)
                p->net_algo = algo;
        LOG_INFO(RPC, "policy of uid %u: max timeout %d ms, multi-node all-reduce %s (set by pid %d)", (unsigned)uid,
                 colld_policy_cap(d, uid), algo >= 0 ? colld_net_algo_name(algo) : "unchanged", (int)s->pid);
    }
    for (size_t i = 0; i < pol->n_limits; i++) {
        const Colld__V1__TenantLimit *l = pol->limits[i];
        if (colld_tenant_set_limit(d, uid, (colld_limit_t)which[i], l->reset ? UINT64_MAX : l->limit) < 0)
            goto nomem;
        LOG_INFO(RPC, "policy of uid %u: %s = %llu%s (set by pid %d)", (unsigned)uid,
                 colld_limit_name((colld_limit_t)which[i]),
                 (unsigned long long)colld_tenant_limit(d, uid, (colld_limit_t)which[i]),
                 l->reset ? " (the default)" : "", (int)s->pid);
    }
    goto out;
nomem:
    resp.status = COLLD_ERR_NO_MEMORY;
    snprintf(detail, sizeof(detail), "daemon out of memory");
out:
    pthread_mutex_unlock(&d->lock);
    resp.detail = sdetail ? (char *)sdetail : detail;
    colld_rpc_reply(call, &resp.base);
}

/* The uids GetPolicy reports (lock held): an administrator sees every tenant with a policy, an
 * override or something held; anyone else only their own uid. Returns how many (at most max). */
static size_t policy_uids(const colld_daemon_t *d, const colld_session_t *s, uid_t *out, size_t max)
{
    if (!is_admin(s)) {
        out[0] = s->uid;
        return 1;
    }
    size_t n = 0;
    for (const colld_policy_t *p = d->policies; p && n < max; p = p->next)
        out[n++] = p->uid;
    size_t np = n, end = n + COLLD_MIN(colld_tenant_uids(d, out + n, max - n), max - n);
    for (size_t i = np; i < end; i++) {
        bool seen = false;
        for (size_t j = 0; j < np && !seen; j++) /* the tenant uids themselves are distinct */
            seen = out[j] == out[i];
        if (!seen)
            out[n++] = out[i];
    }
    return n;
}

/* GetPolicy: every limit's default, use and refusals, the registration backstop, and per tenant
 * its timeout cap, algorithm and limits with what it holds. A caller that is not an administrator
 * sees the limits and its own use only (own_only). */
static void on_get_policy(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__GetPolicyRequest *req = (const Colld__V1__GetPolicyRequest *)msg;
    Colld__V1__GetPolicyResponse resp = COLLD__V1__GET_POLICY_RESPONSE__INIT;
    Colld__V1__TenantPolicy *pol = NULL, **ptr = NULL;
    Colld__V1__TenantLimit *lim = NULL, **lptr = NULL;
    uid_t *uids = NULL;
    const char *detail = "";
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, call, req->session, &resp.status, &detail);
    if (!s)
        goto out;
    size_t max = colld_tenant_uids(d, NULL, 0) + 1;
    for (colld_policy_t *p = d->policies; p; p = p->next)
        max++;
    uids = calloc(max, sizeof(*uids));
    size_t n = uids ? policy_uids(d, s, uids, max) : 0;
    pol = calloc(n + 1, sizeof(*pol));
    ptr = calloc(n + 1, sizeof(*ptr));
    lim = calloc((n + 1) * COLLD_LIMIT_COUNT, sizeof(*lim));
    lptr = calloc((n + 1) * COLLD_LIMIT_COUNT, sizeof(*lptr));
    if (!uids || !pol || !ptr || !lim || !lptr) {
        resp.status = COLLD_ERR_NO_MEMORY;
        detail = "daemon out of memory";
        goto out;
    }
    /* Daemon-wide totals are other tenants' use: an administrator's view only. Anyone else gets the
     * limits with its own use in their place (issue 26 row 9). */
    bool admin = is_admin(s);
    resp.own_only = !admin;
    for (int i = 0; i < COLLD_LIMIT_COUNT; i++) { /* slots [0, COUNT): the defaults */
        Colld__V1__TenantLimit *l = &lim[i];
        colld__v1__tenant_limit__init(l);
        l->name = (char *)colld_limit_name((colld_limit_t)i);
        l->limit = colld_limit_default(d, (colld_limit_t)i);
        l->used = admin ? colld_tenant_used_total(d, (colld_limit_t)i) : colld_tenant_used(d, s->uid, (colld_limit_t)i);
        l->refused = admin ? colld_tenant_refusals(d, (colld_limit_t)i) : 0;
        lptr[i] = l;
    }
    resp.defaults = lptr;
    resp.n_defaults = COLLD_LIMIT_COUNT;
    for (size_t k = 0; k < n; k++) {
        Colld__V1__TenantPolicy *x = &pol[k];
        colld__v1__tenant_policy__init(x);
        x->uid = uids[k];
        x->net_algo = "";
        for (colld_policy_t *p = d->policies; p; p = p->next)
            if (p->uid == uids[k]) {
                x->max_timeout_ms = p->max_timeout_ms;
                x->net_algo = p->net_algo >= 0 ? (char *)colld_net_algo_name(p->net_algo) : "";
            }
        x->limits = &lptr[(k + 1) * COLLD_LIMIT_COUNT];
        x->n_limits = COLLD_LIMIT_COUNT;
        for (int i = 0; i < COLLD_LIMIT_COUNT; i++) {
            Colld__V1__TenantLimit *l = &lim[(k + 1) * COLLD_LIMIT_COUNT + (size_t)i];
            colld__v1__tenant_limit__init(l);
            l->name = (char *)colld_limit_name((colld_limit_t)i);
            l->limit = colld_tenant_limit(d, uids[k], (colld_limit_t)i);
            l->used = colld_tenant_used(d, uids[k], (colld_limit_t)i);
            l->overridden = colld_tenant_overridden(d, uids[k], (colld_limit_t)i);
            x->limits[i] = l;
        }
        ptr[resp.n_tenants++] = x;
    }
    resp.tenants = ptr;
    resp.default_timeout_ms = (int32_t)d->cfg.timeout_ms;
    resp.max_timeout_ms = (int32_t)d->cfg.max_timeout_ms;
    resp.max_registrations = colld_regs_backstop(d);
    resp.registrations = admin ? colld_regs_held(d) : colld_tenant_used(d, s->uid, COLLD_LIMIT_REGS);
    resp.registrations_refused = admin ? colld_regs_backstop_refusals(d) : 0;
out:
    pthread_mutex_unlock(&d->lock);
    resp.detail = (char *)detail;
    colld_rpc_reply(call, &resp.base);
    free(uids);
    free(pol);
    free(ptr);
    free(lim);
    free(lptr);
}

/* Microseconds of `t` after `base` (monotonic ns), -1 when t is 0 (never happened). */
static int64_t after_us(uint64_t t, uint64_t base)
{
    if (!t)
        return -1;
    return t >= base ? (int64_t)((t - base) / 1000) : -(int64_t)((base - t) / 1000);
}

/* Fill one trace entry (lock held); `arrivals` has nranks values, 0 = never arrived. */
static int trace_entry(Colld__V1__TraceEntry *e, const colld_trace_rec_t *t, const uint64_t *arrivals, int nranks,
                       int64_t mono_to_unix_us)
{
    colld__v1__trace_entry__init(e);
    e->seq = t->seq;
    e->kind = (char *)colld_kind_name(t->kind);
    e->dtype = (char *)colld_dtype_name(t->dtype);
    e->redop = (char *)(t->kind == COLLD_KIND_BROADCAST || t->kind == COLLD_KIND_ALLGATHER ? "-"
                                                                                              : colld_redop_name(t->redop));
    e->count = t->count;
    e->root = t->root;
    e->path = (char *)((t->flags & COLLD_SQE_FAST) ? "fast" : "engine");
    if (t->flags & COLLD_TRACE_SLOW_LINK)
        e->note = (char *)"slow link (recovered since)"; /* on_trace names it while it is still slow */
    e->status = t->status;
    e->first_arrival_unix_us = (int64_t)(t->first_ns / 1000) + mono_to_unix_us;
    e->arrival_us = calloc((size_t)nranks, sizeof(*e->arrival_us));
    if (!e->arrival_us)
        return -1;
    e->n_arrival_us = (size_t)nranks;
    for (int r = 0; r < nranks; r++)
        e->arrival_us[r] = after_us(arrivals[r], t->first_ns);
    e->start_us = after_us(t->start_ns, t->first_ns);
    e->end_us = after_us(t->end_ns, t->first_ns);
    return 0;
}

/* Trace: the flight recorder of one communicator, plus the collective it is waiting for. */
static void on_trace(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__TraceRequest *req = (const Colld__V1__TraceRequest *)msg;
    Colld__V1__TraceResponse resp = COLLD__V1__TRACE_RESPONSE__INIT;
    Colld__V1__TraceEntry *ent = NULL, **eptr = NULL;
    Colld__V1__RankStats *rs = NULL, **rptr = NULL;
    colld_trace_rec_t pending_rec;
    uint64_t *pending_arr = NULL;
    char detail[COLLD_DETAIL_LEN] = "";
    const char *sdetail = NULL;
    char *name = NULL, *comm_detail = NULL;
    size_t nent = 0;

    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, call, req->session, &resp.status, &sdetail);
    if (!s)
        goto unlock;
    colld_dcomm_t *c = comm_by_id(d, s, req->comm_id);
    if (!c) {
        resp.status = COLLD_ERR_INVALID_ARGUMENT;
        snprintf(detail, sizeof(detail), "no communicator %llu visible to uid %u (collctl status lists them)",
                 (unsigned long long)req->comm_id, (unsigned)s->uid);
        goto unlock;
    }
    uint64_t kept = COLLD_MIN(c->trace_count, (uint64_t)c->trace_cap);
    ent = calloc(kept + 1, sizeof(*ent));
    nent = ent ? kept + 1 : 0;
    eptr = calloc(kept + 1, sizeof(*eptr));
    rs = calloc((size_t)c->nranks, sizeof(*rs));
    rptr = calloc((size_t)c->nranks, sizeof(*rptr));
    pending_arr = calloc((size_t)c->nranks, sizeof(*pending_arr));
    name = strdup(c->name);
    comm_detail = strdup(c->error_detail);
    if (!ent || !eptr || !rs || !rptr || !pending_arr || !name || !comm_detail) {
        resp.status = COLLD_ERR_NO_MEMORY;
        snprintf(detail, sizeof(detail), "daemon out of memory");
        goto unlock;
    }
    int64_t mono_to_unix_us = colld_wall_ms() * 1000 - (int64_t)(colld_now_ns() / 1000);
    resp.comm_id = c->id;
    resp.name = name;
    resp.nranks = c->nranks;
    resp.state = (char *)colld_comm_state_name(c->state);
    resp.comm_status = c->error;
    resp.comm_detail = comm_detail;
    resp.timeout_ms = c->timeout_ms;
    resp.capacity = c->trace_cap;
    resp.recorded = c->trace_count;
    resp.entries = eptr;
    for (uint64_t i = c->trace_count - kept; i < c->trace_count; i++) {
        size_t slot = (size_t)(i % c->trace_cap);
        if (trace_entry(&ent[resp.n_entries], &c->trace[slot], &c->trace_arrivals[slot * (size_t)c->nranks],
                        c->nranks, mono_to_unix_us) < 0)
            goto nomem;
        eptr[resp.n_entries] = &ent[resp.n_entries];
        resp.n_entries++;
    }
    /* The collective being waited for, if any rank has posted it. */
    memset(&pending_rec, 0, sizeof(pending_rec));
    for (int r = 0; r < c->nranks && c->state == COLLD_COMM_READY; r++) {
        const colld_op_t *op = c->ranks[r].head;
        if (!op || op->d.seq != c->exec_seq)
            continue;
        pending_arr[r] = op->arrival_ns;
        if (!pending_rec.first_ns || op->arrival_ns < pending_rec.first_ns) {
            pending_rec.first_ns = op->arrival_ns;
            pending_rec.seq = op->d.seq;
            pending_rec.count = op->d.count;
            pending_rec.kind = (uint8_t)op->d.kind;
            pending_rec.dtype = (uint8_t)op->d.dtype;
            pending_rec.redop = (uint8_t)op->d.redop;
            pending_rec.flags = op->d.flags & COLLD_SQE_FAST;
            pending_rec.root = op->d.root;
        }
    }
    colld_cluster_trace_pending(c, &pending_rec, pending_arr); /* a multi-node one in the network comes first */
    if (pending_rec.first_ns) {
        pending_rec.status = COLLD_INPROGRESS;
        if (trace_entry(&ent[resp.n_entries], &pending_rec, pending_arr, c->nranks, mono_to_unix_us) < 0)
            goto nomem;
        eptr[resp.n_entries] = &ent[resp.n_entries];
        resp.n_entries++;
    }
    char note[sizeof(c->slow_link) + 16];
    snprintf(note, sizeof(note), "slow link: %s", c->slow_link);
    for (size_t i = 0; colld_comm_multi_node(c) && i < resp.n_entries; i++) {
        ent[i].path = (char *)"net"; /* multi-node: run across the daemons */
        if (ent[i].note[0] && c->slow_link[0])
            ent[i].note = note;
    }
    for (int r = 0; r < c->nranks; r++) {
        colld__v1__rank_stats__init(&rs[r]);
        rs[r].rank = r;
        rptr[r] = &rs[r];
    }
    for (int k = 0; k < colld_comm_nslots(c); k++) { /* a forming communicator: the ranks that joined */
        const colld_member_t *m = colld_comm_slot(c, k);
        int r = m->rank;
        rs[r].pid = m->pid;
        rs[r].present = m->session != NULL;
        rs[r].samples = m->late_samples;
        rs[r].mean_late_us = m->late_samples ? m->late_sum_ns / m->late_samples / 1000 : 0;
        rs[r].max_late_us = m->late_max_ns / 1000;
    }
    resp.ranks = rptr;
    resp.n_ranks = (size_t)c->nranks;
    resp.slowest_rank = colld_recorder_slowest(c);
    goto unlock;
nomem:
    resp.status = COLLD_ERR_NO_MEMORY;
    snprintf(detail, sizeof(detail), "daemon out of memory");
    resp.n_entries = resp.n_ranks = 0;
unlock:
    pthread_mutex_unlock(&d->lock);
    resp.detail = sdetail ? (char *)sdetail : detail;
    colld_rpc_reply(call, &resp.base);
    for (size_t i = 0; i < nent; i++)
        free(ent[i].arrival_us);
    free(ent);
    free(eptr);
    free(rs);
    free(rptr);
    free(pending_arr);
    free(name);
    free(comm_detail);
}

/* Events: a server stream, served by the event pump (events.c). */
static void on_events(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__EventsRequest *req = (const Colld__V1__EventsRequest *)msg;
    int32_t status = COLLD_OK;
    const char *detail = "";
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, call, req->session, &status, &detail);
    bool admin = s && is_admin(s);
    uid_t uid = s ? s->uid : 0;
    pthread_mutex_unlock(&d->lock);
    if (!s) {
        colld_rpc_finish(call, GRPC_STATUS_PERMISSION_DENIED, detail);
        return;
    }
    colld_events_subscribe(d, call, req->follow, req->backlog, req->only_new, admin, uid);
}

/* PeerDisconnect: close the connections to a peer daemon (admin). */
static void on_peer_disconnect(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__PeerDisconnectRequest *req = (const Colld__V1__PeerDisconnectRequest *)msg;
    Colld__V1__PeerDisconnectResponse resp = COLLD__V1__PEER_DISCONNECT_RESPONSE__INIT;
    char detail[COLLD_DETAIL_LEN] = "";
    const char *sdetail = NULL;
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, call, req->session, &resp.status, &sdetail);
    bool admin = s && is_admin(s);
    uid_t uid = s ? s->uid : 0;
    pthread_mutex_unlock(&d->lock);
    if (s && !admin) {
        resp.status = COLLD_ERR_PERMISSION_DENIED;
        snprintf(detail, sizeof(detail), "only root or the daemon's user may disconnect peers (caller uid %u)",
                 (unsigned)uid);
    } else if (s && !colld_cluster_running(d)) {
        resp.status = COLLD_ERR_INVALID_USAGE;
        snprintf(detail, sizeof(detail), "this daemon has no peers (it was started without --listen)");
    } else if (s && colld_cluster_disconnect(d, req->peer ? req->peer : "") < 0) {
        resp.status = COLLD_ERR_INVALID_ARGUMENT;
        snprintf(detail, sizeof(detail), "no peer daemon '%s' is up", req->peer ? req->peer : "");
    } else if (s) {
        LOG_WARN(ADMIN, "peer %s disconnected by an operator", req->peer);
    }
    resp.detail = sdetail ? (char *)sdetail : detail;
    colld_rpc_reply(call, &resp.base);
}

/* The answer of a probe (net.h: under the probe's lock, from the network thread): the call is
 * answered here, exactly once. */
static void probe_done(void *arg, const colld_probe_link_t *links, size_t n)
{
    colld_rpc_call_t *call = arg;
    if (!links && n == 0) {
        colld_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "the daemon is stopping: the probe was not finished");
        return;
    }
    Colld__V1__ProbeResponse resp = COLLD__V1__PROBE_RESPONSE__INIT;
    Colld__V1__LinkProbe *li = calloc(n + 1, sizeof(*li));
    Colld__V1__LinkProbe **lp = calloc(n + 1, sizeof(*lp));
    if (!li || !lp) {
        free(li);
        free(lp);
        colld_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "colld daemon out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        colld__v1__link_probe__init(&li[i]);
        li[i].name = (char *)links[i].name;
        li[i].addr = (char *)links[i].addr;
        li[i].tx_bytes = links[i].tx_bytes;
        li[i].tx_ns = links[i].tx_ns;
        li[i].rx_bytes = links[i].rx_bytes;
        li[i].rx_ns = links[i].rx_ns;
        li[i].rtt_ns = links[i].rtt_ns;
        li[i].error = (char *)links[i].error;
        lp[i] = &li[i];
    }
    resp.links = lp;
    resp.n_links = n;
    resp.detail = (char *)"";
    colld_rpc_reply(call, &resp.base);
    free(li);
    free(lp);
}

/* Probe (admin): measure every link of this daemon now (server/net/probe.c); answered when done. */
static void on_probe(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__ProbeRequest *req = (const Colld__V1__ProbeRequest *)msg;
    Colld__V1__ProbeResponse resp = COLLD__V1__PROBE_RESPONSE__INIT;
    char detail[COLLD_DETAIL_LEN] = "";
    const char *sdetail = NULL;
    pthread_mutex_lock(&d->lock);
    colld_session_t *s = session_of(d, call, req->session, &resp.status, &sdetail);
    bool admin = s && is_admin(s);
    uid_t uid = s ? s->uid : 0;
    pthread_mutex_unlock(&d->lock);
    if (s && !admin) {
        resp.status = COLLD_ERR_PERMISSION_DENIED;
        snprintf(detail, sizeof(detail), "only root or the daemon's user may probe the links (caller uid %u)",
                 (unsigned)uid);
    } else if (s) {
        uint64_t bytes = req->bytes ? req->bytes : COLLD_PROBE_DEFAULT_BYTES;
        if (colld_cluster_probe(d, bytes, probe_done, call, detail, sizeof(detail)) == 0) {
            LOG_INFO(ADMIN, "link probe of %llu bytes each way started by uid %u", (unsigned long long)bytes,
                     (unsigned)uid);
            return; /* answered by probe_done */
        }
        resp.status = COLLD_ERR_INVALID_USAGE;
    }
    resp.detail = sdetail ? (char *)sdetail : detail;
    colld_rpc_reply(call, &resp.base);
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
    { .path = "/colld.v1.Colld/CommAbort", .request = &colld__v1__comm_abort_request__descriptor, .handler = on_comm_abort },
    { .path = "/colld.v1.Colld/SetPolicy", .request = &colld__v1__set_policy_request__descriptor, .handler = on_set_policy },
    { .path = "/colld.v1.Colld/GetPolicy", .request = &colld__v1__get_policy_request__descriptor, .handler = on_get_policy },
    { .path = "/colld.v1.Colld/Trace", .request = &colld__v1__trace_request__descriptor, .handler = on_trace },
    { .path = "/colld.v1.Colld/Events",
      .request = &colld__v1__events_request__descriptor,
      .handler = on_events,
      .server_streaming = true },
    { .path = "/colld.v1.Colld/PeerDisconnect",
      .request = &colld__v1__peer_disconnect_request__descriptor,
      .handler = on_peer_disconnect },
    { .path = "/colld.v1.Colld/Probe", .request = &colld__v1__probe_request__descriptor, .handler = on_probe },
};

/* The method table (the fuzzers run its handlers through colld_rpc_server_inject). */
const colld_rpc_method_t *colld_control_methods(size_t *n)
{
    *n = COLLD_ARRAY_SIZE(methods);
    return methods;
}

/* Start the gRPC server on <socket>.rpc. Returns 0 or -1. */
int colld_control_start(colld_daemon_t *d)
{
    char err[256] = "";
    colld_err_t perr = COLLD_ERR_INIT;
    if (d->cfg.tenant_caps_text && colld_policy_parse(d, d->cfg.tenant_caps_text, &perr) < 0) {
        LOG_ERROR(INIT, "%s", perr.msg);
        return -1;
    }
    if (colld_events_start(d) < 0) {
        LOG_ERROR(INIT, "cannot start the event stream: out of memory");
        return -1;
    }
    /* No address: main.c accepts <socket>.rpc itself and hands the connections over (ctl_listen.c). */
    if (colld_rpc_server_create(NULL, methods, COLLD_ARRAY_SIZE(methods), d, &d->rpc, err, sizeof(err)) < 0 ||
        colld_rpc_server_start(d->rpc) < 0) {
        LOG_ERROR(RPC, "cannot serve the control plane on %s: %s", d->rpc_addr, err);
        return -1;
    }
    return 0;
}

/* Stop the gRPC server; deferred CommInit calls are released by the wrapper. */
void colld_control_stop(colld_daemon_t *d)
{
    colld_events_stop(d); /* streams end before the server that carries them */
    colld_cluster_probe_abandon(d); /* an owed probe is answered while its call is valid */
    colld_rpc_server_destroy(d->rpc);
    d->rpc = NULL;
    pthread_mutex_lock(&d->lock);
    colld_policy_free(d);
    pthread_mutex_unlock(&d->lock);
}
