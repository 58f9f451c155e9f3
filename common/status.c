/*
 * status.c - names and messages of colld_status_t, generated from COLLD_STATUS_LIST so the enum and
 * both functions cannot drift.
 */
#include <colld/colld.h>

const char *colld_status_name(colld_status_t s)
{
    switch (s) {
#define COLLD_STATUS_NAME_(name, value, text)                                                      \
    case COLLD_##name:                                                                             \
        return "COLLD_" #name;
        COLLD_STATUS_LIST(COLLD_STATUS_NAME_)
#undef COLLD_STATUS_NAME_
    }
    return "COLLD_ERR_UNKNOWN";
}

const char *colld_status_string(colld_status_t s)
{
    switch (s) {
#define COLLD_STATUS_TEXT_(name, value, text)                                                      \
    case COLLD_##name:                                                                             \
        return text;
        COLLD_STATUS_LIST(COLLD_STATUS_TEXT_)
#undef COLLD_STATUS_TEXT_
    }
    return "unknown status code; the client library and daemon may be of different versions";
}

size_t colld_dtype_size(colld_dtype_t dtype)
{
    switch (dtype) {
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
    case COLLD_INT64:
    case COLLD_UINT64:
    case COLLD_FLOAT64:
        return 8;
    case COLLD_DTYPE_COUNT:
        break;
    }
    return 0;
}
