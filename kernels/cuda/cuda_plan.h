/*
 * cuda_plan.h - internals of the CUDA kernels shared by the plain C side (plan.c: argument checks,
 * the launch plan, error text) and the CUDA side (the kernels and launchers in the .cu files, and the
 * host emulation test in tests/gpu).
 *
 * A launcher first asks plan.c to check its arguments and fill a parameter block; the kernel gets the
 * block by value. The plan splits the elements into a head done one element at a time (up to the
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
    size_t count; /* elements */
    size_t head;  /* elements before the vector body (head <= count) */
    size_t nvec;  /* vectors of 16 bytes in the body (head + nvec * V <= count) */
    int n_in;     /* 1 .. COLLD_CUDA_MAX_RANKS */
    int n_out;    /* 1 .. COLLD_CUDA_MAX_RANKS */
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
} colld__cuda_copy_params_t;

/* Size in bytes of one element of dtype; 0 for an unknown dtype. */
size_t colld__cuda_dtype_size(colld_dtype_t dtype);

/* Check the arguments of colld_cuda_reduce and fill *p. Returns COLLD_OK with *work = the number of
 * work items (vectors plus single elements; 0: nothing to launch), or COLLD_ERR_INVALID_ARGUMENT
 * with the reason in colld_cuda_last_error(). */
colld_status_t colld__cuda_reduce_plan(colld_dtype_t dtype, colld_redop_t op, const void *const *in,
                                       int n_in, void *const *out, int n_out, size_t count,
                                       colld__cuda_reduce_params_t *p, size_t *work);

/* The same for colld_cuda_copy (outputs equal to src are left out of p->out). */
colld_status_t colld__cuda_copy_plan(const void *src, void *const *out, int n_out, size_t bytes,
                                     colld__cuda_copy_params_t *p, size_t *work);

/* Launch `kernel` (a __global__ function taking one parameter block) with *params on `stream` of the
 * current device, with enough blocks for `work` work items (one per thread, at most
 * COLLD__CUDA_BLOCKS_PER_SM blocks per multiprocessor). Returns COLLD_OK or COLLD_ERR_DEVICE with
 * the CUDA error in colld_cuda_last_error(); `what` names the caller there. Implemented in launch.cu. */
colld_status_t colld__cuda_launch(const void *kernel, void *params, size_t work, void *stream,
                                  const char *what);

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
