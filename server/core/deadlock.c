/*
 * deadlock.c - cross-communicator deadlock detection (issue 18): ranks that call the collectives
 * of two communicators in different orders wait for each other forever. The daemon sees every
 * rank's position in every communicator on this host, so it can see the cycle long before the
 * communicators' timeouts.
 *
 * The wait-for graph has one node per session (a client process). A communicator whose next
 * collective some local ranks have posted (or, on the fast area, recorded as waited for) and others
 * have not gives an edge from each waiting rank's session to each missing rank's session: the
 * first cannot go on until the second posts. A cycle of such edges each of which has stayed the
 * same (the same communicator, collective and ranks) for --deadlock-ms is reported: a log line and a
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
 * edge from the rank whose stream got there to the other.
 *
 * No tenant can blind the check for the others (issue 26 row 2). Each wait (an edge: a communicator,
 * its collective or operation, the rank that waits and the rank it waits for) is remembered from
 * one look to the next with the time it was first seen, and a cycle is reported once every wait in
 * it has lasted --deadlock-ms: each cycle is timed on its own, so a tenant whose cycles come and go
 * delays no one else's, and several cycles are reported in the same look. The waits of a reported
 * cycle are marked, and a cycle is reported only when one of its communicators has no marked wait:
 * one report per deadlock however many cycles its waits make (ranks that all send to each other
 * make many), and none again while it stays (report only) or until a communicator of it moves on.
 *
 * The work is bounded per tenant (the uid owning the communicator): at most COLLD_DEADLOCK_WAITS
 * pairs of ranks looked at per look (daemon->dl_budget in tests), a communicator's sends and
 * receives charged all their pairs before they are walked. A tenant over it has all its
 * communicators left out of that look and of the looks of the next OVER_HOLD_NS (a rate-limited
 * warning names its uid); every other tenant's are checked. Cycles do not cross tenants: a
 * communicator's members are sessions of its tenant's uid (comm.c), so every edge joins two
 * processes of one uid; the search runs over one graph all the same, charging each cycle to the
 * tenant of its closing edge, at most TENANT_LOOKS cycles looked at and TENANT_REPORTS reported per
 * tenant per look. Runs on the engine thread, lock held, at most every CHECK_NS.
 */
#include "server/core/daemon.h"

#include "common/log.h"
#include "common/util.h"
#include "server/observability/events.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_NS 100000000ull      /* look at most every 100 ms */
#define TENANT_LOOKS 64            /* cycles of one tenant looked at per check */
#define TENANT_REPORTS 8           /* cycles of one tenant reported per check; any more at the next */
#define OVER_HOLD_NS 1000000000ull /* a tenant over its bound is left out this long without a look */

/* ============================================================================================
 * The graph of one look
 * ========================================================================================== */

/* What names a wait from one look to the next: communicator `comm`'s collective #seq, or (`p2p`)
 * its send or receive whose operation id is seq; `rank` waits there for `missing`. */
typedef struct {
    uint64_t comm, seq;
    int rank, missing;
    bool p2p;
} wkey_t;

/* One edge: session `from` waits for session `to` (the wait `k`, in c; `p2p`: the send or receive).
 * `since`: when a look first saw this wait. */
typedef struct {
    int from, to;
    const colld_dcomm_t *c;
    const colld_op_t *p2p;
    wkey_t k;
    int tenant;   /* its communicator's tenant: index in graph_t.tally */
    unsigned ord; /* order added: the search follows it, so the same waits give the same cycle */
    unsigned at;  /* its place in the next look's memory (wait_mem_t, by key) ... */
    unsigned grp; /* ... and that of its communicator's first wait there */
    uint64_t since;
} wedge_t;

/* What one tenant's communicators cost this look, against its bounds. */
typedef struct {
    uid_t uid;
    bool used, over;
    bool held; /* over at an earlier look: left out without a look until held_until */
    uint64_t held_until;
    int waits, looks, reports;
} tally_t;

typedef struct {
    colld_session_t **nodes;
    int nnodes, cap_nodes;
    wedge_t *edges;
    int nedges, cap_edges;
    int *first;     /* [nnodes + 1]: edges of node i are edges[first[i] .. first[i + 1]) (sorted by from) */
    tally_t *tally; /* open addressing by uid, ntally slots (a power of two) */
    unsigned ntally;
    int cur;    /* the tally of the communicator being added, -1: none (left out) */
    int budget; /* waits per tenant */
} graph_t;

