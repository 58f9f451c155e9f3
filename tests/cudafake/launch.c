/*
 * launch.c - code loading and kernel launches in the CUDA driver test double: cuLibraryLoadData,
 * cuLibraryGetKernel and friends, cuKernelGetFunction, cuModuleLoadData / cuModuleGetFunction,
 * and cuLaunchKernel.
 *
 * The double cannot run device code. A library or module "loaded" from an image (a fatbin, a
 * fatbin wrapper, a cubin or PTX text) is read only for the names of its kernels: the ".text.<name>"
 * sections of its ELF images (nvcc leaves cubins uncompressed by default; a fatbin built with
 * compression and no cubin has no readable names: build it with --no-compress) and the
 * ".entry <name>" lines of PTX. A launch of a kernel runs the host build of the same kernel source
 * with that symbol name (kernels.cpp); a kernel with no host build fails to launch with
 * CUDA_ERROR_NOT_SUPPORTED and a message saying so. The parameters are copied at the launch, as
 * the driver does; the grid's blocks then run concurrently, FK_BLOCK_WORKERS at a time (the stream's
 * worker and helper threads from a pool the streams share, each taking the next block in order, as
 * a GPU fills its resident slots), each block's threads one after another, after every buffer they name passed the
 * access check (a fault is CUDA_ERROR_ILLEGAL_ADDRESS or
 * CUDA_ERROR_MISALIGNED_ADDRESS, sticky).
 *
 * A CUkernel may be passed to cuLaunchKernel as a CUfunction (CUDA 12): it then runs in the
 * current context.
 */
#include "tests/cudafake/fake.h"

#include <elf.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define FATBIN_MAGIC 0xba55ed50u
#define FATBIN_WRAPPER_MAGIC 0x466243b1u
#define MAX_IMAGE (1ull << 30)
#define MAX_SHARED 49152u

typedef struct lib lib_t;
typedef struct kern kern_t;

typedef struct {
    kern_t *k;
    fk_ctx_t *ctx;
} func_t;

struct kern {
    lib_t *lib;
    char *name;
    const fk_hkernel_t *hk; /* NULL: no host build */
    func_t *funcs[FK_MAX_DEVICES];
};

struct lib {
    bool module; /* cuModuleLoadData: bound to ctx */
    fk_ctx_t *ctx;
    int n;
    kern_t *kernels;
};

/* ============================================================================================
 * Reading kernel names out of an image
 * ========================================================================================== */

static bool name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$' ||
           c == '.';
}

/* Add a name of `len` bytes to the list unless it is there. */
static bool add_name(char ***names, int *n, const char *s, size_t len)
{
    for (int i = 0; i < *n; i++)
        if (strlen((*names)[i]) == len && memcmp((*names)[i], s, len) == 0)
            return true;
    char **t = realloc(*names, (size_t)(*n + 1) * sizeof(*t));
    if (!t)
        return false;
    *names = t;
    if (!(t[*n] = strndup(s, len)))
        return false;
    (*n)++;
    return true;
}

/* The size of an image (0: not one the double can read) and whether it is PTX text. */
static size_t image_size(const unsigned char *b, bool *ptx)
{
    uint32_t magic;
    memcpy(&magic, b, sizeof(magic));
    *ptx = false;
    if (magic == FATBIN_MAGIC) {
        uint16_t hs;
        uint64_t fs;
        memcpy(&hs, b + 6, sizeof(hs));
        memcpy(&fs, b + 8, sizeof(fs));
        return fs < MAX_IMAGE ? hs + (size_t)fs : 0;
    }
    if (memcmp(b, ELFMAG, SELFMAG) == 0) {
        Elf64_Ehdr e;
        memcpy(&e, b, sizeof(e));
        if (e.e_ident[EI_CLASS] != ELFCLASS64)
            return 0;
        uint64_t sh = e.e_shoff + (uint64_t)e.e_shnum * e.e_shentsize;
        uint64_t ph = e.e_phoff + (uint64_t)e.e_phnum * e.e_phentsize;
        uint64_t end = sh > ph ? sh : ph;
        return end < MAX_IMAGE ? (size_t)end : 0;
    }
    size_t len = strnlen((const char *)b, MAX_IMAGE);
    const char *text = (const char *)b;
    if (len == MAX_IMAGE || !(strstr(text, ".version") || strstr(text, ".entry")))
        return 0;
    *ptx = true;
    return len + 1;
}

