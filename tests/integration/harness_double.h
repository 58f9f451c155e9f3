/*
 * harness_double.h - GPU tests meant for the CUDA driver test double (tests/cudafake) run on it and
 * on nothing else: the libcuda.so.1 a test finds must be the double (it alone exports
 * colld_cudafake_control), checked before any CUDA call, so that a real driver found because the
 * double was missing is never initialised by such a test; and the daemon it starts must map no
 * other libcuda, and no NCCL.
 *
 * Used by the in-process GPU tests (harness_gpu.c, test_gpu_cudafake_graph.c) and the GPU test
 * drivers of tests/gpu (test_gpu_collectives.c, test_gpu_p2p.c).
 */
#ifndef COLLD_TESTS_HARNESS_DOUBLE_H
#define COLLD_TESTS_HARNESS_DOUBLE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Is the libcuda.so.1 that dlopen finds here the test double? 1 yes (its real path into path),
 * 0 no libcuda.so.1 at all, -1 another one (said on stdout unless quiet). */
int harness_double_find(char *path, size_t len, bool quiet);

/* Does process pid map no libcuda but the double at double_path, and no NCCL; and, with must_map,
 * the double itself? Says why not on stderr. */
bool harness_daemon_on_double(pid_t pid, const char *double_path, bool must_map);

#endif /* COLLD_TESTS_HARNESS_DOUBLE_H */
