/*
 * cuda_kernels.h - the CUDA kernels of the daemon, behind plain C launchers.
 *
 * Includers need no CUDA header: a stream is passed as `void *` (a cudaStream_t; NULL is the legacy
 * default stream). Every launcher is asynchronous: it checks its arguments, launches one kernel on
 * the stream of the current device (cudaSetDevice) and returns; completion is observed on the
 * stream. The memory behind the pointers may be on the current GPU, on another GPU reachable by
 * peer access (P2P/NVLink), IPC- or VMM-mapped, or pinned/mapped host memory: anything the current
 * device can load from and store to. Each pointer must stay valid until the kernel completes.
 *
 * Semantics of colld_cuda_reduce are those of the CPU kernels (kernels/cpu/reduce.h), bitwise:
 * element i of every input is read in rank order 0..n_in-1 and combined, the result is written to
 * element i of every output. Integer arithmetic wraps; integer avg is the wrapped sum (in the element
 * type) divided by n_in truncating toward zero; float16 and bfloat16 are accumulated in float over
 * all inputs and rounded once to nearest even; float avg is sum / n_in in the accumulator precision;
 * min/max return the first NaN in rank order, and between equal values (+0 and -0) the later rank.
 * No FMA contraction, IEEE division, no flush of subnormals. The one difference from the CPU: the
 * payload (bits) of a NaN that arithmetic produces (a NaN summed or multiplied, inf - inf, 0 * inf)
 * may differ, as it does between CPU architectures; it is a NaN on both. Results are deterministic:
 * the same inputs give the same bits on every run, whatever the grid size.
 *
 * Errors: COLLD_ERR_INVALID_ARGUMENT for a bad dtype/op, a rank count out of range, a NULL
 * pointer, a pointer not aligned to its element size, a size that overflows, or an output that
 * overlaps an input or another output without being the very same buffer; COLLD_ERR_DEVICE when
 * CUDA refuses the launch (no device, no kernel image for this GPU, a sticky error from an earlier
 * fault in the context, ...). Nothing is launched when a call fails. colld_cuda_last_error() then
 * says why in words.
 *
 * How the collectives of one node map onto launches (one per GPU g of N ranks, no batching needed):
 *   all-reduce      reduce(in = every rank's sendbuf + slice_g, out = every rank's recvbuf + slice_g)
 *   reduce          reduce(in = every rank's sendbuf + slice_g, out = root's recvbuf + slice_g)
 *   reduce-scatter  reduce(in = every rank's sendbuf + g * recvcount, out = rank g's recvbuf)
 *   broadcast       copy(src = root's sendbuf + slice_g, out = every rank's recvbuf + slice_g)
 *   all-gather      copy(src = rank g's sendbuf, out = every rank's recvbuf + g * sendcount)
 * In place (sendbuf == recvbuf, or the rank's slice of it) needs nothing special in any of them.
 */
#ifndef COLLD_KERNELS_CUDA_CUDA_KERNELS_H
#define COLLD_KERNELS_CUDA_CUDA_KERNELS_H

#include <colld/colld.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most inputs, and the most outputs, of one launch (the pointers travel by value in the
 * kernel's parameters). */
#define COLLD_CUDA_MAX_RANKS 64

/* Reduce n_in inputs into n_out outputs over `count` elements of dtype with op, in one kernel
 * launched on `stream`. 1 <= n_in <= COLLD_CUDA_MAX_RANKS, 0 <= n_out <= COLLD_CUDA_MAX_RANKS.
 * An output may be the very same buffer as an input (in-place: every element is read from every
 * input before the same thread writes it), and two outputs may be the same buffer; no other overlap
 * is allowed. With count == 0 or n_out == 0 nothing is launched (and the pointers are not checked).
 *
 * Used for all-reduce (every rank's buffer in, every rank's buffer out, per GPU over a slice by
 * offsetting the pointers), reduce (n_out = 1) and each rank's step of reduce-scatter. Fast path:
 * when every pointer has the same address modulo 16, all but at most 15 bytes at each end are moved
 * in 16-byte vectors; otherwise one element at a time (still coalesced, but slower). */
colld_status_t colld_cuda_reduce(colld_dtype_t dtype, colld_redop_t op, const void *const *in, int n_in,
                                 void *const *out, int n_out, size_t count, void *stream);

/* Copy `bytes` bytes from src to each of n_out outputs, in one kernel launched on `stream`.
 * 0 <= n_out <= COLLD_CUDA_MAX_RANKS. An output equal to src is skipped (nothing to do); outputs may
 * repeat; no other overlap is allowed. With bytes == 0 or n_out == 0 nothing is launched. Used for
 * broadcast and all-gather pieces. Moves 16, 8, 4, 2 or 1 bytes at a time: the widest unit for which
 * every pointer has the same address modulo the unit. */
colld_status_t colld_cuda_copy(const void *src, void *const *out, int n_out, size_t bytes, void *stream);

/* The number of CUDA devices this process can use; 0 (not an error) when there is no GPU or no
 * usable driver, and colld_cuda_last_error() then says why. */
int colld_cuda_device_count(void);

/* What the last failing call of this module on this thread went wrong with, in words (which
 * argument, or the CUDA error name and message with what to do next); "" when none failed yet.
 * Valid until the next call of this module on the same thread. */
const char *colld_cuda_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* COLLD_KERNELS_CUDA_CUDA_KERNELS_H */
