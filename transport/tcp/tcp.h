/*
 * tcp.h - daemon-to-daemon links over TCP: authenticated connections, framed messages, heartbeats.
 *
 * One colld_net_t per daemon owns a listening socket, one network thread (epoll, non-blocking
 * sockets) and a peer table. A peer is another daemon, named by the address it listens on
 * ("HOST:PORT", as given to its --listen); it has `conns_per_peer` TCP connections, opened by
 * whichever side needed the peer first (both sides may open some; all of them are used).
 *
 * Authentication (before any message is accepted): both sides prove knowledge of the cluster
 * secret with an HMAC-SHA256 challenge/response over fresh nonces (OpenSSL). A connection that
 * fails it, sends anything else first, or does not finish in time is closed; it never reaches the
 * daemon's callbacks. Messages after that are not encrypted.
 *
 * Strangers (accepted connections before they authenticate) cannot crowd out peers: each must
 * finish its handshake within stranger_ms (2 s by default), at most TCP_STRANGERS_PER_ADDR of them
 * from one source address and TCP_MAX_STRANGERS in all are kept, and a new connection over
 * either bound evicts the oldest stranger (of its address, or of all) instead of being refused,
 * so a silent flood cannot keep a real peer's connection, which authenticates within one round
 * trip, from getting in. Connections this daemon opens and authenticated ones are never counted
 * or evicted. Every stranger closed is counted (colld_net_refused) and logged rate-limited: the
 * first at once, then one line per 10 s with how many more.
 *
 * Peers are bounded: at most TCP_MAX_PEERS records. A record that is lost, has nothing queued and
 * that the owner says it no longer uses (the peer_unused callback) is freed once it has been lost
 * for peer_linger_ms (or at once when more than TCP_MAX_LOST_PEERS such records exist), so that
 * connections claiming ever new addresses cannot grow the table.
 *
 * Messages: CTRL (opaque payload up to COLLD_NET_CTRL_MAX bytes, copied, always on the peer's
 * first connection so CTRL messages to one peer keep their order; a peer that lets more than
 * TCP_MAX_QUEUED_CTRL bytes of them wait, reading nothing, is lost) and DATA (header fields for the
 * collective engine plus a payload of at most chunk_bytes, sent zero-copy from the caller's
 * memory and striped over the connections by a hint). Heartbeats keep silent links alive and
 * detect dead ones: a connection that receives nothing for heartbeat_ms * heartbeat_misses ms
 * makes its peer lost.
 *
 * Link measurements (for slow-link diagnosis; no system call per message beyond the clock read
 * the receive path already made):
 *   - receive throughput: each DATA frame of at least TCP_RATE_MIN_FRAME payload bytes is timed
 *     from the read that completed its header to the read that completed its body; a peer is busy
 *     while any of its connections is inside such a frame, and its rate is the bytes over that busy
 *     time (idle time between frames, a sender waiting for its own inputs, is not counted), over
 *     a window of about TCP_RATE_WINDOW bytes (older traffic decays by halving). A rate needs
 *     TCP_RATE_MIN_BYTES in the window.
 *   - send throughput: the peer's own receive measurement of this daemon's traffic, which it
 *     reports in its heartbeats (a claim by an authenticated peer, bounded by TCP_RATE_MAX).
 *   - round-trip time: heartbeats carry an echo request (a timestamp the other side returns in
 *     its next heartbeat, at most one request per connection per heartbeat interval); a reply is
 *     accepted only for the request outstanding on that connection.
 *   - TCP_INFO of each connection (getsockopt once a second per connection): the kernel's RTT,
 *     presumed-lost segments and retransmissions.
 * The heartbeat fields are ignored by daemons that predate them, so the wire stays compatible.
 *
 * Threads: every callback runs on the network thread. Functions marked (net thread) may be
 * called only from a callback; the others are safe from any thread.
 */
