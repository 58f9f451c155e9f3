/*
 * cuda.h - what the files of the CUDA backend share (internal to server/backends/cuda): its types,
 * the lookups of its state, and each file's functions. The files call one way, from the top down:
 *
 *   cuda.c         the backend: start and stop (the GPUs), its operations table and hooks, and
 *                  the composition of the collectives', transfers' and plans' progress; nothing
 *                  calls into it
 *   cuda_coll.c    stream-ordered collectives: admission, the wait for the ranks' streams,
 *                  completion, time-outs, failure release
 *   cuda_p2p.c     stream-ordered sends and receives: a matched transfer waits for both ranks'
 *                  streams, is copied on a daemon stream, and completes (issue 16)
 *   cuda_plan.c    persistent plans: collectives captured into CUDA graphs, run once per replay
 *                  (issue 15 item 3; cuda_plan.h)
 *   cuda_launch.c  the launch layer the three above share: a communicator's stream on a GPU, the
 *                  drain of a failed launch, an event's poll and failure, the time-out's due time,
 *                  whether a collective's GPUs can run it; and the launch of a collective's kernels
 *                  and flag writes (engine thread, no lock)
 *   cuda_recover.c a GPU whose context has a sticky error: its work failed, its context reset,
 *                  the GPU brought back (the backend's recovery thread; issue 15 F3)
 *   cuda_handoff.c the hand-off without the host (issue 28 item 1): which collectives are queued on
 *                  the GPU as soon as they match, their words (cancel, arrived, gate), the cancel
 *                  and the verdict
 *   cuda_nan.c     --nan-check on GPU buffers: the words a checked collective's kernels note each
 *                  rank's first NaN or infinity in, and the verdict read from them (issue 30)
 *   cuda_watch.c   the thread that wakes the engine when GPU work can move (issue 15 F5)
 *   cuda_health.c  GPU health from NVML, its own thread: events, the published records, the drain
 *                  of a GPU after a fatal event (issue 30 item 2; cuda_base.c's cuda_gpu_drained
 *                  tells the files above whether a GPU is drained)
 *   cuda_seg.c     registrations across several VMM allocations, assembled from segments
 *                  (issue 15 D2)
 *   cuda_mem.c     GPU registrations (through transport/cuda_ipc), each session's flag area, and
 *                  the pooled host blocks of the words kernels write (--nan-check's, hand-offs')
 *   cuda_release.c the driver calls that unpin or unmap memory, made by the recovery thread with
 *                  the daemon's lock dropped (issue 15 F4)
 *   cuda_base.c    what all of them build on: a GPU's fault detection and usability, the lists a
 *                  reset walks, the GPUs of a registration and of a collective, the flag lines
 *
 * A lower file never names a higher one's function: where one must reach up (the watcher asking
 * whether anything can move), the higher one hands it a function pointer.
 *
 * Every driver call goes through CU_CHECK (common/cudadrv.h), which logs a failure with its
 * location; what a failure means is decided where the call is made.
 */
#ifndef COLLD_SERVER_BACKENDS_CUDA_CUDA_H
#define COLLD_SERVER_BACKENDS_CUDA_CUDA_H

#include "common/cudadrv.h"
#include "kernels/cuda/cuda_kernels.h"
#include "server/core/daemon.h"

/* The backend (registered in the registry, server/registry.c.in). */
extern const colld_backend_ops_t colld_cuda_backend;

/* A GPU's state in the daemon (cuda_recover.c): only GPU_OK takes new work. */
typedef enum {
    GPU_OK = 0,
    GPU_FAULTED,   /* a sticky error in its context: its work fails, the reset waits for quiet */
    GPU_RESETTING, /* its context is being reset (recovery thread, lock not held) */
    GPU_FAILED,    /* given up: too many resets in a row, or a reset that failed */
} gpu_state_t;

