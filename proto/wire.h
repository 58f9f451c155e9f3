/*
 * wire.h - the shared-memory and session-socket wire format between libcolld and colld.
 *
 * Both sides compile this header; nothing here is public API. The daemon treats every byte a
 * client can write (its rings, its messages) as untrusted input and validates it before use.
 *
 * Session shared memory (one memfd per session, created by the daemon, mapped by both):
 *
 *   colld_wire_shm_t  header, ring control words on their own cache lines
 *   sq entries        colld_wire_sqe_t[sq_entries]   client -> daemon work descriptors
 *   cq entries        colld_wire_cqe_t[cq_entries]   daemon -> client completions
 *
 * Doorbells:
 *   - client -> daemon: the daemon sets sq.need_wakeup before it sleeps in epoll; a client that
 *     pushed work and sees need_wakeup writes the session eventfd (io_uring SQPOLL style). No
 *     system call while the daemon is awake.
 *   - client -> daemon, completion space: the daemon takes a descriptor only with a completion
 *     slot free for it. When descriptors wait and the completion ring is full, it sets
 *     cq.need_wakeup and stops looking at the session; a client that consumed completions
 *     (advanced cq.tail) and sees cq.need_wakeup writes the session eventfd.
 *   - daemon -> client: cq.doorbell is a futex word bumped after every batch of completions; the
 *     daemon calls FUTEX_WAKE only when cq.waiters is non-zero.
 */
#ifndef COLLD_PROTO_WIRE_H
#define COLLD_PROTO_WIRE_H

#include <colld/colld.h>
#include <stdint.h>

#define COLLD_WIRE_MAGIC 0x434f4c44u /* "COLD" */
/* 2: per-collective GPU ready slots (colld_wire_gpu_flag_t); 3: point-to-point (COLLD_KIND_SEND /
 * COLLD_KIND_RECV, COLLD_SQE_LINK) and the collective ordinal (below); 4: persistent plans of
 * captured collectives (COLLD_SQE_PLAN, colld_wire_gpu_plan_t, COLLD_MSG_PLAN_FREE); 5: the
 * premultiplied sum (COLLD_REDOP_PREMUL_SUM, its scalar in the descriptor and in the fast area's
 * slot header); 6: GPU registrations across several VMM allocations (COLLD_MSG_REG_CUDA_SEG); 7: GPU
 * stream flag values and ready slots by operation id instead of collective ordinal; 8: a REG memfd
 * is allocated in full by the client and open to the daemon's seals (no F_SEAL_SEAL): the daemon
 * adds F_SEAL_FUTURE_WRITE once it has mapped it and refuses a buffer with a page missing */
#define COLLD_WIRE_VERSION 8
#define COLLD_WIRE_TOKEN_BYTES 16
/* A unique id (the 128 bytes of colld_unique_id_t): 16 random bytes; an id made by a daemon that
 * listens for peers (multi-node) also carries "CLN1" at byte 16 and that daemon's address
 * "HOST:PORT" (NUL-terminated) from byte 20. Unused bytes are zero. */
#define COLLD_WIRE_UNIQUE_ID_BYTES 128
#define COLLD_WIRE_UID_RANDOM_BYTES 16
#define COLLD_WIRE_UID_NET_MAGIC "CLN1"
#define COLLD_WIRE_UID_ADDR_OFFSET 20
#define COLLD_WIRE_CACHELINE 64

/* ---------------------------------------------------------------------------------------------
 * Work descriptors
 * ------------------------------------------------------------------------------------------- */

