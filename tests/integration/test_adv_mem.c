/*
 * test_adv_mem.c - memory is charged to its owner (issue 26 row 3). The kernel charges a
 * shared-memory page to the memory cgroup of the task that makes it (that faults it in or
 * fallocates it). colld_mem_alloc used to hand the daemon a memfd whose pages did not exist yet,
 * so an all-reduce over memory the tenant never touched made the daemon fault every page in: the
 * tenant's memory was charged to the daemon (RssShmem 4 kB -> 327 MB, the tenant's 28 kB), and in
 * a 384 MiB memory cgroup with 2 x 512 MiB buffers the kernel OOM-killed colld and every tenant got
 * COLLD_ERR_DAEMON_LOST. Now libcolld writes every page when it makes the buffer, the daemon refuses
 * a buffer with a page missing instead of making it, seals it so that no hole can be punched later,
 * and counts what it allocates itself for a tenant against max-daemon-bytes-per-tenant.
 *
 * test_untouched_buffers_small_cgroup: the daemon runs in a memory cgroup of DAEMON_CG_BYTES (v2
 * where a child cgroup with the memory controller can be made, else v1; skipped, exit 77, when
 * neither can, or when not root); a tenant (uid 65534) all-reduces 2 ranks x 2 buffers of
 * BUF_BYTES it never touched (3x the cgroup). Before: the daemon was OOM-killed. After: the tenant
 * gets the exact result, the daemon lives, its cgroup grew by the page tables only and saw no OOM.
 * Under TSan the buffers are smaller and the bounds carry TSan's shadow (see BUF_BYTES).
 * test_unallocated_memory_refused: a tenant (uid 65534) that does not use colld_mem_alloc sends the
 * daemon memfds through the raw wire format: one never touched, one with its last page missing,
 * one fallocate()d but never written, one sealed with F_SEAL_SEAL, and a good one it then tries to
 * punch holes in and registers again. Before: all were accepted and the holes punched. After: each
 * is refused with COLLD_ERR_INVALID_ARGUMENT and a detail that says why, and hole punching fails
 * with EPERM while the tenant's own mapping stays writable.
 * test_daemon_memory_charged: with --max-daemon-bytes-per-tenant 512K, the rings of a tenant's
 * session and the page tables of its registrations are charged to it (collctl policy shows the exact
 * use), a registration that would pass the limit is refused naming it, and everything is given back
 * when the session ends.
 *
 * The tenant is this program re-executed as uid/gid 65534 ("nobody") from an fd opened as root.
 */
#include "client/client_internal.h"
#include "common/util.h"
#include "tests/integration/harness.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define NOBODY HARNESS_NOBODY
#if defined(__SANITIZE_THREAD__)
/* ThreadSanitizer keeps 4 bytes of shadow for every byte the daemon touches, in the daemon's own
 * anonymous memory, so its cgroup grows by 4x the 4 buffers whoever allocated their pages. Here the
 * buffers are 16 MiB, the cgroup and the growth bound carry that shadow, and the bound still fails
 * if the tenant's 64 MiB were charged to the daemon (256 + 64 > 256 + 32). */
#define BUF_BYTES (16u << 20)
#define SANITIZER_SHADOW_BYTES (4u * 4u * BUF_BYTES)
#else
#define BUF_BYTES (96u << 20) /* each of a rank's two buffers */
#define SANITIZER_SHADOW_BYTES 0u
#endif
/* The daemon's memory cgroup: a third of the tenant's 384 MiB (and the shadow under TSan). */
#define DAEMON_CG_BYTES ((128u << 20) + SANITIZER_SHADOW_BYTES)
/* What the daemon's cgroup may grow by meanwhile (page tables: 768 KiB; the shadow under TSan). */
#define DAEMON_CG_GROWTH ((32u << 20) + SANITIZER_SHADOW_BYTES)
#define HOSTILE_BYTES (16u << 20)
#define QUOTA_BYTES (512u << 10) /* --max-daemon-bytes-per-tenant of test_daemon_memory_charged */

/* A number after `key` in /proc/PID/status ("RssShmem:" in kB), -1 when absent. */
static long proc_status(pid_t pid, const char *key)
{
    char path[64], line[256];
    long v = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, key, strlen(key)) == 0)
            v = atol(line + strlen(key));
    if (f)
        fclose(f);
    return v;
}

/* ============================================================================================
 * A memory cgroup for the daemon (v2, else v1)
 * ========================================================================================== */

