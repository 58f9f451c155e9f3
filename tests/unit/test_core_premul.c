/*
 * test_core_premul.c - the premultiplied sum in the daemon core, in-process (tests/fuzz/
 * core_fixture.h): admission of its scalar word (send.aux, recv.aux), matching (the scalar is each
 * rank's own, no part of the signature; premul_sum is an op of its own), and execution on the host
 * backend with each rank's own scalar. The details are the exact strings a client gets from
 * colld_comm_last_error.
 */
#include "tests/fuzz/core_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

typedef struct {
    fix_t f;
    colld_dcomm_t *c;
} world_t;

/* `nranks` ranks (uid 1000, pids 1000..) of one communicator, with a fast area of `fast_bytes`. */
static world_t *make_world(int nranks, uint64_t fast_bytes)
{
    world_t *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    assert_int_equal(fix_start(&w->f, fast_bytes), 0);
    for (int r = 0; r < nranks; r++)
        assert_non_null(fix_session(&w->f, 1000, (uint8_t)(r + 1)));
    w->c = fix_comm(&w->f, nranks, 60000);
    assert_non_null(w->c);
    return w;
}

static int setup2(void **state)
{
    *state = make_world(2, 0);
    return 0;
}

static int setup3(void **state)
{
    *state = make_world(3, 0);
    return 0;
}

static int setup2_fast(void **state)
{
    *state = make_world(2, 16384);
    return 0;
}

static int teardown(void **state)
{
    world_t *w = *state;
    fix_stop(&w->f);
    free(w);
    return 0;
}

/* A premultiplied-sum descriptor of rank `rank` with its scalar word. */
static colld_wire_sqe_t premul_sqe(world_t *w, int rank, uint64_t seq, colld_kind_t kind, colld_dtype_t dtype,
                                   uint64_t count, int root, uint64_t word)
{
    colld_wire_sqe_t q = fix_sqe(w->c, rank, seq, kind, dtype, (colld_redop_t)COLLD_REDOP_PREMUL_SUM, count, root);
    colld_wire_sqe_set_scalar(&q, word);
    return q;
}

/* The scalar word of an int32 / a float. */
static uint64_t word_i32(int32_t v)
{
    uint64_t w = 0;
    memcpy(&w, &v, sizeof v);
    return w;
}

static uint64_t word_f32(float v)
{
    uint64_t w = 0;
    memcpy(&w, &v, sizeof v);
    return w;
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

/* Post one descriptor as rank `rank`, run a round, and expect it refused with `st` and exactly
 * `detail` (the communicator broken). */
static void expect_refused(world_t *w, int rank, const colld_wire_sqe_t *q, colld_status_t st, const char *detail)
{
    assert_true(fix_post(&w->f, w->f.s[rank], q));
    colld_engine_run_once(&w->f.d);
    assert_int_equal(completion_of(w, rank, q->seq), st);
    assert_int_equal(w->c->state, COLLD_COMM_BROKEN);
    assert_int_equal(w->c->error, st);
    assert_string_equal(w->c->error_detail, detail);
}

/* Three ranks, three different scalars (2, -3, 5) on int32 inputs i + 10 r: every rank gets
 * 2 i - 3 (i + 10) + 5 (i + 20) = 4 i + 70, in place on rank 1 (its receive buffer is its send
 * buffer), through the host backend. */
static void test_allreduce_own_scalars(void **state)
{
    world_t *w = *state;
    const int32_t sc[3] = { 2, -3, 5 };
    for (int r = 0; r < 3; r++) {
        int32_t *in = fix_reg(w->f.s[r], 1);
        for (int i = 0; i < 100; i++)
            in[i] = i + 10 * r;
        colld_wire_sqe_t q = premul_sqe(w, r, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, 100, 0, word_i32(sc[r]));
        if (r == 1)
            q.recv = q.send, colld_wire_sqe_set_scalar(&q, word_i32(sc[r]));
        assert_true(fix_post(&w->f, w->f.s[r], &q));
    }
    colld_engine_run_once(&w->f.d);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(completion_of(w, r, 1), COLLD_OK);
        int32_t *out = fix_reg(w->f.s[r], r == 1 ? 1 : 2);
        for (int i = 0; i < 100; i++)
            assert_int_equal(out[i], 4 * i + 70);
    }
    assert_int_equal(w->c->state, COLLD_COMM_READY);
}

/* Reduce-scatter of float32 with scalars 0.5 and 4 on two ranks: rank q's slice q of
 * 0.5 * x_0 + 4 * x_1 (x_r[i] = i + 10 r, exact). */
static void test_reducescatter(void **state)
{
    world_t *w = *state;
    const float sc[2] = { 0.5f, 4.0f };
    for (int r = 0; r < 2; r++) {
        float *in = fix_reg(w->f.s[r], 1);
        for (int i = 0; i < 16; i++)
            in[i] = (float)(i + 10 * r);
        colld_wire_sqe_t q = premul_sqe(w, r, 1, COLLD_KIND_REDUCESCATTER, COLLD_FLOAT32, 8, 0, word_f32(sc[r]));
        assert_true(fix_post(&w->f, w->f.s[r], &q));
    }
    colld_engine_run_once(&w->f.d);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(completion_of(w, r, 1), COLLD_OK);
        float *out = fix_reg(w->f.s[r], 2);
        for (int i = 0; i < 8; i++) {
            int e = 8 * r + i;
            assert_true(out[i] == 0.5f * (float)e + 4.0f * (float)(e + 10));
        }
    }
}

