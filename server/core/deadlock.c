/*
 * deadlock.c - cross-communicator deadlock detection (issue 18): ranks that call the collectives
 * of two communicators in different orders wait for each other forever. The daemon sees every
 * rank's position in every communicator on this host, so it can see the cycle long before the
 * communicators' timeouts.
 *
 * The wait-for graph has one node per session (a client process). A communicator whose next
 * collective some local ranks have posted (or, on the fast area, recorded as waited for) and others
 * have not gives an edge from each waiting rank's session to each missing rank's session: the
 * first cannot go on until the second posts. A cycle of such edges that stays exactly the same
 * (the same communicators at the same collectives) for --deadlock-ms is reported: a log line and a
 * "deadlock" event naming every rank, process, communicator and collective in it, and, with
 * --deadlock-fail, every communicator of the cycle fails with COLLD_ERR_DEADLOCK and that detail.
 *
 * The graph cannot tell a process blocked in one communicator from one whose other thread will
 * post to the second one later: a cycle that lasts --deadlock-ms because a thread computes that
 * long is a false alarm, which is why failing is a choice (report only by default) and why the
 * wait is long by default (docs/operations.md). Communicators spanning nodes take part with their
 * local ranks only. Collectives a backend holds after matching take part too (backend.h
 * `waiting`): a GPU collective whose ranks' streams have not all reached it gives an edge from
 * each rank whose stream waits in it to each rank whose stream has not got there, so streams that
 * run two communicators' collectives in crossed orders are a cycle as well. Sends and receives
 * (p2p.c) take part too: an operation that may run but whose peer has not met it gives an edge from
 * its rank's session to the peer's, and a rank whose collective waits behind its own sends and
 * receives has not arrived at that collective; so ranks whose sends, receives and collectives wait
 * for each other in a circle are reported too, within one communicator as well. A stream-ordered
 * send and receive that matched but wait for one rank's stream (backend.h `xfer_waits`) give an
 * edge from the rank whose stream got there to the other. Runs on the
 * engine thread, lock held, at most every CHECK_NS.
 */
#include "server/core/daemon.h"

#include "common/log.h"
#include "common/util.h"
#include "server/observability/events.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_NS 100000000ull /* look at most every 100 ms */
#define MAX_EDGES 65536       /* a graph larger than this is not looked at (logged once) */

/* One edge: `from` waits in c's collective #seq (as its rank `rank`) for `to` (its rank `missing`);
 * or, when `p2p` is a send or receive, in that operation (seq: its operation id). */
typedef struct {
    int from, to;
    const colld_dcomm_t *c;
    int rank, missing;
    uint64_t seq;
    const colld_op_t *p2p;
} wedge_t;

typedef struct {
    colld_session_t **nodes;
    int nnodes;
    wedge_t *edges;
    int nedges, cap_edges;
    int *first; /* [nnodes + 1]: edges of node i are edges[first[i] .. first[i + 1]) (sorted by from) */
} graph_t;

/* The session's node index (assigned on first sight; -1 before), -1 when out of room. */
static int node_of(graph_t *g, colld_session_t *s, int cap)
{
    if (s->dl_index >= 0)
        return s->dl_index;
    if (g->nnodes >= cap)
        return -1;
    g->nodes[g->nnodes] = s;
    s->dl_index = g->nnodes;
    return g->nnodes++;
}

/* Add one edge: rank r of c (its session) waits for rank m (its session). Returns 0, or -1 when
 * out of room. */
static int add_edge(graph_t *g, const colld_dcomm_t *c, int r, int m, uint64_t seq, const colld_op_t *p2p, int cap)
{
    if (g->nedges == g->cap_edges) {
        int cap_e = g->cap_edges ? 2 * g->cap_edges : 64;
        wedge_t *e = cap_e <= MAX_EDGES ? realloc(g->edges, (size_t)cap_e * sizeof(*e)) : NULL;
        if (!e)
            return -1;
        g->edges = e;
        g->cap_edges = cap_e;
    }
    int from = node_of(g, c->ranks[r].session, cap), to = node_of(g, c->ranks[m].session, cap);
    if (from < 0 || to < 0)
        return -1;
    g->edges[g->nedges++] =
        (wedge_t){ .from = from, .to = to, .c = c, .rank = r, .missing = m, .seq = seq, .p2p = p2p };
    return 0;
}

