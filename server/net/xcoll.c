/*
 * xcoll.c - collectives across daemons (hierarchical): local step, inter-node step, local step.
 * This file is the driver (the stages, Ready, DATA checks and dispatch, deadlines, the end); the
 * inter-node algorithms are ring.c and rd.c (xcoll.h).
 *
 * When every local rank of a multi-node communicator has posted collective `seq`, the engine
 * hands it here (network thread). Each daemon is the single participant for its local ranks:
 *
 *   1. local:  reduce its ranks' inputs into one buffer X (all-reduce, reduce, reduce-scatter), or
 *              copy them into their slots of X (all-gather); a broadcast root's node sends straight
 *              from the root's buffer.
 *   2. nodes:  tell every other member daemon "Ready(seq, signature)"; data goes to a daemon only
 *              after its Ready, so it always has somewhere to go. Then, over k nodes in ring order:
 *              - ring reduce-scatter (RS): at step t node j sends block (j-t-1) mod k to j+1 and
 *                reduces the block (j-t-2) mod k it receives from j-1 into X (received partial
 *                first); after k-1 steps node j holds block j reduced over every node.
 *              - ring all-gather (AG): at step t node j forwards block (j-t) mod k to j+1.
 *              all-reduce and reduce = RS + AG over k equal blocks (2(k-1)/k of the bytes per
 *              node, whatever the number of local ranks); reduce-scatter = RS and all-gather = AG
 *              with each node's block made of its ranks' slots; broadcast = AG of the root
 *              node's block alone (a pipelined chain). Blocks travel in chunks of chunk_bytes, and
 *              each chunk is forwarded as soon as it is reduced, so the reduction overlaps the
 *              network. Small all-reduces (<= small_bytes, or by policy) use recursive doubling:
 *              log2(p) exchanges of the whole buffer with partner j ^ 2^s, the nodes beyond the
 *              largest power of two p handing their data to node j-p first and getting the
 *              result back at the end.
 *   3. local:  avg divides by nranks once the sum is complete; X is copied to the local outputs.
 *   4. verify: (all-reduce, broadcast, all-gather under result verification, --verify-results, a
 *              rank's config or its tenant's policy, which
 *              any node's Ready turns on for all) each local output's checksum must be X's (else
 *              the rank is named); then every node sends Verify(seq, checksum of X) to the others
 *              and, once it has every node's, compares them: a node whose result differs from the
 *              majority's (from the first node's when there is no majority) fails the collective
 *              on every node with COLLD_ERR_CORRUPTED naming it. Every node decides from the same
 *              checksums, so each breaks the communicator itself with the same detail.
 *
 * Determinism: each block is combined in a fixed order of nodes (and each node's partial in rank
 * order), so every rank gets bitwise the same result on every run of the same layout. The order
 * differs from single-node rank order, so float sums may differ from a single daemon's in the
 * last bits (docs/architecture.md).
 *
 * Faults: a failed collective stops sending, discards what still arrives, and is completed (with
 * the communicator's error) once none of its sends is still being written. Nothing ever writes
 * into a collective's memory after it ended: received payloads land in the transport's buffers
 * and are copied from there.
 *
 * Deadlines (the communicator's timeout T): every node must send Ready within T of the first
 * local rank's arrival; after that the collective must make progress (a DATA message accepted, a
 * send written, a slice of the local stages) at least every T, or it fails with
 * COLLD_ERR_TIMEOUT naming the node, the phase and the step it waits for (describe_wait). A
 * failed collective whose sends to a node have not moved for min(T, DRAIN_MS) drops that node's
 * link (COLLD_ERR_NODE_LOST for what spans it): a daemon that stopped reading its sockets is lost.
 *
 * DATA from the network is hostile until checked (data_valid): it must come from the node the
 * algorithm expects for its phase and step, cover exactly one chunk of the block due (whole
 * buffer for recursive doubling), inside the buffer, at most once. Anything else fails the
 * collective with a protocol error naming the node, before a byte is used.
 */
#include "server/net/xcoll.h"

#include "colld_net.pb-c.h"
#include "common/log.h"
#include "common/util.h"
#include "kernels/cpu/reduce.h"
#include "server/core/tenant.h"
#include "server/core/verify.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void xcoll_maybe_end(xcoll_t *xc);

/* The local stages run in slices of this many bytes of X, one slice per pass of the network
 * thread, so that a large collective never keeps it from its sockets and heartbeats. */
#define SLICE_BYTES (4u << 20)
/* A failed collective waits at most this long (or its timeout, if shorter) for sends to a node
 * that no longer takes any before that node's link is dropped. */
#define DRAIN_MS 5000

/* ============================================================================================
 * Helpers
 * ========================================================================================== */

static int describe_sig(char *buf, size_t len, const xsig_t *s)
{
    return snprintf(buf, len, "%s(%s, %s, count %llu, root %d)", colld_kind_name(s->kind), colld_dtype_name(s->dtype),
                    xkind_reduces(s->kind) ? colld_redop_name(s->redop) : "-", (unsigned long long)s->count, s->root);
}

static bool sig_equal(const xsig_t *a, const xsig_t *b)
{
    bool root = a->kind == COLLD_KIND_BROADCAST || a->kind == COLLD_KIND_REDUCE;
    return a->kind == b->kind && a->dtype == b->dtype && a->count == b->count &&
           (!xkind_reduces(a->kind) || a->redop == b->redop) && (!root || a->root == b->root);
}

/* The other node whose peer is p, -1 when p is not a member node. */
static int node_of_peer(const colld_xcomm_t *x, colld_net_peer_t *p)
{
    const char *addr = colld_net_peer_addr(p);
    for (int i = 0; i < x->nnodes; i++)
        if (i != x->self && strcmp(x->node_addr[i], addr) == 0)
            return i;
    return -1;
}

/* ============================================================================================
 * Failing and ending
 * ========================================================================================== */

