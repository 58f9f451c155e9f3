/*
 * client_internal.h - the objects of libcolld, and what its files ask of each other. The files,
 * lowest first: none calls a file above it (tools/module_graph.py shows no cycle, issue 27).
 *
 * The base: the connection, the rings, a communicator's errors. It knows no feature; where it
 * needs one (rings.c: a fast-path collective in flight), it calls a hook the client holds.
 *   conn.c         the connection's primitives: session socket, control calls, the communicator
 *                  table, registrations, the client's last error, why a client is lost
 *   spin.c         how a waiter polls before it sleeps: the machine's CPU load, estimates of how soon
 *   staging.c      staging regions for memory not from colld_mem_alloc
 *   rings.c        posting descriptors, reaping completions, waiting for the engine's
 *   errors.c       a communicator's errors and their detail (colld_comm_last_error)
 * The paths and the features built on it:
 *   engine_path.c  the engine path's poster
 *   fast.c         the fast path (and its poster, colld__fast_post)
 *   cuda_reg.c     the cache of GPU registrations (cuda_internal.h: what the CUDA files share)
 *   cuda_graph.c   collectives captured into CUDA graphs: persistent plans, run once per replay
 *   cuda.c         the GPU stream path (and its poster, colld__gpu_post), GPU memory
 *   group.c        group calls: queued collectives, posted at the outermost end; colld__comm_error
 *   redop.c        premultiplied-sum operators, and a collective's op as the wire has it
 *   mem.c          colld_mem_alloc / colld_mem_free, colld_mem_register / colld_mem_deregister
 *   comm.c         communicators: join, destroy, abort, waiting for what is in flight
 *   client.c       the connection's life: connect (which sets the hooks), the monitor thread,
 *                  disconnect
 * The calls on top:
 *   coll.c         the collectives, sends and receives: the router, which checks a call and picks
 *                  its path
 *   alltoallv.c    colld_alltoallv, a group of sends and receives
 *   split.c        colld_comm_split
 *
 *   colld_client_t  one session with the local daemon: the session socket (identity, fds,
 *                   liveness), the shared-memory rings, the gRPC channel, the registrations.
 *   colld_comm_t    one rank's handle on a communicator: sequence counters and error state.
 *   colld_gpu_t     a client's GPU state (cuda.c): registrations of device memory, the session's
 *                   GPU stream flag area. Opaque outside cuda.c and cuda_reg.c.
 *
 * Locking: client->mu guards the rings, the communicator table and the registrations;
 * client->sock_mu serialises request/reply exchanges on the session socket. A monitor thread
 * watches the session socket and, when the daemon goes away, marks the client lost and wakes
 * every waiter, so no call ever waits for a daemon that is gone.
 */
#ifndef COLLD_CLIENT_INTERNAL_H
#define COLLD_CLIENT_INTERNAL_H

#include "common/err.h"
#include "common/util.h"
#include "client/rpc/rpc_client.h"
#include "client/spin.h"
#include "proto/wire.h"

#include <colld/colld.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define COLLD_CLIENT_DETAIL_LEN 512
#define COLLD_CLIENT_RPC_TIMEOUT_MS 10000

typedef struct {
    void *base;
    size_t size;  /* mapped (whole pages) */
    size_t bytes; /* what the caller asked for: the bounds of its buffer */
    uint32_t reg_id;
} colld_client_reg_t;

/* A registration used to stage memory that is not from colld_mem_alloc (staging.c). */
typedef struct colld_stage colld_stage_t;

/* A posted collective with staged buffers: what to copy out on completion, what to release. */
typedef struct colld_pending {
    uint64_t seq;
    void *user;       /* the caller's receive buffer, NULL if nothing to copy out */
    const char *from; /* its staged copy */
    size_t bytes;
    colld_stage_t *stage[2];
    struct colld_pending *next;
} colld_pending_t;

/* The GPU state of a client (cuda.c). */
typedef struct colld_gpu colld_gpu_t;

/* What the base (rings.c) asks of a feature above it: function pointers set once, at connect
 * (client.c), so that the base never names a feature's function and calls one way only. */
