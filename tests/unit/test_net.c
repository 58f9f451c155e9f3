/*
 * test_net.c - the TCP transport (transport/tcp/tcp.h) over real sockets on 127.0.0.1: CTRL
 * both ways in order, DATA striped over several connections into caller and transport buffers,
 * a wrong secret refused on both sides, strangers (garbage, a bad frame, silence, a HELLO with an
 * address nobody could dial) refused without disturbing an established peer, a flood of silent
 * strangers from one address evicting itself (and logged once), lost peer records freed when the
 * owner no longer uses them, a peer that reads nothing dropped before its queue grows without
 * bound, loss on stop, on heartbeat silence and on an operator's disconnect, address and argument
 * checks, and stop with messages still queued.
 *
 * Every wait has a deadline; work that must run on the network thread is handed to its tick().
 */
#include "transport/tcp/tcp.h"

#include "common/log.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define CHUNK (256u * 1024u)
#define NDATA 64
#define MAXCTRL 256
#define WAIT_MS 5000

static const uint8_t secret_a[] = "cluster-secret-number-one-0123456789";
static const uint8_t secret_b[] = "another-cluster-secret-9876543210";

/* One colld_net_t and what its callbacks saw (under mu). */
typedef struct node node_t;
struct node {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    colld_net_t *net;
    char addr[COLLD_NET_ADDR_LEN];
    int up, lost;
    char up_name[COLLD_NET_NAME_LEN];
    char lost_why[256];
    /* CTRL */
    int nctrl;
    char ctrl[MAXCTRL][32];
    bool echo; /* answer every CTRL from within ctrl() */
    int nbig;  /* CTRL messages of COLLD_NET_CTRL_MAX bytes, all 'Z' */
    int lost_done_fail; /* done_fail when peer_lost ran */
    /* DATA */
    uint8_t *dest;      /* caller buffers for even xids (NDATA * CHUNK) */
    int seen[NDATA];
    int ndata, bad_data, placed;
    bool ack;           /* answer every DATA with a CTRL "ack" from within data() */
    int done_ok, done_fail;
    /* Work for the network thread. */
    void (*job)(node_t *nd, void *arg);
    void *job_arg;
    bool job_done;
    bool pause, paused; /* tick() blocks while pause is set */
    int errors;         /* failed checks on the network thread (cmocka asserts only on ours) */
    bool may_free;      /* peer_unused() answers this */
    int unused_asked;   /* peer_unused() calls */
};

/* Count a failed check made on the network thread. */
static void net_check(node_t *nd, bool ok)
{
    if (ok)
        return;
    pthread_mutex_lock(&nd->mu);
    nd->errors++;
    pthread_mutex_unlock(&nd->mu);
}

static void node_lock(node_t *nd)
{
    pthread_mutex_lock(&nd->mu);
}

static void node_signal_unlock(node_t *nd)
{
    pthread_cond_broadcast(&nd->cv);
    pthread_mutex_unlock(&nd->mu);
}

/* Wait on nd->cv for at most ms (nd->mu held). */
static void node_wait(node_t *nd, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&nd->cv, &nd->mu, &ts);
}

/* Wait until expr (evaluated with nd->mu held) or WAIT_MS; ok gets the result. */
#define WAIT_FOR(ok, nd, expr)                                                                     \
    do {                                                                                           \
        uint64_t dl_ = colld_now_ms() + WAIT_MS;                                                   \
        node_lock(nd);                                                                             \
        while (!(expr) && colld_now_ms() < dl_)                                                    \
            node_wait(nd, 10);                                                                     \
        (ok) = (expr);                                                                             \
        pthread_mutex_unlock(&(nd)->mu);                                                           \
    } while (0)

static uint8_t pattern(uint64_t xid, size_t i)
{
    return (uint8_t)(xid * 31u + i * 7u + (i >> 8));
}

/* ============================================================================================
 * Callbacks
 * ========================================================================================== */

static void cb_peer_up(void *arg, colld_net_peer_t *p)
{
    node_t *nd = arg;
    node_lock(nd);
    nd->up++;
    colld_strlcpy(nd->up_name, colld_net_peer_name(p), sizeof(nd->up_name));
    node_signal_unlock(nd);
}

static void cb_peer_lost(void *arg, colld_net_peer_t *p, const char *why)
{
    node_t *nd = arg;
    (void)p;
    node_lock(nd);
    nd->lost++;
    nd->lost_done_fail = nd->done_fail;
    colld_strlcpy(nd->lost_why, why, sizeof(nd->lost_why));
    node_signal_unlock(nd);
}

static void *cb_data_dest(void *arg, colld_net_peer_t *p, const colld_net_hdr_t *h)
{
    node_t *nd = arg;
    (void)p;
    if (!nd->dest || h->xid >= NDATA || h->xid % 2)
        return NULL;
    return nd->dest + h->xid * CHUNK;
}

static void cb_data(void *arg, colld_net_peer_t *p, const colld_net_hdr_t *h, void *payload)
{
    node_t *nd = arg;
    const uint8_t *b = payload;
    bool ok = h->xid < NDATA && h->seq == h->xid + 1000 && h->offset == h->xid * 3 && h->step == (uint16_t)h->xid &&
              h->phase == 2 && h->flags == 5;
    for (size_t i = 0; ok && i < h->len; i++)
        ok = b[i] == pattern(h->xid, i);
    node_lock(nd);
    if (ok) {
        nd->seen[h->xid]++;
        if (nd->dest && h->xid % 2 == 0 && b == nd->dest + h->xid * CHUNK)
            nd->placed++;
    } else {
        nd->bad_data++;
    }
    nd->ndata++;
    bool ack = nd->ack;
    node_signal_unlock(nd);
    if (ack)
        net_check(nd, colld_net_send_ctrl(p, "ack", 3) == 0);
}

