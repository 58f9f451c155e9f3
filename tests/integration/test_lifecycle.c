/*
 * test_lifecycle.c - how a real colld starts, answers its health endpoints and stops:
 *
 *   /healthz and /readyz beside /metrics (200 ok / ready; 503 naming "draining" during a drain;
 *   HEAD, other methods);
 *   the drain on SIGTERM with --drain-timeout-ms: a new communicator is refused with
 *   COLLD_ERR_DAEMON_UNAVAILABLE and a message saying why, a running one goes on, and the daemon
 *   exits 0 once it is destroyed; at the deadline it stops although a communicator still runs;
 *   a second SIGTERM stops it at once; without a drain timeout SIGTERM stops at once;
 *   per-tenant and peer metric families in /metrics, and the bound on per-tenant series: 13
 *   tenants (uids) give 10 labelled ones and "other" (needs root to connect as other uids).
 */
#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define HTTP_TIMEOUT_MS 10000

typedef struct {
    harness_t h;
    int port;
} fixture_t;

/* The metrics port from the daemon's start-up line, or -1. */
static int find_port(const char *log, int timeout_ms)
{
    static const char needle[] = "metrics on http://127.0.0.1:";
    double end = harness_now_ms() + timeout_ms;
    do {
        char text[8192];
        harness_read_file(log, text, sizeof(text));
        const char *p = strstr(text, needle);
        if (p)
            return atoi(p + sizeof(needle) - 1);
        usleep(10000);
    } while (harness_now_ms() < end);
    return -1;
}

/* The daemon of the running test: its teardown stops it even when the test failed half-way. */
static fixture_t fixture;

/* A daemon with metrics on a free port and the given extra arguments. */
static int start(const char *const *extra)
{
    memset(&fixture, 0, sizeof(fixture));
    if (harness_daemon_start(&fixture.h, extra) < 0)
        return -1;
    fixture.port = find_port(fixture.h.log, 5000);
    if (fixture.port <= 0) {
        harness_cleanup(&fixture.h);
        return -1;
    }
    return 0;
}

#define SETUP_WITH(name, ...)                                                                      \
    static int name(void **state)                                                                  \
    {                                                                                              \
        static const char *const extra[] = { "--metrics", "127.0.0.1:0", __VA_ARGS__, NULL };      \
        *state = &fixture;                                                                         \
        return start(extra);                                                                       \
    }
SETUP_WITH(setup_no_drain, "--drain-timeout-ms", "0")
SETUP_WITH(setup_drain_60s, "--drain-timeout-ms", "60000")
SETUP_WITH(setup_drain_1500ms, "--drain-timeout-ms", "1500")
SETUP_WITH(setup_drain_600s, "--drain-timeout-ms", "600000")
SETUP_WITH(setup_open_socket, "--socket-mode", "0666")

static int teardown(void **state)
{
    fixture_t *f = *state;
    return harness_cleanup(&f->h);
}

/* Send one request and read the whole answer (malloc'd, NUL-terminated). */
static char *http(int port, const char *request)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct timeval tv = { HTTP_TIMEOUT_MS / 1000, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    size_t len = strlen(request);
    assert_int_equal(send(fd, request, len, MSG_NOSIGNAL), (ssize_t)len);
    size_t have = 0, cap = 1 << 20;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (;;) {
        ssize_t n = recv(fd, buf + have, cap - 1 - have, 0);
        if (n > 0) {
            have += (size_t)n;
            assert_true(have < cap - 1);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        assert_false(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)); /* no answer in time */
        break;
    }
    close(fd);
    buf[have] = '\0';
    return buf;
}

/* GET path; the status code, the body into body (at most len-1 bytes). */
static int get(int port, const char *path, char *body, size_t len)
{
    char req[256];
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
    char *answer = http(port, req);
    int code = 0;
    sscanf(answer, "HTTP/1.1 %d", &code);
    const char *b = strstr(answer, "\r\n\r\n");
    snprintf(body, len, "%s", b ? b + 4 : "");
    free(answer);
    return code;
}

