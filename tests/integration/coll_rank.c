/*
 * coll_rank.c - colld-test-coll: one rank process of the collective integration tests.
 *
 * It connects to the daemon, joins a communicator at a rank and runs collectives on inputs from a
 * deterministic generator of (rank, index, dtype, salt), so every rank can compute every rank's
 * input. Expected results come from the scalar oracle (colld_cpu_reduce_scalar: rank order
 * 0..n-1), and every result is compared BITWISE (memcmp). Around every buffer GUARD bytes must stay
 * untouched; out of place the send buffer must be unchanged; buffers a rank does not use (a
 * non-root's reduce receive buffer) must be unchanged.
 *
 * Modes (--mode):
 *   matrix   (default) collective x dtype x op (reducing kinds only; premul_sum: each rank makes
 *            an operator with its own scalar, coll_data.h) x count {0, 1, 1001, big}
 *            x {out-of-place, in-place}. "big" is BIG_BYTES per buffer (count = BIG_BYTES/size + 3)
 *            and, unless --big-all, runs only the subset coll_big_selected() names (coll_data.h;
 *            --big-min: float32 only, every kind once). Select with --kinds, --dtypes, --ops
 *            (comma lists or "all"), --no-big, --only
 *            inplace|outofplace, --rotate K (start at the K-th kind), --salt S, --iters N.
 *            --malloc (any mode but badargs): ordinary memory, which libcolld stages, instead of
 *            colld_mem_alloc. --exact-values: inputs whose reductions are exact in any order
 *            (multi-node runs combine per node first).
 *   small    --iters N small all-reduces in a row (dtype, op, count and in-place vary), each checked;
 *            rank 0 pauses at --checkpoints K1,K2,... (after K collectives): it creates
 *            <--sync-dir>/at-K and waits (at most 120 s) for <--sync-dir>/go-K.
 *   group    --group-size N mixed collectives inside colld_group_start/end, then all checked.
 *   group-invalid  a group of valid calls and one invalid call: the invalid call and group_end
 *            return COLLD_ERR_INVALID_ARGUMENT, nothing is posted, and the communicator stays
 *            usable (a valid group afterwards is exact).
 *   badargs  client-side argument errors of the new collectives that depend on nranks and root;
 *            then a real allgather and broadcast prove the communicator still works.
 *   premul-bad  premultiplied-sum operators used wrongly (mode_premul_bad), then exact premultiplied
 *            sums.
 *   call     one collective --call KIND:DTYPE:OP:COUNT:ROOT; with --expect NAME the synchronize
 *            status must be NAME and the error detail is printed on stdout (--out FILE).
 *   chain    --iters rounds of reduce-scatter (x -> y) then all-gather (y -> x), float32 sum,
 *            --chain-count K elements per rank, posted back to back with one synchronize at the
 *            end: each call reads what the one before wrote. With the default fast-path size and
 *            2 ranks, K = 3000 sends the reduce-scatter (24000 B per rank) through the engine and
 *            the all-gather (12000 B) through the fast area, so the ordering between the two paths
 *            is checked. Rank 0 then stops at checkpoint --iters if asked.
 *   barrier  three colld_barrier rounds; in round i rank (i % n) arrives 200 ms late. Before each
 *            barrier a rank creates <--sync-dir>/arrived-I-R; after it, every rank's file of that
 *            round must exist (no rank left a barrier before the last one entered it).
 *   ops      per-operation completion: four float32 all-reduces in flight at once (engine and fast
 *            path sizes alternating, ordinary memory), each one's id from colld_comm_last_op
 *            (consecutive); colld_op_wait on the second, its result exact; colld_op_wait on the
 *            last, every result exact; an id never issued is COLLD_ERR_INVALID_ARGUMENT. Then the
 *            last rank aborts the communicator: the others' next all-reduce fails with
 *            COLLD_ERR_ABORTED through colld_op_wait, and the ids that completed stay COLLD_OK.
 *   nan      --nan-check: a float32 all-reduce (--call's COUNT, default 1000; in place) whose inputs
 *            are finite but for --poison R:I:nan|inf|-inf,... (element I of rank R's input); with
 *            --expect NAME the status must be NAME and the detail goes to stdout, else it must
 *            succeed. Then an int32 all-reduce (never checked) shows the communicator's state.
 *            --comm-nan-check (any mode): the communicator's config asks for the checks
 *            (colld_comm_config_t.nan_check) where the daemon has no --nan-check.
 *            --comm-verify (any mode): the communicator's config asks for result verification
 *            (colld_comm_config_t.verify_results) where the daemon has no --verify-results; with
 *            the daemon's test hook --test-corrupt-result, mode call with --expect
 *            COLLD_ERR_CORRUPTED prints the verdict.
 *   crossed  2 ranks, a second communicator (--uid2): rank 0 all-reduces on the first and waits,
 *            rank 1 on the second and waits, so each waits for the other (a cross-communicator
 *            deadlock); the status must be --expect's, whose detail goes to stdout. Each rank then
 *            waits (--sync-dir, files crossed-done-R) until the other has its status too before it
 *            destroys its handles: else the first to time out would leave while the other still
 *            waits, and the other would get PEER_LOST (the one that left), not its own time-out.
 *   split    colld_comm_split: color rank % 2 (with 3 ranks or more the last rank passes
 *            COLLD_SPLIT_NOCOLOR and must get NULL), key nranks - rank (so each group is in reverse
 *            order); each rank checks its new rank and size, runs the matrix (as selected) on its
 *            group's communicator, then an exact all-reduce on the parent; then a split with one
 *            color for everyone (same order) and an all-reduce on it.
 *
 * Exit code: 0 everything matched (or the expected status came); 1 a mismatch or an unexpected
 * status (the first mismatches are printed on stderr with full context); 2 bad arguments.
 */
#include "tools/testdata/pattern.h"
#include "tests/integration/coll_data.h"
#include "tests/integration/harness.h"

#include <colld/colld.h>
#include <stdbool.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GROUP_MAX_COUNT 300 /* largest count of a collective inside a group */

/* The input generator: colld_cpu_pattern, or with --exact-values colld_cpu_pattern_small (for
 * multi-node runs, whose reduction order differs from rank order). */
static coll_pattern_fn pattern = colld_cpu_pattern;

typedef struct {
    const char *socket, *uid_hex, *mode, *expect, *sync_dir, *call, *checkpoints, *poison, *uid2_hex;
    int nranks, rank, timeout_ms, iters, rotate, group_size, max_report;
    unsigned long long chain_count;
    int salt;
    unsigned kinds, dtypes, ops; /* bit masks */
    bool inplace, outofplace, big, big_all, big_min;
    bool use_malloc;     /* ordinary memory (staged by libcolld) instead of colld_mem_alloc */
    bool comm_nan_check; /* --comm-nan-check: the communicator's config asks for --nan-check */
    bool comm_verify;    /* --comm-verify: the communicator's config asks for --verify-results */
} args_t;

typedef struct {
    const args_t *a;
    colld_client_t *c;
    colld_comm_t *comm;
    int n, rank;
    unsigned char *sreg, *rreg; /* registered buffers from colld_mem_alloc */
    size_t reg_bytes;
    long cases, collectives, bad;
    int reported;
} run_t;

/* ---------------------------------------------------------------------------------------------
 * Reporting
 * ------------------------------------------------------------------------------------------- */