typedef enum {
    COLLD_KIND_ALLREDUCE = 1,
    COLLD_KIND_BROADCAST = 2,
    COLLD_KIND_REDUCE = 3,
    COLLD_KIND_ALLGATHER = 4,
    COLLD_KIND_REDUCESCATTER = 5,
    /* Single-node communicators only, never the fast area (host buffers: the host backend; GPU
     * buffers, COLLD_SQE_STREAM: the CUDA backend): gather to a root, scatter from a root,
     * all-to-all of equal blocks. */
    COLLD_KIND_GATHER = 6,
    COLLD_KIND_SCATTER = 7,
    COLLD_KIND_ALLTOALL = 8,
    /* Point-to-point (single-node communicators; host buffers, or GPU buffers with
     * COLLD_SQE_STREAM): `root` is the
     * peer; a send's data is in `send`, a receive's goes to `recv`. The k-th send of rank a to
     * rank b is matched with the k-th receive of rank b from rank a; both must have the same dtype
     * and count. */
    COLLD_KIND_SEND = 9,
    COLLD_KIND_RECV = 10,
} colld_kind_t;
#define COLLD_KIND_MAX COLLD_KIND_RECV

/* Whether a kind is point-to-point (a send or a receive) rather than a collective. */
static inline int colld_kind_is_p2p(unsigned kind)
{
    return kind == COLLD_KIND_SEND || kind == COLLD_KIND_RECV;
}

/* A buffer reference: a registration of the submitting session plus a byte offset into it. `aux`
 * belongs to the descriptor, not to the buffer: 0, except in a premultiplied sum (below). */
typedef struct {
    uint32_t reg_id;
    uint32_t aux;
    uint64_t offset;
} colld_wire_buf_t;

/* sqe.redop is a colld_redop_t (COLLD_SUM .. COLLD_AVG) or, on the wire only, the premultiplied sum
 * (colld_redop_create_premul_sum: an application names it by a handle of its communicator, which
 * libcolld resolves before posting). Its number follows the API's ops (the CPU and CUDA kernels use
 * the same one). The rank's own scalar travels in the descriptor as a scalar word: a uint64_t whose
 * first bytes (memcpy) hold one value of sqe.dtype and whose other bytes are zero (NCCL's opArg),
 * split as send.aux = its low 32 bits and recv.aux = its high 32 bits (colld_wire_sqe_scalar). The
 * daemon refuses a word with bytes past the dtype's, and aux words that are not 0 in any other
 * descriptor (fast-path records included: they carry no scalar). Ranks may pass different scalars:
 * the scalar is no part of the signature that matching compares. */
#define COLLD_REDOP_PREMUL_SUM 5
#define COLLD_WIRE_REDOPS 6 /* sqe.redop < COLLD_WIRE_REDOPS */
_Static_assert(COLLD_REDOP_PREMUL_SUM == COLLD_REDOP_COUNT && COLLD_WIRE_REDOPS == COLLD_REDOP_COUNT + 1,
               "the premultiplied sum follows the API's ops");

/* sqe.flags */
/* A record, not a request: a rank that has waited a while for a collective on the
 * communicator's fast area (below), or that saw a different call in a peer's slot, tells the daemon
 * so. The daemon checks it against the other ranks (their records, their engine descriptors and
 * their slots) for a signature mismatch and for the time-out, records it in the flight recorder,
 * executes nothing and posts no completion. `send.offset` carries the rank's arrival time
 * (CLOCK_MONOTONIC ns). Collectives that nobody waited for produce no record; their sequence
 * numbers are simply skipped in the descriptors the daemon sees. Slots and records name the
 * collective by its ordinal (below). */
#define COLLD_SQE_FAST 0x01u
/* GPU buffers, stream-ordered (the CUDA backend): both buffer references name CUDA registrations
 * (COLLD_MSG_REG_CUDA) of the session. `reserved` carries the rank's flag base for this
 * communicator (below); the flag value of the operation is base + (uint32_t)seq (its operation id,
 * not its collective ordinal: a send or receive has no ordinal of its own). The rank's CUDA
 * stream writes that value into the operation's `ready` slot of the session's GPU flag line of
 * this communicator handle (COLLD_MSG_GPU_FLAGS) once the inputs are ready, and waits for `done`
 * to reach it. The daemon launches the kernels only when every rank's slot holds exactly that
 * value (so a kernel never runs on the buffers of a rank whose stream did not get there, and such
 * a rank is named in the time-out), then its own stream writes `done`.
 * The completion is posted when the kernels have finished. */