typedef struct {
    CUdevice dev;
    CUcontext ctx;
    CUuuid uuid;
    char name[96];
    bool flush_remote; /* CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES */
    /* Recovery (cuda_recover.c); under the daemon's lock but `fault`. */
    int fault; /* CUresult: the first sticky error seen in its context (atomic), 0: none */
    gpu_state_t state;
    unsigned opening;  /* registrations being opened on it with the lock dropped */
    unsigned strikes;  /* faults in a row, each soon after the previous reset */
    unsigned resets;   /* resets since start */
    uint64_t reset_ns; /* the last reset */
    char why[192];     /* why it is not GPU_OK: the CUDA error, the reset, the give-up */
    /* Health (cuda_health.c; under the daemon's lock): a fatal NVML event drained it: no new work. */
    bool drained;
    char drain_why[96];
} gpu_t;

/* The backend's state (colld_backend_t.state), NULL without a usable GPU. */
/* A block of host memory registered in one GPU's context for words the kernels write (cuda_mem.c):
 * --nan-check's (colld_coll_t.bcheck) and a hand-off's. */
typedef struct cuda_hostblk {
    void *mem;     /* host address, page aligned: registrations never overlap */
    uint64_t dptr; /* the same memory as the GPUs address it */
    size_t size;
    int gpu;        /* registered in this GPU's context ... */
    uint64_t epoch; /* ... in this epoch of it (hostblk_epoch) */
    struct cuda_hostblk *next;
} cuda_hostblk_t;

/* Released blocks of one size kept per GPU (registering costs hundreds of microseconds on
 * hardware): each pool keeps its high-water mark, bounded by the collectives in flight. */
typedef struct {
    cuda_hostblk_t **free; /* [n GPUs] */
    size_t size;           /* bytes of each block, a multiple of the page */
} cuda_hostpool_t;

typedef struct colld_gpus {
    colld_backend_t *b;
    const colld_cu_t *cu;
    colld_cuda_kernels_t *kernels; /* the embedded fatbin, loaded through the driver (kernels/cuda) */
    int n;
    gpu_t *gpu;
    bool *peer;                           /* [n][n]: i can access j's memory */
    colld_coll_t *pending, *pending_tail; /* matched, waiting for the ranks' ready flags */
    colld_coll_t *launch;                 /* every rank's stream got there: to launch (engine thread) */
    colld_coll_t *running;                /* launched, waiting for their event */
    /* Stream-ordered sends and receives (cuda_p2p.c): matched transfers waiting for both ranks'
     * streams, to launch (engine thread), launched and waiting for their event. */
    struct gpu_xfer *xpending, *xlaunch, *xrunning;
    unsigned outstanding; /* pending + launching + running, collectives and transfers */
    /* Recovery (cuda_recover.c) */
    int home;                     /* the GPU in whose context the sessions' flag areas are registered */
    bool hold;                    /* no launch on any GPU: the home GPU's reset drops the flag areas' registration */
    struct gpu_comm *comms;       /* every communicator's GPU state ... */
    struct gpu_session *sessions; /* ... every session's flag area ... */
    struct gpu_reg *regs;         /* ... and every GPU registration: what a reset drops */
    pthread_t recover_thread;
    pthread_cond_t recover_cv; /* with the daemon's lock */
    bool recover_started, recover_stop;
    /* Releases (cuda_release.c): mappings and flag areas whose last reference went, queued under the
     * lock for the recovery thread to close with the lock dropped. */
    struct gpu_reg *dead_regs;
    struct gpu_session *dead_sessions;
    /* Registrations across several VMM allocations being assembled, one per session at most
     * (cuda_seg.c), and those given up whose imported allocations are to be released. */
    struct gpu_pending *assembling;
    struct gpu_pending *dead_pending;
    /* The watcher (cuda_watch.c; issue 15 F5): wakes the engine when a GPU collective can move. */
    pthread_t watch_thread;
    pthread_cond_t watch_cv; /* with the daemon's lock: GPU work became outstanding, or stop */
    bool watching, watch_stop;
    /* What the watcher asks (cuda.c's): can cuda_progress move anything now (lock held)? */
    bool (*movable)(colld_backend_t *b);
    uint64_t rounds;      /* cuda_progress calls: the watcher wakes the engine once per round */
    uint64_t watch_wakes; /* engine wake-ups by the watcher */
    /* Persistent plans (cuda_plan.c): while any lives, the watcher looks at their ready flags. */
    struct gpu_plan *plans;
    uint64_t next_plan_id;
    /* GPU health from NVML (cuda_health.c), NULL when off or without NVML. */
    struct cuda_health *health;
    /* Host blocks registered for the kernels' words (cuda_mem.c): --nan-check's (cuda_nan.c) and
     * the hand-offs' (cuda_handoff.c), pooled per GPU, and each GPU's epoch (one more after each
     * reset of its context), under hostblk_mu (taken with or without the lock). */
    pthread_mutex_t hostblk_mu;
    uint64_t *hostblk_epoch; /* [n] */
    cuda_hostpool_t nan_blocks, ho_blocks;
    unsigned handoffs;             /* hand-offs launched, not finished: the watcher busy-polls (lock held) */
} colld_gpus_t;


