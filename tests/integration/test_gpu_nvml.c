/*
 * test_gpu_nvml.c - GPU health from NVML (issue 30 item 2) through a real daemon on two test
 * doubles: the CUDA driver test double (tests/cudafake) and the NVML test double (tests/nvmlfake),
 * whose devices are the same two fake GPUs. Rank r runs on fake GPU r.
 *
 *   health_drain  values set through the NVML double's control file reach `collctl status`, the
 *                 metrics, the events and `collctl doctor` (exit 1, the GPU, the communicator and
 *                 the rank named); 2 uncorrected ECC errors on GPU 0 drain it: a new collective on
 *                 its buffers and a new communicator of a session holding memory on it are refused
 *                 with COLLD_ERR_DEVICE and the exact message; the drain alone tears nothing down
 *   no_nvml       a daemon that finds no NVML (or whose nvmlInit fails): no health, said once,
 *                 no error, the collectives run, doctor finds nothing
 *   across_nodes  two daemons (node-a, node-b, --listen on this host), each with its own NVML
 *                 double control file, and a communicator over both (rank 0 on node-a, rank 1 on
 *                 node-b, whose session holds memory on GPU 0): 2 uncorrected ECC errors on
 *                 node-b's GPU 0 drain it there, and `collctl doctor` run on node-a names node-b's
 *                 GPU, the communicator and rank 1 by node-b's ids and node-a's (issue 30 items 2
 *                 and 5); `--local` leaves node-b out
 *
 * Only ever the doubles: the libnvidia-ml.so.1 this process finds must export colld_nvmlfake_control
 * (checked before the daemon starts), and the daemon must map no other libnvidia-ml.
 */
#include "tests/integration/harness_gpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char nvml_double[PATH_MAX]; /* the NVML double's real path */
static char nvml_control[64];      /* its control file for the daemon */
static char nvml_dir[PATH_MAX];    /* its directory (taken out of LD_LIBRARY_PATH for no_nvml) */

#define DRAIN_MSG                                                                                                      \
    "GPU 0 (CUDA driver test double device 0) is drained after 2 uncorrected ECC errors (NVML): colld takes no new "  \
    "work on it; restart the daemon once the GPU is fixed"

/* Is the libnvidia-ml.so.1 found here the NVML test double? 1 yes, 0 none, -1 another (refused). */
static int nvml_is_double(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 0;
    void *ctl = dlsym(lib, "colld_nvmlfake_control");
    Dl_info info = { 0 };
    char real[PATH_MAX];
    if (ctl && dladdr(ctl, &info) && info.dli_fname) {
        snprintf(nvml_double, sizeof(nvml_double), "%s", realpath(info.dli_fname, real) ? real : info.dli_fname);
        snprintf(nvml_dir, sizeof(nvml_dir), "%s", nvml_double);
        char *slash = strrchr(nvml_dir, '/');
        if (slash)
            *slash = '\0';
    } else {
        printf("libnvidia-ml.so.1 here is not the NVML test double: refusing to run on it\n");
    }
    dlclose(lib);
    return ctl ? 1 : -1;
}

/* Does the daemon map no libnvidia-ml but the double (and, with must_map, the double)? */
static bool daemon_on_nvml_double(pid_t pid, bool must_map)
{
    char path[64], line[4608];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool on = false, other = false;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        const char *file = strchr(line, '/');
        if (!file || !strstr(file, "libnvidia-ml"))
            continue;
        if (strcmp(file, nvml_double) == 0)
            on = true;
        else if (!other) {
            other = true;
            fprintf(stderr, "the daemon maps %s, not only the NVML test double %s\n", file, nvml_double);
        }
    }
    fclose(f);
    return (on || !must_map) && !other;
}

static bool nvml_append(const char *line)
{
    FILE *f = fopen(nvml_control, "a");
    if (!f)
        return false;
    bool ok = fprintf(f, "%s\n", line) > 0;
    return fclose(f) == 0 && ok;
}

