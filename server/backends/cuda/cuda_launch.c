/*
 * cuda_launch.c - the CUDA backend's launch layer, shared by the collectives (cuda_coll.c), the
 * sends and receives (cuda_p2p.c) and the plans (cuda_plan.c): a communicator's stream on a GPU,
 * the drain of a launch that failed part-way, the poll of a launch's event and what its failure
 * says, the due time of work whose ranks' streams never got there, and whether a collective's
 * GPUs can run it. Then the launch of a stream-ordered collective itself (engine thread,
 * daemon->lock NOT held: the collective's ops and registrations stay put while it is on the
 * backend's launch list).
 *
 * A collective's launch, in steps: the plan (which GPUs hold the ranks' buffers, the lead GPU), the check that
 * those GPUs reach each other's memory, the communicator's stream on each, the kernels (kernels/
 * cuda: one per GPU over its slice for all-reduce, reduce and broadcast; one per rank's piece for
 * reduce-scatter and all-gather; one copy per block for gather, scatter and all-to-all), then the
 * lead GPU's stream waits for the others, writes every
 * rank's `done` flag and records the event the engine polls. A hand-off without the host (issue 28,
 * cuda_handoff.c: one GPU) puts its stream waits on the ranks' ready slots and its gate kernel
 * first, gates the kernels on it, and writes the done flags with its done kernel instead. A plan's run (cuda_plan.c, a
 * collective captured into a CUDA graph) is launched the same way; only its `done` flags are the
 * ranks' plan lines.
 */
#include "server/backends/cuda/cuda.h"

#include "common/util.h"
#include "kernels/cuda/cuda_kernels.h"

#include <stddef.h>
#include <stdio.h>

#define MAX_GPUS 64

/* ============================================================================================
 * The launch layer
 * ========================================================================================== */

CUresult cuda_comm_stream(const colld_gpus_t *g, gpu_comm_t *gc, int gi)
{
    if (gc->stream[gi])
        return CUDA_SUCCESS;
    return CU_CHECK(g->cu, cuStreamCreate, &gc->stream[gi], CU_STREAM_NON_BLOCKING);
}

/* What a failed launch did enqueue (a kernel, the `done` writes of some ranks) still runs: waiting
 * for it before the work fails means that its release of the ranks' streams is written after those
 * `done` writes (never moved backwards by one) and its registrations are let go only once no
 * kernel reads them (issue 15 F2). */
void cuda_stream_drain(colld_gpus_t *g, int gi, CUstream stream)
{
    CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[gi].ctx);
    cuda_gpu_fault(g, gi, CU_CHECK(g->cu, cuStreamSynchronize, stream)); /* sticky: recovered */
}

CUresult cuda_event_query(const colld_gpus_t *g, int gi, CUevent ev)
{
    CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[gi].ctx);
    return CU_CHECK_EXPECT(g->cu, CUDA_ERROR_NOT_READY, cuEventQuery, ev);
}

void cuda_event_failed(colld_gpus_t *g, int gi, CUresult r, const char *what, char *why, size_t len)
{
    char buf[160];
    cuda_gpu_fault(g, gi, r);
    snprintf(why, len, "%s failed on GPU %d (%s): %s%s", what, gi, g->gpu[gi].name,
             colld_cu_describe(g->cu, r, buf, sizeof(buf)), cuda_reset_hint(r));
}

bool cuda_past_due(uint64_t first, int timeout_ms, uint64_t now, uint64_t *deadline)
{
    uint64_t due = first + (uint64_t)timeout_ms * 1000000ull;
    if (now >= due)
        return true;
    if (due < *deadline)
        *deadline = due;
    return false;
}

int cuda_rank_list(char *buf, size_t len, int off, const int *missing, int nmissing)
{
    for (int i = 0; i < nmissing && i < 8 && off < (int)len - 16; i++)
        off += snprintf(buf + off, len - (size_t)off, " %d", missing[i]);
    if (nmissing > 8 && off < (int)len - 16)
        off += snprintf(buf + off, len - (size_t)off, " ...");
    return off;
}

