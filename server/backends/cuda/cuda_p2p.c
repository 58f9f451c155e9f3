/*
 * cuda_p2p.c - stream-ordered sends and receives on GPU buffers (issue 16): the CUDA backend's
 * `xfer_submit`. server/core/p2p.c matches a rank's send with its peer's receive in posting order
 * per pair of ranks, a stream-ordered one only once its batch is its rank's head batch (every
 * operation the rank posted before it has completed), and hands the pair here when the send is
 * stream-ordered.
 *
 * A transfer, in steps:
 *
 *   pending   matched; it waits until both ranks' streams have reached the operations. A rank's
 *             stream marks a whole batch ready at once (proto/wire.h: the operations of one group
 *             on a communicator, linked with COLLD_SQE_LINK; an operation outside a group is a
 *             batch of one): libcolld joins the batch's streams and writes the ready slot of the
 *             batch's last operation only, so the daemon reads that slot. When it holds exactly
 *             its value the daemon marks it taken (~value) and every operation of the batch
 *             (colld_op_t.bmark), which lets the client reuse the slot. A transfer whose streams do
 *             not get there within the communicator's timeout (counted from the first of the two
 *             operations' arrival, as a held collective's) breaks it with COLLD_ERR_TIMEOUT naming
 *             the rank whose stream never reached its operation.
 *   launched  on the engine thread, the lock dropped: the sender's buffer is copied into the
 *             receiver's by the copy kernel of kernels/cuda (the one the all-gather uses) on the
 *             communicator's stream of one GPU: both buffers' GPU, or across two GPUs the
 *             receiver's when it can access the sender's memory (peer access), else the sender's;
 *             two GPUs that cannot access each other's memory are refused with
 *             COLLD_ERR_NOT_SUPPORTED. An event is recorded after the copy. A transfer of 0 bytes
 *             (or onto itself) copies nothing.
 *   running   the watcher (cuda_watch.c) sees the event fire and wakes the engine; the transfer
 *             finishes: when it was the last unfinished operation of a rank's batch, the daemon
 *             writes that rank's `done` = the batch's value from the host, then colld_p2p_finish
 *             posts the completions in each rank's posting order.
 *
 * Why `done` is written from the host and not by the copy's stream as for a collective: the
 * transfers of one batch run concurrently (on several GPUs, in any order), and `done` must only
 * grow (a wait on a cyclic GEQ comparison), so only the last transfer of a batch to finish may
 * write it, which is known when the transfers finish. A rank's stream-ordered batches run one after
 * the other and a rank's collectives and its sends and receives never overlap (p2p.c), so `done`
 * grows. It costs one watcher period (at most 20 us) after the copy.
 *
 * Failures use the collectives' machinery (cuda_coll.c, and the launch layer of cuda_launch.c: the
 * stream, its drain, the event's poll, the time-out): an operation that fails releases its
 * rank's stream (cuda_stream_failed); a transfer counts as running (gpu_comm_t.running) from the
 * moment it leaves `pending` until its event fired, so that a release never lets a stream go on
 * while a copy may still write its buffer; a break fails the pending transfers at once
 * (cuda_p2p_comm_broken); a launch that fails waits for its stream, then breaks the communicator
 * with COLLD_ERR_DEVICE; a failed event too, and a sticky error has the GPU reset (cuda_recover.c,
 * which waits for the transfers launched on a GPU before it resets it).
 */
#include "server/backends/cuda/cuda.h"

#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>

/* A transfer in the backend's lists. */
typedef struct gpu_xfer {
    colld_xfer_t *x;
    int gpu;                        /* the GPU whose stream copies, -1: nothing to copy (or not launched) */
    CUevent ev;                     /* recorded after the copy, NULL without one */
    bool running;                   /* counted in its communicator's gpu_comm_t.running */
    char why[COLLD_ERR_MSG_LEN];    /* why its launch failed (err.msg, whole) */
    struct gpu_xfer *next;
} gpu_xfer_t;

/* ============================================================================================
 * Lists and details
 * ========================================================================================== */

/* The bytes a transfer moves (checked at admission not to overflow). */
static size_t xfer_bytes(const colld_xfer_t *x)
{
    return (size_t)x->send->d.count * colld_dtype_size((colld_dtype_t)x->send->d.dtype);
}

/* "send of 1024 x float32 to rank 1 (operation #3)". */
static void describe_op(char *buf, size_t len, const colld_op_t *op)
{
    bool send = op->d.kind == COLLD_KIND_SEND;
    char what[64];
    snprintf(what, sizeof(what), "of %llu x %s", (unsigned long long)op->d.count, colld_dtype_name(op->d.dtype));
    colld_p2p_op_text(buf, len, send ? "send" : "receive", send, what, op->d.root, op->id);
}

