/*
 * colld_perf_attach.c - one rank of colld-perf's attach + join benchmark.
 *
 * --attach-bench REPS: each rank process connects (attach) and joins a new NRANKS communicator
 * REPS+1 times; the first repetition is cold (process start, library initialisation), the others
 * start together after a barrier of the previous communicator. Prints per-rank p50/min/max of
 * connect, join and connect+join.
 */
#include "colld_perf.h"

#include <colld/colld.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Rank 0's report of the attach benchmark: samples[rank][rep][0=connect, 1=join] in us. */
static void print_attach(const opts_t *o, const double *samples, int reps)
{
    int n = o->nranks;
    double *v = malloc((size_t)reps * sizeof(*v));
    double worst_p50 = 0, worst_cold = 0, all_p50 = 0;
    double *all = malloc((size_t)n * (size_t)reps * sizeof(*all));
    if (!v || !all) {
        free(v);
        free(all);
        fprintf(stderr, PROG ": out of memory\n");
        return;
    }
    int nall = 0;
    if (o->json)
        printf("{\"schema_version\":1,\"attach_bench\":{\"nranks\":%d,\"reps\":%d,\"ranks\":[", n, reps - 1);
    else
        printf("# colld-perf attach+join: %d ranks (processes), %d warm repetitions after 1 cold one\n"
               "# connect = colld_connect, join = colld_comm_init_rank; times in us, per process\n"
               "# %4s  %12s  %12s  %12s  %12s  %12s  %14s\n",
               n, reps - 1, "rank", "connect p50", "join p50", "total p50", "total min", "total max", "cold (1st)");
    for (int r = 0; r < n; r++) {
        const double *s = samples + (size_t)r * (size_t)reps * 2;
        double p[3], mn = 1e30, mx = 0;
        for (int k = 0; k < 3; k++) {
            for (int i = 1; i < reps; i++)
                v[i - 1] = k == 2 ? s[2 * i] + s[2 * i + 1] : s[2 * i + k];
            if (k == 2)
                for (int i = 0; i < reps - 1; i++) {
                    mn = v[i] < mn ? v[i] : mn;
                    mx = v[i] > mx ? v[i] : mx;
                    all[nall++] = v[i];
                }
            p[k] = perf_median(v, reps - 1);
        }
        double cold = s[0] + s[1];
        worst_p50 = p[2] > worst_p50 ? p[2] : worst_p50;
        worst_cold = cold > worst_cold ? cold : worst_cold;
        if (o->json)
            printf("%s{\"rank\":%d,\"connect_p50_us\":%.1f,\"join_p50_us\":%.1f,\"total_p50_us\":%.1f,"
                   "\"total_min_us\":%.1f,\"total_max_us\":%.1f,\"cold_us\":%.1f}",
                   r ? "," : "", r, p[0], p[1], p[2], mn, mx, cold);
        else
            printf("  %4d  %12.1f  %12.1f  %12.1f  %12.1f  %12.1f  %14.1f\n", r, p[0], p[1], p[2], mn, mx, cold);
    }
    all_p50 = perf_median(all, nall);
    if (o->json)
        printf("],\"p50_us_worst_rank\":%.1f,\"p50_us_all\":%.1f,\"cold_us_worst_rank\":%.1f}}\n", worst_p50,
               all_p50, worst_cold);
    else
        printf("# attach+join p50: %.1f us (worst rank), %.1f us (all samples); cold: %.1f us (worst rank)\n",
               worst_p50, all_p50, worst_cold);
    fflush(stdout);
    free(v);
    free(all);
}

/* A rank of --attach-bench: REPS+1 times connect and join a new communicator (ids from the
 * launcher), a barrier on it so that the next repetition starts together, then destroy and
 * disconnect. The last communicator gathers every rank's samples to rank 0. */
int perf_attach_main(const opts_t *o)
{
    int reps = o->attach_reps + 1, n = o->nranks, rank = o->rank, rc = 1;
    size_t nsamples = (size_t)n * (size_t)reps * 2;
    colld_unique_id_t *ids = malloc((size_t)reps * sizeof(*ids));
    double *samples = calloc(nsamples, sizeof(*samples));
    if (!ids || !samples) {
        fprintf(stderr, PROG ": rank %d: out of memory\n", rank);
        goto out;
    }
    if (perf_read_full(ID_FD, ids, (size_t)reps * sizeof(*ids), ID_READ_TIMEOUT_MS) < 0) {
        fprintf(stderr, PROG ": rank %d: did not receive the unique ids from the launcher\n", rank);
        goto out;
    }
    close(ID_FD);
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.name = "colld-perf-attach";
    cfg.timeout_ms = o->timeout_ms;
    for (int k = 0; k < reps; k++) {
        colld_client_t *c;
        colld_comm_t *comm;
        double t0 = now_us();
        colld_status_t st = colld_connect(o->socket, &c);
        if (st != COLLD_OK) {
            fprintf(stderr, PROG ": rank %d: connect: %s\n", rank, colld_status_name(st));
            goto out;
        }
        double t1 = now_us();
        if ((st = colld_comm_init_rank(c, &comm, n, ids[k], rank, &cfg)) != COLLD_OK) {
            fprintf(stderr, PROG ": rank %d: join: %s\n", rank, colld_status_name(st));
            colld_disconnect(c);
            goto out;
        }
        double t2 = now_us();
        double *mine = samples + ((size_t)rank * (size_t)reps + (size_t)k) * 2;
        mine[0] = t1 - t0;
        mine[1] = t2 - t1;
        int32_t one = 1;
        if (k == reps - 1) /* the last one also gathers everything (ordinary memory: staged) */
            st = colld_allreduce(samples, samples, nsamples, COLLD_FLOAT64, COLLD_SUM, comm, NULL);
        else
            st = colld_allreduce(&one, &one, 1, COLLD_INT32, COLLD_SUM, comm, NULL);
        if (st == COLLD_OK)
            st = colld_comm_synchronize(comm);
        if (st != COLLD_OK)
            fprintf(stderr, PROG ": rank %d: barrier: %s: %s\n", rank, colld_status_name(st),
                    colld_comm_last_error(comm));
        colld_comm_destroy(comm);
        colld_disconnect(c);
        if (st != COLLD_OK)
            goto out;
    }
    if (rank == 0)
        print_attach(o, samples, reps);
    rc = 0;
out:
    free(ids);
    free(samples);
    return rc;
}
