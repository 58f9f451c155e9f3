/*
 * gpu_p2p_rank.c - colld-test-gpu-p2p: one rank process of the GPU point-to-point tests
 * (test_gpu_p2p.c): colld_send, colld_recv and colld_alltoallv on device buffers, stream-ordered,
 * through a real daemon. Written against the public API (colld/colld.h) and the CUDA driver API
 * only (gpu_cu.h), so that it runs on a real GPU and on the CUDA driver test double (--cudafake:
 * the libcuda.so.1 it finds must be the double, checked before any CUDA call).
 *
 * The rank puts its two regions (send, receive) on GPU rank % --gpus, from cuMemAlloc (--alloc
 * cumemalloc, the default) or colld_mem_alloc(COLLD_MEM_CUDA) (--alloc colld), and keeps pinned host
 * images of them. Every step: the host images (messages, zeros, P2P_GUARD bytes of P2P_SENTINEL around
 * every buffer) are copied to the device on the rank's stream, the sends and receives are posted on
 * the stream, the regions are copied back on the stream, and only then does the host wait for the
 * stream. Message k of a step from rank a to rank b holds colld_cpu_pattern's values for (dtype,
 * a, a salt from b, k and the step), so a receiver knows exactly what it must get: every result is
 * compared BITWISE, the guards must keep their sentinel and a send buffer must be unchanged.
 *
 * Modes (--mode):
 *   ring      for dtypes int8, int32, float32, float64, bfloat16 and counts {0, 1, 1001, 65539}: one
 *             group in which each rank sends to both neighbours and receives from both (rank r's
 *             next is (r + 1) % n), then a group in which it also sends to itself.
 *   pairs     without groups: for each src in turn, src sends to every other rank in rank order and
 *             the others receive from src; everything posted on the stream, one wait at the end.
 *   alltoallv colld_alltoallv with uneven counts (some 0) from packed send regions into packed
 *             receive regions in reverse order, for several dtypes, on the rank's stream; then once
 *             with stream NULL (the legacy default stream, synchronous copies around it).
 *   stream    producer kernel -> a group (send to next, receive from prev) -> consumer kernel on the
 *             stream, STREAM_ROUNDS rounds back to back, no host wait in between; the first round's
 *             producer spins --spin-ms first: the host calls (the group) must return within a
 *             quarter of the spin while the stream is busy, and every consumer output is exact.
 *   fault     2 ranks, a fault scene (--scene), after a warm-up exchange:
 *             mismatch  rank 0 sends 100 float32, rank 1 receives 50: both streams released, both
 *                       ranks COLLD_ERR_MISMATCH naming both calls;
 *             timeout   rank 0 posts its send behind a spin longer than the communicator timeout:
 *                       both ranks COLLD_ERR_TIMEOUT naming rank 0's stream, rank 1's stream
 *                       released within the timeout + RELEASE_GRACE_MS;
 *             victim    rank 1 posts a receive from rank 0 and writes <sync-dir>/posted-1; rank 0
 *                       (with --victim-posts: after posting its send behind a long spin, so the pair
 *                       is matched and waits for rank 0's stream) writes <sync-dir>/victim-ready and
 *                       waits to be killed (-9); rank 1's stream must be released with
 *                       COLLD_ERR_PEER_LOST within the timeout + RELEASE_GRACE_MS (written with the
 *                       time to <sync-dir>/released-1);
 *             host      rank 0 sends from device memory, rank 1 receives into host memory:
 *                       COLLD_ERR_NOT_SUPPORTED naming both, rank 0's stream released;
 *             nopeer    (buffers on GPUs without peer access, --gpus 2) a send from rank 0 to 1:
 *                       COLLD_ERR_NOT_SUPPORTED saying so, both streams released.
 *   crossed   2 ranks, a second communicator --uid2: a send and an all-reduce of two communicators
 *             in crossed orders on the ranks' streams (see mode_crossed): COLLD_ERR_DEADLOCK naming
 *             the send, both streams released within half the timeout.
 *
 * Exit code: 0 everything exact (or the expected failure came); 1 otherwise; 2 bad arguments; 77
 * no GPU visible (never with --cudafake: there a missing double is a failure).
 */
#include "tools/testdata/pattern.h"
#include "tests/gpu/gpu_cu.h"
#include "tests/gpu/gpu_rank_kernels.h"
#include "tests/integration/harness.h"
#include "tests/integration/p2p_data.h"
#include "tests/integration/harness_opts.h"

#include <colld/colld.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS_P2P 8
#define WAIT_GRACE_MS 10000   /* a stream may take the communicator timeout plus this */
#define RELEASE_GRACE_MS 5000 /* fault: a stream is released within the timeout + this */
#define HOST_CALL_LIMIT_MS 50.0
#define STREAM_ROUNDS 6
#define STREAM_COUNT ((size_t)65536 + 3)
#define VICTIM_SPIN_MS 60000.0

typedef struct {
    const char *socket, *uid_hex, *uid2_hex, *mode, *alloc, *scene, *sync_dir;
    int nranks, rank, gpus, timeout_ms;
    double spin_ms;
    bool cudafake, victim_posts;
} args_t;

