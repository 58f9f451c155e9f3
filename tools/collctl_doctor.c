/*
 * collctl_doctor.c - `collctl doctor`: one screen that says what is wrong with the jobs on this
 * host and who is guilty, from what the daemon already knows (issue 18 item 4):
 *
 *   - communicators stuck in a collective (waiting longer than --stuck-ms, default 1 s): the
 *     collective, and the ranks that never posted it, with pid and node; or stuck in a send or
 *     receive: which rank waits for which, and what the peer does instead;
 *   - broken communicators and the first fault of each;
 *   - peer daemons that are not up;
 *   - slow links: a link to or from a peer daemon far slower than this node's other links (the
 *     rule of common/linkhealth.h over the rates collctl status shows);
 *   - stragglers: the slowest rank of a communicator, if it lags by --straggler-ms;
 *   - recent faults from the event backlog (the last --since seconds, default 3600): time-outs,
 *     dead peers, mismatches, aborts, NaN contributors (--nan-check), deadlock cycles; a problem
 *     while its communicator is still there, else a warning (history: a healthy job on a daemon
 *     whose earlier job failed is still healthy);
 *   - requests refused at per-tenant limits;
 *   - GPU health (collctl_gpu.c): uncorrected ECC errors, a failed row remap, critical Xids and a
 *     drained GPU are problems naming the communicators and ranks on the GPU; throttling, pending
 *     remaps or retired pages, NVLink and PCIe errors are warnings.
 *
 *   - across nodes (issue 30 item 5): when this daemon has peers (--listen), every other node's
 *     report, gathered by this daemon over the daemon-to-daemon channel (the NodeReports RPC):
 *     the same findings from each node's status and fault events (stuck collectives from the
 *     wait its status shows), each naming its node; a node that did not answer within
 *     --node-timeout-ms (default 2000) is itself a problem. A GPU finding of another node names
 *     the communicators of this node that its communicators are (the same cluster-wide id).
 *     --local: this node only.
 *
 * Each finding is a problem (something fails or hangs now) or a warning (something is slow, was
 * refused, or failed in a communicator that is gone), and names its node when the daemon has
 * peers. Exit status 0 when there is no problem, 1
 * when there is one (or the daemon is unreachable), 2 for a bad command line. --json prints one
 * object with every finding.
 */
#include "tools/collctl.h"

#include "common/util.h"
#include "colld.pb-c.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_FINDINGS 256
#define MAX_FAULT_EVENTS 12 /* the most recent ones shown; the others counted */

typedef struct {
    bool problem; /* else a warning */
    char what[24];
    char node[64]; /* "" when the daemon has no peers */
    char text[1024];
} finding_t;

/* A communicator of this node, to name it beside another node's (the same xid). */
typedef struct {
    uint64_t id, xid;
    char name[64];
} local_comm_t;

/* A stuck collective of a multi-node communicator of this node: the ranks on other nodes that it
 * has not heard from are looked up in their nodes' reports before it is told (resolve_stuck). */
#define MAX_STUCK 16
#define MAX_ABSENT 64
typedef struct {
    uint64_t xid, seq;
    char head[512];  /* "communicator 1 'x' (3 ranks) has waited 420 ms in collective #1 allreduce(...)" */
    char local[512]; /* this node's ranks that did not post it: "0 (pid 12), 3 (pid 14)" */
    int nlocal, nremote;
    int rrank[MAX_ABSENT];
    char rnode[MAX_ABSENT][64];
} stuck_t;

typedef struct {
    finding_t f[MAX_FINDINGS];
    stuck_t stuck[MAX_STUCK];
    int nstuck;
    Colld__V1__NodeReportsResponse *nodes; /* the other nodes' reports (check_nodes), or NULL */
    int n, problems, warnings, dropped;
    uint64_t *live; /* the ids of the communicators of the node being looked at (its Status) */
    size_t nlive;
    char node[64];      /* the node being looked at ("" without peers) */
    char self[64];      /* this node */
    local_comm_t *here; /* this node's multi-node communicators */
    size_t nhere;
} report_t;

