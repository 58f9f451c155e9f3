/*
 * test_adv_http.c - a stranger cannot take colld's health probes away through its HTTP ports
 * (issue 26 row 4).
 *
 * The stranger has no account on the host: it is this program run again under uid 65534 (fork,
 * setuid, exec; the test needs root and skips with 77 without it) and only opens TCP connections.
 * It holds 64 connections to a port, each sending its request with a receive buffer as small as
 * the kernel allows and never reading the answer, and replaces each one after 5.5 s (the daemon
 * has closed it by then) or as soon as the daemon closes it, as an attacker keeping the places
 * filled would. Meanwhile the test probes /healthz as the kubelet does (a new connection, GET,
 * the answer within 1 s), ten times a second, from 127.0.0.1 (the node's own address for a
 * kubelet probing a hostNetwork pod).
 *
 * - test_metrics_flood_one_source: the stranger floods --metrics from 127.0.0.2. Before the fix
 *   its 64 connections, all being answered, took every place and /healthz on the same port was
 *   answered 2 times in 220; now one address holds at most 8 places and every probe is answered.
 * - test_health_listener: the stranger floods --metrics from 64 addresses (8 places each would
 *   fill it) and --health from one more address; probes on --health are all answered, and a
 *   scrape of /metrics still gets in once the held answers have stalled (1 s).
 */
#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define STRANGER 65534 /* nobody */
#define HELD 64
#define PROBE_MS 3000  /* how long the probes run */

/* ============================================================================================
 * The stranger (this program, run as `test_adv_http --stranger PORT SRC_BASE NSRC PATH`)
 * ========================================================================================== */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Connection i of the stranger: from 127.0.<base>.<1 + i % nsrc> (nsrc 1: 127.0.0.<base>),
 * with the smallest receive buffer, its request sent. -1 when it cannot be opened. */
