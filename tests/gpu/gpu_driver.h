/*
 * gpu_driver.h - what the GPU test drivers (test_gpu_collectives.c, test_gpu_p2p.c) share: their
 * command line "[GROUP|all] [--gpus N] [--cudafake]", loading the CUDA driver (with --cudafake the
 * test double only, harness_double.h), the arguments every rank process gets, and the check that
 * a daemon maps no driver but the double.
 */
#ifndef COLLD_TESTS_GPU_GPU_DRIVER_H
#define COLLD_TESTS_GPU_GPU_DRIVER_H

#include <stdbool.h>
#include <sys/types.h>

#define GPU_DRIVER_MAX_ARGS 47 /* argv entries of a rank process at most, before its NULL */

typedef struct {
    const char *group; /* the group asked for, "all" by default */
    int gpus;          /* --gpus N: the ranks' GPUs (rank r on GPU r % N) */
    bool cudafake;     /* --cudafake: the CUDA driver test double, and nothing else */
    int ndev;          /* GPUs visible */
    char gpus_text[16];
    const char *common_args[8]; /* every rank's: --gpus N [--cudafake], then the driver's own */
    int ncommon;
    char double_path[4096]; /* with --cudafake: the double's file */
} gpu_driver_t;

/* Parse the command line (groups: the NULL-terminated names the driver runs, besides "all"), load
 * the driver and check there are --gpus GPUs. Returns -1 to go on, else the exit code: 2 usage,
 * 77 skipped (no driver, too few GPUs on real hardware), 1 an error. */
int gpu_driver_start(gpu_driver_t *g, int argc, char **argv, const char *const *groups);

/* Say which GPUs the run uses (after the driver's own common arguments are added). */
void gpu_driver_say(const gpu_driver_t *g);

/* Whether group runs: asked for by name, or "all". */
bool gpu_driver_runs(const gpu_driver_t *g, const char *group);

/* argv[n...]: extra (NULL-terminated, may be NULL) and the common arguments, then NULL, at most
 * GPU_DRIVER_MAX_ARGS entries in all. Returns the new n. */
int gpu_driver_add_args(const gpu_driver_t *g, const char **argv, int n, const char *const *extra);

/* With --cudafake: does the daemon (pid) map no libcuda but the double, and no NCCL? (Said why not.)
 * Always true on real hardware. */
bool gpu_driver_daemon_ok(const gpu_driver_t *g, pid_t pid);

#endif /* COLLD_TESTS_GPU_GPU_DRIVER_H */
