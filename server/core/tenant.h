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

/* Free the accounting (daemon shutdown). */
void colld_tenants_free(colld_daemon_t *d);

#endif /* COLLD_SERVER_TENANT_H */
