/*
 * test_cudafake_graph.c - stream capture, graphs and user objects of the CUDA driver test double
 * (part of test_cudafake; see test_cudafake.c for the devices and the helpers).
 */
#include "tests/cudafake/test_cudafake.h"

#include "kernels/cuda/cuda_plan.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COPY_BYTE COLLD__CUDA_STR(COLLD__CUDA_COPY_KERNEL(1))

static atomic_int host_calls;

static void count_call(void *arg)
{
    (void)arg;
    atomic_fetch_add(&host_calls, 1);
}

static CUstream new_stream(unsigned flags)
{
    CUstream s;
    CU_OK(cu.cuStreamCreate(&s, flags));
    return s;
}

static CUstreamCaptureStatus capture_status(CUstream s)
{
    CUstreamCaptureStatus st = (CUstreamCaptureStatus)-1;
    CU_OK(cu.cuStreamIsCapturing(s, &st));
    return st;
}

/* ============================================================================================
 * Capture and replay
 * ========================================================================================== */

void test_capture_replay(void **state)
{
    (void)state;
    cf_use(DEV_A);
    uint32_t *f;
    CUdeviceptr d = cf_flags(&f);
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    /* A kernel node: colld's byte copy kernel, from a PTX image naming it. */
    static const char ptx[] = ".version 8.0\n.target sm_90\n.visible .entry " COPY_BYTE "(\n.param .u64 p)\n{\n}\n";
    CUlibrary lib;
    CUkernel k;
    CU_OK(cu.cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CU_OK(cu.cuLibraryGetKernel(&k, lib, COPY_BYTE));
    CUdeviceptr src, dst;
    CU_OK(cu.cuMemAlloc(&src, 64));
    CU_OK(cu.cuMemAlloc(&dst, 64));
    unsigned char pattern[64], got[64];
    for (int i = 0; i < 64; i++)
        pattern[i] = (unsigned char)(3 * i + 1);
    CU_OK(cu.cuMemcpyHtoD(src, pattern, sizeof(pattern)));
    void *outs[1] = { (void *)dst };
    colld__cuda_copy_params_t cp;
    size_t work;
    assert_int_equal(colld__cuda_copy_plan((void *)src, outs, 1, 64, &cp, &work), COLLD_OK);
    assert_int_equal(cp.unit, 16);
    /* Not that kernel: the byte one, which every layout accepts. */
    cp.unit = 1;
    cp.head = 0;
    cp.nunits = 64;
    CUevent ev;
    CU_OK(cu.cuEventCreate(&ev, 0));
    atomic_store(&host_calls, 0);

    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    assert_int_equal(capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CU_OK(cu.cuStreamWriteValue32(s, d, 1, 0));
    CU_OK(cu.cuLaunchHostFunc(s, count_call, NULL));
    void *args[] = { &cp };
    CU_OK(cu.cuLaunchKernel((CUfunction)k, 1, 1, 1, 8, 1, 1, 0, s, args, NULL));
    CU_OK(cu.cuStreamWaitValue32(s, d + 4, 1, CU_STREAM_WAIT_VALUE_GEQ));
    CU_OK(cu.cuEventRecordWithFlags(ev, s, CU_EVENT_RECORD_EXTERNAL));
    CUstreamCaptureStatus st;
    cuuint64_t id = 0;
    CUgraph during = NULL;
    const CUgraphNode *deps = NULL;
    const CUgraphEdgeData *edges = NULL;
    size_t ndeps = 0;
    CU_OK(cu.cuStreamGetCaptureInfo(s, &st, &id, &during, &deps, &edges, &ndeps));
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_true(id != 0 && during != NULL && ndeps == 1 && deps[0] != NULL && edges != NULL);
    /* Nothing ran. */
    cf_pause();
    assert_int_equal(__atomic_load_n(&f[0], __ATOMIC_ACQUIRE), 0);
    assert_int_equal(atomic_load(&host_calls), 0);
    CUgraph g;
    CU_OK(cu.cuStreamEndCapture(s, &g));
    assert_ptr_equal(g, during);
    assert_int_equal(capture_status(s), CU_STREAM_CAPTURE_STATUS_NONE);
    CU_OK(cu.cuStreamGetCaptureInfo(s, &st, NULL, NULL, NULL, NULL, NULL));
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
    size_t n = 0;
    CU_OK(cu.cuGraphGetNodes(g, NULL, &n));
    assert_int_equal(n, 5);
    CUgraphExec x;
    CU_OK(cu.cuGraphInstantiateWithFlags(&x, g, 0));
    CU_OK(cu.cuGraphDestroy(g)); /* the executable graph does not need it */
    memset(pattern + 32, 0, 32);
    CU_OK(cu.cuMemcpyHtoD(src + 32, pattern + 32, 32)); /* the replay reads src as it is then */
    __atomic_store_n(&f[1], 1, __ATOMIC_RELEASE);
    /* Every replay runs every node once, in order. */
    for (int round = 1; round <= 3; round++) {
        __atomic_store_n(&f[0], 0, __ATOMIC_RELEASE);
        CU_OK(cu.cuMemsetD8(dst, 0xff, 64));
        CU_OK(cu.cuCtxSynchronize());
        CU_OK(cu.cuGraphLaunch(x, s));
        CU_OK(cu.cuStreamSynchronize(s));
        assert_int_equal(f[0], 1);
        assert_int_equal(atomic_load(&host_calls), round);
        CU_OK(cu.cuMemcpyDtoH(got, dst, sizeof(got)));
        assert_memory_equal(got, pattern, sizeof(got));
        CU_OK(cu.cuEventQuery(ev));
    }
    CU_OK(cu.cuGraphExecDestroy(x));
    CU_IS(cu.cuGraphLaunch(x, s), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuEventDestroy(ev));
    CU_OK(cu.cuMemFree(src));
    CU_OK(cu.cuMemFree(dst));
    CU_OK(cu.cuLibraryUnload(lib));
    CU_OK(cu.cuStreamDestroy(s));
    cf_flags_free(f);
}

/* ============================================================================================
 * What capture refuses
 * ========================================================================================== */

typedef struct {
    CUresult alloc, end;
    CUstream s;
} other_t;

/* Another thread: the end of capture o->s, or else a cuMemAlloc (while this thread's capture runs). */
static void *other_thread(void *arg)
{
    other_t *o = arg;
    CU_OK(cu.cuCtxSetCurrent(cf_ctx[DEV_A]));
    if (o->s) {
        CUgraph g;
        o->end = cu.cuStreamEndCapture(o->s, &g);
        return NULL;
    }
    CUdeviceptr p;
    o->alloc = cu.cuMemAlloc(&p, 64);
    if (o->alloc == CUDA_SUCCESS)
        CU_OK(cu.cuMemFree(p));
    return NULL;
}

static void from_other_thread(other_t *o)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_thread, o), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
}

