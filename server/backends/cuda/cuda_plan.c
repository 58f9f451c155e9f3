/*
 * cuda_plan.c - persistent plans (issue 15 item 3): a collective captured into a CUDA graph runs
 * once per replay of the graph.
 *
 * At capture time each rank's libcolld posts a registration descriptor (COLLD_SQE_STREAM |
 * COLLD_SQE_PLAN) naming the collective, its buffers and a plan line of its session's GPU flag
 * area; the engine numbers and matches it like any collective (the same call on every rank, else
 * COLLD_ERR_MISMATCH), and cuda_progress installs the plan when it comes up in sequence order
 * (cuda_plan_install): the plan keeps a copy of every rank's descriptor with references on its
 * session and buffers, so the buffers stay mapped for as long as the graph may be replayed. The
 * registration then completes, and libcolld puts three stream memory operations into the graph
 * (proto/wire.h, "Persistent plans": ready = 1, wait done == 1, done = 0).
 *
 * A replay: the watcher (cuda_watch.c) sees every rank's ready at 1 and wakes the engine;
 * cuda_plan_progress takes the readies (0, from the host) and puts the plan's run (a colld_coll_t
 * of its own, reused) on the launch list; cuda_launch.c launches its kernels on the communicator's
 * streams as for any collective, and the lead GPU's stream writes every rank's plan `done` = 1
 * (cuda_done_target, cuda_base.c) and records the event; when the event has fired the run is over
 * (cuda_plan_run_finished). Nothing is posted to the ranks' completion rings: a replay's
 * completion is the graph's own (its wait on `done`).
 *
 * Faults: a replay some rank's graph never reaches within the communicator's timeout breaks the
 * communicator with COLLD_ERR_TIMEOUT naming the ranks; a broken or closed communicator, a rank's
 * graph destroyed (COLLD_MSG_PLAN_FREE) or its process gone make the plan broken: from then on
 * every replay is released (ready taken, status, done = 1 from the host) without running, and the
 * first such release tells the communicator's ranks (their async-error query) if nothing had. A
 * launch or a run that fails releases the ranks it had taken. Every value read from a flag line
 * (the tenant's memory) is only compared with 1; the daemon computes every address from its own
 * copy of the line number.
 */
#include "server/backends/cuda/cuda_plan.h"

#include "common/log.h"
#include "common/util.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ============================================================================================
 * Plan lines
 * ========================================================================================== */

/* A part's plan line as the daemon maps it; NULL once the part is dropped. */
static colld_wire_gpu_plan_t *part_line(colld_backend_t *b, const gpu_plan_part_t *part)
{
    const gpu_session_t *gs = part->session ? gpu_session_of(b, part->session) : NULL;
    if (!gs || part->line >= gs->plans)
        return NULL;
    return (colld_wire_gpu_plan_t *)((char *)gs->flags + cuda_plan_line_offset(gs, part->line));
}

/* Has the part's graph reached the next run (its ready holds exactly 1)? */
static bool part_ready(colld_backend_t *b, const gpu_plan_part_t *part)
{
    const colld_wire_gpu_plan_t *l = part->freed ? NULL : part_line(b, part);
    return l && __atomic_load_n(&l->ready, __ATOMIC_ACQUIRE) == 1;
}

/* Take the part's ready (0) before its run is launched: a sequentially consistent store, visible
 * before anything the run's stream does later, so only the next replay's N1 sets it again. */
static void part_take(colld_backend_t *b, gpu_plan_part_t *part)
{
    colld_wire_gpu_plan_t *l = part_line(b, part);
    if (l)
        __atomic_store_n(&l->ready, 0, __ATOMIC_SEQ_CST);
}

/* Release the part's replay without a run: its status, then done = 1. */
static void part_release(colld_backend_t *b, gpu_plan_part_t *part, colld_status_t st)
{
    colld_wire_gpu_plan_t *l = part->freed ? NULL : part_line(b, part);
    if (!l)
        return;
    __atomic_store_n(&l->status, (int32_t)st, __ATOMIC_RELAXED);
    __atomic_store_n(&l->done, 1, __ATOMIC_SEQ_CST);
}

/* ============================================================================================
 * Admission and installation
 * ========================================================================================== */

