/*
 * colld.h - the public C API of colld, the per-node collective offload service.
 *
 * An application links libcolld, connects to the local colld daemon, joins communicators and posts
 * collectives; the daemon owns the buffers' transport and runs the reductions. This is the only
 * public header. Names and semantics follow NCCL where NCCL defines them.
 *
 * Lifetime rules (libuv style):
 *  - If a create/connect/init call fails, there is nothing to destroy.
 *  - If it succeeds, the matching destroy/disconnect is mandatory.
 *  - Memory is reusable only after the destroy call returns.
 *  - A colld_comm_t is used by one thread at a time (as an ncclComm_t); different communicators of
 *    one client may be used from different threads.
 *
 * Changelog:
 *  0.1  first version: connect, unique ids, communicators, host memory, all-reduce.
 *  0.2  (unreleased) GPU buffers and CUDA streams (the CUDA backend): colld_mem_alloc(COLLD_MEM_CUDA), device
 *       pointers in every collective, stream-ordered collectives. New: colld_last_error, the
 *       detail of a client's last failed call that has no communicator (colld_mem_alloc,
 *       colld_mem_free), since colld_comm_last_error needs a communicator. Changed: a non-NULL
 *       `stream` was always refused with COLLD_ERR_NOT_SUPPORTED; it is now a CUDA stream
 *       (COLLD_ERR_NOT_SUPPORTED, with the reason in colld_comm_last_error, only where the CUDA
 *       driver or this build's CUDA support is missing). colld_last_error also holds the
 *       daemon's reason when colld_comm_init_rank fails (e.g. COLLD_ERR_DAEMON_UNAVAILABLE from a
 *       daemon that drains before a restart).
 *       Per-tenant limits (issue 13): a request over a limit of the daemon (registrations,
 *       communicators, ranks joining) fails with COLLD_ERR_QUOTA_EXCEEDED and the detail names the
 *       limit (colld_last_error for colld_mem_alloc and colld_comm_init_rank, colld_comm_last_error
 *       for a collective whose buffer could not be staged). Changed: a communicator name that is
 *       not printable UTF-8 (control or bidirectional formatting characters, invalid encodings)
 *       is refused with COLLD_ERR_INVALID_ARGUMENT instead of being shown as it came; a name
 *       longer than 63 bytes is still cut, now between characters.
 *       Changed: colld_last_error(NULL) says why the calling thread's last colld_connect failed
 *       (it returned "invalid client (NULL)"); a daemon at one of its limits refuses colld_connect
 *       with COLLD_ERR_QUOTA_EXCEEDED (it closed the connection: COLLD_ERR_DAEMON_LOST).
 *       New: colld_comm_split, colld_gather, colld_scatter, colld_alltoall, colld_barrier,
 *       per-operation completion (colld_comm_last_op, colld_op_query, colld_op_wait) (issue 16).
 *       New status COLLD_ERR_NUMERIC: a NaN or infinity in a reduction's input under the
 *       daemon's --nan-check (issue 18). New status COLLD_ERR_DEADLOCK: a cycle of ranks waiting
 *       for each other across communicators, under the daemon's --deadlock-fail (issue 18).
 *       New: colld_comm_config_t.nan_check, the --nan-check checks for one communicator (the
 *       struct grew; a config of the older size, without the field, means 0).
 *       New: point-to-point colld_send / colld_recv (NCCL's ncclSend / ncclRecv) and
 *       colld_alltoallv (all-to-all with per-peer counts, built on them) (issue 16). Changed:
 *       operation ids (colld_comm_last_op) count sends and receives too, so the ids of a rank's
 *       collectives are no longer the same on every rank once it uses point-to-point operations
 *       (the error details still name a collective by its number among collectives, "collective
 *       #N", which is).
 *       Changed (issue 15 item 3): a collective on a CUDA stream that is being captured into a
 *       CUDA graph is captured (it was refused with COLLD_ERR_NOT_SUPPORTED): the call registers
 *       it with the daemon and returns once every rank has captured the same collective
 *       (COLLD_ERR_MISMATCH, COLLD_ERR_TIMEOUT or COLLD_ERR_QUOTA_EXCEEDED otherwise, nothing
 *       enqueued), and every replay of the graph then runs it once. A replay that cannot run it
 *       (the communicator broke or was destroyed, a rank's graph was destroyed, the daemon is
 *       gone) is released without running it, and the error is reported by
 *       colld_comm_get_async_error. The collective lives as long as the graph and its
 *       executable graphs; replays of two executable graphs of one capture must be ordered.
 *       Inside colld_group_start/colld_group_end a captured collective is refused
 *       (COLLD_ERR_NOT_SUPPORTED).
 *       New: the premultiplied sum (NCCL's ncclRedOpCreatePreMulSum): colld_redop_create_premul_sum
 *       and colld_redop_destroy make and release an operator of one communicator handle, usable
 *       as the op of colld_allreduce, colld_reduce and colld_reducescatter on it; each rank's input
 *       is multiplied by that rank's own scalar before the sum (issue 16). colld_redop_t gained
 *       COLLD_REDOP_MAX_ENUM (no op), so that it can hold such operators' values.
 *       Changed (issue 15 D2): a GPU buffer across several cuMem (VMM) allocations mapped back to
 *       back in one reservation (PyTorch's expandable segments) works in every collective (up to
 *       256 allocations); it was refused with COLLD_ERR_INVALID_ARGUMENT ("runs past the end of
 *       its GPU buffer").
 *       New (issue 15): colld_mem_register / colld_mem_deregister, NCCL's ncclCommRegister /
 *       ncclCommDeregister: GPU memory registered with the daemon up front (the first collective on
 *       it does not pay for the registration) and its mapping there released at once on
 *       deregistration, instead of at the implicit cache's next sweep. They take the communicator,
 *       as NCCL's do (colld_comm_destroy releases the handles left, as ncclCommDestroy), though the
 *       registration serves every communicator of the client. Host memory is not registered:
 *       inside colld_mem_alloc memory the handle is a no-op, other host memory is
 *       COLLD_ERR_NOT_SUPPORTED. Changed: colld_mem_free of memory still registered so is
 *       COLLD_ERR_INVALID_USAGE.
 *       Changed (issue 16 item 1): colld_send, colld_recv and colld_alltoallv take GPU buffers and
 *       a CUDA stream, stream-ordered as the collectives (they were refused with
 *       COLLD_ERR_NOT_SUPPORTED); a group mixing GPU and host sends and receives on one
 *       communicator is COLLD_ERR_INVALID_USAGE. Changed (issue 16 item 2): colld_gather,
 *       colld_scatter and colld_alltoall take GPU buffers and a CUDA stream too (they were refused
 *       with COLLD_ERR_NOT_SUPPORTED).
 *       Changed (issue 24): an operation that waited for a rank which then destroyed its handle
 *       fails with COLLD_ERR_PEER_LOST (the detail names that rank), not COLLD_ERR_INVALID_USAGE:
 *       its caller did nothing wrong (the rank that left had, e.g., timed out on another
 *       communicator). Operations posted after the rank left still fail with
 *       COLLD_ERR_INVALID_USAGE.
 *       Changed (issue 26 row 3): colld_mem_alloc(COLLD_MEM_HOST) allocates every page of the
 *       buffer when it makes it (it was allocated page by page on first touch, by whichever
 *       process touched it first, the daemon included): the memory is charged at once to the
 *       caller's memory cgroup, never to the daemon's, and the call takes time in proportion to
 *       the size (0.5-2 ms per MiB measured on a loaded 2-CPU VM: what the first touch of the
 *       pages cost before, which is now cheap; docs/reliability.md). A buffer the caller's cgroup cannot hold fails with
 *       COLLD_ERR_NO_MEMORY, or the kernel's OOM killer acts in the caller's cgroup. Host memory
 *       that libcolld stages for collectives on other pointers is allocated the same way. The
 *       daemon refuses shared memory with a page missing (COLLD_ERR_INVALID_ARGUMENT, "memory not
 *       allocated"), and charges what it allocates itself for a tenant (rings, fast areas, GPU
 *       flag areas, multi-node buffers, page tables) to max-daemon-bytes-per-tenant
 *       (COLLD_ERR_QUOTA_EXCEEDED from colld_connect, colld_mem_alloc or a multi-node collective).
 *       New (issue 30 item 3): result verification, colld_comm_config_t.verify_results (the struct
 *       grew; a config of the older size, without the field, means 0) and the daemon's
 *       --verify-results; new status COLLD_ERR_CORRUPTED: a rank's or a node's all-reduce result
 *       differs from the others'.
 *       New (issue 25): colld_client_stats, how many host collectives of a client went zero copy
 *       and how many were staged (with the bytes staged), so that a framework can show that its
 *       buffers land in colld memory.
 *       Later (issue 30): broadcast and all-gather results are verified too, and a tenant's policy
 *       (collctl policy --verify-results on) turns verification on.
 */
