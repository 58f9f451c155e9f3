/*
 * metrics.c - the daemon's Prometheus metrics: counters, the text exposition, and a small HTTP
 * endpoint on the daemon's libuv loop.
 *
 * Counters (operations and bytes by kind x dtype x status, latency histograms per kind,
 * communicator errors by status, sessions opened, communicators formed) live in struct
 * colld_metrics and are updated by the engine and the registry with daemon->lock held. Gauges
 * (sessions, communicators by state, queued operations, descriptors in flight, registered bytes)
 * are computed at scrape time by walking the daemon's state under the same lock, so they can
 * never drift from what `collctl status` shows.
 *
 * The endpoint (--metrics HOST:PORT, off by default) answers GET/HEAD /metrics with the text
 * exposition format 0.0.4, /healthz (200 whenever the process answers) and /readyz (200 when the
 * session socket, the control plane, the engine and, with --listen, the peer listener are up and
 * the daemon is not draining or stopping; 503 naming what is not), and closes the connection
 * after every response. Per-tenant series are bounded: the METRICS_TOP_TENANTS tenants with the
 * most registered memory (then sessions) get their own uid label, the rest are summed as "other". Debian 12 does not
 * package llhttp (only Debian 13 does), and we only need the request line, so the request is
 * parsed by the small hand-written parser below: at most 8 KiB are read until the blank line
 * that ends the headers, anything else is answered with 400/404/405/431/505. The connections are
 * http.c's; all HTTP state belongs to the loop thread.
 *
 * Held connections must not starve scrapes (slowloris) nor the kubelet's probes: a metrics
 * connection has HTTP_REQUEST_DEADLINE_MS to deliver its whole request and HTTP_RESPONSE_DEADLINE_MS
 * to take the answer; at most HTTP_MAX_CONNECTIONS are open, HTTP_MAX_PER_SOURCE of them from one
 * address, and a newcomer closes a connection still without its request or one that has not
 * taken its answer for HTTP_STALLED_MS (http.c). Liveness and readiness have their own listener
 * (--health HOST:PORT, /healthz and /readyz only): its answers are a few bytes that never wait
 * for the client, every connection on it may be closed for a newcomer, so no client of the
 * metrics port, and no client of the health port either, can keep a probe out.
 */
#include "server/observability/metrics.h"

#include "server/control/control.h"
#include "server/core/counters.h"
#include "server/net/net.h"
#include "server/observability/http.h"
#include "server/observability/recorder.h"

#include "common/linkhealth.h"
#include "common/log.h"
#include "common/util.h"
#include "server/core/daemon.h"
#include "transport/tcp/tcp.h"
#include "server/core/tenant.h"

#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define HTTP_REQUEST_DEADLINE_MS 2000  /* the whole request must arrive this soon after the accept */
#define HTTP_RESPONSE_DEADLINE_MS 5000 /* the answer must be taken this soon after the request */
#define HTTP_MAX_CONNECTIONS 64   /* open at once on --metrics */
#define HTTP_MAX_PER_SOURCE 8     /* of them from one address (Prometheus holds one per scrape) */
#define HTTP_STALLED_MS 1000      /* answered this long ago and still open: may go for a newcomer */
#define HEALTH_MAX_CONNECTIONS 32 /* open at once on --health (any may go for a newcomer) */
#define HEALTH_MAX_PER_SOURCE 4   /* of them from one address */
#define HEALTH_DEADLINE_MS 1000   /* to send the request, then to take the answer (a kubelet's probe
                                     times out after 1 s by default) */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define TEXT_CONTENT_TYPE "text/plain; charset=utf-8"
#define METRICS_TOP_TENANTS 10    /* tenants with their own label; the others are "other" */
#define METRICS_MAX_PEERS 1024    /* peer daemons listed one by one */

/* ============================================================================================
 * The object
 * ========================================================================================== */

struct colld_metrics {
    /* The HTTP endpoints: loop thread only. */
    colld_daemon_t *daemon;
    colld_http_server_t *http;   /* --metrics, NULL when off */
    colld_http_server_t *health; /* --health, NULL when off */
    char url[96];                /* "http://127.0.0.1:9464/metrics", "" when off */
    char health_url[96];         /* "http://127.0.0.1:9465/healthz", "" when off */
    char error[320];             /* why the last colld_metrics_start failed */
    uint64_t evicted, refused;   /* of listeners stopped already */
};

/* Create the endpoint's object (not serving yet). */
int colld_metrics_create(colld_daemon_t *d)
{
    colld_metrics_t *m = calloc(1, sizeof(*m));
    if (!m)
        return -1;
    m->daemon = d;
    d->metrics = m;
    return 0;
}

/* Free it; the endpoint must be stopped and the loop run since (its handles closed). */
void colld_metrics_destroy(colld_daemon_t *d)
{
    free(d->metrics);
    d->metrics = NULL;
}

const char *colld_metrics_url(const colld_daemon_t *d)
{
    return d->metrics && d->metrics->url[0] ? d->metrics->url : NULL;
}

const char *colld_metrics_health_url(const colld_daemon_t *d)
{
    return d->metrics && d->metrics->health_url[0] ? d->metrics->health_url : NULL;
}

const char *colld_metrics_error(const colld_daemon_t *d)
{
    return d->metrics && d->metrics->error[0] ? d->metrics->error : "unknown reason";
}

/* ============================================================================================
 * Rendering the exposition text
 * ========================================================================================== */

/* A growable text buffer; `failed` sticks once an allocation failed. */
typedef struct {
    char *data;
    size_t len, cap;
    bool failed;
} textbuf_t;

