/*
 * test_adv_tenant.c - what one tenant could still learn about another, or be told wrong about
 * its own calls (issue 26 rows 9 and 6).
 *
 * The tenants are this program run again under other uids (fork, setuid, exec; the test needs
 * root and skips with 77 without it): 65533 is a bystander that holds sessions, a communicator
 * and registrations; 65534 looks at the daemon with collctl, or runs the two ranks of a
 * communicator.
 *
 * - test_policy_own_use: `collctl policy` as uid 65534. Before the fix its defaults showed every
 *   limit's daemon-wide use and refusals and the registrations of all users, the bystander's
 *   included; now it shows the limits and its own use (own_only), and root still sees everything.
 * - test_detail_after_local_refusal: rank 0 calls colld_send to peer 5 of 2 (refused here, the
 *   communicator is fine), then an all-reduce while rank 1 calls a broadcast: the daemon reports a
 *   mismatch. Before the fix colld_comm_last_error still said "peer 5 is out of range"; now it
 *   gives the daemon's report, and after a later refusal and the communicator's error again, each
 *   time the last one.
 */
#include "tests/integration/harness.h"

#include <colld/colld.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define LOOKER 65534 /* nobody */
#define BYSTANDER 65533
#define REGS 5       /* registrations the bystander holds */

/* ============================================================================================
 * The tenants' side (this program as `--bystander SOCKET` or `--stale SOCKET DIR RANK`)
 * ========================================================================================== */

/* A session with a 1-rank communicator and REGS registrations, held until stdin closes. */
static int bystander_main(const char *socket)
{
    colld_client_t *c = NULL;
    colld_comm_t *comm = NULL;
    colld_unique_id_t id;
    void *buf[REGS];
    if (colld_connect(socket, &c) != COLLD_OK || colld_get_unique_id(c, &id) != COLLD_OK ||
        colld_comm_init_rank(c, &comm, 1, id, 0, NULL) != COLLD_OK)
        return 1;
    for (int i = 0; i < REGS; i++)
        if (colld_mem_alloc(c, &buf[i], 1 << 16, COLLD_MEM_HOST) != COLLD_OK)
            return 1;
    printf("ready\n");
    fflush(stdout);
    char b;
    while (read(STDIN_FILENO, &b, 1) > 0)
        ;
    for (int i = 0; i < REGS; i++)
        colld_mem_free(c, buf[i]);
    colld_comm_destroy(comm);
    colld_disconnect(c);
    return 0;
}

static bool says(const char *text, const char *want)
{
    return strstr(text, want) != NULL;
}

/* One rank of the stale-detail scenario (see the top of this file); rank 0 prints each detail it
 * got as "detail STEP: TEXT". Exit 0 when every status was the expected one. */
static int stale_main(const char *socket, const char *dir, int rank)
{
    char path[512], hex[HARNESS_UID_HEX_LEN];
    colld_client_t *c = NULL;
    colld_comm_t *comm = NULL;
    colld_unique_id_t id;
    snprintf(path, sizeof(path), "%s/id", dir);
    if (colld_connect(socket, &c) != COLLD_OK)
        return 1;
    if (rank == 0) {
        char tmp[600];
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        if (colld_get_unique_id(c, &id) != COLLD_OK || !f)
            return 1;
        harness_uid_to_hex(&id, hex);
        fputs(hex, f);
        if (fclose(f) != 0 || rename(tmp, path) != 0)
            return 1;
    } else {
        if (harness_wait_file(path, 20000) < 0)
            return 1;
        harness_read_file(path, hex, sizeof(hex));
        if (harness_uid_from_hex(hex, &id) < 0)
            return 1;
    }
    if (colld_comm_init_rank(c, &comm, 2, id, rank, NULL) != COLLD_OK)
        return 1;
    static float x[1024];
    int bad = 0;
    if (rank == 1) {
        colld_status_t st = colld_broadcast(x, x, 1024, COLLD_FLOAT32, 0, comm, NULL);
        if (st == COLLD_OK)
            st = colld_comm_synchronize(comm);
        bad += st != COLLD_ERR_MISMATCH;
        colld_comm_destroy(comm);
        colld_disconnect(c);
        return bad;
    }
    /* 1. refused here: the communicator is fine */
    colld_status_t st = colld_send(x, 1, COLLD_FLOAT32, 5, comm, NULL);
    printf("detail refused: %s\n", colld_comm_last_error(comm));
    bad += st != COLLD_ERR_INVALID_ARGUMENT;
    /* 2. the daemon reports a mismatch */
    st = colld_allreduce(x, x, 1024, COLLD_FLOAT32, COLLD_SUM, comm, NULL);
    if (st == COLLD_OK)
        st = colld_comm_synchronize(comm);
    printf("detail mismatch: %s\n", colld_comm_last_error(comm));
    bad += st != COLLD_ERR_MISMATCH;
    /* 3. a call refused here on the broken communicator: its own words */
    colld_group_start();
    st = colld_comm_synchronize(comm);
    colld_group_end();
    printf("detail in-group: %s\n", colld_comm_last_error(comm));
    bad += st != COLLD_ERR_INVALID_USAGE;
    /* 4. the communicator's error again */
    st = colld_allreduce(x, x, 1024, COLLD_FLOAT32, COLLD_SUM, comm, NULL);
    printf("detail fail-fast: %s\n", colld_comm_last_error(comm));
    bad += st != COLLD_ERR_MISMATCH;
    fflush(stdout);
    colld_comm_destroy(comm);
    colld_disconnect(c);
    return bad;
}

