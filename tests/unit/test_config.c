/*
 * test_config.c - configuration tables: defaults, config file, environment, command line and
 * their precedence; value syntax (sizes, hex, bools, bounds); every error message; --help.
 */
#include "common/config.h"

#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

typedef struct {
    char *config;
    char *socket;
    int64_t workers;
    bool foreground;
    uint64_t buf_size;
    int64_t mask;
    char *tag;
} test_cfg_t;

#define ENTRY(n, e, t, d, doc, field, lo, hi) {n, e, t, d, doc, offsetof(test_cfg_t, field), lo, hi}

static const colld_config_entry_t table[] = {
    ENTRY("config", "COLLD_TEST_CONFIG", COLLD_CFG_STRING, NULL, "config file to read", config,
          0, 0),
    ENTRY("socket", "COLLD_TEST_SOCKET", COLLD_CFG_STRING, "/run/test.sock", "socket path", socket,
          0, 0),
    ENTRY("workers", "COLLD_TEST_WORKERS", COLLD_CFG_INT, "4", "worker threads", workers, 1, 64),
    ENTRY("foreground", "COLLD_TEST_FOREGROUND", COLLD_CFG_BOOL, "false", "stay in the foreground",
          foreground, 0, 0),
    ENTRY("buf_size", "COLLD_TEST_BUF_SIZE", COLLD_CFG_SIZE, "1M", "staging buffer size", buf_size,
          0, 0),
    ENTRY("mask", NULL, COLLD_CFG_INT, "0x10", "a mask without bounds or variable", mask, 0, 0),
    ENTRY("tag", "COLLD_TEST_TAG", COLLD_CFG_STRING, NULL, "a string without default", tag, 0, 0),
};
#define N_TABLE (sizeof(table) / sizeof(table[0]))

static const char *const env_names[] = {"COLLD_TEST_CONFIG", "COLLD_TEST_SOCKET",
                                        "COLLD_TEST_WORKERS", "COLLD_TEST_FOREGROUND",
                                        "COLLD_TEST_BUF_SIZE", "COLLD_TEST_TAG"};

static char tmpdir[64]; /* short, so paths built from it always fit */

/* Make a private directory for config files. */
static int group_setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/colld-test-config-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

/* Remove the directory and its files. */
static int group_teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Each test starts with none of the table's variables set and a zeroed object. */
static int setup(void **state)
{
    test_cfg_t *cfg = calloc(1, sizeof(*cfg));
    for (size_t i = 0; i < sizeof(env_names) / sizeof(env_names[0]); i++)
        unsetenv(env_names[i]);
    *state = cfg;
    return cfg ? 0 : -1;
}

/* Release the object's strings and the object. */
static int teardown(void **state)
{
    test_cfg_t *cfg = *state;
    colld_config_free(table, N_TABLE, cfg);
    free(cfg);
    return 0;
}