colld_status_t cuda_plan_admit(colld_backend_t *b, colld_op_t *op, colld_err_t *err)
{
    gpu_session_t *gs = gpu_session_of(b, op->session);
    uint32_t line = op->d.reserved;
    if (!gs || line >= gs->plans)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "captured collective on plan line %u, but this process has %u (--max-plans-per-session)",
                             line, gs ? gs->plans : 0);
    if (gs->plan_line[line])
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "captured collective on plan line %u, which another captured collective of this process "
                             "still holds",
                             line);
    gs->plan_line[line] = PLAN_LINE_PENDING;
    return COLLD_OK;
}

void cuda_plan_unreserve(colld_backend_t *b, colld_session_t *s, const colld_wire_sqe_t *sqe)
{
    gpu_session_t *gs = gpu_session_of(b, s);
    if (gs && sqe->reserved < gs->plans && gs->plan_line[sqe->reserved] == PLAN_LINE_PENDING)
        gs->plan_line[sqe->reserved] = NULL;
}

bool cuda_is_plan_reg(const colld_coll_t *k)
{
    const colld_op_t *lead = colld_coll_lead(k);
    return lead && (lead->d.flags & COLLD_SQE_PLAN);
}

gpu_plan_t *cuda_plan_of_run(const colld_gpus_t *g, const colld_coll_t *k)
{
    for (gpu_plan_t *p = g ? g->plans : NULL; p; p = p->next)
        if (p->k == k)
            return p;
    return NULL;
}

/* Drop a part's references (its registrations, its session); the part is then inert. */
static void part_drop(colld_backend_t *b, gpu_plan_part_t *part)
{
    if (!part->session)
        return;
    gpu_session_t *gs = gpu_session_of(b, part->session);
    if (gs && part->line < gs->plans && gs->plan_line[part->line] == part)
        gs->plan_line[part->line] = NULL;
    if (part->op.send_reg)
        colld_session_release_reg(part->op.send_reg);
    if (part->op.recv_reg)
        colld_session_release_reg(part->op.recv_reg);
    part->op.send_reg = part->op.recv_reg = NULL;
    colld_session_unref(part->session);
    part->session = NULL;
    part->plan->live--;
}

/* Free a plan with no part left and no run in flight (lock held; may free its communicator). */
static void plan_free(colld_backend_t *b, gpu_plan_t *p)
{
    colld_gpus_t *g = gpus_of(b);
    for (int r = 0; r < p->nranks; r++)
        part_drop(b, &p->parts[r]);
    if (p->prev)
        p->prev->next = p->next;
    else
        g->plans = p->next;
    if (p->next)
        p->next->prev = p->prev;
    LOG_INFO(GPU, "communicator %llu: plan %llu freed (its graphs are gone): %llu replay(s) run, %llu released unrun",
             (unsigned long long)p->comm->id, (unsigned long long)p->id, (unsigned long long)p->runs,
             (unsigned long long)p->released);
    colld_dcomm_t *c = p->comm;
    free(p->k);
    free(p);
    colld_comm_unref(b->d, c);
}

colld_status_t cuda_plan_install(colld_backend_t *b, colld_coll_t *k, colld_err_t *err)
{
    colld_gpus_t *g = gpus_of(b);
    colld_dcomm_t *c = k->comm;
    int n = c->nranks;
    for (int r = 0; r < n; r++) {
        const colld_op_t *op = k->ops[r];
        gpu_session_t *gs = op ? gpu_session_of(b, op->session) : NULL;
        if (!gs || op->d.reserved >= gs->plans || gs->plan_line[op->d.reserved] != PLAN_LINE_PENDING)
            return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                                 "rank %d's captured collective has no plan line reserved for it", r);
    }
    gpu_plan_t *p = calloc(1, sizeof(*p) + (size_t)n * sizeof(p->parts[0]));
    colld_coll_t *run = calloc(1, sizeof(*run) + (size_t)n * sizeof(run->ops[0]));
    if (!p || !run) {
        free(p);
        free(run);
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
    }
    p->id = ++g->next_plan_id;
    p->comm = c;
    c->refs++;
    p->nranks = n;
    p->k = run;
    run->comm = c;
    run->backend = b;
    for (int r = 0; r < n; r++) {
        const colld_op_t *op = k->ops[r];
        gpu_plan_part_t *part = &p->parts[r];
        gpu_session_t *gs = gpu_session_of(b, op->session);
        part->plan = p;
        part->session = op->session;
        part->line = op->d.reserved;
        part->op = *op;
        part->op.next = NULL;
        part->session->refs++;
        if (part->op.send_reg)
            part->op.send_reg->refs++;
        if (part->op.recv_reg)
            part->op.recv_reg->refs++;
        gs->plan_line[part->line] = part;
        run->ops[r] = &part->op;
        p->live++;
    }
    p->next = g->plans;
    if (g->plans)
        g->plans->prev = p;
    g->plans = p;
    cuda_watch_kick(g);
    const colld_wire_sqe_t *a = &k->ops[0]->d;
    LOG_INFO(GPU, "communicator %llu: plan %llu holds captured collective #%llu (%s of %llu %s) of %d ranks",
             (unsigned long long)c->id, (unsigned long long)p->id, (unsigned long long)a->seq, colld_kind_name(a->kind),
             (unsigned long long)a->count, colld_dtype_name(a->dtype), n);
    return COLLD_OK;
}

