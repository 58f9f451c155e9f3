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
 *
 * Tenants in turn (issue 26 row 5): a job of more than one turn (TURN_CHUNKS_PER_THREAD chunks per
 * thread) is not run to its end at once. It waits in its tenant's queue, and each engine round the
 * next tenant in the ring has one turn: that many chunks of its queue's head (and of the jobs
 * behind it while the turn lasts). Between turns the engine admits, matches and runs the small
 * jobs of the other tenants, so another tenant's small collective waits at most one turn, not a
 * whole 256 MiB all-reduce. Once a tenant has jobs queued its later ones queue behind them, so
 * each communicator's collectives and transfers still run in their order; a job whose
 * communicator broke meanwhile ends at its next turn with the communicator's error.
 *
 * Result verification (--verify-results, colld_comm_config_t.verify_results; issue 30 item 3):
 * once an all-reduce, a broadcast or an all-gather has run whole (collctl policy can turn it on
 * for a tenant too), the engine thread checksums every rank's result (XXH3,
 * server/core/verify.c) and compares them; a rank whose result differs from the majority's (from
 * rank 0's without one) fails it with COLLD_ERR_CORRUPTED naming the rank, its pid and the first
 * element that differs, and breaks the communicator, as --nan-check's verdict does.
 */
#include "server/backends/host/host.h"

#include "server/core/daemon.h"
#include "server/core/verify.h"

#include "common/log.h"
#include "common/util.h"
#include "kernels/cpu/reduce.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_BYTES (256u * 1024u) /* per task, per rank */
#define TURN_CHUNKS_PER_THREAD 2u  /* a tenant's turn: this many chunks per pool thread */

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
    uint64_t end_chunk; /* the run's chunks: [first, end_chunk) */
    uint64_t nchunks;   /* how many, end_chunk - first */
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
        if (c >= p->end_chunk)
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

/* A job's chunks: segments of ceil(count / chunk elements) chunks each (0 for an empty job). */
static uint64_t job_chunks(const colld_host_job_t *job, uint64_t *chunk_elems, uint64_t *per_seg)
{
    size_t es = colld_dtype_size(job->dtype);
    uint64_t nseg = job->kind == COLLD_KIND_ALLTOALL ? (uint64_t)job->n * (uint64_t)job->n
                    : job->kind == COLLD_KIND_ALLGATHER || job->kind == COLLD_KIND_REDUCESCATTER ||
                            job->kind == COLLD_KIND_GATHER || job->kind == COLLD_KIND_SCATTER
                        ? (uint64_t)job->n
                        : 1;
    if (es == 0 || job->count == 0)
        return 0;
    *chunk_elems = CHUNK_BYTES / es;
    *per_seg = (job->count + *chunk_elems - 1) / *chunk_elems;
    return *per_seg * nseg;
}

/* Run chunks [first, first + n) of a job (job_chunks numbers them; n past the last: to the end);
 * returns when they are done. Called by the engine thread only. */