static bool comm_live(const report_t *r, uint64_t id)
{
    for (size_t i = 0; i < r->nlive; i++)
        if (r->live[i] == id)
            return true;
    return false;
}

__attribute__((format(printf, 4, 5))) static void add(report_t *r, bool problem, const char *what, const char *fmt, ...)
{
    if (r->n == MAX_FINDINGS) {
        r->dropped++;
        return;
    }
    finding_t *f = &r->f[r->n++];
    f->problem = problem;
    colld_strlcpy(f->node, r->node, sizeof(f->node));
    colld_strlcpy(f->what, what, sizeof(f->what)); /* copied: it may be an event's, freed next */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->text, sizeof(f->text), fmt, ap);
    va_end(ap);
    if (problem)
        r->problems++;
    else
        r->warnings++;
}

static int64_t now_unix_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The node a rank lives on, for a communicator spanning nodes ("" on this one). */
static const char *node_of(const Colld__V1__CommInfo *ci, int rank)
{
    for (size_t m = 0; m < ci->n_members; m++)
        if (ci->members[m]->rank == rank && ci->members[m]->node && *ci->members[m]->node)
            return ci->members[m]->node;
    return "";
}

/* A ready communicator: the collective it waits for, if it has waited longer than stuck_ms, with
 * the ranks that never posted it. */
static void check_stuck(colld_client_t *c, report_t *r, const Colld__V1__CommInfo *ci, int64_t stuck_ms)
{
    Colld__V1__TraceRequest req = COLLD__V1__TRACE_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    req.comm_id = ci->id;
    Colld__V1__TraceResponse *t = NULL;
    if (collctl_call(c, "trace", "/colld.v1.Colld/Trace", &req.base, &colld__v1__trace_response__descriptor,
                     (ProtobufCMessage **)&t))
        return;
    const Colld__V1__TraceEntry *e = t->n_entries ? t->entries[t->n_entries - 1] : NULL;
    int64_t waited_ms = e ? (now_unix_us() - e->first_arrival_unix_us) / 1000 : 0;
    if (e && e->status == COLLD_INPROGRESS && waited_ms >= stuck_ms) {
        stuck_t one, *st = r->nstuck < MAX_STUCK ? &r->stuck[r->nstuck] : &one;
        memset(st, 0, sizeof(*st));
        st->xid = ci->xid;
        st->seq = e->seq;
        snprintf(st->head, sizeof(st->head),
                 "communicator %llu '%s' (%d ranks) has waited %lld ms in collective #%llu %s(%s, count %llu)",
                 (unsigned long long)ci->id, ci->name, ci->nranks, (long long)waited_ms, (unsigned long long)e->seq,
                 e->kind, e->dtype, (unsigned long long)e->count);
        int off = 0;
        for (size_t k = 0; k < e->n_arrival_us && off < (int)sizeof(st->local) - 64; k++) {
            if (e->arrival_us[k] >= 0)
                continue;
            const char *node = node_of(ci, (int)k);
            if (*node && st->nremote < MAX_ABSENT) { /* on another node: its report says (resolve_stuck) */
                st->rrank[st->nremote] = (int)k;
                colld_strlcpy(st->rnode[st->nremote++], node, sizeof(st->rnode[0]));
                continue;
            }
            int pid = 0;
            for (size_t s = 0; s < t->n_ranks; s++)
                if (t->ranks[s]->rank == (int)k)
                    pid = t->ranks[s]->pid;
            off += snprintf(st->local + off, sizeof(st->local) - (size_t)off, "%s%zu (pid %d)",
                            st->nlocal++ ? ", " : "", k, pid);
        }
        if (st != &one)
            r->nstuck++;
        else
            add(r, true, "stuck", "%s: rank(s) %s%s never posted it", st->head, st->local,
                st->nremote ? " and ranks on other nodes" : "");
    }
    protobuf_c_message_free_unpacked(&t->base, NULL);
}

