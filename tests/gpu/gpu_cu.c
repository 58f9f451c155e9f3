/*
 * gpu_cu.c - the GPU tests' own loader of the CUDA driver (see gpu_cu.h).
 */
#include "tests/gpu/gpu_cu.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define GPU_CU_ABI 12000 /* the CUDA version whose variants the table's PFN types are */

const char *gpu_cu_describe(const gpu_cu_t *cu, CUresult r, char *buf, size_t len)
{
    const char *name = NULL, *text = NULL;
    if (cu->cuGetErrorName)
        cu->cuGetErrorName(r, &name);
    if (cu->cuGetErrorString)
        cu->cuGetErrorString(r, &text);
    snprintf(buf, len, "%s (%s)", name ? name : "unknown CUresult", text ? text : "no description");
    return buf;
}

gpu_cu_result_t gpu_cu_load(gpu_cu_t *cu, bool want_double, char *err, size_t len)
{
    *cu = (gpu_cu_t){ 0 };
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(err, len, "no libcuda.so.1 (%s)%s", dlerror(),
                 want_double ? ": the CUDA driver test double is not in LD_LIBRARY_PATH" : "");
        return want_double ? GPU_CU_ERROR : GPU_CU_NONE;
    }
    /* Before any CUDA call: which driver is this? */
    cu->on_double = dlsym(lib, "colld_cudafake_control") != NULL;
    if (want_double && !cu->on_double) {
        Dl_info info = { 0 };
        void *any = dlsym(lib, "cuGetProcAddress");
        snprintf(err, len, "the libcuda.so.1 found (%s) is not the CUDA driver test double: refusing to run a test "
                 "meant for the double on it", any && dladdr(any, &info) && info.dli_fname ? info.dli_fname : "?");
        return GPU_CU_ERROR;
    }
    PFN_cuGetProcAddress_v12000 get = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
    if (!get) {
        snprintf(err, len, "libcuda.so.1 has no cuGetProcAddress_v2: a driver older than CUDA 12.0");
        return GPU_CU_NONE;
    }
#define GPU_CU_LOOKUP(name, type)                                                                            \
    do {                                                                                                     \
        void *fn = NULL;                                                                                     \
        CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                            \
        CUresult r = get(#name, &fn, GPU_CU_ABI, CU_GET_PROC_ADDRESS_DEFAULT, &q);                           \
        if (r != CUDA_SUCCESS || q != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {                                 \
            snprintf(err, len, "cuGetProcAddress(%s, CUDA %d): result %d, status %d: the driver is too old "  \
                     "or not a CUDA driver", #name, GPU_CU_ABI, (int)r, (int)q);                             \
            return GPU_CU_NONE;                                                                              \
        }                                                                                                    \
        cu->name = (type)fn;                                                                                 \
    } while (0);
    GPU_CU_FUNCS(GPU_CU_LOOKUP)
#undef GPU_CU_LOOKUP
    char why[256];
    CUresult r = cu->cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cu->cuDeviceGetCount(&cu->ndev);
    if (r != CUDA_SUCCESS || cu->ndev == 0) {
        snprintf(err, len, "no CUDA GPU visible (%s)",
                 r != CUDA_SUCCESS ? gpu_cu_describe(cu, r, why, sizeof(why)) : "0 devices");
        return want_double ? GPU_CU_ERROR : GPU_CU_NONE;
    }
    return GPU_CU_OK; /* lib stays loaded for the process */
}

CUresult gpu_cu_use_device(const gpu_cu_t *cu, int dev)
{
    CUdevice d;
    CUcontext ctx;
    CUresult r = cu->cuDeviceGet(&d, dev);
    if (r == CUDA_SUCCESS)
        r = cu->cuDevicePrimaryCtxRetain(&ctx, d);
    if (r == CUDA_SUCCESS)
        r = cu->cuCtxSetCurrent(ctx);
    return r;
}

void *gpu_cu_host_alloc(const gpu_cu_t *cu, size_t bytes, char *err, size_t len)
{
    char why[256];
    size_t size = (bytes + 4095) & ~(size_t)4095;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(err, len, "mmap of %zu bytes failed", size);
        return NULL;
    }
    CUresult r = cu->cuMemHostRegister(p, size, CU_MEMHOSTREGISTER_PORTABLE);
    if (r != CUDA_SUCCESS) {
        snprintf(err, len, "cuMemHostRegister(%zu bytes): %s", size, gpu_cu_describe(cu, r, why, sizeof(why)));
        munmap(p, size);
        return NULL;
    }
    return p;
}

void gpu_cu_host_free(const gpu_cu_t *cu, void *p, size_t bytes)
{
    if (!p)
        return;
    (void)cu->cuMemHostUnregister(p);
    munmap(p, (bytes + 4095) & ~(size_t)4095);
}
