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
 * --mode hang (join, then post one all-reduce only if --post is given, and wait forever).
 */
#include "tests/integration/harness.h"

#include <colld/colld.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *socket, *uid_hex, *mode, *expect, *ready_file, *counts;
    int nranks, rank, iters, timeout_ms, skip_post, use_malloc;
    int inplace, outofplace;
} args_t;

static int fail(const char *what, colld_status_t st, colld_comm_t *comm)
{
    fprintf(stderr, "rank: %s: %s (%s)\n", what, colld_status_name(st), comm ? colld_comm_last_error(comm) : "");
    return 1;
}

/* Value of element i on rank r: small integers, so float sums are exact in any order. */
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
static int run_one(colld_client_t *c, colld_comm_t *comm, const args_t *a, size_t count, int inplace)
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

/* Tell the driver we reached the point it waits for. */
static void signal_ready(const args_t *a)
{
    if (!a->ready_file)
        return;
    FILE *f = fopen(a->ready_file, "w");
    if (f)
        fclose(f);
}

/* Post one all-reduce (unless --no-post) and wait: for the expected failure, or, as a silent
 * member, until the communicator or the daemon is gone. */
static int mode_hang(colld_client_t *c, colld_comm_t *comm, const args_t *a)
{
    float *buf;
    colld_status_t st;
    if ((st = colld_mem_alloc(c, (void **)&buf, 4096, COLLD_MEM_HOST)) != COLLD_OK)
        return fail("mem_alloc", st, comm);
    if (!a->skip_post && (st = colld_allreduce(buf, buf, 1024, COLLD_FLOAT32, COLLD_SUM, comm, NULL)) != COLLD_OK)
        return fail("allreduce", st, comm);
    signal_ready(a);
    if (a->skip_post) {
        while (colld_comm_query(comm) == COLLD_OK)
            usleep(10000);
        return 0;
    }
    st = colld_comm_synchronize(comm);
    if (a->expect && strcmp(a->expect, colld_status_name(st)) == 0) {
        printf("rank %d: %s\n", a->rank, colld_comm_last_error(comm));
        fflush(stdout);
        return 0;
    }
    return fail("expected another status", st, comm);
}

int main(int argc, char **argv)
{
    args_t a = { .mode = "allreduce", .nranks = 1, .iters = 1, .inplace = 1, .outofplace = 1, .counts = "1000" };
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
#define ARG(name) (strcmp(argv[i], name) == 0 && ++i)
        if (ARG("--socket"))
            a.socket = v;
        else if (ARG("--uid"))
            a.uid_hex = v;
        else if (ARG("--mode"))
            a.mode = v;
        else if (ARG("--expect"))
            a.expect = v;
        else if (ARG("--ready-file"))
            a.ready_file = v;
        else if (ARG("--out")) {
            if (!freopen(v, "w", stdout))
                return 2;
        } else if (ARG("--counts"))
            a.counts = v;
        else if (ARG("--nranks"))
            a.nranks = atoi(v);
        else if (ARG("--rank"))
            a.rank = atoi(v);
        else if (ARG("--iters"))
            a.iters = atoi(v);
        else if (ARG("--timeout-ms"))
            a.timeout_ms = atoi(v);
        else if (ARG("--only"))
            a.inplace = strcmp(v, "inplace") == 0, a.outofplace = !a.inplace;
        else if (strcmp(argv[i], "--no-post") == 0)
            a.skip_post = 1;
        else if (strcmp(argv[i], "--malloc") == 0)
            a.use_malloc = 1;
        else {
            fprintf(stderr, "rank: unknown argument %s\n", argv[i]);
            return 2;
        }
#undef ARG
    }
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
    cfg.name = "test";
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
    for (int it = 0; it < a.iters && rc == 0; it++) {
        char *list = strdup(a.counts), *save = NULL;
        for (char *tok = strtok_r(list, ",", &save); tok && rc == 0; tok = strtok_r(NULL, ",", &save)) {
            size_t count = strtoull(tok, NULL, 10);
            if (a.outofplace)
                rc |= run_one(c, comm, &a, count, 0);
            if (a.inplace && rc == 0)
                rc |= run_one(c, comm, &a, count, 1);
        }
        free(list);
    }
out:
    colld_comm_destroy(comm);
    colld_disconnect(c);
    return rc;
}
