/*
 * test_gpu_cudafake_nan.c - --nan-check on GPU buffers (issue 30 item 1), through a real daemon on
 * the CUDA driver test double: the daemon's reduce kernels (the host build of kernels/cuda's source
 * on the double) note each rank's first NaN or infinity, and the collective fails on every rank
 * with the host backend's detail, word for word.
 *
 *   nan_check_gpu      --nan-check (COLLD_NAN_CHECK=1 for the daemon): an all-reduce over both fake
 *                      GPUs (two slices, so the second GPU's words carry the slice's base) with a
 *                      +Inf and a -Inf on rank 0 and two NaNs on rank 1, then a float16
 *                      reduce-scatter (one launch per rank's piece) with an infinity on each rank:
 *                      COLLD_ERR_NUMERIC on both ranks naming the first element of each rank, the
 *                      daemon's log says it, collctl doctor reports it as `nan`; then the six exact
 *                      collectives of sc_collectives (a clean run with the check on gives exact
 *                      results)
 *   nan_without_check  the same poisoned all-reduce on a daemon without the option completes: the
 *                      NaN and the infinity are data, propagated into the result
 *
 * What the double cannot show: the memory ordering of a real GPU's atomics on mapped host memory,
 * and the check's cost (docs/performance.md says what to measure on a GPU).
 */
#include "tests/integration/harness_gpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POISON_RANK0_INF 4000u  /* in the second GPU's slice of N_AR elements, in its vector body */
#define POISON_RANK0_NINF 4098u /* the last element: the tail, one element at a time */
#define POISON_RANK1_NAN 7u
#define POISON_RANK1_NAN2 3000u

#define N_H 1030 /* float16 elements per rank of the reduce-scatter */

static const char want_allreduce[] = "rank 0 contributed +Inf at element 4000; rank 1 contributed NaN at element 7 "
                                     "(allreduce float32, --nan-check)";
/* Rank 0's piece 0 holds -Inf at 3; rank 1's piece 1 holds +Inf at N_H + 5 = 1035. */
static const char want_rs[] = "rank 0 contributed -Inf at element 3; rank 1 contributed +Inf at element 1035 "
                              "(reducescatter float16, --nan-check)";

/* This rank's inputs (harness_gpu.h's), with its poison, in host[] and send; recv 0xff bytes. */
static bool fill_poisoned(rank_t *r, CUdeviceptr send, CUdeviceptr recv, float *host)
{
    if (!fill(r, send, recv, N_AR, N_AR, host))
        return false;
    if (r->rank == 0) {
        host[POISON_RANK0_INF] = INFINITY;
        host[POISON_RANK0_NINF] = -INFINITY;
    } else {
        host[POISON_RANK1_NAN] = NAN;
        host[POISON_RANK1_NAN2] = NAN;
    }
    CUresult cr = cu->cuMemcpyHtoD(send, host, N_AR * sizeof(float));
    if (cr != CUDA_SUCCESS)
        rank_fail(r, "poisoning the input: %s", rname(cr));
    return cr == CUDA_SUCCESS;
}

/* Post a collective and wait for it: st[0] the post, cr[0] the stream, st[1] the communicator's
 * verdict, detail its last error. */
static void post_and_wait(rank_t *r, colld_status_t posted)
{
    r->st[0] = posted;
    if (posted != COLLD_OK)
        return;
    r->cr[0] = stream_released(r);
    r->st[1] = colld_comm_synchronize(r->comm);
    snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
}

/* Two GPU buffers of `bytes` from colld_mem_alloc(COLLD_MEM_CUDA). */
static bool alloc2(rank_t *r, size_t bytes, void **sp, void **rp)
{
    colld_status_t st;
    if ((st = colld_mem_alloc(r->c, sp, bytes, COLLD_MEM_CUDA)) != COLLD_OK ||
        (st = colld_mem_alloc(r->c, rp, bytes, COLLD_MEM_CUDA)) != COLLD_OK) {
        rank_fail(r, "colld_mem_alloc(COLLD_MEM_CUDA): %s: %s", colld_status_name(st), colld_last_error(r->c));
        return false;
    }
    return true;
}

/* The poisoned float32 all-reduce (out of place); v[1] counts the result's non-finite elements
 * where the poison was (the unchecked run propagates it). */
