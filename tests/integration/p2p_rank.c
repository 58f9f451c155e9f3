/*
 * p2p_rank.c - colld-test-p2p: one rank process of the point-to-point integration tests
 * (test_p2p.c): colld_send, colld_recv and colld_alltoallv through a real daemon.
 *
 * Every message from rank a to rank b (the k-th of a test step) holds colld_cpu_pattern's values
 * for (dtype, rank a, salt derived from b, k and the step), so a receiver knows exactly what it
 * must get; every result is compared BITWISE (memcmp), the P2P_GUARD bytes around every buffer must
 * stay untouched, and a send buffer must be unchanged.
 *
 * Modes (--mode):
 *   ring      (default) for every dtype and count {0, 1, 1001, big}: one group in which each rank
 *             sends to both neighbours and receives from both (rank r's next is (r + 1) % n), then
 *             a group in which it also sends to itself. --no-big drops the >= 4 MiB count.
 *   pairs     as PyTorch's test_send_recv, without groups: for each src in turn, src sends to
 *             every other rank in rank order and the others receive from src; all posted, then
 *             one synchronize (each rank's operations run in its posting order).
 *   mixed     --iters steps; in step i rank i % n sends to rank (i + 1) % n outside any group
 *             (the others post nothing), the receiver's buffer being its input to the next two
 *             all-reduces (int32 sum: 16 elements, on the fast area; 50,000, through the engine),
 *             whose results must include what it received: the ranks' operation ids differ while
 *             the collectives stay matched (the collective ordinal), and every operation sees the
 *             effects of the ones before it. colld_op_wait on the receive's own id.
 *   alltoallv uneven counts (some 0) per pair, for several dtypes, from packed send regions to
 *             packed receive regions in a different order.
 *   isend-ring Gloo's and MPI's ring outside groups (torch 2.x posts CPU sends and receives one at
 *             a time, issue 25): each rank sends to its right, then receives from its left, then
 *             waits for the receive and the send by their operation ids; several dtypes and counts,
 *             --iters rounds each (at least 2 ranks).
 *   ops       per-operation completion: rank 1 posts a receive from rank 0, whose colld_op_query
 *             must be COLLD_INPROGRESS until rank 0 sends (which waits for <--sync-dir>/queried);
 *             colld_op_wait then returns COLLD_OK with the data in place.
 *   call      a fault scene (--scene): never-sent (rank 0 receives from rank 1, which all-reduces
 *             instead, as every other rank does), mismatch (rank 0 sends 100 int32 to rank 1, which receives 50), crossed
 *             (both ranks send to each other, then receive, without a group: it runs, data
 *             checked), sends-only (both ranks send to each other and never receive), hang (rank 0
 *             receives from rank 1, which then creates <--sync-dir>/ready and sleeps until killed).
 *             --expect NAME: the status rank 0 (and rank 1 where it takes part) must get; rank 0
 *             prints the communicator's error detail on stdout (--out FILE). --metrics-port P: in
 *             never-sent, rank 0 says it posted only once the daemon's /metrics counts the receive.
 *   badargs   client-side refusals: peers out of range, NULL buffers, a stream on host buffers, bad
 *             alltoallv arrays and overlapping regions, a group with more sends and receives than the rings
 *             hold (COLLD_ERR_INVALID_USAGE, nothing posted); then an exchange that works.
 *
 * --malloc: ordinary memory (staged by libcolld) instead of colld_mem_alloc.
 * Exit code: 0 everything matched (or the expected status came); 1 otherwise; 2 bad arguments.
 */
#include "common/util.h"
#include "tools/testdata/pattern.h"
#include "tests/integration/harness.h"
#include "tests/integration/p2p_data.h"
#include "tests/integration/harness_opts.h"

#include <colld/colld.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BIG_BYTES (4u << 20)
#define MIXED_SMALL 16    /* int32 elements: the fast area's size */
#define MIXED_LARGE 50000 /* int32 elements: through the engine */
#define MAX_RANKS_P2P 16  /* most ranks the program handles */

typedef struct {
    const char *socket, *uid_hex, *mode, *expect, *sync_dir, *scene;
    int metrics_port; /* > 0: the daemon's /metrics, to see a posted operation reach it */
    int nranks, rank, timeout_ms, iters;
    bool big, use_malloc;
} args_t;

