/*
 * test_collectives.c - the five collectives (allreduce, broadcast, reduce, allgather,
 * reducescatter) through a real colld daemon with real client processes (colld-test-coll, see
 * coll_rank.c), every result compared bitwise with the scalar oracle:
 *  - the whole matrix (kind x dtype x op x count {0, 1, 1001, >= 4 MiB} x in/out of place) for
 *    1, 2, 3, 4 and 8 ranks. The counts 0, 1 and 1001 always cover every combination; the
 *    >= 4 MiB count covers, in `make test-full`, every combination on 1 and 2 ranks and on 3, 4
 *    and 8 ranks the subset coll_data.c's coll_big_selected() names (broadcast and all-gather:
 *    every dtype; the reductions: every dtype with sum, float32 with every op); `make test`
 *    runs that subset on 1 and 2 ranks and float32 once per kind on 3, 4 and 8 (matrix_args
 *    below), to stay within about a minute on 2 cores. Also at small counts with ordinary
 *    (staged) memory;
 *  - four communicators of 8 ranks each (32 processes) running mixed collectives at once;
 *  - 10,000 small all-reduces in a row, with the daemon's resident memory measured;
 *  - a group of 64 mixed collectives, and a group with one invalid call (nothing posted);
 *  - bad input of the new collectives that test_faults.c does not cover: errors that depend on
 *    nranks and on the root, and ranks that disagree (mismatch) in root, kind, op or count;
 *  - the premultiplied sum (colld_redop_create_premul_sum): in every matrix above (op premul_sum,
 *    each rank with its own scalar), again for 2, 3 and 4 ranks with the fast area off (every
 *    dtype through the engine), and its bad input: operators used wrongly, a premultiplied sum
 *    against a sum (mismatch).
 */
#include "tests/integration/harness.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#define MAX_PROCS 32
#define RUN_LIMIT_MS 600000      /* per group of rank processes; generous for sanitizer builds */
#define RSS_GROWTH_LIMIT_KB 2048 /* the daemon may grow at most 2 MiB over 9,000 all-reduces */

/* Run one communicator of colld-test-coll processes to the end; every rank must exit 0. */
static void run_coll(harness_t *h, int nranks, const char *const *extra)
{
    pid_t pids[MAX_PROCS];
    double t0 = harness_now_ms();
    assert_int_equal(harness_spawn_coll(h, nranks, extra, pids), 0);
    assert_int_equal(harness_wait_all(pids, nranks, RUN_LIMIT_MS), 0);
    print_message("%d rank(s): %.0f ms\n", nranks, harness_now_ms() - t0);
}

/* ---------------------------------------------------------------------------------------------
 * The matrix
 * ------------------------------------------------------------------------------------------- */

/* The matrix for one rank count: every rank process runs it and exits 0 only when all matched.
 * The small counts always cover every combination. The >= 4 MiB count (harness_test_size):
 *  - full (`make test-full`): every combination on 1 and 2 ranks, coll_big_selected()'s subset on
 *    3, 4 and 8;
 *  - CI (`make test`): that subset on 1 and 2 ranks, float32 once per kind on 3, 4 and 8;
 *  - small (`make test-asan`): float32 once per kind on every rank count;
 *  - none with COLLD_TEST_NO_BIG=1 (`make test-tsan`, where ThreadSanitizer makes the >= 4 MiB
 *    counts take many minutes and adds no concurrency to check). */
static const char *const big_all[] = { "--big-all", NULL };
static const char *const big_min[] = { "--big-min", NULL };
static const char *const no_big[] = { "--no-big", NULL };

/* full: the arguments of the full run; ci: those of `make test`. */
static const char *const *matrix_args(const char *const *full, const char *const *ci)
{
    switch (harness_test_size()) {
    case HARNESS_SIZE_NO_BIG:
        return no_big;
    case HARNESS_SIZE_SMALL:
        return big_min;
    case HARNESS_SIZE_CI:
        return ci;
    default:
        return full;
    }
}

