/*
 * torch_colld_cuda.cpp - torch_colld's CUDA stream and event calls (torch_colld_cuda.h), through
 * torch's c10::cuda (libc10_cuda) and the CUDA runtime torch loads. Built only with
 * -DCOLLD_TORCH_CUDA=ON; compiled here against the wheel's CUDA 13.0 headers (docs/torch.md).
 */
#include "torch_colld_cuda.h"

#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <cuda_runtime_api.h>

namespace torch_colld
{

namespace
{

/* A c10 CUDA event (timing disabled) recorded on the current stream of its device when made. */
class EventFence final : public StreamFence
{
  public:
    explicit EventFence(c10::DeviceIndex device) : device_(device)
    {
        event_.record(c10::cuda::getCurrentCUDAStream(device_));
    }

    void block_current() override
    {
        event_.block(c10::cuda::getCurrentCUDAStream(device_));
    }

    bool query() override
    {
        return event_.query();
    }

    void synchronize() override
    {
        event_.synchronize();
    }

  private:
    c10::DeviceIndex device_;
    c10::cuda::CUDAEvent event_;
};

} // namespace

void *current_stream(c10::Device d)
{
    return c10::cuda::getCurrentCUDAStream(d.index()).stream();
}

std::string make_current(c10::Device d)
{
    /* cudaSetDevice itself, not c10's SetDevice: that skips the call when cudaGetDevice already
     * says d, which it does on a fresh thread that has no current context yet (CUDA >= 12 makes
     * the primary context current in cudaSetDevice). */
    cudaError_t e = cudaSetDevice(d.index());
    return e == cudaSuccess ? std::string() : std::string("cudaSetDevice(") + std::to_string(d.index()) + "): " +
                                                  cudaGetErrorString(e);
}

std::unique_ptr<StreamFence> record_fence(c10::Device d)
{
    return std::make_unique<EventFence>(d.index());
}

} // namespace torch_colld
