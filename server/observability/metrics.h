/*
 * metrics.h - the daemon's Prometheus metrics: counters kept under daemon->lock by the engine
 * and the communicator registry, and an HTTP endpoint (GET /metrics, text exposition format
 * 0.0.4) served by the daemon's libuv loop when --metrics HOST:PORT is given.
 *
 * The counters exist whether or not the endpoint is enabled (they cost a few adds per operation).
 * Every colld_metrics_* update function is called with daemon->lock held.
 */
#ifndef COLLD_SERVER_METRICS_H
#define COLLD_SERVER_METRICS_H

#include <colld/colld.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct colld_daemon colld_daemon_t;
typedef struct colld_metrics colld_metrics_t;

/* Allocate the counters (d->metrics). Returns 0 or -1 (no memory). */
int colld_metrics_create(colld_daemon_t *d);
/* Free the counters. NULL-safe. */
void colld_metrics_destroy(colld_daemon_t *d);

/* One rank's operation finished (executed or failed), counted per posted descriptor.
 * kind/dtype may be out of range for garbage descriptors: they are counted under "unknown".
 * bytes: the operation's payload per rank (count x dtype size), 0 when unknown. */
void colld_metrics_op(colld_daemon_t *d, unsigned kind, unsigned dtype, uint64_t bytes, colld_status_t st);
/* n successful operations moving `bytes` in all (collectives the ranks ran on a fast area). */
void colld_metrics_ops_add(colld_daemon_t *d, unsigned kind, unsigned dtype, uint64_t n, uint64_t bytes);
/* One collective executed: latency from its first rank's arrival to its completion. */
void colld_metrics_latency(colld_daemon_t *d, unsigned kind, uint64_t ns);
/* A communicator broke with this error (counted once per communicator, the first fault). */
void colld_metrics_comm_error(colld_daemon_t *d, colld_status_t st);
/* Sessions attached since start, communicators formed since start. */
void colld_metrics_session_opened(colld_daemon_t *d);
void colld_metrics_comm_formed(colld_daemon_t *d);

/* Start serving on d->cfg.metrics_addr if set (loop thread, before uv_run). Returns 0, or -1 with
 * a logged reason (bad address, port in use). */
int colld_metrics_start(colld_daemon_t *d);
/* Stop serving: close the listener and every open connection (loop thread). */
void colld_metrics_stop(colld_daemon_t *d);
/* The endpoint's URL with the port actually bound ("http://127.0.0.1:9464/metrics"), or NULL when
 * it is not serving. */
const char *colld_metrics_url(const colld_daemon_t *d);
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