#ifndef COLLD_COLLD_H
#define COLLD_COLLD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COLLD_VERSION_MAJOR 0
#define COLLD_VERSION_MINOR 1
#define COLLD_API_VERSION   1

/*
 * Status codes: one list generates the enum, colld_status_name and colld_status_string, so they
 * cannot drift. X(NAME, value, "what it means and what to do next").
 */
#define COLLD_STATUS_LIST(X)                                                                                           \
    X(OK, 0, "success")                                                                                                \
    X(INPROGRESS, 1, "the operation has been issued and has not completed yet")                                        \
    X(ERR_INVALID_ARGUMENT, -1,                                                                                        \
      "an argument is invalid (NULL pointer, out-of-range value, "                                                     \
      "unknown id or buffer out of bounds); see colld_comm_last_error for which one")                                  \
    X(ERR_INVALID_USAGE, -2,                                                                                           \
      "the call is not allowed in the current state (e.g. a rank joined "                                              \
      "twice or a communicator used after destroy); fix the calling code")                                             \
    X(ERR_NO_MEMORY, -3, "out of memory in the client or the daemon")                                                  \
    X(ERR_SYSTEM, -4, "a system call failed; run with COLLD_LOG_LEVEL=INFO for details")                               \
    X(ERR_DAEMON_UNAVAILABLE, -5,                                                                                      \
      "no colld daemon answers on the socket; start colld or set "                                                     \
      "COLLD_SOCKET to its socket path")                                                                               \
    X(ERR_DAEMON_LOST, -6,                                                                                             \
      "the connection to the colld daemon was lost (it died or was "                                                   \
      "restarted); destroy communicators and reconnect")                                                               \
    X(ERR_PEER_LOST, -7,                                                                                               \
      "a peer rank's process died or disconnected, or it destroyed its handle while this "                             \
      "operation waited for it; the communicator is broken, destroy it")                                               \
    X(ERR_NODE_LOST, -8, "a peer node's daemon was lost; the communicator is broken")                                  \
    X(ERR_TIMEOUT, -9,                                                                                                 \
      "the operation timed out waiting for other ranks; "                                                              \
      "colld_comm_last_error names the missing ranks")                                                                 \
    X(ERR_MISMATCH, -10,                                                                                               \
      "ranks called different collectives for the same sequence number; "                                              \
      "colld_comm_last_error lists each rank's call")                                                                  \
    X(ERR_ABORTED, -11, "the communicator was aborted")                                                                \
    X(ERR_PERMISSION_DENIED, -12, "the caller is not allowed to do this")                                              \
    X(ERR_QUOTA_EXCEEDED, -13, "a per-session or per-tenant limit of the daemon was reached")                          \
    X(ERR_DEVICE, -14, "a GPU or device error occurred")                                                               \
    X(ERR_NOT_SUPPORTED, -15, "this feature is not supported by this build or daemon")                                 \
    X(ERR_PROTOCOL, -16,                                                                                               \
      "client and daemon disagree on the protocol (version mismatch or a "                                             \
      "corrupt message); use matching versions of libcolld and colld")                                                 \
    X(ERR_INTERNAL, -17, "internal error in colld; please report it with the daemon log")                              \
    X(ERR_NUMERIC, -18,                                                                                                \
      "a rank contributed NaN or an infinity to a floating-point reduction (the "                                      \
      "daemon's --nan-check); colld_comm_last_error names the rank and the element")                                   \
    X(ERR_DEADLOCK, -19,                                                                                               \
      "ranks wait for each other in different communicators (they call their collectives in different "                \
      "orders); colld_comm_last_error names the cycle")                                                                \
    X(ERR_CORRUPTED, -20,                                                                                              \
      "a rank's or a node's all-reduce, broadcast or all-gather result differs from the others' (result "            \
      "verification: the daemon's --verify-results, colld_comm_config_t.verify_results or the tenant's policy); "     \
      "colld_comm_last_error names the rank and its pid, or the node and its address")