static void tb_printf(textbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void tb_printf(textbuf_t *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data ? b->data + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 16384;
        while (cap - b->len <= (size_t)n)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
}

/* "# HELP" and "# TYPE" lines of one metric family. */
static void tb_family(textbuf_t *b, const char *name, const char *type, const char *help)
{
    tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* What the process costs, read before taking the lock (cheap: getrusage and two small reads
 * of /proc). Fields the system cannot tell stay negative and are not emitted. */
typedef struct {
    double cpu_seconds;
    long long rss_bytes;
    long long open_fds;
    long long max_fds;
} process_info_t;

static void read_process_info(process_info_t *p)
{
    struct rusage ru;
    p->cpu_seconds = -1;
    p->rss_bytes = p->open_fds = p->max_fds = -1;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        p->cpu_seconds = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
                         ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        long long size, resident;
        long page = sysconf(_SC_PAGESIZE);
        if (fscanf(f, "%lld %lld", &size, &resident) == 2 && page > 0)
            p->rss_bytes = resident * page;
        fclose(f);
    }
    DIR *dir = opendir("/proc/self/fd");
    if (dir) {
        long long n = 0;
        for (struct dirent *e; (e = readdir(dir)) != NULL;)
            if (e->d_name[0] != '.')
                n++;
        closedir(dir);
        p->open_fds = n - 1; /* the directory's own descriptor */
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        p->max_fds = (long long)rl.rlim_cur;
}

/* Gauges walked from the daemon's state (lock held). */
typedef struct {
    uint64_t sessions;
    uint64_t comms_by_state[8]; /* index colld_comm_state_t */
    unsigned nstates;           /* states to print */
    uint64_t ops_queued;
    uint64_t in_flight;
    uint64_t registered_bytes;
} state_gauges_t;

static void walk_state(colld_daemon_t *d, state_gauges_t *g)
{
    memset(g, 0, sizeof(*g));
    g->nstates = COLLD_COMM_CLOSING + 1;
    for (colld_session_t *s = d->sessions; s; s = s->next) {
        if (!s->dead)
            g->sessions++;
        g->in_flight += s->in_flight;
        g->registered_bytes += s->registered_bytes;
    }
    for (colld_dcomm_t *c = d->comms; c; c = c->next) {
        unsigned st = (unsigned)c->state;
        if (st < COLLD_ARRAY_SIZE(g->comms_by_state)) {
            g->comms_by_state[st]++;
            if (st + 1 > g->nstates)
                g->nstates = st + 1;
        }
        for (int r = 0; r < c->nranks && st != COLLD_COMM_JOINING; r++) { /* forming: no ops, no rank array */
            for (colld_op_t *op = c->ranks[r].head; op; op = op->next)
                g->ops_queued++;
            for (colld_op_t *op = c->ranks[r].p2p_head; op; op = op->next) /* sends and receives */
                g->ops_queued++;
        }
    }
}

/* The peer daemons, snapshotted from the transport before daemon->lock is taken (as collctl
 * status does). */
typedef struct {
    colld_net_peer_info_t *peers; /* heap, NULL without --listen */
    size_t n;
    uint64_t sent, received, refused, bad;
} peer_snapshot_t;

static void read_peers(colld_daemon_t *d, peer_snapshot_t *ps)
{
    memset(ps, 0, sizeof(*ps));
    if (!colld_cluster_running(d))
        return;
    ps->peers = calloc(METRICS_MAX_PEERS, sizeof(*ps->peers));
    if (!ps->peers)
        return;
    size_t n = colld_cluster_peers(d, ps->peers, METRICS_MAX_PEERS, &ps->sent, &ps->received, &ps->refused);
    ps->bad = colld_cluster_bad_msgs(d);
    ps->n = n < METRICS_MAX_PEERS ? n : METRICS_MAX_PEERS;
}

/* Append a label value: peers choose their names, so anything but printable ASCII becomes '?'
 * and the exposition format's escapes are applied. */
static void tb_label(textbuf_t *b, const char *v)
{
    char out[2 * COLLD_NET_ADDR_LEN + 2];
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)v; *p && o + 3 < sizeof(out); p++) {
        if (*p == '\\' || *p == '"') {
            out[o++] = '\\';
            out[o++] = (char)*p;
        } else
            out[o++] = *p >= 0x20 && *p < 0x7f ? (char)*p : '?';
    }
    out[o] = '\0';
    tb_printf(b, "%s", out);
}

/* One peer line: name{peer="..."} value. */
static void peer_line(textbuf_t *b, const char *name, const colld_net_peer_info_t *p, int decimals, double v)
{
    tb_printf(b, "%s{peer=\"", name);
    tb_label(b, p->name[0] ? p->name : p->addr);
    tb_printf(b, "\"} %.*f\n", decimals, v);
}

/* One directed link line: name{peer="...",direction="send|receive"} value. */
static void link_line(textbuf_t *b, const char *name, const colld_net_peer_info_t *p, bool send, int decimals,
                      double v)
{
    tb_printf(b, "%s{peer=\"", name);
    tb_label(b, p->name[0] ? p->name : p->addr);
    tb_printf(b, "\",direction=\"%s\"} %.*f\n", send ? "send" : "receive", decimals, v);
}

/* Link health (docs/operations.md, "Link health"): measured throughput per direction, the
 * slow-link verdict (common/linkhealth.h) over this node's links, round-trip times and TCP_INFO. */
static void render_links(textbuf_t *b, const peer_snapshot_t *ps)
{
    colld_link_rate_t *l = ps->n ? calloc(2 * ps->n, sizeof(*l)) : NULL;
    for (size_t i = 0; l && i < ps->n; i++) {
        bool up = ps->peers[i].state && strcmp(ps->peers[i].state, "up") == 0;
        l[2 * i].rate = up ? ps->peers[i].tx_rate : 0;
        l[2 * i + 1].rate = up ? ps->peers[i].rx_rate : 0;
    }
    if (l)
        colld_link_outliers(l, 2 * ps->n);
    tb_family(b, "colld_peer_link_bytes_per_second", "gauge",
              "Measured throughput of collective data on the link to (send) or from (receive) this peer daemon: "
              "bytes over the time spent moving them; 0 until enough was measured.");
    for (size_t i = 0; l && i < ps->n; i++) {
        link_line(b, "colld_peer_link_bytes_per_second", &ps->peers[i], true, 0, l[2 * i].rate);
        link_line(b, "colld_peer_link_bytes_per_second", &ps->peers[i], false, 0, l[2 * i + 1].rate);
    }
    tb_family(b, "colld_peer_link_slow", "gauge",
              "1 while the link is below 1/4 of the median of this node's other measured links (at least 2 others).");
    for (size_t i = 0; l && i < ps->n; i++) {
        link_line(b, "colld_peer_link_slow", &ps->peers[i], true, 0, l[2 * i].slow);
        link_line(b, "colld_peer_link_slow", &ps->peers[i], false, 0, l[2 * i + 1].slow);
    }
    free(l);
    tb_family(b, "colld_peer_rtt_seconds", "gauge", "Heartbeat round-trip time to this peer daemon, smoothed.");
    for (size_t i = 0; i < ps->n; i++)
        peer_line(b, "colld_peer_rtt_seconds", &ps->peers[i], 6, ps->peers[i].rtt_ms / 1000.0);
    tb_family(b, "colld_peer_tcp_rtt_seconds", "gauge",
              "TCP_INFO round-trip time of the connections to this peer daemon (the largest).");
    for (size_t i = 0; i < ps->n; i++)
        peer_line(b, "colld_peer_tcp_rtt_seconds", &ps->peers[i], 6, ps->peers[i].tcp_rtt_us / 1e6);
    tb_family(b, "colld_peer_tcp_retransmits_total", "counter",
              "TCP segments retransmitted to this peer daemon (TCP_INFO, every connection it had).");
    for (size_t i = 0; i < ps->n; i++)
        peer_line(b, "colld_peer_tcp_retransmits_total", &ps->peers[i], 0, (double)ps->peers[i].retrans);
    tb_family(b, "colld_peer_tcp_lost_segments", "gauge", "TCP segments to this peer daemon now presumed lost.");
    for (size_t i = 0; i < ps->n; i++)
        peer_line(b, "colld_peer_tcp_lost_segments", &ps->peers[i], 0, (double)ps->peers[i].tcp_lost);
    tb_family(b, "colld_peer_lost_total", "counter",
              "Times this peer daemon was lost (a connection failed or went silent, or an operator disconnected it).");
    for (size_t i = 0; i < ps->n; i++)
        peer_line(b, "colld_peer_lost_total", &ps->peers[i], 0, (double)ps->peers[i].losses);
    tb_family(b, "colld_peer_transport", "gauge",
              "1 for the transport carrying this peer daemon's collective data: tcp or ib (docs/ib.md).");
    for (size_t i = 0; i < ps->n; i++) {
        tb_printf(b, "colld_peer_transport{peer=\"");
        tb_label(b, ps->peers[i].name[0] ? ps->peers[i].name : ps->peers[i].addr);
        tb_printf(b, "\",transport=\"");
        tb_label(b, ps->peers[i].transport[0] ? ps->peers[i].transport : "tcp");
        tb_printf(b, "\"} 1\n");
    }
}

