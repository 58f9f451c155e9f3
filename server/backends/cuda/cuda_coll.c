/*
 * cuda_coll.c - the CUDA backend's stream-ordered collectives, under daemon->lock: admission of a
 * descriptor (its flag line and base), matched collectives waiting until every rank's stream
 * reached them (and their time-out), the completion of launched ones when their event fired, and
 * the release of every rank's stream when a collective fails or its communicator breaks (see
 * cuda.c for the whole protocol). Launching them is cuda_launch.c's.
 */
#include "server/backends/cuda/cuda.h"
#include "server/backends/cuda/cuda_plan.h"

#include "common/log.h"
#include "common/util.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A communicator's GPU state, made on first use. NULL without memory. */
static gpu_comm_t *gpu_comm(colld_backend_t *b, colld_dcomm_t *c)
{
    gpu_comm_t *gc = gpu_comm_of(b, c);
    if (gc)
        return gc;
    size_t n = (size_t)c->nranks;
    gc = calloc(1, sizeof(*gc));
    if (!gc)
        return NULL;
    gc->stream = calloc((size_t)gpus_of(b)->n, sizeof(*gc->stream));
    gc->owe = calloc(n, sizeof(*gc->owe));
    gc->owed = calloc(n, sizeof(*gc->owed));
    gc->base_set = calloc(n, sizeof(*gc->base_set));
    gc->base = calloc(n, sizeof(*gc->base));
    gc->last = calloc(n, sizeof(*gc->last));
    if (!gc->stream || !gc->owe || !gc->owed || !gc->base_set || !gc->base || !gc->last) {
        free(gc->stream), free(gc->owe), free(gc->owed), free(gc->base_set), free(gc->base), free(gc->last);
        free(gc);
        return NULL;
    }
    c->bslot[b->slot] = gc;
    cuda_track_comm(gpus_of(b), gc, true);
    return gc;
}

/* ============================================================================================
 * Admission
 * ========================================================================================== */

/* A stream-ordered descriptor: a GPU here, a single-node communicator, the session's flag line
 * for its handle, and the communicator's flag base (the same for every collective of the rank). */
colld_status_t cuda_admit(colld_backend_t *b, colld_op_t *op, colld_err_t *err)
{
    colld_session_t *s = op->session;
    const colld_wire_sqe_t *d = &op->d;
    colld_member_t *m = op->member;
    if (!gpus_of(b))
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED, "GPU collective, but no GPU here: %.160s",
                             b->d->device_none);
    if (colld_comm_multi_node(m->comm))
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED,
                             "GPU collectives on a multi-node communicator are not supported yet");
    /* A drained GPU (cuda_health.c) takes no new collective: the GPUs of its buffers (their
     * registrations are resolved after this check: looked up by id here). */
    bool any_drained = false;
    for (int i = 0; i < gpus_of(b)->n; i++)
        any_drained |= gpus_of(b)->gpu[i].drained;
    for (const colld_reg_t *reg = any_drained ? s->regs : NULL; reg; reg = reg->next) {
        char why[256];
        if ((reg->id == d->send.reg_id || reg->id == d->recv.reg_id) && reg->device && reg->backend == b &&
            cuda_gpu_drained(gpus_of(b), cuda_reg_gpu(reg), why, sizeof(why)))
            return colld_err_set(err, COLLD_ERR_DEVICE, "%s", why);
    }
    gpu_session_t *gs = gpu_session_of(b, s);
    if (!gs || d->comm >= gs->lines)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "GPU collective without a GPU flag line for communicator handle %u", d->comm);
    gpu_comm_t *gc = gpu_comm(b, m->comm);
    if (!gc)
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
    if (d->flags & COLLD_SQE_PLAN) /* a captured collective: no flag base, a plan line */
        return cuda_plan_admit(b, op, err);
    int r = m->rank;
    if (gc->base_set[r] && d->reserved != gc->base[r])
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "GPU collective with flag base %u where the communicator uses %u", d->reserved,
                             gc->base[r]);
    gc->base_set[r] = true;
    gc->base[r] = d->reserved;
    gc->last[r] = d->reserved + (uint32_t)op->id; /* flag values follow the operation id (proto/wire.h) */
    return COLLD_OK;
}

