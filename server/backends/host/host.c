/*
 * host.c - the host backend: a pool of worker threads that run collectives directly on the ranks'
 * mapped buffers (zero copy). It claims every collective no other backend claims (registered last,
 * server/registry.c.in): the engine hands it matched collectives under the lock (submit), and runs them
 * outside the lock on its own thread (run_unlocked), the caller taking part in the work.
 *
 * Every collective is a set of segments, each split into chunks that the workers take:
 *   allreduce      1 segment:  all n inputs -> all n outputs (reduced once, written n times)
 *   reduce         1 segment:  all n inputs -> the root's output
 *   reducescatter  n segments: segment q reduces slice q of every input into rank q's output
 *   broadcast      1 segment:  the root's input copied to every output
 *   allgather      n segments: segment r copies rank r's input into slice r of every output
 *   gather         n segments: segment r copies rank r's input into slice r of the root's output
 *   scatter        n segments: segment r copies slice r of the root's input into rank r's output
 *   alltoall       n*n segments: segment r*n+q copies slice q of rank r's input into slice r of
 *                  rank q's output
 *   send/recv      1 segment:  a point-to-point transfer (colld_xfer_t, p2p.c): the sender's
 *                  input copied into the receiver's output (a job of one "rank")
 * A reduction chunk reads element i of every input in rank order and writes the result to every
 * output in one pass (kernels/cpu; a premultiplied sum with each rank's own scalar word from its
 * descriptor), so the memory traffic is the minimum possible and in-place
 * buffers are safe. Every element is produced by exactly one thread in a fixed order, so results
 * do not depend on the number of workers. Small jobs run on the calling (engine) thread alone,
 * since waking workers costs more than the work.
 */
#include "server/backends/host/host.h"

#include "server/core/daemon.h"

#include "common/log.h"
#include "common/util.h"
#include "kernels/cpu/reduce.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_BYTES (256u * 1024u) /* per task, per rank */

/* One collective over mapped buffers, as the pool runs it. */
typedef struct {
    colld_kind_t kind;
    colld_dtype_t dtype;
    colld_redop_t op;
    int root;
    uint64_t count;
    int n;                   /* ranks */
    const void **in;         /* [n] */
    void **out;              /* [n] */
    uint64_t *first_bad;     /* --nan-check: [n] lowest index of a NaN or infinity in each rank's
                             input (UINT64_MAX: none), atomic; NULL: no check */
    const uint64_t *scalars; /* a premultiplied sum: [n] each rank's scalar word; else NULL */
} colld_host_job_t;

typedef struct colld_host_pool colld_host_pool_t;

struct colld_host_pool {
    int nthreads;
    uint64_t parallel_min_bytes; /* below this the engine thread does a job alone */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    bool stop;
    uint64_t generation; /* bumped per job so workers notice a new one */
    const colld_host_job_t *job;
    uint64_t chunk_elems;
    uint64_t chunks_per_seg;
    uint64_t nchunks;
    atomic_uint_fast64_t next_chunk;
    atomic_uint_fast64_t chunks_done;
    atomic_int failed; /* first error status, 0 if none */
    int busy;          /* workers inside the current job */
};

/* Copy len bytes to every destination that is not the source itself (in-place). memmove: one
 * process may hold several ranks whose buffers share a registration, and admission checks only
 * each rank's own pair of buffers. */
static void copy_to_all(const char *src, char *const *dst, int n, size_t offset, size_t len)
{
    for (int r = 0; r < n; r++) {
        char *d = dst[r] + offset;
        if (d != src)
            memmove(d, src, len);
    }
}

/* --nan-check: note the first non-finite element among `len` of every rank's input from element
 * `base` (each chunk looks at what it is about to reduce, while it is in cache). */
