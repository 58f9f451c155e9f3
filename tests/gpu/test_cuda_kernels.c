/*
 * test_cuda_kernels.c - the CUDA kernels through the CUDA driver API: the check matrix of
 * kernel_check.c run through colld_cuda_reduce / colld_cuda_copy on device 0, every result compared
 * bitwise with the scalar CPU oracle. On a real GPU (ctest gpu_hw_kernels, label hardware; exits 77,
 * skipped, when no GPU is visible) the fatbin's device code runs; on the CUDA driver test double
 * (ctest gpu_kernels, labels gpu and cudafake, with --cudafake: the libcuda.so.1 found must be the
 * double, checked before any CUDA call) the launches run the host builds of the same kernel source,
 * which proves the launch path (names, parameter blocks, grids, the access checks) but not the
 * device code.
 *
 *   test_cuda_kernels [--cudafake]
 *
 * Buffers are cuMemAlloc'd on device 0 (the test's own loader, gpu_cu.h; no CUDA runtime); the
 * kernels are loaded as the daemon loads them (the embedded fatbin through colld's loader:
 * colld_cuda_kernels_load) in device 0's primary context, and run on a created (blocking) stream,
 * which the test synchronises after each launch so that a kernel fault is reported against its case.
 */
#include "common/cudadrv.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/gpu/gpu_cu.h"
#include "tests/gpu/kernel_check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static gpu_cu_t cu;
static CUstream stream;
static colld_cuda_kernels_t *kernels;

#define DPTR(p) ((CUdeviceptr)(uintptr_t)(p))

/* Report a CUDA error of a test step; returns nonzero when there was one. */
static int cuda_failed(const char *what, CUresult e)
{
    char why[256];
    if (e == CUDA_SUCCESS)
        return 0;
    printf("%s: %s\n", what, gpu_cu_describe(&cu, e, why, sizeof(why)));
    return 1;
}

static void *gpu_alloc(size_t bytes)
{
    CUdeviceptr d = 0;
    return cuda_failed("cuMemAlloc", cu.cuMemAlloc(&d, bytes ? bytes : 1)) ? NULL : (void *)(uintptr_t)d;
}

static void gpu_release(void *p)
{
    (void)cuda_failed("cuMemFree", cu.cuMemFree(DPTR(p)));
}

/* The memory helpers run on the legacy default stream and wait for it, so they are ordered with the
 * kernels on `stream` (a blocking stream) both ways. */
static int gpu_put(void *dst, const void *src, size_t bytes)
{
    return cuda_failed("cuMemcpyHtoD", cu.cuMemcpyHtoD(DPTR(dst), src, bytes)) ||
           cuda_failed("cuCtxSynchronize", cu.cuCtxSynchronize());
}

static int gpu_get(void *dst, const void *src, size_t bytes)
{
    return cuda_failed("cuMemcpyDtoH", cu.cuMemcpyDtoH(dst, DPTR(src), bytes));
}

/* Device to device through the host (the tests' loader serves no cuMemcpyDtoD: nothing else needs
 * it, and the test double does not model it). */
static int gpu_dcopy(void *dst, const void *src, size_t bytes)
{
    void *tmp = malloc(bytes ? bytes : 1);
    int bad = !tmp || gpu_get(tmp, src, bytes) || gpu_put(dst, tmp, bytes);
    free(tmp);
    return bad;
}

static int gpu_fill(void *dst, int byte, size_t bytes)
{
    return cuda_failed("cuMemsetD8", cu.cuMemsetD8(DPTR(dst), (unsigned char)byte, bytes)) ||
           cuda_failed("cuCtxSynchronize", cu.cuCtxSynchronize());
}

/* Launch, then wait for the kernel so that its errors belong to this case. */
static colld_status_t finish(const char *what, colld_status_t st)
{
    if (st != COLLD_OK) {
        printf("%s: %s\n", what, colld_cuda_last_error());
        return st;
    }
    return cuda_failed(what, cu.cuStreamSynchronize(stream)) ? COLLD_ERR_DEVICE : COLLD_OK;
}

static colld_status_t gpu_reduce(colld_dtype_t dtype, int op, const uint64_t *scalars, const void *const *in, int n_in,
                                 void *const *out, int n_out, size_t count)
{
    if (op == KCHECK_PREMUL_SUM)
        return finish("colld_cuda_reduce_premul",
                      colld_cuda_reduce_premul(kernels, dtype, scalars, in, n_in, out, n_out, count, stream));
    return finish("colld_cuda_reduce",
                  colld_cuda_reduce(kernels, dtype, (colld_redop_t)op, in, n_in, out, n_out, count, stream));
}

static colld_status_t gpu_copy(const void *src, void *const *out, int n_out, size_t bytes)
{
    return finish("colld_cuda_copy", colld_cuda_copy(kernels, src, out, n_out, bytes, stream));
}

