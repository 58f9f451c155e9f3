/*
 * test_kernels.c - the CPU reduce kernels (kernels/cpu): half-precision conversions checked against
 * independent formulas, the scalar kernels checked against a straightforward per-element reference,
 * and every SIMD build this CPU can run checked bit for bit against the scalar build, over every
 * dtype x op x input count x element count x alignment, in place and out of place. The
 * premultiplied sum likewise, with a random scalar per input, and known answers for its rounding
 * and wrapping.
 */
#include "kernels/cpu/reduce_internal.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define MAX_IN 8
#define MAX_IMPLS 4
#define ALIGN_CASES 3
#define GUARD 128 /* bytes of slack around every buffer for the offsets */

static const int n_in_cases[] = { 1, 2, 3, 4, 8 };
static const size_t count_cases[] = { 0, 1, 7, 33, 1000, 4099 };

/* ---------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------- */

/* A deterministic xorshift64* generator, so that a failure can be reproduced. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* The next 64 random bits. */
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* Size in bytes of an element (the test's own table, independent of the library). */
static size_t esize(colld_dtype_t dt)
{
    switch (dt) {
    case COLLD_INT8:
    case COLLD_UINT8:
        return 1;
    case COLLD_FLOAT16:
    case COLLD_BFLOAT16:
        return 2;
    case COLLD_INT32:
    case COLLD_UINT32:
    case COLLD_FLOAT32:
        return 4;
    default:
        return 8;
    }
}

/* Whether dt is one of the integer dtypes. */
static int is_int(colld_dtype_t dt)
{
    return dt <= COLLD_UINT64;
}

/* Whether dt is a signed integer dtype. */
static int is_signed_int(colld_dtype_t dt)
{
    return dt == COLLD_INT8 || dt == COLLD_INT32 || dt == COLLD_INT64;
}

/* The bits of element i of a buffer of dtype dt, zero-extended. */
static uint64_t get_bits(colld_dtype_t dt, const void *p, size_t i)
{
    uint64_t v = 0;
    memcpy(&v, (const char *)p + i * esize(dt), esize(dt)); /* little-endian host */
    return v;
}

/* Store the low bits of v as element i of a buffer of dtype dt. */
static void put_bits(colld_dtype_t dt, void *p, size_t i, uint64_t v)
{
    memcpy((char *)p + i * esize(dt), &v, esize(dt));
}

/* The value of integer element i, sign-extended for signed dtypes. */
static int64_t get_int(colld_dtype_t dt, const void *p, size_t i)
{
    uint64_t v = get_bits(dt, p, i);
    unsigned bits = (unsigned)(8 * esize(dt));
    if (is_signed_int(dt) && bits < 64 && (v >> (bits - 1)) & 1)
        v |= ~0ull << bits;
    return (int64_t)v;
}

/* Mask of the bits of one element. */
static uint64_t emask(colld_dtype_t dt)
{
    return esize(dt) == 8 ? ~0ull : (1ull << (8 * esize(dt))) - 1;
}

/* A float from its bits. */
static float f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The bits of a float. */
static uint32_t bits32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Whether element i of a buffer of a floating dtype is a NaN. */
static int elem_isnan(colld_dtype_t dt, const void *p, size_t i)
{
    uint64_t b = get_bits(dt, p, i);
    switch (dt) {
    case COLLD_FLOAT16:
        return (b & 0x7fff) > 0x7c00;
    case COLLD_BFLOAT16:
        return (b & 0x7fff) > 0x7f80;
    case COLLD_FLOAT32:
        return (b & 0x7fffffffull) > 0x7f800000ull;
    case COLLD_FLOAT64:
        return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    default:
        return 0;
    }
}

/* The SIMD and scalar builds usable on this CPU (scalar last). */
static size_t get_impls(const colld__reduce_impl_t **impls)
{
    size_t n = colld__reduce_impls(impls, MAX_IMPLS);
    assert_true(n >= 1);
    assert_string_equal(impls[n - 1]->name, "scalar");
    return n;
}

/* ---------------------------------------------------------------------------------------------
 * Conversions
 * ------------------------------------------------------------------------------------------- */

/* Known float16 values, including subnormals, the largest finite, infinities, NaN and ties. */
static void test_half_known(void **state)
{
    (void)state;
    assert_true(colld_half_to_float(0x3c00) == 1.0f);
    assert_true(colld_half_to_float(0xc000) == -2.0f);
    assert_true(colld_half_to_float(0x0001) == 0x1p-24f);
    assert_true(colld_half_to_float(0x03ff) == 1023 * 0x1p-24f);
    assert_true(colld_half_to_float(0x0400) == 0x1p-14f);
    assert_true(colld_half_to_float(0x7bff) == 65504.0f);
    assert_true(isinf(colld_half_to_float(0x7c00)) && colld_half_to_float(0x7c00) > 0);
    assert_true(isinf(colld_half_to_float(0xfc00)) && colld_half_to_float(0xfc00) < 0);
    assert_true(isnan(colld_half_to_float(0x7e00)));
    assert_true(isnan(colld_half_to_float(0x7c01))); /* signalling NaN stays NaN */
    assert_int_equal(bits32(colld_half_to_float(0x8000)), 0x80000000u);

    assert_int_equal(colld_float_to_half(1.0f), 0x3c00);
    assert_int_equal(colld_float_to_half(-0.0f), 0x8000);
    assert_int_equal(colld_float_to_half(1.0f + 0x1p-11f), 0x3c00);     /* tie, to even */
    assert_int_equal(colld_float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie, to even */
    assert_int_equal(colld_float_to_half(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    assert_int_equal(colld_float_to_half(65504.0f), 0x7bff);
    assert_int_equal(colld_float_to_half(65519.996f), 0x7bff);
    assert_int_equal(colld_float_to_half(65520.0f), 0x7c00); /* tie above the max: infinity */
    assert_int_equal(colld_float_to_half(1e10f), 0x7c00);
    assert_int_equal(colld_float_to_half(-INFINITY), 0xfc00);
    assert_int_equal(colld_float_to_half(0x1p-24f), 0x0001);
    assert_int_equal(colld_float_to_half(0x1p-25f), 0x0000); /* tie, to even 0 */
    assert_int_equal(colld_float_to_half(0x1p-25f + 0x1p-40f), 0x0001);
    assert_int_equal(colld_float_to_half(3 * 0x1p-25f), 0x0002);              /* tie, to even */
    assert_int_equal(colld_float_to_half(-5 * 0x1p-25f), 0x8002);             /* tie, to even */
    assert_int_equal(colld_float_to_half(0x1p-14f - 0x1p-26f), 0x0400);       /* rounds up to normal */
    assert_int_equal(colld_float_to_half(0x1p-130f), 0x0000);                 /* float subnormal */
    assert_int_equal(colld_float_to_half(f32(0x7f800001u)) & 0x7e00, 0x7e00); /* NaN, not inf */
    assert_int_equal(colld_float_to_half(f32(0xffc00000u)), 0xfe00);
}

/* Known bfloat16 values, the same kinds of cases. */
static void test_bf16_known(void **state)
{
    (void)state;
    assert_true(colld_bf16_to_float(0x3f80) == 1.0f);
    assert_true(colld_bf16_to_float(0x0001) == 0x1p-133f); /* subnormal */
    assert_true(isinf(colld_bf16_to_float(0x7f80)));
    assert_true(isnan(colld_bf16_to_float(0x7fc0)));
    assert_true(isnan(colld_bf16_to_float(0x7f81)));

    assert_int_equal(colld_float_to_bf16(1.0f), 0x3f80);
    assert_int_equal(colld_float_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie, to even */
    assert_int_equal(colld_float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie, to even */
    assert_int_equal(colld_float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_int_equal(colld_float_to_bf16(f32(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
    assert_int_equal(colld_float_to_bf16(f32(0x00008000u)), 0x0000); /* subnormal tie, to even */
    assert_int_equal(colld_float_to_bf16(f32(0x00018000u)), 0x0002);
    assert_int_equal(colld_float_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(colld_float_to_bf16(f32(0x7f800001u)) & 0x7fc0, 0x7fc0); /* NaN, not inf */
    assert_int_equal(colld_float_to_bf16(f32(0xffc00000u)), 0xffc0);
}

/* The value of a binary16/bfloat16 pattern by a formula independent of the library. */
static double small_float_value(uint16_t h, int mant_bits, int bias)
{
    int exp_max = (1 << (15 - mant_bits)) - 1;
    int exp = (h >> mant_bits) & exp_max;
    unsigned mant = h & ((1u << mant_bits) - 1);
    double v = exp == 0 ? ldexp(mant, 1 - bias - mant_bits) : ldexp((1u << mant_bits) + mant, exp - bias - mant_bits);
    return (h & 0x8000) ? -v : v;
}

/* Every 16-bit pattern: to-float is exact (against the formula), round trips, NaN stays NaN; and
 * every midpoint between neighbouring values (and the floats just beside it) rounds to nearest,
 * ties to even. Done for float16 and bfloat16. */
static void test_half_exhaustive(void **state)
{
    (void)state;
    for (int kind = 0; kind < 2; kind++) {
        int mant_bits = kind == 0 ? 10 : 7;
        int bias = kind == 0 ? 15 : 127;
        uint16_t inf = kind == 0 ? 0x7c00 : 0x7f80;
        float (*to_f)(uint16_t) = kind == 0 ? colld_half_to_float : colld_bf16_to_float;
        uint16_t (*from_f)(float) = kind == 0 ? colld_float_to_half : colld_float_to_bf16;

        for (uint32_t u = 0; u < 0x10000; u++) {
            uint16_t h = (uint16_t)u;
            uint16_t mag = h & 0x7fff;
            float f = to_f(h);
            if (mag > inf) {
                assert_true(isnan(f));
                assert_true((from_f(f) & 0x7fff) > inf);
                continue;
            }
            if (mag == inf) {
                assert_true(isinf(f) && (f < 0) == ((h & 0x8000) != 0));
            } else {
                assert_true((double)f == small_float_value(h, mant_bits, bias));
                assert_int_equal(bits32(f) >> 31, h >> 15);
                /* The midpoint to the next magnitude up: exact in float (one more bit). Above
                 * the largest finite value, the next magnitude is where it would be without
                 * the exponent limit (the midpoint then rounds to infinity). */
                uint16_t up = (uint16_t)(h + 1);
                double next = (up & 0x7fff) == inf ? 2 * (double)f - (double)to_f((uint16_t)(h - 1)) : (double)to_f(up);
                float mid = (float)(((double)f + next) / 2);
                assert_true((double)mid == ((double)f + next) / 2);
                uint16_t even = (h & 1) ? up : h;
                assert_int_equal(from_f(mid), even);
                float toward = h & 0x8000 ? -INFINITY : INFINITY;
                assert_int_equal(from_f(nextafterf(mid, toward)), up);
                assert_int_equal(from_f(nextafterf(mid, 0.0f)), h);
            }
            assert_int_equal(from_f(f), h);
        }
    }
}

/* The block conversions of each ISA build (F16C in the SIMD ones) equal the scalar conversions bit
 * for bit: every float16 pattern to float, and midpoints, specials and random float patterns to
 * float16. Sizes are odd so that the vector tails run too. */
static void test_half_blocks_per_isa(void **state)
{
    (void)state;
    const colld__reduce_impl_t *impls[MAX_IMPLS];
    size_t n_impls = get_impls(impls);
    const size_t n_h = 0x10000 + 3, n_f = 3 * 0x10000 + 2 * 262144 + 7;
    uint16_t *h = malloc(n_h * sizeof *h);
    float *hf = malloc(n_h * sizeof *hf);
    float *f = malloc(n_f * sizeof *f);
    uint16_t *fh = malloc(n_f * sizeof *fh);
    assert_non_null(h && hf && f && fh);

    for (size_t i = 0; i < n_h; i++)
        h[i] = (uint16_t)i;
    size_t k = 0;
    for (uint32_t u = 0; u < 0x10000; u++) { /* midpoints and their neighbours */
        float a = colld_half_to_float((uint16_t)u), b = colld_half_to_float((uint16_t)(u + 1));
        float mid = (a + b) / 2;
        f[k++] = mid;
        f[k++] = nextafterf(mid, INFINITY);
        f[k++] = nextafterf(mid, -INFINITY);
    }
    for (; k < n_f; k++) { /* random patterns, half of them scaled into the float16 range */
        uint32_t r = (uint32_t)rnd();
        if (k & 1)
            r = (r & 0x807fffffu) | ((uint32_t)(96 + (r >> 23) % 48) << 23);
        f[k] = f32(r);
    }
    for (size_t i = 0; i < n_impls; i++) {
        impls[i]->half_to_float_block(hf, h, n_h);
        for (size_t j = 0; j < n_h; j++)
            if (bits32(hf[j]) != bits32(colld_half_to_float(h[j])))
                fail_msg("%s half_to_float(0x%04x) = 0x%08x, scalar 0x%08x", impls[i]->name, h[j], bits32(hf[j]),
                         bits32(colld_half_to_float(h[j])));
        impls[i]->float_to_half_block(fh, f, n_f);
        for (size_t j = 0; j < n_f; j++)
            if (fh[j] != colld_float_to_half(f[j]))
                fail_msg("%s float_to_half(0x%08x) = 0x%04x, scalar 0x%04x", impls[i]->name, bits32(f[j]), fh[j],
                         colld_float_to_half(f[j]));
    }
    free(h);
    free(hf);
    free(f);
    free(fh);
}

/* ---------------------------------------------------------------------------------------------
 * Reference reduction: one element at a time, in rank order, written independently of the kernels
 * (integers in 64-bit arithmetic then truncated; floats in the accumulator precision with explicit
 * NaN tests).
 * ------------------------------------------------------------------------------------------- */

/* min/max of the reference for floating accumulators: first NaN wins, ties take the later input. */
#define REF_MINMAX(acc, x, op)                                                                                         \
    do {                                                                                                               \
        if (isnan(acc))                                                                                                \
            break;                                                                                                     \
        if (isnan(x) || ((op) == COLLD_MIN ? (x) <= (acc) : (x) >= (acc)))                                             \
            (acc) = (x);                                                                                               \
    } while (0)

/* One float accumulator step of the reference. */
static float ref_step_f(float acc, float x, colld_redop_t op)
{
    if (op == COLLD_SUM || op == COLLD_AVG)
        return acc + x;
    if (op == COLLD_PROD)
        return acc * x;
    REF_MINMAX(acc, x, op);
    return acc;
}

/* One double accumulator step of the reference. */
static double ref_step_d(double acc, double x, colld_redop_t op)
{
    if (op == COLLD_SUM || op == COLLD_AVG)
        return acc + x;
    if (op == COLLD_PROD)
        return acc * x;
    REF_MINMAX(acc, x, op);
    return acc;
}

/* Element i of the reduction of n_in inputs. */
static uint64_t ref_elem(colld_dtype_t dt, colld_redop_t op, void *const *in, int n_in, size_t i)
{
    if (is_int(dt)) {
        int sgn = is_signed_int(dt);
        uint64_t acc = (uint64_t)get_int(dt, in[0], i);
        for (int r = 1; r < n_in; r++) {
            uint64_t x = (uint64_t)get_int(dt, in[r], i);
            if (op == COLLD_SUM || op == COLLD_AVG)
                acc += x;
            else if (op == COLLD_PROD)
                acc *= x;
            else if (sgn ? ((int64_t)x < (int64_t)acc) == (op == COLLD_MIN) && x != acc
                         : (x < acc) == (op == COLLD_MIN) && x != acc)
                acc = x;
        }
        if (op == COLLD_AVG) { /* the wrapped sum, read in the element type, truncated / n_in */
            uint64_t wrapped = acc & emask(dt);
            put_bits(dt, &acc, 0, wrapped);
            int64_t s = get_int(dt, &acc, 0);
            acc = sgn ? (uint64_t)(s / n_in) : (uint64_t)s / (uint64_t)n_in;
        }
        return acc & emask(dt);
    }
    if (dt == COLLD_FLOAT64) {
        double acc, x;
        uint64_t b = get_bits(dt, in[0], i);
        memcpy(&acc, &b, 8);
        for (int r = 1; r < n_in; r++) {
            b = get_bits(dt, in[r], i);
            memcpy(&x, &b, 8);
            acc = ref_step_d(acc, x, op);
        }
        if (op == COLLD_AVG)
            acc = acc / (double)n_in;
        memcpy(&b, &acc, 8);
        return b;
    }
    float acc = 0;
    for (int r = 0; r < n_in; r++) {
        uint16_t b16 = (uint16_t)get_bits(dt, in[r], i);
        float x = dt == COLLD_FLOAT32   ? f32((uint32_t)get_bits(dt, in[r], i))
                  : dt == COLLD_FLOAT16 ? colld_half_to_float(b16)
                                        : colld_bf16_to_float(b16);
        acc = r == 0 ? x : ref_step_f(acc, x, op);
    }
    if (op == COLLD_AVG)
        acc = acc / (float)n_in;
    if (dt == COLLD_FLOAT16)
        return colld_float_to_half(acc);
    if (dt == COLLD_BFLOAT16)
        return colld_float_to_bf16(acc);
    return bits32(acc);
}

/* ---------------------------------------------------------------------------------------------
 * Test data
 * ------------------------------------------------------------------------------------------- */

/* A random float of moderate magnitude (sums round, products rarely overflow), sometimes special:
 * zeros, infinities, subnormals, huge values; NaNs only when nan_ok (min/max: NaN combinations of
 * sums would make the payload depend on operand order, which no kernel promises). */
static double rnd_real(int nan_ok, int for_prod)
{
    uint64_t r = rnd();
    if ((r & 63) == 0) {
        switch ((r >> 6) % 7) {
        case 0:
            return 0.0;
        case 1:
            return -0.0;
        case 2:
            return (r >> 9) & 1 ? INFINITY : -INFINITY;
        case 3:
            return 0x1p-140; /* subnormal in float */
        case 4:
            return -3e38;
        case 5:
            return 1e300;
        default:
            return nan_ok ? ((r >> 9) & 1 ? -NAN : NAN) : 1.0;
        }
    }
    double m = (double)(r >> 11) * 0x1p-53 + 0.5; /* 0.5 .. 1.5 */
    int e = for_prod ? (int)((r >> 1) % 5) - 2 : (int)((r >> 1) % 41) - 20;
    return ((r & 1) ? -m : m) * ldexp(1.0, e);
}

/* Fill element i of a buffer of dtype dt with random data suited to op. */
static void fill_elem(colld_dtype_t dt, colld_redop_t op, void *p, size_t i)
{
    int nan_ok = op == COLLD_MIN || op == COLLD_MAX;
    int for_prod = op == COLLD_PROD;
    uint64_t r = rnd();

    if (is_int(dt)) {
        put_bits(dt, p, i, r);
    } else if (dt == COLLD_FLOAT16 || dt == COLLD_BFLOAT16) {
        uint16_t h;
        uint16_t inf = dt == COLLD_FLOAT16 ? 0x7c00 : 0x7f80;
        do { /* any pattern, but NaN only when allowed; for prod mostly near 1 */
            h = (uint16_t)r;
            if (for_prod && (r & 0x70000))
                h = dt == COLLD_FLOAT16 ? colld_float_to_half((float)rnd_real(0, 1))
                                        : colld_float_to_bf16((float)rnd_real(0, 1));
            r = rnd();
        } while (!nan_ok && (h & 0x7fff) > inf);
        put_bits(dt, p, i, h);
    } else if (dt == COLLD_FLOAT32) {
        float f = (float)rnd_real(nan_ok, for_prod);
        put_bits(dt, p, i, bits32(f));
    } else {
        double d = rnd_real(nan_ok, for_prod);
        uint64_t b;
        memcpy(&b, &d, 8);
        put_bits(dt, p, i, b);
    }
}

/* An allocation for one buffer of up to `bytes` at any offset below GUARD. */
static void *alloc_buf(size_t bytes)
{
    size_t size = (bytes + 2 * GUARD + 63) / 64 * 64; /* aligned_alloc wants a multiple */
    void *p = aligned_alloc(64, size);
    assert_non_null(p);
    memset(p, 0xa5, size);
    return p;
}

/* Byte offset of buffer `idx` (inputs 0..7, outputs 8..) for an alignment case: 0 = all 64-byte
 * aligned, 1 = all one element past a 64-byte boundary, 2 = a different odd number of elements per
 * buffer (odd bytes for 8-bit types). */
static size_t buf_offset(colld_dtype_t dt, int align_case, int idx)
{
    if (align_case == 0)
        return 0;
    if (align_case == 1)
        return esize(dt);
    return esize(dt) * (size_t)(1 + 2 * (idx % 7)) + (size_t)(64 * (idx & 1));
}

/* The failure report for a mismatch between two outputs. */
static void report(const char *what, colld_dtype_t dt, colld_redop_t op, int n_in, size_t count, int align_case,
                   size_t i, uint64_t got, uint64_t want)
{
    fail_msg("%s: dtype %d op %d n_in %d count %zu align %d: element %zu is 0x%llx, expected 0x%llx", what, (int)dt,
             (int)op, n_in, count, align_case, i, (unsigned long long)got, (unsigned long long)want);
}

/* ---------------------------------------------------------------------------------------------
 * Reductions
 * ------------------------------------------------------------------------------------------- */

/* The full matrix: for every dtype x op x n_in x count x alignment, the scalar build (2 outputs)
 * matches the reference element by element (NaN matching any NaN), both outputs are equal, the
 * guard bytes around them are untouched, and every other build usable here plus the dispatched
 * entry point produce exactly the same bits. */
static void test_reduce_matrix(void **state)
{
    (void)state;
    const colld__reduce_impl_t *impls[MAX_IMPLS];
    size_t n_impls = get_impls(impls);
    size_t max_bytes = 4099 * 8 + GUARD;
    void *inb[MAX_IN], *outb[2], *refb = malloc(max_bytes);
    assert_non_null(refb);
    for (int r = 0; r < MAX_IN; r++)
        inb[r] = alloc_buf(max_bytes);
    for (int o = 0; o < 2; o++)
        outb[o] = alloc_buf(max_bytes);

    for (int dti = 0; dti < COLLD_DTYPE_COUNT; dti++) {
        colld_dtype_t dt = (colld_dtype_t)dti;
        for (int opi = 0; opi < COLLD_REDOP_COUNT; opi++) {
            colld_redop_t op = (colld_redop_t)opi;
            for (size_t ni = 0; ni < sizeof n_in_cases / sizeof n_in_cases[0]; ni++) {
                int n_in = n_in_cases[ni];
                for (size_t ci = 0; ci < sizeof count_cases / sizeof count_cases[0]; ci++) {
                    size_t count = count_cases[ci];
                    for (int ac = 0; ac < ALIGN_CASES; ac++) {
                        void *in[MAX_IN], *out[2];
                        for (int r = 0; r < n_in; r++) {
                            in[r] = (char *)inb[r] + GUARD + buf_offset(dt, ac, r);
                            for (size_t i = 0; i < count; i++)
                                fill_elem(dt, op, in[r], i);
                        }
                        for (int o = 0; o < 2; o++)
                            out[o] = (char *)outb[o] + GUARD + buf_offset(dt, ac, MAX_IN + o);

                        /* The scalar build against the reference. */
                        for (int o = 0; o < 2; o++)
                            memset(outb[o], 0xa5, max_bytes + 2 * GUARD);
                        assert_int_equal(colld_cpu_reduce_scalar(dt, op, (const void *const *)in, n_in, out, 2, count),
                                         COLLD_OK);
                        for (size_t i = 0; i < count; i++) {
                            uint64_t got = get_bits(dt, out[0], i);
                            uint64_t want = ref_elem(dt, op, in, n_in, i);
                            put_bits(dt, refb, i, want);
                            if (got != want && !(elem_isnan(dt, out[0], i) && elem_isnan(dt, refb, i)))
                                report("scalar vs reference", dt, op, n_in, count, ac, i, got, want);
                        }
                        if (count > 0)
                            assert_memory_equal(out[0], out[1], count * esize(dt));
                        for (int o = 0; o < 2; o++) { /* nothing written just before or after */
                            unsigned char *b = outb[o];
                            size_t lo = GUARD + buf_offset(dt, ac, MAX_IN + o);
                            size_t hi = lo + count * esize(dt);
                            for (size_t j = 0; j < hi + GUARD; j++)
                                if ((j < lo || j >= hi) && b[j] != 0xa5)
                                    fail_msg("scalar wrote outside the output at byte %zu", j);
                        }
                        memcpy(refb, out[0], count * esize(dt));

                        /* Every other build, and the dispatched entry point, bit for bit. */
                        for (size_t k = 0; k <= n_impls; k++) {
                            for (int o = 0; o < 2; o++)
                                memset(out[o], 0x5a, count * esize(dt));
                            colld_status_t st = k < n_impls
                                                    ? colld__reduce_with(impls[k], dt, op, (const void *const *)in,
                                                                         n_in, out, 2, count)
                                                    : colld_cpu_reduce(dt, op, (const void *const *)in, n_in, out, 2,
                                                                       count);
                            assert_int_equal(st, COLLD_OK);
                            for (int o = 0; o < 2; o++)
                                for (size_t i = 0; i < count; i++)
                                    if (get_bits(dt, out[o], i) != get_bits(dt, refb, i))
                                        report(k < n_impls ? impls[k]->name : "dispatched", dt, op, n_in, count, ac, i,
                                               get_bits(dt, out[o], i), get_bits(dt, refb, i));
                        }
                    }
                }
            }
        }
    }
    for (int r = 0; r < MAX_IN; r++)
        free(inb[r]);
    for (int o = 0; o < 2; o++)
        free(outb[o]);
    free(refb);
}

/* In place: with out[0] == in[0], and with every input also an output (n_out == n_in), each build
 * gives the out-of-place result, across several blocks. */
static void test_reduce_in_place(void **state)
{
    (void)state;
    const colld__reduce_impl_t *impls[MAX_IMPLS];
    size_t n_impls = get_impls(impls);
    const int n_in = 4;
    const size_t count = 3 * COLLD__REDUCE_BLOCK + 5;
    void *orig[4], *buf[4], *want = malloc(count * 8);
    assert_non_null(want);
    for (int r = 0; r < n_in; r++) {
        orig[r] = malloc(count * 8);
        buf[r] = malloc(count * 8);
        assert_non_null(orig[r] && buf[r]);
    }
    for (size_t k = 0; k < n_impls; k++)
        for (int dti = 0; dti < COLLD_DTYPE_COUNT; dti++)
            for (int opi = 0; opi < COLLD_REDOP_COUNT; opi++) {
                colld_dtype_t dt = (colld_dtype_t)dti;
                colld_redop_t op = (colld_redop_t)opi;
                size_t bytes = count * esize(dt);
                for (int r = 0; r < n_in; r++)
                    for (size_t i = 0; i < count; i++)
                        fill_elem(dt, op, orig[r], i);
                assert_int_equal(colld__reduce_with(impls[k], dt, op, (const void *const *)orig, n_in, &want, 1, count),
                                 COLLD_OK);

                for (int r = 0; r < n_in; r++)
                    memcpy(buf[r], orig[r], bytes);
                assert_int_equal(colld__reduce_with(impls[k], dt, op, (const void *const *)buf, n_in, buf, 1, count),
                                 COLLD_OK);
                assert_memory_equal(buf[0], want, bytes);

                for (int r = 0; r < n_in; r++)
                    memcpy(buf[r], orig[r], bytes);
                assert_int_equal(colld__reduce_with(impls[k], dt, op, (const void *const *)buf, n_in, buf, n_in, count),
                                 COLLD_OK);
                for (int r = 0; r < n_in; r++)
                    assert_memory_equal(buf[r], want, bytes);
            }
    for (int r = 0; r < n_in; r++) {
        free(orig[r]);
        free(buf[r]);
    }
    free(want);
}

/* Run one reduction of n_in single-element inputs with every build; all must give `want`. */
static void check_one(colld_dtype_t dt, colld_redop_t op, const uint64_t *vals, int n_in, uint64_t want)
{
    const colld__reduce_impl_t *impls[MAX_IMPLS];
    size_t n_impls = get_impls(impls);
    uint64_t store[MAX_IN], res = 0;
    const void *in[MAX_IN];
    void *out[1] = { &res };
    for (int r = 0; r < n_in; r++) {
        store[r] = 0;
        put_bits(dt, &store[r], 0, vals[r]);
        in[r] = &store[r];
    }
    for (size_t k = 0; k < n_impls; k++) {
        res = 0;
        assert_int_equal(colld__reduce_with(impls[k], dt, op, in, n_in, out, 1, 1), COLLD_OK);
        if (res != (want & emask(dt)))
            fail_msg("%s: dtype %d op %d: got 0x%llx, expected 0x%llx", impls[k]->name, (int)dt, (int)op,
                     (unsigned long long)res, (unsigned long long)(want & emask(dt)));
    }
}

/* Integer sums and products wrap in the element width. */
static void test_int_wrap(void **state)
{
    (void)state;
    check_one(COLLD_INT8, COLLD_SUM, (const uint64_t[]){ 100, 100 }, 2, (uint64_t)-56);
    check_one(COLLD_UINT8, COLLD_SUM, (const uint64_t[]){ 200, 100 }, 2, 44);
    check_one(COLLD_INT8, COLLD_PROD, (const uint64_t[]){ 16, 16 }, 2, 0);
    check_one(COLLD_UINT8, COLLD_PROD, (const uint64_t[]){ 255, 255 }, 2, 1);
    check_one(COLLD_INT32, COLLD_SUM, (const uint64_t[]){ 0x7fffffff, 1 }, 2, 0x80000000u);
    check_one(COLLD_UINT32, COLLD_SUM, (const uint64_t[]){ 0xffffffffu, 2 }, 2, 1);
    check_one(COLLD_INT32, COLLD_PROD, (const uint64_t[]){ 0x10000, 0x10000 }, 2, 0);
    check_one(COLLD_INT64, COLLD_SUM, (const uint64_t[]){ INT64_MAX, 1 }, 2, (uint64_t)INT64_MIN);
    check_one(COLLD_UINT64, COLLD_SUM, (const uint64_t[]){ UINT64_MAX, 1, 5 }, 3, 5);
    check_one(COLLD_INT64, COLLD_PROD, (const uint64_t[]){ 1ull << 32, 1ull << 32 }, 2, 0);
    check_one(COLLD_INT8, COLLD_MIN, (const uint64_t[]){ 5, (uint64_t)-128, 127 }, 3, 0x80);
    check_one(COLLD_UINT8, COLLD_MAX, (const uint64_t[]){ 5, 0x80, 127 }, 3, 0x80);
    check_one(COLLD_INT64, COLLD_MAX, (const uint64_t[]){ (uint64_t)-1, (uint64_t)INT64_MIN }, 2, (uint64_t)-1);
}

/* Integer avg truncates toward zero (negative too), after a sum that wraps in the element width. */
static void test_int_avg(void **state)
{
    (void)state;
    check_one(COLLD_INT32, COLLD_AVG, (const uint64_t[]){ (uint64_t)-7, 0 }, 2, (uint64_t)-3);
    check_one(COLLD_INT32, COLLD_AVG, (const uint64_t[]){ 7, 0 }, 2, 3);
    check_one(COLLD_INT8, COLLD_AVG, (const uint64_t[]){ (uint64_t)-5, (uint64_t)-2 }, 2, (uint64_t)-3);
    check_one(COLLD_INT8, COLLD_AVG, (const uint64_t[]){ (uint64_t)-1, 0, 0 }, 3, 0);
    check_one(COLLD_INT64, COLLD_AVG, (const uint64_t[]){ (uint64_t)-9, (uint64_t)-1, 0, 0 }, 4, (uint64_t)-2);
    check_one(COLLD_INT64, COLLD_AVG, (const uint64_t[]){ (uint64_t)INT64_MIN, 0 }, 2, (uint64_t)(INT64_MIN / 2));
    check_one(COLLD_UINT8, COLLD_AVG, (const uint64_t[]){ 255, 255 }, 2, 127);          /* 510 wraps to 254 */
    check_one(COLLD_INT8, COLLD_AVG, (const uint64_t[]){ 100, 100 }, 2, (uint64_t)-28); /* -56 / 2 */
    check_one(COLLD_UINT32, COLLD_AVG, (const uint64_t[]){ 0xffffffffu, 0xfffffffeu, 2 }, 3,
              0x55555555u); /* wraps to 0xffffffff, / 3 */
    check_one(COLLD_UINT64, COLLD_AVG, (const uint64_t[]){ UINT64_MAX, 0, 0, 0, 0, 0, 0, 0 }, 8, UINT64_MAX / 8);
    /* 3 * INT32_MAX wraps to 0x7ffffffd = 2147483645; / 3 = 715827881. */
    check_one(COLLD_INT32, COLLD_AVG, (const uint64_t[]){ 0x7fffffff, 0x7fffffff, 0x7fffffff }, 3, 715827881u);
}

/* min/max give NaN when any input is NaN, wherever it is; the first NaN in rank order is the one
 * returned. Checked for all four floating dtypes. */
static void test_nan_minmax(void **state)
{
    (void)state;
    const uint64_t qnan[4] = { 0x7e00, 0x7fc0, 0x7fc00000u, 0x7ff8000000000000ull };
    const uint64_t one[4] = { 0x3c00, 0x3f80, 0x3f800000u, 0x3ff0000000000000ull };
    const uint64_t two[4] = { 0x4000, 0x4000, 0x40000000u, 0x4000000000000000ull };
    const colld_dtype_t dts[4] = { COLLD_FLOAT16, COLLD_BFLOAT16, COLLD_FLOAT32, COLLD_FLOAT64 };
    for (int d = 0; d < 4; d++)
        for (int op = COLLD_MIN; op <= COLLD_MAX; op++)
            for (int pos = 0; pos < 3; pos++) {
                uint64_t v[3] = { one[d], two[d], one[d] };
                v[pos] = qnan[d];
                check_one(dts[d], (colld_redop_t)op, v, 3, qnan[d]);
                if (pos < 2) { /* a second, negative NaN later: the first one wins */
                    v[2] = qnan[d] | (1ull << (8 * esize(dts[d]) - 1));
                    check_one(dts[d], (colld_redop_t)op, v, 3, qnan[d]);
                }
            }
    /* No NaN: ordinary min/max. */
    check_one(COLLD_FLOAT32, COLLD_MIN, (const uint64_t[]){ one[2], two[2] }, 2, one[2]);
    check_one(COLLD_FLOAT16, COLLD_MAX, (const uint64_t[]){ one[0], two[0] }, 2, two[0]);
}

/* Floating sums of small integers are exact: compared with a long double sum; half types
 * accumulate in float and round once (a bfloat16 example where rounding per step would differ). */
static void test_float_exact(void **state)
{
    (void)state;
    const colld_dtype_t dts[4] = { COLLD_FLOAT16, COLLD_BFLOAT16, COLLD_FLOAT32, COLLD_FLOAT64 };
    for (int d = 0; d < 4; d++)
        for (int n_in = 1; n_in <= MAX_IN; n_in++)
            for (int t = 0; t < 50; t++) {
                uint64_t v[MAX_IN];
                long double sum = 0;
                for (int r = 0; r < n_in; r++) {
                    int x = (int)(rnd() % 33) - 16;
                    sum += x;
                    float xf = (float)x;
                    double xd = x;
                    v[r] = dts[d] == COLLD_FLOAT16    ? colld_float_to_half(xf)
                           : dts[d] == COLLD_BFLOAT16 ? colld_float_to_bf16(xf)
                           : dts[d] == COLLD_FLOAT32  ? bits32(xf)
                                                      : 0;
                    if (dts[d] == COLLD_FLOAT64)
                        memcpy(&v[r], &xd, 8);
                }
                uint64_t want = 0;
                float sf = (float)sum;
                double sd = (double)sum;
                want = dts[d] == COLLD_FLOAT16    ? colld_float_to_half(sf)
                       : dts[d] == COLLD_BFLOAT16 ? colld_float_to_bf16(sf)
                       : dts[d] == COLLD_FLOAT32  ? bits32(sf)
                                                  : 0;
                if (dts[d] == COLLD_FLOAT64)
                    memcpy(&want, &sd, 8);
                check_one(dts[d], COLLD_SUM, v, n_in, want);
            }
    /* bfloat16: 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly in float, 0x3f81; per-step rounding gives 1. */
    check_one(COLLD_BFLOAT16, COLLD_SUM, (const uint64_t[]){ 0x3f80, 0x3b80, 0x3b80 }, 3, 0x3f81);
    /* float16: 2048 + 1 + 1 = 2050 (exact), whereas 2048 + 1 alone is a tie rounding to 2048. */
    check_one(COLLD_FLOAT16, COLLD_SUM, (const uint64_t[]){ 0x6800, 0x3c00, 0x3c00 }, 3, 0x6801);
    check_one(COLLD_FLOAT16, COLLD_SUM, (const uint64_t[]){ 0x6800, 0x3c00 }, 2, 0x6800);
    /* float16 avg: (1 + 2) / 2 = 1.5. */
    check_one(COLLD_FLOAT16, COLLD_AVG, (const uint64_t[]){ 0x3c00, 0x4000 }, 2, 0x3e00);
}

/* Invalid arguments are refused without touching anything; count 0 and n_out 0 are no-ops; the
 * implementation name is one of the documented ones and is the best build usable here. */
static void test_args_and_impl(void **state)
{
    (void)state;
    float a = 1, b = 2, o = 7;
    const void *in[2] = { &a, &b };
    const void *in_null[2] = { &a, NULL };
    void *out[1] = { &o };
    void *out_null[1] = { NULL };
    const colld__reduce_impl_t *impls[MAX_IMPLS];

    assert_int_equal(colld_cpu_reduce(COLLD_FLOAT32, COLLD_SUM, in, 0, out, 1, 1), COLLD_ERR_INVALID_ARGUMENT);
    assert_int_equal(colld_cpu_reduce(COLLD_DTYPE_COUNT, COLLD_SUM, in, 2, out, 1, 1), COLLD_ERR_INVALID_ARGUMENT);
    assert_int_equal(colld_cpu_reduce(COLLD_FLOAT32, COLLD_REDOP_COUNT, in, 2, out, 1, 1), COLLD_ERR_INVALID_ARGUMENT);
    assert_int_equal(colld_cpu_reduce(COLLD_FLOAT32, COLLD_SUM, NULL, 2, out, 1, 1), COLLD_ERR_INVALID_ARGUMENT);
    assert_int_equal(colld_cpu_reduce(COLLD_FLOAT32, COLLD_SUM, in_null, 2, out, 1, 1), COLLD_ERR_INVALID_ARGUMENT);
    assert_int_equal(colld_cpu_reduce(COLLD_FLOAT32, COLLD_SUM, in, 2, out_null, 1, 1), COLLD_ERR_INVALID_ARGUMENT);
    assert_int_equal(colld_cpu_reduce_scalar(COLLD_FLOAT32, COLLD_SUM, in, 2, out, -1, 1), COLLD_ERR_INVALID_ARGUMENT);
    assert_true(o == 7);
    assert_int_equal(colld_cpu_reduce(COLLD_FLOAT32, COLLD_SUM, in, 2, out, 1, 0), COLLD_OK);
    assert_int_equal(colld_cpu_reduce(COLLD_FLOAT32, COLLD_SUM, in, 2, out, 0, 1), COLLD_OK);
    assert_true(o == 7);
    assert_int_equal(colld_cpu_reduce(COLLD_FLOAT32, COLLD_SUM, in, 2, out, 1, 1), COLLD_OK);
    assert_true(o == 3);

    const char *name = colld_cpu_reduce_impl();
    assert_true(strcmp(name, "avx512") == 0 || strcmp(name, "avx2") == 0 || strcmp(name, "scalar") == 0);
    size_t n = get_impls(impls);
    assert_string_equal(name, impls[0]->name);
    assert_string_equal(colld_cpu_reduce_impl(), name); /* chosen once, stable */
    for (size_t k = 0; k < n; k++)
        print_message("reduce build usable on this CPU: %s%s\n", impls[k]->name, k == 0 ? " (dispatched)" : "");
}

/* colld_cpu_first_nonfinite (--nan-check): each float dtype finds a NaN, +Inf or -Inf at every
 * position around the 64-element blocks, names it, and never flags the largest finite value, a
 * subnormal or a negative zero; integers are never flagged. */
static void test_first_nonfinite(void **state)
{
    (void)state;
    static const colld_dtype_t dts[] = { COLLD_FLOAT16, COLLD_BFLOAT16, COLLD_FLOAT32, COLLD_FLOAT64 };
    static const size_t where[] = { 0, 1, 63, 64, 65, 127, 128, 999 };
    enum { N = 1000 };
    unsigned char buf[N * 8];
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        colld_dtype_t dt = dts[d];
        size_t es = dt == COLLD_FLOAT64 ? 8 : dt == COLLD_FLOAT32 ? 4 : 2;
        /* finite edge values: max finite, smallest subnormal, -0, 1 */
        for (size_t i = 0; i < N; i++) {
            double v = i % 4 == 0   ? (dt == COLLD_FLOAT16    ? 65504.0
                                       : dt == COLLD_BFLOAT16 ? 3.0e38
                                       : dt == COLLD_FLOAT32  ? 3.4e38
                                                              : 1.7e308)
                       : i % 4 == 1 ? -0.0
                       : i % 4 == 2 ? 1.0
                                    : (dt == COLLD_FLOAT64   ? 4.9e-324
                                       : dt == COLLD_FLOAT32 ? 1.4e-45
                                                             : 0.0);
            switch (dt) {
            case COLLD_FLOAT16: {
                uint16_t h = colld_float_to_half((float)v);
                memcpy(buf + i * es, &h, 2);
                break;
            }
            case COLLD_BFLOAT16: {
                uint16_t b = colld_float_to_bf16((float)v);
                memcpy(buf + i * es, &b, 2);
                break;
            }
            case COLLD_FLOAT32: {
                float f = (float)v;
                memcpy(buf + i * es, &f, 4);
                break;
            }
            default:
                memcpy(buf + i * es, &v, 8);
                break;
            }
        }
        assert_int_equal(colld_cpu_first_nonfinite(dt, buf, N), N);
        for (size_t w = 0; w < sizeof(where) / sizeof(where[0]); w++)
            for (int kind = 0; kind < 3; kind++) {
                unsigned char saved[8];
                memcpy(saved, buf + where[w] * es, es);
                double bad = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
                switch (dt) {
                case COLLD_FLOAT16: {
                    uint16_t h = colld_float_to_half((float)bad);
                    memcpy(buf + where[w] * es, &h, 2);
                    break;
                }
                case COLLD_BFLOAT16: {
                    uint16_t b = colld_float_to_bf16((float)bad);
                    memcpy(buf + where[w] * es, &b, 2);
                    break;
                }
                case COLLD_FLOAT32: {
                    float f = (float)bad;
                    memcpy(buf + where[w] * es, &f, 4);
                    break;
                }
                default:
                    memcpy(buf + where[w] * es, &bad, 8);
                    break;
                }
                assert_int_equal(colld_cpu_first_nonfinite(dt, buf, N), where[w]);
                assert_string_equal(colld_cpu_nonfinite_name(dt, buf + where[w] * es), kind == 0   ? "NaN"
                                                                                       : kind == 1 ? "+Inf"
                                                                                                   : "-Inf");
                memcpy(buf + where[w] * es, saved, es);
            }
    }
    memset(buf, 0xff, sizeof(buf)); /* every bit set: NaN as a float, just -1 as an integer */
    assert_int_equal(colld_cpu_first_nonfinite(COLLD_FLOAT32, buf, N), 0);
    assert_int_equal(colld_cpu_first_nonfinite(COLLD_INT32, buf, N), N);
    assert_int_equal(colld_cpu_first_nonfinite(COLLD_UINT64, buf, N), N);
}

/* ---------------------------------------------------------------------------------------------
 * The premultiplied sum (colld_cpu_reduce_premul)
 * ------------------------------------------------------------------------------------------- */

/* A scalar word of dtype dt: ints any value, floats mostly near 1 (sometimes zero, an infinity or
 * a subnormal), float16/bfloat16 any pattern but NaN. */
static uint64_t rnd_scalar(colld_dtype_t dt)
{
    uint64_t w = 0;
    fill_elem(dt, COLLD_PROD, &w, 0);
    return w;
}

/* Element i of the premultiplied sum, computed independently: integers as 64-bit wrapping
 * arithmetic on the sign- or zero-extended values, masked; float32/float64 a product and a sum
 * per input in their own type; float16/bfloat16 in float, rounded once. */
static uint64_t ref_premul_elem(colld_dtype_t dt, const uint64_t *sc, void *const *in, int n_in, size_t i)
{
    if (is_int(dt)) {
        uint64_t acc = 0;
        for (int r = 0; r < n_in; r++)
            acc += (uint64_t)get_int(dt, in[r], i) * (uint64_t)get_int(dt, &sc[r], 0);
        return acc & emask(dt);
    }
    if (dt == COLLD_FLOAT64) {
        double acc = 0, x, s;
        for (int r = 0; r < n_in; r++) {
            uint64_t b = get_bits(dt, in[r], i);
            memcpy(&x, &b, 8);
            memcpy(&s, &sc[r], 8);
            acc = r == 0 ? x * s : acc + x * s;
        }
        uint64_t b;
        memcpy(&b, &acc, 8);
        return b;
    }
    float acc = 0;
    for (int r = 0; r < n_in; r++) {
        uint16_t b16 = (uint16_t)get_bits(dt, in[r], i), s16 = (uint16_t)sc[r];
        float x = dt == COLLD_FLOAT32   ? f32((uint32_t)get_bits(dt, in[r], i))
                  : dt == COLLD_FLOAT16 ? colld_half_to_float(b16)
                                        : colld_bf16_to_float(b16);
        float s = dt == COLLD_FLOAT32   ? f32((uint32_t)sc[r])
                  : dt == COLLD_FLOAT16 ? colld_half_to_float(s16)
                                        : colld_bf16_to_float(s16);
        acc = r == 0 ? x * s : acc + x * s;
    }
    if (dt == COLLD_FLOAT16)
        return colld_float_to_half(acc);
    if (dt == COLLD_BFLOAT16)
        return colld_float_to_bf16(acc);
    return bits32(acc);
}

/* The premultiplied sum over every dtype x n_in x count x alignment, with a different random scalar
 * per input: the scalar build (2 outputs) matches the reference element by element (NaN matching
 * any NaN), writes nothing outside its outputs, and every other build plus the dispatched entry
 * point give exactly its bits; then in place (out[0] == in[0], and every input also an output). */
static void test_premul_matrix(void **state)
{
    (void)state;
    const colld__reduce_impl_t *impls[MAX_IMPLS];
    size_t n_impls = get_impls(impls);
    size_t max_bytes = 4099 * 8 + GUARD;
    void *inb[MAX_IN], *outb[2], *refb = malloc(max_bytes), *copies[MAX_IN];
    assert_non_null(refb);
    for (int r = 0; r < MAX_IN; r++) {
        inb[r] = alloc_buf(max_bytes);
        copies[r] = alloc_buf(max_bytes);
    }
    for (int o = 0; o < 2; o++)
        outb[o] = alloc_buf(max_bytes);

    for (int dti = 0; dti < COLLD_DTYPE_COUNT; dti++) {
        colld_dtype_t dt = (colld_dtype_t)dti;
        for (size_t ni = 0; ni < sizeof n_in_cases / sizeof n_in_cases[0]; ni++) {
            int n_in = n_in_cases[ni];
            for (size_t ci = 0; ci < sizeof count_cases / sizeof count_cases[0]; ci++) {
                size_t count = count_cases[ci];
                for (int ac = 0; ac < ALIGN_CASES; ac++) {
                    void *in[MAX_IN], *out[2];
                    uint64_t sc[MAX_IN];
                    for (int r = 0; r < n_in; r++) {
                        sc[r] = rnd_scalar(dt);
                        in[r] = (char *)inb[r] + GUARD + buf_offset(dt, ac, r);
                        for (size_t i = 0; i < count; i++)
                            fill_elem(dt, COLLD_SUM, in[r], i);
                    }
                    for (int o = 0; o < 2; o++) {
                        out[o] = (char *)outb[o] + GUARD + buf_offset(dt, ac, MAX_IN + o);
                        memset(outb[o], 0xa5, max_bytes + 2 * GUARD);
                    }
                    assert_int_equal(
                        colld_cpu_reduce_premul_scalar(dt, sc, (const void *const *)in, n_in, out, 2, count), COLLD_OK);
                    for (size_t i = 0; i < count; i++) {
                        uint64_t got = get_bits(dt, out[0], i), want = ref_premul_elem(dt, sc, in, n_in, i);
                        put_bits(dt, refb, i, want);
                        if (got != want && !(elem_isnan(dt, out[0], i) && elem_isnan(dt, refb, i)))
                            report("premul scalar vs reference", dt, COLLD__REDOP_PREMUL_SUM, n_in, count, ac, i, got,
                                   want);
                    }
                    if (count > 0)
                        assert_memory_equal(out[0], out[1], count * esize(dt));
                    for (int o = 0; o < 2; o++) {
                        unsigned char *b = outb[o];
                        size_t lo = GUARD + buf_offset(dt, ac, MAX_IN + o), hi = lo + count * esize(dt);
                        for (size_t j = 0; j < hi + GUARD; j++)
                            if ((j < lo || j >= hi) && b[j] != 0xa5)
                                fail_msg("premul scalar wrote outside the output at byte %zu", j);
                    }
                    memcpy(refb, out[0], count * esize(dt));

                    for (size_t k = 0; k <= n_impls; k++) {
                        const char *name = k < n_impls ? impls[k]->name : "dispatched";
                        for (int o = 0; o < 2; o++)
                            memset(out[o], 0x5a, count * esize(dt));
                        colld_status_t st = k < n_impls
                                                ? colld__reduce_premul_with(impls[k], dt, sc, (const void *const *)in,
                                                                            n_in, out, 2, count)
                                                : colld_cpu_reduce_premul(dt, sc, (const void *const *)in, n_in, out, 2,
                                                                          count);
                        assert_int_equal(st, COLLD_OK);
                        for (int o = 0; o < 2; o++)
                            for (size_t i = 0; i < count; i++)
                                if (get_bits(dt, out[o], i) != get_bits(dt, refb, i))
                                    report(name, dt, COLLD__REDOP_PREMUL_SUM, n_in, count, ac, i,
                                           get_bits(dt, out[o], i), get_bits(dt, refb, i));
                        /* In place: copies of the inputs, each also its own output. */
                        for (int r = 0; r < n_in; r++) {
                            void *c = (char *)copies[r] + GUARD + buf_offset(dt, ac, r);
                            memcpy(c, in[r], count * esize(dt));
                        }
                        void *cp[MAX_IN];
                        for (int r = 0; r < n_in; r++)
                            cp[r] = (char *)copies[r] + GUARD + buf_offset(dt, ac, r);
                        st = k < n_impls
                                 ? colld__reduce_premul_with(impls[k], dt, sc, (const void *const *)cp, n_in, cp, n_in,
                                                             count)
                                 : colld_cpu_reduce_premul(dt, sc, (const void *const *)cp, n_in, cp, n_in, count);
                        assert_int_equal(st, COLLD_OK);
                        for (int r = 0; r < n_in; r++)
                            for (size_t i = 0; i < count; i++)
                                if (get_bits(dt, cp[r], i) != get_bits(dt, refb, i))
                                    report(k < n_impls ? "premul in place" : "premul in place, dispatched", dt,
                                           COLLD__REDOP_PREMUL_SUM, n_in, count, ac, i, get_bits(dt, cp[r], i),
                                           get_bits(dt, refb, i));
                    }
                }
            }
        }
    }
    for (int r = 0; r < MAX_IN; r++) {
        free(inb[r]);
        free(copies[r]);
    }
    for (int o = 0; o < 2; o++)
        free(outb[o]);
    free(refb);
}

/* One premultiplied sum of n_in single-element inputs with every build; all must give `want`. */
static void check_premul(colld_dtype_t dt, const uint64_t *vals, const uint64_t *sc, int n_in, uint64_t want)
{
    const colld__reduce_impl_t *impls[MAX_IMPLS];
    size_t n_impls = get_impls(impls);
    uint64_t store[MAX_IN], res = 0;
    const void *in[MAX_IN];
    void *out[1] = { &res };
    for (int r = 0; r < n_in; r++) {
        store[r] = 0;
        put_bits(dt, &store[r], 0, vals[r]);
        in[r] = &store[r];
    }
    for (size_t k = 0; k < n_impls; k++) {
        res = 0;
        assert_int_equal(colld__reduce_premul_with(impls[k], dt, sc, in, n_in, out, 1, 1), COLLD_OK);
        if (res != (want & emask(dt)))
            fail_msg("%s: premul dtype %d: got 0x%llx, expected 0x%llx", impls[k]->name, (int)dt,
                     (unsigned long long)res, (unsigned long long)(want & emask(dt)));
    }
}

/* Known answers: each rank's own scalar multiplies its own input; integers wrap in their width;
 * float products and sums round in their precision (no FMA); float16/bfloat16 multiply and add in
 * float and round once; the scalars' precision is the dtype's. */
static void test_premul_known(void **state)
{
    (void)state;
    /* int32: 3*10 + (-2)*7 + 5*(-1) = 11. */
    check_premul(COLLD_INT32, (const uint64_t[]){ 10, 7, (uint64_t)-1 }, (const uint64_t[]){ 3, 0xfffffffeu, 5 }, 3,
                 11);
    /* int8 wraps: 100*2 + 100*1 = 300 = 44 (mod 256); the product alone wraps too: 16*16 = 0. */
    check_premul(COLLD_INT8, (const uint64_t[]){ 100, 100 }, (const uint64_t[]){ 2, 1 }, 2, 44);
    check_premul(COLLD_INT8, (const uint64_t[]){ 16 }, (const uint64_t[]){ 16 }, 1, 0);
    /* uint8: 255 * 255 = 1 (mod 256), + 3 * 2. */
    check_premul(COLLD_UINT8, (const uint64_t[]){ 255, 3 }, (const uint64_t[]){ 255, 2 }, 2, 7);
    /* uint64 and int64 wrap in 64 bits. */
    check_premul(COLLD_UINT64, (const uint64_t[]){ 1ull << 63, 5 }, (const uint64_t[]){ 2, 3 }, 2, 15);
    check_premul(COLLD_INT64, (const uint64_t[]){ (uint64_t)INT64_MIN, 1 }, (const uint64_t[]){ (uint64_t)-1, 7 }, 2,
                 (uint64_t)INT64_MIN + 7);
    /* float32, rounded product then sum (no FMA): -1 * 1 + (1 + 2^-12) * (1 + 2^-12). The exact
     * product 1 + 2^-11 + 2^-24 rounds (a tie, to even) to 1 + 2^-11, so the sum is 2^-11
     * (0x3a000000); a fused multiply-add would keep the 2^-24 (0x3a000400). */
    {
        float x = 1.0f + 0x1p-12f;
        check_premul(COLLD_FLOAT32, (const uint64_t[]){ bits32(-1.0f), bits32(x) },
                     (const uint64_t[]){ bits32(1.0f), bits32(x) }, 2, 0x3a000000u);
    }
    /* float64, the same with 1 + 2^-27: 2^-26, not 2^-26 + 2^-54. */
    {
        double x[2] = { -1.0, 1.0 + 0x1p-27 }, sc[2] = { 1.0, 1.0 + 0x1p-27 }, want = 0x1p-26;
        uint64_t xv[2], sv[2], wv;
        memcpy(xv, x, 16);
        memcpy(sv, sc, 16);
        memcpy(&wv, &want, 8);
        check_premul(COLLD_FLOAT64, xv, sv, 2, wv);
    }
    /* float64: 0.5 * 8 + (-1.25) * 2 = 1.5. */
    {
        double x[2] = { 0.5, -1.25 }, sc[2] = { 8.0, 2.0 }, want = 1.5;
        uint64_t xv[2], sv[2], wv;
        memcpy(xv, x, 16);
        memcpy(sv, sc, 16);
        memcpy(&wv, &want, 8);
        check_premul(COLLD_FLOAT64, xv, sv, 2, wv);
    }
    /* float16, once-only rounding: 2048 * 1 + 1 * 1 + 1 * 1 = 2050 (0x6801), where rounding each
     * step to float16 would give 2048 (2048 + 1 is a tie, to even); 2048 + 0.5 + 0.5 = 2049 is
     * itself a tie and gives 2048 (0x6800). */
    check_premul(COLLD_FLOAT16, (const uint64_t[]){ 0x6800, 0x3c00, 0x3c00 },
                 (const uint64_t[]){ 0x3c00, 0x3c00, 0x3c00 }, 3, 0x6801);
    check_premul(COLLD_FLOAT16, (const uint64_t[]){ 0x6800, 0x3c00, 0x3c00 },
                 (const uint64_t[]){ 0x3c00, 0x3800, 0x3800 }, 3, 0x6800);
    /* float16: the scalar has float16 precision (0.1 is 0x2e66, 0.0999755859375), and 10 times it
     * is computed in float and rounded once. */
    check_premul(COLLD_FLOAT16, (const uint64_t[]){ 0x4900 }, (const uint64_t[]){ 0x2e66 }, 1,
                 colld_float_to_half(10.0f * colld_half_to_float(0x2e66)));
    /* bfloat16: 1 * 1 + 2^-8 * 1 + 2^-8 * 1 = 1 + 2^-7 (0x3f81), once-only rounding. */
    check_premul(COLLD_BFLOAT16, (const uint64_t[]){ 0x3f80, 0x3b80, 0x3b80 },
                 (const uint64_t[]){ 0x3f80, 0x3f80, 0x3f80 }, 3, 0x3f81);
    /* Scalar 0 and -1 (the averaging and negation uses). */
    check_premul(COLLD_FLOAT32, (const uint64_t[]){ bits32(5.0f), bits32(2.0f) },
                 (const uint64_t[]){ bits32(0.0f), bits32(-1.0f) }, 2, bits32(-2.0f));
}

/* Bad arguments of the premultiplied sum, and the scalar word check. */
static void test_premul_args(void **state)
{
    (void)state;
    float a = 1, b = 2, o = 7;
    const void *in[2] = { &a, &b };
    void *out[1] = { &o };
    const uint64_t sc[2] = { bits32(2.0f), bits32(3.0f) };
    assert_int_equal(colld_cpu_reduce_premul(COLLD_FLOAT32, NULL, in, 2, out, 1, 1), COLLD_ERR_INVALID_ARGUMENT);
    assert_int_equal(colld_cpu_reduce_premul(COLLD_DTYPE_COUNT, sc, in, 2, out, 1, 1), COLLD_ERR_INVALID_ARGUMENT);
    assert_int_equal(colld_cpu_reduce_premul(COLLD_FLOAT32, sc, in, 0, out, 1, 1), COLLD_ERR_INVALID_ARGUMENT);
    assert_int_equal(colld_cpu_reduce_premul(COLLD_FLOAT32, sc, NULL, 2, out, 1, 1), COLLD_ERR_INVALID_ARGUMENT);
    assert_true(o == 7);
    /* The premultiplied sum is not reachable as an ordinary op. */
    assert_int_equal(colld_cpu_reduce(COLLD_FLOAT32, (colld_redop_t)COLLD__REDOP_PREMUL_SUM, in, 2, out, 1, 1),
                     COLLD_ERR_INVALID_ARGUMENT);
    assert_true(o == 7);
    assert_int_equal(colld_cpu_reduce_premul(COLLD_FLOAT32, sc, in, 2, out, 1, 1), COLLD_OK);
    assert_true(o == 8);

    assert_true(colld_cpu_scalar_word_ok(COLLD_INT8, 0xff));
    assert_false(colld_cpu_scalar_word_ok(COLLD_INT8, 0x1ff));
    assert_true(colld_cpu_scalar_word_ok(COLLD_FLOAT16, 0xffff));
    assert_false(colld_cpu_scalar_word_ok(COLLD_BFLOAT16, 0x10000));
    assert_true(colld_cpu_scalar_word_ok(COLLD_FLOAT32, 0xffffffffull));
    assert_false(colld_cpu_scalar_word_ok(COLLD_UINT32, 0x100000000ull));
    assert_true(colld_cpu_scalar_word_ok(COLLD_FLOAT64, ~0ull));
    assert_false(colld_cpu_scalar_word_ok(COLLD_DTYPE_COUNT, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_known),      cmocka_unit_test(test_bf16_known),
        cmocka_unit_test(test_half_exhaustive), cmocka_unit_test(test_half_blocks_per_isa),
        cmocka_unit_test(test_reduce_matrix),   cmocka_unit_test(test_reduce_in_place),
        cmocka_unit_test(test_int_wrap),        cmocka_unit_test(test_int_avg),
        cmocka_unit_test(test_nan_minmax),      cmocka_unit_test(test_float_exact),
        cmocka_unit_test(test_args_and_impl),   cmocka_unit_test(test_first_nonfinite),
        cmocka_unit_test(test_premul_matrix),   cmocka_unit_test(test_premul_known),
        cmocka_unit_test(test_premul_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
