/*
 * test_gpu_p2p.c - sends and receives on GPU buffers, stream-ordered (issue 16 item 1), through a
 * real colld daemon with real rank processes (colld-test-gpu-p2p, see gpu_p2p_rank.c), every
 * result compared bitwise. The CUDA driver API only (gpu_cu.h), so the same program runs on a real
 * GPU (ctest label hardware; exits 77, skipped, when no driver or no GPU is found) and on the CUDA
 * driver test double (label gpu, cudafake).
 *
 *   test_gpu_p2p [exchange|stream|fault|nopeer|all] [--gpus N] [--cudafake]
 *
 *  --gpus N    rank r on GPU r % N (default 1); N GPUs must be visible.
 *  --cudafake  the libcuda.so.1 found must be the CUDA driver test double (checked before any CUDA
 *              call, here and in every rank, and the daemon must map no other libcuda).
 *
 *  exchange  a ring exchange and a self-send in groups on 2, 3 and 4 ranks (cuMemAlloc buffers) and
 *            on 2 ranks with colld_mem_alloc(COLLD_MEM_CUDA) buffers (VMM where the GPU has it),
 *            every dtype class and counts {0, 1, 1001, 65539}; rank-ordered sends without groups on
 *            3 ranks; colld_alltoallv with uneven counts (some 0) on 3 and 4 ranks, on a stream and
 *            on the legacy default stream (stream NULL).
 *  stream    producer kernel -> send/receive group -> consumer kernel on each rank's stream, no
 *            host wait in between; the host calls return while a slow producer still runs.
 *  fault     2 ranks: a size mismatch (COLLD_ERR_MISMATCH naming both calls), a send whose stream
 *            never gets there within the timeout (COLLD_ERR_TIMEOUT naming rank 0's stream), a send
 *            from GPU memory to a receive into host memory (COLLD_ERR_NOT_SUPPORTED naming both),
 *            and kill -9 of a rank while its peer's stream waits in a receive, before and after the
 *            pair was matched (released, COLLD_ERR_PEER_LOST); each time every stream is released
 *            and the daemon is left clean. And a matched send held by a stream that waits in another
 *            communicator's all-reduce, which waits for the sender's stream: the deadlock check
 *            (--deadlock-fail) fails both communicators with COLLD_ERR_DEADLOCK naming the send.
 *  nopeer    (the double only: GPUs in two peer groups) a send between GPUs without peer access
 *            is refused with COLLD_ERR_NOT_SUPPORTED saying so, both streams released.
 */
#include "tests/gpu/gpu_cu.h"
#include "tests/gpu/gpu_driver.h"
#include "tests/integration/harness.h"
#include "tests/integration/harness_double.h"

#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define MAX_PROCS 4
#define RUN_LIMIT_MS 600000
#define FAULT_TIMEOUT_MS 3000 /* the communicator timeout of the fault tests */
#define DOUBLE_SPIN_MS "1000" /* the stream test's slow producer on the double */

static gpu_driver_t drv; /* the run's settings (main): every rank gets drv.common_args */

/* Spawn `nranks` rank processes of one new communicator; extra arguments go to every rank. */
static int spawn_ranks(harness_t *h, int nranks, const char *const *extra, pid_t *pids)
{
    char hex[HARNESS_UID_HEX_LEN], nr[16], rk[16];
    if (harness_new_uid_hex(h, hex) < 0)
        return -1;
    snprintf(nr, sizeof(nr), "%d", nranks);
    for (int r = 0; r < nranks; r++) {
        const char *argv[48] = { GPU_P2P_BIN, "--socket", h->socket, "--uid", hex, "--nranks", nr, "--rank", rk };
        gpu_driver_add_args(&drv, argv, 9, extra);
        snprintf(rk, sizeof(rk), "%d", r);
        if ((pids[r] = harness_spawn(argv)) < 0)
            return -1;
    }
    return 0;
}

/* Run one communicator of ranks to the end; every rank must exit 0, the daemon be left clean. */
static void run_ranks(harness_t *h, int nranks, const char *const *extra)
{
    pid_t pids[MAX_PROCS];
    double t0 = harness_now_ms();
    assert_int_equal(spawn_ranks(h, nranks, extra, pids), 0);
    assert_int_equal(harness_wait_all(pids, nranks, RUN_LIMIT_MS), 0);
    print_message("%d rank(s): %.0f ms\n", nranks, harness_now_ms() - t0);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
    assert_true(gpu_driver_daemon_ok(&drv, h->pid));
}

/* ---------------------------------------------------------------------------------------------
 * Exchanges
 * ------------------------------------------------------------------------------------------- */

static void test_ring_2_ranks(void **state)
{
    const char *extra[] = { "--mode", "ring", NULL };
    run_ranks(*state, 2, extra);
}

