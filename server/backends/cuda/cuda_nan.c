/*
 * cuda_nan.c - --nan-check on GPU buffers (issue 30): the words in which a checked collective's
 * reduce kernels note each rank's first NaN or infinity, and the verdict read from them once the
 * collective's event has fired.
 *
 * A checked collective (the daemon's --nan-check or its communicator's nan_check; a reduction of a
 * floating-point dtype) gets a block of words, [GPU][rank], in host memory registered with CUDA as
 * portable and device-mapped in the context of its lead GPU: every kernel on GPU i lowers word
 * [i][r] with atomicMin (kernels/cuda: COLLD_CUDA_NAN_WORD, the collective's element index and the
 * class; atomics on mapped host memory are atomic among one GPU's threads only, hence a row per
 * GPU). When the event fired, the rank's first element is the lowest of its column, and the detail
 * is the host backend's, word for word ("rank 1 contributed NaN at element 7; ... (allreduce
 * float32, --nan-check)"), so that collctl doctor and the tests read both alike.
 *
 * Blocks are registered once (pinning costs hundreds of microseconds on hardware) and kept in a
 * pool per GPU, under their own mutex: they are taken at launch (engine thread, daemon lock not
 * held) and given back when the collective finishes (lock held); the pool holds at most as many as
 * were ever in flight at once. A reset of a GPU's context drops the registrations made in it: its
 * pooled blocks are freed, and one in use is freed, not pooled, when it comes back. The pool is
 * unregistered at stop.
 */
#include "server/backends/cuda/cuda.h"

#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAN_PAGE 4096u

/* One collective's words. */
struct gpu_nan {
    unsigned long long *words; /* [g->n][COLLD_CUDA_MAX_RANKS], host address */
    uint64_t dptr;             /* the same memory as the GPUs address it */
    size_t size;
    int gpu;              /* registered in this GPU's context ... */
    uint64_t epoch;       /* ... in this epoch of it (cuda_nan_gpu_reset) */
    struct gpu_nan *next; /* in the pool */
};

/* The words of GPU gi's row. */
static unsigned long long *row(unsigned long long *words, int gi)
{
    return words + (size_t)gi * COLLD_CUDA_MAX_RANKS;
}

bool cuda_nan_wanted(const colld_backend_t *b, const colld_coll_t *k)
{
    const colld_wire_sqe_t *a = &colld_coll_lead(k)->d;
    return (b->d->cfg.nan_check || k->comm->nan_check) && colld_kind_has_op(a->kind) &&
           (a->dtype == COLLD_FLOAT16 || a->dtype == COLLD_BFLOAT16 || a->dtype == COLLD_FLOAT32 ||
            a->dtype == COLLD_FLOAT64);
}

/* A new block, registered in GPU gi's context; NULL with *r the error. */
static gpu_nan_t *block_new(colld_gpus_t *g, int gi, CUresult *r)
{
    gpu_nan_t *x = calloc(1, sizeof(*x));
    size_t bytes = (size_t)g->n * COLLD_CUDA_MAX_RANKS * sizeof(unsigned long long);
    *r = CUDA_ERROR_OUT_OF_MEMORY;
    if (!x)
        return NULL;
    x->size = (bytes + NAN_PAGE - 1) / NAN_PAGE * NAN_PAGE; /* pages of its own: registrations never overlap */
    void *p = NULL;
    if (posix_memalign(&p, NAN_PAGE, x->size) != 0) {
        free(x);
        return NULL;
    }
    x->words = p;
    x->gpu = gi;
    pthread_mutex_lock(&g->nan_mu);
    x->epoch = g->nan_epoch[gi];
    pthread_mutex_unlock(&g->nan_mu);
    if ((*r = cuda_flags_register(g, gi, x->words, x->size, &x->dptr)) != CUDA_SUCCESS) {
        free(x->words);
        free(x);
        return NULL;
    }
    return x;
}

