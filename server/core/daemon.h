/*
 * daemon.h - the objects of the colld daemon and how they relate.
 *
 *   colld_daemon_t   one per process: configuration, the sessions, the communicators, the engine.
 *   colld_session_t  one connected client process (session socket + shared-memory rings).
 *   colld_reg_t      a memory registration of a session (a mapped, sealed memfd).
 *   colld_dcomm_t    a communicator: nranks members, each a (session, handle) pair.
 *   colld_member_t   one rank of a communicator; owns the FIFO of that rank's posted operations.
 *   colld_op_t       one validated work descriptor waiting for its peers.
 *
 * Threads: the libuv loop (session sockets, signals), the gRPC completion-queue thread (control
 * RPCs), the engine thread (rings, matching, execution) and the host worker pool. All daemon state
 * is guarded by daemon->lock; the engine drops the lock only while a matched collective executes,
 * and reference counts keep the sessions and mappings of that collective alive meanwhile.
 */
#ifndef COLLD_SERVER_DAEMON_H
#define COLLD_SERVER_DAEMON_H

#include "common/config.h"
#include "proto/wire.h"
#include "server/observability/metrics.h"
#include "server/control/rpc/rpc_server.h"

#include <colld/colld.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#define COLLD_MAX_RANKS 1024
#define COLLD_DETAIL_LEN 512
#define COLLD_NAME_LEN 64

typedef struct colld_daemon colld_daemon_t;
typedef struct colld_session colld_session_t;
typedef struct colld_dcomm colld_dcomm_t;
typedef struct colld_member colld_member_t;
typedef struct colld_op colld_op_t;
typedef struct colld_host_pool colld_host_pool_t;
typedef struct colld_events colld_events_t;
typedef struct colld_cluster colld_cluster_t;
typedef struct colld_xcomm colld_xcomm_t;
typedef struct colld_gpus colld_gpus_t;
typedef struct colld_gpu_comm colld_gpu_comm_t;
typedef struct colld_tenants colld_tenants_t;
typedef struct colld_ctl colld_ctl_t;
typedef struct colld_listener colld_listener_t;

/* A listening unix socket served by the loop (fds.c): accepts with SO_PEERCRED and survives
 * descriptor exhaustion (see fds.c). `on_accept` takes the new connection's fd. */
typedef void (*colld_accept_fn)(colld_listener_t *l, int fd, uid_t uid, gid_t gid, pid_t pid);
/* Tell a connection the daemon cannot serve why, before it is closed (never blocks). */
typedef void (*colld_refuse_fn)(int fd, colld_status_t st, const char *why);
struct colld_listener {
    colld_daemon_t *d;
    const char *what;         /* "session socket", for messages */
    int fd;
    uv_poll_t poll;
    uv_timer_t pause;         /* restarts accepting after a pause */
    bool open, paused;
    colld_accept_fn on_accept;
    colld_refuse_fn refuse;   /* NULL: the connection is just closed */
    uint64_t shed;            /* connections refused for lack of descriptors */
};

/* Daemon configuration (filled from the table in config_table.c). */
typedef struct {
    char *socket;        /* session socket; the gRPC socket is <socket>.rpc */
    char *config;        /* config file */
    char *log_level;
    char *log_subsys;
    char *log_file;
    int64_t workers;       /* host backend threads */
    int64_t timeout_ms;    /* default collective/join timeout */
    int64_t max_timeout_ms;
    int64_t ring_entries;  /* per session, submission and completion */
    int64_t spin_us;       /* engine busy-poll before sleeping */
    uint64_t parallel_min_bytes; /* smaller collectives run on the engine thread alone */
    int64_t max_sessions;
    int64_t max_comms_per_session;
    uint64_t max_registered_bytes; /* per session */
    int64_t max_registrations;     /* all tenants; 0: derived from vm.max_map_count (tenant.c) */
    /* per-tenant limits (tenant.c); collctl policy overrides them per uid */
    int64_t max_sessions_per_tenant;
    int64_t max_comms_per_tenant;
    int64_t max_joining_ranks_per_tenant;
    int64_t max_regs_per_tenant;
    uint64_t max_registered_bytes_per_tenant;
    int64_t max_followers_per_tenant;
    int64_t max_rpc_conns_per_tenant;
    /* descriptors and the control socket (fds.c, ctl_listen.c) */
    int64_t max_fds;           /* soft RLIMIT_NOFILE to run with; 0: the hard limit */
    int64_t max_rpc_conns;     /* connections to the control socket, all tenants */
    int64_t rpc_handshake_ms;  /* a control connection without a call for this long is closed */
    int64_t self_probe_ms;     /* interval of the control plane's self-probe; 0: off */
    int64_t self_probe_failures; /* consecutive failed probes that end the daemon */
    char *socket_mode_text;
    unsigned socket_mode;   /* parsed from socket_mode_text */
    int64_t trace_entries;  /* flight recorder depth per communicator */
    int64_t event_backlog;  /* events kept */
    char *tenant_caps_text; /* "uid:ms,uid:ms" */
    char *metrics_addr;     /* HOST:PORT or NULL */
    /* multi-node (cluster.c); off without --listen */
    char *listen;           /* HOST:PORT peers reach this daemon at */
    char *node_name;        /* default: the host name */
    char *secret_file;      /* cluster secret */
    int64_t net_conns;      /* TCP connections this daemon opens to each peer */
    uint64_t net_chunk;     /* bytes per network message of a collective */
    int64_t heartbeat_ms;
    int64_t heartbeat_misses;
    int64_t peer_handshake_ms; /* an accepted peer connection must authenticate within this */
    uint64_t net_small_bytes; /* all-reduces up to this size use recursive doubling */
    char *net_algo_text;    /* auto, ring or rd */
    int net_algo;           /* COLLD_NET_ALGO_* parsed from net_algo_text */
    uint64_t fast_path_bytes; /* per-rank inputs up to this run on the fast area (0: off) */
    int64_t drain_timeout_ms; /* SIGTERM drains this long before stopping (0: stop at once) */
} colld_daemon_config_t;

