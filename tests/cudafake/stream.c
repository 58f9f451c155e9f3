/*
 * stream.c - streams and events of the CUDA driver test double.
 *
 * A stream is an ordered queue of operations executed by a worker thread of its own (started at
 * its first operation). An operation may carry dependencies, (stream, sequence number) pairs it
 * waits for before it starts; that is how cuStreamWaitEvent, graph launches and the legacy default
 * stream are built:
 *   - work on the legacy default stream (NULL or CU_STREAM_LEGACY) waits for all work enqueued
 *     before it on every blocking stream of its context, and work on a blocking stream waits for
 *     all work enqueued before it on the legacy stream; CU_STREAM_NON_BLOCKING streams take part
 *     in neither. The per-thread default stream is not modelled (CU_STREAM_PER_THREAD is an
 *     invalid handle here).
 *   - an operation of a context with a sticky error does not run: it completes at once, failed.
 *   - an operation that faults (an injected sticky fault, an illegal address) makes its error
 *     the context's sticky error.
 * A queue holds at most FK_MAX_QUEUE operations; the enqueuing thread blocks beyond, as with a
 * full push buffer. Destroying a stream returns at once; its queued work still runs. Destroying
 * its context drops the queued work and waits for the running operation to end.
 *
 * Events: a record is an operation; the event is complete once its last record has run; it keeps
 * the time (CLOCK_MONOTONIC) at which that record ran unless it has CU_EVENT_DISABLE_TIMING.
 */
#include "tests/cudafake/fake.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static fk_event_t *events; /* every live event */

/* ============================================================================================
 * Operations
 * ========================================================================================== */

fk_op_t *fk_op_new(fk_opkind_t kind)
{
    fk_op_t *op = calloc(1, sizeof(*op));
    if (op)
        op->kind = kind;
    return op;
}

/* Free an operation and drop what it holds: dependencies, events, a graph launch (lock held). */
void fk_op_free(fk_op_t *op)
{
    if (!op)
        return;
    for (int i = 0; i < op->ndeps; i++)
        fk_stream_unref(op->deps[i].s);
    free(op->deps);
    switch (op->kind) {
    case FK_OP_KERNEL: free(op->u.kernel.params); break;
    case FK_OP_MEMOP:
        if (op->u.memop.ops != &op->u.memop.one)
            free(op->u.memop.ops);
        break;
    case FK_OP_RECORD:
    case FK_OP_WAITEV: fk_event_unref(op->u.record.ev); break;
    case FK_OP_GRAPH: fk_exec_launched(op->u.graph.exec); break;
    default: break;
    }
    free(op);
}

/* A deep copy of a graph node, for an executable graph (lock held); NULL when out of memory. */
fk_op_t *fk_op_clone(const fk_op_t *op)
{
    fk_op_t *c = fk_op_new(op->kind);
    if (!c)
        return NULL;
    c->u = op->u;
    c->fault = op->fault;
    switch (op->kind) {
    case FK_OP_KERNEL:
        c->u.kernel.params = malloc(op->u.kernel.k->param_size);
        if (!c->u.kernel.params) {
            free(c);
            return NULL;
        }
        memcpy(c->u.kernel.params, op->u.kernel.params, op->u.kernel.k->param_size);
        break;
    case FK_OP_MEMOP:
        if (op->u.memop.ops == &op->u.memop.one) {
            c->u.memop.ops = &c->u.memop.one;
        } else {
            c->u.memop.ops = malloc((size_t)op->u.memop.n * sizeof(fk_memop_t));
            if (!c->u.memop.ops) {
                free(c);
                return NULL;
            }
            memcpy(c->u.memop.ops, op->u.memop.ops, (size_t)op->u.memop.n * sizeof(fk_memop_t));
        }
        break;
    case FK_OP_RECORD:
    case FK_OP_WAITEV: op->u.record.ev->refs++; break;
    case FK_OP_GRAPH: /* a graph launch is never a node: capture refuses it */
        free(c);
        return NULL;
    default: break;
    }
    return c;
}

