/*
 * reduce.c - the public entry points of the CPU reduce kernels: argument checks, the choice of ISA
 * build for this CPU (made once), and the exported half-precision conversions.
 *
 * This file is compiled for the baseline instruction set: it must run on any CPU, since it is what
 * decides whether the AVX2 or AVX-512 builds may be called at all.
 */
#include "kernels/cpu/reduce_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* The ISA builds compiled in (CMake defines COLLD_KERNELS_HAVE_* for the ones it built), best
 * first. The scalar build is always there and always last. */
static const colld__reduce_impl_t *const compiled_impls[] = {
#ifdef COLLD_KERNELS_HAVE_AVX512
    &colld__reduce_impl_avx512,
#endif
#ifdef COLLD_KERNELS_HAVE_AVX2
    &colld__reduce_impl_avx2,
#endif
    &colld__reduce_impl_scalar,
};

/* The build colld_cpu_reduce uses, NULL until first chosen. Every thread that finds it NULL
 * computes the same answer, so a relaxed atomic store without a lock is enough. */
static const colld__reduce_impl_t *chosen_impl;

#if defined(__x86_64__) || defined(__i386__)
/* Whether the CPU has F16C (CPUID leaf 1, ECX bit 29). Read directly: not every compiler's
 * __builtin_cpu_supports knows "f16c". F16C uses the AVX register state, which the AVX2 and
 * AVX-512 checks below already require the OS to enable. */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif

/* Whether this CPU (and OS: the cpu-supports checks include XSAVE state for AVX and AVX-512) can
 * run the given ISA build. */
static int isa_usable(colld__isa_t isa)
{
    switch (isa) {
    case COLLD__ISA_SCALAR:
        return 1;
#if defined(__x86_64__) || defined(__i386__)
    case COLLD__ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && cpu_has_f16c();
    case COLLD__ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && cpu_has_f16c();
#endif
    default:
        return 0;
    }
}

/* Fill impls with the compiled builds this CPU can run, best first; returns how many (at most max,
 * and always at least 1 when max >= 1: the scalar build). Used by the dispatcher and the tests. */
size_t colld__reduce_impls(const colld__reduce_impl_t **impls, size_t max)
{
    size_t n = 0;

    for (size_t i = 0; i < sizeof compiled_impls / sizeof compiled_impls[0] && n < max; i++)
        if (isa_usable(compiled_impls[i]->isa))
            impls[n++] = compiled_impls[i];
    return n;
}

/* The build for this CPU: the best usable one, chosen at the first call and cached. */
static const colld__reduce_impl_t *dispatch_impl(void)
{
    const colld__reduce_impl_t *impl = __atomic_load_n(&chosen_impl, __ATOMIC_RELAXED);

    if (impl == NULL) {
        const colld__reduce_impl_t *best[1];
        impl = colld__reduce_impls(best, 1) == 1 ? best[0] : &colld__reduce_impl_scalar;
        __atomic_store_n(&chosen_impl, impl, __ATOMIC_RELAXED);
    }
    return impl;
}

/* Check the arguments and run one kernel of the given build. Nothing is touched unless every
 * argument is valid; with count == 0 or n_out == 0 nothing is read or written. */
colld_status_t colld__reduce_with(const colld__reduce_impl_t *impl, colld_dtype_t dtype, colld_redop_t op,
                                  const void *const *in, int n_in, void *const *out, int n_out, size_t count)
{
    if ((unsigned)dtype >= COLLD_DTYPE_COUNT || (unsigned)op >= COLLD_REDOP_COUNT || n_in < 1 || n_out < 0 ||
        in == NULL || (n_out > 0 && out == NULL))
        return COLLD_ERR_INVALID_ARGUMENT;
    if (count == 0 || n_out == 0)
        return COLLD_OK;
    for (int r = 0; r < n_in; r++)
        if (in[r] == NULL)
            return COLLD_ERR_INVALID_ARGUMENT;
    for (int o = 0; o < n_out; o++)
        if (out[o] == NULL)
            return COLLD_ERR_INVALID_ARGUMENT;
    impl->table[dtype][op](in, NULL, n_in, out, n_out, count);
    return COLLD_OK;
}

