/*
 * counters.h - what the daemon counts: operations and bytes by kind x dtype x status, latency
 * histograms per kind, communicator errors by status, sessions opened, communicators formed.
 *
 * The core counts (the engine and the registry, with daemon->lock held); the metrics endpoint
 * (server/observability/metrics.c) shows the counts in the Prometheus text format, with the label
 * spaces below. Counting costs a few adds per operation, whether or not anyone scrapes.
 */
#ifndef COLLD_SERVER_CORE_COUNTERS_H
#define COLLD_SERVER_CORE_COUNTERS_H

#include <colld/colld.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct colld_daemon colld_daemon_t;

/* Label spaces: collective kinds 1..COLLD_KIND_MAX and "unknown"; dtypes 0..9 and "unknown"; every status of
 * COLLD_STATUS_LIST and one for values outside it; 22 latency buckets (1-2.5-5 per decade from
 * 1 us to 10 s) and one above. */
#define COLLD_COUNT_NKIND 11u
#define COLLD_COUNT_NDTYPE 11u
enum {
#define COLLD_COUNT_STATUS_INDEX_(name, value, text) COLLD_COUNT_STATUS_##name,
    COLLD_STATUS_LIST(COLLD_COUNT_STATUS_INDEX_)
#undef COLLD_COUNT_STATUS_INDEX_
        COLLD_COUNT_NSTATUS_KNOWN
};
#define COLLD_COUNT_NSTATUS ((unsigned)COLLD_COUNT_NSTATUS_KNOWN + 1u)
#define COLLD_COUNT_NBUCKET 22u

typedef struct {
    uint64_t bucket[COLLD_COUNT_NBUCKET + 1]; /* per bucket, not cumulative; the last one is > 10 s */
    uint64_t sum_ns;
    uint64_t count;
} colld_latency_hist_t;

/* The counts (daemon->counters, daemon->lock). */
typedef struct colld_counters {
    uint64_t ops[COLLD_COUNT_NKIND][COLLD_COUNT_NDTYPE][COLLD_COUNT_NSTATUS];
    uint64_t bytes[COLLD_COUNT_NKIND][COLLD_COUNT_NDTYPE][COLLD_COUNT_NSTATUS];
    colld_latency_hist_t latency[COLLD_COUNT_NKIND];
    uint64_t comm_errors[COLLD_COUNT_NSTATUS];
    uint64_t sessions_opened;
    uint64_t comms_formed;
    uint64_t created_ns; /* for colld_uptime_seconds */
} colld_counters_t;

/* Allocate the counters (d->counters). Returns 0 or -1 (no memory). */
int colld_counters_create(colld_daemon_t *d);
/* Free them. NULL-safe. */
void colld_counters_destroy(colld_daemon_t *d);

/* One rank's operation finished (executed or failed), counted per posted descriptor.
 * kind/dtype may be out of range for garbage descriptors: they are counted under "unknown".
 * bytes: the operation's payload per rank (count x dtype size), 0 when unknown. */
void colld_count_op(colld_daemon_t *d, unsigned kind, unsigned dtype, uint64_t bytes, colld_status_t st);
/* n successful operations moving `bytes` in all (collectives the ranks ran on a fast area). */
void colld_count_ops_add(colld_daemon_t *d, unsigned kind, unsigned dtype, uint64_t n, uint64_t bytes);
/* One collective executed: latency from its first rank's arrival to its completion. */
void colld_count_latency(colld_daemon_t *d, unsigned kind, uint64_t ns);
/* A communicator broke with this error (counted once per communicator, the first fault). */
void colld_count_comm_error(colld_daemon_t *d, colld_status_t st);
/* Sessions attached since start, communicators formed since start. */
void colld_count_session_opened(colld_daemon_t *d);
void colld_count_comm_formed(colld_daemon_t *d);

/* The labels of the indices above. */
const char *colld_count_kind_label(unsigned k);
const char *colld_count_dtype_label(unsigned t);
const char *colld_count_status_label(unsigned s);
/* Whether status index s is a known error (its series is shown even at 0). */
bool colld_count_status_is_error(unsigned s);
/* The upper bound of latency bucket i, as the "le" label ("2.5e-06"). */
const char *colld_count_bucket_le(unsigned i);

#endif /* COLLD_SERVER_CORE_COUNTERS_H */
