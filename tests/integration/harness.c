/*
 * harness.c - see harness.h. Binaries come from the build: COLLD_BIN, RANK_BIN, COLLCTL_BIN.
 */
#include "tests/integration/harness.h"

#include "client/client_internal.h"
#include "colld.pb-c.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

double harness_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

harness_size_t harness_test_size(void)
{
    const char *no_big = getenv("COLLD_TEST_NO_BIG"), *small = getenv("COLLD_TEST_SMALL");
    const char *full = getenv("COLLD_TEST_FULL");
    if (no_big && strcmp(no_big, "1") == 0)
        return HARNESS_SIZE_NO_BIG;
    if (small && strcmp(small, "1") == 0)
        return HARNESS_SIZE_SMALL;
    return full && strcmp(full, "1") == 0 ? HARNESS_SIZE_FULL : HARNESS_SIZE_CI;
}

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

pid_t harness_spawn(const char *const *argv)
{
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], NULL, NULL, (char *const *)argv, environ);
    if (rc != 0) {
        fprintf(stderr, "harness: cannot spawn %s: %s\n", argv[0], strerror(rc));
        return -1;
    }
    return pid;
}

int harness_wait(pid_t pid, int timeout_ms)
{
    double end = harness_now_ms() + timeout_ms;
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (r < 0)
            return -1;
        if (harness_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fprintf(stderr, "harness: pid %d did not finish within %d ms; killed\n", (int)pid, timeout_ms);
            return -1;
        }
        sleep_ms(2);
    }
}

/* Start the daemon as a child that the kernel kills when this test process dies (PDEATHSIG):
 * a test killed by a sanitizer (halt_on_error, abort_on_error), a crash or ctest's timeout
 * otherwise leaves its daemon running, holding ctest's output pipe open, and ctest then waits
 * for it without end. Called from the main thread (PDEATHSIG follows the forking thread). */