/* Inter-node all-reduce algorithm (policy override; auto chooses by size). */
enum { COLLD_NET_ALGO_AUTO = 0, COLLD_NET_ALGO_RING = 1, COLLD_NET_ALGO_RD = 2 };

typedef struct colld_reg {
    uint32_t id;
    int refs;             /* 1 for the session's table + 1 per op in flight */
    void *base;           /* host: the daemon's mapping; GPU: the device address (never dereferenced) */
    uint64_t size;
    /* GPU memory (gpu.c) */
    bool cuda;
    int gpu;              /* index of the daemon's GPU that holds it */
    int how;              /* colld_cuda_export_t */
    int users;            /* registrations of the same IPC allocation by the session (dereg drops one) */
    uint8_t ipc[COLLD_WIRE_CUDA_IPC_BYTES];
    colld_daemon_t *daemon;
    uid_t tenant;         /* charged to this uid (tenant.c) ... */
    uint64_t charged;     /* ... these bytes; 0: not charged */
    struct colld_reg *next;
} colld_reg_t;

struct colld_session {
    colld_daemon_t *daemon;
    uint64_t id;
    uint8_t token[COLLD_WIRE_TOKEN_BYTES];
    pid_t pid;
    uid_t uid;
    gid_t gid;
    int role;
    int64_t attached_ms;
    char name[48];
    bool attached;        /* the Attach RPC was made */
    bool charged;         /* holds a unit of its tenant's COLLD_LIMIT_SESSIONS */
    bool dead;            /* socket closed or protocol error: no new work */
    bool kill_requested;  /* engine asks the loop to drop this session */
    int refs;             /* list membership + ops in flight + executing collectives */

    int fd;               /* session socket */
    uv_poll_t poll;
    bool poll_active;
    uint8_t rbuf[sizeof(colld_wire_msg_t)];
    size_t rlen;
    int pending_fd;       /* fd received with the message being assembled */

    int efd;              /* eventfd: client -> daemon doorbell */
    int shm_fd;
    colld_wire_shm_t *shm;
    size_t shm_size;
    colld_wire_sqe_t *sqes;
    colld_wire_cqe_t *cqes;
    uint32_t entries;     /* same for sq and cq */
    uint64_t sq_tail;     /* daemon's own copy */
    uint64_t cq_head;     /* daemon's own copy */
    uint32_t in_flight;   /* accepted descriptors whose completion is not posted yet */
    bool cq_wait;         /* descriptors wait for completion space: cq.need_wakeup is set (engine.c) */

    colld_reg_t *regs;
    uint32_t next_reg_id;
    /* GPU stream flags (gpu.c): created on the first COLLD_MSG_GPU_FLAGS, NULL before */
    colld_wire_gpu_flag_t *gpu_flags;
    size_t gpu_flags_size;
    int gpu_flags_fd;
    uint64_t gpu_flags_dptr; /* the same memory as the GPUs address it */
    uint32_t gpu_lines;
    uint64_t registered_bytes;
    unsigned nuids;       /* unique ids issued and not yet used */

