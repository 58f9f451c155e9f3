/*
 * test_adv_limits.c - a hostile tenant tries to exhaust what the daemon holds for it (issue 13 #2,
 * #7, #12, #14): registrations (count, bytes, the daemon's map count), communicators and ranks
 * joining, the admin role, names. Each attack goes through the real wire format (raw REG messages
 * on the session socket, CommInit calls) against a real daemon whose limits are lowered by flags;
 * every refusal must be COLLD_ERR_QUOTA_EXCEEDED (or INVALID_ARGUMENT for a name) with a message
 * that names the limit, and another tenant keeps working throughout.
 *
 * The other tenant is a second uid: this program re-executed as uid/gid 65534 ("nobody") in
 * victim mode, which attaches, forms a 2-rank communicator and runs an exact all-reduce. That needs
 * root (the whole test is skipped, exit 77, otherwise). The attacker is root (uid 0), in-process
 * through client_internal.h, or this program re-executed in joiner mode (a process that keeps
 * CommInit calls waiting and is killed to end the attack).
 */
#include "client/client_internal.h"
#include "colld.pb-c.h"
#include "common/util.h"
#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define NOBODY 65534
#define JOIN_NRANKS 1024

extern char **environ;

/* ============================================================================================
 * The other tenant (victim mode, runs as uid 65534)
 * ========================================================================================== */

/* Attach twice, form a 2-rank communicator and run an exact all-reduce of small integers (on
 * ordinary memory: the fast path, so it needs no registration). Exit 0 when all of it worked. */
static int victim_main(const char *socket, bool admin_role)
{
    harness_rank_t v[2];
    colld_client_t *c0 = NULL;
    colld_status_t st = admin_role ? colld__connect_role(socket, COLLD_ROLE_ADMIN, &c0) : colld_connect(socket, &c0);
    if (st != COLLD_OK) {
        fprintf(stderr, "victim (uid %u): connect: %s: %s\n", (unsigned)getuid(), colld_status_name(st),
                colld_status_string(st));
        return 1;
    }
    int rc = harness_join_ranks("victim", socket, v, 2, 30000, "victim", c0);
    /* Both ranks post, then both wait (the fast path completes when every rank has posted). */
    enum { N = 1000 };
    static float buf[2][N];
    for (int r = 0; r < 2 && rc == 0; r++) {
        for (int i = 0; i < N; i++)
            buf[r][i] = (float)((i * 7 + r * 13) % 61 - 30);
        if ((st = colld_allreduce(buf[r], buf[r], N, COLLD_FLOAT32, COLLD_SUM, v[r].comm, NULL)) != COLLD_OK) {
            fprintf(stderr, "victim: rank %d all-reduce: %s: %s\n", r, colld_status_name(st),
                    colld_comm_last_error(v[r].comm));
            rc = 1;
        }
    }
    for (int r = 0; r < 2 && rc == 0; r++)
        if ((st = colld_comm_synchronize(v[r].comm)) != COLLD_OK) {
            fprintf(stderr, "victim: rank %d synchronize: %s: %s\n", r, colld_status_name(st),
                    colld_comm_last_error(v[r].comm));
            rc = 1;
        }
    for (int r = 0; r < 2 && rc == 0; r++)
        for (int i = 0; i < N; i++)
            if (buf[r][i] != (float)((i * 7) % 61 - 30 + (i * 7 + 13) % 61 - 30)) {
                fprintf(stderr, "victim: rank %d element %d is %g\n", r, i, (double)buf[r][i]);
                rc = 1;
                break;
            }
    harness_leave_ranks(v, 2);
    return rc;
}

/* Run victim mode as uid/gid 65534 (fork, drop to nobody, re-execute this program from an fd
 * opened while still root, so no path permission stands in the way). Returns its exit code. */
static int run_victim(harness_t *h, bool admin_role)
{
    int exe = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (exe < 0)
        return -1;
    char *argv[] = { "test_adv_limits", admin_role ? "--victim-admin" : "--victim", h->socket, NULL };
    pid_t pid = fork();
    if (pid == 0) {
        if (setgroups(0, NULL) < 0 || setgid(NOBODY) < 0 || setuid(NOBODY) < 0)
            _exit(126);
        fexecve(exe, argv, environ);
        _exit(127);
    }
    close(exe);
    int rc = pid < 0 ? -1 : harness_wait(pid, 60000);
    if (rc != 0)
        print_message("victim (uid %d) ended with %d\n", NOBODY, rc);
    return rc;
}