static void sc_poisoned_allreduce(rank_t *r)
{
    static float host[2][N_AR];
    float *h = host[r->rank];
    void *sp = NULL, *rp = NULL;
    if (!alloc2(r, N_AR * sizeof(float), &sp, &rp))
        goto out;
    if (!fill_poisoned(r, (CUdeviceptr)(uintptr_t)sp, (CUdeviceptr)(uintptr_t)rp, h))
        goto out;
    post_and_wait(r, colld_allreduce(sp, rp, N_AR, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s));
    if (r->st[1] == COLLD_OK && cu->cuMemcpyDtoH(h, (CUdeviceptr)(uintptr_t)rp, N_AR * sizeof(float)) == CUDA_SUCCESS) {
        r->v[1] = (h[POISON_RANK0_INF] == INFINITY) + !!isnan(h[POISON_RANK1_NAN]) + !!isnan(h[POISON_RANK1_NAN2]) +
                  (h[POISON_RANK0_NINF] == -INFINITY);
        r->v[0] = isfinite(h[0]) && h[0] == input_sum(0); /* an element nobody poisoned is exact */
    }
out:
    pthread_barrier_wait(r->barrier);
    if (sp)
        colld_mem_free(r->c, sp);
    if (rp)
        colld_mem_free(r->c, rp);
}

/* A float16 reduce-scatter of N_H elements per rank: 1.0 everywhere but one infinity per rank. */
static void sc_poisoned_rs(rank_t *r)
{
    static uint16_t host[2][2 * N_H];
    uint16_t *h = host[r->rank];
    void *sp = NULL, *rp = NULL;
    if (!alloc2(r, 2 * N_H * sizeof(uint16_t), &sp, &rp))
        goto out;
    for (size_t i = 0; i < 2 * N_H; i++)
        h[i] = 0x3c00; /* 1.0 */
    if (r->rank == 0)
        h[3] = 0xfc00; /* -Inf, in piece 0 */
    else
        h[N_H + 5] = 0x7c00; /* +Inf, in piece 1 */
    CUresult cr = cu->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)sp, h, sizeof(host[0]));
    if (cr != CUDA_SUCCESS) {
        rank_fail(r, "filling the input: %s", rname(cr));
        goto out;
    }
    post_and_wait(r, colld_reducescatter(sp, rp, N_H, COLLD_FLOAT16, COLLD_SUM, r->comm, r->s));
out:
    pthread_barrier_wait(r->barrier);
    if (sp)
        colld_mem_free(r->c, sp);
    if (rp)
        colld_mem_free(r->c, rp);
}

/* Both ranks failed with COLLD_ERR_NUMERIC and the detail `want`. */
static void expect_numeric(const rank_t ranks[2], const char *want)
{
    for (int i = 0; i < 2; i++) {
        print_message("rank %d: %s: %s\n", i, colld_status_name(ranks[i].st[1]), ranks[i].detail);
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS); /* the stream was released, not left waiting */
        assert_int_equal(ranks[i].st[1], COLLD_ERR_NUMERIC);
        if (!strstr(ranks[i].detail, want))
            fail_msg("rank %d's detail \"%s\" does not say \"%s\"", i, ranks[i].detail, want);
    }
}

static void test_nan_check_gpu(void **state)
{
    harness_t *h = *state;
    rank_t ranks[2];
    run_ranks(h, sc_poisoned_allreduce, 0, ranks);
    expect_numeric(ranks, want_allreduce);
    assert_true(log_says(h->log, want_allreduce, 5000)); /* the daemon's warning, as the host's */
    /* collctl doctor's NaN contributor finding, unchanged: it reads the failure's event. */
    char out[16384];
    const char *doctor[] = { COLLCTL_BIN, "--socket", h->socket, "doctor", NULL };
    (void)harness_capture(doctor, out, sizeof(out), 20000); /* exit 1: it found a problem */
    print_message("%s", out);
    assert_non_null(strstr(out, "warning nan"));
    assert_non_null(strstr(out, want_allreduce));
    run_ranks(h, sc_poisoned_rs, 0, ranks);
    expect_numeric(ranks, want_rs);
    /* A clean run with the check on: every result exact. */
    run_ranks(h, sc_collectives, 0, ranks);
    for (int i = 0; i < 2; i++)
        assert_int_equal(ranks[i].v[0], 6);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

static void test_nan_without_check(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_poisoned_allreduce, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].v[1], 4); /* the poison propagated */
        assert_int_equal(ranks[i].v[0], 1);
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

/* A daemon with --nan-check (its environment variable, for this start only). */
static int setup_nan_check(void **state)
{
    setenv("COLLD_NAN_CHECK", "1", 1);
    int rc = setup_on_double(state);
    unsetenv("COLLD_NAN_CHECK");
    return rc;
}

gpu_cases_t gpu_nan_cases(const char *group)
{
    static const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_nan_check_gpu, setup_nan_check, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_nan_without_check, setup_on_double, harness_test_teardown),
    };
    return strcmp(group, "vmm") == 0 ? GPU_CASES(tests) : GPU_NO_CASES;
}
