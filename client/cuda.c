/*
 * cuda.c - libcolld's half of the CUDA backend: GPU buffers and stream-ordered collectives.
 *
 * The CUDA driver is loaded at run time (common/cudadrv): libcolld links neither libcuda nor
 * libcudart, and a program that never hands it a GPU buffer or a stream never loads the driver.
 *
 * GPU memory. A device pointer is resolved to the allocation(s) that hold it, registered with the
 * daemon once per client and cached (cuda_reg.c: the cache, buffers across several VMM allocations,
 * freed allocations dropped); colld_mem_register pins a registration until colld_mem_deregister.
 *
 * Stream ordering (the protocol is in proto/wire.h). The session has one GPU flag area, mapped
 * here and registered with CUDA (device-mapped, portable; registered again when the context it
 * was registered in is reset or destroyed: flags_check); line h belongs to communicator handle
 * h. A line outlives the communicators that use its handle one after another, so a communicator
 * takes a flag base (the line's `done` + 1) and a generation (a count of the line's
 * communicators) at its first stream-ordered collective, and operation seq (its operation id,
 * proto/wire.h: collectives, sends and receives alike) has the flag value v = base + (uint32_t)seq;
 * the base goes to the daemon in every such descriptor. A stream-ordered
 * collective enqueues on the application's stream
 *   cuStreamWriteValue32(ready[seq % SLOTS] = v)  after the work before it: inputs are ready
 *   cuStreamWaitValue32(done >= v)                 the daemon's stream writes done after its kernels
 * and then posts its descriptor (COLLD_SQE_STREAM) like any collective. Each collective has its
 * own ready slot (issue 15 E1: every call may use another stream). A slot is written again only
 * when the write before it in that slot has landed and, if this communicator made it, the daemon
 * has taken it (it writes ~v when it launches): slot_wait, the only place the host call waits
 * for the GPU, when SLOTS collectives of the communicator are posted and not yet launched. The
 * client remembers the last write of every slot of every line (gpu_slot_t), also across the
 * communicators of a line, so that a broken communicator's write still queued on some stream
 * never lands on top of a newer communicator's (issue 15 E2). If the descriptor cannot be posted
 * after the stream operations were enqueued, or the daemon goes away, the line is released from
 * here (status, then done = v + 2^30) so that no application stream waits forever.
 *
 * Contexts: calls run in the stream's context (pushed when another one is current). A thread with
 * no current context gets the primary context of the buffers' device (device 0 for
 * colld_mem_alloc), retained and made current as the CUDA runtime would do; these retains are
 * released at disconnect.
 *
 * Locking: gpu->mu guards the registrations, the retained contexts and the setting up of the flag
 * area; it is held across the socket exchanges of a registration. The flag area is published
 * once complete (atomic pointer) so that the monitor thread can release its lines without a lock.
 */
#include "client/client_internal.h"

#include "common/config.h"
#include "common/cudadrv.h"
#include "common/log.h"
#include "common/util.h"

#include <link.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define NO_CUDA_BUILD "this build of libcolld has no CUDA support (built without the CUDA toolkit)"

#ifndef COLLD_HAVE_CUDA

/* ============================================================================================
 * A build without the CUDA toolkit: GPU buffers and streams are refused with the reason.
 * ========================================================================================== */

struct colld_gpu {
    char unused;
};

colld_status_t colld__gpu_client_init(colld_client_t *c)
{
    c->gpu = calloc(1, sizeof(*c->gpu));
    return c->gpu ? COLLD_OK : COLLD_ERR_NO_MEMORY;
}

void colld__gpu_client_free(colld_client_t *c)
{
    free(c->gpu);
    c->gpu = NULL;
}

void colld__gpu_comm_destroyed(colld_client_t *c)
{
    (void)c;
}

void colld__gpu_daemon_lost(colld_client_t *c)
{
    (void)c;
}

/* Without CUDA headers device pointers cannot be recognised: every pointer is host memory. */
bool colld__gpu_maybe_device(colld_client_t *c)
{
    (void)c;
    return false;
}

bool colld__gpu_is_device(colld_client_t *c, const void *p)
{
    (void)c, (void)p;
    return false;
}

colld_status_t colld__gpu_prepare(colld_comm_t *comm, void *stream, bool in_group, const void *send, size_t send_bytes,
                                  const void *recv, size_t recv_bytes, colld_wire_sqe_t *sqe, colld_gpu_op_t *op,
                                  colld_err_t *err)
{
    (void)comm, (void)stream, (void)in_group, (void)send, (void)send_bytes, (void)recv, (void)recv_bytes, (void)sqe,
        (void)op;
    return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "stream-ordered (GPU) collectives: %s", NO_CUDA_BUILD);
}

colld_status_t colld__gpu_post(colld_comm_t *comm, const colld_wire_sqe_t *sqe, const colld_gpu_op_t *op,
                               colld_err_t *err)
{
    (void)comm, (void)sqe, (void)op;
    return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "stream-ordered (GPU) collectives: %s", NO_CUDA_BUILD);
}

colld_status_t colld__gpu_post_batch(colld_comm_t *comm, const colld_wire_sqe_t *sqes, const colld_gpu_op_t *ops,
                                     size_t n, colld_err_t *err)
{
    (void)comm, (void)sqes, (void)ops, (void)n;
    return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "stream-ordered (GPU) collectives: %s", NO_CUDA_BUILD);
}

const uint32_t *colld__gpu_ready_word(colld_comm_t *comm, uint64_t id)
{
    (void)comm, (void)id;
    return NULL;
}

colld_status_t colld__gpu_mem_alloc(colld_client_t *c, void **ptr, size_t bytes, colld_err_t *err)
{
    (void)c, (void)ptr, (void)bytes;
    return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "COLLD_MEM_CUDA: %s", NO_CUDA_BUILD);
}

colld_status_t colld__gpu_mem_free(colld_client_t *c, void *ptr, colld_err_t *err)
{
    (void)c;
    return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "%p is not memory from colld_mem_alloc", ptr);
}

colld_status_t colld__gpu_mem_register(colld_client_t *c, const void *buf, size_t bytes, uint32_t *reg_id,
                                       colld_err_t *err)
{
    (void)c, (void)buf, (void)bytes, (void)reg_id;
    return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "GPU memory: %s", NO_CUDA_BUILD);
}

colld_status_t colld__gpu_mem_deregister(colld_client_t *c, uint32_t reg_id, colld_err_t *err)
{
    (void)c;
    return colld_err_set(err, COLLD_ERR_INTERNAL, "GPU registration %u: %s", reg_id, NO_CUDA_BUILD);
}

#else /* COLLD_HAVE_CUDA */

#include "client/cuda_internal.h"

/* ============================================================================================
 * State
 * ========================================================================================== */

/* Find the process's load count (every dlopen that loads an object increments it). */
static int adds_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    *(unsigned long long *)data = info->dlpi_adds;
    return 1; /* the first object is enough: the count is the same in every entry */
}

/* Is the CUDA driver loaded in this process? colld_cu_in_process() costs a library search
 * (about 20 us when the driver is absent), so it is asked again only when an object was loaded
 * since the last time it said no. */
static bool probe_driver(gpu_probe_t *p)
{
    if (atomic_load_explicit(&p->driver_seen, memory_order_relaxed))
        return true;
    unsigned long long adds = 0;
    dl_iterate_phdr(adds_cb, &adds);
    if (adds && atomic_load_explicit(&p->adds_checked, memory_order_relaxed) == adds)
        return false;
    if (colld_cu_in_process()) {
        atomic_store(&p->driver_seen, true);
        return true;
    }
    atomic_store_explicit(&p->adds_checked, adds, memory_order_relaxed);
    return false;
}

colld_status_t colld__gpu_client_init(colld_client_t *c)
{
    colld_gpu_t *g = calloc(1, sizeof(*g));
    if (!g)
        return COLLD_ERR_NO_MEMORY;
    pthread_mutex_init(&g->mu, NULL);
    /* For measuring the host call against the call without its caches (bench/hostcall.c): not a
     * setting to run with. */
    const char *v = colld_config_env("COLLD_GPU_HOST_CACHE");
    g->no_cache = v && strcmp(v, "0") == 0;
    c->gpu = g;
    return COLLD_OK;
}