static void check_finite(const colld_host_job_t *job, const void *const *in, uint64_t base, uint64_t len)
{
    for (int r = 0; r < job->n; r++) {
        size_t i = colld_cpu_first_nonfinite(job->dtype, in[r], (size_t)len);
        if (i == len)
            continue;
        uint64_t at = base + i, cur = __atomic_load_n(&job->first_bad[r], __ATOMIC_RELAXED);
        while (at < cur &&
               !__atomic_compare_exchange_n(&job->first_bad[r], &cur, at, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            ;
    }
}

/* Reduce len elements of the job's n inputs into n_out outputs: its op, or the premultiplied sum. */
static colld_status_t reduce(const colld_host_job_t *job, const void *const *in, void *const *out, int n_out,
                             uint64_t len)
{
    if (job->scalars)
        return colld_cpu_reduce_premul(job->dtype, job->scalars, in, job->n, out, n_out, (size_t)len);
    return colld_cpu_reduce(job->dtype, job->op, in, job->n, out, n_out, (size_t)len);
}

/* Run elements [first, first+len) of segment `seg` of a job. */
static colld_status_t run_range(const colld_host_job_t *job, uint64_t seg, uint64_t first, uint64_t len)
{
    size_t es = colld_dtype_size(job->dtype);
    const void *in[COLLD_MAX_RANKS];
    void *out[COLLD_MAX_RANKS];
    int n = job->n;
    switch (job->kind) {
    case COLLD_KIND_ALLREDUCE:
        for (int r = 0; r < n; r++) {
            in[r] = (const char *)job->in[r] + first * es;
            out[r] = (char *)job->out[r] + first * es;
        }
        if (job->first_bad)
            check_finite(job, in, first, len);
        return reduce(job, in, out, n, len);
    case COLLD_KIND_REDUCE:
    case COLLD_KIND_REDUCESCATTER: {
        int dst = job->kind == COLLD_KIND_REDUCE ? job->root : (int)seg;
        uint64_t base = job->kind == COLLD_KIND_REDUCE ? first : seg * job->count + first;
        for (int r = 0; r < n; r++)
            in[r] = (const char *)job->in[r] + base * es;
        out[0] = (char *)job->out[dst] + first * es;
        if (job->first_bad)
            check_finite(job, in, base, len);
        return reduce(job, in, out, 1, len);
    }
    case COLLD_KIND_BROADCAST:
        copy_to_all((const char *)job->in[job->root] + first * es, (char *const *)job->out, n, first * es, len * es);
        return COLLD_OK;
    case COLLD_KIND_ALLGATHER:
        copy_to_all((const char *)job->in[seg] + first * es, (char *const *)job->out, n,
                    (seg * job->count + first) * es, len * es);
        return COLLD_OK;
    case COLLD_KIND_GATHER:
        copy_to_all((const char *)job->in[seg] + first * es, (char *const *)&job->out[job->root], 1,
                    (seg * job->count + first) * es, len * es);
        return COLLD_OK;
    case COLLD_KIND_SCATTER:
        copy_to_all((const char *)job->in[job->root] + (seg * job->count + first) * es, (char *const *)&job->out[seg],
                    1, first * es, len * es);
        return COLLD_OK;
    case COLLD_KIND_ALLTOALL: {
        uint64_t r = seg / (uint64_t)n, q = seg % (uint64_t)n;
        copy_to_all((const char *)job->in[r] + (q * job->count + first) * es, (char *const *)&job->out[q], 1,
                    (r * job->count + first) * es, len * es);
        return COLLD_OK;
    }
    case COLLD_KIND_SEND:
    case COLLD_KIND_RECV:
        copy_to_all((const char *)job->in[0] + first * es, (char *const *)job->out, 1, first * es, len * es);
        return COLLD_OK;
    }
    return COLLD_ERR_INVALID_ARGUMENT;
}

/* Run one chunk of the current job: chunk c is range (c % chunks per segment) of segment
 * (c / chunks per segment). */
static void run_chunk(colld_host_pool_t *p, const colld_host_job_t *job, uint64_t chunk)
{
    uint64_t seg = chunk / p->chunks_per_seg;
    uint64_t first = (chunk % p->chunks_per_seg) * p->chunk_elems;
    uint64_t len = COLLD_MIN(p->chunk_elems, job->count - first);
    colld_status_t st = run_range(job, seg, first, len);
    if (st != COLLD_OK) {
        int expected = 0;
        atomic_compare_exchange_strong(&p->failed, &expected, (int)st);
    }
}

/* Take chunks until none are left; returns after the last one this thread took. */
static void take_chunks(colld_host_pool_t *p, const colld_host_job_t *job)
{
    for (;;) {
        uint64_t c = atomic_fetch_add(&p->next_chunk, 1);
        if (c >= p->nchunks)
            return;
        run_chunk(p, job, c);
        atomic_fetch_add(&p->chunks_done, 1);
    }
}

static void *worker_main(void *arg)
{
    colld_host_pool_t *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop)
            break;
        seen = p->generation;
        const colld_host_job_t *job = p->job;
        p->busy++;
        pthread_mutex_unlock(&p->mu);
        if (job) /* NULL: woke after that job had already finished */
            take_chunks(p, job);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0)
            pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void colld_host_pool_destroy(colld_host_pool_t *p);

/* Create a pool of nthreads-1 workers (the caller of colld_host_pool_run is the last one). */
static int colld_host_pool_create(int nthreads, uint64_t parallel_min_bytes, colld_host_pool_t **out)
{
    colld_host_pool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return -1;
    p->parallel_min_bytes = parallel_min_bytes;
    p->nthreads = nthreads > 1 ? nthreads - 1 : 0;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    if (p->nthreads) {
        p->threads = calloc((size_t)p->nthreads, sizeof(*p->threads));
        if (!p->threads)
            goto fail;
    }
    for (int i = 0; i < p->nthreads; i++)
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            p->nthreads = i;
            goto fail;
        }
    *out = p;
    return 0;
fail:
    colld_host_pool_destroy(p);
    return -1;
}

