/*
 * err.c - the error context (see err.h).
 */
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>

colld_status_t colld_err_set(colld_err_t *err, colld_status_t st, const char *fmt, ...)
{
    if (!err)
        return st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    err->status = st;
    return st;
}

void colld_err_clear(colld_err_t *err)
{
    if (!err)
        return;
    err->status = COLLD_OK;
    err->msg[0] = '\0';
}
