/*
 * test_gpu_collectives.c - the collectives on GPU buffers, stream-ordered, through a real colld
 * daemon with real rank processes (colld-test-gpu-rank, see gpu_rank.c), every result compared
 * bitwise with the scalar CPU oracle. The CUDA driver API only (gpu_cu.h), so the same program runs
 * on a real GPU (ctest label hardware; exits 77, skipped, before starting anything when no driver
 * or no GPU is found) and on the CUDA driver test double (label gpu, cudafake).
 *
 *   test_gpu_collectives [matrix|stream|fault|deadlock|all] [--gpus N] [--cudafake]
 *
 *  --gpus N    rank r on GPU r % N (default 1: every rank on GPU 0); N GPUs must be visible.
 *  --cudafake  the libcuda.so.1 found must be the CUDA driver test double (checked before any CUDA
 *              call, here, in every rank, and the daemon must map no other libcuda), and the runs
 *              are sized for CI: the >= 4 MiB counts not on 8 ranks, in `make test` only a subset
 *              (big_arg; all of them with COLLD_TEST_FULL=1, `make test-full`, none with
 *              COLLD_TEST_NO_BIG=1, as `make test-tsan` sets), the stream test's spin 1 s (the host
 *              call limit is a quarter of the spin, gpu_rank.c).
 *
 *  matrix  every collective x dtype x op (the premultiplied sum included, each rank with its own
 *          scalar), counts {0, 1, 1001, >= 4 MiB (odd)}, in and out of place,
 *          for 2, 4 and 8 rank processes with cuMemAlloc'd buffers (the >= 4 MiB count:
 *          every combination on 2 ranks, gpu_rank.c's big_selected() subset on 4 and 8); with
 *          colld_mem_alloc(COLLD_MEM_CUDA) buffers, and with both kinds mixed in one communicator;
 *          two 4-rank communicators at once; buffers freed and allocated again (same addresses).
 *          On the double, 8 ranks run without the >= 4 MiB counts.
 *  stream  producer kernel -> colld_allreduce -> consumer kernel on each rank's stream with no host
 *          synchronisation in between; the host call returns while a 200 ms producer still runs.
 *          Non-blocking streams, blocking (legacy-synchronising) streams, 4 ranks with
 *          colld_mem_alloc buffers.
 *  fault   3 ranks post an all-reduce; one is killed with SIGKILL, without having posted, or with
 *          its stream waiting behind a long kernel. The survivors' streams are released within the
 *          communicator timeout + a few seconds with COLLD_ERR_PEER_LOST (or COLLD_ERR_TIMEOUT), they
 *          form a new communicator that computes exactly, a GPU and a host communicator running
 *          beside them keep working, a fresh pair of ranks afterwards is exact, and the daemon is
 *          left with nothing of the broken communicator.
 *  deadlock  2 ranks run two communicators' all-reduces on their streams in crossed orders (a
 *          daemon with --deadlock-ms 500 --deadlock-fail): both communicators fail with
 *          COLLD_ERR_DEADLOCK naming the cycle, every stream is released within half the 60 s
 *          timeout, and collctl doctor names the deadlock (issue 18).
 */
#include "tests/gpu/gpu_cu.h"
#include "tests/gpu/gpu_driver.h"
#include "tests/integration/harness.h"
#include "tests/integration/harness_double.h"

#include <dirent.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define MAX_PROCS 8
#define RUN_LIMIT_MS 600000     /* per group of rank processes */
#define FAULT_TIMEOUT_MS 3000   /* the communicator timeout of the fault test */
#define RELEASE_LIMIT_MS (FAULT_TIMEOUT_MS + 3000) /* kill -> survivors' streams released */
#define DOUBLE_SPIN_MS "1000"   /* the stream test's slow producer on the double */
/* The daemon's engine thread's voluntary context switches during test_stream_semantics_2_ranks: a
 * few per collective (posts, readiness, completion) and one per 250 ms of its fallback look, so the
 * bound grows with the run's length (a loaded machine, a sanitizer build stretch it: 325 in a 33 s
 * TSan run beside other builds): ENGINE_SWITCH_BASE plus ENGINE_SWITCHES_PER_S a second (a quiet
 * plain-build run: 46 in 1.8 s). Polling the GPUs every millisecond made it sleep up to 1,000
 * times a second (282 times in the plain-build run that found it). */
#define ENGINE_SWITCH_BASE     100
#define ENGINE_SWITCHES_PER_S  10