static colld_status_t colld_host_pool_run(colld_host_pool_t *p, const colld_host_job_t *job, uint64_t first, uint64_t n)
{
    uint64_t chunk_elems = 0, per_seg = 0, all = job_chunks(job, &chunk_elems, &per_seg);
    if (all == 0 || first >= all)
        return colld_dtype_size(job->dtype) ? COLLD_OK : COLLD_ERR_INVALID_ARGUMENT;
    n = COLLD_MIN(n, all - first);
    if (p->nthreads == 0 || job->count * colld_dtype_size(job->dtype) * (all / per_seg) < p->parallel_min_bytes) {
        colld_status_t st = COLLD_OK;
        for (uint64_t c = first; c < first + n && st == COLLD_OK; c++) {
            uint64_t at = (c % per_seg) * chunk_elems;
            st = run_range(job, c / per_seg, at, COLLD_MIN(chunk_elems, job->count - at));
        }
        return st;
    }

    pthread_mutex_lock(&p->mu);
    /* A worker that woke late for an earlier job may still be in it: let it leave first. */
    while (p->busy > 0)
        pthread_cond_wait(&p->done_cv, &p->mu);
    p->chunk_elems = chunk_elems;
    p->chunks_per_seg = per_seg;
    p->end_chunk = first + n;
    p->nchunks = n;
    atomic_store(&p->next_chunk, first);
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

/* A job of more than one turn, or one behind such a job of its tenant, waiting in its tenant's
 * queue (engine thread). */
typedef struct host_task {
    struct host_task *next;
    colld_coll_t *coll;     /* a collective, or */
    colld_xfer_t *xfer;     /* a transfer */
    uint64_t done, nchunks; /* chunks run, of the job's (job_chunks) */
    bool check_finite;      /* --nan-check (read under the lock when it was queued) */
    uint64_t first_bad[];   /* with check_finite: [nranks], as colld_host_job_t.first_bad */
} host_task_t;

/* A tenant with queued jobs, in the ring of turns (engine thread). */
typedef struct host_tenant {
    struct host_tenant *next;
    uid_t uid;
    host_task_t *head, **tail;
} host_tenant_t;

/* The backend's state: the pool, the matched collectives and the point-to-point transfers to run
 * this round, the tenants' queues of longer jobs (engine thread). */
typedef struct {
    colld_host_pool_t *pool;
    colld_coll_t *batch;
    colld_xfer_t *xfers, **xfers_tail;      /* in matching order */
    host_tenant_t *tenants;                 /* with jobs queued, in turn order */
    host_tenant_t *turn;                    /* whose turn is next (NULL: the first's) */
    host_task_t *finished, **finished_tail; /* queued jobs that ended, posted by after_run */
    uint64_t turn_chunks;                   /* chunks per turn */
    bool nan_check;                         /* --nan-check (the configuration, read at start) */
    bool verify;                            /* --verify-results (the configuration, read at start) */
    bool corrupt;                           /* the test hook --test-corrupt-result R:E is on */
    int corrupt_rank;                       /* its R and E */
    uint64_t corrupt_elem;
    int slot;                               /* colld_dcomm_t.bslot[slot]: its jobs queued here */
} host_t;

/* A communicator's jobs in the tenants' queues: a count in its backend slot (no allocation), so
 * that host_comm_busy costs the same however long the queues are. */
static void comm_queued(const host_t *h, colld_dcomm_t *c, int delta)
{
    c->bslot[h->slot] = (void *)((uintptr_t)c->bslot[h->slot] + (uintptr_t)(intptr_t)delta);
}
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
    h->verify = d->cfg.verify_results;
    h->corrupt = d->cfg.test_corrupt && d->cfg.test_corrupt_rank >= 0;
    h->corrupt_rank = d->cfg.test_corrupt_rank;
    h->corrupt_elem = d->cfg.test_corrupt_elem;
    h->slot = b->slot;
    h->xfers_tail = &h->xfers;
    h->finished_tail = &h->finished;
    h->turn_chunks = TURN_CHUNKS_PER_THREAD * (uint64_t)(h->pool->nthreads + 1);
    b->state = h;
    b->present = true;
    return 0;
}

