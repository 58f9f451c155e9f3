/*
 * test_cudafake.c - the CUDA driver test double's own unit test (ctest cudafake, labels
 * unit;cudafake). It needs no GPU: it loads the double by path, with three devices
 *   A (fake-h100, cc 9.0, flush)   B (fake-a100, cc 8.0, 256 MiB)   ISO (peer group 1: no P2P
 *   with A or B; no stream memory operations, no VMM, no legacy IPC)
 * and checks every behaviour README.md promises: the entry point lookup and colld's loader on it,
 * devices and attributes, contexts, memory and pointer attributes, host registration, stream
 * memory operations (the cyclic GEQ included), legacy default stream semantics, events, kernel
 * launches of colld's real fatbin on host builds, legacy IPC and VMM across processes (the helper
 * colld-cudafake-helper), fault injection, the old-driver gate; test_cudafake_graph.c does capture,
 * graphs and user objects.
 */
#include "tests/cudafake/test_cudafake.h"

#include "common/cudadrv.h"
#include "kernels/cuda/cuda_plan.h"
#include "tests/gpu/gpu_rank_kernels.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

cf_api_t cu;
CUcontext cf_ctx[3];
static char control_path[64];

/* ============================================================================================
 * Helpers (test_cudafake.h)
 * ========================================================================================== */

static const char *rname(CUresult r)
{
    const char *n = NULL;
    if (!cu.cuGetErrorName || cu.cuGetErrorName(r, &n) != CUDA_SUCCESS || !n)
        return "(unknown CUresult)";
    return n;
}

void cf_expect(CUresult got, CUresult want, const char *expr, const char *file, int line)
{
    if (got != want) {
        char a[64], b[64];
        snprintf(a, sizeof(a), "%s", rname(got));
        snprintf(b, sizeof(b), "%s", rname(want));
        print_error("%s:%d: %s returned %s (%d), expected %s\n", file, line, expr, a, (int)got, b);
        _fail(file, line);
    }
}

void cf_use(int dev)
{
    CU_OK(cu.cuCtxSetCurrent(cf_ctx[dev]));
}

