/*
 * test_adv_p2p.c - a hostile tenant's point-to-point backlog must not slow the other tenants
 * (issue 26 row 1): many connections each post a group of 255 sends that never meet a receive,
 * while two of its ranks exchange real sends and receives, each exchange a change the daemon's
 * matching sees. Before matching was indexed by pair of ranks, every change rescanned every rank's
 * whole batch for each send (O(ranks x batch^2) under the daemon lock), and another tenant's 32 KiB
 * all-reduce fell from thousands to a few per second.
 *
 * The victim is this program re-executed as uid/gid 65534 ("nobody") when it runs as root (as
 * test_adv_limits does), else as the same uid (the daemon serves it as one more tenant's
 * communicator either way). It runs 2-rank all-reduces of 32 KiB (through the engine: above the
 * fast area's size) for a fixed time before the attack and again while the attack runs; the rate
 * under attack must stay within a generous factor (ATTACK_FACTOR) of its idle rate measured in the
 * same run, so a loaded machine slows both alike. The attacker is this program re-executed in
 * attacker mode (root, or the same uid): one process with HOGS + 2 connections, all ranks of one
 * communicator. Every phase is driven through files in the test's directory.
 */
#include "tests/integration/harness.h"

#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define NOBODY HARNESS_NOBODY
#define HOGS 32           /* connections of the attacker that post sends that never match */
#define HOG_SENDS 255     /* each, in one group (the rings hold 256 entries) */
#define VICTIM_COUNT 8192 /* floats: 32 KiB, above the fast area's 16 KiB */
#define MEASURE_MS 1500   /* each of the victim's windows */
#define ATTACK_FACTOR 10  /* the rate under attack may fall at most this much below the idle one */
#define ATTACK_TIMEOUT_MS 600000

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ============================================================================================
 * The victim (uid 65534 under root): its all-reduce rate idle, then under attack
 * ========================================================================================== */

/* All-reduces of 32 KiB on both ranks for ms milliseconds (after a short warm-up); returns the
 * rate per second, or -1 on an error or a wrong result (printed). */
static double victim_window(harness_rank_t *v, float *buf[2], int ms)
{
    double t0 = now_ms(), start = 0, end = 0;
    long n = 0, iter = 0;
    for (;; iter++) {
        double t = now_ms();
        if (!start && t - t0 >= 200)
            start = t;
        if (start && t - start >= ms) {
            end = t;
            break;
        }
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < VICTIM_COUNT; i++)
                buf[r][i] = (float)((i + r + (int)(iter & 7)) % 13);
        colld_status_t st = COLLD_OK;
        for (int r = 0; r < 2 && st == COLLD_OK; r++)
            st = colld_allreduce(buf[r], buf[r], VICTIM_COUNT, COLLD_FLOAT32, COLLD_SUM, v[r].comm, NULL);
        for (int r = 0; r < 2 && st == COLLD_OK; r++)
            st = colld_comm_synchronize(v[r].comm);
        if (st != COLLD_OK) {
            fprintf(stderr, "victim: all-reduce %ld: %s: %s\n", iter, colld_status_name(st),
                    colld_comm_last_error(v[0].comm));
            return -1;
        }
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < VICTIM_COUNT; i += 97)
                if (buf[r][i] != (float)((i + (int)(iter & 7)) % 13 + (i + 1 + (int)(iter & 7)) % 13)) {
                    fprintf(stderr, "victim: all-reduce %ld: rank %d element %d is %g\n", iter, r, i,
                            (double)buf[r][i]);
                    return -1;
                }
        if (start)
            n++;
    }
    return (double)n * 1000.0 / (end - start);
}

/* Idle window, then (once dir/attack-on exists) the window under attack: "idle R\nattack R\n" into
 * dir/rates. Exit 0 when both ran exactly. */
