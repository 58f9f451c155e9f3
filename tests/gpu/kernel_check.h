/*
 * kernel_check.h - the check matrix of the CUDA kernels, written once and run against two backends:
 * the real GPU (test_cuda_kernels.c) and the host emulation of the very same kernel bodies
 * (test_cuda_emulated.cu), so that everything but the launch itself is also checked on machines
 * without a GPU.
 *
 * Every result is compared bitwise with the scalar CPU oracle (colld_cpu_reduce_scalar, and
 * colld_cpu_reduce_premul_scalar for the premultiplied sum), the bytes
 * around every output (and around in-place buffers) must keep their poison, and read-only inputs must
 * be unchanged.
 */
#ifndef COLLD_TESTS_GPU_KERNEL_CHECK_H
#define COLLD_TESTS_GPU_KERNEL_CHECK_H

#include <colld/colld.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The op number of the premultiplied sum in the matrix (after the colld_redop_t values). */
#define KCHECK_PREMUL_SUM ((int)COLLD_REDOP_COUNT)

/* Where the kernels run. Memory functions return 0 on success; reduce and copy must have completed
 * (and report a failure of the kernel) when they return. */
typedef struct {
    const char *name;
    size_t big_count; /* the largest element count of the reduce matrix */
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    int (*put)(void *dst, const void *src, size_t bytes);   /* host -> backend */
    int (*get)(void *dst, const void *src, size_t bytes);   /* backend -> host */
    int (*dcopy)(void *dst, const void *src, size_t bytes); /* backend -> backend */
    int (*fill)(void *dst, int byte, size_t bytes);
    /* op: a colld_redop_t, or KCHECK_PREMUL_SUM (colld_cuda_reduce_premul, with n_in scalar words;
     * scalars is NULL for the other ops). */
    colld_status_t (*reduce)(colld_dtype_t dtype, int op, const uint64_t *scalars, const void *const *in, int n_in,
                             void *const *out, int n_out, size_t count);
    colld_status_t (*copy)(const void *src, void *const *out, int n_out, size_t bytes);
} kcheck_backend_t;

/* Run the whole matrix on backend b, printing each failure (the first 50 in full) and a summary.
 * Returns the number of failed cases, or -1 when the backend could not even be set up. */
int kcheck_run(const kcheck_backend_t *b);

/* Names for messages. */
const char *kcheck_dtype_name(colld_dtype_t dt);
const char *kcheck_op_name(int op);

#ifdef __cplusplus
}
#endif

#endif /* COLLD_TESTS_GPU_KERNEL_CHECK_H */
