/*
 * handoff.cuh - the bodies of the hand-off kernels (issue 28 item 1; cuda_kernels.h says what they
 * do), written once as __host__ __device__ functions: handoff.cu runs them on a GPU, the CUDA driver
 * test double's host builds (tests/cudafake/kernels.cpp) on the CPU, on the host's memory model, not
 * the GPU's. No kernel here polls: the wait for the ranks' streams is a stream memory wait per rank
 * in front of the gate (kernels/cuda/launch.c), which holds no multiprocessor while it waits.
 */
#ifndef COLLD_KERNELS_CUDA_HANDOFF_CUH
#define COLLD_KERNELS_CUDA_HANDOFF_CUH

#include "kernels/cuda/cuda_plan.h"

#include <vector_types.h>

#define COLLD__HO __host__ __device__ inline

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

/* The gate (one thread), queued behind the stream waits on every rank's ready slot: when it runs,
 * every rank arrived or the daemon abandoned the collective (it writes the cancel word, then the
 * awaited values itself so that the waits end). Unless cancelled: every slot marked taken (~want,
 * the rank may write it again), a system-scope fence, then the gate opened. */
COLLD__HO void colld__cuda_gate_body(const colld__cuda_gate_params_t &p, size_t tid)
{
    if (tid != 0 || colld__ho_load(&p.words[COLLD_CUDA_HANDOFF_CANCEL]))
        return;
    for (int r = 0; r < p.n; r++)
        colld__ho_store(p.ready[r], ~p.want[r]); /* taken */
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
