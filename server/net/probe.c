/*
 * probe.c - collctl probe: measure every link of this daemon on demand (issue 18 item 1).
 *
 * The prober (this daemon, asked by an admin through the Probe RPC) takes its peers that are up
 * one after the other. For each it sends ProbeReq{id, bytes}; the peer answers ProbeAck{id} at
 * once (that round trip is the probe's RTT) and sends `bytes` of probe DATA back (frames of
 * PROBE_FRAME bytes, phase XPHASE_PROBE, seq = id, from a static buffer of zeros: zero copy, no
 * allocation per byte). Once they are all in, the prober sends its own `bytes` to the peer: one
 * direction after the other, because a direction's ACKs travel on the other one and would queue
 * behind its data on a congested link (measured: a 25 MB/s link read 3.6 MB/s when its reverse,
 * a 1 MB/s link, was probed at the same time). Each side
 * times what it receives from the arrival of the first frame to the arrival of the last (the first
 * frame's bytes are not counted: its start is not seen), and the peer reports its timing back in
 * ProbeResult{id, bytes, ns}. A peer is done when the ack, the result and all of its bytes are in,
 * or after PROBE_PEER_MS (a slow link then shows what arrived, with the reason). The answer goes
 * to the caller's done callback (the control plane replies to the RPC from it).
 *
 * Serving peers' probes: the DATA of a probe is accepted only from a peer whose ProbeReq this
 * daemon took, for that id and within its byte count; at most PROBE_SERVE_MAX probes are served at
 * once and a peer may start at most one per PROBE_MIN_GAP_MS; anything else is refused and counted
 * like any bad peer message (colld_cluster_log_bad). A probe moves at most PROBE_MAX_BYTES each
 * way. The prober's side runs one probe at a time (a second Probe RPC is refused).
 *
 * Threads: the network thread runs all of it; colld_cluster_probe and colld_cluster_probe_abandon
 * come from the control plane's thread and meet the network thread under cl->probe_lock (the owed
 * answer) and the inbox (the start).
 */
#include "server/net/cluster.h"

#include "colld_net.pb-c.h"
#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

#define PROBE_FRAME (64u << 10)
#define PROBE_PEER_MS 15000      /* one peer's probe ends after this, measured or not */
#define PROBE_SERVE_TTL_MS 60000 /* a served probe that never completes is forgotten after this */

static const uint8_t probe_zeros[PROBE_FRAME]; /* the payload of every probe frame */

/* ============================================================================================
 * Messages
 * ========================================================================================== */

/* Queue a probe message to p (net thread). */
static void probe_send_ctrl(colld_net_peer_t *p, const Colld__Net__V1__Msg *m)
{
    uint8_t buf[64];
    size_t len = colld__net__v1__msg__get_packed_size(m);
    if (len > sizeof(buf))
        return;
    colld__net__v1__msg__pack(m, buf);
    colld_net_send_ctrl(p, buf, len);
}

/* Queue `bytes` of probe DATA of probe id to p, striped over its connections. */
static void probe_send_data(colld_net_peer_t *p, uint64_t id, uint64_t bytes)
{
    unsigned frame = 0;
    for (uint64_t off = 0; off < bytes; off += PROBE_FRAME, frame++) {
        colld_net_hdr_t h = {
            .phase = XPHASE_PROBE,
            .len = (uint32_t)COLLD_MIN(PROBE_FRAME, bytes - off),
            .seq = id,
            .offset = off,
        };
        if (colld_net_send_data(p, &h, probe_zeros, frame, NULL, NULL) < 0)
            return;
    }
}

/* ============================================================================================
 * Receiving a probe's data (both roles)
 * ========================================================================================== */

/* Count one probe frame into a timing: the first frame marks the start and is not counted. */
static void rx_count(cprobe_rx_t *rx, uint32_t len)
{
    uint64_t now = colld_now_ns();
    if (rx->got == 0) {
        rx->t_first = now;
        rx->first_len = len;
    }
    rx->got += len;
    rx->t_last = now;
}

/* ============================================================================================
 * The prober
 * ========================================================================================== */

