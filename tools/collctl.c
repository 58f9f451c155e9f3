/*
 * collctl.c - the operators' command-line tool for a running colld.
 *
 *   collctl [--socket PATH] [--json] status
 *   collctl [--socket PATH] [--json] trace COMM
 *   collctl [--socket PATH] [--json] events [--follow] [--backlog N] [--new]
 *   collctl [--socket PATH] [--json] policy [set UID [--max-timeout-ms MS] [--net-algo ALGO]
 *                                           [--verify-results on|off] [--LIMIT N]
 *                                           | clear UID]
 *   collctl [--socket PATH] abort COMM [--reason TEXT]
 *   collctl [--socket PATH] peer disconnect NAME
 *   collctl [--socket PATH] [--json] probe [--bytes SIZE]
 *   collctl [--socket PATH] [--json] doctor [--since S] [--stuck-ms MS] [--straggler-ms MS] [--local]
 *                                           [--node-timeout-ms MS]
 *
 * status lists sessions and communicators (with each one's slowest rank) and, on a multi-node
 * daemon (started with --listen), its node and peer daemons; trace prints a communicator's flight
 * recorder; events prints the daemon's events (and keeps printing them with --follow); policy shows
 * or changes per-tenant timeout caps, multi-node all-reduce algorithms, result verification and
 * resource limits (admin, shown with each tenant's use); abort fails a
 * communicator for every rank; peer disconnect closes the connections to a peer daemon (admin).
 * --json prints one JSON object (events: one per line), each starting with "schema_version"
 * (JSON_SCHEMA_VERSION): it goes up whenever a field changes meaning or disappears, not when one
 * is added. status --watch prints the status again every --interval seconds (default 2) until
 * interrupted (or --count times), reconnecting when the daemon restarts.
 */
#include "tools/collctl.h"

#include "common/rpc_codec.h"
#include "common/util.h"
#include "colld.pb-c.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define JSON_SCHEMA_VERSION COLLCTL_JSON_SCHEMA_VERSION

static const char USAGE[] =
    "usage: collctl [--socket PATH] [--json] COMMAND [ARGS]\n"
    "\n"
    "Commands:\n"
    "  status [--watch [--interval S] [--count N]]\n"
    "                             sessions and communicators of the daemon, slowest ranks; on a\n"
    "                             multi-node daemon also its node and peer daemons; --watch prints it\n"
    "                             again every S seconds (default 2), N times or until interrupted\n"
    "  trace COMM                 flight recorder of communicator COMM: the last collectives, when each\n"
    "                             rank posted them, how they ended; per-rank lateness\n"
    "  events [--follow] [--backlog N] [--new]\n"
    "                             the daemon's events (attach/detach, communicators, faults); --follow\n"
    "                             keeps printing new ones until interrupted; --backlog N shows at most N\n"
    "                             past events first, --new none\n"
    "  policy                     per-tenant policy: limits with their defaults, use and refusals, and\n"
    "                             per uid its timeout cap, algorithm and limits with what it holds (an\n"
    "                             ordinary user sees the limits and its own use only)\n"
    "  policy set UID [--max-timeout-ms MS] [--net-algo auto|ring|rd] [--verify-results on|off]\n"
    "                 [--LIMIT N|default ...]\n"
    "                             cap the timeout of uid UID's new communicators, choose their\n"
    "                             multi-node all-reduce algorithm, verify their results (all-reduce,\n"
    "                             broadcast, all-gather), and/or override its limits (at least\n"
    "                             one option; admin only). LIMIT is one of max-sessions-per-tenant,\n"
    "                             max-comms-per-tenant, max-joining-ranks-per-tenant, max-regs-per-tenant,\n"
    "                             max-registered-bytes-per-tenant (K/M/G/T suffixes),\n"
    "                             max-event-followers-per-tenant, max-rpc-conns-per-tenant,\n"
    "                             max-daemon-bytes-per-tenant (K/M/G/T); 'default' drops the override\n"
    "  policy clear UID           remove uid UID's policy and limit overrides (admin only)\n"
    "  abort COMM [--reason TEXT] fail every pending and later operation of COMM on every rank with\n"
    "                             COLLD_ERR_ABORTED (admin, or the communicator's own user)\n"
    "  peer disconnect NAME       close the connections to peer daemon NAME (node name or address), as\n"
    "                             if its link broke; communicators spanning it fail (admin only)\n"
    "  probe [--bytes SIZE]       measure every link of this node now: SIZE (default 2M, 256K..64M)\n"
    "                             each way to and from each peer daemon, one after the other, and the\n"
    "                             round trip; names a link below 1/4 of the median of the other links;\n"
    "                             exit status 1 when a link is slow or unmeasured (admin only)\n"
    "  doctor [--since S] [--stuck-ms MS] [--straggler-ms MS] [--local] [--node-timeout-ms MS]\n"
    "                             what is wrong, on one screen: communicators stuck longer than MS\n"
    "                             (default 1000) and the ranks they wait for, broken ones, peers not\n"
    "                             up, stragglers lagging by MS (default 10), the faults of the last S\n"
    "                             seconds (default 3600: time-outs, dead ranks, NaN contributors,\n"
    "                             deadlock cycles), slow links, requests refused at limits, GPU health;\n"
    "                             on a daemon with peers the same for every other node too (each line\n"
    "                             names its node; a node not answering within --node-timeout-ms,\n"
    "                             default 2000, is a problem; --local: this node only); exit status 1\n"
    "                             when a problem was found\n"
    "\n"
    "Options:\n"
    "  --socket PATH  the daemon's socket (env COLLD_SOCKET; default /run/colld/colld.sock for root,\n"
    "                 $XDG_RUNTIME_DIR/colld.sock otherwise)\n"
    "  --json         machine-readable output: one JSON object (events, status --watch: one per\n"
    "                 line), each with \"schema_version\"\n"
    "  --version      print the version and exit\n"
    "  -h, --help     this text\n"
    "\n"
    "Exit status: 0 done, 1 the daemon refused or is unreachable (doctor: or found a problem), 2 bad\n"
    "command line.\n";

/* Print a JSON string literal. */
static void json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

/* This node's directed links (see collctl.h). */
size_t collctl_links(const Colld__V1__StatusResponse *r, collctl_link_t *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n_peers && n + 2 <= max; i++) {
        const Colld__V1__PeerInfo *p = r->peers[i];
        bool up = p->state && strcmp(p->state, "up") == 0;
        const char *peer = p->name && *p->name ? p->name : p->addr;
        out[n] = (collctl_link_t){ .peer = i, .tx = true, .from = r->node_name, .to = peer,
                                   .l = { .rate = up ? p->tx_rate : 0 } };
        out[n + 1] = (collctl_link_t){ .peer = i, .tx = false, .from = peer, .to = r->node_name,
                                       .l = { .rate = up ? p->rx_rate : 0 } };
        n += 2;
    }
    colld_link_rate_t *rates = calloc(n + 1, sizeof(*rates));
    if (!rates)
        return n;
    for (size_t i = 0; i < n; i++)
        rates[i] = out[i].l;
    colld_link_outliers(rates, n);
    for (size_t i = 0; i < n; i++)
        out[i].l = rates[i];
    free(rates);
    return n;
}