/* ============================================================================================
 * Faults
 * ========================================================================================== */

/* The plan cannot run any more: record why (the first reason wins). */
static void plan_break(gpu_plan_t *p, colld_status_t st, const char *why)
{
    if (p->broken)
        return;
    p->broken = true;
    p->error = st;
    snprintf(p->why, sizeof(p->why), "%s", why);
    LOG_INFO(GPU,
             "communicator %llu: plan %llu can no longer run (%s: %s): its replays are released without running it",
             (unsigned long long)p->comm->id, (unsigned long long)p->id, colld_status_name(st), why);
}

void cuda_plan_comm_broken(colld_backend_t *b, colld_dcomm_t *c)
{
    colld_gpus_t *g = gpus_of(b);
    for (gpu_plan_t *p = g ? g->plans : NULL; p; p = p->next)
        if (p->comm == c)
            plan_break(p, c->error, c->error_detail);
}

/* A replay of a broken plan was released unrun: the communicator's ranks learn it through their
 * async-error query, once. A communicator still working breaks with the plan's error; one that a
 * rank closed (destroyed its handle) does not post notices itself, so the ranks with parts are
 * sent one (its error, COLLD_ERR_INVALID_USAGE). */
static void plan_tell(colld_backend_t *b, gpu_plan_t *p, int rank)
{
    colld_dcomm_t *c = p->comm;
    if (p->told)
        return;
    p->told = true;
    if (c->state == COLLD_COMM_READY) {
        char why[COLLD_DETAIL_LEN];
        snprintf(why, sizeof(why),
                 "a replay of captured collective #%llu (rank %d's graph) was released without "
                 "running it: %.*s",
                 (unsigned long long)p->parts[0].op.d.seq, rank, COLLD_DETAIL_LEN / 2, p->why);
        colld_comm_break(b->d, c, p->error, rank, why);
    }
    if (c->state != COLLD_COMM_CLOSING || !c->ranks)
        return;
    for (int r = 0; r < c->nranks; r++) {
        colld_member_t *m = &c->ranks[r];
        if (p->parts[r].session && m->session && !m->notify) {
            m->notify = true;
            c->notices_pending++;
        }
    }
    colld_complete_notices(c);
}

/* Free the part of a rank whose graph is gone or whose session ended: its line is never written
 * again (and may hold another plan at once); its references go once no run uses them. */
static void part_free(colld_backend_t *b, gpu_plan_part_t *part, colld_status_t st, const char *why)
{
    gpu_plan_t *p = part->plan;
    if (part->freed)
        return;
    part->freed = true;
    gpu_session_t *gs = part->session ? gpu_session_of(b, part->session) : NULL;
    if (gs && part->line < gs->plans && gs->plan_line[part->line] == part)
        gs->plan_line[part->line] = NULL;
    plan_break(p, st, why);
    if (!p->running)
        part_drop(b, part);
}

/* Release every replay of a broken plan that has reached it; returns how many. */
static int release_ready(colld_backend_t *b, gpu_plan_t *p)
{
    int n = 0;
    for (int r = 0; r < p->nranks; r++) {
        gpu_plan_part_t *part = &p->parts[r];
        if (!part_ready(b, part))
            continue;
        part_take(b, part);
        part_release(b, part, p->error);
        p->released++;
        n++;
        plan_tell(b, p, r);
    }
    return n;
}

