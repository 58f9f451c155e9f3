/*
 * harness_gpu.h - what the test_gpu_cudafake*.c files share: a real daemon and this client
 * process, both on the CUDA driver test double (tests/cudafake), two ranks as two threads of this
 * process (rank r on fake GPU r), the application's side through colld's own driver loader.
 *
 *   harness_gpu.c                the double checks, the rank threads, the buffers and the exact
 *                                collectives every group runs, the daemon's fault file, waits
 *   test_gpu_cudafake.c          main (the groups), what works, an old driver, refused kernels
 *   test_gpu_cudafake_launch.c   launches that fail or break part-way (issue 15 F1, F2)
 *   test_gpu_cudafake_ready.c    a ready slot per collective (issue 15 E1, E2)
 *   test_gpu_cudafake_reg.c      GPU registrations: the device checked (C5), freed buffers (C1/D4),
 *                                buffers across several VMM allocations (D2), colld_mem_register
 *   test_gpu_cudafake_capture.c  collectives on a stream being captured (3.3)
 *   test_gpu_cudafake_release.c  the daemon's unpinning and unmapping outside its lock (F4)
 *   test_gpu_cudafake_recovery.c a sticky error in the daemon's context (F3), the flag area's context
 *
 * Each topic file gives main its cases for a group (gpu_cases_t gpu_<topic>_cases(group)); main
 * runs the concatenation in the order of its list of topics.
 */
#ifndef COLLD_TESTS_HARNESS_GPU_H
#define COLLD_TESTS_HARNESS_GPU_H

#include "client/client_internal.h"
#include "common/cudadrv.h"
#include "tests/integration/harness.h"

#include <cudaTypedefs.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#define COUNT 4096 /* floats per rank buffer */
/* The communicators' timeout where a case does not pick one: a collective that is never released
 * (a regression) fails with COLLD_ERR_TIMEOUT and releases the ranks' streams well within the
 * test's ctest TIMEOUT, instead of after the daemon's default of 300 s. */
#define COMM_TIMEOUT_MS 30000
/* The timeout of a case that waits for a collective to time out: long enough for two ranks of
 * one process to join and run a collective on a loaded machine under TSan. */
#define SHORT_TIMEOUT_MS 5000
#define WAIT_MS 20000 /* the bound of every wait of the cases */

/* The driver colld's loader found (the test double's), for the application's side. */
extern const colld_cu_t *cu;

/* The name of a CUresult. */
const char *rname(CUresult r);

/* A driver call the test itself makes must succeed (not CU_CHECK: common/cudadrv.h defines that one,
 * for colld's own driver calls). */
