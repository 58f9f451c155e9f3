/*
 * nccl_rank.c - colld-test-nccl-rank: one rank of the NCCL API tests (test_nccl.c), a program
 * written against nccl.h alone (and libc), as any NCCL program is, linked with -lnccl. It must run
 * on colld's libnccl.so.2: it first checks that the ncclAllReduce it calls is colld's (exit 3,
 * naming the library, when it is another NCCL) and prints the library's path.
 *
 * Modes (--mode):
 *   matrix   rank 0 makes the unique id (ncclGetUniqueId) and hands it over in --id-file; every
 *            rank joins (ncclCommInitRank) and runs, on host memory, every collective x NCCL data
 *            type x reduction operator x count {0, 1, 1001, 70001} (all-reduce in and out of
 *            place), the premultiplied sum included (each rank makes an operator with
 *            ncclRedOpCreatePreMulSum and its own host scalar right before the call and destroys
 *            it right after, as PyTorch does), then the same all-reduces as one group, checking
 *            every element exactly. Inputs and scalars are small integers, so every result is exact
 *            in every type and any order.
 *            Then point-to-point: a group of ncclSend/ncclRecv with every rank (an all-to-all, as
 *            nccl-tests' alltoall makes it) for every type, and rank-ordered sends without groups.
 *   initall  one process, --nranks ranks: ncclCommInitAll, then one group with an all-reduce on
 *            each communicator (one thread drives every rank), checked exactly.
 *   errors   what a caller gets for bad input and what colld does not support yet: the result
 *            code and ncclGetLastError's text (one rank, its own communicator), premultiplied-sum
 *            operators used wrongly included; ncclCommRegister of host memory (a hint that does
 *            nothing) and its bad arguments.
 *   victim   as matrix's start, then rank --victim exits at once after joining; the other ranks'
 *            all-reduce must fail with ncclRemoteError and ncclGetLastError naming the victim, and
 *            so must their ncclCommShrink without it (colld cannot shrink a broken communicator).
 *   stale    2 ranks: rank 0's ncclSend to peer 5 is refused (ncclInvalidArgument, the peer named),
 *            then rank 0 calls ncclAllReduce while rank 1 calls ncclBroadcast: both fail with
 *            ncclRemoteError, and rank 0's ncclGetLastError must give colld's mismatch report, not
 *            the earlier refusal (issue 26 row 6); so must ncclCommGetAsyncError's.
 *   recent   the calls of NCCL 2.20-2.28 that PyTorch 2.x links, on 3 or more ranks: every rank
 *            joins with ncclCommInitRankScalable and two unique ids (made by ranks 0 and 1);
 *            ncclGroupSimulateEnd runs nothing of its group (an all-reduce and a ring of sends
 *            and receives keep their buffers; the same group then runs exactly); ncclCommShrink
 *            without rank 1 while it stays idle (the parent still works for all), then without
 *            the last rank after it destroyed its handle. ncclAlltoAll is in matrix; the
 *            refusals (memory windows, device communicators) and bad arguments in errors.
 *
 * Exit status: 0 everything as expected; 1 a wrong result or status (printed); 2 bad arguments;
 * 3 the NCCL loaded is not colld's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nccl.h"
#include "nccl_share_id.h" /* the tests' own: the unique id through a file */

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXN 8

static int nranks = 2, rank = 0, victim = -1;
static const char *id_file, *mode = "matrix";
static long wrong, checked;

#define CHECK(call)                                                                                                    \
    do {                                                                                                               \
        ncclResult_t r_ = (call);                                                                                      \
        if (r_ != ncclSuccess) {                                                                                       \
            fprintf(stderr, "rank %d: %s: %s (%d): %s\n", rank, #call, ncclGetErrorString(r_), (int)r_,                \
                    ncclGetLastError(NULL));                                                                           \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

/* ============================================================================================
 * Values: small integers in every data type
 * ========================================================================================== */

static const char *const type_names[ncclNumTypes] = { "int8",   "uint8",   "int32",   "uint32",  "int64",
                                                      "uint64", "float16", "float32", "float64", "bfloat16" };
/* The matrix's operators: NCCL's five, then the premultiplied sum (OP_PREMUL). */
#define OP_PREMUL ncclNumOps
static const char *const op_names[ncclNumOps + 1] = { "sum", "prod", "max", "min", "avg", "premulsum" };

static size_t type_size(ncclDataType_t t)
{
    static const size_t s[ncclNumTypes] = { 1, 1, 4, 4, 8, 8, 2, 4, 8, 2 };
    return s[t];
}

/* An integer |v| <= 2048 as IEEE half (exact). */
static uint16_t to_half(int v)
{
    if (v == 0)
        return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    unsigned a = (unsigned)(v < 0 ? -v : v);
    int e = 31 - __builtin_clz(a); /* a = 1.m * 2^e */
    uint16_t mant = (uint16_t)(((a << 10) >> e) & 0x3ff);
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | mant);
}

static double from_half(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    double m = (double)(h & 0x3ff);
    double v = e == 0 ? m / 1024.0 / 16384.0
                      : (1.0 + m / 1024.0) * ((e >= 15) ? (double)(1u << (e - 15)) : 1.0 / (double)(1u << (15 - e)));
    return (h & 0x8000) ? -v : v;
}

static void put(ncclDataType_t t, void *buf, size_t i, int v)
{
    switch (t) {
    case ncclInt8:
        ((int8_t *)buf)[i] = (int8_t)v;
        break;
    case ncclUint8:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    case ncclInt32:
        ((int32_t *)buf)[i] = v;
        break;
    case ncclUint32:
        ((uint32_t *)buf)[i] = (uint32_t)v;
        break;
    case ncclInt64:
        ((int64_t *)buf)[i] = v;
        break;
    case ncclUint64:
        ((uint64_t *)buf)[i] = (uint64_t)v;
        break;
    case ncclFloat16:
        ((uint16_t *)buf)[i] = to_half(v);
        break;
    case ncclFloat32:
        ((float *)buf)[i] = (float)v;
        break;
    case ncclFloat64:
        ((double *)buf)[i] = v;
        break;
    case ncclBfloat16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16); /* exact: small integers need no rounding */
        break;
    }
    default:
        break;
    }
}

