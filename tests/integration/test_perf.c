/*
 * test_perf.c - colld-perf against a real colld daemon: every collective checked element by
 * element (-c 1) with no wrong element and the nccl-tests footer; every dtype x op on 3 ranks;
 * --json with the expected number of rows; a daemon of its own when none answers (and stopped
 * afterwards); --attach-bench; bad options exit 2 with a message.
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

#ifndef PERF_BIN
#error "PERF_BIN must name the colld-perf binary"
#endif

#define RUN_LIMIT_MS 120000 /* per colld-perf run; generous for sanitizer builds */
#define OUT_BYTES (1u << 20)



/* Count the table's data rows (lines not starting with '#' that have 13 fields) and how many of
 * them have a #wrong other than 0 in either mode. */
static void count_rows(const char *out, int *rows, int *bad)
{
    *rows = *bad = 0;
    const char *line = out;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[512];
        if (len < sizeof(buf) && len > 0 && line[0] != '#') {
            memcpy(buf, line, len);
            buf[len] = '\0';
            char *f[16], *save = NULL;
            int nf = 0;
            for (char *t = strtok_r(buf, " \t", &save); t && nf < 16; t = strtok_r(NULL, " \t", &save))
                f[nf++] = t;
            if (nf == 13) {
                (*rows)++;
                if (strcmp(f[8], "0") != 0 || strcmp(f[12], "0") != 0) {
                    (*bad)++;
                    print_message("row with wrong elements: %.*s\n", (int)len, line);
                }
            }
        }
        if (!end)
            break;
        line = end + 1;
    }
}

