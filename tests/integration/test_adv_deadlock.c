/*
 * test_adv_deadlock.c - a tenant must not be able to blind the deadlock check for the others
 * (issue 26 row 2).
 *
 * The daemon runs with --deadlock-ms 500 --deadlock-fail. The attacker is this program run again
 * as uid 65534 ("nobody") when the test runs as root (else under the same uid: the daemon serves it
 * as one more communicator's ranks either way): one process with two connections that, every
 * CHURN_MS, makes two fresh communicators and waits in them crossed (rank 0 in the first, rank 1 in
 * the second: a wait-for cycle), then completes the previous round's cycle and leaves those
 * communicators. There is always a cycle of the attacker's, the newest communicators, and none of
 * them lasts --deadlock-ms. Before the fix the check tracked only the first cycle it found, the
 * attacker's, whose signature kept changing: the victim's real deadlock (two ranks of
 * colld-test-coll in mode crossed, as root) was never reported, and its ranks got
 * COLLD_ERR_TIMEOUT after their VICTIM_TIMEOUT_MS. Now every cycle is timed on its own: the victim's
 * ranks must get COLLD_ERR_DEADLOCK (naming their cycle) while the attacker keeps churning.
 *
 * test_wait_flood_does_not_turn_the_check_off: the attacker (uid 65534; root needed, else skipped)
 * holds FLOOD_RANKS connections in one communicator, each rank with a group of sends to the next
 * FLOOD_SENDS ranks (not past the last: no cycle) that never match, 66,810 pairs of ranks waiting.
 * Before the fix more than 65,536 waits turned the check off for everyone (an INFO line): the
 * victim got COLLD_ERR_TIMEOUT. Now only the attacker's communicators are left out (a WARN line
 * naming uid 65534) and the victim's deadlock is found.
 */
#include "tests/integration/harness.h"

#include <colld/colld.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
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
#define CHURN_MS 200             /* a fresh cycle of the attacker's this often (each lives about this long) */
#define CHURN_MAX_MS 60000       /* the attacker stops by itself after this */
#define VICTIM_TIMEOUT_MS "5000" /* the victim's communicators' time-out: TIMEOUT before the fix */
#define VICTIM_LIMIT_MS 30000
#define FLOOD_RANKS 390 /* the flood's connections, all ranks of one communicator ... */
#define FLOOD_SENDS 255 /* ... each with a group of sends to the next 255 (the rings hold 256) */
/* The attacker's all-reduces: 32 KiB of floats, above the fast area's 16 KiB (a rank that waits
 * there is seen only once it blocks; through the engine its post is a wait). */
#define CHURN_COUNT 8192

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ============================================================================================
 * The attacker (uid 65534 under root): fresh crossed communicators every CHURN_MS
 * ========================================================================================== */

typedef struct {
    colld_client_t *client;
    colld_unique_id_t id[2];
    colld_comm_t *comm[2];
    colld_status_t st;
} arank_t;

typedef struct {
    arank_t *r;
    int rank;
} ajoin_t;

/* Rank r joins both communicators of the round, in the same order as the other rank. */
static void *ajoin_main(void *arg)
{
    ajoin_t *j = arg;
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = 60000;
    j->r->st = COLLD_OK;
    for (int i = 0; i < 2 && j->r->st == COLLD_OK; i++) {
        cfg.name = i ? "churn-b" : "churn-a";
        j->r->st = colld_comm_init_rank(j->r->client, &j->r->comm[i], 2, j->r->id[i], j->rank, &cfg);
    }
    return NULL;
}

/* One round's two communicators, crossed: rank 0 waits in the first, rank 1 in the second. */
typedef struct {
    colld_comm_t *comm[2][2]; /* [rank][communicator] */
    float *x[2][2];
    bool posted;
} round_t;

/* Complete a round's cycle (each rank posts its other all-reduce), wait, and leave. Returns 1 when
 * the daemon had failed it (its cycle lasted --deadlock-ms: a slow round), else 0. */