static double get(ncclDataType_t t, const void *buf, size_t i)
{
    switch (t) {
    case ncclInt8:
        return ((const int8_t *)buf)[i];
    case ncclUint8:
        return ((const uint8_t *)buf)[i];
    case ncclInt32:
        return ((const int32_t *)buf)[i];
    case ncclUint32:
        return ((const uint32_t *)buf)[i];
    case ncclInt64:
        return (double)((const int64_t *)buf)[i];
    case ncclUint64:
        return (double)((const uint64_t *)buf)[i];
    case ncclFloat16:
        return from_half(((const uint16_t *)buf)[i]);
    case ncclFloat32:
        return ((const float *)buf)[i];
    case ncclFloat64:
        return ((const double *)buf)[i];
    case ncclBfloat16: {
        uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default:
        return 0;
    }
}

/* Rank r's input element i for op (salt varies it per call): every result stays a small integer.
 * prod: 1 or 2; avg: base(i) + 2r - (n - 1), which sums to n * base(i); else 0..4. */
static int input(ncclRedOp_t op, int r, size_t i, unsigned salt)
{
    size_t k = i + salt;
    if (op == ncclProd)
        return 1 + (int)((k + (size_t)r) % 2);
    if (op == ncclAvg)
        return nranks + (int)(k % 5) + 2 * r - (nranks - 1);
    return (int)((k * 7 + (size_t)r * 3) % 5);
}

/* Rank r's premultiplied-sum scalar (1, 2 or 3). */
static int premul_scalar(int r, unsigned salt)
{
    return 1 + (int)((unsigned)r + salt) % 3;
}

/* The reduction of element i over every rank (op OP_PREMUL: the sum of each rank's input, the
 * sum's, times its scalar). */
static double expect(int op, size_t i, unsigned salt)
{
    if (op == OP_PREMUL) {
        double acc = 0;
        for (int r = 0; r < nranks; r++)
            acc += premul_scalar(r, salt) * input(ncclSum, r, i, salt);
        return acc;
    }
    double acc = input(op, 0, i, salt);
    for (int r = 1; r < nranks; r++) {
        double v = input(op, r, i, salt);
        acc = op == ncclProd  ? acc * v
              : op == ncclMax ? (v > acc ? v : acc)
              : op == ncclMin ? (v < acc ? v : acc)
                              : acc + v;
    }
    return op == ncclAvg ? acc / nranks : acc;
}

static void fill(ncclDataType_t t, int op, void *buf, size_t count, int r, unsigned salt)
{
    for (size_t i = 0; i < count; i++)
        put(t, buf, i, input(op == OP_PREMUL ? ncclSum : (ncclRedOp_t)op, r, i, salt));
}

/* The ncclRedOp_t of a matrix operator: NCCL's own, or a premultiplied sum made now with this
 * rank's scalar in host memory (of type t). */
static ncclRedOp_t make_op(int op, ncclDataType_t t, unsigned salt, ncclComm_t comm)
{
    if (op != OP_PREMUL)
        return (ncclRedOp_t)op;
    uint64_t scalar = 0; /* room for one value of any type */
    ncclRedOp_t pm;
    put(t, &scalar, 0, premul_scalar(rank, salt));
    CHECK(ncclRedOpCreatePreMulSum(&pm, &scalar, t, ncclScalarHostImmediate, comm));
    if ((int)pm < ncclNumOps) {
        fprintf(stderr, "rank %d: ncclRedOpCreatePreMulSum gave %d, a built-in operator\n", rank, (int)pm);
        exit(1);
    }
    return pm;
}

/* Destroy what make_op made (right after the call that used it). */
static void drop_op(int op, ncclRedOp_t made, ncclComm_t comm)
{
    if (op == OP_PREMUL)
        CHECK(ncclRedOpDestroy(made, comm));
}

/* Compare count elements of got with want(i); print the first few differences. */
static void compare(const char *what, ncclDataType_t t, const void *got, size_t count, double (*want)(size_t, void *),
                    void *ctx)
{
    int shown = 0;
    for (size_t i = 0; i < count; i++) {
        double w = want(i, ctx), g = get(t, got, i);
        checked++;
        if (g != w) {
            wrong++;
            if (shown++ < 3)
                fprintf(stderr, "rank %d: %s %s: element %zu is %g, want %g\n", rank, what, type_names[t], i, g, w);
        }
    }
}

/* ============================================================================================
 * The collectives
 * ========================================================================================== */

typedef struct {
    int op; /* ncclRedOp_t, or OP_PREMUL */
    unsigned salt;
    int root, block_rank; /* broadcast: the root; all-gather: which rank's block */
    size_t count;
} want_t;

static double want_reduced(size_t i, void *ctx)
{
    const want_t *w = ctx;
    return expect(w->op, i, w->salt);
}

static double want_root_input(size_t i, void *ctx)
{
    const want_t *w = ctx;
    return input(ncclSum, w->root, i, w->salt);
}

static double want_gathered(size_t i, void *ctx)
{
    const want_t *w = ctx;
    return input(ncclSum, (int)(i / w->count), i % w->count, w->salt);
}

static double want_scattered(size_t i, void *ctx)
{
    const want_t *w = ctx;
    return expect(w->op, (size_t)rank * w->count + i, w->salt);
}

/* The value rank `root` sends this rank at element i (small integers, exact in every type). */
static double want_sent(size_t i, void *ctx)
{
    const want_t *w = ctx;
    return input(ncclSum, w->root * 16 + rank, i, w->salt);
}

static unsigned salt_next(void)
{
    static unsigned s;
    return ++s * 13;
}

static void run_matrix(ncclComm_t comm)
{
    static const size_t counts[] = { 0, 1, 1001, 70001 };
    size_t maxc = 70001 * MAXN;
    char *send = malloc(maxc * 8), *recv = malloc(maxc * 8);
    if (!send || !recv)
        exit(1);
    for (int t = 0; t < ncclNumTypes; t++)
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            size_t n = counts[ci];
            char what[128];
            for (int op = 0; op <= OP_PREMUL; op++) {
                ncclRedOp_t made;
                for (int inplace = 0; inplace < 2; inplace++) { /* all-reduce */
                    want_t w = { .op = op, .salt = salt_next() };
                    fill((ncclDataType_t)t, w.op, send, n, rank, w.salt);
                    made = make_op(op, (ncclDataType_t)t, w.salt, comm);
                    CHECK(ncclAllReduce(send, inplace ? send : recv, n, (ncclDataType_t)t, made, comm, NULL));
                    drop_op(op, made, comm);
                    snprintf(what, sizeof(what), "allreduce %s count %zu%s", op_names[op], n,
                             inplace ? " in place" : "");
                    compare(what, (ncclDataType_t)t, inplace ? send : recv, n, want_reduced, &w);
                }
                want_t w = { .op = op, .salt = salt_next(), .root = (int)(n % (size_t)nranks) };
                fill((ncclDataType_t)t, w.op, send, n, rank, w.salt); /* reduce */
                memset(recv, 0x5a, n * type_size((ncclDataType_t)t));
                made = make_op(op, (ncclDataType_t)t, w.salt, comm);
                CHECK(ncclReduce(send, recv, n, (ncclDataType_t)t, made, w.root, comm, NULL));
                drop_op(op, made, comm);
                if (rank == w.root) {
                    snprintf(what, sizeof(what), "reduce %s count %zu root %d", op_names[op], n, w.root);
                    compare(what, (ncclDataType_t)t, recv, n, want_reduced, &w);
                }
                w.count = n; /* reduce-scatter: n per rank */
                fill((ncclDataType_t)t, w.op, send, n * (size_t)nranks, rank, w.salt);
                made = make_op(op, (ncclDataType_t)t, w.salt, comm);
                CHECK(ncclReduceScatter(send, recv, n, (ncclDataType_t)t, made, comm, NULL));
                drop_op(op, made, comm);
                snprintf(what, sizeof(what), "reducescatter %s count %zu", op_names[op], n);
                compare(what, (ncclDataType_t)t, recv, n, want_scattered, &w);
            }
            want_t w = { .salt = salt_next(), .root = (int)((n + 1) % (size_t)nranks), .count = n };
            fill((ncclDataType_t)t, ncclSum, send, n, rank == w.root ? w.root : rank + 100, w.salt); /* broadcast */
            CHECK(ncclBcast(send, n, (ncclDataType_t)t, w.root, comm, NULL));
            snprintf(what, sizeof(what), "broadcast count %zu root %d", n, w.root);
            compare(what, (ncclDataType_t)t, send, n, want_root_input, &w);
            fill((ncclDataType_t)t, ncclSum, send, n, rank, w.salt); /* all-gather */
            CHECK(ncclAllGather(send, recv, n, (ncclDataType_t)t, comm, NULL));
            snprintf(what, sizeof(what), "allgather count %zu", n);
            compare(what, (ncclDataType_t)t, recv, n * (size_t)nranks, want_gathered, &w);
            size_t es = type_size((ncclDataType_t)t); /* all-to-all: block q to rank q */
            for (int q = 0; q < nranks; q++)
                fill((ncclDataType_t)t, ncclSum, send + (size_t)q * n * es, n, rank * 16 + q, w.salt);
            memset(recv, 0x5a, (size_t)nranks * n * es);
            CHECK(ncclAlltoAll(send, recv, n, (ncclDataType_t)t, comm, NULL));
            for (int q = 0; q < nranks; q++) {
                want_t from = { .salt = w.salt, .root = q };
                snprintf(what, sizeof(what), "alltoall count %zu from rank %d", n, q);
                compare(what, (ncclDataType_t)t, recv + (size_t)q * n * es, n, want_sent, &from);
            }
        }

    /* One group: an all-reduce of every data type, all complete at ncclGroupEnd; half of them
     * premultiplied sums whose operators are destroyed before ncclGroupEnd. */
    char *bufs[ncclNumTypes];
    want_t ws[ncclNumTypes];
    CHECK(ncclGroupStart());
    for (int t = 0; t < ncclNumTypes; t++) {
        ws[t] = (want_t){ .op = t % 2 ? OP_PREMUL : t % ncclNumOps, .salt = salt_next() };
        if (!(bufs[t] = malloc(1001 * 8)))
            exit(1);
        fill((ncclDataType_t)t, ws[t].op, bufs[t], 1001, rank, ws[t].salt);
        ncclRedOp_t made = make_op(ws[t].op, (ncclDataType_t)t, ws[t].salt, comm);
        CHECK(ncclAllReduce(bufs[t], bufs[t], 1001, (ncclDataType_t)t, made, comm, NULL));
        drop_op(ws[t].op, made, comm);
    }
    CHECK(ncclGroupEnd());
    for (int t = 0; t < ncclNumTypes; t++) {
        compare("grouped allreduce", (ncclDataType_t)t, bufs[t], 1001, want_reduced, &ws[t]);
        free(bufs[t]);
    }
    free(send);
    free(recv);
}

