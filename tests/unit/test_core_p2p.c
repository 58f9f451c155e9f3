/*
 * test_core_p2p.c - point-to-point operations in the daemon core, in-process (tests/fuzz/
 * core_fixture.h): matching of sends and receives per pair in posting order, sends and receives
 * that progress per peer outside groups (a ring, crossed sends, a send to one peer that does not
 * wait behind one to another: issue 25), batches (groups), the order between a rank's sends,
 * receives and collectives (the collective ordinal), completions in each rank's posting order, the
 * bound on matching work per pass (issue 26), and the faults: mismatched sizes, time-outs naming
 * what is missing, a break with operations queued. The details are the exact strings a client gets
 * from colld_comm_last_error.
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

typedef struct {
    fix_t f;
    colld_dcomm_t *c;
} world_t;

/* `nranks` ranks (uid 1000, pids 1000..) of one communicator with this timeout, no fast area
 * unless `fast`. */
static world_t *make_world(int nranks, int timeout_ms, uint64_t fast)
{
    world_t *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    assert_int_equal(fix_start(&w->f, fast), 0);
    for (int r = 0; r < nranks; r++)
        assert_non_null(fix_session(&w->f, 1000, (uint8_t)(r + 1)));
    w->c = fix_comm(&w->f, nranks, timeout_ms);
    assert_non_null(w->c);
    return w;
}

static int setup2(void **state)
{
    *state = make_world(2, 60000, 0);
    return 0;
}

static int setup3(void **state)
{
    *state = make_world(3, 60000, 0);
    return 0;
}

static int setup4(void **state)
{
    *state = make_world(4, 60000, 0);
    return 0;
}

static int teardown(void **state)
{
    world_t *w = *state;
    if (w) {
        fix_stop(&w->f);
        free(w);
    }
    return 0;
}

/* Rank `rank`'s operation `id`: a send to or receive from `peer` of `count` int32 (send buffer
 * registration 1 at `soff` elements, receive buffer registration 2 at `roff` elements), linked to
 * the next one when `link`. */
static colld_wire_sqe_t p2p(world_t *w, int rank, uint64_t id, colld_kind_t kind, int peer, uint64_t count,
                            uint64_t off, bool link)
{
    colld_wire_sqe_t q = fix_sqe(w->c, rank, id, kind, COLLD_INT32, COLLD_SUM, count, peer);
    q.send.offset = q.recv.offset = off * sizeof(int32_t);
    if (link)
        q.flags |= COLLD_SQE_LINK;
    return q;
}

static void post(world_t *w, int rank, const colld_wire_sqe_t *q)
{
    assert_true(fix_post(&w->f, w->f.s[rank], q));
}

/* Every completion a rank has now, in the order it got them. */
static int reap(world_t *w, int rank, colld_wire_cqe_t *cq, int max)
{
    return fix_reap_cqes(&w->f, w->f.s[rank], cq, max);
}

/* Rank r's send buffer holds 1000 * (r + 1) + i; its receive buffer is zeroed. */
static void fill(world_t *w, int nranks)
{
    for (int r = 0; r < nranks; r++) {
        int32_t *in = fix_reg(w->f.s[r], 1), *out = fix_reg(w->f.s[r], 2);
        for (int i = 0; i < 1024; i++) {
            in[i] = 1000 * (r + 1) + i;
            out[i] = 0;
        }
    }
}

/* Whether rank r received `count` elements of rank `from`'s send buffer, starting at its element
 * `first`, at its own element `at`. */
static void expect_data(world_t *w, int r, int at, int from, int first, int count)
{
    const int32_t *out = fix_reg(w->f.s[r], 2);
    for (int i = 0; i < count; i++)
        if (out[at + i] != 1000 * (from + 1) + first + i)
            fail_msg("rank %d element %d: %d, want %d (from rank %d)", r, at + i, out[at + i],
                     1000 * (from + 1) + first + i, from);
}

static void run(world_t *w, int rounds)
{
    for (int i = 0; i < rounds; i++)
        colld_engine_run_once(&w->f.d);
}

/* ---------------------------------------------------------------------------------------------
 * Matching and data
 * ------------------------------------------------------------------------------------------- */

/* A send meets its receive: the data lands, both complete with their operation ids. */
static void test_send_recv(void **state)
{
    world_t *w = *state;
    fill(w, 2);
    colld_wire_sqe_t s = p2p(w, 0, 1, COLLD_KIND_SEND, 1, 100, 0, false);
    colld_wire_sqe_t r = p2p(w, 1, 1, COLLD_KIND_RECV, 0, 100, 0, false);
    post(w, 0, &s);
    run(w, 2);
    colld_wire_cqe_t cq[4];
    assert_int_equal(reap(w, 0, cq, 4), 0); /* nothing until the receive is there */
    post(w, 1, &r);
    run(w, 2);
    assert_int_equal(reap(w, 0, cq, 4), 1);
    assert_int_equal(cq[0].seq, 1);
    assert_int_equal(cq[0].status, COLLD_OK);
    assert_int_equal(reap(w, 1, cq, 4), 1);
    assert_int_equal(cq[0].seq, 1);
    assert_int_equal(cq[0].status, COLLD_OK);
    expect_data(w, 1, 0, 0, 0, 100);
    assert_int_equal(w->c->p2p_queued, 0);
    assert_int_equal(w->c->ops_completed, 1);
}

