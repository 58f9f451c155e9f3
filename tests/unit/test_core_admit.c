/*
 * test_core_admit.c - admission of descriptors by the daemon core, in-process (tests/fuzz/
 * core_fixture.h: sessions with their rings in memory, a communicator formed by the real registry,
 * the engine a round at a time). Each field of a descriptor is refused when it is wrong, with the
 * status and the exact detail a client sees (colld_comm_last_error), and the communicator breaks
 * so that no peer waits; what NCCL leaves unused (a non-root's broadcast send buffer, reduce
 * receive buffer) is not checked.
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

/* Two ranks (sessions of uid 1000, pids 1000 and 1001) of one communicator, with or without a
 * fast area. */
static int setup_with(void **state, uint64_t fast_bytes)
{
    world_t *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    assert_int_equal(fix_start(&w->f, fast_bytes), 0);
    assert_non_null(fix_session(&w->f, 1000, 1));
    assert_non_null(fix_session(&w->f, 1000, 2));
    w->c = fix_comm(&w->f, 2, 60000);
    assert_non_null(w->c);
    *state = w;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, 0);
}

static int setup_fast(void **state)
{
    return setup_with(state, 16384);
}

static int teardown(void **state)
{
    world_t *w = *state;
    fix_stop(&w->f);
    free(w);
    return 0;
}

/* Post one descriptor as rank `rank`, run a round, and return the status of its completion
 * (the first completion of rank `rank` with its sequence number). */
static colld_status_t admit_one(world_t *w, int rank, const colld_wire_sqe_t *sqe)
{
    colld_session_t *s = w->f.s[rank];
    assert_true(fix_post(&w->f, s, sqe));
    colld_engine_run_once(&w->f.d);
    colld_wire_cqe_t cq[16];
    int n = fix_reap_cqes(&w->f, s, cq, 16);
    for (int i = 0; i < n; i++)
        if (cq[i].seq == sqe->seq && cq[i].comm == sqe->comm)
            return (colld_status_t)cq[i].status;
    fail_msg("no completion for collective #%llu", (unsigned long long)sqe->seq);
    return COLLD_OK;
}

/* A refused descriptor: its completion has `st`, and the communicator broke with `st` and
 * exactly `detail`. */
static void expect_refused(world_t *w, int rank, const colld_wire_sqe_t *sqe, colld_status_t st, const char *detail)
{
    assert_int_equal(admit_one(w, rank, sqe), st);
    assert_int_equal(w->c->state, COLLD_COMM_BROKEN);
    assert_int_equal(w->c->error, st);
    assert_string_equal(w->c->error_detail, detail);
}

static void test_kind(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, (colld_kind_t)(COLLD_KIND_MAX + 1), COLLD_FLOAT32, COLLD_SUM, 4, 0);
    expect_refused(w, 0, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 0 (pid 1000), collective #1: unknown collective kind 11");
}

static void test_dtype(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 1, 1, COLLD_KIND_ALLREDUCE, (colld_dtype_t)12, COLLD_SUM, 4, 0);
    expect_refused(w, 1, &q, COLLD_ERR_INVALID_ARGUMENT, "rank 1 (pid 1001), collective #1: unknown dtype 12");
}

static void test_op(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_REDUCESCATTER, COLLD_INT32, (colld_redop_t)9, 4, 0);
    expect_refused(w, 0, &q, COLLD_ERR_INVALID_ARGUMENT, "rank 0 (pid 1000), collective #1: unknown reduction op 9");
}

/* A broadcast takes no op: a garbage op is not looked at. */
static void test_op_unused(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_BROADCAST, COLLD_INT32, (colld_redop_t)9, 4, 0);
    assert_true(fix_post(&w->f, w->f.s[0], &q));
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    assert_non_null(w->c->ranks[0].head);
}

static void test_root(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_REDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 2);
    expect_refused(w, 0, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 0 (pid 1000), collective #1: root 2 is out of range for 2 ranks");
    colld_wire_sqe_t n = fix_sqe(w->c, 1, 1, COLLD_KIND_BROADCAST, COLLD_FLOAT32, COLLD_SUM, 4, -1);
    assert_int_equal(admit_one(w, 1, &n), COLLD_ERR_INVALID_ARGUMENT); /* broken: fails at once */
}

static void test_count_overflow(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLGATHER, COLLD_FLOAT64, COLLD_SUM, UINT64_MAX / 8, 0);
    expect_refused(w, 0, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 0 (pid 1000), collective #1: count 2305843009213693951 overflows");
}

