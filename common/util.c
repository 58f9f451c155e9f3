/*
 * util.c - small helpers used by both sides.
 */
#include "common/util.h"

#include "common/config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
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

/* ============================================================================================
 * Strings from tenants and peers
 * ========================================================================================== */

/* Decode one UTF-8 character of at most n bytes at p into *cp. Returns its length, or 0 when the
 * bytes are not a valid encoding (stray continuation byte, overlong form, surrogate, past
 * U+10FFFF, cut short). */
static size_t utf8_next(const unsigned char *p, size_t n, uint32_t *cp)
{
    size_t len;
    uint32_t c, min;
    if (p[0] < 0x80) {
        *cp = p[0];
        return 1;
    }
    if ((p[0] & 0xe0) == 0xc0) {
        len = 2, c = p[0] & 0x1fu, min = 0x80;
    } else if ((p[0] & 0xf0) == 0xe0) {
        len = 3, c = p[0] & 0x0fu, min = 0x800;
    } else if ((p[0] & 0xf8) == 0xf0) {
        len = 4, c = p[0] & 0x07u, min = 0x10000;
    } else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        c = (c << 6) | (p[i] & 0x3fu);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return 0;
    *cp = c;
    return len;
}

/* Whether a code point may appear in a tenant's string (see util.h). */
static bool printable(uint32_t c)
{
    if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f))
        return false;
    if (c == 0x200e || c == 0x200f || (c >= 0x2028 && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069))
        return false;
    return true;
}

bool colld_str_check(const char *s, size_t max_len, char *why, size_t why_len)
{
    if (!s) {
        colld_set_err(why, why_len, "missing");
        return false;
    }
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strnlen(s, max_len + 1);
    if (n > max_len) {
        colld_set_err(why, why_len, "longer than %zu bytes", max_len);
        return false;
    }
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t len = utf8_next(p + i, n - i, &c);
        if (len == 0) {
            colld_set_err(why, why_len, "byte %zu: not valid UTF-8 (0x%02x)", i, p[i]);
            return false;
        }
        if (!printable(c)) {
            colld_set_err(why, why_len, "byte %zu: control or formatting character U+%04X", i, (unsigned)c);
            return false;
        }
        i += len;
    }
    return true;
}

bool colld_str_valid(const char *s, size_t max_len)
{
    return colld_str_check(s, max_len, NULL, 0);
}

bool colld_str_sanitize(char *dst, size_t dst_len, const char *src, size_t len)
{
    if (dst_len == 0)
        return false;
    if (!src) {
        dst[0] = '\0';
        return len == 0 || len == SIZE_MAX;
    }
    const unsigned char *p = (const unsigned char *)src;
    size_t n = len == SIZE_MAX ? strlen(src) : len, out = 0, in = 0;
    bool exact = true;
    while (in < n && p[in] != '\0') {
        uint32_t c;
        size_t k = utf8_next(p + in, n - in, &c);
        if (k == 0 || !printable(c))
            k = 0; /* each byte of it becomes a '?' */
        if (out + (k ? k : 1) > dst_len - 1)
            break; /* no room for the whole character */
        if (k) {
            memmove(dst + out, p + in, k); /* dst may be src: out <= in */
            out += k;
            in += k;
        } else {
            dst[out++] = '?';
            in++;
            exact = false;
        }
    }
    dst[out] = '\0';
    return exact && in == n;
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
