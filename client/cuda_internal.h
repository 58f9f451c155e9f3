/*
 * cuda_internal.h - what libcolld's CUDA files share (builds with the CUDA toolkit only):
 *
 *   cuda.c        contexts, the flag area, stream-ordered collectives, colld_mem_alloc(COLLD_MEM_CUDA),
 *                 colld_mem_register of device memory, disconnect
 *   cuda_reg.c    the cache of GPU registrations: a buffer resolved to the allocation(s) that hold it
 *                 (several VMM allocations mapped back to back: issue 15 D2), registered with the
 *                 daemon on first use, dropped when the application freed it (C1/D4)
 *   cuda_graph.c  collectives captured into CUDA graphs (it uses only the inline helpers below:
 *                 contexts, the flag area's teardown)
 *
 * Locking: colld_gpu_t.mu guards the registrations, the retained contexts and the setting up of
 * the flag area (see cuda.c).
 */
#ifndef COLLD_CLIENT_CUDA_INTERNAL_H
#define COLLD_CLIENT_CUDA_INTERNAL_H

#include "client/client_internal.h"
#include "common/cudadrv.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>

#define MAX_DEVICES 64

/* The part of the state that exists in every build. */
typedef struct {
    atomic_bool driver_seen;    /* libcuda.so.1 is loaded in the process (stays so) */
    atomic_ullong adds_checked; /* load count when it was last found absent; 0: never checked */
} gpu_probe_t;

/* How colld_mem_alloc made an allocation (0: the application's own memory). */
enum { OWN_NONE = 0, OWN_VMM = 1, OWN_MEMALLOC = 2 };

/* One allocation of a registration across several (issue 15 D2). */
typedef struct {
    CUdeviceptr base;
    size_t size;                  /* its mapping */
    unsigned long long buffer_id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
} gpu_seg_t;

/* One registered GPU buffer: an allocation, or several VMM allocations mapped back to back. */
typedef struct {
    CUdeviceptr base;
    size_t size;                  /* registered bytes (the whole allocation(s) / mapped range) */
    size_t limit;                 /* bytes a buffer may use from base: size, or what the user asked for */
    unsigned long long buffer_id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID (of the first allocation) */
    uint32_t reg_id;
    int ordinal;       /* the device it is on */
    int own;           /* OWN_*: colld_mem_alloc memory, freed by colld_mem_free */
    size_t own_size;   /* OWN_VMM: the reserved and mapped bytes */
    CUcontext own_ctx; /* OWN_MEMALLOC: the context it was allocated in */
    unsigned pins;     /* colld_mem_register handles on it: never swept nor dropped while > 0 */
    uint64_t seen;     /* the post (g->post_now) that last read its buffer id from the driver */
    unsigned nseg;     /* allocations it spans: 1, or 2 .. COLLD_WIRE_CUDA_MAX_SEGMENTS */
    gpu_seg_t *seg;    /* [nseg] when nseg > 1 (owned) */
} gpu_reg_t;

/* The session's flag area. posted[h]: POSTED_USED | the flag value of the last wait enqueued on
 * line h (0: never used), what a release must cover. */
#define POSTED_USED (1ull << 32)
typedef struct {
    colld_wire_gpu_flag_t *lines;
    size_t size;
    uint32_t nlines;
    uint32_t nplans; /* plan lines after the flag lines (captured collectives: cuda_graph.c) */
    CUdeviceptr dptr;
    CUcontext ctx;             /* current when it was (last) registered (for cuMemHostUnregister; flags_check) */
    unsigned long long ctx_id; /* ctx's cuCtxGetId then: the registration lives while ctx has this id */
    _Atomic uint64_t *posted;
} gpu_flags_t;

/* The last write enqueued to a ready slot of a line: its value, the generation of the
 * communicator that enqueued it (0: never written) and its operation id. */
typedef struct {
    uint32_t value;
    uint32_t gen;
    uint64_t seq;
} gpu_slot_t;

