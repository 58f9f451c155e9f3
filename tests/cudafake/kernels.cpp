/*
 * kernels.cpp - host builds of colld's CUDA kernels for the CUDA driver test double (see
 * hkernel.h).
 *
 * The kernel bodies are not copied: they are kernels/cuda/cuda_core.cuh's __host__ __device__
 * templates, compiled here for the CPU (as tests/gpu/test_cuda_emulated.cu does). What is written
 * here is the thin wrapper of each kernel of kernels/cuda/reduce.cu and copy.cu, an extern "C"
 * function generated from the same lists under the very name of the device kernel
 * (COLLD__CUDA_REDUCE_KERNEL / COLLD__CUDA_COPY_KERNEL of cuda_plan.h), the name the fatbin's cubins
 * carry; that name is read back with dladdr (the wrappers are exported from the double for that
 * reason, libcuda.map). A kernel added to kernels/cuda needs its wrapper here: the double's own
 * test (test_cudafake) enumerates the kernels of colld's real fatbin and fails for any that has no
 * host build.
 *
 * A launch runs the grid's blocks concurrently on a few host threads (launch.c), each block's threads
 * one after another, each with its own (tid, nthreads), exactly the indexing of the device
 * grid-stride loops.
 */
#include "tests/cudafake/hkernel.h"

/* The kernels' types (the dtype traits, the parameter blocks, uint4...) take part in the wrappers'
 * names; a type of hidden visibility would hide the instantiations from the dynamic symbol table
 * (-fvisibility=hidden), so the kernel sources are seen with default visibility. */
#pragma GCC visibility push(default)
#include "kernels/cuda/cuda_core.cuh"
#include "tests/gpu/gpu_rank_kernels.cuh"
#pragma GCC visibility pop

#include <cstdint>
#include <cstring>
#include <dlfcn.h>
#include <pthread.h>

namespace {

/* The emulated grid of the launch this thread is running, and the threads [lo, hi) of it this host
 * thread runs (one block: launch.c runs a launch's blocks concurrently on a few host threads). */
thread_local size_t fk_grid_threads, fk_tid_lo, fk_tid_hi;

} // namespace

#define FK_KERNEL_EXPORT __attribute__((visibility("default")))

/* ---------------------------------------------------------------------------------------------
 * The wrappers: the names and signatures of kernels/cuda/reduce.cu and copy.cu.
 * ------------------------------------------------------------------------------------------- */

#define FK_REDUCE_WRAPPER(name, E_OP, opname)                                                                          \
    extern "C" FK_KERNEL_EXPORT void COLLD__CUDA_REDUCE_KERNEL(name, opname)(const colld__cuda_reduce_params_t p)      \
    {                                                                                                                  \
        const size_t n = fk_grid_threads;                                                                              \
        for (size_t tid = fk_tid_lo; tid < fk_tid_hi; tid++)                                                           \
            colld__cuda_reduce_body<colld__cuda_t_##name, E_OP>(p, tid, n);                                            \
    }
#define FK_REDUCE_WRAPPERS(E, name, T, A, U, W, K) COLLD_REDUCE_OPS(FK_REDUCE_WRAPPER, name)
COLLD_REDUCE_DTYPES(FK_REDUCE_WRAPPERS)

#define FK_COPY_WRAPPER(Unit, bytes)                                                                                   \
    extern "C" FK_KERNEL_EXPORT void COLLD__CUDA_COPY_KERNEL(bytes)(const colld__cuda_copy_params_t p)                 \
    {                                                                                                                  \
        const size_t n = fk_grid_threads;                                                                              \
        for (size_t tid = fk_tid_lo; tid < fk_tid_hi; tid++)                                                           \
            colld__cuda_copy_body<Unit>(p, tid, n);                                                                    \
    }
COLLD__CUDA_COPY_UNITS(FK_COPY_WRAPPER)

/* The hand-off's kernels (kernels/cuda/handoff.cu): the gate and the done writes, one thread each. */
extern "C" FK_KERNEL_EXPORT void COLLD__CUDA_GATE_KERNEL(const colld__cuda_gate_params_t p)
{
    for (size_t tid = fk_tid_lo; tid < fk_tid_hi; tid++)
        colld__cuda_gate_body(p, tid);
}

extern "C" FK_KERNEL_EXPORT void COLLD__CUDA_DONE_KERNEL(const colld__cuda_done_params_t p)
{
    for (size_t tid = fk_tid_lo; tid < fk_tid_hi; tid++)
        colld__cuda_done_body(p, tid);
}

