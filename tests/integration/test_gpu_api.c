/*
 * test_gpu_api.c - libcolld's GPU API where there is no CUDA driver (every CI runner without a
 * GPU), against a real colld:
 *  - colld_mem_alloc(COLLD_MEM_CUDA) is COLLD_ERR_NOT_SUPPORTED, and colld_last_error gives the
 *    loader's reason (the missing driver);
 *  - every collective with a stream is COLLD_ERR_NOT_SUPPORTED with that reason in
 *    colld_comm_last_error, without the stream being touched (it is a bogus pointer here), also
 *    inside a group;
 *  - the refused calls leave the communicator as it was: host collectives on it afterwards, on
 *    the fast area and through the engine, are exact (2 ranks: two clients of this process, one
 *    thread each).
 * Where a driver is present the GPU tests (tests/gpu) run the real path; this test skips (77).
 */
#include "common/cudadrv.h"
#include "tests/integration/harness.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define BOGUS_STREAM ((void *)0x5ca1ab1e) /* would fault if the library dereferenced it */
#define SMALL_COUNT 16                    /* on the fast area (its default slot is 16 KiB) */
#define LARGE_COUNT (1u << 20)            /* 4 MiB of floats: through the engine */

static char no_driver[256]; /* the loader's reason, what the messages must carry */

/* ---------------------------------------------------------------------------------------------
 * COLLD_MEM_CUDA
 * ------------------------------------------------------------------------------------------- */

static void test_mem_alloc_cuda_refused(void **state)
{
    harness_t *h = *state;
    void *p = (void *)1;
    assert_int_equal(colld_mem_alloc(h->client, &p, 4096, COLLD_MEM_CUDA), COLLD_ERR_NOT_SUPPORTED);
    assert_null(p);
    const char *e = colld_last_error(h->client);
    print_message("%s\n", e);
    assert_non_null(strstr(e, "COLLD_ERR_NOT_SUPPORTED"));
    assert_non_null(strstr(e, "COLLD_MEM_CUDA"));
    assert_non_null(strstr(e, no_driver));
#ifdef COLLD_HAVE_CUDA
    assert_non_null(strstr(e, "driver")); /* names what is missing */
#endif
    /* Host memory is unaffected; freeing memory that is not ours is refused with a reason. */
    assert_int_equal(colld_mem_alloc(h->client, &p, 4096, COLLD_MEM_HOST), COLLD_OK);
    assert_int_equal(colld_mem_free(h->client, p), COLLD_OK);
    int local;
    assert_int_equal(colld_mem_free(h->client, &local), COLLD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(colld_last_error(h->client), "not memory from colld_mem_alloc"));
}

/* ---------------------------------------------------------------------------------------------
 * Streams refused, host collectives exact afterwards
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    harness_t *h;
    colld_unique_id_t id;
    int rank;
    int failures;
    char failure[512]; /* the first one */
} rank_t;