static void cb_ctrl(void *arg, colld_net_peer_t *p, const void *payload, size_t len)
{
    node_t *nd = arg;
    char msg[32], reply[40];
    if (len == COLLD_NET_CTRL_MAX) {
        const uint8_t *b = payload;
        bool all = true;
        for (size_t i = 0; i < len && all; i++)
            all = b[i] == 'Z';
        node_lock(nd);
        nd->nbig += all;
        node_signal_unlock(nd);
        return;
    }
    colld_strlcpy(msg, payload, COLLD_MIN(len + 1, sizeof(msg)));
    node_lock(nd);
    if (nd->nctrl < MAXCTRL)
        colld_strlcpy(nd->ctrl[nd->nctrl++], msg, sizeof(nd->ctrl[0]));
    bool echo = nd->echo;
    node_signal_unlock(nd);
    if (echo) {
        int n = snprintf(reply, sizeof(reply), "re:%s", msg);
        net_check(nd, colld_net_send_ctrl(p, reply, (size_t)n) == 0);
    }
}

static void cb_tick(void *arg)
{
    node_t *nd = arg;
    node_lock(nd);
    void (*job)(node_t *, void *) = nd->job;
    void *job_arg = nd->job_arg;
    nd->job = NULL;
    pthread_mutex_unlock(&nd->mu);
    if (job) {
        job(nd, job_arg);
        node_lock(nd);
        nd->job_done = true;
        node_signal_unlock(nd);
    }
    node_lock(nd);
    if (nd->pause) {
        nd->paused = true;
        pthread_cond_broadcast(&nd->cv);
        while (nd->pause)
            node_wait(nd, 10);
        nd->paused = false;
    }
    pthread_mutex_unlock(&nd->mu);
}

static bool cb_peer_unused(void *arg, colld_net_peer_t *p)
{
    node_t *nd = arg;
    (void)p;
    node_lock(nd);
    nd->unused_asked++;
    bool ok = nd->may_free;
    node_signal_unlock(nd);
    return ok;
}

static void cb_done(void *cookie, bool ok)
{
    node_t *nd = cookie;
    node_lock(nd);
    if (ok)
        nd->done_ok++;
    else
        nd->done_fail++;
    node_signal_unlock(nd);
}

/* ============================================================================================
 * Helpers
 * ========================================================================================== */

typedef struct {
    const uint8_t *secret;
    int conns, heartbeat_ms, misses, handshake_ms, stranger_ms, linger_ms;
    bool unused_cb; /* install peer_unused (cb_peer_unused) */
} node_opts_t;

static node_t *node_start(const char *name, node_opts_t o)
{
    node_t *nd = calloc(1, sizeof(*nd));
    assert_non_null(nd);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&nd->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&nd->mu, NULL);
    colld_net_config_t cfg = {
        .node_name = name,
        .listen_addr = "127.0.0.1:0",
        .secret = o.secret ? o.secret : secret_a,
        .secret_len = 32,
        .conns_per_peer = o.conns ? o.conns : 1,
        .heartbeat_ms = o.heartbeat_ms ? o.heartbeat_ms : 200,
        .heartbeat_misses = o.misses ? o.misses : 5,
        .chunk_bytes = CHUNK,
        .handshake_ms = o.handshake_ms,
        .stranger_ms = o.stranger_ms,
        .peer_linger_ms = o.linger_ms,
        .cb = { .peer_up = cb_peer_up,
                .peer_lost = cb_peer_lost,
                .data_dest = cb_data_dest,
                .data = cb_data,
                .ctrl = cb_ctrl,
                .tick = cb_tick,
                .peer_unused = o.unused_cb ? cb_peer_unused : NULL,
                .arg = nd },
    };
    char err[256] = "";
    int rc = colld_net_start(&cfg, &nd->net, err, sizeof(err));
    if (rc != 0)
        fail_msg("colld_net_start: %s", err);
    colld_strlcpy(nd->addr, colld_net_listen_addr(nd->net), sizeof(nd->addr));
    assert_non_null(strstr(nd->addr, "127.0.0.1:"));
    assert_string_not_equal(nd->addr, "127.0.0.1:0");
    return nd;
}

static void node_free(node_t *nd)
{
    if (!nd)
        return;
    colld_net_stop(nd->net);
    assert_int_equal(nd->errors, 0);
    free(nd->dest);
    pthread_cond_destroy(&nd->cv);
    pthread_mutex_destroy(&nd->mu);
    free(nd);
}

/* Run fn(nd, arg) on nd's network thread (from tick()) and wait for it. */
static void run_on_net(node_t *nd, void (*fn)(node_t *, void *), void *arg)
{
    bool ok;
    node_lock(nd);
    nd->job = fn;
    nd->job_arg = arg;
    nd->job_done = false;
    pthread_mutex_unlock(&nd->mu);
    colld_net_wake(nd->net);
    WAIT_FOR(ok, nd, nd->job_done);
    assert_true(ok);
}

/* The peer at addr as nd's snapshot shows it; false if absent. */
static bool peer_info(node_t *nd, const char *addr, colld_net_peer_info_t *out)
{
    colld_net_peer_info_t info[8];
    size_t n = colld_net_peers(nd->net, info, 8);
    for (size_t i = 0; i < n && i < 8; i++) {
        if (strcmp(info[i].addr, addr) == 0) {
            *out = info[i];
            return true;
        }
    }
    return false;
}

