/*
 * launch.cu - the one place where the CUDA kernels meet the CUDA runtime: device discovery and
 * kernel launch, with every CUDA error turned into COLLD_ERR_DEVICE and a sentence in
 * colld_cuda_last_error().
 */
#include "kernels/cuda/cuda_plan.h"

#include <cuda_runtime.h>

/* Record a CUDA error for colld_cuda_last_error() and clear it from the runtime's last-error slot
 * (a sticky error stays in the context whatever we do), so that it is reported once, here. */
static colld_status_t device_error(const char *what, const char *call, cudaError_t e)
{
    (void)cudaGetLastError();
    colld__cuda_set_error("%s: %s failed: %s: %s (check that the stream belongs to the current "
                          "device; run under compute-sanitizer for details)",
                          what, call, cudaGetErrorName(e), cudaGetErrorString(e));
    return COLLD_ERR_DEVICE;
}

/* See cuda_plan.h. The grid: one thread per work item up to COLLD__CUDA_BLOCKS_PER_SM blocks per
 * multiprocessor of the current device; the kernels' grid-stride loops do the rest. */
extern "C" colld_status_t colld__cuda_launch(const void *kernel, void *params, size_t work, void *stream,
                                             const char *what)
{
    int dev = 0, sms = 0;
    cudaError_t e;
    size_t blocks, max_blocks;
    void *args[1] = {params};

    if (kernel == NULL) {
        colld__cuda_set_error("%s: no kernel for these arguments", what);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return device_error(what, "cudaGetDevice", e);
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return device_error(what, "cudaDeviceGetAttribute", e);
    if (sms < 1)
        sms = 1;
    blocks = (work + COLLD__CUDA_THREADS - 1) / COLLD__CUDA_THREADS;
    max_blocks = (size_t)sms * COLLD__CUDA_BLOCKS_PER_SM;
    if (blocks > max_blocks)
        blocks = max_blocks;
    if (blocks < 1)
        blocks = 1;
    e = cudaLaunchKernel(kernel, dim3((unsigned)blocks), dim3(COLLD__CUDA_THREADS), args, 0,
                         (cudaStream_t)stream);
    if (e != cudaSuccess)
        return device_error(what, "cudaLaunchKernel", e);
    return COLLD_OK;
}

/* Public: the number of usable CUDA devices; 0 with the reason recorded when the driver or the
 * devices are missing. */
extern "C" int colld_cuda_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);

    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        colld__cuda_set_error("no usable CUDA device: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        return 0;
    }
    if (n == 0)
        colld__cuda_set_error("no usable CUDA device: the driver reports none");
    return n;
}
