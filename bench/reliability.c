/*
 * reliability.c - colld-reliability: the load of the reliability benchmarks (bench/reliability.sh,
 * issue 13). Each mode drives a real daemon through libcolld and prints one result line that the
 * script records; the script itself samples the daemon's RSS, descriptors and mappings.
 *
 *   colld-reliability --socket S churn-connect N    N x (connect, a unique id, 4 KiB alloc/free, disconnect)
 *   colld-reliability --socket S churn-comm N       N x (2 ranks in 2 threads form a communicator,
 *                                                   one exact all-reduce, destroy)
 *   colld-reliability --socket S kill N [RANKS]     N trials: RANKS processes (default 4) run exact
 *                                                   all-reduces; one, chosen in turn, is killed
 *                                                   with SIGKILL at a random moment; every survivor
 *                                                   must fail with COLLD_ERR_PEER_LOST; prints the
 *                                                   detection times (kill -> survivor's error)
 *   colld-reliability --socket S soak SECONDS [PAIRS] PAIRS two-rank communicators (processes)
 *                                                   run exact all-reduces of 8 B .. 1 MiB until
 *                                                   the time is up; prints collectives and errors
 *   colld-reliability --socket S teardown N         a process joins N one-rank communicators and
 *                                                   exits; another process attaches (connect,
 *                                                   disconnect) over and over meanwhile: the longest
 *                                                   attach is the stall every tenant sees while the
 *                                                   daemon tears the session down (the daemon needs
 *                                                   limits above N)
 *
 * Exit status 0 when every operation behaved exactly as described, 1 otherwise.
 */
#include <colld/colld.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *sock;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Value of element i on rank r: small integers, so float sums are exact in any order. */
static float value(int r, size_t i)
{
    return (float)((int)((i * 7 + (size_t)r * 13) % 61) - 30);
}

/* One all-reduce of `count` floats on `buf`; 0 when exact, else the status (or -1: wrong values). */
static int allreduce_exact(colld_comm_t *comm, float *buf, size_t count, int rank, int nranks)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = value(rank, i);
    colld_status_t st = colld_allreduce(buf, buf, count, COLLD_FLOAT32, COLLD_SUM, comm, NULL);
    if (st == COLLD_OK)
        st = colld_comm_synchronize(comm);
    if (st != COLLD_OK)
        return st;
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++)
            want += value(r, i);
        if (buf[i] != want)
            return -1;
    }
    return 0;
}

/* ---- churn-connect ---------------------------------------------------------------------- */

static int churn_connect(long n)
{
    double t0 = now_ms();
    for (long i = 0; i < n; i++) {
        colld_client_t *c;
        colld_unique_id_t id;
        void *p;
        colld_status_t st = colld_connect(sock, &c);
        if (st == COLLD_OK && (st = colld_get_unique_id(c, &id)) == COLLD_OK &&
            (st = colld_mem_alloc(c, &p, 4096, COLLD_MEM_HOST)) == COLLD_OK)
            st = colld_mem_free(c, p);
        if (st != COLLD_OK) {
            fprintf(stderr, "churn-connect: cycle %ld: %s\n", i, colld_status_name(st));
            return 1;
        }
        colld_disconnect(c);
    }
    printf("churn-connect cycles=%ld seconds=%.2f\n", n, (now_ms() - t0) / 1e3);
    return 0;
}

/* ---- churn-comm ------------------------------------------------------------------------- */

typedef struct {
    colld_client_t *client;
    colld_unique_id_t id;
    int rank;
    int rc;
} member_t;

static void *member_main(void *arg)
{
    member_t *m = arg;
    colld_comm_t *comm = NULL;
    float *buf = NULL;
    m->rc = 1;
    if (colld_comm_init_rank(m->client, &comm, 2, m->id, m->rank, NULL) != COLLD_OK)
        return NULL;
    if (colld_mem_alloc(m->client, (void **)&buf, 1024 * sizeof(float), COLLD_MEM_HOST) == COLLD_OK) {
        m->rc = allreduce_exact(comm, buf, 1024, m->rank, 2) ? 1 : 0;
        colld_mem_free(m->client, buf);
    }
    if (colld_comm_destroy(comm) != COLLD_OK)
        m->rc = 1;
    return NULL;
}

static int churn_comm(long n)
{
    member_t m[2];
    for (int r = 0; r < 2; r++) {
        m[r] = (member_t){ .rank = r };
        if (colld_connect(sock, &m[r].client) != COLLD_OK) {
            fprintf(stderr, "churn-comm: cannot connect\n");
            return 1;
        }
    }
    double t0 = now_ms();
    for (long i = 0; i < n; i++) {
        colld_unique_id_t id;
        if (colld_get_unique_id(m[0].client, &id) != COLLD_OK)
            return 1;
        pthread_t t[2];
        for (int r = 0; r < 2; r++) {
            m[r].id = id;
            pthread_create(&t[r], NULL, member_main, &m[r]);
        }
        for (int r = 0; r < 2; r++)
            pthread_join(t[r], NULL);
        if (m[0].rc || m[1].rc) {
            fprintf(stderr, "churn-comm: cycle %ld failed\n", i);
            return 1;
        }
    }
    printf("churn-comm cycles=%ld seconds=%.2f\n", n, (now_ms() - t0) / 1e3);
    for (int r = 0; r < 2; r++)
        colld_disconnect(m[r].client);
    return 0;
}

