/*
 * rank.c - colld-test-rank: one real client process for the integration tests.
 *
 * It connects to the daemon, joins a communicator at a rank, runs all-reduces over the given
 * counts (in-place and/or out-of-place) on values that make every exact result predictable, and
 * checks every element. The exit code tells the driver what happened:
 *   0 the run (or the expected failure, --expect NAME) happened exactly;
 *   1 wrong results or an unexpected status (printed on stderr).
 *
 * Modes: --mode allreduce (default), --mode attach (connect/alloc/free/disconnect --iters times),
 * --mode hang (join, run --warmup exact all-reduces, then post one more unless --no-post and wait
 * for the expected failure; a --no-post rank waits until the communicator breaks, or aborts it
 * itself after --abort-after-ms). After a failure, a later call must fail fast with the same status.
 *
 * Coordination with the driver: --ready-file is written when the rank waits (hang) or starts its
 * loop; --done-file when its work is done; --stop-file makes it wait for that file before it
 * destroys its communicator (and, with --iters 0, run all-reduces until the file appears);
 * --progress-file receives the number of finished iterations; --straggle-ms delays every
 * all-reduce of this rank (a straggler); --fork-child FILE (hang) forks a child that tries the
 * parent's connection and reports to FILE (see fork_child); --hand-socket FILE (hang) hands a copy
 * of the session socket to a process that is not libcolld's (see hand_socket).
 */
#include "client/client_internal.h"
#include "tests/integration/harness.h"
#include "tests/integration/harness_opts.h"

#include <colld/colld.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *socket, *uid_hex, *mode, *expect, *ready_file, *counts;
    const char *name, *done_file, *stop_file, *progress_file, *fork_file, *hand_file;
    int nranks, rank, iters, timeout_ms, straggle_ms, warmup, abort_after_ms;
    bool skip_post, use_malloc, inplace, outofplace;
} args_t;

static int fail(const char *what, colld_status_t st, colld_comm_t *comm)
{
    fprintf(stderr, "rank: %s: %s (%s)\n", what, colld_status_name(st), comm ? colld_comm_last_error(comm) : "");
    return 1;
}

/* Value of element i on rank r: small integers, so float sums are exact in any order. */
#define COLLD_TEST_MAX(a, b) ((a) > (b) ? (a) : (b))

static float value(int r, size_t i)
{
    return (float)((int)((i * 7 + (size_t)r * 13) % 61) - 30);
}

static float expected(int nranks, size_t i)
{
    float s = 0;
    for (int r = 0; r < nranks; r++)
        s += value(r, i);
    return s;
}

/* One all-reduce of `count` floats; returns 0 when every element of the result is exact. */
static int run_one(colld_client_t *c, colld_comm_t *comm, const args_t *a, size_t count, bool inplace)
{
    size_t bytes = count ? count * sizeof(float) : 1;
    float *send = NULL, *recv = NULL;
    colld_status_t st = COLLD_OK;
    if (a->use_malloc) { /* ordinary memory: libcolld stages it */
        send = malloc(bytes);
        recv = inplace ? NULL : malloc(bytes);
        if (!send || (!inplace && !recv))
            return fail("malloc", COLLD_ERR_NO_MEMORY, comm);
    } else {
        if ((st = colld_mem_alloc(c, (void **)&send, bytes, COLLD_MEM_HOST)) != COLLD_OK)
            return fail("mem_alloc", st, comm);
        if (!inplace && (st = colld_mem_alloc(c, (void **)&recv, bytes, COLLD_MEM_HOST)) != COLLD_OK)
            return fail("mem_alloc", st, comm);
    }
    if (inplace)
        recv = send;
    if (a->straggle_ms)
        usleep((useconds_t)a->straggle_ms * 1000);
    for (size_t i = 0; i < count; i++) {
        send[i] = value(a->rank, i);
        if (!inplace)
            recv[i] = -12345.0f;
    }
    st = colld_allreduce(send, recv, count, COLLD_FLOAT32, COLLD_SUM, comm, NULL);
    if (st == COLLD_OK)
        st = colld_comm_synchronize(comm);
    if (st != COLLD_OK)
        return fail("allreduce", st, comm);
    size_t wrong = 0;
    for (size_t i = 0; i < count; i++)
        if (recv[i] != expected(a->nranks, i)) {
            if (wrong++ < 3)
                fprintf(stderr, "rank %d: count %zu %s: element %zu is %g, expected %g\n", a->rank, count,
                        inplace ? "in-place" : "out-of-place", i, recv[i], expected(a->nranks, i));
        }
    if (!inplace)
        for (size_t i = 0; i < count; i++)
            if (send[i] != value(a->rank, i) && wrong++ < 3)
                fprintf(stderr, "rank %d: sendbuf modified at %zu\n", a->rank, i);
    if (a->use_malloc) {
        free(send);
        if (!inplace)
            free(recv);
    } else {
        colld_mem_free(c, send);
        if (!inplace)
            colld_mem_free(c, recv);
    }
    return wrong ? 1 : 0;
}

