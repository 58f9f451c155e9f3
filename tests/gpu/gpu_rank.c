/*
 * gpu_rank.c - colld-test-gpu-rank: one rank process of the GPU integration tests
 * (test_gpu_collectives.c), written against the public API only (colld/colld.h) and the CUDA driver
 * API (gpu_cu.h: no CUDA runtime), so that it runs on a real GPU and on the CUDA driver test double
 * (--cudafake: the libcuda.so.1 it finds must be the double, checked before any CUDA call).
 *
 * It connects to the daemon, joins a communicator at a rank, puts its buffers on GPU rank % --gpus
 * (default 1: every rank on GPU 0) and runs stream-ordered collectives on its own CUstream. Several
 * ranks of a test share a GPU as separate processes. Its kernels (a producer, a consumer, a slow
 * spin: gpu_rank_kernels.h) come from a fatbin of its own, embedded, loaded with cuLibraryLoadData
 * and launched with cuLaunchKernel. Inputs come from the deterministic generator of the host tests
 * (colld_cpu_pattern: every rank can compute every rank's input), expected results from the scalar
 * CPU oracle (colld_cpu_reduce_scalar, rank order 0..n-1), and every result is compared BITWISE.
 *
 * Buffers (--alloc): cumemalloc (default) cuMemAlloc'd device memory; colld colld_mem_alloc(...,
 * COLLD_MEM_CUDA); mixed: even ranks the one, odd ranks the other. Every collective reads and
 * writes a slot GUARD bytes into an allocation (so the library must find the containing allocation),
 * and the GUARD bytes around it must keep their sentinel on the device.
 *
 * Modes (--mode):
 *   matrix   (default) collective (gather, scatter and all-to-all included) x dtype x op (reducing
 *            kinds only) x count {0, 1, 1001, big} x {out-of-place, in-place}, as colld-test-coll does
 *            on host memory: big is >= 4 MiB per buffer (an odd count) and, unless --big-all, only
 *            the subset coll_big_selected() names (--big-min: float32 only, every kind once).
 *            Each call: the host images of the slots (sentinels and this rank's input) are copied
 *            to the device on the stream, the collective is posted on the stream, the slots are
 *            copied back on the stream, and only then does the host wait (--host-sync: also wait
 *            before posting). Select with --kinds, --dtypes, --ops, --no-big, --big-all, --big-min,
 *            --salt,
 *            --rotate, --iters.
 *   realloc  --iters rounds of: allocate the buffers, run exact all-reduces, free them. The
 *            allocator tends to hand the same addresses back, so a library that caches a
 *            registration by address alone reads freed memory and the results are wrong.
 *   stream   producer kernel -> colld_allreduce -> consumer kernel on the stream, with no host
 *            synchronisation in between. The first round's producer spins --spin-ms (default 200)
 *            first: the colld_allreduce host call must return within a quarter of the spin (at least
 *            HOST_CALL_LIMIT_MS: 50 ms behind the default spin) while the stream is still busy, and
 *            the stream must take at least 3/4 of the spin. A call that waited for the stream would
 *            take the whole spin; on the double (a loaded CI machine, sanitizers) the driver passes
 *            a longer spin, so the limit keeps its meaning with a margin for the host's stalls. Then
 *            STREAM_ROUNDS-1 more rounds are queued back to back (every other one in place), one
 *            wait at the end, and every consumer output must be exact.
 *   fault    the fault test (3 ranks): a warm-up all-reduce, then the survivors post an all-reduce
 *            and write <sync-dir>/posted-R; the victim (--victim, default the last rank) writes
 *            <sync-dir>/victim-ready and waits to be killed (-9) by the driver, without posting, or
 *            with --victim-posts after posting an all-reduce behind a long spin (so every stream
 *            waits). A survivor's stream must be released within the communicator timeout +
 *            RELEASE_GRACE_MS; cuStreamSynchronize must then succeed and
 *            colld_comm_get_async_error must give COLLD_ERR_PEER_LOST or COLLD_ERR_TIMEOUT (written
 *            with the release time to <sync-dir>/released-R). A later call on the broken
 *            communicator must not hang either. Then the survivors destroy it, join the 2-rank
 *            communicator --uid2 and run exact all-reduces on the same buffers and stream.
 *   loop     exact all-reduces until --stop-file exists, the count finished written to
 *            --progress-file: a communicator that must keep working while a test breaks another.
 *   crossed  the cross-communicator deadlock of GPU streams (issue 18; 2 ranks): the rank also
 *            joins --uid2 (B); rank 0 posts an all-reduce on the first communicator (A) then one on
 *            B, rank 1 posts B then A, all on its one stream. Both host calls return at once, then
 *            each stream waits in its first collective for the other rank's stream, which waits in
 *            the other: nothing moves. The daemon (driven with --deadlock-ms and --deadlock-fail)
 *            must see the cycle, fail both communicators with COLLD_ERR_DEADLOCK naming it and
 *            release the stream, within half the communicators' timeout.
 *   hofault  the faults of a collective whose ranks' streams are waited for on the GPU (issue 28's
 *            hand-off without the host; 2 ranks, --case): after exact warm-up all-reduces, rank 1's
 *            all-reduce is posted behind a spin (timeout: twice --timeout-ms; abort: 2 s) or with a
 *            different count (mismatch); in the abort case rank 0 calls colld_comm_abort 300 ms after
 *            posting. Every rank's stream must be released (rank 0 within the timeout + grace) with
 *            the case's status as the async error: COLLD_ERR_TIMEOUT naming rank 1 ("rank(s) 1
 *            never reached it"), COLLD_ERR_ABORTED, COLLD_ERR_MISMATCH; and the output buffer of
 *            rank 0 must be untouched (the kernels behind the wait did nothing).
 *
 * Exit code: 0 everything exact (or the expected failure came); 1 a mismatch, an unexpected status,
 * a CUDA error or a stream that was not released; 2 bad arguments; 77 no GPU visible (never with
 * --cudafake: there a missing double is a failure).
 */