/* Another node's GPU users ("communicator 7 ranks 24-31, ...", that node's ids) with, for each of
 * its communicators that is also one of this node's (the same cluster-wide id), this node's. */
static void users_here(const report_t *r, const Colld__V1__StatusResponse *s, const char *users, char *out, size_t len)
{
    size_t off = 0;
    out[0] = '\0';
    for (const char *p = strstr(users, "communicator "); p; p = strstr(p + 1, "communicator ")) {
        unsigned long long id = strtoull(p + 13, NULL, 10);
        for (size_t i = 0; i < s->n_comms; i++) {
            if (s->comms[i]->id != id || !s->comms[i]->xid)
                continue;
            for (size_t k = 0; k < r->nhere && off < len; k++)
                if (r->here[k].xid == s->comms[i]->xid) {
                    int w = snprintf(out + off, len - off, "%s%llu on node %s is communicator %llu '%s' on node %s",
                                     off ? "; " : " (communicator ", id, r->node, (unsigned long long)r->here[k].id,
                                     r->here[k].name, r->self);
                    off += w > 0 ? (size_t)w : 0;
                }
        }
    }
    if (off && off < len)
        snprintf(out + off, len - off, ")");
}

/* Communicators, peers, stragglers, GPUs of one node's status. local: this node's (its stuck
 * collectives from the flight recorder); else another node's (from the wait its status shows). */
static void analyze_status(colld_client_t *c, report_t *r, const Colld__V1__StatusResponse *s, bool local,
                           int64_t stuck_ms, int64_t straggler_ms)
{
    for (size_t i = 0; i < s->n_peers; i++) {
        const Colld__V1__PeerInfo *p = s->peers[i];
        if (strcmp(p->state, "up") != 0)
            add(r, true, "peer", "peer daemon %s (%s) is %s%s%s", p->name, p->addr, p->state,
                *p->last_error ? ": " : "", p->last_error);
    }
    collctl_link_t links[COLLCTL_MAX_LINKS];
    size_t nlinks = collctl_links(s, links, COLLCTL_MAX_LINKS);
    for (size_t k = 0; k < nlinks; k++) {
        if (!links[k].l.slow)
            continue;
        const Colld__V1__PeerInfo *p = s->peers[links[k].peer];
        char text[256];
        colld_link_describe(text, sizeof(text), links[k].from, links[k].to, &links[k].l);
        add(r, true, "slow-link",
            "%s (measured on collective data; TCP: rtt %.2f ms, %llu retransmits; `collctl probe` measures it "
            "again)",
            text, p->tcp_rtt_us / 1000.0, (unsigned long long)p->retrans);
    }
    for (size_t i = 0; i < s->n_gpus; i++) { /* GPU health (collctl_gpu.c) */
        collctl_gpu_finding_t gf[8];
        int ng = collctl_gpu_findings(s->gpus[i], r->node, gf, 8);
        char here[320] = "";
        if (!local)
            users_here(r, s, s->gpus[i]->users, here, sizeof(here));
        for (int k = 0; k < ng; k++)
            add(r, gf[k].problem, gf[k].what, "%s%s", gf[k].text, here);
    }
    free(r->live);
    r->live = s->n_comms ? calloc(s->n_comms, sizeof(*r->live)) : NULL;
    r->nlive = 0;
    for (size_t i = 0; i < s->n_comms && r->live; i++)
        r->live[r->nlive++] = s->comms[i]->id;
    for (size_t i = 0; i < s->n_comms; i++) {
        const Colld__V1__CommInfo *ci = s->comms[i];
        if (strcmp(ci->state, "broken") == 0)
            add(r, true, "broken", "communicator %llu '%s' (%d ranks) is broken: %s", (unsigned long long)ci->id,
                ci->name, ci->nranks, *ci->last_error ? ci->last_error : "(no detail)");
        else if (strcmp(ci->state, "joining") == 0)
            add(r, false, "joining", "communicator %llu '%s': %d of %d ranks joined so far", (unsigned long long)ci->id,
                ci->name, ci->joined, ci->nranks);
        else if (strcmp(ci->state, "ready") == 0 && local)
            check_stuck(c, r, ci, stuck_ms);
        else if (strcmp(ci->state, "ready") == 0 && *ci->coll_wait && ci->coll_waited_ms >= stuck_ms)
            add(r, true, "stuck", "communicator %llu '%s' (%d ranks) has waited %lld ms: %s",
                (unsigned long long)ci->id, ci->name, ci->nranks, (long long)ci->coll_waited_ms, ci->coll_wait);
        if (*ci->p2p_wait && ci->p2p_waited_ms >= stuck_ms)
            add(r, true, "stuck", "communicator %llu '%s' (%d ranks), point-to-point: %s", (unsigned long long)ci->id,
                ci->name, ci->nranks, ci->p2p_wait);
        for (size_t m = 0; ci->slowest_rank >= 0 && m < ci->n_members; m++) {
            const Colld__V1__CommMemberInfo *mi = ci->members[m];
            if (mi->rank == ci->slowest_rank && mi->mean_late_us >= (uint64_t)straggler_ms * 1000)
                add(r, false, "straggler",
                    "communicator %llu '%s': rank %d (pid %d%s%s) is the slowest, on average %.1f ms behind the "
                    "first rank (worst %.1f ms, %llu collectives)",
                    (unsigned long long)ci->id, ci->name, mi->rank, mi->pid, *mi->node ? ", node " : "", mi->node,
                    (double)mi->mean_late_us / 1000, (double)mi->max_late_us / 1000, (unsigned long long)mi->samples);
        }
    }
}