    colld_member_t **handles; /* index = handle; handle 0 unused */
    uint32_t nhandles;
    uint32_t handle_hint;     /* no free handle below this one */
    unsigned ncomms;

    colld_session_t *next;
};

typedef enum {
    COLLD_COMM_JOINING = 0,
    COLLD_COMM_READY = 1,
    COLLD_COMM_BROKEN = 2,  /* a fault: every later operation fails with `error` */
    COLLD_COMM_CLOSING = 3, /* a rank destroyed its handle: later operations fail */
} colld_comm_state_t;

struct colld_op {
    colld_wire_sqe_t d;
    colld_session_t *session; /* holds a reference */
    colld_member_t *member;
    colld_reg_t *send_reg, *recv_reg;
    void *send_ptr, *recv_ptr;
    uint64_t arrival_ns;
    colld_op_t *next;
};

struct colld_member {
    colld_dcomm_t *comm;
    colld_session_t *session; /* NULL once the rank left (destroy or death) */
    int rank;
    uint32_t handle;
    uint64_t next_seq;        /* the sequence number this rank must post next */
    colld_op_t *head, *tail;  /* posted, not yet executed */
    colld_rpc_call_t *join_call; /* CommInit answered when all ranks joined */
    pid_t pid;
    bool left;
    bool remote;              /* the rank lives on another node (multi-node communicators) */
    int node;                 /* its node index once formed (multi-node) */
    bool notify;              /* owes its session a notice that the communicator broke */
    bool gpu_base_set;        /* posted a stream-ordered collective: gpu_base is its flag base */
    uint32_t gpu_base;
    uint32_t gpu_last;        /* flag value of its last stream-ordered collective */
    /* straggler statistics: how long after the first rank this rank posted each executed one */
    uint64_t late_sum_ns, late_max_ns, late_samples;
};

/* One collective in a communicator's flight recorder. Times are CLOCK_MONOTONIC ns; the
 * per-rank arrival times live in colld_dcomm_t.trace_arrivals (0: never arrived). */
typedef struct {
    uint64_t seq;
    uint64_t count;
    uint8_t kind, dtype, redop;
    uint8_t flags;  /* COLLD_SQE_FAST: the ranks ran it on the fast area */
    int32_t root;
    colld_status_t status;
    uint64_t first_ns, start_ns, end_ns; /* start_ns 0: never started */
} colld_trace_rec_t;

struct colld_dcomm {
    uint64_t id;
    uint8_t unique_id[COLLD_WIRE_UNIQUE_ID_BYTES];
    uid_t tenant;
    int nranks;
    int joined;
    int present;              /* members not yet left */
    char name[COLLD_NAME_LEN];
    int timeout_ms;
    colld_comm_state_t state;
    colld_status_t error;
    char error_detail[COLLD_DETAIL_LEN];
    uint64_t created_ns;
    uint64_t exec_seq;        /* next sequence number to execute */
    uint64_t ops_completed, ops_failed;
    int refs;                 /* 1 while members remain + 1 per executing collective */
    int notices_pending;      /* members whose break notice is not posted yet */
    /* Members. A single-node communicator holds only the ranks that joined while it forms
     * (`joiners`, memory proportional to them, so a tenant cannot make the daemon hold nranks
     * members for ranks that never come); `ranks` is made when it forms. A multi-node one has
     * `ranks` from the start (the root daemon places every rank while it forms). Outside comm.c,
     * iterate a communicator that may be forming with colld_comm_nslots / colld_comm_slot. */
    colld_member_t *ranks;    /* [nranks] by rank, or NULL while a single-node communicator forms */
    colld_member_t **joiners; /* while forming (single-node): [njoiners] in join order */
    int njoiners, joiners_cap;
    uint64_t *joined_mask;    /* while forming (single-node): bit r = rank r has joined */
    bool joining_charged;     /* nranks charged to the tenant's joining ranks (tenant.c) until it forms */
    /* flight recorder (recorder.c): a ring of trace_cap records, newest at trace_count - 1 */
    colld_trace_rec_t *trace;
    uint64_t *trace_arrivals; /* [trace_cap][nranks] */
    unsigned trace_cap;
    uint64_t trace_count;     /* records ever written */
    uint64_t trace_failed_seq; /* the collective last recorded as failed (recorded once) */
    colld_xcomm_t *x;         /* multi-node state (cluster.c), NULL for a single-node communicator */
    bool fault_from_peer;     /* the fault being recorded came from another node: do not echo it */
    colld_wire_fast_t *fast;  /* fast area (fast.c), NULL when none; the tenant's memory */
    size_t fast_size;
    uint64_t fast_stride;     /* the daemon's own copy of the slot stride: never read back from the area */
    int fast_fd;
    colld_wire_fast_stats_t *fast_seen; /* [nranks] the ranks' counters already in the metrics */
    colld_gpu_comm_t *gpu;    /* GPU state (gpu.c), NULL until the first stream-ordered collective */
    colld_dcomm_t *next, *prev; /* daemon->comms (prev: unlinked in O(1) when freed) */
};

