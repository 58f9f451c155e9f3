/*
 * cluster.c - multi-node communicators: the peer transport, forming a communicator across
 * daemons, and turning a fault on one node into an error on every node.
 *
 * Forming. A unique id made by a daemon started with --listen carries that daemon's address (the
 * root). A rank joins through its own daemon, which creates its local communicator (state
 * joining) and sends Join to the root. The root collects the joins of every rank (xjoin_t); when
 * it has them all it orders the member daemons by their lowest rank (the ring order), picks the
 * communicator's cluster-wide id (xid), the all-reduce algorithm and the chunk size, and sends
 * Formed to every member daemon, which then answers its ranks' CommInit calls. The root itself
 * needs no rank of the communicator.
 *
 * Faults. A fault a daemon detects on its own ranks (time-out, a dead process, mismatch, abort,
 * a rank leaving) is sent as Fail to the other member daemons, which break their side of the
 * communicator with the same status and detail; the first fault wins everywhere. A lost peer
 * daemon (connection closed, heartbeats missing, an operator's disconnect) breaks every
 * communicator spanning it with COLLD_ERR_NODE_LOST naming the node.
 *
 * Who may say what (every peer message is checked against its authenticated sender, the peer's
 * listen address that its handshake proved; "self" for this daemon's own messages):
 *   - Join: only for the sender's own node (node_addr = the sender), with a valid node name.
 *   - Formed: only from the communicator's root, the daemon whose address the tenant's unique id
 *     carries, and only for a communicator this daemon's ranks joined.
 *   - Fail: by xid only from a member node of that communicator; by unique id only from a node
 *     that joined it (at the root) or from its root (at a member).
 *   - Ready and DATA: only from member nodes (xcoll.c checks the DATA's node, phase and step).
 * A refused message is counted (bad_msgs) and logged at most once per 10 s.
 *
 * Early messages. The root's Formed and the members' messages travel on different links, so a
 * member that formed first can send its Ready for collective #1, or a Fail, before this daemon has
 * the Formed that gives the xid meaning. Such messages are kept (cl->early, bounded per sender and
 * in all, the oldest replaced) and applied once the Formed arrives, checked then like any other
 * (the sender must be a member node); one that never finds its Formed is simply replaced.
 *
 * Who is dialed. This daemon opens connections only to (a) the root named in a unique id its own
 * tenant's rank joined with, when that root is one the operator lets it dial (--peers, allow.c)
 * or a daemon that proved the cluster secret to it (cl->known); any other root is refused at
 * CommInit with PERMISSION_DENIED before anything is dialed, so a hand-made id cannot turn the
 * daemon into a tenant's port scanner, and (b) the member nodes listed in a Formed that came from
 * that root for a communicator its ranks joined (the root vouches for them: each one authenticated
 * to it with that address and joined from it); a member's Fail goes to the same nodes. A root
 * that cannot be reached or does not authenticate is reported to the tenant in one text whatever
 * the reason (refused, silent, not colld): why is in the log, for operators. The root
 * never dials an address it learned from a Join: its Formed and Fail go to the joined nodes only
 * over the links they opened (nodial), so no peer can make a daemon connect anywhere or create
 * peer records for addresses of its choosing. Addresses are checked (colld_net_check_addr) and
 * strings from peers are validated or sanitized (printable, valid UTF-8, bounded) at entry.
 *
 * Everything here that touches the transport runs on its network thread; the daemon's other
 * threads hand work over through the inbox (cluster.h).
 */
#include "server/net/cluster.h"

#include "colld_net.pb-c.h"
#include "transport/tcp/tcp_internal.h" /* colld__tcp_net_detached */
#include "common/log.h"
#include "common/util.h"
#include "server/core/tenant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A communicator the root daemon is forming. */
struct xjoin {
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    uid_t tenant;
    int nranks, joined;
    int *rank_node;                     /* [nranks], -1 until joined */
    int nnodes;
    char (*name)[COLLD_NET_NAME_LEN];   /* [nranks] at most */
    char (*addr)[COLLD_NET_ADDR_LEN];
    uint64_t deadline_ns;
    struct xjoin *next;
};

/* ============================================================================================
 * The daemon's cluster and a communicator's multi-node state
 * ========================================================================================== */

/* Stamp an issued unique id with this daemon's address when it listens (a multi-node id). */
static void net_stamp_uid(const colld_backend_t *b, uint8_t *uid)
{
    const colld_cluster_t *cl = b->state;
    if (!cl)
        return;
    memcpy(uid + COLLD_WIRE_UID_RANDOM_BYTES, COLLD_WIRE_UID_NET_MAGIC, 4);
    colld_strlcpy((char *)uid + COLLD_WIRE_UID_ADDR_OFFSET, cl->self_addr,
                  COLLD_WIRE_UNIQUE_ID_BYTES - COLLD_WIRE_UID_ADDR_OFFSET);
}

/* ============================================================================================
 * Messages to other daemons (queued on the network thread's inbox, cluster_base.c)
 * ========================================================================================== */

/* Encode and queue a message to the daemon at addr (lock held); with nodial, it goes only over a
 * link that exists ("Who is dialed"). */
static void post_msg_how(colld_daemon_t *d, const char *addr, const Colld__Net__V1__Msg *m, bool nodial)
{
    size_t len = colld__net__v1__msg__get_packed_size(m);
    cjob_t *j = calloc(1, sizeof(*j));
    uint8_t *b = malloc(len ? len : 1);
    if (!j || !b) {
        free(j);
        free(b);
        LOG_ERROR(NET, "out of memory: a message to %s is dropped", addr);
        return;
    }
    colld__net__v1__msg__pack(m, b);
    colld_strlcpy(j->addr, addr, sizeof(j->addr));
    j->nodial = nodial;
    j->buf = b;
    j->len = len;
    colld_cluster_inbox_push(d, j);
}

/* To a daemon this one may dial: a root, or a member node vouched for by one. */
static void post_msg(colld_daemon_t *d, const char *addr, const Colld__Net__V1__Msg *m)
{
    post_msg_how(d, addr, m, false);
}

/* To a node known from a Join: over the link it opened, never a new one. */
static void post_msg_nodial(colld_daemon_t *d, const char *addr, const Colld__Net__V1__Msg *m)
{
    post_msg_how(d, addr, m, true);
}

/* The authenticated address of a message's sender: the peer's, or this daemon's for its own. */
static const char *sender_addr(const colld_daemon_t *d, colld_net_peer_t *p)
{
    return p ? colld_net_peer_addr(p) : colld_cluster_of(d)->self_addr;
}

/* Hand a matched collective of a multi-node communicator to the network thread (lock held). */
static void net_submit(colld_backend_t *b, colld_coll_t *k)
{
    colld_daemon_t *d = b->d;
    cjob_t *j = calloc(1, sizeof(*j));
    if (!j) {
        colld_comm_break(d, k->comm, COLLD_ERR_NO_MEMORY, -1, "daemon out of memory");
        k->status = COLLD_ERR_NO_MEMORY;
        colld_engine_finish(d, k);
        return;
    }
    j->coll = k;
    colld_cluster_inbox_push(d, j);
}

/* ============================================================================================
 * Communicator state
 * ========================================================================================== */

/* Remember a daemon that proved the cluster secret (lock held): a tenant may name it as a root. */
static void remember_known(colld_cluster_t *cl, const char *addr)
{
    unsigned n = COLLD_MIN(cl->nknown, COLLD_CLUSTER_KNOWN_MAX);
    for (unsigned i = 0; i < n; i++)
        if (strcmp(cl->known[i], addr) == 0)
            return;
    colld_strlcpy(cl->known[cl->nknown++ % COLLD_CLUSTER_KNOWN_MAX], addr, COLLD_NET_ADDR_LEN);
}

/* Whether this daemon may dial the root daemon at addr for a tenant ("Who is dialed"; lock held):
 * itself, a peer of --peers, or a daemon that proved the cluster secret to it. */