/* A communicator's GPU state (colld_dcomm_t.bslot), made by its first stream-ordered descriptor. */
typedef struct gpu_comm {
    CUstream *stream; /* [n GPUs], created on first use (engine thread); dropped by a GPU's reset */
    unsigned busy;    /* pending + launching + running collectives */
    unsigned running; /* left pending (launching or launched): its kernels may run */
    bool *owe;        /* [nranks]: a release is owed once nothing runs */
    uint32_t *owed;   /* [nranks]: the done value owed */
    colld_status_t owed_status;
    bool *base_set;               /* [nranks]: the rank posted a stream-ordered collective: base[] is its flag base */
    uint32_t *base;               /* [nranks] */
    uint32_t *last;               /* [nranks]: flag value of its last stream-ordered collective */
    bool handoff_said;            /* its first hand-off without the host was logged (issue 28) */
    struct gpu_comm *next, *prev; /* colld_gpus_t.comms */
} gpu_comm_t;

/* A session's GPU stream flag area (colld_session_t.bslot): made on the first COLLD_MSG_GPU_FLAGS. */
typedef struct gpu_session {
    colld_wire_gpu_flag_t *flags;
    size_t size;
    int fd;
    uint64_t dptr; /* the same memory as the GPUs address it */
    uint32_t lines;
    uint32_t plans;                   /* plan lines after the flag lines (proto/wire.h) */
    struct gpu_plan_part **plan_line; /* [plans]: the plan part that owns each, PLAN_LINE_PENDING, or NULL */
    bool registered;                  /* with CUDA, in GPU reg_gpu's context (a reset of that GPU drops it) */
    int reg_gpu;                      /* the home GPU when it was registered */
    struct gpu_session *next, *prev; /* colld_gpus_t.sessions */
} gpu_session_t;

/* A GPU registration's part (colld_reg_t.bpriv). */
typedef struct gpu_reg {
    int gpu;       /* index of the daemon's GPU that holds it */
    int how;       /* colld_cuda_export_t */
    bool lost;     /* its mapping went with its GPU's context (a reset): never used again */
    CUdeviceptr p; /* the daemon's mapping ... */
    size_t size;   /* ... of this many bytes (what colld_cuda_ipc_close needs) */
    unsigned nseg; /* VMM allocations mapped back to back from p (issue 15 D2); 0 or 1: one */
    size_t *seg;   /* [nseg] their sizes, when nseg > 1 */
    uint8_t ipc[COLLD_WIRE_CUDA_IPC_BYTES];
    colld_reg_t *reg;            /* NULL once its last reference went (queued for release) */
    struct gpu_reg *next, *prev; /* colld_gpus_t.regs */
} gpu_reg_t;