/* This node (the Status RPC). */
static int check_status(colld_client_t *c, report_t *r, int64_t stuck_ms, int64_t straggler_ms, char *head,
                        size_t head_len)
{
    Colld__V1__StatusRequest req = COLLD__V1__STATUS_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    Colld__V1__StatusResponse *s = NULL;
    if (collctl_call(c, "status", "/colld.v1.Colld/Status", &req.base, &colld__v1__status_response__descriptor,
                     (ProtobufCMessage **)&s))
        return -1;
    snprintf(head, head_len, "colld %s, pid %d, up %lld s: %zu session(s), %zu communicator(s)%s%s%s",
             s->daemon_version, s->pid, (long long)((now_unix_us() / 1000 - s->started_unix_ms) / 1000), s->n_sessions,
             s->n_comms, *s->node_name ? ", node " : "", s->node_name, s->n_peers ? " with peers" : "");
    colld_strlcpy(r->self, s->node_name, sizeof(r->self));
    colld_strlcpy(r->node, s->node_name, sizeof(r->node));
    r->here = s->n_comms ? calloc(s->n_comms, sizeof(*r->here)) : NULL;
    for (size_t i = 0; r->here && i < s->n_comms; i++)
        if (s->comms[i]->xid) {
            local_comm_t *h = &r->here[r->nhere++];
            h->id = s->comms[i]->id;
            h->xid = s->comms[i]->xid;
            colld_strlcpy(h->name, s->comms[i]->name, sizeof(h->name));
        }
    analyze_status(c, r, s, true, stuck_ms, straggler_ms);
    int rc = *s->node_name ? 1 : 0; /* 1: the daemon has peers */
    protobuf_c_message_free_unpacked(&s->base, NULL);
    return rc;
}

/* What an event with a failed status says about the culprit. */
static const char *fault_what(const Colld__V1__Event *e)
{
    if (e->status == COLLD_ERR_NUMERIC)
        return "nan";
    if (e->status == COLLD_ERR_CORRUPTED) /* result verification: a rank's or node's result differs */
        return "corrupted";
    if (e->status == COLLD_ERR_DEADLOCK || strcmp(e->type, "deadlock") == 0)
        return "deadlock";
    return e->type;
}