bool colld__gpu_maybe_device(colld_client_t *c)
{
    return probe_driver(&c->gpu->probe);
}

/* ============================================================================================
 * Contexts and devices
 * ========================================================================================== */

/* Make sure a context is current on this thread: the current one, else the primary context of
 * device `ordinal` (retained once per client, released at disconnect), as the CUDA runtime does
 * on first use. g->mu held. */
static colld_status_t ensure_ctx(colld_gpu_t *g, const colld_cu_t *cu, int ordinal, CUcontext *out, colld_err_t *err)
{
    CUcontext ctx = NULL;
    CUresult r = CU_CHECK(cu, cuCtxGetCurrent, &ctx);
    if (r == CUDA_SUCCESS && ctx) {
        *out = ctx;
        return COLLD_OK;
    }
    if (ordinal < 0 || ordinal >= MAX_DEVICES)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "no CUDA context is current and device %d is out of range", ordinal);
    CUdevice dev;
    if ((r = CU_CHECK(cu, cuDeviceGet, &dev, ordinal)) != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_DEVICE, r, "cuDeviceGet(%d)", ordinal);
    if ((r = CU_CHECK(cu, cuDevicePrimaryCtxRetain, &ctx, dev)) != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_DEVICE, r, "cuDevicePrimaryCtxRetain(device %d)", ordinal);
    if ((r = CU_CHECK(cu, cuCtxSetCurrent, ctx)) != CUDA_SUCCESS) {
        CU_CHECK(cu, cuDevicePrimaryCtxRelease, dev);
        return cu_say(cu, err, COLLD_ERR_DEVICE, r, "cuCtxSetCurrent(primary context of device %d)", ordinal);
    }
    if (g->primary[ordinal])
        CU_CHECK(cu, cuDevicePrimaryCtxRelease, dev); /* one retain per client is enough */
    g->primary[ordinal] = true;
    *out = ctx;
    return COLLD_OK;
}

/* A device attribute, cached per device (cache: 0 unknown, 1 false, 2 true). g->mu held. */
static bool dev_flag(const colld_cu_t *cu, int8_t *cache, CUdevice dev, CUdevice_attribute attr)
{
    if (dev >= 0 && dev < MAX_DEVICES && cache[dev])
        return cache[dev] == 2;
    int v = 0;
    if (CU_CHECK(cu, cuDeviceGetAttribute, &v, attr, dev) != CUDA_SUCCESS)
        v = 0;
    if (dev >= 0 && dev < MAX_DEVICES)
        cache[dev] = v ? 2 : 1;
    return v != 0;
}

/* ============================================================================================
 * Pointers and registrations
 * ========================================================================================== */

/* The attributes colld needs of a pointer, in one call. The driver writes each into a zeroed
 * 8-byte slot (the documented types are 4 or 8 bytes; booleans may be narrower), read back at
 * their documented type. */
static CUresult ptr_query(const colld_cu_t *cu, const void *p, ptr_info_t *pi)
{
    enum { MEMTYPE, BUFID, ORDINAL, IPC, START, SIZE, MANAGED, CTX, N };
    CUpointer_attribute attrs[N] = {
        [MEMTYPE] = CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        [BUFID] = CU_POINTER_ATTRIBUTE_BUFFER_ID,
        [ORDINAL] = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        [IPC] = CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        [START] = CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        [SIZE] = CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        [MANAGED] = CU_POINTER_ATTRIBUTE_IS_MANAGED,
        [CTX] = CU_POINTER_ATTRIBUTE_CONTEXT,
    };
    union {
        uint64_t u64;
        uint32_t u32;
        int32_t i32;
        uint8_t u8;
        void *ptr;
    } slot[N];
    void *data[N];
    memset(slot, 0, sizeof(slot));
    for (int i = 0; i < N; i++)
        data[i] = &slot[i];
    memset(pi, 0, sizeof(*pi));
    CUresult r = CU_CHECK(cu, cuPointerGetAttributes, N, attrs, data, (CUdeviceptr)(uintptr_t)p);
    if (r != CUDA_SUCCESS)
        return r;
    pi->memtype = slot[MEMTYPE].u32;
    pi->buffer_id = slot[BUFID].u64;
    pi->ordinal = slot[ORDINAL].i32;
    pi->ipc = slot[IPC].u64 != 0;
    pi->range_start = (CUdeviceptr)slot[START].u64;
    pi->range_size = (size_t)slot[SIZE].u64;
    pi->managed = slot[MANAGED].u64 != 0;
    pi->ctx = (CUcontext)slot[CTX].ptr;
    return CUDA_SUCCESS;
}

/* The buffer id of the allocation at p (0 for memory CUDA does not know): the one attribute a
 * registration-cache hit needs (issue 28 item 2). */
static CUresult ptr_buffer_id(const colld_cu_t *cu, const void *p, unsigned long long *id)
{
    CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_BUFFER_ID;
    void *data = id;
    *id = 0;
    return CU_CHECK(cu, cuPointerGetAttributes, 1, &attr, &data, (CUdeviceptr)(uintptr_t)p);
}

bool colld__gpu_is_device(colld_client_t *c, const void *p)
{
    const colld_cu_t *cu = colld_cu_load(NULL, 0);
    ptr_info_t pi;
    (void)c;
    /* A driver that cannot start (no device) has no device memory to offer either. */
    return cu && ptr_query(cu, p, &pi) == CUDA_SUCCESS && pi.memtype == CU_MEMORYTYPE_DEVICE && !pi.managed;
}

/* Check that a buffer a stream-ordered collective uses is device memory. */
static colld_status_t need_device(const ptr_info_t *pi, const void *p, const char *which, colld_err_t *err)
{
    if (pi->memtype != CU_MEMORYTYPE_DEVICE)
        return colld_err_set(
            err, COLLD_ERR_INVALID_ARGUMENT,
            "%s (%p) is host memory: a collective on a CUDA stream needs device memory for both buffers "
            "(pass stream = NULL for host buffers)",
            which, p);
    if (pi->managed)
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED,
                             "%s (%p) is CUDA managed memory, which cannot be shared with the daemon: use cudaMalloc, "
                             "cuMemCreate or colld_mem_alloc(COLLD_MEM_CUDA)",
                             which, p);
    return COLLD_OK;
}

/* ============================================================================================
 * The flag area
 * ========================================================================================== */

