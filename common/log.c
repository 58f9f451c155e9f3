/*
 * log.c - logging by level and subsystem.
 *
 * The level and subsystem mask live in two globals that COLLD_LOG reads before it formats
 * anything, so a disabled message costs one comparison. Everything else (the output descriptor
 * and the program name) is guarded by one mutex, which is also held while a line is written:
 * each line is formatted into a local buffer and handed to the kernel with a single write(), so
 * lines from different threads never interleave and a reconfiguration never closes a descriptor
 * that a writer is still using.
 *
 * When stderr is the systemd journal (systemd sets JOURNAL_STREAM to the device and inode of the
 * stream it connected, which is how sd-daemon(3) says to recognise it) and no log file is set,
 * lines carry a "<N>" syslog priority prefix instead of the timestamp, program name and pid that
 * the journal records by itself.
 *
 * Rate-limited call sites (LOG_*_RL) keep a small state each (a static in the macro) that says
 * when the site may print again and how many calls it dropped meanwhile; one lock guards them.
 */
#include "common/log.h"

#include "common/config.h"
#include "common/util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Longest line written; longer messages are cut and still end with a newline. */
#define LOG_LINE_MAX 4096
#define LOG_PROGRAM_MAX 64

int colld__log_level = COLLD_LOG_WARN;
unsigned colld__log_subsys = COLLD_SUB_ALL;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t rl_lock = PTHREAD_MUTEX_INITIALIZER; /* every call site's colld_log_rl_t */
static int log_fd = STDERR_FILENO;          /* guarded by log_lock */
static char log_program[LOG_PROGRAM_MAX];   /* guarded by log_lock; "" = not set yet */
static bool log_journal;                    /* guarded by log_lock; stderr is the journal */

static const char *const level_names[] = {"NONE", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"};
/* syslog priorities of the levels, for the journal: err, warning, info, debug, debug. */
static const int level_priority[] = {6, 3, 4, 6, 7, 7};

static const struct {
    const char *name;
    unsigned bit;
} subsys_names[] = {
#define COLLD_LOG_SUBSYS_NAME_(name, bit) {#name, COLLD_SUB_##name},
    COLLD_LOG_SUBSYS_LIST(COLLD_LOG_SUBSYS_NAME_)
#undef COLLD_LOG_SUBSYS_NAME_
};

/* ------------------------------------------------------------------------------------------------
 * Parsing the configuration
 * ---------------------------------------------------------------------------------------------- */


/* Turn a level name (any case) into its value; NULL or "" means the default, warn. Returns 0, or
 * -1 with a message listing the accepted names. */
static int parse_level(const char *text, int *level, char *err, size_t err_len)
{
    if (!text || !*text) {
        *level = COLLD_LOG_WARN;
        return 0;
    }
    for (size_t i = 0; i < COLLD_ARRAY_SIZE(level_names); i++) {
        if (strcasecmp(text, level_names[i]) == 0) {
            *level = (int)i;
            return 0;
        }
    }
    if (strcasecmp(text, "warning") == 0) {
        *level = COLLD_LOG_WARN;
        return 0;
    }
    colld_set_err(err, err_len, "unknown log level '%s' (use none, error, warn, info, debug or trace)",
            text);
    return -1;
}

/* Look up one subsystem name of `len` characters (any case); "ALL" means every bit. Returns the
 * mask, or 0 if the name is unknown. */
static unsigned subsys_lookup(const char *name, size_t len)
{
    if (len == 3 && strncasecmp(name, "ALL", 3) == 0)
        return COLLD_SUB_ALL;
    for (size_t i = 0; i < COLLD_ARRAY_SIZE(subsys_names); i++) {
        const char *known = subsys_names[i].name;
        if (strlen(known) == len && strncasecmp(name, known, len) == 0)
            return subsys_names[i].bit;
    }
    return 0;
}

/* Turn a comma list such as "SESSION,ENGINE", "ALL" or "^NET" into a mask. Names are included,
 * "^NAME" is excluded; a list of exclusions only starts from every subsystem (so "^NET" means all
 * but NET). NULL or "" means all. Returns 0, or -1 naming the unknown subsystem. */
static int parse_subsys(const char *text, unsigned *mask, char *err, size_t err_len)
{
    unsigned include = 0, exclude = 0;
    bool any_include = false;

    if (!text || !*text) {
        *mask = COLLD_SUB_ALL;
        return 0;
    }
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        const char *s = p, *e = end;
        while (s < e && isspace((unsigned char)*s))
            s++;
        while (e > s && isspace((unsigned char)e[-1]))
            e--;
        bool negate = s < e && *s == '^';
        if (negate)
            s++;
        if (s < e) {
            unsigned bits = subsys_lookup(s, (size_t)(e - s));
            if (!bits) {
                colld_set_err(err, err_len,
                        "unknown log subsystem '%.*s' in '%s' (use ALL or a comma list of "
                        "INIT, CONFIG, SESSION, RPC, ENGINE, COLL, MEM, NET, ADMIN, CLIENT, GPU; "
                        "^NAME excludes)",
                        (int)(e - s), s, text);
                return -1;
            }
            if (negate) {
                exclude |= bits;
            } else {
                include |= bits;
                any_include = true;
            }
        }
        p = *end ? end + 1 : end;
    }
    *mask = (any_include ? include : COLLD_SUB_ALL) & ~exclude;
    return 0;
}

