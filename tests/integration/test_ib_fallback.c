/*
 * test_ib_fallback.c - --net-transport on a machine without RDMA verbs (this CI host: ibv_get_device_list
 * fails with ENOSYS): two real colld daemons on 127.0.0.1 and real rank processes.
 *
 *   - auto (the default): the daemons' authenticated handshake says neither has IB, a multi-node
 *     all-reduce is exact over TCP, and collctl status names each link's transport (tcp) and why
 *     (this node's reason: ENOSYS or no RDMA device), in text and JSON, with the device "none",
 *     and collctl probe names it too;
 *   - --net-transport tcp on one side: the same, the reason "--net-transport tcp";
 *   - the handshake with a peer of the real transport holding the secret (this process): it hears
 *     the daemon's IbHello saying it has no IB and why; its own IB offer, valid or garbage, leaves
 *     the link on TCP; an IbReady without an offer is refused (counted in
 *     colld_net_refused_messages_total); the daemon keeps serving;
 *   - --net-transport ib: the daemon refuses to start, saying why (no verbs, no device);
 *   - --net-transport with another value: refused.
 * Queue pairs, RDMA writes, credits and a QP error need a device: tests/softroce (docs/ib.md).
 */
#include "colld_net.pb-c.h"
#include "common/util.h"
#include "tests/integration/harness.h"
#include "transport/tcp/tcp.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    harness_t h[2];
    char tmp[64];
    char secret[128];
} pair_t;

static const char *const names[2] = { "node-a", "node-b" };

static int start_node(pair_t *p, int i, const char *transport)
{
    const char *extra[] = { "--listen", "127.0.0.1:0", "--node-name", names[i],          "--cluster-secret-file",
                            p->secret,  "--peers",     "127.0.0.1:*", "--net-transport", transport,
                            NULL };
    return harness_daemon_start(&p->h[i], extra);
}

static int start_metrics_node(pair_t *p)
{
    const char *extra[] = { "--listen", "127.0.0.1:0", "--node-name", "node-a",    "--cluster-secret-file",
                            p->secret,  "--peers",     "127.0.0.1:*", "--metrics", "127.0.0.1:0",
                            NULL };
    return harness_daemon_start(&p->h[0], extra);
}

static pair_t *pair_new(void)
{
    pair_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    snprintf(p->tmp, sizeof(p->tmp), "/tmp/colld-ib-XXXXXX");
    if (!mkdtemp(p->tmp))
        return NULL;
    snprintf(p->secret, sizeof(p->secret), "%s/secret", p->tmp);
    FILE *f = fopen(p->secret, "w");
    if (!f)
        return NULL;
    fputs("this-is-the-test-cluster-secret\n", f);
    fclose(f);
    chmod(p->secret, 0600);
    return p;
}

static int setup_with(void **state, const char *b_transport)
{
    pair_t *p = pair_new();
    if (!p || start_node(p, 0, "auto") < 0 || start_node(p, 1, b_transport) < 0)
        return -1;
    *state = p;
    return 0;
}

static int setup_auto(void **state)
{
    return setup_with(state, "auto");
}

static int setup_one(void **state)
{
    pair_t *p = pair_new();
    if (!p || start_metrics_node(p) < 0)
        return -1;
    *state = p;
    return 0;
}

static int setup_tcp(void **state)
{
    return setup_with(state, "tcp");
}

static int teardown(void **state)
{
    pair_t *p = *state;
    int bad = 0;
    for (int i = 0; i < 2; i++)
        if (p->h[i].dir[0] && harness_cleanup(&p->h[i]) < 0)
            bad = 1;
    unlink(p->secret);
    rmdir(p->tmp);
    free(p);
    return bad ? -1 : 0;
}

/* A float32 and an int32 all-reduce (and the rest of the exact matrix at small counts) between a
 * rank on each daemon; every rank must exit 0. */
static void allreduce_across(pair_t *p)
{
    char hex[HARNESS_UID_HEX_LEN];
    pid_t pids[2];
    assert_int_equal(harness_new_uid_hex(&p->h[0], hex), 0);
    for (int r = 0; r < 2; r++) {
        const char *argv[] = { COLL_BIN,    "--socket", p->h[r].socket,  "--uid",          hex,
                               "--nranks",  "2",        "--rank",        r ? "1" : "0",    "--kinds",
                               "allreduce", "--dtypes", "float32,int32", "--exact-values", "--no-big",
                               NULL };
        assert_true((pids[r] = harness_spawn(argv)) > 0);
    }
    assert_int_equal(harness_wait_all(pids, 2, 120000), 0);
}

static void status_of(pair_t *p, int i, bool json, char *out, size_t len)
{
    const char *argv[] = { COLLCTL_BIN, "--socket", p->h[i].socket, "status", json ? "--json" : NULL, NULL };
    assert_int_equal(harness_capture(argv, out, len, 10000), 0);
}

