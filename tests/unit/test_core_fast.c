/*
 * test_core_fast.c - the fast-area judgement (server/core/fast.c, resolve_fast) in the daemon core
 * in-process (tests/fuzz/core_fixture.h): for the lowest collective queued, where each rank stands
 * (an engine descriptor, a record of a fast-area collective, only its slot, past it, or absent)
 * and what follows: matching by the engine, the collective retired as run on the area, a mismatch
 * naming each rank's call (after the records still coming), waiting, a time-out naming the ranks
 * that never came; every branch, with the exact details.
 */
#include "tests/fuzz/core_fixture.h"

#include "common/util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

typedef struct {
    fix_t f;
    colld_dcomm_t *c;
} world_t;

/* `nranks` ranks (uid 1000, pids 1000..) of a communicator with a fast area. */
static world_t *make_world(int nranks, int timeout_ms)
{
    world_t *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    assert_int_equal(fix_start(&w->f, 16384), 0);
    for (int r = 0; r < nranks; r++)
        assert_non_null(fix_session(&w->f, 1000, (uint8_t)(r + 1)));
    w->c = fix_comm(&w->f, nranks, timeout_ms);
    assert_non_null(w->c);
    assert_non_null(w->c->fast);
    assert_true(w->c->side_path);
    return w;
}

static int setup2(void **state)
{
    *state = make_world(2, 60000);
    return 0;
}

static int setup3(void **state)
{
    *state = make_world(3, 60000);
    return 0;
}

static int teardown(void **state)
{
    world_t *w = *state;
    fix_stop(&w->f);
    free(w);
    return 0;
}

/* Collective `seq`: an all-reduce of `count` float32 (a small one, for the fast area). */
static colld_wire_sqe_t call(world_t *w, int rank, uint64_t seq, uint64_t count)
{
    return fix_sqe(w->c, rank, seq, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, count, 0);
}

/* Rank `rank` posts collective `seq` to the engine. */
static void engine_post(world_t *w, int rank, uint64_t seq, uint64_t count)
{
    colld_wire_sqe_t q = call(w, rank, seq, count);
    assert_true(fix_post(&w->f, w->f.s[rank], &q));
}

/* Rank `rank` ran collective `seq` on the area: its slot, and (it waited) its record. */
static void fast_run(world_t *w, int rank, uint64_t seq, uint64_t count, bool record)
{
    colld_wire_sqe_t q = call(w, rank, seq, count);
    uint64_t now = colld_now_ns();
    fix_fast_publish(w->c, rank, &q, now);
    if (!record)
        return;
    q.flags = COLLD_SQE_FAST;
    q.send.offset = now; /* a record carries the rank's arrival time */
    assert_true(fix_post(&w->f, w->f.s[rank], &q));
}

/* Every rank posted to the engine: the common case, matched and executed as without an area. */
static void test_all_engine(void **state)
{
    world_t *w = *state;
    engine_post(w, 0, 1, 4);
    engine_post(w, 1, 1, 4);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->ops_completed, 1);
    assert_int_equal(w->c->exec_seq, 2);
    assert_int_equal(w->c->trace[0].flags, 0);
}

/* Records and slots of every rank: the collective ran on the area; its records are retired
 * without completions (the ranks completed it) and it goes into the flight recorder as "fast". */
static void test_all_ran(void **state)
{
    world_t *w = *state;
    fast_run(w, 0, 1, 4, true);
    fast_run(w, 1, 1, 4, false);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    assert_int_equal(w->c->exec_seq, 2);
    assert_null(w->c->ranks[0].head);
    assert_int_equal(w->f.s[0]->in_flight, 0);
    colld_wire_cqe_t cq[4];
    assert_int_equal(fix_reap_cqes(&w->f, w->f.s[0], cq, 4), 0);
    assert_int_equal(w->c->trace_count, 1);
    assert_int_equal(w->c->trace[0].flags, COLLD_SQE_FAST);
    assert_int_equal(w->c->trace[0].status, COLLD_OK);
}

/* A rank whose next descriptor is later has gone past the collective: it ran it on the area. Its
 * slot's arrival time is not known any more: it is shown with the first arrival. */
static void test_rank_passed(void **state)
{
    world_t *w = *state;
    fast_run(w, 0, 1, 4, true);
    engine_post(w, 1, 2, 16384); /* rank 1's next one, one for the engine */
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    assert_int_equal(w->c->exec_seq, 2);
    assert_null(w->c->ranks[0].head);
    assert_non_null(w->c->ranks[1].head);
    assert_int_equal(w->c->trace_count, 1);
    assert_int_equal(w->c->trace_arrivals[1], w->c->trace_arrivals[0]);
}

/* An engine descriptor against a fast-area record: MISMATCH naming both calls. */
static void test_engine_against_record(void **state)
{
    world_t *w = *state;
    engine_post(w, 0, 1, 4);
    fast_run(w, 1, 1, 4, true);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->error, COLLD_ERR_MISMATCH);
    assert_string_equal(w->c->error_detail,
                        "collective #1 differs between ranks: rank 0: allreduce(float32, sum, count 4, root 0); "
                        "rank 1: allreduce(float32, sum, count 4, root 0)");
    /* Ranks waiting on the area wake with the error. */
    assert_int_equal(__atomic_load_n(&w->c->fast->status, __ATOMIC_SEQ_CST), COLLD_ERR_MISMATCH);
    assert_true(__atomic_load_n(&w->c->fast->gen, __ATOMIC_SEQ_CST) > 0);
}

