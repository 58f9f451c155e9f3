/*
 * cluster_base.c - what every file of the net backend shares, below cluster.c: finding the
 * daemon's cluster, the network thread's inbox, and the log of refused peer messages.
 *
 * cluster.c (membership, forming, faults, the backend's ops) calls down into links.c, probe.c and
 * xcoll.c; they reach the cluster only through this file, never back into cluster.c.
 */
#include "server/net/cluster.h"

#include "common/log.h"
#include "common/util.h"

#include <stdarg.h>
#include <stdio.h>

/* The net backend is the one that forms multi-node communicators (colld_backend_ops_t.comm_form);
 * its state is the daemon's cluster. */
colld_cluster_t *colld_cluster_of(const colld_daemon_t *d)
{
    for (int i = 0; i < d->nbackends; i++)
        if (d->backends[i].ops->comm_form)
            return d->backends[i].state;
    return NULL;
}

bool colld_cluster_running(const colld_daemon_t *d)
{
    return colld_cluster_of(d) != NULL;
}

const char *colld_cluster_ib_device(const colld_daemon_t *d)
{
    const colld_cluster_t *cl = colld_cluster_of(d);
    return cl ? cl->ib_name : "";
}

const char *colld_cluster_ib_none(const colld_daemon_t *d)
{
    const colld_cluster_t *cl = colld_cluster_of(d);
    return cl ? cl->ib_none : "";
}

/* ============================================================================================
 * The inbox: work for the network thread
 * ========================================================================================== */

void colld_cluster_inbox_push(colld_daemon_t *d, cjob_t *j)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    if (cl->inbox_tail)
        cl->inbox_tail->next = j;
    else
        cl->inbox = j;
    cl->inbox_tail = j;
    colld_net_wake(cl->net);
}

/* ============================================================================================
 * Refused peer messages
 * ========================================================================================== */

void colld_cluster_log_bad(colld_cluster_t *cl, const char *fmt, ...)
{
    char text[COLLD_DETAIL_LEN];
    uint64_t now = colld_now_ms();
    atomic_fetch_add(&cl->bad_msgs, 1);
    if (cl->bad_log.last_ms && now < cl->bad_log.last_ms + 10000) {
        cl->bad_log.quiet++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (cl->bad_log.quiet)
        LOG_WARN(NET, "refused a peer message: %s (and %llu more in the last %llu s)", text,
                 (unsigned long long)cl->bad_log.quiet, (unsigned long long)((now - cl->bad_log.last_ms) / 1000));
    else
        LOG_WARN(NET, "refused a peer message: %s", text);
    cl->bad_log.last_ms = now;
    cl->bad_log.quiet = 0;
}