typedef struct colld_issued_uid {
    uint8_t bytes[COLLD_WIRE_UNIQUE_ID_BYTES];
    uid_t tenant;
    colld_session_t *owner;
    struct colld_issued_uid *next;
} colld_issued_uid_t;

/* A tenant's policy (collctl policy, --tenant-timeout-caps). */
typedef struct colld_policy {
    uid_t uid;
    int max_timeout_ms;       /* > 0: cap of this tenant's communicator timeouts */
    int net_algo;             /* -1: the daemon's --net-algo; else COLLD_NET_ALGO_* */
    struct colld_policy *next;
} colld_policy_t;

/* An answer to send once daemon->lock is released (replies never go out under the lock). */
typedef struct colld_reply {
    colld_rpc_call_t *call;
    colld_status_t status;
    char detail[COLLD_DETAIL_LEN];
    uint32_t handle;
    uint64_t comm_id;
    int timeout_ms;
    struct colld_reply *next;
} colld_reply_t;

struct colld_daemon {
    colld_daemon_config_t cfg;
    pthread_mutex_t lock;
    uv_loop_t loop;
    colld_listener_t sessions_l; /* the session socket */
    int spare_fd;             /* kept to accept-and-refuse when out of descriptors (fds.c) */
    colld_ctl_t *ctl;         /* the control socket's connections (ctl_listen.c) */
    uv_signal_t sigterm, sigint;
    uv_async_t async;         /* engine -> loop: drop sessions with kill_requested */
    int lock_fd;
    char lock_path[256], rpc_path[256], rpc_addr[272];
    int64_t started_ms;
    bool stopping;
    /* Draining (main.c): set under lock; new communicators are refused (control.c) and /readyz
     * answers 503 until the daemon stops at drain_deadline_ms (wall clock) or earlier. */
    bool draining;
    int64_t drain_deadline_ms;
    uv_timer_t drain_timer;   /* loop: checks whether the drain is done */
    uv_timer_t watchdog;      /* loop: WATCHDOG=1 to systemd (notify.c), when it asks for it */

    colld_rpc_server_t *rpc;
    colld_session_t *sessions;
    unsigned nsessions;
    uint64_t next_session_id;
    colld_dcomm_t *comms;
    uint64_t next_comm_id;
    colld_issued_uid_t *uids;

    /* engine */
    pthread_t engine_thread;
    bool engine_running;
    int epfd;                 /* session eventfds + wake_fd */
    int wake_fd;              /* eventfd: control paths -> engine */
    colld_host_pool_t *pool;
    colld_op_t *op_free;      /* recycled operation records (engine.c) */
    unsigned op_free_n;

    colld_metrics_t *metrics; /* counters (metrics.c), under lock; HTTP endpoint on the loop */
    colld_events_t *events;   /* event backlog and streams (events.c); NULL once stopped */
    colld_policy_t *policies; /* per tenant */
    colld_tenants_t *tenants; /* what each tenant holds, against its limits (tenant.c) */
    colld_cluster_t *cluster; /* peers and multi-node communicators (cluster.c); NULL without --listen */
    colld_gpus_t *gpus;       /* the CUDA backend (gpu.c); NULL without a usable GPU */
    char gpu_none[256];       /* why there is no CUDA backend */
};

/* A matched collective, taken out of the members' queues while it executes. ops[] is by rank;
 * a multi-node communicator's remote ranks have NULL. */
typedef struct colld_coll {
    colld_dcomm_t *comm;
    colld_status_t status;
    uint64_t start_ns, end_ns;
    struct colld_coll *next;
    void *gpu_event;          /* stream-ordered (gpu.c): the CUevent after the kernels and flags */
    int gpu_lead;             /* the GPU whose stream writes the done flags */
    char gpu_why[COLLD_DETAIL_LEN / 2]; /* why the launch failed */
    colld_op_t *ops[]; /* [nranks], by rank */
} colld_coll_t;

/* ---- fds.c: descriptor exhaustion ---- */
/* Raise the soft fd limit (--max-fds, else the hard limit), warn when it cannot cover the
 * configured maxima, take the spare descriptor. Returns 0, or -1 after printing why. */
