/*
 * cuda_kernels.h - the CUDA kernels of the daemon, behind plain C launchers.
 *
 * The kernels are compiled to a fatbin at build time (sm_80 and sm_90 code plus compute_90 PTX that
 * newer GPUs JIT-compile), embedded in the daemon, and loaded at run time through the CUDA driver
 * API that common/cudadrv.c loads (cuLibraryLoadData, context-independent): nothing here links the
 * CUDA runtime or the driver. colld_cuda_kernels_load() loads them once per process and checks every
 * GPU; a driver or a GPU that cannot run them is refused there, with the reason, never at a launch.
 *
 * Includers need no CUDA runtime header: a stream is passed as `void *` (a CUstream; NULL is the
 * legacy default stream). Every launcher is asynchronous: it checks its arguments, launches one
 * kernel on the stream in the CUDA context current on the calling thread (the stream must belong
 * to it) and returns; completion is observed on the stream. The memory behind the pointers may be
 * on the context's GPU, on another GPU reachable by peer access (P2P/NVLink), IPC- or VMM-mapped,
 * or pinned/mapped host memory: anything the current device can load from and store to. Each
 * pointer must stay valid until the kernel completes.
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
 * the kernels are not loaded or the driver refuses the launch (no current context, a stream of
 * another context, a sticky error from an earlier fault in the context, ...). Nothing is launched
 * when a call fails. colld_cuda_last_error() then says why in words, naming the driver call.
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

#ifndef __cplusplus
#include "common/cudadrv.h" /* C only: the kernels' C++ sources never see the driver table */
#endif

#include <colld/colld.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most inputs, and the most outputs, of one launch (the pointers travel by value in the
 * kernel's parameters). */
#define COLLD_CUDA_MAX_RANKS 64

/* The loaded kernels: the library, every kernel's handle, and the multiprocessor count of every GPU. */
typedef struct colld_cuda_kernels colld_cuda_kernels_t;

#if defined(COLLD_HAVE_CUDA) && !defined(__cplusplus)
/* Load the embedded fatbin through the driver table `cu` (cuLibraryLoadData; the library belongs
 * to no context), find every kernel (cuLibraryGetKernel) and get it into the context of each of
 * the n GPUs (ctx[i] on dev[i]: cuKernelGetFunction, so that an image the GPU cannot run fails
 * here). Refused, with the reason in err: a driver older than the CUDA version the fatbin was
 * built with needs (its major version for the GPUs it has code for, the exact version where the
 * PTX must be JIT-compiled), a GPU of a compute capability the fatbin has neither code nor PTX for,
 * or any failing driver call (named). Returns COLLD_OK with *out (colld_cuda_kernels_unload() it),
 * or COLLD_ERR_NOT_SUPPORTED / COLLD_ERR_DEVICE / COLLD_ERR_NO_MEMORY with nothing to unload. The
 * calling thread's current context is unchanged. */
colld_status_t colld_cuda_kernels_load(const colld_cu_t *cu, const CUcontext *ctx, const CUdevice *dev, int n,
                                       colld_cuda_kernels_t **out, char *err, size_t len);
/* Get every kernel into ctx, the context of the load's GPU i (cuKernelGetFunction): at load, and
 * again after that GPU's primary context was reset (the library survives a reset, the kernels'
 * modules in the context do not). COLLD_OK, or COLLD_ERR_DEVICE with the failing call in err. The
 * calling thread's current context is unchanged. */
colld_status_t colld_cuda_kernels_attach(const colld_cuda_kernels_t *k, CUcontext ctx, int i, char *err, size_t len);
#endif

/* Unload what colld_cuda_kernels_load() loaded (no launch of it may still be pending: synchronize
 * the contexts first). NULL is a no-op. */
void colld_cuda_kernels_unload(colld_cuda_kernels_t *k);

