/*
 * test_core_deadlock.c - cross-communicator deadlock detection (server/core/deadlock.c) in the
 * daemon core in-process (tests/fuzz/core_fixture.h), on a clock of the test's own: a cycle is
 * reported only once it has stayed the same for --deadlock-ms, a wait without a cycle never, and
 * with --deadlock-fail both communicators fail with the exact detail a client gets; cycles of sends
 * and receives, within one communicator or with a collective of another.
 */
#include "tests/fuzz/core_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define MS 1000000ull

typedef struct {
    fix_t f;
    colld_dcomm_t *a, *b; /* two communicators of sessions 0 and 1, rank i = session i */
} world_t;

static int setup(void **state)
{
    world_t *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    assert_int_equal(fix_start(&w->f, 0), 0);
    for (int r = 0; r < 2; r++)
        assert_non_null(fix_session(&w->f, 1000, (uint8_t)(r + 1)));
    w->a = fix_comm(&w->f, 2, 600000);
    w->b = fix_comm(&w->f, 2, 600000);
    assert_non_null(w->a);
    assert_non_null(w->b);
    *state = w; /* --deadlock-ms stays 0 for the engine's own rounds: look() checks on the test's clock */
    return 0;
}

static int teardown(void **state)
{
    world_t *w = *state;
    fix_stop(&w->f);
    free(w);
    return 0;
}

