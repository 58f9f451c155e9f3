/*
 * pattern.h - deterministic test inputs per (dtype, rank, salt).
 */
#ifndef COLLD_KERNELS_CPU_PATTERN_H
#define COLLD_KERNELS_CPU_PATTERN_H

#include <colld/colld.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Write elements [first, first+n) of rank `rank`'s input for (dtype, salt) into out. Values are
 * modest (small integers, floats of a few units with inexact fractions) so that sums, products and
 * averages are interesting: float results depend on the order, integers may wrap, float16
 * products may overflow to inf; the scalar oracle defines every answer. */
void colld_cpu_pattern(colld_dtype_t dt, int rank, unsigned salt, size_t first, size_t n, void *out);

/* The same for inputs whose every reduction is exact in every dtype (integers -2..2, 0..4 for
 * unsigned types, for up to 8 ranks): any order of combining gives bitwise the same result, so a
 * hierarchical (multi-node) reduction can be checked against the rank-order oracle. */
void colld_cpu_pattern_small(colld_dtype_t dt, int rank, unsigned salt, size_t first, size_t n, void *out);

/* A premultiplied-sum scalar for rank `rank` (colld_redop_create_premul_sum) as a scalar word (a
 * uint64_t whose first bytes hold one value of dt, the rest zero): different per rank and salt,
 * never zero, of either sign where the dtype has one. Floats are inexact fractions (so products
 * round), integers small enough to wrap only the 8-bit sums. With `small`, values whose products
 * with colld_cpu_pattern_small's inputs, and their sums, are exact (-2, -1, 1, 2; 1..3 unsigned). */
uint64_t colld_cpu_pattern_scalar(colld_dtype_t dt, int rank, unsigned salt, bool small);

#endif /* COLLD_KERNELS_CPU_PATTERN_H */