static bool may_dial(const colld_cluster_t *cl, const char *addr)
{
    if (strcmp(addr, cl->self_addr) == 0 || colld_peer_allow_match(cl->allow, addr))
        return true;
    unsigned n = COLLD_MIN(cl->nknown, COLLD_CLUSTER_KNOWN_MAX);
    for (unsigned i = 0; i < n; i++)
        if (strcmp(cl->known[i], addr) == 0)
            return true;
    return false;
}

/* The first local join of a multi-node communicator: attach its multi-node state. Returns 0, or
 * -1 with err (lock held). */
static int net_comm_form(colld_backend_t *b, colld_dcomm_t *c, colld_err_t *err)
{
    char root[COLLD_NET_ADDR_LEN], shown[COLLD_NET_ADDR_LEN], bad[COLLD_DETAIL_LEN / 2];
    if (!colld_uid_root_addr(c->unique_id, root, sizeof(root)))
        root[0] = '\0';
    colld_str_sanitize(shown, sizeof(shown), root, SIZE_MAX); /* the id is the tenant's bytes */
    if (colld_net_check_addr(root, bad, sizeof(bad)) < 0) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      "the unique id names a root daemon at '%s', which is not an address to dial (%s); pass the id "
                      "colld_get_unique_id made unchanged",
                      shown, bad);
        return -1;
    }
    if (!b->state) {
        colld_err_set(err, COLLD_ERR_NOT_SUPPORTED,
                      "the unique id was made by the daemon at %s for a multi-node communicator; start this daemon "
                      "with --listen and --cluster-secret-file to join it",
                      root);
        return -1;
    }
    if (!may_dial(b->state, root)) {
        colld_err_set(err, COLLD_ERR_PERMISSION_DENIED,
                      "the unique id names a root daemon at %s, which this daemon may not connect to: it connects "
                      "only to the peers of its --peers option and to daemons that proved the cluster secret to it; "
                      "pass the id colld_get_unique_id made on a daemon of this cluster unchanged, or ask the "
                      "operator to add that daemon to --peers",
                      root);
        return -1;
    }
    colld_xcomm_t *x = calloc(1, sizeof(*x));
    if (!x) {
        colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
        return -1;
    }
    memcpy(x->uid, c->unique_id, sizeof(x->uid));
    colld_strlcpy(x->root_addr, root, sizeof(x->root_addr));
    c->bslot[b->slot] = x;
    return 0;
}

/* Free a communicator's multi-node state (lock held, no collective in flight); its collective
 * buffer goes back to the tenant's charge (xcoll_start). */
static void xcomm_free(colld_daemon_t *d, colld_dcomm_t *c, colld_xcomm_t *x)
{
    colld_tenant_uncharge_mem(d, c->tenant, x->scratch_size);
    free(x->node_name);
    free(x->node_addr);
    free(x->rank_node);
    free(x->node_nranks);
    free(x->peers);
    free(x->ready);
    free(x->verified);
    free(x->scratch);
    free(x);
}

/* The node name of a rank's daemon for display (see net.h). */
const char *colld_cluster_rank_node(const colld_dcomm_t *c, int rank)
{
    const colld_xcomm_t *x = colld_xcomm(c);
    if (!x || !x->formed || rank < 0 || rank >= c->nranks || !c->ranks[rank].remote)
        return "";
    return x->node_name[x->rank_node[rank]];
}

/* A local rank joined a multi-node communicator: tell the root daemon (lock held). */
static void net_rank_joined(colld_backend_t *b, colld_dcomm_t *c, colld_member_t *m)
{
    colld_daemon_t *d = b->d;
    colld_cluster_t *cl = b->state;
    Colld__Net__V1__Join j = COLLD__NET__V1__JOIN__INIT;
    j.unique_id.data = c->unique_id;
    j.unique_id.len = sizeof(c->unique_id);
    j.tenant = c->tenant;
    j.nranks = c->nranks;
    j.rank = m->rank;
    j.pid = m->pid;
    j.name = c->name;
    j.node_name = cl->node_name;
    j.node_addr = cl->self_addr;
    j.timeout_ms = c->timeout_ms;
    Colld__Net__V1__Msg msg = COLLD__NET__V1__MSG__INIT;
    msg.m_case = COLLD__NET__V1__MSG__M_JOIN;
    msg.join = &j;
    post_msg(d, colld_xcomm(c)->root_addr, &msg);
}

/* Send Fail for a communicator (by xid when formed, else by unique id) to `addr` (nodial: over an
 * existing link only). */
static void post_fail(colld_daemon_t *d, const char *addr, const uint8_t *uid, uid_t tenant, uint64_t xid,
                      colld_status_t st, int rank, const char *detail, bool nodial)
{
    Colld__Net__V1__Fail f = COLLD__NET__V1__FAIL__INIT;
    f.unique_id.data = (uint8_t *)uid;
    f.unique_id.len = COLLD_WIRE_UNIQUE_ID_BYTES;
    f.tenant = tenant;
    f.xid = xid;
    f.status = st;
    f.rank = rank;
    f.detail = (char *)detail;
    f.node_name = colld_cluster_of(d)->node_name;
    Colld__Net__V1__Msg msg = COLLD__NET__V1__MSG__INIT;
    msg.m_case = COLLD__NET__V1__MSG__M_FAIL;
    msg.fail = &f;
    post_msg_how(d, addr, &msg, nodial);
}

/* A multi-node communicator failed here (lock held): tell the other daemons, unless the fault
 * came from one of them. */
static void cluster_comm_failed(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st, int rank, const char *detail)
{
    colld_xcomm_t *x = colld_xcomm(c);
    if (!colld_cluster_of(d))
        return;
    if (!x->formed) { /* its Formed may still come: its nodes must hear of it then (handle_formed) */
        cleft_t *l = &colld_cluster_of(d)->left[colld_cluster_of(d)->nleft++ % COLLD_CLUSTER_LEFT_MAX];
        memcpy(l->uid, c->unique_id, sizeof(l->uid));
        l->tenant = c->tenant;
        l->used = true;
    }
    if (x->fault_from_peer)
        return;
    if (!x->formed) {
        post_fail(d, x->root_addr, c->unique_id, c->tenant, 0, st, rank, detail, false);
        return;
    }
    const char *lost = colld_cluster_of(d)->lost_addr; /* under daemon->lock, like this call */
    for (int i = 0; i < x->nnodes; i++)
        if (i != x->self && !(lost && strcmp(lost, x->node_addr[i]) == 0))
            post_fail(d, x->node_addr[i], c->unique_id, c->tenant, x->xid, st, rank, detail, false);
}

/* The collective a multi-node communicator runs among the nodes (see net.h). */
bool colld_cluster_trace_pending(const colld_dcomm_t *c, colld_trace_rec_t *t, uint64_t *arrivals)
{
    const colld_xcomm_t *x = colld_xcomm(c);
    const colld_coll_t *k = x ? x->net_coll : NULL;
    if (!k)
        return false;
    const colld_op_t *lead = colld_coll_lead(k);
    memset(t, 0, sizeof(*t));
    t->seq = lead->d.seq;
    t->count = lead->d.count;
    t->kind = (uint8_t)lead->d.kind;
    t->dtype = (uint8_t)lead->d.dtype;
    t->redop = (uint8_t)lead->d.redop;
    t->root = lead->d.root;
    t->status = COLLD_INPROGRESS;
    t->first_ns = UINT64_MAX;
    t->start_ns = k->start_ns;
    for (int r = 0; r < c->nranks; r++) {
        arrivals[r] = k->ops[r] ? k->ops[r]->arrival_ns : 0; /* remote ranks: not known here */
        if (k->ops[r])
            t->first_ns = COLLD_MIN(t->first_ns, k->ops[r]->arrival_ns);
    }
    return true;
}

colld_dcomm_t *colld_cluster_pin(colld_daemon_t *d, uint64_t xid)
{
    colld_dcomm_t *found = NULL;
    pthread_mutex_lock(&d->lock);
    for (colld_dcomm_t *c = d->comms; c; c = c->next) {
        const colld_xcomm_t *x = colld_xcomm(c);
        if (x && x->formed && x->xid == xid && c->joined > 0) {
            c->refs++;
            found = c;
            break;
        }
    }
    pthread_mutex_unlock(&d->lock);
    return found;
}