CUdeviceptr cf_flags(uint32_t **host)
{
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    CU_OK(cu.cuMemHostRegister(p, 4096, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
    CUdeviceptr d = 0;
    CU_OK(cu.cuMemHostGetDevicePointer(&d, p, 0));
    *host = p;
    return d;
}

void cf_flags_free(uint32_t *host)
{
    CU_OK(cu.cuMemHostUnregister(host));
    munmap(host, 4096);
}

bool cf_wait_eq(const uint32_t *p, uint32_t want)
{
    for (int i = 0; i < 20000; i++) {
        if (__atomic_load_n(p, __ATOMIC_ACQUIRE) == want)
            return true;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    return false;
}

void cf_pause(void)
{
    struct timespec ts = { 0, 50000000 };
    nanosleep(&ts, NULL);
}

void cf_helper(char *out, size_t len, const char *const *args, const char *const *env, int keep)
{
    const char *argv[16] = { CUDAFAKE_HELPER };
    int na = 1;
    for (; args[na - 1] && na < 15; na++)
        argv[na] = args[na - 1];
    argv[na] = NULL;
    /* The environment: ours, with the double's directory in LD_LIBRARY_PATH and the overrides. */
    char libdir[512], ld[600];
    snprintf(libdir, sizeof(libdir), "%s", CUDAFAKE_LIB);
    *strrchr(libdir, '/') = '\0';
    snprintf(ld, sizeof(ld), "LD_LIBRARY_PATH=%s", libdir);
    const char *envp[256];
    int ne = 0;
    envp[ne++] = ld;
    for (int i = 0; env && env[i]; i++)
        if (env[i][strlen(env[i]) - 1] != '=')
            envp[ne++] = env[i];
    for (char **e = environ; *e && ne < 255; e++) {
        bool overridden = strncmp(*e, "LD_LIBRARY_PATH=", 16) == 0;
        for (int i = 0; env && env[i] && !overridden; i++)
            overridden = strncmp(*e, env[i], (size_t)(strchr(env[i], '=') - env[i] + 1)) == 0;
        if (!overridden)
            envp[ne++] = *e;
    }
    envp[ne] = NULL;
    int pipefd[2];
    assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    if (keep >= 0)
        posix_spawn_file_actions_adddup2(&fa, keep, 100);
    pid_t pid;
    int rc = posix_spawn(&pid, CUDAFAKE_HELPER, &fa, NULL, (char *const *)argv, (char *const *)envp);
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    assert_int_equal(rc, 0);
    size_t got = 0;
    ssize_t n;
    while (got < len - 1 && (n = read(pipefd[0], out + got, len - 1 - got)) > 0)
        got += (size_t)n;
    out[got] = '\0';
    close(pipefd[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    char *nl = strchr(out, '\n');
    if (nl && strcmp(args[0], "devices") != 0)
        *nl = '\0';
    print_message("helper %s: %s\n", args[0], out);
}

/* ============================================================================================
 * Entry points, colld's loader, devices
 * ========================================================================================== */

/* Runs first: nothing but the lookup works before cuInit. */
static void test_proc_address(void **state)
{
    (void)state;
    int n;
    CU_IS(cu.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    CU_OK(cu.cuInit(0));
    CU_OK(cu.cuDeviceGetCount(&n));
    assert_int_equal(n, 3);
    int v;
    CU_OK(cu.cuDriverGetVersion(&v));
    assert_int_equal(v, 13000);

    void *a = NULL, *b = NULL;
    CUdriverProcAddressQueryResult q;
    CU_OK(cu.get_proc("cuStreamGetCaptureInfo", &a, 12000, 0, &q)); /* _v2: six parameters */
    assert_int_equal(q, CU_GET_PROC_ADDRESS_SUCCESS);
    CU_OK(cu.get_proc("cuStreamGetCaptureInfo", &b, 12030, 0, &q)); /* _v3: seven */
    assert_non_null(a);
    assert_non_null(b);
    assert_ptr_not_equal(a, b);
    CU_OK(cu.get_proc("cuEventElapsedTime", &a, 12000, 0, &q));
    CU_OK(cu.get_proc("cuEventElapsedTime", &b, 12080, 0, &q));
    assert_ptr_not_equal(a, b);
    /* Not offered by the double: CUDA_SUCCESS, NULL, SYMBOL_NOT_FOUND (as the driver for an unknown
     * symbol). */
    a = (void *)1;
    CU_OK(cu.get_proc("cuCtxCreate", &a, 12000, 0, &q));
    assert_null(a);
    assert_int_equal(q, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    CU_OK(cu.get_proc("cuLibraryLoadData", &a, 11080, 0, &q));
    assert_null(a);
    assert_int_equal(q, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    CU_IS(cu.get_proc("cuMemAlloc", &a, 14000, 0, &q), CUDA_ERROR_INVALID_VALUE); /* newer than the driver */
    CU_IS(cu.get_proc("cuMemAlloc", &a, 12000, 4, &q), CUDA_ERROR_INVALID_VALUE); /* unknown flag */

    const char *s;
    CU_OK(cu.cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &s));
    assert_string_equal(s, "CUDA_ERROR_ILLEGAL_ADDRESS");
    CU_OK(cu.cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
    assert_string_equal(s, "out of memory");
    CU_IS(cu.cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    assert_null(s);
}

/* colld's loader (common/cudadrv.c) in this process, and in another one against an old driver. */
static void test_colld_loader(void **state)
{
    (void)state;
    char err[256] = "";
    const colld_cu_t *t = colld_cu_load(err, sizeof(err));
    if (!t)
        fail_msg("colld_cu_load: %s", err);
    assert_int_equal(t->driver_version, 13000);
    void *w = NULL;
    CU_OK(cu.get_proc("cuStreamWriteValue32", &w, 12000, 0, NULL));
    assert_ptr_equal((void *)t->cuStreamWriteValue32, w); /* the V2 entry point, not the V1 one */
    char out[512];
    const char *args[] = { "loader", NULL };
    cf_helper(out, sizeof(out), args, (const char *const[]){ "COLLD_CUDAFAKE_DRIVER_VERSION=12080", NULL }, -1);
    assert_string_equal(out, "ok 12080");
    cf_helper(out, sizeof(out), args, (const char *const[]){ "COLLD_CUDAFAKE_DRIVER_VERSION=11080", NULL }, -1);
    assert_non_null(strstr(out, "fail the NVIDIA driver lacks cuInit at the CUDA 12.0 ABI"));
    cf_helper(out, sizeof(out), args, (const char *const[]){ "COLLD_CUDAFAKE_DEVICES=0", NULL }, -1);
    assert_non_null(strstr(out, "CUDA_ERROR_NO_DEVICE"));
    cf_helper(out, sizeof(out), args, (const char *const[]){ "COLLD_CUDAFAKE_DEVICES=cc=nine", NULL }, -1);
    assert_non_null(strstr(out, "cuInit failed: CUDA_ERROR_INVALID_VALUE"));
}

static void test_devices(void **state)
{
    (void)state;
    char name[64];
    CU_OK(cu.cuDeviceGetName(name, sizeof(name), DEV_B));
    assert_string_equal(name, "fake-a100");
    CU_IS(cu.cuDeviceGetName(name, sizeof(name), 3), CUDA_ERROR_INVALID_DEVICE);
    CUdevice d;
    CU_IS(cu.cuDeviceGet(&d, 3), CUDA_ERROR_INVALID_DEVICE);
    CUuuid u0, u1;
    CU_OK(cu.cuDeviceGetUuid(&u0, DEV_A));
    CU_OK(cu.cuDeviceGetUuid(&u1, DEV_B));
    assert_memory_not_equal(u0.bytes, u1.bytes, 16);
    assert_int_equal((unsigned char)u1.bytes[0], 0xab); /* from the uuid= key */
    struct {
        CUdevice_attribute a;
        int dev, want;
    } attrs[] = {
        { CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, DEV_A, 9 },
        { CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, DEV_B, 8 },
        { CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, DEV_A, 1 },
        { CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, DEV_B, 0 },
        { CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, DEV_A, 0 },
        { CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, DEV_A, 1 },
        { CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, DEV_ISO, 0 },
        { CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, DEV_A, 1 },
        { CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, DEV_ISO, 0 },
        { CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, DEV_A, 1 },
        { CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, DEV_B, 108 },
        { CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, DEV_A, 1 },
        { CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, DEV_A, 1024 },
    };
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        int v = -1;
        CU_OK(cu.cuDeviceGetAttribute(&v, attrs[i].a, attrs[i].dev));
        if (v != attrs[i].want)
            fail_msg("attribute %d of device %d is %d, expected %d", attrs[i].a, attrs[i].dev, v, attrs[i].want);
    }
    int v;
    CU_IS(cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH, DEV_A), CUDA_ERROR_INVALID_VALUE);
    size_t mem;
    CU_OK(cu.cuDeviceTotalMem(&mem, DEV_B));
    assert_int_equal(mem, 256u << 20);
    int can[3][3];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            CU_OK(cu.cuDeviceCanAccessPeer(&can[i][j], i, j));
    assert_int_equal(can[DEV_A][DEV_B], 1);
    assert_int_equal(can[DEV_B][DEV_A], 1);
    assert_int_equal(can[DEV_A][DEV_A], 0);
    assert_int_equal(can[DEV_A][DEV_ISO], 0);
    /* CUDA_VISIBLE_DEVICES, in another process: reordered, and cut at the first invalid entry. */
    char out[512];
    const char *args[] = { "devices", NULL };
    cf_helper(out, sizeof(out), args, (const char *const[]){ "CUDA_VISIBLE_DEVICES=2,0,7,1", NULL }, -1);
    assert_string_equal(out, "2\nfake-isolated\nfake-h100\n");
}

/* ============================================================================================
 * Contexts
 * ========================================================================================== */

static void test_contexts(void **state)
{
    (void)state;
    CUcontext c = NULL;
    CU_OK(cu.cuCtxSetCurrent(NULL));
    CU_OK(cu.cuCtxSetCurrent(NULL)); /* popping an empty stack: nothing */
    CU_OK(cu.cuCtxGetCurrent(&c));
    assert_null(c);
    CUdeviceptr p;
    CU_IS(cu.cuMemAlloc(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cu.cuCtxPopCurrent(&c), CUDA_ERROR_INVALID_CONTEXT);
    CUdevice dev;
    CU_IS(cu.cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
    /* The stack. */
    CU_OK(cu.cuCtxPushCurrent(cf_ctx[DEV_A]));
    CU_OK(cu.cuCtxPushCurrent(cf_ctx[DEV_B]));
    CU_OK(cu.cuCtxGetDevice(&dev));
    assert_int_equal(dev, DEV_B);
    CU_OK(cu.cuCtxPopCurrent(&c));
    assert_ptr_equal(c, cf_ctx[DEV_B]);
    CU_OK(cu.cuCtxGetDevice(&dev));
    assert_int_equal(dev, DEV_A);
    CU_OK(cu.cuCtxSetCurrent(cf_ctx[DEV_B])); /* replaces the top */
    CU_OK(cu.cuCtxPopCurrent(&c));
    assert_ptr_equal(c, cf_ctx[DEV_B]);
    CU_IS(cu.cuCtxPopCurrent(&c), CUDA_ERROR_INVALID_CONTEXT);
    /* A primary context lives while retained: its last release frees its memory. */
    unsigned flags;
    int active;
    CU_OK(cu.cuDevicePrimaryCtxGetState(DEV_ISO, &flags, &active));
    assert_int_equal(active, 1);
    CUcontext iso;
    CU_OK(cu.cuDevicePrimaryCtxRetain(&iso, DEV_ISO));
    assert_ptr_equal(iso, cf_ctx[DEV_ISO]);
    CU_OK(cu.cuCtxSetCurrent(iso));
    CU_OK(cu.cuMemAlloc(&p, 4096));
    CU_OK(cu.cuDevicePrimaryCtxRelease(DEV_ISO)); /* still retained once */
    unsigned int mt = 0;
    CU_OK(cu.cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p));
    CU_OK(cu.cuDevicePrimaryCtxRelease(DEV_ISO)); /* the last one: destroyed */
    CU_OK(cu.cuDevicePrimaryCtxGetState(DEV_ISO, &flags, &active));
    assert_int_equal(active, 0);
    CU_IS(cu.cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cu.cuMemAlloc(&p, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CU_OK(cu.cuDevicePrimaryCtxRetain(&cf_ctx[DEV_ISO], DEV_ISO));
    CU_IS(cu.cuDevicePrimaryCtxRelease(3), CUDA_ERROR_INVALID_DEVICE);
    /* Peer access. */
    cf_use(DEV_A);
    CU_OK(cu.cuCtxEnablePeerAccess(cf_ctx[DEV_B], 0));
    CU_IS(cu.cuCtxEnablePeerAccess(cf_ctx[DEV_B], 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    CU_IS(cu.cuCtxEnablePeerAccess(cf_ctx[DEV_ISO], 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    CU_IS(cu.cuCtxEnablePeerAccess(cf_ctx[DEV_A], 0), CUDA_ERROR_INVALID_DEVICE);
    CU_IS(cu.cuCtxEnablePeerAccess(cf_ctx[DEV_B], 1), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuCtxDisablePeerAccess(cf_ctx[DEV_B]));
    CU_IS(cu.cuCtxDisablePeerAccess(cf_ctx[DEV_B]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
}

/* ============================================================================================
 * Memory
 * ========================================================================================== */

static void test_memory(void **state)
{
    (void)state;
    cf_use(DEV_B);
    CUdeviceptr a, b;
    CU_OK(cu.cuMemAlloc(&a, 1000));
    CU_OK(cu.cuMemAlloc(&b, 1000));
    assert_true(a % 256 == 0 && b % 256 == 0);
    /* Pointer attributes, at their documented widths, of an interior pointer. */
    enum { MT, BUF, ORD, IPC, START, SIZE, CTX, MANAGED, MAPPED, N };
    CUpointer_attribute at[N] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                  CU_POINTER_ATTRIBUTE_CONTEXT,
                                  CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                  CU_POINTER_ATTRIBUTE_MAPPED };
    unsigned int mt = 9;
    unsigned long long buf = 0, buf_b = 0;
    int ord = -1;
    bool ipc = false, managed = true, mapped = false;
    CUdeviceptr start = 0;
    size_t size = 0;
    CUcontext ctx = NULL;
    void *data[N] = { &mt, &buf, &ord, &ipc, &start, &size, &ctx, &managed, &mapped };
    CU_OK(cu.cuPointerGetAttributes(N, at, data, a + 10));
    assert_int_equal(mt, CU_MEMORYTYPE_DEVICE);
    assert_int_equal(ord, DEV_B);
    assert_true(ipc && mapped && !managed);
    assert_int_equal(start, a);
    assert_int_equal(size, 1000);
    assert_ptr_equal(ctx, cf_ctx[DEV_B]);
    CU_OK(cu.cuPointerGetAttribute(&buf_b, CU_POINTER_ATTRIBUTE_BUFFER_ID, b));
    assert_true(buf != 0 && buf != buf_b);
    CUdeviceptr base;
    CU_OK(cu.cuMemGetAddressRange(&base, &size, a + 999));
    assert_int_equal(base, a);
    assert_int_equal(size, 1000);
    CU_IS(cu.cuMemGetAddressRange(&base, &size, a + 1000), CUDA_ERROR_NOT_FOUND);
    /* Copies and memset. */
    unsigned char in[1000], out[1000];
    for (int i = 0; i < 1000; i++)
        in[i] = (unsigned char)(i * 7);
    CU_OK(cu.cuMemcpyHtoD(a, in, sizeof(in)));
    CU_OK(cu.cuMemsetD8(a + 100, 0xee, 50));
    CU_OK(cu.cuMemcpyDtoH(out, a, sizeof(out)));
    for (int i = 0; i < 1000; i++)
        assert_int_equal(out[i], i >= 100 && i < 150 ? 0xee : (unsigned char)(i * 7));
    /* Host memory the driver does not know: the plural call succeeds with zero values. */
    int local;
    mt = 9;
    CU_OK(cu.cuPointerGetAttributes(1, at, data, (CUdeviceptr)(uintptr_t)&local));
    assert_int_equal(mt, 0);
    CU_IS(cu.cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)&local),
          CUDA_ERROR_INVALID_VALUE);
    /* Free, reuse of the address with a new buffer id, errors. */
    CU_IS(cu.cuMemFree(a + 8), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemFree(a));
    CU_IS(cu.cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cu.cuMemcpyDtoH(out, a, 16), CUDA_ERROR_ILLEGAL_ADDRESS); /* sticky now */
    CU_IS(cu.cuMemAlloc(&a, 1000), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_OK(cu.cuDevicePrimaryCtxReset(DEV_B)); /* frees b too */
    CU_OK(cu.cuMemAlloc(&a, 1000));
    CU_OK(cu.cuPointerGetAttribute(&buf_b, CU_POINTER_ATTRIBUTE_BUFFER_ID, a));
    assert_true(buf_b != buf);
    CU_OK(cu.cuMemFree(a));
    /* Device B has 256 MiB. */
    CU_IS(cu.cuMemAlloc(&a, 300u << 20), CUDA_ERROR_OUT_OF_MEMORY);
    CU_IS(cu.cuMemAlloc(&a, 0), CUDA_ERROR_INVALID_VALUE);
}

static void test_host_register(void **state)
{
    (void)state;
    cf_use(DEV_A);
    uint32_t *h;
    CUdeviceptr d = cf_flags(&h);
    assert_int_equal(d, (CUdeviceptr)(uintptr_t)h); /* CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM */
    CU_IS(cu.cuMemHostRegister(h + 16, 64, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CUdeviceptr d2;
    CU_OK(cu.cuMemHostGetDevicePointer(&d2, h + 3, 0));
    assert_int_equal(d2, d + 12);
    unsigned int mt;
    CU_OK(cu.cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 8));
    assert_int_equal(mt, CU_MEMORYTYPE_HOST);
    CU_OK(cu.cuStreamWriteValue32(CU_STREAM_LEGACY, d + 8, 77, 0));
    CU_OK(cu.cuCtxSynchronize());
    assert_int_equal(h[2], 77);
    CU_IS(cu.cuMemHostUnregister(h + 1), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    cf_flags_free(h);
    /* Without DEVICEMAP there is no device pointer. */
    void *p = aligned_alloc(4096, 4096);
    CU_OK(cu.cuMemHostRegister(p, 4096, 0));
    CU_IS(cu.cuMemHostGetDevicePointer(&d2, p, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemHostUnregister(p));
    free(p);
    /* A stream memory operation on unregistered host memory faults when it runs: sticky. */
    cf_use(DEV_B);
    uint32_t plain = 0;
    CU_OK(cu.cuStreamWriteValue32(CU_STREAM_LEGACY, (CUdeviceptr)(uintptr_t)&plain, 1, 0));
    CU_IS(cu.cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(plain, 0);
    CUstream s;
    CU_IS(cu.cuStreamCreate(&s, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    unsigned long long id_before, id_after, sid_before, sid_after;
    CU_OK(cu.cuCtxGetId(NULL, &id_before));
    CU_OK(cu.cuStreamGetId(CU_STREAM_LEGACY, &sid_before));
    CU_OK(cu.cuDevicePrimaryCtxReset(DEV_B));
    /* A reset context keeps its handle, not its id (nor its legacy stream's): libcolld's host-call
     * caches rely on this (issue 28 item 2). */
    CU_OK(cu.cuCtxGetId(cf_ctx[DEV_B], &id_after));
    CU_OK(cu.cuStreamGetId(CU_STREAM_LEGACY, &sid_after));
    assert_true(id_after != id_before);
    assert_true(sid_after != sid_before);
    CU_OK(cu.cuStreamCreate(&s, 0));
    CU_OK(cu.cuStreamGetId(s, &sid_before));
    CU_OK(cu.cuStreamDestroy(s));
    CU_OK(cu.cuStreamCreate(&s, 0)); /* perhaps the same handle: another id */
    CU_OK(cu.cuStreamGetId(s, &sid_after));
    assert_true(sid_after != sid_before);
    CU_OK(cu.cuStreamDestroy(s));
    /* A registration belongs to the context it was made in, portable or not: a reset of that
     * context drops it (seen from another context too), and the memory can be registered again
     * from another one (libcolld's flags_check, the daemon's recovery rely on this). */
    h = NULL;
    d = cf_flags(&h); /* in B */
    cf_use(DEV_A);
    CU_OK(cu.cuMemHostGetDevicePointer(&d2, h, 0)); /* portable: seen from A */
    assert_int_equal(d2, d);
    CU_OK(cu.cuDevicePrimaryCtxReset(DEV_B));
    CU_IS(cu.cuMemHostGetDevicePointer(&d2, h, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemHostRegister(h, 4096, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
    CU_OK(cu.cuMemHostGetDevicePointer(&d2, h, 0));
    CU_OK(cu.cuStreamWriteValue32(CU_STREAM_LEGACY, d2 + 4, 9, 0));
    CU_OK(cu.cuCtxSynchronize());
    assert_int_equal(h[1], 9);
    cf_flags_free(h);
}

/* ============================================================================================
 * Stream memory operations
 * ========================================================================================== */

/* Enqueue a wait of (value, flags) on f[0] followed by a write of 1 to f[1]; then check whether
 * the write happens (expected: the wait is satisfied by f[0] == cur). */
static void wait_case(CUstream s, uint32_t *f, CUdeviceptr d, uint32_t cur, uint32_t value, unsigned flags,
                      bool satisfied)
{
    __atomic_store_n(&f[0], cur, __ATOMIC_RELEASE);
    __atomic_store_n(&f[1], 0, __ATOMIC_RELEASE);
    CU_OK(cu.cuStreamWaitValue32(s, d, value, flags));
    CU_OK(cu.cuStreamWriteValue32(s, d + 4, 1, 0));
    if (satisfied) {
        CU_OK(cu.cuStreamSynchronize(s));
    } else {
        cf_pause();
        CU_IS(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY);
        if (__atomic_load_n(&f[1], __ATOMIC_ACQUIRE) != 0)
            fail_msg("wait(*addr = 0x%x, value 0x%x, flags %u) was satisfied", cur, value, flags);
        __atomic_store_n(&f[0], value, __ATOMIC_RELEASE); /* satisfies every kind but NOR */
        if ((flags & 3) == CU_STREAM_WAIT_VALUE_NOR)
            __atomic_store_n(&f[0], ~value & 0x0000ffffu, __ATOMIC_RELEASE);
        CU_OK(cu.cuStreamSynchronize(s));
    }
    assert_int_equal(__atomic_load_n(&f[1], __ATOMIC_ACQUIRE), 1);
}

static void test_memops(void **state)
{
    (void)state;
    cf_use(DEV_A);
    uint32_t *f;
    CUdeviceptr d = cf_flags(&f);
    CUstream s;
    CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    /* GEQ is (int32_t)(*addr - value) >= 0: cyclic. */
    wait_case(s, f, d, 5, 5, CU_STREAM_WAIT_VALUE_GEQ, true);
    wait_case(s, f, d, 2, 0xfffffff0u, CU_STREAM_WAIT_VALUE_GEQ, true);     /* wrapped past: done */
    wait_case(s, f, d, 0x80000010u, 0x10, CU_STREAM_WAIT_VALUE_GEQ, false); /* 2^31 ahead: not */
    wait_case(s, f, d, 0x7fffffffu, 0, CU_STREAM_WAIT_VALUE_GEQ, true);
    wait_case(s, f, d, 0xfffffff0u, 5, CU_STREAM_WAIT_VALUE_GEQ, false); /* unsigned greater, cyclically behind */
    wait_case(s, f, d, 4, 5, CU_STREAM_WAIT_VALUE_GEQ, false);
    wait_case(s, f, d, 6, 5, CU_STREAM_WAIT_VALUE_EQ, false);
    wait_case(s, f, d, 0x10, 0x11, CU_STREAM_WAIT_VALUE_AND, true);
    wait_case(s, f, d, 0x10, 0x01, CU_STREAM_WAIT_VALUE_AND, false);
    wait_case(s, f, d, 0xffff0000u, 0x0000ff00u, CU_STREAM_WAIT_VALUE_NOR, true);
    wait_case(s, f, d, 0xffff00ffu, 0xff00ff00u, CU_STREAM_WAIT_VALUE_NOR, false);
    wait_case(s, f, d, 9, 9, CU_STREAM_WAIT_VALUE_GEQ | CU_STREAM_WAIT_VALUE_FLUSH, true); /* A can flush */
    /* 64-bit: (int64_t)(*addr - value) >= 0. */
    uint64_t *f64 = (uint64_t *)(f + 4);
    __atomic_store_n(f64, 0x100000000ull, __ATOMIC_RELEASE);
    CU_OK(cu.cuStreamWaitValue64(s, d + 16, 0xffffffffull, CU_STREAM_WAIT_VALUE_GEQ));
    CU_OK(cu.cuStreamWriteValue64(s, d + 24, 0x123456789ull, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER));
    CU_OK(cu.cuStreamSynchronize(s));
    assert_int_equal(*(uint64_t *)(f + 6), 0x123456789ull);
    /* A batch: write then wait. */
    CUstreamBatchMemOpParams ops[2];
    memset(ops, 0, sizeof(ops));
    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[0].writeValue.address = d + 32;
    ops[0].writeValue.value = 41;
    ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    ops[1].waitValue.address = d + 32;
    ops[1].waitValue.value = 41;
    ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    CU_OK(cu.cuStreamBatchMemOp(s, 2, ops, 0));
    CU_OK(cu.cuStreamSynchronize(s));
    assert_int_equal(f[8], 41);
    /* Refused at the call. */
    CU_IS(cu.cuStreamWriteValue32(s, d + 2, 1, 0), CUDA_ERROR_INVALID_VALUE); /* misaligned */
    CU_IS(cu.cuStreamWaitValue32(s, d, 1, 7), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cu.cuStreamWriteValue32(s, d, 1, 2), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cu.cuStreamBatchMemOp(s, 300, ops, 0), CUDA_ERROR_INVALID_VALUE);
    void *v1 = NULL;
    CU_OK(cu.get_proc("cuStreamWriteValue32", &v1, 11000, 0, NULL)); /* the V1 API: disabled */
    CU_IS(((PFN_cuStreamWriteValue32_v8000)v1)(s, d, 1, 0), CUDA_ERROR_NOT_SUPPORTED);
    CU_OK(cu.cuStreamDestroy(s));
    cf_use(DEV_B); /* B cannot flush */
    CU_IS(cu.cuStreamWaitValue32(CU_STREAM_LEGACY, d, 1, CU_STREAM_WAIT_VALUE_FLUSH), CUDA_ERROR_NOT_SUPPORTED);
    cf_use(DEV_ISO); /* no stream memory operations at all */
    CU_IS(cu.cuStreamWriteValue32(CU_STREAM_LEGACY, d, 1, 0), CUDA_ERROR_NOT_SUPPORTED);
    cf_use(DEV_A);
    cf_flags_free(f);
}

/* ============================================================================================
 * Streams and events
 * ========================================================================================== */

static void test_legacy_stream(void **state)
{
    (void)state;
    cf_use(DEV_A);
    uint32_t *f;
    CUdeviceptr d = cf_flags(&f);
    CUstream blocking, nonblocking;
    CU_OK(cu.cuStreamCreate(&blocking, 0));
    CU_OK(cu.cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuStreamWaitValue32(blocking, d, 1, CU_STREAM_WAIT_VALUE_EQ)); /* blocked on f[0] */
    CU_OK(cu.cuStreamWriteValue32(NULL, d + 4, 1, 0));                      /* legacy: after it */
    CU_OK(cu.cuStreamWriteValue32(nonblocking, d + 8, 1, 0));               /* independent */
    CU_OK(cu.cuStreamSynchronize(nonblocking));
    assert_int_equal(f[2], 1);
    CU_OK(cu.cuStreamWriteValue32(blocking, d + 12, 1, 0)); /* blocking: after the legacy write */
    cf_pause();
    assert_int_equal(__atomic_load_n(&f[1], __ATOMIC_ACQUIRE), 0);
    CU_IS(cu.cuStreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_NOT_READY);
    __atomic_store_n(&f[0], 1, __ATOMIC_RELEASE);
    CU_OK(cu.cuStreamSynchronize(blocking));
    assert_int_equal(f[1], 1);
    assert_int_equal(f[3], 1);
    /* A legacy operation then a blocking one: the blocking stream waits for the legacy one. */
    f[0] = 0;
    CU_OK(cu.cuStreamWaitValue32(CU_STREAM_LEGACY, d, 2, CU_STREAM_WAIT_VALUE_EQ));
    CU_OK(cu.cuStreamWriteValue32(blocking, d + 16, 1, 0));
    CU_OK(cu.cuStreamWriteValue32(nonblocking, d + 20, 1, 0));
    CU_OK(cu.cuStreamSynchronize(nonblocking));
    cf_pause();
    assert_int_equal(__atomic_load_n(&f[4], __ATOMIC_ACQUIRE), 0);
    __atomic_store_n(&f[0], 2, __ATOMIC_RELEASE);
    CU_OK(cu.cuStreamSynchronize(blocking));
    assert_int_equal(f[4], 1);
    CUcontext c;
    CU_OK(cu.cuStreamGetCtx(blocking, &c));
    assert_ptr_equal(c, cf_ctx[DEV_A]);
    CU_OK(cu.cuStreamGetCtx(CU_STREAM_LEGACY, &c));
    assert_ptr_equal(c, cf_ctx[DEV_A]);
    CU_IS(cu.cuStreamWriteValue32(CU_STREAM_PER_THREAD, d, 1, 0), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuStreamDestroy(blocking));
    CU_IS(cu.cuStreamQuery(blocking), CUDA_ERROR_INVALID_HANDLE);
    CU_IS(cu.cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuStreamDestroy(nonblocking));
    cf_flags_free(f);
}

/* Asynchronous copies: ordered on their stream, asynchronous to the host, with the legacy default
 * stream's semantics for NULL. */
static void test_async_copies(void **state)
{
    (void)state;
    enum { N = 4096 };
    cf_use(DEV_A);
    uint32_t *f;
    CUdeviceptr d = cf_flags(&f), buf;
    static unsigned char src[N], dst[N], dst2[N];
    for (int i = 0; i < N; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    memset(dst, 0, sizeof(dst));
    memset(dst2, 0, sizeof(dst2));
    CU_OK(cu.cuMemAlloc(&buf, N));
    CUstream s, blocking;
    CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuStreamCreate(&blocking, 0));
    /* Behind a wait: both copies are queued, neither has run when the calls return. */
    CU_OK(cu.cuStreamWaitValue32(s, d, 1, CU_STREAM_WAIT_VALUE_EQ));
    CU_OK(cu.cuMemcpyHtoDAsync(buf, src, N, s));
    CU_OK(cu.cuMemcpyDtoHAsync(dst, buf, N, s));
    cf_pause();
    CU_IS(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    assert_int_equal(__atomic_load_n(&dst[N - 1], __ATOMIC_ACQUIRE), 0);
    __atomic_store_n(&f[0], 1, __ATOMIC_RELEASE);
    CU_OK(cu.cuStreamSynchronize(s));
    assert_memory_equal(dst, src, N);
    /* On the legacy stream (NULL): after the work of a blocking stream, and nothing of a
     * non-blocking one. */
    CU_OK(cu.cuStreamWaitValue32(blocking, d + 4, 1, CU_STREAM_WAIT_VALUE_EQ));
    CU_OK(cu.cuStreamWaitValue32(s, d + 8, 1, CU_STREAM_WAIT_VALUE_EQ));
    CU_OK(cu.cuMemcpyDtoHAsync(dst2, buf, N, NULL));
    cf_pause();
    CU_IS(cu.cuStreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_NOT_READY);
    assert_int_equal(__atomic_load_n(&dst2[N - 1], __ATOMIC_ACQUIRE), 0);
    __atomic_store_n(&f[1], 1, __ATOMIC_RELEASE);
    CU_OK(cu.cuStreamSynchronize(CU_STREAM_LEGACY)); /* s still waits: it is not in the way */
    assert_memory_equal(dst2, src, N);
    CU_IS(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    __atomic_store_n(&f[2], 1, __ATOMIC_RELEASE);
    CU_OK(cu.cuStreamSynchronize(s));
    /* Refusals, as the driver's: no host buffer; a destroyed stream; no current context. */
    CU_IS(cu.cuMemcpyHtoDAsync(buf, NULL, N, s), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cu.cuMemcpyDtoHAsync(NULL, buf, N, s), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemcpyDtoHAsync(NULL, buf, 0, s));
    CU_OK(cu.cuStreamDestroy(blocking));
    CU_IS(cu.cuMemcpyHtoDAsync(buf, src, N, blocking), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuCtxSetCurrent(NULL));
    CU_IS(cu.cuMemcpyHtoDAsync(buf, src, N, NULL), CUDA_ERROR_INVALID_CONTEXT);
    cf_use(DEV_A);
    CU_OK(cu.cuStreamDestroy(s));
    CU_OK(cu.cuMemFree(buf));
    cf_flags_free(f);
}

static void test_events(void **state)
{
    (void)state;
    cf_use(DEV_A);
    uint32_t *f;
    CUdeviceptr d = cf_flags(&f);
    CUstream s1, s2;
    CU_OK(cu.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CUevent a, b, nt;
    CU_OK(cu.cuEventCreate(&a, 0));
    CU_OK(cu.cuEventCreate(&b, 0));
    CU_OK(cu.cuEventCreate(&nt, CU_EVENT_DISABLE_TIMING));
    CU_IS(cu.cuEventCreate(&nt, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuEventQuery(a)); /* never recorded: complete */
    float ms;
    CU_IS(cu.cuEventElapsedTime(&ms, a, b), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuEventRecord(a, s1));
    CU_OK(cu.cuStreamWaitValue32(s1, d, 1, CU_STREAM_WAIT_VALUE_EQ));
    CU_OK(cu.cuEventRecord(b, s1));
    CU_OK(cu.cuEventRecord(nt, s1));
    /* s2 waits for b: its write comes after s1's wait. */
    CU_OK(cu.cuStreamWaitEvent(s2, b, 0));
    CU_OK(cu.cuStreamWriteValue32(s2, d + 4, 1, 0));
    cf_pause();
    CU_IS(cu.cuEventQuery(b), CUDA_ERROR_NOT_READY);
    CU_IS(cu.cuEventElapsedTime(&ms, a, b), CUDA_ERROR_NOT_READY);
    assert_int_equal(__atomic_load_n(&f[1], __ATOMIC_ACQUIRE), 0);
    __atomic_store_n(&f[0], 1, __ATOMIC_RELEASE);
    CU_OK(cu.cuEventSynchronize(b));
    CU_OK(cu.cuStreamSynchronize(s2));
    assert_int_equal(f[1], 1);
    CU_OK(cu.cuEventElapsedTime(&ms, a, b));
    assert_true(ms >= 0.0f);
    CU_OK(cu.cuEventSynchronize(nt));
    CU_IS(cu.cuEventElapsedTime(&ms, a, nt), CUDA_ERROR_INVALID_HANDLE);
    /* An event of another context cannot be recorded here; it can be waited on. */
    cf_use(DEV_B);
    CUevent other;
    CU_OK(cu.cuEventCreate(&other, 0));
    cf_use(DEV_A);
    CU_IS(cu.cuEventRecord(other, s1), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuStreamWaitEvent(s1, other, 0));
    CU_OK(cu.cuEventDestroy(other));
    CU_OK(cu.cuEventDestroy(a));
    CU_IS(cu.cuEventQuery(a), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuEventDestroy(b));
    CU_OK(cu.cuEventDestroy(nt));
    CU_OK(cu.cuStreamDestroy(s1));
    CU_OK(cu.cuStreamDestroy(s2));
    cf_flags_free(f);
}

/* ============================================================================================
 * Kernel launches: colld's real fatbin, run on the host builds
 * ========================================================================================== */

#define REDUCE_F32_SUM COLLD__CUDA_STR(COLLD__CUDA_REDUCE_KERNEL(float32, sum))
#define COPY_UINT4 COLLD__CUDA_STR(COLLD__CUDA_COPY_KERNEL(16))

static void *read_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *b = malloc((size_t)n);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    return b;
}

static void test_launch(void **state)
{
    (void)state;
    void *image = read_file(CUDAFAKE_FATBIN);
    CUlibrary lib;
    CU_OK(cu.cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    free(image); /* the driver keeps what it needs */
    unsigned n = 0;
    CU_OK(cu.cuLibraryGetKernelCount(&n, lib));
    assert_int_equal(n, 67); /* 10 dtypes x 6 ops (the premultiplied sum included) + 5 copy widths + the
                                hand-off's wait and done */
    CUkernel ks[80];
    CU_OK(cu.cuLibraryEnumerateKernels(ks, 80, lib));
    cf_use(DEV_A);
    CUstream s;
    CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    /* Every kernel of the fatbin has a host build: a launch with nothing to do runs. */
    for (unsigned i = 0; i < n; i++) {
        const char *name;
        CU_OK(cu.cuKernelGetName(&name, ks[i]));
        union {
            colld__cuda_reduce_params_t r;
            colld__cuda_copy_params_t c;
            colld__cuda_gate_params_t w;
            colld__cuda_done_params_t d;
        } p;
        memset(&p, 0, sizeof(p));
        CUdeviceptr hw = 0; /* the hand-off's words, a slot (0: ready at once) and a done word */
        if (strstr(name, "handoff")) {
            CU_OK(cu.cuMemAlloc(&hw, 64));
            CU_OK(cu.cuMemsetD8(hw, 0, 64));
            CU_OK(cu.cuCtxSynchronize()); /* s is non-blocking: it does not wait for the legacy stream */
        }
        if (strcmp(name, COLLD__CUDA_STR(COLLD__CUDA_GATE_KERNEL)) == 0) {
            p.w = (colld__cuda_gate_params_t){ .n = 1, .words = (unsigned *)hw };
            p.w.ready[0] = (unsigned *)(hw + 32);
        } else if (strcmp(name, COLLD__CUDA_STR(COLLD__CUDA_DONE_KERNEL)) == 0) {
            p.d = (colld__cuda_done_params_t){ .n = 1, .words = (unsigned *)hw };
            p.d.done[0] = (unsigned *)(hw + 48);
        } else if (strstr(name, "reduce")) {
            p.r.n_in = 1;
        } else {
            p.c.n_out = 1;
            p.c.unit = atoi(name + strlen("colld__cuda_copy_")); /* colld__cuda_copy_<bytes> */
        }
        void *args[] = { &p };
        CUresult r = cu.cuLaunchKernel((CUfunction)ks[i], 1, 1, 1, 32, 1, 1, 0, s, args, NULL);
        if (r != CUDA_SUCCESS)
            fail_msg("launch of %s: %s", name, rname(r));
        if (hw) {
            CU_OK(cu.cuStreamSynchronize(s));
            CU_OK(cu.cuMemFree(hw));
        }
    }
    CU_OK(cu.cuStreamSynchronize(s));
    /* float32 sum of three inputs, through a CUfunction, with the plan the daemon computes. */
    CUkernel k;
    CU_OK(cu.cuLibraryGetKernel(&k, lib, REDUCE_F32_SUM));
    CU_IS(cu.cuLibraryGetKernel(&k, lib, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    CU_OK(cu.cuLibraryGetKernel(&k, lib, REDUCE_F32_SUM));
    CUfunction fn;
    CU_OK(cu.cuKernelGetFunction(&fn, k));
    enum { COUNT = 1001 };
    CUdeviceptr in[3], out;
    float host[COUNT], got[COUNT];
    for (int r = 0; r < 3; r++) {
        CU_OK(cu.cuMemAlloc(&in[r], COUNT * sizeof(float)));
        for (int i = 0; i < COUNT; i++)
            host[i] = (float)((r + 1) * (i % 13));
        CU_OK(cu.cuMemcpyHtoD(in[r], host, sizeof(host)));
    }
    CU_OK(cu.cuMemAlloc(&out, COUNT * sizeof(float)));
    const void *ins[3] = { (void *)in[0], (void *)in[1], (void *)in[2] };
    void *outs[1] = { (void *)out };
    colld__cuda_reduce_params_t rp;
    size_t work;
    assert_int_equal(colld__cuda_reduce_plan(COLLD_FLOAT32, COLLD_SUM, NULL, ins, 3, outs, 1, COUNT, &rp, &work),
                     COLLD_OK);
    void *args[] = { &rp };
    CU_OK(cu.cuLaunchKernel(fn, 2, 1, 1, 64, 1, 1, 0, s, args, NULL));
    memset(&rp, 0xff, sizeof(rp)); /* the launch copied the parameters */
    CU_OK(cu.cuStreamSynchronize(s));
    CU_OK(cu.cuMemcpyDtoH(got, out, sizeof(got)));
    for (int i = 0; i < COUNT; i++)
        assert_true(got[i] == (float)(6 * (i % 13)));
    /* Refused launches. */
    CU_IS(cu.cuLaunchKernel(fn, 1, 1, 1, 2048, 1, 1, 0, s, args, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cu.cuLaunchKernel(fn, 0, 1, 1, 32, 1, 1, 0, s, args, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    cf_use(DEV_B);
    CU_IS(cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cu.cuLaunchKernel((CUfunction)k, 1, 1, 1, 32, 1, 1, 0, s, args, NULL), CUDA_ERROR_INVALID_HANDLE);
    /* B reads A's memory: an illegal address without peer access (sticky), fine with it. */
    assert_int_equal(colld__cuda_reduce_plan(COLLD_FLOAT32, COLLD_SUM, NULL, ins, 3, outs, 1, COUNT, &rp, &work),
                     COLLD_OK);
    CU_OK(cu.cuLaunchKernel((CUfunction)k, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CU_IS(cu.cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_OK(cu.cuDevicePrimaryCtxReset(DEV_B));
    CU_OK(cu.cuCtxEnablePeerAccess(cf_ctx[DEV_A], 0));
    CU_OK(cu.cuLaunchKernel((CUfunction)k, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CU_OK(cu.cuCtxSynchronize());
    CU_OK(cu.cuCtxDisablePeerAccess(cf_ctx[DEV_A]));
    /* A misaligned buffer faults with CUDA_ERROR_MISALIGNED_ADDRESS; it is not touched. */
    cf_use(DEV_A);
    CUkernel copy;
    CU_OK(cu.cuLibraryGetKernel(&copy, lib, COPY_UINT4));
    colld__cuda_copy_params_t cp;
    memset(&cp, 0, sizeof(cp));
    cp.src = (void *)(in[0] + 4);
    cp.out[0] = (void *)out;
    cp.n_out = 1;
    cp.bytes = 64;
    cp.nunits = 4;
    cp.unit = 16;
    void *cargs[] = { &cp };
    CU_OK(cu.cuLaunchKernel((CUfunction)copy, 1, 1, 1, 32, 1, 1, 0, s, cargs, NULL));
    CU_IS(cu.cuStreamSynchronize(s), CUDA_ERROR_MISALIGNED_ADDRESS);
    CU_OK(cu.cuDevicePrimaryCtxReset(DEV_A)); /* frees the buffers and the stream */
    /* PTX text is read for its entries too; a module is bound to its context. */
    static const char ptx[] = "//\n.version 8.0\n.target sm_90\n.visible .entry " COPY_UINT4
                              "(\n.param .u64 p)\n{\n}\n";
    CUmodule mod;
    CU_OK(cu.cuModuleLoadData(&mod, ptx));
    CU_OK(cu.cuModuleGetFunction(&fn, mod, COPY_UINT4));
    CU_IS(cu.cuModuleGetFunction(&fn, mod, REDUCE_F32_SUM), CUDA_ERROR_NOT_FOUND);
    CU_OK(cu.cuModuleUnload(mod));
    CU_IS(cu.cuModuleLoadData(&mod, "garbage"), CUDA_ERROR_INVALID_IMAGE);
    CU_OK(cu.cuLibraryUnload(lib));
    CU_IS(cu.cuKernelGetName(&(const char *){ NULL }, k), CUDA_ERROR_INVALID_HANDLE);
}

/* A launch's blocks run concurrently (issue 28 item 4), up to the double's FK_BLOCK_WORKERS (4) at
 * once: a chain of 4 blocks each waiting on the next one's word ends at once, where blocks run one
 * after another would have block 0 time out. A chain of 5 runs in waves: the first 4 wait for block
 * 4, which starts only when one of them has given up (timed out). This shows
 * that flag-polling kernels make progress on the double, NOT the GPU memory model: the blocks are
 * host threads on the host's memory model (x86-TSO here), so a missing fence or a store a GPU would
 * not make visible in time passes here. */
static void test_launch_blocks_concurrent_host_memory_model(void **state)
{
    (void)state;
    cf_use(DEV_A);
    CUstream s;
    CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    static const char ptx[] = "//\n.version 8.0\n.target sm_90\n.visible .entry " COLLD__CUDA_STR(
        GPU_RANK_CHAIN_KERNEL) "(\n.param .u64 p)\n{\n}\n";
    CUmodule mod;
    CUfunction fn;
    CU_OK(cu.cuModuleLoadData(&mod, ptx));
    CU_OK(cu.cuModuleGetFunction(&fn, mod, COLLD__CUDA_STR(GPU_RANK_CHAIN_KERNEL)));
    CUdeviceptr words;
    CU_OK(cu.cuMemAlloc(&words, 64));
    for (int n = 4; n <= 5; n++) {
        CU_OK(cu.cuMemsetD8(words, 0, 64));
        CU_OK(cu.cuCtxSynchronize());
        gpu_rank_chain_params_t p = { .word = (unsigned *)words,
                                      .result = (unsigned *)words + 8,
                                      .n = n,
                                      .timeout_ns = n == 4 ? 20000000000ull : 200000000ull };
        void *args[] = { &p };
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CU_OK(cu.cuLaunchKernel(fn, (unsigned)n, 1, 1, 1, 1, 1, 0, s, args, NULL));
        CU_OK(cu.cuStreamSynchronize(s));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        unsigned result[8];
        CU_OK(cu.cuMemcpyDtoH(result, words + 32, sizeof(result)));
        int timed_out = 0;
        for (int b = 0; b < n; b++) {
            assert_true(result[b] == 1u || (n == 5 && b < 4 && result[b] == 2u));
            timed_out += result[b] == 2u;
        }
        if (n == 4) {
            assert_true(secs < 10.0); /* far below the 20 s a waiting block would give up after */
        } else {
            /* Block 4 started only once a block of the first wave had given up (the others may then
             * have seen the chain complete). */
            assert_true(timed_out >= 1 && result[4] == 1u);
            assert_true(secs >= 0.2);
        }
    }
    CU_OK(cu.cuMemFree(words));
    CU_OK(cu.cuModuleUnload(mod));
    CU_OK(cu.cuStreamDestroy(s));
}

/* The hand-off (issue 28 item 1) as the daemon queues it (colld_cuda_handoff_wait's sequence): a
 * stream wait on each of three ranks' slots, written by this thread later (the ranks' streams, in
 * the daemon), the gate kernel, the gated reduce and the done writes on their host builds. Then a
 * cancel as the daemon makes it: the cancel word, then the awaited value in the slot still short
 * of it (the waits end), the gate stays shut, the reduce and the done writes do nothing. What this
 * cannot show: the GPU memory model (the fences and system-scope releases are host atomics here)
 * and whether the GPU's front-end sees the slot and the cancel word in that order. */
static void test_handoff_kernels_host_memory_model(void **state)
{
    (void)state;
    void *image = read_file(CUDAFAKE_FATBIN);
    CUlibrary lib;
    CU_OK(cu.cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    free(image);
    CUkernel kw, kd, kr;
    CU_OK(cu.cuLibraryGetKernel(&kw, lib, COLLD__CUDA_STR(COLLD__CUDA_GATE_KERNEL)));
    CU_OK(cu.cuLibraryGetKernel(&kd, lib, COLLD__CUDA_STR(COLLD__CUDA_DONE_KERNEL)));
    CU_OK(cu.cuLibraryGetKernel(&kr, lib, REDUCE_F32_SUM));
    cf_use(DEV_A);
    CUstream s;
    CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    enum { N = 3, COUNT = 100 };
    CUdeviceptr flags, buf;
    CU_OK(cu.cuMemAlloc(&flags, 256)); /* words at 0, slots at 64, done words at 128 */
    CU_OK(cu.cuMemAlloc(&buf, (N + 1) * COUNT * sizeof(float)));
    unsigned *host_flags = (unsigned *)flags; /* the double's device memory is host memory */
    for (int cancel = 0; cancel <= 1; cancel++) {
        CU_OK(cu.cuMemsetD8(flags, 0, 256));
        float in[COUNT];
        for (int r = 0; r < N; r++) {
            for (int i = 0; i < COUNT; i++)
                in[i] = (float)(r + i);
            CU_OK(cu.cuMemcpyHtoD(buf + (size_t)r * sizeof(in), in, sizeof(in)));
        }
        CU_OK(cu.cuMemsetD8(buf + N * sizeof(in), 0, sizeof(in)));
        CU_OK(cu.cuCtxSynchronize());
        colld__cuda_gate_params_t w = { .words = (unsigned *)flags, .n = N };
        colld__cuda_done_params_t d = { .words = (unsigned *)flags, .n = N };
        for (int r = 0; r < N; r++) {
            w.ready[r] = (unsigned *)(flags + 64) + r;
            w.want[r] = 100u + (unsigned)r;
            d.done[r] = (unsigned *)(flags + 128) + r;
            d.value[r] = 200u + (unsigned)r;
        }
        const void *ins[N];
        for (int r = 0; r < N; r++)
            ins[r] = (const char *)buf + (size_t)r * COUNT * sizeof(float);
        void *outs[1] = { (char *)buf + (size_t)N * COUNT * sizeof(float) };
        colld__cuda_reduce_params_t rp;
        size_t work;
        assert_int_equal(colld__cuda_reduce_plan(COLLD_FLOAT32, COLLD_SUM, NULL, ins, N, outs, 1, COUNT, &rp, &work),
                         COLLD_OK);
        rp.gate = (const unsigned *)flags + COLLD_CUDA_HANDOFF_GATE;
        void *wa[] = { &w }, *ra[] = { &rp }, *da[] = { &d };
        for (int r = 0; r < N; r++)
            CU_OK(cu.cuStreamWaitValue32(s, (CUdeviceptr)w.ready[r], w.want[r], CU_STREAM_WAIT_VALUE_EQ));
        CU_OK(cu.cuLaunchKernel((CUfunction)kw, 1, 1, 1, 1, 1, 1, 0, s, wa, NULL));
        CU_OK(cu.cuLaunchKernel((CUfunction)kr, 1, 1, 1, 32, 1, 1, 0, s, ra, NULL));
        CU_OK(cu.cuLaunchKernel((CUfunction)kd, 1, 1, 1, 1, 1, 1, 0, s, da, NULL));
        usleep(20000);
        assert_int_equal(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY); /* the waits wait */
        for (int r = 0; r < N - 1; r++)
            __atomic_store_n(&host_flags[16 + r], 100u + (unsigned)r, __ATOMIC_RELEASE);
        usleep(20000);
        assert_int_equal(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY); /* the last rank's wait */
        if (cancel)
            __atomic_store_n(&host_flags[COLLD_CUDA_HANDOFF_CANCEL], 1u, __ATOMIC_RELEASE);
        __atomic_store_n(&host_flags[16 + N - 1], 100u + N - 1, __ATOMIC_RELEASE); /* cancel: the daemon's */
        CU_OK(cu.cuStreamSynchronize(s));
        float got[COUNT];
        CU_OK(cu.cuMemcpyDtoH(got, buf + N * sizeof(got), sizeof(got)));
        for (int r = 0; r < N; r++) {
            assert_int_equal(host_flags[32 + r], cancel ? 0u : 200u + (unsigned)r); /* done */
            assert_int_equal(host_flags[16 + r], cancel ? 100u + (unsigned)r : ~(100u + (unsigned)r)); /* taken */
        }
        assert_int_equal(host_flags[COLLD_CUDA_HANDOFF_GATE], cancel ? 0u : COLLD_CUDA_GATE_GO);
        for (int i = 0; i < COUNT; i++)
            assert_true(got[i] == (cancel ? 0.0f : (float)(3 * i + 3)));
    }
    CU_OK(cu.cuMemFree(buf));
    CU_OK(cu.cuMemFree(flags));
    CU_OK(cu.cuStreamDestroy(s));
    CU_OK(cu.cuLibraryUnload(lib));
}

/* ============================================================================================
 * Legacy IPC and VMM across processes
 * ========================================================================================== */

static void test_ipc(void **state)
{
    (void)state;
    cf_use(DEV_A);
    CUdeviceptr p;
    CU_OK(cu.cuMemAlloc(&p, 3u << 20));
    CU_OK(cu.cuMemsetD8(p, 0x5a, 3u << 20));
    CU_OK(cu.cuCtxSynchronize());
    CUipcMemHandle h;
    CU_OK(cu.cuIpcGetMemHandle(&h, p));
    CUdeviceptr q;
    CU_IS(cu.cuIpcOpenMemHandle(&q, h, 0), CUDA_ERROR_INVALID_CONTEXT); /* never in the exporter */
    char hex[2 * sizeof(h.reserved) + 1];
    for (size_t i = 0; i < sizeof(h.reserved); i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)h.reserved[i]);
    /* The helper opens it, checks and rewrites the first 4 KiB, writes 7 at 1 MiB and waits for
     * the next word to reach 9, which this process writes from its stream. */
    const size_t flag = 1u << 20;
    CUstream s;
    CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuStreamWaitValue32(s, p + flag, 7, CU_STREAM_WAIT_VALUE_EQ));
    CU_OK(cu.cuStreamWriteValue32(s, p + flag + 4, 9, 0));
    char out[512];
    cf_helper(out, sizeof(out), (const char *const[]){ "ipc", hex, "90", "1048576", NULL }, NULL, -1);
    assert_string_equal(out, "ok CUDA_ERROR_INVALID_VALUE");
    CU_OK(cu.cuStreamSynchronize(s));
    unsigned char back[4096];
    CU_OK(cu.cuMemcpyDtoH(back, p, sizeof(back)));
    for (size_t i = 0; i < sizeof(back); i++)
        assert_int_equal(back[i], 0x5b);
    CU_OK(cu.cuStreamDestroy(s));
    /* Freed in the exporter: the handle opens nothing any more. */
    CU_OK(cu.cuMemFree(p));
    cf_helper(out, sizeof(out), (const char *const[]){ "ipc-open", hex, NULL }, NULL, -1);
    assert_string_equal(out, "CUDA_ERROR_INVALID_HANDLE");
    /* VMM memory has no legacy handle; nor has a device without IPC. */
    CU_IS(cu.cuIpcGetMemHandle(&h, (CUdeviceptr)(uintptr_t)&h), CUDA_ERROR_INVALID_VALUE);
    cf_use(DEV_ISO);
    CU_OK(cu.cuMemAlloc(&p, 4096));
    CU_IS(cu.cuIpcGetMemHandle(&h, p), CUDA_ERROR_NOT_SUPPORTED);
    CU_OK(cu.cuMemFree(p));
}

static void test_vmm(void **state)
{
    (void)state;
    cf_use(DEV_A);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = DEV_A;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t g;
    CU_OK(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    assert_int_equal(g, 2u << 20);
    CUmemGenericAllocationHandle h1, h2, r;
    CU_IS(cu.cuMemCreate(&h1, g / 2, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemCreate(&h1, 2 * g, &prop, 0));
    CU_OK(cu.cuMemCreate(&h2, g, &prop, 0));
    CUdeviceptr va;
    CU_OK(cu.cuMemAddressReserve(&va, 4 * g, 0, 0, 0));
    CU_IS(cu.cuMemMap(va + g / 2, g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE); /* not on the granularity */
    CU_IS(cu.cuMemMap(va, 4 * g, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);     /* larger than the allocation */
    /* Two allocations back to back in one reservation (PyTorch's expandable segments). */
    CU_OK(cu.cuMemMap(va, 2 * g, 0, h1, 0));
    CU_OK(cu.cuMemMap(va + 2 * g, g, 0, h2, 0));
    CU_IS(cu.cuMemMap(va + g, g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE); /* already mapped */
    unsigned long long acc = 9;
    CUmemLocation loc = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = DEV_A };
    CU_OK(cu.cuMemGetAccess(&acc, &loc, va));
    assert_int_equal(acc, CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CU_IS(cu.cuMemsetD8(va, 1, 16), CUDA_SUCCESS); /* enqueued; faults when it runs */
    CU_IS(cu.cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_OK(cu.cuDevicePrimaryCtxReset(DEV_A)); /* VMM memory survives a reset */
    cf_use(DEV_A);
    CUmemAccessDesc ad = { .location = loc, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    CU_IS(cu.cuMemSetAccess(va, g, &ad, 1), CUDA_ERROR_INVALID_VALUE); /* half a mapping */
    CU_OK(cu.cuMemSetAccess(va, 3 * g, &ad, 1));
    CUmemAccessDesc iso = { .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = DEV_ISO },
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    CU_IS(cu.cuMemSetAccess(va, 3 * g, &iso, 1), CUDA_ERROR_INVALID_DEVICE); /* no path from ISO */
    CU_OK(cu.cuMemsetD8(va + 2 * g - 8, 0x33, 16));                          /* across the two mappings */
    CU_OK(cu.cuMemsetD8(va, 0x44, 4096));
    CU_OK(cu.cuCtxSynchronize());
    /* Ranges and attributes: the mapping, and the reservation. */
    CUdeviceptr base;
    size_t size;
    CU_OK(cu.cuMemGetAddressRange(&base, &size, va + 2 * g + 5));
    assert_int_equal(base, va + 2 * g);
    assert_int_equal(size, g);
    CUdeviceptr start;
    CU_OK(cu.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + 2 * g + 5));
    assert_int_equal(start, va);
    bool ipc = true;
    CU_OK(cu.cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, va));
    assert_false(ipc);
    CU_OK(cu.cuMemRetainAllocationHandle(&r, (void *)(va + g)));
    assert_int_equal(r, h1);
    CU_OK(cu.cuMemRelease(r));
    /* Export h1 to another process, which sees our bytes and writes its own. */
    int fd = -1;
    CU_OK(cu.cuMemExportToShareableHandle(&fd, h1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    char out[512], size_s[32];
    snprintf(size_s, sizeof(size_s), "%zu", 2 * g);
    cf_helper(out, sizeof(out), (const char *const[]){ "vmm", "100", size_s, "68", NULL }, NULL, fd);
    assert_string_equal(out, "ok");
    close(fd);
    unsigned char back[4096];
    CU_OK(cu.cuMemcpyDtoH(back, va, sizeof(back)));
    for (size_t i = 0; i < sizeof(back); i++)
        assert_int_equal(back[i], 69);
    /* An fd that is not a VMM allocation's. */
    int junk = memfd_create("junk", MFD_CLOEXEC);
    assert_true(junk >= 0 && ftruncate(junk, 4096) == 0);
    cf_helper(out, sizeof(out), (const char *const[]){ "vmm-import", "100", NULL }, NULL, junk);
    assert_string_equal(out, "CUDA_ERROR_INVALID_VALUE");
    close(junk);
    /* Tear down: whole mappings only; the reservation after its mappings. */
    CU_IS(cu.cuMemUnmap(va, g), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cu.cuMemAddressFree(va, 4 * g), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemUnmap(va, 3 * g));
    CU_OK(cu.cuMemAddressFree(va, 4 * g));
    CU_OK(cu.cuMemRelease(h1));
    CU_OK(cu.cuMemRelease(h2));
    CU_IS(cu.cuMemRelease(h2), CUDA_ERROR_INVALID_VALUE);
    /* Not exportable without the handle type; no VMM on ISO. */
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    CU_OK(cu.cuMemCreate(&h1, g, &prop, 0));
    CU_IS(cu.cuMemExportToShareableHandle(&fd, h1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemRelease(h1));
    prop.location.id = DEV_ISO;
    CU_IS(cu.cuMemCreate(&h1, g, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
}

/* ============================================================================================
 * Fault injection
 * ========================================================================================== */

static void test_faults(void **state)
{
    (void)state;
    cf_use(DEV_B);
    CUdeviceptr p[3];
    /* fail: the second cuMemAlloc from now. */
    unsigned long long before = cu.calls("cuMemAlloc");
    assert_int_equal(cu.control("fail:cuMemAlloc:+2:CUDA_ERROR_OUT_OF_MEMORY"), 0);
    CU_OK(cu.cuMemAlloc(&p[0], 64));
    CU_IS(cu.cuMemAlloc(&p[1], 64), CUDA_ERROR_OUT_OF_MEMORY);
    CU_OK(cu.cuMemAlloc(&p[2], 64));
    assert_int_equal(cu.calls("cuMemAlloc"), before + 3);
    CU_OK(cu.cuMemFree(p[0]));
    CU_OK(cu.cuMemFree(p[2]));
    /* Every call from now on, until cleared. */
    assert_int_equal(cu.control("fail:cuEventCreate:+1-:700"), 0);
    CUevent e;
    CU_IS(cu.cuEventCreate(&e, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    CU_IS(cu.cuEventCreate(&e, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(cu.control("clear"), 0);
    CU_OK(cu.cuEventCreate(&e, 0));
    CU_OK(cu.cuEventDestroy(e));
    assert_int_equal(cu.control("fail:cuNoSuchCall:1:1"), -1);
    assert_int_equal(cu.control("fail:cuMemAlloc:x:1"), -1);
    /* sticky on an enqueuing call: the call succeeds, its work fails, the context stays failed. */
    uint32_t *f;
    cf_use(DEV_A);
    CUdeviceptr d = cf_flags(&f);
    cf_use(DEV_B);
    assert_int_equal(cu.control("sticky:cuStreamWriteValue32:+1:CUDA_ERROR_LAUNCH_FAILED"), 0);
    CU_OK(cu.cuStreamWriteValue32(CU_STREAM_LEGACY, d, 5, 0));
    CU_IS(cu.cuStreamSynchronize(CU_STREAM_LEGACY), CUDA_ERROR_LAUNCH_FAILED);
    assert_int_equal(f[0], 0); /* the write never happened */
    CU_IS(cu.cuMemAlloc(&p[0], 64), CUDA_ERROR_LAUNCH_FAILED);
    CU_IS(cu.cuStreamWriteValue32(CU_STREAM_LEGACY, d, 5, 0), CUDA_ERROR_LAUNCH_FAILED);
    CU_OK(cu.cuDevicePrimaryCtxReset(DEV_B));
    CU_OK(cu.cuStreamWriteValue32(CU_STREAM_LEGACY, d, 5, 0));
    CU_OK(cu.cuCtxSynchronize());
    assert_int_equal(f[0], 5);
    /* sticky on a synchronous call: it fails, and so does the context. Other devices go on. */
    assert_int_equal(cu.control("sticky:cuMemAlloc:+1:CUDA_ERROR_ECC_UNCORRECTABLE"), 0);
    CU_IS(cu.cuMemAlloc(&p[0], 64), CUDA_ERROR_ECC_UNCORRECTABLE);
    CU_IS(cu.cuCtxSynchronize(), CUDA_ERROR_ECC_UNCORRECTABLE);
    cf_use(DEV_A);
    CU_OK(cu.cuMemAlloc(&p[0], 64));
    CU_OK(cu.cuMemFree(p[0]));
    CU_OK(cu.cuDevicePrimaryCtxReset(DEV_B));
    /* A stalled stream: nothing runs until released; with AFTER, the first operations run. */
    CUstream s;
    CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    char spec[64];
    snprintf(spec, sizeof(spec), "stall:%llu:1", cu.stream_id(s));
    assert_int_equal(cu.control(spec), 0);
    CU_OK(cu.cuStreamWriteValue32(s, d + 4, 1, 0));
    CU_OK(cu.cuStreamWriteValue32(s, d + 8, 1, 0));
    assert_true(cf_wait_eq(&f[1], 1));
    cf_pause();
    assert_int_equal(__atomic_load_n(&f[2], __ATOMIC_ACQUIRE), 0);
    CU_IS(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    /* Released through the control file, as another process would. */
    FILE *cf = fopen(control_path, "a");
    assert_non_null(cf);
    fprintf(cf, "# released by test_faults\nrelease:%llu\n", cu.stream_id(s));
    fclose(cf);
    assert_int_equal(cu.control("poll"), 0);
    CU_OK(cu.cuStreamSynchronize(s));
    assert_int_equal(f[2], 1);
    /* A control-file fault. */
    cf = fopen(control_path, "a");
    assert_non_null(cf);
    fprintf(cf, "fail:cuStreamCreate:+1:CUDA_ERROR_OUT_OF_MEMORY\n");
    fclose(cf);
    assert_int_equal(cu.control("poll"), 0);
    CUstream s2;
    CU_IS(cu.cuStreamCreate(&s2, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CU_OK(cu.cuStreamCreate(&s2, 0));
    CU_OK(cu.cuStreamDestroy(s2));
    CU_OK(cu.cuStreamDestroy(s));
    cf_use(DEV_A);
    cf_flags_free(f);
}

/* A call held by the fault file (hold:ENTRY:WHICH) from another thread. */
static void *held_event_create(void *arg)
{
    CUevent e = NULL;
    CUresult r = cu.cuCtxSetCurrent(cf_ctx[DEV_A]);
    if (r == CUDA_SUCCESS)
        r = cu.cuEventCreate(&e, 0);
    if (r == CUDA_SUCCESS)
        cu.cuEventDestroy(e);
    __atomic_store_n((CUresult *)arg, r, __ATOMIC_RELEASE);
    return NULL;
}

/* hold: the call waits, before it does anything, until release:hold; it says so in the control
 * file first ("# held: ..."), so that a test driving another process knows when. */
static void test_fault_hold(void **state)
{
    (void)state;
    assert_int_equal(cu.control("hold:cuEventCreate:+1"), 0);
    CUresult r = (CUresult)-1;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, held_event_create, &r), 0);
    char buf[8192] = "";
    for (int i = 0; i < 20000 && !strstr(buf, "# held: cuEventCreate call #"); i++) {
        FILE *f = fopen(control_path, "r");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        buf[n] = '\0';
        if (f)
            fclose(f);
        if (!strstr(buf, "# held: cuEventCreate call #"))
            usleep(1000);
    }
    assert_non_null(strstr(buf, "# held: cuEventCreate call #"));
    cf_pause();
    assert_int_equal(__atomic_load_n(&r, __ATOMIC_ACQUIRE), (CUresult)-1); /* still held */
    FILE *cf = fopen(control_path, "a");
    assert_non_null(cf);
    fprintf(cf, "release:hold\n");
    fclose(cf);
    pthread_join(t, NULL);
    CU_OK(r);
}

/* ============================================================================================
 * main
 * ========================================================================================== */

static int setup(void **state)
{
    (void)state;
    void *lib = dlopen(CUDAFAKE_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        print_error("cannot load the CUDA driver test double: %s\n", dlerror());
        return -1;
    }
    cu.get_proc = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
    cu.control = (colld_cudafake_control_fn)dlsym(lib, "colld_cudafake_control");
    cu.calls = (colld_cudafake_calls_fn)dlsym(lib, "colld_cudafake_calls");
    cu.stream_id = (colld_cudafake_stream_id_fn)dlsym(lib, "colld_cudafake_stream_id");
    if (!cu.get_proc || !cu.control || !cu.calls || !cu.stream_id)
        return -1;
#define CF_LOOKUP(name, version)                                                                                       \
    {                                                                                                                  \
        void *fn = NULL;                                                                                               \
        CUdriverProcAddressQueryResult q;                                                                              \
        if (cu.get_proc(#name, &fn, version, 0, &q) != CUDA_SUCCESS || !fn) {                                          \
            print_error("the double has no %s at %d\n", #name, version);                                               \
            return -1;                                                                                                 \
        }                                                                                                              \
        cu.name = (PFN_##name##_v##version)fn;                                                                         \
    }
    CF_API(CF_LOOKUP)
#undef CF_LOOKUP
    return 0;
}

/* After each case, pass or fail: release every stalled stream and drop the faults not yet fired,
 * so that a case that failed between its stall and its release cannot hang the next cases (a
 * cuMemFree synchronizes every stream) until ctest's timeout. */
static int faults_reset(void **state)
{
    (void)state;
    return cu.control && (cu.control("release:*") != 0 || cu.control("release:hold") != 0 || cu.control("clear") != 0)
               ? -1
               : 0;
}

/* Retain every device's primary context (after test_proc_address's cuInit). */
static void test_retain(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++)
        CU_OK(cu.cuDevicePrimaryCtxRetain(&cf_ctx[i], i));
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(control_path, sizeof(control_path), "/tmp/cudafake-control-XXXXXX");
    int fd = mkstemp(control_path);
    if (fd < 0)
        return 1;
    close(fd);
    setenv("COLLD_CUDAFAKE_DEVICES",
           "name=fake-h100,flush=1|name=fake-a100,cc=8.0,sms=108,mem=256M,uuid=ab00000000000000000000000000000b|"
           "name=fake-isolated,peer=1,memops=0,vmm=0,ipc=0",
           1);
    setenv("COLLD_CUDAFAKE_CONTROL", control_path, 1);
    unsetenv("COLLD_CUDAFAKE_FAULTS");
    unsetenv("COLLD_CUDAFAKE_DRIVER_VERSION");
    unsetenv("CUDA_VISIBLE_DEVICES");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_proc_address, faults_reset),
        cmocka_unit_test_teardown(test_retain, faults_reset),
        cmocka_unit_test_teardown(test_colld_loader, faults_reset),
        cmocka_unit_test_teardown(test_devices, faults_reset),
        cmocka_unit_test_teardown(test_contexts, faults_reset),
        cmocka_unit_test_teardown(test_memory, faults_reset),
        cmocka_unit_test_teardown(test_host_register, faults_reset),
        cmocka_unit_test_teardown(test_memops, faults_reset),
        cmocka_unit_test_teardown(test_legacy_stream, faults_reset),
        cmocka_unit_test_teardown(test_async_copies, faults_reset),
        cmocka_unit_test_teardown(test_events, faults_reset),
        cmocka_unit_test_teardown(test_launch, faults_reset),
        cmocka_unit_test_teardown(test_launch_blocks_concurrent_host_memory_model, faults_reset),
        cmocka_unit_test_teardown(test_handoff_kernels_host_memory_model, faults_reset),
        cmocka_unit_test_teardown(test_ipc, faults_reset),
        cmocka_unit_test_teardown(test_vmm, faults_reset),
        cmocka_unit_test_teardown(test_faults, faults_reset),
        cmocka_unit_test_teardown(test_fault_hold, faults_reset),
        cmocka_unit_test_teardown(test_capture_replay, faults_reset),
        cmocka_unit_test_teardown(test_capture_refusals, faults_reset),
        cmocka_unit_test_teardown(test_capture_fork_join, faults_reset),
        cmocka_unit_test_teardown(test_graph_user_objects, faults_reset),
        cmocka_unit_test_teardown(test_graph_launch_order, faults_reset),
        cmocka_unit_test_teardown(test_capture_mode_exchange, faults_reset),
    };
    int rc = cmocka_run_group_tests(tests, setup, NULL);
    unlink(control_path);
    return rc;
}