/* Point-to-point, the way NCCL programs (and nccl-tests' alltoall) use it: one group with a send
 * to and a receive from every rank (itself included), for every data type, then PyTorch's pattern
 * without groups (each rank in turn sends to every other in rank order, the others receive). */
static void run_p2p(ncclComm_t comm)
{
    const size_t n = 1001;
    char *send = malloc(n * 8 * MAXN), *recv = malloc(n * 8 * MAXN);
    if (!send || !recv)
        exit(1);
    for (int t = 0; t < ncclNumTypes; t++) {
        size_t es = type_size((ncclDataType_t)t);
        unsigned salt = salt_next();
        for (int q = 0; q < nranks; q++)
            fill((ncclDataType_t)t, ncclSum, send + (size_t)q * n * es, n, rank * 16 + q, salt);
        memset(recv, 0x5a, (size_t)nranks * n * es);
        CHECK(ncclGroupStart());
        for (int q = 0; q < nranks; q++) {
            CHECK(ncclSend(send + (size_t)q * n * es, n, (ncclDataType_t)t, q, comm, NULL));
            CHECK(ncclRecv(recv + (size_t)q * n * es, n, (ncclDataType_t)t, q, comm, NULL));
        }
        CHECK(ncclGroupEnd());
        for (int q = 0; q < nranks; q++) {
            want_t w = { .salt = salt, .root = q };
            compare("send/recv all-to-all", (ncclDataType_t)t, recv + (size_t)q * n * es, n, want_sent, &w);
        }
    }
    unsigned salt = salt_next();
    for (int src = 0; src < nranks; src++)
        for (int dst = 0; dst < nranks; dst++) {
            if (src == dst || (rank != src && rank != dst))
                continue;
            if (rank == src) {
                fill(ncclInt32, ncclSum, send, n, src * 16 + dst, salt);
                CHECK(ncclSend(send, n, ncclInt32, dst, comm, NULL)); /* returns once received */
            } else {
                CHECK(ncclRecv(recv, n, ncclInt32, src, comm, NULL));
                want_t w = { .salt = salt, .root = src };
                compare("send/recv in rank order", ncclInt32, recv, n, want_sent, &w);
            }
        }
    free(send);
    free(recv);
}

