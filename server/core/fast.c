/*
 * fast.c - the fast area of a single-node communicator (layout and protocol in proto/wire.h).
 *
 * Small collectives (each rank's input at most the area's slot size) are run by the ranks
 * themselves on this shared memory, so a collective of two awake ranks costs no context switch
 * and no system call. The daemon stays the authority for everything else: it creates the area
 * when the communicator forms, hands it to each member, matches the records the ranks post for
 * each such collective (sequence numbers, signatures, time-outs, the flight recorder), and when
 * the communicator breaks it writes the error into the area and wakes every waiting rank.
 *
 * The module is told of every communicator's life through its hooks (colld_fast_hooks, backend.h):
 * formed (make the area), judge (resolve_fast: what the ranks did with the next collective, before
 * the engine matches it), settle, broken (wake the ranks with the error), freed; and it serves the
 * session message COLLD_MSG_FAST_AREA. All functions run with daemon->lock held unless they say.
 */
#include "server/core/counters.h"
#include "server/core/daemon.h"
#include "server/core/tenant.h"
#include "server/core/verify.h"

#include "common/log.h"
#include "common/util.h"
#include "transport/shm/ring.h"
#include "transport/shm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Largest area per communicator: large communicators get smaller slots (or none). */
#define FAST_AREA_MAX (16u << 20)

/* Round up to a cache line. */
static uint64_t line_up(uint64_t v)
{
    return (v + COLLD_WIRE_CACHELINE - 1) & ~(uint64_t)(COLLD_WIRE_CACHELINE - 1);
}

/* Create the area when a communicator forms. Returns 0 (also when there is none: off, multi-node,
 * too many ranks) or -1 (could not be made: the engine path serves everything). */
static int fast_create(colld_daemon_t *d, colld_dcomm_t *c)
{
    uint64_t slot = d->cfg.fast_path_bytes;
    if (slot == 0 || colld_comm_multi_node(c) || d->cfg.nan_check || c->nan_check || colld_comm_verifies(d, c))
        return 0; /* disabled, multi-node (the network stages need the daemon), or the daemon checks inputs */
    uint64_t share = FAST_AREA_MAX / (uint64_t)c->nranks;
    if (share < sizeof(colld_wire_fast_stats_t) + COLLD_WIRE_FAST_DEPTH * 2 * COLLD_WIRE_CACHELINE)
        return 0;
    uint64_t per_rank = (share - sizeof(colld_wire_fast_stats_t)) / COLLD_WIRE_FAST_DEPTH;
    if (slot > per_rank - sizeof(colld_wire_fast_slot_t))
        slot = (per_rank - sizeof(colld_wire_fast_slot_t)) & ~(uint64_t)(COLLD_WIRE_CACHELINE - 1);
    uint64_t stride = line_up(sizeof(colld_wire_fast_slot_t) + slot);
    uint64_t hdr = COLLD_WIRE_FAST_SLOTS_OFFSET(c->nranks);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t total = (hdr + stride * COLLD_WIRE_FAST_DEPTH * (uint64_t)c->nranks + page - 1) & ~(page - 1);
    char name[64];
    int fd = -1;
    void *p;
    /* The daemon's memory, made for the communicator's tenant: charged to it; without room the
     * communicator has no area (the engine serves its small collectives too). */
    colld_err_t err = COLLD_ERR_INIT;
    if (colld_tenant_charge_mem(d, c->tenant, total, &err) != COLLD_OK) {
        LOG_INFO_RL(COLL, "communicator %llu: no fast area: %s", (unsigned long long)c->id, err.msg);
        return 0;
    }
    snprintf(name, sizeof(name), "colld-fast-%llu", (unsigned long long)c->id);
    /* Sealed: no member can shrink the file under the daemon's mapping (SIGBUS). */
    if (colld_shm_create(name, total, &fd, &p) < 0)
        goto fail;
    colld_wire_fast_t *f = p;
    f->magic = COLLD_WIRE_FAST_MAGIC;
    f->nranks = (uint32_t)c->nranks;
    f->slot_bytes = (uint32_t)slot;
    f->slot_stride = (uint32_t)stride;
    f->total_size = total;
    c->fast_seen = calloc((size_t)c->nranks, sizeof(*c->fast_seen));
    if (!c->fast_seen) {
        (void)SYS_CHECK(MEM, munmap(p, total));
        goto fail;
    }
    c->fast = f;
    c->fast_size = total;
    c->fast_stride = stride;
    c->fast_fd = fd;
    return 0;
fail:
    LOG_WARN(COLL, "communicator %llu: no fast area (%s); every collective goes through the engine",
             (unsigned long long)c->id, strerror(errno));
    if (fd >= 0)
        close(fd);
    colld_tenant_uncharge_mem(d, c->tenant, total);
    return -1;
}