/* ============================================================================================
 * The driver
 * ========================================================================================== */

static harness_t live_h;

static int teardown(void **state)
{
    (void)state;
    harness_cleanup(&live_h);
    return 0;
}

static void start(harness_t *h)
{
    const char *extra[] = { "--socket-mode", "0666", NULL };
    memset(h, 0, sizeof(*h));
    assert_int_equal(harness_daemon_start(h, extra), 0);
    assert_int_equal(chmod(h->dir, 0755), 0);
}

typedef struct {
    pid_t pid;
    int in, out;
} child_t;

/* argv[0] under uid, its stdout (and stderr) to c->out, its stdin from c->in. */
static void spawn_as(child_t *c, uid_t uid, const char *const *argv)
{
    int in[2], out[2];
    assert_int_equal(pipe2(in, O_CLOEXEC), 0);
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) { /* only async-signal-safe calls until exec: this process runs gRPC threads */
        if (dup2(in[0], STDIN_FILENO) < 0 || dup2(out[1], STDOUT_FILENO) < 0 || dup2(out[1], STDERR_FILENO) < 0 ||
            setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c->in = in[1];
    c->out = out[0];
}

/* Everything the child prints until it exits (or limit_ms); its exit code. */
static int child_finish(child_t *c, char *out, size_t len, int limit_ms)
{
    size_t got = 0;
    double end = harness_now_ms() + limit_ms;
    close(c->in);
    for (;;) {
        struct pollfd p = { .fd = c->out, .events = POLLIN };
        int left = (int)(end - harness_now_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        ssize_t r = read(c->out, out + got, len - 1 - got);
        if (r <= 0 || (got += (size_t)r) == len - 1)
            break;
    }
    out[got] = '\0';
    close(c->out);
    return harness_wait(c->pid, 10000);
}

static void self_path(char *exe, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", exe, len - 1);
    assert_true(n > 0);
    exe[n] = '\0';
}

/* A number field following `key` (e.g. "\"name\":\"max-regs-per-tenant\",\"default\":16384,\"used\":")
 * in JSON text, -1 when absent. */
static long long json_after(const char *json, const char *key)
{
    const char *p = strstr(json, key);
    return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

/* The "used" of limit `name` in the defaults of collctl --json policy. */
static long long default_used(const char *json, const char *name)
{
    char key[128];
    snprintf(key, sizeof(key), "{\"name\":\"%s\",\"default\":", name);
    const char *p = strstr(json, key);
    return p ? json_after(p, ",\"used\":") : -1;
}

static void test_policy_own_use(void **state)
{
    (void)state;
    harness_t *h = &live_h;
    start(h);
    char exe[512], out[16384], line[64] = "";
    self_path(exe, sizeof(exe));
    child_t by;
    const char *bargv[] = { exe, "--bystander", h->socket, NULL };
    spawn_as(&by, BYSTANDER, bargv);
    struct pollfd p = { .fd = by.out, .events = POLLIN };
    assert_true(poll(&p, 1, 20000) == 1 && read(by.out, line, sizeof(line) - 1) > 0);
    assert_non_null(strstr(line, "ready"));

    child_t look;
    const char *largv[] = { COLLCTL_BIN, "--socket", h->socket, "--json", "policy", NULL };
    spawn_as(&look, LOOKER, largv);
    assert_int_equal(child_finish(&look, out, sizeof(out), 20000), 0);
    print_message("uid %d: %s", LOOKER, out);
    long long sessions = default_used(out, "max-sessions-per-tenant"), regs = default_used(out, "max-regs-per-tenant");
    long long comms = default_used(out, "max-comms-per-tenant"), held = json_after(out, "\"registrations\":");
    char other[32];
    snprintf(other, sizeof(other), "\"uid\":%d", BYSTANDER);
    print_message("uid %d sees: sessions %lld, communicators %lld, registrations %lld (limit) / %lld (daemon)\n",
                  LOOKER, sessions, comms, regs, held);
    assert_int_equal(sessions, 1); /* collctl's own session */
    assert_int_equal(comms, 0);
    assert_int_equal(regs, 0);
    assert_int_equal(held, 0);
    assert_null(strstr(out, other));
    assert_non_null(strstr(out, "\"own_only\":true"));
    assert_int_equal(json_after(out, "\"name\":\"max-regs-per-tenant\",\"default\":"), 16384); /* the limits */

    /* root (an administrator) sees every tenant and the totals */
    const char *rargv[] = { COLLCTL_BIN, "--socket", h->socket, "--json", "policy", NULL };
    assert_int_equal(harness_capture(rargv, out, sizeof(out), 20000), 0);
    regs = default_used(out, "max-regs-per-tenant");
    held = json_after(out, "\"registrations\":");
    print_message("root sees: registrations %lld (limit) / %lld (daemon), the bystander %s\n", regs, held,
                  strstr(out, other) ? "listed" : "not listed");
    assert_true(regs >= REGS && held >= REGS);
    assert_non_null(strstr(out, other));
    assert_non_null(strstr(out, "\"own_only\":false"));
    assert_int_equal(child_finish(&by, line, sizeof(line), 20000), 0);
    assert_int_equal(harness_cleanup(h), 0);
}

static void test_detail_after_local_refusal(void **state)
{
    (void)state;
    harness_t *h = &live_h;
    start(h);
    char exe[512], dir[64], out[2][8192];
    self_path(exe, sizeof(exe));
    snprintf(dir, sizeof(dir), "/tmp/colld-adv-tenant-XXXXXX");
    assert_non_null(mkdtemp(dir));
    assert_int_equal(chmod(dir, 0777), 0);
    child_t r[2];
    for (int i = 0; i < 2; i++) {
        const char *argv[] = { exe, "--stale", h->socket, dir, i ? "1" : "0", NULL };
        spawn_as(&r[i], LOOKER, argv);
    }
    int rc[2];
    for (int i = 0; i < 2; i++)
        rc[i] = child_finish(&r[i], out[i], sizeof(out[i]), 60000);
    print_message("rank 0 (exit %d):\n%srank 1 (exit %d): %s\n", rc[0], out[0], rc[1], out[1]);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    const char *refused = strstr(out[0], "detail refused: "), *mismatch = strstr(out[0], "detail mismatch: ");
    const char *in_group = strstr(out[0], "detail in-group: "), *fast = strstr(out[0], "detail fail-fast: ");
    assert_non_null(refused);
    assert_non_null(mismatch);
    assert_non_null(in_group);
    assert_non_null(fast);
    assert_true(says(refused, "COLLD_ERR_INVALID_ARGUMENT: colld_send: peer 5 is out of range"));
    /* each detail is its own line: compare within it */
    char m[2048], g[2048], f[2048];
    sscanf(mismatch, "detail mismatch: %2047[^\n]", m);
    sscanf(in_group, "detail in-group: %2047[^\n]", g);
    sscanf(fast, "detail fail-fast: %2047[^\n]", f);
    assert_true(says(m, "COLLD_ERR_MISMATCH") && says(m, "broadcast") && !says(m, "out of range"));
    assert_true(says(g, "COLLD_ERR_INVALID_USAGE") && says(g, "inside a group"));
    assert_true(says(f, "COLLD_ERR_MISMATCH") && says(f, "broadcast"));
    assert_int_equal(rc[0], 0);
    assert_int_equal(rc[1], 0);
    assert_int_equal(harness_cleanup(h), 0);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && strcmp(argv[1], "--bystander") == 0)
        return bystander_main(argv[2]);
    if (argc == 5 && strcmp(argv[1], "--stale") == 0)
        return stale_main(argv[2], argv[3], atoi(argv[4]));
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    if (geteuid() != 0) {
        fprintf(stderr, "test_adv_tenant: skipped: needs root, to run tenants under uids %d and %d\n", LOOKER,
                BYSTANDER);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_policy_own_use, teardown),
        cmocka_unit_test_teardown(test_detail_after_local_refusal, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