#define COLLD_SQE_STREAM 0x02u
/* Point-to-point only: this operation and the rank's next one on the communicator belong to one
 * group (colld_group_start/end) and run concurrently, as one batch: the batch is the run of
 * operations up to and including the first without this flag. Operations outside a batch run in
 * the order the rank posted them, one after the other. A batch is all stream-ordered
 * (COLLD_SQE_STREAM) or all not; a stream-ordered batch is ready as a whole: only its last
 * operation's `ready` slot is written (below, "Sends and receives"). */
#define COLLD_SQE_LINK 0x04u
/* With COLLD_SQE_STREAM: not a collective to run now but a collective captured into a CUDA graph,
 * to register as a persistent plan of the communicator (client/cuda_graph.c,
 * server/backends/cuda/cuda_plan.c). It is numbered and matched like any collective (the same
 * call on every rank, else COLLD_ERR_MISMATCH), and completes once the daemon holds the plan;
 * `reserved` carries the plan line of the session's GPU flag area that the rank's graph uses
 * (colld_wire_gpu_plan_t, below). Every replay of the graph then runs the collective once. */
#define COLLD_SQE_PLAN 0x08u

/* One work descriptor (64 bytes). `seq` is the operation's id: it counts every operation (collective
 * or point-to-point) from 1 per (session, communicator handle), and completions carry it.
 *
 * The collective ordinal: collectives are numbered alike on every rank, point-to-point operations
 * are not (only two ranks post each). A collective's ordinal is its `seq` minus the number of
 * point-to-point operations the rank posted before it (the daemon counts them as it admits them,
 * in ring order; the client counts the same); a point-to-point operation's ordinal is that of the
 * rank's next collective. Everything that names a collective across ranks uses the ordinal: the
 * fast area's slots and records, the flight recorder, time-outs and mismatch reports ("collective
 * #N"). The GPU stream flag values and ready slots are per rank and use the operation id (below).
 * Without point-to-point operations the two are equal.
 * `reserved` is 0, except in COLLD_SQE_STREAM descriptors (the flag base; with COLLD_SQE_PLAN the
 * plan line); send.aux and recv.aux are 0, except in a premultiplied sum (its scalar word, above). */
typedef struct {
    uint64_t seq;
    uint64_t count;
    uint32_t comm;     /* session-local communicator handle from CommInit */
    uint8_t kind;      /* colld_kind_t */
    uint8_t dtype;     /* colld_dtype_t */
    uint8_t redop;     /* colld_redop_t, or COLLD_REDOP_PREMUL_SUM */
    uint8_t flags;
    int32_t root;
    uint32_t reserved;
    colld_wire_buf_t send;
    colld_wire_buf_t recv;
} colld_wire_sqe_t;

/* One completion (32 bytes). seq 0 is a notice, not a completion: the communicator broke with
 * `status` (sent to ranks with nothing in flight, so their async-error query sees it). */
typedef struct {
    uint64_t seq;
    uint32_t comm;
    int32_t status; /* colld_status_t */
    uint64_t reserved[2];
} colld_wire_cqe_t;

_Static_assert(sizeof(colld_wire_sqe_t) == 64, "sqe layout");
_Static_assert(sizeof(colld_wire_cqe_t) == 32, "cqe layout");

/* The scalar word of a premultiplied-sum descriptor (send.aux low, recv.aux high). */
static inline uint64_t colld_wire_sqe_scalar(const colld_wire_sqe_t *d)
{
    return (uint64_t)d->recv.aux << 32 | d->send.aux;
}

/* Put a scalar word into a descriptor (its buffer references already filled). */
static inline void colld_wire_sqe_set_scalar(colld_wire_sqe_t *d, uint64_t word)
{
    d->send.aux = (uint32_t)word;
    d->recv.aux = (uint32_t)(word >> 32);
}

/* ---------------------------------------------------------------------------------------------
 * Session shared memory
 * ------------------------------------------------------------------------------------------- */

/* Ring control: the producer owns `head`, the consumer owns `tail`; both count entries ever
 * pushed/popped (index = counter & (entries - 1)). */