/* Peer daemons and the links to them. HELP/TYPE lines are always written, so the families exist
 * (empty) on a single-node daemon. */
static void render_peers(textbuf_t *b, const peer_snapshot_t *ps)
{
    static const char *const states[] = { "connecting", "up", "lost" };
    tb_family(b, "colld_peers", "gauge", "Peer daemons (multi-node) by the state of the links to them.");
    for (size_t s = 0; s < COLLD_ARRAY_SIZE(states); s++) {
        unsigned n = 0;
        for (size_t i = 0; i < ps->n; i++)
            n += ps->peers[i].state && strcmp(ps->peers[i].state, states[s]) == 0;
        if (ps->peers)
            tb_printf(b, "colld_peers{state=\"%s\"} %u\n", states[s], n);
    }
    tb_family(b, "colld_peer_up", "gauge", "1 while the links to this peer daemon are up, 0 while connecting or lost.");
    for (size_t i = 0; i < ps->n; i++)
        peer_line(b, "colld_peer_up", &ps->peers[i], 0,
                  ps->peers[i].state && strcmp(ps->peers[i].state, "up") == 0 ? 1.0 : 0.0);
    tb_family(b, "colld_peer_connections", "gauge", "Authenticated connections open to this peer daemon.");
    for (size_t i = 0; i < ps->n; i++)
        peer_line(b, "colld_peer_connections", &ps->peers[i], 0, (double)ps->peers[i].conns);
    tb_family(b, "colld_peer_sent_bytes_total", "counter", "Bytes sent to this peer daemon (payload and headers).");
    for (size_t i = 0; i < ps->n; i++)
        peer_line(b, "colld_peer_sent_bytes_total", &ps->peers[i], 0, (double)ps->peers[i].bytes_sent);
    tb_family(b, "colld_peer_received_bytes_total", "counter",
              "Bytes received from this peer daemon (payload and headers).");
    for (size_t i = 0; i < ps->n; i++)
        peer_line(b, "colld_peer_received_bytes_total", &ps->peers[i], 0, (double)ps->peers[i].bytes_received);
    tb_family(b, "colld_peer_send_bytes_per_second", "gauge", "Send rate to this peer over about the last second.");
    for (size_t i = 0; i < ps->n; i++)
        peer_line(b, "colld_peer_send_bytes_per_second", &ps->peers[i], 1, ps->peers[i].send_rate);
    tb_family(b, "colld_peer_receive_bytes_per_second", "gauge",
              "Receive rate from this peer over about the last second.");
    for (size_t i = 0; i < ps->n; i++)
        peer_line(b, "colld_peer_receive_bytes_per_second", &ps->peers[i], 1, ps->peers[i].recv_rate);
    tb_family(b, "colld_net_payload_sent_bytes_total", "counter", "Collective payload bytes sent to peer daemons.");
    tb_printf(b, "colld_net_payload_sent_bytes_total %llu\n", (unsigned long long)ps->sent);
    tb_family(b, "colld_net_payload_received_bytes_total", "counter",
              "Collective payload bytes received from peer daemons.");
    tb_printf(b, "colld_net_payload_received_bytes_total %llu\n", (unsigned long long)ps->received);
    tb_family(b, "colld_net_refused_connections_total", "counter",
              "Connections to the peer port refused because they failed authentication.");
    tb_printf(b, "colld_net_refused_connections_total %llu\n", (unsigned long long)ps->refused);
    tb_family(b, "colld_net_refused_messages_total", "counter",
              "Messages from authenticated peer daemons refused: invalid, or from a node not entitled to send them "
              "(the log names them, at most a line per 10 s).");
    tb_printf(b, "colld_net_refused_messages_total %llu\n", (unsigned long long)ps->bad);
    render_links(b, ps);
}

/* What one tenant (uid) holds, for the per-tenant families. */
typedef struct {
    uid_t uid;
    uint64_t sessions, comms, registered_bytes;
} tenant_row_t;

/* qsort order by uid, so one tenant's sessions sit next to each other and merge. */
static int tenant_by_uid(const void *a, const void *b)
{
    uid_t x = ((const tenant_row_t *)a)->uid, y = ((const tenant_row_t *)b)->uid;
    return x < y ? -1 : x > y;
}

/* Most registered memory first, then most sessions, then the smaller uid (a stable order). */
static int tenant_by_weight(const void *a, const void *b)
{
    const tenant_row_t *x = a, *y = b;
    if (x->registered_bytes != y->registered_bytes)
        return x->registered_bytes > y->registered_bytes ? -1 : 1;
    if (x->sessions != y->sessions)
        return x->sessions > y->sessions ? -1 : 1;
    return x->uid < y->uid ? -1 : x->uid > y->uid;
}

/* Per-tenant gauges of the top METRICS_TOP_TENANTS tenants and "other" (lock held). One row per
 * live session, sorted by uid and merged, so the cost is O(sessions log sessions). */