/* What an operation is, in words (messages). */
static const char *op_name(const fk_op_t *op)
{
    switch (op->kind) {
    case FK_OP_NOP: return "a stream wait";
    case FK_OP_KERNEL: return op->u.kernel.name;
    case FK_OP_MEMOP: return "a stream memory operation";
    case FK_OP_RECORD: return "an event record";
    case FK_OP_WAITEV: return "an event wait node";
    case FK_OP_HOSTFN: return "a host function";
    case FK_OP_COPY: return "a memory copy";
    case FK_OP_SET: return "a memset";
    case FK_OP_GRAPH: return "a graph launch";
    }
    return "an operation";
}

/* Wait on fk.cv until `deadline_ns` (0: no deadline). */
static void cv_wait(uint64_t deadline_ns)
{
    if (!deadline_ns) {
        pthread_cond_wait(&fk.cv, &fk.mu);
        return;
    }
    struct timespec ts = { .tv_sec = (time_t)(deadline_ns / 1000000000ull), .tv_nsec = (long)(deadline_ns % 1000000000ull) };
    pthread_cond_timedwait(&fk.cv, &fk.mu, &ts);
}

/* Run one operation (lock not held). */
CUresult fk_op_exec(fk_stream_t *s, fk_op_t *op)
{
    CUresult r = CUDA_SUCCESS;
    switch (op->kind) {
    case FK_OP_NOP: break;
    case FK_OP_KERNEL: r = fk_kernel_run(s, op); break;
    case FK_OP_MEMOP: r = fk_memop_run(s, op->u.memop.ops, op->u.memop.n); break;
    case FK_OP_RECORD: {
        fk_event_t *e = op->u.record.ev;
        pthread_mutex_lock(&fk.mu);
        e->stamp_ns = fk_now_ns();
        e->stamp_s = s;
        e->stamp_seq = op->seq;
        pthread_mutex_unlock(&fk.mu);
        break;
    }
    case FK_OP_WAITEV: {
        /* A graph's event wait node: wait for the event's last record as it is now. */
        fk_event_t *e = op->u.record.ev;
        pthread_mutex_lock(&fk.mu);
        fk_stream_t *w = e->recorded ? e->rec_s : NULL;
        uint64_t seq = e->rec_seq;
        if (w)
            w->refs++;
        while (w && w->done < seq && !atomic_load(&w->abort) && !atomic_load(&s->abort))
            cv_wait(0);
        if (w)
            fk_stream_unref(w);
        pthread_mutex_unlock(&fk.mu);
        break;
    }
    case FK_OP_HOSTFN: op->u.host.fn(op->u.host.arg); break;
    case FK_OP_COPY:
    case FK_OP_SET: {
        bool copy = op->kind == FK_OP_COPY;
        uintptr_t dev = copy ? op->u.copy.dev : op->u.set.dev;
        size_t n = copy ? op->u.copy.bytes : op->u.set.bytes;
        bool write = !copy || op->u.copy.to_device;
        pthread_mutex_lock(&fk.mu);
        r = fk_mem_access(s->ctx, dev, n, write, copy ? "a memory copy" : "a memset");
        pthread_mutex_unlock(&fk.mu);
        if (r == CUDA_SUCCESS && n && copy && op->u.copy.to_device)
            memcpy((void *)dev, op->u.copy.host, n);
        else if (r == CUDA_SUCCESS && n && copy)
            memcpy(op->u.copy.host, (const void *)dev, n);
        else if (r == CUDA_SUCCESS && n)
            memset((void *)dev, op->u.set.value, n);
        break;
    }
    case FK_OP_GRAPH: r = fk_exec_run(s, op->u.graph.exec, op->seq); break;
    }
    return r;
}

/* ============================================================================================
 * Streams
 * ========================================================================================== */

void fk_stream_unref(fk_stream_t *s)
{
    if (--s->refs > 0)
        return;
    fk.nstreams--;
    free(s);
}

/* Have the operations op depends on finished (or been dropped)? (lock held) */
static bool deps_met(const fk_op_t *op)
{
    for (int i = 0; i < op->ndeps; i++)
        if (op->deps[i].s->done < op->deps[i].seq && !atomic_load(&op->deps[i].s->abort))
            return false;
    return true;
}

/* Take a stream off its context's list (lock held). */
static void stream_unlink(fk_stream_t *s)
{
    for (fk_stream_t **pp = &s->ctx->streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            return;
        }
}

