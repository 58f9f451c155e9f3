/*
 * harness_gpu.c - the helpers the test_gpu_cudafake*.c files share (harness_gpu.h): only ever the
 * CUDA driver test double, two ranks as two threads of this process, exact collectives on the
 * application's device memory, the daemon's fault file and the waits every case bounds.
 */
#include "tests/integration/harness_gpu.h"
#include "tests/integration/harness_double.h"

#include <dlfcn.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

const colld_cu_t *cu;
gpu_app_t app;
char gpu_control[64];
int rank_device[2] = { 0, 1 };

/* The name of a CUresult. */
const char *rname(CUresult r)
{
    const char *n = NULL;
    cu->cuGetErrorName(r, &n);
    return n ? n : "?";
}

/* ============================================================================================
 * Only ever the test double
 * ========================================================================================== */

static char double_path[4096]; /* the libcuda.so.1 this process loaded: the test double's */

/* Is the libcuda.so.1 that dlopen finds here the CUDA driver test double (it alone exports
 * colld_cudafake_control)? Checked before any CUDA call, so that a real driver (LD_LIBRARY_PATH
 * lost, the double not built) is never initialised, let alone driven, by this test. Sets
 * double_path. Returns 1 (the double), 0 (no libcuda.so.1 at all), -1 (another libcuda.so.1). */
int driver_is_double(void)
{
    return harness_double_find(double_path, sizeof(double_path), false);
}

/* Does the daemon (pid) map no libcuda but the test double, and no NCCL; and, with must_map, the
 * double itself (an old driver's daemon may have let it go)? Says why not. */
bool daemon_on_double(pid_t pid, bool must_map)
{
    return harness_daemon_on_double(pid, double_path, must_map);
}

/* harness_test_setup, then the daemon must be on the test double (and on nothing else). */
int setup_on_double(void **state)
{
    if (harness_test_setup(state) != 0)
        return -1;
    return daemon_on_double(((harness_t *)*state)->pid, true) ? 0 : -1;
}

/* The same for the old driver's daemon, which may have unloaded the double it refused. */
int setup_old_driver(void **state)
{
    if (harness_test_setup(state) != 0)
        return -1;
    return daemon_on_double(((harness_t *)*state)->pid, false) ? 0 : -1;
}

/* A case that pins an OPEN defect of issue 15: say so before it runs, so that nobody reads its pass
 * as a feature. It passes while the defect is there; when the fix lands it fails, and is then
 * rewritten to assert the right behaviour (`fixed`). */
void open_defect(const char *id, const char *today, const char *fixed)
{
    print_message("OPEN DEFECT %s (issue 15), still present: this case asserts today's WRONG behaviour: %s. "
                  "When it fails, the fix has landed: rewrite it to assert that %s.\n",
                  id, today, fixed);
}
/* ============================================================================================
 * Two ranks, one thread each
 * ========================================================================================== */