/* ============================================================================================
 * The ranks' streams
 * ========================================================================================== */

/* Has op's rank's stream reached the batch that holds op (the head batch of its rank: only that
 * one runs)? The batch's last operation's ready slot must hold exactly its value; with `take`, the
 * slot is then marked taken and every operation of the batch remembers it (lock held). */
static bool rank_reached(colld_backend_t *b, colld_op_t *op, bool take)
{
    if (op->bmark)
        return true;
    colld_member_t *m = op->member;
    colld_op_t *last = m->p2p_head;
    while (last && (last->d.flags & COLLD_SQE_LINK))
        last = last->next;
    if (!last) /* the rest of the batch is not posted yet */
        return false;
    uint32_t want;
    uint32_t *slot = cuda_ready_slot(b, last, &want);
    if (!slot || __atomic_load_n(slot, __ATOMIC_ACQUIRE) != want)
        return false;
    if (!take)
        return true;
    /* Taken (proto/wire.h): only while the rank is still on its handle, as for a collective. */
    if (m->session == last->session && colld_comm_member(last->session, last->d.comm) == m)
        __atomic_store_n(slot, ~want, __ATOMIC_RELEASE);
    for (colld_op_t *o = m->p2p_head; o; o = o->next) {
        o->bmark = 1;
        if (o == last)
            break;
    }
    return true;
}

/* The transfer finished well: every rank whose batch has no unfinished operation left gets its
 * `done` (the batch's last operation's value) from the host (lock held; before colld_p2p_finish,
 * which retires the operations). */
static void batch_done(colld_backend_t *b, const colld_xfer_t *x, const colld_op_t *op)
{
    colld_member_t *m = op->member;
    for (const colld_op_t *o = m->p2p_head; o; o = o->next) {
        bool finished = o == x->send || o == x->recv || o->p2p_state == COLLD_P2P_DONE;
        if (!finished || (o->p2p_state == COLLD_P2P_DONE && o->p2p_status != COLLD_OK))
            return; /* still running, or failed: its release covers the stream */
        if (o->d.flags & COLLD_SQE_LINK)
            continue;
        if (m->session == o->session && colld_comm_member(o->session, o->d.comm) == m)
            cuda_flag_release(b, o->session, o->d.comm, o->d.reserved + (uint32_t)o->id, COLLD_OK);
        return;
    }
}

/* ============================================================================================
 * Submission, completion
 * ========================================================================================== */

/* Take t off whatever list it is on no more and end it: its event destroyed, `done` of the ranks
 * whose batch it completes, the communicator's owed releases once nothing of it runs, then the
 * completions (colld_p2p_finish may free the communicator). Lock held. */
static void xfer_finish(colld_backend_t *b, gpu_xfer_t *t)
{
    colld_gpus_t *g = gpus_of(b);
    colld_xfer_t *x = t->x;
    colld_dcomm_t *c = x->comm;
    gpu_comm_t *gc = gpu_comm_of(b, c);
    if (t->ev) {
        CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[t->gpu].ctx);
        CU_CHECK(g->cu, cuEventDestroy, t->ev);
        CU_CHECK(g->cu, cuCtxSetCurrent, NULL);
    }
    x->end_ns = colld_now_ns();
    g->outstanding--;
    if (t->running && gc)
        gc->running--;
    if (x->status == COLLD_OK) {
        batch_done(b, x, x->send);
        if (x->recv->member != x->send->member)
            batch_done(b, x, x->recv);
    }
    if (gc)
        cuda_pay_releases(b, c);
    free(t);
    colld_p2p_finish(b->d, x);
}

void cuda_xfer_submit(colld_backend_t *b, colld_xfer_t *x)
{
    colld_gpus_t *g = gpus_of(b);
    gpu_xfer_t *t = g && gpu_comm_of(b, x->comm) ? calloc(1, sizeof(*t)) : NULL;
    if (!t) {
        /* Without memory (or, never here, without the state admission made): the pair fails and
         * its communicator with it, which releases the ranks' streams. */
        colld_status_t st = g ? COLLD_ERR_NO_MEMORY : COLLD_ERR_NOT_SUPPORTED;
        x->status = st;
        x->start_ns = x->end_ns = colld_now_ns();
        colld_comm_break(b->d, x->comm, st, -1,
                         g ? "daemon out of memory" : "a stream-ordered send, but the daemon has no GPU");
        colld_p2p_finish(b->d, x);
        return;
    }
    t->x = x;
    t->gpu = -1;
    CUDA_LIST_APPEND(g->xpending, t);
    if (g->outstanding++ == 0)
        cuda_watch_kick(g);
}