typedef struct {
    bool v2;
    char dir[700];    /* the cgroup made for the daemon */
    char parent[600]; /* the test's own, where the daemon goes back */
} cg_t;

static int write_text(const char *dir, const char *file, const char *text)
{
    char path[800];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    int e = errno;
    close(fd);
    errno = e;
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

static long long read_num(const char *dir, const char *file)
{
    char path[800], buf[64];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    harness_read_file(path, buf, sizeof(buf));
    return buf[0] ? atoll(buf) : -1;
}

/* The count after `key` in a "key value" file (memory.events, memory.oom_control). */
static long long read_key(const char *dir, const char *file, const char *key)
{
    char path[800], buf[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    harness_read_file(path, buf, sizeof(buf));
    for (char *p = buf; (p = strstr(p, key)) != NULL; p += strlen(key))
        if ((p == buf || p[-1] == '\n') && p[strlen(key)] == ' ')
            return atoll(p + strlen(key) + 1);
    return -1;
}

/* Make a child of the test's own memory cgroup with a limit of `bytes` (no swap). Returns 0, or -1
 * with why (the test is then skipped). */
static int cg_make(cg_t *cg, uint64_t bytes, char *why, size_t len)
{
    char line[512], v2path[512] = "", v1path[512] = "", num[32];
    bool have_v2 = false, have_v1 = false;
    FILE *f = fopen("/proc/self/cgroup", "r");
    while (f && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!b)
            continue;
        if (b == a + 1) {
            snprintf(v2path, sizeof(v2path), "%s", strcmp(b + 1, "/") == 0 ? "" : b + 1);
            have_v2 = true;
        } else {
            *b = '\0';
            if (strstr(a + 1, "memory")) {
                snprintf(v1path, sizeof(v1path), "%s", strcmp(b + 1, "/") == 0 ? "" : b + 1);
                have_v1 = true;
            }
        }
    }
    if (f)
        fclose(f);
    snprintf(num, sizeof(num), "%llu", (unsigned long long)bytes);
    *cg = (cg_t){ .v2 = true };
    if (have_v2 && access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0) {
        snprintf(cg->parent, sizeof(cg->parent), "/sys/fs/cgroup%s", v2path);
        snprintf(cg->dir, sizeof(cg->dir), "%s/colld-test-mem-%d", cg->parent, (int)getpid());
        if (mkdir(cg->dir, 0755) == 0) {
            if (write_text(cg->dir, "memory.max", num) == 0) {
                (void)write_text(cg->dir, "memory.swap.max", "0");
                return 0;
            }
            rmdir(cg->dir); /* no memory controller below the test's cgroup */
        }
    }
    cg->v2 = false;
    if (have_v1) {
        snprintf(cg->parent, sizeof(cg->parent), "/sys/fs/cgroup/memory%s", v1path);
        snprintf(cg->dir, sizeof(cg->dir), "%s/colld-test-mem-%d", cg->parent, (int)getpid());
        if (mkdir(cg->dir, 0755) == 0) {
            if (write_text(cg->dir, "memory.limit_in_bytes", num) == 0) {
                (void)write_text(cg->dir, "memory.memsw.limit_in_bytes", num);
                return 0;
            }
            rmdir(cg->dir);
        }
    }
    snprintf(why, len, "no memory cgroup can be made here (cgroup v2 %s, v1 memory %s): %s",
             have_v2 ? "mounted, no memory controller for a child" : "absent", have_v1 ? "not writable" : "absent",
             strerror(errno));
    cg->dir[0] = '\0';
    return -1;
}

static int cg_add(const cg_t *cg, const char *dir, pid_t pid)
{
    (void)cg;
    char text[32];
    snprintf(text, sizeof(text), "%d", (int)pid);
    return write_text(dir, "cgroup.procs", text);
}

/* Memory charged to the cgroup now, and its peak (-1 where the kernel has none). */
static long long cg_usage(const cg_t *cg)
{
    return read_num(cg->dir, cg->v2 ? "memory.current" : "memory.usage_in_bytes");
}

static long long cg_peak(const cg_t *cg)
{
    return read_num(cg->dir, cg->v2 ? "memory.peak" : "memory.max_usage_in_bytes");
}

static long long cg_oom_kills(const cg_t *cg)
{
    return cg->v2 ? read_key(cg->dir, "memory.events", "oom_kill")
                  : read_key(cg->dir, "memory.oom_control", "oom_kill");
}

/* Take the daemon (if alive) back to the test's cgroup and remove the one made for it. */
static void cg_remove(cg_t *cg, pid_t daemon)
{
    if (!cg->dir[0])
        return;
    if (daemon > 0)
        (void)cg_add(cg, cg->parent, daemon);
    for (int i = 0; i < 50 && rmdir(cg->dir) < 0 && errno == EBUSY; i++)
        usleep(20000);
    cg->dir[0] = '\0';
}

/* ============================================================================================
 * The tenant (uid 65534)
 * ========================================================================================== */

/* Two ranks, each with a send and a receive buffer of BUF_BYTES from colld_mem_alloc that it never
 * touches but for one element; one all-reduce. Writes "alloc_ms A" (the mean time of a
 * colld_mem_alloc) to dir/untouched and holds the buffers from dir/reduced until dir/release; exit
 * 0 when the result is exact. */
static int untouched_main(const char *socket, const char *dir)
{
    harness_rank_t t[2];
    float *send[2] = { NULL, NULL }, *recv[2] = { NULL, NULL };
    size_t count = BUF_BYTES / sizeof(float);
    int rc = 1;
    if (harness_join_ranks("untouched", socket, t, 2, 60000, "untouched", NULL) != 0)
        goto out;
    double alloc_ms = 0;
    for (int r = 0; r < 2; r++) {
        double t0 = harness_now_ms();
        colld_status_t st = colld_mem_alloc(t[r].client, (void **)&send[r], BUF_BYTES, COLLD_MEM_HOST);
        if (st == COLLD_OK)
            st = colld_mem_alloc(t[r].client, (void **)&recv[r], BUF_BYTES, COLLD_MEM_HOST);
        alloc_ms += harness_now_ms() - t0;
        if (st != COLLD_OK) {
            fprintf(stderr, "untouched: colld_mem_alloc: %s: %s\n", colld_status_name(st),
                    colld_last_error(t[r].client));
            goto out;
        }
        send[r][0] = (float)(r + 1);
    }
    colld_status_t st = COLLD_OK;
    for (int r = 0; r < 2 && st == COLLD_OK; r++)
        st = colld_allreduce(send[r], recv[r], count, COLLD_FLOAT32, COLLD_SUM, t[r].comm, NULL);
    for (int r = 0; r < 2 && st == COLLD_OK; r++)
        st = colld_comm_synchronize(t[r].comm);
    if (st != COLLD_OK) {
        fprintf(stderr, "untouched: all-reduce: %s: %s\n", colld_status_name(st), colld_comm_last_error(t[0].comm));
        goto out;
    }
    rc = 0;
    for (int r = 0; r < 2; r++)
        if (recv[r][0] != 3.0f || recv[r][1] != 0.0f || recv[r][count / 2] != 0.0f || recv[r][count - 1] != 0.0f) {
            fprintf(stderr, "untouched: rank %d: %g %g %g %g\n", r, (double)recv[r][0], (double)recv[r][1],
                    (double)recv[r][count / 2], (double)recv[r][count - 1]);
            rc = 1;
        }
    char path[512];
    snprintf(path, sizeof(path), "%s/untouched", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "alloc_ms %.1f", alloc_ms / 4);
        fclose(f);
    }
    /* Held while the driver looks at the daemon. */
    harness_touch(dir, "reduced");
    if (!harness_wait_for(dir, "release", 30000))
        rc = 1;
out:
    if (rc)
        harness_touch(dir, "reduced"); /* the driver need not wait */
    for (int r = 0; r < 2; r++) {
        if (send[r])
            colld_mem_free(t[r].client, send[r]);
        if (recv[r])
            colld_mem_free(t[r].client, recv[r]);
    }
    harness_leave_ranks(t, 2);
    return rc;
}