#include "tools/testdata/pattern.h"
#include "tests/gpu/gpu_cu.h"
#include "tests/gpu/gpu_rank_kernels.h"
#include "tests/integration/coll_data.h"
#include "tests/integration/harness.h"

#include <colld/colld.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WAIT_GRACE_MS 10000                  /* a stream may take the communicator timeout plus this */
#define RELEASE_GRACE_MS 5000                /* fault: a survivor's stream is released within timeout + this */
#define HOST_CALL_LIMIT_MS 50.0              /* stream: the host call returns within max(this, spin / 4) */
#define STREAM_ROUNDS 8                      /* stream: producer -> all-reduce -> consumer rounds */
#define STREAM_COUNT (((size_t)1 << 20) + 5) /* stream: elements per round (odd) */
#define VICTIM_SPIN_MS 60000.0               /* fault --victim-posts: the victim's stream waits behind this */
#define FAULT_COUNT (((size_t)1 << 20) + 1)  /* fault: elements of the all-reduce that breaks */

typedef struct {
    const char *socket, *uid_hex, *uid2_hex, *mode, *alloc, *sync_dir, *stop_file, *progress_file, *fcase;
    int nranks, rank, timeout_ms, iters, rotate, max_report, victim, gpus;
    double spin_ms;
    int salt;
    unsigned kinds, dtypes, ops; /* bit masks */
    bool big, big_all, big_min, host_sync, blocking_stream, victim_posts, cudafake;
} args_t;

/* The driver, and the rank's kernels in its context. */
static gpu_cu_t cu;
static CUfunction spin_fn, produce_fn, consume_fn;

typedef struct {
    const args_t *a;
    colld_client_t *c;
    colld_comm_t *comm;
    int n, rank;
    bool use_colld_alloc;
    int dev; /* the GPU of this rank's buffers and stream */
    CUstream stream;
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
static bool cuda_ok(const run_t *R, const char *what, CUresult e)
{
    char why[256];
    if (e == CUDA_SUCCESS)
        return true;
    fprintf(stderr, "rank %d: %s: %s\n", R->rank, what, gpu_cu_describe(&cu, e, why, sizeof(why)));
    return false;
}

/* A device address as a pointer (the driver's CUdeviceptr is an integer) and back. */
#define DPTR(p) ((CUdeviceptr)(uintptr_t)(p))
#define HPTR(d) ((void *)(uintptr_t)(d))

/* A grid that covers n elements with 256 threads per block, at most 1024 blocks (grid-stride). */
static unsigned blocks_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return b == 0 ? 1u : b > 1024 ? 1024u : (unsigned)b;
}

/* Launch a kernel with its one parameter block on the rank's stream. */
static CUresult launch(const run_t *R, CUfunction f, unsigned blocks, unsigned threads, void *params)
{
    void *args[] = { params };
    return cu.cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, R->stream, args, NULL);
}

/* A slow producer: one thread that spins for ms milliseconds. */
static CUresult launch_spin(const run_t *R, double ms)
{
    gpu_rank_spin_params_t p = { .ns = (unsigned long long)(ms * 1e6) };
    return launch(R, spin_fn, 1, 1, &p);
}

/* x[i] = GPU_RANK_VALUE(rank, iter, salt, i) for i < n. */
static CUresult launch_produce(const run_t *R, float *x, size_t n, int iter, unsigned salt)
{
    gpu_rank_produce_params_t p = { .x = x, .n = n, .rank = R->rank, .iter = iter, .salt = salt };
    return n ? launch(R, produce_fn, blocks_for(n), 256, &p) : CUDA_SUCCESS;
}

/* z[i] = GPU_RANK_CONSUME(y[i]) for i < n. */
static CUresult launch_consume(const run_t *R, const float *y, float *z, size_t n)
{
    gpu_rank_consume_params_t p = { .y = y, .z = z, .n = n };
    return n ? launch(R, consume_fn, blocks_for(n), 256, &p) : CUDA_SUCCESS;
}