/* ============================================================================================
 * Modes
 * ========================================================================================== */

static ncclComm_t join(void)
{
    ncclUniqueId id;
    ncclComm_t comm;
    nccl_test_share_id(&id, rank, id_file);
    CHECK(ncclCommInitRank(&comm, nranks, id, rank));
    int n = 0, r = -1;
    CHECK(ncclCommCount(comm, &n));
    CHECK(ncclCommUserRank(comm, &r));
    if (n != nranks || r != rank) {
        fprintf(stderr, "rank %d: ncclCommCount %d, ncclCommUserRank %d\n", rank, n, r);
        exit(1);
    }
    return comm;
}

/* ncclCommSplit: colors rank % 2 (with 3 ranks or more the last rank passes NCCL_SPLIT_NOCOLOR),
 * key -rank (each group in reverse order); an exact all-reduce of the parent ranks in each group. */
static void run_split(ncclComm_t comm)
{
    bool nocolor = nranks >= 3 && rank == nranks - 1;
    ncclComm_t sub = NULL;
    CHECK(ncclCommSplit(comm, nocolor ? NCCL_SPLIT_NOCOLOR : rank % 2, -rank, &sub, NULL));
    int want_n = 0, want_rank = 0, want_sum = 0;
    for (int r = 0; r < nranks && !nocolor; r++)
        if (!(nranks >= 3 && r == nranks - 1) && r % 2 == rank % 2) {
            want_n++;
            want_rank += r > rank;
            want_sum += r;
        }
    int n = 0, me = -1;
    if (sub) {
        CHECK(ncclCommCount(sub, &n));
        CHECK(ncclCommUserRank(sub, &me));
    }
    checked++;
    if ((sub == NULL) != (want_n == 0) || (sub && (n != want_n || me != want_rank))) {
        fprintf(stderr, "rank %d: ncclCommSplit gave rank %d of %d, want %d of %d\n", rank, me, n, want_rank, want_n);
        wrong++;
    }
    if (!sub)
        return;
    int32_t x = rank;
    CHECK(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, sub, NULL));
    checked++;
    if (x != want_sum) {
        fprintf(stderr, "rank %d: all-reduce on the split communicator: %d, want %d\n", rank, (int)x, want_sum);
        wrong++;
    }
    CHECK(ncclCommDestroy(sub));
}

static int mode_matrix(void)
{
    ncclComm_t comm = join();
    run_matrix(comm);
    run_p2p(comm);
    run_split(comm);
    ncclResult_t async = ncclInternalError;
    CHECK(ncclCommGetAsyncError(comm, &async));
    CHECK(ncclCommFinalize(comm));
    CHECK(ncclCommDestroy(comm));
    printf("rank %d: %ld elements checked, %ld wrong (async error %s)\n", rank, checked, wrong,
           ncclGetErrorString(async));
    return wrong == 0 && async == ncclSuccess ? 0 : 1;
}

static int mode_initall(void)
{
    ncclComm_t comms[MAXN];
    char *bufs[MAXN];
    CHECK(ncclCommInitAll(comms, nranks, NULL));
    want_t w = { .op = ncclSum, .salt = salt_next() };
    CHECK(ncclGroupStart());
    for (int r = 0; r < nranks; r++) {
        if (!(bufs[r] = malloc(70001 * 4)))
            return 1;
        fill(ncclFloat32, ncclSum, bufs[r], 70001, r, w.salt);
        CHECK(ncclAllReduce(bufs[r], bufs[r], 70001, ncclFloat32, ncclSum, comms[r], NULL));
    }
    CHECK(ncclGroupEnd());
    for (int r = 0; r < nranks; r++) {
        compare("initall allreduce", ncclFloat32, bufs[r], 70001, want_reduced, &w);
        CHECK(ncclCommDestroy(comms[r]));
        free(bufs[r]);
    }
    printf("one process, %d ranks: %ld elements checked, %ld wrong\n", nranks, checked, wrong);
    return wrong == 0 ? 0 : 1;
}

/* An exact all-reduce on comm of this rank's `value`, whose sum over the ranks must be `want`. */
static void check_sum(const char *what, ncclComm_t comm, int value, int want)
{
    int32_t x[3] = { value, 2 * value, -value };
    CHECK(ncclAllReduce(x, x, 3, ncclInt32, ncclSum, comm, NULL));
    checked += 3;
    if (x[0] != want || x[1] != 2 * want || x[2] != -want) {
        fprintf(stderr, "rank %d: %s: all-reduce gave %d %d %d, want %d %d %d\n", rank, what, (int)x[0], (int)x[1],
                (int)x[2], want, 2 * want, -want);
        wrong++;
    }
}