/* Add the edges of c's collective #seq: from the session of each local rank that got there
 * (arrived[r]) to the session of each local rank that has not and is still in c. */
static int add_waits(graph_t *g, const colld_dcomm_t *c, uint64_t seq, const bool *arrived, int cap)
{
    for (int m = 0; m < c->nranks; m++) {
        const colld_member_t *mm = &c->ranks[m];
        if (mm->remote || arrived[m] || mm->left || !mm->session)
            continue;
        for (int r = 0; r < c->nranks; r++) {
            const colld_member_t *w = &c->ranks[r];
            if (w->remote || !arrived[r] || !w->session || w->session == mm->session)
                continue;
            if (add_edge(g, c, r, m, seq, NULL, cap) < 0)
                return -1;
        }
    }
    return 0;
}

/* The edges of c's sends and receives that wait for their peer (colld_p2p_waits). */
typedef struct {
    graph_t *g;
    const colld_dcomm_t *c;
    int cap, rc;
} p2p_edges_t;

static void add_p2p_wait(void *arg, const colld_op_t *op)
{
    p2p_edges_t *x = arg;
    const colld_member_t *peer = &x->c->ranks[op->d.root];
    if (x->rc == 0 && !peer->remote && !peer->left && peer->session && peer->session != op->member->session)
        x->rc = add_edge(x->g, x->c, op->member->rank, op->d.root, op->id, op, x->cap);
}

/* Add c's edges for the collective its local ranks post: the ranks that posted it wait for those
 * that have not; and those of its sends and receives that wait for their peer, unmatched (p2p.c) or
 * held by a backend after matching (backend.h `xfer_waits`). */
static int add_comm(colld_daemon_t *d, graph_t *g, const colld_dcomm_t *c, int cap)
{
    bool *arrived = calloc((size_t)c->nranks, sizeof(*arrived));
    uint64_t seq = 0;
    if (!arrived)
        return -1;
    /* A rank whose collective waits behind its own sends and receives has not arrived at it. */
    for (int r = 0; r < c->nranks; r++)
        if (!c->ranks[r].remote && c->ranks[r].head && !colld_p2p_holds(&c->ranks[r], c->ranks[r].head->d.seq)) {
            if (!seq)
                seq = c->ranks[r].head->d.seq;
            arrived[r] = true;
        }
    int rc = seq ? add_waits(g, c, seq, arrived, cap) : 0;
    free(arrived);
    if (rc == 0 && c->p2p_queued) {
        p2p_edges_t x = { .g = g, .c = c, .cap = cap };
        colld_p2p_waits(c, add_p2p_wait, &x);
        for (int i = 0; i < d->nbackends; i++)
            if (d->backends[i].present && d->backends[i].ops->xfer_waits)
                d->backends[i].ops->xfer_waits(&d->backends[i], c, add_p2p_wait, &x);
        rc = x.rc;
    }
    return rc;
}

/* The backends' waiting collectives (backend.h `waiting`), into the graph or only counted. */
typedef struct {
    graph_t *g; /* NULL: count only */
    int cap, rc, count;
} held_t;

static void add_held(void *arg, const colld_coll_t *k, const bool *arrived)
{
    held_t *h = arg;
    const colld_dcomm_t *c = k->comm;
    if (c->state != COLLD_COMM_READY || !c->ranks)
        return;
    h->count++;
    if (h->g && h->rc == 0)
        h->rc = add_waits(h->g, c, colld_coll_lead(k)->d.seq, arrived, h->cap);
}

