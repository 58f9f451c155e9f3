/*
 * tcp.c - daemon-to-daemon links over TCP (tcp.h): the colld_net_t, its peers, the network
 * thread's loop (events, timers, heartbeats, requests from other threads), start/stop and the
 * public calls. One connection's reading and writing is in tcp_conn.c; the wire format and the
 * handshake are in tcp_auth.c (format in tcp_internal.h).
 *
 * Structure. One thread runs an epoll loop over the listening socket, an eventfd (wakes and
 * requests from other threads) and every connection. A connection is either a stranger (accepted,
 * not authenticated yet: no peer) or belongs to a peer (the initiator's connections from the
 * moment they are opened, the acceptor's once the initiator proved the secret). A peer is freed
 * only on the network thread, once it is lost, has nothing queued and the owner's peer_unused
 * callback says no pointer to it is kept (reap_peers), so callers may keep pointers to the peers
 * they use.
 *
 * Re-entrancy. Callbacks may call the (net thread) functions. Those only queue: a message goes
 * on a connection's send queue and the connection is marked dirty; the loop writes dirty
 * connections after the current events. A connection attempt that fails at once schedules the
 * peer's loss for the loop to carry out. So no callback ever closes a connection under the code
 * that called it. Closed connections stay in the list (marked closed) until the end of the loop
 * iteration, so pointers held by the loop never dangle.
 *
 * Locking. net->lock guards what other threads read or write: the peer list's links, each
 * peer's name, state, connection count, statistics and last error (written by the net thread
 * under the lock, read by it without), the request inbox and the refused counter. Everything
 * else belongs to the net thread.
 */
#include "transport/tcp/tcp_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define HANDSHAKE_MS_DEFAULT 5000
#define STRANGER_MS_DEFAULT 2000
#define PEER_LINGER_MS_DEFAULT 30000
#define TICK_MS 50         /* tick() runs at least this often */
#define EPOLL_BATCH 64
#define FULL_LOG_MS 10000  /* a full peer table: one log line per this interval at most */

static const char *const peer_state_names[] = { "connecting", "up", "lost" };

static void peer_queue(colld_net_peer_t *p, msg_t *m);

/* Milliseconds from t to now, 0 if t is later (set after now was read). */
static uint64_t since(uint64_t now, uint64_t t)
{
    return now > t ? now - t : 0;
}

/* ============================================================================================
 * Addresses
 * ========================================================================================== */

/* "NAME (ADDR)" once a peer's name is known, "ADDR" before. */
const char *colld__tcp_peer_label(const colld_net_peer_t *p, char *buf, size_t len)
{
    if (p->name[0])
        colld_set_err(buf, len, "%s (%s)", p->name, p->addr);
    else
        colld_strlcpy(buf, p->addr, len);
    return buf;
}

/* Split "HOST:PORT" or "[V6]:PORT" into its parts. Returns 0 or -1 with the reason in err. */
static int split_addr(const char *text, char *host, size_t host_len, char *port, size_t port_len, char *err,
                      size_t err_len)
{
    const char *p, *orig = text;
    size_t hl;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':') {
            colld_set_err(err, err_len, "'%s' is not HOST:PORT (IPv6 as [::1]:PORT)", text);
            return -1;
        }
        hl = (size_t)(close - text - 1);
        p = close + 2;
        text++;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon || memchr(text, ':', (size_t)(colon - text))) {
            colld_set_err(err, err_len, "'%s' is not HOST:PORT (e.g. 10.0.0.5:7077; IPv6 as [::1]:PORT)", text);
            return -1;
        }
        hl = (size_t)(colon - text);
        p = colon + 1;
    }
    if (hl == 0 || hl >= host_len) {
        colld_set_err(err, err_len, "'%s': missing or overlong host", orig);
        return -1;
    }
    memcpy(host, text, hl);
    host[hl] = '\0';
    size_t pl = strlen(p);
    if (pl == 0 || pl > 5 || pl >= port_len || strspn(p, "0123456789") != pl || atoi(p) > 65535) {
        colld_set_err(err, err_len, "'%s': the port must be a number from 0 to 65535", orig);
        return -1;
    }
    memcpy(port, p, pl + 1);
    return 0;
}

/* Resolve "HOST:PORT" (numeric in practice; AI_NUMERICSERV) to one socket address. */
static int resolve(const char *text, bool passive, struct sockaddr_storage *ss, socklen_t *sl, char *err,
                   size_t err_len)
{
    char host[COLLD_NET_ADDR_LEN], port[8];
    if (split_addr(text, host, sizeof(host), port, sizeof(port), err, err_len) < 0)
        return -1;
    struct addrinfo hints = { .ai_family = AF_UNSPEC,
                              .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0) };
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0 || !ai) {
        colld_set_err(err, err_len, "cannot resolve '%s': %s", text, rc ? gai_strerror(rc) : "no address");
        return -1;
    }
    memset(ss, 0, sizeof(*ss));
    *sl = (socklen_t)COLLD_MIN((size_t)ai->ai_addrlen, sizeof(*ss));
    memcpy(ss, ai->ai_addr, *sl);
    freeaddrinfo(ai);
    return 0;
}

/* "IP:PORT" or "[V6]:PORT" of a socket address. */
static void format_sockaddr(const struct sockaddr_storage *ss, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
        colld_set_err(buf, len, "[%s]:%u", ip, ntohs(s6->sin6_port));
    } else {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
        colld_set_err(buf, len, "%s:%u", ip, ntohs(s4->sin_port));
    }
}