typedef struct {
    _Alignas(COLLD_WIRE_CACHELINE) uint64_t head;
    _Alignas(COLLD_WIRE_CACHELINE) uint64_t tail;
    _Alignas(COLLD_WIRE_CACHELINE) uint32_t doorbell; /* futex word (cq) */
    uint32_t waiters;                                   /* cq: consumer sleeps on doorbell */
    uint32_t need_wakeup;                               /* daemon waits: write the eventfd (below) */
    uint32_t reserved;
} colld_wire_ring_t;

typedef struct {
    uint32_t magic;
    uint32_t version;
    uint32_t sq_entries; /* power of two */
    uint32_t cq_entries; /* power of two */
    uint64_t sq_offset;  /* byte offset of the sqe array from the start of the mapping */
    uint64_t cq_offset;
    uint64_t total_size;
    colld_wire_ring_t sq;
    colld_wire_ring_t cq;
} colld_wire_shm_t;

/* ---------------------------------------------------------------------------------------------
 * Fast area: one memfd per single-node communicator, created by the daemon and mapped by every
 * member (COLLD_MSG_FAST_AREA). Small collectives run here without the daemon on the critical
 * path: each rank copies its input into its slot for that collective (by ordinal, called seq here:
 * see colld_wire_sqe_t) and publishes the slot
 * header's `seq` last (release); every rank waits until all slots of that sequence are published
 * with the same signature, then computes its own output from the slots in rank order. A rank
 * finishes its previous collective on the communicator before it starts the next, so two slots
 * per rank (by seq parity) are never overwritten while a peer still reads them. In a
 * premultiplied sum each rank's slot header carries that rank's scalar word (`scalar`), by which
 * every rank multiplies that rank's input when it computes its output.
 *
 *   colld_wire_fast_t       header: the daemon's verdict and a futex word
 *   stats[rank]             colld_wire_fast_stats_t: what each rank finished here (metrics)
 *   slot[rank][seq % 2]     colld_wire_fast_slot_t + slot_bytes of payload, 64-byte aligned
 *
 * The daemon writes only `status` (the error that broke the communicator) and wakes `gen`. It
 * reads the slot headers (which sequence number each rank has reached, with what signature) to
 * resolve records and time-outs, and the stats for its metrics; both are the tenant's own
 * untrusted data, only ever compared or counted. Ranks treat peers' slots as untrusted too
 * (signature and sizes are checked against their own call before any byte is used).
 * ------------------------------------------------------------------------------------------- */

#define COLLD_WIRE_FAST_MAGIC 0x46415354u /* "FAST" */
#define COLLD_WIRE_FAST_DEPTH 2

typedef struct {
    uint32_t magic;
    uint32_t nranks;
    uint32_t slot_bytes;  /* payload bytes per slot: the largest per-rank input on this path */
    uint32_t slot_stride; /* bytes from one slot header to the next */
    uint64_t total_size;
    _Alignas(COLLD_WIRE_CACHELINE) int32_t status; /* 0, or the colld_status_t that broke it */
    uint32_t gen;      /* futex word: bumped by every published slot and by the daemon */
    uint32_t sleepers; /* ranks asleep on gen: a publisher wakes them only when non-zero */
    uint32_t reserved;
} colld_wire_fast_t;

typedef struct {
    uint64_t seq; /* published last: the slot holds collective `seq`; 0 while it is rewritten */
    uint64_t count;
    uint8_t kind, dtype, redop, flags;
    int32_t root;
    uint64_t arrival_ns; /* when the rank published it (CLOCK_MONOTONIC) */
    uint64_t scalar;     /* a premultiplied sum: the rank's scalar word (as the descriptor's); else 0 */
    uint64_t reserved[3];
} colld_wire_fast_slot_t;

/* Collectives a rank finished on the fast area, by kind (1..5) and dtype; written by that rank
 * only. */
#define COLLD_WIRE_FAST_KINDS 5
#define COLLD_WIRE_FAST_DTYPES 10
typedef struct {
    uint64_t ops[COLLD_WIRE_FAST_KINDS][COLLD_WIRE_FAST_DTYPES];
    uint64_t bytes[COLLD_WIRE_FAST_KINDS][COLLD_WIRE_FAST_DTYPES];
    uint64_t reserved[4];
} colld_wire_fast_stats_t;

