/*
 * fake.h - internals of the CUDA driver test double (tests/cudafake, built as libcuda.so.1 for
 * tests only; never installed, never a driver for real work).
 *
 * The double stands in for the NVIDIA driver's libcuda.so.1 in tests: a test puts its directory
 * first in LD_LIBRARY_PATH (or dlopens it by path) and colld's loader (common/cudadrv.c) finds
 * it, asks cuGetProcAddress_v2 for every entry point at the ABI version it wants, and gets the
 * double's implementation of that very version. README.md says what it models and what it cannot
 * show.
 *
 * The real driver's exported names and prototypes are used for every function (cuda.h with
 * __CUDA_API_VERSION_INTERNAL, as the driver itself is built), so the compiler checks each one
 * against the toolkit's header, and the entry table (entry.c) checks each against cudaTypedefs.h's
 * PFN_<name>_v<version>. Nothing but cuGetProcAddress, cuGetProcAddress_v2, the double's control
 * functions (cudafake.h) and the host builds of colld's kernels is exported (libcuda.map).
 *
 * One lock (fk.mu) guards all driver state; it is never held while a kernel, a host function or a
 * stream memory wait runs. One condition variable (fk.cv) is broadcast whenever a stream makes
 * progress or its queue changes.
 */
#ifndef COLLD_TESTS_CUDAFAKE_FAKE_H
#define COLLD_TESTS_CUDAFAKE_FAKE_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "tests/cudafake/hkernel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FK_EXPORT __attribute__((visibility("default")))

/* Bounds of the double (each documented in README.md). */
#define FK_MAX_DEVICES 16
#define FK_MAX_STREAMS 1024     /* live streams per process, legacy ones included */
#define FK_MAX_EVENTS 65536     /* live events per process */
#define FK_MAX_QUEUE 65536      /* queued operations per stream: the enqueuer blocks beyond */
#define FK_MAX_BATCH 256        /* operations of one cuStreamBatchMemOp */
#define FK_CTX_STACK 64         /* depth of a thread's context stack */
#define FK_MAX_NODES 65536      /* nodes of one graph */
#define FK_MAX_FAULTS 64        /* fault specifications */
#define FK_MAX_PARAMS 4096      /* bytes of one kernel's parameters */
/* Host threads that run one launch's blocks at once (the stream's worker and FK_BLOCK_WORKERS - 1
 * helpers): a block that waits on a word another block writes can run while that block runs, as
 * on a GPU whose resident blocks run together. A grid of more blocks runs in waves, as a grid larger
 * than the GPU's resident capacity does: a kernel that needs more co-resident blocks than this
 * waits forever here (and would on a GPU with too few resident slots). Few, for TSan's cost. */
#define FK_BLOCK_WORKERS 4

/* ============================================================================================
 * Entry points: X(base name, flags). The base name is what cuGetProcAddress is asked for and what
 * a fault specification names; the versioned implementations are listed in entry.c.
 * ========================================================================================== */

#define FK_F_NOINIT 1u /* callable before cuInit */
#define FK_F_ASYNC 2u  /* enqueues work: a "sticky" fault fails that work when it executes */

