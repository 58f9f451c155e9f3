/*
 * match.c - matching: a collective is identified by (communicator, sequence number). When every
 * local rank has posted its next one, their signatures (kind, dtype, op, count, root, stream
 * ordering) are compared: the same, and the ranks' operations leave their queues together as one
 * collective for a backend; different, and every rank fails with COLLD_ERR_MISMATCH naming each
 * rank's call, no buffer touched. A collective whose first rank arrived more than the
 * communicator's timeout ago fails for everyone with COLLD_ERR_TIMEOUT naming the ranks that never
 * arrived and how long the others waited. A rank's collective waits, too, while point-to-point
 * operations it posted before it have not completed (p2p.c): each rank's operations run in the
 * order it posted them. All functions run with daemon->lock held.
 */
#include "server/core/daemon.h"

#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>

/* The mismatch report of collective `seq`: each local rank's call (lock held). */
static void report_mismatch(colld_daemon_t *d, colld_dcomm_t *c, uint64_t seq)
{
    char why[COLLD_DETAIL_LEN];
    int off = snprintf(why, sizeof(why), "collective #%llu differs between ranks: ", (unsigned long long)seq);
    for (int r = 0; r < c->nranks && off < (int)sizeof(why) - 1; r++)
        if (!c->ranks[r].remote)
            off += colld_describe_call(why + off, sizeof(why) - (size_t)off, r, &c->ranks[r].head->d);
    colld_comm_break(d, c, COLLD_ERR_MISMATCH, -1, why);
}

colld_coll_t *colld_match(colld_daemon_t *d, colld_dcomm_t *c)
{
    const colld_wire_sqe_t *a = NULL;
    for (int r = 0; r < c->nranks; r++) {
        if (c->ranks[r].remote)
            continue; /* another node matches its own ranks */
        if (!c->ranks[r].head)
            return NULL;
        if (!a)
            a = &c->ranks[r].head->d;
    }
    if (!a)
        return NULL;
    for (int r = 0; r < c->nranks; r++)
        if (!c->ranks[r].remote && colld_p2p_holds(&c->ranks[r], c->ranks[r].head->d.seq))
            return NULL; /* its sends and receives before this collective come first */
    bool same = true;
    for (int r = 0; r < c->nranks && same; r++) {
        if (c->ranks[r].remote)
            continue;
        same = colld_same_call(a, &c->ranks[r].head->d);
    }
    if (!same) {
        report_mismatch(d, c, a->seq);
        return NULL;
    }
    colld_coll_t *k = malloc(sizeof(*k) + (size_t)c->nranks * sizeof(k->ops[0]));
    if (!k) {
        colld_comm_break(d, c, COLLD_ERR_NO_MEMORY, -1, "daemon out of memory");
        return NULL;
    }
    for (int r = 0; r < c->nranks; r++) {
        colld_member_t *m = &c->ranks[r];
        k->ops[r] = m->head;
        if (m->remote)
            continue;
        m->head = m->head->next;
        if (!m->head)
            m->tail = NULL;
        k->ops[r]->next = NULL;
    }
    k->comm = c;
    k->status = COLLD_OK;
    k->start_ns = k->end_ns = 0;
    k->next = NULL;
    k->backend = NULL;
    k->bpriv = NULL;
    k->bint = 0;
    k->bcheck = NULL;
    k->bhand = NULL;
    k->why[0] = '\0';
    c->refs++;
    c->colls_running++;
    c->exec_seq = a->seq + 1;
    return k;
}

/* The first arrival of the collective c waits for (c->exec_seq) among the local ranks that posted
 * it, or NULL when none has (lock held). */
static const colld_op_t *first_waiting(const colld_dcomm_t *c)
{
    const colld_op_t *first = NULL;
    if (c->state != COLLD_COMM_READY)
        return NULL;
    for (int r = 0; r < c->nranks; r++) {
        const colld_op_t *op = c->ranks[r].head;
        if (!c->ranks[r].remote && op && op->d.seq == c->exec_seq && (!first || op->arrival_ns < first->arrival_ns))
            first = op;
    }
    return first;
}

