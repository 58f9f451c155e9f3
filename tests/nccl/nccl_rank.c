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
 *            all-reduce must fail with ncclRemoteError and ncclGetLastError naming the victim.
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

/* The value rank `from` sends rank `to` at element i (small integers, exact in every type). */
static double want_sent(size_t i, void *ctx)
{
    const want_t *w = ctx;
    return input(ncclSum, w->root * 16 + rank, i, w->salt);
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
                "usage: %s --nranks N (1..%d) --rank R --id-file PATH [--mode matrix|initall|errors|victim "
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
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