#define FK_ENTRIES(X)                                                                                        \
    X(cuInit, FK_F_NOINIT) X(cuDriverGetVersion, FK_F_NOINIT) X(cuGetErrorName, FK_F_NOINIT)                 \
    X(cuGetErrorString, FK_F_NOINIT) X(cuGetProcAddress, FK_F_NOINIT)                                        \
    X(cuDeviceGetCount, 0) X(cuDeviceGet, 0) X(cuDeviceGetName, 0) X(cuDeviceGetUuid, 0)                     \
    X(cuDeviceGetAttribute, 0) X(cuDeviceTotalMem, 0) X(cuDeviceCanAccessPeer, 0)                            \
    X(cuDevicePrimaryCtxRetain, 0) X(cuDevicePrimaryCtxRelease, 0) X(cuDevicePrimaryCtxReset, 0)             \
    X(cuDevicePrimaryCtxGetState, 0) X(cuDevicePrimaryCtxSetFlags, 0)                                        \
    X(cuCtxSetCurrent, 0) X(cuCtxGetCurrent, 0) X(cuCtxGetDevice, 0) X(cuCtxGetId, 0) X(cuCtxPushCurrent, 0)   \
    X(cuCtxPopCurrent, 0) X(cuCtxEnablePeerAccess, 0) X(cuCtxDisablePeerAccess, 0) X(cuCtxSynchronize, 0)    \
    X(cuStreamCreate, 0) X(cuStreamCreateWithPriority, 0) X(cuStreamDestroy, 0) X(cuStreamGetCtx, 0)         \
    X(cuStreamGetId, 0) X(cuStreamGetFlags, 0) X(cuStreamWaitEvent, FK_F_ASYNC) X(cuStreamSynchronize, 0)    \
    X(cuStreamQuery, 0)                                                                                      \
    X(cuStreamWriteValue32, FK_F_ASYNC) X(cuStreamWaitValue32, FK_F_ASYNC)                                   \
    X(cuStreamWriteValue64, FK_F_ASYNC) X(cuStreamWaitValue64, FK_F_ASYNC)                                   \
    X(cuStreamBatchMemOp, FK_F_ASYNC) X(cuLaunchHostFunc, FK_F_ASYNC)                                        \
    X(cuEventCreate, 0) X(cuEventRecord, FK_F_ASYNC) X(cuEventRecordWithFlags, FK_F_ASYNC)                   \
    X(cuEventQuery, 0) X(cuEventSynchronize, 0) X(cuEventDestroy, 0) X(cuEventElapsedTime, 0)                \
    X(cuPointerGetAttribute, 0) X(cuPointerGetAttributes, 0) X(cuMemGetAddressRange, 0)                      \
    X(cuMemAlloc, 0) X(cuMemFree, 0) X(cuMemcpyHtoD, FK_F_ASYNC) X(cuMemcpyDtoH, FK_F_ASYNC)                 \
    X(cuMemcpyHtoDAsync, FK_F_ASYNC) X(cuMemcpyDtoHAsync, FK_F_ASYNC) X(cuMemsetD8, FK_F_ASYNC)              \
    X(cuIpcGetMemHandle, 0) X(cuIpcOpenMemHandle, 0) X(cuIpcCloseMemHandle, 0)                               \
    X(cuMemCreate, 0) X(cuMemRelease, 0) X(cuMemAddressReserve, 0) X(cuMemAddressFree, 0) X(cuMemMap, 0)     \
    X(cuMemUnmap, 0) X(cuMemSetAccess, 0) X(cuMemGetAccess, 0) X(cuMemGetAllocationGranularity, 0)          \
    X(cuMemExportToShareableHandle, 0) X(cuMemImportFromShareableHandle, 0)                                  \
    X(cuMemRetainAllocationHandle, 0) X(cuMemGetAllocationPropertiesFromHandle, 0)                           \
    X(cuMemHostRegister, 0) X(cuMemHostUnregister, 0) X(cuMemHostGetDevicePointer, 0)                        \
    X(cuLibraryLoadData, 0) X(cuLibraryUnload, 0) X(cuLibraryGetKernel, 0) X(cuLibraryGetKernelCount, 0)     \
    X(cuLibraryEnumerateKernels, 0) X(cuKernelGetFunction, 0)                                                \
    X(cuKernelGetName, 0) X(cuModuleLoadData, 0) X(cuModuleUnload, 0) X(cuModuleGetFunction, 0)              \
    X(cuLaunchKernel, FK_F_ASYNC)                                                                            \
    X(cuStreamBeginCapture, 0) X(cuStreamEndCapture, 0) X(cuStreamIsCapturing, 0)                            \
    X(cuThreadExchangeStreamCaptureMode, 0)                                                                  \
    X(cuStreamGetCaptureInfo, 0) X(cuGraphInstantiate, 0) X(cuGraphInstantiateWithFlags, 0)                  \
    X(cuGraphLaunch, FK_F_ASYNC) X(cuGraphDestroy, 0) X(cuGraphExecDestroy, 0) X(cuGraphGetNodes, 0)         \
    X(cuUserObjectCreate, 0) X(cuUserObjectRetain, 0) X(cuUserObjectRelease, 0)                              \
    X(cuGraphRetainUserObject, 0) X(cuGraphReleaseUserObject, 0)