/* A memfd of `bytes` sealed against shrinking (as the daemon requires), its first `written` bytes
 * written (pwrite: those pages exist and hold data). */
static int memfd_of(size_t bytes, size_t written)
{
    static char zero[1 << 16];
    int fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
        return -1;
    for (size_t off = 0; off < written; off += sizeof(zero)) {
        size_t n = written - off < sizeof(zero) ? written - off : sizeof(zero);
        if (pwrite(fd, zero, n, (off_t)off) != (ssize_t)n)
            return -1;
    }
    return fd;
}

/* One raw REG message of `bytes` of the memfd; the status of the reply, its detail in detail. */
static colld_status_t raw_reg(colld_client_t *c, int fd, uint64_t bytes, char *detail, size_t len)
{
    colld_wire_msg_t m, r;
    memset(&m, 0, sizeof(m));
    memset(&r, 0, sizeof(r));
    m.type = COLLD_MSG_REG;
    m.u.reg.bytes = bytes;
    m.u.reg.cookie = 42;
    colld_status_t st = colld__sock_request(c, &m, fd, COLLD_MSG_REG_REPLY, &r, NULL, 0);
    detail[0] = '\0';
    if (st != COLLD_OK)
        return st;
    colld_str_sanitize(detail, len, r.u.detail, sizeof(r.u.detail));
    return (colld_status_t)r.status;
}

