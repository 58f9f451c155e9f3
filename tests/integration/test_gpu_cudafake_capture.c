/*
 * test_gpu_cudafake_capture.c - a collective on a stream being captured into a CUDA graph (issue
 * 15 3.3, refused rather than wrong): group defects (harness_gpu.h).
 */
#include "tests/integration/harness_gpu.h"

#include <stdio.h>
#include <string.h>

/* Issue 15 3.3: a collective on a stream being captured into a CUDA graph is refused with
 * COLLD_ERR_NOT_SUPPORTED before any CUDA call (client/cuda.c refuse_capture), and the
 * application's capture stays valid. Before: the first such collective of a client registered its
 * flag area (cuMemHostRegister, which a capture prohibits): it failed with COLLD_ERR_DEVICE and
 * invalidated the capture. Captured collectives that replay (a persistent plan per graph) are
 * not built. */
static void sc_capture_first(rank_t *r)
{
    r->cr[0] = app.begin(r->s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
    CUgraph g = NULL;
    r->cr[1] = app.end(r->s, &g);
    if (g)
        app.destroy(g);
    /* Outside the capture the communicator works (the flag area is set up now). */
    r->st[1] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    r->cr[2] = cu->cuStreamSynchronize(r->s);
    r->st[2] = colld_comm_synchronize(r->comm);
}

static void test_capture_first_collective_refused_capture_valid(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_capture_first, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[0], COLLD_ERR_NOT_SUPPORTED);
        assert_non_null(
            strstr(ranks[i].detail, "is being captured into a CUDA graph: colld cannot capture collectives yet"));
        assert_int_equal(ranks[i].cr[1], CUDA_SUCCESS); /* the capture was left valid */
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].cr[2], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[2], COLLD_OK);
    }
}

/* With the flag area set up, a collective inside a capture: refused, nothing enters the graph
 * (before: its ready write and done wait did, the daemon timed it out at capture time, and every
 * replay passed without running it), the daemon has no collective to time out, the graph (empty)
 * replays, and the communicator goes on outside the capture. */
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
    r->st[3] = colld_comm_synchronize(r->comm); /* no time-out of a captured collective either */
}

static void test_captured_collective_refused_nothing_captured(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_capture_replay, SHORT_TIMEOUT_MS, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[1], COLLD_ERR_NOT_SUPPORTED);
        assert_non_null(
            strstr(ranks[i].detail, "is being captured into a CUDA graph: colld cannot capture collectives yet"));
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS); /* the capture ended fine */
        assert_int_equal(ranks[i].v[0], 0);             /* nothing of colld's in the graph */
        assert_int_equal(ranks[i].v[1], 3);             /* the (empty) graph replays */
        assert_int_equal(ranks[i].st[2], COLLD_OK);
        assert_int_equal(ranks[i].cr[2], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[3], COLLD_OK);
    }
}

gpu_cases_t gpu_capture_cases(const char *group)
{
    static const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_capture_first_collective_refused_capture_valid, setup_on_double,
                                        teardown_contexts),
        cmocka_unit_test_setup_teardown(test_captured_collective_refused_nothing_captured, setup_on_double,
                                        teardown_contexts),
    };
    return strcmp(group, "defects") == 0 ? GPU_CASES(tests) : GPU_NO_CASES;
}
