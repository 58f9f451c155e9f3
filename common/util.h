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

/* Strings from tenants and peers (names, reasons, process names) are checked or sanitized where they
 * enter, so that nothing the daemon stores, logs, prints or puts into a protobuf is invalid UTF-8 or
 * can steer a terminal. Acceptable: valid UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF) without control characters (C0, DEL, C1), line or paragraph separators (U+2028/9) or
 * bidirectional formatting characters (U+200E/F, U+202A..E, U+2066..9).
 *
 * colld_str_valid: whether the NUL-terminated s is acceptable and at most max_len bytes long.
 * colld_str_check: the same, and when it is not, `why` (if given) says what is wrong and where
 *   ("byte 3: control or formatting character U+001B", "longer than 63 bytes").
 * colld_str_sanitize: copy src (len bytes, or up to its NUL when len is SIZE_MAX; a NUL ends the
 *   copy) into dst (dst_len bytes, always NUL-terminated) so that dst is acceptable: each byte of
 *   an unacceptable character or sequence becomes '?', and truncation never splits a character;
 *   dst may be src. Returns true when dst is an exact copy of all of src. */
bool colld_str_valid(const char *s, size_t max_len);
bool colld_str_check(const char *s, size_t max_len, char *why, size_t why_len);
bool colld_str_sanitize(char *dst, size_t dst_len, const char *src, size_t len);

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