int colld_net_check_addr(const char *addr, char *err, size_t err_len)
{
    char host[COLLD_NET_ADDR_LEN], port[8];
    if (!addr || strnlen(addr, COLLD_NET_ADDR_LEN) >= COLLD_NET_ADDR_LEN) {
        colld_set_err(err, err_len, "address missing or longer than %d bytes", COLLD_NET_ADDR_LEN - 1);
        return -1;
    }
    for (const char *c = addr; *c; c++)
        if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f) {
            colld_set_err(err, err_len, "address is not printable ASCII");
            return -1;
        }
    if (split_addr(addr, host, sizeof(host), port, sizeof(port), err, err_len) < 0)
        return -1;
    const char *allowed = addr[0] == '[' ? "0123456789abcdefABCDEF:.%" /* IPv6, zone */
                                         : "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_";
    if (strspn(host, allowed) != strlen(host)) {
        colld_set_err(err, err_len, "'%s': the host has characters a host name or address cannot have", addr);
        return -1;
    }
    if (atoi(port) == 0) {
        colld_set_err(err, err_len, "'%s': port 0 cannot be dialed", addr);
        return -1;
    }
    return 0;
}

/* ============================================================================================
 * Peers: loss, coming up, connecting
 * ========================================================================================== */

/* Set p's state (lock held), keeping count of the lost records. */
static void peer_set_state(colld_net_peer_t *p, peer_state_t st)
{
    colld_net_t *n = p->net;
    if (p->state == PEER_LOST && st != PEER_LOST)
        n->nlost--;
    else if (p->state != PEER_LOST && st == PEER_LOST)
        n->nlost++;
    p->state = st;
}

/* Remember a round of incoming connections closed by p's loss: its connections still in their
 * handshake must not bring p back (tcp_internal.h, "session"). */
static void remember_dead_session(colld_net_peer_t *p, uint64_t session)
{
    for (unsigned i = 0; i < p->ndead && i < TCP_DEAD_SESSIONS; i++)
        if (p->dead_sessions[i] == session)
            return;
    p->dead_sessions[p->ndead++ % TCP_DEAD_SESSIONS] = session;
}

/* Close p's DATA path, if it has one (DATA over TCP from now on). */
static void path_close(colld_net_peer_t *p, bool notify)
{
    path_t *pa = &p->path;
    if (!pa->ops)
        return;
    const colld_net_path_ops_t *ops = pa->ops;
    void *link = pa->link;
    if (pa->fd >= 0)
        epoll_ctl(p->net->epfd, EPOLL_CTL_DEL, pa->fd, NULL);
    pthread_mutex_lock(&p->net->lock);
    *pa = (path_t){ .ev_kind = EV_PATH, .fd = -1 };
    pthread_mutex_unlock(&p->net->lock);
    ops->close(link, notify);
}

/* Close every connection of p, fail its queued DATA (done(ok = false)), then report
 * peer_lost(why) once. Call it only where no caller holds on to p's connections' buffers. */
void colld__tcp_peer_lose(colld_net_peer_t *p, const char *why_in)
{
    colld_net_t *n = p->net;
    if (p->state == PEER_LOST)
        return;
    char why[TCP_WHY_LEN], label[TCP_LABEL_LEN];
    colld_strlcpy(why, why_in, sizeof(why));
    msgq_t failed = { 0 };
    for (conn_t *c = n->conns; c; c = c->next) {
        if (c->closed || c->peer != p)
            continue;
        if (c->incoming)
            remember_dead_session(p, c->session);
        colld__tcp_conn_close(c, &failed);
    }
    colld__tcp_q_concat(&failed, &p->pending);
    path_close(p, true);
    p->loss_pending = false;
    memset(p->conns, 0, sizeof(p->conns));
    pthread_mutex_lock(&n->lock);
    peer_set_state(p, PEER_LOST);
    p->lost_ms = colld_now_ms();
    p->losses++;
    p->nconns = 0;
    colld_strlcpy(p->last_error, why, sizeof(p->last_error));
    pthread_mutex_unlock(&n->lock);
    /* A peer holding the secret can lose and come back as fast as it likes, under as many names as
     * it likes: one line per interval, then the count of those suppressed (colld_peer_lost_total,
     * collctl status and the communicators' errors keep every loss). */
    LOG_WARN_RL(NET, "lost peer %s: %s", colld__tcp_peer_label(p, label, sizeof(label)), why);
    colld__tcp_q_release(&failed, true, false);
    if (n->cfg.cb.peer_lost)
        n->cfg.cb.peer_lost(n->cfg.cb.arg, p, why);
}

/* Lose p from the loop, not from the current call chain (used where a callback may be on the
 * stack). */
static void schedule_loss(colld_net_peer_t *p, const char *why)
{
    if (p->state == PEER_LOST || p->loss_pending)
        return;
    p->loss_pending = true;
    colld_strlcpy(p->loss_why, why, sizeof(p->loss_why));
    p->net->loss_pending = true;
}

/* Carry out the losses schedule_loss() deferred. */
static void run_pending_losses(colld_net_t *n)
{
    while (n->loss_pending) {
        n->loss_pending = false;
        for (colld_net_peer_t *p = n->peers; p; p = p->next)
            if (p->loss_pending)
                colld__tcp_peer_lose(p, p->loss_why);
    }
}

/* p's first connection authenticated: send what was queued, tell the caller. */
static void peer_became_up(colld_net_peer_t *p)
{
    colld_net_t *n = p->net;
    char label[TCP_LABEL_LEN];
    msg_t *m;
    while ((m = colld__tcp_q_pop(&p->pending)))
        colld__tcp_conn_send(p->conns[m->data ? m->hint % (unsigned)p->nconns : 0], m);
    LOG_INFO_RL(NET, "peer %s is up", colld__tcp_peer_label(p, label, sizeof(label)));
    if (n->cfg.cb.peer_up)
        n->cfg.cb.peer_up(n->cfg.cb.arg, p);
}

/* c authenticated: it joins p (created or revived by the caller). */
void colld__tcp_conn_attach(conn_t *c, colld_net_peer_t *p, const char *name)
{
    colld_net_t *n = c->net;
    if (c->in_handshake_count) {
        n->handshakes--;
        c->in_handshake_count = false;
    }
    bool was_up = p->state == PEER_UP;
    c->peer = p;
    c->state = CONN_UP;
    c->last_recv_ms = c->last_send_ms = colld_now_ms();
    pthread_mutex_lock(&n->lock);
    colld_strlcpy(p->name, name, sizeof(p->name));
    p->conns[p->nconns++] = c;
    peer_set_state(p, PEER_UP);
    pthread_mutex_unlock(&n->lock);
    if (!was_up)
        peer_became_up(p);
}