/* Whether an event is a fault doctor reports. */
static bool is_fault(const Colld__V1__Event *e, int64_t from)
{
    /* coll_waiting is in progress: a stuck collective is judged from the status above. */
    return e->status != COLLD_OK && strcmp(e->type, "comm_destroyed") != 0 &&
           strcmp(e->type, "session_detached") != 0 && strcmp(e->type, "coll_waiting") != 0 &&
           strncmp(e->type, "gpu_", 4) != 0 && /* GPU health: from the status */
           e->unix_us >= from;
}

/* The findings of fault events (most recent last; more: the earlier ones left out). */
static void add_faults(report_t *r, Colld__V1__Event *const *kept, int nkept, int more, int64_t since_s)
{
    if (more)
        add(r, false, "faults", "%d earlier fault event(s) in the last %lld s (collctl events shows them all)", more,
            (long long)since_s);
    for (int i = 0; i < nkept; i++) {
        const Colld__V1__Event *e = kept[i];
        char when[32];
        time_t t = (time_t)(e->unix_us / 1000000);
        struct tm tm;
        localtime_r(&t, &tm);
        strftime(when, sizeof(when), "%H:%M:%S", &tm);
        char who[64] = "";
        if (e->rank >= 0)
            snprintf(who, sizeof(who), ", rank %d (pid %d)", e->rank, e->pid);
        bool live = e->comm_id && comm_live(r, e->comm_id);
        add(r, live, fault_what(e), "%s %s: communicator %llu '%s'%s%s: %s: %s", when, e->type,
            (unsigned long long)e->comm_id, e->comm_name, live ? "" : " (gone now)", who,
            colld_status_name((colld_status_t)e->status), e->detail);
    }
}

/* Recent faults from the event backlog (the last since_s seconds), most recent last. */
static void check_events(colld_client_t *c, report_t *r, int64_t since_s)
{
    Colld__V1__Event *kept[MAX_FAULT_EVENTS];
    int nkept = 0, more = 0;
    Colld__V1__EventsRequest req = COLLD__V1__EVENTS_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    colld_rpc_stream_t *st = NULL;
    if (colld_rpc_stream_open(c->rpc, "/colld.v1.Colld/Events", &req.base, &colld__v1__event__descriptor,
                              COLLD_CLIENT_RPC_TIMEOUT_MS, &st) != GRPC_STATUS_OK) {
        add(r, false, "events", "the event backlog could not be read");
        return;
    }
    int64_t from = now_unix_us() - since_s * 1000000;
    for (;;) {
        ProtobufCMessage *m = NULL;
        grpc_status_code final = GRPC_STATUS_OK;
        char details[256] = "";
        if (colld_rpc_stream_next(st, &m, &final, details, sizeof(details)) != 0)
            break;
        collctl_clean_message(m);
        Colld__V1__Event *e = (Colld__V1__Event *)m;
        if (!is_fault(e, from)) {
            protobuf_c_message_free_unpacked(m, NULL);
            continue;
        }
        if (nkept == MAX_FAULT_EVENTS) { /* keep the most recent */
            protobuf_c_message_free_unpacked(&kept[0]->base, NULL);
            memmove(kept, kept + 1, (MAX_FAULT_EVENTS - 1) * sizeof(kept[0]));
            nkept--;
            more++;
        }
        kept[nkept++] = e;
    }
    colld_rpc_stream_close(st);
    add_faults(r, kept, nkept, more, since_s);
    for (int i = 0; i < nkept; i++)
        protobuf_c_message_free_unpacked(&kept[i]->base, NULL);
}

