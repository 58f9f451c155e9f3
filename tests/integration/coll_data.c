/*
 * coll_data.c - the calls of the collective rank programs: sizes, inputs, expected results, the
 * slots around the buffers and the formatting of mismatches (see coll_data.h).
 */
#include "tests/integration/coll_data.h"

#include "kernels/cpu/reduce.h"
#include "tools/testdata/pattern.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const kind_names[K_COUNT] = { "allreduce",     "broadcast", "reduce",  "allgather",
                                          "reducescatter", "gather",    "scatter", "alltoall" };
const char *const dtype_names[COLLD_DTYPE_COUNT] = { "int8",   "uint8",   "int32",    "uint32",  "int64",
                                                     "uint64", "float16", "bfloat16", "float32", "float64" };
const char *const op_names[COLL_OPS] = { "sum", "prod", "min", "max", "avg", "premul_sum" };

static const size_t small_counts[SMALL_COUNTS] = { 0, 1, 1001 };

/* ---------------------------------------------------------------------------------------------
 * Data: sizes, inputs, expected results
 * ------------------------------------------------------------------------------------------- */

bool coll_reduces(int kind)
{
    return kind == K_ALLREDUCE || kind == K_REDUCE || kind == K_REDUCESCATTER;
}

void coll_call_sizes(const call_t *k, int n, size_t *send_elems, size_t *recv_elems)
{
    bool all_send = k->kind == K_REDUCESCATTER || k->kind == K_SCATTER || k->kind == K_ALLTOALL;
    bool all_recv = k->kind == K_ALLGATHER || k->kind == K_GATHER || k->kind == K_ALLTOALL;
    *send_elems = all_send ? (size_t)n * k->count : k->count;
    *recv_elems = all_recv ? (size_t)n * k->count : k->count;
}

size_t coll_inplace_bytes(const call_t *k, int n)
{
    size_t s, r;
    coll_call_sizes(k, n, &s, &r);
    return (s > r ? s : r) * colld_dtype_size(k->dt);
}

bool coll_receives(const call_t *k, int rank)
{
    return (k->kind != K_REDUCE && k->kind != K_GATHER) || rank == k->root;
}

int coll_prepare_data(call_t *k, int n, int rank, coll_pattern_fn pattern)
{
    size_t es = colld_dtype_size(k->dt), se, re;
    coll_call_sizes(k, n, &se, &re);
    k->mine = malloc(se * es + 1);
    k->expect = malloc(re * es + 1);
    k->inputs = coll_reduces(k->kind) ? malloc((size_t)n * k->count * es + 1) : NULL;
    if (!k->mine || !k->expect || (coll_reduces(k->kind) && !k->inputs))
        return -1;
    pattern(k->dt, rank, k->salt, 0, se, k->mine);
    switch (k->kind) {
    case K_ALLREDUCE:
    case K_REDUCE:
    case K_REDUCESCATTER: {
        /* reduce-scatter: this rank receives slice `rank` of every rank's input */
        size_t first = k->kind == K_REDUCESCATTER ? (size_t)rank * k->count : 0;
        const void *in[MAX_RANKS];
        for (int r = 0; r < n; r++) {
            unsigned char *p = k->inputs + (size_t)r * k->count * es;
            pattern(k->dt, r, k->salt, first, k->count, p);
            in[r] = p;
        }
        void *out[1] = { k->expect };
        uint64_t scalars[MAX_RANKS];
        for (int r = 0; r < n; r++)
            scalars[r] = coll_scalar(k, r);
        colld_status_t st = COLLD_OK;
        if (k->count)
            st = k->op == COLL_OP_PREMUL ? colld_cpu_reduce_premul_scalar(k->dt, scalars, in, n, out, 1, k->count)
                                         : colld_cpu_reduce_scalar(k->dt, k->op, in, n, out, 1, k->count);
        if (st != COLLD_OK)
            return -1;
        break;
    }
    case K_BROADCAST:
        pattern(k->dt, k->root, k->salt, 0, k->count, k->expect);
        break;
    case K_ALLGATHER:
    case K_GATHER:
        for (int r = 0; r < n; r++)
            pattern(k->dt, r, k->salt, 0, k->count, k->expect + (size_t)r * k->count * es);
        break;
    case K_SCATTER: /* block `rank` of the root's input */
        pattern(k->dt, k->root, k->salt, (size_t)rank * k->count, k->count, k->expect);
        break;
    case K_ALLTOALL: /* block r: block `rank` of rank r's input */
        for (int r = 0; r < n; r++)
            pattern(k->dt, r, k->salt, (size_t)rank * k->count, k->count, k->expect + (size_t)r * k->count * es);
        break;
    }
    return 0;
}