/* The peer keyed by addr (compared as stored: an overlong address truncated). */
colld_net_peer_t *colld__tcp_peer_find(colld_net_t *n, const char *addr)
{
    for (colld_net_peer_t *p = n->peers; p; p = p->next)
        if (strncmp(p->addr, addr, COLLD_NET_ADDR_LEN - 1) == 0)
            return p;
    return NULL;
}

/* A new peer at addr, in state connecting, linked into the table. NULL if out of memory or the
 * table is full (TCP_MAX_PEERS records; logged, rate-limited). */
colld_net_peer_t *colld__tcp_peer_new(colld_net_t *n, const char *addr)
{
    if (n->npeers >= TCP_MAX_PEERS) {
        uint64_t now = colld_now_ms();
        n->full_quiet++;
        if (n->full_log_ms == 0 || now >= n->full_log_ms + FULL_LOG_MS) {
            LOG_WARN(NET, "peer table full (%d peers): no record for %s (%llu refused in the last %d s)",
                     TCP_MAX_PEERS, addr, (unsigned long long)n->full_quiet, FULL_LOG_MS / 1000);
            n->full_log_ms = now;
            n->full_quiet = 0;
        }
        return NULL;
    }
    colld_net_peer_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    n->npeers++;
    p->net = n;
    p->path = (path_t){ .ev_kind = EV_PATH, .fd = -1 };
    colld_strlcpy(p->addr, addr, sizeof(p->addr));
    p->state = PEER_CONNECTING;
    p->rate_t0_ms = colld_now_ms();
    pthread_mutex_lock(&n->lock);
    if (n->peers_tail)
        n->peers_tail->next = p;
    else
        n->peers = p;
    n->peers_tail = p;
    pthread_mutex_unlock(&n->lock);
    return p;
}

/* Open conns_per_peer connections to p. A failure that shows at once is reported from the
 * loop (a callback may be calling us). */
static void peer_connect(colld_net_peer_t *p)
{
    colld_net_t *n = p->net;
    char why[TCP_WHY_LEN], what[COLLD_NET_ADDR_LEN + 16];
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    pthread_mutex_lock(&n->lock);
    peer_set_state(p, PEER_CONNECTING);
    pthread_mutex_unlock(&n->lock);
    colld_set_err(what, sizeof(what), "connect to %s", p->addr);
    if (strlen(p->addr) >= COLLD_NET_ADDR_LEN - 1) {
        colld_set_err(why, sizeof(why), "%s: address too long", what);
        goto fail;
    }
    if (resolve(p->addr, false, &ss, &sl, why, sizeof(why)) < 0)
        goto fail;
    p->session = ++n->last_session;
    for (int i = 0; i < n->cfg.conns_per_peer; i++) {
        conn_t *c;
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0 || (connect(fd, (struct sockaddr *)&ss, sl) < 0 && errno != EINPROGRESS)) {
            colld__tcp_sys_msg(why, sizeof(why), what, errno);
            if (fd >= 0)
                close(fd);
            goto fail;
        }
        if (!(c = colld__tcp_conn_new(n, fd, p, CONN_CONNECTING, p->addr))) {
            close(fd);
            colld_set_err(why, sizeof(why), "%s: out of memory", what);
            goto fail;
        }
        c->session = p->session;
    }
    return;
fail:
    schedule_loss(p, why);
}

/* ============================================================================================
 * The loop
 * ========================================================================================== */

/* Whether stranger c came from the address in ss. */
static bool same_source(const conn_t *c, const struct sockaddr_storage *ss)
{
    if (c->src_family != ss->ss_family)
        return false;
    if (ss->ss_family == AF_INET6)
        return memcmp(c->src_ip, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16) == 0;
    return memcmp(c->src_ip, &((const struct sockaddr_in *)ss)->sin_addr, 4) == 0;
}

/* Whether stranger a should be evicted before stranger b: one that has sent nothing yet before
 * one that has (a real peer says HELLO at once), then the older. */
static bool evict_before(const conn_t *a, const conn_t *b)
{
    bool sa = a->state == CONN_ACCEPTED && a->hdr_got == 0 && !a->in_body;
    bool sb = b->state == CONN_ACCEPTED && b->hdr_got == 0 && !b->in_body;
    if (sa != sb)
        return sa;
    return a->born_ms <= b->born_ms; /* the list is newest first: "<=" keeps the older on a tie */
}

/* Make room for a new stranger from ss (tcp.h): when its address has TCP_STRANGERS_PER_ADDR
 * strangers in their handshake, or all strangers are TCP_MAX_STRANGERS, one of them (of that
 * address, or of all) is closed and counted as refused: a silent one before one that said HELLO,
 * the oldest first. A real peer says HELLO at once and authenticates within a round trip, so it
 * is never the first to go; a silent flood only evicts itself. */
static void make_room(colld_net_t *n, const struct sockaddr_storage *ss)
{
    unsigned same = 0;
    conn_t *oldest = NULL, *oldest_same = NULL;
    char why[TCP_WHY_LEN];
    for (conn_t *c = n->conns; c; c = c->next) {
        if (c->closed || !c->in_handshake_count)
            continue;
        if (!oldest || evict_before(c, oldest))
            oldest = c;
        if (same_source(c, ss)) {
            same++;
            if (!oldest_same || evict_before(c, oldest_same))
                oldest_same = c;
        }
    }
    if (same >= TCP_STRANGERS_PER_ADDR) {
        colld_set_err(why, sizeof(why), "evicted unauthenticated after %llu ms: %d connections from its address "
                      "were in their handshake",
                      (unsigned long long)(colld_now_ms() - oldest_same->born_ms), TCP_STRANGERS_PER_ADDR);
        colld__tcp_refuse(oldest_same, why);
    } else if (n->handshakes >= TCP_MAX_STRANGERS && oldest) {
        colld_set_err(why, sizeof(why), "evicted unauthenticated after %llu ms: %d connections were in their "
                      "handshake",
                      (unsigned long long)(colld_now_ms() - oldest->born_ms), TCP_MAX_STRANGERS);
        colld__tcp_refuse(oldest, why);
    }
}

