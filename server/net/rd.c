/*
 * rd.c - recursive doubling among the member daemons: the algorithm of small all-reduces and
 * reduces (up to --net-small-bytes, or by policy). With p the largest power of two <= k nodes:
 * a node j >= p hands its whole buffer to node j - p first (phase XPHASE_RD_PRE) and gets the
 * result back at the end (XPHASE_RD_POST); the nodes below p exchange the whole buffer with
 * partner j ^ 2^s at each of log2(p) steps (XPHASE_RD), combining the lower node's partial first,
 * so every node gets bitwise the same result. Each exchange is one message of the whole buffer,
 * and a message is taken only from the node due, once (colld_xrd_valid).
 */
#include "server/net/xcoll.h"

#include "common/util.h"
#include "kernels/cpu/reduce.h"

#include <stdlib.h>
#include <string.h>

/* The receive areas: 0 the hand-in, 1 + s step s. */
static uint8_t *rd_recv_area(xcoll_t *xc, int idx)
{
    return xc->rd_buf + (uint64_t)idx * xc->xbytes;
}

/* The copy of X this node sends at step s (X changes while the copy is still being sent). */
static uint8_t *rd_send_area(xcoll_t *xc, int s)
{
    return xc->rd_buf + (uint64_t)(1 + xc->rd_nsteps + s) * xc->xbytes;
}

/* X = combine of two partials, the lower node's first. */
static void rd_combine(xcoll_t *xc, const uint8_t *lower, const uint8_t *upper)
{
    const void *in[2] = { lower, upper };
    void *out[1] = { xc->X };
    if (xc->xbytes == 0)
        return;
    colld_cpu_reduce(xc->dt, xc->pop, in, 2, out, 1, xc->xbytes / xc->es);
}

/* Advance as far as the received data allows. */
static void rd_advance(xcoll_t *xc)
{
    int j = xc->x->self, k = xc->x->nnodes, p = xc->rd_p;
    if (xc->failed || xc->rd_finished || j >= p)
        return; /* a node beyond p waits for its result (recv_left) */
    if (xc->rd_pre_wait) {
        if (xc->rd_left[0] > 0)
            return;
        rd_combine(xc, xc->X, rd_recv_area(xc, 0)); /* node j before node j + p */
        xc->rd_pre_wait = false;
    }
    while (xc->rd_step < xc->rd_nsteps && !xc->failed) {
        int s = xc->rd_step, partner = j ^ (1 << s);
        if (!xc->rd_sent[s]) { /* a copy: X changes while the copy is still being sent */
            xc->rd_sent[s] = true;
            if (xc->xbytes) {
                memcpy(rd_send_area(xc, s), xc->X, xc->xbytes);
                xc->send(xc, partner, XPHASE_RD, s, 0, xc->xbytes, rd_send_area(xc, s));
            }
        }
        if (xc->rd_left[1 + s] > 0)
            return;
        if (j < partner)
            rd_combine(xc, xc->X, rd_recv_area(xc, 1 + s));
        else
            rd_combine(xc, rd_recv_area(xc, 1 + s), xc->X);
        xc->rd_step++;
    }
    if (xc->failed)
        return;
    if (xc->op == COLLD_AVG)
        colld_cpu_avg_finish(xc->dt, xc->X, xc->xbytes / xc->es, xc->c->nranks);
    if (j < k - p && xc->xbytes)
        xc->send(xc, j + p, XPHASE_RD_POST, 0, 0, xc->xbytes, xc->X);
    xc->rd_finished = true;
}

uint64_t colld_xrd_buf_bytes(const xcoll_t *xc)
{
    int k = xc->x->nnodes, p = 1, nsteps = 0;
    while (p * 2 <= k)
        p *= 2;
    while ((1 << nsteps) < p)
        nsteps++;
    return (uint64_t)(2 * nsteps + 1) * xc->xbytes;
}

void colld_xrd_start(xcoll_t *xc)
{
    int k = xc->x->nnodes, j = xc->x->self;
    uint64_t bytes = xc->xbytes;
    int p = 1;
    while (p * 2 <= k)
        p *= 2;
    xc->rd_p = p;
    while ((1 << xc->rd_nsteps) < p)
        xc->rd_nsteps++;
    xc->rd_buf = malloc((size_t)(2 * xc->rd_nsteps + 1) * bytes + 1);
    xc->rd_left = malloc((size_t)(1 + xc->rd_nsteps) * sizeof(uint64_t));
    xc->rd_sent = calloc((size_t)xc->rd_nsteps + 1, sizeof(bool));
    if (!xc->rd_buf || !xc->rd_left || !xc->rd_sent) {
        xc->fail(xc, COLLD_ERR_NO_MEMORY, "daemon out of memory", true);
        return;
    }
    xc->rd_left[0] = j < k - p ? bytes : 0;
    for (int s = 0; s < xc->rd_nsteps; s++)
        xc->rd_left[1 + s] = j < p ? bytes : 0;
    xc->rd_pre_wait = j < k - p;
    if (j >= p) { /* beyond the power of two: hand the data in, wait for the result */
        xc->recv_left = bytes;
        xc->rd_finished = true;
        if (bytes)
            xc->send(xc, j - p, XPHASE_RD_PRE, 0, 0, bytes, xc->X);
    } else {
        xc->recv_left = xc->rd_left[0] + (uint64_t)xc->rd_nsteps * bytes;
        rd_advance(xc);
    }
}

