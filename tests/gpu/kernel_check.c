/*
 * kernel_check.c - the check matrix of the CUDA kernels (see kernel_check.h).
 *
 * Reduce: every dtype x op (the premultiplied sum included, with a different scalar per input),
 * n_in in {1, 2, 3, 4, 8}, counts {0, 1, 7, 8, 1001, big}, three layouts
 * (every pointer 16-byte aligned; every pointer one element past that, so the head and tail are done
 * one element at a time; inputs and outputs at different offsets modulo 16, so nothing is
 * vectorised), each out of place into three outputs and in place (every input is also its rank's
 * output, as an in-place all-reduce). Inputs are colld_cpu_pattern's. Then special values: all 65536
 * float16/bfloat16 bit patterns, and all pairs and triples of extreme integers and floats (zeros,
 * subnormals, infinities, NaNs with payloads).
 * Copy: sizes from 0 to a few MiB, pointer offsets that select each unit width (16, 8, 4, 2, 1
 * bytes) with and without a head, one and three outputs, and a source that is also an output.
 */
#include "tests/gpu/kernel_check.h"

#include "tools/testdata/pattern.h"
#include "kernels/cpu/reduce.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 64    /* poisoned bytes checked on each side of every buffer a kernel may write */
#define POISON 0xa5 /* their value */
#define MAX_IN 8    /* the most inputs of the matrix */
#define N_OUT 3     /* outputs of the out-of-place cases */
#define MAX_REPORT 50

/* One run: the backend, its buffers and the tally. */
typedef struct {
    const kcheck_backend_t *b;
    size_t max_count;               /* elements a slot holds (at one element of offset) */
    size_t slot;                    /* bytes of one slot */
    void *master[MAX_IN][2];        /* read-only inputs at offset 0 and 1 element */
    void *scratch[MAX_IN];          /* in-place buffers, special inputs, copy sources */
    void *outs[N_OUT];              /* out-of-place outputs */
    unsigned char *host_in[MAX_IN]; /* the inputs on the host */
    unsigned char *want;            /* the oracle's result */
    unsigned char *got;             /* a buffer read back, guards included */
    int cases, failures;
} ctx_t;

static const colld_dtype_t all_dtypes[] = { COLLD_INT8,   COLLD_UINT8,   COLLD_INT32,    COLLD_UINT32,  COLLD_INT64,
                                            COLLD_UINT64, COLLD_FLOAT16, COLLD_BFLOAT16, COLLD_FLOAT32, COLLD_FLOAT64 };
static const int all_ops[] = { COLLD_SUM, COLLD_PROD, COLLD_MIN, COLLD_MAX, COLLD_AVG, KCHECK_PREMUL_SUM };

/* See kernel_check.h. */
const char *kcheck_dtype_name(colld_dtype_t dt)
{
    static const char *const names[] = { "int8",   "uint8",   "int32",    "uint32",  "int64",
                                         "uint64", "float16", "bfloat16", "float32", "float64" };
    return (unsigned)dt < COLLD_DTYPE_COUNT ? names[dt] : "?";
}

/* See kernel_check.h. */
const char *kcheck_op_name(int op)
{
    static const char *const names[] = { "sum", "prod", "min", "max", "avg", "premul_sum" };
    return (unsigned)op <= KCHECK_PREMUL_SUM ? names[op] : "?";
}

/* The scalar words of the premultiplied sum for inputs 0..MAX_IN-1 of a dtype (salt 11). */
static void premul_scalars(colld_dtype_t dt, uint64_t *s)
{
    for (int r = 0; r < MAX_IN; r++)
        s[r] = colld_cpu_pattern_scalar(dt, r, 11u, false);
}

/* The oracle: the scalar CPU build of op (scalars for the premultiplied sum). */
static colld_status_t oracle(colld_dtype_t dt, int op, const uint64_t *scalars, const void *const *in, int n_in,
                             void *const *out, size_t count)
{
    if (op == KCHECK_PREMUL_SUM)
        return colld_cpu_reduce_premul_scalar(dt, scalars, in, n_in, out, 1, count);
    return colld_cpu_reduce_scalar(dt, (colld_redop_t)op, in, n_in, out, 1, count);
}