/* The worker of one stream. */
static void *worker(void *arg)
{
    fk_stream_t *s = arg;
    pthread_mutex_lock(&fk.mu);
    for (;;) {
        if (atomic_load(&s->abort)) {
            while (s->head) {
                fk_op_t *op = s->head;
                s->head = op->next;
                fk_op_free(op);
            }
            s->tail = NULL;
            s->queued = 0;
            s->done = s->enqueued;
            pthread_cond_broadcast(&fk.cv);
            break;
        }
        if (!s->head) {
            if (!s->handle_live)
                break; /* destroyed and drained */
            cv_wait(0);
            continue;
        }
        fk_op_t *op = s->head;
        if (!deps_met(op) || fk_fault_stalled(s)) {
            cv_wait(fk_now_ns() + 2000000ull); /* a stall may be released by the control file */
            pthread_mutex_unlock(&fk.mu);
            fk_fault_poll();
            pthread_mutex_lock(&fk.mu);
            continue;
        }
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->queued--;
        s->running = true;
        fk_ctx_t *ctx = s->ctx;
        CUresult sticky = ctx->sticky;
        pthread_cond_broadcast(&fk.cv); /* room in the queue */
        pthread_mutex_unlock(&fk.mu);
        CUresult r = sticky != CUDA_SUCCESS ? sticky : op->fault != CUDA_SUCCESS ? op->fault : fk_op_exec(s, op);
        pthread_mutex_lock(&fk.mu);
        s->running = false;
        if (r != CUDA_SUCCESS && sticky == CUDA_SUCCESS && !atomic_load(&s->abort)) {
            char why[160];
            snprintf(why, sizeof(why), "%s on %s%s", op_name(op), s->label,
                     op->fault != CUDA_SUCCESS ? ", an injected fault" : "");
            fk_ctx_set_sticky(ctx, r, why);
        }
        s->done = op->seq;
        s->executed++;
        fk_op_free(op);
        pthread_cond_broadcast(&fk.cv);
    }
    s->worker = false;
    if (!s->handle_live && !atomic_load(&s->abort))
        stream_unlink(s);
    pthread_cond_broadcast(&fk.cv);
    fk_stream_unref(s);
    pthread_mutex_unlock(&fk.mu);
    return NULL;
}

/* A new stream of ctx (lock held); NULL when the process has FK_MAX_STREAMS. */
static fk_stream_t *stream_new(fk_ctx_t *ctx, unsigned flags, int priority, bool legacy)
{
    if (fk.nstreams >= FK_MAX_STREAMS)
        return NULL;
    fk_stream_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->ctx = ctx;
    s->ctx_gen = ctx->generation;
    s->flags = flags;
    s->priority = priority;
    s->legacy = legacy;
    s->refs = 1; /* the handle (or the context, for its legacy stream) */
    s->handle_live = true;
    atomic_init(&s->abort, false);
    if (legacy) {
        snprintf(s->label, sizeof(s->label), "the legacy stream of device %d", ctx->dev);
        ctx->legacy = s;
    } else {
        s->id = ++fk.next_stream_id;
        snprintf(s->label, sizeof(s->label), "stream %llu", (unsigned long long)s->id);
        s->next = ctx->streams;
        ctx->streams = s;
    }
    fk.nstreams++;
    return s;
}

/* The stream a handle names (NULL and CU_STREAM_LEGACY: the current context's legacy stream),
 * checked; with need_current it must belong to the current context (lock held). */
