/*
 * iblink.c - --net-transport: whether a peer link's collective data goes over InfiniBand/RoCE
 * verbs (transport/ib) or stays on TCP, negotiated over the link's HMAC-authenticated CTRL
 * channel (never over unauthenticated rdma_cm private data).
 *
 * When a peer comes up, each side sends IbHello: either its offer (a queue pair in INIT with its
 * receives posted, its GID, QP number, PSN and the rkey of a receive ring that serves this link
 * only) or active = false with the reason (no RDMA device, --net-transport tcp, the link bound).
 * A side that has made an offer and receives the peer's connects its QP (RTR, RTS) and answers
 * IbReady{ok}; once it has both connected and heard the peer's IbReady{ok}, the link's DATA goes
 * over the QP (colld_net_peer_set_path). Anything else leaves the DATA on TCP and says why in
 * collctl status (PeerInfo.transport_note): the peer has no IB, its offer is invalid (refused and
 * counted as a bad peer message), a verbs call failed, no answer within IBLINK_ANSWER_MS.
 * With --net-transport ib the same cases lose the peer instead, with that reason, so that every
 * communicator over the link fails naming it. A link that fails once it carries DATA (a completion
 * error, a protocol error) loses the peer in either mode: its communicators fail with
 * COLLD_ERR_NODE_LOST naming the IB error, and the next connection negotiates again.
 */
#include "server/net/cluster.h"

#include "colld_net.pb-c.h"
#include "common/log.h"
#include "common/util.h"
#include "transport/ib/ib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define IBLINK_ANSWER_MS 5000

/* A link negotiating with one peer (or carrying its DATA: then `link` belongs to the transport's
 * path and this record only maps the path's callbacks to the peer). */
typedef struct ciblink {
    struct ciblink *next;
    colld_cluster_t *cl;
    colld_net_peer_t *peer;
    colld_ib_link_t *link; /* NULL once handed to the path or closed */
    bool connected, peer_ready, active;
    uint64_t deadline_ms;
} ciblink_t;

static void send_msg(colld_net_peer_t *p, const Colld__Net__V1__Msg *m)
{
    size_t len = colld__net__v1__msg__get_packed_size(m);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return;
    colld__net__v1__msg__pack(m, buf);
    colld_net_send_ctrl(p, buf, len);
    free(buf);
}

static void send_hello_none(colld_cluster_t *cl, colld_net_peer_t *p, const char *reason)
{
    Colld__Net__V1__IbHello h = COLLD__NET__V1__IB_HELLO__INIT;
    h.reason = (char *)reason;
    h.required = cl->d->cfg.net_transport == COLLD_NET_TRANSPORT_IB;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_IB_HELLO;
    m.ib_hello = &h;
    send_msg(p, &m);
}

static void send_ready(colld_net_peer_t *p, bool ok, const char *reason)
{
    Colld__Net__V1__IbReady r = COLLD__NET__V1__IB_READY__INIT;
    r.ok = ok;
    r.reason = (char *)reason;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_IB_READY;
    m.ib_ready = &r;
    send_msg(p, &m);
}

static ciblink_t *find(colld_cluster_t *cl, const colld_net_peer_t *p)
{
    for (ciblink_t *b = cl->ib_pending; b; b = b->next)
        if (b->peer == p)
            return b;
    return NULL;
}

static void forget(colld_cluster_t *cl, ciblink_t *b)
{
    for (ciblink_t **pp = &cl->ib_pending; *pp; pp = &(*pp)->next)
        if (*pp == b) {
            *pp = b->next;
            break;
        }
    colld_ib_link_close(b->link, true);
    free(b);
}

/* The link's DATA stays on TCP because of `why` (auto), or the peer is lost for it (ib). */
static void fall_back(colld_cluster_t *cl, colld_net_peer_t *p, const char *why)
{
    char note[160];
    ciblink_t *b = find(cl, p);
    if (b && !b->active)
        forget(cl, b);
    if (cl->d->cfg.net_transport == COLLD_NET_TRANSPORT_IB) {
        char text[256];
        snprintf(text, sizeof(text), "--net-transport ib: no IB link to %s: %s", colld_net_peer_addr(p), why);
        LOG_WARN_RL(NET, "%s", text);
        colld_net_peer_set_note(p, why);
        colld_net_peer_drop(p, text);
        return;
    }
    snprintf(note, sizeof(note), "%s", why);
    colld_net_peer_set_note(p, note);
    LOG_INFO_RL(NET, "peer %s: collective data over TCP: %s", colld_net_peer_addr(p), why);
}

/* ============================================================================================
 * The path (transport/tcp's colld_net_path_ops_t over a ciblink_t)
 * ========================================================================================== */

static int path_fd(void *arg)
{
    return colld_ib_link_fd(((ciblink_t *)arg)->link);
}

static void path_event(void *arg)
{
    colld_ib_link_event(((ciblink_t *)arg)->link);
}