/* A registration across several VMM allocations being assembled (COLLD_MSG_REG_CUDA_SEG, issue 15
 * D2): the allocations imported so far, not mapped yet. */
typedef struct gpu_pending {
    colld_session_t *s;
    uint64_t cookie, total;
    uint64_t next_off; /* the bytes of the segments imported so far: the next one's offset */
    unsigned count;    /* segments announced */
    unsigned got;      /* imported: h[0 .. got - 1] */
    int gpu;
    uint8_t uuid[16];
    size_t *sizes;                   /* [count] */
    CUmemGenericAllocationHandle *h; /* [count] */
    struct gpu_pending *next;
} gpu_pending_t;

/* The state of the backend b, of a communicator and of a session (NULL when none). */
static inline colld_gpus_t *gpus_of(const colld_backend_t *b)
{
    return b->state;
}
static inline gpu_comm_t *gpu_comm_of(const colld_backend_t *b, const colld_dcomm_t *c)
{
    return c->bslot[b->slot];
}
static inline gpu_session_t *gpu_session_of(const colld_backend_t *b, const colld_session_t *s)
{
    return s->bslot[b->slot];
}

/* The byte offset of plan line `line` in a session's flag area (proto/wire.h: after the flag lines). */
static inline uint64_t cuda_plan_line_offset(const gpu_session_t *gs, uint32_t line)
{
    return (uint64_t)gs->lines * sizeof(colld_wire_gpu_flag_t) + (uint64_t)line * sizeof(colld_wire_gpu_plan_t);
}

/* Append x to the FIFO list that starts at `head` (linked by `next`; the lists are short). */
#define CUDA_LIST_APPEND(head, x)                                                                                      \
    do {                                                                                                               \
        __typeof__(x) *tail_ = &(head);                                                                                \
        while (*tail_)                                                                                                 \
            tail_ = &(*tail_)->next;                                                                                   \
        (x)->next = NULL;                                                                                              \
        *tail_ = (x);                                                                                                  \
    } while (0)

/* ---- cuda_base.c ---- */
/* Is r an error that leaves the context unusable (a sticky error)? */
bool cuda_sticky(CUresult r);
/* What an error message adds after a CUDA error r: that colld resets the GPU when r is sticky. */
const char *cuda_reset_hint(CUresult r);
/* A call in GPU gi's context (gi < 0: the calling thread's current one) returned r: if r is
 * sticky, the GPU is marked for recovery (any thread, any lock state). */
void cuda_gpu_fault(colld_gpus_t *g, int gi, CUresult r);
/* NULL when GPU gi takes new work; else why not, in buf (lock held). */
const char *cuda_gpu_unusable(const colld_gpus_t *g, int gi, char *buf, size_t len);
/* NULL when GPU gi is not drained after a fatal health event (cuda_health.c); else why it takes
 * no new work, in buf (lock held). */
const char *cuda_gpu_drained(const colld_gpus_t *g, int gi, char *buf, size_t len);
/* Wake the watcher (cuda_watch.c) after GPU work became outstanding (lock held). */
void cuda_watch_kick(colld_gpus_t *g);
/* List membership of what a reset must drop (lock held). */
void cuda_track_comm(colld_gpus_t *g, gpu_comm_t *gc, bool add);
void cuda_track_session(colld_gpus_t *g, gpu_session_t *gs, bool add);
void cuda_track_reg(colld_gpus_t *g, gpu_reg_t *gr, bool add);
/* The GPU of a registration (its backend part), -1 for none. */
int cuda_reg_gpu(const colld_reg_t *r);
/* The GPUs a collective uses (used[0..n-1]): those of the ranks' buffers, GPU 0 when none. */
void cuda_coll_gpus(const colld_coll_t *k, bool *used, int n);
/* The ready slot of a rank's stream-ordered operation in its session's flag area, and the value its
 * stream writes there: flag base + (uint32_t)operation id, slot id % COLLD_WIRE_GPU_READY_SLOTS
 * (proto/wire.h); NULL when the session has no line for the handle (lock held). */