/* Describe a call in one line. */
static void describe(const void *ctx, const call_t *k, char *buf, size_t len)
{
    const run_t *R = ctx;
    snprintf(buf, len, "rank %d/%d: %s dtype %s op %s count %zu root %d %s%s salt %u", R->rank, R->n,
             kind_names[k->kind], dtype_names[k->dt], coll_reduces(k->kind) ? op_names[k->op] : "-", k->count, k->root,
             k->inplace ? "in-place" : "out-of-place", k->null_unused ? " (unused buffer NULL)" : "", k->salt);
}

/* The run's reporting for coll_check_call and coll_report. */
static coll_check_t checker(run_t *R)
{
    return (coll_check_t){ .n = R->n,
                           .rank = R->rank,
                           .reported = &R->reported,
                           .max_report = R->a->max_report,
                           .where = "",
                           .describe = describe,
                           .ctx = R };
}

/* ---------------------------------------------------------------------------------------------
 * One call: prepare the buffers, post, check
 * ------------------------------------------------------------------------------------------- */

/* Post a call with the op `op` (not waiting). */
static colld_status_t post_with(run_t *R, const call_t *k, colld_redop_t op)
{
    switch (k->kind) {
    case K_ALLREDUCE:
        return colld_allreduce(k->sendp, k->recvp, k->count, k->dt, op, R->comm, NULL);
    case K_BROADCAST:
        return colld_broadcast(k->sendp, k->recvp, k->count, k->dt, k->root, R->comm, NULL);
    case K_REDUCE:
        return colld_reduce(k->sendp, k->recvp, k->count, k->dt, op, k->root, R->comm, NULL);
    case K_ALLGATHER:
        return colld_allgather(k->sendp, k->recvp, k->count, k->dt, R->comm, NULL);
    case K_REDUCESCATTER:
        return colld_reducescatter(k->sendp, k->recvp, k->count, k->dt, op, R->comm, NULL);
    case K_GATHER:
        return colld_gather(k->sendp, k->recvp, k->count, k->dt, k->root, R->comm, NULL);
    case K_SCATTER:
        return colld_scatter(k->sendp, k->recvp, k->count, k->dt, k->root, R->comm, NULL);
    default:
        return colld_alltoall(k->sendp, k->recvp, k->count, k->dt, R->comm, NULL);
    }
}

/* Post a call (not waiting). A premultiplied sum gets an operator made with this rank's own
 * scalar just before, and destroyed as soon as the call returned (the call took the scalar; also
 * inside a group, before colld_group_end). */
static colld_status_t post_call(run_t *R, const call_t *k)
{
    colld_redop_t op;
    colld_status_t st = coll_op_make(k, R->rank, R->comm, &op);
    if (st != COLLD_OK)
        return st;
    return coll_op_release(k, R->comm, op, post_with(R, k, op));
}

/* Check a completed call (coll_check_call). Returns 0 when everything is exact, else 1. */
static int check_call(run_t *R, const call_t *k)
{
    coll_check_t c = checker(R);
    return coll_check_call(&c, k);
}

/* Report an unexpected status of a call (fatal: the communicator may be broken). */
static int status_fail(run_t *R, const call_t *k, const char *what, colld_status_t st)
{
    char d[256] = "";
    if (k)
        describe(R, k, d, sizeof(d));
    fprintf(stderr, "FAILED %s: %s returned %s: %s\n", d, what, colld_status_name(st), colld_comm_last_error(R->comm));
    return -1;
}

/* Run one call by itself in the slots at the start of the registered buffers. Returns 0 exact,
 * 1 mismatch, -1 fatal (out of memory or an unexpected status). */