uint64_t coll_scalar(const call_t *k, int rank)
{
    return colld_cpu_pattern_scalar(k->dt, rank, k->salt, k->small);
}

colld_status_t coll_op_make(const call_t *k, int rank, colld_comm_t *comm, colld_redop_t *op)
{
    *op = k->op;
    if (k->op != COLL_OP_PREMUL)
        return COLLD_OK;
    uint64_t word = coll_scalar(k, rank); /* its first bytes are the value (little-endian host) */
    return colld_redop_create_premul_sum(comm, &word, k->dt, op);
}

colld_status_t coll_op_release(const call_t *k, colld_comm_t *comm, colld_redop_t op, colld_status_t st)
{
    if (k->op != COLL_OP_PREMUL)
        return st;
    colld_status_t d = colld_redop_destroy(comm, op);
    return st == COLLD_OK ? d : st;
}

void coll_free_data(call_t *k)
{
    free(k->mine);
    free(k->inputs);
    free(k->expect);
    k->mine = k->inputs = k->expect = NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Buffers
 * ------------------------------------------------------------------------------------------- */

void coll_prepare_buffers(call_t *k, int n, int rank)
{
    size_t es = colld_dtype_size(k->dt), se, re;
    coll_call_sizes(k, n, &se, &re);
    unsigned char *sbuf = k->sreg + GUARD, *rbuf = k->rreg + GUARD;
    bool is_root = rank == k->root;
    if (!k->inplace) {
        memset(k->sreg, SENTINEL, se * es + 2 * GUARD);
        memcpy(sbuf, k->mine, se * es);
        memset(k->rreg, SENTINEL, re * es + 2 * GUARD);
        k->sendp = sbuf;
        k->recvp = rbuf;
        if (k->null_unused && !is_root && (k->kind == K_BROADCAST || k->kind == K_SCATTER))
            k->sendp = NULL;
        if (k->null_unused && !is_root && (k->kind == K_REDUCE || k->kind == K_GATHER))
            k->recvp = NULL;
        return;
    }
    memset(k->rreg, SENTINEL, coll_inplace_bytes(k, n) + 2 * GUARD);
    switch (k->kind) {
    case K_GATHER: /* the root's send is its slice of its receive buffer */
        if (!is_root)
            goto whole;
        /* fall through */
    case K_ALLGATHER: /* send is this rank's slice of the receive buffer */
        memcpy(rbuf + (size_t)rank * k->count * es, k->mine, se * es);
        k->sendp = rbuf + (size_t)rank * k->count * es;
        k->recvp = rbuf;
        break;
    case K_SCATTER: /* the root's receive is its slice of its send buffer */
        if (!is_root)
            goto whole;
        /* fall through */
    case K_REDUCESCATTER: /* receive is this rank's slice of the send buffer */
        memcpy(rbuf, k->mine, se * es);
        k->sendp = rbuf;
        k->recvp = rbuf + (size_t)rank * k->count * es;
        break;
    case K_BROADCAST: /* only the root's buffer holds data */
        if (is_root)
            memcpy(rbuf, k->mine, se * es);
        k->sendp = k->recvp = rbuf;
        break;
    default:
    whole:
        memcpy(rbuf, k->mine, se * es);
        k->sendp = k->recvp = rbuf;
        break;
    }
}

bool coll_untouched(const unsigned char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != SENTINEL)
            return false;
    return true;
}

/* ---------------------------------------------------------------------------------------------
 * Reporting
 * ------------------------------------------------------------------------------------------- */