/* The driver, and the rank's kernels in its context. */
static gpu_cu_t cu;
static CUfunction spin_fn, produce_fn, consume_fn;

typedef struct {
    const args_t *a;
    colld_client_t *c;
    colld_comm_t *comm;
    int n, rank, dev;
    bool use_colld_alloc;
    CUstream stream;
    unsigned char *ds, *dr; /* the device regions, reg_bytes each */
    unsigned char *hs, *hr; /* their pinned host images */
    size_t reg_bytes;
    long ops, bad;
} run_t;

#define DPTR(p) ((CUdeviceptr)(uintptr_t)(p))
#define HPTR(d) ((void *)(uintptr_t)(d))

/* ---------------------------------------------------------------------------------------------
 * Reporting, CUDA, memory
 * ------------------------------------------------------------------------------------------- */

static bool fail(run_t *R, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(run_t *R, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (R->bad++ < 20) {
        fprintf(stderr, "FAILED rank %d: ", R->rank);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
    }
    va_end(ap);
    return false;
}

static bool cuda_ok(run_t *R, const char *what, CUresult e)
{
    char why[256];
    return e == CUDA_SUCCESS || fail(R, "%s: %s", what, gpu_cu_describe(&cu, e, why, sizeof(why)));
}

/* A posting call's status: false (reported) unless COLLD_OK. */
static bool posted_ok(run_t *R, const char *what, colld_status_t st)
{
    return st == COLLD_OK ||
           fail(R, "%s: %s: %s", what, colld_status_name(st), R->comm ? colld_comm_last_error(R->comm) : "");
}

static CUresult launch(const run_t *R, CUfunction f, unsigned blocks, unsigned threads, void *params)
{
    void *args[] = { params };
    return cu.cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, R->stream, args, NULL);
}

static CUresult launch_spin(const run_t *R, double ms)
{
    gpu_rank_spin_params_t p = { .ns = (unsigned long long)(ms * 1e6) };
    return launch(R, spin_fn, 1, 1, &p);
}

static unsigned blocks_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return b == 0 ? 1u : b > 1024 ? 1024u : (unsigned)b;
}

static int load_kernels(run_t *R)
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
    return 0;
}

static void *dev_alloc(run_t *R, size_t bytes)
{
    void *p = NULL;
    if (R->use_colld_alloc) {
        colld_status_t st = colld_mem_alloc(R->c, &p, bytes, COLLD_MEM_CUDA);
        return st == COLLD_OK ? p : (fail(R, "colld_mem_alloc: %s", colld_status_name(st)), NULL);
    }
    CUdeviceptr d = 0;
    return cuda_ok(R, "cuMemAlloc", cu.cuMemAlloc(&d, bytes)) ? HPTR(d) : NULL;
}

static void dev_free(run_t *R, void *p)
{
    if (p && R->use_colld_alloc)
        (void)colld_mem_free(R->c, p);
    else if (p)
        (void)cu.cuMemFree(DPTR(p));
}

/* Wait for the rank's stream, at most limit_ms: 0, or -1 (reported) when it reports an error or
 * is still busy (a stream never released is what the fault model forbids). */
static int wait_stream(run_t *R, const char *what, int limit_ms)
{
    double start = harness_now_ms();
    for (;;) {
        CUresult e = cu.cuStreamQuery(R->stream);
        if (e == CUDA_SUCCESS)
            return 0;
        if (e != CUDA_ERROR_NOT_READY)
            return cuda_ok(R, what, e) ? 0 : -1;
        if (harness_now_ms() > start + limit_ms)
            return fail(R, "%s: the stream is still busy after %d ms: it was never released", what, limit_ms), -1;
        struct timespec ts = { 0, harness_now_ms() - start < 5 ? 2000 : 200000 };
        nanosleep(&ts, NULL);
    }
}

/* The communicator's asynchronous error (COLLD_INPROGRESS counts as none), waited for up to 2 s
 * after a stream was released (it is recorded a moment later). */
static colld_status_t async_error(run_t *R, bool wait)
{
    double end = harness_now_ms() + (wait ? 2000 : 0);
    for (;;) {
        colld_status_t err = COLLD_OK, st = colld_comm_get_async_error(R->comm, &err);
        if (st != COLLD_OK)
            return st;
        if (err != COLLD_OK && err != COLLD_INPROGRESS)
            return err;
        if (harness_now_ms() >= end)
            return COLLD_OK;
        usleep(1000);
    }
}

/* The device address of a byte of the host images. */
static void *dev(const run_t *R, const void *host)
{
    const unsigned char *p = host;
    if (p >= R->hs && p < R->hs + R->reg_bytes)
        return R->ds + (p - R->hs);
    return R->dr + (p - R->hr);
}

/* ---------------------------------------------------------------------------------------------
 * Messages and checks
 * ------------------------------------------------------------------------------------------- */

static size_t stride_of(size_t bytes)
{
    return 2 * P2P_GUARD + ((bytes + 63) & ~(size_t)63);
}

static bool guards_ok(run_t *R, const unsigned char *buf, size_t bytes, const char *what)
{
    return p2p_guards_intact(buf, bytes) ||
           fail(R, "%s: a guard byte around the buffer was overwritten on the device", what);
}

