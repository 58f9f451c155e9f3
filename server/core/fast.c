/*
 * fast.c - the fast area of a single-node communicator (layout and protocol in proto/wire.h).
 *
 * Small collectives (each rank's input at most the area's slot size) are run by the ranks
 * themselves on this shared memory, so a collective of two awake ranks costs no context switch
 * and no system call. The daemon stays the authority for everything else: it creates the area
 * when the communicator forms, hands it to each member, matches the records the ranks post for
 * each such collective (sequence numbers, signatures, time-outs, the flight recorder), and when
 * the communicator breaks it writes the error into the area and wakes every waiting rank.
 */
#include "server/core/daemon.h"

#include "common/log.h"
#include "transport/shm/ring.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Largest area per communicator: large communicators get smaller slots (or none). */
#define FAST_AREA_MAX (16u << 20)

/* Round up to a cache line. */
static uint64_t line_up(uint64_t v)
{
    return (v + COLLD_WIRE_CACHELINE - 1) & ~(uint64_t)(COLLD_WIRE_CACHELINE - 1);
}

int colld_fast_create(colld_daemon_t *d, colld_dcomm_t *c)
{
    uint64_t slot = d->cfg.fast_path_bytes;
    if (slot == 0 || c->x)
        return 0; /* disabled, or multi-node (the network stages need the daemon) */
    uint64_t share = FAST_AREA_MAX / (uint64_t)c->nranks;
    if (share < sizeof(colld_wire_fast_stats_t) + COLLD_WIRE_FAST_DEPTH * 2 * COLLD_WIRE_CACHELINE)
        return 0;
    uint64_t per_rank = (share - sizeof(colld_wire_fast_stats_t)) / COLLD_WIRE_FAST_DEPTH;
    if (slot > per_rank - sizeof(colld_wire_fast_slot_t))
        slot = (per_rank - sizeof(colld_wire_fast_slot_t)) & ~(uint64_t)(COLLD_WIRE_CACHELINE - 1);
    uint64_t stride = line_up(sizeof(colld_wire_fast_slot_t) + slot);
    uint64_t hdr = COLLD_WIRE_FAST_SLOTS_OFFSET(c->nranks);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t total = (hdr + stride * COLLD_WIRE_FAST_DEPTH * (uint64_t)c->nranks + page - 1) & ~(page - 1);
    char name[64];
    snprintf(name, sizeof(name), "colld-fast-%llu", (unsigned long long)c->id);
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    /* Sealed: no member can shrink the file under the daemon's mapping (SIGBUS). */
    if (fd < 0 || ftruncate(fd, (off_t)total) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
        goto fail;
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        goto fail;
    colld_wire_fast_t *f = p;
    f->magic = COLLD_WIRE_FAST_MAGIC;
    f->nranks = (uint32_t)c->nranks;
    f->slot_bytes = (uint32_t)slot;
    f->slot_stride = (uint32_t)stride;
    f->total_size = total;
    c->fast_seen = calloc((size_t)c->nranks, sizeof(*c->fast_seen));
    if (!c->fast_seen) {
        munmap(p, total);
        goto fail;
    }
    c->fast = f;
    c->fast_size = total;
    c->fast_stride = stride;
    c->fast_fd = fd;
    return 0;
fail:
    LOG_WARN(COLL, "communicator %llu: no fast area (%s); every collective goes through the engine",
             (unsigned long long)c->id, strerror(errno));
    if (fd >= 0)
        close(fd);
    return -1;
}

void colld_fast_free(colld_daemon_t *d, colld_dcomm_t *c)
{
    if (!c->fast)
        return;
    colld_fast_harvest(d, c);
    free(c->fast_seen);
    c->fast_seen = NULL;
    munmap(c->fast, c->fast_size);
    close(c->fast_fd);
    c->fast = NULL;
    c->fast_fd = -1;
}

void colld_fast_break(colld_dcomm_t *c)
{
    if (!c->fast || c->error == COLLD_OK)
        return;
    __atomic_store_n(&c->fast->status, (int32_t)c->error, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&c->fast->gen, 1, __ATOMIC_SEQ_CST);
    colld_futex_wake_all(&c->fast->gen);
}

int colld_fast_dup(colld_session_t *s, uint32_t handle, uint64_t *size, colld_status_t *st, char *detail, size_t len)
{
    colld_member_t *m = colld_comm_member(s, handle);
    if (!m) {
        snprintf(detail, len, "unknown communicator handle %u", handle);
        *st = COLLD_ERR_INVALID_ARGUMENT;
        return -1;
    }
    colld_dcomm_t *c = m->comm;
    if (!c->fast) {
        snprintf(detail, len, "communicator %llu has no fast area (%s)", (unsigned long long)c->id,
                 c->x ? "it spans several nodes" : "fast-path-bytes is 0 or the area could not be made");
        *st = COLLD_ERR_NOT_SUPPORTED;
        return -1;
    }
    int fd = fcntl(c->fast_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(detail, len, "daemon cannot share the fast area: %s", strerror(errno));
        *st = COLLD_ERR_SYSTEM;
        return -1;
    }
    *size = c->fast_size;
    return fd;
}

/* The slot header rank `rank` last published for the parity of `seq`: a consistent copy, or one
 * whose seq says the rank has gone past it (it was rewriting the slot). The address comes from the
 * daemon's own layout (c->nranks, c->fast_stride), never from the area's header, which every
 * member can write. */
static colld_wire_fast_slot_t slot_copy(const colld_dcomm_t *c, int rank, uint64_t seq)
{
    colld_wire_fast_slot_t *s =
        (colld_wire_fast_slot_t *)((char *)c->fast + COLLD_WIRE_FAST_SLOTS_OFFSET(c->nranks) +
                                         ((size_t)rank * COLLD_WIRE_FAST_DEPTH + seq % COLLD_WIRE_FAST_DEPTH) *
                                             c->fast_stride);
    colld_wire_fast_slot_t out;
    out.seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
    memcpy((char *)&out + sizeof(out.seq), (const char *)s + sizeof(s->seq), sizeof(out) - sizeof(out.seq));
    /* A seqlock read: the rank sets seq to 0 before it rewrites the slot for seq + 2, so a
     * changed seq means the copy may be torn, and the rank has moved on. */
    uint64_t again = __atomic_fetch_add(&s->seq, 0, __ATOMIC_ACQ_REL); /* release: the copy is done first */
    if (again != out.seq)
        out.seq = again ? again : out.seq + COLLD_WIRE_FAST_DEPTH;
    return out;
}

colld_fast_seen_t colld_fast_rank_at(const colld_dcomm_t *c, int rank, uint64_t seq, colld_wire_sqe_t *call,
                                     uint64_t *arrival_ns)
{
    colld_wire_fast_slot_t a = slot_copy(c, rank, seq), b = slot_copy(c, rank, seq + 1);
    if (a.seq == seq) {
        memset(call, 0, sizeof(*call));
        call->seq = seq;
        call->count = a.count;
        call->kind = a.kind;
        call->dtype = a.dtype;
        call->redop = a.redop;
        call->root = a.root;
        call->flags = COLLD_SQE_FAST;
        *arrival_ns = a.arrival_ns;
        return COLLD_FAST_PUBLISHED;
    }
    return a.seq > seq || b.seq > seq ? COLLD_FAST_PASSED : COLLD_FAST_ABSENT;
}

void colld_fast_harvest(colld_daemon_t *d, colld_dcomm_t *c)
{
    if (!c->fast)
        return;
    const colld_wire_fast_stats_t *st =
        (const colld_wire_fast_stats_t *)((const char *)c->fast + COLLD_WIRE_FAST_STATS_OFFSET);
    for (int r = 0; r < c->nranks; r++)
        for (unsigned k = 0; k < COLLD_WIRE_FAST_KINDS; k++)
            for (unsigned t = 0; t < COLLD_WIRE_FAST_DTYPES; t++) {
                /* Counters only grow; anything else is the tenant scribbling and is ignored. */
                uint64_t ops = __atomic_load_n(&st[r].ops[k][t], __ATOMIC_RELAXED);
                uint64_t bytes = __atomic_load_n(&st[r].bytes[k][t], __ATOMIC_RELAXED);
                uint64_t *seen = c->fast_seen[r].ops[k];
                uint64_t *seen_b = c->fast_seen[r].bytes[k];
                if (ops <= seen[t] || bytes < seen_b[t])
                    continue;
                colld_metrics_ops_add(d, k + 1, t, ops - seen[t], bytes - seen_b[t]);
                c->ops_completed += r == 0 ? ops - seen[t] : 0;
                seen[t] = ops;
                seen_b[t] = bytes;
            }
}
