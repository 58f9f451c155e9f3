/*
 * launch.c - the one place where colld's CUDA kernels meet the CUDA driver: the embedded fatbin
 * loaded as a library (cuLibraryLoadData, CUDA 12 library management: the library belongs to no
 * context), its kernels found by name (cuLibraryGetKernel), the version and architecture gate, and
 * the launches (cuKernelGetFunction in the current context, cuLaunchKernel). Every driver call goes
 * through the table of common/cudadrv.c (cuGetProcAddress at the CUDA 12.0 ABI); none links the
 * CUDA runtime. Every failing call is named in colld_cuda_last_error() or the load's reason.
 */
#include "kernels/cuda/cuda_plan.h"

#include "kernels/cpu/reduce_internal.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The fatbin's code, as CMake built it (kernels/cuda/CMakeLists.txt): real code for these compute
 * capabilities (a cubin for M.m runs on M.x, x >= m), PTX for this one (JIT-compiled by the driver
 * for any GPU of that capability or newer). */
#ifndef COLLD_CUDA_SASS_ARCHS
#error "COLLD_CUDA_SASS_ARCHS (the fatbin's real architectures, e.g. 80,90) must be defined by the build"
#endif
#ifndef COLLD_CUDA_PTX_ARCH
#error "COLLD_CUDA_PTX_ARCH (the fatbin's PTX architecture, e.g. 90) must be defined by the build"
#endif
static const int sass_archs[] = { COLLD_CUDA_SASS_ARCHS };
#define N_SASS ((int)(sizeof(sass_archs) / sizeof(sass_archs[0])))

/* The toolkit that built the fatbin: the same as the cuda.h this file is compiled with (CMake takes
 * both from one CUDA toolkit). Its cubins run on drivers of its major version or newer (CUDA minor
 * version compatibility); its PTX needs a driver at least as new as the toolkit itself. */
#define FATBIN_CUDA CUDA_VERSION
#define FATBIN_CUDA_MAJOR (CUDA_VERSION / 1000 * 1000)

#define N_COPY 5 /* copy units: 16, 8, 4, 2, 1 bytes */

struct colld_cuda_kernels {
    const colld_cu_t *cu;
    CUlibrary lib;
    CUkernel reduce[COLLD_DTYPE_COUNT][COLLD__REDOPS];
    CUkernel copy[N_COPY];
    CUkernel gate, done; /* the hand-off's (handoff.cu) */
    int n;         /* GPUs */
    CUdevice *dev; /* [n] */
    int *sms;      /* [n]: multiprocessors of dev[i] */
};

/* The kernels' names, from the lists the kernels are generated from (cuda_plan.h). */
#define NAME_OP(name, E_OP, opname) [E_OP] = COLLD__CUDA_STR(COLLD__CUDA_REDUCE_KERNEL(name, opname)),
#define NAME_DTYPE(E, name, T, A, U, W, K) [E] = { COLLD_REDUCE_OPS(NAME_OP, name) },
static const char *const reduce_names[COLLD_DTYPE_COUNT][COLLD__REDOPS] = { COLLD_REDUCE_DTYPES(NAME_DTYPE) };
#undef NAME_DTYPE
#undef NAME_OP
#define NAME_COPY(Unit, bytes) COLLD__CUDA_STR(COLLD__CUDA_COPY_KERNEL(bytes)),
static const char *const copy_names[N_COPY] = { COLLD__CUDA_COPY_UNITS(NAME_COPY) };
#undef NAME_COPY
static const char gate_name[] = COLLD__CUDA_STR(COLLD__CUDA_GATE_KERNEL);
static const char done_name[] = COLLD__CUDA_STR(COLLD__CUDA_DONE_KERNEL);

/* The gate this thread's reduce and copy launches check (colld_cuda_set_gate). */
static _Thread_local const uint32_t *launch_gate;

/* The copy kernel's index for a unit width (the order of COLLD__CUDA_COPY_UNITS), -1 for none. */
static int copy_index(int unit)
{
    switch (unit) {
    case 16:
        return 0;
    case 8:
        return 1;
    case 4:
        return 2;
    case 2:
        return 3;
    case 1:
        return 4;
    default:
        return -1;
    }
}