static int resolve(round_t *rd)
{
    int failed = 0;
    if (rd->posted) {
        colld_allreduce(rd->x[1][0], rd->x[1][0], CHURN_COUNT, COLLD_FLOAT32, COLLD_SUM, rd->comm[1][0], NULL);
        colld_allreduce(rd->x[0][1], rd->x[0][1], CHURN_COUNT, COLLD_FLOAT32, COLLD_SUM, rd->comm[0][1], NULL);
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < 2; i++)
                if (colld_comm_synchronize(rd->comm[r][i]) == COLLD_ERR_DEADLOCK)
                    failed = 1;
    }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 2; i++)
            if (rd->comm[r][i])
                colld_comm_destroy(rd->comm[r][i]);
    memset(rd, 0, sizeof(*rd));
    return failed;
}

/* Write "rounds N failed M" to dir/churn (replaced whole, so a reader never sees half of it). */
static void tell(const char *dir, long rounds, long failed)
{
    char path[512], tmp[520];
    snprintf(path, sizeof(path), "%s/churn", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "rounds %ld failed %ld\n", rounds, failed);
    if (fclose(f) == 0)
        rename(tmp, path);
}

/* Churn until dir/stop exists (or CHURN_MAX_MS): each round joins two fresh communicators, posts
 * their cycle, then completes the previous round's. */
static int attacker_main(const char *socket, const char *dir)
{
    arank_t a[2] = { 0 };
    round_t rounds[2] = { 0 };
    float *buf[2] = { NULL, NULL }; /* each rank's: [round % 2][communicator][CHURN_COUNT] */
    long n = 0, failed = 0;
    for (int r = 0; r < 2; r++)
        if (colld_connect(socket, &a[r].client) != COLLD_OK ||
            colld_mem_alloc(a[r].client, (void **)&buf[r], 4 * CHURN_COUNT * sizeof(float), COLLD_MEM_HOST) !=
                COLLD_OK) {
            fprintf(stderr, "attacker (uid %u): connect: %s\n", (unsigned)getuid(), colld_last_error(a[r].client));
            return 1;
        }
    double t0 = now_ms();
    while (!harness_exists(dir, "stop") && now_ms() - t0 < CHURN_MAX_MS) {
        double start = now_ms();
        round_t *rd = &rounds[n % 2], *prev = &rounds[(n + 1) % 2];
        colld_unique_id_t id[2];
        for (int i = 0; i < 2; i++)
            if (colld_get_unique_id(a[0].client, &id[i]) != COLLD_OK) {
                fprintf(stderr, "attacker: unique id: %s\n", colld_last_error(a[0].client));
                return 1;
            }
        pthread_t t[2];
        ajoin_t j[2];
        for (int r = 0; r < 2; r++) {
            memcpy(a[r].id, id, sizeof(id));
            j[r] = (ajoin_t){ .r = &a[r], .rank = r };
            pthread_create(&t[r], NULL, ajoin_main, &j[r]);
        }
        for (int r = 0; r < 2; r++)
            pthread_join(t[r], NULL);
        for (int r = 0; r < 2; r++) {
            if (a[r].st != COLLD_OK) {
                fprintf(stderr, "attacker: rank %d join: %s: %s\n", r, colld_status_name(a[r].st),
                        colld_last_error(a[r].client));
                return 1;
            }
            for (int i = 0; i < 2; i++) {
                rd->comm[r][i] = a[r].comm[i];
                rd->x[r][i] = buf[r] + (size_t)((n % 2) * 2 + i) * CHURN_COUNT;
            }
        }
        /* The cycle: rank 0 waits in the first for rank 1, rank 1 in the second for rank 0. */
        colld_allreduce(rd->x[0][0], rd->x[0][0], CHURN_COUNT, COLLD_FLOAT32, COLLD_SUM, rd->comm[0][0], NULL);
        colld_allreduce(rd->x[1][1], rd->x[1][1], CHURN_COUNT, COLLD_FLOAT32, COLLD_SUM, rd->comm[1][1], NULL);
        rd->posted = true;
        failed += resolve(prev);
        tell(dir, ++n, failed);
        double left = CHURN_MS - (now_ms() - start);
        if (left > 0)
            usleep((useconds_t)(left * 1000));
    }
    for (int i = 0; i < 2; i++)
        failed += resolve(&rounds[i]);
    tell(dir, n, failed);
    for (int r = 0; r < 2; r++) {
        colld_mem_free(a[r].client, buf[r]);
        colld_disconnect(a[r].client);
    }
    return 0;
}

/* ============================================================================================
 * The flood (uid 65534 under root): more waits than the check's bound
 * ========================================================================================== */