/* A wait as a look remembers it for the next one. */
typedef struct {
    wkey_t k;
    bool reported;
    uint64_t since;
} wait_mem_t;

/* A tenant over its bound, left out until a time. */
typedef struct {
    uid_t uid;
    uint64_t until_ns;
} over_mem_t;

/* What a look remembers for the next one (daemon->dl_memory): the waits it saw (by key), and the
 * tenants over their bound. */
struct colld_dl_memory {
    wait_mem_t *waits;
    size_t nwaits;
    over_mem_t *over;
    unsigned nover;
};

/* The tally of tenant uid (made on first sight), -1 when the table is full (cannot happen: every
 * tenant with waits has a session, and the table has room for twice the sessions). */
static int tally_of(graph_t *g, uid_t uid)
{
    unsigned mask = g->ntally - 1, i = ((unsigned)uid * 2654435761u) & mask;
    for (unsigned n = 0; n < g->ntally; n++, i = (i + 1) & mask) {
        if (!g->tally[i].used)
            g->tally[i] = (tally_t){ .uid = uid, .used = true };
        if (g->tally[i].uid == uid)
            return (int)i;
    }
    return -1;
}

/* Count n pairs of ranks looked at against the current tenant's bound: false once the tenant is
 * over it (its communicators are left out of this look). */
static bool charge(graph_t *g, uint64_t n)
{
    if (g->cur < 0)
        return false;
    tally_t *t = &g->tally[g->cur];
    if (t->over)
        return false;
    if (n > (uint64_t)(g->budget - t->waits)) {
        t->over = true;
        return false;
    }
    t->waits += (int)n;
    return true;
}

/* The session's node index (assigned on first sight; -1 before), -1 when out of room. */
static int node_of(graph_t *g, colld_session_t *s)
{
    if (s->dl_index >= 0)
        return s->dl_index;
    if (g->nnodes >= g->cap_nodes)
        return -1;
    g->nodes[g->nnodes] = s;
    s->dl_index = g->nnodes;
    return g->nnodes++;
}

/* Add one edge: rank r of c (its session) waits for rank m (its session). Returns 0, or -1 without
 * memory. */
static int add_edge(graph_t *g, const colld_dcomm_t *c, int r, int m, uint64_t seq, const colld_op_t *p2p)
{
    if (g->nedges == g->cap_edges) {
        if (g->cap_edges > INT_MAX / 4)
            return -1;
        int cap_e = g->cap_edges ? 2 * g->cap_edges : 64;
        wedge_t *e = realloc(g->edges, (size_t)cap_e * sizeof(*e));
        if (!e)
            return -1;
        g->edges = e;
        g->cap_edges = cap_e;
    }
    int from = node_of(g, c->ranks[r].session), to = node_of(g, c->ranks[m].session);
    if (from < 0 || to < 0)
        return -1;
    g->edges[g->nedges] = (wedge_t){ .from = from,
                                     .to = to,
                                     .c = c,
                                     .p2p = p2p,
                                     .k = { .comm = c->id, .seq = seq, .rank = r, .missing = m, .p2p = p2p != NULL },
                                     .tenant = g->cur,
                                     .ord = (unsigned)g->nedges };
    g->nedges++;
    return 0;
}

/* Add the edges of c's collective #seq: from the session of each local rank that got there
 * (arrived[r]) to the session of each local rank that has not and is still in c. Every pair looked
 * at counts against the tenant's bound. */
static int add_waits(graph_t *g, const colld_dcomm_t *c, uint64_t seq, const bool *arrived)
{
    int *got = malloc((size_t)c->nranks * sizeof(*got)), ngot = 0, rc = 0;
    if (!got)
        return -1;
    for (int r = 0; r < c->nranks; r++)
        if (!c->ranks[r].remote && arrived[r] && c->ranks[r].session)
            got[ngot++] = r;
    for (int m = 0; m < c->nranks && ngot && rc == 0; m++) {
        const colld_member_t *mm = &c->ranks[m];
        if (mm->remote || arrived[m] || mm->left || !mm->session)
            continue;
        for (int i = 0; i < ngot && rc == 0; i++) {
            if (!charge(g, 1)) {
                free(got);
                return 0; /* the tenant is over its bound: left out */
            }
            if (c->ranks[got[i]].session != mm->session)
                rc = add_edge(g, c, got[i], m, seq, NULL);
        }
    }
    free(got);
    return rc;
}

