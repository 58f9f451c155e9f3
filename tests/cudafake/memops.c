/*
 * memops.c - stream memory operations in the CUDA driver test double: cuStreamWriteValue32/64,
 * cuStreamWaitValue32/64 and cuStreamBatchMemOp, in their V2 (CUDA 11.7+) and deprecated V1
 * variants.
 *
 * Semantics as cuda.h documents them: a wait blocks the stream until its condition holds,
 *   GEQ  (int32_t)(*addr - value) >= 0   (int64_t for the 64-bit wait): a cyclic comparison
 *   EQ   *addr == value
 *   AND  (*addr & value) != 0
 *   NOR  ~(*addr | value) != 0           (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR)
 * with CU_STREAM_WAIT_VALUE_FLUSH only where CAN_FLUSH_REMOTE_WRITES; a write stores the value
 * after every earlier write of the stream is visible (a sequentially consistent store), or
 * with CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER a relaxed store. The V1 entry points work only
 * where the device has the V1 API enabled (CAN_USE_STREAM_MEM_OPS_V1, off by default as in the
 * driver); 64-bit operations need CAN_USE_64_BIT_STREAM_MEM_OPS; a device with memops=0 has none
 * (CUDA_ERROR_NOT_SUPPORTED). The address must be device-accessible memory (device memory the
 * stream's device may touch, or host memory registered with CU_MEMHOSTREGISTER_DEVICEMAP):
 * anything else faults when the operation runs (CUDA_ERROR_ILLEGAL_ADDRESS, sticky), as on a GPU.
 *
 * A wait polls the memory (another process may write it) with a back-off from 20 us to 1 ms; it
 * also re-checks that the memory is still accessible, and ends when the stream's context goes.
 */
#include "tests/cudafake/fake.h"

#include <time.h>