static void pend_free(xcoll_t *xc)
{
    while (xc->pend) {
        pend_t *p = xc->pend;
        xc->pend = p->next;
        free(p);
    }
    xc->pend_tail = NULL;
}

/* Fail the collective; with `break_comm`, the communicator too (which tells the other nodes). */
static void xcoll_fail(xcoll_t *xc, colld_status_t st, const char *detail, bool break_comm)
{
    if (xc->failed)
        return;
    xc->failed = true;
    xc->status = st;
    xc->fail_ns = colld_now_ns();
    pend_free(xc);
    LOG_INFO(NET, "communicator %llu collective #%llu failed: %s: %s", (unsigned long long)xc->c->id,
             (unsigned long long)xc->sig.seq, colld_status_name(st), detail);
    if (break_comm) {
        pthread_mutex_lock(&xc->d->lock);
        colld_comm_break(xc->d, xc->c, st, -1, detail);
        colld_daemon_unlock(xc->d);
    }
}

/* Copy bytes [a, b) of X to the local ranks' outputs. */
static void phase_out(xcoll_t *xc, uint64_t a, uint64_t b)
{
    colld_coll_t *k = xc->k;
    int n = xc->c->nranks;
    uint64_t slot = xc->sig.count * xc->es;
    for (int r = 0; r < n; r++) {
        colld_op_t *op = k->ops[r];
        if (!op || !op->recv_ptr)
            continue;
        switch (xc->sig.kind) {
        case COLLD_KIND_REDUCE:
            if (r != xc->sig.root)
                break;
            /* fall through */
        case COLLD_KIND_ALLREDUCE:
        case COLLD_KIND_BROADCAST:
        case COLLD_KIND_ALLGATHER:
            if (op->recv_ptr != xc->X)
                memcpy((uint8_t *)op->recv_ptr + a, xc->X + a, b - a);
            break;
        case COLLD_KIND_REDUCESCATTER: { /* rank r's slot, where it meets [a, b) */
            uint64_t lo = COLLD_MAX(a, (uint64_t)r * slot), hi = COLLD_MIN(b, (uint64_t)(r + 1) * slot);
            if (lo < hi)
                memcpy((uint8_t *)op->recv_ptr + (lo - (uint64_t)r * slot), xc->X + lo, hi - lo);
            break;
        }
        default:
            break;
        }
    }
}

static void xcoll_start(xcoll_t *xc);

/* The collective is over: post its completions, free it, start the next one of its communicator. */
static void xcoll_end(xcoll_t *xc)
{
    colld_daemon_t *d = xc->d;
    colld_cluster_t *cl = colld_cluster_of(d);
    colld_xcomm_t *x = xc->x;
    x->qhead = xc->next;
    if (!x->qhead)
        x->qtail = NULL;
    xcoll_t *next = xc->next; /* holds its own reference on the communicator: x stays */
    for (xcoll_t **pp = &cl->running; *pp; pp = &(*pp)->rnext)
        if (*pp == xc) {
            *pp = xc->rnext;
            break;
        }
    pthread_mutex_lock(&d->lock);
    if (x->net_coll == xc->k)
        x->net_coll = NULL;
    xc->k->status = xc->failed ? xc->status : COLLD_OK;
    xc->k->end_ns = colld_now_ns();
    colld_tenant_uncharge_mem(d, xc->c->tenant, xc->rd_charged); /* its step buffers, freed below */
    xc->rd_charged = 0;
    colld_engine_finish(d, xc->k);
    pthread_mutex_unlock(&d->lock);
    pend_free(xc);
    free(xc->ranges);
    free(xc->got);
    free(xc->nodes);
    colld_xrd_free(xc);
    free(xc);
    if (next)
        xcoll_start(next);
}

static bool xcoll_complete(const xcoll_t *xc)
{
    if (!xc->active)
        return false;
    if (xc->failed)
        return xc->inflight == 0;
    if (xc->stage != STAGE_NET)
        return false;
    return xc->nready == xc->x->nnodes - 1 && xc->recv_left == 0 && xc->inflight == 0 && !xc->pend &&
           (!xc->rd || xc->rd_finished);
}

static void xcoll_pump(xcoll_t *xc);

/* Move on when the network part is over: the copy-out stage (if it succeeded), then the end. */
static void xcoll_maybe_end(xcoll_t *xc)
{
    if (xc->busy != 0)
        return;
    if (xc->stage == STAGE_VERIFY && !xc->failed) { /* stage 4: every node's checksum compared equal */
        if (xc->vdone && xc->inflight == 0)
            xcoll_end(xc);
        return;
    }
    if (!xcoll_complete(xc))
        return;
    if (xc->failed || xc->xbytes == 0) {
        xcoll_end(xc);
        return;
    }
    xc->stage = STAGE_OUT;
    xc->cursor = 0;
    const colld_daemon_config_t *cfg = &xc->d->cfg;
    /* (never a rank's own buffer: a broadcast root's node sends from it) */
    if (cfg->test_corrupt && cfg->test_corrupt_rank == -1 && colld_verify_kind(xc->sig.kind) &&
        xc->X == xc->x->scratch && cfg->test_corrupt_elem < xc->xbytes / xc->es)
        xc->X[cfg->test_corrupt_elem * xc->es] ^= 0x01; /* TEST HOOK --test-corrupt-result node:E */
    xcoll_pump(xc);
}

/* ============================================================================================
 * Sending
 * ========================================================================================== */

static void send_done(void *cookie, bool ok)
{
    xnode_t *n = cookie;
    xcoll_t *xc = n->xc;
    xc->inflight--;
    n->inflight--;
    n->moved_ns = colld_now_ns();
    if (ok)
        xc->progress_ns = n->moved_ns;
    else
        xcoll_fail(xc, COLLD_ERR_NODE_LOST, "a peer daemon was lost while data was sent to it", false);
    xcoll_maybe_end(xc);
}

