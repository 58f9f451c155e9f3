/*
 * daemon.h - the objects of the colld daemon core and how they relate.
 *
 *   colld_daemon_t   one per process: configuration, the sessions, the communicators, the engine,
 *                    the backends and modules it is composed of (backend.h).
 *   colld_session_t  one connected client process (session socket + shared-memory rings).
 *   colld_reg_t      a memory registration of a session (a mapped, sealed memfd, or device memory
 *                    a backend opened).
 *   colld_dcomm_t    a communicator: nranks members, each a (session, handle) pair.
 *   colld_member_t   one rank of a communicator; owns the FIFO of that rank's posted operations.
 *   colld_op_t       one validated work descriptor waiting for its peers.
 *   colld_coll_t     a matched collective, handed to the backend that claimed it.
 *   colld_xfer_t     a matched send and receive (point-to-point), handed to the backend that runs
 *                    it (host buffers: the host backend; stream-ordered, GPU buffers: cuda).
 *
 * The core is the files of server/core; each declares its functions in a section below. It knows
 * no backend and no module by name: they are composed in (backend.h), and their state sits behind
 * opaque slots (bslot[]) of the objects here.
 *
 * Threads: the libuv loop (session sockets, signals), the gRPC completion-queue thread (control
 * RPCs), the engine thread (rings, matching, execution) and the backends' own (host workers, the
 * network thread). All daemon state is guarded by daemon->lock; the engine drops the lock only
 * while a matched collective executes, and reference counts keep the sessions and mappings of
 * that collective alive meanwhile. Answers to control calls (colld_reply_add) are collected under
 * the lock and sent after it is released (colld_daemon_unlock).
 */
#ifndef COLLD_SERVER_DAEMON_H
#define COLLD_SERVER_DAEMON_H

#include "common/config.h"
#include "common/err.h"
#include "proto/wire.h"
#include "server/control/rpc/rpc_server.h"
#include "server/core/backend.h"
#include "server/core/health.h"

#include <colld/colld.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#define COLLD_MAX_RANKS 1024
#define COLLD_DETAIL_LEN 512
#define COLLD_NAME_LEN 64
#define COLLD_P2P_TENANTS 16 /* tenants whose point-to-point work one engine pass counts apart (p2p.c) */

typedef struct colld_counters colld_counters_t;
typedef struct colld_metrics colld_metrics_t;
typedef struct colld_events colld_events_t;
typedef struct colld_tenants colld_tenants_t;
typedef struct colld_ctl colld_ctl_t;
typedef struct colld_dl_memory colld_dl_memory_t; /* deadlock.c */
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
    int64_t max_plans_per_session; /* collectives captured into CUDA graphs, held at once (cuda_plan.c) */
    uint64_t max_registered_bytes; /* per session */
    int64_t max_registrations;     /* all tenants; 0: derived from vm.max_map_count (tenant.c) */
    uint64_t max_daemon_bytes;     /* memory allocated for all tenants; 0: derived from the memory limit (tenant.c) */
    /* per-tenant limits (tenant.c); collctl policy overrides them per uid */
    int64_t max_sessions_per_tenant;
    int64_t max_comms_per_tenant;
    int64_t max_joining_ranks_per_tenant;
    int64_t max_regs_per_tenant;
    uint64_t max_registered_bytes_per_tenant;
    int64_t max_followers_per_tenant;
    int64_t max_rpc_conns_per_tenant;
    uint64_t max_daemon_bytes_per_tenant;
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
    char *health_addr;      /* HOST:PORT of /healthz and /readyz alone, or NULL */
    /* multi-node (cluster.c); off without --listen */
    char *listen;           /* HOST:PORT peers reach this daemon at */
    char *node_name;        /* default: the host name */
    char *secret_file;      /* cluster secret */
    char *peers;            /* peer daemons this one may dial for its tenants (server/net/allow.c) */
    int64_t net_conns;      /* TCP connections this daemon opens to each peer */
    uint64_t net_chunk;     /* bytes per network message of a collective */
    int64_t heartbeat_ms;
    int64_t heartbeat_misses;
    int64_t peer_handshake_ms; /* an accepted peer connection must authenticate within this */
    uint64_t net_small_bytes; /* all-reduces up to this size use recursive doubling */
    char *net_algo_text;    /* auto, ring or rd */
    int net_algo;           /* COLLD_NET_ALGO_* parsed from net_algo_text */
    char *net_transport_text; /* auto, ib or tcp (server/net/iblink.c) */
    int net_transport;        /* COLLD_NET_TRANSPORT_* parsed from it */
    char *ib_device;          /* RDMA device name, NULL: the first active one */
    uint64_t fast_path_bytes; /* per-rank inputs up to this run on the fast area (0: off) */
    bool nan_check;           /* --nan-check: reductions refuse NaN and infinite inputs */
    bool gpu_early_launch;    /* --gpu-early-launch: GPU collectives queued as they match (opt-in, issue 28) */
    bool verify_results;      /* --verify-results: all-reduce results are checksummed and compared */
    char *test_ib_fault_file; /* --test-ib-fault-file (test hook): server/net/iblink.c */
    char *test_corrupt_text;  /* --test-corrupt-result (test hook, COLLD_TEST_HOOKS builds): verify.h */
    bool test_corrupt;        /* parsed from it: on, */
    int test_corrupt_rank;    /* a rank, or -1: this node's multi-node result, */
    uint64_t test_corrupt_elem;
    int64_t deadlock_ms;      /* --deadlock-ms: a wait-for cycle this old is reported (0: off) */
    int64_t wait_event_ms;    /* --wait-event-ms: a collective waiting this long is an event (0: off) */
    int64_t gpu_health_ms;    /* --gpu-health-ms: period of the GPU health pass from NVML (0: off) */
    bool deadlock_fail;       /* --deadlock-fail: and its communicators fail with COLLD_ERR_DEADLOCK */
    int64_t drain_timeout_ms; /* SIGTERM drains this long before stopping (0: stop at once) */
} colld_daemon_config_t;

