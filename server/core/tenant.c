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

#include "common/log.h"

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
    /* the daemon-memory backstop (all tenants together) */
    uint64_t mem_held;
    uint64_t mem_refused;
    uint64_t mem_backstop; /* 0 until first derived */
    uint64_t mem_limit;    /* the memory limit it was derived from; 0 when set by --max-daemon-bytes */
};

static const char *const limit_names[COLLD_LIMIT_COUNT] = {
    [COLLD_LIMIT_SESSIONS] = "max-sessions-per-tenant",
    [COLLD_LIMIT_COMMS] = "max-comms-per-tenant",
    [COLLD_LIMIT_JOINING_RANKS] = "max-joining-ranks-per-tenant",
    [COLLD_LIMIT_REGS] = "max-regs-per-tenant",
    [COLLD_LIMIT_REG_BYTES] = "max-registered-bytes-per-tenant",
    [COLLD_LIMIT_FOLLOWERS] = "max-event-followers-per-tenant",
    [COLLD_LIMIT_RPC_CONNS] = "max-rpc-conns-per-tenant",
    [COLLD_LIMIT_DAEMON_BYTES] = "max-daemon-bytes-per-tenant",
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
    case COLLD_LIMIT_DAEMON_BYTES:
        return c->max_daemon_bytes_per_tenant;
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

/* ============================================================================================
 * Memory the daemon allocates for tenants, and its backstop
 * ========================================================================================== */

/* A number from the first line of a file; 0 when it cannot be read or is not a number ("max"). */
static uint64_t read_u64(const char *path)
{
    unsigned long long v = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%llu", &v) != 1)
            v = 0;
        fclose(f);
    }
    return (uint64_t)v;
}

/* The smallest memory limit of the cgroup at `dir` (a path under a cgroup mount) and the ones
 * above it, down to `root`; `file` is memory.max (v2) or memory.limit_in_bytes (v1, where "no
 * limit" reads as a huge number). 0 when none is set. */
static uint64_t cgroup_limit(const char *root, const char *path, const char *file)
{
    char dir[512];
    uint64_t best = 0;
    snprintf(dir, sizeof(dir), "%s%s", root, path);
    size_t rootlen = strlen(root);
    for (;;) {
        char f[600];
        snprintf(f, sizeof(f), "%s/%s", dir, file);
        uint64_t v = read_u64(f);
        if (v && v < (1ull << 60) && (!best || v < best))
            best = v;
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < rootlen)
            break;
        *slash = '\0';
    }
    return best;
}

/* The daemon's memory limit: its memory cgroup's (v2, then v1), else the host's memory. */
static uint64_t memory_limit(void)
{
    char line[512];
    uint64_t best = 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    while (f && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!b)
            continue;
        const char *path = strcmp(b + 1, "/") == 0 ? "" : b + 1;
        uint64_t v = 0;
        if (b == a + 1) { /* "0::/path": cgroup v2, mounted alone or as the hybrid's unified */
            v = cgroup_limit("/sys/fs/cgroup", path, "memory.max");
            if (!v)
                v = cgroup_limit("/sys/fs/cgroup/unified", path, "memory.max");
        } else {
            *b = '\0';
            char *save = NULL;
            for (char *tok = strtok_r(a + 1, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                if (strcmp(tok, "memory") == 0)
                    v = cgroup_limit("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes");
        }
        if (v && (!best || v < best))
            best = v;
    }
    if (f)
        fclose(f);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t phys = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    return best && (!phys || best < phys) ? best : phys;
}

uint64_t colld_mem_backstop(colld_daemon_t *d, uint64_t *limit)
{
    colld_tenants_t *ts = tenants(d);
    if (!ts)
        return 0;
    if (!ts->mem_backstop) {
        if (d->cfg.max_daemon_bytes > 0) {
            ts->mem_backstop = d->cfg.max_daemon_bytes;
            ts->mem_limit = 0;
        } else {
            uint64_t m = memory_limit();
            ts->mem_limit = m;
            ts->mem_backstop = m > (512ull << 20) ? m / 4 * 3 - (256ull << 20) : m / 2;
            if (!ts->mem_backstop)
                ts->mem_backstop = 1; /* nothing known: nothing allocated for tenants */
        }
        if (ts->mem_limit)
            LOG_INFO(MEM,
                     "memory the daemon may allocate for tenants: max-daemon-bytes = %llu (derived from its "
                     "memory limit %llu)",
                     (unsigned long long)ts->mem_backstop, (unsigned long long)ts->mem_limit);
    }
    if (limit)
        *limit = ts->mem_limit;
    return ts->mem_backstop;
}

uint64_t colld_mem_held(const colld_daemon_t *d)
{
    return d->tenants ? d->tenants->mem_held : 0;
}

uint64_t colld_mem_backstop_refusals(const colld_daemon_t *d)
{
    return d->tenants ? d->tenants->mem_refused : 0;
}

colld_status_t colld_tenant_charge_mem(colld_daemon_t *d, uid_t uid, uint64_t bytes, colld_err_t *err)
{
    uint64_t limit;
    uint64_t backstop = colld_mem_backstop(d, &limit);
    if (!d->tenants)
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
    colld_tenants_t *ts = d->tenants;
    if (ts->mem_held > backstop || bytes > backstop - ts->mem_held) {
        ts->mem_refused++;
        /* The limit's name early: the session socket carries only the first 111 bytes. */
        char why[96] = "set by --max-daemon-bytes";
        if (limit)
            snprintf(why, sizeof(why), "%s its memory limit %llu", limit > (512ull << 20) ? "3/4 less 256 MiB of" : "half",
                     (unsigned long long)limit);
        return colld_err_set(err, COLLD_ERR_QUOTA_EXCEEDED,
                             "the daemon is at its limit max-daemon-bytes = %llu (memory it allocates for all users: "
                             "holds %llu, asked for %llu more; %s); try again later",
                             (unsigned long long)backstop, (unsigned long long)ts->mem_held, (unsigned long long)bytes,
                             why);
    }
    colld_status_t st = colld_tenant_charge(d, uid, COLLD_LIMIT_DAEMON_BYTES, bytes, err);
    if (st == COLLD_OK)
        ts->mem_held += bytes;
    return st;
}

void colld_tenant_uncharge_mem(colld_daemon_t *d, uid_t uid, uint64_t bytes)
{
    if (!bytes || !d->tenants)
        return;
    d->tenants->mem_held = bytes > d->tenants->mem_held ? 0 : d->tenants->mem_held - bytes;
    colld_tenant_uncharge(d, uid, COLLD_LIMIT_DAEMON_BYTES, bytes);
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