/* End the capture of s expecting `want`; a failed capture gives no graph. */
static void end_expect(CUstream s, CUresult want)
{
    CUgraph g = (CUgraph)1;
    CU_IS(cu.cuStreamEndCapture(s, &g), want);
    if (want == CUDA_SUCCESS)
        CU_OK(cu.cuGraphDestroy(g));
    else
        assert_null(g);
}

void test_capture_refusals(void **state)
{
    (void)state;
    cf_use(DEV_A);
    uint32_t *f;
    CUdeviceptr d = cf_flags(&f);
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING), blocking = new_stream(0);
    CUdeviceptr p;
    CU_IS(cu.cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CUgraph g;
    CU_IS(cu.cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);

    /* Global mode: a potentially unsafe call from any thread fails and invalidates. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_IS(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
    other_t o = { 0 };
    from_other_thread(&o);
    CU_IS(o.alloc, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(capture_status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CU_IS(cu.cuStreamWriteValue32(s, d, 1, 0), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    end_expect(s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* Thread-local mode: other threads may; this one may not. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    o = (other_t){ 0 };
    from_other_thread(&o);
    CU_OK(o.alloc);
    CU_IS(cu.cuMemAlloc(&p, 64), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_expect(s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* Relaxed mode: allowed. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_OK(cu.cuMemAlloc(&p, 64));
    CU_OK(cu.cuMemFree(p));
    end_expect(s, CUDA_SUCCESS);
    /* Synchronizing or querying a capturing stream, in any mode. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_IS(cu.cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_expect(s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_IS(cu.cuStreamQuery(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_expect(s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* The legacy stream while a blocking stream captures. */
    CU_OK(cu.cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
    CUstreamCaptureStatus st;
    CU_IS(cu.cuStreamIsCapturing(CU_STREAM_LEGACY, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CU_IS(cu.cuStreamWriteValue32(CU_STREAM_LEGACY, d, 1, 0), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    end_expect(blocking, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CU_OK(cu.cuStreamIsCapturing(CU_STREAM_LEGACY, &st));
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
    /* An event recorded outside the capture: only as an external wait. */
    CUevent outside, inside;
    CU_OK(cu.cuEventCreate(&outside, 0));
    CU_OK(cu.cuEventCreate(&inside, 0));
    CU_OK(cu.cuEventRecord(outside, blocking));
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_IS(cu.cuStreamWaitEvent(s, outside, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    end_expect(s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cu.cuStreamWaitEvent(s, outside, CU_EVENT_WAIT_EXTERNAL));
    /* An event recorded in a capture is not a completed thing one can query. */
    CU_OK(cu.cuEventRecord(inside, s));
    CU_IS(cu.cuEventQuery(inside), CUDA_ERROR_CAPTURED_EVENT);
    /* Ended by another thread in global mode: refused; a graph launch inside: invalidates. */
    o = (other_t){ .s = s };
    from_other_thread(&o);
    CU_IS(o.end, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    end_expect(s, CUDA_SUCCESS);
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cu.cuStreamWriteValue32(s, d, 1, 0));
    CU_OK(cu.cuStreamEndCapture(s, &g));
    CUgraphExec x;
    CU_OK(cu.cuGraphInstantiateWithFlags(&x, g, 0));
    CU_OK(cu.cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_IS(cu.cuGraphLaunch(x, blocking), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_expect(blocking, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CU_OK(cu.cuGraphExecDestroy(x));
    CU_OK(cu.cuGraphDestroy(g));
    CU_OK(cu.cuEventDestroy(outside));
    CU_OK(cu.cuEventDestroy(inside));
    CU_OK(cu.cuStreamDestroy(s));
    CU_OK(cu.cuStreamDestroy(blocking));
    cf_flags_free(f);
}

/* ============================================================================================
 * Fork and join
 * ========================================================================================== */

void test_capture_fork_join(void **state)
{
    (void)state;
    cf_use(DEV_A);
    uint32_t *f;
    CUdeviceptr d = cf_flags(&f);
    CUstream origin = new_stream(CU_STREAM_NON_BLOCKING), side = new_stream(CU_STREAM_NON_BLOCKING),
             third = new_stream(CU_STREAM_NON_BLOCKING);
    CUevent fork, back, other;
    CU_OK(cu.cuEventCreate(&fork, 0));
    CU_OK(cu.cuEventCreate(&back, 0));
    CU_OK(cu.cuEventCreate(&other, 0));
    CU_OK(cu.cuStreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cu.cuStreamWriteValue32(origin, d, 1, 0));
    CU_OK(cu.cuEventRecord(fork, origin));
    CU_OK(cu.cuStreamWaitEvent(side, fork, 0)); /* side joins the capture */
    assert_int_equal(capture_status(side), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CU_OK(cu.cuStreamWriteValue32(side, d + 4, 2, 0));
    CU_OK(cu.cuEventRecord(back, side));
    CU_OK(cu.cuStreamWaitEvent(origin, back, 0)); /* and joins back */
    CU_OK(cu.cuStreamWriteValue32(origin, d + 8, 3, 0));
    /* A second capture cannot merge with this one. */
    CU_OK(cu.cuStreamBeginCapture(third, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_OK(cu.cuEventRecord(other, third));
    CU_IS(cu.cuStreamWaitEvent(origin, other, 0), CUDA_ERROR_STREAM_CAPTURE_MERGE);
    end_expect(third, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    end_expect(origin, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_int_equal(capture_status(side), CU_STREAM_CAPTURE_STATUS_NONE);

    /* The same, without the merge attempt: three nodes, replayed. */
    CU_OK(cu.cuStreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cu.cuStreamWriteValue32(origin, d, 1, 0));
    CU_OK(cu.cuEventRecord(fork, origin));
    CU_OK(cu.cuStreamWaitEvent(side, fork, 0));
    CU_OK(cu.cuStreamWriteValue32(side, d + 4, 2, 0));
    CU_OK(cu.cuEventRecord(back, side));
    CU_OK(cu.cuStreamWaitEvent(origin, back, 0));
    CU_OK(cu.cuStreamWriteValue32(origin, d + 8, 3, 0));
    CUgraph g;
    CU_OK(cu.cuStreamEndCapture(origin, &g));
    size_t n = 0;
    CU_OK(cu.cuGraphGetNodes(g, NULL, &n));
    assert_int_equal(n, 3);
    CUgraphExec x;
    CU_OK(cu.cuGraphInstantiateWithFlags(&x, g, 0));
    CU_OK(cu.cuGraphLaunch(x, third));
    CU_OK(cu.cuStreamSynchronize(third));
    assert_true(f[0] == 1 && f[1] == 2 && f[2] == 3);
    CU_OK(cu.cuGraphExecDestroy(x));
    CU_OK(cu.cuGraphDestroy(g));
    /* A fork that never joins back fails the capture. */
    CU_OK(cu.cuStreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cu.cuEventRecord(fork, origin));
    CU_OK(cu.cuStreamWaitEvent(side, fork, 0));
    CU_OK(cu.cuStreamWriteValue32(side, d + 4, 2, 0));
    end_expect(origin, CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    assert_int_equal(capture_status(side), CU_STREAM_CAPTURE_STATUS_NONE);
    CU_OK(cu.cuEventDestroy(fork));
    CU_OK(cu.cuEventDestroy(back));
    CU_OK(cu.cuEventDestroy(other));
    CU_OK(cu.cuStreamDestroy(origin));
    CU_OK(cu.cuStreamDestroy(side));
    CU_OK(cu.cuStreamDestroy(third));
    cf_flags_free(f);
}

/* ============================================================================================
 * User objects and launch order
 * ========================================================================================== */

static uint32_t destroyed;

static void destroy_object(void *arg)
{
    __atomic_store_n((uint32_t *)arg, 1, __ATOMIC_RELEASE);
}

void test_graph_user_objects(void **state)
{
    (void)state;
    cf_use(DEV_A);
    uint32_t *f;
    CUdeviceptr d = cf_flags(&f);
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    CUuserObject obj, obj2;
    CU_IS(cu.cuUserObjectCreate(&obj, &destroyed, destroy_object, 1, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuUserObjectCreate(&obj, &destroyed, destroy_object, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
    /* The graph takes the caller's reference (MOVE) during the capture, as colld's plans will. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureStatus st;
    CUgraph g;
    CU_OK(cu.cuStreamGetCaptureInfo(s, &st, NULL, &g, NULL, NULL, NULL));
    CU_OK(cu.cuGraphRetainUserObject(g, obj, 1, CU_GRAPH_USER_OBJECT_MOVE));
    CU_OK(cu.cuStreamWaitValue32(s, d, 1, CU_STREAM_WAIT_VALUE_EQ));
    CU_OK(cu.cuStreamEndCapture(s, &g));
    CU_IS(cu.cuGraphReleaseUserObject(g, obj, 2), CUDA_ERROR_INVALID_VALUE);
    CUgraphExec x;
    CU_OK(cu.cuGraphInstantiateWithFlags(&x, g, 0));
    CU_OK(cu.cuGraphDestroy(g)); /* the executable graph still holds a reference */
    cf_pause();
    assert_int_equal(__atomic_load_n(&destroyed, __ATOMIC_ACQUIRE), 0);
    /* Destroyed with a launch pending (blocked on f[0]): released once the launch has finished. */
    CU_OK(cu.cuGraphLaunch(x, s));
    CU_OK(cu.cuGraphExecDestroy(x));
    cf_pause();
    assert_int_equal(__atomic_load_n(&destroyed, __ATOMIC_ACQUIRE), 0);
    __atomic_store_n(&f[0], 1, __ATOMIC_RELEASE);
    CU_OK(cu.cuStreamSynchronize(s));
    assert_true(cf_wait_eq(&destroyed, 1)); /* on the double's own thread */
    /* Releasing more references than held is refused. */
    CU_OK(cu.cuUserObjectCreate(&obj2, &f[1], destroy_object, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
    CU_IS(cu.cuUserObjectRelease(obj2, 2), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuUserObjectRelease(obj2, 1));
    assert_true(cf_wait_eq(&f[1], 1));
    CU_IS(cu.cuUserObjectRelease(obj2, 1), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuStreamDestroy(s));
    cf_flags_free(f);
}

/* Two launches of one executable graph on two streams: the second waits for the first. */
void test_graph_launch_order(void **state)
{
    (void)state;
    cf_use(DEV_A);
    uint32_t *f;
    CUdeviceptr d = cf_flags(&f);
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING);
    atomic_store(&host_calls, 0);
    CU_OK(cu.cuStreamBeginCapture(a, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cu.cuLaunchHostFunc(a, count_call, NULL));
    CUgraph g;
    CU_OK(cu.cuStreamEndCapture(a, &g));
    CUgraphExec x;
    CU_OK(cu.cuGraphInstantiateWithFlags(&x, g, 0));
    CU_OK(cu.cuStreamWaitValue32(a, d, 1, CU_STREAM_WAIT_VALUE_EQ));
    CU_OK(cu.cuGraphLaunch(x, a));
    CU_OK(cu.cuGraphLaunch(x, b));
    cf_pause();
    CU_IS(cu.cuStreamQuery(b), CUDA_ERROR_NOT_READY);
    assert_int_equal(atomic_load(&host_calls), 0);
    __atomic_store_n(&f[0], 1, __ATOMIC_RELEASE);
    CU_OK(cu.cuStreamSynchronize(b));
    assert_int_equal(atomic_load(&host_calls), 2);
    CU_OK(cu.cuGraphExecDestroy(x));
    CU_OK(cu.cuGraphDestroy(g));
    CU_OK(cu.cuStreamDestroy(a));
    CU_OK(cu.cuStreamDestroy(b));
    cf_flags_free(f);
}

/* ============================================================================================
 * The thread's capture interaction mode, and destructors that call the driver
 * ========================================================================================== */

/* Another thread in THREAD_LOCAL mode: a potentially unsafe call while a GLOBAL capture runs
 * elsewhere. */
static void *thread_local_alloc(void *arg)
{
    CUresult *out = arg;
    CU_OK(cu.cuCtxSetCurrent(cf_ctx[DEV_A]));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    CU_OK(cu.cuThreadExchangeStreamCaptureMode(&mode));
    CUdeviceptr p;
    *out = cu.cuMemAlloc(&p, 64);
    if (*out == CUDA_SUCCESS)
        CU_OK(cu.cuMemFree(p));
    return NULL;
}

static CUresult dtor_call = CUDA_SUCCESS;

/* A destructor that breaks the driver's rule: it calls the driver. */
static void destroy_calling_cuda(void *arg)
{
    CUcontext ctx = NULL;
    __atomic_store_n(&dtor_call, cu.cuCtxGetCurrent(&ctx), __ATOMIC_RELEASE);
    __atomic_store_n((uint32_t *)arg, 1, __ATOMIC_RELEASE);
}

/* cuThreadExchangeStreamCaptureMode (cuda.h): the calling thread's mode decides whether a
 * potentially unsafe call may run during a capture. GLOBAL (the default): not while its own
 * capture is not RELAXED, nor while another thread's GLOBAL capture runs; THREAD_LOCAL: only its
 * own capture counts; RELAXED: always (libcolld registers its GPU flag area so inside a capture).
 * And a user object's destructor may not call the driver at all. */
void test_capture_mode_exchange(void **state)
{
    (void)state;
    cf_use(DEV_A);
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    CUstreamCaptureMode mode = (CUstreamCaptureMode)7;
    CU_IS(cu.cuThreadExchangeStreamCaptureMode(&mode), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cu.cuThreadExchangeStreamCaptureMode(NULL), CUDA_ERROR_INVALID_VALUE);
    void *page = NULL;
    assert_int_equal(posix_memalign(&page, 4096, 4096), 0);
    /* This thread's own GLOBAL capture: RELAXED lets it register host memory, the capture stays
     * valid; back in GLOBAL mode the same call fails and invalidates it. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CU_OK(cu.cuThreadExchangeStreamCaptureMode(&mode));
    assert_int_equal(mode, CU_STREAM_CAPTURE_MODE_GLOBAL); /* the previous mode */
    CU_OK(cu.cuMemHostRegister(page, 4096, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
    CU_OK(cu.cuMemHostUnregister(page));
    CU_OK(cu.cuThreadExchangeStreamCaptureMode(&mode));
    assert_int_equal(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
    assert_int_equal(capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    end_expect(s, CUDA_SUCCESS);
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_IS(cu.cuMemHostRegister(page, 4096, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_expect(s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* Another thread in THREAD_LOCAL mode is not held to this thread's GLOBAL capture. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUresult other = CUDA_ERROR_UNKNOWN;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, thread_local_alloc, &other), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    CU_OK(other);
    end_expect(s, CUDA_SUCCESS);
    free(page);
    /* A destructor that calls the driver gets CUDA_ERROR_NOT_PERMITTED. */
    uint32_t ran = 0;
    CUuserObject obj;
    CU_OK(cu.cuUserObjectCreate(&obj, &ran, destroy_calling_cuda, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
    CU_OK(cu.cuUserObjectRelease(obj, 1));
    assert_true(cf_wait_eq(&ran, 1));
    CU_IS(__atomic_load_n(&dtor_call, __ATOMIC_ACQUIRE), CUDA_ERROR_NOT_PERMITTED);
    CU_OK(cu.cuStreamDestroy(s));
}
