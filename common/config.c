/*
 * config.c - table-driven configuration: defaults, config file, environment, command line.
 *
 * Each source is applied in turn over the same object, in rising precedence, so the last one to
 * name an option wins. Every value is parsed before it is stored: a bad value leaves the field as
 * it was. String fields always hold either NULL or a heap string owned by the object, so the
 * object must be zeroed before its first load; loading again frees what it replaces.
 *
 * Option names match with '-' and '_' treated alike, so --admin-port and admin_port both find an
 * entry named "admin_port".
 */
#include "common/config.h"

#include "common/util.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Room for an option's label in messages: a file name, a line number and the option name. */
#define LABEL_MAX (PATH_MAX + 128)

/* ------------------------------------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------------------------------- */


/* The single place where colld reads the environment. An empty variable counts as unset, so
 * "COLLD_X=" on a command line restores the default. */
const char *colld_config_env(const char *name)
{
    const char *v = name ? getenv(name) : NULL;
    return v && *v ? v : NULL;
}

/* Compare an option name of `len` characters with a table name, '-' and '_' being the same. */
static bool name_matches(const char *table_name, const char *name, size_t len)
{
    size_t i;
    for (i = 0; i < len; i++) {
        char a = table_name[i], b = name[i];
        if (a == '\0')
            return false;
        if (a == '-')
            a = '_';
        if (b == '-')
            b = '_';
        if (a != b)
            return false;
    }
    return table_name[i] == '\0';
}

/* Find the table entry for a name of `len` characters, or NULL. */
static const colld_config_entry_t *find_entry(const colld_config_entry_t *table, size_t n,
                                              const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++) {
        if (name_matches(table[i].name, name, len))
            return &table[i];
    }
    return NULL;
}

/* The entry named "config" if it is a string, which then names the config file; else NULL. */
static const colld_config_entry_t *config_file_entry(const colld_config_entry_t *table, size_t n)
{
    const colld_config_entry_t *e = find_entry(table, n, "config", 6);
    return e && e->type == COLLD_CFG_STRING ? e : NULL;
}

/* Address of an entry's field inside obj. */
static void *field_of(const colld_config_entry_t *e, void *obj)
{
    return (char *)obj + e->offset;
}

/* ------------------------------------------------------------------------------------------------
 * Parsing one value
 * ---------------------------------------------------------------------------------------------- */

/* Parse a decimal or 0x-hex integer with an optional sign, the whole text and nothing else, then
 * check the entry's bounds. `label` names the option in messages. */
static int parse_int(const colld_config_entry_t *e, const char *label, const char *text,
                     int64_t *out, char *err, size_t err_len)
{
    const char *p = text;
    if (*p == '+' || *p == '-')
        p++;
    int base = (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) ? 16 : 10;
    const char *digits = base == 16 ? p + 2 : p;
    if (!isxdigit((unsigned char)*digits)) {
        colld_set_err(err, err_len, "%s: '%s' is not an integer", label, text);
        return -1;
    }
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, base);
    if (*end != '\0') {
        colld_set_err(err, err_len, "%s: '%s' is not an integer", label, text);
        return -1;
    }
    if (errno == ERANGE) {
        colld_set_err(err, err_len, "%s: '%s' does not fit in a 64-bit integer", label, text);
        return -1;
    }
    if (e->min != 0 || e->max != 0) {
        if (v < e->min) {
            colld_set_err(err, err_len, "%s: %lld is below the minimum %" PRId64, label, v, e->min);
            return -1;
        }
        if (v > e->max) {
            colld_set_err(err, err_len, "%s: %lld is above the maximum %" PRId64, label, v, e->max);
            return -1;
        }
    }
    *out = (int64_t)v;
    return 0;
}

/* Parse a byte count: decimal digits, then optionally K, M or G (powers of 1024, any case),
 * optionally followed by B or iB ("4K", "4KB", "4KiB" and "4096" are the same). */
