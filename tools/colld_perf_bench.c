/*
 * colld_perf_bench.c - one rank of colld-perf's collective benchmark (rank_t: colld_perf.h): it
 * measures every selected collective x datatype x operation x size in both modes (out of place,
 * in place), checks the results (colld_perf_check.c), combines the ranks' results and, on rank 0,
 * prints the table or --json; then, with --overlap, the all-reduce beside a busy kernel, and with
 * --host-ahead, the all-reduce queued behind one on the rank's own stream.
 *
 * Measurement, as nccl-tests: for each size, after the warm-up iterations and a barrier (a one
 * element all-reduce), each rank times ITERS back-to-back collectives (-z 1: each one waited for
 * before the next is posted) and divides by ITERS; the reported time is the maximum over ranks.
 * algbw = S / time, busbw = algbw x factor with factor 2(n-1)/n for all-reduce, (n-1)/n for
 * all-gather and reduce-scatter, 1 for broadcast and reduce. S is the send buffer of one rank for
 * all-reduce, broadcast and reduce, the whole receive buffer for all-gather and the whole send
 * buffer for reduce-scatter (nccl-tests' doc/PERFORMANCE.md); sizes are rounded down to whole
 * elements (and for all-gather and reduce-scatter to a multiple of NRANKS elements).
 *
 * GPU mode (-G, --gpu; only in a build with the CUDA toolkit): every rank puts its buffers on GPU 0
 * (cudaMalloc; several ranks share the one GPU) and posts every collective on its own stream
 * (cudaStreamNonBlocking), stream-ordered; the communicator carries only GPU work (barriers and the
 * combining of results are stream-ordered all-reduces too). A call's time runs from the host call
 * to the stream's completion, observed by polling cudaStreamQuery (with colld_comm_get_async_error
 * checked while it waits), so the time column is "call -> stream complete" per iteration, averaged
 * over ITERS back-to-back calls as above. Three more columns per row: p50 (each mode), the median
 * over ITERS calls each waited for on its own (call -> stream complete; the worst rank's median);
 * d2d, the device-to-device copy bandwidth of the GPU at the row's size measured in the same run
 * (rank 0 alone, the other ranks idle: ITERS cudaMemcpyAsync D2D of S bytes, counted as read +
 * write, 2S / time); and for all-reduce hbm/d2d: the HBM traffic of the all-reduce (every rank's
 * input read once and output written once, 2 x nranks x S / time, out of place) as a fraction of
 * that copy bandwidth. Inputs are generated on the host, copied in, and results copied back for
 * the check exactly as in host mode. The device buffers, the stream and every CUDA call are in
 * colld_perf_gpu.c.
 */
#include "colld_perf.h"

#include <colld/colld.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SENTINEL 0xA5            /* what a receive buffer holds before a checked call */
#define PIDS_OFF 256             /* where in the scratch buffer (SMALL_BYTES): every rank's pid (int64) */
#define LABELS_OFF 1024          /* ... and every rank's "host" or "host via socket" */
#define LABEL_BYTES 48

_Static_assert(PIDS_OFF + MAX_RANKS * 8 <= LABELS_OFF && LABELS_OFF + MAX_RANKS * LABEL_BYTES <= SMALL_BYTES,
               "the scratch buffer holds the pids and the labels of MAX_RANKS ranks");

/* ---------------------------------------------------------------------------------------------
 * Rows: their shape (shape_t: colld_perf.h) and their results
 * ------------------------------------------------------------------------------------------- */

static bool kind_reduces(int kind)
{
    return kind == K_ALLREDUCE || kind == K_REDUCE || kind == K_REDUCESCATTER;
}

static bool kind_rooted(int kind)
{
    return kind == K_BROADCAST || kind == K_REDUCE;
}