/* Poll nd's snapshot until the peer at addr is up with at least conns connections. */
static bool wait_peer_conns(node_t *nd, const char *addr, int conns)
{
    uint64_t dl = colld_now_ms() + WAIT_MS;
    colld_net_peer_info_t pi;
    do {
        if (peer_info(nd, addr, &pi) && strcmp(pi.state, "up") == 0 && pi.conns >= conns)
            return true;
        node_lock(nd);
        node_wait(nd, 5);
        pthread_mutex_unlock(&nd->mu);
    } while (colld_now_ms() < dl);
    return false;
}

static bool wait_refused(node_t *nd, uint64_t at_least)
{
    uint64_t dl = colld_now_ms() + WAIT_MS;
    while (colld_net_refused(nd->net) < at_least && colld_now_ms() < dl) {
        node_lock(nd);
        node_wait(nd, 5);
        pthread_mutex_unlock(&nd->mu);
    }
    return colld_net_refused(nd->net) >= at_least;
}

/* A plain TCP connection to "127.0.0.1:PORT". */
static int raw_connect(const char *addr)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };
    sa.sin_port = htons((uint16_t)atoi(strrchr(addr, ':') + 1));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* True once the other side closed fd (EOF or reset) within WAIT_MS. */
static bool raw_wait_closed(int fd)
{
    uint64_t dl = colld_now_ms() + WAIT_MS;
    char buf[512];
    while (colld_now_ms() < dl) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        if (poll(&pfd, 1, 20) <= 0)
            continue;
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN))
            return true;
    }
    return false;
}

/* A port nothing listens on (bound, then released). */
static void closed_port_addr(char *out, size_t len)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(out, len, "127.0.0.1:%u", ntohs(sa.sin_port));
    close(fd);
}

/* Send "hello" from a to b and wait for it (b must echo nothing). */
static void ctrl_roundtrip(node_t *a, node_t *b, const char *text)
{
    bool ok;
    node_lock(b);
    int before = b->nctrl;
    pthread_mutex_unlock(&b->mu);
    assert_int_equal(colld_net_post_ctrl(a->net, b->addr, text, strlen(text)), 0);
    WAIT_FOR(ok, b, b->nctrl > before && strcmp(b->ctrl[b->nctrl - 1], text) == 0);
    assert_true(ok);
}

/* ============================================================================================
 * Tests
 * ========================================================================================== */

/* CTRL messages both ways keep their order; replies are sent from within ctrl(). */
static void test_ctrl_both_ways(void **state)
{
    (void)state;
    node_t *a = node_start("alpha", (node_opts_t){ .conns = 2 });
    node_t *b = node_start("beta", (node_opts_t){ 0 });
    bool ok;
    b->echo = true;
    char msg[32];
    for (int i = 0; i < 100; i++) {
        int n = snprintf(msg, sizeof(msg), "m%d", i);
        assert_int_equal(colld_net_post_ctrl(a->net, b->addr, msg, (size_t)n), 0);
    }
    WAIT_FOR(ok, a, a->nctrl == 100);
    assert_true(ok);
    node_lock(b);
    for (int i = 0; i < 100; i++) {
        snprintf(msg, sizeof(msg), "m%d", i);
        assert_string_equal(b->ctrl[i], msg);
    }
    assert_int_equal(b->up, 1);
    assert_string_equal(b->up_name, "alpha");
    pthread_mutex_unlock(&b->mu);
    node_lock(a);
    for (int i = 0; i < 100; i++) {
        snprintf(msg, sizeof(msg), "re:m%d", i);
        assert_string_equal(a->ctrl[i], msg);
    }
    assert_int_equal(a->up, 1);
    assert_string_equal(a->up_name, "beta");
    pthread_mutex_unlock(&a->mu);

    /* Both snapshots: up, named, bytes counted, the initiator's two connections used by both. */
    assert_true(wait_peer_conns(a, b->addr, 2));
    assert_true(wait_peer_conns(b, a->addr, 2));
    colld_net_peer_info_t pi;
    assert_true(peer_info(a, b->addr, &pi));
    assert_string_equal(pi.name, "beta");
    assert_true(pi.bytes_sent > 100 * 40 && pi.bytes_received > 100 * 40);
    assert_string_equal(pi.last_error, "");

    /* The largest CTRL message, twice (its buffer is freed after use and made again). */
    uint8_t *big = malloc(COLLD_NET_CTRL_MAX);
    assert_non_null(big);
    memset(big, 'Z', COLLD_NET_CTRL_MAX);
    assert_int_equal(colld_net_post_ctrl(a->net, b->addr, big, COLLD_NET_CTRL_MAX), 0);
    assert_int_equal(colld_net_post_ctrl(a->net, b->addr, big, COLLD_NET_CTRL_MAX), 0);
    free(big);
    WAIT_FOR(ok, b, b->nbig == 2);
    assert_true(ok);

    /* CTRL from b's side too, posted from another thread: it goes over the same peer. */
    b->echo = false;
    ctrl_roundtrip(b, a, "from-beta");
    node_lock(a);
    assert_int_equal(a->lost, 0);
    pthread_mutex_unlock(&a->mu);
    node_free(a);
    node_free(b);
}

typedef struct {
    uint8_t *src[NDATA];
    uint32_t len[NDATA];
    const char *addr;
    int rc_oversized, rc_null;
} data_job_t;

static void job_send_data(node_t *nd, void *arg)
{
    data_job_t *j = arg;
    colld_net_peer_t *p = colld_net_peer_get(nd->net, j->addr);
    net_check(nd, p && colld_net_peer_is_up(p) && strcmp(colld_net_peer_addr(p), j->addr) == 0 &&
                      strcmp(colld_net_peer_name(p), "beta") == 0);
    if (!p)
        return;
    colld_net_peer_set_user(p, j);
    net_check(nd, colld_net_peer_user(p) == j);
    for (unsigned i = 0; i < NDATA; i++) {
        colld_net_hdr_t h = { .phase = 2, .flags = 5, .step = (uint16_t)i, .len = j->len[i], .xid = i,
                              .seq = i + 1000, .offset = i * 3 };
        net_check(nd, colld_net_send_data(p, &h, j->src[i], i, cb_done, nd) == 0);
    }
    colld_net_hdr_t big = { .len = CHUNK + 1 };
    j->rc_oversized = colld_net_send_data(p, &big, j->src[0], 0, cb_done, nd);
    j->rc_null = colld_net_send_ctrl(p, NULL, COLLD_NET_CTRL_MAX + 1);
}