static bool check_message(run_t *R, const void *buf, colld_dtype_t dt, int from, int to, unsigned step, int k,
                          size_t count, const char *what)
{
    size_t wrong = 0;
    int ok = p2p_message_matches(buf, dt, from, to, step, k, count, &wrong);
    if (ok < 0)
        return fail(R, "out of memory");
    if (!ok)
        fail(R, "%s: %zu x dtype %d from rank %d (step %u, message %d): first wrong byte %zu of %zu", what, count,
             (int)dt, from, step, k, wrong, count * colld_dtype_size(dt));
    return ok;
}

/* Step, part 1: the host images (the first `used` bytes of each) to the device, on the stream. */
static bool upload(run_t *R, size_t used)
{
    return cuda_ok(R, "cuMemcpyHtoDAsync (send region)", cu.cuMemcpyHtoDAsync(DPTR(R->ds), R->hs, used, R->stream)) &&
           cuda_ok(R, "cuMemcpyHtoDAsync (receive region)", cu.cuMemcpyHtoDAsync(DPTR(R->dr), R->hr, used, R->stream));
}

/* Step, part 3: the regions back to the host images on the stream, then the one host wait, and the
 * communicator's error. */
static bool download(run_t *R, size_t used, const char *what)
{
    if (!cuda_ok(R, "cuMemcpyDtoHAsync (send region)", cu.cuMemcpyDtoHAsync(R->hs, DPTR(R->ds), used, R->stream)) ||
        !cuda_ok(R, "cuMemcpyDtoHAsync (receive region)", cu.cuMemcpyDtoHAsync(R->hr, DPTR(R->dr), used, R->stream)) ||
        wait_stream(R, what, R->a->timeout_ms + WAIT_GRACE_MS) < 0)
        return false;
    colld_status_t err = async_error(R, false);
    return err == COLLD_OK ||
           fail(R, "%s: async error %s: %s", what, colld_status_name(err), colld_comm_last_error(R->comm));
}

/* ---------------------------------------------------------------------------------------------
 * Modes
 * ------------------------------------------------------------------------------------------- */

static const colld_dtype_t ring_dtypes[] = { COLLD_INT8, COLLD_INT32, COLLD_FLOAT32, COLLD_FLOAT64, COLLD_BFLOAT16 };
static const size_t ring_counts[] = { 0, 1, 1001, 65539 };

/* One group: send to both neighbours (and to itself with `self`), receive from them; check. */
static int ring_step(run_t *R, colld_dtype_t dt, size_t count, unsigned step, bool self)
{
    int n = R->n, me = R->rank, next = (me + 1) % n, prev = (me + n - 1) % n;
    size_t bytes = count * colld_dtype_size(dt), stride = stride_of(bytes);
    int peers[3] = { next, prev, me }, from[3] = { prev, next, me }, m = self ? 3 : 2;
    unsigned char *sb[3], *rb[3];
    if (3 * stride > R->reg_bytes)
        return fail(R, "regions too small"), 1;
    for (int k = 0; k < m; k++) {
        sb[k] = p2p_slot(R->hs, (size_t)k * stride, bytes);
        rb[k] = p2p_slot(R->hr, (size_t)k * stride, bytes);
        p2p_message(dt, me, peers[k], step, k, count, sb[k]);
        memset(rb[k], 0, bytes);
    }
    if (!upload(R, (size_t)m * stride))
        return 1;
    colld_status_t st = colld_group_start();
    for (int k = 0; k < m && st == COLLD_OK; k++)
        st = colld_send(dev(R, sb[k]), count, dt, peers[k], R->comm, R->stream);
    /* From prev its message 0 (to its next, me), from next its message 1, from me my message 2. */
    for (int k = 0; k < m && st == COLLD_OK; k++)
        st = colld_recv(dev(R, rb[k]), count, dt, from[k], R->comm, R->stream);
    colld_status_t end = colld_group_end();
    if (!posted_ok(R, "ring: posting the group", st != COLLD_OK ? st : end) || !download(R, (size_t)m * stride, "ring"))
        return 1;
    R->ops += 2 * m;
    bool ok = true;
    for (int k = 0; k < m; k++) {
        ok &= check_message(R, rb[k], dt, from[k], me, step, k, count, "ring receive");
        ok &= check_message(R, sb[k], dt, me, peers[k], step, k, count, "ring send buffer");
        ok &= guards_ok(R, rb[k], bytes, "ring receive") && guards_ok(R, sb[k], bytes, "ring send");
    }
    return ok ? 0 : 1;
}

static int mode_ring(run_t *R)
{
    unsigned step = 0;
    for (size_t d = 0; d < sizeof(ring_dtypes) / sizeof(ring_dtypes[0]); d++)
        for (size_t c = 0; c < sizeof(ring_counts) / sizeof(ring_counts[0]); c++)
            for (int self = 0; self < 2; self++)
                if (ring_step(R, ring_dtypes[d], ring_counts[c], step++, self) != 0)
                    return 1;
    return 0;
}

