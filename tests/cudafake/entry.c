/*
 * entry.c - the front door of the CUDA driver test double: cuGetProcAddress and its table of
 * versioned entry points, cuInit, cuDriverGetVersion, error names and strings, the handle
 * registry, and the prologue of every entry point (fk_enter).
 *
 * cuGetProcAddress behaves as the driver documents it (cuda.h): the symbol is a base name
 * ("cuMemAlloc"), the version picks the newest variant introduced at or before it (cuMemAlloc at
 * 12000 is cuMemAlloc_v2, cuStreamGetCaptureInfo at 12000 is _v2 with six parameters, at 12030
 * _v3 with seven); a version above the driver's is CUDA_ERROR_INVALID_VALUE; an unknown symbol is
 * CUDA_SUCCESS with a NULL pointer and CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, a known one asked at
 * too old a version CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT. "Unknown" here means "not
 * implemented by the double": it offers exactly what colld uses, and a program that asks for
 * anything else sees it missing instead of getting a half-right imitation.
 *
 * Every table row is checked at compile time against cudaTypedefs.h's PFN_<name>_v<version>, and
 * every implementation against the driver's own prototype in cuda.h.
 */
#include "tests/cudafake/fake.h"

#include <cudaTypedefs.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

fk_state_t fk = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .once = PTHREAD_ONCE_INIT,
};

/* ============================================================================================
 * The entry table: X(base name, version, implementation).
 * ========================================================================================== */

