/*
 * tcp_internal.h - the TCP transport's wire format and objects, shared by its three files
 * (internal to transport/tcp; callers use tcp.h):
 *   tcp.c       the colld_net_t: peers, the network thread's loop, start/stop, the public calls
 *   tcp_conn.c  one connection: receiving and checking frames, sending queues, closing
 *   tcp_auth.c  frame and HELLO encoding, the HMAC proofs and the handshake's steps
 *
 * Wire format. Every frame starts with a fixed 40-byte little-endian header:
 *
 *    0 u32 magic "CLD1"    4 u8 type     5 u8 phase    6 u8 flags    7 u8 zero
 *    8 u16 step           10 u16 zero   12 u32 payload length
 *   16 u64 xid            24 u64 seq    32 u64 offset
 *
 * phase/flags/step/xid/seq/offset are those of colld_net_hdr_t for DATA and zero otherwise.
 *
 * Handshake (mutual, HMAC-SHA256 over fresh nonces), before which nothing else is accepted:
 *   initiator -> HELLO{version, name, listen address, session, nonce_i}
 *   acceptor  -> HELLO{version, name, listen address, session, nonce_a,
 *                      mac_a = HMAC(secret, "colld-acceptor" || nonce_i || nonce_a || T)}
 *   initiator -> AUTH{mac_i = HMAC(secret, "colld-initiator" || nonce_a || nonce_i || T)}
 * where T is the session, then the initiator's name and address and the acceptor's, each
 * preceded by its length. A HELLO payload: u16 version, u8 name length (1..63), u8 address length
 * (1..127), u64 session, nonce[32], mac[32] (zero in the initiator's), then the name and the
 * address (printable ASCII).
 *
 * The session numbers one round of connections an initiator opens to a peer (the acceptor echoes
 * it). When the acceptor loses the peer it remembers the sessions of that peer's connections and
 * closes connections of those rounds that finish their handshake later, instead of bringing the
 * peer back up for a moment (the initiator has closed them, or is about to).
 *
 * Threads and locks: see the comment at the top of tcp.c.
 */
#ifndef COLLD_TRANSPORT_TCP_INTERNAL_H
#define COLLD_TRANSPORT_TCP_INTERNAL_H

#include "transport/tcp/tcp.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define TCP_PROTO_VERSION 1
#define TCP_FRAME_MAGIC 0x31444c43u /* "CLD1" */
#define TCP_HDR_LEN 40
#define TCP_NONCE_LEN 32
#define TCP_MAC_LEN 32
#define TCP_HELLO_FIXED (12 + TCP_NONCE_LEN + TCP_MAC_LEN)
#define TCP_HELLO_MAX (TCP_HELLO_FIXED + (COLLD_NET_NAME_LEN - 1) + (COLLD_NET_ADDR_LEN - 1))

enum { TCP_HELLO = 1, TCP_AUTH = 2, TCP_HEARTBEAT = 3, TCP_CTRL = 4, TCP_DATA = 5 };

/* HEARTBEAT header flags (the other header fields are zero in a plain heartbeat; daemons that
 * predate these ignore them). */
#define TCP_HB_ECHO_REQ 0x01   /* seq: the sender's timestamp, to be echoed */
#define TCP_HB_ECHO_REPLY 0x02 /* xid: the timestamp of the request it answers */
#define TCP_HB_RATE 0x04       /* offset: the sender's receive rate from the recipient, bytes/s */

#define TCP_MAX_CONNS_CFG 16 /* conns_per_peer at most */
#define TCP_MAX_INCOMING 64  /* authenticated connections a peer may hold when a stranger joins */
#define TCP_MAX_PEER_CONNS (TCP_MAX_INCOMING + TCP_MAX_CONNS_CFG)
#define TCP_DEAD_SESSIONS 4 /* sessions an acceptor remembers per lost peer */
#define TCP_WHY_LEN 256                                      /* reasons and messages */
#define TCP_LABEL_LEN (COLLD_NET_NAME_LEN + COLLD_NET_ADDR_LEN + 4) /* "NAME (ADDR)" */