/* Inter-node all-reduce algorithm (policy override; auto chooses by size). */
enum { COLLD_NET_ALGO_AUTO = 0, COLLD_NET_ALGO_RING = 1, COLLD_NET_ALGO_RD = 2 };
/* --net-transport (server/net/iblink.c). */
enum { COLLD_NET_TRANSPORT_AUTO = 0, COLLD_NET_TRANSPORT_IB = 1, COLLD_NET_TRANSPORT_TCP = 2 };

struct colld_reg {
    uint32_t id;
    int refs;             /* 1 for the session's table + 1 per op in flight */
    void *base;           /* host: the daemon's mapping; device memory: its address (never dereferenced) */
    uint64_t size;
    bool device;          /* memory the host cannot touch (opened by a backend's mem_register) */
    int users;            /* registrations of the same memory by the session (dereg drops one) */
    colld_backend_t *backend; /* device memory: the backend that opened it ... */
    void *bpriv;          /* ... and what it keeps of it */
    colld_daemon_t *daemon;
    uid_t tenant;         /* charged to this uid (tenant.c) ... */
    uint64_t charged;     /* ... these bytes; 0: not charged */
    uint64_t mem_charged; /* the daemon's page tables for its mapping, charged to `tenant` (colld_tenant_charge_mem) */
    struct colld_reg *next;
};

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
    uint64_t mem_charged; /* its rings' bytes, charged to its tenant (colld_tenant_charge_mem) */
    bool dead;            /* socket closed or protocol error: no new work */
    bool kill_requested;  /* engine asks the loop to drop this session */
    int refs;             /* list membership + ops in flight + executing collectives */

    int fd;               /* session socket */
    uv_poll_t poll;
    bool poll_active;
    int pidfd;         /* the peer process (SO_PEERCRED's pid), -1 without; watched by pidpoll */
    uv_poll_t pidpoll; /* holds a reference on the session while open (session.c) */
    bool pidpoll_open;
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
    int dl_index;         /* its node in the deadlock check's graph (deadlock.c; engine thread) */

    colld_reg_t *regs;
    uint32_t next_reg_id;
    uint64_t registered_bytes;
    uint64_t seg_charged; /* charged for a GPU registration being assembled (REG_CUDA_SEG), not yet made */
    unsigned nuids;       /* unique ids issued and not yet used */

    colld_member_t **handles; /* index = handle; handle 0 unused */
    uint32_t nhandles;
    uint32_t handle_hint;     /* no free handle below this one */
    unsigned ncomms;

    void *bslot[COLLD_BACKEND_MAX]; /* each backend's own (backend.h), NULL until it makes one */
    colld_session_t *next;
};

typedef enum {
    COLLD_COMM_JOINING = 0,
    COLLD_COMM_READY = 1,
    COLLD_COMM_BROKEN = 2,  /* a fault: every later operation fails with `error` */
    COLLD_COMM_CLOSING = 3, /* a rank destroyed its handle: later operations fail */
} colld_comm_state_t;

/* Where a point-to-point operation is (p2p.c). */
typedef enum {
    COLLD_P2P_QUEUED = 0,  /* waiting for its peer's matching operation */
    COLLD_P2P_RUNNING = 1, /* matched: its transfer runs */
    COLLD_P2P_DONE = 2,    /* finished (p2p_status); its completion waits for the ones before it */
} colld_p2p_state_t;

/* The unmatched sends of one rank to another and the unmatched receives of the second from the
 * first, of one communicator (p2p.c): the k-th send of src to dst meets the k-th receive of dst
 * from src, so each list is in posting order and only their heads can meet. */
typedef struct colld_p2p_pair colld_p2p_pair_t;
struct colld_p2p_pair {
    int src, dst;
    colld_op_t *sends, *sends_tail; /* src's sends to dst, not matched yet */
    colld_op_t *recvs, *recvs_tail; /* dst's receives from src, not matched yet */
    colld_p2p_pair_t *hnext;        /* its bucket of the communicator's index */
    colld_p2p_pair_t *cprev, *cnext; /* on the communicator's list of pairs to look at */
    bool listed;
};

/* An operation. `d` is the client's descriptor as admitted, except d.seq: the collective ordinal
 * (proto/wire.h: the same on every rank for a collective; for a point-to-point operation the
 * ordinal of the rank's next collective), while `id` is the descriptor's own seq, which its
 * completion carries. */