/* Load the rank's kernels (the embedded fatbin) and get them into the current context. */
static int load_kernels(const run_t *R)
{
    CUlibrary lib;
    CUkernel k;
    struct {
        const char *name;
        CUfunction *fn;
    } want[] = { { "gpu_rank_spin_kernel", &spin_fn },
                 { "gpu_rank_produce_kernel", &produce_fn },
                 { "gpu_rank_consume_kernel", &consume_fn } };
    if (!cuda_ok(R, "cuLibraryLoadData (the rank's kernels)",
                 cu.cuLibraryLoadData(&lib, gpu_rank_fatbin, NULL, NULL, 0, NULL, NULL, 0)))
        return -1;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (!cuda_ok(R, want[i].name, cu.cuLibraryGetKernel(&k, lib, want[i].name)) ||
            !cuda_ok(R, want[i].name, cu.cuKernelGetFunction(want[i].fn, k)))
            return -1;
    return 0; /* the library stays loaded for the process */
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
    CUdeviceptr d = 0;
    return cuda_ok(R, "cuMemAlloc", cu.cuMemAlloc(&d, bytes)) ? HPTR(d) : NULL;
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
        (void)cuda_ok(R, "cuMemFree", cu.cuMemFree(DPTR(p)));
    }
}

/* Wait for everything queued on the rank's stream, at most limit_ms. Returns 0, or -1 (printed)
 * when the stream reports an error or is still busy: a stream that never completes is what the
 * fault model forbids, so it is a failure in its own right, not a hang of the test. */
