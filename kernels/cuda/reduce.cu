/*
 * reduce.cu - the reduce kernels, one per dtype x op, generated from the dtype and op lists of the
 * CPU kernels (kernels/cpu/reduce_internal.h). Device code only: nvcc compiles this file (with
 * copy.cu) into the fatbin the daemon embeds and loads through the CUDA driver (launch.c).
 *
 * Each kernel is an extern "C" entry point named COLLD__CUDA_REDUCE_KERNEL(dtype, op) (e.g.
 * colld__cuda_reduce_float32_sum), so that the daemon finds it by a stable name.
 */
#include "kernels/cuda/cuda_core.cuh"

/* One kernel: the grid-stride body of cuda_core.cuh over the launch's threads. The parameter block is
 * read in place from the parameter space (__grid_constant__), never copied per thread. */
#define COLLD__REDUCE_KERNEL_DEF(name, E_OP, opname)                                               \
    extern "C" __global__ void __launch_bounds__(COLLD__CUDA_THREADS)                              \
        COLLD__CUDA_REDUCE_KERNEL(name, opname)(const __grid_constant__ colld__cuda_reduce_params_t p) \
    {                                                                                              \
        colld__cuda_reduce_body<colld__cuda_t_##name, E_OP>(                                       \
            p, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);     \
    }
#define COLLD__REDUCE_DTYPE_DEF(E, name, T, A, U, W, K) COLLD_REDUCE_OPS(COLLD__REDUCE_KERNEL_DEF, name)

COLLD_REDUCE_DTYPES(COLLD__REDUCE_DTYPE_DEF)

#undef COLLD__REDUCE_DTYPE_DEF
#undef COLLD__REDUCE_KERNEL_DEF