/* What the host call knows of a stream (issue 28 item 2), so that a warm call asks the driver only
 * for the stream's id: its context (handle and id), device and CAN_FLUSH_REMOTE_WRITES. The key
 * is unique for the life of the process, so an entry can go stale but never be matched wrongly:
 *  - a stream the application created: its cuStreamGetId. A stream destroyed and its handle
 *    reused by a new stream, in any context, has a new id; and a stream dies with its context
 *    (a reset, a destroy), so a live stream's entry names the live instance of its context;
 *  - the legacy default stream (NULL): the current context's cuCtxGetId (the stream is the
 *    current context's; a primary context reset keeps its handle and gets a new id).
 * Stale entries are never looked for again and are overwritten in turn (round robin). */
#define STREAM_CACHE 16
typedef struct {
    unsigned long long key; /* the stream's id, or its context's id (by_ctx); 0: empty */
    bool by_ctx;
    bool flush; /* the device's CAN_FLUSH_REMOTE_WRITES */
    CUcontext ctx;
    unsigned long long ctx_id;
    CUdevice dev;
} gpu_stream_t;

struct colld_gpu {
    gpu_probe_t probe;
    pthread_mutex_t mu;
    const colld_cu_t *cu; /* set once the driver was used */
    gpu_reg_t *regs;
    size_t nregs, cap;
    size_t sweep; /* sweep_freed's cursor into regs */
    _Atomic(gpu_flags_t *) flags;
    gpu_slot_t *slots; /* [slot_lines][COLLD_WIRE_GPU_READY_SLOTS], made with the first base */
    uint32_t *gens;    /* [slot_lines]: the last generation given on each line */
    uint32_t slot_lines;
    bool primary[MAX_DEVICES]; /* primary context retained by us */
    bool no_cache;             /* COLLD_GPU_HOST_CACHE=0: every call asks the driver (a baseline to measure) */
    gpu_stream_t streams[STREAM_CACHE];
    unsigned stream_next; /* the next entry of streams to overwrite */
    uint64_t swept_ns;    /* when a post last swept (colld__gpu_sweep_freed) */
    uint64_t posts;       /* stream-ordered posts prepared */
    uint64_t post_now;    /* the number of the post being prepared, 0 outside one (gpu_reg_t.seen) */
    int8_t flush[MAX_DEVICES]; /* CAN_FLUSH_REMOTE_WRITES: 0 unknown, 1 no, 2 yes */
};

/* What the driver says of a pointer. */
typedef struct {
    unsigned int memtype; /* CUmemorytype, 0 for memory CUDA does not know */
    unsigned long long buffer_id;
    int ordinal;
    unsigned int ipc; /* legacy CUDA IPC capable (cudaMalloc / cuMemAlloc) */
    unsigned int managed;
    CUdeviceptr range_start;
    size_t range_size;
    CUcontext ctx;
} ptr_info_t;

_Static_assert(sizeof(CUipcMemHandle) == COLLD_WIRE_CUDA_IPC_BYTES, "IPC handle size");
_Static_assert(sizeof(CUuuid) == 16, "device uuid size");