/* Print the slow links among links[n] as a JSON array of objects. */
void collctl_links_json(const collctl_link_t *links, size_t n)
{
    char text[256];
    int k = 0;
    printf("[");
    for (size_t i = 0; i < n; i++) {
        const collctl_link_t *x = &links[i];
        if (!x->l.slow)
            continue;
        colld_link_describe(text, sizeof(text), x->from, x->to, &x->l);
        printf("%s{\"from\":", k++ ? "," : "");
        json_str(x->from);
        printf(",\"to\":");
        json_str(x->to);
        printf(",\"rate\":%.0f,\"others_median\":%.0f,\"others_min\":%.0f,\"others_max\":%.0f,\"text\":",
               x->l.rate, x->l.others_median, x->l.others_min, x->l.others_max);
        json_str(text);
        printf("}");
    }
    printf("]");
}

static void print_json(const Colld__V1__StatusResponse *r)
{
    collctl_link_t links[COLLCTL_MAX_LINKS];
    size_t nlinks = collctl_links(r, links, COLLCTL_MAX_LINKS);
    printf("{\"schema_version\":%d,\"daemon_version\":", JSON_SCHEMA_VERSION);
    json_str(r->daemon_version);
    printf(",\"daemon_pid\":%d,\"started_unix_ms\":%lld,\"socket\":", r->pid, (long long)r->started_unix_ms);
    json_str(r->socket);
    printf(",\"node_name\":");
    json_str(r->node_name);
    printf(",\"listen\":");
    json_str(r->listen);
    printf(",\"net_transport\":");
    json_str(r->net_transport);
    printf(",\"ib_device\":");
    json_str(r->ib_device);
    printf(",\"ib_none\":");
    json_str(r->ib_none);
    printf(",\"net_payload_sent\":%llu,\"net_payload_received\":%llu,\"net_refused\":%llu,\"peers\":[",
           (unsigned long long)r->net_payload_sent, (unsigned long long)r->net_payload_received,
           (unsigned long long)r->net_refused);
    for (size_t i = 0; i < r->n_peers; i++) {
        const Colld__V1__PeerInfo *p = r->peers[i];
        printf("%s{\"name\":", i ? "," : "");
        json_str(p->name);
        printf(",\"addr\":");
        json_str(p->addr);
        printf(",\"state\":");
        json_str(p->state);
        printf(",\"conns\":%d,\"bytes_sent\":%llu,\"bytes_received\":%llu,\"send_rate\":%.1f,\"recv_rate\":%.1f,"
               "\"last_error\":",
               p->conns, (unsigned long long)p->bytes_sent, (unsigned long long)p->bytes_received, p->send_rate,
               p->recv_rate);
        json_str(p->last_error);
        bool tx_slow = false, rx_slow = false;
        for (size_t k = 0; k < nlinks; k++)
            if (links[k].peer == i && links[k].l.slow)
                *(links[k].tx ? &tx_slow : &rx_slow) = true;
        printf(",\"tx_rate\":%.0f,\"rx_rate\":%.0f,\"tx_slow\":%s,\"rx_slow\":%s,\"rtt_ms\":%.3f,\"tcp_rtt_us\":%u,"
               "\"tcp_lost\":%u,\"retrans\":%llu,\"losses\":%llu,\"rx_bytes\":%llu,\"rx_busy_us\":%llu,"
               "\"transport\":",
               p->tx_rate, p->rx_rate, tx_slow ? "true" : "false", rx_slow ? "true" : "false", p->rtt_ms, p->tcp_rtt_us,
               p->tcp_lost, (unsigned long long)p->retrans, (unsigned long long)p->losses,
               (unsigned long long)p->rx_bytes, (unsigned long long)p->rx_busy_us);
        json_str(*p->transport ? p->transport : "tcp");
        printf(",\"transport_note\":");
        json_str(p->transport_note);
        printf("}");
    }
    printf("],\"slow_links\":");
    collctl_links_json(links, nlinks);
    collctl_gpu_json(r);
    printf(",\"sessions\":[");
    for (size_t i = 0; i < r->n_sessions; i++) {
        const Colld__V1__SessionInfo *s = r->sessions[i];
        printf("%s{\"id\":%llu,\"pid\":%d,\"uid\":%u,\"gid\":%u,\"attached_unix_ms\":%lld,\"process\":", i ? "," : "",
               (unsigned long long)s->id, s->pid, s->uid, s->gid, (long long)s->attached_unix_ms);
        json_str(s->process_name);
        printf(",\"comms\":%u,\"registered_bytes\":%llu,\"admin\":%s}", s->comms,
               (unsigned long long)s->registered_bytes, s->admin ? "true" : "false");
    }
    printf("],\"comms\":[");
    for (size_t i = 0; i < r->n_comms; i++) {
        const Colld__V1__CommInfo *c = r->comms[i];
        printf("%s{\"id\":%llu,\"name\":", i ? "," : "", (unsigned long long)c->id);
        json_str(c->name);
        printf(",\"nranks\":%d,\"joined\":%d,\"state\":", c->nranks, c->joined);
        json_str(c->state);
        printf(",\"ops_completed\":%llu,\"ops_failed\":%llu,\"uid\":%u,\"timeout_ms\":%d,\"last_error\":",
               (unsigned long long)c->ops_completed, (unsigned long long)c->ops_failed, c->uid, c->timeout_ms);
        json_str(c->last_error);
        printf(",\"slowest_rank\":%d,\"p2p_waited_ms\":%lld,\"p2p_wait\":", c->slowest_rank,
               (long long)c->p2p_waited_ms);
        json_str(c->p2p_wait);
        printf(",\"coll_waited_ms\":%lld,\"coll_wait\":", (long long)c->coll_waited_ms);
        json_str(c->coll_wait);
        printf(",\"verify_results\":%s", c->verify_results ? "true" : "false");
        printf(",\"members\":[");
        for (size_t m = 0; m < c->n_members; m++) {
            const Colld__V1__CommMemberInfo *x = c->members[m];
            printf("%s{\"rank\":%d,\"session\":%llu,\"pid\":%d,\"node\":", m ? "," : "", x->rank,
                   (unsigned long long)x->session_id, x->pid);
            json_str(x->node);
            printf(",\"samples\":%llu,\"mean_late_us\":%llu,\"max_late_us\":%llu}", (unsigned long long)x->samples,
                   (unsigned long long)x->mean_late_us, (unsigned long long)x->max_late_us);
        }
        printf("]}");
    }
    printf("]}\n");
}

/* "2026-11-21 08:02:57" in local time. */
static void fmt_time(int64_t unix_ms, char *buf, size_t len)
{
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
}