#define CU_MUST(call)                                                                                                  \
    do {                                                                                                               \
        CUresult r_ = (call);                                                                                          \
        if (r_ != CUDA_SUCCESS)                                                                                        \
            fail_msg("%s: %s", #call, rname(r_));                                                                      \
    } while (0)

/* ============================================================================================
 * Only ever the test double
 * ========================================================================================== */

/* Is the libcuda.so.1 that dlopen finds here the CUDA driver test double? 1 (the double), 0 (no
 * libcuda.so.1 at all), -1 (another libcuda.so.1: refused). Before any CUDA call. */
int driver_is_double(void);
/* Does the daemon (pid) map no libcuda but the test double, and no NCCL; and, with must_map, the
 * double itself? Says why not. */
bool daemon_on_double(pid_t pid, bool must_map);
/* harness_test_setup, then the daemon must be on the test double (and on nothing else). */
int setup_on_double(void **state);
/* The same for the old driver's daemon, which may have unloaded the double it refused. */
int setup_old_driver(void **state);
/* harness_test_teardown, then reset any of this process's device contexts a case left with a
 * sticky error, so that the next case starts clean. */
int teardown_contexts(void **state);
/* A case that pins an OPEN defect of issue 15: say so before it runs. */
void open_defect(const char *id, const char *today, const char *fixed);

/* ============================================================================================
 * The daemon's fault file (COLLD_CUDAFAKE_CONTROL of the daemon's double)
 * ========================================================================================== */

extern char gpu_control[64];
/* Append one fault specification to the daemon's fault file. */
bool control_append(const char *line);
/* A fresh fault file holding lines[] (NULL-terminated), then a daemon on the double reading it
 * (setup_on_double). 0 or -1. */
int setup_with_control(void **state, const char *const *lines);
/* harness_test_teardown, then the fault file goes. */
int teardown_control(void **state);
/* Has the file (the daemon's log, its fault file) said `what` within ms milliseconds? */
bool log_says(const char *path, const char *what, int ms);
/* Does the daemon (pid) map a memfd whose name contains `name`? */
bool daemon_maps(pid_t pid, const char *name);

/* ============================================================================================
 * Two ranks, one thread each
 * ========================================================================================== */

typedef struct rank rank_t;
typedef void (*scenario_fn)(rank_t *r);

struct rank {
    harness_t *h;
    colld_unique_id_t id;
    int rank;
    int timeout_ms; /* the communicator's (0: COMM_TIMEOUT_MS) */
    scenario_fn fn;
    pthread_barrier_t *barrier; /* shared by both ranks */
    colld_client_t *c;
    colld_comm_t *comm;
    CUstream s;
    colld_status_t st[4]; /* what the scenario saw */
    CUresult cr[4];
    long v[4];
    char detail[512];
    char failure[256];
};

/* Record the rank's first failure (the case fails with it after the ranks joined). */
void rank_fail(rank_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The communicator's async error once it has one (at most 20 s), or COLLD_OK. */
colld_status_t async_error(colld_comm_t *comm);
/* The communicator's async error, waiting at most ms milliseconds (COLLD_OK: none by then). */
colld_status_t async_error_within(colld_comm_t *comm, int ms);
/* The device of each rank's thread: rank r on device r, unless a case puts both on one device. */
extern int rank_device[2];
/* Run fn on both ranks of a new communicator; fails the test if a rank's set-up failed. */
void run_ranks(harness_t *h, scenario_fn fn, int timeout_ms, rank_t ranks[2]);
/* Wait, at most WAIT_MS, until the rank's stream has run everything. A stream left waiting is a
 * failure, and is leaked (r->s = NULL): destroying it could wait forever. */
CUresult stream_released(rank_t *r);
/* A page of host memory registered with CUDA as a gate the application opens from the host. */
uint32_t *gate_new(CUdeviceptr *d);
void gate_free(uint32_t *g);

/* ============================================================================================
 * Exact collectives on the application's device memory
 *
 * Rank r's input element i is (r + 1) * (i % 13) + r, so the sum of both ranks is 3 * (i % 13) + 1.
 * ========================================================================================== */

#define N_AR (COUNT + 3) /* elements of the all-reduce, broadcast and reduce */
#define N_G 1027         /* elements per rank of the all-gather and the reduce-scatter */

float input(int rank, size_t i);
float input_sum(size_t i);
/* Put this rank's inputs into send (n elements) and 0xff bytes (a NaN pattern) into recv, waited for. */
bool fill(rank_t *r, CUdeviceptr send, CUdeviceptr recv, size_t n, size_t nrecv, float *host);
/* Wait for a posted collective: the rank's stream, then the communicator. */
bool finished(rank_t *r, const char *what, colld_status_t st);
/* Compare n elements of buf with want(i) exactly (NaN: untouched 0xff bytes); r->v[0]++ when equal. */
bool expect_values(rank_t *r, const char *what, CUdeviceptr buf, size_t n, float *host,
                   float (*want)(rank_t *, size_t));
float want_sum(rank_t *r, size_t i);
/* All-reduce (out of place, in place), broadcast, reduce, all-gather and reduce-scatter on
 * colld_mem_alloc(COLLD_MEM_CUDA) buffers, each exact: r->v[0] counts them (6). */
void sc_collectives(rank_t *r);
/* A host-only communicator: an all-reduce of host memory (no stream), the result exact. */
void sc_host(rank_t *r);

/* ============================================================================================
 * The application's entry points beyond colld's table (capture, graphs, reset)
 * ========================================================================================== */

typedef struct {
    PFN_cuStreamBeginCapture_v10010 begin;
    PFN_cuStreamEndCapture_v10000 end;
    PFN_cuGraphInstantiateWithFlags_v11040 instantiate;
    PFN_cuGraphLaunch_v10000 launch;
    PFN_cuGraphGetNodes_v10000 nodes;
    PFN_cuGraphDestroy_v10000 destroy;
    PFN_cuGraphExecDestroy_v10000 exec_destroy;
    PFN_cuDevicePrimaryCtxReset_v11000 reset;
} gpu_app_t;
extern gpu_app_t app;
/* Those entry points, from the driver colld loaded. */
bool app_load(void);

/* ============================================================================================
 * The groups
 * ========================================================================================== */

/* A topic file's cases for a group (n 0: none). */
typedef struct {
    const struct CMUnitTest *tests;
    size_t n;
} gpu_cases_t;
#define GPU_CASES(array) ((gpu_cases_t){ .tests = (array), .n = sizeof(array) / sizeof((array)[0]) })
#define GPU_NO_CASES ((gpu_cases_t){ .tests = NULL, .n = 0 })

gpu_cases_t gpu_launch_cases(const char *group);
gpu_cases_t gpu_ready_cases(const char *group);
gpu_cases_t gpu_reg_cases(const char *group);
gpu_cases_t gpu_capture_cases(const char *group);
gpu_cases_t gpu_recovery_cases(const char *group);
gpu_cases_t gpu_release_cases(const char *group);
gpu_cases_t gpu_nan_cases(const char *group);

/* Is group one of the names (NULL-terminated)? */
bool group_is(const char *group, const char *const *names);

#endif /* COLLD_TESTS_HARNESS_GPU_H */