/* Can the collective run: are the GPUs it uses working (not faulted, being reset or given up),
 * its registrations still mapped and its ranks' flag areas registered (issue 15 F3)? A plan's run
 * (cuda_plan.c) is checked the same way. */
const char *cuda_coll_unusable(colld_backend_t *b, const colld_coll_t *k, char *buf, size_t len)
{
    colld_gpus_t *g = gpus_of(b);
    unsigned long long seq = (unsigned long long)colld_coll_lead(k)->d.seq;
    bool used[64] = { false };
    int n = g->n < 64 ? g->n : 64;
    char why[sizeof(g->gpu[0].why) + 128];
    cuda_coll_gpus(k, used, n);
    for (int i = 0; i < n; i++)
        if (used[i] && cuda_gpu_unusable(g, i, why, sizeof(why))) {
            snprintf(buf, len, "collective #%llu: %s", seq, why);
            return buf;
        }
    for (int r = 0; r < k->comm->nranks; r++) {
        const colld_op_t *op = k->ops[r];
        for (int j = 0; j < 2; j++) {
            const colld_reg_t *reg = j ? op->recv_reg : op->send_reg;
            const gpu_reg_t *gr = reg ? reg->bpriv : NULL;
            if (gr && gr->lost) {
                snprintf(buf, len,
                         "collective #%llu: the buffer of rank %d (GPU registration %u) was mapped in GPU %d's context, "
                         "which colld reset after a CUDA error: register that memory again (a new buffer, or "
                         "deregister and register it)",
                         seq, r, reg->id, gr->gpu);
                return buf;
            }
        }
        const gpu_session_t *gs = gpu_session_of(b, op->session);
        if (gs && !gs->registered) {
            snprintf(buf, len,
                     "collective #%llu: the GPU flag area of rank %d is not registered with CUDA (lost in a reset of GPU "
                     "%d): reconnect the client",
                     seq, r, g->home);
            return buf;
        }
    }
    return NULL;
}

/* ============================================================================================
 * A collective's launch
 * ========================================================================================== */

/* Which GPUs a collective uses. */
typedef struct {
    int gpu_of[COLLD_CUDA_MAX_RANKS]; /* the GPU of each rank's (receive, else send) buffer, -1: none */
    bool used[MAX_GPUS];
    int nused;
    int lead;                  /* the GPU whose stream writes the done flags */
    CUstream stream[MAX_GPUS]; /* the communicator's stream on each used GPU */
} launch_plan_t;

/* Launch, step 1: the GPUs involved are those holding the ranks' buffers; the lead is the first of
 * them (GPU 0 when nothing moves, count 0: only the flags are written). */
static void plan_gpus(const colld_coll_t *k, launch_plan_t *p)
{
    int n = k->comm->nranks;
    p->lead = -1;
    p->nused = 0;
    for (int i = 0; i < MAX_GPUS; i++) {
        p->used[i] = false;
        p->stream[i] = NULL;
    }
    for (int r = 0; r < n; r++) {
        const colld_op_t *op = k->ops[r];
        p->gpu_of[r] = cuda_reg_gpu(op->recv_reg ? op->recv_reg : op->send_reg);
        for (int j = 0; j < 2; j++) {
            int x = cuda_reg_gpu(j ? op->recv_reg : op->send_reg);
            if (x >= 0 && x < MAX_GPUS && !p->used[x]) {
                p->used[x] = true;
                p->nused++;
                if (p->lead < 0)
                    p->lead = x;
            }
        }
    }
    if (p->lead < 0) {
        p->lead = 0;
        p->used[0] = true;
        p->nused = 1;
    }
}

