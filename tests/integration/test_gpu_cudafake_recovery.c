/*
 * test_gpu_cudafake_recovery.c - a sticky error in the daemon's context of a GPU: the GPU is reset
 * and comes back, the other GPU and host work go on, a GPU that keeps faulting is given up (issue
 * 15 F3); the client's flag area registered again after the application resets its context.
 * Groups recovery and recovery_legacy (harness_gpu.h).
 */
#include "tests/integration/harness_gpu.h"

#include <stdio.h>
#include <string.h>

/* ============================================================================================
 * Recovery from a sticky error (groups "recovery", "recovery_legacy"; issue 15 F3 and the flag
 * area's context, fixed)
 * ========================================================================================== */

#define RESET_HELD "# held: cuDevicePrimaryCtxReset call #1" /* the daemon's fault file, hold_call */
#define RECOVERED_TAIL ") recovered: its context was reset after CUDA_ERROR_ILLEGAL_ADDRESS"

/* One count-0 collective that fails: its stream released, then the communicator's error. */
static void sc_count0(rank_t *r)
{
    r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    r->cr[0] = stream_released(r);
    if (r->st[0] == COLLD_OK)
        r->st[1] = async_error(r->comm);
}

/* One count-0 collective that works: completion instead of an error to wait for. */
static void sc_count0_ok(rank_t *r)
{
    r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    r->cr[0] = stream_released(r);
    r->st[1] = colld_comm_synchronize(r->comm);
}

/* The daemon log's line that GPU gi came back: "GPU gi (NAME) recovered: ...". */
static bool gpu_recovered(const char *log_path, int gi, int ms)
{
    static char log[65536];
    char head[16];
    snprintf(head, sizeof(head), "GPU %d (", gi);
    for (int i = 0; i < ms / 5; i++) {
        harness_read_file(log_path, log, sizeof(log));
        for (const char *p = strstr(log, head); p; p = strstr(p + 1, head)) {
            const char *eol = strchr(p, '\n');
            const char *t = strstr(p, RECOVERED_TAIL);
            if (t && (!eol || t < eol))
                return true;
        }
        harness_wait_file("/nonexistent", 5);
    }
    return false;
}

/* Issue 15 F3, fixed: a sticky error in the daemon's context of GPU 0 (its double faults the first
 * cuEventCreate: the end of the first launch) fails the collective in flight with COLLD_ERR_DEVICE
 * naming the GPU and the CUDA error, and releases both ranks' streams; the daemon then resets the
 * GPU's primary context (its double holds that reset until the test lets it go). Meanwhile a
 * host-only communicator runs exactly and a GPU registration on GPU 0 is refused with the reason.
 * Once the daemon logs that GPU 0 recovered, a new communicator on it (rank 0's client is the same
 * one, whose flag area the daemon registered again in the reset context) runs every collective
 * exactly. Before the fix the detail named no GPU, no reset ever came, and every later
 * communicator on GPU 0 failed (a new client could not even get its flag area registered). */
