/*
 * tcp_conn.c - one connection of the TCP transport (net thread): creating and closing it,
 * reading frames and checking every header against the connection's state before a byte of its
 * payload is accepted, and writing its send queue with writev-style batches.
 *
 * Bytes received go through a 64 KiB staging buffer into the current header or payload; a
 * payload remainder of 16 KiB or more is read straight into its destination. A failure here
 * (EOF, I/O error, a bad frame) refuses a stranger or loses the connection's peer (tcp.c).
 */
#include "transport/tcp/tcp_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define IBUF_LEN 65536          /* staging buffer for headers and small payloads */
#define DIRECT_READ_MIN 16384   /* payload remainders at least this long are read in place */
#define READ_BUDGET (4u << 20)  /* bytes read from one connection per event, for fairness */
#define WRITE_BUDGET (8u << 20) /* bytes written to one connection per flush */
#define CBUF_KEEP 65536         /* a CTRL buffer larger than this is freed after use */
#define IOV_BATCH 64

/* ============================================================================================
 * Errors and messages
 * ========================================================================================== */

/* The one place an errno value becomes text: "what: strerror(err)". */
void colld__tcp_sys_msg(char *buf, size_t len, const char *what, int err)
{
    char tmp[128];
    colld_set_err(buf, len, "%s: %s", what, strerror_r(err, tmp, sizeof(tmp)));
}

/* A frame of `type` with len payload bytes: copied behind the message (CTRL, HELLO, AUTH) or, for
 * DATA, the caller's memory. NULL if out of memory. */
msg_t *colld__tcp_msg_new(unsigned type, const colld_net_hdr_t *h, const void *payload, size_t len, bool copy)
{
    msg_t *m = malloc(sizeof(*m) + (copy ? len : 0));
    if (!m)
        return NULL;
    memset(m, 0, sizeof(*m));
    colld__tcp_frame_encode(m->wire, type, h, (uint32_t)len);
    m->len = len;
    m->data = type == TCP_DATA;
    if (copy && len)
        memcpy(m->copy, payload, len);
    m->payload = copy ? m->copy : payload;
    return m;
}

/* ============================================================================================
 * Life cycle
 * ========================================================================================== */

