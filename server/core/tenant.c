/*
 * tenant.c - per-tenant resource accounting (see tenant.h).
 *
 * One record per uid that holds something or has a policy override, in a list: tenants are few
 * (each is a real uid on this host) and nothing here is on the per-collective path. A record
 * whose counters are all zero and that has no override is freed, so the list holds only tenants
 * that are present.
 */
#include "server/core/tenant.h"

#include "server/core/daemon.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct colld_tenant {
    uid_t uid;
    uint64_t used[COLLD_LIMIT_COUNT];
    uint64_t limit[COLLD_LIMIT_COUNT]; /* UINT64_MAX: the configured default */
    struct colld_tenant *next;
} colld_tenant_t;

struct colld_tenants {
    colld_tenant_t *list;
    uint64_t refusals[COLLD_LIMIT_COUNT];
    /* the registration backstop (all tenants together) */
    uint64_t regs_held;
    uint64_t regs_refused;
    uint64_t regs_backstop; /* 0 until first derived */
    uint64_t map_count;     /* vm.max_map_count when it was derived */
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

uint64_t colld_limit_default(const colld_daemon_t *d, colld_limit_t what)
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

/* The accounting, created on first use; NULL without memory. */
static colld_tenants_t *tenants(colld_daemon_t *d)
{
    if (!d->tenants)
        d->tenants = calloc(1, sizeof(*d->tenants));
    return d->tenants;
}

/* The record of a uid, created on first use; NULL without memory. */
static colld_tenant_t *get(colld_daemon_t *d, uid_t uid)
{
    colld_tenant_t *t = find(d, uid);
    if (t)
        return t;
    if (!tenants(d))
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
    return t && t->limit[what] != UINT64_MAX ? t->limit[what] : colld_limit_default(d, what);
}

uint64_t colld_tenant_used(const colld_daemon_t *d, uid_t uid, colld_limit_t what)
{
    const colld_tenant_t *t = find(d, uid);
    return t ? t->used[what] : 0;
}

colld_status_t colld_tenant_charge(colld_daemon_t *d, uid_t uid, colld_limit_t what, uint64_t n, colld_err_t *err)
{
    colld_tenant_t *t = get(d, uid);
    if (!t)
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
    uint64_t limit = t->limit[what] != UINT64_MAX ? t->limit[what] : colld_limit_default(d, what);
    if (t->used[what] > limit || n > limit - t->used[what]) {
        d->tenants->refusals[what]++;
        /* The limit's name early: the session socket carries only the first 111 bytes. */
        colld_err_set(err, COLLD_ERR_QUOTA_EXCEEDED,
                      "uid %u is at its limit %s = %llu (holds %llu, asked for %llu more); an operator can raise "
                      "it: collctl policy set %u --%s N",
                      (unsigned)uid, colld_limit_name(what), (unsigned long long)limit,
                      (unsigned long long)t->used[what], (unsigned long long)n, (unsigned)uid, colld_limit_name(what));
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

int colld_limit_by_name(const char *name)
{
    if (!name)
        return -1;
    if (strncmp(name, "--", 2) == 0)
        name += 2;
    for (int i = 0; i < COLLD_LIMIT_COUNT; i++)
        if (strcmp(name, limit_names[i]) == 0)
            return i;
    return -1;
}

bool colld_tenant_overridden(const colld_daemon_t *d, uid_t uid, colld_limit_t what)
{
    const colld_tenant_t *t = find(d, uid);
    return t && t->limit[what] != UINT64_MAX;
}

uint64_t colld_tenant_used_total(const colld_daemon_t *d, colld_limit_t what)
{
    uint64_t sum = 0;
    for (const colld_tenant_t *t = d->tenants ? d->tenants->list : NULL; t; t = t->next)
        sum += t->used[what];
    return sum;
}

size_t colld_tenant_uids(const colld_daemon_t *d, uid_t *out, size_t max)
{
    size_t n = 0;
    for (const colld_tenant_t *t = d->tenants ? d->tenants->list : NULL; t; t = t->next, n++)
        if (n < max)
            out[n] = t->uid;
    return n;
}

bool colld_uid_is_admin(uid_t uid)
{
    return uid == 0 || uid == getuid();
}

/* ============================================================================================
 * Registrations and the backstop
 * ========================================================================================== */

/* vm.max_map_count, or the kernel's default when it cannot be read. */
static uint64_t read_map_count(void)
{
    unsigned long long v = 0;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
        if (fscanf(f, "%llu", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v ? (uint64_t)v : 65530;
}

uint64_t colld_regs_backstop(colld_daemon_t *d)
{
    colld_tenants_t *ts = tenants(d);
    if (!ts)
        return 0;
    if (!ts->regs_backstop) {
        uint64_t maps = read_map_count();
        uint64_t keep = 4096 + 2 * (uint64_t)d->cfg.max_sessions + maps / 8;
        uint64_t derived = maps > keep ? maps - keep : maps / 2; /* a small map count: keep half */
        uint64_t set = d->cfg.max_registrations > 0 ? (uint64_t)d->cfg.max_registrations : derived;
        ts->regs_backstop = set < derived ? set : derived;
        ts->map_count = maps;
    }
    return ts->regs_backstop;
}

uint64_t colld_regs_held(const colld_daemon_t *d)
{
    return d->tenants ? d->tenants->regs_held : 0;
}

uint64_t colld_regs_backstop_refusals(const colld_daemon_t *d)
{
    return d->tenants ? d->tenants->regs_refused : 0;
}

/* The bytes a registration of `bytes` is charged: whole pages, at least one. */
static uint64_t reg_charge_bytes(uint64_t bytes)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (bytes > UINT64_MAX - page)
        return UINT64_MAX - page + 1;
    return bytes == 0 ? page : (bytes + page - 1) / page * page;
}

colld_status_t colld_tenant_charge_reg(colld_daemon_t *d, uid_t uid, uint64_t bytes, uint64_t *charged,
                                       colld_err_t *err)
{
    uint64_t backstop = colld_regs_backstop(d);
    if (!d->tenants)
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
    colld_tenants_t *ts = d->tenants;
    if (ts->regs_held >= backstop) {
        ts->regs_refused++;
        return colld_err_set(err, COLLD_ERR_QUOTA_EXCEEDED,
                             "the daemon is at its limit max-registrations = %llu (registrations of all users, one "
                             "mapping each; vm.max_map_count is %llu); free some memory, or an operator raises "
                             "vm.max_map_count",
                             (unsigned long long)backstop, (unsigned long long)ts->map_count);
    }
    uint64_t b = reg_charge_bytes(bytes);
    colld_status_t st = colld_tenant_charge(d, uid, COLLD_LIMIT_REGS, 1, err);
    if (st != COLLD_OK)
        return st;
    st = colld_tenant_charge(d, uid, COLLD_LIMIT_REG_BYTES, b, err);
    if (st != COLLD_OK) {
        colld_tenant_uncharge(d, uid, COLLD_LIMIT_REGS, 1);
        return st;
    }
    ts->regs_held++;
    *charged = b;
    return COLLD_OK;
}

void colld_tenant_uncharge_reg(colld_daemon_t *d, uid_t uid, uint64_t charged)
{
    if (d->tenants && d->tenants->regs_held > 0)
        d->tenants->regs_held--;
    colld_tenant_uncharge(d, uid, COLLD_LIMIT_REG_BYTES, charged);
    colld_tenant_uncharge(d, uid, COLLD_LIMIT_REGS, 1);
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