/* The k-th send of a to b meets the k-th receive of b from a: two sends of different sizes and
 * their receives, each outside a group. */
static void test_pairs_in_order(void **state)
{
    world_t *w = *state;
    fill(w, 2);
    colld_wire_sqe_t s1 = p2p(w, 0, 1, COLLD_KIND_SEND, 1, 10, 0, false);
    colld_wire_sqe_t s2 = p2p(w, 0, 2, COLLD_KIND_SEND, 1, 20, 100, false);
    colld_wire_sqe_t r1 = p2p(w, 1, 1, COLLD_KIND_RECV, 0, 10, 500, false);
    colld_wire_sqe_t r2 = p2p(w, 1, 2, COLLD_KIND_RECV, 0, 20, 0, false);
    post(w, 0, &s1);
    post(w, 0, &s2);
    post(w, 1, &r1);
    post(w, 1, &r2);
    run(w, 4);
    colld_wire_cqe_t cq[4];
    assert_int_equal(reap(w, 0, cq, 4), 2);
    assert_int_equal(cq[0].seq, 1);
    assert_int_equal(cq[1].seq, 2);
    assert_int_equal(reap(w, 1, cq, 4), 2);
    assert_int_equal(cq[0].status, COLLD_OK);
    assert_int_equal(cq[1].status, COLLD_OK);
    expect_data(w, 1, 500, 0, 0, 10);
    expect_data(w, 1, 0, 0, 100, 20);
}

/* Outside a group, two ranks that both send first and then receive (torch 2.x's isend, irecv):
 * each send meets the other rank's receive, as MPI's would (issue 25; before, each rank's
 * operations ran in posting order and this waited until the time-out). */
static void test_unbatched_exchange(void **state)
{
    world_t *w = *state;
    fill(w, 2);
    for (int r = 0; r < 2; r++) {
        colld_wire_sqe_t s = p2p(w, r, 1, COLLD_KIND_SEND, 1 - r, 40, 0, false);
        colld_wire_sqe_t v = p2p(w, r, 2, COLLD_KIND_RECV, 1 - r, 40, 100, false);
        post(w, r, &s);
        post(w, r, &v);
    }
    run(w, 3);
    for (int r = 0; r < 2; r++) {
        colld_wire_cqe_t cq[4];
        assert_int_equal(reap(w, r, cq, 4), 2);
        assert_int_equal(cq[0].seq, 1);
        assert_int_equal(cq[1].seq, 2);
        assert_int_equal(cq[0].status, COLLD_OK);
        assert_int_equal(cq[1].status, COLLD_OK);
        expect_data(w, r, 100, 1 - r, 0, 40);
    }
    assert_int_equal(w->c->p2p_queued, 0);
    assert_int_equal(w->c->p2p_npairs, 0); /* the index is empty again */
}

/* Two ranks that send to each other and never receive: the time-out names the receive that was
 * never posted and what the peer does instead. */