/* Every other node (the NodeReports RPC): what it did not answer, then its findings. */
static void check_nodes(colld_client_t *c, report_t *r, const collctl_doctor_opts_t *o)
{
    Colld__V1__NodeReportsRequest req = COLLD__V1__NODE_REPORTS_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    req.timeout_ms = (uint32_t)o->node_timeout_ms;
    req.since_s = o->since_s ? o->since_s : 1;
    Colld__V1__NodeReportsResponse *resp = NULL;
    if (collctl_call(c, "node reports", "/colld.v1.Colld/NodeReports", &req.base,
                     &colld__v1__node_reports_response__descriptor, (ProtobufCMessage **)&resp)) {
        add(r, true, "nodes", "the other nodes' reports could not be gathered (see above)");
        return;
    }
    int64_t from = now_unix_us() - o->since_s * 1000000;
    for (size_t i = 0; i < resp->n_nodes; i++) {
        const Colld__V1__NodeReportEntry *e = resp->nodes[i];
        colld_strlcpy(r->node, e->node, sizeof(r->node));
        if (!e->answered || !e->report || !e->report->status) {
            add(r, true, "node", "node %s (%s): %s", e->node, e->addr, *e->error ? e->error : "no report");
            continue;
        }
        const Colld__V1__NodeReport *nr = e->report;
        analyze_status(c, r, nr->status, false, o->stuck_ms, o->straggler_ms);
        Colld__V1__Event *kept[MAX_FAULT_EVENTS];
        int nkept = 0, more = (int)nr->events_dropped;
        for (size_t k = 0; k < nr->n_events; k++) {
            if (!is_fault(nr->events[k], from))
                continue;
            if (nkept == MAX_FAULT_EVENTS) {
                memmove(kept, kept + 1, (MAX_FAULT_EVENTS - 1) * sizeof(kept[0]));
                nkept--;
                more++;
            }
            kept[nkept++] = nr->events[k];
        }
        add_faults(r, kept, nkept, more, o->since_s);
        if (nr->truncated)
            add(r, false, "node", "node %s (%s): its report was cut to fit (collctl status on that node shows all)",
                e->node, e->addr);
    }
    colld_strlcpy(r->node, r->self, sizeof(r->node));
    r->nodes = resp; /* resolve_stuck reads it */
}

/* Requests refused at per-tenant limits since the daemon started. */
static void check_limits(colld_client_t *c, report_t *r)
{
    Colld__V1__GetPolicyRequest req = COLLD__V1__GET_POLICY_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    Colld__V1__GetPolicyResponse *p = NULL;
    if (collctl_call(c, "policy", "/colld.v1.Colld/GetPolicy", &req.base, &colld__v1__get_policy_response__descriptor,
                     (ProtobufCMessage **)&p))
        return;
    for (size_t i = 0; i < p->n_defaults; i++)
        if (p->defaults[i]->refused)
            add(r, false, "quota",
                "%llu request(s) refused at the per-tenant limit %s (default %llu; collctl policy "
                "shows who holds what)",
                (unsigned long long)p->defaults[i]->refused, p->defaults[i]->name,
                (unsigned long long)p->defaults[i]->limit);
    if (p->registrations_refused)
        add(r, false, "quota", "%llu registration(s) refused at the daemon-wide backstop of %llu",
            (unsigned long long)p->registrations_refused, (unsigned long long)p->max_registrations);
    protobuf_c_message_free_unpacked(&p->base, NULL);
}

/* Whether rank `rank` of the communicator xid posted collective seq, as node `node`'s report says:
 * 1 yes, 0 no (*pid its pid), -1 the report does not say (none, or the communicator is not in it). */
static int remote_posted(const report_t *r, const char *node, uint64_t xid, int rank, uint64_t seq, int *pid)
{
    for (size_t i = 0; r->nodes && i < r->nodes->n_nodes; i++) {
        const Colld__V1__NodeReportEntry *e = r->nodes->nodes[i];
        if (strcmp(e->node, node) != 0 || !e->report || !e->report->status)
            continue;
        const Colld__V1__StatusResponse *s = e->report->status;
        for (size_t k = 0; k < s->n_comms; k++) {
            const Colld__V1__CommInfo *ci = s->comms[k];
            if (ci->xid != xid)
                continue;
            for (size_t m = 0; m < ci->n_members && m < ci->n_member_posted; m++)
                if (ci->members[m]->rank == rank && !*ci->members[m]->node) {
                    *pid = ci->members[m]->pid;
                    return ci->member_posted[m] >= seq;
                }
        }
    }
    return -1;
}

