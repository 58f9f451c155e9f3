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
 * that ends the headers, anything else is answered with 400/404/405/431/505. All HTTP state
 * belongs to the loop thread.
 *
 * Held connections must not starve scrapes (slowloris): a connection has HTTP_REQUEST_DEADLINE_MS
 * to deliver its whole request (a scraper sends it at once) and then HTTP_RESPONSE_DEADLINE_MS to
 * take the answer; at most HTTP_MAX_CONNECTIONS are open at once, and a new connection beyond that
 * closes the oldest one still waiting for its request, from the address that holds the most such
 * connections. So a client holding connections open loses its own, a scraper from elsewhere loses
 * none, and even one from the same address gets in (the held connections are older).
 */
#include "server/observability/metrics.h"

#include "server/control/control.h"
#include "server/core/counters.h"
#include "server/net/net.h"
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

#define HTTP_REQUEST_MAX COLLD_METRICS_HTTP_REQUEST_MAX
#define HTTP_REQUEST_DEADLINE_MS 2000  /* the whole request must arrive this soon after the accept */
#define HTTP_RESPONSE_DEADLINE_MS 5000 /* the answer must be taken this soon after the request */
#define HTTP_MAX_CONNECTIONS 64   /* open at once; a new one closes an older one still reading */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define TEXT_CONTENT_TYPE "text/plain; charset=utf-8"
#define METRICS_TOP_TENANTS 10    /* tenants with their own label; the others are "other" */
#define METRICS_MAX_PEERS 1024    /* peer daemons listed one by one */

/* ============================================================================================
 * The object
 * ========================================================================================== */

typedef struct http_conn http_conn_t;
static int accept_one(colld_metrics_t *m);

struct colld_metrics {
    /* The HTTP endpoint: loop thread only. */
    colld_daemon_t *daemon;
    uv_tcp_t server;
    bool server_open;      /* server initialised and not closed yet */
    char url[96];          /* "http://127.0.0.1:9464/metrics", "" when off */
    char error[320];       /* why the last colld_metrics_start failed */
    http_conn_t *conns;    /* every connection not yet freed */
    unsigned nconns;       /* of them, those that count against the cap */
    uint64_t accepted;     /* connections accepted so far (their order) */
    bool accept_pending;   /* a connection could not be accepted for lack of memory */
    uint64_t evicted;      /* connections closed to make room for a new one */
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
        for (int r = 0; r < c->nranks && st != COLLD_COMM_JOINING; r++) /* forming: no ops, no rank array */
            for (colld_op_t *op = c->ranks[r].head; op; op = op->next)
                g->ops_queued++;
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
    tb_family(b, "colld_metrics_connections_evicted_total", "counter",
              "Metrics connections closed without a request to make room for a new one.");
    tb_printf(b, "colld_metrics_connections_evicted_total %llu\n", (unsigned long long)d->metrics->evicted);
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

    tb_family(b, "colld_ops_queued", "gauge", "Operations posted by ranks and waiting in the daemon for their peers.");
    tb_printf(b, "colld_ops_queued %llu\n", (unsigned long long)g.ops_queued);
    tb_family(b, "colld_descriptors_in_flight", "gauge",
              "Work descriptors accepted from the sessions' rings whose completion is not posted yet.");
    tb_printf(b, "colld_descriptors_in_flight %llu\n", (unsigned long long)g.in_flight);
    tb_family(b, "colld_registered_bytes", "gauge", "Bytes of client memory registered with the daemon now.");
    tb_printf(b, "colld_registered_bytes %llu\n", (unsigned long long)g.registered_bytes);
    tb_family(b, "colld_quota_refusals_total", "counter",
              "Requests refused at a per-tenant limit (collctl policy) or the daemon-wide registration backstop, "
              "by limit.");
    for (int i = 0; i < COLLD_LIMIT_COUNT; i++)
        tb_printf(b, "colld_quota_refusals_total{limit=\"%s\"} %llu\n", colld_limit_name((colld_limit_t)i),
                  (unsigned long long)colld_tenant_refusals(d, (colld_limit_t)i));
    tb_printf(b, "colld_quota_refusals_total{limit=\"max-registrations\"} %llu\n",
              (unsigned long long)colld_regs_backstop_refusals(d));
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
 * HTTP connections
 * ========================================================================================== */

/* A connection goes READING -> WRITING -> DRAINING -> CLOSING. DRAINING: the response is sent and
 * our side shut down; what the client still sends is read and dropped until it closes, so an
 * unread request tail cannot turn our close into a reset that destroys the response. */
typedef enum {
    CONN_READING,
    CONN_WRITING,
    CONN_DRAINING,
    CONN_CLOSING,
} conn_phase_t;

struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    colld_metrics_t *m;
    conn_phase_t phase;
    bool counted;         /* counts against HTTP_MAX_CONNECTIONS */
    struct sockaddr_storage peer; /* its address (family 0: unknown) */
    uint64_t seq;         /* accept order */
    int open_handles;     /* handles not yet closed; freed at 0 */
    uv_write_t write_req;
    uv_shutdown_t shutdown_req;
    char head[512];       /* status line and headers of the response */
    char *body;           /* response body (heap), NULL if none */
    size_t body_len;
    size_t len;           /* request bytes read */
    char req[HTTP_REQUEST_MAX];
    http_conn_t *prev, *next;
};