_Static_assert(sizeof(colld_wire_fast_slot_t) == 64, "fast slot header layout");
_Static_assert(sizeof(colld_wire_fast_stats_t) % 64 == 0, "fast stats layout");

/* Byte offsets inside the area. */
#define COLLD_WIRE_FAST_STATS_OFFSET ((sizeof(colld_wire_fast_t) + 63) & ~(size_t)63)
#define COLLD_WIRE_FAST_SLOTS_OFFSET(nranks) \
    (COLLD_WIRE_FAST_STATS_OFFSET + (size_t)(nranks) * sizeof(colld_wire_fast_stats_t))

/* ---------------------------------------------------------------------------------------------
 * GPU stream flags: one memfd per session (COLLD_MSG_GPU_FLAGS), created by the daemon on the
 * first request, mapped and registered with CUDA (cuMemHostRegister, device-mapped) by both
 * sides. Line h belongs to communicator handle h (COLLD_WIRE_GPU_LINES(max comms per session)
 * lines; handle 0 unused).
 *
 * Flag values: a line outlives the communicators that use its handle one after another, so the
 * values keep growing across them: at its first stream-ordered collective a communicator takes
 * base = the line's current `done` + 1 and uses v = base + (uint32_t)seq for operation seq (its
 * operation id, see colld_wire_sqe_t: collectives, sends and receives alike; a flag line is one
 * rank's, so values need not agree across ranks, and a rank's operations on a communicator complete
 * in the order it posted them, so `done` only grows),
 * sending the base in every such descriptor (the daemon refuses a rank whose base changes). Waits
 * left over from an earlier communicator on the same line are thereby satisfied (while `done` is
 * less than 2^31 past them: two releases of later communicators before an old stream reaches its
 * wait would leave it waiting, a known limit).
 *
 *   ready[]  one word per operation in flight (issue 15 E1: NCCL lets every call use its own
 *            stream, so one word per communicator would let a later collective's `ready`, written
 *            on another stream, stand for an earlier one). Operation seq owns slot
 *            (uint32_t)seq % COLLD_WIRE_GPU_READY_SLOTS; the rank's stream writes v there
 *            (cuStreamWriteValue32) after the work before it on the stream. The daemon takes the
 *            collective's inputs as ready only when the slot holds exactly v (EQ), and when it
 *            launches the collective it writes ~v there from the host ("taken"). ~v never equals
 *            v + k * SLOTS (an even number of slots: 2v + 1 is odd), so a taken slot never looks
 *            ready for a later collective. The client writes a slot again only once the write
 *            before it in that slot has landed and, for the same communicator, was taken (or the
 *            communicator broke): a slot is never overwritten while the daemon may still need it,
 *            and the writes to one slot land in the order they were enqueued, also across
 *            communicators that reuse the line (issue 15 E2: a broken communicator's queued write
 *            can never land on top of a newer one). At most SLOTS collectives of a communicator
 *            are thus posted and not yet launched; the client waits beyond that (client/cuda.c).
 *   done     written by the daemon's stream after the collective's kernels (cuStreamWriteValue32),
 *            or by the daemon's host on failure; the rank's stream waits with
 *            CU_STREAM_WAIT_VALUE_GEQ, a cyclic comparison ((int32_t)(done - value) >= 0).
 *   status   0, or the colld_status_t that broke the communicator, written before the release.
 *
 * Sends and receives (COLLD_KIND_SEND / RECV with COLLD_SQE_STREAM): a batch (COLLD_SQE_LINK
 * above; an operation outside a group is a batch of one) has one ready write and one wait, those of
 * its last operation: the client joins the batch's streams into the last operation's stream
 * (events), which writes ready[last % SLOTS] = v_last and waits for done >= v_last; the other
 * streams then wait for it. The linked operations' own slots are not written. The daemon takes the
 * batch as ready when that slot holds exactly v_last (taken: ~v_last), runs its transfers once the
 * peers' batches are ready too, and writes done = v_last from the host when every operation of the
 * batch has finished (the batch's transfers finish in any order; `done` must only grow).
 *
 * Release on failure (time-out, lost rank, abort, mismatch, device error, daemon loss): once no
 * kernel of the communicator is running any more, `done` is set to the flag value of the last
 * collective the rank posted plus COLLD_WIRE_GPU_RELEASE, so every wait already enqueued (and the next 2^30)
 * passes and no GPU stream waits forever; the error surfaces through the async-error query. The
 * client does the same on its side when it loses the daemon.
 * ------------------------------------------------------------------------------------------- */