/* Stop and join the workers, free the pool. NULL is a no-op. */
static void colld_host_pool_destroy(colld_host_pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p);
}

/* Run a collective; returns when every element is done. Called by the engine thread only. */
static colld_status_t colld_host_pool_run(colld_host_pool_t *p, const colld_host_job_t *job)
{
    if (job->count == 0)
        return COLLD_OK;
    size_t es = colld_dtype_size(job->dtype);
    if (es == 0)
        return COLLD_ERR_INVALID_ARGUMENT;
    uint64_t nseg = job->kind == COLLD_KIND_ALLTOALL ? (uint64_t)job->n * (uint64_t)job->n
                    : job->kind == COLLD_KIND_ALLGATHER || job->kind == COLLD_KIND_REDUCESCATTER ||
                            job->kind == COLLD_KIND_GATHER || job->kind == COLLD_KIND_SCATTER
                        ? (uint64_t)job->n
                        : 1;
    if (p->nthreads == 0 || job->count * es * nseg < p->parallel_min_bytes) {
        colld_status_t st = COLLD_OK;
        for (uint64_t seg = 0; seg < nseg && st == COLLD_OK; seg++)
            st = run_range(job, seg, 0, job->count);
        return st;
    }

    pthread_mutex_lock(&p->mu);
    /* A worker that woke late for an earlier job may still be in it: let it leave first. */
    while (p->busy > 0)
        pthread_cond_wait(&p->done_cv, &p->mu);
    p->chunk_elems = CHUNK_BYTES / es;
    p->chunks_per_seg = (job->count + p->chunk_elems - 1) / p->chunk_elems;
    p->nchunks = p->chunks_per_seg * nseg;
    atomic_store(&p->next_chunk, 0);
    atomic_store(&p->chunks_done, 0);
    atomic_store(&p->failed, 0);
    p->job = job;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);

    take_chunks(p, job);

    /* Wait until every worker that joined this job has left it, so none still reads `job`. */
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0 || atomic_load(&p->chunks_done) < p->nchunks)
        pthread_cond_wait(&p->done_cv, &p->mu);
    p->job = NULL;
    pthread_mutex_unlock(&p->mu);
    int failed = atomic_load(&p->failed);
    return failed ? (colld_status_t)failed : COLLD_OK;
}