static pid_t spawn_daemon(const char *const *argv)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "harness: cannot fork for %s: %s\n", argv[0], strerror(errno));
        return -1;
    }
    if (pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(127);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static void print_log(const harness_t *h)
{
    FILE *f = fopen(h->log, "r");
    if (!f)
        return;
    char line[512];
    fprintf(stderr, "---- colld log ----\n");
    while (fgets(line, sizeof(line), f))
        fputs(line, stderr);
    fclose(f);
}

int harness_daemon_start(harness_t *h, const char *const *extra)
{
    if (!h->dir[0]) {
        snprintf(h->dir, sizeof(h->dir), "/tmp/colld-test-XXXXXX");
        if (!mkdtemp(h->dir))
            return -1;
        snprintf(h->socket, sizeof(h->socket), "%s/colld.sock", h->dir);
        snprintf(h->log, sizeof(h->log), "%s/colld.log", h->dir);
    }
    const char *argv[32] = { COLLD_BIN, "--socket", h->socket, "--log-level", "info", "--log-file", h->log };
    int n = 7;
    for (int i = 0; extra && extra[i] && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    h->pid = spawn_daemon(argv);
    if (h->pid < 0)
        return -1;
    double end = harness_now_ms() + 10000;
    while (harness_now_ms() < end) {
        if (access(h->socket, F_OK) == 0 && colld_connect(h->socket, &h->client) == COLLD_OK)
            return 0;
        int status;
        if (waitpid(h->pid, &status, WNOHANG) == h->pid) {
            fprintf(stderr, "harness: colld exited during start-up\n");
            h->pid = 0;
            print_log(h);
            return -1;
        }
        sleep_ms(5);
    }
    fprintf(stderr, "harness: colld did not come up within 10 s\n");
    print_log(h);
    return -1;
}

int harness_daemon_stop(harness_t *h, int sig, int timeout_ms)
{
    if (h->pid <= 0)
        return 0;
    kill(h->pid, sig);
    double end = harness_now_ms() + timeout_ms;
    for (;;) {
        int status;
        if (waitpid(h->pid, &status, WNOHANG) == h->pid) {
            h->pid = 0;
            return status;
        }
        if (harness_now_ms() > end) {
            kill(h->pid, SIGKILL);
            waitpid(h->pid, &status, 0);
            h->pid = 0;
            print_log(h);
            return -1;
        }
        sleep_ms(2);
    }
}

int harness_cleanup(harness_t *h)
{
    int rc = 0;
    if (h->client) {
        colld_disconnect(h->client);
        h->client = NULL;
    }
    if (h->pid > 0) {
        int status = harness_daemon_stop(h, SIGTERM, 10000);
        if (status < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "harness: colld did not exit cleanly (wait status %d)\n", status);
            print_log(h);
            rc = -1;
        }
    }
    if (h->dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", h->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "harness: cannot remove %s\n", h->dir);
        h->dir[0] = '\0';
    }
    return rc;
}

int harness_test_setup_args(void **state, const char *const *extra)
{
    static harness_t h;
    memset(&h, 0, sizeof(h));
    if (harness_daemon_start(&h, extra) < 0)
        return -1;
    *state = &h;
    return 0;
}

int harness_test_setup(void **state)
{
    return harness_test_setup_args(state, NULL);
}

int harness_test_teardown(void **state)
{
    return harness_cleanup(*state);
}

void harness_uid_to_hex(const colld_unique_id_t *id, char *hex)
{
    for (int i = 0; i < COLLD_WIRE_UNIQUE_ID_BYTES; i++)
        sprintf(hex + 2 * i, "%02x", (unsigned char)id->internal[i]);
    hex[2 * COLLD_WIRE_UNIQUE_ID_BYTES] = '\0';
}

int harness_uid_from_hex(const char *hex, colld_unique_id_t *id)
{
    memset(id, 0, sizeof(*id));
    if (!hex || strlen(hex) != 2 * COLLD_WIRE_UNIQUE_ID_BYTES)
        return -1;
    for (int i = 0; i < COLLD_WIRE_UNIQUE_ID_BYTES; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return -1;
        id->internal[i] = (char)v;
    }
    return 0;
}

int harness_new_uid_hex(harness_t *h, char *hex)
{
    colld_unique_id_t id;
    if (colld_get_unique_id(h->client, &id) != COLLD_OK)
        return -1;
    harness_uid_to_hex(&id, hex);
    return 0;
}

/* nranks processes of program bin joining one new communicator, extra arguments after
 * "--socket S --uid HEX --nranks N --rank R". Returns 0 or -1. */
static int spawn_ranks_of(harness_t *h, const char *bin, int nranks, const char *const *extra, pid_t *pids)
{
    char hex[HARNESS_UID_HEX_LEN], nr[16], rk[16];
    if (harness_new_uid_hex(h, hex) < 0)
        return -1;
    snprintf(nr, sizeof(nr), "%d", nranks);
    for (int r = 0; r < nranks; r++) {
        const char *argv[48] = { bin, "--socket", h->socket, "--uid", hex, "--nranks", nr, "--rank", rk };
        int n = 9;
        for (int i = 0; extra && extra[i] && n < 47; i++)
            argv[n++] = extra[i];
        argv[n] = NULL;
        snprintf(rk, sizeof(rk), "%d", r); /* posix_spawn copies argv before rk is reused */
        pids[r] = harness_spawn(argv);
        if (pids[r] < 0)
            return -1;
    }
    return 0;
}

int harness_spawn_ranks(harness_t *h, int nranks, const char *const *extra, pid_t *pids)
{
    return spawn_ranks_of(h, RANK_BIN, nranks, extra, pids);
}

int harness_spawn_coll(harness_t *h, int nranks, const char *const *extra, pid_t *pids)
{
    return spawn_ranks_of(h, COLL_BIN, nranks, extra, pids);
}

int harness_spawn_crossed(harness_t *h, const char *timeout_ms, const char *expect, char (*out)[400], pid_t pids[2])
{
    char hex[2][HARNESS_UID_HEX_LEN];
    for (int i = 0; i < 2; i++)
        if (harness_new_uid_hex(h, hex[i]) < 0)
            return -1;
    for (int r = 0; r < 2; r++) {
        const char *argv[24] = { COLL_BIN,   "--socket",     h->socket, "--uid",      hex[0], "--uid2",
                                 hex[1],     "--nranks",     "2",       "--rank",     r ? "1" : "0",
                                 "--mode",   "crossed",      "--timeout-ms", timeout_ms, "--expect",
                                 expect,     "--sync-dir",   h->dir };
        if (out) {
            snprintf(out[r], sizeof(out[r]), "%s/crossed-%d", h->dir, r);
            argv[19] = "--out";
            argv[20] = out[r];
        }
        if ((pids[r] = harness_spawn(argv)) < 0)
            return -1;
    }
    return 0;
}

int harness_bg_start(harness_t *h, harness_bg_t *bg)
{
    static unsigned serial;
    snprintf(bg->stop, sizeof(bg->stop), "%s/bg-stop-%u", h->dir, serial);
    snprintf(bg->progress, sizeof(bg->progress), "%s/bg-progress-%u", h->dir, serial++);
    const char *extra[] = { "--iters",     "0",      "--counts",        "1,4096",     "--name", "background",
                            "--stop-file", bg->stop, "--progress-file", bg->progress, NULL };
    if (harness_spawn_ranks(h, 2, extra, bg->pids) < 0)
        return -1;
    double end = harness_now_ms() + 20000;
    while (harness_now_ms() < end) {
        if (harness_bg_progress(bg) > 0)
            return 0;
        sleep_ms(5);
    }
    fprintf(stderr, "harness: the background communicator made no progress in 20 s\n");
    return -1;
}

long harness_bg_progress(const harness_bg_t *bg)
{
    FILE *f = fopen(bg->progress, "r");
    long n = 0;
    if (f) {
        if (fscanf(f, "%ld", &n) != 1)
            n = 0;
        fclose(f);
    }
    return n;
}

long harness_bg_wait_progress(const harness_bg_t *bg, long before, int timeout_ms)
{
    double end = harness_now_ms() + timeout_ms;
    long n = harness_bg_progress(bg);
    while (n <= before && harness_now_ms() < end) {
        sleep_ms(5);
        n = harness_bg_progress(bg);
    }
    return n;
}

int harness_bg_stop(harness_bg_t *bg)
{
    FILE *f = fopen(bg->stop, "w");
    if (f)
        fclose(f);
    return harness_wait_all(bg->pids, 2, 30000) == 0 ? 0 : -1;
}

/* The daemon's Status as the driver's session sees it, or NULL (printed). */
static Colld__V1__StatusResponse *status_of(harness_t *h)
{
    Colld__V1__StatusRequest req = COLLD__V1__STATUS_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(h->client, &ref);
    req.session = &ref;
    Colld__V1__StatusResponse *resp = NULL;
    char detail[256];
    colld_status_t st = colld__client_rpc(h->client, "/colld.v1.Colld/Status", &req.base,
                                          &colld__v1__status_response__descriptor, 10000, (ProtobufCMessage **)&resp,
                                          detail, sizeof(detail));
    if (st != COLLD_OK) {
        fprintf(stderr, "harness: status: %s: %s\n", colld_status_name(st), detail);
        return NULL;
    }
    return resp;
}

uint64_t harness_comm_id(harness_t *h, const char *name)
{
    Colld__V1__StatusResponse *resp = status_of(h);
    uint64_t id = 0;
    for (size_t i = 0; resp && i < resp->n_comms; i++)
        if (strcmp(resp->comms[i]->name, name) == 0)
            id = resp->comms[i]->id;
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    return id;
}

int harness_wait_comm_count(harness_t *h, size_t n, int timeout_ms)
{
    double end = harness_now_ms() + timeout_ms;
    for (;;) {
        Colld__V1__StatusResponse *resp = status_of(h);
        size_t comms = resp ? resp->n_comms : 0;
        if (resp)
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        if (comms >= n)
            return 0;
        if (harness_now_ms() > end)
            return -1;
        sleep_ms(5);
    }
}

int harness_wait_clean(harness_t *h, int timeout_ms)
{
    double end = harness_now_ms() + timeout_ms;
    size_t sessions = 0, comms = 0;
    for (;;) {
        Colld__V1__StatusResponse *resp = status_of(h);
        if (!resp)
            return -1;
        sessions = resp->n_sessions;
        comms = resp->n_comms;
        protobuf_c_message_free_unpacked(&resp->base, NULL);
        if (sessions == 1 && comms == 0)
            return 0;
        if (harness_now_ms() > end)
            break;
        sleep_ms(10);
    }
    fprintf(stderr, "harness: left behind: %zu sessions (expected 1, the driver's) and %zu communicators\n", sessions,
            comms);
    return -1;
}

int harness_wait_all(pid_t *pids, int n, int timeout_ms)
{
    int bad = 0;
    double end = harness_now_ms() + timeout_ms;
    for (int i = 0; i < n; i++) {
        int left = (int)(end - harness_now_ms());
        int rc = harness_wait(pids[i], left > 0 ? left : 1);
        if (rc != 0) {
            fprintf(stderr, "harness: rank %d (pid %d) ended with %d\n", i, (int)pids[i], rc);
            bad++;
        }
    }
    return bad;
}

void harness_read_file(const char *path, char *buf, size_t len)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
}

