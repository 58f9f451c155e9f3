/*
 * reduce.h - CPU reduction kernels: one generic core instantiated for every dtype x op.
 *
 * A multi-input kernel reads element i of every input in rank order (0, 1, ..., n_in-1), combines
 * them, and writes the result to element i of every output. Inputs and outputs may alias each
 * other (in-place collectives): every block of elements is read completely before it is written.
 * Results are deterministic and identical between the dispatched (SIMD) and scalar versions:
 * bitwise the same for every dtype, op, count and alignment.
 *
 * Semantics (as NCCL): sum, prod, min, max; avg = sum / n_in (integers truncate toward zero); the
 * premultiplied sum (colld_cpu_reduce_premul) = sum of scalar_r * in_r.
 * Integer arithmetic wraps (two's complement). float16 and bfloat16 are accumulated in float over
 * all inputs and rounded once (round to nearest even) when written. For min/max on floats a NaN
 * input gives NaN.
 *
 * Details of this implementation: integer avg divides the wrapped sum (read in the element type) by
 * n_in; float avg is sum / n_in in the accumulator precision (float for float16/bfloat16, then
 * rounded once); min/max return the first NaN in rank order. Every pointer must be aligned to its
 * element size. An output may be the very same buffer as an input, but buffers must not otherwise
 * overlap.
 */
#ifndef COLLD_KERNELS_CPU_REDUCE_H
#define COLLD_KERNELS_CPU_REDUCE_H

#include <colld/colld.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Reduce n_in inputs into n_out outputs over `count` elements, using the best implementation for
 * this CPU (chosen once at first use). n_in >= 1, n_out >= 0. Returns COLLD_OK, or
 * COLLD_ERR_INVALID_ARGUMENT for an unknown dtype/op or n_in < 1. */
colld_status_t colld_cpu_reduce(colld_dtype_t dtype, colld_redop_t op, const void *const *in, int n_in,
                                void *const *out, int n_out, size_t count);

/* The same, always the portable scalar code: the test oracle. */
colld_status_t colld_cpu_reduce_scalar(colld_dtype_t dtype, colld_redop_t op, const void *const *in, int n_in,
                                       void *const *out, int n_out, size_t count);

/* The premultiplied sum (colld_redop_create_premul_sum): out = sum over r = 0..n_in-1, in that
 * order, of scalars[r] * in[r], with the arguments, aliasing rules and determinism of
 * colld_cpu_reduce. scalars[r] is a scalar word: a uint64_t whose first bytes (memcpy) hold one
 * value of dtype, the rest zero (the form NCCL passes its scalar in, and colld's wire). Precision:
 * integers multiply and add wrapping in their width; float32 and float64 round the product and
 * then the sum in their own precision (no FMA); float16 and bfloat16 multiply in float (exact: two
 * 11- or 8-bit significands), sum in float and round once when written, as their sum does. */
colld_status_t colld_cpu_reduce_premul(colld_dtype_t dtype, const uint64_t *scalars, const void *const *in, int n_in,
                                       void *const *out, int n_out, size_t count);

/* The same, always the portable scalar code: the test oracle. */
colld_status_t colld_cpu_reduce_premul_scalar(colld_dtype_t dtype, const uint64_t *scalars, const void *const *in,
                                              int n_in, void *const *out, int n_out, size_t count);

/* Whether `word` is a valid scalar word of dtype (its bytes past one element are zero). */
bool colld_cpu_scalar_word_ok(colld_dtype_t dtype, uint64_t word);

/* Divide `count` sums by `divisor` in place, exactly as the avg of colld_cpu_reduce divides its sum
 * (integers truncate toward zero; float16/bfloat16 divide in float and round once): the last step
 * of an average whose sum was reduced in stages (across hosts). */
colld_status_t colld_cpu_avg_finish(colld_dtype_t dtype, void *buf, size_t count, int divisor);

/* Name of the implementation colld_cpu_reduce uses on this CPU ("avx512", "avx2", "scalar"). */
const char *colld_cpu_reduce_impl(void);

/* Conversions used by the kernels and by tests (round to nearest even; NaN stays NaN). */
/* The index of the first NaN or infinity among count elements of a floating-point dtype; count
 * when there is none (always for integer dtypes). */
size_t colld_cpu_first_nonfinite(colld_dtype_t dtype, const void *buf, size_t count);
/* "NaN", "+Inf" or "-Inf" for a non-finite element of dtype. */
const char *colld_cpu_nonfinite_name(colld_dtype_t dtype, const void *elem);

float colld_half_to_float(uint16_t h);
uint16_t colld_float_to_half(float f);
float colld_bf16_to_float(uint16_t b);
uint16_t colld_float_to_bf16(float f);

#endif /* COLLD_KERNELS_CPU_REDUCE_H */
