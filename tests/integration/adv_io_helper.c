/*
 * adv_io_helper.c - colld-test-adv-io: the hostile (or just other) tenant of test_adv_io.
 *
 * test_adv_io runs it under another uid (fork, setuid, exec) so that the daemon sees a second
 * tenant. It reports on stdout, one line per fact, and modes that hold connections keep them until
 * their stdin reaches EOF (the driver closes the pipe), so the driver decides how long an attack
 * lasts. Modes:
 *   sessions SOCKET N    open up to N raw sessions (HELLO, WELCOME held): "admitted K", then
 *                        "refused STATUS DETAIL" for the first refusal (or "refused none")
 *   rpcconns PATH N [garbage]  open N raw connections to the control socket PATH that never
 *                        speak (or send garbage instead of HTTP/2): "opened N", then "closed I MS"
 *                        when the daemon closes connection I
 *   connect SOCKET       colld_connect: "status NAME", "detail TEXT" (colld_last_error(NULL))
 *   allreduce SOCKET     a 2-rank communicator of this tenant (two sessions, two threads) runs
 *                        exact all-reduces of 1, 1000 and 100000 floats: "ok" or a failure
 *   events SOCKET K MS   open K followed event streams with an MS deadline and report how each
 *                        ended: "stream I CODE DETAIL"
 *   stolen SOCKET ID TOKENHEX  connect as this tenant, then call Status naming another session
 *                        (a leaked id and token): "status NAME DETAIL"
 */
#include "client/client_internal.h"
#include "colld.pb-c.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A connected unix stream socket to path, or -1. */
static int unix_connect(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(sa.sun_path))
        return -1;
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Block until stdin reaches EOF (the driver ends the attack), watching fds[n] meanwhile: a
 * connection the daemon closes is reported once as "closed I MS". */
