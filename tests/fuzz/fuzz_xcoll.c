/*
 * fuzz_xcoll.c - libFuzzer harness: what a peer daemon holding the cluster secret can send into a
 * multi-node communicator of a real daemon core: Ready, Fail and arbitrary CTRL messages
 * (server/net/cluster.c) and DATA frames with any header and payload, accepted or refused by
 * server/net/xcoll.c (data_valid, with the checks of ring.c and rd.c, and the reduction,
 * forwarding and copies that follow), while a local rank posts collectives.
 *
 * The core is tests/fuzz/core_fixture.h with the cluster on a detached transport
 * (colld__cluster_start_detached: no socket, no thread): one session is the local rank, every
 * other rank is on a fake peer whose messages go through the transport's own callbacks, exactly
 * as the network thread delivers them after a frame was read. The communicator forms through the
 * real Join/Formed exchange with this daemon as the root. The first byte picks 2 or 3 nodes, the
 * local rank, the all-reduce algorithm, the chunk size and a 1 ms or a 60 s timeout; then the
 * input is a program of posts, Readys, DATA, CTRL, Fail, lost peers, network and engine passes.
 */
#include "tests/fuzz/core_fixture.h"

#include "colld_net.pb-c.h"
#include "common/log.h"
#include "common/util.h"
#include "server/net/cluster.h"
#include "transport/tcp/tcp_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 3
#define PAYLOAD_MAX 65536

typedef struct {
    const uint8_t *p;
    size_t n;
} input_t;

static uint8_t take8(input_t *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

static uint64_t take(input_t *in, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)take8(in) << (8 * i);
    return v;
}

typedef struct {
    colld_daemon_t *d;
    colld_net_t *net;
    colld_net_peer_t *peer[MAXN]; /* by rank; NULL for the local one */
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    colld_wire_sqe_t last;       /* the last collective posted */
} world_t;

/* A CTRL message from a peer, as the network thread hands it over. */
static void deliver(world_t *w, colld_net_peer_t *p, const Colld__Net__V1__Msg *m)
{
    uint8_t buf[4096];
    size_t len = colld__net__v1__msg__get_packed_size(m);
    if (len > sizeof(buf))
        return;
    colld__net__v1__msg__pack(m, buf);
    w->net->cfg.cb.ctrl(w->net->cfg.cb.arg, p, buf, len);
}

static void peer_join(world_t *w, int rank, int nranks)
{
    colld_net_peer_t *p = w->peer[rank];
    Colld__Net__V1__Join j = COLLD__NET__V1__JOIN__INIT;
    j.unique_id.data = w->uid;
    j.unique_id.len = sizeof(w->uid);
    j.tenant = 1000;
    j.nranks = nranks;
    j.rank = rank;
    j.name = (char *)"fuzz";
    j.node_name = p->name;
    j.node_addr = p->addr;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_JOIN;
    m.join = &j;
    deliver(w, p, &m);
}

static void peer_ready(world_t *w, colld_net_peer_t *p, input_t *in, uint64_t xid)
{
    Colld__Net__V1__Ready r = COLLD__NET__V1__READY__INIT;
    uint8_t how = take8(in);
    r.xid = (how & 1) ? take(in, 8) : xid;
    r.seq = (how & 2) ? take(in, 1) : w->last.seq;
    r.kind = (how & 4) ? take8(in) : w->last.kind;
    r.dtype = (how & 8) ? take8(in) : w->last.dtype;
    r.redop = (how & 16) ? take8(in) : w->last.redop;
    r.root = (how & 32) ? (int8_t)take8(in) : w->last.root;
    r.count = (how & 64) ? take(in, 2) : w->last.count;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_READY;
    m.ready = &r;
    deliver(w, p, &m);
}

static void peer_fail(world_t *w, colld_net_peer_t *p, input_t *in, uint64_t xid)
{
    char detail[64];
    size_t n = take8(in) % sizeof(detail);
    for (size_t i = 0; i < n; i++)
        detail[i] = (char)take8(in);
    detail[n] = '\0';
    Colld__Net__V1__Fail f = COLLD__NET__V1__FAIL__INIT;
    uint8_t how = take8(in);
    f.xid = (how & 1) ? 0 : xid;
    f.unique_id.data = w->uid;
    f.unique_id.len = (how & 2) ? sizeof(w->uid) : take8(in) % 4;
    f.tenant = 1000;
    f.status = (int8_t)take8(in);
    f.rank = (int8_t)take8(in);
    f.detail = detail;
    f.node_name = detail;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_FAIL;
    m.fail = &f;
    deliver(w, p, &m);
}

/* A DATA frame from a peer: any header (the transport bounds only its length), payload bytes from
 * the input. */
static void peer_data(world_t *w, colld_net_peer_t *p, input_t *in, uint64_t xid)
{
    static uint8_t payload[PAYLOAD_MAX];
    uint8_t how = take8(in);
    colld_net_hdr_t h = { .phase = (how & 1) ? take8(in) : (uint8_t)(1 + take8(in) % 5),
                          .step = (uint16_t)((how & 2) ? take(in, 2) : take8(in) % 4),
                          .xid = (how & 4) ? take(in, 8) : xid,
                          .seq = (how & 8) ? take(in, 8) : w->last.seq };
    h.offset = (how & 16) ? take(in, 8) : take(in, 2) * 4;
    h.len = (uint32_t)((how & 32) ? take(in, 3) % (PAYLOAD_MAX + 1) : take(in, 2) * 4 % (PAYLOAD_MAX + 1));
    for (size_t i = 0; i < 16 && i < h.len; i++)
        payload[i] = take8(in);
    w->net->cfg.cb.data(w->net->cfg.cb.arg, p, &h, payload);
}