typedef enum {
#define COLLD_STATUS_ENUM_(name, value, text) COLLD_##name = (value),
    COLLD_STATUS_LIST(COLLD_STATUS_ENUM_)
#undef COLLD_STATUS_ENUM_
} colld_status_t;
#define COLLD_ERR_LAST COLLD_ERR_CORRUPTED /* the lowest status value */

typedef enum {
    COLLD_INT8 = 0,
    COLLD_UINT8 = 1,
    COLLD_INT32 = 2,
    COLLD_UINT32 = 3,
    COLLD_INT64 = 4,
    COLLD_UINT64 = 5,
    COLLD_FLOAT16 = 6,
    COLLD_BFLOAT16 = 7,
    COLLD_FLOAT32 = 8,
    COLLD_FLOAT64 = 9,
    COLLD_DTYPE_COUNT = 10
} colld_dtype_t;

typedef enum {
    COLLD_SUM = 0,
    COLLD_PROD = 1,
    COLLD_MIN = 2,
    COLLD_MAX = 3,
    COLLD_AVG = 4, /* integer average truncates, as NCCL */
    COLLD_REDOP_COUNT = 5,
    /* Not an op: the range of operators made by colld_redop_create_premul_sum (values above every
     * op above and below 2^31, as NCCL's ncclRedOp_t). */
    COLLD_REDOP_MAX_ENUM = 0x7fffffff
} colld_redop_t;