uint32_t *cuda_ready_slot(colld_backend_t *b, const colld_op_t *op, uint32_t *want);
/* Where a run's stream writes rank op's `done` and what: the plan line's done and 1 for a plan
 * run, else the communicator line's done and the collective's flag value (cuda_launch.c). */
void cuda_done_target(colld_backend_t *b, const colld_op_t *op, CUdeviceptr *addr, cuuint32_t *value);
/* Move a flag line's `done` forward (never back) to `value`, with `status` first when st is an
 * error: a release, or (COLLD_OK) the completion of a stream-ordered send or receive (lock held). */
void cuda_flag_release(colld_backend_t *b, colld_session_t *s, uint32_t handle, uint32_t value, colld_status_t st);
/* Write the releases a communicator owes, once nothing of it runs on a GPU any more (lock held). */
void cuda_pay_releases(colld_backend_t *b, colld_dcomm_t *c);

/* ---- cuda_launch.c: the launch layer ---- */
/* The communicator's stream on GPU gi, created on first use; gi's context current. CUDA_SUCCESS
 * or the driver's error. */
CUresult cuda_comm_stream(const colld_gpus_t *g, gpu_comm_t *gc, int gi);
/* A launch failed part-way: wait for what it enqueued on GPU gi's stream (a failed wait is a
 * fault of gi: its context runs nothing more). */
void cuda_stream_drain(colld_gpus_t *g, int gi, CUstream stream);
/* Poll an event recorded on GPU gi: CUDA_SUCCESS (fired), CUDA_ERROR_NOT_READY or the error. */
CUresult cuda_event_query(const colld_gpus_t *g, int gi, CUevent ev);
/* An event of GPU gi reported r: the fault is recorded (a sticky one resets the GPU) and why says
 * "<what> failed on GPU <gi> (<name>): <error>". */
void cuda_event_failed(colld_gpus_t *g, int gi, CUresult r, const char *what, char *why, size_t len);
/* Is work whose first rank arrived at `first` past the communicator's timeout_ms? When not,
 * *deadline is brought forward to when it will be. */
bool cuda_past_due(uint64_t first, int timeout_ms, uint64_t now, uint64_t *deadline);
/* Append " r1 r2 ..." (at most 8, then " ...") of the nmissing ranks to buf at off: the new off. */
int cuda_rank_list(char *buf, size_t len, int off, const int *missing, int nmissing);
/* NULL when collective k can run: its GPUs working, its registrations mapped, its ranks' flag
 * areas registered; else why not, in buf (lock held). */
const char *cuda_coll_unusable(colld_backend_t *b, const colld_coll_t *k, char *buf, size_t len);
/* Launch the collectives on the launch list (engine thread, lock NOT held); true when anything was. */
bool cuda_launch(colld_backend_t *b);

/* ---- cuda_coll.c ---- */
colld_status_t cuda_admit(colld_backend_t *b, colld_op_t *op, colld_err_t *err);
void cuda_submit(colld_backend_t *b, colld_coll_t *k);
/* Finish the launched collectives whose event has fired (lock held). Returns the work done. */
int cuda_coll_fired(colld_backend_t *b);
/* Move the matched collectives every rank's stream has reached to the launch list (in order per
 * communicator), install plans, time out the others (lock held). Returns the work done; *broke
 * when a break may have changed every list (the caller returns). */
int cuda_coll_progress(colld_backend_t *b, uint64_t now, uint64_t *deadline, bool *broke);
/* Can cuda_coll_fired or cuda_coll_progress move a collective now: every rank's stream reached
 * the first pending one of a communicator, or the first launched one's event fired (lock held)? */
bool cuda_coll_movable(colld_backend_t *b);
/* The launch list comes back (lock held). */
void cuda_launched(colld_backend_t *b);
bool cuda_comm_busy(const colld_backend_t *b, const colld_dcomm_t *c);
void cuda_stream_failed(colld_backend_t *b, colld_session_t *s, const colld_wire_sqe_t *sqe, uint64_t id,
                        colld_status_t st);