/* Map the session's flag area and register it with CUDA, once. g->mu held, a context current. */
static colld_status_t flags_setup(colld_client_t *c, colld_gpu_t *g, const colld_cu_t *cu, colld_err_t *err)
{
    if (atomic_load(&g->flags))
        return COLLD_OK;
    colld_wire_msg_t m, rep;
    memset(&m, 0, sizeof(m));
    memset(&rep, 0, sizeof(rep));
    m.type = COLLD_MSG_GPU_FLAGS;
    int fd = -1;
    colld_status_t st = colld__sock_request(c, &m, -1, COLLD_MSG_GPU_FLAGS_REPLY, &rep, &fd, 1);
    if (st != COLLD_OK)
        return colld_err_set(err, st, "cannot get the GPU flag area from colld: %s", colld_status_string(st));
    char detail[COLLD_WIRE_DETAIL_BYTES];
    if ((st = colld__reply_status(&rep, detail)) != COLLD_OK) {
        if (fd >= 0)
            close(fd);
        return colld_err_set(err, st, "colld has no GPU flag area for this client: %s", detail);
    }
    uint64_t size = rep.u.gpu_flags.size;
    uint32_t nlines = rep.u.gpu_flags.lines, nplans = rep.u.gpu_flags.plans;
    if (fd < 0 || nlines < 2 || size > (1ull << 30) || nplans > COLLD_WIRE_GPU_PLANS_MAX ||
        size < (uint64_t)nlines * sizeof(colld_wire_gpu_flag_t) + (uint64_t)nplans * sizeof(colld_wire_gpu_plan_t) ||
        size % 4096) {
        if (fd >= 0)
            close(fd);
        return colld_err_set(err, COLLD_ERR_PROTOCOL,
                             "colld sent a malformed GPU flag area (%llu bytes, %u lines, %u plan lines)",
                             (unsigned long long)size, nlines, nplans);
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return colld_err_set(err, COLLD_ERR_SYSTEM, "cannot map the GPU flag area: %m");
    gpu_flags_t *f = calloc(1, sizeof(*f));
    _Atomic uint64_t *posted = calloc(nlines, sizeof(*posted));
    if (!f || !posted) {
        free(f);
        free(posted);
        munmap(p, size);
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "out of memory");
    }
    CUdeviceptr dptr = 0;
    CUresult r = CU_CHECK(cu, cuMemHostRegister, p, size, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
    if (r == CUDA_SUCCESS && (r = CU_CHECK(cu, cuMemHostGetDevicePointer, &dptr, p, 0)) != CUDA_SUCCESS)
        CU_CHECK(cu, cuMemHostUnregister, p);
    if (r != CUDA_SUCCESS) {
        free(f);
        free(posted);
        munmap(p, size);
        return cu_say(cu, err, COLLD_ERR_DEVICE, r, "registering the GPU flag area with CUDA (cuMemHostRegister)");
    }
    f->lines = p;
    f->size = size;
    f->nlines = nlines;
    f->nplans = nplans;
    f->dptr = dptr;
    f->posted = posted;
    CU_CHECK(cu, cuCtxGetCurrent, &f->ctx);
    if (CU_CHECK(cu, cuCtxGetId, f->ctx, &f->ctx_id) != CUDA_SUCCESS)
        f->ctx_id = 0; /* never matched: flags_check on every call */
    atomic_store(&g->flags, f);
    LOG_DEBUG(GPU, "GPU flag area: %u lines, %llu bytes, device address 0x%llx", nlines, (unsigned long long)size,
              (unsigned long long)dptr);
    return COLLD_OK;
}

/* The flag area's CUDA registration belongs to the context it was made in (f->ctx) and dies with
 * it: a cuDevicePrimaryCtxReset after a sticky error in the application, or the context's last
 * release. A stream memory operation on the area would then fault (CUDA_ERROR_ILLEGAL_ADDRESS,
 * sticky, in the application). So before a stream-ordered collective whose stream is not of the
 * very context instance the area was registered in (f->ctx with id f->ctx_id: cuCtxGetId changes
 * when a context is reset or made again, its handle may not) the registration is looked up from
 * the stream's context (portable: seen from every context while it lives) and, when it is gone,
 * made again in that context. A stream of f->ctx with that id proves the registration alive
 * without a driver call (issue 28 item 2): the common case, one context per process. An error
 * other than "not registered" (the application's context has a sticky error itself) fails the
 * collective with COLLD_ERR_DEVICE.
 * g->mu held, the stream's context current, the area set up. */
static colld_status_t flags_check(colld_gpu_t *g, const colld_cu_t *cu, colld_err_t *err)
{
    gpu_flags_t *f = atomic_load(&g->flags);
    CUdeviceptr dptr = 0;
    CUresult r = CU_CHECK_EXPECT(cu, CUDA_ERROR_INVALID_VALUE, cuMemHostGetDevicePointer, &dptr, f->lines, 0);
    if (r == CUDA_SUCCESS) {
        f->dptr = dptr;
        return COLLD_OK;
    }
    if (r != CUDA_ERROR_INVALID_VALUE)
        return cu_say(cu, err, COLLD_ERR_DEVICE, r,
                      "the GPU flag area's CUDA registration cannot be checked in the stream's context "
                      "(cuMemHostGetDevicePointer)");
    r = CU_CHECK(cu, cuMemHostRegister, f->lines, f->size, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
    if (r == CUDA_SUCCESS && (r = CU_CHECK(cu, cuMemHostGetDevicePointer, &dptr, f->lines, 0)) != CUDA_SUCCESS)
        CU_CHECK(cu, cuMemHostUnregister, f->lines);
    if (r != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_DEVICE, r,
                      "registering the GPU flag area with CUDA again, after the context it was registered in was "
                      "reset or destroyed (cuMemHostRegister)");
    f->dptr = dptr;
    CU_CHECK(cu, cuCtxGetCurrent, &f->ctx);
    if (CU_CHECK(cu, cuCtxGetId, f->ctx, &f->ctx_id) != CUDA_SUCCESS)
        f->ctx_id = 0;
    LOG_INFO(GPU, "the GPU flag area's CUDA registration went with its context (reset or destroyed): registered "
                  "again in the stream's context, device address 0x%llx",
             (unsigned long long)dptr);
    return COLLD_OK;
}

/* Release a line from the host: its error, then `done` far enough ahead that every wait enqueued
 * up to flag value `value` (and the next 2^30) passes. Never moves `done` back. */
static void release_line(colld_wire_gpu_flag_t *l, uint32_t value, colld_status_t st)
{
    uint32_t v = value + COLLD_WIRE_GPU_RELEASE;
    __atomic_store_n(&l->status, (int32_t)st, __ATOMIC_RELAXED);
    uint32_t cur = __atomic_load_n(&l->done, __ATOMIC_RELAXED);
    if ((int32_t)(v - cur) > 0)
        __atomic_store_n(&l->done, v, __ATOMIC_RELEASE);
}

void colld__gpu_daemon_lost(colld_client_t *c)
{
    colld__graph_daemon_lost(c); /* the replays of its captured collectives too (cuda_graph.c) */
    gpu_flags_t *f = atomic_load(&c->gpu->flags);
    if (!f)
        return;
    int n = 0;
    for (uint32_t h = 1; h < f->nlines; h++) {
        uint64_t posted = atomic_load(&f->posted[h]);
        if (posted) {
            release_line(&f->lines[h], (uint32_t)posted, COLLD_ERR_DAEMON_LOST);
            n++;
        }
    }
    if (n)
        LOG_WARN(GPU, "released the GPU streams of %d communicator(s) with COLLD_ERR_DAEMON_LOST", n);
}

/* ============================================================================================
 * Stream-ordered collectives
 * ========================================================================================== */

/* One buffer of a stream-ordered collective while it is prepared. */
typedef struct {
    const void *p;
    size_t bytes;
    const char *which;
    bool hit;               /* a cached registration holds it: *out is set */
    int ordinal;            /* its device (a hit) */
    bool have_id, queried;  /* id read; pi read (every attribute) */
    unsigned long long id;  /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
    ptr_info_t pi;
} gpu_buf_t;

/* Find a buffer's cached registration with as few driver calls as the cache allows (issue 28
 * item 2): none for memory whose lifetime colld knows (colld_mem_register'ed, colld_mem_alloc'ed:
 * colld__gpu_lookup_owned); one buffer-id query for an implicit registration, which must be asked
 * every call because the application may have freed the allocation and made another at the same
 * address (the buffer id tells them apart: it is unique for the life of the process); and every
 * attribute only on a miss, for the registration. A hit sets *out at once (a miss resolved later
 * may move cache entries); its entry is marked seen by this post, so that no sweep drops it.
 * `twin`: the other buffer when both are at the same address (in place), whose answers serve
 * again. g->mu held. */
static colld_status_t buf_find(colld_gpu_t *g, const colld_cu_t *cu, gpu_buf_t *b, const gpu_buf_t *twin,
                               colld_wire_buf_t *out, colld_err_t *err)
{
    CUresult r;
    gpu_reg_t *e = NULL;
    if (!g->no_cache && (e = colld__gpu_lookup_owned(g, b->p, b->bytes)) != NULL)
        goto hit;
    if (twin && twin->have_id) {
        b->have_id = true, b->id = twin->id;
        if ((b->queried = twin->queried))
            b->pi = twin->pi;
    } else if (!g->no_cache) {
        if ((r = ptr_buffer_id(cu, b->p, &b->id)) != CUDA_SUCCESS)
            return cu_say(cu, err, COLLD_ERR_INVALID_ARGUMENT, r, "%s (%p): cuPointerGetAttributes", b->which, b->p);
        b->have_id = true;
    }
    if (!g->no_cache && b->have_id && (e = colld__gpu_lookup(g, b->p, b->bytes, b->id)) != NULL)
        goto hit;
    if (!b->queried) {
        if ((r = ptr_query(cu, b->p, &b->pi)) != CUDA_SUCCESS)
            return cu_say(cu, err, COLLD_ERR_INVALID_ARGUMENT, r, "%s (%p): cuPointerGetAttributes", b->which, b->p);
        b->queried = b->have_id = true;
        b->id = b->pi.buffer_id;
    }
    return need_device(&b->pi, b->p, b->which, err);
hit:
    e->seen = g->post_now;
    b->hit = true;
    b->ordinal = e->ordinal;
    return colld__gpu_reg_ref(e, b->p, b->bytes, b->which, out, err);
}

/* Make ctx current if `cur` (the thread's current context, known) is not it. */
static CUresult ctx_enter_from(const colld_cu_t *cu, CUcontext ctx, CUcontext cur, bool *pushed)
{
    *pushed = false;
    if (!ctx || ctx == cur)
        return CUDA_SUCCESS;
    CUresult r = CU_CHECK(cu, cuCtxPushCurrent, ctx);
    *pushed = r == CUDA_SUCCESS;
    return r;
}

/* What the host call needs of stream s (gpu_stream_t, cuda_internal.h): from the cache for a
 * stream seen before (one driver call: the stream's id, or for the legacy default stream the
 * current context's id), else from the driver (the stream's context, that context's id and
 * device, the device's CAN_FLUSH_REMOTE_WRITES), then cached. `cur`: the thread's current context
 * (not NULL). A stream being captured is not asked for its id (a query the driver may refuse on a
 * capturing stream, and refusing it may invalidate the application's capture): the long way, once
 * per capture, whose replays do not come here. g->mu held. */
static colld_status_t stream_info(colld_gpu_t *g, const colld_cu_t *cu, CUstream s, CUcontext cur, bool capturing,
                                  gpu_stream_t *out, colld_err_t *err)
{
    bool by_ctx = s == CU_STREAM_LEGACY || s == NULL;
    unsigned long long key = 0;
    CUresult r;
    if (!g->no_cache && !capturing) {
        /* An error: the long way, as for a stream the driver does not know (which cuStreamGetCtx
         * then reports). */
        r = by_ctx ? CU_CHECK(cu, cuCtxGetId, cur, &key) : CU_CHECK(cu, cuStreamGetId, s, &key);
        if (r != CUDA_SUCCESS)
            key = 0;
        for (unsigned i = 0; key && i < STREAM_CACHE; i++)
            if (g->streams[i].key == key && g->streams[i].by_ctx == by_ctx) {
                *out = g->streams[i];
                return COLLD_OK;
            }
    }
    gpu_stream_t e = { .key = key, .by_ctx = by_ctx };
    if ((r = CU_CHECK(cu, cuStreamGetCtx, s, &e.ctx)) != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_INVALID_ARGUMENT, r, "stream %p: cuStreamGetCtx (is it a live cudaStream_t?)",
                      (void *)s);
    if ((r = CU_CHECK(cu, cuCtxGetId, e.ctx, &e.ctx_id)) != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_DEVICE, r, "the context of stream %p (cuCtxGetId)", (void *)s);
    bool pushed;
    if ((r = ctx_enter_from(cu, e.ctx, cur, &pushed)) != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_DEVICE, r, "making the stream's context current");
    r = CU_CHECK(cu, cuCtxGetDevice, &e.dev);
    ctx_leave(cu, pushed);
    if (r != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_DEVICE, r, "the device of stream %p", (void *)s);
    /* Stream memory operations: the entry points are the V2 ones (CUDA 12.0 ABI, see
     * common/cudadrv.h), which the driver offers by default on every platform. The
     * CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 attribute only says whether the deprecated V1
     * API was enabled (NVreg_EnableStreamMemOPs=1, off by default), so it is not a gate here; a
     * device without them makes the calls fail with CUDA_ERROR_NOT_SUPPORTED, which
     * colld__gpu_post reports as COLLD_ERR_NOT_SUPPORTED. (The CUDA IPC event fallback for such
     * devices is not built yet.) */
    e.flush = dev_flag(cu, g->flush, e.dev, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES);
    if (key) {
        g->streams[g->stream_next] = e;
        g->stream_next = (g->stream_next + 1) % STREAM_CACHE;
    }
    *out = e;
    return COLLD_OK;
}

/* colld__gpu_prepare with g->mu held; `cur`: the thread's current context (NULL: none). */
static colld_status_t prepare_locked(colld_comm_t *comm, const colld_cu_t *cu, void *stream, CUcontext cur,
                                     bool capturing, const void *send, size_t send_bytes, const void *recv,
                                     size_t recv_bytes, colld_wire_sqe_t *sqe, colld_gpu_op_t *op, colld_err_t *err)
{
    colld_client_t *c = comm->client;
    colld_gpu_t *g = c->gpu;
    colld_status_t st;
    CUresult r;
    /* (a) Both buffers: device memory, their cached registrations when they have one. */
    gpu_buf_t bs = { .p = send, .bytes = send_bytes, .which = "sendbuf" };
    gpu_buf_t br = { .p = recv, .bytes = recv_bytes, .which = "recvbuf" };
    if ((send_bytes && (st = buf_find(g, cu, &bs, NULL, &sqe->send, err)) != COLLD_OK) ||
        (recv_bytes && (st = buf_find(g, cu, &br, send_bytes && recv == send ? &bs : NULL, &sqe->recv, err)) !=
                           COLLD_OK))
        return st;
    /* (b) The context: the current one, else the buffers' device's primary context; the stream's. */
    const gpu_buf_t *first = send_bytes ? &bs : recv_bytes ? &br : NULL;
    if (!cur && (st = ensure_ctx(g, cu, !first ? 0 : first->hit ? first->ordinal : first->pi.ordinal, &cur, err)) !=
                    COLLD_OK)
        return st;
    CUstream s = stream ? (CUstream)stream : CU_STREAM_LEGACY;
    gpu_stream_t si = { 0 };
    if ((st = stream_info(g, cu, s, cur, capturing, &si, err)) != COLLD_OK)
        return st;
    /* (c) In the stream's context, only when something needs it: a registration to make, the
     * flag area to set up or to check (flags_check). */
    gpu_flags_t *f = atomic_load(&g->flags);
    bool check = !f || g->no_cache || f->ctx != si.ctx || f->ctx_id != si.ctx_id;
    bool pushed = false;
    if (check || (send_bytes && !bs.hit) || (recv_bytes && !br.hit)) {
        if ((r = ctx_enter_from(cu, si.ctx, cur, &pushed)) != CUDA_SUCCESS)
            return cu_say(cu, err, COLLD_ERR_DEVICE, r, "making the stream's context current");
        if ((send_bytes && !bs.hit &&
             (st = colld__gpu_resolve(c, g, cu, send, send_bytes, &bs.pi, "sendbuf", &sqe->send, NULL, err))) ||
            (recv_bytes && !br.hit &&
             (st = colld__gpu_resolve(c, g, cu, recv, recv_bytes, &br.pi, "recvbuf", &sqe->recv, NULL, err))))
            goto out;
        if (check && ((st = flags_setup(c, g, cu, err)) != COLLD_OK || (st = flags_check(g, cu, err)) != COLLD_OK))
            goto out;
        ctx_leave(cu, pushed);
        pushed = false;
    }
    f = atomic_load(&g->flags);
    uint32_t h = comm->handle;
    if (h == 0 || h >= f->nlines) {
        st = colld_err_set(err, COLLD_ERR_PROTOCOL, "communicator handle %u has no GPU flag line (colld gave %u lines)",
                           h, f->nlines);
        goto out;
    }
    if (!g->slots) {
        g->slots = calloc((size_t)f->nlines * COLLD_WIRE_GPU_READY_SLOTS, sizeof(*g->slots));
        g->gens = calloc(f->nlines, sizeof(*g->gens));
        if (!g->slots || !g->gens) {
            free(g->slots), free(g->gens);
            g->slots = NULL, g->gens = NULL;
            st = colld_err_set(err, COLLD_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
        g->slot_lines = f->nlines;
    }
    if (h >= g->slot_lines) {
        st = colld_err_set(err, COLLD_ERR_PROTOCOL, "communicator handle %u has no GPU flag line", h);
        goto out;
    }
    /* The first stream-ordered collective of the communicator takes its flag base: values above
     * everything an earlier communicator on this line left, whose waits then stay satisfied; and
     * its generation, which tells its slot writes from an earlier communicator's. */
    if (!comm->gpu_used) {
        comm->gpu_base = __atomic_load_n(&f->lines[h].done, __ATOMIC_ACQUIRE) + 1;
        if (++g->gens[h] == 0)
            g->gens[h] = 1; /* 0: a slot never written */
        comm->gpu_gen = g->gens[h];
        comm->gpu_used = true;
    }
    op->base = comm->gpu_base;
    op->stream = s;
    op->ctx = si.ctx;
    op->cur = g->no_cache ? NULL : cur;
    op->ready = f->dptr + (uint64_t)h * sizeof(colld_wire_gpu_flag_t) + offsetof(colld_wire_gpu_flag_t, ready);
    op->done = f->dptr + (uint64_t)h * sizeof(colld_wire_gpu_flag_t) + offsetof(colld_wire_gpu_flag_t, done);
    op->wait_flags = (unsigned)CU_STREAM_WAIT_VALUE_GEQ | (si.flush ? (unsigned)CU_STREAM_WAIT_VALUE_FLUSH : 0u);
    st = COLLD_OK;
out:
    ctx_leave(cu, pushed);
    return st;
}

/* How often a post may check cached registrations for a free (colld__gpu_sweep_freed): the
 * check costs a driver call per entry, and the host call's budget is a handful (issue 28 item 2).
 * The buffers a post uses are checked by that post anyway (their buffer id); the sweep is only
 * for the mappings of buffers no longer used, which a new registration and a communicator's
 * destruction sweep in full. */
#define SWEEP_INTERVAL_NS 10000000ull /* 10 ms */

/* The per-post part of the rule for implicit registrations (issue 15 C1/D4). g->mu held. */
static void sweep_post(colld_client_t *c, colld_gpu_t *g, const colld_cu_t *cu)
{
    if (!g->no_cache) {
        uint64_t now = colld_now_ns();
        if (now - g->swept_ns < SWEEP_INTERVAL_NS)
            return;
        g->swept_ns = now;
    }
    colld__gpu_sweep_freed(c, g, cu, SWEEP_PER_POST);
}

/* Whether the stream is being captured into a CUDA graph (issue 15 item 3), and into which graph.
 * A collective on a capturing stream is captured (cuda_graph.c): its preparation registers what it
 * needs outside the capture (pointer queries, IPC and VMM export and the socket exchanges with the
 * daemon are no stream work), and the flag area, when it is not set up yet, is registered with
 * CUDA (cuMemHostRegister, which a capture in the default GLOBAL mode prohibits) with this thread
 * in the RELAXED capture interaction mode (cuThreadExchangeStreamCaptureMode, as NCCL does for its
 * host allocations during a capture), so that the application's capture stays valid. Refused:
 * the legacy default stream while another stream of the process is captured (as the driver
 * refuses it), a capture already invalidated, and a capture inside a group (in_group). *graph is
 * set while capturing. */
static colld_status_t capture_state(const colld_cu_t *cu, void *stream, CUcontext cur, bool in_group, bool *capturing,
                                    CUgraph *graph, colld_err_t *err)
{
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    *capturing = false;
    *graph = NULL;
    /* The legacy default stream (NULL) is the current context's: a thread with none (a worker
     * thread of the application, torch_colld's) is not capturing it. It gets the primary context
     * of the buffers' device below (ensure_ctx); a capture elsewhere in that context then refuses
     * the enqueue on the legacy stream, as the driver does. */
    if ((!stream || stream == CU_STREAM_LEGACY) && !cur)
        return COLLD_OK;
    CUresult r = CU_CHECK_EXPECT(cu, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cuStreamIsCapturing, (CUstream)stream, &cs);
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
        return cu_say(cu, err, COLLD_ERR_NOT_SUPPORTED, r,
                      "stream %p: the legacy default stream cannot be used while another stream of this process is "
                      "being captured into a CUDA graph",
                      stream);
    if (r != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_INVALID_ARGUMENT, r, "stream %p: cuStreamIsCapturing", stream);
    if (cs == CU_STREAM_CAPTURE_STATUS_NONE)
        return COLLD_OK;
    if (cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        return colld_err_set(err, COLLD_ERR_INVALID_USAGE,
                             "stream %p is in a CUDA graph capture that an earlier call invalidated: the collective "
                             "cannot be captured (nothing was enqueued)",
                             stream);
    if (in_group)
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED,
                             "stream %p is being captured into a CUDA graph: capturing a collective inside "
                             "colld_group_start/colld_group_end is not supported yet (nothing was enqueued); capture "
                             "it outside the group",
                             stream);
    if ((r = CU_CHECK(cu, cuStreamGetCaptureInfo, (CUstream)stream, &cs, &id, graph, NULL, NULL)) != CUDA_SUCCESS ||
        !*graph)
        return cu_say(cu, err, COLLD_ERR_DEVICE, r, "stream %p: cuStreamGetCaptureInfo (the graph being captured)",
                      stream);
    *capturing = true;
    return COLLD_OK;
}

colld_status_t colld__gpu_prepare(colld_comm_t *comm, void *stream, bool in_group, const void *send, size_t send_bytes,
                                  const void *recv, size_t recv_bytes, colld_wire_sqe_t *sqe, colld_gpu_op_t *op,
                                  colld_err_t *err)
{
    char load_err[256];
    /* The stream is not looked at before the driver is known to be there. */
    const colld_cu_t *cu = colld_cu_load(load_err, sizeof(load_err));
    if (!cu)
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "stream-ordered (GPU) collectives need the CUDA driver: %s",
                             load_err);
    if ((send_bytes && !send) || (recv_bytes && !recv))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "%s is NULL",
                             send_bytes && !send ? "sendbuf" : "recvbuf");
    bool capturing;
    CUgraph graph;
    CUcontext cur = NULL; /* the thread's current context: asked once per call */
    if (CU_CHECK(cu, cuCtxGetCurrent, &cur) != CUDA_SUCCESS)
        cur = NULL;
    colld_status_t st = capture_state(cu, stream, cur, in_group, &capturing, &graph, err);
    if (st != COLLD_OK)
        return st;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (capturing && CU_CHECK(cu, cuThreadExchangeStreamCaptureMode, &mode) != CUDA_SUCCESS)
        return colld_err_set(err, COLLD_ERR_DEVICE, "cuThreadExchangeStreamCaptureMode failed during a capture");
    colld_gpu_t *g = comm->client->gpu;
    pthread_mutex_lock(&g->mu);
    g->cu = cu;
    g->post_now = ++g->posts;
    st = prepare_locked(comm, cu, stream, cur, capturing, send, send_bytes, recv, recv_bytes, sqe, op, err);
    if (st == COLLD_OK)
        sweep_post(comm->client, g, cu);
    g->post_now = 0;
    pthread_mutex_unlock(&g->mu);
    if (capturing)
        CU_CHECK(cu, cuThreadExchangeStreamCaptureMode, &mode); /* the application's mode again */
    op->capture = capturing;
    op->graph = graph;
    return st;
}

/* Wait until operation `id` of comm (`what`, for a message) may write its ready slot (proto/wire.h): the
 * write before it in the slot (rec) has landed and, when this communicator made it, the daemon has
 * taken it. A slot
 * of an earlier communicator on the line needs only to have landed (issue 15 E2: its write must
 * not land on top of this one's). Nothing is enqueued yet, so giving up costs nothing: the
 * communicator's error when it broke meanwhile, COLLD_ERR_DAEMON_LOST, or COLLD_ERR_TIMEOUT after
 * the communicator's timeout (the daemon times out a collective of its own long before; an
 * earlier communicator's stream may never get there). Polls (busy while a CPU is free, briefly),
 * then with a growing sleep, up to 1 ms. */
static colld_status_t slot_wait(colld_comm_t *comm, const uint32_t *word, const gpu_slot_t *rec, const char *what,
                                uint64_t id, colld_err_t *err)
{
    colld_client_t *c = comm->client;
    bool mine = rec->gen == comm->gpu_gen;
    uint64_t deadline = 0;
    long nap_ns = 1000;
    for (unsigned spins = 0; rec->gen; spins++) {
        uint32_t cur = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        bool taken = cur == ~rec->value;
        if (taken || (!mine && cur == rec->value))
            return COLLD_OK;
        colld__client_poll(c); /* a break of the communicator arrives as a completion */
        colld_status_t e = __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED);
        if (e == COLLD_OK && atomic_load(&c->lost))
            e = COLLD_ERR_DAEMON_LOST;
        if (e != COLLD_OK)
            return colld_err_set(err, e, "stream-ordered %s not posted: the communicator failed (%s)", what,
                                 colld_status_name(e));
        uint64_t now = colld_now_ns();
        int limit_ms = comm->timeout_ms > 0 ? comm->timeout_ms : 300000;
        if (!deadline)
            deadline = now + ((uint64_t)limit_ms + 1000) * 1000000ull;
        if (now >= deadline) {
            if (mine)
                return colld_err_set(err, COLLD_ERR_TIMEOUT,
                                     "stream-ordered %s not posted: operation #%llu, %u before it on this "
                                     "communicator, was not launched by colld within %d ms (its GPU stream never "
                                     "reached it?); at most %u stream-ordered operations of a communicator can be "
                                     "posted and not yet launched",
                                     what, (unsigned long long)rec->seq, (unsigned)(id - rec->seq), limit_ms,
                                     COLLD_WIRE_GPU_READY_SLOTS);
            return colld_err_set(err, COLLD_ERR_TIMEOUT,
                                 "stream-ordered %s not posted: its ready slot still awaits a write "
                                 "of operation #%llu of an earlier communicator on this handle, queued on a CUDA "
                                 "stream that has not reached it within %d ms; let the streams of destroyed or "
                                 "aborted communicators drain (synchronize them) before reusing their handle",
                                 what, (unsigned long long)rec->seq, limit_ms);
        }
        if (spins < 64 && !colld__cpus_busy(&c->load, now)) {
            for (int i = 0; i < 64; i++)
                colld__cpu_relax();
            continue;
        }
        struct timespec ts = { 0, nap_ns };
        nanosleep(&ts, NULL);
        nap_ns = nap_ns < 1000000 ? nap_ns * 2 : 1000000;
    }
    return COLLD_OK;
}

bool colld__gpu_area(colld_client_t *c, colld_gpu_area_t *out)
{
    gpu_flags_t *f = atomic_load(&c->gpu->flags);
    if (!f)
        return false;
    *out = (colld_gpu_area_t){ .base = f->lines, .dptr = f->dptr, .lines = f->nlines, .plans = f->nplans };
    return true;
}

const uint32_t *colld__gpu_ready_word(colld_comm_t *comm, uint64_t id)
{
    gpu_flags_t *f = atomic_load(&comm->client->gpu->flags);
    if (!f || comm->handle == 0 || comm->handle >= f->nlines)
        return NULL;
    return &f->lines[comm->handle].ready[(uint32_t)id % COLLD_WIRE_GPU_READY_SLOTS];
}

colld_status_t colld__gpu_post(colld_comm_t *comm, const colld_wire_sqe_t *sqe, const colld_gpu_op_t *op,
                               colld_err_t *err)
{
    return colld__gpu_post_batch(comm, sqe, op, 1, err);
}

/* Make stream `to` wait for the work enqueued on stream `from` so far (an event; both of the current
 * context). Returns the driver's result. */
static CUresult stream_join(const colld_cu_t *cu, CUstream from, CUstream to)
{
    CUevent e;
    CUresult r = CU_CHECK(cu, cuEventCreate, &e, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = CU_CHECK(cu, cuEventRecord, e, from)) == CUDA_SUCCESS)
        r = CU_CHECK(cu, cuStreamWaitEvent, to, e, 0);
    CU_CHECK(cu, cuEventDestroy, e); /* its resources go once it has fired */
    return r;
}