/* The kernel names of an image. Returns CUDA_SUCCESS (perhaps with none) or CUDA_ERROR_INVALID_IMAGE. */
static CUresult image_kernels(const void *code, char ***names, int *n)
{
    const unsigned char *b = code;
    uint32_t magic;
    memcpy(&magic, b, sizeof(magic));
    if (magic == FATBIN_WRAPPER_MAGIC) {
        struct {
            int magic, version;
            const void *data;
            const void *unused;
        } w;
        memcpy(&w, b, sizeof(w));
        if (!w.data)
            return CUDA_ERROR_INVALID_IMAGE;
        b = w.data;
    }
    bool ptx;
    size_t size = image_size(b, &ptx);
    if (!size)
        return CUDA_ERROR_INVALID_IMAGE;
    static const char text[] = ".text.", entry[] = ".entry";
    for (size_t i = 0; i + 7 < size; i++) {
        size_t j;
        if (!ptx && memcmp(b + i, text, sizeof(text) - 1) == 0) {
            for (j = i + 6; j < size && name_char(b[j]); j++)
                ;
            if (j < size && b[j] == '\0' && j > i + 6 && !add_name(names, n, (const char *)b + i + 6, j - i - 6))
                return CUDA_ERROR_OUT_OF_MEMORY;
        } else if (ptx && memcmp(b + i, entry, sizeof(entry) - 1) == 0 && (b[i + 6] == ' ' || b[i + 6] == '\t')) {
            size_t k = i + 6;
            while (k < size && (b[k] == ' ' || b[k] == '\t'))
                k++;
            for (j = k; j < size && name_char(b[j]); j++)
                ;
            if (j > k && !add_name(names, n, (const char *)b + k, j - k))
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (*n == 0 && !ptx)
        fk_log("no kernel name is readable in this image: a compressed fatbin without cubins? (build it with "
               "nvcc --no-compress)");
    return CUDA_SUCCESS;
}

/* ============================================================================================
 * Libraries and modules
 * ========================================================================================== */

static void lib_free(lib_t *l)
{
    for (int i = 0; i < l->n; i++) {
        kern_t *k = &l->kernels[i];
        fk_handle_del(k);
        for (int d = 0; d < FK_MAX_DEVICES; d++)
            if (k->funcs[d]) {
                fk_handle_del(k->funcs[d]);
                free(k->funcs[d]);
            }
        free(k->name);
    }
    fk_handle_del(l);
    free(l->kernels);
    free(l);
}

/* Load an image (lock held). */
static CUresult lib_load(const void *code, bool module, fk_ctx_t *ctx, lib_t **out)
{
    char **names = NULL;
    int n = 0;
    CUresult r = code ? image_kernels(code, &names, &n) : CUDA_ERROR_INVALID_VALUE;
    lib_t *l = r == CUDA_SUCCESS ? calloc(1, sizeof(*l)) : NULL;
    if (r == CUDA_SUCCESS && (!l || (n && !(l->kernels = calloc((size_t)n, sizeof(kern_t)))))) {
        free(l);
        l = NULL;
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (l) {
        l->module = module;
        l->ctx = ctx;
        l->n = n;
        fk_handle_add(l, FK_K_LIBRARY);
        for (int i = 0; i < n; i++) {
            l->kernels[i] = (kern_t){ .lib = l, .name = names[i], .hk = fk_hkernel_find(names[i]) };
            names[i] = NULL;
            fk_handle_add(&l->kernels[i], FK_K_KERNEL);
        }
        *out = l;
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return r;
}

/* The kernel of library l with this name, or NULL. */
static kern_t *kern_by_name(lib_t *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->kernels[i].name, name) == 0)
            return &l->kernels[i];
    return NULL;
}

/* The kernel's function in ctx (lock held). */
static func_t *func_of(kern_t *k, fk_ctx_t *ctx)
{
    if (!k->funcs[ctx->dev]) {
        func_t *f = calloc(1, sizeof(*f));
        if (!f)
            return NULL;
        *f = (func_t){ .k = k, .ctx = ctx };
        fk_handle_add(f, FK_K_FUNCTION);
        k->funcs[ctx->dev] = f;
    }
    return k->funcs[ctx->dev];
}

CUresult CUDAAPI cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                   void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                   void **libraryOptionValues, unsigned int numLibraryOptions)
{
    FK_BEGIN(cuLibraryLoadData);
    if (!library || !code || (numJitOptions && (!jitOptions || !jitOptionsValues)) ||
        (numLibraryOptions && (!libraryOptions || !libraryOptionValues)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    lib_t *l = NULL;
    CUresult r = lib_load(code, false, NULL, &l);
    if (r == CUDA_SUCCESS)
        *library = (CUlibrary)l;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary library)
{
    FK_BEGIN(cuLibraryUnload);
    pthread_mutex_lock(&fk.mu);
    lib_t *l = (lib_t *)library;
    CUresult r = fk_handle_ok(l, FK_K_LIBRARY) && !l->module ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS)
        lib_free(l);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    FK_BEGIN(cuLibraryGetKernel);
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    lib_t *l = (lib_t *)library;
    kern_t *k = NULL;
    CUresult r = fk_handle_ok(l, FK_K_LIBRARY) && !l->module ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && !(k = kern_by_name(l, name)))
        r = CUDA_ERROR_NOT_FOUND;
    if (k)
        *pKernel = (CUkernel)k;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuLibraryGetKernelCount(unsigned int *count, CUlibrary lib)
{
    FK_BEGIN(cuLibraryGetKernelCount);
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    lib_t *l = (lib_t *)lib;
    CUresult r = fk_handle_ok(l, FK_K_LIBRARY) && !l->module ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS)
        *count = (unsigned)l->n;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuLibraryEnumerateKernels(CUkernel *kernels, unsigned int numKernels, CUlibrary lib)
{
    FK_BEGIN(cuLibraryEnumerateKernels);
    if (!kernels)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    lib_t *l = (lib_t *)lib;
    CUresult r = fk_handle_ok(l, FK_K_LIBRARY) && !l->module ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    for (unsigned i = 0; r == CUDA_SUCCESS && i < numKernels && i < (unsigned)l->n; i++)
        kernels[i] = (CUkernel)&l->kernels[i];
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    FK_BEGIN(cuKernelGetFunction);
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_handle_ok(kernel, FK_K_KERNEL) ? fk_ctx_get(&ctx) : CUDA_ERROR_INVALID_HANDLE;
    func_t *f = NULL;
    if (r == CUDA_SUCCESS && !(f = func_of((kern_t *)kernel, ctx)))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (f)
        *pFunc = (CUfunction)f;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuKernelGetName(const char **name, CUkernel hfunc)
{
    FK_BEGIN(cuKernelGetName);
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_handle_ok(hfunc, FK_K_KERNEL) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS)
        *name = ((kern_t *)hfunc)->name;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    FK_BEGIN(cuModuleLoadData);
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    lib_t *l = NULL;
    CUresult r = fk_ctx_get(&ctx);
    if (r == CUDA_SUCCESS)
        r = lib_load(image, true, ctx, &l);
    if (r == CUDA_SUCCESS)
        *module = (CUmodule)l;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    FK_BEGIN(cuModuleUnload);
    pthread_mutex_lock(&fk.mu);
    lib_t *l = (lib_t *)hmod;
    CUresult r = fk_handle_ok(l, FK_K_LIBRARY) && l->module ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS)
        lib_free(l);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    FK_BEGIN(cuModuleGetFunction);
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    lib_t *l = (lib_t *)hmod;
    kern_t *k = NULL;
    func_t *f = NULL;
    CUresult r = fk_handle_ok(l, FK_K_LIBRARY) && l->module ? fk_ctx_check(l->ctx) : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && !(k = kern_by_name(l, name)))
        r = CUDA_ERROR_NOT_FOUND;
    if (k && !(f = func_of(k, l->ctx)))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (f)
        *hfunc = (CUfunction)f;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* ============================================================================================
 * Launches
 * ========================================================================================== */

/* The parameter block of a launch, from kernelParams or from extra's buffer. */
static CUresult launch_params(const fk_hkernel_t *hk, void **kernelParams, void **extra, unsigned char **out)
{
    const void *src = NULL;
    if (kernelParams && extra)
        return CUDA_ERROR_INVALID_VALUE;
    if (kernelParams) {
        src = kernelParams[0];
    } else if (extra) {
        const void *buf = NULL;
        size_t size = 0;
        bool have_size = false;
        for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (i > 16)
                return CUDA_ERROR_INVALID_VALUE;
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1] && (have_size = true))
                memcpy(&size, extra[i + 1], sizeof(size));
            else
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (!have_size || size != hk->param_size)
            return CUDA_ERROR_INVALID_VALUE;
        src = buf;
    }
    if (!src)
        return CUDA_ERROR_INVALID_VALUE;
    if (!(*out = malloc(hk->param_size)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(*out, src, hk->param_size);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    FK_BEGIN(cuLaunchKernel);
    if (!gridDimX || !gridDimY || !gridDimZ || !blockDimX || !blockDimY || !blockDimZ || gridDimX > 2147483647u ||
        gridDimY > 65535 || gridDimZ > 65535 || blockDimX > 1024 || blockDimY > 1024 || blockDimZ > 64 ||
        (uint64_t)blockDimX * blockDimY * blockDimZ > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (sharedMemBytes > MAX_SHARED)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    kern_t *k = NULL;
    fk_ctx_t *ctx = NULL;
    CUresult r = CUDA_SUCCESS;
    if (fk_handle_ok(f, FK_K_FUNCTION)) {
        k = ((func_t *)f)->k;
        ctx = ((func_t *)f)->ctx;
        if (fk_ctx_current() != ctx)
            r = CUDA_ERROR_INVALID_CONTEXT; /* a function belongs to the context it was got in */
    } else if (fk_handle_ok(f, FK_K_KERNEL)) {
        k = (kern_t *)f; /* a CUkernel: runs in the current context */
        r = fk_ctx_get(&ctx);
    } else {
        r = CUDA_ERROR_INVALID_HANDLE;
    }
    if (r == CUDA_SUCCESS)
        r = fk_ctx_check(ctx);
    fk_stream_t *s = NULL;
    if (r == CUDA_SUCCESS)
        r = fk_stream_resolve(hStream, &s, true);
    if (r == CUDA_SUCCESS && !k->hk) {
        fk_log("cuLaunchKernel: the double has no host build of kernel %s: add its wrapper to "
               "tests/cudafake/kernels.cpp", k->name);
        r = CUDA_ERROR_NOT_SUPPORTED;
    }
    unsigned char *params = NULL;
    if (r == CUDA_SUCCESS)
        r = launch_params(k->hk, kernelParams, extra, &params);
    fk_op_t *op = r == CUDA_SUCCESS ? fk_op_new(FK_OP_KERNEL) : NULL;
    if (r == CUDA_SUCCESS && !op)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (op) {
        op->u.kernel.k = k->hk;
        op->u.kernel.params = params;
        params = NULL;
        op->u.kernel.nthreads = (size_t)gridDimX * gridDimY * gridDimZ * blockDimX * blockDimY * blockDimZ;
        op->u.kernel.block_threads = (size_t)blockDimX * blockDimY * blockDimZ;
        op->u.kernel.name = k->hk->name;
        r = fk_enqueue(s, op);
    }
    free(params);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

typedef struct {
    fk_stream_t *s;
    const char *name;
} cookie_t;

/* The access check a host kernel's `check` calls for each of its buffers. */
static CUresult access_cb(void *cookie, const void *p, size_t len, bool write)
{
    cookie_t *c = cookie;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_mem_access(c->s->ctx, (uintptr_t)p, len, write, c->name);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* One launch's blocks, shared by the host threads that run them. */
typedef struct blocks {
    const fk_op_t *op;
    size_t nblocks;
    atomic_size_t next; /* the next block to start */
    int wanted;         /* helpers it asks for (under helpers.mu, as the rest below) */
    int joined;         /* helpers that took it */
    int active;         /* helpers running its blocks now */
    struct blocks *next_job;
} blocks_t;

/* The helper threads, shared by every stream: started when a launch asks for one and none is idle,
 * then parked between launches (detached: they never hold up the process's exit). Their number is
 * the most ever busy at once, so a launch never pays a thread's start once the pool is warm. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* a job came, for idle helpers */
    pthread_cond_t left_cv; /* a helper left a job */
    blocks_t *jobs;         /* launches that still want helpers */
    int idle;
} helpers = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0 };

/* Run blocks, the next one not started each time, until none is left. */
static void block_worker(blocks_t *bl)
{
    const fk_op_t *op = bl->op;
    size_t bs = op->u.kernel.block_threads;
    for (size_t b; (b = atomic_fetch_add(&bl->next, 1)) < bl->nblocks;)
        op->u.kernel.k->run(op->u.kernel.params, b * bs, (b + 1) * bs, op->u.kernel.nthreads);
}

static void *helper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&helpers.mu);
    for (;;) {
        blocks_t *j = helpers.jobs;
        while (j && j->joined >= j->wanted)
            j = j->next_job;
        if (!j) {
            helpers.idle++;
            pthread_cond_wait(&helpers.cv, &helpers.mu);
            helpers.idle--;
            continue;
        }
        j->joined++;
        j->active++;
        pthread_mutex_unlock(&helpers.mu);
        block_worker(j);
        pthread_mutex_lock(&helpers.mu);
        j->active--;
        pthread_cond_broadcast(&helpers.left_cv);
    }
    return NULL;
}

