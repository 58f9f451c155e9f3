/*
 * test_gpu_cudafake_launch.c - a launch that fails part-way, a communicator that breaks while its
 * collective is launched (issue 15 F1, F2, fixed): both ranks' streams are released and the
 * collectives fail with the cause. Groups vmm and legacy (harness_gpu.h).
 */
#include "tests/integration/harness_gpu.h"

#include <stdio.h>
#include <string.h>

/* ============================================================================================
 * A launch that fails part-way, a communicator that breaks while it is launched (issue 15 F1, F2)
 *
 * The daemon's double reads launch_control (setup_launch_fault): the daemon's first stream (the
 * communicator's stream on GPU 0, made by its first launch) stalls before its first operation,
 * and the daemon's 2nd cuStreamWriteValue32 fails. The first collective (count 0: only the flags)
 * then enqueues rank 0's `done` write on the stalled stream and fails at rank 1's: a launch that
 * failed part-way, whose enqueued write runs only when the case lets the stream go on.
 * ========================================================================================== */

#define LAUNCH_FAULT "cuStreamWriteValue32 failed: CUDA_ERROR_INVALID_VALUE" /* the daemon's log, CU_CHECK */
#define LAUNCH_HELD "# held: cuEventRecord call #1"                          /* the daemon's fault file, hold_call */

/* Rank 0's stream waits for a gate (host memory this thread opens) when it gets there. */
static bool gate_wait(rank_t *r, uint32_t *gate, CUdeviceptr dgate)
{
    if (gate && cu->cuStreamWaitValue32(r->s, dgate, 1, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS)
        return true;
    rank_fail(r, "the gate of rank 0's stream");
    return false;
}

/* Both ranks post two count-0 collectives, A and B. Rank 0's stream reaches A only after both
 * are posted (gate 0), so that the failure release covers B (B + COLLD_WIRE_GPU_RELEASE), and
 * reaches B only once the daemon is over with A (gate 1), so that its wait for B sees where the
 * daemon left its `done` flag. On rank 0, A's launch is in the daemon: with `fault`, it failed
 * part-way (the daemon's log says `fault`) and waits for its stalled stream; without, it is held
 * at its cuEventRecord (the fault file says so), every `done` write enqueued. With `abort_peer`,
 * rank 1 aborts the communicator meanwhile, while the daemon is still in A's launch, and rank 0
 * waits for that break; without, rank 0 gives a release written too early (the defect) a second
 * to arrive. Then the held call and the stalled stream go on (A's `done` write of rank 0); once
 * the daemon has failed A and B (colld_comm_synchronize), rank 0 gives that write half a second
 * to land before its stream goes on to B (the graces only let the defects show: the fixed daemon
 * orders the writes itself). Both ranks' streams must be released, and the collectives fail with
 * the cause. */
static void launch_scenario(rank_t *r, bool abort_peer, const char *fault)
{
    CUdeviceptr dgate[2] = { 0, 0 };
    uint32_t *gate[2] = { NULL, NULL };
    bool gated = true;
    for (int i = 0; r->rank == 0 && i < 2; i++)
        gate[i] = gate_new(&dgate[i]);
    if (r->rank == 0)
        gated = gate_wait(r, gate[0], dgate[0]);
    if (gated)
        r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    if (r->rank == 0 && gated)
        gated = gate_wait(r, gate[1], dgate[1]);
    if (gated)
        r->st[1] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    pthread_barrier_wait(r->barrier); /* both posted A and B */
    if (gate[0])
        __atomic_store_n(gate[0], 1, __ATOMIC_RELEASE);
    bool fired = gated && (fault ? log_says(r->h->log, fault, WAIT_MS) : log_says(gpu_control, LAUNCH_HELD, WAIT_MS));
    if (gated && !fired)
        rank_fail(r, "never saw \"%s\"", fault ? fault : LAUNCH_HELD);
    if (abort_peer && r->rank == 1 && fired)
        r->st[2] = colld_comm_abort(r->comm);
    if (r->rank == 0) {
        if (fired && abort_peer)
            r->st[2] = async_error_within(r->comm, WAIT_MS); /* the break arrived during the launch */
        else if (fired)
            async_error_within(r->comm, 1000);
        if (!fault && !control_append("release:hold"))
            rank_fail(r, "cannot write the daemon's fault file");
        if (!control_append("release:1")) /* always: a failed case must not leave the daemon stuck */
            rank_fail(r, "cannot write the daemon's fault file");
        r->st[3] = colld_comm_synchronize(r->comm);
        harness_wait_file("/nonexistent", 500);
        if (gate[1])
            __atomic_store_n(gate[1], 1, __ATOMIC_RELEASE);
    }
    pthread_barrier_wait(r->barrier);
    r->cr[0] = stream_released(r);
    /* Neither rank leaves before both streams were looked at: a rank that leaves has the daemon
     * release the communicator's streams once more, which would hide a `done` moved back. */
    pthread_barrier_wait(r->barrier);
    if (r->rank == 1)
        r->st[3] = colld_comm_synchronize(r->comm);
    for (int i = 0; i < 2; i++)
        if (gate[i] && r->s)
            gate_free(gate[i]); /* not under a stream left waiting on it */
}

static void sc_partial_launch(rank_t *r)
{
    launch_scenario(r, false, LAUNCH_FAULT);
}

static void sc_break_during_launch(rank_t *r)
{
    launch_scenario(r, true, LAUNCH_FAULT);
}

static void sc_break_during_held_launch(rank_t *r)
{
    launch_scenario(r, true, NULL);
}

/* Issue 15 F2, fixed: a launch that fails part-way (rank 0's `done` write enqueued, rank 1's
 * refused) waits for what it enqueued before the collective fails, so the failure release of
 * both ranks (past B) is written after rank 0's `done` write of A. Before the fix the release was
 * written at once, the stalled write then took rank 0's `done` back to A, and rank 0's stream
 * waited for B forever. */
static void test_partial_launch_failure_releases_streams(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_partial_launch, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS); /* released */
        assert_int_equal(ranks[i].st[3], COLLD_ERR_DEVICE);
        assert_non_null(strstr(ranks[i].detail, "CUDA refused the launch: CUDA_ERROR_INVALID_VALUE"));
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

/* What both break-during-launch cases end with: rank 1's abort seen by rank 0 during the launch,
 * both streams released, the collective failed with the abort, nothing left in the daemon. */
static void assert_aborted_during_launch(harness_t *h, const rank_t ranks[2])
{
    assert_int_equal(ranks[1].st[2], COLLD_OK);          /* colld_comm_abort */
    assert_int_equal(ranks[0].st[2], COLLD_ERR_ABORTED); /* seen by rank 0 during the launch */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS); /* released */
        assert_int_equal(ranks[i].st[3], COLLD_ERR_ABORTED);
        assert_non_null(strstr(ranks[i].detail, "aborted by rank 1"));
    }
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* A communicator that breaks (rank 1 aborts) while its collective A's launch, which fails
 * part-way, waits for its stalled stream: the release follows the launch's `done` writes. */