static void test_ring_3_ranks(void **state)
{
    const char *extra[] = { "--mode", "ring", NULL };
    run_ranks(*state, 3, extra);
}

static void test_ring_4_ranks(void **state)
{
    const char *extra[] = { "--mode", "ring", NULL };
    run_ranks(*state, 4, extra);
}

static void test_ring_colld_mem_alloc(void **state)
{
    const char *extra[] = { "--mode", "ring", "--alloc", "colld", NULL };
    run_ranks(*state, 2, extra);
}

static void test_pairs_without_groups(void **state)
{
    const char *extra[] = { "--mode", "pairs", NULL };
    run_ranks(*state, 3, extra);
}

static void test_alltoallv_3_ranks(void **state)
{
    const char *extra[] = { "--mode", "alltoallv", NULL };
    run_ranks(*state, 3, extra);
}

static void test_alltoallv_4_ranks_colld_mem_alloc(void **state)
{
    const char *extra[] = { "--mode", "alltoallv", "--alloc", "colld", NULL };
    run_ranks(*state, 4, extra);
}

/* ---------------------------------------------------------------------------------------------
 * Stream semantics
 * ------------------------------------------------------------------------------------------- */

static void test_stream_semantics(void **state)
{
    const char *extra[] = { "--mode", "stream", drv.cudafake ? "--spin-ms" : NULL, DOUBLE_SPIN_MS, NULL };
    run_ranks(*state, 2, extra);
}

static void test_stream_semantics_3_ranks_colld_mem_alloc(void **state)
{
    const char *extra[] = { "--mode",       "stream", "--alloc", "colld", drv.cudafake ? "--spin-ms" : NULL,
                            DOUBLE_SPIN_MS, NULL };
    run_ranks(*state, 3, extra);
}

/* ---------------------------------------------------------------------------------------------
 * Faults
 * ------------------------------------------------------------------------------------------- */

static void run_scene(harness_t *h, const char *scene)
{
    char timeout[16];
    snprintf(timeout, sizeof(timeout), "%d", FAULT_TIMEOUT_MS);
    const char *extra[] = { "--mode", "fault", "--scene", scene, "--timeout-ms", timeout, NULL };
    run_ranks(h, 2, extra);
}

static void test_fault_mismatch(void **state)
{
    run_scene(*state, "mismatch");
}
static void test_fault_timeout(void **state)
{
    run_scene(*state, "timeout");
}
static void test_fault_gpu_to_host(void **state)
{
    run_scene(*state, "host");
}
static void test_nopeer(void **state)
{
    run_scene(*state, "nopeer");
}

/* Rank 1 waits on its stream in a receive from rank 0, which is killed (-9): before posting its
 * send, or (victim_posts) after posting it behind a long spin, so that the pair is matched and held
 * for rank 0's stream. Rank 1's stream must be released with COLLD_ERR_PEER_LOST. */
static void run_victim(harness_t *h, bool victim_posts)
{
    char uid[HARNESS_UID_HEX_LEN], rk[2][4], timeout[16], path[400];
    pid_t pids[2];
    snprintf(timeout, sizeof(timeout), "%d", FAULT_TIMEOUT_MS * 10); /* the kill, not the timer, releases it */
    assert_int_equal(harness_new_uid_hex(h, uid), 0);
    for (int r = 0; r < 2; r++) {
        snprintf(rk[r], sizeof(rk[r]), "%d", r);
        const char *argv[48] = { GPU_P2P_BIN, "--socket", h->socket, "--uid", uid, "--nranks", "2", "--rank", rk[r] };
        const char *extra[] = { "--mode",
                                "fault",
                                "--scene",
                                "victim",
                                "--sync-dir",
                                h->dir,
                                "--timeout-ms",
                                timeout,
                                victim_posts ? "--victim-posts" : NULL,
                                NULL };
        gpu_driver_add_args(&drv, argv, 9, extra);
        assert_true((pids[r] = harness_spawn(argv)) > 0);
    }
    const char *marks[] = { "posted-1", "victim-ready" };
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", h->dir, marks[i]);
        if (harness_wait_file(path, 120000) < 0) {
            kill(pids[0], SIGKILL);
            kill(pids[1], SIGKILL);
            harness_wait_all(pids, 2, 10000);
            fail_msg("no %s within 120 s", marks[i]);
        }
    }
    usleep(300 * 1000); /* rank 1's stream waits in its receive now */
    double killed = harness_now_ms();
    assert_int_equal(kill(pids[0], SIGKILL), 0);
    assert_int_equal(harness_wait(pids[0], 10000), 128 + SIGKILL);
    assert_int_equal(harness_wait(pids[1], RUN_LIMIT_MS), 0);
    char text[128] = "";
    double at = 0;
    snprintf(path, sizeof(path), "%s/released-1", h->dir);
    harness_read_file(path, text, sizeof(text));
    assert_int_equal(sscanf(text, "%lf", &at), 1);
    print_message("rank 1's stream released %.1f ms after the kill (timeout %s ms)\n", at - killed, timeout);
    assert_true(at - killed < FAULT_TIMEOUT_MS); /* by the kill, long before the timeout */
    assert_int_equal(harness_wait_clean(h, 10000), 0);
    assert_true(gpu_driver_daemon_ok(&drv, h->pid));
}

