/*
 * test_doctor.c - `collctl doctor` (issue 18 item 4) against real faults on a real daemon: a
 * healthy daemon (exit 0), a stuck job (a rank that never posts: named with its pid), a NaN
 * contributor (--nan-check), a cross-communicator deadlock (the cycle from the event backlog) and
 * a straggler; each time the doctor names the culprit, and exits 1 while the fault's communicator
 * is still there; once the job is gone its faults are history (warnings, exit 0: issue 30 item 4).
 * The stuck job also shows what a person debugging a hang reads: `collctl status` says what the
 * communicator waits for and who has not posted it (not only the slowest rank of the collectives
 * that completed), a coll_waiting event names the rank after --wait-event-ms, and the
 * communicator's end is a comm_destroyed event with COLLD_OK when its ranks closed it.
 */
#include "tests/integration/harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Run collctl doctor (extra options after it); its output in out, its exit status returned. */
static int doctor(harness_t *h, char *out, size_t len, const char *o1, const char *o2)
{
    const char *argv[] = { COLLCTL_BIN, "--socket", h->socket, "doctor", o1, o2, NULL };
    return harness_capture(argv, out, len, 20000);
}

/* A rank of colld-test-rank (hang mode, a communicator named "stuck") with the given extras. */
static pid_t hang_rank(harness_t *h, const char *hex, int rank, const char *const *extra)
{
    char rk[8];
    snprintf(rk, sizeof(rk), "%d", rank);
    const char *argv[32] = { RANK_BIN, "--socket", h->socket, "--uid",  hex,     "--nranks",     "2",    "--rank",
                             rk,       "--mode",   "hang",    "--name", "stuck", "--timeout-ms", "60000" };
    int n = 15;
    for (int i = 0; extra[i] && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    return harness_spawn(argv);
}

/* Nothing wrong: exit 0 and it says so. */
static void test_healthy(void **state)
{
    harness_t *h = *state;
    char out[8192];
    assert_int_equal(doctor(h, out, sizeof(out), NULL, NULL), 0);
    printf("%s", out);
    assert_non_null(strstr(out, "no problems found"));
}

/* Run collctl with `args` (NULL-terminated, after --socket), its output in out; its exit status. */
static int collctl(harness_t *h, char *out, size_t len, const char *a1, const char *a2)
{
    const char *argv[] = { COLLCTL_BIN, "--socket", h->socket, a1, a2, NULL };
    return harness_capture(argv, out, len, 20000);
}

/* Rank 1 joins and never posts: the doctor names the communicator, the collective and rank 1 with
 * its pid, so does `collctl status` (waiting: ...) and, after --wait-event-ms (300 here), a
 * coll_waiting event. After an abort, while the job is gone, the abort is history: a warning,
 * exit 0. */
static void test_stuck_job(void **state)
{
    harness_t *h = *state;
    char hex[HARNESS_UID_HEX_LEN], out[16384], ready[2][400], want[128];
    assert_int_equal(harness_new_uid_hex(h, hex), 0);
    for (int r = 0; r < 2; r++)
        snprintf(ready[r], sizeof(ready[r]), "%s/ready-%d", h->dir, r);
    const char *waiter[] = { "--expect", "COLLD_ERR_ABORTED", "--ready-file", ready[0], NULL };
    const char *silent[] = { "--no-post", "--ready-file", ready[1], NULL };
    pid_t p[2] = { hang_rank(h, hex, 0, waiter), hang_rank(h, hex, 1, silent) };
    assert_int_equal(harness_wait_file(ready[0], 30000), 0);
    assert_int_equal(harness_wait_file(ready[1], 30000), 0);
    snprintf(want, sizeof(want), "rank(s) 1 (pid %d) never posted it", (int)p[1]);
    int rc = 0;
    for (int i = 0; i < 100; i++) { /* until rank 0 has waited 200 ms (and recorded it) */
        rc = doctor(h, out, sizeof(out), "--stuck-ms", "200");
        if (strstr(out, want))
            break;
        usleep(100000);
    }
    printf("%s", out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "PROBLEM stuck"));
    assert_non_null(strstr(out, "'stuck' (2 ranks) has waited"));
    assert_non_null(strstr(out, want));

    /* collctl status: what it waits for, and who has not posted it (rank 1 was never the slowest:
     * it completed no collective). */
    snprintf(want, sizeof(want), "for rank(s) 1 (pid %d), which has not posted it", (int)p[1]);
    assert_int_equal(collctl(h, out, sizeof(out), "status", NULL), 0);
    printf("%s", out);
    assert_non_null(strstr(out, "waiting: collective #1 (allreduce) has waited "));
    assert_non_null(strstr(out, want));
    assert_int_equal(collctl(h, out, sizeof(out), "--json", "status"), 0);
    assert_non_null(strstr(out, "\"coll_waited_ms\":"));
    assert_non_null(strstr(out, want));
    assert_null(strstr(out, "\"coll_waited_ms\":0,"));
    /* The event, once, after --wait-event-ms: in progress, naming rank 1 and its pid. */
    char ev[256];
    snprintf(ev, sizeof(ev), "\"type\":\"coll_waiting\",\"comm_id\":1,\"comm_name\":\"stuck\",\"rank\":1,\"pid\":%d,",
             (int)p[1]);
    for (int i = 0; i < 100 && !strstr(out, ev); i++) {
        assert_int_equal(collctl(h, out, sizeof(out), "--json", "events"), 0);
        if (!strstr(out, ev))
            usleep(100000);
    }
    printf("%s", out);
    assert_non_null(strstr(out, ev));
    assert_non_null(strstr(out, "\"status\":\"COLLD_INPROGRESS\""));
    assert_non_null(strstr(out, want));
    char *first = strstr(out, "\"type\":\"coll_waiting\"");
    assert_null(strstr(first + 1, "\"type\":\"coll_waiting\"")); /* once per collective */

    const char *abort_argv[] = { COLLCTL_BIN, "--socket", h->socket, "abort", "1", "--reason", "doctor test", NULL };
    assert_int_equal(harness_capture(abort_argv, out, sizeof(out), 10000), 0);
    assert_int_equal(harness_wait_all(p, 2, 30000), 0);
    assert_int_equal(doctor(h, out, sizeof(out), NULL, NULL), 0); /* the job is gone: history */
    printf("%s", out);
    assert_non_null(strstr(out, "warning abort"));
    assert_non_null(strstr(out, "abort: communicator 1 'stuck' (gone now)"));
    assert_non_null(strstr(out, "doctor test"));
}

