/*
 * finite.c - finding the first NaN or infinity in a floating-point buffer (the daemon's
 * --nan-check), by the exponent bits, so that it reads each element once and vectorises. Blocks
 * of 64 elements are tested with a branch-free OR before the one that holds a bad element is
 * searched.
 */
#include "kernels/cpu/reduce.h"

#include <string.h>

#define FINITE_BLOCK 64

/* The first index in [0, count) whose element has every exponent bit set (NaN or an infinity),
 * count when there is none. T is the unsigned integer of the element's width. */
#define COLLD__FIRST_NONFINITE(T, MASK)                                                                                \
    do {                                                                                                               \
        const T *p = buf;                                                                                              \
        size_t i = 0;                                                                                                  \
        for (; i + FINITE_BLOCK <= count; i += FINITE_BLOCK) {                                                         \
            T bad = 0;                                                                                                 \
            for (size_t j = 0; j < FINITE_BLOCK; j++)                                                                  \
                bad |= (T)((p[i + j] & (T)(MASK)) == (T)(MASK));                                                       \
            if (bad)                                                                                                   \
                break;                                                                                                 \
        }                                                                                                              \
        for (; i < count; i++)                                                                                         \
            if ((p[i] & (T)(MASK)) == (T)(MASK))                                                                       \
                return i;                                                                                              \
        return count;                                                                                                  \
    } while (0)

size_t colld_cpu_first_nonfinite(colld_dtype_t dtype, const void *buf, size_t count)
{
    switch (dtype) {
    case COLLD_FLOAT16:
        COLLD__FIRST_NONFINITE(uint16_t, 0x7c00u);
    case COLLD_BFLOAT16:
        COLLD__FIRST_NONFINITE(uint16_t, 0x7f80u);
    case COLLD_FLOAT32:
        COLLD__FIRST_NONFINITE(uint32_t, 0x7f800000u);
    case COLLD_FLOAT64:
        COLLD__FIRST_NONFINITE(uint64_t, 0x7ff0000000000000ull);
    default:
        return count; /* integers are always finite */
    }
}

const char *colld_cpu_nonfinite_name(colld_dtype_t dtype, const void *elem)
{
    uint64_t bits = 0, mant, sign;
    switch (dtype) {
    case COLLD_FLOAT16: {
        uint16_t h;
        memcpy(&h, elem, 2);
        bits = h, mant = bits & 0x3ffu, sign = bits >> 15;
        break;
    }
    case COLLD_BFLOAT16: {
        uint16_t b;
        memcpy(&b, elem, 2);
        bits = b, mant = bits & 0x7fu, sign = bits >> 15;
        break;
    }
    case COLLD_FLOAT32: {
        uint32_t f;
        memcpy(&f, elem, 4);
        bits = f, mant = bits & 0x7fffffu, sign = bits >> 31;
        break;
    }
    case COLLD_FLOAT64:
        memcpy(&bits, elem, 8);
        mant = bits & 0xfffffffffffffull, sign = bits >> 63;
        break;
    default:
        return "a finite value";
    }
    return mant ? "NaN" : sign ? "-Inf" : "+Inf";
}
