/*
 * linkhealth.h - the slow-link rule, shared by the daemon (its events and log) and collctl
 * (status, probe, doctor), so that every view names the same links.
 *
 * The rule. Take the directed links of one node whose throughput was measured (this node to each
 * peer and each peer to this node; a link without a measurement takes no part). A link is slow
 * when at least COLLD_LINK_MIN_SIBLINGS other links were measured and its rate is below
 * 1/COLLD_LINK_SLOW_RATIO of the median of those other links. With a ratio of 4 a healthy link
 * that is merely busier or less busy than its siblings is not named; one running at a tenth of
 * its siblings' speed (a bad cable, a shaped or half-duplex port) is.
 */
#ifndef COLLD_COMMON_LINKHEALTH_H
#define COLLD_COMMON_LINKHEALTH_H

#include <stdbool.h>
#include <stddef.h>

#define COLLD_LINK_SLOW_RATIO 4.0 /* slow: below 1/4 of the median of the other links */
#define COLLD_LINK_MIN_SIBLINGS 2 /* ...of at least this many other measured links */

typedef struct {
    double rate; /* bytes/s; 0 or less: not measured */
    /* set by colld_link_outliers */
    bool slow;
    double others_median; /* of the other measured links (0 when fewer than the minimum) */
    double others_min, others_max;
} colld_link_rate_t;

/* Apply the rule to n links: set slow and the others' median, min and max of each measured link.
 * Returns how many are slow. */
size_t colld_link_outliers(colld_link_rate_t *links, size_t n);

/* "FROM → TO: 0.6 MB/s, other links 110–118 MB/s" (MB = 10^6 bytes) into buf. */
void colld_link_describe(char *buf, size_t len, const char *from, const char *to, const colld_link_rate_t *l);

/* A rate as text: "118 MB/s", "0.62 MB/s", "-" when not measured. */
void colld_link_rate_text(char *buf, size_t len, double rate);

#endif /* COLLD_COMMON_LINKHEALTH_H */