CUresult fk_stream_resolve(CUstream h, fk_stream_t **out, bool need_current)
{
    fk_stream_t *s;
    if (h == NULL || h == CU_STREAM_LEGACY) {
        fk_ctx_t *ctx;
        CUresult r = fk_ctx_get(&ctx);
        if (r != CUDA_SUCCESS)
            return r;
        if (!ctx->legacy && !stream_new(ctx, 0, 0, true))
            return CUDA_ERROR_OUT_OF_MEMORY;
        *out = ctx->legacy;
        return CUDA_SUCCESS;
    }
    if (h == CU_STREAM_PER_THREAD) {
        fk_log("CU_STREAM_PER_THREAD: the per-thread default stream is not modelled by the double");
        return CUDA_ERROR_INVALID_HANDLE;
    }
    s = (fk_stream_t *)h;
    if (!fk_handle_ok(s, FK_K_STREAM))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = fk_ctx_check(s->ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (need_current && fk_ctx_current() != s->ctx)
        return CUDA_ERROR_INVALID_HANDLE; /* the stream belongs to another context than the current one */
    *out = s;
    return CUDA_SUCCESS;
}

/* Add a dependency on (d, its last operation) to op (lock held). */
static bool add_dep(fk_op_t *op, fk_stream_t *d)
{
    fk_dep_t *t = realloc(op->deps, (size_t)(op->ndeps + 1) * sizeof(*t));
    if (!t)
        return false;
    op->deps = t;
    op->deps[op->ndeps++] = (fk_dep_t){ .s = d, .seq = d->enqueued };
    d->refs++;
    return true;
}

/* Queue op on s with its legacy-stream dependencies, or add it to s's capture; starts the
 * worker (lock held; takes op, freed on failure). */
CUresult fk_enqueue(fk_stream_t *s, fk_op_t *op)
{
    if (op->fault == CUDA_SUCCESS)
        op->fault = fk_take_async_fault(); /* an injected fault of this call fails its work */
    if (s->capture)
        return fk_capture_add(s, op);
    fk_ctx_t *ctx = s->ctx;
    if (s->legacy && fk_capture_legacy_conflict(ctx)) {
        fk_op_free(op);
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    /* Legacy default stream semantics. */
    bool ok = true;
    if (s->legacy) {
        for (fk_stream_t *o = ctx->streams; o && ok; o = o->next)
            if (!(o->flags & CU_STREAM_NON_BLOCKING) && o->enqueued > o->done)
                ok = add_dep(op, o);
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING) && ctx->legacy && ctx->legacy->enqueued > ctx->legacy->done) {
        ok = add_dep(op, ctx->legacy);
    }
    if (ok && !s->worker) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        s->refs++;
        s->worker = pthread_create(&t, &attr, worker, s) == 0;
        pthread_attr_destroy(&attr);
        if (!s->worker) {
            s->refs--;
            ok = false;
        }
    }
    if (!ok) {
        fk_op_free(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    while (s->queued >= FK_MAX_QUEUE && !atomic_load(&s->abort))
        cv_wait(0);
    op->seq = ++s->enqueued;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    s->queued++;
    pthread_cond_broadcast(&fk.cv);
    return CUDA_SUCCESS;
}

/* Wait until s has finished operation seq, saying so every 10 s (lock held, dropped while waiting). */
CUresult fk_stream_wait(fk_stream_t *s, uint64_t seq)
{
    uint64_t warn = fk_now_ns() + 10000000000ull;
    s->refs++;
    while (s->done < seq && !atomic_load(&s->abort)) {
        cv_wait(warn);
        if (fk_now_ns() >= warn && s->done < seq) {
            fk_log("still waiting for %s (at operation %llu of %llu after 10 s: stalled, or waiting on a value?)",
                   s->label, (unsigned long long)s->done, (unsigned long long)seq);
            warn = fk_now_ns() + 10000000000ull;
        }
    }
    fk_stream_unref(s);
    return CUDA_SUCCESS;
}

/* Wait for the work enqueued so far on every stream of ctx (every context when NULL). */
static void sync_streams(fk_ctx_t *only)
{
    fk_dep_t snap[FK_MAX_STREAMS];
    int n = 0;
    for (int c = 0; c < fk.cfg.ndev; c++) {
        fk_ctx_t *ctx = &fk.ctx[c];
        if (only && ctx != only)
            continue;
        if (ctx->legacy && n < FK_MAX_STREAMS) {
            snap[n++] = (fk_dep_t){ .s = ctx->legacy, .seq = ctx->legacy->enqueued };
            ctx->legacy->refs++;
        }
        for (fk_stream_t *s = ctx->streams; s && n < FK_MAX_STREAMS; s = s->next) {
            snap[n++] = (fk_dep_t){ .s = s, .seq = s->enqueued };
            s->refs++;
        }
    }
    for (int i = 0; i < n; i++) {
        fk_stream_wait(snap[i].s, snap[i].seq);
        fk_stream_unref(snap[i].s);
    }
}

/* cuCtxSynchronize: every stream of ctx, then its sticky error (lock held). */
CUresult fk_ctx_synchronize(fk_ctx_t *ctx)
{
    sync_streams(ctx);
    return fk_ctx_check(ctx);
}

/* The implicit synchronization of cuMemFree and friends: every stream of every context (lock held). */
void fk_sync_all(const char *what)
{
    (void)what;
    sync_streams(NULL);
}

/* A context goes away: its streams drop their queued work and end, their handles and its
 * events' become invalid (lock held, dropped while the running operations end). */
void fk_streams_ctx_destroyed(fk_ctx_t *ctx)
{
    fk_stream_t *all[FK_MAX_STREAMS];
    bool owned[FK_MAX_STREAMS]; /* its handle (or the context) still holds a reference */
    int n = 0;
    if (ctx->legacy)
        all[n++] = ctx->legacy;
    for (fk_stream_t *s = ctx->streams; s && n < FK_MAX_STREAMS; s = s->next)
        all[n++] = s;
    for (int i = 0; i < n; i++) {
        /* Held while its worker ends below: a stream whose handle was destroyed is still listed
         * until its worker is done, and that worker drops what would be the last reference. */
        all[i]->refs++;
        atomic_store(&all[i]->abort, true);
        owned[i] = all[i]->handle_live;
        if (all[i]->handle_live && !all[i]->legacy)
            fk_handle_del(all[i]);
        all[i]->handle_live = false;
        if (all[i]->capture)
            fk_capture_invalidate(all[i], "destroying the context of a capturing stream");
    }
    pthread_cond_broadcast(&fk.cv);
    /* The running operations end (waits see the abort; kernels run to their end). */
    for (int i = 0; i < n; i++)
        while (all[i]->running || all[i]->worker)
            cv_wait(0);
    ctx->legacy = NULL;
    ctx->streams = NULL;
    for (int i = 0; i < n; i++) {
        if (owned[i])
            all[i]->refs--;      /* the handle's (or the context's) reference: ours remains */
        fk_stream_unref(all[i]); /* this function's own, maybe the last */
    }
    for (fk_event_t **pp = &events; *pp;) {
        fk_event_t *e = *pp;
        if (e->ctx != ctx || !e->handle_live) {
            pp = &e->next;
            continue;
        }
        fk_handle_del(e);
        e->handle_live = false;
        *pp = e->next;
        e->next = NULL;
        fk_event_unref(e);
    }
}

/* ============================================================================================
 * Stream entry points
 * ========================================================================================== */

static CUresult stream_create(CUstream *phStream, unsigned int Flags, int priority)
{
    if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    fk_stream_t *s = NULL;
    if (r == CUDA_SUCCESS && !(s = stream_new(ctx, Flags, priority, false)))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (s) {
        fk_handle_add(s, FK_K_STREAM);
        *phStream = (CUstream)s;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    FK_BEGIN(cuStreamCreate);
    return stream_create(phStream, Flags, 0);
}

/* Priorities are kept (cuStreamGetPriority is not offered) but do not change the scheduling. */
CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    FK_BEGIN(cuStreamCreateWithPriority);
    return stream_create(phStream, flags, priority < -5 ? -5 : priority > 0 ? 0 : priority);
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
    FK_BEGIN(cuStreamDestroy);
    pthread_mutex_lock(&fk.mu);
    fk_stream_t *s = (fk_stream_t *)hStream;
    CUresult r = CUDA_SUCCESS;
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD ||
        !fk_handle_ok(s, FK_K_STREAM)) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        fk_handle_del(s);
        s->handle_live = false;
        if (!s->worker)
            stream_unlink(s); /* nothing queued: no worker will do it */
        pthread_cond_broadcast(&fk.cv);
        fk_stream_unref(s);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* A stream handle resolved (fk.mu held): its context (the current one for the legacy stream) and
 * the stream itself (NULL for the legacy stream). */
static CUresult stream_lookup(CUstream hStream, fk_ctx_t **ctx, fk_stream_t **st)
{
    if (hStream == NULL || hStream == CU_STREAM_LEGACY) {
        *st = NULL;
        *ctx = fk_ctx_current();
        return *ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    if (!fk_handle_ok(hStream, FK_K_STREAM))
        return CUDA_ERROR_INVALID_HANDLE;
    *st = (fk_stream_t *)hStream;
    *ctx = (*st)->ctx;
    return CUDA_SUCCESS;
}

/* The context of a stream (the current one for the legacy stream). */
static CUresult stream_ctx(CUstream hStream, CUcontext *pctx)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *c;
    fk_stream_t *st;
    pthread_mutex_lock(&fk.mu);
    CUresult r = stream_lookup(hStream, &c, &st);
    if (r == CUDA_SUCCESS)
        *pctx = (CUcontext)c;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    FK_BEGIN(cuStreamGetCtx);
    return stream_ctx(hStream, pctx);
}

CUresult CUDAAPI cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    FK_BEGIN(cuStreamGetCtx);
    if (!pGreenCtx)
        return CUDA_ERROR_INVALID_VALUE;
    *pGreenCtx = NULL;
    return stream_ctx(hStream, pCtx);
}

/* A stream's id, unique for the life of the process as the driver's: a user stream's creation number;
 * the legacy stream's names its context's instance (the context's generation), so that the legacy
 * stream of a context reset since has another. */
CUresult CUDAAPI cuStreamGetId(CUstream hStream, unsigned long long *streamId)
{
    FK_BEGIN(cuStreamGetId);
    if (!streamId)
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *c;
    fk_stream_t *st;
    pthread_mutex_lock(&fk.mu);
    CUresult r = stream_lookup(hStream, &c, &st);
    if (r == CUDA_SUCCESS)
        *streamId = st ? st->id : (1ull << 63) | (c->generation * FK_MAX_DEVICES + (unsigned long long)c->dev);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
    FK_BEGIN(cuStreamGetFlags);
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_stream_resolve(hStream, &s, false);
    if (r == CUDA_SUCCESS)
        *flags = s->flags;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
    FK_BEGIN(cuStreamQuery);
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_stream_resolve(hStream, &s, false);
    if (r == CUDA_SUCCESS && s->capture)
        r = fk_capture_invalidate(s, "cuStreamQuery of a capturing stream");
    if (r == CUDA_SUCCESS && s->done < s->enqueued)
        r = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
    FK_BEGIN(cuStreamSynchronize);
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_stream_resolve(hStream, &s, false);
    if (r == CUDA_SUCCESS && s->capture)
        r = fk_capture_invalidate(s, "cuStreamSynchronize of a capturing stream");
    if (r == CUDA_SUCCESS) {
        fk_ctx_t *ctx = s->ctx;
        fk_stream_wait(s, s->enqueued);
        r = fk_ctx_check(ctx);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    FK_BEGIN(cuStreamWaitEvent);
    if (Flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    fk_stream_t *s;
    fk_event_t *e = (fk_event_t *)hEvent;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_handle_ok(e, FK_K_EVENT) ? fk_stream_resolve(hStream, &s, false) : CUDA_ERROR_INVALID_HANDLE;
    bool handled = false;
    if (r == CUDA_SUCCESS)
        r = fk_capture_wait_event(s, e, Flags, &handled);
    if (r == CUDA_SUCCESS && !handled && e->recorded) {
        fk_op_t *op = fk_op_new(FK_OP_NOP);
        if (!op || !add_dep(op, e->rec_s)) {
            free(op);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            op->deps[0].seq = e->rec_seq;
            r = fk_enqueue(s, op);
        }
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    FK_BEGIN(cuLaunchHostFunc);
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_stream_resolve(hStream, &s, false);
    fk_op_t *op = r == CUDA_SUCCESS ? fk_op_new(FK_OP_HOSTFN) : NULL;
    if (r == CUDA_SUCCESS && !op)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (op) {
        op->u.host.fn = fn;
        op->u.host.arg = userData;
        r = fk_enqueue(s, op);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* ============================================================================================
 * Events
 * ========================================================================================== */

void fk_event_unref(fk_event_t *e)
{
    if (--e->refs > 0)
        return;
    if (e->rec_s)
        fk_stream_unref(e->rec_s);
    for (fk_event_t **pp = &events; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    fk.nevents--;
    free(e);
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    FK_BEGIN(cuEventCreate);
    const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (!phEvent || (Flags & ~known) || ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_t *ctx;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_ctx_get(&ctx);
    fk_event_t *e = NULL;
    if (r == CUDA_SUCCESS && (fk.nevents >= FK_MAX_EVENTS || !(e = calloc(1, sizeof(*e)))))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (e) {
        e->ctx = ctx;
        e->flags = Flags;
        e->refs = 1;
        e->handle_live = true;
        e->next = events;
        events = e;
        fk.nevents++;
        fk_handle_add(e, FK_K_EVENT);
        *phEvent = (CUevent)e;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* cuEventRecord(WithFlags): an operation on the stream, or inside a capture a join point or
 * (CU_EVENT_RECORD_EXTERNAL) a node. */
static CUresult event_record(CUevent hEvent, CUstream hStream, unsigned flags)
{
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    fk_event_t *e = (fk_event_t *)hEvent;
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_handle_ok(e, FK_K_EVENT) ? fk_stream_resolve(hStream, &s, false) : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && e->ctx != s->ctx)
        r = CUDA_ERROR_INVALID_HANDLE; /* the event and the stream belong to different contexts */
    if (r == CUDA_SUCCESS && s->capture && !(flags & CU_EVENT_RECORD_EXTERNAL)) {
        fk_capture_record(s, e); /* a point other streams may fork from or join at; no node */
        pthread_mutex_unlock(&fk.mu);
        return CUDA_SUCCESS;
    }
    fk_op_t *op = r == CUDA_SUCCESS ? fk_op_new(FK_OP_RECORD) : NULL;
    if (r == CUDA_SUCCESS && !op)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (op) {
        bool captured = s->capture != NULL;
        op->u.record.ev = e;
        e->refs++;
        r = fk_enqueue(s, op);
        if (r == CUDA_SUCCESS && !captured) {
            s->refs++;
            if (e->rec_s)
                fk_stream_unref(e->rec_s);
            e->rec_s = s;
            e->rec_seq = s->enqueued;
            e->recorded = true;
            e->cap_id = 0;
        }
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    FK_BEGIN(cuEventRecord);
    return event_record(hEvent, hStream, 0);
}

CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    FK_BEGIN(cuEventRecordWithFlags);
    return event_record(hEvent, hStream, flags);
}

/* Has e's last record run? (lock held) */
static bool event_done(const fk_event_t *e)
{
    return !e->recorded || e->rec_s->done >= e->rec_seq || atomic_load(&e->rec_s->abort);
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
    FK_BEGIN(cuEventQuery);
    fk_event_t *e = (fk_event_t *)hEvent;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_handle_ok(e, FK_K_EVENT) ? fk_ctx_check(e->ctx) : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && e->cap_id)
        r = CUDA_ERROR_CAPTURED_EVENT;
    else if (r == CUDA_SUCCESS && !event_done(e))
        r = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
    FK_BEGIN(cuEventSynchronize);
    fk_event_t *e = (fk_event_t *)hEvent;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_handle_ok(e, FK_K_EVENT) ? fk_ctx_check(e->ctx) : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && e->cap_id)
        r = CUDA_ERROR_CAPTURED_EVENT;
    if (r == CUDA_SUCCESS && e->recorded) {
        fk_ctx_t *ctx = e->ctx;
        e->refs++;
        fk_stream_wait(e->rec_s, e->rec_seq);
        fk_event_unref(e);
        r = fk_ctx_check(ctx);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent)
{
    FK_BEGIN(cuEventDestroy);
    fk_event_t *e = (fk_event_t *)hEvent;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_handle_ok(e, FK_K_EVENT) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS) {
        fk_handle_del(e);
        e->handle_live = false;
        fk_event_unref(e); /* pending records keep it until they ran */
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    FK_BEGIN(cuEventElapsedTime);
    fk_event_t *a = (fk_event_t *)hStart, *b = (fk_event_t *)hEnd;
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    CUresult r = CUDA_SUCCESS;
    if (!fk_handle_ok(a, FK_K_EVENT) || !fk_handle_ok(b, FK_K_EVENT) || ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) ||
        !a->recorded || !b->recorded)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!event_done(a) || !event_done(b) || a->stamp_s != a->rec_s || a->stamp_seq != a->rec_seq ||
             b->stamp_s != b->rec_s || b->stamp_seq != b->rec_seq)
        r = CUDA_ERROR_NOT_READY;
    else
        *pMilliseconds = (float)(((double)b->stamp_ns - (double)a->stamp_ns) / 1e6);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}