CUresult cuda_nan_arm(colld_gpus_t *g, colld_coll_t *k, int gi)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g->nan_mu);
    gpu_nan_t *x = g->nan_pool[gi];
    if (x)
        g->nan_pool[gi] = x->next;
    pthread_mutex_unlock(&g->nan_mu);
    if (!x && !(x = block_new(g, gi, &r)))
        return r;
    x->next = NULL;
    /* Plain stores: the kernel launch that reads them comes after, on this thread (a launch sees
     * the host's earlier writes to mapped memory). */
    for (size_t i = 0; i < x->size / sizeof(*x->words); i++)
        x->words[i] = COLLD_CUDA_NAN_NONE;
    k->bcheck = x;
    return CUDA_SUCCESS;
}

const colld_cuda_nan_check_t *cuda_nan_check(const colld_coll_t *k, int gi, uint64_t base, colld_cuda_nan_check_t *out)
{
    const gpu_nan_t *x = k->bcheck;
    if (!x)
        return NULL;
    out->first_bad = row((unsigned long long *)(uintptr_t)x->dptr, gi);
    out->base = base;
    return out;
}

/* "NaN", "+Inf" or "-Inf" of a word's class (the names of colld_cpu_nonfinite_name). */
static const char *class_name(int cls)
{
    return cls == COLLD_CUDA_NAN ? "NaN" : cls == COLLD_CUDA_PINF ? "+Inf" : "-Inf";
}

colld_status_t cuda_nan_verdict(const colld_gpus_t *g, const colld_coll_t *k, char *why, size_t len)
{
    const gpu_nan_t *x = k->bcheck;
    const colld_wire_sqe_t *a = &colld_coll_lead(k)->d;
    int off = 0, bad = 0;
    if (!x)
        return COLLD_OK;
    why[0] = '\0';
    for (int r = 0; r < k->comm->nranks && r < COLLD_CUDA_MAX_RANKS && off < (int)len - 80; r++) {
        unsigned long long w = COLLD_CUDA_NAN_NONE;
        for (int gi = 0; gi < g->n; gi++) {
            unsigned long long v = __atomic_load_n(&row(x->words, gi)[r], __ATOMIC_ACQUIRE);
            w = v < w ? v : w;
        }
        if (w == COLLD_CUDA_NAN_NONE)
            continue;
        off += snprintf(why + off, len - (size_t)off, "%srank %d contributed %s at element %llu", bad++ ? "; " : "", r,
                        class_name(COLLD_CUDA_NAN_CLASS(w)), (unsigned long long)COLLD_CUDA_NAN_INDEX(w));
    }
    if (!bad)
        return COLLD_OK;
    if (off < (int)len)
        snprintf(why + off, len - (size_t)off, " (%s %s, --nan-check)", colld_kind_name(a->kind),
                 colld_dtype_name((colld_dtype_t)a->dtype));
    return COLLD_ERR_NUMERIC;
}

void cuda_nan_release(colld_gpus_t *g, colld_coll_t *k)
{
    gpu_nan_t *x = k->bcheck;
    if (!x)
        return;
    k->bcheck = NULL;
    pthread_mutex_lock(&g->nan_mu);
    bool valid = x->epoch == g->nan_epoch[x->gpu];
    if (valid) {
        x->next = g->nan_pool[x->gpu];
        g->nan_pool[x->gpu] = x;
    }
    pthread_mutex_unlock(&g->nan_mu);
    if (!valid) { /* its registration went with a reset of its GPU's context */
        free(x->words);
        free(x);
    }
}

void cuda_nan_gpu_reset(colld_gpus_t *g, int gi)
{
    pthread_mutex_lock(&g->nan_mu);
    gpu_nan_t *x = g->nan_pool[gi];
    g->nan_pool[gi] = NULL;
    g->nan_epoch[gi]++;
    pthread_mutex_unlock(&g->nan_mu);
    while (x) {
        gpu_nan_t *next = x->next;
        free(x->words);
        free(x);
        x = next;
    }
}

void cuda_nan_free_all(colld_gpus_t *g)
{
    for (int gi = 0; gi < g->n; gi++) {
        gpu_nan_t *x = g->nan_pool[gi];
        g->nan_pool[gi] = NULL;
        while (x) {
            gpu_nan_t *next = x->next;
            CU_CHECK(g->cu, cuCtxPushCurrent, g->gpu[gi].ctx);
            CU_CHECK(g->cu, cuMemHostUnregister, x->words);
            CU_CHECK(g->cu, cuCtxPopCurrent, NULL);
            free(x->words);
            free(x);
            x = next;
        }
    }
}
