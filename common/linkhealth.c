/*
 * linkhealth.c - the slow-link rule (linkhealth.h).
 */
#include "common/linkhealth.h"

#include <stdio.h>
#include <stdlib.h>

/* Ascending order of doubles, for qsort. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The value at index j of sorted s (m values) with the element at index k left out. */
static double without(const double *s, size_t k, size_t j)
{
    return s[j >= k ? j + 1 : j];
}

size_t colld_link_outliers(colld_link_rate_t *links, size_t n)
{
    size_t m = 0, nslow = 0;
    for (size_t i = 0; i < n; i++) {
        links[i].slow = false;
        links[i].others_median = links[i].others_min = links[i].others_max = 0;
        m += links[i].rate > 0;
    }
    if (m < COLLD_LINK_MIN_SIBLINGS + 1)
        return 0;
    double *s = malloc(m * sizeof(*s));
    if (!s)
        return 0;
    m = 0;
    for (size_t i = 0; i < n; i++)
        if (links[i].rate > 0)
            s[m++] = links[i].rate;
    qsort(s, m, sizeof(*s), cmp_double);
    for (size_t i = 0; i < n; i++) {
        colld_link_rate_t *l = &links[i];
        if (l->rate <= 0)
            continue;
        size_t k = 0; /* the first of the equal values: leaving out any of them gives the same rest */
        while (s[k] < l->rate)
            k++;
        size_t o = m - 1; /* the other links */
        l->others_median = o % 2 ? without(s, k, o / 2) : (without(s, k, o / 2 - 1) + without(s, k, o / 2)) / 2;
        l->others_min = without(s, k, 0);
        l->others_max = without(s, k, o - 1);
        l->slow = l->rate < l->others_median / COLLD_LINK_SLOW_RATIO;
        nslow += l->slow;
    }
    free(s);
    return nslow;
}

void colld_link_rate_text(char *buf, size_t len, double rate)
{
    double mb = rate / 1e6;
    if (rate <= 0)
        snprintf(buf, len, "-");
    else if (mb >= 10)
        snprintf(buf, len, "%.0f MB/s", mb);
    else if (mb >= 1)
        snprintf(buf, len, "%.1f MB/s", mb);
    else
        snprintf(buf, len, "%.2f MB/s", mb);
}

void colld_link_describe(char *buf, size_t len, const char *from, const char *to, const colld_link_rate_t *l)
{
    char r[32], lo[32], hi[32];
    colld_link_rate_text(r, sizeof(r), l->rate);
    colld_link_rate_text(lo, sizeof(lo), l->others_min);
    colld_link_rate_text(hi, sizeof(hi), l->others_max);
    if (l->others_max / 1e6 >= 10 && l->others_min / 1e6 >= 10) /* "110–118 MB/s" */
        snprintf(buf, len, "%s \u2192 %s: %s, other links %.0f\u2013%.0f MB/s", from, to, r, l->others_min / 1e6,
                 l->others_max / 1e6);
    else
        snprintf(buf, len, "%s \u2192 %s: %s, other links %s to %s", from, to, r, lo, hi);
}
