/*
 * test_gpu_cudafake_graph.c - collectives captured into CUDA graphs (issue 15 item 3), through a
 * real daemon and real rank processes, all on the CUDA driver test double (tests/cudafake, a
 * libcuda.so.1 for tests only: ctest runs this through colld_test_with_cudafake).
 *
 * The driver (cmocka, argv[1] = group) starts a daemon for each case and spawns the ranks as
 * processes of this very program (argv[1] = "rank"), rank r on fake GPU r % 2; the ranks use the
 * driver API as an application does (colld's loader for the calls colld has, cuGetProcAddress for
 * the capture and graph calls), capture a collective into a graph on their stream, replay it, and
 * check every result exactly against what the inputs of that replay must give. A rank that sees
 * something wrong says what on stdout and exits 1; the driver and the ranks meet through files in
 * the case's directory (the driver kills ranks and the daemon, and reads the daemon's log).
 *
 * Groups:
 *   graph   capture all-reduce, broadcast, reduce-scatter and all-gather on 4 ranks (the first
 *           collective of each process is captured: its registration and flag area are made
 *           during the capture, which stays valid) and replay each 5 times with new inputs
 *           copied in before each replay; two executable graphs of one capture replayed in turn on
 *           two streams; eager collectives and replays mixed on one communicator; a replay that
 *           one rank never makes (COLLD_ERR_TIMEOUT naming it, the other's replay released); a
 *           rank killed between replays (the others released with COLLD_ERR_PEER_LOST); the
 *           daemon stopped while graphs hold its plans (it exits cleanly; the replays are then
 *           released by libcolld with COLLD_ERR_DAEMON_LOST); a plan
 *           limit (COLLD_ERR_QUOTA_EXCEEDED, the capture left valid), a graph destroyed (its plan
 *           leaves the daemon), a communicator destroyed while a graph holds a collective of it;
 *           a captured collective where a peer calls it eagerly (COLLD_ERR_MISMATCH at capture time)
 *           and a capture inside a group (COLLD_ERR_NOT_SUPPORTED).
 *   legacy  the replays again on GPUs without VMM (buffers registered as legacy IPC handles).
 *
 * What the double cannot show here: real graph scheduling (it runs a graph's nodes in capture
 * order on the launching stream's thread), the GPU memory model between the graph's memory
 * operations, the daemon's kernels and the host (every write is visible at once), and timing.
 *
 * On a real GPU (COLLD_TEST_HARDWARE=1, ctest gpu_hw_graph, label hardware): group graph on the
 * machine's own driver, every rank on GPU r % (GPUs visible), the double's checks off; the legacy
 * stream is not held during replays (only the double can stall it). Exit 77 without a driver.
 */
#include "common/cudadrv.h"
#include "tests/cudafake/cudafake.h"
#include "tests/integration/harness.h"
#include "tests/integration/harness_double.h"

#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define N 1027 /* elements per rank of every collective (an odd count) */
#define REPLAYS 5
#define COMM_TIMEOUT_MS 30000
/* The timeout of the case that waits for one: long enough for both ranks' first replays to arrive
 * together on a loaded machine (under TSan), short enough to wait for. */
#define SHORT_TIMEOUT_MS 10000
#define RANK_WAIT_MS 120000

/* ============================================================================================
 * Only ever the test double
 * ========================================================================================== */

static char double_path[4096];
/* On a real GPU (COLLD_TEST_HARDWARE=1): no double, so none of its checks or controls. */
static bool hardware;

/* Is the libcuda.so.1 that dlopen finds the CUDA driver test double (it alone exports
 * colld_cudafake_control)? Asked before any CUDA call: 1 yes, 0 no libcuda.so.1, -1 another one. */
static int driver_is_double(void)
{
    return harness_double_find(double_path, sizeof(double_path), hardware);
}

/* Does the daemon map no libcuda but the test double, and no NCCL? */
static bool daemon_on_double(pid_t pid)
{
    return harness_daemon_on_double(pid, double_path, true);
}

/* ============================================================================================
 * A rank process: the application side
 * ========================================================================================== */

static const colld_cu_t *cu;

/* What the application calls beyond colld's own table: capture, graphs, an asynchronous copy. */
static struct {
    PFN_cuStreamBeginCapture_v10010 begin;
    PFN_cuStreamEndCapture_v10000 end;
    PFN_cuGraphInstantiateWithFlags_v11040 instantiate;
    PFN_cuGraphLaunch_v10000 launch;
    PFN_cuGraphGetNodes_v10000 nodes;
    PFN_cuGraphDestroy_v10000 destroy;
    PFN_cuGraphExecDestroy_v10000 exec_destroy;
    PFN_cuMemcpyHtoDAsync_v3020 htod_async;
    colld_cudafake_control_fn control; /* the double's own control (cudafake.h) */
} app;