/* The edges of c's sends and receives that wait for their peer (colld_p2p_waits, charged before the
 * walk; a backend's held transfers, `each` charged as it comes). */
typedef struct {
    graph_t *g;
    const colld_dcomm_t *c;
    bool each;
    int rc;
} p2p_edges_t;

static void add_p2p_wait(void *arg, const colld_op_t *op)
{
    p2p_edges_t *x = arg;
    const colld_member_t *peer = &x->c->ranks[op->d.root];
    if (x->rc == 0 && !peer->remote && !peer->left && peer->session && peer->session != op->member->session &&
        (!x->each || charge(x->g, 1)))
        x->rc = add_edge(x->g, x->c, op->member->rank, op->d.root, op->id, op);
}

/* Add c's edges for the collective its local ranks post: the ranks that posted it wait for those
 * that have not; and those of its sends and receives that wait for their peer, unmatched (p2p.c) or
 * held by a backend after matching (backend.h `xfer_waits`). */
static int add_comm(colld_daemon_t *d, graph_t *g, const colld_dcomm_t *c)
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
    int rc = seq ? add_waits(g, c, seq, arrived) : 0;
    free(arrived);
    /* The walk of c's sends and receives looks at every pair that has some: all charged before it
     * starts, so a tenant with more pairs than its bound costs no walk. */
    if (rc == 0 && c->p2p_queued && charge(g, c->p2p_npairs)) {
        p2p_edges_t x = { .g = g, .c = c };
        colld_p2p_waits(c, add_p2p_wait, &x);
        x.each = true;
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
    int rc, count;
} held_t;

static void add_held(void *arg, const colld_coll_t *k, const bool *arrived)
{
    held_t *h = arg;
    const colld_dcomm_t *c = k->comm;
    if (c->state != COLLD_COMM_READY || !c->ranks)
        return;
    h->count++;
    if (h->g && h->rc == 0) {
        h->g->cur = tally_of(h->g, c->tenant);
        h->rc = add_waits(h->g, c, colld_coll_lead(k)->d.seq, arrived);
    }
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

/* ============================================================================================
 * Remembering waits from one look to the next
 * ========================================================================================== */

static int key_cmp(const wkey_t *a, const wkey_t *b)
{
    if (a->comm != b->comm)
        return a->comm < b->comm ? -1 : 1;
    if (a->p2p != b->p2p)
        return a->p2p ? 1 : -1;
    if (a->seq != b->seq)
        return a->seq < b->seq ? -1 : 1;
    if (a->rank != b->rank)
        return a->rank < b->rank ? -1 : 1;
    return (a->missing > b->missing) - (a->missing < b->missing);
}

static int by_key(const void *a, const void *b)
{
    const wedge_t *x = a, *y = b;
    int k = key_cmp(&x->k, &y->k);
    return k ? k : (x->ord > y->ord) - (x->ord < y->ord);
}

static int by_from(const void *a, const void *b)
{
    const wedge_t *x = a, *y = b;
    if (x->from != y->from)
        return (x->from > y->from) - (x->from < y->from);
    return (x->ord > y->ord) - (x->ord < y->ord);
}

/* Give each edge the time the daemon first saw its wait (now when it is new) and whether a
 * reported cycle holds it, from the last look's memory; then make the memory of this look (*out,
 * by key; each edge's `at` is its place there, `grp` that of its communicator's first wait) and
 * mark the communicators with a wait in a reported cycle (*marked, by grp). Returns 0, or -1
 * without memory. */
static int remember(const colld_dl_memory_t *last, graph_t *g, uint64_t now, wait_mem_t **out, bool **marked)
{
    *out = NULL;
    *marked = NULL;
    if (!g->nedges)
        return 0;
    wait_mem_t *w = malloc((size_t)g->nedges * sizeof(*w));
    bool *m = calloc((size_t)g->nedges, sizeof(*m));
    if (!w || !m) {
        free(w);
        free(m);
        return -1;
    }
    if (g->nedges > 1)
        qsort(g->edges, (size_t)g->nedges, sizeof(*g->edges), by_key);
    size_t j = 0, n = last ? last->nwaits : 0;
    for (int i = 0; i < g->nedges; i++) {
        wedge_t *e = &g->edges[i];
        int k = 1;
        while (j < n && (k = key_cmp(&e->k, &last->waits[j].k)) > 0)
            j++;
        bool reported = k == 0 && last->waits[j].reported;
        e->since = k == 0 ? last->waits[j].since : now;
        e->at = (unsigned)i;
        e->grp = i && g->edges[i - 1].c == e->c ? g->edges[i - 1].grp : (unsigned)i;
        m[e->grp] |= reported;
        w[i] = (wait_mem_t){ .k = e->k, .reported = reported, .since = e->since };
    }
    *out = w;
    *marked = m;
    return 0;
}

void colld_deadlock_free(colld_daemon_t *d)
{
    if (d->dl_memory) {
        free(d->dl_memory->waits);
        free(d->dl_memory->over);
        free(d->dl_memory);
        d->dl_memory = NULL;
    }
}

/* This look's memory for the next one: its waits (taken), and the tenants over their bound, those
 * found over now left out for OVER_HOLD_NS. Returns 0, or -1 without memory (nothing changed). */
static int keep(colld_daemon_t *d, const graph_t *g, wait_mem_t *waits, uint64_t now)
{
    colld_dl_memory_t *m = d->dl_memory ? d->dl_memory : calloc(1, sizeof(*m));
    unsigned nover = 0;
    for (unsigned i = 0; i < g->ntally; i++)
        nover += g->tally[i].over;
    over_mem_t *over = nover ? calloc(nover, sizeof(*over)) : NULL;
    if (!m || (nover && !over)) {
        if (m != d->dl_memory)
            free(m);
        free(over);
        return -1;
    }
    nover = 0;
    for (unsigned i = 0; i < g->ntally; i++)
        if (g->tally[i].over) {
            over[nover].uid = g->tally[i].uid;
            over[nover++].until_ns = g->tally[i].held ? g->tally[i].held_until : now + OVER_HOLD_NS;
        }
    free(m->waits);
    free(m->over);
    m->waits = waits;
    m->nwaits = (size_t)g->nedges;
    m->over = over;
    m->nover = nover;
    d->dl_memory = m;
    return 0;
}

/* ============================================================================================
 * Cycles
 * ========================================================================================== */

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
        bool send = e->p2p && e->p2p->d.kind == COLLD_KIND_SEND;
        if (e->p2p)
            colld_p2p_op_text(in, sizeof(in), send ? "to send" : "to receive", send, NULL, e->k.missing, e->k.seq);
        else
            snprintf(in, sizeof(in), "in collective #%llu", (unsigned long long)e->k.seq);
        off += snprintf(buf + off, len - (size_t)off,
                        "%s rank %d (pid %d) of communicator %llu%s%s%s waits %s for rank %d (pid %d)", i ? ";" : "",
                        e->k.rank, (int)c->ranks[e->k.rank].pid, (unsigned long long)c->id, c->name[0] ? " '" : "",
                        c->name, c->name[0] ? "'" : "", in, e->k.missing, (int)c->ranks[e->k.missing].pid);
    }
}

