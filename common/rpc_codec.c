/*
 * rpc_codec.c - see rpc_codec.h.
 */
#include "common/rpc_codec.h"

#include "common/log.h"
#include "common/util.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <stdint.h>
#include <string.h>

/* Pack a protobuf-c message into a new gRPC byte buffer. Returns NULL when out of memory. */
grpc_byte_buffer *colld_rpc_pack(const ProtobufCMessage *msg)
{
    grpc_byte_buffer *bb = NULL;
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice slice = grpc_slice_malloc(len);

    if (len > 0 && protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(slice)) != len)
        goto out;
    bb = grpc_raw_byte_buffer_create(&slice, 1);
out:
    grpc_slice_unref(slice);
    return bb;
}

/* Unpack a received byte buffer as a message of type desc. Returns NULL if it does not parse. */
ProtobufCMessage *colld_rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc)
{
    ProtobufCMessage *msg = NULL;
    grpc_byte_buffer_reader reader;
    grpc_slice slice;

    if (bb == NULL || !grpc_byte_buffer_reader_init(&reader, bb))
        goto out;
    slice = grpc_byte_buffer_reader_readall(&reader);
    msg = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(slice), GRPC_SLICE_START_PTR(slice));
    grpc_slice_unref(slice);
    grpc_byte_buffer_reader_destroy(&reader);
out:
    return msg;
}

/* Log a gRPC call's refusal with where it happened (see GRPC_CHECK); returns e. */
grpc_call_error colld_grpc_checked(grpc_call_error e, const char *call, const char *file, int line)
{
    static colld_log_rl_t rl;
    if (e == GRPC_CALL_OK)
        return e;
    if (COLLD_LOG_WARN <= colld__log_level && (COLLD_SUB_RPC & colld__log_subsys))
        colld__log_rl(COLLD_LOG_WARN, COLLD_SUB_RPC, file, line, &rl, COLLD_LOG_RL_DEFAULT_MS, "%s refused: %s (%d)",
                      call, grpc_call_error_to_string(e), (int)e);
    return e;
}

void colld_rpc_clean_strings(ProtobufCMessage *m, size_t max_len)
{
    const ProtobufCMessageDescriptor *desc = m->descriptor;
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        char *base = (char *)m + f->offset;
        size_t n = 1;
        void *items = base;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            n = *(size_t *)((char *)m + f->quantifier_offset);
            items = *(void **)base;
        }
        for (size_t k = 0; k < n && items; k++) {
            if (f->type == PROTOBUF_C_TYPE_STRING) {
                char *str = ((char **)items)[k];
                if (str && *str) { /* an unset string is protobuf-c's read-only "" */
                    size_t l = strlen(str) + 1;
                    colld_str_sanitize(str, l < max_len ? l : max_len, str, SIZE_MAX);
                }
            } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                ProtobufCMessage *sub = ((ProtobufCMessage **)items)[k];
                if (sub)
                    colld_rpc_clean_strings(sub, max_len);
            }
        }
    }
}