int harness_wait_file(const char *path, int timeout_ms)
{
    double end = harness_now_ms() + timeout_ms;
    while (harness_now_ms() < end) {
        if (access(path, F_OK) == 0)
            return 0;
        sleep_ms(2);
    }
    return -1;
}

void harness_touch(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0)
        close(fd);
}

bool harness_exists(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

bool harness_wait_for(const char *dir, const char *name, int timeout_ms)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return harness_wait_file(path, timeout_ms) == 0;
}

pid_t harness_spawn_self(const harness_t *h, const char *argv0, const char *mode, bool nobody)
{
    int exe = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (exe < 0)
        return -1;
    char *argv[] = { (char *)argv0, (char *)mode, (char *)h->socket, (char *)h->dir, NULL };
    pid_t pid = fork();
    if (pid == 0) {
        if (nobody && (setgroups(0, NULL) < 0 || setgid(HARNESS_NOBODY) < 0 || setuid(HARNESS_NOBODY) < 0))
            _exit(126);
        fexecve(exe, argv, environ);
        _exit(127);
    }
    close(exe);
    return pid;
}

int harness_test_setup_shared(void **state, const char *const *extra)
{
    if (harness_test_setup_args(state, extra) < 0)
        return -1;
    harness_t *h = *state;
    return chmod(h->dir, 0777);
}