/* ============================================================================================
 * The joiner (joiner mode, runs as root): CommInit calls that wait for ranks that never come
 * ========================================================================================== */

typedef struct {
    colld_client_t *c;
    colld_status_t st;
    char detail[256];
} joiner_t;

/* One CommInit of rank 0 of a JOIN_NRANKS communicator, waiting (no deadline) until the
 * communicator dissolves or the process is killed. */
static void *joiner_thread(void *arg)
{
    joiner_t *j = arg;
    colld_unique_id_t id;
    if ((j->st = colld_get_unique_id(j->c, &id)) != COLLD_OK)
        return NULL;
    Colld__V1__CommInitRequest req = COLLD__V1__COMM_INIT_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(j->c, &ref);
    req.session = &ref;
    req.unique_id.data = (uint8_t *)id.internal;
    req.unique_id.len = COLLD_WIRE_UNIQUE_ID_BYTES;
    req.nranks = JOIN_NRANKS;
    req.rank = 0;
    req.timeout_ms = 3600000;
    req.name = "joiner";
    ProtobufCMessage *resp = NULL;
    j->st = colld__client_rpc(j->c, "/colld.v1.Colld/CommInit", &req.base, &colld__v1__comm_init_response__descriptor,
                              0, &resp, j->detail, sizeof(j->detail));
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    return NULL;
}

/* `count` waiting joins from one session; the driver kills the process to end them. */
static int joiner_main(const char *socket, int count)
{
    colld_client_t *c;
    if (colld_connect(socket, &c) != COLLD_OK)
        return 1;
    joiner_t *j = calloc((size_t)count, sizeof(*j));
    pthread_t *t = calloc((size_t)count, sizeof(*t));
    for (int i = 0; i < count; i++) {
        j[i].c = c;
        pthread_create(&t[i], NULL, joiner_thread, &j[i]);
    }
    for (int i = 0; i < count; i++)
        pthread_join(t[i], NULL);
    return 0; /* only if the joins were answered: the driver kills it first */
}

static pid_t spawn_joiner(harness_t *h, int count)
{
    char exe[512], n[16];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (len <= 0)
        return -1;
    exe[len] = '\0';
    snprintf(n, sizeof(n), "%d", count);
    const char *argv[] = { exe, "--joiner", h->socket, n, NULL };
    return harness_spawn(argv);
}

/* ============================================================================================
 * Helpers
 * ========================================================================================== */

/* Daemon arguments of each test: every test starts its own daemon, reachable by uid 65534. */
static int setup_with(void **state, const char *const *extra)
{
    if (harness_test_setup_args(state, extra) < 0)
        return -1;
    harness_t *h = *state;
    return chmod(h->dir, 0755); /* the victim (uid 65534) must reach the sockets */
}