/* Without groups: each src sends to every other rank in rank order, the others receive. */
static int mode_pairs(run_t *R)
{
    int n = R->n, me = R->rank;
    size_t count = 4099;
    colld_dtype_t dt = COLLD_FLOAT32;
    size_t bytes = count * colld_dtype_size(dt), stride = stride_of(bytes);
    if ((size_t)n * stride > R->reg_bytes)
        return fail(R, "regions too small"), 1;
    for (int q = 0; q < n; q++) {
        p2p_message(dt, me, q, 7, 0, count, p2p_slot(R->hs, (size_t)q * stride, bytes));
        memset(p2p_slot(R->hr, (size_t)q * stride, bytes), 0, bytes);
    }
    if (!upload(R, (size_t)n * stride))
        return 1;
    for (int src = 0; src < n; src++)
        for (int dst = 0; dst < n; dst++) {
            if (dst == src || (me != src && me != dst))
                continue;
            colld_status_t st = me == src ? colld_send(dev(R, R->hs + (size_t)dst * stride + P2P_GUARD), count, dt, dst,
                                                       R->comm, R->stream)
                                          : colld_recv(dev(R, R->hr + (size_t)src * stride + P2P_GUARD), count, dt, src,
                                                       R->comm, R->stream);
            if (!posted_ok(R, me == src ? "pairs: colld_send" : "pairs: colld_recv", st))
                return 1;
            R->ops++;
        }
    if (!download(R, (size_t)n * stride, "pairs"))
        return 1;
    bool ok = true;
    for (int q = 0; q < n; q++) {
        unsigned char *rb = R->hr + (size_t)q * stride + P2P_GUARD, *sb = R->hs + (size_t)q * stride + P2P_GUARD;
        if (q != me)
            ok &= check_message(R, rb, dt, q, me, 7, 0, count, "pairs receive");
        ok &= check_message(R, sb, dt, me, q, 7, 0, count, "pairs send buffer");
        ok &= guards_ok(R, rb, bytes, "pairs receive") && guards_ok(R, sb, bytes, "pairs send");
    }
    return ok ? 0 : 1;
}

/* The elements rank a sends to rank b in all-to-all-v round `step` (some 0). */
static size_t a2av_count(int a, int b, unsigned step)
{
    return ((size_t)a * 3u + (size_t)b * 5u + step) % 4u * 331u;
}

/* One colld_alltoallv: packed send regions in peer order, packed receive regions in reverse peer
 * order. With `null_stream`, on the legacy default stream with synchronous copies around it. */
static int a2av_step(run_t *R, colld_dtype_t dt, unsigned step, bool null_stream)
{
    int n = R->n, me = R->rank;
    size_t es = colld_dtype_size(dt), sc[MAX_RANKS_P2P], sd[MAX_RANKS_P2P], rc[MAX_RANKS_P2P], rd[MAX_RANKS_P2P];
    size_t soff = 0, roff = 0;
    for (int q = 0; q < n; q++) {
        sc[q] = a2av_count(me, q, step);
        sd[q] = soff;
        soff += sc[q];
    }
    for (int q = n - 1; q >= 0; q--) {
        rc[q] = a2av_count(q, me, step);
        rd[q] = roff;
        roff += rc[q];
    }
    size_t used = 2 * P2P_GUARD + (soff > roff ? soff : roff) * es;
    if (used > R->reg_bytes)
        return fail(R, "regions too small"), 1;
    unsigned char *sb = p2p_slot(R->hs, 0, soff * es), *rb = p2p_slot(R->hr, 0, roff * es);
    for (int q = 0; q < n; q++)
        p2p_message(dt, me, q, step, 0, sc[q], sb + sd[q] * es);
    memset(rb, 0, roff * es);
    colld_status_t st;
    if (null_stream) {
        if (!cuda_ok(R, "cuMemcpyHtoD", cu.cuMemcpyHtoD(DPTR(R->ds), R->hs, used)) ||
            !cuda_ok(R, "cuMemcpyHtoD", cu.cuMemcpyHtoD(DPTR(R->dr), R->hr, used)))
            return 1;
        st = colld_alltoallv(dev(R, sb), sc, sd, dev(R, rb), rc, rd, dt, R->comm, NULL);
        /* A synchronous copy on the legacy default stream comes after colld's wait there. */
        if (!posted_ok(R, "colld_alltoallv (stream NULL)", st) ||
            !cuda_ok(R, "cuMemcpyDtoH", cu.cuMemcpyDtoH(R->hs, DPTR(R->ds), used)) ||
            !cuda_ok(R, "cuMemcpyDtoH", cu.cuMemcpyDtoH(R->hr, DPTR(R->dr), used)))
            return 1;
        colld_status_t err = async_error(R, false);
        if (err != COLLD_OK)
            return fail(R, "alltoallv (stream NULL): %s: %s", colld_status_name(err), colld_comm_last_error(R->comm)),
                   1;
    } else {
        if (!upload(R, used))
            return 1;
        st = colld_alltoallv(dev(R, sb), sc, sd, dev(R, rb), rc, rd, dt, R->comm, R->stream);
        if (!posted_ok(R, "colld_alltoallv", st) || !download(R, used, "alltoallv"))
            return 1;
    }
    R->ops += 2 * n;
    bool ok = guards_ok(R, rb, roff * es, "alltoallv receive") && guards_ok(R, sb, soff * es, "alltoallv send");
    for (int q = 0; q < n; q++) {
        ok &= check_message(R, rb + rd[q] * es, dt, q, me, step, 0, rc[q], "alltoallv receive");
        ok &= check_message(R, sb + sd[q] * es, dt, me, q, step, 0, sc[q], "alltoallv send buffer");
    }
    return ok ? 0 : 1;
}