static void fmt_bytes(uint64_t b, char *buf, size_t len)
{
    const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

/* Where a communicator member lives: "pid 1234", or "node NAME" for a rank on another node. */
static void fmt_member(const Colld__V1__CommMemberInfo *x, char *buf, size_t len)
{
    if (x->node && *x->node)
        snprintf(buf, len, "node %s", x->node);
    else
        snprintf(buf, len, "pid %d", x->pid);
}

/* A multi-node daemon's node, its traffic and its peer daemons. */
static void print_peers(const Colld__V1__StatusResponse *r)
{
    char sent[32], received[32], rate_s[32], rate_r[32];
    fmt_bytes(r->net_payload_sent, sent, sizeof(sent));
    fmt_bytes(r->net_payload_received, received, sizeof(received));
    printf("node %s listening on %s: %s sent, %s received to peers, %llu connections refused\n\n", r->node_name,
           r->listen, sent, received, (unsigned long long)r->net_refused);
    printf("PEERS (%zu)\n", r->n_peers);
    printf("  %-16s %-21s %-10s %5s %10s %10s %10s %10s  %s\n", "NAME", "ADDR", "STATE", "CONNS", "SENT", "RECEIVED",
           "SEND/s", "RECV/s", "LAST-ERROR");
    for (size_t i = 0; i < r->n_peers; i++) {
        const Colld__V1__PeerInfo *p = r->peers[i];
        fmt_bytes(p->bytes_sent, sent, sizeof(sent));
        fmt_bytes(p->bytes_received, received, sizeof(received));
        fmt_bytes(p->send_rate > 0 ? (uint64_t)p->send_rate : 0, rate_s, sizeof(rate_s));
        fmt_bytes(p->recv_rate > 0 ? (uint64_t)p->recv_rate : 0, rate_r, sizeof(rate_r));
        printf("  %-16s %-21s %-10s %5d %10s %10s %10s %10s  %s\n", p->name, p->addr, p->state, p->conns, sent,
               received, rate_s, rate_r, p->last_error && *p->last_error ? p->last_error : "-");
    }
    printf("\nTRANSPORT of collective data (--net-transport %s; RDMA device: %s%s)\n", r->net_transport,
           *r->ib_device ? r->ib_device : "none, ", *r->ib_device ? "" : r->ib_none);
    for (size_t i = 0; i < r->n_peers; i++)
        printf("  %-16s %-4s %s\n", *r->peers[i]->name ? r->peers[i]->name : r->peers[i]->addr,
               *r->peers[i]->transport ? r->peers[i]->transport : "tcp", r->peers[i]->transport_note);
    printf("\n");
    collctl_link_t links[COLLCTL_MAX_LINKS];
    size_t nlinks = collctl_links(r, links, COLLCTL_MAX_LINKS);
    printf("LINKS (measured on collective data; slow: below 1/%.0f of the median of this node's other links)\n",
           COLLD_LINK_SLOW_RATIO);
    printf("  %-16s %14s %14s %10s %10s %8s %6s %7s\n", "PEER", "TO-PEER", "FROM-PEER", "RTT", "TCP-RTT", "RETRANS",
           "LOST", "ERRORS");
    for (size_t k = 0; k + 1 < nlinks; k += 2) {
        const Colld__V1__PeerInfo *p = r->peers[links[k].peer];
        char tx[40], rx[40], rtt[24];
        colld_link_rate_text(tx, 32, links[k].l.rate);
        colld_link_rate_text(rx, 32, links[k + 1].l.rate);
        if (links[k].l.slow)
            strcat(tx, " SLOW");
        if (links[k + 1].l.slow)
            strcat(rx, " SLOW");
        snprintf(rtt, sizeof(rtt), p->rtt_ms > 0 ? "%.2f ms" : "-", p->rtt_ms);
        printf("  %-16s %14s %14s %10s %7.2f ms %8llu %6u %7llu\n", links[k].to, tx, rx, rtt, p->tcp_rtt_us / 1000.0,
               (unsigned long long)p->retrans, p->tcp_lost, (unsigned long long)p->losses);
    }
    for (size_t k = 0; k < nlinks; k++)
        if (links[k].l.slow) {
            char text[256];
            colld_link_describe(text, sizeof(text), links[k].from, links[k].to, &links[k].l);
            printf("slow link: %s\n", text);
        }
    printf("\n");
}

static void print_text(const Colld__V1__StatusResponse *r)
{
    char when[32], size[32];
    fmt_time(r->started_unix_ms, when, sizeof(when));
    printf("colld %s, pid %d, started %s, socket %s\n\n", r->daemon_version, r->pid, when, r->socket);
    if (r->node_name && *r->node_name)
        print_peers(r);
    printf("SESSIONS (%zu)\n", r->n_sessions);
    printf("  %-6s %-8s %-6s %-20s %-19s %5s %10s\n", "ID", "PID", "UID", "PROCESS", "ATTACHED", "COMMS", "SHARED");
    for (size_t i = 0; i < r->n_sessions; i++) {
        const Colld__V1__SessionInfo *s = r->sessions[i];
        char name[64];
        snprintf(name, sizeof(name), "%s%s", s->process_name, s->admin ? " [admin]" : "");
        fmt_time(s->attached_unix_ms, when, sizeof(when));
        fmt_bytes(s->registered_bytes, size, sizeof(size));
        printf("  %-6llu %-8d %-6u %-20s %-19s %5u %10s\n", (unsigned long long)s->id, s->pid, s->uid, name, when,
               s->comms, size);
    }
    printf("\nCOMMUNICATORS (%zu)\n", r->n_comms);
    printf("  %-6s %-16s %5s %6s %-8s %12s %10s %10s\n", "ID", "NAME", "RANKS", "JOINED", "STATE", "OPS-DONE",
           "OPS-FAILED", "TIMEOUT");
    for (size_t i = 0; i < r->n_comms; i++) {
        const Colld__V1__CommInfo *c = r->comms[i];
        char to[32];
        snprintf(to, sizeof(to), "%d ms", c->timeout_ms);
        printf("  %-6llu %-16s %5d %6d %-8s %12llu %10llu %10s\n", (unsigned long long)c->id, c->name, c->nranks,
               c->joined, c->state, (unsigned long long)c->ops_completed, (unsigned long long)c->ops_failed, to);
        char where[96];
        printf("         ranks:");
        for (size_t m = 0; m < c->n_members; m++) {
            fmt_member(c->members[m], where, sizeof(where));
            printf(" %d=%s", c->members[m]->rank, where);
        }
        printf("\n");
        /* What it waits for now comes first: the slowest rank is history (completed collectives),
         * and a rank that stopped is not in it. */
        if (c->coll_wait && *c->coll_wait)
            printf("         waiting: %s\n", c->coll_wait);
        if (c->verify_results)
            printf("         result verification: on (all-reduce results checksummed and compared)\n");
        for (size_t m = 0; m < c->n_members; m++) {
            const Colld__V1__CommMemberInfo *x = c->members[m];
            fmt_member(x, where, sizeof(where));
            if (x->rank == c->slowest_rank)
                printf("         slowest in completed collectives: rank %d (%s), on average %.3f ms behind the "
                       "first rank, at worst %.3f ms, over %llu collectives\n",
                       x->rank, where, (double)x->mean_late_us / 1000.0, (double)x->max_late_us / 1000.0,
                       (unsigned long long)x->samples);
        }
        if (c->p2p_wait && *c->p2p_wait)
            printf("         point-to-point: %s\n", c->p2p_wait);
        if (c->last_error && *c->last_error)
            printf("         last error: %s\n", c->last_error);
    }
    collctl_gpu_text(r);
}

/* ============================================================================================
 * Calls
 * ========================================================================================== */


int collctl_call(colld_client_t *c, const char *what, const char *method, ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp)
{
    char detail[512] = "";
    colld_status_t st = colld__client_rpc(c, method, req, desc, COLLD_CLIENT_RPC_TIMEOUT_MS, resp, detail,
                                          sizeof(detail));
    if (st != COLLD_OK) {
        colld_str_sanitize(detail, sizeof(detail), detail, SIZE_MAX);
        fprintf(stderr, "collctl: %s failed: %s: %s\n", what, colld_status_name(st), *detail ? detail : colld_status_string(st));
        return 1;
    }
    colld_rpc_clean_strings(*resp, SIZE_MAX);
    return 0;
}

void collctl_clean_message(ProtobufCMessage *m)
{
    colld_rpc_clean_strings(m, SIZE_MAX);
}

void collctl_json_str(const char *s)
{
    json_str(s);
}

/* The unary call of the commands in this file. */
static int call(colld_client_t *c, const char *what, const char *method, ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp)
{
    return collctl_call(c, what, method, req, desc, resp);
}

static int cmd_status(colld_client_t *c, int json)
{
    Colld__V1__StatusRequest req = COLLD__V1__STATUS_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    Colld__V1__StatusResponse *resp = NULL;
    if (call(c, "status", "/colld.v1.Colld/Status", &req.base, &colld__v1__status_response__descriptor,
             (ProtobufCMessage **)&resp))
        return 1;
    if (json)
        print_json(resp);
    else
        print_text(resp);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return 0;
}

/* status --watch: the status every interval_s seconds, count times (0: until interrupted). A
 * daemon that goes away is reported and reconnected to at the next interval, so an upgrade can
 * be watched from start to end. On a terminal each refresh replaces the screen; otherwise (and
 * with --json, one object per line) the refreshes follow each other. Returns 0 after count
 * refreshes, 1 if none could be shown. */
static int cmd_status_watch(colld_client_t *c, const char *socket, int json, long long interval_s, long long count)
{
    bool tty = !json && isatty(STDOUT_FILENO);
    long long shown = 0;
    for (long long i = 0; count == 0 || i < count; i++) {
        if (i > 0) {
            struct timespec ts = { .tv_sec = (time_t)interval_s };
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
            }
        }
        if (!c) {
            colld_status_t st = colld__connect_role(socket, COLLD_ROLE_ADMIN, &c);
            if (st != COLLD_OK) {
                c = NULL;
                fprintf(stderr, "collctl: cannot reach colld: %s (retrying every %lld s)\n", colld_status_name(st),
                        interval_s);
                continue;
            }
        }
        if (tty) {
            char when[64];
            time_t now = time(NULL);
            struct tm tm;
            localtime_r(&now, &tm);
            strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
            printf("\033[H\033[2J");
            printf("collctl status, every %lld s (Ctrl-C to stop): %s\n\n", interval_s, when);
        }
        if (cmd_status(c, json) != 0) {
            colld_disconnect(c);
            c = NULL;
            continue;
        }
        shown++;
        fflush(stdout);
    }
    if (c)
        colld_disconnect(c);
    return shown ? 0 : 1;
}

