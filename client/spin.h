/*
 * spin.h - when a waiting thread of libcolld may busy-poll instead of sleeping (rings.c, fast.c).
 *
 * A waiter looks at what it waits for in a loop (a pause between looks, no system call) only for
 * as long as recent waits of its communicator show the completion comes (a window per
 * communicator and path, learnt from them), and for no more than a few microseconds while the
 * machine's runnable threads outnumber its CPUs (then a longer poll only keeps the thread it
 * waits for, or the daemon, off a CPU); then it sleeps on the futex its waker rings. It never
 * calls sched_yield: on a machine with more runnable threads than CPUs each yield is an
 * involuntary context switch that hands the CPU to whatever is runnable, not to the daemon or the
 * peer the waiter waits for, and burns CPU time the other processes need.
 */
#ifndef COLLD_CLIENT_SPIN_H
#define COLLD_CLIENT_SPIN_H

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

/* Whether the machine's CPUs are all taken, as a waiter deciding to busy-poll sees it: one per
 * client, shared by its threads (atomics; a stale answer only costs one wait its best way). */
typedef struct {
    uint64_t checked_ns; /* when busy was last read from /proc/loadavg (0: never) */
    bool busy;           /* runnable threads outnumbered the CPUs then */
    int cpus;            /* CPUs this process may run on (0: not known yet) */
} colld_cpu_load_t;

/* How long one communicator's waits on one path (the engine's completions, or the peers on the fast
 * area) may busy-poll: a window that follows recent waits, doubling (plus 1 us) after a wait that
 * ended within it and halving after one that did not, so that it settles on what the completions
 * of this communicator need, or on nothing when they come later than the cap. Once it is nothing,
 * every SPIN_PROBE_EVERY-th wait polls for SPIN_PROBE_NS to find out whether that changed. Zero
 * (calloc) is a valid start. Used by one thread at a time, as the communicator is. */
typedef struct {
    uint32_t window_ns; /* the window the last waits earned (before the load's cap) */
    uint32_t waits;     /* waits while it was nothing (the probe's count) */
    bool started;       /* false until the first wait: it starts from SPIN_START_NS */
} colld_spin_est_t;

/* How long (ns) a wait that starts now may busy-poll before it sleeps: the communicator's window,
 * capped at COLLD_SPIN_MAX_NS while a CPU is free and at COLLD_SPIN_BUSY_MAX_NS while runnable
 * threads outnumber the CPUs (no longer than a sleep and its wake-up cost in CPU time, so that the
 * poll never takes more CPU than sleeping would); 0: sleep at once. `now` is colld_now_ns(). */
uint64_t colld__spin_window(colld_spin_est_t *e, colld_cpu_load_t *load, uint64_t now);

/* A wait given `window_ns` by colld__spin_window ended after `waited_ns` (from its start, however
 * it waited; 0 when it found its completion at the first look). */
void colld__spin_record(colld_spin_est_t *e, uint64_t window_ns, uint64_t waited_ns);

/* Whether runnable threads outnumber the CPUs (/proc/loadavg, read at most every 10 ms). */
bool colld__cpus_busy(colld_cpu_load_t *load, uint64_t now);

#define COLLD_SPIN_MAX_NS 50000ull     /* the longest busy-poll of one wait, with a CPU free */
#define COLLD_SPIN_BUSY_MAX_NS 4000ull /* ... and with every CPU taken */

#endif /* COLLD_CLIENT_SPIN_H */
