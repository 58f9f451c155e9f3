/*
 * test_cuda_emulated.cu - the CUDA kernels without a GPU (ctest gpu_kernels_emulated, label unit).
 *
 * The kernel bodies of kernels/cuda/cuda_core.cuh are __host__ __device__: this test runs them on
 * the CPU, one emulated thread after another, over the plan that the real launchers compute
 * (plan.c), and puts them through the same check matrix as the GPU test (kernel_check.c), bitwise
 * against the scalar CPU oracle. It checks the indexing (head, 16-byte body, tail, grid stride), the
 * in-place rule (each work item is read before it is written, by one thread), and the arithmetic
 * of every dtype x op as written for the device, with host operators in place of the device's
 * correctly rounded intrinsics. Not covered here: the device compiler's code, the launch, and the
 * device intrinsics themselves (the GPU test covers them where a GPU exists).
 *
 * It also checks the launchers' argument validation and plans, and that a valid launch without
 * loaded kernels is a clear COLLD_ERR_DEVICE.
 */
#include "kernels/cuda/cuda_core.cuh"

extern "C" {
#include "tests/gpu/kernel_check.h"
}

#include <cstdio>
#include <cstdlib>
#include <cstring>

typedef void (*reduce_body_fn)(const colld__cuda_reduce_params_t &p, size_t tid, size_t nthreads);

/* The host instantiation of every reduce body, from the same lists as the kernels. */
static reduce_body_fn reduce_body(colld_dtype_t dtype, int op)
{
#define OP_CASE(name, E_OP, opname)                                                                                    \
    case E_OP:                                                                                                         \
        return colld__cuda_reduce_body<colld__cuda_t_##name, E_OP>;
#define DTYPE_CASE(E, name, T, A, U, W, K)                                                                             \
    case E:                                                                                                            \
        switch (op) {                                                                                                  \
            COLLD_REDUCE_OPS(OP_CASE, name)                                                                            \
        default:                                                                                                       \
            return NULL;                                                                                               \
        }
    switch (dtype) {
        COLLD_REDUCE_DTYPES(DTYPE_CASE)
    default:
        return NULL;
    }
#undef DTYPE_CASE
#undef OP_CASE
}

/* The emulated grid: alternately the grid launch.c would use on a 132-multiprocessor GPU
 * (an H100/H200), and a small odd number of threads, so that every thread loops several times. */
static size_t emulated_threads(size_t work)
{
    static unsigned calls;
    size_t blocks = (work + COLLD__CUDA_THREADS - 1) / COLLD__CUDA_THREADS;

    if (calls++ % 2)
        return 37;
    if (blocks > 132 * COLLD__CUDA_BLOCKS_PER_SM)
        blocks = 132 * COLLD__CUDA_BLOCKS_PER_SM;
    return (blocks < 1 ? 1 : blocks) * COLLD__CUDA_THREADS;
}

static colld_status_t emu_reduce(colld_dtype_t dtype, int op, const uint64_t *scalars, const void *const *in, int n_in,
                                 void *const *out, int n_out, size_t count)
{
    colld__cuda_reduce_params_t p;
    size_t work, nthreads;
    /* The matrix's premultiplied sum is the kernels' premul_sum (the same number). */
    static_assert(KCHECK_PREMUL_SUM == COLLD__REDOP_PREMUL_SUM, "one number for the premultiplied sum");
    colld_status_t st = colld__cuda_reduce_plan(dtype, op, scalars, in, n_in, out, n_out, count, &p, &work);

    if (st != COLLD_OK || work == 0)
        return st;
    reduce_body_fn body = reduce_body(dtype, op);
    nthreads = emulated_threads(work);
    for (size_t tid = 0; tid < nthreads; tid++)
        body(p, tid, nthreads);
    return COLLD_OK;
}

static colld_status_t emu_copy(const void *src, void *const *out, int n_out, size_t bytes)
{
    colld__cuda_copy_params_t p;
    size_t work, nthreads;
    colld_status_t st = colld__cuda_copy_plan(src, out, n_out, bytes, &p, &work);

    if (st != COLLD_OK || work == 0)
        return st;
    nthreads = emulated_threads(work);
    for (size_t tid = 0; tid < nthreads; tid++) {
        switch (p.unit) {
        case 16:
            colld__cuda_copy_body<uint4>(p, tid, nthreads);
            break;
        case 8:
            colld__cuda_copy_body<uint2>(p, tid, nthreads);
            break;
        case 4:
            colld__cuda_copy_body<unsigned int>(p, tid, nthreads);
            break;
        case 2:
            colld__cuda_copy_body<unsigned short>(p, tid, nthreads);
            break;
        default:
            colld__cuda_copy_body<unsigned char>(p, tid, nthreads);
            break;
        }
    }
    return COLLD_OK;
}