/* The GPU tests' application kernels (tests/gpu/gpu_rank_kernels.cuh: a slow producer, a producer,
 * a consumer), which colld-test-gpu-rank loads from a fatbin of its own. */
#define FK_RANK_WRAPPER(kernel, P, body)                                                                               \
    extern "C" FK_KERNEL_EXPORT void kernel(const P p)                                                                 \
    {                                                                                                                  \
        const size_t n = fk_grid_threads;                                                                              \
        for (size_t tid = fk_tid_lo; tid < fk_tid_hi; tid++)                                                           \
            body(p, tid, n);                                                                                           \
    }
FK_RANK_WRAPPER(GPU_RANK_SPIN_KERNEL, gpu_rank_spin_params_t, gpu_rank_spin_body)
FK_RANK_WRAPPER(GPU_RANK_PRODUCE_KERNEL, gpu_rank_produce_params_t, gpu_rank_produce_body)
FK_RANK_WRAPPER(GPU_RANK_CONSUME_KERNEL, gpu_rank_consume_params_t, gpu_rank_consume_body)
FK_RANK_WRAPPER(GPU_RANK_CHAIN_KERNEL, gpu_rank_chain_params_t, gpu_rank_chain_body)

namespace {

/* ---------------------------------------------------------------------------------------------
 * Running and checking one kernel.
 * ------------------------------------------------------------------------------------------- */

/* Run a wrapper over threads [lo, hi) of a launch's grid of nthreads threads, with a copy of its
 * parameter block. */
template <typename P, void (*F)(const P)> void run(const void *params, size_t lo, size_t hi, size_t nthreads)
{
    P p;
    memcpy(&p, params, sizeof p);
    fk_grid_threads = nthreads;
    fk_tid_lo = lo;
    fk_tid_hi = hi;
    F(p);
}

/* Is [p, p + bytes) aligned as the kernel's accesses need? Element accesses need the element's
 * alignment; the vector body (when there is one) starts 16-byte aligned at `head`. */
bool aligned(const void *p, size_t elem, size_t head_bytes, bool body, size_t unit)
{
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    return a % elem == 0 && (!body || (a + head_bytes) % unit == 0);
}

/* A reduce launch: the plan's invariants (a GPU would read out of bounds without them), every input
 * readable and every output writable over count elements, --nan-check's words writable, and the
 * alignment of every access. */
template <typename D> CUresult check_reduce(const void *params, fk_access_fn access, void *cookie)
{
    typedef typename D::T T;
    const size_t V = COLLD__CUDA_VEC_BYTES / sizeof(T);
    colld__cuda_reduce_params_t p;
    memcpy(&p, params, sizeof p);
    if (p.n_in < 1 || p.n_in > COLLD_CUDA_MAX_RANKS || p.n_out < 0 || p.n_out > COLLD_CUDA_MAX_RANKS ||
        p.count > SIZE_MAX / sizeof(T) || p.head > p.count || p.nvec > (p.count - p.head) / V)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    const size_t bytes = p.count * sizeof(T);
    if (bytes == 0)
        return CUDA_SUCCESS;
    for (int i = 0; i < p.n_in + p.n_out; i++) {
        bool out = i >= p.n_in;
        const void *b = out ? p.out[i - p.n_in] : p.in[i];
        CUresult r = access(cookie, b, bytes, out);
        if (r != CUDA_SUCCESS)
            return r;
        if (!aligned(b, sizeof(T), p.head * sizeof(T), p.nvec > 0, COLLD__CUDA_VEC_BYTES))
            return CUDA_ERROR_MISALIGNED_ADDRESS;
    }
    if (p.gate) { /* the hand-off's gate, read */
        CUresult r = access(cookie, p.gate, sizeof(*p.gate), false);
        if (r != CUDA_SUCCESS)
            return r;
        if (!aligned(p.gate, sizeof(*p.gate), 0, false, 1))
            return CUDA_ERROR_MISALIGNED_ADDRESS;
    }
    if (p.first_bad) { /* --nan-check: one word per input, written atomically */
        CUresult r = access(cookie, p.first_bad, (size_t)p.n_in * sizeof(*p.first_bad), true);
        if (r != CUDA_SUCCESS)
            return r;
        if (!aligned(p.first_bad, sizeof(*p.first_bad), 0, false, 1))
            return CUDA_ERROR_MISALIGNED_ADDRESS;
    }
    return CUDA_SUCCESS;
}

/* A copy launch: the same for the source and the outputs, at the plan's unit. */
template <typename Unit> CUresult check_copy(const void *params, fk_access_fn access, void *cookie)
{
    colld__cuda_copy_params_t p;
    memcpy(&p, params, sizeof p);
    if (p.n_out < 1 || p.n_out > COLLD_CUDA_MAX_RANKS || p.unit != (int)sizeof(Unit) || p.head > p.bytes ||
        p.nunits > (p.bytes - p.head) / sizeof(Unit))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (p.bytes == 0)
        return CUDA_SUCCESS;
    if (p.gate) {
        CUresult r = access(cookie, p.gate, sizeof(*p.gate), false);
        if (r != CUDA_SUCCESS)
            return r;
        if (!aligned(p.gate, sizeof(*p.gate), 0, false, 1))
            return CUDA_ERROR_MISALIGNED_ADDRESS;
    }
    for (int i = 0; i <= p.n_out; i++) {
        const void *b = i == 0 ? p.src : p.out[i - 1];
        CUresult r = access(cookie, b, p.bytes, i > 0);
        if (r != CUDA_SUCCESS)
            return r;
        if (!aligned(b, 1, p.head, p.nunits > 0, sizeof(Unit)))
            return CUDA_ERROR_MISALIGNED_ADDRESS;
    }
    return CUDA_SUCCESS;
}

/* The GPU tests' kernels: n floats of each buffer, x written; y read, z written. */
CUresult check_spin(const void *, fk_access_fn, void *)
{
    return CUDA_SUCCESS;
}

CUresult check_floats(const void *b, size_t n, bool write, fk_access_fn access, void *cookie)
{
    if (n > SIZE_MAX / sizeof(float))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (n == 0)
        return CUDA_SUCCESS;
    CUresult r = access(cookie, b, n * sizeof(float), write);
    if (r == CUDA_SUCCESS && !aligned(b, sizeof(float), 0, false, 1))
        r = CUDA_ERROR_MISALIGNED_ADDRESS;
    return r;
}

CUresult check_produce(const void *params, fk_access_fn access, void *cookie)
{
    gpu_rank_produce_params_t p;
    memcpy(&p, params, sizeof p);
    return check_floats(p.x, p.n, true, access, cookie);
}

CUresult check_consume(const void *params, fk_access_fn access, void *cookie)
{
    gpu_rank_consume_params_t p;
    memcpy(&p, params, sizeof p);
    CUresult r = check_floats(p.y, p.n, false, access, cookie);
    return r == CUDA_SUCCESS ? check_floats(p.z, p.n, true, access, cookie) : r;
}

/* A word the kernel reads and writes: accessible and 4-byte aligned. */
CUresult check_word(const void *w, fk_access_fn access, void *cookie)
{
    CUresult r = access(cookie, w, sizeof(unsigned), true);
    if (r == CUDA_SUCCESS && !aligned(w, sizeof(unsigned), 0, false, 1))
        r = CUDA_ERROR_MISALIGNED_ADDRESS;
    return r;
}

/* The hand-off's gate: every rank's ready slot (marked taken) and the three words. */
CUresult check_gate(const void *params, fk_access_fn access, void *cookie)
{
    colld__cuda_gate_params_t p;
    memcpy(&p, params, sizeof p);
    if (p.n < 1 || p.n > COLLD_CUDA_MAX_RANKS)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    CUresult r = access(cookie, p.words, COLLD_CUDA_HANDOFF_WORDS * sizeof(unsigned), true);
    if (r == CUDA_SUCCESS && !aligned(p.words, sizeof(unsigned), 0, false, 1))
        r = CUDA_ERROR_MISALIGNED_ADDRESS;
    for (int i = 0; i < p.n && r == CUDA_SUCCESS; i++)
        r = check_word(p.ready[i], access, cookie);
    return r;
}

/* The hand-off's done writes: every rank's done word and the gate. */
CUresult check_done(const void *params, fk_access_fn access, void *cookie)
{
    colld__cuda_done_params_t p;
    memcpy(&p, params, sizeof p);
    if (p.n < 1 || p.n > COLLD_CUDA_MAX_RANKS)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    CUresult r = access(cookie, p.words, COLLD_CUDA_HANDOFF_WORDS * sizeof(unsigned), false);
    if (r == CUDA_SUCCESS && !aligned(p.words, sizeof(unsigned), 0, false, 1))
        r = CUDA_ERROR_MISALIGNED_ADDRESS;
    for (int i = 0; i < p.n && r == CUDA_SUCCESS; i++)
        r = check_word(p.done[i], access, cookie);
    return r;
}

/* The chain: n words and n results, written. */
CUresult check_chain(const void *params, fk_access_fn access, void *cookie)
{
    gpu_rank_chain_params_t p;
    memcpy(&p, params, sizeof p);
    if (p.n < 1)
        return CUDA_SUCCESS;
    unsigned *const bufs[] = { p.word, p.result };
    for (unsigned *b : bufs) {
        CUresult r = access(cookie, b, (size_t)p.n * sizeof(unsigned), true);
        if (r == CUDA_SUCCESS && !aligned(b, sizeof(unsigned), 0, false, 1))
            r = CUDA_ERROR_MISALIGNED_ADDRESS;
        if (r != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * The table: one entry per kernel of kernels/cuda, from the same dtype x op lists.
 * ------------------------------------------------------------------------------------------- */

struct entry {
    fk_hkernel_t k;
    void *sym; /* the wrapper, whose exported name is the kernel's */
};

template <typename F> void *sym_of(F *f)
{
    return reinterpret_cast<void *>(f);
}

#define FK_REDUCE_ENTRY(name, E_OP, opname)                                                                  \
    {{nullptr, sizeof(colld__cuda_reduce_params_t),                                                          \
      run<colld__cuda_reduce_params_t, COLLD__CUDA_REDUCE_KERNEL(name, opname)>,                             \
      check_reduce<colld__cuda_t_##name>},                                                                   \
     sym_of(&COLLD__CUDA_REDUCE_KERNEL(name, opname))},
#define FK_REDUCE_DTYPE(E, name, T, A, U, W, K) COLLD_REDUCE_OPS(FK_REDUCE_ENTRY, name)
#define FK_COPY_ENTRY(Unit, bytes)                                                                           \
    {{nullptr, sizeof(colld__cuda_copy_params_t), run<colld__cuda_copy_params_t, COLLD__CUDA_COPY_KERNEL(bytes)>, \
      check_copy<Unit>},                                                                                     \
     sym_of(&COLLD__CUDA_COPY_KERNEL(bytes))},

#define FK_RANK_ENTRY(kernel, P, check) {{nullptr, sizeof(P), run<P, kernel>, check}, sym_of(&kernel)},

entry table[] = { COLLD_REDUCE_DTYPES(FK_REDUCE_DTYPE) COLLD__CUDA_COPY_UNITS(FK_COPY_ENTRY)
                      FK_RANK_ENTRY(GPU_RANK_SPIN_KERNEL, gpu_rank_spin_params_t, check_spin) FK_RANK_ENTRY(
                          GPU_RANK_PRODUCE_KERNEL, gpu_rank_produce_params_t, check_produce)
                          FK_RANK_ENTRY(GPU_RANK_CONSUME_KERNEL, gpu_rank_consume_params_t, check_consume)
                              FK_RANK_ENTRY(GPU_RANK_CHAIN_KERNEL, gpu_rank_chain_params_t, check_chain)
                                  FK_RANK_ENTRY(COLLD__CUDA_GATE_KERNEL, colld__cuda_gate_params_t, check_gate)
                                      FK_RANK_ENTRY(COLLD__CUDA_DONE_KERNEL, colld__cuda_done_params_t, check_done) };
const size_t table_len = sizeof(table) / sizeof(table[0]);
fk_hkernel_t list[sizeof(table) / sizeof(table[0])];

pthread_once_t named = PTHREAD_ONCE_INIT;

/* Find each wrapper's exported (mangled) name. */
void name_all()
{
    for (size_t i = 0; i < table_len; i++) {
        Dl_info info;
        if (dladdr(table[i].sym, &info) && info.dli_sname && info.dli_saddr == table[i].sym)
            table[i].k.name = info.dli_sname;
        list[i] = table[i].k;
    }
}

} // namespace

extern "C" const fk_hkernel_t *fk_hkernel_find(const char *name)
{
    pthread_once(&named, name_all);
    for (size_t i = 0; i < table_len; i++)
        if (table[i].k.name && strcmp(table[i].k.name, name) == 0)
            return &table[i].k;
    return nullptr;
}

extern "C" const fk_hkernel_t *fk_hkernel_list(size_t *n)
{
    pthread_once(&named, name_all);
    *n = table_len;
    return list;
}