typedef enum {
    COLLD_MEM_HOST = 0,
    COLLD_MEM_CUDA = 1
} colld_memtype_t;

typedef struct colld_client colld_client_t; /* one connection to the local daemon */
typedef struct colld_comm colld_comm_t;     /* one rank's handle on a communicator */
typedef struct {
    char internal[128];
} colld_unique_id_t;

/* Communicator configuration. Starts with size and version so it can grow (as ncclConfig_t). */
typedef struct {
    size_t size;         /* sizeof(colld_comm_config_t) */
    unsigned version;    /* COLLD_API_VERSION */
    int timeout_ms;      /* collective and join timeout; 0: the daemon's default; < 0 invalid */
    const char *name;    /* shown by collctl; NULL: none. Printable UTF-8, else colld_comm_init_rank
                            fails with COLLD_ERR_INVALID_ARGUMENT. Copied, at most 63 bytes kept
                            (cut between characters) */
    int nan_check;       /* 1: this communicator's floating-point reductions refuse NaN and +-Inf
                            inputs with COLLD_ERR_NUMERIC naming the rank and element, as the
                            daemon's --nan-check does for every communicator (then small
                            collectives go through the daemon, not the fast path); any rank's 1
                            holds for the whole communicator. 0: the daemon's setting. Other
                            values: COLLD_ERR_INVALID_ARGUMENT */
    int verify_results;  /* 1: result verification for this communicator, as the daemon's
                            --verify-results or the tenant's policy (collctl policy): after each
                            all-reduce, broadcast and all-gather the daemon checksums every rank's
                            result (XXH3) and, across nodes, each node's; a result that differs
                            fails the collective on every rank with COLLD_ERR_CORRUPTED naming the
                            rank (pid), the node and its address, and the first element that
                            differs, and breaks the communicator. Small collectives then go
                            through the daemon, not the fast path. Reduce and reduce-scatter are
                            not verified (each result exists once), nor are collectives on GPU
                            buffers yet (they run unverified). Any rank's 1 holds for the whole
                            communicator. 0: the daemon's setting. Other values:
                            COLLD_ERR_INVALID_ARGUMENT */
} colld_comm_config_t;

#define COLLD_COMM_CONFIG_INIT { sizeof(colld_comm_config_t), COLLD_API_VERSION, 0, NULL, 0, 0 }

/* Connect to the local daemon. socket_path NULL: $COLLD_SOCKET, else /run/colld/colld.sock for
 * root and $XDG_RUNTIME_DIR/colld.sock otherwise. */
colld_status_t colld_connect(const char *socket_path, colld_client_t **out);
/* A client belongs to the process that connected. In a child forked from it (without exec), the
 * client and its communicators are lost: every call fails with COLLD_ERR_DAEMON_LOST saying the
 * process is a fork, colld_disconnect only forgets the copy, and the child's copies of the
 * session's descriptors are closed at the fork, so the parent's death is seen at once. A child
 * that needs colld calls colld_connect itself. */

/* Disconnect. Communicators of this client must be destroyed first; memory from colld_mem_alloc
 * (host and GPU) is released, and so are the daemon's registrations of other GPU memory the
 * client used. Streams that still carry collectives of this client must have completed them. */
colld_status_t colld_disconnect(colld_client_t *c);
/* What went wrong in this client's last failed call that has no communicator (colld_mem_alloc,
 * colld_mem_free, a colld_comm_init_rank that made none): "COLLD_ERR_NOT_SUPPORTED:
 * colld_mem_alloc(...): ...". Empty if none failed.
 * Valid until the next such call on c or colld_disconnect. With c NULL: why the calling thread's
 * last colld_connect failed ("COLLD_ERR_QUOTA_EXCEEDED: colld at ... refused the session: uid 1000
 * is at its limit max-sessions-per-tenant = 1024 (...)"), empty after one that succeeded; valid
 * until the thread's next colld_connect. */
const char *colld_last_error(colld_client_t *c);

colld_status_t colld_get_unique_id(colld_client_t *c, colld_unique_id_t *id);
/* Join a communicator as `rank` of `nranks`. Blocks until every rank has joined or the timeout
 * (cfg->timeout_ms or the daemon default) expires. */
colld_status_t colld_comm_init_rank(colld_client_t *c, colld_comm_t **comm, int nranks,
                                    colld_unique_id_t id, int rank, const colld_comm_config_t *cfg);
/* Waits for issued work (for stream-ordered collectives: until the daemon has completed them,
 * which their streams then see). */