/* A recursive doubling message: the whole buffer, once, from the node due. */
static bool rd_check(const xcoll_t *xc, const colld_net_hdr_t *h, bool phase_ok, int from, int want, uint64_t left,
                     colld_err_t *err)
{
    if (!phase_ok) {
        (void)colld_err_set(err, COLLD_ERR_INTERNAL, "%s step %u is not a phase of this collective on this node",
                            xphase_name(h->phase), h->step);
        return false;
    }
    if (from != want) {
        (void)colld_err_set(err, COLLD_ERR_INTERNAL, "%s step %u came from the wrong node (node %d, not node %d)",
                            xphase_name(h->phase), h->step, from, want);
        return false;
    }
    if (h->offset != 0 || h->len != xc->xbytes || left != xc->xbytes) {
        (void)colld_err_set(err, COLLD_ERR_INTERNAL,
                            "%s step %u: bytes %llu..%llu, where the whole %llu-byte buffer is due once",
                            xphase_name(h->phase), h->step, (unsigned long long)h->offset,
                            (unsigned long long)(h->offset + h->len), (unsigned long long)xc->xbytes);
        return false;
    }
    return true;
}

bool colld_xrd_valid(const xcoll_t *xc, int from, const colld_net_hdr_t *h, colld_err_t *err)
{
    int k = xc->x->nnodes, j = xc->x->self, p = xc->rd_p;
    switch (h->phase) {
    case XPHASE_RD_PRE:
        return rd_check(xc, h, xc->rd && j < k - p && h->step == 0, from, j + p, xc->rd ? xc->rd_left[0] : 0, err);
    case XPHASE_RD:
        return rd_check(xc, h, xc->rd && j < p && h->step < xc->rd_nsteps, from,
                        xc->rd && h->step < xc->rd_nsteps ? j ^ (1 << h->step) : -1,
                        xc->rd && h->step < xc->rd_nsteps ? xc->rd_left[1 + h->step] : 0, err);
    default: /* XPHASE_RD_POST */
        return rd_check(xc, h, xc->rd && j >= p && h->step == 0, from, j - p, xc->recv_left, err);
    }
}

void colld_xrd_data(xcoll_t *xc, const colld_net_hdr_t *h, const void *payload)
{
    uint64_t off = h->offset, len = h->len;
    switch (h->phase) {
    case XPHASE_RD_PRE:
        memcpy(rd_recv_area(xc, 0) + off, payload, len);
        xc->rd_left[0] -= len;
        xc->recv_left -= len;
        rd_advance(xc);
        break;
    case XPHASE_RD: /* may come before this node's own send of the step */
        memcpy(rd_recv_area(xc, 1 + h->step) + off, payload, len);
        xc->rd_left[1 + h->step] -= len;
        xc->recv_left -= len;
        rd_advance(xc);
        break;
    default: /* XPHASE_RD_POST */
        memcpy(xc->X + off, payload, len);
        xc->recv_left -= len;
        break;
    }
}

void colld_xrd_waiting(const xcoll_t *xc, unsigned *phase, int *step, int *from)
{
    int k = xc->x->nnodes, j = xc->x->self, p = xc->rd_p;
    *phase = 0;
    *step = 0;
    *from = -1;
    if (j < k - p && xc->rd_left[0] > 0) {
        *phase = XPHASE_RD_PRE;
        *from = j + p;
    } else if (j >= p) {
        *phase = XPHASE_RD_POST;
        *from = j - p;
    } else if (xc->rd_step < xc->rd_nsteps) {
        *phase = XPHASE_RD;
        *step = xc->rd_step;
        *from = j ^ (1 << *step);
    }
}

void colld_xrd_free(xcoll_t *xc)
{
    free(xc->rd_buf);
    free(xc->rd_left);
    free(xc->rd_sent);
    xc->rd_buf = NULL;
    xc->rd_left = NULL;
    xc->rd_sent = NULL;
}
