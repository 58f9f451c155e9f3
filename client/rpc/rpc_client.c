/*
 * rpc_client.c - the client library's small wrapper around the gRPC C core channel
 * (see rpc_client.h).
 *
 * Every call owns a pluck completion queue, so calls from several threads never share a queue
 * (a pluck queue allows only a few concurrent pluckers). Every tag started on a queue is plucked
 * before the queue is destroyed.
 */
#include "common/rpc_codec.h"
#include "client/rpc/rpc_client.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct colld_rpc_channel {
    grpc_channel *channel;
};

/* Tags of a streaming call's queue. */
enum { STREAM_TAG_START = 1, STREAM_TAG_STATUS = 2, STREAM_TAG_RECV = 3 };

struct colld_rpc_stream {
    grpc_completion_queue *cq;
    grpc_call *call;
    const ProtobufCMessageDescriptor *desc;
    grpc_metadata_array initial_md;
    grpc_metadata_array trailing_md;
    grpc_status_code status;
    grpc_slice status_details;
    bool initial_md_received;
    bool status_received; /* the STATUS tag was plucked */
};

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Copy a status message (a slice, not NUL-terminated) into the caller's buffer. */
static void copy_details(char *details, size_t details_len, grpc_slice slice)
{
    size_t n = GRPC_SLICE_LENGTH(slice);

    if (details == NULL || details_len == 0)
        return;
    if (n >= details_len)
        n = details_len - 1;
    memcpy(details, GRPC_SLICE_START_PTR(slice), n);
    details[n] = '\0';
}

/* Put a locally made status message into the caller's buffer. */
static void set_details(char *details, size_t details_len, const char *text)
{
    if (details != NULL && details_len > 0)
        snprintf(details, details_len, "%s", text);
}

/* The absolute deadline for a call: timeout_ms from now, or none. */
static gpr_timespec call_deadline(int timeout_ms)
{
    if (timeout_ms <= 0)
        return gpr_inf_future(GPR_CLOCK_REALTIME);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

/* Create a call on its own queue. The method path is copied (gRPC keeps it past this call). */
static grpc_call *create_call(grpc_channel *channel, grpc_completion_queue *cq, const char *path, int timeout_ms)
{
    grpc_slice method = grpc_slice_from_copied_string(path);
    grpc_call *call = grpc_channel_create_call(channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                               call_deadline(timeout_ms), NULL);

    grpc_slice_unref(method);
    return call;
}

/* Wait for one tag on a call's own pluck queue. Returns the completion's success flag. */
static bool pluck(grpc_completion_queue *cq, void *tag)
{
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);

    return ev.type == GRPC_OP_COMPLETE && ev.success != 0;
}

/* Destroy a call's queue once every tag on it was plucked. */
static void destroy_cq(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
}

/* ------------------------------------------------------------------------------------------ */
/* Channel                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Create a lazily connecting channel; holds one grpc_init reference while it exists. */
int colld_rpc_channel_create(const char *target, colld_rpc_channel_t **out)
{
    colld_rpc_channel_t *ch = NULL;
    grpc_channel_credentials *creds = NULL;
    int rc = -1;

    *out = NULL;
    grpc_init();
    ch = calloc(1, sizeof(*ch));
    if (ch == NULL)
        goto out;
    creds = grpc_insecure_credentials_create();
    if (creds == NULL)
        goto out;
    ch->channel = grpc_channel_create(target, creds, NULL);
    if (ch->channel == NULL)
        goto out;
    *out = ch;
    rc = 0;
out:
    if (creds != NULL)
        grpc_channel_credentials_release(creds);
    if (rc != 0) {
        free(ch);
        grpc_shutdown();
    }
    return rc;
}

/* Close the channel (calls still running on it fail) and drop the grpc_init reference. */
void colld_rpc_channel_destroy(colld_rpc_channel_t *ch)
{
    if (ch == NULL)
        return;
    grpc_channel_destroy(ch->channel);
    free(ch);
    grpc_shutdown();
}

/* ------------------------------------------------------------------------------------------ */
/* Unary calls                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* One blocking unary call: everything in one batch on the call's own queue. */
grpc_status_code colld_rpc_unary(colld_rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                                 ProtobufCMessage **resp, char *details, size_t details_len)
{
    grpc_status_code code = GRPC_STATUS_INTERNAL;
    grpc_completion_queue *cq = NULL;
    grpc_call *call = NULL;
    grpc_byte_buffer *send_bb = NULL, *recv_bb = NULL;
    grpc_metadata_array initial_md, trailing_md;
    grpc_slice status_details = grpc_empty_slice();
    grpc_op ops[6];
    void *tag = &ops[0];

    *resp = NULL;
    set_details(details, details_len, "");
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    cq = grpc_completion_queue_create_for_pluck(NULL);
    send_bb = colld_rpc_pack(req);
    if (cq == NULL || send_bb == NULL) {
        set_details(details, details_len, "out of memory");
        goto out;
    }
    call = create_call(ch->channel, cq, path, timeout_ms);
    if (call == NULL) {
        set_details(details, details_len, "cannot create the call");
        goto out;
    }

    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &status_details;
    if (GRPC_CHECK(grpc_call_start_batch, call, ops, 6, tag, NULL) != GRPC_CALL_OK) {
        code = GRPC_STATUS_INTERNAL;
        set_details(details, details_len, "cannot start the call");
        goto out;
    }
    (void)pluck(cq, tag); /* the status tells how it went */
    copy_details(details, details_len, status_details);
    if (code != GRPC_STATUS_OK)
        goto out;
    *resp = colld_rpc_unpack(recv_bb, resp_desc);
    if (*resp == NULL) {
        code = GRPC_STATUS_INTERNAL;
        set_details(details, details_len, recv_bb == NULL ? "no response message" : "cannot parse the response");
    }
out:
    if (call != NULL)
        grpc_call_unref(call);
    if (cq != NULL)
        destroy_cq(cq);
    if (send_bb != NULL)
        grpc_byte_buffer_destroy(send_bb);
    if (recv_bb != NULL)
        grpc_byte_buffer_destroy(recv_bb);
    grpc_slice_unref(status_details);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    return code;
}

