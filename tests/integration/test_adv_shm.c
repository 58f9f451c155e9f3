/*
 * test_adv_shm.c - a hostile tenant writes the shared memory it maps read-write (its
 * communicator's fast area) while a real colld serves it: the daemon must never compute an address
 * from those bytes, must not crash, and must keep serving every tenant (issue 13, #1).
 *
 * The attacker is a rank of this process (the library's own mapping of the area, reached through
 * client_internal.h): it scribbles the area's header, then its peer posts a collective that makes
 * the daemon look at every rank's slots. The session rings are shared memory too: a client that
 * leaves its completions unread must not make the engine spin (#10), and a descriptor's offsets
 * must suit its element type (#16).
 */
#include "client/client_internal.h"
#include "transport/shm/ring.h"
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
#include <unistd.h>

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
        harness_rank_t j[2];
        assert_int_equal(harness_join_ranks("scribble", h->socket, j, 2, 1000, NULL, NULL), 0);
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
        harness_leave_ranks(j, 2);
    }
    assert_daemon_serves(h);
    assert_int_equal(harness_wait_clean(h, 5000), 0);
}

/* A one-rank communicator of the driver's own client (no peer can block it). */
static colld_comm_t *solo_comm(harness_t *h)
{
    colld_unique_id_t id;
    colld_comm_t *comm = NULL;
    assert_int_equal(colld_get_unique_id(h->client, &id), COLLD_OK);
    assert_int_equal(colld_comm_init_rank(h->client, &comm, 1, id, 0, NULL), COLLD_OK);
    return comm;
}

/* #16: a descriptor whose buffer offset is not a multiple of its element size. The daemon's
 * kernels load whole elements (UBSan aborted the daemon on a misaligned float16 load); it now
 * refuses the descriptor, naming the offset. Through the API, memory of colld_mem_alloc at a
 * misaligned address is staged and the result is exact. */
static void test_misaligned_offset(void **state)
{
    harness_t *h = *state;
    colld_comm_t *comm = solo_comm(h);
    uint8_t *buf;
    assert_int_equal(colld_mem_alloc(h->client, (void **)&buf, 8192, COLLD_MEM_HOST), COLLD_OK);
    colld_wire_sqe_t sqe;
    memset(&sqe, 0, sizeof(sqe));
    pthread_mutex_lock(&h->client->mu);
    assert_int_equal(colld__client_lookup(h->client, buf + 1, 4096, &sqe.send), 0);
    pthread_mutex_unlock(&h->client->mu);
    sqe.recv = sqe.send;
    sqe.seq = ++comm->seq;
    sqe.count = 2048;
    sqe.comm = comm->handle;
    sqe.kind = COLLD_KIND_ALLREDUCE;
    sqe.dtype = COLLD_FLOAT16;
    sqe.redop = COLLD_SUM;
    assert_int_equal(colld__client_submit(h->client, &sqe, 1), COLLD_OK);
    comm->issued++;
    assert_int_equal(colld_comm_synchronize(comm), COLLD_ERR_INVALID_ARGUMENT);
    print_message("%s\n", colld_comm_last_error(comm));
    assert_non_null(strstr(colld_comm_last_error(comm), "offset 1 is not a multiple of the element size (2 bytes)"));
    colld_comm_destroy(comm);

    /* Send and recv overlapping without being in place: the host backend would copy between
     * overlapping ranges (ASan stopped the daemon in the fuzzer); refused, naming both. */
    comm = solo_comm(h);
    sqe.seq = ++comm->seq;
    sqe.comm = comm->handle;
    sqe.send.offset = 0;
    sqe.recv.offset = 8;
    sqe.count = 512;
    sqe.kind = COLLD_KIND_BROADCAST;
    sqe.dtype = COLLD_FLOAT32;
    sqe.root = 0;
    assert_int_equal(colld__client_submit(h->client, &sqe, 1), COLLD_OK);
    comm->issued++;
    assert_int_equal(colld_comm_synchronize(comm), COLLD_ERR_INVALID_ARGUMENT);
    print_message("%s\n", colld_comm_last_error(comm));
    assert_non_null(strstr(colld_comm_last_error(comm), "send (offset 0, 2048 bytes) and recv (offset 8, 2048 bytes) "
                                                        "overlap without being in place"));
    colld_comm_destroy(comm);

    /* The same misaligned memory through the API: staged, exact. */
    comm = solo_comm(h);
    float *f = (float *)(void *)(buf + 2); /* 2 mod 4: misaligned for float32 */
    const unsigned n = 1000;               /* 4000 bytes: the engine path, not the fast area */
    float in[1000];
    for (unsigned i = 0; i < n; i++)
        in[i] = (float)i;
    memcpy(f, in, sizeof(in));
    colld_status_t st = colld_allreduce(f, f, n, COLLD_FLOAT32, COLLD_SUM, comm, NULL);
    if (st == COLLD_OK)
        st = colld_comm_synchronize(comm);
    assert_int_equal(st, COLLD_OK);
    float out[1000];
    memcpy(out, f, sizeof(out));
    assert_memory_equal(out, in, sizeof(in)); /* one rank: the sum is its input */
    colld_comm_destroy(comm);
    assert_int_equal(colld_mem_free(h->client, buf), COLLD_OK);
    assert_daemon_serves(h);
}

