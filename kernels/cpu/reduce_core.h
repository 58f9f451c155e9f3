/*
 * reduce_core.h - the generic reduce core. A template: included once by each ISA file
 * (reduce_scalar.c, reduce_avx2.c, reduce_avx512.c), which is compiled with its own -m flags, so
 * the same portable loops become scalar/SSE2, AVX2 or AVX-512 code. No include guard on purpose.
 *
 * Before including it, the ISA file defines:
 *   COLLD_ISA       the name suffix of this build (scalar, avx2, avx512)
 *   COLLD_ISA_ID    its colld__isa_t value
 * and the two float16 block conversions (which may use F16C instructions, and must round exactly as
 * colld__half_to_float / colld__float_to_half do):
 *   static void isa_half_to_float_block(float *dst, const uint16_t *src, size_t n);
 *   static void isa_float_to_half_block(uint16_t *dst, const float *src, size_t n);
 *
 * Each kernel walks the elements in blocks of COLLD__REDUCE_BLOCK. For a block it copies (or
 * converts) input 0 into a stack accumulator, combines inputs 1..n_in-1 into it in rank order,
 * finishes avg, and only then writes the block to every output: a block is read completely before
 * any of it is written, so outputs may be the very buffers of the inputs. Every element sees the
 * same sequence of IEEE operations whatever the vector width, and no contraction into FMA is allowed
 * (-ffp-contract=off), so all ISA builds give bitwise identical results.
 *
 * Result choices: integer sum/prod wrap in the element width; integer avg is that wrapped sum, read
 * in the element type, divided by n_in truncating toward zero; float avg is sum / (float)n_in in the
 * accumulator precision (for float16/bfloat16: float, then rounded once to 16 bits). min/max return
 * the first NaN in rank order if any input is NaN; between equal values (+0 and -0) the later rank
 * wins. premul_sum is sum over r in rank order of (scalar_r * x_r): each product in the accumulator
 * precision (rounded there for float and double; exact in float for float16/bfloat16, whose sum is
 * then rounded once like sum's; wrapping for integers), then added to the running sum.
 */
#include "kernels/cpu/reduce_internal.h"

#if !defined(COLLD_ISA) || !defined(COLLD_ISA_ID)
#error "define COLLD_ISA and COLLD_ISA_ID before including reduce_core.h"
#endif

#define COLLD__CAT2(a, b) a##b
#define COLLD__CAT(a, b) COLLD__CAT2(a, b)
#define COLLD__STR2(a) #a
#define COLLD__STR(a) COLLD__STR2(a)
#define COLLD__INLINE static inline __attribute__((always_inline))
#if defined(__GNUC__) && !defined(__clang__)
#define COLLD__IVDEP _Pragma("GCC ivdep") /* the loops' pointers are restrict too; belt and braces */
#else
#define COLLD__IVDEP
#endif

/* ---------------------------------------------------------------------------------------------
 * bfloat16 block conversions: plain integer code, the same in every ISA build.
 * ------------------------------------------------------------------------------------------- */

/* Widen a block of bfloat16 to float (a shift; vectorises everywhere). */
static void bf16_to_float_block(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = colld__bf16_to_float(src[i]);
}

/* Round a block of float to bfloat16, nearest even (branch-free, so it vectorises). */
static void float_to_bf16_block(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = colld__float_to_bf16(src[i]);
}

/* ---------------------------------------------------------------------------------------------
 * Per-kind pieces. INT and FLT accumulate in the storage type itself, so loading is a copy and the
 * inputs are combined in place; HALF and BF16 convert each block to float through a scratch block.
 * ------------------------------------------------------------------------------------------- */

#define COLLD__CONV_INT 0
#define COLLD__CONV_FLT 0
#define COLLD__CONV_HALF 1
#define COLLD__CONV_BF16 1

#define COLLD__ISNAN_INT(x) 0
#define COLLD__ISNAN_FLT(x) ((x) != (x))
#define COLLD__ISNAN_HALF(x) ((x) != (x))
#define COLLD__ISNAN_BF16(x) ((x) != (x))