/* ---- kill trials ------------------------------------------------------------------------ */

/* The communicator's unique id, made by rank 0 and read by the others: this process never
 * touches libcolld before it forks (gRPC must not be used across fork without exec). */
typedef struct {
    volatile int ready;
    colld_unique_id_t id;
} uid_box_t;

/* Connect; rank 0 makes the unique id and publishes it, the others wait for it. NULL on failure. */
static colld_client_t *connect_and_share(uid_box_t *box, int rank, colld_unique_id_t *id)
{
    colld_client_t *c;
    if (colld_connect(sock, &c) != COLLD_OK)
        return NULL;
    if (rank == 0) {
        if (colld_get_unique_id(c, &box->id) != COLLD_OK)
            return NULL;
        __atomic_store_n(&box->ready, 1, __ATOMIC_RELEASE);
    }
    double deadline = now_ms() + 10000;
    while (!__atomic_load_n(&box->ready, __ATOMIC_ACQUIRE) && now_ms() < deadline)
        usleep(100);
    *id = box->id;
    return box->ready ? c : NULL;
}

/* What each rank of a trial reports through shared memory. */
typedef struct {
    volatile int joined;
    volatile int iterations;
    volatile double error_ms; /* CLOCK_MONOTONIC ms when a call failed, 0 before */
    volatile int status;
    char detail[256];
} slot_t;