/* Join the batch's other streams with the last operation's stream: before its ready write
 * (`into`: every stream's work before its operation comes first) or after its wait (every stream
 * waits for the batch). The current context is the streams' (checked). */
static CUresult join_streams(const colld_cu_t *cu, const colld_gpu_op_t *ops, size_t n, bool into)
{
    CUstream main = (CUstream)ops[n - 1].stream;
    for (size_t i = 0; i + 1 < n; i++) {
        bool seen = ops[i].stream == ops[n - 1].stream;
        for (size_t j = 0; j < i && !seen; j++)
            seen = ops[j].stream == ops[i].stream;
        if (seen)
            continue;
        CUresult r = into ? stream_join(cu, (CUstream)ops[i].stream, main)
                          : stream_join(cu, main, (CUstream)ops[i].stream);
        if (r != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}

colld_status_t colld__gpu_post_batch(colld_comm_t *comm, const colld_wire_sqe_t *sqes, const colld_gpu_op_t *ops,
                                     size_t n, colld_err_t *err)
{
    colld_client_t *c = comm->client;
    const colld_cu_t *cu = colld_cu_load(NULL, 0);
    gpu_flags_t *f = atomic_load(&c->gpu->flags);
    if (!cu || !f || n == 0) /* prepare succeeded, so neither can be missing */
        return colld_err_set(err, COLLD_ERR_INTERNAL, "stream-ordered collective posted without preparation");
    if (n == 1 && ops[0].capture) { /* a collective captured into a CUDA graph: a persistent plan (cuda_graph.c) */
        colld_gpu_area_t area;
        (void)colld__gpu_area(c, &area); /* f is set: true */
        return colld__graph_post(comm, &area, sqes, ops, err);
    }
    const colld_gpu_op_t *op = &ops[n - 1]; /* its stream writes the batch's ready slot and waits */
    /* (A capture inside a group was refused when its operation was prepared: capture_state.) */
    for (size_t i = 0; i + 1 < n; i++)
        if (ops[i].ctx != op->ctx)
            return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED,
                                 "the sends and receives of a group on one communicator must use streams of one CUDA "
                                 "context (nothing was posted)");
    colld_wire_sqe_t one, *d = n == 1 ? &one : calloc(n, sizeof(*d));
    if (!d)
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "out of memory");
    /* (b) The next operation ids of the communicator (every path shares the counter), and the flag
     * value of the last (proto/wire.h: flag values follow the operation id, so that a send or
     * receive, which has no collective ordinal of its own, has one too). A batch (the sends and
     * receives of a group, linked) is ready as a whole: only its last operation's slot is written,
     * once every stream of the batch got there, and only its value is waited for. */
    uint64_t p2p = 0;
    for (size_t i = 0; i < n; i++) {
        d[i] = sqes[i];
        d[i].seq = comm->seq + 1 + i;
        d[i].flags |= COLLD_SQE_STREAM;
        d[i].reserved = ops[i].base;
        p2p += colld_kind_is_p2p(d[i].kind);
    }
    uint64_t id = d[n - 1].seq;
    uint32_t v = op->base + (uint32_t)id;
    char what[96];
    if (colld_kind_is_p2p(d[n - 1].kind))
        snprintf(what, sizeof(what), "%s (operation #%llu)", d[n - 1].kind == COLLD_KIND_SEND ? "send" : "receive",
                 (unsigned long long)id);
    else
        snprintf(what, sizeof(what), "collective #%llu", (unsigned long long)(id - comm->p2p));
    /* (c) Its ready slot, once free (slot_wait). A value an earlier communicator left there that
     * happens to equal v (values wrap) must not stand for this operation: replaced from the host,
     * which is safe now that every write enqueued to the slot has landed. */
    uint32_t slot = (uint32_t)id % COLLD_WIRE_GPU_READY_SLOTS;
    gpu_slot_t *rec = &c->gpu->slots[(size_t)comm->handle * COLLD_WIRE_GPU_READY_SLOTS + slot];
    uint32_t *word = &f->lines[comm->handle].ready[slot];
    colld_status_t st = slot_wait(comm, word, rec, what, id, err);
    if (st != COLLD_OK)
        goto out;
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == v)
        __atomic_store_n(word, v ^ 0x80000000u, __ATOMIC_RELEASE);
    /* (d) The batch's other streams joined, ready[slot] = v once the stream gets here, (e) then wait
     * for done >= v, and the other streams wait for that. */
    bool pushed, written = false, waited = false;
    uint64_t prev = 0;
    CUresult r = op->cur ? ctx_enter_from(cu, (CUcontext)op->ctx, (CUcontext)op->cur, &pushed)
                         : ctx_enter(cu, (CUcontext)op->ctx, &pushed);
    const char *call = "making the stream's context current";
    if (r == CUDA_SUCCESS && n > 1) {
        call = "joining the group's streams (cuEventRecord, cuStreamWaitEvent)";
        r = join_streams(cu, ops, n, true);
    }
    if (r == CUDA_SUCCESS) {
        call = "cuStreamWriteValue32";
        r = CU_CHECK(cu, cuStreamWriteValue32, (CUstream)op->stream, (CUdeviceptr)(op->ready + 4ull * slot), v,
                     CU_STREAM_WRITE_VALUE_DEFAULT);
    }
    if (r == CUDA_SUCCESS) {
        written = true;
        *rec = (gpu_slot_t){ .value = v, .gen = comm->gpu_gen, .seq = id };
        /* A release by the monitor (daemon lost) must cover the wait about to be enqueued. */
        prev = atomic_exchange(&f->posted[comm->handle], POSTED_USED | v);
        call = "cuStreamWaitValue32";
        r = CU_CHECK(cu, cuStreamWaitValue32, (CUstream)op->stream, (CUdeviceptr)op->done, v, op->wait_flags);
        if (r != CUDA_SUCCESS)
            atomic_store(&f->posted[comm->handle], prev); /* no wait of v was enqueued */
    }
    if (r == CUDA_SUCCESS && n > 1) {
        waited = true;
        call = "joining the group's streams after its wait (cuEventRecord, cuStreamWaitEvent)";
        r = join_streams(cu, ops, n, false);
    }
    ctx_leave(cu, pushed);
    if (r != CUDA_SUCCESS && !written) {
        /* Nothing was enqueued or posted, the sequence numbers are not used: a later call may try
         * again. */
        if (r == CUDA_ERROR_NOT_SUPPORTED)
            st = cu_say(cu, err, COLLD_ERR_NOT_SUPPORTED, r,
                        "%s on stream %p: this device has no CUDA stream memory operations, which stream-ordered "
                        "collectives need (the CUDA IPC event fallback is not built yet)",
                        call, op->stream);
        else
            st = cu_say(cu, err, COLLD_ERR_DEVICE, r, "%s on stream %p", call, op->stream);
        goto out;
    }
    if (r != CUDA_SUCCESS) {
        /* ready[slot] = v is on the stream without its wait (or its group's other streams do not
         * wait for it): the next operation of the same slot and value would look ready before its
         * inputs are. The communicator is unusable from this rank now (its peers see it as
         * missing); a wait already enqueued is released. */
        colld_status_t ok = COLLD_OK;
        __atomic_compare_exchange_n(&comm->async_error, &ok, COLLD_ERR_DEVICE, false, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
        if (waited)
            release_line(&f->lines[comm->handle], v, COLLD_ERR_DEVICE);
        st = cu_say(cu, err, COLLD_ERR_DEVICE, r,
                    "%s on stream %p after its ready flag was enqueued; the communicator cannot be used any more", call,
                    op->stream);
        goto out;
    }
    /* (f) Post them like any operation. The daemon takes a descriptor only with a completion slot
     * free for it, and a caller of stream-ordered work may never wait through colld (its CUDA
     * streams alone observe the work, as torch and NCCL programs do): reap what has come first, or
     * after a ring's worth of collectives the next one would sit on the submission ring for ever.
     * (Host work needs no such step: its caller waits through colld, and a full submission ring
     * reaps.) */
    colld__client_poll(c);
    st = colld__client_submit(c, d, n);
    if (st != COLLD_OK) {
        release_line(&f->lines[comm->handle], v, st);
        colld_err_set(err, st, "cannot post the %s (%s); its stream was released with that error",
                      n > 1 ? "group's sends and receives" : "operation", colld_status_string(st));
        goto out;
    }
    comm->seq = id;
    comm->p2p += p2p; /* the collective ordinals stay in step with the daemon's */
    comm->issued += n;
out:
    if (d != &one)
        free(d);
    return st;
}