/* Why this machine has no IB, as colld_ib_open says it. */
static bool no_ib_reason(const char *text)
{
    return strstr(text, "ENOSYS") || strstr(text, "no RDMA device") || strstr(text, "without libibverbs");
}

static void test_auto_falls_back_to_tcp(void **state)
{
    pair_t *p = *state;
    allreduce_across(p);
    static char out[65536];
    for (int i = 0; i < 2; i++) {
        status_of(p, i, false, out, sizeof(out));
        if (!strstr(out, "TRANSPORT of collective data (--net-transport auto; RDMA device: none, "))
            fail_msg("status of %s: no transport section:\n%s", names[i], out);
        char line[128];
        snprintf(line, sizeof(line), "  %-16s tcp  ", names[1 - i]);
        if (!strstr(out, line) || !no_ib_reason(strstr(out, line)))
            fail_msg("status of %s: the link to %s is not tcp with a reason:\n%s", names[i], names[1 - i], out);
        const char *probe[] = { COLLCTL_BIN, "--socket", p->h[i].socket, "--json", "probe", "--bytes", "256K", NULL };
        assert_int_equal(harness_capture(probe, out, sizeof(out), 30000), 0);
        if (!strstr(out, "\"transport\":\"tcp\""))
            fail_msg("collctl probe on %s does not name the link's transport:\n%s", names[i], out);
        status_of(p, i, true, out, sizeof(out));
        if (!strstr(out, "\"net_transport\":\"auto\",\"ib_device\":\"\",\"ib_none\":\"") ||
            !strstr(out, "\"transport\":\"tcp\",\"transport_note\":\""))
            fail_msg("status --json of %s:\n%s", names[i], out);
    }
}

static void test_tcp_forced(void **state)
{
    pair_t *p = *state;
    allreduce_across(p);
    static char out[65536];
    status_of(p, 1, false, out, sizeof(out));
    if (!strstr(out, "(--net-transport tcp; RDMA device: none, --net-transport tcp)") ||
        !strstr(out, "  node-a           tcp  --net-transport tcp"))
        fail_msg("status of node-b:\n%s", out);
}

