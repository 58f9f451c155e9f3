/*
 * test_log.c - log levels, subsystem filtering, file output with %p/%h, line format, bad settings,
 * whole lines under concurrent writers, and rate-limited call sites.
 */
#include "common/log.h"
#include "common/err.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

static char tmpdir[64]; /* short, so paths built from it always fit */

/* Make a private directory for the log files of this run. */
static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/colld-test-log-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

/* Remove the log files and the directory. */
static int teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    colld_log_fini();
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Read a whole file into a malloc'ed string ("" when it is missing). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf = calloc(1, 1 << 20);
    assert_non_null(buf);
    if (f) {
        size_t n = fread(buf, 1, (1 << 20) - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

/* Count the lines in s. */
static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Point logging at a fresh file <tmpdir>/<name> with the given level and subsystems. */
static void log_to(const char *name, const char *level, const char *subsys, char *path, size_t len)
{
    char err[256] = "";
    snprintf(path, len, "%s/%s", tmpdir, name);
    unlink(path);
    int rc = colld_log_init("test_log", level, subsys, path, err, sizeof(err));
    if (rc != 0)
        fail_msg("colld_log_init: %s", err);
}

/* Before colld_log_init, warn and every subsystem are on, lines go to stderr, and the program
 * name is the executable's. */
static void test_defaults(void **state)
{
    (void)state;
    char path[PATH_MAX];
    assert_int_equal(colld__log_level, COLLD_LOG_WARN);
    assert_int_equal(colld__log_subsys, COLLD_SUB_ALL);

    snprintf(path, sizeof(path), "%s/stderr.txt", tmpdir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    errno = EAGAIN;
    LOG_WARN(NET, "to stderr %d", 7);
    assert_int_equal(errno, EAGAIN); /* logging keeps errno */
    LOG_INFO(NET, "filtered");
    assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    close(fd);

    char *text = slurp(path);
    assert_int_equal(count_lines(text), 1);
    assert_non_null(strstr(text, " test_log["));
    assert_non_null(strstr(text, "] WARN NET test_log.c:"));
    assert_non_null(strstr(text, " to stderr 7\n"));
    free(text);
}

/* Nothing above the configured level is written; the level itself and below are. */
static void test_level_filter(void **state)
{
    (void)state;
    char path[PATH_MAX];
    log_to("level.log", "warn", NULL, path, sizeof(path));
    LOG_INFO(SESSION, "info %d", 1);
    LOG_DEBUG(SESSION, "debug %d", 2);
    LOG_TRACE(SESSION, "trace %d", 3);
    char *text = slurp(path);
    assert_string_equal(text, "");
    free(text);

    LOG_WARN(SESSION, "warn %d", 4);
    LOG_ERROR(ENGINE, "error %d", 5);
    text = slurp(path);
    assert_int_equal(count_lines(text), 2);
    assert_non_null(strstr(text, " WARN SESSION "));
    assert_non_null(strstr(text, "warn 4\n"));
    assert_non_null(strstr(text, " ERROR ENGINE "));
    assert_null(strstr(text, "info"));
    free(text);

    log_to("none.log", "NONE", NULL, path, sizeof(path));
    LOG_ERROR(SESSION, "not written");
    text = slurp(path);
    assert_string_equal(text, "");
    free(text);

    log_to("trace.log", "Trace", NULL, path, sizeof(path));
    LOG_TRACE(MEM, "t");
    LOG_DEBUG(MEM, "d");
    LOG_INFO(MEM, "i");
    text = slurp(path);
    assert_int_equal(count_lines(text), 3);
    free(text);
}

/* One line has the documented shape:
 * 2026-11-21T08:02:57.123Z test_log[pid] LEVEL SUBSYS test_log.c:line message */
static void test_line_format(void **state)
{
    (void)state;
    char path[PATH_MAX], expect[256];
    log_to("format.log", "info", "ALL", path, sizeof(path));
    int line = __LINE__ + 1;
    LOG_INFO(CONFIG, "hello %s %d", "world", 42);
    char *text = slurp(path);
    assert_int_equal(count_lines(text), 1);
    /* timestamp: YYYY-MM-DDTHH:MM:SS.mmmZ */
    const char *shape = "dddd-dd-ddTdd:dd:dd.dddZ ";
    for (size_t i = 0; shape[i]; i++) {
        if (shape[i] == 'd')
            assert_true(isdigit((unsigned char)text[i]));
        else
            assert_int_equal(text[i], shape[i]);
    }
    snprintf(expect, sizeof(expect), "test_log[%ld] INFO CONFIG test_log.c:%d hello world 42\n",
             (long)getpid(), line);
    assert_string_equal(text + strlen(shape), expect);
    free(text);
}

/* A comma list enables only those subsystems; ^NAME excludes one from all or from a list. */
static void test_subsys_filter(void **state)
{
    (void)state;
    char path[PATH_MAX];
    log_to("sub1.log", "info", "SESSION, engine", path, sizeof(path));
    LOG_INFO(SESSION, "s");
    LOG_INFO(ENGINE, "e");
    LOG_INFO(NET, "n");
    LOG_INFO(RPC, "r");
    char *text = slurp(path);
    assert_int_equal(count_lines(text), 2);
    assert_non_null(strstr(text, " SESSION "));
    assert_non_null(strstr(text, " ENGINE "));
    assert_null(strstr(text, " NET "));
    free(text);

    log_to("sub2.log", "info", "^NET", path, sizeof(path));
    LOG_INFO(NET, "n");
    LOG_INFO(COLL, "c");
    LOG_INFO(CLIENT, "cl");
    text = slurp(path);
    assert_int_equal(count_lines(text), 2);
    assert_null(strstr(text, " NET "));
    assert_non_null(strstr(text, " COLL "));
    free(text);

    log_to("sub3.log", "info", "ALL,^NET,^RPC", path, sizeof(path));
    assert_int_equal(colld__log_subsys, COLLD_SUB_ALL & ~(unsigned)(COLLD_SUB_NET | COLLD_SUB_RPC));
    LOG_INFO(RPC, "r");
    LOG_INFO(NET, "n");
    LOG_INFO(ADMIN, "a");
    text = slurp(path);
    assert_int_equal(count_lines(text), 1);
    assert_non_null(strstr(text, " ADMIN "));
    free(text);

    log_to("sub4.log", "info", "SESSION,NET,^NET", path, sizeof(path));
    assert_int_equal(colld__log_subsys, COLLD_SUB_SESSION);
}

/* %p in the file name becomes the pid and %h the host name; the file is created. */
static void test_file_pattern(void **state)
{
    (void)state;
    char err[256] = "", pattern[PATH_MAX], path[PATH_MAX + 64], host[256];
    snprintf(pattern, sizeof(pattern), "%s/colld.%%h.%%p.log", tmpdir);
    assert_int_equal(colld_log_init("test_log", "error", NULL, pattern, err, sizeof(err)), 0);
    LOG_ERROR(INIT, "to the pid file");
    assert_int_equal(gethostname(host, sizeof(host)), 0);
    host[sizeof(host) - 1] = '\0';
    snprintf(path, sizeof(path), "%s/colld.%s.%ld.log", tmpdir, host, (long)getpid());
    char *text = slurp(path);
    assert_int_equal(count_lines(text), 1);
    assert_non_null(strstr(text, " ERROR INIT test_log.c:"));
    assert_non_null(strstr(text, "to the pid file\n"));
    free(text);
    colld_log_fini();
}

/* Bad settings return -1 with a message and leave logging as it was. */
static void test_invalid(void **state)
{
    (void)state;
    char err[256], path[PATH_MAX];
    log_to("keep.log", "info", "SESSION", path, sizeof(path));

    err[0] = '\0';
    assert_int_equal(colld_log_init("x", "loud", NULL, NULL, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "loud"));
    assert_non_null(strstr(err, "level"));

    err[0] = '\0';
    assert_int_equal(colld_log_init("x", "debug", "SESSION,BOGUS", NULL, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "BOGUS"));
    assert_non_null(strstr(err, "subsystem"));

    err[0] = '\0';
    assert_int_equal(colld_log_init("x", "debug", "^WHAT", NULL, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "WHAT"));

    err[0] = '\0';
    assert_int_equal(colld_log_init("x", "debug", NULL, "/nonexistent-dir/colld.log", err,
                                    sizeof(err)), -1);
    assert_non_null(strstr(err, "/nonexistent-dir/colld.log"));

    /* NULL err is allowed. */
    assert_int_equal(colld_log_init("x", "loud", NULL, NULL, NULL, 0), -1);

    /* Still info, SESSION only, to keep.log, named test_log. */
    assert_int_equal(colld__log_level, COLLD_LOG_INFO);
    assert_int_equal(colld__log_subsys, COLLD_SUB_SESSION);
    LOG_INFO(SESSION, "still here");
    LOG_DEBUG(SESSION, "filtered");
    char *text = slurp(path);
    assert_int_equal(count_lines(text), 1);
    assert_non_null(strstr(text, " test_log["));
    assert_non_null(strstr(text, "still here\n"));
    free(text);
}

#define N_THREADS 4
#define N_LINES 500

/* Write N_LINES long lines from one thread. */
static void *writer(void *arg)
{
    long id = (long)(intptr_t)arg;
    char pad[300];
    memset(pad, 'a' + (int)id, sizeof(pad) - 1);
    pad[sizeof(pad) - 1] = '\0';
    for (int i = 0; i < N_LINES; i++)
        LOG_INFO(COLL, "T%ld %d %s END", id, i, pad);
    return NULL;
}

/* Lines from concurrent threads never mix: each line holds one thread's padding and its END. */
static void test_threads(void **state)
{
    (void)state;
    char path[PATH_MAX];
    pthread_t t[N_THREADS];
    log_to("threads.log", "info", NULL, path, sizeof(path));
    for (long i = 0; i < N_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, writer, (void *)(intptr_t)i), 0);
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(t[i], NULL);
    char *text = slurp(path);
    assert_int_equal(count_lines(text), N_THREADS * N_LINES);
    for (char *line = text, *nl; (nl = strchr(line, '\n')) != NULL; line = nl + 1) {
        *nl = '\0';
        char *tag = strstr(line, " T");
        assert_non_null(tag);
        long id = strtol(tag + 2, NULL, 10);
        assert_true(id >= 0 && id < N_THREADS);
        char *pad = strrchr(line, ' ');
        assert_non_null(pad);
        assert_string_equal(pad, " END");
        char *p = pad - 1;
        for (int k = 0; k < 299; k++, p--)
            assert_int_equal(*p, 'a' + id);
    }
    free(text);
}

/* The rate-limit decision at given times: the first call passes, calls within the interval are
 * counted, the first one after it passes with that count, and the count starts again. */
static void test_rate_limit_decision(void **state)
{
    (void)state;
    colld_log_rl_t rl = { 0 };
    uint64_t sup = 99;
    const uint64_t s = 1000000000ull;
    assert_true(colld_log_rl_pass(&rl, 10 * s, 5 * s, &sup));
    assert_int_equal(sup, 0);
    for (int i = 0; i < 1000; i++)
        assert_false(colld_log_rl_pass(&rl, 10 * s + (uint64_t)i * 1000000ull, 5 * s, &sup));
    assert_false(colld_log_rl_pass(&rl, 15 * s - 1, 5 * s, &sup));
    assert_true(colld_log_rl_pass(&rl, 15 * s, 5 * s, &sup));
    assert_int_equal(sup, 1001);
    assert_false(colld_log_rl_pass(&rl, 16 * s, 5 * s, &sup));
    assert_true(colld_log_rl_pass(&rl, 100 * s, 5 * s, &sup));
    assert_int_equal(sup, 1);
    assert_true(colld_log_rl_pass(&rl, 200 * s, 5 * s, &sup));
    assert_int_equal(sup, 0);

    /* A zero interval lets every call through. */
    colld_log_rl_t z = { 0 };
    assert_true(colld_log_rl_pass(&z, 5, 0, &sup));
    assert_true(colld_log_rl_pass(&z, 5, 0, &sup));
    assert_int_equal(sup, 0);
}

/* One call site that fires in a loop prints one line; another call site has its own state; a
 * disabled level neither prints nor counts. (An hour-long interval: nothing here depends on how
 * fast the loop runs.) */
static void test_rate_limit_lines(void **state)
{
    (void)state;
    char path[PATH_MAX];
    log_to("rl.log", "warn", NULL, path, sizeof(path));
    for (int i = 0; i < 10000; i++)
        COLLD_LOG_RL(COLLD_LOG_WARN, COLLD_SUB_SESSION, 3600000, "accept: %s (%d)", "Too many open files", i);
    for (int i = 0; i < 3; i++)
        COLLD_LOG_RL(COLLD_LOG_WARN, COLLD_SUB_RPC, 3600000, "other site %d", i);
    for (int i = 0; i < 3; i++)
        LOG_INFO_RL(RPC, "filtered %d", i);
    char *text = slurp(path);
    assert_int_equal(count_lines(text), 2);
    assert_non_null(strstr(text, " WARN SESSION test_log.c:"));
    assert_non_null(strstr(text, "accept: Too many open files (0)\n"));
    assert_non_null(strstr(text, "other site 0\n"));
    assert_null(strstr(text, "suppressed"));
    free(text);

    /* The next line of a site that dropped calls says how many. */
    colld_log_rl_t rl = { .next_ns = 1, .suppressed = 41 };
    colld__log_rl(COLLD_LOG_WARN, COLLD_SUB_NET, "x/y.c", 7, &rl, 3600000, "listener paused\n");
    colld__log_rl(COLLD_LOG_WARN, COLLD_SUB_NET, "x/y.c", 7, &rl, 3600000, "dropped");
    rl = (colld_log_rl_t){ .next_ns = 1, .suppressed = 1 };
    colld__log_rl(COLLD_LOG_ERROR, COLLD_SUB_NET, "x/y.c", 8, &rl, 3600000, "once");
    text = slurp(path);
    assert_int_equal(count_lines(text), 4);
    assert_non_null(strstr(text, " WARN NET y.c:7 listener paused (41 similar messages suppressed)\n"));
    assert_non_null(strstr(text, " ERROR NET y.c:8 once (1 similar message suppressed)\n"));
    assert_null(strstr(text, "dropped"));
    assert_int_equal(rl.suppressed, 0);
    free(text);
}

/* SYS_CHECK at the kernel boundary: a failing call returns its result with errno kept and is
 * logged as written, with strerror and this file's line; an errno the caller expects, and a call
 * that succeeds, log nothing. */
static void test_sys_check(void **state)
{
    (void)state;
    char path[PATH_MAX];
    log_to("sys.log", "warn", NULL, path, sizeof(path));
    errno = 0;
    int line = __LINE__ + 1;
    long rc = SYS_CHECK(MEM, munmap((void *)1, 4096));
    assert_int_equal(rc, -1);
    assert_int_equal(errno, EINVAL);
    assert_int_equal(SYS_CHECK_EXPECT(INIT, ENOENT, unlink("/nonexistent-dir/colld.sock")), -1);
    assert_int_equal(errno, ENOENT);
    assert_int_equal(SYS_CHECK(INIT, getpid()), (long)getpid());
    char *text = slurp(path);
    char want[160];
    snprintf(want, sizeof(want), " WARN MEM test_log.c:%d munmap((void *)1, 4096) failed: %s\n", line,
             strerror(EINVAL));
    assert_non_null(strstr(text, want));
    assert_int_equal(count_lines(text), 1);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),         cmocka_unit_test(test_level_filter),
        cmocka_unit_test(test_line_format),      cmocka_unit_test(test_subsys_filter),
        cmocka_unit_test(test_file_pattern),     cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_threads),          cmocka_unit_test(test_rate_limit_decision),
        cmocka_unit_test(test_rate_limit_lines), cmocka_unit_test(test_sys_check),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