static void render_tenants(colld_daemon_t *d, textbuf_t *b)
{
    size_t n = 0, cap = 0;
    for (colld_session_t *s = d->sessions; s; s = s->next)
        cap += !s->dead;
    tenant_row_t *rows = cap ? calloc(cap, sizeof(*rows)) : NULL;
    if (cap && !rows) {
        b->failed = true;
        return;
    }
    for (colld_session_t *s = d->sessions; s && n < cap; s = s->next)
        if (!s->dead)
            rows[n++] = (tenant_row_t){ .uid = s->uid, .sessions = 1, .comms = s->ncomms,
                                        .registered_bytes = s->registered_bytes };
    if (n)
        qsort(rows, n, sizeof(*rows), tenant_by_uid);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && rows[m - 1].uid == rows[i].uid) {
            rows[m - 1].sessions += rows[i].sessions;
            rows[m - 1].comms += rows[i].comms;
            rows[m - 1].registered_bytes += rows[i].registered_bytes;
        } else
            rows[m++] = rows[i];
    }
    if (m)
        qsort(rows, m, sizeof(*rows), tenant_by_weight);
    tenant_row_t other = { 0 };
    for (size_t i = METRICS_TOP_TENANTS; i < m; i++) {
        other.sessions += rows[i].sessions;
        other.comms += rows[i].comms;
        other.registered_bytes += rows[i].registered_bytes;
    }
    size_t top = m < METRICS_TOP_TENANTS ? m : METRICS_TOP_TENANTS;
    static const struct {
        const char *name, *help;
        size_t offset;
    } families[] = {
        { "colld_tenant_sessions", "Client sessions of a tenant (uid); the tenants beyond the top ones are \"other\".",
          offsetof(tenant_row_t, sessions) },
        { "colld_tenant_comms", "Communicator memberships of a tenant's sessions.", offsetof(tenant_row_t, comms) },
        { "colld_tenant_registered_bytes", "Memory a tenant has registered with the daemon.",
          offsetof(tenant_row_t, registered_bytes) },
    };
    for (size_t f = 0; f < COLLD_ARRAY_SIZE(families); f++) {
        tb_family(b, families[f].name, "gauge", families[f].help);
        for (size_t i = 0; i < top; i++)
            tb_printf(b, "%s{tenant=\"%u\"} %llu\n", families[f].name, (unsigned)rows[i].uid,
                      (unsigned long long)*(const uint64_t *)((const char *)&rows[i] + families[f].offset));
        if (m > top)
            tb_printf(b, "%s{tenant=\"other\"} %llu\n", families[f].name,
                      (unsigned long long)*(const uint64_t *)((const char *)&other + families[f].offset));
    }
    free(rows);
}

/* Stragglers: communicators whose slowest rank lags the first rank by at least
 * COLLD_STRAGGLER_MIN_NS on average, and the largest such mean lag (lock held). */
static void render_stragglers(colld_daemon_t *d, textbuf_t *b)
{
    uint64_t n = 0, worst_ns = 0;
    for (colld_dcomm_t *c = d->comms; c; c = c->next) {
        int r = colld_recorder_slowest(c);
        if (r < 0)
            continue;
        n++;
        uint64_t mean = c->ranks[r].late_sum_ns / c->ranks[r].late_samples;
        if (mean > worst_ns)
            worst_ns = mean;
    }
    tb_family(b, "colld_stragglers", "gauge",
              "Communicators with a straggler: a rank that posts its collectives at least 0.1 ms behind the first "
              "rank on average (collctl status names it).");
    tb_printf(b, "colld_stragglers %llu\n", (unsigned long long)n);
    tb_family(b, "colld_straggler_lag_max_seconds", "gauge",
              "The largest mean lateness of a straggler behind the first rank of its communicator.");
    tb_printf(b, "colld_straggler_lag_max_seconds %llu.%09llu\n", (unsigned long long)(worst_ns / 1000000000ull),
              (unsigned long long)(worst_ns % 1000000000ull));
}

/* Write "<name>{kind=..,dtype=..,status=..} v" for every nonzero cell of a kind x dtype x status
 * table. */
static void render_op_table(textbuf_t *b, const char *name, uint64_t (*t)[COLLD_COUNT_NDTYPE][COLLD_COUNT_NSTATUS])
{
    for (unsigned k = 0; k < COLLD_COUNT_NKIND; k++)
        for (unsigned y = 0; y < COLLD_COUNT_NDTYPE; y++)
            for (unsigned s = 0; s < COLLD_COUNT_NSTATUS; s++)
                if (t[k][y][s])
                    tb_printf(b, "%s{kind=\"%s\",dtype=\"%s\",status=\"%s\"} %llu\n", name,
                              colld_count_kind_label(k), colld_count_dtype_label(y), colld_count_status_label(s),
                              (unsigned long long)t[k][y][s]);
}

/* Connections and what the daemon refused to protect itself: the control socket's connections,
 * the streaming queues, connections refused for lack of descriptors, scrapers evicted (loop
 * thread, daemon->lock held). */
static void render_connections(colld_daemon_t *d, textbuf_t *b)
{
    unsigned admitted, refused_held;
    uint64_t refused_total, queued = 0, full = 0;
    colld_ctl_stats(d, &admitted, &refused_held, &refused_total);
    if (d->rpc)
        colld_rpc_server_queue_stats(d->rpc, &queued, &full);
    tb_family(b, "colld_rpc_connections", "gauge", "Connections to the control socket served now.");
    tb_printf(b, "colld_rpc_connections %u\n", admitted);
    tb_family(b, "colld_rpc_connections_refused_total", "counter",
              "Connections to the control socket refused at a limit (max-rpc-conns, max-rpc-conns-per-tenant).");
    tb_printf(b, "colld_rpc_connections_refused_total %llu\n", (unsigned long long)refused_total);
    tb_family(b, "colld_rpc_stream_queued_bytes", "gauge",
              "Bytes of streamed messages (events) waiting for clients to take them.");
    tb_printf(b, "colld_rpc_stream_queued_bytes %llu\n", (unsigned long long)queued);
    tb_family(b, "colld_rpc_stream_sends_refused_total", "counter",
              "Streamed messages held back because a client's queue was full (the client reads too slowly).");
    tb_printf(b, "colld_rpc_stream_sends_refused_total %llu\n", (unsigned long long)full);
    tb_family(b, "colld_connections_shed_total", "counter",
              "Connections refused because the daemon was out of file descriptors, by socket.");
    tb_printf(b, "colld_connections_shed_total{socket=\"session\"} %llu\n", (unsigned long long)d->sessions_l.shed);
    tb_printf(b, "colld_connections_shed_total{socket=\"control\"} %llu\n",
              (unsigned long long)colld_ctl_shed(d));
    colld_http_stats_t hs = colld_http_stats(d->metrics->http);
    tb_family(b, "colld_metrics_connections_evicted_total", "counter",
              "Metrics connections closed to make room for a new one (still without a request, or not taking "
              "their answer).");
    tb_printf(b, "colld_metrics_connections_evicted_total %llu\n", (unsigned long long)(d->metrics->evicted + hs.evicted));
    tb_family(b, "colld_metrics_connections_refused_total", "counter",
              "Metrics connections closed at once: every place of their address (8) or of all (64) was being "
              "answered.");
    tb_printf(b, "colld_metrics_connections_refused_total %llu\n", (unsigned long long)(d->metrics->refused + hs.refused));
}