#define COLLD_WIRE_GPU_RELEASE (1u << 30)
/* Ready slots per line: a power of two, even (see "taken" above); two cache lines. */
#define COLLD_WIRE_GPU_READY_SLOTS 32u

typedef struct {
    _Alignas(COLLD_WIRE_CACHELINE) uint32_t ready[COLLD_WIRE_GPU_READY_SLOTS];
    _Alignas(COLLD_WIRE_CACHELINE) uint32_t done;
    int32_t status;
    uint32_t reserved_done[14];
} colld_wire_gpu_flag_t;

_Static_assert(sizeof(colld_wire_gpu_flag_t) == 192, "gpu flag line layout");
_Static_assert((COLLD_WIRE_GPU_READY_SLOTS & (COLLD_WIRE_GPU_READY_SLOTS - 1)) == 0 &&
                   COLLD_WIRE_GPU_READY_SLOTS % 2 == 0,
               "ready slots: an even power of two");

/* Lines in a session's flag area, and its size (whole pages). */
#define COLLD_WIRE_GPU_LINES(max_comms) ((uint64_t)(max_comms) + 1)
#define COLLD_WIRE_GPU_FLAGS_BYTES(max_comms) \
    ((COLLD_WIRE_GPU_LINES(max_comms) * sizeof(colld_wire_gpu_flag_t) + 4095) & ~(uint64_t)4095)

/* ---------------------------------------------------------------------------------------------
 * Persistent plans (issue 15 item 3): a collective captured into a CUDA graph. The session's GPU
 * flag area holds, after its communicator lines, `plans` plan lines (the daemon's
 * --max-plans-per-session, given in COLLD_MSG_GPU_FLAGS_REPLY); the client gives each captured
 * collective of its ranks a free line, and frees it (COLLD_MSG_PLAN_FREE) once the graph that
 * holds it and every executable graph made from it are destroyed (a CUDA user object).
 *
 * The captured graph holds three stream memory operations with fixed values, so that every
 * replay is one run:
 *   N1  write ready = 1             after the work before it in the graph: the inputs are ready
 *   N2  wait  done == 1 (EQ)        the daemon's stream writes it after the collective's kernels
 *   N3  write done = 0              re-arms the wait for the next replay
 * The daemon: when every rank's ready is 1 (exactly), it writes ready = 0 from the host ("taken")
 * and launches the kernels; its stream then writes done = 1 into every rank's line.
 *
 * Why no replay sees a stale value. Replays of one executable graph are serialised by CUDA (each
 * launch is ordered behind the previous launch of the same executable graph, on any stream), so a
 * rank's N1, N2, N3 of replay i all come before its N1 of replay i + 1.
 *   - done: after replay i, N3 has set it to 0 before replay i + 1's N1 (stream order, and the
 *     default write carries a memory barrier), and the daemon writes done = 1 for run i + 1 only
 *     after it saw that N1's ready = 1; so replay i + 1's N2 never passes on run i's done.
 *   - ready: the daemon takes ready (0) before it launches run i; replay i + 1's N1 comes after
 *     N2 saw run i's done, which the daemon's stream wrote after the take; so a taken ready never
 *     reappears as 1 but from a new replay, and each replay of each rank is taken once.
 * Two executable graphs of one capture share the plan (and its buffers): their replays must be
 * ordered by the application (one stream, or an event between them), as their writes to the same
 * buffers must be anyway; with that order the argument above holds across them (each replay ends
 * with the line as it began: ready taken, done 0). Replays of the two that overlap in time are a
 * data race of the application that the stream memory operations cannot detect (they have no
 * atomic read-modify-write).
 *
 * Faults: once the plan cannot run (its communicator broke: time-out, lost rank, abort, mismatch,
 * a device error; a rank's graph destroyed; the communicator destroyed) the daemon keeps
 * releasing every replay: each ready = 1 it sees is taken and answered with status, then
 * done = 1 from the host, without running the collective; the first such replay breaks the
 * communicator if nothing had (the error surfaces through the async-error query). When the
 * client loses its daemon it does the same itself for its own lines.
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    _Alignas(COLLD_WIRE_CACHELINE) uint32_t ready; /* the rank's graph writes 1; the daemon takes it (0) */
    uint32_t reserved_ready[15];
    _Alignas(COLLD_WIRE_CACHELINE) uint32_t done; /* the daemon writes 1; the rank's graph re-arms it (0) */
    int32_t status;                               /* 0, or the colld_status_t of a replay released unrun */
    uint32_t reserved_done[14];
} colld_wire_gpu_plan_t;