#define FK_ENTRY_ENUM(name, flags) FK_E_##name,
typedef enum { FK_ENTRIES(FK_ENTRY_ENUM) FK_E_COUNT } fk_entry_t;
#undef FK_ENTRY_ENUM

/* Every entry point starts with FK_BEGIN(base name): it counts the call, applies the fault
 * specifications (fault.c) and, for most entries, refuses calls before cuInit. */
#define FK_BEGIN(name)                                                                                       \
    do {                                                                                                     \
        CUresult fk__r = fk_enter(FK_E_##name);                                                             \
        if (fk__r != CUDA_SUCCESS)                                                                           \
            return fk__r;                                                                                    \
    } while (0)

/* ============================================================================================
 * Configuration (config.c: the only file that reads the environment)
 * ========================================================================================== */

typedef struct {
    int attr, value;
} fk_attr_t;

typedef struct {
    char name[256];
    CUuuid uuid;
    int cc_major, cc_minor;
    int sms;
    size_t total_mem;
    size_t gran_min, gran_rec; /* VMM granularities */
    int peer_group;            /* devices of one group can access each other */
    bool memops;               /* stream memory operations (the V2 API) */
    bool memops_v1;            /* the deprecated V1 API (NVreg_EnableStreamMemOPs=1) */
    bool memops64;             /* 64-bit stream memory operations */
    bool wait_nor;             /* CU_STREAM_WAIT_VALUE_NOR */
    bool flush;                /* CU_STREAM_WAIT_VALUE_FLUSH / CAN_FLUSH_REMOTE_WRITES */
    bool vmm;                  /* virtual memory management */
    bool posix_fd;             /* POSIX file descriptor handles of VMM allocations */
    bool ipc;                  /* legacy CUDA IPC */
    fk_attr_t attrs[32];       /* aNN=V overrides */
    int nattrs;
} fk_device_spec_t;

typedef struct {
    int ndev;
    fk_device_spec_t dev[FK_MAX_DEVICES];
    int driver_version;
    size_t arena_bytes;
    char faults[4096];
    char control_path[4096];
    char error[512]; /* set when the environment is malformed: cuInit fails */
} fk_config_t;

/* Read the environment into *cfg (called once, at the first entry point). */
void fk_config_load(fk_config_t *cfg);

/* ============================================================================================
 * Objects and handles
 * ========================================================================================== */

typedef enum {
    FK_K_STREAM = 1,
    FK_K_EVENT,
    FK_K_PHYS,
    FK_K_LIBRARY,
    FK_K_KERNEL,
    FK_K_FUNCTION,
    FK_K_GRAPH,
    FK_K_EXEC,
    FK_K_UOBJ,
} fk_kind_t;

/* Handles given to the application are pointers to objects that are registered here while they
 * are live, so that a stale or bogus handle is CUDA_ERROR_INVALID_HANDLE instead of a crash. */
void fk_handle_add(const void *h, fk_kind_t kind); /* fk.mu held */
void fk_handle_del(const void *h);                 /* fk.mu held */
bool fk_handle_ok(const void *h, fk_kind_t kind);  /* fk.mu held */

typedef struct fk_ctx fk_ctx_t;
typedef struct fk_stream fk_stream_t;
typedef struct fk_event fk_event_t;
typedef struct fk_op fk_op_t;
typedef struct fk_capture fk_capture_t;
typedef struct fk_graph fk_graph_t;
typedef struct fk_exec fk_exec_t;

/* A device's primary context (the double has no other kind). */
struct fk_ctx {
    int dev;
    int retains;          /* cuDevicePrimaryCtxRetain count; 0: inactive */
    bool active;          /* created (by a retain) and not destroyed since */
    unsigned flags;       /* cuDevicePrimaryCtxSetFlags */
    uint64_t generation;  /* bumped when the context is destroyed or reset */
    CUresult sticky;      /* a sticky error: every call on the context fails with it until reset */
    uint32_t peer;        /* devices whose memory this context may access (cuCtxEnablePeerAccess) */
    fk_stream_t *legacy;  /* its legacy default stream, created on first use */
    fk_stream_t *streams; /* its other streams (destroyed ones until they drain) */
};

/* ============================================================================================
 * Stream operations
 * ========================================================================================== */

typedef struct {
    fk_stream_t *s;
    uint64_t seq; /* done once s->done >= seq */
} fk_dep_t;

/* One stream memory operation (a CUstreamBatchMemOpParams, validated). */
typedef struct {
    int type;         /* CU_STREAM_MEM_OP_* */
    uintptr_t addr;
    uint64_t value;
    unsigned flags;
} fk_memop_t;

typedef enum {
    FK_OP_NOP = 1,  /* a dependency only (cuStreamWaitEvent) */
    FK_OP_KERNEL,
    FK_OP_MEMOP,
    FK_OP_RECORD,   /* cuEventRecord */
    FK_OP_WAITEV,   /* an event wait node of a graph (waits for the event when it runs) */
    FK_OP_HOSTFN,
    FK_OP_COPY,     /* cuMemcpyHtoD / DtoH */
    FK_OP_SET,      /* cuMemsetD8 */
    FK_OP_GRAPH,    /* cuGraphLaunch */
} fk_opkind_t;

struct fk_op {
    fk_op_t *next;
    fk_opkind_t kind;
    uint64_t seq;
    CUresult fault;   /* injected: the work fails with this when it executes (sticky) */
    fk_dep_t *deps;
    int ndeps;
    union {
        struct {
            const fk_hkernel_t *k;
            unsigned char *params; /* a copy, k's parameter bytes */
            size_t nthreads;       /* the grid's threads ... */
            size_t block_threads;  /* ... in blocks of this many */
            const char *name;
        } kernel;
        struct {
            fk_memop_t *ops;
            int n;
            fk_memop_t one;
        } memop;
        struct {
            fk_event_t *ev;
        } record;
        struct {
            CUhostFn fn;
            void *arg;
        } host;
        struct {
            void *host;
            uintptr_t dev;
            size_t bytes;
            bool to_device;
        } copy;
        struct {
            uintptr_t dev;
            unsigned char value;
            size_t bytes;
        } set;
        struct {
            fk_exec_t *exec;
        } graph;
    } u;
};

struct fk_stream {
    fk_ctx_t *ctx;
    uint64_t ctx_gen;
    unsigned flags;        /* CU_STREAM_NON_BLOCKING */
    int priority;
    bool legacy;
    uint64_t id;           /* creation number (1-based, user streams), for fault specifications */
    fk_stream_t *next;     /* in ctx->streams */
    fk_op_t *head, *tail;  /* queued, not started */
    int queued;
    uint64_t enqueued;     /* last sequence number given out */
    uint64_t done;         /* every op up to this one has finished */
    uint64_t executed;     /* ops finished (for stall specifications) */
    int refs;              /* the handle, dependencies on it, the worker */
    bool handle_live;      /* not destroyed by the application */
    atomic_bool abort;     /* its context went away: drop everything */
    bool worker;           /* a worker thread exists */
    bool running;          /* the worker is executing an op */
    fk_capture_t *capture; /* capturing into this sequence */
    char label[32];
};

struct fk_event {
    fk_ctx_t *ctx;
    unsigned flags;
    int refs;              /* the handle + ops that record it */
    bool handle_live;
    bool recorded;         /* recorded at least once (outside capture) */
    fk_stream_t *rec_s;    /* its last record: done when rec_s->done >= rec_seq */
    uint64_t rec_seq;
    uint64_t stamp_ns;     /* when the last record executed */
    uint64_t stamp_seq;
    fk_stream_t *stamp_s;  /* which record the stamp belongs to */
    uint64_t cap_id;       /* last recorded inside capture sequence cap_id (0: not) */
    uint64_t cap_s_id;     /* by that stream, after its cap_nodes-th node */
    int cap_nodes;
    fk_event_t *next;      /* every live event (a context's go when it is destroyed) */
};

/* ============================================================================================
 * Device memory (memory.c, vmm_ipc.c): regions of the arena, a reserved range of the process's
 * address space where every device address lives. Device pointers are host addresses inside it,
 * so that host builds of kernels dereference them; what a device may touch is checked before.
 * ========================================================================================== */

typedef enum {
    FK_R_ALLOC = 1, /* cuMemAlloc: one memfd mapped read-write */
    FK_R_IPC,       /* cuIpcOpenMemHandle: the exporter's memfd mapped here */
    FK_R_RESERVE,   /* cuMemAddressReserve: PROT_NONE until mappings are made and access is set */
} fk_rkind_t;

/* A physical VMM allocation (cuMemCreate / cuMemImportFromShareableHandle): its handle is this. */
typedef struct fk_phys {
    int fd;               /* memfd holding the memory */
    size_t size;
    int dev;
    CUmemAllocationProp prop;
    uint64_t block_id;    /* CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID */
    bool imported;        /* from another process: its memory is counted there */
    int handle_refs;      /* cuMemCreate / import / retain, minus cuMemRelease */
    int map_refs;         /* mappings of it */
} fk_phys_t;

typedef struct fk_map {
    struct fk_map *next;
    uintptr_t base;
    size_t size;
    fk_phys_t *phys;
    uint32_t read;        /* devices that may read it (cuMemSetAccess) */
    uint32_t write;       /* devices that may write it */
    uint64_t buffer_id;
} fk_map_t;

typedef struct fk_region {
    struct fk_region *next; /* sorted by base */
    fk_rkind_t kind;
    uintptr_t base;
    size_t size;            /* bytes of address space taken */
    size_t bytes;           /* ALLOC: bytes asked for; IPC: bytes of the exported allocation */
    int fd;                 /* ALLOC, IPC */
    uint64_t buffer_id;
    int dev;                /* ALLOC, IPC: the device of the memory */
    fk_ctx_t *ctx;          /* ALLOC, IPC: the context it was allocated or opened in */
    pid_t ipc_pid;          /* IPC: the exporter and its allocation */
    uint64_t ipc_buffer_id;
    unsigned ipc_flags;
    int ipc_refs;           /* opens of the same handle */
    fk_map_t *maps;         /* RESERVE: its mappings, sorted */
} fk_region_t;

fk_region_t *fk_region_find(uintptr_t p);                 /* lock held */
fk_region_t *fk_region_new(fk_rkind_t kind, size_t size, size_t align); /* lock held */
void fk_region_free(fk_region_t *r);                      /* lock held */
fk_region_t *fk_regions(void);                            /* lock held: the list */
fk_map_t *fk_map_find(const fk_region_t *r, uintptr_t p); /* lock held */
bool fk_dev_mem_take(int dev, size_t bytes);              /* lock held: false when the device is full */
void fk_dev_mem_give(int dev, size_t bytes);              /* lock held */

/* ============================================================================================
 * Global state
 * ========================================================================================== */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_once_t once;
    fk_config_t cfg;
    bool inited;           /* cuInit succeeded */
    fk_ctx_t ctx[FK_MAX_DEVICES];
    uint64_t next_stream_id;
    uint64_t next_buffer_id;
    int nstreams, nevents;
    size_t dev_used[FK_MAX_DEVICES]; /* device memory in use (bytes) */
} fk_state_t;