/* Free the area (after the counters took what the ranks finished on it). */
static void fast_free(colld_daemon_t *d, colld_dcomm_t *c)
{
    if (!c->fast)
        return;
    colld_fast_harvest(d, c);
    free(c->fast_seen);
    c->fast_seen = NULL;
    (void)SYS_CHECK(MEM, munmap(c->fast, c->fast_size));
    colld_tenant_uncharge_mem(d, c->tenant, c->fast_size);
    close(c->fast_fd);
    c->fast = NULL;
    c->fast_fd = -1;
}

/* The communicator broke: write its error into the area and wake every waiting rank (a rank that
 * left makes that PEER_LOST, colld_comm_waiting_status). */
static void fast_break(colld_dcomm_t *c)
{
    if (!c->fast || c->error == COLLD_OK)
        return;
    __atomic_store_n(&c->fast->status, (int32_t)colld_comm_waiting_status(c), __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&c->fast->gen, 1, __ATOMIC_SEQ_CST);
    colld_futex_wake_all(&c->fast->gen);
}

/* A new descriptor of the area for a member's session: the fd and *size, or -1 with err. */
static int fast_dup(colld_session_t *s, uint32_t handle, uint64_t *size, colld_err_t *err)
{
    colld_member_t *m = colld_comm_member(s, handle);
    if (!m) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "unknown communicator handle %u", handle);
        return -1;
    }
    colld_dcomm_t *c = m->comm;
    if (!c->fast) {
        colld_err_set(
            err, COLLD_ERR_NOT_SUPPORTED, "communicator %llu has no fast area (%s)", (unsigned long long)c->id,
            colld_comm_multi_node(c) ? "it spans several nodes" : "fast-path-bytes is 0 or the area could not be made");
        return -1;
    }
    int fd = fcntl(c->fast_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        colld_err_set(err, COLLD_ERR_SYSTEM, "daemon cannot share the fast area: %s", strerror(errno));
        return -1;
    }
    *size = c->fast_size;
    return fd;
}

/* The slot header rank `rank` last published for the parity of `seq`: a consistent copy, or one
 * whose seq says the rank has gone past it (it was rewriting the slot). The address comes from the
 * daemon's own layout (c->nranks, c->fast_stride), never from the area's header, which every
 * member can write. */
static colld_wire_fast_slot_t slot_copy(const colld_dcomm_t *c, int rank, uint64_t seq)
{
    colld_wire_fast_slot_t *s = (colld_wire_fast_slot_t *)((char *)c->fast + COLLD_WIRE_FAST_SLOTS_OFFSET(c->nranks) +
                                                           ((size_t)rank * COLLD_WIRE_FAST_DEPTH +
                                                            seq % COLLD_WIRE_FAST_DEPTH) *
                                                               c->fast_stride);
    colld_wire_fast_slot_t out;
    out.seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
    memcpy((char *)&out + sizeof(out.seq), (const char *)s + sizeof(s->seq), sizeof(out) - sizeof(out.seq));
    /* A seqlock read: the rank sets seq to 0 before it rewrites the slot for seq + 2, so a
     * changed seq means the copy may be torn, and the rank has moved on. */
    uint64_t again = __atomic_fetch_add(&s->seq, 0, __ATOMIC_ACQ_REL); /* release: the copy is done first */
    if (again != out.seq)
        out.seq = again ? again : out.seq + COLLD_WIRE_FAST_DEPTH;
    return out;
}

/* Where rank `rank` is in collective `seq` by its slots: it published it (its call and arrival
 * time in *call and *arrival_ns), it has gone past it, or neither yet. */