/* backend.h `waiting`: the first pending collective of each communicator, with the ranks whose
 * streams reached it (deadlock detection). Lock held. */
void cuda_waiting(colld_backend_t *b, void (*fn)(void *arg, const colld_coll_t *k, const bool *arrived), void *arg);
/* c broke: its matched collectives not launched fail, every rank's stream is released (lock held;
 * the caller holds a reference on c). */
void cuda_coll_comm_broken(colld_backend_t *b, colld_dcomm_t *c);
/* c is freed: its GPU state goes (lock held). */
void cuda_comm_freed(colld_backend_t *b, colld_dcomm_t *c);

/* ---- cuda_p2p.c (issue 16: sends and receives on GPU buffers) ---- */
/* backend.h `xfer_submit`: a matched send and receive, both stream-ordered (lock held). */
void cuda_xfer_submit(colld_backend_t *b, colld_xfer_t *x);
/* Progress the transfers (lock held): finish those whose copy is done, move those both ranks'
 * streams reached to the launch list, time out the others. Returns the work done. */
int cuda_p2p_progress(colld_backend_t *b, uint64_t now, uint64_t *deadline);
/* Can cuda_p2p_progress move a transfer now (lock held; no side effect)? */
bool cuda_p2p_movable(colld_backend_t *b);
/* Launch what cuda_p2p_progress found ready (engine thread, lock NOT held); true when anything was.
 * cuda_p2p_launched takes the launch list back (lock held). */
bool cuda_p2p_launch(colld_backend_t *b);
void cuda_p2p_launched(colld_backend_t *b);
/* c broke: its transfers not launched fail (lock held). */
void cuda_p2p_comm_broken(colld_backend_t *b, colld_dcomm_t *c);
/* backend.h `xfer_waits`: c's pending transfers of which one rank's stream reached its operation and
 * the other's has not: fn(arg, op) for the op of the rank that waits (lock held). */
void cuda_p2p_waits(colld_backend_t *b, const colld_dcomm_t *c, void (*fn)(void *arg, const colld_op_t *op),
                    void *arg);
/* Does a launched transfer still use GPU gi (any GPU: `any`), or is one being launched? (lock held) */
bool cuda_p2p_busy(const colld_gpus_t *g, int gi, bool any);

/* ---- cuda_recover.c ---- */
/* Start and stop the recovery thread (lock not held). */
int cuda_recover_start(colld_gpus_t *g);
void cuda_recover_stop(colld_gpus_t *g);

/* ---- cuda_health.c (issue 30 item 2) ---- */
/* Publish a health record per GPU (colld_daemon_t.gpu_health) and start the thread that reads them
 * from NVML every --gpu-health-ms; without NVML the records say why (lock not held). 0, or -1
 * without memory. */
int cuda_health_start(colld_gpus_t *g);
void cuda_health_stop(colld_gpus_t *g);
/* ---- cuda_nan.c (issue 30: --nan-check on GPU buffers) ---- */
/* Are collective k's inputs checked: --nan-check (the daemon's, or its communicator's), a
 * reduction, a floating-point dtype? (Any lock state: neither changes once the communicator formed.) */
bool cuda_nan_wanted(const colld_backend_t *b, const colld_coll_t *k);
/* Give k its words (k->bcheck), every one COLLD_CUDA_NAN_NONE, registered in GPU gi's context
 * (its lead's): CUDA_SUCCESS, or the error of the registration. Engine thread, lock NOT held. */
CUresult cuda_nan_arm(colld_gpus_t *g, colld_coll_t *k, int gi);
/* The check of a reduce launch of k on GPU gi whose element 0 is the collective's element `base`,
 * filled in *out; NULL when k is not checked. */