/* The run's settings (main): every rank gets common_args; see the file comment. */
static gpu_driver_t drv;     /* the run's settings (main): every rank gets drv.common_args */
static harness_size_t size; /* the big counts' share (big_arg) */

/* Spawn `nranks` colld-test-gpu-rank processes joining one new communicator; extra arguments
 * (NULL-terminated) go to every rank. Pids in pids[]. Returns 0 or -1. */
static int spawn_gpu(harness_t *h, int nranks, const char *const *extra, pid_t *pids)
{
    char hex[HARNESS_UID_HEX_LEN], nr[16], rk[16];
    if (harness_new_uid_hex(h, hex) < 0)
        return -1;
    snprintf(nr, sizeof(nr), "%d", nranks);
    for (int r = 0; r < nranks; r++) {
        const char *argv[48] = { GPU_RANK_BIN, "--socket", h->socket, "--uid", hex, "--nranks", nr, "--rank", rk };
        gpu_driver_add_args(&drv, argv, 9, extra);
        snprintf(rk, sizeof(rk), "%d", r); /* posix_spawn copies argv before rk is reused */
        pids[r] = harness_spawn(argv);
        if (pids[r] < 0)
            return -1;
    }
    return 0;
}

/* Run one communicator of GPU ranks to the end; every rank must exit 0. */
static void run_gpu(harness_t *h, int nranks, const char *const *extra)
{
    pid_t pids[MAX_PROCS];
    double t0 = harness_now_ms();
    assert_int_equal(spawn_gpu(h, nranks, extra, pids), 0);
    assert_int_equal(harness_wait_all(pids, nranks, RUN_LIMIT_MS), 0);
    print_message("%d GPU rank(s): %.0f ms\n", nranks, harness_now_ms() - t0);
    assert_true(gpu_driver_daemon_ok(&drv, h->pid));
}

/* ---------------------------------------------------------------------------------------------
 * The matrix
 * ------------------------------------------------------------------------------------------- */

/* The big count's option for a run: `full` on hardware and in `make test-full` on the double,
 * `ci` in `make test` on the double, float32 once per kind under ASan, none with
 * COLLD_TEST_NO_BIG there (harness_test_size). */
static const char *big_arg(const char *full, const char *ci)
{
    switch (size) {
    case HARNESS_SIZE_NO_BIG:
        return "--no-big";
    case HARNESS_SIZE_SMALL:
        return "--big-min";
    case HARNESS_SIZE_CI:
        return ci;
    default:
        return full;
    }
}

/* Every combination at the big count on 2 ranks (on the double in `make test`: the subset). */
static void test_matrix_2_ranks(void **state)
{
    const char *extra[] = { big_arg("--big-all", NULL), NULL };
    run_gpu(*state, 2, extra);
}

/* The big count's subset (gpu_rank.c; on the double in `make test`: float32 once per kind). */
static void test_matrix_4_ranks(void **state)
{
    const char *extra[] = { big_arg(NULL, "--big-min"), NULL };
    run_gpu(*state, 4, extra);
}

/* On the double without the big count: its subset on 8 ranks, whose daemon-side kernels run there
 * one emulated GPU thread after another on the host, takes a minute in the plain build and several
 * under ASan, and adds no path that 2 and 4 ranks do not take. */
static void test_matrix_8_ranks(void **state)
{
    const char *extra[] = { drv.cudafake ? "--no-big" : NULL, NULL };
    run_gpu(*state, 8, extra);
}

/* Buffers from colld_mem_alloc(COLLD_MEM_CUDA). */
static void test_matrix_colld_mem_alloc(void **state)
{
    const char *extra[] = { "--alloc", "colld", big_arg(NULL, "--big-min"), NULL };
    run_gpu(*state, 2, extra);
}

/* cuMemAlloc'd and colld_mem_alloc'd buffers in one communicator (even / odd ranks), odd size. */
static void test_matrix_mixed_alloc_3_ranks(void **state)
{
    const char *extra[] = { "--alloc", "mixed", "--no-big", NULL };
    run_gpu(*state, 3, extra);
}

