/*
 * http.c - the daemon's small HTTP/1.1 server (http.h): a listener on the daemon's libuv loop,
 * its connections, their deadlines, and who is closed when every place is taken.
 *
 * A connection goes READING -> WRITING -> DRAINING -> CLOSING. DRAINING: the response is sent
 * and our side shut down; what the client still sends is read and dropped until it closes, so an
 * unread request tail cannot turn our close into a reset that destroys the response. One timer
 * bounds each phase: the request must arrive within request_ms of the accept, the answer be taken
 * (and the client close) within response_ms of the request.
 *
 * Held connections must not starve real clients. A server holds at most max_conns connections,
 * at most max_per_source of them from one address. A newcomer over either bound closes an older
 * connection if one may go (of its own address when that is the bound it hit, else of the address
 * holding the most): first one still waiting for its request (a slowloris), then one answered at
 * least stalled_ms ago that still holds its place (a client that does not take its answer, e.g.
 * with a tiny receive window); the oldest of them. With evict_any (answers too small to be held)
 * every connection may go and a newcomer is never refused. Otherwise, when every place is being
 * answered right now, the newcomer is closed at once. So one address can hold at most
 * max_per_source places, a client from elsewhere finds room, and a scraper that shares an
 * attacker's address still gets in once the attacker's connections have stalled.
 */
#include "server/observability/http.h"

#include "server/observability/metrics.h" /* the request parser's declarations */

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEXT_CONTENT_TYPE "text/plain; charset=utf-8"

_Static_assert(COLLD_HTTP_REQUEST_MAX == COLLD_METRICS_HTTP_REQUEST_MAX, "the parser and the reader agree");

typedef enum {
    CONN_READING,
    CONN_WRITING,
    CONN_DRAINING,
    CONN_CLOSING,
} conn_phase_t;

struct colld_http_server {
    colld_http_config_t cfg;
    uv_tcp_t listener;
    bool listening;             /* the listener is open */
    int handles;                /* the listener and every connection not yet freed; freed at 0 */
    colld_http_conn_t *conns;   /* every connection not yet freed */
    unsigned nconns;            /* of them, those that hold a place */
    uint64_t accepted;          /* connections accepted so far (their order) */
    bool accept_pending;        /* a connection could not be accepted for lack of memory */
    colld_http_stats_t stats;
};

struct colld_http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    colld_http_server_t *s;
    conn_phase_t phase;
    bool counted;                 /* holds a place */
    struct sockaddr_storage peer; /* its address (family 0: unknown) */
    uint64_t seq;                 /* accept order */
    uint64_t answered_ms;         /* loop time of the answer (WRITING, DRAINING) */
    int open_handles;             /* handles not yet closed; freed at 0 */
    uv_write_t write_req;
    uv_shutdown_t shutdown_req;
    char head[512];               /* status line and headers of the response */
    char *body;                   /* response body (heap), NULL if none */
    size_t body_len;
    size_t len;                   /* request bytes read */
    char req[COLLD_HTTP_REQUEST_MAX];
    colld_http_conn_t *prev, *next;
};

static int accept_one(colld_http_server_t *s);

/* ============================================================================================
 * Connections
 * ========================================================================================== */

/* One of the server's handles is gone: free it after the last one. */
static void server_unref(colld_http_server_t *s)
{
    if (--s->handles == 0)
        free(s);
}

static void conn_on_close(uv_handle_t *h)
{
    colld_http_conn_t *c = h->data;
    if (--c->open_handles > 0)
        return;
    colld_http_server_t *s = c->s;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c->body);
    free(c);
    if (s->accept_pending && s->listening) {
        /* Memory may be back: take the connection libuv holds for us (accept_one tells). */
        s->accept_pending = false;
        if (accept_one(s) < 0)
            s->accept_pending = true;
    }
    server_unref(s);
}

/* Close a connection (idempotent); it is freed once both handles are closed, and its place is
 * free at once. */
static void conn_close(colld_http_conn_t *c)
{
    if (c->phase == CONN_CLOSING)
        return;
    if (c->counted)
        c->s->nconns--;
    c->counted = false;
    c->phase = CONN_CLOSING;
    uv_close((uv_handle_t *)&c->tcp, conn_on_close);
    uv_close((uv_handle_t *)&c->timer, conn_on_close);
}

static void conn_on_deadline(uv_timer_t *t)
{
    colld_http_conn_t *c = t->data;
    LOG_DEBUG(ADMIN, "%s: closing a connection: %s within %d ms", c->s->cfg.name,
              c->phase == CONN_READING ? "no complete request" : "response not taken",
              c->phase == CONN_READING ? c->s->cfg.request_ms : c->s->cfg.response_ms);
    conn_close(c);
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    colld_http_conn_t *c = h->data;
    (void)suggested;
    if (c->phase == CONN_DRAINING)
        *buf = uv_buf_init(c->req, sizeof(c->req)); /* discarded */
    else
        *buf = uv_buf_init(c->req + c->len, (unsigned)(sizeof(c->req) - c->len));
}