/* Stop the pool (the engine has stopped and drained the queues: nothing is submitted any more). */
static void host_stop(colld_backend_t *b)
{
    host_t *h = b->state;
    if (!h)
        return;
    assert(!h->tenants && !h->finished);
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

/* The chunks of a collective and of a transfer (job_chunks). */
static uint64_t coll_chunks(const colld_coll_t *k)
{
    const colld_wire_sqe_t *a = &k->ops[0]->d;
    colld_host_job_t job = {
        .kind = (colld_kind_t)a->kind, .dtype = (colld_dtype_t)a->dtype, .count = a->count, .n = k->comm->nranks
    };
    uint64_t elems, per_seg;
    return job_chunks(&job, &elems, &per_seg);
}

static uint64_t xfer_chunks(const colld_xfer_t *x)
{
    colld_host_job_t job = {
        .kind = COLLD_KIND_SEND, .dtype = (colld_dtype_t)x->send->d.dtype, .count = x->send->d.count, .n = 1
    };
    uint64_t elems, per_seg;
    return job_chunks(&job, &elems, &per_seg);
}

/* The queue of a tenant, NULL when it has none. */
static host_tenant_t *tenant_queue(const host_t *h, uid_t uid)
{
    for (host_tenant_t *t = h->tenants; t; t = t->next)
        if (t->uid == uid)
            return t;
    return NULL;
}

static bool checks_finite(const host_t *h, const colld_coll_t *k, const colld_wire_sqe_t *a);

/* Queue a job behind the tenant's others (lock held). Returns false without memory. */
static bool enqueue(host_t *h, uid_t uid, colld_coll_t *k, colld_xfer_t *x, uint64_t nchunks)
{
    int n = k ? k->comm->nranks : 0;
    bool finite = k && checks_finite(h, k, &k->ops[0]->d);
    host_task_t *task = calloc(1, sizeof(*task) + (finite ? (size_t)n * sizeof(uint64_t) : 0));
    host_tenant_t *t = tenant_queue(h, uid);
    if (!task || (!t && !(t = calloc(1, sizeof(*t))))) {
        free(task);
        return false;
    }
    if (!t->tail) { /* new: its first turn comes after every tenant queued before it */
        t->uid = uid;
        t->tail = &t->head;
        host_tenant_t **end = &h->tenants;
        while (*end)
            end = &(*end)->next;
        *end = t;
    }
    task->coll = k;
    task->xfer = x;
    task->nchunks = nchunks;
    task->check_finite = finite;
    for (int r = 0; finite && r < n; r++)
        task->first_bad[r] = UINT64_MAX;
    *t->tail = task;
    t->tail = &task->next;
    comm_queued(h, k ? k->comm : x->comm, +1);
    return true;
}

/* A matched collective of one turn or less, from a tenant with nothing queued, waits in the batch
 * until the engine releases the lock; a longer one, or one of a tenant with jobs queued, goes to
 * the end of its tenant's queue (lock held). */
static void host_submit(colld_backend_t *b, colld_coll_t *k)
{
    host_t *h = b->state;
    uint64_t n = coll_chunks(k);
    if (!tenant_queue(h, k->comm->tenant) && n <= h->turn_chunks) {
        k->next = h->batch;
        h->batch = k;
        return;
    }
    if (enqueue(h, k->comm->tenant, k, NULL, n))
        return;
    colld_comm_break(b->d, k->comm, COLLD_ERR_NO_MEMORY, -1, "the daemon is out of memory (host backend queue)");
    k->status = COLLD_ERR_NO_MEMORY;
    colld_engine_finish(b->d, k);
}

/* A matched send and receive: the same, in the batch's list of transfers (lock held). */
static void host_xfer_submit(colld_backend_t *b, colld_xfer_t *x)
{
    host_t *h = b->state;
    uint64_t n = xfer_chunks(x);
    if (!tenant_queue(h, x->comm->tenant) && n <= h->turn_chunks) {
        x->next = NULL;
        *h->xfers_tail = x;
        h->xfers_tail = &x->next;
        return;
    }
    if (enqueue(h, x->comm->tenant, NULL, x, n))
        return;
    colld_comm_break(b->d, x->comm, COLLD_ERR_NO_MEMORY, -1, "the daemon is out of memory (host backend queue)");
    x->status = COLLD_ERR_NO_MEMORY;
    colld_p2p_finish(b->d, x);
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

/* The job of a matched collective, over arrays of nranks the caller keeps (lock not held). */
static colld_host_job_t coll_job(const colld_coll_t *k, const void **in, void **out, uint64_t *scalars,
                                 uint64_t *first_bad)
{
    int n = k->comm->nranks;
    for (int r = 0; r < n; r++) {
        in[r] = k->ops[r]->send_ptr;
        out[r] = k->ops[r]->recv_ptr;
        scalars[r] = colld_wire_sqe_scalar(&k->ops[r]->d); /* each rank's own (admission checked it) */
    }
    const colld_wire_sqe_t *a = &k->ops[0]->d;
    bool premul = colld_kind_has_op(a->kind) && a->redop == COLLD_REDOP_PREMUL_SUM;
    return (colld_host_job_t){
        .kind = (colld_kind_t)a->kind,
        .dtype = (colld_dtype_t)a->dtype,
        .op = (colld_redop_t)a->redop,
        .root = a->root,
        .count = a->count,
        .n = n,
        .in = in,
        .out = out,
        .first_bad = first_bad,
        .scalars = premul ? scalars : NULL,
    };
}

/* Run chunks [first, first + nchunks) of a matched collective on the pool (lock not held);
 * first_bad: NULL, or --nan-check's [nranks] kept across the calls. */
static colld_status_t execute(host_t *h, colld_coll_t *k, uint64_t first, uint64_t nchunks, uint64_t *first_bad)
{
    const void *in[COLLD_MAX_RANKS];
    void *out[COLLD_MAX_RANKS];
    uint64_t scalars[COLLD_MAX_RANKS];
    colld_host_job_t job = coll_job(k, in, out, scalars, first_bad);
    return colld_host_pool_run(h->pool, &job, first, nchunks);
}

/* Copy chunks [first, first + nchunks) of one transfer on the pool (lock not held): the sender's
 * buffer into the receiver's. */
static colld_status_t transfer(host_t *h, const colld_xfer_t *x, uint64_t first, uint64_t nchunks)
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
    return colld_host_pool_run(h->pool, &job, first, nchunks);
}

/* --nan-check's verdict on a collective that ran, from its first_bad (finite_verdict). */
static colld_status_t coll_verdict(colld_coll_t *k, uint64_t *first_bad)
{
    const void *in[COLLD_MAX_RANKS];
    void *out[COLLD_MAX_RANKS];
    uint64_t scalars[COLLD_MAX_RANKS];
    colld_host_job_t job = coll_job(k, in, out, scalars, first_bad);
    return finite_verdict(k, &job);
}

/* ============================================================================================
 * Result verification (--verify-results, colld_comm_config_t.verify_results)
 * ========================================================================================== */

/* Whether a collective's results are verified: an all-reduce, broadcast or all-gather (whose
 * result must be the same on every rank) of more than one rank on a communicator that asks for it
 * (the flags are fixed once it formed). Reduce and reduce-scatter are not: each of their results
 * exists on one rank only, and checking it would take a second reduction. */
static bool verifies(const host_t *h, const colld_coll_t *k)
{
    const colld_dcomm_t *c = k->comm;
    return colld_verify_kind(k->ops[0]->d.kind) && c->nranks > 1 && k->ops[0]->d.count > 0 && (h->verify || c->verify);
}

/* The verdict on an all-reduce that ran: the checksum of every rank's result, and
 * COLLD_ERR_CORRUPTED naming every rank whose result differs from the reference (the result a
 * strict majority of ranks holds, else rank 0's), its pid, its checksum and the first element that
 * differs, in k->why; COLLD_OK when all agree (lock not held). The test hook --test-corrupt-result
 * R:E flips element E of rank R's result first. */
static colld_status_t verify_verdict(host_t *h, colld_coll_t *k)
{
    const colld_wire_sqe_t *a = &k->ops[0]->d;
    int n = k->comm->nranks;
    size_t es = colld_dtype_size((colld_dtype_t)a->dtype);
    /* the result's elements: an all-gather's are every rank's count */
    uint64_t count = a->kind == COLLD_KIND_ALLGATHER ? a->count * (uint64_t)n : a->count;
    uint64_t sums[COLLD_MAX_RANKS], bytes = count * es;
    if (h->corrupt && h->corrupt_rank < n && h->corrupt_elem < count)
        ((unsigned char *)k->ops[h->corrupt_rank]->recv_ptr)[h->corrupt_elem * es] ^= 0x01; /* TEST HOOK */
    for (int r = 0; r < n; r++)
        sums[r] = colld_verify_sum(k->ops[r]->recv_ptr, bytes);
    int ref;
    bool majority;
    int differ = colld_verify_verdict(sums, n, &ref, &majority);
    if (!differ)
        return COLLD_OK;
    int off = snprintf(k->why, sizeof(k->why), "result verification: ");
    int named = 0;
    for (int r = 0; r < n && off < (int)sizeof(k->why) - 96; r++) {
        if (sums[r] == sums[ref])
            continue;
        uint64_t e = colld_verify_first_diff(k->ops[r]->recv_ptr, k->ops[ref]->recv_ptr, count, es);
        off += snprintf(
            k->why + off, sizeof(k->why) - (size_t)off,
            "%srank %d (pid %d) result differs from rank %d's from element %llu (XXH3 %016llx, not %016llx)",
            named++ ? "; " : "", r, (int)k->comm->ranks[r].pid, ref, (unsigned long long)e, (unsigned long long)sums[r],
            (unsigned long long)sums[ref]);
    }
    if (off < (int)sizeof(k->why))
        snprintf(k->why + off, sizeof(k->why) - (size_t)off, " (%s %s, %d of %d ranks agree%s)",
                 colld_kind_name(a->kind), colld_dtype_name((colld_dtype_t)a->dtype), n - differ, n,
                 majority ? "" : ": no majority, either may be the corrupted one");
    return COLLD_ERR_CORRUPTED;
}

/* Run a whole collective of the batch (lock not held). */
static void run_whole(host_t *h, colld_coll_t *k)
{
    uint64_t first_bad[COLLD_MAX_RANKS];
    bool finite = checks_finite(h, k, &k->ops[0]->d);
    for (int r = 0; finite && r < k->comm->nranks; r++)
        first_bad[r] = UINT64_MAX;
    k->start_ns = colld_now_ns();
    k->status = execute(h, k, 0, UINT64_MAX, finite ? first_bad : NULL);
    if (k->status == COLLD_OK && finite)
        k->status = coll_verdict(k, first_bad);
    if (k->status == COLLD_OK && verifies(h, k))
        k->status = verify_verdict(h, k);
    k->end_ns = colld_now_ns();
}

/* A queued job ended with st: off its tenant's queue (its head) to the finished list. */
static void task_end(host_t *h, host_tenant_t *t, colld_status_t st)
{
    host_task_t *task = t->head;
    uint64_t now = colld_now_ns();
    comm_queued(h, task->coll ? task->coll->comm : task->xfer->comm, -1);
    t->head = task->next;
    if (!t->head)
        t->tail = &t->head;
    task->next = NULL;
    *h->finished_tail = task;
    h->finished_tail = &task->next;
    if (task->coll) {
        colld_coll_t *k = task->coll;
        if (st == COLLD_OK && task->check_finite)
            st = coll_verdict(k, task->first_bad);
        if (st == COLLD_OK && verifies(h, k))
            st = verify_verdict(h, k);
        k->status = st;
        k->end_ns = now;
        if (!k->start_ns)
            k->start_ns = now;
    } else {
        task->xfer->status = st;
        task->xfer->end_ns = now;
        if (!task->xfer->start_ns)
            task->xfer->start_ns = now;
    }
}

/* Take a tenant off the ring once its queue is empty. */
static void tenant_drop_if_empty(host_t *h, host_tenant_t *t)
{
    if (t->head)
        return;
    for (host_tenant_t **p = &h->tenants; *p; p = &(*p)->next)
        if (*p == t) {
            *p = t->next;
            break;
        }
    if (h->turn == t)
        h->turn = t->next;
    free(t);
}

/* The next tenant's turn: up to turn_chunks chunks of its queue, head first (lock not held). */
static void serve_turn(host_t *h)
{
    host_tenant_t *t = h->turn ? h->turn : h->tenants;
    uint64_t budget = h->turn_chunks;
    while (budget > 0 && t->head) {
        host_task_t *task = t->head;
        uint64_t n = COLLD_MIN(budget, task->nchunks - task->done);
        uint64_t now = colld_now_ns();
        colld_status_t st;
        if (task->coll) {
            if (!task->coll->start_ns)
                task->coll->start_ns = now;
            st = execute(h, task->coll, task->done, n, task->check_finite ? task->first_bad : NULL);
        } else {
            if (!task->xfer->start_ns)
                task->xfer->start_ns = now;
            st = transfer(h, task->xfer, task->done, n);
        }
        task->done += n;
        budget -= n;
        if (st != COLLD_OK || task->done >= task->nchunks)
            task_end(h, t, st);
    }
    h->turn = t->next;
    tenant_drop_if_empty(h, t);
}

/* Run the batch and the transfers whole, then one tenant's turn (engine thread, lock not held);
 * each keeps its status and times. The lists are the engine thread's own until after_run. */
static bool host_run_unlocked(colld_backend_t *b)
{
    host_t *h = b->state;
    if (!h->batch && !h->xfers && !h->tenants)
        return false;
    for (colld_coll_t *k = h->batch; k; k = k->next)
        run_whole(h, k);
    for (colld_xfer_t *x = h->xfers; x; x = x->next) {
        x->start_ns = colld_now_ns();
        x->status = transfer(h, x, 0, UINT64_MAX);
        x->end_ns = colld_now_ns();
    }
    if (h->tenants)
        serve_turn(h);
    return true;
}

/* Post one executed collective (lock held). One refused by --nan-check or by result verification
 * breaks its communicator with the verdict, so that every rank (and every later operation) learns
 * it. */
static void post_coll(colld_backend_t *b, colld_coll_t *k)
{
    if (k->status == COLLD_ERR_NUMERIC || k->status == COLLD_ERR_CORRUPTED) {
        LOG_WARN(ENGINE, "communicator %llu: %s", (unsigned long long)k->comm->id, k->why);
        colld_comm_break(b->d, k->comm, k->status, -1, k->why);
    }
    colld_engine_finish(b->d, k);
}

/* A queued job at the head of its tenant's queue whose communicator broke ends now with the
 * communicator's error, instead of running on for nobody (lock held). */
static void end_broken_heads(host_t *h)
{
    for (host_tenant_t *t = h->tenants, *next; t; t = next) {
        next = t->next;
        for (;;) {
            host_task_t *task = t->head;
            colld_dcomm_t *c = task ? (task->coll ? task->coll->comm : task->xfer->comm) : NULL;
            if (!c || c->state != COLLD_COMM_BROKEN)
                break;
            task_end(h, t, c->error);
        }
        tenant_drop_if_empty(h, t);
    }
}

/* Post the results: the batch, the transfers, the queued jobs that ended (lock held). */
static void host_after_run(colld_backend_t *b)
{
    host_t *h = b->state;
    end_broken_heads(h);
    while (h->batch) {
        colld_coll_t *k = h->batch;
        h->batch = k->next;
        post_coll(b, k);
    }
    while (h->xfers) {
        colld_xfer_t *x = h->xfers;
        h->xfers = x->next;
        colld_p2p_finish(b->d, x);
    }
    h->xfers_tail = &h->xfers;
    while (h->finished) {
        host_task_t *task = h->finished;
        h->finished = task->next;
        if (task->coll)
            post_coll(b, task->coll);
        else
            colld_p2p_finish(b->d, task->xfer);
        free(task);
    }
    h->finished_tail = &h->finished;
}

/* The engine stops (lock held; sessions are gone): every queued job ends, DAEMON_LOST. */
static void host_drain(colld_backend_t *b)
{
    host_t *h = b->state;
    while (h->tenants) {
        host_tenant_t *t = h->tenants;
        while (t->head)
            task_end(h, t, COLLD_ERR_DAEMON_LOST);
        tenant_drop_if_empty(h, t);
    }
    host_after_run(b);
}

/* The communicator has queued jobs here: a collective another backend claims waits for them. */
static bool host_comm_busy(const colld_backend_t *b, const colld_dcomm_t *c)
{
    const host_t *h = b->state;
    return c->bslot[h->slot] != NULL;
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
    .comm_busy = host_comm_busy,
    .drain = host_drain,
};