void rank_fail(rank_t *r, const char *fmt, ...)
{
    if (r->failure[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->failure, sizeof(r->failure), fmt, ap);
    va_end(ap);
}

/* The communicator's async error once it has one (at most 20 s), or COLLD_OK. */
colld_status_t async_error(colld_comm_t *comm)
{
    colld_status_t e = COLLD_OK;
    for (int i = 0; i < 4000 && e == COLLD_OK; i++) {
        colld_comm_get_async_error(comm, &e);
        if (e == COLLD_OK)
            harness_wait_file("/nonexistent", 5);
    }
    return e;
}

static void *rank_thread(void *arg)
{
    rank_t *r = arg;
    CUcontext ctx;
    CUresult cr;
    r->c = r->h->client;
    if ((cr = cu->cuDevicePrimaryCtxRetain(&ctx, rank_device[r->rank])) != CUDA_SUCCESS ||
        (cr = cu->cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) {
        rank_fail(r, "context of device %d: %s", rank_device[r->rank], rname(cr));
        return NULL;
    }
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = r->timeout_ms ? r->timeout_ms : COMM_TIMEOUT_MS;
    colld_status_t st;
    if (r->rank == 1 && colld_connect(r->h->socket, &r->c) != COLLD_OK)
        rank_fail(r, "colld_connect failed");
    else if ((st = colld_comm_init_rank(r->c, &r->comm, 2, r->id, r->rank, &cfg)) != COLLD_OK)
        rank_fail(r, "colld_comm_init_rank: %s", colld_status_name(st));
    else if ((cr = cu->cuStreamCreate(&r->s, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
        rank_fail(r, "cuStreamCreate: %s", rname(cr));
    else
        r->fn(r);
    if (r->comm)
        snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
    if (r->comm)
        colld_comm_destroy(r->comm);
    if (r->s)
        cu->cuStreamDestroy(r->s);
    if (r->rank == 1 && r->c && r->c != r->h->client)
        colld_disconnect(r->c);
    cu->cuCtxSetCurrent(NULL);
    cu->cuDevicePrimaryCtxRelease(rank_device[r->rank]);
    return NULL;
}

/* Run fn on both ranks of a new communicator; fails the test if a rank's set-up failed. */
void run_ranks(harness_t *h, scenario_fn fn, int timeout_ms, rank_t ranks[2])
{
    pthread_t t[2];
    pthread_barrier_t barrier;
    colld_unique_id_t id;
    pthread_barrier_init(&barrier, NULL, 2);
    assert_int_equal(colld_get_unique_id(h->client, &id), COLLD_OK);
    for (int i = 0; i < 2; i++) {
        memset(&ranks[i], 0, sizeof(ranks[i]));
        ranks[i] = (rank_t){ .h = h, .id = id, .rank = i, .timeout_ms = timeout_ms, .fn = fn, .barrier = &barrier };
        assert_int_equal(pthread_create(&t[i], NULL, rank_thread, &ranks[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&barrier);
    for (int i = 0; i < 2; i++) {
        print_message("rank %d: st %s %s %s, cuda %s %s, v %ld %ld: %s\n", i, colld_status_name(ranks[i].st[0]),
                      colld_status_name(ranks[i].st[1]), colld_status_name(ranks[i].st[2]), rname(ranks[i].cr[0]),
                      rname(ranks[i].cr[1]), ranks[i].v[0], ranks[i].v[1], ranks[i].detail);
        if (ranks[i].failure[0])
            fail_msg("rank %d: %s", i, ranks[i].failure);
    }
}

/* A page of host memory registered with CUDA as a gate the application opens from the host. */
uint32_t *gate_new(CUdeviceptr *d)
{
    uint32_t *g = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g == MAP_FAILED)
        return NULL;
    if (cu->cuMemHostRegister(g, 4096, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE) != CUDA_SUCCESS ||
        cu->cuMemHostGetDevicePointer(d, g, 0) != CUDA_SUCCESS) {
        munmap(g, 4096);
        return NULL;
    }
    return g;
}

void gate_free(uint32_t *g)
{
    cu->cuMemHostUnregister(g);
    munmap(g, 4096);
}

/* ============================================================================================
 * Exact collectives on the application's device memory
 * ========================================================================================== */

/* The collectives the daemon runs on the GPU, on the application's device memory
 * (colld_mem_alloc(COLLD_MEM_CUDA): VMM memory registered as an fd where the devices have VMM,
 * cuMemAlloc memory registered by legacy IPC where not) and stream, through a real daemon that
 * launches its kernels through the driver API (issue 15 A1): all-reduce out of place and in place
 * (an odd count: each GPU's slice has a head, a 16-byte body and a tail), broadcast, reduce,
 * all-gather and reduce-scatter, each result compared exactly. Rank r's input element i is
 * (r + 1) * (i % 13) + r, so the sum of both ranks is 3 * (i % 13) + 1. */

float input(int rank, size_t i)
{
    return (float)((rank + 1) * (int)(i % 13) + rank);
}

float input_sum(size_t i)
{
    return input(0, i) + input(1, i);
}

/* Put this rank's inputs into send (n elements) and 0xff bytes (a NaN pattern) into recv. The copy
 * and the memset go to the legacy default stream, with which the rank's non-blocking stream is not
 * ordered: wait for them before the collective is posted (for the legacy stream only: both ranks
 * may share a context, and the other rank's stream may wait for a collective this one has not
 * posted yet). */
bool fill(rank_t *r, CUdeviceptr send, CUdeviceptr recv, size_t n, size_t nrecv, float *host)
{
    for (size_t i = 0; i < n; i++)
        host[i] = input(r->rank, i);
    CUresult cr = cu->cuMemcpyHtoD(send, host, n * sizeof(float));
    if (cr == CUDA_SUCCESS)
        cr = cu->cuMemsetD8(recv, 0xff, nrecv * sizeof(float));
    if (cr == CUDA_SUCCESS)
        cr = cu->cuStreamSynchronize(CU_STREAM_LEGACY);
    if (cr != CUDA_SUCCESS)
        rank_fail(r, "filling the buffers: %s", rname(cr));
    return cr == CUDA_SUCCESS;
}

/* Wait for a posted collective: the rank's stream (released by the daemon's `done` write), then the
 * communicator. */
bool finished(rank_t *r, const char *what, colld_status_t st)
{
    CUresult cr = CUDA_SUCCESS;
    if (st == COLLD_OK && (cr = cu->cuStreamSynchronize(r->s)) == CUDA_SUCCESS)
        st = colld_comm_synchronize(r->comm);
    if (st != COLLD_OK || cr != CUDA_SUCCESS)
        rank_fail(r, "%s: %s, stream %s: %s", what, colld_status_name(st), rname(cr), colld_comm_last_error(r->comm));
    return st == COLLD_OK && cr == CUDA_SUCCESS;
}

/* Compare n elements of buf with want(i) exactly; a NaN want means "untouched (0xff bytes)". */
bool expect_values(rank_t *r, const char *what, CUdeviceptr buf, size_t n, float *host, float (*want)(rank_t *, size_t))
{
    CUresult cr = cu->cuMemcpyDtoH(host, buf, n * sizeof(float));
    if (cr != CUDA_SUCCESS) {
        rank_fail(r, "%s: reading the result: %s", what, rname(cr));
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        float w = want(r, i);
        uint32_t bits;
        memcpy(&bits, &host[i], sizeof(bits));
        if (w != w ? bits != 0xffffffffu : host[i] != w) {
            rank_fail(r, "%s: element %zu is %g, not %g", what, i, (double)host[i], (double)w);
            return false;
        }
    }
    r->v[0]++;
    return true;
}

float want_sum(rank_t *r, size_t i)
{
    (void)r;
    return input_sum(i);
}

static float want_root1(rank_t *r, size_t i)
{
    (void)r;
    return input(1, i);
}

static float want_reduce_root0(rank_t *r, size_t i)
{
    return r->rank == 0 ? input_sum(i) : (float)NAN;
}

static float want_gathered(rank_t *r, size_t i)
{
    (void)r;
    return input((int)(i / N_G), i % N_G);
}

static float want_scattered(rank_t *r, size_t i)
{
    return input_sum((size_t)r->rank * N_G + i);
}

void sc_collectives(rank_t *r)
{
    static float host[2][N_AR];
    float *h = host[r->rank];
    void *sp = NULL, *rp = NULL;
    CUdeviceptr send = 0, recv = 0;
    colld_status_t st;
    if ((st = colld_mem_alloc(r->c, &sp, N_AR * sizeof(float), COLLD_MEM_CUDA)) != COLLD_OK ||
        (st = colld_mem_alloc(r->c, &rp, N_AR * sizeof(float), COLLD_MEM_CUDA)) != COLLD_OK) {
        rank_fail(r, "colld_mem_alloc(COLLD_MEM_CUDA): %s: %s", colld_status_name(st), colld_last_error(r->c));
        goto out;
    }
    send = (CUdeviceptr)(uintptr_t)sp;
    recv = (CUdeviceptr)(uintptr_t)rp;
    if (!fill(r, send, recv, N_AR, N_AR, h) ||
        !finished(r, "all-reduce", colld_allreduce(sp, rp, N_AR, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s)) ||
        !expect_values(r, "all-reduce", recv, N_AR, h, want_sum))
        goto out;
    if (!fill(r, send, recv, N_AR, N_AR, h) ||
        !finished(r, "in-place all-reduce", colld_allreduce(sp, sp, N_AR, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s)) ||
        !expect_values(r, "in-place all-reduce", send, N_AR, h, want_sum))
        goto out;
    if (!fill(r, send, recv, N_AR, N_AR, h) ||
        !finished(r, "broadcast", colld_broadcast(sp, rp, N_AR, COLLD_FLOAT32, 1, r->comm, r->s)) ||
        !expect_values(r, "broadcast", recv, N_AR, h, want_root1))
        goto out;
    if (!fill(r, send, recv, N_AR, N_AR, h) ||
        !finished(r, "reduce", colld_reduce(sp, rp, N_AR, COLLD_FLOAT32, COLLD_SUM, 0, r->comm, r->s)) ||
        !expect_values(r, "reduce", recv, N_AR, h, want_reduce_root0))
        goto out;
    if (!fill(r, send, recv, N_G, 2 * N_G, h) ||
        !finished(r, "all-gather", colld_allgather(sp, rp, N_G, COLLD_FLOAT32, r->comm, r->s)) ||
        !expect_values(r, "all-gather", recv, 2 * N_G, h, want_gathered))
        goto out;
    if (!fill(r, send, recv, 2 * N_G, N_G, h) ||
        !finished(r, "reduce-scatter", colld_reducescatter(sp, rp, N_G, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s)) ||
        !expect_values(r, "reduce-scatter", recv, N_G, h, want_scattered))
        goto out;
out:
    /* Both ranks are done with every collective before either frees (the other's daemon-side kernels
     * read this rank's buffers). */
    pthread_barrier_wait(r->barrier);
    if (rp)
        colld_mem_free(r->c, rp);
    if (sp)
        colld_mem_free(r->c, sp);
}
/* A host-only communicator: an all-reduce of host memory (no stream), the result exact. */
void sc_host(rank_t *r)
{
    static float buf[2][2][COUNT];
    float *send = buf[r->rank][0], *recv = buf[r->rank][1];
    for (size_t i = 0; i < COUNT; i++) {
        send[i] = input(r->rank, i);
        recv[i] = -1.0f;
    }
    r->st[0] = colld_allreduce(send, recv, COUNT, COLLD_FLOAT32, COLLD_SUM, r->comm, NULL);
    if (r->st[0] == COLLD_OK)
        r->st[1] = colld_comm_synchronize(r->comm);
    for (size_t i = 0; i < COUNT; i++)
        if (recv[i] != input_sum(i)) {
            rank_fail(r, "host all-reduce during the GPU's reset: element %zu is %g, not %g", i, (double)recv[i],
                      (double)input_sum(i));
            break;
        }
}

/* ============================================================================================
 * The daemon's fault file, waits
 * ========================================================================================== */

/* Append one fault specification to the daemon's fault file. */
bool control_append(const char *line)
{
    FILE *f = fopen(gpu_control, "a");
    if (!f)
        return false;
    fprintf(f, "%s\n", line);
    return fclose(f) == 0;
}

/* Has the file (the daemon's log, its fault file) said `what` within ms milliseconds? */
bool log_says(const char *path, const char *what, int ms)
{
    static _Thread_local char log[65536];
    for (int i = 0; i < ms / 5; i++) {
        harness_read_file(path, log, sizeof(log));
        if (strstr(log, what))
            return true;
        harness_wait_file("/nonexistent", 5);
    }
    return false;
}

/* The communicator's async error, waiting at most ms milliseconds (COLLD_OK: none by then). */
colld_status_t async_error_within(colld_comm_t *comm, int ms)
{
    colld_status_t e = COLLD_OK;
    for (int i = 0; i < ms / 5 && e == COLLD_OK; i++) {
        colld_comm_get_async_error(comm, &e);
        if (e == COLLD_OK)
            harness_wait_file("/nonexistent", 5);
    }
    return e;
}

/* Wait, at most WAIT_MS, until the rank's stream has run everything (its waits for the daemon's
 * `done` writes released). A stream left waiting is a failure, and is leaked: destroying it
 * could wait forever. */
CUresult stream_released(rank_t *r)
{
    CUresult cr = CUDA_ERROR_NOT_READY;
    for (int i = 0; i < WAIT_MS / 5 && cr == CUDA_ERROR_NOT_READY; i++)
        if ((cr = cu->cuStreamQuery(r->s)) == CUDA_ERROR_NOT_READY)
            harness_wait_file("/nonexistent", 5);
    if (cr == CUDA_ERROR_NOT_READY) {
        rank_fail(r, "the stream of rank %d still waits for the daemon after %d ms", r->rank, WAIT_MS);
        r->s = NULL;
    }
    return cr;
}

/* A fresh fault file (gpu_control) holding lines[], read by the double of the daemon that
 * setup_on_double starts (the variable is set for that start only). */
int setup_with_control(void **state, const char *const *lines)
{
    snprintf(gpu_control, sizeof(gpu_control), "/tmp/colld-cudafake-XXXXXX");
    int fd = mkstemp(gpu_control);
    if (fd < 0)
        return -1;
    close(fd);
    for (size_t i = 0; lines[i]; i++)
        if (!control_append(lines[i]))
            return -1;
    setenv("COLLD_CUDAFAKE_CONTROL", gpu_control, 1);
    int rc = setup_on_double(state);
    unsetenv("COLLD_CUDAFAKE_CONTROL");
    return rc;
}

int teardown_control(void **state)
{
    int rc = harness_test_teardown(state);
    unlink(gpu_control);
    return rc;
}

/* Does the daemon (pid) map a memfd named `name`? */
bool daemon_maps(pid_t pid, const char *name)
{
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    bool found = false;
    while (f && !found && fgets(line, sizeof(line), f))
        found = strstr(line, name) != NULL;
    if (f)
        fclose(f);
    return found;
}

/* ============================================================================================
 * The application's entry points beyond colld's table
 * ========================================================================================== */

/* Those entry points, from the driver colld loaded. */
bool app_load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    PFN_cuGetProcAddress_v12000 get = lib ? (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    void *f[8] = { NULL };
    const char *names[8] = { "cuStreamBeginCapture", "cuStreamEndCapture",     "cuGraphInstantiateWithFlags",
                             "cuGraphLaunch",        "cuGraphGetNodes",        "cuGraphDestroy",
                             "cuGraphExecDestroy",   "cuDevicePrimaryCtxReset" };
    const int versions[8] = { 10010, 10000, 11040, 10000, 10000, 10000, 10000, 11000 };
    for (int i = 0; get && i < 8; i++)
        if (get(names[i], &f[i], versions[i], 0, NULL) != CUDA_SUCCESS || !f[i])
            return false;
    app.begin = (PFN_cuStreamBeginCapture_v10010)f[0];
    app.end = (PFN_cuStreamEndCapture_v10000)f[1];
    app.instantiate = (PFN_cuGraphInstantiateWithFlags_v11040)f[2];
    app.launch = (PFN_cuGraphLaunch_v10000)f[3];
    app.nodes = (PFN_cuGraphGetNodes_v10000)f[4];
    app.destroy = (PFN_cuGraphDestroy_v10000)f[5];
    app.exec_destroy = (PFN_cuGraphExecDestroy_v10000)f[6];
    app.reset = (PFN_cuDevicePrimaryCtxReset_v11000)f[7];
    if (lib)
        dlclose(lib);
    return get != NULL;
}
/* harness_test_teardown, then reset any of this process's device contexts that a case left with a
 * sticky error (a case that failed before its own reset), so that the next case starts clean. The
 * probe creates a stream (any synchronization could wait forever on a stream a failed case left
 * waiting for a daemon that is gone). */
int teardown_contexts(void **state)
{
    int rc = harness_test_teardown(state);
    for (int d = 0; d < 2; d++) {
        CUcontext ctx;
        CUstream s = NULL;
        if (cu->cuDevicePrimaryCtxRetain(&ctx, d) != CUDA_SUCCESS)
            return -1;
        cu->cuCtxSetCurrent(ctx);
        CUresult r = cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
        if (r == CUDA_SUCCESS)
            cu->cuStreamDestroy(s);
        cu->cuCtxSetCurrent(NULL);
        if (r != CUDA_SUCCESS) {
            print_message("device %d's context was left failed (%s): reset for the next case\n", d, rname(r));
            app.reset(d);
        }
        cu->cuDevicePrimaryCtxRelease(d);
    }
    return rc;
}

bool group_is(const char *group, const char *const *names)
{
    for (size_t i = 0; names[i]; i++)
        if (strcmp(group, names[i]) == 0)
            return true;
    return false;
}
