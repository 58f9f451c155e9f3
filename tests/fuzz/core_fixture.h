/*
 * core_fixture.h - the daemon core in-process, for fuzzers and in-process tests: a colld_daemon_t
 * with its configuration defaults, composed of the daemon's own backends and modules
 * (colld_registry: a one-thread host backend, the net backend without --listen, the CUDA backend
 * where built, finding no GPU), its counters, and an engine that runs a round at a time on the
 * caller's thread (colld_engine_run_once); sessions with their rings in memory
 * (the memory a client would map: tests write descriptors into it as a client, or garbage as a
 * hostile one); registrations of anonymous shared memory; communicators formed through the real
 * registry (colld_comm_issue_uid / colld_comm_join). No sockets, no threads but the caller's, no
 * gRPC. Everything the core does from here on is its own code.
 */
#ifndef COLLD_TESTS_CORE_FIXTURE_H
#define COLLD_TESTS_CORE_FIXTURE_H

#include "server/control/control.h"
#include "server/core/daemon.h"
#include "server/observability/events.h"

#define FIX_MAX_SESSIONS 8
#define FIX_REGS 2            /* registrations per session, ids 1 and 2 */
#define FIX_REG_BYTES 65536   /* bytes each */

typedef struct {
    colld_daemon_t d; /* first: the spy module finds the fixture from its daemon */
    colld_session_t *s[FIX_MAX_SESSIONS];
    int nsessions;
    /* The daemon's registry with one more module, a spy told of every communicator's faults (what
     * a dissolved communicator said, after it is gone): */
    colld_registry_t reg;
    const colld_comm_hooks_t *modules[16];
    int faults;               /* faults seen */
    colld_fault_t fault_how;  /* the last one's */
    colld_status_t fault_status;
    int fault_rank;
    char fault_detail[COLLD_DETAIL_LEN];
} fix_t;

/* Start a core. `fast_path_bytes` sets --fast-path-bytes (0: no fast areas). Returns 0 or -1. */
int fix_start(fix_t *f, uint64_t fast_path_bytes);
/* A new session of uid `uid` with FIX_REGS registrations (filled with `fill`). NULL when full. */
colld_session_t *fix_session(fix_t *f, uid_t uid, uint8_t fill);
/* Form a communicator of the first `nranks` sessions, rank i = session i (each one join, as the
 * CommInit RPC makes it). Returns the communicator (ready) or NULL. */
colld_dcomm_t *fix_comm(fix_t *f, int nranks, int timeout_ms);
/* Publish a descriptor in a session's submission ring as a client does (lock not held). Returns
 * false when the ring is full. */
bool fix_post(fix_t *f, colld_session_t *s, const colld_wire_sqe_t *sqe);
/* Consume every completion of a session as a client does; returns how many. */
int fix_reap(fix_t *f, colld_session_t *s);
/* End a session as its socket closing would (its ranks leave, peers get PEER_LOST). The session
 * object stays valid (dead) until fix_stop. */
void fix_session_end(fix_t *f, colld_session_t *s);
/* End every session, run the engine until nothing is left, free everything. */
void fix_stop(fix_t *f);

/* ---- for in-process unit tests (tests/unit/test_core_*.c) ---- */
/* A descriptor of rank `rank` of c (its session's handle) for collective `seq`: send buffer
 * registration 1 at offset 0, receive buffer registration 2 at offset 0. */
colld_wire_sqe_t fix_sqe(const colld_dcomm_t *c, int rank, uint64_t seq, colld_kind_t kind, colld_dtype_t dtype,
                         colld_redop_t op, uint64_t count, int root);
/* Consume a session's completions as a client does, into out[max]; returns how many. */
int fix_reap_cqes(fix_t *f, colld_session_t *s, colld_wire_cqe_t *out, int max);
/* The memory of registration `id` of a session (NULL when it has none). */
void *fix_reg(colld_session_t *s, uint32_t id);
/* Run engine rounds until pred(arg) holds (lock not held when it is asked), at most `ms`
 * milliseconds (a 0.1 ms pause between rounds). Returns pred's last answer. */
bool fix_run_until(fix_t *f, bool (*pred)(void *arg), void *arg, int ms);
/* Publish collective call->seq in rank `rank`'s fast-area slot, as the rank does (its call and
 * arrival time; the payload is not written). */
void fix_fast_publish(colld_dcomm_t *c, int rank, const colld_wire_sqe_t *call, uint64_t arrival_ns);

#endif /* COLLD_TESTS_CORE_FIXTURE_H */