struct colld_op {
    colld_wire_sqe_t d;
    uint64_t id;
    colld_session_t *session; /* holds a reference */
    colld_member_t *member;
    colld_reg_t *send_reg, *recv_reg;
    void *send_ptr, *recv_ptr;
    uint64_t arrival_ns;
    colld_p2p_state_t p2p_state; /* point-to-point operations (p2p.c) */
    colld_status_t p2p_status;
    bool p2p_released;           /* the collectives its rank posted before it have completed */
    uint64_t p2p_batch;          /* its batch (a group's operations on the communicator) of its rank */
    colld_p2p_pair_t *p2p_pair;  /* while unmatched: its pair, and its neighbours in the pair's list */
    colld_op_t *pair_prev, *pair_next;
    colld_op_t *wait_prev, *wait_next; /* while unmatched: the communicator's list in arrival order */
    uint8_t bmark; /* its backend's own mark (cuda: a send or receive whose rank's stream reached its batch) */
    colld_op_t *next;
};

struct colld_member {
    colld_dcomm_t *comm;
    colld_session_t *session; /* NULL once the rank left (destroy or death) */
    int rank;
    uint32_t handle;
    uint64_t next_seq;       /* the operation id (descriptor seq) this rank must post next */
    colld_op_t *head, *tail; /* collectives posted, not yet executed */
    /* Point-to-point operations posted and not yet completed, in posting order (p2p.c), and how
     * many the rank has posted (what turns an operation id into a collective ordinal). */
    colld_op_t *p2p_head, *p2p_tail;
    uint64_t p2p_posted;
    colld_op_t *p2p_open;    /* its first operation not released yet (NULL: all are) */
    uint64_t p2p_batches;    /* batch numbers given */
    uint64_t p2p_walked;     /* the head batch whose stream-ordered operations were made ready */
    bool p2p_linked;         /* its last operation had COLLD_SQE_LINK: the next joins its batch */
    colld_rpc_call_t *join_call; /* CommInit answered when all ranks joined */
    pid_t pid;
    bool left;
    bool remote;              /* the rank lives on another node (communicators spanning nodes) */
    bool notify;              /* owes its session a notice that the communicator broke */
    /* straggler statistics: how long after the first rank this rank posted each executed one */
    uint64_t late_sum_ns, late_max_ns, late_samples;
};

/* One collective in a communicator's flight recorder. Times are CLOCK_MONOTONIC ns; the
 * per-rank arrival times live in colld_dcomm_t.trace_arrivals (0: never arrived). */
typedef struct {
    uint64_t seq;
    uint64_t count;
    uint8_t kind, dtype, redop;
    uint8_t flags;  /* COLLD_SQE_FAST: the ranks ran it on the fast area; COLLD_TRACE_SLOW_LINK */
    int32_t root;
    colld_status_t status;
    uint64_t first_ns, start_ns, end_ns; /* start_ns 0: never started */
} colld_trace_rec_t;
/* colld_trace_rec_t.flags: it finished while a link its communicator runs over was slow. */
#define COLLD_TRACE_SLOW_LINK 0x80u

struct colld_dcomm {
    uint64_t id;
    uint8_t unique_id[COLLD_WIRE_UNIQUE_ID_BYTES];
    uid_t tenant;
    int nranks;
    int joined;
    int present;              /* members not yet left */
    char name[COLLD_NAME_LEN];
    int timeout_ms;
    bool nan_check;           /* a rank asked for --nan-check's checks on this communicator */
    bool verify;              /* a rank asked for --verify-results on this communicator */
    /* Spanning nodes: a link it runs over is slow now ("host0 → host2: 1.1 MB/s, other links
     * ..."), set each second by the net layer's link watch (server/net/links.c); "" when none. */
    char slow_link[160];
    colld_comm_state_t state;
    colld_status_t error;
    char error_detail[COLLD_DETAIL_LEN];
    uint64_t created_ns;
    uint64_t exec_seq; /* next collective (ordinal) to execute */
    uint64_t wait_told; /* exec_seq + 1 of the last collective whose long wait was reported (match.c) */
    int colls_running; /* matched collectives not finished yet */
    /* Point-to-point (p2p.c): operations queued on the members; whether a collective completed
     * since the ranks' operations were last released; the index of the unmatched ones by pair of
     * ranks (a hash table of p2p_nbuckets buckets); the pairs whose heads may meet now; the
     * unmatched operations in arrival order (the oldest times out first). */
    unsigned p2p_queued;
    bool p2p_dirty;
    colld_p2p_pair_t **p2p_buckets;
    unsigned p2p_nbuckets, p2p_npairs;
    colld_p2p_pair_t *p2p_look, *p2p_look_tail;
    colld_op_t *p2p_wait_head, *p2p_wait_tail;
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
    /* Spanning nodes: the backend that forms it (comm_form), NULL for a single-node one. */
    colld_backend_t *former;
    /* Collectives may run beside the engine (the fast area): sequence numbers may be skipped and
     * records (COLLD_SQE_FAST) are accepted. */
    bool side_path;
    /* flight recorder (recorder.c): a ring of trace_cap records, newest at trace_count - 1 */
    colld_trace_rec_t *trace;
    uint64_t *trace_arrivals; /* [trace_cap][nranks] */
    unsigned trace_cap;
    uint64_t trace_count;     /* records ever written */
    uint64_t trace_failed_seq; /* the collective last recorded as failed (recorded once) */
    colld_wire_fast_t *fast;  /* fast area (fast.c), NULL when none; the tenant's memory */
    size_t fast_size;
    uint64_t fast_stride;     /* the daemon's own copy of the slot stride: never read back from the area */
    int fast_fd;
    colld_wire_fast_stats_t *fast_seen; /* [nranks] the ranks' counters already in the metrics */
    void *bslot[COLLD_BACKEND_MAX]; /* each backend's own (backend.h), NULL until it makes one */
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
    bool verify;              /* result verification of this tenant's communicators (collctl policy) */
    struct colld_policy *next;
} colld_policy_t;