/* A job whose ranks destroy their communicator after their collectives: its end is an event with
 * COLLD_OK ("closed after 2 collectives completed"), not an error status. */
static void test_clean_close(void **state)
{
    harness_t *h = *state;
    char hex[HARNESS_UID_HEX_LEN], out[16384];
    assert_int_equal(harness_new_uid_hex(h, hex), 0);
    pid_t p[2];
    for (int r = 0; r < 2; r++) {
        const char *argv[] = { RANK_BIN, "--socket", h->socket, "--uid",    hex,        "--nranks", "2",
                               "--rank", r ? "1" : "0", "--name", "tidy", "--iters", "1", "--counts", "1000",
                               "--only", "inplace", NULL };
        assert_true((p[r] = harness_spawn(argv)) > 0);
    }
    assert_int_equal(harness_wait_all(p, 2, 30000), 0);
    assert_int_equal(collctl(h, out, sizeof(out), "--json", "events"), 0);
    printf("%s", out);
    const char *e = strstr(out, "\"type\":\"comm_destroyed\",\"comm_id\":1,\"comm_name\":\"tidy\"");
    assert_non_null(e);
    const char *ok = "\"status\":\"COLLD_OK\",\"detail\":\"closed after ";
    assert_true(strncmp(strstr(e, "\"status\":"), ok, strlen(ok)) == 0);
    assert_int_equal(doctor(h, out, sizeof(out), NULL, NULL), 0);
    assert_non_null(strstr(out, "no problems found"));
}

/* --nan-check: rank 1's NaN makes the all-reduce fail; the doctor names rank 1 and the element. */
static void test_nan_contributor(void **state)
{
    harness_t *h = *state;
    char out[16384];
    pid_t p[2];
    const char *nan[] = { "--mode", "nan", "--poison", "1:7:nan", "--expect", "COLLD_ERR_NUMERIC", NULL };
    assert_int_equal(harness_spawn_coll(h, 2, nan, p), 0);
    assert_int_equal(harness_wait_all(p, 2, 60000), 0);
    assert_int_equal(doctor(h, out, sizeof(out), NULL, NULL), 0); /* the job is gone: history */
    printf("%s", out);
    assert_non_null(strstr(out, "warning nan"));
    assert_non_null(strstr(out, "(gone now)"));
    assert_non_null(strstr(out, "rank 1 contributed NaN at element 7"));
}

/* Two ranks call two communicators' collectives in crossed order: the daemon (report only) logs
 * the cycle as an event; after the ranks' time-outs the doctor shows the cycle and the time-outs. */
