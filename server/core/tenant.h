/*
 * tenant.h - per-tenant resource accounting: what each uid holds in the daemon, against limits
 * from the configuration table (--max-*-per-tenant) that `collctl policy` can override per uid.
 *
 * A tenant is a uid (SO_PEERCRED, never what a client says). Every resource a client can make the
 * daemon hold is charged to its tenant when it is taken and uncharged when it is given back, so
 * one tenant can exhaust only its own share; global backstops (max-sessions, the fd limit) stay
 * beside these. A refused charge is COLLD_ERR_QUOTA_EXCEEDED with a detail that names the limit,
 * the tenant's use and how to raise it.
 *
 * Locking: every function here runs with daemon->lock held.
 */
#ifndef COLLD_SERVER_TENANT_H
#define COLLD_SERVER_TENANT_H

#include "common/err.h"

#include <colld/colld.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct colld_daemon colld_daemon_t;

/* What is counted. Keep colld_limit_name's table in tenant.c in the same order. */
typedef enum {
    COLLD_LIMIT_SESSIONS = 0,    /* client connections (sessions) */
    COLLD_LIMIT_COMMS,           /* communicator memberships, joining or formed */
    COLLD_LIMIT_JOINING_RANKS,   /* nranks summed over the communicators this tenant is forming */
    COLLD_LIMIT_REGS,            /* memory registrations (each a mapping in the daemon) */
    COLLD_LIMIT_REG_BYTES,       /* bytes mapped for registrations (each charged at least a page) */
    COLLD_LIMIT_FOLLOWERS,       /* Events streams open */
    COLLD_LIMIT_RPC_CONNS,       /* connections to the gRPC control socket */
    COLLD_LIMIT_DAEMON_BYTES,    /* memory the daemon allocates for the tenant (colld_tenant_charge_mem) */
    COLLD_LIMIT_COUNT
} colld_limit_t;

/* The option name of a limit ("max-sessions-per-tenant"), for messages. */
const char *colld_limit_name(colld_limit_t what);

/* The limit that applies to `uid`: its policy override if set, else the configured default. */
uint64_t colld_tenant_limit(const colld_daemon_t *d, uid_t uid, colld_limit_t what);

/* The configured default of a limit (what applies to a uid without an override). */
uint64_t colld_limit_default(const colld_daemon_t *d, colld_limit_t what);

/* What `uid` holds now. */
uint64_t colld_tenant_used(const colld_daemon_t *d, uid_t uid, colld_limit_t what);

/* Charge `n` units to `uid`. Returns COLLD_OK, or COLLD_ERR_QUOTA_EXCEEDED (nothing charged) with
 * err naming the limit, or COLLD_ERR_NO_MEMORY. */
colld_status_t colld_tenant_charge(colld_daemon_t *d, uid_t uid, colld_limit_t what, uint64_t n, colld_err_t *err);

/* Give back `n` units charged earlier. */
void colld_tenant_uncharge(colld_daemon_t *d, uid_t uid, colld_limit_t what, uint64_t n);

/* Set a tenant's override of one limit (UINT64_MAX clears it). Returns 0 or -1 (no memory). */
int colld_tenant_set_limit(colld_daemon_t *d, uid_t uid, colld_limit_t what, uint64_t limit);

/* Refusals so far, by limit (for metrics and collctl). */
uint64_t colld_tenant_refusals(const colld_daemon_t *d, colld_limit_t what);

/* The limit whose option name is `name` ("max-regs-per-tenant", a leading "--" allowed), or -1. */
int colld_limit_by_name(const char *name);

/* Whether `uid` has its own override of a limit (collctl policy). */
bool colld_tenant_overridden(const colld_daemon_t *d, uid_t uid, colld_limit_t what);

/* What all tenants together hold of a limit. */
uint64_t colld_tenant_used_total(const colld_daemon_t *d, colld_limit_t what);

/* The uids that hold something or have an override, at most `max` into out; returns how many
 * there are (which may be more than max). */
size_t colld_tenant_uids(const colld_daemon_t *d, uid_t *out, size_t max);

/* Whether a uid is an administrator of this daemon: root or the daemon's own uid. Only they may
 * change policy and take the admin role (collctl's sessions, which are not workload events). */
bool colld_uid_is_admin(uid_t uid);