/* ============================================================================================
 * Releases
 * ========================================================================================== */

/* A stream-ordered collective of `rank` with flag value `value` failed: release the rank's stream
 * past it, once no kernel of the communicator runs (lock held). */
static void owe_release(colld_backend_t *b, colld_dcomm_t *c, int rank, uint32_t value, colld_status_t st)
{
    uint32_t v = value + COLLD_WIRE_GPU_RELEASE;
    gpu_comm_t *gc = gpu_comm_of(b, c);
    if (rank < 0 || rank >= c->nranks)
        return;
    if (!gc || !gc->running) {
        const colld_member_t *m = c->ranks ? &c->ranks[rank] : NULL;
        for (int i = 0; !m && i < colld_comm_nslots(c); i++) /* forming: the rank's joiner record */
            if (colld_comm_slot(c, i)->rank == rank)
                m = colld_comm_slot(c, i);
        if (m)
            cuda_flag_release(b, m->session, m->handle, v, st);
        return;
    }
    if (!gc->owe[rank] || (int32_t)(v - gc->owed[rank]) > 0)
        gc->owed[rank] = v;
    gc->owe[rank] = true;
    gc->owed_status = st;
}

void cuda_stream_failed(colld_backend_t *b, colld_session_t *s, const colld_wire_sqe_t *sqe, uint64_t id,
                        colld_status_t st)
{
    if (sqe->flags & COLLD_SQE_PLAN) { /* no stream waits for it: its plan line is free again */
        cuda_plan_unreserve(b, s, sqe);
        return;
    }
    colld_member_t *m = colld_comm_member(s, sqe->comm);
    if (m)
        owe_release(b, m->comm, m->rank, sqe->reserved + (uint32_t)id, st);
}

/* ============================================================================================
 * Collectives
 * ========================================================================================== */

/* Post a GPU collective's completions (k->status) and account for it (lock held). */
static void gpu_finish(colld_backend_t *b, colld_coll_t *k, bool was_running)
{
    colld_gpus_t *g = gpus_of(b);
    colld_dcomm_t *c = k->comm;
    gpu_comm_t *gc = gpu_comm_of(b, c);
    if (k->bpriv) {
        CU_CHECK(g->cu, cuCtxSetCurrent, g->gpu[k->bint].ctx);
        CU_CHECK(g->cu, cuEventDestroy, (CUevent)k->bpriv);
        k->bpriv = NULL;
    }
    cuda_nan_release(g, k);
    if (k->bhand) {
        g->handoffs--;
        cuda_handoff_release(g, k);
    }
    k->end_ns = colld_now_ns();
    if (cuda_plan_of_run(g, k)) { /* a replay of a captured collective: the graph waits, no completion */
        cuda_plan_run_finished(b, k);
        return;
    }
    g->outstanding--;
    gc->busy--;
    if (was_running)
        gc->running--;
    cuda_pay_releases(b, c);
    /* Posts the completions; a failed op of a rank owes (or, nothing running, writes) its
     * release. May free the communicator. */
    colld_engine_finish(b->d, k);
}