/* DATA striped over four connections lands exactly, in caller buffers (even xids) and in the
 * transport's (odd); every done() runs with ok; an oversized DATA is refused at the call. */
static void test_data_striped(void **state)
{
    (void)state;
    node_t *a = node_start("alpha", (node_opts_t){ .conns = 4 });
    node_t *b = node_start("beta", (node_opts_t){ 0 });
    bool ok;
    b->dest = calloc(NDATA, CHUNK);
    b->ack = true;
    assert_non_null(b->dest);
    ctrl_roundtrip(a, b, "hello");
    assert_true(wait_peer_conns(a, b->addr, 4));

    data_job_t j = { .addr = b->addr };
    uint64_t total = 0;
    for (unsigned i = 0; i < NDATA; i++) {
        j.len[i] = i == 1 ? 0 : i % 4 == 0 ? CHUNK : (uint32_t)((i * 7919u) % CHUNK) + 1;
        j.src[i] = malloc(j.len[i] ? j.len[i] : 1);
        for (size_t k = 0; k < j.len[i]; k++)
            j.src[i][k] = pattern(i, k);
        total += j.len[i];
    }
    run_on_net(a, job_send_data, &j);
    assert_int_equal(j.rc_oversized, -1);
    assert_int_equal(j.rc_null, -1);
    WAIT_FOR(ok, a, a->done_ok == NDATA);
    assert_true(ok);
    WAIT_FOR(ok, b, b->ndata == NDATA);
    assert_true(ok);
    WAIT_FOR(ok, a, a->nctrl == NDATA); /* the acks sent from within data() */
    assert_true(ok);
    node_lock(b);
    assert_int_equal(b->bad_data, 0);
    assert_int_equal(b->placed, NDATA / 2);
    for (int i = 0; i < NDATA; i++)
        assert_int_equal(b->seen[i], 1);
    pthread_mutex_unlock(&b->mu);
    node_lock(a);
    assert_int_equal(a->done_fail, 0);
    assert_int_equal(a->lost, 0);
    pthread_mutex_unlock(&a->mu);
    colld_net_peer_info_t pi;
    assert_true(peer_info(a, b->addr, &pi));
    assert_true(pi.bytes_sent >= total + NDATA * 40);
    assert_int_equal(pi.conns, 4);
    node_free(a);
    node_free(b);
    for (unsigned i = 0; i < NDATA; i++)
        free(j.src[i]);
}

/* Whether a's record of b has tx_rate, an RTT and TCP_INFO's, b's of a an rx_rate (into pa, pb). */
static bool link_measured(node_t *a, node_t *b, colld_net_peer_info_t *pa, colld_net_peer_info_t *pb)
{
    return peer_info(a, b->addr, pa) && peer_info(b, a->addr, pb) && pa->tx_rate > 0 && pa->rtt_samples > 0 &&
           pa->tcp_rtt_us > 0 && pb->rx_rate > 0; /* TCP_INFO: read once a second */
}

/* The link measurements (tcp.h): the receiver times the DATA frames of 64 KiB or more it gets,
 * its rate reaches the sender in heartbeats (the sender's tx_rate), heartbeat echoes give the RTT;
 * TCP_INFO is read. */
static void test_link_measured(void **state)
{
    (void)state;
    node_t *a = node_start("alpha", (node_opts_t){ .conns = 2, .heartbeat_ms = 50 });
    node_t *b = node_start("beta", (node_opts_t){ .heartbeat_ms = 50 });
    bool ok;
    b->dest = calloc(NDATA, CHUNK);
    assert_non_null(b->dest);
    ctrl_roundtrip(a, b, "hello");
    assert_true(wait_peer_conns(a, b->addr, 2));
    colld_net_peer_info_t pa, pb;
    assert_true(peer_info(b, a->addr, &pb));
    assert_true(pb.rx_rate == 0 && pb.rx_bytes == 0); /* nothing timed yet */

    data_job_t j = { .addr = b->addr };
    for (unsigned i = 0; i < NDATA; i++) {
        j.len[i] = CHUNK; /* all timed: >= TCP_RATE_MIN_FRAME */
        j.src[i] = calloc(1, CHUNK);
    }
    run_on_net(a, job_send_data, &j);
    WAIT_FOR(ok, b, b->ndata == NDATA);
    assert_true(ok);
    uint64_t dl = colld_now_ms() + WAIT_MS;
    while (!link_measured(a, b, &pa, &pb) && colld_now_ms() < dl) {
        node_lock(a);
        node_wait(a, 10);
        pthread_mutex_unlock(&a->mu);
    }
    assert_true(link_measured(a, b, &pa, &pb));
    assert_int_equal(pb.rx_bytes, (uint64_t)NDATA * CHUNK);
    assert_true(pb.rx_busy_ns > 0);
    assert_true(pa.tx_rate <= pb.rx_rate + 1 && pa.tx_rate >= pb.rx_rate - 1); /* b's own number */
    assert_true(pa.rtt_ms > 0 && pa.rtt_ms < WAIT_MS);
    assert_int_equal(pa.losses, 0);
    node_free(a);
    node_free(b);
    for (unsigned i = 0; i < NDATA; i++)
        free(j.src[i]);
}