/* A daemon on both doubles, health read every 50 ms, metrics on; lines[] in the NVML control file. */
static int setup_health(void **state, const char *const *lines, bool no_nvml)
{
    snprintf(nvml_control, sizeof(nvml_control), "/tmp/colld-nvmlfake-XXXXXX");
    int fd = mkstemp(nvml_control);
    if (fd < 0)
        return -1;
    close(fd);
    for (size_t i = 0; lines && lines[i]; i++)
        if (!nvml_append(lines[i]))
            return -1;
    char saved[8192] = "";
    const char *llp = getenv("LD_LIBRARY_PATH");
    snprintf(saved, sizeof(saved), "%s", llp ? llp : "");
    if (no_nvml) { /* the daemon's search path without the NVML double's directory */
        char path[8192] = "", *save = NULL, copy[8192];
        snprintf(copy, sizeof(copy), "%s", saved);
        for (char *p = strtok_r(copy, ":", &save); p; p = strtok_r(NULL, ":", &save))
            if (strcmp(p, nvml_dir) != 0)
                snprintf(path + strlen(path), sizeof(path) - strlen(path), "%s%s", *path ? ":" : "", p);
        setenv("LD_LIBRARY_PATH", path, 1);
    }
    setenv("COLLD_NVMLFAKE_CONTROL", nvml_control, 1);
    const char *extra[] = { "--gpu-health-ms", "50", "--metrics", "127.0.0.1:0", NULL };
    int rc = harness_test_setup_args(state, extra);
    unsetenv("COLLD_NVMLFAKE_CONTROL");
    setenv("LD_LIBRARY_PATH", saved, 1);
    if (rc != 0)
        return -1;
    pid_t pid = ((harness_t *)*state)->pid;
    return daemon_on_double(pid, true) && daemon_on_nvml_double(pid, !no_nvml) ? 0 : -1;
}

static int setup_drain(void **state)
{
    const char *const lines[] = { "gpu=0 throttle=0x40 nvlinks=2", "gpu=1 unsupported=pcie_replay", NULL };
    return setup_health(state, lines, false);
}

static int teardown_health(void **state)
{
    int rc = harness_test_teardown(state);
    unlink(nvml_control);
    return rc;
}

/* collctl ARGS... into out: its exit status. */
static int collctl(harness_t *h, char *out, size_t len, const char *a1, const char *a2)
{
    const char *argv[] = { COLLCTL_BIN, "--socket", h->socket, a1, a2, NULL };
    return harness_capture(argv, out, len, 10000);
}

/* ============================================================================================
 * health_drain
 * ========================================================================================== */

