/*
 * test_fastpath.c - the fast path (client/fast.c, server/core/fast.c): small collectives of a
 * single-node communicator that the ranks run themselves on the shared area the daemon made.
 *
 * The collective matrix (test_collectives) and the fault tests (test_faults: a rank killed while
 * its peer waits, a rank that never comes, abort, daemon loss; test_observability: the trace of a
 * time-out) run their small counts through it, and CMakeLists.txt runs the fault tests a second
 * time with COLLD_FAST_PATH_BYTES=0 so the engine path keeps the same coverage. Here:
 *  - a chain of reduce-scatters (engine) and all-gathers (fast area) posted back to back, each
 *    reading the previous one's output, exact on 2 and 4 ranks; the flight recorder has every
 *    engine collective and the fast ones some rank waited for, each with its path and every
 *    rank's arrival;
 *  - the same chain with --fast-path-bytes 0 goes through the engine only;
 *  - a fast-path call against an engine call (different counts): MISMATCH for both, naming both.
 */
#include "tests/integration/harness.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define RUN_LIMIT_MS 300000

static int collctl_json_trace(harness_t *h, uint64_t id, char *out, size_t len)
{
    char idtext[32];
    snprintf(idtext, sizeof(idtext), "%llu", (unsigned long long)id);
    const char *argv[] = { COLLCTL_BIN, "--socket", h->socket, "--json", "trace", idtext, NULL };
    return harness_capture(argv, out, len, 20000);
}

/* The JSON object of trace entry `seq` (into buf), or NULL. */
static const char *trace_entry(const char *json, int seq, char *buf, size_t len)
{
    char key[32];
    snprintf(key, sizeof(key), "{\"seq\":%d,", seq);
    const char *p = strstr(json, key);
    if (!p)
        return NULL;
    const char *end = strchr(p, '}');
    if (!end || (size_t)(end - p) >= len)
        return NULL;
    memcpy(buf, p, (size_t)(end - p));
    buf[end - p] = '\0';
    return buf;
}

/* Run the chain on n ranks with rank 0 stopping at the end; check the results and what the flight
 * recorder says of each collective's path. want_fast: all-gathers on the fast area. */
static void run_chain(harness_t *h, int n, const char *count, bool want_fast)
{
    const int iters = 5;
    char it[8];
    snprintf(it, sizeof(it), "%d", iters);
    const char *extra[] = { "--mode", "chain", "--chain-count", count, "--iters", it, "--checkpoints", it,
                            "--sync-dir", h->dir, NULL };
    pid_t pids[8];
    assert_int_equal(harness_spawn_coll(h, n, extra, pids), 0);
    char at[512], go[512];
    snprintf(at, sizeof(at), "%s/at-%d", h->dir, iters);
    snprintf(go, sizeof(go), "%s/go-%d", h->dir, iters);
    assert_int_equal(harness_wait_file(at, RUN_LIMIT_MS), 0);

    uint64_t id = harness_comm_id(h, "test-coll");
    assert_true(id != 0);
    static char out[65536];
    assert_int_equal(collctl_json_trace(h, id, out, sizeof(out)), 0);
    int fast_seen = 0;
    for (int seq = 1; seq <= 2 * iters; seq++) {
        char e[1024];
        bool gather = seq % 2 == 0;
        /* The engine records every collective; the fast path only those a rank had to wait for
         * (about 0.25 ms), so a missing all-gather is one that ran on the fast area. */
        if (!trace_entry(out, seq, e, sizeof(e))) {
            assert_true(gather && want_fast);
            continue;
        }
        assert_non_null(strstr(e, gather ? "\"kind\":\"allgather\"" : "\"kind\":\"reducescatter\""));
        assert_non_null(strstr(e, "\"status\":\"COLLD_OK\""));
        const char *path = gather && want_fast ? "\"path\":\"fast\"" : "\"path\":\"engine\"";
        if (!strstr(e, path))
            print_message("entry %d: %s (wanted %s)\n", seq, e, path);
        assert_non_null(strstr(e, path));
        fast_seen += gather && want_fast;
        /* Every rank's arrival is known (>= 0 us after the first), on either path. */
        const char *arr = strstr(e, "\"arrival_us\":[");
        assert_non_null(arr);
        arr += strlen("\"arrival_us\":[");
        for (int r = 0; r < n; r++) {
            char *next;
            long v = strtol(arr, &next, 10);
            assert_true(next != arr && v >= 0);
            arr = next + 1;
        }
    }
    print_message("%d of %d all-gathers were waited for and recorded on the fast path\n", fast_seen, iters);
    FILE *f = fopen(go, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(harness_wait_all(pids, n, RUN_LIMIT_MS), 0);
    assert_int_equal(harness_wait_clean(h, 5000), 0);
}

static void test_chain_2_ranks(void **state)
{
    run_chain(*state, 2, "3000", true); /* reduce-scatter 24000 B per rank, all-gather 12000 B */
}

static void test_chain_4_ranks(void **state)
{
    run_chain(*state, 4, "1500", true); /* reduce-scatter 24000 B per rank, all-gather 6000 B */
}

static int setup_no_fast_path(void **state)
{
    static const char *const extra[] = { "--fast-path-bytes", "0", NULL };
    return harness_test_setup_args(state, extra);
}

static void test_chain_engine_only(void **state)
{
    run_chain(*state, 2, "3000", false);
}

/* Rank 0 posts a small all-reduce (fast area), rank 1 a large one (engine): both fail with
 * MISMATCH at once, and the detail names both calls. */
static void test_mismatch_fast_against_engine(void **state)
{
    harness_t *h = *state;
    char hex[HARNESS_UID_HEX_LEN], out[2][320], text[1024];
    assert_int_equal(harness_new_uid_hex(h, hex), 0);
    const char *calls[2] = { "allreduce:float32:sum:16:0", "allreduce:float32:sum:100000:0" };
    pid_t pids[2];
    double t0 = harness_now_ms();
    for (int r = 0; r < 2; r++) {
        snprintf(out[r], sizeof(out[r]), "%s/mismatch-%d", h->dir, r);
        const char *argv[] = { COLL_BIN, "--socket", h->socket, "--uid", hex, "--nranks", "2", "--rank", r ? "1" : "0",
                               "--mode", "call", "--call", calls[r], "--expect", "COLLD_ERR_MISMATCH", "--out", out[r],
                               NULL };
        pids[r] = harness_spawn(argv);
        assert_true(pids[r] > 0);
    }
    assert_int_equal(harness_wait_all(pids, 2, 60000), 0);
    print_message("both ranks got MISMATCH within %.0f ms\n", harness_now_ms() - t0);
    for (int r = 0; r < 2; r++) {
        harness_read_file(out[r], text, sizeof(text));
        print_message("%s", text);
        assert_non_null(strstr(text, "rank 0: allreduce(float32, sum, count 16, root 0)"));
        assert_non_null(strstr(text, "rank 1: allreduce(float32, sum, count 100000, root 0)"));
    }
    assert_int_equal(harness_wait_clean(h, 5000), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_chain_2_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_chain_4_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_chain_engine_only, setup_no_fast_path, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_fast_against_engine, harness_test_setup, harness_test_teardown),
    };
    return cmocka_run_group_tests_name("fastpath", tests, NULL, NULL);
}