/* Rank `rank` of c posts its first all-reduce, and the engine admits it. */
static void post(world_t *w, colld_dcomm_t *c, int rank)
{
    colld_wire_sqe_t q = fix_sqe(c, rank, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    assert_true(fix_post(&w->f, w->f.s[rank], &q));
    colld_engine_run_once(&w->f.d);
}

/* Look at time t (ms) under the lock, as the engine does, with --deadlock-ms 500. */
static void look(world_t *w, uint64_t t_ms)
{
    pthread_mutex_lock(&w->f.d.lock);
    w->f.d.cfg.deadlock_ms = 500;
    w->f.d.dl_next_ns = 0;
    colld_deadlock_check(&w->f.d, 1000 * MS + t_ms * MS);
    w->f.d.cfg.deadlock_ms = 0;
    pthread_mutex_unlock(&w->f.d.lock);
}

/* Session 0 waits in a for session 1, which waits in b for session 0: reported after 500 ms of
 * the same cycle, once, and (report only) nothing fails. */
static void test_cycle_reported_after_deadlock_ms(void **state)
{
    world_t *w = *state;
    post(w, w->a, 0);
    post(w, w->b, 1);
    look(w, 0);
    assert_int_equal(w->f.d.deadlocks, 0);
    look(w, 300);
    assert_int_equal(w->f.d.deadlocks, 0);
    look(w, 600);
    assert_int_equal(w->f.d.deadlocks, 1);
    look(w, 900);
    assert_int_equal(w->f.d.deadlocks, 1); /* once per cycle */
    assert_int_equal(w->a->state, COLLD_COMM_READY);
    assert_int_equal(w->b->state, COLLD_COMM_READY);
}

/* One communicator waits, the other is idle: no cycle, never reported. */
static void test_no_cycle(void **state)
{
    world_t *w = *state;
    post(w, w->a, 0);
    for (uint64_t t = 0; t <= 2000; t += 200)
        look(w, t);
    assert_int_equal(w->f.d.deadlocks, 0);
}

/* The cycle resolves before --deadlock-ms (session 1 posts in a too): not reported. */
static void test_cycle_that_resolves(void **state)
{
    world_t *w = *state;
    post(w, w->a, 0);
    post(w, w->b, 1);
    look(w, 0);
    look(w, 200);
    post(w, w->a, 1); /* a runs: the cycle is gone */
    look(w, 400);
    look(w, 800);
    assert_int_equal(w->f.d.deadlocks, 0);
}

/* --deadlock-fail: both communicators fail with COLLD_ERR_DEADLOCK and the cycle in words. */
static void test_cycle_fails_with_detail(void **state)
{
    world_t *w = *state;
    w->f.d.cfg.deadlock_fail = true;
    post(w, w->a, 0);
    post(w, w->b, 1);
    look(w, 0);
    look(w, 600);
    assert_int_equal(w->f.d.deadlocks, 1);
    assert_int_equal(w->a->error, COLLD_ERR_DEADLOCK);
    assert_int_equal(w->b->error, COLLD_ERR_DEADLOCK);
    char want[512];
    /* the cycle is told from the newest communicator (the daemon's list is newest first) */
    snprintf(want, sizeof(want),
             "deadlock across communicators: rank 1 (pid %d) of communicator %llu 'fuzz' waits in collective #1 for "
             "rank 0 (pid %d); rank 0 (pid %d) of communicator %llu 'fuzz' waits in collective #1 for rank 1 (pid %d)",
             (int)w->b->ranks[1].pid, (unsigned long long)w->b->id, (int)w->b->ranks[0].pid, (int)w->a->ranks[0].pid,
             (unsigned long long)w->a->id, (int)w->a->ranks[1].pid);
    print_message("%s\n", w->a->error_detail);
    assert_string_equal(w->a->error_detail, want);
    assert_string_equal(w->b->error_detail, want);
}

/* Rank `rank` of c posts a send to (or receive from) `peer` as operation `id`, outside a group. */
static void post_p2p(world_t *w, colld_dcomm_t *c, int rank, uint64_t id, colld_kind_t kind, int peer)
{
    colld_wire_sqe_t q = fix_sqe(c, rank, id, kind, COLLD_INT32, COLLD_SUM, 4, peer);
    assert_true(fix_post(&w->f, w->f.s[rank], &q));
    colld_engine_run_once(&w->f.d);
}

/* Point-to-point: both ranks of one communicator send first, outside a group: a cycle within one
 * communicator, reported after --deadlock-ms and (with --deadlock-fail) failing it with the detail,
 * long before its 600 s time-out. */
static void test_p2p_cycle_in_one_communicator(void **state)
{
    world_t *w = *state;
    w->f.d.cfg.deadlock_fail = true;
    post_p2p(w, w->a, 0, 1, COLLD_KIND_SEND, 1);
    post_p2p(w, w->a, 1, 1, COLLD_KIND_SEND, 0);
    look(w, 0);
    look(w, 300);
    assert_int_equal(w->f.d.deadlocks, 0);
    look(w, 600);
    assert_int_equal(w->f.d.deadlocks, 1);
    assert_int_equal(w->a->error, COLLD_ERR_DEADLOCK);
    assert_int_equal(w->b->state, COLLD_COMM_READY);
    char want[512];
    snprintf(want, sizeof(want),
             "deadlock in one communicator: rank 0 (pid %d) of communicator %llu 'fuzz' waits to send to rank 1 "
             "(operation #1) for rank 1 (pid %d); rank 1 (pid %d) of communicator %llu 'fuzz' waits to send to rank "
             "0 (operation #1) for rank 0 (pid %d)",
             (int)w->a->ranks[0].pid, (unsigned long long)w->a->id, (int)w->a->ranks[1].pid, (int)w->a->ranks[1].pid,
             (unsigned long long)w->a->id, (int)w->a->ranks[0].pid);
    print_message("%s\n", w->a->error_detail);
    assert_string_equal(w->a->error_detail, want);
}

/* Across communicators: rank 0 of a waits to receive from rank 1, whose process waits in b's
 * all-reduce for rank 0's process; and, once reported, the cycle is not reported again. */
static void test_p2p_and_collective_cycle(void **state)
{
    world_t *w = *state;
    post_p2p(w, w->a, 0, 1, COLLD_KIND_RECV, 1);
    post(w, w->b, 1);
    look(w, 0);
    look(w, 600);
    assert_int_equal(w->f.d.deadlocks, 1);
    look(w, 900);
    assert_int_equal(w->f.d.deadlocks, 1);
    assert_int_equal(w->a->state, COLLD_COMM_READY); /* report only */
}

/* A send whose receive comes: no cycle, even when both were waiting at one look. */
static void test_p2p_no_cycle(void **state)
{
    world_t *w = *state;
    post_p2p(w, w->a, 0, 1, COLLD_KIND_SEND, 1);
    look(w, 0);
    post_p2p(w, w->a, 1, 1, COLLD_KIND_RECV, 0);
    for (uint64_t t = 200; t <= 2000; t += 200)
        look(w, t);
    assert_int_equal(w->f.d.deadlocks, 0);
    assert_int_equal(w->a->ops_completed, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cycle_reported_after_deadlock_ms, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_cycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cycle_that_resolves, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cycle_fails_with_detail, setup, teardown),
        cmocka_unit_test_setup_teardown(test_p2p_cycle_in_one_communicator, setup, teardown),
        cmocka_unit_test_setup_teardown(test_p2p_and_collective_cycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_p2p_no_cycle, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