static int failures;

/* Check one expectation of the hostile tenant (printed either way). */
static void expect(bool ok, const char *what, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void expect(bool ok, const char *what, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "hostile: %s: %s: %s\n", ok ? "ok" : "FAILED", what, buf);
    failures += !ok;
}

/* Register `fd` and expect a refusal with INVALID_ARGUMENT whose detail holds `want`. */
static void expect_refused(colld_client_t *c, int fd, uint64_t bytes, const char *what, const char *want)
{
    char detail[256];
    colld_status_t st = raw_reg(c, fd, bytes, detail, sizeof(detail));
    expect(st == COLLD_ERR_INVALID_ARGUMENT && strstr(detail, want), what, "%s: %s", colld_status_name(st), detail);
}

/* Memory the tenant did not allocate (or allocated but never wrote), and holes punched in memory
 * it registered. Exit 0 when everything is refused as it should be. */
static int hostile_main(const char *socket)
{
    colld_client_t *c;
    char detail[256];
    if (colld_connect(socket, &c) != COLLD_OK) {
        fprintf(stderr, "hostile: connect: %s\n", colld_last_error(c));
        return 1;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int fd = memfd_of(HOSTILE_BYTES, 0);
    expect_refused(c, fd, HOSTILE_BYTES, "never touched", "memory not allocated: no page at offset 0 ");
    close(fd);
    fd = memfd_of(HOSTILE_BYTES, HOSTILE_BYTES - page);
    char want[128];
    snprintf(want, sizeof(want), "memory not allocated: no page at offset %zu of %u bytes", HOSTILE_BYTES - page,
             HOSTILE_BYTES);
    expect_refused(c, fd, HOSTILE_BYTES, "last page missing", want);
    close(fd);
    fd = memfd_of(HOSTILE_BYTES, 0);
    int rc = fallocate(fd, 0, 0, HOSTILE_BYTES);
    expect(rc == 0, "fallocate", "%s", rc ? strerror(errno) : "done");
    expect_refused(c, fd, HOSTILE_BYTES, "fallocated, never written", "memory not allocated: no page at offset 0 ");
    close(fd);
    fd = memfd_of(HOSTILE_BYTES, HOSTILE_BYTES);
    rc = fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL);
    expect(rc == 0, "F_SEAL_SEAL", "%s", rc ? strerror(errno) : "done");
    expect_refused(c, fd, HOSTILE_BYTES, "sealed against the daemon's seals", "must take the daemon's seals");
    close(fd);

    /* A good one, then holes punched in it: refused by the daemon's seal, the mapping still
     * writable; registered again: refused. */
    fd = memfd_of(HOSTILE_BYTES, 0);
    char *p = mmap(NULL, HOSTILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    expect(p != MAP_FAILED, "map", "%s", p == MAP_FAILED ? strerror(errno) : "done");
    if (p == MAP_FAILED)
        return 1;
    memset(p, 1, HOSTILE_BYTES);
    colld_status_t st = raw_reg(c, fd, HOSTILE_BYTES, detail, sizeof(detail));
    expect(st == COLLD_OK, "allocated in full", "%s%s%s", colld_status_name(st), st ? ": " : "", st ? detail : "");
    rc = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, HOSTILE_BYTES);
    expect(rc < 0 && errno == EPERM, "fallocate(PUNCH_HOLE) after registration", "%s",
           rc ? strerror(errno) : "punched");
    rc = madvise(p + page, page, MADV_REMOVE);
    expect(rc < 0 && errno == EPERM, "madvise(MADV_REMOVE) after registration", "%s", rc ? strerror(errno) : "removed");
    p[HOSTILE_BYTES - 1] = 2;
    expect(p[0] == 1 && p[HOSTILE_BYTES - 1] == 2, "the tenant's mapping", "still writable");
    void *q = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    expect(q == MAP_FAILED, "a new writable mapping", "%s", q == MAP_FAILED ? strerror(errno) : "made");
    expect_refused(c, fd, HOSTILE_BYTES, "registered again", "a memfd can be registered once");
    close(fd);
    munmap(p, HOSTILE_BYTES);
    colld_disconnect(c);
    return failures ? 1 : 0;
}