typedef struct {
    int rank, nranks;
    int dev; /* the fake GPU of the rank's context (its legacy stream is "L<dev>" to the double) */
    const char *dir;
    const char *scenario;
    colld_client_t *c;
    colld_comm_t *comm;
    CUstream s, s2;
} rk_t;

static rk_t *me;

static void rank_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void rank_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    colld_status_t e = COLLD_OK;
    if (me->comm)
        colld_comm_get_async_error(me->comm, &e); /* reaps what the daemon said */
    printf("rank %d [%s]: FAIL: ", me->rank, me->scenario);
    vprintf(fmt, ap);
    printf(" (async error %s, last error: %s)\n", colld_status_name(e),
           me->comm ? colld_comm_last_error(me->comm) : "-");
    va_end(ap);
    fflush(stdout);
    exit(1);
}

static const char *rname(CUresult r)
{
    const char *n = NULL;
    cu->cuGetErrorName(r, &n);
    return n ? n : "?";
}

#define CU_MUST(call)                                                                                                  \
    do {                                                                                                               \
        CUresult r_ = (call);                                                                                          \
        if (r_ != CUDA_SUCCESS)                                                                                        \
            rank_fail("%s: %s", #call, rname(r_));                                                                     \
    } while (0)

static bool app_load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    PFN_cuGetProcAddress_v12000 get = lib ? (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    const char *names[8] = { "cuStreamBeginCapture", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
                             "cuGraphLaunch",        "cuGraphGetNodes",    "cuGraphDestroy",
                             "cuGraphExecDestroy",   "cuMemcpyHtoDAsync" };
    const int versions[8] = { 10010, 10000, 11040, 10000, 10000, 10000, 10000, 3020 };
    void *f[8] = { NULL };
    bool ok = get != NULL;
    for (int i = 0; ok && i < 8; i++)
        ok = get(names[i], &f[i], versions[i], 0, NULL) == CUDA_SUCCESS && f[i];
    if (ok) {
        app.begin = (PFN_cuStreamBeginCapture_v10010)f[0];
        app.end = (PFN_cuStreamEndCapture_v10000)f[1];
        app.instantiate = (PFN_cuGraphInstantiateWithFlags_v11040)f[2];
        app.launch = (PFN_cuGraphLaunch_v10000)f[3];
        app.nodes = (PFN_cuGraphGetNodes_v10000)f[4];
        app.destroy = (PFN_cuGraphDestroy_v10000)f[5];
        app.exec_destroy = (PFN_cuGraphExecDestroy_v10000)f[6];
        app.htod_async = (PFN_cuMemcpyHtoDAsync_v3020)f[7];
        app.control = (colld_cudafake_control_fn)dlsym(lib, "colld_cudafake_control");
        ok = app.control != NULL || hardware;
    }
    if (lib)
        dlclose(lib);
    return ok;
}

/* Files in the case's directory: how the ranks and the driver meet. */
static void touch(const char *dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void touch(const char *dir, const char *fmt, ...)
{
    char name[64], path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f)
        fclose(f);
}

static bool await(const char *dir, const char *name, int ms)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return harness_wait_file(path, ms) == 0;
}

/* The communicator's async error once it has one (at most ms), else COLLD_OK. */
static colld_status_t async_error_within(colld_comm_t *comm, int ms)
{
    colld_status_t e = COLLD_OK;
    double end = harness_now_ms() + ms;
    while (colld_comm_get_async_error(comm, &e) == COLLD_OK && e == COLLD_OK && harness_now_ms() < end) {
        struct timespec ts = { 0, 5000000 };
        nanosleep(&ts, NULL);
    }
    return e;
}

/* ---- the collectives, their inputs and their exact results ---- */

typedef enum { K_AR, K_BC, K_RS, K_AG } kind_t;
static const char *const kind_name[] = { "all-reduce", "broadcast", "reduce-scatter", "all-gather" };

/* Rank r's input element j of replay i: small integers, so every sum is exact in float. */
static float in_val(int r, int i, size_t j)
{
    return (float)((r + 1) * (int)(j % 7) + 10 * i + r);
}

static size_t send_elems(kind_t k, int nranks)
{
    return k == K_RS ? (size_t)nranks * N : N;
}

static size_t recv_elems(kind_t k, int nranks)
{
    return k == K_AG ? (size_t)nranks * N : N;
}

/* Element j of this rank's result of replay i. */
static float want(kind_t k, int i, size_t j)
{
    float sum = 0;
    switch (k) {
    case K_AR:
        for (int r = 0; r < me->nranks; r++)
            sum += in_val(r, i, j);
        return sum;
    case K_BC:
        return in_val(me->nranks - 1, i, j);
    case K_RS:
        for (int r = 0; r < me->nranks; r++)
            sum += in_val(r, i, (size_t)me->rank * N + j);
        return sum;
    case K_AG:
        return in_val((int)(j / N), i, j % N);
    }
    return 0;
}

