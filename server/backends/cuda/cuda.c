/*
 * gpu.c - the CUDA backend of the daemon: GPUs, GPU registrations, stream flags and the
 * execution of stream-ordered collectives.
 *
 * GPUs: at start the driver is loaded at run time (common/cudadrv); every visible GPU's primary
 * context is retained and peer access is enabled between every pair the driver says can reach
 * each other. A daemon without a driver or a GPU serves host collectives only, and answers GPU
 * requests with COLLD_ERR_NOT_SUPPORTED and the reason.
 *
 * Registrations (COLLD_MSG_REG_CUDA): an IPC handle is opened once per session
 * (cuIpcOpenMemHandle, peer access enabled lazily); a VMM allocation arrives as a POSIX fd, is
 * imported, mapped into a reserved range of the daemon's address space and made accessible to
 * its GPU and every GPU with peer access. Either way the daemon bounds-checks each reference
 * against the size of the allocation it really mapped (never the size the client claimed), and
 * releases the mapping on deregistration or session end once no collective uses it.
 *
 * Stream-ordered collectives (COLLD_SQE_STREAM; the flag protocol is in proto/wire.h):
 *
 *   matched   every rank posted the descriptor; the collective waits in `pending` (FIFO)
 *   ready     every rank's `ready` flag reached its sequence number: the engine thread launches
 *             it (outside the lock) on the communicator's stream of each GPU involved, then
 *             the lead GPU's stream writes every rank's `done` flag and records an event
 *   running   the engine polls the event; when it has fired the completions are posted
 *
 * The daemon launches only when every rank's stream got there (host-side check of the flags),
 * instead of making its own stream wait for them: a wait enqueued on a GPU stream cannot be
 * cancelled, and a kernel must never run on the buffers of a rank that died or never got there.
 * It also lets the time-out name the ranks whose stream never reached the collective.
 *
 * Failure release: a collective that fails, and every rank of a communicator that breaks, gets
 * its `done` flag set to (last sequence number + COLLD_WIRE_GPU_RELEASE) so that no application
 * stream waits forever; this is deferred while a kernel of the communicator is still running
 * (its stream write of `done` would otherwise move the flag backwards).
 */
#include "server/core/daemon.h"

#include "common/cudadrv.h"
#include "common/log.h"
#include "transport/shm/ring.h"
#include "common/util.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef COLLD_HAVE_CUDA

/* ============================================================================================
 * A build without the CUDA toolkit: no GPU, every GPU request is refused.
 * ========================================================================================== */

#define NO_CUDA "this colld was built without CUDA support (no CUDA toolkit at build time)"

int colld_gpu_start(colld_daemon_t *d)
{
    colld_strlcpy(d->gpu_none, NO_CUDA, sizeof(d->gpu_none));
    return 0;
}

void colld_gpu_stop(colld_daemon_t *d)
{
    (void)d;
}

int colld_gpu_count(const colld_daemon_t *d)
{
    (void)d;
    return 0;
}

colld_status_t colld_gpu_register(colld_session_t *s, const colld_wire_msg_t *m, int fd, uint32_t *reg_id,
                                  char *detail, size_t len)
{
    (void)s, (void)m, (void)fd, (void)reg_id;
    snprintf(detail, len, "%s", NO_CUDA);
    return COLLD_ERR_NOT_SUPPORTED;
}

int colld_gpu_flags_dup(colld_session_t *s, uint64_t *size, uint32_t *lines, colld_status_t *st, char *detail,
                        size_t len)
{
    (void)s, (void)size, (void)lines;
    *st = COLLD_ERR_NOT_SUPPORTED;
    snprintf(detail, len, "%s", NO_CUDA);
    return -1;
}

void colld_gpu_release_reg(colld_reg_t *r)
{
    (void)r;
}

void colld_gpu_session_free(colld_session_t *s)
{
    (void)s;
}

void colld_gpu_submit(colld_daemon_t *d, colld_coll_t *k)
{
    k->status = COLLD_ERR_NOT_SUPPORTED;
    colld_engine_finish(d, k);
}

int colld_gpu_progress(colld_daemon_t *d, uint64_t now, uint64_t *deadline, colld_coll_t **launch,
                       colld_reply_t **replies)
{
    (void)d, (void)now, (void)deadline, (void)launch, (void)replies;
    return 0;
}

void colld_gpu_launch(colld_daemon_t *d, colld_coll_t *list)
{
    (void)d, (void)list;
}

void colld_gpu_launched(colld_daemon_t *d, colld_coll_t *list, colld_reply_t **replies)
{
    (void)d, (void)list, (void)replies;
}

bool colld_gpu_busy(const colld_dcomm_t *c)
{
    (void)c;
    return false;
}

bool colld_gpu_outstanding(const colld_daemon_t *d)
{
    (void)d;
    return false;
}

void colld_gpu_comm_broken(colld_daemon_t *d, colld_dcomm_t *c)
{
    (void)d, (void)c;
}

void colld_gpu_owe_release(colld_dcomm_t *c, int rank, uint32_t value, colld_status_t st)
{
    (void)c, (void)rank, (void)value, (void)st;
}

void colld_gpu_comm_free(colld_daemon_t *d, colld_dcomm_t *c)
{
    (void)d, (void)c;
}

#else /* COLLD_HAVE_CUDA */

#include "kernels/cuda/cuda_kernels.h"

typedef struct {
    CUdevice dev;
    CUcontext ctx;
    CUuuid uuid;
    char name[96];
    bool flush_remote; /* CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES */
} gpu_t;