colld_status_t colld_comm_destroy(colld_comm_t *comm);
/* Abort: every rank's pending and later operations on this communicator fail with
 * COLLD_ERR_ABORTED (callable from any thread, e.g. a watchdog). Never waits for peers; it
 * returns within about 2 s even if the daemon is stuck. The handle stays valid: release it with
 * colld_comm_destroy, which then returns promptly. */
colld_status_t colld_comm_abort(colld_comm_t *comm);
/* Split (as ncclCommSplit): every rank of comm calls it; the ranks that pass the same color >= 0
 * form a new communicator (*newcomm), ordered by key, ties by their rank in comm. A rank passing
 * COLLD_SPLIT_NOCOLOR takes part and gets *newcomm = NULL. Blocks until the new communicators have
 * formed; it waits for comm's issued work first. cfg as in colld_comm_init_rank (NULL: defaults).
 * Works for communicators spanning nodes as well. Not inside colld_group_start/end. */
#define COLLD_SPLIT_NOCOLOR (-1)
colld_status_t colld_comm_split(colld_comm_t *comm, int color, int key, colld_comm_t **newcomm,
                                const colld_comm_config_t *cfg);
colld_status_t colld_comm_get_async_error(colld_comm_t *comm, colld_status_t *err);
const char *colld_comm_last_error(colld_comm_t *comm); /* detail of this comm's last error */
colld_status_t colld_comm_count(const colld_comm_t *comm, int *nranks);
colld_status_t colld_comm_user_rank(const colld_comm_t *comm, int *rank);

/* Memory shared with the daemon (zero copy), released by colld_mem_free or disconnect.
 * COLLD_MEM_HOST: host memory. COLLD_MEM_CUDA: device memory of the current CUDA context's device
 * (no context current: device 0's primary context is made current, as the CUDA runtime does),
 * from cuMemCreate exportable as a POSIX fd where the device supports it, else cuMemAlloc; usable
 * by kernels like any device memory. Without a CUDA driver (or in a build without CUDA support)
 * COLLD_MEM_CUDA gives COLLD_ERR_NOT_SUPPORTED and colld_last_error says why. Free memory only
 * once the collectives that use it have completed.
 * COLLD_MEM_HOST memory is allocated in full before the call returns (every page written, zero):
 * it is the caller's memory, charged to its memory cgroup, and the call costs time in proportion
 * to `bytes`; COLLD_ERR_NO_MEMORY when it cannot be had. */
colld_status_t colld_mem_alloc(colld_client_t *c, void **ptr, size_t bytes, colld_memtype_t type);
colld_status_t colld_mem_free(colld_client_t *c, void *ptr);

/* Register a buffer with the daemon up front, as NCCL's ncclCommRegister: GPU memory (the
 * allocation, or the VMM allocations mapped back to back, that hold [buf, buf + bytes)) is
 * exported and mapped by the daemon now, so the first collective on it does not pay for it, and
 * stays registered, whatever the implicit cache does, until colld_mem_deregister. The
 * registration belongs to comm's client and serves all its communicators; the handle belongs to
 * comm. Host memory: inside memory from colld_mem_alloc(COLLD_MEM_HOST) it is already shared, and
 * the handle registers nothing; other host memory cannot be shared zero copy (collectives stage
 * it), so it is COLLD_ERR_NOT_SUPPORTED. COLLD_ERR_INVALID_ARGUMENT for NULL arguments, 0 bytes,
 * or a range that runs past its allocation(s); the detail is in colld_comm_last_error.
 * Lifetime: if it fails there is nothing to deregister (*handle is NULL). If it succeeds,
 * colld_mem_deregister(comm, handle) releases it, or colld_comm_destroy(comm) does for the
 * handles left (as ncclCommDestroy); the handle is invalid afterwards (deregistering it again is
 * COLLD_ERR_INVALID_ARGUMENT, not a crash). Deregister before freeing the memory (colld_mem_free
 * refuses colld_mem_alloc memory still registered: COLLD_ERR_INVALID_USAGE). Deregistering while
 * collectives posted on the buffer are still running is safe: the daemon keeps its mapping until
 * they have finished. The same buffer may be registered several times; each handle is released
 * once. */
colld_status_t colld_mem_register(colld_comm_t *comm, void *buf, size_t bytes, void **handle);
/* Release a colld_mem_register handle of comm: the daemon's mapping of GPU memory goes now (once
 * the collectives already posted on it have finished), unless another handle or colld_mem_alloc
 * holds it. A later collective on the buffer registers it again implicitly. */
colld_status_t colld_mem_deregister(colld_comm_t *comm, void *handle);

