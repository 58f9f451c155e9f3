/*
 * colld_perf_gpu.c - colld-perf's GPU mode (-G, --gpu): every rank's buffers on GPU 0 (cudaMalloc,
 * with pinned host images that the inputs are generated in and the results copied back to) and
 * every call on the rank's own stream. The measurement itself is in colld_perf_bench.c; this file
 * holds every CUDA call. In a build without CUDA (no COLLD_HAVE_CUDA) -G is refused when the
 * options are parsed, and the functions here compile to empty bodies that nothing calls.
 */
#include "colld_perf.h"

#ifdef COLLD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------------------------------------
 * GPU mode: device buffers mirror the host images; everything runs on the rank's stream
 * ------------------------------------------------------------------------------------------- */

/* The device address of a byte of the host images (GPU mode), or the host address itself. */
void *dev_ptr(const rank_t *R, const void *host)
{
    const unsigned char *p = host;
    if (!R->o->gpu)
        return (void *)p;
    if (p >= R->sbuf && p < R->sbuf + R->bytes)
        return R->dsbuf + (p - R->sbuf);
    if (p >= R->rbuf && p < R->rbuf + R->bytes)
        return R->drbuf + (p - R->rbuf);
    return R->dsmall + (p - R->small);
}

#ifdef COLLD_HAVE_CUDA
/* A CUDA error of this rank as a colld status (printed). */
static colld_status_t cuda_status(const rank_t *R, const char *what, cudaError_t e)
{
    if (e == cudaSuccess)
        return COLLD_OK;
    fprintf(stderr, PROG ": rank %d: %s: %s: %s\n", R->rank, what, cudaGetErrorName(e), cudaGetErrorString(e));
    return COLLD_ERR_DEVICE;
}

/* Copy len bytes at host image address p to the device (to_dev) or back, on the stream. */
colld_status_t gpu_copy(rank_t *R, void *p, size_t len, bool to_dev)
{
    if (!len)
        return COLLD_OK;
    cudaError_t e = to_dev ? cudaMemcpyAsync(dev_ptr(R, p), p, len, cudaMemcpyHostToDevice, R->stream)
                           : cudaMemcpyAsync(p, dev_ptr(R, p), len, cudaMemcpyDeviceToHost, R->stream);
    return cuda_status(R, to_dev ? "cudaMemcpyAsync H2D" : "cudaMemcpyAsync D2H", e);
}

/* Wait for the stream as nccl-tests does: poll cudaStreamQuery, and the communicator's
 * asynchronous error now and then, so a failed collective ends the wait with its error. */
colld_status_t gpu_wait(rank_t *R)
{
    for (unsigned i = 0;; i++) {
        cudaError_t e = cudaStreamQuery(R->stream);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady)
            return cuda_status(R, "cudaStreamQuery", e);
        if (i % 1024 == 1023) {
            colld_status_t err = COLLD_OK;
            if (colld_comm_get_async_error(R->comm, &err) == COLLD_OK && err != COLLD_OK && err != COLLD_INPROGRESS)
                return err;
        }
    }
    colld_status_t err = COLLD_OK;
    colld_status_t st = colld_comm_get_async_error(R->comm, &err);
    return st != COLLD_OK ? st : err == COLLD_INPROGRESS ? COLLD_OK : err;
}

/* Rank 0's device-to-device copy bandwidth at `bytes` (read + write: 2 x bytes / time), GB/s. */
double gpu_d2d_gbs(rank_t *R, size_t bytes)
{
    int iters = R->o->iters < 5 ? 5 : R->o->iters;
    if (!bytes)
        return 0;
    for (int i = 0; i < 2; i++)
        if (cudaMemcpyAsync(R->drbuf, R->dsbuf, bytes, cudaMemcpyDeviceToDevice, R->stream) != cudaSuccess)
            return 0;
    if (cuda_status(R, "cudaStreamSynchronize", cudaStreamSynchronize(R->stream)) != COLLD_OK)
        return 0;
    double t0 = now_us();
    for (int i = 0; i < iters; i++)
        if (cuda_status(R, "cudaMemcpyAsync D2D",
                        cudaMemcpyAsync(R->drbuf, R->dsbuf, bytes, cudaMemcpyDeviceToDevice, R->stream)) != COLLD_OK)
            return 0;
    if (cuda_status(R, "cudaStreamSynchronize", cudaStreamSynchronize(R->stream)) != COLLD_OK)
        return 0;
    double us = (now_us() - t0) / iters;
    return us > 0 ? 2.0 * (double)bytes / us / 1e3 : 0;
}