struct colld_gpus {
    const colld_cu_t *cu;
    int n;
    gpu_t *gpu;
    bool *peer;              /* [n][n]: i can access j's memory */
    colld_coll_t *pending, *pending_tail; /* matched, waiting for the ranks' ready flags */
    colld_coll_t *running;   /* launched, waiting for their event */
    unsigned outstanding;    /* pending + launching + running */
};

/* A communicator's GPU state (created with its first stream-ordered collective). */
struct colld_gpu_comm {
    CUstream *stream;        /* [n GPUs], created on first use (engine thread) */
    unsigned busy;           /* pending + launching + running collectives */
    unsigned running;        /* launched, kernels may still run */
    bool *owe;               /* [nranks]: a release is owed once nothing runs */
    uint32_t *owed;          /* [nranks]: the done value owed */
    colld_status_t owed_status;
};

#define CU (d->gpus->cu)

/* Release one flag line: status, then `done` moved forward (never back) to `value` (lock held). */
static void flag_release(colld_session_t *s, uint32_t handle, uint32_t value, colld_status_t st)
{
    if (!s || !s->gpu_flags || handle == 0 || handle >= s->gpu_lines)
        return;
    colld_wire_gpu_flag_t *f = &s->gpu_flags[handle];
    if (st != COLLD_OK)
        __atomic_store_n(&f->status, (int32_t)st, __ATOMIC_RELAXED);
    uint32_t cur = __atomic_load_n(&f->done, __ATOMIC_RELAXED);
    if ((int32_t)(value - cur) > 0)
        __atomic_store_n(&f->done, value, __ATOMIC_RELEASE);
}

static const char *cu_err(const colld_cu_t *cu, CUresult r, char *buf, size_t len)
{
    return colld_cu_describe(cu, r, buf, len);
}

/* ============================================================================================
 * Start and stop
 * ========================================================================================== */

int colld_gpu_start(colld_daemon_t *d)
{
    char err[256];
    const colld_cu_t *cu = colld_cu_load(err, sizeof(err));
    if (!cu) {
        colld_strlcpy(d->gpu_none, err, sizeof(d->gpu_none));
        LOG_INFO(GPU, "no CUDA backend: %s", err);
        return 0;
    }
    int n = 0;
    CUresult r = cu->cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n <= 0) {
        char buf[160];
        snprintf(d->gpu_none, sizeof(d->gpu_none), "no GPU visible to the daemon%s%s",
                 r != CUDA_SUCCESS ? ": " : " (check CUDA_VISIBLE_DEVICES and the driver)",
                 r != CUDA_SUCCESS ? cu_err(cu, r, buf, sizeof(buf)) : "");
        LOG_INFO(GPU, "no CUDA backend: %s", d->gpu_none);
        return 0;
    }
    colld_gpus_t *g = calloc(1, sizeof(*g));
    gpu_t *gpu = calloc((size_t)n, sizeof(*gpu));
    bool *peer = calloc((size_t)n * (size_t)n, sizeof(*peer));
    if (!g || !gpu || !peer) {
        free(g), free(gpu), free(peer);
        colld_strlcpy(d->gpu_none, "out of memory", sizeof(d->gpu_none));
        return -1;
    }
    g->cu = cu;
    g->gpu = gpu;
    g->peer = peer;
    for (int i = 0; i < n; i++) {
        char buf[160];
        if ((r = cu->cuDeviceGet(&gpu[i].dev, i)) != CUDA_SUCCESS ||
            (r = cu->cuDeviceGetUuid(&gpu[i].uuid, gpu[i].dev)) != CUDA_SUCCESS ||
            (r = cu->cuDevicePrimaryCtxRetain(&gpu[i].ctx, gpu[i].dev)) != CUDA_SUCCESS) {
            snprintf(d->gpu_none, sizeof(d->gpu_none), "GPU %d: %s", i, cu_err(cu, r, buf, sizeof(buf)));
            LOG_ERROR(GPU, "no CUDA backend: %s", d->gpu_none);
            for (int j = 0; j < i; j++)
                cu->cuDevicePrimaryCtxRelease(gpu[j].dev);
            free(g), free(gpu), free(peer);
            return 0;
        }
        g->n = i + 1;
        if (cu->cuDeviceGetName(gpu[i].name, (int)sizeof(gpu[i].name), gpu[i].dev) != CUDA_SUCCESS)
            snprintf(gpu[i].name, sizeof(gpu[i].name), "GPU %d", i);
        int v = 0;
        if (cu->cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, gpu[i].dev) == CUDA_SUCCESS)
            gpu[i].flush_remote = v != 0;
    }
    /* Peer access where the topology allows it (the driver's verdict, not /sys). */
    for (int i = 0; i < n; i++) {
        peer[i * n + i] = true;
        for (int j = 0; j < n; j++) {
            int can = 0;
            if (i == j || cu->cuDeviceCanAccessPeer(&can, gpu[i].dev, gpu[j].dev) != CUDA_SUCCESS || !can)
                continue;
            cu->cuCtxSetCurrent(gpu[i].ctx);
            r = cu->cuCtxEnablePeerAccess(gpu[j].ctx, 0);
            peer[i * n + j] = r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        }
    }
    cu->cuCtxSetCurrent(NULL);
    d->gpus = g;
    LOG_INFO(GPU, "CUDA backend: %d GPU(s), driver %d.%d, first: %s", n, cu->driver_version / 1000,
             cu->driver_version % 1000 / 10, gpu[0].name);
    return 0;
}

