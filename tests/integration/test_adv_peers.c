/*
 * test_adv_peers.c - what a tenant can make a --listen daemon dial, and what a peer holding the
 * cluster secret can make it log (issue 26 rows 7 and 8).
 *
 * Real daemons on 127.0.0.1. The tenant is colld-test-rank run under uid 65534 (fork, setuid,
 * exec; the test needs root and skips with 77 without it) with a unique id made by hand: 16
 * random bytes, the multi-node magic and any HOST:PORT as the root daemon's address, as anyone can
 * write one. The peer is written by hand on a blocking socket (the wire format of
 * transport/tcp/tcp_internal.h, the HMAC handshake with the secret), so that it can send a frame
 * the real transport never sends.
 *
 * - test_id_names_any_address: a daemon without --peers is given ids naming a listening trap and
 *   a closed port. Before the fix it dialed both and the detail told them apart (the trap's
 *   handshake failure, "connection refused"): a port scanner for tenants. Now it dials neither and
 *   both are refused alike with PERMISSION_DENIED.
 * - test_id_names_known_peer: a daemon that proved the secret to it may be named: the Join reaches
 *   it over its own link, and when it goes, the tenant's detail is the one text of an unreachable
 *   root.
 * - test_allowed_roots_fail_alike: with --peers 127.0.0.1:*, an id naming a port that accepts and
 *   closes and one naming a closed port are dialed, and fail with the same text.
 * - test_peer_log_flood: a peer with the secret reconnects under 20 identities, each sending a
 *   frame of an unknown type. Before the fix every loss was two WARN lines (13,650 lines, 1.9 MB
 *   in 25 s); now each call site logs once per 5 s and then says how many it suppressed.
 * - test_hostile_doctor_reports (issue 30 item 5): a peer with the secret answers `collctl
 *   doctor`'s DoctorReq with a report that does not decode, one naming a communicator with a
 *   terminal escape sequence, one of too many communicators: the doctor names the peer and why
 *   its report was refused, prints the name sanitized, never waits beyond its time; a burst
 *   of 40 DoctorReqs from the peer is served at most 16 a second, the rest refused with a reason;
 *   a tenant (uid 65534) has one doctor across nodes at a time, an administrator's runs beside it.
 */
#include "colld.pb-c.h"
#include "colld_net.pb-c.h"
#include "common/util.h"
#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#define TENANT 65534 /* nobody */
#define SECRET "this-is-the-test-cluster-secret"
#define IDENTITIES 20

/* ============================================================================================
 * The daemon, the tenant
 * ========================================================================================== */

static harness_t live_h;
static char secret_path[64];

static int teardown(void **state)
{
    (void)state;
    harness_cleanup(&live_h);
    unlink(secret_path);
    return 0;
}