/* ============================================================================================
 * trace COMM
 * ========================================================================================== */

/* "12:00:01.123456" in local time. */
static void fmt_time_us(int64_t unix_us, char *buf, size_t len)
{
    time_t t = (time_t)(unix_us / 1000000);
    struct tm tm;
    localtime_r(&t, &tm);
    size_t n = strftime(buf, len, "%H:%M:%S", &tm);
    snprintf(buf + n, len - n, ".%06lld", (long long)(unix_us % 1000000));
}

/* "+1.234" ms after the first arrival, or "absent". */
static void fmt_after(int64_t us, char *buf, size_t len)
{
    if (us < 0)
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "+%.3f", (double)us / 1000.0);
}

static const char *short_status(int32_t st)
{
    return st == COLLD_INPROGRESS ? "WAITING" : colld_status_name((colld_status_t)st);
}

/* What is notable about one collective: the ranks absent and the last rank to arrive. */
static void print_arrivals(const Colld__V1__TraceEntry *e)
{
    char b[32];
    if (e->n_arrival_us <= 8) {
        for (size_t r = 0; r < e->n_arrival_us; r++) {
            if (e->arrival_us[r] < 0)
                printf(" r%zu:ABSENT", r);
            else {
                fmt_after(e->arrival_us[r], b, sizeof(b));
                printf(" r%zu:%s", r, b);
            }
        }
        return;
    }
    size_t absent = 0, last = 0;
    for (size_t r = 0; r < e->n_arrival_us; r++) {
        if (e->arrival_us[r] < 0)
            absent++;
        else if (e->arrival_us[r] > e->arrival_us[last] || e->arrival_us[last] < 0)
            last = r;
    }
    fmt_after(e->arrival_us[last], b, sizeof(b));
    printf(" last r%zu:%s", last, b);
    if (absent) {
        printf(" ABSENT:");
        size_t shown = 0;
        for (size_t r = 0; r < e->n_arrival_us && shown < 16; r++)
            if (e->arrival_us[r] < 0) {
                printf("%s%zu", shown++ ? "," : "", r);
            }
        if (absent > shown)
            printf(",...(%zu)", absent);
    }
}

static void trace_text(const Colld__V1__TraceResponse *r)
{
    printf("communicator %llu (%s): %d ranks, state %s, timeout %d ms\n", (unsigned long long)r->comm_id, r->name,
           r->nranks, r->state, r->timeout_ms);
    if (r->comm_status)
        printf("error: %s: %s\n", colld_status_name((colld_status_t)r->comm_status), r->comm_detail);
    printf("flight recorder: %llu collectives recorded, last %u kept (times in ms after the first rank posted)\n\n",
           (unsigned long long)r->recorded, r->capacity);
    printf("%6s %-13s %-8s %-4s %10s %-6s %-20s %-15s %9s %9s  %s\n", "SEQ", "COLLECTIVE", "DTYPE", "OP", "COUNT",
           "PATH", "STATUS", "FIRST-POSTED", "START", "END", "ARRIVALS");
    for (size_t i = 0; i < r->n_entries; i++) {
        const Colld__V1__TraceEntry *e = r->entries[i];
        char when[32], start[32], end[32];
        fmt_time_us(e->first_arrival_unix_us, when, sizeof(when));
        fmt_after(e->start_us, start, sizeof(start));
        fmt_after(e->end_us, end, sizeof(end));
        printf("%6llu %-13s %-8s %-4s %10llu %-6s %-20s %-15s %9s %9s ", (unsigned long long)e->seq, e->kind,
               e->dtype, e->redop, (unsigned long long)e->count, e->path, short_status(e->status), when, start, end);
        print_arrivals(e);
        if (e->note[0])
            printf("  <- %s", e->note);
        printf("\n");
    }
    if (r->n_entries == 0)
        printf("  (no collective recorded yet)\n");
    printf("\n%6s %8s %8s %8s %12s %12s\n", "RANK", "PID", "MEMBER", "SAMPLES", "MEAN-LATE", "MAX-LATE");
    for (size_t i = 0; i < r->n_ranks; i++) {
        const Colld__V1__RankStats *x = r->ranks[i];
        printf("%6d %8d %8s %8llu %9.3f ms %9.3f ms%s\n", x->rank, x->pid, x->present ? "yes" : "left",
               (unsigned long long)x->samples, (double)x->mean_late_us / 1000.0, (double)x->max_late_us / 1000.0,
               x->rank == r->slowest_rank ? "  <- slowest" : "");
    }
}