static int mode_attach(const args_t *a)
{
    for (int i = 0; i < a->iters; i++) {
        colld_client_t *c;
        colld_status_t st = colld_connect(a->socket, &c);
        if (st != COLLD_OK)
            return fail("connect", st, NULL);
        colld_unique_id_t id;
        void *p;
        if ((st = colld_get_unique_id(c, &id)) != COLLD_OK || (st = colld_mem_alloc(c, &p, 4096, COLLD_MEM_HOST)) != COLLD_OK)
            return fail("attach work", st, NULL);
        colld_mem_free(c, p);
        colld_disconnect(c);
    }
    return 0;
}

/* Create a file for the driver (NULL: nothing), holding `text`. */
static void touch(const char *path, const char *text)
{
    if (!path)
        return;
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fputs(text, f);
    fclose(f);
    rename(tmp, path); /* the driver never sees a half-written file */
}

/* Tell the driver we reached the point it waits for. */
static void signal_ready(const args_t *a)
{
    touch(a->ready_file, "");
}

static bool file_exists(const char *path)
{
    return path && access(path, F_OK) == 0;
}

/* Wait for the driver's stop file (at most 120 s), if one was given. */
static void wait_stop(const args_t *a)
{
    for (int i = 0; a->stop_file && i < 12000 && !file_exists(a->stop_file); i++)
        usleep(10000);
}

/* With --iters 0 the ranks run until the stop file appears; they agree on it by an all-reduce of
 * what each one sees, so that none leaves while another posts one more collective. */
static int stop_agreed(colld_client_t *c, colld_comm_t *comm, const args_t *a)
{
    int32_t *flag;
    colld_status_t st = colld_mem_alloc(c, (void **)&flag, sizeof(*flag), COLLD_MEM_HOST);
    if (st != COLLD_OK) {
        fail("mem_alloc", st, comm);
        return -1;
    }
    *flag = file_exists(a->stop_file);
    st = colld_allreduce(flag, flag, 1, COLLD_INT32, COLLD_MAX, comm, NULL);
    if (st == COLLD_OK)
        st = colld_comm_synchronize(comm);
    int stop = st != COLLD_OK ? -1 : *flag != 0;
    if (st != COLLD_OK)
        fail("stop agreement", st, comm);
    colld_mem_free(c, flag);
    return stop;
}

/* After a failure, the communicator is broken: a later call must fail at once with the same
 * status. Returns 0 when it does. */
static int check_fails_fast(colld_client_t *c, colld_comm_t *comm, colld_status_t st)
{
    float *buf;
    if (colld_mem_alloc(c, (void **)&buf, 64, COLLD_MEM_HOST) != COLLD_OK)
        buf = NULL; /* the daemon may be gone: the call below must fail anyway */
    double t0 = harness_now_ms();
    colld_status_t again = colld_allreduce(buf, buf, buf ? 16 : 0, COLLD_FLOAT32, COLLD_SUM, comm, NULL);
    if (again == COLLD_OK)
        again = colld_comm_synchronize(comm);
    double took = harness_now_ms() - t0;
    if (buf)
        colld_mem_free(c, buf);
    if (again != st || took > 1000) {
        fprintf(stderr, "rank: a later all-reduce gave %s after %.1f ms, expected %s at once\n",
                colld_status_name(again), took, colld_status_name(st));
        return 1;
    }
    return 0;
}

/* A silent member polls the async error as a framework's watchdog does, until the communicator
 * breaks (or the daemon goes). Every poll must return at once. */
