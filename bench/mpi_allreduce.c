/*
 * mpi_allreduce.c - the OpenMPI baseline of bench/compare.sh: MPI_Allreduce (float sum) timed the
 * way colld-perf times colld, printed in the same columns.
 *
 *   mpirun -np N mpi_allreduce [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]
 *
 * For each size: WARMUP calls, MPI_Barrier, ITERS calls timed by every rank, the time per call
 * being the maximum over ranks (MPI_Allreduce MAX), as colld-perf and nccl-tests report it;
 * out of place, then in place (MPI_IN_PLACE). MPI_Allreduce is blocking, so this matches
 * colld-perf -z 1. With -c 1 the inputs are small integers (exact in float whatever the order of
 * the sum) and every element of one more call is checked.
 *
 * Build: mpicc -O2 mpi_allreduce.c -o mpi_allreduce. Exit status 0, 1 wrong results, 2 bad options.
 */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A size with an optional K/M/G suffix; -1 when malformed. */
static long long parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s)
        return -1;
    if (*end == 'K' || *end == 'k')
        v *= 1024.0, end++;
    else if (*end == 'M' || *end == 'm')
        v *= 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        v *= 1024.0 * 1024 * 1024, end++;
    return *end || v < 0 ? -1 : (long long)v;
}

/* Rank r's input element i: small integers, so every sum order gives the same float. */
static float value(int r, size_t i, int salt)
{
    return (float)((int)((i * 7 + (size_t)r * 13 + (size_t)salt * 5) % 61) - 30);
}

/* nccl-tests' time format. */
static void fmt_time(double us, char *buf, size_t len)
{
    snprintf(buf, len, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long long minb = 8, maxb = 32ll << 20;
    double factor = 2;
    int iters = 20, warmup = 5, check = 1;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (ok && !strcmp(argv[i], "-b"))
            ok = (minb = parse_size(v)) >= 0;
        else if (ok && !strcmp(argv[i], "-e"))
            ok = (maxb = parse_size(v)) >= 0;
        else if (ok && !strcmp(argv[i], "-f"))
            ok = (factor = atof(v)) > 1;
        else if (ok && !strcmp(argv[i], "-n"))
            ok = (iters = atoi(v)) >= 1;
        else if (ok && !strcmp(argv[i], "-w"))
            ok = (warmup = atoi(v)) >= 0;
        else if (ok && !strcmp(argv[i], "-c"))
            check = atoi(v) > 0;
        else
            ok = 0;
        if (!ok || minb > maxb) {
            if (rank == 0)
                fprintf(stderr, "usage: mpi_allreduce [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] "
                                "[-w WARMUP] [-c 0|1] (bad or missing value at '%s')\n", argv[i]);
            MPI_Finalize();
            return 2;
        }
        i++;
    }
    size_t maxcount = (size_t)maxb / sizeof(float);
    float *send = malloc((maxcount ? maxcount : 1) * sizeof(float));
    float *recv = malloc((maxcount ? maxcount : 1) * sizeof(float));
    if (!send || !recv) {
        fprintf(stderr, "mpi_allreduce: rank %d: cannot allocate 2 x %lld bytes\n", rank, maxb);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(send, 0, maxcount * sizeof(float)); /* touch every page before timing */
    memset(recv, 0, maxcount * sizeof(float));
    if (rank == 0) {
        printf("# mpi_allreduce: nranks %d (processes)  minBytes %lld maxBytes %lld step: %g(factor) warmup iters: %d "
               "iters: %d validation: %d blocking: 1\n#\n# Collective test: allreduce (MPI_Allreduce)\n#\n",
               n, minb, maxb, factor, warmup, iters, check);
        printf("#%51s%-10s%-23s%-12s%-21s\n", "", "", "out-of-place", "", "in-place");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type",
               "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "",
               "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    }
    double bw_sum = 0;
    long bw_count = 0, oob = 0;
    int salt = 0;
    for (long long b = minb; b <= maxb;) {
        size_t count = (size_t)b / sizeof(float), size = count * sizeof(float);
        double us[2];
        long wrong[2] = { 0, 0 };
        for (int ip = 0; ip < 2; ip++) {
            for (size_t i = 0; i < count; i++)
                (ip ? recv : send)[i] = value(rank, i, 0);
            const void *sb = ip ? MPI_IN_PLACE : send;
            for (int i = 0; i < warmup; i++)
                MPI_Allreduce(sb, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++)
                MPI_Allreduce(sb, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double t = (MPI_Wtime() - t0) / iters * 1e6;
            MPI_Allreduce(&t, &us[ip], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (!check)
                continue;
            salt++;
            for (size_t i = 0; i < count; i++) {
                (ip ? recv : send)[i] = value(rank, i, salt);
                if (!ip)
                    recv[i] = -12345.0f;
            }
            MPI_Allreduce(sb, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            long w = 0;
            for (size_t i = 0; i < count; i++) {
                float want = 0;
                for (int r = 0; r < n; r++)
                    want += value(r, i, salt);
                w += recv[i] != want;
            }
            MPI_Allreduce(&w, &wrong[ip], 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        }
        if (rank == 0) {
            printf("  %10zu  %12zu  %8s  %6s  %6d", size, count, "float", "sum", -1);
            for (int ip = 0; ip < 2; ip++) {
                char t[32], w[32];
                double algbw = us[ip] > 0 ? (double)size / us[ip] / 1e3 : 0;
                double busbw = algbw * 2.0 * (n - 1) / n;
                bw_sum += busbw;
                bw_count++;
                oob += wrong[ip];
                fmt_time(us[ip], t, sizeof(t));
                if (check)
                    snprintf(w, sizeof(w), "%ld", wrong[ip]);
                else
                    snprintf(w, sizeof(w), "N/A");
                printf("  %7s  %6.2f  %6.2f  %6s", t, algbw, busbw, w);
            }
            printf("\n");
            fflush(stdout);
        }
        long long next = (long long)((double)b * factor);
        b = next > b ? next : b + 1;
    }
    if (rank == 0) {
        if (check)
            printf("# Out of bounds values : %ld %s\n", oob, oob ? "FAILED" : "OK");
        else
            printf("# Out of bounds values : N/A (-c 0)\n");
        printf("# Avg bus bandwidth    : %g \n#\n", bw_count ? bw_sum / (double)bw_count : 0);
    }
    MPI_Bcast(&oob, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    free(send);
    free(recv);
    MPI_Finalize();
    return oob ? 1 : 0;
}