int colld_fds_init(colld_daemon_t *d);
void colld_fds_fini(colld_daemon_t *d);
/* Create a unix socket at `path` (a stale file there is replaced: the lock file is held) with
 * the configured mode and serve it on the loop. Returns 0, or -1 with errno set. */
int colld_listener_open(colld_daemon_t *d, colld_listener_t *l, const char *what, const char *path,
                        colld_accept_fn on_accept, colld_refuse_fn refuse);
/* Stop accepting and close the socket (loop thread; the handles close when the loop runs). */
void colld_listener_close(colld_listener_t *l);
/* How many of `max` connections are kept for operators (colld_uid_is_admin, tenant.h): root and
 * the daemon's own uid get them, and are never refused by a per-tenant limit on sessions or
 * control connections. */
unsigned colld_admin_reserve(int64_t max);

/* ---- ctl_listen.c: connections to the control socket ---- */
/* Accept <socket>.rpc on the loop and hand the connections to the gRPC server (which must exist),
 * within per-tenant and global caps; start the self-probe. Returns 0 or -1. */
int colld_ctl_start(colld_daemon_t *d);
/* Stop accepting (loop thread); connections end with the gRPC server. */
void colld_ctl_stop(colld_daemon_t *d);
/* Free what is left once the gRPC server is destroyed and the loop has run. */
void colld_ctl_free(colld_daemon_t *d);
/* Control connections served now, refused ones still held, refused ones so far (loop thread). */
void colld_ctl_stats(const colld_daemon_t *d, unsigned *admitted, unsigned *refused_held, uint64_t *refused_total);
/* Control connections refused for lack of descriptors so far (loop thread). */
uint64_t colld_ctl_shed(const colld_daemon_t *d);

/* ---- session.c: the session socket ---- */
int colld_sessions_listen(colld_daemon_t *d);
void colld_sessions_close_all(colld_daemon_t *d);
colld_session_t *colld_session_find(colld_daemon_t *d, uint64_t id, const uint8_t *token);
void colld_session_unref(colld_session_t *s);
void colld_session_release_reg(colld_reg_t *r);
colld_reg_t *colld_session_find_reg(colld_session_t *s, uint32_t id);
/* Create a session's shared memory (rings) and eventfd. Returns 0 or -1. */
int colld_session_make_rings(colld_session_t *s);
/* The daemon's side of a session ending (lock held): its ranks leave, its unique ids go, the engine
 * and the session list forget it; the caller drops the list's reference. */
void colld_session_forget(colld_session_t *s, const char *why, colld_reply_t **replies);
/* Handle one complete session-socket message as the loop's read path does, `fd` (-1: none) being
 * the descriptor that came with it (taken): the entry point of in-process tests and fuzzers
 * (lock not held; replies go to s->fd). Returns -1 when the session must be dropped. */
int colld_session_dispatch(colld_session_t *s, const colld_wire_msg_t *m, int fd);
/* Drop every session the engine marked with kill_requested (loop thread). */
void colld_sessions_reap(colld_daemon_t *d);

/* ---- comm.c: communicators ---- */
colld_status_t colld_comm_issue_uid(colld_daemon_t *d, colld_session_t *s, uint8_t *out);
void colld_comm_join(colld_daemon_t *d, colld_session_t *s, const uint8_t *uid, int nranks, int rank,
                     int timeout_ms, const char *name, colld_rpc_call_t *call, colld_reply_t **replies);
colld_status_t colld_comm_leave(colld_daemon_t *d, colld_session_t *s, uint32_t handle, char *detail,
                                size_t detail_len, colld_reply_t **replies);
/* Break a communicator: record the error and fail every queued operation and pending join.
 * `rank` is the rank at fault when one is (-1 otherwise); it goes into the event. */
void colld_comm_break(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st, int rank, const char *detail,
                      colld_reply_t **replies);