static void test_sticky_error_gpu_recovers(void **state)
{
    harness_t *h = *state;
    rank_t ranks[2];
    run_ranks(h, sc_count0, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS); /* released */
        assert_int_equal(ranks[i].st[1], COLLD_ERR_DEVICE);
        assert_non_null(strstr(ranks[i].detail, "CUDA refused the launch: CUDA_ERROR_ILLEGAL_ADDRESS"));
        assert_non_null(strstr(ranks[i].detail, "on GPU 0 ("));
        assert_non_null(strstr(ranks[i].detail, "colld resets the GPU: create a new communicator"));
    }
    /* The reset is under way (held by the daemon's double). */
    assert_true(log_says(gpu_control, RESET_HELD, WAIT_MS));
    run_ranks(h, sc_host, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
    }
    void *p = NULL;
    assert_int_equal(colld_mem_alloc(h->client, &p, 4096, COLLD_MEM_CUDA), COLLD_ERR_DEVICE);
    print_message("GPU registration during the reset: %s\n", colld_last_error(h->client));
    assert_non_null(strstr(colld_last_error(h->client), "GPU 0 ("));
    assert_non_null(strstr(colld_last_error(h->client), "is being reset after CUDA_ERROR_ILLEGAL_ADDRESS"));
    CU_MUST(cu->cuCtxSetCurrent(NULL));
    assert_true(control_append("release:hold"));
    assert_true(gpu_recovered(h->log, 0, WAIT_MS));
    run_ranks(h, sc_collectives, 0, ranks);
    for (int i = 0; i < 2; i++)
        assert_int_equal(ranks[i].v[0], 6); /* every collective's result exact */
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* An all-reduce of device memory (rank r's buffers on its device) that fails: its stream
 * released, then the communicator's error. */
static void sc_data_fails(rank_t *r)
{
    static float host[2][COUNT];
    void *sp = NULL, *rp = NULL;
    colld_status_t st;
    if ((st = colld_mem_alloc(r->c, &sp, COUNT * sizeof(float), COLLD_MEM_CUDA)) != COLLD_OK ||
        (st = colld_mem_alloc(r->c, &rp, COUNT * sizeof(float), COLLD_MEM_CUDA)) != COLLD_OK) {
        rank_fail(r, "colld_mem_alloc(COLLD_MEM_CUDA): %s: %s", colld_status_name(st), colld_last_error(r->c));
        goto out;
    }
    if (!fill(r, (CUdeviceptr)(uintptr_t)sp, (CUdeviceptr)(uintptr_t)rp, COUNT, COUNT, host[r->rank]))
        goto out;
    r->st[0] = colld_allreduce(sp, rp, COUNT, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    r->cr[0] = stream_released(r);
    if (r->st[0] == COLLD_OK)
        r->st[1] = async_error(r->comm);
out:
    pthread_barrier_wait(r->barrier);
    if (rp)
        colld_mem_free(r->c, rp);
    if (sp)
        colld_mem_free(r->c, sp);
}

/* The same fault on GPU 1, which does not hold the flag areas: an all-reduce across GPUs 0 and 1
 * faults at its first cuEventCreate, made in GPU 1's context (the event GPU 0's stream waits
 * for). The collective fails naming GPU 1. While GPU 1's reset is held, a communicator whose
 * ranks both use GPU 0 runs every collective exactly (GPU 0 is neither held nor touched); once
 * GPU 1 recovered, a communicator across both GPUs does again. */
static void test_sticky_error_other_gpu_goes_on(void **state)
{
    harness_t *h = *state;
    rank_t ranks[2];
    run_ranks(h, sc_data_fails, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS); /* released */
        assert_int_equal(ranks[i].st[1], COLLD_ERR_DEVICE);
        assert_non_null(strstr(ranks[i].detail, "CUDA refused the launch: CUDA_ERROR_ILLEGAL_ADDRESS"));
        assert_non_null(strstr(ranks[i].detail, "on GPU 1 ("));
    }
    assert_true(log_says(gpu_control, RESET_HELD, WAIT_MS));
    rank_device[1] = 0; /* both ranks on GPU 0 */
    run_ranks(h, sc_collectives, 0, ranks);
    rank_device[1] = 1;
    for (int i = 0; i < 2; i++)
        assert_int_equal(ranks[i].v[0], 6); /* every collective's result exact during GPU 1's reset */
    assert_true(control_append("release:hold"));
    assert_true(gpu_recovered(h->log, 1, WAIT_MS));
    run_ranks(h, sc_collectives, 0, ranks);
    for (int i = 0; i < 2; i++)
        assert_int_equal(ranks[i].v[0], 6);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* The bound: GPU 0 of the daemon faults at every launch (every cuEventCreate, sticky). Each of the
 * first three faults is followed by a reset; the fourth, again within a minute of the last
 * reset, gives GPU 0 up, and a collective on it then fails at once with COLLD_ERR_DEVICE saying
 * so (the flag areas moved to GPU 1, so the ranks' streams are still released). No reset loop. */
static void test_sticky_error_gpu_given_up(void **state)
{
    harness_t *h = *state;
    rank_t ranks[2];
    for (int round = 1; round <= 4; round++) {
        run_ranks(h, sc_count0, 0, ranks);
        for (int i = 0; i < 2; i++) {
            assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS); /* released */
            assert_int_equal(ranks[i].st[1], COLLD_ERR_DEVICE);
            assert_non_null(strstr(ranks[i].detail, "CUDA refused the launch: CUDA_ERROR_ILLEGAL_ADDRESS"));
        }
        char want[64];
        snprintf(want, sizeof(want), "(reset %d since start)", round);
        assert_true(log_says(h->log, round < 4 ? want : ") given up: CUDA_ERROR_ILLEGAL_ADDRESS", WAIT_MS));
    }
    static char log[65536];
    harness_read_file(h->log, log, sizeof(log));
    assert_null(strstr(log, "(reset 4 since start)")); /* three resets, no more */
    run_ranks(h, sc_count0, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS); /* released */
        assert_int_equal(ranks[i].st[1], COLLD_ERR_DEVICE);
        assert_non_null(strstr(ranks[i].detail, "GPU 0 ("));
        assert_non_null(strstr(ranks[i].detail, ") was given up by colld: CUDA_ERROR_ILLEGAL_ADDRESS"));
    }
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* A daemon whose double faults every cuEventCreate (sticky, CUDA_ERROR_ILLEGAL_ADDRESS). */
static int setup_sticky_always(void **state)
{
    static const char *const lines[] = { "sticky:cuEventCreate:1-:CUDA_ERROR_ILLEGAL_ADDRESS", NULL };
    return setup_with_control(state, lines);
}

/* A daemon whose double faults its first cuEventCreate (sticky, CUDA_ERROR_ILLEGAL_ADDRESS) and
 * holds its first cuDevicePrimaryCtxReset, reading gpu_control for the case's later
 * instructions. */
static int setup_sticky(void **state)
{
    static const char *const lines[] = { "sticky:cuEventCreate:+1:CUDA_ERROR_ILLEGAL_ADDRESS",
                                         "hold:cuDevicePrimaryCtxReset:1", NULL };
    return setup_with_control(state, lines);
}

/* Let the daemon's held reset go (a case that failed before it did), then stop the daemon. */
static int teardown_sticky(void **state)
{
    rank_device[1] = 1;
    control_append("release:hold");
    return teardown_control(state);
}

/* The flag area's context, fixed: the client registers its flag area in the context current at
 * its first stream-ordered collective; the application resets that primary context (as after a
 * sticky error of its own), which drops the registration. The client sees it gone at the next
 * collective and registers the area again: the collective completes. Before the fix the next
 * collective's `ready` write faulted on rank 0's stream (CUDA_ERROR_ILLEGAL_ADDRESS, sticky, in
 * the application). */
static void test_flag_area_registered_again_after_reset(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_count0_ok, 0, ranks); /* sets up both clients' flag areas, works */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
    }
    CU_MUST(app.reset(0)); /* rank 0's device; its client (the harness's) stays connected */
    run_ranks(*state, sc_count0_ok, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS); /* no fault on the stream */
        assert_int_equal(ranks[i].st[1], COLLD_OK);
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

gpu_cases_t gpu_recovery_cases(const char *group)
{
    static const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_flag_area_registered_again_after_reset, setup_on_double,
                                        teardown_contexts),
        cmocka_unit_test_setup_teardown(test_sticky_error_gpu_recovers, setup_sticky, teardown_sticky),
        cmocka_unit_test_setup_teardown(test_sticky_error_other_gpu_goes_on, setup_sticky, teardown_sticky),
        cmocka_unit_test_setup_teardown(test_sticky_error_gpu_given_up, setup_sticky_always, teardown_sticky),
    };
    static const char *const groups[] = { "recovery", "recovery_legacy", NULL };
    return group_is(group, groups) ? GPU_CASES(tests) : GPU_NO_CASES;
}