/* Occurrences of needle in haystack. */
static int occurrences(const char *haystack, const char *needle)
{
    int n = 0;
    for (const char *p = haystack; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* 5 collectives x sizes 8, 64, 512, 4 Ki, 32 Ki, 256 Ki: every row checked, nothing wrong. */
#define SWEEP "-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-w", "1", "-c", "1"
#define SWEEP_ROWS (5 * 6)

static void test_every_collective_checked(void **state)
{
    harness_t *h = *state;
    char *out = malloc(OUT_BYTES);
    assert_non_null(out);
    const char *argv[] = { PERF_BIN, "--socket", h->socket, "-p", "2", "-t", "all", SWEEP, NULL };
    int rc = harness_capture_all(argv, out, OUT_BYTES, RUN_LIMIT_MS);
    if (rc != 0)
        print_message("%s", out);
    assert_int_equal(rc, 0);
    int rows, bad;
    count_rows(out, &rows, &bad);
    assert_int_equal(rows, SWEEP_ROWS);
    assert_int_equal(bad, 0);
    for (int k = 0; k < 5; k++) {
        static const char *const names[] = { "allreduce", "broadcast", "reduce", "allgather", "reducescatter" };
        char head[64];
        snprintf(head, sizeof(head), "# Collective test: %s\n", names[k]);
        assert_non_null(strstr(out, head));
    }
    assert_non_null(strstr(out, "# Out of bounds values : 0 OK\n"));
    assert_non_null(strstr(out, "# Avg bus bandwidth    : "));
    free(out);
}

/* Every dtype x op (and root 2) on 3 ranks at small sizes: (3 reductions x 10 x 5 + 2 x 10) x 4. */
static void test_every_dtype_and_op(void **state)
{
    harness_t *h = *state;
    char *out = malloc(OUT_BYTES);
    assert_non_null(out);
    const char *argv[] = { PERF_BIN, "--socket", h->socket, "-p", "3", "-r", "2", "-t", "all", "-d", "all", "-o", "all",
                           "-b", "8", "-e", "4K", "-f", "8", "-n", "1", "-w", "0", "-c", "1", NULL };
    int rc = harness_capture_all(argv, out, OUT_BYTES, RUN_LIMIT_MS);
    if (rc != 0)
        print_message("%s", out);
    assert_int_equal(rc, 0);
    int rows, bad;
    count_rows(out, &rows, &bad);
    assert_int_equal(rows, (3 * 10 * 5 + 2 * 10) * 4);
    assert_int_equal(bad, 0);
    assert_non_null(strstr(out, "# Out of bounds values : 0 OK\n"));
    free(out);
}

/* --json: one object, as many rows as the table, every wrong count 0. */
static void test_json(void **state)
{
    harness_t *h = *state;
    char *out = malloc(OUT_BYTES);
    assert_non_null(out);
    const char *argv[] = { PERF_BIN, "--socket", h->socket, "-p", "2", "-t", "all", SWEEP, "--json", NULL };
    assert_int_equal(harness_capture(argv, out, OUT_BYTES, RUN_LIMIT_MS), 0);
    size_t len = strlen(out);
    while (len && (out[len - 1] == '\n' || out[len - 1] == ' '))
        out[--len] = '\0';
    assert_true(len > 2 && out[0] == '{' && out[len - 1] == '}');
    assert_int_equal(occurrences(out, "{"), occurrences(out, "}"));
    assert_int_equal(occurrences(out, "[") , occurrences(out, "]"));
    assert_int_equal(occurrences(out, "\"collective\":"), SWEEP_ROWS);
    assert_int_equal(occurrences(out, "\"wrong\":0}"), 2 * SWEEP_ROWS);
    assert_non_null(strstr(out, "\"out_of_bounds\":0,"));
    assert_non_null(strstr(out, "\"avg_busbw_gbs\":"));
    assert_null(strstr(out, "# ")); /* no table text mixed in */
    free(out);
}

/* --nan-check (issue 30): the communicator asks for the checks (its inputs finite, so they pass),
 * every result exact, the header and the JSON say so. docs/performance.md runs it with and
 * without on a GPU to measure what the checks cost. */
static void test_nan_check(void **state)
{
    harness_t *h = *state;
    char *out = malloc(OUT_BYTES);
    assert_non_null(out);
    const char *argv[] = { PERF_BIN, "--socket", h->socket, "-p", "2", "-b", "8", "-e", "1M", "-f", "32", "-n", "2",
                           "-w", "1", "--nan-check", NULL };
    int rc = harness_capture_all(argv, out, OUT_BYTES, RUN_LIMIT_MS);
    if (rc != 0)
        print_message("%s", out);
    assert_int_equal(rc, 0);
    int rows, bad;
    count_rows(out, &rows, &bad);
    assert_int_equal(rows, 4); /* 8, 256, 8 Ki, 256 Ki */
    assert_int_equal(bad, 0);
    assert_non_null(strstr(out, "# --nan-check: the communicator's reductions check every input"));
    const char *json[] = { PERF_BIN, "--socket", h->socket, "-p", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0",
                           "--nan-check", "--json", NULL };
    assert_int_equal(harness_capture(json, out, OUT_BYTES, RUN_LIMIT_MS), 0);
    assert_non_null(strstr(out, "\"nan_check\":true,"));
    free(out);
}

/* No daemon on the socket: colld-perf starts its own, runs, and stops it again. */
static void test_starts_own_daemon(void **state)
{
    harness_t *h = *state;
    char missing[400], *out = malloc(OUT_BYTES);
    assert_non_null(out);
    snprintf(missing, sizeof(missing), "%s/nobody-here.sock", h->dir);
    const char *argv[] = { PERF_BIN, "--socket", missing, "-p", "2", "-b", "8", "-e", "64K", "-f", "8",
                           "-n", "2", "-w", "1", NULL };
    int rc = harness_capture_all(argv, out, OUT_BYTES, RUN_LIMIT_MS);
    if (rc != 0)
        print_message("%s", out);
    assert_int_equal(rc, 0);
    const char *started = strstr(out, "colld-perf: started ");
    assert_non_null(started);
    const char *pidp = strstr(started, "(pid ");
    assert_non_null(pidp);
    pid_t pid = (pid_t)atoi(pidp + 5);
    assert_true(pid > 0);
    assert_true(kill(pid, 0) != 0); /* stopped (and reaped) by colld-perf */
    assert_non_null(strstr(out, "# Out of bounds values : 0 OK\n"));
    assert_true(access(missing, F_OK) != 0); /* it used a private socket, not ours */
    free(out);
}

/* --attach-bench on 2 ranks prints its table and the p50 line. */
static void test_attach_bench(void **state)
{
    harness_t *h = *state;
    char out[16384];
    const char *argv[] = { PERF_BIN, "--socket", h->socket, "-p", "2", "--attach-bench", "3", NULL };
    assert_int_equal(harness_capture(argv, out, sizeof(out), RUN_LIMIT_MS), 0);
    assert_non_null(strstr(out, "# attach+join p50: "));
}

/* Bad options: exit status 2 and a message naming the problem. */
static void test_bad_options(void **state)
{
    harness_t *h = *state;
    struct {
        const char *args[6];
        const char *says;
    } cases[] = {
        { { "--bogus", NULL }, "unknown option '--bogus'" },
        { { "-d", "float128", NULL }, "-d: unknown value 'float128'" },
        { { "-o", "median", NULL }, "-o: unknown value 'median'" },
        { { "-t", "alltoall", NULL }, "-t: unknown value 'alltoall'" },
        { { "-b", "1M", "-e", "1K", NULL }, "is larger than -e" },
        { { "-b", "lots", NULL }, "-b: 'lots' is not a size" },
        { { "-p", "0", NULL }, "-p: '0' is not an integer in 1..64" },
        { { "-p", "2", "-r", "2", NULL }, "the root must be below" },
        { { "-f", "1", NULL }, "-f: '1' is not a step factor" },
        { { "-n", NULL }, "option '-n' needs a value" },
        { { "stray", NULL }, "unexpected argument 'stray'" },
        { { "--overlap", NULL }, "--overlap measures a GPU collective beside a GPU kernel: it needs -G/--gpu" },
        { { "--host-ahead", NULL }, "--host-ahead times GPU collectives queued behind a GPU kernel" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *argv[12] = { PERF_BIN, "--socket", h->socket };
        int n = 3;
        for (int j = 0; cases[i].args[j]; j++)
            argv[n++] = cases[i].args[j];
        argv[n] = NULL;
        char out[4096];
        int rc = harness_capture_all(argv, out, sizeof(out), RUN_LIMIT_MS);
        if (rc != 2 || !strstr(out, cases[i].says))
            print_message("case %zu: exit %d, output:\n%s\n(expected exit 2 and '%s')\n", i, rc, out, cases[i].says);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(out, cases[i].says));
        assert_non_null(strstr(out, "colld-perf --help"));
    }
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_collective_checked, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_every_dtype_and_op, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_json, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_nan_check, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_starts_own_daemon, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_attach_bench, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_bad_options, harness_test_setup, harness_test_teardown),
    };
    return cmocka_run_group_tests_name("perf", tests, NULL, NULL);
}