/* ============================================================================================
 * The backend
 * ========================================================================================== */

/* The backend's state: the pool, the matched collectives and the point-to-point transfers
 * waiting to run (engine thread). */
typedef struct {
    colld_host_pool_t *pool;
    colld_coll_t *batch;
    colld_xfer_t *xfers, **xfers_tail; /* in matching order */
    bool nan_check;                    /* --nan-check (the configuration, read at start) */
} host_t;

/* Start the pool: --workers threads, the engine's own included. */
static int host_start(colld_backend_t *b)
{
    colld_daemon_t *d = b->d;
    host_t *h = calloc(1, sizeof(*h));
    if (!h || colld_host_pool_create((int)d->cfg.workers, d->cfg.parallel_min_bytes, &h->pool) < 0) {
        LOG_ERROR(ENGINE, "cannot start %lld host workers", (long long)d->cfg.workers);
        free(h);
        return -1;
    }
    h->nan_check = d->cfg.nan_check;
    h->xfers_tail = &h->xfers;
    b->state = h;
    b->present = true;
    return 0;
}

/* Stop the pool (the engine has stopped: nothing is submitted any more). */
static void host_stop(colld_backend_t *b)
{
    host_t *h = b->state;
    if (!h)
        return;
    colld_host_pool_destroy(h->pool);
    free(h);
    b->state = NULL;
}

/* It runs whatever no backend before it claimed. */
static bool host_claims(const colld_backend_t *b, const colld_dcomm_t *c, const colld_wire_sqe_t *sqe)
{
    (void)b, (void)c, (void)sqe;
    return true;
}

/* A matched collective waits in the batch until the engine releases the lock (lock held). */
static void host_submit(colld_backend_t *b, colld_coll_t *k)
{
    host_t *h = b->state;
    k->next = h->batch;
    h->batch = k;
}

/* A matched send and receive wait with the collectives until the engine releases the lock (lock
 * held). */
static void host_xfer_submit(colld_backend_t *b, colld_xfer_t *x)
{
    host_t *h = b->state;
    x->next = NULL;
    *h->xfers_tail = x;
    h->xfers_tail = &x->next;
}

/* Whether a collective's inputs are checked for NaN and infinities: --nan-check (the daemon's, or
 * its communicator's), a reduction, a floating-point dtype. */
static bool checks_finite(const host_t *h, const colld_coll_t *k, const colld_wire_sqe_t *a)
{
    return (h->nan_check || k->comm->nan_check) && colld_kind_has_op(a->kind) &&
           (a->dtype == COLLD_FLOAT16 || a->dtype == COLLD_BFLOAT16 || a->dtype == COLLD_FLOAT32 ||
            a->dtype == COLLD_FLOAT64);
}

/* The verdict of --nan-check: COLLD_ERR_NUMERIC naming every rank whose input held a NaN or an
 * infinity (its first one, by index and kind) in k->why; COLLD_OK when none did. */
static colld_status_t finite_verdict(colld_coll_t *k, const colld_host_job_t *job)
{
    int off = 0, bad = 0;
    size_t es = colld_dtype_size(job->dtype);
    for (int r = 0; r < job->n && off < (int)sizeof(k->why) - 80; r++) {
        if (job->first_bad[r] == UINT64_MAX)
            continue;
        const char *elem = (const char *)job->in[r] + job->first_bad[r] * es;
        off += snprintf(k->why + off, sizeof(k->why) - (size_t)off, "%srank %d contributed %s at element %llu",
                        bad++ ? "; " : "", r, colld_cpu_nonfinite_name(job->dtype, elem),
                        (unsigned long long)job->first_bad[r]);
    }
    if (!bad)
        return COLLD_OK;
    off += snprintf(k->why + off, sizeof(k->why) - (size_t)off, " (%s %s, --nan-check)",
                    colld_kind_name(k->ops[0]->d.kind), colld_dtype_name(job->dtype));
    return COLLD_ERR_NUMERIC;
}

