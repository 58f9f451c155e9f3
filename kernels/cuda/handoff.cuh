/*
 * handoff.cuh - the bodies of the hand-off kernels (issue 28 item 1; cuda_kernels.h says what they
 * do), written once as __host__ __device__ functions: handoff.cu runs them on a GPU, the CUDA driver
 * test double's host builds (tests/cudafake/kernels.cpp) on the CPU, where a launch's blocks run
 * concurrently on host threads (so the wait's blocks poll at once) on the host's memory model, not
 * the GPU's.
 */
#ifndef COLLD_KERNELS_CUDA_HANDOFF_CUH
#define COLLD_KERNELS_CUDA_HANDOFF_CUH

#include "kernels/cuda/cuda_plan.h"

#include <vector_types.h>

#ifndef __CUDA_ARCH__
#include <ctime>
#endif

#define COLLD__HO __host__ __device__ inline

/* Wall-clock nanoseconds: %globaltimer on the device, CLOCK_MONOTONIC on the host. */
COLLD__HO unsigned long long colld__ho_now_ns()
{
#ifdef __CUDA_ARCH__
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
#endif
}

/* System-scope acquire load and release store (the daemon's host threads and the ranks' streams
 * read and write these words); a system-scope fence. */
COLLD__HO unsigned colld__ho_load(const unsigned *p)
{
#ifdef __CUDA_ARCH__
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#else
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

COLLD__HO void colld__ho_store(unsigned *p, unsigned v)
{
#ifdef __CUDA_ARCH__
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

/* On the host build (the CUDA driver test double) nothing: the release store that follows every
 * fence here orders the writes before it on the host's memory model (and ThreadSanitizer, which
 * checks those builds, does not model fences). */
COLLD__HO void colld__ho_fence()
{
#ifdef __CUDA_ARCH__
    __threadfence_system();
#endif
}

/* Between two polls: nothing on a GPU (its thread spins); on the host a 10 us sleep, so that the
 * double's polling blocks leave the CPU to the ranks that are to write the words. */
COLLD__HO void colld__ho_relax()
{
#ifndef __CUDA_ARCH__
    struct timespec ts = { 0, 10000 };
    nanosleep(&ts, nullptr);
#endif
}

/* Block b of the wait (one thread per block). */
COLLD__HO void colld__cuda_wait_body(const colld__cuda_wait_params_t &p, size_t b)
{
    if ((int)b >= p.n)
        return;
    unsigned *cancel = &p.words[COLLD_CUDA_HANDOFF_CANCEL];
    const unsigned long long t0 = colld__ho_now_ns();
    for (;;) {
        if (colld__ho_load(cancel))
            return;
        if (colld__ho_load(p.ready[b]) == p.want[b])
            break;
        if (colld__ho_now_ns() - t0 > p.timeout_ns)
            return;
        colld__ho_relax();
    }
    unsigned prev;
#ifdef __CUDA_ARCH__
    prev = atomicAdd(&p.words[COLLD_CUDA_HANDOFF_ARRIVED], 1u);
#else
    prev = __atomic_fetch_add(&p.words[COLLD_CUDA_HANDOFF_ARRIVED], 1u, __ATOMIC_ACQ_REL);
#endif
    if ((int)prev + 1 != p.n || colld__ho_load(cancel))
        return; /* not the last to arrive, or the daemon abandoned it: the gate stays shut */
    for (int r = 0; r < p.n; r++)
        colld__ho_store(p.ready[r], ~p.want[r]); /* taken: the rank may write the slot again */
    colld__ho_fence();
    colld__ho_store(&p.words[COLLD_CUDA_HANDOFF_GATE], COLLD_CUDA_GATE_GO);
}

/* The done writes (one thread). */
COLLD__HO void colld__cuda_done_body(const colld__cuda_done_params_t &p, size_t tid)
{
    if (tid != 0 || colld__ho_load(&p.words[COLLD_CUDA_HANDOFF_GATE]) != COLLD_CUDA_GATE_GO)
        return;
    colld__ho_fence();
    for (int r = 0; r < p.n; r++)
        colld__ho_store(p.done[r], p.value[r]);
}

/* The gate check at the top of the reduce and copy kernels. */
COLLD__HO bool colld__cuda_gate_shut(const unsigned *gate)
{
    return gate && colld__ho_load(gate) != COLLD_CUDA_GATE_GO;
}

#endif /* COLLD_KERNELS_CUDA_HANDOFF_CUH */
