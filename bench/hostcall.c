/*
 * hostcall.c - colld-hostcall: the time of colld_allreduce's host call alone, stream-ordered (issue
 * 28 item 2; the goal is at most 5 us on a GPU). Each of RANKS threads (a client each, rank r on
 * GPU r % devices) posts CALLS in-place float32 all-reduces of COUNT elements on its own stream
 * (cuMemAlloc memory, CU_STREAM_NON_BLOCKING), timing only the call (clock_gettime before and
 * after colld_allreduce) and then waiting for its stream, untimed, before the next call.
 *
 * The baseline is measured in the same run: the same calls with libcolld's host-call caches off
 * (COLLD_GPU_HOST_CACHE=0, read when a client connects; a switch for this measurement, not a
 * setting to run with), rounds alternating cached / uncached so that drift hits both, after one
 * round of each that warms the daemon up and is not counted. Printed: per mode the median, the
 * mean and the 10th / 90th percentiles over every rank's timed calls, the ratios cached /
 * uncached and, when libcuda.so.1 is the CUDA driver test double, the driver calls per host call
 * (colld_cudafake_calls over the functions the host call may use, averaged over a round's calls:
 * the set-up and the first call's registration are in it).
 *
 *   colld-hostcall [--socket S] [--ranks R] [--calls N] [--rounds K] [--count C]
 *                  [--only cached|uncached]   (one mode alone, for a profile)
 *
 * On the test double every driver call is a function of the double (a lock, a table lookup), not
 * the driver's, and the daemon runs its kernels on the host: its times are not a GPU's. Only the
 * ratio and the call counts carry over. Exit status 0 when every call succeeded.
 */
#include <colld/colld.h>

#include "common/cudadrv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RANKS 8

static const colld_cu_t *cu;
static const char *socket_path;
static int nranks = 2, calls = 2000, rounds = 4;
static size_t count = 1024;
static int only = -1; /* --only cached (0) / uncached (1): one mode (for a profile) */
static colld_unique_id_t uid;
static pthread_barrier_t barrier;
static unsigned long long (*calls_of)(const char *); /* the test double's counter, or NULL */

/* The driver calls the host call may make (the double counts them per function). */
static const char *const counted[] = {
    "cuCtxGetCurrent",        "cuCtxGetDevice",       "cuCtxGetId",           "cuCtxPopCurrent",
    "cuCtxPushCurrent",       "cuCtxSetCurrent",      "cuDeviceGetAttribute", "cuMemHostGetDevicePointer",
    "cuPointerGetAttributes", "cuStreamGetCtx",       "cuStreamGetId",        "cuStreamIsCapturing",
    "cuStreamWaitValue32",    "cuStreamWriteValue32",
};

typedef struct {
    int rank;
    double *ns; /* [calls] */
    int failed;
    char why[256];
} rank_t;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static unsigned long long counted_calls(void)
{
    unsigned long long n = 0;
    for (size_t k = 0; calls_of && k < sizeof(counted) / sizeof(counted[0]); k++)
        n += calls_of(counted[k]);
    return n;
}

static void *rank_main(void *arg)
{
    rank_t *r = arg;
    colld_client_t *c = NULL;
    colld_comm_t *comm = NULL;
    CUcontext ctx = NULL;
    CUstream s = NULL;
    CUdeviceptr buf = 0;
    int ndev = 1;
    colld_status_t st = colld_connect(socket_path, &c);
    if (st == COLLD_OK && r->rank == 0)
        st = colld_get_unique_id(c, &uid);
    pthread_barrier_wait(&barrier);
    if (st == COLLD_OK)
        st = colld_comm_init_rank(c, &comm, nranks, uid, r->rank, NULL);
    if (st != COLLD_OK) {
        snprintf(r->why, sizeof(r->why), "connect / communicator: %s", colld_status_name(st));
        r->failed = 1;
        goto out;
    }
    cu->cuDeviceGetCount(&ndev);
    if (cu->cuDevicePrimaryCtxRetain(&ctx, r->rank % (ndev > 0 ? ndev : 1)) != CUDA_SUCCESS ||
        cu->cuCtxSetCurrent(ctx) != CUDA_SUCCESS || cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        cu->cuMemAlloc(&buf, count * sizeof(float)) != CUDA_SUCCESS ||
        cu->cuMemsetD8(buf, 0, count * sizeof(float)) != CUDA_SUCCESS) {
        snprintf(r->why, sizeof(r->why), "CUDA setup of rank %d failed", r->rank);
        r->failed = 1;
    }
    /* Every rank runs the same number of calls, failed or not, so that no peer waits forever. */
    for (int i = -10; i < calls; i++) {
        uint64_t t0 = now_ns();
        if (!r->failed)
            st = colld_allreduce((void *)buf, (void *)buf, count, COLLD_FLOAT32, COLLD_SUM, comm, s);
        uint64_t t1 = now_ns();
        if (!r->failed && st != COLLD_OK) {
            snprintf(r->why, sizeof(r->why), "call %d: %s: %s", i, colld_status_name(st), colld_comm_last_error(comm));
            r->failed = 1;
        }
        if (!r->failed && cu->cuStreamSynchronize(s) != CUDA_SUCCESS) {
            snprintf(r->why, sizeof(r->why), "call %d: cuStreamSynchronize failed", i);
            r->failed = 1;
        }
        if (i >= 0)
            r->ns[i] = (double)(t1 - t0);
    }
out:
    if (comm)
        colld_comm_destroy(comm);
    if (buf)
        cu->cuMemFree(buf);
    if (s)
        cu->cuStreamDestroy(s);
    if (c)
        colld_disconnect(c);
    if (ctx)
        cu->cuCtxSetCurrent(NULL);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    double *ns; /* every timed call of every round of this mode */
    size_t n;
    unsigned long long driver_calls;
} hc_mode_t;

