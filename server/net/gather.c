/*
 * gather.c - collctl doctor across nodes (issue 30 item 5): this daemon asks its peer daemons for
 * their reports over the authenticated daemon-to-daemon channel, and answers theirs.
 *
 * The asker (the control plane's NodeReports RPC, colld_cluster_gather): the network thread takes
 * the peers as they are now; to each that is up it sends DoctorReq{id, uid, admin, since}, and it
 * records each other one with what it is ("the peer is lost: ..."). A DoctorReport from a peer it
 * asked, with the gather's id, is that peer's answer (its report, at most COLLD_GATHER_REPORT_MAX
 * bytes, kept as sent: the control plane unpacks, caps and sanitizes it); once every asked peer
 * answered, or timeout_ms passed, the answer goes to the caller's done callback, and a peer that
 * did not answer is an entry "did not answer within N ms", never a wait. At most COLLD_GATHER_MAX
 * gathers run at once (another is refused; a tenant that is not an administrator has one at a
 * time, and never the last free slot), each asks at most COLLD_GATHER_PEERS_MAX peers, and an
 * answer that comes late, twice, from a peer not asked or with an unknown id is dropped.
 *
 * The answerer: a DoctorReq from an authenticated peer is served at once on the network thread
 * by the control plane's report maker (d->node_report: the Status a caller of that uid would get,
 * sessions left out, and the recent fault events), within COLLD_GATHER_REPORT_MAX bytes; at most
 * COLLD_GATHER_SERVE_PER_S requests a second are served (all peers together), the others are
 * answered with an error, so a peer cannot make this daemon spend its time on reports.
 *
 * Trust: the peers proved the cluster secret; the uid and admin flag of the request are the
 * asking daemon's word about its caller, as a Join's tenant is (docs/operations.md).
 */
#include "server/net/cluster.h"

#include "colld_net.pb-c.h"
#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

/* Forget what run g gathered (its nodes' reports, who it waits for). */
static void gather_clear(cgather_t *g)
{
    for (size_t i = 0; g->nodes && i < g->n; i++)
        free(g->nodes[i].report);
    free(g->nodes);
    free(g->waiting);
    g->nodes = NULL;
    g->waiting = NULL;
    g->n = 0;
}

/* Hand slot g's answer to whoever is owed it and forget the run (net thread). */
static void gather_finish(colld_cluster_t *cl, cgather_t *g)
{
    pthread_mutex_lock(&cl->probe_lock);
    if (g->done)
        g->done(g->arg, g->nodes ? g->nodes : (colld_gather_node_t[1]){ 0 }, g->nodes ? g->n : 0);
    g->done = NULL;
    g->arg = NULL;
    pthread_mutex_unlock(&cl->probe_lock);
    gather_clear(g);
    g->active = false;
}

void colld_gather_begin(colld_daemon_t *d, int slot)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    cgather_t *g = &cl->gather[slot];
    if (g->active) /* a run whose answer was abandoned (the control plane stopping): forget it */
        gather_clear(g);
    size_t max = colld_net_peers(cl->net, NULL, 0); /* the count; only this thread adds peers */
    max = COLLD_MIN(max, (size_t)COLLD_GATHER_PEERS_MAX);
    colld_net_peer_info_t *info = calloc(max + 1, sizeof(*info));
    size_t n = info ? COLLD_MIN(colld_net_peers(cl->net, info, max), max) : 0;
    g->nodes = calloc(n + 1, sizeof(*g->nodes));
    g->waiting = calloc(n + 1, sizeof(*g->waiting));
    g->active = true;
    g->id = (colld_now_ns() << 3) | (uint64_t)slot;
    g->deadline_ns = colld_now_ns() + (uint64_t)g->timeout_ms * 1000000ull;
    if (!info || !g->nodes || !g->waiting) {
        free(info);
        free(g->nodes);
        g->nodes = NULL;
        gather_finish(cl, g); /* answered with no node: the control plane says why */
        return;
    }
    Colld__Net__V1__DoctorReq q = COLLD__NET__V1__DOCTOR_REQ__INIT;
    q.id = g->id;
    q.uid = (uint32_t)g->uid;
    q.admin = g->admin;
    q.since_unix_us = g->since_us;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_DOCTOR_REQ;
    m.doctor_req = &q;
    uint8_t buf[64];
    size_t len = colld__net__v1__msg__get_packed_size(&m);
    if (len <= sizeof(buf))
        colld__net__v1__msg__pack(&m, buf);
    for (size_t i = 0; i < n; i++) {
        colld_gather_node_t *x = &g->nodes[g->n++];
        colld_strlcpy(x->name, info[i].name, sizeof(x->name));
        colld_strlcpy(x->addr, info[i].addr, sizeof(x->addr));
        colld_net_peer_t *p = strcmp(info[i].state, "up") == 0 ? colld_net_peer_find(cl->net, info[i].addr) : NULL;
        if (!p || !colld_net_peer_is_up(p)) {
            snprintf(x->error, sizeof(x->error), "the peer is %s%s%s", info[i].state, info[i].last_error[0] ? ": " : "",
                     info[i].last_error);
            continue;
        }
        if (len > sizeof(buf) || colld_net_send_ctrl(p, buf, len) < 0) {
            snprintf(x->error, sizeof(x->error), "the request could not be queued to it");
            continue;
        }
        g->waiting[i] = true;
    }
    free(info);
    colld_gather_tick(d);
}