typedef struct {
    /* Finish the communicator's fast-path collective in flight: colld__fast_finish (fast.c). */
    colld_status_t (*fast_finish)(colld_comm_t *comm, bool block);
} colld_client_hooks_t;

struct colld_client {
    char socket_path[256];
    int sock;
    pthread_mutex_t sock_mu;
    uint64_t session_id;
    uint8_t token[COLLD_WIRE_TOKEN_BYTES];
    int default_timeout_ms;

    colld_wire_shm_t *shm;
    size_t shm_size;
    colld_wire_sqe_t *sqes;
    colld_wire_cqe_t *cqes;
    uint32_t entries;
    int efd;

    pthread_mutex_t mu;
    uint64_t sq_head;     /* our copy */
    uint64_t cq_tail;     /* our copy */
    colld_comm_t **comms; /* by daemon handle */
    uint32_t ncomms_slots;
    colld_client_reg_t *regs;
    size_t nregs, cap_regs;

    colld_stage_t *stage_cache; /* free staging regions (mu) */
    size_t stage_cached;
    colld_stage_t *stage_trash; /* regions to unregister outside mu */
    /* colld_client_stats: engine-path host collectives with every buffer in colld memory, those
     * with a buffer staged, and the bytes staged (copied in, or to copy out) for them */
    _Atomic uint64_t zero_copy_ops, staged_ops, staged_bytes;

    atomic_bool lost;
    pthread_t monitor;
    bool monitor_started;
    int wake_pipe[2];
    colld_rpc_channel_t *rpc;

    colld_cpu_load_t load;                /* whether a waiter may busy-poll (spin.h) */
    colld_gpu_t *gpu;                     /* created at connect, never NULL afterwards */
    colld_client_hooks_t hooks;           /* set at connect, never changed (client.c) */
    uint32_t redop_tags;                  /* the last tag given to a handle's premultiplied-sum operators (mu; redop.c) */
    struct colld_mem_handle *mem_handles; /* colld_mem_register's, not yet deregistered (mu; mem.c) */
    char last_error[COLLD_CLIENT_DETAIL_LEN]; /* colld_last_error (mu) */

    /* Fork safety (client.c): the process that connected, and the list of this process's
     * clients (fork_mu). In a forked child, forked_from is that pid and the client is lost. */
    pid_t pid;
    pid_t forked_from;
    struct colld_client *fork_next;
};

/* A collective this rank started on the fast area and has not finished (fast.c). */
typedef struct {
    bool active;
    uint8_t kind, dtype, redop;
    int32_t root;
    uint64_t seq; /* its operation id */
    uint64_t ord; /* its collective ordinal: what the slots and its record name (proto/wire.h) */
    uint64_t count;
    void *recv;
    uint64_t arrival_ns;
    bool recorded; /* its record went to the daemon (the rank had to wait) */
} colld_fast_op_t;