/* Walk every backend's waiting collectives with h (lock held). */
static void backends_waiting(colld_daemon_t *d, held_t *h)
{
    for (int i = 0; i < d->nbackends; i++) {
        colld_backend_t *b = &d->backends[i];
        if (b->present && b->ops->waiting)
            b->ops->waiting(b, add_held, h);
    }
}

static int by_from(const void *a, const void *b)
{
    const wedge_t *x = a, *y = b;
    return (x->from > y->from) - (x->from < y->from);
}

/* Depth-first search for a cycle from node u; on finding one, its edges in path[0..*plen). */
static bool dfs(const graph_t *g, int u, char *color, const wedge_t **path, int depth, int *plen)
{
    color[u] = 1;
    for (int e = g->first[u]; e < g->first[u + 1]; e++) {
        int v = g->edges[e].to;
        path[depth] = &g->edges[e];
        if (color[v] == 1) { /* back to the path: the cycle starts where v was entered */
            int start = 0;
            while (start < depth && path[start]->from != v)
                start++;
            memmove(path, path + start, (size_t)(depth - start + 1) * sizeof(*path));
            *plen = depth - start + 1;
            return true;
        }
        if (color[v] == 0 && dfs(g, v, color, path, depth + 1, plen))
            return true;
    }
    color[u] = 2;
    return false;
}

/* Whether c waits: some local rank posted its next collective and another has not, or a send or
 * receive waits (lock held). */
static bool comm_waits(const colld_dcomm_t *c)
{
    if (c->p2p_queued)
        return true;
    bool posted = false, missing = false;
    for (int r = 0; r < c->nranks && !(posted && missing); r++) {
        const colld_member_t *m = &c->ranks[r];
        if (m->remote)
            continue;
        posted |= m->head != NULL;
        missing |= !m->head && !m->left && m->session;
    }
    return posted && missing;
}

/* The report of a cycle. */
static void describe(char *buf, size_t len, const wedge_t *const *path, int n)
{
    bool one = true;
    for (int i = 1; i < n; i++)
        one &= path[i]->c == path[0]->c;
    int off = snprintf(buf, len, one ? "deadlock in one communicator:" : "deadlock across communicators:");
    for (int i = 0; i < n && off < (int)len - 1; i++) {
        const wedge_t *e = path[i];
        const colld_dcomm_t *c = e->c;
        char in[96];
        if (e->p2p)
            snprintf(in, sizeof(in), "to %s %s rank %d (operation #%llu)",
                     e->p2p->d.kind == COLLD_KIND_SEND ? "send" : "receive",
                     e->p2p->d.kind == COLLD_KIND_SEND ? "to" : "from", e->missing, (unsigned long long)e->seq);
        else
            snprintf(in, sizeof(in), "in collective #%llu", (unsigned long long)e->seq);
        off += snprintf(buf + off, len - (size_t)off,
                        "%s rank %d (pid %d) of communicator %llu%s%s%s waits %s for rank %d (pid %d)", i ? ";" : "",
                        e->rank, (int)c->ranks[e->rank].pid, (unsigned long long)c->id, c->name[0] ? " '" : "",
                        c->name, c->name[0] ? "'" : "", in, e->missing, (int)c->ranks[e->missing].pid);
    }
}

