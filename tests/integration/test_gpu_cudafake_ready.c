/*
 * test_gpu_cudafake_ready.c - a ready slot per collective (issue 15 E1, E2, fixed): a later
 * collective's `ready` on another stream never stands for an earlier one, at most
 * COLLD_WIRE_GPU_READY_SLOTS collectives of a communicator posted and not yet launched, and an
 * aborted communicator's late `ready` writes never break the next one on the same handle. Groups
 * vmm and legacy (harness_gpu.h).
 */
#include "tests/integration/harness_gpu.h"

#include <stdio.h>
#include <string.h>

/* ============================================================================================
 * Readiness per collective (issue 15 E1, E2)
 *
 * Each stream-ordered collective has its own `ready` slot in the client's flag line (proto/wire.h):
 * a later collective's write, on another stream, never stands for an earlier one (E1), and a
 * broken communicator's write still queued on a stream never lands on top of the write of the
 * next communicator on the same handle (E2).
 * ========================================================================================== */

#define RS_N 16 /* int32 elements of the all-reduce whose inputs are made behind the gate */

/* Rank r's input element i, written by its stream behind the gate; the sum of both ranks. */
static int32_t rs_input(int rank, int i)
{
    return (rank + 1) * 1000 + i;
}

/* Wait, at most WAIT_MS, until the host word *w (a gate, a marker, a ready slot) holds v. */
static bool word_is(const uint32_t *w, uint32_t v)
{
    for (int i = 0; i < WAIT_MS / 5; i++) {
        if (w && __atomic_load_n(w, __ATOMIC_ACQUIRE) == v)
            return true;
        harness_wait_file("/nonexistent", 5);
    }
    return false;
}

/* Wait, at most WAIT_MS, until stream s has run everything: CUDA_ERROR_NOT_READY if it has not
 * (a regression; the stream is then left alone, never synchronized or destroyed). */
static CUresult stream_done(CUstream s)
{
    CUresult cr = CUDA_ERROR_NOT_READY;
    for (int i = 0; i < WAIT_MS / 5 && cr == CUDA_ERROR_NOT_READY; i++)
        if ((cr = cu->cuStreamQuery(s)) == CUDA_ERROR_NOT_READY)
            harness_wait_file("/nonexistent", 5);
    return cr;
}

/* E1: collective #2 goes on stream A behind a gate the application has not opened; behind the gate
 * A also writes #2's inputs. #3 goes on stream B, after a marker. Once B has got to #3 (the
 * marker) the daemon has 2 s to (wrongly) take #3's `ready` for #2's: the fixed daemon keeps both
 * in progress while A waits at the gate. Then the gate opens: #2 must reduce the inputs A wrote
 * behind it, exactly. Before the fix #2 and #3 completed at once, and #2 reduced the zeros its
 * input buffer held before the gate. */