struct colld_comm {
    colld_client_t *client;
    uint32_t handle;
    uint64_t comm_id;
    int rank, nranks;
    int timeout_ms;
    uint64_t seq;       /* the last operation id given (every path, point-to-point included) */
    uint64_t p2p;       /* point-to-point operations numbered: collective ordinal = seq - p2p */
    uint64_t issued;    /* collectives posted to the engine */
    uint64_t completed; /* their completions received */
    /* Per-operation completion (colld_op_query): every collective with a sequence number up to
     * done_upto has completed (the daemon completes a communicator's collectives in sequence
     * order, and a fast-path one starts only after those before it); failed_seq is the lowest that
     * failed (0: none), and every later one failed too. Every collective is resolved one way or
     * the other: the daemon completes each descriptor it is sent (with the communicator's error
     * once it broke), and a fast-path one completes from its slots or fails. Atomic
     * (colld__seq_raise, colld__seq_lower): the thread that reaps the completion ring may be
     * another communicator's. */
    uint64_t done_upto;
    uint64_t failed_seq;
    colld_status_t async_error; /* first error of this communicator; sticky */
    /* The detail colld_comm_last_error returns (errors.c, "Error detail"): of the last failure a call
     * on this handle returned, never an older one's. */
    bool detail_fetched;                        /* last_error holds async_error's detail */
    char last_error[COLLD_CLIENT_DETAIL_LEN];   /* the communicator's error (async_error) explained */
    bool local_valid;                           /* local_error explains the last failed call... */
    colld_status_t local_over;                  /* ...while async_error is still this */
    char local_error[COLLD_CLIENT_DETAIL_LEN];  /* a call refused or failed here, its own words */
    colld_pending_t *pending; /* staged collectives in flight, in sequence order (mu) */
    /* fast area (fast.c); NULL when the daemon gave none (multi-node, disabled) */
    colld_wire_fast_t *fast;
    size_t fast_size;
    uint64_t fast_stride;        /* the area's layout as validated at attach: never read back from the */
    uint64_t fast_slot_bytes;    /* area, which every member can write */
    void *fast_scratch;          /* slot_bytes, cache-line aligned: output of a misaligned buffer */
    const void **fast_in;        /* [nranks] input pointers for the kernels */
    uint64_t *fast_scalars;      /* [nranks] the ranks' scalar words of a premultiplied sum */
    colld_fast_op_t fop;         /* at most one in flight: a rank finishes it before its next call */
    colld_spin_est_t fast_spin;  /* how soon the peers' slots come (spin.h) */
    colld_spin_est_t ring_spin;  /* how soon the engine's completions come (rings.c) */
    bool crowded;                /* more ranks than CPUs: waits yield between looks (spin.h) */
    bool gpu_used;               /* gpu_base is set (at the first stream-ordered collective) */
    uint32_t gpu_base;           /* flag base: operation id s has flag value gpu_base + (uint32_t)s */
    uint32_t gpu_gen;            /* its generation on the handle's flag line, set with gpu_base (client/cuda.c) */
    struct colld_premul *premul; /* [COLLD_REDOP_PREMUL_MAX] premultiplied-sum operators (redop.c), or NULL;
                                    one allocation, freed by colld_comm_destroy */
    uint32_t premul_tag;         /* the tag in this handle's operators (redop.c); 0 before the first */
};

/* A stream-ordered collective between its validation (colld__gpu_prepare) and its posting
 * (colld__gpu_post): the stream, its context and the device addresses of its flag line. Plain
 * integers and pointers, so that no CUDA header is needed outside cuda.c. */
typedef struct {
    void *stream;        /* CUstream; CU_STREAM_LEGACY for the default stream */
    void *ctx;           /* CUcontext of the stream */
    uint64_t ready;      /* CUdeviceptr of the line's `ready` slots (slot i at ready + 4 * i) */
    uint64_t done;       /* CUdeviceptr of the line's `done` word */
    unsigned wait_flags; /* CU_STREAM_WAIT_VALUE_GEQ, plus FLUSH where the device supports it */
    uint32_t base;       /* the communicator's flag base (proto/wire.h) */
    bool capture;        /* the stream is being captured into a CUDA graph: a plan (cuda_graph.c) */
    void *graph;         /* CUgraph being captured */
    void *cur;           /* CUcontext current on the thread when prepared, for a post in the same call
                            (NULL: unknown, asked again; colld__group_queue clears it) */
} colld_gpu_op_t;

/* The session's GPU flag area as cuda.c set it up (colld__gpu_area). */
typedef struct {
    void *base;     /* host mapping */
    uint64_t dptr;  /* CUdeviceptr of base */
    uint32_t lines; /* communicator lines */
    uint32_t plans; /* plan lines after them (proto/wire.h) */
} colld_gpu_area_t;

/* client.c */
colld_status_t colld__connect_role(const char *socket_path, int role, colld_client_t **out);

/* conn.c */
colld_status_t colld__client_rpc(colld_client_t *c, const char *method, const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, int timeout_ms, ProtobufCMessage **resp,
                                 char *detail, size_t detail_len);
/* Fill a SessionRef of a request (points into c; valid while c lives). */
void colld__client_session_ref(colld_client_t *c, void *ref);
/* One request/reply exchange on the session socket, receiving up to nfds_out fds. */
colld_status_t colld__sock_request(colld_client_t *c, colld_wire_msg_t *m, int fd, uint16_t reply_type,
                                   colld_wire_msg_t *reply, int *fds_out, int nfds_out);
