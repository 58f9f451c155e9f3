/*
 * rpc_codec.h - the boundary with the gRPC C core, shared by the daemon's and the client's gRPC
 * wrappers (server/control/rpc, client/rpc), the only other users of the gRPC API: protobuf-c
 * messages in and out of gRPC byte buffers, and GRPC_CHECK for the calls that answer with a
 * grpc_call_error.
 */
#ifndef COLLD_COMMON_RPC_CODEC_H
#define COLLD_COMMON_RPC_CODEC_H

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

/* Pack a message into a new byte buffer (the caller destroys it). NULL when out of memory. */
grpc_byte_buffer *colld_rpc_pack(const ProtobufCMessage *msg);
/* Unpack a received byte buffer as a message of type desc (free it with
 * protobuf_c_message_free_unpacked). NULL if bb is NULL or does not parse. */
ProtobufCMessage *colld_rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc);

/* Make every string of a message (and of the messages inside it) safe to print on a terminal and
 * to put into JSON, each cut to at most max_len - 1 bytes (SIZE_MAX: uncut): a control character,
 * a bidirectional override or invalid UTF-8 becomes '?' (colld_str_sanitize). For what a peer
 * daemon (server/control/node_report.c) or the daemon (collctl) sent, whoever validated it. */
void colld_rpc_clean_strings(ProtobufCMessage *m, size_t max_len);

/* Every gRPC call that answers with a grpc_call_error (grpc_call_start_batch,
 * grpc_server_request_registered_call, ...) goes through GRPC_CHECK, which returns the result
 * unchanged for the caller to act on and logs one other than GRPC_CALL_OK with the call's name,
 * gRPC's name of the error and the source location: a warning in subsystem RPC, at most a line
 * per 5 s with the count of the others (a refused batch is a bug of ours or a call already
 * ending; either way the log says where). */
grpc_call_error colld_grpc_checked(grpc_call_error e, const char *call, const char *file, int line);
#define GRPC_CHECK(fn, ...) colld_grpc_checked(fn(__VA_ARGS__), #fn, __FILE__, __LINE__)

#endif /* COLLD_COMMON_RPC_CODEC_H */