/* Tell the stuck collectives of multi-node communicators: a rank on another node is named when its
 * node's report says it has not posted the collective (with its pid), or when there is no report
 * to say (with "no report from its node"). */
static void resolve_stuck(report_t *r)
{
    colld_strlcpy(r->node, r->self, sizeof(r->node));
    for (int i = 0; i < r->nstuck; i++) {
        const stuck_t *st = &r->stuck[i];
        char absent[1024];
        int off = snprintf(absent, sizeof(absent), "%s", st->local), missing = st->nlocal;
        for (int k = 0; k < st->nremote && off < (int)sizeof(absent) - 96; k++) {
            int pid = 0, posted = remote_posted(r, st->rnode[k], st->xid, st->rrank[k], st->seq, &pid);
            if (posted == 1)
                continue;
            if (posted == 0)
                off += snprintf(absent + off, sizeof(absent) - (size_t)off, "%s%d (pid %d, node %s)",
                                missing++ ? ", " : "", st->rrank[k], pid, st->rnode[k]);
            else
                off += snprintf(absent + off, sizeof(absent) - (size_t)off, "%s%d (node %s%s)", missing++ ? ", " : "",
                                st->rrank[k], st->rnode[k], r->nodes ? ": no report from it" : "");
        }
        add(r, true, "stuck", "%s%s%s%s", st->head, missing ? ": rank(s) " : "", missing ? absent : "",
            missing ? " never posted it" : " (every rank posted it; it has not completed)");
    }
}

int collctl_doctor(colld_client_t *c, const collctl_doctor_opts_t *o)
{
    report_t *r = calloc(1, sizeof(*r));
    char head[512] = "";
    if (!r)
        return 1;
    int peers = check_status(c, r, o->stuck_ms, o->straggler_ms, head, sizeof(head));
    if (peers < 0) {
        free(r->live);
        free(r->here);
        free(r);
        return 1;
    }
    check_events(c, r, o->since_s);
    check_limits(c, r);
    if (peers && !o->local)
        check_nodes(c, r, o);
    resolve_stuck(r);
    if (o->json) {
        printf("{\"schema_version\":%d,\"daemon\":", COLLCTL_JSON_SCHEMA_VERSION);
        collctl_json_str(head);
        printf(",\"problems\":%d,\"warnings\":%d,\"findings\":[", r->problems, r->warnings);
        for (int i = 0; i < r->n; i++) {
            printf("%s{\"severity\":\"%s\",\"what\":", i ? "," : "", r->f[i].problem ? "problem" : "warning");
            collctl_json_str(r->f[i].what);
            printf(",\"node\":");
            collctl_json_str(r->f[i].node);
            printf(",\"text\":");
            collctl_json_str(r->f[i].text);
            printf("}");
        }
        printf("]}\n");
    } else {
        printf("%s\n", head);
        if (!r->n)
            printf("no problems found\n");
        for (int pass = 0; pass < 2; pass++) /* problems first */
            for (int i = 0; i < r->n; i++)
                if (r->f[i].problem == (pass == 0))
                    printf("%-7s %-10s %s%s%s%s\n", r->f[i].problem ? "PROBLEM" : "warning", r->f[i].what,
                           *r->f[i].node ? "[" : "", r->f[i].node, *r->f[i].node ? "] " : "", r->f[i].text);
        if (r->dropped)
            printf("(%d more findings not shown)\n", r->dropped);
        if (r->n)
            printf("%d problem(s), %d warning(s)\n", r->problems, r->warnings);
    }
    int rc = r->problems ? 1 : 0;
    if (r->nodes)
        protobuf_c_message_free_unpacked(&r->nodes->base, NULL);
    free(r->live);
    free(r->here);
    free(r);
    return rc;
}
