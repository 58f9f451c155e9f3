/*
 * harness_opts.h - the command lines of the test rank programs (rank.c, coll_rank.c, p2p_rank.c,
 * tests/gpu/gpu_rank.c, gpu_p2p_rank.c): one table of options per program, parsed by getopt_long.
 *
 * Each option names where its value goes; numbers are checked whole and in range, and a bad or
 * unknown option is refused with a message naming it (exit code 2 by the programs' convention).
 *
 *     const harness_opt_t opts[] = {
 *         HARNESS_STR("socket", &a.socket),
 *         HARNESS_INT("nranks", &a.nranks),
 *         HARNESS_CLEAR("no-big", &a.big),
 *         HARNESS_FN("kinds", parse_kinds, &a),
 *         HARNESS_OUT,
 *     };
 *     if (HARNESS_PARSE_OPTS("coll_rank", argc, argv, opts) != 0)
 *         return 2;
 */
#ifndef COLLD_TESTS_HARNESS_OPTS_H
#define COLLD_TESTS_HARNESS_OPTS_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    HARNESS_OPT_STR,    /* --name VALUE: const char ** (argv's own string) */
    HARNESS_OPT_INT,    /* --name N: int *, a whole decimal number in int's range */
    HARNESS_OPT_U64,    /* --name N: unsigned long long *, a whole non-negative decimal number */
    HARNESS_OPT_DOUBLE, /* --name X: double *, a number (strtod, nothing after it) */
    HARNESS_OPT_SET,    /* --name: bool * set true */
    HARNESS_OPT_CLEAR,  /* --name: bool * set false */
    HARNESS_OPT_FN,     /* --name VALUE: fn(ctx, VALUE), 0 or -1 (after saying why on stderr) */
    HARNESS_OPT_ACTION, /* --name: fn(ctx, NULL) */
} harness_opt_kind_t;

typedef struct {
    const char *name; /* without the leading "--" */
    harness_opt_kind_t kind;
    void *dst;
    int (*fn)(void *ctx, const char *value);
    void *ctx;
} harness_opt_t;

/* One table entry each; the destination's type is checked (a wrong one is a compiler warning). */
#define HARNESS_OPT_(n, k, type, d) { .name = (n), .kind = (k), .dst = (1 ? (d) : (type)0) }
#define HARNESS_STR(n, d) HARNESS_OPT_(n, HARNESS_OPT_STR, const char **, d)
#define HARNESS_INT(n, d) HARNESS_OPT_(n, HARNESS_OPT_INT, int *, d)
#define HARNESS_U64(n, d) HARNESS_OPT_(n, HARNESS_OPT_U64, unsigned long long *, d)
#define HARNESS_DOUBLE(n, d) HARNESS_OPT_(n, HARNESS_OPT_DOUBLE, double *, d)
#define HARNESS_SET(n, d) HARNESS_OPT_(n, HARNESS_OPT_SET, bool *, d)
#define HARNESS_CLEAR(n, d) HARNESS_OPT_(n, HARNESS_OPT_CLEAR, bool *, d)
#define HARNESS_FN(n, f, c) { .name = (n), .kind = HARNESS_OPT_FN, .fn = (f), .ctx = (c) }
#define HARNESS_ACTION(n, f, c) { .name = (n), .kind = HARNESS_OPT_ACTION, .fn = (f), .ctx = (c) }

/* --out FILE: the program's stdout goes to FILE (created or truncated). */
int harness_opt_out(void *ctx, const char *path);
#define HARNESS_OUT HARNESS_FN("out", harness_opt_out, NULL)

/* --only inplace|outofplace: run just that half of each case (ctx: a harness_only_t). */
typedef struct {
    bool *inplace, *outofplace;
} harness_only_t;
int harness_opt_only(void *ctx, const char *which);
#define HARNESS_ONLY(in, out) HARNESS_FN("only", harness_opt_only, (&(harness_only_t){ (in), (out) }))

/* Parse argv against opts (every argument must be one of them). Returns 0, or 2 after printing
 * "prog: ..." on stderr for an unknown option, a missing or bad value, or a stray argument. */
int harness_parse_opts(const char *prog, int argc, char **argv, const harness_opt_t *opts, size_t nopts);
#define HARNESS_PARSE_OPTS(prog, argc, argv, opts)                                                                     \
    harness_parse_opts((prog), (argc), (argv), (opts), sizeof(opts) / sizeof((opts)[0]))

#endif /* COLLD_TESTS_HARNESS_OPTS_H */
