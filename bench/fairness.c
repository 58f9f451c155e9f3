/*
 * fairness.c - colld-fairness, the two sides of bench/fairness.sh (issue 26 row 5): a tenant's
 * small all-reduces beside another tenant's large ones.
 *
 *   colld-fairness --socket PATH --victim BYTES --seconds S   2 ranks, BYTES all-reduces back to
 *       back for S seconds; prints one JSON line: calls, rate, p50/p99/p999/max latency (us)
 *   colld-fairness --socket PATH --hog BYTES --seconds S      2 ranks, in-place BYTES all-reduces
 *       (int32 max) back to back for S seconds; prints one JSON line: calls, GB/s of algorithm bandwidth
 *
 * Both ranks are connections of this one process (each rank posts, then both are waited for), so
 * a latency is one collective's from the first post to the last completion. Results are checked
 * (the victim's every call, the hog's at the end).
 */
#include <colld/colld.h>

#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

typedef struct {
    colld_client_t *client;
    colld_comm_t *comm;
    colld_unique_id_t id;
    int rank;
    colld_status_t st;
} rank_t;

static void *join_main(void *arg)
{
    rank_t *r = arg;
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = 300000;
    r->st = colld_comm_init_rank(r->client, &r->comm, 2, r->id, r->rank, &cfg);
    return NULL;
}

static int fail(const char *what, colld_status_t st, const char *detail)
{
    fprintf(stderr, "colld-fairness: %s: %s: %s\n", what, colld_status_name(st), detail ? detail : "");
    return 1;
}

static int join_two(const char *socket, rank_t r[2])
{
    colld_unique_id_t id;
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (rank_t){ .rank = i };
        colld_status_t st = colld_connect(socket, &r[i].client);
        if (st == COLLD_OK && i == 0)
            st = colld_get_unique_id(r[0].client, &id);
        if (st != COLLD_OK)
            return fail("connect", st, colld_last_error(r[i].client));
    }
    for (int i = 0; i < 2; i++) {
        r[i].id = id;
        pthread_create(&t[i], NULL, join_main, &r[i]);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++)
        if (r[i].st != COLLD_OK)
            return fail("join", r[i].st, colld_last_error(r[i].client));
    return 0;
}