static int watchdog(colld_comm_t *comm, const args_t *a)
{
    colld_status_t err = COLLD_OK;
    double longest = 0;
    while (err == COLLD_OK) {
        double t0 = harness_now_ms();
        colld_status_t st = colld_comm_get_async_error(comm, &err);
        longest = COLLD_TEST_MAX(longest, harness_now_ms() - t0);
        if (st != COLLD_OK)
            return fail("get_async_error", st, comm);
        if (err == COLLD_OK)
            usleep(5000);
    }
    printf("rank %d: async error %s, longest poll %.3f ms: %s\n", a->rank, colld_status_name(err), longest,
           colld_comm_last_error(comm));
    fflush(stdout);
    if (longest > 100) {
        fprintf(stderr, "rank %d: colld_comm_get_async_error blocked for %.1f ms\n", a->rank, longest);
        return 1;
    }
    return 0;
}

/* A silent member that aborts the communicator after abort_after_ms. */
static int abort_later(colld_client_t *c, colld_comm_t *comm, const args_t *a)
{
    usleep((useconds_t)a->abort_after_ms * 1000);
    double t0 = harness_now_ms();
    colld_status_t st = colld_comm_abort(comm);
    double took = harness_now_ms() - t0;
    if (st != COLLD_OK)
        return fail("comm_abort", st, comm);
    printf("rank %d: abort took %.3f ms\n", a->rank, took);
    fflush(stdout);
    return check_fails_fast(c, comm, COLLD_ERR_ABORTED);
}

/* --fork-child FILE: fork a child that keeps the inherited descriptors (it never execs), tries
 * the parent's communicator, client and memory, writes "<pid> <status> <detail>" of its collective
 * to FILE, then sleeps until killed (at most 60 s). A child must neither use the parent's session
 * nor keep it alive for the daemon. */
static void fork_child(colld_client_t *c, colld_comm_t *comm, float *buf, const char *file)
{
    pid_t pid = fork();
    if (pid != 0)
        return;
    colld_status_t st = colld_allreduce(buf, buf, 1024, COLLD_FLOAT32, COLLD_SUM, comm, NULL);
    char line[1024];
    snprintf(line, sizeof(line), "%d %s %s\n", (int)getpid(), colld_status_name(st), colld_comm_last_error(comm));
    void *more = NULL;
    colld_status_t st2 = colld_mem_alloc(c, &more, 4096, COLLD_MEM_HOST);
    colld_status_t st3 = colld_disconnect(c); /* forgets the copy; the parent's session stays */
    size_t n = strlen(line);
    snprintf(line + n, sizeof(line) - n, "mem_alloc %s disconnect %s\n", colld_status_name(st2),
             colld_status_name(st3));
    touch(file, line);
    for (int i = 0; i < 600; i++)
        usleep(100000);
    _exit(0);
}

/* --hand-socket FILE: a copy of the session socket held by a process that libcolld knows nothing
 * of, so no atfork cleanup closes it there: a dup (without FD_CLOEXEC) inherited by `sleep 60`
 * (posix_spawn), as a socket passed on or leaked into a helper is. Writes the helper's pid to FILE
 * (-1 when it could not be started); the driver kills it. */
static void hand_socket(colld_client_t *c, const char *file)
{
    const char *argv[] = { "/bin/sleep", "60", NULL };
    int fd = dup(c->sock);
    pid_t pid = fd >= 0 ? harness_spawn(argv) : -1;
    if (fd >= 0)
        close(fd);
    char line[32];
    snprintf(line, sizeof(line), "%d\n", (int)pid);
    touch(file, line);
}

/* Post one all-reduce (unless --no-post) and wait: for the expected failure, or, as a silent
 * member, until the communicator or the daemon is gone. */
static int mode_hang(colld_client_t *c, colld_comm_t *comm, const args_t *a)
{
    float *buf;
    colld_status_t st;
    for (int i = 0; i < a->warmup; i++)
        if (run_one(c, comm, a, 1000, 1) != 0)
            return 1;
    if ((st = colld_mem_alloc(c, (void **)&buf, 4096, COLLD_MEM_HOST)) != COLLD_OK)
        return fail("mem_alloc", st, comm);
    if (!a->skip_post && (st = colld_allreduce(buf, buf, 1024, COLLD_FLOAT32, COLLD_SUM, comm, NULL)) != COLLD_OK)
        return fail("allreduce", st, comm);
    if (a->fork_file)
        fork_child(c, comm, buf, a->fork_file);
    if (a->hand_file)
        hand_socket(c, a->hand_file);
    signal_ready(a);
    if (a->skip_post)
        return a->abort_after_ms ? abort_later(c, comm, a) : watchdog(comm, a);
    double t0 = harness_now_ms();
    st = colld_comm_synchronize(comm);
    double waited = harness_now_ms() - t0;
    if (a->expect && strcmp(a->expect, colld_status_name(st)) == 0) {
        printf("rank %d: %s\n", a->rank, colld_comm_last_error(comm));
        printf("rank %d: failed after %.1f ms\n", a->rank, waited);
        fflush(stdout);
        return check_fails_fast(c, comm, st);
    }
    return fail("expected another status", st, comm);
}