static int run_call(run_t *R, call_t *k)
{
    k->sreg = R->sreg;
    k->rreg = R->rreg;
    if (coll_prepare_data(k, R->n, R->rank, pattern) < 0) {
        fprintf(stderr, "rank %d: out of memory or oracle refused\n", R->rank);
        coll_free_data(k);
        return -1;
    }
    coll_prepare_buffers(k, R->n, R->rank);
    colld_status_t st = post_call(R, k);
    if (st == COLLD_OK)
        st = colld_comm_synchronize(R->comm);
    int rc = st == COLLD_OK ? check_call(R, k) : status_fail(R, k, "post or synchronize", st);
    coll_free_data(k);
    R->collectives++;
    if (rc > 0)
        R->bad++;
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

/* The whole matrix once. Returns 0 when everything matched. */
static int mode_matrix(run_t *R, int iter)
{
    const args_t *a = R->a;
    coll_matrix_t m = { .kinds = a->kinds,
                        .dtypes = a->dtypes,
                        .ops = a->ops,
                        .rotate = a->rotate,
                        .inplace = a->inplace,
                        .outofplace = a->outofplace,
                        .big = a->big,
                        .big_all = a->big_all,
                        .big_min = a->big_min,
                        .salt = a->salt,
                        .n = R->n,
                        .small = pattern == colld_cpu_pattern_small };
    if (coll_run_matrix(&m, iter, &R->cases, matrix_call, R) != 0)
        return 1;
    return R->bad ? 1 : 0;
}

/* Rank 0 at a checkpoint: announce it and wait (at most 120 s) for the driver's go. */
static int checkpoint(run_t *R, int done)
{
    const args_t *a = R->a;
    if (R->rank != 0 || !a->sync_dir || !a->checkpoints)
        return 0;
    char mark[32];
    snprintf(mark, sizeof(mark), ",%d,", done);
    char list[256];
    snprintf(list, sizeof(list), ",%s,", a->checkpoints);
    if (!strstr(list, mark))
        return 0;
    char at[512], go[512];
    snprintf(at, sizeof(at), "%s/at-%d", a->sync_dir, done);
    snprintf(go, sizeof(go), "%s/go-%d", a->sync_dir, done);
    FILE *f = fopen(at, "w");
    if (f)
        fclose(f);
    if (harness_wait_file(go, 120000) < 0) {
        fprintf(stderr, "rank 0: no %s within 120 s\n", go);
        return -1;
    }
    return 0;
}

/* --iters small all-reduces in a row; dtype, op, count (1..64) and in-place vary. */
static int mode_small(run_t *R)
{
    const args_t *a = R->a;
    for (int it = 0; it < a->iters; it++) {
        call_t k = { .kind = K_ALLREDUCE,
                     .dt = (colld_dtype_t)(it % COLLD_DTYPE_COUNT),
                     .op = (colld_redop_t)((it / COLLD_DTYPE_COUNT) % COLL_OPS),
                     .count = 1 + (size_t)(it * 13) % 64,
                     .inplace = (it / 50) % 2 == 1,
                     .salt = a->salt + (unsigned)it,
                     .small = pattern == colld_cpu_pattern_small };
        if (run_call(R, &k) < 0 || checkpoint(R, it + 1) < 0)
            return 1;
    }
    return R->bad ? 1 : 0;
}

/* The j-th collective of a mixed group: every kind, dtype, op, root and both modes appear; one of
 * them has count 0. */
static call_t group_call(const run_t *R, int j, unsigned salt)
{
    call_t k = { .kind = j % K_COUNT,
                 .dt = (colld_dtype_t)((j * 3) % COLLD_DTYPE_COUNT),
                 .op = (colld_redop_t)((j / K_COUNT) % COLL_OPS),
                 .count = j == 7 ? 0 : 1 + (size_t)(j * 37) % GROUP_MAX_COUNT,
                 .root = j % R->n,
                 .inplace = (j / 2) % 2 == 1 && j % K_COUNT != K_ALLTOALL, /* no in-place all-to-all */
                 .null_unused = j % 3 == 0,
                 .salt = salt + (unsigned)j,
                 .small = pattern == colld_cpu_pattern_small };
    return k;
}

/* Bytes of one group slot: the largest buffer of a group call with its guards, 64-aligned. */
static size_t group_slot_bytes(const run_t *R)
{
    return ((size_t)R->n * GROUP_MAX_COUNT * 8 + 2 * GUARD + 63) & ~(size_t)63;
}

/* Post `size` mixed collectives in one group and check them all. With `bad_at` >= 0 the
 * collective at that index is replaced by an invalid broadcast (root out of range): it and
 * group_end must return COLLD_ERR_INVALID_ARGUMENT and none of the group may run. Returns 0 when
 * everything happened exactly so. */
static int run_group(run_t *R, int size, unsigned salt, int bad_at)
{
    size_t slot = group_slot_bytes(R);
    call_t *k = calloc((size_t)size, sizeof(*k));
    int rc = 0;
    colld_status_t st;
    if (!k)
        return 1;
    for (int j = 0; j < size; j++) {
        k[j] = group_call(R, j, salt);
        if (bad_at >= 0) /* valid calls that would write: out of place, every buffer given */
            k[j].inplace = false, k[j].null_unused = false;
        k[j].sreg = R->sreg + (size_t)j * slot;
        k[j].rreg = R->rreg + (size_t)j * slot;
        if (coll_prepare_data(&k[j], R->n, R->rank, pattern) < 0) {
            rc = 1;
            goto out;
        }
        coll_prepare_buffers(&k[j], R->n, R->rank);
    }
    if ((st = colld_group_start()) != COLLD_OK) {
        rc = status_fail(R, NULL, "colld_group_start", st) ? 1 : 0;
        goto out;
    }
    for (int j = 0; j < size; j++) {
        if (j == bad_at) {
            st = colld_broadcast(k[j].sendp, k[j].recvp, 4, COLLD_FLOAT32, R->n, R->comm, NULL);
            if (st != COLLD_ERR_INVALID_ARGUMENT) {
                status_fail(R, &k[j], "invalid broadcast inside a group (want COLLD_ERR_INVALID_ARGUMENT)", st);
                rc = 1;
            }
            continue;
        }
        if ((st = post_call(R, &k[j])) != COLLD_OK) {
            status_fail(R, &k[j], "post inside a group", st);
            rc = 1;
        }
    }
    st = colld_group_end();
    colld_status_t want = bad_at >= 0 ? COLLD_ERR_INVALID_ARGUMENT : COLLD_OK;
    if (st != want) {
        fprintf(stderr, "rank %d: colld_group_end returned %s, expected %s (%s)\n", R->rank, colld_status_name(st),
                colld_status_name(want), colld_comm_last_error(R->comm));
        rc = 1;
        if (bad_at < 0)
            goto out;
    }
    if ((st = colld_comm_synchronize(R->comm)) != COLLD_OK) {
        rc = status_fail(R, NULL, "colld_comm_synchronize after the group", st) ? 1 : 0;
        goto out;
    }
    if (bad_at >= 0 && (st = colld_comm_query(R->comm)) != COLLD_OK) {
        rc = status_fail(R, NULL, "colld_comm_query after the failed group (want COLLD_OK)", st) ? 1 : 0;
        goto out;
    }
    for (int j = 0; j < size; j++) {
        if (bad_at < 0) {
            R->collectives++;
            rc |= check_call(R, &k[j]);
            continue;
        }
        /* nothing posted: every receive buffer still holds the sentinel */
        size_t se, re;
        coll_call_sizes(&k[j], R->n, &se, &re);
        if (!coll_untouched(k[j].rreg, re * colld_dtype_size(k[j].dt) + 2 * GUARD)) {
            coll_check_t c = checker(R);
            coll_report(&c, &k[j], "group_end failed, but this collective of the group wrote its receive buffer");
            rc = 1;
        }
    }
out:
    for (int j = 0; j < size; j++)
        coll_free_data(&k[j]);
    free(k);
    return rc;
}

/* A valid group of --group-size collectives (--iters times), every result exact. */
static int mode_group(run_t *R)
{
    for (int it = 0; it < R->a->iters; it++)
        if (run_group(R, R->a->group_size, R->a->salt + (unsigned)it * 1000u, -1) != 0)
            return 1;
    return 0;
}

/* A group with one invalid call posts nothing; then the communicator still works. */
static int mode_group_invalid(run_t *R)
{
    int size = R->a->group_size < 6 ? 6 : R->a->group_size;
    if (run_group(R, size, R->a->salt, size / 2) != 0)
        return 1;
    call_t k = { .kind = K_ALLREDUCE, .dt = COLLD_FLOAT32, .op = COLLD_SUM, .count = 1001, .salt = R->a->salt + 77 };
    if (run_call(R, &k) != 0)
        return 1;
    return run_group(R, 16, R->a->salt + 5000, -1);
}

/* Expect a call to fail with `want`, the detail containing `needle` (NULL: any). Returns 0/1. */
static int expect_fail(run_t *R, const char *what, colld_status_t got, colld_status_t want, const char *needle)
{
    const char *detail = colld_comm_last_error(R->comm);
    if (got == want && (!needle || strstr(detail, needle)))
        return 0;
    fprintf(stderr, "rank %d: %s: got %s (%s), expected %s%s%s\n", R->rank, what, colld_status_name(got), detail,
            colld_status_name(want), needle ? " mentioning " : "", needle ? needle : "");
    return 1;
}

/* Client-side argument errors of the new collectives that need a real multi-rank communicator
 * (sizes that scale with nranks, the root's buffers). None of them is posted, so each rank may
 * make its own; afterwards the communicator must still work and stay in step. */
static int mode_badargs(run_t *R)
{
    int n = R->n, rank = R->rank, bad = 0, root = n - 1;
    float *f = (float *)R->sreg, *g = (float *)R->rreg; /* whole registrations */
    size_t cap = R->reg_bytes / sizeof(float);          /* floats in each */
    size_t over = cap / (size_t)n + 1;                  /* n * over > cap >= over (n > 1) */
    int dummy = 0;

    /* All-gather receives and reduce-scatter sends nranks x count. */
    bad += expect_fail(R, "allgather, recv holds count but not nranks*count",
                       colld_allgather(f, g, over, COLLD_FLOAT32, R->comm, NULL), COLLD_ERR_INVALID_ARGUMENT,
                       "past the end");
    bad += expect_fail(R, "reducescatter, send holds count but not nranks*count",
                       colld_reducescatter(f, g, over, COLLD_FLOAT32, COLLD_SUM, R->comm, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, "past the end");
    bad += expect_fail(R, "allgather, nranks*sendcount overflows",
                       colld_allgather(f, g, SIZE_MAX / 2 + 1, COLLD_INT8, R->comm, NULL), COLLD_ERR_INVALID_ARGUMENT,
                       NULL);
    bad += expect_fail(R, "reducescatter, nranks*recvcount overflows",
                       colld_reducescatter(f, g, SIZE_MAX / 2 + 1, COLLD_INT8, COLLD_SUM, R->comm, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, NULL);
    /* Unknown op / dtype on the new collectives. */
    bad += expect_fail(R, "reduce with op 42",
                       colld_reduce(f, g, 4, COLLD_FLOAT32, (colld_redop_t)42, 0, R->comm, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, "op 42");
    bad += expect_fail(R, "reducescatter with op -1",
                       colld_reducescatter(f, g, 4, COLLD_FLOAT32, (colld_redop_t)-1, R->comm, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, NULL);
    bad += expect_fail(R, "broadcast with dtype 99", colld_broadcast(f, g, 4, (colld_dtype_t)99, 0, R->comm, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, "dtype 99");
    bad += expect_fail(R, "allgather with dtype -3", colld_allgather(f, g, 4, (colld_dtype_t)-3, R->comm, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, NULL);
    /* Roots just out of range at this size. */
    bad += expect_fail(R, "broadcast root nranks", colld_broadcast(f, g, 4, COLLD_FLOAT32, n, R->comm, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, "out of range");
    bad += expect_fail(R, "reduce root nranks", colld_reduce(f, g, 4, COLLD_FLOAT32, COLLD_MAX, n, R->comm, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, "out of range");
    /* The root needs the buffer a non-root may leave NULL. */
    if (rank == root) {
        bad += expect_fail(R, "broadcast root with sendbuf NULL",
                           colld_broadcast(NULL, g, 4, COLLD_FLOAT32, root, R->comm, NULL), COLLD_ERR_INVALID_ARGUMENT,
                           "sendbuf is NULL");
        bad += expect_fail(R, "reduce root with recvbuf NULL",
                           colld_reduce(f, NULL, 4, COLLD_FLOAT32, COLLD_SUM, root, R->comm, NULL),
                           COLLD_ERR_INVALID_ARGUMENT, "recvbuf is NULL");
        bad += expect_fail(R, "reduce root, recv runs past its buffer",
                           colld_reduce(f, g + cap - 2, 4, COLLD_FLOAT32, COLLD_SUM, root, R->comm, NULL),
                           COLLD_ERR_INVALID_ARGUMENT, "recvbuf");
    }
    /* A stream (GPU only) on the new collectives. */
    bad += expect_fail(R, "reducescatter with a stream",
                       colld_reducescatter(f, g, 4, COLLD_FLOAT32, COLLD_SUM, R->comm, &dummy), COLLD_ERR_NOT_SUPPORTED,
                       "stream");
    bad += expect_fail(R, "broadcast with a stream", colld_broadcast(f, g, 4, COLLD_FLOAT32, 0, R->comm, &dummy),
                       COLLD_ERR_NOT_SUPPORTED, "stream");
    colld_status_t st = colld_comm_query(R->comm);
    if (st != COLLD_OK) {
        fprintf(stderr, "rank %d: after refused calls colld_comm_query is %s, expected COLLD_OK\n", rank,
                colld_status_name(st));
        bad++;
    }
    /* Still usable and in step: an all-gather and a broadcast from the last rank, both exact. */
    call_t ag = { .kind = K_ALLGATHER, .dt = COLLD_INT32, .count = 1001, .salt = R->a->salt + 11 };
    call_t bc = { .kind = K_BROADCAST,
                  .dt = COLLD_FLOAT64,
                  .count = 1001,
                  .root = root,
                  .null_unused = true,
                  .salt = R->a->salt + 12 };
    if (run_call(R, &ag) != 0 || run_call(R, &bc) != 0)
        bad++;
    return bad ? 1 : 0;
}

/* Premultiplied-sum operators used wrongly (each refused on the client, nothing posted, so each
 * rank may make its own mistakes), then used rightly: a NULL scalar or op and an unknown dtype at
 * creation; an operator used with another dtype, after its destruction, on another communicator
 * handle (a split with one color), destroyed twice; a built-in op and a made-up value given to
 * colld_redop_destroy; the 65th operator of a handle. Afterwards the communicator works and stays
 * in step: premultiplied sums on the engine and in a group, each operator destroyed right after
 * its call (before colld_group_end in the group), all exact. */
static int mode_premul_bad(run_t *R)
{
    int bad = 0;
    float *f = (float *)R->sreg, *g = (float *)R->rreg;
    float half = 0.5f;
    colld_redop_t op, ops[COLLD_REDOP_PREMUL_MAX];
    colld_comm_t *other = NULL;
    colld_status_t st;

    bad += expect_fail(R, "create with scalar NULL", colld_redop_create_premul_sum(R->comm, NULL, COLLD_FLOAT32, &op),
                       COLLD_ERR_INVALID_ARGUMENT, "scalar is NULL");
    bad += expect_fail(R, "create with op NULL", colld_redop_create_premul_sum(R->comm, &half, COLLD_FLOAT32, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, "op is NULL");
    bad += expect_fail(R, "create with dtype 99", colld_redop_create_premul_sum(R->comm, &half, (colld_dtype_t)99, &op),
                       COLLD_ERR_INVALID_ARGUMENT, "unknown dtype 99");
    if ((st = colld_redop_create_premul_sum(R->comm, &half, COLLD_FLOAT32, &op)) != COLLD_OK)
        return status_fail(R, NULL, "colld_redop_create_premul_sum", st) ? 1 : 0;
    if ((unsigned)op < COLLD_REDOP_COUNT) {
        fprintf(stderr, "rank %d: a premultiplied-sum operator has the value of a built-in op (%d)\n", R->rank,
                (int)op);
        bad++;
    }
    bad += expect_fail(R, "float32 operator on an int32 all-reduce",
                       colld_allreduce(f, g, 4, COLLD_INT32, op, R->comm, NULL), COLLD_ERR_INVALID_ARGUMENT,
                       "premultiplied sum of float32, but the collective's dtype is int32");
    if ((st = colld_redop_destroy(R->comm, op)) != COLLD_OK)
        return status_fail(R, NULL, "colld_redop_destroy", st) ? 1 : 0;
    bad += expect_fail(R, "destroyed operator on a reduce", colld_reduce(f, g, 4, COLLD_FLOAT32, op, 0, R->comm, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, "was destroyed");
    bad += expect_fail(R, "destroyed twice", colld_redop_destroy(R->comm, op), COLLD_ERR_INVALID_ARGUMENT,
                       "was destroyed");
    bad += expect_fail(R, "destroy a built-in op", colld_redop_destroy(R->comm, COLLD_SUM), COLLD_ERR_INVALID_ARGUMENT,
                       "built-in op");
    bad += expect_fail(R, "destroy a made-up operator", colld_redop_destroy(R->comm, (colld_redop_t)0x4000007f),
                       COLLD_ERR_INVALID_ARGUMENT, "no premultiplied-sum operator of this communicator handle");
    bad += expect_fail(R, "a made-up operator on an all-reduce",
                       colld_allreduce(f, g, 4, COLLD_FLOAT32, (colld_redop_t)0x12345, R->comm, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, "unknown reduction op");
    /* Another handle on the same ranks: its operator is not this handle's, and the reverse. */
    if ((st = colld_comm_split(R->comm, 0, R->rank, &other, NULL)) != COLLD_OK || !other)
        return status_fail(R, NULL, "colld_comm_split", st) ? 1 : 0;
    if ((st = colld_redop_create_premul_sum(other, &half, COLLD_FLOAT32, &op)) != COLLD_OK)
        return status_fail(R, NULL, "colld_redop_create_premul_sum on the split", st) ? 1 : 0;
    bad += expect_fail(R, "another handle's operator", colld_reducescatter(f, g, 4, COLLD_FLOAT32, op, R->comm, NULL),
                       COLLD_ERR_INVALID_ARGUMENT, "one of another communicator handle");
    bad += expect_fail(R, "destroying another handle's operator", colld_redop_destroy(R->comm, op),
                       COLLD_ERR_INVALID_ARGUMENT, "one of another communicator handle");
    if ((st = colld_redop_destroy(other, op)) != COLLD_OK)
        bad += status_fail(R, NULL, "colld_redop_destroy on the split", st) ? 1 : 0;
    if ((st = colld_comm_destroy(other)) != COLLD_OK)
        bad += status_fail(R, NULL, "colld_comm_destroy of the split", st) ? 1 : 0;
    /* The bound: COLLD_REDOP_PREMUL_MAX at once, the next refused; destroying one makes room. */
    for (int i = 0; i < COLLD_REDOP_PREMUL_MAX; i++)
        if ((st = colld_redop_create_premul_sum(R->comm, &half, COLLD_FLOAT32, &ops[i])) != COLLD_OK)
            return status_fail(R, NULL, "colld_redop_create_premul_sum within the bound", st) ? 1 : 0;
    bad += expect_fail(R, "one operator past the bound",
                       colld_redop_create_premul_sum(R->comm, &half, COLLD_FLOAT32, &op), COLLD_ERR_INVALID_USAGE,
                       "premultiplied-sum operators");
    if (colld_redop_destroy(R->comm, ops[7]) != COLLD_OK ||
        colld_redop_create_premul_sum(R->comm, &half, COLLD_FLOAT32, &ops[7]) != COLLD_OK) {
        fprintf(stderr, "rank %d: no room for an operator after one was destroyed\n", R->rank);
        bad++;
    }
    for (int i = 0; i < COLLD_REDOP_PREMUL_MAX; i++)
        if (colld_redop_destroy(R->comm, ops[i]) != COLLD_OK)
            bad++;
    if ((st = colld_comm_query(R->comm)) != COLLD_OK) {
        fprintf(stderr, "rank %d: after refused calls colld_comm_query is %s, expected COLLD_OK\n", R->rank,
                colld_status_name(st));
        bad++;
    }
    /* Still usable and in step: premultiplied sums through the engine, then in a group. */
    call_t ar = { .kind = K_ALLREDUCE, .dt = COLLD_FLOAT32, .op = COLL_OP_PREMUL, .count = 5001, .salt = 31 };
    call_t rd = { .kind = K_REDUCE,
                  .dt = COLLD_BFLOAT16,
                  .op = COLL_OP_PREMUL,
                  .count = 1001,
                  .root = R->n - 1,
                  .inplace = true,
                  .salt = 32 };
    if (run_call(R, &ar) != 0 || run_call(R, &rd) != 0)
        bad++;
    return bad ? 1 : 0;
}

/* One collective given as KIND:DTYPE:OP:COUNT:ROOT (e.g. to provoke a mismatch). With --expect
 * the synchronize status must be that one; its detail goes to stdout. */
static int mode_call(run_t *R)
{
    char spec[128], *save = NULL;
    snprintf(spec, sizeof(spec), "%s", R->a->call ? R->a->call : "");
    char *f[5];
    for (int i = 0; i < 5; i++)
        f[i] = strtok_r(i ? NULL : spec, ":", &save);
    int kind = f[0] ? coll_lookup(f[0], kind_names, K_COUNT) : -1;
    int dt = f[1] ? coll_lookup(f[1], dtype_names, COLLD_DTYPE_COUNT) : -1;
    int op = f[2] ? coll_lookup(f[2], op_names, COLL_OPS) : -1;
    if (kind < 0 || dt < 0 || op < 0 || !f[3] || !f[4]) {
        fprintf(stderr, "rank %d: bad --call '%s' (KIND:DTYPE:OP:COUNT:ROOT)\n", R->rank, R->a->call);
        return 2;
    }
    call_t k = { .kind = kind,
                 .dt = (colld_dtype_t)dt,
                 .op = (colld_redop_t)op,
                 .count = strtoull(f[3], NULL, 10),
                 .root = atoi(f[4]),
                 .salt = R->a->salt,
                 .small = pattern == colld_cpu_pattern_small };
    if (!R->a->expect)
        return run_call(R, &k) == 0 ? 0 : 1;
    k.sreg = R->sreg;
    k.rreg = R->rreg;
    if (coll_prepare_data(&k, R->n, R->rank, pattern) < 0)
        return 1;
    coll_prepare_buffers(&k, R->n, R->rank);
    colld_status_t st = post_call(R, &k);
    if (st == COLLD_OK)
        st = colld_comm_synchronize(R->comm);
    coll_free_data(&k);
    if (strcmp(colld_status_name(st), R->a->expect) != 0)
        return status_fail(R, &k, "the call (unexpected status)", st) ? 1 : 0;
    printf("rank %d: %s\n", R->rank, colld_comm_last_error(R->comm));
    fflush(stdout);
    return 0;
}

/* One split of R's communicator; the new communicator's rank and size must be want_rank,
 * want_n (NULL expected for want_n 0). Returns the new one, or NULL (with *rc 1 on an error). */
static colld_comm_t *split_checked(run_t *R, int color, int key, int want_rank, int want_n, int *rc)
{
    colld_comm_t *sub = NULL;
    colld_status_t st = colld_comm_split(R->comm, color, key, &sub, NULL);
    int n = -1, r = -1;
    if (st != COLLD_OK) {
        fprintf(stderr, "FAILED rank %d: colld_comm_split(color %d, key %d): %s: %s\n", R->rank, color, key,
                colld_status_name(st), colld_comm_last_error(R->comm));
        *rc = 1;
        return NULL;
    }
    if (sub) {
        colld_comm_count(sub, &n);
        colld_comm_user_rank(sub, &r);
    }
    if ((want_n == 0) != (sub == NULL) || (sub && (n != want_n || r != want_rank))) {
        fprintf(stderr,
                "FAILED rank %d: colld_comm_split(color %d, key %d): got %s rank %d of %d, want rank %d of %d\n",
                R->rank, color, key, sub ? "a communicator" : "none", r, n, want_rank, want_n);
        *rc = 1;
    }
    return sub;
}

static int mode_split(run_t *R)
{
    int rc = 0, n = R->n, me = R->rank;
    bool nocolor = n >= 3 && me == n - 1;
    int color = nocolor ? COLLD_SPLIT_NOCOLOR : me % 2, want_n = 0, want_rank = 0;
    for (int r = 0; r < n && !nocolor; r++)
        if (!(n >= 3 && r == n - 1) && r % 2 == color) {
            want_n++;
            want_rank += r > me; /* key n - r: the higher ranks come first */
        }
    colld_comm_t *sub = split_checked(R, color, n - me, want_rank, want_n, &rc);
    if (sub && rc == 0) {
        run_t G = *R;
        G.comm = sub;
        G.n = want_n;
        G.rank = want_rank;
        rc = mode_matrix(&G, 0);
        R->collectives = G.collectives; /* G started from R's counts */
        R->bad = G.bad;
    }
    if (sub)
        colld_comm_destroy(sub);
    call_t k = { .kind = K_ALLREDUCE, .dt = COLLD_INT32, .op = COLLD_SUM, .count = 1001, .salt = R->a->salt + 3 };
    if (rc == 0 && run_call(R, &k) != 0) /* the parent still works */
        rc = 1;
    if (rc == 0 && (sub = split_checked(R, 0, 0, me, n, &rc)) != NULL) {
        run_t G = *R;
        G.comm = sub;
        k.salt++;
        if (run_call(&G, &k) != 0)
            rc = 1;
        R->collectives = G.collectives;
        colld_comm_destroy(sub);
    }
    return rc;
}

/* Element i of rank r's input in mode ops: sums stay exact in float32. */
static float ops_value(int r, size_t i)
{
    return (float)(r + (int)(i % 7));
}

/* Check an all-reduce of mode ops. Returns 0 when exact. */
static int ops_check(const run_t *R, const float *y, size_t count, int which)
{
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < R->n; r++)
            want += ops_value(r, i);
        if (y[i] != want) {
            fprintf(stderr, "FAILED rank %d: all-reduce %d of mode ops: element %zu is %g, want %g\n", R->rank, which,
                    i, (double)y[i], (double)want);
            return 1;
        }
    }
    return 0;
}

static int mode_ops(run_t *R)
{
    enum { NOPS = 4 };
    static const size_t counts[NOPS] = { 100003, 1001, 200003, 7 }; /* engine, fast, engine, fast */
    float *x[NOPS], *y[NOPS];
    uint64_t id[NOPS + 1];
    int rc = 0;
    for (int k = 0; k < NOPS; k++) {
        x[k] = malloc(counts[k] * sizeof(float));
        y[k] = calloc(counts[k], sizeof(float));
        if (!x[k] || !y[k])
            return 1;
        for (size_t i = 0; i < counts[k]; i++)
            x[k][i] = ops_value(R->rank, i);
    }
    for (int k = 0; k < NOPS && rc == 0; k++) {
        colld_status_t st = colld_allreduce(x[k], y[k], counts[k], COLLD_FLOAT32, COLLD_SUM, R->comm, NULL);
        if (st == COLLD_OK)
            st = colld_comm_last_op(R->comm, &id[k]);
        if (st != COLLD_OK)
            rc = status_fail(R, NULL, "colld_allreduce / colld_comm_last_op", st) ? 1 : 0;
        else if (k > 0 && id[k] != id[k - 1] + 1) {
            fprintf(stderr, "FAILED rank %d: ids %llu then %llu\n", R->rank, (unsigned long long)id[k - 1],
                    (unsigned long long)id[k]);
            rc = 1;
        }
    }
    colld_status_t st;
    if (rc == 0 && (st = colld_op_wait(R->comm, id[1])) != COLLD_OK)
        rc = status_fail(R, NULL, "colld_op_wait of the second", st) ? 1 : 0;
    if (rc == 0)
        rc = ops_check(R, y[1], counts[1], 1) || ops_check(R, y[0], counts[0], 0);
    if (rc == 0 && (st = colld_op_wait(R->comm, id[NOPS - 1])) != COLLD_OK)
        rc = status_fail(R, NULL, "colld_op_wait of the last", st) ? 1 : 0;
    for (int k = 0; k < NOPS && rc == 0; k++)
        rc = ops_check(R, y[k], counts[k], k);
    if (rc == 0 && (st = colld_op_query(R->comm, id[NOPS - 1] + 100)) != COLLD_ERR_INVALID_ARGUMENT) {
        fprintf(stderr, "FAILED rank %d: colld_op_query of an id never issued: %s\n", R->rank, colld_status_name(st));
        rc = 1;
    }
    /* A fault after them: the last rank aborts once everyone has completed them. */
    if (rc == 0 && (st = colld_barrier(R->comm)) != COLLD_OK)
        rc = status_fail(R, NULL, "colld_barrier", st) ? 1 : 0;
    if (rc == 0 && R->rank == R->n - 1) {
        colld_comm_abort(R->comm);
    } else if (rc == 0) {
        st = colld_allreduce(x[0], y[0], counts[0], COLLD_FLOAT32, COLLD_SUM, R->comm, NULL);
        if (st == COLLD_OK && (st = colld_comm_last_op(R->comm, &id[NOPS])) == COLLD_OK)
            st = colld_op_wait(R->comm, id[NOPS]);
        if (st != COLLD_ERR_ABORTED) {
            fprintf(stderr, "FAILED rank %d: the all-reduce after the abort: %s, want COLLD_ERR_ABORTED\n", R->rank,
                    colld_status_name(st));
            rc = 1;
        }
    }
    for (int k = 0; k < NOPS && rc == 0; k++)
        if ((st = colld_op_query(R->comm, id[k])) != COLLD_OK) {
            fprintf(stderr, "FAILED rank %d: all-reduce %d completed before the abort, now %s\n", R->rank, k,
                    colld_status_name(st));
            rc = 1;
        }
    for (int k = 0; k < NOPS; k++) {
        free(x[k]);
        free(y[k]);
    }
    R->collectives += NOPS;
    return rc;
}

static int mode_nan(run_t *R)
{
    const args_t *a = R->a;
    size_t count = 1000;
    if (a->call) {
        const char *p = a->call;
        for (int i = 0; i < 3 && p; i++)
            p = strchr(p, ':') ? strchr(p, ':') + 1 : NULL;
        if (p)
            count = strtoull(p, NULL, 10);
    }
    float *x = malloc(count * sizeof(float));
    if (!x)
        return 1;
    for (size_t i = 0; i < count; i++)
        x[i] = (float)(R->rank + (int)(i % 5));
    char spec[256];
    snprintf(spec, sizeof(spec), "%s", a->poison ? a->poison : "");
    char *save = NULL;
    for (char *t = strtok_r(spec, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int r = -1;
        unsigned long long at = 0;
        char what[8] = "";
        if (sscanf(t, "%d:%llu:%7s", &r, &at, what) != 3 || at >= count) {
            fprintf(stderr, "rank %d: bad --poison %s\n", R->rank, t);
            free(x);
            return 2;
        }
        if (r == R->rank)
            x[at] = strcmp(what, "nan") == 0 ? NAN : strcmp(what, "-inf") == 0 ? -INFINITY : INFINITY;
    }
    colld_status_t st = colld_allreduce(x, x, count, COLLD_FLOAT32, COLLD_SUM, R->comm, NULL);
    if (st == COLLD_OK)
        st = colld_comm_synchronize(R->comm);
    free(x);
    R->collectives++;
    const char *want = a->expect ? a->expect : "COLLD_OK";
    if (strcmp(colld_status_name(st), want) != 0) {
        fprintf(stderr, "FAILED rank %d: the all-reduce returned %s (want %s): %s\n", R->rank, colld_status_name(st),
                want, colld_comm_last_error(R->comm));
        return 1;
    }
    if (a->expect) {
        printf("rank %d: %s\n", R->rank, colld_comm_last_error(R->comm));
        fflush(stdout);
    }
    int32_t y[4] = { 1, 2, 3, 4 };
    st = colld_allreduce(y, y, 4, COLLD_INT32, COLLD_SUM, R->comm, NULL);
    if (st == COLLD_OK)
        st = colld_comm_synchronize(R->comm);
    if ((st == COLLD_OK) != (a->expect == NULL) || (st == COLLD_OK && y[3] != 4 * R->n)) {
        fprintf(stderr, "FAILED rank %d: the int32 all-reduce after it: %s\n", R->rank, colld_status_name(st));
        return 1;
    }
    return 0;
}

static int mode_crossed(run_t *R)
{
    const args_t *a = R->a;
    colld_unique_id_t id2;
    colld_comm_t *second = NULL;
    if (!a->uid2_hex || harness_uid_from_hex(a->uid2_hex, &id2) < 0 || R->n != 2 || !a->expect || !a->sync_dir) {
        fprintf(stderr, "rank %d: mode crossed needs --uid2, 2 ranks, --expect and --sync-dir\n", R->rank);
        return 2;
    }
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = a->timeout_ms;
    cfg.name = "crossed-2";
    colld_status_t st = colld_comm_init_rank(R->c, &second, 2, id2, R->rank, &cfg);
    if (st != COLLD_OK)
        return status_fail(R, NULL, "joining the second communicator", st) ? 1 : 0;
    colld_comm_t *mine = R->rank == 0 ? R->comm : second; /* rank 0 goes first in the first one */
    float x[16] = { 0 };
    st = colld_allreduce(x, x, 16, COLLD_FLOAT32, COLLD_SUM, mine, NULL);
    if (st == COLLD_OK)
        st = colld_comm_synchronize(mine);
    int rc = 0;
    if (strcmp(colld_status_name(st), a->expect) != 0) {
        fprintf(stderr, "FAILED rank %d: %s, want %s: %s\n", R->rank, colld_status_name(st), a->expect,
                colld_comm_last_error(mine));
        rc = 1;
    } else {
        printf("rank %d: %s\n", R->rank, colld_comm_last_error(mine));
        fflush(stdout);
    }
    char path[512];
    snprintf(path, sizeof(path), "%s/crossed-done-%d", a->sync_dir, R->rank);
    FILE *f = fopen(path, "w");
    if (!f || fclose(f) != 0)
        rc = 1;
    snprintf(path, sizeof(path), "%s/crossed-done-%d", a->sync_dir, 1 - R->rank);
    if (harness_wait_file(path, 120000) < 0) {
        fprintf(stderr, "FAILED rank %d: rank %d never got its status\n", R->rank, 1 - R->rank);
        rc = 1;
    }
    colld_comm_destroy(second);
    return rc;
}

static int mode_barrier(run_t *R)
{
    const char *dir = R->a->sync_dir;
    if (!dir) {
        fprintf(stderr, "rank %d: mode barrier needs --sync-dir\n", R->rank);
        return 2;
    }
    char path[512];
    for (int i = 0; i < 3; i++) {
        if (R->rank == i % R->n)
            usleep(200 * 1000);
        snprintf(path, sizeof(path), "%s/arrived-%d-%d", dir, i, R->rank);
        FILE *f = fopen(path, "w");
        if (!f || fclose(f) != 0)
            return 1;
        colld_status_t st = colld_barrier(R->comm);
        if (st != COLLD_OK)
            return status_fail(R, NULL, "colld_barrier", st) ? 1 : 0;
        for (int r = 0; r < R->n; r++) {
            snprintf(path, sizeof(path), "%s/arrived-%d-%d", dir, i, r);
            if (access(path, F_OK) != 0) {
                fprintf(stderr, "FAILED rank %d: left barrier %d before rank %d entered it\n", R->rank, i, r);
                return 1;
            }
        }
        R->collectives++;
    }
    return 0;
}

/* Input of rank r, element i of the chain: -2..2, so every sum stays exact in float32. */
static float chain_value(int r, size_t i)
{
    return (float)((int)((i * 7 + (size_t)r * 13) % 5) - 2);
}

static int mode_chain(run_t *R)
{
    size_t k = R->a->chain_count, n = (size_t)R->n;
    if (!k || n * k * sizeof(float) + 2 * GUARD > R->reg_bytes) {
        fprintf(stderr, "rank %d: --chain-count %zu does not fit\n", R->rank, k);
        return 2;
    }
    float *x = (float *)(R->sreg + GUARD), *y = (float *)(R->rreg + GUARD);
    for (size_t i = 0; i < n * k; i++)
        x[i] = chain_value(R->rank, i);
    colld_status_t st = COLLD_OK;
    for (int it = 0; it < R->a->iters && st == COLLD_OK; it++) {
        st = colld_reducescatter(x, y, k, COLLD_FLOAT32, COLLD_SUM, R->comm, NULL);
        if (st == COLLD_OK)
            st = colld_allgather(y, x, k, COLLD_FLOAT32, R->comm, NULL);
        R->collectives += 2;
    }
    if (st == COLLD_OK)
        st = colld_comm_synchronize(R->comm);
    if (st != COLLD_OK) {
        fprintf(stderr, "rank %d: chain: %s (%s)\n", R->rank, colld_status_name(st), colld_comm_last_error(R->comm));
        return 1;
    }
    /* After R rounds every element is n^(R-1) times the sum of the ranks' inputs. */
    float scale = 1;
    for (int it = 1; it < R->a->iters; it++)
        scale *= (float)n;
    for (size_t i = 0; i < n * k; i++) {
        float sum = 0;
        for (size_t r = 0; r < n; r++)
            sum += chain_value((int)r, i);
        if (x[i] != sum * scale && R->bad++ < 5)
            fprintf(stderr, "rank %d: chain: element %zu is %g, expected %g\n", R->rank, i, (double)x[i],
                    (double)(sum * scale));
    }
    if (checkpoint(R, R->a->iters) < 0)
        return 1;
    return R->bad ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------------
 * Set-up
 * ------------------------------------------------------------------------------------------- */

/* Bytes each registered buffer needs for the selected mode and subsets. */
static size_t needed_bytes(const args_t *a)
{
    size_t n = (size_t)a->nranks, most = 1001;
    if (strcmp(a->mode, "matrix") == 0 && a->big)
        most = BIG_BYTES + 3 * 8; /* elements x size, at most */
    else if (strcmp(a->mode, "matrix") == 0)
        most = 1001 * 8;
    else if (strcmp(a->mode, "small") == 0)
        most = 64 * 8;
    else if (strcmp(a->mode, "chain") == 0)
        most = a->chain_count * sizeof(float);
    else if (strcmp(a->mode, "group") == 0 || strcmp(a->mode, "group-invalid") == 0)
        return group_slot_bytes(&(run_t){ .n = a->nranks }) * (size_t)(a->group_size < 16 ? 16 : a->group_size);
    else
        most = 1001 * 8 + (size_t)(1 << 16);
    if (strcmp(a->mode, "call") == 0 && a->call) {
        const char *p = a->call;
        for (int i = 0; i < 3 && p; i++)
            p = strchr(p, ':') ? strchr(p, ':') + 1 : NULL;
        if (p && strtoull(p, NULL, 10) * 8 > most)
            most = strtoull(p, NULL, 10) * 8;
    }
    return n * most + 2 * GUARD;
}

/* Parse the command line into `a`. Returns 0, or 2 on a bad argument. */
/* --exact-values: values whose sums are exact in every dtype (set before any case is made). */
static int exact_values(void *ctx, const char *unused)
{
    (void)ctx, (void)unused;
    pattern = colld_cpu_pattern_small;
    return 0;
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
        COLL_MASK_OPT("kinds", kind_names, K_COUNT, &a->kinds),
        COLL_MASK_OPT("dtypes", dtype_names, COLLD_DTYPE_COUNT, &a->dtypes),
        COLL_MASK_OPT("ops", op_names, COLL_OPS, &a->ops),
        HARNESS_ONLY(&a->inplace, &a->outofplace),
        HARNESS_INT("salt", &a->salt),
        HARNESS_INT("rotate", &a->rotate),
        HARNESS_INT("iters", &a->iters),
        HARNESS_INT("group-size", &a->group_size),
        HARNESS_INT("timeout-ms", &a->timeout_ms),
        HARNESS_INT("max-report", &a->max_report),
        HARNESS_STR("sync-dir", &a->sync_dir),
        HARNESS_STR("checkpoints", &a->checkpoints),
        HARNESS_STR("call", &a->call),
        HARNESS_STR("poison", &a->poison),
        HARNESS_U64("chain-count", &a->chain_count),
        HARNESS_STR("expect", &a->expect),
        HARNESS_OUT,
        HARNESS_CLEAR("no-big", &a->big),
        HARNESS_SET("big-all", &a->big_all),
        HARNESS_SET("big-min", &a->big_min),
        HARNESS_SET("malloc", &a->use_malloc),
        HARNESS_SET("comm-nan-check", &a->comm_nan_check),
        HARNESS_SET("comm-verify", &a->comm_verify),
        HARNESS_ACTION("exact-values", exact_values, NULL),
    };
    if (HARNESS_PARSE_OPTS("coll_rank", argc, argv, opts) != 0)
        return 2;
    if (!a->socket || !a->uid_hex || a->nranks < 1 || a->nranks > MAX_RANKS || a->rank < 0 || a->rank >= a->nranks ||
        !a->kinds || !a->dtypes || !a->ops || a->iters < 0 || a->group_size < 1 || a->group_size > 1024) {
        fprintf(stderr, "coll_rank: need --socket, --uid, --nranks 1..%d, --rank; valid subsets\n", MAX_RANKS);
        return 2;
    }
    return 0;
}

/* Join the communicator, share the buffers, run the mode, leave. */
/* After the matrix: colld_client_stats counted its engine-path collectives (gather, scatter and
 * all-to-all always take it; where gather is among the kinds) as staged with --malloc, and none
 * staged (and, with gather, some zero copy) on colld_mem_alloc buffers; it refuses what it must. */
static int check_stats(run_t *R)
{
    colld_client_stats_t st = { .size = sizeof(st) };
    if (colld_client_stats(R->c, &st) != COLLD_OK) {
        fprintf(stderr, "rank %d: colld_client_stats failed\n", R->rank);
        return 1;
    }
    bool engine = (R->a->kinds & (1u << K_GATHER)) != 0; /* else perhaps fast path only */
    bool ok = R->a->use_malloc ? !engine || (st.staged > 0 && st.staged_bytes > 0)
                               : st.staged == 0 && (!engine || st.zero_copy > 0);
    colld_client_stats_t small = { .size = sizeof(size_t) };
    ok = ok && colld_client_stats(R->c, &small) == COLLD_ERR_INVALID_ARGUMENT &&
         colld_client_stats(NULL, &st) == COLLD_ERR_INVALID_ARGUMENT &&
         colld_client_stats(R->c, NULL) == COLLD_ERR_INVALID_ARGUMENT;
    if (!ok)
        fprintf(stderr, "rank %d: colld_client_stats on %s buffers: %llu zero copy, %llu staged (%llu bytes)\n", R->rank,
                R->a->use_malloc ? "malloc" : "colld_mem_alloc", (unsigned long long)st.zero_copy,
                (unsigned long long)st.staged, (unsigned long long)st.staged_bytes);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    args_t a = { .mode = "matrix",
                 .timeout_ms = 120000,
                 .iters = 1,
                 .group_size = 64,
                 .max_report = 40,
                 .kinds = (1u << K_COUNT) - 1,
                 .dtypes = (1u << COLLD_DTYPE_COUNT) - 1,
                 .ops = (1u << COLL_OPS) - 1,
                 .inplace = true,
                 .outofplace = true,
                 .big = true };
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc;
    run_t R = { .a = &a, .n = a.nranks, .rank = a.rank };
    double t0 = harness_now_ms();
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = a.timeout_ms;
    cfg.nan_check = a.comm_nan_check;
    cfg.verify_results = a.comm_verify;
    cfg.name = "test-coll";
    if ((rc = harness_rank_join("coll_rank", a.socket, a.uid_hex, a.nranks, a.rank, &cfg, &R.c, &R.comm)) != 0)
        return rc;
    R.reg_bytes = needed_bytes(&a);
    if ((rc = harness_rank_buffers(R.c, a.rank, a.use_malloc, &R.reg_bytes, &R.sreg, &R.rreg)) != 0)
        goto out;
    if (strcmp(a.mode, "matrix") == 0) {
        for (int it = 0; it < a.iters && rc == 0; it++)
            rc = mode_matrix(&R, it);
    } else if (strcmp(a.mode, "small") == 0)
        rc = mode_small(&R);
    else if (strcmp(a.mode, "group") == 0)
        rc = mode_group(&R);
    else if (strcmp(a.mode, "group-invalid") == 0)
        rc = mode_group_invalid(&R);
    else if (strcmp(a.mode, "badargs") == 0 && !a.use_malloc) /* bounds need colld_mem_alloc */
        rc = mode_badargs(&R);
    else if (strcmp(a.mode, "premul-bad") == 0)
        rc = mode_premul_bad(&R);
    else if (strcmp(a.mode, "call") == 0)
        rc = mode_call(&R);
    else if (strcmp(a.mode, "chain") == 0)
        rc = mode_chain(&R);
    else if (strcmp(a.mode, "split") == 0)
        rc = mode_split(&R);
    else if (strcmp(a.mode, "barrier") == 0)
        rc = mode_barrier(&R);
    else if (strcmp(a.mode, "ops") == 0)
        rc = mode_ops(&R);
    else if (strcmp(a.mode, "nan") == 0)
        rc = mode_nan(&R);
    else if (strcmp(a.mode, "crossed") == 0)
        rc = mode_crossed(&R);
    else {
        fprintf(stderr, "coll_rank: unknown mode %s\n", a.mode);
        rc = 2;
    }
    if (rc == 0 && strcmp(a.mode, "matrix") == 0)
        rc = check_stats(&R);
    if (rc != 0 && R.reported > a.max_report)
        fprintf(stderr, "rank %d: %d more failures not shown\n", a.rank, R.reported - a.max_report);
    if (a.rank == 0 && strcmp(a.mode, "call") != 0)
        fprintf(stderr, "rank 0/%d: mode %s: %ld collectives, %ld wrong, %.0f ms\n", a.nranks, a.mode, R.collectives,
                R.bad, harness_now_ms() - t0);
out:
    harness_rank_end(R.c, R.comm, a.use_malloc, R.sreg, R.rreg);
    return rc;
}