_Static_assert(sizeof(colld_wire_gpu_plan_t) == 128, "gpu plan line layout");

/* The byte offset of plan line i in a session's flag area, and the area's size with its plan
 * lines (whole pages). */
#define COLLD_WIRE_GPU_PLAN_OFFSET(max_comms, i)                                                                       \
    (COLLD_WIRE_GPU_LINES(max_comms) * sizeof(colld_wire_gpu_flag_t) + (uint64_t)(i) * sizeof(colld_wire_gpu_plan_t))
#define COLLD_WIRE_GPU_AREA_BYTES(max_comms, plans)                                                                    \
    ((COLLD_WIRE_GPU_PLAN_OFFSET(max_comms, plans) + 4095) & ~(uint64_t)4095)
/* The most plan lines an area may have (a bound the client checks the daemon's answer against). */
#define COLLD_WIRE_GPU_PLANS_MAX 65536u

/* How a GPU allocation is handed to the daemon (COLLD_MSG_REG_CUDA). */
typedef enum {
    COLLD_CUDA_EXPORT_IPC = 1, /* u.reg_cuda.ipc is a CUipcMemHandle of a cuMemAlloc/cudaMalloc allocation */
    COLLD_CUDA_EXPORT_FD = 2,  /* the fd (SCM_RIGHTS) is a POSIX-fd shareable handle of a cuMem (VMM) allocation */
} colld_cuda_export_t;

#define COLLD_WIRE_CUDA_IPC_BYTES 64

/* A GPU buffer across several VMM allocations mapped back to back in one reservation (PyTorch's
 * expandable segments; issue 15 D2) is registered as one registration of `count` segments
 * (COLLD_MSG_REG_CUDA_SEG): segment i is allocation i's POSIX fd and the first `bytes` of it, at
 * byte `offset` of the registration, the sum of the segments before it. They are sent in order,
 * each answered with COLLD_MSG_REG_REPLY (reg_id 0 until the last, whose answer carries the new
 * registration); the daemon maps them back to back in one range of its own, so its kernels see
 * one buffer. The first segment starts an assembly and charges the tenant the whole `total`; one
 * assembly per session (a new first segment drops the one under way); a segment out of order, of
 * another registration, or any failure drops the assembly: nothing stays half-registered. A buffer
 * within one allocation is registered with COLLD_MSG_REG_CUDA. */
#define COLLD_WIRE_CUDA_MAX_SEGMENTS 256u

/* ---------------------------------------------------------------------------------------------
 * Session socket messages (fixed size, 128 bytes; file descriptors ride along as SCM_RIGHTS)
 * ------------------------------------------------------------------------------------------- */

