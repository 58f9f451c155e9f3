/*
 * test_core_deadlock.c - cross-communicator deadlock detection (server/core/deadlock.c) in the
 * daemon core in-process (tests/fuzz/core_fixture.h), on a clock of the test's own: a cycle is
 * reported only once it has stayed the same for --deadlock-ms, a wait without a cycle never, and
 * with --deadlock-fail both communicators fail with the exact detail a client gets; cycles of sends
 * and receives, within one communicator or with a collective of another. No tenant can blind the
 * check (issue 26 row 2): two cycles are both reported in the same look, a tenant whose cycles come
 * and go (fresh communicators every 100 ms) delays neither another tenant's cycle nor one of its own
 * processes that stays, and a tenant over the bound on waits is left out while another's cycle is
 * found.
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

/* ============================================================================================
 * Several cycles, churning cycles, a tenant over the bound (issue 26 row 2)
 * ========================================================================================== */

/* A ready communicator named `name` of the sessions s[0 .. n) (rank i = session s[i]), which must
 * be of one uid. */
static colld_dcomm_t *comm_of(world_t *w, const int *s, int n, const char *name)
{
    colld_daemon_t *d = &w->f.d;
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    colld_dcomm_t *c = NULL;
    pthread_mutex_lock(&d->lock);
    if (colld_comm_issue_uid(d, w->f.s[s[0]], uid) == COLLD_OK) {
        for (int r = 0; r < n; r++)
            colld_comm_join(d, w->f.s[s[r]], uid, n, r, 600000, name, false, NULL, NULL);
        for (colld_dcomm_t *x = d->comms; x; x = x->next)
            if (memcmp(x->unique_id, uid, sizeof(uid)) == 0 && x->state == COLLD_COMM_READY)
                c = x;
    }
    colld_daemon_unlock(d);
    assert_non_null(c);
    return c;
}