/* Run argv with its stdout (and stderr if asked) into out; see harness_capture. */
static int capture(const char *const *argv, char *out, size_t len, int timeout_ms, bool with_stderr)
{
    int p[2];
    if (pipe(p) < 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    if (with_stderr)
        posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (rc != 0) {
        close(p[0]);
        return -1;
    }
    size_t got = 0;
    ssize_t n;
    while (got + 1 < len && (n = read(p[0], out + got, len - 1 - got)) > 0)
        got += (size_t)n;
    out[got] = '\0';
    close(p[0]);
    return harness_wait(pid, timeout_ms);
}

int harness_capture(const char *const *argv, char *out, size_t len, int timeout_ms)
{
    return capture(argv, out, len, timeout_ms, false);
}

int harness_capture_all(const char *const *argv, char *out, size_t len, int timeout_ms)
{
    return capture(argv, out, len, timeout_ms, true);
}

int harness_net_status(harness_t *h, harness_net_t *out)
{
    memset(out, 0, sizeof(*out));
    Colld__V1__StatusResponse *resp = status_of(h);
    if (!resp)
        return -1;
    out->sent = resp->net_payload_sent;
    out->received = resp->net_payload_received;
    out->refused = resp->net_refused;
    snprintf(out->listen, sizeof(out->listen), "%s", resp->listen ? resp->listen : "");
    for (size_t i = 0; i < resp->n_peers; i++)
        if (resp->peers[i]->state && strcmp(resp->peers[i]->state, "up") == 0)
            out->peers_up++;
    colld__v1__status_response__free_unpacked(resp, NULL);
    return 0;
}

int harness_metrics_port(const harness_t *h)
{
    static const char needle[] = "metrics on http://127.0.0.1:";
    double end = harness_now_ms() + 10000;
    do {
        char text[16384];
        harness_read_file(h->log, text, sizeof(text));
        const char *p = strstr(text, needle);
        if (p)
            return atoi(p + sizeof(needle) - 1);
        usleep(10000);
    } while (harness_now_ms() < end);
    return -1;
}

char *harness_scrape(int port)
{
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        fprintf(stderr, "scrape: cannot connect to port %d: %s\n", port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    struct timeval tv = { .tv_sec = 10 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    int rerr = 0;
    if (buf && send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(req) - 1) {
        for (;;) {
            if (len + 1 == cap) {
                char *t = realloc(buf, cap * 2);
                if (!t)
                    break;
                buf = t;
                cap *= 2;
            }
            ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
            if (r <= 0) {
                rerr = r < 0 ? errno : 0;
                break;
            }
            len += (size_t)r;
        }
    }
    close(fd);
    if (!buf)
        return NULL;
    buf[len] = '\0';
    if (strncmp(buf, "HTTP/1.1 200 ", 13) != 0) { /* say why, for a failure under load */
        fprintf(stderr, "scrape: %zu bytes (%.40s) before %s\n", len, buf, rerr ? strerror(rerr) : "the end");
        free(buf);
        return NULL;
    }
    return buf;
}

double harness_metric_in(const char *answer, const char *name)
{
    size_t nlen = strlen(name);
    for (const char *p = answer; (p = strstr(p, name)) != NULL; p += nlen)
        if ((p == answer || p[-1] == '\n') && p[nlen] == ' ')
            return strtod(p + nlen + 1, NULL);
    return -1;
}

double harness_metric(int port, const char *name)
{
    char *ans = harness_scrape(port);
    double v = ans ? harness_metric_in(ans, name) : -1;
    free(ans);
    return v;
}

/* ============================================================================================
 * Rank processes
 * ========================================================================================== */

int harness_rank_join(const char *who, const char *socket, const char *uid_hex, int nranks, int rank,
                      const colld_comm_config_t *cfg, colld_client_t **c, colld_comm_t **comm)
{
    colld_unique_id_t id;
    if (harness_uid_from_hex(uid_hex, &id) < 0) {
        fprintf(stderr, "%s: bad --uid\n", who);
        return 2;
    }
    colld_status_t st = colld_connect(socket, c);
    if (st != COLLD_OK) {
        fprintf(stderr, "rank %d: connect: %s\n", rank, colld_status_name(st));
        return 1;
    }
    st = colld_comm_init_rank(*c, comm, nranks, id, rank, cfg);
    if (st != COLLD_OK) {
        fprintf(stderr, "rank %d: comm_init_rank: %s\n", rank, colld_status_name(st));
        colld_disconnect(*c);
        return 1;
    }
    return 0;
}

int harness_rank_buffers(colld_client_t *c, int rank, bool use_malloc, size_t *bytes, unsigned char **a,
                         unsigned char **b)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    *bytes = (*bytes + page - 1) & ~(page - 1);
    *a = *b = NULL;
    colld_status_t st;
    if (use_malloc) {
        *a = aligned_alloc(64, *bytes);
        *b = aligned_alloc(64, *bytes);
        st = *a && *b ? COLLD_OK : COLLD_ERR_NO_MEMORY;
    } else if ((st = colld_mem_alloc(c, (void **)a, *bytes, COLLD_MEM_HOST)) == COLLD_OK)
        st = colld_mem_alloc(c, (void **)b, *bytes, COLLD_MEM_HOST);
    if (st == COLLD_OK)
        return 0;
    fprintf(stderr, "rank %d: mem_alloc of %zu bytes: %s\n", rank, *bytes, colld_status_name(st));
    return 1;
}

void harness_rank_end(colld_client_t *c, colld_comm_t *comm, bool use_malloc, unsigned char *a, unsigned char *b)
{
    if (use_malloc) {
        free(a);
        free(b);
    } else {
        if (a)
            colld_mem_free(c, a);
        if (b)
            colld_mem_free(c, b);
    }
    colld_comm_destroy(comm);
    colld_disconnect(c);
}

/* ============================================================================================
 * Ranks inside one test process
 * ========================================================================================== */

static void *join_rank(void *arg)
{
    harness_rank_t *p = arg;
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = p->timeout_ms;
    cfg.name = p->name;
    p->st = colld_comm_init_rank(p->client, &p->comm, p->nranks, p->id, p->rank, &cfg);
    return NULL;
}

int harness_join_ranks(const char *who, const char *socket, harness_rank_t *p, int n, int timeout_ms,
                       const char *name, colld_client_t *first)
{
    for (int r = 0; r < n; r++)
        p[r] = (harness_rank_t){ .client = r == 0 ? first : NULL, .nranks = n, .rank = r, .timeout_ms = timeout_ms,
                                 .name = name };
    pthread_t *t = calloc((size_t)n, sizeof(*t));
    colld_unique_id_t id;
    int rc = 0;
    if (!t)
        return 1;
    for (int r = 0; r < n; r++) {
        colld_status_t st = p[r].client ? COLLD_OK : colld_connect(socket, &p[r].client);
        if (st == COLLD_OK && r == 0)
            st = colld_get_unique_id(p[0].client, &id);
        if (st != COLLD_OK) {
            fprintf(stderr, "%s (uid %u): connect %d: %s: %s\n", who, (unsigned)getuid(), r, colld_status_name(st),
                    p[r].client ? colld_last_error(p[r].client) : colld_status_string(st));
            free(t);
            return 1;
        }
    }
    int started = 0;
    for (int r = 0; r < n; r++) {
        p[r].id = id;
        if (pthread_create(&t[r], NULL, join_rank, &p[r]) != 0) {
            p[r].st = COLLD_ERR_SYSTEM;
            break;
        }
        started++;
    }
    for (int r = 0; r < started; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < n; r++)
        if (r >= started || p[r].st != COLLD_OK) {
            fprintf(stderr, "%s: rank %d join: %s: %s\n", who, r,
                    colld_status_name(r < started ? p[r].st : COLLD_ERR_SYSTEM),
                    r < started ? colld_last_error(p[r].client) : "no thread for it");
            rc = 1;
        }
    free(t);
    return rc;
}

void harness_leave_ranks(harness_rank_t *p, int n)
{
    for (int r = 0; r < n; r++) {
        if (p[r].comm)
            colld_comm_destroy(p[r].comm);
        p[r].comm = NULL;
        if (p[r].client)
            colld_disconnect(p[r].client);
        p[r].client = NULL;
    }
}
