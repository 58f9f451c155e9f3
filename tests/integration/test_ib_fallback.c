/*
 * test_ib_fallback.c - --net-transport on a machine without RDMA verbs (this CI host: ibv_get_device_list
 * fails with ENOSYS): two real colld daemons on 127.0.0.1 and real rank processes.
 *
 *   - auto (the default): the daemons' authenticated handshake says neither has IB, a multi-node
 *     all-reduce is exact over TCP, and collctl status names each link's transport (tcp) and why
 *     (this node's reason: ENOSYS or no RDMA device), in text and JSON, with the device "none";
 *   - --net-transport tcp on one side: the same, the reason "--net-transport tcp";
 *   - --net-transport ib: the daemon refuses to start, saying why (no verbs, no device);
 *   - --net-transport with another value: refused.
 * Queue pairs, RDMA writes, credits and a QP error need a device: tests/softroce (docs/ib.md).
 */
#include "tests/integration/harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

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
        cmocka_unit_test(test_ib_forced_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