typedef enum {
    COLLD_MSG_HELLO = 1,       /* client -> daemon: version, role, process name */
    COLLD_MSG_WELCOME = 2,     /* daemon -> client: session id, token, rings; fds: shm, eventfd */
    COLLD_MSG_REG = 3,         /* client -> daemon: register memory; fd: memfd, every page written, no F_SEAL_SEAL */
    COLLD_MSG_REG_REPLY = 4,   /* daemon -> client: registration id or error */
    COLLD_MSG_DEREG = 5,       /* client -> daemon: release a registration */
    COLLD_MSG_DEREG_REPLY = 6, /* daemon -> client */
    COLLD_MSG_FAST_AREA = 7,   /* client -> daemon: the fast area of a communicator handle */
    COLLD_MSG_FAST_AREA_REPLY = 8, /* daemon -> client: its size; fd: the memfd (or an error) */
    COLLD_MSG_REG_CUDA = 9,    /* client -> daemon: register a GPU allocation; fd with EXPORT_FD; reply REG_REPLY */
    COLLD_MSG_GPU_FLAGS = 10,  /* client -> daemon: the session's GPU flag area */
    COLLD_MSG_GPU_FLAGS_REPLY = 11, /* daemon -> client: its size and line count; fd: the memfd (or an error) */
    COLLD_MSG_PLAN_FREE = 12,       /* client -> daemon: a graph holding a plan is gone: free its plan line */
    COLLD_MSG_PLAN_FREE_REPLY = 13, /* daemon -> client: the line is free (or an error) */
    /* client -> daemon: one segment of a GPU registration across VMM allocations; fd; reply REG_REPLY */
    COLLD_MSG_REG_CUDA_SEG = 14,
} colld_msg_type_t;

typedef enum {
    COLLD_ROLE_CLIENT = 0,
    COLLD_ROLE_ADMIN = 1, /* collctl: not counted as a workload session */
} colld_role_t;

#define COLLD_WIRE_DETAIL_BYTES 112

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t type;   /* colld_msg_type_t */
    int32_t status;  /* replies: colld_status_t; on error `u.detail` says why */
    uint32_t reserved;
    union {
        struct {
            uint32_t role;
            uint32_t reserved;
            char process_name[48];
        } hello;
        struct {
            uint64_t session_id;
            uint8_t token[COLLD_WIRE_TOKEN_BYTES];
            uint64_t shm_size;
            uint32_t sq_entries;
            uint32_t cq_entries;
        } welcome;
        struct {
            uint64_t bytes;
            uint64_t cookie; /* echoed in the reply */
        } reg;
        struct {
            uint32_t reg_id;
            uint32_t reserved;
            uint64_t cookie;
        } reg_reply;
        struct {
            uint64_t bytes;  /* the whole allocation */
            uint64_t cookie; /* echoed in the reply */
            uint32_t how;    /* colld_cuda_export_t */
            uint32_t reserved;
            uint8_t uuid[16]; /* CUuuid of the GPU that holds it */
            uint8_t ipc[COLLD_WIRE_CUDA_IPC_BYTES];
        } reg_cuda;
        struct {
            uint64_t total;   /* bytes of the whole registration (every segment), the same in each */
            uint64_t cookie;  /* the same in each segment; echoed in every reply */
            uint64_t offset;  /* this segment's byte offset in the registration */
            uint64_t bytes;   /* this segment's bytes: the first `bytes` of its allocation (the fd) */
            uint32_t index;   /* 0 .. count - 1, in order */
            uint32_t count;   /* 2 .. COLLD_WIRE_CUDA_MAX_SEGMENTS */
            uint8_t uuid[16]; /* CUuuid of the GPU that holds every segment */
        } reg_cuda_seg;
        struct {
            uint64_t size;  /* bytes to map */
            uint32_t lines; /* flag lines (communicator handles 1 .. lines-1) */
            uint32_t plans; /* plan lines after them (colld_wire_gpu_plan_t) */
        } gpu_flags;
        struct {
            uint32_t line; /* the plan line whose graph is gone */
            uint32_t reserved;
        } plan_free;
        struct {
            uint32_t reg_id;
        } dereg;
        struct {
            uint32_t handle;
            uint32_t reserved;
            uint64_t size; /* reply: bytes to map */
        } fast;
        char detail[COLLD_WIRE_DETAIL_BYTES];
    } u;
} colld_wire_msg_t;

_Static_assert(sizeof(colld_wire_msg_t) == 128, "message layout");

#endif /* COLLD_PROTO_WIRE_H */