static void test_sequence_number(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 1, 3, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    expect_refused(w, 1, &q, COLLD_ERR_INVALID_ARGUMENT, "rank 1 (pid 1001) posted sequence number 3 where 1 was due");
}

/* With a fast area, sequence numbers may jump ahead (the ranks ran those collectives there), never
 * go back. */
static void test_sequence_number_fast(void **state)
{
    world_t *w = *state;
    assert_true(w->c->side_path);
    colld_wire_sqe_t ahead = fix_sqe(w->c, 0, 5, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4096, 0);
    assert_true(fix_post(&w->f, w->f.s[0], &ahead));
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    assert_int_equal(w->c->ranks[0].next_seq, 6);
    colld_wire_sqe_t back = fix_sqe(w->c, 0, 4, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4096, 0);
    expect_refused(w, 0, &back, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 0 (pid 1000) posted sequence number 4 where at least 6 was due");
}

static void test_record_without_area(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    q.flags = COLLD_SQE_FAST;
    assert_true(fix_post(&w->f, w->f.s[0], &q));
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_BROKEN);
    assert_string_equal(w->c->error_detail,
                        "rank 0 (pid 1000), collective #1: fast-path record on a communicator without a fast area");
    /* A record gets no completion of its own (its rank completed it), only the break's notice. */
    colld_wire_cqe_t cq[4];
    assert_int_equal(fix_reap_cqes(&w->f, w->f.s[0], cq, 4), 1);
    assert_int_equal(cq[0].seq, 0);
    assert_int_equal(cq[0].status, COLLD_ERR_INVALID_ARGUMENT);
    assert_int_equal(w->f.s[0]->in_flight, 0);
}

static void test_unknown_registration(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    q.send.reg_id = 7;
    expect_refused(
        w, 0, &q, COLLD_ERR_INVALID_ARGUMENT,
        "rank 0 (pid 1000), collective #1: send buffer: registration 7 is not one of this process's buffers");
}

static void test_overrun(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 1, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 16, 0);
    q.recv.offset = FIX_REG_BYTES - 32;
    expect_refused(w, 1, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 1 (pid 1001), collective #1: recv buffer: 64 bytes at offset 65504 overrun its 65536-byte "
                   "registration");
}

/* The offset past the end of the registration, not wrapping around (offset + bytes overflows). */
static void test_overrun_wrapping(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_INT8, COLLD_SUM, 16, 0);
    q.send.offset = UINT64_MAX - 8;
    expect_refused(w, 0, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 0 (pid 1000), collective #1: send buffer: 16 bytes at offset 18446744073709551607 overrun "
                   "its 65536-byte registration");
}

static void test_misaligned(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    q.recv.offset = 2;
    expect_refused(w, 0, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 0 (pid 1000), collective #1: recv buffer: offset 2 is not a multiple of the element size (4 "
                   "bytes)");
}

/* All-gather receives nranks x count; reduce-scatter sends nranks x count. */
static void test_sizes_by_kind(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLGATHER, COLLD_INT32, COLLD_SUM, FIX_REG_BYTES / 4 / 2 + 1,
                                 0);
    expect_refused(w, 0, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 0 (pid 1000), collective #1: recv buffer: 65544 bytes at offset 0 overrun its 65536-byte "
                   "registration");
}

static void test_sizes_reducescatter(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 1, 1, COLLD_KIND_REDUCESCATTER, COLLD_INT32, COLLD_SUM,
                                 FIX_REG_BYTES / 4 / 2 + 1, 0);
    expect_refused(w, 1, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 1 (pid 1001), collective #1: send buffer: 65544 bytes at offset 0 overrun its 65536-byte "
                   "registration");
}