#ifndef COLLD_TRANSPORT_TCP_H
#define COLLD_TRANSPORT_TCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define COLLD_NET_NAME_LEN 64
#define COLLD_NET_ADDR_LEN 128
#define COLLD_NET_CTRL_MAX (1u << 20)
#define TCP_MAX_PEERS 1024         /* peer records at most (live and lost) */
#define TCP_MAX_LOST_PEERS 64      /* lost, unused records kept for operators before the linger ends */
#define TCP_MAX_STRANGERS 256      /* accepted connections in their handshake at once */
#define TCP_STRANGERS_PER_ADDR 32  /* of them from one source address (>= 2 rounds of 16 connections) */
#define TCP_MAX_QUEUED_CTRL (64u << 20) /* CTRL bytes waiting on a connection before its peer is dropped */
#define TCP_RATE_MIN_FRAME (64u << 10)  /* DATA frames this large or larger are timed */
#define TCP_RATE_MIN_BYTES (1u << 20)   /* a link's rate needs this many timed bytes */
#define TCP_RATE_WINDOW (64ull << 20)   /* timed bytes kept before the window halves */
#define TCP_RATE_MAX 1e12               /* a rate a peer reports above this (bytes/s) is ignored */

typedef struct colld_net colld_net_t;
typedef struct colld_net_peer colld_net_peer_t;

/* The header of a DATA message. The transport carries the fields; their meaning is the
 * caller's (phase/step/offset of a collective algorithm). Little-endian on the wire. */
typedef struct {
    uint8_t phase;
    uint8_t flags;
    uint16_t step;
    uint32_t len;    /* payload bytes, <= chunk_bytes */
    uint64_t xid;    /* communicator's cluster-wide id */
    uint64_t seq;    /* collective sequence number */
    uint64_t offset; /* byte offset in the collective's buffer */
} colld_net_hdr_t;

/* Another way for a peer's DATA messages (transport/ib behind server/net/iblink.c): the peer's
 * authentication, CTRL messages and heartbeats stay on its TCP connections; once a path is set,
 * its DATA goes through the path's send, and what arrives on the path is handed to the same
 * data_dest/data callbacks with colld_net_deliver. The path's fd is polled by the network thread
 * (readable: event). All calls on the network thread. */
typedef struct {
    const char *name; /* the transport's name in collctl status and the metrics: "ib" */
    int (*fd)(void *link);
    void (*event)(void *link);
    /* As colld_net_send_data (done once the bytes left, or with ok false). */
    int (*send)(void *link, const colld_net_hdr_t *h, const void *payload, void (*done)(void *cookie, bool ok),
                void *cookie);
    /* Free the link; with notify, queued DATA done(false) first (without, no callback runs). */
    void (*close)(void *link, bool notify);
} colld_net_path_ops_t;

typedef struct {
    /* A peer finished its handshake (its first connection is up): its name is known. */
    void (*peer_up)(void *arg, colld_net_peer_t *p);
    /* A peer was lost: one of its connections closed or failed, failed the handshake, could not
     * be opened, or heard nothing for too long; or colld_net_disconnect was called. All its
     * connections are closed first, and every DATA message still queued to it has had its done
     * callback run with ok = false. The peer object stays valid (state lost) until peer_unused
     * says it may go (never without that callback); sending to it again starts a new connection
     * attempt. */
    void (*peer_lost)(void *arg, colld_net_peer_t *p, const char *why);
    /* A DATA header arrived: return where its h->len payload bytes must be written (memory the
     * caller keeps valid until data() runs), or NULL to receive them into the connection's own
     * buffer of chunk_bytes. */
    void *(*data_dest)(void *arg, colld_net_peer_t *p, const colld_net_hdr_t *h);
    /* A DATA message arrived complete; `payload` is where it was written (the connection's
     * buffer is valid only during the call). */
    void (*data)(void *arg, colld_net_peer_t *p, const colld_net_hdr_t *h, void *payload);
    /* A CTRL message arrived (payload valid only during the call). */
    void (*ctrl)(void *arg, colld_net_peer_t *p, const void *payload, size_t len);
    /* Runs on the network thread after colld_net_wake and at least every 50 ms. */
    void (*tick)(void *arg);
    /* May the lost peer p be freed (no pointer to it is kept)? NULL: peers are never freed
     * before colld_net_stop. */
    bool (*peer_unused)(void *arg, colld_net_peer_t *p);
    void *arg;
} colld_net_callbacks_t;

