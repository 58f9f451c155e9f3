/*
 * test_cudafake.h - what the two files of the CUDA driver test double's own test share: the entry
 * points it calls (looked up with cuGetProcAddress at the versions listed, typed with
 * cudaTypedefs.h's PFN types, as a careful application would), the double's control functions, and
 * small helpers.
 *
 * The test reads and writes flags in host memory registered with CU_MEMHOSTREGISTER_DEVICEMAP (as
 * colld's flag area is), with host atomics; device memory is read back with cuMemcpyDtoH, except
 * where a stream is deliberately blocked (the legacy stream would wait for it): there the test
 * reads the double's device memory through its host address, which only the double allows.
 */
#ifndef COLLD_TESTS_CUDAFAKE_TEST_CUDAFAKE_H
#define COLLD_TESTS_CUDAFAKE_TEST_CUDAFAKE_H

#include <cuda.h>
#include <cudaTypedefs.h>

#include "tests/cudafake/cudafake.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

/* X(name, version): every entry point the test calls. */
#define CF_API(X)                                                                                            \
    X(cuInit, 2000) X(cuDriverGetVersion, 2020) X(cuGetErrorName, 6000) X(cuGetErrorString, 6000)            \
    X(cuDeviceGetCount, 2000) X(cuDeviceGet, 2000) X(cuDeviceGetName, 2000) X(cuDeviceGetUuid, 11040)        \
    X(cuDeviceGetAttribute, 2000) X(cuDeviceCanAccessPeer, 4000) X(cuDeviceTotalMem, 3020)                   \
    X(cuDevicePrimaryCtxRetain, 7000) X(cuDevicePrimaryCtxRelease, 11000) X(cuDevicePrimaryCtxReset, 11000)  \
    X(cuDevicePrimaryCtxGetState, 7000) X(cuCtxSetCurrent, 4000) X(cuCtxGetCurrent, 4000)                    \
    X(cuCtxGetDevice, 2000) X(cuCtxGetId, 12000) X(cuCtxPushCurrent, 4000) X(cuCtxPopCurrent, 4000)            \
    X(cuCtxEnablePeerAccess, 4000)                                                                           \
    X(cuCtxDisablePeerAccess, 4000) X(cuCtxSynchronize, 2000)                                                \
    X(cuStreamCreate, 2000) X(cuStreamDestroy, 4000) X(cuStreamGetCtx, 9020) X(cuStreamGetId, 12000)        \
    X(cuStreamWaitEvent, 3020)                                                                               \
    X(cuStreamSynchronize, 2000) X(cuStreamQuery, 2000) X(cuStreamWriteValue32, 11070)                      \
    X(cuStreamWaitValue32, 11070) X(cuStreamWriteValue64, 11070) X(cuStreamWaitValue64, 11070)               \
    X(cuStreamBatchMemOp, 11070) X(cuLaunchHostFunc, 10000)                                                  \
    X(cuEventCreate, 2000) X(cuEventRecord, 2000) X(cuEventRecordWithFlags, 11010) X(cuEventQuery, 2000)    \
    X(cuEventSynchronize, 2000) X(cuEventDestroy, 4000) X(cuEventElapsedTime, 2000)                          \
    X(cuPointerGetAttribute, 4000) X(cuPointerGetAttributes, 7000) X(cuMemGetAddressRange, 3020)             \
    X(cuMemAlloc, 3020) X(cuMemFree, 3020) X(cuMemcpyHtoD, 3020) X(cuMemcpyDtoH, 3020) X(cuMemsetD8, 3020)   \
    X(cuMemcpyHtoDAsync, 3020) X(cuMemcpyDtoHAsync, 3020)                                                   \
    X(cuIpcGetMemHandle, 4010) X(cuIpcOpenMemHandle, 11000) X(cuIpcCloseMemHandle, 4010)                     \
    X(cuMemCreate, 10020) X(cuMemRelease, 10020) X(cuMemAddressReserve, 10020) X(cuMemAddressFree, 10020)    \
    X(cuMemMap, 10020) X(cuMemUnmap, 10020) X(cuMemSetAccess, 10020) X(cuMemGetAccess, 10020)                \
    X(cuMemGetAllocationGranularity, 10020) X(cuMemExportToShareableHandle, 10020)                           \
    X(cuMemImportFromShareableHandle, 10020) X(cuMemRetainAllocationHandle, 11000)                           \
    X(cuMemGetAllocationPropertiesFromHandle, 10020)                                                         \
    X(cuMemHostRegister, 6050) X(cuMemHostUnregister, 4000) X(cuMemHostGetDevicePointer, 3020)               \
    X(cuLibraryLoadData, 12000) X(cuLibraryUnload, 12000) X(cuLibraryGetKernel, 12000)                      \
    X(cuLibraryGetKernelCount, 12040) X(cuLibraryEnumerateKernels, 12040) X(cuKernelGetFunction, 12000)     \
    X(cuKernelGetName, 12030) X(cuModuleLoadData, 2000) X(cuModuleUnload, 2000) X(cuModuleGetFunction, 2000) \
    X(cuLaunchKernel, 4000)                                                                                  \
    X(cuStreamBeginCapture, 10010) X(cuStreamEndCapture, 10000) X(cuStreamIsCapturing, 10000)                \
    X(cuStreamGetCaptureInfo, 12030) X(cuGraphInstantiateWithFlags, 11040) X(cuGraphLaunch, 10000)           \
    X(cuGraphDestroy, 10000) X(cuGraphExecDestroy, 10000) X(cuGraphGetNodes, 10000)                          \
    X(cuUserObjectCreate, 11030) X(cuUserObjectRelease, 11030) X(cuGraphRetainUserObject, 11030)             \
    X(cuGraphReleaseUserObject, 11030) X(cuThreadExchangeStreamCaptureMode, 10010)