void colld_cluster_unpin(colld_daemon_t *d, colld_dcomm_t *c)
{
    pthread_mutex_lock(&d->lock);
    colld_comm_unref(d, c);
    pthread_mutex_unlock(&d->lock);
}

/* The joining communicator of this tenant and unique id on this daemon (lock held). */
static colld_dcomm_t *joining_comm(colld_daemon_t *d, const uint8_t *uid, uid_t tenant)
{
    for (colld_dcomm_t *c = d->comms; c; c = c->next)
        if (colld_xcomm(c) && c->state == COLLD_COMM_JOINING && c->tenant == tenant && c->joined > 0 &&
            memcmp(c->unique_id, uid, sizeof(c->unique_id)) == 0)
            return c;
    return NULL;
}

/* Break (or dissolve) a communicator with a fault another daemon reported (lock held). */
static void break_from_peer(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st, int rank, const char *detail)
{
    colld_xcomm_t *x = colld_xcomm(c);
    c->refs++; /* a communicator that had not formed is freed by the break */
    x->fault_from_peer = true;
    colld_comm_break(d, c, st, rank, detail);
    x->fault_from_peer = false;
    colld_comm_unref(d, c);
}

/* ============================================================================================
 * The root: forming a communicator
 * ========================================================================================== */

static void xjoin_free(xjoin_t *j)
{
    free(j->rank_node);
    free(j->name);
    free(j->addr);
    free(j);
}

static void xjoin_unlink(colld_cluster_t *cl, xjoin_t *j)
{
    for (xjoin_t **pp = &cl->xjoins; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            return;
        }
}

/* Give up forming: every daemon with a joined rank is told (this one through its inbox). */
static void xjoin_dissolve(colld_daemon_t *d, xjoin_t *j, colld_status_t st, int rank, const char *detail)
{
    LOG_WARN(NET, "multi-node communicator not formed: %s: %s", colld_status_name(st), detail);
    for (int n = 0; n < j->nnodes; n++)
        post_fail(d, j->addr[n], j->uid, j->tenant, 0, st, rank, detail, true);
    xjoin_unlink(colld_cluster_of(d), j);
    xjoin_free(j);
}

/* A Join that cannot be accepted: the sending daemon's communicator fails (told over its own
 * link), and so does the rest. */
static void join_refuse(colld_daemon_t *d, const char *sender, xjoin_t *j, const Colld__Net__V1__Join *m,
                        colld_status_t st, const char *detail)
{
    post_fail(d, sender, m->unique_id.data, m->tenant, 0, st, m->rank, detail, true);
    if (j)
        xjoin_dissolve(d, j, st, m->rank, detail);
}

static void node_order_formed(colld_daemon_t *d, xjoin_t *j);

/* A rank joined on the sending node (lock held). The Join must be for the sender's own node and
 * name, those its handshake proved ("Who may say what"). */
static void handle_join(colld_daemon_t *d, colld_net_peer_t *p, const Colld__Net__V1__Join *m)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    const char *sender = sender_addr(d, p);
    char why[COLLD_DETAIL_LEN];
    if (m->unique_id.len != COLLD_WIRE_UNIQUE_ID_BYTES) {
        colld_cluster_log_bad(cl, "Join from %s with a unique id of %zu bytes", sender, m->unique_id.len);
        return;
    }
    if (!m->node_addr || strcmp(m->node_addr, sender) != 0) {
        char shown[COLLD_NET_ADDR_LEN];
        colld_str_sanitize(shown, sizeof(shown), m->node_addr, SIZE_MAX);
        colld_cluster_log_bad(cl, "Join from %s names node address '%s': a daemon joins only for itself", sender,
                              shown);
        snprintf(why, sizeof(why), "the root daemon refused a Join from %s naming another node's address", sender);
        join_refuse(d, sender, NULL, m, COLLD_ERR_INVALID_ARGUMENT, why);
        return;
    }
    if (!m->node_name || !m->node_name[0] || !colld_str_valid(m->node_name, COLLD_NET_NAME_LEN - 1) ||
        strcmp(m->node_name, p ? colld_net_peer_name(p) : cl->node_name) != 0) {
        colld_cluster_log_bad(cl, "Join from %s with a node name that is not its own", sender);
        snprintf(why, sizeof(why), "node %s: the Join's node name is not the one it authenticated with", sender);
        join_refuse(d, sender, NULL, m, COLLD_ERR_INVALID_ARGUMENT, why);
        return;
    }
    if (d->draining) { /* as its own ranks' CommInit: a daemon that drains forms nothing new */
        snprintf(why, sizeof(why),
                 "the root daemon %s (%s) is draining before it stops (a restart or an upgrade): it forms no new "
                 "communicators; create the communicator once it is back, or with a unique id of another daemon",
                 cl->node_name, cl->self_addr);
        join_refuse(d, sender, NULL, m, COLLD_ERR_DAEMON_UNAVAILABLE, why);
        return;
    }
    xjoin_t *j = NULL;
    for (xjoin_t *x = cl->xjoins; x; x = x->next)
        if (x->tenant == m->tenant && memcmp(x->uid, m->unique_id.data, sizeof(x->uid)) == 0)
            j = x;
    if (!j) {
        if (m->nranks < 1 || m->nranks > COLLD_MAX_RANKS) {
            snprintf(why, sizeof(why), "nranks %d is out of range (1..%d)", m->nranks, COLLD_MAX_RANKS);
            join_refuse(d, sender, NULL, m, COLLD_ERR_INVALID_ARGUMENT, why);
            return;
        }
        if (!colld_comm_take_uid(d, m->unique_id.data, (uid_t)m->tenant)) {
            join_refuse(d, sender, NULL, m, COLLD_ERR_INVALID_ARGUMENT,
                        "unknown unique id: not issued by its root daemon to this user, or already used");
            return;
        }
        j = calloc(1, sizeof(*j));
        if (j) {
            j->rank_node = malloc((size_t)m->nranks * sizeof(int));
            j->name = calloc((size_t)m->nranks, sizeof(*j->name));
            j->addr = calloc((size_t)m->nranks, sizeof(*j->addr));
        }
        if (!j || !j->rank_node || !j->name || !j->addr) {
            if (j)
                xjoin_free(j);
            join_refuse(d, sender, NULL, m, COLLD_ERR_NO_MEMORY, "root daemon out of memory");
            return;
        }
        memcpy(j->uid, m->unique_id.data, sizeof(j->uid));
        j->tenant = m->tenant;
        j->nranks = m->nranks;
        for (int r = 0; r < j->nranks; r++)
            j->rank_node[r] = -1;
        int timeout = m->timeout_ms > 0 ? (int)COLLD_MIN(m->timeout_ms, d->cfg.max_timeout_ms) : (int)d->cfg.timeout_ms;
        j->deadline_ns = colld_now_ns() + (uint64_t)timeout * 1000000ull;
        j->next = cl->xjoins;
        cl->xjoins = j;
    }
    if (m->nranks != j->nranks) {
        snprintf(why, sizeof(why), "rank %d on node %s gave nranks %d where the others gave %d", m->rank,
                 m->node_name, m->nranks, j->nranks);
        join_refuse(d, sender, j, m, COLLD_ERR_INVALID_ARGUMENT, why);
        return;
    }
    if (m->rank < 0 || m->rank >= j->nranks) {
        snprintf(why, sizeof(why), "rank %d on node %s is out of range for nranks %d", m->rank, m->node_name,
                 j->nranks);
        join_refuse(d, sender, j, m, COLLD_ERR_INVALID_ARGUMENT, why);
        return;
    }
    int node = -1;
    for (int n = 0; n < j->nnodes; n++)
        if (strcmp(j->addr[n], m->node_addr) == 0)
            node = n;
    if (j->rank_node[m->rank] >= 0) {
        snprintf(why, sizeof(why), "rank %d joined twice: on node %s and on node %s", m->rank,
                 j->name[j->rank_node[m->rank]], m->node_name);
        join_refuse(d, sender, j, m, COLLD_ERR_INVALID_USAGE, why);
        return;
    }
    if (node < 0) {
        node = j->nnodes++;
        colld_strlcpy(j->name[node], m->node_name, sizeof(j->name[node]));
        colld_strlcpy(j->addr[node], m->node_addr, sizeof(j->addr[node]));
    }
    j->rank_node[m->rank] = node;
    j->joined++;
    LOG_INFO(NET, "multi-node communicator: rank %d of %d joined on node %s (%d joined)", m->rank, j->nranks,
             j->name[node], j->joined);
    if (j->joined == j->nranks)
        node_order_formed(d, j);
}