static int victim_main(const char *socket, const char *dir)
{
    harness_rank_t v[2];
    float *buf[2] = { NULL, NULL };
    int rc = harness_join_ranks("victim", socket, v, 2, 60000, "victim", NULL);
    for (int r = 0; r < 2 && rc == 0; r++)
        if (colld_mem_alloc(v[r].client, (void **)&buf[r], VICTIM_COUNT * sizeof(float), COLLD_MEM_HOST) != COLLD_OK)
            rc = 1;
    double idle = rc == 0 ? victim_window(v, buf, MEASURE_MS) : -1;
    harness_touch(dir, "idle-done");
    double attack = -1;
    if (idle > 0 && harness_wait_for(dir, "attack-on", 60000))
        attack = victim_window(v, buf, MEASURE_MS);
    char path[512];
    snprintf(path, sizeof(path), "%s/rates", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "idle %.1f\nattack %.1f\n", idle, attack);
        fclose(f);
    }
    for (int r = 0; r < 2; r++)
        if (buf[r])
            colld_mem_free(v[r].client, buf[r]);
    harness_leave_ranks(v, 2);
    return idle > 0 && attack >= 0 ? 0 : 1;
}

/* ============================================================================================
 * The attacker: HOGS ranks with a group of HOG_SENDS sends each that never match, and two ranks
 * that exchange sends and receives until dir/stop exists
 * ========================================================================================== */

typedef struct {
    harness_rank_t *p;
    const char *dir;
    int hogs;
    atomic_long exchanges;
    atomic_long last; /* exchanges to run, 0 until the driver asked to stop */
} attack_t;

typedef struct {
    attack_t *a;
    int rank;
    colld_status_t st;
} attack_rank_t;

/* Hog rank r: one group of sends to the next hog, never received. */
static void *hog_main(void *arg)
{
    attack_rank_t *ar = arg;
    harness_rank_t *p = &ar->a->p[ar->rank];
    int32_t *buf = NULL;
    colld_status_t st = colld_mem_alloc(p->client, (void **)&buf, 4096, COLLD_MEM_HOST);
    if (st == COLLD_OK)
        st = colld_group_start();
    for (int i = 0; i < HOG_SENDS && st == COLLD_OK; i++)
        st = colld_send(buf, 1, COLLD_INT32, (ar->rank + 1) % ar->a->hogs, p->comm, NULL);
    colld_status_t end = colld_group_end();
    ar->st = st == COLLD_OK ? end : st;
    return NULL;
}

/* Exchange rank (hogs or hogs + 1): a group of one send and one receive with the other, again and
 * again (about every millisecond: each exchange is a change the daemon's matching sees). The first
 * decides when to stop, once dir/stop exists: after one more exchange, which the second (at most
 * that one exchange ahead, as an exchange completes only once both posted it) runs too. */
static void *exchange_main(void *arg)
{
    attack_rank_t *ar = arg;
    attack_t *a = ar->a;
    harness_rank_t *p = &a->p[ar->rank];
    int peer = ar->rank == a->hogs ? a->hogs + 1 : a->hogs;
    int32_t *buf = NULL;
    colld_status_t st = colld_mem_alloc(p->client, (void **)&buf, 8192, COLLD_MEM_HOST);
    for (long k = 0; st == COLLD_OK; k++) {
        if (ar->rank == a->hogs && !atomic_load(&a->last) && harness_exists(a->dir, "stop"))
            atomic_store(&a->last, k + 1);
        long last = atomic_load(&a->last);
        if (last && k >= last)
            break;
        for (int i = 0; i < 256; i++)
            buf[i] = (int32_t)(k * 1000 + ar->rank * 100000 + i);
        st = colld_group_start();
        if (st == COLLD_OK)
            st = colld_send(buf, 256, COLLD_INT32, peer, p->comm, NULL);
        if (st == COLLD_OK)
            st = colld_recv(buf + 1024, 256, COLLD_INT32, peer, p->comm, NULL);
        colld_status_t end = colld_group_end();
        if (st == COLLD_OK)
            st = end;
        if (st == COLLD_OK)
            st = colld_comm_synchronize(p->comm);
        if (st == COLLD_OK && buf[1024 + 255] != (int32_t)(k * 1000 + peer * 100000 + 255)) {
            fprintf(stderr, "attacker: exchange %ld: rank %d got %d\n", k, ar->rank, buf[1024 + 255]);
            st = COLLD_ERR_INTERNAL;
        }
        if (ar->rank == a->hogs)
            atomic_fetch_add(&a->exchanges, 1);
        usleep(1000);
    }
    if (st != COLLD_OK)
        fprintf(stderr, "attacker: exchange rank %d: %s: %s\n", ar->rank, colld_status_name(st),
                colld_comm_last_error(p->comm));
    ar->st = st;
    return NULL;
}