/* comm must have n ranks, this one being `me`. */
static void check_shape(const char *what, ncclComm_t comm, int n, int me)
{
    int got_n = -1, got_me = -1;
    CHECK(ncclCommCount(comm, &got_n));
    CHECK(ncclCommUserRank(comm, &got_me));
    checked++;
    if (got_n != n || got_me != me) {
        fprintf(stderr, "rank %d: %s: rank %d of %d, want %d of %d\n", rank, what, got_me, got_n, me, n);
        wrong++;
    }
}

/* A call must give `want` and ncclGetLastError must contain `text`. */
static int expect_error(const char *what, ncclResult_t got, ncclResult_t want, const char *text)
{
    const char *last = ncclGetLastError(NULL);
    printf("%s: %s: %s\n", what, ncclGetErrorString(got), last);
    if (got == want && strstr(last, text))
        return 0;
    fprintf(stderr, "%s: got %d (%s), want %d with \"%s\"\n", what, (int)got, last, (int)want, text);
    return 1;
}

/* ============================================================================================
 * NCCL 2.20-2.28 (the calls PyTorch 2.x links)
 * ========================================================================================== */

/* ncclCommInitRankScalable as NCCL's scalable bootstrap uses it: two unique ids, made by ranks 0
 * and 1 (its "roots"), the same two on every rank; colld joins with the first. */
static ncclComm_t join_scalable(void)
{
    ncclUniqueId ids[2];
    int nid = nranks >= 2 ? 2 : 1;
    char path[600];
    for (int k = 0; k < nid; k++) {
        snprintf(path, sizeof(path), "%s.scalable-%d", id_file, k);
        nccl_test_share_id(&ids[k], rank == k ? 0 : 1, path); /* as "rank 0" the maker, else a reader */
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm;
    CHECK(ncclCommInitRankScalable(&comm, nranks, rank, nid, ids, &cfg));
    check_shape("ncclCommInitRankScalable", comm, nranks, rank);
    return comm;
}

/* ncclGroupSimulateEnd: a group with an all-reduce and a ring of sends and receives ends with
 * ncclInvalidUsage (colld has no estimate) and runs none of them: every buffer keeps its value,
 * and the communicator is as it was: the same group, ended with ncclGroupEnd, then gives exact
 * results. An inner level of a nested group only closes that level. */
static int check_simulate(ncclComm_t comm)
{
    int bad = 0, next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    int32_t x[4], to[2] = { rank * 10, rank * 10 + 1 }, from[2] = { -1, -1 };
    for (int i = 0; i < 4; i++)
        x[i] = rank + i;
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    for (int real = 0; real < 2; real++) {
        CHECK(ncclGroupStart());
        CHECK(ncclAllReduce(x, x, 4, ncclInt32, ncclSum, comm, NULL));
        CHECK(ncclSend(to, 2, ncclInt32, next, comm, NULL));
        CHECK(ncclRecv(from, 2, ncclInt32, prev, comm, NULL));
        if (real) {
            CHECK(ncclGroupEnd());
            break;
        }
        bad += expect_error("ncclGroupSimulateEnd", ncclGroupSimulateEnd(&sim), ncclInvalidUsage,
                            "colld cannot estimate a group's time");
        checked += 7;
        for (int i = 0; i < 4; i++)
            bad += x[i] != rank + i;
        bad += from[0] != -1 || from[1] != -1 || sim.estimatedTime != NCCL_UNDEF_FLOAT;
        if (bad)
            fprintf(stderr, "rank %d: the simulated group ran, or wrote estimatedTime\n", rank);
    }
    for (int i = 0; i < 4; i++)
        bad += x[i] != nranks * (nranks - 1) / 2 + nranks * i;
    bad += from[0] != prev * 10 || from[1] != prev * 10 + 1;
    checked += 6;
    int32_t y = rank + 1; /* nested: the inner simulated end closes its level, the outer end runs it */
    CHECK(ncclGroupStart());
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(&y, &y, 1, ncclInt32, ncclSum, comm, NULL));
    CHECK(ncclGroupSimulateEnd(&sim));
    CHECK(ncclGroupEnd());
    checked++;
    bad += y != nranks * (nranks + 1) / 2;
    if (bad)
        fprintf(stderr, "rank %d: ncclGroupSimulateEnd: %d wrong (x %d %d %d %d, from %d %d, y %d)\n", rank, bad,
                (int)x[0], (int)x[1], (int)x[2], (int)x[3], (int)from[0], (int)from[1], (int)y);
    return bad;
}

/* ncclCommShrink, called by the ranks that stay only. First without rank 1, which stays idle (it
 * goes on to the parent's next all-reduce): the others form a communicator in parent order, and
 * the parent still works for everyone. Then (3 ranks or more) without the last rank, which has
 * destroyed its handle. Destroys comm. */
static void run_shrink(ncclComm_t comm)
{
    int excl = 1, all = nranks * (nranks - 1) / 2;
    if (rank != excl) {
        ncclComm_t sub = NULL;
        CHECK(ncclCommShrink(comm, &excl, 1, &sub, NULL, NCCL_SHRINK_DEFAULT));
        check_shape("ncclCommShrink without rank 1", sub, nranks - 1, rank - (rank > excl));
        check_sum("ncclCommShrink without rank 1", sub, rank, all - excl);
        CHECK(ncclCommDestroy(sub));
    }
    check_sum("the parent after ncclCommShrink", comm, rank, all);
    int last = nranks - 1;
    if (nranks < 3 || rank == last) {
        CHECK(ncclCommDestroy(comm));
        return;
    }
    ncclComm_t sub = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    CHECK(ncclCommShrink(comm, &last, 1, &sub, &cfg, NCCL_SHRINK_DEFAULT));
    check_shape("ncclCommShrink without the rank that left", sub, nranks - 1, rank);
    check_sum("ncclCommShrink without the rank that left", sub, rank, all - last);
    CHECK(ncclCommDestroy(sub));
    CHECK(ncclCommDestroy(comm));
}