static void trace_json(const Colld__V1__TraceResponse *r)
{
    printf("{\"schema_version\":%d,\"comm_id\":%llu,\"name\":", JSON_SCHEMA_VERSION, (unsigned long long)r->comm_id);
    json_str(r->name);
    printf(",\"nranks\":%d,\"state\":", r->nranks);
    json_str(r->state);
    printf(",\"timeout_ms\":%d,\"status\":", r->timeout_ms);
    json_str(r->comm_status ? colld_status_name((colld_status_t)r->comm_status) : "COLLD_OK");
    printf(",\"detail\":");
    json_str(r->comm_detail);
    printf(",\"recorded\":%llu,\"capacity\":%u,\"slowest_rank\":%d,\"entries\":[", (unsigned long long)r->recorded,
           r->capacity, r->slowest_rank);
    for (size_t i = 0; i < r->n_entries; i++) {
        const Colld__V1__TraceEntry *e = r->entries[i];
        printf("%s{\"seq\":%llu,\"kind\":", i ? "," : "", (unsigned long long)e->seq);
        json_str(e->kind);
        printf(",\"dtype\":");
        json_str(e->dtype);
        printf(",\"op\":");
        json_str(e->redop);
        printf(",\"count\":%llu,\"root\":%d,\"path\":", (unsigned long long)e->count, e->root);
        json_str(e->path);
        printf(",\"status\":");
        json_str(short_status(e->status));
        printf(",\"first_arrival_unix_us\":%lld,\"start_us\":%lld,\"end_us\":%lld,\"arrival_us\":[",
               (long long)e->first_arrival_unix_us, (long long)e->start_us, (long long)e->end_us);
        for (size_t k = 0; k < e->n_arrival_us; k++)
            printf("%s%lld", k ? "," : "", (long long)e->arrival_us[k]);
        printf("],\"note\":");
        json_str(e->note);
        printf("}");
    }
    printf("],\"ranks\":[");
    for (size_t i = 0; i < r->n_ranks; i++) {
        const Colld__V1__RankStats *x = r->ranks[i];
        printf("%s{\"rank\":%d,\"pid\":%d,\"present\":%s,\"samples\":%llu,\"mean_late_us\":%llu,\"max_late_us\":%llu}",
               i ? "," : "", x->rank, x->pid, x->present ? "true" : "false", (unsigned long long)x->samples,
               (unsigned long long)x->mean_late_us, (unsigned long long)x->max_late_us);
    }
    printf("]}\n");
}

/* A communicator id argument. Returns 0 or prints why not and returns -1. */
static int parse_comm(const char *text, uint64_t *id)
{
    char *end;
    errno = 0;
    unsigned long long v = text ? strtoull(text, &end, 10) : 0;
    if (!text || end == text || *end || errno || v == 0) {
        fprintf(stderr, "collctl: expected a communicator id (the ID column of collctl status), got '%s'\n",
                text ? text : "");
        return -1;
    }
    *id = v;
    return 0;
}

static int cmd_trace(colld_client_t *c, uint64_t comm, int json)
{
    Colld__V1__TraceRequest req = COLLD__V1__TRACE_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    req.comm_id = comm;
    Colld__V1__TraceResponse *resp = NULL;
    if (call(c, "trace", "/colld.v1.Colld/Trace", &req.base, &colld__v1__trace_response__descriptor,
             (ProtobufCMessage **)&resp))
        return 1;
    if (json)
        trace_json(resp);
    else
        trace_text(resp);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return 0;
}

/* ============================================================================================
 * events [--follow]
 * ========================================================================================== */

static void event_print(const Colld__V1__Event *e, int json)
{
    if (json) {
        printf("{\"schema_version\":%d,\"seq\":%llu,\"unix_us\":%lld,\"type\":", JSON_SCHEMA_VERSION,
               (unsigned long long)e->seq, (long long)e->unix_us);
        json_str(e->type);
        printf(",\"comm_id\":%llu,\"comm_name\":", (unsigned long long)e->comm_id);
        json_str(e->comm_name);
        printf(",\"rank\":%d,\"pid\":%d,\"session\":%llu,\"uid\":%u,\"status\":", e->rank, e->pid,
               (unsigned long long)e->session_id, e->uid);
        json_str(colld_status_name((colld_status_t)e->status));
        printf(",\"detail\":");
        json_str(e->detail);
        printf("}\n");
    } else {
        char when[32], day[16];
        time_t t = (time_t)(e->unix_us / 1000000);
        struct tm tm;
        localtime_r(&t, &tm);
        strftime(day, sizeof(day), "%Y-%m-%d", &tm);
        fmt_time_us(e->unix_us, when, sizeof(when));
        printf("%s %s %-16s", day, when, e->type);
        if (e->comm_id)
            printf(" comm %llu (%s)", (unsigned long long)e->comm_id, e->comm_name);
        if (e->rank >= 0)
            printf(" rank %d", e->rank);
        if (e->pid > 0)
            printf(" pid %d", e->pid);
        if (!e->comm_id && e->session_id)
            printf(" session %llu uid %u", (unsigned long long)e->session_id, e->uid);
        if (e->status != COLLD_OK)
            printf(" %s", colld_status_name((colld_status_t)e->status));
        if (e->detail && *e->detail)
            printf(": %s", e->detail);
        printf("\n");
    }
    fflush(stdout);
}

static int cmd_events(colld_client_t *c, int follow, uint32_t backlog, int only_new, int json)
{
    Colld__V1__EventsRequest req = COLLD__V1__EVENTS_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    req.follow = follow;
    req.backlog = backlog;
    req.only_new = only_new;
    colld_rpc_stream_t *st = NULL;
    grpc_status_code code = colld_rpc_stream_open(c->rpc, "/colld.v1.Colld/Events", &req.base,
                                                  &colld__v1__event__descriptor, follow ? 0 : COLLD_CLIENT_RPC_TIMEOUT_MS,
                                                  &st);
    if (code != GRPC_STATUS_OK) {
        fprintf(stderr, "collctl: events: cannot open the event stream (gRPC status %d)\n", (int)code);
        return 1;
    }
    int rc = 0;
    for (;;) {
        ProtobufCMessage *m = NULL;
        grpc_status_code final = GRPC_STATUS_OK;
        char details[256] = "";
        int r = colld_rpc_stream_next(st, &m, &final, details, sizeof(details));
        if (r == 0) {
            colld_rpc_clean_strings(m, SIZE_MAX);
            event_print((const Colld__V1__Event *)m, json);
            protobuf_c_message_free_unpacked(m, NULL);
            continue;
        }
        if (r < 0 || final != GRPC_STATUS_OK) {
            fprintf(stderr, "collctl: event stream ended: %s\n",
                    *details ? details : "the connection to the colld daemon was lost");
            rc = 1;
        }
        break;
    }
    colld_rpc_stream_close(st);
    return rc;
}

