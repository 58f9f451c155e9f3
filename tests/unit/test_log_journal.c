/*
 * test_log_journal.c - log lines when stderr is the systemd journal: a "<N>" syslog priority per
 * level and no timestamp, program or pid (the journal records those); the usual format when
 * JOURNAL_STREAM names another stream, is malformed, or a log file is set.
 */
#include "common/log.h"

#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static char tmpdir[64];
static int saved_stderr = -1;

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/colld-test-journal-XXXXXX");
    saved_stderr = dup(STDERR_FILENO);
    return mkdtemp(tmpdir) && saved_stderr >= 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    colld_log_fini();
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    unsetenv("JOURNAL_STREAM");
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Point stderr at a fresh file (standing in for the journal's stream) and return its path. */
static void stderr_to(const char *name, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", tmpdir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    close(fd);
}

/* Set JOURNAL_STREAM to the device and inode of `path`. */
static void journal_is(const char *path)
{
    struct stat st;
    char v[64];
    assert_int_equal(stat(path, &st), 0);
    snprintf(v, sizeof(v), "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    assert_int_equal(setenv("JOURNAL_STREAM", v, 1), 0);
}

/* Log one line per level to stderr and read back what was written. */
static void log_levels(const char *name, char *out, size_t len, bool journal)
{
    char path[PATH_MAX], err[256] = "";
    stderr_to(name, path, sizeof(path));
    if (journal)
        journal_is(path);
    assert_int_equal(colld_log_init("colld", "debug", NULL, NULL, err, sizeof(err)), 0);
    LOG_ERROR(ENGINE, "an error %d", 1);
    LOG_WARN(NET, "a warning");
    LOG_INFO(SESSION, "some info");
    LOG_DEBUG(COLL, "a detail");
    dup2(saved_stderr, STDERR_FILENO);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, len - 1, f);
    out[n] = '\0';
    fclose(f);
}

/* stderr is the journal: priorities 3, 4, 6, 7 and nothing the journal adds itself. */
static void test_journal_prefix(void **state)
{
    (void)state;
    char out[4096];
    log_levels("journal", out, sizeof(out), true);
    const char *lines[] = { "<3>ERROR ENGINE test_log_journal.c:", "<4>WARN NET test_log_journal.c:",
                            "<6>INFO SESSION test_log_journal.c:", "<7>DEBUG COLL test_log_journal.c:" };
    const char *p = out;
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        if (strncmp(p, lines[i], strlen(lines[i])) != 0)
            fail_msg("line %zu: expected '%s...', got '%.80s'", i, lines[i], p);
        p = strchr(p, '\n');
        assert_non_null(p);
        p++;
    }
    assert_string_equal(p, "");
    assert_null(strstr(out, "colld["));
    assert_non_null(strstr(out, "an error 1\n"));
}

/* JOURNAL_STREAM inherited from a parent whose journal stream is not our stderr: the usual
 * timestamped format. */
static void test_other_stream(void **state)
{
    (void)state;
    char other[PATH_MAX], out[4096];
    snprintf(other, sizeof(other), "%s/elsewhere", tmpdir);
    int fd = open(other, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    close(fd);
    journal_is(other);
    log_levels("plain", out, sizeof(out), false);
    assert_int_equal(out[0] >= '0' && out[0] <= '9', 1); /* a year */
    assert_non_null(strstr(out, "colld["));
    assert_non_null(strstr(out, " ERROR ENGINE "));
    assert_null(strstr(out, "<3>"));
}

/* A malformed JOURNAL_STREAM is ignored. */
static void test_malformed(void **state)
{
    (void)state;
    char out[4096], path[PATH_MAX], err[256] = "";
    const char *bad[] = { "", "12", "12:", ":5", "1:2:3", "1:2x", "x:y" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        stderr_to("bad", path, sizeof(path));
        setenv("JOURNAL_STREAM", bad[i], 1);
        assert_int_equal(colld_log_init("colld", "warn", NULL, NULL, err, sizeof(err)), 0);
        LOG_WARN(NET, "w");
        dup2(saved_stderr, STDERR_FILENO);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        size_t n = fread(out, 1, sizeof(out) - 1, f);
        out[n] = '\0';
        fclose(f);
        if (strstr(out, "<4>"))
            fail_msg("JOURNAL_STREAM='%s' was taken as the journal", bad[i]);
    }
}

/* A log file wins over the journal: its lines keep their timestamps. */
static void test_log_file(void **state)
{
    (void)state;
    char path[PATH_MAX], file[PATH_MAX], err[256] = "", out[4096];
    stderr_to("journal2", path, sizeof(path));
    journal_is(path);
    snprintf(file, sizeof(file), "%s/file.log", tmpdir);
    assert_int_equal(colld_log_init("colld", "warn", NULL, file, err, sizeof(err)), 0);
    LOG_WARN(NET, "to the file");
    colld_log_fini();
    dup2(saved_stderr, STDERR_FILENO);
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    fclose(f);
    assert_null(strstr(out, "<4>"));
    assert_non_null(strstr(out, "colld["));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_journal_prefix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_log_file, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