#define FK_PROCS(X)                                                                                          \
    X(cuInit, 2000, cuInit)                                                                                  \
    X(cuDriverGetVersion, 2020, cuDriverGetVersion)                                                          \
    X(cuGetErrorName, 6000, cuGetErrorName)                                                                  \
    X(cuGetErrorString, 6000, cuGetErrorString)                                                              \
    X(cuGetProcAddress, 11030, cuGetProcAddress)                                                             \
    X(cuGetProcAddress, 12000, cuGetProcAddress_v2)                                                          \
    X(cuDeviceGetCount, 2000, cuDeviceGetCount)                                                              \
    X(cuDeviceGet, 2000, cuDeviceGet)                                                                        \
    X(cuDeviceGetName, 2000, cuDeviceGetName)                                                                \
    X(cuDeviceGetUuid, 9020, cuDeviceGetUuid)                                                                \
    X(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2)                                                            \
    X(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute)                                                      \
    X(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2)                                                           \
    X(cuDeviceCanAccessPeer, 4000, cuDeviceCanAccessPeer)                                                    \
    X(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain)                                              \
    X(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease)                                            \
    X(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2)                                        \
    X(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset)                                                \
    X(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2)                                            \
    X(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState)                                          \
    X(cuDevicePrimaryCtxSetFlags, 11000, cuDevicePrimaryCtxSetFlags_v2)                                      \
    X(cuCtxSetCurrent, 4000, cuCtxSetCurrent)                                                                \
    X(cuCtxGetCurrent, 4000, cuCtxGetCurrent)                                                                \
    X(cuCtxGetDevice, 2000, cuCtxGetDevice)                                                                  \
    X(cuCtxGetDevice, 13000, cuCtxGetDevice_v2)                                                              \
    X(cuCtxGetId, 12000, cuCtxGetId)                                                                         \
    X(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2)                                                           \
    X(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2)                                                             \
    X(cuCtxEnablePeerAccess, 4000, cuCtxEnablePeerAccess)                                                    \
    X(cuCtxDisablePeerAccess, 4000, cuCtxDisablePeerAccess)                                                  \
    X(cuCtxSynchronize, 2000, cuCtxSynchronize)                                                              \
    X(cuCtxSynchronize, 13000, cuCtxSynchronize_v2)                                                          \
    X(cuStreamCreate, 2000, cuStreamCreate)                                                                  \
    X(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority)                                          \
    X(cuStreamDestroy, 4000, cuStreamDestroy_v2)                                                             \
    X(cuStreamGetCtx, 9020, cuStreamGetCtx)                                                                  \
    X(cuStreamGetCtx, 12050, cuStreamGetCtx_v2)                                                              \
    X(cuStreamGetId, 12000, cuStreamGetId)                                                                   \
    X(cuStreamGetFlags, 5050, cuStreamGetFlags)                                                              \
    X(cuStreamWaitEvent, 3020, cuStreamWaitEvent)                                                            \
    X(cuStreamSynchronize, 2000, cuStreamSynchronize)                                                        \
    X(cuStreamQuery, 2000, cuStreamQuery)                                                                    \
    X(cuStreamWriteValue32, 8000, cuStreamWriteValue32)                                                      \
    X(cuStreamWriteValue32, 11070, cuStreamWriteValue32_v2)                                                  \
    X(cuStreamWaitValue32, 8000, cuStreamWaitValue32)                                                        \
    X(cuStreamWaitValue32, 11070, cuStreamWaitValue32_v2)                                                    \
    X(cuStreamWriteValue64, 9000, cuStreamWriteValue64)                                                      \
    X(cuStreamWriteValue64, 11070, cuStreamWriteValue64_v2)                                                  \
    X(cuStreamWaitValue64, 9000, cuStreamWaitValue64)                                                        \
    X(cuStreamWaitValue64, 11070, cuStreamWaitValue64_v2)                                                    \
    X(cuStreamBatchMemOp, 8000, cuStreamBatchMemOp)                                                          \
    X(cuStreamBatchMemOp, 11070, cuStreamBatchMemOp_v2)                                                      \
    X(cuLaunchHostFunc, 10000, cuLaunchHostFunc)                                                             \
    X(cuEventCreate, 2000, cuEventCreate)                                                                    \
    X(cuEventRecord, 2000, cuEventRecord)                                                                    \
    X(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags)                                                 \
    X(cuEventQuery, 2000, cuEventQuery)                                                                      \
    X(cuEventSynchronize, 2000, cuEventSynchronize)                                                          \
    X(cuEventDestroy, 4000, cuEventDestroy_v2)                                                               \
    X(cuEventElapsedTime, 2000, cuEventElapsedTime)                                                          \
    X(cuEventElapsedTime, 12080, cuEventElapsedTime_v2)                                                      \
    X(cuPointerGetAttribute, 4000, cuPointerGetAttribute)                                                    \
    X(cuPointerGetAttributes, 7000, cuPointerGetAttributes)                                                  \
    X(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2)                                                   \
    X(cuMemAlloc, 3020, cuMemAlloc_v2)                                                                       \
    X(cuMemFree, 3020, cuMemFree_v2)                                                                         \
    X(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2)                                                                   \
    X(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2)                                                                   \
    X(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2)                                                        \
    X(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2)                                                         \
    X(cuMemsetD8, 3020, cuMemsetD8_v2)                                                                       \
    X(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle)                                                            \
    X(cuIpcOpenMemHandle, 4010, cuIpcOpenMemHandle)                                                          \
    X(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle_v2)                                                      \
    X(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle)                                                        \
    X(cuMemCreate, 10020, cuMemCreate)                                                                       \
    X(cuMemRelease, 10020, cuMemRelease)                                                                     \
    X(cuMemAddressReserve, 10020, cuMemAddressReserve)                                                       \
    X(cuMemAddressFree, 10020, cuMemAddressFree)                                                             \
    X(cuMemMap, 10020, cuMemMap)                                                                             \
    X(cuMemUnmap, 10020, cuMemUnmap)                                                                         \
    X(cuMemSetAccess, 10020, cuMemSetAccess)                                                                 \
    X(cuMemGetAccess, 10020, cuMemGetAccess)                                                                 \
    X(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity)                                   \
    X(cuMemExportToShareableHandle, 10020, cuMemExportToShareableHandle)                                     \
    X(cuMemImportFromShareableHandle, 10020, cuMemImportFromShareableHandle)                                 \
    X(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle)                                       \
    X(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle)                 \
    X(cuMemHostRegister, 4000, cuMemHostRegister)                                                            \
    X(cuMemHostRegister, 6050, cuMemHostRegister_v2)                                                         \
    X(cuMemHostUnregister, 4000, cuMemHostUnregister)                                                        \
    X(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer_v2)                                         \
    X(cuLibraryLoadData, 12000, cuLibraryLoadData)                                                           \
    X(cuLibraryUnload, 12000, cuLibraryUnload)                                                               \
    X(cuLibraryGetKernel, 12000, cuLibraryGetKernel)                                                         \
    X(cuLibraryGetKernelCount, 12040, cuLibraryGetKernelCount)                                               \
    X(cuLibraryEnumerateKernels, 12040, cuLibraryEnumerateKernels)                                           \
    X(cuKernelGetFunction, 12000, cuKernelGetFunction)                                                       \
    X(cuKernelGetName, 12030, cuKernelGetName)                                                               \
    X(cuModuleLoadData, 2000, cuModuleLoadData)                                                              \
    X(cuModuleUnload, 2000, cuModuleUnload)                                                                  \
    X(cuModuleGetFunction, 2000, cuModuleGetFunction)                                                        \
    X(cuLaunchKernel, 4000, cuLaunchKernel)                                                                  \
    X(cuStreamBeginCapture, 10000, cuStreamBeginCapture)                                                     \
    X(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2)                                                  \
    X(cuStreamEndCapture, 10000, cuStreamEndCapture)                                                         \
    X(cuStreamIsCapturing, 10000, cuStreamIsCapturing)                                                       \
    X(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode)                           \
    X(cuStreamGetCaptureInfo, 11030, cuStreamGetCaptureInfo_v2)                                              \
    X(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3)                                              \
    X(cuGraphInstantiate, 11000, cuGraphInstantiate_v2)                                                      \
    X(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags)                                       \
    X(cuGraphLaunch, 10000, cuGraphLaunch)                                                                   \
    X(cuGraphDestroy, 10000, cuGraphDestroy)                                                                 \
    X(cuGraphExecDestroy, 10000, cuGraphExecDestroy)                                                         \
    X(cuGraphGetNodes, 10000, cuGraphGetNodes)                                                               \
    X(cuUserObjectCreate, 11030, cuUserObjectCreate)                                                         \
    X(cuUserObjectRetain, 11030, cuUserObjectRetain)                                                         \
    X(cuUserObjectRelease, 11030, cuUserObjectRelease)                                                       \
    X(cuGraphRetainUserObject, 11030, cuGraphRetainUserObject)                                               \
    X(cuGraphReleaseUserObject, 11030, cuGraphReleaseUserObject)