static void sc_ready_slots(rank_t *r)
{
    CUstream b = NULL;
    CUdeviceptr gd = 0, md = 0, in = 0, out = 0;
    uint32_t *gate = gate_new(&gd), *mark = gate_new(&md);
    void *pin = NULL, *pout = NULL;
    int32_t host[RS_N];
    colld_status_t st;
    bool ok = gate && mark && cu->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
    if (!ok)
        rank_fail(r, "gate, marker or stream B");
    if (ok && ((st = colld_mem_alloc(r->c, &pin, RS_N * 4, COLLD_MEM_CUDA)) != COLLD_OK ||
               (st = colld_mem_alloc(r->c, &pout, RS_N * 4, COLLD_MEM_CUDA)) != COLLD_OK)) {
        rank_fail(r, "colld_mem_alloc(COLLD_MEM_CUDA): %s: %s", colld_status_name(st), colld_last_error(r->c));
        ok = false;
    }
    in = (CUdeviceptr)(uintptr_t)pin;
    out = (CUdeviceptr)(uintptr_t)pout;
    if (ok && (cu->cuMemsetD8(in, 0, RS_N * 4) != CUDA_SUCCESS || cu->cuMemsetD8(out, 0xff, RS_N * 4) != CUDA_SUCCESS ||
               cu->cuCtxSynchronize() != CUDA_SUCCESS)) {
        rank_fail(r, "clearing the buffers");
        ok = false;
    }
    /* #1 on B: sets up the flag area. */
    if (ok && (colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b) != COLLD_OK ||
               cu->cuStreamSynchronize(b) != CUDA_SUCCESS || colld_comm_synchronize(r->comm) != COLLD_OK)) {
        rank_fail(r, "the first collective failed: %s", colld_comm_last_error(r->comm));
        ok = false;
    }
    if (ok) {
        /* #2 on A: the gate, then its inputs, then the collective. */
        r->cr[0] = cu->cuStreamWaitValue32(r->s, gd, 1, CU_STREAM_WAIT_VALUE_EQ);
        for (int i = 0; i < RS_N && r->cr[0] == CUDA_SUCCESS; i++)
            r->cr[0] = cu->cuStreamWriteValue32(r->s, in + 4u * (unsigned)i, (uint32_t)rs_input(r->rank, i),
                                                CU_STREAM_WRITE_VALUE_DEFAULT);
        r->st[1] = colld_allreduce(pin, pout, RS_N, COLLD_INT32, COLLD_SUM, r->comm, r->s);
        /* #3 on B, after the marker. */
        if (cu->cuStreamWriteValue32(b, md, 1, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS)
            rank_fail(r, "the marker on stream B");
        r->st[2] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
        if (!word_is(mark, 1))
            rank_fail(r, "stream B never got to collective #3");
        colld_status_t q = COLLD_INPROGRESS;
        for (int i = 0; i < 400 && q == COLLD_INPROGRESS; i++) { /* 2 s for a wrong completion */
            if ((q = colld_comm_query(r->comm)) == COLLD_INPROGRESS)
                harness_wait_file("/nonexistent", 5);
        }
        r->st[3] = q;
        r->cr[1] = cu->cuStreamQuery(r->s); /* A still at the gate */
    }
    pthread_barrier_wait(r->barrier); /* both looked before either gate opens */
    if (gate)
        __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    if (ok) {
        r->cr[2] = stream_done(r->s);
        if (stream_done(b) != CUDA_SUCCESS)
            b = NULL; /* left waiting: leaked */
        r->st[0] = colld_comm_synchronize(r->comm);
        if (cu->cuMemcpyDtoH(host, out, sizeof(host)) != CUDA_SUCCESS)
            rank_fail(r, "reading the result");
        r->v[0] = 1;
        for (int i = 0; i < RS_N; i++)
            if (host[i] != rs_input(0, i) + rs_input(1, i)) {
                if (r->v[0])
                    print_message("rank %d: element %d of #2 is %d, not %d\n", r->rank, i, host[i],
                                  rs_input(0, i) + rs_input(1, i));
                r->v[0] = 0;
            }
    }
    pthread_barrier_wait(r->barrier); /* the daemon's kernels read both ranks' buffers */
    if (pout)
        colld_mem_free(r->c, pout);
    if (pin)
        colld_mem_free(r->c, pin);
    if (b)
        cu->cuStreamDestroy(b);
    if (gate)
        gate_free(gate);
    if (mark)
        gate_free(mark);
}

static void test_ready_slot_per_collective(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_ready_slots, 0, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].st[2], COLLD_OK);
        assert_int_equal(ranks[i].st[3], COLLD_INPROGRESS);     /* nothing completed while A waited ... */
        assert_int_equal(ranks[i].cr[1], CUDA_ERROR_NOT_READY); /* ... at the gate */
        assert_int_equal(ranks[i].cr[2], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].v[0], 1); /* #2 reduced the inputs made behind the gate, exactly */
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