/* Accept what the listener has; each new connection is a stranger until it authenticates (room
 * is made for it: make_room). On running out of descriptors, stop listening for 100 ms rather
 * than spin. */
static void accept_all(colld_net_t *n)
{
    for (int i = 0; i < EPOLL_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        char remote[COLLD_NET_ADDR_LEN], why[TCP_WHY_LEN];
        int fd = accept4(n->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EINTR || e == ECONNABORTED)
                continue;
            if (e == EAGAIN || e == EWOULDBLOCK)
                return;
            colld__tcp_sys_msg(why, sizeof(why), "accept", e);
            LOG_WARN_RL(NET, "%s; not accepting peers for 100 ms", why);
            epoll_ctl(n->epfd, EPOLL_CTL_DEL, n->lfd, NULL);
            n->listen_paused = true;
            n->listen_resume_ms = colld_now_ms() + 100;
            return;
        }
        format_sockaddr(&ss, remote, sizeof(remote));
        make_room(n, &ss);
        conn_t *c = colld__tcp_conn_new(n, fd, NULL, CONN_ACCEPTED, remote);
        if (!c) {
            close(fd);
            LOG_WARN(NET, "dropped connection from %s: out of memory", remote);
            continue;
        }
        colld__tcp_conn_set_source(c, &ss);
    }
}

/* Process the requests of other threads. */
static void process_inbox(colld_net_t *n)
{
    pthread_mutex_lock(&n->lock);
    request_t *r = n->inbox;
    n->inbox = NULL;
    n->inbox_tail = &n->inbox;
    pthread_mutex_unlock(&n->lock);
    while (r) {
        request_t *next = r->next;
        if (r->kind == REQ_CTRL) {
            colld_net_peer_t *p = colld_net_peer_get(n, r->target);
            if (p) {
                peer_queue(p, r->msg);
            } else {
                LOG_WARN(NET, "dropped a CTRL message to %s: out of memory or the peer table is full", r->target);
                free(r->msg);
            }
        } else {
            for (colld_net_peer_t *p = n->peers; p; p = p->next)
                if (p->state == PEER_UP && (strcmp(p->addr, r->target) == 0 || strcmp(p->name, r->target) == 0))
                    colld__tcp_peer_lose(p, "disconnected by an operator");
        }
        free(r);
        r = next;
    }
}

/* What TCP_INFO says about a peer's connections. */
typedef struct {
    uint32_t rtt_us, rttvar_us, lost; /* the largest RTT (and its variance), lost segments summed */
    uint64_t retrans;                 /* retransmissions since the last sample, summed */
} tcp_sample_t;

/* Read TCP_INFO of each of p's connections (one getsockopt each, once a second: never per
 * message). */
static tcp_sample_t tcp_sample(colld_net_peer_t *p)
{
    tcp_sample_t s = { 0 };
    for (int i = 0; i < p->nconns; i++) {
        conn_t *c = p->conns[i];
        struct tcp_info ti;
        socklen_t len = sizeof(ti);
        memset(&ti, 0, sizeof(ti));
        if (c->closed || getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
            continue;
        if (ti.tcpi_rtt > s.rtt_us) {
            s.rtt_us = ti.tcpi_rtt;
            s.rttvar_us = ti.tcpi_rttvar;
        }
        s.lost += ti.tcpi_lost;
        if (ti.tcpi_total_retrans >= c->retrans_seen)
            s.retrans += ti.tcpi_total_retrans - c->retrans_seen;
        c->retrans_seen = ti.tcpi_total_retrans;
    }
    return s;
}

/* Handshake deadlines, heartbeats, silence, transfer rates, TCP_INFO and a paused listener. */
static void timers(colld_net_t *n, uint64_t now)
{
    const colld_net_config_t *cfg = &n->cfg;
    uint64_t dead_ms = (uint64_t)cfg->heartbeat_ms * (uint64_t)cfg->heartbeat_misses;
    char why[TCP_WHY_LEN], label[TCP_LABEL_LEN];
    n->next_timer_ms = now + n->timer_period_ms;
    for (conn_t *c = n->conns; c; c = c->next) {
        if (c->closed)
            continue;
        if (c->state != CONN_UP) {
            if (now >= c->deadline_ms) {
                colld_set_err(why, sizeof(why), "%s within %d ms",
                              c->state == CONN_CONNECTING ? "no TCP connection" : "did not authenticate",
                              c->peer ? cfg->handshake_ms : cfg->stranger_ms);
                colld__tcp_conn_failed(c, why);
            }
            continue;
        }
        if (since(now, c->last_recv_ms) >= dead_ms) {
            colld__tcp_conn_read(c); /* the loop may have been busy: look before declaring it dead */
            if (c->closed || since(colld_now_ms(), c->last_recv_ms) < dead_ms)
                continue;
            colld_set_err(why, sizeof(why), "no message from %s for %llu ms",
                          colld__tcp_peer_label(c->peer, label, sizeof(label)),
                          (unsigned long long)since(now, c->last_recv_ms));
            colld__tcp_peer_lose(c->peer, why);
            continue;
        }
        if (!c->sq.head && since(now, c->last_send_ms) >= (uint64_t)cfg->heartbeat_ms)
            colld__tcp_heartbeat(c, colld_now_ns(), 0);
    }
    for (colld_net_peer_t *p = n->peers; p; p = p->next) { /* the list changes only on this thread */
        uint64_t dt = since(now, p->rate_t0_ms);
        if (dt < 1000)
            continue;
        tcp_sample_t ts = tcp_sample(p);
        pthread_mutex_lock(&n->lock);
        p->tcp_rtt_us = ts.rtt_us;
        p->tcp_rttvar_us = ts.rttvar_us;
        p->tcp_lost = ts.lost;
        p->retrans += ts.retrans;
        p->send_rate = (double)(p->bytes_sent - p->rate_sent0) * 1000.0 / (double)dt;
        p->recv_rate = (double)(p->bytes_received - p->rate_recv0) * 1000.0 / (double)dt;
        p->rate_sent0 = p->bytes_sent;
        p->rate_recv0 = p->bytes_received;
        p->rate_t0_ms = now;
        pthread_mutex_unlock(&n->lock);
    }
    colld__tcp_refuse_log_flush(n, now);
    if (n->listen_paused && now >= n->listen_resume_ms) {
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &n->lfd };
        if (epoll_ctl(n->epfd, EPOLL_CTL_ADD, n->lfd, &ev) == 0)
            n->listen_paused = false;
        else
            n->listen_resume_ms = now + 100;
    }
}