/* Seconds of a monotonic clock. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* For information only (not a pass/fail criterion; not run on the double, where it means nothing):
 * the bandwidth of an in-place float32 sum of four 64 MiB buffers on this GPU, as bytes read +
 * written per second. */
static void report_bandwidth(void)
{
    enum { N_BUF = 4 };
    const size_t count = (size_t)16 << 20;
    void *buf[N_BUF] = { NULL };
    int iters = 20, ok = 1;
    double t0, t1;

    for (int r = 0; r < N_BUF && ok; r++)
        ok = (buf[r] = gpu_alloc(count * 4)) != NULL && !gpu_fill(buf[r], 0, count * 4);
    if (ok)
        ok = gpu_reduce(COLLD_FLOAT32, COLLD_SUM, NULL, (const void *const *)buf, N_BUF, buf, N_BUF, count) == COLLD_OK;
    if (ok) {
        t0 = now();
        for (int i = 0; i < iters && ok; i++)
            ok = colld_cuda_reduce(kernels, COLLD_FLOAT32, COLLD_SUM, (const void *const *)buf, N_BUF, buf, N_BUF,
                                   count, stream) == COLLD_OK;
        ok = ok && !cuda_failed("cuStreamSynchronize", cu.cuStreamSynchronize(stream));
        t1 = now();
        if (ok)
            printf("info: in-place float32 sum of %d x %zu MiB: %.1f us per call, %.0f GB/s (read + write)\n", N_BUF,
                   count * 4 >> 20, (t1 - t0) / iters * 1e6, 2.0 * N_BUF * (double)count * 4 * iters / (t1 - t0) / 1e9);
    }
    for (int r = 0; r < N_BUF; r++)
        if (buf[r])
            gpu_release(buf[r]);
}

int main(int argc, char **argv)
{
    bool want_double = argc > 1 && strcmp(argv[1], "--cudafake") == 0;
    kcheck_backend_t gpu = {
        .name = "gpu",
        .big_count = ((size_t)1 << 20) + 3,
        .alloc = gpu_alloc,
        .release = gpu_release,
        .put = gpu_put,
        .get = gpu_get,
        .dcopy = gpu_dcopy,
        .fill = gpu_fill,
        .reduce = gpu_reduce,
        .copy = gpu_copy,
    };
    int failures;
    char err[512];
    const colld_cu_t *ccu;
    CUcontext ctx;
    CUdevice dev;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 2 || (argc == 2 && !want_double)) {
        printf("usage: %s [--cudafake]\n", argv[0]);
        return 2;
    }
    /* Before any CUDA call: with --cudafake, the driver must be the test double. */
    gpu_cu_result_t loaded = gpu_cu_load(&cu, want_double, err, sizeof(err));
    if (loaded != GPU_CU_OK) {
        printf("%s%s\n", loaded == GPU_CU_NONE ? "SKIP: " : "", err);
        return loaded == GPU_CU_NONE ? 77 : 1;
    }
    if (cu.on_double) /* a GPU's threads run one after another on the host: a smaller largest count */
        gpu.big_count = ((size_t)1 << 16) + 3;
    const char *no_big = getenv("COLLD_TEST_NO_BIG"); /* TSan (make test-tsan): a quarter of that */
    if (cu.on_double && no_big && strcmp(no_big, "1") == 0)
        gpu.big_count = ((size_t)1 << 14) + 3;
    if (cuda_failed("device 0's primary context", gpu_cu_use_device(&cu, 0)) ||
        cuda_failed("cuStreamCreate", cu.cuStreamCreate(&stream, CU_STREAM_DEFAULT)))
        return 1;
    if (!(ccu = colld_cu_load(err, sizeof(err))) || ccu->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS ||
        ccu->cuCtxGetDevice(&dev) != CUDA_SUCCESS) {
        printf("colld's driver loader: %s\n", ccu ? "no current context" : err);
        return 1;
    }
    if (colld_cuda_kernels_load(ccu, &ctx, &dev, 1, &kernels, err, sizeof(err)) != COLLD_OK) {
        printf("colld_cuda_kernels_load: %s\n", err);
        return 1;
    }
    char name[256] = "?";
    int major = 0, minor = 0, sms = 0;
    ccu->cuDeviceGetName(name, (int)sizeof(name), dev);
    ccu->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    ccu->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    ccu->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    printf("device 0: %s, compute capability %d.%d, %d multiprocessors%s\n", name, major, minor, sms,
           cu.on_double ? " (the CUDA driver test double: launches run the host builds of the kernels)" : "");

    failures = kcheck_run(&gpu);
    if (failures == 0 && !cu.on_double)
        report_bandwidth();
    (void)cuda_failed("cuStreamDestroy", cu.cuStreamDestroy(stream));
    (void)cuda_failed("cuCtxSynchronize", cu.cuCtxSynchronize());
    colld_cuda_kernels_unload(kernels);
    return failures == 0 ? 0 : 1;
}
