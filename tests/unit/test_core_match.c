/*
 * test_core_match.c - matching, mismatch reports, time-outs naming ranks and execution on the
 * host backend, in the daemon core in-process (tests/fuzz/core_fixture.h). The details are the
 * exact strings a client gets from colld_comm_last_error.
 */
#include "tests/fuzz/core_fixture.h"

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

/* `nranks` ranks (uid 1000, pids 1000..) of one communicator with this timeout, no fast area. */
static world_t *make_world(int nranks, int timeout_ms)
{
    world_t *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    assert_int_equal(fix_start(&w->f, 0), 0);
    for (int r = 0; r < nranks; r++)
        assert_non_null(fix_session(&w->f, 1000, (uint8_t)(r + 1)));
    w->c = fix_comm(&w->f, nranks, timeout_ms);
    assert_non_null(w->c);
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

static void post(world_t *w, int rank, const colld_wire_sqe_t *q)
{
    assert_true(fix_post(&w->f, w->f.s[rank], q));
}

/* The status of rank `rank`'s completion of collective `seq` (fails when it has none). */
static colld_status_t completion_of(world_t *w, int rank, uint64_t seq)
{
    colld_wire_cqe_t cq[16];
    int n = fix_reap_cqes(&w->f, w->f.s[rank], cq, 16);
    for (int i = 0; i < n; i++)
        if (cq[i].seq == seq)
            return (colld_status_t)cq[i].status;
    fail_msg("rank %d has no completion of collective #%llu", rank, (unsigned long long)seq);
    return COLLD_OK;
}

/* Every rank's int32 input i + 10 * rank: the sum of 2 ranks is 2i + 10, of 3 ranks 3i + 30. */
static void fill_inputs(world_t *w, int nranks, int count)
{
    for (int r = 0; r < nranks; r++) {
        int32_t *in = fix_reg(w->f.s[r], 1);
        for (int i = 0; i < count; i++)
            in[i] = i + 10 * r;
    }
}

static void test_allreduce_executes(void **state)
{
    world_t *w = *state;
    fill_inputs(w, 3, 100);
    for (int r = 0; r < 3; r++) {
        colld_wire_sqe_t q = fix_sqe(w->c, r, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 100, 0);
        post(w, r, &q);
    }
    colld_engine_run_once(&w->f.d);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(completion_of(w, r, 1), COLLD_OK);
        int32_t *out = fix_reg(w->f.s[r], 2);
        for (int i = 0; i < 100; i++)
            assert_int_equal(out[i], 3 * i + 30);
    }
    assert_int_equal(w->c->ops_completed, 1);
    assert_int_equal(w->c->trace_count, 1); /* the flight recorder has it */
}

/* Ranks may post at different rounds: nothing runs until the last one has. */
static void test_waits_for_every_rank(void **state)
{
    world_t *w = *state;
    fill_inputs(w, 2, 8);
    colld_wire_sqe_t a = fix_sqe(w->c, 0, 1, COLLD_KIND_REDUCE, COLLD_INT32, COLLD_MAX, 8, 1);
    post(w, 0, &a);
    colld_engine_run_once(&w->f.d);
    assert_non_null(w->c->ranks[0].head);
    assert_int_equal(w->c->ops_completed, 0);
    colld_wire_sqe_t b = fix_sqe(w->c, 1, 1, COLLD_KIND_REDUCE, COLLD_INT32, COLLD_MAX, 8, 1);
    post(w, 1, &b);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(completion_of(w, 0, 1), COLLD_OK);
    assert_int_equal(completion_of(w, 1, 1), COLLD_OK);
    int32_t *out = fix_reg(w->f.s[1], 2);
    for (int i = 0; i < 8; i++)
        assert_int_equal(out[i], i + 10);
}

/* What the signature compares: kind, dtype, count, op where it reduces, root where it matters. */
static void test_mismatch_count(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t a = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    colld_wire_sqe_t b = fix_sqe(w->c, 1, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 8, 0);
    post(w, 0, &a);
    post(w, 1, &b);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(completion_of(w, 0, 1), COLLD_ERR_MISMATCH);
    assert_int_equal(completion_of(w, 1, 1), COLLD_ERR_MISMATCH);
    assert_int_equal(w->c->state, COLLD_COMM_BROKEN);
    assert_string_equal(w->c->error_detail,
                        "collective #1 differs between ranks: rank 0: allreduce(float32, sum, count 4, root 0); "
                        "rank 1: allreduce(float32, sum, count 8, root 0)");
}