/* Record st with "cuIpcGetMemHandle: CUDA_ERROR_... (text)" in err; returns st. */
static inline colld_status_t cu_say(const colld_cu_t *cu, colld_err_t *err, colld_status_t st, CUresult r,
                                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static inline colld_status_t cu_say(const colld_cu_t *cu, colld_err_t *err, colld_status_t st, CUresult r,
                                    const char *fmt, ...)
{
    char what[192], desc[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return colld_err_set(err, st, "%s: %s", what, colld_cu_describe(cu, r, desc, sizeof(desc)));
}

/* Make ctx current for a while; *pushed says whether ctx_leave must pop it. */
static inline CUresult ctx_enter(const colld_cu_t *cu, CUcontext ctx, bool *pushed)
{
    CUcontext cur = NULL;
    *pushed = false;
    if (!ctx || (CU_CHECK(cu, cuCtxGetCurrent, &cur) == CUDA_SUCCESS && cur == ctx))
        return CUDA_SUCCESS;
    CUresult r = CU_CHECK(cu, cuCtxPushCurrent, ctx);
    *pushed = r == CUDA_SUCCESS;
    return r;
}

static inline void ctx_leave(const colld_cu_t *cu, bool pushed)
{
    CUcontext popped;
    if (pushed)
        CU_CHECK(cu, cuCtxPopCurrent, &popped);
}

/* Unregister a GPU flag area from CUDA, in the context it was registered in (cu NULL: the driver
 * is gone, nothing to unregister), and unmap it: at disconnect (cuda.c), or once the last CUDA
 * graph that held plan lines of an area adopted at disconnect is gone (cuda_graph.c). */
static inline void flags_unmap(const colld_cu_t *cu, void *area, size_t size, CUcontext ctx)
{
    bool pushed = false;
    if (cu && ctx_enter(cu, ctx, &pushed) == CUDA_SUCCESS)
        CU_CHECK(cu, cuMemHostUnregister, area);
    ctx_leave(cu, pushed);
    (void)SYS_CHECK(CLIENT, munmap(area, size));
}

/* ---- cuda_reg.c (g->mu held for all) ---- */

/* How many cached registrations each stream-ordered post checks (colld__gpu_sweep_freed). */
#define SWEEP_PER_POST 2

/* Resolve [p, p + bytes) of device memory (pi: its attributes) to a registration: a cached one
 * that covers it, else one registered now for the allocation(s) it spans (one, or consecutive VMM
 * mappings of one reservation). *out is (registration, offset); *entry (if not NULL) the cache
 * entry, valid until g->mu is dropped. A context current. */
colld_status_t colld__gpu_resolve(colld_client_t *c, colld_gpu_t *g, const colld_cu_t *cu, const void *p, size_t bytes,
                                  const ptr_info_t *pi, const char *which, colld_wire_buf_t *out, gpu_reg_t **entry,
                                  colld_err_t *err);
/* A cached registration that needs no driver call to be trusted (issue 28 item 2): one that
 * colld_mem_register pinned or colld_mem_alloc made, holding [p, p + bytes) (their memory is
 * freed only after colld_mem_deregister / colld_mem_free, by the API's contract). NULL if none. */
gpu_reg_t *colld__gpu_lookup_owned(colld_gpu_t *g, const void *p, size_t bytes);
/* A cached registration that holds [p, p + bytes) with the allocation of buffer id `id` at p. */
gpu_reg_t *colld__gpu_lookup(colld_gpu_t *g, const void *p, size_t bytes, unsigned long long id);
/* The buffer reference (registration, offset) of [p, p + bytes) in cache entry e; checks the
 * bytes against what the registration may use. */
colld_status_t colld__gpu_reg_ref(const gpu_reg_t *e, const void *p, size_t bytes, const char *which,
                                  colld_wire_buf_t *out, colld_err_t *err);
/* The rule for implicit registrations (issue 15 C1/D4): check up to `max` cached registrations
 * and deregister those whose allocation the application freed. During a post, an entry whose
 * buffer id that post read (seen == g->post_now) is alive and not asked about again. */
void colld__gpu_sweep_freed(colld_client_t *c, colld_gpu_t *g, const colld_cu_t *cu, size_t max);
/* Remove cache entry i and tell the daemon (its mapping there goes once no collective uses it). */
colld_status_t colld__gpu_reg_remove(colld_client_t *c, colld_gpu_t *g, size_t i);
/* Free colld_mem_alloc memory (its registration is gone). */
void colld__gpu_free_owned(const colld_cu_t *cu, const gpu_reg_t *e);

#endif /* COLLD_CLIENT_CUDA_INTERNAL_H */
