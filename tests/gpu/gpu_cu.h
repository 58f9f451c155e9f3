/*
 * gpu_cu.h - the CUDA driver API for the GPU tests of tests/gpu (their own loader, separate from
 * colld's common/cudadrv.h): the rank program (gpu_rank.c), its driver (test_gpu_collectives.c) and
 * the kernel test (test_cuda_kernels.c) use the driver API only, never the CUDA runtime, so that the
 * same binaries run on a real GPU and on the CUDA driver test double (tests/cudafake), which the
 * runtime cannot initialise on.
 *
 * dlopen("libcuda.so.1") and every entry point through cuGetProcAddress at the CUDA 12.0 ABI, each
 * typed with the toolkit's PFN_<name>_v<version> of the variant that ABI selects (no __typeof__ of
 * a header prototype, which follows the header's version).
 *
 * Only the double when asked for: with `want_double` (the ctest registrations made with
 * colld_test_with_cudafake pass --cudafake), the libcuda.so.1 found must export
 * colld_cudafake_control (the double alone does), checked before any CUDA call, so that a real
 * driver found because the double was missing is never initialised by a test meant for the double.
 */
#ifndef COLLD_TESTS_GPU_GPU_CU_H
#define COLLD_TESTS_GPU_GPU_CU_H

#include <cuda.h>
#include <cudaTypedefs.h>

#include <stdbool.h>
#include <stddef.h>

/* X(member, PFN type): every driver call the GPU tests make, at the 12.0 ABI. */
#define GPU_CU_FUNCS(X)                                                                                      \
    X(cuInit, PFN_cuInit_v2000) X(cuDriverGetVersion, PFN_cuDriverGetVersion_v2020)                          \
    X(cuGetErrorName, PFN_cuGetErrorName_v6000) X(cuGetErrorString, PFN_cuGetErrorString_v6000)              \
    X(cuDeviceGetCount, PFN_cuDeviceGetCount_v2000) X(cuDeviceGet, PFN_cuDeviceGet_v2000)                    \
    X(cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000)                                          \
    X(cuDevicePrimaryCtxRelease, PFN_cuDevicePrimaryCtxRelease_v11000)                                       \
    X(cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000) X(cuCtxSynchronize, PFN_cuCtxSynchronize_v2000)            \
    X(cuStreamCreate, PFN_cuStreamCreate_v2000) X(cuStreamDestroy, PFN_cuStreamDestroy_v4000)                \
    X(cuStreamQuery, PFN_cuStreamQuery_v2000) X(cuStreamSynchronize, PFN_cuStreamSynchronize_v2000)          \
    X(cuMemAlloc, PFN_cuMemAlloc_v3020) X(cuMemFree, PFN_cuMemFree_v3020)                                    \
    X(cuMemcpyHtoD, PFN_cuMemcpyHtoD_v3020) X(cuMemcpyDtoH, PFN_cuMemcpyDtoH_v3020)                          \
    X(cuMemcpyHtoDAsync, PFN_cuMemcpyHtoDAsync_v3020) X(cuMemcpyDtoHAsync, PFN_cuMemcpyDtoHAsync_v3020)      \
    X(cuMemsetD8, PFN_cuMemsetD8_v3020)                                                                      \
    X(cuMemHostRegister, PFN_cuMemHostRegister_v6050) X(cuMemHostUnregister, PFN_cuMemHostUnregister_v4000)  \
    X(cuMemHostGetDevicePointer, PFN_cuMemHostGetDevicePointer_v3020)                                        \
    X(cuStreamWaitValue32, PFN_cuStreamWaitValue32_v11070)                                                   \
    X(cuLibraryLoadData, PFN_cuLibraryLoadData_v12000) X(cuLibraryUnload, PFN_cuLibraryUnload_v12000)        \
    X(cuLibraryGetKernel, PFN_cuLibraryGetKernel_v12000) X(cuKernelGetFunction, PFN_cuKernelGetFunction_v12000) \
    X(cuLaunchKernel, PFN_cuLaunchKernel_v4000)

#define GPU_CU_MEMBER(name, type) type name;
typedef struct {
    GPU_CU_FUNCS(GPU_CU_MEMBER)
    bool on_double; /* the libcuda.so.1 loaded is the CUDA driver test double */
    int ndev;       /* devices visible */
} gpu_cu_t;
#undef GPU_CU_MEMBER

typedef enum {
    GPU_CU_OK = 0,
    GPU_CU_NONE = 1,   /* no driver or no device: a test on hardware skips (77) */
    GPU_CU_ERROR = -1, /* the wrong driver (not the double when it must be), or a broken one */
} gpu_cu_result_t;

/* Load the driver once for the process, check it is the double when want_double (before any CUDA
 * call), look every entry point up and cuInit(0) it. On anything but GPU_CU_OK, why in err. */
gpu_cu_result_t gpu_cu_load(gpu_cu_t *cu, bool want_double, char *err, size_t len);

/* "CUDA_ERROR_X (text)" for a result, into buf; returns buf. */
const char *gpu_cu_describe(const gpu_cu_t *cu, CUresult r, char *buf, size_t len);

/* Make device `dev`'s primary context current on this thread (retained for the process's life,
 * as the CUDA runtime does). CUDA_SUCCESS or the failing call's result. */
CUresult gpu_cu_use_device(const gpu_cu_t *cu, int dev);

/* Page-aligned host memory, registered with the driver (pinned: asynchronous copies from and to it
 * are truly asynchronous on a GPU, as cudaMallocHost's memory is). NULL on failure (why in err). */
void *gpu_cu_host_alloc(const gpu_cu_t *cu, size_t bytes, char *err, size_t len);
void gpu_cu_host_free(const gpu_cu_t *cu, void *p, size_t bytes);

#endif /* COLLD_TESTS_GPU_GPU_CU_H */
