/*
 * gpu_rank.c - colld-test-gpu-rank: one rank process of the GPU integration tests
 * (test_gpu_collectives.c), written against the public API only (colld/colld.h) and the CUDA runtime.
 *
 * It connects to the daemon, joins a communicator at a rank, puts its buffers on GPU 0 and runs
 * stream-ordered collectives on its own cudaStream_t. Several ranks of a test share the one GPU as
 * separate processes. Inputs come from the deterministic generator of the host tests
 * (colld_cpu_pattern: every rank can compute every rank's input), expected results from the scalar
 * CPU oracle (colld_cpu_reduce_scalar, rank order 0..n-1), and every result is compared BITWISE.
 *
 * Buffers (--alloc): cudamalloc (default) cudaMalloc'd device memory; colld colld_mem_alloc(...,
 * COLLD_MEM_CUDA); mixed: even ranks the one, odd ranks the other. Every collective reads and
 * writes a slot GUARD bytes into an allocation (so the library must find the containing allocation),
 * and the GUARD bytes around it must keep their sentinel on the device.
 *
 * Modes (--mode):
 *   matrix   (default) collective x dtype x op (reducing kinds only) x count {0, 1, 1001, big} x
 *            {out-of-place, in-place}, as colld-test-coll does on host memory: big is >= 4 MiB per
 *            buffer (an odd count) and, unless --big-all, only the subset big_selected() names.
 *            Each call: the host images of the slots (sentinels and this rank's input) are copied
 *            to the device on the stream, the collective is posted on the stream, the slots are
 *            copied back on the stream, and only then does the host wait (--host-sync: also wait
 *            before posting). Select with --kinds, --dtypes, --ops, --no-big, --big-all, --salt,
 *            --rotate, --iters.
 *   realloc  --iters rounds of: allocate the buffers, run exact all-reduces, free them. The
 *            allocator tends to hand the same addresses back, so a library that caches a
 *            registration by address alone reads freed memory and the results are wrong.
 *   stream   producer kernel -> colld_allreduce -> consumer kernel on the stream, with no host
 *            synchronisation in between. The first round's producer spins --spin-ms (default 200)
 *            first: the colld_allreduce host call must return within HOST_CALL_LIMIT_MS while the
 *            stream is still busy, and the stream must take at least 3/4 of the spin. Then
 *            STREAM_ROUNDS-1 more rounds are queued back to back (every other one in place), one
 *            wait at the end, and every consumer output must be exact.
 *   fault    the fault test (3 ranks): a warm-up all-reduce, then the survivors post an all-reduce
 *            and write <sync-dir>/posted-R; the victim (--victim, default the last rank) writes
 *            <sync-dir>/victim-ready and waits to be killed (-9) by the driver, without posting, or
 *            with --victim-posts after posting an all-reduce behind a long spin (so every stream
 *            waits). A survivor's stream must be released within the communicator timeout +
 *            RELEASE_GRACE_MS; cudaStreamSynchronize must then succeed and
 *            colld_comm_get_async_error must give COLLD_ERR_PEER_LOST or COLLD_ERR_TIMEOUT (written
 *            with the release time to <sync-dir>/released-R). A later call on the broken
 *            communicator must not hang either. Then the survivors destroy it, join the 2-rank
 *            communicator --uid2 and run exact all-reduces on the same buffers and stream.
 *   loop     exact all-reduces until --stop-file exists, the count finished written to
 *            --progress-file: a communicator that must keep working while a test breaks another.
 *
 * Exit code: 0 everything exact (or the expected failure came); 1 a mismatch, an unexpected status,
 * a CUDA error or a stream that was not released; 2 bad arguments; 77 no GPU visible.
 */
#include "kernels/cpu/pattern.h"
#include "kernels/cpu/reduce.h"
#include "tests/gpu/gpu_rank_kernels.h"
#include "tests/integration/harness.h"

#include <colld/colld.h>
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCESCATTER, K_COUNT };

static const char *const kind_names[K_COUNT] = { "allreduce", "broadcast", "reduce", "allgather", "reducescatter" };
static const char *const dtype_names[COLLD_DTYPE_COUNT] = { "int8",    "uint8",    "int32",   "uint32",  "int64",
                                                            "uint64",  "float16",  "bfloat16", "float32", "float64" };
static const char *const op_names[COLLD_REDOP_COUNT] = { "sum", "prod", "min", "max", "avg" };

#define GUARD 64                 /* bytes before and after every buffer that must stay untouched */
#define SENTINEL 0xA5            /* what unwritten memory holds */
#define BIG_BYTES (4u << 20)     /* the large count: at least this many bytes per buffer */
#define SMALL_COUNTS 3           /* counts 0, 1, 1001; the 4th is the big one */
#define MAX_RANKS 64
#define WAIT_GRACE_MS 10000      /* a stream may take the communicator timeout plus this */
#define RELEASE_GRACE_MS 5000    /* fault: a survivor's stream is released within timeout + this */
#define HOST_CALL_LIMIT_MS 50.0  /* stream: the host call returns within this */
#define STREAM_ROUNDS 8          /* stream: producer -> all-reduce -> consumer rounds */
#define STREAM_COUNT (((size_t)1 << 20) + 5) /* stream: elements per round (odd) */
#define VICTIM_SPIN_MS 60000.0   /* fault --victim-posts: the victim's stream waits behind this */
#define FAULT_COUNT (((size_t)1 << 20) + 1) /* fault: elements of the all-reduce that breaks */

static const size_t small_counts[SMALL_COUNTS] = { 0, 1, 1001 };

typedef struct {
    const char *socket, *uid_hex, *uid2_hex, *mode, *alloc, *sync_dir, *stop_file, *progress_file;
    int nranks, rank, timeout_ms, iters, rotate, max_report, victim;
    double spin_ms;
    unsigned salt, kinds, dtypes, ops; /* bit masks */
    bool big, big_all, host_sync, blocking_stream, victim_posts;
} args_t;

/* One collective call: what it is, where its buffers are, its inputs and expected output. The
 * slots and pointers are HOST addresses in the pinned images; dev() maps them to the device. */
typedef struct {
    int kind;
    colld_dtype_t dt;
    colld_redop_t op;
    size_t count;
    int root;
    bool inplace;
    bool null_unused; /* out of place, non-root: pass NULL for the buffer the call does not use */
    unsigned salt;
    unsigned char *sreg, *rreg; /* the slots (GUARD + buffer + GUARD) in the host images */
    const void *sendp;
    void *recvp;
    unsigned char *mine;   /* this rank's input (send_elems) */
    unsigned char *inputs; /* reductions: every rank's input for the elements this rank receives */
    unsigned char *expect; /* the expected output of this rank (recv_elems) */
} call_t;

