/*
 * reduce_avx2.c - the AVX2 build of the reduce core (compiled with -mavx2 -mf16c; selected at run
 * time only on CPUs that have both). float16 blocks are converted with F16C, 8 elements at a time;
 * F16C rounds to nearest even exactly as the scalar conversion does (checked by the unit tests).
 */
#include "kernels/cpu/reduce_internal.h"

#if !defined(__AVX2__) || !defined(__F16C__)
#error "reduce_avx2.c must be compiled with -mavx2 -mf16c"
#endif

#include <immintrin.h>

#define COLLD_ISA avx2
#define COLLD_ISA_ID COLLD__ISA_AVX2

/* Widen a block of float16 to float: VCVTPH2PS for whole vectors, the scalar code for the tail. */
static void isa_half_to_float_block(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    size_t i = 0;

    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = colld__half_to_float(src[i]);
}

/* Round a block of float to float16 (nearest even): VCVTPS2PH, the scalar code for the tail. */
static void isa_float_to_half_block(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    size_t i = 0;

    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = colld__float_to_half(src[i]);
}

#include "kernels/cpu/reduce_core.h"
