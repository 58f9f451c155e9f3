/*
 * test_gpu_cudafake_capture.c - a collective on a stream being captured into a CUDA graph (issue
 * 15 3.3): captured, the capture valid, every replay run; group defects (harness_gpu.h).
 * test_gpu_cudafake_graph.c replays every kind with exact results and the faults.
 */
#include "tests/integration/harness_gpu.h"

#include <stdio.h>
#include <string.h>

/* Issue 15 3.3, fixed: a collective on a stream being captured into a CUDA graph is captured (a
 * persistent plan in the daemon, client/cuda_graph.c), also as the client's first stream-ordered
 * collective: its registrations and the flag area's (cuMemHostRegister, in the RELAXED capture
 * mode) are made during the capture, which stays valid and holds colld's three memory operations.
 * Before: the call failed with COLLD_ERR_DEVICE and invalidated the capture (and then, once
 * refused, with COLLD_ERR_NOT_SUPPORTED). test_gpu_cudafake_graph replays every kind exactly. */
static void sc_capture_first(rank_t *r)
{
    r->cr[0] = app.begin(r->s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
    CUgraph g = NULL;
    r->cr[1] = app.end(r->s, &g);
    size_t n = 0;
    if (g && app.nodes(g, NULL, &n) == CUDA_SUCCESS)
        r->v[0] = (long)n;
    if (g)
        app.destroy(g);
    /* Outside the capture the communicator works. */
    r->st[1] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    r->cr[2] = cu->cuStreamSynchronize(r->s);
    r->st[2] = colld_comm_synchronize(r->comm);
}

static void test_capture_first_collective_captured_capture_valid(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_capture_first, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].cr[1], CUDA_SUCCESS); /* the capture was left valid */
        assert_int_equal(ranks[i].v[0], 3);             /* ready = 1, wait done == 1, done = 0 */
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].cr[2], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[2], COLLD_OK);
    }
}

/* With the flag area set up, a collective inside a capture: the graph holds its plan's three
 * memory operations, and each of three replays completes only once the daemon ran the plan (its
 * `done`); no replay fails or times out, and the communicator goes on outside the capture. Before:
 * the daemon timed the collective out at capture time and every replay passed without running
 * it; then it was refused (COLLD_ERR_NOT_SUPPORTED, an empty graph). */
static void sc_capture_replay(rank_t *r)
{
    r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    if (r->st[0] != COLLD_OK || cu->cuStreamSynchronize(r->s) != CUDA_SUCCESS || colld_comm_synchronize(r->comm))
        return rank_fail(r, "the collective before the capture failed");
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    if (app.begin(r->s, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS)
        return rank_fail(r, "cuStreamBeginCapture failed");
    r->st[1] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
    r->cr[0] = app.end(r->s, &g);
    size_t n = 0;
    if (g && app.nodes(g, NULL, &n) == CUDA_SUCCESS)
        r->v[0] = (long)n;
    if (g && app.instantiate(&x, g, 0) == CUDA_SUCCESS) {
        for (int i = 0; i < 3 && r->cr[1] == CUDA_SUCCESS; i++) {
            r->cr[1] = app.launch(x, r->s);
            if (r->cr[1] == CUDA_SUCCESS)
                r->cr[1] = cu->cuStreamSynchronize(r->s);
            r->v[1] += r->cr[1] == CUDA_SUCCESS;
        }
        app.exec_destroy(x);
    }
    if (g)
        app.destroy(g);
    r->st[2] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    r->cr[2] = cu->cuStreamSynchronize(r->s);
    r->st[3] = colld_comm_synchronize(r->comm); /* no replay failed, none timed out */
}

static void test_captured_collective_replays(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_capture_replay, SHORT_TIMEOUT_MS, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS); /* the capture ended fine */
        assert_int_equal(ranks[i].v[0], 3);             /* colld's three memory operations */
        assert_int_equal(ranks[i].v[1], 3);             /* every replay completed */
        assert_int_equal(ranks[i].st[2], COLLD_OK);
        assert_int_equal(ranks[i].cr[2], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[3], COLLD_OK);
    }
}

gpu_cases_t gpu_capture_cases(const char *group)
{
    static const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_capture_first_collective_captured_capture_valid, setup_on_double,
                                        teardown_contexts),
        cmocka_unit_test_setup_teardown(test_captured_collective_replays, setup_on_double,
                                        teardown_contexts),
    };
    return strcmp(group, "defects") == 0 ? GPU_CASES(tests) : GPU_NO_CASES;
}