/* Ask epoll for what c waits for: connect completion, or input plus output while it has a queue. */
void colld__tcp_conn_update_events(conn_t *c)
{
    uint32_t want = c->state == CONN_CONNECTING ? EPOLLOUT : (EPOLLIN | (c->sq.head ? EPOLLOUT : 0u));
    if (want == c->events)
        return;
    struct epoll_event ev = { .events = want, .data.ptr = c };
    if (epoll_ctl(c->net->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
        c->events = want;
}

/* A connection for fd (non-blocking), registered with epoll. NULL if out of memory or epoll
 * refuses (the caller closes fd). */
conn_t *colld__tcp_conn_new(colld_net_t *n, int fd, colld_net_peer_t *p, conn_state_t state, const char *remote)
{
    conn_t *c = calloc(1, sizeof(*c));
    if (!c || !(c->ibuf = malloc(IBUF_LEN)))
        goto fail;
    c->ev_kind = EV_CONN;
    c->net = n;
    c->fd = fd;
    c->peer = p;
    c->state = state;
    colld_strlcpy(c->remote, remote, sizeof(c->remote));
    uint64_t now = colld_now_ms();
    c->born_ms = now;
    c->deadline_ms = now + (uint64_t)(p ? n->cfg.handshake_ms : n->cfg.stranger_ms);
    c->last_send_ms = c->last_recv_ms = now;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->events = state == CONN_CONNECTING ? EPOLLOUT : EPOLLIN;
    struct epoll_event ev = { .events = c->events, .data.ptr = c };
    if (epoll_ctl(n->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
        goto fail;
    if (!p) {
        c->incoming = true;
        c->in_handshake_count = true;
        n->handshakes++;
    }
    c->next = n->conns;
    n->conns = c;
    return c;
fail:
    if (c)
        free(c->ibuf);
    free(c);
    return NULL;
}

/* Remember a stranger's source address (a struct sockaddr_storage from accept), by which the
 * strangers of one address are counted. */
void colld__tcp_conn_set_source(conn_t *c, const void *sockaddr)
{
    const struct sockaddr_storage *ss = sockaddr;
    c->src_family = (uint8_t)ss->ss_family;
    if (ss->ss_family == AF_INET6)
        memcpy(c->src_ip, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
    else if (ss->ss_family == AF_INET)
        memcpy(c->src_ip, &((const struct sockaddr_in *)ss)->sin_addr, 4);
}

/* Close c's socket and move its queued messages to failed. Its memory goes in reap(). */
void colld__tcp_conn_close(conn_t *c, msgq_t *failed)
{
    if (c->closed)
        return;
    c->closed = true;
    epoll_ctl(c->net->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (c->in_handshake_count) {
        c->net->handshakes--;
        c->in_handshake_count = false;
    }
    c->head_off = 0;
    c->sq_copied = 0;
    if (c->rx_timing) {
        c->rx_timing = false;
        c->peer->rx_active--;
    }
    colld__tcp_q_concat(failed, &c->sq);
}

/* Free a connection (closed, or at stop: then its messages go without callbacks). */
void colld__tcp_conn_free(conn_t *c)
{
    if (!c->closed) {
        close(c->fd);
        colld__tcp_q_release(&c->sq, false, false);
    }
    free(c->ibuf);
    free(c->cbuf);
    free(c->chunk);
    free(c);
}

/* Queue m on c; the loop writes it after the current events. A peer that lets more than
 * TCP_MAX_QUEUED_CTRL bytes of copied messages pile up on a connection (it reads nothing, while
 * it may still be sending) is dropped rather than let the queue grow without bound. */
void colld__tcp_conn_send(conn_t *c, msg_t *m)
{
    colld__tcp_q_push(&c->sq, m);
    c->dirty = true;
    c->net->flush_needed = true;
    if (m->data)
        return;
    c->sq_copied += TCP_HDR_LEN + m->len;
    if (c->sq_copied > TCP_MAX_QUEUED_CTRL && c->peer) {
        char why[TCP_WHY_LEN];
        colld_set_err(why, sizeof(why), "%zu bytes of messages to it are not read", c->sq_copied);
        colld_net_peer_drop(c->peer, why);
    }
}

/* Count bytes written to or read from the socket in the peer's statistics. */
static void account(conn_t *c, size_t sent, size_t received)
{
    colld_net_peer_t *p = c->peer;
    if (!p)
        return;
    pthread_mutex_lock(&c->net->lock);
    p->bytes_sent += sent;
    p->bytes_received += received;
    pthread_mutex_unlock(&c->net->lock);
}

#define REFUSE_LOG_MS 10000 /* refused strangers: one log line per this interval at most */

/* Log the refusals not logged yet, as one line, once REFUSE_LOG_MS has passed since the last. */
void colld__tcp_refuse_log_flush(colld_net_t *n, uint64_t now)
{
    if (n->refuse_quiet == 0 || now < n->refuse_log_ms + REFUSE_LOG_MS)
        return;
    LOG_WARN(NET, "refused %llu more connection(s) from strangers in the last %llu s, the last from %s",
             (unsigned long long)n->refuse_quiet, (unsigned long long)((now - n->refuse_log_ms + 999) / 1000),
             n->refuse_last);
    n->refuse_quiet = 0;
    n->refuse_log_ms = now;
}

/* Close a stranger's connection: counted, and logged with its address unless another refusal
 * was logged less than REFUSE_LOG_MS ago (then it is counted into the next summary line), so a
 * flood of strangers cannot flood the log. */
void colld__tcp_refuse(conn_t *c, const char *why)
{
    colld_net_t *n = c->net;
    uint64_t now = colld_now_ms();
    pthread_mutex_lock(&n->lock);
    n->refused++;
    pthread_mutex_unlock(&n->lock);
    if (n->refuse_quiet == 0 && (n->refuse_log_ms == 0 || now >= n->refuse_log_ms + REFUSE_LOG_MS)) {
        LOG_WARN(NET, "refused connection from %s: %s", c->remote, why);
        n->refuse_log_ms = now;
    } else {
        n->refuse_quiet++;
        colld_set_err(n->refuse_last, sizeof(n->refuse_last), "%s: %s", c->remote, why);
        colld__tcp_refuse_log_flush(n, now);
    }
    msgq_t failed = { 0 };
    colld__tcp_conn_close(c, &failed);
    colld__tcp_q_release(&failed, false, false);
}

/* c failed (EOF, I/O error, protocol error, timeout): refuse a stranger, lose a peer. */
void colld__tcp_conn_failed(conn_t *c, const char *detail)
{
    char why[TCP_WHY_LEN], label[TCP_LABEL_LEN];
    if (c->closed)
        return;
    if (!c->peer) {
        colld__tcp_refuse(c, detail);
    } else if (c->state != CONN_UP) {
        colld_set_err(why, sizeof(why), "handshake with %s: %s", c->peer->addr, detail);
        colld__tcp_peer_lose(c->peer, why);
    } else {
        colld__tcp_peer_label(c->peer, label, sizeof(label));
        colld_set_err(why, sizeof(why), "connection to %s: %s", label, detail);
        colld__tcp_peer_lose(c->peer, why);
    }
}

/* A failed read or write: errno becomes the reason. */
static void conn_io_error(conn_t *c, const char *what, int err)
{
    char detail[TCP_WHY_LEN];
    colld__tcp_sys_msg(detail, sizeof(detail), what, err);
    colld__tcp_conn_failed(c, detail);
}

/* ============================================================================================
 * Link measurements (tcp.h, "Link measurements")
 * ========================================================================================== */

/* A timed DATA frame's body is complete: its bytes count, and the peer's busy time when no other
 * connection of it is inside one. The window halves once it holds TCP_RATE_WINDOW bytes. */
static void rx_timed(conn_t *c)
{
    colld_net_peer_t *p = c->peer;
    c->rx_timing = false;
    uint64_t busy = 0;
    if (--p->rx_active == 0)
        busy = c->read_ns > p->rx_t0_ns ? c->read_ns - p->rx_t0_ns : 0;
    pthread_mutex_lock(&c->net->lock);
    p->rx_bytes += c->frame.len;
    p->rx_busy_ns += busy;
    if (p->rx_bytes > TCP_RATE_WINDOW) {
        p->rx_bytes /= 2;
        p->rx_busy_ns /= 2;
    }
    pthread_mutex_unlock(&c->net->lock);
}

/* The receive rate from p in bytes/s, 0 without enough timed bytes (under net->lock or on the
 * network thread). */
double colld__tcp_rx_rate(const colld_net_peer_t *p)
{
    if (p->rx_bytes < TCP_RATE_MIN_BYTES || p->rx_busy_ns == 0)
        return 0;
    return (double)p->rx_bytes * 1e9 / (double)p->rx_busy_ns;
}

/* Queue a heartbeat on c: an answer to the echo request stamped `echo` (0: none), an echo request
 * of its own when the last one is a heartbeat interval old, and this daemon's receive rate from
 * the peer when it has one. */
void colld__tcp_heartbeat(conn_t *c, uint64_t now_ns, uint64_t echo)
{
    colld_net_hdr_t h = { 0 };
    uint64_t interval_ns = (uint64_t)c->net->cfg.heartbeat_ms * 1000000ull;
    if (echo) {
        h.flags |= TCP_HB_ECHO_REPLY;
        h.xid = echo;
    }
    if (now_ns >= c->echo_last_ns + interval_ns) {
        h.flags |= TCP_HB_ECHO_REQ;
        h.seq = now_ns;
        c->echo_sent_ns = c->echo_last_ns = now_ns;
    }
    double rate = c->peer ? colld__tcp_rx_rate(c->peer) : 0;
    if (rate > 0) {
        h.flags |= TCP_HB_RATE;
        h.offset = (uint64_t)rate;
    }
    msg_t *m = colld__tcp_msg_new(TCP_HEARTBEAT, &h, NULL, 0, true);
    if (m)
        colld__tcp_conn_send(c, m);
}

/* A heartbeat arrived: its echo reply (accepted only for the request outstanding on c), the
 * peer's report of its receive rate from this daemon (ignored above TCP_RATE_MAX), and an echo
 * request answered at once. Unknown flags are ignored (a later version's). */
static void heartbeat_in(conn_t *c)
{
    const colld_net_hdr_t *h = &c->frame.h;
    colld_net_peer_t *p = c->peer;
    bool rtt = (h->flags & TCP_HB_ECHO_REPLY) && c->echo_sent_ns && h->xid == c->echo_sent_ns &&
               c->read_ns >= c->echo_sent_ns;
    bool rate = (h->flags & TCP_HB_RATE) && (double)h->offset <= TCP_RATE_MAX;
    if (rtt || rate) {
        pthread_mutex_lock(&c->net->lock);
        if (rtt) {
            double ms = (double)(c->read_ns - c->echo_sent_ns) / 1e6;
            p->rtt_ms = p->rtt_samples++ ? p->rtt_ms + (ms - p->rtt_ms) / 8 : ms;
            c->echo_sent_ns = 0;
        }
        if (rate)
            p->tx_rate = (double)h->offset;
        pthread_mutex_unlock(&c->net->lock);
    }
    if ((h->flags & TCP_HB_ECHO_REQ) && h->seq)
        colld__tcp_heartbeat(c, c->read_ns, h->seq);
}

/* ============================================================================================
 * Receiving
 * ========================================================================================== */

/* A frame is complete: run the handshake step or the caller's callback. */
static void on_body(conn_t *c)
{
    colld_net_t *n = c->net;
    const colld_net_callbacks_t *cb = &n->cfg.cb;
    c->in_body = false;
    switch (c->frame.type) {
    case TCP_HELLO:
        if (c->state == CONN_ACCEPTED)
            colld__tcp_on_initiator_hello(c);
        else
            colld__tcp_on_acceptor_hello(c);
        break;
    case TCP_AUTH:
        colld__tcp_on_auth(c);
        break;
    case TCP_CTRL:
        if (cb->ctrl)
            cb->ctrl(cb->arg, c->peer, c->cbuf, c->frame.len);
        if (c->cbuf_cap > CBUF_KEEP) {
            free(c->cbuf);
            c->cbuf = NULL;
            c->cbuf_cap = 0;
        }
        break;
    case TCP_DATA:
        if (c->rx_timing)
            rx_timed(c);
        if (cb->data) {
            colld_net_hdr_t h = c->frame.h;
            cb->data(cb->arg, c->peer, &h, c->body);
        }
        break;
    default: /* HEARTBEAT */
        heartbeat_in(c);
        break;
    }
}

/* A frame header is complete: check it against the connection's state and set up its body. */
static void on_header(conn_t *c)
{
    colld_net_t *n = c->net;
    char detail[128], tbuf[16];
    tcp_frame_t *f = &c->frame;
    colld__tcp_frame_decode(c->hdr, f);
    const char *tname = colld__tcp_frame_name(f->type, tbuf, sizeof(tbuf));
    bool bad_len = false;
    if (f->magic != TCP_FRAME_MAGIC) {
        colld__tcp_conn_failed(c, "not a colld peer (bad frame magic)");
        return;
    }
    if (c->state != CONN_UP) {
        unsigned expect = c->state == CONN_CHALLENGED ? TCP_AUTH : TCP_HELLO;
        if (f->type != expect) {
            colld_set_err(detail, sizeof(detail), "sent %s before authenticating", tname);
            colld__tcp_conn_failed(c, detail);
            return;
        }
    } else if (f->type == TCP_HELLO || f->type == TCP_AUTH) {
        colld_set_err(detail, sizeof(detail), "protocol error: %s after the handshake", tname);
        colld__tcp_conn_failed(c, detail);
        return;
    }
    switch (f->type) {
    case TCP_HELLO:
        bad_len = f->len < TCP_HELLO_FIXED || f->len > TCP_HELLO_MAX;
        break;
    case TCP_AUTH:
        bad_len = f->len != TCP_MAC_LEN;
        break;
    case TCP_HEARTBEAT:
        bad_len = f->len != 0;
        break;
    case TCP_CTRL:
        bad_len = f->len > COLLD_NET_CTRL_MAX;
        break;
    case TCP_DATA:
        bad_len = f->len > n->cfg.chunk_bytes;
        break;
    default:
        colld_set_err(detail, sizeof(detail), "protocol error: unknown frame %s", tname);
        colld__tcp_conn_failed(c, detail);
        return;
    }
    if (bad_len) {
        colld_set_err(detail, sizeof(detail), "protocol error: %s frame of %u bytes", tname, f->len);
        colld__tcp_conn_failed(c, detail);
        return;
    }
    if (f->type == TCP_DATA) {
        const colld_net_callbacks_t *cb = &n->cfg.cb;
        if (f->len >= TCP_RATE_MIN_FRAME && c->peer && !c->rx_timing) {
            c->rx_timing = true;
            if (c->peer->rx_active++ == 0)
                c->peer->rx_t0_ns = c->read_ns;
        }
        colld_net_hdr_t h = f->h;
        c->body = cb->data_dest ? cb->data_dest(cb->arg, c->peer, &h) : NULL;
        if (!c->body) {
            if (!c->chunk && !(c->chunk = malloc(n->cfg.chunk_bytes))) {
                colld__tcp_conn_failed(c, "out of memory for a receive buffer");
                return;
            }
            c->body = c->chunk;
        }
    } else if (f->len > 0) {
        if (f->len > c->cbuf_cap) {
            uint8_t *b = realloc(c->cbuf, f->len);
            if (!b) {
                colld__tcp_conn_failed(c, "out of memory for a CTRL message");
                return;
            }
            c->cbuf = b;
            c->cbuf_cap = f->len;
        }
        c->body = c->cbuf;
    }
    c->in_body = true;
    c->body_got = 0;
    if (f->len == 0)
        on_body(c);
}

/* Move the staged bytes into headers and bodies, dispatching complete frames. */
static void consume(conn_t *c)
{
    while (c->ipos < c->iend && !c->closed) {
        size_t avail = c->iend - c->ipos, k;
        if (!c->in_body) {
            k = COLLD_MIN(avail, TCP_HDR_LEN - c->hdr_got);
            memcpy(c->hdr + c->hdr_got, c->ibuf + c->ipos, k);
            c->hdr_got += k;
            c->ipos += k;
            if (c->hdr_got == TCP_HDR_LEN) {
                c->hdr_got = 0;
                on_header(c);
            }
        } else {
            k = COLLD_MIN(avail, c->frame.len - c->body_got);
            memcpy(c->body + c->body_got, c->ibuf + c->ipos, k);
            c->body_got += k;
            c->ipos += k;
            if (c->body_got == c->frame.len)
                on_body(c);
        }
    }
    if (c->ipos == c->iend)
        c->ipos = c->iend = 0;
}

/* Read what the socket has (up to a budget) and dispatch it. Large payload remainders are read
 * straight into their destination. */
void colld__tcp_conn_read(conn_t *c)
{
    size_t budget = READ_BUDGET;
    while (!c->closed) {
        consume(c);
        if (c->closed || budget == 0)
            return;
        bool direct = c->in_body && c->frame.len - c->body_got >= DIRECT_READ_MIN;
        uint8_t *dst = direct ? c->body + c->body_got : c->ibuf;
        size_t cap = direct ? c->frame.len - c->body_got : IBUF_LEN;
        ssize_t r = read(c->fd, dst, cap);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn_io_error(c, "receive", errno);
            return;
        }
        if (r == 0) {
            colld__tcp_conn_failed(c, c->peer ? "closed by the other side" : "closed before authenticating");
            return;
        }
        c->read_ns = colld_now_ns(); /* the one clock read per read(): also times DATA frames */
        c->last_recv_ms = c->read_ns / 1000000ull;
        account(c, 0, (size_t)r);
        budget -= COLLD_MIN(budget, (size_t)r);
        if (!direct) {
            c->iend = (size_t)r;
        } else if ((c->body_got += (size_t)r) == c->frame.len) {
            on_body(c);
        }
    }
}

/* ============================================================================================
 * Sending and events
 * ========================================================================================== */

/* Write c's queue until it is empty, the socket is full or the budget is spent; completed DATA
 * messages get done(ok = true). EPOLLOUT stays on while anything is left. */
static void conn_flush(conn_t *c)
{
    size_t budget = WRITE_BUDGET;
    while (c->sq.head && !c->closed && c->state != CONN_CONNECTING && budget > 0) {
        struct iovec iov[IOV_BATCH];
        int niov = 0;
        size_t skip = c->head_off;
        for (msg_t *m = c->sq.head; m && niov + 2 <= IOV_BATCH; m = m->next) {
            if (skip < TCP_HDR_LEN)
                iov[niov++] = (struct iovec){ .iov_base = m->wire + skip, .iov_len = TCP_HDR_LEN - skip };
            size_t pskip = skip > TCP_HDR_LEN ? skip - TCP_HDR_LEN : 0;
            if (m->len > pskip)
                iov[niov++] = (struct iovec){ .iov_base = (void *)(m->payload + pskip), .iov_len = m->len - pskip };
            skip = 0;
        }
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)niov };
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn_io_error(c, "send", errno);
            break;
        }
        c->last_send_ms = colld_now_ms();
        account(c, (size_t)w, 0);
        budget -= COLLD_MIN(budget, (size_t)w);
        msgq_t sent = { 0 };
        size_t left = c->head_off + (size_t)w;
        while (c->sq.head && left >= TCP_HDR_LEN + c->sq.head->len) {
            left -= TCP_HDR_LEN + c->sq.head->len;
            if (!c->sq.head->data)
                c->sq_copied -= TCP_HDR_LEN + c->sq.head->len;
            colld__tcp_q_push(&sent, colld__tcp_q_pop(&c->sq));
        }
        c->head_off = left;
        colld__tcp_q_release(&sent, true, true); /* callbacks may queue more on c: the loop goes on */
    }
    if (!c->closed)
        colld__tcp_conn_update_events(c);
}

void colld__tcp_flush_dirty(colld_net_t *n)
{
    n->flush_needed = false;
    for (conn_t *c = n->conns; c; c = c->next) {
        if (c->dirty && !c->closed) {
            c->dirty = false;
            conn_flush(c);
        }
    }
}

void colld__tcp_conn_event(conn_t *c, uint32_t events)
{
    if (c->closed)
        return;
    if (c->state == CONN_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err == 0 && (events & (EPOLLERR | EPOLLHUP)))
            err = ECONNRESET;
        if (err) {
            char what[COLLD_NET_ADDR_LEN + 16], why[TCP_WHY_LEN];
            colld_set_err(what, sizeof(what), "connect to %s", c->peer->addr);
            colld__tcp_sys_msg(why, sizeof(why), what, err);
            colld__tcp_peer_lose(c->peer, why);
        } else {
            colld__tcp_on_connected(c);
        }
        return;
    }
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
        colld__tcp_conn_read(c);
    if (!c->closed && (events & EPOLLOUT))
        conn_flush(c);
}