typedef struct {
    const args_t *a;
    colld_client_t *c;
    colld_comm_t *comm;
    int n, rank;
    unsigned char *sreg, *rreg; /* the send and the receive region */
    size_t reg_bytes;
    long ops, bad;
} run_t;

/* ---------------------------------------------------------------------------------------------
 * Messages and checks
 * ------------------------------------------------------------------------------------------- */

static bool fail(run_t *R, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(run_t *R, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (R->bad++ < 20) {
        fprintf(stderr, "FAILED rank %d: ", R->rank);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
    }
    va_end(ap);
    return false;
}

static bool guards_ok(run_t *R, const unsigned char *buf, size_t bytes, const char *what)
{
    return p2p_guards_intact(buf, bytes) || fail(R, "%s: a guard byte around the buffer was overwritten", what);
}

/* Whether buf holds message k of `step` from `from` to `to`. */
static bool check_message(run_t *R, const void *buf, colld_dtype_t dt, int from, int to, unsigned step, int k,
                          size_t count, const char *what)
{
    size_t wrong = 0;
    int ok = p2p_message_matches(buf, dt, from, to, step, k, count, &wrong);
    if (ok < 0)
        return fail(R, "out of memory");
    if (!ok)
        fail(R, "%s: %zu x dtype %d from rank %d (step %u, message %d): first wrong byte %zu of %zu", what, count,
             (int)dt, from, step, k, wrong, count * colld_dtype_size(dt));
    return ok;
}

static colld_status_t sync_comm(run_t *R, const char *what)
{
    colld_status_t st = colld_comm_synchronize(R->comm);
    if (st != COLLD_OK)
        fail(R, "%s: %s: %s", what, colld_status_name(st), colld_comm_last_error(R->comm));
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Modes
 * ------------------------------------------------------------------------------------------- */

/* One group: send to both neighbours (and to itself when `self`), receive from them; then check.
 * Message k = 0 goes to the next rank, 1 to the previous one, 2 to itself. */
static int ring_step(run_t *R, colld_dtype_t dt, size_t count, unsigned step, bool self)
{
    int n = R->n, me = R->rank, next = (me + 1) % n, prev = (me + n - 1) % n;
    size_t bytes = count * colld_dtype_size(dt), stride = 2 * P2P_GUARD + ((bytes + 63) & ~(size_t)63);
    int peers[3] = { next, prev, me };
    int m = self ? 3 : 2;
    unsigned char *sb[3], *rb[3];
    if (3 * stride > R->reg_bytes)
        return fail(R, "regions too small"), 1;
    for (int k = 0; k < m; k++) {
        sb[k] = p2p_slot(R->sreg, (size_t)k * stride, bytes);
        rb[k] = p2p_slot(R->rreg, (size_t)k * stride, bytes);
        p2p_message(dt, me, peers[k], step, k, count, sb[k]);
        memset(rb[k], 0, bytes);
    }
    colld_status_t st = colld_group_start();
    for (int k = 0; k < m && st == COLLD_OK; k++)
        st = colld_send(sb[k], count, dt, peers[k], R->comm, NULL);
    /* Receive from prev what it sent to its next (its message 0), from next its message 1. */
    int from[3] = { prev, next, me };
    for (int k = 0; k < m && st == COLLD_OK; k++)
        st = colld_recv(rb[k], count, dt, from[k], R->comm, NULL);
    colld_status_t end = colld_group_end();
    if (st == COLLD_OK)
        st = end;
    if (st != COLLD_OK) {
        fail(R, "ring dtype %d x %zu: posting: %s: %s", dt, count, colld_status_name(st),
             colld_comm_last_error(R->comm));
        return 1;
    }
    if (sync_comm(R, "ring") != COLLD_OK)
        return 1;
    R->ops += 2 * m;
    bool ok = true;
    for (int k = 0; k < m; k++) {
        /* rb[0] holds prev's message 0 (to its next, me); rb[1] next's message 1; rb[2] my own 2. */
        ok &= check_message(R, rb[k], dt, from[k], me, step, k, count, "ring receive");
        ok &= check_message(R, sb[k], dt, me, peers[k], step, k, count, "ring send buffer");
        ok &= guards_ok(R, rb[k], bytes, "ring receive") && guards_ok(R, sb[k], bytes, "ring send");
    }
    return ok ? 0 : 1;
}

static int mode_ring(run_t *R)
{
    unsigned step = 0;
    for (int dt = 0; dt < COLLD_DTYPE_COUNT; dt++) {
        size_t es = colld_dtype_size((colld_dtype_t)dt);
        size_t counts[4] = { 0, 1, 1001, BIG_BYTES / es + 3 };
        for (int i = 0; i < (R->a->big ? 4 : 3); i++)
            for (int self = 0; self < 2; self++)
                if (ring_step(R, (colld_dtype_t)dt, counts[i], ++step, self) != 0)
                    return 1;
    }
    return 0;
}

/* PyTorch's test_send_recv: no groups, each rank's operations in the order the loop makes them. */
static int mode_pairs(run_t *R)
{
    int n = R->n, me = R->rank;
    size_t count = 3000, bytes = count * sizeof(float), stride = 2 * P2P_GUARD + bytes;
    for (int src = 0; src < n; src++) {
        if (src == me) {
            for (int dst = 0; dst < n; dst++) {
                if (dst == me)
                    continue;
                unsigned char *b = p2p_slot(R->sreg, (size_t)dst * stride, bytes);
                p2p_message(COLLD_FLOAT32, me, dst, 7, 0, count, b);
                colld_status_t st = colld_send(b, count, COLLD_FLOAT32, dst, R->comm, NULL);
                if (st != COLLD_OK)
                    return fail(R, "send to %d: %s", dst, colld_status_name(st)), 1;
            }
        } else {
            unsigned char *b = p2p_slot(R->rreg, (size_t)src * stride, bytes);
            memset(b, 0, bytes);
            colld_status_t st = colld_recv(b, count, COLLD_FLOAT32, src, R->comm, NULL);
            if (st != COLLD_OK)
                return fail(R, "recv from %d: %s", src, colld_status_name(st)), 1;
        }
    }
    if (sync_comm(R, "pairs") != COLLD_OK)
        return 1;
    bool ok = true;
    for (int src = 0; src < n; src++)
        if (src != me) {
            unsigned char *b = R->rreg + (size_t)src * stride + P2P_GUARD;
            ok &= check_message(R, b, COLLD_FLOAT32, src, me, 7, 0, count, "pairs") && guards_ok(R, b, bytes, "pairs");
        }
    R->ops += 2 * (n - 1);
    return ok ? 0 : 1;
}

/* Step i: rank i % n sends its large all-reduce input to rank (i + 1) % n outside a group, which
 * receives it over its own input; then a small (fast area) and a large (engine) int32 all-reduce
 * in place. Every rank knows every rank's input, so it knows both sums exactly. */
static int mode_mixed(run_t *R)
{
    int n = R->n, me = R->rank;
    int32_t *small = (int32_t *)R->sreg, *large = (int32_t *)(R->sreg + 4096);
    int32_t *want = malloc(MIXED_LARGE * sizeof(int32_t));
    if (!want)
        return fail(R, "out of memory"), 1;
    int rc = 0;
    for (int i = 0; i < R->a->iters && rc == 0; i++) {
        int src = i % n, dst = (i + 1) % n;
        /* rank r's input: r * 100000 + i * 10 + j; the receiver's becomes the sender's */
        for (int j = 0; j < MIXED_LARGE; j++)
            large[j] = me * 100000 + i * 10 + j;
        for (int j = 0; j < MIXED_SMALL; j++)
            small[j] = me + i + j;
        uint64_t recv_op = 0;
        colld_status_t st = COLLD_OK;
        if (n > 1 && me == src)
            st = colld_send(large, MIXED_LARGE, COLLD_INT32, dst, R->comm, NULL);
        else if (n > 1 && me == dst) {
            st = colld_recv(large, MIXED_LARGE, COLLD_INT32, src, R->comm, NULL);
            if (st == COLLD_OK)
                st = colld_comm_last_op(R->comm, &recv_op);
        }
        /* The small all-reduce's input is the first elements of the large buffer once the
         * receive is done: it must wait for it (the fast path waits for what is in flight). */
        if (st == COLLD_OK)
            st = colld_allreduce(large, small, MIXED_SMALL, COLLD_INT32, COLLD_SUM, R->comm, NULL);
        if (st == COLLD_OK)
            st = colld_allreduce(large, large, MIXED_LARGE, COLLD_INT32, COLLD_SUM, R->comm, NULL);
        if (st == COLLD_OK && recv_op)
            st = colld_op_wait(R->comm, recv_op);
        if (st == COLLD_OK)
            st = colld_comm_synchronize(R->comm);
        if (st != COLLD_OK) {
            fail(R, "mixed step %d: %s: %s", i, colld_status_name(st), colld_comm_last_error(R->comm));
            rc = 1;
            break;
        }
        for (int j = 0; j < MIXED_LARGE; j++) {
            int64_t sum = 0;
            for (int r = 0; r < n; r++)
                sum += (n > 1 && r == dst ? src : r) * 100000 + i * 10 + j;
            want[j] = (int32_t)sum;
        }
        if (memcmp(small, want, MIXED_SMALL * sizeof(int32_t)) != 0) {
            fail(R, "mixed step %d: small all-reduce (fast area) wrong: %d, want %d", i, small[0], want[0]);
            rc = 1;
        }
        if (memcmp(large, want, MIXED_LARGE * sizeof(int32_t)) != 0) {
            fail(R, "mixed step %d: large all-reduce wrong: %d, want %d", i, large[0], want[0]);
            rc = 1;
        }
        R->ops += 3;
    }
    free(want);
    return rc;
}

/* Rank a sends rank b cnt(a, b) elements; some pairs send nothing. */
static size_t a2av_count(int a, int b, unsigned step)
{
    unsigned v = ((unsigned)a * 7u + (unsigned)b * 3u + step) % 5u;
    return v == 0 ? 0 : v * 997u + (unsigned)a;
}

static int mode_alltoallv(run_t *R)
{
    int n = R->n, me = R->rank;
    size_t scount[MAX_RANKS_P2P], sdispl[MAX_RANKS_P2P], rcount[MAX_RANKS_P2P], rdispl[MAX_RANKS_P2P];
    const colld_dtype_t dts[] = { COLLD_INT8, COLLD_FLOAT16, COLLD_INT32, COLLD_FLOAT64 };
    for (unsigned step = 1; step <= 4; step++) {
        colld_dtype_t dt = dts[step - 1];
        size_t es = colld_dtype_size(dt), s_at = 0, r_at = 0;
        /* Packed send regions in peer order; receive regions in reverse peer order. */
        for (int q = 0; q < n; q++) {
            scount[q] = a2av_count(me, q, step);
            sdispl[q] = s_at;
            s_at += scount[q];
        }
        for (int q = n - 1; q >= 0; q--) {
            rcount[q] = a2av_count(q, me, step);
            rdispl[q] = r_at;
            r_at += rcount[q];
        }
        if ((s_at + r_at) * es + 4 * P2P_GUARD > R->reg_bytes)
            return fail(R, "regions too small"), 1;
        unsigned char *sb = p2p_slot(R->sreg, 0, s_at * es), *rb = p2p_slot(R->rreg, 0, r_at * es);
        for (int q = 0; q < n; q++)
            p2p_message(dt, me, q, step, 0, scount[q], sb + sdispl[q] * es);
        memset(rb, 0, r_at * es);
        colld_status_t st = colld_alltoallv(sb, scount, sdispl, rb, rcount, rdispl, dt, R->comm, NULL);
        if (st != COLLD_OK || sync_comm(R, "alltoallv") != COLLD_OK)
            return fail(R, "alltoallv step %u: %s: %s", step, colld_status_name(st), colld_comm_last_error(R->comm)), 1;
        bool ok = guards_ok(R, rb, r_at * es, "alltoallv receive") && guards_ok(R, sb, s_at * es, "alltoallv send");
        for (int q = 0; q < n; q++) {
            ok &= check_message(R, rb + rdispl[q] * es, dt, q, me, step, 0, rcount[q], "alltoallv receive");
            ok &= check_message(R, sb + sdispl[q] * es, dt, me, q, step, 0, scount[q], "alltoallv send buffer");
        }
        R->ops += 2 * n;
        if (!ok)
            return 1;
    }
    return 0;
}

/* The ring outside groups: send right, receive left, wait for both by id; exact data. */
static int mode_isend_ring(run_t *R)
{
    int n = R->n, me = R->rank, right = (me + 1) % n, left = (me + n - 1) % n;
    if (n < 2)
        return fail(R, "mode isend-ring needs 2 ranks or more"), 2;
    const colld_dtype_t dts[] = { COLLD_INT32, COLLD_FLOAT32, COLLD_BFLOAT16, COLLD_FLOAT64, COLLD_INT8 };
    const size_t counts[] = { 0, 1, 1001, 65537 };
    unsigned step = 200;
    for (size_t d = 0; d < COLLD_ARRAY_SIZE(dts); d++)
        for (size_t i = 0; i < COLLD_ARRAY_SIZE(counts); i++)
            for (int it = 0; it < COLLD_MAX(R->a->iters / 4, 1); it++) {
                colld_dtype_t dt = dts[d];
                size_t count = counts[i], bytes = count * colld_dtype_size(dt);
                if (bytes + 2 * P2P_GUARD > R->reg_bytes)
                    return fail(R, "regions too small"), 1;
                unsigned char *sb = p2p_slot(R->sreg, 0, bytes), *rb = p2p_slot(R->rreg, 0, bytes);
                p2p_message(dt, me, right, ++step, 0, count, sb);
                memset(rb, 0, bytes);
                uint64_t sop = 0, rop = 0;
                colld_status_t st = colld_send(sb, count, dt, right, R->comm, NULL);
                if (st == COLLD_OK)
                    st = colld_comm_last_op(R->comm, &sop);
                if (st == COLLD_OK)
                    st = colld_recv(rb, count, dt, left, R->comm, NULL);
                if (st == COLLD_OK)
                    st = colld_comm_last_op(R->comm, &rop);
                if (st == COLLD_OK)
                    st = colld_op_wait(R->comm, rop);
                if (st == COLLD_OK)
                    st = colld_op_wait(R->comm, sop);
                if (st != COLLD_OK)
                    return fail(R, "isend-ring dtype %d x %zu: %s: %s", (int)dt, count, colld_status_name(st),
                                colld_comm_last_error(R->comm)),
                           1;
                if (rop != sop + 1)
                    return fail(R, "isend-ring: operation ids %llu and %llu", (unsigned long long)sop,
                                (unsigned long long)rop),
                           1;
                bool ok = check_message(R, rb, dt, left, me, step, 0, count, "isend-ring receive") &&
                          check_message(R, sb, dt, me, right, step, 0, count, "isend-ring send buffer") &&
                          guards_ok(R, rb, bytes, "isend-ring receive") && guards_ok(R, sb, bytes, "isend-ring send");
                if (!ok)
                    return 1;
                R->ops += 2;
            }
    return 0;
}

/* Per-operation completion of a receive. */
static int mode_ops(run_t *R)
{
    if (R->n != 2 || !R->a->sync_dir)
        return fail(R, "mode ops needs 2 ranks and --sync-dir"), 1;
    char path[512];
    snprintf(path, sizeof(path), "%s/queried", R->a->sync_dir);
    size_t count = 5000;
    if (R->rank == 0) {
        if (harness_wait_file(path, 60000) < 0)
            return fail(R, "rank 1 never queried"), 1;
        p2p_message(COLLD_INT64, 0, 1, 3, 0, count, R->sreg);
        colld_status_t st = colld_send(R->sreg, count, COLLD_INT64, 1, R->comm, NULL);
        return st == COLLD_OK && sync_comm(R, "ops send") == COLLD_OK ? 0 : 1;
    }
    uint64_t op = 0;
    colld_status_t st = colld_recv(R->rreg, count, COLLD_INT64, 0, R->comm, NULL);
    if (st == COLLD_OK)
        st = colld_comm_last_op(R->comm, &op);
    if (st != COLLD_OK || op != 1)
        return fail(R, "recv: %s, op id %llu", colld_status_name(st), (unsigned long long)op), 1;
    colld_status_t q = colld_op_query(R->comm, op);
    FILE *f = fopen(path, "w");
    if (f)
        fclose(f);
    if (q != COLLD_INPROGRESS)
        return fail(R, "colld_op_query before the send: %s, want COLLD_INPROGRESS", colld_status_name(q)), 1;
    st = colld_op_wait(R->comm, op);
    if (st != COLLD_OK)
        return fail(R, "colld_op_wait: %s", colld_status_name(st)), 1;
    R->ops++;
    return check_message(R, R->rreg, COLLD_INT64, 0, 1, 3, 0, count, "ops receive") ? 0 : 1;
}

/* Whether the daemon's colld_ops_queued reached `want` within 60 s. */
static bool queued_in_daemon(int port, double want)
{
    double end = harness_now_ms() + 60000;
    while (harness_metric(port, "colld_ops_queued") < want) {
        if (harness_now_ms() > end)
            return false;
        usleep(5000);
    }
    return true;
}

/* A fault scene: every rank that takes part ends with the expected status. */
static int mode_call(run_t *R)
{
    const char *scene = R->a->scene ? R->a->scene : "";
    colld_status_t st = COLLD_OK;
    int me = R->rank;
    char posted[512], ready[512];
    snprintf(posted, sizeof(posted), "%s/posted", R->a->sync_dir ? R->a->sync_dir : ".");
    snprintf(ready, sizeof(ready), "%s/ready", R->a->sync_dir ? R->a->sync_dir : ".");
    bool hang = strcmp(scene, "hang") == 0;
    if (strcmp(scene, "never-sent") == 0 || hang) {
        /* Rank 1 goes on only once rank 0's receive is posted: in never-sent it all-reduces, so
         * that the receive is the first operation to time out; in hang it says it is ready to be
         * killed and waits for that. */
        if (me == 0) {
            st = colld_recv(R->rreg, 1024, COLLD_INT32, 1, R->comm, NULL);
            /* The daemon times the receive from when it takes the descriptor off the ring, the
             * fast area times the all-reduce from when rank 1 arrives: on a loaded machine the
             * daemon may take the receive later than rank 1 arrives unless rank 0 waits for it. */
            if (st == COLLD_OK && R->a->metrics_port > 0 && !queued_in_daemon(R->a->metrics_port, 1))
                return fail(R, "the receive never reached the daemon (colld_ops_queued)"), 1;
            FILE *f = fopen(posted, "w");
            if (f)
                fclose(f);
        } else {
            if (harness_wait_file(posted, 60000) < 0)
                return fail(R, "rank 0 never posted its receive"), 1;
            if (hang) {
                FILE *f = fopen(ready, "w");
                if (f)
                    fclose(f);
                for (;;)
                    pause(); /* killed by the test */
            }
            st = colld_allreduce(R->sreg, R->rreg, 4, COLLD_INT32, COLLD_SUM, R->comm, NULL);
        }
    } else if (strcmp(scene, "mismatch") == 0) {
        if (me == 0)
            st = colld_send(R->sreg, 100, COLLD_INT32, 1, R->comm, NULL);
        else if (me == 1)
            st = colld_recv(R->rreg, 50, COLLD_INT32, 0, R->comm, NULL);
    } else if (strcmp(scene, "crossed") == 0) {
        if (me < 2) {
            p2p_message(COLLD_FLOAT32, me, 1 - me, 5, 0, 64, R->sreg);
            memset(R->rreg, 0, 64 * sizeof(float));
            st = colld_send(R->sreg, 64, COLLD_FLOAT32, 1 - me, R->comm, NULL);
            if (st == COLLD_OK)
                st = colld_recv(R->rreg, 64, COLLD_FLOAT32, 1 - me, R->comm, NULL);
            if (st == COLLD_OK)
                st = colld_comm_synchronize(R->comm);
            if (st == COLLD_OK && !check_message(R, R->rreg, COLLD_FLOAT32, 1 - me, me, 5, 0, 64, "crossed receive"))
                return 1;
        }
    } else if (strcmp(scene, "sends-only") == 0) {
        if (me < 2)
            st = colld_send(R->sreg, 64, COLLD_FLOAT32, 1 - me, R->comm, NULL);
    } else {
        return fail(R, "unknown --scene %s", scene), 2;
    }
    if (st == COLLD_OK)
        st = colld_comm_synchronize(R->comm);
    if (me == 0)
        printf("%s\n", colld_comm_last_error(R->comm));
    if (strcmp(scene, "never-sent") == 0 && me >= 1 && st == COLLD_ERR_TIMEOUT)
        return 0; /* timed out in its all-reduce, as it should */
    if (me > 1 && strcmp(scene, "never-sent") != 0)
        return 0; /* not part of the scene */
    if (!R->a->expect || strcmp(colld_status_name(st), R->a->expect) != 0)
        return fail(R, "scene %s: %s (%s), want %s", scene, colld_status_name(st), colld_comm_last_error(R->comm),
                    R->a->expect ? R->a->expect : "--expect"),
               1;
    return 0;
}

/* A call that must be refused with `want` before anything is posted. */
static bool refused(run_t *R, const char *what, colld_status_t got, colld_status_t want, const char *needle)
{
    if (got != want)
        return fail(R, "%s: %s, want %s", what, colld_status_name(got), colld_status_name(want));
    if (needle && !strstr(colld_comm_last_error(R->comm), needle))
        return fail(R, "%s: detail \"%s\" lacks \"%s\"", what, colld_comm_last_error(R->comm), needle);
    return true;
}

static int mode_badargs(run_t *R)
{
    int n = R->n;
    bool ok = true;
    size_t counts[MAX_RANKS_P2P] = { 0 }, displs[MAX_RANKS_P2P] = { 0 };
    ok &= refused(R, "send to -1", colld_send(R->sreg, 4, COLLD_INT32, -1, R->comm, NULL), COLLD_ERR_INVALID_ARGUMENT,
                  "peer -1 is out of range");
    ok &= refused(R, "recv from n", colld_recv(R->rreg, 4, COLLD_INT32, n, R->comm, NULL), COLLD_ERR_INVALID_ARGUMENT,
                  "is out of range");
    ok &= refused(R, "send NULL", colld_send(NULL, 4, COLLD_INT32, 0, R->comm, NULL), COLLD_ERR_INVALID_ARGUMENT,
                  "sendbuf is NULL");
    ok &= refused(R, "recv NULL", colld_recv(NULL, 4, COLLD_INT32, 0, R->comm, NULL), COLLD_ERR_INVALID_ARGUMENT,
                  "recvbuf is NULL");
    ok &= refused(R, "bad dtype", colld_send(R->sreg, 4, (colld_dtype_t)99, 0, R->comm, NULL),
                  COLLD_ERR_INVALID_ARGUMENT, "unknown dtype");
    /* A stream makes a send stream-ordered (GPU buffers): refused here for want of a CUDA driver, or,
     * where one is found, because the buffer is host memory. */
    int fake_stream;
    colld_status_t on_stream = colld_send(R->sreg, 4, COLLD_INT32, 0, R->comm, &fake_stream);
    if (on_stream == COLLD_ERR_NOT_SUPPORTED)
        ok &= refused(R, "send on a stream", on_stream, COLLD_ERR_NOT_SUPPORTED, "need the CUDA driver");
    else
        ok &= refused(R, "send on a stream", on_stream, COLLD_ERR_INVALID_ARGUMENT, "is host memory");
    ok &= refused(R, "alltoallv NULL counts",
                  colld_alltoallv(R->sreg, NULL, displs, R->rreg, counts, displs, COLLD_INT32, R->comm, NULL),
                  COLLD_ERR_INVALID_ARGUMENT, "must not be NULL");
    for (int q = 0; q < n; q++)
        counts[q] = 10, displs[q] = (size_t)q * 10;
    ok &= refused(R, "alltoallv overlapping",
                  colld_alltoallv(R->sreg, counts, displs, R->sreg + 20, counts, displs, COLLD_INT32, R->comm, NULL),
                  COLLD_ERR_INVALID_ARGUMENT, "overlap");
    /* NULL with counts: refused before any address is made from it (NULL + a displacement is no
     * longer NULL, and was read as host memory). */
    for (int q = 0; q < n; q++)
        displs[q] = (size_t)q * 10 + 1;
    ok &= refused(R, "alltoallv NULL sendbuf",
                  colld_alltoallv(NULL, counts, displs, R->rreg, counts, displs, COLLD_INT32, R->comm, NULL),
                  COLLD_ERR_INVALID_ARGUMENT, "sendbuf is NULL");
    ok &= refused(R, "alltoallv NULL recvbuf",
                  colld_alltoallv(R->sreg, counts, displs, NULL, counts, displs, COLLD_INT32, R->comm, NULL),
                  COLLD_ERR_INVALID_ARGUMENT, "recvbuf is NULL");
    for (int q = 0; q < n; q++)
        displs[q] = (size_t)q * 10;
    displs[0] = SIZE_MAX / 2;
    ok &= refused(R, "alltoallv overflowing",
                  colld_alltoallv(R->sreg, counts, displs, R->rreg, counts, displs, COLLD_INT32, R->comm, NULL),
                  COLLD_ERR_INVALID_ARGUMENT, "overflows");
    /* More sends and receives in one group than the rings hold (256 entries by default): refused
     * at the end, nothing posted. */
    colld_status_t st = colld_group_start();
    for (int i = 0; i < 300 && st == COLLD_OK; i++)
        st = colld_send(R->sreg, 0, COLLD_INT32, R->rank, R->comm, NULL);
    colld_status_t end = colld_group_end();
    ok &= refused(R, "group of 300 sends", st == COLLD_OK ? end : st, COLLD_ERR_INVALID_USAGE,
                  "a group holds 300 sends and receives on one connection");
    uint64_t last = 1;
    if (colld_comm_last_op(R->comm, &last) != COLLD_OK || last != 0)
        ok = fail(R, "the refused calls were numbered: last operation id %llu", (unsigned long long)last);
    if (!ok)
        return 1;
    /* The communicator still works: a ring exchange. */
    return ring_step(R, COLLD_INT32, 1001, 99, true);
}

/* ---------------------------------------------------------------------------------------------
 * The program
 * ------------------------------------------------------------------------------------------- */

static int parse_args(int argc, char **argv, args_t *a)
{
    const harness_opt_t opts[] = {
        HARNESS_STR("socket", &a->socket),
        HARNESS_STR("uid", &a->uid_hex),
        HARNESS_INT("nranks", &a->nranks),
        HARNESS_INT("rank", &a->rank),
        HARNESS_STR("mode", &a->mode),
        HARNESS_STR("scene", &a->scene),
        HARNESS_INT("iters", &a->iters),
        HARNESS_INT("timeout-ms", &a->timeout_ms),
        HARNESS_STR("sync-dir", &a->sync_dir),
        HARNESS_STR("expect", &a->expect),
        HARNESS_INT("metrics-port", &a->metrics_port),
        HARNESS_CLEAR("no-big", &a->big),
        HARNESS_SET("malloc", &a->use_malloc),
        HARNESS_OUT,
    };
    if (HARNESS_PARSE_OPTS("p2p_rank", argc, argv, opts) != 0)
        return 2;
    if (!a->socket || !a->uid_hex || a->nranks < 1 || a->nranks > MAX_RANKS_P2P || a->rank < 0 ||
        a->rank >= a->nranks || a->iters < 0) {
        fprintf(stderr, "p2p_rank: need --socket, --uid, --nranks 1..%d, --rank\n", MAX_RANKS_P2P);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    args_t a = { .mode = "ring", .timeout_ms = 120000, .iters = 12, .big = true };
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc;
    run_t R = { .a = &a, .n = a.nranks, .rank = a.rank };
    double t0 = harness_now_ms();
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = a.timeout_ms;
    cfg.name = "test-p2p";
    if ((rc = harness_rank_join("p2p_rank", a.socket, a.uid_hex, a.nranks, a.rank, &cfg, &R.c, &R.comm)) != 0)
        return rc;
    R.reg_bytes = a.big ? 3 * (BIG_BYTES + 4096) : 4u << 20;
    if ((rc = harness_rank_buffers(R.c, a.rank, a.use_malloc, &R.reg_bytes, &R.sreg, &R.rreg)) != 0)
        goto out;
    if (strcmp(a.mode, "ring") == 0)
        rc = mode_ring(&R);
    else if (strcmp(a.mode, "pairs") == 0)
        rc = mode_pairs(&R);
    else if (strcmp(a.mode, "mixed") == 0)
        rc = mode_mixed(&R);
    else if (strcmp(a.mode, "alltoallv") == 0)
        rc = mode_alltoallv(&R);
    else if (strcmp(a.mode, "isend-ring") == 0)
        rc = mode_isend_ring(&R);
    else if (strcmp(a.mode, "ops") == 0)
        rc = mode_ops(&R);
    else if (strcmp(a.mode, "call") == 0)
        rc = mode_call(&R);
    else if (strcmp(a.mode, "badargs") == 0)
        rc = mode_badargs(&R);
    else {
        fprintf(stderr, "p2p_rank: unknown mode %s\n", a.mode);
        rc = 2;
    }
    if (a.rank == 0 && strcmp(a.mode, "call") != 0)
        fprintf(stderr, "rank 0/%d: mode %s%s: %ld operations, %ld wrong, %.0f ms\n", a.nranks, a.mode,
                a.use_malloc ? " (malloc)" : "", R.ops, R.bad, harness_now_ms() - t0);
out:
    harness_rank_end(R.c, R.comm, a.use_malloc, R.sreg, R.rreg);
    return rc;
}
