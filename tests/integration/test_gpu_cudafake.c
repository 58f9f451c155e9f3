/*
 * test_gpu_cudafake.c - first contact of libcolld's and the daemon's GPU paths with a CUDA driver:
 * a real daemon and this client process, both with the CUDA driver test double (tests/cudafake)
 * as libcuda.so.1 (ctest runs it through colld_test_with_cudafake; it skips, 77, when no driver
 * loads). Two ranks are two threads of this process with a client each, rank r on fake GPU r. The
 * application side (buffers, streams, gates) uses the driver API through colld's own loader.
 *
 * Groups (argv[1]):
 *   vmm, legacy   devices with VMM and POSIX fds (colld_mem_alloc makes cuMemCreate memory,
 *                 registered as an fd), or without VMM (cuMemAlloc memory, a legacy IPC handle):
 *     mem_alloc       colld_mem_alloc(COLLD_MEM_CUDA) / colld_mem_free
 *     flag_protocol   count-0 stream-ordered all-reduces: the flag area registered in both
 *                     processes, `ready` written by the client's stream, `done` by the daemon's
 *                     stream (cuStreamWriteValue32), completion by its event: end to end
 *     collectives     all-reduce (out of place, in place), broadcast, reduce, all-gather and
 *                     reduce-scatter on the application's device memory, results exact: the daemon
 *                     launches its kernels through the driver API (issue 15 A1, fixed), each launch
 *                     running the host build of the same kernel source on the double
 *     launch faults   the daemon's double stalls its stream and fails (or holds) a call of a
 *                     launch: a launch that fails part-way, a communicator that breaks during a
 *                     launch; both ranks' streams are released (issue 15 F1, F2, fixed)
 *     readiness       a ready slot per collective (issue 15 E1, E2, fixed): a later collective's
 *                     `ready` on another stream never stands for an earlier one (whose result is
 *                     exact), at most 32 collectives posted and not yet launched (the post waits),
 *                     and an aborted communicator's late `ready` writes never break the next
 *                     communicator on the same handle
 *   driver        an 11.8 driver: the daemon and the client refuse GPU work with the loader's reason
 *   kernel_driver a 12.8 driver (enough for libcolld), older than the daemon's fatbin needs, and
 *   old_gpu       GPUs of compute capability 7.5, which the fatbin has no code for: the daemon
 *                 refuses its CUDA backend at start with the reason, and every GPU request with it
 *   recovery,     (with and without VMM) a sticky error in the daemon's context of GPU 0: the
 *   recovery_legacy collective fails with COLLD_ERR_DEVICE naming the GPU, host work goes on while
 *                 the daemon resets the GPU, then a new communicator on it runs exact collectives;
 *                 and the client's flag area registered again after the application resets its
 *                 context (issue 15 F3 and the flag area's context, fixed)
 *   defects       issue 15's defects fixed since their cases were written, the cases now asserting
 *                 the fix: a collective inside a CUDA graph capture is captured, the capture stays
 *                 valid and every replay runs it (3.3; test_gpu_cudafake_graph has the rest); a
 *                 freed buffer's mapping goes from the daemon (C1/D4).
 *   open_defects  the review's defects that the double shows today (issue 15), STILL OPEN: each
 *                 case (test_open_defect_<id>_...) asserts the present, wrong behaviour, prints
 *                 "OPEN DEFECT <id>" with what the fix must turn it into, and passes while the
 *                 defect is there. A fix makes its case fail: then the case is rewritten to assert
 *                 the right behaviour (and loses "open_defect" from its name). A pass here is never
 *                 a feature.
 *
 * Every group first checks that the libcuda.so.1 it finds is the test double (it alone exports
 * colld_cudafake_control), before any CUDA call, and that the daemon maps no other libcuda and no
 * NCCL: a real driver is never initialised by this test.
 */
#include "client/client_internal.h"
#include "common/cudadrv.h"
#include "tests/integration/harness.h"

#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#define COUNT 4096 /* floats per rank buffer */
/* The communicators' timeout where a case does not pick one: a collective that is never released
 * (a regression) fails with COLLD_ERR_TIMEOUT and releases the ranks' streams well within the
 * test's ctest TIMEOUT, instead of after the daemon's default of 300 s. */
#define COMM_TIMEOUT_MS 30000
/* The timeout of a case that waits for a collective to time out: long enough for two ranks of
 * one process to join and run a collective on a loaded machine under TSan. */
#define SHORT_TIMEOUT_MS 5000

static const colld_cu_t *cu;

/* The name of a CUresult. */
static const char *rname(CUresult r)
{
    const char *n = NULL;
    cu->cuGetErrorName(r, &n);
    return n ? n : "?";
}

/* A driver call the test itself makes must succeed (not CU_CHECK: common/cudadrv.h defines that one,
 * for colld's own driver calls). */