typedef enum { FAST_ABSENT = 0, FAST_PUBLISHED = 1, FAST_PASSED = 2 } fast_seen_t;
static fast_seen_t rank_at(const colld_dcomm_t *c, int rank, uint64_t seq, colld_wire_sqe_t *call, uint64_t *arrival_ns)
{
    colld_wire_fast_slot_t a = slot_copy(c, rank, seq), b = slot_copy(c, rank, seq + 1);
    if (a.seq == seq) {
        memset(call, 0, sizeof(*call));
        call->seq = seq;
        call->count = a.count;
        call->kind = a.kind;
        call->dtype = a.dtype;
        call->redop = a.redop;
        call->root = a.root;
        call->flags = COLLD_SQE_FAST;
        *arrival_ns = a.arrival_ns;
        return FAST_PUBLISHED;
    }
    return a.seq > seq || b.seq > seq ? FAST_PASSED : FAST_ABSENT;
}

/* Add what the ranks finished on the area since the last look to the counters. */
void colld_fast_harvest(colld_daemon_t *d, colld_dcomm_t *c)
{
    if (!c->fast)
        return;
    const colld_wire_fast_stats_t *st = (const colld_wire_fast_stats_t *)((const char *)c->fast +
                                                                          COLLD_WIRE_FAST_STATS_OFFSET);
    for (int r = 0; r < c->nranks; r++)
        for (unsigned k = 0; k < COLLD_WIRE_FAST_KINDS; k++)
            for (unsigned t = 0; t < COLLD_WIRE_FAST_DTYPES; t++) {
                /* Counters only grow; anything else is the tenant scribbling and is ignored. */
                uint64_t ops = __atomic_load_n(&st[r].ops[k][t], __ATOMIC_RELAXED);
                uint64_t bytes = __atomic_load_n(&st[r].bytes[k][t], __ATOMIC_RELAXED);
                uint64_t *seen = c->fast_seen[r].ops[k];
                uint64_t *seen_b = c->fast_seen[r].bytes[k];
                if (ops <= seen[t] || bytes < seen_b[t])
                    continue;
                colld_count_ops_add(d, k + 1, t, ops - seen[t], bytes - seen_b[t]);
                c->ops_completed += r == 0 ? ops - seen[t] : 0;
                seen[t] = ops;
                seen_b[t] = bytes;
            }
}

/* ============================================================================================
 * The judgement: what the ranks did with the next collective (resolve_fast)
 * ========================================================================================== */

/* Where a rank stands in the collective resolve_fast looks at. */
enum { AT_ABSENT = 0, AT_ENGINE, AT_RECORD, AT_SLOT, AT_PASSED };

/* What resolve_fast gathered about collective seq, rank by rank. */
typedef struct {
    uint64_t seq;
    int n;
    int engine, fast, absent;    /* ranks that posted it to the engine, ran it beside it, or neither */
    int slot_only;               /* ranks seen on the fast area that have not posted their record yet */
    bool slot_differs;           /* ... one of them with another call: its record is coming */
    bool differ;                 /* two records name different calls */
    const colld_wire_sqe_t *ref; /* the first record's call */
    uint64_t first;              /* the first arrival */
    colld_wire_sqe_t *calls;     /* [n] each rank's call, where known */
    uint64_t *arrivals;          /* [n] */
    signed char *where;          /* [n] AT_* */
} fast_view_t;

/* The verdict on a view. */
typedef enum {
    VERDICT_WAIT_RECORDS, /* a mismatch whose report needs the records still coming */
    VERDICT_MISMATCH,     /* engine calls against fast-area calls, or different records */
    VERDICT_ENGINE,       /* every rank there posted it to the engine: it matches it */
    VERDICT_ALL_RAN,      /* every rank ran it on the area: record it, retire the records */
    VERDICT_WAITING,      /* ranks are missing: wait, or time out */
} fast_verdict_t;

/* The lowest sequence number queued by any rank, UINT64_MAX when none is. */
static uint64_t lowest_queued_seq(const colld_dcomm_t *c)
{
    uint64_t seq = UINT64_MAX;
    for (int r = 0; r < c->nranks; r++)
        if (c->ranks[r].head && c->ranks[r].head->d.seq < seq)
            seq = c->ranks[r].head->d.seq;
    return seq;
}