/* Abort a communicator for every rank (COLLD_ERR_ABORTED); `who` says by whom, for the detail. */
void colld_dcomm_abort(colld_daemon_t *d, colld_dcomm_t *c, int rank, const char *who, colld_reply_t **replies);
/* The timeout cap of a tenant's policy, 0 when none. */
int colld_policy_cap(const colld_daemon_t *d, uid_t uid);
/* Parse "uid:ms,uid:ms" into the policy list. Returns 0, or -1 with a message in err. */
int colld_policy_parse(colld_daemon_t *d, const char *text, char *err, size_t err_len);
/* Set (or replace) a tenant's cap; returns 0 or -1 (no memory). Clearing a missing one is a no-op. */
int colld_policy_set(colld_daemon_t *d, uid_t uid, int max_timeout_ms);
void colld_policy_clear(colld_daemon_t *d, uid_t uid);
void colld_policy_free(colld_daemon_t *d);
void colld_comm_unref(colld_daemon_t *d, colld_dcomm_t *c);
/* A session is gone: its ranks leave every communicator, which breaks with PEER_LOST. */
void colld_comm_session_gone(colld_daemon_t *d, colld_session_t *s, colld_reply_t **replies);
/* Check join timeouts; returns the earliest future deadline in ns (UINT64_MAX if none). */
uint64_t colld_comm_check_join_timeouts(colld_daemon_t *d, uint64_t now, colld_reply_t **replies);
const char *colld_comm_state_name(colld_comm_state_t s);
colld_member_t *colld_comm_member(colld_session_t *s, uint32_t handle);
/* The members of a communicator that are here (lock held): slot i in [0, colld_comm_nslots(c)) is
 * rank i once it formed (or multi-node), the i-th rank to join while a single-node one forms
 * (slot->rank says which). A slot of a formed communicator may be a rank that left or is remote. */
int colld_comm_nslots(const colld_dcomm_t *c);
colld_member_t *colld_comm_slot(const colld_dcomm_t *c, int i);
void colld_reply_add(colld_reply_t **list, colld_rpc_call_t *call, colld_status_t st, const char *detail);
/* Send and free replies collected under the lock (call without the lock). */
void colld_replies_send(colld_reply_t *list);

/* ---- engine.c ---- */
int colld_engine_start(colld_daemon_t *d);
void colld_engine_stop(colld_daemon_t *d);
/* One round of the engine on the caller's thread, without sleeping (in-process tests and fuzzers,
 * with no engine thread running; d->engine_running must be true). Returns the work found, -1
 * when the engine is stopped. */
int colld_engine_run_once(colld_daemon_t *d);
/* Wake the engine (after a control path changed state it must look at). */
void colld_engine_wake(colld_daemon_t *d);
int colld_engine_add_session(colld_daemon_t *d, colld_session_t *s);
void colld_engine_remove_session(colld_daemon_t *d, colld_session_t *s);
/* Post one completion to a session's completion ring (lock held). */
void colld_engine_complete(colld_session_t *s, uint32_t handle, uint64_t seq, colld_status_t st);
/* Post owed break notices of a communicator where the completion rings have room (lock held). */
void colld_engine_post_notices(colld_dcomm_t *c);
/* Fail and free one queued op (lock held). */
void colld_engine_fail_op(colld_op_t *op, colld_status_t st);
/* Retire the fast-path records of a communicator whose collectives every rank has finished, so
 * that a leave or a lost rank does not fail them (lock held). */
void colld_engine_settle_fast(colld_daemon_t *d, colld_dcomm_t *c, colld_reply_t **replies);
/* Post the results of an executed collective with k->status and free it (lock held). */
void colld_engine_finish(colld_daemon_t *d, colld_coll_t *k);
/* The first local op of a collective (a multi-node one has NULL for remote ranks). */
colld_op_t *colld_coll_lead(const colld_coll_t *k);

/* Every rank has joined: the communicator is ready; answer the joins (lock held). */
void colld_comm_formed(colld_daemon_t *d, colld_dcomm_t *c, colld_reply_t **replies);
/* Take an issued unique id (it names one communicator only). False if it was not issued here to
 * this tenant or is used already (lock held). */
bool colld_comm_take_uid(colld_daemon_t *d, const uint8_t *uid, uid_t tenant);

/* ---- cluster.c: peers, multi-node communicators (membership and faults) ---- */
/* Start the peer transport when --listen is set (0 otherwise, or on success); -1 on error. */
int colld_cluster_start(colld_daemon_t *d);
void colld_cluster_stop(colld_daemon_t *d);
/* Stamp an issued unique id with this daemon's address when it listens (a multi-node id). */
void colld_cluster_stamp_uid(const colld_daemon_t *d, uint8_t *uid);
/* The root daemon's address in a multi-node unique id (into buf), or NULL for a local id. */
const char *colld_uid_root_addr(const uint8_t *uid, char *buf, size_t len);
/* First local join of a multi-node communicator: attach its multi-node state. Returns 0, or -1
 * with a detail and status. (lock held) */
int colld_cluster_comm_init(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t *st, char *detail, size_t len);
/* A local rank joined a multi-node communicator: tell the root daemon (lock held). */
void colld_cluster_joined(colld_daemon_t *d, colld_dcomm_t *c, colld_member_t *m);
/* A multi-node communicator failed here (lock held): tell the other daemons, unless the fault
 * came from one of them. */