/* Write content to <tmpdir>/<name> and put its path in path. */
static void write_file(const char *name, const char *content, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(content, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* Load with argv given as a NULL-terminated list after argv[0]. */
#define LOAD(cfg, err, ...)                                                                        \
    load_args((cfg), (err), sizeof(err), (const char *[]){"prog", __VA_ARGS__, NULL})

/* Count the argv list and call colld_config_load. */
static int load_args(test_cfg_t *cfg, char *err, size_t err_len, const char **argv)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    err[0] = '\0';
    return colld_config_load(table, N_TABLE, cfg, argc, (char **)argv, err, err_len);
}

/* Load expecting an error, and compare the message. */
#define EXPECT_ERROR(cfg, msg, ...)                                                                \
    do {                                                                                           \
        char err_[512];                                                                            \
        assert_int_equal(LOAD((cfg), err_, __VA_ARGS__), -1);                                      \
        assert_string_equal(err_, (msg));                                                          \
    } while (0)


/* With no sources every field holds its default; a NULL string default is "". */
static void test_defaults(void **state)
{
    test_cfg_t *cfg = *state;
    char err[256] = "x";
    assert_int_equal(colld_config_load(table, N_TABLE, cfg, 0, NULL, err, sizeof(err)), 0);
    assert_string_equal(err, "");
    assert_string_equal(cfg->config, "");
    assert_string_equal(cfg->socket, "/run/test.sock");
    assert_int_equal(cfg->workers, 4);
    assert_false(cfg->foreground);
    assert_int_equal(cfg->buf_size, 1024 * 1024);
    assert_int_equal(cfg->mask, 16);
    assert_string_equal(cfg->tag, "");
}

/* One option set by all four sources: argv > env > file > default, each removed in turn. */
static void test_precedence(void **state)
{
    test_cfg_t *cfg = *state;
    char err[256], path[PATH_MAX];
    write_file("prec.conf", "buf_size = 2M\nsocket = /from/file\n", path, sizeof(path));
    setenv("COLLD_TEST_CONFIG", path, 1);
    setenv("COLLD_TEST_BUF_SIZE", "3M", 1);
    setenv("COLLD_TEST_WORKERS", "7", 1);

    assert_int_equal(LOAD(cfg, err, "--buf_size", "4M", "--tag", "cli"), 0);
    assert_int_equal(cfg->buf_size, 4u << 20);  /* argv */
    assert_int_equal(cfg->workers, 7);          /* env */
    assert_string_equal(cfg->socket, "/from/file"); /* file */
    assert_int_equal(cfg->mask, 16);            /* default */
    assert_string_equal(cfg->tag, "cli");
    assert_string_equal(cfg->config, path);

    assert_int_equal(LOAD(cfg, err, "--tag", "again"), 0);
    assert_int_equal(cfg->buf_size, 3u << 20);
    assert_string_equal(cfg->tag, "again");

    unsetenv("COLLD_TEST_BUF_SIZE");
    assert_int_equal(LOAD(cfg, err, "--workers", "9"), 0);
    assert_int_equal(cfg->buf_size, 2u << 20);
    assert_int_equal(cfg->workers, 9); /* argv over env */

    unsetenv("COLLD_TEST_CONFIG");
    assert_int_equal(colld_config_load(table, N_TABLE, cfg, 0, NULL, err, sizeof(err)), 0);
    assert_int_equal(cfg->buf_size, 1u << 20);
    assert_string_equal(cfg->socket, "/run/test.sock");
    assert_string_equal(cfg->tag, ""); /* reloading resets to the default */
}

/* The file named by --config / --config=... / COLLD_TEST_CONFIG is read; argv's wins over env's. */
static void test_config_file_named(void **state)
{
    test_cfg_t *cfg = *state;
    char err[256], a[PATH_MAX], b[PATH_MAX], arg[PATH_MAX + 16];
    write_file("a.conf", "tag = a\n", a, sizeof(a));
    write_file("b.conf", "tag = b\n", b, sizeof(b));

    assert_int_equal(LOAD(cfg, err, "--config", a), 0);
    assert_string_equal(cfg->tag, "a");
    snprintf(arg, sizeof(arg), "--config=%s", b);
    assert_int_equal(LOAD(cfg, err, arg), 0);
    assert_string_equal(cfg->tag, "b");

    setenv("COLLD_TEST_CONFIG", a, 1);
    assert_int_equal(LOAD(cfg, err, "--workers", "2"), 0);
    assert_string_equal(cfg->tag, "a");
    assert_int_equal(LOAD(cfg, err, "--config", b), 0);
    assert_string_equal(cfg->tag, "b");
    assert_string_equal(cfg->config, b);

    /* An empty value means no file. */
    assert_int_equal(LOAD(cfg, err, "--config="), 0);
    assert_string_equal(cfg->tag, "");
}

/* A config entry whose default names a missing file is skipped (the daemon starts without one);
 * an existing default file is read. */
static void test_config_file_default(void **state)
{
    (void)state;
    typedef struct {
        char *config;
        int64_t n;
    } small_t;
    char err[256], path[PATH_MAX], missing[PATH_MAX];
    write_file("default.conf", "n = 5\n", path, sizeof(path));
    snprintf(missing, sizeof(missing), "%s/missing.conf", tmpdir);
    colld_config_entry_t t[] = {
        {"config", NULL, COLLD_CFG_STRING, missing, "file", offsetof(small_t, config), 0, 0},
        {"n", NULL, COLLD_CFG_INT, "1", "n", offsetof(small_t, n), 0, 0},
    };
    small_t s = {0};
    assert_int_equal(colld_config_load(t, 2, &s, 0, NULL, err, sizeof(err)), 0);
    assert_int_equal(s.n, 1);
    t[0].def = path;
    assert_int_equal(colld_config_load(t, 2, &s, 0, NULL, err, sizeof(err)), 0);
    assert_int_equal(s.n, 5);
    colld_config_free(t, 2, &s);
    assert_null(s.config);
}

/* File syntax: comments, blank lines, white space, optional quotes, trailing comments, CRLF. */
static void test_file_syntax(void **state)
{
    test_cfg_t *cfg = *state;
    char err[256], path[PATH_MAX];
    write_file("syntax.conf",
               "# a comment\n"
               "\n"
               "   \t\n"
               "  socket   =   \"/quoted path/s.sock\"  # trailing comment\n"
               "tag='single # not a comment'\n"
               "\tworkers=8 # eight\n"
               "foreground = yes\r\n"
               "buf_size = \"64K\"\n"
               "mask = 0xff\n"
               "   # indented comment\n",
               path, sizeof(path));
    assert_int_equal(LOAD(cfg, err, "--config", path), 0);
    assert_string_equal(cfg->socket, "/quoted path/s.sock");
    assert_string_equal(cfg->tag, "single # not a comment");
    assert_int_equal(cfg->workers, 8);
    assert_true(cfg->foreground);
    assert_int_equal(cfg->buf_size, 64 * 1024);
    assert_int_equal(cfg->mask, 255);

    write_file("empty.conf", "", path, sizeof(path));
    assert_int_equal(LOAD(cfg, err, "--config", path), 0);
    assert_int_equal(cfg->workers, 4);
}

/* Command line forms: --name value, --name=value, bare --flag, --flag=false, '-' for '_'. */
static void test_argv_forms(void **state)
{
    test_cfg_t *cfg = *state;
    char err[256];
    assert_int_equal(LOAD(cfg, err, "--socket", "/a", "--workers=12", "--foreground",
                          "--buf-size=2K", "--tag="),
                     0);
    assert_string_equal(cfg->socket, "/a");
    assert_int_equal(cfg->workers, 12);
    assert_true(cfg->foreground);
    assert_int_equal(cfg->buf_size, 2048);
    assert_string_equal(cfg->tag, "");

    /* A bare bool flag does not eat the next word; the last occurrence wins. */
    assert_int_equal(LOAD(cfg, err, "--foreground", "--workers", "3", "--foreground=off"), 0);
    assert_false(cfg->foreground);
    assert_int_equal(cfg->workers, 3);
    assert_int_equal(LOAD(cfg, err, "--workers", "3", "--workers", "5"), 0);
    assert_int_equal(cfg->workers, 5);
    /* A negative number is a value, not an option. */
    assert_int_equal(LOAD(cfg, err, "--mask", "-5"), 0);
    assert_int_equal(cfg->mask, -5);
    /* An '=' inside the value is kept. */
    assert_int_equal(LOAD(cfg, err, "--tag=a=b"), 0);
    assert_string_equal(cfg->tag, "a=b");
}

/* Sizes: plain bytes or K/M/G (1024-based, any case, optional B / iB). */
static void test_sizes(void **state)
{
    test_cfg_t *cfg = *state;
    char err[256];
    static const struct {
        const char *text;
        uint64_t value;
    } cases[] = {
        {"0", 0},          {"4096", 4096},      {"4K", 4096},
        {"4k", 4096},      {"4KB", 4096},       {"4KiB", 4096},
        {"2M", 2u << 20},  {"2mb", 2u << 20},   {"3G", 3ull << 30},
        {"1B", 1},         {"16g", 16ull << 30}, {"17179869184", 16ull << 30},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(LOAD(cfg, err, "--buf_size", cases[i].text), 0);
        assert_int_equal(cfg->buf_size, cases[i].value);
    }
    setenv("COLLD_TEST_BUF_SIZE", "8K", 1);
    assert_int_equal(LOAD(cfg, err, "--tag", "x"), 0);
    assert_int_equal(cfg->buf_size, 8192);
}

/* Integers: decimal (a leading 0 is not octal), 0x hex in either case, signs, bounds inclusive. */
static void test_ints(void **state)
{
    test_cfg_t *cfg = *state;
    char err[256];
    assert_int_equal(LOAD(cfg, err, "--mask", "0x1F"), 0);
    assert_int_equal(cfg->mask, 31);
    assert_int_equal(LOAD(cfg, err, "--mask", "0XaB"), 0);
    assert_int_equal(cfg->mask, 0xab);
    assert_int_equal(LOAD(cfg, err, "--mask", "-0x10"), 0);
    assert_int_equal(cfg->mask, -16);
    assert_int_equal(LOAD(cfg, err, "--mask", "010"), 0);
    assert_int_equal(cfg->mask, 10);
    assert_int_equal(LOAD(cfg, err, "--mask", "+7"), 0);
    assert_int_equal(cfg->mask, 7);
    assert_int_equal(LOAD(cfg, err, "--mask", "9223372036854775807"), 0);
    assert_int_equal(cfg->mask, INT64_MAX);
    assert_int_equal(LOAD(cfg, err, "--mask", "-9223372036854775808"), 0);
    assert_int_equal(cfg->mask, INT64_MIN);
    /* no bounds when min == max == 0 */
    assert_int_equal(LOAD(cfg, err, "--mask", "0"), 0);
    assert_int_equal(cfg->mask, 0);

    assert_int_equal(LOAD(cfg, err, "--workers", "1"), 0);
    assert_int_equal(cfg->workers, 1);
    assert_int_equal(LOAD(cfg, err, "--workers", "64"), 0);
    assert_int_equal(cfg->workers, 64);
    assert_int_equal(LOAD(cfg, err, "--workers", "0x40"), 0);
    assert_int_equal(cfg->workers, 64);
}

/* Every accepted spelling of true and false, in any case. */
static void test_bools(void **state)
{
    test_cfg_t *cfg = *state;
    char err[256], arg[64];
    const char *yes[] = {"1", "true", "yes", "on", "TRUE", "Yes", "ON"};
    const char *no[] = {"0", "false", "no", "off", "FALSE", "No", "Off"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        snprintf(arg, sizeof(arg), "--foreground=%s", yes[i]);
        assert_int_equal(LOAD(cfg, err, arg), 0);
        assert_true(cfg->foreground);
        snprintf(arg, sizeof(arg), "--foreground=%s", no[i]);
        assert_int_equal(LOAD(cfg, err, arg), 0);
        assert_false(cfg->foreground);
    }
    setenv("COLLD_TEST_FOREGROUND", "on", 1);
    assert_int_equal(LOAD(cfg, err, "--tag", "x"), 0);
    assert_true(cfg->foreground);
}

/* Every command line error names the option and what is wrong. */
static void test_argv_errors(void **state)
{
    test_cfg_t *cfg = *state;
    EXPECT_ERROR(cfg, "--workers: 'abc' is not an integer", "--workers", "abc");
    EXPECT_ERROR(cfg, "--workers: '' is not an integer", "--workers=");
    EXPECT_ERROR(cfg, "--workers: '12abc' is not an integer", "--workers", "12abc");
    EXPECT_ERROR(cfg, "--workers: '0x' is not an integer", "--workers", "0x");
    EXPECT_ERROR(cfg, "--workers: ' 5' is not an integer", "--workers", " 5");
    EXPECT_ERROR(cfg, "--workers: 0 is below the minimum 1", "--workers", "0");
    EXPECT_ERROR(cfg, "--workers: -3 is below the minimum 1", "--workers=-3");
    EXPECT_ERROR(cfg, "--workers: 65 is above the maximum 64", "--workers=65");
    EXPECT_ERROR(cfg, "--workers: 65 is above the maximum 64", "--workers=0x41");
    EXPECT_ERROR(cfg, "--mask: '9223372036854775808' does not fit in a 64-bit integer", "--mask",
                 "9223372036854775808");
    EXPECT_ERROR(cfg, "unknown option --foo; see --help", "--foo");
    EXPECT_ERROR(cfg, "unknown option --foo; see --help", "--foo=1");
    EXPECT_ERROR(cfg, "unknown option --foo; see --help", "--workers", "2", "--foo", "bar");
    EXPECT_ERROR(cfg, "unexpected argument 'stray'; see --help", "stray");
    EXPECT_ERROR(cfg, "unexpected argument '-x'; see --help", "-x");
    EXPECT_ERROR(cfg, "--socket: missing value", "--socket");
    EXPECT_ERROR(cfg, "--socket: missing value", "--socket", "--workers", "3");
    EXPECT_ERROR(cfg, "--config: missing value", "--config");
    EXPECT_ERROR(cfg,
                 "--foreground: 'maybe' is not a boolean (use true/false, yes/no, on/off or 1/0)",
                 "--foreground=maybe");
    EXPECT_ERROR(cfg,
                 "--buf_size: '12X' is not a size (a number of bytes with an optional K, M or G "
                 "suffix)",
                 "--buf_size", "12X");
    EXPECT_ERROR(cfg,
                 "--buf_size: '-1' is not a size (a number of bytes with an optional K, M or G "
                 "suffix)",
                 "--buf_size", "-1");
    EXPECT_ERROR(cfg,
                 "--buf_size: '1.5G' is not a size (a number of bytes with an optional K, M or G "
                 "suffix)",
                 "--buf_size", "1.5G");
    EXPECT_ERROR(cfg, "--buf_size: '99999999999G' is too large", "--buf_size", "99999999999G");
    EXPECT_ERROR(cfg, "--buf_size: '99999999999999999999' is too large", "--buf_size",
                 "99999999999999999999");

    /* A NULL err buffer is allowed. */
    const char *argv[] = {"prog", "--foo", NULL};
    assert_int_equal(colld_config_load(table, N_TABLE, cfg, 2, (char **)argv, NULL, 0), -1);
}

/* Environment errors name the variable and the option; empty variables count as unset. */
static void test_env_errors(void **state)
{
    test_cfg_t *cfg = *state;
    setenv("COLLD_TEST_WORKERS", "abc", 1);
    EXPECT_ERROR(cfg, "COLLD_TEST_WORKERS (--workers): 'abc' is not an integer", "--tag", "x");
    /* argv does not hide a bad environment value: the environment is applied first */
    EXPECT_ERROR(cfg, "COLLD_TEST_WORKERS (--workers): 'abc' is not an integer", "--workers", "2");
    setenv("COLLD_TEST_WORKERS", "100", 1);
    EXPECT_ERROR(cfg, "COLLD_TEST_WORKERS (--workers): 100 is above the maximum 64", "--tag", "x");
    setenv("COLLD_TEST_WORKERS", "", 1);
    char err[256];
    assert_int_equal(LOAD(cfg, err, "--tag", "x"), 0);
    assert_int_equal(cfg->workers, 4);
}

/* Config file errors name the file and line. */
static void test_file_errors(void **state)
{
    test_cfg_t *cfg = *state;
    char path[PATH_MAX], msg[PATH_MAX + 128];

    write_file("unknown.conf", "workers = 2\nbogus = 1\n", path, sizeof(path));
    snprintf(msg, sizeof(msg), "%s:2: unknown option 'bogus'", path);
    EXPECT_ERROR(cfg, msg, "--config", path);

    write_file("badint.conf", "# c\nworkers = x\n", path, sizeof(path));
    snprintf(msg, sizeof(msg), "%s:2: workers: 'x' is not an integer", path);
    EXPECT_ERROR(cfg, msg, "--config", path);

    write_file("range.conf", "workers = 0\n", path, sizeof(path));
    snprintf(msg, sizeof(msg), "%s:1: workers: 0 is below the minimum 1", path);
    EXPECT_ERROR(cfg, msg, "--config", path);

    write_file("noeq.conf", "workers 2\n", path, sizeof(path));
    snprintf(msg, sizeof(msg), "%s:1: expected 'name = value'", path);
    EXPECT_ERROR(cfg, msg, "--config", path);

    write_file("nokey.conf", " = 2\n", path, sizeof(path));
    snprintf(msg, sizeof(msg), "%s:1: expected 'name = value'", path);
    EXPECT_ERROR(cfg, msg, "--config", path);

    write_file("quote.conf", "tag = \"open\n", path, sizeof(path));
    snprintf(msg, sizeof(msg), "%s:1: expected 'name = value'", path);
    EXPECT_ERROR(cfg, msg, "--config", path);

    write_file("self.conf", "config = /other\n", path, sizeof(path));
    snprintf(msg, sizeof(msg), "%s:1: 'config' cannot be set in a config file", path);
    EXPECT_ERROR(cfg, msg, "--config", path);

    snprintf(path, sizeof(path), "%s/does-not-exist.conf", tmpdir);
    snprintf(msg, sizeof(msg), "--config: cannot read '%s': No such file or directory", path);
    EXPECT_ERROR(cfg, msg, "--config", path);
    setenv("COLLD_TEST_CONFIG", path, 1);
    EXPECT_ERROR(cfg, msg, "--tag", "x");
}

/* --help / -h return 1 and win over errors elsewhere on the command line. */
static void test_help_flag(void **state)
{
    test_cfg_t *cfg = *state;
    char err[256];
    assert_int_equal(LOAD(cfg, err, "--help"), 1);
    assert_int_equal(LOAD(cfg, err, "-h"), 1);
    assert_int_equal(LOAD(cfg, err, "--workers", "abc", "--foo", "--help"), 1);
    setenv("COLLD_TEST_WORKERS", "abc", 1);
    assert_int_equal(LOAD(cfg, err, "-h"), 1);
}

/* The help text lists each option with its flag, environment name, default, bounds and doc. */
static void test_help_output(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    colld_config_print_help(out, "usage: prog [options]", table, N_TABLE);
    fclose(out);

    assert_int_equal(strncmp(text, "usage: prog [options]\n", 22), 0);
    for (size_t i = 0; i < N_TABLE; i++) {
        char flag[64];
        snprintf(flag, sizeof(flag), "  --%s", table[i].name);
        const char *at = strstr(text, flag);
        assert_non_null(at);
        const char *eol = strchr(at, '\n');
        assert_non_null(eol);
        if (table[i].env) {
            char env[64];
            snprintf(env, sizeof(env), "env %s", table[i].env);
            assert_non_null(strstr(at, env));
            assert_true(strstr(at, env) < eol);
        }
        if (table[i].def) {
            char def[64];
            snprintf(def, sizeof(def), "default %s", table[i].def);
            assert_non_null(strstr(at, def));
            assert_true(strstr(at, def) < eol);
        }
        /* doc on the next line, indented */
        assert_true(strncmp(eol + 1, "      ", 6) == 0);
        assert_int_equal(strncmp(eol + 7, table[i].doc, strlen(table[i].doc)), 0);
    }
    assert_non_null(strstr(text, "  --socket VALUE  (env COLLD_TEST_SOCKET, default "
                                 "/run/test.sock)\n      socket path\n"));
    assert_non_null(strstr(text, "  --workers VALUE  (env COLLD_TEST_WORKERS, default 4, "
                                 "range 1..64)"));
    assert_non_null(strstr(text, "  --mask VALUE  (default 0x10)\n"));
    assert_non_null(strstr(text, "  --tag VALUE  (env COLLD_TEST_TAG, default none)\n"));
    assert_non_null(strstr(text, "--help"));
    free(text);
}

/* Loading over a loaded object frees replaced strings (ASan's leak check sees any leak), and
 * free leaves NULLs so it can run twice. */
static void test_reload_and_free(void **state)
{
    test_cfg_t *cfg = *state;
    char err[256];
    setenv("COLLD_TEST_TAG", "from-env", 1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(LOAD(cfg, err, "--socket", "/s1", "--socket", "/s2", "--tag", "t"), 0);
        assert_string_equal(cfg->socket, "/s2");
        assert_string_equal(cfg->tag, "t");
    }
    /* A failed load leaves a freeable object. */
    EXPECT_ERROR(cfg, "unknown option --nope; see --help", "--socket", "/s3", "--nope");
    colld_config_free(table, N_TABLE, cfg);
    assert_null(cfg->socket);
    assert_null(cfg->tag);
    assert_null(cfg->config);
    colld_config_free(table, N_TABLE, cfg);
}

/* colld_config_env returns NULL for unset and empty variables. */
static void test_env_helper(void **state)
{
    (void)state;
    unsetenv("COLLD_TEST_TAG");
    assert_null(colld_config_env("COLLD_TEST_TAG"));
    setenv("COLLD_TEST_TAG", "", 1);
    assert_null(colld_config_env("COLLD_TEST_TAG"));
    setenv("COLLD_TEST_TAG", "v", 1);
    assert_string_equal(colld_config_env("COLLD_TEST_TAG"), "v");
    assert_null(colld_config_env(NULL));
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_defaults),       T(test_precedence),
        T(test_config_file_named), T(test_config_file_default),
        T(test_file_syntax),    T(test_argv_forms),
        T(test_sizes),          T(test_ints),
        T(test_bools),          T(test_argv_errors),
        T(test_env_errors),     T(test_file_errors),
        T(test_help_flag),      T(test_help_output),
        T(test_reload_and_free), T(test_env_helper),
    };
#undef T
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