static void conn_on_drain_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    if (nread < 0) /* EOF or error: the client is done */
        conn_close(st->data);
}

static void conn_on_shutdown(uv_shutdown_t *req, int status)
{
    colld_http_conn_t *c = req->data;
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
    colld_http_conn_t *c = req->data;
    if (c->phase != CONN_WRITING)
        return; /* closed meanwhile (UV_ECANCELED) */
    if (status < 0) {
        LOG_DEBUG(ADMIN, "%s: cannot send a response: %s", c->s->cfg.name, uv_strerror(status));
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

/* Send a response and close after it (see http.h). */
void colld_http_respond(colld_http_conn_t *c, int code, char *body, size_t body_len, bool head_only,
                        const char *content_type)
{
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->phase = CONN_WRITING;
    c->answered_ms = uv_now(c->tcp.loop);
    uv_timer_start(&c->timer, conn_on_deadline, (uint64_t)c->s->cfg.response_ms, 0);
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
                     code, reason_phrase(code), code == 200 && content_type ? content_type : TEXT_CONTENT_TYPE,
                     body_len, code == 405 ? "Allow: GET, HEAD\r\n" : "");
    uv_buf_t bufs[2] = { uv_buf_init(c->head, (unsigned)n), uv_buf_init(body, (unsigned)body_len) };
    c->write_req.data = c;
    if (uv_write(&c->write_req, (uv_stream_t *)&c->tcp, bufs, head_only || !body_len ? 1 : 2, conn_on_write) < 0)
        conn_close(c);
}

/* Find the end of the request headers: the byte after "\r\n\r\n" (or a bare "\n\n"), 0 if not
 * there yet. Declared in metrics.h (the fuzzers call it). */
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

static void conn_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    colld_http_conn_t *c = st->data;
    (void)buf;
    if (nread < 0) {
        if (nread != UV_EOF)
            LOG_DEBUG(ADMIN, "%s: read: %s", c->s->cfg.name, uv_strerror((int)nread));
        conn_close(c);
        return;
    }
    if (c->phase != CONN_READING || nread == 0)
        return;
    size_t from = c->len > 3 ? c->len - 3 : 0; /* a terminator may straddle two reads */
    c->len += (size_t)nread;
    size_t end = colld_metrics_http_header_end(c->req + from, c->len - from);
    if (end) {
        c->s->cfg.handler(c->s->cfg.arg, c, c->req, from + end);
        return;
    }
    if (c->len == sizeof(c->req))
        colld_http_respond(c, 431, NULL, 0, false, NULL);
}

/* ============================================================================================
 * Who gets a place
 * ========================================================================================== */

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

/* How much a connection may be closed for a newcomer: 0 not at all, 1 answered and stalled, 2
 * still without its request (closed first). */
static int evictable(const colld_http_server_t *s, const colld_http_conn_t *c, uint64_t now)
{
    if (!c->counted || c->phase == CONN_CLOSING)
        return 0;
    if (c->phase == CONN_READING)
        return 2;
    return s->cfg.evict_any || now >= c->answered_ms + (uint64_t)s->cfg.stalled_ms ? 1 : 0;
}

/* Places held by connections from the address of `like`. */
static unsigned held_by(const colld_http_server_t *s, const struct sockaddr_storage *like)
{
    unsigned n = 0;
    for (const colld_http_conn_t *o = s->conns; o; o = o->next)
        n += o->counted && same_host(&o->peer, like);
    return n;
}

/* The connection to close for a newcomer (see the top of this file): of those from `only`'s
 * address (NULL: any address), the most evictable, then from the address holding the most
 * places, then the oldest. NULL when none may go. */
static colld_http_conn_t *eviction_victim(colld_http_server_t *s, const struct sockaddr_storage *only)
{
    colld_http_conn_t *victim = NULL;
    int victim_rank = 0;
    unsigned victim_count = 0;
    uint64_t now = uv_now(s->listener.loop);
    for (colld_http_conn_t *c = s->conns; c; c = c->next) {
        int rank = evictable(s, c, now);
        if (!rank || (only && !same_host(&c->peer, only)))
            continue;
        unsigned count = only ? 0 : held_by(s, &c->peer);
        if (!victim || rank > victim_rank || (rank == victim_rank && count > victim_count) ||
            (rank == victim_rank && count == victim_count && c->seq < victim->seq)) {
            victim = c;
            victim_rank = rank;
            victim_count = count;
        }
    }
    return victim;
}

/* Make room for the newcomer c: close an older connection when c's address or the whole server
 * is at its bound. False when c must go instead. */