/* Send now (the destination is ready). */
static void send_now(xcoll_t *xc, int node, const colld_net_hdr_t *h, const uint8_t *src)
{
    colld_net_peer_t *p = xc->x->peers[node];
    xnode_t *n = &xc->nodes[node];
    if (n->inflight == 0)
        n->moved_ns = colld_now_ns(); /* its clock starts with the first send in flight */
    xc->inflight++;
    n->inflight++;
    if (!p || colld_net_send_data(p, h, src, (unsigned)(h->offset / xc->x->chunk_bytes), send_done, n) < 0) {
        xc->inflight--;
        n->inflight--;
        char why[COLLD_DETAIL_LEN];
        snprintf(why, sizeof(why), "node %s (%s) is not reachable", xc->x->node_name[node], xc->x->node_addr[node]);
        xcoll_fail(xc, COLLD_ERR_NODE_LOST, why, true);
        return;
    }
    atomic_fetch_add(&colld_cluster_of(xc->d)->payload_sent, h->len);
}

/* Send [off, off+len) of src to node (one chunk), or hold it until the node is ready. */
static void xsend(xcoll_t *xc, int node, int phase, int step, uint64_t off, uint64_t len, const uint8_t *src)
{
    if (xc->failed)
        return;
    colld_net_hdr_t h = { .phase = (uint8_t)phase,
                          .step = (uint16_t)step,
                          .len = (uint32_t)len,
                          .xid = xc->x->xid,
                          .seq = xc->sig.seq,
                          .offset = off };
    if (xc->nodes[node].ready) {
        send_now(xc, node, &h, src);
        return;
    }
    pend_t *p = calloc(1, sizeof(*p));
    if (!p) {
        xcoll_fail(xc, COLLD_ERR_NO_MEMORY, "daemon out of memory", true);
        return;
    }
    p->node = node;
    p->h = h;
    p->src = src;
    if (xc->pend_tail)
        xc->pend_tail->next = p;
    else
        xc->pend = p;
    xc->pend_tail = p;
}

/* The sends held for a node that just became ready, in order. */
static void flush_pending(xcoll_t *xc, int node)
{
    pend_t **pp = &xc->pend;
    xc->pend_tail = NULL;
    while (*pp) {
        pend_t *p = *pp;
        if (p->node == node && !xc->failed) {
            *pp = p->next;
            send_now(xc, node, &p->h, p->src);
            free(p);
            continue;
        }
        xc->pend_tail = p;
        pp = &p->next;
    }
}

/* ============================================================================================
 * Starting a collective
 * ========================================================================================== */

/* --nan-check on bytes [a, b) of the local ranks' inputs of a floating-point reduction: the first
 * NaN or infinity fails the collective and breaks the communicator with COLLD_ERR_NUMERIC naming
 * the rank and the element (every node hears it). Returns 0, or -1 when one was found. */
static int check_finite(xcoll_t *xc, uint64_t a, uint64_t b)
{
    colld_dtype_t dt = xc->dt;
    if (dt != COLLD_FLOAT16 && dt != COLLD_BFLOAT16 && dt != COLLD_FLOAT32 && dt != COLLD_FLOAT64)
        return 0;
    for (int r = 0; r < xc->c->nranks; r++) {
        const colld_op_t *op = xc->k->ops[r];
        if (!op)
            continue;
        const uint8_t *p = (const uint8_t *)op->send_ptr + a;
        size_t i = colld_cpu_first_nonfinite(dt, p, (size_t)((b - a) / xc->es));
        if (i == (b - a) / xc->es)
            continue;
        char why[COLLD_DETAIL_LEN];
        snprintf(why, sizeof(why), "rank %d contributed %s at element %llu (%s %s, --nan-check)", r,
                 colld_cpu_nonfinite_name(dt, p + i * xc->es), (unsigned long long)(a / xc->es + i),
                 colld_kind_name(xc->sig.kind), colld_dtype_name(dt));
        xcoll_fail(xc, COLLD_ERR_NUMERIC, why, true);
        return -1;
    }
    return 0;
}

/* Step 1 for bytes [a, b) of X: the local ranks' contribution. */
static int phase_in(xcoll_t *xc, uint64_t a, uint64_t b)
{
    colld_coll_t *k = xc->k;
    int n = xc->c->nranks;
    uint64_t slot = xc->sig.count * xc->es;
    const void *in[COLLD_MAX_RANKS];
    int nin = 0;
    if (xc->sig.kind == COLLD_KIND_BROADCAST)
        return 0; /* the root's node sends from the root's buffer (the others may have none) */
    if (xc->sig.kind == COLLD_KIND_ALLGATHER) {
        for (int r = 0; r < n; r++) {
            uint64_t lo = COLLD_MAX(a, (uint64_t)r * slot), hi = COLLD_MIN(b, (uint64_t)(r + 1) * slot);
            if (k->ops[r] && lo < hi)
                memcpy(xc->X + lo, (const uint8_t *)k->ops[r]->send_ptr + (lo - (uint64_t)r * slot), hi - lo);
        }
        return 0;
    }
    uint64_t scalars[COLLD_MAX_RANKS];
    for (int r = 0; r < n; r++)
        if (k->ops[r]) {
            scalars[nin] = colld_wire_sqe_scalar(&k->ops[r]->d);
            in[nin++] = (const uint8_t *)k->ops[r]->send_ptr + a;
        }
    if ((xc->d->cfg.nan_check || xc->k->comm->nan_check) && check_finite(xc, a, b) < 0)
        return 0; /* failed with the verdict */
    void *out[1] = { xc->X + a };
    /* A premultiplied sum multiplies each local rank's input by its own scalar here; the nodes'
     * partial sums are then added (pop). */
    colld_status_t st = xc->op == (colld_redop_t)COLLD_REDOP_PREMUL_SUM
                            ? colld_cpu_reduce_premul(xc->dt, scalars, in, nin, out, 1, (b - a) / xc->es)
                            : colld_cpu_reduce(xc->dt, xc->pop, in, nin, out, 1, (b - a) / xc->es);
    return st == COLLD_OK ? 0 : -1;
}