static void sc_drain(rank_t *r)
{
    static float host[2][N_AR];
    static char out[2][32768];
    float *hb = host[r->rank];
    char *o = out[r->rank];
    void *sp = NULL, *rp = NULL;
    colld_status_t st;
    if ((st = colld_mem_alloc(r->c, &sp, N_AR * sizeof(float), COLLD_MEM_CUDA)) != COLLD_OK ||
        (st = colld_mem_alloc(r->c, &rp, N_AR * sizeof(float), COLLD_MEM_CUDA)) != COLLD_OK) {
        rank_fail(r, "colld_mem_alloc(COLLD_MEM_CUDA): %s: %s", colld_status_name(st), colld_last_error(r->c));
        pthread_barrier_wait(r->barrier);
        pthread_barrier_wait(r->barrier);
        goto out;
    }
    CUdeviceptr send = (CUdeviceptr)(uintptr_t)sp, recv = (CUdeviceptr)(uintptr_t)rp;
    /* A healthy GPU: the collective runs. */
    if (fill(r, send, recv, N_AR, N_AR, hb) &&
        finished(r, "all-reduce", colld_allreduce(sp, rp, N_AR, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s)))
        (void)expect_values(r, "all-reduce", recv, N_AR, hb, want_sum); /* r->v[0]++ when exact */
    pthread_barrier_wait(r->barrier);
    harness_t *h = r->h;
    if (r->rank == 0) {
        /* Shown before anything fatal: the throttling warning, a counter not supported. */
        int rc = collctl(h, o, 32768, "status", NULL);
        if (rc != 0 || !strstr(o, "GPUS (2)") ||
            !strstr(o, "GPU 0 (CUDA driver test double device 0) GPU-c011d0fa-4be0-4d0b-8a2e-000000000000: ok") ||
            !strstr(o, "throttled: thermal") || !strstr(o, "PCIe replays: not supported"))
            rank_fail(r, "collctl status (rc %d) before the ECC errors:\n%s", rc, o);
        /* 2 uncorrected ECC errors on GPU 0: an event, then the drain. */
        if (!nvml_append("gpu=0 ecc_uncorrected=2"))
            rank_fail(r, "cannot write %s", nvml_control);
        else if (!log_says(h->log, "drained after 2 uncorrected ECC errors", 10000))
            rank_fail(r, "GPU 0 not drained within 10 s");
    }
    pthread_barrier_wait(r->barrier);
    if (r->rank != 0)
        goto out;
    /* status */
    int rc = collctl(h, o, 32768, "status", NULL);
    if (rc != 0 || !strstr(o, "GPU 0 (CUDA driver test double device 0) GPU-c011d0fa-4be0-4d0b-8a2e-000000000000: "
                              "DRAINED after 2 uncorrected ECC errors") ||
        !strstr(o, "ECC uncorrected (volatile): 2 (2 since colld started)"))
        rank_fail(r, "collctl status (rc %d) after the ECC errors:\n%s", rc, o);
    unsigned long long comm = 0;
    const char *u = strstr(o, "used by communicator ");
    if (!u || sscanf(u, "used by communicator %llu rank 0", &comm) != 1 || !comm)
        rank_fail(r, "collctl status names no communicator on GPU 0:\n%s", o);
    /* doctor: a problem naming the GPU, the communicator and the rank; exit 1 */
    char want[256];
    rc = collctl(h, o, 32768, "doctor", NULL);
    snprintf(want, sizeof(want), ", used by communicator %llu rank 0", comm);
    const char *e = strstr(o, "PROBLEM gpu-ecc    GPU 0 (CUDA driver test double device 0): 2 uncorrected ECC errors "
                              "since ");
    const char *eol = e ? strchr(e, '\n') : NULL;
    if (rc != 1 || !e || !eol || !strstr(e, want) || strstr(e, want) > eol ||
        !strstr(o, "PROBLEM gpu-drained GPU 0 (CUDA driver test double device 0) is drained after 2 uncorrected ECC "
                   "errors") ||
        !strstr(o, "warning gpu-throttle GPU 0 (CUDA driver test double device 0): clocks throttled (thermal)"))
        rank_fail(r, "collctl doctor (rc %d):\n%s", rc, o);
    /* events */
    rc = collctl(h, o, 32768, "events", NULL);
    if (rc != 0 ||
        !strstr(o, "gpu_ecc          COLLD_ERR_DEVICE: GPU 0 (CUDA driver test double device 0): uncorrected ECC "
                   "errors rose from 0 to 2") ||
        !strstr(o, "gpu_drained"))
        rank_fail(r, "collctl events (rc %d):\n%s", rc, o);
    /* metrics */
    int port = harness_metrics_port(h);
    char *m = port > 0 ? harness_scrape(port) : NULL;
    if (!m ||
        !strstr(m, "colld_gpu_ecc_uncorrected_volatile{gpu=\"0\",name=\"CUDA driver test double device 0\"} 2\n") ||
        !strstr(m, "colld_gpu_drained{gpu=\"0\",name=\"CUDA driver test double device 0\"} 1\n") ||
        !strstr(m, "colld_gpu_drained{gpu=\"1\",name=\"CUDA driver test double device 1\"} 0\n") ||
        !strstr(m, "colld_gpu_throttled{gpu=\"0\",name=\"CUDA driver test double device 0\",reason=\"thermal\"} 1\n") ||
        strstr(m, "colld_gpu_pcie_replays{gpu=\"1\""))
        rank_fail(r, "metrics:\n%s", m ? m : "(none)");
    free(m);
    /* The drain alone tore nothing down: the communicator on GPU 0 is still well. */
    colld_status_t async = COLLD_OK;
    colld_comm_get_async_error(r->comm, &async);
    if (async != COLLD_OK)
        rank_fail(r, "the communicator broke (%s) by health alone", colld_status_name(async));
    /* A new collective on GPU 0's buffers is refused (and, as any refused descriptor, breaks its
     * communicator, so that the other rank is not left waiting for it). */
    if (fill(r, send, recv, N_AR, N_AR, hb)) {
        st = colld_allreduce(sp, rp, N_AR, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s);
        CUresult cr = stream_released(r);
        if (st == COLLD_OK && cr == CUDA_SUCCESS)
            st = colld_comm_synchronize(r->comm);
        r->st[0] = st;
        char exact[512]; /* the core names the rank and the collective, the backend the GPU and why */
        snprintf(exact, sizeof(exact), "COLLD_ERR_DEVICE: rank 0 (pid %d), collective #2: %s", (int)getpid(),
                 DRAIN_MSG);
        if (st != COLLD_ERR_DEVICE || strcmp(colld_comm_last_error(r->comm), exact) != 0)
            rank_fail(r, "a collective on the drained GPU: %s (stream %s): '%s'", colld_status_name(st), rname(cr),
                      colld_comm_last_error(r->comm));
    }
    /* A new communicator of this session (it holds memory on GPU 0) is refused. */
    colld_unique_id_t id2;
    colld_comm_t *c2 = NULL;
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    if (colld_get_unique_id(r->c, &id2) != COLLD_OK)
        rank_fail(r, "colld_get_unique_id failed");
    else if ((st = colld_comm_init_rank(r->c, &c2, 1, id2, 0, &cfg)) != COLLD_ERR_DEVICE ||
             strcmp(colld_last_error(r->c), "COLLD_ERR_DEVICE: colld_comm_init_rank(rank 0 of 1): " DRAIN_MSG) != 0)
        rank_fail(r, "a new communicator on the drained GPU: %s: '%s'", colld_status_name(st), colld_last_error(r->c));
    else
        r->v[1]++;
    if (c2)
        colld_comm_destroy(c2);
out:
    pthread_barrier_wait(r->barrier);
    if (rp)
        colld_mem_free(r->c, rp);
    if (sp)
        colld_mem_free(r->c, sp);
}