/* A pending transfer cannot run: the GPUs its buffers are on are faulted, being reset or given
 * up, or a buffer's mapping went with a reset. NULL, or why in buf (lock held). */
static const char *xfer_unusable(colld_backend_t *b, const colld_xfer_t *x, char *buf, size_t len)
{
    colld_gpus_t *g = gpus_of(b);
    char why[sizeof(g->gpu[0].why) + 128];
    const colld_reg_t *regs[2] = { x->send->send_reg, x->recv->recv_reg };
    for (int j = 0; j < 2; j++) {
        const gpu_reg_t *gr = regs[j] ? regs[j]->bpriv : NULL;
        if (!gr)
            continue;
        if (gr->gpu >= 0 && gr->gpu < g->n && cuda_gpu_unusable(g, gr->gpu, why, sizeof(why))) {
            snprintf(buf, len, "point-to-point from rank %d to rank %d: %s", x->send->member->rank,
                     x->recv->member->rank, why);
            return buf;
        }
        if (gr->lost) {
            snprintf(buf, len,
                     "point-to-point from rank %d to rank %d: the %s buffer (GPU registration %u) was mapped in GPU "
                     "%d's context, which colld reset after a CUDA error: register that memory again",
                     x->send->member->rank, x->recv->member->rank, j ? "receive" : "send", regs[j]->id, gr->gpu);
            return buf;
        }
    }
    return NULL;
}

/* A pending transfer whose streams did not both get there within the timeout breaks its
 * communicator, naming the rank(s) whose stream never reached its operation. Returns true when it
 * did (the break changed the lists). Lock held. */
static bool time_out(colld_backend_t *b, gpu_xfer_t *t, uint64_t now, uint64_t *deadline)
{
    colld_xfer_t *x = t->x;
    colld_dcomm_t *c = x->comm;
    if (!cuda_past_due(COLLD_MIN(x->send->arrival_ns, x->recv->arrival_ns), c->timeout_ms, now, deadline))
        return false;
    char why[COLLD_DETAIL_LEN], what[160];
    int off = snprintf(why, sizeof(why), "point-to-point timed out after %d ms: ", c->timeout_ms);
    int missing = -1, nmissing = 0;
    colld_op_t *ops[2] = { x->send, x->recv };
    for (int j = 0; j < 2 && off < (int)sizeof(why); j++) {
        if (rank_reached(b, ops[j], false) || (j == 1 && ops[1]->member == ops[0]->member && nmissing))
            continue;
        describe_op(what, sizeof(what), ops[j]);
        off += snprintf(why + off, sizeof(why) - (size_t)off,
                        "%sthe GPU stream of rank %d (pid %d) never reached its %s", nmissing ? "; " : "",
                        ops[j]->member->rank, (int)ops[j]->session->pid, what);
        missing = ops[j]->member->rank;
        nmissing++;
    }
    if (off < (int)sizeof(why))
        snprintf(why + off, sizeof(why) - (size_t)off,
                 " (its stream never got there: the work before it on the stream "
                 "did not finish, or the rest of its group was never posted)");
    colld_comm_break(b->d, c, COLLD_ERR_TIMEOUT, nmissing == 1 ? missing : -1, why);
    return true;
}

