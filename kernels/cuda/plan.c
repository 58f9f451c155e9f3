/*
 * plan.c - the host side of the CUDA kernels that needs no CUDA: argument checks, the launch plan
 * (which elements go one by one and which in 16-byte vectors; see cuda_plan.h) and the error text of
 * colld_cuda_last_error(). Plain C, so it is built with the project's warnings and sanitizers, and
 * the host emulation test (tests/gpu) checks the very plan the launchers use.
 */
#include "kernels/cuda/cuda_plan.h"

#include "kernels/cpu/reduce_internal.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* This thread's last error text (see colld_cuda_last_error). */
static _Thread_local char last_error[256];

/* Public: the text of this thread's last failing call. */
const char *colld_cuda_last_error(void)
{
    return last_error;
}

/* Set this thread's error text. */
void colld__cuda_set_error(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

/* Element sizes, from the dtype list the CPU kernels are generated from. */
size_t colld__cuda_dtype_size(colld_dtype_t dtype)
{
#define COLLD__SIZE_CASE(E, name, T, A, U, W, K)                                                                       \
    case E:                                                                                                            \
        return sizeof(T);
    switch (dtype) {
        COLLD_REDUCE_DTYPES(COLLD__SIZE_CASE)
    default:
        return 0;
    }
#undef COLLD__SIZE_CASE
}

/* Check one buffer of `bytes` bytes whose elements are `align` bytes: not NULL, aligned, and not
 * running past the end of the address space. `what` and `index` name it in the error text. */
static int check_buffer(const char *fn, const char *what, int index, const void *ptr, size_t align, size_t bytes)
{
    uintptr_t a = (uintptr_t)ptr;

    if (ptr == NULL) {
        colld__cuda_set_error("%s: %s %d is NULL", fn, what, index);
        return 0;
    }
    if (a % align != 0) {
        colld__cuda_set_error("%s: %s %d (%p) is not aligned to its element size %zu", fn, what, index, ptr, align);
        return 0;
    }
    if (a > UINTPTR_MAX - bytes) {
        colld__cuda_set_error("%s: %s %d (%p) + %zu bytes runs past the end of the address space", fn, what, index, ptr,
                              bytes);
        return 0;
    }
    return 1;
}

/* Whether two buffers of `bytes` bytes overlap without being the very same buffer: the one overlap
 * that would make results depend on the order of threads. */
static int overlap_partially(const void *x, const void *y, size_t bytes)
{
    uintptr_t a = (uintptr_t)x, b = (uintptr_t)y;

    return a != b && a < b + bytes && b < a + bytes;
}

/* See cuda_plan.h. */
colld_status_t colld__cuda_reduce_plan(colld_dtype_t dtype, int op, const uint64_t *scalars, const void *const *in,
                                       int n_in, void *const *out, int n_out, size_t count,
                                       colld__cuda_reduce_params_t *p, size_t *work)
{
    const char *fn = op == COLLD__REDOP_PREMUL_SUM ? "colld_cuda_reduce_premul" : "colld_cuda_reduce";
    size_t es, bytes, v, mis;
    int vec = 1;

    *work = 0;
    if ((unsigned)dtype >= COLLD_DTYPE_COUNT || (unsigned)op >= COLLD__REDOPS) {
        colld__cuda_set_error("%s: unknown dtype %d or op %d", fn, (int)dtype, op);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (op == COLLD__REDOP_PREMUL_SUM && scalars == NULL) {
        colld__cuda_set_error("%s: the array of scalars is NULL", fn);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (n_in < 1 || n_in > COLLD_CUDA_MAX_RANKS || n_out < 0 || n_out > COLLD_CUDA_MAX_RANKS) {
        colld__cuda_set_error("%s: n_in %d must be 1..%d and n_out %d 0..%d", fn, n_in, COLLD_CUDA_MAX_RANKS, n_out,
                              COLLD_CUDA_MAX_RANKS);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (in == NULL || (n_out > 0 && out == NULL)) {
        colld__cuda_set_error("%s: the array of %s pointers is NULL", fn, in == NULL ? "input" : "output");
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (count == 0 || n_out == 0)
        return COLLD_OK;

    es = colld__cuda_dtype_size(dtype);
    if (count > SIZE_MAX / es) {
        colld__cuda_set_error("%s: count %zu of %zu-byte elements overflows", fn, count, es);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    bytes = count * es;
    for (int r = 0; r < n_in; r++)
        if (!check_buffer(fn, "input", r, in[r], es, bytes))
            return COLLD_ERR_INVALID_ARGUMENT;
    for (int o = 0; o < n_out; o++) {
        if (!check_buffer(fn, "output", o, out[o], es, bytes))
            return COLLD_ERR_INVALID_ARGUMENT;
        for (int r = 0; r < n_in; r++)
            if (overlap_partially(out[o], in[r], bytes)) {
                colld__cuda_set_error("%s: output %d overlaps input %d without being the same buffer", fn, o, r);
                return COLLD_ERR_INVALID_ARGUMENT;
            }
        for (int o2 = 0; o2 < o; o2++)
            if (overlap_partially(out[o], out[o2], bytes)) {
                colld__cuda_set_error("%s: output %d overlaps output %d without being the same buffer", fn, o, o2);
                return COLLD_ERR_INVALID_ARGUMENT;
            }
    }

    /* The vector body needs every pointer at the same address modulo 16. */
    mis = (uintptr_t)in[0] % COLLD__CUDA_VEC_BYTES;
    for (int r = 1; r < n_in; r++)
        vec &= (uintptr_t)in[r] % COLLD__CUDA_VEC_BYTES == mis;
    for (int o = 0; o < n_out; o++)
        vec &= (uintptr_t)out[o] % COLLD__CUDA_VEC_BYTES == mis;

    memset(p, 0, sizeof *p);
    memcpy(p->in, in, (size_t)n_in * sizeof in[0]);
    memcpy(p->out, out, (size_t)n_out * sizeof out[0]);
    if (op == COLLD__REDOP_PREMUL_SUM)
        memcpy(p->scalar, scalars, (size_t)n_in * sizeof scalars[0]);
    p->n_in = n_in;
    p->n_out = n_out;
    p->count = count;
    v = COLLD__CUDA_VEC_BYTES / es;
    if (vec) {
        /* mis is a multiple of es (every pointer is element-aligned). */
        p->head = (COLLD__CUDA_VEC_BYTES - mis) % COLLD__CUDA_VEC_BYTES / es;
        if (p->head > count)
            p->head = count;
        p->nvec = (count - p->head) / v;
    } else {
        p->head = count;
        p->nvec = 0;
    }
    *work = p->nvec + (count - p->nvec * v);
    return COLLD_OK;
}

/* See cuda_plan.h. */
colld_status_t colld__cuda_copy_plan(const void *src, void *const *out, int n_out, size_t bytes,
                                     colld__cuda_copy_params_t *p, size_t *work)
{
    static const char fn[] = "colld_cuda_copy";
    static const int units[] = { 16, 8, 4, 2 };
    int unit = 1;
    size_t mis;

    *work = 0;
    if (n_out < 0 || n_out > COLLD_CUDA_MAX_RANKS) {
        colld__cuda_set_error("%s: n_out %d must be 0..%d", fn, n_out, COLLD_CUDA_MAX_RANKS);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (n_out > 0 && out == NULL) {
        colld__cuda_set_error("%s: the array of output pointers is NULL", fn);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (bytes == 0 || n_out == 0)
        return COLLD_OK;
    if (!check_buffer(fn, "source", 0, src, 1, bytes))
        return COLLD_ERR_INVALID_ARGUMENT;

    memset(p, 0, sizeof *p);
    p->src = src;
    for (int o = 0; o < n_out; o++) {
        if (!check_buffer(fn, "output", o, out[o], 1, bytes))
            return COLLD_ERR_INVALID_ARGUMENT;
        if (overlap_partially(out[o], src, bytes)) {
            colld__cuda_set_error("%s: output %d overlaps the source without being the same buffer", fn, o);
            return COLLD_ERR_INVALID_ARGUMENT;
        }
        for (int o2 = 0; o2 < o; o2++)
            if (overlap_partially(out[o], out[o2], bytes)) {
                colld__cuda_set_error("%s: output %d overlaps output %d without being the same buffer", fn, o, o2);
                return COLLD_ERR_INVALID_ARGUMENT;
            }
        if (out[o] != src) /* the source itself already holds the data */
            p->out[p->n_out++] = out[o];
    }
    if (p->n_out == 0)
        return COLLD_OK;

    /* The widest unit at which every pointer has the same address modulo the unit. */
    for (size_t i = 0; i < sizeof units / sizeof units[0] && unit == 1; i++) {
        size_t u = (size_t)units[i];
        int same = 1;
        mis = (uintptr_t)src % u;
        for (int o = 0; o < p->n_out; o++)
            same &= (uintptr_t)p->out[o] % u == mis;
        if (same)
            unit = units[i];
    }
    mis = (uintptr_t)src % (size_t)unit;
    p->bytes = bytes;
    p->unit = unit;
    p->head = ((size_t)unit - mis) % (size_t)unit;
    if (p->head > bytes)
        p->head = bytes;
    p->nunits = (bytes - p->head) / (size_t)unit;
    *work = p->nunits + (bytes - p->nunits * (size_t)unit);
    return COLLD_OK;
}