/* Whether lost peer p may be freed now (tcp.h): nothing queued, no connection of it left, lost
 * for the linger time or one of too many lost records, and unused by the owner (asked at most
 * once a second per peer). */
static bool peer_reapable(colld_net_t *n, colld_net_peer_t *p, uint64_t now)
{
    if (p->state != PEER_LOST || p->loss_pending || p->pending.head || !n->cfg.cb.peer_unused)
        return false;
    if (now < p->lost_ms + (uint64_t)n->cfg.peer_linger_ms && n->nlost <= TCP_MAX_LOST_PEERS)
        return false;
    if (p->unused_check_ms && now < p->unused_check_ms + 1000)
        return false;
    p->unused_check_ms = now;
    for (conn_t *c = n->conns; c; c = c->next)
        if (c->peer == p)
            return false;
    return n->cfg.cb.peer_unused(n->cfg.cb.arg, p);
}

/* Free the lost peers nobody uses any more (after reap() freed their closed connections). */
static void reap_peers(colld_net_t *n)
{
    if (n->nlost == 0)
        return;
    uint64_t now = colld_now_ms();
    colld_net_peer_t *prev = NULL, *p = n->peers;
    while (p) {
        colld_net_peer_t *next = p->next;
        if (!peer_reapable(n, p, now)) {
            prev = p;
            p = next;
            continue;
        }
        pthread_mutex_lock(&n->lock);
        if (prev)
            prev->next = next;
        else
            n->peers = next;
        if (n->peers_tail == p)
            n->peers_tail = prev;
        n->nlost--;
        n->npeers--;
        pthread_mutex_unlock(&n->lock);
        LOG_DEBUG(NET, "forgot lost peer %s", p->addr);
        free(p);
        p = next;
    }
}

/* Free the connections closed during this iteration, then the peers nobody uses any more. */
static void reap(colld_net_t *n)
{
    conn_t **pp = &n->conns;
    while (*pp) {
        conn_t *c = *pp;
        if (c->closed) {
            *pp = c->next;
            colld__tcp_conn_free(c);
        } else {
            pp = &c->next;
        }
    }
    reap_peers(n);
}

/* How long epoll may sleep: until the next tick or timer, not at all with work pending. */
static int loop_timeout(colld_net_t *n)
{
    if (n->flush_needed || n->loss_pending)
        return 0;
    uint64_t now = colld_now_ms();
    uint64_t until = COLLD_MIN(n->last_tick_ms + TICK_MS, n->next_timer_ms);
    return until > now ? (int)(until - now) : 0;
}

/* The network thread: events, then requests from other threads, timers, deferred losses, tick(),
 * and the writes everything above queued; closed connections are freed last. */
static void *net_thread(void *arg)
{
    colld_net_t *n = arg;
    const colld_net_callbacks_t *cb = &n->cfg.cb;
    struct epoll_event ev[EPOLL_BATCH];
    while (!atomic_load(&n->stopping)) {
        int nev = epoll_wait(n->epfd, ev, EPOLL_BATCH, loop_timeout(n));
        if (nev < 0) {
            char why[TCP_WHY_LEN];
            if (errno != EINTR) {
                colld__tcp_sys_msg(why, sizeof(why), "network thread: epoll_wait", errno);
                LOG_ERROR(NET, "%s", why);
            }
            nev = 0;
        }
        bool woken = false;
        for (int i = 0; i < nev && !atomic_load(&n->stopping); i++) {
            void *ptr = ev[i].data.ptr;
            if (ptr == &n->lfd) {
                accept_all(n);
            } else if (ptr == &n->wfd) {
                uint64_t v;
                woken = read(n->wfd, &v, sizeof(v)) >= 0 || woken;
            } else if (*(unsigned *)ptr == EV_PATH) {
                path_t *pa = ptr;
                pa->ops->event(pa->link);
            } else {
                colld__tcp_conn_event(ptr, ev[i].events);
            }
        }
        if (atomic_load(&n->stopping))
            break;
        if (woken)
            process_inbox(n);
        uint64_t now = colld_now_ms();
        if (now >= n->next_timer_ms)
            timers(n, now);
        run_pending_losses(n);
        if (woken || since(now, n->last_tick_ms) >= TICK_MS) {
            n->last_tick_ms = now;
            if (cb->tick && !atomic_load(&n->stopping))
                cb->tick(cb->arg);
            run_pending_losses(n);
        }
        if (!atomic_load(&n->stopping))
            colld__tcp_flush_dirty(n);
        reap(n);
    }
    return NULL;
}

/* ============================================================================================
 * Start and stop
 * ========================================================================================== */

/* Free everything; no callback runs. Safe on a partly built object (fds -1, lists empty). */
static void net_free(colld_net_t *n)
{
    while (n->conns) {
        conn_t *c = n->conns;
        n->conns = c->next;
        colld__tcp_conn_free(c);
    }
    while (n->peers) {
        colld_net_peer_t *p = n->peers;
        n->peers = p->next;
        colld__tcp_q_release(&p->pending, false, false);
        path_close(p, false);
        free(p);
    }
    while (n->inbox) {
        request_t *r = n->inbox;
        n->inbox = r->next;
        free(r->msg);
        free(r);
    }
    if (n->lfd >= 0)
        close(n->lfd);
    if (n->epfd >= 0)
        close(n->epfd);
    if (n->wfd >= 0)
        close(n->wfd);
    if (n->secret) {
        memset(n->secret, 0, n->cfg.secret_len);
        free(n->secret);
    }
    pthread_mutex_destroy(&n->lock);
    free(n);
}

