/*
 * test_metrics.c - the Prometheus endpoint of a real colld (--metrics 127.0.0.1:0) scraped over
 * plain TCP while real rank processes run: the exposition's families, gauges walked from the
 * daemon's state, exact operation/byte counters and the latency histogram after an all-reduce
 * job, a communicator error counted once after a timeout, and the HTTP edge cases (404, 405,
 * garbled and oversized requests, idle clients closed by the deadline, the connection cap).
 */
#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <errno.h>
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define ITERS 25         /* all-reduces per rank in the job */
#define RANKS 4
#define HTTP_TIMEOUT_MS 10000

typedef struct {
    harness_t h; /* first: harness_test_teardown-compatible */
    int port;
} fixture_t;

/* ---------------------------------------------------------------------------------------------
 * Fixture: a daemon with metrics on a free loopback port, found in the daemon's log
 * ------------------------------------------------------------------------------------------- */

static int find_port(const char *log, int timeout_ms)
{
    static const char needle[] = "metrics on http://127.0.0.1:";
    double end = harness_now_ms() + timeout_ms;
    do {
        FILE *f = fopen(log, "r");
        if (f) {
            char line[1024];
            while (fgets(line, sizeof(line), f)) {
                const char *p = strstr(line, needle);
                if (p) {
                    fclose(f);
                    return atoi(p + sizeof(needle) - 1);
                }
            }
            fclose(f);
        }
        usleep(10000);
    } while (harness_now_ms() < end);
    return -1;
}

static int metrics_setup(void **state)
{
    static fixture_t f;
    memset(&f, 0, sizeof(f));
    const char *extra[] = { "--metrics", "127.0.0.1:0", NULL };
    if (harness_daemon_start(&f.h, extra) < 0)
        return -1;
    f.port = find_port(f.h.log, 5000);
    if (f.port <= 0) {
        fprintf(stderr, "test_metrics: no 'metrics on http://127.0.0.1:PORT' line in %s\n", f.h.log);
        harness_cleanup(&f.h);
        return -1;
    }
    *state = &f;
    return 0;
}

static int metrics_teardown(void **state)
{
    fixture_t *f = *state;
    return harness_cleanup(&f->h);
}

/* ---------------------------------------------------------------------------------------------
 * A tiny HTTP client
 * ------------------------------------------------------------------------------------------- */

/* A TCP connection to the endpoint with send/receive time-outs, or -1. */
/* A connection to 127.0.0.1:port from 127.0.0.<src> (0: the kernel's choice, 127.0.0.1). */
static int http_connect_from(int port, int src)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = { HTTP_TIMEOUT_MS / 1000, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct sockaddr_in from = { .sin_family = AF_INET };
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + (uint32_t)src - 1);
    if ((src && bind(fd, (struct sockaddr *)&from, sizeof(from)) < 0) ||
        connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int http_connect(int port)
{
    return http_connect_from(port, 0);
}

/* Read until the server closes; returns the malloc'd answer (NUL-terminated) or NULL on a
 * time-out. A reset after some data counts as the end. */
static char *read_all(int fd)
{
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (;;) {
        if (len + 1 == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n > 0) {
            len += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            fprintf(stderr, "test_metrics: no answer within %d ms\n", HTTP_TIMEOUT_MS);
            free(buf);
            return NULL;
        }
        break; /* EOF or reset */
    }
    buf[len] = '\0';
    return buf;
}

/* Send raw request bytes and return the whole answer (malloc'd) or NULL. */
static char *http_raw(int port, const char *req, size_t len)
{
    int fd = http_connect(port);
    if (fd < 0)
        return NULL;
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (n <= 0)
            break; /* the server may answer and close before it read everything */
        off += (size_t)n;
    }
    char *ans = read_all(fd);
    close(fd);
    return ans;
}

/* The status code of an answer, -1 when it is not HTTP. */
static int http_status(const char *ans)
{
    int code;
    if (!ans || sscanf(ans, "HTTP/1.1 %d ", &code) != 1)
        return -1;
    return code;
}