static void test_crossed_sends_time_out(void **state)
{
    world_t *w = make_world(2, 20, 0);
    *state = w;
    colld_wire_sqe_t s0 = p2p(w, 0, 1, COLLD_KIND_SEND, 1, 4, 0, false);
    colld_wire_sqe_t s1 = p2p(w, 1, 1, COLLD_KIND_SEND, 0, 4, 0, false);
    post(w, 0, &s0);
    run(w, 1);
    post(w, 1, &s1);
    for (int i = 0; i < 1000 && w->c->state == COLLD_COMM_READY; i++) {
        run(w, 1);
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    assert_int_equal(w->c->error, COLLD_ERR_TIMEOUT);
    const char *head = "point-to-point timed out after 20 ms: rank 0 (pid 1000) waited ";
    assert_memory_equal(w->c->error_detail, head, strlen(head));
    const char *tail = " ms to send 4 x int32 (16 B) to rank 1 (operation #1); rank 1 never posted the receive from "
                       "rank 0: it waits in its own point-to-point operations: send to rank 0";
    assert_non_null(strstr(w->c->error_detail, tail));
    colld_wire_cqe_t cq[4];
    assert_int_equal(reap(w, 0, cq, 4), 2); /* the send, then the break's notice */
    assert_int_equal(cq[0].seq, 1);
    assert_int_equal(cq[0].status, COLLD_ERR_TIMEOUT);
    assert_int_equal(w->c->p2p_queued, 0);
    assert_int_equal(w->c->p2p_npairs, 0);
}

/* A ring outside groups on 4 ranks (Gloo's and MPI's pattern): every rank sends to its right, then
 * receives from its left, one operation at a time; every transfer runs, data exact. The ranks post
 * in turn, each pass seeing one more. */
static void test_ring_outside_groups(void **state)
{
    world_t *w = *state;
    fill(w, 4);
    for (int r = 0; r < 4; r++) {
        colld_wire_sqe_t s = p2p(w, r, 1, COLLD_KIND_SEND, (r + 1) % 4, 64, 8 * r, false);
        colld_wire_sqe_t v = p2p(w, r, 2, COLLD_KIND_RECV, (r + 3) % 4, 64, 256, false);
        post(w, r, &s);
        post(w, r, &v);
        run(w, 1);
    }
    run(w, 3);
    for (int r = 0; r < 4; r++) {
        colld_wire_cqe_t cq[4];
        assert_int_equal(reap(w, r, cq, 4), 2);
        assert_int_equal(cq[0].seq, 1);
        assert_int_equal(cq[1].seq, 2);
        assert_int_equal(cq[0].status, COLLD_OK);
        assert_int_equal(cq[1].status, COLLD_OK);
        int left = (r + 3) % 4;
        expect_data(w, r, 256, left, 8 * left, 64);
    }
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    assert_int_equal(w->c->ops_completed, 4);
    assert_int_equal(w->c->p2p_queued, 0);
}

/* Sends and receives progress per peer: rank 0 sends to rank 1 (never received yet), then to rank
 * 2, and receives from rank 1 (not sent yet), then from rank 2. Rank 2's receive and send meet rank
 * 0's second send and second receive at once; the data lands, but their completions on rank 0 wait
 * for operations 1 and 3 (completions stay in posting order). Once rank 1 takes part, all of it
 * completes. */
static void test_independent_peers(void **state)
{
    world_t *w = make_world(3, 60000, 0);
    *state = w;
    fill(w, 3);
    colld_wire_sqe_t q0[4] = {
        p2p(w, 0, 1, COLLD_KIND_SEND, 1, 16, 0, false),
        p2p(w, 0, 2, COLLD_KIND_SEND, 2, 32, 100, false),
        p2p(w, 0, 3, COLLD_KIND_RECV, 1, 8, 300, false),
        p2p(w, 0, 4, COLLD_KIND_RECV, 2, 24, 400, false),
    };
    for (int i = 0; i < 4; i++)
        post(w, 0, &q0[i]);
    colld_wire_sqe_t from0 = p2p(w, 2, 1, COLLD_KIND_RECV, 0, 32, 500, false);
    colld_wire_sqe_t to0 = p2p(w, 2, 2, COLLD_KIND_SEND, 0, 24, 50, false);
    post(w, 2, &from0);
    post(w, 2, &to0);
    run(w, 3);
    colld_wire_cqe_t cq[8];
    assert_int_equal(reap(w, 2, cq, 8), 2); /* rank 2 is done */
    assert_int_equal(cq[0].status, COLLD_OK);
    assert_int_equal(cq[1].status, COLLD_OK);
    expect_data(w, 2, 500, 0, 100, 32);
    expect_data(w, 0, 400, 2, 50, 24);
    assert_int_equal(reap(w, 0, cq, 8), 0); /* operation 1 still waits for rank 1 */
    assert_int_equal(w->c->ops_completed, 2);
    colld_wire_sqe_t r1 = p2p(w, 1, 1, COLLD_KIND_RECV, 0, 16, 600, false);
    colld_wire_sqe_t s1 = p2p(w, 1, 2, COLLD_KIND_SEND, 0, 8, 70, false);
    post(w, 1, &r1);
    post(w, 1, &s1);
    run(w, 3);
    assert_int_equal(reap(w, 0, cq, 8), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(cq[i].seq, (uint64_t)i + 1);
        assert_int_equal(cq[i].status, COLLD_OK);
    }
    assert_int_equal(reap(w, 1, cq, 8), 2);
    expect_data(w, 1, 600, 0, 0, 16);
    expect_data(w, 0, 300, 1, 70, 8);
    assert_int_equal(w->c->p2p_queued, 0);
}

/* Per pair, in posting order: rank 0 sends three messages of different sizes to rank 1,
 * interleaved with sends to rank 2; rank 1 posts its three receives before rank 2 posts anything.
 * The k-th send to rank 1 meets rank 1's k-th receive (sizes agree: no mismatch). */
static void test_order_per_pair(void **state)
{
    world_t *w = make_world(3, 60000, 0);
    *state = w;
    fill(w, 3);
    const int counts[3] = { 5, 7, 11 };
    uint64_t id = 1;
    for (int k = 0; k < 3; k++) {
        colld_wire_sqe_t to1 = p2p(w, 0, id++, COLLD_KIND_SEND, 1, (uint64_t)counts[k], 20 * k, false);
        colld_wire_sqe_t to2 = p2p(w, 0, id++, COLLD_KIND_SEND, 2, 3, 200 + k, false);
        post(w, 0, &to1);
        post(w, 0, &to2);
    }
    for (int k = 0; k < 3; k++) {
        colld_wire_sqe_t v = p2p(w, 1, (uint64_t)k + 1, COLLD_KIND_RECV, 0, (uint64_t)counts[k], 100 * k, false);
        post(w, 1, &v);
    }
    run(w, 3);
    colld_wire_cqe_t cq[8];
    assert_int_equal(reap(w, 1, cq, 8), 3);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(cq[k].status, COLLD_OK);
        expect_data(w, 1, 100 * k, 0, 20 * k, counts[k]);
    }
    assert_int_equal(reap(w, 0, cq, 8), 1); /* operation 2 (to rank 2) holds the rest back */
    for (int k = 0; k < 3; k++) {
        colld_wire_sqe_t v = p2p(w, 2, (uint64_t)k + 1, COLLD_KIND_RECV, 0, 3, 10 * k, false);
        post(w, 2, &v);
    }
    run(w, 3);
    assert_int_equal(reap(w, 0, cq, 8), 5);
    for (int k = 0; k < 3; k++)
        expect_data(w, 2, 10 * k, 0, 200 + k, 3);
    assert_int_equal(w->c->state, COLLD_COMM_READY);
}