/* Nodes with different secrets refuse each other, whichever side dials. */
static void test_wrong_secret(void **state)
{
    (void)state;
    node_t *a = node_start("alpha", (node_opts_t){ 0 });
    node_t *c = node_start("gamma", (node_opts_t){ .secret = secret_b });
    bool ok;
    assert_int_equal(colld_net_post_ctrl(a->net, c->addr, "x", 1), 0);
    WAIT_FOR(ok, a, a->lost == 1);
    assert_true(ok);
    assert_non_null(strstr(a->lost_why, "authentication"));
    assert_true(wait_refused(c, 1));

    assert_int_equal(colld_net_post_ctrl(c->net, a->addr, "y", 1), 0);
    WAIT_FOR(ok, c, c->lost == 1);
    assert_true(ok);
    assert_non_null(strstr(c->lost_why, "authentication"));
    assert_true(wait_refused(a, 1));

    colld_net_peer_info_t pi;
    assert_true(peer_info(a, c->addr, &pi));
    assert_string_equal(pi.state, "lost");
    assert_non_null(strstr(pi.last_error, "authentication"));
    node_lock(a);
    assert_int_equal(a->up + a->nctrl, 0);
    pthread_mutex_unlock(&a->mu);
    node_lock(c);
    assert_int_equal(c->up + c->nctrl, 0);
    pthread_mutex_unlock(&c->mu);
    node_free(a);
    node_free(c);
}

/* Strangers sending garbage, a frame before the handshake, or an oversized HELLO are refused;
 * the established peer carries on. */
static void test_strangers_refused(void **state)
{
    (void)state;
    node_t *a = node_start("alpha", (node_opts_t){ 0 });
    node_t *b = node_start("beta", (node_opts_t){ 0 });
    ctrl_roundtrip(a, b, "before");

    int fd = raw_connect(b->addr);
    static const char junk[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n0123456789abcdef0123456789abcdef";
    assert_int_equal(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    assert_true(raw_wait_closed(fd));
    close(fd);
    assert_true(wait_refused(b, 1));

    /* Well-formed headers: a CTRL before authenticating, then a HELLO claiming 4 GiB. */
    uint8_t frame[40] = { 0x43, 0x4c, 0x44, 0x31, 4 };
    frame[12] = 10;
    fd = raw_connect(b->addr);
    assert_int_equal(write(fd, frame, sizeof(frame)), (ssize_t)sizeof(frame));
    assert_true(raw_wait_closed(fd));
    close(fd);
    assert_true(wait_refused(b, 2));
    frame[4] = 1;
    memset(frame + 12, 0xff, 4);
    fd = raw_connect(b->addr);
    assert_int_equal(write(fd, frame, sizeof(frame)), (ssize_t)sizeof(frame));
    assert_true(raw_wait_closed(fd));
    close(fd);
    assert_true(wait_refused(b, 3));

    ctrl_roundtrip(a, b, "after");
    ctrl_roundtrip(b, a, "back");
    node_lock(a);
    assert_int_equal(a->lost, 0);
    pthread_mutex_unlock(&a->mu);
    node_lock(b);
    assert_int_equal(b->lost, 0);
    assert_int_equal(b->up, 1);
    pthread_mutex_unlock(&b->mu);
    node_free(a);
    node_free(b);
}

/* A connection that never says anything is dropped after the strangers' handshake timeout. */
static void test_silent_stranger_dropped(void **state)
{
    (void)state;
    node_t *b = node_start("beta", (node_opts_t){ .stranger_ms = 200 });
    uint64_t t0 = colld_now_ms();
    int fd = raw_connect(b->addr);
    assert_true(raw_wait_closed(fd));
    assert_true(colld_now_ms() - t0 >= 150);
    close(fd);
    assert_true(wait_refused(b, 1));
    node_free(b);
}

/* Lines of a file that contain text. */
static int lines_with(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, text) != NULL;
    fclose(f);
    return n;
}

/* 40 silent connections from one address: only TCP_STRANGERS_PER_ADDR are kept, the oldest
 * evicted first and counted as refused, one log line for all of them; a real peer from the same
 * address still gets in, and a HELLO (a connection that speaks) outlives the silent ones. */
static void test_stranger_flood_evicts_itself(void **state)
{
    (void)state;
    char log[64], err[128];
    snprintf(log, sizeof(log), "/tmp/colld-test-net-%d.log", (int)getpid());
    unlink(log);
    assert_int_equal(colld_log_init("test_net", "warn", "NET", log, err, sizeof(err)), 0);
    node_t *a = node_start("alpha", (node_opts_t){ 0 });
    node_t *b = node_start("beta", (node_opts_t){ .stranger_ms = 30000 });
    enum { N = 40 };
    int fds[N];
    /* one connection that says HELLO (a stranger's: it cannot finish without the secret) */
    uint8_t hello[40 + 12 + 64 + 16] = { 0x43, 0x4c, 0x44, 0x31, 1 };
    const char *hname = "x", *haddr = "127.0.0.1:9";
    size_t plen = 12 + 64 + strlen(hname) + strlen(haddr);
    hello[12] = (uint8_t)plen;
    uint8_t *pl = hello + 40;
    pl[0] = 1; /* version */
    pl[2] = (uint8_t)strlen(hname);
    pl[3] = (uint8_t)strlen(haddr);
    memcpy(pl + 76, hname, strlen(hname));
    memcpy(pl + 76 + strlen(hname), haddr, strlen(haddr));
    int talker = raw_connect(b->addr);
    assert_int_equal(write(talker, hello, 40 + plen), (ssize_t)(40 + plen));
    uint8_t buf[512]; /* b answers with its HELLO: read all of it */
    size_t got = 0, want = 40;
    while (got < want) {
        struct pollfd pfd = { .fd = talker, .events = POLLIN };
        assert_int_equal(poll(&pfd, 1, WAIT_MS), 1);
        ssize_t r = read(talker, buf + got, want - got);
        assert_true(r > 0);
        got += (size_t)r;
        if (got == 40)
            want = 40 + (buf[12] | (size_t)buf[13] << 8);
    }
    assert_int_equal(buf[4], 1);
    for (int i = 0; i < N; i++)
        fds[i] = raw_connect(b->addr);
    assert_true(wait_refused(b, N + 1 - TCP_STRANGERS_PER_ADDR));
    assert_true(raw_wait_closed(fds[0]));
    ctrl_roundtrip(a, b, "through the flood"); /* a's connections come from the same address */
    /* the talker is still there (silent ones went first): no EOF on it */
    assert_int_equal(recv(talker, buf, sizeof(buf), MSG_DONTWAIT), -1);
    assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
    assert_int_equal(lines_with(log, "refused connection from"), 1);
    assert_int_equal(lines_with(log, "evicted"), 1);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    close(talker);
    node_free(a);
    node_free(b);
    colld_log_init("test_net", "warn", NULL, NULL, err, sizeof(err));
    unlink(log);
}

/* A HELLO whose listen address this daemon could not dial (it would key a peer record) is
 * refused before any answer. */
static void test_hello_bad_address(void **state)
{
    (void)state;
    node_t *b = node_start("beta", (node_opts_t){ 0 });
    static const char *const bad[] = { "has space:1", "127.0.0.1:0", "no-port", "h:99999", "[zz]:1" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint8_t f[40 + 76 + 64] = { 0x43, 0x4c, 0x44, 0x31, 1 };
        size_t al = strlen(bad[i]), plen = 76 + 1 + al;
        f[12] = (uint8_t)plen;
        f[40] = 1;
        f[42] = 1;
        f[43] = (uint8_t)al;
        f[40 + 76] = 'x';
        memcpy(f + 40 + 77, bad[i], al);
        int fd = raw_connect(b->addr);
        assert_int_equal(write(fd, f, 40 + plen), (ssize_t)(40 + plen));
        char buf[64];
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        assert_int_equal(poll(&pfd, 1, WAIT_MS), 1);
        assert_int_equal(read(fd, buf, sizeof(buf)), 0); /* closed, no HELLO back */
        close(fd);
        assert_true(wait_refused(b, i + 1));
    }
    node_free(b);
}

/* What colld_net_check_addr accepts and refuses. */
static void test_check_addr(void **state)
{
    (void)state;
    char err[256], longest[COLLD_NET_ADDR_LEN + 8];
    static const char *const good[] = { "10.0.0.5:7077", "[::1]:80", "node-1.example.org:1", "h_x:65535" };
    static const char *const bad[] = { "",     "a:0",  "a b:1", "a:99999", "a:1x",  "[zz]:1",
                                       "port", ":80",  "a:",    "\x1b:1",  "a\n:1", "[::1]80" };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (colld_net_check_addr(good[i], err, sizeof(err)) != 0)
            fail_msg("refused %s: %s", good[i], err);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        if (colld_net_check_addr(bad[i], err, sizeof(err)) == 0)
            fail_msg("accepted bad address %zu", i);
        assert_true(err[0] != '\0');
    }
    memset(longest, 'a', sizeof(longest) - 1);
    longest[sizeof(longest) - 1] = '\0';
    memcpy(longest + sizeof(longest) - 4, ":80", 4);
    assert_int_equal(colld_net_check_addr(longest, err, sizeof(err)), -1);
    assert_int_equal(colld_net_check_addr(NULL, NULL, 0), -1);
}

