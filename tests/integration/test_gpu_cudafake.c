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
 *     legacy_stream_bare_thread  an all-reduce on the legacy default stream (NULL) from a thread
 *                     with no current context (torch_colld's worker; failed on an H200 before the
 *                     fix): the buffers' primary context is made current, the result exact
 *     call_budget     the driver calls of a warm stream-ordered all-reduce's host call, counted
 *                     by the double, each function's count exact: 6 (11 before issue 28 item 2's
 *                     caches, 13 before an in-place call queried once)
 *     stream_only_waits  53 collectives on 16-entry rings, each waited for by its stream alone
 *                     (never through colld): the completion ring never fills (hung on an H200
 *                     after 256 before the fix)
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
 *     nan check       --nan-check on GPU buffers (issue 30): poisoned inputs fail the collective on
 *                     both ranks naming each rank's first NaN or infinity, as on the host; without
 *                     the option they are data; clean runs with it are exact (test_gpu_cudafake_nan.c)
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
 *                 freed buffer's mapping goes from the daemon (C1/D4); a buffer across several VMM
 *                 allocations works, and hostile segments of its registration are refused (D2).
 *   open_defects  the review's defects that the double shows, STILL OPEN: each case
 *                 (test_open_defect_<id>_...) asserts the present, wrong behaviour, prints
 *                 "OPEN DEFECT <id>" with what the fix must turn it into, and passes while the
 *                 defect is there. A fix makes its case fail: then the case is rewritten to assert
 *                 the right behaviour (and loses "open_defect" from its name). A pass here is never
 *                 a feature. None is open today (D2, the last, was fixed): the group runs no case
 *                 and says so; it stays for the next defect the double shows.
 *
 * The cases live in one file per topic, sharing harness_gpu.c (harness_gpu.h lists them); this one
 * holds main, what works (mem_alloc, flag_protocol, collectives) and the refusals of an old driver
 * and of kernels the driver or the GPUs cannot run.
 *
 * Every group first checks that the libcuda.so.1 it finds is the test double (it alone exports
 * colld_cudafake_control), before any CUDA call, and that the daemon maps no other libcuda and no
 * NCCL: a real driver is never initialised by this test.
 */
#include "tests/integration/harness_gpu.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A thread of the application with no current CUDA context (torch_colld's worker, which issues
 * the caller's operations) posts an all-reduce on the legacy default stream (NULL). Found on an
 * H200 with torch 2.11: every such call failed with "stream (nil): cuStreamIsCapturing:
 * CUDA_ERROR_INVALID_CONTEXT" (the capture check asked about the current context's legacy stream
 * before libcolld made the buffers' primary context current). Now the thread gets the buffers'
 * primary context, the collective is ordered on that context's legacy stream, the result exact. */
typedef struct {
    rank_t *r;
    void *buf;
    colld_status_t st;
    CUcontext before, after;
} bare_thread_t;

static void *bare_thread(void *arg)
{
    bare_thread_t *b = arg;
    cu->cuCtxGetCurrent(&b->before);
    b->st = colld_allreduce(b->buf, b->buf, N_AR, COLLD_FLOAT32, COLLD_SUM, b->r->comm, NULL);
    cu->cuCtxGetCurrent(&b->after);
    return NULL;
}

static void sc_legacy_stream_bare_thread(rank_t *r)
{
    static float host[2][N_AR];
    CUdeviceptr buf = 0;
    CUresult cr;
    if ((cr = cu->cuMemAlloc(&buf, N_AR * sizeof(float))) != CUDA_SUCCESS)
        return rank_fail(r, "cuMemAlloc: %s", rname(cr));
    bare_thread_t b = { .r = r, .buf = (void *)(uintptr_t)buf, .before = (CUcontext)1 };
    pthread_t t;
    if (fill(r, buf, buf, N_AR, 0, host[r->rank]) && pthread_create(&t, NULL, bare_thread, &b) == 0) {
        pthread_join(t, NULL);
        r->st[0] = b.st;
        snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
        CUcontext mine = NULL;
        cu->cuCtxGetCurrent(&mine);
        if (b.before != NULL || b.after != mine)
            rank_fail(r, "the thread's context: %p before (want none), %p after (want the primary %p)",
                      (void *)b.before, (void *)b.after, (void *)mine);
        /* The rank's thread holds the same primary context: its legacy stream is the one used. */
        else if (b.st == COLLD_OK && (r->cr[0] = cu->cuStreamSynchronize(CU_STREAM_LEGACY)) == CUDA_SUCCESS &&
                 (r->st[1] = colld_comm_synchronize(r->comm)) == COLLD_OK)
            expect_values(r, "all-reduce on the legacy stream from a thread without a context", buf, N_AR,
                          host[r->rank], want_sum);
    }
    pthread_barrier_wait(r->barrier);
    cu->cuMemFree(buf);
}