void colld_gpu_stop(colld_daemon_t *d)
{
    colld_gpus_t *g = d->gpus;
    if (!g)
        return;
    for (int i = 0; i < g->n; i++) {
        g->cu->cuCtxSetCurrent(g->gpu[i].ctx);
        g->cu->cuCtxSynchronize();
    }
    g->cu->cuCtxSetCurrent(NULL);
    for (int i = 0; i < g->n; i++)
        g->cu->cuDevicePrimaryCtxRelease(g->gpu[i].dev);
    free(g->gpu);
    free(g->peer);
    free(g);
    d->gpus = NULL;
}

int colld_gpu_count(const colld_daemon_t *d)
{
    return d->gpus ? d->gpus->n : 0;
}

/* ============================================================================================
 * Registrations
 * ========================================================================================== */

static int gpu_by_uuid(const colld_gpus_t *g, const uint8_t *uuid)
{
    for (int i = 0; i < g->n; i++)
        if (memcmp(g->gpu[i].uuid.bytes, uuid, sizeof(g->gpu[i].uuid.bytes)) == 0)
            return i;
    return -1;
}

/* Map an imported VMM allocation of `bytes` into a fresh range, accessible to GPU `gi` and every
 * GPU with peer access to it. Returns CUDA_SUCCESS or the failing call's error. */
static CUresult vmm_map(const colld_gpus_t *g, int gi, CUmemGenericAllocationHandle h, size_t bytes,
                        CUdeviceptr *out)
{
    const colld_cu_t *cu = g->cu;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    CUresult r = cu->cuMemGetAllocationPropertiesFromHandle(&prop, h);
    size_t gran = 0;
    if (r == CUDA_SUCCESS)
        r = cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS)
        return r;
    if (gran && bytes % gran)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = 0;
    if ((r = cu->cuMemAddressReserve(&p, bytes, gran, 0, 0)) != CUDA_SUCCESS)
        return r;
    if ((r = cu->cuMemMap(p, bytes, 0, h, 0)) != CUDA_SUCCESS) {
        cu->cuMemAddressFree(p, bytes);
        return r;
    }
    CUmemAccessDesc acc[64];
    int na = 0;
    for (int j = 0; j < g->n && na < 64; j++)
        if (g->peer[j * g->n + gi]) {
            acc[na].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            acc[na].location.id = (int)g->gpu[j].dev;
            acc[na].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            na++;
        }
    if ((r = cu->cuMemSetAccess(p, bytes, acc, (size_t)na)) != CUDA_SUCCESS) {
        cu->cuMemUnmap(p, bytes);
        cu->cuMemAddressFree(p, bytes);
        return r;
    }
    *out = p;
    return CUDA_SUCCESS;
}

