/*
 * colld_perf_util.c - small utilities that several parts of colld-perf use: the clock (now_us), a
 * read with a deadline (how a rank process reads its unique id(s) from the launcher's pipe) and
 * the median of samples.
 */
#include "colld_perf.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Read exactly len bytes from fd, waiting at most timeout_ms in all. Returns 0 or -1. */
int perf_read_full(int fd, void *buf, size_t len, int timeout_ms)
{
    double end = now_us() + timeout_ms * 1e3;
    size_t got = 0;
    while (got < len) {
        int left = (int)((end - now_us()) / 1e3);
        if (left <= 0)
            return -1;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorts v). */
double perf_median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