typedef struct {
    const args_t *a;
    colld_client_t *c;
    colld_comm_t *comm;
    int n, rank;
    bool use_colld_alloc;
    cudaStream_t stream;
    unsigned char *ds, *dr; /* device buffers, reg_bytes each */
    unsigned char *hs, *hr; /* pinned host images of them */
    size_t reg_bytes;
    long cases, collectives, bad;
    int reported;
} run_t;

/* ---------------------------------------------------------------------------------------------
 * CUDA and device memory
 * ------------------------------------------------------------------------------------------- */

/* Report a CUDA error of a step; true when there was none. */
static bool cuda_ok(const run_t *R, const char *what, cudaError_t e)
{
    if (e == cudaSuccess)
        return true;
    fprintf(stderr, "rank %d: %s: %s: %s\n", R->rank, what, cudaGetErrorName(e), cudaGetErrorString(e));
    return false;
}

/* Device memory the configured way (--alloc); NULL (printed) on failure. */
static void *dev_alloc(run_t *R, size_t bytes)
{
    void *p = NULL;
    if (R->use_colld_alloc) {
        colld_status_t st = colld_mem_alloc(R->c, &p, bytes, COLLD_MEM_CUDA);
        if (st != COLLD_OK) {
            fprintf(stderr, "rank %d: colld_mem_alloc(%zu, COLLD_MEM_CUDA): %s: %s\n", R->rank, bytes,
                    colld_status_name(st), colld_status_string(st));
            return NULL;
        }
        return p;
    }
    return cuda_ok(R, "cudaMalloc", cudaMalloc(&p, bytes)) ? p : NULL;
}

static void dev_free(run_t *R, void *p)
{
    if (!p)
        return;
    if (R->use_colld_alloc) {
        colld_status_t st = colld_mem_free(R->c, p);
        if (st != COLLD_OK)
            fprintf(stderr, "rank %d: colld_mem_free: %s\n", R->rank, colld_status_name(st));
    } else {
        (void)cuda_ok(R, "cudaFree", cudaFree(p));
    }
}

/* Wait for everything queued on the rank's stream, at most limit_ms. Returns 0, or -1 (printed)
 * when the stream reports an error or is still busy: a stream that never completes is what the
 * fault model forbids, so it is a failure in its own right, not a hang of the test. */
static int wait_stream(run_t *R, const char *what, int limit_ms)
{
    double start = harness_now_ms(), end = start + limit_ms;
    for (;;) {
        cudaError_t e = cudaStreamQuery(R->stream);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return cuda_ok(R, what, e) ? 0 : -1;
        if (harness_now_ms() > end) {
            fprintf(stderr, "rank %d: %s: the stream is still busy after %d ms: a collective never released it\n",
                    R->rank, what, limit_ms);
            return -1;
        }
        struct timespec ts = { 0, harness_now_ms() - start < 5 ? 2000 : 100000 };
        nanosleep(&ts, NULL);
    }
}

/* The communicator's asynchronous error; COLLD_INPROGRESS counts as none. */
static colld_status_t async_error(run_t *R)
{
    colld_status_t err = COLLD_OK;
    colld_status_t st = colld_comm_get_async_error(R->comm, &err);
    if (st != COLLD_OK)
        return st;
    return err == COLLD_INPROGRESS ? COLLD_OK : err;
}

/* A host address in the images as the device address of the same byte. */
static void *dev(const run_t *R, const void *host)
{
    const unsigned char *p = host;
    if (!p)
        return NULL;
    if (p >= R->hs && p < R->hs + R->reg_bytes)
        return R->ds + (p - R->hs);
    return R->dr + (p - R->hr);
}

/* ---------------------------------------------------------------------------------------------
 * Data: sizes, inputs, expected results (as colld-test-coll)
 * ------------------------------------------------------------------------------------------- */

static bool reduces(int kind)
{
    return kind == K_ALLREDUCE || kind == K_REDUCE || kind == K_REDUCESCATTER;
}

/* Elements of the send and receive buffers of a call on one rank (NCCL's counts). */
static void call_sizes(const call_t *k, int n, size_t *send_elems, size_t *recv_elems)
{
    *send_elems = k->kind == K_REDUCESCATTER ? (size_t)n * k->count : k->count;
    *recv_elems = k->kind == K_ALLGATHER ? (size_t)n * k->count : k->count;
}

/* Bytes of the one buffer an in-place call uses (the larger of send and receive). */
static size_t inplace_bytes(const call_t *k, int n)
{
    size_t s, r;
    call_sizes(k, n, &s, &r);
    return (s > r ? s : r) * colld_dtype_size(k->dt);
}

static bool receives(const call_t *k, int rank)
{
    return k->kind != K_REDUCE || rank == k->root;
}

/* Fill mine/inputs/expect of a call for this rank. Returns 0, or -1 when out of memory or the
 * oracle refuses. */
static int prepare_data(run_t *R, call_t *k)
{
    int n = R->n;
    size_t es = colld_dtype_size(k->dt), se, re;
    call_sizes(k, n, &se, &re);
    k->mine = malloc(se * es + 1);
    k->expect = malloc(re * es + 1);
    k->inputs = reduces(k->kind) ? malloc((size_t)n * k->count * es + 1) : NULL;
    if (!k->mine || !k->expect || (reduces(k->kind) && !k->inputs))
        return -1;
    colld_cpu_pattern(k->dt, R->rank, k->salt, 0, se, k->mine);
    switch (k->kind) {
    case K_ALLREDUCE:
    case K_REDUCE:
    case K_REDUCESCATTER: {
        size_t first = k->kind == K_REDUCESCATTER ? (size_t)R->rank * k->count : 0;
        const void *in[MAX_RANKS];
        for (int r = 0; r < n; r++) {
            unsigned char *p = k->inputs + (size_t)r * k->count * es;
            colld_cpu_pattern(k->dt, r, k->salt, first, k->count, p);
            in[r] = p;
        }
        void *out[1] = { k->expect };
        if (k->count && colld_cpu_reduce_scalar(k->dt, k->op, in, n, out, 1, k->count) != COLLD_OK)
            return -1;
        break;
    }
    case K_BROADCAST:
        colld_cpu_pattern(k->dt, k->root, k->salt, 0, k->count, k->expect);
        break;
    case K_ALLGATHER:
        for (int r = 0; r < n; r++)
            colld_cpu_pattern(k->dt, r, k->salt, 0, k->count, k->expect + (size_t)r * k->count * es);
        break;
    }
    return 0;
}