/* Every rank joined: order the nodes by their lowest rank and send Formed to each (lock held). */
static void node_order_formed(colld_daemon_t *d, xjoin_t *j)
{
    int order[COLLD_MAX_RANKS], seen = 0, remap[COLLD_MAX_RANKS];
    for (int n = 0; n < j->nnodes; n++)
        remap[n] = -1;
    for (int r = 0; r < j->nranks; r++) {
        int n = j->rank_node[r];
        if (remap[n] < 0) {
            remap[n] = seen;
            order[seen++] = n;
        }
    }
    int32_t *rank_node = malloc((size_t)j->nranks * sizeof(int32_t));
    Colld__Net__V1__Node *nodes = calloc((size_t)j->nnodes, sizeof(*nodes));
    Colld__Net__V1__Node **nodep = calloc((size_t)j->nnodes, sizeof(*nodep));
    uint64_t xid = 0;
    if (!rank_node || !nodes || !nodep || colld_random_bytes(&xid, sizeof(xid)) < 0) {
        free(rank_node);
        free(nodes);
        free(nodep);
        xjoin_dissolve(d, j, COLLD_ERR_NO_MEMORY, -1, "root daemon out of memory");
        return;
    }
    xid |= 1; /* never 0 */
    for (int r = 0; r < j->nranks; r++)
        rank_node[r] = remap[j->rank_node[r]];
    for (int i = 0; i < j->nnodes; i++) {
        colld__net__v1__node__init(&nodes[i]);
        nodes[i].name = j->name[order[i]];
        nodes[i].addr = j->addr[order[i]];
        nodep[i] = &nodes[i];
    }
    int algo = colld_policy_net_algo(d, j->tenant);
    Colld__Net__V1__Formed f = COLLD__NET__V1__FORMED__INIT;
    f.unique_id.data = j->uid;
    f.unique_id.len = sizeof(j->uid);
    f.tenant = j->tenant;
    f.xid = xid;
    f.nranks = j->nranks;
    f.n_nodes = (size_t)j->nnodes;
    f.nodes = nodep;
    f.n_rank_node = (size_t)j->nranks;
    f.rank_node = rank_node;
    f.algo = (uint32_t)algo;
    f.small_bytes = d->cfg.net_small_bytes;
    f.chunk_bytes = d->cfg.net_chunk;
    Colld__Net__V1__Msg msg = COLLD__NET__V1__MSG__INIT;
    msg.m_case = COLLD__NET__V1__MSG__M_FORMED;
    msg.formed = &f;
    LOG_INFO(NET, "multi-node communicator formed: %d ranks on %d nodes, xid %016llx", j->nranks, j->nnodes,
             (unsigned long long)xid);
    for (int i = 0; i < j->nnodes; i++)
        post_msg_nodial(d, j->addr[i], &msg);
    free(rank_node);
    free(nodes);
    free(nodep);
    xjoin_unlink(colld_cluster_of(d), j);
    xjoin_free(j);
}

/* ============================================================================================
 * A member daemon: formed, failed
 * ========================================================================================== */

/* Fill x from a Formed message; returns 0 or -1 with a detail (lock held). */
static int apply_formed(colld_daemon_t *d, colld_dcomm_t *c, const Colld__Net__V1__Formed *f, char *why,
                        size_t len)
{
    colld_xcomm_t *x = colld_xcomm(c);
    int k = (int)f->n_nodes;
    if (f->nranks != c->nranks || f->n_rank_node != (size_t)c->nranks || k < 1 || k > c->nranks ||
        f->chunk_bytes < 4096 || f->chunk_bytes > COLLD_NET_MAX_CHUNK || f->chunk_bytes % 64) {
        snprintf(why, len, "malformed Formed message from the root daemon");
        return -1;
    }
    x->self = -1;
    for (int i = 0; i < k; i++) {
        const char *a = f->nodes[i]->addr, *nm = f->nodes[i]->name;
        char bad[COLLD_NET_ADDR_LEN + 64];
        if (colld_net_check_addr(a, bad, sizeof(bad)) < 0 || !nm || !nm[0] ||
            !colld_str_valid(nm, COLLD_NET_NAME_LEN - 1)) {
            snprintf(why, len, "malformed Formed message from the root daemon: node %d has %s", i,
                     nm && nm[0] && colld_str_valid(nm, COLLD_NET_NAME_LEN - 1)
                         ? "an address this daemon cannot dial"
                         : "a node name that is not 1 to 63 bytes of printable UTF-8");
            return -1;
        }
        for (int o = 0; o < i; o++)
            if (strcmp(f->nodes[o]->addr, a) == 0) {
                snprintf(why, len, "malformed Formed message from the root daemon: node address %s twice", a);
                return -1;
            }
        if (strcmp(a, colld_cluster_of(d)->self_addr) == 0)
            x->self = i;
    }
    x->node_name = calloc((size_t)k, sizeof(*x->node_name));
    x->node_addr = calloc((size_t)k, sizeof(*x->node_addr));
    x->rank_node = calloc((size_t)c->nranks, sizeof(int));
    x->node_nranks = calloc((size_t)k, sizeof(int));
    x->peers = calloc((size_t)k, sizeof(*x->peers));
    x->ready = calloc((size_t)k, sizeof(*x->ready));
    x->verified = calloc((size_t)k, sizeof(*x->verified));
    if (!x->node_name || !x->node_addr || !x->rank_node || !x->node_nranks || !x->peers || !x->ready || !x->verified) {
        snprintf(why, len, "daemon out of memory");
        return -1;
    }
    if (x->self < 0) {
        snprintf(why, len, "the root daemon did not list this node (%s) among the members", colld_cluster_of(d)->self_addr);
        return -1;
    }
    for (int i = 0; i < k; i++) {
        colld_strlcpy(x->node_name[i], f->nodes[i]->name, sizeof(x->node_name[i]));
        colld_strlcpy(x->node_addr[i], f->nodes[i]->addr, sizeof(x->node_addr[i]));
    }
    for (int r = 0; r < c->nranks; r++) {
        int n = f->rank_node[r];
        if (n < 0 || n >= k) {
            snprintf(why, len, "malformed Formed message from the root daemon");
            return -1;
        }
        bool local = c->ranks[r].session != NULL;
        if (local != (n == x->self)) {
            snprintf(why, len, "rank %d: the root daemon places it on node %s, but it %s here", r, x->node_name[n],
                     local ? "joined" : "did not join");
            return -1;
        }
        x->rank_node[r] = n;
        x->node_nranks[n]++;
        c->ranks[r].remote = !local;
    }
    for (colld_dcomm_t *o = d->comms; o; o = o->next) {
        const colld_xcomm_t *ox = colld_xcomm(o);
        if (o != c && ox && ox->formed && ox->xid == f->xid) { /* its DATA and Ready would mix */
            snprintf(why, len, "the root daemon gave this communicator an id another one here has");
            return -1;
        }
    }
    if (f->xid == 0) {
        snprintf(why, len, "malformed Formed message from the root daemon: id 0");
        return -1;
    }
    x->nnodes = k;
    x->xid = f->xid;
    x->algo = f->algo <= COLLD_NET_ALGO_RD ? (int)f->algo : COLLD_NET_ALGO_AUTO;
    x->small_bytes = f->small_bytes;
    x->chunk_bytes = f->chunk_bytes;
    x->formed = true;
    return 0;
}

/* A communicator of this tenant and unique id that this daemon's ranks left while it formed
 * (lock held); forgotten once found. */