/* Send a small control message (a Ready or a Verify) to every other node of the collective's
 * communicator. False after failing the collective with NODE_LOST naming the first node it could
 * not reach. */
static bool send_to_nodes(xcoll_t *xc, const Colld__Net__V1__Msg *m)
{
    colld_xcomm_t *x = xc->x;
    uint8_t buf[128];
    if (colld__net__v1__msg__get_packed_size(m) > sizeof(buf))
        return xcoll_fail(xc, COLLD_ERR_INTERNAL, "a control message outgrew its buffer", true), false;
    size_t len = colld__net__v1__msg__pack(m, buf);
    for (int i = 0; i < x->nnodes; i++)
        if (i != x->self && (!x->peers[i] || colld_net_send_ctrl(x->peers[i], buf, len) < 0)) {
            char why[COLLD_DETAIL_LEN];
            snprintf(why, sizeof(why), "node %s (%s) is not reachable", x->node_name[i], x->node_addr[i]);
            xcoll_fail(xc, COLLD_ERR_NODE_LOST, why, true);
            return false;
        }
    return true;
}

/* Send Ready to every other member daemon. */
static void send_ready(xcoll_t *xc)
{
    colld_xcomm_t *x = xc->x;
    Colld__Net__V1__Ready r = COLLD__NET__V1__READY__INIT;
    r.xid = x->xid;
    r.seq = xc->sig.seq;
    r.kind = xc->sig.kind;
    r.dtype = xc->sig.dtype;
    r.redop = xc->sig.redop;
    r.root = xc->sig.root;
    r.count = xc->sig.count;
    r.verify = xc->verify;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_READY;
    m.ready = &r;
    if (!send_to_nodes(xc, &m))
        return;
}

/* A node announced this collective: check its signature, release the sends held for it. */
static void apply_ready(xcoll_t *xc, int node, const xsig_t *sig)
{
    if (xc->nodes[node].ready || xc->failed)
        return;
    if (!sig_equal(sig, &xc->sig)) {
        char why[COLLD_DETAIL_LEN], a[160], b[160];
        describe_sig(a, sizeof(a), &xc->sig);
        describe_sig(b, sizeof(b), sig);
        snprintf(why, sizeof(why), "collective #%llu differs between nodes: node %s: %s; node %s: %s",
                 (unsigned long long)xc->sig.seq, xc->x->node_name[xc->x->self], a, xc->x->node_name[node], b);
        xcoll_fail(xc, COLLD_ERR_MISMATCH, why, true);
        return;
    }
    xc->nodes[node].ready = true;
    xc->nready++;
    if (sig->verify && colld_verify_kind(xc->sig.kind))
        xc->verify = true; /* before the network part ends, every node has heard every Ready */
    xc->progress_ns = colld_now_ns();
    flush_pending(xc, node);
}

static void xcoll_run(xcoll_t *xc);
static void verify_start(xcoll_t *xc);

/* Start the collective at the head of its communicator's queue: its buffer, its layout, then
 * the local stage (in slices). */
static void xcoll_start(xcoll_t *xc)
{
    colld_daemon_t *d = xc->d;
    colld_xcomm_t *x = xc->x;
    xc->busy++;
    xc->active = true;
    xc->stage = STAGE_IN;
    xc->progress_ns = colld_now_ns();
    pthread_mutex_lock(&d->lock);
    bool ok = xc->c->state == COLLD_COMM_READY;
    colld_status_t err = xc->c->error;
    xc->k->start_ns = xc->progress_ns;
    x->net_coll = xc->k; /* collctl trace shows it while it runs */
    pthread_mutex_unlock(&d->lock);
    if (!ok) {
        xcoll_fail(xc, err ? err : COLLD_ERR_ABORTED, "communicator already failed", false);
        goto out;
    }
    /* X: the collective's whole buffer on this node */
    uint64_t bytes = xc->sig.count * xc->es;
    if (xc->sig.kind == COLLD_KIND_ALLGATHER || xc->sig.kind == COLLD_KIND_REDUCESCATTER)
        bytes *= (uint64_t)xc->c->nranks;
    xc->xbytes = bytes;
    if (bytes > x->scratch_size) {
        /* The daemon's memory, for the communicator's tenant: its growth is charged to it (and
         * the whole given back when the communicator goes, xcomm_free). */
        colld_err_t why = COLLD_ERR_INIT;
        uint64_t grow = bytes - x->scratch_size;
        pthread_mutex_lock(&d->lock);
        colld_status_t st = colld_tenant_charge_mem(d, xc->c->tenant, grow, &why);
        pthread_mutex_unlock(&d->lock);
        if (st != COLLD_OK) {
            xcoll_fail(xc, st, why.msg, true);
            goto out;
        }
        void *p = realloc(x->scratch, bytes);
        if (!p) {
            pthread_mutex_lock(&d->lock);
            colld_tenant_uncharge_mem(d, xc->c->tenant, grow);
            pthread_mutex_unlock(&d->lock);
            xcoll_fail(xc, COLLD_ERR_NO_MEMORY, "daemon out of memory for the collective's buffer", true);
            goto out;
        }
        x->scratch = p;
        x->scratch_size = bytes;
    }
    xc->X = x->scratch;
    if (xc->sig.kind == COLLD_KIND_BROADCAST && xc->k->ops[xc->sig.root])
        xc->X = xc->k->ops[xc->sig.root]->send_ptr; /* sent straight from the root's buffer */
    xc->nodes = calloc((size_t)x->nnodes, sizeof(*xc->nodes));
    for (int i = 0; xc->nodes && i < x->nnodes; i++)
        xc->nodes[i] = (xnode_t){ .xc = xc, .node = i };
    bool small = bytes <= x->chunk_bytes &&
                 (x->algo == COLLD_NET_ALGO_RD || (x->algo == COLLD_NET_ALGO_AUTO && bytes <= x->small_bytes));
    xc->rd = (xc->sig.kind == COLLD_KIND_ALLREDUCE || xc->sig.kind == COLLD_KIND_REDUCE) && small;
    if (!xc->nodes || colld_xring_layout(xc) < 0) {
        xcoll_fail(xc, COLLD_ERR_NO_MEMORY, "daemon out of memory", true);
        goto out;
    }
    xc->cursor = 0;
    xcoll_pump(xc);
out:
    xc->busy--;
    xcoll_maybe_end(xc);
}