static void rank_fail(rank_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rank_fail(rank_t *r, const char *fmt, ...)
{
    if (r->failures++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        int n = snprintf(r->failure, sizeof(r->failure), "rank %d: ", r->rank);
        vsnprintf(r->failure + n, sizeof(r->failure) - (size_t)n, fmt, ap);
        va_end(ap);
    }
}

/* A refused stream-ordered call: NOT_SUPPORTED, and the reason in the communicator's detail. */
static void expect_refused(rank_t *r, colld_comm_t *comm, const char *what, colld_status_t st)
{
    const char *e = colld_comm_last_error(comm);
    if (st != COLLD_ERR_NOT_SUPPORTED)
        rank_fail(r, "%s with a stream: %s, not COLLD_ERR_NOT_SUPPORTED", what, colld_status_name(st));
    else if (!strstr(e, "stream-ordered") || !strstr(e, no_driver))
        rank_fail(r, "%s with a stream: the detail does not give the reason: %s", what, e);
}

/* An all-reduce (sum) of count floats on send/recv, checked exactly. Rank k contributes
 * (k + 1) * (i % 7): every partial sum is a small integer, exact in float. */
static void allreduce_exact(rank_t *r, colld_comm_t *comm, float *send, float *recv, size_t count)
{
    for (size_t i = 0; i < count; i++)
        send[i] = (float)((r->rank + 1) * (int)(i % 7));
    colld_status_t st = colld_allreduce(send, recv, count, COLLD_FLOAT32, COLLD_SUM, comm, NULL);
    if (st == COLLD_OK)
        st = colld_comm_synchronize(comm);
    if (st != COLLD_OK) {
        rank_fail(r, "host all-reduce of %zu: %s: %s", count, colld_status_name(st), colld_comm_last_error(comm));
        return;
    }
    for (size_t i = 0; i < count; i++)
        if (recv[i] != (float)(3 * (int)(i % 7))) {
            rank_fail(r, "host all-reduce of %zu: element %zu is %g, not %d", count, i, (double)recv[i], 3 * (int)(i % 7));
            return;
        }
}

static void *rank_main(void *arg)
{
    rank_t *r = arg;
    colld_client_t *c = r->h->client;
    colld_comm_t *comm = NULL;
    float *small = NULL, *large = NULL;
    if (r->rank == 1 && colld_connect(r->h->socket, &c) != COLLD_OK) {
        rank_fail(r, "colld_connect failed");
        return NULL;
    }
    colld_status_t st = colld_comm_init_rank(c, &comm, 2, r->id, r->rank, NULL);
    if (st != COLLD_OK) {
        rank_fail(r, "colld_comm_init_rank: %s", colld_status_name(st));
        goto out;
    }
    small = calloc(2 * SMALL_COUNT, sizeof(float));
    if (!small || colld_mem_alloc(c, (void **)&large, 2 * (size_t)LARGE_COUNT * sizeof(float), COLLD_MEM_HOST)) {
        rank_fail(r, "no memory for the buffers");
        goto out;
    }
    float *buf = small;
    expect_refused(r, comm, "colld_allreduce",
                   colld_allreduce(buf, buf, SMALL_COUNT, COLLD_FLOAT32, COLLD_SUM, comm, BOGUS_STREAM));
    expect_refused(r, comm, "colld_broadcast", colld_broadcast(buf, buf, SMALL_COUNT, COLLD_FLOAT32, 0, comm, BOGUS_STREAM));
    expect_refused(r, comm, "colld_reduce",
                   colld_reduce(buf, buf, SMALL_COUNT, COLLD_FLOAT32, COLLD_SUM, 1, comm, BOGUS_STREAM));
    expect_refused(r, comm, "colld_allgather", colld_allgather(buf, large, SMALL_COUNT, COLLD_FLOAT32, comm, BOGUS_STREAM));
    expect_refused(r, comm, "colld_reducescatter",
                   colld_reducescatter(large, buf, SMALL_COUNT, COLLD_FLOAT32, COLLD_SUM, comm, BOGUS_STREAM));
    /* In a group: refused at the call, and the group ends with that error, posting nothing. */
    colld_group_start();
    expect_refused(r, comm, "colld_allreduce in a group",
                   colld_allreduce(large, large, LARGE_COUNT, COLLD_FLOAT32, COLLD_SUM, comm, BOGUS_STREAM));
    st = colld_group_end();
    if (st != COLLD_ERR_NOT_SUPPORTED)
        rank_fail(r, "colld_group_end after a refused stream call: %s", colld_status_name(st));
    /* Nothing was numbered: both ranks' host collectives match and are exact. */
    allreduce_exact(r, comm, small, small + SMALL_COUNT, SMALL_COUNT);
    allreduce_exact(r, comm, large, large + LARGE_COUNT, LARGE_COUNT);
    allreduce_exact(r, comm, small, small, SMALL_COUNT);
    if (colld_comm_get_async_error(comm, &st) != COLLD_OK || st != COLLD_OK)
        rank_fail(r, "the communicator has an error: %s", colld_status_name(st));
out:
    if (comm)
        colld_comm_destroy(comm);
    if (large)
        colld_mem_free(c, large);
    free(small);
    if (r->rank == 1)
        colld_disconnect(c);
    return NULL;
}

static void test_stream_refused_then_host_exact(void **state)
{
    harness_t *h = *state;
    rank_t ranks[2];
    pthread_t t[2];
    colld_unique_id_t id;
    assert_int_equal(colld_get_unique_id(h->client, &id), COLLD_OK);
    for (int i = 0; i < 2; i++) {
        ranks[i] = (rank_t){ .h = h, .id = id, .rank = i };
        assert_int_equal(pthread_create(&t[i], NULL, rank_main, &ranks[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++)
        if (ranks[i].failures)
            print_message("%s (%d failure(s))\n", ranks[i].failure, ranks[i].failures);
    assert_int_equal(ranks[0].failures + ranks[1].failures, 0);
    assert_int_equal(harness_wait_clean(h, 5000), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (colld_cu_load(no_driver, sizeof(no_driver))) {
        printf("a CUDA driver is present: the GPU tests (tests/gpu) cover this machine; skipping\n");
        return 77;
    }
    /* In a build without CUDA support the library gives its own reason. */
#ifndef COLLD_HAVE_CUDA
    snprintf(no_driver, sizeof(no_driver), "has no CUDA support");
#endif
    printf("no CUDA driver: %s\n", no_driver);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mem_alloc_cuda_refused, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_stream_refused_then_host_exact, harness_test_setup,
                                        harness_test_teardown),
    };
    return cmocka_run_group_tests_name("gpu_api", tests, NULL, NULL);
}