static void test_matrix_1_rank(void **state)
{
    run_coll(*state, 1, matrix_args(big_all, NULL));
}
static void test_matrix_2_ranks(void **state)
{
    run_coll(*state, 2, matrix_args(big_all, NULL));
}
static void test_matrix_3_ranks(void **state)
{
    run_coll(*state, 3, matrix_args(NULL, big_min));
}
static void test_matrix_4_ranks(void **state)
{
    run_coll(*state, 4, matrix_args(NULL, big_min));
}
static void test_matrix_8_ranks(void **state)
{
    run_coll(*state, 8, matrix_args(NULL, big_min));
}

/* Ordinary memory (malloc, not colld_mem_alloc) for every kind, dtype and op at the small
 * counts: libcolld stages it, including the in-place slice forms of all-gather and
 * reduce-scatter. */
static void test_matrix_malloc_buffers(void **state)
{
    const char *extra[] = { "--malloc", "--no-big", NULL };
    run_coll(*state, 3, extra);
}

/* Four communicators of 8 ranks each (32 processes) at once, each starting with a different
 * collective and using its own data, so different kinds overlap in the daemon; all exact. Under
 * TSan (COLLD_TEST_NO_BIG) one pass of three dtypes (an integer, a half, a double) instead of two
 * of every dtype: 32 instrumented processes took 40 s on 2 cores, and races do not depend on the
 * type. */
static void test_four_comms_concurrently(void **state)
{
    harness_t *h = *state;
    pid_t pids[4][8];
    char salt[4][16], rot[4][16];
    double t0 = harness_now_ms();
    for (int c = 0; c < 4; c++) {
        snprintf(salt[c], sizeof(salt[c]), "%d", 100 + c);
        snprintf(rot[c], sizeof(rot[c]), "%d", c);
        bool tsan = harness_test_size() == HARNESS_SIZE_NO_BIG;
        const char *extra[] = { "--no-big", "--salt",   salt[c], "--rotate", rot[c], "--iters", tsan ? "1" : "2",
                                tsan ? "--dtypes" : NULL, "int32,bfloat16,float64", NULL };
        assert_int_equal(harness_spawn_coll(h, 8, extra, pids[c]), 0);
    }
    int bad = 0;
    for (int c = 0; c < 4; c++)
        bad += harness_wait_all(pids[c], 8, RUN_LIMIT_MS);
    print_message("4 communicators x 8 ranks: %.0f ms\n", harness_now_ms() - t0);
    assert_int_equal(bad, 0);
}

/* ---------------------------------------------------------------------------------------------
 * Many small all-reduces: the daemon's memory stays flat
 * ------------------------------------------------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

/* A daemon for measuring memory. Under AddressSanitizer its quarantine holds every freed block
 * back from reuse (up to 256 MiB), so resident memory would grow with any malloc/free churn:
 * start this daemon with the quarantine off, so only memory still in use counts. */
static int setup_memory(void **state)
{
#ifdef UNDER_ASAN
    const char *old = getenv("ASAN_OPTIONS");
    char *saved = old ? strdup(old) : NULL, opts[1024];
    snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=0:thread_local_quarantine_size_kb=0", old ? old : "",
             old && old[0] ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    int rc = harness_test_setup(state);
    if (saved)
        setenv("ASAN_OPTIONS", saved, 1);
    else
        unsetenv("ASAN_OPTIONS");
    free(saved);
    return rc;
#else
    return harness_test_setup(state);
#endif
}

/* VmRSS of a process in KiB, -1 if unreadable. */
static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* Wait for rank 0 to reach checkpoint k, measure the daemon, let rank 0 go on. */
static long measure_at(harness_t *h, int k)
{
    char at[400], go[400];
    snprintf(at, sizeof(at), "%s/at-%d", h->dir, k);
    snprintf(go, sizeof(go), "%s/go-%d", h->dir, k);
    if (harness_wait_file(at, RUN_LIMIT_MS) < 0)
        return -1;
    long kb = rss_kb(h->pid);
    FILE *f = fopen(go, "w");
    if (f)
        fclose(f);
    return kb;
}

/* 10,000 small all-reduces (every dtype and op, counts 1..64, in and out of place, each checked)
 * by 2 ranks; the daemon's RSS after a warm-up of 1,000 and at the end (communicator still
 * alive) may differ by at most RSS_GROWTH_LIMIT_KB. */
