/*
 * handoff.cu - the hand-off kernels (issue 28 item 1): the wait on every rank's ready slot, one
 * block of one thread per rank, and the done writes, one thread. Device code only: part of the
 * fatbin the daemon embeds (see reduce.cu); the bodies are handoff.cuh's.
 */
#include "kernels/cuda/handoff.cuh"

extern "C" __global__ void COLLD__CUDA_WAIT_KERNEL(const __grid_constant__ colld__cuda_wait_params_t p)
{
    colld__cuda_wait_body(p, blockIdx.x);
}

extern "C" __global__ void COLLD__CUDA_DONE_KERNEL(const __grid_constant__ colld__cuda_done_params_t p)
{
    colld__cuda_done_body(p, (size_t)blockIdx.x * blockDim.x + threadIdx.x);
}