/* ============================================================================================
 * colld_mem_alloc(COLLD_MEM_CUDA)
 * ========================================================================================== */

/* Allocate `bytes` of device memory on the device of the current context. */
static colld_status_t alloc_locked(colld_client_t *c, colld_gpu_t *g, const colld_cu_t *cu, void **ptr, size_t bytes,
                                   colld_err_t *err)
{
    CUcontext ctx;
    colld_status_t st = ensure_ctx(g, cu, 0, &ctx, err);
    if (st != COLLD_OK)
        return st;
    CUdevice dev;
    CUresult r = CU_CHECK(cu, cuCtxGetDevice, &dev);
    if (r != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_DEVICE, r, "cuCtxGetDevice");
    int vmm = 0, fdok = 0;
    CU_CHECK(cu, cuDeviceGetAttribute, &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    CU_CHECK(cu, cuDeviceGetAttribute, &fdok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
    CUdeviceptr p = 0;
    size_t size = bytes;
    int own;
    const char *call;
    if (vmm && fdok) {
        own = OWN_VMM;
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = (int)dev;
        size_t gran = 0;
        CUmemGenericAllocationHandle h = 0;
        bool created = false, reserved = false;
        call = "cuMemGetAllocationGranularity";
        if ((r = CU_CHECK(cu, cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) ==
            CUDA_SUCCESS) {
            if (gran == 0 || bytes > SIZE_MAX - gran)
                return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "%zu bytes of GPU memory: too large", bytes);
            size = (bytes + gran - 1) / gran * gran;
            call = "cuMemCreate";
            created = (r = CU_CHECK(cu, cuMemCreate, &h, size, &prop, 0)) == CUDA_SUCCESS;
        }
        if (r == CUDA_SUCCESS) {
            call = "cuMemAddressReserve";
            reserved = (r = CU_CHECK(cu, cuMemAddressReserve, &p, size, gran, 0, 0)) == CUDA_SUCCESS;
        }
        if (r == CUDA_SUCCESS) {
            call = "cuMemMap";
            r = CU_CHECK(cu, cuMemMap, p, size, 0, h, 0);
            if (r == CUDA_SUCCESS) {
                CUmemAccessDesc acc;
                memset(&acc, 0, sizeof(acc));
                acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                acc.location.id = (int)dev;
                acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                call = "cuMemSetAccess";
                if ((r = CU_CHECK(cu, cuMemSetAccess, p, size, &acc, 1)) != CUDA_SUCCESS)
                    CU_CHECK(cu, cuMemUnmap, p, size);
            }
        }
        if (created)
            CU_CHECK(cu, cuMemRelease, h); /* the mapping holds the memory */
        if (r != CUDA_SUCCESS && reserved)
            CU_CHECK(cu, cuMemAddressFree, p, size);
    } else {
        own = OWN_MEMALLOC;
        call = "cuMemAlloc";
        r = CU_CHECK(cu, cuMemAlloc, &p, bytes);
    }
    if (r != CUDA_SUCCESS)
        return cu_say(cu, err, r == CUDA_ERROR_OUT_OF_MEMORY ? COLLD_ERR_NO_MEMORY : COLLD_ERR_DEVICE, r,
                      "%s (%zu bytes on device %d)", call, size, (int)dev);
    /* Register it now, so that collectives on it never pay for it. */
    gpu_reg_t tmp = { .base = p, .own = own, .own_size = size, .own_ctx = ctx };
    ptr_info_t pi;
    colld_wire_buf_t wb;
    gpu_reg_t *e = NULL;
    if ((r = ptr_query(cu, (void *)(uintptr_t)p, &pi)) != CUDA_SUCCESS)
        st = cu_say(cu, err, COLLD_ERR_DEVICE, r, "cuPointerGetAttributes of a new allocation");
    else
        st = colld__gpu_resolve(c, g, cu, (void *)(uintptr_t)p, bytes, &pi, "the new allocation", &wb, &e, err);
    if (st == COLLD_OK && (e->base != p || wb.offset != 0)) {
        st = colld_err_set(err, COLLD_ERR_DEVICE, "the driver does not see the new allocation 0x%llx as its own range",
                           (unsigned long long)p);
        colld__gpu_reg_remove(c, g, (size_t)(e - g->regs));
    }
    if (st != COLLD_OK) {
        colld__gpu_free_owned(cu, &tmp);
        return st;
    }
    e->own = own;
    e->own_size = size;
    e->own_ctx = ctx;
    e->limit = bytes;
    *ptr = (void *)(uintptr_t)p;
    LOG_DEBUG(GPU, "colld_mem_alloc: %zu bytes of GPU %d memory at 0x%llx (%s)", bytes, (int)dev,
              (unsigned long long)p, own == OWN_VMM ? "cuMemCreate, exportable as a POSIX fd" : "cuMemAlloc");
    return COLLD_OK;
}

colld_status_t colld__gpu_mem_alloc(colld_client_t *c, void **ptr, size_t bytes, colld_err_t *err)
{
    char load_err[256];
    const colld_cu_t *cu = colld_cu_load(load_err, sizeof(load_err));
    if (!cu)
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "COLLD_MEM_CUDA needs the CUDA driver: %s", load_err);
    if (atomic_load(&c->lost))
        return colld_err_set(err, COLLD_ERR_DAEMON_LOST, "%s", colld__lost_detail(c));
    colld_gpu_t *g = c->gpu;
    pthread_mutex_lock(&g->mu);
    g->cu = cu;
    colld_status_t st = alloc_locked(c, g, cu, ptr, bytes, err);
    pthread_mutex_unlock(&g->mu);
    return st;
}

colld_status_t colld__gpu_mem_free(colld_client_t *c, void *ptr, colld_err_t *err)
{
    colld_gpu_t *g = c->gpu;
    pthread_mutex_lock(&g->mu);
    size_t i = 0;
    while (i < g->nregs && !(g->regs[i].own && g->regs[i].base == (CUdeviceptr)(uintptr_t)ptr))
        i++;
    if (i == g->nregs) {
        pthread_mutex_unlock(&g->mu);
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "%p is not memory from colld_mem_alloc", ptr);
    }
    if (g->regs[i].pins) {
        pthread_mutex_unlock(&g->mu);
        return colld_err_set(err, COLLD_ERR_INVALID_USAGE,
                             "%p is still registered with colld_mem_register: deregister it first", ptr);
    }
    gpu_reg_t e = g->regs[i];
    colld_status_t st = colld__gpu_reg_remove(c, g, i);
    colld__gpu_free_owned(g->cu, &e);
    pthread_mutex_unlock(&g->mu);
    if (st != COLLD_OK)
        colld_err_set(err, st, "colld did not release the GPU registration of %p: %s", ptr, colld_status_string(st));
    return st;
}

