/*
 * cuda_core.cuh - the bodies of the CUDA kernels, written once as __host__ __device__ templates: the
 * kernels (reduce.cu, copy.cu) run them on the GPU, and the host emulation test (tests/gpu) runs the
 * very same code on the CPU, thread by thread, so that indexing, vectorisation and the arithmetic
 * can be checked against the CPU oracle on a machine without a GPU.
 *
 * The types come from the dtype list of the CPU kernels (COLLD_REDUCE_DTYPES in
 * kernels/cpu/reduce_internal.h), the operations reproduce kernels/cpu/reduce_core.h element by
 * element:
 *   - INT: sum/prod through the unsigned type U (wraps); avg = (A)((W)sum / (W)n_in);
 *   - FLT: float/double arithmetic in its own precision, correctly rounded (the _rn intrinsics are
 *     never contracted into FMA; the files are also compiled with -fmad=false);
 *   - HALF/BF16: converted to float with the CPU's bit-exact conversions, accumulated in float,
 *     rounded once to nearest even with the CPU's conversions (NaN payloads included);
 *   - min/max: (acc < x || isnan(acc)) ? acc : x, so the first NaN wins and ties take the later rank;
 *   - premul_sum: acc = x_0 * s_0, then acc = acc + x_r * s_r in rank order, with the dtype's own
 *     mul and add (so float16/bfloat16 multiply and sum in float and round once).
 *
 * A thread handles whole work items (one 16-byte vector or one element): it reads the item from
 * every input, then writes it to every output. No other thread touches that item, so an output may
 * be the very buffer of an input.
 */
#ifndef COLLD_KERNELS_CUDA_CUDA_CORE_CUH
#define COLLD_KERNELS_CUDA_CUDA_CORE_CUH

#include "kernels/cuda/cuda_plan.h"
#include "kernels/cuda/handoff.cuh"

#include "kernels/cpu/reduce_internal.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector_types.h>

#define COLLD__HD __host__ __device__ __forceinline__

/* Loop unrolling hints for the device compiler (the host compiler of the emulation test does not
 * know the pragma). */
#ifdef __CUDA_ARCH__
#define COLLD__UNROLL _Pragma("unroll")
#define COLLD__UNROLL_4 _Pragma("unroll 4")
#else
#define COLLD__UNROLL
#define COLLD__UNROLL_4
#endif

/* ---------------------------------------------------------------------------------------------
 * Correctly rounded arithmetic. On the device the _rn intrinsics (never fused into FMA); on the host
 * (the emulation test, built with -ffp-contract=off for SSE2) the plain operators, which are the
 * same IEEE operations.
 * ------------------------------------------------------------------------------------------- */