/* One slice of a local stage; at the end of the stage, the next step. */
static void xcoll_pump(xcoll_t *xc)
{
    if (xc->failed || (xc->stage != STAGE_IN && xc->stage != STAGE_OUT))
        return;
    xc->busy++;
    uint64_t a = xc->cursor, b = COLLD_MIN(xc->xbytes, a + SLICE_BYTES);
    if (xc->stage == STAGE_IN && b > a && phase_in(xc, a, b) < 0)
        xcoll_fail(xc, COLLD_ERR_INTERNAL, "local reduction refused its arguments", true);
    if (xc->stage == STAGE_OUT && b > a)
        phase_out(xc, a, b);
    xc->cursor = b;
    xc->progress_ns = colld_now_ns();
    bool stage_done = b >= xc->xbytes;
    xc->busy--;
    if (xc->failed) {
        xcoll_maybe_end(xc);
        return;
    }
    if (!stage_done) {
        colld_net_wake(colld_cluster_of(xc->d)->net); /* the next slice after the sockets had a turn */
        return;
    }
    if (xc->stage == STAGE_IN) {
        xc->stage = STAGE_NET;
        xcoll_run(xc);
    } else if (xc->verify) {
        verify_start(xc);
    } else {
        xcoll_end(xc);
    }
}

/* The local contribution is in X: announce it and start the algorithm among the nodes. */
static void xcoll_run(xcoll_t *xc)
{
    colld_xcomm_t *x = xc->x;
    int k = x->nnodes, j = x->self;
    xc->busy++;
    send_ready(xc);
    if (xc->failed)
        goto out;
    for (int i = 0; i < k; i++) /* Ready messages that came before this collective started */
        if (i != j && x->ready[i][xc->sig.seq & 1].seq == xc->sig.seq)
            apply_ready(xc, i, &x->ready[i][xc->sig.seq & 1]);
    if (xc->rd) {
        /* The step buffers are the daemon's memory for the tenant: charged to it until the
         * collective ends (xcoll_end). */
        colld_daemon_t *d = xc->d;
        colld_err_t why = COLLD_ERR_INIT;
        uint64_t charge = colld_xrd_buf_bytes(xc);
        pthread_mutex_lock(&d->lock);
        colld_status_t st = colld_tenant_charge_mem(d, xc->c->tenant, charge, &why);
        pthread_mutex_unlock(&d->lock);
        if (st != COLLD_OK) {
            xcoll_fail(xc, st, why.msg, true);
            goto out;
        }
        xc->rd_charged = charge;
        colld_xrd_start(xc);
    } else {
        colld_xring_start(xc);
    }
out:
    xc->busy--;
    xcoll_maybe_end(xc);
}

/* ============================================================================================
 * Result verification (stage 4)
 * ========================================================================================== */

__attribute__((format(printf, 4, 5))) static void appendf(char *buf, size_t len, int *off, const char *fmt, ...);
static void detail_repair(char *buf, size_t len);
static void append_ranks(const xcoll_t *xc, int n, char *buf, size_t len, int *off);

/* Every node's checksum is here: compare them. All equal: the end. Else fail naming each node
 * that differs from the reference (the majority's, else the first node's) with its ranks; the
 * other nodes reach the same verdict from the same checksums, so none echoes it (each breaks the
 * communicator with the same detail, whoever decides first). */
static void verify_try(xcoll_t *xc)
{
    colld_xcomm_t *x = xc->x;
    int k = x->nnodes;
    uint64_t sums[COLLD_MAX_RANKS] = { 0 };
    if (xc->failed || xc->stage != STAGE_VERIFY || k > COLLD_MAX_RANKS)
        return;
    for (int n = 0; n < k; n++) {
        if (n == x->self) {
            sums[n] = xc->vsum;
            continue;
        }
        if (x->verified[n][xc->sig.seq & 1].seq != xc->sig.seq)
            return; /* not yet */
        sums[n] = x->verified[n][xc->sig.seq & 1].sum;
    }
    int ref;
    bool majority;
    int differ = colld_verify_verdict(sums, k, &ref, &majority);
    if (!differ) {
        xc->vdone = true; /* xcoll_maybe_end ends it */
        return;
    }
    char why[COLLD_DETAIL_LEN];
    int off = 0, named = 0;
    appendf(why, sizeof(why), &off, "result verification: ");
    for (int n = 0; n < k && off < (int)sizeof(why) - 160; n++) {
        if (sums[n] == sums[ref])
            continue;
        appendf(why, sizeof(why), &off, "%snode %s (%s)", named++ ? "; " : "", x->node_name[n], x->node_addr[n]);
        append_ranks(xc, n, why, sizeof(why), &off);
        appendf(why, sizeof(why), &off, " result differs from node %s's (%s) (XXH3 %016llx, not %016llx)",
                x->node_name[ref], x->node_addr[ref], (unsigned long long)sums[n], (unsigned long long)sums[ref]);
    }
    appendf(why, sizeof(why), &off, " (%s %s collective #%llu, %d of %d nodes agree%s)", colld_kind_name(xc->sig.kind),
            colld_dtype_name(xc->dt), (unsigned long long)xc->sig.seq, k - differ, k,
            majority ? "" : ": no majority, either may be the corrupted one");
    detail_repair(why, sizeof(why));
    LOG_WARN(NET, "communicator %llu: %s", (unsigned long long)xc->c->id, why);
    xcoll_fail(xc, COLLD_ERR_CORRUPTED, why, false);
    colld_daemon_t *d = xc->d;
    pthread_mutex_lock(&d->lock);
    x->fault_from_peer = true; /* every node decides this itself: no Fail to echo */
    colld_comm_break(d, xc->c, COLLD_ERR_CORRUPTED, -1, why);
    x->fault_from_peer = false;
    colld_daemon_unlock(d);
}

