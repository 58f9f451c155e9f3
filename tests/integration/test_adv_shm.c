/*
 * test_adv_shm.c - a hostile tenant writes the shared memory it maps read-write (its
 * communicator's fast area) while a real colld serves it: the daemon must never compute an address
 * from those bytes, must not crash, and must keep serving every tenant (issue 13, #1).
 *
 * The attacker is a rank of this process (the library's own mapping of the area, reached through
 * client_internal.h): it scribbles the area's header, then its peer posts a collective that makes
 * the daemon look at every rank's slots.
 */
#include "client/client_internal.h"
#include "common/util.h"
#include "tests/integration/harness.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define LARGE_COUNT (64u * 1024) /* 256 KiB of floats: through the engine, not the fast area */

/* A real 2-rank all-reduce by two new processes: proof the daemon still serves others. */
static void assert_daemon_serves(harness_t *h)
{
    pid_t pids[2];
    const char *extra[] = { "--counts", "1,1000,100000", NULL };
    assert_int_equal(harness_spawn_ranks(h, 2, extra, pids), 0);
    assert_int_equal(harness_wait_all(pids, 2, 60000), 0);
}

typedef struct {
    harness_t *h;
    colld_client_t *client;
    colld_unique_id_t id;
    int rank;
    colld_comm_t *comm;
    colld_status_t st;
} joiner_t;

static void *join_main(void *arg)
{
    joiner_t *j = arg;
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.timeout_ms = 1000;
    j->st = colld_comm_init_rank(j->client, &j->comm, 2, j->id, j->rank, &cfg);
    return NULL;
}

/* Two ranks of one communicator in this process, each on its own connection. */
static void join_two(harness_t *h, joiner_t j[2])
{
    pthread_t t[2];
    colld_unique_id_t id;
    assert_int_equal(colld_get_unique_id(h->client, &id), COLLD_OK);
    for (int i = 0; i < 2; i++) {
        j[i] = (joiner_t){ .h = h, .id = id, .rank = i };
        assert_int_equal(colld_connect(h->socket, &j[i].client), COLLD_OK);
        assert_int_equal(pthread_create(&t[i], NULL, join_main, &j[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(j[i].st, COLLD_OK);
    }
}

/* The header fields a member can write, set to values that would send a daemon computing slot
 * addresses from them anywhere in its address space. */
static void scribble_header(colld_wire_fast_t *f, uint32_t stride, uint32_t nranks)
{
    __atomic_store_n(&f->slot_stride, stride, __ATOMIC_RELAXED);
    __atomic_store_n(&f->nranks, nranks, __ATOMIC_RELAXED);
    __atomic_store_n(&f->slot_bytes, 0xffffffffu, __ATOMIC_RELAXED);
    __atomic_store_n(&f->total_size, ~0ull, __ATOMIC_RELAXED);
    __atomic_store_n(&f->magic, 0xdeadbeefu, __ATOMIC_RELAXED);
}

/* #1: rank 1 writes the fast area's slot_stride (and the rest of the header); rank 0 posts an
 * engine collective, so the daemon reads rank 1's slots to see where it stands. Before the fix the
 * daemon computed the slot address from slot_stride and died with SIGSEGV (a huge stride) or read
 * and atomically wrote inside other mappings (a small one). Now it uses its own layout: rank 0
 * gets a time-out naming rank 1, and the daemon keeps serving. */
static void test_fast_area_header_scribbled(void **state)
{
    harness_t *h = *state;
    static const uint32_t strides[] = { 0xffffffc0u, 0x40u, 0x0u, 0x7fffffc0u };
    for (size_t t = 0; t < COLLD_ARRAY_SIZE(strides); t++) {
        joiner_t j[2];
        join_two(h, j);
        colld_comm_t *victim = j[0].comm, *attacker = j[1].comm;
        assert_non_null(attacker->fast); /* a single-node communicator has a fast area by default */
        scribble_header(attacker->fast, strides[t], 1000);

        float *buf = NULL;
        assert_int_equal(colld_mem_alloc(j[0].client, (void **)&buf, LARGE_COUNT * sizeof(float), COLLD_MEM_HOST),
                         COLLD_OK);
        for (unsigned i = 0; i < LARGE_COUNT; i++)
            buf[i] = 1.0f;
        colld_status_t st = colld_allreduce(buf, buf, LARGE_COUNT, COLLD_FLOAT32, COLLD_SUM, victim, NULL);
        if (st == COLLD_OK)
            st = colld_comm_synchronize(victim);
        print_message("stride 0x%x: %s: %s\n", strides[t], colld_status_name(st), colld_comm_last_error(victim));
        assert_int_equal(st, COLLD_ERR_TIMEOUT);
        assert_non_null(strstr(colld_comm_last_error(victim), "rank(s) 1 never arrived"));

        /* The attacker's own library kept its validated copy of the layout: a small collective of
         * its own neither crashes it nor runs off the area (the communicator is broken, so it
         * fails cleanly). */
        float x = 1.0f;
        st = colld_allreduce(&x, &x, 1, COLLD_FLOAT32, COLLD_SUM, attacker, NULL);
        if (st == COLLD_OK)
            st = colld_comm_synchronize(attacker);
        assert_int_not_equal(st, COLLD_OK);

        assert_int_equal(colld_mem_free(j[0].client, buf), COLLD_OK);
        for (int i = 0; i < 2; i++) {
            colld_comm_destroy(j[i].comm);
            colld_disconnect(j[i].client);
        }
    }
    assert_daemon_serves(h);
    assert_int_equal(harness_wait_clean(h, 5000), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fast_area_header_scribbled, harness_test_setup, harness_test_teardown),
    };
    return cmocka_run_group_tests_name("adv_shm", tests, NULL, NULL);
}