/* Reduce n_in inputs into n_out outputs over `count` elements of dtype with op, in one kernel
 * launched on `stream` of the current context. 1 <= n_in <= COLLD_CUDA_MAX_RANKS,
 * 0 <= n_out <= COLLD_CUDA_MAX_RANKS.
 * An output may be the very same buffer as an input (in-place: every element is read from every
 * input before the same thread writes it), and two outputs may be the same buffer; no other overlap
 * is allowed. With count == 0 or n_out == 0 nothing is launched (and the pointers are not checked).
 * The arguments are checked before `k` is used (k NULL: COLLD_ERR_DEVICE for a launch).
 *
 * Used for all-reduce (every rank's buffer in, every rank's buffer out, per GPU over a slice by
 * offsetting the pointers), reduce (n_out = 1) and each rank's step of reduce-scatter. Fast path:
 * when every pointer has the same address modulo 16, all but at most 15 bytes at each end are moved
 * in 16-byte vectors; otherwise one element at a time (still coalesced, but slower). */
colld_status_t colld_cuda_reduce(const colld_cuda_kernels_t *k, colld_dtype_t dtype, colld_redop_t op,
                                 const void *const *in, int n_in, void *const *out, int n_out, size_t count,
                                 void *stream);

/* The premultiplied sum: as colld_cuda_reduce, with out = sum over r in rank order of
 * scalars[r] * in[r] (the semantics and precision of colld_cpu_reduce_premul, kernels/cpu/reduce.h,
 * bitwise). scalars: n_in scalar words (a uint64_t whose first bytes hold one value of dtype),
 * passed by value in the kernel's parameters, so the array need not outlive the call. */
colld_status_t colld_cuda_reduce_premul(const colld_cuda_kernels_t *k, colld_dtype_t dtype, const uint64_t *scalars,
                                        const void *const *in, int n_in, void *const *out, int n_out, size_t count,
                                        void *stream);

/* --nan-check (the daemon's option) of a reduce launch: before it reads element i of input r the
 * kernel looks at its exponent bits (as the CPU's colld_cpu_first_nonfinite), and the first NaN or
 * infinity of each input lowers that input's word with atomicMin to COLLD_CUDA_NAN_WORD(base + i,
 * class): the word keeps the lowest index, and says NaN, +Inf or -Inf. Only floating-point dtypes
 * are looked at (integers: compiled out); without a check (NULL) the kernels test one uniform
 * parameter and nothing else. first_bad: n_in words the launch's GPU can write atomically (host
 * memory mapped for the GPU, or its own memory), each COLLD_CUDA_NAN_NONE before the launch; read
 * them once the kernel has completed. Launches of one collective over slices of it share the words
 * when they run on the same GPU; launches on different GPUs need words of their own (atomics on
 * mapped host memory are atomic only among one GPU's threads). */
typedef struct {
    unsigned long long *first_bad; /* [n_in] */
    uint64_t base;                 /* the collective's index of the launch's element 0 */
} colld_cuda_nan_check_t;

enum { COLLD_CUDA_NAN = 0, COLLD_CUDA_PINF = 1, COLLD_CUDA_NINF = 2 };
#define COLLD_CUDA_NAN_NONE (~0ull)
#define COLLD_CUDA_NAN_WORD(index, cls) (((unsigned long long)(index) << 2) | (unsigned long long)(cls))
#define COLLD_CUDA_NAN_INDEX(word) ((uint64_t)((word) >> 2))
#define COLLD_CUDA_NAN_CLASS(word) ((int)((word)&3u))

/* colld_cuda_reduce (scalars NULL) or colld_cuda_reduce_premul (scalars set; op ignored) with
 * --nan-check: `check` NULL is the plain launch. Same arguments, errors and semantics; the
 * results are those of the plain kernels, bitwise (the check only reads). */
colld_status_t colld_cuda_reduce_checked(const colld_cuda_kernels_t *k, colld_dtype_t dtype, colld_redop_t op,
                                         const uint64_t *scalars, const void *const *in, int n_in, void *const *out,
                                         int n_out, size_t count, const colld_cuda_nan_check_t *check, void *stream);

/* Copy `bytes` bytes from src to each of n_out outputs, in one kernel launched on `stream` of the
 * current context. 0 <= n_out <= COLLD_CUDA_MAX_RANKS. An output equal to src is skipped (nothing
 * to do); outputs may repeat; no other overlap is allowed. With bytes == 0 or n_out == 0 nothing is
 * launched. Used for broadcast and all-gather pieces. Moves 16, 8, 4, 2 or 1 bytes at a time: the
 * widest unit for which every pointer has the same address modulo the unit. */
