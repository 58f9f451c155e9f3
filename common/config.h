/*
 * config.h - table-driven configuration (UCC style): one table per component of
 * {name, env, type, default, doc, offset}. Values come from, in rising precedence: the default,
 * the config file (lines "name = value", '#' comments), the environment (COLLD_<NAME>), then the
 * command line (--name value or --name=value; a bool flag --name alone means true).
 * This is the only module that calls getenv.
 */
#ifndef COLLD_COMMON_CONFIG_H
#define COLLD_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    COLLD_CFG_STRING, /* char * (strdup'ed; freed by colld_config_free) */
    COLLD_CFG_INT,    /* int64_t, decimal or 0x hex, with optional min/max */
    COLLD_CFG_BOOL,   /* bool: 1/0, true/false, yes/no, on/off */
    COLLD_CFG_SIZE,   /* uint64_t: bytes with optional K/M/G suffix (powers of 1024) */
} colld_config_type_t;

typedef struct {
    const char *name;    /* "socket": flag --socket, file key socket */
    const char *env;     /* "COLLD_SOCKET", or NULL for none */
    colld_config_type_t type;
    const char *def;     /* default as text; NULL = empty string / 0 */
    const char *doc;     /* one line */
    size_t offset;       /* offsetof(struct, field) */
    int64_t min, max;    /* bounds for INT (ignored when min == max == 0) */
} colld_config_entry_t;

/* Fill `obj` from the table: defaults, then `file_path` (NULL: none; if the table has an entry
 * named "config", its value from env/argv chooses the file), then environment, then argv
 * (argc/argv may be 0/NULL; argv[0] is skipped). Unknown flags, bad values, out-of-range numbers
 * and unreadable files are errors: returns -1 with a message naming the option in err. Returns 1
 * if --help was given (nothing else is an error then), else 0. Strings must be released with
 * colld_config_free. */
int colld_config_load(const colld_config_entry_t *table, size_t n, void *obj, int argc, char **argv,
                      char *err, size_t err_len);
/* Free the strings of obj. */
void colld_config_free(const colld_config_entry_t *table, size_t n, void *obj);
/* Print every option: flag, environment name, default and doc, one block per option. */
void colld_config_print_help(FILE *out, const char *usage, const colld_config_entry_t *table, size_t n);

/* Print obj as a config file (colld --print-config): `header` (each line already a "# " comment,
 * may be NULL), then per option its doc, environment name and default as comments and the line
 * "name = value". Options whose value equals the default are printed commented out, so the output
 * of a default configuration is the annotated list of every option, and loading it back gives the
 * same configuration. Values containing '#' or white space at either end are quoted. */
void colld_config_print_file(FILE *out, const char *header, const colld_config_entry_t *table, size_t n,
                             const void *obj);

/* Read one environment variable through the config module (for the client library, which has
 * no argv). Returns NULL when unset or empty. */
const char *colld_config_env(const char *name);

#endif /* COLLD_COMMON_CONFIG_H */
