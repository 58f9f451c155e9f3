/*
 * colld_demo.c - colld-demo: N client processes all-reduce over a range of sizes through a
 * running colld and print a table (size, time, algbw, busbw, results correct).
 *
 *   colld-demo [--socket PATH] [--nranks 4] [--min-bytes 8] [--max-bytes 64M] [--iters 20]
 *
 * The first process gets a unique id and spawns the ranks (itself re-executed with --rank R);
 * every rank checks every element of every result; rank 0 prints the table when all sizes are
 * done. Exit code 0 when every result was exact.
 */
#include <colld/colld.h>

#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

typedef struct {
    const char *socket;
    int nranks, rank, iters, warmup, use_malloc;
    size_t min_bytes, max_bytes;
    char uid_hex[2 * sizeof(((colld_unique_id_t *)0)->internal) + 1];
} demo_t;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

static float value(int r, size_t i)
{
    return (float)((int)((i * 7 + (size_t)r * 13) % 61) - 30);
}

/* One rank: join, run every size, check, and (rank 0) print the table. */
static int run_rank(const demo_t *d)
{
    colld_client_t *c;
    colld_comm_t *comm;
    colld_unique_id_t id;
    memset(&id, 0, sizeof(id));
    for (size_t i = 0; i < sizeof(id.internal) && d->uid_hex[2 * i]; i++) {
        unsigned v = 0;
        sscanf(d->uid_hex + 2 * i, "%2x", &v);
        id.internal[i] = (char)v;
    }
    colld_status_t st = colld_connect(d->socket, &c);
    if (st != COLLD_OK) {
        fprintf(stderr, "colld-demo: rank %d: connect: %s\n", d->rank, colld_status_string(st));
        return 1;
    }
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.name = "demo";
    if ((st = colld_comm_init_rank(c, &comm, d->nranks, id, d->rank, &cfg)) != COLLD_OK) {
        fprintf(stderr, "colld-demo: rank %d: join: %s\n", d->rank, colld_status_name(st));
        return 1;
    }
    float *send, *recv;
    if (d->use_malloc) { /* ordinary memory: libcolld stages it */
        send = malloc(d->max_bytes);
        recv = malloc(d->max_bytes);
        if (!send || !recv) {
            fprintf(stderr, "colld-demo: rank %d: cannot allocate %zu bytes\n", d->rank, d->max_bytes);
            return 1;
        }
    } else if (colld_mem_alloc(c, (void **)&send, d->max_bytes, COLLD_MEM_HOST) != COLLD_OK ||
               colld_mem_alloc(c, (void **)&recv, d->max_bytes, COLLD_MEM_HOST) != COLLD_OK) {
        fprintf(stderr, "colld-demo: rank %d: cannot allocate %zu bytes\n", d->rank, d->max_bytes);
        return 1;
    }
    char table[16384];
    int off = snprintf(table, sizeof(table), "%12s %12s %12s %12s %12s %8s\n", "size(B)", "count", "time(us)",
                       "algbw(GB/s)", "busbw(GB/s)", "correct");
    int all_ok = 1;
    for (size_t bytes = d->min_bytes; bytes <= d->max_bytes; bytes *= 2) {
        size_t count = bytes / sizeof(float);
        for (size_t i = 0; i < count; i++)
            send[i] = value(d->rank, i);
        double t0 = 0;
        for (int it = 0; it < d->warmup + d->iters; it++) {
            if (it == d->warmup)
                t0 = now_us();
            st = colld_allreduce(send, recv, count, COLLD_FLOAT32, COLLD_SUM, comm, NULL);
            if (st == COLLD_OK)
                st = colld_comm_synchronize(comm);
            if (st != COLLD_OK) {
                fprintf(stderr, "colld-demo: rank %d: allreduce: %s\n", d->rank, colld_comm_last_error(comm));
                return 1;
            }
        }
        double us = (now_us() - t0) / d->iters;
        size_t wrong = 0;
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < d->nranks; r++)
                want += value(r, i);
            wrong += recv[i] != want;
        }
        all_ok &= wrong == 0;
        double algbw = (double)bytes / us / 1e3;
        double busbw = algbw * 2.0 * (d->nranks - 1) / d->nranks;
        if (off < (int)sizeof(table) - 100)
            off += snprintf(table + off, sizeof(table) - (size_t)off, "%12zu %12zu %12.1f %12.2f %12.2f %8s\n",
                            bytes, count, us, algbw, busbw, wrong ? "NO" : "yes");
    }
    if (d->rank == 0)
        printf("colld-demo: all-reduce float32 sum, %d ranks (processes), %d iterations per size, %s buffers\n%s",
               d->nranks, d->iters, d->use_malloc ? "malloc (staged)" : "colld_mem_alloc (zero-copy)", table);
    if (d->use_malloc) {
        free(send);
        free(recv);
    } else {
        colld_mem_free(c, send);
        colld_mem_free(c, recv);
    }
    colld_comm_destroy(comm);
    colld_disconnect(c);
    return all_ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    demo_t d = { .nranks = 4, .rank = -1, .iters = 20, .warmup = 3, .min_bytes = 8, .max_bytes = 64u << 20 };
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--socket") && ++i)
            d.socket = v;
        else if (!strcmp(argv[i], "--nranks") && ++i)
            d.nranks = atoi(v);
        else if (!strcmp(argv[i], "--rank") && ++i)
            d.rank = atoi(v);
        else if (!strcmp(argv[i], "--iters") && ++i)
            d.iters = atoi(v);
        else if (!strcmp(argv[i], "--min-bytes") && ++i)
            d.min_bytes = parse_size(v);
        else if (!strcmp(argv[i], "--max-bytes") && ++i)
            d.max_bytes = parse_size(v);
        else if (!strcmp(argv[i], "--malloc"))
            d.use_malloc = 1;
        else if (!strcmp(argv[i], "--uid") && ++i)
            snprintf(d.uid_hex, sizeof(d.uid_hex), "%s", v);
        else {
            fprintf(stderr, "usage: colld-demo [--socket PATH] [--nranks N] [--min-bytes B] [--max-bytes B] "
                            "[--iters N] [--malloc]\n");
            return 2;
        }
    }
    if (d.nranks < 1 || d.nranks > 64 || d.iters < 1 || d.min_bytes < 4 || d.max_bytes < d.min_bytes) {
        fprintf(stderr, "colld-demo: bad arguments\n");
        return 2;
    }
    if (d.rank >= 0)
        return run_rank(&d);

    /* The launcher: a unique id from the daemon, then one process per rank. */
    colld_client_t *c;
    colld_unique_id_t id;
    colld_status_t st = colld_connect(d.socket, &c);
    if (st != COLLD_OK) {
        fprintf(stderr, "colld-demo: %s: %s\n", colld_status_name(st), colld_status_string(st));
        return 1;
    }
    if ((st = colld_get_unique_id(c, &id)) != COLLD_OK) {
        fprintf(stderr, "colld-demo: unique id: %s\n", colld_status_name(st));
        return 1;
    }
    char hex[2 * sizeof(id.internal) + 1], nr[16], rk[16], it[16], mn[32], mx[32];
    for (size_t i = 0; i < sizeof(id.internal); i++)
        sprintf(hex + 2 * i, "%02x", (unsigned char)id.internal[i]);
    snprintf(nr, sizeof(nr), "%d", d.nranks);
    snprintf(it, sizeof(it), "%d", d.iters);
    snprintf(mn, sizeof(mn), "%zu", d.min_bytes);
    snprintf(mx, sizeof(mx), "%zu", d.max_bytes);
    pid_t pids[64];
    int bad = 0;
    for (int r = 0; r < d.nranks; r++) {
        snprintf(rk, sizeof(rk), "%d", r);
        char *args[20] = { "colld-demo", "--uid", hex, "--nranks", nr, "--rank", rk, "--iters", it, "--min-bytes", mn,
                           "--max-bytes", mx };
        int na = 13;
        if (d.use_malloc)
            args[na++] = "--malloc";
        if (d.socket) {
            args[na++] = "--socket";
            args[na++] = (char *)d.socket;
        }
        args[na] = NULL;
        if (posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, args, environ) != 0) {
            fprintf(stderr, "colld-demo: cannot start rank %d\n", r);
            pids[r] = -1;
            bad++;
        }
    }
    for (int r = 0; r < d.nranks; r++) {
        int status;
        if (pids[r] > 0 && (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)))
            bad++;
    }
    colld_disconnect(c);
    if (bad)
        fprintf(stderr, "colld-demo: %d rank(s) failed\n", bad);
    return bad ? 1 : 0;
}
