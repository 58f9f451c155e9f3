/*
 * test_allreduce.c - all-reduce through a real colld daemon with real client processes: exact
 * results for 1..8 ranks and counts from 0 to 1,000,003, in-place and out-of-place; two
 * communicators of different process groups at once; 20 processes attaching and detaching at
 * once; a daemon killed with SIGKILL mid-collective.
 */
#include "tests/integration/harness.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define COUNTS "0,1,7,1000,1000003"

/* All ranks of one communicator run every count in both modes and check every element. */
static void run_ranks(harness_t *h, int nranks)
{
    pid_t pids[16];
    const char *extra[] = { "--counts", COUNTS, NULL };
    assert_int_equal(harness_spawn_ranks(h, nranks, extra, pids), 0);
    assert_int_equal(harness_wait_all(pids, nranks, 120000), 0);
}

static void test_1_rank(void **state) { run_ranks(*state, 1); }
static void test_2_ranks(void **state) { run_ranks(*state, 2); }
static void test_3_ranks(void **state) { run_ranks(*state, 3); }
static void test_4_ranks(void **state) { run_ranks(*state, 4); }
static void test_8_ranks(void **state) { run_ranks(*state, 8); }

/* Buffers from malloc (not colld_mem_alloc) work too: libcolld stages them through memory shared
 * with the daemon, in place and out of place, several iterations reusing the staging cache. */
static void test_malloc_buffers(void **state)
{
    harness_t *h = *state;
    pid_t pids[3];
    const char *extra[] = { "--counts", COUNTS, "--malloc", "--iters", "2", NULL };
    assert_int_equal(harness_spawn_ranks(h, 3, extra, pids), 0);
    assert_int_equal(harness_wait_all(pids, 3, 120000), 0);
}

/* Two communicators of different processes, running at the same time, each exact. */
static void test_two_comms_at_once(void **state)
{
    harness_t *h = *state;
    pid_t a[4], b[3];
    const char *extra[] = { "--counts", "1,1000,100003", "--iters", "3", NULL };
    assert_int_equal(harness_spawn_ranks(h, 4, extra, a), 0);
    assert_int_equal(harness_spawn_ranks(h, 3, extra, b), 0);
    assert_int_equal(harness_wait_all(a, 4, 120000), 0);
    assert_int_equal(harness_wait_all(b, 3, 120000), 0);
}

/* 20 processes connect, get ids, share memory and disconnect concurrently, 5 times each; then
 * the daemon holds no session but the driver's. */
static void test_20_attach_detach(void **state)
{
    harness_t *h = *state;
    pid_t pids[20];
    const char *argv[] = { RANK_BIN, "--socket", h->socket, "--mode", "attach", "--iters", "5", NULL };
    for (int i = 0; i < 20; i++)
        assert_true((pids[i] = harness_spawn(argv)) > 0);
    assert_int_equal(harness_wait_all(pids, 20, 120000), 0);
    char out[8192];
    const char *st[] = { COLLCTL_BIN, "--socket", h->socket, "status", "--json", NULL };
    /* Sessions end asynchronously after the processes exit: allow the daemon a moment. */
    int sessions = -1;
    for (int tries = 0; tries < 200; tries++) {
        assert_int_equal(harness_capture(st, out, sizeof(out), 10000), 0);
        sessions = 0;
        for (const char *p = out; (p = strstr(p, "\"pid\":")) != NULL; p++)
            sessions++;
        /* the driver's session and collctl's own */
        if (strstr(out, "\"sessions\"") && sessions <= 2)
            break;
        usleep(10000);
    }
    assert_true(strstr(out, "\"sessions\"") != NULL);
    assert_int_equal(sessions, 2);
}

/* A daemon killed with SIGKILL while a rank waits in a collective: the rank gets
 * COLLD_ERR_DAEMON_LOST promptly instead of hanging. */
static void test_daemon_sigkill_mid_collective(void **state)
{
    harness_t *h = *state;
    char ready[300];
    snprintf(ready, sizeof(ready), "%s/ready0", h->dir);
    pid_t pids[2];
    char hex[HARNESS_UID_HEX_LEN];
    assert_int_equal(harness_new_uid_hex(h, hex), 0);
    const char *r0[] = { RANK_BIN, "--socket", h->socket, "--uid", hex, "--nranks", "2", "--rank", "0",
                         "--mode", "hang", "--expect", "COLLD_ERR_DAEMON_LOST", "--ready-file", ready, NULL };
    const char *r1[] = { RANK_BIN, "--socket", h->socket, "--uid", hex, "--nranks", "2", "--rank", "1",
                         "--mode", "hang", "--no-post", NULL };
    assert_true((pids[0] = harness_spawn(r0)) > 0);
    assert_true((pids[1] = harness_spawn(r1)) > 0);
    assert_int_equal(harness_wait_file(ready, 20000), 0);
    usleep(50000); /* rank 0 is now waiting in colld_comm_synchronize */
    double t0 = harness_now_ms();
    harness_daemon_stop(h, SIGKILL, 5000);
    int rc0 = harness_wait(pids[0], 10000);
    double took = harness_now_ms() - t0;
    int rc1 = harness_wait(pids[1], 10000); /* the silent rank leaves on its own too */
    print_message("rank 0 saw COLLD_ERR_DAEMON_LOST %.1f ms after SIGKILL\n", took);
    assert_int_equal(rc0, 0);
    assert_int_equal(rc1, 0);
    assert_true(took < 5000);
    colld_disconnect(h->client);
    h->client = NULL;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_1_rank, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_2_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_3_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_4_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_8_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_malloc_buffers, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_two_comms_at_once, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_20_attach_detach, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_daemon_sigkill_mid_collective, harness_test_setup, harness_test_teardown),
    };
    return cmocka_run_group_tests_name("allreduce", tests, NULL, NULL);
}