static void free_data(call_t *k)
{
    free(k->mine);
    free(k->inputs);
    free(k->expect);
    k->mine = k->inputs = k->expect = NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Reporting
 * ------------------------------------------------------------------------------------------- */

/* One element as its value and, for floating types, its bits. */
static void fmt_elem(colld_dtype_t dt, const void *p, char *buf, size_t len)
{
    switch (dt) {
    case COLLD_INT8: snprintf(buf, len, "%d", *(const int8_t *)p); break;
    case COLLD_UINT8: snprintf(buf, len, "%u", *(const uint8_t *)p); break;
    case COLLD_INT32: snprintf(buf, len, "%" PRId32, *(const int32_t *)p); break;
    case COLLD_UINT32: snprintf(buf, len, "%" PRIu32, *(const uint32_t *)p); break;
    case COLLD_INT64: snprintf(buf, len, "%" PRId64, *(const int64_t *)p); break;
    case COLLD_UINT64: snprintf(buf, len, "%" PRIu64, *(const uint64_t *)p); break;
    case COLLD_FLOAT16:
        snprintf(buf, len, "%.9g (0x%04x)", (double)colld_half_to_float(*(const uint16_t *)p), *(const uint16_t *)p);
        break;
    case COLLD_BFLOAT16:
        snprintf(buf, len, "%.9g (0x%04x)", (double)colld_bf16_to_float(*(const uint16_t *)p), *(const uint16_t *)p);
        break;
    case COLLD_FLOAT32: {
        uint32_t b;
        memcpy(&b, p, 4);
        snprintf(buf, len, "%.9g (0x%08" PRIx32 ")", (double)*(const float *)p, b);
        break;
    }
    case COLLD_FLOAT64: {
        uint64_t b;
        memcpy(&b, p, 8);
        snprintf(buf, len, "%.17g (0x%016" PRIx64 ")", *(const double *)p, b);
        break;
    }
    default: snprintf(buf, len, "?"); break;
    }
}

static void describe(const run_t *R, const call_t *k, char *buf, size_t len)
{
    snprintf(buf, len, "rank %d/%d (gpu, %s): %s dtype %s op %s count %zu root %d %s%s salt %u", R->rank, R->n,
             R->use_colld_alloc ? "colld_mem_alloc" : "cudaMalloc", kind_names[k->kind], dtype_names[k->dt],
             reduces(k->kind) ? op_names[k->op] : "-", k->count, k->root, k->inplace ? "in-place" : "out-of-place",
             k->null_unused ? " (unused buffer NULL)" : "", k->salt);
}

static void report(run_t *R, const call_t *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Print a failure of a call (while the report budget lasts). */
static void report(run_t *R, const call_t *k, const char *fmt, ...)
{
    if (R->reported++ >= R->a->max_report)
        return;
    char d[320], what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    describe(R, k, d, sizeof(d));
    fprintf(stderr, "MISMATCH %s: %s\n", d, what);
}

/* Compare nelem elements bitwise; print the first differences with their inputs. Returns the
 * number of differing elements. */
static size_t compare(run_t *R, const call_t *k, const char *what, const unsigned char *got,
                      const unsigned char *want, size_t nelem)
{
    size_t es = colld_dtype_size(k->dt);
    if (nelem == 0 || memcmp(got, want, nelem * es) == 0)
        return 0;
    size_t wrong = 0, first = SIZE_MAX;
    for (size_t i = 0; i < nelem; i++)
        if (memcmp(got + i * es, want + i * es, es) != 0) {
            if (!wrong)
                first = i;
            wrong++;
        }
    report(R, k, "%s: %zu of %zu elements differ, first at %zu", what, wrong, nelem, first);
    int shown = 0;
    for (size_t i = first; i < nelem && shown < 4 && R->reported <= R->a->max_report; i++) {
        if (memcmp(got + i * es, want + i * es, es) == 0)
            continue;
        char g[64], w[64], ins[512] = "";
        fmt_elem(k->dt, got + i * es, g, sizeof(g));
        fmt_elem(k->dt, want + i * es, w, sizeof(w));
        if (k->inputs && i < k->count) {
            size_t off = 0;
            for (int r = 0; r < R->n && off < sizeof(ins) - 80; r++) {
                char v[64];
                fmt_elem(k->dt, k->inputs + ((size_t)r * k->count + i) * es, v, sizeof(v));
                off += (size_t)snprintf(ins + off, sizeof(ins) - off, " r%d=%s", r, v);
            }
        }
        fprintf(stderr, "    element %zu: got %s, expected %s%s%s\n", i, g, w, ins[0] ? "; inputs" : "", ins);
        shown++;
    }
    return wrong;
}

static bool untouched(const unsigned char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != SENTINEL)
            return false;
    return true;
}

/* An unexpected status (fatal for the mode: the communicator may be broken). Returns -1. */
static int status_fail(run_t *R, const call_t *k, const char *what, colld_status_t st)
{
    char d[320] = "";
    if (k)
        describe(R, k, d, sizeof(d));
    fprintf(stderr, "FAILED %s: %s returned %s: %s\n", d, what, colld_status_name(st), colld_comm_last_error(R->comm));
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * One call: host images, upload, post on the stream, download, check
 * ------------------------------------------------------------------------------------------- */

/* Fill the call's slots in the host images (sentinels, this rank's input) and set its pointers. */
static void prepare_buffers(run_t *R, call_t *k)
{
    int n = R->n, rank = R->rank;
    size_t es = colld_dtype_size(k->dt), se, re;
    call_sizes(k, n, &se, &re);
    unsigned char *sbuf = k->sreg + GUARD, *rbuf = k->rreg + GUARD;
    bool is_root = rank == k->root;
    if (!k->inplace) {
        memset(k->sreg, SENTINEL, se * es + 2 * GUARD);
        memcpy(sbuf, k->mine, se * es);
        memset(k->rreg, SENTINEL, re * es + 2 * GUARD);
        k->sendp = sbuf;
        k->recvp = rbuf;
        if (k->null_unused && !is_root && k->kind == K_BROADCAST)
            k->sendp = NULL;
        if (k->null_unused && !is_root && k->kind == K_REDUCE)
            k->recvp = NULL;
        return;
    }
    memset(k->rreg, SENTINEL, inplace_bytes(k, n) + 2 * GUARD);
    switch (k->kind) {
    case K_ALLGATHER: /* send is this rank's slice of the receive buffer */
        memcpy(rbuf + (size_t)rank * k->count * es, k->mine, se * es);
        k->sendp = rbuf + (size_t)rank * k->count * es;
        k->recvp = rbuf;
        break;
    case K_REDUCESCATTER: /* receive is this rank's slice of the send buffer */
        memcpy(rbuf, k->mine, se * es);
        k->sendp = rbuf;
        k->recvp = rbuf + (size_t)rank * k->count * es;
        break;
    case K_BROADCAST:
        if (is_root)
            memcpy(rbuf, k->mine, se * es);
        k->sendp = k->recvp = rbuf;
        break;
    default:
        memcpy(rbuf, k->mine, se * es);
        k->sendp = k->recvp = rbuf;
        break;
    }
}

/* Post a call on the rank's stream, with device pointers. */
static colld_status_t post_call(run_t *R, const call_t *k)
{
    const void *s = dev(R, k->sendp);
    void *r = dev(R, k->recvp), *st = R->stream;
    switch (k->kind) {
    case K_ALLREDUCE: return colld_allreduce(s, r, k->count, k->dt, k->op, R->comm, st);
    case K_BROADCAST: return colld_broadcast(s, r, k->count, k->dt, k->root, R->comm, st);
    case K_REDUCE: return colld_reduce(s, r, k->count, k->dt, k->op, k->root, R->comm, st);
    case K_ALLGATHER: return colld_allgather(s, r, k->count, k->dt, R->comm, st);
    default: return colld_reducescatter(s, r, k->count, k->dt, k->op, R->comm, st);
    }
}

/* Check a completed call in the downloaded images: the result bitwise, the guards, the unchanged
 * send buffer (out of place) and unused buffers. Returns 0 when exact, else 1 (printed). */
static int check_call(run_t *R, const call_t *k)
{
    int n = R->n, rank = R->rank;
    size_t es = colld_dtype_size(k->dt), se, re, bad = 0;
    call_sizes(k, n, &se, &re);
    const unsigned char *sbuf = k->sreg + GUARD, *rbuf = k->rreg + GUARD;
    size_t rspan = k->inplace ? inplace_bytes(k, n) : re * es;
    if (!untouched(k->rreg, GUARD) || !untouched(rbuf + rspan, GUARD)) {
        report(R, k, "bytes around the receive buffer were overwritten on the device");
        bad++;
    }
    if (receives(k, rank)) {
        const unsigned char *res = rbuf;
        if (k->inplace && k->kind == K_REDUCESCATTER)
            res = rbuf + (size_t)rank * k->count * es;
        bad += compare(R, k, "result", res, k->expect, re);
    } else if (k->inplace) {
        bad += compare(R, k, "non-root's buffer (must be unchanged)", rbuf, k->mine, se);
    } else if (!untouched(rbuf, re * es)) {
        report(R, k, "the non-root's receive buffer was written");
        bad++;
    }
    if (!k->inplace) {
        if (!untouched(k->sreg, GUARD) || !untouched(sbuf + se * es, GUARD)) {
            report(R, k, "bytes around the send buffer were overwritten on the device");
            bad++;
        }
        bad += compare(R, k, "send buffer (must be unchanged)", sbuf, k->mine, se);
    }
    return bad ? 1 : 0;
}

/* Run one call in the slots at the start of the buffers: upload the images on the stream, post,
 * download on the stream, wait, check. Returns 0 exact, 1 mismatch, -1 fatal. */
static int run_call(run_t *R, call_t *k)
{
    const args_t *a = R->a;
    int rc = -1;
    k->sreg = R->hs;
    k->rreg = R->hr;
    if (prepare_data(R, k) < 0) {
        fprintf(stderr, "rank %d: out of memory or the oracle refused\n", R->rank);
        goto out;
    }
    prepare_buffers(R, k);
    size_t es = colld_dtype_size(k->dt), se, re;
    call_sizes(k, R->n, &se, &re);
    size_t sspan = se * es + 2 * GUARD, rspan = (k->inplace ? inplace_bytes(k, R->n) : re * es) + 2 * GUARD;
    if ((!k->inplace && !cuda_ok(R, "cudaMemcpyAsync H2D (send)",
                                 cudaMemcpyAsync(R->ds, R->hs, sspan, cudaMemcpyHostToDevice, R->stream))) ||
        !cuda_ok(R, "cudaMemcpyAsync H2D (recv)",
                 cudaMemcpyAsync(R->dr, R->hr, rspan, cudaMemcpyHostToDevice, R->stream)))
        goto out;
    if (a->host_sync && wait_stream(R, "the upload", WAIT_GRACE_MS) < 0)
        goto out;
    colld_status_t st = post_call(R, k);
    if (st != COLLD_OK) {
        status_fail(R, k, "the stream-ordered call", st);
        goto out;
    }
    if (!cuda_ok(R, "cudaMemcpyAsync D2H (recv)",
                 cudaMemcpyAsync(R->hr, R->dr, rspan, cudaMemcpyDeviceToHost, R->stream)) ||
        (!k->inplace && !cuda_ok(R, "cudaMemcpyAsync D2H (send)",
                                 cudaMemcpyAsync(R->hs, R->ds, sspan, cudaMemcpyDeviceToHost, R->stream))))
        goto out;
    if (wait_stream(R, kind_names[k->kind], a->timeout_ms + WAIT_GRACE_MS) < 0)
        goto out;
    if ((st = async_error(R)) != COLLD_OK) {
        status_fail(R, k, "colld_comm_get_async_error after the stream completed", st);
        goto out;
    }
    rc = check_call(R, k);
    R->collectives++;
    if (rc > 0)
        R->bad++;
out:
    free_data(k);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Modes
 * ------------------------------------------------------------------------------------------- */

static size_t big_count(colld_dtype_t dt)
{
    return BIG_BYTES / colld_dtype_size(dt) + 3;
}

/* The big count covers, unless --big-all: broadcast and all-gather for every dtype; the reductions
 * for every dtype with sum and for float32 with every op (the small counts cover everything). */
static bool big_selected(const args_t *a, int kind, colld_dtype_t dt, colld_redop_t op)
{
    return a->big_all || !reduces(kind) || op == COLLD_SUM || dt == COLLD_FLOAT32;
}

static int mode_matrix(run_t *R, int iter)
{
    const args_t *a = R->a;
    for (int kk = 0; kk < K_COUNT; kk++) {
        int kind = (kk + a->rotate) % K_COUNT;
        if (!(a->kinds & (1u << kind)))
            continue;
        for (int d = 0; d < COLLD_DTYPE_COUNT; d++) {
            if (!(a->dtypes & (1u << d)))
                continue;
            for (int ci = 0; ci <= SMALL_COUNTS; ci++) {
                bool big = ci == SMALL_COUNTS;
                if (big && !a->big)
                    continue;
                size_t count = big ? big_count((colld_dtype_t)d) : small_counts[ci];
                for (int op = 0; op < (reduces(kind) ? COLLD_REDOP_COUNT : 1); op++) {
                    if (reduces(kind) && !(a->ops & (1u << op)))
                        continue;
                    if (big && !big_selected(a, kind, (colld_dtype_t)d, (colld_redop_t)op))
                        continue;
                    long id = R->cases++;
                    for (int m = 0; m < 2; m++) {
                        call_t k = { .kind = kind,
                                     .dt = (colld_dtype_t)d,
                                     .op = (colld_redop_t)op,
                                     .count = count,
                                     .root = (int)((id + m) % R->n),
                                     .inplace = m == 1,
                                     .null_unused = m == 0 && (id / R->n) % 2 == 1,
                                     .salt = a->salt * 1000003u + (unsigned)iter * 7919u + (unsigned)id * 2u +
                                             (unsigned)m };
                        if (run_call(R, &k) < 0)
                            return 1;
                    }
                }
            }
        }
    }
    return R->bad ? 1 : 0;
}

/* A few exact all-reduces (float32 sum at a large odd count, int32 max, float16 sum in place). */
static int exact_allreduces(run_t *R, unsigned salt)
{
    call_t k[3] = {
        { .kind = K_ALLREDUCE, .dt = COLLD_FLOAT32, .op = COLLD_SUM, .count = ((size_t)1 << 18) + 1, .salt = salt },
        { .kind = K_ALLREDUCE, .dt = COLLD_INT32, .op = COLLD_MAX, .count = 1001, .salt = salt + 1 },
        { .kind = K_ALLREDUCE, .dt = COLLD_FLOAT16, .op = COLLD_SUM, .count = 4099, .inplace = true, .salt = salt + 2 },
    };
    for (int i = 0; i < 3; i++)
        if (run_call(R, &k[i]) != 0)
            return 1;
    return 0;
}

/* Allocate the device buffers of the rank (reg_bytes each). */
static int alloc_buffers(run_t *R)
{
    R->ds = dev_alloc(R, R->reg_bytes);
    R->dr = R->ds ? dev_alloc(R, R->reg_bytes) : NULL;
    return R->dr ? 0 : -1;
}

static void free_buffers(run_t *R)
{
    dev_free(R, R->ds);
    dev_free(R, R->dr);
    R->ds = R->dr = NULL;
}

/* --iters rounds of allocate, exact all-reduces, free: addresses come back from the allocator
 * (reported), and a registration cached by address alone would read freed memory. */
static int mode_realloc(run_t *R)
{
    void *prev[2] = { NULL, NULL };
    int reused = 0;
    free_buffers(R);
    for (int it = 0; it < R->a->iters; it++) {
        if (alloc_buffers(R) < 0)
            return 1;
        reused += (void *)R->ds == prev[0] || (void *)R->ds == prev[1] || (void *)R->dr == prev[0] ||
                  (void *)R->dr == prev[1];
        prev[0] = R->ds;
        prev[1] = R->dr;
        if (exact_allreduces(R, R->a->salt + (unsigned)it * 10u) != 0)
            return 1;
        free_buffers(R);
    }
    if (R->rank == 0)
        fprintf(stderr, "rank 0: realloc: %d of %d rounds got an address of the round before back\n", reused,
                R->a->iters);
    return alloc_buffers(R) < 0 ? 1 : 0; /* main frees them */
}

/* Expected consumer output of round `it` at element i: 2 x (sum over ranks of the input) + 1. */
static float stream_expect(const run_t *R, int it, size_t i)
{
    float sum = 0;
    for (int r = 0; r < R->n; r++)
        sum += GPU_RANK_VALUE(r, it, R->a->salt, i);
    return GPU_RANK_CONSUME(sum);
}

/* Queue one round: produce x -> all-reduce (x -> y, or in place on x) -> consume into z. */
static int stream_round(run_t *R, int it, float *x, float *y, float *z, double *call_ms)
{
    bool inplace = it % 2 == 1;
    int e = gpu_rank_produce(x, STREAM_COUNT, R->rank, it, R->a->salt, R->stream);
    if (!cuda_ok(R, "producer launch", (cudaError_t)e))
        return -1;
    double t0 = harness_now_ms();
    colld_status_t st = colld_allreduce(x, inplace ? x : y, STREAM_COUNT, COLLD_FLOAT32, COLLD_SUM, R->comm, R->stream);
    *call_ms = harness_now_ms() - t0;
    if (st != COLLD_OK) {
        fprintf(stderr, "rank %d: stream round %d: colld_allreduce: %s: %s\n", R->rank, it, colld_status_name(st),
                colld_comm_last_error(R->comm));
        return -1;
    }
    e = gpu_rank_consume(inplace ? x : y, z, STREAM_COUNT, R->stream);
    return cuda_ok(R, "consumer launch", (cudaError_t)e) ? 0 : -1;
}

/* Producer kernel -> colld_allreduce -> consumer kernel on the stream without host waits. */
static int mode_stream(run_t *R)
{
    const args_t *a = R->a;
    size_t round_bytes = STREAM_COUNT * sizeof(float);
    float *x = (float *)R->ds, *y = (float *)R->dr, *z = NULL, *host = NULL;
    size_t need = STREAM_ROUNDS * round_bytes;
    int rc = 1, bad = 0;
    double call_ms = 0, first_call_ms = 0, max_call_ms = 0;
    if (need > R->reg_bytes) {
        fprintf(stderr, "rank %d: stream: buffers of %zu bytes are too small\n", R->rank, R->reg_bytes);
        return 2;
    }
    if (!cuda_ok(R, "cudaMalloc (consumer output)", cudaMalloc((void **)&z, need)) ||
        !cuda_ok(R, "cudaMallocHost", cudaMallocHost((void **)&host, need)))
        goto out;

    /* Warm-up round (the library registers the buffers here), waited for and checked. */
    if (stream_round(R, 0, x, y, z, &first_call_ms) < 0 ||
        wait_stream(R, "warm-up round", a->timeout_ms + WAIT_GRACE_MS) < 0 ||
        !cuda_ok(R, "cudaMemcpy D2H", cudaMemcpy(host, z, round_bytes, cudaMemcpyDeviceToHost)))
        goto out;
    for (size_t i = 0; i < STREAM_COUNT; i++)
        bad += host[i] != stream_expect(R, 0, i);
    if (bad) {
        fprintf(stderr, "rank %d: stream warm-up: %d wrong elements\n", R->rank, bad);
        goto out;
    }

    /* Poison the inputs and outputs (a collective that runs before the producer, or a consumer
     * that runs before the collective, sees these), and wait until that is done. */
    if (!cuda_ok(R, "cudaMemset", cudaMemset(x, SENTINEL, need)) ||
        !cuda_ok(R, "cudaMemset", cudaMemset(y, SENTINEL, need)) ||
        !cuda_ok(R, "cudaMemset", cudaMemset(z, SENTINEL, need)) ||
        !cuda_ok(R, "cudaDeviceSynchronize", cudaDeviceSynchronize()))
        goto out;

    /* Round 0 behind a slow producer: the host call must not wait for it. */
    double t0 = harness_now_ms();
    if (!cuda_ok(R, "spin launch", (cudaError_t)gpu_rank_spin(a->spin_ms, R->stream)))
        goto out;
    if (stream_round(R, 0, x, y, z, &call_ms) < 0)
        goto out;
    cudaError_t q = cudaStreamQuery(R->stream);
    double after_call = harness_now_ms() - t0;
    max_call_ms = call_ms;
    /* The other rounds queued back to back behind it. */
    for (int it = 1; it < STREAM_ROUNDS; it++) {
        double ms;
        if (stream_round(R, it, x + (size_t)it * STREAM_COUNT, y + (size_t)it * STREAM_COUNT,
                         z + (size_t)it * STREAM_COUNT, &ms) < 0)
            goto out;
        max_call_ms = ms > max_call_ms ? ms : max_call_ms;
    }
    if (!cuda_ok(R, "cudaMemcpyAsync D2H", cudaMemcpyAsync(host, z, need, cudaMemcpyDeviceToHost, R->stream)))
        goto out;
    if (wait_stream(R, "the rounds", a->timeout_ms + WAIT_GRACE_MS + (int)a->spin_ms) < 0)
        goto out;
    double total = harness_now_ms() - t0;
    if (!cuda_ok(R, "cudaStreamSynchronize", cudaStreamSynchronize(R->stream)))
        goto out;
    colld_status_t st = async_error(R);
    if (st != COLLD_OK) {
        fprintf(stderr, "rank %d: stream: async error %s: %s\n", R->rank, colld_status_name(st),
                colld_comm_last_error(R->comm));
        goto out;
    }
    for (int it = 0; it < STREAM_ROUNDS; it++) {
        size_t wrong = 0, first = 0;
        const float *zz = host + (size_t)it * STREAM_COUNT;
        for (size_t i = 0; i < STREAM_COUNT; i++)
            if (zz[i] != stream_expect(R, it, i) && wrong++ == 0)
                first = i;
        if (wrong) {
            fprintf(stderr, "rank %d: stream round %d (%s): %zu of %zu consumer outputs wrong, first at %zu: "
                    "got %.9g, expected %.9g\n", R->rank, it, it % 2 ? "in place" : "out of place", wrong,
                    (size_t)STREAM_COUNT, first, (double)zz[first], (double)stream_expect(R, it, first));
            bad++;
        }
    }
    fprintf(stderr, "rank %d: stream: first call (registration) %.2f ms; behind a %.0f ms producer the call took "
            "%.3f ms (limit %.0f), the stream was %s when it returned (%.1f ms after the spin started), all %d "
            "rounds done after %.1f ms (at least %.0f expected); slowest later call %.3f ms\n",
            R->rank, first_call_ms, a->spin_ms, call_ms, HOST_CALL_LIMIT_MS,
            q == cudaErrorNotReady ? "busy" : q == cudaSuccess ? "ALREADY DONE" : cudaGetErrorName(q), after_call,
            STREAM_ROUNDS, total, 0.75 * a->spin_ms, max_call_ms);
    if (call_ms >= HOST_CALL_LIMIT_MS) {
        fprintf(stderr, "rank %d: FAILED: the colld_allreduce host call took %.3f ms behind a busy stream "
                "(limit %.0f ms): it waited for the GPU\n", R->rank, call_ms, HOST_CALL_LIMIT_MS);
        bad++;
    }
    if (q != cudaErrorNotReady) {
        fprintf(stderr, "rank %d: FAILED: the stream was not busy when colld_allreduce returned (%s)\n", R->rank,
                cudaGetErrorName(q));
        bad++;
    }
    if (total < 0.75 * a->spin_ms) {
        fprintf(stderr, "rank %d: FAILED: the stream finished after %.1f ms, before the %.0f ms producer could have\n",
                R->rank, total, a->spin_ms);
        bad++;
    }
    R->collectives += 1 + STREAM_ROUNDS;
    rc = bad ? 1 : 0;
out:
    if (z)
        (void)cuda_ok(R, "cudaFree", cudaFree(z));
    if (host)
        (void)cuda_ok(R, "cudaFreeHost", cudaFreeHost(host));
    return rc;
}

/* Write `text` to `path` atomically (a temporary file renamed over it); 0 or -1 (printed). */
static int write_file(const char *path, const char *text)
{
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int bad = !f;
    if (f) {
        bad |= fputs(text, f) < 0;
        bad |= fclose(f) != 0;
    }
    if (bad || rename(tmp, path) != 0) {
        fprintf(stderr, "gpu_rank: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

/* Write `text` to <sync-dir>/<name>. */
static void sync_write(const run_t *R, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", R->a->sync_dir, name);
    (void)write_file(path, text);
}

/* The victim of the fault test: announce itself and wait for SIGKILL (at most 120 s). */
static int fault_victim(run_t *R)
{
    if (R->a->victim_posts) {
        /* Its stream waits behind a long spin, so it never marks its input ready: every stream of
         * the communicator waits when the driver kills it. */
        if (!cuda_ok(R, "spin launch", (cudaError_t)gpu_rank_spin(VICTIM_SPIN_MS, R->stream)))
            return 1;
        colld_status_t st = colld_allreduce(R->ds + GUARD, R->dr + GUARD, FAULT_COUNT, COLLD_FLOAT32, COLLD_SUM,
                                            R->comm, R->stream);
        if (st != COLLD_OK)
            return status_fail(R, NULL, "the victim's colld_allreduce", st) ? 1 : 0;
    }
    sync_write(R, "victim-ready", "ready\n");
    fprintf(stderr, "rank %d (pid %d): the victim, %s; waiting to be killed\n", R->rank, (int)getpid(),
            R->a->victim_posts ? "posted behind a long spin" : "did not post");
    for (int i = 0; i < 1200; i++)
        usleep(100000);
    fprintf(stderr, "rank %d: the victim was not killed within 120 s\n", R->rank);
    return 1;
}

/* A survivor of the fault test; see the mode's description at the top. */
static int fault_survivor(run_t *R)
{
    const args_t *a = R->a;
    char text[512], name[64];
    colld_status_t st = colld_allreduce(R->ds + GUARD, R->dr + GUARD, FAULT_COUNT, COLLD_FLOAT32, COLLD_SUM, R->comm,
                                        R->stream);
    double posted = harness_now_ms();
    if (st != COLLD_OK)
        return status_fail(R, NULL, "colld_allreduce (posted before the kill)", st) ? 1 : 0;
    snprintf(name, sizeof(name), "posted-%d", R->rank);
    sync_write(R, name, "posted\n");

    /* The stream must be released: within the timeout when the daemon only notices the missing
     * rank by its timer, far sooner when it sees the process die. */
    if (wait_stream(R, "the all-reduce the victim never finished", a->timeout_ms + RELEASE_GRACE_MS) < 0) {
        fflush(stderr);
        _exit(1); /* a stream that never completes would also hang the exit */
    }
    double released = harness_now_ms();
    if (!cuda_ok(R, "cudaStreamSynchronize after the release", cudaStreamSynchronize(R->stream)))
        return 1;
    /* The error may be recorded a moment after the stream moved on. */
    colld_status_t err = async_error(R);
    while (err == COLLD_OK && harness_now_ms() < released + 2000) {
        usleep(1000);
        err = async_error(R);
    }
    fprintf(stderr, "rank %d: stream released %.1f ms after the post; async error %s: %s\n", R->rank,
            released - posted, colld_status_name(err), colld_comm_last_error(R->comm));
    snprintf(name, sizeof(name), "released-%d", R->rank);
    snprintf(text, sizeof(text), "%.3f %s\n", released, colld_status_name(err));
    sync_write(R, name, text);
    if (err != COLLD_ERR_PEER_LOST && err != COLLD_ERR_TIMEOUT) {
        fprintf(stderr, "rank %d: FAILED: expected COLLD_ERR_PEER_LOST (or COLLD_ERR_TIMEOUT), got %s\n", R->rank,
                colld_status_name(err));
        return 1;
    }

    /* A later call on the broken communicator fails at once or releases its stream with the error. */
    st = colld_allreduce(R->ds + GUARD, R->dr + GUARD, 1001, COLLD_FLOAT32, COLLD_SUM, R->comm, R->stream);
    if (st == COLLD_OK) {
        if (wait_stream(R, "a call on the broken communicator", RELEASE_GRACE_MS) < 0) {
            fflush(stderr);
            _exit(1);
        }
        if ((st = async_error(R)) == COLLD_OK) {
            fprintf(stderr, "rank %d: FAILED: a call on the broken communicator completed without an error\n", R->rank);
            return 1;
        }
    }
    fprintf(stderr, "rank %d: a later call on the broken communicator: %s\n", R->rank, colld_status_name(st));

    double t0 = harness_now_ms();
    st = colld_comm_destroy(R->comm);
    R->comm = NULL;
    fprintf(stderr, "rank %d: colld_comm_destroy of the broken communicator: %s in %.1f ms\n", R->rank,
            colld_status_name(st), harness_now_ms() - t0);

    /* The survivors form a new communicator and it works, on the same buffers and stream. */
    colld_unique_id_t id2;
    if (harness_uid_from_hex(a->uid2_hex, &id2) < 0) {
        fprintf(stderr, "rank %d: bad --uid2\n", R->rank);
        return 2;
    }
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = 60000;
    cfg.name = "gpu-survivors";
    int new_rank = R->rank < a->victim ? R->rank : R->rank - 1;
    if ((st = colld_comm_init_rank(R->c, &R->comm, R->n - 1, id2, new_rank, &cfg)) != COLLD_OK) {
        R->comm = NULL;
        fprintf(stderr, "rank %d: joining the survivors' communicator: %s\n", R->rank, colld_status_name(st));
        return 1;
    }
    R->n -= 1;
    R->rank = new_rank;
    int rc = exact_allreduces(R, a->salt + 900);
    fprintf(stderr, "rank %d of the survivors: exact all-reduces on a new communicator: %s\n", R->rank,
            rc ? "FAILED" : "ok");
    return rc;
}

static int mode_fault(run_t *R)
{
    const args_t *a = R->a;
    if (!a->sync_dir || !a->uid2_hex || a->victim < 0 || a->victim >= R->n || R->n < 3) {
        fprintf(stderr, "rank %d: --mode fault needs --sync-dir, --uid2, 3+ ranks and --victim in range\n", R->rank);
        return 2;
    }
    if (exact_allreduces(R, a->salt) != 0) /* warm-up: the buffers are registered, the path works */
        return 1;
    return R->rank == a->victim ? fault_victim(R) : fault_survivor(R);
}

/* Whether the ranks stop: an all-reduce (max) of "the stop file exists" on the device, so that
 * every rank leaves after the same iteration. 1 stop, 0 go on, -1 failed (printed). */
static int stop_agreed(run_t *R)
{
    int32_t *flag = (int32_t *)R->hs;
    *flag = access(R->a->stop_file, F_OK) == 0;
    if (!cuda_ok(R, "cudaMemcpyAsync H2D (stop flag)",
                 cudaMemcpyAsync(R->ds, flag, sizeof(*flag), cudaMemcpyHostToDevice, R->stream)))
        return -1;
    colld_status_t st = colld_allreduce(R->ds, R->ds, 1, COLLD_INT32, COLLD_MAX, R->comm, R->stream);
    if (st != COLLD_OK)
        return status_fail(R, NULL, "the stop agreement", st);
    if (!cuda_ok(R, "cudaMemcpyAsync D2H (stop flag)",
                 cudaMemcpyAsync(flag, R->ds, sizeof(*flag), cudaMemcpyDeviceToHost, R->stream)) ||
        wait_stream(R, "the stop agreement", R->a->timeout_ms + WAIT_GRACE_MS) < 0)
        return -1;
    if ((st = async_error(R)) != COLLD_OK)
        return status_fail(R, NULL, "the stop agreement (async error)", st);
    return *flag != 0;
}

/* Exact all-reduces until --stop-file exists; the count so far in --progress-file. */
static int mode_loop(run_t *R)
{
    const args_t *a = R->a;
    if (!a->stop_file || !a->progress_file) {
        fprintf(stderr, "rank %d: --mode loop needs --stop-file and --progress-file\n", R->rank);
        return 2;
    }
    for (long it = 0;; it++) {
        int stop = stop_agreed(R);
        if (stop)
            return stop < 0 ? 1 : 0;
        call_t k = { .kind = K_ALLREDUCE, .dt = it % 2 ? COLLD_INT32 : COLLD_FLOAT32, .op = COLLD_SUM,
                     .count = 4096 + (size_t)(it % 7), .inplace = it % 3 == 0, .salt = a->salt + (unsigned)it };
        if (run_call(R, &k) != 0)
            return 1;
        if (R->rank == 0) {
            char num[32];
            snprintf(num, sizeof(num), "%ld\n", it + 1);
            (void)write_file(a->progress_file, num);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Set-up
 * ------------------------------------------------------------------------------------------- */

static int lookup(const char *name, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

/* A comma list of names (or "all") as a bit mask; 0 on an unknown name. */
static unsigned parse_mask(const char *list, const char *const *names, int n)
{
    if (strcmp(list, "all") == 0)
        return (1u << n) - 1;
    unsigned m = 0;
    char buf[256], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int i = lookup(t, names, n);
        if (i < 0) {
            fprintf(stderr, "gpu_rank: unknown name '%s'\n", t);
            return 0;
        }
        m |= 1u << i;
    }
    return m;
}

/* Bytes each device buffer needs for the mode. */
static size_t needed_bytes(const args_t *a)
{
    size_t n = (size_t)a->nranks;
    if (strcmp(a->mode, "stream") == 0)
        return STREAM_ROUNDS * STREAM_COUNT * sizeof(float);
    if (strcmp(a->mode, "matrix") == 0 && a->big)
        return n * (BIG_BYTES + 3 * 8) + 2 * GUARD;
    if (strcmp(a->mode, "matrix") == 0)
        return n * 1001 * 8 + 2 * GUARD;
    return n * (((size_t)1 << 20) + 8) * sizeof(float) + 2 * GUARD; /* realloc, fault, loop */
}

static int parse_args(int argc, char **argv, args_t *a)
{
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
#define ARG(name) (strcmp(argv[i], name) == 0 && ++i)
        if (ARG("--socket"))
            a->socket = v;
        else if (ARG("--uid"))
            a->uid_hex = v;
        else if (ARG("--uid2"))
            a->uid2_hex = v;
        else if (ARG("--nranks"))
            a->nranks = atoi(v);
        else if (ARG("--rank"))
            a->rank = atoi(v);
        else if (ARG("--mode"))
            a->mode = v;
        else if (ARG("--alloc"))
            a->alloc = v;
        else if (ARG("--kinds"))
            a->kinds = parse_mask(v, kind_names, K_COUNT);
        else if (ARG("--dtypes"))
            a->dtypes = parse_mask(v, dtype_names, COLLD_DTYPE_COUNT);
        else if (ARG("--ops"))
            a->ops = parse_mask(v, op_names, COLLD_REDOP_COUNT);
        else if (ARG("--salt"))
            a->salt = (unsigned)strtoul(v, NULL, 10);
        else if (ARG("--rotate"))
            a->rotate = atoi(v);
        else if (ARG("--iters"))
            a->iters = atoi(v);
        else if (ARG("--timeout-ms"))
            a->timeout_ms = atoi(v);
        else if (ARG("--max-report"))
            a->max_report = atoi(v);
        else if (ARG("--spin-ms"))
            a->spin_ms = atof(v);
        else if (ARG("--victim"))
            a->victim = atoi(v);
        else if (ARG("--sync-dir"))
            a->sync_dir = v;
        else if (ARG("--stop-file"))
            a->stop_file = v;
        else if (ARG("--progress-file"))
            a->progress_file = v;
        else if (strcmp(argv[i], "--no-big") == 0)
            a->big = false;
        else if (strcmp(argv[i], "--big-all") == 0)
            a->big_all = true;
        else if (strcmp(argv[i], "--host-sync") == 0)
            a->host_sync = true;
        else if (strcmp(argv[i], "--blocking-stream") == 0)
            a->blocking_stream = true;
        else if (strcmp(argv[i], "--victim-posts") == 0)
            a->victim_posts = true;
        else {
            fprintf(stderr, "gpu_rank: unknown argument %s\n", argv[i]);
            return 2;
        }
#undef ARG
    }
    if (a->victim < 0)
        a->victim = a->nranks - 1;
    bool alloc_ok = !strcmp(a->alloc, "cudamalloc") || !strcmp(a->alloc, "colld") || !strcmp(a->alloc, "mixed");
    if (!a->socket || !a->uid_hex || a->nranks < 1 || a->nranks > MAX_RANKS || a->rank < 0 ||
        a->rank >= a->nranks || !a->kinds || !a->dtypes || !a->ops || a->iters < 0 || !alloc_ok ||
        a->timeout_ms <= 0 || !(a->spin_ms >= 0)) {
        fprintf(stderr, "gpu_rank: need --socket, --uid, --nranks 1..%d, --rank; valid subsets; --alloc "
                "cudamalloc|colld|mixed\n", MAX_RANKS);
        return 2;
    }
    return 0;
}

/* Join the communicator, put the buffers on GPU 0, run the mode, leave. */
int main(int argc, char **argv)
{
    args_t a = { .mode = "matrix", .alloc = "cudamalloc", .timeout_ms = 120000, .iters = 1, .max_report = 40,
                 .victim = -1, .spin_ms = 200, .kinds = (1u << K_COUNT) - 1,
                 .dtypes = (1u << COLLD_DTYPE_COUNT) - 1, .ops = (1u << COLLD_REDOP_COUNT) - 1, .big = true };
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc;
    setvbuf(stderr, NULL, _IONBF, 0);
    run_t R = { .a = &a, .n = a.nranks, .rank = a.rank };
    R.use_colld_alloc = !strcmp(a.alloc, "colld") || (!strcmp(a.alloc, "mixed") && a.rank % 2 == 1);
    double t0 = harness_now_ms();
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "rank %d: SKIP: no CUDA GPU visible (%s)\n", a.rank, e ? cudaGetErrorName(e) : "0 devices");
        return 77;
    }
    unsigned flags = a.blocking_stream ? cudaStreamDefault : cudaStreamNonBlocking;
    if (!cuda_ok(&R, "cudaSetDevice(0)", cudaSetDevice(0)) ||
        !cuda_ok(&R, "cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&R.stream, flags)))
        return 1;
    colld_unique_id_t id;
    if (harness_uid_from_hex(a.uid_hex, &id) < 0) {
        fprintf(stderr, "gpu_rank: bad --uid\n");
        return 2;
    }
    colld_status_t st = colld_connect(a.socket, &R.c);
    if (st != COLLD_OK) {
        fprintf(stderr, "rank %d: connect: %s\n", a.rank, colld_status_name(st));
        return 1;
    }
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = a.timeout_ms;
    cfg.name = strcmp(a.mode, "loop") == 0 ? "gpu-background" : "test-gpu";
    st = colld_comm_init_rank(R.c, &R.comm, a.nranks, id, a.rank, &cfg);
    if (st != COLLD_OK) {
        fprintf(stderr, "rank %d: comm_init_rank: %s\n", a.rank, colld_status_name(st));
        R.comm = NULL;
        rc = 1;
        goto out;
    }
    R.reg_bytes = (needed_bytes(&a) + 4095) & ~(size_t)4095;
    if (alloc_buffers(&R) < 0 || !cuda_ok(&R, "cudaMallocHost", cudaMallocHost((void **)&R.hs, R.reg_bytes)) ||
        !cuda_ok(&R, "cudaMallocHost", cudaMallocHost((void **)&R.hr, R.reg_bytes))) {
        rc = 1;
        goto out;
    }
    if (strcmp(a.mode, "matrix") == 0) {
        for (int it = 0; it < a.iters && rc == 0; it++)
            rc = mode_matrix(&R, it);
    } else if (strcmp(a.mode, "realloc") == 0)
        rc = mode_realloc(&R);
    else if (strcmp(a.mode, "stream") == 0)
        rc = mode_stream(&R);
    else if (strcmp(a.mode, "fault") == 0)
        rc = mode_fault(&R);
    else if (strcmp(a.mode, "loop") == 0)
        rc = mode_loop(&R);
    else {
        fprintf(stderr, "gpu_rank: unknown mode %s\n", a.mode);
        rc = 2;
    }
    if (rc != 0 && R.reported > a.max_report)
        fprintf(stderr, "rank %d: %d more failures not shown\n", a.rank, R.reported - a.max_report);
    if (R.rank == 0)
        fprintf(stderr, "rank 0/%d: gpu mode %s (%s, %s stream): %ld collectives, %ld wrong, %.0f ms\n", R.n, a.mode,
                a.alloc, a.blocking_stream ? "blocking" : "non-blocking", R.collectives, R.bad, harness_now_ms() - t0);
out:
    free_buffers(&R);
    if (R.hs)
        cudaFreeHost(R.hs);
    if (R.hr)
        cudaFreeHost(R.hr);
    if (R.comm && (st = colld_comm_destroy(R.comm)) != COLLD_OK && rc == 0) {
        fprintf(stderr, "rank %d: colld_comm_destroy: %s\n", a.rank, colld_status_name(st));
        rc = 1;
    }
    colld_disconnect(R.c);
    cudaStreamDestroy(R.stream);
    return rc;
}