#define CU_MUST(call)                                                                                        \
    do {                                                                                                     \
        CUresult r_ = (call);                                                                                \
        if (r_ != CUDA_SUCCESS)                                                                              \
            fail_msg("%s: %s", #call, rname(r_));                                                            \
    } while (0)

/* ============================================================================================
 * Only ever the test double
 * ========================================================================================== */

static char double_path[4096]; /* the libcuda.so.1 this process loaded: the test double's */

/* Is the libcuda.so.1 that dlopen finds here the CUDA driver test double (it alone exports
 * colld_cudafake_control)? Checked before any CUDA call, so that a real driver (LD_LIBRARY_PATH
 * lost, the double not built) is never initialised, let alone driven, by this test. Sets
 * double_path. Returns 1 (the double), 0 (no libcuda.so.1 at all), -1 (another libcuda.so.1). */
static int driver_is_double(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 0;
    void *ctl = dlsym(lib, "colld_cudafake_control");
    Dl_info info = { 0 };
    if (ctl && dladdr(ctl, &info) && info.dli_fname && !realpath(info.dli_fname, double_path))
        snprintf(double_path, sizeof(double_path), "%s", info.dli_fname);
    if (!ctl) {
        void *any = dlsym(lib, "cuGetProcAddress");
        printf("libcuda.so.1 here is not the CUDA driver test double (%s): refusing to run GPU tests on it\n",
               any && dladdr(any, &info) && info.dli_fname ? info.dli_fname : "unknown path");
    }
    dlclose(lib);
    return ctl ? 1 : -1;
}

/* Does the daemon (pid) map no libcuda but the test double, and no NCCL; and, with must_map, the
 * double itself (an old driver's daemon may have let it go)? Says why not. */
static bool daemon_on_double(pid_t pid, bool must_map)
{
    char path[64], line[4608];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    bool on_double = false, other = false;
    while (f && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        const char *file = strchr(line, '/');
        if (!file || (!strstr(file, "libcuda.so") && !strstr(file, "libnccl")))
            continue;
        if (strcmp(file, double_path) == 0) {
            on_double = true;
        } else if (!other) {
            other = true;
            print_error("the daemon (pid %d) maps %s, not only the CUDA driver test double %s\n", (int)pid, file,
                        double_path);
        }
    }
    if (f)
        fclose(f);
    if (must_map && !on_double && !other)
        print_error("the daemon (pid %d) has not loaded the CUDA driver test double %s\n", (int)pid, double_path);
    return (on_double || !must_map) && !other;
}

/* harness_test_setup, then the daemon must be on the test double (and on nothing else). */
static int setup_on_double(void **state)
{
    if (harness_test_setup(state) != 0)
        return -1;
    return daemon_on_double(((harness_t *)*state)->pid, true) ? 0 : -1;
}

/* The same for the old driver's daemon, which may have unloaded the double it refused. */
static int setup_old_driver(void **state)
{
    if (harness_test_setup(state) != 0)
        return -1;
    return daemon_on_double(((harness_t *)*state)->pid, false) ? 0 : -1;
}

/* A case that pins an OPEN defect of issue 15: say so before it runs, so that nobody reads its pass
 * as a feature. It passes while the defect is there; when the fix lands it fails, and is then
 * rewritten to assert the right behaviour (`fixed`). */
static void open_defect(const char *id, const char *today, const char *fixed)
{
    print_message("OPEN DEFECT %s (issue 15), still present: this case asserts today's WRONG behaviour: %s. "
                  "When it fails, the fix has landed: rewrite it to assert that %s.\n",
                  id, today, fixed);
}

/* ============================================================================================
 * Two ranks, one thread each
 * ========================================================================================== */

typedef struct rank rank_t;
typedef void (*scenario_fn)(rank_t *r);

struct rank {
    harness_t *h;
    colld_unique_id_t id;
    int rank;
    int timeout_ms;              /* the communicator's (0: COMM_TIMEOUT_MS) */
    scenario_fn fn;
    pthread_barrier_t *barrier;  /* shared by both ranks */
    colld_client_t *c;
    colld_comm_t *comm;
    CUstream s;
    colld_status_t st[4];        /* what the scenario saw */
    CUresult cr[4];
    long v[4];
    char detail[512];
    char failure[256];
};

static void rank_fail(rank_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rank_fail(rank_t *r, const char *fmt, ...)
{
    if (r->failure[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->failure, sizeof(r->failure), fmt, ap);
    va_end(ap);
}

/* The communicator's async error once it has one (at most 20 s), or COLLD_OK. */
static colld_status_t async_error(colld_comm_t *comm)
{
    colld_status_t e = COLLD_OK;
    for (int i = 0; i < 4000 && e == COLLD_OK; i++) {
        colld_comm_get_async_error(comm, &e);
        if (e == COLLD_OK)
            harness_wait_file("/nonexistent", 5);
    }
    return e;
}

/* The device of each rank's thread (its primary context is current there): rank r on device r,
 * unless a case puts both on one device. */
static int rank_device[2] = { 0, 1 };

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
static void run_ranks(harness_t *h, scenario_fn fn, int timeout_ms, rank_t ranks[2])
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
static uint32_t *gate_new(CUdeviceptr *d)
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

static void gate_free(uint32_t *g)
{
    cu->cuMemHostUnregister(g);
    munmap(g, 4096);
}

/* ============================================================================================
 * What works
 * ========================================================================================== */

static void test_mem_alloc_cuda(void **state)
{
    harness_t *h = *state;
    CUcontext ctx;
    CU_MUST(cu->cuDevicePrimaryCtxRetain(&ctx, 1));
    CU_MUST(cu->cuCtxSetCurrent(ctx));
    void *p = NULL;
    colld_status_t st = colld_mem_alloc(h->client, &p, 1 << 20, COLLD_MEM_CUDA);
    if (st != COLLD_OK)
        fail_msg("colld_mem_alloc(COLLD_MEM_CUDA): %s: %s", colld_status_name(st), colld_last_error(h->client));
    unsigned int mt = 0;
    int ordinal = -1;
    CUpointer_attribute at[2] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL };
    void *data[2] = { &mt, &ordinal };
    CU_MUST(cu->cuPointerGetAttributes(2, at, data, (CUdeviceptr)(uintptr_t)p));
    assert_int_equal(mt, CU_MEMORYTYPE_DEVICE);
    assert_int_equal(ordinal, 1); /* the current context's device */
    float in[256], out[256];
    for (int i = 0; i < 256; i++)
        in[i] = (float)i;
    CU_MUST(cu->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)p, in, sizeof(in)));
    CU_MUST(cu->cuMemcpyDtoH(out, (CUdeviceptr)(uintptr_t)p, sizeof(out)));
    assert_memory_equal(in, out, sizeof(in));
    assert_int_equal(colld_mem_free(h->client, p), COLLD_OK);
    mt = 9;
    CU_MUST(cu->cuPointerGetAttributes(1, at, data, (CUdeviceptr)(uintptr_t)p));
    assert_int_equal(mt, 0); /* freed */
    assert_int_equal(colld_mem_free(h->client, p), COLLD_ERR_INVALID_ARGUMENT);
    CU_MUST(cu->cuCtxSetCurrent(NULL));
    CU_MUST(cu->cuDevicePrimaryCtxRelease(1));
    assert_int_equal(harness_wait_clean(h, 5000), 0);
}

/* Three count-0 collectives: nothing to move, only the flags, both ways, through both processes. */
static void sc_flag_protocol(rank_t *r)
{
    for (int i = 0; i < 3; i++) {
        r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
        if (r->st[0] != COLLD_OK)
            return;
        r->cr[0] = cu->cuStreamSynchronize(r->s); /* waits for `done` written by the daemon's stream */
        r->st[1] = colld_comm_synchronize(r->comm);
        if (r->cr[0] != CUDA_SUCCESS || r->st[1] != COLLD_OK)
            return;
        r->v[0]++;
    }
}

static void test_flag_protocol(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_flag_protocol, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].v[0], 3);
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

/* The collectives the daemon runs on the GPU, on the application's device memory
 * (colld_mem_alloc(COLLD_MEM_CUDA): VMM memory registered as an fd where the devices have VMM,
 * cuMemAlloc memory registered by legacy IPC where not) and stream, through a real daemon that
 * launches its kernels through the driver API (issue 15 A1): all-reduce out of place and in place
 * (an odd count: each GPU's slice has a head, a 16-byte body and a tail), broadcast, reduce,
 * all-gather and reduce-scatter, each result compared exactly. Rank r's input element i is
 * (r + 1) * (i % 13) + r, so the sum of both ranks is 3 * (i % 13) + 1. */
#define N_AR (COUNT + 3) /* elements of the all-reduce, broadcast and reduce */
#define N_G 1027         /* elements per rank of the all-gather and the reduce-scatter */

static float input(int rank, size_t i)
{
    return (float)((rank + 1) * (int)(i % 13) + rank);
}

static float input_sum(size_t i)
{
    return input(0, i) + input(1, i);
}

/* Put this rank's inputs into send (n elements) and 0xff bytes (a NaN pattern) into recv. The copy
 * and the memset go to the legacy default stream, with which the rank's non-blocking stream is not
 * ordered: wait for them before the collective is posted (for the legacy stream only: both ranks
 * may share a context, and the other rank's stream may wait for a collective this one has not
 * posted yet). */
static bool fill(rank_t *r, CUdeviceptr send, CUdeviceptr recv, size_t n, size_t nrecv, float *host)
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
static bool finished(rank_t *r, const char *what, colld_status_t st)
{
    CUresult cr = CUDA_SUCCESS;
    if (st == COLLD_OK && (cr = cu->cuStreamSynchronize(r->s)) == CUDA_SUCCESS)
        st = colld_comm_synchronize(r->comm);
    if (st != COLLD_OK || cr != CUDA_SUCCESS)
        rank_fail(r, "%s: %s, stream %s: %s", what, colld_status_name(st), rname(cr), colld_comm_last_error(r->comm));
    return st == COLLD_OK && cr == CUDA_SUCCESS;
}

/* Compare n elements of buf with want(i) exactly; a NaN want means "untouched (0xff bytes)". */
static bool expect_values(rank_t *r, const char *what, CUdeviceptr buf, size_t n, float *host,
                          float (*want)(rank_t *, size_t))
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

static float want_sum(rank_t *r, size_t i)
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

static void sc_collectives(rank_t *r)
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

/* Issue 15 A1, fixed: the daemon launches its kernels through the CUDA driver API (the embedded
 * fatbin loaded with cuLibraryLoadData; on the test double each launch runs the host build of the
 * same kernel source). Before the fix every collective that moved data failed with
 * COLLD_ERR_DEVICE ("colld_cuda_reduce: cudaGetDevice failed": the CUDA runtime cannot initialise
 * on the double). */
static void test_collectives_driver_launch(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_collectives, 0, ranks);
    for (int i = 0; i < 2; i++)
        assert_int_equal(ranks[i].v[0], 6); /* six collectives, every result exact */
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

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
#define LAUNCH_HELD "# held: cuEventRecord call #1" /* the daemon's fault file, hold_call */
#define WAIT_MS 20000 /* the bound of every wait of these cases */

