/*
 * spin.c - how a waiting thread polls before it sleeps (spin.h): the machine's CPU load as /proc/loadavg
 * tells it, and per-communicator estimates of how soon a wait ends.
 */
#include "client/spin.h"

#include "common/util.h"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#define SPIN_START_NS 10000u                  /* a communicator's first window */
#define SPIN_GROW_NS 1000u                    /* added when the window doubles */
#define SPIN_MIN_NS 500u                      /* a window below this is nothing */
#define SPIN_PROBE_EVERY 16u                  /* with no window, every 16th wait polls... */
#define SPIN_PROBE_NS COLLD_SPIN_YIELD_MAX_NS /* ...as long as it may (a shorter probe never finds a longer window) */
#define LOAD_RECHECK_NS 10000000ull           /* /proc/loadavg is read at most this often per client */

/* The CPUs this process may run on (its affinity mask), else the online ones. */
static int cpus_allowed(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The number of runnable threads on the machine now (the fourth field of /proc/loadavg,
 * "running/total"; the reader is one of them), or -1. */
static int runnable_now(void)
{
    char buf[128];
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = buf;
    for (int field = 0; field < 3; field++) { /* skip the three load averages */
        while (*p && *p != ' ')
            p++;
        while (*p == ' ')
            p++;
    }
    char *end;
    long r = strtol(p, &end, 10);
    return end != p && *end == '/' && r >= 0 && r < 1 << 24 ? (int)r : -1;
}

/* The CPUs this process may run on, read once per client. */
static int cpus_of(colld_cpu_load_t *load)
{
    int cpus = __atomic_load_n(&load->cpus, __ATOMIC_RELAXED);
    if (!cpus) {
        cpus = cpus_allowed();
        __atomic_store_n(&load->cpus, cpus, __ATOMIC_RELAXED);
    }
    return cpus;
}

bool colld__spin_crowded(colld_cpu_load_t *load, int nranks)
{
    return nranks > cpus_of(load);
}

bool colld__cpus_busy(colld_cpu_load_t *load, uint64_t now)
{
    uint64_t last = __atomic_load_n(&load->checked_ns, __ATOMIC_RELAXED);
    if (last && now - last < LOAD_RECHECK_NS)
        return __atomic_load_n(&load->busy, __ATOMIC_RELAXED);
    /* One thread reads the file; the others keep the answer they have until it is in. */
    if (!__atomic_compare_exchange_n(&load->checked_ns, &last, now, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return __atomic_load_n(&load->busy, __ATOMIC_RELAXED);
    int running = runnable_now();
    bool busy = running < 0 ? false : running > cpus_of(load);
    __atomic_store_n(&load->busy, busy, __ATOMIC_RELAXED);
    return busy;
}

colld_spin_plan_t colld__spin_plan(colld_spin_est_t *e, colld_cpu_load_t *load, bool crowded, uint64_t now)
{
    if (!e->started) {
        e->started = true;
        e->window_ns = SPIN_START_NS;
    }
    uint64_t w = e->window_ns;
    if (w < SPIN_MIN_NS)
        w = ++e->waits % SPIN_PROBE_EVERY == 0 ? SPIN_PROBE_NS : 0;
    if (!w)
        return (colld_spin_plan_t){ 0, false };
    bool yield = crowded || colld__cpus_busy(load, now);
    return (colld_spin_plan_t){ COLLD_MIN(w, yield ? COLLD_SPIN_YIELD_MAX_NS : COLLD_SPIN_MAX_NS), yield };
}

void colld__spin_record(colld_spin_est_t *e, uint64_t window_ns, uint64_t waited_ns)
{
    if (waited_ns <= window_ns) { /* it came within the window: allow a little more */
        uint64_t w = 2 * COLLD_MAX((uint64_t)e->window_ns, waited_ns) + SPIN_GROW_NS;
        e->window_ns = (uint32_t)COLLD_MIN(w, COLLD_SPIN_YIELD_MAX_NS);
        e->waits = 0;
    } else { /* it did not: poll less next time */
        e->window_ns /= 2;
    }
}