/* ------------------------------------------------------------------------------------------ */
/* Server streaming                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* Wait for the final status of a stream (once). */
static void stream_wait_status(colld_rpc_stream_t *s)
{
    if (s->status_received)
        return;
    (void)pluck(s->cq, (void *)(intptr_t)STREAM_TAG_STATUS);
    s->status_received = true;
}

/* Free a stream whose status tag was plucked (or never started). */
static void stream_free(colld_rpc_stream_t *s)
{
    if (s->call != NULL)
        grpc_call_unref(s->call);
    if (s->cq != NULL)
        destroy_cq(s->cq);
    grpc_slice_unref(s->status_details);
    grpc_metadata_array_destroy(&s->initial_md);
    grpc_metadata_array_destroy(&s->trailing_md);
    free(s);
}

/* Open a server-streaming call: send the request and half-close, and arm the status receive.
 * Does not wait for the server's first message. */
grpc_status_code colld_rpc_stream_open(colld_rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                                       const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                                       colld_rpc_stream_t **out)
{
    grpc_status_code code = GRPC_STATUS_INTERNAL;
    colld_rpc_stream_t *s = NULL;
    grpc_byte_buffer *send_bb = NULL;
    bool status_armed = false;
    grpc_op ops[3];

    *out = NULL;
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto out;
    s->desc = resp_desc;
    s->status = GRPC_STATUS_UNKNOWN;
    s->status_details = grpc_empty_slice();
    grpc_metadata_array_init(&s->initial_md);
    grpc_metadata_array_init(&s->trailing_md);
    s->cq = grpc_completion_queue_create_for_pluck(NULL);
    send_bb = colld_rpc_pack(req);
    if (s->cq == NULL || send_bb == NULL)
        goto out;
    s->call = create_call(ch->channel, s->cq, path, timeout_ms);
    if (s->call == NULL)
        goto out;

    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
    ops[0].data.recv_status_on_client.status = &s->status;
    ops[0].data.recv_status_on_client.status_details = &s->status_details;
    if (GRPC_CHECK(grpc_call_start_batch, s->call, ops, 1, (void *)(intptr_t)STREAM_TAG_STATUS, NULL) != GRPC_CALL_OK)
        goto out;
    status_armed = true;

    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    if (GRPC_CHECK(grpc_call_start_batch, s->call, ops, 3, (void *)(intptr_t)STREAM_TAG_START, NULL) != GRPC_CALL_OK) {
        (void)GRPC_CHECK(grpc_call_cancel, s->call, NULL);
        goto out;
    }
    if (!pluck(s->cq, (void *)(intptr_t)STREAM_TAG_START)) {
        /* The call failed before it started (no server, deadline...): report its status. */
        stream_wait_status(s);
        code = s->status != GRPC_STATUS_OK ? s->status : GRPC_STATUS_UNKNOWN;
        goto out;
    }
    *out = s;
    s = NULL;
    code = GRPC_STATUS_OK;
out:
    if (send_bb != NULL)
        grpc_byte_buffer_destroy(send_bb);
    if (s != NULL) {
        if (status_armed)
            stream_wait_status(s);
        stream_free(s);
    }
    return code;
}

/* Receive the next message; at the end (or when the call failed) return the final status. */
int colld_rpc_stream_next(colld_rpc_stream_t *s, ProtobufCMessage **msg, grpc_status_code *final_code,
                          char *details, size_t details_len)
{
    grpc_byte_buffer *bb = NULL;
    grpc_op ops[2];
    size_t n = 0;
    int rc = -1;

    *msg = NULL;
    if (s->status_received)
        goto end;
    memset(ops, 0, sizeof(ops));
    if (!s->initial_md_received) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = &s->initial_md;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &bb;
    if (GRPC_CHECK(grpc_call_start_batch, s->call, ops, n, (void *)(intptr_t)STREAM_TAG_RECV, NULL) != GRPC_CALL_OK)
        goto fail;
    s->initial_md_received = true;
    (void)pluck(s->cq, (void *)(intptr_t)STREAM_TAG_RECV);
    if (bb == NULL)
        goto end; /* end of stream, or the call failed: the status says which */
    *msg = colld_rpc_unpack(bb, s->desc);
    if (*msg == NULL) {
        (void)GRPC_CHECK(grpc_call_cancel, s->call, NULL);
        stream_wait_status(s);
        goto fail;
    }
    rc = 0;
    goto out;
end:
    stream_wait_status(s);
    if (final_code != NULL)
        *final_code = s->status;
    copy_details(details, details_len, s->status_details);
    rc = 1;
    goto out;
fail:
    if (final_code != NULL)
        *final_code = GRPC_STATUS_INTERNAL;
    set_details(details, details_len, "cannot receive or parse a stream message");
out:
    if (bb != NULL)
        grpc_byte_buffer_destroy(bb);
    return rc;
}

/* Cancel the call if the status has not arrived, wait for it, and free everything. */
void colld_rpc_stream_close(colld_rpc_stream_t *s)
{
    if (s == NULL)
        return;
    if (!s->status_received)
        (void)GRPC_CHECK(grpc_call_cancel, s->call, NULL);
    stream_wait_status(s);
    stream_free(s);
}