/* Join FLOOD_RANKS connections to one communicator, post each rank's group of sends, say so
 * (dir/flood-ready) and hold them until dir/stop. The process then ends without destroying its
 * handles (the sends never complete, and a destroy waits for issued work). */
static int flood_main(const char *socket, const char *dir)
{
    harness_rank_t *f = calloc(FLOOD_RANKS, sizeof(*f));
    if (!f || harness_join_ranks("flood", socket, f, FLOOD_RANKS, 120000, "flood", NULL) != 0)
        return 1;
    for (int r = 0; r < FLOOD_RANKS; r++) {
        int32_t *buf = NULL;
        colld_status_t st = colld_mem_alloc(f[r].client, (void **)&buf, 4096, COLLD_MEM_HOST);
        if (st == COLLD_OK)
            st = colld_group_start();
        for (int i = 1; i <= FLOOD_SENDS && r + i < FLOOD_RANKS && st == COLLD_OK; i++)
            st = colld_send(buf, 1, COLLD_INT32, r + i, f[r].comm, NULL);
        colld_status_t end = colld_group_end();
        if (st == COLLD_OK)
            st = end;
        if (st != COLLD_OK) {
            fprintf(stderr, "flood: rank %d: %s: %s\n", r, colld_status_name(st),
                    f[r].comm ? colld_comm_last_error(f[r].comm) : colld_last_error(f[r].client));
            return 1;
        }
    }
    harness_touch(dir, "flood-ready");
    double t0 = now_ms();
    while (!harness_exists(dir, "stop") && now_ms() - t0 < CHURN_MAX_MS)
        usleep(10000);
    fflush(NULL);
    _exit(0);
}

/* ============================================================================================
 * The driver
 * ========================================================================================== */

/* The attacker's rounds so far (and those the daemon failed), from dir/churn. */
static long churned(const char *dir, long *failed)
{
    char path[512], text[128] = "";
    long n = 0, f = 0;
    snprintf(path, sizeof(path), "%s/churn", dir);
    harness_read_file(path, text, sizeof(text));
    if (sscanf(text, "rounds %ld failed %ld", &n, &f) != 2)
        n = f = 0;
    if (failed)
        *failed = f;
    return n;
}

static int setup(void **state)
{
    static const char *const extra[] = { "--deadlock-ms", "500", "--deadlock-fail", "--socket-mode", "0666", NULL };
    return harness_test_setup_shared(state, extra);
}

/* The victim: two ranks of colld-test-coll (as root) deadlocked across two communicators, with
 * their files in dir/name. Returns 0 when both got COLLD_ERR_DEADLOCK naming their own cycle (how
 * long they took and their outputs printed). */
static int run_victim(harness_t *h, const char *name)
{
    char hex[2][HARNESS_UID_HEX_LEN], out[2][400], sync[300], text[2048], rk[4];
    for (int i = 0; i < 2; i++)
        assert_int_equal(harness_new_uid_hex(h, hex[i]), 0);
    snprintf(sync, sizeof(sync), "%s/%s", h->dir, name);
    assert_int_equal(mkdir(sync, 0700), 0);
    pid_t p[2];
    for (int r = 0; r < 2; r++) {
        snprintf(rk, sizeof(rk), "%d", r);
        snprintf(out[r], sizeof(out[r]), "%s/crossed-%d", sync, r);
        const char *tmo = VICTIM_TIMEOUT_MS, *want = "COLLD_ERR_DEADLOCK";
        const char *argv[] = { COLL_BIN,  "--socket",     h->socket, "--uid",    hex[0], "--uid2",
                               hex[1],    "--nranks",     "2",       "--rank",   rk,     "--mode",
                               "crossed", "--timeout-ms", tmo,       "--expect", want,   "--out",
                               out[r],    "--sync-dir",   sync,      NULL };
        assert_true((p[r] = harness_spawn(argv)) > 0);
    }
    double v0 = now_ms();
    int vrc = harness_wait_all(p, 2, VICTIM_LIMIT_MS);
    print_message("victim's ranks done after %.0f ms (time-out %s ms)\n", now_ms() - v0, VICTIM_TIMEOUT_MS);
    for (int r = 0; r < 2; r++) {
        harness_read_file(out[r], text, sizeof(text));
        print_message("%s", text);
        if (vrc == 0 && (!strstr(text, "deadlock across communicators: rank ") || !strstr(text, "'crossed-2'") ||
                         strstr(text, "churn-") || strstr(text, "'flood'")))
            vrc = -1;
    }
    return vrc;
}