/* Two communicators of 4 ranks on the one GPU at once, each starting with another collective. */
static void test_two_comms_concurrently(void **state)
{
    harness_t *h = *state;
    pid_t pids[2][4];
    double t0 = harness_now_ms();
    for (int c = 0; c < 2; c++) {
        const char *extra[] = { "--no-big", "--salt", c ? "201" : "200", "--rotate", c ? "2" : "0", NULL };
        assert_int_equal(spawn_gpu(h, 4, extra, pids[c]), 0);
    }
    int bad = harness_wait_all(pids[0], 4, RUN_LIMIT_MS) + harness_wait_all(pids[1], 4, RUN_LIMIT_MS);
    print_message("2 communicators x 4 GPU ranks: %.0f ms\n", harness_now_ms() - t0);
    assert_int_equal(bad, 0);
    assert_true(gpu_driver_daemon_ok(&drv, h->pid));
}

/* cuMemFree and cuMemAlloc again between all-reduces: the same addresses come back. */
static void test_realloc_same_addresses(void **state)
{
    const char *extra[] = { "--mode", "realloc", "--iters", "6", NULL };
    run_gpu(*state, 2, extra);
}

/* ---------------------------------------------------------------------------------------------
 * Stream semantics
 * ------------------------------------------------------------------------------------------- */

/* The thread of process pid named `name` (pthread_setname_np), or -1. */
static int thread_named(pid_t pid, const char *name)
{
    char path[320];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    int tid = -1;
    for (struct dirent *e; dir && tid < 0 && (e = readdir(dir));) {
        char comm[32] = "";
        snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, e->d_name);
        harness_read_file(path, comm, sizeof(comm));
        comm[strcspn(comm, "\n")] = '\0';
        if (strcmp(comm, name) == 0)
            tid = atoi(e->d_name);
    }
    if (dir)
        closedir(dir);
    return tid;
}

/* How many times the daemon's engine thread (colld-engine) gave up its CPU: its voluntary context
 * switches (/proc: a sleep, a wait; not a preemption, which depends on the machine's load). -1
 * when it is not found. */
static long engine_switches(pid_t pid)
{
    char path[128], line[256];
    int tid = thread_named(pid, "colld-engine");
    if (tid < 0)
        return -1;
    snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid, tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long n = 0, v;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1)
            n += v;
    fclose(f);
    return n;
}

/* On the double the slow producer spins DOUBLE_SPIN_MS (gpu_rank.c: the host call's limit is a
 * quarter of it), on a GPU the rank's default (200 ms, limit 50 ms). Meanwhile the collectives
 * wait for the ranks' streams: the daemon's engine must sleep until the GPU watcher wakes it
 * (issue 15 F5), not poll every millisecond (which took it off its CPU 1 000 times a second). */
static void test_stream_semantics_2_ranks(void **state)
{
    harness_t *h = *state;
    const char *extra[] = { "--mode", "stream", drv.cudafake ? "--spin-ms" : NULL, DOUBLE_SPIN_MS, NULL };
    long before = engine_switches(h->pid);
    double t0 = harness_now_ms();
    run_gpu(h, 2, extra);
    long after = engine_switches(h->pid);
    double ms = harness_now_ms() - t0;
    print_message("the daemon's engine thread gave up its CPU %ld times in %.0f ms\n", after - before, ms);
    assert_true(before >= 0 && after >= 0);
    assert_true(after - before < ENGINE_SWITCH_BASE + (long)(ms / 1000.0 * ENGINE_SWITCHES_PER_S));
}

/* Streams created without CU_STREAM_NON_BLOCKING synchronise with the legacy default stream: the
 * library must not use that stream on the application's behalf while the application's waits. */
static void test_stream_semantics_blocking_streams(void **state)
{
    const char *extra[] = { "--mode", "stream", "--blocking-stream", drv.cudafake ? "--spin-ms" : NULL,
                            DOUBLE_SPIN_MS, NULL };
    run_gpu(*state, 2, extra);
}

static void test_stream_semantics_4_ranks_colld_mem_alloc(void **state)
{
    const char *extra[] = { "--mode", "stream", "--alloc", "colld", drv.cudafake ? "--spin-ms" : NULL,
                            DOUBLE_SPIN_MS, NULL };
    run_gpu(*state, 4, extra);
}

/* ---------------------------------------------------------------------------------------------
 * Faults
 * ------------------------------------------------------------------------------------------- */

/* A 2-rank GPU communicator running exact all-reduces in a loop (gpu_rank --mode loop), with the
 * harness's background bookkeeping (progress and stop files). */