/* Collectives: asynchronous. In-place when sendbuf == recvbuf (or the rank's slice of it).
 *
 * Host buffers: `stream` is NULL; completion is observed with colld_comm_synchronize /
 * colld_comm_query. Any host pointer works (memory from colld_mem_alloc is zero copy).
 *
 * GPU buffers (device memory from colld_mem_alloc(COLLD_MEM_CUDA), cudaMalloc / cuMemAlloc, or
 * cuMemCreate made exportable with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR): `stream` is a
 * cudaStream_t (NULL: the legacy default stream, as NCCL) and the collective is stream-ordered:
 * it reads its inputs after the work queued before it on the stream, and the work queued after it
 * sees its outputs. The call returns at once, without waiting for the GPU. The allocation that
 * holds each buffer (the VMM allocations, when the buffer runs across several mapped back to back)
 * is registered with the daemon on first use and cached (an allocation freed
 * and replaced at the same address is recognised). An allocation the application frees is
 * deregistered, and the daemon's mapping of it closed, at the latest at the client's next new
 * GPU registration or communicator destruction (each stream-ordered call also checks two cached
 * registrations); free memory only once the collectives that use it have completed. Both buffers must be device memory; a host
 * buffer with a stream, or one device and one host buffer, is COLLD_ERR_INVALID_ARGUMENT. Managed
 * memory and cudaMallocAsync pool memory are not supported. colld_comm_synchronize /
 * colld_comm_query report the daemon's completion (the kernels have finished) and errors; on
 * any failure the stream is released (it never waits forever) and the error is reported by
 * colld_comm_get_async_error. Needs CUDA stream memory operations on the device (the IPC event
 * fallback is not built yet): COLLD_ERR_NOT_SUPPORTED otherwise, and also without a CUDA driver,
 * with the reason in colld_comm_last_error.
 *
 * CUDA graphs: on a stream that is being captured (cudaStreamBeginCapture), the collective is
 * captured. The call returns once every rank has captured the same collective (else
 * COLLD_ERR_MISMATCH; COLLD_ERR_TIMEOUT when a rank never does; COLLD_ERR_QUOTA_EXCEEDED past the
 * daemon's --max-plans-per-session; on any error nothing is enqueued and the capture is as it
 * was), and every replay of the graph runs the collective once, on the inputs the replay's stream
 * produced before it. Its buffers must stay allocated while the graph, or an executable graph made
 * from it, exists; replays of two executable graphs of one capture must be ordered (one stream, or
 * an event). A replay that cannot run it (a peer's graph never replays it within the timeout:
 * COLLD_ERR_TIMEOUT; a lost peer, an abort, a destroyed communicator or a peer's destroyed graph;
 * the daemon gone) is released without running it, and colld_comm_get_async_error reports why.
 * Not inside colld_group_start / colld_group_end (COLLD_ERR_NOT_SUPPORTED). */
colld_status_t colld_allreduce(const void *sendbuf, void *recvbuf, size_t count, colld_dtype_t dtype,
                               colld_redop_t op, colld_comm_t *comm, void *stream);
colld_status_t colld_broadcast(const void *sendbuf, void *recvbuf, size_t count, colld_dtype_t dtype,
                               int root, colld_comm_t *comm, void *stream);
colld_status_t colld_reduce(const void *sendbuf, void *recvbuf, size_t count, colld_dtype_t dtype,
                            colld_redop_t op, int root, colld_comm_t *comm, void *stream);
colld_status_t colld_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                               colld_dtype_t dtype, colld_comm_t *comm, void *stream);
colld_status_t colld_reducescatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                   colld_dtype_t dtype, colld_redop_t op, colld_comm_t *comm,
                                   void *stream);
