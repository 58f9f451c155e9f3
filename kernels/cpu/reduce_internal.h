/*
 * reduce_internal.h - internals shared by the CPU reduce kernels and their unit tests.
 *
 * The dtype and op lists below are the single source from which every kernel, every dispatch table
 * and every ISA build is generated (see reduce_core.h). The scalar half-precision conversions are
 * static inline so that each ISA file gets its own copy compiled for its own instruction set: no
 * function compiled with AVX can ever be shared with (and so called from) baseline code.
 */
#ifndef COLLD_KERNELS_CPU_REDUCE_INTERNAL_H
#define COLLD_KERNELS_CPU_REDUCE_INTERNAL_H

#include "kernels/cpu/reduce.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The dtypes: X(enum, name, storage type T, accumulator type A, wrapping arithmetic type U,
 * avg division type W, kind). Kinds: INT (two's complement, wraps through U), FLT (IEEE float in
 * its own precision), HALF and BF16 (16-bit storage, accumulated in float, rounded once on write).
 * W for 8- and 32-bit integers is double: a double division of two such integers truncates to
 * exactly the integer quotient (the rounding error is below 1/n_in), and it vectorises. */
#define COLLD_REDUCE_DTYPES(X)                                                                     \
    X(COLLD_INT8, int8, int8_t, int8_t, uint8_t, double, INT)                                      \
    X(COLLD_UINT8, uint8, uint8_t, uint8_t, uint8_t, double, INT)                                  \
    X(COLLD_INT32, int32, int32_t, int32_t, uint32_t, double, INT)                                 \
    X(COLLD_UINT32, uint32, uint32_t, uint32_t, uint32_t, double, INT)                             \
    X(COLLD_INT64, int64, int64_t, int64_t, uint64_t, int64_t, INT)                                \
    X(COLLD_UINT64, uint64, uint64_t, uint64_t, uint64_t, uint64_t, INT)                           \
    X(COLLD_FLOAT16, float16, uint16_t, float, float, float, HALF)                                 \
    X(COLLD_BFLOAT16, bfloat16, uint16_t, float, float, float, BF16)                               \
    X(COLLD_FLOAT32, float32, float, float, float, float, FLT)                                     \
    X(COLLD_FLOAT64, float64, double, double, double, double, FLT)

/* The premultiplied sum (colld_redop_create_premul_sum): the one op whose kernels take an argument,
 * a scalar per input. It is no colld_redop_t value (an application names it by a handle of its
 * communicator); its number follows the API's ops, and the wire carries the same number
 * (COLLD_REDOP_PREMUL_SUM in proto/wire.h). COLLD__REDOPS counts every op the kernels have. */
#define COLLD__REDOP_PREMUL_SUM COLLD_REDOP_COUNT
#define COLLD__REDOPS (COLLD_REDOP_COUNT + 1)

/* The ops: X(arg, enum, name); arg is passed through so that a dtype expansion can nest it. */
#define COLLD_REDUCE_OPS(X, arg)                                                                   \
    X(arg, COLLD_SUM, sum)                                                                         \
    X(arg, COLLD_PROD, prod)                                                                       \
    X(arg, COLLD_MIN, min)                                                                         \
    X(arg, COLLD_MAX, max)                                                                         \
    X(arg, COLLD_AVG, avg)                                                                         \
    X(arg, COLLD__REDOP_PREMUL_SUM, premul_sum)

/* Elements per block: the accumulator of one block stays in L1 (at most 8 KiB for float64). */
#define COLLD__REDUCE_BLOCK 1024

/* One kernel: validated arguments, count > 0, n_out > 0. `scalars` (premul_sum only, else NULL):
 * n_in scalar words (colld_cpu_reduce_premul). */
typedef void (*colld__reduce_fn_t)(const void *const *in, const uint64_t *scalars, int n_in,
                                   void *const *out, int n_out, size_t count);