/* GPU health from NVML (server/core/health.h; lock held): one series per GPU, labelled by its
 * index and name (bounded: the GPUs of this node); a counter NVML does not support is left out. */
static void gpu_line(textbuf_t *b, const char *name, const colld_gpu_health_t *g, int64_t v)
{
    if (v < 0)
        return;
    tb_printf(b, "%s{gpu=\"%d\",name=\"", name, g->index);
    tb_label(b, g->name);
    tb_printf(b, "\"} %lld\n", (long long)v);
}

static void render_gpus(textbuf_t *b, const colld_daemon_t *d)
{
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } fam[] = {
        { "colld_gpu_health_read", "gauge", "1 while the GPU's health is read from NVML, 0 when not (collctl status says why).", 0 },
        { "colld_gpu_ecc_uncorrected_volatile", "gauge",
          "Volatile uncorrected ECC errors of the GPU (NVML, since the driver loaded).",
          offsetof(colld_gpu_health_t, ecc_uncorrected) },
        { "colld_gpu_retired_pages_pending", "gauge", "1 while retired pages wait for a GPU reset.",
          offsetof(colld_gpu_health_t, retired_pending) },
        { "colld_gpu_row_remap_pending", "gauge", "1 while a row remap waits for a GPU reset.",
          offsetof(colld_gpu_health_t, remap_pending) },
        { "colld_gpu_row_remap_failure", "gauge", "1 after a row remap failed (the GPU is drained).",
          offsetof(colld_gpu_health_t, remap_failure) },
        { "colld_gpu_pcie_replays", "gauge", "The GPU's PCIe replay counter.", offsetof(colld_gpu_health_t, pcie_replay) },
        { "colld_gpu_nvlink_errors", "gauge", "NVLink CRC, replay and recovery error counts over the GPU's active links.",
          offsetof(colld_gpu_health_t, nvlink_errors) },
        { "colld_gpu_throttle_reasons", "gauge", "NVML's clock event (throttle) reasons mask of the GPU.",
          offsetof(colld_gpu_health_t, throttle) },
    };
    for (size_t f = 0; f < COLLD_ARRAY_SIZE(fam); f++) {
        tb_family(b, fam[f].name, fam[f].type, fam[f].help);
        for (int i = 0; i < d->ngpu_health && i < COLLD_GPU_HEALTH_MAX; i++) {
            const colld_gpu_health_t *g = &d->gpu_health[i];
            int64_t v = f == 0 ? (int64_t)g->nvml : (g->nvml ? *(const int64_t *)((const char *)g + fam[f].off) : -1);
            gpu_line(b, fam[f].name, g, v);
        }
    }
    tb_family(b, "colld_gpu_xid_events_total", "counter", "Critical Xid events of the GPU seen since colld started.");
    for (int i = 0; i < d->ngpu_health && i < COLLD_GPU_HEALTH_MAX; i++)
        gpu_line(b, "colld_gpu_xid_events_total", &d->gpu_health[i], (int64_t)d->gpu_health[i].xid_count);
    tb_family(b, "colld_gpu_throttled", "gauge", "1 while the GPU's clocks are throttled, by reason (thermal, power).");
    for (int i = 0; i < d->ngpu_health && i < COLLD_GPU_HEALTH_MAX; i++) {
        const colld_gpu_health_t *g = &d->gpu_health[i];
        if (!g->nvml || g->throttle < 0)
            continue;
        for (int k = 0; k < 2; k++) {
            tb_printf(b, "colld_gpu_throttled{gpu=\"%d\",name=\"", g->index);
            tb_label(b, g->name);
            tb_printf(b, "\",reason=\"%s\"} %d\n", k ? "power" : "thermal", k ? g->power : g->thermal);
        }
    }
    tb_family(b, "colld_gpu_drained", "gauge",
              "1 once a fatal health event (uncorrected ECC errors rising, a critical Xid, a failed row remap) drained "
              "the GPU: colld refuses new work on it until it restarts.");
    for (int i = 0; i < d->ngpu_health && i < COLLD_GPU_HEALTH_MAX; i++)
        gpu_line(b, "colld_gpu_drained", &d->gpu_health[i], d->gpu_health[i].drained);
}

