/*
 * errors.c - a communicator's errors and their detail, below every feature of libcolld: a call
 * refused or failed here (colld__comm_note), the communicator's own error as a call returns it
 * (colld__comm_fail_async) or as the library found it (colld__comm_break_here), and what
 * colld_comm_get_async_error and colld_comm_last_error answer. Each communicator keeps its first
 * error (sticky, as NCCL's async error): once broken, calls on it fail fast with that status. A
 * failure inside a group also poisons the group: colld__comm_error (group.c).
 */
#include "client/client_internal.h"

#include "colld.pb-c.h"
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>

/* ============================================================================================
 * Error detail
 *
 * colld_comm_last_error explains the last failure a call on the handle returned, and never an
 * older one's (issue 26 row 6: a call refused here, then a mismatch the daemon reported, showed
 * the refusal). A failure is one of
 *   - a call refused or failed in this library (colld__comm_error, colld__comm_note): its words go
 *     to local_error, which explains the last failure while the communicator's error is what it was
 *     when they were written (local_over);
 *   - the communicator's error (async_error, sticky, set by a completion, a notice, the fast area,
 *     an abort): last_error, the daemon's detail fetched once with CommError, or the library's own
 *     when it found the error itself (colld__comm_break_here). Once async_error moves on from
 *     local_over, and whenever a call returns the communicator's error (colld__comm_fail_async),
 *     it is what colld_comm_last_error explains.
 * ========================================================================================== */

static void note_v(colld_comm_t *comm, colld_status_t st, const char *fmt, va_list ap)
{
    int n = snprintf(comm->local_error, sizeof(comm->local_error), "%s: ", colld_status_name(st));
    vsnprintf(comm->local_error + n, sizeof(comm->local_error) - (size_t)n, fmt, ap);
    comm->local_over = __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED);
    comm->local_valid = true;
    LOG_INFO(CLIENT, "%s", comm->local_error);
}

colld_status_t colld__comm_note(colld_comm_t *comm, colld_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    note_v(comm, st, fmt, ap);
    va_end(ap);
    return st;
}

colld_status_t colld__comm_fail_async(colld_comm_t *comm, colld_status_t st)
{
    if (st != COLLD_OK && st != COLLD_INPROGRESS && st == __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED))
        comm->local_valid = false;
    return st;
}

colld_status_t colld__comm_break_here(colld_comm_t *comm, colld_status_t st, const char *detail)
{
    colld_status_t ok = COLLD_OK;
    if (__atomic_compare_exchange_n(&comm->async_error, &ok, st, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED) && detail) {
        snprintf(comm->last_error, sizeof(comm->last_error), "%s: %.440s", colld_status_name(st), detail);
        comm->detail_fetched = true;
    }
    return __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED);
}

colld_status_t colld_comm_get_async_error(colld_comm_t *comm, colld_status_t *err)
{
    if (!comm || !err)
        return COLLD_ERR_INVALID_ARGUMENT;
    colld__client_poll(comm->client);
    *err = __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED);
    if (*err == COLLD_OK && atomic_load(&comm->client->lost))
        *err = COLLD_ERR_DAEMON_LOST;
    return COLLD_OK;
}

const char *colld_comm_last_error(colld_comm_t *comm)
{
    if (!comm)
        return "invalid communicator (NULL)";
    colld_client_t *c = comm->client;
    colld_status_t async = __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED);
    if (comm->local_valid && comm->local_over == async)
        return comm->local_error; /* the last failure was a call refused here ("Error detail") */
    if (async != COLLD_OK && !comm->detail_fetched) {
        Colld__V1__CommErrorRequest req = COLLD__V1__COMM_ERROR_REQUEST__INIT;
        Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
        colld__client_session_ref(c, &ref);
        req.session = &ref;
        req.handle = comm->handle;
        Colld__V1__CommErrorResponse *resp = NULL;
        char detail[256] = "";
        colld_status_t st = colld__client_rpc(c, "/colld.v1.Colld/CommError", &req.base,
                                              &colld__v1__comm_error_response__descriptor, COLLD_CLIENT_RPC_TIMEOUT_MS,
                                              (ProtobufCMessage **)&resp, detail, sizeof(detail));
        if (st == COLLD_OK) {
            snprintf(comm->last_error, sizeof(comm->last_error), "%s: %s", colld_status_name(async),
                     resp->comm_detail);
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        } else
            snprintf(comm->last_error, sizeof(comm->last_error), "%s (no detail: %s)", colld_status_name(async),
                     colld_status_name(st));
        comm->detail_fetched = true;
    }
    if (async != COLLD_OK)
        return comm->last_error;
    if (atomic_load(&c->lost)) {
        static __thread char lost[COLLD_CLIENT_DETAIL_LEN];
        snprintf(lost, sizeof(lost), "COLLD_ERR_DAEMON_LOST: %s", colld__lost_detail(c));
        return lost;
    }
    return ""; /* no call has failed on this handle */
}