/* Run one matched collective on the pool (lock not held). */
static colld_status_t execute(host_t *h, colld_coll_t *k)
{
    int n = k->comm->nranks;
    const void *in[COLLD_MAX_RANKS];
    void *out[COLLD_MAX_RANKS];
    uint64_t first_bad[COLLD_MAX_RANKS], scalars[COLLD_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        in[r] = k->ops[r]->send_ptr;
        out[r] = k->ops[r]->recv_ptr;
        first_bad[r] = UINT64_MAX;
        scalars[r] = colld_wire_sqe_scalar(&k->ops[r]->d); /* each rank's own (admission checked it) */
    }
    const colld_wire_sqe_t *a = &k->ops[0]->d;
    bool premul = colld_kind_has_op(a->kind) && a->redop == COLLD_REDOP_PREMUL_SUM;
    colld_host_job_t job = {
        .kind = (colld_kind_t)a->kind,
        .dtype = (colld_dtype_t)a->dtype,
        .op = (colld_redop_t)a->redop,
        .root = a->root,
        .count = a->count,
        .n = n,
        .in = in,
        .out = out,
        .first_bad = checks_finite(h, k, a) ? first_bad : NULL,
        .scalars = premul ? scalars : NULL,
    };
    colld_status_t st = colld_host_pool_run(h->pool, &job);
    return st == COLLD_OK && job.first_bad ? finite_verdict(k, &job) : st;
}

/* Copy one transfer on the pool (lock not held): the sender's buffer into the receiver's. */
static colld_status_t transfer(host_t *h, const colld_xfer_t *x)
{
    const void *in[1] = { x->send->send_ptr };
    void *out[1] = { x->recv->recv_ptr };
    colld_host_job_t job = {
        .kind = COLLD_KIND_SEND,
        .dtype = (colld_dtype_t)x->send->d.dtype,
        .count = x->send->d.count,
        .n = 1,
        .in = in,
        .out = out,
    };
    return colld_host_pool_run(h->pool, &job);
}

/* Run the batch and the transfers (engine thread, lock not held); each keeps its status and
 * times. The lists are the engine thread's own until after_run. */
static bool host_run_unlocked(colld_backend_t *b)
{
    host_t *h = b->state;
    if (!h->batch && !h->xfers)
        return false;
    for (colld_coll_t *k = h->batch; k; k = k->next) {
        k->start_ns = colld_now_ns();
        k->status = execute(h, k);
        k->end_ns = colld_now_ns();
    }
    for (colld_xfer_t *x = h->xfers; x; x = x->next) {
        x->start_ns = colld_now_ns();
        x->status = transfer(h, x);
        x->end_ns = colld_now_ns();
    }
    return true;
}

/* Post the batch's results (lock held). A collective refused by --nan-check breaks its
 * communicator with the verdict, so that every rank (and every later operation) learns it. */
static void host_after_run(colld_backend_t *b)
{
    host_t *h = b->state;
    while (h->batch) {
        colld_coll_t *k = h->batch;
        h->batch = k->next;
        if (k->status == COLLD_ERR_NUMERIC) {
            LOG_WARN(ENGINE, "communicator %llu: %s", (unsigned long long)k->comm->id, k->why);
            colld_comm_break(b->d, k->comm, k->status, -1, k->why);
        }
        colld_engine_finish(b->d, k);
    }
    while (h->xfers) {
        colld_xfer_t *x = h->xfers;
        h->xfers = x->next;
        colld_p2p_finish(b->d, x);
    }
    h->xfers_tail = &h->xfers;
}

const colld_backend_ops_t colld_host_backend = {
    .name = "host",
    .start = host_start,
    .stop = host_stop,
    .claims = host_claims,
    .submit = host_submit,
    .xfer_submit = host_xfer_submit,
    .run_unlocked = host_run_unlocked,
    .after_run = host_after_run,
};