extern fk_state_t fk;

/* Load the configuration once (any entry point may be first). */
void fk_boot(void);

/* ============================================================================================
 * Functions shared between files. "lock held" means fk.mu.
 * ========================================================================================== */

/* entry.c */
CUresult fk_enter(fk_entry_t e);
/* Set on the thread that runs user object destructors (graph.c): the driver forbids CUDA calls
 * there, and fk_enter refuses them. */
extern __thread bool fk_in_destructor;
const char *fk_entry_name(fk_entry_t e);
const char *fk_result_name(CUresult r); /* NULL for an unknown code */
uint64_t fk_now_ns(void);
void fk_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* fault.c */
bool fk_fault_init(const char *specs, const char *control_path); /* false: malformed */
CUresult fk_fault_call(fk_entry_t e, bool *sticky);
bool fk_fault_stalled(const fk_stream_t *s);
void fk_fault_poll(void);
uint64_t fk_fault_count(fk_entry_t e);
CUresult fk_take_async_fault(void); /* the pending fault of this thread's current call */

/* device.c */
fk_ctx_t *fk_ctx_current(void);                 /* this thread's current context, or NULL */
CUresult fk_ctx_get(fk_ctx_t **out);            /* the current context, usable (lock held) */
CUresult fk_ctx_check(fk_ctx_t *ctx);           /* active and not sticky (lock held) */
void fk_ctx_set_sticky(fk_ctx_t *ctx, CUresult r, const char *why); /* lock held */
const fk_device_spec_t *fk_dev(int dev);
int fk_dev_by_uuid(const unsigned char *uuid);
bool fk_dev_peer_capable(int a, int b);