/* Check one operation against the device's support and the driver's rules, at the call. */
CUresult fk_memop_validate(const fk_device_spec_t *d, const CUstreamBatchMemOpParams *p, bool v1, fk_memop_t *out)
{
    if (!d->memops || (v1 && !d->memops_v1))
        return CUDA_ERROR_NOT_SUPPORTED;
    int type = (int)p->operation;
    *out = (fk_memop_t){ .type = type };
    switch (type) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
    case CU_STREAM_MEM_OP_WAIT_VALUE_64: {
        bool wide = type == CU_STREAM_MEM_OP_WAIT_VALUE_64;
        unsigned f = p->waitValue.flags, kind = f & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH;
        if (kind > CU_STREAM_WAIT_VALUE_NOR || !p->waitValue.address || p->waitValue.address % (wide ? 8 : 4))
            return CUDA_ERROR_INVALID_VALUE;
        if ((wide && !d->memops64) || (kind == CU_STREAM_WAIT_VALUE_NOR && !d->wait_nor) ||
            ((f & CU_STREAM_WAIT_VALUE_FLUSH) && !d->flush))
            return CUDA_ERROR_NOT_SUPPORTED;
        out->addr = (uintptr_t)p->waitValue.address;
        out->value = wide ? p->waitValue.value64 : p->waitValue.value;
        out->flags = f;
        return CUDA_SUCCESS;
    }
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
    case CU_STREAM_MEM_OP_WRITE_VALUE_64: {
        bool wide = type == CU_STREAM_MEM_OP_WRITE_VALUE_64;
        unsigned f = p->writeValue.flags;
        if ((f & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) || !p->writeValue.address ||
            p->writeValue.address % (wide ? 8 : 4))
            return CUDA_ERROR_INVALID_VALUE;
        if (wide && !d->memops64)
            return CUDA_ERROR_NOT_SUPPORTED;
        out->addr = (uintptr_t)p->writeValue.address;
        out->value = wide ? p->writeValue.value64 : p->writeValue.value;
        out->flags = f;
        return CUDA_SUCCESS;
    }
    case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
        if (p->flushRemoteWrites.flags != 0)
            return CUDA_ERROR_INVALID_VALUE;
        return d->flush ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
    case CU_STREAM_MEM_OP_BARRIER:
        if (v1 || (p->memoryBarrier.flags != CU_STREAM_MEMORY_BARRIER_TYPE_SYS &&
                   p->memoryBarrier.flags != CU_STREAM_MEMORY_BARRIER_TYPE_GPU))
            return CUDA_ERROR_INVALID_VALUE;
        return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

/* Does the value at a wait's address satisfy it? */
static bool wait_done(const fk_memop_t *m, uint64_t v)
{
    bool wide = m->type == CU_STREAM_MEM_OP_WAIT_VALUE_64;
    uint64_t ref = m->value;
    if (!wide) {
        v = (uint32_t)v;
        ref = (uint32_t)ref;
    }
    switch (m->flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) {
    case CU_STREAM_WAIT_VALUE_GEQ:
        return wide ? (int64_t)(v - ref) >= 0 : (int32_t)(uint32_t)((uint32_t)v - (uint32_t)ref) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return v == ref;
    case CU_STREAM_WAIT_VALUE_AND: return (v & ref) != 0;
    default: /* NOR */ return (wide ? ~(v | ref) : (uint32_t)~(v | ref)) != 0;
    }
}

/* The current value at a wait's address (an acquire load). */
static uint64_t load(const fk_memop_t *m)
{
    if (m->type == CU_STREAM_MEM_OP_WAIT_VALUE_64)
        return __atomic_load_n((const uint64_t *)m->addr, __ATOMIC_ACQUIRE);
    return __atomic_load_n((const uint32_t *)m->addr, __ATOMIC_ACQUIRE);
}

/* Is the memory of m still there for the stream's device? (lock not held) */
static CUresult check(fk_stream_t *s, const fk_memop_t *m, bool write)
{
    size_t len = m->type == CU_STREAM_MEM_OP_WAIT_VALUE_64 || m->type == CU_STREAM_MEM_OP_WRITE_VALUE_64 ? 8 : 4;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_mem_access(s->ctx, m->addr, len, write, write ? "cuStreamWriteValue" : "cuStreamWaitValue");
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* Run n operations in order on s's worker (lock not held). */
CUresult fk_memop_run(fk_stream_t *s, const fk_memop_t *ms, int n)
{
    for (int i = 0; i < n; i++) {
        const fk_memop_t *m = &ms[i];
        CUresult r;
        switch (m->type) {
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        case CU_STREAM_MEM_OP_WRITE_VALUE_64: {
            if ((r = check(s, m, true)) != CUDA_SUCCESS)
                return r;
            /* With the barrier: a sequentially consistent store, after everything the stream wrote
             * (all of it by this thread); without: relaxed. */
            bool barrier = !(m->flags & CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER);
            if (m->type == CU_STREAM_MEM_OP_WRITE_VALUE_64)
                __atomic_store_n((uint64_t *)m->addr, m->value, barrier ? __ATOMIC_SEQ_CST : __ATOMIC_RELAXED);
            else
                __atomic_store_n((uint32_t *)m->addr, (uint32_t)m->value, barrier ? __ATOMIC_SEQ_CST : __ATOMIC_RELAXED);
            break;
        }
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        case CU_STREAM_MEM_OP_WAIT_VALUE_64: {
            long delay_ns = 20000;
            for (unsigned k = 0;; k++) {
                if (k % 64 == 0 && (r = check(s, m, false)) != CUDA_SUCCESS)
                    return r;
                if (wait_done(m, load(m)))
                    break;
                if (atomic_load(&s->abort))
                    return CUDA_SUCCESS; /* its context is going away */
                struct timespec ts = { .tv_sec = 0, .tv_nsec = delay_ns };
                nanosleep(&ts, NULL);
                if (delay_ns < 1000000)
                    delay_ns *= 2;
            }
            break;
        }
        default: break; /* a barrier, a flush: one thread runs the stream, in order; nothing to do */
        }
    }
    return CUDA_SUCCESS;
}

/* Enqueue n validated operations on a stream. */
static CUresult enqueue(CUstream stream, const CUstreamBatchMemOpParams *ps, unsigned n, bool v1)
{
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_stream_resolve(stream, &s, false);
    fk_op_t *op = r == CUDA_SUCCESS ? fk_op_new(FK_OP_MEMOP) : NULL;
    if (r == CUDA_SUCCESS && !op)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (op) {
        op->u.memop.n = (int)n;
        op->u.memop.ops = n == 1 ? &op->u.memop.one : calloc(n, sizeof(fk_memop_t));
        if (!op->u.memop.ops) {
            op->u.memop.ops = &op->u.memop.one;
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
        for (unsigned i = 0; i < n && r == CUDA_SUCCESS; i++)
            r = fk_memop_validate(fk_dev(s->ctx->dev), &ps[i], v1, &op->u.memop.ops[i]);
        if (r == CUDA_SUCCESS)
            r = fk_enqueue(s, op); /* takes op */
        else
            fk_op_free(op);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* One write or wait, as a batch of one. */
static CUresult one(CUstream stream, CUstreamBatchMemOpType type, CUdeviceptr addr, uint64_t value, unsigned flags,
                    bool v1)
{
    CUstreamBatchMemOpParams p = { .operation = type };
    if (type == CU_STREAM_MEM_OP_WAIT_VALUE_32 || type == CU_STREAM_MEM_OP_WAIT_VALUE_64) {
        p.waitValue.address = addr;
        p.waitValue.value64 = value;
        p.waitValue.flags = flags;
    } else {
        p.writeValue.address = addr;
        p.writeValue.value64 = value;
        p.writeValue.flags = flags;
    }
    if (type == CU_STREAM_MEM_OP_WAIT_VALUE_32)
        p.waitValue.value = (cuuint32_t)value;
    if (type == CU_STREAM_MEM_OP_WRITE_VALUE_32)
        p.writeValue.value = (cuuint32_t)value;
    return enqueue(stream, &p, 1, v1);
}

CUresult CUDAAPI cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    FK_BEGIN(cuStreamWriteValue32);
    return one(stream, CU_STREAM_MEM_OP_WRITE_VALUE_32, addr, value, flags, false);
}

CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    FK_BEGIN(cuStreamWaitValue32);
    return one(stream, CU_STREAM_MEM_OP_WAIT_VALUE_32, addr, value, flags, false);
}

CUresult CUDAAPI cuStreamWriteValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)
{
    FK_BEGIN(cuStreamWriteValue64);
    return one(stream, CU_STREAM_MEM_OP_WRITE_VALUE_64, addr, value, flags, false);
}

CUresult CUDAAPI cuStreamWaitValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)
{
    FK_BEGIN(cuStreamWaitValue64);
    return one(stream, CU_STREAM_MEM_OP_WAIT_VALUE_64, addr, value, flags, false);
}

CUresult CUDAAPI cuStreamBatchMemOp_v2(CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray,
                                       unsigned int flags)
{
    FK_BEGIN(cuStreamBatchMemOp);
    if (!paramArray || count == 0 || count > FK_MAX_BATCH || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return enqueue(stream, paramArray, count, false);
}

/* The deprecated V1 API: the same operations where the device has it enabled. */
CUresult CUDAAPI cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    FK_BEGIN(cuStreamWriteValue32);
    return one(stream, CU_STREAM_MEM_OP_WRITE_VALUE_32, addr, value, flags, true);
}

CUresult CUDAAPI cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    FK_BEGIN(cuStreamWaitValue32);
    return one(stream, CU_STREAM_MEM_OP_WAIT_VALUE_32, addr, value, flags, true);
}

CUresult CUDAAPI cuStreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)
{
    FK_BEGIN(cuStreamWriteValue64);
    return one(stream, CU_STREAM_MEM_OP_WRITE_VALUE_64, addr, value, flags, true);
}

CUresult CUDAAPI cuStreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)
{
    FK_BEGIN(cuStreamWaitValue64);
    return one(stream, CU_STREAM_MEM_OP_WAIT_VALUE_64, addr, value, flags, true);
}

CUresult CUDAAPI cuStreamBatchMemOp(CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray,
                                    unsigned int flags)
{
    FK_BEGIN(cuStreamBatchMemOp);
    if (!paramArray || count == 0 || count > FK_MAX_BATCH || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return enqueue(stream, paramArray, count, true);
}