/* ============================================================================================
 * colld_mem_register / colld_mem_deregister of device memory
 * ========================================================================================== */

colld_status_t colld__gpu_mem_register(colld_client_t *c, const void *buf, size_t bytes, uint32_t *reg_id,
                                       colld_err_t *err)
{
    char load_err[256];
    const colld_cu_t *cu = colld_cu_load(load_err, sizeof(load_err));
    if (!cu)
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "GPU memory needs the CUDA driver: %s", load_err);
    if (atomic_load(&c->lost))
        return colld_err_set(err, COLLD_ERR_DAEMON_LOST, "%s", colld__lost_detail(c));
    ptr_info_t pi;
    CUresult r = ptr_query(cu, buf, &pi);
    if (r != CUDA_SUCCESS)
        return cu_say(cu, err, COLLD_ERR_INVALID_ARGUMENT, r, "buf (%p): cuPointerGetAttributes", buf);
    colld_status_t st = need_device(&pi, buf, "buf", err);
    if (st != COLLD_OK)
        return st;
    colld_gpu_t *g = c->gpu;
    pthread_mutex_lock(&g->mu);
    g->cu = cu;
    CUcontext cur;
    gpu_reg_t *e = NULL;
    colld_wire_buf_t wb;
    st = ensure_ctx(g, cu, pi.ordinal, &cur, err);
    if (st == COLLD_OK)
        st = colld__gpu_resolve(c, g, cu, buf, bytes, &pi, "buf", &wb, &e, err);
    if (st == COLLD_OK) {
        e->pins++;
        *reg_id = e->reg_id;
    }
    pthread_mutex_unlock(&g->mu);
    return st;
}