/* Expand a file pattern into out: %h becomes the host name, %p the pid, %% a percent sign; any
 * other character is copied. Returns 0, or -1 when the result does not fit. */
static int expand_pattern(const char *pattern, char *out, size_t out_len, char *err,
                          size_t err_len)
{
    size_t o = 0;
    char piece[HOST_NAME_MAX + 1];

    for (const char *p = pattern; *p; p++) {
        const char *add = piece;
        if (p[0] == '%' && p[1] == 'h') {
            if (gethostname(piece, sizeof(piece)) != 0)
                colld_strlcpy(piece, "unknown-host", sizeof(piece));
            piece[sizeof(piece) - 1] = '\0';
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            snprintf(piece, sizeof(piece), "%ld", (long)getpid());
            p++;
        } else if (p[0] == '%' && p[1] == '%') {
            add = "%";
            p++;
        } else {
            piece[0] = *p;
            piece[1] = '\0';
        }
        size_t len = strlen(add);
        if (o + len >= out_len) {
            colld_set_err(err, err_len, "log file name '%s' is too long once expanded", pattern);
            return -1;
        }
        memcpy(out + o, add, len);
        o += len;
    }
    out[o] = '\0';
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * Public functions
 * ---------------------------------------------------------------------------------------------- */

/* Whether stderr is the stream systemd connected to the journal: JOURNAL_STREAM is
 * "DEVICE:INODE" of that stream, and it is inherited by children whose stderr may be something
 * else, so the descriptor itself is compared. */
static bool stderr_is_journal(void)
{
    const char *v = colld_config_env("JOURNAL_STREAM");
    unsigned long long dev, ino;
    char tail;
    struct stat st;
    if (!v || sscanf(v, "%llu:%llu%c", &dev, &ino, &tail) != 2 || fstat(STDERR_FILENO, &st) != 0)
        return false;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* Parse everything first and open the new file, then swap the settings in under the lock, so a
 * bad argument leaves logging exactly as it was. */
int colld_log_init(const char *program, const char *level, const char *subsys, const char *file,
                   char *err, size_t err_len)
{
    int new_level;
    unsigned new_mask;
    int new_fd = STDERR_FILENO;
    char path[PATH_MAX];

    if (parse_level(level, &new_level, err, err_len) != 0)
        return -1;
    if (parse_subsys(subsys, &new_mask, err, err_len) != 0)
        return -1;
    if (file && *file) {
        if (expand_pattern(file, path, sizeof(path), err, err_len) != 0)
            return -1;
        new_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (new_fd < 0) {
            colld_set_err(err, err_len, "cannot open log file '%s': %s", path, strerror(errno));
            return -1;
        }
    }

    pthread_mutex_lock(&log_lock);
    int old_fd = log_fd;
    log_fd = new_fd;
    log_journal = new_fd == STDERR_FILENO && stderr_is_journal();
    if (program)
        colld_strlcpy(log_program, program, sizeof(log_program));
    __atomic_store_n(&colld__log_subsys, new_mask, __ATOMIC_RELAXED);
    __atomic_store_n(&colld__log_level, new_level, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&log_lock);

    if (old_fd != STDERR_FILENO && old_fd != new_fd)
        close(old_fd);
    return 0;
}

/* Go back to stderr and close the log file, keeping the level and subsystems. */
void colld_log_fini(void)
{
    pthread_mutex_lock(&log_lock);
    int old_fd = log_fd;
    log_fd = STDERR_FILENO;
    pthread_mutex_unlock(&log_lock);
    if (old_fd != STDERR_FILENO)
        close(old_fd);
}

/* Name printed for a subsystem mask: the first subsystem it contains, or ALL for a mask of more
 * than one (or none). */
static const char *subsys_name(unsigned subsys)
{
    for (size_t i = 0; i < COLLD_ARRAY_SIZE(subsys_names); i++) {
        if (subsys == subsys_names[i].bit)
            return subsys_names[i].name;
    }
    return "ALL";
}

/* Format one line (UTC timestamp, program, pid, level, subsystem, file base name and line, the
 * message, then `suffix` if any) and write it with one write() under the lock. The level is
 * checked again so direct callers that skip the macro are filtered too. */
static void log_line(colld_log_level_t level, unsigned subsys, const char *file, int line, const char *suffix,
                     const char *fmt, va_list ap) __attribute__((format(printf, 6, 0)));

static void log_line(colld_log_level_t level, unsigned subsys, const char *file, int line, const char *suffix,
                     const char *fmt, va_list ap)
{
    char buf[LOG_LINE_MAX];
    struct timespec ts;
    struct tm tm;

    int max_level = __atomic_load_n(&colld__log_level, __ATOMIC_RELAXED);
    unsigned mask = __atomic_load_n(&colld__log_subsys, __ATOMIC_RELAXED);
    if ((int)level <= COLLD_LOG_NONE || (int)level > max_level || !(subsys & mask))
        return;
    int saved_errno = errno; /* logging must not disturb a caller's errno */

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = file ? strrchr(file, '/') : NULL;
    base = base ? base + 1 : (file ? file : "?");
    const char *lvl = (size_t)level < COLLD_ARRAY_SIZE(level_names) ? level_names[level] : "?";

    pthread_mutex_lock(&log_lock);
    const char *program = log_program[0] ? log_program : program_invocation_short_name;
    int n;
    if (log_journal) /* the journal stamps time, program and pid itself */
        n = snprintf(buf, sizeof(buf), "<%d>%s %s %s:%d ",
                     level_priority[(size_t)level < COLLD_ARRAY_SIZE(level_priority) ? level : 0], lvl,
                     subsys_name(subsys), base, line);
    else
        n = snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%ld] %s %s %s:%d ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000L, program, (long)getpid(), lvl, subsys_name(subsys), base,
                     line);
    size_t len = n < 0 ? 0 : COLLD_MIN((size_t)n, sizeof(buf) - 2);
    n = vsnprintf(buf + len, sizeof(buf) - len - 1, fmt, ap);
    if (n > 0)
        len = COLLD_MIN(len + (size_t)n, sizeof(buf) - 2);
    while (len > 0 && buf[len - 1] == '\n') /* exactly one newline per line */
        len--;
    if (suffix) {
        n = snprintf(buf + len, sizeof(buf) - len - 1, "%s", suffix);
        if (n > 0)
            len = COLLD_MIN(len + (size_t)n, sizeof(buf) - 2);
    }
    buf[len++] = '\n';

    ssize_t w;
    do {
        w = write(log_fd, buf, len);
    } while (w < 0 && errno == EINTR);
    pthread_mutex_unlock(&log_lock);
    errno = saved_errno;
}

