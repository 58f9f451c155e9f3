/*
 * rpc_client.h - the client library's small wrapper around the gRPC C core channel.
 *
 * Every gRPC call of libcolld and collctl goes through this module. Calls are blocking and
 * thread-safe (each call uses its own completion queue).
 *
 * Lifetime: colld_rpc_channel_create -> calls -> colld_rpc_channel_destroy.
 */
#ifndef COLLD_CLIENT_RPC_CLIENT_H
#define COLLD_CLIENT_RPC_CLIENT_H

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

typedef struct colld_rpc_channel colld_rpc_channel_t;
typedef struct colld_rpc_stream colld_rpc_stream_t;

/* Create a channel to `target` ("unix:/path" or "HOST:PORT"). Does not connect yet.
 * Calls grpc_init; colld_rpc_channel_destroy calls grpc_shutdown. Returns 0 or -1. */
int colld_rpc_channel_create(const char *target, colld_rpc_channel_t **out);
void colld_rpc_channel_destroy(colld_rpc_channel_t *ch); /* NULL is a no-op */

/* One unary call. On GRPC_STATUS_OK, *resp holds the unpacked response (free it with
 * protobuf_c_message_free_unpacked(*resp, NULL)). Otherwise *resp is NULL and `details`
 * (if non-NULL) receives the status message (truncated to details_len). timeout_ms <= 0: no
 * deadline. A message that cannot be unpacked gives GRPC_STATUS_INTERNAL. */
grpc_status_code colld_rpc_unary(colld_rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                                 ProtobufCMessage **resp, char *details, size_t details_len);

/* Server streaming: open a call, then read messages until colld_rpc_stream_next returns
 * non-zero, then close. Returns GRPC_STATUS_OK or the failure status. */
grpc_status_code colld_rpc_stream_open(colld_rpc_channel_t *ch, const char *path, const ProtobufCMessage *req,
                                       const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                                       colld_rpc_stream_t **out);
/* Next message: 0 with *msg set (free with protobuf_c_message_free_unpacked), or 1 at the end of
 * the stream (then *final_code/details hold the final status), or -1 on error. */
int colld_rpc_stream_next(colld_rpc_stream_t *s, ProtobufCMessage **msg, grpc_status_code *final_code,
                          char *details, size_t details_len);
/* Cancel if still open and free. */
void colld_rpc_stream_close(colld_rpc_stream_t *s);

#endif /* COLLD_CLIENT_RPC_CLIENT_H */