/* Launch, step 2: every pair of GPUs involved must reach each other's memory (peer access). */
static colld_status_t check_peers(const colld_gpus_t *g, const launch_plan_t *p, colld_err_t *err)
{
    for (int i = 0; i < g->n && i < MAX_GPUS; i++)
        for (int j = 0; j < g->n && j < MAX_GPUS; j++)
            if (p->used[i] && p->used[j] && !g->peer[i * g->n + j])
                return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED,
                                     "the ranks' buffers are on GPUs %d and %d, which cannot access each other's "
                                     "memory (no peer access)",
                                     i, j);
    return COLLD_OK;
}

/* Launch, step 3: the communicator's stream on each GPU involved, created on first use. Returns
 * CUDA_SUCCESS or the driver's error. */
static CUresult get_streams(colld_backend_t *b, colld_dcomm_t *c, launch_plan_t *p)
{
    colld_gpus_t *g = gpus_of(b);
    gpu_comm_t *gc = gpu_comm_of(b, c);
    for (int i = 0; i < g->n && i < MAX_GPUS; i++) {
        p->stream[i] = NULL;
        if (!p->used[i])
            continue;
        CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[i].ctx);
        CUresult r = cuda_comm_stream(g, gc, i);
        if (r != CUDA_SUCCESS)
            return r;
        p->stream[i] = gc->stream[i];
    }
    return CUDA_SUCCESS;
}

/* One reduce launch of a collective on `stream` of GPU gi (its context current) over elements
 * [base, base + count) of the collective: its op, or the premultiplied sum with each rank's own
 * scalar word (from its descriptor, checked at admission); with --nan-check's words when it is
 * checked (cuda_nan.c). */
static colld_status_t launch_reduce(const colld_gpus_t *g, const colld_coll_t *k, int gi, uint64_t base,
                                    const void *const *in, void *const *out, int nout, size_t count, void *stream)
{
    const colld_wire_sqe_t *a = &colld_coll_lead(k)->d;
    int n = k->comm->nranks;
    uint64_t scalars[COLLD_CUDA_MAX_RANKS];
    bool premul = a->redop == COLLD_REDOP_PREMUL_SUM;
    for (int r = 0; premul && r < n && r < COLLD_CUDA_MAX_RANKS; r++)
        scalars[r] = colld_wire_sqe_scalar(&k->ops[r]->d);
    colld_cuda_nan_check_t check;
    return colld_cuda_reduce_checked(g->kernels, (colld_dtype_t)a->dtype, (colld_redop_t)a->redop,
                                     premul ? scalars : NULL, in, n, out, nout, count,
                                     cuda_nan_check(k, gi, base, &check), stream);
}

/* Launch, step 4a: all-reduce, reduce and broadcast: one kernel per GPU involved over its slice of
 * the elements (16-byte aligned slices), reading every rank's buffer and writing every output. */
static colld_status_t launch_sliced(const colld_gpus_t *g, const colld_coll_t *k, const launch_plan_t *p)
{
    const colld_wire_sqe_t *a = &colld_coll_lead(k)->d;
    int n = k->comm->nranks;
    size_t es = colld_dtype_size((colld_dtype_t)a->dtype);
    const void *in[COLLD_CUDA_MAX_RANKS];
    void *out[COLLD_CUDA_MAX_RANKS];
    uint64_t count = a->count;
    uint64_t per = (count + (uint64_t)p->nused - 1) / (uint64_t)p->nused;
    uint64_t align = es < 16 ? 16 / es : 1;
    per = (per + align - 1) / align * align;
    uint64_t lo = 0;
    colld_status_t st = COLLD_OK;
    for (int i = 0; i < g->n && i < MAX_GPUS && st == COLLD_OK; i++) {
        if (!p->used[i] || lo >= count)
            continue;
        uint64_t hi = COLLD_MIN(count, lo + per);
        size_t off = (size_t)lo * es;
        CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[i].ctx);
        int nout = 0;
        for (int r = 0; r < n; r++) {
            in[r] = (const char *)k->ops[r]->send_ptr + off;
            if (a->kind != COLLD_KIND_REDUCE || r == a->root)
                out[nout++] = (char *)k->ops[r]->recv_ptr + off;
        }
        if (a->kind == COLLD_KIND_BROADCAST)
            st = colld_cuda_copy(g->kernels, (const char *)k->ops[a->root]->send_ptr + off, out, nout,
                                 (size_t)(hi - lo) * es, p->stream[i]);
        else
            st = launch_reduce(g, k, i, lo, in, out, nout, (size_t)(hi - lo), p->stream[i]);
        lo = hi;
    }
    return st;
}