/* A cycle reported this look: its detail, and its edges (cycles[start .. start + n)) whose
 * communicators fail with --deadlock-fail once the search is over. */
typedef struct {
    char why[COLLD_DETAIL_LEN];
    int start, n;
} report_t;

typedef struct {
    colld_daemon_t *d;
    graph_t *g;
    wait_mem_t *mem; /* this look's memory: reported marks go there too */
    bool *marked;    /* by wedge_t.grp: the communicator has a wait in a reported cycle */
    uint64_t now, wait_ns;
    report_t *reports;
    int nreports, cap_reports;
    const wedge_t **cycles; /* the edges of the reported cycles */
    int ncycles, cap_cycles;
} search_t;

/* Whether the search looks at the cycle that edge e closes: each tenant's first TENANT_LOOKS
 * cycles of a look, while it has reported fewer than TENANT_REPORTS (the rest wait for the next
 * look). */
static bool looks(search_t *x, const wedge_t *e)
{
    tally_t *t = &x->g->tally[e->tenant];
    if (t->looks >= TENANT_LOOKS || t->reports >= TENANT_REPORTS)
        return false;
    t->looks++;
    return true;
}

/* A cycle the search found (its edges path[0 .. n), in order): reported unless each of its
 * communicators has a wait in a cycle reported already. Returns 0, or -1 without memory. */