/* Hand the answer to whoever is owed it (lock: cl->probe_lock), and forget the run. */
static void probe_finish(colld_cluster_t *cl)
{
    cprobe_t *pr = &cl->probe;
    pthread_mutex_lock(&cl->probe_lock);
    if (cl->probe_done)
        cl->probe_done(cl->probe_arg, pr->links, pr->n);
    cl->probe_done = NULL;
    cl->probe_arg = NULL;
    pthread_mutex_unlock(&cl->probe_lock);
    free(pr->links);
    memset(pr, 0, sizeof(*pr));
}

/* Start on peer pr->cur, or record why it cannot be probed. */
static void probe_peer_start(colld_cluster_t *cl)
{
    cprobe_t *pr = &cl->probe;
    colld_probe_link_t *l = &pr->links[pr->cur];
    colld_net_peer_t *p = colld_net_peer_find(cl->net, l->addr);
    pr->id = ((uint64_t)colld_now_ns() << 8) | (pr->cur & 0xff); /* unique per peer and run */
    memset(&pr->rx, 0, sizeof(pr->rx));
    pr->acked = pr->result = false;
    pr->started = true;
    if (!p || !colld_net_peer_is_up(p)) {
        colld_strlcpy(l->error, "the peer is not up", sizeof(l->error));
        pr->cur++;
        pr->started = false;
        return;
    }
    Colld__Net__V1__ProbeReq req = COLLD__NET__V1__PROBE_REQ__INIT;
    req.id = pr->id;
    req.bytes = pr->bytes;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_PROBE_REQ;
    m.probe_req = &req;
    pr->t_req = colld_now_ns();
    pr->deadline = pr->t_req + PROBE_PEER_MS * 1000000ull;
    probe_send_ctrl(p, &m);
}

/* The current peer's probe is over (complete or timed out): keep its numbers, go on. */
static void probe_peer_end(colld_cluster_t *cl, bool timed_out)
{
    cprobe_t *pr = &cl->probe;
    colld_probe_link_t *l = &pr->links[pr->cur];
    if (pr->rx.got > pr->rx.first_len) {
        l->rx_bytes = pr->rx.got - pr->rx.first_len;
        l->rx_ns = pr->rx.t_last - pr->rx.t_first;
    }
    if (timed_out)
        snprintf(l->error, sizeof(l->error), "not complete after %d s (%s; received %llu of %llu bytes from it)",
                 PROBE_PEER_MS / 1000,
                 !pr->acked    ? "no answer to the probe request"
                 : !pr->result ? "no timing from the peer"
                               : "",
                 (unsigned long long)pr->rx.got, (unsigned long long)pr->bytes);
    pr->cur++;
    pr->started = false;
}

/* Drive the probe (network thread, every tick): start the next peer, end a timed-out one, answer
 * when every peer is done. */
void colld_probe_tick(colld_daemon_t *d)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    cprobe_t *pr = &cl->probe;
    while (pr->active) {
        if (pr->cur == pr->n) {
            probe_finish(cl);
            return;
        }
        if (!pr->started) {
            probe_peer_start(cl);
            continue;
        }
        bool complete = pr->acked && pr->result && pr->rx.got >= pr->bytes;
        if (!complete && colld_now_ns() < pr->deadline)
            return;
        probe_peer_end(cl, !complete);
    }
}

/* A probe job from the inbox: the peers that are up now, one after the other. */
void colld_probe_begin(colld_daemon_t *d, uint64_t bytes)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    cprobe_t *pr = &cl->probe;
    size_t max = colld_net_peers(cl->net, NULL, 0); /* the count; only this thread adds peers */
    colld_net_peer_info_t *info = calloc(max + 1, sizeof(*info));
    size_t n = info ? COLLD_MIN(colld_net_peers(cl->net, info, max), max) : 0;
    memset(pr, 0, sizeof(*pr));
    pr->links = calloc(n + 1, sizeof(*pr->links));
    pr->active = true;
    pr->bytes = bytes;
    for (size_t i = 0; pr->links && i < n; i++) {
        if (strcmp(info[i].state, "up") != 0)
            continue;
        colld_probe_link_t *l = &pr->links[pr->n++];
        colld_strlcpy(l->name, info[i].name, sizeof(l->name));
        colld_strlcpy(l->addr, info[i].addr, sizeof(l->addr));
    }
    free(info);
    colld_probe_tick(d);
}