COLLD__HD float colld__cuda_add(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

COLLD__HD double colld__cuda_add(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

COLLD__HD float colld__cuda_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

COLLD__HD double colld__cuda_mul(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

/* Division as the avg of each dtype does it: IEEE for float/double, truncating for 64-bit integers. */
COLLD__HD float colld__cuda_div(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

COLLD__HD double colld__cuda_div(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __ddiv_rn(a, b);
#else
    return a / b;
#endif
}

COLLD__HD int64_t colld__cuda_div(int64_t a, int64_t b)
{
    return a / b;
}

COLLD__HD uint64_t colld__cuda_div(uint64_t a, uint64_t b)
{
    return a / b;
}

/* ---------------------------------------------------------------------------------------------
 * Bit-exact ports of the CPU's half-precision conversions (reduce_internal.h); see there for why
 * each branch is what it is.
 * ------------------------------------------------------------------------------------------- */

COLLD__HD uint32_t colld__cuda_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

COLLD__HD uint64_t colld__cuda_f64_bits(double f)
{
#ifdef __CUDA_ARCH__
    return (uint64_t)__double_as_longlong(f);
#else
    uint64_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

COLLD__HD float colld__cuda_f32_from_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

COLLD__HD float colld__cuda_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1f)
        return colld__cuda_f32_from_bits(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0));
    if (exp == 0) {
        /* mant * 2^-24 is exact, and a normal float (no flush-to-zero question). */
        float v = colld__cuda_mul((float)mant, 0x1p-24f);
        return colld__cuda_f32_from_bits(sign | colld__cuda_f32_bits(v));
    }
    return colld__cuda_f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

COLLD__HD uint16_t colld__cuda_float_to_half(float f)
{
    uint32_t bits = colld__cuda_f32_bits(f);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t abs = bits & 0x7fffffffu;

    if (abs > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    if (abs >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (abs >= 0x38800000u) {
        uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
        return (uint16_t)(sign | ((r - (112u << 23)) >> 13));
    }
    if (abs <= 0x33000000u)
        return sign;
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

COLLD__HD float colld__cuda_bf16_to_float(uint16_t b)
{
    return colld__cuda_f32_from_bits((uint32_t)b << 16);
}

COLLD__HD uint16_t colld__cuda_float_to_bf16(float f)
{
    uint32_t bits = colld__cuda_f32_bits(f);

    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x0040u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* ---------------------------------------------------------------------------------------------
 * Dtype traits, one per entry of COLLD_REDUCE_DTYPES: storage type T, accumulator A, wrapping type U,
 * avg division type W, and the kind's load / store / add / mul / is_nan / avg.
 * ------------------------------------------------------------------------------------------- */

enum { COLLD__CUDA_KIND_INT, COLLD__CUDA_KIND_FLT, COLLD__CUDA_KIND_HALF, COLLD__CUDA_KIND_BF16 };

template <typename T_, typename A_, typename U_, typename W_, int KIND> struct colld__cuda_dtype {
    typedef T_ T;
    typedef A_ A;
    typedef U_ U;
    typedef W_ W;
    /* Does --nan-check look at this dtype's inputs (the floating-point ones)? */
    static constexpr bool CHECKED = KIND != COLLD__CUDA_KIND_INT;

    static COLLD__HD A load(T x)
    {
        if constexpr (KIND == COLLD__CUDA_KIND_HALF)
            return colld__cuda_half_to_float(x);
        else if constexpr (KIND == COLLD__CUDA_KIND_BF16)
            return colld__cuda_bf16_to_float(x);
        else
            return x;
    }

    static COLLD__HD T store(A x)
    {
        if constexpr (KIND == COLLD__CUDA_KIND_HALF)
            return colld__cuda_float_to_half(x);
        else if constexpr (KIND == COLLD__CUDA_KIND_BF16)
            return colld__cuda_float_to_bf16(x);
        else
            return x;
    }

    static COLLD__HD A add(A a, A b)
    {
        if constexpr (KIND == COLLD__CUDA_KIND_INT)
            return (A)(U)((U)a + (U)b);
        else
            return colld__cuda_add(a, b);
    }

    static COLLD__HD A mul(A a, A b)
    {
        if constexpr (KIND == COLLD__CUDA_KIND_INT)
            return (A)(U)((U)a * (U)b);
        else
            return colld__cuda_mul(a, b);
    }

    static COLLD__HD bool is_nan(A a)
    {
        if constexpr (KIND == COLLD__CUDA_KIND_INT)
            return false;
        else
            return a != a;
    }

    /* --nan-check: the class of a non-finite element x (all exponent bits set, as the CPU's
     * colld_cpu_first_nonfinite tests them): COLLD_CUDA_NAN, COLLD_CUDA_PINF or COLLD_CUDA_NINF;
     * -1 when x is finite (always, for integers). */
    static COLLD__HD int nonfinite(T x)
    {
        if constexpr (KIND == COLLD__CUDA_KIND_INT) {
            (void)x;
            return -1;
        } else {
            uint64_t bits, emask, mmask; /* the element's bits, its exponent's and its mantissa's */
            if constexpr (KIND == COLLD__CUDA_KIND_HALF)
                bits = x, emask = 0x7c00u, mmask = 0x3ffu;
            else if constexpr (KIND == COLLD__CUDA_KIND_BF16)
                bits = x, emask = 0x7f80u, mmask = 0x7fu;
            else if constexpr (sizeof(T) == 4)
                bits = colld__cuda_f32_bits(x), emask = 0x7f800000u, mmask = 0x7fffffu;
            else
                bits = colld__cuda_f64_bits(x), emask = 0x7ff0000000000000ull, mmask = 0xfffffffffffffull;
            if ((bits & emask) != emask)
                return -1;
            if (bits & mmask)
                return COLLD_CUDA_NAN;
            return (bits >> (sizeof(T) * 8 - 1)) ? COLLD_CUDA_NINF : COLLD_CUDA_PINF;
        }
    }

    /* A premul_sum scalar word (its first bytes hold one T) in accumulator type. */
    static COLLD__HD A scalar(uint64_t w)
    {
        T t;
        memcpy(&t, &w, sizeof t);
        return load(t);
    }

    /* The avg of n inputs from their sum: (A)((W)sum / (W)n), as the CPU core. */
    static COLLD__HD A avg(A sum, int n)
    {
        return (A)colld__cuda_div((W)sum, (W)n);
    }
};

/* The traits type of each dtype, named colld__cuda_t_<name>. */
#define COLLD__CUDA_DTYPE_TRAITS(E, name, T, A, U, W, K)                                                               \
    typedef colld__cuda_dtype<T, A, U, W, COLLD__CUDA_KIND_##K> colld__cuda_t_##name;
COLLD_REDUCE_DTYPES(COLLD__CUDA_DTYPE_TRAITS)
#undef COLLD__CUDA_DTYPE_TRAITS

/* acc op x for one element, with op a compile-time constant. */
template <typename D, int OP> COLLD__HD typename D::A colld__cuda_combine(typename D::A acc, typename D::A x)
{
    if constexpr (OP == COLLD_SUM || OP == COLLD_AVG)
        return D::add(acc, x);
    else if constexpr (OP == COLLD_PROD)
        return D::mul(acc, x);
    else if constexpr (OP == COLLD_MIN)
        return (acc < x || D::is_nan(acc)) ? acc : x;
    else
        return (acc > x || D::is_nan(acc)) ? acc : x;
}

/* ---------------------------------------------------------------------------------------------
 * 16-byte loads and stores. On the device one vector instruction each (the pointer is 16-byte
 * aligned: the plan guarantees it); the store goes through __stwb (st.global.wb.v4, the default
 * cache policy) because a plain store of the uint4 gets split into four 4-byte stores by the
 * compiler. On the host (the emulation test) memcpy.
 * ------------------------------------------------------------------------------------------- */

#ifndef __CUDA_ARCH__
/* Host emulation only: an access the device would fault on (misaligned) stops the test. */
static inline void colld__cuda_host_check_aligned(const void *p, size_t align)
{
    if ((uintptr_t)p % align != 0) {
        fprintf(stderr, "cuda_core: %zu-byte access at %p is misaligned: it would fault on a GPU\n", align, p);
        abort();
    }
}
#endif

template <typename T> COLLD__HD void colld__cuda_load16(T *dst, const T *src)
{
#ifdef __CUDA_ARCH__
    uint4 v = *reinterpret_cast<const uint4 *>(src);
    memcpy(dst, &v, 16);
#else
    colld__cuda_host_check_aligned(src, 16);
    memcpy(dst, src, 16);
#endif
}

template <typename T> COLLD__HD void colld__cuda_store16(T *dst, const T *src)
{
#ifdef __CUDA_ARCH__
    uint4 v;
    memcpy(&v, src, 16);
    __stwb(reinterpret_cast<uint4 *>(dst), v);
#else
    colld__cuda_host_check_aligned(dst, 16);
    memcpy(dst, src, 16);
#endif
}

/* ---------------------------------------------------------------------------------------------
 * Reduce.
 * ------------------------------------------------------------------------------------------- */

/* --nan-check: lower *w to `word` (atomicMin; on the host, where the double runs the kernels, the
 * same with a compare-and-swap loop). */
COLLD__HD void colld__cuda_note_bad(unsigned long long *w, unsigned long long word)
{
#ifdef __CUDA_ARCH__
    atomicMin(w, word);
#else
    unsigned long long cur = __atomic_load_n(w, __ATOMIC_RELAXED);
    while (word < cur && !__atomic_compare_exchange_n(w, &cur, word, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
#endif
}

/* --nan-check of the N elements e[] of input r read at element `first`: the first non-finite one
 * lowers the input's word to its collective index and class (COLLD_CUDA_NAN_WORD). Only called
 * when p.first_bad is set (a branch uniform across the launch); compiled out for integers. */
template <typename D, int N>
COLLD__HD void colld__cuda_check_item(const colld__cuda_reduce_params_t &p, int r, const typename D::T *e, size_t first)
{
    COLLD__UNROLL
    for (int k = 0; k < N; k++) {
        int cls = D::nonfinite(e[k]);
        if (cls >= 0) {
            colld__cuda_note_bad(&p.first_bad[r], COLLD_CUDA_NAN_WORD(p.base + first + (size_t)k, cls));
            return;
        }
    }
}

/* Reduce N consecutive elements starting at element `first` (N = 1: one element; N = V: one
 * 16-byte vector, `first` then being 16-byte aligned in every buffer). Reads every input completely
 * before writing any output. */
template <typename D, int OP, int N>
COLLD__HD void colld__cuda_reduce_item(const colld__cuda_reduce_params_t &p, size_t first)
{
    typedef typename D::T T;
    typedef typename D::A A;
    A acc[N];
    T e[N];

    if constexpr (N == 1)
        e[0] = static_cast<const T *>(p.in[0])[first];
    else
        colld__cuda_load16(e, static_cast<const T *>(p.in[0]) + first);
    if constexpr (D::CHECKED)
        if (p.first_bad)
            colld__cuda_check_item<D, N>(p, 0, e, first);
    if constexpr (OP == COLLD__REDOP_PREMUL_SUM) {
        const A s = D::scalar(p.scalar[0]);
        COLLD__UNROLL
        for (int k = 0; k < N; k++)
            acc[k] = D::mul(D::load(e[k]), s);
    } else {
        COLLD__UNROLL
        for (int k = 0; k < N; k++)
            acc[k] = D::load(e[k]);
    }

    COLLD__UNROLL_4
    for (int r = 1; r < p.n_in; r++) {
        if constexpr (N == 1)
            e[0] = static_cast<const T *>(p.in[r])[first];
        else
            colld__cuda_load16(e, static_cast<const T *>(p.in[r]) + first);
        if constexpr (D::CHECKED)
            if (p.first_bad)
                colld__cuda_check_item<D, N>(p, r, e, first);
        if constexpr (OP == COLLD__REDOP_PREMUL_SUM) {
            const A s = D::scalar(p.scalar[r]);
            COLLD__UNROLL
            for (int k = 0; k < N; k++)
                acc[k] = D::add(acc[k], D::mul(D::load(e[k]), s));
        } else {
            COLLD__UNROLL
            for (int k = 0; k < N; k++)
                acc[k] = colld__cuda_combine<D, OP>(acc[k], D::load(e[k]));
        }
    }

    COLLD__UNROLL
    for (int k = 0; k < N; k++) {
        if constexpr (OP == COLLD_AVG)
            acc[k] = D::avg(acc[k], p.n_in);
        e[k] = D::store(acc[k]);
    }
    for (int o = 0; o < p.n_out; o++) {
        if constexpr (N == 1)
            static_cast<T *>(p.out[o])[first] = e[0];
        else
            colld__cuda_store16(static_cast<T *>(p.out[o]) + first, e);
    }
}

/* The work of thread `tid` of `nthreads` (a grid-stride loop): the vectors of the body first, then
 * the single elements of the head and the tail. */
template <typename D, int OP>
COLLD__HD void colld__cuda_reduce_body(const colld__cuda_reduce_params_t &p, size_t tid, size_t nthreads)
{
    constexpr int V = COLLD__CUDA_VEC_BYTES / sizeof(typename D::T);
    const size_t body = p.nvec * V;
    if (colld__cuda_gate_shut(p.gate)) /* a hand-off the daemon abandoned (handoff.cuh) */
        return;

    for (size_t v = tid; v < p.nvec; v += nthreads)
        colld__cuda_reduce_item<D, OP, V>(p, p.head + v * V);
    for (size_t j = tid; j < p.count - body; j += nthreads)
        colld__cuda_reduce_item<D, OP, 1>(p, j < p.head ? j : j + body);
}

/* ---------------------------------------------------------------------------------------------
 * Copy.
 * ------------------------------------------------------------------------------------------- */

/* The work of thread `tid` of `nthreads`: units of type Unit (sizeof(Unit) == p.unit) of the body,
 * then the single bytes of the head and the tail. */
template <typename Unit>
COLLD__HD void colld__cuda_copy_body(const colld__cuda_copy_params_t &p, size_t tid, size_t nthreads)
{
    const unsigned char *src = static_cast<const unsigned char *>(p.src);
    const size_t body = p.nunits * sizeof(Unit);
    if (colld__cuda_gate_shut(p.gate))
        return;

    for (size_t u = tid; u < p.nunits; u += nthreads) {
        const size_t at = p.head + u * sizeof(Unit);
        Unit x;
#ifdef __CUDA_ARCH__
        x = *reinterpret_cast<const Unit *>(src + at);
#else
        colld__cuda_host_check_aligned(src + at, sizeof x);
        memcpy(&x, src + at, sizeof x);
#endif
        for (int o = 0; o < p.n_out; o++) {
            unsigned char *dst = static_cast<unsigned char *>(p.out[o]) + at;
#ifdef __CUDA_ARCH__
            *reinterpret_cast<Unit *>(dst) = x;
#else
            colld__cuda_host_check_aligned(dst, sizeof x);
            memcpy(dst, &x, sizeof x);
#endif
        }
    }
    for (size_t j = tid; j < p.bytes - body; j += nthreads) {
        size_t b = j < p.head ? j : j + body;
        unsigned char x = src[b];
        for (int o = 0; o < p.n_out; o++)
            static_cast<unsigned char *>(p.out[o])[b] = x;
    }
}

#endif /* COLLD_KERNELS_CUDA_CUDA_CORE_CUH */