static bool left_while_forming(colld_cluster_t *cl, const uint8_t *uid, uid_t tenant)
{
    for (unsigned i = 0; i < COLLD_CLUSTER_LEFT_MAX; i++) {
        cleft_t *l = &cl->left[i];
        if (l->used && l->tenant == tenant && memcmp(l->uid, uid, sizeof(l->uid)) == 0) {
            l->used = false;
            return true;
        }
    }
    return false;
}

/* ============================================================================================
 * Early messages (see the top of this file)
 * ========================================================================================== */

/* The slot for a message by xid from `from` that came before its Formed: a free one, unless that
 * sender already holds COLLD_CLUSTER_EARLY_PER_PEER (then its oldest), else the oldest of all. */
static cearly_t *early_slot(colld_cluster_t *cl, const char *from)
{
    cearly_t *free_slot = NULL, *oldest = NULL, *oldest_mine = NULL;
    int mine = 0;
    for (int i = 0; i < COLLD_CLUSTER_EARLY_MAX; i++) {
        cearly_t *e = &cl->early[i];
        if (!e->used) {
            free_slot = free_slot ? free_slot : e;
            continue;
        }
        if (!oldest || e->stamp < oldest->stamp)
            oldest = e;
        if (strcmp(e->from, from) == 0) {
            mine++;
            if (!oldest_mine || e->stamp < oldest_mine->stamp)
                oldest_mine = e;
        }
    }
    cearly_t *e = mine >= COLLD_CLUSTER_EARLY_PER_PEER ? oldest_mine : free_slot ? free_slot : oldest;
    memset(e, 0, sizeof(*e));
    e->used = true;
    e->stamp = ++cl->early_stamp;
    colld_strlcpy(e->from, from, sizeof(e->from));
    return e;
}

/* Keep a Ready for collective #1 of a communicator not formed here yet (net). Later collectives
 * cannot come early: a node starts #2 only after every node's Ready for #1. */
static void early_keep_ready(colld_cluster_t *cl, const char *from, uint64_t xid, const xsig_t *sig)
{
    if (sig->seq != 1)
        return;
    cearly_t *e = early_slot(cl, from);
    e->xid = xid;
    e->sig = *sig;
}

/* Keep a Fail by xid for a communicator not formed here yet (net). */
static void early_keep_fail(colld_cluster_t *cl, const char *from, uint64_t xid, colld_status_t st, int rank,
                            const char *why)
{
    cearly_t *e = early_slot(cl, from);
    e->fail = true;
    e->xid = xid;
    e->status = st;
    e->rank = rank;
    colld_strlcpy(e->why, why, sizeof(e->why));
}

/* c just formed here: apply what its member nodes sent before (net, lock held). The Ready
 * messages go first: a Fail breaks the communicator. */
static void early_apply(colld_daemon_t *d, colld_dcomm_t *c)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    colld_xcomm_t *x = colld_xcomm(c);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < COLLD_CLUSTER_EARLY_MAX; i++) {
            cearly_t *e = &cl->early[i];
            if (!e->used || e->xid != x->xid || e->fail != (pass == 1))
                continue;
            e->used = false;
            int node = -1;
            for (int n = 0; n < x->nnodes; n++)
                if (n != x->self && strcmp(x->node_addr[n], e->from) == 0)
                    node = n;
            if (node < 0) {
                colld_cluster_log_bad(cl, "%s from %s for a communicator it is not a member of",
                                      e->fail ? "Fail" : "Ready", e->from);
            } else if (!e->fail) {
                x->ready[node][1] = e->sig;
            } else if (c->state == COLLD_COMM_READY) {
                break_from_peer(d, c, e->status, e->rank >= 0 && e->rank < c->nranks ? e->rank : -1, e->why);
            }
        }
}

/* Formed arrived (network thread): only the root named in the unique id may send it. */
static void handle_formed(colld_daemon_t *d, colld_net_peer_t *p, const Colld__Net__V1__Formed *f)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    colld_xcomm_t *x = NULL;
    char why[COLLD_DETAIL_LEN], root[COLLD_NET_ADDR_LEN];
    const char *sender = sender_addr(d, p);
    if (f->unique_id.len != COLLD_WIRE_UNIQUE_ID_BYTES) {
        colld_cluster_log_bad(cl, "Formed from %s with a unique id of %zu bytes", sender, f->unique_id.len);
        return;
    }
    if (!colld_uid_root_addr(f->unique_id.data, root, sizeof(root)) || strcmp(root, sender) != 0) {
        colld_cluster_log_bad(cl, "Formed from %s, which is not the communicator's root daemon", sender);
        return;
    }
    pthread_mutex_lock(&d->lock);
    colld_dcomm_t *c = joining_comm(d, f->unique_id.data, (uid_t)f->tenant);
    if (!c && left_while_forming(cl, f->unique_id.data, (uid_t)f->tenant)) {
        /* Its ranks here are gone already: the other nodes must not wait for them. */
        snprintf(why, sizeof(why), "node %s no longer has ranks of this communicator (they left while it formed)",
                 cl->node_name);
        for (size_t i = 0; i < f->n_nodes && i < COLLD_MAX_RANKS; i++)
            if (colld_net_check_addr(f->nodes[i]->addr, NULL, 0) == 0 &&
                strcmp(f->nodes[i]->addr, cl->self_addr) != 0)
                post_fail(d, f->nodes[i]->addr, f->unique_id.data, f->tenant, f->xid, COLLD_ERR_PEER_LOST, -1, why,
                          false);
    } else if (!c) {
        colld_cluster_log_bad(cl, "Formed from %s for a communicator no rank here joined", sender);
    } else if (apply_formed(d, c, f, why, sizeof(why)) < 0) {
        LOG_WARN(NET, "communicator %llu: %s", (unsigned long long)c->id, why);
        colld_comm_break(d, c, COLLD_ERR_INTERNAL, -1, why);
    } else {
        colld_comm_formed(d, c);
        early_apply(d, c);
        x = colld_xcomm(c);
        c->refs++; /* pinned while the peers are looked up below */
    }
    colld_daemon_unlock(d);
    if (x) {
        /* Connect to every member daemon now (a full mesh: each sees every other's loss). A peer
         * that cannot have a record (table full) stays NULL: sending to it fails the collective. */
        for (int i = 0; i < x->nnodes; i++)
            if (i != x->self)
                x->peers[i] = colld_net_peer_get(cl->net, x->node_addr[i]);
        colld_cluster_unpin(d, c);
    }
}

/* Whether a formed communicator has a member node at addr other than this one. */
static bool is_member_node(const colld_xcomm_t *x, const char *addr)
{
    for (int i = 0; i < x->nnodes; i++)
        if (i != x->self && strcmp(x->node_addr[i], addr) == 0)
            return true;
    return false;
}

/* Fail arrived (network thread, lock held): only from a node entitled to fail the communicator
 * ("Who may say what"). The node named is the sender as it authenticated (the message's own
 * node_name is not trusted); the detail is sanitized before it reaches any log, error detail or
 * other node. */
