/*
 * nvml.h - the NVIDIA Management Library (NVML), loaded at run time (dlopen "libnvidia-ml.so.1"),
 * as common/cudadrv.h loads the CUDA driver.
 *
 * The daemon reads GPU health through it (server/backends/cuda/cuda_health.c): ECC errors, row
 * remaps, retired pages, Xid events, NVLink and PCIe error counters, throttling. A host without
 * NVML (no driver, a container without the library) simply has no GPU health: colld_nvml_load
 * says why, once, and nothing fails.
 *
 * NVML's own header (nvml.h, shipped with the driver's development files and the CUDA toolkit's
 * cuda-nvml-dev package) is not needed to build: the few types, constants and signatures colld
 * uses are declared below with the values of NVML's public, stable ABI. Every value and the layout
 * of nvmlEventData_t were checked against NVIDIA's own Python binding of that ABI, pynvml.py of
 * nvidia-ml-py 13.615.71 (PyPI), which carries them from nvml.h; the NVML test double is built from
 * these declarations too, so only such a check (or a real GPU) can find a wrong one. Each entry
 * point is looked up by name with dlsym; those that an older driver lacks are NULL, and what they
 * read is then "not supported".
 */
#ifndef COLLD_COMMON_NVML_H
#define COLLD_COMMON_NVML_H

#include <stdbool.h>
#include <stddef.h>

/* ---- NVML's ABI (the subset colld uses; values as in NVML's nvml.h) ---- */
typedef int colld_nvmlReturn_t;
#define COLLD_NVML_SUCCESS 0
#define COLLD_NVML_ERROR_UNINITIALIZED 1
#define COLLD_NVML_ERROR_INVALID_ARGUMENT 2
#define COLLD_NVML_ERROR_NOT_SUPPORTED 3
#define COLLD_NVML_ERROR_NO_PERMISSION 4
#define COLLD_NVML_ERROR_NOT_FOUND 6
#define COLLD_NVML_ERROR_TIMEOUT 10
#define COLLD_NVML_ERROR_FUNCTION_NOT_FOUND 13
#define COLLD_NVML_ERROR_GPU_IS_LOST 15
#define COLLD_NVML_ERROR_UNKNOWN 999

typedef struct colld_nvmlDevice_st *colld_nvmlDevice_t;
typedef struct colld_nvmlEventSet_st *colld_nvmlEventSet_t;

/* nvmlEventData_t */
typedef struct {
    colld_nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData; /* the Xid of an nvmlEventTypeXidCriticalError */
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} colld_nvmlEventData_t;

#define COLLD_NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1 /* nvmlMemoryErrorType_t */
#define COLLD_NVML_VOLATILE_ECC 0                  /* nvmlEccCounterType_t: since the driver loaded */
#define COLLD_NVML_FEATURE_ENABLED 1               /* nvmlEnableState_t */
#define COLLD_NVML_EVENT_XID_CRITICAL 0x0000000000000008ULL /* nvmlEventTypeXidCriticalError */
#define COLLD_NVML_NVLINK_MAX_LINKS 36 /* NVML_NVLINK_MAX_LINKS (NVML 13; 18 links on an H100/H200) */
/* nvmlNvLinkErrorCounter_t */
#define COLLD_NVML_NVLINK_ERROR_DL_REPLAY 0
#define COLLD_NVML_NVLINK_ERROR_DL_RECOVERY 1
#define COLLD_NVML_NVLINK_ERROR_DL_CRC_FLIT 2
#define COLLD_NVML_NVLINK_ERROR_DL_CRC_DATA 3
/* nvmlClocksEventReason* (formerly nvmlClocksThrottleReason*) */
#define COLLD_NVML_CLOCKS_SW_POWER_CAP 0x0000000000000004ULL
#define COLLD_NVML_CLOCKS_HW_SLOWDOWN 0x0000000000000008ULL
#define COLLD_NVML_CLOCKS_SW_THERMAL 0x0000000000000020ULL
#define COLLD_NVML_CLOCKS_HW_THERMAL 0x0000000000000040ULL
#define COLLD_NVML_CLOCKS_HW_POWER_BRAKE 0x0000000000000080ULL
#define COLLD_NVML_CLOCKS_THERMAL (COLLD_NVML_CLOCKS_SW_THERMAL | COLLD_NVML_CLOCKS_HW_THERMAL)
#define COLLD_NVML_CLOCKS_POWER                                                                                         \
    (COLLD_NVML_CLOCKS_SW_POWER_CAP | COLLD_NVML_CLOCKS_HW_POWER_BRAKE | COLLD_NVML_CLOCKS_HW_SLOWDOWN)