/* The matching work of one tenant per engine pass is bounded: with a budget of 4 units, 12 sends
 * and their receives posted at once take several passes (a pass looks at the pair, one unit, and
 * starts 3 transfers, one unit each; the pair waits for the next pass), and all of them complete,
 * data exact. */
static void test_budget_per_pass(void **state)
{
    world_t *w = *state;
    fill(w, 2);
    w->f.d.p2p_budget = 4;
    for (int k = 0; k < 12; k++) {
        colld_wire_sqe_t s = p2p(w, 0, (uint64_t)k + 1, COLLD_KIND_SEND, 1, 4, 4 * k, false);
        post(w, 0, &s);
    }
    for (int k = 0; k < 12; k++) {
        colld_wire_sqe_t v = p2p(w, 1, (uint64_t)k + 1, COLLD_KIND_RECV, 0, 4, 4 * k, false);
        post(w, 1, &v);
    }
    int passes = 0;
    uint64_t before = 0;
    while (w->c->ops_completed < 12 && passes < 100) {
        colld_engine_run_once(&w->f.d);
        passes++;
        assert_true(w->c->ops_completed - before <= 3);
        before = w->c->ops_completed;
    }
    print_message("12 transfers in %d passes\n", passes);
    assert_int_equal(w->c->ops_completed, 12);
    assert_true(passes >= 4);
    expect_data(w, 1, 0, 0, 0, 48);
    colld_wire_cqe_t cq[16];
    assert_int_equal(reap(w, 0, cq, 16), 12);
    assert_int_equal(reap(w, 1, cq, 16), 12);
    assert_int_equal(w->c->p2p_queued, 0);
}

/* The same in one group (a batch on each rank): both transfers run. */
static void test_batched_exchange(void **state)
{
    world_t *w = *state;
    fill(w, 2);
    for (int r = 0; r < 2; r++) {
        colld_wire_sqe_t s = p2p(w, r, 1, COLLD_KIND_SEND, 1 - r, 64, 0, true);
        colld_wire_sqe_t v = p2p(w, r, 2, COLLD_KIND_RECV, 1 - r, 64, 0, false);
        post(w, r, &s);
        post(w, r, &v);
    }
    run(w, 3);
    for (int r = 0; r < 2; r++) {
        colld_wire_cqe_t cq[4];
        assert_int_equal(reap(w, r, cq, 4), 2);
        assert_int_equal(cq[0].seq, 1);
        assert_int_equal(cq[1].seq, 2);
        assert_int_equal(cq[0].status, COLLD_OK);
        assert_int_equal(cq[1].status, COLLD_OK);
        expect_data(w, r, 0, 1 - r, 0, 64);
    }
}

/* A rank sends to itself inside a group. */
static void test_self_send(void **state)
{
    world_t *w = *state;
    fill(w, 2);
    colld_wire_sqe_t r = p2p(w, 1, 1, COLLD_KIND_RECV, 1, 8, 16, true);
    colld_wire_sqe_t s = p2p(w, 1, 2, COLLD_KIND_SEND, 1, 8, 3, false);
    post(w, 1, &r);
    post(w, 1, &s);
    run(w, 3);
    colld_wire_cqe_t cq[4];
    assert_int_equal(reap(w, 1, cq, 4), 2);
    assert_int_equal(cq[0].status, COLLD_OK);
    assert_int_equal(cq[1].status, COLLD_OK);
    expect_data(w, 1, 16, 1, 3, 8);
}

/* Completions leave in each rank's posting order: rank 1's batch receives from rank 0 and then
 * from rank 2; rank 2's send comes first, but its receive completes only with the first one. */
