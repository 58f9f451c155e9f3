/*
 * test_core_comm.c - the communicator registry and its state machine in the daemon core,
 * in-process (tests/fuzz/core_fixture.h): joins refused with the exact detail a client gets,
 * timeouts capped, JOINING -> READY -> CLOSING / BROKEN, dissolving a communicator that cannot
 * form (a rank leaving, a process gone, the join timeout), the first fault winning, notices to
 * ranks with nothing in flight, and everything charged to the tenant given back.
 */
#include "tests/fuzz/core_fixture.h"

#include "server/core/tenant.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

/* Sessions 0..2 of uid 1000 (pids 1000..1002), session 3 of uid 2000 (pid 1003). */
static int setup(void **state)
{
    fix_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    assert_int_equal(fix_start(f, 0), 0);
    for (int i = 0; i < 3; i++)
        assert_non_null(fix_session(f, 1000, 1));
    assert_non_null(fix_session(f, 2000, 1));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fix_t *f = *state;
    fix_stop(f);
    free(f);
    return 0;
}

/* A unique id issued to session i's tenant. */
static void new_uid(fix_t *f, int i, uint8_t *uid)
{
    pthread_mutex_lock(&f->d.lock);
    assert_int_equal(colld_comm_issue_uid(&f->d, f->s[i], uid), COLLD_OK);
    pthread_mutex_unlock(&f->d.lock);
}

/* Session i joins; returns the status, the refusal's detail in *err. */
static colld_status_t join(fix_t *f, int i, const uint8_t *uid, int nranks, int rank, int timeout_ms, const char *name,
                           colld_err_t *err)
{
    pthread_mutex_lock(&f->d.lock);
    colld_status_t st = colld_comm_join(&f->d, f->s[i], uid, nranks, rank, timeout_ms, name, false, NULL, err);
    colld_daemon_unlock(&f->d);
    return st;
}

/* The refusal of a join: its status and exact detail. */
static void expect_refused(fix_t *f, int i, const uint8_t *uid, int nranks, int rank, int timeout_ms, const char *name,
                           colld_status_t st, const char *detail)
{
    colld_err_t err = COLLD_ERR_INIT;
    assert_int_equal(join(f, i, uid, nranks, rank, timeout_ms, name, &err), st);
    assert_int_equal(err.status, st);
    assert_string_equal(err.msg, detail);
}

static colld_dcomm_t *comm_of(fix_t *f, const uint8_t *uid)
{
    for (colld_dcomm_t *c = f->d.comms; c; c = c->next)
        if (memcmp(c->unique_id, uid, COLLD_WIRE_UNIQUE_ID_BYTES) == 0)
            return c;
    return NULL;
}

static void test_join_arguments(void **state)
{
    fix_t *f = *state;
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    new_uid(f, 0, uid);
    expect_refused(f, 0, uid, 0, 0, 0, NULL, COLLD_ERR_INVALID_ARGUMENT, "nranks 0 is out of range (1..1024)");
    expect_refused(f, 0, uid, 1025, 0, 0, NULL, COLLD_ERR_INVALID_ARGUMENT, "nranks 1025 is out of range (1..1024)");
    expect_refused(f, 0, uid, 2, 2, 0, NULL, COLLD_ERR_INVALID_ARGUMENT, "rank 2 is out of range for nranks 2 (0..1)");
    expect_refused(f, 0, uid, 2, -1, 0, NULL, COLLD_ERR_INVALID_ARGUMENT,
                   "rank -1 is out of range for nranks 2 (0..1)");
    expect_refused(f, 0, uid, 2, 0, -5, NULL, COLLD_ERR_INVALID_ARGUMENT, "timeout_ms -5 is negative");
    expect_refused(f, 0, uid, 2, 0, 0, "ab\033[2J", COLLD_ERR_INVALID_ARGUMENT,
                   "communicator name refused: byte 2: control or formatting character U+001B (a name is at most 63 "
                   "bytes of printable UTF-8, no control or formatting characters)");
    assert_null(f->d.comms); /* nothing was made */
    assert_int_equal(colld_tenant_used(&f->d, 1000, COLLD_LIMIT_COMMS), 0);
}

