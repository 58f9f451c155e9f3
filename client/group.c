/*
 * group.c - group calls (colld_group_start / colld_group_end), as NCCL's.
 *
 * Between start and end, collectives are validated at once but not posted: their descriptors
 * wait in a per-thread list and colld_group_end posts them all, in call order, each client's run
 * in one batch with one wake-up of the daemon. Groups nest; only the outermost end posts. A call
 * that fails validation inside a group returns its error at once and poisons the group:
 * colld_group_end then posts nothing and returns that first error. Sequence numbers are given at
 * posting, so a discarded group leaves every communicator exactly as it was.
 */
#include "client/client_internal.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    colld_comm_t *comm;
    colld_wire_sqe_t sqe;
    colld_pending_t *pending;
} queued_t;

typedef struct {
    int depth;
    colld_status_t error; /* first error inside the group */
    queued_t *ops;
    size_t n, cap;
} group_t;

static _Thread_local group_t group;

bool colld__group_active(void)
{
    return group.depth > 0;
}

void colld__group_fail(colld_status_t st)
{
    if (group.depth > 0 && group.error == COLLD_OK)
        group.error = st;
}

/* Post now, or queue until the outermost colld_group_end. */
/* Attach a staged op's pending record before its descriptor can complete (numbered `seq`). */
static void attach(colld_comm_t *comm, colld_pending_t *p, uint64_t seq)
{
    if (!p)
        return;
    pthread_mutex_lock(&comm->client->mu);
    colld__pending_attach(comm, p, seq);
    pthread_mutex_unlock(&comm->client->mu);
}

/* Release a pending record of an op that was not posted. */
static void discard(colld_comm_t *comm, colld_pending_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&comm->client->mu);
    colld__pending_detach(comm, p);
    colld__pending_release(comm->client, p);
    pthread_mutex_unlock(&comm->client->mu);
}

colld_status_t colld__enqueue(colld_comm_t *comm, const colld_wire_sqe_t *sqe, colld_pending_t *pending)
{
    if (group.depth == 0) {
        colld_wire_sqe_t one = *sqe;
        one.seq = comm->issued + 1;
        attach(comm, pending, one.seq);
        colld_status_t st = colld__client_submit(comm->client, &one, 1);
        if (st == COLLD_OK)
            comm->issued++;
        else
            discard(comm, pending);
        return st;
    }
    if (group.n == group.cap) {
        size_t cap = group.cap ? group.cap * 2 : 64;
        queued_t *ops = realloc(group.ops, cap * sizeof(*ops));
        if (!ops) {
            discard(comm, pending);
            colld__group_fail(COLLD_ERR_NO_MEMORY);
            return COLLD_ERR_NO_MEMORY;
        }
        group.ops = ops;
        group.cap = cap;
    }
    group.ops[group.n++] = (queued_t){ .comm = comm, .sqe = *sqe, .pending = pending };
    return COLLD_OK;
}

/* Forget the queued operations (the group is over); release what was never posted. */
static void group_reset(bool posted)
{
    for (size_t i = 0; i < group.n && !posted; i++)
        discard(group.ops[i].comm, group.ops[i].pending);
    free(group.ops);
    memset(&group, 0, sizeof(group));
}

colld_status_t colld_group_start(void)
{
    group.depth++;
    return COLLD_OK;
}

colld_status_t colld_group_end(void)
{
    if (group.depth == 0)
        return COLLD_ERR_INVALID_USAGE;
    if (--group.depth > 0)
        return COLLD_OK;
    colld_status_t st = group.error;
    if (st != COLLD_OK) {
        group_reset(false);
        return st;
    }
    /* Number each op, then post each client's consecutive run as one batch. */
    colld_wire_sqe_t *batch = group.n ? malloc(group.n * sizeof(*batch)) : NULL;
    if (group.n && !batch) {
        group_reset(false);
        return COLLD_ERR_NO_MEMORY;
    }
    /* A failed submission means the daemon is lost, after which the counters no longer matter. */
    size_t i = 0;
    while (i < group.n && st == COLLD_OK) {
        colld_client_t *c = group.ops[i].comm->client;
        size_t k = 0;
        for (; i < group.n && group.ops[i].comm->client == c; i++) {
            batch[k] = group.ops[i].sqe;
            batch[k++].seq = ++group.ops[i].comm->issued;
            attach(group.ops[i].comm, group.ops[i].pending, batch[k - 1].seq);
        }
        st = colld__client_submit(c, batch, k);
    }
    free(batch);
    group_reset(true); /* posted ones belong to their communicators; on a lost daemon too */
    return st;
}