/* Load a block of input 0 into the accumulator. */
#define COLLD__LOAD_INT(acc, src, n) memcpy((acc), (src), (n) * sizeof *(src))
#define COLLD__LOAD_FLT(acc, src, n) memcpy((acc), (src), (n) * sizeof *(src))
#define COLLD__LOAD_HALF(acc, src, n) isa_half_to_float_block((acc), (src), (n))
#define COLLD__LOAD_BF16(acc, src, n) bf16_to_float_block((acc), (src), (n))

/* A block of another input in accumulator type: the input itself, or converted into tmp. */
#define COLLD__SRC_INT(tmp, src, n) ((void)(tmp), (src))
#define COLLD__SRC_FLT(tmp, src, n) ((void)(tmp), (src))
#define COLLD__SRC_HALF(tmp, src, n) (isa_half_to_float_block((tmp), (src), (n)), (const float *)(tmp))
#define COLLD__SRC_BF16(tmp, src, n) (bf16_to_float_block((tmp), (src), (n)), (const float *)(tmp))

/* One element of storage type in accumulator type (a premul_sum scalar). */
#define COLLD__WIDEN_INT(x) (x)
#define COLLD__WIDEN_FLT(x) (x)
#define COLLD__WIDEN_HALF(x) colld__half_to_float(x)
#define COLLD__WIDEN_BF16(x) colld__bf16_to_float(x)

/* The finished block in storage type: the accumulator itself, or rounded into stage. */
#define COLLD__OUT_INT(stage, acc, n) ((void)(stage), (acc))
#define COLLD__OUT_FLT(stage, acc, n) ((void)(stage), (acc))
#define COLLD__OUT_HALF(stage, acc, n) (isa_float_to_half_block((stage), (acc), (n)), (stage))
#define COLLD__OUT_BF16(stage, acc, n) (float_to_bf16_block((stage), (acc), (n)), (stage))

/* ---------------------------------------------------------------------------------------------
 * The generic core, written once and stamped out per dtype. `op` is a compile-time constant at
 * every call site (the per-op wrappers below), so after inlining each kernel keeps a single loop.
 * ------------------------------------------------------------------------------------------- */

