/*
 * log.h - logging by level and subsystem (NCCL style), for the daemon, the client and the tools.
 *
 * Level and subsystems come from configuration (COLLD_LOG_LEVEL, COLLD_LOG_SUBSYS,
 * COLLD_LOG_FILE with %h = host name, %p = pid), applied with colld_log_init. The level check
 * happens before any formatting. Output lines look like
 *   2026-11-21T08:02:57.123Z colld[1234] WARN SESSION session.c:88 message
 * and go to stderr unless a file is configured. Thread-safe.
 */
#ifndef COLLD_COMMON_LOG_H
#define COLLD_COMMON_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    COLLD_LOG_NONE = 0,
    COLLD_LOG_ERROR = 1,
    COLLD_LOG_WARN = 2,
    COLLD_LOG_INFO = 3,
    COLLD_LOG_DEBUG = 4,
    COLLD_LOG_TRACE = 5,
} colld_log_level_t;

/* Subsystems, a bit each. */
#define COLLD_LOG_SUBSYS_LIST(X)                                                                   \
    X(INIT, 0) X(CONFIG, 1) X(SESSION, 2) X(RPC, 3) X(ENGINE, 4) X(COLL, 5) X(MEM, 6) X(NET, 7)     \
    X(ADMIN, 8) X(CLIENT, 9) X(GPU, 10)

typedef enum {
#define COLLD_LOG_SUBSYS_ENUM_(name, bit) COLLD_SUB_##name = 1u << (bit),
    COLLD_LOG_SUBSYS_LIST(COLLD_LOG_SUBSYS_ENUM_)
#undef COLLD_LOG_SUBSYS_ENUM_
    COLLD_SUB_ALL = 0xffffffffu
} colld_log_subsys_t;

/* Configure logging. level: "none|error|warn|info|debug|trace" (case-insensitive) or NULL for the
 * default (warn); subsys: comma list like "SESSION,ENGINE" or "ALL", "^NET" excludes, NULL = all;
 * file: path pattern with %h/%p, NULL or "" = stderr; program: name printed in each line.
 * Returns 0, or -1 with a message in err for an unknown level/subsystem or an unopenable file
 * (logging then stays at its previous settings). May be called again to reconfigure. */
int colld_log_init(const char *program, const char *level, const char *subsys, const char *file,
                   char *err, size_t err_len);
/* Close the log file, if any. */
void colld_log_fini(void);

extern int colld__log_level;        /* read by the macro before formatting */
extern unsigned colld__log_subsys;

void colld__log(colld_log_level_t level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#define COLLD_LOG(level, subsys, ...)                                                              \
    do {                                                                                           \
        if ((int)(level) <= colld__log_level && ((subsys) & colld__log_subsys))                    \
            colld__log((level), (subsys), __FILE__, __LINE__, __VA_ARGS__);                        \
    } while (0)

/* Rate limiting of repeated lines, per call site (a message that a client or peer can trigger over
 * and over, e.g. a refused connection, must not flood the log). A call site prints at most one
 * line per interval; the calls in between are counted, and the next line it prints ends with
 * "(N similar messages suppressed)". Suppressed calls are not formatted. */
typedef struct {
    uint64_t next_ns;    /* CLOCK_MONOTONIC time from which the next line may print (0: none yet) */
    uint64_t suppressed; /* calls dropped since the last printed line */
} colld_log_rl_t;

#define COLLD_LOG_RL_DEFAULT_MS 5000

/* The decision for one call site at `now_ns`: true when it may print (then *suppressed says how
 * many calls were dropped before it, and the next interval starts), false when it is dropped
 * (and counted). Thread-safe. Exposed for tests; use the LOG_*_RL macros. */
bool colld_log_rl_pass(colld_log_rl_t *rl, uint64_t now_ns, uint64_t interval_ns, uint64_t *suppressed);

/* colld__log through the call site's rate-limit state `rl`. */
void colld__log_rl(colld_log_level_t level, unsigned subsys, const char *file, int line, colld_log_rl_t *rl,
                   uint64_t interval_ms, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

#define COLLD_LOG_RL(level, subsys, interval_ms, ...)                                              \
    do {                                                                                           \
        static colld_log_rl_t colld__rl_;                                                          \
        if ((int)(level) <= colld__log_level && ((subsys) & colld__log_subsys))                    \
            colld__log_rl((level), (subsys), __FILE__, __LINE__, &colld__rl_, (interval_ms), __VA_ARGS__); \
    } while (0)

#define LOG_ERROR(sub, ...) COLLD_LOG(COLLD_LOG_ERROR, COLLD_SUB_##sub, __VA_ARGS__)
#define LOG_WARN(sub, ...) COLLD_LOG(COLLD_LOG_WARN, COLLD_SUB_##sub, __VA_ARGS__)
#define LOG_INFO(sub, ...) COLLD_LOG(COLLD_LOG_INFO, COLLD_SUB_##sub, __VA_ARGS__)
#define LOG_DEBUG(sub, ...) COLLD_LOG(COLLD_LOG_DEBUG, COLLD_SUB_##sub, __VA_ARGS__)
#define LOG_TRACE(sub, ...) COLLD_LOG(COLLD_LOG_TRACE, COLLD_SUB_##sub, __VA_ARGS__)

/* The same, at most one line per COLLD_LOG_RL_DEFAULT_MS per call site. */
#define LOG_ERROR_RL(sub, ...) COLLD_LOG_RL(COLLD_LOG_ERROR, COLLD_SUB_##sub, COLLD_LOG_RL_DEFAULT_MS, __VA_ARGS__)
#define LOG_WARN_RL(sub, ...) COLLD_LOG_RL(COLLD_LOG_WARN, COLLD_SUB_##sub, COLLD_LOG_RL_DEFAULT_MS, __VA_ARGS__)
#define LOG_INFO_RL(sub, ...) COLLD_LOG_RL(COLLD_LOG_INFO, COLLD_SUB_##sub, COLLD_LOG_RL_DEFAULT_MS, __VA_ARGS__)

#endif /* COLLD_COMMON_LOG_H */