static int gpu_bg_start(harness_t *h, harness_bg_t *bg)
{
    snprintf(bg->stop, sizeof(bg->stop), "%s/gpu-bg-stop", h->dir);
    snprintf(bg->progress, sizeof(bg->progress), "%s/gpu-bg-progress", h->dir);
    const char *extra[] = { "--mode", "loop", "--stop-file", bg->stop, "--progress-file", bg->progress, NULL };
    if (spawn_gpu(h, 2, extra, bg->pids) < 0)
        return -1;
    return harness_bg_wait_progress(bg, 0, 60000) > 0 ? 0 : -1;
}

/* The survivor's line in <dir>/released-R: the monotonic time (ms) its stream was released and
 * the async error it got. Returns 0 or -1. */
static int read_release(harness_t *h, int rank, double *at, char *status, size_t len)
{
    char path[400], text[256], name[64] = "";
    snprintf(path, sizeof(path), "%s/released-%d", h->dir, rank);
    harness_read_file(path, text, sizeof(text));
    if (sscanf(text, "%lf %63s", at, name) != 2)
        return -1;
    snprintf(status, len, "%s", name);
    return 0;
}

/* The path the daemon's GPU collectives took, as its environment asked (COLLD_GPU_EARLY_LAUNCH,
 * which the daemon inherits): it logs its first hand-off without the host per communicator. */
static void assert_handoff_path(harness_t *h)
{
    static char log[1 << 16];
    harness_read_file(h->log, log, sizeof(log));
    const char *early = getenv("COLLD_GPU_EARLY_LAUNCH");
    bool asked = early && strcmp(early, "true") == 0;
    bool said = strstr(log, "wait for the ranks' streams on the GPU") != NULL;
    print_message("the daemon took the %s hand-off\n", said ? "GPU's (without the host)" : "host's");
    assert_true(said == asked);
}

/* Three ranks post an all-reduce; the last one is killed (-9) before posting (victim_posts false)
 * or while every stream waits on it (true). See the file comment for what must follow. */
static void run_fault(harness_t *h, bool victim_posts)
{
    char uid[HARNESS_UID_HEX_LEN], uid2[HARNESS_UID_HEX_LEN], nr[] = "3", rk[3][4], timeout[16], path[400];
    harness_bg_t host_bg, gpu_bg;
    pid_t pids[3];
    snprintf(timeout, sizeof(timeout), "%d", FAULT_TIMEOUT_MS);
    assert_int_equal(harness_bg_start(h, &host_bg), 0);
    assert_int_equal(gpu_bg_start(h, &gpu_bg), 0);
    assert_int_equal(harness_new_uid_hex(h, uid), 0);
    assert_int_equal(harness_new_uid_hex(h, uid2), 0);
    for (int r = 0; r < 3; r++) {
        snprintf(rk[r], sizeof(rk[r]), "%d", r);
        const char *argv[48] = { GPU_RANK_BIN, "--socket", h->socket, "--uid", uid, "--nranks", nr, "--rank", rk[r] };
        const char *extra[] = { "--mode", "fault", "--uid2", uid2, "--victim", "2", "--sync-dir", h->dir,
                                "--timeout-ms", timeout, victim_posts ? "--victim-posts" : NULL, NULL };
        gpu_driver_add_args(&drv, argv, 9, extra);
        assert_true((pids[r] = harness_spawn(argv)) > 0);
    }
    const char *marks[] = { "posted-0", "posted-1", "victim-ready" };
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", h->dir, marks[i]);
        if (harness_wait_file(path, 120000) < 0) {
            for (int r = 0; r < 3; r++)
                kill(pids[r], SIGKILL);
            harness_wait_all(pids, 3, 10000);
            fail_msg("no %s within 120 s", marks[i]);
        }
    }
    usleep(300 * 1000); /* the survivors' streams are waiting now */
    long host_before = harness_bg_progress(&host_bg), gpu_before = harness_bg_progress(&gpu_bg);
    double killed = harness_now_ms();
    assert_int_equal(kill(pids[2], SIGKILL), 0);
    assert_int_equal(harness_wait(pids[2], 10000), 128 + SIGKILL);
    int bad = harness_wait_all(pids, 2, FAULT_TIMEOUT_MS + 120000);
    for (int r = 0; r < 2; r++) {
        double at = 0;
        char status[64] = "";
        if (read_release(h, r, &at, status, sizeof(status)) < 0) {
            print_message("survivor %d wrote no release record\n", r);
            bad++;
            continue;
        }
        print_message("survivor %d: stream released %.1f ms after the kill with %s (%s)\n", r, at - killed, status,
                      strcmp(status, "COLLD_ERR_PEER_LOST") == 0 ? "the daemon saw the process die"
                                                                : "the daemon's timer: the kill came before the post");
        if (at - killed > RELEASE_LIMIT_MS) {
            print_message("survivor %d: released later than %d ms after the kill\n", r, RELEASE_LIMIT_MS);
            bad++;
        }
    }
    assert_int_equal(bad, 0);

    /* The communicators beside it kept working, and stop cleanly. */
    long host_after = harness_bg_wait_progress(&host_bg, host_before, 20000);
    long gpu_after = harness_bg_wait_progress(&gpu_bg, gpu_before, 20000);
    print_message("background communicators: host %ld -> %ld, GPU %ld -> %ld all-reduces\n", host_before, host_after,
                  gpu_before, gpu_after);
    assert_true(host_after > host_before);
    assert_true(gpu_after > gpu_before);
    assert_int_equal(harness_bg_stop(&host_bg), 0);
    assert_int_equal(harness_bg_stop(&gpu_bg), 0);

    /* A fresh pair of ranks on the same daemon, and nothing left behind. */
    const char *extra[] = { "--no-big", "--kinds", "allreduce,allgather", "--dtypes", "float32,int32,bfloat16", NULL };
    run_gpu(h, 2, extra);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
    assert_true(gpu_driver_daemon_ok(&drv, h->pid));
    if (drv.gpus == 1) /* over two GPUs every collective takes the host's hand-off */
        assert_handoff_path(h);
}