/* ============================================================================================
 * Serving a peer's probe
 * ========================================================================================== */

/* The served probe of peer addr, NULL if none (net thread). */
static cprobe_serve_t *serve_find(colld_cluster_t *cl, const char *addr)
{
    for (int i = 0; i < COLLD_PROBE_SERVE_MAX; i++)
        if (cl->serve[i].used && strcmp(cl->serve[i].addr, addr) == 0)
            return &cl->serve[i];
    return NULL;
}

/* ProbeReq from p: take it (one slot per peer, one start per PROBE_MIN_GAP_MS), acknowledge it
 * and send the bytes back. */
static void serve_req(colld_cluster_t *cl, colld_net_peer_t *p, const Colld__Net__V1__ProbeReq *req)
{
    const char *addr = colld_net_peer_addr(p);
    uint64_t now_ms = colld_now_ms();
    if (req->id == 0 || req->bytes < COLLD_PROBE_MIN_BYTES || req->bytes > COLLD_PROBE_MAX_BYTES) {
        colld_cluster_log_bad(cl, "probe request from %s for %llu bytes (%u..%u are served)", addr,
                              (unsigned long long)req->bytes, COLLD_PROBE_MIN_BYTES, COLLD_PROBE_MAX_BYTES);
        return;
    }
    cprobe_serve_t *s = serve_find(cl, addr);
    if (s && now_ms < s->start_ms + COLLD_PROBE_MIN_GAP_MS) {
        colld_cluster_log_bad(cl, "probe request from %s less than %d ms after its last one", addr,
                              COLLD_PROBE_MIN_GAP_MS);
        return;
    }
    for (int i = 0; !s && i < COLLD_PROBE_SERVE_MAX; i++) /* a free slot, or one long forgotten */
        if (!cl->serve[i].used || now_ms >= cl->serve[i].start_ms + PROBE_SERVE_TTL_MS)
            s = &cl->serve[i];
    if (!s) {
        colld_cluster_log_bad(cl, "probe request from %s refused: %d probes are being served", addr,
                              COLLD_PROBE_SERVE_MAX);
        return;
    }
    memset(s, 0, sizeof(*s));
    s->used = true;
    colld_strlcpy(s->addr, addr, sizeof(s->addr));
    s->id = req->id;
    s->bytes = req->bytes;
    s->start_ms = now_ms;
    Colld__Net__V1__ProbeAck ack = COLLD__NET__V1__PROBE_ACK__INIT;
    ack.id = req->id;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_PROBE_ACK;
    m.probe_ack = &ack;
    probe_send_ctrl(p, &m);
    probe_send_data(p, req->id, req->bytes);
}

/* A probe message from peer p (net thread; p NULL: this daemon's own, never a probe). */
void colld_probe_ctrl(colld_daemon_t *d, colld_net_peer_t *p, const Colld__Net__V1__Msg *m)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    cprobe_t *pr = &cl->probe;
    if (!p)
        return;
    bool current = pr->active && pr->started && strcmp(pr->links[pr->cur].addr, colld_net_peer_addr(p)) == 0;
    switch (m->m_case) {
    case COLLD__NET__V1__MSG__M_PROBE_REQ:
        serve_req(cl, p, m->probe_req);
        break;
    case COLLD__NET__V1__MSG__M_PROBE_ACK:
        if (!current || m->probe_ack->id != pr->id || pr->acked) {
            colld_cluster_log_bad(cl, "probe answer from %s for no probe of it", colld_net_peer_addr(p));
            break;
        }
        pr->acked = true;
        pr->links[pr->cur].rtt_ns = colld_now_ns() - pr->t_req;
        break;
    case COLLD__NET__V1__MSG__M_PROBE_RESULT: {
        const Colld__Net__V1__ProbeResult *r = m->probe_result;
        if (!current || r->id != pr->id || pr->result || r->bytes > pr->bytes || r->ns == 0 ||
            r->ns > PROBE_PEER_MS * 1000000ull || (double)r->bytes * 1e9 / (double)r->ns > TCP_RATE_MAX) {
            colld_cluster_log_bad(cl, "probe timing from %s for no probe of it, or out of range",
                                  colld_net_peer_addr(p));
            break;
        }
        pr->result = true;
        pr->links[pr->cur].tx_bytes = r->bytes;
        pr->links[pr->cur].tx_ns = r->ns;
        break;
    }
    default:
        break;
    }
    colld_probe_tick(d);
}