static int path_send(void *arg, const colld_net_hdr_t *h, const void *payload, void (*done)(void *, bool), void *cookie)
{
    return colld_ib_link_send(((ciblink_t *)arg)->link, h, payload, done, cookie);
}

static void path_close(void *arg, bool notify)
{
    ciblink_t *b = arg;
    colld_ib_link_close(b->link, notify);
    free(b);
}

static const colld_net_path_ops_t ib_path = {
    .name = "ib", .fd = path_fd, .event = path_event, .send = path_send, .close = path_close
};

static void link_deliver(void *arg, const colld_net_hdr_t *h, void *payload)
{
    colld_net_deliver(((ciblink_t *)arg)->peer, h, payload);
}

static void link_failed(void *arg, const char *why)
{
    ciblink_t *b = arg;
    char text[256];
    snprintf(text, sizeof(text), "IB link to %s failed: %s", colld_net_peer_addr(b->peer), why);
    colld_net_peer_drop(b->peer, text);
}

/* Both sides connected: DATA goes over the QP. */
static void activate(colld_cluster_t *cl, ciblink_t *b)
{
    char err[192];
    for (ciblink_t **pp = &cl->ib_pending; *pp; pp = &(*pp)->next)
        if (*pp == b) {
            *pp = b->next;
            break;
        }
    b->next = NULL;
    b->active = true;
    if (colld_net_peer_set_path(b->peer, &ib_path, b, err, sizeof(err)) < 0) {
        colld_net_peer_t *p = b->peer;
        colld_ib_link_close(b->link, true);
        free(b);
        fall_back(cl, p, err);
        return;
    }
    LOG_INFO_RL(NET, "peer %s: collective data over IB (%s)", colld_net_peer_addr(b->peer), cl->ib_name);
}

/* ============================================================================================
 * Negotiation
 * ========================================================================================== */

int colld_iblink_start(colld_cluster_t *cl)
{
    const colld_daemon_t *d = cl->d;
    if (d->cfg.net_transport == COLLD_NET_TRANSPORT_TCP) {
        colld_strlcpy(cl->ib_none, "--net-transport tcp", sizeof(cl->ib_none));
        return 0;
    }
    if (colld_ib_open(d->cfg.ib_device, 0, &cl->ib, cl->ib_none, sizeof(cl->ib_none)) < 0) {
        if (d->cfg.net_transport == COLLD_NET_TRANSPORT_IB) {
            LOG_ERROR(NET, "--net-transport ib: %s", cl->ib_none);
            return -1;
        }
        LOG_INFO(NET, "no InfiniBand/RoCE (%s): peer links use TCP", cl->ib_none);
        return 0;
    }
    colld_strlcpy(cl->ib_name, colld_ib_name(cl->ib), sizeof(cl->ib_name));
    LOG_INFO(NET, "RDMA device %s: peer links use it where the peer offers IB too", cl->ib_name);
    return 0;
}

void colld_iblink_stop(colld_cluster_t *cl)
{
    while (cl->ib_pending)
        forget(cl, cl->ib_pending);
    colld_ib_close(cl->ib);
    cl->ib = NULL;
}

void colld_iblink_peer_up(colld_cluster_t *cl, colld_net_peer_t *p)
{
    char err[192];
    ciblink_t *old = find(cl, p);
    if (old)
        forget(cl, old);
    if (!cl->ib) {
        send_hello_none(cl, p, cl->ib_none);
        colld_net_peer_set_note(p, cl->ib_none);
        return;
    }
    ciblink_t *b = calloc(1, sizeof(*b));
    colld_ib_endpoint_t e;
    colld_ib_link_callbacks_t cb = { .deliver = link_deliver, .failed = link_failed, .arg = b };
    if (!b || colld_ib_link_new(cl->ib, COLLD_NET_MAX_CHUNK, &cb, &b->link, &e, err, sizeof(err)) < 0) {
        if (!b)
            colld_strlcpy(err, "out of memory", sizeof(err));
        free(b);
        send_hello_none(cl, p, err);
        fall_back(cl, p, err);
        return;
    }
    b->cl = cl;
    b->peer = p;
    b->deadline_ms = colld_now_ms() + IBLINK_ANSWER_MS;
    b->next = cl->ib_pending;
    cl->ib_pending = b;
    Colld__Net__V1__IbHello h = COLLD__NET__V1__IB_HELLO__INIT;
    h.active = true;
    h.required = cl->d->cfg.net_transport == COLLD_NET_TRANSPORT_IB;
    h.device = cl->ib_name;
    h.gid = (ProtobufCBinaryData){ .len = 16, .data = e.gid };
    h.qpn = e.qpn;
    h.psn = e.psn;
    h.lid = e.lid;
    h.mtu = e.mtu;
    h.ring_addr = e.ring_addr;
    h.ring_rkey = e.ring_rkey;
    h.slots = e.slots;
    h.slot_payload = e.slot_payload;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_IB_HELLO;
    m.ib_hello = &h;
    send_msg(p, &m);
}

void colld_iblink_peer_lost(colld_cluster_t *cl, colld_net_peer_t *p)
{
    ciblink_t *b = find(cl, p);
    if (b)
        forget(cl, b);
}

