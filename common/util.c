/*
 * util.c - small helpers used by both sides.
 */
#include "common/util.h"

#include "common/config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

uint64_t colld_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t colld_now_ms(void)
{
    return colld_now_ns() / 1000000ull;
}

int64_t colld_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void colld_strlcpy(char *dst, const char *src, size_t dst_len)
{
    if (dst_len == 0)
        return;
    size_t n = src ? strnlen(src, dst_len - 1) : 0;
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

void colld_set_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || err_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

int colld_random_bytes(void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

void colld_default_socket_path(char *buf, size_t len)
{
    if (geteuid() == 0) {
        colld_strlcpy(buf, "/run/colld/colld.sock", len);
        return;
    }
    const char *xdg = colld_config_env("XDG_RUNTIME_DIR");
    if (xdg)
        snprintf(buf, len, "%s/colld.sock", xdg);
    else
        snprintf(buf, len, "/tmp/colld-%u/colld.sock", (unsigned)geteuid());
}