/* The ABI check: each implementation has the signature of the versioned PFN type it is served as. */
#define FK_PROC_CHECK(base, version, impl)                                                                   \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&impl), PFN_##base##_v##version),                 \
                   #impl " does not have the signature of PFN_" #base "_v" #version);
FK_PROCS(FK_PROC_CHECK)
#undef FK_PROC_CHECK

typedef struct {
    const char *name;
    int version;
    void *fn;
} proc_t;

#define FK_PROC_ROW(base, version, impl) { #base, version, (void *)&impl },
static const proc_t procs[] = { FK_PROCS(FK_PROC_ROW) };
#undef FK_PROC_ROW

/* The base names and flags of the entries (fault counters, FK_BEGIN). */
#define FK_ENTRY_NAME(name, flags) #name,
static const char *const entry_names[FK_E_COUNT] = { FK_ENTRIES(FK_ENTRY_NAME) };
#undef FK_ENTRY_NAME
#define FK_ENTRY_FLAGS(name, flags) flags,
static const unsigned entry_flags[FK_E_COUNT] = { FK_ENTRIES(FK_ENTRY_FLAGS) };
#undef FK_ENTRY_FLAGS

/* The base name of an entry point (fault specifications, messages). */
const char *fk_entry_name(fk_entry_t e)
{
    return (unsigned)e < FK_E_COUNT ? entry_names[e] : "?";
}

/* ============================================================================================
 * Small utilities
 * ========================================================================================== */

uint64_t fk_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One line on stderr, prefixed so that nobody mistakes it for the real driver. */
void fk_log(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "CUDA driver test double [pid %d]: %s\n", (int)getpid(), buf);
}

/* ============================================================================================
 * Start-up and the prologue of every entry point
 * ========================================================================================== */

static __thread CUresult tls_async_fault;
__thread bool fk_in_destructor;

/* Read the configuration and the fault specifications; the condition variable waits on CLOCK_MONOTONIC. */
static void boot_once(void)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&fk.cv, &ca);
    pthread_condattr_destroy(&ca);
    fk_config_load(&fk.cfg);
    if (!fk_fault_init(fk.cfg.faults, fk.cfg.control_path) && !fk.cfg.error[0])
        snprintf(fk.cfg.error, sizeof(fk.cfg.error), "COLLD_CUDAFAKE_FAULTS is malformed (see above)");
    if (fk.cfg.error[0])
        fk_log("configuration error: %s (cuInit will fail)", fk.cfg.error);
    for (int i = 0; i < FK_MAX_DEVICES; i++)
        fk.ctx[i].dev = i;
}

/* Boot the double once, whichever entry point comes first. */
void fk_boot(void)
{
    pthread_once(&fk.once, boot_once);
}

/* The injected fault of this thread's current call, for the work it enqueues (once). */
CUresult fk_take_async_fault(void)
{
    CUresult r = tls_async_fault;
    tls_async_fault = CUDA_SUCCESS;
    return r;
}

/* The prologue of every entry point (FK_BEGIN): count the call, apply the fault
 * specifications, refuse calls before cuInit. */