int main(int argc, char **argv)
{
    args_t a = { .mode = "allreduce", .nranks = 1, .iters = 1, .inplace = true, .outofplace = true, .counts = "1000" };
    const harness_opt_t opts[] = {
        HARNESS_STR("socket", &a.socket),
        HARNESS_STR("uid", &a.uid_hex),
        HARNESS_STR("mode", &a.mode),
        HARNESS_STR("expect", &a.expect),
        HARNESS_STR("ready-file", &a.ready_file),
        HARNESS_STR("counts", &a.counts),
        HARNESS_INT("nranks", &a.nranks),
        HARNESS_INT("rank", &a.rank),
        HARNESS_INT("iters", &a.iters),
        HARNESS_INT("timeout-ms", &a.timeout_ms),
        HARNESS_STR("name", &a.name),
        HARNESS_STR("done-file", &a.done_file),
        HARNESS_STR("stop-file", &a.stop_file),
        HARNESS_STR("progress-file", &a.progress_file),
        HARNESS_INT("straggle-ms", &a.straggle_ms),
        HARNESS_INT("warmup", &a.warmup),
        HARNESS_INT("abort-after-ms", &a.abort_after_ms),
        HARNESS_ONLY(&a.inplace, &a.outofplace),
        HARNESS_STR("fork-child", &a.fork_file),
        HARNESS_STR("hand-socket", &a.hand_file),
        HARNESS_SET("no-post", &a.skip_post),
        HARNESS_SET("malloc", &a.use_malloc),
        HARNESS_OUT,
    };
    if (HARNESS_PARSE_OPTS("rank", argc, argv, opts) != 0)
        return 2;
    if (strcmp(a.mode, "attach") == 0)
        return mode_attach(&a);

    colld_client_t *c;
    colld_comm_t *comm = NULL;
    colld_status_t st = colld_connect(a.socket, &c);
    if (st != COLLD_OK)
        return fail("connect", st, NULL);
    colld_unique_id_t id;
    if (harness_uid_from_hex(a.uid_hex, &id) < 0) {
        fprintf(stderr, "rank: bad --uid\n");
        return 2;
    }
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = a.timeout_ms;
    cfg.name = a.name ? a.name : "test";
    st = colld_comm_init_rank(c, &comm, a.nranks, id, a.rank, &cfg);
    if (st != COLLD_OK) {
        int expected = a.expect && strcmp(a.expect, colld_status_name(st)) == 0;
        if (!expected)
            fail("comm_init_rank", st, NULL);
        colld_disconnect(c);
        return expected ? 0 : 1;
    }
    int rc = 0;
    if (strcmp(a.mode, "hang") == 0) {
        rc = mode_hang(c, comm, &a);
        goto out;
    }
    signal_ready(&a);
    for (int it = 0; rc == 0; it++) {
        int stop = a.iters ? it >= a.iters : stop_agreed(c, comm, &a);
        if (stop) {
            rc = stop < 0;
            break;
        }
        char *list = strdup(a.counts), *save = NULL;
        for (char *tok = strtok_r(list, ",", &save); tok && rc == 0; tok = strtok_r(NULL, ",", &save)) {
            size_t count = strtoull(tok, NULL, 10);
            if (a.outofplace)
                rc |= run_one(c, comm, &a, count, 0);
            if (a.inplace && rc == 0)
                rc |= run_one(c, comm, &a, count, 1);
        }
        free(list);
        if (a.progress_file) {
            char n[32];
            snprintf(n, sizeof(n), "%d\n", it + 1);
            touch(a.progress_file, n);
        }
    }
out:
    touch(a.done_file, "");
    wait_stop(&a);
    colld_comm_destroy(comm);
    colld_disconnect(c);
    return rc;
}