static void hold(int *fds, int n, double t0)
{
    struct pollfd *p = calloc((size_t)n + 1, sizeof(*p));
    if (!p)
        return;
    p[0] = (struct pollfd){ .fd = STDIN_FILENO, .events = POLLIN };
    for (int i = 0; i < n; i++)
        p[i + 1] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
    for (;;) {
        if (poll(p, (nfds_t)n + 1, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[0].revents) {
            char b[64];
            if (read(STDIN_FILENO, b, sizeof(b)) <= 0)
                break;
        }
        for (int i = 0; i < n; i++) {
            if (!p[i + 1].revents)
                continue;
            char b[4096];
            ssize_t r = recv(fds[i], b, sizeof(b), MSG_DONTWAIT);
            if (r > 0)
                continue; /* the daemon spoke (HTTP/2 settings): still open */
            if (r < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            printf("closed %d %.0f\n", i, now_ms() - t0);
            fflush(stdout);
            p[i + 1].fd = -1; /* poll ignores it from now on */
        }
    }
    free(p);
}

static int mode_sessions(const char *socket_path, int n)
{
    int *fds = calloc((size_t)n, sizeof(int));
    int admitted = 0;
    char refused[256] = "none";
    for (int i = 0; i < n && fds; i++) {
        int fd = unix_connect(socket_path);
        if (fd < 0) {
            snprintf(refused, sizeof(refused), "connect: %s", strerror(errno));
            break;
        }
        colld_wire_msg_t m, w;
        memset(&m, 0, sizeof(m));
        m.magic = COLLD_WIRE_MAGIC;
        m.version = COLLD_WIRE_VERSION;
        m.type = COLLD_MSG_HELLO;
        snprintf(m.u.hello.process_name, sizeof(m.u.hello.process_name), "adv-sessions");
        ssize_t s = send(fd, &m, sizeof(m), MSG_NOSIGNAL);
        (void)s; /* a refused connection may already be closed: its answer is still there to read */
        size_t got = 0;
        while (got < sizeof(w)) {
            ssize_t r = recv(fd, (char *)&w + got, sizeof(w) - got, 0); /* the ring fds are discarded */
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (got < sizeof(w)) {
            snprintf(refused, sizeof(refused), "closed without an answer");
            close(fd);
            break;
        }
        if (w.status != COLLD_OK) {
            w.u.detail[sizeof(w.u.detail) - 1] = '\0';
            snprintf(refused, sizeof(refused), "%s %s", colld_status_name(w.status), w.u.detail);
            close(fd);
            break;
        }
        fds[admitted++] = fd;
    }
    printf("admitted %d\nrefused %s\n", admitted, refused);
    fflush(stdout);
    hold(fds, 0, now_ms());
    for (int i = 0; i < admitted; i++)
        close(fds[i]);
    free(fds);
    return 0;
}

static int mode_rpcconns(const char *path, int n, bool garbage)
{
    int *fds = calloc((size_t)n, sizeof(int));
    int opened = 0;
    double t0 = now_ms();
    while (fds && opened < n && (fds[opened] = unix_connect(path)) >= 0) {
        if (garbage) {
            static const char junk[] = "GARBAGE, NOT HTTP/2\r\n\r\n";
            ssize_t w = send(fds[opened], junk, sizeof(junk) - 1, MSG_NOSIGNAL);
            (void)w;
        }
        opened++;
    }
    printf("opened %d\n", opened);
    fflush(stdout);
    hold(fds, opened, t0);
    for (int i = 0; i < opened; i++)
        close(fds[i]);
    free(fds);
    return 0;
}

static int mode_connect(const char *socket_path)
{
    colld_client_t *c = NULL;
    colld_status_t st = colld_connect(socket_path, &c);
    printf("status %s\ndetail %s\n", colld_status_name(st), st == COLLD_OK ? "" : colld_last_error(NULL));
    if (c)
        colld_disconnect(c);
    return 0;
}

typedef struct {
    colld_client_t *c;
    colld_unique_id_t id;
    int rank;
    colld_comm_t *comm;
    colld_status_t st;
} joiner_t;

static void *join_main(void *arg)
{
    joiner_t *j = arg;
    j->st = colld_comm_init_rank(j->c, &j->comm, 2, j->id, j->rank, NULL);
    return NULL;
}

/* One all-reduce of `count` floats on both ranks (each from its own thread's view, issued in
 * turn: the daemon matches them); returns 0 when both results are exact. */
static int allreduce_once(joiner_t j[2], size_t count)
{
    float *buf[2] = { malloc(count * sizeof(float)), malloc(count * sizeof(float)) };
    int rc = -1;
    if (!buf[0] || !buf[1])
        goto out;
    for (int r = 0; r < 2; r++)
        for (size_t i = 0; i < count; i++)
            buf[r][i] = (float)((int)((i * 7 + (size_t)r * 13) % 61) - 30);
    for (int r = 0; r < 2; r++)
        if (colld_allreduce(buf[r], buf[r], count, COLLD_FLOAT32, COLLD_SUM, j[r].comm, NULL) != COLLD_OK)
            goto out;
    for (int r = 0; r < 2; r++)
        if (colld_comm_synchronize(j[r].comm) != COLLD_OK)
            goto out;
    for (int r = 0; r < 2; r++)
        for (size_t i = 0; i < count; i++) {
            float want = (float)((int)((i * 7) % 61) - 30) + (float)((int)((i * 7 + 13) % 61) - 30);
            if (buf[r][i] != want) {
                printf("rank %d element %zu: %g, want %g\n", r, i, (double)buf[r][i], (double)want);
                goto out;
            }
        }
    rc = 0;
out:
    free(buf[0]);
    free(buf[1]);
    return rc;
}

static int mode_allreduce(const char *socket_path)
{
    joiner_t j[2];
    pthread_t t[2];
    colld_unique_id_t id;
    colld_status_t st;
    memset(j, 0, sizeof(j));
    for (int r = 0; r < 2; r++)
        if ((st = colld_connect(socket_path, &j[r].c)) != COLLD_OK) {
            printf("connect: %s: %s\n", colld_status_name(st), colld_last_error(NULL));
            return 1;
        }
    if ((st = colld_get_unique_id(j[0].c, &id)) != COLLD_OK) {
        printf("unique id: %s\n", colld_status_name(st));
        return 1;
    }
    for (int r = 0; r < 2; r++) {
        j[r].id = id;
        j[r].rank = r;
        pthread_create(&t[r], NULL, join_main, &j[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < 2; r++)
        if (j[r].st != COLLD_OK) {
            printf("join rank %d: %s\n", r, colld_status_name(j[r].st));
            return 1;
        }
    static const size_t counts[] = { 1, 1000, 100000 };
    int rc = 0;
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]) && rc == 0; k++)
        if (allreduce_once(j, counts[k]) != 0) {
            printf("all-reduce of %zu floats failed: %s\n", counts[k], colld_comm_last_error(j[0].comm));
            rc = 1;
        }
    for (int r = 0; r < 2; r++) {
        colld_comm_destroy(j[r].comm);
        colld_disconnect(j[r].c);
    }
    if (rc == 0)
        printf("ok\n");
    return rc;
}

typedef struct {
    colld_rpc_stream_t *s;
    int rc;
    grpc_status_code code;
    char detail[512];
} stream_end_t;

/* Read a stream to its end (a gRPC client sees a stream's status only while it reads it, so each
 * stream has its own reader). */
static void *stream_reader(void *arg)
{
    stream_end_t *e = arg;
    ProtobufCMessage *msg = NULL;
    e->code = GRPC_STATUS_UNKNOWN;
    e->rc = e->s ? colld_rpc_stream_next(e->s, &msg, &e->code, e->detail, sizeof(e->detail)) : -1;
    while (e->rc == 0) { /* an event of this tenant: not the end yet */
        protobuf_c_message_free_unpacked(msg, NULL);
        e->rc = colld_rpc_stream_next(e->s, &msg, &e->code, e->detail, sizeof(e->detail));
    }
    return NULL;
}

static int mode_events(const char *socket_path, int k, int ms)
{
    colld_client_t *c = NULL;
    colld_status_t st = colld_connect(socket_path, &c);
    if (st != COLLD_OK) {
        printf("connect: %s: %s\n", colld_status_name(st), colld_last_error(NULL));
        return 1;
    }
    stream_end_t *e = calloc((size_t)k, sizeof(*e));
    pthread_t *t = calloc((size_t)k, sizeof(*t));
    if (!e || !t)
        return 1;
    Colld__V1__EventsRequest req = COLLD__V1__EVENTS_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    req.follow = true;
    req.only_new = true;
    for (int i = 0; i < k; i++) {
        if (colld_rpc_stream_open(c->rpc, "/colld.v1.Colld/Events", &req.base, &colld__v1__event__descriptor, ms,
                                  &e[i].s) != GRPC_STATUS_OK)
            e[i].s = NULL;
        pthread_create(&t[i], NULL, stream_reader, &e[i]);
    }
    for (int i = 0; i < k; i++) {
        pthread_join(t[i], NULL);
        printf("stream %d %d %s\n", i, e[i].rc == 1 ? (int)e[i].code : -1, e[i].detail);
        if (e[i].s)
            colld_rpc_stream_close(e[i].s);
    }
    free(e);
    free(t);
    colld_disconnect(c);
    return 0;
}

static int mode_stolen(const char *socket_path, const char *id, const char *token_hex)
{
    colld_client_t *c = NULL;
    colld_status_t st = colld_connect(socket_path, &c);
    if (st != COLLD_OK) {
        printf("connect: %s: %s\n", colld_status_name(st), colld_last_error(NULL));
        return 1;
    }
    uint8_t token[COLLD_WIRE_TOKEN_BYTES];
    for (size_t i = 0; i < sizeof(token); i++)
        if (sscanf(token_hex + 2 * i, "%2hhx", &token[i]) != 1)
            return 2;
    Colld__V1__StatusRequest req = COLLD__V1__STATUS_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    ref.id = strtoull(id, NULL, 10);
    ref.token.data = token;
    ref.token.len = sizeof(token);
    req.session = &ref;
    Colld__V1__StatusResponse *resp = NULL;
    char detail[512] = "";
    st = colld__client_rpc(c, "/colld.v1.Colld/Status", &req.base, &colld__v1__status_response__descriptor, 10000,
                           (ProtobufCMessage **)&resp, detail, sizeof(detail));
    printf("status %s %s\n", colld_status_name(st), detail);
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    colld_disconnect(c);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 4 && strcmp(argv[1], "sessions") == 0)
        return mode_sessions(argv[2], atoi(argv[3]));
    if (argc >= 4 && strcmp(argv[1], "rpcconns") == 0)
        return mode_rpcconns(argv[2], atoi(argv[3]), argc >= 5 && strcmp(argv[4], "garbage") == 0);
    if (argc >= 3 && strcmp(argv[1], "connect") == 0)
        return mode_connect(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "allreduce") == 0)
        return mode_allreduce(argv[2]);
    if (argc >= 5 && strcmp(argv[1], "stolen") == 0)
        return mode_stolen(argv[2], argv[3], argv[4]);
    if (argc >= 5 && strcmp(argv[1], "events") == 0)
        return mode_events(argv[2], atoi(argv[3]), atoi(argv[4]));
    fprintf(stderr, "usage: colld-test-adv-io sessions|rpcconns|connect|allreduce|events ...\n");
    return 2;
}