/* Launch, step 4b: reduce-scatter and all-gather: one kernel per rank's piece, on the GPU that
 * holds the piece's destination (reduce-scatter) or source (all-gather). */
static colld_status_t launch_pieces(const colld_gpus_t *g, const colld_coll_t *k, const launch_plan_t *p)
{
    const colld_wire_sqe_t *a = &colld_coll_lead(k)->d;
    int n = k->comm->nranks;
    size_t es = colld_dtype_size((colld_dtype_t)a->dtype);
    const void *in[COLLD_CUDA_MAX_RANKS];
    void *out[COLLD_CUDA_MAX_RANKS];
    uint64_t count = a->count;
    colld_status_t st = COLLD_OK;
    for (int q = 0; q < n && st == COLLD_OK; q++) {
        int gi = p->gpu_of[q] >= 0 ? p->gpu_of[q] : p->lead;
        size_t off = (size_t)q * (size_t)count * es;
        CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[gi].ctx);
        if (a->kind == COLLD_KIND_REDUCESCATTER) {
            for (int r = 0; r < n; r++)
                in[r] = (const char *)k->ops[r]->send_ptr + off;
            out[0] = k->ops[q]->recv_ptr;
            st = launch_reduce(g, k, gi, (uint64_t)q * count, in, out, 1, (size_t)count, p->stream[gi]);
        } else {
            for (int r = 0; r < n; r++)
                out[r] = (char *)k->ops[r]->recv_ptr + off;
            st = colld_cuda_copy(g->kernels, k->ops[q]->send_ptr, out, n, (size_t)count * es, p->stream[gi]);
        }
    }
    return st;
}

/* Copy `bytes` from src to dst on the stream of the GPU that holds src (the piece's GPU), unless it
 * is in place (src == dst) or empty. */
static colld_status_t copy_piece(const colld_gpus_t *g, const launch_plan_t *p, const colld_reg_t *src_reg,
                                 const void *src, void *dst, size_t bytes)
{
    if (!bytes || src == dst)
        return COLLD_OK;
    int gi = cuda_reg_gpu(src_reg);
    if (gi < 0 || gi >= g->n || gi >= MAX_GPUS)
        gi = p->lead;
    CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[gi].ctx);
    void *out[1] = { dst };
    return colld_cuda_copy(g->kernels, src, out, 1, bytes, p->stream[gi]);
}

/* Launch, step 4c (issue 16): gather, scatter and all-to-all, one copy per piece on the GPU that
 * holds the piece (as the all-gather's): gather, rank r's input into block r of the root's output;
 * scatter, block r of the root's input into rank r's output; all-to-all, block q of rank r's input
 * into block r of rank q's output. The root's own block in place is not copied. */
static colld_status_t launch_blocks(const colld_gpus_t *g, const colld_coll_t *k, const launch_plan_t *p)
{
    const colld_wire_sqe_t *a = &colld_coll_lead(k)->d;
    int n = k->comm->nranks;
    size_t bytes = (size_t)a->count * colld_dtype_size((colld_dtype_t)a->dtype);
    colld_status_t st = COLLD_OK;
    const colld_op_t *root = a->kind == COLLD_KIND_ALLTOALL ? NULL : k->ops[a->root];
    for (int r = 0; r < n && st == COLLD_OK; r++) {
        const colld_op_t *op = k->ops[r];
        if (a->kind == COLLD_KIND_GATHER)
            st = copy_piece(g, p, op->send_reg, op->send_ptr, (char *)root->recv_ptr + (size_t)r * bytes, bytes);
        else if (a->kind == COLLD_KIND_SCATTER)
            st = copy_piece(g, p, root->send_reg, (const char *)root->send_ptr + (size_t)r * bytes, op->recv_ptr,
                            bytes);
        else
            for (int q = 0; q < n && st == COLLD_OK; q++)
                st = copy_piece(g, p, op->send_reg, (const char *)op->send_ptr + (size_t)q * bytes,
                                (char *)k->ops[q]->recv_ptr + (size_t)r * bytes, bytes);
    }
    return st;
}

