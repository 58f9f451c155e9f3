/*
 * policy.c - per-tenant policy (collctl policy, --tenant-timeout-caps): a tenant's cap on its
 * communicators' time-outs, its inter-node all-reduce algorithm and result verification. The limits on what a tenant may
 * hold are tenant.c's. Every function runs with daemon->lock held.
 */
#include "server/core/daemon.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The timeout cap of a tenant's policy, 0 when none. */
int colld_policy_cap(const colld_daemon_t *d, uid_t uid)
{
    for (const colld_policy_t *p = d->policies; p; p = p->next)
        if (p->uid == uid)
            return p->max_timeout_ms;
    return 0;
}

/* Forget every tenant's policy (daemon shutdown). */
void colld_policy_free(colld_daemon_t *d)
{
    while (d->policies) {
        colld_policy_t *p = d->policies;
        d->policies = p->next;
        free(p);
    }
}

/* Parse "uid:ms,uid:ms" (whitespace allowed around items). */
int colld_policy_parse(colld_daemon_t *d, const char *text, colld_err_t *err)
{
    const char *p = text;
    while (p && *p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        unsigned long long uid = strtoull(p, &end, 10);
        if (end == p || *end != ':' || errno || uid > UINT32_MAX - 1) {
            colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "tenant-timeout-caps: expected uid:ms at '%s'", p);
            return -1;
        }
        p = end + 1;
        long long ms = strtoll(p, &end, 10);
        if (end == p || errno || ms < 1 || ms > 86400000 || (*end && *end != ',' && *end != ' ')) {
            colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                          "tenant-timeout-caps: timeout of uid %llu must be 1..86400000 ms at '%s'", uid, p);
            return -1;
        }
        p = end;
        if (colld_policy_set(d, (uid_t)uid, (int)ms) < 0) {
            colld_err_set(err, COLLD_ERR_NO_MEMORY, "out of memory");
            return -1;
        }
    }
    return 0;
}

/* Set (or replace) a tenant's timeout cap; a new record takes the daemon's algorithm. */
int colld_policy_set(colld_daemon_t *d, uid_t uid, int max_timeout_ms)
{
    colld_policy_t *pol = NULL;
    for (colld_policy_t *x = d->policies; x; x = x->next)
        if (x->uid == uid)
            pol = x;
    if (!pol) {
        pol = calloc(1, sizeof(*pol));
        if (!pol)
            return -1;
        pol->uid = uid;
        pol->net_algo = -1;
        pol->next = d->policies;
        d->policies = pol;
    }
    pol->max_timeout_ms = max_timeout_ms;
    return 0;
}

/* Remove a tenant's policy (no-op when it has none). */
void colld_policy_clear(colld_daemon_t *d, uid_t uid)
{
    for (colld_policy_t **pp = &d->policies; *pp; pp = &(*pp)->next)
        if ((*pp)->uid == uid) {
            colld_policy_t *p = *pp;
            *pp = p->next;
            free(p);
            return;
        }
}

/* The inter-node all-reduce algorithm a tenant's communicators use. */
int colld_policy_net_algo(const colld_daemon_t *d, uid_t uid)
{
    int algo = d->cfg.net_algo;
    for (const colld_policy_t *p = d->policies; p; p = p->next)
        if (p->uid == uid && p->net_algo >= 0)
            algo = p->net_algo;
    return algo;
}

bool colld_policy_verify(const colld_daemon_t *d, uid_t uid)
{
    for (const colld_policy_t *p = d->policies; p; p = p->next)
        if (p->uid == uid)
            return p->verify;
    return false;
}

/* "auto", "ring", "rd" (empty: auto) -> COLLD_NET_ALGO_*, -1 when unknown. */
int colld_net_algo_parse(const char *text)
{
    if (!text || !*text || strcmp(text, "auto") == 0)
        return COLLD_NET_ALGO_AUTO;
    if (strcmp(text, "ring") == 0)
        return COLLD_NET_ALGO_RING;
    if (strcmp(text, "rd") == 0)
        return COLLD_NET_ALGO_RD;
    return -1;
}

/* The name of an algorithm, as the options and collctl write it. */
const char *colld_net_algo_name(int algo)
{
    switch (algo) {
    case COLLD_NET_ALGO_RING:
        return "ring";
    case COLLD_NET_ALGO_RD:
        return "rd";
    default:
        return "auto";
    }
}
