/*
 * test_adv_net.c - a hostile network (issue 13: #8, #9, #11, #12, #13): real colld daemons on
 * 127.0.0.1, attacked through the real peer wire format.
 *
 * The attacker is either plain sockets (strangers that never authenticate) or an "evil" node in
 * this process: the real transport (transport/tcp) holding the cluster secret, sending colld.net.v1
 * messages and DATA frames of its own making, as a compromised or broken daemon would. Each test
 * checks that the daemon refuses the attack with a clear error naming the node, and keeps serving
 * the cluster afterwards.
 */
#include "colld_net.pb-c.h"
#include "common/util.h"
#include "tests/integration/harness.h"
#include "transport/tcp/tcp.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SECRET "this-is-the-test-cluster-secret"
#define FLOOD 400       /* silent connections: 100 from 127.0.0.2, 15 from each of 127.0.0.3..22 */
#define CHUNK (1u << 20) /* the daemon's DATA receive buffer (COLLD_NET_MAX_CHUNK, server/net/cluster.h) */
enum { XPHASE_RD = 4, XPHASE_RD_POST = 5 }; /* DATA phases (server/net/cluster.h) */

typedef struct {
    harness_t h[2]; /* node-a (the root of every communicator here), node-b */
    char addr[2][COLLD_NET_ADDR_LEN];
    char tmp[64], secret[128];
} cluster_t;

/* ============================================================================================
 * The evil node
 * ========================================================================================== */

/* What it does when a Ready arrives. */
enum { EV_IDLE, EV_ANSWER, EV_BAD_PHASE, EV_HALF_TWICE };

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    colld_net_t *net;
    char addr[COLLD_NET_ADDR_LEN];
    int mode;
    int nformed, nready, nfail, nup, njoin;
    uint64_t xid;
    char join_addr[4][COLLD_NET_ADDR_LEN]; /* as a root: the node each rank < 4 joined on */
    int fail_status;
    char fail_detail[1024];
    uint8_t data[8192]; /* DATA payloads (stay valid until the transport wrote them) */
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES]; /* as a root: the communicator's unique id */
} evil_t;