static void test_legacy_stream_bare_thread(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_legacy_stream_bare_thread, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].v[0], 1); /* the result exact */
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

/* An application that observes its stream-ordered collectives through its stream alone, never
 * through colld (torch_colld's CUDA path, any NCCL program that only synchronizes its streams),
 * with the daemon's rings at 16 entries: 3 x 16 + 5 collectives, each waited for by
 * cuStreamSynchronize only. Found on an H200 with torch 2.11: after 256 collectives (the default
 * rings) the daemon took no more descriptors (it needs a free completion slot, and nobody reaped
 * the completion ring), so the 257th stream waited for ever. Now every stream-ordered post reaps
 * first. */
#define SMALL_RING 16

static void sc_stream_only(rank_t *r)
{
    for (int i = 0; i < 3 * SMALL_RING + 5; i++) {
        r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
        if (r->st[0] != COLLD_OK || (r->cr[0] = stream_released(r)) != CUDA_SUCCESS)
            return;
        r->v[0]++;
    }
    r->st[1] = colld_comm_synchronize(r->comm);
}

static int setup_small_rings(void **state)
{
    char n[16];
    snprintf(n, sizeof(n), "%d", SMALL_RING);
    setenv("COLLD_RING_ENTRIES", n, 1); /* the daemon's --ring-entries, for this start only */
    int rc = setup_on_double(state);
    unsetenv("COLLD_RING_ENTRIES");
    return rc;
}

static void test_stream_only_waits(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_stream_only, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].v[0], 3 * SMALL_RING + 5);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

/* The host call's driver calls (issue 28 item 2): what libcolld asks the driver for each
 * stream-ordered in-place all-reduce on a buffer and a stream it has used before, counted by the
 * CUDA driver test double (colld_cudafake_calls). Both ranks are threads of this process, so the
 * counts are summed over both and over CALLS collectives each; the application's own waits
 * (stream_released's cuStreamQuery) are not counted. Today 6, each asserted exactly: the thread's
 * current context (cuCtxGetCurrent), the capture check (cuStreamIsCapturing), the stream's id
 * (cuStreamGetId: the key of the cache of its context, device and the flag area's registration
 * there), the buffer's id (cuPointerGetAttributes, one attribute: an allocation freed and made
 * again at the same address has another) and the two stream memory operations. It was 11 before
 * the caches (cuCtxGetCurrent x3, cuStreamGetCtx, cuCtxGetDevice, cuPointerGetAttributes x2 (the
 * buffer's query and a cached registration checked for a free per post),
 * cuMemHostGetDevicePointer), 13 before an in-place call queried once. The test fails when a
 * change adds a driver call to the host call, or moves one; what each costs is measured by
 * bench/hostcall.c. */
#define CALLS 20
static const char *const counted[] = {
    "cuCtxGetCurrent", "cuCtxGetDevice", "cuCtxGetId", "cuCtxPopCurrent", "cuCtxPushCurrent", "cuCtxSetCurrent",
    "cuDeviceGet", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease",
    "cuEventQuery", "cuEventRecord", "cuIpcGetMemHandle", "cuMemGetAddressRange",
    "cuMemHostGetDevicePointer", "cuMemHostRegister", "cuMemRetainAllocationHandle", "cuMemRelease",
    "cuPointerGetAttribute", "cuPointerGetAttributes", "cuStreamGetCaptureInfo", "cuStreamGetCtx", "cuStreamGetFlags",
    "cuStreamGetId", "cuStreamIsCapturing", "cuStreamWaitValue32", "cuStreamWriteValue32",
    "cuStreamBatchMemOp", "cuThreadExchangeStreamCaptureMode", "cuMemGetAllocationPropertiesFromHandle",
};
#define NCOUNTED (sizeof(counted) / sizeof(counted[0]))
/* The calls of one host call; every other counted function: none. */
static const struct {
    const char *name;
    unsigned per_call;
} budget[] = {
    { "cuCtxGetCurrent", 1 },        { "cuStreamIsCapturing", 1 },  { "cuStreamGetId", 1 },
    { "cuPointerGetAttributes", 1 }, { "cuStreamWriteValue32", 1 }, { "cuStreamWaitValue32", 1 },
};
#define BUDGET_TOTAL 6u
static unsigned long long (*calls_of)(const char *);
static unsigned long long before[NCOUNTED], after[NCOUNTED];