uint64_t colld_deadlock_check(colld_daemon_t *d, uint64_t now)
{
    if (d->cfg.deadlock_ms <= 0)
        return UINT64_MAX;
    if (now < d->dl_next_ns)
        return d->dl_sig ? d->dl_since_ns + (uint64_t)d->cfg.deadlock_ms * 1000000ull : d->dl_next_ns;
    d->dl_next_ns = now + CHECK_NS;
    /* A cycle needs two communicators that wait (or two collectives of backends), or sends and
     * receives (one communicator can hold a cycle of them). */
    int waiting = 0;
    for (const colld_dcomm_t *c = d->comms; c && waiting < 2; c = c->next)
        if (c->state == COLLD_COMM_READY && c->ranks && comm_waits(c))
            waiting += c->p2p_queued ? 2 : 1;
    held_t held = { 0 };
    if (waiting < 2) {
        backends_waiting(d, &held);
        waiting += held.count;
    }
    if (waiting < 2) {
        d->dl_sig = 0;
        d->dl_reported = false;
        return d->dl_next_ns;
    }
    int cap = (int)d->nsessions + 1;
    graph_t g = { .nodes = calloc((size_t)cap, sizeof(*g.nodes)) };
    char *color = calloc((size_t)cap, 1);
    const wedge_t **path = calloc((size_t)cap + 1, sizeof(*path));
    g.first = calloc((size_t)cap + 1, sizeof(*g.first));
    bool found = false;
    int plen = 0;
    if (!g.nodes || !color || !path || !g.first)
        goto out;
    for (colld_session_t *s = d->sessions; s; s = s->next)
        s->dl_index = -1;
    for (const colld_dcomm_t *c = d->comms; c; c = c->next)
        if (c->state == COLLD_COMM_READY && c->ranks && comm_waits(c) && add_comm(d, &g, c, cap) < 0) {
            LOG_INFO_RL(ENGINE, "deadlock check skipped: more than %d waits", MAX_EDGES);
            goto out;
        }
    held = (held_t){ .g = &g, .cap = cap };
    backends_waiting(d, &held);
    if (held.rc < 0) {
        LOG_INFO_RL(ENGINE, "deadlock check skipped: more than %d waits", MAX_EDGES);
        goto out;
    }
    if (g.nedges < 2)
        goto out;
    qsort(g.edges, (size_t)g.nedges, sizeof(*g.edges), by_from);
    for (int e = 0, i = 0; i <= g.nnodes; i++) {
        while (e < g.nedges && g.edges[e].from < i)
            e++;
        g.first[i] = e;
    }
    for (int u = 0; u < g.nnodes && !found; u++)
        if (color[u] == 0)
            found = dfs(&g, u, color, path, 0, &plen);
out:;
    uint64_t sig = 0;
    for (int i = 0; found && i < plen; i++) /* the same communicators at the same collectives */
        sig += (path[i]->c->id * 0x9e3779b97f4a7c15ull) ^ (path[i]->seq * 0xbf58476d1ce4e5b9ull);
    if (!found || sig != d->dl_sig) {
        d->dl_sig = found ? sig : 0;
        d->dl_since_ns = now;
        d->dl_reported = false;
    } else if (!d->dl_reported && now - d->dl_since_ns >= (uint64_t)d->cfg.deadlock_ms * 1000000ull) {
        char why[COLLD_DETAIL_LEN];
        describe(why, sizeof(why), path, plen);
        LOG_WARN(ENGINE, "%s (for %lld ms)", why, (long long)d->cfg.deadlock_ms);
        d->dl_reported = true;
        d->deadlocks++;
        for (int i = 0; i < plen; i++) {
            colld_dcomm_t *c = (colld_dcomm_t *)path[i]->c;
            colld_event(d, "deadlock", c, path[i]->rank, c->ranks[path[i]->rank].pid, 0, c->tenant, COLLD_ERR_DEADLOCK,
                        "%s", why);
        }
        if (d->cfg.deadlock_fail)
            for (int i = 0; i < plen; i++) {
                colld_dcomm_t *c = (colld_dcomm_t *)path[i]->c;
                if (c->state == COLLD_COMM_READY)
                    colld_comm_break(d, c, COLLD_ERR_DEADLOCK, -1, why);
            }
    }
    free(g.nodes);
    free(g.edges);
    free(g.first);
    free(color);
    free(path);
    return d->dl_sig && !d->dl_reported ? d->dl_since_ns + (uint64_t)d->cfg.deadlock_ms * 1000000ull : d->dl_next_ns;
}