/* Bytes of one element. */
static size_t esize(colld_dtype_t dt)
{
    switch (dt) {
    case COLLD_INT8:
    case COLLD_UINT8:
        return 1;
    case COLLD_FLOAT16:
    case COLLD_BFLOAT16:
        return 2;
    case COLLD_INT32:
    case COLLD_UINT32:
    case COLLD_FLOAT32:
        return 4;
    default:
        return 8;
    }
}

/* Element i of a buffer as an integer of its width (for messages and NaN tests). */
static uint64_t elem_bits(const unsigned char *p, size_t i, size_t es)
{
    uint64_t v = 0;
    memcpy(&v, p + i * es, es); /* little-endian: the low bytes */
    return v;
}

/* Whether the bits are a NaN of the dtype. */
static int bits_isnan(colld_dtype_t dt, uint64_t v)
{
    switch (dt) {
    case COLLD_FLOAT16:
        return (v & 0x7fffu) > 0x7c00u;
    case COLLD_BFLOAT16:
        return (v & 0x7fffu) > 0x7f80u;
    case COLLD_FLOAT32:
        return (v & 0x7fffffffu) > 0x7f800000u;
    case COLLD_FLOAT64:
        return (v & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    default:
        return 0;
    }
}

/* Count a case as failed, printing the message unless too many were printed already. */
static void fail(ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(ctx_t *c, const char *fmt, ...)
{
    va_list ap;

    if (++c->failures <= MAX_REPORT) {
        printf("FAIL [%s] ", c->b->name);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
    } else if (c->failures == MAX_REPORT + 1) {
        printf("(further failures are counted, not printed)\n");
    }
    fflush(stdout);
}

/* The data start of a slot at an offset of `off` bytes. */
static unsigned char *at(void *slot, size_t off)
{
    return (unsigned char *)slot + GUARD + off;
}

/* Poison the bytes of a slot around and under [data, data + bytes) (guards included). */
static int poison(ctx_t *c, unsigned char *data, size_t bytes)
{
    return c->b->fill(data - GUARD, POISON, bytes + 2 * GUARD);
}

/* Read [data - GUARD, data + count*es + GUARD) back and check: both guards still poison, and the
 * data equal to `want` bitwise (NaN matching any NaN where nan_any). `what` describes the case.
 * Returns 1 when it matches. */
static int check_region(ctx_t *c, const char *what, colld_dtype_t dt, const unsigned char *data,
                        const unsigned char *want, size_t count, size_t es, int nan_any)
{
    size_t bytes = count * es;

    if (c->b->get(c->got, data - GUARD, bytes + 2 * GUARD) != 0) {
        fail(c, "%s: reading the result back failed", what);
        return 0;
    }
    for (size_t k = 0; k < GUARD; k++) {
        if (c->got[k] != POISON || c->got[GUARD + bytes + k] != POISON) {
            size_t before = c->got[k] != POISON;
            fail(c, "%s: the byte %zu %s the data was written (0x%02x)", what, before ? GUARD - k : k + 1,
                 before ? "bytes before" : "bytes after", before ? c->got[k] : c->got[GUARD + bytes + k]);
            return 0;
        }
    }
    if (memcmp(c->got + GUARD, want, bytes) == 0)
        return 1;
    for (size_t i = 0; i < count; i++) {
        uint64_t g = elem_bits(c->got + GUARD, i, es), w = elem_bits(want, i, es);
        if (g != w && !(nan_any && bits_isnan(dt, g) && bits_isnan(dt, w))) {
            fail(c, "%s: element %zu is 0x%0*llx, the CPU oracle gives 0x%0*llx", what, i, (int)(2 * es),
                 (unsigned long long)g, (int)(2 * es), (unsigned long long)w);
            return 0;
        }
    }
    return 1; /* only NaNs with other payloads, where allowed */
}

/* ---------------------------------------------------------------------------------------------
 * Reduce: the pattern matrix.
 * ------------------------------------------------------------------------------------------- */

enum { LAYOUT_ALIGNED, LAYOUT_SHIFTED, LAYOUT_MIXED, LAYOUT_COUNT };
static const char *const layout_names[] = { "aligned", "shifted", "mixed" };

/* The offset in elements of input r and output o in a layout. */
static size_t in_off(int layout, int r)
{
    return layout == LAYOUT_ALIGNED ? 0 : layout == LAYOUT_SHIFTED ? 1 : (size_t)(r & 1);
}

static size_t out_off(int layout, int o)
{
    return layout == LAYOUT_ALIGNED ? 0 : layout == LAYOUT_SHIFTED ? 1 : (size_t)((o + 1) & 1);
}

/* One reduce case out of place: inputs from the masters, N_OUT outputs. */
static void reduce_out_of_place(ctx_t *c, colld_dtype_t dt, int op, const uint64_t *scalars, int n_in, size_t count,
                                int layout)
{
    size_t es = esize(dt);
    const void *in[MAX_IN];
    void *out[N_OUT];
    char what[160];
    colld_status_t st;

    snprintf(what, sizeof what, "reduce %s %s n_in=%d count=%zu %s out-of-place", kcheck_dtype_name(dt),
             kcheck_op_name(op), n_in, count, layout_names[layout]);
    c->cases++;
    for (int r = 0; r < n_in; r++)
        in[r] = at(c->master[r][in_off(layout, r)], in_off(layout, r) * es);
    for (int o = 0; o < N_OUT; o++) {
        out[o] = at(c->outs[o], out_off(layout, o) * es);
        if (poison(c, out[o], count * es) != 0) {
            fail(c, "%s: poisoning the outputs failed", what);
            return;
        }
    }
    st = c->b->reduce(dt, op, scalars, in, n_in, out, N_OUT, count);
    if (st != COLLD_OK) {
        fail(c, "%s: %s", what, colld_status_name(st));
        return;
    }
    for (int o = 0; o < N_OUT; o++) {
        char w[200];
        snprintf(w, sizeof w, "%s output %d", what, o);
        if (!check_region(c, w, dt, out[o], c->want, count, es, 0))
            return;
    }
}

/* One reduce case in place: every input is a scratch copy of its master and also an output. */
static void reduce_in_place(ctx_t *c, colld_dtype_t dt, int op, const uint64_t *scalars, int n_in, size_t count,
                            int layout)
{
    size_t es = esize(dt);
    void *buf[MAX_IN];
    char what[160];
    colld_status_t st;

    snprintf(what, sizeof what, "reduce %s %s n_in=%d count=%zu %s in-place", kcheck_dtype_name(dt), kcheck_op_name(op),
             n_in, count, layout_names[layout]);
    c->cases++;
    for (int r = 0; r < n_in; r++) {
        size_t off = in_off(layout, r);
        buf[r] = at(c->scratch[r], off * es);
        if (poison(c, buf[r], count * es) != 0 ||
            (count > 0 && c->b->dcopy(buf[r], at(c->master[r][off], off * es), count * es) != 0)) {
            fail(c, "%s: preparing the buffers failed", what);
            return;
        }
    }
    st = c->b->reduce(dt, op, scalars, (const void *const *)buf, n_in, buf, n_in, count);
    if (st != COLLD_OK) {
        fail(c, "%s: %s", what, colld_status_name(st));
        return;
    }
    for (int r = 0; r < n_in; r++) {
        char w[200];
        snprintf(w, sizeof w, "%s buffer %d", what, r);
        if (!check_region(c, w, dt, buf[r], c->want, count, es, 0))
            return;
    }
}

/* The pattern matrix of one dtype. */
static void reduce_matrix(ctx_t *c, colld_dtype_t dt)
{
    static const int n_ins[] = { 1, 2, 3, 4, MAX_IN };
    size_t counts[] = { 0, 1, 7, 8, 1001, c->b->big_count };
    size_t es = esize(dt), big = c->b->big_count;
    const void *hin[MAX_IN];
    void *want[1] = { c->want };
    uint64_t scalars[MAX_IN];

    premul_scalars(dt, scalars);
    /* Inputs: on the host, and in the masters at both offsets (poison around them). */
    for (int r = 0; r < MAX_IN; r++) {
        colld_cpu_pattern(dt, r, 7u, 0, big, c->host_in[r]);
        hin[r] = c->host_in[r];
        for (size_t off = 0; off < 2; off++) {
            unsigned char *d = at(c->master[r][off], off * es);
            if (poison(c, d, big * es) != 0 || c->b->put(d, c->host_in[r], big * es) != 0) {
                fail(c, "reduce %s: uploading the inputs failed", kcheck_dtype_name(dt));
                return;
            }
        }
    }

    for (size_t oi = 0; oi < sizeof all_ops / sizeof all_ops[0]; oi++)
        for (size_t ni = 0; ni < sizeof n_ins / sizeof n_ins[0]; ni++)
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                int op = all_ops[oi];
                int n_in = n_ins[ni];
                size_t count = counts[ci];
                const uint64_t *sc = op == KCHECK_PREMUL_SUM ? scalars : NULL;

                if (count > 0 && oracle(dt, op, sc, hin, n_in, want, count) != COLLD_OK) {
                    fail(c, "reduce %s %s: the CPU oracle failed", kcheck_dtype_name(dt), kcheck_op_name(op));
                    continue;
                }
                for (int layout = 0; layout < LAYOUT_COUNT; layout++) {
                    reduce_out_of_place(c, dt, op, sc, n_in, count, layout);
                    reduce_in_place(c, dt, op, sc, n_in, count, layout);
                }
            }

    /* The masters are inputs only: they must be exactly as uploaded, guards included. */
    for (int r = 0; r < MAX_IN; r++)
        for (size_t off = 0; off < 2; off++) {
            char w[120];
            snprintf(w, sizeof w, "reduce %s: input %d (offset %zu) after every case", kcheck_dtype_name(dt), r, off);
            c->cases++;
            check_region(c, w, dt, at(c->master[r][off], off * es), c->host_in[r], big, es, 0);
        }
}

/* ---------------------------------------------------------------------------------------------
 * Reduce: special values.
 * ------------------------------------------------------------------------------------------- */

/* The special values of a dtype (as bits); returns how many. */
static size_t specials(colld_dtype_t dt, uint64_t *v)
{
    static const uint64_t i8[] = { 0, 1, 0xff, 2, 0xfe, 0x7f, 0x80, 0x7e, 0x81, 0x40, 0xc0, 3, 0x55 };
    static const uint64_t i32[] = { 0,           1,           0xffffffffu, 2,           0xfffffffeu,
                                    0x7fffffffu, 0x80000000u, 0x7ffffffeu, 0x80000001u, 0x10000u,
                                    0xffff0000u, 46341,       3,           0x55555555u };
    static const uint64_t i64[] = { 0,
                                    1,
                                    0xffffffffffffffffull,
                                    2,
                                    0xfffffffffffffffeull,
                                    0x7fffffffffffffffull,
                                    0x8000000000000000ull,
                                    0x7ffffffffffffffeull,
                                    0x8000000000000001ull,
                                    0x100000000ull,
                                    0xffffffff00000000ull,
                                    3037000500ull,
                                    3,
                                    0x5555555555555555ull };
    static const uint64_t f32[] = { 0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u,
                                    0x3dcccccdu, /* +0 -0 1 -1 0.1 */
                                    0xc0600000u, 0x00800000u, 0x80800000u, 0x00000001u,
                                    0x807fffffu,                                          /* -3.5 min -min denorms */
                                    0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,   /* max -max inf -inf */
                                    0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fa12345u,   /* NaNs, signalling ones */
                                    0x3eaaaaabu, 0x7149f2cau, 0x0da24260u, 0x40400000u }; /* 1/3 1e30 1e-30 3 */
    static const uint64_t f64[] = { 0x0000000000000000ull, 0x8000000000000000ull, 0x3ff0000000000000ull,
                                    0xbff0000000000000ull, 0x3fb999999999999aull, 0xc00c000000000000ull,
                                    0x0010000000000000ull, 0x8010000000000000ull, 0x0000000000000001ull,
                                    0x800fffffffffffffull, 0x7fefffffffffffffull, 0xffefffffffffffffull,
                                    0x7ff0000000000000ull, 0xfff0000000000000ull, 0x7ff8000000000000ull,
                                    0xfff8000000000001ull, 0x7ff0000000000001ull, 0x7ff4123456789abcull,
                                    0x3fd5555555555555ull, 0x46293e5939a08ceaull, 0x39b4484bfeebc2a0ull,
                                    0x4008000000000000ull };
    const uint64_t *src;
    size_t n;

    switch (dt) {
    case COLLD_INT8:
    case COLLD_UINT8:
        src = i8, n = sizeof i8 / sizeof i8[0];
        break;
    case COLLD_INT32:
    case COLLD_UINT32:
        src = i32, n = sizeof i32 / sizeof i32[0];
        break;
    case COLLD_INT64:
    case COLLD_UINT64:
        src = i64, n = sizeof i64 / sizeof i64[0];
        break;
    case COLLD_FLOAT32:
        src = f32, n = sizeof f32 / sizeof f32[0];
        break;
    case COLLD_FLOAT64:
        src = f64, n = sizeof f64 / sizeof f64[0];
        break;
    default:
        return 0;
    }
    memcpy(v, src, n * sizeof v[0]);
    return n;
}

/* Special inputs of a dtype into host_in[0..2]; returns the element count. float16/bfloat16: every
 * bit pattern in input 0 and two permutations of them in inputs 1 and 2. Others: all pairs (i, j)
 * of the special values, input 2 the value (i + j) mod n. */
static size_t special_inputs(ctx_t *c, colld_dtype_t dt)
{
    size_t es = esize(dt);
    uint64_t v[32];
    size_t n;

    if (dt == COLLD_FLOAT16 || dt == COLLD_BFLOAT16) {
        for (uint32_t k = 0; k < 65536; k++) {
            uint16_t x[3] = { (uint16_t)k, (uint16_t)(k * 40503u + 12345u), (uint16_t)(k * 0x9e37u + 777u) };
            for (int r = 0; r < 3; r++)
                memcpy(c->host_in[r] + k * es, &x[r], es);
        }
        return 65536;
    }
    n = specials(dt, v);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            size_t k = i * n + j;
            memcpy(c->host_in[0] + k * es, &v[i], es);
            memcpy(c->host_in[1] + k * es, &v[j], es);
            memcpy(c->host_in[2] + k * es, &v[(i + j) % n], es);
        }
    return n * n;
}