/* "CUDA 13.0" of a driver or toolkit version number (13000). */
static const char *cuda_version(int v, char *buf, size_t len)
{
    snprintf(buf, len, "CUDA %d.%d", v / 1000, v % 1000 / 10);
    return buf;
}

/* ============================================================================================
 * Loading
 * ========================================================================================== */

/* A driver call of table `cu` through CU_CHECK (common/cudadrv.h: logged with its name and place
 * when it fails); on failure say which call failed, and why, in err and go to out with
 * st = COLLD_ERR_DEVICE. */
#define LOAD_CU(call, ...)                                                                                             \
    do {                                                                                                               \
        CUresult r_ = CU_CHECK(cu, call, __VA_ARGS__);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                                                      \
            char b_[160];                                                                                              \
            snprintf(err, len, "%s%s failed: %s", where, #call, colld_cu_describe(cu, r_, b_, sizeof(b_)));            \
            st = COLLD_ERR_DEVICE;                                                                                     \
            goto out;                                                                                                  \
        }                                                                                                              \
    } while (0)

/* Can GPU dev (compute capability major.minor) run the fatbin with this driver? Says why not in err.
 * A cubin of the same major capability and a lower or equal minor one runs as it is; otherwise the
 * driver must JIT-compile the PTX, which needs a capability at least the PTX's and a driver at
 * least as new as the toolkit that wrote it. */
static colld_status_t arch_gate(int driver, int i, const char *name, int major, int minor, char *err, size_t len)
{
    char b1[32], b2[32];
    int cc = major * 10 + minor;
    for (int s = 0; s < N_SASS; s++)
        if (sass_archs[s] / 10 == major && sass_archs[s] % 10 <= minor)
            return COLLD_OK;
    if (cc < COLLD_CUDA_PTX_ARCH) {
        int lowest = COLLD_CUDA_PTX_ARCH;
        for (int s = 0; s < N_SASS; s++)
            lowest = sass_archs[s] < lowest ? sass_archs[s] : lowest;
        snprintf(err, len,
                 "GPU %d (%s) has compute capability %d.%d; colld's GPU kernels are built for %d.%d and newer "
                 "(kernels/cuda/CMakeLists.txt lists the architectures)",
                 i, name, major, minor, lowest / 10, lowest % 10);
        return COLLD_ERR_NOT_SUPPORTED;
    }
    if (driver < FATBIN_CUDA) {
        snprintf(err, len,
                 "GPU %d (%s, compute capability %d.%d) needs colld's GPU kernels JIT-compiled from their PTX, "
                 "written by %s, which this driver (%s) cannot compile: update the NVIDIA driver to %s or newer",
                 i, name, major, minor, cuda_version(FATBIN_CUDA, b1, sizeof(b1)), cuda_version(driver, b2, sizeof(b2)),
                 b1);
        return COLLD_ERR_NOT_SUPPORTED;
    }
    return COLLD_OK;
}