/* Peers that came and went are freed once lost for the linger time, but only when the owner
 * says no pointer to them is kept. */
static void test_lost_peers_freed(void **state)
{
    (void)state;
    bool ok;
    node_t *b = node_start("beta", (node_opts_t){ .unused_cb = true, .linger_ms = 50 });
    enum { N = 4 };
    for (int i = 0; i < N; i++) {
        node_t *x = node_start("visitor", (node_opts_t){ 0 });
        ctrl_roundtrip(x, b, "hi");
        node_free(x);
    }
    WAIT_FOR(ok, b, b->lost == N && b->unused_asked >= N);
    assert_true(ok);
    colld_net_peer_info_t info[8];
    assert_int_equal(colld_net_peers(b->net, info, 8), N); /* still used: kept */
    node_lock(b);
    b->may_free = true;
    pthread_mutex_unlock(&b->mu);
    uint64_t dl = colld_now_ms() + WAIT_MS;
    while (colld_net_peers(b->net, info, 8) > 0 && colld_now_ms() < dl)
        usleep(10000);
    assert_int_equal(colld_net_peers(b->net, info, 8), 0);
    node_free(b);
}

/* A peer that reads nothing (its thread is stuck, its heartbeats still counted as fresh) while
 * CTRL messages pile up: the sender drops it once TCP_MAX_QUEUED_CTRL bytes wait. */
static void test_unread_queue_bounded(void **state)
{
    (void)state;
    bool ok;
    node_t *a = node_start("alpha", (node_opts_t){ .heartbeat_ms = 1000, .misses = 100 });
    node_t *b = node_start("beta", (node_opts_t){ .heartbeat_ms = 1000, .misses = 100 });
    ctrl_roundtrip(a, b, "hi");
    node_lock(b);
    b->pause = true;
    pthread_mutex_unlock(&b->mu);
    colld_net_wake(b->net);
    WAIT_FOR(ok, b, b->paused);
    assert_true(ok);
    uint8_t *big = calloc(1, COLLD_NET_CTRL_MAX);
    assert_non_null(big);
    for (unsigned i = 0; i < (TCP_MAX_QUEUED_CTRL / COLLD_NET_CTRL_MAX) + 16; i++)
        assert_int_equal(colld_net_post_ctrl(a->net, b->addr, big, COLLD_NET_CTRL_MAX), 0);
    free(big);
    WAIT_FOR(ok, a, a->lost == 1);
    assert_true(ok);
    assert_non_null(strstr(a->lost_why, "bytes of messages to it are not read"));
    node_lock(b);
    b->pause = false;
    node_signal_unlock(b);
    node_free(a);
    node_free(b);
}