/* Rank `rank` of c (on its own session) posts its first all-reduce, and the engine admits it. */
static void post_rank(world_t *w, colld_dcomm_t *c, int rank)
{
    colld_wire_sqe_t q = fix_sqe(c, rank, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    assert_true(fix_post(&w->f, c->ranks[rank].session, &q));
    colld_engine_run_once(&w->f.d);
}

/* Sessions s[0] and s[1] wait for each other: rank 0 in x, rank 1 in y. */
static void cross(world_t *w, colld_dcomm_t *x, colld_dcomm_t *y)
{
    post_rank(w, x, 0);
    post_rank(w, y, 1);
}

typedef struct {
    colld_dcomm_t *x, *y;
} pair_t;

static bool pair_done(void *arg)
{
    pair_t *p = arg;
    return p->x->ops_completed == 1 && p->y->ops_completed == 1;
}

/* One round of a tenant whose cycles come and go: two fresh communicators of sessions s[0], s[1]
 * (the newest, so the search meets them first) wait for each other crossed, then the last round's
 * cycle completes (each rank posts its other all-reduce). */
static void churn(world_t *w, const int *s, pair_t *last)
{
    pair_t now = { comm_of(w, s, 2, "churn-x"), comm_of(w, s, 2, "churn-y") };
    cross(w, now.x, now.y);
    if (last->x) {
        post_rank(w, last->x, 1);
        post_rank(w, last->y, 0);
        assert_true(fix_run_until(&w->f, pair_done, last, 10000));
        assert_int_equal(last->x->state, COLLD_COMM_READY);
        assert_int_equal(last->y->state, COLLD_COMM_READY);
    }
    for (int i = 0; i < w->f.nsessions; i++)
        fix_reap(&w->f, w->f.s[i]);
    *last = now;
}

/* The detail of c's failure names communicator `id`. */
static bool names_comm(const colld_dcomm_t *c, uint64_t id)
{
    char want[64];
    snprintf(want, sizeof(want), "of communicator %llu ", (unsigned long long)id);
    return strstr(c->error_detail, want) != NULL;
}

/* Two cycles of disjoint processes (one tenant): both are reported in the same look, once each, and
 * each pair of communicators fails with its own cycle. Before, the check tracked the first cycle it
 * found only: the second was first timed once the first had failed, and reported 500 ms later. */
static void test_two_cycles_both_reported(void **state)
{
    world_t *w = *state;
    w->f.d.cfg.deadlock_fail = true;
    for (int r = 0; r < 2; r++)
        assert_non_null(fix_session(&w->f, 1000, (uint8_t)(r + 3)));
    static const int s23[] = { 2, 3 };
    colld_dcomm_t *c = comm_of(w, s23, 2, "second-a"), *e = comm_of(w, s23, 2, "second-b");
    cross(w, w->a, w->b);
    cross(w, c, e);
    look(w, 0);
    look(w, 300);
    assert_int_equal(w->f.d.deadlocks, 0);
    look(w, 600);
    assert_int_equal(w->f.d.deadlocks, 2);
    colld_dcomm_t *all[] = { w->a, w->b, c, e };
    for (int i = 0; i < 4; i++)
        assert_int_equal(all[i]->error, COLLD_ERR_DEADLOCK);
    print_message("%s\n%s\n", w->a->error_detail, c->error_detail);
    assert_true(names_comm(w->a, w->a->id) && names_comm(w->a, w->b->id));
    assert_false(names_comm(w->a, c->id) || names_comm(w->a, e->id));
    assert_true(names_comm(c, c->id) && names_comm(c, e->id));
    assert_false(names_comm(c, w->a->id) || names_comm(c, w->b->id));
    look(w, 900);
    assert_int_equal(w->f.d.deadlocks, 2);
}

/* The same, report only: each cycle is reported once, in the same look, and not again while it
 * stays. */
static void test_two_cycles_reported_once(void **state)
{
    world_t *w = *state;
    for (int r = 0; r < 2; r++)
        assert_non_null(fix_session(&w->f, 2000, (uint8_t)(r + 3)));
    static const int s23[] = { 2, 3 };
    colld_dcomm_t *c = comm_of(w, s23, 2, "other-a"), *e = comm_of(w, s23, 2, "other-b");
    cross(w, w->a, w->b);
    cross(w, c, e);
    look(w, 0);
    look(w, 600);
    assert_int_equal(w->f.d.deadlocks, 2);
    for (uint64_t t = 700; t <= 2000; t += 100)
        look(w, t);
    assert_int_equal(w->f.d.deadlocks, 2);
    assert_int_equal(c->state, COLLD_COMM_READY);
}

/* Tenant 1000 (sessions 0, 1) makes a fresh cycle every 100 ms, none lasting 500 ms; tenant 2000
 * (sessions 2, 3) deadlocks for real at 0: its cycle fails at 500-600 ms as if it were alone, and
 * none of the churning ones does. Before, the search met the churning tenant's newest cycle first
 * every look, and its signature changed every round: the other's was never reported. */
static void test_churning_tenant_does_not_delay_another(void **state)
{
    world_t *w = *state;
    w->f.d.cfg.deadlock_fail = true;
    for (int r = 0; r < 2; r++)
        assert_non_null(fix_session(&w->f, 2000, (uint8_t)(r + 3)));
    static const int s01[] = { 0, 1 }, s23[] = { 2, 3 };
    colld_dcomm_t *c = comm_of(w, s23, 2, "victim-a"), *e = comm_of(w, s23, 2, "victim-b");
    cross(w, c, e);
    pair_t last = { 0 };
    uint64_t t = 0;
    for (; t <= 1500 && c->state == COLLD_COMM_READY; t += 100) {
        churn(w, s01, &last);
        look(w, t);
    }
    print_message("the victim's cycle failed at the look of %llu ms: %s\n", (unsigned long long)(t - 100),
                  c->error_detail);
    assert_int_equal(c->error, COLLD_ERR_DEADLOCK);
    assert_int_equal(e->error, COLLD_ERR_DEADLOCK);
    assert_true(t - 100 <= 600);
    assert_true(names_comm(c, c->id) && names_comm(c, e->id));
    assert_null(strstr(c->error_detail, "churn"));
    assert_int_equal(w->f.d.deadlocks, 1); /* none of the churning cycles lasted 500 ms */
    for (int i = 0; i < 4; i++) {          /* and the churn goes on */
        churn(w, s01, &last);
        look(w, t + 100 * (uint64_t)i);
    }
    assert_int_equal(w->f.d.deadlocks, 1);
    assert_int_equal(last.x->state, COLLD_COMM_READY);
}

/* A cycle that stays between the same two processes as the churning ones (one tenant: the
 * processes wait for each other in a and b, and in fresh communicators that come and go) is still
 * reported after 500 ms: only its waits are old enough. */
static void test_churn_beside_a_cycle_of_the_same_processes(void **state)
{
    world_t *w = *state;
    w->f.d.cfg.deadlock_fail = true;
    static const int s01[] = { 0, 1 };
    cross(w, w->a, w->b);
    pair_t last = { 0 };
    uint64_t t = 0;
    for (; t <= 1500 && w->a->state == COLLD_COMM_READY; t += 100) {
        churn(w, s01, &last);
        look(w, t);
    }
    print_message("the cycle failed at the look of %llu ms: %s\n", (unsigned long long)(t - 100), w->a->error_detail);
    assert_int_equal(w->a->error, COLLD_ERR_DEADLOCK);
    assert_true(t - 100 <= 600);
    assert_true(names_comm(w->a, w->a->id) && names_comm(w->a, w->b->id));
    assert_null(strstr(w->a->error_detail, "churn"));
}

/* With a bound of 4 waits per tenant, tenant 1000 holds 6 (its cycle in a and b, and 4 more
 * communicators of two other processes where rank 0 waits): its communicators are left out, and
 * tenant 2000's cycle is reported and fails after 500 ms. A tenant found over its bound is left out
 * for a second without a look (at 0 and again at 1000 ms here); once the bound is back to its
 * default (at 1300 ms), its cycle is first seen at the look after that second (2000 ms) and fails
 * 500 ms later. Before, a daemon over the bound (65,536 waits, all tenants together) looked at
 * nothing at all. */
static void test_tenant_over_bound_left_out(void **state)
{
    world_t *w = *state;
    w->f.d.cfg.deadlock_fail = true;
    w->f.d.dl_budget = 4;
    for (int r = 0; r < 4; r++)
        assert_non_null(fix_session(&w->f, r < 2 ? 2000 : 1000, (uint8_t)(r + 3)));
    static const int s23[] = { 2, 3 }, s45[] = { 4, 5 };
    colld_dcomm_t *c = comm_of(w, s23, 2, "victim-a"), *e = comm_of(w, s23, 2, "victim-b");
    cross(w, w->a, w->b);
    for (int i = 0; i < 4; i++)
        post_rank(w, comm_of(w, s45, 2, "waits"), 0);
    cross(w, c, e);
    look(w, 0);
    look(w, 600);
    assert_int_equal(w->f.d.deadlocks, 1);
    assert_int_equal(c->error, COLLD_ERR_DEADLOCK);
    assert_int_equal(e->error, COLLD_ERR_DEADLOCK);
    uint64_t t = 700;
    for (; t <= 1200; t += 100)
        look(w, t);
    w->f.d.dl_budget = 0;
    for (; t <= 1900; t += 100)
        look(w, t);
    assert_int_equal(w->a->state, COLLD_COMM_READY); /* still left out */
    assert_int_equal(w->b->state, COLLD_COMM_READY);
    look(w, 2000);
    look(w, 2400);
    assert_int_equal(w->a->state, COLLD_COMM_READY);
    look(w, 2500);
    assert_int_equal(w->f.d.deadlocks, 2);
    assert_int_equal(w->a->error, COLLD_ERR_DEADLOCK);
    assert_int_equal(w->b->error, COLLD_ERR_DEADLOCK);
}

/* The bound counts the pairs of ranks of a communicator's sends and receives too, before the walk
 * over them: with a bound of 2, tenant 1000 holds 3 (sends 0 -> 1 and 1 -> 0 in a, a cycle of its
 * own, and rank 0 waiting in b's all-reduce) and is left out; tenant 2000's cycle (2 pairs) fails
 * after 500 ms, and tenant 1000's communicators stay as they are. */
static void test_tenant_over_bound_by_sends(void **state)
{
    world_t *w = *state;
    w->f.d.cfg.deadlock_fail = true;
    w->f.d.dl_budget = 2;
    for (int r = 0; r < 2; r++)
        assert_non_null(fix_session(&w->f, 2000, (uint8_t)(r + 3)));
    static const int s23[] = { 2, 3 };
    colld_dcomm_t *c = comm_of(w, s23, 2, "victim-a"), *e = comm_of(w, s23, 2, "victim-b");
    post_p2p(w, w->a, 0, 1, COLLD_KIND_SEND, 1);
    post_p2p(w, w->a, 1, 1, COLLD_KIND_SEND, 0);
    post(w, w->b, 0);
    cross(w, c, e);
    for (uint64_t t = 0; t <= 600; t += 100)
        look(w, t);
    assert_int_equal(w->f.d.deadlocks, 1);
    assert_int_equal(c->error, COLLD_ERR_DEADLOCK);
    assert_int_equal(e->error, COLLD_ERR_DEADLOCK);
    assert_int_equal(w->a->state, COLLD_COMM_READY);
    assert_int_equal(w->b->state, COLLD_COMM_READY);
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
        cmocka_unit_test_setup_teardown(test_two_cycles_both_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_cycles_reported_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_churning_tenant_does_not_delay_another, setup, teardown),
        cmocka_unit_test_setup_teardown(test_churn_beside_a_cycle_of_the_same_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tenant_over_bound_left_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tenant_over_bound_by_sends, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
