/*
 * events.h - the daemon's event backlog and the Events stream (collctl events --follow): sessions
 * attached and detached, communicators created and destroyed, faults. A module told of every
 * communicator's life (colld_events_hooks, backend.h) records what happens to communicators.
 */
#ifndef COLLD_SERVER_OBSERVABILITY_EVENTS_H
#define COLLD_SERVER_OBSERVABILITY_EVENTS_H

#include "server/control/rpc/rpc_server.h"
#include "server/core/backend.h"

#include <colld/colld.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* The module. */
extern const colld_comm_hooks_t colld_events_hooks;

int colld_events_start(colld_daemon_t *d);
/* Finish every stream and free the backlog (before the gRPC server is destroyed). */
void colld_events_stop(colld_daemon_t *d);
/* Record an event (daemon->lock held; never blocks on a subscriber). `c` may be NULL; with a
 * communicator, the event belongs to its tenant, else to `uid`. */
void colld_event(colld_daemon_t *d, const char *type, const colld_dcomm_t *c, int rank, pid_t pid, uint64_t session_id,
                 uid_t uid, colld_status_t st, const char *fmt, ...) __attribute__((format(printf, 9, 10)));
/* Serve an Events call: backlog, then live events if follow. Takes the call. */
void colld_events_subscribe(colld_daemon_t *d, colld_rpc_call_t *call, bool follow, uint32_t backlog, bool only_new,
                            bool admin, uid_t uid);
/* The most recent fault events (a failed status; not a destroy, a detach, a wait or GPU health)
 * since since_unix_us that a caller may see (admin: all, else uid's tenant's), at most max, oldest
 * first: copied into out[max] (Colld__V1__Event whose strings point into recs[max]). Returns how
 * many; *dropped counts the older ones left out. daemon->lock held (the backlog is freed under
 * it); takes the events' lock. */
typedef struct colld_event_copy colld_event_copy_t;
struct Colld__V1__Event;
size_t colld_events_faults(colld_daemon_t *d, bool admin, uid_t uid, int64_t since_unix_us, size_t max,
                           struct Colld__V1__Event *out, colld_event_copy_t **recs, uint32_t *dropped);
/* The event type of a communicator fault. */
const char *colld_event_type_of(colld_status_t st);

#endif /* COLLD_SERVER_OBSERVABILITY_EVENTS_H */