/* Run a launch's grid: its blocks concurrently on the calling worker and up to FK_BLOCK_WORKERS - 1
 * helper threads (fewer when the grid has fewer blocks, or a thread cannot be started: the blocks
 * then run on fewer threads, later ones after earlier ones end, as in a GPU's waves). */
static void run_blocks(const fk_op_t *op)
{
    size_t bs = op->u.kernel.block_threads ? op->u.kernel.block_threads : op->u.kernel.nthreads;
    blocks_t bl = { .op = op, .nblocks = bs ? op->u.kernel.nthreads / bs : 0 };
    atomic_init(&bl.next, 0);
    bl.wanted = bl.nblocks > FK_BLOCK_WORKERS ? FK_BLOCK_WORKERS - 1 : bl.nblocks > 0 ? (int)bl.nblocks - 1 : 0;
    if (bl.wanted) {
        pthread_mutex_lock(&helpers.mu);
        bl.next_job = helpers.jobs;
        helpers.jobs = &bl;
        int start = bl.wanted - helpers.idle;
        pthread_cond_broadcast(&helpers.cv);
        pthread_mutex_unlock(&helpers.mu);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        for (int i = 0; i < start; i++) {
            pthread_t t;
            (void)pthread_create(&t, &attr, helper_main, NULL); /* none: fewer threads run the blocks */
        }
        pthread_attr_destroy(&attr);
    }
    block_worker(&bl);
    if (bl.wanted) {
        pthread_mutex_lock(&helpers.mu);
        for (blocks_t **pp = &helpers.jobs; *pp; pp = &(*pp)->next_job)
            if (*pp == &bl) {
                *pp = bl.next_job;
                break;
            }
        while (bl.active)
            pthread_cond_wait(&helpers.left_cv, &helpers.mu);
        pthread_mutex_unlock(&helpers.mu);
    }
}

/* Run a launch on s's worker: check its buffers, then run its grid (lock not held). */
CUresult fk_kernel_run(fk_stream_t *s, fk_op_t *op)
{
    const fk_hkernel_t *hk = op->u.kernel.k;
    cookie_t c = { .s = s, .name = hk->name };
    CUresult r = hk->check(op->u.kernel.params, access_cb, &c);
    if (r == CUDA_ERROR_MISALIGNED_ADDRESS)
        fk_log("kernel %s on %s: a buffer is not aligned as its accesses need", hk->name, s->label);
    else if (r != CUDA_SUCCESS)
        fk_log("kernel %s on %s: its parameters name memory it may not access", hk->name, s->label);
    if (r == CUDA_SUCCESS)
        run_blocks(op);
    return r;
}