/* Check the configuration; returns 0 or -1 with the reason in err. */
static int check_config(const colld_net_config_t *cfg, char *err, size_t err_len)
{
    if (!cfg->node_name || !cfg->node_name[0] || strlen(cfg->node_name) >= COLLD_NET_NAME_LEN) {
        colld_set_err(err, err_len, "node name must have 1 to %d characters", COLLD_NET_NAME_LEN - 1);
        return -1;
    }
    for (const char *s = cfg->node_name; *s; s++) {
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) {
            colld_set_err(err, err_len, "node name '%s' must be printable ASCII", cfg->node_name);
            return -1;
        }
    }
    if (!cfg->listen_addr || strlen(cfg->listen_addr) >= COLLD_NET_ADDR_LEN - 8) {
        colld_set_err(err, err_len, "listen address missing or longer than %d characters", COLLD_NET_ADDR_LEN - 9);
        return -1;
    }
    if (!cfg->secret || cfg->secret_len < 16) {
        colld_set_err(err, err_len, "the cluster secret must have at least 16 bytes (it has %zu)",
                      cfg->secret ? cfg->secret_len : 0);
        return -1;
    }
    if (cfg->conns_per_peer < 1 || cfg->conns_per_peer > TCP_MAX_CONNS_CFG) {
        colld_set_err(err, err_len, "connections per peer must be 1 to %d (not %d)", TCP_MAX_CONNS_CFG,
                      cfg->conns_per_peer);
        return -1;
    }
    if (cfg->heartbeat_ms < 1 || cfg->heartbeat_misses < 1 || cfg->handshake_ms < 0 || cfg->stranger_ms < 0 ||
        cfg->peer_linger_ms < 0) {
        colld_set_err(err, err_len, "heartbeat interval and misses must be at least 1, the handshake timeouts and "
                                    "the peer linger >= 0");
        return -1;
    }
    if (cfg->chunk_bytes < 1 || cfg->chunk_bytes > UINT32_MAX) {
        colld_set_err(err, err_len, "chunk size must be 1 byte to 4 GiB - 1 (not %zu)", cfg->chunk_bytes);
        return -1;
    }
    return 0;
}

