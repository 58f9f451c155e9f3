/*
 * reduce_avx512.c - the AVX-512 build of the reduce core (compiled with -mavx512f -mavx512bw
 * -mavx512vl -mavx512dq -mf16c and 512-bit vectors preferred; selected at run time only on CPUs that
 * have all of them). float16 blocks are converted 16 elements at a time with VCVTPH2PS/VCVTPS2PH.
 */
#include "kernels/cpu/reduce_internal.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__F16C__)
#error "reduce_avx512.c must be compiled with -mavx512f -mavx512bw -mf16c"
#endif

#include <immintrin.h>

#define COLLD_ISA avx512
#define COLLD_ISA_ID COLLD__ISA_AVX512

/* Widen a block of float16 to float: 16 at a time, the scalar code for the tail. The empty asm
 * keeps the load a separate instruction: VCVTPH2PS zmm with a memory operand streamed from DRAM
 * measured about 1.5x slower on AMD Zen 4 (16 MiB float16 inputs). */
static void isa_half_to_float_block(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    size_t i = 0;

    for (; i + 16 <= n; i += 16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(src + i));
        __asm__("" : "+v"(v));
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(v));
    }
    for (; i < n; i++)
        dst[i] = colld__half_to_float(src[i]);
}

/* Round a block of float to float16 (nearest even): 16 at a time, the scalar code for the tail. */
static void isa_float_to_half_block(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    size_t i = 0;

    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        dst[i] = colld__float_to_half(src[i]);
}

#include "kernels/cpu/reduce_core.h"