/* ECC errors, throttling, the drain and what an operator sees of them. */
static void test_health_drain(void **state)
{
    harness_t *h = *state;
    rank_t ranks[2];
    run_ranks(h, sc_drain, SHORT_TIMEOUT_MS, ranks);
    assert_int_equal(ranks[0].v[0], 1); /* the all-reduce before the drain, exact */
    assert_int_equal(ranks[1].v[0], 1);
    assert_int_equal(ranks[0].st[0], COLLD_ERR_DEVICE);
    assert_int_equal(ranks[0].v[1], 1);
    /* An Xid of the critical list drains GPU 1 too, named in the event. */
    assert_true(nvml_append("gpu=1 xid=79"));
    assert_true(log_says(h->log, "GPU 1 (CUDA driver test double device 1): drained after Xid 79", 10000));
    /* GPU 1 vanishes from NVML: said, shown, a problem; nothing crashes. */
    assert_true(nvml_append("gpu=1 lost=1"));
    assert_true(log_says(h->log, "GPU 1 (CUDA driver test double device 1): NVML reports the GPU lost", 10000));
    static char out[32768];
    int rc = collctl(h, out, sizeof(out), "doctor", NULL);
    if (rc != 1 || !strstr(out, "PROBLEM gpu-lost   GPU 1 (CUDA driver test double device 1): lost: NVML reports the "
                                "GPU lost (GPU_IS_LOST)"))
        fail_msg("collctl doctor (rc %d) with GPU 1 lost:\n%s", rc, out);
}

/* ============================================================================================
 * no_nvml
 * ========================================================================================== */

static int setup_no_nvml(void **state)
{
    return setup_health(state, NULL, true);
}

/* Is a real libnvidia-ml.so.1 installed on this host (or can that not be told)? A daemon without
 * the double in its path would load it: the no-NVML case is left out then. */
static bool real_nvml_here(void)
{
    static char out[262144];
    const char *argv[] = { "/sbin/ldconfig", "-p", NULL };
    return harness_capture(argv, out, sizeof(out), 10000) != 0 || strstr(out, "libnvidia-ml.so.1") != NULL;
}

static int setup_nvml_init_fails(void **state)
{
    const char *const lines[] = { "init_error=9", NULL };
    return setup_health(state, lines, false);
}