/* The common case, decided without reading the slots: every rank posted seq to the engine. */
static bool all_posted_to_engine(const colld_dcomm_t *c, uint64_t seq)
{
    for (int r = 0; r < c->nranks; r++) {
        const colld_op_t *h = c->ranks[r].head;
        if (!h || h->d.seq != seq || (h->d.flags & COLLD_SQE_FAST))
            return false;
    }
    return true;
}

static void view_free(fast_view_t *v)
{
    free(v->calls);
    free(v->arrivals);
    free(v->where);
}

/* Where rank r stands in v->seq: its queued record or descriptor, else its slots. */
static void view_rank(const colld_dcomm_t *c, int r, uint64_t now, fast_view_t *v)
{
    const colld_op_t *h = c->ranks[r].head;
    if (h && h->d.seq == v->seq) {
        v->calls[r] = h->d;
        v->arrivals[r] = h->arrival_ns;
        v->where[r] = (h->d.flags & COLLD_SQE_FAST) ? AT_RECORD : AT_ENGINE;
    } else if (h) {
        v->where[r] = AT_PASSED; /* its next descriptor is later: it ran seq on the fast area */
    } else {
        fast_seen_t at = rank_at(c, r, v->seq, &v->calls[r], &v->arrivals[r]);
        v->where[r] = at == FAST_PUBLISHED ? AT_SLOT : at == FAST_PASSED ? AT_PASSED : AT_ABSENT;
        if (v->arrivals[r] > now)
            v->arrivals[r] = now; /* the tenant's own clock values are not believed blindly */
    }
}

/* Gather every rank's position in collective seq. Returns 0, or -1 without memory. */
static int view_gather(const colld_dcomm_t *c, uint64_t seq, uint64_t now, fast_view_t *v)
{
    memset(v, 0, sizeof(*v));
    v->seq = seq;
    v->n = c->nranks;
    v->first = UINT64_MAX;
    v->calls = calloc((size_t)v->n, sizeof(*v->calls));
    v->arrivals = calloc((size_t)v->n, sizeof(*v->arrivals));
    v->where = calloc((size_t)v->n, 1);
    if (!v->calls || !v->arrivals || !v->where) {
        view_free(v);
        return -1;
    }
    for (int r = 0; r < v->n; r++) {
        view_rank(c, r, now, v);
        if (v->where[r] == AT_ENGINE)
            v->engine++;
        else if (v->where[r] == AT_ABSENT)
            v->absent++;
        else
            v->fast++;
        /* Only records are compared: a rank that sees a different call in a peer's slot posts
         * one itself, so the daemon never judges a call from slot bytes it reads under the
         * writer's feet. */
        if (v->where[r] == AT_RECORD) {
            if (!v->ref)
                v->ref = &v->calls[r];
            else if (!colld_same_call(v->ref, &v->calls[r]))
                v->differ = true;
        }
        if (v->where[r] != AT_ABSENT && v->where[r] != AT_PASSED && v->arrivals[r] && v->arrivals[r] < v->first)
            v->first = v->arrivals[r];
    }
    for (int r = 0; r < v->n; r++)
        if (v->where[r] == AT_SLOT) {
            v->slot_only++;
            v->slot_differs |= v->ref && !colld_same_call(v->ref, &v->calls[r]);
        }
    return 0;
}

/* The rules, in order (see resolve_fast). */
static fast_verdict_t judge_view(const fast_view_t *v)
{
    if ((v->engine && v->fast && v->slot_only && !v->differ) || (!v->engine && !v->differ && v->slot_differs))
        return VERDICT_WAIT_RECORDS;
    if ((v->engine && v->fast) || v->differ)
        return VERDICT_MISMATCH;
    if (v->engine)
        return VERDICT_ENGINE;
    if (!v->absent)
        return VERDICT_ALL_RAN;
    return VERDICT_WAITING;
}