/* A session that registers 64 KiB (charged: its rings, and a page of page tables plus one),
 * waits for dir/go, then asks for 256 MiB (page tables 512 KiB + a page: over QUOTA_BYTES). Writes
 * the refusal's detail to dir/quota. */
static int quota_main(const char *socket, const char *dir)
{
    colld_client_t *c;
    void *small = NULL, *big = NULL;
    if (colld_connect(socket, &c) != COLLD_OK) {
        fprintf(stderr, "quota: connect: %s\n", colld_last_error(c));
        return 1;
    }
    colld_status_t st = colld_mem_alloc(c, &small, 64 << 10, COLLD_MEM_HOST);
    harness_touch(dir, "held");
    if (st != COLLD_OK || !harness_wait_for(dir, "go", 30000)) {
        fprintf(stderr, "quota: %s: %s\n", colld_status_name(st), colld_last_error(c));
        return 1;
    }
    st = colld_mem_alloc(c, &big, 256u << 20, COLLD_MEM_HOST);
    char path[512];
    snprintf(path, sizeof(path), "%s/quota", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%s %s\n", colld_status_name(st), colld_last_error(c));
        fclose(f);
    }
    if (big)
        colld_mem_free(c, big);
    colld_mem_free(c, small);
    colld_disconnect(c);
    return 0;
}

/* ============================================================================================
 * The driver
 * ========================================================================================== */

static int setup(void **state)
{
    static const char *const extra[] = { "--socket-mode", "0666", NULL };
    return harness_test_setup_shared(state, extra);
}

static cg_t cgroup;

static int teardown(void **state)
{
    harness_t *h = *state;
    cg_remove(&cgroup, h ? h->pid : 0);
    return harness_test_teardown(state);
}

/* Whether the daemon is still running (not reaped, not a zombie). */
static bool daemon_alive(harness_t *h)
{
    int status;
    return h->pid > 0 && waitpid(h->pid, &status, WNOHANG) == 0 && proc_status(h->pid, "VmRSS:") >= 0;
}

/* The case at a third of its size: the daemon in a cgroup a third of the tenant's untouched
 * buffers; before the fix the kernel OOM-killed it. */