/* "Device" memory: 256-byte aligned like cudaMalloc's. */
static void *emu_alloc(size_t bytes)
{
    return aligned_alloc(256, (bytes + 255) / 256 * 256);
}

static void emu_release(void *p)
{
    free(p);
}

static int emu_memcpy(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return 0;
}

static int emu_fill(void *dst, int byte, size_t bytes)
{
    memset(dst, byte, bytes);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Argument checks and plans of the real launchers.
 * ------------------------------------------------------------------------------------------- */

static int api_failures;

/* Expect `got` == `want`; on an error status also a non-empty colld_cuda_last_error(). */
static void expect(const char *what, colld_status_t got, colld_status_t want)
{
    if (got != want) {
        printf("FAIL [api] %s: %s, expected %s (%s)\n", what, colld_status_name(got), colld_status_name(want),
               colld_cuda_last_error());
        api_failures++;
    } else if (want != COLLD_OK && colld_cuda_last_error()[0] == '\0') {
        printf("FAIL [api] %s: no error text\n", what);
        api_failures++;
    }
}

/* Expect a condition of a plan. */
static void expect_true(const char *what, int cond)
{
    if (!cond) {
        printf("FAIL [api] %s\n", what);
        api_failures++;
    }
}

/* A fake address (never dereferenced: these calls fail or plan before any memory is touched). */
static void *addr(uintptr_t a)
{
    return reinterpret_cast<void *>(a);
}

static void check_api(void)
{
    const colld_status_t INVAL = COLLD_ERR_INVALID_ARGUMENT;
    const void *in[COLLD_CUDA_MAX_RANKS + 1];
    void *out[COLLD_CUDA_MAX_RANKS + 1];
    colld__cuda_reduce_params_t rp;
    colld__cuda_copy_params_t cp;
    size_t work;

    for (int r = 0; r <= COLLD_CUDA_MAX_RANKS; r++) {
        in[r] = addr(0x100000 + (uintptr_t)r * 0x10000);
        out[r] = addr(0x2000000 + (uintptr_t)r * 0x10000);
    }

    /* Invalid arguments: refused before anything is launched. */
    expect("bad dtype", colld_cuda_reduce(NULL, COLLD_DTYPE_COUNT, COLLD_SUM, in, 2, out, 1, 8, NULL), INVAL);
    expect("bad op", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_REDOP_COUNT, in, 2, out, 1, 8, NULL), INVAL);
    expect("n_in 0", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, 0, out, 1, 8, NULL), INVAL);
    expect("n_in 65", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, COLLD_CUDA_MAX_RANKS + 1, out, 1, 8, NULL),
           INVAL);
    expect("n_out -1", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, 2, out, -1, 8, NULL), INVAL);
    expect("n_out 65", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, 2, out, COLLD_CUDA_MAX_RANKS + 1, 8, NULL),
           INVAL);
    expect("NULL input array", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, NULL, 2, out, 1, 8, NULL), INVAL);
    expect("NULL output array", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, 2, NULL, 1, 8, NULL), INVAL);
    {
        const void *in2[2] = { in[0], NULL };
        expect("NULL input", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in2, 2, out, 1, 8, NULL), INVAL);
        void *out2[1] = { addr(0x2000002) };
        expect("misaligned output", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, 2, out2, 1, 8, NULL), INVAL);
        void *out3[1] = { static_cast<char *>(const_cast<void *>(in[1])) + 4 };
        expect("output overlapping an input",
               colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, 2, out3, 1, 8, NULL), INVAL);
        void *out4[2] = { out[0], static_cast<char *>(out[0]) + 8 };
        expect("outputs overlapping", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, 2, out4, 2, 8, NULL),
               INVAL);
        void *out5[1] = { addr(UINTPTR_MAX - 15) };
        expect("output past the address space",
               colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, 2, out5, 1, 8, NULL), INVAL);
    }
    expect("count overflow", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, 2, out, 1, SIZE_MAX / 2, NULL),
           INVAL);
    {
        const uint64_t sc[2] = { 1, 2 };
        expect("premul_sum through colld_cuda_reduce",
               colld_cuda_reduce(NULL, COLLD_FLOAT32, (colld_redop_t)COLLD__REDOP_PREMUL_SUM, in, 2, out, 1, 8, NULL),
               INVAL);
        expect("premul NULL scalars", colld_cuda_reduce_premul(NULL, COLLD_FLOAT32, NULL, in, 2, out, 1, 8, NULL),
               INVAL);
        expect("premul bad dtype", colld_cuda_reduce_premul(NULL, COLLD_DTYPE_COUNT, sc, in, 2, out, 1, 8, NULL),
               INVAL);
        expect("premul n_in 0", colld_cuda_reduce_premul(NULL, COLLD_FLOAT32, sc, in, 0, out, 1, 8, NULL), INVAL);
        expect("premul without kernels", colld_cuda_reduce_premul(NULL, COLLD_FLOAT32, sc, in, 2, out, 1, 8, NULL),
               COLLD_ERR_DEVICE);
        expect("plan premul",
               colld__cuda_reduce_plan(COLLD_FLOAT32, COLLD__REDOP_PREMUL_SUM, sc, in, 2, out, 1, 8, &rp, &work),
               COLLD_OK);
        expect_true("plan premul: the scalars in the parameters",
                    rp.scalar[0] == 1 && rp.scalar[1] == 2 && rp.scalar[2] == 0);
    }
    expect("copy n_out 65", colld_cuda_copy(NULL, in[0], out, COLLD_CUDA_MAX_RANKS + 1, 8, NULL), INVAL);
    expect("copy NULL source", colld_cuda_copy(NULL, NULL, out, 1, 8, NULL), INVAL);
    expect("copy NULL output array", colld_cuda_copy(NULL, in[0], NULL, 1, 8, NULL), INVAL);
    {
        void *o[1] = { static_cast<char *>(const_cast<void *>(in[0])) + 3 };
        expect("copy output overlapping the source", colld_cuda_copy(NULL, in[0], o, 1, 8, NULL), INVAL);
    }

    /* Nothing to do: success without a launch (and without looking at the pointers). */
    {
        const void *none[1] = { NULL };
        void *o[1] = { const_cast<void *>(in[0]) };
        expect("count 0", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, none, 1, out, 1, 0, NULL), COLLD_OK);
        expect("n_out 0", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, 2, NULL, 0, 8, NULL), COLLD_OK);
        expect("copy 0 bytes", colld_cuda_copy(NULL, NULL, out, 1, 0, NULL), COLLD_OK);
        expect("copy onto its source only", colld_cuda_copy(NULL, in[0], o, 1, 8, NULL), COLLD_OK);
        void *twice[2] = { o[0], o[0] };
        expect("copy onto its source twice", colld_cuda_copy(NULL, in[0], twice, 2, 8, NULL), COLLD_OK);
    }

    /* Plans. float32 (V = 4), 1001 elements. */
    expect("plan aligned", colld__cuda_reduce_plan(COLLD_FLOAT32, COLLD_SUM, NULL, in, 3, out, 2, 1001, &rp, &work),
           COLLD_OK);
    expect_true("plan aligned: head 0, 250 vectors, 1 element", rp.head == 0 && rp.nvec == 250 && work == 251);
    {
        const void *si[2] = { addr(0x100004), addr(0x200004) };
        void *so[2] = { addr(0x300004), const_cast<void *>(si[1]) };
        expect("plan shifted", colld__cuda_reduce_plan(COLLD_FLOAT32, COLLD_MAX, NULL, si, 2, so, 2, 1001, &rp, &work),
               COLLD_OK);
        expect_true("plan shifted: head 3, 249 vectors, 2 elements", rp.head == 3 && rp.nvec == 249 && work == 254);
        expect("plan short", colld__cuda_reduce_plan(COLLD_FLOAT32, COLLD_MAX, NULL, si, 2, so, 2, 2, &rp, &work),
               COLLD_OK);
        expect_true("plan short: 2 elements, no vector", rp.head == 2 && rp.nvec == 0 && work == 2);
        void *mo[1] = { addr(0x300008) };
        expect("plan mixed", colld__cuda_reduce_plan(COLLD_FLOAT32, COLLD_MAX, NULL, si, 2, mo, 1, 1001, &rp, &work),
               COLLD_OK);
        expect_true("plan mixed: every element alone", rp.head == 1001 && rp.nvec == 0 && work == 1001);
    }
    {
        const void *bi[1] = { addr(0x100001) };
        void *bo[1] = { addr(0x200001) };
        expect("plan int8", colld__cuda_reduce_plan(COLLD_INT8, COLLD_SUM, NULL, bi, 1, bo, 1, 100, &rp, &work),
               COLLD_OK);
        expect_true("plan int8: head 15, 5 vectors of 16, 5 elements", rp.head == 15 && rp.nvec == 5 && work == 25);
    }
    {
        static const struct {
            uintptr_t src, out[3];
            int unit;
            size_t head;
        } cases[] = { { 0, { 0, 0, 0 }, 16, 0 },  { 5, { 5, 21, 37 }, 16, 11 }, { 0, { 8, 24, 0 }, 8, 0 },
                      { 4, { 12, 4, 28 }, 8, 4 }, { 2, { 6, 10, 14 }, 4, 2 },   { 1, { 3, 5, 7 }, 2, 1 },
                      { 0, { 1, 2, 3 }, 1, 0 } };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            void *o[3];
            char what[80];
            for (int k = 0; k < 3; k++)
                o[k] = addr(0x1000000 * (uintptr_t)(k + 2) + cases[i].out[k]);
            snprintf(what, sizeof what, "copy plan %zu", i);
            expect(what, colld__cuda_copy_plan(addr(0x1000000 + cases[i].src), o, 3, 1000, &cp, &work), COLLD_OK);
            snprintf(what, sizeof what, "copy plan %zu: unit %d head %zu", i, cases[i].unit, cases[i].head);
            expect_true(what, cp.unit == cases[i].unit && cp.head == cases[i].head && cp.n_out == 3 &&
                                  cp.nunits == (1000 - cp.head) / (size_t)cp.unit &&
                                  work == cp.nunits + (1000 - cp.nunits * (size_t)cp.unit));
        }
    }

    /* A valid launch without loaded kernels (no CUDA backend): COLLD_ERR_DEVICE and the reason in
     * words, nothing launched. */
    expect("launch without kernels", colld_cuda_reduce(NULL, COLLD_FLOAT32, COLLD_SUM, in, 2, out, 1, 8, NULL),
           COLLD_ERR_DEVICE);
    expect("copy without kernels", colld_cuda_copy(NULL, in[0], out, 1, 8, NULL), COLLD_ERR_DEVICE);
    expect_true("the reason", strstr(colld_cuda_last_error(), "colld's GPU kernels are not loaded") != NULL);
    printf("[api] without kernels: %s\n", colld_cuda_last_error());
    printf("[api] %s\n", api_failures ? "FAILED" : "ok");
}