/* Launch, step 5: the lead GPU's stream waits for the others (an event on each), writes every
 * rank's done flag, and records the event the engine polls (k->bpriv). Returns CUDA_SUCCESS or the
 * driver's error. */
static CUresult signal_done(colld_backend_t *b, colld_coll_t *k, const launch_plan_t *p)
{
    colld_gpus_t *g = gpus_of(b);
    const colld_cu_t *cu = g->cu;
    int lead = p->lead;
    CUresult cr;
    CU_CHECK(cu, cuCtxSetCurrent, g->gpu[lead].ctx);
    for (int i = 0; i < g->n && i < MAX_GPUS; i++) {
        if (!p->used[i] || i == lead)
            continue;
        CUevent e;
        CU_CHECK(cu, cuCtxSetCurrent, g->gpu[i].ctx);
        if ((cr = CU_CHECK(cu, cuEventCreate, &e, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
            return cr;
        cr = CU_CHECK(cu, cuEventRecord, e, p->stream[i]);
        CU_CHECK(cu, cuCtxSetCurrent, g->gpu[lead].ctx);
        if (cr == CUDA_SUCCESS)
            cr = CU_CHECK(cu, cuStreamWaitEvent, p->stream[lead], e, 0);
        CU_CHECK(cu, cuEventDestroy, e); /* released once it has fired */
        if (cr != CUDA_SUCCESS)
            return cr;
    }
    for (int r = 0; r < k->comm->nranks && !k->bhand; r++) { /* a hand-off's done kernel wrote them */
        CUdeviceptr f;
        cuuint32_t value;
        cuda_done_target(b, k->ops[r], &f, &value); /* a plan's run: its plan line, 1 */
        if ((cr = CU_CHECK(cu, cuStreamWriteValue32, p->stream[lead], f, value, CU_STREAM_WRITE_VALUE_DEFAULT)) !=
            CUDA_SUCCESS)
            return cr;
    }
    CUevent done;
    if ((cr = CU_CHECK(cu, cuEventCreate, &done, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
        return cr;
    if ((cr = CU_CHECK(cu, cuEventRecord, done, p->stream[lead])) != CUDA_SUCCESS) {
        CU_CHECK(cu, cuEventDestroy, done);
        return cr;
    }
    k->bpriv = done;
    return CUDA_SUCCESS;
}

/* A launch failed part-way (issue 15 F2): wait for every stream it used before the collective
 * fails (cuda_stream_drain). */
static void drain_streams(colld_gpus_t *g, const launch_plan_t *p)
{
    for (int i = 0; i < g->n && i < MAX_GPUS; i++)
        if (p->used[i] && p->stream[i])
            cuda_stream_drain(g, i, p->stream[i]);
}

/* Launch one collective. Returns COLLD_OK or an error with what went wrong in err; on an error,
 * nothing it enqueued runs any more (drain_streams). */
static colld_status_t launch_one(colld_backend_t *b, colld_coll_t *k, colld_err_t *err)
{
    colld_gpus_t *g = gpus_of(b);
    const colld_wire_sqe_t *a = &colld_coll_lead(k)->d;
    char buf[160];
    if (k->comm->nranks > COLLD_CUDA_MAX_RANKS)
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "GPU collectives support at most %d ranks per node",
                             COLLD_CUDA_MAX_RANKS);
    launch_plan_t p;
    plan_gpus(k, &p);
    k->bint = p.lead;
    colld_status_t st = check_peers(g, &p, err);
    if (st != COLLD_OK)
        return st;
    CUresult cr = get_streams(b, k->comm, &p);
    if (cr != CUDA_SUCCESS)
        goto cuda_failed;
    if (cuda_nan_wanted(b, k) && (cr = cuda_nan_arm(g, k, p.lead)) != CUDA_SUCCESS)
        goto cuda_failed;
    const colld_cuda_handoff_t *ho = NULL;
    if (k->bhand) {
        /* The hand-off without the host (issue 28, cuda_handoff.c; one GPU): the waits and the
         * gate first, the kernels behind the gate, then the done writes. */
        if ((cr = cuda_handoff_arm(g, k, p.lead, &ho)) != CUDA_SUCCESS)
            goto cuda_failed;
        CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[p.lead].ctx);
        st = colld_cuda_handoff_wait(g->kernels, ho, p.stream[p.lead]);
        if (st != COLLD_OK)
            goto launch_failed;
        colld_cuda_set_gate(cuda_handoff_gate(k));
    }
    switch (a->kind) {
    case COLLD_KIND_ALLREDUCE:
    case COLLD_KIND_REDUCE:
    case COLLD_KIND_BROADCAST:
        st = launch_sliced(g, k, &p);
        break;
    case COLLD_KIND_REDUCESCATTER:
    case COLLD_KIND_ALLGATHER:
        st = launch_pieces(g, k, &p);
        break;
    case COLLD_KIND_GATHER:
    case COLLD_KIND_SCATTER:
    case COLLD_KIND_ALLTOALL:
        st = launch_blocks(g, k, &p);
        break;
    default:
        st = COLLD_ERR_INVALID_ARGUMENT;
    }
    colld_cuda_set_gate(NULL);
    if (st == COLLD_OK && ho) {
        CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[p.lead].ctx);
        st = colld_cuda_handoff_done(g->kernels, ho, p.stream[p.lead]);
    }
launch_failed:
    if (st != COLLD_OK) {
        colld_err_set(err, st, "collective #%llu: the GPU kernel could not be launched: %s", (unsigned long long)a->seq,
                      colld_cuda_last_error());
        cuda_handoff_abandon(k); /* its wait ends: the drain does not wait for the ranks */
        drain_streams(g, &p);
        return st;
    }
    if ((cr = signal_done(b, k, &p)) == CUDA_SUCCESS)
        return COLLD_OK;
cuda_failed : {
    /* The context the refused call was made in names the GPU; a sticky error there has it reset. */
    CUcontext cur = NULL;
    int gi = -1;
    CU_CHECK(g->cu, cuCtxGetCurrent, &cur);
    for (int i = 0; i < g->n && gi < 0; i++)
        if (cur && __atomic_load_n(&g->gpu[i].ctx, __ATOMIC_RELAXED) == cur) /* a reset may store it */
            gi = i;
    cuda_gpu_fault(g, gi, cr);
    colld_err_set(err, COLLD_ERR_DEVICE, "collective #%llu: CUDA refused the launch: %s on GPU %d (%s)%s",
                  (unsigned long long)a->seq, colld_cu_describe(g->cu, cr, buf, sizeof(buf)), gi,
                  gi >= 0 ? g->gpu[gi].name : "?", cuda_reset_hint(cr));
    cuda_handoff_abandon(k);
    drain_streams(g, &p);
    return COLLD_ERR_DEVICE;
}
}

bool cuda_launch(colld_backend_t *b)
{
    colld_gpus_t *g = gpus_of(b);
    if (!g || !g->launch)
        return false;
    for (colld_coll_t *k = g->launch; k; k = k->next) {
        colld_err_t err = COLLD_ERR_INIT;
        k->start_ns = colld_now_ns();
        k->why[0] = '\0';
        k->status = launch_one(b, k, &err);
        if (k->status != COLLD_OK)
            colld_strlcpy(k->why, err.msg, sizeof(k->why));
    }
    CU_CHECK(g->cu, cuCtxSetCurrent, NULL);
    return true;
}
