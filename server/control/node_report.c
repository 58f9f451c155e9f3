/*
 * node_report.c - `collctl doctor` across nodes (issue 30 item 5), the control plane's side:
 *
 *   - this node's report for a peer's DoctorReq (d->node_report, called by server/net/gather.c):
 *     the Status a caller of that uid sees here (status.c, sessions left out) and the last
 *     NODE_REPORT_EVENTS fault events since the asked time, packed as a colld.v1.NodeReport within
 *     the size asked (events, then communicators, left out to fit, and said so);
 *   - the NodeReports RPC: every peer daemon's report, gathered by the net backend
 *     (colld_cluster_gather), each one validated here before it goes to the caller: a peer's
 *     report is hostile input, so it must unpack, hold at most so many communicators, members,
 *     GPUs, peers and events, and every string in it is sanitized (valid UTF-8 without control
 *     characters) and cut to NODE_REPORT_STR_MAX bytes. A report that fails is an entry saying
 *     why, as a node that did not answer is.
 */
#include "server/control/control.h"
#include "server/control/status.h"

#include "server/core/daemon.h"
#include "server/net/net.h"
#include "server/observability/events.h"

#include "colld.pb-c.h"
#include "common/log.h"
#include "common/rpc_codec.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NODE_REPORT_EVENTS 32      /* fault events per report */
#define NODE_REPORT_COMMS_MAX 4096 /* what a peer's report may hold */
#define NODE_REPORT_GPUS_MAX 64
#define NODE_REPORT_STR_MAX 1024
#define NODE_REPORTS_TIMEOUT_MS 2000 /* the default wait for the peers */

/* ============================================================================================
 * This node's report
 * ========================================================================================== */

static int make_report(colld_daemon_t *d, uid_t uid, bool admin, int64_t since_unix_us, size_t cap, uint8_t **out,
                       size_t *len, char *err, size_t err_len)
{
    colld_status_buf_t *b = calloc(1, sizeof(*b));
    Colld__V1__Event *ev = calloc(NODE_REPORT_EVENTS, sizeof(*ev));
    Colld__V1__Event *evp[NODE_REPORT_EVENTS];
    colld_event_copy_t *recs = NULL;
    int rc = -1;
    *out = NULL;
    if (!b || !ev) {
        colld_set_err(err, err_len, "node %s is out of memory for its report", colld_cluster_node_name(d));
        goto out;
    }
    colld_status_build(d, admin, uid, false, b);
    if (b->resp.status != COLLD_OK) {
        colld_set_err(err, err_len, "node %s: %s", colld_cluster_node_name(d), b->resp.detail);
        goto out;
    }
    Colld__V1__NodeReport r = COLLD__V1__NODE_REPORT__INIT;
    r.status = &b->resp;
    pthread_mutex_lock(&d->lock); /* the backlog stays while it is read (colld_events_stop clears it under the lock) */
    r.n_events = colld_events_faults(d, admin, uid, since_unix_us, NODE_REPORT_EVENTS, ev, &recs, &r.events_dropped);
    pthread_mutex_unlock(&d->lock);
    for (size_t i = 0; i < r.n_events; i++)
        evp[i] = &ev[i];
    r.events = evp;
    size_t size;
    while ((size = colld__v1__node_report__get_packed_size(&r)) > cap) { /* events first, then communicators */
        r.truncated = true;
        if (r.n_events) {
            r.events_dropped += (uint32_t)r.n_events;
            r.n_events = 0;
        } else if (b->resp.n_comms) {
            b->resp.n_comms /= 2; /* the buffer still frees every one (colld_status_buf_free counts them) */
        } else {
            colld_set_err(err, err_len, "node %s: its report does not fit in %zu bytes", colld_cluster_node_name(d),
                          cap);
            goto out;
        }
    }
    *out = malloc(size ? size : 1);
    if (!*out) {
        colld_set_err(err, err_len, "node %s is out of memory for its report", colld_cluster_node_name(d));
        goto out;
    }
    *len = colld__v1__node_report__pack(&r, *out);
    rc = 0;
out:
    if (b) {
        /* every communicator built is freed, however many the report kept */
        size_t built = 0;
        while (b->cptr && b->cptr[built])
            built++;
        b->resp.n_comms = built;
    }
    colld_status_buf_free(b);
    free(ev);
    free(recs);
    return rc;
}

void colld_node_report_start(colld_daemon_t *d)
{
    pthread_mutex_lock(&d->lock);
    d->node_report = make_report;
    pthread_mutex_unlock(&d->lock);
}

void colld_node_report_stop(colld_daemon_t *d)
{
    pthread_mutex_lock(&d->lock);
    d->node_report = NULL;
    pthread_mutex_unlock(&d->lock);
}

/* ============================================================================================
 * Other nodes' reports (the NodeReports RPC)
 * ========================================================================================== */


