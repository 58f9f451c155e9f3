/*
 * avg.c - the last step of a multi-stage average: divide a sum, already reduced elsewhere (across
 * hosts), by the number of ranks, with exactly the division colld_cpu_reduce uses for avg.
 */
#include "kernels/cpu/reduce_internal.h"

#define COLLD__AVG_INT(T, W)                                                                       \
    for (size_t i = 0; i < count; i++)                                                             \
        ((T *)buf)[i] = (T)((W)((T *)buf)[i] / (W)divisor)

colld_status_t colld_cpu_avg_finish(colld_dtype_t dtype, void *buf, size_t count, int divisor)
{
    if (divisor < 1)
        return COLLD_ERR_INVALID_ARGUMENT;
    switch (dtype) {
    case COLLD_INT8: COLLD__AVG_INT(int8_t, double); break;
    case COLLD_UINT8: COLLD__AVG_INT(uint8_t, double); break;
    case COLLD_INT32: COLLD__AVG_INT(int32_t, double); break;
    case COLLD_UINT32: COLLD__AVG_INT(uint32_t, double); break;
    case COLLD_INT64: COLLD__AVG_INT(int64_t, int64_t); break;
    case COLLD_UINT64: COLLD__AVG_INT(uint64_t, uint64_t); break;
    case COLLD_FLOAT32: COLLD__AVG_INT(float, float); break;
    case COLLD_FLOAT64: COLLD__AVG_INT(double, double); break;
    case COLLD_FLOAT16:
        for (size_t i = 0; i < count; i++) {
            uint16_t *p = (uint16_t *)buf + i;
            *p = colld_float_to_half(colld_half_to_float(*p) / (float)divisor);
        }
        break;
    case COLLD_BFLOAT16:
        for (size_t i = 0; i < count; i++) {
            uint16_t *p = (uint16_t *)buf + i;
            *p = colld_float_to_bf16(colld_bf16_to_float(*p) / (float)divisor);
        }
        break;
    default:
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    return COLLD_OK;
}
