/*
 * gpu_rank_kernels.cu - colld-test-gpu-rank's kernels (gpu_rank_kernels.h) as device code: extern
 * "C" entry points over the bodies of gpu_rank_kernels.cuh, compiled into a fatbin of their own
 * (tests/gpu/CMakeLists.txt), never linked into a program: the rank loads the fatbin through the
 * driver API.
 */
#include "tests/gpu/gpu_rank_kernels.cuh"

#define GPU_RANK_TID() (blockIdx.x * (size_t)blockDim.x + threadIdx.x)
#define GPU_RANK_NTHREADS() ((size_t)gridDim.x * blockDim.x)

extern "C" __global__ void GPU_RANK_SPIN_KERNEL(const gpu_rank_spin_params_t p)
{
    gpu_rank_spin_body(p, GPU_RANK_TID(), GPU_RANK_NTHREADS());
}

extern "C" __global__ void GPU_RANK_PRODUCE_KERNEL(const gpu_rank_produce_params_t p)
{
    gpu_rank_produce_body(p, GPU_RANK_TID(), GPU_RANK_NTHREADS());
}

extern "C" __global__ void GPU_RANK_CONSUME_KERNEL(const gpu_rank_consume_params_t p)
{
    gpu_rank_consume_body(p, GPU_RANK_TID(), GPU_RANK_NTHREADS());
}

extern "C" __global__ void GPU_RANK_CHAIN_KERNEL(const gpu_rank_chain_params_t p)
{
    gpu_rank_chain_body(p, blockIdx.x, gridDim.x); /* one thread per block */
}