/* The daemon's answer in a reply on the session socket: COLLD_OK, or its refusal: its status
 * (COLLD_ERR_PROTOCOL for an answer that is no error status) with its detail, a tenant-visible
 * string from the wire, copied printable into detail[COLLD_WIRE_DETAIL_BYTES]. */
static inline colld_status_t colld__reply_status(const colld_wire_msg_t *reply, char *detail)
{
    if (reply->status == COLLD_OK)
        return COLLD_OK;
    colld_str_sanitize(detail, COLLD_WIRE_DETAIL_BYTES, reply->u.detail, sizeof(reply->u.detail));
    return reply->status < 0 ? (colld_status_t)reply->status : COLLD_ERR_PROTOCOL;
}
/* Translate a pointer range to a registration (mu held). Returns 0, -1 when the start is in no
 * registration, -2 when the range runs past the end of the one it starts in. */
int colld__client_lookup(colld_client_t *c, const void *p, size_t bytes, colld_wire_buf_t *out);
int colld__client_add_comm(colld_client_t *c, colld_comm_t *comm);
void colld__client_remove_comm(colld_client_t *c, colld_comm_t *comm);

/* Why c is lost: the daemon went away, or this process is a fork of the one that connected
 * (client.c's fork handler marks such a client lost). A thread-local string. */
const char *colld__lost_detail(const colld_client_t *c);

/* Register `bytes` of new shared memory with the daemon. On error `err` says what went wrong,
 * with the daemon's own detail when it refused (a quota names its limit). */
colld_status_t colld__register(colld_client_t *c, size_t bytes, void **base, size_t *size, uint32_t *reg_id,
                               colld_err_t *err);
