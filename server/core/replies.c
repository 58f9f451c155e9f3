/*
 * replies.c - answers to control calls that the daemon holds (CommInit is answered when the last
 * rank joins, or when the communicator dissolves).
 *
 * Whoever decides an answer holds daemon->lock, and gRPC must never be called under it, so answers
 * are queued on the daemon (colld_reply_add) and sent by whoever releases the lock
 * (colld_daemon_unlock): one list owned by the daemon instead of a list threaded through every
 * function that may break or form a communicator.
 */
#include "server/core/daemon.h"

#include "colld.pb-c.h"
#include "common/util.h"

#include <stdlib.h>

colld_reply_t *colld_reply_add(colld_daemon_t *d, colld_rpc_call_t *call, colld_status_t st, const char *detail)
{
    if (!call)
        return NULL;
    colld_reply_t *r = calloc(1, sizeof(*r));
    if (!r) {
        /* Without memory the answer cannot be queued; fail the call directly (gRPC is safe to call
         * here: nothing of the wrapper's is locked by us). */
        colld_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "colld daemon out of memory");
        return NULL;
    }
    r->call = call;
    r->status = st;
    colld_strlcpy(r->detail, detail ? detail : "", sizeof(r->detail));
    r->next = d->replies;
    d->replies = r;
    return r;
}

/* Send and free a list of answers (lock not held). */
static void replies_send(colld_reply_t *list)
{
    while (list) {
        colld_reply_t *r = list;
        list = r->next;
        Colld__V1__CommInitResponse resp = COLLD__V1__COMM_INIT_RESPONSE__INIT;
        resp.status = r->status;
        resp.detail = r->detail;
        resp.handle = r->handle;
        resp.comm_id = r->comm_id;
        resp.timeout_ms = r->timeout_ms;
        colld_rpc_reply(r->call, &resp.base);
        free(r);
    }
}

void colld_daemon_unlock(colld_daemon_t *d)
{
    colld_reply_t *list = d->replies;
    d->replies = NULL;
    pthread_mutex_unlock(&d->lock);
    if (list)
        replies_send(list);
}