static void test_10000_small_allreduces_memory_flat(void **state)
{
    harness_t *h = *state;
    pid_t pids[2];
    const char *extra[] = { "--mode",     "small",      "--iters", "10000", "--checkpoints",
                            "1000,10000", "--sync-dir", h->dir,    NULL };
    long before = rss_kb(h->pid);
    double t0 = harness_now_ms();
    assert_int_equal(harness_spawn_coll(h, 2, extra, pids), 0);
    long warm = measure_at(h, 1000);
    double t1 = harness_now_ms();
    long end = measure_at(h, 10000);
    double t2 = harness_now_ms();
    int bad = harness_wait_all(pids, 2, RUN_LIMIT_MS);
    print_message("daemon VmRSS: %ld KiB at start, %ld KiB after 1,000, %ld KiB after 10,000 all-reduces "
                  "(growth %ld KiB, limit %d KiB); 9,000 all-reduces in %.0f ms (%.1f us each), %.0f ms in all\n",
                  before, warm, end, end - warm, RSS_GROWTH_LIMIT_KB, t2 - t1, (t2 - t1) * 1000.0 / 9000.0,
                  harness_now_ms() - t0);
    assert_int_equal(bad, 0);
    assert_true(warm > 0 && end > 0);
    assert_true(end - warm < RSS_GROWTH_LIMIT_KB);
}

/* ---------------------------------------------------------------------------------------------
 * Groups
 * ------------------------------------------------------------------------------------------- */

/* 64 mixed collectives (every kind, dtype, op, both roots, in and out of place, one of count 0)
 * in one group, three times, on 2 ranks: every result exact. */
static void test_group_of_64_mixed(void **state)
{
    const char *extra[] = { "--mode", "group", "--group-size", "64", "--iters", "3", NULL };
    run_coll(*state, 2, extra);
}

/* A group with one invalid call: the call and colld_group_end return
 * COLLD_ERR_INVALID_ARGUMENT, none of the group's valid collectives runs, and the communicator
 * stays usable and in step (an all-reduce and a group of 16 afterwards are exact). */
static void test_group_with_invalid_call(void **state)
{
    const char *extra[] = { "--mode", "group-invalid", "--group-size", "12", NULL };
    run_coll(*state, 2, extra);
}

/* ---------------------------------------------------------------------------------------------
 * Bad input of the new collectives (beyond test_faults.c)
 * ------------------------------------------------------------------------------------------- */

/* Errors that need several ranks: all-gather/reduce-scatter buffers that hold count but not
 * nranks x count, nranks x count overflowing, roots equal to nranks, the root's own NULL or short
 * buffer, unknown op/dtype and a stream on the new collectives; afterwards the communicator
 * works and stays in step. */
static void test_bad_arguments_multi_rank(void **state)
{
    const char *extra[] = { "--mode", "badargs", NULL };
    run_coll(*state, 3, extra);
}

/* Two ranks call different collectives for the same sequence number: both get
 * COLLD_ERR_MISMATCH, the detail names each rank's call (with needle_a and needle_b). */
static void expect_mismatch(harness_t *h, const char *call0, const char *call1, const char *needle_a,
                            const char *needle_b)
{
    char hex[HARNESS_UID_HEX_LEN], out[2][400], text[2][2048];
    assert_int_equal(harness_new_uid_hex(h, hex), 0);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        snprintf(out[r], sizeof(out[r]), "%s/mismatch-%.32s-%d", h->dir, hex, r);
        const char *argv[] = { COLL_BIN,
                               "--socket",
                               h->socket,
                               "--uid",
                               hex,
                               "--nranks",
                               "2",
                               "--rank",
                               r ? "1" : "0",
                               "--mode",
                               "call",
                               "--call",
                               r ? call1 : call0,
                               "--expect",
                               "COLLD_ERR_MISMATCH",
                               "--out",
                               out[r],
                               NULL };
        assert_true((pids[r] = harness_spawn(argv)) > 0);
    }
    assert_int_equal(harness_wait_all(pids, 2, 60000), 0);
    for (int r = 0; r < 2; r++) {
        FILE *f = fopen(out[r], "r");
        assert_non_null(f);
        size_t n = fread(text[r], 1, sizeof(text[r]) - 1, f);
        text[r][n] = '\0';
        fclose(f);
        print_message("%s", text[r]);
        assert_non_null(strstr(text[r], needle_a));
        assert_non_null(strstr(text[r], needle_b));
    }
}

