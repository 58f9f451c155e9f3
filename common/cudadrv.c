/*
 * cudadrv.c - load the CUDA driver API at run time (see cudadrv.h).
 */
#include "common/cudadrv.h"

#include "common/log.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define DRIVER_LIB "libcuda.so.1"

bool colld_cu_in_process(void)
{
    void *h = dlopen(DRIVER_LIB, RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        return false;
    dlclose(h);
    return true;
}

#ifndef COLLD_HAVE_CUDA

const colld_cu_t *colld_cu_load(char *err, size_t len)
{
    snprintf(err, len, "this build of colld has no CUDA support (built without the CUDA toolkit)");
    return NULL;
}

#else

/* The ABI the entry points are requested at. */
#define CU_ABI_VERSION COLLD_CU_ABI /* 12000: the common/CMakeLists.txt value the types were chosen for */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static colld_cu_t table;
static const colld_cu_t *loaded;
static char load_error[256];

typedef CUresult (*get_proc_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*get_proc_v1_t)(const char *, void **, int, cuuint64_t);

const char *colld_cu_describe(const colld_cu_t *cu, CUresult r, char *buf, size_t len)
{
    const char *name = NULL, *text = NULL;
    if (cu && cu->cuGetErrorName)
        cu->cuGetErrorName(r, &name);
    if (cu && cu->cuGetErrorString)
        cu->cuGetErrorString(r, &text);
    snprintf(buf, len, "%s (%s)", name ? name : "CUDA error", text ? text : "no description");
    if (!name)
        snprintf(buf, len, "CUDA error %d", (int)r);
    return buf;
}

CUresult colld_cu_checked(const colld_cu_t *cu, CUresult r, CUresult expected, const char *call, const char *file,
                          int line)
{
    static colld_log_rl_t rl;
    if (r == CUDA_SUCCESS || r == expected)
        return r;
    if (COLLD_LOG_WARN <= colld__log_level && (COLLD_SUB_GPU & colld__log_subsys)) {
        char buf[160];
        colld__log_rl(COLLD_LOG_WARN, COLLD_SUB_GPU, file, line, &rl, COLLD_LOG_RL_DEFAULT_MS, "%s failed: %s", call,
                      colld_cu_describe(cu, r, buf, sizeof(buf)));
    }
    return r;
}

static void load_once(void)
{
    void *h = dlopen(DRIVER_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        snprintf(load_error, sizeof(load_error), "no NVIDIA driver (%s)", why ? why : DRIVER_LIB " not found");
        return;
    }
    get_proc_v2_t get_v2 = (get_proc_v2_t)dlsym(h, "cuGetProcAddress_v2");
    get_proc_v1_t get_v1 = get_v2 ? NULL : (get_proc_v1_t)dlsym(h, "cuGetProcAddress");
    if (!get_v2 && !get_v1) {
        snprintf(load_error, sizeof(load_error),
                 "the NVIDIA driver is too old: %s has no cuGetProcAddress (CUDA 12.0 or newer needed)", DRIVER_LIB);
        return;
    }
#define COLLD_CU_LOOKUP(name)                                                                                          \
    {                                                                                                                  \
        void *fn = NULL;                                                                                               \
        CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;                                                \
        CUresult r = get_v2 ? get_v2(#name, &fn, CU_ABI_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q)                      \
                            : get_v1(#name, &fn, CU_ABI_VERSION, CU_GET_PROC_ADDRESS_DEFAULT);                         \
        if (r != CUDA_SUCCESS || !fn || q != CU_GET_PROC_ADDRESS_SUCCESS) {                                            \
            snprintf(load_error, sizeof(load_error),                                                                   \
                     "the NVIDIA driver lacks %s at the CUDA 12.0 ABI (error %d): update the driver", #name, (int)r);  \
            return;                                                                                                    \
        }                                                                                                              \
        table.name = (colld_pfn_##name)fn;                                                                             \
    }
    COLLD_CU_FUNCS(COLLD_CU_LOOKUP)
#undef COLLD_CU_LOOKUP
    char buf[160];
    CUresult r = table.cuInit(0);
    if (r != CUDA_SUCCESS) {
        snprintf(load_error, sizeof(load_error), "cuInit failed: %s", colld_cu_describe(&table, r, buf, sizeof(buf)));
        return;
    }
    if (table.cuDriverGetVersion(&table.driver_version) != CUDA_SUCCESS || table.driver_version < CU_ABI_VERSION) {
        snprintf(load_error, sizeof(load_error), "the NVIDIA driver supports CUDA %d.%d; colld needs 12.0 or newer",
                 table.driver_version / 1000, table.driver_version % 1000 / 10);
        return;
    }
    loaded = &table;
}

const colld_cu_t *colld_cu_load(char *err, size_t len)
{
    pthread_once(&once, load_once);
    if (!loaded && err && len)
        snprintf(err, len, "%s", load_error);
    return loaded;
}

#endif
