/*
 * torch_colld_cuda.h - the CUDA runtime calls of torch_colld's stream-ordered path (CUDA tensors),
 * built only with -DCOLLD_TORCH_CUDA=ON: torch_colld_cuda.cpp, the one file that includes CUDA
 * headers; torch_colld.cpp reaches the CUDA runtime only through these.
 */
#ifndef COLLD_TORCH_COLLD_CUDA_H
#define COLLD_TORCH_COLLD_CUDA_H

#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace torch_colld
{

/* An event recorded on a CUDA stream after an operation (a c10d Work's view of it). */
class StreamFence
{
  public:
    virtual ~StreamFence() = default;
    /* The calling thread's current stream of the fence's device waits for the event. */
    virtual void block_current() = 0;
    /* Whether the GPU has passed the event. */
    virtual bool query() = 0;
    /* The host waits for the event. */
    virtual void synchronize() = 0;
};

/* The calling thread's current CUDA stream of device d (torch's), as a cudaStream_t. */
void *current_stream(c10::Device d);

/* Make device d's primary context current on the calling thread (the worker that issues the
 * caller's operations: NULL, torch's default stream, is the legacy stream of the thread's current
 * context, and libcolld's stream calls need one). The error text, empty if none. */
std::string make_current(c10::Device d);

/* An event recorded now on the calling thread's current stream of device d. */
std::unique_ptr<StreamFence> record_fence(c10::Device d);

} // namespace torch_colld

#endif
