/*
 * handoff.cu - the hand-off kernels (issue 28 item 1): the gate behind the stream waits on every
 * rank's ready slot, and the done writes, one thread each. Device code only: part of the fatbin
 * the daemon embeds (see reduce.cu); the bodies are handoff.cuh's.
 */
#include "kernels/cuda/handoff.cuh"

extern "C" __global__ void COLLD__CUDA_GATE_KERNEL(const __grid_constant__ colld__cuda_gate_params_t p)
{
    colld__cuda_gate_body(p, (size_t)blockIdx.x * blockDim.x + threadIdx.x);
}

extern "C" __global__ void COLLD__CUDA_DONE_KERNEL(const __grid_constant__ colld__cuda_done_params_t p)
{
    colld__cuda_done_body(p, (size_t)blockIdx.x * blockDim.x + threadIdx.x);
}