static int parse_size(const char *label, const char *text, uint64_t *out, char *err,
                      size_t err_len)
{
    static const char *const units = "KMG";
    if (!isdigit((unsigned char)text[0]))
        goto bad;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno == ERANGE)
        goto too_large;
    uint64_t mult = 1;
    const char *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
    if (u) {
        for (const char *k = units; k <= u; k++)
            mult *= 1024;
        end++;
        if ((end[0] == 'i' || end[0] == 'I') && (end[1] == 'B' || end[1] == 'b'))
            end++;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        goto bad;
    if (!colld_mul_ok(v, mult, out))
        goto too_large;
    return 0;
bad:
    colld_set_err(err, err_len,
            "%s: '%s' is not a size (a number of bytes with an optional K, M or G suffix)", label,
            text);
    return -1;
too_large:
    colld_set_err(err, err_len, "%s: '%s' is too large", label, text);
    return -1;
}

/* Parse 1/0, true/false, yes/no, on/off in any case. */
static int parse_bool(const char *label, const char *text, bool *out, char *err, size_t err_len)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < COLLD_ARRAY_SIZE(yes); i++) {
        if (strcasecmp(text, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(text, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    colld_set_err(err, err_len, "%s: '%s' is not a boolean (use true/false, yes/no, on/off or 1/0)",
            label, text);
    return -1;
}

/* Parse `text` for entry e and store it in obj; on error the field is left unchanged. A string
 * replaces (and frees) the previous one. `label` names the option in messages. */
static int set_value(const colld_config_entry_t *e, void *obj, const char *label, const char *text,
                     char *err, size_t err_len)
{
    void *field = field_of(e, obj);

    if (!text)
        text = "";
    switch (e->type) {
    case COLLD_CFG_STRING: {
        char *copy = strdup(text);
        if (!copy) {
            colld_set_err(err, err_len, "%s: out of memory", label);
            return -1;
        }
        char **slot = field;
        free(*slot);
        *slot = copy;
        return 0;
    }
    case COLLD_CFG_INT: {
        int64_t v;
        if (parse_int(e, label, text, &v, err, err_len) != 0)
            return -1;
        *(int64_t *)field = v;
        return 0;
    }
    case COLLD_CFG_BOOL: {
        bool v;
        if (parse_bool(label, text, &v, err, err_len) != 0)
            return -1;
        *(bool *)field = v;
        return 0;
    }
    case COLLD_CFG_SIZE: {
        uint64_t v;
        if (parse_size(label, text, &v, err, err_len) != 0)
            return -1;
        *(uint64_t *)field = v;
        return 0;
    }
    }
    colld_set_err(err, err_len, "%s: unknown option type %d in the configuration table", label,
            (int)e->type);
    return -1;
}

/* ------------------------------------------------------------------------------------------------
 * Sources
 * ---------------------------------------------------------------------------------------------- */

/* Store every entry's default. An empty or NULL default of a numeric type means 0 (false). */
static int apply_defaults(const colld_config_entry_t *table, size_t n, void *obj, char *err,
                          size_t err_len)
{
    char label[LABEL_MAX];
    for (size_t i = 0; i < n; i++) {
        const colld_config_entry_t *e = &table[i];
        const char *def = e->def ? e->def : "";
        if (!*def && e->type != COLLD_CFG_STRING)
            def = "0";
        snprintf(label, sizeof(label), "--%s (default)", e->name);
        if (set_value(e, obj, label, def, err, err_len) != 0)
            return -1;
    }
    return 0;
}

/* Store the environment value of every entry that has a variable and, when `only` is not NULL,
 * is that entry. */
static int apply_env(const colld_config_entry_t *table, size_t n, void *obj,
                     const colld_config_entry_t *only, char *err, size_t err_len)
{
    char label[LABEL_MAX];
    for (size_t i = 0; i < n; i++) {
        const colld_config_entry_t *e = &table[i];
        if (!e->env || (only && e != only))
            continue;
        const char *v = colld_config_env(e->env);
        if (!v)
            continue;
        snprintf(label, sizeof(label), "%s (--%s)", e->env, e->name);
        if (set_value(e, obj, label, v, err, err_len) != 0)
            return -1;
    }
    return 0;
}

typedef enum {
    ARGV_FIND_HELP,   /* only look for --help / -h; ignore everything else */
    ARGV_ONLY_ENTRY,  /* apply one entry's values; ignore the rest */
    ARGV_ALL,         /* apply everything; unknown options are errors */
} argv_mode_t;

/* Walk the command line: "--name value", "--name=value", "--flag" for a bool. All three modes use
 * the same walk so that they agree on which words are values. Returns 1 when mode is
 * ARGV_FIND_HELP and help was asked for, 0 when done, -1 on an error (only in the other modes).
 * `applied` (may be NULL) is set when a value was stored. */
static int walk_argv(const colld_config_entry_t *table, size_t n, void *obj, int argc, char **argv,
                     argv_mode_t mode, const colld_config_entry_t *only, bool *applied, char *err,
                     size_t err_len)
{
    char label[LABEL_MAX];
    for (int i = 1; i < argc && argv[i]; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            if (mode == ARGV_FIND_HELP)
                return 1;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            if (mode != ARGV_ALL)
                continue;
            colld_set_err(err, err_len, "unexpected argument '%s'; see --help", arg);
            return -1;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const colld_config_entry_t *e = find_entry(table, n, name, name_len);
        if (!e) {
            if (mode != ARGV_ALL)
                continue;
            colld_set_err(err, err_len, "unknown option --%.*s; see --help", (int)name_len, name);
            return -1;
        }
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (e->type == COLLD_CFG_BOOL) {
            value = "true";
        } else if (i + 1 < argc && argv[i + 1] && strncmp(argv[i + 1], "--", 2) != 0) {
            value = argv[++i];
        } else {
            if (mode == ARGV_FIND_HELP)
                continue;
            if (mode == ARGV_ONLY_ENTRY && e != only)
                continue;
            colld_set_err(err, err_len, "--%s: missing value", e->name);
            return -1;
        }
        if (mode == ARGV_FIND_HELP || (mode == ARGV_ONLY_ENTRY && e != only))
            continue;
        snprintf(label, sizeof(label), "--%s", e->name);
        if (set_value(e, obj, label, value, err, err_len) != 0)
            return -1;
        if (applied)
            *applied = true;
    }
    return 0;
}

/* Remove leading and trailing white space of s in place; returns the new start. */
static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t len = strlen(s);
    while (len > 0 && isspace((unsigned char)s[len - 1]))
        s[--len] = '\0';
    return s;
}

/* Split one config file line, already trimmed and not a comment, into its value: strip matching
 * quotes, or cut an unquoted value at a " #" comment. Returns NULL if a quote is not closed or
 * is followed by anything but a comment. */
static char *file_value(char *v)
{
    if (*v == '"' || *v == '\'') {
        char *close = strchr(v + 1, *v);
        if (!close)
            return NULL;
        *close = '\0';
        char *rest = trim(close + 1);
        if (*rest && *rest != '#')
            return NULL;
        return v + 1;
    }
    for (char *p = v; *p; p++) {
        if (*p == '#' && p > v && isspace((unsigned char)p[-1])) {
            *p = '\0';
            break;
        }
    }
    return trim(v);
}

/* Read "name = value" lines from path. `explicit_file` says the file was asked for (by env or
 * argv); a default config file that does not exist is skipped silently, as the daemon must start
 * without one. */
static int apply_file(const colld_config_entry_t *table, size_t n, void *obj, const char *path,
                      bool explicit_file, const colld_config_entry_t *config_entry, char *err,
                      size_t err_len)
{
    char label[LABEL_MAX];
    char *line = NULL;
    size_t cap = 0;
    int rc = -1;
    unsigned lineno = 0;

    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT && !explicit_file) {
            rc = 0;
            goto out;
        }
        colld_set_err(err, err_len, "--%s: cannot read '%s': %s", config_entry->name, path,
                strerror(errno));
        goto out;
    }
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        char *s = trim(line);
        if (*s == '\0' || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            colld_set_err(err, err_len, "%s:%u: expected 'name = value'", path, lineno);
            goto out;
        }
        *eq = '\0';
        char *key = trim(s);
        char *value = file_value(trim(eq + 1));
        if (*key == '\0' || !value) {
            colld_set_err(err, err_len, "%s:%u: expected 'name = value'", path, lineno);
            goto out;
        }
        const colld_config_entry_t *e = find_entry(table, n, key, strlen(key));
        if (!e) {
            colld_set_err(err, err_len, "%s:%u: unknown option '%s'", path, lineno, key);
            goto out;
        }
        if (e == config_entry) {
            colld_set_err(err, err_len, "%s:%u: '%s' cannot be set in a config file", path, lineno, key);
            goto out;
        }
        snprintf(label, sizeof(label), "%s:%u: %s", path, lineno, e->name);
        if (set_value(e, obj, label, value, err, err_len) != 0)
            goto out;
    }
    if (ferror(f)) {
        colld_set_err(err, err_len, "--%s: error reading '%s': %s", config_entry->name, path,
                strerror(errno));
        goto out;
    }
    rc = 0;
