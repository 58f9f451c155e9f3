/*
 * membw.c - the machine's memory bandwidth, for the zero-copy bound of bench/compare.sh.
 *
 *   membw [-s MIB_PER_ARRAY] [-t THREADS] [-r REPS]
 *
 * Four STREAM-like probes over arrays much bigger than the caches, split over THREADS threads
 * (default: every online CPU), each thread touching its own slice first so pages are spread as
 * they will be used:
 *   copy   memcpy(b, a)        1 read stream, 1 write stream (glibc may use non-temporal stores)
 *   scale  b[i] = q * a[i]     1 read, 1 write with ordinary stores (the write allocates the line)
 *   add    c[i] = a[i] + b[i]  2 reads, 1 write with ordinary stores
 *   update a[i] = q * a[i]     1 read, 1 write of the same line (no extra line fill): the access
 *                              pattern of an in-place reduction, and of an out-of-place one whose
 *                              outputs use streaming stores
 * Bytes are counted as STREAM does (what the program reads and writes, not the extra line fill a
 * cached store causes): copy, scale and update 2 x N, add 3 x N per pass. So scale and add count
 * less than the memory really moves (each written line is also read first) and update counts
 * it all. Each probe runs REPS times and the best pass is reported, in GB/s (1e9 bytes/s), one
 * "name value" per line:
 *
 *   membw_copy_gbs 21.3
 *   membw_scale_gbs 14.2
 *   membw_add_gbs 15.8
 *   membw_update_gbs 22.0
 *
 * Exit status 0, 1 on an error, 2 for bad options. Build: cc -O2 -pthread membw.c -o membw
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { P_COPY, P_SCALE, P_ADD, P_UPDATE, P_COUNT };
static const char *const probe_names[P_COUNT] = { "copy", "scale", "add", "update" };

typedef struct {
    double *a, *b, *c; /* the whole arrays */
    size_t n;          /* elements per array */
    int threads, reps;
    double q;          /* the scale factor (1.0, read at run time so it cannot be folded) */
    pthread_barrier_t start, done;
    int probe;         /* what the threads run next; -1: exit */
} shared_t;

typedef struct {
    shared_t *s;
    int id;
} worker_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Each thread's share [lo, hi) of the elements, in whole cache lines. */
static void slice(const shared_t *s, int id, size_t *lo, size_t *hi)
{
    size_t lines = s->n / 8, per = lines / (size_t)s->threads, extra = lines % (size_t)s->threads;
    size_t first = (size_t)id * per + ((size_t)id < extra ? (size_t)id : extra);
    *lo = first * 8;
    *hi = (first + per + ((size_t)id < extra ? 1 : 0)) * 8;
    if (id == s->threads - 1)
        *hi = s->n;
}

/* A worker: first-touch its slices, then run whatever probe the main thread starts. */
static void *worker(void *arg)
{
    worker_t *w = arg;
    shared_t *s = w->s;
    size_t lo, hi;
    slice(s, w->id, &lo, &hi);
    for (size_t i = lo; i < hi; i++) {
        s->a[i] = (double)(i % 1000) * 0.5;
        s->b[i] = (double)(i % 7);
        s->c[i] = 0;
    }
    for (;;) {
        pthread_barrier_wait(&s->start);
        int probe = s->probe;
        if (probe < 0)
            break;
        double *restrict a = s->a, *restrict b = s->b, *restrict c = s->c;
        double q = s->q;
        switch (probe) {
        case P_COPY: memcpy(b + lo, a + lo, (hi - lo) * sizeof(double)); break;
        case P_SCALE:
            for (size_t i = lo; i < hi; i++)
                b[i] = q * a[i];
            break;
        case P_ADD:
            for (size_t i = lo; i < hi; i++)
                c[i] = a[i] + b[i];
            break;
        default:
            for (size_t i = lo; i < hi; i++)
                a[i] = q * a[i];
            break;
        }
        pthread_barrier_wait(&s->done);
    }
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: membw [-s MIB_PER_ARRAY (default 256)] [-t THREADS (default: online CPUs)] "
               "[-r REPS (default 5)]\n");
}

int main(int argc, char **argv)
{
    long mib = 256, threads = sysconf(_SC_NPROCESSORS_ONLN), reps = 5;
    int opt;
    while ((opt = getopt(argc, argv, "s:t:r:h")) != -1) {
        char *end;
        long v = optarg ? strtol(optarg, &end, 10) : 0;
        if (opt == 'h') {
            usage(stdout);
            return 0;
        }
        if (!optarg || *end || end == optarg || v < 1 || v > 65536) {
            usage(stderr);
            return 2;
        }
        if (opt == 's')
            mib = v;
        else if (opt == 't')
            threads = v > 1024 ? 1024 : v;
        else if (opt == 'r')
            reps = v;
    }
    if (optind < argc || threads < 1) {
        usage(stderr);
        return 2;
    }
    shared_t s = { .n = (size_t)mib * 1024 * 1024 / sizeof(double), .threads = (int)threads, .reps = (int)reps };
    s.q = argc > 1000 ? 2.0 : 1.0; /* not a compile-time constant */
    size_t bytes = s.n * sizeof(double);
    if (posix_memalign((void **)&s.a, 4096, bytes) || posix_memalign((void **)&s.b, 4096, bytes) ||
        posix_memalign((void **)&s.c, 4096, bytes)) {
        fprintf(stderr, "membw: cannot allocate 3 x %ld MiB\n", mib);
        return 1;
    }
    pthread_barrier_init(&s.start, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&s.done, NULL, (unsigned)threads + 1);
    pthread_t *tids = calloc((size_t)threads, sizeof(*tids));
    worker_t *ws = calloc((size_t)threads, sizeof(*ws));
    if (!tids || !ws) {
        fprintf(stderr, "membw: out of memory\n");
        return 1;
    }
    for (int i = 0; i < threads; i++) {
        ws[i] = (worker_t){ .s = &s, .id = i };
        int rc = pthread_create(&tids[i], NULL, worker, &ws[i]);
        if (rc) {
            fprintf(stderr, "membw: pthread_create: %s\n", strerror(rc));
            return 1;
        }
    }
    printf("# membw: %d thread(s), 3 arrays of %ld MiB, best of %d passes, GB/s = 1e9 bytes/s\n", s.threads, mib,
           s.reps);
    for (int p = 0; p < P_COUNT; p++) {
        double best = 1e30;
        for (int r = 0; r < s.reps + 1; r++) { /* one untimed pass first */
            s.probe = p;
            double t0 = now_s();
            pthread_barrier_wait(&s.start);
            pthread_barrier_wait(&s.done);
            double t = now_s() - t0;
            if (r > 0 && t < best)
                best = t;
        }
        double moved = (double)bytes * (p == P_ADD ? 3 : 2);
        printf("membw_%s_gbs %.2f\n", probe_names[p], moved / best / 1e9);
        fflush(stdout);
    }
    s.probe = -1;
    pthread_barrier_wait(&s.start);
    for (int i = 0; i < threads; i++)
        pthread_join(tids[i], NULL);
    /* Keep the results observable so nothing is optimised away. */
    if (s.c[s.n / 2] == -1.0 && s.b[1] == -1.0)
        printf("# (never)\n");
    free(tids);
    free(ws);
    free(s.a);
    free(s.b);
    free(s.c);
    return 0;
}