/* An answer to a held CommInit call, sent once daemon->lock is released (replies.c). */
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
    bool pidfd_warned; /* a session went without a pidfd watch: said once (session.c) */
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
    colld_reply_t *replies;   /* answers to send once the lock is released (replies.c) */

    /* engine */
    pthread_t engine_thread;
    bool engine_running;
    int epfd;                 /* session eventfds + wake_fd */
    int wake_fd;              /* eventfd: control paths -> engine */
    colld_op_t *op_free;      /* recycled operation records (completion.c) */
    unsigned op_free_n;
    /* cross-communicator deadlock detection (deadlock.c; engine thread, lock held) */
    uint64_t dl_next_ns;         /* the next look */
    colld_dl_memory_t *dl_memory; /* what a look remembers for the next one (NULL: nothing) */
    int dl_budget;                /* waits looked at per tenant and look; 0: COLLD_DEADLOCK_WAITS */
    uint64_t deadlocks;           /* cycles reported */
    /* point-to-point matching work left to each tenant in this engine pass (p2p.c; engine
     * thread, lock held): p2p_budget units per tenant, the first COLLD_P2P_TENANTS tenants
     * counted together, any further one per communicator */
    int p2p_budget; /* 0: COLLD_P2P_BUDGET */
    unsigned p2p_ntenants;
    struct {
        uid_t uid;
        int left;
    } p2p_tenants[COLLD_P2P_TENANTS];

    /* what the daemon is composed of (backend.h) */
    colld_backend_t backends[COLLD_BACKEND_MAX];
    int nbackends;
    const colld_comm_hooks_t *const *modules;
    char device_none[256];    /* why no backend serves device memory (the device backend may overwrite it) */
    /* GPU health (server/core/health.h): published by the device backend's health pass, read by
     * the status RPC, the metrics and doctor; under lock. */
    colld_gpu_health_t *gpu_health; /* [ngpu_health] */
    int ngpu_health;
    char gpu_health_none[192]; /* why there is no GPU health ("" before the first pass) */

    colld_counters_t *counters; /* operation and communicator counters (counters.c), under lock */
    colld_metrics_t *metrics; /* the metrics endpoint (metrics.c) on the loop */
    colld_events_t *events;   /* event backlog and streams (events.c); NULL once stopped */
    colld_policy_t *policies; /* per tenant */
    colld_tenants_t *tenants; /* what each tenant holds, against its limits (tenant.c) */
    /* collctl doctor across nodes: this node's report for a peer's DoctorReq (server/net/gather.c),
     * made by the control plane (server/control/node_report.c), which sets it while it runs; under
     * lock (read there, called without it). Returns 0 with a packed colld.v1.NodeReport of at most
     * cap bytes in *out (malloc'd), or -1 with the reason in err. */
    int (*node_report)(struct colld_daemon *d, uid_t uid, bool admin, int64_t since_unix_us, size_t cap, uint8_t **out,
                       size_t *len, char *err, size_t err_len);
};

/* A matched collective, taken out of the members' queues while it executes. ops[] is by rank;
 * a communicator's remote ranks have NULL. */
struct colld_coll {
    colld_dcomm_t *comm;
    colld_status_t status;
    uint64_t start_ns, end_ns;
    struct colld_coll *next;  /* in its backend's lists */
    colld_backend_t *backend; /* the backend that claimed it */
    void *bpriv;              /* the backend's own (cuda: the event after its kernels) ... */
    int bint;                 /* ... (cuda: the GPU whose stream writes the done flags) */
    void *bcheck;             /* ... (cuda: --nan-check's words its kernels flag, NULL: no check) */
    void *bhand;              /* ... (cuda: its hand-off without the host, NULL: the host's; issue 28) */
    char why[COLLD_DETAIL_LEN / 2]; /* why its backend failed it */
    colld_op_t *ops[];        /* [nranks], by rank */
};

/* A matched send and receive, taken to run while their ops stay queued on their ranks (p2p.c): the
 * completions are posted in each rank's posting order. */
struct colld_xfer {
    colld_dcomm_t *comm;
    colld_op_t *send, *recv;
    colld_status_t status;
    uint64_t start_ns, end_ns;
    struct colld_xfer *next; /* in its backend's list */
};