/* Mismatches that only the new collectives can have: root (broadcast, reduce), all-gather
 * against reduce-scatter, the op of a reduce-scatter, the count of a reduce; the daemon serves
 * on. (Broadcast and all-gather have no op, all-gather and reduce-scatter no root: those never
 * mismatch, which every matrix run relies on.) */
static void test_mismatch_new_collectives(void **state)
{
    harness_t *h = *state;
    expect_mismatch(h, "broadcast:float32:sum:100:0", "broadcast:float32:sum:100:1",
                    "rank 0: broadcast(float32, -, count 100, root 0)",
                    "rank 1: broadcast(float32, -, count 100, root 1)");
    expect_mismatch(h, "reduce:int64:max:100:1", "reduce:int64:max:100:0", "root 1)", "root 0)");
    expect_mismatch(h, "allgather:int32:sum:64:0", "reducescatter:int32:sum:64:0", "rank 0: allgather(",
                    "rank 1: reducescatter(");
    expect_mismatch(h, "reducescatter:float32:sum:64:0", "reducescatter:float32:max:64:0",
                    "reducescatter(float32, sum,", "reducescatter(float32, max,");
    expect_mismatch(h, "reduce:int8:sum:10:0", "reduce:int8:sum:11:0", "count 10,", "count 11,");
    const char *extra[] = { "--no-big", "--kinds", "broadcast,reduce,allgather,reducescatter",
                            "--dtypes", "float32", NULL };
    run_coll(h, 2, extra);
}

/* ---------------------------------------------------------------------------------------------
 * The premultiplied sum (the matrices above run it too, small counts mostly on the fast area)
 * ------------------------------------------------------------------------------------------- */

/* Every dtype and reducing kind of premul_sum, each rank with its own scalar, in and out of place,
 * at counts 0, 1 and 1001 through the engine (the daemon has no fast area here): results bitwise
 * the oracle's. */
static int setup_no_fast_path(void **state)
{
    static const char *const extra[] = { "--fast-path-bytes", "0", NULL };
    return harness_test_setup_args(state, extra);
}

static const char *const premul_engine[] = { "--ops",    "premul_sum", "--kinds", "allreduce,reduce,reducescatter",
                                             "--no-big", NULL };

static void test_premul_engine_2_ranks(void **state)
{
    run_coll(*state, 2, premul_engine);
}
static void test_premul_engine_3_ranks(void **state)
{
    run_coll(*state, 3, premul_engine);
}
static void test_premul_engine_4_ranks(void **state)
{
    run_coll(*state, 4, premul_engine);
}

/* Operators used wrongly on 3 ranks (coll_rank.c mode premul-bad): each refused with a detail
 * naming what is wrong, nothing posted; then exact premultiplied sums, also in a group whose
 * operators are destroyed before colld_group_end. */
static void test_premul_bad_input(void **state)
{
    const char *extra[] = { "--mode", "premul-bad", NULL };
    run_coll(*state, 3, extra);
}

/* A premultiplied sum against a sum is a mismatch naming both ops (different scalars are not:
 * every matrix run relies on that). */
static void test_premul_mismatch(void **state)
{
    harness_t *h = *state;
    expect_mismatch(h, "allreduce:float32:premul_sum:64:0", "allreduce:float32:sum:64:0",
                    "rank 0: allreduce(float32, premul_sum, count 64, root 0)",
                    "rank 1: allreduce(float32, sum, count 64, root 0)");
    expect_mismatch(h, "reducescatter:int32:avg:5000:0", "reducescatter:int32:premul_sum:5000:0",
                    "reducescatter(int32, avg,", "reducescatter(int32, premul_sum,");
}

/* colld_comm_split (coll_rank.c mode split): 5 ranks into colors 0 (ranks 0, 2) and 1
 * (1, 3) in reverse order, rank 4 with no color; each group runs exact collectives of every kind,
 * then the parent and a split with one color run exact all-reduces. 2 ranks: two groups of one. */