/* ============================================================================================
 * Objects
 * ========================================================================================== */

/* A decoded frame header. */
typedef struct {
    uint32_t magic;
    unsigned type;
    uint32_t len;      /* payload bytes */
    colld_net_hdr_t h; /* DATA fields; h.len == len */
} tcp_frame_t;

/* A queued frame. CTRL, HELLO and AUTH payloads are copied behind the struct; DATA payloads are
 * the caller's memory. */
typedef struct tcp_msg {
    struct tcp_msg *next;
    uint8_t wire[TCP_HDR_LEN];
    const uint8_t *payload;
    size_t len;
    bool data;
    unsigned hint; /* DATA queued at a peer that is not up yet */
    void (*done)(void *cookie, bool ok);
    void *cookie;
    uint8_t copy[];
} msg_t;

typedef struct {
    msg_t *head, *tail;
} msgq_t;

typedef enum { PEER_CONNECTING, PEER_UP, PEER_LOST } peer_state_t;

typedef struct tcp_conn conn_t;

/* What an epoll event's pointer leads to, when it is not the listener or the wake fd: the first
 * member of a connection and of a path. */
enum { EV_CONN = 1, EV_PATH = 2 };

/* A peer's DATA path (colld_net_peer_set_path). */
typedef struct {
    unsigned ev_kind; /* EV_PATH */
    colld_net_peer_t *peer;
    const colld_net_path_ops_t *ops;
    void *link;
    int fd;
} path_t;

struct colld_net_peer {
    colld_net_t *net;
    colld_net_peer_t *next;        /* net->peers, linked under net->lock */
    char addr[COLLD_NET_ADDR_LEN]; /* immutable */
    /* Written under net->lock by the net thread. */
    char name[COLLD_NET_NAME_LEN];
    peer_state_t state;
    int nconns;
    uint64_t bytes_sent, bytes_received;
    uint64_t rate_t0_ms, rate_sent0, rate_recv0;
    double send_rate, recv_rate;
    char last_error[160];
    uint64_t rx_bytes, rx_busy_ns;   /* timed DATA: the window behind the receive rate */
    double tx_rate;                  /* the peer's report of its receive rate from us */
    double rtt_ms;                   /* heartbeat echo, smoothed (1/8 per sample) */
    uint64_t rtt_samples;
    uint32_t tcp_rtt_us, tcp_rttvar_us, tcp_lost;
    uint64_t retrans, losses;
    /* Net thread only. */
    conn_t *conns[TCP_MAX_PEER_CONNS]; /* authenticated, in order of authentication */
    msgq_t pending;                    /* queued before the peer was up */
    uint64_t session;                  /* of the connections this side opened last */
    uint64_t dead_sessions[TCP_DEAD_SESSIONS]; /* incoming rounds closed by a loss (ring) */
    unsigned ndead;
    bool loss_pending;
    char loss_why[TCP_WHY_LEN];
    uint64_t lost_ms;          /* when it was last lost */
    uint64_t unused_check_ms;  /* when peer_unused was last asked (once a second at most) */
    path_t path;               /* ops NULL: DATA over TCP */
    char transport_note[160];  /* written under net->lock */
    unsigned rx_active;        /* connections inside a timed DATA frame */
    uint64_t rx_t0_ns;         /* when the first of them began */
    void *user;
};

typedef enum {
    CONN_CONNECTING, /* initiator: TCP connect in progress */
    CONN_HELLO_SENT, /* initiator: waiting for the acceptor's HELLO */
    CONN_ACCEPTED,   /* acceptor: waiting for the initiator's HELLO */
    CONN_CHALLENGED, /* acceptor: HELLO sent, waiting for AUTH */
    CONN_UP,
} conn_state_t;

