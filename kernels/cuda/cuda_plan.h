/*
 * cuda_plan.h - internals of the CUDA kernels shared by the plain C side (plan.c: argument checks,
 * the launch plan, error text) and the CUDA side (the kernels and launchers in the .cu files, and the
 * host emulation test in tests/gpu).
 *
 * A launcher first asks plan.c to check its arguments and fill a parameter block; the kernel gets the
 * block by value (launch.c passes it to cuLaunchKernel). The plan splits the elements into a head done one element at a time (up to the
 * first 16-byte boundary), a body of whole 16-byte vectors, and a tail done one element at a time:
 *
 *   element:  0 .. head-1 | head .. head + nvec*V - 1 | head + nvec*V .. count-1
 *             elements    | nvec vectors of V elements | elements
 *
 * where V = 16 / element size. The body exists only when every pointer has the same address modulo
 * 16 (so the head aligns all of them at once); otherwise head = count and nvec = 0. The copy plan is
 * the same with bytes for elements and `unit` bytes (16, 8, 4, 2 or 1) for the vector.
 */
#ifndef COLLD_KERNELS_CUDA_CUDA_PLAN_H
#define COLLD_KERNELS_CUDA_CUDA_PLAN_H

#include "kernels/cuda/cuda_kernels.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The bytes of one vector of the reduce body. */
#define COLLD__CUDA_VEC_BYTES 16

/* Threads per block of every kernel, and the most blocks launched per multiprocessor (the kernels
 * loop over their work with a grid stride, so a grid that fills the GPU is enough). */
#define COLLD__CUDA_THREADS 256
#define COLLD__CUDA_BLOCKS_PER_SM 8

/* Parameters of one reduce kernel (passed by value, read from the parameter space). */
typedef struct {
    const void *in[COLLD_CUDA_MAX_RANKS];
    void *out[COLLD_CUDA_MAX_RANKS];
    size_t count;                          /* elements */
    size_t head;                           /* elements before the vector body (head <= count) */
    size_t nvec;                           /* vectors of 16 bytes in the body (head + nvec * V <= count) */
    int n_in;                              /* 1 .. COLLD_CUDA_MAX_RANKS */
    int n_out;                             /* 1 .. COLLD_CUDA_MAX_RANKS */
    unsigned long long *first_bad;         /* --nan-check: [n_in] COLLD_CUDA_NAN_WORDs; NULL: none */
    size_t base;                           /* --nan-check: the collective's index of element 0 */
    uint64_t scalar[COLLD_CUDA_MAX_RANKS]; /* premul_sum: each input's scalar word; else zero */
    const unsigned *gate;                  /* the hand-off's gate: nothing done unless it is GO; NULL: none */
} colld__cuda_reduce_params_t;

/* Parameters of one copy kernel. */
typedef struct {
    const void *src;
    void *out[COLLD_CUDA_MAX_RANKS];
    size_t bytes;  /* bytes to copy */
    size_t head;   /* bytes before the body (head <= bytes) */
    size_t nunits; /* units of `unit` bytes in the body */
    int unit;      /* 16, 8, 4, 2 or 1 */
    int n_out;     /* 1 .. COLLD_CUDA_MAX_RANKS: the outputs other than src */
    const unsigned *gate; /* the hand-off's gate: nothing done unless it is GO; NULL: none */
} colld__cuda_copy_params_t;

/* The hand-off kernels (issue 28 item 1, handoff.cuh): the gate (behind the stream waits) and the
 * done writes, one block of one thread each. Words: COLLD_CUDA_HANDOFF_WORDS (cuda_kernels.h). */
typedef struct {
    unsigned *ready[COLLD_CUDA_MAX_RANKS]; /* each rank's ready slot, written by its stream */
    unsigned want[COLLD_CUDA_MAX_RANKS];   /* the value the waits waited for there (marked taken: ~want) */
    unsigned *words;                       /* cancel, (unused), gate */
    int n;
} colld__cuda_gate_params_t;

typedef struct {
    unsigned *done[COLLD_CUDA_MAX_RANKS]; /* each rank's done word */
    unsigned value[COLLD_CUDA_MAX_RANKS];
    const unsigned *words; /* the wait's: written only when its gate is GO */
    int n;
} colld__cuda_done_params_t;

/* Size in bytes of one element of dtype; 0 for an unknown dtype. */
size_t colld__cuda_dtype_size(colld_dtype_t dtype);

/* Check the arguments of colld_cuda_reduce (op one of COLLD_REDUCE_OPS but premul_sum, scalars
 * ignored) or colld_cuda_reduce_premul (op COLLD__REDOP_PREMUL_SUM, n_in scalar words) and fill *p.
 * Returns COLLD_OK with *work = the number of work items (vectors plus single elements; 0: nothing
 * to launch), or COLLD_ERR_INVALID_ARGUMENT with the reason in colld_cuda_last_error(). */
colld_status_t colld__cuda_reduce_plan(colld_dtype_t dtype, int op, const uint64_t *scalars, const void *const *in,
                                       int n_in, void *const *out, int n_out, size_t count,
                                       colld__cuda_reduce_params_t *p, size_t *work);

/* The same for colld_cuda_copy (outputs equal to src are left out of p->out). */
colld_status_t colld__cuda_copy_plan(const void *src, void *const *out, int n_out, size_t bytes,
                                     colld__cuda_copy_params_t *p, size_t *work);

/* The kernels' names: extern "C" entry points (stable names, no C++ mangling), one per dtype x op
 * (from the dtype and op lists of kernels/cpu/reduce_internal.h) and one per copy unit. reduce.cu
 * and copy.cu define them under these names, launch.c looks them up in the fatbin by these names
 * (cuLibraryGetKernel), and the CUDA driver test double's host builds carry the same names. */
#define COLLD__CUDA_REDUCE_KERNEL(name, opname) colld__cuda_reduce_##name##_##opname
#define COLLD__CUDA_COPY_KERNEL(bytes) colld__cuda_copy_##bytes
#define COLLD__CUDA_GATE_KERNEL colld__cuda_handoff_gate
#define COLLD__CUDA_DONE_KERNEL colld__cuda_handoff_done
/* X(Unit, bytes): the copy units, widest first (Unit is a CUDA vector or integer type). */
#define COLLD__CUDA_COPY_UNITS(X) X(uint4, 16) X(uint2, 8) X(unsigned int, 4) X(unsigned short, 2) X(unsigned char, 1)
#define COLLD__CUDA_STR_(x) #x
#define COLLD__CUDA_STR(x) COLLD__CUDA_STR_(x)

/* The fatbin of every kernel (sm_80 and sm_90 code, compute_90 PTX), embedded at build time
 * (fatbin.c, generated from the nvcc output by kernels/cuda/embed.cmake). */
extern const unsigned char colld__cuda_fatbin[];
extern const size_t colld__cuda_fatbin_size;

/* Set this thread's colld_cuda_last_error() text. */
void colld__cuda_set_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* COLLD_KERNELS_CUDA_CUDA_PLAN_H */