/* One round of one mode: nranks threads, their timed calls appended to m. 0 or -1. */
static int run_round(hc_mode_t *m, bool cached)
{
    rank_t ranks[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    setenv("COLLD_GPU_HOST_CACHE", cached ? "1" : "0", 1);
    pthread_barrier_init(&barrier, NULL, (unsigned)nranks);
    unsigned long long before = counted_calls();
    for (int i = 0; i < nranks; i++) {
        ranks[i] = (rank_t){ .rank = i, .ns = m->ns + m->n + (size_t)i * (size_t)calls };
        pthread_create(&th[i], NULL, rank_main, &ranks[i]);
    }
    int rc = 0;
    for (int i = 0; i < nranks; i++) {
        pthread_join(th[i], NULL);
        if (ranks[i].failed) {
            fprintf(stderr, "colld-hostcall: rank %d: %s\n", i, ranks[i].why);
            rc = -1;
        }
    }
    m->driver_calls += counted_calls() - before;
    m->n += (size_t)nranks * (size_t)calls;
    pthread_barrier_destroy(&barrier);
    unsetenv("COLLD_GPU_HOST_CACHE");
    return rc;
}

static double pct(const hc_mode_t *m, double p)
{
    size_t i = (size_t)(p * (double)(m->n - 1) + 0.5);
    return m->ns[i] / 1000.0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "usage: %s [--socket S] [--ranks R] [--calls N] [--rounds K] [--count C]\n", argv[0]);
            return 2;
        }
        if (strcmp(a, "--socket") == 0)
            socket_path = v;
        else if (strcmp(a, "--ranks") == 0)
            nranks = atoi(v);
        else if (strcmp(a, "--calls") == 0)
            calls = atoi(v);
        else if (strcmp(a, "--rounds") == 0)
            rounds = atoi(v);
        else if (strcmp(a, "--only") == 0)
            only = strcmp(v, "cached") == 0 ? 0 : strcmp(v, "uncached") == 0 ? 1 : -2;
        else if (strcmp(a, "--count") == 0)
            count = (size_t)strtoull(v, NULL, 0);
        else {
            fprintf(stderr, "%s: unknown option %s\n", argv[0], a);
            return 2;
        }
        i++;
    }
    if (nranks < 1 || nranks > MAX_RANKS || calls < 1 || rounds < 1 || count < 1 || only == -2) {
        fprintf(stderr, "%s: ranks 1..%d, calls, rounds and count at least 1\n", argv[0], MAX_RANKS);
        return 2;
    }
    char err[256];
    if (!(cu = colld_cu_load(err, sizeof(err)))) {
        fprintf(stderr, "colld-hostcall: no CUDA driver: %s\n", err);
        return 77;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib)
        calls_of = (unsigned long long (*)(const char *))dlsym(lib, "colld_cudafake_calls");
    hc_mode_t modes[2]; /* [0] cached, [1] uncached */
    size_t per_mode = (size_t)(rounds + 1) * (size_t)nranks * (size_t)calls;
    for (int k = 0; k < 2; k++) {
        modes[k] = (hc_mode_t){ .ns = calloc(per_mode, sizeof(double)) };
        if (!modes[k].ns)
            return 1;
    }
    int rc = 0;
    /* Round -1 warms the daemon up (its CUDA backend, the first sessions) and is not counted. */
    for (int round = -1; round < rounds && rc == 0; round++) {
        for (int k = 0; k < 2 && rc == 0; k++)
            if (only < 0 || only == (round + 2 + k) % 2)
                rc = run_round(&modes[(round + 2 + k) % 2], (round + 2 + k) % 2 == 0);
        if (round == -1)
            for (int k = 0; k < 2; k++)
                modes[k].n = 0, modes[k].driver_calls = 0;
    }
    if (rc != 0)
        return 1;
    printf("# colld-hostcall: %d rank(s), %d calls x %d rounds per mode, all-reduce of %zu float32 in place, on %s\n",
           nranks, calls, rounds, count, calls_of ? "the CUDA driver test double (not a GPU's times)" : "a GPU");
    printf("%-10s %10s %10s %10s %10s %14s\n", "mode", "p50_us", "mean_us", "p10_us", "p90_us", "driver_calls");
    const char *names[2] = { "cached", "uncached" };
    double p50[2], p10[2], mean[2];
    for (int k = 0; k < 2; k++) {
        hc_mode_t *m = &modes[k];
        double sum = 0;
        p50[k] = p10[k] = mean[k] = 0;
        if (!m->n)
            continue;
        for (size_t i = 0; i < m->n; i++)
            sum += m->ns[i];
        qsort(m->ns, m->n, sizeof(double), cmp_double);
        p50[k] = pct(m, 0.5);
        p10[k] = pct(m, 0.1);
        mean[k] = sum / (double)m->n / 1000.0;
        char dc[32] = "-";
        if (calls_of)
            snprintf(dc, sizeof(dc), "%.2f",
                     (double)m->driver_calls / ((double)m->n / (double)calls * (double)(calls + 10)));
        printf("%-10s %10.2f %10.2f %10.2f %10.2f %14s\n", names[k], p50[k], mean[k], p10[k], pct(m, 0.9), dc);
    }
    if (p50[0] > 0 && p50[1] > 0)
        printf("ratio cached/uncached: p10 %.3f, p50 %.3f, mean %.3f\n", p10[0] / p10[1], p50[0] / p50[1],
               mean[0] / mean[1]);
    for (int k = 0; k < 2; k++)
        free(modes[k].ns);
    return 0;
}