/* memory.c */
CUresult fk_arena_init(size_t bytes);
CUresult fk_mem_access(fk_ctx_t *ctx, uintptr_t p, size_t len, bool write, const char *what); /* lock held */
void fk_mem_ctx_destroyed(fk_ctx_t *ctx);      /* lock held: free the context's allocations */
uintptr_t fk_arena_take(size_t size, size_t align);
void fk_arena_give(uintptr_t base, size_t size);
int fk_memfd(const char *name, size_t size);

/* vmm_ipc.c */
void fk_ipc_ctx_destroyed(fk_ctx_t *ctx);      /* lock held */

/* stream.c */
CUresult fk_stream_resolve(CUstream h, fk_stream_t **out, bool need_current); /* lock held */
CUresult fk_enqueue(fk_stream_t *s, fk_op_t *op); /* lock held; takes op (freed on failure) */
fk_op_t *fk_op_new(fk_opkind_t kind);
void fk_op_free(fk_op_t *op);                  /* lock held */
fk_op_t *fk_op_clone(const fk_op_t *op);       /* lock held */
CUresult fk_op_exec(fk_stream_t *s, fk_op_t *op); /* lock NOT held */
CUresult fk_stream_wait(fk_stream_t *s, uint64_t seq); /* lock held: until s->done >= seq */
void fk_stream_unref(fk_stream_t *s);          /* lock held */
void fk_streams_ctx_destroyed(fk_ctx_t *ctx);  /* lock held (dropped and retaken inside) */
void fk_event_unref(fk_event_t *e);            /* lock held */
CUresult fk_ctx_synchronize(fk_ctx_t *ctx);    /* lock held */
void fk_sync_all(const char *what);             /* lock held: implicit synchronization */