/* Stage 4 starts (the local ranks have the result): each local output must match X, the node's
 * result; then X's checksum goes to every other node. */
static void verify_start(xcoll_t *xc)
{
    colld_xcomm_t *x = xc->x;
    xc->busy++;
    xc->vsum = colld_verify_sum(xc->X, xc->xbytes);
    for (int r = 0; r < xc->c->nranks; r++) {
        const colld_op_t *op = xc->k->ops[r];
        if (!op || !op->recv_ptr || op->recv_ptr == xc->X)
            continue;
        uint64_t s = colld_verify_sum(op->recv_ptr, xc->xbytes);
        if (s == xc->vsum)
            continue;
        char why[COLLD_DETAIL_LEN];
        uint64_t e = colld_verify_first_diff(op->recv_ptr, xc->X, xc->xbytes / xc->es, xc->es);
        snprintf(why, sizeof(why),
                 "result verification: rank %d (pid %d) on node %s result differs from its node's from element %llu "
                 "(XXH3 %016llx, not %016llx) (%s %s collective #%llu)",
                 r, (int)xc->c->ranks[r].pid, x->node_name[x->self], (unsigned long long)e, (unsigned long long)s,
                 (unsigned long long)xc->vsum, colld_kind_name(xc->sig.kind), colld_dtype_name(xc->dt),
                 (unsigned long long)xc->sig.seq);
        xcoll_fail(xc, COLLD_ERR_CORRUPTED, why, true);
        goto out;
    }
    Colld__Net__V1__Verify v = COLLD__NET__V1__VERIFY__INIT;
    v.xid = x->xid;
    v.seq = xc->sig.seq;
    v.sum = xc->vsum;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_VERIFY;
    m.verify = &v;
    if (!send_to_nodes(xc, &m))
        goto out;
    xc->stage = STAGE_VERIFY;
    xc->progress_ns = colld_now_ns();
    verify_try(xc);
out:
    xc->busy--;
    xcoll_maybe_end(xc);
}

/* ============================================================================================
 * Entry points (network thread)
 * ========================================================================================== */

void colld_xcoll_add(colld_daemon_t *d, colld_coll_t *k)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    colld_dcomm_t *c = k->comm;
    xcoll_t *xc = calloc(1, sizeof(*xc));
    if (!xc) {
        pthread_mutex_lock(&d->lock);
        k->status = COLLD_ERR_NO_MEMORY;
        colld_engine_finish(d, k);
        pthread_mutex_unlock(&d->lock);
        return;
    }
    const colld_op_t *lead = colld_coll_lead(k);
    xc->d = d;
    xc->k = k;
    xc->c = c;
    xc->x = colld_xcomm(c);
    xc->send = xsend;
    xc->fail = xcoll_fail;
    xc->sig = (xsig_t){ .seq = lead->d.seq,
                        .kind = lead->d.kind,
                        .dtype = lead->d.dtype,
                        .redop = lead->d.redop,
                        .root = lead->d.root,
                        .count = lead->d.count };
    xc->dt = (colld_dtype_t)lead->d.dtype;
    xc->op = (colld_redop_t)lead->d.redop;
    xc->pop = xc->op == COLLD_AVG || xc->op == (colld_redop_t)COLLD_REDOP_PREMUL_SUM ? COLLD_SUM : xc->op;
    xc->es = colld_dtype_size(xc->dt);
    pthread_mutex_lock(&d->lock);
    xc->verify = colld_verify_kind(xc->sig.kind) && colld_comm_verifies(d, c);
    pthread_mutex_unlock(&d->lock);
    uint64_t first = UINT64_MAX;
    for (int r = 0; r < c->nranks; r++)
        if (k->ops[r])
            first = COLLD_MIN(first, k->ops[r]->arrival_ns);
    xc->deadline_ns = first + (uint64_t)c->timeout_ms * 1000000ull;
    xc->rnext = cl->running;
    cl->running = xc;
    colld_xcomm_t *x = colld_xcomm(c);
    if (x->qtail)
        x->qtail->next = xc;
    else
        x->qhead = xc;
    x->qtail = xc;
    if (x->qhead == xc)
        xcoll_start(xc);
}

void colld_xcoll_ready(colld_daemon_t *d, colld_dcomm_t *c, int node, const xsig_t *sig)
{
    (void)d;
    colld_xcomm_t *x = colld_xcomm(c);
    x->ready[node][sig->seq & 1] = *sig;
    xcoll_t *xc = x->qhead;
    if (!xc || !xc->active || xc->sig.seq != sig->seq)
        return;
    xc->busy++;
    apply_ready(xc, node, sig);
    xc->busy--;
    xcoll_maybe_end(xc);
}

void colld_xcoll_verified(colld_daemon_t *d, colld_dcomm_t *c, int node, uint64_t seq, uint64_t sum)
{
    colld_xcomm_t *x = colld_xcomm(c);
    xverified_t *v = &x->verified[node][seq & 1];
    if (v->seq == seq) {
        colld_cluster_log_bad(colld_cluster_of(d), "second Verify of collective #%llu from %s", (unsigned long long)seq,
                              x->node_addr[node]);
        return;
    }
    *v = (xverified_t){ .seq = seq, .sum = sum };
    xcoll_t *xc = x->qhead;
    if (!xc || !xc->active || xc->sig.seq != seq || xc->stage != STAGE_VERIFY)
        return;
    xc->busy++;
    xc->progress_ns = colld_now_ns();
    verify_try(xc);
    xc->busy--;
    xcoll_maybe_end(xc);
}