const colld_cuda_nan_check_t *cuda_nan_check(const colld_coll_t *k, int gi, uint64_t base, colld_cuda_nan_check_t *out);
/* After k's event fired: COLLD_ERR_NUMERIC with the host backend's detail in why (every rank whose
 * input held a NaN or an infinity, its first one), or COLLD_OK (also when k is not checked). */
colld_status_t cuda_nan_verdict(const colld_gpus_t *g, const colld_coll_t *k, char *why, size_t len);
/* k is done with its words (lock held): back to the pool. */
void cuda_nan_release(colld_gpus_t *g, colld_coll_t *k);

/* ---- cuda_handoff.c (issue 28 item 1) ---- */
/* Does collective k (matched, lock held) take the hand-off without the host: not
 * --gpu-early-launch, its buffers on one GPU, every rank's flag line there? */
bool cuda_handoff_wanted(colld_backend_t *b, const colld_coll_t *k);
/* Give k its hand-off (k->bhand): the addresses of every rank's ready slot and done word (lock
 * held). COLLD_OK or COLLD_ERR_NO_MEMORY. */
colld_status_t cuda_handoff_prepare(colld_backend_t *b, colld_coll_t *k);
/* Give k's hand-off its words, zero, registered in GPU gi's context; *h what the kernels get.
 * Engine thread, lock NOT held. CUDA_SUCCESS or the registration's error. */
CUresult cuda_handoff_arm(colld_gpus_t *g, colld_coll_t *k, int gi, const colld_cuda_handoff_t **h);
/* The device address of k's gate (NULL: k has no armed hand-off). */
const uint32_t *cuda_handoff_gate(const colld_coll_t *k);
/* Its launch failed part-way (engine thread, lock NOT held): the cancel word is written, then the
 * awaited values into the slots short of them, so that the waits enqueued end before the launch
 * drains its stream. */
void cuda_handoff_abandon(colld_coll_t *k);
/* k is back from its launch (lock held): a cancel asked for meanwhile is written now. */
void cuda_handoff_launched(colld_coll_t *k);
/* Abandon k's hand-off (lock held; nothing when k has none): its cancel word is written, then the
 * awaited values into the slots short of them (its stream waits end; the gate stays shut). */
void cuda_handoff_cancel(colld_coll_t *k);
/* Did k's wait open the gate (every rank arrived before any cancel)? */
bool cuda_handoff_open(const colld_coll_t *k);
/* Does k's hand-off still wait for the ranks' streams (not open, not abandoned)? */
bool cuda_handoff_waits(const colld_coll_t *k);
/* k is finished (lock held): its words back to the pool, its hand-off freed. */
void cuda_handoff_release(colld_gpus_t *g, colld_coll_t *k);

/* ---- cuda_watch.c (issue 15 F5) ---- */
/* Start the thread that wakes the engine when movable(b) says GPU work can move: 0, or -1 (then
 * the engine polls every millisecond). */
int cuda_watch_start(colld_gpus_t *g, bool (*movable)(colld_backend_t *b));
void cuda_watch_stop(colld_gpus_t *g);

/* ---- cuda_seg.c (issue 15 D2) ---- */
/* COLLD_MSG_REG_CUDA_SEG: one segment of a registration across several VMM allocations; *reg_id
 * 0 until the last segment makes the registration. Lock NOT held. */
colld_status_t cuda_seg_register(colld_backend_t *b, colld_session_t *s, const colld_wire_msg_t *m, int fd,
                                 uint32_t *reg_id, colld_err_t *err);
/* The session ends (lock held): its assembly, if any, is queued for release. */
void cuda_seg_session_gone(colld_gpus_t *g, colld_session_t *s);

/* ---- cuda_mem.c ---- */
/* COLLD_MSG_REG_CUDA (lock NOT held). */
colld_status_t cuda_mem_register(colld_backend_t *b, colld_session_t *s, const colld_wire_msg_t *m, int fd,
                                 uint32_t *reg_id, colld_err_t *err);