colld_status_t colld_cuda_copy(const colld_cuda_kernels_t *k, const void *src, void *const *out, int n_out,
                               size_t bytes, void *stream);

/* The hand-off without the host (issue 28 item 1): a collective's kernels are queued as soon as it
 * matches, behind a stream memory wait on every rank's ready slot and a gate kernel, and followed
 * by a kernel that writes every rank's done word; the daemon's host threads stay out of the path.
 *
 * words: COLLD_CUDA_HANDOFF_WORDS words the GPU can read and write (host memory mapped for it, so
 * that the daemon reads the gate and writes the cancel word), zero before the waits are queued:
 *   [COLLD_CUDA_HANDOFF_CANCEL]  the daemon writes non-zero to abandon the collective
 *   [COLLD_CUDA_HANDOFF_ARRIVED] unused (the wait kernel's count before the stream waits)
 *   [COLLD_CUDA_HANDOFF_GATE]    COLLD_CUDA_GATE_GO once every rank arrived and no cancel was seen
 * colld_cuda_handoff_wait queues, on the stream (in the current context), one cuStreamWaitValue32
 * per rank (ready[r] == want[r]: not >=, since a slot marked taken holds ~want) and then a gate
 * kernel of one thread: unless the cancel word is set, it marks every slot taken (~want) and opens
 * the gate (a system-scope fence, then a release store). Nothing polls on the GPU while the ranks'
 * streams are behind: the waits sit in the stream's front-end, holding no multiprocessor. To
 * abandon the collective the daemon writes the cancel word, then each rank's awaited value into its
 * slot (unless it holds it already or is taken), so that the waits end and the gate stays shut
 * (cuda_handoff.c). The launches this thread makes after
 * colld_cuda_set_gate(gate) (until colld_cuda_set_gate(NULL)) do nothing unless the gate is GO.
 * colld_cuda_handoff_done launches one block of one thread: if the gate is GO, a system-scope fence,
 * then every rank's done word (a system-scope release store each). A cancelled collective (gate not
 * GO once the stream passed the done kernel) wrote nothing: the daemon releases the ranks' streams
 * with an error status. Device addresses throughout; n <= COLLD_CUDA_MAX_RANKS. */
enum { COLLD_CUDA_HANDOFF_CANCEL = 0, COLLD_CUDA_HANDOFF_ARRIVED = 1, COLLD_CUDA_HANDOFF_GATE = 2 };
#define COLLD_CUDA_HANDOFF_WORDS 4
#define COLLD_CUDA_GATE_GO 1u
typedef struct {
    uint32_t *ready[COLLD_CUDA_MAX_RANKS];
    uint32_t want[COLLD_CUDA_MAX_RANKS];
    uint32_t *done[COLLD_CUDA_MAX_RANKS];
    uint32_t done_value[COLLD_CUDA_MAX_RANKS];
    int n;
    uint32_t *words;
} colld_cuda_handoff_t;

/* The waits and the gate; the done writes. COLLD_OK, COLLD_ERR_INVALID_ARGUMENT or COLLD_ERR_DEVICE
 * (colld_cuda_last_error says what). */
colld_status_t colld_cuda_handoff_wait(const colld_cuda_kernels_t *k, const colld_cuda_handoff_t *h, void *stream);
colld_status_t colld_cuda_handoff_done(const colld_cuda_kernels_t *k, const colld_cuda_handoff_t *h, void *stream);
/* The gate the reduce and copy launches of this thread check from now on (NULL: none). */
void colld_cuda_set_gate(const uint32_t *gate);

/* What the last failing call of this module on this thread went wrong with, in words (which
 * argument, or the CUDA error name and message with what to do next); "" when none failed yet.
 * Valid until the next call of this module on the same thread. */
const char *colld_cuda_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* COLLD_KERNELS_CUDA_CUDA_KERNELS_H */
