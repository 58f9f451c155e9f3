/*
 * test_ring.c - the shared-memory ring counters and the futex doorbell (transport/shm/ring.h): normal
 * use across wrap-around, corrupt counters detected, and a sleeper woken by the doorbell.
 */
#include "transport/shm/ring.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#define ENTRIES 8u

static void test_push_pop_wraps(void **state)
{
    (void)state;
    colld_wire_ring_t r;
    memset(&r, 0, sizeof(r));
    uint64_t slots[ENTRIES];
    uint64_t head = 0, tail = 0, next_value = 0, expect = 0;
    assert_int_equal(colld_ring_avail(&r, tail, ENTRIES), 0);
    assert_int_equal(colld_ring_space(&r, head, ENTRIES), ENTRIES);
    for (int round = 0; round < 5 * (int)ENTRIES; round++) {
        int64_t space = colld_ring_space(&r, head, ENTRIES);
        for (int64_t i = 0; i < space && i < 3; i++) {
            slots[head & (ENTRIES - 1)] = next_value++;
            head++;
            COLLD_STORE_REL(&r.head, head);
        }
        int64_t avail = colld_ring_avail(&r, tail, ENTRIES);
        assert_true(avail >= 0 && avail <= (int64_t)ENTRIES);
        for (int64_t i = 0; i < avail && i < 2; i++) {
            assert_int_equal(slots[tail & (ENTRIES - 1)], expect++);
            tail++;
            COLLD_STORE_REL(&r.tail, tail);
        }
    }
    assert_true(head > 3 * ENTRIES); /* the counters wrapped the array several times */
}

static void test_corrupt_counters_detected(void **state)
{
    (void)state;
    colld_wire_ring_t r;
    memset(&r, 0, sizeof(r));
    r.head = 100 + ENTRIES + 1; /* a producer claiming more than the ring holds */
    assert_int_equal(colld_ring_avail(&r, 100, ENTRIES), -1);
    r.head = 50; /* behind the consumer */
    assert_int_equal(colld_ring_avail(&r, 100, ENTRIES), -1);
    r.head = 100 + ENTRIES; /* exactly full is fine */
    assert_int_equal(colld_ring_avail(&r, 100, ENTRIES), ENTRIES);
    r.tail = 200; /* a consumer ahead of the producer */
    assert_int_equal(colld_ring_space(&r, 100, ENTRIES), -1);
    r.tail = 100 - ENTRIES - 1; /* a consumer further behind than the ring is long */
    assert_int_equal(colld_ring_space(&r, 100, ENTRIES), -1);
    r.tail = 100 - ENTRIES;
    assert_int_equal(colld_ring_space(&r, 100, ENTRIES), 0);
}

static colld_wire_ring_t bell;

/* The consumer's side of the doorbell protocol, as libcolld waits for completions. */
static void *sleeper(void *arg)
{
    (void)arg;
    while (COLLD_LOAD_ACQ(&bell.head) == 0) {
        uint32_t v = COLLD_LOAD_SC(&bell.doorbell);
        __atomic_add_fetch(&bell.waiters, 1, __ATOMIC_SEQ_CST);
        if (COLLD_LOAD_SC(&bell.head) == 0)
            colld_futex_wait(&bell.doorbell, v, 5000000000ull);
        __atomic_sub_fetch(&bell.waiters, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static void test_doorbell_wakes_sleeper(void **state)
{
    (void)state;
    memset(&bell, 0, sizeof(bell));
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, sleeper, NULL), 0);
    while (COLLD_LOAD_SC(&bell.waiters) == 0) /* wait until it sleeps */
        sched_yield();
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    COLLD_STORE_REL(&bell.head, 1);
    colld_doorbell_ring(&bell);
    pthread_join(t, NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
    assert_true(ms < 2000); /* woken, not the 5 s time-out */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_pop_wraps),
        cmocka_unit_test(test_corrupt_counters_detected),
        cmocka_unit_test(test_doorbell_wakes_sleeper),
    };
    return cmocka_run_group_tests_name("ring", tests, NULL, NULL);
}