/* memops.c */
CUresult fk_memop_validate(const fk_device_spec_t *d, const CUstreamBatchMemOpParams *p, bool v1, fk_memop_t *out);
CUresult fk_memop_run(fk_stream_t *s, const fk_memop_t *m, int n); /* lock NOT held */

/* launch.c */
CUresult fk_kernel_run(fk_stream_t *s, fk_op_t *op); /* lock NOT held */

/* graph.c */
CUresult fk_capture_add(fk_stream_t *s, fk_op_t *op);  /* lock held: s->capture set; takes op */
CUresult fk_capture_unsafe(const char *what);          /* lock held: may this call run now? */
CUresult fk_capture_invalidate(fk_stream_t *s, const char *what); /* lock held: s is capturing */
void fk_capture_record(fk_stream_t *s, fk_event_t *e); /* lock held: a record inside s's capture */
CUresult fk_capture_wait_event(fk_stream_t *s, fk_event_t *e, unsigned flags, bool *handled); /* lock held */
CUresult fk_exec_run(fk_stream_t *s, fk_exec_t *x, uint64_t seq); /* lock NOT held */
void fk_exec_launched(fk_exec_t *x);                   /* lock held: a launch finished */
bool fk_capture_legacy_conflict(fk_ctx_t *ctx);        /* lock held */

/* kernels.cpp: hkernel.h */

#endif /* COLLD_TESTS_CUDAFAKE_FAKE_H */
