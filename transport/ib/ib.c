/*
 * ib.c - DATA links over verbs (see ib.h): the device, one RC queue pair per link, the bounce
 * rings and their credits, completions from the link's completion channel.
 *
 * Immediate data: IMM_DATA | slot for a DATA write, IMM_CREDIT | n for n returned credits (a
 * zero-length write). Each side keeps 2 * IB_SLOTS receives posted: at most IB_SLOTS DATA writes
 * (the credits) and at most IB_SLOTS credit writes (one per slot the peer consumed, which it can
 * only have done for DATA this side wrote) can be outstanding toward it.
 */
#include "transport/ib/ib.h"

#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if COLLD_HAVE_IB
#include <arpa/inet.h>
#include <fcntl.h>
#include <stdarg.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#define IMM_DATA 0x40000000u
#define IMM_CREDIT 0x80000000u
#define IMM_VALUE 0x0000ffffu
#define IB_RECVS (2 * IB_SLOTS)
#define IB_SENDS (2 * IB_SLOTS + 2)
#define IB_CQE (IB_RECVS + IB_SENDS + 4)
#define WR_DATA 0x100u   /* wr_id of a DATA write: WR_DATA | slot */
#define WR_CREDIT 0x200u /* of a credit write */
#define ALIGN4K(x) (((x) + 4095) & ~(size_t)4095)

/* The slot header, little-endian (as the TCP frame's). */
static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
    put16(p, (uint16_t)v);
    put16(p + 2, (uint16_t)(v >> 16));
}
static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}
static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t get32(const uint8_t *p)
{
    return get16(p) | (uint32_t)get16(p + 2) << 16;
}
static uint64_t get64(const uint8_t *p)
{
    return get32(p) | (uint64_t)get32(p + 4) << 32;
}

struct colld_ib {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    uint8_t port;
    int gid_index;
    union ibv_gid gid;
    uint16_t lid;
    enum ibv_mtu mtu;
    int nlinks;
    char name[64];
};

/* A DATA message waiting for a send slot. */
typedef struct ib_msg {
    struct ib_msg *next;
    colld_net_hdr_t h;
    const void *payload;
    void (*done)(void *cookie, bool ok);
    void *cookie;
} ib_msg_t;

struct colld_ib_link {
    colld_ib_t *ib;
    colld_ib_link_callbacks_t cb;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    uint8_t *send_ring, *recv_ring;
    struct ibv_mr *send_mr, *recv_mr;
    size_t slot_bytes;
    uint32_t slot_payload;
    uint64_t remote_addr;
    uint32_t remote_rkey;
    bool connected, failed;
    unsigned cq_events; /* to acknowledge */
    /* Sending: slot next_slot is written next; credits are the peer's free slots; a slot stays
     * busy (slot_msg) until its write completes. */
    unsigned next_slot, credits, sends_out;
    ib_msg_t *slot_msg[IB_SLOTS];
    ib_msg_t *qhead, *qtail;
    unsigned queued;
    /* Receiving: credits owed to the peer. */
    unsigned owed;
    uint32_t psn; /* this side's first send PSN, as advertised */
};

/* One place that turns a verbs failure into a message (the errno they set, or return). */
static int ib_fail(char *err, size_t len, const char *what, int e)
{
    if (e == ENOSYS)
        colld_set_err(err, len, "%s: %s (ENOSYS: this kernel has no RDMA verbs; use --net-transport tcp or auto)", what,
                      strerror(e));
    else
        colld_set_err(err, len, "%s: %s", what, strerror(e ? e : EIO));
    return -1;
}

/* ============================================================================================
 * The device
 * ========================================================================================== */

/* A GID on port: a RoCEv2 one with an IPv4-mapped address first, then any RoCEv2, then index 0
 * (InfiniBand). Returns the index or -1. */
