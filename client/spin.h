/*
 * spin.h - how a waiting thread of libcolld polls before it sleeps (rings.c, fast.c, group.c).
 *
 * A waiter looks at what it waits for in a loop only for as long as recent waits of its
 * communicator show that the completion comes within that time (a window per communicator and
 * path, learnt from them); then it sleeps on the futex its waker rings. Between looks it pauses
 * (`pause`, no system call; at most 50 us in all) while a CPU is free; while the machine's
 * runnable threads outnumber its CPUs (or its communicator's ranks do) it calls sched_yield
 * instead (at most 200 us): a pausing poll would only keep the peer or the daemon it waits for off
 * a CPU, and a futex sleep costs a wake-up that on a crowded machine takes tens of microseconds and
 * more CPU than the yields, where a yield hands the CPU straight to a runnable peer. The window
 * bounds the yields: a waiter whose completions come later than the window (DDP's buckets,
 * waiting for a peer's backward pass) stops polling within a few waits and sleeps at once, so a
 * long wait costs two context switches, not thousands of yields (the 2,000-yield loop this
 * replaces, issue 25).
 */
#ifndef COLLD_CLIENT_SPIN_H
#define COLLD_CLIENT_SPIN_H

#include <sched.h>
#include <stdbool.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define colld__cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define colld__cpu_relax() __asm__ __volatile__("yield")
#else
#define colld__cpu_relax() ((void)0)
#endif

/* Whether the machine's CPUs are all taken, as a waiter deciding how to poll sees it: one per
 * client, shared by its threads (atomics; a stale answer only costs one wait its best way). */
typedef struct {
    uint64_t checked_ns; /* when busy was last read from /proc/loadavg (0: never) */
    bool busy;           /* runnable threads outnumbered the CPUs then */
    int cpus;            /* CPUs this process may run on (0: not known yet) */
} colld_cpu_load_t;

/* How long one communicator's waits on one path (the engine's completions, or the peers on the fast
 * area) may poll: a window that follows recent waits, doubling (plus 1 us) after a wait that
 * ended within it and halving after one that did not, so that it settles on what the completions
 * of this communicator need, or on nothing when they come later than the cap. Once it is nothing,
 * every SPIN_PROBE_EVERY-th wait polls for the whole cap to find out whether that changed (a
 * shorter probe could never find waits longer than itself again). Zero (calloc) is a valid start.
 * Used by one thread at a time, as the communicator is. */
typedef struct {
    uint32_t window_ns; /* the window the last waits earned (before the cap) */
    uint32_t waits;     /* waits while it was nothing (the probe's count) */
    bool started;       /* false until the first wait: it starts from SPIN_START_NS */
} colld_spin_est_t;

/* How a wait that starts now polls: for window_ns (0: it sleeps at once), the communicator's window
 * capped at COLLD_SPIN_YIELD_MAX_NS with sched_yield between looks when `yield` (the machine's
 * runnable threads outnumber its CPUs, or `crowded`: the caller knows its ranks do), else capped at
 * COLLD_SPIN_MAX_NS with a pause between looks. */
typedef struct {
    uint64_t window_ns;
    bool yield;
} colld_spin_plan_t;
colld_spin_plan_t colld__spin_plan(colld_spin_est_t *e, colld_cpu_load_t *load, bool crowded, uint64_t now);

/* Between two looks of a wait planned so. */
static inline void colld__spin_between(const colld_spin_plan_t *p)
{
    if (p->yield)
        sched_yield();
    else
        colld__cpu_relax();
}

/* A wait given `window_ns` by colld__spin_plan ended after `waited_ns` (from its start, however
 * it waited; 0 when it found its completion at the first look). */
void colld__spin_record(colld_spin_est_t *e, uint64_t window_ns, uint64_t waited_ns);

/* Whether runnable threads outnumber the CPUs (/proc/loadavg, read at most every 10 ms). */
bool colld__cpus_busy(colld_cpu_load_t *load, uint64_t now);

/* Whether a communicator of nranks ranks has more ranks than the CPUs this process may run on:
 * then its waits never pause between looks (a peer it waits for may have no CPU). */
bool colld__spin_crowded(colld_cpu_load_t *load, int nranks);

#define COLLD_SPIN_MAX_NS 50000ull        /* the longest poll of one wait, pausing between looks... */
#define COLLD_SPIN_YIELD_MAX_NS 200000ull /* ...and yielding */

#endif /* COLLD_CLIENT_SPIN_H */