colld_status_t colld_cuda_kernels_load(const colld_cu_t *cu, const CUcontext *ctx, const CUdevice *dev, int n,
                                       colld_cuda_kernels_t **out, char *err, size_t len)
{
    colld_status_t st = COLLD_OK;
    char where[160] = "", b1[32], b2[32];
    colld_cuda_kernels_t *k = calloc(1, sizeof(*k));
    if (!k || !(k->dev = calloc((size_t)(n > 0 ? n : 1), sizeof(*k->dev))) ||
        !(k->sms = calloc((size_t)(n > 0 ? n : 1), sizeof(*k->sms)))) {
        snprintf(err, len, "out of memory loading the GPU kernels");
        st = COLLD_ERR_NO_MEMORY;
        goto out;
    }
    k->cu = cu;
    k->n = n;
    /* The version gate: the fatbin's cubins need a driver of the toolkit's major version. */
    if (cu->driver_version < FATBIN_CUDA_MAJOR) {
        snprintf(err, len,
                 "the NVIDIA driver supports %s; colld's GPU kernels were built with %s and need a driver for "
                 "%d.0 or newer: update the driver",
                 cuda_version(cu->driver_version, b1, sizeof(b1)), cuda_version(FATBIN_CUDA, b2, sizeof(b2)),
                 FATBIN_CUDA_MAJOR / 1000);
        st = COLLD_ERR_NOT_SUPPORTED;
        goto out;
    }
    snprintf(where, sizeof(where), "loading colld's GPU kernels (%zu-byte fatbin): ", colld__cuda_fatbin_size);
    LOAD_CU(cuLibraryLoadData, &k->lib, colld__cuda_fatbin, NULL, NULL, 0, NULL, NULL, 0);
    for (int d = 0; d < COLLD_DTYPE_COUNT; d++)
        for (int o = 0; o < COLLD__REDOPS; o++) {
            snprintf(where, sizeof(where), "kernel %s: ", reduce_names[d][o]);
            LOAD_CU(cuLibraryGetKernel, &k->reduce[d][o], k->lib, reduce_names[d][o]);
        }
    for (int c = 0; c < N_COPY; c++) {
        snprintf(where, sizeof(where), "kernel %s: ", copy_names[c]);
        LOAD_CU(cuLibraryGetKernel, &k->copy[c], k->lib, copy_names[c]);
    }
    snprintf(where, sizeof(where), "kernel %s: ", gate_name);
    LOAD_CU(cuLibraryGetKernel, &k->gate, k->lib, gate_name);
    snprintf(where, sizeof(where), "kernel %s: ", done_name);
    LOAD_CU(cuLibraryGetKernel, &k->done, k->lib, done_name);
    /* Every GPU: can it run them, its multiprocessors, and the kernels in its context now (with lazy
     * loading a kernel reaches a context at its first use: a GPU without code for it would
     * otherwise fail at its first collective). */
    for (int i = 0; i < n; i++) {
        char name[96] = "";
        int major = 0, minor = 0;
        k->dev[i] = dev[i];
        snprintf(where, sizeof(where), "GPU %d: ", i);
        if (CU_CHECK(cu, cuDeviceGetName, name, (int)sizeof(name), dev[i]) != CUDA_SUCCESS)
            snprintf(name, sizeof(name), "GPU %d", i);
        LOAD_CU(cuDeviceGetAttribute, &major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev[i]);
        LOAD_CU(cuDeviceGetAttribute, &minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev[i]);
        LOAD_CU(cuDeviceGetAttribute, &k->sms[i], CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev[i]);
        if (k->sms[i] < 1)
            k->sms[i] = 1;
        if ((st = arch_gate(cu->driver_version, i, name, major, minor, err, len)) != COLLD_OK)
            goto out;
        if ((st = colld_cuda_kernels_attach(k, ctx[i], i, err, len)) != COLLD_OK)
            goto out;
    }
out:
    if (st != COLLD_OK) {
        colld_cuda_kernels_unload(k);
        return st;
    }
    *out = k;
    return COLLD_OK;
}