typedef struct {
    const char *node_name;   /* this daemon's name, sent in the handshake */
    const char *listen_addr; /* "HOST:PORT" to bind and to advertise to peers (port 0: any) */
    const uint8_t *secret;   /* cluster secret (copied), at least 16 bytes */
    size_t secret_len;
    int conns_per_peer;      /* connections this side opens to a peer, >= 1 */
    int heartbeat_ms;        /* a heartbeat goes out on a connection silent this long */
    int heartbeat_misses;    /* a connection that hears nothing for heartbeat_ms * this is dead */
    size_t chunk_bytes;      /* largest DATA payload, and each connection's receive buffer */
    int handshake_ms;        /* a connection this side opens must authenticate within this; 0: 5000 */
    int stranger_ms;         /* an accepted connection must authenticate within this; 0: 2000 */
    int peer_linger_ms;      /* a lost, unused peer record is kept this long; 0: 30000 */
    colld_net_callbacks_t cb;
} colld_net_config_t;

/* A peer as collctl shows it. */
typedef struct colld_net_peer_info {
    char name[COLLD_NET_NAME_LEN]; /* "" until its handshake */
    char addr[COLLD_NET_ADDR_LEN];
    const char *state;             /* "connecting", "up" or "lost" (static strings) */
    int conns;                     /* authenticated connections open */
    uint64_t bytes_sent, bytes_received; /* payload and headers, since the daemon started */
    double send_rate, recv_rate;   /* bytes/s over roughly the last second */
    char last_error[160];          /* why it was last lost, "" if never */
    /* Link health (see "Link measurements" above). */
    double tx_rate;         /* bytes/s this peer measured receiving from this daemon, 0: no sample */
    double rx_rate;         /* bytes/s this daemon measured receiving from the peer, 0: no sample */
    uint64_t rx_bytes;      /* DATA payload bytes behind rx_rate (the window, decayed) */
    uint64_t rx_busy_ns;    /* the time spent receiving them */
    double rtt_ms;          /* heartbeat round trip, smoothed; 0: none measured yet */
    uint64_t rtt_samples;
    uint32_t tcp_rtt_us;    /* TCP_INFO tcpi_rtt, the largest over the open connections */
    uint32_t tcp_rttvar_us;
    uint32_t tcp_lost;      /* TCP_INFO tcpi_lost (segments now presumed lost), summed */
    uint64_t retrans;       /* TCP_INFO tcpi_total_retrans, summed over every connection it ever had */
    uint64_t losses;        /* times it was lost (connection errors, silence, operator) */
    char transport[8];      /* of its DATA: "tcp", or a path's name ("ib") */
    char transport_note[160]; /* why it is not the path asked for ("" if it is, or nothing was asked) */
} colld_net_peer_info_t;

/* Bind the listening socket and start the network thread. Returns 0, or -1 with a message in
 * err (bad address, port in use, secret too short). On failure there is nothing to destroy. */
int colld_net_start(const colld_net_config_t *cfg, colld_net_t **out, char *err, size_t err_len);
/* Stop the thread, close every socket and free everything. Callbacks do not run during or after
 * this call (DATA done callbacks of unsent messages included). NULL is a no-op. Not from a
 * callback (it joins the network thread). */
void colld_net_stop(colld_net_t *n);

/* The address peers reach this daemon at: listen_addr, with the port the kernel chose when it
 * was 0. */
const char *colld_net_listen_addr(const colld_net_t *n);

/* Wake the network thread: tick() runs soon (any thread). */
void colld_net_wake(colld_net_t *n);
/* Queue a copy of a CTRL message to the peer listening at addr, connecting to it if needed
 * (any thread). If the peer cannot be reached, peer_lost() reports it. Returns 0, or -1 if out
 * of memory or len > COLLD_NET_CTRL_MAX. */