/* A unique id is the tenant's: another tenant's, or one never issued, is unknown. */
static void test_unknown_uid(void **state)
{
    fix_t *f = *state;
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    new_uid(f, 0, uid);
    const char *unknown = "unknown unique id: not issued by this daemon to this user (get it with colld_get_unique_id "
                          "on the same host)";
    expect_refused(f, 3, uid, 2, 0, 0, NULL, COLLD_ERR_INVALID_ARGUMENT, unknown);
    uint8_t never[COLLD_WIRE_UNIQUE_ID_BYTES] = { 1, 2, 3 };
    expect_refused(f, 0, never, 2, 0, 0, NULL, COLLD_ERR_INVALID_ARGUMENT, unknown);
    assert_int_equal(colld_tenant_used(&f->d, 1000, COLLD_LIMIT_JOINING_RANKS), 0);
}

static void test_join_against_first_ranks(void **state)
{
    fix_t *f = *state;
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    new_uid(f, 0, uid);
    colld_err_t err = COLLD_ERR_INIT;
    assert_int_equal(join(f, 0, uid, 3, 0, 0, "x", &err), COLLD_OK);
    colld_dcomm_t *c = comm_of(f, uid);
    assert_non_null(c);
    assert_int_equal(c->state, COLLD_COMM_JOINING);
    char want[128];
    expect_refused(f, 1, uid, 2, 1, 0, NULL, COLLD_ERR_INVALID_ARGUMENT,
                   "nranks 2 differs from 3 given by the ranks that joined first");
    snprintf(want, sizeof(want), "rank 0 of communicator %llu already joined (pid 1000)", (unsigned long long)c->id);
    expect_refused(f, 1, uid, 3, 0, 0, NULL, COLLD_ERR_INVALID_USAGE, want);
    assert_int_equal(join(f, 1, uid, 3, 1, 0, NULL, &err), COLLD_OK);
    assert_int_equal(join(f, 2, uid, 3, 2, 0, NULL, &err), COLLD_OK);
    assert_int_equal(c->state, COLLD_COMM_READY);
    assert_non_null(c->ranks);
    assert_non_null(c->trace); /* its flight recorder is made when it forms */
    snprintf(want, sizeof(want), "unique id already used by communicator %llu, which has formed",
             (unsigned long long)c->id);
    expect_refused(f, 2, uid, 3, 2, 0, NULL, COLLD_ERR_INVALID_USAGE, want);
}

static void test_quotas(void **state)
{
    fix_t *f = *state;
    f->d.cfg.max_comms_per_session = 1;
    uint8_t a[COLLD_WIRE_UNIQUE_ID_BYTES], b[COLLD_WIRE_UNIQUE_ID_BYTES];
    new_uid(f, 0, a);
    new_uid(f, 0, b);
    colld_err_t err = COLLD_ERR_INIT;
    assert_int_equal(join(f, 0, a, 2, 0, 0, NULL, &err), COLLD_OK);
    expect_refused(f, 0, b, 2, 0, 0, NULL, COLLD_ERR_QUOTA_EXCEEDED,
                   "this process is at its limit max-comms-per-session = 1 (holds 1)");
    f->d.cfg.max_comms_per_session = 100;
    f->d.cfg.max_comms_per_tenant = 1;
    expect_refused(f, 1, a, 2, 1, 0, NULL, COLLD_ERR_QUOTA_EXCEEDED,
                   "uid 1000 is at its limit max-comms-per-tenant = 1 (holds 1, asked for 1 more); an operator can "
                   "raise it: collctl policy set 1000 --max-comms-per-tenant N");
}

/* The timeout asked for (0: --timeout-ms), capped by --max-timeout-ms and the tenant's policy. */
static void test_timeout_caps(void **state)
{
    fix_t *f = *state;
    f->d.cfg.timeout_ms = 1234;
    f->d.cfg.max_timeout_ms = 5000;
    uint8_t uid[3][COLLD_WIRE_UNIQUE_ID_BYTES];
    colld_err_t err = COLLD_ERR_INIT;
    for (int i = 0; i < 3; i++)
        new_uid(f, 0, uid[i]);
    assert_int_equal(join(f, 0, uid[0], 2, 0, 0, NULL, &err), COLLD_OK);
    assert_int_equal(comm_of(f, uid[0])->timeout_ms, 1234);
    assert_int_equal(join(f, 0, uid[1], 2, 0, 9000, NULL, &err), COLLD_OK);
    assert_int_equal(comm_of(f, uid[1])->timeout_ms, 5000);
    pthread_mutex_lock(&f->d.lock);
    assert_int_equal(colld_policy_set(&f->d, 1000, 300), 0);
    pthread_mutex_unlock(&f->d.lock);
    assert_int_equal(join(f, 0, uid[2], 2, 0, 4000, NULL, &err), COLLD_OK);
    assert_int_equal(comm_of(f, uid[2])->timeout_ms, 300);
}

