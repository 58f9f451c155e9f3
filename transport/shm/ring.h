/*
 * ring.h - single-producer single-consumer rings over the session shared memory of proto/wire.h,
 * and the futex doorbell used to wake a sleeping consumer.
 *
 * The producer owns `head`, the consumer owns `tail`; each side keeps its own copy of the counter
 * it owns and only *reads* the other side's counter from shared memory. Because the other side
 * may be hostile (a client can scribble on its mapping), every counter read from shared memory is
 * checked: colld_ring_avail() returns -1 when the distance between the counters is impossible.
 */
#ifndef COLLD_COMMON_RING_H
#define COLLD_COMMON_RING_H

#include "proto/wire.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Atomic accessors for the plain fields of the wire structs (shared with another process). */
#define COLLD_LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define COLLD_LOAD_RLX(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define COLLD_STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define COLLD_STORE_SC(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define COLLD_LOAD_SC(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)

/* Entries the consumer may read: head (from shared memory) minus its own tail. -1 if the
 * producer published an impossible head (more than `entries` ahead, or behind). */
static inline int64_t colld_ring_avail(const colld_wire_ring_t *r, uint64_t my_tail, uint32_t entries)
{
    uint64_t head = COLLD_LOAD_ACQ(&r->head);
    uint64_t n = head - my_tail;
    if (n > entries)
        return -1;
    return (int64_t)n;
}

/* Free slots for the producer: entries minus (its own head minus the consumer's tail from shared
 * memory). -1 if the consumer published an impossible tail. */
static inline int64_t colld_ring_space(const colld_wire_ring_t *r, uint64_t my_head, uint32_t entries)
{
    uint64_t tail = COLLD_LOAD_ACQ(&r->tail);
    uint64_t used = my_head - tail;
    if (used > entries)
        return -1;
    return (int64_t)(entries - used);
}

/* Wait on a futex word in shared memory while it still holds `expected`, at most timeout_ns
 * (0: no limit). Returns when woken, on timeout, on a signal, or at once if the value differs. */
static inline void colld_futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ns) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000ull);
        ts.tv_nsec = (long)(timeout_ns % 1000000000ull);
        tsp = &ts;
    }
    syscall(SYS_futex, word, FUTEX_WAIT, expected, tsp, NULL, 0);
}

/* Wake every waiter on a shared futex word. */
static inline void colld_futex_wake_all(uint32_t *word)
{
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Ring the consumer's doorbell after publishing entries: bump the word and wake a sleeper. The
 * consumer sets `waiters`, re-checks the ring and only then sleeps on the value it read before,
 * so with sequentially consistent accesses on both sides no wake-up is lost. */
static inline void colld_doorbell_ring(colld_wire_ring_t *r)
{
    __atomic_add_fetch(&r->doorbell, 1, __ATOMIC_SEQ_CST);
    if (COLLD_LOAD_SC(&r->waiters))
        colld_futex_wake_all(&r->doorbell);
}

#endif /* COLLD_COMMON_RING_H */