/* The same for the premultiplied sum: also a scalar word per input. */
colld_status_t colld__reduce_premul_with(const colld__reduce_impl_t *impl, colld_dtype_t dtype, const uint64_t *scalars,
                                         const void *const *in, int n_in, void *const *out, int n_out, size_t count)
{
    if ((unsigned)dtype >= COLLD_DTYPE_COUNT || scalars == NULL || n_in < 1 || n_out < 0 || in == NULL ||
        (n_out > 0 && out == NULL))
        return COLLD_ERR_INVALID_ARGUMENT;
    if (count == 0 || n_out == 0)
        return COLLD_OK;
    for (int r = 0; r < n_in; r++)
        if (in[r] == NULL)
            return COLLD_ERR_INVALID_ARGUMENT;
    for (int o = 0; o < n_out; o++)
        if (out[o] == NULL)
            return COLLD_ERR_INVALID_ARGUMENT;
    impl->table[dtype][COLLD__REDOP_PREMUL_SUM](in, scalars, n_in, out, n_out, count);
    return COLLD_OK;
}

/* Public: reduce with the best build for this CPU. */
colld_status_t colld_cpu_reduce(colld_dtype_t dtype, colld_redop_t op, const void *const *in, int n_in,
                                void *const *out, int n_out, size_t count)
{
    return colld__reduce_with(dispatch_impl(), dtype, op, in, n_in, out, n_out, count);
}

/* Public: reduce with the portable build (the test oracle). */
colld_status_t colld_cpu_reduce_scalar(colld_dtype_t dtype, colld_redop_t op, const void *const *in, int n_in,
                                       void *const *out, int n_out, size_t count)
{
    return colld__reduce_with(&colld__reduce_impl_scalar, dtype, op, in, n_in, out, n_out, count);
}

/* Public: the premultiplied sum with the best build for this CPU. */
colld_status_t colld_cpu_reduce_premul(colld_dtype_t dtype, const uint64_t *scalars, const void *const *in, int n_in,
                                       void *const *out, int n_out, size_t count)
{
    return colld__reduce_premul_with(dispatch_impl(), dtype, scalars, in, n_in, out, n_out, count);
}

/* Public: the premultiplied sum with the portable build (the test oracle). */
colld_status_t colld_cpu_reduce_premul_scalar(colld_dtype_t dtype, const uint64_t *scalars, const void *const *in,
                                              int n_in, void *const *out, int n_out, size_t count)
{
    return colld__reduce_premul_with(&colld__reduce_impl_scalar, dtype, scalars, in, n_in, out, n_out, count);
}

/* Public: whether a scalar word holds one value of dtype and nothing else: its bytes past the
 * element's are zero. */
bool colld_cpu_scalar_word_ok(colld_dtype_t dtype, uint64_t word)
{
    size_t es = 0;
    uint64_t only = 0;
#define COLLD__SIZE_CASE(E, name, T, A, U, W, K)                                                                       \
    case E:                                                                                                            \
        es = sizeof(T);                                                                                                \
        break;
    switch (dtype) {
        COLLD_REDUCE_DTYPES(COLLD__SIZE_CASE)
    default:
        return false;
    }
#undef COLLD__SIZE_CASE
    memcpy(&only, &word, es);
    return only == word;
}

/* Public: the name of the build colld_cpu_reduce uses ("avx512", "avx2" or "scalar"). */
const char *colld_cpu_reduce_impl(void)
{
    return dispatch_impl()->name;
}

/* Public conversions: the same code the kernels use (see reduce_internal.h). */
float colld_half_to_float(uint16_t h)
{
    return colld__half_to_float(h);
}

/* Public: float to float16, round to nearest even. */
uint16_t colld_float_to_half(float f)
{
    return colld__float_to_half(f);
}

/* Public: bfloat16 to float, exact. */
float colld_bf16_to_float(uint16_t b)
{
    return colld__bf16_to_float(b);
}

/* Public: float to bfloat16, round to nearest even. */
uint16_t colld_float_to_bf16(float f)
{
    return colld__float_to_bf16(f);
}
