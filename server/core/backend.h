/*
 * backend.h - how the daemon core is composed: backends behind one table of operations, and
 * modules told of every communicator's life through one table of hooks.
 *
 * The core (server/core: sessions, communicators, admission, matching, time-outs, completions)
 * knows no backend and no module by name. A backend (server/backends/<name>/, server/net/) fills
 * in a colld_backend_ops_t with designated initializers; a module (the fast area, the flight
 * recorder, the events, the metrics) a colld_comm_hooks_t. The registry (server/registry.c.in)
 * lists them: a backend's folder registers it with one line of CMake (colld_register_backend), and
 * the daemon's main() (or an in-process test) hands the registry to colld_daemon_compose. Every
 * entry may be NULL: the core calls only what is there.
 *
 * A matched collective goes to the first backend, in registry order, whose `claims` says yes
 * (net: communicators spanning nodes; cuda: stream-ordered collectives; host: everything else).
 * A backend keeps its state behind opaque slots: colld_backend_t.state for the daemon, and
 * colld_dcomm_t.bslot[b->slot] / colld_session_t.bslot[b->slot] per communicator and session.
 *
 * Locking: unless an entry says otherwise, it is called with daemon->lock held, on the engine
 * thread (submit, progress, run_unlocked, after_run) or on whatever thread changed the state
 * (comm hooks, session_free).
 */
#ifndef COLLD_SERVER_CORE_BACKEND_H
#define COLLD_SERVER_CORE_BACKEND_H

#include "common/err.h"
#include "proto/wire.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Backends one daemon can hold (the registry's length is checked against it at compose). */
#define COLLD_BACKEND_MAX 8

typedef struct colld_daemon colld_daemon_t;
typedef struct colld_session colld_session_t;
typedef struct colld_dcomm colld_dcomm_t;
typedef struct colld_member colld_member_t;
typedef struct colld_op colld_op_t;
typedef struct colld_reg colld_reg_t;
typedef struct colld_coll colld_coll_t;
typedef struct colld_xfer colld_xfer_t;
typedef struct colld_backend colld_backend_t;

/* How a communicator got its first fault (colld_comm_hooks_t.faulted). */
typedef enum {
    COLLD_FAULT_DISSOLVED = 0, /* it had not formed: it is gone */
    COLLD_FAULT_CLOSED = 1,    /* a rank destroyed its handle (COLLD_ERR_INVALID_USAGE): closing */
    COLLD_FAULT_BROKEN = 2,    /* a fault: every later operation fails with c->error */
} colld_fault_t;

/* What a module is told of a communicator's life. */
typedef struct colld_comm_hooks {
    const char *name;
    /* Every rank has joined: the communicator is ready (make what it needs; without memory for
     * it, it runs without). */
    void (*formed)(colld_daemon_t *d, colld_dcomm_t *c);
    /* It recorded its first fault (or a fault after a rank closed it): c->error and `detail`;
     * `rank` is the rank at fault or -1. */
    void (*faulted)(colld_daemon_t *d, colld_dcomm_t *c, colld_fault_t how, int rank, const char *detail);
    /* Its queued operations are about to fail with `st` (a break, a rank leaving): what waits is
     * still in the members' queues. */
    void (*failing)(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st);
    /* A break has failed its queued operations: release whatever else waits for them. */
    void (*broken)(colld_daemon_t *d, colld_dcomm_t *c);
    /* A collective ended (executed or failed): ops[nranks] by rank (NULL for remote ranks), its
     * execution window (start_ns 0: it never ran) and the first rank's arrival. */
    void (*finished)(colld_daemon_t *d, colld_dcomm_t *c, colld_op_t *const *ops, uint64_t first_ns, uint64_t start_ns,
                     uint64_t end_ns, colld_status_t st);
    /* Before the engine matches a ready communicator's next collective: false keeps it from
     * matching this pass; *deadline may be brought forward (when to look again). */
    bool (*judge)(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now, uint64_t *deadline);
    /* A rank is about to leave: settle what the ranks finished outside the engine. */
    void (*settle)(colld_daemon_t *d, colld_dcomm_t *c);
    /* A session message of a type the core does not serve itself: -2 when not this module's
     * type, else what the core's dispatcher returns (-1 drops the session). Lock NOT held. */
    int (*session_msg)(colld_session_t *s, const colld_wire_msg_t *m);
    /* The communicator is freed (nothing of it is in flight). */
    void (*freed)(colld_daemon_t *d, colld_dcomm_t *c);
    /* Its next collective has waited --wait-event-ms since its first arrival (once per collective):
     * `rank` is the first rank that has not posted it (-1: all have), `detail` names them. */
    void (*waiting)(colld_daemon_t *d, colld_dcomm_t *c, int rank, uint64_t waited_ns, const char *detail);
} colld_comm_hooks_t;