static void handle_fail(colld_daemon_t *d, colld_net_peer_t *p, const Colld__Net__V1__Fail *f)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    const char *sender = sender_addr(d, p);
    colld_status_t st = f->status < 0 && f->status >= COLLD_ERR_LAST ? (colld_status_t)f->status : COLLD_ERR_INTERNAL;
    char why[COLLD_DETAIL_LEN], detail[COLLD_DETAIL_LEN - COLLD_NET_NAME_LEN - 16];
    const char *node = p ? colld_net_peer_name(p) : cl->node_name;
    colld_str_sanitize(detail, sizeof(detail), f->detail ? f->detail : "", SIZE_MAX);
    /* say which node saw it: with a cut link, each end reports the other one lost */
    snprintf(why, sizeof(why), "on node %s: %s", node, detail);
    if (f->xid) {
        for (colld_dcomm_t *c = d->comms; c; c = c->next) {
            const colld_xcomm_t *x = colld_xcomm(c);
            if (x && x->formed && x->xid == f->xid) {
                if (p && !is_member_node(x, sender)) {
                    colld_cluster_log_bad(cl, "Fail from %s for a communicator it is not a member of", sender);
                    return;
                }
                break_from_peer(d, c, st, f->rank >= 0 && f->rank < c->nranks ? f->rank : -1, why);
                return;
            }
        }
        if (p)
            early_keep_fail(cl, sender, f->xid, st, f->rank, why); /* before its Formed */
        return;
    }
    if (f->unique_id.len != COLLD_WIRE_UNIQUE_ID_BYTES) {
        colld_cluster_log_bad(cl, "Fail from %s with a unique id of %zu bytes", sender, f->unique_id.len);
        return;
    }
    for (xjoin_t *j = cl->xjoins; j; j = j->next)
        if (j->tenant == f->tenant && memcmp(j->uid, f->unique_id.data, sizeof(j->uid)) == 0) {
            bool joined = !p;
            for (int n = 0; n < j->nnodes && !joined; n++)
                joined = strcmp(j->addr[n], sender) == 0;
            if (!joined) {
                colld_cluster_log_bad(cl, "Fail from %s for a forming communicator it did not join", sender);
                return;
            }
            xjoin_dissolve(d, j, st, f->rank, why); /* tells every node, this one included */
            return;
        }
    colld_dcomm_t *c = joining_comm(d, f->unique_id.data, (uid_t)f->tenant);
    colld_xcomm_t *x = c ? colld_xcomm(c) : NULL;
    if (!x)
        return;
    if (strcmp(x->root_addr, sender) != 0) {
        colld_cluster_log_bad(cl, "Fail from %s for a forming communicator whose root is %s", sender, x->root_addr);
        return;
    }
    break_from_peer(d, c, st, f->rank >= 0 && f->rank < c->nranks ? f->rank : -1, why);
}

/* Ready arrived (network thread). */
static void handle_ready(colld_daemon_t *d, colld_net_peer_t *p, const Colld__Net__V1__Ready *m)
{
    xsig_t sig = { .seq = m->seq,
                   .kind = m->kind,
                   .dtype = m->dtype,
                   .redop = m->redop,
                   .root = m->root,
                   .count = m->count,
                   .verify = m->verify };
    colld_dcomm_t *c = colld_cluster_pin(d, m->xid);
    if (!c) {
        early_keep_ready(colld_cluster_of(d), colld_net_peer_addr(p), m->xid, &sig); /* before its Formed */
        return;
    }
    colld_xcomm_t *x = colld_xcomm(c);
    int node = -1;
    for (int i = 0; i < x->nnodes; i++)
        if (i != x->self && strcmp(x->node_addr[i], colld_net_peer_addr(p)) == 0)
            node = i;
    if (node >= 0 && m->seq > 0)
        colld_xcoll_ready(d, c, node, &sig);
    colld_cluster_unpin(d, c);
}

/* Verify arrived (network thread): only from a member node of a communicator formed here (a
 * Verify comes after every node's Ready, so never before the communicator formed). */
static void handle_verify(colld_daemon_t *d, colld_net_peer_t *p, const Colld__Net__V1__Verify *m)
{
    colld_dcomm_t *c = colld_cluster_pin(d, m->xid);
    if (!c) {
        colld_cluster_log_bad(colld_cluster_of(d), "Verify from %s for no communicator formed here",
                              colld_net_peer_addr(p));
        return;
    }
    colld_xcomm_t *x = colld_xcomm(c);
    int node = -1;
    for (int i = 0; i < x->nnodes; i++)
        if (i != x->self && strcmp(x->node_addr[i], colld_net_peer_addr(p)) == 0)
            node = i;
    if (node < 0)
        colld_cluster_log_bad(colld_cluster_of(d), "Verify from %s for a communicator it is not a member of",
                              colld_net_peer_addr(p));
    else if (m->seq > 0)
        colld_xcoll_verified(d, c, node, m->seq, m->sum);
    colld_cluster_unpin(d, c);
}

/* One CTRL message, from a peer or (p NULL) from this daemon itself (network thread). */
static void handle_ctrl(colld_daemon_t *d, colld_net_peer_t *p, const void *buf, size_t len)
{
    Colld__Net__V1__Msg *m = colld__net__v1__msg__unpack(NULL, len, buf);
    if (!m) {
        colld_cluster_log_bad(colld_cluster_of(d), "undecodable message from %s", sender_addr(d, p));
        return;
    }
    switch (m->m_case) {
    case COLLD__NET__V1__MSG__M_JOIN:
        pthread_mutex_lock(&d->lock);
        handle_join(d, p, m->join);
        pthread_mutex_unlock(&d->lock);
        break;
    case COLLD__NET__V1__MSG__M_FORMED:
        handle_formed(d, p, m->formed);
        break;
    case COLLD__NET__V1__MSG__M_FAIL:
        pthread_mutex_lock(&d->lock);
        handle_fail(d, p, m->fail);
        colld_daemon_unlock(d);
        break;
    case COLLD__NET__V1__MSG__M_READY:
        if (p)
            handle_ready(d, p, m->ready);
        break;
    case COLLD__NET__V1__MSG__M_VERIFY:
        if (p)
            handle_verify(d, p, m->verify);
        break;
    case COLLD__NET__V1__MSG__M_PROBE_REQ:
    case COLLD__NET__V1__MSG__M_PROBE_ACK:
    case COLLD__NET__V1__MSG__M_PROBE_RESULT:
        colld_probe_ctrl(d, p, m);
        break;
    case COLLD__NET__V1__MSG__M_DOCTOR_REQ:
    case COLLD__NET__V1__MSG__M_DOCTOR_REPORT:
        if (p)
            colld_gather_ctrl(d, p, m);
        break;
    case COLLD__NET__V1__MSG__M_IB_HELLO:
    case COLLD__NET__V1__MSG__M_IB_READY:
        colld_iblink_ctrl(colld_cluster_of(d), p, m);
        break;
    default:
        break;
    }
    colld__net__v1__msg__free_unpacked(m, NULL);
}

/* ============================================================================================
 * Transport callbacks (network thread)
 * ========================================================================================== */

static void on_peer_up(void *arg, colld_net_peer_t *p)
{
    colld_daemon_t *d = arg;
    LOG_INFO_RL(NET, "peer %s (%s) up", colld_net_peer_name(p), colld_net_peer_addr(p));
    pthread_mutex_lock(&d->lock);
    remember_known(colld_cluster_of(d), colld_net_peer_addr(p));
    pthread_mutex_unlock(&d->lock);
    colld_iblink_peer_up(colld_cluster_of(d), p);
}

static void on_peer_lost(void *arg, colld_net_peer_t *p, const char *why)
{
    colld_daemon_t *d = arg;
    colld_cluster_t *cl = colld_cluster_of(d);
    const char *addr = colld_net_peer_addr(p);
    char detail[COLLD_DETAIL_LEN];
    LOG_WARN_RL(NET, "peer %s (%s) lost: %s", colld_net_peer_name(p), addr, why); /* as the transport's line */
    colld_iblink_peer_lost(cl, p);
    pthread_mutex_lock(&d->lock);
    cl->lost_addr = addr; /* the other nodes hear of it; the lost one is not called back */
    colld_dcomm_t *c = d->comms;
    while (c) {
        colld_dcomm_t *following = c->next; /* a dissolved communicator may be freed */
        colld_xcomm_t *x = colld_xcomm(c);
        if (x && x->formed && (c->state == COLLD_COMM_READY || c->state == COLLD_COMM_CLOSING)) {
            for (int i = 0; i < x->nnodes; i++)
                if (i != x->self && strcmp(x->node_addr[i], addr) == 0) {
                    snprintf(detail, sizeof(detail), "node %s (%s) lost: %s", x->node_name[i], addr, why);
                    colld_comm_break(d, c, COLLD_ERR_NODE_LOST, -1, detail);
                    break;
                }
        } else if (x && !x->formed && c->state == COLLD_COMM_JOINING && strcmp(x->root_addr, addr) == 0) {
            /* One text whatever the cause (refused, silent, not colld, a broken link): a tenant
             * learns nothing about a port from it ("Who is dialed"); the log above says why. */
            snprintf(detail, sizeof(detail),
                     "no authenticated link to the root daemon of this communicator (%s): it could not be reached or "
                     "did not prove the cluster secret (the reason is in colld's log)",
                     addr);
            break_from_peer(d, c, COLLD_ERR_NODE_LOST, -1, detail);
        }
        c = following;
    }
    xjoin_t *j = cl->xjoins;
    while (j) {
        xjoin_t *following = j->next;
        for (int n = 0; n < j->nnodes; n++)
            if (strcmp(j->addr[n], addr) == 0) {
                snprintf(detail, sizeof(detail), "node %s (%s) lost while the communicator formed: %s", j->name[n],
                         addr, why);
                xjoin_dissolve(d, j, COLLD_ERR_NODE_LOST, -1, detail);
                break;
            }
        j = following;
    }
    cl->lost_addr = NULL;
    colld_daemon_unlock(d);
    colld_xcoll_tick(d);
}