static void stop_attacker(harness_t *h)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/stop", h->dir);
    FILE *f = fopen(path, "w");
    if (f)
        fclose(f);
}

/* While the attacker churns cycles, the victim's cross-communicator deadlock fails with
 * COLLD_ERR_DEADLOCK naming its cycle, long before its time-out. */
static void test_churning_cycles_do_not_hide_a_deadlock(void **state)
{
    harness_t *h = *state;
    bool root = geteuid() == 0;
    if (!root)
        print_message("not root: the attacker runs as the same uid (communicators of its own)\n");
    pid_t attacker = harness_spawn_self(h, "test_adv_deadlock", "--attacker", root);
    assert_true(attacker > 0);
    /* Under attack once the attacker has made a few rounds. */
    double t0 = now_ms();
    while (churned(h->dir, NULL) < 3 && now_ms() - t0 < 30000)
        usleep(10000);
    long before = churned(h->dir, NULL);
    print_message("attacker (uid %d) churning: %ld rounds in %.0f ms\n", root ? NOBODY : (int)getuid(), before,
                  now_ms() - t0);
    int vrc = run_victim(h, "victim");
    long failed = 0, at_end = churned(h->dir, &failed), during = at_end - before;
    /* The attacker still churns once the victim is done: it did all along. */
    double t1 = now_ms();
    while (churned(h->dir, NULL) <= at_end && now_ms() - t1 < 10000)
        usleep(10000);
    long after = churned(h->dir, NULL) - at_end;
    stop_attacker(h);
    int arc = harness_wait(attacker, 30000);
    print_message("the attacker made %ld rounds meanwhile (%ld of all its rounds lasted --deadlock-ms and were "
                  "failed)\n",
                  during, failed);
    assert_int_equal(vrc, 0); /* both ranks got COLLD_ERR_DEADLOCK (coll_rank's --expect), naming their cycle */
    assert_true(before >= 3 && during >= 1 && after >= 1); /* the attacker churned all the while */
    assert_int_equal(arc, 0);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* While the flood holds more waits than the check's bound, the victim's deadlock still fails with
 * COLLD_ERR_DEADLOCK, and the log names the tenant left out. */
static void test_wait_flood_does_not_turn_the_check_off(void **state)
{
    harness_t *h = *state;
    if (geteuid() != 0) {
        print_message("skipped: needs root (the flood must be another tenant than the victim)\n");
        skip();
    }
    double t0 = now_ms();
    pid_t flood = harness_spawn_self(h, "test_adv_deadlock", "--flood", true);
    assert_true(flood > 0);
    char path[512];
    snprintf(path, sizeof(path), "%s/flood-ready", h->dir);
    bool ready = harness_wait_file(path, 60000) == 0;
    print_message("flood (uid %d): %d ranks with %d sends each posted in %.0f ms\n", NOBODY, FLOOD_RANKS, FLOOD_SENDS,
                  now_ms() - t0);
    int vrc = ready ? run_victim(h, "victim-flood") : -1;
    stop_attacker(h);
    int frc = harness_wait(flood, 30000);
    static char log[1 << 20];
    harness_read_file(h->log, log, sizeof(log));
    const char *left = strstr(log, "deadlock check: the communicators of uid 65534 left out");
    print_message("daemon log (%zu bytes): %s\n", strlen(log),
                  left ? "the flood's uid left out" : "no line naming the flood's uid");
    for (char *line = log, *end; !left && line && *line; line = end ? end + 1 : NULL) {
        end = strchr(line, '\n');
        if (end)
            *end = '\0';
        if (strstr(line, " WARN ") || strstr(line, "deadlock check"))
            print_message("%s\n", line);
    }
    assert_true(ready);
    assert_int_equal(vrc, 0);
    assert_int_equal(frc, 0);
    assert_non_null(left);
    assert_int_equal(harness_wait_clean(h, 30000), 0);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--attacker") == 0)
        return attacker_main(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "--flood") == 0)
        return flood_main(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_churning_cycles_do_not_hide_a_deadlock, setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_wait_flood_does_not_turn_the_check_off, setup, harness_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