static char launch_control[64]; /* the fault file of the daemon's double */

/* Append one fault specification to the daemon's fault file. */
static bool control_append(const char *line)
{
    FILE *f = fopen(launch_control, "a");
    if (!f)
        return false;
    fprintf(f, "%s\n", line);
    return fclose(f) == 0;
}

/* Has the file (the daemon's log, its fault file) said `what` within ms milliseconds? */
static bool log_says(const char *path, const char *what, int ms)
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
static colld_status_t async_error_within(colld_comm_t *comm, int ms)
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
static CUresult stream_released(rank_t *r)
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
    bool fired = gated && (fault ? log_says(r->h->log, fault, WAIT_MS) : log_says(launch_control, LAUNCH_HELD, WAIT_MS));
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

/* A daemon whose double stalls its first stream and holds its first cuEventRecord (the end of
 * the first launch), and reads launch_control for the case's later instructions. */
static int setup_launch_hold(void **state)
{
    snprintf(launch_control, sizeof(launch_control), "/tmp/colld-cudafake-XXXXXX");
    int fd = mkstemp(launch_control);
    if (fd < 0)
        return -1;
    close(fd);
    if (!control_append("stall:1") || !control_append("hold:cuEventRecord:1"))
        return -1;
    setenv("COLLD_CUDAFAKE_CONTROL", launch_control, 1);
    int rc = setup_on_double(state);
    unsetenv("COLLD_CUDAFAKE_CONTROL");
    return rc;
}

/* A daemon whose double stalls its first stream and fails its 2nd cuStreamWriteValue32, and
 * reads launch_control for the case's later instructions. */
static int setup_launch_fault(void **state)
{
    snprintf(launch_control, sizeof(launch_control), "/tmp/colld-cudafake-XXXXXX");
    int fd = mkstemp(launch_control);
    if (fd < 0)
        return -1;
    close(fd);
    if (!control_append("stall:1") || !control_append("fail:cuStreamWriteValue32:2:CUDA_ERROR_INVALID_VALUE"))
        return -1;
    setenv("COLLD_CUDAFAKE_CONTROL", launch_control, 1);
    int rc = setup_on_double(state);
    unsetenv("COLLD_CUDAFAKE_CONTROL");
    return rc;
}

static int teardown_launch_fault(void **state)
{
    int rc = harness_test_teardown(state);
    unlink(launch_control);
    return rc;
}

/* ============================================================================================
 * Readiness per collective (issue 15 E1, E2)
 *
 * Each stream-ordered collective has its own `ready` slot in the client's flag line (proto/wire.h):
 * a later collective's write, on another stream, never stands for an earlier one (E1), and a
 * broken communicator's write still queued on a stream never lands on top of the write of the
 * next communicator on the same handle (E2).
 * ========================================================================================== */

#define RS_N 16 /* int32 elements of the all-reduce whose inputs are made behind the gate */

/* Rank r's input element i, written by its stream behind the gate; the sum of both ranks. */
static int32_t rs_input(int rank, int i)
{
    return (rank + 1) * 1000 + i;
}

/* Wait, at most WAIT_MS, until the host word *w (a gate, a marker, a ready slot) holds v. */
static bool word_is(const uint32_t *w, uint32_t v)
{
    for (int i = 0; i < WAIT_MS / 5; i++) {
        if (w && __atomic_load_n(w, __ATOMIC_ACQUIRE) == v)
            return true;
        harness_wait_file("/nonexistent", 5);
    }
    return false;
}

/* Wait, at most WAIT_MS, until stream s has run everything: CUDA_ERROR_NOT_READY if it has not
 * (a regression; the stream is then left alone, never synchronized or destroyed). */
static CUresult stream_done(CUstream s)
{
    CUresult cr = CUDA_ERROR_NOT_READY;
    for (int i = 0; i < WAIT_MS / 5 && cr == CUDA_ERROR_NOT_READY; i++)
        if ((cr = cu->cuStreamQuery(s)) == CUDA_ERROR_NOT_READY)
            harness_wait_file("/nonexistent", 5);
    return cr;
}

/* E1: collective #2 goes on stream A behind a gate the application has not opened; behind the gate
 * A also writes #2's inputs. #3 goes on stream B, after a marker. Once B has got to #3 (the
 * marker) the daemon has 2 s to (wrongly) take #3's `ready` for #2's: the fixed daemon keeps both
 * in progress while A waits at the gate. Then the gate opens: #2 must reduce the inputs A wrote
 * behind it, exactly. Before the fix #2 and #3 completed at once, and #2 reduced the zeros its
 * input buffer held before the gate. */
static void sc_ready_slots(rank_t *r)
{
    CUstream b = NULL;
    CUdeviceptr gd = 0, md = 0, in = 0, out = 0;
    uint32_t *gate = gate_new(&gd), *mark = gate_new(&md);
    void *pin = NULL, *pout = NULL;
    int32_t host[RS_N];
    colld_status_t st;
    bool ok = gate && mark && cu->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
    if (!ok)
        rank_fail(r, "gate, marker or stream B");
    if (ok && ((st = colld_mem_alloc(r->c, &pin, RS_N * 4, COLLD_MEM_CUDA)) != COLLD_OK ||
               (st = colld_mem_alloc(r->c, &pout, RS_N * 4, COLLD_MEM_CUDA)) != COLLD_OK)) {
        rank_fail(r, "colld_mem_alloc(COLLD_MEM_CUDA): %s: %s", colld_status_name(st), colld_last_error(r->c));
        ok = false;
    }
    in = (CUdeviceptr)(uintptr_t)pin;
    out = (CUdeviceptr)(uintptr_t)pout;
    if (ok && (cu->cuMemsetD8(in, 0, RS_N * 4) != CUDA_SUCCESS || cu->cuMemsetD8(out, 0xff, RS_N * 4) != CUDA_SUCCESS ||
               cu->cuCtxSynchronize() != CUDA_SUCCESS)) {
        rank_fail(r, "clearing the buffers");
        ok = false;
    }
    /* #1 on B: sets up the flag area. */
    if (ok && (colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b) != COLLD_OK ||
               cu->cuStreamSynchronize(b) != CUDA_SUCCESS || colld_comm_synchronize(r->comm) != COLLD_OK)) {
        rank_fail(r, "the first collective failed: %s", colld_comm_last_error(r->comm));
        ok = false;
    }
    if (ok) {
        /* #2 on A: the gate, then its inputs, then the collective. */
        r->cr[0] = cu->cuStreamWaitValue32(r->s, gd, 1, CU_STREAM_WAIT_VALUE_EQ);
        for (int i = 0; i < RS_N && r->cr[0] == CUDA_SUCCESS; i++)
            r->cr[0] = cu->cuStreamWriteValue32(r->s, in + 4u * (unsigned)i, (uint32_t)rs_input(r->rank, i),
                                                CU_STREAM_WRITE_VALUE_DEFAULT);
        r->st[1] = colld_allreduce(pin, pout, RS_N, COLLD_INT32, COLLD_SUM, r->comm, r->s);
        /* #3 on B, after the marker. */
        if (cu->cuStreamWriteValue32(b, md, 1, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS)
            rank_fail(r, "the marker on stream B");
        r->st[2] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
        if (!word_is(mark, 1))
            rank_fail(r, "stream B never got to collective #3");
        colld_status_t q = COLLD_INPROGRESS;
        for (int i = 0; i < 400 && q == COLLD_INPROGRESS; i++) { /* 2 s for a wrong completion */
            if ((q = colld_comm_query(r->comm)) == COLLD_INPROGRESS)
                harness_wait_file("/nonexistent", 5);
        }
        r->st[3] = q;
        r->cr[1] = cu->cuStreamQuery(r->s); /* A still at the gate */
    }
    pthread_barrier_wait(r->barrier); /* both looked before either gate opens */
    if (gate)
        __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    if (ok) {
        r->cr[2] = stream_done(r->s);
        if (stream_done(b) != CUDA_SUCCESS)
            b = NULL; /* left waiting: leaked */
        r->st[0] = colld_comm_synchronize(r->comm);
        if (cu->cuMemcpyDtoH(host, out, sizeof(host)) != CUDA_SUCCESS)
            rank_fail(r, "reading the result");
        r->v[0] = 1;
        for (int i = 0; i < RS_N; i++)
            if (host[i] != rs_input(0, i) + rs_input(1, i)) {
                if (r->v[0])
                    print_message("rank %d: element %d of #2 is %d, not %d\n", r->rank, i, host[i],
                                  rs_input(0, i) + rs_input(1, i));
                r->v[0] = 0;
            }
    }
    pthread_barrier_wait(r->barrier); /* the daemon's kernels read both ranks' buffers */
    if (pout)
        colld_mem_free(r->c, pout);
    if (pin)
        colld_mem_free(r->c, pin);
    if (b)
        cu->cuStreamDestroy(b);
    if (gate)
        gate_free(gate);
    if (mark)
        gate_free(mark);
}

