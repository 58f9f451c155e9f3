/*
 * http.h - the daemon's small HTTP/1.1 server on its libuv loop: one listening socket, its
 * connections, their deadlines and the bounds that keep held connections from crowding out real
 * clients. What a request means is the caller's (metrics.c answers /metrics, /healthz, /readyz).
 *
 * A connection reads one request (request line and headers, at most COLLD_HTTP_REQUEST_MAX
 * bytes, within the server's request deadline), is handed to the caller, which answers it with
 * colld_http_respond, has the response deadline to take the answer, and is closed. Everything
 * runs on the loop thread.
 */
#ifndef COLLD_SERVER_HTTP_H
#define COLLD_SERVER_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

/* Bytes of request line and headers read at most (more: 431). */
#define COLLD_HTTP_REQUEST_MAX 8192

typedef struct colld_http_server colld_http_server_t;
typedef struct colld_http_conn colld_http_conn_t;

/* A complete request arrived on c: req holds it through the blank line at `end` (valid during
 * the call). The handler must answer it with colld_http_respond (at once: c has no other state). */
typedef void (*colld_http_handler_fn)(void *arg, colld_http_conn_t *c, const char *req, size_t end);

typedef struct {
    const char *name;        /* in log lines: "metrics", "health" */
    unsigned max_conns;      /* connections open at once */
    unsigned max_per_source; /* of them from one source address */
    int request_ms;          /* the whole request must arrive this soon after the accept */
    int response_ms;         /* the answer must be taken this soon after the request */
    int stalled_ms;          /* a connection answered this long ago that still holds its place may
                                be closed for a newcomer (it does not take its answer) */
    bool evict_any;          /* any connection may be closed for a newcomer: its answers are tiny,
                                so a newcomer is never refused (the health listener) */
    colld_http_handler_fn handler;
    void *arg;
} colld_http_config_t;

/* What a server did to protect itself, for the metrics. */
typedef struct {
    uint64_t evicted; /* connections closed to make room for a newcomer */
    uint64_t refused; /* newcomers closed at once: every place of their address or of all taken
                         by connections that may not be closed yet */
} colld_http_stats_t;

/* Listen on sa and serve on loop (loop thread). Returns 0, or -1 with the reason in err (the
 * address in use, no memory); then there is nothing to stop. */
int colld_http_start(uv_loop_t *loop, const struct sockaddr *sa, const colld_http_config_t *cfg,
                     colld_http_server_t **out, char *err, size_t err_len);
/* Close the listener and every connection; the server's memory goes once the loop has run their
 * close callbacks (loop thread). NULL-safe. */
void colld_http_stop(colld_http_server_t *s);
/* The address it listens on (the port the kernel chose for port 0). Returns 0 or -1. */
int colld_http_bound(const colld_http_server_t *s, struct sockaddr_storage *out);
colld_http_stats_t colld_http_stats(const colld_http_server_t *s);

/* Answer c and close it after the answer. body: heap memory c takes (NULL: a one-line text body
 * naming the status); head_only: HEAD, no body sent; content_type of a 200 (others are text). */
void colld_http_respond(colld_http_conn_t *c, int code, char *body, size_t body_len, bool head_only,
                        const char *content_type);

#endif /* COLLD_SERVER_HTTP_H */