/* A rank leaving before every rank joined dissolves the communicator: gone, nothing charged. */
static void test_leave_while_forming(void **state)
{
    fix_t *f = *state;
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    new_uid(f, 0, uid);
    colld_err_t err = COLLD_ERR_INIT;
    assert_int_equal(join(f, 0, uid, 3, 0, 0, NULL, &err), COLLD_OK);
    assert_int_equal(join(f, 1, uid, 3, 2, 0, NULL, &err), COLLD_OK);
    assert_int_equal(colld_tenant_used(&f->d, 1000, COLLD_LIMIT_JOINING_RANKS), 3);
    assert_int_equal(colld_tenant_used(&f->d, 1000, COLLD_LIMIT_COMMS), 2);
    pthread_mutex_lock(&f->d.lock);
    assert_int_equal(colld_comm_leave(&f->d, f->s[1], 1, &err), COLLD_OK);
    colld_daemon_unlock(&f->d);
    assert_null(f->d.comms);
    assert_int_equal(f->fault_how, COLLD_FAULT_DISSOLVED);
    assert_int_equal(f->fault_status, COLLD_ERR_ABORTED);
    assert_int_equal(f->fault_rank, 2);
    assert_string_equal(f->fault_detail, "rank 2 (pid 1001) left before all ranks joined");
    assert_int_equal(colld_tenant_used(&f->d, 1000, COLLD_LIMIT_JOINING_RANKS), 0);
    assert_int_equal(colld_tenant_used(&f->d, 1000, COLLD_LIMIT_COMMS), 0);
    assert_null(colld_comm_member(f->s[0], 1));
}

static bool comms_gone(void *arg)
{
    return ((fix_t *)arg)->d.comms == NULL;
}

/* Ranks that never join: the join times out, naming them. */
static void test_join_timeout(void **state)
{
    fix_t *f = *state;
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    new_uid(f, 0, uid);
    colld_err_t err = COLLD_ERR_INIT;
    assert_int_equal(join(f, 2, uid, 4, 1, 5, NULL, &err), COLLD_OK);
    assert_true(fix_run_until(f, comms_gone, f, 10000));
    assert_int_equal(f->fault_how, COLLD_FAULT_DISSOLVED);
    assert_int_equal(f->fault_status, COLLD_ERR_TIMEOUT);
    assert_string_equal(f->fault_detail, "only 1 of 4 ranks joined within 5 ms; missing ranks: 0 2 3");
    assert_int_equal(colld_tenant_used(&f->d, 1000, COLLD_LIMIT_JOINING_RANKS), 0);
}

/* A process gone while its communicator forms: PEER_LOST for the others' joins. */
static void test_session_gone_while_forming(void **state)
{
    fix_t *f = *state;
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    new_uid(f, 0, uid);
    colld_err_t err = COLLD_ERR_INIT;
    assert_int_equal(join(f, 0, uid, 3, 0, 0, NULL, &err), COLLD_OK);
    assert_int_equal(join(f, 1, uid, 3, 1, 0, NULL, &err), COLLD_OK);
    fix_session_end(f, f->s[1]);
    assert_int_equal(f->fault_how, COLLD_FAULT_DISSOLVED);
    assert_int_equal(f->fault_status, COLLD_ERR_PEER_LOST);
    assert_string_equal(f->fault_detail, "rank 1 (pid 1001) disconnected before all ranks joined");
    assert_null(f->d.comms);
}

/* READY -> CLOSING (a rank destroys its handle): later collectives fail with INVALID_USAGE; a
 * fault afterwards still becomes the reported error, and then the first fault wins. */