/* Drive the gathers (network thread, every tick): answer each whose peers all answered or whose
 * time is up. */
void colld_gather_tick(colld_daemon_t *d)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    uint64_t now = colld_now_ns();
    for (int s = 0; s < COLLD_GATHER_MAX; s++) {
        cgather_t *g = &cl->gather[s];
        if (!g->active)
            continue;
        size_t left = 0;
        for (size_t i = 0; i < g->n; i++)
            left += g->waiting[i];
        if (left && now < g->deadline_ns)
            continue;
        for (size_t i = 0; i < g->n; i++)
            if (g->waiting[i]) {
                g->waiting[i] = false;
                snprintf(g->nodes[i].error, sizeof(g->nodes[i].error), "did not answer within %u ms", g->timeout_ms);
            }
        gather_finish(cl, g);
    }
}

/* A peer asks for this node's report: serve it (within the rate) or say why not. */
static void serve(colld_daemon_t *d, colld_net_peer_t *p, const Colld__Net__V1__DoctorReq *q)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    Colld__Net__V1__DoctorReport r = COLLD__NET__V1__DOCTOR_REPORT__INIT;
    char err[256] = "";
    uint8_t *report = NULL;
    size_t rlen = 0;
    uint64_t sec = colld_now_ms() / 1000;
    if (sec != cl->gather_serve_sec) {
        cl->gather_serve_sec = sec;
        cl->gather_served = 0;
    }
    if (cl->gather_served >= COLLD_GATHER_SERVE_PER_S) {
        snprintf(err, sizeof(err), "node %s serves at most %d doctor requests a second", cl->node_name,
                 COLLD_GATHER_SERVE_PER_S);
        colld_cluster_log_bad(cl, "DoctorReq from %s beyond %d a second", colld_net_peer_addr(p),
                              COLLD_GATHER_SERVE_PER_S);
    } else {
        cl->gather_served++;
        pthread_mutex_lock(&d->lock);
        __typeof__(d->node_report) make = d->node_report;
        pthread_mutex_unlock(&d->lock);
        if (!make)
            snprintf(err, sizeof(err), "node %s is stopping", cl->node_name);
        else if (make(d, (uid_t)q->uid, q->admin, q->since_unix_us, COLLD_GATHER_REPORT_MAX, &report, &rlen, err,
                      sizeof(err)) < 0)
            report = NULL;
    }
    r.id = q->id;
    r.report.data = report;
    r.report.len = report ? rlen : 0;
    r.error = err;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_DOCTOR_REPORT;
    m.doctor_report = &r;
    size_t len = colld__net__v1__msg__get_packed_size(&m);
    uint8_t *buf = len <= COLLD_NET_CTRL_MAX ? malloc(len) : NULL;
    if (buf) {
        colld__net__v1__msg__pack(&m, buf);
        if (colld_net_send_ctrl(p, buf, len) < 0)
            LOG_WARN_RL(NET, "a doctor report to %s could not be queued", colld_net_peer_addr(p));
    }
    free(buf);
    free(report);
}