int colld_net_post_ctrl(colld_net_t *n, const char *addr, const void *payload, size_t len);
/* Close every connection of the peer at addr or named name as if its link broke: peer_lost()
 * runs with "disconnected by an operator" (any thread). Returns 0, or -1 if no such peer is up. */
int colld_net_disconnect(colld_net_t *n, const char *name_or_addr);
/* Snapshot of the peer table (any thread): fills up to max entries, returns how many peers exist. */
size_t colld_net_peers(colld_net_t *n, colld_net_peer_info_t *out, size_t max);
/* Connections refused so far because they failed authentication (any thread). */
uint64_t colld_net_refused(colld_net_t *n);

/* The peer listening at addr, created (and connected to) if it is new or was lost (net thread).
 * NULL when out of memory or the peer table is full (TCP_MAX_PEERS). */
colld_net_peer_t *colld_net_peer_get(colld_net_t *n, const char *addr);
/* The peer listening at addr if there is a record of it, NULL if not; never connects (net
 * thread). */
colld_net_peer_t *colld_net_peer_find(colld_net_t *n, const char *addr);
/* Lose p from the loop, as a broken link (peer_lost(why) runs there, not in this call): for a
 * peer that stopped taking data (net thread). A no-op when p is lost already. */
void colld_net_peer_drop(colld_net_peer_t *p, const char *why);
/* Check that addr is a peer address this transport can dial: "HOST:PORT" or "[V6]:PORT", a host
 * of letters, digits, '.', '-', '_' (or an IPv6 address in brackets), a port from 1 to 65535, at
 * most COLLD_NET_ADDR_LEN - 1 bytes. Returns 0, or -1 with the reason in err (any thread). */
int colld_net_check_addr(const char *addr, char *err, size_t err_len);
/* Queue a CTRL message (copied) (net thread). Returns 0 or -1 (out of memory, too long). */
int colld_net_send_ctrl(colld_net_peer_t *p, const void *payload, size_t len);
/* Queue a DATA message (net thread). The payload (h->len bytes) is not copied: it must stay
 * unchanged until done(cookie, ok) runs on the network thread, ok = true once the bytes were
 * handed to the kernel, false if the peer was lost first. The connection is conn_hint modulo the
 * peer's open connections. Returns 0, or -1 (peer lost, h->len > chunk_bytes, no memory), in
 * which case done is not called. */
int colld_net_send_data(colld_net_peer_t *p, const colld_net_hdr_t *h, const void *payload, unsigned conn_hint,
                        void (*done)(void *cookie, bool ok), void *cookie);
/* A peer's address and name ("" before its handshake); valid as long as the peer is. */
const char *colld_net_peer_addr(const colld_net_peer_t *p);
const char *colld_net_peer_name(const colld_net_peer_t *p);
bool colld_net_peer_is_up(const colld_net_peer_t *p);
/* Lost (not connecting, not up) (net thread). */
bool colld_net_peer_is_lost(const colld_net_peer_t *p);
/* Send p's DATA through a path from now on (ops and link kept until the peer is lost or the path
 * cleared, then ops->close(link)); its fd joins the network thread's poll. Returns 0, or -1 with
 * the reason in err (peer not up, epoll refused the fd): then the caller still owns link. */
int colld_net_peer_set_path(colld_net_peer_t *p, const colld_net_path_ops_t *ops, void *link, char *err,
                            size_t err_len);
/* The link of p's path (NULL when its DATA goes over TCP) (net thread). */
void *colld_net_peer_path(const colld_net_peer_t *p);
/* Why p's DATA goes over TCP although another transport was considered (collctl status), "" to
 * clear (net thread). */
void colld_net_peer_set_note(colld_net_peer_t *p, const char *note);
/* A DATA message arrived on p's path: data_dest, then data, as for one read from TCP (net thread). */
void colld_net_deliver(colld_net_peer_t *p, const colld_net_hdr_t *h, void *payload);
/* A caller-owned pointer kept with the peer (net thread). */
void colld_net_peer_set_user(colld_net_peer_t *p, void *user);
void *colld_net_peer_user(const colld_net_peer_t *p);

#endif /* COLLD_TRANSPORT_TCP_H */
