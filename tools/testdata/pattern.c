/*
 * pattern.c - deterministic inputs for the tests and the benchmark (colld-test-coll, colld-perf):
 * every rank can generate any rank's input, so each can compute the exact expected result with
 * the scalar oracle.
 */
#include "tools/testdata/pattern.h"

#include "kernels/cpu/reduce.h"

#include <stdint.h>
#include <string.h>

/* splitmix64's finalizer: a cheap, well-mixed hash. */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* See pattern.h. */
void colld_cpu_pattern(colld_dtype_t dt, int rank, unsigned salt, size_t first, size_t n, void *out)
{
    uint64_t seed = mix(((uint64_t)salt << 32) ^ ((uint64_t)dt << 24) ^ (uint64_t)(rank + 1));
    for (size_t i = 0; i < n; i++) {
        uint64_t h = mix(seed + (uint64_t)(first + i) * 0x9e3779b97f4a7c15ull);
        switch (dt) {
        case COLLD_INT8:
            ((int8_t *)out)[i] = (int8_t)((int)(h % 61) - 30);
            break;
        case COLLD_UINT8:
            ((uint8_t *)out)[i] = (uint8_t)(h % 61);
            break;
        case COLLD_INT32:
            ((int32_t *)out)[i] = (int32_t)(h % 2001) - 1000;
            break;
        case COLLD_UINT32:
            ((uint32_t *)out)[i] = (uint32_t)(h % 2001);
            break;
        case COLLD_INT64:
            ((int64_t *)out)[i] = (int64_t)(h % 200001) - 100000;
            break;
        case COLLD_UINT64:
            ((uint64_t *)out)[i] = h % 200001;
            break;
        case COLLD_FLOAT16:
            ((uint16_t *)out)[i] = colld_float_to_half((float)((int)(h % 201) - 100) * 0.0371f);
            break;
        case COLLD_BFLOAT16:
            ((uint16_t *)out)[i] = colld_float_to_bf16((float)((int)(h % 201) - 100) * 0.0371f);
            break;
        case COLLD_FLOAT32:
            ((float *)out)[i] = (float)((int)(h % 2001) - 1000) * 0.0137f;
            break;
        case COLLD_FLOAT64:
            ((double *)out)[i] = (double)((int)(h % 2001) - 1000) * 0.0137;
            break;
        default:
            break;
        }
    }
}

/* See pattern.h. */
void colld_cpu_pattern_small(colld_dtype_t dt, int rank, unsigned salt, size_t first, size_t n, void *out)
{
    uint64_t seed = mix(((uint64_t)salt << 32) ^ ((uint64_t)dt << 24) ^ (uint64_t)(rank + 1) ^ 0x5a5a5a5aull);
    for (size_t i = 0; i < n; i++) {
        int v = (int)(mix(seed + (uint64_t)(first + i) * 0x9e3779b97f4a7c15ull) % 5) - 2; /* -2..2 */
        switch (dt) {
        case COLLD_INT8:
            ((int8_t *)out)[i] = (int8_t)v;
            break;
        case COLLD_UINT8:
            ((uint8_t *)out)[i] = (uint8_t)(v + 2);
            break;
        case COLLD_INT32:
            ((int32_t *)out)[i] = v;
            break;
        case COLLD_UINT32:
            ((uint32_t *)out)[i] = (uint32_t)(v + 2);
            break;
        case COLLD_INT64:
            ((int64_t *)out)[i] = v;
            break;
        case COLLD_UINT64:
            ((uint64_t *)out)[i] = (uint64_t)(v + 2);
            break;
        case COLLD_FLOAT16:
            ((uint16_t *)out)[i] = colld_float_to_half((float)v);
            break;
        case COLLD_BFLOAT16:
            ((uint16_t *)out)[i] = colld_float_to_bf16((float)v);
            break;
        case COLLD_FLOAT32:
            ((float *)out)[i] = (float)v;
            break;
        case COLLD_FLOAT64:
            ((double *)out)[i] = (double)v;
            break;
        default:
            break;
        }
    }
}

/* See pattern.h. */
uint64_t colld_cpu_pattern_scalar(colld_dtype_t dt, int rank, unsigned salt, bool small)
{
    static const int small_signed[4] = { -2, -1, 1, 2 };
    uint64_t h = mix(((uint64_t)salt << 32) ^ ((uint64_t)dt << 24) ^ (uint64_t)(rank + 1) ^ 0x5ca1a45ull);
    int sv = small ? small_signed[h % 4] : (int)(h % 10) - 5 + ((int)(h % 10) >= 5); /* -5..-1, 1..5 */
    unsigned uv = small ? 1u + (unsigned)(h % 3) : 1u + (unsigned)(h % 9);           /* 1..3 or 1..9 */
    /* Floats: a nonzero multiple of 0.2173 in -2.39 .. 2.39, exact integers with `small`. */
    double f = small ? (double)sv : (double)((int)(h % 22) - 11 + ((int)(h % 22) >= 11)) * 0.2173;
    uint64_t w = 0;
    switch (dt) {
    case COLLD_INT8: {
        int8_t v = (int8_t)sv;
        memcpy(&w, &v, sizeof v);
        break;
    }
    case COLLD_UINT8: {
        uint8_t v = (uint8_t)uv;
        memcpy(&w, &v, sizeof v);
        break;
    }
    case COLLD_INT32: {
        int32_t v = sv;
        memcpy(&w, &v, sizeof v);
        break;
    }
    case COLLD_UINT32: {
        uint32_t v = uv;
        memcpy(&w, &v, sizeof v);
        break;
    }
    case COLLD_INT64: {
        int64_t v = sv;
        memcpy(&w, &v, sizeof v);
        break;
    }
    case COLLD_UINT64: {
        uint64_t v = uv;
        memcpy(&w, &v, sizeof v);
        break;
    }
    case COLLD_FLOAT16: {
        uint16_t v = colld_float_to_half((float)f);
        memcpy(&w, &v, sizeof v);
        break;
    }
    case COLLD_BFLOAT16: {
        uint16_t v = colld_float_to_bf16((float)f);
        memcpy(&w, &v, sizeof v);
        break;
    }
    case COLLD_FLOAT32: {
        float v = (float)f;
        memcpy(&w, &v, sizeof v);
        break;
    }
    case COLLD_FLOAT64:
        memcpy(&w, &f, sizeof f);
        break;
    default:
        break;
    }
    return w;
}