static void test_mismatch_kind_dtype_op_root(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t a = fix_sqe(w->c, 0, 1, COLLD_KIND_REDUCE, COLLD_INT64, COLLD_PROD, 4, 1);
    colld_wire_sqe_t b = fix_sqe(w->c, 1, 1, COLLD_KIND_REDUCE, COLLD_INT64, COLLD_PROD, 4, 2);
    colld_wire_sqe_t c = fix_sqe(w->c, 2, 1, COLLD_KIND_BROADCAST, COLLD_FLOAT16, COLLD_SUM, 4, 1);
    post(w, 0, &a);
    post(w, 1, &b);
    post(w, 2, &c);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->error, COLLD_ERR_MISMATCH);
    assert_string_equal(w->c->error_detail,
                        "collective #1 differs between ranks: rank 0: reduce(int64, prod, count 4, root 1); rank 1: "
                        "reduce(int64, prod, count 4, root 2); rank 2: broadcast(float16, -, count 4, root 1)");
}

/* An all-reduce's root and a broadcast's op do not matter: the same call. */
static void test_same_call_ignores_unused_fields(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t a = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    colld_wire_sqe_t b = fix_sqe(w->c, 1, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 1);
    colld_wire_sqe_t c = fix_sqe(w->c, 0, 2, COLLD_KIND_BROADCAST, COLLD_INT32, COLLD_SUM, 4, 1);
    colld_wire_sqe_t d = fix_sqe(w->c, 1, 2, COLLD_KIND_BROADCAST, COLLD_INT32, COLLD_MAX, 4, 1);
    post(w, 0, &a);
    post(w, 1, &b);
    post(w, 0, &c);
    post(w, 1, &d);
    colld_engine_run_once(&w->f.d);
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    assert_int_equal(w->c->ops_completed, 2);
}

static bool broken(void *arg)
{
    return ((world_t *)arg)->c->state == COLLD_COMM_BROKEN;
}

/* A rank that never comes: after the timeout every waiting rank fails, the detail naming the
 * missing ranks and how long each other one waited. */
static void test_timeout_names_ranks(void **state)
{
    world_t *w = make_world(3, 5);
    *state = w;
    colld_wire_sqe_t a = fix_sqe(w->c, 1, 1, COLLD_KIND_ALLGATHER, COLLD_UINT8, COLLD_SUM, 4, 0);
    post(w, 1, &a);
    assert_true(fix_run_until(&w->f, broken, w, 10000));
    assert_int_equal(w->c->error, COLLD_ERR_TIMEOUT);
    assert_int_equal(completion_of(w, 1, 1), COLLD_ERR_TIMEOUT);
    const char *head = "collective #1 timed out after 5 ms: rank(s) 0 2 never arrived; waiting: rank 1 ";
    assert_memory_equal(w->c->error_detail, head, strlen(head));
    unsigned long long waited = 0;
    assert_int_equal(sscanf(w->c->error_detail + strlen(head), "%llu ms", &waited), 1);
    assert_true(waited >= 5);
    assert_int_equal(strcmp(w->c->error_detail + strlen(w->c->error_detail) - 3, " ms"), 0);
    /* The flight recorder kept the collective with the rank that posted it. */
    assert_int_equal(w->c->trace_count, 1);
    assert_int_equal(w->c->trace[0].status, COLLD_ERR_TIMEOUT);
    assert_int_equal(w->c->trace_arrivals[0], 0);
    assert_true(w->c->trace_arrivals[1] != 0);
    assert_int_equal(w->c->trace_arrivals[2], 0);
}

/* Nothing posted: nothing times out, whatever the wait. */
static void test_no_timeout_when_idle(void **state)
{
    world_t *w = make_world(2, 1);
    *state = w;
    assert_false(fix_run_until(&w->f, broken, w, 20));
    assert_int_equal(w->c->state, COLLD_COMM_READY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_allreduce_executes, setup3, teardown),
        cmocka_unit_test_setup_teardown(test_waits_for_every_rank, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_count, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_kind_dtype_op_root, setup3, teardown),
        cmocka_unit_test_setup_teardown(test_same_call_ignores_unused_fields, setup2, teardown),
        cmocka_unit_test_teardown(test_timeout_names_ranks, teardown),
        cmocka_unit_test_teardown(test_no_timeout_when_idle, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