/* Render every metric (daemon->lock held by the caller). */
static void render(colld_daemon_t *d, const process_info_t *p, const peer_snapshot_t *ps, textbuf_t *b)
{
    colld_counters_t *m = d->counters;
    state_gauges_t g;
    walk_state(d, &g);

    tb_family(b, "colld_build_info", "gauge", "Version of this colld daemon (always 1).");
    tb_printf(b, "colld_build_info{version=\"%d.%d\"} 1\n", COLLD_VERSION_MAJOR, COLLD_VERSION_MINOR);
    uint64_t up = colld_now_ns() - m->created_ns;
    tb_family(b, "colld_uptime_seconds", "gauge", "Seconds since the daemon started.");
    tb_printf(b, "colld_uptime_seconds %llu.%03llu\n", (unsigned long long)(up / 1000000000ull),
              (unsigned long long)(up % 1000000000ull / 1000000ull));

    tb_family(b, "colld_sessions", "gauge", "Client sessions (processes) connected now.");
    tb_printf(b, "colld_sessions %llu\n", (unsigned long long)g.sessions);
    tb_family(b, "colld_sessions_opened_total", "counter", "Client sessions opened since the daemon started.");
    tb_printf(b, "colld_sessions_opened_total %llu\n", (unsigned long long)m->sessions_opened);

    tb_family(b, "colld_comms", "gauge", "Communicators now, by state.");
    for (unsigned s = 0; s < g.nstates; s++)
        tb_printf(b, "colld_comms{state=\"%s\"} %llu\n", colld_comm_state_name((colld_comm_state_t)s),
                  (unsigned long long)g.comms_by_state[s]);
    tb_family(b, "colld_comms_formed_total", "counter",
              "Communicators formed (every rank joined) since the daemon started.");
    tb_printf(b, "colld_comms_formed_total %llu\n", (unsigned long long)m->comms_formed);
    tb_family(b, "colld_comm_errors_total", "counter",
              "Communicators broken since the daemon started, by the status of their first fault.");
    for (unsigned s = 0; s < COLLD_COUNT_NSTATUS; s++)
        if (colld_count_status_is_error(s) || m->comm_errors[s])
            tb_printf(b, "colld_comm_errors_total{status=\"%s\"} %llu\n", colld_count_status_label(s),
                      (unsigned long long)m->comm_errors[s]);

    tb_family(b, "colld_operations_total", "counter",
              "Rank operations finished (executed or failed), by collective kind, data type and status.");
    render_op_table(b, "colld_operations_total", m->ops);
    tb_family(b, "colld_operation_bytes_total", "counter",
              "Payload bytes of finished rank operations (count x dtype size per rank), by kind, dtype and "
              "status.");
    render_op_table(b, "colld_operation_bytes_total", m->bytes);

    tb_family(b, "colld_collective_latency_seconds", "histogram",
              "Executed collectives: time from the first rank's arrival to completion, by kind.");
    for (unsigned k = 0; k < COLLD_COUNT_NKIND; k++) {
        const colld_latency_hist_t *h = &m->latency[k];
        const char *kind = colld_count_kind_label(k);
        if (!h->count)
            continue;
        uint64_t cum = 0;
        for (unsigned i = 0; i < COLLD_COUNT_NBUCKET; i++) {
            cum += h->bucket[i];
            tb_printf(b, "colld_collective_latency_seconds_bucket{kind=\"%s\",le=\"%s\"} %llu\n", kind,
                      colld_count_bucket_le(i), (unsigned long long)cum);
        }
        tb_printf(b, "colld_collective_latency_seconds_bucket{kind=\"%s\",le=\"+Inf\"} %llu\n", kind,
                  (unsigned long long)h->count);
        tb_printf(b, "colld_collective_latency_seconds_sum{kind=\"%s\"} %llu.%09llu\n", kind,
                  (unsigned long long)(h->sum_ns / 1000000000ull), (unsigned long long)(h->sum_ns % 1000000000ull));
        tb_printf(b, "colld_collective_latency_seconds_count{kind=\"%s\"} %llu\n", kind,
                  (unsigned long long)h->count);
    }

    tb_family(b, "colld_ops_queued", "gauge",
              "Operations (collectives, sends, receives) posted by ranks and waiting in the daemon for their peers.");
    tb_printf(b, "colld_ops_queued %llu\n", (unsigned long long)g.ops_queued);
    tb_family(b, "colld_descriptors_in_flight", "gauge",
              "Work descriptors accepted from the sessions' rings whose completion is not posted yet.");
    tb_printf(b, "colld_descriptors_in_flight %llu\n", (unsigned long long)g.in_flight);
    tb_family(b, "colld_registered_bytes", "gauge", "Bytes of client memory registered with the daemon now.");
    tb_printf(b, "colld_registered_bytes %llu\n", (unsigned long long)g.registered_bytes);
    tb_family(b, "colld_quota_refusals_total", "counter",
              "Requests refused at a per-tenant limit (collctl policy) or a daemon-wide backstop (registrations, "
              "memory for tenants), by limit.");
    for (int i = 0; i < COLLD_LIMIT_COUNT; i++)
        tb_printf(b, "colld_quota_refusals_total{limit=\"%s\"} %llu\n", colld_limit_name((colld_limit_t)i),
                  (unsigned long long)colld_tenant_refusals(d, (colld_limit_t)i));
    tb_printf(b, "colld_quota_refusals_total{limit=\"max-registrations\"} %llu\n",
              (unsigned long long)colld_regs_backstop_refusals(d));
    tb_printf(b, "colld_quota_refusals_total{limit=\"max-daemon-bytes\"} %llu\n",
              (unsigned long long)colld_mem_backstop_refusals(d));
    tb_family(b, "colld_daemon_tenant_bytes", "gauge",
              "Memory the daemon holds for its tenants (session rings, GPU flag areas, fast areas, multi-node "
              "collective buffers, page tables of registrations), counted against max-daemon-bytes.");
    tb_printf(b, "colld_daemon_tenant_bytes %llu\n", (unsigned long long)colld_mem_held(d));
    tb_family(b, "colld_daemon_tenant_bytes_limit", "gauge",
              "max-daemon-bytes: what the daemon may hold for all tenants together (derived from its memory limit "
              "unless set).");
    tb_printf(b, "colld_daemon_tenant_bytes_limit %llu\n", (unsigned long long)colld_mem_backstop(d, NULL));
    tb_family(b, "colld_deadlocks_detected_total", "counter",
              "Cycles of ranks waiting for each other across communicators that lasted --deadlock-ms (each is logged "
              "and sent as a deadlock event; with --deadlock-fail its communicators failed).");
    tb_printf(b, "colld_deadlocks_detected_total %llu\n", (unsigned long long)d->deadlocks);
    tb_family(b, "colld_draining", "gauge",
              "1 while the daemon drains before stopping (SIGTERM with --drain-timeout-ms): new communicators are "
              "refused.");
    tb_printf(b, "colld_draining %d\n", d->draining ? 1 : 0);

    render_stragglers(d, b);
    render_tenants(d, b);
    render_peers(b, ps);
    render_gpus(b, d);

    render_connections(d, b);

    if (p->cpu_seconds >= 0) {
        tb_family(b, "process_cpu_seconds_total", "counter", "User and system CPU time of the daemon in seconds.");
        tb_printf(b, "process_cpu_seconds_total %.6f\n", p->cpu_seconds);
    }
    if (p->rss_bytes >= 0) {
        tb_family(b, "process_resident_memory_bytes", "gauge", "Resident memory of the daemon in bytes.");
        tb_printf(b, "process_resident_memory_bytes %lld\n", p->rss_bytes);
    }
    if (p->open_fds >= 0) {
        tb_family(b, "process_open_fds", "gauge", "Open file descriptors of the daemon.");
        tb_printf(b, "process_open_fds %lld\n", p->open_fds);
    }
    if (p->max_fds >= 0) {
        tb_family(b, "process_max_fds", "gauge", "Limit on the daemon's open file descriptors.");
        tb_printf(b, "process_max_fds %lld\n", p->max_fds);
    }
    tb_family(b, "process_start_time_seconds", "gauge", "Start time of the daemon since the Unix epoch in seconds.");
    tb_printf(b, "process_start_time_seconds %lld.%03lld\n", (long long)(d->started_ms / 1000),
              (long long)(d->started_ms % 1000));
}