static void test_completions_in_posting_order(void **state)
{
    world_t *w = *state;
    fill(w, 3);
    colld_wire_sqe_t a = p2p(w, 1, 1, COLLD_KIND_RECV, 0, 4, 0, true);
    colld_wire_sqe_t b = p2p(w, 1, 2, COLLD_KIND_RECV, 2, 4, 4, false);
    colld_wire_sqe_t from2 = p2p(w, 2, 1, COLLD_KIND_SEND, 1, 4, 0, false);
    colld_wire_sqe_t from0 = p2p(w, 0, 1, COLLD_KIND_SEND, 1, 4, 0, false);
    post(w, 1, &a);
    post(w, 1, &b);
    post(w, 2, &from2);
    run(w, 3);
    colld_wire_cqe_t cq[4];
    assert_int_equal(reap(w, 2, cq, 4), 1); /* the sender of the transfer that ran is done */
    assert_int_equal(reap(w, 1, cq, 4), 0); /* operation 2 is done, but operation 1 is not */
    expect_data(w, 1, 4, 2, 0, 4);
    post(w, 0, &from0);
    run(w, 3);
    assert_int_equal(reap(w, 1, cq, 4), 2);
    assert_int_equal(cq[0].seq, 1);
    assert_int_equal(cq[1].seq, 2);
    expect_data(w, 1, 0, 0, 0, 4);
}

/* ---------------------------------------------------------------------------------------------
 * Order against collectives (the collective ordinal)
 * ------------------------------------------------------------------------------------------- */

/* Rank 0: send (op 1), all-reduce (op 2, collective #1); rank 1: all-reduce (op 1, collective #1),
 * then receive (op 2). Rank 0's all-reduce waits for its send, which waits for rank 1's receive,
 * which comes after rank 1's all-reduce: the programs disagree (NCCL would hang), and the time-out
 * says where each rank stands instead of running anything out of order. */