static void test_deadlock_cycle(void **state)
{
    harness_t *h = *state;
    char out[16384];
    pid_t p[2];
    assert_int_equal(harness_spawn_crossed(h, "5000", "COLLD_ERR_TIMEOUT", NULL, p), 0);
    /* While the ranks wait (their 5 s time-out), the cycle (reported at 300 ms) is a problem. */
    char json[16384];
    const char *argv[] = { COLLCTL_BIN, "--socket", h->socket, "--json", "doctor", NULL };
    int rc = 0;
    for (int i = 0; i < 40; i++) {
        rc = harness_capture(argv, json, sizeof(json), 20000);
        if (strstr(json, "\"severity\":\"problem\",\"what\":\"deadlock\""))
            break;
        usleep(50000);
    }
    printf("%s\n", json);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(json, "{\"schema_version\":1,"));
    assert_non_null(strstr(json, "\"severity\":\"problem\",\"what\":\"deadlock\""));
    assert_int_equal(harness_wait_all(p, 2, 60000), 0);
    /* The job is gone: the cycle and the time-outs are history (warnings), exit 0. */
    assert_int_equal(doctor(h, out, sizeof(out), NULL, NULL), 0);
    printf("%s", out);
    assert_non_null(strstr(out, "warning deadlock"));
    assert_non_null(strstr(out, "deadlock across communicators: rank "));
    assert_non_null(strstr(out, "'crossed-2'"));
    assert_non_null(strstr(out, "warning timeout"));
    int port = harness_metrics_port(h);
    assert_true(port > 0);
    assert_true(harness_metric(port, "colld_deadlocks_detected_total") == 1);
    assert_true(harness_metric(port, "colld_net_refused_messages_total") == 0); /* no --listen: none */
}

/* Rank 1 posts every all-reduce 30 ms late: a warning naming it, and no problem (exit 0). */
static void test_straggler(void **state)
{
    harness_t *h = *state;
    char hex[HARNESS_UID_HEX_LEN], out[16384], stop[400], done[2][400], want[128];
    assert_int_equal(harness_new_uid_hex(h, hex), 0);
    snprintf(stop, sizeof(stop), "%s/stop", h->dir);
    pid_t p[2];
    for (int r = 0; r < 2; r++) {
        snprintf(done[r], sizeof(done[r]), "%s/done-%d", h->dir, r);
        const char *argv[] = {
            RANK_BIN,      "--socket",      h->socket,      "--uid",       hex,  "--nranks",    "2",     "--rank",
            r ? "1" : "0", "--name",        "slowpoke",     "--iters",     "5",  "--counts",    "1000",  "--only",
            "inplace",     "--straggle-ms", r ? "30" : "0", "--stop-file", stop, "--done-file", done[r], NULL
        };
        assert_true((p[r] = harness_spawn(argv)) > 0);
    }
    for (int r = 0; r < 2; r++)
        assert_int_equal(harness_wait_file(done[r], 30000), 0);
    assert_int_equal(doctor(h, out, sizeof(out), NULL, NULL), 0);
    printf("%s", out);
    snprintf(want, sizeof(want), "'slowpoke': rank 1 (pid %d) is the slowest", (int)p[1]);
    assert_non_null(strstr(out, "warning straggler"));
    assert_non_null(strstr(out, want));
    FILE *f = fopen(stop, "w");
    if (f)
        fclose(f);
    assert_int_equal(harness_wait_all(p, 2, 30000), 0);
}

/* Result verification (issue 30 item 3; the daemon's --verify-results and its test hook
 * --test-corrupt-result 1:7000): collctl status shows it on for a live communicator (the
 * background job's all-reduces, of 1 and 4096 elements, are left alone by the hook and complete);
 * then rank 1's result of a 10000-element all-reduce is corrupted, the job fails, and the doctor
 * names rank 1, its pid and the element (a 'corrupted' warning: the job is gone). */
static void test_corrupted_result(void **state)
{
#ifndef COLLD_TEST_HOOKS
    (void)state;
    skip(); /* this build has no test hooks (-DCOLLD_TEST_HOOKS=OFF) */
#else
    harness_t *h = *state;
    char out[16384], want[160];
    harness_bg_t bg;
    assert_int_equal(harness_bg_start(h, &bg), 0);
    assert_int_equal(collctl(h, out, sizeof(out), "status", NULL), 0);
    assert_non_null(strstr(out, "result verification: on"));
    assert_int_equal(collctl(h, out, sizeof(out), "--json", "status"), 0);
    assert_non_null(strstr(out, "\"verify_results\":true"));
    assert_int_equal(harness_bg_stop(&bg), 0);
    pid_t p[2];
    const char *call[] = { "--mode", "call", "--call", "allreduce:float32:sum:10000:0", "--expect", "COLLD_ERR_CORRUPTED",
                           NULL };
    assert_int_equal(harness_spawn_coll(h, 2, call, p), 0);
    assert_int_equal(harness_wait_all(p, 2, 60000), 0);
    assert_int_equal(doctor(h, out, sizeof(out), NULL, NULL), 0); /* the job is gone: history */
    printf("%s", out);
    snprintf(want, sizeof(want), "result verification: rank 1 (pid %d) result differs from rank 0's from element 7000",
             (int)p[1]);
    assert_non_null(strstr(out, "warning corrupted"));
    assert_non_null(strstr(out, "(gone now)"));
    assert_non_null(strstr(out, want));
#endif
}

