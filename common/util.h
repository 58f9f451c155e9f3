/*
 * util.h - small helpers used by both sides: clocks, checked arithmetic, string copies.
 */
#ifndef COLLD_COMMON_UTIL_H
#define COLLD_COMMON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define COLLD_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define COLLD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define COLLD_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Monotonic clock in nanoseconds / milliseconds. */
uint64_t colld_now_ns(void);
uint64_t colld_now_ms(void);
/* Wall clock in milliseconds since the epoch. */
int64_t colld_wall_ms(void);

/* Copy src into dst (size dst_len), always NUL-terminated, truncating. */
void colld_strlcpy(char *dst, const char *src, size_t dst_len);

/* Write a formatted message into err when the caller gave a buffer for one (err may be NULL). */
void colld_set_err(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* a * b without overflow: false if it overflows. */
static inline bool colld_mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* Fill buf with len bytes from the kernel's random source. Returns 0 or -1 (errno set). */
int colld_random_bytes(void *buf, size_t len);

/* Default socket path when none is configured: /run/colld/colld.sock for root,
 * $XDG_RUNTIME_DIR/colld.sock otherwise (/tmp/colld-<uid>/colld.sock without XDG_RUNTIME_DIR). */
void colld_default_socket_path(char *buf, size_t len);

#endif /* COLLD_COMMON_UTIL_H */