/* A connection; net thread only. */
struct tcp_conn {
    unsigned ev_kind; /* EV_CONN */
    colld_net_t *net;
    conn_t *next;
    colld_net_peer_t *peer; /* NULL for a stranger */
    int fd;
    conn_state_t state;
    bool closed, dirty, in_handshake_count, incoming;
    uint64_t session; /* the initiator's round of connections */
    uint32_t events; /* registered with epoll */
    char remote[COLLD_NET_ADDR_LEN];
    uint8_t src_ip[16]; /* a stranger's source address (family, then 4 or 16 bytes) */
    uint8_t src_family;
    uint64_t born_ms;   /* accepted or opened */
    uint64_t deadline_ms, last_send_ms, last_recv_ms;
    uint64_t read_ns;      /* the clock at the last read that returned bytes */
    bool rx_timing;        /* inside a timed DATA frame (counted in peer->rx_active) */
    uint64_t echo_sent_ns; /* the echo request outstanding (0: none) */
    uint64_t echo_last_ns; /* when the last echo request went out */
    uint32_t retrans_seen; /* tcpi_total_retrans at the last sample */
    uint8_t nonce_i[TCP_NONCE_LEN], nonce_a[TCP_NONCE_LEN];
    char other_name[COLLD_NET_NAME_LEN], other_addr[COLLD_NET_ADDR_LEN]; /* from its HELLO */
    /* Receiving: bytes go ibuf -> header -> body. */
    uint8_t *ibuf;
    size_t ipos, iend;
    uint8_t hdr[TCP_HDR_LEN];
    size_t hdr_got;
    bool in_body;
    tcp_frame_t frame;
    uint8_t *body;
    size_t body_got;
    uint8_t *cbuf; /* HELLO, AUTH and CTRL payloads */
    size_t cbuf_cap;
    uint8_t *chunk; /* DATA payloads data_dest() did not place */
    /* Sending. */
    msgq_t sq;
    size_t head_off; /* bytes of sq.head already written */
    size_t sq_copied; /* bytes of copied messages (all but DATA) in sq: bounded by TCP_MAX_QUEUED_CTRL */
};

/* A request from another thread. */
typedef struct tcp_request {
    struct tcp_request *next;
    enum { REQ_CTRL, REQ_DISCONNECT } kind;
    msg_t *msg;
    char target[]; /* address, or name or address */
} request_t;

struct colld_net {
    colld_net_config_t cfg; /* strings and secret point at the copies below */
    char name[COLLD_NET_NAME_LEN];
    char addr[COLLD_NET_ADDR_LEN]; /* advertised: listen_addr with the real port */
    uint8_t *secret;
    int lfd, epfd, wfd;
    pthread_t thread;
    bool thread_started; /* false for a detached net (colld__tcp_net_detached) */
    uint64_t timer_period_ms;
    atomic_bool stopping;

    pthread_mutex_t lock;
    colld_net_peer_t *peers, *peers_tail;
    request_t *inbox, **inbox_tail;
    uint64_t refused;

    /* Net thread only. */
    conn_t *conns;
    unsigned handshakes; /* strangers in their handshake */
    unsigned npeers, nlost;   /* records in the table; of them lost */
    uint64_t refuse_log_ms;   /* when the last refusal line was logged */
    uint64_t refuse_quiet;    /* refusals since, not logged yet */
    char refuse_last[TCP_WHY_LEN]; /* the last of them: "ADDR: why" */
    uint64_t full_log_ms, full_quiet; /* the same for a full peer table */
    uint64_t last_session;
    bool flush_needed, loss_pending, listen_paused;
    uint64_t last_tick_ms, next_timer_ms, listen_resume_ms;
};

/* ============================================================================================
 * Message queues
 * ========================================================================================== */

static inline void colld__tcp_q_push(msgq_t *q, msg_t *m)
{
    m->next = NULL;
    if (q->tail)
        q->tail->next = m;
    else
        q->head = m;
    q->tail = m;
}

static inline msg_t *colld__tcp_q_pop(msgq_t *q)
{
    msg_t *m = q->head;
    if (m) {
        q->head = m->next;
        if (!q->head)
            q->tail = NULL;
        m->next = NULL;
    }
    return m;
}

