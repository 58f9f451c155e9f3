/*
 * copy.cu - the copy kernels (one per unit width: 16, 8, 4, 2, 1 bytes) and colld_cuda_copy.
 */
#include "kernels/cuda/cuda_core.cuh"

/* One kernel per unit type: the grid-stride body of cuda_core.cuh. */
template <typename Unit>
__global__ void __launch_bounds__(COLLD__CUDA_THREADS)
    colld__cuda_copy_kernel(const __grid_constant__ colld__cuda_copy_params_t p)
{
    colld__cuda_copy_body<Unit>(p, (size_t)blockIdx.x * blockDim.x + threadIdx.x,
                                (size_t)gridDim.x * blockDim.x);
}

/* The kernel for a unit width of the plan. */
static const void *copy_kernel(int unit)
{
    switch (unit) {
    case 16: return (const void *)colld__cuda_copy_kernel<uint4>;
    case 8: return (const void *)colld__cuda_copy_kernel<uint2>;
    case 4: return (const void *)colld__cuda_copy_kernel<unsigned int>;
    case 2: return (const void *)colld__cuda_copy_kernel<unsigned short>;
    case 1: return (const void *)colld__cuda_copy_kernel<unsigned char>;
    default: return NULL;
    }
}

/* Public: see cuda_kernels.h. */
extern "C" colld_status_t colld_cuda_copy(const void *src, void *const *out, int n_out, size_t bytes,
                                          void *stream)
{
    colld__cuda_copy_params_t p;
    size_t work;
    colld_status_t st = colld__cuda_copy_plan(src, out, n_out, bytes, &p, &work);

    if (st != COLLD_OK || work == 0)
        return st;
    return colld__cuda_launch(copy_kernel(p.unit), &p, work, stream, "colld_cuda_copy");
}