static void conn_on_close(uv_handle_t *h)
{
    http_conn_t *c = h->data;
    if (--c->open_handles > 0)
        return;
    colld_metrics_t *m = c->m;
    if (c->prev)
        c->prev->next = c->next;
    else
        m->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c->body);
    free(c);
    if (m->accept_pending && m->server_open) {
        /* Memory may be back: take the connection libuv holds for us (accept_one tells). */
        m->accept_pending = false;
        if (accept_one(m) < 0)
            m->accept_pending = true;
    }
}

/* Close a connection (idempotent); it is freed once both handles are closed, and its place is
 * free at once. */
static void conn_close(http_conn_t *c)
{
    if (c->phase == CONN_CLOSING)
        return;
    if (c->counted)
        c->m->nconns--;
    c->counted = false;
    c->phase = CONN_CLOSING;
    uv_close((uv_handle_t *)&c->tcp, conn_on_close);
    uv_close((uv_handle_t *)&c->timer, conn_on_close);
}

static void conn_on_deadline(uv_timer_t *t)
{
    http_conn_t *c = t->data;
    LOG_DEBUG(ADMIN, "metrics: closing a connection: %s within %d ms",
              c->phase == CONN_READING ? "no complete request" : "response not taken",
              c->phase == CONN_READING ? HTTP_REQUEST_DEADLINE_MS : HTTP_RESPONSE_DEADLINE_MS);
    conn_close(c);
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    http_conn_t *c = h->data;
    (void)suggested;
    if (c->phase == CONN_DRAINING)
        *buf = uv_buf_init(c->req, sizeof(c->req)); /* discarded */
    else
        *buf = uv_buf_init(c->req + c->len, (unsigned)(sizeof(c->req) - c->len));
}

static void conn_on_drain_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    if (nread < 0) /* EOF or error: the client is done */
        conn_close(s->data);
}

static void conn_on_shutdown(uv_shutdown_t *req, int status)
{
    http_conn_t *c = req->data;
    if (c->phase != CONN_WRITING)
        return; /* closed meanwhile (UV_ECANCELED) */
    if (status < 0 || uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_drain_read) < 0) {
        conn_close(c);
        return;
    }
    c->phase = CONN_DRAINING;
}

static void conn_on_write(uv_write_t *req, int status)
{
    http_conn_t *c = req->data;
    if (c->phase != CONN_WRITING)
        return; /* closed meanwhile (UV_ECANCELED) */
    if (status < 0) {
        LOG_DEBUG(ADMIN, "metrics: cannot send a response: %s", uv_strerror(status));
        conn_close(c);
        return;
    }
    c->shutdown_req.data = c;
    if (uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, conn_on_shutdown) < 0)
        conn_close(c);
}

static const char *reason_phrase(int code)
{
    switch (code) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    }
    return "Error";
}

/* Send a response and close after it. body: heap memory the connection takes (may be NULL for
 * an error response, which then gets a one-line text body). head_only: HEAD, no body sent. A 200
 * is the metrics exposition unless `text` says it is plain text (/healthz, /readyz). */
static void conn_respond_as(http_conn_t *c, int code, char *body, size_t body_len, bool head_only, bool text)
{
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->phase = CONN_WRITING;
    uv_timer_start(&c->timer, conn_on_deadline, HTTP_RESPONSE_DEADLINE_MS, 0);
    if (!body) {
        char line[96];
        int n = snprintf(line, sizeof(line), "%d %s\n", code, reason_phrase(code));
        body = strdup(line);
        body_len = body ? (size_t)n : 0;
    }
    c->body = body;
    c->body_len = body_len;
    int n = snprintf(c->head, sizeof(c->head),
                     "HTTP/1.1 %d %s\r\n"
                     "Content-Type: %s\r\n"
                     "Content-Length: %zu\r\n"
                     "%s"
                     "Connection: close\r\n"
                     "\r\n",
                     code, reason_phrase(code), code == 200 && !text ? METRICS_CONTENT_TYPE : TEXT_CONTENT_TYPE,
                     body_len, code == 405 ? "Allow: GET, HEAD\r\n" : "");
    uv_buf_t bufs[2] = { uv_buf_init(c->head, (unsigned)n), uv_buf_init(body, (unsigned)body_len) };
    c->write_req.data = c;
    if (uv_write(&c->write_req, (uv_stream_t *)&c->tcp, bufs, head_only || !body_len ? 1 : 2, conn_on_write) < 0)
        conn_close(c);
}