static int pick_gid(struct ibv_context *ctx, uint8_t port, int len, union ibv_gid *out)
{
    int best = -1, score = 0;
    for (int i = 0; i < len; i++) {
        struct ibv_gid_entry e;
        if (ibv_query_gid_ex(ctx, port, (uint32_t)i, &e, 0) != 0)
            continue;
        static const uint8_t zero[16];
        if (memcmp(e.gid.raw, zero, 16) == 0)
            continue;
        bool v4 = memcmp(e.gid.raw, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0;
        int s = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? (v4 ? 4 : 3) : e.gid_type == IBV_GID_TYPE_IB ? 2 : 1;
        if (s > score) {
            score = s;
            best = i;
            memcpy(out->raw, e.gid.raw, 16);
        }
    }
    return best;
}

int colld_ib_open(const char *dev, int port, colld_ib_t **out, char *err, size_t err_len)
{
    *out = NULL;
    int num = 0, rc = -1;
    errno = 0;
    struct ibv_device **list = ibv_get_device_list(&num);
    if (!list)
        return ib_fail(err, err_len, "ibv_get_device_list", errno);
    colld_ib_t *ib = calloc(1, sizeof(*ib));
    if (!ib) {
        colld_set_err(err, err_len, "out of memory");
        goto out;
    }
    if (num == 0)
        colld_set_err(err, err_len,
                      "no RDMA device (ibv_get_device_list found none; for Soft-RoCE: rdma link add "
                      "rxe0 type rxe netdev eth0)");
    else
        colld_set_err(err, err_len, "no RDMA device%s%s has an active port", dev && *dev ? " named " : "",
                      dev && *dev ? dev : "");
    for (int i = 0; i < num && rc < 0; i++) {
        const char *name = ibv_get_device_name(list[i]);
        if (dev && *dev && strcmp(name, dev) != 0)
            continue;
        struct ibv_context *ctx = ibv_open_device(list[i]);
        if (!ctx) {
            ib_fail(err, err_len, "ibv_open_device", errno);
            continue;
        }
        struct ibv_device_attr da;
        if (ibv_query_device(ctx, &da) != 0) {
            ibv_close_device(ctx);
            continue;
        }
        for (int p = 1; p <= da.phys_port_cnt && rc < 0; p++) {
            struct ibv_port_attr pa;
            if ((port && p != port) || ibv_query_port(ctx, (uint8_t)p, &pa) != 0 || pa.state != IBV_PORT_ACTIVE)
                continue;
            int gi = pick_gid(ctx, (uint8_t)p, pa.gid_tbl_len, &ib->gid);
            if (gi < 0) {
                colld_set_err(err, err_len, "%s port %d is active but has no GID", name, p);
                continue;
            }
            ib->ctx = ctx;
            ib->port = (uint8_t)p;
            ib->gid_index = gi;
            ib->lid = pa.lid;
            ib->mtu = pa.active_mtu;
            snprintf(ib->name, sizeof(ib->name), "%s:%d", name, p);
            rc = 0;
        }
        if (rc < 0)
            ibv_close_device(ctx);
    }
    if (rc == 0 && !(ib->pd = ibv_alloc_pd(ib->ctx))) {
        rc = ib_fail(err, err_len, "ibv_alloc_pd", errno);
        ibv_close_device(ib->ctx);
    }
out:
    ibv_free_device_list(list);
    if (rc < 0)
        free(ib);
    else
        *out = ib;
    return rc;
}

void colld_ib_close(colld_ib_t *ib)
{
    if (!ib)
        return;
    ibv_dealloc_pd(ib->pd);
    ibv_close_device(ib->ctx);
    free(ib);
}

const char *colld_ib_name(const colld_ib_t *ib)
{
    return ib->name;
}

int colld_ib_links(const colld_ib_t *ib)
{
    return ib->nlinks;
}

/* ============================================================================================
 * Links: setup
 * ========================================================================================== */

static int post_recv(colld_ib_link_t *l)
{
    struct ibv_recv_wr wr = { .wr_id = 0, .sg_list = NULL, .num_sge = 0 }, *bad;
    return ibv_post_recv(l->qp, &wr, &bad);
}

int colld_ib_link_new(colld_ib_t *ib, uint32_t slot_payload, const colld_ib_link_callbacks_t *cb, colld_ib_link_t **out,
                      colld_ib_endpoint_t *local, char *err, size_t err_len)
{
    *out = NULL;
    if (ib->nlinks >= IB_MAX_LINKS) {
        colld_set_err(err, err_len, "%d IB links open already (the bound)", IB_MAX_LINKS);
        return -1;
    }
    if (slot_payload == 0 || slot_payload > IB_MAX_SLOT_PAYLOAD) {
        colld_set_err(err, err_len, "slot payload %u out of range", slot_payload);
        return -1;
    }
    colld_ib_link_t *l = calloc(1, sizeof(*l));
    if (!l) {
        colld_set_err(err, err_len, "out of memory");
        return -1;
    }
    l->ib = ib;
    l->cb = *cb;
    l->slot_payload = slot_payload;
    l->slot_bytes = IB_SLOT_HDR + (size_t)slot_payload;
    l->credits = IB_SLOTS;
    size_t ring = l->slot_bytes * IB_SLOTS;
    if (!(l->send_ring = aligned_alloc(4096, ALIGN4K(ring))) || !(l->recv_ring = aligned_alloc(4096, ALIGN4K(ring)))) {
        colld_set_err(err, err_len, "out of memory for the IB rings");
        goto fail;
    }
    memset(l->recv_ring, 0, ring);
    if (!(l->send_mr = ibv_reg_mr(ib->pd, l->send_ring, ring, IBV_ACCESS_LOCAL_WRITE))) {
        ib_fail(err, err_len, "ibv_reg_mr (send ring)", errno);
        goto fail;
    }
    if (!(l->recv_mr = ibv_reg_mr(ib->pd, l->recv_ring, ring, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE))) {
        ib_fail(err, err_len, "ibv_reg_mr (receive ring)", errno);
        goto fail;
    }
    if (!(l->ch = ibv_create_comp_channel(ib->ctx))) {
        ib_fail(err, err_len, "ibv_create_comp_channel", errno);
        goto fail;
    }
    int fl = fcntl(l->ch->fd, F_GETFL);
    if (fl < 0 || fcntl(l->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        ib_fail(err, err_len, "fcntl(completion channel)", errno);
        goto fail;
    }
    if (!(l->cq = ibv_create_cq(ib->ctx, IB_CQE, l, l->ch, 0))) {
        ib_fail(err, err_len, "ibv_create_cq", errno);
        goto fail;
    }
    if (ibv_req_notify_cq(l->cq, 0) != 0) {
        ib_fail(err, err_len, "ibv_req_notify_cq", errno);
        goto fail;
    }
    struct ibv_qp_init_attr qa = {
        .send_cq = l->cq,
        .recv_cq = l->cq,
        .cap = { .max_send_wr = IB_SENDS, .max_recv_wr = IB_RECVS, .max_send_sge = 1, .max_recv_sge = 1 },
        .qp_type = IBV_QPT_RC,
    };
    if (!(l->qp = ibv_create_qp(ib->pd, &qa))) {
        ib_fail(err, err_len, "ibv_create_qp", errno);
        goto fail;
    }
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = ib->port, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE
    };
    int e = ibv_modify_qp(l->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (e) {
        ib_fail(err, err_len, "ibv_modify_qp(INIT)", e);
        goto fail;
    }
    for (int i = 0; i < IB_RECVS; i++)
        if ((e = post_recv(l)) != 0) {
            ib_fail(err, err_len, "ibv_post_recv", e);
            goto fail;
        }
    uint32_t psn;
    colld_random_bytes(&psn, sizeof(psn));
    l->psn = psn & 0xffffff;
    *local = (colld_ib_endpoint_t){ .qpn = l->qp->qp_num,
                                    .psn = l->psn,
                                    .lid = ib->lid,
                                    .mtu = (uint32_t)ib->mtu,
                                    .ring_addr = (uint64_t)(uintptr_t)l->recv_ring,
                                    .ring_rkey = l->recv_mr->rkey,
                                    .slots = IB_SLOTS,
                                    .slot_payload = slot_payload };
    memcpy(local->gid, ib->gid.raw, 16);
    ib->nlinks++;
    *out = l;
    return 0;
fail:
    l->ib = NULL; /* not counted */
    colld_ib_link_close(l, false);
    return -1;
}

int colld_ib_endpoint_check(const colld_ib_endpoint_t *e, uint32_t slot_payload, char *err, size_t err_len)
{
    static const uint8_t zero[16];
    if (e->mtu < IBV_MTU_256 || e->mtu > IBV_MTU_4096)
        colld_set_err(err, err_len, "MTU code %u is not one of 1..5", e->mtu);
    else if (e->qpn == 0 || e->qpn > 0xffffff || e->psn > 0xffffff || e->lid > 0xffff)
        colld_set_err(err, err_len, "QP number %u, PSN %u or LID %u out of range", e->qpn, e->psn, e->lid);
    else if (e->slots != IB_SLOTS || e->slot_payload != slot_payload)
        colld_set_err(err, err_len, "ring of %u slots of %u bytes, this daemon uses %u of %u", e->slots,
                      e->slot_payload, IB_SLOTS, slot_payload);
    else if (e->ring_addr == 0 || e->ring_rkey == 0)
        colld_set_err(err, err_len, "no receive ring");
    else if (memcmp(e->gid, zero, 16) == 0 && e->lid == 0)
        colld_set_err(err, err_len, "neither a GID nor a LID");
    else
        return 0;
    return -1;
}

int colld_ib_link_connect(colld_ib_link_t *l, const colld_ib_endpoint_t *r, char *err, size_t err_len)
{
    if (colld_ib_endpoint_check(r, l->slot_payload, err, err_len) < 0)
        return -1;
    colld_ib_t *ib = l->ib;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = COLLD_MIN(ib->mtu, (enum ibv_mtu)r->mtu),
        .dest_qp_num = r->qpn,
        .rq_psn = r->psn,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
        .ah_attr = { .dlid = (uint16_t)r->lid, .sl = 0, .port_num = ib->port },
    };
    static const uint8_t zero[16];
    if (memcmp(r->gid, zero, 16) != 0) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)ib->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    int e = ibv_modify_qp(l->qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (e)
        return ib_fail(err, err_len, "ibv_modify_qp(RTR)", e);
    struct ibv_qp_attr s = {
        .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .sq_psn = 0, .max_rd_atomic = 1
    };
    /* This side sends from the PSN it advertised (the peer's rq_psn). */
    s.sq_psn = l->psn;
    e = ibv_modify_qp(l->qp, &s,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC);
    if (e)
        return ib_fail(err, err_len, "ibv_modify_qp(RTS)", e);
    l->remote_addr = r->ring_addr;
    l->remote_rkey = r->ring_rkey;
    l->connected = true;
    return 0;
}

int colld_ib_link_inject_error(colld_ib_link_t *l)
{
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
    return ibv_modify_qp(l->qp, &a, IBV_QP_STATE) == 0 ? 0 : -1;
}

/* ============================================================================================
 * Links: sending and completions
 * ========================================================================================== */

/* Fail the link once: the caller learns it through cb.failed (and closes it). */
static void link_failed(colld_ib_link_t *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void link_failed(colld_ib_link_t *l, const char *fmt, ...)
{
    if (l->failed)
        return;
    l->failed = true;
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (l->cb.failed)
        l->cb.failed(l->cb.arg, why);
}

/* Post a write of slot bytes (len 0: a credit return) with immediate data imm. */
static int post_write(colld_ib_link_t *l, uint64_t wr_id, unsigned slot, uint32_t len, uint32_t imm)
{
    struct ibv_sge sge = { .addr = (uint64_t)(uintptr_t)(l->send_ring + slot * l->slot_bytes),
                           .length = len,
                           .lkey = l->send_mr->lkey };
    struct ibv_send_wr wr = { .wr_id = wr_id,
                              .sg_list = len ? &sge : NULL,
                              .num_sge = len ? 1 : 0,
                              .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                              .send_flags = IBV_SEND_SIGNALED,
                              .imm_data = htonl(imm) },
                       *bad;
    wr.wr.rdma.remote_addr = l->remote_addr + slot * l->slot_bytes;
    wr.wr.rdma.rkey = l->remote_rkey;
    int e = ibv_post_send(l->qp, &wr, &bad);
    if (e == 0)
        l->sends_out++;
    return e;
}

/* Write queued DATA while there are credits, free slots and send WRs; then return owed credits. */
static void pump(colld_ib_link_t *l)
{
    while (!l->failed && l->connected && l->qhead && l->credits > 0 && !l->slot_msg[l->next_slot] &&
           l->sends_out < IB_SENDS - 1) {
        ib_msg_t *m = l->qhead;
        unsigned k = l->next_slot;
        uint8_t *slot = l->send_ring + k * l->slot_bytes;
        uint8_t *w = slot;
        w[0] = m->h.phase;
        w[1] = m->h.flags;
        put16(w + 2, m->h.step);
        put32(w + 4, m->h.len);
        put64(w + 8, m->h.xid);
        put64(w + 16, m->h.seq);
        put64(w + 24, m->h.offset);
        if (m->h.len)
            memcpy(slot + IB_SLOT_HDR, m->payload, m->h.len);
        int e = post_write(l, WR_DATA | k, k, IB_SLOT_HDR + m->h.len, IMM_DATA | k);
        if (e) {
            link_failed(l, "ibv_post_send: %s", strerror(e));
            return;
        }
        l->qhead = m->next;
        if (!l->qhead)
            l->qtail = NULL;
        l->queued--;
        l->slot_msg[k] = m;
        l->credits--;
        l->next_slot = (k + 1) % IB_SLOTS;
    }
    if (!l->failed && l->connected && l->owed > 0 && l->sends_out < IB_SENDS) {
        int e = post_write(l, WR_CREDIT, 0, 0, IMM_CREDIT | l->owed);
        if (e) {
            link_failed(l, "ibv_post_send (credits): %s", strerror(e));
            return;
        }
        l->owed = 0;
    }
}

int colld_ib_link_send(colld_ib_link_t *l, const colld_net_hdr_t *h, const void *payload,
                       void (*done)(void *cookie, bool ok), void *cookie)
{
    if (!l || l->failed || h->len > l->slot_payload || (h->len && !payload))
        return -1;
    ib_msg_t *m = malloc(sizeof(*m));
    if (!m)
        return -1;
    *m = (ib_msg_t){ .h = *h, .payload = payload, .done = done, .cookie = cookie };
    if (l->qtail)
        l->qtail->next = m;
    else
        l->qhead = m;
    l->qtail = m;
    l->queued++;
    pump(l);
    return 0;
}

/* A DATA write into receive slot k completed: check its header, deliver, repost. */
static void on_recv(colld_ib_link_t *l, const struct ibv_wc *wc)
{
    uint32_t imm = ntohl(wc->imm_data);
    if (imm & IMM_CREDIT) {
        unsigned n = imm & IMM_VALUE;
        if (n == 0 || l->credits + n > IB_SLOTS) {
            link_failed(l, "protocol error: the peer returned %u credits with %u outstanding", n,
                        IB_SLOTS - l->credits);
            return;
        }
        l->credits += n;
    } else if (imm & IMM_DATA) {
        unsigned k = imm & IMM_VALUE;
        const uint8_t *w = l->recv_ring + (size_t)(k % IB_SLOTS) * l->slot_bytes;
        colld_net_hdr_t h = { .phase = w[0],
                              .flags = w[1],
                              .step = get16(w + 2),
                              .len = get32(w + 4),
                              .xid = get64(w + 8),
                              .seq = get64(w + 16),
                              .offset = get64(w + 24) };
        if (k >= IB_SLOTS || h.len > l->slot_payload || wc->byte_len != IB_SLOT_HDR + h.len) {
            link_failed(l, "protocol error: DATA write of %u bytes into slot %u (header length %u)", wc->byte_len, k,
                        h.len);
            return;
        }
        if (l->cb.deliver)
            l->cb.deliver(l->cb.arg, &h, (void *)(w + IB_SLOT_HDR));
        if (l->failed)
            return;
        l->owed++;
    } else {
        link_failed(l, "protocol error: immediate data 0x%x", imm);
        return;
    }
    int e = post_recv(l);
    if (e)
        link_failed(l, "ibv_post_recv: %s", strerror(e));
}

void colld_ib_link_event(colld_ib_link_t *l)
{
    struct ibv_cq *cq;
    void *ctx;
    while (ibv_get_cq_event(l->ch, &cq, &ctx) == 0)
        if (++l->cq_events >= 64) {
            ibv_ack_cq_events(l->cq, l->cq_events);
            l->cq_events = 0;
        }
    if (ibv_req_notify_cq(l->cq, 0) != 0)
        link_failed(l, "ibv_req_notify_cq: %s", strerror(errno));
    struct ibv_wc wc[16];
    int n = 0;
    while (!l->failed && (n = ibv_poll_cq(l->cq, 16, wc)) > 0) {
        for (int i = 0; i < n && !l->failed; i++) {
            if (wc[i].status != IBV_WC_SUCCESS) {
                link_failed(l, "work completion %s (%s, vendor error 0x%x)", ibv_wc_status_str(wc[i].status),
                            wc[i].opcode & IBV_WC_RECV ? "receive" : "send", wc[i].vendor_err);
                break;
            }
            if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
                on_recv(l, &wc[i]);
                continue;
            }
            l->sends_out--;
            if ((wc[i].wr_id & WR_DATA) != 0) {
                unsigned k = (unsigned)(wc[i].wr_id & (IB_SLOTS - 1));
                ib_msg_t *m = l->slot_msg[k];
                l->slot_msg[k] = NULL;
                if (m && m->done)
                    m->done(m->cookie, true);
                free(m);
            }
        }
    }
    if (n < 0)
        link_failed(l, "ibv_poll_cq failed");
    pump(l);
}

int colld_ib_link_fd(const colld_ib_link_t *l)
{
    return l->ch->fd;
}

void colld_ib_link_close(colld_ib_link_t *l, bool notify)
{
    if (!l)
        return;
    for (unsigned k = 0; k < IB_SLOTS; k++)
        if (l->slot_msg[k]) {
            if (notify && l->slot_msg[k]->done)
                l->slot_msg[k]->done(l->slot_msg[k]->cookie, false);
            free(l->slot_msg[k]);
        }
    ib_msg_t *m;
    while ((m = l->qhead)) {
        l->qhead = m->next;
        if (notify && m->done)
            m->done(m->cookie, false);
        free(m);
    }
    if (l->qp)
        ibv_destroy_qp(l->qp);
    if (l->cq) {
        if (l->cq_events)
            ibv_ack_cq_events(l->cq, l->cq_events);
        ibv_destroy_cq(l->cq);
    }
    if (l->ch)
        ibv_destroy_comp_channel(l->ch);
    if (l->send_mr)
        ibv_dereg_mr(l->send_mr);
    if (l->recv_mr)
        ibv_dereg_mr(l->recv_mr);
    free(l->send_ring);
    free(l->recv_ring);
    if (l->ib)
        l->ib->nlinks--;
    free(l);
}

#else /* !COLLD_HAVE_IB */

int colld_ib_open(const char *dev, int port, colld_ib_t **out, char *err, size_t err_len)
{
    (void)dev;
    (void)port;
    *out = NULL;
    colld_set_err(err, err_len, "colld was built without libibverbs (install libibverbs-dev and rebuild)");
    return -1;
}
void colld_ib_close(colld_ib_t *ib)
{
    (void)ib;
}
const char *colld_ib_name(const colld_ib_t *ib)
{
    (void)ib;
    return "";
}
int colld_ib_links(const colld_ib_t *ib)
{
    (void)ib;
    return 0;
}
int colld_ib_endpoint_check(const colld_ib_endpoint_t *e, uint32_t slot_payload, char *err, size_t err_len)
{
    (void)e;
    (void)slot_payload;
    colld_set_err(err, err_len, "built without libibverbs");
    return -1;
}
int colld_ib_link_new(colld_ib_t *ib, uint32_t slot_payload, const colld_ib_link_callbacks_t *cb, colld_ib_link_t **out,
                      colld_ib_endpoint_t *local, char *err, size_t err_len)
{
    (void)ib, (void)slot_payload, (void)cb, (void)local;
    *out = NULL;
    colld_set_err(err, err_len, "built without libibverbs");
    return -1;
}
int colld_ib_link_connect(colld_ib_link_t *l, const colld_ib_endpoint_t *remote, char *err, size_t err_len)
{
    (void)l, (void)remote;
    colld_set_err(err, err_len, "built without libibverbs");
    return -1;
}
int colld_ib_link_inject_error(colld_ib_link_t *l)
{
    (void)l;
    return -1;
}
int colld_ib_link_fd(const colld_ib_link_t *l)
{
    (void)l;
    return -1;
}
void colld_ib_link_event(colld_ib_link_t *l)
{
    (void)l;
}
int colld_ib_link_send(colld_ib_link_t *l, const colld_net_hdr_t *h, const void *payload,
                       void (*done)(void *cookie, bool ok), void *cookie)
{
    (void)l, (void)h, (void)payload, (void)done, (void)cookie;
    return -1;
}
void colld_ib_link_close(colld_ib_link_t *l, bool notify)
{
    (void)l, (void)notify;
}
#endif