/* A rank of a kill trial: all-reduces until one fails, which is recorded. */
static void trial_rank(slot_t *slot, uid_box_t *box, int rank, int nranks)
{
    colld_client_t *c;
    colld_comm_t *comm;
    colld_unique_id_t id;
    float *buf;
    if (!(c = connect_and_share(box, rank, &id)) || colld_comm_init_rank(c, &comm, nranks, id, rank, NULL) != COLLD_OK ||
        colld_mem_alloc(c, (void **)&buf, 4096 * sizeof(float), COLLD_MEM_HOST) != COLLD_OK)
        _exit(2);
    slot->joined = 1;
    for (unsigned i = 0;; i++) {
        int rc = allreduce_exact(comm, buf, i % 2 ? 16 : 4096, rank, nranks); /* fast area, then engine */
        if (rc) {
            slot->error_ms = now_ms();
            slot->status = rc;
            snprintf(slot->detail, sizeof(slot->detail), "%s", colld_comm_last_error(comm));
            colld_comm_destroy(comm);
            colld_disconnect(c);
            _exit(0);
        }
        slot->iterations++;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int kill_trials(long trials, int nranks)
{
    slot_t *slots = mmap(NULL, sizeof(slot_t) * (size_t)nranks, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                         -1, 0);
    uid_box_t *box = mmap(NULL, sizeof(*box), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    double *lat = calloc((size_t)(trials * nranks), sizeof(double));
    if (slots == MAP_FAILED || box == MAP_FAILED || !lat)
        return 1;
    long survivors = 0, wrong = 0;
    srand(12345);
    for (long t = 0; t < trials; t++) {
        pid_t pids[64];
        memset(slots, 0, sizeof(slot_t) * (size_t)nranks);
        memset(box, 0, sizeof(*box));
        for (int r = 0; r < nranks; r++) {
            pids[r] = fork();
            if (pids[r] == 0)
                trial_rank(&slots[r], box, r, nranks);
        }
        double deadline = now_ms() + 10000;
        for (int r = 0; r < nranks; r++)
            while (!slots[r].joined && now_ms() < deadline)
                usleep(200);
        usleep((useconds_t)(1000 + rand() % 20000)); /* 1-21 ms into the all-reduces */
        int victim = (int)(t % nranks);
        double killed = now_ms();
        kill(pids[victim], SIGKILL);
        for (int r = 0; r < nranks; r++) {
            int status;
            waitpid(pids[r], &status, 0);
            if (r == victim)
                continue;
            survivors++;
            if (slots[r].status != COLLD_ERR_PEER_LOST) {
                wrong++;
                fprintf(stderr, "trial %ld rank %d: %d (%s)\n", t, r, slots[r].status, slots[r].detail);
                continue;
            }
            lat[survivors - 1 - wrong] = slots[r].error_ms - killed;
        }
    }
    long n = survivors - wrong;
    qsort(lat, (size_t)n, sizeof(double), cmp_double);
    printf("kill trials=%ld ranks=%d survivors=%ld peer_lost=%ld other=%ld detect_ms_p50=%.2f p99=%.2f max=%.2f\n",
           trials, nranks, survivors, n, wrong, n ? lat[n / 2] : 0, n ? lat[(n * 99) / 100] : 0, n ? lat[n - 1] : 0);
    return wrong ? 1 : 0;
}

/* ---- soak ------------------------------------------------------------------------------- */

static int soak_rank(uid_box_t *box, int rank, double end, long *done)
{
    colld_client_t *c;
    colld_comm_t *comm;
    colld_unique_id_t id;
    float *buf;
    size_t max = 1u << 18; /* 1 MiB of floats */
    if (!(c = connect_and_share(box, rank, &id)) || colld_comm_init_rank(c, &comm, 2, id, rank, NULL) != COLLD_OK ||
        colld_mem_alloc(c, (void **)&buf, max * sizeof(float), COLLD_MEM_HOST) != COLLD_OK)
        return 1;
    long n = 0;
    int rc = 0;
    /* Both ranks run the same sequence of sizes and agree every 64 on whether to go on. */
    while (!rc) {
        size_t count = (size_t)2 << (n % 18); /* 8 B .. 1 MiB */
        rc = allreduce_exact(comm, buf, count, rank, 2);
        n++;
        if (n % 64 == 0) { /* agree on stopping: all-reduce the wish to go on */
            float go = now_ms() < end ? 1.0f : 0.0f;
            if (colld_allreduce(&go, &go, 1, COLLD_FLOAT32, COLLD_MIN, comm, NULL) != COLLD_OK ||
                colld_comm_synchronize(comm) != COLLD_OK)
                rc = 1;
            if (go == 0.0f)
                break;
        }
    }
    *done = n;
    colld_mem_free(c, buf);
    colld_comm_destroy(comm);
    colld_disconnect(c);
    return rc ? 1 : 0;
}

static int soak(double seconds, int pairs)
{
    long *done = mmap(NULL, sizeof(long) * 256, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uid_box_t *box = mmap(NULL, sizeof(*box) * 128, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (done == MAP_FAILED || box == MAP_FAILED || pairs > 128)
        return 1;
    double end = now_ms() + seconds * 1e3;
    pid_t pids[256];
    for (int p = 0; p < pairs; p++)
        for (int r = 0; r < 2; r++) {
            pids[2 * p + r] = fork();
            if (pids[2 * p + r] == 0)
                _exit(soak_rank(&box[p], r, end, &done[2 * p + r]));
        }
    int failed = 0;
    long total = 0;
    for (int i = 0; i < 2 * pairs; i++) {
        int status;
        waitpid(pids[i], &status, 0);
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        total += done[i];
    }
    printf("soak seconds=%.0f processes=%d collectives_per_rank_total=%ld failed_processes=%d\n", seconds, 2 * pairs,
           total, failed);
    return failed ? 1 : 0;
}

/* ---- teardown stall --------------------------------------------------------------------- */

static int teardown(long n)
{
    int *flag = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (flag == MAP_FAILED)
        return 1;
    pid_t pid = fork();
    if (pid == 0) { /* the process with N communicators: it joins them, then exits without a word */
        colld_client_t *c;
        if (colld_connect(sock, &c) != COLLD_OK)
            _exit(1);
        for (long i = 0; i < n; i++) {
            colld_unique_id_t id;
            colld_comm_t *comm;
            colld_status_t st = colld_get_unique_id(c, &id);
            if (st == COLLD_OK)
                st = colld_comm_init_rank(c, &comm, 1, id, 0, NULL);
            if (st != COLLD_OK) {
                fprintf(stderr, "teardown: communicator %ld: %s: %s\n", i, colld_status_name(st), colld_last_error(c));
                _exit(1);
            }
        }
        __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
        while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != 2)
            usleep(1000);
        _exit(0);
    }
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == 0) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return 1;
        usleep(1000);
    }
    /* Another tenant's process attaching meanwhile (session socket and control plane, both of
     * which take the daemon lock): connected only now, so nothing of gRPC crossed the fork. */
    double worst = 0, end = now_ms() + 3000;
    __atomic_store_n(flag, 2, __ATOMIC_RELEASE);
    long calls = 0;
    while (now_ms() < end) {
        colld_client_t *c;
        double t0 = now_ms();
        if (colld_connect(sock, &c) != COLLD_OK)
            return 1;
        double dt = now_ms() - t0;
        colld_disconnect(c);
        worst = dt > worst ? dt : worst;
        calls++;
    }
    int status;
    waitpid(pid, &status, 0);
    printf("teardown communicators=%ld attaches=%ld longest_attach_ms=%.1f\n", n, calls, worst);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[1], "--socket") == 0) {
        sock = argv[2];
        const char *mode = argv[3];
        long n = atol(argv[4]);
        int k = argc > 5 ? atoi(argv[5]) : 0;
        if (strcmp(mode, "churn-connect") == 0)
            return churn_connect(n);
        if (strcmp(mode, "churn-comm") == 0)
            return churn_comm(n);
        if (strcmp(mode, "kill") == 0)
            return kill_trials(n, k > 1 && k <= 64 ? k : 4);
        if (strcmp(mode, "soak") == 0)
            return soak((double)n, k > 0 ? k : 4);
        if (strcmp(mode, "teardown") == 0)
            return teardown(n);
    }
    fprintf(stderr, "usage: colld-reliability --socket PATH churn-connect N | churn-comm N | kill N [RANKS] | "
                    "soak SECONDS [PAIRS] | teardown N\n");
    return 2;
}
