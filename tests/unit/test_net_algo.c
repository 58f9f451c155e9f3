/*
 * test_net_algo.c - the inter-node algorithms' block arithmetic (server/net/ring.c, rd.c),
 * in-process on a collective object of their own (xcoll.h), without daemons or sockets: the ring
 * layout (blocks, ranges, chunks) of each kind, who sends which block at which step, which DATA a
 * node takes (from whom, which chunk, once) and the exact reasons it refuses the rest, the
 * reduction and forwarding of what arrives, and recursive doubling's partners, hand-in and result.
 */
#include "server/net/xcoll.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define MAXSENT 64

typedef struct {
    int node, phase, step;
    uint64_t off, len;
} sent_t;

/* One collective at node `self` of `nnodes`, with its sends recorded instead of sent. */
typedef struct {
    xcoll_t xc;
    colld_xcomm_t x;
    colld_dcomm_t c;
    int rank_node[8];
    uint8_t X[4096];
    sent_t sent[MAXSENT];
    int nsent;
    colld_status_t failed;
} world_t;

static world_t *W; /* the one being built (the send stub finds it) */

static void record_send(xcoll_t *xc, int node, int phase, int step, uint64_t off, uint64_t len, const uint8_t *src)
{
    (void)xc, (void)src;
    assert_true(W->nsent < MAXSENT);
    W->sent[W->nsent++] = (sent_t){ .node = node, .phase = phase, .step = step, .off = off, .len = len };
}

static void record_fail(xcoll_t *xc, colld_status_t st, const char *detail, bool break_comm)
{
    (void)detail, (void)break_comm;
    xc->failed = true;
    W->failed = st;
}

/* Node `self` of `nnodes` (chunks of `chunk` bytes), collective `kind` of `count` int32 over
 * `nranks` ranks placed by rank_node[]. */
static world_t *make(int nnodes, int self, uint64_t chunk, colld_kind_t kind, uint64_t count, int nranks,
                     const int *rank_node, int root)
{
    static world_t w;
    memset(&w, 0, sizeof(w));
    W = &w;
    w.x.nnodes = nnodes;
    w.x.self = self;
    w.x.chunk_bytes = chunk;
    memcpy(w.rank_node, rank_node, (size_t)nranks * sizeof(int));
    w.x.rank_node = w.rank_node;
    w.c.nranks = nranks;
    xcoll_t *xc = &w.xc;
    xc->x = &w.x;
    xc->c = &w.c;
    xc->sig = (xsig_t){
        .seq = 1, .kind = kind, .dtype = COLLD_INT32, .redop = COLLD_SUM, .root = root, .count = count
    };
    xc->dt = COLLD_INT32;
    xc->op = xc->pop = COLLD_SUM;
    xc->es = 4;
    xc->xbytes = count * 4 * (kind == COLLD_KIND_ALLGATHER || kind == COLLD_KIND_REDUCESCATTER ? (uint64_t)nranks : 1);
    assert_true(xc->xbytes <= sizeof(w.X));
    xc->X = w.X;
    xc->stage = STAGE_NET;
    xc->send = record_send;
    xc->fail = record_fail;
    assert_int_equal(colld_xring_layout(xc), 0);
    return &w;
}

static void unmake(world_t *w)
{
    free(w->xc.ranges);
    free(w->xc.got);
    colld_xrd_free(&w->xc);
}

static const int ONE_PER_NODE[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };

/* All-reduce: k equal blocks (count * b / k), chunks of chunk_bytes from each block's start. */
static void test_layout_allreduce(void **state)
{
    (void)state;
    world_t *w = make(3, 0, 8, COLLD_KIND_ALLREDUCE, 10, 3, ONE_PER_NODE, 0);
    xcoll_t *xc = &w->xc;
    assert_int_equal(xc->nranges, 3);
    uint64_t off[3] = { 0, 12, 24 }, len[3] = { 12, 12, 16 };
    uint32_t chunk0[3] = { 0, 2, 4 };
    for (int b = 0; b < 3; b++) {
        assert_int_equal(xc->ranges[b].block, b);
        assert_int_equal(xc->ranges[b].off, off[b]);
        assert_int_equal(xc->ranges[b].len, len[b]);
        assert_int_equal(xc->ranges[b].chunk0, chunk0[b]);
    }
    assert_int_equal(xc->nchunks, 6);
    unmake(w);
}

/* Broadcast: the whole buffer is one block, the root's node's. */
static void test_layout_broadcast(void **state)
{
    (void)state;
    int rank_node[4] = { 0, 0, 2, 1 };
    world_t *w = make(3, 1, 64, COLLD_KIND_BROADCAST, 20, 4, rank_node, 3);
    assert_int_equal(w->xc.nranges, 1);
    assert_int_equal(w->xc.ranges[0].off, 0);
    assert_int_equal(w->xc.ranges[0].len, 80);
    assert_int_equal(w->xc.ranges[0].block, 1);
    unmake(w);
}