/* Stopping one side makes the other report the peer lost quickly. */
static void test_stop_loses_peer(void **state)
{
    (void)state;
    node_t *a = node_start("alpha", (node_opts_t){ .conns = 2 });
    node_t *b = node_start("beta", (node_opts_t){ 0 });
    bool ok;
    ctrl_roundtrip(a, b, "hi");
    char baddr[COLLD_NET_ADDR_LEN];
    colld_strlcpy(baddr, b->addr, sizeof(baddr));
    uint64_t t0 = colld_now_ms();
    node_free(b);
    WAIT_FOR(ok, a, a->lost == 1);
    assert_true(ok);
    assert_true(colld_now_ms() - t0 < 1000);
    assert_non_null(strstr(a->lost_why, "beta"));
    colld_net_peer_info_t pi;
    assert_true(peer_info(a, baddr, &pi));
    assert_string_equal(pi.state, "lost");
    assert_int_equal(pi.conns, 0);
    node_free(a);
}

/* A peer whose network thread stalls stops sending heartbeats and is declared lost. */
static void test_heartbeat_silence(void **state)
{
    (void)state;
    node_t *a = node_start("alpha", (node_opts_t){ .heartbeat_ms = 50, .misses = 5 });
    node_t *b = node_start("beta", (node_opts_t){ .heartbeat_ms = 50, .misses = 5 });
    bool ok;
    ctrl_roundtrip(a, b, "hi");
    /* Quiet but alive: heartbeats keep the link up for longer than the 250 ms limit. */
    node_lock(a);
    uint64_t dl = colld_now_ms() + 500;
    while (colld_now_ms() < dl)
        node_wait(a, 20);
    assert_int_equal(a->lost, 0);
    pthread_mutex_unlock(&a->mu);

    node_lock(b);
    b->pause = true;
    pthread_mutex_unlock(&b->mu);
    colld_net_wake(b->net);
    WAIT_FOR(ok, b, b->paused);
    assert_true(ok);
    WAIT_FOR(ok, a, a->lost == 1);
    assert_true(ok);
    assert_non_null(strstr(a->lost_why, "no message from beta"));
    node_lock(b);
    b->pause = false;
    node_signal_unlock(b);
    WAIT_FOR(ok, b, b->lost == 1);
    assert_true(ok);
    node_free(a);
    node_free(b);
}

static void job_send_after_loss(node_t *nd, void *arg)
{
    data_job_t *j = arg;
    colld_net_peer_t *p = colld_net_peer_get(nd->net, j->addr);
    colld_net_hdr_t h = { .len = 4 };
    /* peer_get reconnects a lost peer: it is connecting now, so DATA is accepted again. */
    j->rc_oversized = colld_net_peer_is_up(p) ? 1 : 0;
    j->rc_null = colld_net_send_data(p, &h, "abcd", 0, cb_done, nd);
}

/* An operator's disconnect loses the peer on both sides; the peer can be reached again. */
static void test_disconnect(void **state)
{
    (void)state;
    node_t *a = node_start("alpha", (node_opts_t){ .conns = 3 });
    node_t *b = node_start("beta", (node_opts_t){ 0 });
    bool ok;
    ctrl_roundtrip(a, b, "hi");
    assert_int_equal(colld_net_disconnect(a->net, "nobody"), -1);
    assert_int_equal(colld_net_disconnect(a->net, "beta"), 0);
    WAIT_FOR(ok, a, a->lost == 1);
    assert_true(ok);
    assert_string_equal(a->lost_why, "disconnected by an operator");
    WAIT_FOR(ok, b, b->lost == 1);
    assert_true(ok);
    assert_int_equal(colld_net_disconnect(a->net, "beta"), -1);
    assert_int_equal(colld_net_disconnect(a->net, b->addr), -1);

    /* Sending again reconnects. */
    ctrl_roundtrip(a, b, "again");
    node_lock(a);
    assert_int_equal(a->up, 2);
    pthread_mutex_unlock(&a->mu);
    assert_int_equal(colld_net_disconnect(b->net, a->addr), 0);
    WAIT_FOR(ok, b, b->lost == 2);
    assert_true(ok);
    WAIT_FOR(ok, a, a->lost == 2);
    assert_true(ok);
    data_job_t j = { .addr = b->addr };
    run_on_net(a, job_send_after_loss, &j);
    assert_int_equal(j.rc_oversized, 0);
    assert_int_equal(j.rc_null, 0);
    WAIT_FOR(ok, a, a->done_ok == 1);
    assert_true(ok);
    node_free(a);
    node_free(b);
}

static void job_data_to(node_t *nd, void *arg)
{
    colld_net_peer_t *p = colld_net_peer_get(nd->net, arg);
    colld_net_hdr_t h = { .len = 3 };
    net_check(nd, p && !colld_net_peer_is_up(p));
    for (unsigned i = 0; p && i < 3; i++)
        net_check(nd, colld_net_send_data(p, &h, "abc", i, cb_done, nd) == 0);
}

/* A port nobody listens on: DATA queued to it fails (done(ok = false)) before peer_lost, which
 * names the connect error. */
