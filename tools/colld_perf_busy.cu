/*
 * colld_perf_busy.cu - colld-perf's busy kernel for the overlap measurement (--overlap, GPU mode):
 * the application's compute that a collective should overlap with. Every thread spins on the SM's
 * clock for `cycles` cycles: it occupies its blocks' SMs for a known time without touching memory.
 */
#include <cuda_runtime.h>

extern "C" __global__ void colld_perf_busy_kernel(long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

/* Launch the busy kernel: `blocks` blocks of 128 threads on `stream` (a cudaStream_t). */
extern "C" cudaError_t colld_perf_busy_launch(void *stream, int blocks, long long cycles)
{
    colld_perf_busy_kernel<<<blocks, 128, 0, (cudaStream_t)stream>>>(cycles);
    return cudaGetLastError();
}
