/*
 * reduce_scalar.c - the portable build of the reduce core: baseline instruction set only (on
 * x86-64 the compiler may still use SSE2, which every x86-64 CPU has). It is the fallback on every
 * CPU and the oracle the tests compare the SIMD builds with.
 */
#include "kernels/cpu/reduce_internal.h"

#define COLLD_ISA scalar
#define COLLD_ISA_ID COLLD__ISA_SCALAR

/* Widen a block of float16 with the scalar conversion. */
static void isa_half_to_float_block(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = colld__half_to_float(src[i]);
}

/* Round a block of float to float16 with the scalar conversion. */
static void isa_float_to_half_block(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = colld__float_to_half(src[i]);
}

#include "kernels/cpu/reduce_core.h"