/* MISMATCH naming each rank's call: its record or descriptor, else where it is. */
static void report_mismatch(colld_daemon_t *d, colld_dcomm_t *c, const fast_view_t *v)
{
    char why[COLLD_DETAIL_LEN];
    int off = snprintf(why, sizeof(why), "collective #%llu differs between ranks: ", (unsigned long long)v->seq);
    for (int r = 0; r < v->n && off < (int)sizeof(why) - 1; r++) {
        if (v->where[r] == AT_ENGINE || v->where[r] == AT_RECORD)
            off += colld_describe_call(why + off, sizeof(why) - (size_t)off, r, &v->calls[r]);
        else
            off += snprintf(why + off, sizeof(why) - (size_t)off, "%srank %d: %s", r ? "; " : "", r,
                            v->where[r] == AT_ABSENT ? "nothing yet" : "a small collective on the fast area");
    }
    colld_comm_break(d, c, COLLD_ERR_MISMATCH, -1, why);
}

/* Everyone ran it: the flight recorder gets it and the records are retired. */
static void retire_ran(colld_daemon_t *d, colld_dcomm_t *c, const fast_view_t *v, uint64_t now)
{
    int n = v->n;
    colld_op_t **ops = calloc((size_t)n, sizeof(*ops));
    colld_op_t *seen = calloc((size_t)n, sizeof(*seen)); /* the recorder's view of each rank */
    if (ops && seen) {
        /* A rank already past it (its slot reused) arrived too, at a time no longer known:
         * it is shown with the first arrival rather than as absent. */
        uint64_t first = UINT64_MAX;
        for (int r = 0; r < n; r++) {
            seen[r].d = v->where[r] == AT_RECORD ? v->calls[r] : *v->ref;
            seen[r].arrival_ns = v->arrivals[r] && v->where[r] != AT_PASSED ? v->arrivals[r] : v->first;
            ops[r] = &seen[r];
            first = COLLD_MIN(first, seen[r].arrival_ns);
        }
        colld_hooks_finished(d, c, ops, first, now, now, COLLD_OK);
    }
    free(ops);
    free(seen);
    for (int r = 0; r < n; r++) {
        colld_member_t *m = &c->ranks[r];
        if (v->where[r] != AT_RECORD)
            continue;
        colld_op_t *op = m->head;
        m->head = op->next;
        if (!m->head)
            m->tail = NULL;
        colld_op_drop_record(d, op);
    }
    c->exec_seq = v->seq + 1;
    c->p2p_dirty = true; /* a rank's sends and receives posted after it may run now */
}

/* Ranks are missing: past the time-out from the first arrival, fail naming them; else look again
 * at the deadline or in 10 ms (the slots change without waking the engine). */
static void wait_or_time_out(colld_daemon_t *d, colld_dcomm_t *c, const fast_view_t *v, uint64_t now,
                             uint64_t *deadline)
{
    uint64_t dl = v->first == UINT64_MAX ? now : v->first + (uint64_t)c->timeout_ms * 1000000ull;
    if (now < dl) {
        uint64_t look = now + 10000000ull;
        *deadline = COLLD_MIN(COLLD_MIN(dl, look), *deadline);
        colld_match_wait_event(d, c, v->first, now, deadline);
        return;
    }
    char why[COLLD_DETAIL_LEN];
    int off = snprintf(why, sizeof(why), "collective #%llu timed out after %d ms: rank(s)", (unsigned long long)v->seq,
                       c->timeout_ms);
    for (int r = 0; r < v->n && off < (int)sizeof(why) - 64; r++)
        if (v->where[r] == AT_ABSENT)
            off += snprintf(why + off, sizeof(why) - (size_t)off, " %d", r);
    snprintf(why + off, sizeof(why) - (size_t)off, " never arrived (fast area)");
    colld_comm_break(d, c, COLLD_ERR_TIMEOUT, -1, why);
}