/* All-gather and reduce-scatter: rank r's slot belongs to the block of its node. */
static void test_layout_allgather(void **state)
{
    (void)state;
    int rank_node[4] = { 0, 0, 1, 2 };
    world_t *w = make(3, 2, 4096, COLLD_KIND_ALLGATHER, 5, 4, rank_node, 0);
    assert_int_equal(w->xc.nranges, 4);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(w->xc.ranges[r].off, (uint64_t)r * 20);
        assert_int_equal(w->xc.ranges[r].len, 20);
        assert_int_equal(w->xc.ranges[r].block, rank_node[r]);
    }
    assert_int_equal(w->xc.nchunks, 4);
    unmake(w);
}

/* Ring reduce-scatter step 0: node j sends block j-1 to node j+1, chunk by chunk; it expects
 * every block but its own... and, with an all-gather after, every block but the one it makes. */
static void test_ring_start(void **state)
{
    (void)state;
    world_t *w = make(3, 1, 8, COLLD_KIND_ALLREDUCE, 10, 3, ONE_PER_NODE, 0);
    colld_xring_start(&w->xc);
    assert_int_equal(w->nsent, 2);
    assert_int_equal(w->sent[0].node, 2);
    assert_int_equal(w->sent[0].phase, XPHASE_RS);
    assert_int_equal(w->sent[0].step, 0);
    assert_int_equal(w->sent[0].off, 0);
    assert_int_equal(w->sent[0].len, 8);
    assert_int_equal(w->sent[1].off, 8);
    assert_int_equal(w->sent[1].len, 4);
    /* RS: everything but block 0 (12 bytes) arrives; AG: everything but block 1 (12 bytes) */
    assert_int_equal(w->xc.recv_left, (40 - 12) + (40 - 12));
    unsigned phase;
    int step, from;
    colld_xring_waiting(&w->xc, &phase, &step, &from);
    assert_int_equal(phase, XPHASE_RS);
    assert_int_equal(step, 0);
    assert_int_equal(from, 0);
    unmake(w);
}

static colld_net_hdr_t hdr(int phase, int step, uint64_t off, uint32_t len)
{
    return (colld_net_hdr_t){
        .phase = (uint8_t)phase, .step = (uint16_t)step, .len = len, .xid = 1, .seq = 1, .offset = off
    };
}

/* What a node takes: from the previous node only, exactly one chunk of the block due at that step,
 * once; each refusal says why. */
static void test_ring_valid(void **state)
{
    (void)state;
    world_t *w = make(3, 1, 8, COLLD_KIND_ALLREDUCE, 10, 3, ONE_PER_NODE, 0);
    colld_xring_start(&w->xc);
    colld_err_t err = COLLD_ERR_INIT;
    int64_t chunk = -1;
    colld_net_hdr_t h = hdr(XPHASE_RS, 0, 24, 8); /* step 0 at node 1: block (1-0-2) mod 3 = 2 */
    assert_false(colld_xring_valid(&w->xc, 2, &h, &chunk, &err));
    assert_string_equal(err.msg,
                        "ring reduce-scatter step 0 came from node 2, not from the previous node of the ring (0)");
    colld_net_hdr_t wrong_block = hdr(XPHASE_RS, 0, 0, 8);
    assert_false(colld_xring_valid(&w->xc, 0, &wrong_block, &chunk, &err));
    assert_string_equal(err.msg, "ring reduce-scatter step 0: bytes 0..8 are not a chunk of block 2, the block due");
    colld_net_hdr_t half = hdr(XPHASE_RS, 0, 28, 4);
    assert_false(colld_xring_valid(&w->xc, 0, &half, &chunk, &err));
    assert_string_equal(err.msg, "ring reduce-scatter step 0: bytes 28..32 are not a chunk of block 2, the block due");
    colld_net_hdr_t late = hdr(XPHASE_AG, 2, 0, 8);
    assert_false(colld_xring_valid(&w->xc, 0, &late, &chunk, &err));
    assert_string_equal(err.msg, "ring all-gather step 2 is not a phase of this collective");
    assert_true(colld_xring_valid(&w->xc, 0, &h, &chunk, &err));
    assert_int_equal(chunk, 4);
    colld_xring_data(&w->xc, &h, chunk, w->X + 1024);
    assert_false(colld_xring_valid(&w->xc, 0, &h, &chunk, &err));
    assert_string_equal(err.msg, "ring reduce-scatter step 0: bytes 24..32 arrived twice");
    unmake(w);
}

/* A reduce-scatter has no all-gather phase, an all-gather no reduce-scatter phase. */
static void test_ring_phases_of_kinds(void **state)
{
    (void)state;
    world_t *w = make(2, 0, 64, COLLD_KIND_ALLGATHER, 4, 2, ONE_PER_NODE, 0);
    colld_err_t err = COLLD_ERR_INIT;
    int64_t chunk;
    colld_net_hdr_t h = hdr(XPHASE_RS, 0, 16, 16);
    assert_false(colld_xring_valid(&w->xc, 1, &h, &chunk, &err));
    assert_string_equal(err.msg, "ring reduce-scatter step 0 is not a phase of this collective");
    unmake(w);
    w = make(2, 0, 64, COLLD_KIND_REDUCESCATTER, 4, 2, ONE_PER_NODE, 0);
    colld_net_hdr_t g = hdr(XPHASE_AG, 0, 16, 16);
    assert_false(colld_xring_valid(&w->xc, 1, &g, &chunk, &err));
    assert_string_equal(err.msg, "ring all-gather step 0 is not a phase of this collective");
    unmake(w);
}

