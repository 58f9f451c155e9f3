/*
 * reduce.cu - the reduce kernels, one per dtype x op, instantiated from the dtype and op lists of
 * the CPU kernels (kernels/cpu/reduce_internal.h), and colld_cuda_reduce, which picks one.
 */
#include "kernels/cuda/cuda_core.cuh"

/* One kernel: the grid-stride body of cuda_core.cuh over the launch's threads. The parameter block is
 * read in place from the parameter space (__grid_constant__), never copied per thread. */
template <typename D, int OP>
__global__ void __launch_bounds__(COLLD__CUDA_THREADS)
    colld__cuda_reduce_kernel(const __grid_constant__ colld__cuda_reduce_params_t p)
{
    colld__cuda_reduce_body<D, OP>(p, (size_t)blockIdx.x * blockDim.x + threadIdx.x,
                                   (size_t)gridDim.x * blockDim.x);
}

/* The kernel for (dtype, op), NULL for an unknown pair: a switch generated from the two lists. */
static const void *reduce_kernel(colld_dtype_t dtype, colld_redop_t op)
{
#define COLLD__OP_CASE(name, E_OP, opname)                                                         \
    case E_OP:                                                                                     \
        return (const void *)colld__cuda_reduce_kernel<colld__cuda_t_##name, E_OP>;
#define COLLD__DTYPE_CASE(E, name, T, A, U, W, K)                                                  \
    case E:                                                                                        \
        switch (op) {                                                                              \
            COLLD_REDUCE_OPS(COLLD__OP_CASE, name)                                                 \
        default:                                                                                   \
            return NULL;                                                                           \
        }
    switch (dtype) {
        COLLD_REDUCE_DTYPES(COLLD__DTYPE_CASE)
    default:
        return NULL;
    }
#undef COLLD__DTYPE_CASE
#undef COLLD__OP_CASE
}

/* Public: see cuda_kernels.h. */
extern "C" colld_status_t colld_cuda_reduce(colld_dtype_t dtype, colld_redop_t op, const void *const *in,
                                            int n_in, void *const *out, int n_out, size_t count,
                                            void *stream)
{
    colld__cuda_reduce_params_t p;
    size_t work;
    colld_status_t st = colld__cuda_reduce_plan(dtype, op, in, n_in, out, n_out, count, &p, &work);

    if (st != COLLD_OK || work == 0)
        return st;
    return colld__cuda_launch(reduce_kernel(dtype, op), &p, work, stream, "colld_cuda_reduce");
}