static void conn_respond(http_conn_t *c, int code, char *body, size_t body_len, bool head_only)
{
    conn_respond_as(c, code, body, body_len, head_only, false);
}

/* /readyz: 200 "ready" when everything a client needs is up, else 503 naming what is not. Every
 * condition is one the start-up establishes before the endpoint opens, or the shutdown drops. */
static void conn_respond_ready(http_conn_t *c, bool head)
{
    colld_daemon_t *d = c->m->daemon;
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
    conn_respond_as(c, n ? 503 : 200, body, body ? len : 0, head, true);
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

/* Answer a complete request (c->req holds it through the blank line at `end`). */
static void conn_handle_request(http_conn_t *c, size_t end)
{
    bool head;
    colld_http_route_t route;
    int code = colld_metrics_http_request(c->req, end, &route, &head);
    if (code != 200) {
        conn_respond(c, code, NULL, 0, false);
        return;
    }
    if (route == COLLD_HTTP_HEALTHZ) { /* the process answers: that is all it claims */
        char *ok = strdup("ok\n");
        conn_respond_as(c, 200, ok, ok ? 3 : 0, head, true);
        return;
    }
    if (route == COLLD_HTTP_READYZ) {
        conn_respond_ready(c, head);
        return;
    }

    /* Render under the lock, send outside it. */
    colld_daemon_t *d = c->m->daemon;
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
        conn_respond(c, 500, NULL, 0, false);
        return;
    }
    conn_respond(c, 200, b.data, b.len, head);
}

/* Find the end of the request headers: the byte after "\r\n\r\n" (or a bare "\n\n"), 0 if not
 * there yet. */
size_t colld_metrics_http_header_end(const char *buf, size_t len)
{
    for (size_t i = 0; i + 1 < len; i++) {
        if (buf[i] != '\n')
            continue;
        if (buf[i + 1] == '\n')
            return i + 2;
        if (i + 2 < len && buf[i + 1] == '\r' && buf[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

static void conn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    http_conn_t *c = s->data;
    (void)buf;
    if (nread < 0) {
        if (nread != UV_EOF)
            LOG_DEBUG(ADMIN, "metrics: read: %s", uv_strerror((int)nread));
        conn_close(c);
        return;
    }
    if (c->phase != CONN_READING || nread == 0)
        return;
    size_t from = c->len > 3 ? c->len - 3 : 0; /* a terminator may straddle two reads */
    c->len += (size_t)nread;
    size_t end = colld_metrics_http_header_end(c->req + from, c->len - from);
    if (end) {
        conn_handle_request(c, from + end);
        return;
    }
    if (c->len == sizeof(c->req))
        conn_respond(c, 431, NULL, 0, false);
}

/* Whether two addresses are the same host (the port is not compared). */
static bool same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family || !a->ss_family)
        return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

/* The connection to close for a new one when all places are taken: of those still waiting for
 * their request, the oldest one of the address that holds the most of them. NULL when every
 * connection is being answered. */
static http_conn_t *eviction_victim(colld_metrics_t *m)
{
    http_conn_t *victim = NULL;
    unsigned victim_count = 0;
    for (http_conn_t *c = m->conns; c; c = c->next) {
        if (!c->counted || c->phase != CONN_READING)
            continue;
        unsigned same = 0;
        for (http_conn_t *o = m->conns; o; o = o->next)
            same += o->counted && o->phase == CONN_READING && (o == c || same_host(&o->peer, &c->peer));
        if (!victim || same > victim_count || (same == victim_count && c->seq < victim->seq)) {
            victim = c;
            victim_count = same;
        }
    }
    return victim;
}

/* Accept one connection from the listener; returns -1 when there is no memory for it (the
 * connection then stays in libuv's hands until the next try). */
static int accept_one(colld_metrics_t *m)
{
    http_conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return -1;
    c->m = m;
    c->tcp.data = c;
    c->timer.data = c;
    uv_tcp_init(&m->daemon->loop, &c->tcp);
    uv_timer_init(&m->daemon->loop, &c->timer);
    c->open_handles = 2;
    c->next = m->conns;
    if (m->conns)
        m->conns->prev = c;
    m->conns = c;
    c->phase = CONN_READING;
    int rc = uv_accept((uv_stream_t *)&m->server, (uv_stream_t *)&c->tcp);
    if (rc < 0) {
        LOG_DEBUG(ADMIN, "metrics: accept: %s", uv_strerror(rc));
        conn_close(c);
        return 0;
    }
    int plen = (int)sizeof(c->peer);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->peer, &plen) < 0)
        c->peer.ss_family = 0;
    c->seq = ++m->accepted;
    if (m->nconns >= HTTP_MAX_CONNECTIONS) {
        http_conn_t *victim = eviction_victim(m);
        if (!victim) {
            LOG_WARN_RL(ADMIN, "metrics: %d connections are all being answered; closing a new one",
                        HTTP_MAX_CONNECTIONS);
            conn_close(c);
            return 0;
        }
        m->evicted++;
        LOG_INFO_RL(ADMIN, "metrics: %d connections open; closed the oldest one still without a request (%llu so "
                           "far) to serve a new one",
                    HTTP_MAX_CONNECTIONS, (unsigned long long)m->evicted);
        conn_close(victim);
    }
    c->counted = true;
    m->nconns++;
    uv_tcp_nodelay(&c->tcp, 1);
    if (uv_timer_start(&c->timer, conn_on_deadline, HTTP_REQUEST_DEADLINE_MS, 0) < 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read) < 0)
        conn_close(c);
    return 0;
}