static void test_ready_slot_per_collective(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_ready_slots, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].st[2], COLLD_OK);
        assert_int_equal(ranks[i].st[3], COLLD_INPROGRESS);     /* nothing completed while A waited ... */
        assert_int_equal(ranks[i].cr[1], CUDA_ERROR_NOT_READY); /* ... at the gate */
        assert_int_equal(ranks[i].cr[2], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].v[0], 1); /* #2 reduced the inputs made behind the gate, exactly */
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

/* E1, the bound: each rank has COLLD_WIRE_GPU_READY_SLOTS ready slots per communicator, so at most
 * that many stream-ordered collectives posted and not yet launched. #2 waits on stream A behind a
 * closed gate; #3 .. #33 go on stream B (every other slot); #34 needs #2's slot, which the daemon
 * has not taken: its post must wait rather than overwrite it, and end when the communicator does
 * (the daemon times #2 out, naming rank's A) with COLLD_ERR_TIMEOUT and nothing enqueued. Before the
 * fix every post went through and #2 .. #34 completed while A waited at the gate. */
static void sc_slot_bound(rank_t *r)
{
    CUstream b = NULL;
    CUdeviceptr gd = 0;
    uint32_t *gate = gate_new(&gd);
    bool ok = gate && cu->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
    if (!ok)
        rank_fail(r, "gate or stream B");
    if (ok && (colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b) != COLLD_OK ||
               cu->cuStreamSynchronize(b) != CUDA_SUCCESS || colld_comm_synchronize(r->comm) != COLLD_OK)) {
        rank_fail(r, "the first collective failed: %s", colld_comm_last_error(r->comm));
        ok = false;
    }
    if (ok) {
        r->cr[0] = cu->cuStreamWaitValue32(r->s, gd, 1, CU_STREAM_WAIT_VALUE_EQ);
        r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s); /* #2 */
        for (int i = 3; i < 3 + (int)COLLD_WIRE_GPU_READY_SLOTS - 1 && r->st[1] == COLLD_OK; i++, r->v[0]++)
            r->st[1] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b); /* #3 .. #33 */
        r->st[2] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b); /* #34 */
        snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
        r->cr[1] = cu->cuStreamQuery(r->s); /* still at the gate */
    }
    pthread_barrier_wait(r->barrier);
    if (gate)
        __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    if (ok) {
        r->cr[2] = stream_released(r);
        if (cu->cuStreamSynchronize(b) == CUDA_SUCCESS)
            cu->cuStreamDestroy(b);
    }
    if (gate && r->s)
        gate_free(gate);
}

static void test_ready_slots_bound(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_slot_bound, SHORT_TIMEOUT_MS, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].v[0], COLLD_WIRE_GPU_READY_SLOTS - 1); /* #3 .. #33 posted */
        assert_int_equal(ranks[i].st[2], COLLD_ERR_TIMEOUT); /* #34 waited until the break */
        assert_non_null(strstr(ranks[i].detail, "stream-ordered collective #34 not posted: the communicator "
                                                "failed (COLLD_ERR_TIMEOUT)"));
        assert_int_equal(ranks[i].cr[1], CUDA_ERROR_NOT_READY); /* nothing ran while A waited */
        assert_int_equal(ranks[i].cr[2], CUDA_SUCCESS);         /* every stream released */
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

/* E2: rank 0 posts communicator X's collectives #2 and #3 alone, on streams A1 and A2 behind closed
 * gates: their `ready` writes (slots 2 and 3) stay queued. Rank 0 aborts X, both destroy it, and a
 * new communicator Y gets the same handles (the same flag lines).
 *   Y #1: rank 0 posts it on stream B; once its `ready` write has landed, gate 1 opens and X #2's
 *         write lands after it; only then does rank 1 post Y #1, so that the daemon looks at rank
 *         0's line after both writes. Before the fix X's late write took the line's only `ready`
 *         word back below Y #1's value: Y #1 timed out and Y broke.
 *   Y #2: in slot 2, where X #2's write landed.
 *   Y #3: in slot 3, where X #3's write is still queued: rank 0's post must wait for it to land
 *         rather than write the slot first. A helper opens gate 2 once Y #3's write has landed in
 *         the slot (what a client without that wait does: X #3's write then lands on top of it and
 *         Y #3 times out), or after a second (the fixed client is still waiting in the post).
 * Every collective of Y must complete. */
static colld_unique_id_t reuse_id; /* Y's, from rank 0 */

typedef struct {
    uint32_t *gate;
    const uint32_t *word; /* Y #3's ready slot */
    uint32_t value;
    bool landed;          /* Y #3's write landed before the gate opened */
} late_gate_t;