out:
    free(line);
    if (f)
        fclose(f);
    return rc;
}

/* Find and read the config file named by the "config" entry. Its value is settled first from its
 * own default, environment and command line; the file is read only if that value is non-empty. */
static int load_config_file(const colld_config_entry_t *table, size_t n, void *obj, int argc,
                            char **argv, char *err, size_t err_len)
{
    const colld_config_entry_t *ce = config_file_entry(table, n);
    if (!ce)
        return 0;
    bool explicit_file = ce->env && colld_config_env(ce->env);
    bool on_command_line = false;
    if (apply_env(table, n, obj, ce, err, err_len) != 0)
        return -1;
    if (walk_argv(table, n, obj, argc, argv, ARGV_ONLY_ENTRY, ce, &on_command_line, err,
                  err_len) != 0)
        return -1;
    const char *path = *(char **)field_of(ce, obj);
    if (!path || !*path)
        return 0;
    return apply_file(table, n, obj, path, explicit_file || on_command_line, ce, err, err_len);
}

/* ------------------------------------------------------------------------------------------------
 * Public functions
 * ---------------------------------------------------------------------------------------------- */

/* Apply defaults, config file, environment and command line in that order. --help is looked for
 * first and wins over every error except a bad default (a bug in the table). */
int colld_config_load(const colld_config_entry_t *table, size_t n, void *obj, int argc, char **argv,
                      char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (argc < 0 || !argv)
        argc = 0;
    if (apply_defaults(table, n, obj, err, err_len) != 0)
        return -1;
    if (walk_argv(table, n, obj, argc, argv, ARGV_FIND_HELP, NULL, NULL, err, err_len) == 1)
        return 1;
    if (load_config_file(table, n, obj, argc, argv, err, err_len) != 0)
        return -1;
    if (apply_env(table, n, obj, NULL, err, err_len) != 0)
        return -1;
    if (walk_argv(table, n, obj, argc, argv, ARGV_ALL, NULL, NULL, err, err_len) != 0)
        return -1;
    return 0;
}