static int wait_stream(run_t *R, const char *what, int limit_ms)
{
    double start = harness_now_ms(), end = start + limit_ms;
    for (;;) {
        CUresult e = cu.cuStreamQuery(R->stream);
        if (e == CUDA_SUCCESS)
            return 0;
        if (e != CUDA_ERROR_NOT_READY)
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
 * Reporting
 * ------------------------------------------------------------------------------------------- */

/* Describe a call in one line, with the memory the rank's buffers came from. */
static void describe(const void *ctx, const call_t *k, char *buf, size_t len)
{
    const run_t *R = ctx;
    snprintf(buf, len, "rank %d/%d (gpu %d, %s): %s dtype %s op %s count %zu root %d %s%s salt %u", R->rank, R->n,
             R->dev, R->use_colld_alloc ? "colld_mem_alloc" : "cuMemAlloc", kind_names[k->kind], dtype_names[k->dt],
             coll_reduces(k->kind) ? op_names[k->op] : "-", k->count, k->root, k->inplace ? "in-place" : "out-of-place",
             k->null_unused ? " (unused buffer NULL)" : "", k->salt);
}

/* The run's reporting for coll_check_call and coll_report. */
static coll_check_t checker(run_t *R)
{
    return (coll_check_t){ .n = R->n,
                           .rank = R->rank,
                           .reported = &R->reported,
                           .max_report = R->a->max_report,
                           .where = " on the device",
                           .describe = describe,
                           .ctx = R };
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

/* Post a call on the rank's stream, with device pointers and the op `op`. */
static colld_status_t post_with(run_t *R, const call_t *k, colld_redop_t op)
{
    const void *s = dev(R, k->sendp);
    void *r = dev(R, k->recvp), *st = R->stream;
    switch (k->kind) {
    case K_ALLREDUCE:
        return colld_allreduce(s, r, k->count, k->dt, op, R->comm, st);
    case K_BROADCAST:
        return colld_broadcast(s, r, k->count, k->dt, k->root, R->comm, st);
    case K_REDUCE:
        return colld_reduce(s, r, k->count, k->dt, op, k->root, R->comm, st);
    case K_ALLGATHER:
        return colld_allgather(s, r, k->count, k->dt, R->comm, st);
    case K_GATHER:
        return colld_gather(s, r, k->count, k->dt, k->root, R->comm, st);
    case K_SCATTER:
        return colld_scatter(s, r, k->count, k->dt, k->root, R->comm, st);
    case K_ALLTOALL:
        return colld_alltoall(s, r, k->count, k->dt, R->comm, st);
    default:
        return colld_reducescatter(s, r, k->count, k->dt, op, R->comm, st);
    }
}

/* Post a call on the rank's stream. A premultiplied sum gets an operator made with this rank's own
 * scalar just before, destroyed as soon as the call returned (before the stream runs it). */
static colld_status_t post_call(run_t *R, const call_t *k)
{
    colld_redop_t op;
    colld_status_t st = coll_op_make(k, R->rank, R->comm, &op);
    if (st != COLLD_OK)
        return st;
    return coll_op_release(k, R->comm, op, post_with(R, k, op));
}

/* Check a completed call in the downloaded images (coll_check_call). Returns 0 when exact, else 1. */
static int check_call(run_t *R, const call_t *k)
{
    coll_check_t c = checker(R);
    return coll_check_call(&c, k);
}

/* Run one call in the slots at the start of the buffers: upload the images on the stream, post,
 * download on the stream, wait, check. Returns 0 exact, 1 mismatch, -1 fatal. */
static int run_call(run_t *R, call_t *k)
{
    const args_t *a = R->a;
    int rc = -1;
    k->sreg = R->hs;
    k->rreg = R->hr;
    if (coll_prepare_data(k, R->n, R->rank, colld_cpu_pattern) < 0) {
        fprintf(stderr, "rank %d: out of memory or the oracle refused\n", R->rank);
        goto out;
    }
    coll_prepare_buffers(k, R->n, R->rank);
    size_t es = colld_dtype_size(k->dt), se, re;
    coll_call_sizes(k, R->n, &se, &re);
    size_t sspan = se * es + 2 * GUARD, rspan = (k->inplace ? coll_inplace_bytes(k, R->n) : re * es) + 2 * GUARD;
    if ((!k->inplace &&
         !cuda_ok(R, "cuMemcpyHtoDAsync (send)", cu.cuMemcpyHtoDAsync(DPTR(R->ds), R->hs, sspan, R->stream))) ||
        !cuda_ok(R, "cuMemcpyHtoDAsync (recv)", cu.cuMemcpyHtoDAsync(DPTR(R->dr), R->hr, rspan, R->stream)))
        goto out;
    if (a->host_sync && wait_stream(R, "the upload", WAIT_GRACE_MS) < 0)
        goto out;
    colld_status_t st = post_call(R, k);
    if (st != COLLD_OK) {
        status_fail(R, k, "the stream-ordered call", st);
        goto out;
    }
    if (!cuda_ok(R, "cuMemcpyDtoHAsync (recv)", cu.cuMemcpyDtoHAsync(R->hr, DPTR(R->dr), rspan, R->stream)) ||
        (!k->inplace &&
         !cuda_ok(R, "cuMemcpyDtoHAsync (send)", cu.cuMemcpyDtoHAsync(R->hs, DPTR(R->ds), sspan, R->stream))))
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
    coll_free_data(k);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Modes
 * ------------------------------------------------------------------------------------------- */

/* run_call for coll_run_matrix. */
static int matrix_call(void *R, call_t *k)
{
    return run_call(R, k);
}

/* The whole matrix once, both modes. Returns 0 when everything matched. */
static int mode_matrix(run_t *R, int iter)
{
    const args_t *a = R->a;
    coll_matrix_t m = { .kinds = a->kinds,
                        .dtypes = a->dtypes,
                        .ops = a->ops,
                        .rotate = a->rotate,
                        .inplace = true,
                        .outofplace = true,
                        .big = a->big,
                        .big_all = a->big_all,
                        .big_min = a->big_min,
                        .salt = a->salt,
                        .n = R->n };
    if (coll_run_matrix(&m, iter, &R->cases, matrix_call, R) != 0)
        return 1;
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
    if (!cuda_ok(R, "producer launch", launch_produce(R, x, STREAM_COUNT, it, R->a->salt)))
        return -1;
    double t0 = harness_now_ms();
    colld_status_t st = colld_allreduce(x, inplace ? x : y, STREAM_COUNT, COLLD_FLOAT32, COLLD_SUM, R->comm, R->stream);
    *call_ms = harness_now_ms() - t0;
    if (st != COLLD_OK) {
        fprintf(stderr, "rank %d: stream round %d: colld_allreduce: %s: %s\n", R->rank, it, colld_status_name(st),
                colld_comm_last_error(R->comm));
        return -1;
    }
    return cuda_ok(R, "consumer launch", launch_consume(R, inplace ? x : y, z, STREAM_COUNT)) ? 0 : -1;
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
    double call_limit_ms = a->spin_ms / 4 > HOST_CALL_LIMIT_MS ? a->spin_ms / 4 : HOST_CALL_LIMIT_MS;
    CUdeviceptr zd = 0;
    if (need > R->reg_bytes) {
        fprintf(stderr, "rank %d: stream: buffers of %zu bytes are too small\n", R->rank, R->reg_bytes);
        return 2;
    }
    char err[256];
    if (!cuda_ok(R, "cuMemAlloc (consumer output)", cu.cuMemAlloc(&zd, need)))
        goto out;
    z = HPTR(zd);
    if (!(host = gpu_cu_host_alloc(&cu, need, err, sizeof(err)))) {
        fprintf(stderr, "rank %d: %s\n", R->rank, err);
        goto out;
    }

    /* Warm-up round (the library registers the buffers here), waited for and checked. */
    if (stream_round(R, 0, x, y, z, &first_call_ms) < 0 ||
        wait_stream(R, "warm-up round", a->timeout_ms + WAIT_GRACE_MS) < 0 ||
        !cuda_ok(R, "cuMemcpyDtoH", cu.cuMemcpyDtoH(host, zd, round_bytes)))
        goto out;
    for (size_t i = 0; i < STREAM_COUNT; i++)
        bad += host[i] != stream_expect(R, 0, i);
    if (bad) {
        fprintf(stderr, "rank %d: stream warm-up: %d wrong elements\n", R->rank, bad);
        goto out;
    }

    /* Poison the inputs and outputs (a collective that runs before the producer, or a consumer
     * that runs before the collective, sees these), and wait until that is done. */
    if (!cuda_ok(R, "cuMemsetD8", cu.cuMemsetD8(DPTR(x), SENTINEL, need)) ||
        !cuda_ok(R, "cuMemsetD8", cu.cuMemsetD8(DPTR(y), SENTINEL, need)) ||
        !cuda_ok(R, "cuMemsetD8", cu.cuMemsetD8(zd, SENTINEL, need)) ||
        !cuda_ok(R, "cuCtxSynchronize", cu.cuCtxSynchronize()))
        goto out;

    /* Round 0 behind a slow producer: the host call must not wait for it. */
    double t0 = harness_now_ms();
    if (!cuda_ok(R, "spin launch", launch_spin(R, a->spin_ms)))
        goto out;
    if (stream_round(R, 0, x, y, z, &call_ms) < 0)
        goto out;
    CUresult q = cu.cuStreamQuery(R->stream);
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
    if (!cuda_ok(R, "cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(host, zd, need, R->stream)))
        goto out;
    if (wait_stream(R, "the rounds", a->timeout_ms + WAIT_GRACE_MS + (int)a->spin_ms) < 0)
        goto out;
    double total = harness_now_ms() - t0;
    if (!cuda_ok(R, "cuStreamSynchronize", cu.cuStreamSynchronize(R->stream)))
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
            fprintf(stderr,
                    "rank %d: stream round %d (%s): %zu of %zu consumer outputs wrong, first at %zu: "
                    "got %.9g, expected %.9g\n",
                    R->rank, it, it % 2 ? "in place" : "out of place", wrong, (size_t)STREAM_COUNT, first,
                    (double)zz[first], (double)stream_expect(R, it, first));
            bad++;
        }
    }
    fprintf(stderr,
            "rank %d: stream: first call (registration) %.2f ms; behind a %.0f ms producer the call took "
            "%.3f ms (limit %.0f), the stream was %s when it returned (%.1f ms after the spin started), all %d "
            "rounds done after %.1f ms (at least %.0f expected); slowest later call %.3f ms\n",
            R->rank, first_call_ms, a->spin_ms, call_ms, call_limit_ms,
            q == CUDA_ERROR_NOT_READY ? "busy"
            : q == CUDA_SUCCESS       ? "ALREADY DONE"
                                      : "in error",
            after_call, STREAM_ROUNDS, total, 0.75 * a->spin_ms, max_call_ms);
    if (call_ms >= call_limit_ms) {
        fprintf(stderr,
                "rank %d: FAILED: the colld_allreduce host call took %.3f ms behind a busy stream "
                "(limit %.0f ms): it waited for the GPU\n",
                R->rank, call_ms, call_limit_ms);
        bad++;
    }
    if (q != CUDA_ERROR_NOT_READY) {
        fprintf(stderr, "rank %d: FAILED: the stream was not busy when colld_allreduce returned (result %d)\n", R->rank,
                (int)q);
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
    if (zd)
        (void)cuda_ok(R, "cuMemFree", cu.cuMemFree(zd));
    gpu_cu_host_free(&cu, host, need);
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
        if (!cuda_ok(R, "spin launch", launch_spin(R, VICTIM_SPIN_MS)))
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
    if (!cuda_ok(R, "cuStreamSynchronize after the release", cu.cuStreamSynchronize(R->stream)))
        return 1;
    /* The error may be recorded a moment after the stream moved on. */
    colld_status_t err = async_error(R);
    while (err == COLLD_OK && harness_now_ms() < released + 2000) {
        usleep(1000);
        err = async_error(R);
    }
    fprintf(stderr, "rank %d: stream released %.1f ms after the post; async error %s: %s\n", R->rank, released - posted,
            colld_status_name(err), colld_comm_last_error(R->comm));
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

/* --mode hofault: see the top of the file. */
static int mode_hofault(run_t *R)
{
    const args_t *a = R->a;
    const char *c = a->fcase ? a->fcase : "";
    bool timeout = !strcmp(c, "timeout"), abort_case = !strcmp(c, "abort"), mismatch = !strcmp(c, "mismatch");
    if (R->n != 2 || !(timeout || abort_case || mismatch)) {
        fprintf(stderr, "rank %d: --mode hofault needs 2 ranks and --case timeout|abort|mismatch\n", R->rank);
        return 2;
    }
    if (exact_allreduces(R, a->salt) != 0) /* warm-up: registered, the path works */
        return 1;
    /* The output's sentinel: the kernels of an abandoned collective must not write it. */
    const size_t count = 1001;
    float *img = (float *)R->hs;
    for (size_t i = 0; i < count; i++)
        img[i] = -7.0f;
    if (!cuda_ok(R, "cuMemcpyHtoDAsync (sentinel)",
                 cu.cuMemcpyHtoDAsync(DPTR(R->dr + GUARD), img, count * sizeof(float), R->stream)) ||
        wait_stream(R, "the sentinel", a->timeout_ms + WAIT_GRACE_MS) < 0)
        return 1;
    double spin = timeout ? 2.0 * a->timeout_ms : abort_case ? 2000.0 : 0.0;
    if (R->rank == 1 && spin > 0 && !cuda_ok(R, "spin launch", launch_spin(R, spin)))
        return 1;
    size_t n = mismatch && R->rank == 1 ? count - 1 : count;
    colld_status_t st = colld_allreduce(R->ds + GUARD, R->dr + GUARD, n, COLLD_FLOAT32, COLLD_SUM, R->comm, R->stream);
    double posted = harness_now_ms();
    if (st != COLLD_OK && !(mismatch && st == COLLD_ERR_MISMATCH))
        return status_fail(R, NULL, "colld_allreduce (the faulty one)", st) ? 1 : 0;
    if (abort_case && R->rank == 0) {
        usleep(300 * 1000);
        colld_status_t ab = colld_comm_abort(R->comm);
        fprintf(stderr, "rank 0: colld_comm_abort: %s\n", colld_status_name(ab));
    }
    int limit = (int)spin + a->timeout_ms + RELEASE_GRACE_MS;
    if (wait_stream(R, "the faulty all-reduce", limit) < 0) {
        fflush(stderr);
        _exit(1);
    }
    double released = harness_now_ms();
    colld_status_t err = st != COLLD_OK ? st : async_error(R);
    while (err == COLLD_OK && harness_now_ms() < released + 2000) {
        usleep(1000);
        err = async_error(R);
    }
    const char *detail = colld_comm_last_error(R->comm);
    fprintf(stderr, "rank %d: case %s: stream released %.1f ms after the post; %s: %s\n", R->rank, c, released - posted,
            colld_status_name(err), detail);
    colld_status_t want = timeout ? COLLD_ERR_TIMEOUT : abort_case ? COLLD_ERR_ABORTED : COLLD_ERR_MISMATCH;
    int rc = 0;
    if (err != want) {
        fprintf(stderr, "rank %d: FAILED: expected %s\n", R->rank, colld_status_name(want));
        rc = 1;
    }
    if (timeout && R->rank == 0 && !strstr(detail, "rank(s) 1 never reached it")) {
        fprintf(stderr, "rank 0: FAILED: the time-out does not name rank 1\n");
        rc = 1;
    }
    if (timeout && R->rank == 0 && released - posted > a->timeout_ms + RELEASE_GRACE_MS) {
        fprintf(stderr, "rank 0: FAILED: released after the timeout + %d ms\n", RELEASE_GRACE_MS);
        rc = 1;
    }
    if (!cuda_ok(R, "cuMemcpyDtoHAsync (output)",
                 cu.cuMemcpyDtoHAsync(img, DPTR(R->dr + GUARD), count * sizeof(float), R->stream)) ||
        wait_stream(R, "the output", WAIT_GRACE_MS) < 0)
        return 1;
    for (size_t i = 0; i < count && !(mismatch && R->rank == 1); i++)
        if (img[i] != -7.0f) {
            fprintf(stderr, "rank %d: FAILED: element %zu of the output is %g: the abandoned collective wrote it\n",
                    R->rank, i, (double)img[i]);
            rc = 1;
            break;
        }
    return rc;
}

/* Whether the ranks stop: an all-reduce (max) of "the stop file exists" on the device, so that
 * every rank leaves after the same iteration. 1 stop, 0 go on, -1 failed (printed). */
static int stop_agreed(run_t *R)
{
    int32_t *flag = (int32_t *)R->hs;
    *flag = access(R->a->stop_file, F_OK) == 0;
    if (!cuda_ok(R, "cuMemcpyHtoDAsync (stop flag)", cu.cuMemcpyHtoDAsync(DPTR(R->ds), flag, sizeof(*flag), R->stream)))
        return -1;
    colld_status_t st = colld_allreduce(R->ds, R->ds, 1, COLLD_INT32, COLLD_MAX, R->comm, R->stream);
    if (st != COLLD_OK)
        return status_fail(R, NULL, "the stop agreement", st);
    if (!cuda_ok(R, "cuMemcpyDtoHAsync (stop flag)",
                 cu.cuMemcpyDtoHAsync(flag, DPTR(R->ds), sizeof(*flag), R->stream)) ||
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
        call_t k = { .kind = K_ALLREDUCE,
                     .dt = it % 2 ? COLLD_INT32 : COLLD_FLOAT32,
                     .op = COLLD_SUM,
                     .count = 4096 + (size_t)(it % 7),
                     .inplace = it % 3 == 0,
                     .salt = a->salt + (unsigned)it };
        if (run_call(R, &k) != 0)
            return 1;
        if (R->rank == 0) {
            char num[32];
            snprintf(num, sizeof(num), "%ld\n", it + 1);
            (void)write_file(a->progress_file, num);
        }
    }
}

/* Both communicators of the crossed mode must have failed with COLLD_ERR_DEADLOCK naming the cycle;
 * 0 or -1 (printed). */
static int crossed_failed(run_t *R, colld_comm_t *comm, const char *name)
{
    colld_status_t err = COLLD_OK;
    colld_status_t st = colld_comm_get_async_error(comm, &err);
    const char *detail = colld_comm_last_error(comm);
    if (st != COLLD_OK || err != COLLD_ERR_DEADLOCK || !strstr(detail, "deadlock across communicators: rank ")) {
        fprintf(stderr, "rank %d: communicator %s: %s, want COLLD_ERR_DEADLOCK naming the cycle: %s\n", R->rank, name,
                colld_status_name(st != COLLD_OK ? st : err), detail);
        return -1;
    }
    fprintf(stderr, "rank %d: communicator %s: %s: %s\n", R->rank, name, colld_status_name(err), detail);
    return 0;
}

static int mode_crossed(run_t *R)
{
    const args_t *a = R->a;
    colld_unique_id_t id2;
    colld_comm_t *b = NULL;
    if (R->n != 2 || !a->uid2_hex || harness_uid_from_hex(a->uid2_hex, &id2) < 0) {
        fprintf(stderr, "rank %d: --mode crossed needs 2 ranks and --uid2\n", R->rank);
        return 2;
    }
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = a->timeout_ms;
    cfg.name = "crossed-b";
    colld_status_t st = colld_comm_init_rank(R->c, &b, 2, id2, R->rank, &cfg);
    if (st != COLLD_OK) {
        fprintf(stderr, "rank %d: joining B: %s\n", R->rank, colld_status_name(st));
        return 1;
    }
    size_t count = 1024;
    colld_comm_t *order[2] = { R->comm, b };
    if (R->rank == 1) {
        order[0] = b;
        order[1] = R->comm;
    }
    int rc = 0;
    double t0 = harness_now_ms();
    for (int i = 0; i < 2 && rc == 0; i++)
        if ((st = colld_allreduce(R->ds, R->ds, count, COLLD_FLOAT32, COLLD_SUM, order[i], R->stream)) != COLLD_OK) {
            fprintf(stderr, "rank %d: posting on %s: %s: %s\n", R->rank, order[i] == b ? "B" : "A",
                    colld_status_name(st), colld_comm_last_error(order[i]));
            rc = 1;
        }
    /* The stream is released once the daemon has failed the cycle's communicators. */
    if (rc == 0 && wait_stream(R, "the crossed collectives", a->timeout_ms / 2) < 0)
        rc = 1;
    double ms = harness_now_ms() - t0;
    if (rc == 0 && (crossed_failed(R, R->comm, "A") < 0 || crossed_failed(R, b, "B") < 0))
        rc = 1;
    if (rc == 0)
        fprintf(stderr, "rank %d: the crossed streams were released after %.0f ms (timeout %d ms)\n", R->rank, ms,
                a->timeout_ms);
    if ((st = colld_comm_destroy(b)) != COLLD_OK && rc == 0) {
        fprintf(stderr, "rank %d: destroying B: %s\n", R->rank, colld_status_name(st));
        rc = 1;
    }
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Set-up
 * ------------------------------------------------------------------------------------------- */

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
    const harness_opt_t opts[] = {
        HARNESS_STR("socket", &a->socket),
        HARNESS_STR("uid", &a->uid_hex),
        HARNESS_STR("uid2", &a->uid2_hex),
        HARNESS_INT("nranks", &a->nranks),
        HARNESS_INT("rank", &a->rank),
        HARNESS_STR("mode", &a->mode),
        HARNESS_STR("alloc", &a->alloc),
        COLL_MASK_OPT("kinds", kind_names, K_COUNT, &a->kinds),
        COLL_MASK_OPT("dtypes", dtype_names, COLLD_DTYPE_COUNT, &a->dtypes),
        COLL_MASK_OPT("ops", op_names, COLL_OPS, &a->ops),
        HARNESS_INT("salt", &a->salt),
        HARNESS_INT("rotate", &a->rotate),
        HARNESS_INT("iters", &a->iters),
        HARNESS_INT("timeout-ms", &a->timeout_ms),
        HARNESS_INT("max-report", &a->max_report),
        HARNESS_DOUBLE("spin-ms", &a->spin_ms),
        HARNESS_INT("victim", &a->victim),
        HARNESS_INT("gpus", &a->gpus),
        HARNESS_STR("sync-dir", &a->sync_dir),
        HARNESS_STR("stop-file", &a->stop_file),
        HARNESS_STR("progress-file", &a->progress_file),
        HARNESS_STR("case", &a->fcase),
        HARNESS_CLEAR("no-big", &a->big),
        HARNESS_SET("big-all", &a->big_all),
        HARNESS_SET("big-min", &a->big_min),
        HARNESS_SET("host-sync", &a->host_sync),
        HARNESS_SET("blocking-stream", &a->blocking_stream),
        HARNESS_SET("victim-posts", &a->victim_posts),
        HARNESS_SET("cudafake", &a->cudafake),
    };
    if (HARNESS_PARSE_OPTS("gpu_rank", argc, argv, opts) != 0)
        return 2;
    if (a->victim < 0)
        a->victim = a->nranks - 1;
    bool alloc_ok = !strcmp(a->alloc, "cumemalloc") || !strcmp(a->alloc, "colld") || !strcmp(a->alloc, "mixed");
    if (!a->socket || !a->uid_hex || a->nranks < 1 || a->nranks > MAX_RANKS || a->rank < 0 || a->rank >= a->nranks ||
        !a->kinds || !a->dtypes || !a->ops || a->iters < 0 || !alloc_ok || a->timeout_ms <= 0 || !(a->spin_ms >= 0) ||
        a->gpus < 1) {
        fprintf(stderr,
                "gpu_rank: need --socket, --uid, --nranks 1..%d, --rank; valid subsets; --alloc "
                "cumemalloc|colld|mixed; --gpus 1 or more\n",
                MAX_RANKS);
        return 2;
    }
    return 0;
}

/* Join the communicator, put the buffers on GPU rank % --gpus, run the mode, leave. */
int main(int argc, char **argv)
{
    args_t a = { .mode = "matrix",
                 .alloc = "cumemalloc",
                 .gpus = 1,
                 .timeout_ms = 120000,
                 .iters = 1,
                 .max_report = 40,
                 .victim = -1,
                 .spin_ms = 200,
                 .kinds = (1u << K_COUNT) - 1, /* gather, scatter, all-to-all too since issue 16 */
                 .dtypes = (1u << COLLD_DTYPE_COUNT) - 1,
                 .ops = (1u << COLL_OPS) - 1,
                 .big = true };
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc;
    setvbuf(stderr, NULL, _IONBF, 0);
    run_t R = { .a = &a, .n = a.nranks, .rank = a.rank };
    R.use_colld_alloc = !strcmp(a.alloc, "colld") || (!strcmp(a.alloc, "mixed") && a.rank % 2 == 1);
    double t0 = harness_now_ms();
    char err[512];
    /* Before any CUDA call: with --cudafake, the driver must be the test double. */
    gpu_cu_result_t loaded = gpu_cu_load(&cu, a.cudafake, err, sizeof(err));
    if (loaded != GPU_CU_OK) {
        fprintf(stderr, "rank %d: %s%s\n", a.rank, loaded == GPU_CU_NONE ? "SKIP: " : "", err);
        return loaded == GPU_CU_NONE ? 77 : 1;
    }
    if (a.gpus > cu.ndev) {
        fprintf(stderr, "rank %d: --gpus %d, but %d GPU(s) visible\n", a.rank, a.gpus, cu.ndev);
        return 2;
    }
    R.dev = a.rank % a.gpus;
    unsigned flags = a.blocking_stream ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING;
    if (!cuda_ok(&R, "the device's primary context", gpu_cu_use_device(&cu, R.dev)) ||
        !cuda_ok(&R, "cuStreamCreate", cu.cuStreamCreate(&R.stream, flags)) || load_kernels(&R) < 0)
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
    if (alloc_buffers(&R) < 0 || !(R.hs = gpu_cu_host_alloc(&cu, R.reg_bytes, err, sizeof(err))) ||
        !(R.hr = gpu_cu_host_alloc(&cu, R.reg_bytes, err, sizeof(err)))) {
        if (R.ds && R.dr)
            fprintf(stderr, "rank %d: %s\n", a.rank, err);
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
    else if (strcmp(a.mode, "crossed") == 0)
        rc = mode_crossed(&R);
    else if (strcmp(a.mode, "hofault") == 0)
        rc = mode_hofault(&R);
    else {
        fprintf(stderr, "gpu_rank: unknown mode %s\n", a.mode);
        rc = 2;
    }
    if (rc != 0 && R.reported > a.max_report)
        fprintf(stderr, "rank %d: %d more failures not shown\n", a.rank, R.reported - a.max_report);
    if (R.rank == 0)
        fprintf(stderr, "rank 0/%d: gpu mode %s (%s, %s stream, %d GPU(s)%s): %ld collectives, %ld wrong, %.0f ms\n",
                R.n, a.mode, a.alloc, a.blocking_stream ? "blocking" : "non-blocking", a.gpus,
                cu.on_double ? ", the CUDA driver test double" : "", R.collectives, R.bad, harness_now_ms() - t0);
out:
    free_buffers(&R);
    gpu_cu_host_free(&cu, R.hs, R.reg_bytes);
    gpu_cu_host_free(&cu, R.hr, R.reg_bytes);
    if (R.comm && (st = colld_comm_destroy(R.comm)) != COLLD_OK && rc == 0) {
        fprintf(stderr, "rank %d: colld_comm_destroy: %s\n", a.rank, colld_status_name(st));
        rc = 1;
    }
    colld_disconnect(R.c);
    (void)cu.cuStreamDestroy(R.stream);
    return rc;
}