static int stranger_connect(int port, int base, int nsrc, int i, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int tiny = 1; /* the kernel raises it to its minimum (about 2 KiB) */
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &tiny, sizeof(tiny));
    char ip[32];
    if (nsrc == 1)
        snprintf(ip, sizeof(ip), "127.0.0.%d", base);
    else
        snprintf(ip, sizeof(ip), "127.0.%d.%d", base, 1 + i % nsrc);
    struct sockaddr_in src = { .sin_family = AF_INET }, dst = { .sin_family = AF_INET };
    inet_pton(AF_INET, ip, &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons((uint16_t)port);
    char req[128];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: colld\r\n\r\n", path);
    if (bind(fd, (struct sockaddr *)&src, sizeof(src)) < 0 || connect(fd, (struct sockaddr *)&dst, sizeof(dst)) < 0 ||
        send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Hold HELD connections until stdin closes; never read one. Prints "ready" once all are open. */
static int stranger_main(int argc, char **argv)
{
    if (argc != 6)
        return 2;
    int port = atoi(argv[2]), base = atoi(argv[3]), nsrc = atoi(argv[4]);
    const char *path = argv[5];
    int fds[HELD];
    double opened[HELD];
    for (int i = 0; i < HELD; i++) {
        fds[i] = stranger_connect(port, base, nsrc, i, path);
        opened[i] = now_ms();
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        struct pollfd in = { .fd = STDIN_FILENO, .events = POLLIN };
        if (poll(&in, 1, 50) > 0)
            break; /* the test closed our stdin (or wrote): stop */
        for (int i = 0; i < HELD; i++) {
            struct pollfd p = { .fd = fds[i], .events = POLLRDHUP };
            bool gone = fds[i] < 0 || (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)));
            if (!gone && now_ms() - opened[i] < 5500)
                continue;
            if (fds[i] >= 0)
                close(fds[i]);
            fds[i] = stranger_connect(port, base, nsrc, i, path);
            opened[i] = now_ms();
        }
    }
    for (int i = 0; i < HELD; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return 0;
}

/* ============================================================================================
 * The test's side
 * ========================================================================================== */

static harness_t live_h;

static int teardown(void **state)
{
    (void)state;
    harness_cleanup(&live_h);
    return 0;
}

typedef struct {
    pid_t pid;
    int in, out;
} stranger_t;

/* Run the stranger as uid STRANGER against port (see stranger_main) and wait for its "ready". */
static void stranger_start(stranger_t *s, int port, int base, int nsrc, const char *path)
{
    char exe[512], p[16], b[16], n[16];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    assert_true(len > 0);
    exe[len] = '\0';
    snprintf(p, sizeof(p), "%d", port);
    snprintf(b, sizeof(b), "%d", base);
    snprintf(n, sizeof(n), "%d", nsrc);
    const char *argv[] = { exe, "--stranger", p, b, n, path, NULL };
    int in[2], out[2];
    assert_int_equal(pipe2(in, O_CLOEXEC), 0);
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    s->pid = fork();
    assert_true(s->pid >= 0);
    if (s->pid == 0) { /* only async-signal-safe calls until exec: this process runs gRPC threads */
        if (dup2(in[0], STDIN_FILENO) < 0 || dup2(out[1], STDOUT_FILENO) < 0 || setgroups(0, NULL) < 0 ||
            setgid(STRANGER) < 0 || setuid(STRANGER) < 0)
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    s->in = in[1];
    s->out = out[0];
    char line[16] = "";
    struct pollfd pf = { .fd = s->out, .events = POLLIN };
    assert_true(poll(&pf, 1, 10000) == 1);
    assert_true(read(s->out, line, sizeof(line) - 1) > 0);
    assert_non_null(strstr(line, "ready"));
}

static void stranger_stop(stranger_t *s)
{
    close(s->in);
    assert_int_equal(harness_wait(s->pid, 10000), 0);
    close(s->out);
}

/* The port of a listener the daemon logged as "WHAT on http://127.0.0.1:PORT". */
static int logged_port(const harness_t *h, const char *what)
{
    char needle[64], line[1024];
    snprintf(needle, sizeof(needle), "%s on http://127.0.0.1:", what);
    double end = harness_now_ms() + 10000;
    do {
        FILE *f = fopen(h->log, "r");
        while (f && fgets(line, sizeof(line), f)) {
            const char *p = strstr(line, needle);
            if (p) {
                fclose(f);
                return atoi(p + strlen(needle));
            }
        }
        if (f)
            fclose(f);
        usleep(10000);
    } while (harness_now_ms() < end);
    fail_msg("no '%s' in %s", needle, h->log);
    return -1;
}

/* One request as a kubelet probe makes it: connect, GET path, the status line within limit_ms
 * (the answer of /metrics is read whole). Returns the status code, -1 when there was none in
 * time. */
static int probe(int port, const char *path, int limit_ms)
{
    double end = harness_now_ms() + limit_ms;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int code = -1;
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS)
        goto out;
    struct pollfd p = { .fd = fd, .events = POLLOUT };
    if (poll(&p, 1, (int)(end - harness_now_ms())) != 1 || (p.revents & (POLLERR | POLLHUP)))
        goto out;
    char req[128], buf[4096];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: colld\r\n\r\n", path);
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
        goto out;
    size_t got = 0;
    for (;;) {
        int left = (int)(end - harness_now_ms());
        p.events = POLLIN;
        if (left <= 0 || poll(&p, 1, left) != 1)
            goto out;
        ssize_t r = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
        if (r > 0 && got + (size_t)r < sizeof(buf) - 1) {
            got += (size_t)r;
            continue;
        }
        if (r > 0) /* a long answer (/metrics): its status line is all we need */
            got = sizeof(buf) - 1;
        break;
    }
    buf[got] = '\0';
    if (strncmp(buf, "HTTP/1.1 ", 9) == 0)
        code = atoi(buf + 9);
out:
    close(fd);
    return code;
}

/* Probe /healthz on port ten times a second for PROBE_MS; *answered of *sent got 200, and the
 * longest run of failures in a row (a kubelet restarts the pod at 3). */
static void probe_health(int port, int *answered, int *sent, int *worst_run)
{
    int run = 0;
    *answered = *sent = *worst_run = 0;
    double end = harness_now_ms() + PROBE_MS;
    while (harness_now_ms() < end) {
        double t0 = harness_now_ms();
        bool ok = probe(port, "/healthz", 1000) == 200;
        (*sent)++;
        *answered += ok;
        run = ok ? 0 : run + 1;
        if (run > *worst_run)
            *worst_run = run;
        double spent = harness_now_ms() - t0;
        if (spent < 100)
            usleep((useconds_t)((100 - spent) * 1000));
    }
}

static void start(harness_t *h, const char *const *extra)
{
    memset(h, 0, sizeof(*h));
    assert_int_equal(harness_daemon_start(h, extra), 0);
}

/* 64 held /metrics connections from one address leave room for probes and scrapes from others. */
static void test_metrics_flood_one_source(void **state)
{
    (void)state;
    harness_t *h = &live_h;
    const char *extra[] = { "--metrics", "127.0.0.1:0", NULL };
    start(h, extra);
    int port = logged_port(h, "metrics");
    assert_int_equal(probe(port, "/healthz", 5000), 200);
    stranger_t s;
    stranger_start(&s, port, 2, 1, "/metrics");
    usleep(300000); /* its requests are read and answered (into its tiny window) */
    int answered, sent, worst;
    probe_health(port, &answered, &sent, &worst);
    int scrape = probe(port, "/metrics", 2000);
    stranger_stop(&s);
    print_message("/healthz on the metrics port under 64 held scrapes from 127.0.0.2: %d of %d answered, at most "
                  "%d failed in a row; a scrape from 127.0.0.1: %d\n",
                  answered, sent, worst, scrape);
    assert_true(worst < 3);
    assert_true(answered * 10 >= sent * 9);
    assert_int_equal(scrape, 200);
    assert_int_equal(harness_cleanup(h), 0);
}

/* The health listener keeps answering whatever fills the metrics port, and whatever fills itself. */
static void test_health_listener(void **state)
{
    (void)state;
    harness_t *h = &live_h;
    const char *extra[] = { "--metrics", "127.0.0.1:0", "--health", "127.0.0.1:0", NULL };
    start(h, extra);
    int mport = logged_port(h, "metrics"), hport = logged_port(h, "health");
    assert_int_equal(probe(hport, "/healthz", 5000), 200);
    assert_int_equal(probe(hport, "/readyz", 5000), 200);
    assert_int_equal(probe(hport, "/metrics", 5000), 404); /* no metrics client there */
    stranger_t sm, sh;
    stranger_start(&sm, mport, 1, HELD, "/metrics"); /* 127.0.1.1 .. 127.0.1.64: every place */
    stranger_start(&sh, hport, 3, 1, "/healthz");    /* 127.0.0.3: the health port too */
    usleep(300000);
    int answered, sent, worst;
    probe_health(hport, &answered, &sent, &worst);
    double t0 = harness_now_ms();
    int scrape = -1;
    while (scrape != 200 && harness_now_ms() < t0 + 5000)
        scrape = probe(mport, "/metrics", 2000);
    double scrape_ms = harness_now_ms() - t0;
    stranger_stop(&sm);
    stranger_stop(&sh);
    print_message("/healthz on the health port with the metrics port held from 64 addresses and 64 held health "
                  "connections: %d of %d answered, at most %d failed in a row; a scrape got %d after %.0f ms\n",
                  answered, sent, worst, scrape, scrape_ms);
    assert_true(worst < 3);
    assert_true(answered * 10 >= sent * 9);
    assert_int_equal(scrape, 200);
    assert_int_equal(harness_cleanup(h), 0);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1 && strcmp(argv[1], "--stranger") == 0)
        return stranger_main(argc, argv);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    if (geteuid() != 0) {
        fprintf(stderr, "test_adv_http: skipped: needs root, to run the stranger under uid %d\n", STRANGER);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_metrics_flood_one_source, teardown),
        cmocka_unit_test_teardown(test_health_listener, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
