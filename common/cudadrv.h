/*
 * cudadrv.h - the CUDA driver API, loaded at run time (dlopen "libcuda.so.1").
 *
 * Neither the daemon nor libcolld links the driver: a host without an NVIDIA driver (or a build
 * machine with only the toolkit's stubs) runs every host path unchanged, and the GPU paths answer
 * with a clear reason instead of failing to start. Entry points are looked up through
 * cuGetProcAddress at the CUDA 12.0 ABI, so a newer driver serves them with the signatures
 * declared here (those of the cuda.h this was compiled with, which match 12.0 for every function
 * in the list).
 *
 * Only compiled where the CUDA toolkit's headers are found (COLLD_HAVE_CUDA); without them
 * colld_cu_load() reports that the build has no CUDA support.
 */
#ifndef COLLD_COMMON_CUDADRV_H
#define COLLD_COMMON_CUDADRV_H

#include <stdbool.h>
#include <stddef.h>

#ifdef COLLD_HAVE_CUDA
#include <cuda.h>

/* X(name): every driver function colld calls (the daemon's kernels too: kernels/cuda/launch.c
 * loads its embedded fatbin with cuLibraryLoadData and launches with cuLaunchKernel; the library
 * management calls exist from CUDA 12.0 on). */
#define COLLD_CU_FUNCS(X)                                                                                    \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                                    \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetUuid) X(cuDeviceGetAttribute)         \
    X(cuDeviceCanAccessPeer) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                        \
    X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxPushCurrent) X(cuCtxPopCurrent)           \
    X(cuCtxEnablePeerAccess) X(cuCtxSynchronize)                                                             \
    X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamGetCtx) X(cuStreamWaitEvent) X(cuStreamSynchronize)        \
    X(cuStreamQuery) X(cuStreamWriteValue32) X(cuStreamWaitValue32)                                          \
    X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventDestroy) X(cuEventSynchronize)                \
    X(cuEventElapsedTime)                                                                                    \
    X(cuPointerGetAttributes) X(cuMemGetAddressRange) X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD)              \
    X(cuMemcpyDtoH) X(cuMemsetD8)                                                                            \
    X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)                                        \
    X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap)       \
    X(cuMemSetAccess) X(cuMemGetAllocationGranularity) X(cuMemExportToShareableHandle)                      \
    X(cuMemImportFromShareableHandle) X(cuMemRetainAllocationHandle)                                         \
    X(cuMemGetAllocationPropertiesFromHandle)                                                                \
    X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemHostGetDevicePointer)                               \
    X(cuLibraryLoadData) X(cuLibraryUnload) X(cuLibraryGetKernel) X(cuKernelGetFunction) X(cuLaunchKernel)

#define COLLD_CU_MEMBER(name) __typeof__(&name) name;
typedef struct {
    COLLD_CU_FUNCS(COLLD_CU_MEMBER)
    int driver_version; /* cuDriverGetVersion, e.g. 12080 */
} colld_cu_t;
#undef COLLD_CU_MEMBER

/* "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)" into buf; returns buf. */
const char *colld_cu_describe(const colld_cu_t *cu, CUresult r, char *buf, size_t len);

/* The boundary with the driver: every call goes through CU_CHECK (or CU_CHECK_EXPECT), which
 * returns the call's result unchanged for the caller to act on, and logs a result other than
 * CUDA_SUCCESS (and than `expected`, a result the caller treats as normal, such as
 * CUDA_ERROR_NOT_READY of a query) with the call's name and source location: a warning, at most a
 * line per 5 s with the count of the others, so that even a cleanup whose failure changes nothing
 * leaves a trace of where the driver refused. */
CUresult colld_cu_checked(const colld_cu_t *cu, CUresult r, CUresult expected, const char *call, const char *file,
                          int line);
#define CU_CHECK(cu, fn, ...) colld_cu_checked((cu), (cu)->fn(__VA_ARGS__), CUDA_SUCCESS, #fn, __FILE__, __LINE__)
#define CU_CHECK_EXPECT(cu, expected, fn, ...)                                                     \
    colld_cu_checked((cu), (cu)->fn(__VA_ARGS__), (expected), #fn, __FILE__, __LINE__)
#else
typedef struct colld_cu colld_cu_t;
#endif

/* Load the driver and cuInit(0) it, once per process (thread-safe). Returns the table, or NULL
 * with the reason in err (no libcuda.so.1, a driver older than CUDA 12.0, cuInit failed: no device,
 * a broken installation, ...). The same answer is given to every later call. */
const colld_cu_t *colld_cu_load(char *err, size_t len);

/* True when libcuda.so.1 is already loaded in this process (the application uses CUDA), without
 * loading it. */
bool colld_cu_in_process(void);

#endif /* COLLD_COMMON_CUDADRV_H */