/* The member behind a session-local handle, or NULL (lock held). */
static inline colld_member_t *colld_comm_member(colld_session_t *s, uint32_t handle)
{
    return handle != 0 && handle < s->nhandles ? s->handles[handle] : NULL;
}

/* The members of a communicator that are here (lock held): slot i in [0, colld_comm_nslots(c)) is
 * rank i once it formed (or multi-node), the i-th rank to join while a single-node one forms
 * (slot->rank says which). A slot of a formed communicator may be a rank that left or is remote. */
static inline int colld_comm_nslots(const colld_dcomm_t *c)
{
    return c->ranks ? c->nranks : c->njoiners;
}

static inline colld_member_t *colld_comm_slot(const colld_dcomm_t *c, int i)
{
    return c->ranks ? &c->ranks[i] : c->joiners[i];
}

/* The pid of rank r, for an event or a message; 0 when it is not here. */
static inline pid_t colld_comm_rank_pid(const colld_dcomm_t *c, int r)
{
    if (r < 0 || r >= c->nranks)
        return 0;
    for (int i = 0; i < colld_comm_nslots(c); i++)
        if (colld_comm_slot(c, i)->rank == r)
            return colld_comm_slot(c, i)->pid;
    return 0;
}

/* The status of the operations that were waiting when the communicator failed: its error, but
 * PEER_LOST when it closed because a rank destroyed its handle. Those ranks are the leaver's
 * victims (e.g. it timed out elsewhere and left), not callers of a closed communicator: only
 * what they post after the close is INVALID_USAGE. The detail names the rank that left. */
static inline colld_status_t colld_comm_waiting_status(const colld_dcomm_t *c)
{
    return c->state == COLLD_COMM_CLOSING ? COLLD_ERR_PEER_LOST : c->error;
}

/* Whether a communicator spans nodes. */
static inline bool colld_comm_multi_node(const colld_dcomm_t *c)
{
    return c->former != NULL;
}

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

/* ---- session.c: a session as the engine, completions, fast area and backends use it ---- */
/* A session object not yet in any list (no socket, no rings), for the listener and in-process
 * tests: its descriptors are -1 and it holds one reference. NULL without memory. */
colld_session_t *colld_session_new(colld_daemon_t *d, pid_t pid, uid_t uid, gid_t gid);
colld_session_t *colld_session_find(colld_daemon_t *d, uint64_t id, const uint8_t *token);
void colld_session_unref(colld_session_t *s);
void colld_session_release_reg(colld_reg_t *r);
colld_reg_t *colld_session_find_reg(colld_session_t *s, uint32_t id);
/* Create a session's shared memory (rings) and eventfd. Returns 0 or -1. */
int colld_session_make_rings(colld_session_t *s);
uint64_t colld_session_rings_bytes(const colld_daemon_t *d);
/* Send one message with up to two fds to the session's client; never blocks. Returns 0 or -1. */
int colld_session_send(colld_session_t *s, colld_wire_msg_t *m, const int *fds, int nfds);
/* Send an error reply of the given type with err's status and message. */
int colld_session_send_error(colld_session_t *s, uint16_t type, const colld_err_t *err);
/* The same with a status and a detail (its first COLLD_WIRE_DETAIL_BYTES - 1 bytes). */
int colld_session_send_status(colld_session_t *s, uint16_t type, colld_status_t st, const char *detail);
/* Ask the loop thread to drop a session that broke the ring protocol (lock held). */
void colld_session_kill(colld_session_t *s, const char *why);

/* ---- session_socket.c: the session socket (how sessions come and go) ---- */
int colld_sessions_listen(colld_daemon_t *d);
void colld_sessions_close_all(colld_daemon_t *d);
/* The daemon's side of a session ending (lock held): its ranks leave, its unique ids go, the engine
 * and the session list forget it; the caller drops the list's reference. */
void colld_session_forget(colld_session_t *s, const char *why);
/* Handle one complete session-socket message as the loop's read path does, `fd` (-1: none) being
 * the descriptor that came with it (taken): the entry point of in-process tests and fuzzers
 * (lock not held; replies go to s->fd). Returns -1 when the session must be dropped. */
int colld_session_dispatch(colld_session_t *s, const colld_wire_msg_t *m, int fd);
/* Drop every session the engine marked with kill_requested (loop thread). */
void colld_sessions_reap(colld_daemon_t *d);

/* ---- comm.c: communicators (the registry and their state machine) ---- */
colld_status_t colld_comm_issue_uid(colld_daemon_t *d, colld_session_t *s, uint8_t *out);
/* Take an issued unique id (it names one communicator only). False if it was not issued here to
 * this tenant or is used already (lock held). */
bool colld_comm_take_uid(colld_daemon_t *d, const uint8_t *uid, uid_t tenant);
/* The root daemon's address in a multi-node unique id (into buf), or NULL for a local id. */
const char *colld_uid_root_addr(const uint8_t *uid, char *buf, size_t len);
/* Join rank `rank` of the communicator named by `uid`; `call` (may be NULL) is answered when
 * every rank has joined, or at once on error (colld_reply_add). `checks`: COLLD_JOIN_* bits, the
 * checks the rank asks for on this communicator (any rank's request holds for all; 0 or false:
 * none). Returns COLLD_OK (the join is pending or done) or the refusal, also in *refusal when given
 * (in-process tests). */