#define CF_MEMBER(name, version) PFN_##name##_v##version name;
typedef struct {
    CF_API(CF_MEMBER)
    PFN_cuGetProcAddress_v12000 get_proc;
    colld_cudafake_control_fn control;
    colld_cudafake_calls_fn calls;
    colld_cudafake_stream_id_fn stream_id;
} cf_api_t;
#undef CF_MEMBER

extern cf_api_t cu;
extern CUcontext cf_ctx[3]; /* the devices' primary contexts, retained for the whole test */

/* The three devices of the test (COLLD_CUDAFAKE_DEVICES in test_cudafake.c). */
enum { DEV_A = 0, DEV_B = 1, DEV_ISO = 2 };

/* A CUresult check that names both results when it fails. */
void cf_expect(CUresult got, CUresult want, const char *expr, const char *file, int line);
#define CU_OK(x) cf_expect((x), CUDA_SUCCESS, #x, __FILE__, __LINE__)
#define CU_IS(x, want) cf_expect((x), (want), #x, __FILE__, __LINE__)

/* Make device dev's primary context current. */
void cf_use(int dev);

/* A page of host memory registered DEVICEMAP | PORTABLE: its host address (*host) and device
 * address (return value). Released by cf_flags_free. */
CUdeviceptr cf_flags(uint32_t **host);
void cf_flags_free(uint32_t *host);

/* Wait (at most 20 s) until *p == want; false if it never did. */
bool cf_wait_eq(const uint32_t *p, uint32_t want);

/* Let the double's workers run for a while: a bounded observation window for "this must not
 * happen" checks (it can never make a correct double fail, only miss a wrong one under load). */
void cf_pause(void);

/* Run colld-cudafake-helper with args (NULL-terminated) and extra environment entries (NULL-
 * terminated; "NAME=" with nothing after removes NAME); inherit fd `keep` as fd 100 (unless -1).
 * Returns its first line of output in out. */
void cf_helper(char *out, size_t len, const char *const *args, const char *const *env, int keep);

/* The tests of test_cudafake_graph.c. */
void test_capture_replay(void **state);
void test_capture_refusals(void **state);
void test_capture_fork_join(void **state);
void test_graph_user_objects(void **state);
void test_graph_launch_order(void **state);
void test_capture_mode_exchange(void **state);

#endif /* COLLD_TESTS_CUDAFAKE_TEST_CUDAFAKE_H */