/* E1, the bound: each rank has COLLD_WIRE_GPU_READY_SLOTS ready slots per communicator, so at most
 * that many stream-ordered collectives posted and not yet launched. #2 waits on stream A behind a
 * closed gate; #3 .. #33 go on stream B (every other slot); #34 needs #2's slot, which the daemon
 * has not taken: its post must wait rather than overwrite it, and end when the communicator does
 * (the daemon times #2 out, naming rank's A) with COLLD_ERR_TIMEOUT and nothing enqueued. Before the
 * fix every post went through and #2 .. #34 completed while A waited at the gate. */
static void sc_slot_bound(rank_t *r)
{
    CUstream b = NULL;
    CUdeviceptr gd = 0;
    uint32_t *gate = gate_new(&gd);
    bool ok = gate && cu->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
    if (!ok)
        rank_fail(r, "gate or stream B");
    if (ok && (colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b) != COLLD_OK ||
               cu->cuStreamSynchronize(b) != CUDA_SUCCESS || colld_comm_synchronize(r->comm) != COLLD_OK)) {
        rank_fail(r, "the first collective failed: %s", colld_comm_last_error(r->comm));
        ok = false;
    }
    if (ok) {
        r->cr[0] = cu->cuStreamWaitValue32(r->s, gd, 1, CU_STREAM_WAIT_VALUE_EQ);
        r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s); /* #2 */
        for (int i = 3; i < 3 + (int)COLLD_WIRE_GPU_READY_SLOTS - 1 && r->st[1] == COLLD_OK; i++, r->v[0]++)
            r->st[1] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b); /* #3 .. #33 */
        r->st[2] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);     /* #34 */
        snprintf(r->detail, sizeof(r->detail), "%s", colld_comm_last_error(r->comm));
        r->cr[1] = cu->cuStreamQuery(r->s); /* still at the gate */
    }
    pthread_barrier_wait(r->barrier);
    if (gate)
        __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    if (ok) {
        r->cr[2] = stream_released(r);
        if (cu->cuStreamSynchronize(b) == CUDA_SUCCESS)
            cu->cuStreamDestroy(b);
    }
    if (gate && r->s)
        gate_free(gate);
}

static void test_ready_slots_bound(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_slot_bound, SHORT_TIMEOUT_MS, ranks);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].cr[0], CUDA_SUCCESS);
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
        assert_int_equal(ranks[i].v[0], COLLD_WIRE_GPU_READY_SLOTS - 1); /* #3 .. #33 posted */
        assert_int_equal(ranks[i].st[2], COLLD_ERR_TIMEOUT);             /* #34 waited until the break */
        assert_non_null(strstr(ranks[i].detail, "stream-ordered collective #34 not posted: the communicator "
                                                "failed (COLLD_ERR_TIMEOUT)"));
        assert_int_equal(ranks[i].cr[1], CUDA_ERROR_NOT_READY); /* nothing ran while A waited */
        assert_int_equal(ranks[i].cr[2], CUDA_SUCCESS);         /* every stream released */
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

/* E2: rank 0 posts communicator X's collectives #2 and #3 alone, on streams A1 and A2 behind closed
 * gates: their `ready` writes (slots 2 and 3) stay queued. Rank 0 aborts X, both destroy it, and a
 * new communicator Y gets the same handles (the same flag lines).
 *   Y #1: rank 0 posts it on stream B; once its `ready` write has landed, gate 1 opens and X #2's
 *         write lands after it; only then does rank 1 post Y #1, so that the daemon looks at rank
 *         0's line after both writes. Before the fix X's late write took the line's only `ready`
 *         word back below Y #1's value: Y #1 timed out and Y broke.
 *   Y #2: in slot 2, where X #2's write landed.
 *   Y #3: in slot 3, where X #3's write is still queued: rank 0's post must wait for it to land
 *         rather than write the slot first. A helper opens gate 2 once Y #3's write has landed in
 *         the slot (what a client without that wait does: X #3's write then lands on top of it and
 *         Y #3 times out), or after a second (the fixed client is still waiting in the post).
 * Every collective of Y must complete. */
static colld_unique_id_t reuse_id; /* Y's, from rank 0 */