#define COLLD__DEFINE_DTYPE(E, name, T, A, U, W, K)                                                \
    /* A premul_sum scalar word (its first bytes hold one element of T) in accumulator type. */    \
    COLLD__INLINE A colld__r_##name##_scalar(uint64_t w)                                           \
    {                                                                                              \
        T t;                                                                                       \
        memcpy(&t, &w, sizeof t);                                                                  \
        return COLLD__WIDEN_##K(t);                                                                \
    }                                                                                              \
                                                                                                   \
    /* Combine one block of an input into the accumulator: acc[i] = acc[i] op src[i] (premul_sum:  \
     * acc[i] + src[i] * s). Sums and products go through the unsigned type U, so integers wrap    \
     * without undefined behaviour. min/max keep acc when it is NaN and take src when src is NaN:  \
     * the first NaN wins. */                                                                      \
    COLLD__INLINE void colld__r_##name##_combine(A *restrict acc, const A *restrict src, size_t n, \
                                                 int op, A s)                                      \
    {                                                                                              \
        switch (op) {                                                                              \
        case COLLD_SUM:                                                                            \
        case COLLD_AVG:                                                                            \
            COLLD__IVDEP for (size_t i = 0; i < n; i++) acc[i] =                           \
                (A)(U)((U)acc[i] + (U)src[i]);                                                     \
            break;                                                                                 \
        case COLLD__REDOP_PREMUL_SUM:                                                              \
            COLLD__IVDEP for (size_t i = 0; i < n; i++) acc[i] =                           \
                (A)(U)((U)acc[i] + (U)((U)src[i] * (U)s));                                         \
            break;                                                                                 \
        case COLLD_PROD:                                                                           \
            COLLD__IVDEP for (size_t i = 0; i < n; i++) acc[i] =                           \
                (A)(U)((U)acc[i] * (U)src[i]);                                                     \
            break;                                                                                 \
        case COLLD_MIN:                                                                            \
            COLLD__IVDEP for (size_t i = 0; i < n; i++) acc[i] =                           \
                (acc[i] < src[i] || COLLD__ISNAN_##K(acc[i])) ? acc[i] : src[i];                   \
            break;                                                                                 \
        case COLLD_MAX:                                                                            \
            COLLD__IVDEP for (size_t i = 0; i < n; i++) acc[i] =                           \
                (acc[i] > src[i] || COLLD__ISNAN_##K(acc[i])) ? acc[i] : src[i];                   \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* Reduce `count` elements of n_in inputs into n_out outputs, block by block (see the file     \
     * comment for the order of reads and writes). premul_sum first scales input 0 by its scalar.  \
     */                                                                                            \
    COLLD__INLINE void colld__r_##name##_run(const void *const *in, const uint64_t *scalars,       \
                                             int n_in, void *const *out, int n_out, size_t count,  \
                                             int op)                                               \
    {                                                                                              \
        A acc[COLLD__REDUCE_BLOCK] __attribute__((aligned(64)));                                   \
        A tmp[COLLD__CONV_##K ? COLLD__REDUCE_BLOCK : 1] __attribute__((aligned(64)));             \
        T stage[COLLD__CONV_##K ? COLLD__REDUCE_BLOCK : 1] __attribute__((aligned(64)));           \
                                                                                                   \
        for (size_t base = 0; base < count; base += COLLD__REDUCE_BLOCK) {                         \
            size_t n = count - base < COLLD__REDUCE_BLOCK ? count - base : COLLD__REDUCE_BLOCK;    \
                                                                                                   \
            COLLD__LOAD_##K(acc, (const T *)in[0] + base, n);                                      \
            if (op == COLLD__REDOP_PREMUL_SUM) {                                                   \
                A s0 = colld__r_##name##_scalar(scalars[0]);                                       \
                COLLD__IVDEP for (size_t i = 0; i < n; i++) acc[i] = (A)(U)((U)acc[i] * (U)s0);    \
            }                                                                                      \
            for (int r = 1; r < n_in; r++)                                                         \
                colld__r_##name##_combine(                                                         \
                    acc, COLLD__SRC_##K(tmp, (const T *)in[r] + base, n), n, op,                   \
                    op == COLLD__REDOP_PREMUL_SUM ? colld__r_##name##_scalar(scalars[r]) : (A)0);  \
            if (op == COLLD_AVG)                                                                   \
                for (size_t i = 0; i < n; i++)                                                     \
                    acc[i] = (A)((W)acc[i] / (W)n_in);                                             \
            const T *res = COLLD__OUT_##K(stage, acc, n);                                          \
            for (int o = 0; o < n_out; o++)                                                        \
                memcpy((T *)out[o] + base, res, n * sizeof(T));                                    \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    COLLD_REDUCE_OPS(COLLD__DEFINE_OP, name)

/* One kernel per dtype x op: the core with a constant op. */
#define COLLD__DEFINE_OP(name, E_OP, opname)                                                       \
    static void colld__r_##name##_##opname(const void *const *in, const uint64_t *scalars,         \
                                           int n_in, void *const *out, int n_out, size_t count)    \
    {                                                                                              \
        colld__r_##name##_run(in, scalars, n_in, out, n_out, count, E_OP);                         \
    }

COLLD_REDUCE_DTYPES(COLLD__DEFINE_DTYPE)

/* ---------------------------------------------------------------------------------------------
 * The table of this ISA build, generated from the same two lists.
 * ------------------------------------------------------------------------------------------- */

#define COLLD__TABLE_OP(name, E_OP, opname) [E_OP] = colld__r_##name##_##opname,
#define COLLD__TABLE_DTYPE(E, name, T, A, U, W, K) [E] = {COLLD_REDUCE_OPS(COLLD__TABLE_OP, name)},

const colld__reduce_impl_t COLLD__CAT(colld__reduce_impl_, COLLD_ISA) = {
    .name = COLLD__STR(COLLD_ISA),
    .isa = COLLD_ISA_ID,
    .table = {COLLD_REDUCE_DTYPES(COLLD__TABLE_DTYPE)},
    .half_to_float_block = isa_half_to_float_block,
    .float_to_half_block = isa_float_to_half_block,
};