static void *on_data_dest(void *arg, colld_net_peer_t *p, const colld_net_hdr_t *h)
{
    (void)arg;
    (void)p;
    (void)h;
    return NULL; /* into the connection's buffer: a failed collective's memory is never written */
}

/* May the transport free lost peer p? Only when no communicator keeps a pointer to it (its
 * x->peers are set and read on this thread, so none can appear after the answer). */
static bool on_peer_unused(void *arg, colld_net_peer_t *p)
{
    colld_daemon_t *d = arg;
    bool used = false;
    pthread_mutex_lock(&d->lock);
    for (colld_dcomm_t *c = d->comms; c && !used; c = c->next) {
        const colld_xcomm_t *x = colld_xcomm(c);
        if (x && x->formed && x->peers)
            for (int i = 0; i < x->nnodes && !used; i++)
                used = x->peers[i] == p;
    }
    pthread_mutex_unlock(&d->lock);
    return !used;
}

static void on_data(void *arg, colld_net_peer_t *p, const colld_net_hdr_t *h, void *payload)
{
    if (h->phase == XPHASE_PROBE && h->xid == 0) {
        colld_probe_data(arg, p, h);
        return;
    }
    colld_xcoll_data(arg, p, h, payload);
}

static void on_ctrl(void *arg, colld_net_peer_t *p, const void *payload, size_t len)
{
    handle_ctrl(arg, p, payload, len);
}

/* Join time-outs of the communicators this daemon forms (lock held). */
static void check_xjoins(colld_daemon_t *d)
{
    uint64_t now = colld_now_ns();
    xjoin_t *j = colld_cluster_of(d)->xjoins;
    while (j) {
        xjoin_t *following = j->next;
        if (now >= j->deadline_ns) {
            char why[COLLD_DETAIL_LEN];
            int off = snprintf(why, sizeof(why), "only %d of %d ranks joined in time; missing ranks:", j->joined,
                               j->nranks);
            for (int r = 0; r < j->nranks && off < (int)sizeof(why) - 8; r++)
                if (j->rank_node[r] < 0)
                    off += snprintf(why + off, sizeof(why) - (size_t)off, " %d", r);
            xjoin_dissolve(d, j, COLLD_ERR_TIMEOUT, -1, why);
        }
        j = following;
    }
}

static void on_tick(void *arg)
{
    colld_daemon_t *d = arg;
    colld_cluster_t *cl = colld_cluster_of(d);
    pthread_mutex_lock(&d->lock);
    cjob_t *jobs = cl->inbox;
    cl->inbox = cl->inbox_tail = NULL;
    check_xjoins(d);
    pthread_mutex_unlock(&d->lock);
    while (jobs) {
        cjob_t *j = jobs;
        jobs = j->next;
        if (j->coll) {
            colld_xcoll_add(d, j->coll);
        } else if (j->probe_bytes) {
            colld_probe_begin(d, j->probe_bytes);
        } else if (j->gather > 0) {
            colld_gather_begin(d, j->gather - 1);
        } else if (strcmp(j->addr, cl->self_addr) == 0) {
            handle_ctrl(d, NULL, j->buf, j->len);
        } else if (j->nodial) { /* a node known from its Join: over the link it opened, if still there */
            colld_net_peer_t *p = colld_net_peer_find(cl->net, j->addr);
            if (!p || colld_net_peer_is_lost(p) || colld_net_send_ctrl(p, j->buf, j->len) < 0)
                LOG_INFO(NET, "a message to %s is dropped: no link to it (this daemon does not dial nodes it "
                              "knows only from their Join)",
                         j->addr);
        } else if (colld_net_check_addr(j->addr, NULL, 0) < 0) {
            LOG_WARN(NET, "a message is dropped: its address is not one this daemon can dial");
        } else {
            colld_net_peer_t *p = colld_net_peer_get(cl->net, j->addr);
            if (!p || colld_net_send_ctrl(p, j->buf, j->len) < 0)
                LOG_WARN(NET, "a message to %s could not be queued", j->addr);
        }
        free(j->buf);
        free(j);
    }
    colld_iblink_tick(cl);
    colld_xcoll_tick(d);
    colld_probe_tick(d);
    colld_gather_tick(d);
    colld_links_tick(d);
}

/* ============================================================================================
 * Start and stop
 * ========================================================================================== */