/* ============================================================================================
 * Answering requests
 * ========================================================================================== */

/* /readyz: 200 "ready" when everything a client needs is up, else 503 naming what is not. Every
 * condition is one the start-up establishes before the endpoint opens, or the shutdown drops. */
static void respond_ready(colld_daemon_t *d, colld_http_conn_t *c, bool head)
{
    char text[384];
    size_t n = 0;
    pthread_mutex_lock(&d->lock);
    bool draining = d->draining;
    pthread_mutex_unlock(&d->lock);
    const struct {
        bool bad;
        const char *what;
    } checks[] = {
        { d->stopping, "stopping" },
        { draining, "draining (new communicators are refused)" },
        { !d->sessions_l.open, "the session socket is not listening" },
        { !d->rpc, "the control plane is not serving" },
        { !d->engine_running, "the engine is not running" },
        { d->cfg.listen && *d->cfg.listen && !colld_cluster_running(d), "the peer listener (--listen) is not up" },
    };
    for (size_t i = 0; i < COLLD_ARRAY_SIZE(checks); i++)
        if (checks[i].bad)
            n += (size_t)snprintf(text + n, sizeof(text) - n, "%s%s", n ? "; " : "not ready: ", checks[i].what);
    if (!n)
        snprintf(text, sizeof(text), "ready");
    size_t len = strlen(text);
    char *body = malloc(len + 2);
    if (body) {
        memcpy(body, text, len);
        body[len++] = '\n';
    }
    colld_http_respond(c, n ? 503 : 200, body, body ? len : 0, head, TEXT_CONTENT_TYPE);
}

/* A token character of RFC 9110 (method names). */
static bool is_tchar(char ch)
{
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* Parse a complete request (req holds it through the blank line at `end`): only the request line
 * "METHOD SP request-target SP HTTP/1.x" is read; headers are skipped. Returns 200 for GET or
 * HEAD (*head) of /metrics, /healthz or /readyz (*route), else the error status to answer. Pure:
 * the fuzzers call it (fuzz_metrics_http). */
int colld_metrics_http_request(const char *req, size_t end, colld_http_route_t *route, bool *head)
{
    const char *p = req, *lim = req + end;
    *head = false;
    *route = COLLD_HTTP_METRICS;
    while (p < lim && (*p == '\r' || *p == '\n')) /* RFC 9112: ignore empty lines before it */
        p++;
    const char *eol = memchr(p, '\n', (size_t)(lim - p));
    if (!eol)
        return 400;
    size_t len = (size_t)(eol - p);
    if (len && p[len - 1] == '\r')
        len--;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)p[i] < 0x20 || (unsigned char)p[i] > 0x7e)
            return 400;
    const char *sp1 = memchr(p, ' ', len);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', len - (size_t)(sp1 + 1 - p)) : NULL;
    if (!sp1 || !sp2 || sp1 == p || sp2 == sp1 + 1 || memchr(sp2 + 1, ' ', len - (size_t)(sp2 + 1 - p)))
        return 400;
    size_t mlen = (size_t)(sp1 - p), tlen = (size_t)(sp2 - sp1 - 1), vlen = len - (size_t)(sp2 + 1 - p);
    for (size_t i = 0; i < mlen; i++)
        if (!is_tchar(p[i]))
            return 400;
    const char *target = sp1 + 1, *version = sp2 + 1;
    if (vlen != 8 || memcmp(version, "HTTP/", 5) != 0 || version[6] != '.' || version[5] < '0' ||
        version[5] > '9' || version[7] < '0' || version[7] > '9')
        return 400;
    if (version[5] != '1')
        return 505;
    if (target[0] != '/')
        return 400;
    const char *q = memchr(target, '?', tlen);
    size_t plen = q ? (size_t)(q - target) : tlen;
    if (plen == 8 && memcmp(target, "/metrics", 8) == 0)
        *route = COLLD_HTTP_METRICS;
    else if (plen == 8 && memcmp(target, "/healthz", 8) == 0)
        *route = COLLD_HTTP_HEALTHZ;
    else if (plen == 7 && memcmp(target, "/readyz", 7) == 0)
        *route = COLLD_HTTP_READYZ;
    else
        return 404;
    *head = mlen == 4 && memcmp(p, "HEAD", 4) == 0;
    if (!*head && !(mlen == 3 && memcmp(p, "GET", 3) == 0))
        return 405;
    return 200;
}

/* Answer a request on either listener; the health listener (health) serves no /metrics. */
static void answer(colld_daemon_t *d, colld_http_conn_t *c, const char *req, size_t end, bool health)
{
    bool head;
    colld_http_route_t route;
    int code = colld_metrics_http_request(req, end, &route, &head);
    if (code == 200 && health && route == COLLD_HTTP_METRICS)
        code = 404;
    if (code != 200) {
        colld_http_respond(c, code, NULL, 0, false, NULL);
        return;
    }
    if (route == COLLD_HTTP_HEALTHZ) { /* the process answers on its loop: that is all it claims */
        char *ok = strdup("ok\n");
        colld_http_respond(c, 200, ok, ok ? 3 : 0, head, TEXT_CONTENT_TYPE);
        return;
    }
    if (route == COLLD_HTTP_READYZ) {
        respond_ready(d, c, head);
        return;
    }

    /* Render under the lock, send outside it. */
    process_info_t pi;
    peer_snapshot_t ps;
    textbuf_t b = { 0 };
    read_process_info(&pi);
    read_peers(d, &ps);
    pthread_mutex_lock(&d->lock);
    for (colld_dcomm_t *x = d->comms; x; x = x->next)
        colld_fast_harvest(d, x); /* what the ranks ran on fast areas */
    render(d, &pi, &ps, &b);
    pthread_mutex_unlock(&d->lock);
    free(ps.peers);
    if (b.failed) {
        LOG_WARN_RL(ADMIN, "metrics: out of memory rendering %zu bytes", b.cap);
        free(b.data);
        colld_http_respond(c, 500, NULL, 0, false, NULL);
        return;
    }
    colld_http_respond(c, 200, b.data, b.len, head, METRICS_CONTENT_TYPE);
}

static void on_metrics_request(void *arg, colld_http_conn_t *c, const char *req, size_t end)
{
    answer(arg, c, req, end, false);
}

static void on_health_request(void *arg, colld_http_conn_t *c, const char *req, size_t end)
{
    answer(arg, c, req, end, true);
}

/* ============================================================================================
 * Start and stop
 * ========================================================================================== */

/* Parse "HOST:PORT" ("127.0.0.1:9464", "[::1]:9464", "localhost:0") into a socket address.
 * Port 0 picks a free port. Returns 0, or -1 with the reason in err. */