static int mode_alltoallv(run_t *R)
{
    const colld_dtype_t dts[] = { COLLD_INT32, COLLD_FLOAT16, COLLD_INT8, COLLD_FLOAT64 };
    for (unsigned i = 0; i < sizeof(dts) / sizeof(dts[0]); i++)
        if (a2av_step(R, dts[i], 11 + i, false) != 0)
            return 1;
    return a2av_step(R, COLLD_FLOAT32, 20, true);
}

/* Producer -> send to next, receive from prev (a group) -> consumer, rounds back to back. */
static int mode_stream(run_t *R)
{
    int n = R->n, me = R->rank, next = (me + 1) % n, prev = (me + n - 1) % n;
    size_t bytes = STREAM_COUNT * sizeof(float);
    float *x = (float *)R->ds, *y = (float *)R->dr, *z = (float *)(R->dr + bytes);
    float *host = (float *)R->hr;
    double spin = R->a->spin_ms, limit = spin / 4 > HOST_CALL_LIMIT_MS ? spin / 4 : HOST_CALL_LIMIT_MS, call_ms = 0;
    if ((size_t)STREAM_ROUNDS * bytes > R->reg_bytes || 2 * bytes > R->reg_bytes)
        return fail(R, "regions too small"), 1;
    CUresult q = CUDA_SUCCESS;
    double t0 = harness_now_ms();
    for (int it = 0; it < STREAM_ROUNDS; it++) {
        if (it == 0 && !cuda_ok(R, "spin launch", launch_spin(R, spin)))
            return 1;
        gpu_rank_produce_params_t pp = { .x = x, .n = STREAM_COUNT, .rank = me, .iter = it, .salt = 5 };
        if (!cuda_ok(R, "producer launch", launch(R, produce_fn, blocks_for(STREAM_COUNT), 256, &pp)))
            return 1;
        double c0 = harness_now_ms();
        colld_status_t st = colld_group_start();
        if (st == COLLD_OK)
            st = colld_send(x, STREAM_COUNT, COLLD_FLOAT32, next, R->comm, R->stream);
        if (st == COLLD_OK)
            st = colld_recv(y, STREAM_COUNT, COLLD_FLOAT32, prev, R->comm, R->stream);
        colld_status_t end = colld_group_end();
        if (it == 0) {
            call_ms = harness_now_ms() - c0;
            q = cu.cuStreamQuery(R->stream);
        }
        if (!posted_ok(R, "stream: the group", st != COLLD_OK ? st : end))
            return 1;
        gpu_rank_consume_params_t cp = { .y = y, .z = z, .n = STREAM_COUNT };
        if (!cuda_ok(R, "consumer launch", launch(R, consume_fn, blocks_for(STREAM_COUNT), 256, &cp)) ||
            !cuda_ok(R, "cuMemcpyDtoHAsync",
                     cu.cuMemcpyDtoHAsync(host + (size_t)it * STREAM_COUNT, DPTR(z), bytes, R->stream)))
            return 1;
        R->ops += 2;
    }
    if (wait_stream(R, "stream rounds", R->a->timeout_ms + WAIT_GRACE_MS + (int)spin) < 0)
        return 1;
    double total = harness_now_ms() - t0;
    colld_status_t err = async_error(R, false);
    if (err != COLLD_OK)
        return fail(R, "stream: async error %s: %s", colld_status_name(err), colld_comm_last_error(R->comm)), 1;
    for (int it = 0; it < STREAM_ROUNDS; it++) {
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < STREAM_COUNT; i++)
            if (host[(size_t)it * STREAM_COUNT + i] != GPU_RANK_CONSUME(GPU_RANK_VALUE(prev, it, 5u, i)) &&
                wrong++ == 0)
                first = i;
        if (wrong)
            fail(R, "stream round %d: %zu of %zu consumer outputs wrong, first at %zu", it, wrong, (size_t)STREAM_COUNT,
                 first);
    }
    fprintf(stderr,
            "rank %d: stream: behind a %.0f ms producer the group took %.3f ms (limit %.0f), the stream was %s; "
            "all %d rounds after %.1f ms\n",
            me, spin, call_ms, limit, q == CUDA_ERROR_NOT_READY ? "busy" : "NOT BUSY", STREAM_ROUNDS, total);
    if (call_ms >= limit)
        fail(R, "the colld_send/colld_recv host calls took %.3f ms behind a busy stream: they waited for the GPU",
             call_ms);
    if (q != CUDA_ERROR_NOT_READY)
        fail(R, "the stream was not busy when the group returned (result %d)", (int)q);
    if (total < 0.75 * spin)
        fail(R, "the stream finished after %.1f ms, before the %.0f ms producer could have", total, spin);
    return R->bad ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------------
 * Faults
 * ------------------------------------------------------------------------------------------- */