static int mode_recent(void)
{
    ncclComm_t comm = join_scalable();
    check_sum("ncclCommInitRankScalable", comm, rank + 1, nranks * (nranks + 1) / 2);
    int bad = check_simulate(comm);
    run_shrink(comm);
    printf("rank %d: %ld checked, %ld wrong, %d wrong in ncclGroupSimulateEnd\n", rank, checked, wrong, bad);
    return wrong == 0 && bad == 0 ? 0 : 1;
}

/* What colld refuses of NCCL 2.20-2.28, and bad arguments to what it serves (one rank). */
static int check_recent_errors(ncclComm_t comm)
{
    int bad = 0, self = rank, beyond = nranks;
    ncclComm_t sub = NULL;
    bad += expect_error("shrink with NCCL_SHRINK_ABORT", ncclCommShrink(comm, NULL, 0, &sub, NULL, NCCL_SHRINK_ABORT),
                        ncclInvalidUsage, "NCCL_SHRINK_ABORT is not supported by colld");
    bad += expect_error("shrink with unknown flags", ncclCommShrink(comm, NULL, 0, &sub, NULL, 6), ncclInvalidArgument,
                        "unknown shrinkFlags 0x6");
    bad += expect_error("shrink excluding this rank", ncclCommShrink(comm, &self, 1, &sub, NULL, 0),
                        ncclInvalidArgument, "(this rank) is in excludeRanksList");
    bad += expect_error("shrink excluding a rank out of range", ncclCommShrink(comm, &beyond, 1, &sub, NULL, 0),
                        ncclInvalidArgument, "is out of range");
    bad += expect_error("shrink with a negative count", ncclCommShrink(comm, NULL, -1, &sub, NULL, 0),
                        ncclInvalidArgument, "excludeRanksCount is -1");
    CHECK(ncclGroupStart());
    bad += expect_error("shrink in a group", ncclCommShrink(comm, NULL, 0, &sub, NULL, 0), ncclInvalidUsage,
                        "ncclCommShrink inside ncclGroupStart/End");
    ncclGroupEnd();
    CHECK(ncclCommShrink(comm, NULL, 0, &sub, NULL, NCCL_SHRINK_DEFAULT)); /* nobody excluded: a copy */
    check_shape("ncclCommShrink excluding nobody", sub, nranks, rank);
    check_sum("ncclCommShrink excluding nobody", sub, 5, 5 * nranks);
    CHECK(ncclCommDestroy(sub));

    float buf[1024];
    ncclWindow_t win = (ncclWindow_t)(void *)buf;
    bad += expect_error("window register",
                        ncclCommWindowRegister(comm, buf, sizeof(buf), &win, NCCL_WIN_COLL_SYMMETRIC), ncclInvalidUsage,
                        "memory windows (symmetric memory) are not supported by colld");
    bad += win != NULL;
    CHECK(ncclCommWindowDeregister(comm, NULL));
    bad += expect_error("window deregister", ncclCommWindowDeregister(comm, (ncclWindow_t)(void *)buf),
                        ncclInvalidArgument, "is not a window of this communicator: colld makes none");
    char devcomm[512]; /* NVIDIA's ncclDevComm_t is a struct its caller owns */
    bad += expect_error("device communicator", ncclDevCommCreate(comm, NULL, (ncclDevComm_t *)(void *)devcomm),
                        ncclInvalidUsage, "device communicators (NCCL's device API");
    bad += expect_error("device communicator destroy",
                        ncclDevCommDestroy(comm, (const ncclDevComm_t *)(const void *)devcomm), ncclInvalidArgument,
                        "not a device communicator of colld's");
    bad += expect_error("device communicator without a communicator", ncclDevCommCreate(NULL, NULL, NULL),
                        ncclInvalidArgument, "ncclDevCommCreate: comm is NULL");

    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    bad += expect_error("simulate without a group", ncclGroupSimulateEnd(&sim), ncclInvalidUsage,
                        "ncclGroupSimulateEnd without ncclGroupStart");
    bad += expect_error("simulate with simInfo NULL", ncclGroupSimulateEnd(NULL), ncclInvalidArgument,
                        "NCCL_SIM_INFO_INITIALIZER");

    ncclUniqueId ids[2];
    CHECK(ncclGetUniqueId(&ids[0]));
    ids[1] = ids[0];
    bad += expect_error("scalable init with nId 0", ncclCommInitRankScalable(&sub, 1, 0, 0, ids, NULL),
                        ncclInvalidArgument, "nId must be at least 1 and at most nranks");
    bad += expect_error("scalable init with more ids than ranks", ncclCommInitRankScalable(&sub, 1, 0, 2, ids, NULL),
                        ncclInvalidArgument, "nId must be at least 1 and at most nranks");
    bad += expect_error("scalable init with commIds NULL", ncclCommInitRankScalable(&sub, 1, 0, 1, NULL, NULL),
                        ncclInvalidArgument, "commIds is NULL");
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    bad += expect_error("scalable init non-blocking", ncclCommInitRankScalable(&sub, 1, 0, 1, ids, &cfg),
                        ncclInvalidUsage, "ncclCommInitRankScalable: non-blocking communicators");
    bad += expect_error("scalable init rank out of range", ncclCommInitRankScalable(&sub, 1, 1, 1, ids, NULL),
                        ncclInvalidArgument, "ncclCommInitRankScalable: rank 1 of 1 ranks is out of range");
    CHECK(ncclCommInitRankScalable(&sub, 1, 0, 1, ids, NULL)); /* one id, one rank */
    check_sum("ncclCommInitRankScalable of one rank", sub, 7, 7);
    CHECK(ncclCommDestroy(sub));

    int32_t x[8] = { 0 };
    bad += expect_error("alltoall of an unknown type", ncclAlltoAll(x, x + 4, 1, (ncclDataType_t)77, comm, NULL),
                        ncclInvalidArgument, "ncclAlltoAll: unknown data type 77");
    bad += expect_error("alltoall in place", ncclAlltoAll(x, x, 1, ncclInt32, comm, NULL), ncclInvalidArgument,
                        "all-to-all has no in-place form");
    return bad;
}