typedef struct {
    uint32_t *gate;
    const uint32_t *word; /* Y #3's ready slot */
    uint32_t value;
    bool landed; /* Y #3's write landed before the gate opened */
} late_gate_t;

static void *late_gate_thread(void *arg)
{
    late_gate_t *lg = arg;
    for (int i = 0; i < 200 && !lg->landed; i++) {
        lg->landed = __atomic_load_n(lg->word, __ATOMIC_ACQUIRE) == lg->value;
        if (!lg->landed)
            harness_wait_file("/nonexistent", 5);
    }
    __atomic_store_n(lg->gate, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* A count-0 all-reduce of Y on stream b, waited for: into st, COLLD_OK when it ran. */
static void y_collective(rank_t *r, CUstream b, colld_status_t *st)
{
    *st = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
    if (*st == COLLD_OK && stream_done(b) != CUDA_SUCCESS)
        rank_fail(r, "stream B failed");
    if (*st == COLLD_OK)
        *st = colld_comm_synchronize(r->comm);
}

static void sc_handle_reuse(rank_t *r)
{
    CUstream b = NULL, a2 = NULL;
    CUdeviceptr gd[2] = { 0, 0 };
    uint32_t *gate[2] = { NULL, NULL };
    bool ok = cu->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
    if (r->rank == 0)
        ok = ok && (gate[0] = gate_new(&gd[0])) && (gate[1] = gate_new(&gd[1])) &&
             cu->cuStreamCreate(&a2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
    if (!ok)
        rank_fail(r, "gates or streams");
    /* X #1 (the flag area, slot 1), then rank 0's X #2 and #3 behind the gates. */
    if (ok && (colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s) != COLLD_OK ||
               cu->cuStreamSynchronize(r->s) != CUDA_SUCCESS || colld_comm_synchronize(r->comm) != COLLD_OK)) {
        rank_fail(r, "X's first collective failed: %s", colld_comm_last_error(r->comm));
        ok = false;
    }
    uint32_t handle = r->comm->handle;
    if (ok && r->rank == 0 &&
        (cu->cuStreamWaitValue32(r->s, gd[0], 1, CU_STREAM_WAIT_VALUE_EQ) != CUDA_SUCCESS ||
         colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, r->s) != COLLD_OK ||
         cu->cuStreamWaitValue32(a2, gd[1], 1, CU_STREAM_WAIT_VALUE_EQ) != CUDA_SUCCESS ||
         colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, a2) != COLLD_OK)) {
        rank_fail(r, "X #2 and #3 behind the gates");
        ok = false;
    }
    pthread_barrier_wait(r->barrier);
    if (r->rank == 0 && colld_comm_abort(r->comm) != COLLD_OK)
        rank_fail(r, "colld_comm_abort of X");
    pthread_barrier_wait(r->barrier);
    colld_comm_destroy(r->comm);
    r->comm = NULL;
    if (r->rank == 0 && colld_get_unique_id(r->c, &reuse_id) != COLLD_OK)
        rank_fail(r, "a unique id for Y");
    pthread_barrier_wait(r->barrier); /* X is gone on both ranks; Y's id is there */
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = SHORT_TIMEOUT_MS; /* before the fix Y #1 times out: not after 30 s */
    colld_status_t st = colld_comm_init_rank(r->c, &r->comm, 2, reuse_id, r->rank, &cfg);
    if (st != COLLD_OK) {
        rank_fail(r, "colld_comm_init_rank of Y: %s", colld_status_name(st));
        r->comm = NULL;
        ok = false;
    }
    r->v[0] = r->comm && r->comm->handle == handle; /* the same flag line */
    if (ok && r->rank == 0) {
        r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
        if (r->st[0] == COLLD_OK && !word_is(colld__gpu_ready_word(r->comm, 1), r->comm->gpu_base + 1))
            rank_fail(r, "Y #1's ready write never landed");
        __atomic_store_n(gate[0], 1, __ATOMIC_RELEASE); /* X #2's write lands now, after Y #1's */
        r->cr[0] = stream_done(r->s);                   /* it has (its wait was released at the abort) */
    }
    pthread_barrier_wait(r->barrier);
    if (ok && r->rank == 1)
        r->st[0] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
    if (ok && r->st[0] == COLLD_OK && stream_done(b) == CUDA_SUCCESS)
        r->st[0] = colld_comm_synchronize(r->comm); /* Y #1 */
    if (ok && r->st[0] == COLLD_OK)
        y_collective(r, b, &r->st[1]); /* Y #2 */
    /* Y #3: rank 0 first (with the helper), then rank 1 once X #3's write has landed. */
    bool y3 = ok && r->st[1] == COLLD_OK;
    if (y3 && r->rank == 0) {
        late_gate_t lg = { .gate = gate[1], .word = colld__gpu_ready_word(r->comm, 3), .value = r->comm->gpu_base + 3 };
        pthread_t t;
        bool helper = lg.word && pthread_create(&t, NULL, late_gate_thread, &lg) == 0;
        if (!helper)
            rank_fail(r, "the gate helper");
        r->st[2] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
        if (helper)
            pthread_join(t, NULL);
        r->v[1] = lg.landed;
        r->cr[1] = stream_done(a2); /* X #3's write landed, its wait released */
    }
    pthread_barrier_wait(r->barrier);
    if (y3 && r->rank == 1)
        r->st[2] = colld_allreduce(NULL, NULL, 0, COLLD_FLOAT32, COLLD_SUM, r->comm, b);
    if (y3 && r->st[2] == COLLD_OK && stream_done(b) == CUDA_SUCCESS)
        r->st[2] = colld_comm_synchronize(r->comm);
    for (int i = 0; i < 2; i++)
        if (gate[i])
            __atomic_store_n(gate[i], 1, __ATOMIC_RELEASE); /* whatever happened, rank 0's streams go on */
    pthread_barrier_wait(r->barrier);
    /* A stream still waiting (a regression: an earlier communicator's wait that the releases of
     * later ones took more than 2^31 past) is left alone, with its gate: a failure, not a hang. */
    bool drained = true;
    CUstream *mine[3] = { &b, &a2, &r->s };
    for (int i = 0; i < 3; i++) {
        if (*mine[i] && stream_done(*mine[i]) != CUDA_SUCCESS) {
            rank_fail(r, "rank %d's stream %d still waits after %d ms", r->rank, i, WAIT_MS);
            *mine[i] = NULL;
            drained = false;
        }
    }
    if (b)
        cu->cuStreamDestroy(b);
    if (a2)
        cu->cuStreamDestroy(a2);
    for (int i = 0; i < 2 && drained; i++)
        if (gate[i])
            gate_free(gate[i]);
}