void cuda_submit(colld_backend_t *b, colld_coll_t *k)
{
    colld_gpus_t *g = gpus_of(b);
    colld_dcomm_t *c = k->comm;
    gpu_comm_t *gc = g ? gpu_comm(b, c) : NULL;
    if (!gc) {
        k->status = g ? COLLD_ERR_NO_MEMORY : COLLD_ERR_NOT_SUPPORTED;
        k->start_ns = k->end_ns = colld_now_ns();
        colld_engine_finish(b->d, k);
        return;
    }
    gc->busy++;
    if (g->outstanding++ == 0)
        cuda_watch_kick(g);
    k->bpriv = NULL;
    k->next = NULL;
    if (g->pending_tail)
        g->pending_tail->next = k;
    else
        g->pending = k;
    g->pending_tail = k;
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

/* Has every rank's stream reached this collective? Its own slot must hold exactly its value
 * (issue 15 E1: a later collective's write, on another stream, never stands for it). Lock held. */
static bool all_ready(colld_backend_t *b, const colld_coll_t *k, int *missing, int nmissing_max, int *nmissing)
{
    *nmissing = 0;
    for (int r = 0; r < k->comm->nranks; r++) {
        uint32_t want;
        const uint32_t *slot = cuda_ready_slot(b, k->ops[r], &want);
        if (!slot || __atomic_load_n(slot, __ATOMIC_ACQUIRE) != want) {
            if (*nmissing < nmissing_max)
                missing[*nmissing] = r;
            (*nmissing)++;
        }
    }
    return *nmissing == 0;
}

/* Every rank's stream reached k, which is about to be launched: mark each rank's slot taken (~v),
 * which tells the rank's client that the slot may be written again (proto/wire.h). Only a rank
 * still attached to its handle: a handle given to a new communicator has a new owner (lock held). */
static void mark_taken(colld_backend_t *b, const colld_coll_t *k)
{
    for (int r = 0; r < k->comm->nranks; r++) {
        const colld_op_t *op = k->ops[r];
        uint32_t want;
        uint32_t *slot = cuda_ready_slot(b, op, &want);
        if (slot && op->member && op->member->session == op->session &&
            colld_comm_member(op->session, op->d.comm) == op->member)
            __atomic_store_n(slot, ~want, __ATOMIC_RELEASE);
    }
}

/* Launched collectives whose event has fired are finished (in launch order per communicator); a
 * failed event breaks the communicator with COLLD_ERR_DEVICE. */
int cuda_coll_fired(colld_backend_t *b)
{
    colld_gpus_t *g = gpus_of(b);
    int work = 0;
    for (colld_coll_t **pp = &g->running; *pp;) {
        colld_coll_t *k = *pp;
        /* Completions go out in sequence order per communicator: an earlier one still runs. */
        bool earlier = false;
        for (colld_coll_t *e = g->running; e != k; e = e->next)
            earlier |= e->comm == k->comm;
        CUresult r = earlier ? CUDA_ERROR_NOT_READY : cuda_event_query(g, k->bint, (CUevent)k->bpriv);
        if (r == CUDA_ERROR_NOT_READY) {
            pp = &k->next;
            continue;
        }
        *pp = k->next;
        k->next = NULL;
        work++;
        if (r != CUDA_SUCCESS) {
            char why[COLLD_DETAIL_LEN], what[48];
            k->status = COLLD_ERR_DEVICE;
            snprintf(what, sizeof(what), "collective #%llu", (unsigned long long)colld_coll_lead(k)->d.seq);
            cuda_event_failed(g, k->bint, r, what, why, sizeof(why));
            colld_comm_break(b->d, k->comm, COLLD_ERR_DEVICE, -1, why);
        } else if (k->bhand && !cuda_handoff_open(k)) {
            /* A hand-off abandoned (issue 28): its kernels did nothing, its communicator broke (the
             * gate stays shut only after a cancel; should one come without a break, it breaks now). */
            colld_dcomm_t *c = k->comm;
            if (c->state != COLLD_COMM_BROKEN && c->state != COLLD_COMM_CLOSING) {
                snprintf(k->why, sizeof(k->why),
                         "collective #%llu timed out on the GPU: the ranks' streams never all reached it",
                         (unsigned long long)colld_coll_lead(k)->d.seq);
                colld_comm_break(b->d, c, COLLD_ERR_TIMEOUT, -1, k->why);
            }
            k->status = colld_comm_waiting_status(c);
        } else if (cuda_nan_verdict(g, k, k->why, sizeof(k->why)) != COLLD_OK) {
            /* --nan-check: as the host backend, the communicator breaks with the verdict, so that
             * every rank (and every later operation) learns it. */
            k->status = COLLD_ERR_NUMERIC;
            LOG_WARN(GPU, "communicator %llu: %s", (unsigned long long)k->comm->id, k->why);
            colld_comm_break(b->d, k->comm, COLLD_ERR_NUMERIC, -1, k->why);
        }
        gpu_finish(b, k, true);
    }
    return work;
}

/* A matched collective whose ranks' streams never got there within the timeout fails, naming
 * them. Returns true when it did (the break took it, and maybe others, off the pending list). */
static bool time_out_pending(colld_backend_t *b, colld_coll_t *k, const int *missing, int nmissing, uint64_t now,
                             uint64_t *deadline)
{
    colld_dcomm_t *c = k->comm;
    uint64_t first = UINT64_MAX;
    for (int r = 0; r < c->nranks; r++)
        first = COLLD_MIN(first, k->ops[r]->arrival_ns);
    if (!cuda_past_due(first, c->timeout_ms, now, deadline))
        return false;
    char why[COLLD_DETAIL_LEN];
    int off = snprintf(why, sizeof(why), "collective #%llu timed out after %d ms: the GPU stream of rank(s)",
                       (unsigned long long)colld_coll_lead(k)->d.seq, c->timeout_ms);
    off = cuda_rank_list(why, sizeof(why), off, missing, nmissing);
    snprintf(why + off, sizeof(why) - (size_t)off, " never reached it (its inputs were never ready)");
    colld_comm_break(b->d, c, COLLD_ERR_TIMEOUT, nmissing == 1 ? missing[0] : -1, why);
    return true;
}

/* The first hand-off of each communicator still waiting on the GPU for the ranks' streams (issue
 * 28): past the timeout, or on a GPU that faulted, its communicator breaks (which cancels it:
 * cuda_coll_comm_broken). Returns true after a break (lock held). */
static bool handoff_due(colld_backend_t *b, uint64_t now, uint64_t *deadline)
{
    colld_gpus_t *g = gpus_of(b);
    if (!g->handoffs)
        return false;
    for (colld_coll_t *k = g->running; k; k = k->next) {
        bool first = true;
        for (colld_coll_t *e = g->running; e != k && first; e = e->next)
            first = !(e->comm == k->comm && cuda_handoff_waits(e));
        if (!first || !cuda_handoff_waits(k))
            continue;
        char why[COLLD_DETAIL_LEN];
        if (cuda_coll_unusable(b, k, why, sizeof(why))) {
            LOG_WARN(GPU, "communicator %llu: %s", (unsigned long long)k->comm->id, why);
            colld_comm_break(b->d, k->comm, COLLD_ERR_DEVICE, -1, why);
            return true;
        }
        int missing[8], nmissing;
        if (!all_ready(b, k, missing, 8, &nmissing) && !cuda_handoff_open(k) &&
            time_out_pending(b, k, missing, nmissing, now, deadline))
            return true;
    }
    return false;
}

int cuda_coll_progress(colld_backend_t *b, uint64_t now, uint64_t *deadline, bool *broke)
{
    colld_gpus_t *g = gpus_of(b);
    int work = 0;
    *broke = true; /* until the whole list was looked at */
    colld_coll_t **launch_tail = &g->launch;
    while (*launch_tail)
        launch_tail = &(*launch_tail)->next;
    colld_coll_t *prev = NULL;
    for (colld_coll_t *k = g->pending; k;) {
        colld_coll_t *next = k->next;
        int missing[8], nmissing;
        bool earlier = false; /* an earlier collective of the same communicator still waits */
        for (colld_coll_t *e = g->pending; e != k; e = e->next)
            earlier |= e->comm == k->comm;
        char why[COLLD_DETAIL_LEN];
        if (!earlier && cuda_coll_unusable(b, k, why, sizeof(why))) {
            /* Its GPU faulted (or its memory went with a reset): it fails, its communicator breaks
             * (the break takes it, and maybe others, off the pending list). */
            LOG_WARN(GPU, "communicator %llu: %s", (unsigned long long)k->comm->id, why);
            colld_comm_break(b->d, k->comm, COLLD_ERR_DEVICE, -1, why);
            return work + 1;
        }
        if (!earlier && cuda_is_plan_reg(k)) {
            /* A captured collective's registration: its plan is installed once the collectives
             * before it on the communicator have finished, so that its completion comes in
             * sequence order. */
            if (gpu_comm_of(b, k->comm)->running) {
                prev = k;
                k = next;
                continue;
            }
            colld_err_t err = COLLD_ERR_INIT;
            pending_unlink(g, prev, k);
            k->start_ns = now;
            k->status = cuda_plan_install(b, k, &err);
            if (k->status != COLLD_OK) {
                LOG_WARN(GPU, "communicator %llu: %s", (unsigned long long)k->comm->id, err.msg);
                colld_comm_break(b->d, k->comm, k->status, -1, err.msg);
                gpu_finish(b, k, false);
                return work + 1;
            }
            gpu_finish(b, k, false);
            work++;
            k = next;
            continue;
        }
        if (!earlier && !g->hold && cuda_handoff_wanted(b, k) && cuda_handoff_prepare(b, k) == COLLD_OK) {
            /* The hand-off without the host (issue 28, cuda_handoff.c): launched now, its kernels
             * wait on the GPU for the ranks' streams; running (and its slots taken by its wait). */
            pending_unlink(g, prev, k);
            gpu_comm_of(b, k->comm)->running++;
            g->handoffs++;
            *launch_tail = k;
            launch_tail = &k->next;
            work++;
            k = next;
            continue;
        }
        if (!earlier && !g->hold && all_ready(b, k, missing, 8, &nmissing)) {
            pending_unlink(g, prev, k);
            mark_taken(b, k);
            /* Running from now on (issue 15 F1): a break while it is being launched (the lock
             * dropped) owes its releases until the launch's own `done` writes are over. */
            gpu_comm_of(b, k->comm)->running++;
            *launch_tail = k;
            launch_tail = &k->next;
            work++;
            k = next;
            continue;
        }
        if (!earlier && !g->hold && time_out_pending(b, k, missing, nmissing, now, deadline))
            return work + 1;
        prev = k;
        k = next;
    }
    if (handoff_due(b, now, deadline))
        return work + 1;
    *broke = false;
    return work;
}

/* Is c's collective k the first of c on the list that starts at `list`? */
static bool first_of_comm(const colld_coll_t *list, const colld_coll_t *k)
{
    for (const colld_coll_t *e = list; e != k; e = e->next)
        if (e->comm == k->comm)
            return false;
    return true;
}

/* Which of k's ranks' streams reached it (their ready slots): a new array, NULL without memory. */
static bool *arrivals(colld_backend_t *b, const colld_coll_t *k)
{
    bool *arrived = calloc((size_t)k->comm->nranks, sizeof(*arrived));
    for (int r = 0; arrived && r < k->comm->nranks; r++) {
        uint32_t want;
        const uint32_t *slot = cuda_ready_slot(b, k->ops[r], &want);
        arrived[r] = slot && __atomic_load_n(slot, __ATOMIC_ACQUIRE) == want;
    }
    return arrived;
}

void cuda_waiting(colld_backend_t *b, void (*fn)(void *arg, const colld_coll_t *k, const bool *arrived), void *arg)
{
    colld_gpus_t *g = gpus_of(b);
    if (!g || g->hold) /* held back by a reset, not by the ranks */
        return;
    for (colld_coll_t *k = g->pending; k; k = k->next) {
        if (!first_of_comm(g->pending, k) || cuda_is_plan_reg(k)) /* a registration waits for no stream */
            continue;
        bool *arrived = arrivals(b, k);
        if (!arrived)
            return;
        fn(arg, k, arrived);
        free(arrived);
    }
    /* The hand-offs waiting on the GPU (issue 28): the first of each communicator, as pending ones. */
    for (colld_coll_t *k = g->handoffs ? g->running : NULL; k; k = k->next) {
        bool first = true;
        for (colld_coll_t *e = g->running; e != k && first; e = e->next)
            first = !(e->comm == k->comm && cuda_handoff_waits(e));
        if (!first || !cuda_handoff_waits(k))
            continue;
        bool *arrived = arrivals(b, k);
        if (!arrived)
            return;
        if (!cuda_handoff_open(k))
            fn(arg, k, arrived);
        free(arrived);
    }
}

bool cuda_coll_movable(colld_backend_t *b)
{
    colld_gpus_t *g = gpus_of(b);
    if (g->launch)
        return true;
    for (colld_coll_t *k = g->running; k; k = k->next)
        if (first_of_comm(g->running, k) && cuda_event_query(g, k->bint, (CUevent)k->bpriv) != CUDA_ERROR_NOT_READY)
            return true;
    for (colld_coll_t *k = g->pending; k; k = k->next) {
        int missing[1], nmissing;
        if (!first_of_comm(g->pending, k))
            continue;
        if (cuda_is_plan_reg(k) ? !gpu_comm_of(b, k->comm)->running
                                : !g->hold && all_ready(b, k, missing, 1, &nmissing))
            return true;
    }
    return false;
}

/* The launched list comes back (lock held): those that run wait for their event; those whose
 * launch failed fail, and their communicator with them (the ranks' later collectives depend on
 * them). Each counted as running since it left pending (cuda_progress): the releases its
 * communicator owes are written once it is finished, after its own `done` writes. */
void cuda_launched(colld_backend_t *b)
{
    colld_gpus_t *g = gpus_of(b);
    colld_coll_t *list = g->launch;
    g->launch = NULL;
    while (list) {
        colld_coll_t *k = list;
        list = k->next;
        k->next = NULL;
        cuda_handoff_launched(k); /* a cancel asked for while it was being launched is written */
        if (k->status == COLLD_OK) {
            CUDA_LIST_APPEND(g->running, k); /* FIFO: launch order */
            continue;
        }
        LOG_WARN(GPU, "communicator %llu: %s", (unsigned long long)k->comm->id, k->why);
        colld_comm_break(b->d, k->comm, k->status, -1, k->why);
        gpu_finish(b, k, true); /* nothing it enqueued runs any more (cuda_launch.c drain_streams) */
    }
}

bool cuda_comm_busy(const colld_backend_t *b, const colld_dcomm_t *c)
{
    const gpu_comm_t *gc = gpu_comm_of(b, c);
    return gc && gc->busy > 0;
}

/* The communicator broke: fail its matched GPU collectives that were not launched, and release
 * every rank's stream past what it posted (deferred while a kernel runs). One that a rank closed
 * (destroyed its handle) keeps the sends and receives between the ranks still there: a rank with
 * one outstanding keeps its stream, which that send or receive releases when it ends (a
 * pipeline's last stage still gets its data when an earlier stage has destroyed its handle). */
void cuda_coll_comm_broken(colld_backend_t *b, colld_dcomm_t *c)
{
    colld_gpus_t *g = gpus_of(b);
    if (g) {
        colld_coll_t *prev = NULL;
        for (colld_coll_t *k = g->pending; k;) {
            colld_coll_t *next = k->next;
            if (k->comm != c) {
                prev = k;
                k = next;
                continue;
            }
            pending_unlink(g, prev, k);
            k->status = colld_comm_waiting_status(c);
            k->start_ns = 0;
            gpu_finish(b, k, false);
            k = next;
        }
    }
    if (g) { /* its hand-offs still waiting on the GPU are abandoned (issue 28) */
        for (colld_coll_t *k = g->running; k; k = k->next)
            if (k->comm == c)
                cuda_handoff_cancel(k);
        for (colld_coll_t *k = g->launch; k; k = k->next)
            if (k->comm == c)
                cuda_handoff_cancel(k);
    }
    gpu_comm_t *gc = gpu_comm_of(b, c);
    for (int r = 0; r < c->nranks; r++) {
        colld_member_t *m = &c->ranks[r];
        if (c->state == COLLD_COMM_CLOSING && m->p2p_head)
            continue;
        if (m->session && gpu_session_of(b, m->session) && gc->base_set[r])
            owe_release(b, c, r, gc->last[r], colld_comm_waiting_status(c));
    }
}

/* The communicator is freed: no collective of it is in flight any more (each held a reference). */
void cuda_comm_freed(colld_backend_t *b, colld_dcomm_t *c)
{
    gpu_comm_t *gc = gpu_comm_of(b, c);
    if (!gc)
        return;
    colld_gpus_t *g = gpus_of(b);
    if (g)
        cuda_track_comm(g, gc, false);
    for (int i = 0; g && i < g->n; i++)
        if (gc->stream[i]) {
            CU_CHECK(g->cu, cuCtxPushCurrent, g->gpu[i].ctx);
            CU_CHECK(g->cu, cuStreamDestroy, gc->stream[i]);
            CU_CHECK(g->cu, cuCtxPopCurrent, NULL);
        }
    free(gc->stream), free(gc->owe), free(gc->owed), free(gc->base_set), free(gc->base), free(gc->last);
    free(gc);
    c->bslot[b->slot] = NULL;
}