colld_status_t colld_cuda_kernels_attach(const colld_cuda_kernels_t *k, CUcontext ctx, int i, char *err, size_t len)
{
    const colld_cu_t *cu = k->cu;
    colld_status_t st = COLLD_OK;
    char where[192], name[96] = "";
    bool pushed = false;
    if (i < 0 || i >= k->n) {
        snprintf(err, len, "GPU %d: not one the kernels were loaded for", i);
        return COLLD_ERR_INTERNAL;
    }
    if (CU_CHECK(cu, cuDeviceGetName, name, (int)sizeof(name), k->dev[i]) != CUDA_SUCCESS)
        snprintf(name, sizeof(name), "GPU %d", i);
    snprintf(where, sizeof(where), "GPU %d (%s): ", i, name);
    LOAD_CU(cuCtxPushCurrent, ctx);
    pushed = true;
    for (int d = 0; d < COLLD_DTYPE_COUNT; d++)
        for (int o = 0; o < COLLD__REDOPS; o++) {
            CUfunction f;
            snprintf(where, sizeof(where), "GPU %d (%s), kernel %s: ", i, name, reduce_names[d][o]);
            LOAD_CU(cuKernelGetFunction, &f, k->reduce[d][o]);
        }
    for (int c = 0; c < N_COPY; c++) {
        CUfunction f;
        snprintf(where, sizeof(where), "GPU %d (%s), kernel %s: ", i, name, copy_names[c]);
        LOAD_CU(cuKernelGetFunction, &f, k->copy[c]);
    }
    for (int h = 0; h < 2; h++) {
        CUfunction f;
        snprintf(where, sizeof(where), "GPU %d (%s), kernel %s: ", i, name, h ? done_name : gate_name);
        LOAD_CU(cuKernelGetFunction, &f, h ? k->done : k->gate);
    }
out:
    if (pushed) {
        CUcontext popped;
        CU_CHECK(cu, cuCtxPopCurrent, &popped);
    }
    return st;
}

void colld_cuda_kernels_unload(colld_cuda_kernels_t *k)
{
    if (!k)
        return;
    if (k->lib)
        CU_CHECK(k->cu, cuLibraryUnload, k->lib); /* a failure is logged there; nothing else to do */
    free(k->dev);
    free(k->sms);
    free(k);
}

/* ============================================================================================
 * Launching
 * ========================================================================================== */

/* Record a failed driver call of a launch for colld_cuda_last_error(). */
static colld_status_t device_error(const colld_cuda_kernels_t *k, const char *what, const char *call, CUresult r)
{
    char buf[160];
    colld__cuda_set_error("%s: %s failed: %s (check that the stream belongs to the current context; run under "
                          "compute-sanitizer for details)",
                          what, call, colld_cu_describe(k->cu, r, buf, sizeof(buf)));
    return COLLD_ERR_DEVICE;
}

/* A driver call of a launch through CU_CHECK; on failure record it for colld_cuda_last_error() and
 * return COLLD_ERR_DEVICE. */