/* Premultiplied sum (NCCL's ncclRedOpCreatePreMulSum with ncclScalarHostImmediate): make in *op
 * a reduction operator of this communicator handle for colld_allreduce, colld_reduce and
 * colld_reducescatter on it, which multiplies each rank's input by that rank's own scalar before
 * the inputs are summed: out = sum over ranks r, in rank order, of scalar_r * in_r (gradient
 * averaging: scalar 1/nranks). Every rank makes its own, with its own scalar (they may differ),
 * and a collective must use such an operator on every rank (else COLLD_ERR_MISMATCH, as for any
 * op), each of the call's dtype.
 *
 * `scalar` points to one value of `dtype`, read now (the operator keeps a copy): for
 * COLLD_FLOAT16 and COLLD_BFLOAT16 the 16-bit value (as NCCL: convert a float scalar to the dtype
 * first). Precision, the same on every path (CPU, GPU, fast area, several nodes): integers
 * multiply and add wrapping in their width; COLLD_FLOAT32 and COLLD_FLOAT64 round the product and
 * then the sum in their own precision (no fused multiply-add); COLLD_FLOAT16 and COLLD_BFLOAT16
 * multiply in float (exact), sum in float and round once, as their sum does. Results are
 * deterministic like every reduction's. Across nodes the sum is of the nodes' partial sums (see
 * docs/architecture.md), as for COLLD_SUM.
 *
 * Errors: COLLD_ERR_INVALID_ARGUMENT for a NULL comm, scalar or op or an unknown dtype;
 * COLLD_ERR_INVALID_USAGE when the handle already holds COLLD_REDOP_PREMUL_MAX operators
 * (colld_comm_last_error says so). A collective given an operator of another communicator handle,
 * a destroyed one, or one made for another dtype fails with COLLD_ERR_INVALID_ARGUMENT before
 * anything is posted, and colld_comm_last_error names the operator and what is wrong.
 *
 * Lifetime: if it fails there is nothing to destroy. An operator lives until colld_redop_destroy
 * or colld_comm_destroy of its handle. Each collective takes the scalar when it is called (also
 * inside a group), so the operator may be destroyed as soon as the calls that use it have
 * returned, as NCCL allows. An operator of a destroyed handle must not be used (like the handle).
 * Used by one thread at a time, with its handle. */
#define COLLD_REDOP_PREMUL_MAX 64 /* operators one communicator handle holds at once */
colld_status_t colld_redop_create_premul_sum(colld_comm_t *comm, const void *scalar, colld_dtype_t dtype,
                                             colld_redop_t *op);
/* Release an operator of colld_redop_create_premul_sum. COLLD_ERR_INVALID_ARGUMENT (detail in
 * colld_comm_last_error) for an operator that is not a live one of this handle (another handle's,
 * one destroyed already, or a built-in op). */
colld_status_t colld_redop_destroy(colld_comm_t *comm, colld_redop_t op);

/* Gather (to root: recvbuf holds nranks x sendcount, rank r's input at block r; recvbuf is not used
 * on other ranks), scatter (from root: sendbuf holds nranks x recvcount, block r goes to rank r;
 * sendbuf is not used on other ranks) and all-to-all (every rank sends block q of its nranks x
 * count sendbuf to rank q, which receives it at block r of its recvbuf; no in-place form: the two
 * buffers must not overlap). In place for gather: the root's sendbuf at its own block of recvbuf;
 * for scatter: the root's recvbuf at its own block of sendbuf. Host buffers, or GPU buffers
 * stream-ordered as the other collectives (since issue 16), on communicators within one node: a
 * communicator spanning nodes gives COLLD_ERR_NOT_SUPPORTED (from the daemon, which breaks the
 * communicator). */
colld_status_t colld_gather(const void *sendbuf, void *recvbuf, size_t sendcount, colld_dtype_t dtype, int root,
                            colld_comm_t *comm, void *stream);
colld_status_t colld_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, colld_dtype_t dtype, int root,
                             colld_comm_t *comm, void *stream);
colld_status_t colld_alltoall(const void *sendbuf, void *recvbuf, size_t count, colld_dtype_t dtype, colld_comm_t *comm,
                              void *stream);
/* Point-to-point (NCCL's ncclSend / ncclRecv): send `count` elements of sendbuf to rank `peer`, or
 * receive them from it into recvbuf. The k-th send of rank a to rank b meets the k-th receive of
 * rank b from rank a; their dtype and count must be the same (else both ranks fail with
 * COLLD_ERR_MISMATCH naming both calls). Asynchronous like the collectives: a send has completed
 * (colld_op_wait, colld_comm_synchronize) once the data has reached its receiver's buffer. A rank's
 * operations on a communicator (collectives, sends, receives) run in the order it made them, each
 * after the one before it has completed, so, as with NCCL, two ranks that both send to each other
 * first wait for each other until the communicator's time-out: put such sends and receives in one
 * group (colld_group_start/end), whose point-to-point operations all run at once (after the
 * group's collectives on the same communicator). A group holds at most as many sends and receives
 * per connection as the daemon's rings have entries (COLLD_ERR_INVALID_USAGE beyond). A rank may
 * send to itself within a group. An operation that waits longer than the communicator's time-out
 * fails it with COLLD_ERR_TIMEOUT naming the missing side ("rank 3 never sent to rank 5 ...").
 * Host buffers (stream NULL; memory not from colld_mem_alloc is staged) or GPU buffers,
 * stream-ordered as with NCCL (issue 16): with a CUDA stream, or on device memory with stream NULL
 * (the legacy default stream), the call returns at once and the stream waits: a send reads its
 * buffer once the stream's work before it is done, a receive's buffer holds the data for the work
 * after it on the stream. A group's sends and receives on one communicator are then all on GPU
 * buffers (count 0 ones may have no buffer) or all on host buffers (else COLLD_ERR_INVALID_USAGE at
 * colld_group_end, nothing posted), and their streams must belong to one CUDA context; every stream
 * of the group waits for all of them. A send from GPU memory to a receive into host memory (or back)
 * fails both with COLLD_ERR_NOT_SUPPORTED naming both calls; GPUs without peer access to each
 * other's memory, too. A send or receive on a stream being captured into a CUDA graph is
 * COLLD_ERR_NOT_SUPPORTED (nothing enqueued). A communicator spanning nodes gives
 * COLLD_ERR_NOT_SUPPORTED (from the daemon, which breaks the communicator). */
