/*
 * err.h - one error context for code that fails with a status and a message saying what was
 * wrong and what to do: colld_err_t replaces the (char *why, size_t why_len) pairs and their
 * formatting helpers.
 *
 *     colld_status_t open_thing(..., colld_err_t *err)
 *     {
 *         if (bad)
 *             return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "thing %d is out of range", n);
 *         ...
 *     }
 *
 * The message is what the user sees (a communicator's error detail, a refusal on the wire): its
 * wording is the product. A caller that adds context formats around err->msg ("rank 3: %s").
 * A callee may be given NULL when its caller does not want the message. The context is plain data
 * (no allocation), so it lives on the caller's stack or inside the object that failed.
 */
#ifndef COLLD_COMMON_ERR_H
#define COLLD_COMMON_ERR_H

#include "common/log.h"

#include <colld/colld.h>
#include <stddef.h>

/* Longest message kept, with its NUL (the daemon's detail fields are this long). */
#define COLLD_ERR_MSG_LEN 512

typedef struct {
    colld_status_t status; /* COLLD_OK until something failed */
    char msg[COLLD_ERR_MSG_LEN];
} colld_err_t;

/* An empty context (status COLLD_OK, no message). */
/* clang-format off */
#define COLLD_ERR_INIT { .status = COLLD_OK, .msg = "" }
/* clang-format on */

/* Record status `st` and a formatted message in err (NULL: nothing is recorded). Returns st, so
 * that `return colld_err_set(err, st, ...)` fails with it. */
colld_status_t colld_err_set(colld_err_t *err, colld_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Forget what was recorded. */
void colld_err_clear(colld_err_t *err);

/* The boundary with the kernel: a system call whose failure the caller cannot act on (a cleanup's
 * munmap, an epoll_ctl removal, the unlink of its own socket) still goes through SYS_CHECK, which
 * returns the call's result unchanged and, when it is -1 with an errno other than `expected` (0:
 * none), logs the call as written, strerror(errno) and the source location: a warning in
 * subsystem `sub` (INIT, SESSION, ...), at most a line per 5 s with the count of the others.
 * errno is kept. (CUDA driver calls have CU_CHECK, common/cudadrv.h; gRPC calls GRPC_CHECK,
 * common/rpc_codec.h.) */
long colld_sys_checked(long rc, int expected, unsigned subsys, const char *call, const char *file, int line);
#define SYS_CHECK(sub, call) colld_sys_checked((long)(call), 0, COLLD_SUB_##sub, #call, __FILE__, __LINE__)
#define SYS_CHECK_EXPECT(sub, expected, call)                                                                          \
    colld_sys_checked((long)(call), (expected), COLLD_SUB_##sub, #call, __FILE__, __LINE__)

#endif /* COLLD_COMMON_ERR_H */