/* ncclCommRegister on host memory (not from ncclMemAlloc): colld cannot register it, and the call
 * succeeds as a hint that does nothing; bad arguments are refused. */
static int check_register(ncclComm_t comm)
{
    int bad = 0;
    float host[64];
    void *handle = NULL;
    CHECK(ncclCommRegister(comm, host, sizeof(host), &handle));
    CHECK(ncclCommDeregister(comm, handle));
    bad += expect_error("register without a communicator", ncclCommRegister(NULL, host, sizeof(host), &handle),
                        ncclInvalidArgument, "comm is NULL");
    bad += expect_error("register without a handle", ncclCommRegister(comm, host, sizeof(host), NULL),
                        ncclInvalidArgument, "buff or handle is NULL");
    bad += expect_error("deregister NULL", ncclCommDeregister(comm, NULL), ncclInvalidArgument, "handle is NULL");
    bad += expect_error("deregister a non-handle", ncclCommDeregister(comm, host), ncclInvalidArgument,
                        "is not a registration of this communicator");
    return bad;
}

static int mode_errors(void)
{
    int bad = 0, version = 0;
    CHECK(ncclGetVersion(&version));
    if (version != NCCL_VERSION_CODE) {
        fprintf(stderr, "ncclGetVersion: %d, the header says %d\n", version, NCCL_VERSION_CODE);
        bad++;
    }
    ncclComm_t comm = join();
    float x[4] = { 1, 2, 3, 4 };
    bad += expect_error("unknown data type", ncclAllReduce(x, x, 4, (ncclDataType_t)77, ncclSum, comm, NULL),
                        ncclInvalidArgument, "unknown data type 77");
    bad += expect_error("unknown operator", ncclAllReduce(x, x, 4, ncclFloat32, (ncclRedOp_t)9, comm, NULL),
                        ncclInvalidArgument, "unknown reduction op 9");
    bad += expect_error("broadcast root out of range", ncclBcast(x, 4, ncclFloat32, 5, comm, NULL), ncclInvalidArgument,
                        "root");
    bad += expect_error("NULL communicator", ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, NULL, NULL),
                        ncclInvalidArgument, "comm is NULL");
    bad += expect_error("send to a rank out of range", ncclSend(x, 4, ncclFloat32, nranks, comm, NULL),
                        ncclInvalidArgument, "colld_send: peer");
    bad += expect_error("recv of an unknown type", ncclRecv(x, 4, (ncclDataType_t)77, 0, comm, NULL),
                        ncclInvalidArgument, "ncclRecv: unknown data type 77");
    ncclComm_t sub = NULL;
    CHECK(ncclGroupStart());
    bad += expect_error("split in a group", ncclCommSplit(comm, 0, 0, &sub, NULL), ncclInvalidUsage,
                        "ncclCommSplit inside ncclGroupStart/End");
    ncclGroupEnd();
    ncclRedOp_t pm;
    float scalar = 0.5f;
    bad += expect_error("premulsum with a device scalar",
                        ncclRedOpCreatePreMulSum(&pm, &scalar, ncclFloat32, ncclScalarDevice, comm), ncclInvalidUsage,
                        "ncclScalarDevice) is not supported");
    bad += expect_error("premulsum with scalar NULL",
                        ncclRedOpCreatePreMulSum(&pm, NULL, ncclFloat32, ncclScalarHostImmediate, comm),
                        ncclInvalidArgument, "scalar is NULL");
    bad += expect_error("premulsum of an unknown type",
                        ncclRedOpCreatePreMulSum(&pm, &scalar, (ncclDataType_t)77, ncclScalarHostImmediate, comm),
                        ncclInvalidArgument, "unknown data type");
    bad += expect_error("premulsum with residence 5",
                        ncclRedOpCreatePreMulSum(&pm, &scalar, ncclFloat32, (ncclScalarResidence_t)5, comm),
                        ncclInvalidArgument, "unknown scalar residence 5");
    bad += expect_error("premulsum without a communicator",
                        ncclRedOpCreatePreMulSum(&pm, &scalar, ncclFloat32, ncclScalarHostImmediate, NULL),
                        ncclInvalidArgument, "comm is NULL");
    bad += expect_error("destroying a built-in operator", ncclRedOpDestroy(ncclMax, comm), ncclInvalidArgument,
                        "built-in operator");
    CHECK(ncclRedOpCreatePreMulSum(&pm, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
    bad += expect_error("a float32 premulsum on int32", ncclAllReduce(x, x, 4, ncclInt32, pm, comm, NULL),
                        ncclInvalidArgument, "premultiplied sum of float32, but the collective's dtype is int32");
    CHECK(ncclRedOpDestroy(pm, comm));
    bad += expect_error("a destroyed premulsum", ncclAllReduce(x, x, 4, ncclFloat32, pm, comm, NULL),
                        ncclInvalidArgument, "destroyed");
    bad += expect_error("destroying it twice", ncclRedOpDestroy(pm, comm), ncclInvalidArgument, "destroyed");
    /* scalar 0.5 (each rank alone: x / 2 on one rank), then x back */
    CHECK(ncclRedOpCreatePreMulSum(&pm, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
    scalar = 4.0f; /* read at creation: no effect on the operator */
    CHECK(ncclAllReduce(x, x, 4, ncclFloat32, pm, comm, NULL));
    CHECK(ncclRedOpDestroy(pm, comm));
    for (int i = 0; i < 4; i++)
        if (x[i] != 0.5f * (float)(i + 1) * (float)nranks) {
            fprintf(stderr, "premulsum all-reduce: x[%d] = %g\n", i, (double)x[i]);
            bad++;
        }
    for (int i = 0; i < 4; i++)
        x[i] = (float)(i + 1);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id));
    bad += expect_error("non-blocking", ncclCommInitRankConfig(&sub, 1, id, 0, &cfg), ncclInvalidUsage,
                        "non-blocking communicators");
    bad += expect_error("group end alone", ncclGroupEnd(), ncclInvalidUsage, "without ncclGroupStart");
    bad += check_register(comm);
    bad += check_recent_errors(comm);
    /* still usable */
    CHECK(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, NULL));
    for (int i = 0; i < 4; i++)
        if (x[i] != (float)((i + 1) * nranks)) {
            fprintf(stderr, "all-reduce after the errors: x[%d] = %g\n", i, (double)x[i]);
            bad++;
        }
    CHECK(ncclCommDestroy(comm));
    return bad ? 1 : 0;
}

