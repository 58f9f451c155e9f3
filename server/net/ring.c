/*
 * ring.c - the ring among the member daemons, in ring order (nodes ordered by their lowest rank):
 *
 *   reduce-scatter (XPHASE_RS): at step t node j sends block (j-t-1) mod k to j+1 and reduces the
 *       block (j-t-2) mod k it receives from j-1 into X (received partial first); after k-1 steps
 *       node j holds block j reduced over every node.
 *   all-gather (XPHASE_AG): at step t node j forwards block (j-t) mod k to j+1.
 *
 * All-reduce and reduce = RS + AG over k equal blocks (2(k-1)/k of the bytes per node, whatever
 * the number of local ranks); reduce-scatter = RS and all-gather = AG with each node's block made
 * of its ranks' slots; broadcast = AG of the root node's block alone (a pipelined chain). Blocks
 * travel in chunks of chunk_bytes, and each chunk is forwarded as soon as it is reduced, so the
 * reduction overlaps the network. A DATA message is taken only from the previous node, as exactly
 * one chunk of the block due at its step, once (colld_xring_valid).
 */
#include "server/net/xcoll.h"

#include "common/util.h"
#include "kernels/cpu/reduce.h"

#include <stdlib.h>
#include <string.h>

/* Bytes of the block b of the ring layout. */
static uint64_t block_bytes(const xcoll_t *xc, int b)
{
    uint64_t n = 0;
    for (int i = 0; i < xc->nranges; i++)
        if (xc->ranges[i].block == b)
            n += xc->ranges[i].len;
    return n;
}

/* The ring chunk [off, off+len) is: its index among the layout's chunks, -1 when it is not
 * exactly one chunk of a range as send_block cuts them (chunk_bytes from the range's start, the
 * last one shorter). *block gets its range's block. */
static int64_t chunk_of(const xcoll_t *xc, uint64_t off, uint64_t len, int *block)
{
    uint64_t chunk = xc->x->chunk_bytes;
    for (int i = 0; i < xc->nranges; i++) {
        const xrange_t *r = &xc->ranges[i];
        if (off < r->off || off - r->off >= r->len)
            continue;
        uint64_t in = off - r->off;
        if (in % chunk != 0 || len != COLLD_MIN(chunk, r->len - in))
            return -1;
        *block = r->block;
        return (int64_t)r->chunk0 + (int64_t)(in / chunk);
    }
    return -1;
}

/* Whether every chunk of block b arrived in phase ph (0: reduce-scatter, 1: all-gather). */
static bool block_received(const xcoll_t *xc, int ph, int b)
{
    uint64_t chunk = xc->x->chunk_bytes;
    for (int i = 0; i < xc->nranges; i++) {
        const xrange_t *r = &xc->ranges[i];
        if (r->block != b)
            continue;
        for (uint64_t c = 0; c * chunk < r->len; c++)
            if (!xc->got[(size_t)ph * xc->nchunks + r->chunk0 + c])
                return false;
    }
    return true;
}

/* Send every chunk of block b of X. */
static void send_block(xcoll_t *xc, int node, int phase, int step, int b)
{
    uint64_t chunk = xc->x->chunk_bytes;
    for (int i = 0; i < xc->nranges && !xc->failed; i++) {
        const xrange_t *r = &xc->ranges[i];
        if (r->block != b)
            continue;
        for (uint64_t o = 0; o < r->len; o += chunk)
            xc->send(xc, node, phase, step, r->off + o, COLLD_MIN(chunk, r->len - o), xc->X + r->off + o);
    }
}

/* Number the chunks of the ring layout and allocate their reception marks. Returns 0 or -1. */
static int number_chunks(xcoll_t *xc)
{
    uint64_t chunk = xc->x->chunk_bytes, total = 0;
    for (int i = 0; i < xc->nranges; i++) {
        xc->ranges[i].chunk0 = (uint32_t)total;
        total += (xc->ranges[i].len + chunk - 1) / chunk;
        if (total > UINT32_MAX / 2)
            return -1;
    }
    xc->nchunks = (uint32_t)total;
    xc->got = calloc(2 * (size_t)total + 1, 1);
    return xc->got ? 0 : -1;
}

/* The ring layout: which byte ranges of X make up each node's block. */
static int layout_ranges(xcoll_t *xc)
{
    colld_xcomm_t *x = xc->x;
    int k = x->nnodes, n = xc->c->nranks;
    uint64_t slot = xc->sig.count * xc->es;
    switch (xc->sig.kind) {
    case COLLD_KIND_ALLREDUCE:
    case COLLD_KIND_REDUCE: {
        xc->ranges = calloc((size_t)k, sizeof(*xc->ranges));
        if (!xc->ranges)
            return -1;
        uint64_t count = xc->sig.count;
        for (int b = 0; b < k; b++) {
            uint64_t first = count * (uint64_t)b / (uint64_t)k, last = count * (uint64_t)(b + 1) / (uint64_t)k;
            xc->ranges[b] = (xrange_t){ .off = first * xc->es, .len = (last - first) * xc->es, .block = b };
        }
        xc->nranges = k;
        return 0;
    }
    case COLLD_KIND_BROADCAST:
        xc->ranges = calloc(1, sizeof(*xc->ranges));
        if (!xc->ranges)
            return -1;
        xc->ranges[0] = (xrange_t){ .off = 0, .len = xc->xbytes, .block = x->rank_node[xc->sig.root] };
        xc->nranges = 1;
        return 0;
    default: /* all-gather, reduce-scatter: rank r's slot belongs to its node */
        xc->ranges = calloc((size_t)n, sizeof(*xc->ranges));
        if (!xc->ranges)
            return -1;
        for (int r = 0; r < n; r++)
            xc->ranges[r] = (xrange_t){ .off = (uint64_t)r * slot, .len = slot, .block = x->rank_node[r] };
        xc->nranges = n;
        return 0;
    }
}