/* GPU mode set-up: device 0, a stream, device buffers and pinned host images. 0 or -1 (printed). */
int gpu_setup(rank_t *R)
{
    cudaStream_t st = NULL;
    if (cuda_status(R, "cudaSetDevice(0)", cudaSetDevice(0)) != COLLD_OK ||
        cuda_status(R, "cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) != COLLD_OK)
        return -1;
    R->stream = st;
    if (cuda_status(R, "cudaMalloc", cudaMalloc((void **)&R->dsbuf, R->bytes)) != COLLD_OK ||
        cuda_status(R, "cudaMalloc", cudaMalloc((void **)&R->drbuf, R->bytes)) != COLLD_OK ||
        cuda_status(R, "cudaMalloc", cudaMalloc((void **)&R->dsmall, SMALL_BYTES)) != COLLD_OK ||
        cuda_status(R, "cudaMallocHost", cudaMallocHost((void **)&R->sbuf, R->bytes)) != COLLD_OK ||
        cuda_status(R, "cudaMallocHost", cudaMallocHost((void **)&R->rbuf, R->bytes)) != COLLD_OK ||
        cuda_status(R, "cudaMallocHost", cudaMallocHost((void **)&R->small, SMALL_BYTES)) != COLLD_OK)
        return -1;
    if (!(R->lat = calloc((size_t)R->o->iters, sizeof(double)))) {
        fprintf(stderr, PROG ": rank %d: out of memory\n", R->rank);
        return -1;
    }
    return 0;
}

void gpu_teardown(rank_t *R)
{
    if (R->stream)
        cudaStreamSynchronize(R->stream);
    cudaFree(R->dsbuf);
    cudaFree(R->drbuf);
    cudaFree(R->dsmall);
    cudaFreeHost(R->sbuf);
    cudaFreeHost(R->rbuf);
    cudaFreeHost(R->small);
    if (R->stream)
        cudaStreamDestroy(R->stream);
    if (R->busy_stream) {
        cudaStreamSynchronize(R->busy_stream);
        cudaStreamDestroy(R->busy_stream);
    }
    for (int i = 0; i < 2; i++)
        if (R->ev[i])
            cudaEventDestroy((cudaEvent_t)R->ev[i]);
    free(R->lat);
}

/* colld_perf_busy.cu */
cudaError_t colld_perf_busy_launch(void *stream, int blocks, long long cycles);

colld_status_t gpu_busy(rank_t *R, int blocks, long long cycles)
{
    if (!R->busy_stream) {
        cudaStream_t st = NULL;
        colld_status_t s = cuda_status(R, "cudaStreamCreateWithFlags (busy)",
                                       cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        if (s != COLLD_OK)
            return s;
        R->busy_stream = st;
    }
    return cuda_status(R, "the busy kernel's launch", colld_perf_busy_launch(R->busy_stream, blocks, cycles));
}

colld_status_t gpu_busy_wait(rank_t *R)
{
    return cuda_status(R, "cudaStreamSynchronize (busy)", cudaStreamSynchronize(R->busy_stream));
}

colld_status_t gpu_busy_here(rank_t *R, int blocks, long long cycles)
{
    return cuda_status(R, "the busy kernel's launch (rank's stream)",
                       colld_perf_busy_launch(R->stream, blocks, cycles));
}

colld_status_t gpu_mark(rank_t *R, int which)
{
    if (!R->ev[which]) {
        cudaEvent_t e = NULL;
        colld_status_t s = cuda_status(R, "cudaEventCreate", cudaEventCreate(&e));
        if (s != COLLD_OK)
            return s;
        R->ev[which] = e;
    }
    return cuda_status(R, "cudaEventRecord", cudaEventRecord((cudaEvent_t)R->ev[which], R->stream));
}

double gpu_marks_us(rank_t *R)
{
    float ms = 0;
    if (cuda_status(R, "cudaEventElapsedTime",
                    cudaEventElapsedTime(&ms, (cudaEvent_t)R->ev[0], (cudaEvent_t)R->ev[1])) != COLLD_OK)
        return -1;
    return ms * 1e3;
}

int gpu_sm_count(void)
{
    int n = 0;
    return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess ? n : 0;
}

/* The device name of GPU 0 for the header. */
void gpu_name(char *buf, size_t len)
{
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        snprintf(buf, len, "%.100s, %d SMs, %.0f GiB", prop.name, prop.multiProcessorCount,
                 (double)prop.totalGlobalMem / (1 << 30));
    else
        snprintf(buf, len, "?");
}

/* The launcher's check before anything starts: is a GPU visible? 0, or -1 (printed). */
int gpu_visible(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0)
        return 0;
    fprintf(stderr, PROG ": --gpu: no CUDA GPU is visible (cudaGetDeviceCount: %s%s%s)\n",
            e != cudaSuccess ? cudaGetErrorName(e) : "0 devices", e != cudaSuccess ? ": " : "",
            e != cudaSuccess ? cudaGetErrorString(e) : "");
    return -1;
}
#else
/* Without CUDA, -G is refused when the options are parsed; these are never reached. */
colld_status_t gpu_copy(rank_t *R, void *p, size_t len, bool to_dev)
{
    (void)R, (void)p, (void)len, (void)to_dev;
    return COLLD_ERR_NOT_SUPPORTED;
}
colld_status_t gpu_wait(rank_t *R)
{
    (void)R;
    return COLLD_ERR_NOT_SUPPORTED;
}
double gpu_d2d_gbs(rank_t *R, size_t bytes)
{
    (void)R, (void)bytes;
    return 0;
}
int gpu_setup(rank_t *R)
{
    (void)R;
    return -1;
}
void gpu_teardown(rank_t *R)
{
    (void)R;
}
void gpu_name(char *buf, size_t len)
{
    snprintf(buf, len, "?");
}
int gpu_visible(void)
{
    return -1;
}
colld_status_t gpu_busy(rank_t *R, int blocks, long long cycles)
{
    (void)R, (void)blocks, (void)cycles;
    return COLLD_ERR_NOT_SUPPORTED;
}
colld_status_t gpu_busy_wait(rank_t *R)
{
    (void)R;
    return COLLD_ERR_NOT_SUPPORTED;
}
int gpu_sm_count(void)
{
    return 0;
}
colld_status_t gpu_busy_here(rank_t *R, int blocks, long long cycles)
{
    (void)R, (void)blocks, (void)cycles;
    return COLLD_ERR_NOT_SUPPORTED;
}
colld_status_t gpu_mark(rank_t *R, int which)
{
    (void)R, (void)which;
    return COLLD_ERR_NOT_SUPPORTED;
}
double gpu_marks_us(rank_t *R)
{
    (void)R;
    return -1;
}
#endif