static void test_order_kept_against_collectives(void **state)
{
    world_t *w = make_world(2, 20, 0);
    *state = w;
    colld_wire_sqe_t s = p2p(w, 0, 1, COLLD_KIND_SEND, 1, 4, 0, false);
    colld_wire_sqe_t a0 = fix_sqe(w->c, 0, 2, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    colld_wire_sqe_t a1 = fix_sqe(w->c, 1, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    colld_wire_sqe_t r = p2p(w, 1, 2, COLLD_KIND_RECV, 0, 4, 0, false);
    post(w, 0, &s);
    post(w, 0, &a0);
    post(w, 1, &a1);
    post(w, 1, &r);
    run(w, 3);
    assert_int_equal(w->c->ops_completed, 0);        /* nothing ran out of order */
    assert_int_equal(w->c->ranks[0].head->d.seq, 1); /* rank 0's all-reduce is collective #1 */
    for (int i = 0; i < 1000 && w->c->state == COLLD_COMM_READY; i++) {
        run(w, 1);
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    assert_int_equal(w->c->error, COLLD_ERR_TIMEOUT);
    assert_non_null(strstr(w->c->error_detail, "rank 1 has point-to-point operations queued behind allreduce "
                                               "(collective #1), which has not run"));
    assert_non_null(strstr(w->c->error_detail, "rank 0 waits in its own point-to-point operations: send to rank 1"));
}

/* Agreeing programs with collectives between the transfers, on 3 ranks:
 *   rank 0: send to 1 (op 1), all-reduce #1 (op 2), all-reduce #2 (op 3), receive from 2 (op 4)
 *   rank 1: receive from 0 (op 1), all-reduce #1 (op 2), all-reduce #2 (op 3)
 *   rank 2: all-reduce #1 (op 1), all-reduce #2 (op 2), send to 0 (op 3)
 * Every operation completes in posting order; the collectives are matched by their ordinal though
 * their operation ids differ between ranks, and the flight recorder has exactly the two. */
static void test_collectives_between_transfers(void **state)
{
    world_t *w = *state;
    fill(w, 3);
    colld_wire_sqe_t q[3][4] = {
        { p2p(w, 0, 1, COLLD_KIND_SEND, 1, 4, 300, false),
          fix_sqe(w->c, 0, 2, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 8, 0),
          fix_sqe(w->c, 0, 3, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_MAX, 8, 0),
          p2p(w, 0, 4, COLLD_KIND_RECV, 2, 4, 100, false) },
        { p2p(w, 1, 1, COLLD_KIND_RECV, 0, 4, 100, false),
          fix_sqe(w->c, 1, 2, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 8, 0),
          fix_sqe(w->c, 1, 3, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_MAX, 8, 0) },
        { fix_sqe(w->c, 2, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 8, 0),
          fix_sqe(w->c, 2, 2, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_MAX, 8, 0),
          p2p(w, 2, 3, COLLD_KIND_SEND, 0, 4, 200, false) },
    };
    const int nops[3] = { 4, 3, 3 };
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < nops[r]; i++)
            post(w, r, &q[r][i]);
    run(w, 10);
    for (int r = 0; r < 3; r++) {
        colld_wire_cqe_t cq[8];
        assert_int_equal(reap(w, r, cq, 8), nops[r]);
        for (int i = 0; i < nops[r]; i++) {
            assert_int_equal(cq[i].seq, (uint64_t)i + 1); /* in posting order */
            assert_int_equal(cq[i].status, COLLD_OK);
        }
    }
    assert_int_equal(w->c->state, COLLD_COMM_READY);
    assert_int_equal(w->c->trace_count, 2);
    assert_int_equal(w->c->trace[0].seq, 1);
    assert_int_equal(w->c->trace[1].seq, 2);
    assert_int_equal(w->c->trace[1].redop, COLLD_MAX);
    /* The all-reduces write elements 0..7 of registration 2 only. */
    expect_data(w, 1, 100, 0, 300, 4);
    expect_data(w, 0, 100, 2, 200, 4);
    const int32_t *out = fix_reg(w->f.s[1], 2);
    for (int i = 0; i < 8; i++)
        assert_int_equal(out[i], 3000 + i); /* max of 1000 + i, 2000 + i, 3000 + i */
}

/* ---------------------------------------------------------------------------------------------
 * Faults
 * ------------------------------------------------------------------------------------------- */

/* A send and its receive disagree in count: MISMATCH naming both calls, for both ranks. */
static void test_mismatched_sizes(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t s = p2p(w, 0, 1, COLLD_KIND_SEND, 1, 100, 0, false);
    colld_wire_sqe_t r = p2p(w, 1, 1, COLLD_KIND_RECV, 0, 50, 0, false);
    post(w, 0, &s);
    post(w, 1, &r);
    run(w, 2);
    assert_int_equal(w->c->error, COLLD_ERR_MISMATCH);
    assert_string_equal(w->c->error_detail, "point-to-point from rank 0 to rank 1 differs: rank 0 sends 100 x int32 "
                                            "(400 B) (operation #1), rank 1 receives 50 x int32 (200 B) "
                                            "(operation #1)");
    colld_wire_cqe_t cq[4];
    assert_int_equal(reap(w, 0, cq, 4), 2); /* the operation, then the break's notice */
    assert_int_equal(cq[0].status, COLLD_ERR_MISMATCH);
    assert_int_equal(reap(w, 1, cq, 4), 2);
    assert_int_equal(cq[0].status, COLLD_ERR_MISMATCH);
}

/* A receive whose sender never sends: the time-out names the missing send ("rank 2 never sent to
 * rank 1") and what rank 2 does instead. */
static void test_never_sent(void **state)
{
    world_t *w = make_world(3, 20, 0);
    *state = w;
    colld_wire_sqe_t r = p2p(w, 1, 1, COLLD_KIND_RECV, 2, 1024, 0, false);
    colld_wire_sqe_t a = fix_sqe(w->c, 2, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    post(w, 1, &r);
    post(w, 2, &a);
    for (int i = 0; i < 1000 && w->c->state == COLLD_COMM_READY; i++) {
        run(w, 1);
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    assert_int_equal(w->c->error, COLLD_ERR_TIMEOUT);
    assert_non_null(strstr(w->c->error_detail, " ms to receive 1024 x int32 (4096 B) from rank 2 (operation #1); "
                                               "rank 2 never sent to rank 1: it is waiting in allreduce "
                                               "(collective #1)"));
}

/* Peers out of range and flags a send cannot have are refused at admission. */
static void test_admission(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t s = p2p(w, 0, 1, COLLD_KIND_SEND, 2, 4, 0, false);
    post(w, 0, &s);
    run(w, 1);
    assert_int_equal(w->c->error, COLLD_ERR_INVALID_ARGUMENT);
    assert_string_equal(w->c->error_detail,
                        "rank 0 (pid 1000), send to rank 2 (operation #1): peer 2 is out of range for 2 ranks");
}

static void test_admission_flags(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t r = p2p(w, 1, 1, COLLD_KIND_RECV, 0, 4, 0, false);
    r.flags |= COLLD_SQE_PLAN;
    post(w, 1, &r);
    run(w, 1);
    assert_int_equal(w->c->error, COLLD_ERR_INVALID_ARGUMENT);
    assert_string_equal(w->c->error_detail, "rank 1 (pid 1001), recv from rank 0 (operation #1): recv with flags "
                                            "0x8: only the group link and the GPU stream flag are allowed");
}

/* A stream-ordered send is admitted only by a backend that runs them (this daemon has none). */
static void test_admission_stream_without_gpu(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t s = p2p(w, 0, 1, COLLD_KIND_SEND, 1, 4, 0, false);
    s.flags |= COLLD_SQE_STREAM;
    post(w, 0, &s);
    run(w, 1);
    assert_int_equal(w->c->error, COLLD_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(w->c->error_detail, "rank 0 (pid 1000), send to rank 1 (operation #1): GPU collective, but "
                                               "no GPU here"));
}

/* The sends and receives of one group (a batch) are all stream-ordered or all not: a batch that
 * mixes them is refused at the operation that breaks the rule. */
static void test_admission_mixed_batch(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t a = p2p(w, 0, 1, COLLD_KIND_SEND, 1, 4, 0, true);
    colld_wire_sqe_t b = p2p(w, 0, 2, COLLD_KIND_RECV, 1, 4, 0, false);
    b.flags |= COLLD_SQE_STREAM;
    post(w, 0, &a);
    post(w, 0, &b);
    run(w, 1);
    assert_int_equal(w->c->error, COLLD_ERR_INVALID_ARGUMENT);
    assert_string_equal(w->c->error_detail,
                        "rank 0 (pid 1000), recv from rank 1 (operation #2): recv in a group whose send before it is "
                        "on host buffers: the sends and receives of one group on a communicator must all be on GPU "
                        "buffers (stream-ordered) or all on host buffers");
}

/* The link flag on a collective is refused too. */
static void test_admission_link_on_collective(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t a = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    a.flags = COLLD_SQE_LINK;
    post(w, 0, &a);
    run(w, 1);
    assert_int_equal(w->c->error, COLLD_ERR_INVALID_ARGUMENT);
    assert_string_equal(w->c->error_detail, "rank 0 (pid 1000), collective #1: allreduce with the group link flag "
                                            "(point-to-point only)");
}

/* Flag bits the wire does not define, and the plan flag on a descriptor not on a GPU stream. */
static void test_admission_unknown_flags(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t a = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    a.flags = 0x40;
    post(w, 0, &a);
    run(w, 1);
    assert_int_equal(w->c->error, COLLD_ERR_INVALID_ARGUMENT);
    assert_string_equal(w->c->error_detail, "rank 0 (pid 1000), collective #1: allreduce with unknown flags 0x40");
}

static void test_admission_plan_without_stream(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t a = fix_sqe(w->c, 0, 1, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    a.flags = COLLD_SQE_PLAN;
    post(w, 0, &a);
    run(w, 1);
    assert_int_equal(w->c->error, COLLD_ERR_INVALID_ARGUMENT);
    assert_string_equal(w->c->error_detail, "rank 0 (pid 1000), collective #1: allreduce with the plan flag but not "
                                            "the GPU stream flag (a plan is a captured GPU collective)");
}

/* An abort with operations queued fails them all, in posting order, with ABORTED. */
static void test_abort_fails_queued(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t a = p2p(w, 0, 1, COLLD_KIND_RECV, 1, 4, 0, true);
    colld_wire_sqe_t b = p2p(w, 0, 2, COLLD_KIND_SEND, 1, 4, 0, false);
    post(w, 0, &a);
    post(w, 0, &b);
    run(w, 2);
    pthread_mutex_lock(&w->f.d.lock);
    colld_dcomm_abort(&w->f.d, w->c, 1, "rank 1");
    colld_daemon_unlock(&w->f.d);
    colld_wire_cqe_t cq[4];
    assert_int_equal(reap(w, 0, cq, 4), 3); /* the two operations, then the notice */
    assert_int_equal(cq[0].seq, 1);
    assert_int_equal(cq[0].status, COLLD_ERR_ABORTED);
    assert_int_equal(cq[1].seq, 2);
    assert_int_equal(cq[1].status, COLLD_ERR_ABORTED);
    assert_int_equal(w->c->p2p_queued, 0);
}

/* A rank whose process ends with a receive queued: its peer's send fails with PEER_LOST. */
static void test_peer_lost(void **state)
{
    world_t *w = *state;
    colld_wire_sqe_t s = p2p(w, 0, 1, COLLD_KIND_SEND, 1, 4, 0, false);
    post(w, 0, &s);
    run(w, 1);
    fix_session_end(&w->f, w->f.s[1]);
    run(w, 1);
    assert_int_equal(w->c->error, COLLD_ERR_PEER_LOST);
    colld_wire_cqe_t cq[4];
    assert_true(reap(w, 0, cq, 4) >= 1);
    assert_int_equal(cq[0].seq, 1);
    assert_int_equal(cq[0].status, COLLD_ERR_PEER_LOST);
}

/* A rank that destroys its handle closes the communicator: a send to it that was waiting fails
 * with PEER_LOST, later collectives and sends to it with INVALID_USAGE at once, while sends and
 * receives between the ranks still there go on (as with NCCL, where a rank that is done does not
 * stop the others' exchanges). */
static void test_leave_keeps_other_pairs(void **state)
{
    world_t *w = *state;
    fill(w, 3);
    colld_wire_sqe_t to0 = p2p(w, 1, 1, COLLD_KIND_SEND, 0, 4, 0, false);
    colld_wire_sqe_t r2 = p2p(w, 2, 1, COLLD_KIND_RECV, 1, 8, 0, false);
    post(w, 1, &to0);
    post(w, 2, &r2);
    run(w, 2);
    colld_err_t err = COLLD_ERR_INIT;
    pthread_mutex_lock(&w->f.d.lock);
    assert_int_equal(colld_comm_leave(&w->f.d, w->f.s[0], w->c->ranks[0].handle, &err), COLLD_OK);
    colld_daemon_unlock(&w->f.d);
    assert_int_equal(w->c->state, COLLD_COMM_CLOSING);
    colld_wire_cqe_t cq[4];
    assert_int_equal(reap(w, 1, cq, 4), 1); /* its send to rank 0, waiting when rank 0 left */
    assert_int_equal(cq[0].seq, 1);
    assert_int_equal(cq[0].status, COLLD_ERR_PEER_LOST);
    /* Rank 1's next send, to rank 2, meets rank 2's receive posted before the leave. */
    colld_wire_sqe_t to2 = p2p(w, 1, 2, COLLD_KIND_SEND, 2, 8, 10, false);
    post(w, 1, &to2);
    run(w, 3);
    assert_int_equal(reap(w, 1, cq, 4), 1);
    assert_int_equal(cq[0].seq, 2);
    assert_int_equal(cq[0].status, COLLD_OK);
    assert_int_equal(reap(w, 2, cq, 4), 1);
    assert_int_equal(cq[0].status, COLLD_OK);
    expect_data(w, 2, 0, 1, 10, 8);
    /* A collective, and a receive from the rank that left, fail at once. */
    colld_wire_sqe_t a = fix_sqe(w->c, 2, 2, COLLD_KIND_ALLREDUCE, COLLD_INT32, COLLD_SUM, 4, 0);
    colld_wire_sqe_t from0 = p2p(w, 2, 3, COLLD_KIND_RECV, 0, 4, 0, false);
    post(w, 2, &a);
    post(w, 2, &from0);
    run(w, 1);
    assert_int_equal(reap(w, 2, cq, 4), 2);
    assert_int_equal(cq[0].status, COLLD_ERR_INVALID_USAGE);
    assert_int_equal(cq[1].status, COLLD_ERR_INVALID_USAGE);
    /* Those refusals still count: rank 2's next send, to rank 1, is in step and runs. */
    colld_wire_sqe_t to1 = p2p(w, 2, 4, COLLD_KIND_SEND, 1, 4, 20, false);
    colld_wire_sqe_t from2 = p2p(w, 1, 3, COLLD_KIND_RECV, 2, 4, 30, false);
    post(w, 2, &to1);
    post(w, 1, &from2);
    run(w, 3);
    assert_int_equal(reap(w, 2, cq, 4), 1);
    assert_int_equal(cq[0].seq, 4);
    assert_int_equal(cq[0].status, COLLD_OK);
    assert_int_equal(reap(w, 1, cq, 4), 1);
    assert_int_equal(cq[0].seq, 3);
    assert_int_equal(cq[0].status, COLLD_OK);
    expect_data(w, 1, 30, 2, 20, 4);
    /* A send on a GPU stream between ranks still there is refused: the close released the streams. */
    colld_wire_sqe_t on_stream = p2p(w, 1, 4, COLLD_KIND_SEND, 2, 4, 0, false);
    on_stream.flags |= COLLD_SQE_STREAM;
    post(w, 1, &on_stream);
    run(w, 1);
    assert_int_equal(reap(w, 1, cq, 4), 1);
    assert_int_equal(cq[0].seq, 4);
    assert_int_equal(cq[0].status, COLLD_ERR_INVALID_USAGE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_send_recv, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_pairs_in_order, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_unbatched_exchange, setup2, teardown),
        cmocka_unit_test_teardown(test_crossed_sends_time_out, teardown),
        cmocka_unit_test_setup_teardown(test_ring_outside_groups, setup4, teardown),
        cmocka_unit_test_teardown(test_independent_peers, teardown),
        cmocka_unit_test_teardown(test_order_per_pair, teardown),
        cmocka_unit_test_setup_teardown(test_budget_per_pass, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_batched_exchange, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_self_send, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_completions_in_posting_order, setup3, teardown),
        cmocka_unit_test_teardown(test_order_kept_against_collectives, teardown),
        cmocka_unit_test_setup_teardown(test_collectives_between_transfers, setup3, teardown),
        cmocka_unit_test_setup_teardown(test_mismatched_sizes, setup2, teardown),
        cmocka_unit_test_teardown(test_never_sent, teardown),
        cmocka_unit_test_setup_teardown(test_admission, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_admission_flags, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_admission_stream_without_gpu, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_admission_mixed_batch, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_admission_link_on_collective, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_admission_unknown_flags, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_admission_plan_without_stream, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_abort_fails_queued, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_peer_lost, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_leave_keeps_other_pairs, setup3, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