/* One all-reduce on both ranks, waited for. */
static colld_status_t allreduce_two(rank_t r[2], void *buf[2], size_t count, colld_dtype_t dt, colld_redop_t op)
{
    colld_status_t st = COLLD_OK;
    for (int i = 0; i < 2 && st == COLLD_OK; i++)
        st = colld_allreduce(buf[i], buf[i], count, dt, op, r[i].comm, NULL);
    for (int i = 0; i < 2 && st == COLLD_OK; i++)
        st = colld_comm_synchronize(r[i].comm);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int victim(rank_t r[2], size_t bytes, double seconds)
{
    size_t count = bytes / sizeof(float), cap = 4u << 20, n = 0;
    float *buf[2];
    double *lat = malloc(cap * sizeof(double));
    for (int i = 0; i < 2; i++)
        if (colld_mem_alloc(r[i].client, (void **)&buf[i], bytes, COLLD_MEM_HOST) != COLLD_OK)
            return fail("colld_mem_alloc", COLLD_ERR_NO_MEMORY, colld_last_error(r[i].client));
    double end = now_us() + seconds * 1e6, t0 = now_us();
    for (long it = -200; n < cap && (it < 0 || now_us() < end); it++) { /* 200 untimed first */
        for (int i = 0; i < 2; i++)
            for (size_t e = 0; e < count; e++)
                buf[i][e] = (float)((e + (size_t)i + (size_t)(it & 7)) % 13);
        double t = now_us();
        colld_status_t st = allreduce_two(r, (void **)buf, count, COLLD_FLOAT32, COLLD_SUM);
        double us = now_us() - t;
        if (st != COLLD_OK)
            return fail("victim all-reduce", st, colld_comm_last_error(r[0].comm));
        for (int i = 0; i < 2; i++)
            for (size_t e = 0; e < count; e += 61)
                if (buf[i][e] != (float)((e + (size_t)(it & 7)) % 13 + (e + 1 + (size_t)(it & 7)) % 13))
                    return fail("victim all-reduce", COLLD_ERR_INTERNAL, "wrong result");
        if (it == -1)
            t0 = now_us();
        if (it >= 0)
            lat[n++] = us;
    }
    double took = now_us() - t0;
    if (n == 0)
        return fail("victim", COLLD_ERR_TIMEOUT, "not one all-reduce completed in the time given");
    qsort(lat, n, sizeof(double), cmp_double);
    printf("{\"bytes\":%zu,\"calls\":%zu,\"rate\":%.0f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,"
           "\"max_us\":%.1f}\n",
           bytes, n, (double)n * 1e6 / took, lat[n / 2], lat[n * 99 / 100], lat[n * 999 / 1000], lat[n - 1]);
    free(lat);
    return 0;
}

static int hog(rank_t r[2], size_t bytes, double seconds)
{
    size_t count = bytes / sizeof(int32_t);
    int32_t *buf[2];
    for (int i = 0; i < 2; i++) {
        if (colld_mem_alloc(r[i].client, (void **)&buf[i], bytes, COLLD_MEM_HOST) != COLLD_OK)
            return fail("colld_mem_alloc", COLLD_ERR_NO_MEMORY, colld_last_error(r[i].client));
        for (size_t e = 0; e < count; e++)
            buf[i][e] = i;
    }
    double t0 = now_us(), end = t0 + seconds * 1e6;
    long calls = 0;
    while (calls == 0 || now_us() < end) {
        colld_status_t st = allreduce_two(r, (void **)buf, count, COLLD_INT32, COLLD_MAX);
        if (st != COLLD_OK)
            return fail("hog all-reduce", st, colld_comm_last_error(r[0].comm));
        calls++;
    }
    double took = now_us() - t0;
    for (int i = 0; i < 2; i++) /* max(0, 1) */
        if (buf[i][0] != 1 || buf[i][count - 1] != 1)
            return fail("hog all-reduce", COLLD_ERR_INTERNAL, "wrong result");
    printf("{\"bytes\":%zu,\"calls\":%ld,\"algbw_gbs\":%.2f}\n", bytes, calls,
           (double)bytes * (double)calls / took / 1e3);
    return 0;
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K':
    case 'k':
        v *= 1024;
        break;
    case 'M':
    case 'm':
        v *= 1024 * 1024;
        break;
    case 'G':
    case 'g':
        v *= 1024.0 * 1024 * 1024;
        break;
    }
    return (size_t)v;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = { { "socket", required_argument, NULL, 's' },
                                          { "victim", required_argument, NULL, 'v' },
                                          { "hog", required_argument, NULL, 'g' },
                                          { "seconds", required_argument, NULL, 't' },
                                          { NULL, 0, NULL, 0 } };
    const char *socket = NULL;
    size_t victim_bytes = 0, hog_bytes = 0;
    double seconds = 3;
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 's':
            socket = optarg;
            break;
        case 'v':
            victim_bytes = parse_size(optarg);
            break;
        case 'g':
            hog_bytes = parse_size(optarg);
            break;
        case 't':
            seconds = atof(optarg);
            break;
        default:
            return 2;
        }
    }
    if (!socket || !victim_bytes == !hog_bytes || seconds <= 0 || (victim_bytes | hog_bytes) < 4) {
        fprintf(stderr, "usage: colld-fairness --socket PATH (--victim BYTES | --hog BYTES) [--seconds S]\n");
        return 2;
    }
    rank_t r[2];
    if (join_two(socket, r) != 0)
        return 1;
    int rc = victim_bytes ? victim(r, victim_bytes, seconds) : hog(r, hog_bytes, seconds);
    for (int i = 0; i < 2; i++) {
        colld_comm_destroy(r[i].comm);
        colld_disconnect(r[i].client);
    }
    return rc;
}