/* premul_sum is an op of its own: against a sum it is a mismatch, and the report names it. */
static void test_mismatch_with_sum(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t a = premul_sqe(w, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, 4, 0, word_f32(0.5f));
    colld_wire_sqe_t b = fix_sqe(w->c, 1, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    assert_true(fix_post(&w->f, w->f.s[0], &a));
    assert_true(fix_post(&w->f, w->f.s[1], &b));
    colld_engine_run_once(&w->f.d);
    assert_int_equal(completion_of(w, 0, 1), COLLD_ERR_MISMATCH);
    assert_int_equal(completion_of(w, 1, 1), COLLD_ERR_MISMATCH);
    assert_string_equal(w->c->error_detail,
                        "collective #1 differs between ranks: rank 0: allreduce(float32, premul_sum, count 4, root 0); "
                        "rank 1: allreduce(float32, sum, count 4, root 0)");
}

/* A scalar word with bytes past its dtype's value is refused, naming the rank and the field. */
static void test_scalar_word_too_wide(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = premul_sqe(w, 1, 1, COLLD_KIND_REDUCE, COLLD_FLOAT16, 4, 0, 0x13c00);
    expect_refused(w, 1, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 1 (pid 1001), collective #1: premultiplied-sum scalar word 0x0000000000013c00 (send.aux, "
                   "recv.aux) has bytes past its 2-byte float16 value");
}

/* The high half of a 64-bit scalar is recv.aux: a full word is fine for int64. */
static void test_scalar_word_int64(void **state)
{
    world_t *w = *state;
    int64_t sc[2] = { -(1ll << 40), 3 };
    for (int r = 0; r < 2; r++) {
        int64_t *in = fix_reg(w->f.s[r], 1);
        for (int i = 0; i < 4; i++)
            in[i] = i + 1;
        uint64_t word;
        memcpy(&word, &sc[r], 8);
        colld_wire_sqe_t q = premul_sqe(w, r, 1, COLLD_KIND_ALLREDUCE, COLLD_INT64, 4, 0, word);
        assert_int_equal(q.recv.aux, (uint32_t)(word >> 32));
        assert_true(fix_post(&w->f, w->f.s[r], &q));
    }
    colld_engine_run_once(&w->f.d);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(completion_of(w, r, 1), COLLD_OK);
        int64_t *out = fix_reg(w->f.s[r], 2);
        for (int i = 0; i < 4; i++)
            assert_true(out[i] == (int64_t)(i + 1) * (3 - (1ll << 40)));
    }
}

/* The aux words are 0 in every descriptor that is not a premultiplied sum (a broadcast with the
 * premul number as its unused op included). */
static void test_aux_outside_premul(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    q.recv.aux = 7;
    expect_refused(w, 0, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 0 (pid 1000), collective #1: send.aux and recv.aux are 0x0 and 0x7: they must be 0 outside "
                   "a premultiplied sum");
}

static void test_aux_in_broadcast(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = premul_sqe(w, 1, 1, COLLD_KIND_BROADCAST, COLLD_INT32, 4, 0, 2);
    expect_refused(w, 1, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 1 (pid 1001), collective #1: send.aux and recv.aux are 0x2 and 0x0: they must be 0 outside "
                   "a premultiplied sum");
}

/* An op number past the premultiplied sum is unknown. */
static void test_op_past_premul(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, (colld_redop_t)COLLD_WIRE_REDOPS, 4, 0);
    expect_refused(w, 0, &q, COLLD_ERR_INVALID_ARGUMENT, "rank 0 (pid 1000), collective #1: unknown reduction op 6");
}

/* A fast-path record of a premultiplied sum carries no scalar (the ranks publish theirs in their
 * slots): one with aux words is refused. */
static void test_record_carries_no_scalar(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = premul_sqe(w, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, 4, 0, word_f32(2.0f));
    q.flags = COLLD_SQE_FAST;
    q.send.offset = 0;
    assert_true(fix_post(&w->f, w->f.s[0], &q));
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_BROKEN);
    assert_string_equal(
        w->c->error_detail,
        "rank 0 (pid 1000), collective #1: send.aux and recv.aux are 0x40000000 and 0x0: they must be 0 "
        "outside a premultiplied sum");
    /* A record gets no completion of its own, only the break's notice. */
    colld_wire_cqe_t cq[4];
    assert_int_equal(fix_reap_cqes(&w->f, w->f.s[0], cq, 4), 1);
    assert_int_equal(cq[0].seq, 0);
    assert_int_equal(cq[0].status, COLLD_ERR_INVALID_ARGUMENT);
}

/* A record of a premultiplied sum without aux words is taken like any record. */
static void test_record_of_premul(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, (colld_redop_t)COLLD_REDOP_PREMUL_SUM,
                                 4, 0);
    q.flags = COLLD_SQE_FAST;
    q.send.offset = 0;
    assert_true(fix_post(&w->f, w->f.s[0], &q));
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_allreduce_own_scalars, setup3, teardown),
        cmocka_unit_test_setup_teardown(test_reducescatter, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_with_sum, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_scalar_word_too_wide, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_scalar_word_int64, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_aux_outside_premul, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_aux_in_broadcast, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_op_past_premul, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_record_carries_no_scalar, setup2_fast, teardown),
        cmocka_unit_test_setup_teardown(test_record_of_premul, setup2_fast, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