/* A memfd of `bytes`, sealed against shrinking and every page written, as the daemon requires. */
static int sealed_memfd(size_t bytes)
{
    static char zero[1 << 16];
    int fd = memfd_create("attack", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    for (size_t off = 0; off < bytes; off += sizeof(zero)) {
        size_t n = bytes - off < sizeof(zero) ? bytes - off : sizeof(zero);
        assert_int_equal(pwrite(fd, zero, n, (off_t)off), (ssize_t)n);
    }
    return fd;
}

/* One raw REG message of `bytes` of a memfd like `fd` (its size; a memfd registers once, as the
 * daemon seals it, so each registration sends a new one); the status of the reply, its detail in
 * detail. */
static colld_status_t raw_reg(colld_client_t *c, int fd, uint64_t bytes, char *detail, size_t len)
{
    colld_wire_msg_t m, r;
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    int fresh = sealed_memfd((size_t)sb.st_size);
    memset(&m, 0, sizeof(m));
    memset(&r, 0, sizeof(r));
    m.type = COLLD_MSG_REG;
    m.u.reg.bytes = bytes;
    m.u.reg.cookie = 42;
    colld_status_t st = colld__sock_request(c, &m, fresh, COLLD_MSG_REG_REPLY, &r, NULL, 0);
    close(fresh);
    detail[0] = '\0';
    if (st != COLLD_OK)
        return st;
    colld_str_sanitize(detail, len, r.u.detail, sizeof(r.u.detail));
    return (colld_status_t)r.status;
}

/* Register until the daemon refuses (at most max times). Returns how many it accepted; the
 * refusal's status and detail in *st and detail. */
static long reg_until_refused(colld_client_t *c, int fd, uint64_t bytes, long max, colld_status_t *st, char *detail,
                              size_t len)
{
    long n = 0;
    while (n < max && (*st = raw_reg(c, fd, bytes, detail, len)) == COLLD_OK)
        n++;
    return n;
}

/* Run collctl with the driver's socket; its output (stdout and stderr) in out. */
static int collctl(harness_t *h, char *out, size_t len, ...)
{
    const char *argv[24] = { COLLCTL_BIN, "--socket", h->socket };
    int n = 3;
    va_list ap;
    va_start(ap, len);
    const char *a;
    while ((a = va_arg(ap, const char *)) && n < 23)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    return harness_capture_all(argv, out, len, 20000);
}

/* The daemon's GetPolicy as the driver's (admin) session sees it; free with
 * protobuf_c_message_free_unpacked. */
static Colld__V1__GetPolicyResponse *get_policy(harness_t *h)
{
    Colld__V1__GetPolicyRequest req = COLLD__V1__GET_POLICY_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(h->client, &ref);
    req.session = &ref;
    Colld__V1__GetPolicyResponse *resp = NULL;
    char detail[256];
    assert_int_equal(colld__client_rpc(h->client, "/colld.v1.Colld/GetPolicy", &req.base,
                                       &colld__v1__get_policy_response__descriptor, 10000, (ProtobufCMessage **)&resp,
                                       detail, sizeof(detail)),
                     COLLD_OK);
    assert_int_equal(resp->status, COLLD_OK);
    return resp;
}

/* What all tenants hold of a limit now. */
static uint64_t used_total(harness_t *h, const char *limit)
{
    Colld__V1__GetPolicyResponse *p = get_policy(h);
    uint64_t v = UINT64_MAX;
    for (size_t i = 0; i < p->n_defaults; i++)
        if (strcmp(p->defaults[i]->name, limit) == 0)
            v = p->defaults[i]->used;
    protobuf_c_message_free_unpacked(&p->base, NULL);
    assert_true(v != UINT64_MAX);
    return v;
}

/* Wait (at most timeout_ms) until all tenants together hold `want` of a limit. */
static void wait_used(harness_t *h, const char *limit, uint64_t want, int timeout_ms)
{
    double end = harness_now_ms() + timeout_ms;
    uint64_t v;
    while ((v = used_total(h, limit)) != want && harness_now_ms() < end)
        usleep(5000);
    if (v != want)
        fail_msg("%s: all tenants hold %llu, expected %llu", limit, (unsigned long long)v, (unsigned long long)want);
}

static void expect_contains(const char *text, const char *part)
{
    if (!strstr(text, part))
        fail_msg("'%s' does not contain '%s'", text, part);
}

/* ============================================================================================
 * #2: registrations
 * ========================================================================================== */

static int setup_regs(void **state)
{
    static const char *const extra[] = { "--socket-mode", "0666", "--max-regs-per-tenant", "64", "--metrics",
                                         "127.0.0.1:0", NULL };
    return setup_with(state, extra);
}

/* max-regs-per-tenant: raw REGs of 4 KiB memfds are refused after 64 with the limit named; the
 * library reports the same refusal from colld_mem_alloc and from staging; the other tenant works
 * throughout; an override raises the limit at run time; everything is given back at disconnect. */
static void test_registration_count(void **state)
{
    harness_t *h = *state;
    char detail[256], out[16384];
    colld_status_t st;
    colld_client_t *att;
    assert_int_equal(colld_connect(h->socket, &att), COLLD_OK);
    int fd = sealed_memfd(4096);

    assert_int_equal(reg_until_refused(att, fd, 4096, 10000, &st, detail, sizeof(detail)), 64);
    print_message("65th registration: %s: %s\n", colld_status_name(st), detail);
    assert_int_equal(st, COLLD_ERR_QUOTA_EXCEEDED);
    expect_contains(detail, "uid 0 is at its limit max-regs-per-tenant = 64 (holds 64, asked for 1 more)");
    assert_int_equal(used_total(h, "max-regs-per-tenant"), 64);
    assert_int_equal(used_total(h, "max-registered-bytes-per-tenant"), 64 * 4096);

    /* The library passes the refusal on: colld_mem_alloc, and staging ordinary memory. */
    void *p = NULL;
    assert_int_equal(colld_mem_alloc(att, &p, 1 << 20, COLLD_MEM_HOST), COLLD_ERR_QUOTA_EXCEEDED);
    print_message("colld_mem_alloc: %s\n", colld_last_error(att));
    expect_contains(colld_last_error(att), "uid 0 is at its limit max-regs-per-tenant = 64");
    colld_unique_id_t id;
    colld_comm_t *comm;
    assert_int_equal(colld_get_unique_id(att, &id), COLLD_OK);
    assert_int_equal(colld_comm_init_rank(att, &comm, 1, id, 0, NULL), COLLD_OK);
    size_t count = 256 * 1024; /* 1 MiB of floats: the engine path, staged */
    float *big = calloc(count, sizeof(float));
    assert_non_null(big);
    assert_int_equal(colld_allreduce(big, big, count, COLLD_FLOAT32, COLLD_SUM, comm, NULL), COLLD_ERR_QUOTA_EXCEEDED);
    print_message("staging: %s\n", colld_comm_last_error(comm));
    expect_contains(colld_comm_last_error(comm), "uid 0 is at its limit max-regs-per-tenant = 64");
    free(big);
    assert_int_equal(colld_comm_destroy(comm), COLLD_OK);

    /* Another tenant attaches, forms a communicator and runs an exact all-reduce meanwhile. */
    assert_int_equal(run_victim(h, false), 0);

    /* The refusals are counted, by limit. */
    int port = harness_metrics_port(h);
    assert_true(port > 0);
    char *ans = harness_scrape(port);
    assert_non_null(ans);
    expect_contains(ans, "colld_quota_refusals_total{limit=\"max-regs-per-tenant\"} 3\n");
    expect_contains(ans, "colld_quota_refusals_total{limit=\"max-registrations\"} 0\n");
    free(ans);
    assert_int_equal(collctl(h, out, sizeof(out), "--json", "policy", NULL), 0);
    expect_contains(out, "{\"name\":\"max-regs-per-tenant\",\"default\":64,\"used\":64,\"refused\":3}");

    /* An operator raises uid 0's limit at run time: 32 more, then the new limit is named. */
    assert_int_equal(collctl(h, out, sizeof(out), "policy", "set", "0", "--max-regs-per-tenant", "96", NULL), 0);
    assert_int_equal(collctl(h, out, sizeof(out), "--json", "policy", NULL), 0);
    expect_contains(out, "{\"name\":\"max-regs-per-tenant\",\"limit\":96,\"used\":64,\"override\":true}");
    assert_int_equal(reg_until_refused(att, fd, 4096, 10000, &st, detail, sizeof(detail)), 32);
    assert_int_equal(st, COLLD_ERR_QUOTA_EXCEEDED);
    expect_contains(detail, "uid 0 is at its limit max-regs-per-tenant = 96 (holds 96");
    /* Back to the default: what is held stays, nothing more is accepted. */
    assert_int_equal(collctl(h, out, sizeof(out), "policy", "set", "0", "--max-regs-per-tenant", "default", NULL), 0);
    assert_int_equal(raw_reg(att, fd, 4096, detail, sizeof(detail)), COLLD_ERR_QUOTA_EXCEEDED);
    expect_contains(detail, "uid 0 is at its limit max-regs-per-tenant = 64 (holds 96");

    /* The tenant's registrations are given back when its session ends. */
    close(fd);
    colld_disconnect(att);
    wait_used(h, "max-regs-per-tenant", 0, 10000);
    assert_int_equal(used_total(h, "max-registered-bytes-per-tenant"), 0);
    assert_int_equal(run_victim(h, false), 0);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

static int setup_bytes(void **state)
{
    static const char *const extra[] = { "--socket-mode", "0666", "--max-registered-bytes-per-tenant", "64K", NULL };
    return setup_with(state, extra);
}

/* max-registered-bytes-per-tenant: registrations of 1 byte are charged a page each (16 fit in
 * 64 KiB); a larger one is refused as a whole; the per-process limit stays. */
static void test_registration_bytes(void **state)
{
    harness_t *h = *state;
    char detail[256];
    colld_status_t st;
    colld_client_t *att;
    assert_int_equal(colld_connect(h->socket, &att), COLLD_OK);
    int fd = sealed_memfd(1 << 20);
    assert_int_equal(raw_reg(att, fd, 1 << 20, detail, sizeof(detail)), COLLD_ERR_QUOTA_EXCEEDED);
    expect_contains(detail, "uid 0 is at its limit max-registered-bytes-per-tenant = 65536 (holds 0, asked for 1048576 more)");
    assert_int_equal(reg_until_refused(att, fd, 1, 10000, &st, detail, sizeof(detail)), 16);
    print_message("17th one-byte registration: %s: %s\n", colld_status_name(st), detail);
    assert_int_equal(st, COLLD_ERR_QUOTA_EXCEEDED);
    expect_contains(detail, "uid 0 is at its limit max-registered-bytes-per-tenant = 65536 (holds 65536, asked for 4096 more)");
    assert_int_equal(run_victim(h, false), 0);
    close(fd);
    colld_disconnect(att);
    wait_used(h, "max-registered-bytes-per-tenant", 0, 10000);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

static int setup_backstop(void **state)
{
    static const char *const extra[] = { "--socket-mode",       "0666", "--max-regs-per-tenant", "1000000",
                                         "--fast-path-bytes", "16K",  NULL };
    return setup_with(state, extra);
}

/* Mappings of a process now (lines of /proc/PID/maps). */
static long map_count(pid_t pid)
{
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    long n = 0;
    while (f && fgets(line, sizeof(line), f))
        n++;
    if (f)
        fclose(f);
    return n;
}

static long read_long(const char *path)
{
    char buf[64];
    harness_read_file(path, buf, sizeof(buf));
    return atol(buf);
}

/* #2 as reported: with the tenant's own limit out of the way, registrations of 4 KiB memfds (one
 * memfd registered again and again before it could be registered only once) stop at the daemon-wide backstop below vm.max_map_count (before: ~65,000 mappings, then no
 * tenant could attach: "cannot create the session rings"). The other tenant still attaches, forms
 * a communicator and runs an exact all-reduce. */
static void test_registration_backstop(void **state)
{
    harness_t *h = *state;
    char detail[256];
    colld_status_t st;
    colld_client_t *att;
    long max_maps = read_long("/proc/sys/vm/max_map_count");
    assert_true(max_maps > 0);
    assert_int_equal(colld_connect(h->socket, &att), COLLD_OK);
    int fd = sealed_memfd(4096);
    long n = reg_until_refused(att, fd, 4096, max_maps + 1000, &st, detail, sizeof(detail));
    print_message("%ld registrations, then %s: %s (vm.max_map_count %ld, daemon maps %ld)\n", n,
                  colld_status_name(st), detail, max_maps, map_count(h->pid));
    assert_int_equal(st, COLLD_ERR_QUOTA_EXCEEDED);
    expect_contains(detail, "the daemon is at its limit max-registrations = ");
    Colld__V1__GetPolicyResponse *p = get_policy(h);
    assert_int_equal((long)p->max_registrations, n);
    assert_int_equal((long)p->registrations, n);
    assert_int_equal(p->registrations_refused, 1);
    protobuf_c_message_free_unpacked(&p->base, NULL);
    assert_true(map_count(h->pid) < max_maps - 4096); /* room kept for the daemon's own mappings */

    assert_int_equal(run_victim(h, false), 0);
    assert_int_equal(run_victim(h, false), 0);

    close(fd);
    colld_disconnect(att);
    wait_used(h, "max-regs-per-tenant", 0, 60000);
    p = get_policy(h);
    assert_int_equal(p->registrations, 0);
    protobuf_c_message_free_unpacked(&p->base, NULL);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* ============================================================================================
 * #7: communicators and ranks joining
 * ========================================================================================== */

static int setup_comms(void **state)
{
    static const char *const extra[] = { "--socket-mode", "0666", "--max-comms-per-tenant", "8", NULL };
    return setup_with(state, extra);
}

/* max-comms-per-tenant: one-rank communicators (formed at once) stop at 8 with the limit named
 * in colld_last_error; destroying one gives its membership back; an override raises the limit. */
static void test_comm_memberships(void **state)
{
    harness_t *h = *state;
    char out[8192];
    colld_client_t *att;
    assert_int_equal(colld_connect(h->socket, &att), COLLD_OK);
    colld_comm_t *comms[16];
    int n = 0;
    colld_status_t st = COLLD_OK;
    colld_unique_id_t id;
    while (n < 16 && st == COLLD_OK) {
        assert_int_equal(colld_get_unique_id(att, &id), COLLD_OK);
        st = colld_comm_init_rank(att, &comms[n], 1, id, 0, NULL);
        if (st == COLLD_OK)
            n++;
    }
    print_message("communicator %d: %s: %s\n", n + 1, colld_status_name(st), colld_last_error(att));
    assert_int_equal(n, 8);
    assert_int_equal(st, COLLD_ERR_QUOTA_EXCEEDED);
    expect_contains(colld_last_error(att), "uid 0 is at its limit max-comms-per-tenant = 8 (holds 8, asked for 1 more)");
    assert_int_equal(run_victim(h, false), 0);

    assert_int_equal(colld_comm_destroy(comms[--n]), COLLD_OK);
    assert_int_equal(colld_get_unique_id(att, &id), COLLD_OK);
    assert_int_equal(colld_comm_init_rank(att, &comms[n++], 1, id, 0, NULL), COLLD_OK);

    assert_int_equal(collctl(h, out, sizeof(out), "policy", "set", "0", "--max-comms-per-tenant", "10", NULL), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(colld_get_unique_id(att, &id), COLLD_OK);
        assert_int_equal(colld_comm_init_rank(att, &comms[n++], 1, id, 0, NULL), COLLD_OK);
    }
    assert_int_equal(colld_get_unique_id(att, &id), COLLD_OK);
    assert_int_equal(colld_comm_init_rank(att, &comms[n], 1, id, 0, NULL), COLLD_ERR_QUOTA_EXCEEDED);
    expect_contains(colld_last_error(att), "uid 0 is at its limit max-comms-per-tenant = 10");
    assert_int_equal(used_total(h, "max-comms-per-tenant"), 10);
    while (n > 0)
        assert_int_equal(colld_comm_destroy(comms[--n]), COLLD_OK);
    assert_int_equal(used_total(h, "max-comms-per-tenant"), 0);
    colld_disconnect(att);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

#define JOINERS 256

static int setup_joining(void **state)
{
    static char limit[32];
    snprintf(limit, sizeof(limit), "%d", JOINERS * JOIN_NRANKS);
    static const char *extra[] = { "--socket-mode", "0666", "--max-joining-ranks-per-tenant", limit, NULL };
    return setup_with(state, extra);
}

/* Resident memory of a process in bytes. */
static long rss_bytes(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

/* What a forming communicator may cost the daemon (its record, its joined rank and the waiting
 * CommInit call), with room for the sanitizers' own bookkeeping. Before issue 13 it held
 * nranks members and a flight recorder of nranks columns: ~150 KiB for 1024 ranks. */
#if defined(__SANITIZE_THREAD__)
#define FORMING_COMM_MAX_BYTES (128 * 1024)
#elif defined(__SANITIZE_ADDRESS__)
#define FORMING_COMM_MAX_BYTES (64 * 1024)
#else
#define FORMING_COMM_MAX_BYTES (40 * 1024)
#endif
/* Whether the daemon's RSS is expected back once the attack ends: not under the sanitizers, whose
 * allocators keep freed memory (ASan's quarantine) and whose daemon is this build's. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define RSS_RETURNS 0
#else
#define RSS_RETURNS 1
#endif

/* #7: a tenant keeps communicators of 1024 ranks forming. It is refused once the ranks of those
 * communicators reach max-joining-ranks-per-tenant, each forming communicator costs the daemon
 * memory for the ranks that joined, not for 1024, and the memory is released when the tenant
 * goes. The other tenant works meanwhile; an override raises the limit at run time. */
static void test_joining_ranks(void **state)
{
    harness_t *h = *state;
    char out[8192];
    assert_int_equal(run_victim(h, false), 0); /* warm: the daemon's arenas as in steady state */
    long before = rss_bytes(h->pid);
    pid_t joiner = spawn_joiner(h, JOINERS);
    assert_true(joiner > 0);
    wait_used(h, "max-joining-ranks-per-tenant", (uint64_t)JOINERS * JOIN_NRANKS, 60000);
    long during = rss_bytes(h->pid);

    /* One more communicator of this tenant is refused at once, naming the limit. */
    colld_unique_id_t id;
    colld_comm_t *comm;
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = 60000;
    assert_int_equal(colld_get_unique_id(h->client, &id), COLLD_OK);
    assert_int_equal(colld_comm_init_rank(h->client, &comm, JOIN_NRANKS, id, 0, &cfg), COLLD_ERR_QUOTA_EXCEEDED);
    print_message("%s\n", colld_last_error(h->client));
    expect_contains(colld_last_error(h->client), "uid 0 is at its limit max-joining-ranks-per-tenant = 262144 (holds "
                                                 "262144, asked for 1024 more)");
    assert_int_equal(used_total(h, "max-comms-per-tenant"), JOINERS);
    assert_int_equal(run_victim(h, false), 0);

    /* An override lets this tenant form a small one meanwhile. */
    assert_int_equal(collctl(h, out, sizeof(out), "policy", "set", "0", "--max-joining-ranks-per-tenant", "300000",
                             NULL),
                     0);
    assert_int_equal(colld_get_unique_id(h->client, &id), COLLD_OK);
    assert_int_equal(colld_comm_init_rank(h->client, &comm, 1, id, 0, &cfg), COLLD_OK);
    assert_int_equal(colld_comm_destroy(comm), COLLD_OK);

    kill(joiner, SIGKILL);
    assert_int_equal(harness_wait(joiner, 10000), 128 + SIGKILL);
    wait_used(h, "max-joining-ranks-per-tenant", 0, 30000);
    assert_int_equal(harness_wait_clean(h, 30000), 0);
    long after = rss_bytes(h->pid);
    print_message("daemon RSS: %ld KiB before, %ld KiB with %d communicators of %d ranks forming (%ld bytes each), "
                  "%ld KiB after\n",
                  before / 1024, during / 1024, JOINERS, JOIN_NRANKS, (during - before) / JOINERS, after / 1024);
    assert_true(during - before < (long)JOINERS * FORMING_COMM_MAX_BYTES);
    if (RSS_RETURNS)
        assert_true(after - before < (long)JOINERS * FORMING_COMM_MAX_BYTES);
    assert_int_equal(used_total(h, "max-comms-per-tenant"), 0);
}

/* ============================================================================================
 * #12: roles are checked, names validated
 * ========================================================================================== */

static int setup_plain(void **state)
{
    static const char *const extra[] = { "--socket-mode", "0666", NULL };
    return setup_with(state, extra);
}

/* A tenant that claims the admin role in HELLO is served as a client: its attach and detach are
 * events like anyone's (before, claiming it hid them), and Status does not mark it admin. */
static void test_admin_role_is_checked(void **state)
{
    harness_t *h = *state;
    char out[65536];
    assert_int_equal(run_victim(h, true), 0);
    assert_int_equal(collctl(h, out, sizeof(out), "--json", "events", NULL), 0);
    /* The victim's first session claimed the role: attached and detached events of uid 65534,
     * one pair per session (2); collctl's own sessions (root, an administrator) make none. */
    int attached = 0, detached = 0, root = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        bool nobody = strstr(line, "\"uid\":65534,") != NULL;
        if (strstr(line, "\"type\":\"session_attached\""))
            nobody ? attached++ : root++;
        if (strstr(line, "\"type\":\"session_detached\""))
            nobody ? detached++ : root++;
    }
    print_message("uid 65534: %d attached, %d detached; other sessions: %d events\n", attached, detached, root);
    assert_int_equal(attached, 2);
    assert_int_equal(detached, 2);
    assert_int_equal(root, 1); /* the driver's own session (a client) attached; collctl's (admin) make none */
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* A raw session connection whose HELLO carries `name` (48 bytes, no NUL needed). Returns the
 * socket (keep it open while the session should live) or -1. */
static int raw_hello(harness_t *h, const char *name, size_t len)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    colld_strlcpy(sa.sun_path, h->socket, sizeof(sa.sun_path));
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        return -1;
    colld_wire_msg_t m;
    memset(&m, 0, sizeof(m));
    m.magic = COLLD_WIRE_MAGIC;
    m.version = COLLD_WIRE_VERSION;
    m.type = COLLD_MSG_HELLO;
    m.u.hello.role = COLLD_ROLE_CLIENT;
    memcpy(m.u.hello.process_name, name, len < sizeof(m.u.hello.process_name) ? len : sizeof(m.u.hello.process_name));
    if (write(fd, &m, sizeof(m)) != (ssize_t)sizeof(m))
        return -1;
    /* WELCOME with the session's fds */
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } cm;
    struct iovec iov = { .iov_base = &m, .iov_len = sizeof(m) };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf) };
    if (recvmsg(fd, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC) != (ssize_t)sizeof(m) || m.type != COLLD_MSG_WELCOME ||
        m.status != COLLD_OK)
        return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
        for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
            int x;
            memcpy(&x, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            close(x);
        }
    return fd;
}

/* Communicator names are checked at entry: control characters, bidirectional overrides, invalid
 * UTF-8 and names past 63 bytes are refused with INVALID_ARGUMENT saying what is wrong; valid
 * UTF-8 is kept as it is. A process name in HELLO is sanitized instead (the session is served), so
 * Status and collctl --json stay valid. */
static void test_names_are_validated(void **state)
{
    harness_t *h = *state;
    char out[65536];
    static const struct {
        const char *name, *why;
    } bad[] = {
        { "evil\x1b[2J", "byte 4: control or formatting character U+001B" },
        { "two\nlines", "byte 3: control" },
        { "abc\xff", "byte 3: not valid UTF-8 (0xff)" },
        { "\xe2\x80\xaeright-to-left", "byte 0: control or formatting character U+202E" },
    };
    colld_comm_t *comm;
    colld_unique_id_t id;
    for (size_t i = 0; i < COLLD_ARRAY_SIZE(bad); i++) {
        colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
        cfg.name = bad[i].name;
        assert_int_equal(colld_get_unique_id(h->client, &id), COLLD_OK);
        assert_int_equal(colld_comm_init_rank(h->client, &comm, 1, id, 0, &cfg), COLLD_ERR_INVALID_ARGUMENT);
        print_message("%s\n", colld_last_error(h->client));
        expect_contains(colld_last_error(h->client), "communicator name refused: ");
        expect_contains(colld_last_error(h->client), bad[i].why);
    }
    /* Past 63 bytes, straight through the wire (the library cuts names at 63 bytes). */
    Colld__V1__CommInitRequest req = COLLD__V1__COMM_INIT_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(h->client, &ref);
    assert_int_equal(colld_get_unique_id(h->client, &id), COLLD_OK);
    req.session = &ref;
    req.unique_id.data = (uint8_t *)id.internal;
    req.unique_id.len = COLLD_WIRE_UNIQUE_ID_BYTES;
    req.nranks = 1;
    req.name = "0123456789012345678901234567890123456789012345678901234567890123"; /* 64 bytes */
    ProtobufCMessage *resp = NULL;
    char detail[512];
    assert_int_equal(colld__client_rpc(h->client, "/colld.v1.Colld/CommInit", &req.base,
                                       &colld__v1__comm_init_response__descriptor, 10000, &resp, detail,
                                       sizeof(detail)),
                     COLLD_ERR_INVALID_ARGUMENT);
    expect_contains(detail, "communicator name refused: longer than 63 bytes");

    /* Valid UTF-8 is kept; a long one is cut by the library between characters. */
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.name = "\xe8\xae\xad\xe7\xbb\x83-allreduce"; /* 训练-allreduce */
    assert_int_equal(colld_get_unique_id(h->client, &id), COLLD_OK);
    assert_int_equal(colld_comm_init_rank(h->client, &comm, 1, id, 0, &cfg), COLLD_OK);
    assert_true(harness_comm_id(h, cfg.name) > 0);
    colld_comm_t *comm2;
    char long_name[128] = "x"; /* 1 + 21 x 3 bytes: the 63-byte cut falls inside the 21st character */
    for (int i = 0; i < 21; i++)
        strcat(long_name, "\xe8\xae\xad");
    cfg.name = long_name;
    assert_int_equal(colld_get_unique_id(h->client, &id), COLLD_OK);
    assert_int_equal(colld_comm_init_rank(h->client, &comm2, 1, id, 0, &cfg), COLLD_OK);
    long_name[1 + 20 * 3] = '\0';
    assert_true(harness_comm_id(h, long_name) > 0);

    /* A HELLO with a hostile process name: served, the name sanitized (valid UTF-8 kept). */
    static const char pname[] = "\x1b[31mred\xff\xe8\xae\xad\n";
    int raw = raw_hello(h, pname, sizeof(pname) - 1);
    assert_true(raw >= 0);
    assert_int_equal(collctl(h, out, sizeof(out), "--json", "status", NULL), 0);
    expect_contains(out, "\"process\":\"?[31mred?\xe8\xae\xad?\"");
    assert_int_equal(collctl(h, out, sizeof(out), "status", NULL), 0);
    assert_null(strchr(out, '\x1b'));
    close(raw);
    assert_int_equal(colld_comm_destroy(comm), COLLD_OK);
    assert_int_equal(colld_comm_destroy(comm2), COLLD_OK);
    assert_int_equal(run_victim(h, false), 0);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && (strcmp(argv[1], "--victim") == 0 || strcmp(argv[1], "--victim-admin") == 0))
        return victim_main(argv[2], strcmp(argv[1], "--victim-admin") == 0);
    if (argc == 4 && strcmp(argv[1], "--joiner") == 0)
        return joiner_main(argv[2], atoi(argv[3]));
    if (geteuid() != 0) {
        fprintf(stderr, "test_adv_limits: skipped: the other tenant runs as uid %d, which needs root\n", NOBODY);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_registration_count, setup_regs, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_registration_bytes, setup_bytes, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_registration_backstop, setup_backstop, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_comm_memberships, setup_comms, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_joining_ranks, setup_joining, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_admin_role_is_checked, setup_plain, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_names_are_validated, setup_plain, harness_test_teardown),
    };
    return cmocka_run_group_tests_name("adv_limits", tests, NULL, NULL);
}
