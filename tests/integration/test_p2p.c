/*
 * test_p2p.c - point-to-point operations (colld_send, colld_recv, colld_alltoallv) through a real
 * colld daemon with real rank processes (colld-test-p2p, see p2p_rank.c), every result compared
 * bitwise:
 *  - ring exchanges in groups (both neighbours and the rank itself) for every dtype and count
 *    {0, 1, 1001, >= 4 MiB}, on 1 to 4 ranks, with colld_mem_alloc memory and with ordinary
 *    (staged) memory;
 *  - PyTorch's send/recv pattern without groups; sends and receives between collectives of the
 *    fast area and of the engine (the collective ordinal); all-to-all with uneven counts;
 *    per-operation completion of a receive;
 *  - sends and receives that progress per peer (issue 25): a ring outside groups on 3 and 4 ranks
 *    (each rank sends right, receives left, waits for both), two ranks that both send first and
 *    then receive outside a group;
 *  - faults: a receive whose sender never sends (COLLD_ERR_TIMEOUT naming it), mismatched sizes
 *    (COLLD_ERR_MISMATCH naming both calls), two ranks that send to each other and never receive
 *    (COLLD_ERR_TIMEOUT), a killed sender (COLLD_ERR_PEER_LOST naming its pid) while another
 *    communicator keeps running; client-side refusals. After each fault the daemon is left clean.
 *    collctl status and doctor name a receive whose send never comes while it waits.
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

#define MAX_PROCS 8
#define RUN_LIMIT_MS 600000 /* per group of rank processes; generous for sanitizer builds */

/* Spawn `nranks` colld-test-p2p processes joining one new communicator; extra arguments
 * (NULL-terminated) go to every rank. Pids in pids[]. Returns 0 or -1. */
static int spawn_p2p(harness_t *h, int nranks, const char *const *extra, pid_t *pids)
{
    char hex[HARNESS_UID_HEX_LEN], nr[16], rk[16];
    if (harness_new_uid_hex(h, hex) < 0)
        return -1;
    snprintf(nr, sizeof(nr), "%d", nranks);
    for (int r = 0; r < nranks; r++) {
        const char *argv[40] = { P2P_BIN, "--socket", h->socket, "--uid", hex, "--nranks", nr, "--rank", rk };
        int n = 9;
        for (int i = 0; extra && extra[i] && n < 39; i++)
            argv[n++] = extra[i];
        argv[n] = NULL;
        snprintf(rk, sizeof(rk), "%d", r); /* posix_spawn copies argv before rk is reused */
        pids[r] = harness_spawn(argv);
        if (pids[r] < 0)
            return -1;
    }
    return 0;
}