/* ============================================================================================
 * Runs
 * ========================================================================================== */

/* Time the plan's next run out when its first rank reached it more than the timeout ago (every
 * rank's graph but some got there): the communicator breaks, naming the ranks whose graph never
 * did. Returns true when it did. */
static bool time_out(colld_backend_t *b, gpu_plan_t *p, uint64_t first, const int *missing, int nmissing, uint64_t now,
                     uint64_t *deadline)
{
    colld_dcomm_t *c = p->comm;
    if (!cuda_past_due(first, c->timeout_ms, now, deadline))
        return false;
    char why[COLLD_DETAIL_LEN];
    int off = snprintf(why, sizeof(why),
                       "a replay of captured collective #%llu (plan %llu) timed out after %d ms: the CUDA graph of "
                       "rank(s)",
                       (unsigned long long)p->parts[0].op.d.seq, (unsigned long long)p->id, c->timeout_ms);
    off = cuda_rank_list(why, sizeof(why), off, missing, nmissing);
    snprintf(why + off, sizeof(why) - (size_t)off, " never reached it (not replayed, or its inputs never ready)");
    colld_comm_break(b->d, c, COLLD_ERR_TIMEOUT, nmissing == 1 ? missing[0] : -1, why);
    return true;
}

/* Start the plan's run when every rank's graph reached it; otherwise note the arrivals and time
 * the run out. Returns the work done. */
static int plan_step(colld_backend_t *b, gpu_plan_t *p, uint64_t now, uint64_t *deadline)
{
    colld_gpus_t *g = gpus_of(b);
    int missing[8], nmissing = 0;
    uint64_t first = UINT64_MAX;
    for (int r = 0; r < p->nranks; r++) {
        gpu_plan_part_t *part = &p->parts[r];
        if (!part_ready(b, part)) {
            part->arrival_ns = 0;
            if (nmissing < 8)
                missing[nmissing] = r;
            nmissing++;
            continue;
        }
        if (!part->arrival_ns)
            part->arrival_ns = now;
        first = COLLD_MIN(first, part->arrival_ns);
    }
    if (nmissing == p->nranks)
        return 0;
    if (nmissing)
        return time_out(b, p, first, missing, nmissing, now, deadline) ? 1 : 0;
    char why[COLLD_DETAIL_LEN];
    if (cuda_coll_unusable(b, p->k, why, sizeof(why))) {
        LOG_WARN(GPU, "communicator %llu: plan %llu: %s", (unsigned long long)p->comm->id, (unsigned long long)p->id,
                 why);
        colld_comm_break(b->d, p->comm, COLLD_ERR_DEVICE, -1, why);
        return 1;
    }
    for (int r = 0; r < p->nranks; r++) {
        part_take(b, &p->parts[r]);
        p->parts[r].taken = true;
        p->parts[r].arrival_ns = 0;
    }
    colld_coll_t *k = p->k;
    k->status = COLLD_OK;
    k->next = NULL;
    k->bpriv = NULL;
    k->why[0] = '\0';
    k->start_ns = k->end_ns = 0;
    p->running = true;
    CUDA_LIST_APPEND(g->launch, k);
    return 1;
}

int cuda_plan_progress(colld_backend_t *b, uint64_t now, uint64_t *deadline)
{
    colld_gpus_t *g = gpus_of(b);
    int work = 0;
    for (gpu_plan_t *p = g->plans, *next; p; p = next) {
        next = p->next;
        if (p->running)
            continue;
        for (int r = 0; r < p->nranks; r++) {
            gpu_plan_part_t *part = &p->parts[r];
            if (part->session && part->session->dead) {
                char why[128];
                snprintf(why, sizeof(why), "the process of rank %d (pid %d) ended", r, (int)part->session->pid);
                part_free(b, part, COLLD_ERR_PEER_LOST, why);
                part_drop(b, part);
            }
        }
        if (p->live == 0) {
            plan_free(b, p);
            work++;
            continue;
        }
        if (p->broken) {
            work += release_ready(b, p);
            continue;
        }
        /* A break below only marks plans broken: the list stays as it is. */
        if (!g->hold)
            work += plan_step(b, p, now, deadline);
    }
    return work;
}

