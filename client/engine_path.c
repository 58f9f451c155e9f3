/*
 * engine_path.c - the engine path's poster: a collective the daemon's engine runs is numbered
 * with the communicator's next operation id (shared with the other paths), its staged buffers'
 * pending record attached under that number (copied out when the completion is reaped), and its
 * descriptor posted on the submission ring. colld_group_end numbers a group's collectives the
 * same way and posts each client's run as one batch. Sends and receives take this path too, and
 * are counted (comm->p2p) so that every path derives the same collective ordinals as the daemon
 * (proto/wire.h).
 */
#include "client/client_internal.h"

#include <stdio.h>

/* Attach a staged op's pending record before its descriptor can complete (numbered `seq`). */
static void attach(colld_comm_t *comm, colld_pending_t *p, uint64_t seq)
{
    if (!p)
        return;
    pthread_mutex_lock(&comm->client->mu);
    colld__pending_attach(comm, p, seq);
    pthread_mutex_unlock(&comm->client->mu);
}

void colld__engine_discard(colld_comm_t *comm, colld_pending_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&comm->client->mu);
    colld__pending_detach(comm, p);
    colld__pending_release(comm->client, p);
    pthread_mutex_unlock(&comm->client->mu);
}

colld_status_t colld__engine_post(colld_comm_t *comm, const colld_wire_sqe_t *sqe, colld_pending_t *pending,
                                  colld_err_t *err)
{
    colld_wire_sqe_t one = *sqe;
    one.seq = comm->seq + 1;
    attach(comm, pending, one.seq);
    colld_status_t st = colld__client_submit(comm->client, &one, 1);
    if (st == COLLD_OK) {
        comm->seq++;
        comm->issued++;
        if (colld_kind_is_p2p(one.kind))
            comm->p2p++;
    } else {
        colld__engine_discard(comm, pending);
        (void)colld_err_set(err, st, "cannot post the collective: %s", colld_status_string(st));
    }
    return st;
}

void colld__engine_number(colld_comm_t *comm, colld_wire_sqe_t *sqe, colld_pending_t *pending)
{
    sqe->seq = ++comm->seq;
    comm->issued++;
    if (colld_kind_is_p2p(sqe->kind))
        comm->p2p++;
    attach(comm, pending, comm->seq);
}