/* ---- registrations: per tenant and the daemon-wide backstop ----
 *
 * Every registration is a mapping in the daemon, and the kernel allows a process only
 * vm.max_map_count of them (65530 by default): past that the daemon cannot map a session's rings
 * (no tenant can attach) and gRPC cannot grow. So besides each tenant's count and bytes, all
 * tenants' registrations together stay under a backstop that keeps room for the daemon's own
 * mappings (see colld_regs_backstop). */

/* Charge one registration of `bytes` to `uid`: the count, the bytes (rounded up to whole pages,
 * at least one), and the backstop. Returns COLLD_OK with *charged (the bytes to give back), or
 * COLLD_ERR_QUOTA_EXCEEDED (nothing charged) with a detail naming the limit. */
colld_status_t colld_tenant_charge_reg(colld_daemon_t *d, uid_t uid, uint64_t bytes, uint64_t *charged,
                                       colld_err_t *err);
/* Give back a registration charged with colld_tenant_charge_reg. */
void colld_tenant_uncharge_reg(colld_daemon_t *d, uid_t uid, uint64_t charged);

/* The backstop: --max-registrations when set (never above the derived value), else
 * vm.max_map_count less what the daemon keeps for itself: 4096 mappings for its libraries,
 * threads and allocator, two per session it may serve (rings, GPU flag area) and an eighth of the
 * map count for fast areas and growth. */
uint64_t colld_regs_backstop(colld_daemon_t *d);
/* Registrations the daemon holds now (all tenants), and backstop refusals so far. */
uint64_t colld_regs_held(const colld_daemon_t *d);
uint64_t colld_regs_backstop_refusals(const colld_daemon_t *d);

/* ---- memory the daemon allocates for a tenant: per tenant and the daemon-wide backstop ----
 *
 * A tenant's own buffers are its memory: it allocates every page before it registers them, and
 * the daemon refuses a buffer with a page missing rather than make it (session.c), since the
 * kernel charges a shared-memory page to the memory cgroup of the task that makes it. What the
 * daemon allocates itself on a tenant's behalf is charged to the daemon's cgroup, so it is counted
 * here, against the tenant's max-daemon-bytes-per-tenant and, for all tenants together, against
 * max-daemon-bytes (colld_mem_backstop): a session's rings and GPU flag area, a communicator's
 * fast area, a multi-node collective's buffers, and the page tables the daemon's mappings of the
 * tenant's registrations need (COLLD_REG_PT_BYTES). */

/* The page tables the daemon may need to map a host registration of `bytes` (8 bytes per 4 KiB
 * page, and a page at least). */
#define COLLD_REG_PT_BYTES(bytes) ((((uint64_t)(bytes) >> 9) + 4095) / 4096 * 4096 + 4096)

/* Charge `bytes` of the daemon's memory to `uid`: the backstop, then the tenant's limit. Returns
 * COLLD_OK, or COLLD_ERR_QUOTA_EXCEEDED (nothing charged) with a detail naming the limit, or
 * COLLD_ERR_NO_MEMORY. */
colld_status_t colld_tenant_charge_mem(colld_daemon_t *d, uid_t uid, uint64_t bytes, colld_err_t *err);
/* Give back memory charged with colld_tenant_charge_mem. */
void colld_tenant_uncharge_mem(colld_daemon_t *d, uid_t uid, uint64_t bytes);

/* The backstop: --max-daemon-bytes when set, else derived once from the daemon's memory limit
 * (the smallest limit of its memory cgroup and the cgroups above it, cgroup v2 or v1; else the
 * host's memory): three quarters of it less 256 MiB for the daemon's own use (what it holds that
 * is not counted here: its code, threads, the control plane's buffers, communicator records),
 * half of it when that is 512 MiB or less. *limit (may be NULL) gets the memory limit it was
 * derived from (0: it was set). */
uint64_t colld_mem_backstop(colld_daemon_t *d, uint64_t *limit);
/* What the daemon holds for all tenants now, and backstop refusals so far. */
uint64_t colld_mem_held(const colld_daemon_t *d);
uint64_t colld_mem_backstop_refusals(const colld_daemon_t *d);

/* Free the accounting (daemon shutdown). */
void colld_tenants_free(colld_daemon_t *d);

#endif /* COLLD_SERVER_TENANT_H */
