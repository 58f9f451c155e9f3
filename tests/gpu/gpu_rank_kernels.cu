/*
 * gpu_rank_kernels.cu - see gpu_rank_kernels.h.
 */
#include "tests/gpu/gpu_rank_kernels.h"

#include <cuda_runtime.h>

namespace {

__device__ unsigned long long global_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void spin_kernel(unsigned long long ns)
{
    unsigned long long t0 = global_ns();
    while (global_ns() - t0 < ns) {
    }
}

__global__ void produce_kernel(float *x, size_t n, int rank, int iter, unsigned salt)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = GPU_RANK_VALUE(rank, iter, salt, i);
}

__global__ void consume_kernel(const float *y, float *z, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        z[i] = GPU_RANK_CONSUME(y[i]);
}

/* A grid that covers n elements with 256 threads per block, at most 1024 blocks (grid-stride). */
unsigned blocks_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return b == 0 ? 1u : b > 1024 ? 1024u : (unsigned)b;
}

} // namespace

extern "C" int gpu_rank_spin(double ms, void *stream)
{
    spin_kernel<<<1, 1, 0, (cudaStream_t)stream>>>((unsigned long long)(ms * 1e6));
    return (int)cudaGetLastError();
}

extern "C" int gpu_rank_produce(float *x, size_t n, int rank, int iter, unsigned salt, void *stream)
{
    if (n == 0)
        return 0;
    produce_kernel<<<blocks_for(n), 256, 0, (cudaStream_t)stream>>>(x, n, rank, iter, salt);
    return (int)cudaGetLastError();
}

extern "C" int gpu_rank_consume(const float *y, float *z, size_t n, void *stream)
{
    if (n == 0)
        return 0;
    consume_kernel<<<blocks_for(n), 256, 0, (cudaStream_t)stream>>>(y, z, n);
    return (int)cudaGetLastError();
}
