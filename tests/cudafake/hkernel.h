/*
 * hkernel.h - the host builds of colld's CUDA kernels inside the CUDA driver test double
 * (kernels.cpp, C++), as the C side of the double sees them.
 *
 * A library loaded from a fatbin names its kernels by their symbol names (colld's are extern "C");
 * the double maps each name to a host build of the very same kernel source
 * (kernels/cuda/cuda_core.cuh), compiled for the CPU, and runs its blocks concurrently on a few host
 * threads (launch.c), each block's threads one after another. Before it runs, `check` hands
 * every buffer the parameters name to the double's access check, so that a kernel that would
 * fault on a GPU (memory of another device without peer access, unmapped, freed) fails with
 * CUDA_ERROR_ILLEGAL_ADDRESS instead of touching it.
 */
#ifndef COLLD_TESTS_CUDAFAKE_HKERNEL_H
#define COLLD_TESTS_CUDAFAKE_HKERNEL_H

#include <cuda.h>

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Is [p, p + len) accessible to the launch's device (for writing too when `write`)? */
typedef CUresult (*fk_access_fn)(void *cookie, const void *p, size_t len, bool write);

typedef struct fk_hkernel {
    const char *name;  /* the symbol name, as in the fatbin (found with dladdr at first use) */
    size_t param_size; /* bytes of its one parameter block */
    /* Run the emulated threads lo .. hi-1 of a launch's grid of nthreads threads, one after another
     * (launch.c runs a launch's blocks concurrently, each a [lo, hi) of its own). */
    void (*run)(const void *params, size_t lo, size_t hi, size_t nthreads);
    /* Check the parameter block and every buffer it names; CUDA_SUCCESS or the fault. */
    CUresult (*check)(const void *params, fk_access_fn access, void *cookie);
} fk_hkernel_t;

/* The host build of the kernel with this symbol name, or NULL. */
const fk_hkernel_t *fk_hkernel_find(const char *name);

/* Every host build (for the double's own test). */
const fk_hkernel_t *fk_hkernel_list(size_t *n);

#ifdef __cplusplus
}
#endif

#endif /* COLLD_TESTS_CUDAFAKE_HKERNEL_H */