/* A peer's answer to one of this daemon's gathers. */
static void answer(colld_daemon_t *d, colld_net_peer_t *p, const Colld__Net__V1__DoctorReport *r)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    for (int s = 0; s < COLLD_GATHER_MAX; s++) {
        cgather_t *g = &cl->gather[s];
        if (!g->active || g->id != r->id)
            continue;
        for (size_t i = 0; i < g->n; i++) {
            colld_gather_node_t *x = &g->nodes[i];
            if (!g->waiting[i] || strcmp(x->addr, colld_net_peer_addr(p)) != 0)
                continue;
            g->waiting[i] = false;
            if (r->report.len > COLLD_GATHER_REPORT_MAX) {
                snprintf(x->error, sizeof(x->error), "its report of %zu bytes is larger than %u", r->report.len,
                         COLLD_GATHER_REPORT_MAX);
                colld_cluster_log_bad(cl, "doctor report of %zu bytes from %s", r->report.len, x->addr);
            } else if (!r->report.len) {
                colld_str_sanitize(x->error, sizeof(x->error), r->error ? r->error : "", SIZE_MAX);
                if (!x->error[0])
                    snprintf(x->error, sizeof(x->error), "it sent no report");
            } else if ((x->report = malloc(r->report.len))) {
                memcpy(x->report, r->report.data, r->report.len);
                x->report_len = r->report.len;
                x->answered = true;
            } else {
                snprintf(x->error, sizeof(x->error), "this daemon is out of memory for its report");
            }
            colld_gather_tick(d);
            return;
        }
    }
    /* late (after its gather answered), twice, or not asked for: dropped */
}

void colld_gather_ctrl(colld_daemon_t *d, colld_net_peer_t *p, const Colld__Net__V1__Msg *m)
{
    if (m->m_case == COLLD__NET__V1__MSG__M_DOCTOR_REQ)
        serve(d, p, m->doctor_req);
    else if (m->m_case == COLLD__NET__V1__MSG__M_DOCTOR_REPORT)
        answer(d, p, m->doctor_report);
}

/* ============================================================================================
 * The control plane's side
 * ========================================================================================== */

int colld_cluster_gather(colld_daemon_t *d, uid_t uid, bool admin, int64_t since_unix_us, uint32_t timeout_ms,
                         colld_gather_done_fn done, void *arg, char *err, size_t err_len)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    if (!cl) {
        colld_set_err(err, err_len, "this daemon has no peers (it was started without --listen)");
        return -1;
    }
    cjob_t *j = calloc(1, sizeof(*j));
    if (!j) {
        colld_set_err(err, err_len, "daemon out of memory");
        return -1;
    }
    int slot = -1, nfree = 0, mine = 0;
    pthread_mutex_lock(&cl->probe_lock);
    for (int s = 0; s < COLLD_GATHER_MAX; s++) {
        if (!cl->gather[s].done) {
            nfree++;
            if (slot < 0)
                slot = s;
        } else if (!cl->gather[s].admin && cl->gather[s].uid == uid) {
            mine++;
        }
    }
    /* a tenant has one gather at a time, and the last free slot is kept for administrators */
    bool tenant_refused = !admin && (mine > 0 || nfree < 2);
    if (tenant_refused)
        slot = -1;
    if (slot >= 0) {
        cgather_t *g = &cl->gather[slot];
        g->done = done;
        g->arg = arg;
        /* the rest is the network thread's once the job is taken; it is not running this slot */
        g->uid = uid;
        g->admin = admin;
        g->since_us = since_unix_us;
        g->timeout_ms = timeout_ms;
    }
    pthread_mutex_unlock(&cl->probe_lock);
    if (slot < 0) {
        free(j);
        if (tenant_refused && mine)
            colld_set_err(err, err_len, "a doctor across nodes of uid %u is running already: one at a time",
                          (unsigned)uid);
        else
            colld_set_err(err, err_len,
                          "%d doctor gathers are running already, or all but the one kept for administrators "
                          "(try again when one has answered)",
                          COLLD_GATHER_MAX);
        return -1;
    }
    j->gather = slot + 1;
    pthread_mutex_lock(&d->lock);
    colld_cluster_inbox_push(d, j);
    pthread_mutex_unlock(&d->lock);
    return 0;
}

void colld_cluster_gather_abandon(colld_daemon_t *d)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    if (!cl)
        return;
    pthread_mutex_lock(&cl->probe_lock);
    for (int s = 0; s < COLLD_GATHER_MAX; s++) {
        cgather_t *g = &cl->gather[s];
        if (g->done)
            g->done(g->arg, NULL, 0);
        g->done = NULL;
        g->arg = NULL;
    }
    pthread_mutex_unlock(&cl->probe_lock);
}

/* The transport stopped (no callback runs any more): free what the gathers held. */
void colld_gather_free(colld_cluster_t *cl)
{
    for (int s = 0; s < COLLD_GATHER_MAX; s++) {
        cgather_t *g = &cl->gather[s];
        for (size_t i = 0; g->nodes && i < g->n; i++)
            free(g->nodes[i].report);
        free(g->nodes);
        free(g->waiting);
        memset(g, 0, sizeof(*g));
    }
}