/* GET /metrics: checks the status, content type and length, returns the body (malloc'd). */
static char *scrape(const fixture_t *f)
{
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nUser-Agent: test_metrics\r\n\r\n";
    char *ans = http_raw(f->port, req, sizeof(req) - 1);
    assert_non_null(ans);
    assert_int_equal(http_status(ans), 200);
    assert_non_null(strstr(ans, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    assert_non_null(strstr(ans, "\r\nConnection: close\r\n"));
    const char *cl = strstr(ans, "\r\nContent-Length: ");
    assert_non_null(cl);
    const char *body = strstr(ans, "\r\n\r\n");
    assert_non_null(body);
    body += 4;
    assert_int_equal(strtoull(cl + 18, NULL, 10), strlen(body));
    char *text = strdup(body);
    free(ans);
    assert_non_null(text);
    return text;
}

/* The value of one series ("name" or "name{labels}") in an exposition, -1 when absent. */
static double value_of(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1;
}

/* Scrape until a series has a value (the daemon notices exits asynchronously); returns it. */
static double wait_value(const fixture_t *f, const char *series, double want, int timeout_ms)
{
    double v = -1, end = harness_now_ms() + timeout_ms;
    for (;;) {
        char *text = scrape(f);
        v = value_of(text, series);
        free(text);
        if (v == want || harness_now_ms() > end)
            return v;
        usleep(20000);
    }
}

/* Every metric family the daemon documents, with its type. */
static const char *const families[][2] = {
    { "colld_build_info", "gauge" },
    { "colld_uptime_seconds", "gauge" },
    { "colld_sessions", "gauge" },
    { "colld_sessions_opened_total", "counter" },
    { "colld_comms", "gauge" },
    { "colld_comms_formed_total", "counter" },
    { "colld_comm_errors_total", "counter" },
    { "colld_operations_total", "counter" },
    { "colld_operation_bytes_total", "counter" },
    { "colld_collective_latency_seconds", "histogram" },
    { "colld_ops_queued", "gauge" },
    { "colld_descriptors_in_flight", "gauge" },
    { "colld_registered_bytes", "gauge" },
};

/* ---------------------------------------------------------------------------------------------
 * The exposition
 * ------------------------------------------------------------------------------------------- */

/* Every family has HELP and TYPE; gauges walked from an idle daemon read zero; the session
 * gauge follows a client connecting and leaving. */
static void test_exposition_at_start(void **state)
{
    fixture_t *f = *state;
    /* The harness's own connection is a session: leave, so the daemon has none. */
    colld_disconnect(f->h.client);
    f->h.client = NULL;
    assert_true(wait_value(f, "colld_sessions", 0, 5000) == 0);

    char *text = scrape(f);
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
        char line[160];
        snprintf(line, sizeof(line), "# HELP %s ", families[i][0]);
        if (!strstr(text, line))
            fail_msg("no '%s' line", line);
        snprintf(line, sizeof(line), "# TYPE %s %s\n", families[i][0], families[i][1]);
        if (!strstr(text, line))
            fail_msg("no '%s' line", line);
    }
    assert_true(value_of(text, "colld_sessions") == 0);
    assert_true(value_of(text, "colld_ops_queued") == 0);
    assert_true(value_of(text, "colld_descriptors_in_flight") == 0);
    assert_true(value_of(text, "colld_registered_bytes") == 0);
    assert_true(value_of(text, "colld_comms{state=\"ready\"}") == 0);
    assert_true(value_of(text, "colld_comms{state=\"joining\"}") == 0);
    assert_true(value_of(text, "colld_comm_errors_total{status=\"COLLD_ERR_TIMEOUT\"}") == 0);
    assert_true(value_of(text, "colld_uptime_seconds") >= 0);
    /* Nothing ran: no operation series and no histogram series. */
    assert_null(strstr(text, "colld_operations_total{"));
    assert_null(strstr(text, "colld_collective_latency_seconds_count"));
    free(text);

    assert_int_equal(colld_connect(f->h.socket, &f->h.client), COLLD_OK);
    assert_true(wait_value(f, "colld_sessions", 1, 5000) == 1);
    text = scrape(f);
    assert_true(value_of(text, "colld_sessions_opened_total") >= 2); /* the harness's two connects */
    free(text);
}

/* An all-reduce job of RANKS ranks x ITERS iterations: exact operation and byte counters, one
 * latency sample per collective in a cumulative histogram, one communicator formed; afterwards
 * nothing is queued, in flight or registered. */
/* RANKS ranks run ITERS all-reduces of `count` floats; the counters show exactly that. Above the
 * fast-path size the engine runs them and the latency histogram has one sample per collective;
 * below it the ranks run them on their fast area, count them there, and the daemon adds them to
 * the same counters (no latency samples: the daemon does not time them). */
static void job_counted(fixture_t *f, int count_floats, bool fast)
{
    const double bytes_per = (double)count_floats * 4;
    pid_t pids[RANKS];
    char iters[16], count[16];
    snprintf(iters, sizeof(iters), "%d", ITERS);
    snprintf(count, sizeof(count), "%d", count_floats);
    const char *extra[] = { "--counts", count, "--only", "inplace", "--iters", iters, NULL };
    assert_int_equal(harness_spawn_ranks(&f->h, RANKS, extra, pids), 0);
    assert_int_equal(harness_wait_all(pids, RANKS, 120000), 0);
    /* Only the driver's session remains once the daemon has seen the ranks go. */
    assert_true(wait_value(f, "colld_sessions", 1, 5000) == 1);

    char *text = scrape(f);
    const char *ok = "{kind=\"allreduce\",dtype=\"float32\",status=\"COLLD_OK\"}";
    char series[256];
    snprintf(series, sizeof(series), "colld_operations_total%s", ok);
    double ops = value_of(text, series);
    snprintf(series, sizeof(series), "colld_operation_bytes_total%s", ok);
    double bytes = value_of(text, series);
    print_message("%s = %.0f (want %d), bytes %.0f (want %.0f)\n", "allreduce float32 COLLD_OK ops", ops,
                  RANKS * ITERS, bytes, (double)RANKS * ITERS * bytes_per);
    if (ops <= 0)
        print_message("the operation counters read zero: the engine does not call colld_metrics_op yet\n");
    assert_true(ops == RANKS * ITERS);
    assert_true(bytes == (double)(double)RANKS * ITERS * bytes_per);
    /* No failed operation and no other kind was counted. */
    const char *p = text;
    int series_lines = 0;
    while ((p = strstr(p, "\ncolld_operations_total{")) != NULL) {
        series_lines++;
        p++;
    }
    assert_int_equal(series_lines, 1);

    if (fast) {
        assert_null(strstr(text, "colld_collective_latency_seconds_count"));
        assert_true(value_of(text, "colld_comms_formed_total") == 1);
        free(text);
        assert_true(wait_value(f, "colld_comms{state=\"ready\"}", 0, 5000) == 0);
        return;
    }
    /* The histogram: one sample per executed collective, cumulative buckets ending at +Inf. */
    assert_true(value_of(text, "colld_collective_latency_seconds_count{kind=\"allreduce\"}") == ITERS);
    assert_true(value_of(text, "colld_collective_latency_seconds_sum{kind=\"allreduce\"}") > 0);
    double prev = 0, le_prev = 0;
    int nbuckets = 0;
    static const char bucket[] = "colld_collective_latency_seconds_bucket{kind=\"allreduce\",le=\"";
    for (p = strstr(text, bucket); p; p = strstr(p + 1, bucket)) {
        const char *le = p + sizeof(bucket) - 1;
        const char *q = strstr(le, "\"} ");
        assert_non_null(q);
        double v = strtod(q + 3, NULL);
        assert_true(v >= prev); /* cumulative */
        prev = v;
        nbuckets++;
        if (strncmp(le, "+Inf\"", 5) == 0) {
            assert_true(v == ITERS);
            continue;
        }
        double bound = strtod(le, NULL);
        assert_true(bound > le_prev); /* increasing bounds */
        le_prev = bound;
    }
    assert_true(nbuckets >= 10);
    assert_true(le_prev >= 10);           /* up to 10 s */
    assert_true(prev == ITERS);           /* the last one is +Inf */
    assert_true(value_of(text, "colld_comms_formed_total") == 1);
    free(text);

    /* The communicator is gone and nothing waits. */
    assert_true(wait_value(f, "colld_comms{state=\"ready\"}", 0, 5000) == 0);
    text = scrape(f);
    assert_true(value_of(text, "colld_ops_queued") == 0);
    assert_true(value_of(text, "colld_descriptors_in_flight") == 0);
    assert_true(value_of(text, "colld_registered_bytes") == 0);
    assert_true(value_of(text, "colld_sessions_opened_total") >= 1 + RANKS);
    free(text);
}

static void test_allreduce_job_counted(void **state)
{
    job_counted(*state, 8192, false); /* 32 KiB per rank: the engine */
}

static void test_fast_path_job_counted(void **state)
{
    job_counted(*state, 1000, true); /* 4000 B per rank: the fast area */
}

/* A rank waits in an all-reduce its peer never posts: while it waits the gauges show one queued
 * operation; after the time-out the communicator error is counted once (not again when the
 * silent rank then leaves), and the failed operation under COLLD_ERR_TIMEOUT. */
static void test_timeout_counted_once(void **state)
{
    fixture_t *f = *state;
    char hex[HARNESS_UID_HEX_LEN], ready[300], out[300];
    assert_int_equal(harness_new_uid_hex(&f->h, hex), 0);
    snprintf(ready, sizeof(ready), "%s/ready", f->h.dir);
    snprintf(out, sizeof(out), "%s/out", f->h.dir);
    const char *r0[] = { RANK_BIN,   "--socket", f->h.socket,         "--uid",        hex, "--nranks",
                         "2",        "--rank",   "0",                 "--mode",       "hang", "--expect",
                         "COLLD_ERR_TIMEOUT",    "--ready-file",      ready,          "--out", out,
                         "--timeout-ms",         "3000",              NULL };
    const char *r1[] = { RANK_BIN, "--socket", f->h.socket, "--uid",  hex,         "--nranks", "2",
                         "--rank", "1",        "--mode",    "hang",   "--no-post", "--timeout-ms", "3000", NULL };
    pid_t pids[2];
    assert_true((pids[0] = harness_spawn(r0)) > 0);
    assert_true((pids[1] = harness_spawn(r1)) > 0);
    assert_int_equal(harness_wait_file(ready, 20000), 0);

    /* Rank 0's all-reduce waits in the daemon for rank 1. */
    assert_true(wait_value(f, "colld_ops_queued", 1, 2000) == 1);
    char *text = scrape(f);
    assert_true(value_of(text, "colld_descriptors_in_flight") == 1);
    assert_true(value_of(text, "colld_comms{state=\"ready\"}") == 1);
    assert_true(value_of(text, "colld_sessions") == 3);
    assert_true(value_of(text, "colld_registered_bytes") >= 4096);
    free(text);

    assert_int_equal(harness_wait(pids[0], 20000), 0);
    assert_int_equal(harness_wait(pids[1], 10000), 0);
    assert_true(wait_value(f, "colld_sessions", 1, 5000) == 1);
    text = scrape(f);
    double errs = value_of(text, "colld_comm_errors_total{status=\"COLLD_ERR_TIMEOUT\"}");
    print_message("colld_comm_errors_total{status=\"COLLD_ERR_TIMEOUT\"} = %.0f (want 1)\n", errs);
    assert_true(errs == 1);
    assert_true(value_of(text, "colld_comm_errors_total{status=\"COLLD_ERR_PEER_LOST\"}") == 0);
    const char *to = "{kind=\"allreduce\",dtype=\"float32\",status=\"COLLD_ERR_TIMEOUT\"}";
    char series[256];
    snprintf(series, sizeof(series), "colld_operations_total%s", to);
    assert_true(value_of(text, series) == 1);
    snprintf(series, sizeof(series), "colld_operation_bytes_total%s", to);
    assert_true(value_of(text, series) == 4096);
    /* A collective that never executed has no latency sample. */
    assert_null(strstr(text, "colld_collective_latency_seconds_count"));
    assert_true(value_of(text, "colld_ops_queued") == 0);
    free(text);
}

/* ---------------------------------------------------------------------------------------------
 * HTTP edge cases
 * ------------------------------------------------------------------------------------------- */

static int status_of(const fixture_t *f, const char *req, size_t len)
{
    char *ans = http_raw(f->port, req, len);
    int code = http_status(ans);
    free(ans);
    return code;
}

#define STATUS_OF(f, literal) status_of((f), (literal), sizeof(literal) - 1)

static void test_http_errors(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(STATUS_OF(f, "GET /nope HTTP/1.1\r\n\r\n"), 404);
    assert_int_equal(STATUS_OF(f, "GET / HTTP/1.1\r\n\r\n"), 404);
    assert_int_equal(STATUS_OF(f, "GET /metricsx HTTP/1.1\r\n\r\n"), 404);
    static const char post[] = "POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
    char *ans = http_raw(f->port, post, sizeof(post) - 1);
    assert_int_equal(http_status(ans), 405);
    assert_non_null(strstr(ans, "\r\nAllow: GET, HEAD\r\n"));
    free(ans);
    assert_int_equal(STATUS_OF(f, "DELETE /metrics HTTP/1.1\r\n\r\n"), 405);
    assert_int_equal(STATUS_OF(f, "garbage\r\n\r\n"), 400);
    assert_int_equal(STATUS_OF(f, "GET  /metrics HTTP/1.1\r\n\r\n"), 400);
    assert_int_equal(STATUS_OF(f, "GET metrics HTTP/1.1\r\n\r\n"), 400);
    assert_int_equal(STATUS_OF(f, "GET /metrics HTTX/1.1\r\n\r\n"), 400);
    assert_int_equal(STATUS_OF(f, "GET /metrics HTTP/2.0\r\n\r\n"), 505);
    assert_int_equal(STATUS_OF(f, "G\x01T /metrics HTTP/1.1\r\n\r\n"), 400);
    assert_int_equal(STATUS_OF(f, "\xff\xfe\x00\x01\r\n\r\n"), 400);
    /* A query string is ignored; HTTP/1.0 works; HEAD gives the headers only. */
    assert_int_equal(STATUS_OF(f, "GET /metrics?name[]=colld_sessions HTTP/1.1\r\n\r\n"), 200);
    assert_int_equal(STATUS_OF(f, "GET /metrics HTTP/1.0\r\n\r\n"), 200);
    static const char head[] = "HEAD /metrics HTTP/1.1\r\n\r\n";
    ans = http_raw(f->port, head, sizeof(head) - 1);
    assert_int_equal(http_status(ans), 200);
    const char *end = strstr(ans, "\r\n\r\n");
    assert_non_null(end);
    assert_string_equal(end, "\r\n\r\n");
    free(ans);

    /* 9000 bytes without the end of the headers: refused, and the daemon keeps serving. */
    size_t big = 9000;
    char *req = malloc(big);
    assert_non_null(req);
    memcpy(req, "GET /metrics?", 13);
    memset(req + 13, 'a', big - 13);
    int code = status_of(f, req, big);
    print_message("a %zu-byte request: %d\n", big, code);
    assert_true(code == 431 || code == 400);
    /* ... also when the 8 KiB are headers after a proper request line. */
    memcpy(req, "GET /metrics HTTP/1.1\r\nX-Big: ", 30);
    code = status_of(f, req, big);
    assert_true(code == 431 || code == 400);
    free(req);
    free(scrape(f));

    /* A request trickled in one byte at a time (the terminator split over reads) is served. */
    static const char slow[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    int fd = http_connect(f->port);
    assert_true(fd >= 0);
    for (size_t i = 0; i < sizeof(slow) - 1; i++) {
        assert_int_equal(send(fd, slow + i, 1, MSG_NOSIGNAL), 1);
        usleep(2000);
    }
    ans = read_all(fd);
    close(fd);
    assert_int_equal(http_status(ans), 200);
    free(ans);

    /* A client that disconnects mid-request does no harm. */
    fd = http_connect(f->port);
    assert_true(fd >= 0);
    assert_int_equal(send(fd, "GET /met", 8, MSG_NOSIGNAL), 8);
    close(fd);
    free(scrape(f));
}

/* Wait until the server closes a connection we never wrote to; returns ms waited, -1 if it sent
 * data, -2 if not closed within limit_ms. */
static double wait_closed(int fd, double since, int limit_ms)
{
    for (;;) {
        int left = (int)(since + limit_ms - harness_now_ms());
        if (left <= 0)
            return -2;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int n = poll(&p, 1, left);
        if (n == 0)
            return -2;
        if (n < 0)
            continue;
        char b[64];
        ssize_t r = recv(fd, b, sizeof(b), MSG_DONTWAIT);
        if (r > 0)
            return -1;
        if (r == 0 || (errno != EAGAIN && errno != EINTR))
            return harness_now_ms() - since;
    }
}

/* A client that connects and says nothing is closed after the 2 s request deadline, while scrapes
 * go on being served. */
static void test_idle_client_closed(void **state)
{
    fixture_t *f = *state;
    double t0 = harness_now_ms();
    int idle = http_connect(f->port);
    assert_true(idle >= 0);
    for (int i = 0; i < 5; i++) {
        free(scrape(f));
        usleep(200000);
    }
    double took = wait_closed(idle, t0, 9000);
    close(idle);
    print_message("idle connection closed after %.0f ms\n", took);
    assert_true(took >= 1500 && took < 6000);
    free(scrape(f));
}

/* The value of a metric line "name value" in a scraped body, -1 when absent. */
static double metric_value(const char *body, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = body; (p = strstr(p, name)) != NULL; p += len)
        if ((p == body || p[-1] == '\n') && p[len] == ' ')
            return strtod(p + len + 1, NULL);
    return -1;
}

/* 64 silent connections fill every place (8 from each of 8 addresses: one address holds at most
 * 8); a scrape still gets its answer, because a new connection closes the oldest one still without
 * a request (exactly one: the second scrape finds a free place); the others end at their deadline. */
static void test_connection_cap(void **state)
{
    fixture_t *f = *state;
    enum { CAP = 64 };
    int fds[CAP];
    double t0 = harness_now_ms();
    for (int i = 0; i < CAP; i++)
        assert_true((fds[i] = http_connect_from(f->port, 2 + i / 8)) >= 0);
    free(scrape(f)); /* accepted after the 64 (the backlog is in order): it evicts the oldest */
    char *body = scrape(f);
    double evicted = metric_value(body, "colld_metrics_connections_evicted_total");
    free(body);
    print_message("evicted %.0f connection(s) for 2 scrapes\n", evicted);
    assert_true(evicted == 1);
    double first = wait_closed(fds[0], t0, 9000);
    assert_true(first >= 0);
    for (int i = 0; i < CAP; i++) {
        double took = wait_closed(fds[i], t0, 9000);
        close(fds[i]);
        assert_true(took >= 0);
    }
    free(scrape(f));
}

/* SIGTERM while scrapers are connected (one silent, one half-way through its request): the
 * daemon closes them at once and exits 0 without waiting for their deadline. */
static void test_shutdown_with_open_connections(void **state)
{
    fixture_t *f = *state;
    int silent = http_connect(f->port), partial = http_connect(f->port);
    assert_true(silent >= 0 && partial >= 0);
    static const char half[] = "GET /metrics HTTP/1.1\r\nHo";
    assert_int_equal(send(partial, half, sizeof(half) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(half) - 1);
    usleep(100000);
    colld_disconnect(f->h.client);
    f->h.client = NULL;
    double t0 = harness_now_ms();
    int status = harness_daemon_stop(&f->h, SIGTERM, 10000);
    double took = harness_now_ms() - t0;
    print_message("daemon stopped in %.0f ms with scrapers connected\n", took);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_true(took < 3000);
    /* The daemon has exited: both connections must read as closed now (measured from its exit,
     * since under the sanitizers the exit itself can take over a second). */
    double exited = harness_now_ms();
    assert_true(wait_closed(silent, exited, 1000) >= 0);
    assert_true(wait_closed(partial, exited, 1000) >= 0);
    close(silent);
    close(partial);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_exposition_at_start, metrics_setup, metrics_teardown),
        cmocka_unit_test_setup_teardown(test_allreduce_job_counted, metrics_setup, metrics_teardown),
        cmocka_unit_test_setup_teardown(test_fast_path_job_counted, metrics_setup, metrics_teardown),
        cmocka_unit_test_setup_teardown(test_timeout_counted_once, metrics_setup, metrics_teardown),
        cmocka_unit_test_setup_teardown(test_http_errors, metrics_setup, metrics_teardown),
        cmocka_unit_test_setup_teardown(test_idle_client_closed, metrics_setup, metrics_teardown),
        cmocka_unit_test_setup_teardown(test_connection_cap, metrics_setup, metrics_teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_with_open_connections, metrics_setup, metrics_teardown),
    };
    return cmocka_run_group_tests_name("metrics", tests, NULL, NULL);
}
