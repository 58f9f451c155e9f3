/*
 * err.c - the error context (see err.h).
 */
#include "common/err.h"

#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

/* Log a failed system call with where it happened (see SYS_CHECK); returns rc, errno kept. */
long colld_sys_checked(long rc, int expected, unsigned subsys, const char *call, const char *file, int line)
{
    static colld_log_rl_t rl;
    int e = errno;
    if (rc != -1 || (expected != 0 && e == expected))
        return rc;
    if (COLLD_LOG_WARN <= colld__log_level && (subsys & colld__log_subsys))
        colld__log_rl(COLLD_LOG_WARN, subsys, file, line, &rl, COLLD_LOG_RL_DEFAULT_MS, "%s failed: %s", call,
                      strerror(e));
    errno = e;
    return rc;
}