static void test_untouched_buffers_small_cgroup(void **state)
{
    harness_t *h = *state;
    char why[256];
    if (cg_make(&cgroup, DAEMON_CG_BYTES, why, sizeof(why)) < 0) {
        print_message("skipped: %s\n", why);
        skip();
    }
    assert_int_equal(cg_add(&cgroup, cgroup.dir, h->pid), 0);
    long long before = cg_usage(&cgroup);
    long shmem_before = proc_status(h->pid, "RssShmem:");
    double t0 = harness_now_ms();
    pid_t tenant = harness_spawn_self(h, "test_adv_mem", "--untouched", true);
    assert_true(tenant > 0);
    bool reduced = harness_wait_for(h->dir, "reduced", 60000);
    double ms = harness_now_ms() - t0;
    long long held = cg_usage(&cgroup);
    long shmem_held = proc_status(h->pid, "RssShmem:");
    harness_touch(h->dir, "release");
    int rc = harness_wait(tenant, 60000);
    long long after = cg_usage(&cgroup), peak = cg_peak(&cgroup), kills = cg_oom_kills(&cgroup);
    long shmem_after = proc_status(h->pid, "RssShmem:");
    bool alive = daemon_alive(h);
    char text[128] = "", path[512];
    snprintf(path, sizeof(path), "%s/untouched", h->dir);
    harness_read_file(path, text, sizeof(text));
    print_message("cgroup %s %s, limit %u MiB; tenant (uid %d): 2 ranks x 2 x %u MiB untouched, %s, %s in %.0f "
                  "ms (%s), exit %d\n",
                  cgroup.v2 ? "v2" : "v1", cgroup.dir, DAEMON_CG_BYTES >> 20, NOBODY, BUF_BYTES >> 20,
                  alive ? "daemon alive" : "DAEMON GONE", reduced ? "reduced" : "NOT REDUCED", ms,
                  text[0] ? text : "no result", rc);
    print_message("daemon: cgroup usage %lld, with the buffers held %lld, after %lld bytes (peak %lld), OOM kills "
                  "%lld; RssShmem %ld, held %ld, after %ld kB\n",
                  before, held, after, peak, kills, shmem_before, shmem_held, shmem_after);
    assert_true(alive);
    assert_true(reduced);
    assert_int_equal(rc, 0);
    assert_true(kills <= 0);
    assert_true(peak < 0 || peak < before + (long long)DAEMON_CG_GROWTH);
    assert_true(held < before + (long long)DAEMON_CG_GROWTH);
    assert_true(after < before + (long long)DAEMON_CG_GROWTH);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* A tenant hands the daemon memory that it has not allocated, or punches holes in memory it
 * registered: refused, with the reason. */
static void test_unallocated_memory_refused(void **state)
{
    harness_t *h = *state;
    long shmem_before = proc_status(h->pid, "RssShmem:");
    pid_t tenant = harness_spawn_self(h, "test_adv_mem", "--hostile", true);
    assert_true(tenant > 0);
    int rc = harness_wait(tenant, 60000);
    print_message("hostile tenant (uid %d) exit %d; daemon RssShmem %ld -> %ld kB\n", NOBODY, rc, shmem_before,
                  proc_status(h->pid, "RssShmem:"));
    assert_int_equal(rc, 0);
    assert_true(daemon_alive(h));
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

static int setup_quota(void **state)
{
    static const char *const extra[] = { "--socket-mode", "0666", "--max-daemon-bytes-per-tenant", "512K", NULL };
    return harness_test_setup_shared(state, extra);
}

/* What collctl --json policy says uid 65534 uses of max-daemon-bytes-per-tenant; -1 if absent. */
static long long daemon_bytes_used(harness_t *h)
{
    char out[32768];
    const char *argv[] = { COLLCTL_BIN, "--socket", h->socket, "--json", "policy", NULL };
    if (harness_capture(argv, out, sizeof(out), 20000) != 0)
        return -1;
    const char *t = strstr(out, "{\"uid\":65534,");
    const char *key = "{\"name\":\"max-daemon-bytes-per-tenant\",\"limit\":524288,\"used\":";
    const char *l = t ? strstr(t, key) : NULL;
    return l ? atoll(l + strlen(key)) : 0;
}

/* The daemon's rings and page tables are charged to the tenant they are made for. */
static void test_daemon_memory_charged(void **state)
{
    harness_t *h = *state;
    pid_t tenant = harness_spawn_self(h, "test_adv_mem", "--quota", true);
    assert_true(tenant > 0);
    assert_true(harness_wait_for(h->dir, "held", 30000));
    uint64_t rings = ((sizeof(colld_wire_shm_t) + 4095) / 4096 * 4096 +
                      256 * (sizeof(colld_wire_sqe_t) + sizeof(colld_wire_cqe_t)) + 4095) /
                     4096 * 4096;
    long long used = daemon_bytes_used(h);
    print_message("uid %d holds one session (rings %llu bytes) and 64 KiB registered: max-daemon-bytes-per-tenant "
                  "used %lld\n",
                  NOBODY, (unsigned long long)rings, used);
    assert_int_equal(used, (long long)(rings + 8192)); /* page tables of 64 KiB: a page, and one more */
    harness_touch(h->dir, "go");
    assert_int_equal(harness_wait(tenant, 30000), 0);
    char text[512] = "", path[512];
    snprintf(path, sizeof(path), "%s/quota", h->dir);
    harness_read_file(path, text, sizeof(text));
    print_message("256 MiB more: %s", text);
    assert_non_null(strstr(text, "COLLD_ERR_QUOTA_EXCEEDED"));
    assert_non_null(strstr(text, "uid 65534 is at its limit max-daemon-bytes-per-tenant = 524288"));
    for (int i = 0; i < 100 && (used = daemon_bytes_used(h)) != 0; i++)
        usleep(50000);
    assert_int_equal(used, 0);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--untouched") == 0)
        return untouched_main(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "--hostile") == 0)
        return hostile_main(argv[2]);
    if (argc == 4 && strcmp(argv[1], "--quota") == 0)
        return quota_main(argv[2], argv[3]);
    if (geteuid() != 0) {
        printf("skipped: the tenant runs as uid 65534 and the daemon in a memory cgroup: needs root\n");
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_untouched_buffers_small_cgroup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unallocated_memory_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_daemon_memory_charged, setup_quota, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