static void test_fault_kill_before_post(void **state) { run_fault(*state, false); }
static void test_fault_kill_while_streams_wait(void **state) { run_fault(*state, true); }

/* ---------------------------------------------------------------------------------------------
 * Faults of the hand-off without the host (issue 28 item 1)
 * ------------------------------------------------------------------------------------------- */

/* 2 rank processes (gpu_rank --mode hofault --case <c>) on a daemon whose collectives start from
 * its host thread (the default) or, with COLLD_GPU_EARLY_LAUNCH=true in the environment (ctest's
 * gpu_collectives_hofault), wait for the ranks' streams on the GPU: a stream that never gets there
 * within the 2 s timeout, an abort, a mismatch. Each rank checks its status, its release and that
 * its output stayed untouched; the daemon is left clean. On the double: the stream waits poll on
 * host threads, on the host's memory model, not the GPU's. */
static void run_hofault(harness_t *h, const char *fcase)
{
    const char *extra[] = { "--mode", "hofault", "--case", fcase, "--timeout-ms", "2000", NULL };
    run_gpu(h, 2, extra);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
    assert_true(gpu_driver_daemon_ok(&drv, h->pid));
    assert_handoff_path(h); /* the warm-up all-reduces took it (a mismatch is refused before any) */
}

static void test_handoff_timeout_host_memory_model(void **state)
{
    run_hofault(*state, "timeout");
}
static void test_handoff_abort_host_memory_model(void **state)
{
    run_hofault(*state, "abort");
}
static void test_handoff_mismatch_host_memory_model(void **state)
{
    run_hofault(*state, "mismatch");
}

/* ---------------------------------------------------------------------------------------------
 * Deadlock of GPU streams (issue 18)
 * ------------------------------------------------------------------------------------------- */

/* Two ranks run two communicators' all-reduces on their streams in crossed orders (gpu_rank.c
 * --mode crossed): the daemon must fail both with COLLD_ERR_DEADLOCK naming the cycle and release
 * every stream long before the communicators' 60 s timeout (each rank checks that), and
 * collctl doctor must name the deadlock (as history once the ranks are gone: exit 0). */