bool cuda_plan_movable(colld_backend_t *b)
{
    colld_gpus_t *g = gpus_of(b);
    for (gpu_plan_t *p = g ? g->plans : NULL; p; p = p->next) {
        if (p->running)
            continue;
        if (p->live == 0)
            return true;
        bool all = true, any = false;
        for (int r = 0; r < p->nranks; r++) {
            const gpu_plan_part_t *part = &p->parts[r];
            if (part->session && part->session->dead)
                return true;
            bool ready = part_ready(b, part);
            all &= ready;
            any |= ready;
        }
        if (any && (p->broken || (all && !g->hold)))
            return true;
    }
    return false;
}

void cuda_plan_run_finished(colld_backend_t *b, colld_coll_t *k)
{
    colld_gpus_t *g = gpus_of(b);
    gpu_plan_t *p = cuda_plan_of_run(g, k);
    if (!p)
        return;
    p->running = false;
    if (k->status == COLLD_OK) {
        p->runs++;
        LOG_DEBUG(GPU, "communicator %llu: plan %llu ran replay %llu", (unsigned long long)p->comm->id,
                  (unsigned long long)p->id, (unsigned long long)p->runs);
    } else {
        /* Its launch or its kernels failed (the communicator broke with why, and the plan with
         * it): what it had taken is released from here. A `done` its stream did write is written
         * again, which can only let one later replay of this broken plan pass early: each is
         * released anyway. */
        plan_break(p, k->status, k->why[0] ? k->why : "its run failed");
    }
    for (int r = 0; r < p->nranks; r++) {
        gpu_plan_part_t *part = &p->parts[r];
        if (part->taken && k->status != COLLD_OK)
            part_release(b, part, p->error);
        part->taken = false;
        if (part->freed)
            part_drop(b, part);
    }
    if (p->live == 0)
        plan_free(b, p);
}

/* ============================================================================================
 * Graphs destroyed, and the daemon stopping
 * ========================================================================================== */

int cuda_plan_session_msg(colld_backend_t *b, colld_session_t *s, const colld_wire_msg_t *m)
{
    if (m->type != COLLD_MSG_PLAN_FREE)
        return -2;
    colld_daemon_t *d = s->daemon;
    colld_err_t err = COLLD_ERR_INIT;
    uint32_t line = m->u.plan_free.line;
    pthread_mutex_lock(&d->lock);
    gpu_session_t *gs = b && gpus_of(b) ? gpu_session_of(b, s) : NULL;
    gpu_plan_part_t *part = gs && line < gs->plans ? gs->plan_line[line] : NULL;
    if (!part || part == PLAN_LINE_PENDING) {
        colld_err_set(&err, COLLD_ERR_INVALID_ARGUMENT, "plan line %u holds no captured collective of this process",
                      line);
    } else {
        gpu_plan_t *p = part->plan;
        int rank = (int)(part - p->parts);
        char why[160];
        snprintf(why, sizeof(why), "rank %d (pid %d) destroyed its CUDA graph holding the captured collective", rank,
                 (int)s->pid);
        LOG_INFO(GPU, "communicator %llu: plan %llu: %s", (unsigned long long)p->comm->id, (unsigned long long)p->id,
                 why);
        part_free(b, part, COLLD_ERR_INVALID_USAGE, why);
        if (p->live == 0 && !p->running)
            plan_free(b, p);
        else
            colld_engine_wake(d);
    }
    pthread_mutex_unlock(&d->lock);
    if (err.status != COLLD_OK)
        return colld_session_send_error(s, COLLD_MSG_PLAN_FREE_REPLY, &err);
    colld_wire_msg_t ok;
    memset(&ok, 0, sizeof(ok));
    ok.type = COLLD_MSG_PLAN_FREE_REPLY;
    ok.u.plan_free.line = line;
    return colld_session_send(s, &ok, NULL, 0);
}

void cuda_plans_free_all(colld_backend_t *b)
{
    colld_gpus_t *g = gpus_of(b);
    pthread_mutex_lock(&b->d->lock);
    while (g && g->plans) {
        g->plans->running = false; /* the engine has stopped: nothing of it is in flight */
        plan_free(b, g->plans);
    }
    pthread_mutex_unlock(&b->d->lock);
}
