/*
 * status.c - the Status a caller sees (status.h): sessions, communicators (with their members,
 * stragglers and waits), peer daemons and their links, GPU health. The Status RPC (control.c)
 * answers with it; node_report.c sends it to a peer's `collctl doctor`.
 */
#include "server/control/status.h"

#include "server/core/tenant.h"
#include "server/core/verify.h"
#include "server/net/net.h"
#include "server/observability/recorder.h"

#include "common/util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DAEMON_VERSION COLLD_VERSION_STRING /* the CMake project version */

void colld_status_build(colld_daemon_t *d, bool admin, uid_t uid, bool sessions, colld_status_buf_t *b)
{
    Colld__V1__StatusResponse resp = COLLD__V1__STATUS_RESPONSE__INIT;
    Colld__V1__SessionInfo *sinfo = NULL, **sptr = NULL;
    Colld__V1__CommInfo *cinfo = NULL, **cptr = NULL;
    Colld__V1__CommMemberInfo *minfo = NULL, **mptr = NULL;
    const char *detail = "";
    size_t ns = 0, nc = 0, nm = 0;
    colld_gpu_health_t *gh = NULL;
    int ngh = 0;

    pthread_mutex_lock(&d->lock);
    for (colld_session_t *s = d->sessions; s && sessions; s = s->next)
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
    uint64_t *posted = calloc(nm + 1, sizeof(*posted));
    b->posted = posted;
    if (!sinfo || !sptr || !cinfo || !cptr || !minfo || !mptr || !posted) {
        resp.status = COLLD_ERR_NO_MEMORY;
        detail = "daemon out of memory";
        goto unlock;
    }
    for (colld_session_t *s = d->sessions; s && sessions; s = s->next) {
        if (!admin && s->uid != uid)
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
        if (!admin && c->tenant != uid)
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
        i->xid = colld_cluster_comm_xid(c);
        i->members = &mptr[mi];
        i->member_posted = &posted[mi];
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
            posted[mi] = m->remote ? 0 : m->tail ? m->tail->d.seq : c->exec_seq - 1;
            mptr[mi++] = x;
            i->n_members++;
            i->n_member_posted++;
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
    colld_strlcpy(b->gh_none, d->gpu_health_none, sizeof(b->gh_none));
    resp.sessions = sptr;
    resp.comms = cptr;
    resp.pid = getpid();
    resp.started_unix_ms = d->started_ms;
    resp.socket = d->cfg.socket;
unlock:
    pthread_mutex_unlock(&d->lock);
    /* peer daemons: the transport's own snapshot, taken without daemon->lock */
    colld_net_peer_info_t *peers = b->peers;
    Colld__V1__PeerInfo *pinfo = b->pinfo, **pptr = b->pptr;
    if (resp.status == COLLD_OK && colld_cluster_running(d)) {
        size_t np = colld_cluster_peers(d, peers, COLLD_STATUS_PEERS_MAX, &resp.net_payload_sent,
                                        &resp.net_payload_received, &resp.net_refused);
        resp.node_name = (char *)colld_cluster_node_name(d);
        resp.listen = (char *)colld_cluster_listen_addr(d);
        for (size_t k = 0; k < np && k < COLLD_STATUS_PEERS_MAX; k++) {
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
    resp.net_transport = d->cfg.net_transport_text ? d->cfg.net_transport_text : (char *)"auto";
    resp.ib_device = (char *)colld_cluster_ib_device(d);
    resp.ib_none = (char *)colld_cluster_ib_none(d);
    resp.detail = (char *)detail;
    resp.daemon_version = (char *)DAEMON_VERSION;
    b->resp = resp;
    b->sinfo = sinfo;
    b->sptr = sptr;
    b->cinfo = cinfo;
    b->cptr = cptr;
    b->minfo = minfo;
    b->mptr = mptr;
    b->gh = gh;
    b->ginfo = ginfo;
    b->gptr = gptr;
    b->resp.gpu_health_none = b->gh_none;
}

void colld_status_buf_free(colld_status_buf_t *b)
{
    if (!b)
        return;
    free(b->ginfo);
    free(b->gptr);
    free(b->gh);
    for (size_t k = 0; k < b->resp.n_sessions; k++)
        free(b->sinfo[k].process_name);
    for (size_t k = 0; k < b->resp.n_comms; k++) {
        free(b->cinfo[k].name);
        free(b->cinfo[k].last_error);
        free(b->cinfo[k].p2p_wait);
        free(b->cinfo[k].coll_wait);
    }
    free(b->sinfo);
    free(b->sptr);
    free(b->cinfo);
    free(b->cptr);
    free(b->minfo);
    free(b->mptr);
    free(b->posted);
    free(b);
}
