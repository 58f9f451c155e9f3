/*
 * test_gpu_cudafake_release.c - the daemon's driver calls that unpin or unmap memory run outside
 * its lock (issue 15 F4): while the daemon's double holds its cuMemUnmap (a VMM registration let
 * go), cuIpcCloseMemHandle (a legacy IPC one) or cuMemHostUnregister (a session's flag area), a
 * host-only communicator, which needs the daemon's lock at every step, still runs exactly. Groups
 * vmm and legacy (harness_gpu.h).
 */
#include "tests/integration/harness_gpu.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define HELD_UNMAP "# held: cuMemUnmap call #1"
#define HELD_IPC_CLOSE "# held: cuIpcCloseMemHandle call #1"
#define HELD_UNREGISTER "# held: cuMemHostUnregister call #1"

/* A case that waits for the daemon must not hang when a regression makes the held call block the
 * daemon's lock: after WAIT_MS the watchdog lets every held call go (again and again) and says so. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    bool fired;
} watchdog_t;

static void *watchdog_main(void *arg)
{
    watchdog_t *w = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_MS / 1000;
    pthread_mutex_lock(&w->mu);
    while (!w->done && pthread_cond_timedwait(&w->cv, &w->mu, &until) == 0)
        ;
    while (!w->done) {
        w->fired = true;
        pthread_mutex_unlock(&w->mu);
        control_append("release:hold");
        harness_wait_file("/nonexistent", 100);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* A host-only communicator's all-reduce while the daemon holds a driver call: exact, and within
 * WAIT_MS (the watchdog has not had to let the call go). */
static void host_while_held(harness_t *h, watchdog_t *w, const char *held)
{
    rank_t ranks[2];
    double t0 = harness_now_ms();
    run_ranks(h, sc_host, 0, ranks);
    double ms = harness_now_ms() - t0;
    pthread_mutex_lock(&w->mu);
    bool fired = w->fired;
    pthread_mutex_unlock(&w->mu);
    print_message("host all-reduce while the daemon's %s: %.0f ms%s\n", held + 8, ms,
                  fired ? " (only after the watchdog let the call go)" : "");
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ranks[i].st[0], COLLD_OK);
        assert_int_equal(ranks[i].st[1], COLLD_OK);
    }
    assert_false(fired);
}

/* Exact GPU collectives on colld_mem_alloc buffers (VMM memory where the devices have VMM, legacy
 * IPC memory where not), then each rank frees them: the daemon lets the registrations go and its
 * double holds the first close. Rank 1's client disconnects: its flag area goes, and the daemon's
 * first cuMemHostUnregister is held once the closes have gone on. While each is held, a host-only
 * communicator runs exactly. Before the fix both calls were made under the daemon's lock: the
 * deregistration's answer never came (colld_mem_free waited) and nothing else ran until the
 * watchdog let the call go (checked: the case fails so). */
static void test_release_outside_lock(void **state)
{
    harness_t *h = *state;
    CUdevice dev;
    int vmm = 0;
    CU_MUST(cu->cuDeviceGet(&dev, 0));
    CU_MUST(cu->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    watchdog_t w = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, watchdog_main, &w), 0);
    rank_t ranks[2];
    run_ranks(h, sc_collectives, 0, ranks);
    for (int i = 0; i < 2; i++)
        assert_int_equal(ranks[i].v[0], 6); /* every result exact */
    const char *held = vmm ? HELD_UNMAP : HELD_IPC_CLOSE;
    bool got = log_says(gpu_control, held, WAIT_MS);
    if (got)
        host_while_held(h, &w, held);
    control_append("release:hold");
    bool got2 = got && log_says(gpu_control, HELD_UNREGISTER, WAIT_MS);
    if (got2)
        host_while_held(h, &w, HELD_UNREGISTER);
    control_append("release:hold");
    pthread_mutex_lock(&w.mu);
    w.done = true;
    pthread_cond_signal(&w.cv);
    pthread_mutex_unlock(&w.mu);
    pthread_join(t, NULL);
    if (!got || !got2)
        fail_msg("the daemon's double never said \"%s\"", got ? HELD_UNREGISTER : held);
    assert_false(w.fired);
    assert_int_equal(harness_wait_clean(h, 10000), 0);
}

/* A daemon whose double holds its first cuMemUnmap, cuIpcCloseMemHandle and cuMemHostUnregister. */
static int setup_release_hold(void **state)
{
    static const char *const lines[] = { "hold:cuMemUnmap:1", "hold:cuIpcCloseMemHandle:1",
                                         "hold:cuMemHostUnregister:1", NULL };
    return setup_with_control(state, lines);
}

/* Whatever a failed case left held goes on before the daemon is stopped. */
static int teardown_release_hold(void **state)
{
    control_append("release:hold");
    return teardown_control(state);
}

gpu_cases_t gpu_release_cases(const char *group)
{
    static const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_release_outside_lock, setup_release_hold, teardown_release_hold),
    };
    static const char *const groups[] = { "vmm", "legacy", NULL };
    return group_is(group, groups) ? GPU_CASES(tests) : GPU_NO_CASES;
}
