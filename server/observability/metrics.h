/*
 * metrics.h - the daemon's Prometheus metrics: an HTTP endpoint (GET /metrics, text exposition
 * format 0.0.4) served by the daemon's libuv loop when --metrics HOST:PORT is given, showing the
 * core's counters (server/core/counters.h) and gauges walked from the daemon's state; and the
 * health endpoint (--health HOST:PORT: /healthz and /readyz on a listener of their own).
 */
#ifndef COLLD_SERVER_METRICS_H
#define COLLD_SERVER_METRICS_H

#include <colld/colld.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct colld_daemon colld_daemon_t;
typedef struct colld_metrics colld_metrics_t;

/* Create the endpoint's object (d->metrics), not serving yet. Returns 0 or -1 (no memory). */
int colld_metrics_create(colld_daemon_t *d);
/* Free it. NULL-safe. */
void colld_metrics_destroy(colld_daemon_t *d);

/* The module: what the metrics count of every communicator's life (formed, faulted). */
extern const struct colld_comm_hooks colld_metrics_hooks;

/* Start serving on d->cfg.metrics_addr and d->cfg.health_addr, those that are set (loop thread,
 * before uv_run). Returns 0, or -1 with a logged reason (bad address, port in use); then neither
 * serves. */
int colld_metrics_start(colld_daemon_t *d);
/* Stop serving: close the listeners and every open connection (loop thread). */
void colld_metrics_stop(colld_daemon_t *d);
/* The endpoint's URL with the port actually bound ("http://127.0.0.1:9464/metrics"), or NULL when
 * it is not serving. */
const char *colld_metrics_url(const colld_daemon_t *d);
/* The health endpoint's URL ("http://127.0.0.1:9465/healthz"), or NULL when it is not serving. */
const char *colld_metrics_health_url(const colld_daemon_t *d);
/* Why the last colld_metrics_start failed, for the start-up message on stderr. */
const char *colld_metrics_error(const colld_daemon_t *d);

/* Bytes of request line and headers the endpoint reads at most (more: 431). */
#define COLLD_METRICS_HTTP_REQUEST_MAX 8192
/* The endpoint's HTTP request parser (pure; the fuzzers call it). The end of the request headers
 * in buf: the byte after the blank line, 0 when it has not arrived yet. */
size_t colld_metrics_http_header_end(const char *buf, size_t len);
/* What a request asks for. */
typedef enum { COLLD_HTTP_METRICS = 0, COLLD_HTTP_HEALTHZ = 1, COLLD_HTTP_READYZ = 2 } colld_http_route_t;
/* A complete request (through `end`): 200 for GET or HEAD (*head) of /metrics, /healthz or
 * /readyz (*route), else the error status to answer (400, 404, 405, 505). */
int colld_metrics_http_request(const char *req, size_t end, colld_http_route_t *route, bool *head);

#endif /* COLLD_SERVER_METRICS_H */