static void *late_gate_thread(void *arg)
{
    late_gate_t *lg = arg;
    for (int i = 0; i < 200 && !lg->landed; i++) {
        lg->landed = __atomic_load_n(lg->word, __ATOMIC_ACQUIRE) == lg->value;
        if (!lg->landed)
            harness_wait_file("/nonexistent", 5);
    }
    __atomic_store_n(lg->gate, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Issue 15 C5: a GPU registration names its device by UUID, and the daemon used to take the
 * client's word for it. Now it asks its driver where the memory it mapped lives: a buffer on GPU 0
 * registered as GPU 1's (a legacy IPC handle, and a VMM fd where the devices have VMM) is refused
 * with COLLD_ERR_INVALID_ARGUMENT naming both GPUs; the same buffer with its own UUID is accepted.
 * Raw REG_CUDA messages, as a lying client sends them (client/client_internal.h). */
static colld_status_t register_raw(harness_t *h, unsigned how, const void *ipc, int fd, size_t bytes,
                                   const CUuuid *uuid, char *detail, size_t len)
{
    colld_wire_msg_t m, reply;
    memset(&m, 0, sizeof(m));
    memset(&reply, 0, sizeof(reply));
    m.type = COLLD_MSG_REG_CUDA;
    m.u.reg_cuda.how = how;
    m.u.reg_cuda.bytes = bytes;
    m.u.reg_cuda.cookie = 42;
    memcpy(m.u.reg_cuda.uuid, uuid->bytes, sizeof(m.u.reg_cuda.uuid));
    if (ipc)
        memcpy(m.u.reg_cuda.ipc, ipc, sizeof(m.u.reg_cuda.ipc));
    colld_status_t st = colld__sock_request(h->client, &m, fd, COLLD_MSG_REG_REPLY, &reply, NULL, 0);
    if (st != COLLD_OK)
        return st;
    reply.u.detail[sizeof(reply.u.detail) - 1] = '\0';
    snprintf(detail, len, "%s", reply.status == COLLD_OK ? "" : reply.u.detail);
    return (colld_status_t)reply.status;
}

static void test_registration_device_checked(void **state)
{
    harness_t *h = *state;
    CUcontext ctx;
    CUdevice dev[2];
    CUuuid uuid[2];
    char detail[600];
    for (int i = 0; i < 2; i++) {
        CU_MUST(cu->cuDeviceGet(&dev[i], i));
        CU_MUST(cu->cuDeviceGetUuid(&uuid[i], dev[i]));
    }
    CU_MUST(cu->cuDevicePrimaryCtxRetain(&ctx, 0));
    CU_MUST(cu->cuCtxSetCurrent(ctx));
    /* Legacy IPC: cuMemAlloc memory of GPU 0. */
    CUdeviceptr buf = 0;
    CUipcMemHandle ih;
    CU_MUST(cu->cuMemAlloc(&buf, 1 << 20));
    CU_MUST(cu->cuIpcGetMemHandle(&ih, buf));
    colld_status_t st = register_raw(h, COLLD_CUDA_EXPORT_IPC, ih.reserved, -1, 1 << 20, &uuid[1], detail,
                                     sizeof(detail));
    print_message("IPC handle of GPU 0 memory named as GPU 1's: %s: %s\n", colld_status_name(st), detail);
    assert_int_equal(st, COLLD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(detail, "the registration names GPU 1"));
    assert_non_null(strstr(detail, "but the buffer is on GPU 0"));
    assert_int_equal(register_raw(h, COLLD_CUDA_EXPORT_IPC, ih.reserved, -1, 1 << 20, &uuid[0], detail, sizeof(detail)),
                     COLLD_OK);
    /* VMM: a POSIX fd of GPU 0 memory, where the device has VMM. */
    int vmm = 0;
    CU_MUST(cu->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev[0]));
    if (vmm) {
        CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 } };
        size_t gran = 0;
        CUmemGenericAllocationHandle mh = 0;
        CU_MUST(cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CU_MUST(cu->cuMemCreate(&mh, gran, &prop, 0));
        for (int i = 1; i >= 0; i--) { /* the lie, then the truth */
            int fd = -1;
            CU_MUST(cu->cuMemExportToShareableHandle(&fd, mh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
            st = register_raw(h, COLLD_CUDA_EXPORT_FD, NULL, fd, gran, &uuid[i], detail, sizeof(detail));
            close(fd);
            print_message("VMM fd of GPU 0 memory named as GPU %d's: %s: %s\n", i, colld_status_name(st), detail);
            if (i == 1) {
                assert_int_equal(st, COLLD_ERR_INVALID_ARGUMENT);
                assert_non_null(strstr(detail, "but the buffer is on GPU 0"));
            } else {
                assert_int_equal(st, COLLD_OK);
            }
        }
        CU_MUST(cu->cuMemRelease(mh));
    }
    assert_true(daemon_on_double(h->pid, true));
    CU_MUST(cu->cuMemFree(buf));
    cu->cuCtxSetCurrent(NULL);
    cu->cuDevicePrimaryCtxRelease(0);
}

/* A count-0 all-reduce of Y on stream b, waited for: into st, COLLD_OK when it ran. */
static void y_collective(rank_t *r, CUstream b, colld_status_t *st)
{
    *st = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
    if (*st == COLLD_OK && stream_done(b) != CUDA_SUCCESS)
        rank_fail(r, "stream B failed");
    if (*st == COLLD_OK)
        *st = colld_comm_synchronize(r->comm);
}

static void sc_handle_reuse(rank_t *r)
{
    CUstream b = NULL, a2 = NULL;
    CUdeviceptr gd[2] = { 0, 0 };
    uint32_t *gate[2] = { NULL, NULL };
    bool ok = cu->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
    if (r->rank == 0)
        ok = ok && (gate[0] = gate_new(&gd[0])) && (gate[1] = gate_new(&gd[1])) &&
             cu->cuStreamCreate(&a2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
    if (!ok)
        rank_fail(r, "gates or streams");
    /* X #1 (the flag area, slot 1), then rank 0's X #2 and #3 behind the gates. */
    if (ok && (colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s) != COLLD_OK ||
               cu->cuStreamSynchronize(r->s) != CUDA_SUCCESS || colld_comm_synchronize(r->comm) != COLLD_OK)) {
        rank_fail(r, "X's first collective failed: %s", colld_comm_last_error(r->comm));
        ok = false;
    }
    uint32_t handle = r->comm->handle;
    if (ok && r->rank == 0 &&
        (cu->cuStreamWaitValue32(r->s, gd[0], 1, CU_STREAM_WAIT_VALUE_EQ) != CUDA_SUCCESS ||
         colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s) != COLLD_OK ||
         cu->cuStreamWaitValue32(a2, gd[1], 1, CU_STREAM_WAIT_VALUE_EQ) != CUDA_SUCCESS ||
         colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, a2) != COLLD_OK)) {
        rank_fail(r, "X #2 and #3 behind the gates");
        ok = false;
    }
    pthread_barrier_wait(r->barrier);
    if (r->rank == 0 && colld_comm_abort(r->comm) != COLLD_OK)
        rank_fail(r, "colld_comm_abort of X");
    pthread_barrier_wait(r->barrier);
    colld_comm_destroy(r->comm);
    r->comm = NULL;
    if (r->rank == 0 && colld_get_unique_id(r->c, &reuse_id) != COLLD_OK)
        rank_fail(r, "a unique id for Y");
    pthread_barrier_wait(r->barrier); /* X is gone on both ranks; Y's id is there */
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = SHORT_TIMEOUT_MS; /* before the fix Y #1 times out: not after 30 s */
    colld_status_t st = colld_comm_init_rank(r->c, &r->comm, 2, reuse_id, r->rank, &cfg);
    if (st != COLLD_OK) {
        rank_fail(r, "colld_comm_init_rank of Y: %s", colld_status_name(st));
        r->comm = NULL;
        ok = false;
    }
    r->v[0] = r->comm && r->comm->handle == handle; /* the same flag line */
    if (ok && r->rank == 0) {
        r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
        if (r->st[0] == COLLD_OK && !word_is(colld__gpu_ready_word(r->comm, 1), r->comm->gpu_base + 1))
            rank_fail(r, "Y #1's ready write never landed");
        __atomic_store_n(gate[0], 1, __ATOMIC_RELEASE); /* X #2's write lands now, after Y #1's */
        r->cr[0] = stream_done(r->s);                    /* it has (its wait was released at the abort) */
    }
    pthread_barrier_wait(r->barrier);
    if (ok && r->rank == 1)
        r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
    if (ok && r->st[0] == COLLD_OK && stream_done(b) == CUDA_SUCCESS)
        r->st[0] = colld_comm_synchronize(r->comm); /* Y #1 */
    if (ok && r->st[0] == COLLD_OK)
        y_collective(r, b, &r->st[1]); /* Y #2 */
    /* Y #3: rank 0 first (with the helper), then rank 1 once X #3's write has landed. */
    bool y3 = ok && r->st[1] == COLLD_OK;
    if (y3 && r->rank == 0) {
        late_gate_t lg = { .gate = gate[1], .word = colld__gpu_ready_word(r->comm, 3),
                           .value = r->comm->gpu_base + 3 };
        pthread_t t;
        bool helper = lg.word && pthread_create(&t, NULL, late_gate_thread, &lg) == 0;
        if (!helper)
            rank_fail(r, "the gate helper");
        r->st[2] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
        if (helper)
            pthread_join(t, NULL);
        r->v[1] = lg.landed;
        r->cr[1] = stream_done(a2); /* X #3's write landed, its wait released */
    }
    pthread_barrier_wait(r->barrier);
    if (y3 && r->rank == 1)
        r->st[2] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
    if (y3 && r->st[2] == COLLD_OK && stream_done(b) == CUDA_SUCCESS)
        r->st[2] = colld_comm_synchronize(r->comm);
    for (int i = 0; i < 2; i++)
        if (gate[i])
            __atomic_store_n(gate[i], 1, __ATOMIC_RELEASE); /* whatever happened, rank 0's streams go on */
    pthread_barrier_wait(r->barrier);
    /* A stream still waiting (a regression: an earlier communicator's wait that the releases of
     * later ones took more than 2^31 past) is left alone, with its gate: a failure, not a hang. */
    bool drained = true;
    CUstream *mine[3] = { &b, &a2, &r->s };
    for (int i = 0; i < 3; i++) {
        if (*mine[i] && stream_done(*mine[i]) != CUDA_SUCCESS) {
            rank_fail(r, "rank %d's stream %d still waits after %d ms", r->rank, i, WAIT_MS);
            *mine[i] = NULL;
            drained = false;
        }
    }
    if (b)
        cu->cuStreamDestroy(b);
    if (a2)
        cu->cuStreamDestroy(a2);
    for (int i = 0; i < 2 && drained; i++)
        if (gate[i])
            gate_free(gate[i]);
}