/* A non-root's broadcast send buffer and reduce receive buffer are not used, so not checked. */
static void test_unused_buffers(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t b = fix_sqe(w->c, 1, 1, COLLD_KIND_BROADCAST, COLLD_INT32, COLLD_SUM, 4, 0);
    b.send.reg_id = 99;
    assert_true(fix_post(&w->f, w->f.s[1], &b));
    colld_wire_sqe_t r = fix_sqe(w->c, 1, 2, COLLD_KIND_REDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    r.recv.reg_id = 99;
    assert_true(fix_post(&w->f, w->f.s[1], &r));
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    assert_non_null(w->c->ranks[1].head);
    assert_non_null(w->c->ranks[1].head->next);
}

static void test_overlap(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    q.recv.reg_id = 1;
    q.recv.offset = 8;
    expect_refused(w, 0, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 0 (pid 1000), collective #1: send (offset 0, 16 bytes) and recv (offset 8, 16 bytes) "
                   "overlap without being in place (in place: the same buffer)");
}

static void test_overlap_allgather(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 1, 1, COLLD_KIND_ALLGATHER, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    q.recv.reg_id = 1;
    q.send.offset = 4;
    expect_refused(w, 1, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 1 (pid 1001), collective #1: send (offset 4, 16 bytes) and recv (offset 0, 32 bytes) "
                   "overlap without being in place (in place: the same buffer, or sendbuf at the rank's slice of "
                   "recvbuf)");
}

/* In place as NCCL defines it: the same buffer, all-gather's send at the rank's slice of recv. */
static void test_in_place(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t a = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    a.recv = a.send;
    assert_true(fix_post(&w->f, w->f.s[0], &a));
    colld_wire_sqe_t g = fix_sqe(w->c, 1, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    assert_true(fix_post(&w->f, w->f.s[1], &g));
    colld_wire_sqe_t ag = fix_sqe(w->c, 1, 2, COLLD_KIND_ALLGATHER, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    ag.recv.reg_id = 1;
    ag.send.offset = 16; /* rank 1's slice of a 2 x 16-byte receive buffer */
    assert_true(fix_post(&w->f, w->f.s[1], &ag));
    colld_engine_run_once(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    assert_int_equal(w->c->exec_seq, 2); /* collective 1 ran; rank 1's second one waits */
    assert_non_null(w->c->ranks[1].head);
}

/* Device memory only in stream-ordered collectives: a host collective on it is refused. */
static void test_host_collective_on_device_memory(void **state)
{
    world_t *w = *state;
    colld_session_t *s = w->f.s[0];
    for (colld_reg_t *r = s->regs; r; r = r->next)
        if (r->id == 2)
            r->device = true; /* as a GPU backend's registration would be */
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    expect_refused(w, 0, &q, COLLD_ERR_INVALID_ARGUMENT,
                   "rank 0 (pid 1000), collective #1: host collective on a GPU buffer (registration 2)");
    for (colld_reg_t *r = s->regs; r; r = r->next)
        r->device = false;
}

/* A stream-ordered descriptor without a GPU: NOT_SUPPORTED with the reason. */
static void test_stream_without_gpu(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    q.flags = COLLD_SQE_STREAM;
    assert_int_equal(admit_one(w, 0, &q), COLLD_ERR_NOT_SUPPORTED);
    assert_int_equal(w->c->error, COLLD_ERR_NOT_SUPPORTED);
    const char *want = "rank 0 (pid 1000), collective #1: GPU collective, but no GPU here: ";
    assert_memory_equal(w->c->error_detail, want, strlen(want));
    assert_true(strlen(w->c->error_detail) > strlen(want)); /* and why there is none */
}

/* A descriptor for a handle the session does not hold fails alone: no communicator breaks. */
static void test_unknown_handle(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t q = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    q.comm = 77;
    assert_int_equal(admit_one(w, 0, &q), COLLD_ERR_INVALID_ARGUMENT);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
}

/* After a refusal the communicator is broken: the peer's collective fails at once with the first
 * error, and every rank gets a notice (a completion with sequence number 0). */
static void test_peers_fail_fast(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t bad = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, (colld_dtype_t)40, COLLD_SUM, 4, 0);
    expect_refused(w, 0, &bad, COLLD_ERR_INVALID_ARGUMENT, "rank 0 (pid 1000), collective #1: unknown dtype 40");
    colld_wire_cqe_t cq[8];
    int n = fix_reap_cqes(&w->f, w->f.s[1], cq, 8);
    assert_int_equal(n, 1);
    assert_int_equal(cq[0].seq, 0);
    assert_int_equal(cq[0].status, COLLD_ERR_INVALID_ARGUMENT);
    colld_wire_sqe_t later = fix_sqe(w->c, 1, 1, COLLD_KIND_ALLREDUCE, COLLD_FLOAT32, COLLD_SUM, 4, 0);
    assert_int_equal(admit_one(w, 1, &later), COLLD_ERR_INVALID_ARGUMENT);
    assert_string_equal(w->c->error_detail, "rank 0 (pid 1000), collective #1: unknown dtype 40");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kind, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_op, setup, teardown),
        cmocka_unit_test_setup_teardown(test_op_unused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_root, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_overflow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sequence_number, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sequence_number_fast, setup_fast, teardown),
        cmocka_unit_test_setup_teardown(test_record_without_area, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_registration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overrun, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overrun_wrapping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_misaligned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sizes_by_kind, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sizes_reducescatter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unused_buffers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlap_allgather, setup, teardown),
        cmocka_unit_test_setup_teardown(test_in_place, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_collective_on_device_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_without_gpu, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_handle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peers_fail_fast, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