static bool make_room(colld_http_server_t *s, colld_http_conn_t *c)
{
    bool source_full = c->peer.ss_family && held_by(s, &c->peer) >= s->cfg.max_per_source;
    if (!source_full && s->nconns < s->cfg.max_conns)
        return true;
    colld_http_conn_t *victim = eviction_victim(s, source_full ? &c->peer : NULL);
    if (!victim) {
        s->stats.refused++;
        LOG_WARN_RL(ADMIN, "%s: %s connections are all being answered; closing a new one (%llu so far)",
                    s->cfg.name, source_full ? "its address's" : "all", (unsigned long long)s->stats.refused);
        return false;
    }
    s->stats.evicted++;
    LOG_INFO_RL(ADMIN, "%s: %s; closed an older connection %s to serve a new one (%llu so far)", s->cfg.name,
                source_full ? "an address holds its most connections" : "every connection place is taken",
                victim->phase == CONN_READING ? "still without a request" : "not taking its answer",
                (unsigned long long)s->stats.evicted);
    conn_close(victim);
    return true;
}

/* Accept one connection from the listener; returns -1 when there is no memory for it (the
 * connection then stays in libuv's hands until the next try). */
static int accept_one(colld_http_server_t *s)
{
    colld_http_conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return -1;
    c->s = s;
    c->tcp.data = c;
    c->timer.data = c;
    uv_tcp_init(s->listener.loop, &c->tcp);
    uv_timer_init(s->listener.loop, &c->timer);
    c->open_handles = 2;
    s->handles++;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    c->phase = CONN_READING;
    int rc = uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)&c->tcp);
    if (rc < 0) {
        LOG_DEBUG(ADMIN, "%s: accept: %s", s->cfg.name, uv_strerror(rc));
        conn_close(c);
        return 0;
    }
    int plen = (int)sizeof(c->peer);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->peer, &plen) < 0)
        c->peer.ss_family = 0;
    c->seq = ++s->accepted;
    if (!make_room(s, c)) {
        conn_close(c);
        return 0;
    }
    c->counted = true;
    s->nconns++;
    uv_tcp_nodelay(&c->tcp, 1);
    if (uv_timer_start(&c->timer, conn_on_deadline, (uint64_t)s->cfg.request_ms, 0) < 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read) < 0)
        conn_close(c);
    return 0;
}

static void on_connection(uv_stream_t *server, int status)
{
    colld_http_server_t *s = server->data;
    if (status < 0) {
        LOG_WARN_RL(ADMIN, "%s: listener: %s", s->cfg.name, uv_strerror(status));
        return;
    }
    if (accept_one(s) < 0) {
        LOG_WARN_RL(ADMIN, "%s: out of memory accepting a connection; will retry", s->cfg.name);
        s->accept_pending = true;
    }
}

/* ============================================================================================
 * Start and stop
 * ========================================================================================== */

static void listener_on_close(uv_handle_t *h)
{
    server_unref(h->data);
}

int colld_http_start(uv_loop_t *loop, const struct sockaddr *sa, const colld_http_config_t *cfg,
                     colld_http_server_t **out, char *err, size_t err_len)
{
    colld_http_server_t *s = calloc(1, sizeof(*s));
    if (!s) {
        colld_set_err(err, err_len, "out of memory");
        return -1;
    }
    s->cfg = *cfg;
    int rc = uv_tcp_init(loop, &s->listener);
    if (rc < 0) {
        colld_set_err(err, err_len, "%s", uv_strerror(rc));
        free(s);
        return -1;
    }
    s->listener.data = s;
    s->listening = true;
    s->handles = 1;
    rc = uv_tcp_bind(&s->listener, sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 128, on_connection);
    if (rc < 0) {
        colld_set_err(err, err_len, "cannot listen: %s%s", uv_strerror(rc),
                      rc == UV_EADDRINUSE ? " (another process uses the port; choose another, or 0 for any free one)"
                                          : "");
        colld_http_stop(s);
        return -1;
    }
    *out = s;
    return 0;
}

void colld_http_stop(colld_http_server_t *s)
{
    if (!s || !s->listening)
        return;
    s->listening = false;
    for (colld_http_conn_t *c = s->conns; c; c = c->next)
        conn_close(c);
    uv_close((uv_handle_t *)&s->listener, listener_on_close);
}

int colld_http_bound(const colld_http_server_t *s, struct sockaddr_storage *out)
{
    int len = (int)sizeof(*out);
    return s && uv_tcp_getsockname(&s->listener, (struct sockaddr *)out, &len) == 0 ? 0 : -1;
}

colld_http_stats_t colld_http_stats(const colld_http_server_t *s)
{
    colld_http_stats_t none = { 0 };
    return s ? s->stats : none;
}