static void test_handle_reuse_late_ready_write(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_handle_reuse, 0, ranks);
    assert_int_equal(ranks[0].cr[0], CUDA_SUCCESS); /* X #2's write landed, its wait released */
    assert_int_equal(ranks[0].cr[1], CUDA_SUCCESS); /* X #3's too */
    assert_int_equal(ranks[0].v[1], 0);             /* Y #3's post waited for X #3's write */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].v[0], 1);         /* Y on X's handle */
        assert_int_equal(ranks[i].st[0], COLLD_OK); /* Y #1: not broken by X #2's late write */
        assert_int_equal(ranks[i].st[1], COLLD_OK); /* Y #2, in the slot X #2's write landed in */
        assert_int_equal(ranks[i].st[2], COLLD_OK); /* Y #3, in the slot X #3's write was queued for */
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

/* ============================================================================================
 * An old driver
 * ========================================================================================== */

static void test_old_driver(void **state)
{
    harness_t *h = *state;
    void *p = (void *)1;
    assert_int_equal(colld_mem_alloc(h->client, &p, 4096, COLLD_MEM_CUDA), COLLD_ERR_NOT_SUPPORTED);
    const char *e = colld_last_error(h->client);
    print_message("%s\n", e);
    assert_non_null(strstr(e, "the NVIDIA driver lacks cuInit at the CUDA 12.0 ABI"));
    char log[8192];
    harness_read_file(h->log, log, sizeof(log));
    assert_non_null(strstr(log, "no CUDA backend: the NVIDIA driver lacks cuInit at the CUDA 12.0 ABI"));
}

/* ============================================================================================
 * A driver or a GPU that cannot run the daemon's kernels: refused at backend init
 * ========================================================================================== */

static char refusal[256]; /* what the daemon must say (set by main for the group) */

/* An all-reduce on the application's device memory (cuMemAlloc), which the daemon must refuse. */
static void sc_refused(rank_t *r)
{
    CUdeviceptr buf = 0;
    if ((r->cr[1] = cu->cuMemAlloc(&buf, COUNT * sizeof(float))) != CUDA_SUCCESS)
        return rank_fail(r, "cuMemAlloc: %s", rname(r->cr[1]));
    r->st[0] = colld_allreduce((void *)buf, (void *)buf, COUNT, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
    r->cr[0] = cu->cuStreamSynchronize(r->s); /* nothing of it may be left waiting */
    cu->cuMemFree(buf);
}

/* Issue 15 A1's gate: a driver older than what the embedded fatbin needs (group kernel_driver: a
 * CUDA 12.8 driver, enough for libcolld's 12.0 ABI), or GPUs the fatbin has no code for (group
 * old_gpu: compute capability 7.5), are refused when the daemon starts, with the reason in its log
 * and in every GPU request's answer; the daemon keeps serving host collectives. Before the fix
 * the backend started, and every launch failed (COLLD_ERR_DEVICE, "cudaGetDevice failed"). */
static void test_kernels_refused(void **state)
{
    harness_t *h = *state;
    char log[8192], want[320];
    harness_read_file(h->log, log, sizeof(log));
    snprintf(want, sizeof(want), "no CUDA backend: %s", refusal);
    if (!strstr(log, want))
        fail_msg("the daemon's log does not say \"%s\":\n%s", want, log);
    /* The answer to a GPU request carries the reason (its first words: the detail is bounded). */
    snprintf(want, sizeof(want), "no GPU here: %.48s", refusal);
    rank_t ranks[2];
    run_ranks(h, sc_refused, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_ERR_NOT_SUPPORTED);
        assert_non_null(strstr(ranks[i].detail, want));
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
    }
    /* Host collectives still work. */
    float x[4] = { 1, 2, 3, 4 };
    colld_comm_t *comm = NULL;
    colld_unique_id_t id;
    assert_int_equal(colld_get_unique_id(h->client, &id), COLLD_OK);
    assert_int_equal(colld_comm_init_rank(h->client, &comm, 1, id, 0, NULL), COLLD_OK);
    assert_int_equal(colld_allreduce(x, x, 4, COLLD_FLOAT32, COLLD_SUM, comm, NULL), COLLD_OK);
    assert_true(x[3] == 4.0f);
    colld_comm_destroy(comm);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* ============================================================================================
 * The review's defects, as the double shows them today: OPEN defects (group "open_defects")
 *
 * Each case asserts today's wrong behaviour, names the defect of issue 15 and where it lives,
 * and says what the fix must turn it into.
 * ========================================================================================== */

/* What the application calls beyond colld's own table (colld_cu_t): capture, graphs, reset. */
static struct {
    PFN_cuStreamBeginCapture_v10010 begin;
    PFN_cuStreamEndCapture_v10000 end;
    PFN_cuGraphInstantiateWithFlags_v11040 instantiate;
    PFN_cuGraphLaunch_v10000 launch;
    PFN_cuGraphGetNodes_v10000 nodes;
    PFN_cuGraphDestroy_v10000 destroy;
    PFN_cuGraphExecDestroy_v10000 exec_destroy;
    PFN_cuDevicePrimaryCtxReset_v11000 reset;
} app;


/* Those entry points, from the driver colld loaded. */
static bool app_load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    PFN_cuGetProcAddress_v12000 get = lib ? (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    void *f[8] = { NULL };
    const char *names[8] = { "cuStreamBeginCapture", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
                             "cuGraphLaunch",        "cuGraphGetNodes",    "cuGraphDestroy",
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

/* Issue 15 3.3, fixed: a collective on a stream being captured into a CUDA graph is captured (a
 * persistent plan in the daemon, client/cuda_graph.c), also as the client's first stream-ordered
 * collective: its registrations and the flag area's (cuMemHostRegister, in the RELAXED capture
 * mode) are made during the capture, which stays valid and holds colld's three memory operations.
 * Before: the call failed with COLLD_ERR_DEVICE and invalidated the capture (and then, once
 * refused, with COLLD_ERR_NOT_SUPPORTED). test_gpu_cudafake_graph replays every kind exactly. */
static void sc_capture_first(rank_t *r)
{
    r->cr[0] = app.begin(r->s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
    CUgraph g = NULL;
    r->cr[1] = app.end(r->s, &g);
    size_t n = 0;
    if (g && app.nodes(g, NULL, &n) == CUDA_SUCCESS)
        r->v[0] = (long)n;
    if (g)
        app.destroy(g);
    /* Outside the capture the communicator works. */
    r->st[1] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    r->cr[2] = cu->cuStreamSynchronize(r->s);
    r->st[2] = colld_comm_synchronize(r->comm);
}

static void test_capture_first_collective_captured_capture_valid(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_capture_first, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].cr[1], CUDA_SUCCESS); /* the capture was left valid */
        assert_int_equal(ranks[i].v[0], 3);             /* ready = 1, wait done == 1, done = 0 */
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].cr[2], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[2], COLLD_OK);
    }
}