void colld__log(colld_log_level_t level, unsigned subsys, const char *file, int line,
                const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_line(level, subsys, file, line, NULL, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------------------------------
 * Rate limiting
 * ---------------------------------------------------------------------------------------------- */

/* The first call of a site prints; later ones print once `interval_ns` has passed since the last
 * printed line and are counted otherwise. The state of every call site is guarded by one lock:
 * it is held for a few instructions, and a suppressed call does no formatting. */
bool colld_log_rl_pass(colld_log_rl_t *rl, uint64_t now_ns, uint64_t interval_ns, uint64_t *suppressed)
{
    bool pass;
    pthread_mutex_lock(&rl_lock);
    pass = rl->next_ns == 0 || now_ns >= rl->next_ns;
    if (pass) {
        *suppressed = rl->suppressed;
        rl->suppressed = 0;
        rl->next_ns = now_ns + interval_ns;
        if (rl->next_ns == 0)
            rl->next_ns = 1;
    } else {
        rl->suppressed++;
    }
    pthread_mutex_unlock(&rl_lock);
    return pass;
}

/* Print the line if its call site may, with the count of the lines it suppressed before. */
void colld__log_rl(colld_log_level_t level, unsigned subsys, const char *file, int line, colld_log_rl_t *rl,
                   uint64_t interval_ms, const char *fmt, ...)
{
    uint64_t suppressed = 0;
    char suffix[96];
    va_list ap;

    if (!colld_log_rl_pass(rl, colld_now_ns(), interval_ms * 1000000ull, &suppressed))
        return;
    if (suppressed)
        snprintf(suffix, sizeof(suffix), " (%llu similar message%s suppressed)", (unsigned long long)suppressed,
                 suppressed == 1 ? "" : "s");
    va_start(ap, fmt);
    log_line(level, subsys, file, line, suppressed ? suffix : NULL, fmt, ap);
    va_end(ap);
}
