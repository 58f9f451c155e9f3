/*
 * test_nccl.c - colld's libnccl.so.2 (bindings/nccl) against a real daemon: colld-test-nccl-rank
 * processes, written against nccl.h alone, run every collective x NCCL data type x operator
 * exactly on host memory, one process drives several ranks (ncclCommInitAll and a group), bad
 * input and the calls colld does not support yet give NCCL's result codes with a clear
 * ncclGetLastError, and a rank that dies gives the others ncclRemoteError naming it. The calls of
 * NCCL 2.20-2.28 that PyTorch 2.x links: ncclAlltoAll in the matrix, ncclCommInitRankScalable,
 * ncclGroupSimulateEnd and ncclCommShrink on 3 ranks (test_recent), their refusals and bad
 * arguments in test_errors_and_library. Every rank
 * reports the libnccl.so.2 it loaded; it must be colld's build (a real NCCL may sit in the ld.so
 * cache: the CUDA toolkit's lib folder), and the rank refuses to run on another (exit 3).
 */
#include "tests/integration/harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Spawn n ranks of `mode` (extra arguments after), the unique id handed over in a file. */
static void spawn(harness_t *h, const char *mode, int n, const char *const *extra, pid_t *pids)
{
    char id[400], nr[16], rk[16];
    snprintf(id, sizeof(id), "%s/nccl-id-%s", h->dir, mode);
    unlink(id);
    snprintf(nr, sizeof(nr), "%d", n);
    for (int r = 0; r < n; r++) {
        snprintf(rk, sizeof(rk), "%d", r);
        const char *argv[16] = { NCCL_RANK_BIN, "--nranks", nr, "--rank", rk, "--id-file", id, "--mode", mode };
        int k = 9;
        for (int i = 0; extra && extra[i] && k < 15; i++)
            argv[k++] = extra[i];
        argv[k] = NULL;
        assert_true((pids[r] = harness_spawn(argv)) > 0);
    }
}

static int setup(void **state)
{
    if (harness_test_setup(state) < 0)
        return -1;
    harness_t *h = *state;
    return setenv("COLLD_SOCKET", h->socket, 1); /* libnccl.so.2 connects to $COLLD_SOCKET */
}

/* Every collective x data type x operator x count, 2 and 4 ranks. */
static void test_matrix(void **state)
{
    pid_t p[4];
    spawn(*state, "matrix", 2, NULL, p);
    assert_int_equal(harness_wait_all(p, 2, 240000), 0);
    spawn(*state, "matrix", 4, NULL, p);
    assert_int_equal(harness_wait_all(p, 4, 240000), 0);
}

/* ncclCommInitAll: three ranks in one process, one group of all-reduces across them. */
static void test_init_all(void **state)
{
    harness_t *h = *state;
    char out[4096];
    const char *argv[] = { NCCL_RANK_BIN, "--nranks", "3", "--rank", "0", "--mode", "initall", NULL };
    assert_int_equal(harness_capture(argv, out, sizeof(out), 60000), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "3 ranks: 210003 elements checked, 0 wrong"));
    (void)h;
}

/* The result codes and texts of bad input and of what is not supported yet; and the library the
 * program loaded is this build's. */
static void test_errors_and_library(void **state)
{
    harness_t *h = *state;
    char out[8192], id[400];
    snprintf(id, sizeof(id), "%s/nccl-id-errors", h->dir);
    const char *argv[] = { NCCL_RANK_BIN, "--nranks", "1", "--rank", "0", "--id-file", id, "--mode", "errors", NULL };
    assert_int_equal(harness_capture(argv, out, sizeof(out), 60000), 0);
    fputs(out, stdout);
    char want[600];
    snprintf(want, sizeof(want), "libnccl: %s (colld libnccl.so.2", NCCL_LIB);
    assert_non_null(strstr(out, want));
}

/* A rank exits without a word: the others' next all-reduce fails with ncclRemoteError naming
 * it, and ncclCommGetAsyncError says so too. */
static void test_rank_dies(void **state)
{
    pid_t p[3];
    const char *extra[] = { "--victim", "2", NULL };
    spawn(*state, "victim", 3, extra, p);
    assert_int_equal(harness_wait_all(p, 3, 120000), 0);
}

/* A call refused here (a send to a peer out of range), then a mismatch colld reports: the
 * all-reduce's ncclGetLastError is the mismatch, not the refusal (issue 26 row 6). */
static void test_detail_not_stale(void **state)
{
    pid_t p[2];
    spawn(*state, "stale", 2, NULL, p);
    assert_int_equal(harness_wait_all(p, 2, 60000), 0);
}

/* NCCL 2.20-2.28 on 3 ranks: ncclCommInitRankScalable with two ids, ncclGroupSimulateEnd (nothing
 * of the group runs; the communicator is as before), ncclCommShrink without an idle rank and
 * without one that left, every result exact. */
static void test_recent(void **state)
{
    pid_t p[3];
    spawn(*state, "recent", 3, NULL, p);
    assert_int_equal(harness_wait_all(p, 3, 120000), 0);
}

#ifdef NCCL_GPU_RANK_BIN
/* ncclSend / ncclRecv on device buffers, stream-ordered (issue 16), on the CUDA driver test double:
 * 3 ranks on 2 fake GPUs (nccl_gpu_rank.c), every byte exact. */
static void test_p2p_device_buffers(void **state)
{
    harness_t *h = *state;
    char id[400], rk[3][4];
    pid_t p[3];
    snprintf(id, sizeof(id), "%s/nccl-id-gpu", h->dir);
    for (int r = 0; r < 3; r++) {
        snprintf(rk[r], sizeof(rk[r]), "%d", r);
        const char *argv[] = { NCCL_GPU_RANK_BIN, "--nranks", "3",          "--rank", rk[r], "--id-file", id,
                               "--gpus",          "2",        "--cudafake", NULL };
        assert_true((p[r] = harness_spawn(argv)) > 0);
    }
    assert_int_equal(harness_wait_all(p, 3, 240000), 0);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}
#endif

/* `test_nccl` runs the host-memory tests; `test_nccl gpu` the device-buffer one (on the double). */
int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1 && strcmp(argv[1], "gpu") == 0) {
#ifdef NCCL_GPU_RANK_BIN
        const struct CMUnitTest gpu[] = {
            cmocka_unit_test_setup_teardown(test_p2p_device_buffers, setup, harness_test_teardown),
        };
        return cmocka_run_group_tests_name("nccl_gpu", gpu, NULL, NULL);
#else
        printf("SKIP: a build without CUDA has no device buffers\n");
        return 77;
#endif
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_errors_and_library, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_matrix, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_init_all, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_rank_dies, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_detail_not_stale, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_recent, setup, harness_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