static int found_cycle(search_t *x, const wedge_t **path, int n)
{
    tally_t *t = &x->g->tally[path[n - 1]->tenant];
    bool fresh = false;
    for (int i = 0; i < n && !fresh; i++)
        fresh = !x->marked[path[i]->grp];
    if (!fresh)
        return 0;
    if (x->nreports == x->cap_reports) {
        int cap = x->cap_reports ? 2 * x->cap_reports : 4;
        report_t *r = realloc(x->reports, (size_t)cap * sizeof(*r));
        if (!r)
            return -1;
        x->reports = r;
        x->cap_reports = cap;
    }
    if (x->ncycles + n > x->cap_cycles) {
        int cap = 2 * (x->ncycles + n);
        const wedge_t **c = realloc(x->cycles, (size_t)cap * sizeof(*c));
        if (!c)
            return -1;
        x->cycles = c;
        x->cap_cycles = cap;
    }
    t->reports++;
    report_t *r = &x->reports[x->nreports++];
    r->start = x->ncycles;
    r->n = n;
    memcpy(x->cycles + x->ncycles, path, (size_t)n * sizeof(*path));
    x->ncycles += n;
    describe(r->why, sizeof(r->why), path, n);
    LOG_WARN(ENGINE, "%s (for %lld ms)", r->why, (long long)x->d->cfg.deadlock_ms);
    x->d->deadlocks++;
    for (int i = 0; i < n; i++) {
        const wedge_t *e = path[i];
        colld_dcomm_t *c = (colld_dcomm_t *)e->c;
        x->mem[e->at].reported = true;
        x->marked[e->grp] = true;
        colld_event(x->d, "deadlock", c, e->k.rank, c->ranks[e->k.rank].pid, 0, c->tenant, COLLD_ERR_DEADLOCK, "%s",
                    r->why);
    }
    return 0;
}

/* Depth-first search of the waits that have lasted --deadlock-ms (not a recursion: a graph has as
 * many nodes as sessions): every edge back to a node on the path closes a cycle (every cycle holds
 * at least one such edge, so every set of processes that wait for each other in a circle gives at
 * least one cycle). Returns 0, or -1 without memory. */
static int search(search_t *x)
{
    const graph_t *g = x->g;
    int nn = g->nnodes, rc = -1;
    char *color = calloc((size_t)nn, 1); /* 0: not seen, 1: on the path, 2: done */
    int *at = calloc((size_t)nn, sizeof(*at)), *pos = calloc((size_t)nn, sizeof(*pos));
    int *stack = calloc((size_t)nn, sizeof(*stack));
    const wedge_t **path = calloc((size_t)nn + 1, sizeof(*path)), **cyc = calloc((size_t)nn + 1, sizeof(*cyc));
    if (!color || !at || !pos || !stack || !path || !cyc)
        goto out;
    rc = 0;
    for (int root = 0; root < nn && rc == 0; root++) {
        if (color[root])
            continue;
        int depth = 0;
        stack[0] = root;
        color[root] = 1;
        at[root] = 0;
        pos[root] = g->first[root];
        while (depth >= 0 && rc == 0) {
            int u = stack[depth];
            if (pos[u] == g->first[u + 1]) {
                color[u] = 2;
                depth--;
                continue;
            }
            const wedge_t *e = &g->edges[pos[u]++];
            if (x->now - e->since < x->wait_ns)
                continue; /* this wait is younger than --deadlock-ms */
            int v = e->to;
            if (color[v] == 0) {
                path[depth] = e;
                stack[++depth] = v;
                color[v] = 1;
                at[v] = depth;
                pos[v] = g->first[v];
            } else if (color[v] == 1 && looks(x, e)) { /* back to the path: the cycle starts where v was entered */
                int n = depth - at[v];
                memcpy(cyc, path + at[v], (size_t)n * sizeof(*cyc));
                cyc[n] = e;
                rc = found_cycle(x, cyc, n + 1);
            }
        }
    }
out:
    free(color);
    free(at);
    free(pos);
    free(stack);
    free(path);
    free(cyc);
    return rc;
}

/* ============================================================================================
 * The check
 * ========================================================================================== */

/* Say which tenants' communicators this look left out (over their bound): the first 8 uids and how
 * many more, at most one line every 5 s. */
static void warn_left_out(const graph_t *g)
{
    char who[128] = "";
    int off = 0, n = 0;
    for (unsigned i = 0; i < g->ntally; i++)
        if (g->tally[i].used && g->tally[i].over && n++ < 8)
            off += snprintf(who + off, sizeof(who) - (size_t)off, "%s%u", n > 1 ? ", " : "", (unsigned)g->tally[i].uid);
    if (n > 8)
        snprintf(who + off, sizeof(who) - (size_t)off, " and %d more", n - 8);
    if (n)
        LOG_WARN_RL(ENGINE,
                    "deadlock check: the communicators of uid %s left out (more than %d waits at once); every "
                    "other tenant's are checked",
                    who, g->budget);
}