/* CPU time (user + system) of a process so far, in milliseconds. */
static double cpu_ms(pid_t pid)
{
    char path[64], text[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    harness_read_file(path, text, sizeof(text));
    const char *p = strrchr(text, ')'); /* the command name may hold spaces */
    unsigned long long ut = 0, st = 0;
    assert_non_null(p);
    /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st), 2);
    return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

/* Post one raw all-reduce of nothing (count 0: the engine path, no buffer) on a communicator. */
static void post_empty(colld_client_t *c, colld_comm_t *comm)
{
    colld_wire_sqe_t sqe;
    memset(&sqe, 0, sizeof(sqe));
    sqe.seq = ++comm->seq;
    sqe.comm = comm->handle;
    sqe.kind = COLLD_KIND_ALLREDUCE;
    sqe.dtype = COLLD_FLOAT32;
    sqe.redop = COLLD_SUM;
    pthread_mutex_lock(&c->mu);
    c->sqes[c->sq_head & (c->entries - 1)] = sqe;
    c->sq_head++;
    COLLD_STORE_SC(&c->shm->sq.head, c->sq_head);
    uint64_t one = 1;
    if (COLLD_LOAD_SC(&c->shm->sq.need_wakeup) && write(c->efd, &one, sizeof(one)) < 0)
        fail_msg("cannot wake the daemon");
    pthread_mutex_unlock(&c->mu);
}

/* Wait until the daemon has taken `n` descriptors of the client in all (its sq tail). */
static void wait_taken(colld_client_t *c, uint64_t n)
{
    double end = harness_now_ms() + 10000;
    while (COLLD_LOAD_ACQ(&c->shm->sq.tail) < n && harness_now_ms() < end)
        usleep(1000);
    assert_true(COLLD_LOAD_ACQ(&c->shm->sq.tail) >= n);
}

/* #10: a client whose completion ring is full (it posted a ring's worth of asynchronous work and
 * is computing, not reading completions) with more descriptors queued. The engine spun at 100 %
 * of a core until the client left; now it sleeps until the client reads completions, then takes
 * the rest at once. */
static void test_full_completion_ring_no_spin(void **state)
{
    harness_t *h = *state;
    colld_client_t *c;
    assert_int_equal(colld_connect(h->socket, &c), COLLD_OK);
    colld_unique_id_t id;
    colld_comm_t *comm = NULL;
    assert_int_equal(colld_get_unique_id(c, &id), COLLD_OK);
    assert_int_equal(colld_comm_init_rank(c, &comm, 1, id, 0, NULL), COLLD_OK);
    uint32_t entries = c->entries;
    for (uint32_t i = 0; i < entries; i++)
        post_empty(c, comm);
    wait_taken(c, entries); /* all completed: the completion ring is full, nobody reads it */
    for (uint32_t i = 0; i < entries / 2; i++)
        post_empty(c, comm);
    usleep(100000); /* past the engine's busy-poll (spin-us) */
    double t0 = harness_now_ms(), c0 = cpu_ms(h->pid);
    usleep(1000000);
    double used = cpu_ms(h->pid) - c0, wall = harness_now_ms() - t0;
    print_message("daemon CPU while the client computes: %.0f ms in %.0f ms\n", used, wall);
    assert_true(used < wall * 0.2); /* it spun a whole core before */
    assert_int_equal(COLLD_LOAD_ACQ(&c->shm->sq.tail), (uint64_t)entries); /* nothing more taken */

    /* The client reads its completions: the daemon is woken and takes the rest. */
    colld__client_poll(c);
    wait_taken(c, entries + entries / 2);
    double end = harness_now_ms() + 10000;
    uint64_t done = 0;
    while (harness_now_ms() < end && (done = __atomic_load_n(&comm->completed, __ATOMIC_ACQUIRE)) < entries * 3 / 2) {
        colld__client_poll(c);
        usleep(1000);
    }
    assert_int_equal(done, entries * 3 / 2);
    colld_status_t err;
    assert_int_equal(colld_comm_get_async_error(comm, &err), COLLD_OK);
    assert_int_equal(err, COLLD_OK);
    colld_comm_destroy(comm);
    colld_disconnect(c);
    assert_daemon_serves(h);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fast_area_header_scribbled, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_misaligned_offset, harness_test_setup, harness_test_teardown),
        cmocka_unit_test_setup_teardown(test_full_completion_ring_no_spin, harness_test_setup, harness_test_teardown),
    };
    return cmocka_run_group_tests_name("adv_shm", tests, NULL, NULL);
}