static void evil_signal(evil_t *e)
{
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* Answer a Ready with the same signature, and send the DATA the mode calls for (net thread). */
static void evil_on_ready(evil_t *e, colld_net_peer_t *p, const Colld__Net__V1__Ready *r)
{
    if (e->mode == EV_IDLE)
        return;
    Colld__Net__V1__Ready mine = *r;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_READY;
    m.ready = &mine;
    uint8_t buf[256];
    size_t len = colld__net__v1__msg__pack(&m, buf);
    colld_net_send_ctrl(p, buf, len);
    uint32_t bytes = (uint32_t)(r->count * 4); /* float32 */
    colld_net_hdr_t h = { .xid = r->xid, .seq = r->seq };
    if (e->mode == EV_BAD_PHASE) { /* the result of recursive doubling, to a node that computes it */
        h.phase = XPHASE_RD_POST;
        h.len = bytes;
        colld_net_send_data(p, &h, e->data, 0, NULL, NULL);
    } else if (e->mode == EV_HALF_TWICE) { /* the first half of the exchange, twice */
        h.phase = XPHASE_RD;
        h.len = bytes / 2;
        colld_net_send_data(p, &h, e->data, 0, NULL, NULL);
        colld_net_send_data(p, &h, e->data, 0, NULL, NULL);
    }
}

static void evil_ctrl(void *arg, colld_net_peer_t *p, const void *payload, size_t len)
{
    evil_t *e = arg;
    Colld__Net__V1__Msg *m = colld__net__v1__msg__unpack(NULL, len, payload);
    if (!m)
        return;
    pthread_mutex_lock(&e->mu);
    switch (m->m_case) {
    case COLLD__NET__V1__MSG__M_FORMED:
        e->nformed++;
        e->xid = m->formed->xid;
        break;
    case COLLD__NET__V1__MSG__M_READY:
        e->nready++;
        evil_on_ready(e, p, m->ready);
        break;
    case COLLD__NET__V1__MSG__M_JOIN:
        if (m->join->rank >= 0 && m->join->rank < 4 && m->join->node_addr)
            colld_strlcpy(e->join_addr[m->join->rank], m->join->node_addr, sizeof(e->join_addr[0]));
        e->njoin++;
        break;
    case COLLD__NET__V1__MSG__M_FAIL:
        e->nfail++;
        e->fail_status = m->fail->status;
        colld_strlcpy(e->fail_detail, m->fail->detail, sizeof(e->fail_detail));
        break;
    default:
        break;
    }
    evil_signal(e);
    colld__net__v1__msg__free_unpacked(m, NULL);
}

static void evil_up(void *arg, colld_net_peer_t *p)
{
    evil_t *e = arg;
    (void)p;
    pthread_mutex_lock(&e->mu);
    e->nup++;
    evil_signal(e);
}

/* Start an evil node with the cluster's secret (or another one). */
static evil_t *evil_start(const char *name, const char *secret)
{
    evil_t *e = calloc(1, sizeof(*e));
    assert_non_null(e);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    colld_net_config_t cfg = { .node_name = name,
                               .listen_addr = "127.0.0.1:0",
                               .secret = (const uint8_t *)secret,
                               .secret_len = strlen(secret),
                               .conns_per_peer = 1,
                               .heartbeat_ms = 200,
                               .heartbeat_misses = 10,
                               .chunk_bytes = CHUNK,
                               .cb = { .ctrl = evil_ctrl, .peer_up = evil_up, .arg = e } };
    char err[256];
    if (colld_net_start(&cfg, &e->net, err, sizeof(err)) < 0)
        fail_msg("evil node: %s", err);
    colld_strlcpy(e->addr, colld_net_listen_addr(e->net), sizeof(e->addr));
    return e;
}

static void evil_stop(evil_t *e)
{
    colld_net_stop(e->net);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

/* Wait until *counter (under e->mu) reaches want, at most ms. Returns its value. */
static int evil_wait(evil_t *e, const int *counter, int want, int ms)
{
    double end = harness_now_ms() + ms;
    pthread_mutex_lock(&e->mu);
    while (*counter < want && harness_now_ms() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    int v = *counter;
    pthread_mutex_unlock(&e->mu);
    return v;
}

static void evil_post(evil_t *e, const char *to, const Colld__Net__V1__Msg *m)
{
    uint8_t buf[4096];
    size_t len = colld__net__v1__msg__get_packed_size(m);
    assert_true(len <= sizeof(buf));
    colld__net__v1__msg__pack(m, buf);
    assert_int_equal(colld_net_post_ctrl(e->net, to, buf, len), 0);
}

/* A Join for `rank` of the communicator with unique id `uid`, sent to the root at `to`. */
static void evil_join(evil_t *e, const char *to, const colld_unique_id_t *uid, int nranks, int rank,
                      const char *node_name, const char *node_addr)
{
    Colld__Net__V1__Join j = COLLD__NET__V1__JOIN__INIT;
    j.unique_id.data = (uint8_t *)uid->internal;
    j.unique_id.len = COLLD_WIRE_UNIQUE_ID_BYTES;
    j.tenant = (uint32_t)getuid();
    j.nranks = nranks;
    j.rank = rank;
    j.pid = (int32_t)getpid();
    j.name = (char *)"adv";
    j.node_name = (char *)node_name;
    j.node_addr = (char *)node_addr;
    j.timeout_ms = 10000;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_JOIN;
    m.join = &j;
    evil_post(e, to, &m);
}

/* ============================================================================================
 * Helpers
 * ========================================================================================== */

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    fclose(f);
    return chmod(path, 0600);
}

static int setup(void **state)
{
    cluster_t *cl = calloc(1, sizeof(*cl));
    if (!cl)
        return -1;
    snprintf(cl->tmp, sizeof(cl->tmp), "/tmp/colld-adv-net-XXXXXX");
    if (!mkdtemp(cl->tmp))
        return -1;
    snprintf(cl->secret, sizeof(cl->secret), "%s/secret", cl->tmp);
    if (write_file(cl->secret, SECRET "\n") < 0)
        return -1;
    static const char *const names[2] = { "node-a", "node-b" };
    for (int i = 0; i < 2; i++) {
        const char *extra[] = { "--listen",    "127.0.0.1:0",    "--node-name", names[i],
                                "--cluster-secret-file", cl->secret, "--heartbeat-ms", "400",
                                "--metrics",   "127.0.0.1:0",    "--peers",     "127.0.0.1:*",
                                NULL };
        harness_net_t net;
        if (harness_daemon_start(&cl->h[i], extra) < 0 || harness_net_status(&cl->h[i], &net) < 0)
            return -1;
        colld_strlcpy(cl->addr[i], net.listen, sizeof(cl->addr[i]));
    }
    *state = cl;
    return 0;
}

static int teardown(void **state)
{
    cluster_t *cl = *state;
    int bad = 0;
    for (int i = 0; i < 2; i++)
        if (cl->h[i].dir[0] && harness_cleanup(&cl->h[i]) < 0) {
            fprintf(stderr, "daemon %d did not exit cleanly\n", i);
            bad = 1;
        }
    unlink(cl->secret);
    rmdir(cl->tmp);
    free(cl);
    return bad ? -1 : 0;
}

/* Spawn colld-test-rank on daemon `node` for `rank` of 2 with the given extra arguments. */
static pid_t spawn_rank(cluster_t *cl, int node, const char *hex, int rank, const char *const *extra)
{
    char rk[16];
    snprintf(rk, sizeof(rk), "%d", rank);
    const char *argv[40] = { RANK_BIN, "--socket", cl->h[node].socket, "--uid", hex, "--nranks", "2", "--rank", rk };
    int n = 9;
    for (int i = 0; extra && extra[i] && n < 39; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    return harness_spawn(argv);
}

/* A real communicator across node-a and node-b still runs exact all-reduces. */
static void assert_cluster_serves(cluster_t *cl)
{
    char hex[HARNESS_UID_HEX_LEN];
    pid_t p[2];
    const char *extra[] = { "--counts", "1,1000,100000", NULL };
    assert_int_equal(harness_new_uid_hex(&cl->h[0], hex), 0);
    for (int r = 0; r < 2; r++)
        assert_true((p[r] = spawn_rank(cl, r, hex, r, extra)) > 0);
    assert_int_equal(harness_wait_all(p, 2, 60000), 0);
}

static void new_uid(cluster_t *cl, char *hex, colld_unique_id_t *id)
{
    assert_int_equal(harness_new_uid_hex(&cl->h[0], hex), 0);
    assert_int_equal(harness_uid_from_hex(hex, id), 0);
}

/* The port of "127.0.0.1:PORT". */
static int port_of(const char *addr)
{
    const char *c = strrchr(addr, ':');
    return c ? atoi(c + 1) : 0;
}

/* A listening socket nobody announced: no daemon has any reason to connect to it. */
static int trap_open(char *addr, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(fd, 64), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(addr, len, "127.0.0.1:%u", ntohs(sa.sin_port));
    return fd;
}

/* Whether anything connected to the trap within ms. */
static bool trap_sprung(int fd, int ms)
{
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    return poll(&pfd, 1, ms) > 0;
}

/* How many peers `collctl status` lists on a daemon. */
static int peer_count(harness_t *h)
{
    char out[16384];
    const char *argv[] = { COLLCTL_BIN, "--socket", h->socket, "status", NULL };
    assert_int_equal(harness_capture(argv, out, sizeof(out), 10000), 0);
    const char *p = strstr(out, "PEERS (");
    return p ? atoi(p + 7) : -1;
}

/* Whether a daemon's log holds the byte b (a raw control character from a peer). */
static bool log_has_byte(harness_t *h, char b)
{
    FILE *f = fopen(h->log, "r");
    bool found = false;
    int c;
    if (!f)
        return false;
    while (!found && (c = fgetc(f)) != EOF)
        found = c == (unsigned char)b;
    fclose(f);
    return found;
}

/* ============================================================================================
 * #8: strangers cannot take the handshake slots
 * ========================================================================================== */

typedef struct {
    int port;
    int fds[FLOOD];
    atomic_int stop;
    atomic_long opened;
} flood_t;

/* Silent connection i of the flood to 127.0.0.1:port, from its own source address (other
 * hosts, as far as the daemon can tell): the first 100 from 127.0.0.2, the others 15 from each of
 * 127.0.0.3 up. -1 if it cannot be opened. */
static int flood_connect(int port, int i)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    struct sockaddr_in src = { .sin_family = AF_INET };
    char ip[32];
    snprintf(ip, sizeof(ip), "127.0.0.%d", i < 100 ? 2 : 3 + (i - 100) / 15);
    inet_pton(AF_INET, ip, &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (fd >= 0 && (bind(fd, (struct sockaddr *)&src, sizeof(src)) < 0 ||
                    (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Keep FLOOD silent connections open to the port: every one the daemon closes is opened again
 * (checked every 20 ms), as an attacker holding the slots would. */
static void *flood_main(void *arg)
{
    flood_t *f = arg;
    for (int i = 0; i < FLOOD; i++) {
        f->fds[i] = flood_connect(f->port, i);
        atomic_fetch_add(&f->opened, 1);
    }
    while (!atomic_load(&f->stop)) {
        for (int i = 0; i < FLOOD; i++) {
            char b[64];
            if (f->fds[i] >= 0) {
                ssize_t n = recv(f->fds[i], b, sizeof(b), MSG_DONTWAIT);
                if (n > 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN))
                    continue;
                if (n < 0)
                    continue; /* still open and silent */
                close(f->fds[i]);
            }
            f->fds[i] = flood_connect(f->port, i);
            atomic_fetch_add(&f->opened, 1);
        }
        usleep(20000);
    }
    for (int i = 0; i < FLOOD; i++)
        if (f->fds[i] >= 0)
            close(f->fds[i]);
    return NULL;
}

/* Lines of a daemon's log that contain `text`. */
static int log_lines_with(harness_t *h, const char *text)
{
    FILE *f = fopen(h->log, "r");
    char line[2048];
    int n = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, text) != NULL;
    fclose(f);
    return n;
}

/* 400 silent connections to node-a's --listen (no secret needed) from 21 other addresses, kept
 * open: a new communicator across node-a and node-b still forms and runs, the strangers are
 * counted as refused, and the log gets a line, then one summary line with the count per 10 s,
 * not one per connection. */
static void test_handshake_flood(void **state)
{
    cluster_t *cl = *state;
    flood_t f = { .port = port_of(cl->addr[0]) };
    atomic_init(&f.stop, 0);
    atomic_init(&f.opened, 0);
    pthread_t t;
    harness_net_t before, after;
    assert_int_equal(harness_net_status(&cl->h[0], &before), 0);
    assert_int_equal(pthread_create(&t, NULL, flood_main, &f), 0);
    double end = harness_now_ms() + 10000;
    while (atomic_load(&f.opened) < FLOOD && harness_now_ms() < end)
        usleep(10000);
    usleep(300000); /* the daemon has accepted them */

    assert_cluster_serves(cl); /* node-b's connections to the root get in */

    atomic_store(&f.stop, 1);
    pthread_join(t, NULL);
    assert_int_equal(harness_net_status(&cl->h[0], &after), 0);
    print_message("node-a: %llu strangers refused, %ld connections opened\n",
                  (unsigned long long)(after.refused - before.refused), atomic_load(&f.opened));
    assert_true(after.refused - before.refused >= FLOOD - 256);
    end = harness_now_ms() + 15000; /* the summary of the refusals not logged one by one */
    while (log_lines_with(&cl->h[0], "more connection(s) from strangers") == 0 && harness_now_ms() < end)
        usleep(100000);
    int lines = log_lines_with(&cl->h[0], "refused");
    print_message("node-a: %d log lines about refusals\n", lines);
    assert_true(log_lines_with(&cl->h[0], "more connection(s) from strangers") >= 1);
    assert_true(lines >= 2 && lines <= 6);
    assert_cluster_serves(cl);
}

/* ============================================================================================
 * #9, #11: a member that does not deliver, or delivers wrong
 * ========================================================================================== */

typedef struct {
    pid_t pid;
    char out[300], ready[300], done[300], stop[300];
} waiter_t;

/* Rank 0 on node-a waits in a 1024-float all-reduce expecting `expect`, its timeout timeout_ms;
 * the evil node joins as rank 1 and behaves as `mode`. Returns once rank 0 posted it. */
static evil_t *start_evil_member(cluster_t *cl, int mode, const char *expect, const char *timeout_ms, waiter_t *w)
{
    char hex[HARNESS_UID_HEX_LEN];
    colld_unique_id_t id;
    new_uid(cl, hex, &id);
    evil_t *e = evil_start("evil", SECRET);
    e->mode = mode;
    snprintf(w->out, sizeof(w->out), "%s/out", cl->tmp);
    snprintf(w->ready, sizeof(w->ready), "%s/ready", cl->tmp);
    snprintf(w->done, sizeof(w->done), "%s/done", cl->tmp);
    snprintf(w->stop, sizeof(w->stop), "%s/stop", cl->tmp);
    unlink(w->out);
    unlink(w->ready);
    unlink(w->done);
    unlink(w->stop);
    const char *x[] = { "--mode", "hang", "--expect", expect, "--ready-file", w->ready, "--out", w->out,
                        "--timeout-ms", timeout_ms, "--name", "adv", "--done-file", w->done, "--stop-file", w->stop,
                        NULL };
    assert_true((w->pid = spawn_rank(cl, 0, hex, 0, x)) > 0);
    evil_join(e, cl->addr[0], &id, 2, 1, "evil", e->addr);
    assert_int_equal(evil_wait(e, &e->nformed, 1, 20000), 1);
    assert_int_equal(harness_wait_file(w->ready, 20000), 0);
    return e;
}

/* Rank 0 got its outcome within limit_ms (its detail into text); it keeps its communicator until
 * release_waiter. */
static void finish_waiter(waiter_t *w, char *text, size_t len, int limit_ms)
{
    double t0 = harness_now_ms();
    bool done = harness_wait_file(w->done, limit_ms) == 0;
    if (!done)
        harness_wait(w->pid, 0); /* it hangs: killed */
    assert_true(done);
    harness_read_file(w->out, text, len);
    print_message("after %.0f ms: %s", harness_now_ms() - t0, text);
}

/* Rank 0 leaves; it must exit 0 (it got the status it expected). */
static void release_waiter(waiter_t *w)
{
    FILE *f = fopen(w->stop, "w");
    if (f)
        fclose(f);
    assert_int_equal(harness_wait(w->pid, 20000), 0);
}

/* The evil member answers Ready but never sends its DATA (recursive doubling, then the ring):
 * rank 0 fails with COLLD_ERR_TIMEOUT naming the node and the step, and while it waits,
 * collctl trace shows the collective in the network. */
static void test_member_sends_no_data(void **state)
{
    cluster_t *cl = *state;
    char text[2048], out[8192], uid[16];
    waiter_t w;
    for (int ring = 0; ring < 2; ring++) {
        if (ring) { /* the root's policy picks the ring for this tenant */
            snprintf(uid, sizeof(uid), "%u", (unsigned)getuid());
            const char *set[] = { COLLCTL_BIN, "--socket", cl->h[0].socket, "policy", "set", uid, "--net-algo",
                                  "ring", NULL };
            assert_int_equal(harness_capture_all(set, out, sizeof(out), 10000), 0);
        }
        evil_t *e = start_evil_member(cl, EV_ANSWER, "COLLD_ERR_TIMEOUT", "3000", &w);
        assert_int_equal(evil_wait(e, &e->nready, 1, 10000), 1);
        uint64_t comm = harness_comm_id(&cl->h[0], "adv");
        assert_true(comm != 0);
        char id[32];
        snprintf(id, sizeof(id), "%llu", (unsigned long long)comm);
        const char *trace[] = { COLLCTL_BIN, "--socket", cl->h[0].socket, "trace", id, NULL };
        assert_int_equal(harness_capture(trace, out, sizeof(out), 10000), 0);
        print_message("%s", out);
        assert_non_null(strstr(out, " net "));
        assert_non_null(strstr(out, "WAITING"));

        finish_waiter(&w, text, sizeof(text), 20000);
        assert_non_null(strstr(text, "made no progress for 3000 ms"));
        assert_non_null(strstr(text, "node evil ("));
        assert_non_null(strstr(text, ring ? "did not send its ring reduce-scatter step 0 data"
                                          : "did not send its recursive doubling step 0 data"));
        assert_non_null(strstr(text, "(rank(s) 1)"));
        /* afterwards the recorder has it, failed */
        assert_int_equal(harness_capture(trace, out, sizeof(out), 10000), 0);
        assert_non_null(strstr(out, " net    COLLD_ERR_TIMEOUT"));
        release_waiter(&w);
        evil_stop(e);
    }
    const char *clear[] = { COLLCTL_BIN, "--socket", cl->h[0].socket, "policy", "clear", uid, NULL };
    assert_int_equal(harness_capture_all(clear, out, sizeof(out), 10000), 0);
    assert_cluster_serves(cl);
}

/* The evil member sends DATA of a phase this node does not have (#11: the detail was
 * uninitialized stack memory), or half the buffer twice (it was accepted: the result held
 * uninitialized heap memory): a protocol error naming the node and what was wrong. */
static void test_member_sends_bad_data(void **state)
{
    cluster_t *cl = *state;
    char text[2048];
    waiter_t w;
    evil_t *e = start_evil_member(cl, EV_BAD_PHASE, "COLLD_ERR_INTERNAL", "10000", &w);
    finish_waiter(&w, text, sizeof(text), 20000);
    char want[256];
    snprintf(want, sizeof(want),
             "protocol error from node evil (%s): recursive doubling result step 0 is not a phase of this "
             "collective on this node",
             e->addr);
    assert_non_null(strstr(text, want));
    release_waiter(&w);
    evil_stop(e);

    e = start_evil_member(cl, EV_HALF_TWICE, "COLLD_ERR_INTERNAL", "10000", &w);
    finish_waiter(&w, text, sizeof(text), 20000);
    snprintf(want, sizeof(want),
             "protocol error from node evil (%s): recursive doubling step 0: bytes 0..2048, where the whole "
             "4096-byte buffer is due once",
             e->addr);
    assert_non_null(strstr(text, want));
    release_waiter(&w);
    evil_stop(e);
    assert_cluster_serves(cl);
}

/* Seven members with long node names never answer Ready: the time-out names them all in a
 * detail that does not fit its buffer. It is cut cleanly. Before, each name was appended after a
 * guard that left room for 64 bytes only: with five 48-byte names before it, the sixth 63-byte
 * one ended 4 bytes past the 512-byte buffer and the rank list after it was written with a size
 * that had wrapped around (an overflow of the daemon's stack, caught by ASan). */
static void test_many_silent_members(void **state)
{
    cluster_t *cl = *state;
    enum { K = 7 };
    char hex[HARNESS_UID_HEX_LEN], text[2048], names[K][64];
    colld_unique_id_t id;
    evil_t *e[K];
    waiter_t w;
    new_uid(cl, hex, &id);
    snprintf(w.out, sizeof(w.out), "%s/out", cl->tmp);
    snprintf(w.ready, sizeof(w.ready), "%s/ready", cl->tmp);
    snprintf(w.done, sizeof(w.done), "%s/done", cl->tmp);
    snprintf(w.stop, sizeof(w.stop), "%s/stop", cl->tmp);
    unlink(w.done);
    unlink(w.stop);
    const char *x[] = { RANK_BIN, "--socket", cl->h[0].socket, "--uid", hex, "--nranks", "8", "--rank", "0",
                        "--mode", "hang", "--expect", "COLLD_ERR_TIMEOUT", "--out", w.out, "--timeout-ms", "2000",
                        "--done-file", w.done, "--stop-file", w.stop, NULL };
    assert_true((w.pid = harness_spawn(x)) > 0);
    for (int i = 0; i < K; i++) {
        size_t len = i < 5 ? 48 : 63;
        memset(names[i], 'a' + i, len);
        names[i][len] = '\0';
        e[i] = evil_start(names[i], SECRET);
        evil_join(e[i], cl->addr[0], &id, K + 1, i + 1, names[i], e[i]->addr);
    }
    finish_waiter(&w, text, sizeof(text), 30000);
    assert_non_null(strstr(text, "timed out after 2000 ms waiting for other nodes: node aaaa"));
    release_waiter(&w);
    for (int i = 0; i < K; i++)
        evil_stop(e[i]);
    assert_cluster_serves(cl);
}

/* ============================================================================================
 * #9: a member that stops reading
 * ========================================================================================== */

/* An authenticated peer written by hand on a blocking socket (the wire format of
 * transport/tcp/tcp_internal.h), so that it can do what the real transport never does: keep
 * sending heartbeats while it reads nothing. */
typedef struct {
    int fd;
    pthread_mutex_t send_mu;
    pthread_t hb;
    atomic_int stop;
    char addr[64]; /* the listen address it claims (never listened on) */
} raw_t;

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Write all of buf (MSG_NOSIGNAL: the daemon may have closed the link). False on failure. */
static bool write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *b = buf;
    while (len > 0) {
        ssize_t w = send(fd, b, len, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        b += w;
        len -= (size_t)w;
    }
    return true;
}

static void read_all(int fd, void *buf, size_t len)
{
    uint8_t *b = buf;
    while (len > 0) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        assert_true(poll(&pfd, 1, 10000) == 1);
        ssize_t r = read(fd, b, len);
        assert_true(r > 0);
        b += r;
        len -= (size_t)r;
    }
}

/* Send one frame; false when the link is gone. */
static bool raw_send(raw_t *r, unsigned type, const void *payload, uint32_t len)
{
    uint8_t h[40] = { 0 };
    put_le(h, 0x31444c43u, 4); /* "CLD1" */
    h[4] = (uint8_t)type;
    put_le(h + 12, len, 4);
    pthread_mutex_lock(&r->send_mu);
    bool ok = write_all(r->fd, h, sizeof(h)) && (!len || write_all(r->fd, payload, len));
    pthread_mutex_unlock(&r->send_mu);
    return ok;
}

/* The next frame: its type, its payload into buf (cap bytes at least). */
static unsigned raw_read(raw_t *r, uint8_t *buf, size_t cap, uint32_t *len)
{
    uint8_t h[40];
    read_all(r->fd, h, sizeof(h));
    assert_int_equal(get_le(h, 4), 0x31444c43u);
    *len = (uint32_t)get_le(h + 12, 4);
    assert_true(*len <= cap);
    read_all(r->fd, buf, *len);
    return h[4];
}

/* The next CTRL message of the given case (others skipped). */
static Colld__Net__V1__Msg *raw_wait_msg(raw_t *r, int m_case)
{
    static uint8_t buf[1u << 20];
    for (;;) {
        uint32_t len;
        unsigned type = raw_read(r, buf, sizeof(buf), &len);
        if (type != 4) /* CTRL */
            continue;
        Colld__Net__V1__Msg *m = colld__net__v1__msg__unpack(NULL, len, buf);
        assert_non_null(m);
        if ((int)m->m_case == m_case)
            return m;
        colld__net__v1__msg__free_unpacked(m, NULL);
    }
}

static void put_str(uint8_t *buf, size_t *off, const char *s)
{
    size_t l = strlen(s);
    buf[(*off)++] = (uint8_t)l;
    memcpy(buf + *off, s, l);
    *off += l;
}

/* Connect to the daemon at `to` and authenticate as node `name` claiming listen address r->addr. */
static void raw_connect(raw_t *r, const char *to, const char *name)
{
    uint8_t hello[256], nonce_i[32], nonce_a[32], buf[1024], mac[32];
    uint64_t session = 77;
    uint32_t len;
    r->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port_of(to)) };
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(connect(r->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    pthread_mutex_init(&r->send_mu, NULL);
    assert_int_equal(getrandom(nonce_i, sizeof(nonce_i), 0), (ssize_t)sizeof(nonce_i));
    size_t nl = strlen(name), al = strlen(r->addr);
    put_le(hello, 1, 2);
    hello[2] = (uint8_t)nl;
    hello[3] = (uint8_t)al;
    put_le(hello + 4, session, 8);
    memcpy(hello + 12, nonce_i, 32);
    memset(hello + 44, 0, 32);
    memcpy(hello + 76, name, nl);
    memcpy(hello + 76 + nl, r->addr, al);
    assert_true(raw_send(r, 1, hello, (uint32_t)(76 + nl + al)));
    assert_int_equal(raw_read(r, buf, sizeof(buf), &len), 1); /* the acceptor's HELLO */
    memcpy(nonce_a, buf + 12, 32);
    char aname[64] = { 0 }, aaddr[128] = { 0 };
    memcpy(aname, buf + 76, buf[2]);
    memcpy(aaddr, buf + 76 + buf[2], buf[3]);
    size_t off = 0; /* the initiator's proof */
    memcpy(buf, "colld-initiator", 15);
    off = 15;
    memcpy(buf + off, nonce_a, 32);
    off += 32;
    memcpy(buf + off, nonce_i, 32);
    off += 32;
    put_le(buf + off, session, 8);
    off += 8;
    put_str(buf, &off, name);
    put_str(buf, &off, r->addr);
    put_str(buf, &off, aname);
    put_str(buf, &off, aaddr);
    unsigned mlen = 0;
    assert_non_null(HMAC(EVP_sha256(), SECRET, (int)strlen(SECRET), buf, off, mac, &mlen));
    assert_true(raw_send(r, 2, mac, 32));
}

/* Heartbeats every 100 ms until stopped or the daemon closes the link (no cmocka assert here:
 * this is not the test's thread). */
static void *raw_heartbeats(void *arg)
{
    raw_t *r = arg;
    while (!atomic_load(&r->stop) && raw_send(r, 3, NULL, 0))
        usleep(100000);
    return NULL;
}

static void raw_post(raw_t *r, const Colld__Net__V1__Msg *m)
{
    uint8_t buf[4096];
    size_t len = colld__net__v1__msg__pack(m, buf);
    assert_true(raw_send(r, 4, buf, (uint32_t)len));
}

/* A member joins, answers Ready, then reads nothing more (heartbeats going on): the daemon's
 * sends to it stall. The collective times out naming it, and the daemon, rather than keep the
 * rank waiting for sends that will never be written, drops the link to it (NODE_LOST for
 * whatever spans it) and ends the collective. */
static void test_member_stops_reading(void **state)
{
    cluster_t *cl = *state;
    char hex[HARNESS_UID_HEX_LEN], out[300], text[2048];
    colld_unique_id_t id;
    new_uid(cl, hex, &id);
    raw_t r = { 0 };
    int tfd = trap_open(r.addr, sizeof(r.addr)); /* a free port to claim */
    snprintf(out, sizeof(out), "%s/out", cl->tmp);
    const char *x[] = { COLL_BIN, "--socket", cl->h[0].socket, "--uid", hex, "--nranks", "2", "--rank", "0",
                        "--mode", "call", "--call", "allreduce:float32:sum:8388608:0", "--expect",
                        "COLLD_ERR_TIMEOUT", "--out", out, "--timeout-ms", "3000", NULL };
    pid_t pid = harness_spawn(x);
    assert_true(pid > 0);
    raw_connect(&r, cl->addr[0], "mute");
    assert_int_equal(pthread_create(&r.hb, NULL, raw_heartbeats, &r), 0);
    Colld__Net__V1__Join j = COLLD__NET__V1__JOIN__INIT;
    j.unique_id.data = (uint8_t *)id.internal;
    j.unique_id.len = COLLD_WIRE_UNIQUE_ID_BYTES;
    j.tenant = (uint32_t)getuid();
    j.nranks = 2;
    j.rank = 1;
    j.node_name = (char *)"mute";
    j.node_addr = r.addr;
    j.timeout_ms = 20000;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_JOIN;
    m.join = &j;
    raw_post(&r, &m);
    Colld__Net__V1__Msg *got = raw_wait_msg(&r, COLLD__NET__V1__MSG__M_READY); /* Formed came before */
    Colld__Net__V1__Ready ready = *got->ready;
    m.m_case = COLLD__NET__V1__MSG__M_READY;
    m.ready = &ready;
    raw_post(&r, &m); /* from now on it reads nothing */
    colld__net__v1__msg__free_unpacked(got, NULL);

    double t0 = harness_now_ms();
    int rc = harness_wait(pid, 30000);
    harness_read_file(out, text, sizeof(text));
    print_message("after %.0f ms (exit %d): %s", harness_now_ms() - t0, rc, text);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(text, "made no progress for 3000 ms: node mute"));
    assert_non_null(strstr(text, "took none of this node's data"));
    assert_true(log_lines_with(&cl->h[0], "node mute took none of this node's collective data") >= 1);
    atomic_store(&r.stop, 1);
    pthread_join(r.hb, NULL);
    close(r.fd);
    close(tfd);
    pthread_mutex_destroy(&r.send_mu);
    assert_cluster_serves(cl);
}

/* ============================================================================================
 * #13: peers cannot make a daemon dial or keep records
 * ========================================================================================== */

/* Joins naming other addresses (a listening trap, 40 ports nobody listens on) neither make the
 * root dial them nor leave peer records behind; the sender is told why. */
static void test_join_names_other_address(void **state)
{
    cluster_t *cl = *state;
    char hex[HARNESS_UID_HEX_LEN], trap[64];
    colld_unique_id_t id;
    new_uid(cl, hex, &id);
    int tfd = trap_open(trap, sizeof(trap));
    evil_t *e = evil_start("evil", SECRET);
    evil_join(e, cl->addr[0], &id, 0, 1, "evil", trap); /* a bad nranks: the root answers the Join */
    for (int i = 0; i < 40; i++) {
        int fd = trap_open((char[64]){ 0 }, 64); /* a port that was free a moment ago */
        struct sockaddr_in sa;
        socklen_t sl = sizeof(sa);
        getsockname(fd, (struct sockaddr *)&sa, &sl);
        close(fd);
        char a[64];
        snprintf(a, sizeof(a), "127.0.0.1:%u", ntohs(sa.sin_port));
        evil_join(e, cl->addr[0], &id, 0, 1, "evil", a);
    }
    assert_int_equal(evil_wait(e, &e->nfail, 41, 10000), 41); /* each answered over evil's own link */
    print_message("node-a told evil: %s\n", e->fail_detail);
    assert_non_null(strstr(e->fail_detail, "refused a Join from"));
    assert_non_null(strstr(e->fail_detail, "naming another node's address"));
    assert_false(trap_sprung(tfd, 500));
    int peers = peer_count(&cl->h[0]);
    print_message("node-a lists %d peer(s)\n", peers);
    assert_true(peers >= 1 && peers <= 2); /* evil (and node-b, if it was ever connected) */
    close(tfd);
    evil_stop(e);
    assert_cluster_serves(cl);
}

/* A Formed from a node that is not the communicator's root is ignored: the rank waiting on
 * node-b is not handed a layout of the attacker's choosing (nor does node-b dial the trap it
 * names), and the communicator forms for real once rank 0 joins on the root. */
static void test_formed_not_from_root(void **state)
{
    cluster_t *cl = *state;
    char hex[HARNESS_UID_HEX_LEN], trap[64];
    colld_unique_id_t id;
    new_uid(cl, hex, &id);
    int tfd = trap_open(trap, sizeof(trap));
    pid_t p[2];
    const char *extra[] = { "--counts", "1,1000", "--timeout-ms", "20000", NULL };
    assert_true((p[1] = spawn_rank(cl, 1, hex, 1, extra)) > 0);
    assert_int_equal(harness_wait_comm_count(&cl->h[1], 1, 20000), 0);

    evil_t *e = evil_start("evil", SECRET);
    Colld__Net__V1__Node n0 = COLLD__NET__V1__NODE__INIT, n1 = COLLD__NET__V1__NODE__INIT;
    n0.name = (char *)"evil";
    n0.addr = trap;
    n1.name = (char *)"node-b";
    n1.addr = cl->addr[1];
    Colld__Net__V1__Node *nodes[2] = { &n0, &n1 };
    int32_t rank_node[2] = { 0, 1 };
    Colld__Net__V1__Formed f = COLLD__NET__V1__FORMED__INIT;
    f.unique_id.data = (uint8_t *)id.internal;
    f.unique_id.len = COLLD_WIRE_UNIQUE_ID_BYTES;
    f.tenant = (uint32_t)getuid();
    f.xid = 0x1234567;
    f.nranks = 2;
    f.n_nodes = 2;
    f.nodes = nodes;
    f.n_rank_node = 2;
    f.rank_node = rank_node;
    f.chunk_bytes = 65536;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_FORMED;
    m.formed = &f;
    evil_post(e, cl->addr[1], &m);
    assert_int_equal(evil_wait(e, &e->nup, 1, 10000), 1);
    assert_false(trap_sprung(tfd, 500));
    int port = harness_metrics_port(&cl->h[1]); /* the refusal is counted for operators */
    double refused = -1;
    for (int i = 0; i < 100 && refused < 1; i++, usleep(50000))
        refused = harness_metric(port, "colld_net_refused_messages_total");
    assert_true(refused >= 1);

    assert_true((p[0] = spawn_rank(cl, 0, hex, 0, extra)) > 0);
    assert_int_equal(harness_wait_all(p, 2, 60000), 0);
    assert_false(trap_sprung(tfd, 0));
    close(tfd);
    evil_stop(e);
}

/* ============================================================================================
 * Messages that overtake the root's Formed
 * ========================================================================================== */

/* A 3-rank communicator whose root daemon is the evil node (rank 2 there), with rank 0 on node-a
 * and rank 1 on node-b: rank r is spawned with extra[r]; both Joins have reached the root when
 * this returns. The unique id is node-a's with the root address replaced by evil's. */
static evil_t *start_evil_root(cluster_t *cl, const char *const *const extra[2], pid_t p[2])
{
    char hex[HARNESS_UID_HEX_LEN];
    colld_unique_id_t id;
    new_uid(cl, hex, &id);
    evil_t *e = evil_start("evil", SECRET);
    e->mode = EV_ANSWER; /* its rank takes part: it answers each Ready (count 0: no DATA) */
    char *a = (char *)id.internal + COLLD_WIRE_UID_ADDR_OFFSET;
    memset(a, 0, COLLD_WIRE_UNIQUE_ID_BYTES - COLLD_WIRE_UID_ADDR_OFFSET);
    colld_strlcpy(a, e->addr, COLLD_WIRE_UNIQUE_ID_BYTES - COLLD_WIRE_UID_ADDR_OFFSET);
    harness_uid_to_hex(&id, hex);
    const char *argv[2][32];
    for (int r = 0; r < 2; r++) {
        char rk[2] = { (char)('0' + r), 0 };
        const char *head[] = { COLL_BIN, "--socket", cl->h[r].socket, "--uid", hex, "--nranks", "3", "--rank", rk };
        int n = 0;
        for (; n < 9; n++)
            argv[r][n] = head[n];
        for (int i = 0; extra[r][i] && n < 31; i++)
            argv[r][n++] = extra[r][i];
        argv[r][n] = NULL;
        assert_true((p[r] = harness_spawn(argv[r])) > 0);
    }
    assert_int_equal(evil_wait(e, &e->njoin, 2, 20000), 2);
    assert_string_equal(e->join_addr[0], cl->addr[0]);
    assert_string_equal(e->join_addr[1], cl->addr[1]);
    memcpy(e->uid, id.internal, sizeof(e->uid));
    return e;
}

/* The evil root's Formed for the communicator of start_evil_root to node `node` (0 node-a, 1
 * node-b): ring order node-a, node-b, evil; the ring algorithm. */
static void evil_formed(evil_t *e, cluster_t *cl, int node, uint64_t xid)
{
    Colld__Net__V1__Node n[3] = { COLLD__NET__V1__NODE__INIT, COLLD__NET__V1__NODE__INIT, COLLD__NET__V1__NODE__INIT };
    n[0].name = (char *)"node-a";
    n[0].addr = cl->addr[0];
    n[1].name = (char *)"node-b";
    n[1].addr = cl->addr[1];
    n[2].name = (char *)"evil";
    n[2].addr = e->addr;
    Colld__Net__V1__Node *nodes[3] = { &n[0], &n[1], &n[2] };
    int32_t rank_node[3] = { 0, 1, 2 };
    Colld__Net__V1__Formed f = COLLD__NET__V1__FORMED__INIT;
    f.unique_id.data = e->uid;
    f.unique_id.len = COLLD_WIRE_UNIQUE_ID_BYTES;
    f.tenant = (uint32_t)getuid();
    f.xid = xid;
    f.nranks = 3;
    f.n_nodes = 3;
    f.nodes = nodes;
    f.n_rank_node = 3;
    f.rank_node = rank_node;
    f.algo = 1; /* ring */
    f.chunk_bytes = 65536;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_FORMED;
    m.formed = &f;
    evil_post(e, cl->addr[node], &m);
}

/* The root's Formed and the members' messages travel on different links, so a member's Ready
 * can reach a daemon before that daemon has the Formed (what made test_multinode's rootless
 * ring case hang once in CI). Here the root holds node-a's Formed back until node-b has formed,
 * posted collective #1 (count 0) and announced it: node-a must still count node-b's
 * Ready, and every rank completes the collective. */
static void test_ready_before_formed(void **state)
{
    cluster_t *cl = *state;
    pid_t p[2];
    const char *extra[] = { "--mode", "call", "--call", "allreduce:int8:sum:0:0", "--timeout-ms", "8000", NULL };
    evil_t *e = start_evil_root(cl, (const char *const *const[2]){ extra, extra }, p);
    uint64_t xid = 0x5eed0000000001ull;
    evil_formed(e, cl, 1, xid);
    assert_int_equal(evil_wait(e, &e->nready, 1, 20000), 1); /* node-b's Ready (its Ready to node-a went first) */
    usleep(300 * 1000);                                      /* let it reach node-a, which has no Formed yet */
    evil_formed(e, cl, 0, xid);
    double t0 = harness_now_ms();
    int rc = harness_wait_all(p, 2, 30000);
    print_message("both ranks ended %.0f ms after node-a's Formed\n", harness_now_ms() - t0);
    assert_int_equal(rc, 0);
    assert_int_equal(evil_wait(e, &e->nready, 2, 0), 2); /* node-a's and node-b's */
    evil_stop(e);
    assert_cluster_serves(cl);
}

/* The same order for a Fail: node-b formed, its rank 1 posted collective #1 and was killed, and
 * node-b's Fail (naming rank 1) reached node-a before node-a's Formed. Rank 0 must get that
 * fault at its first collective, not a time-out blaming node-b for never being ready. */
static void test_fail_before_formed(void **state)
{
    cluster_t *cl = *state;
    pid_t p[2];
    char out[300], text[2048];
    snprintf(out, sizeof(out), "%s/out", cl->tmp);
    unlink(out);
    const char *x0[] = { "--mode",       "call", "--call",   "allreduce:int8:sum:0:0",
                         "--timeout-ms", "8000", "--expect", "COLLD_ERR_PEER_LOST",
                         "--out",        out,    NULL };
    const char *x1[] = { "--mode", "call", "--call", "allreduce:int8:sum:0:0", "--timeout-ms", "8000", NULL };
    evil_t *e = start_evil_root(cl, (const char *const *const[2]){ x0, x1 }, p);
    uint64_t xid = 0x5eed0000000003ull;
    evil_formed(e, cl, 1, xid);
    assert_int_equal(evil_wait(e, &e->nready, 1, 20000), 1); /* rank 1 posted */
    char pid[16];
    snprintf(pid, sizeof(pid), "%d", (int)p[1]);
    kill(p[1], SIGKILL);
    harness_wait(p[1], 10000);
    assert_int_equal(evil_wait(e, &e->nfail, 1, 20000), 1); /* node-b's Fail (to node-a first) */
    usleep(300 * 1000);                                     /* let it reach node-a, which has no Formed yet */
    evil_formed(e, cl, 0, xid);
    double t0 = harness_now_ms();
    int rc = harness_wait(p[0], 30000);
    harness_read_file(out, text, sizeof(text));
    print_message("rank 0 after %.0f ms (exit %d): %s", harness_now_ms() - t0, rc, text);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(text, "on node node-b"));
    assert_non_null(strstr(text, pid));
    evil_stop(e);
    assert_cluster_serves(cl);
}

/* ============================================================================================
 * #12: strings from peers
 * ========================================================================================== */

/* A member's Fail carries a detail with escape sequences, a newline and invalid UTF-8, and a
 * node name not its own; a Join carries such a node name. What reaches the rank, the log and the
 * other nodes is sanitized and names the node as it authenticated, and the bad Join is refused
 * naming what was wrong. */
static void test_peer_strings(void **state)
{
    cluster_t *cl = *state;
    char text[2048];
    waiter_t w;
    evil_t *e = start_evil_member(cl, EV_IDLE, "COLLD_ERR_TIMEOUT", "10000", &w);
    Colld__Net__V1__Fail f = COLLD__NET__V1__FAIL__INIT;
    f.xid = e->xid;
    f.status = COLLD_ERR_TIMEOUT;
    f.rank = 1;
    f.detail = (char *)"bad\x1b[2J\xff\nFAKE LOG LINE";
    f.node_name = (char *)"ev\x1b]0;il";
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_FAIL;
    m.fail = &f;
    evil_post(e, cl->addr[0], &m);
    finish_waiter(&w, text, sizeof(text), 20000);
    assert_non_null(strstr(text, "on node evil: bad?[2J??FAKE LOG LINE")); /* its name as it authenticated */
    assert_null(strchr(text, '\x1b'));
    release_waiter(&w);
    evil_stop(e);

    char hex[HARNESS_UID_HEX_LEN];
    colld_unique_id_t id;
    new_uid(cl, hex, &id);
    e = evil_start("evil", SECRET);
    evil_join(e, cl->addr[0], &id, 2, 1, "ev\x1b[31mil\xc0\x80", e->addr);
    assert_int_equal(evil_wait(e, &e->nfail, 1, 10000), 1);
    print_message("node-a told evil: %s\n", e->fail_detail);
    assert_non_null(strstr(e->fail_detail, "the Join's node name is not the one it authenticated with"));
    assert_false(log_has_byte(&cl->h[0], '\x1b'));
    assert_false(log_has_byte(&cl->h[0], '\xc0'));
    evil_stop(e);
    assert_cluster_serves(cl);
}

/* ============================================================================================
 * Link measurements and probes from a hostile peer (issue 18 item 1)
 * ========================================================================================== */

/* A frame with header fields (HEARTBEAT flags or a DATA header), as the transport encodes them. */
static bool raw_send_hdr(raw_t *r, unsigned type, uint8_t phase, uint8_t flags, uint64_t xid, uint64_t seq,
                         uint64_t offset, const void *payload, uint32_t len)
{
    uint8_t h[40] = { 0 };
    put_le(h, 0x31444c43u, 4);
    h[4] = (uint8_t)type;
    h[5] = phase;
    h[6] = flags;
    put_le(h + 12, len, 4);
    put_le(h + 16, xid, 8);
    put_le(h + 24, seq, 8);
    put_le(h + 32, offset, 8);
    pthread_mutex_lock(&r->send_mu);
    bool ok = write_all(r->fd, h, sizeof(h)) && (!len || write_all(r->fd, payload, len));
    pthread_mutex_unlock(&r->send_mu);
    return ok;
}

/* The next HEARTBEAT with all of `flags` set (other frames skipped): its xid and seq. */
static void raw_wait_heartbeat(raw_t *r, uint8_t flags, uint64_t *xid, uint64_t *seq)
{
    static uint8_t buf[1u << 20];
    for (;;) {
        uint8_t h[40];
        read_all(r->fd, h, sizeof(h));
        uint32_t len = (uint32_t)get_le(h + 12, 4);
        assert_true(len <= sizeof(buf));
        read_all(r->fd, buf, len);
        if (h[4] == 3 && (h[6] & flags) == flags) {
            *xid = get_le(h + 16, 8);
            *seq = get_le(h + 24, 8);
            return;
        }
    }
}

/* A number field of the peer named `name` in `collctl --json status` of h (-1 if absent). */
static double peer_json_num(harness_t *h, const char *name, const char *field)
{
    static char out[65536];
    char key[96];
    const char *argv[] = { COLLCTL_BIN, "--socket", h->socket, "--json", "status", NULL };
    if (harness_capture(argv, out, sizeof(out), 10000) != 0)
        return -1;
    snprintf(key, sizeof(key), "\"name\":\"%s\"", name);
    const char *p = strstr(out, key);
    snprintf(key, sizeof(key), "\"%s\":", field);
    p = p ? strstr(p, key) : NULL;
    return p ? atof(p + strlen(key)) : -1;
}

/* Wait until the refused-message counter in h's metrics reaches want. */
static bool refused_reaches(int port, double want)
{
    double dl = harness_now_ms() + 10000;
    while (harness_metric(port, "colld_net_refused_messages_total") < want && harness_now_ms() < dl)
        usleep(20000);
    return harness_metric(port, "colld_net_refused_messages_total") >= want;
}

/* An authenticated peer lies in the link measurements and abuses probes: an echo reply for a
 * request never made and a rate above the bound are ignored (the daemon's RTT and send rate stay
 * unmeasured), only the reply to the daemon's outstanding request counts; probe data without a
 * probe request, a request for too many bytes, a second request within the minimum gap and data
 * beyond a served probe's size are refused and counted, a valid request is served; the daemon
 * goes on serving. */
static void test_link_measurements_hostile(void **state)
{
    cluster_t *cl = *state;
    raw_t r = { 0 };
    int tfd = trap_open(r.addr, sizeof(r.addr));
    int mport = harness_metrics_port(&cl->h[0]);
    assert_true(mport > 0);
    double refused0 = harness_metric(mport, "colld_net_refused_messages_total");
    raw_connect(&r, cl->addr[0], "liar");
    assert_int_equal(pthread_create(&r.hb, NULL, raw_heartbeats, &r), 0);
    uint64_t xid = 0, seq = 0;

    /* a forged echo reply and an impossible rate, then an echo request: its answer proves that
     * the daemon has taken the two before it */
    assert_true(raw_send_hdr(&r, 3, 0, 0x02 | 0x04, 123456789, 0, 2000000000000ull, NULL, 0));
    assert_true(raw_send_hdr(&r, 3, 0, 0x01, 0, 4242, 0, NULL, 0));
    do
        raw_wait_heartbeat(&r, 0x02, &xid, &seq);
    while (xid != 4242);
    assert_true(peer_json_num(&cl->h[0], "liar", "rtt_ms") == 0);
    assert_true(peer_json_num(&cl->h[0], "liar", "tx_rate") == 0);

    /* the answer to the daemon's own outstanding request, and a plausible rate, count (answered
     * again should the daemon have sent a newer request meanwhile) */
    double dl = harness_now_ms() + 10000;
    do {
        raw_wait_heartbeat(&r, 0x01, &xid, &seq);
        assert_true(raw_send_hdr(&r, 3, 0, 0x02 | 0x04, seq, 0, 5000000, NULL, 0));
        usleep(50000);
    } while ((peer_json_num(&cl->h[0], "liar", "rtt_ms") <= 0 || peer_json_num(&cl->h[0], "liar", "tx_rate") != 5e6) &&
             harness_now_ms() < dl);
    assert_true(peer_json_num(&cl->h[0], "liar", "rtt_ms") > 0);
    assert_true(peer_json_num(&cl->h[0], "liar", "tx_rate") == 5e6);

    /* probe data nobody asked for */
    static uint8_t zeros[65536];
    assert_true(raw_send_hdr(&r, 5, 64, 0, 0, 99, 0, zeros, 1000));
    assert_true(refused_reaches(mport, refused0 + 1));
    /* a probe of 1 GiB */
    Colld__Net__V1__ProbeReq pq = COLLD__NET__V1__PROBE_REQ__INIT;
    pq.id = 7;
    pq.bytes = 1ull << 30;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_PROBE_REQ;
    m.probe_req = &pq;
    raw_post(&r, &m);
    assert_true(refused_reaches(mport, refused0 + 2));
    /* a valid one is served: acknowledged (its bytes come back too) */
    pq.bytes = 256u << 10;
    raw_post(&r, &m);
    Colld__Net__V1__Msg *ack = raw_wait_msg(&r, COLLD__NET__V1__MSG__M_PROBE_ACK);
    assert_int_equal(ack->probe_ack->id, 7);
    colld__net__v1__msg__free_unpacked(ack, NULL);
    /* another one at once: refused (one per second per peer) */
    pq.id = 8;
    raw_post(&r, &m);
    assert_true(refused_reaches(mport, refused0 + 3));
    /* data beyond the served probe's 256 KiB */
    assert_true(raw_send_hdr(&r, 5, 64, 0, 0, 7, 256u << 10, zeros, 1000));
    assert_true(refused_reaches(mport, refused0 + 4));
    /* the served probe completes: its timing comes back, the first frame not timed */
    for (uint64_t off = 0; off < (256u << 10); off += sizeof(zeros))
        assert_true(raw_send_hdr(&r, 5, 64, 0, 0, 7, off, zeros, sizeof(zeros)));
    Colld__Net__V1__Msg *res = raw_wait_msg(&r, COLLD__NET__V1__MSG__M_PROBE_RESULT);
    assert_int_equal(res->probe_result->id, 7);
    assert_int_equal(res->probe_result->bytes, (256u << 10) - sizeof(zeros));
    assert_true(res->probe_result->ns > 0);
    colld__net__v1__msg__free_unpacked(res, NULL);
    assert_true(harness_metric(mport, "colld_net_refused_messages_total") == refused0 + 4);

    atomic_store(&r.stop, 1);
    pthread_join(r.hb, NULL);
    close(r.fd);
    close(tfd);
    pthread_mutex_destroy(&r.send_mu);
    assert_cluster_serves(cl);
}

/* An argument runs only the tests whose names match it (cmocka's filter, * as a wildcard). */
int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_handshake_flood, setup, teardown),
        cmocka_unit_test_setup_teardown(test_member_sends_no_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_member_sends_bad_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_member_stops_reading, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_silent_members, setup, teardown),
        cmocka_unit_test_setup_teardown(test_join_names_other_address, setup, teardown),
        cmocka_unit_test_setup_teardown(test_formed_not_from_root, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_strings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ready_before_formed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fail_before_formed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_measurements_hostile, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