void colld_cluster_comm_failed(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st, int rank, const char *detail);
/* Hand a matched collective of a multi-node communicator to the network thread (lock held). */
void colld_cluster_submit(colld_daemon_t *d, colld_coll_t *k);
/* Free a communicator's multi-node state (lock held, no collective in flight). */
void colld_xcomm_free(colld_xcomm_t *x);
/* Peers and counters for collctl status (call without the lock). Returns the number of peers. */
struct colld_net_peer_info;
size_t colld_cluster_peers(colld_daemon_t *d, struct colld_net_peer_info *out, size_t max, uint64_t *sent,
                           uint64_t *received, uint64_t *refused);
/* Close the connections to a peer (operator, tests). Returns 0 or -1 (no such peer up). */
int colld_cluster_disconnect(colld_daemon_t *d, const char *peer);
/* "auto", "ring", "rd" -> COLLD_NET_ALGO_*, -1 if unknown; and back. */
int colld_net_algo_parse(const char *text);
const char *colld_net_algo_name(int algo);
/* This daemon's node name and peer address (cluster running). */
const char *colld_cluster_node_name(const colld_daemon_t *d);
const char *colld_cluster_listen_addr(const colld_daemon_t *d);
/* The node name of a rank's daemon for display ("" when local or unknown) (lock held). */
const char *colld_cluster_rank_node(const colld_dcomm_t *c, int rank);
/* The collective a multi-node communicator is running among the nodes, as collctl trace shows
 * the one being waited for (status COLLD_INPROGRESS, arrivals[nranks] of the local ranks).
 * False when there is none (lock held). */
bool colld_cluster_trace_pending(const colld_dcomm_t *c, colld_trace_rec_t *t, uint64_t *arrivals);

/* ---- gpu.c: the CUDA backend ---- */
/* Load the driver and take every visible GPU (none is fine: gpu_none says why). */
int colld_gpu_start(colld_daemon_t *d);
void colld_gpu_stop(colld_daemon_t *d);
int colld_gpu_count(const colld_daemon_t *d);
/* COLLD_MSG_REG_CUDA (loop thread, lock not held): open a GPU allocation for a session. */
colld_status_t colld_gpu_register(colld_session_t *s, const colld_wire_msg_t *m, int fd, uint32_t *reg_id,
                                  char *detail, size_t len);
/* Close a GPU registration's mapping (its last reference went; lock held). */
void colld_gpu_release_reg(colld_reg_t *r);
/* COLLD_MSG_GPU_FLAGS (lock not held): the session's flag area (made on first use); a dup of its
 * fd, or -1 with a status and detail. */
int colld_gpu_flags_dup(colld_session_t *s, uint64_t *size, uint32_t *lines, colld_status_t *st, char *detail,
                        size_t len);
void colld_gpu_session_free(colld_session_t *s);
/* A matched stream-ordered collective: wait for the ranks' ready flags (lock held). */
void colld_gpu_submit(colld_daemon_t *d, colld_coll_t *k);
/* Poll the GPU collectives (lock held): finish those whose kernels are done, move those every
 * rank's stream has reached to *launch (in order), time out the others. Returns work done. */
int colld_gpu_progress(colld_daemon_t *d, uint64_t now, uint64_t *deadline, colld_coll_t **launch,
                       colld_reply_t **replies);
/* Launch a list from colld_gpu_progress (engine thread, lock NOT held), then hand it back to
 * colld_gpu_launched (lock held). */
void colld_gpu_launch(colld_daemon_t *d, colld_coll_t *list);
void colld_gpu_launched(colld_daemon_t *d, colld_coll_t *list, colld_reply_t **replies);
/* A stream-ordered collective of the communicator is matched and not finished (lock held). */
bool colld_gpu_busy(const colld_dcomm_t *c);
/* Any GPU collective not finished (the engine keeps polling). */
bool colld_gpu_outstanding(const colld_daemon_t *d);
/* The communicator broke: fail its matched GPU collectives, release every rank's stream (lock held). */
void colld_gpu_comm_broken(colld_daemon_t *d, colld_dcomm_t *c);
/* A stream-ordered collective of `rank` with flag value `value` failed: release the rank's
 * stream past it, once no kernel of the communicator runs (lock held). */
void colld_gpu_owe_release(colld_dcomm_t *c, int rank, uint32_t value, colld_status_t st);
void colld_gpu_comm_free(colld_daemon_t *d, colld_dcomm_t *c);

/* ---- fast.c: the fast area of a single-node communicator ---- */
/* Create it when the communicator forms (lock held). Returns 0 (also when there is none: off,
 * multi-node, too many ranks) or -1 (could not be made: the engine path serves everything). */