/* Free every string field and set it to NULL, so the object can be freed or loaded again. */
void colld_config_free(const colld_config_entry_t *table, size_t n, void *obj)
{
    for (size_t i = 0; i < n; i++) {
        if (table[i].type != COLLD_CFG_STRING)
            continue;
        char **slot = field_of(&table[i], obj);
        free(*slot);
        *slot = NULL;
    }
}

/* Print the usage line, then one block per option: the flag with its environment variable,
 * default and bounds, and the doc line indented below it. */
void colld_config_print_help(FILE *out, const char *usage, const colld_config_entry_t *table,
                             size_t n)
{
    if (usage && *usage)
        fprintf(out, "%s\n\n", usage);
    fprintf(out, "Options (command line > environment > config file > default):\n");
    for (size_t i = 0; i < n; i++) {
        const colld_config_entry_t *e = &table[i];
        const char *def = e->def && *e->def ? e->def
                          : e->type == COLLD_CFG_STRING ? "none"
                          : e->type == COLLD_CFG_BOOL  ? "false"
                                                        : "0";
        fprintf(out, "  --%s%s  (", e->name, e->type == COLLD_CFG_BOOL ? "[=BOOL]" : " VALUE");
        if (e->env)
            fprintf(out, "env %s, ", e->env);
        fprintf(out, "default %s", def);
        if (e->type == COLLD_CFG_INT && (e->min != 0 || e->max != 0))
            fprintf(out, ", range %" PRId64 "..%" PRId64, e->min, e->max);
        fprintf(out, ")\n");
        if (e->doc && *e->doc)
            fprintf(out, "      %s\n", e->doc);
    }
    fprintf(out, "  -h, --help\n      print this help and exit\n");
}

