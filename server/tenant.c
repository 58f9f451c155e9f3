/*
 * tenant.c - per-tenant resource accounting (see tenant.h).
 *
 * One record per uid that holds something or has a policy override, in a list: tenants are few
 * (each is a real uid on this host) and nothing here is on the per-collective path. A record
 * whose counters are all zero and that has no override is freed, so the list holds only tenants
 * that are present.
 */
#include "server/tenant.h"

#include "server/daemon.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct colld_tenant {
    uid_t uid;
    uint64_t used[COLLD_LIMIT_COUNT];
    uint64_t limit[COLLD_LIMIT_COUNT]; /* UINT64_MAX: the configured default */
    struct colld_tenant *next;
} colld_tenant_t;

struct colld_tenants {
    colld_tenant_t *list;
    uint64_t refusals[COLLD_LIMIT_COUNT];
};

static const char *const limit_names[COLLD_LIMIT_COUNT] = {
    [COLLD_LIMIT_SESSIONS] = "max-sessions-per-tenant",
    [COLLD_LIMIT_COMMS] = "max-comms-per-tenant",
    [COLLD_LIMIT_JOINING_RANKS] = "max-joining-ranks-per-tenant",
    [COLLD_LIMIT_REGS] = "max-regs-per-tenant",
    [COLLD_LIMIT_REG_BYTES] = "max-registered-bytes-per-tenant",
    [COLLD_LIMIT_FOLLOWERS] = "max-event-followers-per-tenant",
    [COLLD_LIMIT_RPC_CONNS] = "max-rpc-conns-per-tenant",
};

const char *colld_limit_name(colld_limit_t what)
{
    return (unsigned)what < COLLD_LIMIT_COUNT ? limit_names[what] : "unknown limit";
}

/* The configured default of a limit. */
static uint64_t default_limit(const colld_daemon_t *d, colld_limit_t what)
{
    const colld_daemon_config_t *c = &d->cfg;
    switch (what) {
    case COLLD_LIMIT_SESSIONS:
        return (uint64_t)c->max_sessions_per_tenant;
    case COLLD_LIMIT_COMMS:
        return (uint64_t)c->max_comms_per_tenant;
    case COLLD_LIMIT_JOINING_RANKS:
        return (uint64_t)c->max_joining_ranks_per_tenant;
    case COLLD_LIMIT_REGS:
        return (uint64_t)c->max_regs_per_tenant;
    case COLLD_LIMIT_REG_BYTES:
        return c->max_registered_bytes_per_tenant;
    case COLLD_LIMIT_FOLLOWERS:
        return (uint64_t)c->max_followers_per_tenant;
    case COLLD_LIMIT_RPC_CONNS:
        return (uint64_t)c->max_rpc_conns_per_tenant;
    case COLLD_LIMIT_COUNT:
        break;
    }
    return 0;
}

static colld_tenant_t *find(const colld_daemon_t *d, uid_t uid)
{
    if (!d->tenants)
        return NULL;
    for (colld_tenant_t *t = d->tenants->list; t; t = t->next)
        if (t->uid == uid)
            return t;
    return NULL;
}

/* The record of a uid, created on first use; NULL without memory. */
static colld_tenant_t *get(colld_daemon_t *d, uid_t uid)
{
    colld_tenant_t *t = find(d, uid);
    if (t)
        return t;
    if (!d->tenants && !(d->tenants = calloc(1, sizeof(*d->tenants))))
        return NULL;
    t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->uid = uid;
    for (int i = 0; i < COLLD_LIMIT_COUNT; i++)
        t->limit[i] = UINT64_MAX;
    t->next = d->tenants->list;
    d->tenants->list = t;
    return t;
}

/* Free a record that holds nothing and overrides nothing. */
static void maybe_free(colld_daemon_t *d, colld_tenant_t *t)
{
    for (int i = 0; i < COLLD_LIMIT_COUNT; i++)
        if (t->used[i] || t->limit[i] != UINT64_MAX)
            return;
    for (colld_tenant_t **pp = &d->tenants->list; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            free(t);
            return;
        }
}

uint64_t colld_tenant_limit(const colld_daemon_t *d, uid_t uid, colld_limit_t what)
{
    const colld_tenant_t *t = find(d, uid);
    return t && t->limit[what] != UINT64_MAX ? t->limit[what] : default_limit(d, what);
}

uint64_t colld_tenant_used(const colld_daemon_t *d, uid_t uid, colld_limit_t what)
{
    const colld_tenant_t *t = find(d, uid);
    return t ? t->used[what] : 0;
}

colld_status_t colld_tenant_charge(colld_daemon_t *d, uid_t uid, colld_limit_t what, uint64_t n, char *detail,
                                   size_t len)
{
    colld_tenant_t *t = get(d, uid);
    if (!t) {
        snprintf(detail, len, "daemon out of memory");
        return COLLD_ERR_NO_MEMORY;
    }
    uint64_t limit = t->limit[what] != UINT64_MAX ? t->limit[what] : default_limit(d, what);
    if (t->used[what] > limit || n > limit - t->used[what]) {
        d->tenants->refusals[what]++;
        snprintf(detail, len,
                 "uid %u is at its limit %s = %llu (holds %llu, asked for %llu more); an operator can raise it: "
                 "collctl policy set %u --%s N",
                 (unsigned)uid, colld_limit_name(what), (unsigned long long)limit, (unsigned long long)t->used[what],
                 (unsigned long long)n, (unsigned)uid, colld_limit_name(what));
        maybe_free(d, t);
        return COLLD_ERR_QUOTA_EXCEEDED;
    }
    t->used[what] += n;
    return COLLD_OK;
}

void colld_tenant_uncharge(colld_daemon_t *d, uid_t uid, colld_limit_t what, uint64_t n)
{
    colld_tenant_t *t = find(d, uid);
    if (!t)
        return;
    t->used[what] = n > t->used[what] ? 0 : t->used[what] - n;
    maybe_free(d, t);
}

int colld_tenant_set_limit(colld_daemon_t *d, uid_t uid, colld_limit_t what, uint64_t limit)
{
    colld_tenant_t *t = get(d, uid);
    if (!t)
        return -1;
    t->limit[what] = limit;
    maybe_free(d, t);
    return 0;
}

uint64_t colld_tenant_refusals(const colld_daemon_t *d, colld_limit_t what)
{
    return d->tenants ? d->tenants->refusals[what] : 0;
}

void colld_tenants_free(colld_daemon_t *d)
{
    if (!d->tenants)
        return;
    while (d->tenants->list) {
        colld_tenant_t *t = d->tenants->list;
        d->tenants->list = t->next;
        free(t);
    }
    free(d->tenants);
    d->tenants = NULL;
}