/* A --listen daemon whose session socket other uids may use; extra: more arguments (NULL ok). */
static void start(harness_t *h, const char *const *extra, char *listen, size_t len)
{
    snprintf(secret_path, sizeof(secret_path), "/tmp/colld-adv-peers-secret-%d", (int)getpid());
    FILE *f = fopen(secret_path, "w");
    assert_non_null(f);
    fputs(SECRET "\n", f);
    fclose(f);
    assert_int_equal(chmod(secret_path, 0600), 0);
    const char *argv[24] = { "--socket-mode", "0666", "--listen", "127.0.0.1:0", "--node-name", "node-a",
                             "--cluster-secret-file", secret_path };
    int n = 8;
    for (int i = 0; extra && extra[i] && n < 23; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    memset(h, 0, sizeof(*h));
    assert_int_equal(harness_daemon_start(h, argv), 0);
    assert_int_equal(chmod(h->dir, 0755), 0);
    harness_net_t net;
    assert_int_equal(harness_net_status(h, &net), 0);
    colld_strlcpy(listen, net.listen, len);
}

/* A unique id as a tenant can write one: random bytes, the magic, `root` as the root's address. */
static void handmade_id(const char *root, char *hex)
{
    colld_unique_id_t id;
    memset(&id, 0, sizeof(id));
    assert_int_equal(getrandom(id.internal, COLLD_WIRE_UID_RANDOM_BYTES, 0), COLLD_WIRE_UID_RANDOM_BYTES);
    memcpy(id.internal + COLLD_WIRE_UID_RANDOM_BYTES, COLLD_WIRE_UID_NET_MAGIC, 4);
    colld_strlcpy(id.internal + COLLD_WIRE_UID_ADDR_OFFSET, root, sizeof(id.internal) - COLLD_WIRE_UID_ADDR_OFFSET);
    harness_uid_to_hex(&id, hex);
}

/* Rank 1 of 2 with the id, as uid TENANT, expecting `status`: its exit code, its stderr into out
 * (the libcolld line with the detail). */
static int tenant_join(harness_t *h, const char *hex, const char *status, int timeout_ms, char *out, size_t len)
{
    char tmo[16];
    snprintf(tmo, sizeof(tmo), "%d", timeout_ms);
    const char *argv[] = { RANK_BIN, "--socket", h->socket, "--uid", hex, "--nranks", "2", "--rank", "1",
                           "--expect", status, "--timeout-ms", tmo, NULL };
    int pipefd[2];
    assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* only async-signal-safe calls until exec: this process runs gRPC threads */
        if (dup2(pipefd[1], STDERR_FILENO) < 0 || dup2(pipefd[1], STDOUT_FILENO) < 0 || setgroups(0, NULL) < 0 ||
            setgid(TENANT) < 0 || setuid(TENANT) < 0)
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(pipefd[1]);
    size_t got = 0;
    double end = harness_now_ms() + timeout_ms + 20000;
    for (;;) {
        struct pollfd p = { .fd = pipefd[0], .events = POLLIN };
        int left = (int)(end - harness_now_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        ssize_t r = read(pipefd[0], out + got, len - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
        if (got == len - 1)
            break;
    }
    out[got] = '\0';
    close(pipefd[0]);
    return harness_wait(pid, 5000);
}

/* The detail in a rank's output ("colld_comm_init_rank(rank 1 of 2): STATUS: detail"), with the
 * address `addr` replaced by "ADDR", into out. */
static void detail_of(const char *text, const char *addr, char *out, size_t len)
{
    const char *p = strstr(text, "colld_comm_init_rank(");
    p = p ? strstr(p, "): ") : NULL;
    assert_non_null(p);
    p += 3;
    size_t n = 0, al = strlen(addr);
    while (*p && *p != '\n' && n + 5 < len) {
        if (strncmp(p, addr, al) == 0) {
            memcpy(out + n, "ADDR", 4);
            n += 4;
            p += al;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
}

/* Lines of the daemon's log that contain `text` (NULL: every line); their bytes into *bytes. */
static int log_lines(const harness_t *h, const char *text, const char *level, long *bytes)
{
    FILE *f = fopen(h->log, "r");
    char line[4096];
    int n = 0;
    if (bytes)
        *bytes = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if ((!text || strstr(line, text)) && (!level || strstr(line, level))) {
            n++;
            if (bytes)
                *bytes += (long)strlen(line);
        }
    fclose(f);
    return n;
}

/* ============================================================================================
 * Traps: ports nobody announced
 * ========================================================================================== */

typedef struct {
    int fd;
    char addr[64];
    bool close_at_once; /* accept and close each connection (a thread), else never accept */
    pthread_t t;
    atomic_int accepted, stop;
} trap_t;

static void *trap_main(void *arg)
{
    trap_t *t = arg;
    while (!atomic_load(&t->stop)) {
        struct pollfd p = { .fd = t->fd, .events = POLLIN };
        if (poll(&p, 1, 20) != 1)
            continue;
        int c = accept(t->fd, NULL, NULL);
        if (c >= 0) {
            atomic_fetch_add(&t->accepted, 1);
            close(c);
        }
    }
    return NULL;
}

static void trap_open(trap_t *t, bool close_at_once)
{
    memset(t, 0, sizeof(*t));
    t->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    assert_true(t->fd >= 0);
    assert_int_equal(bind(t->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(t->fd, 64), 0);
    assert_int_equal(getsockname(t->fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(t->addr, sizeof(t->addr), "127.0.0.1:%u", ntohs(sa.sin_port));
    t->close_at_once = close_at_once;
    if (close_at_once)
        assert_int_equal(pthread_create(&t->t, NULL, trap_main, t), 0);
}

/* Whether anything connected to the trap (so far). */
static bool trap_sprung(trap_t *t)
{
    if (t->close_at_once)
        return atomic_load(&t->accepted) > 0;
    struct pollfd p = { .fd = t->fd, .events = POLLIN };
    return poll(&p, 1, 0) > 0;
}

static void trap_close(trap_t *t)
{
    if (t->close_at_once) {
        atomic_store(&t->stop, 1);
        pthread_join(t->t, NULL);
    }
    close(t->fd);
}

/* An address whose port nothing listens on (it was free a moment ago). */
static void closed_port(char *addr, size_t len)
{
    trap_t t;
    trap_open(&t, false);
    colld_strlcpy(addr, t.addr, len);
    trap_close(&t);
}

/* ============================================================================================
 * A peer written by hand (the wire format of transport/tcp/tcp_internal.h)
 * ========================================================================================== */

typedef struct {
    int fd;
    char addr[64]; /* the listen address it claims */
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

static bool read_all(int fd, void *buf, size_t len)
{
    uint8_t *b = buf;
    while (len > 0) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        if (poll(&pfd, 1, 10000) != 1)
            return false;
        ssize_t r = read(fd, b, len);
        if (r <= 0)
            return false;
        b += r;
        len -= (size_t)r;
    }
    return true;
}

/* One frame of `type`; false when the link is gone. */
static bool raw_send(raw_t *r, unsigned type, const void *payload, uint32_t len)
{
    uint8_t h[40] = { 0 };
    put_le(h, 0x31444c43u, 4); /* "CLD1" */
    h[4] = (uint8_t)type;
    put_le(h + 12, len, 4);
    return write_all(r->fd, h, sizeof(h)) && (!len || write_all(r->fd, payload, len));
}

/* The next frame: its type (0 when the link ended), its payload into buf. */
static unsigned raw_read(raw_t *r, uint8_t *buf, size_t cap, uint32_t *len)
{
    uint8_t h[40];
    if (!read_all(r->fd, h, sizeof(h)) || get_le(h, 4) != 0x31444c43u)
        return 0;
    *len = (uint32_t)get_le(h + 12, 4);
    if (*len > cap || !read_all(r->fd, buf, *len))
        return 0;
    return h[4];
}

static void put_str(uint8_t *buf, size_t *off, const char *s)
{
    size_t l = strlen(s);
    buf[(*off)++] = (uint8_t)l;
    memcpy(buf + *off, s, l);
    *off += l;
}

/* Connect to the daemon at `to` and authenticate as node `name` claiming r->addr. False when the
 * daemon did not answer the handshake. */
static bool raw_connect(raw_t *r, const char *to, const char *name)
{
    uint8_t hello[256], nonce_i[32], nonce_a[32], buf[1024], mac[32];
    uint64_t session; /* a new round of connections each time, as a restarted daemon's */
    uint32_t len;
    const char *colon = strrchr(to, ':');
    int one = 1;
    r->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)) };
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (r->fd < 0 || setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 ||
        connect(r->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        return false;
    if (getrandom(nonce_i, sizeof(nonce_i), 0) != (ssize_t)sizeof(nonce_i) ||
        getrandom(&session, sizeof(session), 0) != (ssize_t)sizeof(session))
        return false;
    size_t nl = strlen(name), al = strlen(r->addr);
    put_le(hello, 1, 2);
    hello[2] = (uint8_t)nl;
    hello[3] = (uint8_t)al;
    put_le(hello + 4, session, 8);
    memcpy(hello + 12, nonce_i, 32);
    memset(hello + 44, 0, 32);
    memcpy(hello + 76, name, nl);
    memcpy(hello + 76 + nl, r->addr, al);
    if (!raw_send(r, 1, hello, (uint32_t)(76 + nl + al)) || raw_read(r, buf, sizeof(buf), &len) != 1)
        return false; /* the acceptor's HELLO */
    memcpy(nonce_a, buf + 12, 32);
    char aname[64] = { 0 }, aaddr[128] = { 0 };
    memcpy(aname, buf + 76, buf[2]);
    memcpy(aaddr, buf + 76 + buf[2], buf[3]);
    size_t off = 15; /* the initiator's proof */
    memcpy(buf, "colld-initiator", 15);
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
    if (!HMAC(EVP_sha256(), SECRET, (int)strlen(SECRET), buf, off, mac, &mlen))
        return false;
    return raw_send(r, 2, mac, 32);
}

/* The next CTRL message of the given case (others skipped); NULL when the link ended first. */
static Colld__Net__V1__Msg *raw_wait_msg(raw_t *r, int m_case)
{
    static uint8_t buf[1u << 20];
    for (;;) {
        uint32_t len;
        unsigned type = raw_read(r, buf, sizeof(buf), &len);
        if (type == 0)
            return NULL;
        if (type != 4) /* CTRL */
            continue;
        Colld__Net__V1__Msg *m = colld__net__v1__msg__unpack(NULL, len, buf);
        if (m && (int)m->m_case == m_case)
            return m;
        if (m)
            colld__net__v1__msg__free_unpacked(m, NULL);
    }
}

/* ============================================================================================
 * Row 7: a tenant's unique id names the root daemon's address
 * ========================================================================================== */

static void test_id_names_any_address(void **state)
{
    (void)state;
    harness_t *h = &live_h;
    char listen[128], hex[HARNESS_UID_HEX_LEN], out[2][8192], detail[2][1024], closed[64];
    start(h, NULL, listen, sizeof(listen));
    trap_t open_trap;
    trap_open(&open_trap, true);
    closed_port(closed, sizeof(closed));
    const char *roots[2] = { open_trap.addr, closed };
    int rc[2];
    double t0 = harness_now_ms();
    for (int i = 0; i < 2; i++) {
        handmade_id(roots[i], hex);
        rc[i] = tenant_join(h, hex, "COLLD_ERR_PERMISSION_DENIED", 3000, out[i], sizeof(out[i]));
        detail_of(out[i], roots[i], detail[i], sizeof(detail[i]));
        print_message("id naming %s (%s): exit %d: %s\n", roots[i], i ? "closed" : "open, accepts and closes", rc[i],
                      detail[i]);
    }
    double took = harness_now_ms() - t0;
    bool sprung = trap_sprung(&open_trap);
    trap_close(&open_trap);
    print_message("the trap was %sdialed; both joins answered in %.0f ms\n", sprung ? "" : "not ", took);
    assert_false(sprung);
    assert_string_equal(detail[0], detail[1]);
    assert_int_equal(rc[0], 0);
    assert_int_equal(rc[1], 0);
    assert_non_null(strstr(detail[0], "COLLD_ERR_PERMISSION_DENIED"));
    assert_non_null(strstr(detail[0], "--peers"));
    assert_int_equal(harness_cleanup(h), 0);
}

static void test_id_names_known_peer(void **state)
{
    (void)state;
    harness_t *h = &live_h;
    char listen[128], hex[HARNESS_UID_HEX_LEN], out[8192], detail[1024];
    start(h, NULL, listen, sizeof(listen));
    raw_t r;
    closed_port(r.addr, sizeof(r.addr)); /* the address it claims: nobody listens there */
    assert_true(raw_connect(&r, listen, "known"));
    double end = harness_now_ms() + 10000; /* the daemon has taken it as a peer */
    harness_net_t net = { 0 };
    while ((harness_net_status(h, &net) < 0 || net.peers_up < 1) && harness_now_ms() < end)
        usleep(20000);
    assert_int_equal(net.peers_up, 1);
    handmade_id(r.addr, hex);
    /* The rank waits in its join; its daemon's Join reaches the peer over the peer's own link. */
    char tmo[16] = "20000";
    const char *argv[] = { RANK_BIN, "--socket", h->socket, "--uid", hex, "--nranks", "2", "--rank", "1",
                           "--expect", "COLLD_ERR_NODE_LOST", "--timeout-ms", tmo, NULL };
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull < 0 || dup2(devnull, STDERR_FILENO) < 0 || setgroups(0, NULL) < 0 || setgid(TENANT) < 0 ||
            setuid(TENANT) < 0)
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    Colld__Net__V1__Msg *m = raw_wait_msg(&r, COLLD__NET__V1__MSG__M_JOIN);
    assert_non_null(m);
    print_message("the peer got a Join for rank %d of tenant %u from node %s\n", m->join->rank, m->join->tenant,
                  m->join->node_name);
    assert_int_equal(m->join->tenant, TENANT);
    assert_int_equal(m->join->rank, 1);
    colld__net__v1__msg__free_unpacked(m, NULL);
    close(r.fd); /* the root goes away: the rank's join fails, in the one text of a lost root */
    assert_int_equal(harness_wait(pid, 30000), 0);
    closed_port(r.addr, sizeof(r.addr)); /* a root that never connected: not dialed */
    handmade_id(r.addr, hex);
    assert_int_equal(tenant_join(h, hex, "COLLD_ERR_PERMISSION_DENIED", 3000, out, sizeof(out)), 0);
    detail_of(out, r.addr, detail, sizeof(detail));
    print_message("an unknown root: %s\n", detail);
    assert_int_equal(harness_cleanup(h), 0);
}

static void test_allowed_roots_fail_alike(void **state)
{
    (void)state;
    harness_t *h = &live_h;
    char listen[128], hex[HARNESS_UID_HEX_LEN], out[2][8192], detail[2][1024], closed[64];
    const char *extra[] = { "--peers", "127.0.0.1:*", NULL };
    start(h, extra, listen, sizeof(listen));
    trap_t open_trap;
    trap_open(&open_trap, true);
    closed_port(closed, sizeof(closed));
    const char *roots[2] = { open_trap.addr, closed };
    for (int i = 0; i < 2; i++) {
        handmade_id(roots[i], hex);
        assert_int_equal(tenant_join(h, hex, "COLLD_ERR_NODE_LOST", 10000, out[i], sizeof(out[i])), 0);
        detail_of(out[i], roots[i], detail[i], sizeof(detail[i]));
        print_message("allowed root %s (%s): %s\n", roots[i], i ? "closed" : "open, accepts and closes", detail[i]);
    }
    bool sprung = trap_sprung(&open_trap);
    trap_close(&open_trap);
    assert_true(sprung); /* --peers allows it: it was dialed */
    assert_string_equal(detail[0], detail[1]);
    assert_null(strstr(detail[0], "refused"));
    assert_int_equal(harness_cleanup(h), 0);
}

/* ============================================================================================
 * Row 8: a peer holding the secret floods the log
 * ========================================================================================== */

static void test_peer_log_flood(void **state)
{
    (void)state;
    harness_t *h = &live_h;
    char listen[128];
    start(h, NULL, listen, sizeof(listen));
    long before_bytes;
    int before = log_lines(h, NULL, " WARN ", &before_bytes);
    uint8_t bad[16] = { 0 };
    int cycles = 0;
    double t0 = harness_now_ms();
    while (harness_now_ms() < t0 + 2000) { /* 20 identities, each connecting again and again */
        raw_t r;
        char name[32];
        snprintf(name, sizeof(name), "evil-%d", cycles % IDENTITIES);
        snprintf(r.addr, sizeof(r.addr), "127.0.0.1:%d", 61000 + cycles % IDENTITIES);
        if (raw_connect(&r, listen, name) && raw_send(&r, 99, bad, sizeof(bad))) { /* an unknown frame */
            uint8_t buf[256];
            uint32_t len;
            while (raw_read(&r, buf, sizeof(buf), &len) != 0) /* until the daemon drops the link */
                ;
            cycles++;
        }
        close(r.fd);
    }
    usleep(200000);
    long bytes;
    int lines = log_lines(h, NULL, " WARN ", &bytes) - before;
    bytes -= before_bytes;
    print_message("%d bad-frame connections under %d identities in 2 s: %d WARN lines, %ld bytes\n", cycles,
                  IDENTITIES, lines, bytes);
    assert_true(cycles >= 100);
    assert_true(lines <= 8);
    /* Once the interval (5 s) is over, the next loss is logged with the count of the lines
     * suppressed: one more loss every 500 ms until that line shows (a loaded machine may have
     * logged the first line late). */
    int summaries = 0;
    while (summaries == 0 && harness_now_ms() < t0 + 15000) {
        usleep(500000);
        raw_t r;
        snprintf(r.addr, sizeof(r.addr), "127.0.0.1:%d", 61000);
        if (raw_connect(&r, listen, "evil-0") && raw_send(&r, 99, bad, sizeof(bad))) {
            uint8_t buf[256];
            uint32_t len;
            while (raw_read(&r, buf, sizeof(buf), &len) != 0)
                ;
        }
        close(r.fd);
        usleep(100000);
        summaries = log_lines(h, "similar messages suppressed)", " WARN ", NULL);
    }
    print_message("%d WARN line(s) with the count of those suppressed\n", summaries);
    assert_true(summaries >= 1);
    /* The daemon still serves: a communicator of its own tenants runs exact all-reduces. */
    pid_t p[2];
    assert_int_equal(harness_spawn_ranks(h, 2, NULL, p), 0);
    assert_int_equal(harness_wait_all(p, 2, 30000), 0);
    assert_int_equal(harness_cleanup(h), 0);
}

/* ============================================================================================
 * Issue 30 item 5: a peer's doctor report is hostile input
 * ========================================================================================== */

typedef struct {
    harness_t *h;
    char out[65536];
    int rc;
} doc_t;

static void *doctor_main(void *arg)
{
    doc_t *d = arg;
    const char *argv[] = { COLLCTL_BIN, "--socket", d->h->socket, "doctor", "--node-timeout-ms", "3000", NULL };
    d->rc = harness_capture(argv, d->out, sizeof(d->out), 20000);
    return NULL;
}

/* Run collctl doctor on h while the raw peer answers its DoctorReq with `report` (len bytes);
 * the doctor's output in d. */
static void doctor_answered(harness_t *h, raw_t *r, const uint8_t *report, size_t len, doc_t *d)
{
    d->h = h;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, doctor_main, d), 0);
    Colld__Net__V1__Msg *q = raw_wait_msg(r, COLLD__NET__V1__MSG__M_DOCTOR_REQ);
    assert_non_null(q);
    Colld__Net__V1__DoctorReport a = COLLD__NET__V1__DOCTOR_REPORT__INIT;
    a.id = q->doctor_req->id;
    a.report.data = (uint8_t *)report;
    a.report.len = len;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_DOCTOR_REPORT;
    m.doctor_report = &a;
    size_t plen = colld__net__v1__msg__get_packed_size(&m);
    uint8_t *buf = malloc(plen);
    assert_non_null(buf);
    colld__net__v1__msg__pack(&m, buf);
    assert_true(raw_send(r, 4, buf, (uint32_t)plen));
    free(buf);
    colld__net__v1__msg__free_unpacked(q, NULL);
    pthread_join(t, NULL);
    print_message("%s", d->out);
}

/* collctl doctor --node-timeout-ms ms on h as uid TENANT, its stdout and stderr into `path`; its pid. */
static pid_t tenant_doctor(harness_t *h, const char *ms, const char *path)
{
    const char *argv[] = { COLLCTL_BIN, "--socket", h->socket, "doctor", "--node-timeout-ms", ms, NULL };
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    assert_true(fd >= 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* only async-signal-safe calls until exec */
        if (dup2(fd, STDERR_FILENO) < 0 || dup2(fd, STDOUT_FILENO) < 0 || setgroups(0, NULL) < 0 ||
            setgid(TENANT) < 0 || setuid(TENANT) < 0)
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fd);
    return pid;
}

/* A packed NodeReport of ncomms broken communicators named `name`. */
static uint8_t *node_report(const char *name, size_t ncomms, size_t *len)
{
    Colld__V1__StatusResponse st = COLLD__V1__STATUS_RESPONSE__INIT;
    Colld__V1__CommInfo *ci = calloc(ncomms, sizeof(*ci)), **cp = calloc(ncomms, sizeof(*cp));
    assert_true(ci && cp);
    for (size_t i = 0; i < ncomms; i++) {
        colld__v1__comm_info__init(&ci[i]);
        ci[i].id = i + 1;
        ci[i].name = (char *)name;
        ci[i].state = (char *)"broken";
        ci[i].last_error = (char *)"COLLD_ERR_TIMEOUT: made up";
        ci[i].nranks = 2;
        ci[i].slowest_rank = -1;
        cp[i] = &ci[i];
    }
    st.comms = cp;
    st.n_comms = ncomms;
    st.node_name = (char *)"evil";
    Colld__V1__NodeReport r = COLLD__V1__NODE_REPORT__INIT;
    r.status = &st;
    *len = colld__v1__node_report__get_packed_size(&r);
    uint8_t *buf = malloc(*len);
    assert_non_null(buf);
    colld__v1__node_report__pack(&r, buf);
    free(ci);
    free(cp);
    return buf;
}

static void test_hostile_doctor_reports(void **state)
{
    (void)state;
    harness_t *h = &live_h;
    char listen[128];
    start(h, NULL, listen, sizeof(listen));
    raw_t r;
    snprintf(r.addr, sizeof(r.addr), "127.0.0.1:61000");
    assert_true(raw_connect(&r, listen, "evil"));
    harness_net_t net;
    for (int i = 0; i < 100 && (harness_net_status(h, &net) != 0 || net.peers_up < 1); i++)
        usleep(20000);
    assert_int_equal(net.peers_up, 1);
    static doc_t d;
    /* a report that does not decode */
    const uint8_t junk[] = { 0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x34 };
    doctor_answered(h, &r, junk, sizeof(junk), &d);
    assert_int_equal(d.rc, 1);
    assert_non_null(strstr(d.out, "PROBLEM node       [evil] node evil (127.0.0.1:61000): its report does not decode"));
    /* a communicator named with a terminal escape sequence: shown, sanitized */
    size_t len;
    uint8_t *rep = node_report("x\x1b]0;pwned\x07y", 1, &len);
    doctor_answered(h, &r, rep, len, &d);
    free(rep);
    assert_int_equal(d.rc, 1);
    assert_non_null(strstr(d.out, "PROBLEM broken     [evil] communicator 1 'x?]0;pwned?y' (2 ranks) is broken: "
                                  "COLLD_ERR_TIMEOUT: made up"));
    assert_null(strchr(d.out, 0x1b));
    /* too many communicators */
    rep = node_report("c", 4097, &len);
    doctor_answered(h, &r, rep, len, &d);
    free(rep);
    assert_int_equal(d.rc, 1);
    assert_non_null(strstr(d.out, "[evil] node evil (127.0.0.1:61000): its report is refused: too many communicators"));
    /* 40 DoctorReqs at once: at most 16 a second are served, the others refused with the reason */
    double burst0 = harness_now_ms();
    for (int i = 0; i < 40; i++) {
        Colld__Net__V1__DoctorReq q = COLLD__NET__V1__DOCTOR_REQ__INIT;
        q.id = 1000 + (uint64_t)i;
        q.admin = true;
        Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
        m.m_case = COLLD__NET__V1__MSG__M_DOCTOR_REQ;
        m.doctor_req = &q;
        uint8_t buf[64];
        size_t plen = colld__net__v1__msg__get_packed_size(&m);
        colld__net__v1__msg__pack(&m, buf);
        assert_true(raw_send(&r, 4, buf, (uint32_t)plen));
    }
    int served = 0, refused = 0;
    for (int i = 0; i < 40; i++) {
        Colld__Net__V1__Msg *a = raw_wait_msg(&r, COLLD__NET__V1__MSG__M_DOCTOR_REPORT);
        assert_non_null(a);
        if (a->doctor_report->report.len) {
            Colld__V1__NodeReport *nr =
                colld__v1__node_report__unpack(NULL, a->doctor_report->report.len, a->doctor_report->report.data);
            assert_non_null(nr);
            assert_non_null(nr->status);
            assert_string_equal(nr->status->node_name, "node-a");
            colld__v1__node_report__free_unpacked(nr, NULL);
            served++;
        } else {
            assert_non_null(strstr(a->doctor_report->error, "node node-a serves at most 16 doctor requests a second"));
            refused++;
        }
        colld__net__v1__msg__free_unpacked(a, NULL);
    }
    /* The daemon counts per wall-clock second: the burst meets at least 16 of them in its first
     * second, and at most 16 in each second it spans (two when it crosses one boundary; more on a
     * machine so loaded that serving the burst outlasts a second). */
    int windows = 2 + (int)((harness_now_ms() - burst0) / 1000);
    print_message("40 DoctorReqs at once: %d served, %d refused (in %d wall-clock seconds at most)\n", served, refused,
                  windows);
    assert_true(served >= 16 && served <= 16 * windows);
    assert_int_equal(served + refused, 40);
    /* A tenant has one doctor across nodes at a time (the peer does not answer this one), and an
     * administrator's still gets a slot meanwhile. */
    char path[2][1024], text[4096];
    for (int i = 0; i < 2; i++)
        snprintf(path[i], sizeof(path[i]), "%s/tenant-doctor-%d", h->dir, i);
    pid_t first = tenant_doctor(h, "1500", path[0]);
    Colld__Net__V1__Msg *q = raw_wait_msg(&r, COLLD__NET__V1__MSG__M_DOCTOR_REQ);
    assert_non_null(q);
    assert_false(q->doctor_req->admin);
    assert_int_equal(q->doctor_req->uid, TENANT);
    colld__net__v1__msg__free_unpacked(q, NULL);
    assert_int_equal(harness_wait(tenant_doctor(h, "3000", path[1]), 20000), 1);
    harness_read_file(path[1], text, sizeof(text));
    print_message("%s", text);
    assert_non_null(strstr(text, "a doctor across nodes of uid 65534 is running already: one at a time"));
    const char *admin[] = { COLLCTL_BIN, "--socket", h->socket, "doctor", "--node-timeout-ms", "200", NULL };
    assert_int_equal(harness_capture(admin, d.out, sizeof(d.out), 20000), 1);
    assert_non_null(strstr(d.out, "[evil] node evil (127.0.0.1:61000): did not answer within 200 ms"));
    assert_int_equal(harness_wait(first, 20000), 1);
    harness_read_file(path[0], text, sizeof(text));
    assert_non_null(strstr(text, "[evil] node evil (127.0.0.1:61000): did not answer within 1500 ms"));
    close(r.fd);
    assert_int_equal(harness_cleanup(h), 0);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    if (geteuid() != 0) {
        fprintf(stderr, "test_adv_peers: skipped: needs root, to run the tenant under uid %d\n", TENANT);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_id_names_any_address, teardown),
        cmocka_unit_test_teardown(test_id_names_known_peer, teardown),
        cmocka_unit_test_teardown(test_allowed_roots_fail_alike, teardown),
        cmocka_unit_test_teardown(test_peer_log_flood, teardown),
        cmocka_unit_test_teardown(test_hostile_doctor_reports, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