int colld_xring_layout(xcoll_t *xc)
{
    return layout_ranges(xc) < 0 || number_chunks(xc) < 0 ? -1 : 0;
}

void colld_xring_start(xcoll_t *xc)
{
    int k = xc->x->nnodes, j = xc->x->self;
    uint64_t bytes = xc->xbytes;
    int next = xmod(j + 1, k);
    if (xkind_reduces(xc->sig.kind)) {
        xc->recv_left = bytes - block_bytes(xc, xmod(j - 1, k));
        if (xkind_has_ag(xc->sig.kind))
            xc->recv_left += bytes - block_bytes(xc, j);
        if (k == 1 && xc->op == COLLD_AVG && bytes)
            colld_cpu_avg_finish(xc->dt, xc->X, bytes / xc->es, xc->c->nranks);
        if (k > 1)
            send_block(xc, next, XPHASE_RS, 0, xmod(j - 1, k));
    } else {
        xc->recv_left = bytes - block_bytes(xc, j);
        if (k > 1)
            send_block(xc, next, XPHASE_AG, 0, j);
    }
}

bool colld_xring_valid(const xcoll_t *xc, int from, const colld_net_hdr_t *h, int64_t *chunk, colld_err_t *err)
{
    int k = xc->x->nnodes, j = xc->x->self;
    bool rs = h->phase == XPHASE_RS;
    bool phase_ok = !xc->rd && h->step < k - 1 && (rs ? xkind_reduces(xc->sig.kind) : xkind_has_ag(xc->sig.kind));
    if (!phase_ok) {
        (void)colld_err_set(err, COLLD_ERR_INTERNAL, "%s step %u is not a phase of this collective",
                            xphase_name(h->phase), h->step);
        return false;
    }
    if (from != xmod(j - 1, k)) {
        (void)colld_err_set(err, COLLD_ERR_INTERNAL,
                            "%s step %u came from node %d, not from the previous node of the ring (%d)",
                            xphase_name(h->phase), h->step, from, xmod(j - 1, k));
        return false;
    }
    int block = -1, want = rs ? xmod(j - h->step - 2, k) : xmod(j - h->step - 1, k);
    int64_t c = chunk_of(xc, h->offset, h->len, &block);
    if (c < 0 || block != want) {
        (void)colld_err_set(err, COLLD_ERR_INTERNAL,
                            "%s step %u: bytes %llu..%llu are not a chunk of block %d, the block due",
                            xphase_name(h->phase), h->step, (unsigned long long)h->offset,
                            (unsigned long long)(h->offset + h->len), want);
        return false;
    }
    if (xc->got[(size_t)(rs ? 0 : 1) * xc->nchunks + (size_t)c]) {
        (void)colld_err_set(err, COLLD_ERR_INTERNAL, "%s step %u: bytes %llu..%llu arrived twice",
                            xphase_name(h->phase), h->step, (unsigned long long)h->offset,
                            (unsigned long long)(h->offset + h->len));
        return false;
    }
    *chunk = c;
    return true;
}

void colld_xring_data(xcoll_t *xc, const colld_net_hdr_t *h, int64_t chunk, const void *payload)
{
    int k = xc->x->nnodes, j = xc->x->self;
    uint64_t off = h->offset, len = h->len;
    int next = xmod(j + 1, k);
    xc->got[(size_t)(h->phase == XPHASE_RS ? 0 : 1) * xc->nchunks + (size_t)chunk] = 1;
    if (h->phase == XPHASE_RS) {
        const void *in[2] = { payload, xc->X + off };
        void *out[1] = { xc->X + off };
        colld_cpu_reduce(xc->dt, xc->pop, in, 2, out, 1, len / xc->es);
        xc->recv_left -= len;
        if (h->step + 1 < k - 1) {
            xc->send(xc, next, XPHASE_RS, h->step + 1, off, len, xc->X + off);
        } else { /* this node's own block is complete here */
            if (xc->op == COLLD_AVG)
                colld_cpu_avg_finish(xc->dt, xc->X + off, len / xc->es, xc->c->nranks);
            if (xkind_has_ag(xc->sig.kind))
                xc->send(xc, next, XPHASE_AG, 0, off, len, xc->X + off);
        }
        return;
    }
    memcpy(xc->X + off, payload, len);
    xc->recv_left -= len;
    if (h->step + 1 < k - 1)
        xc->send(xc, next, XPHASE_AG, h->step + 1, off, len, xc->X + off);
}

void colld_xring_waiting(const xcoll_t *xc, unsigned *phase, int *step, int *from)
{
    int k = xc->x->nnodes, j = xc->x->self;
    *phase = 0;
    *step = 0;
    *from = -1;
    for (int t = 0; t < k - 1 && *from < 0; t++) {
        if (xkind_reduces(xc->sig.kind) && !block_received(xc, 0, xmod(j - t - 2, k))) {
            *phase = XPHASE_RS;
            *step = t;
            *from = xmod(j - 1, k);
        }
    }
    for (int t = 0; t < k - 1 && *from < 0 && xkind_has_ag(xc->sig.kind); t++) {
        if (!block_received(xc, 1, xmod(j - t - 1, k))) {
            *phase = XPHASE_AG;
            *step = t;
            *from = xmod(j - 1, k);
        }
    }
}