#define LAUNCH_CU(call, ...)                                                                                           \
    do {                                                                                                               \
        CUresult r_ = CU_CHECK(k->cu, call, __VA_ARGS__);                                                              \
        if (r_ != CUDA_SUCCESS)                                                                                        \
            return device_error(k, what, #call, r_);                                                                   \
    } while (0)

/* Launch `kernel` with *params (its one parameter block) on `stream` in the current context, with
 * enough blocks for `work` work items: one per thread up to COLLD__CUDA_BLOCKS_PER_SM blocks per
 * multiprocessor of the context's GPU; the kernels' grid-stride loops do the rest. */
static colld_status_t launch(const colld_cuda_kernels_t *k, CUkernel kernel, void *params, size_t work, void *stream,
                             const char *what)
{
    CUdevice dev;
    CUfunction f;
    void *args[1] = { params };
    int sms = 0;
    if (!k) {
        colld__cuda_set_error("%s: colld's GPU kernels are not loaded (no CUDA backend)", what);
        return COLLD_ERR_DEVICE;
    }
    LAUNCH_CU(cuCtxGetDevice, &dev);
    for (int i = 0; i < k->n && !sms; i++)
        if (k->dev[i] == dev)
            sms = k->sms[i];
    if (!sms) {
        colld__cuda_set_error("%s: the current context's GPU (device %d) is not one the kernels were loaded for", what,
                              (int)dev);
        return COLLD_ERR_DEVICE;
    }
    size_t blocks = (work + COLLD__CUDA_THREADS - 1) / COLLD__CUDA_THREADS;
    size_t max_blocks = (size_t)sms * COLLD__CUDA_BLOCKS_PER_SM;
    if (blocks > max_blocks)
        blocks = max_blocks;
    if (blocks < 1)
        blocks = 1;
    LAUNCH_CU(cuKernelGetFunction, &f, kernel);
    LAUNCH_CU(cuLaunchKernel, f, (unsigned)blocks, 1, 1, COLLD__CUDA_THREADS, 1, 1, 0, (CUstream)stream, args, NULL);
    return COLLD_OK;
}

/* Public: see cuda_kernels.h. */
colld_status_t colld_cuda_reduce(const colld_cuda_kernels_t *k, colld_dtype_t dtype, colld_redop_t op,
                                 const void *const *in, int n_in, void *const *out, int n_out, size_t count,
                                 void *stream)
{
    colld__cuda_reduce_params_t p;
    size_t work;
    colld_status_t st = (unsigned)op < COLLD_REDOP_COUNT
                            ? colld__cuda_reduce_plan(dtype, (int)op, NULL, in, n_in, out, n_out, count, &p, &work)
                            : COLLD_ERR_INVALID_ARGUMENT;

    if ((unsigned)op >= COLLD_REDOP_COUNT)
        colld__cuda_set_error("colld_cuda_reduce: unknown op %d", (int)op);
    if (st != COLLD_OK || work == 0)
        return st;
    p.gate = launch_gate;
    return launch(k, k ? k->reduce[dtype][op] : NULL, &p, work, stream, "colld_cuda_reduce");
}

/* Public: see cuda_kernels.h. */
colld_status_t colld_cuda_reduce_premul(const colld_cuda_kernels_t *k, colld_dtype_t dtype, const uint64_t *scalars,
                                        const void *const *in, int n_in, void *const *out, int n_out, size_t count,
                                        void *stream)
{
    colld__cuda_reduce_params_t p;
    size_t work;
    colld_status_t st = colld__cuda_reduce_plan(dtype, COLLD__REDOP_PREMUL_SUM, scalars, in, n_in, out, n_out, count,
                                                &p, &work);

    if (st != COLLD_OK || work == 0)
        return st;
    p.gate = launch_gate;
    return launch(k, k ? k->reduce[dtype][COLLD__REDOP_PREMUL_SUM] : NULL, &p, work, stream,
                  "colld_cuda_reduce_premul");
}

/* Public: see cuda_kernels.h. */
colld_status_t colld_cuda_reduce_checked(const colld_cuda_kernels_t *k, colld_dtype_t dtype, colld_redop_t op,
                                         const uint64_t *scalars, const void *const *in, int n_in, void *const *out,
                                         int n_out, size_t count, const colld_cuda_nan_check_t *check, void *stream)
{
    colld__cuda_reduce_params_t p;
    size_t work;
    int kop = scalars ? COLLD__REDOP_PREMUL_SUM : (int)op;
    colld_status_t st = scalars || (unsigned)op < COLLD_REDOP_COUNT
                            ? colld__cuda_reduce_plan(dtype, kop, scalars, in, n_in, out, n_out, count, &p, &work)
                            : COLLD_ERR_INVALID_ARGUMENT;

    if (!scalars && (unsigned)op >= COLLD_REDOP_COUNT)
        colld__cuda_set_error("colld_cuda_reduce_checked: unknown op %d", (int)op);
    if (st != COLLD_OK || work == 0)
        return st;
    if (check) {
        if (!check->first_bad || (uintptr_t)check->first_bad % sizeof(unsigned long long) != 0) {
            colld__cuda_set_error("colld_cuda_reduce_checked: first_bad is NULL or not 8-byte aligned");
            return COLLD_ERR_INVALID_ARGUMENT;
        }
        p.first_bad = check->first_bad;
        p.base = (size_t)check->base;
    }
    p.gate = launch_gate;
    return launch(k, k ? k->reduce[dtype][kop] : NULL, &p, work, stream, "colld_cuda_reduce_checked");
}

/* Public: see cuda_kernels.h. */
colld_status_t colld_cuda_copy(const colld_cuda_kernels_t *k, const void *src, void *const *out, int n_out,
                               size_t bytes, void *stream)
{
    colld__cuda_copy_params_t p;
    size_t work;
    colld_status_t st = colld__cuda_copy_plan(src, out, n_out, bytes, &p, &work);
    int c = st == COLLD_OK ? copy_index(p.unit) : -1;

    if (st != COLLD_OK || work == 0)
        return st;
    if (c < 0) {
        colld__cuda_set_error("colld_cuda_copy: no kernel for a unit of %d bytes", p.unit);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    p.gate = launch_gate;
    return launch(k, k ? k->copy[c] : NULL, &p, work, stream, "colld_cuda_copy");
}

/* Public: see cuda_kernels.h. */
void colld_cuda_set_gate(const uint32_t *gate)
{
    launch_gate = gate;
}

/* The hand-off's arguments: a rank count in range, every pointer set and 4-byte aligned. */
static bool handoff_ok(const colld_cuda_handoff_t *h, const char *what)
{
    bool ok = h && h->n >= 1 && h->n <= COLLD_CUDA_MAX_RANKS && h->words && (uintptr_t)h->words % 4 == 0;
    for (int r = 0; ok && r < h->n; r++)
        ok = h->ready[r] && h->done[r] && (uintptr_t)h->ready[r] % 4 == 0 && (uintptr_t)h->done[r] % 4 == 0;
    if (!ok)
        colld__cuda_set_error("%s: a rank count out of 1..%d, or a NULL or misaligned word", what,
                              COLLD_CUDA_MAX_RANKS);
    return ok;
}

/* Launch a hand-off kernel of `blocks` blocks of one thread (launch() sizes grids for grid-stride
 * kernels: not these). */
static colld_status_t launch_blocks(const colld_cuda_kernels_t *k, CUkernel kernel, void *params, unsigned blocks,
                                    void *stream, const char *what)
{
    CUfunction f;
    void *args[1] = { params };
    if (!k) {
        colld__cuda_set_error("%s: colld's GPU kernels are not loaded (no CUDA backend)", what);
        return COLLD_ERR_DEVICE;
    }
    LAUNCH_CU(cuKernelGetFunction, &f, kernel);
    LAUNCH_CU(cuLaunchKernel, f, blocks, 1, 1, 1, 1, 1, 0, (CUstream)stream, args, NULL);
    return COLLD_OK;
}

/* Public: see cuda_kernels.h. */
colld_status_t colld_cuda_handoff_wait(const colld_cuda_kernels_t *k, const colld_cuda_handoff_t *h, void *stream)
{
    if (!handoff_ok(h, "colld_cuda_handoff_wait"))
        return COLLD_ERR_INVALID_ARGUMENT;
    const char *what = "colld_cuda_handoff_wait";
    if (!k) {
        colld__cuda_set_error("%s: colld's GPU kernels are not loaded (no CUDA backend)", what);
        return COLLD_ERR_DEVICE;
    }
    colld__cuda_gate_params_t p;
    memset(&p, 0, sizeof(p));
    for (int r = 0; r < h->n; r++) {
        p.ready[r] = h->ready[r];
        p.want[r] = h->want[r];
        /* In the stream's front-end: no multiprocessor held while rank r's stream is behind. */
        LAUNCH_CU(cuStreamWaitValue32, (CUstream)stream, (CUdeviceptr)(uintptr_t)h->ready[r], h->want[r],
                  CU_STREAM_WAIT_VALUE_EQ);
    }
    p.words = h->words;
    p.n = h->n;
    return launch_blocks(k, k->gate, &p, 1, stream, what);
}

/* Public: see cuda_kernels.h. */
colld_status_t colld_cuda_handoff_done(const colld_cuda_kernels_t *k, const colld_cuda_handoff_t *h, void *stream)
{
    if (!handoff_ok(h, "colld_cuda_handoff_done"))
        return COLLD_ERR_INVALID_ARGUMENT;
    colld__cuda_done_params_t p;
    memset(&p, 0, sizeof(p));
    for (int r = 0; r < h->n; r++) {
        p.done[r] = h->done[r];
        p.value[r] = h->done_value[r];
    }
    p.words = h->words;
    p.n = h->n;
    return launch_blocks(k, k ? k->done : NULL, &p, 1, stream, "colld_cuda_handoff_done");
}