/* Bind and listen on n->cfg.listen_addr; fills n->lfd and n->addr. */
static int open_listener(colld_net_t *n, char *err, size_t err_len)
{
    const char *text = n->cfg.listen_addr;
    char host[COLLD_NET_ADDR_LEN], port[8], why[TCP_WHY_LEN];
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    if (split_addr(text, host, sizeof(host), port, sizeof(port), err, err_len) < 0 ||
        resolve(text, true, &ss, &sl, err, err_len) < 0)
        return -1;
    int one = 1;
    n->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (n->lfd < 0 || setsockopt(n->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(n->lfd, (struct sockaddr *)&ss, sl) < 0 || listen(n->lfd, SOMAXCONN) < 0) {
        colld_set_err(why, sizeof(why), "cannot listen on %s%s", text,
                      errno == EADDRINUSE ? " (choose another port, or 0 for any free one)" : "");
        colld__tcp_sys_msg(err, err_len, why, errno);
        return -1;
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof(bound);
    if (getsockname(n->lfd, (struct sockaddr *)&bound, &bl) < 0) {
        colld__tcp_sys_msg(err, err_len, "getsockname", errno);
        return -1;
    }
    unsigned bport = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                       : ((struct sockaddr_in *)&bound)->sin_port);
    if (strchr(host, ':'))
        colld_set_err(n->addr, sizeof(n->addr), "[%s]:%u", host, bport);
    else
        colld_set_err(n->addr, sizeof(n->addr), "%s:%u", host, bport);
    return 0;
}

/* Build a colld_net_t: checked configuration, copies, epoll and eventfd; with `listen`, the
 * listening socket (else the listen address is taken as given: a detached net). No thread. */
static int net_create(const colld_net_config_t *cfg, bool listen, colld_net_t **out, char *err, size_t err_len)
{
    colld_net_t *n = NULL;
    *out = NULL;
    if (check_config(cfg, err, err_len) < 0)
        return -1;
    n = calloc(1, sizeof(*n));
    if (!n) {
        colld_set_err(err, err_len, "out of memory");
        return -1;
    }
    n->lfd = n->epfd = n->wfd = -1;
    pthread_mutex_init(&n->lock, NULL);
    atomic_init(&n->stopping, false);
    n->inbox_tail = &n->inbox;
    n->cfg = *cfg;
    colld_strlcpy(n->name, cfg->node_name, sizeof(n->name));
    n->cfg.node_name = n->name;
    if (cfg->handshake_ms == 0)
        n->cfg.handshake_ms = HANDSHAKE_MS_DEFAULT;
    if (cfg->stranger_ms == 0)
        n->cfg.stranger_ms = STRANGER_MS_DEFAULT;
    if (cfg->peer_linger_ms == 0)
        n->cfg.peer_linger_ms = PEER_LINGER_MS_DEFAULT;
    n->timer_period_ms = (uint64_t)COLLD_MIN(TICK_MS, COLLD_MAX(1, cfg->heartbeat_ms / 4));
    n->secret = malloc(cfg->secret_len);
    if (!n->secret) {
        colld_set_err(err, err_len, "out of memory");
        goto fail;
    }
    memcpy(n->secret, cfg->secret, cfg->secret_len);
    n->cfg.secret = n->secret;
    if (listen && open_listener(n, err, err_len) < 0)
        goto fail;
    if (!listen)
        colld_strlcpy(n->addr, cfg->listen_addr, sizeof(n->addr));
    n->cfg.listen_addr = n->addr;
    n->epfd = epoll_create1(EPOLL_CLOEXEC);
    n->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event lev = { .events = EPOLLIN, .data.ptr = &n->lfd };
    struct epoll_event wev = { .events = EPOLLIN, .data.ptr = &n->wfd };
    if (n->epfd < 0 || n->wfd < 0 || (listen && epoll_ctl(n->epfd, EPOLL_CTL_ADD, n->lfd, &lev) < 0) ||
        epoll_ctl(n->epfd, EPOLL_CTL_ADD, n->wfd, &wev) < 0) {
        colld__tcp_sys_msg(err, err_len, "cannot set up the network thread's epoll", errno);
        goto fail;
    }
    n->last_tick_ms = n->next_timer_ms = colld_now_ms();
    if (colld_random_bytes(&n->last_session, sizeof(n->last_session)) < 0)
        n->last_session = colld_now_ns(); /* sessions only need to differ from a restart's */
    *out = n;
    return 0;
fail:
    net_free(n);
    return -1;
}

int colld_net_start(const colld_net_config_t *cfg, colld_net_t **out, char *err, size_t err_len)
{
    colld_net_t *n;
    *out = NULL;
    if (net_create(cfg, true, &n, err, err_len) < 0)
        return -1;
    /* *out before the thread starts: its first tick may read the caller's pointer (links.c). */
    *out = n;
    n->thread_started = true;
    int rc = pthread_create(&n->thread, NULL, net_thread, n);
    if (rc != 0) {
        colld__tcp_sys_msg(err, err_len, "cannot start the network thread", rc);
        *out = NULL;
        n->thread_started = false;
        net_free(n);
        return -1;
    }
    pthread_setname_np(n->thread, "colld-net");
    LOG_INFO(NET, "listening for peers on %s as %s", n->addr, n->name);
    return 0;
}

int colld__tcp_net_detached(const colld_net_config_t *cfg, colld_net_t **out, char *err, size_t err_len)
{
    return net_create(cfg, false, out, err, err_len);
}

void colld__tcp_net_step(colld_net_t *n)
{
    uint64_t v;
    if (read(n->wfd, &v, sizeof(v)) > 0)
        process_inbox(n);
    run_pending_losses(n);
    if (n->cfg.cb.tick)
        n->cfg.cb.tick(n->cfg.cb.arg);
    run_pending_losses(n);
    colld__tcp_flush_dirty(n);
    reap(n);
}

void colld_net_stop(colld_net_t *n)
{
    if (!n)
        return;
    if (n->thread_started) {
        atomic_store(&n->stopping, true);
        colld_net_wake(n);
        pthread_join(n->thread, NULL);
    }
    net_free(n);
}

/* ============================================================================================
 * Public calls from any thread
 * ========================================================================================== */

const char *colld_net_listen_addr(const colld_net_t *n)
{
    return n->addr;
}

void colld_net_wake(colld_net_t *n)
{
    uint64_t one = 1;
    char why[TCP_WHY_LEN];
    if (write(n->wfd, &one, sizeof(one)) < 0 && errno != EAGAIN) { /* EAGAIN: a wake is pending */
        colld__tcp_sys_msg(why, sizeof(why), "cannot wake the network thread", errno);
        LOG_WARN(NET, "%s", why);
    }
}

/* Queue a request for the net thread and wake it. */
static void post_request(colld_net_t *n, request_t *r)
{
    r->next = NULL;
    pthread_mutex_lock(&n->lock);
    *n->inbox_tail = r;
    n->inbox_tail = &r->next;
    pthread_mutex_unlock(&n->lock);
    colld_net_wake(n);
}

int colld_net_post_ctrl(colld_net_t *n, const char *addr, const void *payload, size_t len)
{
    if (!n || !addr || len > COLLD_NET_CTRL_MAX || (len && !payload))
        return -1;
    size_t alen = strlen(addr);
    request_t *r = malloc(sizeof(*r) + alen + 1);
    msg_t *m = colld__tcp_msg_new(TCP_CTRL, NULL, payload, len, true);
    if (!r || !m) {
        free(r);
        free(m);
        return -1;
    }
    r->kind = REQ_CTRL;
    r->msg = m;
    memcpy(r->target, addr, alen + 1);
    post_request(n, r);
    return 0;
}

int colld_net_disconnect(colld_net_t *n, const char *name_or_addr)
{
    if (!n || !name_or_addr || !name_or_addr[0])
        return -1;
    bool found = false;
    pthread_mutex_lock(&n->lock);
    for (colld_net_peer_t *p = n->peers; p && !found; p = p->next)
        found = p->state == PEER_UP && (strcmp(p->addr, name_or_addr) == 0 || strcmp(p->name, name_or_addr) == 0);
    pthread_mutex_unlock(&n->lock);
    if (!found)
        return -1;
    size_t len = strlen(name_or_addr);
    request_t *r = malloc(sizeof(*r) + len + 1);
    if (!r)
        return -1;
    r->kind = REQ_DISCONNECT;
    r->msg = NULL;
    memcpy(r->target, name_or_addr, len + 1);
    post_request(n, r);
    return 0;
}

size_t colld_net_peers(colld_net_t *n, colld_net_peer_info_t *out, size_t max)
{
    size_t count = 0;
    pthread_mutex_lock(&n->lock);
    for (colld_net_peer_t *p = n->peers; p; p = p->next, count++) {
        if (count >= max)
            continue;
        colld_net_peer_info_t *i = &out[count];
        memset(i, 0, sizeof(*i));
        colld_strlcpy(i->name, p->name, sizeof(i->name));
        colld_strlcpy(i->addr, p->addr, sizeof(i->addr));
        i->state = peer_state_names[p->state];
        i->conns = p->nconns;
        i->bytes_sent = p->bytes_sent;
        i->bytes_received = p->bytes_received;
        i->send_rate = p->send_rate;
        i->recv_rate = p->recv_rate;
        colld_strlcpy(i->last_error, p->last_error, sizeof(i->last_error));
        i->tx_rate = p->tx_rate;
        i->rx_rate = colld__tcp_rx_rate(p);
        i->rx_bytes = p->rx_bytes;
        i->rx_busy_ns = p->rx_busy_ns;
        i->rtt_ms = p->rtt_ms;
        i->rtt_samples = p->rtt_samples;
        i->tcp_rtt_us = p->tcp_rtt_us;
        i->tcp_rttvar_us = p->tcp_rttvar_us;
        i->tcp_lost = p->tcp_lost;
        i->retrans = p->retrans;
        i->losses = p->losses;
        colld_strlcpy(i->transport, p->path.ops ? p->path.ops->name : "tcp", sizeof(i->transport));
        colld_strlcpy(i->transport_note, p->transport_note, sizeof(i->transport_note));
    }
    pthread_mutex_unlock(&n->lock);
    return count;
}

uint64_t colld_net_refused(colld_net_t *n)
{
    pthread_mutex_lock(&n->lock);
    uint64_t r = n->refused;
    pthread_mutex_unlock(&n->lock);
    return r;
}

/* ============================================================================================
 * Public calls from the network thread
 * ========================================================================================== */

colld_net_peer_t *colld_net_peer_find(colld_net_t *n, const char *addr)
{
    return addr ? colld__tcp_peer_find(n, addr) : NULL;
}

void colld_net_peer_drop(colld_net_peer_t *p, const char *why)
{
    if (p)
        schedule_loss(p, why);
}

colld_net_peer_t *colld_net_peer_get(colld_net_t *n, const char *addr)
{
    colld_net_peer_t *p = colld__tcp_peer_find(n, addr);
    if (!p) {
        if (!(p = colld__tcp_peer_new(n, addr)))
            return NULL;
        peer_connect(p);
    } else if (p->state == PEER_LOST) {
        peer_connect(p);
    }
    return p;
}

/* Queue m to p: on its connection if up, else until it is (connecting to it if it was lost). */
static void peer_queue(colld_net_peer_t *p, msg_t *m)
{
    if (p->state == PEER_UP) {
        colld__tcp_conn_send(p->conns[m->data ? m->hint % (unsigned)p->nconns : 0], m);
        return;
    }
    colld__tcp_q_push(&p->pending, m);
    if (p->state == PEER_LOST)
        peer_connect(p);
}

int colld_net_send_ctrl(colld_net_peer_t *p, const void *payload, size_t len)
{
    if (!p || len > COLLD_NET_CTRL_MAX || (len && !payload))
        return -1;
    msg_t *m = colld__tcp_msg_new(TCP_CTRL, NULL, payload, len, true);
    if (!m)
        return -1;
    peer_queue(p, m);
    return 0;
}

int colld_net_send_data(colld_net_peer_t *p, const colld_net_hdr_t *h, const void *payload, unsigned conn_hint,
                        void (*done)(void *cookie, bool ok), void *cookie)
{
    if (!p || !h || h->len > p->net->cfg.chunk_bytes || (h->len && !payload) || p->state == PEER_LOST)
        return -1;
    if (p->path.ops && p->state == PEER_UP) {
        if (p->path.ops->send(p->path.link, h, payload, done, cookie) < 0)
            return -1;
        pthread_mutex_lock(&p->net->lock);
        p->bytes_sent += h->len + TCP_HDR_LEN;
        pthread_mutex_unlock(&p->net->lock);
        return 0;
    }
    msg_t *m = colld__tcp_msg_new(TCP_DATA, h, payload, h->len, false);
    if (!m)
        return -1;
    m->hint = conn_hint;
    m->done = done;
    m->cookie = cookie;
    peer_queue(p, m);
    return 0;
}

const char *colld_net_peer_addr(const colld_net_peer_t *p)
{
    return p->addr;
}

const char *colld_net_peer_name(const colld_net_peer_t *p)
{
    return p->name;
}

bool colld_net_peer_is_up(const colld_net_peer_t *p)
{
    return p->state == PEER_UP;
}

bool colld_net_peer_is_lost(const colld_net_peer_t *p)
{
    return p->state == PEER_LOST;
}

int colld_net_peer_set_path(colld_net_peer_t *p, const colld_net_path_ops_t *ops, void *link, char *err, size_t err_len)
{
    if (p->state != PEER_UP || p->path.ops) {
        colld_set_err(err, err_len, "peer %s is %s", p->addr, p->path.ops ? "on a path already" : "not up");
        return -1;
    }
    int fd = ops->fd(link);
    path_t *pa = &p->path;
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = pa };
    if (fd < 0 || epoll_ctl(p->net->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        colld_set_err(err, err_len, "cannot poll the %s path's fd: %s", ops->name, strerror(errno));
        return -1;
    }
    pthread_mutex_lock(&p->net->lock);
    *pa = (path_t){ .ev_kind = EV_PATH, .peer = p, .ops = ops, .link = link, .fd = fd };
    p->transport_note[0] = '\0';
    pthread_mutex_unlock(&p->net->lock);
    return 0;
}

void *colld_net_peer_path(const colld_net_peer_t *p)
{
    return p->path.ops ? p->path.link : NULL;
}

void colld_net_peer_set_note(colld_net_peer_t *p, const char *note)
{
    pthread_mutex_lock(&p->net->lock);
    colld_strlcpy(p->transport_note, note, sizeof(p->transport_note));
    pthread_mutex_unlock(&p->net->lock);
}

void colld_net_deliver(colld_net_peer_t *p, const colld_net_hdr_t *h, void *payload)
{
    const colld_net_callbacks_t *cb = &p->net->cfg.cb;
    pthread_mutex_lock(&p->net->lock);
    p->bytes_received += h->len + TCP_HDR_LEN;
    pthread_mutex_unlock(&p->net->lock);
    void *dest = cb->data_dest ? cb->data_dest(cb->arg, p, h) : NULL;
    if (dest && h->len) {
        memcpy(dest, payload, h->len);
        payload = dest;
    }
    if (cb->data)
        cb->data(cb->arg, p, h, payload);
}

void colld_net_peer_set_user(colld_net_peer_t *p, void *user)
{
    p->user = user;
}

void *colld_net_peer_user(const colld_net_peer_t *p)
{
    return p->user;
}
