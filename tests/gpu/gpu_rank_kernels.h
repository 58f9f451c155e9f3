/*
 * gpu_rank_kernels.h - the small kernels of colld-test-gpu-rank (gpu_rank.c): the work an
 * application puts on its stream around a stream-ordered collective. Plain C launchers; a stream
 * is a cudaStream_t passed as void *. Each returns the cudaError_t of its launch as an int
 * (0 = cudaSuccess); completion is observed on the stream.
 */
#ifndef COLLD_TESTS_GPU_GPU_RANK_KERNELS_H
#define COLLD_TESTS_GPU_GPU_RANK_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The producer's value of element i of rank r's input in iteration `iter`: an integer -2..2 as a
 * float, so that every sum over up to 64 ranks is exact in any order. The same expression on the
 * host (the expected results) and on the device (the producer kernel). */
#define GPU_RANK_VALUE(r, iter, salt, i)                                                            \
    ((float)((int)(((size_t)(i) * 7u + (size_t)(r) * 13u + (size_t)(iter) * 5u + (size_t)(salt)) % 5u) - 2))

/* The consumer's transform of an all-reduce result y: 2y + 1 (exact for the sums above). */
#define GPU_RANK_CONSUME(y) (2.0f * (y) + 1.0f)

/* One thread that spins for `ms` milliseconds of the GPU's global timer (%globaltimer, wall-clock
 * nanoseconds, so the time does not depend on the clock rate), then ends: a slow producer. */
int gpu_rank_spin(double ms, void *stream);

/* x[i] = GPU_RANK_VALUE(rank, iter, salt, i) for i < n. */
int gpu_rank_produce(float *x, size_t n, int rank, int iter, unsigned salt, void *stream);

/* z[i] = GPU_RANK_CONSUME(y[i]) for i < n. */
int gpu_rank_consume(const float *y, float *z, size_t n, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* COLLD_TESTS_GPU_GPU_RANK_KERNELS_H */