static void on_connection(uv_stream_t *server, int status)
{
    colld_metrics_t *m = server->data;
    if (status < 0) {
        LOG_WARN_RL(ADMIN, "metrics: listener: %s", uv_strerror(status));
        return;
    }
    if (accept_one(m) < 0) {
        LOG_WARN_RL(ADMIN, "metrics: out of memory accepting a connection; will retry");
        m->accept_pending = true;
    }
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

/* Start the endpoint if configured. */
int colld_metrics_start(colld_daemon_t *d)
{
    colld_metrics_t *m = d->metrics;
    const char *addr = d->cfg.metrics_addr;
    if (!addr || !*addr)
        return 0;
    if (!m) {
        LOG_ERROR(ADMIN, "metrics: counters not created");
        return -1;
    }
    struct sockaddr_storage sa;
    if (parse_addr(addr, &sa, m->error, sizeof(m->error)) < 0) {
        LOG_ERROR(ADMIN, "--metrics: %s", m->error);
        return -1;
    }
    int rc = uv_tcp_init(&d->loop, &m->server);
    if (rc < 0) {
        colld_set_err(m->error, sizeof(m->error), "'%s': %s", addr, uv_strerror(rc));
        LOG_ERROR(ADMIN, "--metrics: %s", m->error);
        return -1;
    }
    m->server.data = m;
    m->server_open = true;
    rc = uv_tcp_bind(&m->server, (const struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&m->server, 128, on_connection);
    struct sockaddr_storage bound;
    int blen = (int)sizeof(bound);
    if (rc == 0)
        rc = uv_tcp_getsockname(&m->server, (struct sockaddr *)&bound, &blen);
    if (rc < 0) {
        colld_set_err(m->error, sizeof(m->error), "'%s': cannot listen: %s%s", addr, uv_strerror(rc),
                      rc == UV_EADDRINUSE ? " (another process uses the port; choose another, or 0 for any free one)"
                                          : "");
        LOG_ERROR(ADMIN, "--metrics: %s", m->error);
        colld_metrics_stop(d);
        return -1;
    }
    char ip[64] = "?";
    int port = 0;
    if (bound.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&bound;
        uv_ip6_name(s6, ip, sizeof(ip));
        port = ntohs(s6->sin6_port);
        snprintf(m->url, sizeof(m->url), "http://[%s]:%d/metrics", ip, port);
    } else {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)&bound;
        uv_ip4_name(s4, ip, sizeof(ip));
        port = ntohs(s4->sin_port);
        snprintf(m->url, sizeof(m->url), "http://%s:%d/metrics", ip, port);
    }
    LOG_INFO(ADMIN, "metrics on %s", m->url);
    return 0;
}

/* Close the listener and every connection. Their memory goes when the loop runs their close
 * callbacks. Idempotent. */
void colld_metrics_stop(colld_daemon_t *d)
{
    colld_metrics_t *m = d->metrics;
    if (!m)
        return;
    if (m->server_open) {
        uv_close((uv_handle_t *)&m->server, NULL);
        m->server_open = false;
    }
    m->url[0] = '\0';
    for (http_conn_t *c = m->conns; c; c = c->next)
        conn_close(c);
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