/* Two records of different calls: MISMATCH. */
static void test_records_differ(void **state)
{
    world_t *w = *state;
    fast_run(w, 0, 1, 4, true);
    fast_run(w, 1, 1, 8, true);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->error, COLLD_ERR_MISMATCH);
    assert_string_equal(w->c->error_detail,
                        "collective #1 differs between ranks: rank 0: allreduce(float32, sum, count 4, root 0); "
                        "rank 1: allreduce(float32, sum, count 8, root 0)");
}

/* A mismatch whose report needs a call seen only in a slot: the daemon waits for the record (it
 * never judges a call from slot bytes), then names it. */
static void test_mismatch_waits_for_record(void **state)
{
    world_t *w = *state;
    engine_post(w, 0, 1, 4);
    fast_run(w, 1, 1, 4, false);
    colld_engine_run_once(&w->f.d);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    colld_wire_sqe_t rec = call(w, 1, 1, 4);
    rec.flags = COLLD_SQE_FAST;
    assert_true(fix_post(&w->f, w->f.s[1], &rec));
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->error, COLLD_ERR_MISMATCH);
    assert_string_equal(w->c->error_detail,
                        "collective #1 differs between ranks: rank 0: allreduce(float32, sum, count 4, root 0); "
                        "rank 1: allreduce(float32, sum, count 4, root 0)");
}

/* Records only, but a slot shows another call: its record is coming, so wait for it. */
static void test_slot_differs_waits(void **state)
{
    world_t *w = *state;
    fast_run(w, 0, 1, 4, true);
    fast_run(w, 1, 1, 8, false);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    assert_int_equal(w->c->exec_seq, 1);
}

/* In a report, a rank with neither record nor slot is "nothing yet", one gone past it ran "a small
 * collective on the fast area". */
static void test_mismatch_names_where_ranks_are(void **state)
{
    world_t *w = *state;
    engine_post(w, 0, 1, 4);
    fast_run(w, 1, 1, 4, true);
    colld_engine_run_once(&w->f.d);
    assert_string_equal(w->c->error_detail,
                        "collective #1 differs between ranks: rank 0: allreduce(float32, sum, count 4, root 0); "
                        "rank 1: allreduce(float32, sum, count 4, root 0); rank 2: nothing yet");
}

static void test_mismatch_names_passed_rank(void **state)
{
    world_t *w = *state;
    engine_post(w, 0, 1, 4);
    fast_run(w, 1, 1, 4, true);
    engine_post(w, 2, 2, 16384);
    colld_engine_run_once(&w->f.d);
    assert_string_equal(w->c->error_detail,
                        "collective #1 differs between ranks: rank 0: allreduce(float32, sum, count 4, root 0); "
                        "rank 1: allreduce(float32, sum, count 4, root 0); rank 2: a small collective on the fast "
                        "area");
}

static bool broken(void *arg)
{
    return ((world_t *)arg)->c->state == COLLD_COMM_BROKEN;
}

/* A rank that never comes: the others' records wait until the timeout from the first arrival,
 * then every rank fails, the missing ranks named. */
static void test_timeout_names_missing(void **state)
{
    world_t *w = make_world(3, 10);
    *state = w;
    fast_run(w, 0, 1, 4, true);
    fast_run(w, 2, 1, 4, false);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    assert_true(fix_run_until(&w->f, broken, w, 10000));
    assert_int_equal(w->c->error, COLLD_ERR_TIMEOUT);
    assert_string_equal(w->c->error_detail, "collective #1 timed out after 10 ms: rank(s) 1 never arrived (fast area)");
}

/* An arrival time from the future (the tenant's own clock values) is not believed. */
static void test_future_arrival(void **state)
{
    world_t *w = *state;
    fast_run(w, 0, 1, 4, true);
    colld_wire_sqe_t q = call(w, 1, 1, 4);
    fix_fast_publish(w->c, 1, &q, UINT64_MAX / 2);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->exec_seq, 2);
    assert_true(w->c->trace_arrivals[1] <= colld_now_ns());
}

/* A rank that leaves after every rank ran a collective on the area, before the engine looked
 * again: it is settled (recorded, its records retired) before the communicator closes, so it does
 * not count as failed. */
static void test_settle_before_leave(void **state)
{
    world_t *w = *state;
    fast_run(w, 0, 1, 4, true);
    colld_engine_run_once(&w->f.d); /* rank 1 not there yet: the record waits */
    assert_int_equal(w->c->exec_seq, 1);
    colld_wire_sqe_t q = call(w, 1, 1, 4);
    fix_fast_publish(w->c, 1, &q, colld_now_ns()); /* it ran it, then leaves at once */
    colld_daemon_t *d = &w->f.d;
    colld_dcomm_t *c = w->c;
    colld_err_t err = COLLD_ERR_INIT;
    pthread_mutex_lock(&d->lock);
    assert_int_equal(colld_comm_leave(d, w->f.s[1], c->ranks[1].handle, &err), COLLD_OK);
    assert_int_equal(c->exec_seq, 2);
    assert_int_equal(c->trace_count, 1);
    assert_int_equal(c->trace[0].status, COLLD_OK);
    assert_int_equal(c->state, COLLD_COMM_CLOSING);
    char want[160];
    snprintf(want, sizeof(want), "rank 1 (pid 1001) has destroyed its handle of communicator %llu",
             (unsigned long long)c->id);
    assert_string_equal(c->error_detail, want);
    colld_daemon_unlock(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_all_engine, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_all_ran, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_rank_passed, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_engine_against_record, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_records_differ, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_waits_for_record, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_slot_differs_waits, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_names_where_ranks_are, setup3, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_names_passed_rank, setup3, teardown),
        cmocka_unit_test_teardown(test_timeout_names_missing, teardown),
        cmocka_unit_test_setup_teardown(test_future_arrival, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_settle_before_leave, setup2, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