/* ============================================================================================
 * policy, abort, peer disconnect
 * ========================================================================================== */

static int cmd_policy_show(colld_client_t *c, int json)
{
    Colld__V1__GetPolicyRequest req = COLLD__V1__GET_POLICY_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    Colld__V1__GetPolicyResponse *resp = NULL;
    if (call(c, "policy", "/colld.v1.Colld/GetPolicy", &req.base, &colld__v1__get_policy_response__descriptor,
             (ProtobufCMessage **)&resp))
        return 1;
    if (json) {
        printf("{\"schema_version\":%d,\"default_timeout_ms\":%d,\"max_timeout_ms\":%d,\"max_registrations\":%llu,"
               "\"registrations\":%llu,\"registrations_refused\":%llu,\"own_only\":%s,\"limits\":[",
               JSON_SCHEMA_VERSION, resp->default_timeout_ms, resp->max_timeout_ms,
               (unsigned long long)resp->max_registrations, (unsigned long long)resp->registrations,
               (unsigned long long)resp->registrations_refused, resp->own_only ? "true" : "false");
        for (size_t i = 0; i < resp->n_defaults; i++) {
            const Colld__V1__TenantLimit *l = resp->defaults[i];
            printf("%s{\"name\":", i ? "," : "");
            json_str(l->name);
            printf(",\"default\":%llu,\"used\":%llu,\"refused\":%llu}", (unsigned long long)l->limit,
                   (unsigned long long)l->used, (unsigned long long)l->refused);
        }
        printf("],\"tenants\":[");
        for (size_t i = 0; i < resp->n_tenants; i++) {
            const Colld__V1__TenantPolicy *t = resp->tenants[i];
            printf("%s{\"uid\":%u,\"max_timeout_ms\":%d,\"net_algo\":", i ? "," : "", t->uid, t->max_timeout_ms);
            json_str(t->net_algo);
            printf(",\"verify_results\":");
            json_str(t->verify_results);
            printf(",\"limits\":[");
            for (size_t k = 0; k < t->n_limits; k++) {
                const Colld__V1__TenantLimit *l = t->limits[k];
                printf("%s{\"name\":", k ? "," : "");
                json_str(l->name);
                printf(",\"limit\":%llu,\"used\":%llu,\"override\":%s}", (unsigned long long)l->limit,
                       (unsigned long long)l->used, l->overridden ? "true" : "false");
            }
            printf("]}");
        }
        printf("]}\n");
    } else {
        printf("default timeout %d ms, daemon-wide cap %d ms\n", resp->default_timeout_ms, resp->max_timeout_ms);
        if (resp->own_only) /* not an administrator: the daemon shows this user's use only */
            printf("registrations: %llu held by you; all users together may hold %llu (max-registrations)\n\n",
                   (unsigned long long)resp->registrations, (unsigned long long)resp->max_registrations);
        else
            printf("registrations of all users: %llu held of %llu (max-registrations), %llu refused\n\n",
                   (unsigned long long)resp->registrations, (unsigned long long)resp->max_registrations,
                   (unsigned long long)resp->registrations_refused);
        if (resp->own_only)
            printf("%-34s %14s %14s\n", "LIMIT", "DEFAULT", "YOUR-USE");
        else
            printf("%-34s %14s %14s %10s\n", "LIMIT", "DEFAULT", "IN-USE", "REFUSED");
        for (size_t i = 0; i < resp->n_defaults; i++) {
            const Colld__V1__TenantLimit *l = resp->defaults[i];
            if (resp->own_only)
                printf("%-34s %14llu %14llu\n", l->name, (unsigned long long)l->limit, (unsigned long long)l->used);
            else
                printf("%-34s %14llu %14llu %10llu\n", l->name, (unsigned long long)l->limit,
                       (unsigned long long)l->used, (unsigned long long)l->refused);
        }
        for (size_t i = 0; i < resp->n_tenants; i++) {
            const Colld__V1__TenantPolicy *t = resp->tenants[i];
            char cap[32] = "-"; /* 0: no tenant cap, only the daemon-wide one */
            if (t->max_timeout_ms > 0)
                snprintf(cap, sizeof(cap), "%d ms", t->max_timeout_ms);
            printf("\nuid %u: max timeout %s, multi-node all-reduce %s, result verification %s\n", t->uid, cap,
                   t->net_algo && *t->net_algo ? t->net_algo : "(daemon default)",
                   t->verify_results && *t->verify_results ? t->verify_results : "off");
            for (size_t k = 0; k < t->n_limits; k++) {
                const Colld__V1__TenantLimit *l = t->limits[k];
                printf("  %-32s %14llu / %-14llu%s\n", l->name, (unsigned long long)l->used,
                       (unsigned long long)l->limit, l->overridden ? " (override)" : "");
            }
        }
        if (!resp->n_tenants)
            printf("\n(no per-tenant policy)\n");
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return 0;
}

#define MAX_LIMIT_ARGS 8 /* one per limit */

/* A limit override from the command line: --NAME VALUE. */
typedef struct {
    const char *name; /* the option without "--" */
    uint64_t value;
    bool reset;       /* VALUE was "default" */
} limit_arg_t;

/* Set uid's policy (max_timeout_ms 0: keep the timeout cap; net_algo NULL: keep the algorithm;
 * limits: overrides to change), or clear it. */
static int cmd_policy_set(colld_client_t *c, uint32_t uid, int max_timeout_ms, const char *net_algo, const char *verify,
                          const limit_arg_t *limits, size_t nlimits, int clear)
{
    Colld__V1__SetPolicyRequest req = COLLD__V1__SET_POLICY_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    Colld__V1__TenantPolicy pol = COLLD__V1__TENANT_POLICY__INIT;
    Colld__V1__TenantLimit lim[MAX_LIMIT_ARGS], *lptr[MAX_LIMIT_ARGS];
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    pol.uid = uid;
    pol.max_timeout_ms = max_timeout_ms;
    pol.net_algo = (char *)(net_algo ? net_algo : "");
    pol.verify_results = (char *)(verify ? verify : "");
    for (size_t i = 0; i < nlimits; i++) {
        colld__v1__tenant_limit__init(&lim[i]);
        lim[i].name = (char *)limits[i].name;
        lim[i].limit = limits[i].value;
        lim[i].reset = limits[i].reset;
        lptr[i] = &lim[i];
    }
    pol.limits = lptr;
    pol.n_limits = nlimits;
    req.policy = &pol;
    req.clear = clear;
    Colld__V1__SetPolicyResponse *resp = NULL;
    if (call(c, "policy", "/colld.v1.Colld/SetPolicy", &req.base, &colld__v1__set_policy_response__descriptor,
             (ProtobufCMessage **)&resp))
        return 1;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return 0;
}

static int cmd_abort(colld_client_t *c, uint64_t comm, const char *reason)
{
    Colld__V1__CommAbortRequest req = COLLD__V1__COMM_ABORT_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    req.comm_id = comm;
    req.reason = (char *)(reason ? reason : "");
    Colld__V1__CommAbortResponse *resp = NULL;
    if (call(c, "abort", "/colld.v1.Colld/CommAbort", &req.base, &colld__v1__comm_abort_response__descriptor,
             (ProtobufCMessage **)&resp))
        return 1;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    printf("communicator %llu aborted\n", (unsigned long long)comm);
    return 0;
}

static int cmd_peer_disconnect(colld_client_t *c, const char *peer)
{
    Colld__V1__PeerDisconnectRequest req = COLLD__V1__PEER_DISCONNECT_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    req.peer = (char *)peer;
    Colld__V1__PeerDisconnectResponse *resp = NULL;
    if (call(c, "peer disconnect", "/colld.v1.Colld/PeerDisconnect", &req.base,
             &colld__v1__peer_disconnect_response__descriptor, (ProtobufCMessage **)&resp))
        return 1;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    printf("connections to peer %s closed\n", peer);
    return 0;
}

/* ============================================================================================
 * Command line
 * ========================================================================================== */

/* A non-negative integer option value. Returns 0 or prints why not and returns -1. */
static int parse_uint(const char *opt, const char *text, long long max, long long *out)
{
    char *end;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : -1;
    if (!text || end == text || *end || errno || v < 0 || v > max) {
        fprintf(stderr, "collctl: %s expects a number 0..%lld, got '%s'\n", opt, max, text ? text : "");
        return -1;
    }
    *out = v;
    return 0;
}

/* A multi-node all-reduce algorithm name, as the daemon accepts it. Returns 0 or prints why not and
 * returns -1. */
static int check_net_algo(const char *text)
{
    static const char *const algos[] = { "auto", "ring", "rd" };
    for (size_t i = 0; text && i < sizeof(algos) / sizeof(algos[0]); i++)
        if (strcmp(text, algos[i]) == 0)
            return 0;
    fprintf(stderr, "collctl: --net-algo expects auto, ring or rd, got '%s'\n", text ? text : "");
    return -1;
}

#define MAX_ARGS 8

/* The per-tenant limits collctl policy set accepts (the daemon's --max-*-per-tenant options). */
static const char *const limit_names[] = {
    "max-sessions-per-tenant", "max-comms-per-tenant", "max-joining-ranks-per-tenant", "max-regs-per-tenant",
    "max-registered-bytes-per-tenant", "max-event-followers-per-tenant", "max-rpc-conns-per-tenant",
    "max-daemon-bytes-per-tenant",
};

/* A limit option: --NAME VALUE with VALUE a number (K/M/G/T suffixes, powers of 1024) or
 * "default". Returns 1 when `opt` is not a limit option, 0 when parsed into *out, -1 (printed)
 * when it is one with a bad value. */
static int parse_limit(const char *opt, const char *text, limit_arg_t *out)
{
    size_t i = 0;
    while (i < (sizeof(limit_names) / sizeof(limit_names[0])) && (strncmp(opt, "--", 2) != 0 || strcmp(opt + 2, limit_names[i]) != 0))
        i++;
    if (i == (sizeof(limit_names) / sizeof(limit_names[0])))
        return 1;
    *out = (limit_arg_t){ .name = limit_names[i] };
    if (text && strcmp(text, "default") == 0) {
        out->reset = true;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long v = text && *text != '-' ? strtoull(text, &end, 10) : 0;
    unsigned shift = 0;
    if (text && end != text && *end && !end[1]) {
        const char *units = "KMGT", *u = strchr(units, *end == 'k' ? 'K' : *end);
        shift = u ? 10u * (unsigned)(u - units + 1) : 0;
        end += u ? 1 : 0;
    }
    if (!text || end == text || *end || errno || (shift && v > (UINT64_MAX - 1) >> shift)) {
        fprintf(stderr, "collctl: %s expects a number (K/M/G/T suffixes allowed) or 'default', got '%s'\n", opt,
                text ? text : "");
        return -1;
    }
    out->value = (uint64_t)v << shift;
    if (out->value == UINT64_MAX) {
        fprintf(stderr, "collctl: %s: %s is too large\n", opt, text);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *socket = NULL, *reason = NULL, *net_algo = NULL;
    const char *args[MAX_ARGS];
    limit_arg_t limits[MAX_LIMIT_ARGS];
    size_t nlimits = 0;
    int nargs = 0, json = 0, follow = 0, only_new = 0, watch = 0;
    long long backlog = 0, max_timeout = -1, interval = 2, count = 0, since = 3600, stuck_ms = 1000, straggler_ms = 10;
    long long node_timeout_ms = 2000;
    bool doctor_local = false;
    const char *verify = NULL;
    uint64_t probe_bytes = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--socket") == 0 && i + 1 < argc)
            socket = argv[++i];
        else if (strncmp(a, "--socket=", 9) == 0)
            socket = a + 9;
        else if (strcmp(a, "--json") == 0)
            json = 1;
        else if (strcmp(a, "--follow") == 0 || strcmp(a, "-f") == 0)
            follow = 1;
        else if (strcmp(a, "--new") == 0)
            only_new = 1;
        else if (strcmp(a, "--watch") == 0 || strcmp(a, "-w") == 0)
            watch = 1;
        else if (strcmp(a, "--interval") == 0) {
            if (parse_uint(a, i + 1 < argc ? argv[++i] : NULL, 86400, &interval) < 0)
                return 2;
            if (interval == 0) {
                fprintf(stderr, "collctl: --interval must be at least 1 second\n");
                return 2;
            }
        } else if (strcmp(a, "--count") == 0) {
            if (parse_uint(a, i + 1 < argc ? argv[++i] : NULL, INT32_MAX, &count) < 0)
                return 2;
        } else if (strcmp(a, "--version") == 0) {
            printf("collctl %s\n", COLLD_VERSION_STRING);
            return 0;
        }
        else if (strcmp(a, "--backlog") == 0) {
            if (parse_uint(a, i + 1 < argc ? argv[++i] : NULL, UINT32_MAX, &backlog) < 0)
                return 2;
        } else if (strcmp(a, "--max-timeout-ms") == 0) {
            if (parse_uint(a, i + 1 < argc ? argv[++i] : NULL, INT32_MAX, &max_timeout) < 0)
                return 2;
        } else if (strcmp(a, "--net-algo") == 0) {
            net_algo = i + 1 < argc ? argv[++i] : NULL;
            if (check_net_algo(net_algo) < 0)
                return 2;
        } else if (strncmp(a, "--max-", 6) == 0 && strcmp(a, "--max-timeout-ms") != 0) {
            limit_arg_t l;
            int r = parse_limit(a, i + 1 < argc ? argv[i + 1] : NULL, &l);
            if (r == 1) {
                fprintf(stderr, "collctl: unknown limit '%s'\n%s", a, USAGE);
                return 2;
            }
            if (r < 0)
                return 2;
            i++;
            for (size_t k = 0; k < nlimits; k++)
                if (limits[k].name == l.name) {
                    fprintf(stderr, "collctl: %s given twice\n", a);
                    return 2;
                }
            limits[nlimits++] = l;
        } else if (strcmp(a, "--since") == 0) {
            if (parse_uint(a, i + 1 < argc ? argv[++i] : NULL, 86400LL * 365, &since) < 0)
                return 2;
        } else if (strcmp(a, "--stuck-ms") == 0) {
            if (parse_uint(a, i + 1 < argc ? argv[++i] : NULL, 86400000, &stuck_ms) < 0)
                return 2;
        } else if (strcmp(a, "--straggler-ms") == 0) {
            if (parse_uint(a, i + 1 < argc ? argv[++i] : NULL, 86400000, &straggler_ms) < 0)
                return 2;
        } else if (strcmp(a, "--local") == 0) {
            doctor_local = true;
        } else if (strcmp(a, "--node-timeout-ms") == 0) {
            if (parse_uint(a, i + 1 < argc ? argv[++i] : NULL, 30000, &node_timeout_ms) < 0)
                return 2;
            if (node_timeout_ms < 50) {
                fprintf(stderr, "collctl: --node-timeout-ms must be 50..30000\n");
                return 2;
            }
        } else if (strcmp(a, "--verify-results") == 0) {
            verify = i + 1 < argc ? argv[++i] : "";
            if (strcmp(verify, "on") != 0 && strcmp(verify, "off") != 0) {
                fprintf(stderr, "collctl: --verify-results expects on or off, got '%s'\n", verify);
                return 2;
            }
        } else if (strcmp(a, "--bytes") == 0) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            char *end;
            unsigned long long n = strtoull(v, &end, 10);
            unsigned long long mul = *end == 'K' || *end == 'k' ? 1024ull : *end == 'M' || *end == 'm' ? 1048576ull : 1;
            if (end == v || (mul > 1 && end[1]) || (mul == 1 && *end) || n == 0 || n > (64ull << 20) / mul ||
                n * mul < (256ull << 10)) {
                fprintf(stderr, "collctl: --bytes needs a size from 256K to 64M (K and M suffixes), not '%s'\n", v);
                return 2;
            }
            probe_bytes = n * mul;
        } else if (strcmp(a, "--reason") == 0 && i + 1 < argc)
            reason = argv[++i];
        else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        } else if (a[0] == '-' || nargs == MAX_ARGS) {
            fprintf(stderr, "collctl: unexpected argument '%s'\n%s", a, USAGE);
            return 2;
        } else
            args[nargs++] = a;
    }
    if (nargs == 0) {
        fprintf(stderr, "collctl: no command given\n%s", USAGE);
        return 2;
    }
    const char *cmd = args[0];
    uint64_t comm = 0;
    long long uid = 0;
    int policy_mode = 0; /* 0 show, 1 set, 2 clear */
    if (watch && strcmp(cmd, "status") != 0) {
        fprintf(stderr, "collctl: --watch goes with status only\n");
        return 2;
    }
    if (strcmp(cmd, "status") == 0 || strcmp(cmd, "events") == 0 || strcmp(cmd, "doctor") == 0 ||
        strcmp(cmd, "probe") == 0) {
        if (nargs != 1)
            goto usage;
    } else if (strcmp(cmd, "trace") == 0 || strcmp(cmd, "abort") == 0) {
        if (nargs != 2)
            goto usage;
        if (parse_comm(args[1], &comm) < 0)
            return 2;
    } else if (strcmp(cmd, "policy") == 0) {
        if (nargs == 1)
            policy_mode = 0;
        else if (nargs == 3 && (strcmp(args[1], "set") == 0 || strcmp(args[1], "clear") == 0)) {
            policy_mode = strcmp(args[1], "set") == 0 ? 1 : 2;
            if (parse_uint("UID", args[2], UINT32_MAX - 1, &uid) < 0)
                return 2;
            if (policy_mode == 1 && max_timeout < 0 && !net_algo && !verify && !nlimits) {
                fprintf(stderr, "collctl: policy set UID needs --max-timeout-ms MS, --net-algo ALGO, --verify-results "
                                "on|off and/or a limit (--max-regs-per-tenant N, ...)\n");
                return 2;
            }
            if (policy_mode == 1 && max_timeout == 0) {
                fprintf(stderr, "collctl: --max-timeout-ms must be at least 1\n");
                return 2;
            }
        } else
            goto usage;
    } else if (strcmp(cmd, "peer") == 0) {
        if (nargs != 3 || strcmp(args[1], "disconnect") != 0 || !*args[2])
            goto usage;
    } else {
        fprintf(stderr, "collctl: unknown command '%s'\n%s", cmd, USAGE);
        return 2;
    }

    if (watch)
        return cmd_status_watch(NULL, socket, json, interval, count);
    colld_client_t *c;
    colld_status_t st = colld__connect_role(socket, COLLD_ROLE_ADMIN, &c);
    if (st != COLLD_OK) {
        fprintf(stderr, "collctl: cannot reach colld: %s: %s\n", colld_status_name(st), colld_status_string(st));
        return 1;
    }
    int rc;
    if (strcmp(cmd, "status") == 0)
        rc = cmd_status(c, json);
    else if (strcmp(cmd, "trace") == 0)
        rc = cmd_trace(c, comm, json);
    else if (strcmp(cmd, "events") == 0)
        rc = cmd_events(c, follow, (uint32_t)backlog, only_new, json);
    else if (strcmp(cmd, "abort") == 0)
        rc = cmd_abort(c, comm, reason);
    else if (strcmp(cmd, "peer") == 0)
        rc = cmd_peer_disconnect(c, args[2]);
    else if (strcmp(cmd, "doctor") == 0)
        rc = collctl_doctor(c, &(collctl_doctor_opts_t){ .json = json,
                                                         .since_s = since,
                                                         .stuck_ms = stuck_ms,
                                                         .straggler_ms = straggler_ms,
                                                         .local = doctor_local,
                                                         .node_timeout_ms = node_timeout_ms });
    else if (strcmp(cmd, "probe") == 0)
        rc = collctl_probe(c, json, probe_bytes);
    else if (policy_mode == 0)
        rc = cmd_policy_show(c, json);
    else
        rc = cmd_policy_set(c, (uint32_t)uid, max_timeout > 0 ? (int)max_timeout : 0, net_algo, verify, limits, nlimits,
                            policy_mode == 2);
    colld_disconnect(c);
    return rc;
usage:
    fprintf(stderr, "collctl: wrong arguments for '%s'\n%s", cmd, USAGE);
    return 2;
}