/* A one-rank communicator made by the driver's own session: its status, and the daemon's
 * message when it failed. */
static colld_status_t new_comm(harness_t *h, colld_comm_t **comm, char *why, size_t len)
{
    colld_unique_id_t id;
    colld_status_t st = colld_get_unique_id(h->client, &id);
    if (st == COLLD_OK)
        st = colld_comm_init_rank(h->client, comm, 1, id, 0, NULL);
    snprintf(why, len, "%s", st == COLLD_OK ? "" : colld_last_error(h->client));
    return st;
}

/* Wait for the daemon to exit by itself (signal 0 sends nothing); its wait status or -1. */
static int wait_exit(harness_t *h, int timeout_ms)
{
    return harness_daemon_stop(h, 0, timeout_ms);
}

/* ---------------------------------------------------------------------------------------------
 * Health endpoints
 * ------------------------------------------------------------------------------------------- */

static void test_healthz_readyz(void **state)
{
    fixture_t *f = *state;
    char body[4096];
    assert_int_equal(get(f->port, "/healthz", body, sizeof(body)), 200);
    assert_string_equal(body, "ok\n");
    assert_int_equal(get(f->port, "/readyz", body, sizeof(body)), 200);
    assert_string_equal(body, "ready\n");
    assert_int_equal(get(f->port, "/healthz?verbose=1", body, sizeof(body)), 200);
    assert_int_equal(get(f->port, "/healthzz", body, sizeof(body)), 404);
    assert_int_equal(get(f->port, "/readyz/", body, sizeof(body)), 404);

    char *a = http(f->port, "HEAD /readyz HTTP/1.1\r\n\r\n");
    assert_true(strncmp(a, "HTTP/1.1 200 OK\r\n", 17) == 0);
    assert_non_null(strstr(a, "Content-Type: text/plain; charset=utf-8\r\n"));
    assert_non_null(strstr(a, "Content-Length: 6\r\n"));
    assert_true(strlen(strstr(a, "\r\n\r\n")) == 4); /* no body */
    free(a);
    a = http(f->port, "POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert_true(strncmp(a, "HTTP/1.1 405 ", 13) == 0);
    free(a);
}

/* ---------------------------------------------------------------------------------------------
 * Drain
 * ------------------------------------------------------------------------------------------- */

/* SIGTERM with a drain timeout: readyz 503 "draining", a new communicator refused with
 * DAEMON_UNAVAILABLE and the reason, the running communicator goes on; the daemon exits 0 as
 * soon as it is destroyed. */
static void test_drain_waits_for_running(void **state)
{
    fixture_t *f = *state;
    harness_bg_t bg;
    char body[4096], why[512];
    assert_int_equal(harness_bg_start(&f->h, &bg), 0);

    assert_int_equal(kill(f->h.pid, SIGTERM), 0);
    double end = harness_now_ms() + 10000;
    int code;
    while ((code = get(f->port, "/readyz", body, sizeof(body))) == 200 && harness_now_ms() < end)
        usleep(10000);
    assert_int_equal(code, 503);
    assert_string_equal(body, "not ready: draining (new communicators are refused)\n");
    assert_int_equal(get(f->port, "/healthz", body, sizeof(body)), 200); /* alive all the same */

    colld_comm_t *comm = NULL;
    assert_int_equal(new_comm(&f->h, &comm, why, sizeof(why)), COLLD_ERR_DAEMON_UNAVAILABLE);
    if (!strstr(why, "draining") || !strstr(why, "no new communicators"))
        fail_msg("refusal message: '%s'", why);

    char metrics[65536];
    assert_int_equal(get(f->port, "/metrics", metrics, sizeof(metrics)), 200);
    assert_non_null(strstr(metrics, "\ncolld_draining 1\n"));

    long before = harness_bg_progress(&bg);
    assert_true(harness_bg_wait_progress(&bg, before, 10000) > before); /* still running */
    assert_true(harness_bg_wait_progress(&bg, before + 5, 10000) > before + 5);
    double t0 = harness_now_ms();
    assert_int_equal(harness_bg_stop(&bg), 0); /* every all-reduce exact, clean exit */
    int status = wait_exit(&f->h, 20000);
    assert_true(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_true(harness_now_ms() - t0 < 20000); /* long before the 60 s deadline */
    char log[65536];
    harness_read_file(f->h.log, log, sizeof(log));
    assert_non_null(strstr(log, "SIGTERM: draining: new communicators are refused; 1 running"));
    assert_non_null(strstr(log, "drain: no communicator left, stopping"));
}

/* The deadline stops the daemon although a communicator still runs; its ranks then see the
 * daemon lost. */
static void test_drain_deadline(void **state)
{
    fixture_t *f = *state;
    harness_bg_t bg;
    assert_int_equal(harness_bg_start(&f->h, &bg), 0);
    double t0 = harness_now_ms();
    assert_int_equal(kill(f->h.pid, SIGTERM), 0);
    int status = wait_exit(&f->h, 30000);
    double took = harness_now_ms() - t0;
    assert_true(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_true(took >= 1400); /* it waited for the deadline */
    char log[65536];
    harness_read_file(f->h.log, log, sizeof(log));
    assert_non_null(strstr(log, "drain: deadline reached with 1 communicator(s) still running"));
    assert_int_not_equal(harness_bg_stop(&bg), 0); /* the ranks lost their daemon */
}

/* A second SIGTERM during a drain stops the daemon at once. */
static void test_drain_second_sigterm(void **state)
{
    fixture_t *f = *state;
    harness_bg_t bg;
    char body[256];
    assert_int_equal(harness_bg_start(&f->h, &bg), 0);
    assert_int_equal(kill(f->h.pid, SIGTERM), 0);
    double end = harness_now_ms() + 10000;
    while (get(f->port, "/readyz", body, sizeof(body)) == 200 && harness_now_ms() < end)
        usleep(10000);
    int status = harness_daemon_stop(&f->h, SIGTERM, 20000);
    assert_true(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_not_equal(harness_bg_stop(&bg), 0);
}

/* Without --drain-timeout-ms SIGTERM stops at once, as it always did. */
static void test_no_drain(void **state)
{
    fixture_t *f = *state;
    harness_bg_t bg;
    assert_int_equal(harness_bg_start(&f->h, &bg), 0);
    int status = harness_daemon_stop(&f->h, SIGTERM, 20000);
    assert_true(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char log[65536];
    harness_read_file(f->h.log, log, sizeof(log));
    assert_null(strstr(log, "draining"));
    assert_int_not_equal(harness_bg_stop(&bg), 0);
}

/* ---------------------------------------------------------------------------------------------
 * Metrics added for operators
 * ------------------------------------------------------------------------------------------- */

/* Per-tenant gauges name the uid of the running ranks; the peer families exist (empty) on a
 * single-node daemon; the straggler gauges are there. */
static void test_tenant_and_peer_families(void **state)
{
    fixture_t *f = *state;
    harness_bg_t bg;
    char text[262144], want[128];
    assert_int_equal(harness_bg_start(&f->h, &bg), 0);
    assert_int_equal(get(f->port, "/metrics", text, sizeof(text)), 200);
    /* The driver's session and the two ranks, all this uid's. */
    snprintf(want, sizeof(want), "\ncolld_tenant_sessions{tenant=\"%u\"} 3\n", (unsigned)getuid());
    if (!strstr(text, want))
        fail_msg("no '%s' in:\n%s", want + 1, text);
    snprintf(want, sizeof(want), "\ncolld_tenant_comms{tenant=\"%u\"} 2\n", (unsigned)getuid());
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof(want), "\ncolld_tenant_registered_bytes{tenant=\"%u\"} ", (unsigned)getuid());
    assert_non_null(strstr(text, want));
    assert_null(strstr(text, "tenant=\"other\"")); /* one tenant: no rest */
    const char *families[] = { "# TYPE colld_peer_up gauge\n", "# TYPE colld_peer_sent_bytes_total counter\n",
                               "# TYPE colld_peers gauge\n", "# TYPE colld_stragglers gauge\n",
                               "# TYPE colld_straggler_lag_max_seconds gauge\n", "\ncolld_draining 0\n" };
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
        if (!strstr(text, families[i]))
            fail_msg("no '%s'", families[i]);
    assert_null(strstr(text, "colld_peer_up{")); /* no peers */
    assert_int_equal(harness_bg_stop(&bg), 0);
}

/* Sessions of 12 more uids (60001..60012: collctl status --watch in children that setuid before
 * they exec it) beside the driver's (uid 0): the per-tenant families list the 10 heaviest
 * tenants (all equal here, so the smallest uids) and sum the other 3 as "other". */
static void test_tenant_cardinality(void **state)
{
    fixture_t *f = *state;
    if (geteuid() != 0) {
        print_message("skipped: needs root to connect as 12 other uids\n");
        skip();
    }
    enum { NCHILD = 12 };
    harness_t *h = &f->h;
    int port = f->port;
    assert_int_equal(chmod(h->dir, 0755), 0);
    pid_t kids[NCHILD];
    for (int i = 0; i < NCHILD; i++) {
        kids[i] = fork();
        assert_true(kids[i] >= 0);
        if (kids[i] == 0) { /* only async-signal-safe calls until exec */
            uid_t uid = (uid_t)(60001 + i);
            int null = open("/dev/null", O_WRONLY);
            if (null < 0 || dup2(null, STDOUT_FILENO) < 0 || setgid(uid) != 0 || setuid(uid) != 0)
                _exit(126);
            execl(COLLCTL_BIN, "collctl", "--socket", h->socket, "status", "--watch", "--interval", "3600", (char *)NULL);
            _exit(127);
        }
    }
    char text[262144];
    double end = harness_now_ms() + 20000;
    do {
        assert_int_equal(get(port, "/metrics", text, sizeof(text)), 200);
        if (strstr(text, "\ncolld_sessions 13\n"))
            break;
        usleep(20000);
    } while (harness_now_ms() < end);
    for (int i = 0; i < NCHILD; i++)
        kill(kids[i], SIGTERM);
    for (int i = 0; i < NCHILD; i++)
        harness_wait(kids[i], 10000);
    if (!strstr(text, "\ncolld_sessions 13\n"))
        fail_msg("the 12 other uids' sessions did not all appear:\n%s", text);
    size_t series = 0;
    for (const char *p = text; (p = strstr(p, "\ncolld_tenant_sessions{")) != NULL; p++)
        series++;
    assert_int_equal(series, 11);
    assert_non_null(strstr(text, "\ncolld_tenant_sessions{tenant=\"0\"} 1\n"));
    assert_non_null(strstr(text, "\ncolld_tenant_sessions{tenant=\"60009\"} 1\n"));
    assert_null(strstr(text, "tenant=\"60010\""));
    assert_non_null(strstr(text, "\ncolld_tenant_sessions{tenant=\"other\"} 3\n"));
    assert_non_null(strstr(text, "\ncolld_tenant_comms{tenant=\"other\"} 0\n"));
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_healthz_readyz, setup_no_drain, teardown),
        cmocka_unit_test_setup_teardown(test_drain_waits_for_running, setup_drain_60s, teardown),
        cmocka_unit_test_setup_teardown(test_drain_deadline, setup_drain_1500ms, teardown),
        cmocka_unit_test_setup_teardown(test_drain_second_sigterm, setup_drain_600s, teardown),
        cmocka_unit_test_setup_teardown(test_no_drain, setup_no_drain, teardown),
        cmocka_unit_test_setup_teardown(test_tenant_and_peer_families, setup_no_drain, teardown),
        cmocka_unit_test_setup_teardown(test_tenant_cardinality, setup_open_socket, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