/* The running collective a DATA message belongs to. */
static xcoll_t *find_xcoll(colld_cluster_t *cl, uint64_t xid, uint64_t seq)
{
    for (xcoll_t *xc = cl->running; xc; xc = xc->rnext)
        if (xc->active && xc->x->xid == xid && xc->sig.seq == seq)
            return xc;
    return NULL;
}

/* Check a DATA message from node `from` against what this node expects of it (see the top of
 * the file). Returns true, or false with the reason always recorded in err. On success, *chunk
 * is the ring chunk it fills (-1 for recursive doubling). */
static bool data_valid(xcoll_t *xc, int from, const colld_net_hdr_t *h, int64_t *chunk, colld_err_t *err)
{
    *chunk = -1;
    if (xc->stage != STAGE_NET) {
        (void)colld_err_set(err, COLLD_ERR_INTERNAL, "%s step %u arrived before this node announced it was ready",
                            xphase_name(h->phase), h->step);
        return false;
    }
    if (h->len == 0 || h->offset > xc->xbytes || h->len > xc->xbytes - h->offset || h->offset % xc->es ||
        h->len % xc->es || h->len > xc->recv_left) {
        (void)colld_err_set(err, COLLD_ERR_INTERNAL,
                            "%s step %u: bytes %llu..%llu are empty, outside the collective's %llu-byte buffer, "
                            "not whole elements or more than is still due",
                            xphase_name(h->phase), h->step, (unsigned long long)h->offset,
                            (unsigned long long)(h->offset + h->len), (unsigned long long)xc->xbytes);
        return false;
    }
    switch (h->phase) {
    case XPHASE_RD_PRE:
    case XPHASE_RD:
    case XPHASE_RD_POST:
        return colld_xrd_valid(xc, from, h, err);
    case XPHASE_RS:
    case XPHASE_AG:
        return colld_xring_valid(xc, from, h, chunk, err);
    default:
        (void)colld_err_set(err, COLLD_ERR_INTERNAL, "unknown phase %u", h->phase);
        return false;
    }
}

void colld_xcoll_data(colld_daemon_t *d, colld_net_peer_t *p, const colld_net_hdr_t *h, const void *payload)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    atomic_fetch_add(&cl->payload_received, h->len);
    xcoll_t *xc = find_xcoll(cl, h->xid, h->seq);
    if (!xc || xc->failed)
        return; /* a collective that failed here: what still arrives is dropped */
    int from = node_of_peer(xc->x, p);
    if (from < 0) { /* not a member: it must not be able to fail the communicator */
        colld_cluster_log_bad(cl, "DATA from %s for a communicator it is not a member of", colld_net_peer_addr(p));
        return;
    }
    xc->busy++;
    colld_err_t err = COLLD_ERR_INIT;
    int64_t chunk;
    if (!data_valid(xc, from, h, &chunk, &err)) {
        char detail[COLLD_DETAIL_LEN];
        snprintf(detail, sizeof(detail), "protocol error from node %s (%s): %.*s", xc->x->node_name[from],
                 xc->x->node_addr[from], (int)(COLLD_DETAIL_LEN / 2), err.msg);
        xcoll_fail(xc, COLLD_ERR_INTERNAL, detail, true);
        goto out;
    }
    xc->progress_ns = colld_now_ns();
    if (h->phase == XPHASE_RS || h->phase == XPHASE_AG)
        colld_xring_data(xc, h, chunk, payload);
    else
        colld_xrd_data(xc, h, payload);
out:
    xc->busy--;
    xcoll_maybe_end(xc);
}

/* Append to the detail being built in buf (len bytes) at *off; never past its end, whatever was
 * appended before (*off stays below len). */
__attribute__((format(printf, 4, 5))) static void appendf(char *buf, size_t len, int *off, const char *fmt, ...)
{
    if (*off < 0 || (size_t)*off >= len - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *off, len - (size_t)*off, fmt, ap);
    va_end(ap);
    *off = n < 0 ? (int)(len - 1) : (int)COLLD_MIN((size_t)*off + (size_t)n, len - 1);
}

/* A detail cut at the end of its buffer may end inside a node name's character: repaired in place
 * (a partial character becomes '?'), so that what reaches clients and other nodes is valid UTF-8. */
static void detail_repair(char *buf, size_t len)
{
    colld_str_sanitize(buf, len, buf, SIZE_MAX);
}

/* " rank(s) 2 3" of node n into buf at *off. */
static void append_ranks(const xcoll_t *xc, int n, char *buf, size_t len, int *off)
{
    appendf(buf, len, off, " (rank(s)");
    for (int r = 0; r < xc->c->nranks && *off < (int)len - 16; r++)
        if (xc->x->rank_node[r] == n)
            appendf(buf, len, off, " %d", r);
    appendf(buf, len, off, ")");
}

/* What the collective is waiting for, once every node is ready: the first node that stopped
 * taking its data, else the node, phase and step that has not delivered (into buf at *off). */