/* No NVML (or an NVML that cannot start): no health, no error; collectives run; doctor is clean. */
static void no_health(harness_t *h, const char *why)
{
    rank_t ranks[2];
    run_ranks(h, sc_collectives, 0, ranks);
    assert_int_equal(ranks[0].v[0], 6);
    assert_int_equal(ranks[1].v[0], 6);
    static char out[32768];
    assert_int_equal(collctl(h, out, sizeof(out), "status", NULL), 0);
    char want[256];
    snprintf(want, sizeof(want), "GPUS (2): no health: %s", why);
    if (!strstr(out, want) || !strstr(out, "GPU 0 (CUDA driver test double device 0) "
                                           "GPU-c011d0fa-4be0-4d0b-8a2e-000000000000: not read: "))
        fail_msg("collctl status:\n%s", out);
    int rc = collctl(h, out, sizeof(out), "doctor", NULL);
    if (rc != 0 || strstr(out, "gpu-"))
        fail_msg("collctl doctor (rc %d):\n%s", rc, out);
    char log[65536];
    harness_read_file(h->log, log, sizeof(log));
    const char *first = strstr(log, "no GPU health: ");
    if (!first || strstr(first + 1, "no GPU health: ") || strstr(log, " ERROR "))
        fail_msg("the daemon's log should say once that there is no GPU health, and no error:\n%s", log);
}

static void test_no_nvml(void **state)
{
    no_health(*state, "no NVML (libnvidia-ml.so.1: cannot open shared object file");
}

static void test_nvml_init_fails(void **state)
{
    no_health(*state, "nvmlInit failed: NVML error 9 (Driver Not Loaded)");
}

/* ============================================================================================
 * across_nodes
 * ========================================================================================== */

typedef struct {
    harness_t h[2];
    char ctl[2][64], secret[64];
} pair_t;

static int setup_across_nodes(void **state)
{
    pair_t *pr = calloc(1, sizeof(*pr));
    if (!pr)
        return -1;
    snprintf(pr->secret, sizeof(pr->secret), "/tmp/colld-nvml-secret-XXXXXX");
    int fd = mkstemp(pr->secret);
    if (fd < 0 || write(fd, "nvml-across-nodes-test-secret\n", 30) != 30)
        return -1;
    close(fd);
    static const char *const names[2] = { "node-a", "node-b" };
    for (int i = 0; i < 2; i++) {
        snprintf(pr->ctl[i], sizeof(pr->ctl[i]), "/tmp/colld-nvmlfake-XXXXXX");
        if ((fd = mkstemp(pr->ctl[i])) < 0)
            return -1;
        close(fd);
        setenv("COLLD_NVMLFAKE_CONTROL", pr->ctl[i], 1);
        const char *extra[] = { "--gpu-health-ms", "50",      "--listen",    "127.0.0.1:0",           "--node-name",
                                names[i],          "--peers", "127.0.0.1:*", "--cluster-secret-file", pr->secret,
                                "--heartbeat-ms",  "400",     NULL };
        int rc = harness_daemon_start(&pr->h[i], extra);
        unsetenv("COLLD_NVMLFAKE_CONTROL");
        if (rc != 0 || !daemon_on_double(pr->h[i].pid, true) || !daemon_on_nvml_double(pr->h[i].pid, true))
            return -1;
    }
    *state = pr;
    return 0;
}

static int teardown_across_nodes(void **state)
{
    pair_t *pr = *state;
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        if (pr->h[i].dir[0] && harness_cleanup(&pr->h[i]) < 0)
            rc = -1;
        unlink(pr->ctl[i]);
    }
    unlink(pr->secret);
    free(pr);
    return rc;
}

typedef struct {
    colld_client_t *c;
    colld_comm_t *comm;
    colld_unique_id_t id;
    int rank;
    colld_status_t st;
} join_t;

static void *join_main(void *arg)
{
    join_t *j = arg;
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.name = "gpu-users";
    j->st = colld_comm_init_rank(j->c, &j->comm, 2, j->id, j->rank, &cfg);
    return NULL;
}

static void *leave_main(void *arg)
{
    join_t *j = arg;
    if (j->comm)
        colld_comm_destroy(j->comm);
    return NULL;
}

