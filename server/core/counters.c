/*
 * counters.c - what the daemon counts (see counters.h).
 */
#include "server/core/counters.h"

#include "common/util.h"
#include "server/core/daemon.h"

#include <stdlib.h>


static const colld_status_t status_values[COLLD_COUNT_NSTATUS_KNOWN] = {
#define STATUS_VALUE_(name, value, text) COLLD_##name,
    COLLD_STATUS_LIST(STATUS_VALUE_)
#undef STATUS_VALUE_
};

/* Latency buckets (upper bounds, inclusive). */
static const struct {
    uint64_t ns;
    const char *le;
} buckets[COLLD_COUNT_NBUCKET] = {
    { 1000ull, "1e-06" },     { 2500ull, "2.5e-06" },   { 5000ull, "5e-06" },     { 10000ull, "1e-05" },
    { 25000ull, "2.5e-05" },  { 50000ull, "5e-05" },    { 100000ull, "0.0001" },  { 250000ull, "0.00025" },
    { 500000ull, "0.0005" },  { 1000000ull, "0.001" },  { 2500000ull, "0.0025" }, { 5000000ull, "0.005" },
    { 10000000ull, "0.01" },  { 25000000ull, "0.025" }, { 50000000ull, "0.05" },  { 100000000ull, "0.1" },
    { 250000000ull, "0.25" }, { 500000000ull, "0.5" },  { 1000000000ull, "1" },   { 2500000000ull, "2.5" },
    { 5000000000ull, "5" },   { 10000000000ull, "10" },
};

/* The index of a status in the label space. */
static unsigned status_index(colld_status_t st)
{
    switch (st) {
#define STATUS_CASE_(name, value, text)                                                                                \
    case COLLD_##name:                                                                                                 \
        return COLLD_COUNT_STATUS_##name;
        COLLD_STATUS_LIST(STATUS_CASE_)
#undef STATUS_CASE_
    }
    return COLLD_COUNT_NSTATUS_KNOWN;
}

_Static_assert(COLLD_COUNT_NKIND == COLLD_KIND_MAX + 1, "one label per kind and one for unknown ones");
_Static_assert(COLLD_COUNT_NDTYPE == COLLD_DTYPE_COUNT + 1, "one label per dtype and one for unknown ones");

static unsigned kind_index(unsigned kind)
{
    return kind >= COLLD_KIND_ALLREDUCE && kind <= COLLD_KIND_MAX ? kind - COLLD_KIND_ALLREDUCE : COLLD_COUNT_NKIND - 1;
}

static unsigned dtype_index(unsigned dtype)
{
    return dtype < COLLD_DTYPE_COUNT ? dtype : COLLD_COUNT_NDTYPE - 1;
}

/* The labels are the names (names.c): kind index k is kind COLLD_KIND_ALLREDUCE + k, and the last
 * index of each space is "unknown". */
const char *colld_count_kind_label(unsigned k)
{
    return k < COLLD_COUNT_NKIND - 1 ? colld_kind_name(k + COLLD_KIND_ALLREDUCE) : "unknown";
}

const char *colld_count_dtype_label(unsigned t)
{
    return t < COLLD_COUNT_NDTYPE - 1 ? colld_dtype_name(t) : "unknown";
}

const char *colld_count_status_label(unsigned s)
{
    return s < COLLD_COUNT_NSTATUS_KNOWN ? colld_status_name(status_values[s]) : "COLLD_ERR_UNKNOWN";
}

bool colld_count_status_is_error(unsigned s)
{
    return s < COLLD_COUNT_NSTATUS_KNOWN && status_values[s] < 0;
}

const char *colld_count_bucket_le(unsigned i)
{
    return i < COLLD_COUNT_NBUCKET ? buckets[i].le : "+Inf";
}

int colld_counters_create(colld_daemon_t *d)
{
    colld_counters_t *m = calloc(1, sizeof(*m));
    if (!m)
        return -1;
    m->created_ns = colld_now_ns();
    d->counters = m;
    return 0;
}

void colld_counters_destroy(colld_daemon_t *d)
{
    free(d->counters);
    d->counters = NULL;
}

void colld_count_op(colld_daemon_t *d, unsigned kind, unsigned dtype, uint64_t bytes, colld_status_t st)
{
    colld_counters_t *m = d->counters;
    if (!m)
        return;
    unsigned k = kind_index(kind), t = dtype_index(dtype), s = status_index(st);
    m->ops[k][t][s]++;
    m->bytes[k][t][s] += bytes;
}

void colld_count_ops_add(colld_daemon_t *d, unsigned kind, unsigned dtype, uint64_t n, uint64_t bytes)
{
    colld_counters_t *m = d->counters;
    if (!m)
        return;
    unsigned k = kind_index(kind), t = dtype_index(dtype), s = status_index(COLLD_OK);
    m->ops[k][t][s] += n;
    m->bytes[k][t][s] += bytes;
}

void colld_count_latency(colld_daemon_t *d, unsigned kind, uint64_t ns)
{
    colld_counters_t *m = d->counters;
    if (!m)
        return;
    colld_latency_hist_t *h = &m->latency[kind_index(kind)];
    unsigned b = 0;
    while (b < COLLD_COUNT_NBUCKET && ns > buckets[b].ns)
        b++;
    h->bucket[b]++;
    h->sum_ns += ns;
    h->count++;
}

void colld_count_comm_error(colld_daemon_t *d, colld_status_t st)
{
    if (d->counters)
        d->counters->comm_errors[status_index(st)]++;
}

void colld_count_session_opened(colld_daemon_t *d)
{
    if (d->counters)
        d->counters->sessions_opened++;
}

void colld_count_comm_formed(colld_daemon_t *d)
{
    if (d->counters)
        d->counters->comms_formed++;
}