/* --nan-check in the kernels (issue 30): for every floating-point dtype, inputs at several
 * alignments (head, 16-byte body, tail) with non-finite elements placed at random on some inputs,
 * run with first_bad words: each input's word must name its first non-finite element, with its
 * class (NaN, +Inf, -Inf, from the bit patterns the CPU's finite.c tests), offset by `base`;
 * the outputs must equal, bitwise, those of the same launch without the check. An integer dtype
 * leaves the words untouched. */
static int nan_failures;

static void check_nan(void)
{
    static const colld_dtype_t dts[] = { COLLD_FLOAT16, COLLD_BFLOAT16, COLLD_FLOAT32, COLLD_FLOAT64, COLLD_INT32 };
    static const char *const dtn[] = { "float16", "bfloat16", "float32", "float64", "int32" };
    static const char *const names[] = { "NaN", "+Inf", "-Inf" };
    enum { N_IN = 3, COUNT = 1000, BASE = 12345 };
    unsigned seed = 7;
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        colld_dtype_t dt = dts[d];
        size_t es = colld__cuda_dtype_size(dt);
        for (size_t shift = 0; shift < 16; shift += es) { /* head lengths, and no common alignment */
            alignas(16) static unsigned char buf[N_IN + 2][COUNT * 8 + 32];
            const void *in[N_IN];
            void *out[2];
            size_t count = COUNT - shift / es;
            for (int r = 0; r < N_IN; r++) {
                unsigned char *b = buf[r] + (r == 2 && shift ? 16 : shift); /* input 2 aligned otherwise */
                memset(b, 0, count * es);                                   /* zeros: finite in every dtype */
                in[r] = b;
            }
            out[0] = buf[N_IN] + shift;
            out[1] = buf[N_IN + 1] + shift;
            /* Input 0 clean, inputs 1 and 2 with two bad elements each (NaN, +Inf or -Inf, at random):
             * want[r], the word the check must leave, follows where they went. */
            unsigned long long want[N_IN];
            for (int r = 0; r < N_IN; r++)
                want[r] = COLLD_CUDA_NAN_NONE;
            for (int r = 1; r < N_IN; r++)
                for (int k = 0; k < 2; k++) {
                    seed = seed * 1103515245u + 12345u;
                    size_t at = (seed >> 8) % count;
                    unsigned char *e = (unsigned char *)in[r] + at * es;
                    int cls = (int)((seed >> 4) % 3);
                    if (dt != COLLD_INT32 &&
                        (want[r] == COLLD_CUDA_NAN_NONE || COLLD_CUDA_NAN_INDEX(want[r]) >= BASE + at))
                        want[r] = COLLD_CUDA_NAN_WORD(BASE + at, cls);
                    uint64_t bits;
                    switch (dt) {
                    case COLLD_FLOAT16:
                        bits = cls == 0 ? 0x7e01u : cls == 1 ? 0x7c00u : 0xfc00u;
                        break;
                    case COLLD_BFLOAT16:
                        bits = cls == 0 ? 0xffc1u : cls == 1 ? 0x7f80u : 0xff80u;
                        break;
                    case COLLD_FLOAT32:
                        bits = cls == 0 ? 0x7fc00001u : cls == 1 ? 0x7f800000u : 0xff800000u;
                        break;
                    case COLLD_FLOAT64:
                        bits = cls == 0   ? 0xfff8000000000001ull
                               : cls == 1 ? 0x7ff0000000000000ull
                                          : 0xfff0000000000000ull;
                        break;
                    default:
                        bits = 0xffffffffu;
                        break; /* an integer: data */
                    }
                    memcpy(e, &bits, es);
                }
            colld__cuda_reduce_params_t p;
            size_t work;
            unsigned long long words[N_IN];
            unsigned char plain[2][COUNT * 8];
            if (colld__cuda_reduce_plan(dt, COLLD_SUM, NULL, in, N_IN, out, 2, count, &p, &work) != COLLD_OK) {
                printf("[nan] %s shift %zu: the plan failed: %s\n", dtn[d], shift, colld_cuda_last_error());
                nan_failures++;
                continue;
            }
            reduce_body_fn body = reduce_body(dt, COLLD_SUM);
            size_t nthreads = emulated_threads(work);
            for (size_t tid = 0; tid < nthreads; tid++)
                body(p, tid, nthreads);
            memcpy(plain[0], out[0], count * es);
            memcpy(plain[1], out[1], count * es);
            for (int r = 0; r < N_IN; r++)
                words[r] = COLLD_CUDA_NAN_NONE;
            p.first_bad = words;
            p.base = BASE;
            nthreads = emulated_threads(work);
            for (size_t tid = 0; tid < nthreads; tid++)
                body(p, tid, nthreads);
            if (memcmp(plain[0], out[0], count * es) != 0 || memcmp(plain[1], out[1], count * es) != 0) {
                printf("[nan] %s shift %zu: the results differ with the check\n", dtn[d], shift);
                nan_failures++;
            }
            for (int r = 0; r < N_IN; r++) {
                if (words[r] != want[r]) {
                    printf("[nan] %s shift %zu input %d: word %#llx (element %llu, %s), want %#llx\n", dtn[d], shift, r,
                           words[r], (unsigned long long)COLLD_CUDA_NAN_INDEX(words[r]),
                           names[COLLD_CUDA_NAN_CLASS(words[r]) % 3], want[r]);
                    nan_failures++;
                }
            }
        }
    }
    printf("[nan] %s\n", nan_failures ? "FAILED" : "ok");
}

int main(void)
{
    kcheck_backend_t emu;
    int failures;

    setvbuf(stdout, NULL, _IOLBF, 0);
    memset(&emu, 0, sizeof emu);
    emu.name = "emulated";
    emu.big_count = ((size_t)1 << 16) + 3;
    emu.alloc = emu_alloc;
    emu.release = emu_release;
    emu.put = emu_memcpy;
    emu.get = emu_memcpy;
    emu.dcopy = emu_memcpy;
    emu.fill = emu_fill;
    emu.reduce = emu_reduce;
    emu.copy = emu_copy;

    check_api();
    check_nan();
    failures = kcheck_run(&emu);
    return failures == 0 && api_failures == 0 && nan_failures == 0 ? 0 : 1;
}