static void test_health_across_nodes(void **state)
{
    pair_t *pr = *state;
    join_t j[2] = { { .rank = 0 }, { .rank = 1 } };
    void *mem = NULL;
    static char out[65536];
    assert_int_equal(colld_connect(pr->h[0].socket, &j[0].c), COLLD_OK);
    assert_int_equal(colld_connect(pr->h[1].socket, &j[1].c), COLLD_OK);
    /* a communicator of node-a alone first: the two nodes' ids of the shared one then differ */
    colld_comm_t *pad = NULL;
    assert_int_equal(colld_get_unique_id(j[0].c, &j[0].id), COLLD_OK);
    assert_int_equal(colld_comm_init_rank(j[0].c, &pad, 1, j[0].id, 0, NULL), COLLD_OK);
    assert_int_equal(colld_get_unique_id(j[0].c, &j[0].id), COLLD_OK);
    j[1].id = j[0].id;
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, join_main, &j[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(j[0].st, COLLD_OK);
    assert_int_equal(j[1].st, COLLD_OK);
    /* rank 1's session holds memory on GPU 0 of node-b */
    assert_int_equal(colld_mem_alloc(j[1].c, &mem, 1 << 20, COLLD_MEM_CUDA), COLLD_OK);
    unsigned long long ida = harness_comm_id(&pr->h[0], "gpu-users"), idb = harness_comm_id(&pr->h[1], "gpu-users");
    assert_true(ida && idb && ida != idb);
    FILE *f = fopen(pr->ctl[1], "a");
    assert_non_null(f);
    fprintf(f, "gpu=0 ecc_uncorrected=2\n");
    fclose(f);
    assert_true(log_says(pr->h[1].log, "drained after 2 uncorrected ECC errors", 10000));
    const char *argv[] = { COLLCTL_BIN, "--socket", pr->h[0].socket, "doctor", NULL, NULL };
    int rc = harness_capture(argv, out, sizeof(out), 20000);
    printf("%s", out);
    char want[512];
    snprintf(want, sizeof(want),
             "PROBLEM gpu-ecc    [node-b] GPU 0 (CUDA driver test double device 0) on node node-b: 2 uncorrected "
             "ECC errors since ");
    const char *e = strstr(out, want);
    const char *eol = e ? strchr(e, '\n') : NULL;
    snprintf(want, sizeof(want),
             ", used by communicator %llu rank 1 (communicator %llu on node node-b is communicator %llu 'gpu-users' on "
             "node node-a)\n",
             idb, idb, ida);
    assert_int_equal(rc, 1);
    assert_non_null(e);
    assert_non_null(eol);
    assert_non_null(strstr(e, want));
    assert_true(strstr(e, want) < eol + 1);
    assert_non_null(strstr(out, "PROBLEM gpu-drained [node-b] GPU 0 (CUDA driver test double device 0) on node "
                                "node-b is drained after 2 uncorrected ECC errors"));
    /* --local: node-a alone, whose GPUs are well */
    argv[4] = "--local";
    rc = harness_capture(argv, out, sizeof(out), 20000);
    if (rc != 0 || strstr(out, "node-b]"))
        fail_msg("collctl doctor --local (rc %d):\n%s", rc, out);
    assert_int_equal(colld_mem_free(j[1].c, mem), COLLD_OK);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, leave_main, &j[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    colld_comm_destroy(pad);
    for (int i = 0; i < 2; i++)
        colld_disconnect(j[i].c);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    char err[256];
    int on_double = driver_is_double();
    int on_nvml = nvml_is_double();
    if (on_double < 0 || on_nvml < 0)
        return 1;
    if (!on_double || !on_nvml) {
        printf("this test runs on the CUDA driver and NVML test doubles, through ctest; skipping\n");
        return 77;
    }
    cu = colld_cu_load(err, sizeof(err));
    int n = 0;
    if (!cu || cu->cuDeviceGetCount(&n) != CUDA_SUCCESS || n < 2) {
        printf("needs two fake GPUs (%s); skipping\n", cu ? "fewer" : err);
        return 77;
    }
    CUcontext keep[2];
    for (int i = 0; i < 2; i++)
        if (cu->cuDevicePrimaryCtxRetain(&keep[i], i) != CUDA_SUCCESS)
            return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_health_drain, setup_drain, teardown_health),
        cmocka_unit_test_setup_teardown(test_nvml_init_fails, setup_nvml_init_fails, teardown_health),
        cmocka_unit_test_setup_teardown(test_health_across_nodes, setup_across_nodes, teardown_across_nodes),
        cmocka_unit_test_setup_teardown(test_no_nvml, setup_no_nvml, teardown_health),
    };
    size_t ntests = sizeof(tests) / sizeof(tests[0]);
    if (real_nvml_here()) {
        printf("a real libnvidia-ml.so.1 is installed here (or ldconfig -p failed): a daemon without the NVML "
               "double would load it; the no_nvml case is left out\n");
        ntests--;
    }
    return _cmocka_run_group_tests("gpu_nvml", tests, ntests, NULL, NULL);
}