static int write_file(const char *dir, const char *name, const char *text)
{
    char path[600], tmp[620];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    bool bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    return bad || rename(tmp, path) != 0 ? -1 : 0;
}

/* The stream must be released (within the timeout + grace) and the communicator must have failed
 * with `want`, its detail holding every string of `needles` (NULL-terminated). */
static int expect_failure(run_t *R, colld_status_t want, const char *const *needles, double extra_ms)
{
    double t0 = harness_now_ms();
    if (wait_stream(R, "the failed operation", R->a->timeout_ms + RELEASE_GRACE_MS + (int)extra_ms) < 0)
        return 1;
    double released = harness_now_ms() - t0;
    colld_status_t err = async_error(R, true);
    const char *detail = colld_comm_last_error(R->comm);
    fprintf(stderr, "rank %d: stream released after %.1f ms with %s: %s\n", R->rank, released, colld_status_name(err),
            detail);
    if (err != want)
        return fail(R, "expected %s, got %s", colld_status_name(want), colld_status_name(err)), 1;
    for (int i = 0; needles && needles[i]; i++)
        if (!strstr(detail, needles[i]))
            return fail(R, "the detail does not say \"%s\"", needles[i]), 1;
    return 0;
}

static int mode_fault(run_t *R)
{
    const args_t *a = R->a;
    const char *scene = a->scene ? a->scene : "";
    char text[256];
    if (R->n != 2)
        return fail(R, "--mode fault needs 2 ranks"), 2;
    /* Warm-up: the buffers are registered and the path works. */
    if (strcmp(scene, "nopeer") != 0 && ring_step(R, COLLD_FLOAT32, 1001, 900, false) != 0)
        return 1;
    float *buf = (float *)(R->rank == 0 ? R->ds : R->dr);
    colld_status_t st;
    if (strcmp(scene, "mismatch") == 0) {
        st = R->rank == 0 ? colld_send(buf, 100, COLLD_FLOAT32, 1, R->comm, R->stream)
                          : colld_recv(buf, 50, COLLD_FLOAT32, 0, R->comm, R->stream);
        const char *needles[] = { "rank 0 sends 100 x float32 (400 B)", "rank 1 receives 50 x float32 (200 B)", NULL };
        return posted_ok(R, "mismatch: posting", st) ? expect_failure(R, COLLD_ERR_MISMATCH, needles, 0) : 1;
    }
    if (strcmp(scene, "timeout") == 0) {
        double spin = a->timeout_ms * 2.0;
        if (R->rank == 0 && !cuda_ok(R, "spin launch", launch_spin(R, spin)))
            return 1;
        st = R->rank == 0 ? colld_send(buf, 1001, COLLD_FLOAT32, 1, R->comm, R->stream)
                          : colld_recv(buf, 1001, COLLD_FLOAT32, 0, R->comm, R->stream);
        const char *needles[] = { "point-to-point timed out after", "the GPU stream of rank 0 (pid",
                                  "never reached its send of 1001 x float32 to rank 1", NULL };
        return posted_ok(R, "timeout: posting", st) ? expect_failure(R, COLLD_ERR_TIMEOUT, needles, spin) : 1;
    }
    if (strcmp(scene, "host") == 0) {
        float *hbuf = calloc(1001, sizeof(float));
        st = R->rank == 0 ? colld_send(buf, 1001, COLLD_FLOAT32, 1, R->comm, R->stream)
                          : colld_recv(hbuf, 1001, COLLD_FLOAT32, 0, R->comm, NULL);
        const char *needles[] = { "between GPU and host memory is not supported",
                                  "rank 0 sends 1001 x float32 (4004 B) of GPU memory",
                                  "rank 1 receives 1001 x float32 (4004 B) of host memory", NULL };
        int rc = 1;
        if (posted_ok(R, "host: posting", st)) {
            if (R->rank == 0)
                rc = expect_failure(R, COLLD_ERR_NOT_SUPPORTED, needles, 0);
            else if ((st = colld_comm_synchronize(R->comm)) != COLLD_ERR_NOT_SUPPORTED)
                fail(R, "host: colld_comm_synchronize returned %s, want COLLD_ERR_NOT_SUPPORTED",
                     colld_status_name(st));
            else
                rc = expect_failure(R, COLLD_ERR_NOT_SUPPORTED, needles, 0);
        }
        free(hbuf);
        return rc;
    }
    if (strcmp(scene, "nopeer") == 0) {
        st = R->rank == 0 ? colld_send(buf, 1001, COLLD_FLOAT32, 1, R->comm, R->stream)
                          : colld_recv(buf, 1001, COLLD_FLOAT32, 0, R->comm, R->stream);
        const char *needles[] = { "the send buffer is on GPU 0 and the receive buffer on GPU 1, which cannot access "
                                  "each other's memory (no peer access)",
                                  NULL };
        return posted_ok(R, "nopeer: posting", st) ? expect_failure(R, COLLD_ERR_NOT_SUPPORTED, needles, 0) : 1;
    }
    if (strcmp(scene, "victim") != 0 || !a->sync_dir)
        return fail(R, "unknown --scene %s (or no --sync-dir)", scene), 2;
    if (R->rank == 0) {
        if (a->victim_posts) {
            /* Its stream never reaches the send: the pair is matched and waits for it. */
            if (!cuda_ok(R, "spin launch", launch_spin(R, VICTIM_SPIN_MS)) ||
                !posted_ok(R, "victim: colld_send", colld_send(buf, 1001, COLLD_FLOAT32, 1, R->comm, R->stream)))
                return 1;
        }
        write_file(a->sync_dir, "victim-ready", "ready\n");
        for (int i = 0; i < 1200; i++)
            usleep(100000);
        return fail(R, "the victim was not killed within 120 s"), 1;
    }
    if (!posted_ok(R, "victim: colld_recv", colld_recv(buf, 1001, COLLD_FLOAT32, 0, R->comm, R->stream)))
        return 1;
    write_file(a->sync_dir, "posted-1", "posted\n");
    const char *needles[] = { "rank 0", NULL };
    int rc = expect_failure(R, COLLD_ERR_PEER_LOST, needles, 0);
    snprintf(text, sizeof(text), "%.3f %s\n", harness_now_ms(), rc ? "FAILED" : "COLLD_ERR_PEER_LOST");
    write_file(a->sync_dir, "released-1", text);
    return rc;
}