/* One collective on comm and stream s. */
static colld_status_t call(kind_t k, CUdeviceptr send, CUdeviceptr recv, size_t count, CUstream s)
{
    void *sp = (void *)(uintptr_t)send, *rp = (void *)(uintptr_t)recv;
    switch (k) {
    case K_AR:
        return colld_allreduce(sp, rp, count, COLLD_FLOAT32, COLLD_SUM, me->comm, s);
    case K_BC:
        return colld_broadcast(sp, rp, count, COLLD_FLOAT32, me->nranks - 1, me->comm, s);
    case K_RS:
        return colld_reducescatter(sp, rp, count, COLLD_FLOAT32, COLLD_SUM, me->comm, s);
    case K_AG:
        return colld_allgather(sp, rp, count, COLLD_FLOAT32, me->comm, s);
    }
    return COLLD_ERR_INVALID_ARGUMENT;
}

/* A collective's buffers and, once captured, its graph. */
typedef struct {
    kind_t kind;
    CUdeviceptr send, recv;
    size_t ns, nr;
    float *in, *out;
    float *poison; /* nr elements of 0xff bytes (a NaN pattern), copied into recv before each run */
    CUgraph g;
    CUgraphExec x;
} cap_t;

static void cap_new(cap_t *cp, kind_t k)
{
    memset(cp, 0, sizeof(*cp));
    cp->kind = k;
    cp->ns = send_elems(k, me->nranks);
    cp->nr = recv_elems(k, me->nranks);
    cp->in = calloc(cp->ns, sizeof(float));
    cp->out = calloc(cp->nr, sizeof(float));
    cp->poison = malloc(cp->nr * sizeof(float));
    if (!cp->in || !cp->out || !cp->poison)
        rank_fail("out of memory");
    memset(cp->poison, 0xff, cp->nr * sizeof(float));
    CU_MUST(cu->cuMemAlloc(&cp->send, cp->ns * sizeof(float)));
    CU_MUST(cu->cuMemAlloc(&cp->recv, cp->nr * sizeof(float)));
}

/* Capture the collective into a new graph on stream s: the call's status, the end's result, the
 * graph's node count in *nodes. */