/* A backend's operations. */
typedef struct colld_backend_ops {
    const char *name;
    /* The life of the backend: start (lock not held, before the engine) returns 0, or -1 when the
     * daemon cannot start; a backend with nothing to drive (no GPU) starts absent and says why
     * (present stays false). stop after the engine has stopped. */
    int (*start)(colld_backend_t *b);
    void (*stop)(colld_backend_t *b);
    /* A line for the daemon's start-up banner, "" for none (lock not held). */
    void (*describe)(const colld_backend_t *b, char *buf, size_t len);

    /* Whether this backend runs the communicator's collective whose (first local) descriptor is
     * `sqe`. */
    bool (*claims)(const colld_backend_t *b, const colld_dcomm_t *c, const colld_wire_sqe_t *sqe);
    /* Admission of one descriptor this backend claims, after the core's checks of its own fields
     * and before its buffers are resolved: COLLD_OK, or the status with what is wrong in err. */
    colld_status_t (*admit)(colld_backend_t *b, colld_op_t *op, colld_err_t *err);
    /* A matched collective (every local rank posted it, signatures agree), to run. The backend
     * finishes it with colld_engine_finish. */
    void (*submit)(colld_backend_t *b, colld_coll_t *k);
    /* A matched point-to-point transfer (a send and its receive) to run. The backend finishes it
     * with colld_p2p_finish, from its progress; it may finish it at once only after breaking the
     * communicator (without memory, say): the matching then stops. The first backend that has this
     * entry and claims the send's descriptor runs it. */
    void (*xfer_submit)(colld_backend_t *b, colld_xfer_t *x);
    /* Progress what was submitted: returns the work done, brings *deadline forward. */
    int (*progress)(colld_backend_t *b, uint64_t now, uint64_t *deadline);
    /* Work is outstanding that only polling finds done: the engine keeps busy-polling for
     * poll_spin_ns after the last progress (then looks every millisecond). */
    bool (*outstanding)(const colld_backend_t *b);
    uint64_t poll_spin_ns;
    /* Engine thread, lock NOT held: run what submit and progress queued; true when something
     * ran, and then after_run follows under the lock. */
    bool (*run_unlocked)(colld_backend_t *b);
    void (*after_run)(colld_backend_t *b);
    /* The engine stops (its thread, lock held; the sessions are gone): end whatever run_unlocked
     * would still run on later rounds, posting it as after_run does. */
    void (*drain)(colld_backend_t *b);
    /* The communicator has collectives of this backend in flight: a collective of another backend
     * waits for them (each rank's completions stay in sequence order). */
    bool (*comm_busy)(const colld_backend_t *b, const colld_dcomm_t *c);
    /* A stream-ordered descriptor of session s, operation `id` (the descriptor's own seq; sqe->seq
     * is its collective ordinal), failed with st: whatever waits for it on the rank's side must be
     * released. */
    void (*stream_failed)(colld_backend_t *b, colld_session_t *s, const colld_wire_sqe_t *sqe, uint64_t id,
                          colld_status_t st);
    /* Deadlock detection (core/deadlock.c): the matched collectives this backend holds that wait
     * for some of their ranks (a GPU collective whose ranks' streams have not all reached it),
     * the first of each communicator: fn(arg, k, arrived), arrived[r] true for the ranks that got
     * there (whose streams now wait in k). NULL when the backend's collectives never wait so. */
    void (*waiting)(colld_backend_t *b, void (*fn)(void *arg, const colld_coll_t *k, const bool *arrived), void *arg);
    /* Deadlock detection too: c's sends and receives this backend holds after matching that wait
     * for their peer (a stream-ordered transfer whose one rank's stream reached it while the other's
     * has not): fn(arg, op) for the operation of the rank that waits. NULL when none waits so. */
    void (*xfer_waits)(colld_backend_t *b, const colld_dcomm_t *c, void (*fn)(void *arg, const colld_op_t *op),
                       void *arg);

    /* Communicators spanning nodes: the backend that forms them. comm_form attaches its state to
     * a new communicator whose unique id names another daemon as root (the first local rank
     * joins; 0, or -1 with err); rank_joined tells the root of each local rank. The communicator
     * forms when the backend calls colld_comm_formed. Its own join deadline comes join_grace_ns
     * after the root's, which times the join out first. */
    int (*comm_form)(colld_backend_t *b, colld_dcomm_t *c, colld_err_t *err);
    void (*rank_joined)(colld_backend_t *b, colld_dcomm_t *c, colld_member_t *m);
    uint64_t join_grace_ns;
    /* The unique id it issues carries this daemon's address (no-op when it does not listen). */
    void (*stamp_uid)(const colld_backend_t *b, uint8_t *uid);

    /* Memory the host cannot touch (device memory) and stream ordering, for the session
     * messages COLLD_MSG_REG_CUDA, COLLD_MSG_REG_CUDA_SEG and COLLD_MSG_GPU_FLAGS (lock not held).
     * mem_register opens a registration for s (the same memory registered again: the same
     * registration) and returns its id (a segment of a registration being assembled: id 0 until
     * the last); mem_release closes one whose last reference went (lock held); sync_area returns a
     * new descriptor of the session's stream flag area (made on first use), its size, its flag
     * lines and its plan lines (proto/wire.h), or -1 with err. */
    colld_status_t (*mem_register)(colld_backend_t *b, colld_session_t *s, const colld_wire_msg_t *m, int fd,
                                   uint32_t *reg_id, colld_err_t *err);
    void (*mem_release)(colld_backend_t *b, colld_reg_t *r);
    int (*sync_area)(colld_backend_t *b, colld_session_t *s, uint64_t *size, uint32_t *lines, uint32_t *plans,
                     colld_err_t *err);
    /* The session's last reference went: free what the backend keeps for it. */
    void (*session_free)(colld_backend_t *b, colld_session_t *s);
    /* May session s join a communicator (lock held)? NULL, or why not in why (a device it holds
     * memory on is drained after a fatal health event: cuda_health.c). NULL op: always. */
    const char *(*join_refused)(colld_backend_t *b, const colld_session_t *s, char *why, size_t len);

    /* What the backend is told of its communicators' lives (NULL: nothing). */
    const colld_comm_hooks_t *hooks;
} colld_backend_ops_t;