colld_status_t colld__gpu_mem_deregister(colld_client_t *c, uint32_t reg_id, colld_err_t *err)
{
    colld_gpu_t *g = c->gpu;
    colld_status_t st = COLLD_OK;
    pthread_mutex_lock(&g->mu);
    size_t i = 0;
    while (i < g->nregs && !(g->regs[i].reg_id == reg_id && g->regs[i].pins))
        i++;
    if (i == g->nregs)
        st = colld_err_set(err, COLLD_ERR_INTERNAL, "GPU registration %u is not pinned", reg_id);
    else if (--g->regs[i].pins == 0 && g->regs[i].own == OWN_NONE)
        st = colld__gpu_reg_remove(c, g, i); /* colld_mem_alloc memory stays registered until colld_mem_free */
    pthread_mutex_unlock(&g->mu);
    if (st != COLLD_OK && st != COLLD_ERR_INTERNAL)
        colld_err_set(err, st, "colld did not release GPU registration %u: %s", reg_id, colld_status_string(st));
    return st;
}

/* ============================================================================================
 * Disconnect
 * ========================================================================================== */

void colld__gpu_client_free(colld_client_t *c)
{
    colld_gpu_t *g = c->gpu;
    if (!g)
        return;
    const colld_cu_t *cu = g->cu;
    for (size_t i = 0; i < g->nregs; i++) {
        colld__deregister(c, g->regs[i].reg_id); /* a no-op once the daemon is lost */
        colld__gpu_free_owned(cu, &g->regs[i]);
        free(g->regs[i].seg);
    }
    free(g->regs);
    gpu_flags_t *f = atomic_load(&g->flags);
    if (f) {
        /* A wait still enqueued on some stream reads the area: release it and keep the area. */
        int busy = 0;
        for (uint32_t h = 1; h < f->nlines; h++) {
            uint64_t posted = atomic_load(&f->posted[h]);
            uint32_t done = __atomic_load_n(&f->lines[h].done, __ATOMIC_ACQUIRE);
            if (posted && (int32_t)(done - (uint32_t)posted) < 0) {
                release_line(&f->lines[h], (uint32_t)posted, COLLD_ERR_ABORTED);
                busy++;
            }
        }
        /* CUDA graphs that still hold captured collectives keep the area: cuda_graph.c releases their
         * replays from now on and lets the area go with the last of them. */
        bool adopted = colld__graph_client_free(c, busy ? NULL : f->lines, f->size, f->ctx);
        if (busy) {
            LOG_WARN(GPU, "colld_disconnect with stream-ordered collectives of %d communicator(s) not complete: "
                          "their streams were released with COLLD_ERR_ABORTED; the flag area stays mapped", busy);
        } else if (adopted) {
            free((void *)f->posted);
            free(f);
        } else {
            flags_unmap(cu, f->lines, f->size, f->ctx);
            free((void *)f->posted);
            free(f);
        }
    }
    for (int d = 0; d < MAX_DEVICES; d++) {
        CUdevice dev;
        if (g->primary[d] && CU_CHECK(cu, cuDeviceGet, &dev, d) == CUDA_SUCCESS)
            CU_CHECK(cu, cuDevicePrimaryCtxRelease, dev);
    }
    pthread_mutex_destroy(&g->mu);
    free(g->slots);
    free(g->gens);
    free(g);
    c->gpu = NULL;
}

#endif /* COLLD_HAVE_CUDA */