static colld_status_t cap_capture(cap_t *cp, CUstream s, size_t count, CUresult *end, size_t *nodes)
{
    CU_MUST(app.begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    colld_status_t st = call(cp->kind, cp->send, cp->recv, count, s);
    cp->g = NULL;
    *end = app.end(s, &cp->g);
    *nodes = 0;
    if (cp->g)
        CU_MUST(app.nodes(cp->g, NULL, nodes));
    return st;
}

/* Capture it and make an executable graph; the capture must work and hold colld's three memory
 * operations. */
static void cap_graph(cap_t *cp)
{
    CUresult end;
    size_t nodes;
    colld_status_t st = cap_capture(cp, me->s, N, &end, &nodes);
    if (st != COLLD_OK)
        rank_fail("capturing the %s: %s", kind_name[cp->kind], colld_status_name(st));
    if (end != CUDA_SUCCESS || nodes != 3)
        rank_fail("the capture of the %s ended with %s and %zu nodes (3 expected)", kind_name[cp->kind], rname(end),
                  nodes);
    CU_MUST(app.instantiate(&cp->x, cp->g, 0));
}

/* The inputs of replay i, copied in on stream s (the replay on s reads them); recv poisoned, on s
 * too. Not with cuMemsetD8: it goes to the legacy default stream and is asynchronous to the host
 * for device memory (the double models that), and the rank's non-blocking stream is not ordered
 * with the legacy stream, so the poison could land while or after the daemon's kernels wrote the
 * result (the intermittent NaNs of this test: a replay "element 0 is -nan"). */
static void cap_fill(cap_t *cp, int i, CUstream s)
{
    for (size_t j = 0; j < cp->ns; j++)
        cp->in[j] = in_val(me->rank, i, j);
    CU_MUST(app.htod_async(cp->recv, cp->poison, cp->nr * sizeof(float), s));
    CU_MUST(app.htod_async(cp->send, cp->in, cp->ns * sizeof(float), s));
}

/* This rank's result must be replay i's, exactly. */
static void cap_check(cap_t *cp, int i, const char *what)
{
    CU_MUST(cu->cuMemcpyDtoH(cp->out, cp->recv, cp->nr * sizeof(float)));
    for (size_t j = 0; j < cp->nr; j++)
        if (cp->out[j] != want(cp->kind, i, j))
            rank_fail("%s of the %s, replay %d: element %zu is %g, not %g", what, kind_name[cp->kind], i, j,
                      (double)cp->out[j], (double)want(cp->kind, i, j));
}

/* Hold (stall) or let go this rank's legacy default stream in the double. A replay is run with
 * it held from before its inputs until its stream is synchronized: the replay must depend on
 * nothing the legacy stream runs (the rank's streams are non-blocking), and anything put there
 * without a wait (a cuMemsetD8 poison, as this test once did) lands after the replay every time,
 * instead of rarely, in the window where it lands while the daemon's kernels write. */
static void legacy_hold(bool hold)
{
    char spec[32];
    if (hardware)
        return; /* only the double can hold a stream */
    snprintf(spec, sizeof(spec), "%s:L%d", hold ? "stall" : "release", me->dev);
    if (app.control(spec) != 0)
        rank_fail("the double refused '%s'", spec);
}

/* Replay exec x of the capture on stream s with replay i's inputs and check the result. */
static void cap_replay(cap_t *cp, CUgraphExec x, CUstream s, int i)
{
    legacy_hold(true);
    cap_fill(cp, i, s);
    CU_MUST(app.launch(x, s));
    CU_MUST(cu->cuStreamSynchronize(s));
    legacy_hold(false);
    cap_check(cp, i, "the replay");
}

/* Run the collective eagerly (not captured) with inputs i and check it. */
static void cap_eager(cap_t *cp, int i)
{
    cap_fill(cp, i, me->s);
    colld_status_t st = call(cp->kind, cp->send, cp->recv, N, me->s);
    if (st != COLLD_OK)
        rank_fail("the eager %s: %s", kind_name[cp->kind], colld_status_name(st));
    CU_MUST(cu->cuStreamSynchronize(me->s));
    cap_check(cp, i, "the eager run");
}

/* A replay whose collective cannot run any more: the stream must still be released within ms. */
static double replay_released(cap_t *cp, int ms)
{
    cap_fill(cp, 99, me->s);
    double t0 = harness_now_ms();
    CU_MUST(app.launch(cp->x, me->s));
    CU_MUST(cu->cuStreamSynchronize(me->s)); /* the double's waits end; a hang ends the test by its timeout */
    double took = harness_now_ms() - t0;
    if (took > ms)
        rank_fail("the replay took %.0f ms to be released (at most %d)", took, ms);
    return took;
}

static void cap_free(cap_t *cp)
{
    if (cp->x)
        CU_MUST(app.exec_destroy(cp->x));
    if (cp->g)
        CU_MUST(app.destroy(cp->g));
    cp->x = NULL;
    cp->g = NULL;
    CU_MUST(cu->cuMemFree(cp->send));
    CU_MUST(cu->cuMemFree(cp->recv));
    free(cp->in);
    free(cp->out);
    free(cp->poison);
}

static void expect_async(colld_status_t want_st, int ms, const char *detail)
{
    colld_status_t e = async_error_within(me->comm, ms);
    if (e != want_st)
        rank_fail("async error %s, not %s", colld_status_name(e), colld_status_name(want_st));
    const char *text = colld_comm_last_error(me->comm);
    if (detail && !strstr(text, detail))
        rank_fail("the communicator's detail \"%s\" does not say \"%s\"", text, detail);
}

/* ---- the scenarios ---- */

/* Every kind captured and replayed REPLAYS times with new inputs. The first capture is the
 * process's first GPU collective: its buffers and the flag area are registered during it. */
static void sc_replays(void)
{
    for (kind_t k = K_AR; k <= K_AG; k++) {
        cap_t cp;
        cap_new(&cp, k);
        cap_graph(&cp);
        for (int i = 0; i < REPLAYS; i++)
            cap_replay(&cp, cp.x, me->s, i);
        cap_free(&cp);
    }
    expect_async(COLLD_OK, 0, NULL);
}

/* One capture, two executable graphs, replayed in turn on two streams (each replay ordered after
 * the last: the application's duty for two executable graphs of one capture). */
static void sc_two_execs(void)
{
    cap_t cp;
    cap_new(&cp, K_AR);
    cap_graph(&cp);
    CUgraphExec xb;
    CU_MUST(app.instantiate(&xb, cp.g, 0));
    cap_replay(&cp, cp.x, me->s, 0);
    cap_replay(&cp, xb, me->s2, 1);
    cap_replay(&cp, cp.x, me->s2, 2);
    cap_replay(&cp, xb, me->s, 3);
    CU_MUST(app.exec_destroy(xb));
    cap_free(&cp);
    expect_async(COLLD_OK, 0, NULL);
}

/* Eager collectives and replays of two graphs on one communicator, in one stream. */
static void sc_mixed(void)
{
    cap_t a, b, e;
    cap_new(&a, K_AR);
    cap_new(&b, K_RS);
    cap_new(&e, K_BC);
    cap_eager(&a, 100);
    cap_graph(&a);
    cap_replay(&a, a.x, me->s, 0);
    cap_eager(&e, 101);
    cap_replay(&a, a.x, me->s, 1);
    cap_graph(&b);
    cap_eager(&e, 102);
    /* Both graphs back to back on the stream, nothing between them on the host. */
    legacy_hold(true);
    cap_fill(&a, 2, me->s);
    CU_MUST(app.launch(a.x, me->s));
    cap_fill(&b, 2, me->s);
    CU_MUST(app.launch(b.x, me->s));
    CU_MUST(cu->cuStreamSynchronize(me->s));
    legacy_hold(false);
    cap_check(&a, 2, "back-to-back replay");
    cap_check(&b, 2, "back-to-back replay");
    cap_eager(&e, 103);
    cap_replay(&b, b.x, me->s, 3);
    cap_free(&a);
    cap_free(&b);
    cap_free(&e);
    expect_async(COLLD_OK, 0, NULL);
}

/* Rank 1 never makes its second replay: rank 0's times out naming it and is released. */
static void sc_timeout(void)
{
    cap_t cp;
    cap_new(&cp, K_AR);
    cap_graph(&cp);
    touch(me->dir, "r%d-captured", me->rank); /* the first replays together: well within the timeout */
    if (!await(me->dir, "r0-captured", RANK_WAIT_MS) || !await(me->dir, "r1-captured", RANK_WAIT_MS))
        rank_fail("the other rank never captured");
    cap_replay(&cp, cp.x, me->s, 0);
    touch(me->dir, "r%d-ok", me->rank);
    if (!await(me->dir, "r0-ok", RANK_WAIT_MS) || !await(me->dir, "r1-ok", RANK_WAIT_MS))
        rank_fail("the other rank never got there");
    if (me->rank == 0) {
        double took = replay_released(&cp, SHORT_TIMEOUT_MS + 15000);
        printf("rank 0: the replay rank 1 never made was released after %.0f ms\n", took);
        expect_async(COLLD_ERR_TIMEOUT, 1000, "rank(s) 1 never reached it");
        replay_released(&cp, 10000); /* and every later one, at once */
        touch(me->dir, "r0-done");
    } else {
        if (!await(me->dir, "r0-done", RANK_WAIT_MS))
            rank_fail("rank 0 never finished");
        expect_async(COLLD_ERR_TIMEOUT, 5000, NULL);
        replay_released(&cp, 10000); /* its late replay does not wait either */
    }
    cap_free(&cp);
}

/* Rank 2 is killed between replays: the others' next replays are released with PEER_LOST. */
static void sc_killed(void)
{
    cap_t cp;
    cap_new(&cp, K_AR);
    cap_graph(&cp);
    cap_replay(&cp, cp.x, me->s, 0);
    touch(me->dir, "r%d-ok", me->rank);
    if (me->rank == 2)
        for (;;)
            pause(); /* the driver kills it */
    if (!await(me->dir, "killed", RANK_WAIT_MS))
        rank_fail("the driver never killed rank 2");
    double took = replay_released(&cp, 15000);
    printf("rank %d: replay released %.0f ms after rank 2 was killed\n", me->rank, took);
    expect_async(COLLD_ERR_PEER_LOST, 5000, "rank 2");
    cap_free(&cp);
}

/* The daemon is stopped between replays: libcolld releases the replays itself. */
static void sc_daemon_lost(void)
{
    cap_t cp;
    cap_new(&cp, K_AR);
    cap_graph(&cp);
    cap_replay(&cp, cp.x, me->s, 0);
    touch(me->dir, "r%d-ok", me->rank);
    if (!await(me->dir, "dead", RANK_WAIT_MS))
        rank_fail("the driver never killed the daemon");
    replay_released(&cp, 15000);
    replay_released(&cp, 15000);
    expect_async(COLLD_ERR_DAEMON_LOST, 5000, NULL);
    cap_free(&cp);
}

/* --max-plans-per-session 1: a second capture is refused (QUOTA) and the capture stays valid; once
 * the first graph is destroyed a new capture gets its line (the daemon freed the plan). Then the
 * communicator is destroyed while that graph lives: the graph's replay is released, and the
 * communicator leaves the daemon only once the graph is destroyed. */
static void sc_lifetime(void)
{
    cap_t a, b, c;
    cap_new(&a, K_AR);
    cap_new(&b, K_AR);
    cap_new(&c, K_AG);
    cap_graph(&a);
    cap_replay(&a, a.x, me->s, 0);
    CUresult end;
    size_t nodes;
    colld_status_t st = cap_capture(&b, me->s, N, &end, &nodes);
    if (st != COLLD_ERR_QUOTA_EXCEEDED || !strstr(colld_comm_last_error(me->comm), "--max-plans-per-session"))
        rank_fail("a capture over the limit: %s (not COLLD_ERR_QUOTA_EXCEEDED naming the limit)",
                  colld_status_name(st));
    if (end != CUDA_SUCCESS || nodes != 0)
        rank_fail("the refused capture ended with %s and %zu nodes (valid and empty expected)", rname(end), nodes);
    cap_replay(&a, a.x, me->s, 1); /* the first plan still runs */
    CU_MUST(app.exec_destroy(a.x));
    CU_MUST(app.destroy(a.g));
    a.x = NULL;
    a.g = NULL;
    cap_graph(&c); /* plan line 0 again */
    cap_replay(&c, c.x, me->s, 2);
    expect_async(COLLD_OK, 0, NULL);
    if (colld_comm_destroy(me->comm) != COLLD_OK)
        rank_fail("colld_comm_destroy with a live graph");
    me->comm = NULL;
    touch(me->dir, "r%d-destroyed", me->rank);
    if (!await(me->dir, "go", RANK_WAIT_MS))
        rank_fail("the driver never said go");
    replay_released(&c, 15000); /* its communicator is gone: released, not run */
    CU_MUST(app.exec_destroy(c.x));
    CU_MUST(app.destroy(c.g));
    c.x = NULL;
    c.g = NULL;
    touch(me->dir, "r%d-gone", me->rank);
    if (!await(me->dir, "done", RANK_WAIT_MS))
        rank_fail("the driver never said done");
    cap_free(&a);
    cap_free(&b);
    cap_free(&c);
}

/* Rank 0 captures an all-reduce where rank 1 runs the same all-reduce eagerly: COLLD_ERR_MISMATCH
 * from rank 0's call, at capture time, its capture valid and empty; rank 1's stream released with
 * the mismatch. Before that, a capture inside a group is refused, nothing captured. */
static void sc_mismatch(void)
{
    cap_t cp;
    cap_new(&cp, K_AR);
    /* A capture inside a group. */
    CU_MUST(app.begin(me->s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    colld_group_start();
    colld_status_t st = call(K_AR, cp.send, cp.recv, N, me->s);
    colld_status_t gst = colld_group_end();
    CUgraph g = NULL;
    CUresult end = app.end(me->s, &g);
    size_t nodes = 99;
    if (g)
        CU_MUST(app.nodes(g, NULL, &nodes));
    if (st != COLLD_ERR_NOT_SUPPORTED || gst != COLLD_ERR_NOT_SUPPORTED ||
        !strstr(colld_comm_last_error(me->comm), "inside colld_group_start/colld_group_end is not supported"))
        rank_fail("a capture inside a group: %s, group end %s", colld_status_name(st), colld_status_name(gst));
    if (end != CUDA_SUCCESS || nodes != 0)
        rank_fail("the capture of a refused grouped call ended with %s and %zu nodes", rname(end), nodes);
    CU_MUST(app.destroy(g));
    /* A captured collective against an eager one. */
    if (me->rank == 0) {
        st = cap_capture(&cp, me->s, N, &end, &nodes);
        if (end != CUDA_SUCCESS || nodes != 0)
            rank_fail("the capture of a mismatched collective ended with %s and %zu nodes", rname(end), nodes);
        const char *text = colld_comm_last_error(me->comm);
        if (!strstr(text, "captured into a CUDA graph") || !strstr(text, "GPU stream"))
            rank_fail("the mismatch's detail \"%s\" does not name both calls", text);
    } else {
        st = call(K_AR, cp.send, cp.recv, N, me->s);
        if (st != COLLD_OK)
            rank_fail("the eager all-reduce: %s", colld_status_name(st));
        CU_MUST(cu->cuStreamSynchronize(me->s)); /* released by the mismatch */
        st = async_error_within(me->comm, 5000);
    }
    if (st != COLLD_ERR_MISMATCH)
        rank_fail("a captured collective against an eager one: %s, not COLLD_ERR_MISMATCH", colld_status_name(st));
    cap_free(&cp);
}

static const struct {
    const char *name;
    void (*fn)(void);
} scenarios[] = {
    { "replays", sc_replays },   { "two_execs", sc_two_execs }, { "mixed", sc_mixed },
    { "timeout", sc_timeout },   { "killed", sc_killed },       { "daemon_lost", sc_daemon_lost },
    { "lifetime", sc_lifetime }, { "mismatch", sc_mismatch },
};

/* argv: rank SOCKET UIDHEX RANK NRANKS SCENARIO DIR TIMEOUT_MS */
static int rank_main(int argc, char **argv)
{
    static rk_t r;
    if (argc != 9)
        return 2;
    me = &r;
    r = (rk_t){ .rank = atoi(argv[4]), .nranks = atoi(argv[5]), .scenario = argv[6], .dir = argv[7] };
    hardware = getenv("COLLD_TEST_HARDWARE") != NULL;
    if (!hardware && driver_is_double() != 1)
        rank_fail("libcuda.so.1 is not the CUDA driver test double");
    char err[256];
    if (!(cu = colld_cu_load(err, sizeof(err))) || !app_load())
        rank_fail("the driver: %s", cu ? "capture entry points missing" : err);
    int ndev = 0;
    CUcontext ctx;
    CU_MUST(cu->cuDeviceGetCount(&ndev));
    r.dev = r.rank % ndev;
    CU_MUST(cu->cuDevicePrimaryCtxRetain(&ctx, r.dev));
    CU_MUST(cu->cuCtxSetCurrent(ctx));
    colld_unique_id_t id;
    if (harness_uid_from_hex(argv[3], &id) != 0)
        rank_fail("bad unique id");
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = atoi(argv[8]);
    cfg.name = "graphs";
    colld_status_t st;
    if ((st = colld_connect(argv[2], &r.c)) != COLLD_OK)
        rank_fail("colld_connect: %s", colld_status_name(st));
    if ((st = colld_comm_init_rank(r.c, &r.comm, r.nranks, id, r.rank, &cfg)) != COLLD_OK)
        rank_fail("colld_comm_init_rank: %s", colld_status_name(st));
    CU_MUST(cu->cuStreamCreate(&r.s, CU_STREAM_NON_BLOCKING));
    CU_MUST(cu->cuStreamCreate(&r.s2, CU_STREAM_NON_BLOCKING));
    size_t i = 0;
    while (i < sizeof(scenarios) / sizeof(scenarios[0]) && strcmp(scenarios[i].name, r.scenario) != 0)
        i++;
    if (i == sizeof(scenarios) / sizeof(scenarios[0]))
        rank_fail("unknown scenario");
    scenarios[i].fn();
    if (r.comm)
        colld_comm_destroy(r.comm);
    r.comm = NULL;
    CU_MUST(cu->cuStreamDestroy(r.s));
    CU_MUST(cu->cuStreamDestroy(r.s2));
    colld_disconnect(r.c);
    printf("rank %d [%s]: ok\n", r.rank, r.scenario);
    return 0;
}

/* ============================================================================================
 * The driver
 * ========================================================================================== */

static char self_path[4096];

/* Spawn nranks ranks of a new communicator running `scenario`. */
static void spawn(harness_t *h, int nranks, const char *scenario, int timeout_ms, pid_t *pids)
{
    char hex[HARNESS_UID_HEX_LEN], rank[16], n[16], t[16];
    assert_int_equal(harness_new_uid_hex(h, hex), 0);
    snprintf(n, sizeof(n), "%d", nranks);
    snprintf(t, sizeof(t), "%d", timeout_ms);
    for (int r = 0; r < nranks; r++) {
        snprintf(rank, sizeof(rank), "%d", r);
        const char *argv[] = { self_path, "rank", h->socket, hex, rank, n, scenario, h->dir, t, NULL };
        pids[r] = harness_spawn(argv);
        assert_true(pids[r] > 0);
    }
}

/* Every rank must exit 0. */
static void all_ok(pid_t *pids, int n)
{
    int bad = harness_wait_all(pids, n, RANK_WAIT_MS + 60000);
    assert_int_equal(bad, 0);
}

static bool wait_for(harness_t *h, const char *name, int ms)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", h->dir, name);
    return harness_wait_file(path, ms) == 0;
}

static void put(harness_t *h, const char *name)
{
    touch(h->dir, "%s", name);
}

/* Does the daemon's log say `what` (within ms)? */
static bool log_says(harness_t *h, const char *what, int ms)
{
    double end = harness_now_ms() + ms;
    for (;;) {
        FILE *f = fopen(h->log, "r");
        char line[2048];
        bool found = false;
        while (f && !found && fgets(line, sizeof(line), f))
            found = strstr(line, what) != NULL;
        if (f)
            fclose(f);
        if (found || harness_now_ms() >= end)
            return found;
        struct timespec ts = { 0, 20000000 };
        nanosleep(&ts, NULL);
    }
}

static int setup(void **state)
{
    if (harness_test_setup(state) != 0)
        return -1;
    return hardware || daemon_on_double(((harness_t *)*state)->pid) ? 0 : -1;
}

static int setup_one_plan(void **state)
{
    static const char *const args[] = { "--max-plans-per-session", "1", NULL };
    if (harness_test_setup_args(state, args) != 0)
        return -1;
    return hardware || daemon_on_double(((harness_t *)*state)->pid) ? 0 : -1;
}

static void run_all(void **state, int nranks, const char *scenario, int timeout_ms)
{
    pid_t pids[4];
    spawn(*state, nranks, scenario, timeout_ms, pids);
    all_ok(pids, nranks);
}

static void test_graph_replays(void **state)
{
    run_all(state, 4, "replays", COMM_TIMEOUT_MS);
    assert_true(log_says(*state, "holds captured collective", 0));
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

static void test_graph_two_execs(void **state)
{
    run_all(state, 2, "two_execs", COMM_TIMEOUT_MS);
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

static void test_graph_mixed_with_eager(void **state)
{
    run_all(state, 2, "mixed", COMM_TIMEOUT_MS);
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

static void test_graph_replay_timeout(void **state)
{
    run_all(state, 2, "timeout", SHORT_TIMEOUT_MS);
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

static void test_graph_peer_killed(void **state)
{
    harness_t *h = *state;
    pid_t pids[3];
    spawn(h, 3, "killed", COMM_TIMEOUT_MS, pids);
    for (int r = 0; r < 3; r++) {
        char name[16];
        snprintf(name, sizeof(name), "r%d-ok", r);
        assert_true(wait_for(h, name, RANK_WAIT_MS));
    }
    kill(pids[2], SIGKILL);
    assert_int_equal(harness_wait(pids[2], 10000), 128 + SIGKILL);
    put(h, "killed");
    all_ok(pids, 2);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

static void test_graph_daemon_lost(void **state)
{
    harness_t *h = *state;
    pid_t pids[2];
    spawn(h, 2, "daemon_lost", COMM_TIMEOUT_MS, pids);
    assert_true(wait_for(h, "r0-ok", RANK_WAIT_MS) && wait_for(h, "r1-ok", RANK_WAIT_MS));
    /* Stopped while the ranks' graphs hold the plan: it must free what the plan holds and exit
     * cleanly (under ASan: no leak, no bad access), and the ranks see their daemon lost. */
    int status = harness_daemon_stop(h, SIGTERM, 20000);
    assert_true(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    put(h, "dead");
    all_ok(pids, 2);
}

static void test_graph_lifetime_and_limit(void **state)
{
    harness_t *h = *state;
    pid_t pids[2];
    spawn(h, 2, "lifetime", COMM_TIMEOUT_MS, pids);
    assert_true(wait_for(h, "r0-destroyed", RANK_WAIT_MS) && wait_for(h, "r1-destroyed", RANK_WAIT_MS));
    /* The first graph was destroyed: its plan left the daemon (the second capture had its line). */
    assert_true(log_says(h, "plan 1 freed", 5000));
    /* Both ranks destroyed the communicator, but a live graph's plan still holds it. */
    assert_false(log_says(h, "(graphs) freed", 500));
    put(h, "go");
    assert_true(wait_for(h, "r0-gone", RANK_WAIT_MS) && wait_for(h, "r1-gone", RANK_WAIT_MS));
    /* Its graphs destroyed, with the ranks' clients still connected: plan and communicator go. */
    assert_true(log_says(h, "plan 2 freed", 10000));
    assert_true(log_says(h, "(graphs) freed", 10000));
    put(h, "done");
    all_ok(pids, 2);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

static void test_graph_capture_mismatch(void **state)
{
    run_all(state, 2, "mismatch", COMM_TIMEOUT_MS);
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "rank") == 0)
        return rank_main(argc, argv);
    const char *group = argc > 1 ? argv[1] : "graph";
    hardware = getenv("COLLD_TEST_HARDWARE") != NULL;
    int d = driver_is_double();
    if (hardware) {
        if (d != -1) {
            printf("SKIP: COLLD_TEST_HARDWARE is set but %s\n",
                   d == 0 ? "no libcuda.so.1 is found" : "the libcuda.so.1 found is the CUDA driver test double");
            return 77;
        }
        if (strcmp(group, "graph") != 0) {
            printf("SKIP: group %s needs the double's GPUs without VMM\n", group);
            return 77;
        }
    } else if (d == 0) {
        printf("no libcuda.so.1: skipped (run through ctest, which puts the CUDA driver test double first)\n");
        return 77;
    }
    if (d < 0 && !hardware)
        return 1;
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
    if (n <= 0)
        return 1;
    self_path[n] = '\0';
    signal(SIGPIPE, SIG_IGN);
    if (argc > 2)
        cmocka_set_test_filter(argv[2]); /* one case, by name (a pattern) */
    if (strcmp(group, "legacy") == 0) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_setup_teardown(test_graph_replays, setup, harness_test_teardown),
        };
        return cmocka_run_group_tests_name(group, tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_graph_replays, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_graph_two_execs, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_graph_mixed_with_eager, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_graph_capture_mismatch, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_graph_replay_timeout, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_graph_peer_killed, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_graph_lifetime_and_limit, setup_one_plan, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_graph_daemon_lost, setup, harness_test_teardown),
    };
    return cmocka_run_group_tests_name(group, tests, NULL, NULL);
}