/* With the flag area set up, a collective inside a capture: the graph holds its plan's three
 * memory operations, and each of three replays completes only once the daemon ran the plan (its
 * `done`); no replay fails or times out, and the communicator goes on outside the capture. Before:
 * the daemon timed the collective out at capture time and every replay passed without running
 * it; then it was refused (COLLD_ERR_NOT_SUPPORTED, an empty graph). */
static void sc_capture_replay(rank_t *r)
{
    r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    if (r->st[0] != COLLD_OK || cu->cuStreamSynchronize(r->s) != CUDA_SUCCESS || colld_comm_synchronize(r->comm))
        return rank_fail(r, "the collective before the capture failed");
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    if (app.begin(r->s, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS)
        return rank_fail(r, "cuStreamBeginCapture failed");
    r->st[1] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
    r->cr[0] = app.end(r->s, &g);
    size_t n = 0;
    if (g && app.nodes(g, NULL, &n) == CUDA_SUCCESS)
        r->v[0] = (long)n;
    if (g && app.instantiate(&x, g, 0) == CUDA_SUCCESS) {
        for (int i = 0; i < 3 && r->cr[1] == CUDA_SUCCESS; i++) {
            r->cr[1] = app.launch(x, r->s);
            if (r->cr[1] == CUDA_SUCCESS)
                r->cr[1] = cu->cuStreamSynchronize(r->s);
            r->v[1] += r->cr[1] == CUDA_SUCCESS;
        }
        app.exec_destroy(x);
    }
    if (g)
        app.destroy(g);
    r->st[2] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    r->cr[2] = cu->cuStreamSynchronize(r->s);
    r->st[3] = colld_comm_synchronize(r->comm); /* no replay failed, none timed out */
}

static void test_captured_collective_replays(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_capture_replay, SHORT_TIMEOUT_MS, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS); /* the capture ended fine */
        assert_int_equal(ranks[i].v[0], 3);             /* colld's three memory operations */
        assert_int_equal(ranks[i].v[1], 3);             /* every replay completed */
        assert_int_equal(ranks[i].st[2], COLLD_OK);
        assert_int_equal(ranks[i].cr[2], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[3], COLLD_OK);
    }
}

/* C1/D4: an implicitly registered buffer stayed mapped in the daemon after the application freed it
 * while its client stayed connected: a legacy IPC mapping of freed memory (undefined behaviour with
 * the driver), a VMM mapping that kept the GPU memory. Now libcolld drops a cached registration
 * whose allocation is gone (client/cuda.c sweep_freed: checked a few per post, all at a new
 * registration and at a communicator's destruction) and the daemon closes its mapping. Each rank
 * runs an all-reduce on a buffer, frees it, and destroys its communicator. */
static int defect_vmm; /* sc_freed: register VMM memory instead of cuMemAlloc memory */

static void sc_freed(rank_t *r)
{
    CUdeviceptr buf = 0, va = 0;
    CUmemGenericAllocationHandle h = 0;
    size_t gran = 0, bytes = COUNT * sizeof(float);
    if (defect_vmm) {
        CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = r->rank } };
        CUmemAccessDesc acc = { .location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        if (cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ||
            cu->cuMemCreate(&h, gran, &prop, 0) || cu->cuMemAddressReserve(&va, gran, 0, 0, 0) ||
            cu->cuMemMap(va, gran, 0, h, 0) || cu->cuMemSetAccess(va, gran, &acc, 1))
            return rank_fail(r, "VMM buffer");
        buf = va;
    } else if (cu->cuMemAlloc(&buf, bytes) != CUDA_SUCCESS) {
        return rank_fail(r, "cuMemAlloc");
    }
    r->st[0] = colld_allreduce((void *)buf, (void *)buf, COUNT, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
    r->cr[0] = cu->cuStreamSynchronize(r->s);
    r->st[1] = colld_comm_synchronize(r->comm); /* ran: the daemon has the buffer registered */
    CUpointer_attribute at = CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID;
    unsigned long long block = 0;
    void *data = &block;
    cu->cuPointerGetAttributes(1, &at, &data, buf);
    r->v[0] = (long)block;
    if (defect_vmm) {
        r->cr[1] = cu->cuMemUnmap(va, gran);
        cu->cuMemAddressFree(va, gran);
        cu->cuMemRelease(h); /* the application has let go of every reference */
    } else {
        r->cr[1] = cu->cuMemFree(buf);
    }
}

/* Does the daemon (pid) map a memfd named `name`? */
static bool daemon_maps(pid_t pid, const char *name)
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

static void test_freed_buffer_unmapped(void **state)
{
    harness_t *h = *state;
    for (defect_vmm = 0; defect_vmm <= 1; defect_vmm++) {
        rank_t ranks[2];
        run_ranks(h, sc_freed, 0, ranks);
        for (int i = 0; i < 2; i++) {
            assert_int_equal(ranks[i].st[0], COLLD_OK);
            assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
            assert_int_equal(ranks[i].st[1], COLLD_OK);
            assert_int_equal(ranks[i].cr[1], CUDA_SUCCESS);
        }
        /* Rank 0's client is still connected, but its communicator's destruction dropped the
         * registration of the buffer it freed (client/cuda.c sweep_freed): the daemon's mapping
         * went with it. Rank 1 disconnected: its session's registrations went with it too. */
        char name[128];
        if (defect_vmm) {
            CUuuid u0, u1;
            CU_MUST(cu->cuDeviceGetUuid(&u0, 0));
            CU_MUST(cu->cuDeviceGetUuid(&u1, 1));
            char hex0[33], hex1[33];
            for (int b = 0; b < 16; b++) {
                snprintf(hex0 + 2 * b, 3, "%02x", (unsigned char)u0.bytes[b]);
                snprintf(hex1 + 2 * b, 3, "%02x", (unsigned char)u1.bytes[b]);
            }
            snprintf(name, sizeof(name), "cudafake-vmm:%s", hex0);
            assert_false(daemon_maps(h->pid, name));
            snprintf(name, sizeof(name), "cudafake-vmm:%s", hex1);
            assert_false(daemon_maps(h->pid, name));
        } else {
            snprintf(name, sizeof(name), "cudafake-alloc:%d:%ld ", (int)getpid(), ranks[0].v[0]);
            assert_false(daemon_maps(h->pid, name));
            snprintf(name, sizeof(name), "cudafake-alloc:%d:%ld ", (int)getpid(), ranks[1].v[0]);
            assert_false(daemon_maps(h->pid, name));
        }
    }
}

/* D2: a buffer across two VMM allocations mapped back to back in one reservation (PyTorch's
 * expandable segments) is refused: the client registers the mapping that holds the pointer
 * (client/cuda.c resolve, cuMemGetAddressRange) and the buffer runs past it. Fix: register every
 * mapping the buffer covers. */
static void sc_multisegment(rank_t *r)
{
    CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                 .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                 .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = r->rank } };
    CUmemAccessDesc acc = { .location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    size_t g = 0;
    CUmemGenericAllocationHandle h[2];
    CUdeviceptr va = 0;
    if (cu->cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) || cu->cuMemCreate(&h[0], g, &prop, 0) ||
        cu->cuMemCreate(&h[1], g, &prop, 0) || cu->cuMemAddressReserve(&va, 2 * g, 0, 0, 0) ||
        cu->cuMemMap(va, g, 0, h[0], 0) || cu->cuMemMap(va + g, g, 0, h[1], 0) || cu->cuMemSetAccess(va, 2 * g, &acc, 1))
        return rank_fail(r, "two VMM allocations in one reservation");
    void *buf = (void *)(va + g - 4096);
    r->st[0] = colld_allreduce(buf, buf, 2048, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s); /* 8 KiB over the seam */
    snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
    cu->cuMemUnmap(va, 2 * g);
    cu->cuMemAddressFree(va, 2 * g);
    cu->cuMemRelease(h[0]);
    cu->cuMemRelease(h[1]);
}