colld_status_t colld_send(const void *sendbuf, size_t count, colld_dtype_t dtype, int peer, colld_comm_t *comm,
                          void *stream);
colld_status_t colld_recv(void *recvbuf, size_t count, colld_dtype_t dtype, int peer, colld_comm_t *comm, void *stream);
/* All-to-all with per-peer counts (MPI_Alltoallv): this rank sends sendcounts[q] elements from
 * sendbuf + sdispls[q] elements to rank q, and receives recvcounts[q] elements from rank q at
 * recvbuf + rdispls[q] elements; rank q must send this rank exactly recvcounts[q] elements (else
 * COLLD_ERR_MISMATCH). Each array has nranks entries. One group of sends and receives (above),
 * hence the same rules: host or GPU buffers (stream-ordered), single-node communicators, 2 x nranks
 * operations within the daemon's ring entries. The send and receive regions must not overlap. */
colld_status_t colld_alltoallv(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls, void *recvbuf,
                               const size_t *recvcounts, const size_t *rdispls, colld_dtype_t dtype, colld_comm_t *comm,
                               void *stream);
/* Barrier: returns once every rank has called it (and this rank's issued work has completed).
 * Not inside a group. */
colld_status_t colld_barrier(colld_comm_t *comm);
colld_status_t colld_group_start(void);
colld_status_t colld_group_end(void);
/* Waits for all issued work: host collectives, and the daemon's completion of stream-ordered ones
 * (it does not synchronize the streams themselves). */
colld_status_t colld_comm_synchronize(colld_comm_t *comm);
colld_status_t colld_comm_query(colld_comm_t *comm);       /* COLLD_OK, COLLD_INPROGRESS or error */

/* Per-operation completion (a framework's Work object): every operation (collective, send or
 * receive) gets an id, increasing per communicator handle. colld_comm_last_op gives the id of the
 * last operation issued on comm
 * (0: none yet; not inside a group: after colld_group_end, that of the group's last); then
 * colld_op_query says COLLD_OK once that collective completed, COLLD_INPROGRESS while it runs, or
 * the communicator's error if it failed (or the communicator broke before it completed), and
 * colld_op_wait waits for one of those. A collective that completed before a later fault stays
 * COLLD_OK. Completing an operation implies the completion of every earlier one of comm. An id
 * that was never issued on comm is COLLD_ERR_INVALID_ARGUMENT. For stream-ordered collectives
 * these report the daemon's completion, as colld_comm_synchronize does. */
colld_status_t colld_comm_last_op(colld_comm_t *comm, uint64_t *op);
colld_status_t colld_op_query(colld_comm_t *comm, uint64_t op);
colld_status_t colld_op_wait(colld_comm_t *comm, uint64_t op);

const char *colld_status_name(colld_status_t s);   /* "COLLD_ERR_TIMEOUT" */
const char *colld_status_string(colld_status_t s); /* what it means and what to do next */

/* What libcolld did with a client's host buffers since colld_connect (issue 25): collectives on
 * the engine path (host buffers larger than the fast path takes; not sends and receives) whose
 * buffers all lay in colld_mem_alloc memory (zero_copy), those with a buffer libcolld staged
 * (staged), and the bytes it copied into staging regions or out of them for those (staged_bytes,
 * counting copy-outs when the collective is posted). The fast path always copies through its
 * area and is counted in neither. `size` is set by the caller to sizeof(colld_client_stats_t)
 * (the struct may grow; a smaller size gets the fields it holds). Counters only grow; read them
 * before and after what is measured. COLLD_ERR_INVALID_ARGUMENT for NULL or a size below the
 * first counter's end. */
typedef struct {
    size_t size;
    uint64_t zero_copy;
    uint64_t staged;
    uint64_t staged_bytes;
} colld_client_stats_t;
colld_status_t colld_client_stats(colld_client_t *c, colld_client_stats_t *stats);

/* Size in bytes of one element of dtype, 0 for an unknown dtype. */
size_t colld_dtype_size(colld_dtype_t dtype);

#ifdef __cplusplus
}
#endif

#endif /* COLLD_COLLD_H */