#define COLLD_JOIN_NAN_CHECK 1u /* --nan-check's input checks */
#define COLLD_JOIN_VERIFY 2u    /* --verify-results' result verification */
colld_status_t colld_comm_join(colld_daemon_t *d, colld_session_t *s, const uint8_t *uid, int nranks, int rank,
                               int timeout_ms, const char *name, unsigned checks, colld_rpc_call_t *call,
                               colld_err_t *refusal);
/* CommDestroy: the rank of `handle` leaves. COLLD_OK, or an error with what is wrong in err. */
colld_status_t colld_comm_leave(colld_daemon_t *d, colld_session_t *s, uint32_t handle, colld_err_t *err);
/* Every rank has joined: the communicator is ready; answer the joins (lock held). */
void colld_comm_formed(colld_daemon_t *d, colld_dcomm_t *c);
/* Break a communicator: record the error and fail every queued operation and pending join.
 * `rank` is the rank at fault when one is (-1 otherwise); it goes into the event. */
void colld_comm_break(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st, int rank, const char *detail);
/* Abort a communicator for every rank (COLLD_ERR_ABORTED); `who` says by whom, for the detail. */
void colld_dcomm_abort(colld_daemon_t *d, colld_dcomm_t *c, int rank, const char *who);
void colld_comm_unref(colld_daemon_t *d, colld_dcomm_t *c);
/* A session is gone: its ranks leave every communicator, which breaks with PEER_LOST. */
void colld_comm_session_gone(colld_daemon_t *d, colld_session_t *s);
/* Check join timeouts; returns the earliest future deadline in ns (UINT64_MAX if none). */
uint64_t colld_comm_check_join_timeouts(colld_daemon_t *d, uint64_t now);

/* ---- policy.c: per-tenant policy ---- */
/* The timeout cap of a tenant's policy, 0 when none. */
int colld_policy_cap(const colld_daemon_t *d, uid_t uid);
/* Parse "uid:ms,uid:ms" into the policy list. Returns 0, or -1 with a message in err. */
int colld_policy_parse(colld_daemon_t *d, const char *text, colld_err_t *err);
/* Set (or replace) a tenant's cap; returns 0 or -1 (no memory). Clearing a missing one is a no-op. */
int colld_policy_set(colld_daemon_t *d, uid_t uid, int max_timeout_ms);
void colld_policy_clear(colld_daemon_t *d, uid_t uid);
void colld_policy_free(colld_daemon_t *d);
/* The inter-node algorithm of a tenant: its policy's, else --net-algo. */
int colld_policy_net_algo(const colld_daemon_t *d, uid_t uid);
/* Whether a tenant's policy turns result verification on for its communicators. */
bool colld_policy_verify(const colld_daemon_t *d, uid_t uid);
/* "auto", "ring", "rd" -> COLLD_NET_ALGO_*, -1 if unknown; and back. */
int colld_net_algo_parse(const char *text);
const char *colld_net_algo_name(int algo);

/* ---- replies.c: answers to held control calls ---- */
/* Queue an answer to a CommInit call (nothing when call is NULL), sent once the lock is released
 * (lock held). Returns the queued answer (to add the communicator's handle), or NULL. */
colld_reply_t *colld_reply_add(colld_daemon_t *d, colld_rpc_call_t *call, colld_status_t st, const char *detail);
/* Release daemon->lock, then send the answers queued under it. Every path that may have queued
 * answers releases the lock with this. */
void colld_daemon_unlock(colld_daemon_t *d);

/* ---- completion.c: operations and what the engine writes back ---- */
/* An operation record, recycled through a free list (lock held); NULL without memory. */
colld_op_t *colld_op_alloc(colld_daemon_t *d);
/* Post one completion to a session's completion ring (lock held). */
void colld_complete_post(colld_session_t *s, uint32_t handle, uint64_t seq, colld_status_t st);
/* Post owed break notices of a communicator where the completion rings have room (lock held). */
void colld_complete_notices(colld_dcomm_t *c);
/* Complete a descriptor that was never queued with st, and count it (lock held): its completion
 * carries `id` (the operation id, also a stream-ordered one's flag value); sqe->seq is its
 * collective ordinal. */
void colld_complete_sqe(colld_daemon_t *d, colld_session_t *s, const colld_wire_sqe_t *sqe, uint64_t id,
                        colld_status_t st);
/* Retire a queued or executed op: post its completion with st (a fast-path record's slot is
 * given back instead), count it, release what it holds and free it (lock held). */
void colld_op_retire(colld_op_t *op, colld_status_t st);
/* Free a fast-path record that every rank finished, without posting anything (lock held). */
void colld_op_drop_record(colld_daemon_t *d, colld_op_t *op);
/* Free the records on the free list (engine stopped). */
void colld_op_free_all(colld_daemon_t *d);

/* ---- admit.c: admission of a descriptor ---- */
/* Admit one descriptor a session posted: queue it on its rank, or complete it at once with an
 * error (an invalid one breaks its communicator, so no peer waits for it) (lock held). */
