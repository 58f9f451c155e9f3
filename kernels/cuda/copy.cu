/*
 * copy.cu - the copy kernels, one per unit width (16, 8, 4, 2, 1 bytes). Device code only: part of
 * the fatbin the daemon embeds (see reduce.cu). Each is an extern "C" entry point named
 * COLLD__CUDA_COPY_KERNEL(bytes) (e.g. colld__cuda_copy_16).
 */
#include "kernels/cuda/cuda_core.cuh"

/* One kernel per unit type: the grid-stride body of cuda_core.cuh. */
#define COLLD__COPY_KERNEL_DEF(Unit, bytes)                                                        \
    extern "C" __global__ void __launch_bounds__(COLLD__CUDA_THREADS)                              \
        COLLD__CUDA_COPY_KERNEL(bytes)(const __grid_constant__ colld__cuda_copy_params_t p)        \
    {                                                                                              \
        colld__cuda_copy_body<Unit>(p, (size_t)blockIdx.x * blockDim.x + threadIdx.x,              \
                                    (size_t)gridDim.x * blockDim.x);                               \
    }

COLLD__CUDA_COPY_UNITS(COLLD__COPY_KERNEL_DEF)

#undef COLLD__COPY_KERNEL_DEF