/* A printable, bounded copy of a peer's reason. */
static void peer_text(char *out, size_t len, const char *in)
{
    colld_str_sanitize(out, len, in ? in : "", 120);
}

static void on_hello(colld_cluster_t *cl, colld_net_peer_t *p, const Colld__Net__V1__IbHello *h)
{
    char why[256], text[160];
    ciblink_t *b = find(cl, p);
    if (!h->active) {
        peer_text(text, sizeof(text), h->reason);
        snprintf(why, sizeof(why), "the peer has no IB: %s", text);
        if (b || cl->d->cfg.net_transport == COLLD_NET_TRANSPORT_IB)
            fall_back(cl, p, why);
        return;
    }
    if (!b) { /* no offer from this side: the peer hears why from this side's IbHello */
        if (colld_net_peer_path(p))
            colld_cluster_log_bad(cl, "IbHello from %s on a link that runs over IB already", colld_net_peer_addr(p));
        return;
    }
    if (b->connected) {
        colld_cluster_log_bad(cl, "a second IbHello from %s", colld_net_peer_addr(p));
        return;
    }
    colld_ib_endpoint_t e = { .qpn = h->qpn,
                              .psn = h->psn,
                              .lid = h->lid,
                              .mtu = h->mtu,
                              .ring_addr = h->ring_addr,
                              .ring_rkey = h->ring_rkey,
                              .slots = h->slots,
                              .slot_payload = h->slot_payload };
    char err[160];
    if (h->gid.len != 16) {
        snprintf(err, sizeof(err), "a GID of %zu bytes", h->gid.len);
        goto refuse;
    }
    memcpy(e.gid, h->gid.data, 16);
    if (colld_ib_endpoint_check(&e, COLLD_NET_MAX_CHUNK, err, sizeof(err)) < 0)
        goto refuse;
    if (colld_ib_link_connect(b->link, &e, err, sizeof(err)) < 0) {
        snprintf(why, sizeof(why), "IB setup failed: %s", err);
        send_ready(p, false, why);
        fall_back(cl, p, why);
        return;
    }
    b->connected = true;
    send_ready(p, true, "");
    if (b->peer_ready)
        activate(cl, b);
    return;
refuse:
    colld_cluster_log_bad(cl, "invalid IB offer from %s: %s", colld_net_peer_addr(p), err);
    snprintf(why, sizeof(why), "the peer's IB offer was refused: %s", err);
    send_ready(p, false, why);
    fall_back(cl, p, why);
}

static void on_ready(colld_cluster_t *cl, colld_net_peer_t *p, const Colld__Net__V1__IbReady *r)
{
    char why[192], text[160];
    ciblink_t *b = find(cl, p);
    if (!b) {
        if (r->ok)
            colld_cluster_log_bad(cl, "IbReady from %s without an IB offer", colld_net_peer_addr(p));
        return;
    }
    if (!r->ok) {
        peer_text(text, sizeof(text), r->reason);
        snprintf(why, sizeof(why), "the peer did not take IB: %s", text);
        fall_back(cl, p, why);
        return;
    }
    b->peer_ready = true;
    if (b->connected)
        activate(cl, b);
}

void colld_iblink_ctrl(colld_cluster_t *cl, colld_net_peer_t *p, const Colld__Net__V1__Msg *m)
{
    if (!p)
        return;
    if (m->m_case == COLLD__NET__V1__MSG__M_IB_HELLO)
        on_hello(cl, p, m->ib_hello);
    else if (m->m_case == COLLD__NET__V1__MSG__M_IB_READY)
        on_ready(cl, p, m->ib_ready);
}

/* The test hook --test-ib-fault-file: every IB link's QP to the error state when the file appears
 * (its flushed receives then fail the link as a real QP error would). */
static void fault_hook(colld_cluster_t *cl)
{
    const char *path = cl->d->cfg.test_ib_fault_file;
    if (!path || !*path || unlink(path) < 0)
        return;
    colld_net_peer_info_t info[16];
    size_t n = colld_net_peers(cl->net, info, 16);
    for (size_t i = 0; i < n && i < 16; i++) {
        colld_net_peer_t *p = colld_net_peer_find(cl->net, info[i].addr);
        ciblink_t *b = p ? colld_net_peer_path(p) : NULL;
        if (b) {
            LOG_WARN(NET, "test hook: the QP to %s moved to the error state", info[i].addr);
            colld_ib_link_inject_error(b->link);
        }
    }
}

void colld_iblink_tick(colld_cluster_t *cl)
{
    uint64_t now = colld_now_ms();
    fault_hook(cl);
    ciblink_t *b = cl->ib_pending;
    while (b) {
        ciblink_t *following = b->next;
        if (now >= b->deadline_ms) {
            char why[96];
            snprintf(why, sizeof(why), "no answer to the IB offer within %d ms", IBLINK_ANSWER_MS);
            fall_back(cl, b->peer, why);
        }
        b = following;
    }
}