/* Run one communicator to the end; every rank must exit 0. */
static void run_p2p(harness_t *h, int nranks, const char *const *extra)
{
    pid_t pids[MAX_PROCS];
    double t0 = harness_now_ms();
    assert_int_equal(spawn_p2p(h, nranks, extra, pids), 0);
    assert_int_equal(harness_wait_all(pids, nranks, RUN_LIMIT_MS), 0);
    print_message("%d rank(s): %.0f ms\n", nranks, harness_now_ms() - t0);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* COLLD_TEST_NO_BIG=1 (make test-tsan) keeps only the small counts. */
static bool no_big(void)
{
    const char *v = getenv("COLLD_TEST_NO_BIG");
    return v && strcmp(v, "1") == 0;
}

/* ---------------------------------------------------------------------------------------------
 * Exact data
 * ------------------------------------------------------------------------------------------- */

static void test_ring_1_rank(void **state)
{
    const char *extra[] = { "--no-big", NULL };
    run_p2p(*state, 1, extra);
}

static void test_ring_2_ranks(void **state)
{
    const char *extra[] = { no_big() ? "--no-big" : NULL, NULL };
    run_p2p(*state, 2, extra);
}

static void test_ring_3_ranks(void **state)
{
    const char *extra[] = { no_big() ? "--no-big" : NULL, NULL };
    run_p2p(*state, 3, extra);
}

static void test_ring_4_ranks(void **state)
{
    const char *extra[] = { "--no-big", NULL };
    run_p2p(*state, 4, extra);
}

/* Ordinary memory: libcolld stages every send and receive. */
static void test_ring_malloc(void **state)
{
    const char *extra[] = { "--malloc", no_big() ? "--no-big" : NULL, NULL };
    run_p2p(*state, 3, extra);
}

static void test_pairs(void **state)
{
    const char *extra[] = { "--mode", "pairs", "--no-big", NULL };
    run_p2p(*state, 4, extra);
}

/* Sends and receives between all-reduces of the fast area and of the engine, 3 ranks, 12 steps. */
static void test_mixed_with_collectives(void **state)
{
    const char *extra[] = { "--mode", "mixed", "--no-big", NULL };
    run_p2p(*state, 3, extra);
}

static void test_mixed_malloc(void **state)
{
    const char *extra[] = { "--mode", "mixed", "--no-big", "--malloc", "--iters", "6", NULL };
    run_p2p(*state, 2, extra);
}

static void test_alltoallv(void **state)
{
    const char *extra[] = { "--mode", "alltoallv", "--no-big", NULL };
    run_p2p(*state, 2, extra);
    run_p2p(*state, 3, extra);
    run_p2p(*state, 4, extra);
}

static void test_alltoallv_malloc(void **state)
{
    const char *extra[] = { "--mode", "alltoallv", "--no-big", "--malloc", NULL };
    run_p2p(*state, 3, extra);
}

static void test_per_op_completion(void **state)
{
    harness_t *h = *state;
    const char *extra[] = { "--mode", "ops", "--no-big", "--sync-dir", h->dir, NULL };
    run_p2p(h, 2, extra);
}

static void test_badargs(void **state)
{
    const char *extra[] = { "--mode", "badargs", "--no-big", NULL };
    run_p2p(*state, 2, extra);
}

/* ---------------------------------------------------------------------------------------------
 * Faults
 * ------------------------------------------------------------------------------------------- */

/* Run a fault scene on `nranks` ranks with a communicator timeout; rank 0's error detail is
 * returned in `detail` (the scene must end with `expect` on the ranks that take part). */
static void run_scene(harness_t *h, int nranks, const char *scene, const char *expect, const char *timeout_ms,
                      int metrics_port, char *detail, size_t len)
{
    char out[320], port[16];
    snprintf(out, sizeof(out), "%s/scene-%s.out", h->dir, scene);
    snprintf(port, sizeof(port), "%d", metrics_port); /* -1: none */
    pid_t pids[MAX_PROCS];
    const char *extra[] = { "--mode",   "call",     "--scene",    scene,  "--expect", expect, "--timeout-ms",
                            timeout_ms, "--no-big", "--sync-dir", h->dir, "--out",    out,    "--metrics-port",
                            port,       NULL };
    assert_int_equal(spawn_p2p(h, nranks, extra, pids), 0);
    assert_int_equal(harness_wait_all(pids, nranks, RUN_LIMIT_MS), 0);
    /* Every rank printed its detail into the same file: rank 0's (the only non-empty one for
     * scenes with one waiting rank) is what the test reads. */
    harness_read_file(out, detail, len);
    print_message("rank 0: %s", detail);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* A daemon with /metrics: the never-sent scene waits until it counts rank 0's receive. */
static int setup_with_metrics(void **state)
{
    const char *extra[] = { "--metrics", "127.0.0.1:0", NULL };
    return harness_test_setup_args(state, extra);
}

static void test_never_sent_times_out(void **state)
{
    char detail[1024];
    int port = harness_metrics_port(*state);
    assert_true(port > 0);
    run_scene(*state, 3, "never-sent", "COLLD_ERR_TIMEOUT", "1500", port, detail, sizeof(detail));
    assert_non_null(strstr(detail, "COLLD_ERR_TIMEOUT: point-to-point timed out after 1500 ms: rank 0 (pid "));
    assert_non_null(strstr(detail, "to receive 1024 x int32 (4096 B) from rank 1 (operation #1); rank 1 never sent "
                                   "to rank 0: it is waiting in allreduce (collective #1)"));
}

static void test_mismatched_sizes(void **state)
{
    char detail[1024];
    run_scene(*state, 2, "mismatch", "COLLD_ERR_MISMATCH", "60000", -1, detail, sizeof(detail));
    assert_non_null(strstr(detail, "COLLD_ERR_MISMATCH: point-to-point from rank 0 to rank 1 differs: rank 0 sends "
                                   "100 x int32 (400 B) (operation #1), rank 1 receives 50 x int32 (200 B) "
                                   "(operation #1)"));
}

/* Both ranks send first and then receive, outside a group (torch 2.x's isend, irecv): each send
 * meets the other's receive (MPI's rule; before issue 25 this waited until the time-out). */
static void test_crossed_sends_exchange(void **state)
{
    char detail[1024];
    run_scene(*state, 2, "crossed", "COLLD_OK", "60000", -1, detail, sizeof(detail));
}

/* The ring outside groups, exact data. */
static void test_isend_ring(void **state)
{
    const char *extra[] = { "--mode", "isend-ring", "--no-big", "--iters", "8", NULL };
    run_p2p(*state, 3, extra);
    run_p2p(*state, 4, extra);
}

static void test_isend_ring_malloc(void **state)
{
    const char *extra[] = { "--mode", "isend-ring", "--no-big", "--malloc", NULL };
    run_p2p(*state, 3, extra);
}

/* Both ranks send to each other and never receive: each send waits for a receive that never
 * comes; colld names it at the time-out. */
static void test_crossed_sends_time_out(void **state)
{
    char detail[1024];
    run_scene(*state, 2, "sends-only", "COLLD_ERR_TIMEOUT", "1000", -1, detail, sizeof(detail));
    assert_non_null(strstr(detail, "COLLD_ERR_TIMEOUT: point-to-point timed out after 1000 ms"));
    assert_non_null(strstr(detail, "never posted the receive from rank"));
    assert_non_null(strstr(detail, "it waits in its own point-to-point operations: send to rank"));
}

/* While rank 0 waits for a send that never comes (rank 1 is in an all-reduce instead), collctl
 * status shows the wait and collctl doctor names it as a stuck communicator (exit 1); then an
 * operator's abort ends it (the communicator's timeout is a minute, so that a loaded machine
 * cannot time it out before the doctor looks). */
static void test_doctor_names_missing_send(void **state)
{
    harness_t *h = *state;
    char out[320], posted[320], text[8192], id[32];
    snprintf(out, sizeof(out), "%s/doctor-scene.out", h->dir);
    snprintf(posted, sizeof(posted), "%s/posted", h->dir);
    pid_t pids[2];
    const char *extra[] = { "--mode",
                            "call",
                            "--scene",
                            "never-sent",
                            "--expect",
                            "COLLD_ERR_ABORTED",
                            "--timeout-ms",
                            "60000",
                            "--no-big",
                            "--sync-dir",
                            h->dir,
                            "--out",
                            out,
                            NULL };
    assert_int_equal(spawn_p2p(h, 2, extra, pids), 0);
    assert_int_equal(harness_wait_file(posted, 60000), 0);
    const char *doctor[] = { COLLCTL_BIN, "--socket", h->socket, "doctor", NULL };
    int rc = 0;
    for (int i = 0; i < 100; i++) { /* until the receive has waited the doctor's --stuck-ms (1 s) */
        rc = harness_capture(doctor, text, sizeof(text), 20000);
        if (strstr(text, "point-to-point: rank 0 (pid "))
            break;
        usleep(200 * 1000);
    }
    print_message("%s", text);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(text, "point-to-point: rank 0 (pid "));
    assert_non_null(strstr(text, "to receive 1024 x int32 (4096 B) from rank 1 (operation #1); rank 1 never sent to "
                                 "rank 0: it is waiting in allreduce (collective #1)"));
    const char *status[] = { COLLCTL_BIN, "--socket", h->socket, "status", NULL };
    assert_int_equal(harness_capture(status, text, sizeof(text), 20000), 0);
    assert_non_null(strstr(text, "point-to-point: rank 0 (pid "));
    snprintf(id, sizeof(id), "%llu", (unsigned long long)harness_comm_id(h, "test-p2p"));
    const char *abort_argv[] = { COLLCTL_BIN, "--socket", h->socket, "abort", id, "--reason", "p2p doctor test", NULL };
    assert_int_equal(harness_capture(abort_argv, text, sizeof(text), 10000), 0);
    assert_int_equal(harness_wait_all(pids, 2, RUN_LIMIT_MS), 0);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* A sender killed with SIGKILL while its peer waits in a receive: PEER_LOST naming its pid, at
 * once (the communicator's timeout is 60 s); another communicator keeps running meanwhile. */
static void test_killed_sender(void **state)
{
    harness_t *h = *state;
    harness_bg_t bg;
    assert_int_equal(harness_bg_start(h, &bg), 0);
    char out[320], ready[320], detail[1024];
    snprintf(out, sizeof(out), "%s/hang.out", h->dir);
    snprintf(ready, sizeof(ready), "%s/ready", h->dir);
    pid_t pids[2];
    const char *extra[] = { "--mode",   "call",       "--scene", "hang",  "--expect", "COLLD_ERR_PEER_LOST",
                            "--no-big", "--sync-dir", h->dir,    "--out", out,        NULL };
    assert_int_equal(spawn_p2p(h, 2, extra, pids), 0);
    assert_int_equal(harness_wait_file(ready, 60000), 0);
    long before = harness_bg_progress(&bg);
    double t0 = harness_now_ms();
    assert_int_equal(kill(pids[1], SIGKILL), 0);
    assert_int_equal(harness_wait(pids[0], 30000), 0);
    double ms = harness_now_ms() - t0;
    assert_int_equal(harness_wait(pids[1], 5000), 128 + SIGKILL);
    harness_read_file(out, detail, sizeof(detail));
    print_message("peer lost after %.0f ms: %s", ms, detail);
    char want[64];
    snprintf(want, sizeof(want), "rank 1 (pid %d)", (int)pids[1]);
    assert_non_null(strstr(detail, "COLLD_ERR_PEER_LOST"));
    assert_non_null(strstr(detail, want));
    assert_true(ms < 20000); /* far below the 60 s timeout: the socket closing told the daemon */
    assert_true(harness_bg_wait_progress(&bg, before, 10000) > before);
    assert_int_equal(harness_bg_stop(&bg), 0);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ring_1_rank, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_ring_2_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_ring_3_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_ring_4_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_ring_malloc, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_pairs, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_mixed_with_collectives, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_mixed_malloc, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_alltoallv, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_alltoallv_malloc, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_per_op_completion, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_badargs, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_never_sent_times_out, setup_with_metrics, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_mismatched_sizes, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_crossed_sends_exchange, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_isend_ring, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_isend_ring_malloc, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_crossed_sends_time_out, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_doctor_names_missing_send, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_killed_sender, harness_test_setup, harness_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
