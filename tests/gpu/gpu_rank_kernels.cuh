/*
 * gpu_rank_kernels.cuh - the bodies of colld-test-gpu-rank's kernels (gpu_rank_kernels.h), written
 * once as __host__ __device__ functions: the device kernels (gpu_rank_kernels.cu) run them on a GPU,
 * the CUDA driver test double's host builds (tests/cudafake/kernels.cpp) on the CPU, thread by
 * thread over the launch's grid. `tid` is the thread's index in the grid, `nthreads` the grid's size.
 * Compiled by nvcc (device) and by the host C++ compiler (the double), where __host__ __device__
 * come from the toolkit's headers.
 */
#ifndef COLLD_TESTS_GPU_GPU_RANK_KERNELS_CUH
#define COLLD_TESTS_GPU_GPU_RANK_KERNELS_CUH

#include "tests/gpu/gpu_rank_kernels.h"
/* colld__ho_load and colld__ho_store: an acquire load and a release store of a word another block
 * writes or reads (system scope on the device; the host's atomics in the double's host build). */
#include "kernels/cuda/handoff.cuh"

#include <vector_types.h> /* __host__, __device__ (as kernels/cuda/cuda_core.cuh; no runtime call) */

#ifndef __CUDA_ARCH__
#include <ctime>
#endif

#define GPU_RANK_HD __host__ __device__ inline

/* Wall-clock nanoseconds: the GPU's global timer on the device, CLOCK_MONOTONIC on the host. */
GPU_RANK_HD unsigned long long gpu_rank_now_ns()
{
#ifdef __CUDA_ARCH__
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
#endif
}

GPU_RANK_HD void gpu_rank_spin_body(const gpu_rank_spin_params_t p, size_t tid, size_t nthreads)
{
    (void)nthreads;
    if (tid != 0)
        return;
    unsigned long long t0 = gpu_rank_now_ns();
    while (gpu_rank_now_ns() - t0 < p.ns) {
    }
}

GPU_RANK_HD void gpu_rank_produce_body(const gpu_rank_produce_params_t p, size_t tid, size_t nthreads)
{
    for (size_t i = tid; i < p.n; i += nthreads)
        p.x[i] = GPU_RANK_VALUE(p.rank, p.iter, p.salt, i);
}

GPU_RANK_HD void gpu_rank_consume_body(const gpu_rank_consume_params_t p, size_t tid, size_t nthreads)
{
    for (size_t i = tid; i < p.n; i += nthreads)
        p.z[i] = GPU_RANK_CONSUME(p.y[i]);
}

/* One thread per block: tid is the block (gpu_rank_kernels.h). */
GPU_RANK_HD void gpu_rank_chain_body(const gpu_rank_chain_params_t p, size_t tid, size_t nthreads)
{
    (void)nthreads;
    int b = (int)tid;
    if (b >= p.n)
        return;
    if (b < p.n - 1) {
        unsigned long long t0 = gpu_rank_now_ns();
        while (!colld__ho_load(&p.word[b + 1]))
            if (gpu_rank_now_ns() - t0 > p.timeout_ns) {
                colld__ho_store(&p.result[b], 2);
                return;
            }
    }
    colld__ho_store(&p.word[b], 1);
    colld__ho_store(&p.result[b], 1);
}

#endif /* COLLD_TESTS_GPU_GPU_RANK_KERNELS_CUH */
