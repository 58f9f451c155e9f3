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
 * Blocks come from the GPUs' pool g->nan_blocks (cuda_mem.c: registered once, since pinning costs
 * hundreds of microseconds on hardware; dropped by a reset of their GPU's context; unregistered at
 * stop): taken at launch (engine thread, daemon lock not held) and given back when the collective
 * finishes (lock held).
 */
#include "server/backends/cuda/cuda.h"

#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

CUresult cuda_nan_arm(colld_gpus_t *g, colld_coll_t *k, int gi)
{
    CUresult r = CUDA_SUCCESS;
    cuda_hostblk_t *x = cuda_hostblk_get(g, &g->nan_blocks, gi, &r);
    if (!x)
        return r;
    /* Plain stores: the kernel launch that reads them comes after, on this thread (a launch sees
     * the host's earlier writes to mapped memory). */
    unsigned long long *words = x->mem;
    for (size_t i = 0; i < x->size / sizeof(*words); i++)
        words[i] = COLLD_CUDA_NAN_NONE;
    k->bcheck = x;
    return CUDA_SUCCESS;
}

const colld_cuda_nan_check_t *cuda_nan_check(const colld_coll_t *k, int gi, uint64_t base, colld_cuda_nan_check_t *out)
{
    const cuda_hostblk_t *x = k->bcheck;
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
    const cuda_hostblk_t *x = k->bcheck;
    const colld_wire_sqe_t *a = &colld_coll_lead(k)->d;
    int off = 0, bad = 0;
    if (!x)
        return COLLD_OK;
    why[0] = '\0';
    for (int r = 0; r < k->comm->nranks && r < COLLD_CUDA_MAX_RANKS && off < (int)len - 80; r++) {
        unsigned long long w = COLLD_CUDA_NAN_NONE;
        for (int gi = 0; gi < g->n; gi++) {
            unsigned long long v = __atomic_load_n(&row(x->mem, gi)[r], __ATOMIC_ACQUIRE);
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
    cuda_hostblk_t *x = k->bcheck;
    if (!x)
        return;
    k->bcheck = NULL;
    cuda_hostblk_put(g, &g->nan_blocks, x);
}