/* A peer's report, unpacked and checked; NULL with the reason in err. */
static Colld__V1__NodeReport *check_report(const colld_gather_node_t *x, char *err, size_t err_len)
{
    Colld__V1__NodeReport *r = colld__v1__node_report__unpack(NULL, x->report_len, x->report);
    if (!r) {
        snprintf(err, err_len, "its report does not decode");
        return NULL;
    }
    const Colld__V1__StatusResponse *s = r->status;
    const char *bad = NULL;
    if (!s)
        bad = "it holds no status";
    else if (s->n_comms > NODE_REPORT_COMMS_MAX)
        bad = "too many communicators";
    else if (s->n_gpus > NODE_REPORT_GPUS_MAX)
        bad = "too many GPUs";
    else if (s->n_peers > COLLD_STATUS_PEERS_MAX)
        bad = "too many peers";
    else if (r->n_events > NODE_REPORT_EVENTS)
        bad = "too many events";
    for (size_t i = 0; !bad && i < s->n_comms; i++)
        if (s->comms[i]->n_members > COLLD_MAX_RANKS || s->comms[i]->n_member_posted > s->comms[i]->n_members)
            bad = "a communicator with too many members";
    if (bad) {
        snprintf(err, err_len, "its report is refused: %s", bad);
        protobuf_c_message_free_unpacked(&r->base, NULL);
        return NULL;
    }
    colld_rpc_clean_strings(&r->base, NODE_REPORT_STR_MAX);
    return r;
}

/* The answer of a gather (net.h: from the network thread under the gather's lock): the call is
 * answered here, exactly once. */
static void gather_done(void *arg, const colld_gather_node_t *nodes, size_t n)
{
    colld_rpc_call_t *call = arg;
    if (!nodes) {
        colld_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "the daemon is stopping: the nodes' reports were not gathered");
        return;
    }
    Colld__V1__NodeReportsResponse resp = COLLD__V1__NODE_REPORTS_RESPONSE__INIT;
    Colld__V1__NodeReportEntry *e = calloc(n + 1, sizeof(*e));
    Colld__V1__NodeReportEntry **ep = calloc(n + 1, sizeof(*ep));
    char(*errs)[256] = calloc(n + 1, sizeof(*errs));
    if (!e || !ep || !errs) {
        free(e);
        free(ep);
        free(errs);
        colld_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "colld daemon out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        colld__v1__node_report_entry__init(&e[i]);
        e[i].node = (char *)nodes[i].name;
        e[i].addr = (char *)nodes[i].addr;
        colld_strlcpy(errs[i], nodes[i].error, sizeof(errs[i]));
        if (nodes[i].answered) {
            e[i].report = check_report(&nodes[i], errs[i], sizeof(errs[i]));
            e[i].answered = e[i].report != NULL;
            if (!e[i].report)
                LOG_WARN_RL(NET, "doctor report of %s (%s): %s", nodes[i].name, nodes[i].addr, errs[i]);
        }
        e[i].error = errs[i];
        ep[i] = &e[i];
    }
    resp.nodes = ep;
    resp.n_nodes = n;
    resp.detail = (char *)"";
    colld_rpc_reply(call, &resp.base);
    for (size_t i = 0; i < n; i++)
        if (e[i].report)
            protobuf_c_message_free_unpacked(&e[i].report->base, NULL);
    free(e);
    free(ep);
    free(errs);
}

void colld_node_reports_rpc(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx, bool admin, uid_t uid)
{
    colld_daemon_t *d = ctx;
    const Colld__V1__NodeReportsRequest *req = (const Colld__V1__NodeReportsRequest *)msg;
    Colld__V1__NodeReportsResponse resp = COLLD__V1__NODE_REPORTS_RESPONSE__INIT;
    char detail[COLLD_DETAIL_LEN] = "";
    uint32_t timeout_ms = req->timeout_ms ? req->timeout_ms : NODE_REPORTS_TIMEOUT_MS;
    int64_t since_s = req->since_s ? req->since_s : 3600;
    if (timeout_ms < 50 || timeout_ms > 30000 || since_s < 0 || since_s > 86400 * 366) {
        resp.status = COLLD_ERR_INVALID_ARGUMENT;
        snprintf(detail, sizeof(detail), "timeout_ms must be 50..30000 and since_s 0..31622400 (got %u, %lld)",
                 timeout_ms, (long long)since_s);
    } else if (!colld_cluster_running(d)) {
        resp.status = COLLD_ERR_INVALID_USAGE;
        snprintf(detail, sizeof(detail), "this daemon has no peers (it was started without --listen)");
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t since_us = ((int64_t)ts.tv_sec - since_s) * 1000000;
        if (colld_cluster_gather(d, uid, admin, since_us, timeout_ms, gather_done, call, detail, sizeof(detail)) == 0)
            return; /* answered by gather_done */
        resp.status = COLLD_ERR_INVALID_USAGE;
    }
    resp.detail = detail;
    colld_rpc_reply(call, &resp.base);
}