/* Special values of one dtype: every op with n_in 1, 2, 3, out of place (two outputs) and in place.
 * The premultiplied sum takes the special values as inputs and as scalars (input r's scalar is
 * the r-th special value after a shift, so zeros, infinities and NaNs meet every input). */
static void reduce_specials(ctx_t *c, colld_dtype_t dt)
{
    size_t es = esize(dt), count = special_inputs(c, dt);
    const void *hin[3] = { c->host_in[0], c->host_in[1], c->host_in[2] };
    void *want[1] = { c->want };
    uint64_t v[32], scalars[3] = { 0, 0, 0 };
    size_t nv = specials(dt, v);

    for (int r = 0; r < 3; r++) {
        if (nv) /* integers, float32, float64: special values as scalars */
            scalars[r] = v[(size_t)(3 * r + 4) % nv];
        else /* float16, bfloat16: every bit pattern is an input already; ordinary scalars */
            scalars[r] = colld_cpu_pattern_scalar(dt, r, 5u, false);
    }

    for (size_t oi = 0; oi < sizeof all_ops / sizeof all_ops[0]; oi++)
        for (int n_in = 1; n_in <= 3; n_in++)
            for (int in_place = 0; in_place < 2; in_place++) {
                int op = all_ops[oi];
                const uint64_t *sc = op == KCHECK_PREMUL_SUM ? scalars : NULL;
                /* A NaN made by arithmetic may have another payload on the GPU (see cuda_kernels.h);
                 * min/max only select, and a single input is only converted: those are exact. */
                int nan_any = (op == COLLD_SUM || op == COLLD_PROD) ? n_in > 1
                                                                    : op == COLLD_AVG || op == KCHECK_PREMUL_SUM;
                void *in[3], *out[3];
                int n_out = in_place ? n_in : 2;
                char what[160];
                colld_status_t st;

                snprintf(what, sizeof what, "reduce %s %s n_in=%d special values %s", kcheck_dtype_name(dt),
                         kcheck_op_name(op), n_in, in_place ? "in-place" : "out-of-place");
                c->cases++;
                if (oracle(dt, op, sc, hin, n_in, want, count) != COLLD_OK) {
                    fail(c, "%s: the CPU oracle failed", what);
                    continue;
                }
                for (int r = 0; r < n_in; r++) {
                    in[r] = at(c->scratch[r], 0);
                    if (poison(c, in[r], count * es) != 0 || c->b->put(in[r], hin[r], count * es) != 0) {
                        fail(c, "%s: uploading the inputs failed", what);
                        return;
                    }
                }
                for (int o = 0; o < n_out; o++) {
                    out[o] = in_place ? in[o] : at(c->outs[o], 0);
                    if (!in_place && poison(c, out[o], count * es) != 0) {
                        fail(c, "%s: poisoning the outputs failed", what);
                        return;
                    }
                }
                st = c->b->reduce(dt, op, sc, (const void *const *)in, n_in, out, n_out, count);
                if (st != COLLD_OK) {
                    fail(c, "%s: %s", what, colld_status_name(st));
                    continue;
                }
                for (int o = 0; o < n_out; o++) {
                    char w[200];
                    snprintf(w, sizeof w, "%s output %d", what, o);
                    if (!check_region(c, w, dt, out[o], c->want, count, es, nan_any))
                        break;
                }
            }
}