int cuda_p2p_progress(colld_backend_t *b, uint64_t now, uint64_t *deadline)
{
    colld_gpus_t *g = gpus_of(b);
    int work = 0;
    /* Launched transfers whose event has fired: all of them in one round. */
    bool looked = g->xrunning != NULL;
    for (gpu_xfer_t **pp = &g->xrunning; *pp;) {
        gpu_xfer_t *t = *pp;
        CUresult r = cuda_event_query(g, t->gpu, t->ev);
        if (r == CUDA_ERROR_NOT_READY) {
            pp = &t->next;
            continue;
        }
        *pp = t->next;
        work++;
        if (r != CUDA_SUCCESS) {
            char why[COLLD_DETAIL_LEN], what[80];
            t->x->status = COLLD_ERR_DEVICE;
            snprintf(what, sizeof(what), "point-to-point from rank %d to rank %d", t->x->send->member->rank,
                     t->x->recv->member->rank);
            cuda_event_failed(g, t->gpu, r, what, why, sizeof(why));
            colld_comm_break(b->d, t->x->comm, COLLD_ERR_DEVICE, -1, why);
            xfer_finish(b, t);
            return work; /* the break may have changed the lists: look again next round */
        }
        xfer_finish(b, t); /* *pp is already the next one; a finish leaves the lists alone */
    }
    if (looked)
        CU_CHECK(g->cu, cuCtxSetCurrent, NULL);
    /* Matched transfers: launch those both ranks' streams reached, time out the others. */
    for (gpu_xfer_t **pp = &g->xpending; *pp;) {
        gpu_xfer_t *t = *pp;
        colld_xfer_t *x = t->x;
        char why[COLLD_DETAIL_LEN];
        if (xfer_unusable(b, x, why, sizeof(why))) {
            LOG_WARN(GPU, "communicator %llu: %s", (unsigned long long)x->comm->id, why);
            colld_comm_break(b->d, x->comm, COLLD_ERR_DEVICE, -1, why);
            return work + 1;
        }
        /* Both are checked (and taken) so that a batch is taken as soon as its stream got there. */
        bool s_ok = rank_reached(b, x->send, true);
        bool r_ok = rank_reached(b, x->recv, true);
        if (!s_ok || !r_ok) {
            if (time_out(b, t, now, deadline))
                return work + 1;
            pp = &t->next;
            continue;
        }
        *pp = t->next;
        t->running = true; /* from now on a release waits for it (issue 15 F1, as a collective) */
        gpu_comm_of(b, x->comm)->running++;
        CUDA_LIST_APPEND(g->xlaunch, t);
        work++;
    }
    return work;
}

bool cuda_p2p_movable(colld_backend_t *b)
{
    colld_gpus_t *g = gpus_of(b);
    if (g->xlaunch)
        return true;
    for (gpu_xfer_t *t = g->xrunning; t; t = t->next)
        if (cuda_event_query(g, t->gpu, t->ev) != CUDA_ERROR_NOT_READY)
            return true;
    for (gpu_xfer_t *t = g->xpending; t; t = t->next)
        if (rank_reached(b, t->x->send, false) && rank_reached(b, t->x->recv, false))
            return true;
    return false;
}

/* ============================================================================================
 * Launch (engine thread, lock NOT held: the transfers on the launch list, their operations and
 * registrations stay put until cuda_p2p_launched takes the list back)
 * ========================================================================================== */

/* The GPU whose stream copies: the one both buffers are on, else the receiver's when it can access
 * the sender's memory, else the sender's when it can access the receiver's; -1 when neither can. */
static int copy_gpu(const colld_gpus_t *g, int gs, int gr)
{
    if (gs == gr)
        return gs;
    if (g->peer[gr * g->n + gs])
        return gr;
    if (g->peer[gs * g->n + gr])
        return gs;
    return -1;
}

/* Launch one transfer's copy and its event. COLLD_OK, or an error with what went wrong in err; on
 * an error nothing it enqueued runs any more (its stream was waited for). */