/* ---------------------------------------------------------------------------------------------
 * A foreign peer: the real transport with the cluster secret, in this process
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    colld_net_t *net;
    int hellos;
    bool active;
    char reason[256];
} foreign_t;

static void foreign_ctrl(void *arg, colld_net_peer_t *p, const void *payload, size_t len)
{
    foreign_t *f = arg;
    (void)p;
    Colld__Net__V1__Msg *m = colld__net__v1__msg__unpack(NULL, len, payload);
    if (!m)
        return;
    pthread_mutex_lock(&f->mu);
    if (m->m_case == COLLD__NET__V1__MSG__M_IB_HELLO) {
        f->hellos++;
        f->active = m->ib_hello->active;
        colld_strlcpy(f->reason, m->ib_hello->reason, sizeof(f->reason));
    }
    pthread_mutex_unlock(&f->mu);
    colld__net__v1__msg__free_unpacked(m, NULL);
}

static void foreign_post(foreign_t *f, const char *to, const Colld__Net__V1__Msg *m)
{
    uint8_t buf[4096];
    size_t len = colld__net__v1__msg__get_packed_size(m);
    assert_true(len <= sizeof(buf));
    colld__net__v1__msg__pack(m, buf);
    assert_int_equal(colld_net_post_ctrl(f->net, to, buf, len), 0);
}

static const char *daemon_addr(pair_t *p, char *out, size_t len)
{
    static char st[65536];
    status_of(p, 0, true, st, sizeof(st));
    const char *l = strstr(st, "\"listen\":\"");
    assert_non_null(l);
    l += strlen("\"listen\":\"");
    size_t n = strcspn(l, "\"");
    assert_true(n < len);
    memcpy(out, l, n);
    out[n] = '\0';
    return out;
}

static void test_handshake_with_foreign_peer(void **state)
{
    pair_t *p = *state;
    char to[COLLD_NET_ADDR_LEN];
    daemon_addr(p, to, sizeof(to));
    foreign_t f = { .mu = PTHREAD_MUTEX_INITIALIZER };
    const char *secret = "this-is-the-test-cluster-secret";
    colld_net_config_t cfg = { .node_name = "node-x",
                               .listen_addr = "127.0.0.1:0",
                               .secret = (const uint8_t *)secret,
                               .secret_len = strlen(secret),
                               .conns_per_peer = 1,
                               .heartbeat_ms = 200,
                               .heartbeat_misses = 10,
                               .chunk_bytes = 1u << 20,
                               .cb = { .ctrl = foreign_ctrl, .arg = &f } };
    char err[256];
    if (colld_net_start(&cfg, &f.net, err, sizeof(err)) < 0)
        fail_msg("foreign node: %s", err);
    int port = harness_metrics_port(&p->h[0]);
    assert_true(port > 0);
    double refused0 = harness_metric(port, "colld_net_refused_messages_total");

    /* A valid-looking offer: this daemon has no IB, so it answers with its own reason. */
    uint8_t gid[16] = { [10] = 0xff, [11] = 0xff, [12] = 127, [15] = 1 };
    Colld__Net__V1__IbHello h = COLLD__NET__V1__IB_HELLO__INIT;
    h.active = true;
    h.device = "rxe0:1";
    h.gid = (ProtobufCBinaryData){ .len = 16, .data = gid };
    h.qpn = 17;
    h.psn = 5;
    h.mtu = 3;
    h.ring_addr = 0x10000;
    h.ring_rkey = 7;
    h.slots = 8;
    h.slot_payload = 1u << 20;
    Colld__Net__V1__Msg m = COLLD__NET__V1__MSG__INIT;
    m.m_case = COLLD__NET__V1__MSG__M_IB_HELLO;
    m.ib_hello = &h;
    foreign_post(&f, to, &m);
    double end = harness_now_ms() + 10000;
    int hellos = 0;
    while (hellos == 0 && harness_now_ms() < end) {
        usleep(20000);
        pthread_mutex_lock(&f.mu);
        hellos = f.hellos;
        pthread_mutex_unlock(&f.mu);
    }
    assert_int_equal(hellos, 1);
    assert_false(f.active);
    if (!no_ib_reason(f.reason))
        fail_msg("the daemon's IbHello gives no reason: '%s'", f.reason);

    /* Garbage offers: a 3-byte GID, an MTU code of 99, a huge QP number, a reason with control
     * characters; and an IbReady{ok} without any offer from the daemon (refused, counted). */
    uint8_t shortgid[3] = { 1, 2, 3 };
    h.gid = (ProtobufCBinaryData){ .len = 3, .data = shortgid };
    h.mtu = 99;
    h.qpn = 0xffffffff;
    foreign_post(&f, to, &m);
    Colld__Net__V1__IbHello none = COLLD__NET__V1__IB_HELLO__INIT;
    none.reason = "\x1b[31mno\x07";
    m.ib_hello = &none;
    foreign_post(&f, to, &m);
    Colld__Net__V1__IbReady r = COLLD__NET__V1__IB_READY__INIT;
    r.ok = true;
    Colld__Net__V1__Msg mr = COLLD__NET__V1__MSG__INIT;
    mr.m_case = COLLD__NET__V1__MSG__M_IB_READY;
    mr.ib_ready = &r;
    foreign_post(&f, to, &mr);
    end = harness_now_ms() + 10000;
    while (harness_metric(port, "colld_net_refused_messages_total") < refused0 + 1 && harness_now_ms() < end)
        usleep(50000);
    assert_true(harness_metric(port, "colld_net_refused_messages_total") >= refused0 + 1);

    /* The link to it is up, over TCP, with the daemon's reason; the daemon still serves. */
    static char out[65536];
    status_of(p, 0, false, out, sizeof(out));
    const char *line = strstr(out, "  node-x           tcp  ");
    if (!line || !no_ib_reason(line))
        fail_msg("status does not show the foreign peer on tcp with the reason:\n%s", out);
    char *scrape = harness_scrape(port);
    assert_non_null(scrape);
    if (!strstr(scrape, "colld_peer_transport{peer=\"node-x\",transport=\"tcp\"} 1"))
        fail_msg("no colld_peer_transport for node-x:\n%s", scrape);
    free(scrape);
    colld_net_stop(f.net);
}

/* --net-transport ib where there is no usable RDMA port: the daemon does not start, and says why. */
static void test_ib_forced_refused(void **state)
{
    (void)state;
    pair_t *p = pair_new();
    assert_non_null(p);
    const char *extra[] = {
        "--listen", "127.0.0.1:0", "--cluster-secret-file", p->secret, "--net-transport", "ib", NULL
    };
    int rc = harness_daemon_start(&p->h[0], extra);
    char log[8192] = "";
    harness_read_file(p->h[0].log, log, sizeof(log));
    if (rc == 0) {
        harness_cleanup(&p->h[0]);
        skip(); /* this machine has an active RDMA port */
    }
    if (!strstr(log, "--net-transport ib: ") || !no_ib_reason(log))
        fail_msg("the daemon's log does not say why --net-transport ib failed:\n%s", log);
    const char *bad[] = { COLLD_BIN, "--net-transport", "rdma", NULL };
    assert_int_not_equal(harness_capture_all(bad, log, sizeof(log), 10000), 0);
    if (!strstr(log, "--net-transport: 'rdma' is not auto, ib or tcp"))
        fail_msg("an unknown --net-transport is not refused clearly:\n%s", log);
    harness_cleanup(&p->h[0]);
    unlink(p->secret);
    rmdir(p->tmp);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_auto_falls_back_to_tcp, setup_auto, teardown),
        cmocka_unit_test_setup_teardown(test_tcp_forced, setup_tcp, teardown),
        cmocka_unit_test_setup_teardown(test_handshake_with_foreign_peer, setup_one, teardown),
        cmocka_unit_test(test_ib_forced_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