/* Probe DATA from peer p: for the probe this daemon runs (the peer's answer) or for one it serves
 * (the prober's bytes); anything else is refused. */
void colld_probe_data(colld_daemon_t *d, colld_net_peer_t *p, const colld_net_hdr_t *h)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    cprobe_t *pr = &cl->probe;
    const char *addr = colld_net_peer_addr(p);
    if (pr->active && pr->started && strcmp(pr->links[pr->cur].addr, addr) == 0 && h->seq == pr->id) {
        if (h->offset >= pr->bytes || h->len > pr->bytes - h->offset || pr->rx.got + h->len > pr->bytes) {
            colld_cluster_log_bad(cl, "probe data from %s beyond the probe's %llu bytes", addr,
                                  (unsigned long long)pr->bytes);
            return;
        }
        rx_count(&pr->rx, h->len);
        if (pr->rx.got == pr->bytes) /* the other direction now, so that neither's ACKs queue behind data */
            probe_send_data(p, pr->id, pr->bytes);
        colld_probe_tick(d);
        return;
    }
    cprobe_serve_t *s = serve_find(cl, addr);
    if (!s || s->id != h->seq || s->done || h->offset >= s->bytes || h->len > s->bytes - h->offset ||
        s->rx.got + h->len > s->bytes) {
        colld_cluster_log_bad(cl, "probe data from %s for no probe it asked for", addr);
        return;
    }
    rx_count(&s->rx, h->len);
    if (s->rx.got < s->bytes)
        return;
    s->done = true; /* the slot stays, for the gap between one peer's probes */
    Colld__Net__V1__ProbeResult r = COLLD__NET__V1__PROBE_RESULT__INIT;
    r.id = s->id;
    r.bytes = s->rx.got - s->rx.first_len;
    r.ns = COLLD_MAX(1, s->rx.t_last - s->rx.t_first);
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_PROBE_RESULT;
    m.probe_result = &r;
    probe_send_ctrl(p, &m);
}

/* ============================================================================================
 * From the control plane (any thread)
 * ========================================================================================== */

/* Start a probe (see net.h). */
int colld_cluster_probe(colld_daemon_t *d, uint64_t bytes, colld_probe_done_fn done, void *arg, char *err,
                        size_t err_len)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    if (!cl) {
        colld_set_err(err, err_len, "this daemon has no peers (it was started without --listen)");
        return -1;
    }
    if (bytes < COLLD_PROBE_MIN_BYTES || bytes > COLLD_PROBE_MAX_BYTES) {
        colld_set_err(err, err_len, "a probe moves %u to %u bytes each way, not %llu", COLLD_PROBE_MIN_BYTES,
                      COLLD_PROBE_MAX_BYTES, (unsigned long long)bytes);
        return -1;
    }
    cjob_t *j = calloc(1, sizeof(*j));
    if (!j) {
        colld_set_err(err, err_len, "daemon out of memory");
        return -1;
    }
    pthread_mutex_lock(&cl->probe_lock);
    bool busy = cl->probe_done != NULL;
    if (!busy) {
        cl->probe_done = done;
        cl->probe_arg = arg;
    }
    pthread_mutex_unlock(&cl->probe_lock);
    if (busy) {
        free(j);
        colld_set_err(err, err_len, "a probe is running already: one at a time (try again when it has answered)");
        return -1;
    }
    j->probe_bytes = bytes;
    pthread_mutex_lock(&d->lock);
    colld_cluster_inbox_push(d, j);
    pthread_mutex_unlock(&d->lock);
    return 0;
}

/* The control plane stops: answer an owed probe now (see net.h). */
void colld_cluster_probe_abandon(colld_daemon_t *d)
{
    colld_cluster_t *cl = colld_cluster_of(d);
    if (!cl)
        return;
    pthread_mutex_lock(&cl->probe_lock);
    if (cl->probe_done)
        cl->probe_done(cl->probe_arg, NULL, 0);
    cl->probe_done = NULL;
    cl->probe_arg = NULL;
    pthread_mutex_unlock(&cl->probe_lock);
}