/* The deadlock of a send and a collective on two communicators (2 ranks, --uid2 the second, B):
 * rank 0 sends to rank 1 on A, then all-reduces on B; rank 1 all-reduces on B, then receives from
 * rank 0 on A; all on each rank's one stream. The send and receive match but wait for rank 1's
 * stream, which waits in B's all-reduce, which waits for rank 0's stream, which waits in the send.
 * The daemon (--deadlock-ms, --deadlock-fail) must fail both communicators with COLLD_ERR_DEADLOCK
 * naming the cycle and release both streams, within half the timeout. */
static int mode_crossed(run_t *R)
{
    const args_t *a = R->a;
    colld_unique_id_t id2;
    colld_comm_t *b = NULL;
    if (R->n != 2 || !a->uid2_hex || harness_uid_from_hex(a->uid2_hex, &id2) < 0)
        return fail(R, "--mode crossed needs 2 ranks and --uid2"), 2;
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = a->timeout_ms;
    cfg.name = "crossed-b";
    if (!posted_ok(R, "joining B", colld_comm_init_rank(R->c, &b, 2, id2, R->rank, &cfg)))
        return 1;
    float *x = (float *)R->ds, *y = (float *)R->dr;
    colld_status_t st = COLLD_OK;
    double t0 = harness_now_ms();
    if (R->rank == 0) {
        st = colld_send(x, 1001, COLLD_FLOAT32, 1, R->comm, R->stream);
        if (st == COLLD_OK)
            st = colld_allreduce(y, y, 1001, COLLD_FLOAT32, COLLD_SUM, b, R->stream);
    } else {
        st = colld_allreduce(y, y, 1001, COLLD_FLOAT32, COLLD_SUM, b, R->stream);
        if (st == COLLD_OK)
            st = colld_recv(x, 1001, COLLD_FLOAT32, 0, R->comm, R->stream);
    }
    int rc = posted_ok(R, "crossed: posting", st) && wait_stream(R, "the crossed operations", a->timeout_ms / 2) == 0
                 ? 0
                 : 1;
    double ms = harness_now_ms() - t0;
    colld_comm_t *comms[2] = { R->comm, b };
    for (int i = 0; i < 2 && rc == 0; i++) {
        colld_status_t err = COLLD_OK;
        const char *detail;
        colld_comm_get_async_error(comms[i], &err);
        detail = colld_comm_last_error(comms[i]);
        if (err == COLLD_ERR_DEADLOCK && strstr(detail, "deadlock across communicators: rank ") &&
            strstr(detail, "send to rank 1 (operation #")) {
            fprintf(stderr, "rank %d: communicator %s: %s\n", R->rank, i ? "B" : "A", detail);
            continue;
        }
        fail(R, "communicator %s: %s, want COLLD_ERR_DEADLOCK naming the send: %s", i ? "B" : "A",
             colld_status_name(err), detail);
        rc = 1;
    }
    if (rc == 0)
        fprintf(stderr, "rank %d: the crossed streams were released after %.0f ms (timeout %d ms)\n", R->rank, ms,
                a->timeout_ms);
    colld_comm_destroy(b);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Set-up
 * ------------------------------------------------------------------------------------------- */

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
        HARNESS_STR("scene", &a->scene),
        HARNESS_STR("sync-dir", &a->sync_dir),
        HARNESS_INT("gpus", &a->gpus),
        HARNESS_INT("timeout-ms", &a->timeout_ms),
        HARNESS_DOUBLE("spin-ms", &a->spin_ms),
        HARNESS_SET("victim-posts", &a->victim_posts),
        HARNESS_SET("cudafake", &a->cudafake),
    };
    if (HARNESS_PARSE_OPTS("gpu_p2p_rank", argc, argv, opts) != 0)
        return 2;
    bool alloc_ok = !strcmp(a->alloc, "cumemalloc") || !strcmp(a->alloc, "colld");
    if (!a->socket || !a->uid_hex || a->nranks < 1 || a->nranks > MAX_RANKS_P2P || a->rank < 0 ||
        a->rank >= a->nranks || a->gpus < 1 || !alloc_ok || a->timeout_ms <= 0 || !(a->spin_ms >= 0)) {
        fprintf(stderr, "gpu_p2p_rank: need --socket, --uid, --nranks 1..%d, --rank; --alloc cumemalloc|colld\n",
                MAX_RANKS_P2P);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    args_t a = { .mode = "ring", .alloc = "cumemalloc", .gpus = 1, .timeout_ms = 60000, .spin_ms = 200 };
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc;
    setvbuf(stderr, NULL, _IONBF, 0);
    run_t R = { .a = &a, .n = a.nranks, .rank = a.rank, .use_colld_alloc = !strcmp(a.alloc, "colld") };
    double t0 = harness_now_ms();
    char err[512];
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
    colld_unique_id_t id;
    if (!cuda_ok(&R, "the device's primary context", gpu_cu_use_device(&cu, R.dev)) ||
        !cuda_ok(&R, "cuStreamCreate", cu.cuStreamCreate(&R.stream, CU_STREAM_NON_BLOCKING)) || load_kernels(&R) < 0)
        return 1;
    if (harness_uid_from_hex(a.uid_hex, &id) < 0) {
        fprintf(stderr, "gpu_p2p_rank: bad --uid\n");
        return 2;
    }
    colld_status_t st = colld_connect(a.socket, &R.c);
    if (st != COLLD_OK) {
        fprintf(stderr, "rank %d: connect: %s\n", a.rank, colld_status_name(st));
        return 1;
    }
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = a.timeout_ms;
    cfg.name = "test-gpu-p2p";
    if ((st = colld_comm_init_rank(R.c, &R.comm, a.nranks, id, a.rank, &cfg)) != COLLD_OK) {
        fprintf(stderr, "rank %d: comm_init_rank: %s\n", a.rank, colld_status_name(st));
        R.comm = NULL;
        rc = 1;
        goto out;
    }
    R.reg_bytes = ((size_t)STREAM_ROUNDS * STREAM_COUNT * sizeof(float) + 4095) & ~(size_t)4095;
    R.ds = dev_alloc(&R, R.reg_bytes);
    R.dr = R.ds ? dev_alloc(&R, R.reg_bytes) : NULL;
    if (!R.dr || !(R.hs = gpu_cu_host_alloc(&cu, R.reg_bytes, err, sizeof(err))) ||
        !(R.hr = gpu_cu_host_alloc(&cu, R.reg_bytes, err, sizeof(err)))) {
        fprintf(stderr, "rank %d: buffers: %s\n", a.rank, R.dr ? err : "device memory");
        rc = 1;
        goto out;
    }
    if (!strcmp(a.mode, "ring"))
        rc = mode_ring(&R);
    else if (!strcmp(a.mode, "pairs"))
        rc = mode_pairs(&R);
    else if (!strcmp(a.mode, "alltoallv"))
        rc = mode_alltoallv(&R);
    else if (!strcmp(a.mode, "stream"))
        rc = mode_stream(&R);
    else if (!strcmp(a.mode, "fault"))
        rc = mode_fault(&R);
    else if (!strcmp(a.mode, "crossed"))
        rc = mode_crossed(&R);
    else {
        fprintf(stderr, "gpu_p2p_rank: unknown mode %s\n", a.mode);
        rc = 2;
    }
    /* No rank leaves (closing the communicator for the others) before every rank has checked. */
    if (rc == 0 && strcmp(a.mode, "fault") != 0 && strcmp(a.mode, "crossed") != 0 &&
        (st = colld_barrier(R.comm)) != COLLD_OK) {
        fprintf(stderr, "rank %d: the final colld_barrier: %s\n", a.rank, colld_status_name(st));
        rc = 1;
    }
    if (R.rank == 0)
        fprintf(stderr, "rank 0/%d: gpu p2p mode %s (%s, %d GPU(s)%s): %ld operations, %ld failures, %.0f ms\n", R.n,
                a.mode, a.alloc, a.gpus, cu.on_double ? ", the CUDA driver test double" : "", R.ops, R.bad,
                harness_now_ms() - t0);
out:
    dev_free(&R, R.ds);
    dev_free(&R, R.dr);
    gpu_cu_host_free(&cu, R.hs, R.reg_bytes);
    gpu_cu_host_free(&cu, R.hr, R.reg_bytes);
    if (R.comm && (st = colld_comm_destroy(R.comm)) != COLLD_OK && rc == 0 && strcmp(a.mode, "fault") != 0 &&
        strcmp(a.mode, "crossed") != 0) {
        fprintf(stderr, "rank %d: colld_comm_destroy: %s\n", a.rank, colld_status_name(st));
        rc = 1;
    }
    colld_disconnect(R.c);
    (void)cu.cuStreamDestroy(R.stream);
    return rc;
}