/* A communicator with a fast area: the ranks run small collectives there and skip their sequence
 * numbers here; a rank that waited posts a record. Look at the lowest sequence number queued,
 * seq, and at every rank's slots for it:
 *  - engine descriptors of every rank: returns true, matching runs it;
 *  - engine descriptors of some ranks while others ran or posted seq on the fast area (or recorded
 *    a different call): MISMATCH naming each rank's call (after the moment it takes the ranks seen
 *    only on the area to post their records, so that the report names their calls);
 *  - records only, every rank there (a record, its slot, or gone past seq): the collective
 *    happened; the records go into the flight recorder and are retired;
 *  - otherwise it waits; past the time-out (from the first arrival) it fails naming the ranks
 *    that never came. *deadline gets the time to look again (the slots change without a wake-up).
 * Returns false unless matching should run. */
static bool resolve_fast(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now, uint64_t *deadline)
{
    uint64_t seq = lowest_queued_seq(c);
    if (seq == UINT64_MAX)
        return false;
    c->exec_seq = seq;
    if (all_posted_to_engine(c, seq))
        return true;
    fast_view_t v;
    if (view_gather(c, seq, now, &v) < 0)
        return false; /* try again on the next pass */
    bool engine_path = false;
    switch (judge_view(&v)) {
    case VERDICT_WAIT_RECORDS: /* about 0.25 ms */
        *deadline = COLLD_MIN(now + 1000000ull, *deadline);
        break;
    case VERDICT_MISMATCH:
        report_mismatch(d, c, &v);
        break;
    case VERDICT_ENGINE:
        engine_path = true; /* matching and the engine's time-out take it from here */
        break;
    case VERDICT_ALL_RAN:
        retire_ran(d, c, &v, now);
        break;
    case VERDICT_WAITING:
        wait_or_time_out(d, c, &v, now, deadline);
        break;
    }
    view_free(&v);
    return engine_path;
}

/* ============================================================================================
 * The module's hooks
 * ========================================================================================== */

/* The communicator formed: make its area; with one, its collectives may run beside the engine. */
static void fast_on_formed(colld_daemon_t *d, colld_dcomm_t *c)
{
    fast_create(d, c);
    c->side_path = c->fast != NULL;
}

/* Before matching: a communicator with an area is judged by resolve_fast (time-outs included). */
static bool fast_on_judge(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now, uint64_t *deadline)
{
    return !c->fast || resolve_fast(d, c, now, deadline);
}

/* Retire the records of collectives every rank has finished, so that a leave or a lost rank does
 * not fail them. */
static void fast_on_settle(colld_daemon_t *d, colld_dcomm_t *c)
{
    uint64_t now = colld_now_ns(), deadline = UINT64_MAX;
    while (c->fast && c->state == COLLD_COMM_READY) {
        uint64_t before = c->exec_seq;
        if (resolve_fast(d, c, now, &deadline) || c->exec_seq == before)
            break;
    }
}

static void fast_on_broken(colld_daemon_t *d, colld_dcomm_t *c)
{
    (void)d;
    fast_break(c);
}

static void fast_on_freed(colld_daemon_t *d, colld_dcomm_t *c)
{
    fast_free(d, c);
}

/* COLLD_MSG_FAST_AREA: hand a member its communicator's area (lock not held). */
static int fast_on_session_msg(colld_session_t *s, const colld_wire_msg_t *m)
{
    if (m->type != COLLD_MSG_FAST_AREA)
        return -2;
    colld_daemon_t *d = s->daemon;
    colld_err_t err = COLLD_ERR_INIT;
    uint64_t size = 0;
    pthread_mutex_lock(&d->lock);
    int fd = fast_dup(s, m->u.fast.handle, &size, &err);
    pthread_mutex_unlock(&d->lock);
    if (fd < 0)
        return colld_session_send_error(s, COLLD_MSG_FAST_AREA_REPLY, &err);
    colld_wire_msg_t ok;
    memset(&ok, 0, sizeof(ok));
    ok.type = COLLD_MSG_FAST_AREA_REPLY;
    ok.u.fast.handle = m->u.fast.handle;
    ok.u.fast.size = size;
    int rc = colld_session_send(s, &ok, &fd, 1);
    close(fd);
    return rc;
}

const colld_comm_hooks_t colld_fast_hooks = {
    .name = "fast area",
    .formed = fast_on_formed,
    .judge = fast_on_judge,
    .settle = fast_on_settle,
    .broken = fast_on_broken,
    .session_msg = fast_on_session_msg,
    .freed = fast_on_freed,
};