static void test_break_during_failed_launch_releases_streams(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_break_during_launch, 0, ranks);
    assert_aborted_during_launch(*state, ranks);
}

/* Issue 15 F1, fixed: a communicator that breaks (rank 1 aborts) while its collective A is being
 * launched (the daemon's lock dropped: the double holds the launch's cuEventRecord, after both
 * `done` writes were enqueued on the stalled stream) owes its releases until A has run: a
 * collective counts as running from the moment it leaves pending. Before the fix the break wrote
 * the releases at once (A did not count as running), A's own `done` write then took rank 0's flag
 * back, A completed, and rank 0's stream waited for B forever (here: failed after 20 s). */
static void test_break_during_launch_releases_streams(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_break_during_held_launch, 0, ranks);
    assert_aborted_during_launch(*state, ranks);
}

/* The same with --gpu-early-launch: the double holds the cuEventRecord after the collective's
 * kernels (behind the stream waits and the gate) were queued as it matched; the break cancels it. */
static void test_break_during_early_launch_releases_streams(void **state)
{
    test_break_during_launch_releases_streams(state);
}

/* A daemon whose double stalls its first stream and holds its first cuEventRecord (the end of
 * the first launch), and reads gpu_control for the case's later instructions. */
static int setup_launch_hold(void **state)
{
    static const char *const lines[] = { "stall:1", "hold:cuEventRecord:1", NULL };
    return setup_with_control(state, lines);
}

/* The same with --gpu-early-launch (issue 28 item 1, through the daemon's environment): the
 * collective is queued as it matches, behind stream waits on the ranks' ready words, and the break
 * must cancel it. */
static int setup_launch_hold_early(void **state)
{
    setenv("COLLD_GPU_EARLY_LAUNCH", "true", 1);
    int rc = setup_launch_hold(state);
    unsetenv("COLLD_GPU_EARLY_LAUNCH");
    return rc;
}

/* A daemon whose double stalls its first stream and fails its 2nd cuStreamWriteValue32, and
 * reads gpu_control for the case's later instructions. The daemon takes the host's hand-off (the
 * default; issue 28): these cases fail one of its per-rank `done` writes, which the hand-off
 * without the host (--gpu-early-launch: its done kernel writes them) does not make. */
static int setup_launch_fault(void **state)
{
    static const char *const lines[] = { "stall:1", "fail:cuStreamWriteValue32:2:CUDA_ERROR_INVALID_VALUE", NULL };
    return setup_with_control(state, lines);
}

gpu_cases_t gpu_launch_cases(const char *group)
{
    static const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_partial_launch_failure_releases_streams, setup_launch_fault,
                                        teardown_control),
        cmocka_unit_test_setup_teardown(test_break_during_failed_launch_releases_streams, setup_launch_fault,
                                        teardown_control),
        cmocka_unit_test_setup_teardown(test_break_during_launch_releases_streams, setup_launch_hold, teardown_control),
        cmocka_unit_test_setup_teardown(test_break_during_early_launch_releases_streams, setup_launch_hold_early,
                                        teardown_control),
    };
    static const char *const groups[] = { "vmm", "legacy", NULL };
    return group_is(group, groups) ? GPU_CASES(tests) : GPU_NO_CASES;
}