static void test_close_then_fault(void **state)
{
    fix_t *f = *state;
    colld_dcomm_t *c = fix_comm(f, 3, 60000);
    assert_non_null(c);
    colld_err_t err = COLLD_ERR_INIT;
    pthread_mutex_lock(&f->d.lock);
    assert_int_equal(colld_comm_leave(&f->d, f->s[2], c->ranks[2].handle, &err), COLLD_OK);
    assert_int_equal(c->state, COLLD_COMM_CLOSING);
    assert_int_equal(c->error, COLLD_ERR_INVALID_USAGE);
    colld_dcomm_abort(&f->d, c, 0, "rank 0 (pid 1000): enough");
    assert_int_equal(c->state, COLLD_COMM_BROKEN);
    assert_int_equal(c->error, COLLD_ERR_ABORTED);
    char want[160];
    snprintf(want, sizeof(want), "communicator %llu aborted by rank 0 (pid 1000): enough", (unsigned long long)c->id);
    assert_string_equal(c->error_detail, want);
    colld_comm_break(&f->d, c, COLLD_ERR_TIMEOUT, -1, "a later fault");
    assert_int_equal(c->error, COLLD_ERR_ABORTED);
    assert_string_equal(c->error_detail, want);
    colld_daemon_unlock(&f->d);
    /* every rank still there got a notice of it (a completion with sequence number 0) */
    for (int r = 0; r < 2; r++) {
        colld_wire_cqe_t cq[4];
        int n = fix_reap_cqes(f, f->s[r], cq, 4);
        assert_int_equal(n, 1);
        assert_int_equal(cq[0].seq, 0);
        assert_int_equal(cq[0].status, COLLD_ERR_ABORTED);
    }
}

/* A rank's process gone: its communicator breaks with PEER_LOST naming it; when every rank has
 * left it is freed, its tenant's memberships given back. */
static void test_session_gone_when_ready(void **state)
{
    fix_t *f = *state;
    colld_dcomm_t *c = fix_comm(f, 2, 60000);
    assert_non_null(c);
    colld_wire_sqe_t q = fix_sqe(c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    assert_true(fix_post(f, f->s[0], &q));
    colld_engine_run_once(&f->d);
    fix_session_end(f, f->s[1]);
    assert_int_equal(c->state, COLLD_COMM_BROKEN);
    assert_int_equal(c->error, COLLD_ERR_PEER_LOST);
    assert_string_equal(c->error_detail, "rank 1 (pid 1001) disconnected: its process exited or was killed");
    colld_wire_cqe_t cq[4];
    int n = fix_reap_cqes(f, f->s[0], cq, 4);
    assert_true(n >= 1);
    assert_int_equal(cq[0].seq, 1);
    assert_int_equal(cq[0].status, COLLD_ERR_PEER_LOST);
    assert_int_equal(colld_tenant_used(&f->d, 1000, COLLD_LIMIT_COMMS), 1);
    fix_session_end(f, f->s[0]);
    assert_null(f->d.comms);
    assert_int_equal(colld_tenant_used(&f->d, 1000, COLLD_LIMIT_COMMS), 0);
}

/* A rank destroys its handle while another rank's all-reduce waits for it: that all-reduce fails
 * with PEER_LOST naming the rank that left (its caller did nothing wrong); one posted after the
 * close is INVALID_USAGE (issue 24: a rank that timed out on another communicator and left made
 * its peer's wait look like the peer's own usage error). */
static void test_leave_fails_waiting_with_peer_lost(void **state)
{
    fix_t *f = *state;
    colld_dcomm_t *c = fix_comm(f, 2, 60000);
    assert_non_null(c);
    colld_wire_sqe_t q = fix_sqe(c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    assert_true(fix_post(f, f->s[0], &q));
    colld_engine_run_once(&f->d);
    colld_err_t err = COLLD_ERR_INIT;
    pthread_mutex_lock(&f->d.lock);
    assert_int_equal(colld_comm_leave(&f->d, f->s[1], c->ranks[1].handle, &err), COLLD_OK);
    colld_daemon_unlock(&f->d);
    assert_int_equal(c->state, COLLD_COMM_CLOSING);
    char want[160];
    snprintf(want, sizeof(want), "rank 1 (pid 1001) has destroyed its handle of communicator %llu",
             (unsigned long long)c->id);
    assert_string_equal(c->error_detail, want);
    colld_wire_cqe_t cq[4];
    assert_int_equal(fix_reap_cqes(f, f->s[0], cq, 4), 1);
    assert_int_equal(cq[0].seq, 1);
    assert_int_equal(cq[0].status, COLLD_ERR_PEER_LOST);
    colld_wire_sqe_t later = fix_sqe(c, 0, 2, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    assert_true(fix_post(f, f->s[0], &later));
    colld_engine_run_once(&f->d);
    assert_int_equal(fix_reap_cqes(f, f->s[0], cq, 4), 1);
    assert_int_equal(cq[0].seq, 2);
    assert_int_equal(cq[0].status, COLLD_ERR_INVALID_USAGE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_leave_fails_waiting_with_peer_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_join_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_uid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_join_against_first_ranks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_quotas, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout_caps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leave_while_forming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_join_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_session_gone_while_forming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_then_fault, setup, teardown),
        cmocka_unit_test_setup_teardown(test_session_gone_when_ready, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