CUresult fk_enter(fk_entry_t e)
{
    fk_boot();
    if (fk_in_destructor) {
        /* cuda.h, cuUserObjectCreate: "Destructor callbacks cannot make CUDA API calls". */
        fk_log("%s called from a user object's destructor: the driver forbids CUDA calls there "
               "(CUDA_ERROR_NOT_PERMITTED)",
               fk_entry_name(e));
        return CUDA_ERROR_NOT_PERMITTED;
    }
    bool sticky = false;
    tls_async_fault = CUDA_SUCCESS;
    CUresult r = fk_fault_call(e, &sticky);
    if (r != CUDA_SUCCESS && sticky && (entry_flags[e] & FK_F_ASYNC)) {
        tls_async_fault = r; /* the call succeeds; its work fails when it runs */
        r = CUDA_SUCCESS;
    } else if (r != CUDA_SUCCESS && sticky) {
        pthread_mutex_lock(&fk.mu);
        fk_ctx_t *ctx = fk_ctx_current();
        if (ctx)
            fk_ctx_set_sticky(ctx, r, fk_entry_name(e));
        pthread_mutex_unlock(&fk.mu);
    }
    if (r != CUDA_SUCCESS)
        return r;
    if (!(entry_flags[e] & FK_F_NOINIT)) {
        pthread_mutex_lock(&fk.mu);
        bool ok = fk.inited;
        pthread_mutex_unlock(&fk.mu);
        if (!ok)
            return CUDA_ERROR_NOT_INITIALIZED;
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuInit(unsigned int flags)
{
    FK_BEGIN(cuInit);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    CUresult r = CUDA_SUCCESS;
    if (fk.cfg.error[0])
        r = CUDA_ERROR_INVALID_VALUE;
    else if (fk.cfg.ndev == 0)
        r = CUDA_ERROR_NO_DEVICE;
    else if (!fk.inited && (r = fk_arena_init(fk.cfg.arena_bytes)) == CUDA_SUCCESS)
        fk.inited = true;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    FK_BEGIN(cuDriverGetVersion);
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = fk.cfg.driver_version;
    return CUDA_SUCCESS;
}

/* ============================================================================================
 * cuGetProcAddress
 * ========================================================================================== */

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    if (version > fk.cfg.driver_version)
        return CUDA_ERROR_INVALID_VALUE; /* as documented: newer than the driver */
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        static atomic_bool told;
        if (!atomic_exchange(&told, true))
            fk_log("per-thread default stream variants are not modelled: %s and every later symbol get the "
                   "legacy-stream variant", symbol);
    }
    const proc_t *best = NULL;
    for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
        if (strcmp(procs[i].name, symbol) != 0)
            continue;
        st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        if (procs[i].version <= version && (!best || procs[i].version > best->version))
            best = &procs[i];
    }
    if (best) {
        *pfn = best->fn;
        st = CU_GET_PROC_ADDRESS_SUCCESS;
    }
    if (status)
        *status = st;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                               CUdriverProcAddressQueryResult *symbolStatus)
{
    FK_BEGIN(cuGetProcAddress);
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

FK_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    FK_BEGIN(cuGetProcAddress);
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

/* ============================================================================================
 * Error names and strings
 * ========================================================================================== */

typedef struct {
    CUresult code;
    const char *name;
} result_name_t;

/* Generated from the toolkit's cuda.h at configure time: X(name, value) for every CUresult. */
#define FK_RESULT_ROW(name, value) { (CUresult)(value), #name },
static const result_name_t result_names[] = {
#include "cuda_results.inc"
};
#undef FK_RESULT_ROW

/* The driver's strings for the codes colld meets; the others get a generic sentence. */
static const struct {
    CUresult code;
    const char *text;
} result_texts[] = {
    { CUDA_SUCCESS, "no error" },
    { CUDA_ERROR_INVALID_VALUE, "invalid argument" },
    { CUDA_ERROR_OUT_OF_MEMORY, "out of memory" },
    { CUDA_ERROR_NOT_INITIALIZED, "initialization error" },
    { CUDA_ERROR_DEINITIALIZED, "driver shutting down" },
    { CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected" },
    { CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal" },
    { CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid" },
    { CUDA_ERROR_INVALID_CONTEXT, "invalid device context" },
    { CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current" },
    { CUDA_ERROR_ALREADY_MAPPED, "resource already mapped" },
    { CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device" },
    { CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices" },
    { CUDA_ERROR_INVALID_HANDLE, "invalid resource handle" },
    { CUDA_ERROR_NOT_FOUND, "named symbol not found" },
    { CUDA_ERROR_NOT_READY, "device not ready" },
    { CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered" },
    { CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch" },
    { CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure" },
    { CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled" },
    { CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled" },
    { CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "cannot set while device is active in this process" },
    { CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed" },
    { CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped" },
    { CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region" },
    { CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address" },
    { CUDA_ERROR_NOT_PERMITTED, "operation not permitted" },
    { CUDA_ERROR_NOT_SUPPORTED, "operation not supported" },
    { CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing" },
    { CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture" },
    { CUDA_ERROR_STREAM_CAPTURE_MERGE, "operation would result in a merge of separate capture sequences" },
    { CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not ended in the same stream as it began" },
    { CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work" },
    { CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "dependency created on uncaptured work in another stream" },
    { CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "operation would make the legacy stream depend on a capturing blocking stream" },
    { CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "attempt to terminate a thread-local capture sequence from another thread" },
    { CUDA_ERROR_CAPTURED_EVENT, "operation not permitted on an event last recorded in a capturing stream" },
    { CUDA_ERROR_UNKNOWN, "unknown error" },
};

/* The driver's name of a CUresult, NULL for a code cuda.h does not have. */
const char *fk_result_name(CUresult r)
{
    for (size_t i = 0; i < sizeof(result_names) / sizeof(result_names[0]); i++)
        if (result_names[i].code == r)
            return result_names[i].name;
    return NULL;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    FK_BEGIN(cuGetErrorName);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = fk_result_name(error);
    return *pStr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    FK_BEGIN(cuGetErrorString);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = NULL;
    if (!fk_result_name(error))
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = "an error of the CUDA driver test double (no description)";
    for (size_t i = 0; i < sizeof(result_texts) / sizeof(result_texts[0]); i++)
        if (result_texts[i].code == error)
            *pStr = result_texts[i].text;
    return CUDA_SUCCESS;
}

/* ============================================================================================
 * The handle registry: an open-addressing set of live handles (fk.mu held).
 * ========================================================================================== */

typedef struct {
    const void *h;
    int kind; /* 0: empty, -1: deleted */
} slot_t;

static slot_t *slots;
static size_t nslots, nused;

/* Mix a pointer's bits (handles are aligned heap addresses). */
static size_t slot_hash(const void *h)
{
    uint64_t x = (uint64_t)(uintptr_t)h;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

/* Rehash into a table at most half full of live handles (tombstones are dropped). */
static void slots_grow(void)
{
    size_t live = 0;
    for (size_t i = 0; i < nslots; i++)
        live += slots[i].kind > 0;
    size_t n = nslots ? nslots : 1024;
    while ((live + 1) * 4 > n)
        n *= 2;
    slot_t *t = calloc(n, sizeof(*t));
    if (!t) {
        fk_log("out of memory for the handle registry");
        abort();
    }
    for (size_t i = 0; i < nslots; i++)
        if (slots[i].kind > 0) {
            size_t j = slot_hash(slots[i].h) & (n - 1);
            while (t[j].kind)
                j = (j + 1) & (n - 1);
            t[j] = slots[i];
        }
    free(slots);
    slots = t;
    nslots = n;
    nused = live;
}

/* Register a live handle of a kind. */
void fk_handle_add(const void *h, fk_kind_t kind)
{
    if ((nused + 1) * 2 > nslots)
        slots_grow();
    size_t j = slot_hash(h) & (nslots - 1);
    while (slots[j].kind > 0)
        j = (j + 1) & (nslots - 1);
    if (slots[j].kind == 0)
        nused++;
    slots[j] = (slot_t){ .h = h, .kind = (int)kind };
}

/* The slot of a live handle, or NULL. */
static slot_t *slot_find(const void *h)
{
    if (!nslots || !h)
        return NULL;
    for (size_t j = slot_hash(h) & (nslots - 1), k = 0; k < nslots; j = (j + 1) & (nslots - 1), k++) {
        if (slots[j].kind == 0)
            return NULL;
        if (slots[j].kind > 0 && slots[j].h == h)
            return &slots[j];
    }
    return NULL;
}

/* Forget a handle: later uses are CUDA_ERROR_INVALID_HANDLE. */
void fk_handle_del(const void *h)
{
    slot_t *s = slot_find(h);
    if (s)
        s->kind = -1; /* a tombstone: still counted in nused until the table grows */
}

/* Is h a live handle of this kind? (never dereferences h) */
bool fk_handle_ok(const void *h, fk_kind_t kind)
{
    const slot_t *s = slot_find(h);
    return s && s->kind == (int)kind;
}