static void test_open_defect_D2_multisegment_vmm_refused(void **state)
{
    open_defect("D2",
                "a buffer across two VMM allocations of one reservation is refused with COLLD_ERR_INVALID_ARGUMENT",
                "every mapping the buffer covers is registered and the collective runs");
    rank_t ranks[2];
    run_ranks(*state, sc_multisegment, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(ranks[i].detail, "bytes run past the end of its"));
    }
}

/* harness_test_teardown, then reset any of this process's device contexts that a case left with a
 * sticky error (a case that failed before its own reset), so that the next case starts clean. The
 * probe creates a stream (any synchronization could wait forever on a stream a failed case left
 * waiting for a daemon that is gone). */
static int teardown_contexts(void **state)
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

/* A host-only communicator: an all-reduce of host memory (no stream), the result exact. */
static void sc_host(rank_t *r)
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
    assert_true(log_says(launch_control, RESET_HELD, WAIT_MS));
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
    assert_true(log_says(launch_control, RESET_HELD, WAIT_MS));
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
    snprintf(launch_control, sizeof(launch_control), "/tmp/colld-cudafake-XXXXXX");
    int fd = mkstemp(launch_control);
    if (fd < 0)
        return -1;
    close(fd);
    if (!control_append("sticky:cuEventCreate:1-:CUDA_ERROR_ILLEGAL_ADDRESS"))
        return -1;
    setenv("COLLD_CUDAFAKE_CONTROL", launch_control, 1);
    int rc = setup_on_double(state);
    unsetenv("COLLD_CUDAFAKE_CONTROL");
    return rc;
}

/* A daemon whose double faults its first cuEventCreate (sticky, CUDA_ERROR_ILLEGAL_ADDRESS) and
 * holds its first cuDevicePrimaryCtxReset, reading launch_control for the case's later
 * instructions. */
static int setup_sticky(void **state)
{
    snprintf(launch_control, sizeof(launch_control), "/tmp/colld-cudafake-XXXXXX");
    int fd = mkstemp(launch_control);
    if (fd < 0)
        return -1;
    close(fd);
    if (!control_append("sticky:cuEventCreate:+1:CUDA_ERROR_ILLEGAL_ADDRESS") ||
        !control_append("hold:cuDevicePrimaryCtxReset:1"))
        return -1;
    setenv("COLLD_CUDAFAKE_CONTROL", launch_control, 1);
    int rc = setup_on_double(state);
    unsetenv("COLLD_CUDAFAKE_CONTROL");
    return rc;
}

/* Let the daemon's held reset go (a case that failed before it did), then stop the daemon. */
static int teardown_sticky(void **state)
{
    rank_device[1] = 1;
    control_append("release:hold");
    return teardown_launch_fault(state);
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

static int run_recovery(void)
{
    if (!app_load()) {
        printf("the driver has no cuDevicePrimaryCtxReset\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_flag_area_registered_again_after_reset, setup_on_double,
                                        teardown_contexts),
        cmocka_unit_test_setup_teardown(test_sticky_error_gpu_recovers, setup_sticky, teardown_sticky),
        cmocka_unit_test_setup_teardown(test_sticky_error_other_gpu_goes_on, setup_sticky, teardown_sticky),
        cmocka_unit_test_setup_teardown(test_sticky_error_gpu_given_up, setup_sticky_always, teardown_sticky),
    };
    return cmocka_run_group_tests_name("gpu_cudafake_recovery", tests, NULL, NULL);
}

/* Group open_defects: the defects still open; group defects: those fixed since, the cases that
 * pinned them rewritten to assert the fix (3.3's refusal, C1/D4). Both need the graph entry
 * points the application side uses (app_load). */
static int run_defects(bool fixed)
{
    if (!app_load()) {
        printf("the driver has no graph entry points\n");
        return 1;
    }
    const struct CMUnitTest open[] = {
        cmocka_unit_test_setup_teardown(test_open_defect_D2_multisegment_vmm_refused, setup_on_double,
                                        teardown_contexts),
    };
    const struct CMUnitTest closed[] = {
        cmocka_unit_test_setup_teardown(test_capture_first_collective_captured_capture_valid, setup_on_double,
                                        teardown_contexts),
        cmocka_unit_test_setup_teardown(test_captured_collective_replays, setup_on_double, teardown_contexts),
        cmocka_unit_test_setup_teardown(test_freed_buffer_unmapped, setup_on_double, teardown_contexts),
    };
    return fixed ? cmocka_run_group_tests_name("gpu_cudafake_defects", closed, NULL, NULL)
                 : cmocka_run_group_tests_name("gpu_cudafake_open_defects", open, NULL, NULL);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const char *group = argc > 1 ? argv[1] : "vmm";
    char err[256];
    int on_double = driver_is_double(); /* before colld's loader initialises whatever it finds */
    if (on_double < 0)
        return 1;
    cu = on_double ? colld_cu_load(err, sizeof(err)) : NULL;
    if (!on_double)
        snprintf(err, sizeof(err), "libcuda.so.1 not found");
    if (strcmp(group, "driver") == 0) {
        if (cu) {
            printf("the driver loaded; this group expects the test double configured as an old driver\n");
            return 1;
        }
        const struct CMUnitTest old[] = {
            cmocka_unit_test_setup_teardown(test_old_driver, setup_old_driver, harness_test_teardown),
        };
        return cmocka_run_group_tests_name("gpu_cudafake_driver", old, NULL, NULL);
    }
    if (!cu) {
        printf("no CUDA driver (%s): this test runs against the CUDA driver test double, through ctest; skipping\n",
               err);
        return 77;
    }
    int n = 0;
    if (cu->cuDeviceGetCount(&n) != CUDA_SUCCESS || n < 2) {
        printf("needs two (fake) GPUs, has %d; skipping\n", n);
        return 77;
    }
    /* As the CUDA runtime does: the process keeps its primary contexts until it exits (the rank
     * threads' retains and releases then never destroy them). */
    CUcontext keep[2];
    for (int i = 0; i < 2; i++)
        if (cu->cuDevicePrimaryCtxRetain(&keep[i], i) != CUDA_SUCCESS)
            return 1;
    if (strcmp(group, "open_defects") == 0 || strcmp(group, "defects") == 0)
        return run_defects(strcmp(group, "defects") == 0);
    if (strcmp(group, "recovery") == 0 || strcmp(group, "recovery_legacy") == 0)
        return run_recovery();
    if (strcmp(group, "kernel_driver") == 0 || strcmp(group, "old_gpu") == 0) {
        if (strcmp(group, "kernel_driver") == 0)
            snprintf(refusal, sizeof(refusal),
                     "the NVIDIA driver supports CUDA 12.8; colld's GPU kernels were built with CUDA %d.%d and "
                     "need a driver for %d.0 or newer: update the driver",
                     CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10, CUDA_VERSION / 1000);
        else
            snprintf(refusal, sizeof(refusal),
                     "GPU 0 (CUDA driver test double device 0) has compute capability 7.5; colld's GPU kernels "
                     "are built for 8.0 and newer");
        const struct CMUnitTest refused[] = {
            cmocka_unit_test_setup_teardown(test_kernels_refused, setup_on_double, harness_test_teardown),
        };
        return cmocka_run_group_tests_name(group, refused, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mem_alloc_cuda, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_flag_protocol, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_collectives_driver_launch, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_partial_launch_failure_releases_streams, setup_launch_fault,
                                        teardown_launch_fault),
        cmocka_unit_test_setup_teardown(test_break_during_failed_launch_releases_streams, setup_launch_fault,
                                        teardown_launch_fault),
        cmocka_unit_test_setup_teardown(test_break_during_launch_releases_streams, setup_launch_hold,
                                        teardown_launch_fault),
        cmocka_unit_test_setup_teardown(test_ready_slot_per_collective, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_ready_slots_bound, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_handle_reuse_late_ready_write, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_registration_device_checked, setup_on_double, harness_test_teardown),
    };
    return cmocka_run_group_tests_name(group, tests, NULL, NULL);
}