static int mode_victim(void)
{
    ncclComm_t comm = join();
    float x[1024];
    fill(ncclFloat32, ncclSum, x, 1024, rank, 1);
    CHECK(ncclAllReduce(x, x, 1024, ncclFloat32, ncclSum, comm, NULL)); /* everyone is in */
    char mark[600];
    if (rank != victim) { /* the victim leaves only once every other rank has seen this one end */
        snprintf(mark, sizeof(mark), "%s.done-%d", id_file, rank);
        FILE *f = fopen(mark, "w");
        if (!f || fclose(f) != 0)
            return 1;
    }
    if (rank == victim) {
        for (int r = 0; r < nranks; r++) {
            snprintf(mark, sizeof(mark), "%s.done-%d", id_file, r);
            for (int i = 0; r != victim && access(mark, F_OK) != 0; i++) {
                if (i == 6000) {
                    fprintf(stderr, "rank %d: no %s within 60 s\n", rank, mark);
                    return 1;
                }
                nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
            }
        }
        printf("rank %d (pid %d): exiting without a word\n", rank, (int)getpid());
        fflush(stdout);
        _exit(0);
    }
    ncclResult_t r = ncclAllReduce(x, x, 1024, ncclFloat32, ncclSum, comm, NULL);
    char want[64];
    snprintf(want, sizeof(want), "rank %d (pid", victim);
    int bad = expect_error("all-reduce with a rank gone", r, ncclRemoteError, want);
    ncclResult_t async = ncclSuccess;
    CHECK(ncclCommGetAsyncError(comm, &async));
    if (async != ncclRemoteError) {
        fprintf(stderr, "ncclCommGetAsyncError: %d, want ncclRemoteError\n", (int)async);
        bad++;
    }
    ncclComm_t sub = NULL; /* a broken communicator cannot be shrunk: its sends no longer run */
    bad += expect_error("ncclCommShrink without the rank that died", ncclCommShrink(comm, &victim, 1, &sub, NULL, 0),
                        ncclRemoteError, "after a rank died or an abort make a new communicator");
    bad += sub != NULL;
    CHECK(ncclCommAbort(comm));
    return bad;
}

/* A refusal here, then a failure the daemon reports: the texts follow the calls (mode stale). */
static int mode_stale(void)
{
    ncclComm_t comm = join();
    static float x[1024];
    int bad = 0;
    if (rank == 1) {
        ncclResult_t r = ncclBroadcast(x, x, 1024, ncclFloat32, 0, comm, NULL);
        bad += expect_error("broadcast against an all-reduce", r, ncclRemoteError, "COLLD_ERR_MISMATCH");
        CHECK(ncclCommAbort(comm));
        return bad;
    }
    bad += expect_error("send to peer 5 of 2", ncclSend(x, 1, ncclFloat32, 5, comm, NULL), ncclInvalidArgument,
                        "peer 5 is out of range");
    ncclResult_t r = ncclAllReduce(x, x, 1024, ncclFloat32, ncclSum, comm, NULL);
    bad += expect_error("all-reduce against a broadcast", r, ncclRemoteError, "COLLD_ERR_MISMATCH");
    if (strstr(ncclGetLastError(NULL), "out of range")) {
        fprintf(stderr, "the all-reduce's text is the send's: %s\n", ncclGetLastError(NULL));
        bad++;
    }
    ncclResult_t async = ncclSuccess;
    CHECK(ncclCommGetAsyncError(comm, &async));
    bad += expect_error("ncclCommGetAsyncError", async, ncclRemoteError, "broadcast(float32");
    CHECK(ncclCommAbort(comm));
    return bad;
}

/* The ncclAllReduce this program calls must be colld's. */
static void check_library(void)
{
    Dl_info info;
    if (!dladdr((void *)ncclAllReduce, &info) || !info.dli_fname) {
        fprintf(stderr, "cannot tell which library ncclAllReduce is in\n");
        exit(3);
    }
    const char *impl = dlsym(RTLD_DEFAULT, "colld_nccl_implementation");
    printf("libnccl: %s (%s)\n", info.dli_fname, impl ? impl : "not colld's");
    fflush(stdout);
    if (!impl) {
        fprintf(stderr, "the NCCL loaded (%s) is not colld's: set LD_LIBRARY_PATH to colld's lib/colld\n",
                info.dli_fname);
        exit(3);
    }
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--nranks") == 0)
            nranks = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--rank") == 0)
            rank = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--id-file") == 0)
            id_file = argv[i + 1];
        else if (strcmp(argv[i], "--mode") == 0)
            mode = argv[i + 1];
        else if (strcmp(argv[i], "--victim") == 0)
            victim = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (nranks < 1 || nranks > MAXN || rank < 0 || rank >= nranks || (!id_file && strcmp(mode, "initall") != 0)) {
        fprintf(stderr,
                "usage: %s --nranks N (1..%d) --rank R --id-file PATH [--mode matrix|initall|errors|victim|stale|recent "
                "--victim R]\n",
                argv[0], MAXN);
        return 2;
    }
    check_library();
    if (strcmp(mode, "matrix") == 0)
        return mode_matrix();
    if (strcmp(mode, "initall") == 0)
        return mode_initall();
    if (strcmp(mode, "errors") == 0)
        return mode_errors();
    if (strcmp(mode, "victim") == 0)
        return mode_victim();
    if (strcmp(mode, "stale") == 0)
        return mode_stale();
    if (strcmp(mode, "recent") == 0)
        return mode_recent();
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