uint64_t colld_deadlock_check(colld_daemon_t *d, uint64_t now)
{
    if (d->cfg.deadlock_ms <= 0)
        return UINT64_MAX;
    if (now < d->dl_next_ns)
        return d->dl_next_ns;
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
        colld_deadlock_free(d); /* nothing waits: nothing to remember */
        return d->dl_next_ns;
    }
    const colld_dl_memory_t *last = d->dl_memory;
    unsigned ntally = 16;
    while (ntally < 2 * (d->nsessions + 1 + (last ? last->nover : 0)))
        ntally *= 2;
    graph_t g = { .cap_nodes = (int)d->nsessions + 1,
                  .ntally = ntally,
                  .budget = d->dl_budget > 0 ? d->dl_budget : COLLD_DEADLOCK_WAITS };
    g.nodes = calloc((size_t)g.cap_nodes, sizeof(*g.nodes));
    g.first = calloc((size_t)g.cap_nodes + 1, sizeof(*g.first));
    g.tally = calloc(ntally, sizeof(*g.tally));
    search_t x = { .d = d, .g = &g, .now = now, .wait_ns = (uint64_t)d->cfg.deadlock_ms * 1000000ull };
    bool ok = false;
    if (!g.nodes || !g.first || !g.tally)
        goto out;
    for (colld_session_t *s = d->sessions; s; s = s->next)
        s->dl_index = -1;
    /* The tenants found over their bound less than OVER_HOLD_NS ago are left out without a look. */
    for (unsigned i = 0; last && i < last->nover; i++) {
        int t = last->over[i].until_ns > now ? tally_of(&g, last->over[i].uid) : -1;
        if (t >= 0) {
            g.tally[t].over = g.tally[t].held = true;
            g.tally[t].held_until = last->over[i].until_ns;
        }
    }
    /* Every other communicator's waits, each counted against its tenant's bound. */
    for (const colld_dcomm_t *c = d->comms; c; c = c->next) {
        if (c->state != COLLD_COMM_READY || !c->ranks || !comm_waits(c))
            continue;
        g.cur = tally_of(&g, c->tenant);
        if (g.cur >= 0 && !g.tally[g.cur].over && add_comm(d, &g, c) < 0)
            goto out;
    }
    held = (held_t){ .g = &g };
    backends_waiting(d, &held);
    if (held.rc < 0)
        goto out;
    /* A tenant over its bound is left out whole (the edges it had before it went over too). */
    int kept = 0;
    for (int i = 0; i < g.nedges; i++)
        if (!g.tally[g.edges[i].tenant].over)
            g.edges[kept++] = g.edges[i];
    g.nedges = kept;
    warn_left_out(&g);
    if (remember(last, &g, now, &x.mem, &x.marked) < 0)
        goto out;
    if (g.nedges > 1)
        qsort(g.edges, (size_t)g.nedges, sizeof(*g.edges), by_from);
    for (int e = 0, i = 0; i <= g.nnodes; i++) {
        while (e < g.nedges && g.edges[e].from < i)
            e++;
        g.first[i] = e;
    }
    ok = g.nedges < 2 || search(&x) == 0;
    /* The memory of this look replaces the last one's, reported marks included. */
    if (keep(d, &g, x.mem, now) == 0)
        x.mem = NULL;
    else
        ok = false;
    /* With --deadlock-fail, every communicator of each reported cycle fails with its detail (after
     * the search: a break completes the operations the edges point to). */
    for (int i = 0; i < x.nreports && d->cfg.deadlock_fail; i++)
        for (int j = 0; j < x.reports[i].n; j++) {
            colld_dcomm_t *c = (colld_dcomm_t *)x.cycles[x.reports[i].start + j]->c;
            if (c->state == COLLD_COMM_READY)
                colld_comm_break(d, c, COLLD_ERR_DEADLOCK, -1, x.reports[i].why);
        }
out:
    if (!ok)
        LOG_WARN_RL(ENGINE, "deadlock check skipped this time: no memory");
    free(x.mem);
    free(x.marked);
    free(x.reports);
    free(x.cycles);
    free(g.nodes);
    free(g.edges);
    free(g.first);
    free(g.tally);
    return d->dl_next_ns;
}
