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
#include "server/daemon.h"

#include "common/log.h"
#include "common/ring.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
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
    uint64_t per_rank = FAST_AREA_MAX / (uint64_t)c->nranks / COLLD_WIRE_FAST_DEPTH;
    if (per_rank < 2 * COLLD_WIRE_CACHELINE)
        return 0;
    if (slot > per_rank - sizeof(colld_wire_fast_slot_t))
        slot = (per_rank - sizeof(colld_wire_fast_slot_t)) & ~(uint64_t)(COLLD_WIRE_CACHELINE - 1);
    uint64_t stride = line_up(sizeof(colld_wire_fast_slot_t) + slot);
    uint64_t hdr = line_up(sizeof(colld_wire_fast_t));
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
    c->fast = f;
    c->fast_size = total;
    c->fast_fd = fd;
    return 0;
fail:
    LOG_WARN(COLL, "communicator %llu: no fast area (%s); every collective goes through the engine",
             (unsigned long long)c->id, strerror(errno));
    if (fd >= 0)
        close(fd);
    return -1;
}

void colld_fast_free(colld_dcomm_t *c)
{
    if (!c->fast)
        return;
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