static void test_deadlock_crossed_streams(void **state)
{
    harness_t *h = *state;
    char a[HARNESS_UID_HEX_LEN], b[HARNESS_UID_HEX_LEN], rk[2][4], out[8192];
    pid_t pids[2];
    assert_int_equal(harness_new_uid_hex(h, a), 0);
    assert_int_equal(harness_new_uid_hex(h, b), 0);
    for (int r = 0; r < 2; r++) {
        snprintf(rk[r], sizeof(rk[r]), "%d", r);
        const char *argv[48] = { GPU_RANK_BIN, "--socket", h->socket, "--uid", a,        "--uid2",  b,
                                 "--nranks",   "2",        "--rank",  rk[r],   "--mode", "crossed", "--timeout-ms",
                                 "60000" };
        gpu_driver_add_args(&drv, argv, 15, NULL);
        pids[r] = harness_spawn(argv);
        assert_true(pids[r] > 0);
    }
    assert_int_equal(harness_wait_all(pids, 2, RUN_LIMIT_MS), 0);
    const char *doctor[] = { COLLCTL_BIN, "--socket", h->socket, "doctor", NULL };
    int rc = harness_capture(doctor, out, sizeof(out), 20000);
    print_message("collctl doctor (exit %d):\n%s", rc, out);
    assert_int_equal(rc, 0); /* the ranks are gone: the deadlock is history, a warning */
    assert_non_null(strstr(out, "warning deadlock"));
    assert_non_null(strstr(out, "(gone now)"));
    assert_non_null(strstr(out, "deadlock across communicators: rank "));
    assert_non_null(strstr(out, "'crossed-b'"));
    assert_true(gpu_driver_daemon_ok(&drv, h->pid));
}

static int setup_deadlock(void **state)
{
    static const char *const extra[] = { "--deadlock-ms", "500", "--deadlock-fail", NULL };
    return harness_test_setup_args(state, extra);
}

/* ---------------------------------------------------------------------------------------------
 * Main
 * ------------------------------------------------------------------------------------------- */

/* Every test gets its own daemon (harness_test_setup/teardown). */
int main(int argc, char **argv)
{
    static const char *const groups[] = { "matrix", "stream", "fault", "deadlock", "hofault", NULL };
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = gpu_driver_start(&drv, argc, argv, groups);
    if (rc >= 0)
        return rc;
    /* The ranks: the same GPUs, the same driver check; the big counts off where asked (TSan). */
    size = drv.cudafake ? harness_test_size() : HARNESS_SIZE_FULL;
    if (size == HARNESS_SIZE_NO_BIG) {       /* TSan: three dtypes (an integer, a half, a double), */
        drv.common_args[drv.ncommon++] = "--dtypes"; /* the races do not depend on the type: a */
        drv.common_args[drv.ncommon++] = "int32,bfloat16,float64"; /* quarter of the time */
    }
    const struct CMUnitTest matrix[] = {
        cmocka_unit_test_setup_teardown(test_matrix_2_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_matrix_4_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_matrix_8_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_matrix_colld_mem_alloc, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_matrix_mixed_alloc_3_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_two_comms_concurrently, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_realloc_same_addresses, harness_test_setup, harness_test_teardown),
    };
    const struct CMUnitTest stream[] = {
        cmocka_unit_test_setup_teardown(test_stream_semantics_2_ranks, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_stream_semantics_blocking_streams, harness_test_setup,
                                        harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_stream_semantics_4_ranks_colld_mem_alloc, harness_test_setup,
                                        harness_test_teardown),
    };
    const struct CMUnitTest fault[] = {
        cmocka_unit_test_setup_teardown(test_fault_kill_before_post, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_fault_kill_while_streams_wait, harness_test_setup, harness_test_teardown),
    };
    const struct CMUnitTest deadlock[] = {
        cmocka_unit_test_setup_teardown(test_deadlock_crossed_streams, setup_deadlock, harness_test_teardown),
    };
    const struct CMUnitTest hofault[] = {
        cmocka_unit_test_setup_teardown(test_handoff_timeout_host_memory_model, harness_test_setup,
                                        harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_handoff_abort_host_memory_model, harness_test_setup,
                                        harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_handoff_mismatch_host_memory_model, harness_test_setup,
                                        harness_test_teardown),
    };
    gpu_driver_say(&drv);
    int failed = 0;
    if (gpu_driver_runs(&drv, "matrix"))
        failed += cmocka_run_group_tests_name("gpu_matrix", matrix, NULL, NULL);
    if (gpu_driver_runs(&drv, "stream"))
        failed += cmocka_run_group_tests_name("gpu_stream", stream, NULL, NULL);
    if (gpu_driver_runs(&drv, "fault"))
        failed += cmocka_run_group_tests_name("gpu_fault", fault, NULL, NULL);
    if (gpu_driver_runs(&drv, "deadlock"))
        failed += cmocka_run_group_tests_name("gpu_deadlock", deadlock, NULL, NULL);
    if (gpu_driver_runs(&drv, "hofault"))
        failed += cmocka_run_group_tests_name("gpu_hofault", hofault, NULL, NULL);
    return failed ? 1 : 0;
}