/* Join, post the hogs' groups, exchange, say so (dir/attack-ready) and go on until dir/stop. The
 * process then ends without destroying its handles (the hogs' sends never complete, and a destroy
 * waits for issued work): the daemon sees its connections close. */
static int attacker_main(const char *socket, const char *dir)
{
    int n = HOGS + 2;
    harness_rank_t *p = calloc((size_t)n, sizeof(*p));
    attack_rank_t *ar = calloc((size_t)n, sizeof(*ar));
    pthread_t *t = calloc((size_t)n, sizeof(*t));
    attack_t a = { .p = p, .dir = dir, .hogs = HOGS };
    if (!p || !ar || !t || harness_join_ranks("attacker", socket, p, n, ATTACK_TIMEOUT_MS, "attacker", NULL) != 0)
        return 1;
    for (int r = 0; r < n; r++)
        ar[r] = (attack_rank_t){ .a = &a, .rank = r };
    for (int r = 0; r < HOGS; r++)
        pthread_create(&t[r], NULL, hog_main, &ar[r]);
    for (int r = 0; r < HOGS; r++)
        pthread_join(t[r], NULL);
    int rc = 0;
    for (int r = 0; r < HOGS; r++)
        if (ar[r].st != COLLD_OK) {
            fprintf(stderr, "attacker: hog %d: %s: %s\n", r, colld_status_name(ar[r].st),
                    colld_comm_last_error(p[r].comm));
            rc = 1;
        }
    for (int r = HOGS; r < n; r++)
        pthread_create(&t[r], NULL, exchange_main, &ar[r]);
    /* Under attack once the exchanges run. */
    while (atomic_load(&a.exchanges) < 20 && !harness_exists(dir, "stop"))
        usleep(1000);
    harness_touch(dir, "attack-ready");
    for (int r = HOGS; r < n; r++)
        pthread_join(t[r], NULL);
    for (int r = HOGS; r < n; r++)
        rc |= ar[r].st != COLLD_OK;
    fprintf(stderr, "attacker: %ld exchanges\n", atomic_load(&a.exchanges));
    fflush(NULL);
    _exit(rc);
}

/* ============================================================================================
 * The driver
 * ========================================================================================== */

static int setup(void **state)
{
    static const char *const extra[] = { "--socket-mode", "0666", NULL };
    return harness_test_setup_shared(state, extra);
}

/* The victim's all-reduce rate while the attack runs stays within ATTACK_FACTOR of its idle rate. */
static void test_p2p_backlog_does_not_slow_others(void **state)
{
    harness_t *h = *state;
    bool root = geteuid() == 0;
    if (!root)
        print_message("not root: the victim runs as the same uid (a separate communicator)\n");
    pid_t victim = harness_spawn_self(h, "test_adv_p2p", "--victim", root);
    assert_true(victim > 0);
    assert_true(harness_wait_for(h->dir, "idle-done", 120000));
    double t0 = now_ms();
    pid_t attacker = harness_spawn_self(h, "test_adv_p2p", "--attacker", false);
    assert_true(attacker > 0);
    bool ready = harness_wait_for(h->dir, "attack-ready", 120000);
    print_message("attack set up in %.0f ms (%d connections, %d sends that never match)\n", now_ms() - t0, HOGS + 2,
                  HOGS * HOG_SENDS);
    harness_touch(h->dir, "attack-on");
    int vrc = harness_wait(victim, 120000);
    harness_touch(h->dir, "stop");
    int arc = harness_wait(attacker, 60000);
    char path[512], text[256] = "";
    snprintf(path, sizeof(path), "%s/rates", h->dir);
    harness_read_file(path, text, sizeof(text));
    double idle = -1, attack = -1;
    sscanf(text, "idle %lf attack %lf", &idle, &attack);
    print_message("victim (uid %d): %.0f all-reduces of 32 KiB per second idle, %.0f under attack\n",
                  root ? NOBODY : (int)getuid(), idle, attack);
    assert_true(ready);
    assert_int_equal(vrc, 0);
    assert_int_equal(arc, 0);
    assert_true(idle > 0);
    assert_true(attack * ATTACK_FACTOR >= idle);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--victim") == 0)
        return victim_main(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "--attacker") == 0)
        return attacker_main(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_p2p_backlog_does_not_slow_others, setup, harness_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