/* The local rank posts a collective within its two registrations. */
static void post(fix_t *f, world_t *w, colld_session_t *s, uint32_t handle, int nranks, input_t *in)
{
    colld_member_t *m = handle < s->nhandles ? s->handles[handle] : NULL;
    colld_wire_sqe_t sqe = { .comm = handle };
    uint8_t how = take8(in);
    sqe.seq = (how & 1) ? take(in, 1) : (m ? m->next_seq : 1);
    sqe.kind = (uint8_t)(take8(in) % 6);
    sqe.dtype = (uint8_t)(take8(in) % 11);
    sqe.redop = (uint8_t)(take8(in) % 6);
    sqe.root = (int32_t)(take8(in) % (unsigned)(nranks + 1));
    sqe.count = take(in, 2) % (FIX_REG_BYTES / 8 / (uint64_t)nranks + 1);
    sqe.send.reg_id = 1;
    sqe.recv.reg_id = (how & 2) ? 1 : 2;
    if (fix_post(f, s, &sqe))
        w->last = sqe;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input_t in = { data, size };
    fix_t *f = calloc(1, sizeof(*f));
    world_t w = { 0 };
    if (!f)
        return 0;
    uint8_t cfg = take8(&in);
    int nranks = 2 + (cfg & 1), local = (cfg >> 1) % nranks;
    if (fix_start(f, 0) < 0)
        abort();
    colld_daemon_t *d = &f->d;
    w.d = d;
    d->cfg.net_algo = (cfg >> 3) % 3;
    d->cfg.net_chunk = 4096u * (1u + ((cfg >> 6) & 3));
    if (colld__cluster_start_detached(d, "127.0.0.1:7000", "self") < 0)
        abort();
    w.net = colld_cluster_of(d)->net;
    colld_session_t *s = fix_session(f, 1000, 1);
    if (!s)
        abort();
    for (int r = 0; r < nranks; r++) {
        if (r == local)
            continue;
        char addr[32];
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", 1 + r); /* nothing listens there */
        if (!(w.peer[r] = colld__tcp_peer_new(w.net, addr)))
            abort();
        snprintf(w.peer[r]->name, sizeof(w.peer[r]->name), "node-%d", r);
    }
    /* The communicator forms: the local rank joins, then the peers' ranks (this daemon is root). */
    pthread_mutex_lock(&d->lock);
    if (colld_comm_issue_uid(d, s, w.uid) == COLLD_OK)
        colld_comm_join(d, s, w.uid, nranks, local, (cfg & 0x20) ? 1 : 60000, "fuzz", false, NULL, NULL);
    colld_daemon_unlock(d);
    colld__tcp_net_step(w.net);
    for (int r = 0; r < nranks; r++)
        if (r != local)
            peer_join(&w, r, nranks);
    colld__tcp_net_step(w.net);
    colld_dcomm_t *c = d->comms;
    if (!c || !colld_xcomm(c) || !colld_xcomm(c)->formed)
        abort(); /* the exchange itself must work */
    uint64_t xid = colld_xcomm(c)->xid;
    uint32_t handle = c->ranks[local].handle;

    for (int ops = 0; in.n && ops < 256; ops++) {
        uint8_t op = take8(&in);
        colld_net_peer_t *p = w.peer[(op >> 4) % (unsigned)nranks];
        if (!p)
            p = w.peer[(local + 1) % nranks];
        switch (op & 0x0f) {
        case 0:
        case 1:
            post(f, &w, s, handle, nranks, &in);
            colld_engine_run_once(d);
            break;
        case 2:
        case 3:
            peer_ready(&w, p, &in, xid);
            break;
        case 4:
        case 5:
        case 6:
            peer_data(&w, p, &in, xid);
            break;
        case 7: { /* an arbitrary CTRL payload */
            uint8_t buf[256];
            size_t n = take8(&in);
            for (size_t i = 0; i < n; i++)
                buf[i] = take8(&in);
            w.net->cfg.cb.ctrl(w.net->cfg.cb.arg, p, buf, n);
            break;
        }
        case 8:
            peer_fail(&w, p, &in, xid);
            break;
        case 9:
            if (take8(&in) == 0x5a)
                colld_net_peer_drop(p, "fuzz: link dropped");
            break;
        case 10:
            if (take8(&in) == 0xa5)
                fix_session_end(f, s);
            break;
        case 11:
            colld_engine_run_once(d);
            fix_reap(f, s);
            break;
        default:
            colld__tcp_net_step(w.net);
            break;
        }
    }
    for (int i = 0; i < 3; i++) {
        colld__tcp_net_step(w.net);
        colld_engine_run_once(d);
        fix_reap(f, s);
    }
    colld_cluster_stop(d); /* running collectives end (NODE_LOST) */
    fix_stop(f);
    free(f);
    return 0;
}