void colld_admit(colld_daemon_t *d, colld_session_t *s, const colld_wire_sqe_t *sqe);
/* The same call: what the signature check compares. */
bool colld_same_call(const colld_wire_sqe_t *a, const colld_wire_sqe_t *b);
/* Describe one rank's call for a mismatch report ("; rank 2: allreduce(float32, sum, count 4,
 * root 0)"); returns what snprintf returns. */
int colld_describe_call(char *buf, size_t len, int rank, const colld_wire_sqe_t *d);
/* True for the collectives whose root matters / that take a reduction op. */
bool colld_kind_has_root(unsigned kind);
bool colld_kind_has_op(unsigned kind);

/* ---- match.c: matching and time-outs ---- */
/* If every local rank of c has posted its next collective, take them out as one collective
 * (signatures agreeing) or fail them all with MISMATCH. Returns it or NULL (lock held). */
colld_coll_t *colld_match(colld_daemon_t *d, colld_dcomm_t *c);
/* Fail a collective whose first rank arrived more than the timeout ago, naming the missing ranks.
 * Returns the next deadline (ns) among the waiting ones (lock held). */
/* ---- p2p.c: point-to-point operations ---- */
/* Matching work units (an operation released, a pair looked at, a transfer started) one tenant
 * may have the engine do in one pass; the rest waits for the next pass. */
#define COLLD_P2P_BUDGET 512
/* Admission of a validated send or receive: queue it on its rank and in its pair's index. Returns
 * 0, or -1 without memory (nothing queued) (lock held). */
int colld_p2p_enqueue(colld_dcomm_t *c, colld_member_t *m, colld_op_t *op);
/* A new engine pass: every tenant's matching budget is whole again (lock held). */
void colld_p2p_pass_begin(colld_daemon_t *d);
/* Free a communicator's index (it is being freed; nothing is queued any more). */
void colld_p2p_comm_free(colld_dcomm_t *c);
/* Whether rank m's point-to-point operations hold back collective `ord` (those posted before it
 * have not completed). */
bool colld_p2p_holds(const colld_member_t *m, uint64_t ord);
/* Release what a completed collective held back, let the pairs of ranks whose heads may meet
 * meet (within the tenant's budget for this pass) and hand the transfers to the backend, time out
 * what waited too long; returns the work done (more than 0 while work is left for the next pass)
 * and brings *deadline forward (lock held; READY communicators, and CLOSING ones: a rank left, the
 * others' sends and receives go on). */
int colld_p2p_progress(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now, uint64_t *deadline);
/* A transfer ended (its backend, lock held): its operations are done; post what can be posted. */
void colld_p2p_finish(colld_daemon_t *d, colld_xfer_t *x);
/* Fail a member's queued point-to-point operations with st (a break): all of them, or (`all`
 * false) those of a rank that left or with one, and the stream-ordered ones (the break released
 * the GPU streams); those whose transfer runs complete when it ends (lock held). */
void colld_p2p_fail_queue(colld_dcomm_t *c, colld_member_t *m, colld_status_t st, bool all);
/* For each pair of ranks of c, the head of its list that waits for its peer now (it may go; the
 * peer has not met it): fn(arg, op), by rank and operation id, for the deadlock check's wait-for
 * graph (lock held). */
void colld_p2p_waits(const colld_dcomm_t *c, void (*fn)(void *arg, const colld_op_t *op), void *arg);
/* What rank r of c is doing, for a time-out's detail ("is waiting in allreduce (collective #4)");
 * returns what it wrote. */
int colld_p2p_describe_rank(char *buf, size_t len, const colld_dcomm_t *c, int r);
/* The oldest send or receive of c still waiting for its peer, described as its time-out would
 * ("rank 0 (pid 812) waited 1500 ms to receive ...; rank 1 never sent to rank 0: it ..."), for
 * collctl status and doctor; returns how long it has waited (ns), 0 and "" when none waits. */
uint64_t colld_p2p_describe_wait(char *buf, size_t len, const colld_dcomm_t *c, uint64_t now);

/* ---- deadlock.c ---- */
/* Pairs of ranks one tenant's waits may have the check look at in one look (a look at 4,000 pairs
 * holds the lock about 1.5 ms; a 64-rank all-to-all makes 4,032); a tenant over it is left out of
 * that look and the looks of the next second (the others are checked). */
#define COLLD_DEADLOCK_WAITS 4096
/* Look for wait-for cycles, across communicators or within one (at most every 100 ms); report each
 * once every wait in it has lasted --deadlock-ms (and fail its communicators with
 * --deadlock-fail). Returns when to look again (lock held). */
uint64_t colld_deadlock_check(colld_daemon_t *d, uint64_t now);
/* Forget what the check remembers between looks (the engine stopped). */
void colld_deadlock_free(colld_daemon_t *d);
uint64_t colld_match_timeouts(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now);
/* The collective c waits for (c->exec_seq), if some local rank has posted it: how long since its
 * first arrival, in ns (0: none waits), and into buf what it is and the ranks that have not posted
 * it, with their pids; *absent is the first of them (-1: every rank posted it). Lock held. */