static void test_connect_refused(void **state)
{
    (void)state;
    node_t *a = node_start("alpha", (node_opts_t){ .conns = 2 });
    char addr[64], want[96];
    bool ok;
    closed_port_addr(addr, sizeof(addr));
    run_on_net(a, job_data_to, addr);
    WAIT_FOR(ok, a, a->lost == 1);
    assert_true(ok);
    snprintf(want, sizeof(want), "connect to %s: Connection refused", addr);
    assert_string_equal(a->lost_why, want);
    assert_int_equal(a->lost_done_fail, 3);
    assert_int_equal(a->done_ok, 0);
    assert_int_equal(colld_net_post_ctrl(a->net, "no-port-here", "x", 1), 0);
    WAIT_FOR(ok, a, a->lost == 2);
    assert_true(ok);
    assert_non_null(strstr(a->lost_why, "HOST:PORT"));
    node_free(a);
}

/* Argument checks of start and of the senders. */
static void test_bad_arguments(void **state)
{
    (void)state;
    node_t *a = node_start("alpha", (node_opts_t){ 0 });
    char err[256];
    colld_net_t *n = (colld_net_t *)1;
    colld_net_config_t cfg = { .node_name = "x", .listen_addr = "127.0.0.1:0", .secret = secret_a,
                               .secret_len = 8, .conns_per_peer = 1, .heartbeat_ms = 100,
                               .heartbeat_misses = 3, .chunk_bytes = 1024 };
    assert_int_equal(colld_net_start(&cfg, &n, err, sizeof(err)), -1);
    assert_null(n);
    assert_non_null(strstr(err, "secret"));
    cfg.secret_len = 32;
    cfg.listen_addr = "nonsense";
    assert_int_equal(colld_net_start(&cfg, &n, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "HOST:PORT"));
    cfg.listen_addr = a->addr;
    assert_int_equal(colld_net_start(&cfg, &n, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "in use"));
    cfg.listen_addr = "127.0.0.1:0";
    cfg.conns_per_peer = 0;
    assert_int_equal(colld_net_start(&cfg, &n, err, sizeof(err)), -1);
    colld_net_stop(NULL);

    static uint8_t big[COLLD_NET_CTRL_MAX + 1];
    assert_int_equal(colld_net_post_ctrl(a->net, "127.0.0.1:1", big, sizeof(big)), -1);
    assert_int_equal(colld_net_post_ctrl(a->net, "127.0.0.1:1", NULL, 3), -1);
    node_free(a);
}

static void job_queue_to_silent(node_t *nd, void *arg)
{
    data_job_t *j = arg;
    colld_net_peer_t *p = colld_net_peer_get(nd->net, j->addr);
    net_check(nd, p && !colld_net_peer_is_up(p));
    colld_net_hdr_t h = { .len = 1000 };
    for (unsigned i = 0; p && i < 8; i++)
        net_check(nd, colld_net_send_data(p, &h, j->src[0], i, cb_done, nd) == 0);
    net_check(nd, p && colld_net_send_ctrl(p, "queued", 6) == 0);
}

static void job_flood(node_t *nd, void *arg)
{
    data_job_t *j = arg;
    colld_net_peer_t *p = colld_net_peer_get(nd->net, j->addr);
    colld_net_hdr_t h = { .len = CHUNK };
    for (unsigned i = 0; p && i < 200; i++)
        net_check(nd, colld_net_send_data(p, &h, j->src[0], i, cb_done, nd) == 0);
}

/* Stop with CTRL and DATA queued (at a peer that never answers its handshake, and on a busy
 * link) frees everything and runs no callback. The ASan build checks for leaks. */
static void test_stop_with_queued(void **state)
{
    (void)state;
    node_t *a = node_start("alpha", (node_opts_t){ .conns = 2 });
    node_t *b = node_start("beta", (node_opts_t){ 0 });
    /* A listener that never accepts: connections complete in the kernel, nobody answers. */
    struct sockaddr_in sa = { .sin_family = AF_INET };
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof(sa);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(lfd, 8), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    char silent[64];
    snprintf(silent, sizeof(silent), "127.0.0.1:%u", ntohs(sa.sin_port));

    data_job_t j = { .addr = silent };
    j.src[0] = calloc(1, CHUNK);
    for (int i = 0; i < 20; i++)
        assert_int_equal(colld_net_post_ctrl(a->net, silent, "hello?", 6), 0);
    run_on_net(a, job_queue_to_silent, &j);
    ctrl_roundtrip(a, b, "hi");
    j.addr = b->addr;
    run_on_net(a, job_flood, &j);
    colld_net_stop(a->net);
    node_lock(a);
    int done = a->done_ok + a->done_fail, lost = a->lost;
    assert_int_equal(a->done_fail, 0);
    pthread_mutex_unlock(&a->mu);
    assert_true(done <= 200); /* the 8 DATA to the silent peer never went */
    assert_int_equal(lost, 0);
    assert_int_equal(a->errors, 0);
    a->net = NULL;
    node_free(a);
    node_free(b);
    close(lfd);
    free(j.src[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ctrl_both_ways),      cmocka_unit_test(test_data_striped),
        cmocka_unit_test(test_wrong_secret),        cmocka_unit_test(test_strangers_refused),
        cmocka_unit_test(test_silent_stranger_dropped), cmocka_unit_test(test_stop_loses_peer),
        cmocka_unit_test(test_heartbeat_silence),   cmocka_unit_test(test_disconnect),
        cmocka_unit_test(test_connect_refused),     cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_stop_with_queued),   cmocka_unit_test(test_stranger_flood_evicts_itself),
        cmocka_unit_test(test_hello_bad_address),  cmocka_unit_test(test_check_addr),
        cmocka_unit_test(test_lost_peers_freed),   cmocka_unit_test(test_unread_queue_bounded),
        cmocka_unit_test(test_link_measured),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