int colld_fast_create(colld_daemon_t *d, colld_dcomm_t *c);
void colld_fast_free(colld_daemon_t *d, colld_dcomm_t *c);
/* Where rank `rank` is in collective `seq` by its slots: it published it (its call and arrival
 * time in *call and *arrival_ns), it has gone past it, or neither yet (lock held). */
typedef enum { COLLD_FAST_ABSENT = 0, COLLD_FAST_PUBLISHED = 1, COLLD_FAST_PASSED = 2 } colld_fast_seen_t;
colld_fast_seen_t colld_fast_rank_at(const colld_dcomm_t *c, int rank, uint64_t seq, colld_wire_sqe_t *call,
                                     uint64_t *arrival_ns);
/* Add what the ranks finished on the fast area since the last look to the metrics (lock held). */
void colld_fast_harvest(colld_daemon_t *d, colld_dcomm_t *c);
/* The communicator broke: write its error into the area and wake every waiting rank (lock held). */
void colld_fast_break(colld_dcomm_t *c);
/* A new descriptor of the area for a member's session (lock held): the fd and *size, or -1 with
 * *st and a detail. */
int colld_fast_dup(colld_session_t *s, uint32_t handle, uint64_t *size, colld_status_t *st, char *detail, size_t len);

/* ---- recorder.c: flight recorder and straggler statistics ---- */
int colld_recorder_init(colld_daemon_t *d, colld_dcomm_t *c);
void colld_recorder_free(colld_dcomm_t *c);
/* An executed collective: ops[nranks] by rank, its execution window and status. Returns the
 * first rank's arrival time. */
uint64_t colld_recorder_executed(colld_dcomm_t *c, colld_op_t *const *ops, uint64_t start_ns, uint64_t end_ns,
                                 colld_status_t st);
/* The communicator failed while waiting for collective exec_seq: record the ranks that had
 * posted it (once per collective). */
void colld_recorder_failed(colld_dcomm_t *c, colld_status_t st, uint64_t now);
/* The rank with the largest mean lateness, -1 when none lags by COLLD_STRAGGLER_MIN_NS. */
int colld_recorder_slowest(const colld_dcomm_t *c);
#define COLLD_STRAGGLER_MIN_NS 100000ull /* 100 us */
const char *colld_kind_name(unsigned kind);
const char *colld_dtype_name(unsigned dtype);
const char *colld_redop_name(unsigned redop);

/* ---- events.c: the event backlog and the Events stream ---- */
int colld_events_start(colld_daemon_t *d);
/* Finish every stream and free the backlog (before the gRPC server is destroyed). */
void colld_events_stop(colld_daemon_t *d);
/* Record an event (daemon->lock held; never blocks on a subscriber). `c` may be NULL; with a
 * communicator, the event belongs to its tenant, else to `uid`. */
void colld_event(colld_daemon_t *d, const char *type, const colld_dcomm_t *c, int rank, pid_t pid,
                 uint64_t session_id, uid_t uid, colld_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));
/* Serve an Events call: backlog, then live events if follow. Takes the call. */
void colld_events_subscribe(colld_daemon_t *d, colld_rpc_call_t *call, bool follow, uint32_t backlog,
                            bool only_new, bool admin, uid_t uid);
/* The event type of a communicator fault. */
const char *colld_event_type_of(colld_status_t st);

/* ---- control.c: gRPC handlers ---- */
int colld_control_start(colld_daemon_t *d);
void colld_control_stop(colld_daemon_t *d);
/* The control-plane methods (for colld_rpc_server_inject). */
const colld_rpc_method_t *colld_control_methods(size_t *n);

/* ---- backend_host.c: the host backend ---- */
typedef struct {
    colld_kind_t kind;
    colld_dtype_t dtype;
    colld_redop_t op;
    int root;
    uint64_t count;
    int n;                /* ranks */
    const void **in;      /* [n] */
    void **out;           /* [n] */
} colld_host_job_t;

/* nthreads: workers including the caller; jobs under parallel_min_bytes run on the caller alone. */
int colld_host_pool_create(int nthreads, uint64_t parallel_min_bytes, colld_host_pool_t **out);
void colld_host_pool_destroy(colld_host_pool_t *p);
/* Run a collective over mapped buffers, split across the pool; the caller participates. */
colld_status_t colld_host_pool_run(colld_host_pool_t *p, const colld_host_job_t *job);

/* ---- config_table.c ---- */
extern const colld_config_entry_t colld_daemon_config_table[];
extern const size_t colld_daemon_config_table_len;

#endif /* COLLD_SERVER_DAEMON_H */