/* A reduce-scatter chunk is reduced into X (the received partial first) and forwarded; at the last
 * step the node's own block is complete and its all-gather starts. */
static void test_ring_data(void **state)
{
    (void)state;
    world_t *w = make(2, 1, 64, COLLD_KIND_ALLREDUCE, 4, 2, ONE_PER_NODE, 0);
    int32_t *X = (int32_t *)w->X;
    for (int i = 0; i < 4; i++)
        X[i] = 100 + i;
    colld_xring_start(&w->xc); /* node 1 sends block 0 to node 0 */
    assert_int_equal(w->nsent, 1);
    int32_t in[2] = { 5, 7 };
    colld_net_hdr_t h = hdr(XPHASE_RS, 0, 8, 8); /* block 1 from node 0 */
    colld_err_t err = COLLD_ERR_INIT;
    int64_t chunk;
    assert_true(colld_xring_valid(&w->xc, 0, &h, &chunk, &err));
    colld_xring_data(&w->xc, &h, chunk, in);
    assert_int_equal(X[2], 107);
    assert_int_equal(X[3], 110);
    assert_int_equal(w->nsent, 2);
    assert_int_equal(w->sent[1].phase, XPHASE_AG);
    assert_int_equal(w->sent[1].off, 8);
    assert_int_equal(w->sent[1].node, 0);
    unmake(w);
}

/* Recursive doubling over 3 nodes: the largest power of two is 2, so node 2 hands its buffer to
 * node 0 and waits for the result; node 0 takes that hand-in only from node 2, whole and once. */
static void test_rd(void **state)
{
    (void)state;
    world_t *w = make(3, 2, 4096, COLLD_KIND_ALLREDUCE, 4, 3, ONE_PER_NODE, 0);
    w->xc.rd = true;
    colld_xrd_start(&w->xc);
    assert_int_equal(w->xc.rd_p, 2);
    assert_int_equal(w->nsent, 1);
    assert_int_equal(w->sent[0].node, 0);
    assert_int_equal(w->sent[0].phase, XPHASE_RD_PRE);
    assert_int_equal(w->sent[0].len, 16);
    unsigned phase;
    int step, from;
    colld_xrd_waiting(&w->xc, &phase, &step, &from);
    assert_int_equal(phase, XPHASE_RD_POST);
    assert_int_equal(from, 0);
    unmake(w);

    w = make(3, 0, 4096, COLLD_KIND_ALLREDUCE, 4, 3, ONE_PER_NODE, 0);
    w->xc.rd = true;
    colld_xrd_start(&w->xc);
    assert_int_equal(w->nsent, 0); /* it waits for node 2's hand-in first */
    colld_err_t err = COLLD_ERR_INIT;
    colld_net_hdr_t pre = hdr(XPHASE_RD_PRE, 0, 0, 16);
    assert_false(colld_xrd_valid(&w->xc, 1, &pre, &err));
    assert_string_equal(err.msg, "recursive doubling hand-in step 0 came from the wrong node (node 1, not node 2)");
    colld_net_hdr_t part = hdr(XPHASE_RD_PRE, 0, 0, 8);
    assert_false(colld_xrd_valid(&w->xc, 2, &part, &err));
    assert_string_equal(err.msg,
                        "recursive doubling hand-in step 0: bytes 0..8, where the whole 16-byte buffer is due once");
    colld_net_hdr_t post = hdr(XPHASE_RD_POST, 0, 0, 16);
    assert_false(colld_xrd_valid(&w->xc, 2, &post, &err));
    assert_string_equal(err.msg, "recursive doubling result step 0 is not a phase of this collective on this node");
    assert_true(colld_xrd_valid(&w->xc, 2, &pre, &err));
    int32_t in[4] = { 1, 2, 3, 4 };
    colld_xrd_data(&w->xc, &pre, in);
    /* the hand-in combined, node 0 exchanges with its partner 0 ^ 1 = 1 */
    assert_int_equal(w->nsent, 1);
    assert_int_equal(w->sent[0].node, 1);
    assert_int_equal(w->sent[0].phase, XPHASE_RD);
    colld_xrd_waiting(&w->xc, &phase, &step, &from);
    assert_int_equal(phase, XPHASE_RD);
    assert_int_equal(step, 0);
    assert_int_equal(from, 1);
    unmake(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_allreduce), cmocka_unit_test(test_layout_broadcast),
        cmocka_unit_test(test_layout_allgather), cmocka_unit_test(test_ring_start),
        cmocka_unit_test(test_ring_valid),       cmocka_unit_test(test_ring_phases_of_kinds),
        cmocka_unit_test(test_ring_data),        cmocka_unit_test(test_rd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