/* nccl-tests' bus bandwidth factor. */
static double busbw_factor(int kind, int n)
{
    switch (kind) {
    case K_ALLREDUCE: return 2.0 * (n - 1) / n;
    case K_ALLGATHER:
    case K_REDUCESCATTER: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

static shape_t make_shape(int kind, colld_dtype_t dt, colld_redop_t op, int root, size_t bytes, int n)
{
    shape_t s = { .kind = kind, .dt = dt, .op = op, .root = root };
    size_t es = colld_dtype_size(dt), elems = bytes / es;
    if (kind == K_ALLGATHER || kind == K_REDUCESCATTER) {
        s.count = elems / (size_t)n;
        s.total = s.count * (size_t)n;
        s.send_elems = kind == K_ALLGATHER ? s.count : s.total;
        s.recv_elems = kind == K_ALLGATHER ? s.total : s.count;
    } else {
        s.count = s.total = s.send_elems = s.recv_elems = elems;
    }
    s.size = s.total * es;
    return s;
}

/* One measured mode of one row, after the reduction over ranks. */
typedef struct {
    double time_us, algbw, busbw;
    double p50_us; /* GPU mode: median call -> stream complete (worst rank) */
    uint64_t wrong;
} mode_result_t;

typedef struct {
    shape_t s;
    mode_result_t m[2]; /* out of place, in place */
    double d2d_gbs;     /* GPU mode: device-to-device copy bandwidth at this size (read + write) */
} row_t;

/* ---------------------------------------------------------------------------------------------
 * The measurement
 * ------------------------------------------------------------------------------------------- */

/* Report a failed call of this rank and return 1. */
static int fail(rank_t *R, const char *what, colld_status_t st)
{
    fprintf(stderr, PROG ": rank %d: %s: %s: %s\n", R->rank, what, colld_status_name(st),
            R->comm ? colld_comm_last_error(R->comm) : colld_status_string(st));
    return 1;
}

/* Wait for everything this rank issued: colld_comm_synchronize, or in GPU mode the stream. */
static colld_status_t wait_issued(rank_t *R)
{
    return R->o->gpu ? gpu_wait(R) : colld_comm_synchronize(R->comm);
}

/* Post one collective of the given shape; `inplace` picks the buffers as NCCL defines in-place. */
static colld_status_t post(rank_t *R, const shape_t *s, bool inplace)
{
    size_t es = colld_dtype_size(s->dt);
    const unsigned char *send = R->sbuf;
    unsigned char *recv = R->rbuf;
    if (inplace) {
        send = R->rbuf;
        if (s->kind == K_ALLGATHER)
            send = R->rbuf + (size_t)R->rank * s->count * es;
        if (s->kind == K_REDUCESCATTER)
            recv = R->rbuf + (size_t)R->rank * s->count * es;
    }
    const void *sp = dev_ptr(R, send);
    void *rp = dev_ptr(R, recv), *st = R->stream;
    switch (s->kind) {
    case K_ALLREDUCE: return colld_allreduce(sp, rp, s->count, s->dt, s->op, R->comm, st);
    case K_BROADCAST: return colld_broadcast(sp, rp, s->count, s->dt, s->root, R->comm, st);
    case K_REDUCE: return colld_reduce(sp, rp, s->count, s->dt, s->op, s->root, R->comm, st);
    case K_ALLGATHER: return colld_allgather(sp, rp, s->count, s->dt, R->comm, st);
    default: return colld_reducescatter(sp, rp, s->count, s->dt, s->op, R->comm, st);
    }
}

/* Bytes of the receive buffer a call of this shape uses (in place: the larger of the two). */
static size_t recv_span(const shape_t *s, bool inplace)
{
    size_t es = colld_dtype_size(s->dt);
    return (inplace && s->send_elems > s->recv_elems ? s->send_elems : s->recv_elems) * es;
}

/* Fill this rank's input for a call with `salt` (and the receive buffer with the sentinel where
 * the input does not go), as the in-place or out-of-place form needs it; in GPU mode the images
 * are then copied to the device on the stream. */
static colld_status_t fill_inputs(rank_t *R, const shape_t *s, bool inplace, unsigned salt)
{
    size_t es = colld_dtype_size(s->dt);
    size_t span = recv_span(s, inplace);
    if (!inplace) {
        R->ref.pattern(s->dt, R->rank, salt, 0, s->send_elems, R->sbuf);
        memset(R->rbuf, SENTINEL, s->recv_elems * es);
        if (!R->o->gpu)
            return COLLD_OK;
        colld_status_t st = gpu_copy(R, R->sbuf, s->send_elems * es, true);
        return st == COLLD_OK ? gpu_copy(R, R->rbuf, span, true) : st;
    }
    memset(R->rbuf, SENTINEL, span);
    switch (s->kind) {
    case K_ALLGATHER:
        R->ref.pattern(s->dt, R->rank, salt, 0, s->count, R->rbuf + (size_t)R->rank * s->count * es);
        break;
    case K_BROADCAST:
        if (R->rank == s->root)
            R->ref.pattern(s->dt, R->rank, salt, 0, s->count, R->rbuf);
        break;
    default: /* all-reduce, reduce: count elements; reduce-scatter: n x count */
        R->ref.pattern(s->dt, R->rank, salt, 0, s->send_elems, R->rbuf);
        break;
    }
    return R->o->gpu ? gpu_copy(R, R->rbuf, span, true) : COLLD_OK;
}

/* All-reduce `count` elements of the scratch buffer at `off` in place, waited for (in GPU mode
 * through the device scratch buffer, on the stream). */
static colld_status_t small_allreduce(rank_t *R, size_t off, size_t count, colld_dtype_t dt, colld_redop_t op)
{
    size_t len = count * colld_dtype_size(dt);
    colld_status_t st = R->o->gpu ? gpu_copy(R, R->small + off, len, true) : COLLD_OK;
    if (st == COLLD_OK)
        st = colld_allreduce(dev_ptr(R, R->small + off), dev_ptr(R, R->small + off), count, dt, op, R->comm, R->stream);
    if (st == COLLD_OK && R->o->gpu)
        st = gpu_copy(R, R->small + off, len, false);
    return st == COLLD_OK ? wait_issued(R) : st;
}

/* A barrier: a one-element all-reduce, waited for. */
static colld_status_t barrier(rank_t *R)
{
    return small_allreduce(R, 0, 1, COLLD_INT32, COLLD_SUM);
}

/* Time one mode of one row on this rank: warm-up, barrier, ITERS collectives; in GPU mode then
 * ITERS more, each waited for on its own (*p50 their median); then, with -c 1, one more call on
 * fresh inputs, checked. *us is this rank's time per call. */
static int measure(rank_t *R, const shape_t *s, bool inplace, unsigned check_salt, double *us, double *p50,
                   uint64_t *wrong)
{
    const opts_t *o = R->o;
    colld_status_t st;
    if ((st = fill_inputs(R, s, inplace, 0)) != COLLD_OK)
        return fail(R, "filling the inputs", st);
    for (int i = 0; i < o->warmup; i++)
        if ((st = post(R, s, inplace)) != COLLD_OK || (st = wait_issued(R)) != COLLD_OK)
            return fail(R, "warm-up collective", st);
    if ((st = barrier(R)) != COLLD_OK)
        return fail(R, "barrier", st);
    double t0 = now_us();
    for (int i = 0; i < o->iters; i++) {
        if ((st = post(R, s, inplace)) != COLLD_OK)
            return fail(R, "collective", st);
        if (o->blocking && (st = wait_issued(R)) != COLLD_OK)
            return fail(R, "collective", st);
    }
    if (!o->blocking && (st = wait_issued(R)) != COLLD_OK)
        return fail(R, "collective", st);
    *us = (now_us() - t0) / o->iters;
    *p50 = 0;
    if (o->gpu) {
        for (int i = 0; i < o->iters; i++) {
            double t = now_us();
            if ((st = post(R, s, inplace)) != COLLD_OK || (st = wait_issued(R)) != COLLD_OK)
                return fail(R, "collective (latency)", st);
            R->lat[i] = now_us() - t;
        }
        *p50 = perf_median(R->lat, o->iters);
    }
    *wrong = 0;
    if (!o->check)
        return 0;
    unsigned char *got = R->rbuf;
    if (inplace && s->kind == K_REDUCESCATTER)
        got += (size_t)R->rank * s->count * colld_dtype_size(s->dt);
    if ((st = fill_inputs(R, s, inplace, check_salt)) != COLLD_OK || (st = post(R, s, inplace)) != COLLD_OK ||
        (o->gpu && (st = gpu_copy(R, R->rbuf, recv_span(s, inplace), false)) != COLLD_OK) ||
        (st = wait_issued(R)) != COLLD_OK)
        return fail(R, "checked collective", st);
    size_t w = perf_count_wrong(s, R->n, R->rank, check_salt, got, &R->ref);
    if (w == SIZE_MAX) {
        fprintf(stderr, PROG ": rank %d: the reference kernel refused %s %s %s\n", R->rank, perf_kind_names[s->kind],
                perf_dtype_names[s->dt], perf_op_names[s->op]);
        return 1;
    }
    *wrong = w;
    return 0;
}

/* Measure one row in both modes and combine over ranks: the maximum times, the summed wrong
 * counts. In GPU mode first rank 0 measures the D2D copy bandwidth at this size while the others
 * wait in a barrier. Every rank gets the combined row. */
static int run_row(rank_t *R, const shape_t *s, unsigned check_salt, row_t *row)
{
    double t[5] = { 0 }; /* us[2], p50[2], d2d */
    uint64_t wrong[2];
    colld_status_t st;
    if (R->o->gpu) {
        if ((st = barrier(R)) != COLLD_OK)
            return fail(R, "barrier", st);
        if (R->rank == 0 && s->size <= R->bytes)
            t[4] = gpu_d2d_gbs(R, s->size);
        if ((st = barrier(R)) != COLLD_OK)
            return fail(R, "barrier", st);
    }
    for (int ip = 0; ip < 2; ip++)
        if (measure(R, s, ip == 1, check_salt + (unsigned)ip, &t[ip], &t[2 + ip], &wrong[ip]))
            return 1;
    memcpy(R->small + 64, t, sizeof(t));
    memcpy(R->small + 128, wrong, sizeof(wrong));
    st = small_allreduce(R, 64, 5, COLLD_FLOAT64, COLLD_MAX);
    if (st == COLLD_OK && R->o->check)
        st = small_allreduce(R, 128, 2, COLLD_UINT64, COLLD_SUM);
    if (st != COLLD_OK)
        return fail(R, "combining the results of the ranks", st);
    memcpy(t, R->small + 64, sizeof(t));
    memcpy(wrong, R->small + 128, sizeof(wrong));
    row->s = *s;
    row->d2d_gbs = t[4];
    double factor = busbw_factor(s->kind, R->n);
    for (int ip = 0; ip < 2; ip++) {
        mode_result_t *m = &row->m[ip];
        m->time_us = t[ip];
        m->p50_us = t[2 + ip];
        m->algbw = t[ip] > 0 ? (double)s->size / t[ip] / 1e3 : 0;
        m->busbw = m->algbw * factor;
        m->wrong = wrong[ip];
    }
    return 0;
}

/* GPU mode, all-reduce: the HBM traffic (each rank's input read once and output written once,
 * 2 x nranks x S per call) of mode ip in GB/s, 0 when it does not apply. */
static double hbm_gbs(const row_t *row, int n, int ip)
{
    const mode_result_t *m = &row->m[ip];
    return row->s.kind == K_ALLREDUCE && m->time_us > 0 ? 2.0 * n * (double)row->s.size / m->time_us / 1e3 : 0;
}

/* ---------------------------------------------------------------------------------------------
 * Output (rank 0)
 * ------------------------------------------------------------------------------------------- */

/* nccl-tests' time format: 2 decimals below 100 us, 1 below 10 ms, none above. */
static void fmt_time(double us, char *buf, size_t len)
{
    snprintf(buf, len, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
}

/* Rank 0's header; labels[r] says where rank r runs (LABEL_BYTES each). */
static void print_header(const rank_t *R, const int64_t *pids, const char *labels)
{
    const opts_t *o = R->o;
    printf("# colld-perf: nranks %d (processes)  minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d "
           "iters: %d validation: %d blocking: %d\n#\n# Using ranks\n",
           o->nranks, o->min_bytes, o->max_bytes, o->factor, o->warmup, o->iters, o->check, o->blocking);
    char gpu[160] = "";
    if (o->gpu)
        gpu_name(gpu, sizeof(gpu));
    for (int r = 0; r < R->n; r++)
        printf("#  Rank %2d Pid %7" PRId64 " on %s %s\n", r, pids[r], labels + (size_t)r * LABEL_BYTES,
               o->gpu ? "GPU 0 (cudaMalloc, stream-ordered on its own stream)"
                      : "host memory (colld_mem_alloc, zero copy)");
    if (o->gpu)
        printf("# GPU 0: %s\n# time: call -> stream complete (average of back-to-back calls); p50: median of calls "
               "each waited for; d2d: cudaMemcpyAsync D2D, 2 x size / time; hbm/d2d: all-reduce 2 x nranks x size / "
               "time (out of place, in place) over d2d\n", gpu);
    if (o->nan_check)
        printf("# --nan-check: the communicator's reductions check every input for NaN and infinities\n");
}

static void print_table_head(int kind, bool gpu)
{
    /* The first five columns take 52 characters, each mode's four columns 33; GPU mode appends
     * p50 (us) of both modes, d2d (GB/s) and hbm/d2d of both modes. */
    printf("#\n# Collective test: %s\n#\n", perf_kind_names[kind]);
    printf("#%51s%-10s%-23s%-12s%-21s%s\n", "", "", "out-of-place", "", "in-place",
           gpu ? "       p50 (us)         d2d     hbm/d2d" : "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s", "size", "count", "type",
           "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf(gpu ? "  %7s  %7s  %8s  %6s  %6s\n" : "\n", "oop", "ip", "(GB/s)", "oop", "ip");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "",
           "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static void print_row(const row_t *row, bool check, bool gpu, int n)
{
    const shape_t *s = &row->s;
    printf("  %10zu  %12zu  %8s  %6s  %6d", s->size, s->total, perf_dtype_names[s->dt],
           kind_reduces(s->kind) ? perf_op_names[s->op] : "none", kind_rooted(s->kind) ? s->root : -1);
    for (int ip = 0; ip < 2; ip++) {
        char t[32], w[32];
        fmt_time(row->m[ip].time_us, t, sizeof(t));
        if (check)
            snprintf(w, sizeof(w), "%" PRIu64, row->m[ip].wrong);
        else
            snprintf(w, sizeof(w), "N/A");
        printf("  %7s  %6.2f  %6.2f  %6s", t, row->m[ip].algbw, row->m[ip].busbw, w);
    }
    if (gpu) {
        char p[2][32], r[2][16];
        for (int ip = 0; ip < 2; ip++) {
            fmt_time(row->m[ip].p50_us, p[ip], sizeof(p[ip]));
            double h = hbm_gbs(row, n, ip);
            if (h > 0 && row->d2d_gbs > 0)
                snprintf(r[ip], sizeof(r[ip]), "%5.1f%%", 100.0 * h / row->d2d_gbs);
            else
                snprintf(r[ip], sizeof(r[ip]), "N/A");
        }
        printf("  %7s  %7s  %8.1f  %6s  %6s", p[0], p[1], row->d2d_gbs, r[0], r[1]);
    }
    printf("\n");
    fflush(stdout);
}

static void print_json(const rank_t *R, const row_t *rows, size_t nrows, uint64_t oob, double avg_busbw,
                       const int64_t *pids)
{
    const opts_t *o = R->o;
    printf("{\"schema_version\":1,\"colld_perf\":{%s%s\"nranks\":%d,\"min_bytes\":%zu,\"max_bytes\":%zu,"
           "\"step_factor\":%g,\"iters\":%d,\"warmup_iters\":%d,\"check\":%d,\"blocking\":%d,\"pids\":[",
           o->gpu ? "\"gpu\":true," : "", o->nan_check ? "\"nan_check\":true," : "", o->nranks, o->min_bytes,
           o->max_bytes, o->factor, o->iters, o->warmup, o->check, o->blocking);
    for (int r = 0; r < R->n; r++)
        printf("%s%" PRId64, r ? "," : "", pids[r]);
    printf("]},\"rows\":[");
    for (size_t i = 0; i < nrows; i++) {
        const shape_t *s = &rows[i].s;
        printf("%s\n{\"collective\":\"%s\",\"size\":%zu,\"count\":%zu,\"type\":\"%s\",\"redop\":\"%s\",\"root\":%d",
               i ? "," : "", perf_kind_names[s->kind], s->size, s->total, perf_dtype_names[s->dt],
               kind_reduces(s->kind) ? perf_op_names[s->op] : "none", kind_rooted(s->kind) ? s->root : -1);
        for (int ip = 0; ip < 2; ip++) {
            const mode_result_t *m = &rows[i].m[ip];
            printf(",\"%s\":{\"time_us\":%.3f,\"algbw_gbs\":%.6g,\"busbw_gbs\":%.6g,", ip ? "in_place" : "out_of_place",
                   m->time_us, m->algbw, m->busbw);
            if (o->gpu) {
                double h = hbm_gbs(&rows[i], R->n, ip);
                printf("\"p50_us\":%.3f,", m->p50_us);
                if (h > 0)
                    printf("\"hbm_gbs\":%.6g,", h);
                else
                    printf("\"hbm_gbs\":null,");
                if (h > 0 && rows[i].d2d_gbs > 0)
                    printf("\"hbm_over_d2d\":%.6g,", h / rows[i].d2d_gbs);
                else
                    printf("\"hbm_over_d2d\":null,");
            }
            printf("\"wrong\":");
            if (o->check)
                printf("%" PRIu64 "}", m->wrong);
            else
                printf("null}");
        }
        if (o->gpu)
            printf(",\"d2d_gbs\":%.6g", rows[i].d2d_gbs);
        printf("}");
    }
    printf("],\n\"out_of_bounds\":");
    if (o->check)
        printf("%" PRIu64, oob);
    else
        printf("null");
    printf(",\"avg_busbw_gbs\":%.6g}\n", avg_busbw);
}

/* ---------------------------------------------------------------------------------------------
 * The run of one rank: every row, then --overlap; the rank process around them
 * ------------------------------------------------------------------------------------------- */

/* The sizes of the sweep, from -b by -f up to -e (inclusive). */
static size_t next_size(size_t bytes, double factor)
{
    double next = (double)bytes * factor;
    size_t n = (size_t)next;
    return n > bytes ? n : bytes + 1;
}

/* Every selected collective x dtype x op x size. */
static int run_bench(rank_t *R)
{
    const opts_t *o = R->o;
    int rc = 0;
    size_t nrows = 0, cap = 0;
    row_t *rows = NULL;
    double bw_sum = 0;
    long bw_count = 0;
    uint64_t oob = 0;

    /* Every rank's pid and where it runs, for the header: each rank fills its own slot of zeroed
     * arrays and a sum gathers them (the labels as bytes). With --join the ranks may be on other
     * hosts and daemons, so the label names the host and this rank's daemon socket. */
    int64_t pids[MAX_RANKS] = { 0 };
    char host[256] = "?", *label = (char *)R->small + LABELS_OFF + (size_t)R->rank * LABEL_BYTES;
    gethostname(host, sizeof(host) - 1);
    memset(R->small + PIDS_OFF, 0, SMALL_BYTES - PIDS_OFF);
    int64_t me = (int64_t)getpid();
    memcpy(R->small + PIDS_OFF + (size_t)R->rank * 8, &me, 8);
    if (o->join)
        snprintf(label, LABEL_BYTES, "%.16s via %.26s", host, o->socket ? o->socket : "the default socket");
    else
        snprintf(label, LABEL_BYTES, "%.47s", host); /* both fit LABEL_BYTES (48) with the NUL */
    colld_status_t st = small_allreduce(R, PIDS_OFF, (size_t)R->n, COLLD_INT64, COLLD_SUM);
    if (st == COLLD_OK)
        st = small_allreduce(R, LABELS_OFF, (size_t)R->n * LABEL_BYTES, COLLD_UINT8, COLLD_SUM);
    if (st != COLLD_OK)
        return fail(R, "exchanging pids and hosts", st);
    memcpy(pids, R->small + PIDS_OFF, (size_t)R->n * 8);
    if (R->rank == 0 && !o->json)
        print_header(R, pids, (const char *)R->small + LABELS_OFF);

    unsigned salt = 1;
    for (int kind = 0; kind < K_COUNT && !rc; kind++) {
        if (!(o->kinds & (1u << kind)))
            continue;
        if (R->rank == 0 && !o->json)
            print_table_head(kind, o->gpu);
        for (int dt = 0; dt < COLLD_DTYPE_COUNT && !rc; dt++) {
            if (!(o->dtypes & (1u << dt)))
                continue;
            for (int op = 0; op < COLLD_REDOP_COUNT && !rc; op++) {
                if (!(o->ops & (1u << op)))
                    continue;
                if (!kind_reduces(kind) && op != __builtin_ctz(o->ops))
                    continue; /* no op: one pass */
                for (size_t b = o->min_bytes; b <= o->max_bytes && !rc; b = next_size(b, o->factor)) {
                    shape_t s = make_shape(kind, (colld_dtype_t)dt, kind_reduces(kind) ? (colld_redop_t)op : COLLD_SUM,
                                           o->root, b, R->n);
                    row_t row;
                    salt += 2;
                    if ((rc = run_row(R, &s, salt, &row)) != 0)
                        break;
                    for (int ip = 0; ip < 2; ip++) {
                        bw_sum += row.m[ip].busbw;
                        bw_count++;
                        oob += row.m[ip].wrong;
                    }
                    if (R->rank != 0)
                        continue;
                    if (!o->json) {
                        print_row(&row, o->check, o->gpu, R->n);
                        continue;
                    }
                    if (nrows == cap) {
                        cap = cap ? cap * 2 : 64;
                        row_t *t = realloc(rows, cap * sizeof(*rows));
                        if (!t) {
                            fprintf(stderr, PROG ": out of memory\n");
                            rc = 1;
                            break;
                        }
                        rows = t;
                    }
                    rows[nrows++] = row;
                }
            }
        }
    }
    if (!rc && R->rank == 0) {
        double avg = bw_count ? bw_sum / (double)bw_count : 0;
        if (o->json) {
            print_json(R, rows, nrows, oob, avg, pids);
        } else {
            if (o->check)
                printf("# Out of bounds values : %" PRIu64 " %s\n", oob, oob ? "FAILED" : "OK");
            else
                printf("# Out of bounds values : N/A (-c 0)\n");
            printf("# Avg bus bandwidth    : %g \n#\n", avg);
        }
        fflush(stdout);
    }
    free(rows);
    if (!rc && oob) {
        if (R->rank == 0)
            fprintf(stderr, PROG ": %" PRIu64 " wrong element(s)\n", oob);
        rc = 1;
    }
    return rc;
}

/* --overlap (GPU mode): does a collective run beside the application's compute on the same GPU?
 * At -e bytes, all-reduce of the run's first dtype and op, each rank times
 *   alone  ITERS collectives back to back on its stream (Tc);
 *   busy   the busy kernel alone on its second stream (Tk), calibrated to take about Tc, on
 *          max(1, SMs / (2 x ranks)) blocks: every rank's busy kernel together leaves half the
 *          SMs free for the daemon's collective kernels;
 *   both   the busy kernel, then the ITERS collectives, at once (Tb).
 * overlap = (Tk + Tc - Tb) / min(Tk, Tc): 100 % when the collectives ran entirely beside the
 * compute, 0 % when one waited for the other (time slicing between the daemon's CUDA context and
 * the application's, without MPS: docs/operations.md). Rank 0 prints the slowest rank's times. */
static int run_overlap(rank_t *R)
{
    const opts_t *o = R->o;
    shape_t s = make_shape(K_ALLREDUCE, (colld_dtype_t)__builtin_ctz(o->dtypes), (colld_redop_t)__builtin_ctz(o->ops),
                           0, o->max_bytes, R->n);
    int sms = gpu_sm_count(), blocks = sms / (2 * R->n) > 1 ? sms / (2 * R->n) : 1;
    double t0, t[3];
    colld_status_t st = fill_inputs(R, &s, false, 1);
    const char *what = "overlap: inputs";
    if (st == COLLD_OK && (st = post(R, &s, false)) == COLLD_OK) /* warm-up */
        st = wait_issued(R);
    /* alone */
    if (st == COLLD_OK && (st = barrier(R)) == COLLD_OK) {
        what = "overlap: collectives alone";
        t0 = now_us();
        for (int i = 0; i < o->iters && st == COLLD_OK; i++)
            st = post(R, &s, false);
        if (st == COLLD_OK)
            st = wait_issued(R);
        t[0] = now_us() - t0;
    }
    /* the busy kernel: calibrated on 10^7 cycles (a few ms), then alone */
    long long cycles = 10000000;
    if (st == COLLD_OK) {
        what = "overlap: the busy kernel";
        t0 = now_us();
        if ((st = gpu_busy(R, blocks, cycles)) == COLLD_OK)
            st = gpu_busy_wait(R);
        double probe = now_us() - t0;
        if (probe > 0)
            cycles = (long long)((double)cycles * t[0] / probe);
        if (cycles < 1000)
            cycles = 1000;
    }
    if (st == COLLD_OK && (st = barrier(R)) == COLLD_OK) {
        t0 = now_us();
        if ((st = gpu_busy(R, blocks, cycles)) == COLLD_OK)
            st = gpu_busy_wait(R);
        t[1] = now_us() - t0;
    }
    /* both at once */
    if (st == COLLD_OK && (st = barrier(R)) == COLLD_OK) {
        what = "overlap: collectives beside the busy kernel";
        t0 = now_us();
        st = gpu_busy(R, blocks, cycles);
        for (int i = 0; i < o->iters && st == COLLD_OK; i++)
            st = post(R, &s, false);
        if (st == COLLD_OK)
            st = wait_issued(R);
        if (st == COLLD_OK)
            st = gpu_busy_wait(R);
        t[2] = now_us() - t0;
    }
    if (st == COLLD_OK) { /* the slowest rank's times */
        what = "overlap: gathering the times";
        memcpy(R->small + 8, t, sizeof(t));
        st = small_allreduce(R, 8, 3, COLLD_FLOAT64, COLLD_MAX);
        memcpy(t, R->small + 8, sizeof(t));
    }
    if (st != COLLD_OK)
        return fail(R, what, st);
    if (R->rank == 0) {
        double lo = t[0] < t[1] ? t[0] : t[1];
        double ov = lo > 0 ? (t[0] + t[1] - t[2]) / lo : 0;
        printf("# Overlap: %d x allreduce of %zu bytes (%.0f us) beside a busy kernel on %d of %d SMs per rank "
               "(%.0f us): together %.0f us, overlap %.0f %% (100 %%: side by side; 0 %%: one after the other)\n",
               o->iters, o->max_bytes, t[0], blocks, sms, t[1], t[2], ov * 100);
        fflush(stdout);
    }
    return 0;
}

/* --host-ahead (GPU mode): "the host runs ahead", as in training and graph replay, where the host
 * call returns long before the stream reaches the collective. For each size of the sweep (-b to -e
 * by -f), all-reduce of the run's first dtype and op; each rank, after a barrier per sample, times
 * with CUDA events on its own stream
 *   alone   event, the busy kernel (~AHEAD_US, calibrated with events), event;
 *   behind  event, the busy kernel, the collective (posted at once: the host call returns while the
 *           kernel still runs), event;
 * ITERS samples of each (after -w warm-up samples of the second). collective = median(behind) -
 * median(alone), per rank; rank 0 prints the slowest rank's medians and the median host call (CPU
 * time of the posting call). The busy kernel runs on max(1, SMs / ranks) blocks, so every rank's
 * kernel together fills the GPU once; the ranks' kernels run at once in both measurements (without
 * MPS their contexts take turns, in both), so "alone" is the same contention without the
 * collective. On the CUDA driver test double nothing here is a timing. */
#define AHEAD_US 200.0

static int run_host_ahead(rank_t *R)
{
    const opts_t *o = R->o;
    int sms = gpu_sm_count(), blocks = sms / R->n > 1 ? sms / R->n : 1;
    long long cycles = 1000000;
    double *alone = calloc((size_t)o->iters, sizeof(double)), *behind = calloc((size_t)o->iters, sizeof(double));
    double *host = calloc((size_t)o->iters, sizeof(double));
    colld_status_t st = COLLD_OK;
    const char *what = "host-ahead: calibrating the busy kernel";
    int rc = 0;
    if (!alone || !behind || !host) {
        fprintf(stderr, PROG ": rank %d: out of memory\n", R->rank);
        rc = 1;
        goto out;
    }
    /* calibration: 10^6 cycles timed with events (twice: the first launch loads the module) */
    for (int i = 0; i < 2 && st == COLLD_OK; i++) {
        if ((st = gpu_mark(R, 0)) == COLLD_OK && (st = gpu_busy_here(R, blocks, 1000000)) == COLLD_OK &&
            (st = gpu_mark(R, 1)) == COLLD_OK && (st = gpu_wait(R)) == COLLD_OK) {
            double us = gpu_marks_us(R);
            if (us < 0)
                st = COLLD_ERR_DEVICE;
            else if (us > 0)
                cycles = (long long)(1e6 * AHEAD_US / us);
        }
    }
    if (cycles < 1000)
        cycles = 1000;
    if (cycles > 1000000000LL) /* a driver that times nothing (the test double): keep it short */
        cycles = 1000000;
    /* every rank uses rank 0's calibration, so the kernels are alike */
    if (st == COLLD_OK) {
        double c = R->rank == 0 ? (double)cycles : 0;
        memcpy(R->small + 8, &c, sizeof(c));
        if ((st = small_allreduce(R, 8, 1, COLLD_FLOAT64, COLLD_MAX)) == COLLD_OK) {
            memcpy(&c, R->small + 8, sizeof(c));
            cycles = (long long)c;
        }
    }
    if (st == COLLD_OK && R->rank == 0) {
        printf("# Host runs ahead (--host-ahead): all-reduce %s %s queued behind a busy kernel of ~%.0f us (%lld "
               "cycles, %d of %d SMs per rank) on each rank's stream; CUDA events; slowest rank's medians over %d\n"
               "# %10s  %14s  %14s  %14s  %14s\n",
               perf_dtype_names[__builtin_ctz(o->dtypes)], perf_op_names[__builtin_ctz(o->ops)], AHEAD_US, cycles,
               blocks, sms, o->iters, "size (B)", "kernel+coll", "kernel alone", "collective", "host call");
        fflush(stdout);
    }
    for (size_t b = o->min_bytes; b <= o->max_bytes && st == COLLD_OK; b = next_size(b, o->factor)) {
        shape_t s = make_shape(K_ALLREDUCE, (colld_dtype_t)__builtin_ctz(o->dtypes),
                               (colld_redop_t)__builtin_ctz(o->ops), 0, b, R->n);
        what = "host-ahead: inputs";
        st = fill_inputs(R, &s, false, 1);
        for (int i = -o->warmup; i < 2 * o->iters && st == COLLD_OK; i++) {
            bool with = i < 0 || i % 2 == 1; /* warm-up, then alone and behind in turn */
            what = with ? "host-ahead: collective behind the busy kernel" : "host-ahead: the busy kernel alone";
            if ((st = barrier(R)) != COLLD_OK || (st = gpu_mark(R, 0)) != COLLD_OK ||
                (st = gpu_busy_here(R, blocks, cycles)) != COLLD_OK)
                break;
            double t = now_us();
            if (with && (st = post(R, &s, false)) != COLLD_OK)
                break;
            t = now_us() - t;
            if ((st = gpu_mark(R, 1)) != COLLD_OK || (st = wait_issued(R)) != COLLD_OK)
                break;
            if (i < 0)
                continue;
            double us = gpu_marks_us(R);
            if (us < 0) {
                st = COLLD_ERR_DEVICE;
                break;
            }
            if (with) {
                behind[i / 2] = us;
                host[i / 2] = t;
            } else {
                alone[i / 2] = us;
            }
        }
        if (st != COLLD_OK)
            break;
        double t[4];
        t[1] = perf_median(behind, o->iters);
        t[2] = perf_median(alone, o->iters);
        t[0] = t[1] - t[2];
        t[3] = perf_median(host, o->iters);
        what = "host-ahead: gathering the times";
        memcpy(R->small + 8, t, sizeof(t));
        if ((st = small_allreduce(R, 8, 4, COLLD_FLOAT64, COLLD_MAX)) != COLLD_OK)
            break;
        memcpy(t, R->small + 8, sizeof(t));
        if (R->rank == 0) {
            printf("  %10zu  %14.2f  %14.2f  %14.2f  %14.2f\n", s.size, t[1], t[2], t[0], t[3]);
            fflush(stdout);
        }
    }
    if (st != COLLD_OK)
        rc = fail(R, what, st);
out:
    free(alone);
    free(behind);
    free(host);
    return rc;
}

/* A rank process (launched, or --join): connect, join the communicator `id`, allocate,
 * benchmark, clean up. */
int perf_rank_main(const opts_t *o, colld_unique_id_t id)
{
    rank_t R = { .o = o, .n = o->nranks, .rank = o->rank };
    int rc = 1;
    R.bytes = o->max_bytes > 64 ? o->max_bytes : 64;
    /* GPU mode: the device, its stream and buffers first, as an application sets up CUDA before
     * it joins (the images sbuf, rbuf and small are pinned host memory). */
    if (o->gpu && gpu_setup(&R) < 0) {
        gpu_teardown(&R);
        return 1;
    }
    colld_status_t st = colld_connect(o->socket, &R.c);
    if (st != COLLD_OK) {
        fprintf(stderr, PROG ": rank %d: connect: %s: %s\n", o->rank, colld_status_name(st), colld_status_string(st));
        if (o->gpu)
            gpu_teardown(&R);
        return 1;
    }
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.name = "colld-perf";
    cfg.timeout_ms = o->timeout_ms;
    cfg.nan_check = o->nan_check;
    if ((st = colld_comm_init_rank(R.c, &R.comm, R.n, id, R.rank, &cfg)) != COLLD_OK) {
        R.comm = NULL;
        fail(&R, "joining the communicator", st);
        goto out_client;
    }
    if (!o->gpu && ((st = colld_mem_alloc(R.c, (void **)&R.sbuf, R.bytes, COLLD_MEM_HOST)) != COLLD_OK ||
                    (st = colld_mem_alloc(R.c, (void **)&R.rbuf, R.bytes, COLLD_MEM_HOST)) != COLLD_OK ||
                    (st = colld_mem_alloc(R.c, (void **)&R.small, SMALL_BYTES, COLLD_MEM_HOST)) != COLLD_OK)) {
        fprintf(stderr, PROG ": rank %d: cannot share 2 x %zu bytes with the daemon: %s\n", R.rank, R.bytes,
                colld_status_name(st));
        goto out_comm;
    }
    if (perf_ref_alloc(&R.ref, R.n, o->join || o->finite) < 0) {
        fprintf(stderr, PROG ": rank %d: out of memory\n", R.rank);
        goto out_comm;
    }
    memset(R.small, 0, SMALL_BYTES);
    rc = run_bench(&R);
    if (!rc && o->overlap)
        rc = run_overlap(&R);
    if (!rc && o->host_ahead)
        rc = run_host_ahead(&R);
out_comm:
    perf_ref_free(&R.ref);
    if (!o->gpu) {
        if (R.sbuf)
            colld_mem_free(R.c, R.sbuf);
        if (R.rbuf)
            colld_mem_free(R.c, R.rbuf);
        if (R.small)
            colld_mem_free(R.c, R.small);
    }
    if ((st = colld_comm_destroy(R.comm)) != COLLD_OK && !rc)
        rc = fail(&R, "destroying the communicator", st);
out_client:
    colld_disconnect(R.c);
    if (o->gpu)
        gpu_teardown(&R);
    return rc;
}