static void test_split(void **state)
{
    harness_t *h = *state;
    const char *extra[] = { "--mode", "split", "--no-big", "--dtypes", "float32,int64,bfloat16", NULL };
    run_coll(h, 5, extra);
    run_coll(h, 2, extra);
}

/* colld_barrier (coll_rank.c mode barrier): 4 ranks, three rounds, a different rank late in
 * each; no rank leaves a barrier before the late one entered it. */
static void test_barrier(void **state)
{
    harness_t *h = *state;
    char dir[400];
    snprintf(dir, sizeof(dir), "%s/barrier", h->dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    const char *extra[] = { "--mode", "barrier", "--sync-dir", dir, NULL };
    run_coll(h, 4, extra);
}

/* Per-operation completion (coll_rank.c mode ops), 3 ranks. */
static void test_per_op_completion(void **state)
{
    const char *extra[] = { "--mode", "ops", NULL };
    run_coll(*state, 3, extra);
}

/* Run mode nan on 3 ranks with the poison given, expecting COLLD_ERR_NUMERIC with `detail` on every
 * rank; with `comm_check` the ranks ask for the checks in their communicator's config. */
static void expect_numeric_how(harness_t *h, const char *call, const char *poison, const char *detail, bool comm_check)
{
    char out[3][400], text[1024], nr[4] = "3", rk[4], hex[HARNESS_UID_HEX_LEN];
    pid_t p[3];
    assert_int_equal(harness_new_uid_hex(h, hex), 0);
    for (int r = 0; r < 3; r++) {
        snprintf(rk, sizeof(rk), "%d", r);
        snprintf(out[r], sizeof(out[r]), "%s/nan-%d", h->dir, r);
        const char *argv[] = { COLL_BIN,
                               "--socket",
                               h->socket,
                               "--uid",
                               hex,
                               "--nranks",
                               nr,
                               "--rank",
                               rk,
                               "--mode",
                               "nan",
                               "--call",
                               call,
                               "--poison",
                               poison,
                               "--expect",
                               "COLLD_ERR_NUMERIC",
                               "--out",
                               out[r],
                               comm_check ? "--comm-nan-check" : NULL,
                               NULL };
        assert_true((p[r] = harness_spawn(argv)) > 0);
    }
    assert_int_equal(harness_wait_all(p, 3, RUN_LIMIT_MS), 0);
    for (int r = 0; r < 3; r++) {
        harness_read_file(out[r], text, sizeof(text));
        print_message("%s", text);
        assert_non_null(strstr(text, detail));
    }
}

static void expect_numeric(harness_t *h, const char *call, const char *poison, const char *detail)
{
    expect_numeric_how(h, call, poison, detail, false);
}

/* --nan-check (issue 18): a float32 all-reduce with a NaN and a -Inf on two ranks fails on every
 * rank with COLLD_ERR_NUMERIC naming both, small (no fast area under --nan-check) and large (the
 * first bad element found across parallel chunks); clean inputs and integers run. */
static void test_nan_check(void **state)
{
    harness_t *h = *state;
    expect_numeric(h, "allreduce:float32:sum:1000:0", "1:7:nan,2:3:-inf",
                   "rank 1 contributed NaN at element 7; rank 2 contributed -Inf at element 3 (allreduce float32");
    expect_numeric(h, "allreduce:float32:sum:3000001:0", "0:2999999:inf,1:1500000:nan,1:2000000:nan",
                   "rank 0 contributed +Inf at element 2999999; rank 1 contributed NaN at element 1500000");
    const char *clean[] = { "--mode", "nan", "--call", "allreduce:float32:sum:3000001:0", NULL };
    run_coll(h, 3, clean);
}

/* Without --nan-check a NaN is just data: the same poisoned all-reduce completes. */
static void test_nan_without_check(void **state)
{
    const char *extra[] = { "--mode", "nan", "--poison", "1:7:nan,2:3:-inf", NULL };
    run_coll(*state, 3, extra);
}

/* The checks for one communicator (colld_comm_config_t.nan_check) on a daemon without --nan-check:
 * that communicator's poisoned all-reduces fail as under the daemon's option (small ones too: it
 * has no fast area), and a communicator that did not ask still takes a NaN as data beside it. */
static void test_nan_check_per_comm(void **state)
{
    harness_t *h = *state;
    expect_numeric_how(h, "allreduce:float32:sum:1000:0", "1:7:nan,2:3:-inf",
                       "rank 1 contributed NaN at element 7; rank 2 contributed -Inf at element 3 (allreduce float32",
                       true);
    expect_numeric_how(h, "allreduce:float32:sum:3000001:0", "2:2999999:nan",
                       "rank 2 contributed NaN at element 2999999", true);
    const char *unchecked[] = { "--mode", "nan", "--poison", "1:7:nan,2:3:-inf", NULL };
    run_coll(h, 3, unchecked);
}

/* Two ranks, two communicators, crossed (coll_rank.c mode crossed), under a daemon started with
 * `extra`: each rank's status must be `expect` and its detail contain `want`. */
static void run_crossed(harness_t *h, const char *timeout_ms, const char *expect, const char *want)
{
    char out[2][400], text[2048];
    pid_t p[2];
    assert_int_equal(harness_spawn_crossed(h, timeout_ms, expect, out, p), 0);
    double t0 = harness_now_ms();
    assert_int_equal(harness_wait_all(p, 2, RUN_LIMIT_MS), 0);
    print_message("both ranks got %s after %.0f ms\n", expect, harness_now_ms() - t0);
    for (int r = 0; r < 2; r++) {
        harness_read_file(out[r], text, sizeof(text));
        print_message("%s", text);
        assert_non_null(strstr(text, want));
    }
}

/* Cross-communicator deadlock (issue 18) with --deadlock-fail: rank 0 waits in communicator A for
 * rank 1, which waits in communicator B for rank 0; both fail with COLLD_ERR_DEADLOCK naming the
 * cycle, long before their 120 s timeout. */
static void test_deadlock_fails(void **state)
{
    harness_t *h = *state;
    run_crossed(h, "120000", "COLLD_ERR_DEADLOCK", "deadlock across communicators: rank ");
    char log[65536];
    harness_read_file(h->log, log, sizeof(log));
    assert_non_null(strstr(log, "deadlock across communicators"));
}

/* The default reports only: the cycle is logged (and an event), and the ranks get their
 * communicators' timeout as before. */
static void test_deadlock_reported(void **state)
{
    harness_t *h = *state;
    run_crossed(h, "4000", "COLLD_ERR_TIMEOUT", "never arrived");
    char log[65536];
    harness_read_file(h->log, log, sizeof(log));
    assert_non_null(strstr(log, "deadlock across communicators"));
    assert_non_null(strstr(log, "'crossed-2'"));
}

static int setup_deadlock_fail(void **state)
{
    static const char *const extra[] = { "--deadlock-ms", "500", "--deadlock-fail", NULL };
    return harness_test_setup_args(state, extra);
}

static int setup_deadlock_report(void **state)
{
    static const char *const extra[] = { "--deadlock-ms", "500", NULL };
    return harness_test_setup_args(state, extra);
}

/* Result verification (issue 30 item 3): 3 ranks ask for it in their communicator's config
 * (colld_comm_config_t.verify_results; the daemon has no --verify-results), and the daemon's test
 * hook --test-corrupt-result 1:7000 flips element 7000 of rank 1's all-reduce result after the
 * reduction. A float32 all-reduce of 10000 elements (run at once) and one of 3000001 (queued in
 * turns) fail on every rank with COLLD_ERR_CORRUPTED and the same detail naming rank 1, its pid and
 * the element; all-reduces of at most 7000 elements are untouched by the hook and complete. */
static void test_verify_corrupted(void **state)
{
#ifndef COLLD_TEST_HOOKS
    (void)state;
    skip(); /* this build has no test hooks (-DCOLLD_TEST_HOOKS=OFF) */
#else
    harness_t *h = *state;
    const char *calls[] = { "allreduce:float32:sum:10000:0", "allreduce:float32:sum:3000001:0" };
    for (int c = 0; c < 2; c++) {
        char out[3][400], text[3][1024], rk[4], hex[HARNESS_UID_HEX_LEN], want[200];
        pid_t p[3];
        assert_int_equal(harness_new_uid_hex(h, hex), 0);
        for (int r = 0; r < 3; r++) {
            snprintf(rk, sizeof(rk), "%d", r);
            snprintf(out[r], sizeof(out[r]), "%s/verify-%d", h->dir, r);
            const char *argv[] = { COLL_BIN,   "--socket", h->socket,       "--uid",    hex,
                                   "--nranks", "3",        "--rank",        rk,         "--mode",
                                   "call",     "--call",   calls[c],        "--expect", "COLLD_ERR_CORRUPTED",
                                   "--out",    out[r],     "--comm-verify", NULL };
            assert_true((p[r] = harness_spawn(argv)) > 0);
        }
        assert_int_equal(harness_wait_all(p, 3, RUN_LIMIT_MS), 0);
        snprintf(want, sizeof(want),
                 "result verification: rank 1 (pid %d) result differs from rank 0's from element 7000 (XXH3 ",
                 (int)p[1]);
        for (int r = 0; r < 3; r++) {
            harness_read_file(out[r], text[r], sizeof(text[r]));
            print_message("%s", text[r]);
            const char *d = strstr(text[r], "result verification: ");
            assert_non_null(d);
            assert_int_equal(strncmp(d, want, strlen(want)), 0);
            assert_non_null(strstr(d, ") (allreduce float32, 2 of 3 ranks agree)\n"));
            assert_string_equal(d, strstr(text[0], "result verification: ")); /* the same on every rank */
        }
    }
    const char *untouched[] = { "--mode", "call", "--call", "allreduce:float32:sum:7000:0", "--comm-verify", NULL };
    run_coll(h, 3, untouched);
#endif
}

/* The daemon's --verify-results on clean data: the all-reduces of the matrix (counts 0, 1, 1001,
 * in place and not) and a large one on 3 ranks, and a 2-rank one, complete exactly. */
static void test_verify_clean(void **state)
{
    const char *matrix[] = { "--kinds", "allreduce", "--no-big", NULL };
    run_coll(*state, 3, matrix);
    const char *big[] = { "--mode", "call", "--call", "allreduce:float32:sum:3000001:0", NULL };
    run_coll(*state, 3, big);
    run_coll(*state, 2, big);
}

static int setup_verify_hook(void **state)
{
#ifdef COLLD_TEST_HOOKS
    static const char *const extra[] = { "--test-corrupt-result", "1:7000", NULL };
#else
    static const char *const extra[] = { NULL };
#endif
    return harness_test_setup_args(state, extra);
}

static int setup_verify(void **state)
{
    static const char *const extra[] = { "--verify-results", NULL };
    return harness_test_setup_args(state, extra);
}

static int setup_nan_check(void **state)
{
    static const char *const extra[] = { "--nan-check", NULL };
    return harness_test_setup_args(state, extra);
}

/* Every test gets its own daemon (harness_test_setup/teardown). */
int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1) /* only the tests whose names match (cmocka's filter, * as a wildcard) */
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_matrix_1_rank, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_matrix_2_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_matrix_3_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_matrix_4_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_matrix_8_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_matrix_malloc_buffers, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_premul_engine_2_ranks, setup_no_fast_path, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_premul_engine_3_ranks, setup_no_fast_path, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_premul_engine_4_ranks, setup_no_fast_path, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_premul_bad_input, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_premul_mismatch, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_four_comms_concurrently, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_10000_small_allreduces_memory_flat, setup_memory, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_group_of_64_mixed, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_group_with_invalid_call, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_bad_arguments_multi_rank, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_new_collectives, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_split, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_barrier, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_per_op_completion, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_nan_check, setup_nan_check, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_nan_without_check, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_nan_check_per_comm, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_verify_corrupted, setup_verify_hook, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_verify_clean, setup_verify, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_deadlock_fails, setup_deadlock_fail, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_deadlock_reported, setup_deadlock_report, harness_test_teardown),
    };
    return cmocka_run_group_tests_name("collectives", tests, NULL, NULL);
}