/* Read the cluster secret (trailing whitespace dropped). Returns its length or -1. */
static ssize_t read_secret(const char *path, uint8_t *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        LOG_ERROR(NET, "cannot open the cluster secret %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_mode & 0077))
        LOG_WARN(NET, "the cluster secret %s is readable by other users (mode %03o): chmod 600 it", path,
                 (unsigned)(st.st_mode & 0777));
    ssize_t n = read(fd, buf, cap);
    close(fd);
    if (n < 0) {
        LOG_ERROR(NET, "cannot read the cluster secret %s: %s", path, strerror(errno));
        return -1;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    return n;
}

/* The transport's configuration for this daemon (secret and names filled by the caller). */
static colld_net_config_t net_config(colld_daemon_t *d, colld_cluster_t *cl)
{
    return (colld_net_config_t){
        .node_name = cl->node_name,
        .listen_addr = d->cfg.listen,
        .conns_per_peer = (int)d->cfg.net_conns,
        .heartbeat_ms = (int)d->cfg.heartbeat_ms,
        .heartbeat_misses = (int)d->cfg.heartbeat_misses,
        .chunk_bytes = COLLD_NET_MAX_CHUNK,
        .stranger_ms = (int)d->cfg.peer_handshake_ms,
        .cb = { .peer_up = on_peer_up,
                .peer_lost = on_peer_lost,
                .data_dest = on_data_dest,
                .data = on_data,
                .ctrl = on_ctrl,
                .tick = on_tick,
                .peer_unused = on_peer_unused,
                .arg = d },
    };
}

/* A new cluster state taking `allow` (NULL: an empty list); NULL when out of memory (allow freed). */
static colld_cluster_t *cluster_new(colld_daemon_t *d, colld_peer_allow_t *allow)
{
    colld_cluster_t *cl = calloc(1, sizeof(*cl));
    if (cl)
        cl->known = calloc(COLLD_CLUSTER_KNOWN_MAX, sizeof(*cl->known));
    if (!cl || !cl->known) {
        LOG_ERROR(NET, "out of memory starting the peer transport");
        colld_peer_allow_free(allow);
        free(cl);
        return NULL;
    }
    cl->d = d;
    cl->allow = allow;
    pthread_mutex_init(&cl->probe_lock, NULL);
    return cl;
}

static void cluster_free(colld_cluster_t *cl)
{
    pthread_mutex_destroy(&cl->probe_lock);
    colld_peer_allow_free(cl->allow);
    free(cl->known);
    free(cl);
}

/* The net backend's start: the peer transport when --listen is set (absent otherwise). Returns 0,
 * or -1 when the daemon cannot serve peers as configured. */
static int net_start(colld_backend_t *b)
{
    colld_daemon_t *d = b->d;
    if (!d->cfg.listen || !*d->cfg.listen)
        return 0;
    if (!d->cfg.secret_file || !*d->cfg.secret_file) {
        LOG_ERROR(NET, "--listen needs --cluster-secret-file: daemons authenticate each other with a shared "
                       "secret (at least 16 bytes, e.g. head -c 32 /dev/urandom | base64 > FILE)");
        return -1;
    }
    uint8_t secret[1024];
    ssize_t slen = read_secret(d->cfg.secret_file, secret, sizeof(secret));
    if (slen < 0)
        return -1;
    if (slen < 16) {
        LOG_ERROR(NET, "the cluster secret in %s is %zd bytes; at least 16 are needed", d->cfg.secret_file, slen);
        return -1;
    }
    char err[256];
    colld_peer_allow_t *allow = NULL;
    if (colld_peer_allow_parse(d->cfg.peers, &allow, err, sizeof(err)) < 0) {
        LOG_ERROR(NET, "%s", err);
        memset(secret, 0, sizeof(secret));
        return -1;
    }
    colld_cluster_t *cl = cluster_new(d, allow);
    if (!cl) {
        memset(secret, 0, sizeof(secret));
        return -1;
    }
    if (!colld_peer_allow_count(allow))
        LOG_WARN(NET, "--listen without --peers: this daemon joins the multi-node communicators of another root "
                      "daemon only once that daemon has connected to it; list the peer daemons (or their network, "
                      "e.g. 10.0.0.0/16:7070) with --peers");
    if (d->cfg.node_name && *d->cfg.node_name)
        colld_strlcpy(cl->node_name, d->cfg.node_name, sizeof(cl->node_name));
    else if (gethostname(cl->node_name, sizeof(cl->node_name) - 1) < 0)
        colld_strlcpy(cl->node_name, "node", sizeof(cl->node_name));
    if (colld_iblink_start(cl) < 0) {
        cluster_free(cl);
        memset(secret, 0, sizeof(secret));
        return -1;
    }
    colld_net_config_t nc = net_config(d, cl);
    nc.secret = secret;
    nc.secret_len = (size_t)slen;
    b->state = cl; /* the thread's callbacks find it there */
    b->present = true;
    if (colld_net_start(&nc, &cl->net, err, sizeof(err)) < 0) {
        LOG_ERROR(NET, "cannot listen for peer daemons on %s: %s", d->cfg.listen, err);
        colld_iblink_stop(cl);
        b->state = NULL;
        b->present = false;
        cluster_free(cl);
        memset(secret, 0, sizeof(secret));
        return -1;
    }
    memset(secret, 0, sizeof(secret));
    colld_strlcpy(cl->self_addr, colld_net_listen_addr(cl->net), sizeof(cl->self_addr));
    LOG_INFO(NET, "node %s listening for peer daemons on %s", cl->node_name, cl->self_addr);
    return 0;
}

int colld__cluster_start_detached(colld_daemon_t *d, const char *self_addr, const char *node_name)
{
    static const uint8_t secret[] = "detached-cluster-secret-01234567";
    colld_backend_t *b = colld_backend_find(d, &colld_net_backend);
    if (!b || b->state)
        return -1;
    colld_cluster_t *cl = cluster_new(d, NULL);
    if (!cl)
        return -1;
    colld_strlcpy(cl->node_name, node_name, sizeof(cl->node_name));
    colld_net_config_t nc = net_config(d, cl);
    nc.listen_addr = self_addr;
    nc.secret = secret;
    nc.secret_len = sizeof(secret) - 1;
    char err[256];
    b->state = cl;
    b->present = true;
    if (colld__tcp_net_detached(&nc, &cl->net, err, sizeof(err)) < 0) {
        b->state = NULL;
        b->present = false;
        cluster_free(cl);
        return -1;
    }
    colld_strlcpy(cl->self_addr, colld_net_listen_addr(cl->net), sizeof(cl->self_addr));
    return 0;
}

void colld_cluster_stop(colld_daemon_t *d)
{
    colld_backend_t *b = colld_backend_find(d, &colld_net_backend);
    colld_cluster_t *cl = b ? b->state : NULL;
    if (!cl)
        return;
    colld_net_stop(cl->net); /* no callback runs after this */
    colld_iblink_stop(cl);
    colld_xcoll_abort_all(d);
    colld_cluster_probe_abandon(d);
    colld_cluster_gather_abandon(d);
    colld_gather_free(cl);
    free(cl->probe.links);
    pthread_mutex_lock(&d->lock);
    while (cl->inbox) {
        cjob_t *j = cl->inbox;
        cl->inbox = j->next;
        if (j->coll) {
            j->coll->status = COLLD_ERR_NODE_LOST;
            colld_engine_finish(d, j->coll);
        }
        free(j->buf);
        free(j);
    }
    while (cl->xjoins) {
        xjoin_t *j = cl->xjoins;
        cl->xjoins = j->next;
        xjoin_free(j);
    }
    b->state = NULL;
    b->present = false;
    pthread_mutex_unlock(&d->lock);
    cluster_free(cl);
}

static void net_stop(colld_backend_t *b)
{
    colld_cluster_stop(b->d);
}

/* Peers and counters for collctl status and the metrics (see net.h). */
size_t colld_cluster_peers(colld_daemon_t *d, colld_net_peer_info_t *out, size_t max, uint64_t *sent,
                           uint64_t *received, uint64_t *refused)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    *sent = *received = *refused = 0;
    if (!cl)
        return 0;
    *sent = atomic_load(&cl->payload_sent);
    *received = atomic_load(&cl->payload_received);
    *refused = colld_net_refused(cl->net);
    return colld_net_peers(cl->net, out, max);
}

uint64_t colld_cluster_bad_msgs(colld_daemon_t *d)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    return cl ? atomic_load(&cl->bad_msgs) : 0;
}

/* Close the connections to a peer (operator, tests). Returns 0 or -1 (no such peer up). */
int colld_cluster_disconnect(colld_daemon_t *d, const char *peer)
{
    if (!colld_cluster_of(d))
        return -1;
    return colld_net_disconnect(colld_cluster_of(d)->net, peer);
}

uint64_t colld_cluster_comm_xid(const colld_dcomm_t *c)
{
    const colld_xcomm_t *x = colld_xcomm(c);
    return x ? x->xid : 0;
}

/* This daemon's node name ("" without --listen). */
const char *colld_cluster_node_name(const colld_daemon_t *d)
{
    return colld_cluster_of(d) ? colld_cluster_of(d)->node_name : "";
}

/* The address peers reach this daemon at ("" without --listen). */
const char *colld_cluster_listen_addr(const colld_daemon_t *d)
{
    return colld_cluster_of(d) ? colld_cluster_of(d)->self_addr : "";
}

/* ============================================================================================
 * The backend
 * ========================================================================================== */

/* It runs every collective of the communicators it forms (those spanning nodes). */
static bool net_claims(const colld_backend_t *b, const colld_dcomm_t *c, const colld_wire_sqe_t *sqe)
{
    (void)sqe;
    return c->former == b;
}

/* The startup banner says where peers reach this daemon. */
static void net_describe(const colld_backend_t *b, char *buf, size_t len)
{
    const colld_cluster_t *cl = b->state;
    if (cl)
        snprintf(buf, len, "node %s listening for peer daemons on %s", cl->node_name, cl->self_addr);
    else if (len)
        buf[0] = '\0';
}

/* A communicator it forms failed here (dissolved, closed or broken): the other nodes hear of it. */
static void net_on_faulted(colld_daemon_t *d, colld_dcomm_t *c, colld_fault_t how, int rank, const char *detail)
{
    (void)how;
    if (colld_xcomm(c))
        cluster_comm_failed(d, c, c->error, rank, detail);
}

static void net_on_freed(colld_daemon_t *d, colld_dcomm_t *c)
{
    colld_xcomm_t *x = colld_xcomm(c);
    if (x) {
        xcomm_free(d, c, x);
        c->bslot[c->former->slot] = NULL;
    }
}

static const colld_comm_hooks_t net_hooks = {
    .name = "net",
    .faulted = net_on_faulted,
    .freed = net_on_freed,
};

const colld_backend_ops_t colld_net_backend = {
    .name = "net",
    .start = net_start,
    .stop = net_stop,
    .describe = net_describe,
    .claims = net_claims,
    .submit = net_submit,
    .comm_form = net_comm_form,
    .rank_joined = net_rank_joined,
    .join_grace_ns = 1000000000ull, /* the root daemon times the join out first and names the missing ranks */
    .stamp_uid = net_stamp_uid,
    .hooks = &net_hooks,
};