void coll_fmt_elem(colld_dtype_t dt, const void *p, char *buf, size_t len)
{
    switch (dt) {
    case COLLD_INT8:
        snprintf(buf, len, "%d", *(const int8_t *)p);
        break;
    case COLLD_UINT8:
        snprintf(buf, len, "%u", *(const uint8_t *)p);
        break;
    case COLLD_INT32:
        snprintf(buf, len, "%" PRId32, *(const int32_t *)p);
        break;
    case COLLD_UINT32:
        snprintf(buf, len, "%" PRIu32, *(const uint32_t *)p);
        break;
    case COLLD_INT64:
        snprintf(buf, len, "%" PRId64, *(const int64_t *)p);
        break;
    case COLLD_UINT64:
        snprintf(buf, len, "%" PRIu64, *(const uint64_t *)p);
        break;
    case COLLD_FLOAT16:
        snprintf(buf, len, "%.9g (0x%04x)", (double)colld_half_to_float(*(const uint16_t *)p), *(const uint16_t *)p);
        break;
    case COLLD_BFLOAT16:
        snprintf(buf, len, "%.9g (0x%04x)", (double)colld_bf16_to_float(*(const uint16_t *)p), *(const uint16_t *)p);
        break;
    case COLLD_FLOAT32: {
        uint32_t b;
        memcpy(&b, p, 4);
        snprintf(buf, len, "%.9g (0x%08" PRIx32 ")", (double)*(const float *)p, b);
        break;
    }
    case COLLD_FLOAT64: {
        uint64_t b;
        memcpy(&b, p, 8);
        snprintf(buf, len, "%.17g (0x%016" PRIx64 ")", *(const double *)p, b);
        break;
    }
    default:
        snprintf(buf, len, "?");
        break;
    }
}

/* The number of the first nelem elements of `got` and `want` (dtype dt) that differ bitwise;
 * *first is the index of the first of them (SIZE_MAX when none). */
static size_t count_diffs(colld_dtype_t dt, const unsigned char *got, const unsigned char *want, size_t nelem,
                          size_t *first)
{
    size_t es = colld_dtype_size(dt), wrong = 0;
    *first = SIZE_MAX;
    if (nelem == 0 || memcmp(got, want, nelem * es) == 0)
        return 0;
    for (size_t i = 0; i < nelem; i++)
        if (memcmp(got + i * es, want + i * es, es) != 0) {
            if (!wrong)
                *first = i;
            wrong++;
        }
    return wrong;
}

/* Print (stderr) the first few differing elements from `first` on, each with the inputs of the
 * n ranks that went into it (reductions). */
static void print_diffs(const call_t *k, int n, const unsigned char *got, const unsigned char *want, size_t nelem,
                        size_t first)
{
    size_t es = colld_dtype_size(k->dt);
    int shown = 0;
    for (size_t i = first; i < nelem && shown < 4; i++) {
        if (memcmp(got + i * es, want + i * es, es) == 0)
            continue;
        char g[64], w[64], ins[512] = "";
        coll_fmt_elem(k->dt, got + i * es, g, sizeof(g));
        coll_fmt_elem(k->dt, want + i * es, w, sizeof(w));
        if (k->inputs && i < k->count) {
            size_t off = 0;
            for (int r = 0; r < n && off < sizeof(ins) - 80; r++) {
                char v[64];
                coll_fmt_elem(k->dt, k->inputs + ((size_t)r * k->count + i) * es, v, sizeof(v));
                off += (size_t)snprintf(ins + off, sizeof(ins) - off, " r%d=%s", r, v);
            }
        }
        fprintf(stderr, "    element %zu: got %s, expected %s%s%s\n", i, g, w, ins[0] ? "; inputs" : "", ins);
        shown++;
    }
}

void coll_report(const coll_check_t *c, const call_t *k, const char *fmt, ...)
{
    if ((*c->reported)++ >= c->max_report)
        return;
    char d[320], what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    c->describe(c->ctx, k, d, sizeof(d));
    fprintf(stderr, "MISMATCH %s: %s\n", d, what);
}

/* Compare nelem elements bitwise; on a difference report it and print the first few with the
 * inputs that went into them. Returns the number of differing elements. */
static size_t compare(const coll_check_t *c, const call_t *k, const char *what, const unsigned char *got,
                      const unsigned char *want, size_t nelem)
{
    size_t first, wrong = count_diffs(k->dt, got, want, nelem, &first);
    if (!wrong)
        return 0;
    coll_report(c, k, "%s: %zu of %zu elements differ, first at %zu", what, wrong, nelem, first);
    if (*c->reported <= c->max_report)
        print_diffs(k, c->n, got, want, nelem, first);
    return wrong;
}