static void describe_wait(const xcoll_t *xc, uint64_t now, char *buf, size_t len, int *off)
{
    const colld_xcomm_t *x = xc->x;
    int k = x->nnodes, j = x->self, from = -1, step = 0;
    unsigned phase = 0;
    for (int n = 0; n < k; n++)
        if (n != j && xc->nodes[n].inflight > 0 &&
            now - xc->nodes[n].moved_ns >= (uint64_t)xc->c->timeout_ms * 1000000ull) {
            appendf(buf, len, off, " node %s (%s) took none of this node's data for %llu ms", x->node_name[n],
                    x->node_addr[n], (unsigned long long)((now - xc->nodes[n].moved_ns) / 1000000ull));
            append_ranks(xc, n, buf, len, off);
            return;
        }
    if (xc->stage == STAGE_VERIFY) {
        for (int n = 0; n < k; n++)
            if (n != j && x->verified[n][xc->sig.seq & 1].seq != xc->sig.seq) {
                appendf(buf, len, off, " node %s (%s) did not send its result checksum (result verification)",
                        x->node_name[n], x->node_addr[n]);
                append_ranks(xc, n, buf, len, off);
                return;
            }
    }
    if (xc->stage != STAGE_NET) {
        appendf(buf, len, off, " the local %s stage on node %s did not advance",
                xc->stage == STAGE_IN ? "input" : "copy-out", x->node_name[j]);
        return;
    }
    if (xc->rd)
        colld_xrd_waiting(xc, &phase, &step, &from);
    else
        colld_xring_waiting(xc, &phase, &step, &from);
    if (from < 0 || from == j) {
        appendf(buf, len, off, " the sends of node %s did not finish", x->node_name[j]);
        return;
    }
    appendf(buf, len, off, " node %s (%s) did not send its %s step %d data", x->node_name[from], x->node_addr[from],
            xphase_name(phase), step);
    append_ranks(xc, from, buf, len, off);
}

/* The collective's deadlines (top of the file), on a tick. */
static void check_deadlines(xcoll_t *xc, uint64_t now)
{
    uint64_t t_ns = (uint64_t)xc->c->timeout_ms * 1000000ull;
    char why[COLLD_DETAIL_LEN], sig[160];
    int off;
    if (!xc->failed && xc->nready < xc->x->nnodes - 1 && now >= xc->deadline_ns) {
        off = snprintf(why, sizeof(why), "collective #%llu timed out after %d ms waiting for other nodes:",
                       (unsigned long long)xc->sig.seq, xc->c->timeout_ms);
        for (int node = 0; node < xc->x->nnodes && off < (int)sizeof(why) - 64; node++) {
            if (node == xc->x->self || xc->nodes[node].ready)
                continue;
            appendf(why, sizeof(why), &off, " node %s", xc->x->node_name[node]);
            append_ranks(xc, node, why, sizeof(why), &off);
            appendf(why, sizeof(why), &off, " not ready;");
        }
        detail_repair(why, sizeof(why));
        xcoll_fail(xc, COLLD_ERR_TIMEOUT, why, true);
    } else if (!xc->failed && xc->nready == xc->x->nnodes - 1 && now >= xc->progress_ns + t_ns) {
        describe_sig(sig, sizeof(sig), &xc->sig);
        off = snprintf(why, sizeof(why),
                       "collective #%llu %s made no progress for %d ms:", (unsigned long long)xc->sig.seq, sig,
                       xc->c->timeout_ms);
        describe_wait(xc, now, why, sizeof(why), &off);
        detail_repair(why, sizeof(why));
        xcoll_fail(xc, COLLD_ERR_TIMEOUT, why, true);
    }
    if (!xc->failed || xc->inflight == 0 || !xc->nodes)
        return;
    uint64_t drain_ns = COLLD_MIN(t_ns, (uint64_t)DRAIN_MS * 1000000ull);
    for (int n = 0; n < xc->x->nnodes; n++) {
        xnode_t *xn = &xc->nodes[n];
        if (n == xc->x->self || xn->inflight == 0 || now < COLLD_MAX(xn->moved_ns, xc->fail_ns) + drain_ns ||
            !xc->x->peers[n])
            continue;
        snprintf(why, sizeof(why), "node %s took none of this node's collective data for %llu ms", xc->x->node_name[n],
                 (unsigned long long)((now - xn->moved_ns) / 1000000ull));
        LOG_WARN(NET, "communicator %llu: %s: dropping its link", (unsigned long long)xc->c->id, why);
        colld_net_peer_drop(xc->x->peers[n], why); /* its sends end with done(ok = false) */
        xn->moved_ns = now;                        /* once per drain period */
    }
}

void colld_xcoll_tick(colld_daemon_t *d)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    uint64_t now = colld_now_ns();
    /* Collect first: ending a collective changes the list. */
    int n = 0;
    for (xcoll_t *xc = cl->running; xc; xc = xc->rnext)
        n += xc->active;
    xcoll_t **due = malloc((size_t)n * sizeof(*due) + 1);
    if (!due)
        return; /* the next tick tries again */
    n = 0;
    for (xcoll_t *xc = cl->running; xc; xc = xc->rnext)
        if (xc->active)
            due[n++] = xc;
    for (int i = 0; i < n; i++) {
        xcoll_t *xc = due[i];
        xc->busy++;
        pthread_mutex_lock(&d->lock);
        colld_comm_state_t st = xc->c->state;
        colld_status_t err = xc->c->error;
        pthread_mutex_unlock(&d->lock);
        if (!xc->failed && (xc->stage == STAGE_IN || xc->stage == STAGE_OUT)) {
            xc->busy--;
            xcoll_pump(xc); /* the next slice of a local stage */
            continue;
        }
        if (!xc->failed && st != COLLD_COMM_READY)
            xcoll_fail(xc, err ? err : COLLD_ERR_ABORTED, "the communicator failed", false);
        check_deadlines(xc, now);
        xc->busy--;
        xcoll_maybe_end(xc);
    }
    free(due);
}

void colld_xcoll_abort_all(colld_daemon_t *d)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    while (cl->running) {
        xcoll_t *xc = cl->running;
        xc->failed = true;
        xc->status = COLLD_ERR_NODE_LOST;
        xc->inflight = 0;
        xc->active = true;
        xc->next = NULL; /* do not start the next one */
        xc->x->qhead = xc;
        xcoll_end(xc);
    }
}
