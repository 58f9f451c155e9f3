/*
 * harness_opts.c - the rank programs' command lines, from one table each (harness_opts.h).
 */
#include "tests/integration/harness_opts.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPT_VAL0 256 /* getopt_long's value of opts[0] (above every character getopt returns) */

int harness_opt_out(void *ctx, const char *path)
{
    (void)ctx;
    if (freopen(path, "w", stdout))
        return 0;
    perror(path);
    return -1;
}

int harness_opt_only(void *ctx, const char *which)
{
    harness_only_t *o = ctx;
    *o->inplace = strcmp(which, "inplace") == 0;
    *o->outofplace = strcmp(which, "outofplace") == 0;
    if (*o->inplace || *o->outofplace)
        return 0;
    fprintf(stderr, "--only %s: say inplace or outofplace\n", which);
    return -1;
}

/* A whole decimal number in [lo, hi] from text; false when there is anything else. */
static bool whole_number(const char *text, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* Store one option's value; 0 or -1 (said why). */
static int take(const char *prog, const harness_opt_t *o, const char *value)
{
    long long v;
    char *end;
    switch (o->kind) {
    case HARNESS_OPT_STR:
        *(const char **)o->dst = value;
        return 0;
    case HARNESS_OPT_INT:
        if (!whole_number(value, INT_MIN, INT_MAX, &v))
            break;
        *(int *)o->dst = (int)v;
        return 0;
    case HARNESS_OPT_U64:
        if (!whole_number(value, 0, LLONG_MAX, &v))
            break;
        *(unsigned long long *)o->dst = (unsigned long long)v;
        return 0;
    case HARNESS_OPT_DOUBLE:
        errno = 0;
        *(double *)o->dst = strtod(value, &end);
        if (errno != 0 || end == value || *end != '\0')
            break;
        return 0;
    case HARNESS_OPT_SET:
    case HARNESS_OPT_CLEAR:
        *(bool *)o->dst = o->kind == HARNESS_OPT_SET;
        return 0;
    case HARNESS_OPT_FN:
    case HARNESS_OPT_ACTION:
        return o->fn(o->ctx, value);
    }
    fprintf(stderr, "%s: --%s: '%s' is not a valid number\n", prog, o->name, value);
    return -1;
}

int harness_parse_opts(const char *prog, int argc, char **argv, const harness_opt_t *opts, size_t nopts)
{
    struct option *longopts = calloc(nopts + 1, sizeof(*longopts));
    if (!longopts) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return 2;
    }
    for (size_t i = 0; i < nopts; i++) {
        bool flag = opts[i].kind == HARNESS_OPT_SET || opts[i].kind == HARNESS_OPT_CLEAR ||
                    opts[i].kind == HARNESS_OPT_ACTION;
        longopts[i] = (struct option){ opts[i].name, flag ? no_argument : required_argument, NULL, OPT_VAL0 + (int)i };
    }
    int rc = 0, c, at = 0;
    opterr = 0;
    optind = 1;
    /* ":" first: a missing value is ':', an unknown option '?' (optind is past it either way). */
    while (rc == 0 && (c = getopt_long(argc, argv, ":", longopts, &at)) != -1) {
        if (c >= OPT_VAL0 && (size_t)(c - OPT_VAL0) < nopts) {
            if (take(prog, &opts[c - OPT_VAL0], optarg) < 0)
                rc = 2;
        } else {
            fprintf(stderr, "%s: %s %s\n", prog, c == ':' ? "no value for" : "unknown argument", argv[optind - 1]);
            rc = 2;
        }
    }
    if (rc == 0 && optind < argc) {
        fprintf(stderr, "%s: unexpected argument %s\n", prog, argv[optind]);
        rc = 2;
    }
    free(longopts);
    return rc;
}