static void sc_call_budget(rank_t *r)
{
    static float host[2][N_AR];
    CUdeviceptr buf = 0;
    CUresult cr;
    if ((cr = cu->cuMemAlloc(&buf, N_AR * sizeof(float))) != CUDA_SUCCESS)
        return rank_fail(r, "cuMemAlloc: %s", rname(cr));
    if (!fill(r, buf, buf, N_AR, 0, host[r->rank]))
        goto out;
    for (int i = 0; i < 2 + CALLS; i++) {
        if (i == 2) { /* warm: the buffer registered, the flag area set up */
            pthread_barrier_wait(r->barrier);
            if (r->rank == 0)
                for (size_t k = 0; k < NCOUNTED; k++)
                    before[k] = calls_of(counted[k]);
            pthread_barrier_wait(r->barrier);
        }
        r->st[0] = colld_allreduce((void *)buf, (void *)buf, N_AR, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
        if (r->st[0] != COLLD_OK || (r->cr[0] = stream_released(r)) != CUDA_SUCCESS)
            goto out;
        r->v[0]++;
    }
    pthread_barrier_wait(r->barrier);
    if (r->rank == 0)
        for (size_t k = 0; k < NCOUNTED; k++)
            after[k] = calls_of(counted[k]);
out:
    pthread_barrier_wait(r->barrier);
    cu->cuMemFree(buf);
}

static void test_call_budget(void **state)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(lib);
    calls_of = (unsigned long long (*)(const char *))dlsym(lib, "colld_cudafake_calls");
    assert_non_null(calls_of);
    rank_t ranks[2];
    run_ranks(*state, sc_call_budget, 0, ranks);
    dlclose(lib);
    for (int i = 0; i < 2; i++)
        assert_int_equal(ranks[i].v[0], 2 + CALLS);
    unsigned long long total = 0;
    for (size_t k = 0; k < NCOUNTED; k++) {
        unsigned long long n = after[k] - before[k];
        total += n;
        if (n)
            print_message("%-40s %6.2f per collective\n", counted[k], (double)n / (2.0 * CALLS));
    }
    print_message("%-40s %6.2f per collective\n", "all counted", (double)total / (2.0 * CALLS));
    for (size_t k = 0; k < NCOUNTED; k++) {
        unsigned long long want = 0;
        for (size_t b = 0; b < sizeof(budget) / sizeof(budget[0]); b++)
            if (strcmp(budget[b].name, counted[k]) == 0)
                want = budget[b].per_call * 2ull * CALLS;
        if (after[k] - before[k] != want)
            fail_msg("%s: %llu calls in %d host calls, %llu expected", counted[k], after[k] - before[k], 2 * CALLS,
                     want);
    }
    assert_true(total == BUDGET_TOTAL * 2ull * CALLS);
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
 * The groups
 * ========================================================================================== */

/* Every topic file's cases, in this order (harness_gpu.h). */
static gpu_cases_t (*const topics[])(const char *group) = {
    gpu_launch_cases, gpu_ready_cases, gpu_capture_cases, gpu_reg_cases,
    gpu_recovery_cases, gpu_release_cases, gpu_nan_cases,
};

/* Run the group's cases: `first` (this file's), then every topic's. */
static int run_group(const char *group, const struct CMUnitTest *first, size_t nfirst)
{
    size_t n = nfirst;
    gpu_cases_t parts[sizeof(topics) / sizeof(topics[0])];
    for (size_t i = 0; i < sizeof(topics) / sizeof(topics[0]); i++) {
        parts[i] = topics[i](group);
        n += parts[i].n;
    }
    struct CMUnitTest *all = calloc(n ? n : 1, sizeof(*all));
    if (!all)
        return 1;
    size_t k = 0;
    for (size_t i = 0; i < nfirst; i++)
        all[k++] = first[i];
    for (size_t i = 0; i < sizeof(topics) / sizeof(topics[0]); i++)
        for (size_t j = 0; j < parts[i].n; j++)
            all[k++] = parts[i].tests[j];
    if (n == 0)
        printf("group %s has no case today\n", group);
    char name[64];
    snprintf(name, sizeof(name), "gpu_cudafake_%s", group);
    int rc = _cmocka_run_group_tests(name, all, n, NULL, NULL);
    free(all);
    return rc;
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
    /* The graph, capture and reset entry points of the application's side (capture, recovery,
     * teardown_contexts). */
    if (!app_load()) {
        printf("the driver lacks the graph or reset entry points the application side uses\n");
        return 1;
    }
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
    static const struct CMUnitTest works[] = {
        cmocka_unit_test_setup_teardown(test_mem_alloc_cuda, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_flag_protocol, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_collectives_driver_launch, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_legacy_stream_bare_thread, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_stream_only_waits, setup_small_rings, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_call_budget, setup_on_double, harness_test_teardown),
    };
    static const char *const basic[] = { "vmm", "legacy", NULL };
    static const char *const known[] = {
        "vmm", "legacy", "recovery", "recovery_legacy", "defects", "open_defects", NULL
    };
    if (!group_is(group, known)) {
        printf("unknown group %s\n", group);
        return 1;
    }
    return group_is(group, basic) ? run_group(group, works, sizeof(works) / sizeof(works[0]))
                                  : run_group(group, NULL, 0);
}