typedef enum {
    COLLD__ISA_SCALAR = 0,
    COLLD__ISA_AVX2 = 1,
    COLLD__ISA_AVX512 = 2
} colld__isa_t;

/* One ISA build of the whole family: its kernels and its block conversions for float16 (exposed
 * so that tests can compare them with the scalar conversions over every input). */
typedef struct {
    const char *name;
    colld__isa_t isa;
    colld__reduce_fn_t table[COLLD_DTYPE_COUNT][COLLD__REDOPS];
    void (*half_to_float_block)(float *dst, const uint16_t *src, size_t n);
    void (*float_to_half_block)(uint16_t *dst, const float *src, size_t n);
} colld__reduce_impl_t;

extern const colld__reduce_impl_t colld__reduce_impl_scalar;
extern const colld__reduce_impl_t colld__reduce_impl_avx2;
extern const colld__reduce_impl_t colld__reduce_impl_avx512;

/* The ISA builds compiled into this library that this CPU can run, best first, scalar last. */
size_t colld__reduce_impls(const colld__reduce_impl_t **impls, size_t max);

/* colld_cpu_reduce with a given implementation (argument checks included). */
colld_status_t colld__reduce_with(const colld__reduce_impl_t *impl, colld_dtype_t dtype,
                                  colld_redop_t op, const void *const *in, int n_in,
                                  void *const *out, int n_out, size_t count);

/* colld_cpu_reduce_premul with a given implementation (argument checks included). */
colld_status_t colld__reduce_premul_with(const colld__reduce_impl_t *impl, colld_dtype_t dtype,
                                         const uint64_t *scalars, const void *const *in, int n_in,
                                         void *const *out, int n_out, size_t count);

/* Reinterpret the bits of a float as an integer, without aliasing problems. */
static inline uint32_t colld__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Reinterpret an integer as the bits of a float. */
static inline float colld__f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* IEEE binary16 to float, exact. Subnormals are normalised; a NaN keeps its sign and payload and
 * becomes quiet, as the F16C instruction VCVTPH2PS does, so both paths agree bit for bit. */
static inline float colld__half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1f)
        return colld__f32_from_bits(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0));
    if (exp == 0) {
        /* Zero or subnormal: mant * 2^-24 is exact in float (and never subnormal there). */
        float v = (float)mant * 0x1p-24f;
        return colld__f32_from_bits(sign | colld__f32_bits(v));
    }
    return colld__f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* float to IEEE binary16, rounding to nearest even; overflow gives infinity, a NaN gives a quiet
 * NaN with the top payload bits (as VCVTPS2PH does). Works on the bits, so it does not depend on
 * the floating-point environment. */
static inline uint16_t colld__float_to_half(float f)
{
    uint32_t bits = colld__f32_bits(f);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t abs = bits & 0x7fffffffu;

    if (abs > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    if (abs >= 0x477ff000u) /* >= 65520 (halfway above the largest half, 65504): infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (abs >= 0x38800000u) { /* >= 2^-14: normal half; the carry may ripple into the exponent */
        uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
        return (uint16_t)(sign | ((r - (112u << 23)) >> 13));
    }
    if (abs <= 0x33000000u) /* <= 2^-25: rounds to zero (2^-25 itself is a tie, to even 0) */
        return sign;
    /* Subnormal half: the result counts units of 2^-24. */
    uint32_t e = abs >> 23; /* 102 .. 112 */
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14 .. 24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

/* bfloat16 to float: the upper half of a float, exact (a NaN stays NaN, its bits unchanged). */
static inline float colld__bf16_to_float(uint16_t b)
{
    return colld__f32_from_bits((uint32_t)b << 16);
}

/* float to bfloat16, rounding to nearest even; a NaN becomes a quiet NaN (plain rounding could
 * turn a NaN with only low payload bits into infinity). */
static inline uint16_t colld__float_to_bf16(float f)
{
    uint32_t bits = colld__f32_bits(f);

    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x0040u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

#endif /* COLLD_KERNELS_CPU_REDUCE_INTERNAL_H */