uint64_t colld_match_describe_wait(char *buf, size_t len, const colld_dcomm_t *c, uint64_t now, int *absent);
/* Once per collective, when it has waited --wait-event-ms since first_ns (its first arrival, as the
 * time-out check measures it: colld_match_timeouts, and the fast area's): the modules learn who has
 * not posted it (colld_comm_hooks_t.waiting: an event, a log line). Brings *deadline forward to
 * that moment. */
void colld_match_wait_event(colld_daemon_t *d, colld_dcomm_t *c, uint64_t first_ns, uint64_t now,
                            uint64_t *deadline);

/* ---- engine.c: the progress engine ---- */
int colld_engine_start(colld_daemon_t *d);
void colld_engine_stop(colld_daemon_t *d);
/* One round of the engine on the caller's thread, without sleeping (in-process tests and fuzzers,
 * with no engine thread running; d->engine_running must be true). Returns the work found, -1
 * when the engine is stopped. */
int colld_engine_run_once(colld_daemon_t *d);
/* Post the results of an executed collective with k->status and free it (lock held). */
void colld_engine_finish(colld_daemon_t *d, colld_coll_t *k);
/* The first local op of a collective (a multi-node one has NULL for remote ranks). */
colld_op_t *colld_coll_lead(const colld_coll_t *k);

/* ---- engine_wake.c: the engine's epoll set ---- */
/* Create and close it (with the engine). Returns 0 or -1. */
int colld_engine_wake_init(colld_daemon_t *d);
void colld_engine_wake_fini(colld_daemon_t *d);
/* Wake the engine (after a control path changed state it must look at). */
void colld_engine_wake(colld_daemon_t *d);
int colld_engine_add_session(colld_daemon_t *d, colld_session_t *s);
void colld_engine_remove_session(colld_daemon_t *d, colld_session_t *s);
/* Sleep until a session or a control path wakes the engine, or timeout_ms (engine thread). */
void colld_engine_sleep(colld_daemon_t *d, int timeout_ms);

/* ---- backends.c: composing the daemon (backend.h) ---- */
/* The modules' and backends' hooks of a communicator's life (lock held). */
void colld_hooks_formed(colld_daemon_t *d, colld_dcomm_t *c);
void colld_hooks_faulted(colld_daemon_t *d, colld_dcomm_t *c, colld_fault_t how, int rank, const char *detail);
void colld_hooks_failing(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st);
void colld_hooks_broken(colld_daemon_t *d, colld_dcomm_t *c);
void colld_hooks_settle(colld_daemon_t *d, colld_dcomm_t *c);
/* Before the engine matches a ready communicator's next collective: false when a module holds it
 * back this pass (the fast area judges it). */
bool colld_hooks_judge(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now, uint64_t *deadline);
/* A collective of c ended (executed or failed; start_ns 0: it never ran). */
void colld_hooks_finished(colld_daemon_t *d, colld_dcomm_t *c, colld_op_t *const *ops, uint64_t first_ns,
                          uint64_t start_ns, uint64_t end_ns, colld_status_t st);
void colld_hooks_freed(colld_daemon_t *d, colld_dcomm_t *c);
void colld_hooks_waiting(colld_daemon_t *d, colld_dcomm_t *c, int rank, uint64_t waited_ns, const char *detail);
/* A session message no core handler serves: the modules' session_msg (lock not held); -2 when
 * none serves it. */
int colld_hooks_session_msg(colld_session_t *s, const colld_wire_msg_t *m);
/* A stream-ordered descriptor failed: the device backend releases what waits for it. */
void colld_backends_stream_failed(colld_daemon_t *d, colld_session_t *s, const colld_wire_sqe_t *sqe, uint64_t id,
                                  colld_status_t st);
/* A session's last reference went: every backend frees its part. */
void colld_backends_session_free(colld_daemon_t *d, colld_session_t *s);

/* ---- fast.c: the fast area of a single-node communicator ---- */
/* The module (its hooks make the area when a communicator forms, judge the collectives the ranks
 * run on it, wake its ranks when it breaks, free it, and hand it to members: COLLD_MSG_FAST_AREA). */
extern const colld_comm_hooks_t colld_fast_hooks;
/* Add what the ranks finished on the fast area since the last look to the counters (lock held). */
void colld_fast_harvest(colld_daemon_t *d, colld_dcomm_t *c);

/* ---- names.c ---- */
const char *colld_comm_state_name(colld_comm_state_t s);
const char *colld_kind_name(unsigned kind);
/* How a detail names a send or receive: "VERB[ WHAT] to|from rank PEER (operation #ID)", as in
 * "send of 1024 x float32 to rank 1 (operation #3)". Returns what snprintf returns. */
int colld_p2p_op_text(char *buf, size_t len, const char *verb, bool send, const char *what, int peer, uint64_t id);
const char *colld_dtype_name(unsigned dtype);
const char *colld_redop_name(unsigned redop);

/* ---- config_table.c ---- */
extern const colld_config_entry_t colld_daemon_config_table[];
extern const size_t colld_daemon_config_table_len;
extern const size_t colld_daemon_config_table_shown; /* the entries --help and --print-config show (no test hooks) */

#endif /* COLLD_SERVER_DAEMON_H */