static int parse_addr(const char *text, struct sockaddr_storage *out, char *err, size_t err_len)
{
    char host[256];
    const char *port;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':' || (size_t)(close - text - 1) >= sizeof(host)) {
            colld_set_err(err, err_len, "'%s' is not HOST:PORT (IPv6 as [::1]:9464)", text);
            return -1;
        }
        memcpy(host, text + 1, (size_t)(close - text - 1));
        host[close - text - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon || (size_t)(colon - text) >= sizeof(host) || memchr(text, ':', (size_t)(colon - text))) {
            colld_set_err(err, err_len, "'%s' is not HOST:PORT (e.g. 127.0.0.1:9464; IPv6 as [::1]:9464)", text);
            return -1;
        }
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
        port = colon + 1;
    }
    if (!host[0]) {
        colld_set_err(err, err_len, "'%s' has no host (use 127.0.0.1:PORT, or 0.0.0.0:PORT for every interface)",
                      text);
        return -1;
    }
    char *end = NULL;
    errno = 0;
    unsigned long pn = strtoul(port, &end, 10);
    if (!*port || *end || errno || pn > 65535 || port[0] < '0' || port[0] > '9') {
        colld_set_err(err, err_len, "'%s': port must be a number from 0 to 65535 (0: any free port)", text);
        return -1;
    }
    /* Start-up only, before the loop runs: a blocking lookup of a name like "localhost" is fine. */
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0 || !ai) {
        colld_set_err(err, err_len, "'%s': cannot resolve host '%s': %s", text, host, gai_strerror(rc));
        return -1;
    }
    memset(out, 0, sizeof(*out));
    memcpy(out, ai->ai_addr, ai->ai_addrlen < sizeof(*out) ? ai->ai_addrlen : sizeof(*out));
    freeaddrinfo(ai);
    return 0;
}

/* Start one listener on `addr` (option `opt`), its URL ending in `path` into url. Returns 0, or
 * -1 with the reason in m->error. */
static int start_one(colld_daemon_t *d, const char *opt, const char *addr, const colld_http_config_t *cfg,
                     colld_http_server_t **out, const char *path, char *url, size_t url_len)
{
    colld_metrics_t *m = d->metrics;
    struct sockaddr_storage sa, bound;
    char why[256];
    if (parse_addr(addr, &sa, why, sizeof(why)) < 0) {
        colld_set_err(m->error, sizeof(m->error), "--%s %s", opt, why);
        return -1;
    }
    if (colld_http_start(&d->loop, (const struct sockaddr *)&sa, cfg, out, why, sizeof(why)) < 0 ||
        colld_http_bound(*out, &bound) < 0) {
        colld_set_err(m->error, sizeof(m->error), "--%s '%s': %s", opt, addr,
                      *out ? "cannot read the bound address" : why);
        return -1;
    }
    char ip[64] = "?";
    if (bound.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&bound;
        uv_ip6_name(s6, ip, sizeof(ip));
        snprintf(url, url_len, "http://[%s]:%d%s", ip, ntohs(s6->sin6_port), path);
    } else {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)&bound;
        uv_ip4_name(s4, ip, sizeof(ip));
        snprintf(url, url_len, "http://%s:%d%s", ip, ntohs(s4->sin_port), path);
    }
    LOG_INFO(ADMIN, "%s on %s", opt, url);
    return 0;
}

/* Start the endpoints that are configured: --metrics (metrics, health and readiness) and
 * --health (health and readiness only, on a listener no metrics client can fill). */
int colld_metrics_start(colld_daemon_t *d)
{
    colld_metrics_t *m = d->metrics;
    const char *maddr = d->cfg.metrics_addr, *haddr = d->cfg.health_addr;
    bool want_metrics = maddr && *maddr, want_health = haddr && *haddr;
    if (!want_metrics && !want_health)
        return 0;
    if (!m) {
        LOG_ERROR(ADMIN, "metrics: counters not created");
        return -1;
    }
    const colld_http_config_t mcfg = {
        .name = "metrics",
        .max_conns = HTTP_MAX_CONNECTIONS,
        .max_per_source = HTTP_MAX_PER_SOURCE,
        .request_ms = HTTP_REQUEST_DEADLINE_MS,
        .response_ms = HTTP_RESPONSE_DEADLINE_MS,
        .stalled_ms = HTTP_STALLED_MS,
        .handler = on_metrics_request,
        .arg = d,
    };
    const colld_http_config_t hcfg = {
        .name = "health",
        .max_conns = HEALTH_MAX_CONNECTIONS,
        .max_per_source = HEALTH_MAX_PER_SOURCE,
        .request_ms = HEALTH_DEADLINE_MS,
        .response_ms = HEALTH_DEADLINE_MS,
        .stalled_ms = 0,
        .evict_any = true,
        .handler = on_health_request,
        .arg = d,
    };
    if ((want_metrics && start_one(d, "metrics", maddr, &mcfg, &m->http, "/metrics", m->url, sizeof(m->url)) < 0) ||
        (want_health &&
         start_one(d, "health", haddr, &hcfg, &m->health, "/healthz", m->health_url, sizeof(m->health_url)) < 0)) {
        LOG_ERROR(ADMIN, "%s", m->error);
        colld_metrics_stop(d);
        return -1;
    }
    return 0;
}

/* Close the listeners and every connection. Their memory goes when the loop runs their close
 * callbacks. Idempotent. */
void colld_metrics_stop(colld_daemon_t *d)
{
    colld_metrics_t *m = d->metrics;
    if (!m)
        return;
    m->evicted += colld_http_stats(m->http).evicted;
    m->refused += colld_http_stats(m->http).refused;
    colld_http_stop(m->http);
    colld_http_stop(m->health);
    m->http = m->health = NULL;
    m->url[0] = m->health_url[0] = '\0';
}

/* ============================================================================================
 * The module's hooks: communicators formed and broken, counted
 * ========================================================================================== */

static void metrics_formed(colld_daemon_t *d, colld_dcomm_t *c)
{
    (void)c;
    colld_count_comm_formed(d);
}

/* Counted once per communicator, by the status of its first fault (a rank closing is not one). */
static void metrics_faulted(colld_daemon_t *d, colld_dcomm_t *c, colld_fault_t how, int rank, const char *detail)
{
    (void)rank, (void)detail;
    if (how != COLLD_FAULT_CLOSED)
        colld_count_comm_error(d, c->error);
}

const colld_comm_hooks_t colld_metrics_hooks = {
    .name = "metrics",
    .formed = metrics_formed,
    .faulted = metrics_faulted,
};