colld_status_t colld__deregister(colld_client_t *c, uint32_t reg_id);
/* Record a client-level error (colld_last_error) and return st. */
colld_status_t colld__client_error(colld_client_t *c, colld_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Look up both buffers of a collective in the host registrations under one lock: *ls / *lr as
 * colld__client_lookup (0 also for an unused buffer, 0 bytes), *wsend / *wrecv filled when found. */
void colld__client_lookup2(colld_client_t *c, const void *send, size_t send_bytes, const void *recv, size_t recv_bytes,
                           colld_wire_buf_t *wsend, colld_wire_buf_t *wrecv, int *ls, int *lr);

/* rings.c */
/* Post descriptors in order (waits for ring space; one wake-up per batch that fits). */
colld_status_t colld__client_submit(colld_client_t *c, const colld_wire_sqe_t *sqes, size_t n);
/* Reap completions without waiting. */
void colld__client_poll(colld_client_t *c);
/* *p = max(*p, v), atomically. */
static inline void colld__seq_raise(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}
/* *p = v if *p is 0 or above v, atomically. */
static inline void colld__seq_lower(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while ((cur == 0 || cur > v) && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}
/* Collective `seq` of comm: COLLD_OK once it completed, the communicator's error once it failed,
 * else (without `block`) COLLD_INPROGRESS; with `block` it waits for one of the first two
 * (rings.c). */
colld_status_t colld__ring_wait_op(colld_client_t *c, colld_comm_t *comm, uint64_t seq, bool block);
/* Wait until every collective comm posted to the engine has completed. */
colld_status_t colld__ring_wait(colld_client_t *c, colld_comm_t *comm);
/* Wait (at most timeout_ms) until the daemon has taken every descriptor this client posted so
 * far, and with it a reference on every registration they name: a deregistration sent after this
 * cannot overtake a collective posted before it. True when it has (or the daemon is lost). */
bool colld__ring_wait_taken(colld_client_t *c, int timeout_ms);
/* Sleep until a completion arrives for c, at most timeout_ns. */
void colld__ring_nap(colld_client_t *c, uint64_t timeout_ns);

/* mem.c */
/* A communicator is being destroyed: release what colld_mem_register registered with it. */
void colld__mem_comm_destroyed(colld_comm_t *comm);
/* Disconnect: forget the handles left (their registrations go with the GPU state). */
void colld__mem_client_free(colld_client_t *c);

/* errors.c */
/* Record a client-side error on a communicator without touching the group (a failure found while
 * a group ends; colld__comm_error, group.c, also poisons the group): the detail of the call that
 * returns st. Returns st. */
colld_status_t colld__comm_note(colld_comm_t *comm, colld_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The communicator's own error as a call returns it (failing fast, or waiting for work that
 * failed): colld_comm_last_error explains that error from now on, not an earlier call's refusal.
 * Returns st. */
colld_status_t colld__comm_fail_async(colld_comm_t *comm, colld_status_t st);
/* The library itself found the communicator's error (fast area, GPU stream): record it with its
 * detail unless the communicator already has one. Returns the communicator's error. */
colld_status_t colld__comm_break_here(colld_comm_t *comm, colld_status_t st, const char *detail);

/* comm.c */
/* Wait for everything this rank has in flight on comm (fast area, then engine). */
colld_status_t colld__comm_wait(colld_comm_t *comm);

/* engine_path.c: the engine path's poster */
/* Number a collective with the communicator's next sequence number, attach its pending record
 * (NULL: nothing staged) and post it. On error `err` says what went wrong; nothing is posted. */
colld_status_t colld__engine_post(colld_comm_t *comm, const colld_wire_sqe_t *sqe, colld_pending_t *pending,
                                  colld_err_t *err);
/* Number a collective of a batch (colld_group_end posts the batch) and attach its pending record. */
void colld__engine_number(colld_comm_t *comm, colld_wire_sqe_t *sqe, colld_pending_t *pending);
/* Release the pending record of a collective that was not posted (NULL: nothing). */
void colld__engine_discard(colld_comm_t *comm, colld_pending_t *pending);

/* staging.c */
/* Resolve a collective's buffers, given what colld__client_lookup2 found (ls, lr: 0 registered or
 * unused, -1 not registered; never -2): registered ranges as they are (zero copy, *wsend / *wrecv
 * already filled), other memory through staging regions; *pending (or NULL) must be attached when
 * the op is numbered, or released. On error `err` says what is wrong. */
colld_status_t colld__stage(colld_comm_t *comm, const void *send, size_t send_bytes, void *recv, size_t recv_bytes,
                            int ls, int lr, colld_wire_buf_t *wsend, colld_wire_buf_t *wrecv, colld_pending_t **pending,
                            colld_err_t *err);
void colld__pending_attach(colld_comm_t *comm, colld_pending_t *p, uint64_t seq);                     /* mu held */
void colld__pending_detach(colld_comm_t *comm, colld_pending_t *p);                                   /* mu held */
void colld__pending_release(colld_client_t *c, colld_pending_t *p);                                   /* mu held */
void colld__pending_complete(colld_client_t *c, colld_comm_t *comm, uint64_t seq, colld_status_t st); /* mu */
void colld__pending_drop_all(colld_client_t *c, colld_comm_t *comm);                                  /* mu held */
void colld__stage_trim(colld_client_t *c);
void colld__stage_free_all(colld_client_t *c);

/* fast.c */
/* Ask the daemon for the communicator's fast area and map it (best effort: without one, every
 * collective goes through the engine). */
void colld__fast_attach(colld_comm_t *comm);
void colld__fast_detach(colld_comm_t *comm);
/* True when this collective runs on the fast area (the same answer on every rank). */
bool colld__fast_eligible(const colld_comm_t *comm, colld_kind_t kind, size_t count, colld_dtype_t dtype);
/* The fast path's poster (nothing else of this communicator may be in flight): publish this rank's
 * input (and, in a premultiplied sum, its scalar word) for its next sequence number. The caller
 * has checked the buffers (not NULL where used, not running past the end of a registration). On
 * error `err` says what is wrong. */
colld_status_t colld__fast_post(colld_comm_t *comm, colld_kind_t kind, const void *send, size_t send_bytes, void *recv,
                                size_t recv_bytes, size_t count, colld_dtype_t dtype, uint8_t redop, uint64_t scalar,
                                int root, colld_err_t *err);
/* Finish the one in flight, if any: COLLD_OK, COLLD_INPROGRESS (only when !block) or the error
 * (also recorded as the communicator's). */
colld_status_t colld__fast_finish(colld_comm_t *comm, bool block);
/* A group waits for something in flight on comm (group.c): its idle-th pass without progress. The
 * first passes poll (a pause while a CPU is free, else a yield; spin.h); later ones sleep (at most
 * 0.1 ms) until a peer publishes on the area or, with no fast-path collective in flight, a
 * completion arrives. */
void colld__fast_nap(colld_comm_t *comm, unsigned idle);

/* redop.c */
/* A collective's op as the wire has it: a built-in op as it is, an operator of
 * colld_redop_create_premul_sum as COLLD_REDOP_PREMUL_SUM with its scalar word in *scalar (0
 * otherwise). COLLD_ERR_INVALID_ARGUMENT (recorded on comm, naming the op) for an unknown op, an
 * operator of another handle, a destroyed one, or one of another dtype. */
colld_status_t colld__redop_resolve(colld_comm_t *comm, colld_redop_t op, colld_dtype_t dtype, uint8_t *wire_op,
                                    uint64_t *scalar);

/* group.c */
bool colld__group_active(void);
/* Record the first error of the current group (no-op outside a group). */
void colld__group_fail(colld_status_t st);
/* Record a client-side error on a communicator (its detail, the group's first error); returns st. */
colld_status_t colld__comm_error(colld_comm_t *comm, colld_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Queue an engine or stream-ordered collective until the outermost colld_group_end (inside a group
 * only). Takes ownership of `pending` (NULL if nothing was staged). `gpu` (NULL for host buffers):
 * a stream-ordered collective, prepared by colld__gpu_prepare. On error `err` says what is wrong. */
colld_status_t colld__group_queue(colld_comm_t *comm, const colld_wire_sqe_t *sqe, colld_pending_t *pending,
                                  const colld_gpu_op_t *gpu, colld_err_t *err);
/* Queue a fast-path collective until the outermost colld_group_end (inside a group only). */
colld_status_t colld__group_queue_fast(colld_comm_t *comm, colld_kind_t kind, const void *send, size_t send_bytes,
                                       void *recv, size_t recv_bytes, size_t count, colld_dtype_t dtype, uint8_t redop,
                                       uint64_t scalar, int root);

/* cuda.c: GPU buffers and stream-ordered collectives. Without CUDA support in the build, or
 * without a driver, every entry point answers COLLD_ERR_NOT_SUPPORTED with the reason in `err`. */
/* Create the (empty) GPU state of a client at connect; nothing of CUDA is loaded. */
colld_status_t colld__gpu_client_init(colld_client_t *c);
/* At disconnect (monitor stopped, session socket still open): deregister every GPU
 * registration, free the device memory from colld_mem_alloc, unmap the flag area. */
void colld__gpu_client_free(colld_client_t *c);
/* The daemon is gone (monitor thread): release every flag line this client used, so that no
 * application stream waits forever. */
void colld__gpu_daemon_lost(colld_client_t *c);
/* A communicator of c was destroyed: drop the cached GPU registrations whose allocations the
 * application has freed, so that the daemon's mappings go with them (issue 15 C1/D4). */
void colld__gpu_comm_destroyed(colld_client_t *c);
/* Whether pointers outside the host registrations may be device memory: false, at the cost of one
 * dl_iterate_phdr step, unless the CUDA driver is loaded in the process. */
bool colld__gpu_maybe_device(colld_client_t *c);
/* Whether p is device memory (false for any host memory, and when the driver is unusable). */
bool colld__gpu_is_device(colld_client_t *c, const void *p);
/* Validate a stream-ordered collective (stream NULL: the legacy default stream): resolve both
 * buffers to registrations (registering their allocations once) into sqe->send / sqe->recv, set
 * up the flag area, check the stream's device. Nothing is enqueued on the stream yet. in_group:
 * the call is inside colld_group_start / colld_group_end (a capture is refused there). */
colld_status_t colld__gpu_prepare(colld_comm_t *comm, void *stream, bool in_group, const void *send, size_t send_bytes,
                                  const void *recv, size_t recv_bytes, colld_wire_sqe_t *sqe, colld_gpu_op_t *op,
                                  colld_err_t *err);
/* Number a prepared collective, enqueue `ready[id % slots] = value` and the wait for `done >= value`
 * on its stream (value = flag base + operation id), and post the descriptor; if the posting
 * fails, the stream is released from here. Waits while the collective's ready slot is still in use
 * (at most COLLD_WIRE_GPU_READY_SLOTS collectives of a communicator posted and not yet launched). */
colld_status_t colld__gpu_post(colld_comm_t *comm, const colld_wire_sqe_t *sqe, const colld_gpu_op_t *op,
                               colld_err_t *err);
/* Post the n stream-ordered sends and receives of one communicator in a group (group.c: a batch,
 * COLLD_SQE_LINK on all but the last; prepared, their streams of one context) as colld__gpu_post
 * posts one: the batch's other streams are joined into the last operation's stream (events), which
 * alone writes the batch's ready slot (the last operation's) and waits for its `done`; then the other
 * streams wait for that. n == 1 is colld__gpu_post. */
colld_status_t colld__gpu_post_batch(colld_comm_t *comm, const colld_wire_sqe_t *sqes, const colld_gpu_op_t *ops,
                                     size_t n, colld_err_t *err);
/* The host address of the `ready` slot of operation `id` of comm in the client's GPU flag area
 * (proto/wire.h), NULL before the area exists: what tests read to see a stream's write land. */
const uint32_t *colld__gpu_ready_word(colld_comm_t *comm, uint64_t id);
/* The session's GPU flag area; false before it is set up. */
bool colld__gpu_area(colld_client_t *c, colld_gpu_area_t *out);
/* colld_mem_alloc(COLLD_MEM_CUDA) and its colld_mem_free (COLLD_ERR_INVALID_ARGUMENT when ptr is
 * not such an allocation). */
colld_status_t colld__gpu_mem_alloc(colld_client_t *c, void **ptr, size_t bytes, colld_err_t *err);
colld_status_t colld__gpu_mem_free(colld_client_t *c, void *ptr, colld_err_t *err);
/* colld_mem_register of device memory: the registration of the allocation(s) that hold
 * [buf, buf + bytes) (made now if needed) is pinned: never swept, kept until the matching
 * colld__gpu_mem_deregister (pins are counted). *reg_id names it. */
colld_status_t colld__gpu_mem_register(colld_client_t *c, const void *buf, size_t bytes, uint32_t *reg_id,
                                       colld_err_t *err);
/* Unpin it; the last unpin deregisters it (the daemon's mapping goes once no collective uses it),
 * unless it is colld_mem_alloc memory (colld_mem_free does). */
colld_status_t colld__gpu_mem_deregister(colld_client_t *c, uint32_t reg_id, colld_err_t *err);

/* cuda_graph.c: collectives captured into CUDA graphs (issue 15 item 3). */
/* Post a prepared collective whose stream is being captured (op->capture; area: the session's flag
 * area, cuda.c's): register it with the daemon as a persistent plan of its communicator (numbered
 * and matched like a collective; this waits until every rank has captured it), tie the plan's
 * life to the graph (a CUDA user object) and enqueue the plan's three stream memory operations
 * into the capture. On error nothing is enqueued and err says why. */
colld_status_t colld__graph_post(colld_comm_t *comm, const colld_gpu_area_t *area, const colld_wire_sqe_t *sqe,
                                 const colld_gpu_op_t *op, colld_err_t *err);
/* The daemon is gone (monitor thread): the replays of c's captured collectives are released from
 * now on by libcolld itself. */
void colld__graph_daemon_lost(colld_client_t *c);
/* At disconnect: whether CUDA graphs still hold captured collectives of c. Their replays are then
 * released by libcolld, and the flag area (area, size, registered in CUcontext ctx; area NULL:
 * the caller keeps it) is unregistered and unmapped once the last of those graphs is gone. */
bool colld__graph_client_free(colld_client_t *c, void *area, size_t size, void *ctx);

#endif /* COLLD_CLIENT_INTERNAL_H */