/* ---------------------------------------------------------------------------------------------
 * Copy.
 * ------------------------------------------------------------------------------------------- */

/* Byte offsets of the source and the three outputs, chosen so that the plan takes each unit width,
 * with and without a head. */
static const struct {
    size_t src, out[N_OUT];
} copy_layouts[] = {
    { 0, { 0, 0, 0 } },   /* unit 16 */
    { 5, { 5, 21, 37 } }, /* unit 16, head 11 */
    { 0, { 8, 24, 0 } },  /* unit 8 */
    { 4, { 12, 4, 28 } }, /* unit 8, head 4 */
    { 2, { 6, 10, 14 } }, /* unit 4, head 2 */
    { 1, { 3, 5, 7 } },   /* unit 2, head 1 */
    { 0, { 1, 2, 3 } },   /* unit 1 */
};

/* The copy matrix. */
static void copy_matrix(ctx_t *c)
{
    size_t sizes[] = { 0, 1, 7, 8, 15, 16, 17, 33, 1001, 4 * c->b->big_count + 3 };
    size_t maxb = sizes[sizeof sizes / sizeof sizes[0] - 1];
    unsigned char *data = c->host_in[0];

    colld_cpu_pattern(COLLD_UINT8, 0, 11u, 0, maxb, data);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t li = 0; li < sizeof copy_layouts / sizeof copy_layouts[0]; li++)
            for (int variant = 0; variant < 4; variant++) {
                /* 0: one output; 1: three outputs; 2: the source is output 0 of three (a broadcast
                 * root in place); 3: the source is the only output (nothing to do). */
                static const int n_outs[] = { 1, N_OUT, N_OUT, 1 };
                size_t bytes = sizes[si];
                int n_out = n_outs[variant];
                unsigned char *src = at(c->scratch[0], copy_layouts[li].src);
                void *out[N_OUT];
                char what[160];
                colld_status_t st;

                snprintf(what, sizeof what, "copy bytes=%zu offsets src+%zu out+%zu/%zu/%zu variant %d", bytes,
                         copy_layouts[li].src, copy_layouts[li].out[0], copy_layouts[li].out[1],
                         copy_layouts[li].out[2], variant);
                c->cases++;
                if (poison(c, src, bytes) != 0 || c->b->put(src, data, bytes) != 0) {
                    fail(c, "%s: uploading the source failed", what);
                    return;
                }
                for (int o = 0; o < n_out; o++) {
                    out[o] = variant >= 2 && o == 0 ? (void *)src : at(c->outs[o], copy_layouts[li].out[o]);
                    if (out[o] != src && poison(c, out[o], bytes) != 0) {
                        fail(c, "%s: poisoning the outputs failed", what);
                        return;
                    }
                }
                st = c->b->copy(src, out, n_out, bytes);
                if (st != COLLD_OK) {
                    fail(c, "%s: %s", what, colld_status_name(st));
                    continue;
                }
                if (!check_region(c, what, COLLD_UINT8, src, data, bytes, 1, 0))
                    continue;
                for (int o = 0; o < n_out; o++) {
                    char w[200];
                    snprintf(w, sizeof w, "%s output %d", what, o);
                    if (!check_region(c, w, COLLD_UINT8, out[o], data, bytes, 1, 0))
                        break;
                }
            }
}