/* Run one collective on 2 ranks (colld-test-coll --mode call --call CALL), expecting `expect` (NULL:
 * success with exact results). */
static void verified_call(harness_t *h, const char *call, const char *expect)
{
    pid_t p[2];
    const char *x[] = { "--mode", "call", "--call", call, expect ? "--expect" : NULL, expect, NULL };
    assert_int_equal(harness_spawn_coll(h, 2, x, p), 0);
    assert_int_equal(harness_wait_all(p, 2, 60000), 0);
}

/* Result verification by policy (issue 30 item 3): a daemon with the test hook
 * --test-corrupt-result 1:7000 and no --verify-results. `collctl policy set UID --verify-results
 * on` turns verification on for the tenant's new communicators (collctl policy shows it): a
 * broadcast of 10000 float32 and an all-gather of 2 x 5000 int32, whose rank 1 result the hook
 * corrupts at element 7000, fail with COLLD_ERR_CORRUPTED, and the doctor names rank 1, the
 * element and the kind; a reduce and a reduce-scatter (whose results are not compared) complete
 * exactly. `--verify-results off`: an all-reduce of 10000 completes (the hook acts only where
 * results are verified). */
static void test_verify_by_policy(void **state)
{
#ifndef COLLD_TEST_HOOKS
    (void)state;
    skip(); /* this build has no test hooks (-DCOLLD_TEST_HOOKS=OFF) */
#else
    harness_t *h = *state;
    char out[16384], uid[16];
    snprintf(uid, sizeof(uid), "%u", (unsigned)getuid());
    const char *on[] = { COLLCTL_BIN, "--socket", h->socket, "policy", "set", uid, "--verify-results", "on", NULL };
    assert_int_equal(harness_capture(on, out, sizeof(out), 20000), 0);
    assert_int_equal(collctl(h, out, sizeof(out), "policy", NULL), 0);
    assert_non_null(strstr(out, "result verification on"));
    assert_int_equal(collctl(h, out, sizeof(out), "--json", "policy"), 0);
    assert_non_null(strstr(out, "\"verify_results\":\"on\""));
    verified_call(h, "broadcast:float32:sum:10000:0", "COLLD_ERR_CORRUPTED");
    verified_call(h, "allgather:int32:sum:5000:0", "COLLD_ERR_CORRUPTED");
    verified_call(h, "reduce:float32:sum:10000:1", NULL);
    verified_call(h, "reducescatter:float32:sum:5000:0", NULL);
    assert_int_equal(doctor(h, out, sizeof(out), NULL, NULL), 0); /* the jobs are gone: history */
    printf("%s", out);
    assert_non_null(strstr(out, "result differs from rank 0's from element 7000"));
    assert_non_null(strstr(out, "(broadcast float32, 1 of 2 ranks agree"));
    assert_non_null(strstr(out, "(allgather int32, 1 of 2 ranks agree"));
    const char *off[] = { COLLCTL_BIN, "--socket", h->socket, "policy", "set", uid, "--verify-results", "off", NULL };
    assert_int_equal(harness_capture(off, out, sizeof(out), 20000), 0);
    verified_call(h, "allreduce:float32:sum:10000:0", NULL);
    const char *bad[] = { COLLCTL_BIN, "--socket", h->socket, "policy", "set", uid, "--verify-results", "maybe", NULL };
    assert_int_equal(harness_capture_all(bad, out, sizeof(out), 20000), 2);
    assert_non_null(strstr(out, "--verify-results expects on or off, got 'maybe'"));
#endif
}

static int setup_corrupt(void **state)
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
#ifdef COLLD_TEST_HOOKS
    static const char *const extra[] = { "--verify-results", "--test-corrupt-result", "1:7000", NULL };
#else
    static const char *const extra[] = { "--verify-results", NULL };
#endif
    return harness_test_setup_args(state, extra);
}

static int setup_wait_event(void **state)
{
    static const char *const extra[] = { "--wait-event-ms", "300", NULL };
    return harness_test_setup_args(state, extra);
}

static int setup_checks(void **state)
{
    static const char *const extra[] = { "--nan-check", "--deadlock-ms", "300", "--metrics", "127.0.0.1:0", NULL };
    return harness_test_setup_args(state, extra);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1) /* only the tests whose names match (cmocka's filter, * as a wildcard) */
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_healthy, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_corrupted_result, setup_verify, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_verify_by_policy, setup_corrupt, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_stuck_job, setup_wait_event, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_clean_close, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_nan_contributor, setup_checks, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_deadlock_cycle, setup_checks, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_straggler, harness_test_setup, harness_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