void cuda_mem_release(colld_backend_t *b, colld_reg_t *r);
/* The daemon's GPU of this UUID, or -1. */
int cuda_gpu_by_uuid(const colld_gpus_t *g, const uint8_t *uuid);
/* The devices that may access GPU gi's memory (itself and its peers): their count. */
int cuda_access_list(const colld_gpus_t *g, int gi, CUdevice *access, int max);
/* Does the memory mapped at p live on GPU gi (issue 15 C5)? COLLD_OK or err. gi's context current. */
colld_status_t cuda_check_device(const colld_gpus_t *g, int gi, CUdeviceptr p, colld_err_t *err);
/* Make gr (its mapping open on GPU gr->gpu, counted there as `opening`) a registration of s of
 * `bytes`: its id in *reg_id. Without memory the mapping is closed and gr freed. Either way the
 * `opening` count is given back. Lock NOT held. */
colld_status_t cuda_reg_publish(colld_backend_t *b, colld_session_t *s, gpu_reg_t *gr, uint64_t bytes, uint32_t *reg_id,
                                colld_err_t *err);
/* Register a flag area (flags, size) with CUDA in GPU gi's context, portable and device-mapped:
 * CUDA_SUCCESS with its device address in *dptr, or the error (a sticky one marks gi for
 * recovery). Lock NOT held: the caller publishes the result under it. */
CUresult cuda_flags_register(colld_gpus_t *g, int gi, void *flags, size_t size, uint64_t *dptr);
/* Pool p of blocks of `bytes` (rounded up to pages) for each of ngpus GPUs: 0, or -1 without memory. */
int cuda_hostpool_init(cuda_hostpool_t *p, int ngpus, size_t bytes);
/* A block of p registered in GPU gi's context (a pooled one, or a new one: registered with the
 * lock NOT held). NULL with *r the error. Its contents are what the last user left. */
cuda_hostblk_t *cuda_hostblk_get(colld_gpus_t *g, cuda_hostpool_t *p, int gi, CUresult *r);
/* Back to p, or freed when its GPU's context was reset since it was registered (any lock state). */
void cuda_hostblk_put(colld_gpus_t *g, cuda_hostpool_t *p, cuda_hostblk_t *x);
/* GPU gi's context is about to be reset (lock held): the pooled blocks registered in it go, and
 * blocks in use are freed when they come back. */
void cuda_hostblk_gpu_reset(colld_gpus_t *g, int gi);
/* Stop (no collective left): every pooled block unregistered and freed, the pools too. */
void cuda_hostblk_free_all(colld_gpus_t *g);
int cuda_sync_area(colld_backend_t *b, colld_session_t *s, uint64_t *size, uint32_t *lines, uint32_t *plans,
                   colld_err_t *err);
void cuda_session_free(colld_backend_t *b, colld_session_t *s);

/* ---- cuda_release.c (issue 15 F4) ---- */
/* Queue the mapping of a registration whose last reference went, untracked (lock held). */
void cuda_release_reg(colld_gpus_t *g, gpu_reg_t *gr);
/* Queue a session's flag area, untracked (lock held). */
void cuda_release_session(colld_gpus_t *g, gpu_session_t *gs);
/* Is anything queued (lock held)? */
bool cuda_release_pending(const colld_gpus_t *g);
/* Make the queued driver calls: lock held on entry and return, dropped while they run (the
 * recovery thread; cuda_stop once that thread has ended). */
void cuda_release_run(colld_gpus_t *g);
/* Close a registration's mapping now (lock NOT held, or no other thread left). */
void cuda_mem_close(const colld_gpus_t *g, const gpu_reg_t *gr);
/* Free a gpu_reg_t (its mapping closed or lost). */
void cuda_reg_free(gpu_reg_t *gr);
/* Release an assembly's imported allocations and free it (lock NOT held). */
void cuda_seg_free(const colld_gpus_t *g, gpu_pending_t *p);

#endif /* COLLD_SERVER_BACKENDS_CUDA_CUDA_H */