int coll_check_call(const coll_check_t *c, const call_t *k)
{
    int n = c->n, rank = c->rank;
    size_t es = colld_dtype_size(k->dt), se, re, bad = 0;
    coll_call_sizes(k, n, &se, &re);
    const unsigned char *sbuf = k->sreg + GUARD, *rbuf = k->rreg + GUARD;
    size_t rspan = k->inplace ? coll_inplace_bytes(k, n) : re * es;
    if (!coll_untouched(k->rreg, GUARD) || !coll_untouched(rbuf + rspan, GUARD)) {
        coll_report(c, k, "bytes around the receive buffer were overwritten%s", c->where);
        bad++;
    }
    if (coll_receives(k, rank)) {
        const unsigned char *res = rbuf;
        if (k->inplace && (k->kind == K_REDUCESCATTER || (k->kind == K_SCATTER && rank == k->root)))
            res = rbuf + (size_t)rank * k->count * es;
        bad += compare(c, k, "result", res, k->expect, re);
    } else if (k->inplace) {
        bad += compare(c, k, "non-root's buffer (must be unchanged)", rbuf, k->mine, se);
    } else if (!coll_untouched(rbuf, re * es)) { /* given or NULL, nothing may land there */
        coll_report(c, k, "the non-root's receive buffer was written");
        bad++;
    }
    if (!k->inplace) {
        if (!coll_untouched(k->sreg, GUARD) || !coll_untouched(sbuf + se * es, GUARD)) {
            coll_report(c, k, "bytes around the send buffer were overwritten%s", c->where);
            bad++;
        }
        bad += compare(c, k, "send buffer (must be unchanged)", sbuf, k->mine, se);
    }
    return bad ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------------
 * The matrix and the command line
 * ------------------------------------------------------------------------------------------- */

size_t coll_big_count(colld_dtype_t dt)
{
    return BIG_BYTES / colld_dtype_size(dt) + 3;
}

bool coll_big_selected(bool big_all, bool big_min, int kind, colld_dtype_t dt, colld_redop_t op)
{
    if (big_all)
        return true;
    if (big_min)
        return dt == COLLD_FLOAT32 && (!coll_reduces(kind) || op == COLLD_SUM);
    return !coll_reduces(kind) || op == COLLD_SUM || dt == COLLD_FLOAT32;
}

int coll_run_matrix(const coll_matrix_t *m, int iter, long *cases, int (*run)(void *ctx, call_t *k), void *ctx)
{
    for (int kk = 0; kk < K_COUNT; kk++) {
        int kind = (kk + m->rotate) % K_COUNT;
        if (!(m->kinds & (1u << kind)))
            continue;
        for (int d = 0; d < COLLD_DTYPE_COUNT; d++) {
            if (!(m->dtypes & (1u << d)))
                continue;
            for (int ci = 0; ci <= SMALL_COUNTS; ci++) {
                bool big = ci == SMALL_COUNTS;
                if (big && !m->big)
                    continue;
                size_t count = big ? coll_big_count((colld_dtype_t)d) : small_counts[ci];
                for (int op = 0; op < (coll_reduces(kind) ? COLL_OPS : 1); op++) {
                    if (coll_reduces(kind) && !(m->ops & (1u << op)))
                        continue;
                    if (big && !coll_big_selected(m->big_all, m->big_min, kind, (colld_dtype_t)d, (colld_redop_t)op))
                        continue;
                    long id = (*cases)++;
                    for (int mode = 0; mode < 2; mode++) {
                        bool inplace = mode == 1;
                        if ((inplace && !m->inplace) || (!inplace && !m->outofplace))
                            continue;
                        if (inplace && kind == K_ALLTOALL) /* it has no in-place form */
                            continue;
                        call_t k = { .kind = kind,
                                     .dt = (colld_dtype_t)d,
                                     .op = (colld_redop_t)op,
                                     .count = count,
                                     .root = (int)((id + mode) % m->n),
                                     .inplace = inplace,
                                     .null_unused = !inplace && (id / m->n) % 2 == 1,
                                     .salt = m->salt * 1000003u + (unsigned)iter * 7919u + (unsigned)id * 2u +
                                             (unsigned)mode,
                                     .small = m->small };
                        if (run(ctx, &k) < 0)
                            return 1;
                    }
                }
            }
        }
    }
    return 0;
}

int coll_lookup(const char *name, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

unsigned coll_parse_mask(const char *prog, const char *list, const char *const *names, int n)
{
    if (strcmp(list, "all") == 0)
        return (1u << n) - 1;
    unsigned m = 0;
    char buf[256], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int i = coll_lookup(t, names, n);
        if (i < 0) {
            fprintf(stderr, "%s: unknown name '%s'\n", prog, t);
            return 0;
        }
        m |= 1u << i;
    }
    return m;
}

int coll_opt_mask(void *ctx, const char *list)
{
    coll_mask_opt_t *o = ctx;
    *o->mask = coll_parse_mask("option", list, o->names, o->n);
    return *o->mask ? 0 : -1;
}
