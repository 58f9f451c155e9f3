/*
 * test_cuda_kernels.c - the CUDA kernels on a real GPU (ctest gpu_kernels, label gpu): the check
 * matrix of kernel_check.c run through colld_cuda_reduce / colld_cuda_copy on device 0, every result
 * compared bitwise with the scalar CPU oracle. Exits 77 (skipped) when no GPU is visible.
 *
 * Buffers are cudaMalloc'd on device 0 (the test uses the CUDA runtime for its own memory); the
 * kernels are loaded as the daemon loads them (the embedded fatbin through the driver API:
 * colld_cuda_kernels_load) in device 0's primary context, the runtime's, and run on a created
 * (blocking) stream, which the test synchronises after each launch so that a kernel fault is
 * reported against its case.
 */
#include "kernels/cuda/cuda_kernels.h"
#include "tests/gpu/kernel_check.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static cudaStream_t stream;
static colld_cuda_kernels_t *kernels;

/* Report a CUDA error of a test step; returns nonzero when there was one. */
static int cuda_failed(const char *what, cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    printf("%s: %s: %s\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
    return 1;
}

static void *gpu_alloc(size_t bytes)
{
    void *p = NULL;
    return cuda_failed("cudaMalloc", cudaMalloc(&p, bytes)) ? NULL : p;
}

static void gpu_release(void *p)
{
    (void)cuda_failed("cudaFree", cudaFree(p));
}

/* The memory helpers run on the legacy default stream and wait for it, so they are ordered with the
 * kernels on `stream` (a blocking stream) both ways. */
static int gpu_put(void *dst, const void *src, size_t bytes)
{
    return cuda_failed("cudaMemcpy H2D", cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice)) ||
           cuda_failed("cudaDeviceSynchronize", cudaDeviceSynchronize());
}

static int gpu_get(void *dst, const void *src, size_t bytes)
{
    return cuda_failed("cudaMemcpy D2H", cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

static int gpu_dcopy(void *dst, const void *src, size_t bytes)
{
    return cuda_failed("cudaMemcpy D2D", cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice)) ||
           cuda_failed("cudaDeviceSynchronize", cudaDeviceSynchronize());
}

static int gpu_fill(void *dst, int byte, size_t bytes)
{
    return cuda_failed("cudaMemset", cudaMemset(dst, byte, bytes)) ||
           cuda_failed("cudaDeviceSynchronize", cudaDeviceSynchronize());
}

/* Launch, then wait for the kernel so that its errors belong to this case. */
static colld_status_t finish(const char *what, colld_status_t st)
{
    if (st != COLLD_OK) {
        printf("%s: %s\n", what, colld_cuda_last_error());
        return st;
    }
    return cuda_failed(what, cudaStreamSynchronize(stream)) ? COLLD_ERR_DEVICE : COLLD_OK;
}

static colld_status_t gpu_reduce(colld_dtype_t dtype, colld_redop_t op, const void *const *in, int n_in,
                                 void *const *out, int n_out, size_t count)
{
    return finish("colld_cuda_reduce", colld_cuda_reduce(kernels, dtype, op, in, n_in, out, n_out, count, stream));
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

/* For information only (not a pass/fail criterion): the bandwidth of an in-place float32 sum of
 * four 64 MiB buffers on this GPU, as bytes read + written per second. */
static void report_bandwidth(void)
{
    enum { N_BUF = 4 };
    const size_t count = (size_t)16 << 20;
    void *buf[N_BUF] = {NULL};
    int iters = 20, ok = 1;
    double t0, t1;

    for (int r = 0; r < N_BUF && ok; r++)
        ok = (buf[r] = gpu_alloc(count * 4)) != NULL && !gpu_fill(buf[r], 0, count * 4);
    if (ok)
        ok = gpu_reduce(COLLD_FLOAT32, COLLD_SUM, (const void *const *)buf, N_BUF, buf, N_BUF, count) == COLLD_OK;
    if (ok) {
        t0 = now();
        for (int i = 0; i < iters && ok; i++)
            ok = colld_cuda_reduce(kernels, COLLD_FLOAT32, COLLD_SUM, (const void *const *)buf, N_BUF, buf, N_BUF, count,
                                   stream) == COLLD_OK;
        ok = ok && !cuda_failed("cudaStreamSynchronize", cudaStreamSynchronize(stream));
        t1 = now();
        if (ok)
            printf("info: in-place float32 sum of %d x %zu MiB: %.1f us per call, %.0f GB/s (read + write)\n",
                   N_BUF, count * 4 >> 20, (t1 - t0) / iters * 1e6,
                   2.0 * N_BUF * (double)count * 4 * iters / (t1 - t0) / 1e9);
    }
    for (int r = 0; r < N_BUF; r++)
        if (buf[r])
            gpu_release(buf[r]);
}

int main(void)
{
    const kcheck_backend_t gpu = {
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
    struct cudaDeviceProp prop;
    int failures, ndev = 0;
    char err[512];
    const colld_cu_t *cu;
    CUcontext ctx;
    CUdevice dev;
    cudaError_t e;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if ((e = cudaGetDeviceCount(&ndev)) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA GPU visible (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none");
        return 77;
    }
    if (cuda_failed("cudaSetDevice", cudaSetDevice(0)) || cuda_failed("cudaFree(NULL)", cudaFree(NULL)) ||
        cuda_failed("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, 0)) ||
        cuda_failed("cudaStreamCreate", cudaStreamCreate(&stream)))
        return 1;
    if (!(cu = colld_cu_load(err, sizeof(err))) || cu->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS ||
        cu->cuCtxGetDevice(&dev) != CUDA_SUCCESS) {
        printf("the CUDA driver API: %s\n", cu ? "no current context" : err);
        return 1;
    }
    if (colld_cuda_kernels_load(cu, &ctx, &dev, 1, &kernels, err, sizeof(err)) != COLLD_OK) {
        printf("colld_cuda_kernels_load: %s\n", err);
        return 1;
    }
    printf("device 0: %s, compute capability %d.%d, %d multiprocessors\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);

    failures = kcheck_run(&gpu);
    if (failures == 0)
        report_bandwidth();
    (void)cuda_failed("cudaStreamDestroy", cudaStreamDestroy(stream));
    (void)cuda_failed("cudaDeviceSynchronize", cudaDeviceSynchronize());
    colld_cuda_kernels_unload(kernels);
    return failures == 0 ? 0 : 1;
}