static void test_handle_reuse_late_ready_write(void **state)
{
    rank_t ranks[2];
    run_ranks(*state, sc_handle_reuse, 0, ranks);
    assert_int_equal(ranks[0].cr[0], CUDA_SUCCESS); /* X #2's write landed, its wait released */
    assert_int_equal(ranks[0].cr[1], CUDA_SUCCESS); /* X #3's too */
    assert_int_equal(ranks[0].v[1], 0);             /* Y #3's post waited for X #3's write */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].v[0], 1);         /* Y on X's handle */
        assert_int_equal(ranks[i].st[0], COLLD_OK); /* Y #1: not broken by X #2's late write */
        assert_int_equal(ranks[i].st[1], COLLD_OK); /* Y #2, in the slot X #2's write landed in */
        assert_int_equal(ranks[i].st[2], COLLD_OK); /* Y #3, in the slot X #3's write was queued for */
    }
    assert_int_equal(harness_wait_clean(*state, 10000), 0);
}

gpu_cases_t gpu_ready_cases(const char *group)
{
    static const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ready_slot_per_collective, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_ready_slots_bound, setup_on_double, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_handle_reuse_late_ready_write, setup_on_double, harness_test_teardown),
    };
    static const char *const groups[] = { "vmm", "legacy", NULL };
    return group_is(group, groups) ? GPU_CASES(tests) : GPU_NO_CASES;
}