/* Write one option's current value as config file text into buf (sizes in the largest K/M/G unit
 * that divides them exactly, so the file reads as the defaults do). */
static void format_value(const colld_config_entry_t *e, const void *obj, char *buf, size_t len)
{
    const void *field = (const char *)obj + e->offset;
    switch (e->type) {
    case COLLD_CFG_STRING: {
        const char *v = *(char *const *)field;
        snprintf(buf, len, "%s", v ? v : "");
        return;
    }
    case COLLD_CFG_INT:
        snprintf(buf, len, "%" PRId64, *(const int64_t *)field);
        return;
    case COLLD_CFG_BOOL:
        snprintf(buf, len, "%s", *(const bool *)field ? "true" : "false");
        return;
    case COLLD_CFG_SIZE: {
        uint64_t v = *(const uint64_t *)field;
        static const char units[] = "KMG";
        int u = -1;
        while (u < 2 && v && v % 1024 == 0) {
            v /= 1024;
            u++;
        }
        if (u < 0)
            snprintf(buf, len, "%" PRIu64, v);
        else
            snprintf(buf, len, "%" PRIu64 "%c", v, units[u]);
        return;
    }
    }
    snprintf(buf, len, "?");
}

/* Print `text` as "# " comment lines of at most about 96 columns, broken at spaces. */
static void print_comment(FILE *out, const char *text)
{
    const size_t width = 94;
    while (*text) {
        size_t len = strlen(text);
        if (len > width) {
            len = width;
            while (len > 0 && text[len] != ' ')
                len--;
            if (len == 0) /* one word longer than the line */
                len = strcspn(text, " ");
        }
        fprintf(out, "# %.*s\n", (int)len, text);
        text += len;
        while (*text == ' ')
            text++;
    }
}

/* Compare every option with a defaults-only copy and print each with its documentation. */
void colld_config_print_file(FILE *out, const char *header, const colld_config_entry_t *table, size_t n,
                             const void *obj)
{
    char value[PATH_MAX + 64], def[PATH_MAX + 64];
    if (header && *header)
        fprintf(out, "%s\n", header);
    for (size_t i = 0; i < n; i++) {
        const colld_config_entry_t *e = &table[i];
        format_value(e, obj, value, sizeof(value));
        /* The default in the same normal form (a size default "1M" stays "1M"). */
        if (e->type == COLLD_CFG_STRING || !e->def || !*e->def)
            snprintf(def, sizeof(def), "%s", e->def ? e->def : (e->type == COLLD_CFG_STRING ? "" : "0"));
        else
            snprintf(def, sizeof(def), "%s", e->def);
        bool is_default;
        if (e->type == COLLD_CFG_STRING) {
            is_default = strcmp(value, def) == 0;
        } else {
            /* Numbers: parse the default the way the loader does and compare the values. */
            char parsed[PATH_MAX + 64], err[64];
            uint64_t scratch[2] = { 0, 0 };
            colld_config_entry_t copy = *e;
            copy.offset = 0;
            is_default = set_value(&copy, scratch, "default", def, err, sizeof(err)) == 0;
            if (is_default) {
                format_value(&copy, scratch, parsed, sizeof(parsed));
                is_default = strcmp(parsed, value) == 0;
            }
        }
        fprintf(out, "\n");
        print_comment(out, e->doc ? e->doc : "");
        fprintf(out, "# (--%s%s%s, default %s)\n", e->name, e->env ? ", env " : "", e->env ? e->env : "",
                *def ? def : "none");
        bool quote = *value && (strchr(value, '#') || isspace((unsigned char)value[0]) ||
                                isspace((unsigned char)value[strlen(value) - 1]));
        const char *q = quote ? (strchr(value, '"') ? "'" : "\"") : "";
        if (e == config_file_entry(table, n)) /* names the file: never set inside one */
            fprintf(out, "#%s =\n", e->name);
        else if (!*value)
            fprintf(out, "%s%s =\n", is_default ? "#" : "", e->name);
        else
            fprintf(out, "%s%s = %s%s%s\n", is_default ? "#" : "", e->name, q, value, q);
    }
}