static void test_fault_kill_before_send(void **state)
{
    run_victim(*state, false);
}
static void test_fault_kill_matched_send(void **state)
{
    run_victim(*state, true);
}

/* A send and an all-reduce of two communicators in crossed orders on two ranks' streams
 * (gpu_p2p_rank.c --mode crossed), against a daemon with --deadlock-ms 500 --deadlock-fail: the
 * matched send waits for rank 1's stream, held in the all-reduce, which waits for rank 0's stream,
 * held in the send. Both communicators fail with COLLD_ERR_DEADLOCK naming the send, long before
 * the 60 s timeout. */
static void test_deadlock_send_and_collective(void **state)
{
    harness_t *h = *state;
    char a[HARNESS_UID_HEX_LEN], b[HARNESS_UID_HEX_LEN], rk[2][4];
    pid_t pids[2];
    assert_int_equal(harness_new_uid_hex(h, a), 0);
    assert_int_equal(harness_new_uid_hex(h, b), 0);
    for (int r = 0; r < 2; r++) {
        snprintf(rk[r], sizeof(rk[r]), "%d", r);
        const char *argv[48] = { GPU_P2P_BIN, "--socket",     h->socket, "--uid",  a,     "--uid2",
                                 b,           "--nranks",     "2",       "--rank", rk[r], "--mode",
                                 "crossed",   "--timeout-ms", "60000" };
        gpu_driver_add_args(&drv, argv, 15, NULL);
        assert_true((pids[r] = harness_spawn(argv)) > 0);
    }
    assert_int_equal(harness_wait_all(pids, 2, RUN_LIMIT_MS), 0);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
    assert_true(gpu_driver_daemon_ok(&drv, h->pid));
}

static int setup_deadlock(void **state)
{
    static const char *const extra[] = { "--deadlock-ms", "500", "--deadlock-fail", NULL };
    return harness_test_setup_args(state, extra);
}

/* ---------------------------------------------------------------------------------------------
 * Main
 * ------------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    static const char *const groups[] = { "exchange", "stream", "fault", "nopeer", NULL };
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = gpu_driver_start(&drv, argc, argv, groups);
    if (rc >= 0)
        return rc;
    if (!strcmp(drv.group, "nopeer") && !drv.cudafake) {
        printf("SKIP: the nopeer group needs the CUDA driver test double's peer groups\n");
        return 77;
    }
#define T(fn) cmocka_unit_test_setup_teardown(fn, harness_test_setup, harness_test_teardown)
    const struct CMUnitTest exchange[] = {
        T(test_ring_2_ranks),
        T(test_ring_3_ranks),
        T(test_ring_4_ranks),
        T(test_ring_colld_mem_alloc),
        T(test_pairs_without_groups),
        T(test_alltoallv_3_ranks),
        T(test_alltoallv_4_ranks_colld_mem_alloc),
    };
    const struct CMUnitTest stream[] = { T(test_stream_semantics), T(test_stream_semantics_3_ranks_colld_mem_alloc) };
    const struct CMUnitTest fault[] = {
        T(test_fault_mismatch),
        T(test_fault_timeout),
        T(test_fault_gpu_to_host),
        T(test_fault_kill_before_send),
        T(test_fault_kill_matched_send),
        cmocka_unit_test_setup_teardown(test_deadlock_send_and_collective, setup_deadlock, harness_test_teardown),
    };
    const struct CMUnitTest nopeer[] = { T(test_nopeer) };
#undef T
    gpu_driver_say(&drv);
    int failed = 0;
    if (gpu_driver_runs(&drv, "exchange"))
        failed += cmocka_run_group_tests_name("gpu_p2p_exchange", exchange, NULL, NULL);
    if (gpu_driver_runs(&drv, "stream"))
        failed += cmocka_run_group_tests_name("gpu_p2p_stream", stream, NULL, NULL);
    if (gpu_driver_runs(&drv, "fault"))
        failed += cmocka_run_group_tests_name("gpu_p2p_fault", fault, NULL, NULL);
    if (!strcmp(drv.group, "nopeer")) /* only by name: it needs the double's peer groups */
        failed += cmocka_run_group_tests_name("gpu_p2p_nopeer", nopeer, NULL, NULL);
    return failed ? 1 : 0;
}