uint64_t colld_match_describe_wait(char *buf, size_t len, const colld_dcomm_t *c, uint64_t now, int *absent)
{
    *absent = -1;
    if (len)
        buf[0] = '\0';
    const colld_op_t *first = first_waiting(c);
    if (!first)
        return 0;
    uint64_t waited = now > first->arrival_ns ? now - first->arrival_ns : 1;
    int off = snprintf(buf, len, "collective #%llu (%s) has waited %llu ms", (unsigned long long)c->exec_seq,
                       colld_kind_name(first->d.kind), (unsigned long long)(waited / 1000000ull));
    int missing = 0;
    for (int r = 0; r < c->nranks && off < (int)len - 48; r++) {
        const colld_op_t *op = c->ranks[r].head;
        if (c->ranks[r].remote || (op && op->d.seq == c->exec_seq))
            continue;
        if (*absent < 0)
            *absent = r;
        off += snprintf(buf + off, len - (size_t)off, "%s%d (pid %d)", missing++ ? ", " : " for rank(s) ", r,
                        (int)colld_comm_rank_pid(c, r));
    }
    if (off < (int)len)
        snprintf(buf + off, len - (size_t)off, "%s",
                 missing == 1 ? ", which has not posted it"
                 : missing    ? ", which have not posted it"
                              : " (every rank here posted it; it has not run)");
    return waited;
}

void colld_match_wait_event(colld_daemon_t *d, colld_dcomm_t *c, uint64_t first_ns, uint64_t now,
                            uint64_t *deadline)
{
    uint64_t after = (uint64_t)d->cfg.wait_event_ms * 1000000ull;
    if (!after || c->wait_told == c->exec_seq + 1 || first_ns == UINT64_MAX)
        return;
    if (now < first_ns + after) {
        *deadline = COLLD_MIN(*deadline, first_ns + after);
        return;
    }
    char why[COLLD_DETAIL_LEN];
    int absent;
    uint64_t waited = colld_match_describe_wait(why, sizeof(why), c, now, &absent);
    if (!waited)
        return; /* the ranks that wait did so on the fast area, with no record here yet */
    c->wait_told = c->exec_seq + 1;
    /* At most a line a second (a tenant can make many communicators wait); each is an event. */
    COLLD_LOG_RL(COLLD_LOG_WARN, COLLD_SUB_COLL, 1000, "communicator %llu (%s): %s", (unsigned long long)c->id,
                 c->name, why);
    colld_hooks_waiting(d, c, absent, waited, why);
}

uint64_t colld_match_timeouts(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now)
{
    uint64_t first = UINT64_MAX;
    for (int r = 0; r < c->nranks; r++)
        if (!c->ranks[r].remote && c->ranks[r].head && c->ranks[r].head->arrival_ns < first)
            first = c->ranks[r].head->arrival_ns;
    if (first == UINT64_MAX)
        return UINT64_MAX;
    uint64_t deadline = first + (uint64_t)c->timeout_ms * 1000000ull;
    if (now < deadline) {
        colld_match_wait_event(d, c, first, now, &deadline);
        return deadline;
    }
    char why[COLLD_DETAIL_LEN];
    int off = snprintf(why, sizeof(why), "collective #%llu timed out after %d ms: rank(s)",
                       (unsigned long long)c->exec_seq, c->timeout_ms);
    for (int r = 0; r < c->nranks && off < (int)sizeof(why) - 64; r++)
        if (!c->ranks[r].head && !c->ranks[r].remote)
            off += snprintf(why + off, sizeof(why) - (size_t)off, " %d", r);
    off += snprintf(why + off, sizeof(why) - (size_t)off, " never arrived; waiting:");
    for (int r = 0; r < c->nranks && off < (int)sizeof(why) - 40; r++)
        if (c->ranks[r].head)
            off += snprintf(why + off, sizeof(why) - (size_t)off, " rank %d %llu ms", r,
                            (unsigned long long)((now - c->ranks[r].head->arrival_ns) / 1000000ull));
    /* A rank that posted it behind point-to-point operations still waiting is named with them. */
    for (int r = 0; r < c->nranks && off < (int)sizeof(why) - 80; r++)
        if (c->ranks[r].head && colld_p2p_holds(&c->ranks[r], c->ranks[r].head->d.seq)) {
            off += snprintf(why + off, sizeof(why) - (size_t)off, "; rank %d ", r);
            off += colld_p2p_describe_rank(why + off, sizeof(why) - (size_t)off, c, r);
        }
    colld_comm_break(d, c, COLLD_ERR_TIMEOUT, -1, why);
    return UINT64_MAX;
}