static colld_status_t launch_one(colld_backend_t *b, gpu_xfer_t *t, colld_err_t *err)
{
    colld_gpus_t *g = gpus_of(b);
    const colld_xfer_t *x = t->x;
    gpu_comm_t *gc = gpu_comm_of(b, x->comm);
    size_t bytes = xfer_bytes(x);
    char buf[160];
    if (!bytes || x->send->send_ptr == x->recv->recv_ptr)
        return COLLD_OK; /* nothing to copy: it finishes when the launch list comes back */
    int gs = cuda_reg_gpu(x->send->send_reg), gr = cuda_reg_gpu(x->recv->recv_reg);
    if (gs < 0 || gr < 0 || gs >= g->n || gr >= g->n)
        return colld_err_set(err, COLLD_ERR_INTERNAL, "point-to-point: a buffer without its GPU");
    int gi = copy_gpu(g, gs, gr);
    if (gi < 0)
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED,
                             "point-to-point from rank %d to rank %d: the send buffer is on GPU %d and the receive "
                             "buffer on GPU %d, which cannot access each other's memory (no peer access): use "
                             "buffers on GPUs with peer access (nvidia-smi topo -p2p r)",
                             x->send->member->rank, x->recv->member->rank, gs, gr);
    const char *call = "cuStreamCreate";
    CUresult cr = CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[gi].ctx);
    if (cr == CUDA_SUCCESS)
        cr = cuda_comm_stream(g, gc, gi);
    if (cr != CUDA_SUCCESS)
        goto failed;
    void *out[1] = { x->recv->recv_ptr };
    colld_status_t st = colld_cuda_copy(g->kernels, x->send->send_ptr, out, 1, bytes, gc->stream[gi]);
    if (st != COLLD_OK) {
        colld_err_set(err, st, "point-to-point from rank %d to rank %d: the GPU copy could not be launched: %s",
                      x->send->member->rank, x->recv->member->rank, colld_cuda_last_error());
        cuda_stream_drain(g, gi, gc->stream[gi]);
        return st;
    }
    t->gpu = gi;
    call = "cuEventCreate";
    if ((cr = CU_CHECK(g->cu, cuEventCreate, &t->ev, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
        t->ev = NULL;
        goto failed;
    }
    call = "cuEventRecord";
    if ((cr = CU_CHECK(g->cu, cuEventRecord, t->ev, gc->stream[gi])) == CUDA_SUCCESS)
        return COLLD_OK;
    CU_CHECK(g->cu, cuEventDestroy, t->ev);
    t->ev = NULL;
failed:
    cuda_gpu_fault(g, gi, cr);
    colld_err_set(err, COLLD_ERR_DEVICE, "point-to-point from rank %d to rank %d: %s: %s on GPU %d (%s)%s",
                  x->send->member->rank, x->recv->member->rank, call, colld_cu_describe(g->cu, cr, buf, sizeof(buf)),
                  gi, g->gpu[gi].name, cuda_reset_hint(cr));
    if (gc->stream[gi]) /* what the copy enqueued runs no more once the stream is idle */
        cuda_stream_drain(g, gi, gc->stream[gi]);
    return COLLD_ERR_DEVICE;
}

bool cuda_p2p_launch(colld_backend_t *b)
{
    colld_gpus_t *g = gpus_of(b);
    if (!g || !g->xlaunch)
        return false;
    for (gpu_xfer_t *t = g->xlaunch; t; t = t->next) {
        colld_err_t err = COLLD_ERR_INIT;
        t->x->start_ns = colld_now_ns();
        t->why[0] = '\0';
        t->x->status = launch_one(b, t, &err);
        if (t->x->status != COLLD_OK)
            colld_strlcpy(t->why, err.msg, sizeof(t->why));
    }
    CU_CHECK(g->cu, cuCtxSetCurrent, NULL);
    return true;
}

void cuda_p2p_launched(colld_backend_t *b)
{
    colld_gpus_t *g = gpus_of(b);
    if (!g)
        return;
    gpu_xfer_t *list = g->xlaunch;
    g->xlaunch = NULL;
    while (list) {
        gpu_xfer_t *t = list;
        list = t->next;
        t->next = NULL;
        if (t->x->status == COLLD_OK && t->ev) {
            CUDA_LIST_APPEND(g->xrunning, t);
            continue;
        }
        if (t->x->status != COLLD_OK) {
            LOG_WARN(GPU, "communicator %llu: %s", (unsigned long long)t->x->comm->id, t->why);
            colld_comm_break(b->d, t->x->comm, t->x->status, -1, t->why);
        }
        xfer_finish(b, t); /* nothing to copy, or the launch failed: nothing it enqueued runs any more */
    }
}

/* ============================================================================================
 * Faults
 * ========================================================================================== */

void cuda_p2p_comm_broken(colld_backend_t *b, colld_dcomm_t *c)
{
    colld_gpus_t *g = gpus_of(b);
    if (!g)
        return;
    /* A communicator a rank closed (destroyed its handle) keeps the transfers between the ranks
     * still there, as server/core/p2p.c keeps their sends and receives: only those with a rank
     * that left fail. */
    bool closing = c->state == COLLD_COMM_CLOSING;
    for (gpu_xfer_t **pp = &g->xpending; *pp;) {
        gpu_xfer_t *t = *pp;
        if (t->x->comm != c || (closing && !t->x->send->member->left && !t->x->recv->member->left)) {
            pp = &t->next;
            continue;
        }
        *pp = t->next;
        t->x->status = colld_comm_waiting_status(c);
        xfer_finish(b, t); /* the caller holds a reference on c */
    }
}

void cuda_p2p_waits(colld_backend_t *b, const colld_dcomm_t *c, void (*fn)(void *arg, const colld_op_t *op),
                    void *arg)
{
    colld_gpus_t *g = gpus_of(b);
    for (gpu_xfer_t *t = g ? g->xpending : NULL; t; t = t->next) {
        if (t->x->comm != c)
            continue;
        bool s = rank_reached(b, t->x->send, false), r = rank_reached(b, t->x->recv, false);
        if (s != r)
            fn(arg, s ? t->x->send : t->x->recv);
    }
}

bool cuda_p2p_busy(const colld_gpus_t *g, int gi, bool any)
{
    if (g->xlaunch)
        return true;
    for (const gpu_xfer_t *t = g->xrunning; t; t = t->next)
        if (any || t->gpu == gi)
            return true;
    return false;
}
