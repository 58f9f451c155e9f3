/*
 * cuda.h - what the files of the CUDA backend share (internal to server/backends/cuda).
 *
 *   cuda.c         the backend: start and stop (the GPUs), its operations table
 *   cuda_mem.c     GPU registrations (through transport/cuda_ipc) and each session's flag area
 *   cuda_coll.c    stream-ordered collectives: admission, the wait for the ranks' streams,
 *                  completion, time-outs, failure release
 *   cuda_launch.c  launching a collective's kernels and flag writes (engine thread, no lock)
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

typedef struct {
    CUdevice dev;
    CUcontext ctx;
    CUuuid uuid;
    char name[96];
    bool flush_remote; /* CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES */
} gpu_t;

/* The backend's state (colld_backend_t.state), NULL without a usable GPU. */
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
    unsigned outstanding;                 /* pending + launching + running */
} colld_gpus_t;

/* A communicator's GPU state (colld_dcomm_t.bslot), made by its first stream-ordered descriptor. */
typedef struct {
    CUstream *stream; /* [n GPUs], created on first use (engine thread) */
    unsigned busy;    /* pending + launching + running collectives */
    unsigned running; /* left pending (launching or launched): its kernels may run */
    bool *owe;        /* [nranks]: a release is owed once nothing runs */
    uint32_t *owed;   /* [nranks]: the done value owed */
    colld_status_t owed_status;
    bool *base_set; /* [nranks]: the rank posted a stream-ordered collective: base[] is its flag base */
    uint32_t *base; /* [nranks] */
    uint32_t *last; /* [nranks]: flag value of its last stream-ordered collective */
} gpu_comm_t;

/* A session's GPU stream flag area (colld_session_t.bslot): made on the first COLLD_MSG_GPU_FLAGS. */
typedef struct {
    colld_wire_gpu_flag_t *flags;
    size_t size;
    int fd;
    uint64_t dptr; /* the same memory as the GPUs address it */
    uint32_t lines;
} gpu_session_t;

/* A GPU registration's part (colld_reg_t.bpriv). */
typedef struct {
    int gpu; /* index of the daemon's GPU that holds it */
    int how; /* colld_cuda_export_t */
    uint8_t ipc[COLLD_WIRE_CUDA_IPC_BYTES];
} gpu_reg_t;

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

/* ---- cuda_mem.c ---- */
colld_status_t cuda_mem_register(colld_backend_t *b, colld_session_t *s, const colld_wire_msg_t *m, int fd,
                                 uint32_t *reg_id, colld_err_t *err);
void cuda_mem_release(colld_backend_t *b, colld_reg_t *r);
int cuda_sync_area(colld_backend_t *b, colld_session_t *s, uint64_t *size, uint32_t *lines, colld_err_t *err);
void cuda_session_free(colld_backend_t *b, colld_session_t *s);

/* ---- cuda_coll.c ---- */
colld_status_t cuda_admit(colld_backend_t *b, colld_op_t *op, colld_err_t *err);
void cuda_submit(colld_backend_t *b, colld_coll_t *k);
int cuda_progress(colld_backend_t *b, uint64_t now, uint64_t *deadline);
bool cuda_outstanding(const colld_backend_t *b);
void cuda_launched(colld_backend_t *b);
bool cuda_comm_busy(const colld_backend_t *b, const colld_dcomm_t *c);
void cuda_stream_failed(colld_backend_t *b, colld_session_t *s, const colld_wire_sqe_t *sqe, colld_status_t st);
void cuda_comm_broken(colld_daemon_t *d, colld_dcomm_t *c);
void cuda_comm_freed(colld_daemon_t *d, colld_dcomm_t *c);

/* ---- cuda_launch.c ---- */
/* Launch what cuda_progress found ready (engine thread, lock NOT held); true when anything was. */
bool cuda_launch(colld_backend_t *b);

#endif /* COLLD_SERVER_BACKENDS_CUDA_CUDA_H */