/* Move all of src to the end of dst. */
static inline void colld__tcp_q_concat(msgq_t *dst, msgq_t *src)
{
    if (!src->head)
        return;
    if (dst->tail)
        dst->tail->next = src->head;
    else
        dst->head = src->head;
    dst->tail = src->tail;
    src->head = src->tail = NULL;
}

/* Free every message of q; with run_done, DATA done callbacks run first with ok. */
static inline void colld__tcp_q_release(msgq_t *q, bool run_done, bool ok)
{
    msg_t *m;
    while ((m = colld__tcp_q_pop(q))) {
        if (run_done && m->done)
            m->done(m->cookie, ok);
        free(m);
    }
}

/* ============================================================================================
 * Shared functions (net thread)
 * ========================================================================================== */

/* tcp.c: a net without a listening socket or a thread, driven a pass at a time by its caller
 * (fuzzers and in-process tests: see tests/fuzz). colld_net_stop frees it. Its listen address is
 * cfg->listen_addr as given. */
int colld__tcp_net_detached(const colld_net_config_t *cfg, colld_net_t **out, char *err, size_t err_len);
/* One pass of the network thread's loop without waiting for events: requests from other threads,
 * deferred losses, tick(), the writes queued, closed connections and unused peers freed. */
void colld__tcp_net_step(colld_net_t *n);

/* tcp.c: peers. */
const char *colld__tcp_peer_label(const colld_net_peer_t *p, char *buf, size_t len);
colld_net_peer_t *colld__tcp_peer_find(colld_net_t *n, const char *addr);
colld_net_peer_t *colld__tcp_peer_new(colld_net_t *n, const char *addr);
void colld__tcp_peer_lose(colld_net_peer_t *p, const char *why);
void colld__tcp_conn_attach(conn_t *c, colld_net_peer_t *p, const char *name);

/* tcp_conn.c: connections. */
void colld__tcp_sys_msg(char *buf, size_t len, const char *what, int err);
msg_t *colld__tcp_msg_new(unsigned type, const colld_net_hdr_t *h, const void *payload, size_t len, bool copy);
conn_t *colld__tcp_conn_new(colld_net_t *n, int fd, colld_net_peer_t *p, conn_state_t state, const char *remote);
void colld__tcp_conn_set_source(conn_t *c, const void *sockaddr);
void colld__tcp_conn_update_events(conn_t *c);
void colld__tcp_conn_send(conn_t *c, msg_t *m);
void colld__tcp_conn_event(conn_t *c, uint32_t events);
void colld__tcp_conn_read(conn_t *c);
void colld__tcp_flush_dirty(colld_net_t *n);
void colld__tcp_conn_failed(conn_t *c, const char *detail);
void colld__tcp_refuse(conn_t *c, const char *why);
void colld__tcp_refuse_log_flush(colld_net_t *n, uint64_t now);
void colld__tcp_conn_close(conn_t *c, msgq_t *failed);
void colld__tcp_conn_free(conn_t *c);
void colld__tcp_heartbeat(conn_t *c, uint64_t now_ns, uint64_t echo);
double colld__tcp_rx_rate(const colld_net_peer_t *p);

/* tcp_auth.c: wire format and handshake. */
const char *colld__tcp_frame_name(unsigned type, char *buf, size_t len);
void colld__tcp_frame_encode(uint8_t out[TCP_HDR_LEN], unsigned type, const colld_net_hdr_t *h, uint32_t len);
void colld__tcp_frame_decode(const uint8_t in[TCP_HDR_LEN], tcp_frame_t *f);
void colld__tcp_on_connected(conn_t *c);
void colld__tcp_on_initiator_hello(conn_t *c);
void colld__tcp_on_acceptor_hello(conn_t *c);
void colld__tcp_on_auth(conn_t *c);

#endif /* COLLD_TRANSPORT_TCP_INTERNAL_H */