/* ---------------------------------------------------------------------------------------------
 * The run.
 * ------------------------------------------------------------------------------------------- */

/* Free whatever setup got. */
static void teardown(ctx_t *c)
{
    for (int r = 0; r < MAX_IN; r++) {
        for (int k = 0; k < 2; k++)
            if (c->master[r][k])
                c->b->release(c->master[r][k]);
        if (c->scratch[r])
            c->b->release(c->scratch[r]);
        free(c->host_in[r]);
    }
    for (int o = 0; o < N_OUT; o++)
        if (c->outs[o])
            c->b->release(c->outs[o]);
    free(c->want);
    free(c->got);
}

/* See kernel_check.h. */
int kcheck_run(const kcheck_backend_t *b)
{
    ctx_t c;
    int ok = 1;

    memset(&c, 0, sizeof c);
    c.b = b;
    /* Room for the largest reduce (8-byte elements at one element of offset), the special values
     * (65536 elements) and the largest copy (4 * big_count + 3 bytes at up to 37 bytes of offset). */
    c.max_count = b->big_count > 65536 ? b->big_count : 65536;
    c.slot = (GUARD + (c.max_count + 8) * 8 + GUARD + 255) / 256 * 256;
    for (int r = 0; r < MAX_IN && ok; r++) {
        for (int k = 0; k < 2; k++)
            ok &= (c.master[r][k] = b->alloc(c.slot)) != NULL;
        ok &= (c.scratch[r] = b->alloc(c.slot)) != NULL;
        ok &= (c.host_in[r] = malloc(c.slot)) != NULL;
    }
    for (int o = 0; o < N_OUT && ok; o++)
        ok &= (c.outs[o] = b->alloc(c.slot)) != NULL;
    ok = ok && (c.want = malloc(c.slot)) != NULL && (c.got = malloc(c.slot)) != NULL;
    if (!ok) {
        printf("[%s] could not allocate the test buffers (%zu bytes each)\n", b->name, c.slot);
        teardown(&c);
        return -1;
    }

    for (size_t d = 0; d < sizeof all_dtypes / sizeof all_dtypes[0]; d++) {
        int before = c.failures;
        reduce_matrix(&c, all_dtypes[d]);
        reduce_specials(&c, all_dtypes[d]);
        printf("[%s] reduce %-8s %s\n", b->name, kcheck_dtype_name(all_dtypes[d]),
               c.failures == before ? "ok" : "FAILED");
        fflush(stdout);
    }
    {
        int before = c.failures;
        copy_matrix(&c);
        printf("[%s] copy %s\n", b->name, c.failures == before ? "ok" : "FAILED");
    }
    printf("[%s] %d cases, %d failed\n", b->name, c.cases, c.failures);
    teardown(&c);
    return c.failures;
}
