/*
 * rpc_codec.h - protobuf-c messages in and out of gRPC byte buffers; shared by the daemon's and
 * the client's gRPC wrappers (server/control/rpc, client/rpc), the only other users of the gRPC API.
 */
#ifndef COLLD_COMMON_RPC_CODEC_H
#define COLLD_COMMON_RPC_CODEC_H

#include <grpc/byte_buffer.h>
#include <protobuf-c/protobuf-c.h>

/* Pack a message into a new byte buffer (the caller destroys it). NULL when out of memory. */
grpc_byte_buffer *colld_rpc_pack(const ProtobufCMessage *msg);
/* Unpack a received byte buffer as a message of type desc (free it with
 * protobuf_c_message_free_unpacked). NULL if bb is NULL or does not parse. */
ProtobufCMessage *colld_rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc);

#endif /* COLLD_COMMON_RPC_CODEC_H */