/* X(name, ret, args, required): every NVML function colld calls. Optional ones (0) may be NULL. */
#define COLLD_NVML_FUNCS(X)                                                                                            \
    X(nvmlInit_v2, colld_nvmlReturn_t, (void), 1)                                                                      \
    X(nvmlShutdown, colld_nvmlReturn_t, (void), 1)                                                                     \
    X(nvmlErrorString, const char *, (colld_nvmlReturn_t), 1)                                                          \
    X(nvmlDeviceGetHandleByUUID, colld_nvmlReturn_t, (const char *, colld_nvmlDevice_t *), 1)                          \
    X(nvmlDeviceGetName, colld_nvmlReturn_t, (colld_nvmlDevice_t, char *, unsigned int), 0)                            \
    X(nvmlDeviceGetTotalEccErrors, colld_nvmlReturn_t, (colld_nvmlDevice_t, int, int, unsigned long long *), 0)        \
    X(nvmlDeviceGetRetiredPagesPendingStatus, colld_nvmlReturn_t, (colld_nvmlDevice_t, int *), 0)                      \
    X(nvmlDeviceGetRemappedRows, colld_nvmlReturn_t,                                                                   \
      (colld_nvmlDevice_t, unsigned int *, unsigned int *, unsigned int *, unsigned int *), 0)                         \
    X(nvmlEventSetCreate, colld_nvmlReturn_t, (colld_nvmlEventSet_t *), 0)                                             \
    X(nvmlDeviceRegisterEvents, colld_nvmlReturn_t, (colld_nvmlDevice_t, unsigned long long, colld_nvmlEventSet_t), 0) \
    X(nvmlEventSetWait_v2, colld_nvmlReturn_t, (colld_nvmlEventSet_t, colld_nvmlEventData_t *, unsigned int), 0)       \
    X(nvmlEventSetFree, colld_nvmlReturn_t, (colld_nvmlEventSet_t), 0)                                                 \
    X(nvmlDeviceGetNvLinkState, colld_nvmlReturn_t, (colld_nvmlDevice_t, unsigned int, int *), 0)                      \
    X(nvmlDeviceGetNvLinkErrorCounter, colld_nvmlReturn_t,                                                             \
      (colld_nvmlDevice_t, unsigned int, int, unsigned long long *), 0)                                                \
    X(nvmlDeviceGetPcieReplayCounter, colld_nvmlReturn_t, (colld_nvmlDevice_t, unsigned int *), 0)                     \
    X(nvmlDeviceGetCurrentClocksEventReasons, colld_nvmlReturn_t, (colld_nvmlDevice_t, unsigned long long *), 0)       \
    X(nvmlDeviceGetCurrentClocksThrottleReasons, colld_nvmlReturn_t, (colld_nvmlDevice_t, unsigned long long *), 0)

#define COLLD_NVML_MEMBER(name, ret, args, req) ret(*name) args;
typedef struct {
    COLLD_NVML_FUNCS(COLLD_NVML_MEMBER)
    char path[256]; /* the library that was loaded (dladdr), for the log */
} colld_nvml_t;
#undef COLLD_NVML_MEMBER

/* Load NVML and nvmlInit_v2 it, once per process (thread-safe). Returns the table, or NULL with
 * the reason in err (no libnvidia-ml.so.1, a library without an entry point colld needs, or
 * nvmlInit failed: no driver loaded, no permission, ...). The same answer is given to every later
 * call. NVML stays initialised until the process ends. */
const colld_nvml_t *colld_nvml_load(char *err, size_t len);

/* "NVML error 3 (Not Supported)" into buf; returns buf. */
const char *colld_nvml_describe(const colld_nvml_t *nv, colld_nvmlReturn_t r, char *buf, size_t len);

/* NVML's UUID text of a 16-byte GPU UUID as CUDA gives it: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
 * into buf (at least 41 bytes). */
void colld_nvml_uuid_text(const unsigned char uuid[16], char *buf, size_t len);

#endif /* COLLD_COMMON_NVML_H */