/* A backend in one daemon. */
struct colld_backend {
    const colld_backend_ops_t *ops;
    colld_daemon_t *d;
    int slot;     /* its index: colld_dcomm_t.bslot[slot], colld_session_t.bslot[slot] */
    bool present; /* started and has something to drive */
    void *state;  /* the backend's own */
};

/* What a daemon is composed of: the backends in the order they claim collectives and the modules
 * in the order they are told (NULL-terminated lists), and why no backend serves device memory
 * when none does. The daemon's is colld_registry (server/registry.c.in, generated by CMake from
 * the backends each folder registers). */
typedef struct {
    const colld_backend_ops_t *const *backends;
    const colld_comm_hooks_t *const *modules;
    const char *device_none;
} colld_registry_t;
extern const colld_registry_t colld_registry;

/* Compose a daemon from a registry. Returns 0, or -1 when it has more than COLLD_BACKEND_MAX
 * backends. */
int colld_daemon_compose(colld_daemon_t *d, const colld_registry_t *reg);
/* Start every backend in order (lock not held). Returns NULL, or the one that failed (those
 * started before it are stopped again). */
colld_backend_t *colld_backends_start(colld_daemon_t *d);
/* Stop every started backend, in reverse order (after the engine has stopped). */
void colld_backends_stop(colld_daemon_t *d);
/* The backend with these operations in d, NULL when it is not composed in. */
colld_backend_t *colld_backend_find(colld_daemon_t *d, const colld_backend_ops_t *ops);
/* The backend serving device memory and stream ordering (mem_register), NULL when none is. */
colld_backend_t *colld_backend_device(colld_daemon_t *d);
/* The backend that forms communicators spanning nodes (comm_form), NULL when none does. */
colld_backend_t *colld_backend_former(colld_daemon_t *d);
/* The first backend that claims a collective of c whose descriptor is sqe. */
colld_backend_t *colld_backend_claim(colld_daemon_t *d, const colld_dcomm_t *c, const colld_wire_sqe_t *sqe);

#endif /* COLLD_SERVER_CORE_BACKEND_H */