colld_status_t colld_gpu_register(colld_session_t *s, const colld_wire_msg_t *m, int fd, uint32_t *reg_id,
                                  char *detail, size_t len)
{
    colld_daemon_t *d = s->daemon;
    colld_gpus_t *g = d->gpus;
    char buf[160];
    if (!g) {
        snprintf(detail, len, "no GPU here: %s", d->gpu_none);
        return COLLD_ERR_NOT_SUPPORTED;
    }
    unsigned how = m->u.reg_cuda.how;
    uint64_t bytes = m->u.reg_cuda.bytes;
    if (how != COLLD_CUDA_EXPORT_IPC && how != COLLD_CUDA_EXPORT_FD) {
        snprintf(detail, len, "unknown GPU export kind %u", how);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if (bytes == 0) {
        snprintf(detail, len, "GPU registration of 0 bytes");
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    if ((how == COLLD_CUDA_EXPORT_FD) != (fd >= 0)) {
        snprintf(detail, len, how == COLLD_CUDA_EXPORT_FD ? "VMM registration without a file descriptor"
                                                           : "IPC registration with a file descriptor");
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    int gi = gpu_by_uuid(g, m->u.reg_cuda.uuid);
    if (gi < 0) {
        snprintf(detail, len, "the buffer's GPU is not visible to the daemon (is CUDA_VISIBLE_DEVICES narrower for colld?)");
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    /* The same IPC allocation registered again by this session: the same registration. */
    if (how == COLLD_CUDA_EXPORT_IPC) {
        pthread_mutex_lock(&d->lock);
        for (colld_reg_t *r = s->regs; r; r = r->next)
            if (r->cuda && r->how == COLLD_CUDA_EXPORT_IPC &&
                memcmp(r->ipc, m->u.reg_cuda.ipc, COLLD_WIRE_CUDA_IPC_BYTES) == 0) {
                r->users++;
                *reg_id = r->id;
                pthread_mutex_unlock(&d->lock);
                return COLLD_OK;
            }
        pthread_mutex_unlock(&d->lock);
    }
    const colld_cu_t *cu = g->cu;
    cu->cuCtxPushCurrent(g->gpu[gi].ctx);
    CUdeviceptr p = 0;
    size_t mapped = 0;
    CUresult r;
    if (how == COLLD_CUDA_EXPORT_IPC) {
        CUipcMemHandle h;
        memcpy(h.reserved, m->u.reg_cuda.ipc, sizeof(h.reserved));
        r = cu->cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (r == CUDA_SUCCESS) {
            /* Bounds come from what the driver mapped, not from what the client said. */
            CUdeviceptr base = 0;
            if (cu->cuMemGetAddressRange(&base, &mapped, p) != CUDA_SUCCESS || base != p)
                mapped = 0;
            if (mapped < bytes) {
                cu->cuIpcCloseMemHandle(p);
                cu->cuCtxPopCurrent(NULL);
                snprintf(detail, len, "GPU registration of %llu bytes, but the allocation behind the handle has %llu",
                         (unsigned long long)bytes, (unsigned long long)mapped);
                return COLLD_ERR_INVALID_ARGUMENT;
            }
        }
    } else {
        CUmemGenericAllocationHandle h = 0;
        r = cu->cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r == CUDA_SUCCESS) {
            /* cuMemMap refuses a size beyond the allocation: that is the bounds check. The
             * mapping holds the memory; the handle is released at once. */
            r = vmm_map(g, gi, h, bytes, &p);
            cu->cuMemRelease(h);
            mapped = bytes;
        }
    }
    cu->cuCtxPopCurrent(NULL);
    if (r != CUDA_SUCCESS) {
        snprintf(detail, len, "the daemon cannot open the GPU buffer (%s): %s",
                 how == COLLD_CUDA_EXPORT_IPC ? "CUDA IPC handle" : "VMM POSIX fd", cu_err(cu, r, buf, sizeof(buf)));
        return r == CUDA_ERROR_OUT_OF_MEMORY ? COLLD_ERR_NO_MEMORY : COLLD_ERR_INVALID_ARGUMENT;
    }
    colld_reg_t *reg = calloc(1, sizeof(*reg));
    if (!reg) {
        colld_reg_t tmp = { .cuda = true, .gpu = gi, .how = (int)how, .base = (void *)(uintptr_t)p, .size = mapped };
        tmp.daemon = d;
        colld_gpu_release_reg(&tmp);
        snprintf(detail, len, "daemon out of memory");
        return COLLD_ERR_NO_MEMORY;
    }
    reg->cuda = true;
    reg->gpu = gi;
    reg->how = (int)how;
    reg->daemon = d;
    reg->base = (void *)(uintptr_t)p;
    reg->size = bytes; /* references are checked against what the client registered (<= mapped) */
    reg->refs = 1;
    reg->users = 1;
    if (how == COLLD_CUDA_EXPORT_IPC)
        memcpy(reg->ipc, m->u.reg_cuda.ipc, sizeof(reg->ipc));
    pthread_mutex_lock(&d->lock);
    reg->id = ++s->next_reg_id;
    reg->next = s->regs;
    s->regs = reg;
    pthread_mutex_unlock(&d->lock);
    *reg_id = reg->id;
    LOG_DEBUG(GPU, "session %llu: registered %llu bytes of GPU %d memory as %u (%s)", (unsigned long long)s->id,
              (unsigned long long)bytes, gi, reg->id, how == COLLD_CUDA_EXPORT_IPC ? "IPC" : "VMM fd");
    return COLLD_OK;
}

void colld_gpu_release_reg(colld_reg_t *r)
{
    colld_daemon_t *d = r->daemon;
    if (!d || !d->gpus)
        return;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)r->base;
    CU->cuCtxPushCurrent(d->gpus->gpu[r->gpu].ctx);
    if (r->how == COLLD_CUDA_EXPORT_IPC) {
        CU->cuIpcCloseMemHandle(p);
    } else {
        CU->cuMemUnmap(p, r->size);
        CU->cuMemAddressFree(p, r->size);
    }
    CU->cuCtxPopCurrent(NULL);
}

/* ============================================================================================
 * The session's flag area
 * ========================================================================================== */

int colld_gpu_flags_dup(colld_session_t *s, uint64_t *size, uint32_t *lines, colld_status_t *st, char *detail,
                        size_t len)
{
    colld_daemon_t *d = s->daemon;
    char buf[160];
    if (!d->gpus) {
        *st = COLLD_ERR_NOT_SUPPORTED;
        snprintf(detail, len, "no GPU here: %s", d->gpu_none);
        return -1;
    }
    pthread_mutex_lock(&d->lock);
    if (!s->gpu_flags) {
        uint64_t bytes = COLLD_WIRE_GPU_FLAGS_BYTES(d->cfg.max_comms_per_session);
        int fd = memfd_create("colld-gpu-flags", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        void *p = MAP_FAILED;
        if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
            (p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
            *st = COLLD_ERR_SYSTEM;
            snprintf(detail, len, "cannot create the GPU flag area: %s", strerror(errno));
            if (fd >= 0)
                close(fd);
            pthread_mutex_unlock(&d->lock);
            return -1;
        }
        /* Portable and device-mapped: every GPU's stream can write `done` into it. */
        CUdeviceptr dp = 0;
        CU->cuCtxPushCurrent(d->gpus->gpu[0].ctx);
        CUresult r = CU->cuMemHostRegister(p, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
        if (r == CUDA_SUCCESS && (r = CU->cuMemHostGetDevicePointer(&dp, p, 0)) != CUDA_SUCCESS)
            CU->cuMemHostUnregister(p);
        CU->cuCtxPopCurrent(NULL);
        if (r != CUDA_SUCCESS) {
            *st = COLLD_ERR_DEVICE;
            snprintf(detail, len, "cannot register the GPU flag area with CUDA: %s", cu_err(CU, r, buf, sizeof(buf)));
            munmap(p, bytes);
            close(fd);
            pthread_mutex_unlock(&d->lock);
            return -1;
        }
        s->gpu_flags = p;
        s->gpu_flags_size = bytes;
        s->gpu_flags_fd = fd;
        s->gpu_flags_dptr = (uint64_t)dp;
        s->gpu_lines = (uint32_t)COLLD_WIRE_GPU_LINES(d->cfg.max_comms_per_session);
    }
    int fd = dup(s->gpu_flags_fd);
    *size = s->gpu_flags_size;
    *lines = s->gpu_lines;
    pthread_mutex_unlock(&d->lock);
    if (fd < 0) {
        *st = COLLD_ERR_SYSTEM;
        snprintf(detail, len, "dup: %s", strerror(errno));
    }
    return fd;
}

void colld_gpu_session_free(colld_session_t *s)
{
    colld_daemon_t *d = s->daemon;
    if (!s->gpu_flags)
        return;
    if (d->gpus) {
        CU->cuCtxPushCurrent(d->gpus->gpu[0].ctx);
        CU->cuMemHostUnregister(s->gpu_flags);
        CU->cuCtxPopCurrent(NULL);
    }
    munmap(s->gpu_flags, s->gpu_flags_size);
    close(s->gpu_flags_fd);
    s->gpu_flags = NULL;
}

/* ============================================================================================
 * Collectives
 * ========================================================================================== */

static colld_gpu_comm_t *gpu_comm(colld_daemon_t *d, colld_dcomm_t *c)
{
    if (c->gpu)
        return c->gpu;
    colld_gpu_comm_t *gc = calloc(1, sizeof(*gc));
    if (!gc)
        return NULL;
    gc->stream = calloc((size_t)d->gpus->n, sizeof(*gc->stream));
    gc->owe = calloc((size_t)c->nranks, sizeof(*gc->owe));
    gc->owed = calloc((size_t)c->nranks, sizeof(*gc->owed));
    if (!gc->stream || !gc->owe || !gc->owed) {
        free(gc->stream), free(gc->owe), free(gc->owed), free(gc);
        return NULL;
    }
    c->gpu = gc;
    return gc;
}

void colld_gpu_comm_free(colld_daemon_t *d, colld_dcomm_t *c)
{
    colld_gpu_comm_t *gc = c->gpu;
    if (!gc)
        return;
    /* No collective of the communicator is in flight any more (each held a reference). */
    for (int i = 0; d->gpus && i < d->gpus->n; i++)
        if (gc->stream[i]) {
            CU->cuCtxPushCurrent(d->gpus->gpu[i].ctx);
            CU->cuStreamDestroy(gc->stream[i]);
            CU->cuCtxPopCurrent(NULL);
        }
    free(gc->stream), free(gc->owe), free(gc->owed), free(gc);
    c->gpu = NULL;
}

bool colld_gpu_busy(const colld_dcomm_t *c)
{
    return c->gpu && c->gpu->busy > 0;
}

bool colld_gpu_outstanding(const colld_daemon_t *d)
{
    return d->gpus && d->gpus->outstanding > 0;
}

/* Write the releases a communicator owes, when none of its kernels runs any more (lock held). */
static void pay_releases(colld_dcomm_t *c)
{
    colld_gpu_comm_t *gc = c->gpu;
    if (!gc || gc->running)
        return;
    for (int r = 0; r < c->nranks; r++)
        if (gc->owe[r]) {
            gc->owe[r] = false;
            flag_release(c->ranks[r].session, c->ranks[r].handle, gc->owed[r], gc->owed_status);
        }
}

void colld_gpu_owe_release(colld_dcomm_t *c, int rank, uint32_t value, colld_status_t st)
{
    uint32_t v = value + COLLD_WIRE_GPU_RELEASE;
    colld_gpu_comm_t *gc = c->gpu;
    if (rank < 0 || rank >= c->nranks)
        return;
    if (!gc || !gc->running) {
        const colld_member_t *m = c->ranks ? &c->ranks[rank] : NULL;
        for (int i = 0; !m && i < colld_comm_nslots(c); i++) /* forming: the rank's joiner record */
            if (colld_comm_slot(c, i)->rank == rank)
                m = colld_comm_slot(c, i);
        if (m)
            flag_release(m->session, m->handle, v, st);
        return;
    }
    if (!gc->owe[rank] || (int32_t)(v - gc->owed[rank]) > 0)
        gc->owed[rank] = v;
    gc->owe[rank] = true;
    gc->owed_status = st;
}

/* Post a GPU collective's completions (k->status) and account for it (lock held). */
static void gpu_finish(colld_daemon_t *d, colld_coll_t *k, bool was_running)
{
    colld_dcomm_t *c = k->comm;
    d->gpus->outstanding--;
    c->gpu->busy--;
    if (was_running)
        c->gpu->running--;
    if (k->gpu_event) {
        CU->cuCtxSetCurrent(d->gpus->gpu[k->gpu_lead].ctx);
        CU->cuEventDestroy((CUevent)k->gpu_event);
        k->gpu_event = NULL;
    }
    k->end_ns = colld_now_ns();
    pay_releases(c);
    /* Posts the completions; a failed op of a rank owes (or, nothing running, writes) its
     * release. May free the communicator. */
    colld_engine_finish(d, k);
}

void colld_gpu_submit(colld_daemon_t *d, colld_coll_t *k)
{
    colld_dcomm_t *c = k->comm;
    colld_gpu_comm_t *gc = d->gpus ? gpu_comm(d, c) : NULL;
    if (!gc) {
        k->status = d->gpus ? COLLD_ERR_NO_MEMORY : COLLD_ERR_NOT_SUPPORTED;
        k->start_ns = k->end_ns = colld_now_ns();
        colld_engine_finish(d, k);
        return;
    }
    gc->busy++;
    d->gpus->outstanding++;
    k->gpu_event = NULL;
    k->next = NULL;
    if (d->gpus->pending_tail)
        d->gpus->pending_tail->next = k;
    else
        d->gpus->pending = k;
    d->gpus->pending_tail = k;
}

/* Take k (after prev, NULL when k is first) off the pending list (lock held). */
static void pending_unlink(colld_gpus_t *g, colld_coll_t *prev, colld_coll_t *k)
{
    if (prev)
        prev->next = k->next;
    else
        g->pending = k->next;
    if (g->pending_tail == k)
        g->pending_tail = prev;
    k->next = NULL;
}

/* Has every rank's stream reached this collective? (lock held) */
static bool all_ready(const colld_coll_t *k, int *missing, int nmissing_max, int *nmissing)
{
    *nmissing = 0;
    for (int r = 0; r < k->comm->nranks; r++) {
        const colld_op_t *op = k->ops[r];
        const colld_session_t *s = op->session;
        uint32_t h = op->d.comm, want = op->d.reserved + (uint32_t)op->d.seq;
        uint32_t ready = s->gpu_flags && h < s->gpu_lines ? __atomic_load_n(&s->gpu_flags[h].ready, __ATOMIC_ACQUIRE)
                                                          : want - 1;
        if ((int32_t)(ready - want) < 0) {
            if (*nmissing < nmissing_max)
                missing[*nmissing] = r;
            (*nmissing)++;
        }
    }
    return *nmissing == 0;
}

int colld_gpu_progress(colld_daemon_t *d, uint64_t now, uint64_t *deadline, colld_coll_t **launch,
                       colld_reply_t **replies)
{
    colld_gpus_t *g = d->gpus;
    if (!g || !g->outstanding)
        return 0;
    int work = 0;
    char buf[160];
    /* Launched: has the event fired? */
    for (colld_coll_t **pp = &g->running; *pp;) {
        colld_coll_t *k = *pp;
        /* Completions go out in sequence order per communicator: an earlier one still runs. */
        bool earlier = false;
        for (colld_coll_t *e = g->running; e != k; e = e->next)
            earlier |= e->comm == k->comm;
        g->cu->cuCtxSetCurrent(g->gpu[k->gpu_lead].ctx);
        CUresult r = earlier ? CUDA_ERROR_NOT_READY : g->cu->cuEventQuery((CUevent)k->gpu_event);
        if (r == CUDA_ERROR_NOT_READY) {
            pp = &k->next;
            continue;
        }
        *pp = k->next;
        k->next = NULL;
        work++;
        if (r != CUDA_SUCCESS) {
            k->status = COLLD_ERR_DEVICE;
            char why[COLLD_DETAIL_LEN];
            snprintf(why, sizeof(why), "collective #%llu failed on the GPU: %s",
                     (unsigned long long)colld_coll_lead(k)->d.seq, cu_err(g->cu, r, buf, sizeof(buf)));
            colld_comm_break(d, k->comm, COLLD_ERR_DEVICE, -1, why, replies);
        }
        gpu_finish(d, k, true);
    }
    /* Matched: launch those whose ranks' streams all got there, in order per communicator
     * (appended to *launch in that order). */
    colld_coll_t **launch_tail = launch;
    while (*launch_tail)
        launch_tail = &(*launch_tail)->next;
    colld_coll_t *prev = NULL;
    for (colld_coll_t *k = g->pending; k;) {
        colld_coll_t *next = k->next;
        colld_dcomm_t *c = k->comm;
        int missing[8], nmissing;
        bool earlier = false; /* an earlier collective of the same communicator still waits */
        for (colld_coll_t *e = g->pending; e != k; e = e->next)
            earlier |= e->comm == c;
        if (!earlier && all_ready(k, missing, 8, &nmissing)) {
            pending_unlink(g, prev, k);
            *launch_tail = k;
            launch_tail = &k->next;
            work++;
            k = next;
            continue;
        }
        if (!earlier) {
            uint64_t first = UINT64_MAX;
            for (int r = 0; r < c->nranks; r++)
                first = COLLD_MIN(first, k->ops[r]->arrival_ns);
            uint64_t due = first + (uint64_t)c->timeout_ms * 1000000ull;
            if (now >= due) {
                char why[COLLD_DETAIL_LEN];
                int off = snprintf(why, sizeof(why), "collective #%llu timed out after %d ms: the GPU stream of rank(s)",
                                   (unsigned long long)colld_coll_lead(k)->d.seq, c->timeout_ms);
                for (int i = 0; i < nmissing && i < 8 && off < (int)sizeof(why) - 16; i++)
                    off += snprintf(why + off, sizeof(why) - (size_t)off, " %d", missing[i]);
                snprintf(why + off, sizeof(why) - (size_t)off, "%s never reached it (its inputs were never ready)",
                         nmissing > 8 ? " ..." : "");
                colld_comm_break(d, c, COLLD_ERR_TIMEOUT, nmissing == 1 ? missing[0] : -1, why, replies);
                return work + 1; /* the break took k (and maybe others) off the list */
            }
            if (due < *deadline)
                *deadline = due;
        }
        prev = k;
        k = next;
    }
    /* Poll again soon while GPU work is outstanding. */
    uint64_t soon = now + 1000000ull;
    if (g->outstanding && soon < *deadline)
        *deadline = soon;
    return work;
}

/* The communicator's stream on GPU gi (engine thread). */
static CUstream comm_stream(colld_daemon_t *d, colld_dcomm_t *c, int gi, CUresult *r)
{
    colld_gpu_comm_t *gc = c->gpu;
    *r = CUDA_SUCCESS;
    if (!gc->stream[gi])
        *r = CU->cuStreamCreate(&gc->stream[gi], CU_STREAM_NON_BLOCKING);
    return gc->stream[gi];
}

/* Launch one collective (engine thread, lock not held; the ops and registrations stay put).
 * Returns COLLD_OK or an error with a detail. */
static colld_status_t launch_one(colld_daemon_t *d, colld_coll_t *k, char *why, size_t len)
{
    colld_gpus_t *g = d->gpus;
    const colld_cu_t *cu = g->cu;
    colld_dcomm_t *c = k->comm;
    int n = c->nranks;
    const colld_wire_sqe_t *a = &colld_coll_lead(k)->d;
    size_t es = colld_dtype_size((colld_dtype_t)a->dtype);
    char buf[160];
    if (n > COLLD_CUDA_MAX_RANKS) {
        snprintf(why, len, "GPU collectives support at most %d ranks per node", COLLD_CUDA_MAX_RANKS);
        return COLLD_ERR_NOT_SUPPORTED;
    }
    /* The GPUs involved: where each rank's buffers live. */
    int gpu_of[COLLD_CUDA_MAX_RANKS];
    bool used[64] = { false };
    int lead = -1, nused = 0;
    for (int r = 0; r < n; r++) {
        const colld_op_t *op = k->ops[r];
        const colld_reg_t *reg = op->recv_reg ? op->recv_reg : op->send_reg;
        gpu_of[r] = reg ? reg->gpu : -1;
        for (int j = 0; j < 2; j++) {
            const colld_reg_t *x = j ? op->recv_reg : op->send_reg;
            if (x && x->gpu < 64 && !used[x->gpu]) {
                used[x->gpu] = true;
                nused++;
                if (lead < 0)
                    lead = x->gpu;
            }
        }
    }
    if (lead < 0) { /* count 0: nothing to move, only the flags (on GPU 0) */
        lead = 0;
        used[lead] = true;
        nused = 1;
    }
    k->gpu_lead = lead;
    for (int i = 0; i < g->n && i < 64; i++)
        for (int j = 0; j < g->n && j < 64; j++)
            if (used[i] && used[j] && !g->peer[i * g->n + j]) {
                snprintf(why, len, "the ranks' buffers are on GPUs %d and %d, which cannot access each other's memory (no peer access)",
                         i, j);
                return COLLD_ERR_NOT_SUPPORTED;
            }
    CUresult cr = CUDA_SUCCESS;
    colld_status_t st = COLLD_OK;
    CUstream stream[64] = { 0 };
    for (int i = 0; i < g->n && i < 64; i++)
        if (used[i]) {
            cu->cuCtxSetCurrent(g->gpu[i].ctx);
            stream[i] = comm_stream(d, c, i, &cr);
            if (cr != CUDA_SUCCESS)
                goto cuda_failed;
        }
    const void *in[COLLD_CUDA_MAX_RANKS];
    void *out[COLLD_CUDA_MAX_RANKS];
    uint64_t count = a->count;
    switch (a->kind) {
    case COLLD_KIND_ALLREDUCE:
    case COLLD_KIND_REDUCE:
    case COLLD_KIND_BROADCAST: {
        /* One kernel per GPU over its slice of the elements (16-byte aligned slices). */
        uint64_t per = (count + (uint64_t)nused - 1) / (uint64_t)nused;
        uint64_t align = es < 16 ? 16 / es : 1;
        per = (per + align - 1) / align * align;
        uint64_t lo = 0;
        for (int i = 0; i < g->n && i < 64 && st == COLLD_OK; i++) {
            if (!used[i] || lo >= count)
                continue;
            uint64_t hi = COLLD_MIN(count, lo + per);
            size_t off = (size_t)lo * es;
            cu->cuCtxSetCurrent(g->gpu[i].ctx);
            int nout = 0;
            for (int r = 0; r < n; r++) {
                in[r] = (const char *)k->ops[r]->send_ptr + off;
                if (a->kind != COLLD_KIND_REDUCE || r == a->root)
                    out[nout++] = (char *)k->ops[r]->recv_ptr + off;
            }
            if (a->kind == COLLD_KIND_BROADCAST)
                st = colld_cuda_copy((const char *)k->ops[a->root]->send_ptr + off, out, nout, (size_t)(hi - lo) * es,
                                     stream[i]);
            else
                st = colld_cuda_reduce((colld_dtype_t)a->dtype, (colld_redop_t)a->redop, in, n, out, nout,
                                       (size_t)(hi - lo), stream[i]);
            lo = hi;
        }
        break;
    }
    case COLLD_KIND_REDUCESCATTER:
    case COLLD_KIND_ALLGATHER:
        /* One kernel per rank's piece, on the GPU that holds the piece's destination (reduce-
         * scatter) or source (all-gather). */
        for (int p = 0; p < n && st == COLLD_OK; p++) {
            int gi = gpu_of[p] >= 0 ? gpu_of[p] : lead;
            size_t off = (size_t)p * (size_t)count * es;
            cu->cuCtxSetCurrent(g->gpu[gi].ctx);
            if (a->kind == COLLD_KIND_REDUCESCATTER) {
                for (int r = 0; r < n; r++)
                    in[r] = (const char *)k->ops[r]->send_ptr + off;
                out[0] = k->ops[p]->recv_ptr;
                st = colld_cuda_reduce((colld_dtype_t)a->dtype, (colld_redop_t)a->redop, in, n, out, 1, (size_t)count,
                                       stream[gi]);
            } else {
                for (int r = 0; r < n; r++)
                    out[r] = (char *)k->ops[r]->recv_ptr + off;
                st = colld_cuda_copy(k->ops[p]->send_ptr, out, n, (size_t)count * es, stream[gi]);
            }
        }
        break;
    default:
        st = COLLD_ERR_INVALID_ARGUMENT;
    }
    if (st != COLLD_OK) {
        snprintf(why, len, "collective #%llu: the GPU kernel could not be launched: %s", (unsigned long long)a->seq,
                 colld_cuda_last_error());
        return st;
    }
    /* The lead GPU's stream waits for the others, writes every rank's done flag, and records
     * the event the engine polls. */
    cu->cuCtxSetCurrent(g->gpu[lead].ctx);
    for (int i = 0; i < g->n && i < 64; i++) {
        if (!used[i] || i == lead)
            continue;
        CUevent e;
        cu->cuCtxSetCurrent(g->gpu[i].ctx);
        if ((cr = cu->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
            goto cuda_failed;
        cr = cu->cuEventRecord(e, stream[i]);
        cu->cuCtxSetCurrent(g->gpu[lead].ctx);
        if (cr == CUDA_SUCCESS)
            cr = cu->cuStreamWaitEvent(stream[lead], e, 0);
        cu->cuEventDestroy(e); /* released once it has fired */
        if (cr != CUDA_SUCCESS)
            goto cuda_failed;
    }
    for (int r = 0; r < n; r++) {
        const colld_op_t *op = k->ops[r];
        CUdeviceptr f = (CUdeviceptr)(op->session->gpu_flags_dptr + (uint64_t)op->d.comm * sizeof(colld_wire_gpu_flag_t) +
                                      offsetof(colld_wire_gpu_flag_t, done));
        cuuint32_t value = op->d.reserved + (uint32_t)op->d.seq;
        if ((cr = cu->cuStreamWriteValue32(stream[lead], f, value, CU_STREAM_WRITE_VALUE_DEFAULT)) != CUDA_SUCCESS)
            goto cuda_failed;
    }
    CUevent done;
    if ((cr = cu->cuEventCreate(&done, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
        goto cuda_failed;
    if ((cr = cu->cuEventRecord(done, stream[lead])) != CUDA_SUCCESS) {
        cu->cuEventDestroy(done);
        goto cuda_failed;
    }
    k->gpu_event = done;
    return COLLD_OK;

cuda_failed:
    snprintf(why, len, "collective #%llu: CUDA refused the launch: %s", (unsigned long long)a->seq,
             cu_err(cu, cr, buf, sizeof(buf)));
    return COLLD_ERR_DEVICE;
}

void colld_gpu_launch(colld_daemon_t *d, colld_coll_t *list)
{
    for (colld_coll_t *k = list; k; k = k->next) {
        k->start_ns = colld_now_ns();
        k->gpu_why[0] = '\0';
        k->status = launch_one(d, k, k->gpu_why, sizeof(k->gpu_why));
    }
    d->gpus->cu->cuCtxSetCurrent(NULL);
}

void colld_gpu_launched(colld_daemon_t *d, colld_coll_t *list, colld_reply_t **replies)
{
    while (list) {
        colld_coll_t *k = list;
        list = k->next;
        k->next = NULL;
        if (k->status == COLLD_OK) {
            k->comm->gpu->running++;
            colld_coll_t **tail = &d->gpus->running; /* FIFO: launch order */
            while (*tail)
                tail = &(*tail)->next;
            *tail = k;
            continue;
        }
        /* Nothing of it runs: fail it, and the communicator with it (the ranks' later
         * collectives depend on this one). */
        LOG_WARN(GPU, "communicator %llu: %s", (unsigned long long)k->comm->id, k->gpu_why);
        colld_status_t st = k->status;
        colld_comm_break(d, k->comm, st, -1, k->gpu_why, replies);
        gpu_finish(d, k, false);
    }
}

void colld_gpu_comm_broken(colld_daemon_t *d, colld_dcomm_t *c)
{
    colld_gpus_t *g = d->gpus;
    c->refs++; /* the collectives failed below may hold the last references */
    if (g) {
        /* Matched but not launched: fail them now. */
        colld_coll_t *prev = NULL;
        for (colld_coll_t *k = g->pending; k;) {
            colld_coll_t *next = k->next;
            if (k->comm != c) {
                prev = k;
                k = next;
                continue;
            }
            pending_unlink(g, prev, k);
            k->status = c->error;
            k->start_ns = 0;
            gpu_finish(d, k, false);
            k = next;
        }
    }
    /* Every rank's stream is released past what it posted (deferred while a kernel runs). */
    for (int r = 0; r < c->nranks; r++) {
        colld_member_t *m = &c->ranks[r];
        if (m->session && m->session->gpu_flags && m->gpu_base_set)
            colld_gpu_owe_release(c, r, m->gpu_last, c->error);
    }
    colld_comm_unref(d, c);
}

#endif /* COLLD_HAVE_CUDA */
