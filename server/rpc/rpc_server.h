/*
 * rpc_server.h - the daemon's small wrapper around the gRPC C core server.
 *
 * Every gRPC call of the daemon goes through this module (the gRPC C core API is not stable
 * between minor versions). Requests and responses are protobuf-c messages. A handler runs on the
 * server's completion-queue thread; it may answer at once or keep the call and answer later from
 * any thread (deferred reply), e.g. when the last rank of a communicator joins.
 *
 * Lifetime: colld_rpc_server_create -> colld_rpc_server_start -> colld_rpc_server_destroy.
 * A call must be answered exactly once (reply or fail; for streaming methods, any number of
 * colld_rpc_send then one colld_rpc_finish). After that the call object is gone.
 */
#ifndef COLLD_SERVER_RPC_SERVER_H
#define COLLD_SERVER_RPC_SERVER_H

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct colld_rpc_server colld_rpc_server_t;
typedef struct colld_rpc_call colld_rpc_call_t;

/* A handler. `req` is owned by the wrapper and freed after the handler returns: copy what a
 * deferred answer needs. `ctx` is the pointer given to colld_rpc_server_create. */
typedef void (*colld_rpc_handler_fn)(colld_rpc_call_t *call, const ProtobufCMessage *req, void *ctx);

typedef struct {
    const char *path;                             /* "/colld.v1.Colld/Attach" */
    const ProtobufCMessageDescriptor *request;    /* type of the request message */
    colld_rpc_handler_fn handler;
    bool server_streaming;                        /* answered with send* + finish */
} colld_rpc_method_t;

/* Create a server listening on `address` ("unix:/path" or "HOST:PORT"). The method table must
 * outlive the server. Returns 0, or -1 with a message in err (err_len bytes). */
int colld_rpc_server_create(const char *address, const colld_rpc_method_t *methods, size_t nmethods,
                            void *ctx, colld_rpc_server_t **out, char *err, size_t err_len);
/* Start the completion-queue thread. Returns 0 or -1. */
int colld_rpc_server_start(colld_rpc_server_t *srv);
/* Stop: no new calls are dispatched; calls in flight are cancelled (their peers see CANCELLED or
 * UNAVAILABLE); unanswered deferred calls are released, and reply/fail/send/finish on them from
 * other threads while destroy runs are harmless no-ops. Joins the thread and frees everything,
 * released calls included: once destroy has returned, every call pointer is invalid, so owners
 * of deferred calls must drop them without answering (or answer them before destroy). Must not be
 * called from a handler (it joins the handlers' thread). NULL is a no-op. */
void colld_rpc_server_destroy(colld_rpc_server_t *srv);

/* Answer a unary call with OK and `resp`. Thread-safe. The wrapper packs resp before returning. */
void colld_rpc_reply(colld_rpc_call_t *call, const ProtobufCMessage *resp);
/* Answer with a non-OK gRPC status and message. Thread-safe. (For a streaming call this is the
 * same as colld_rpc_finish; reply on a streaming call is one last message then finish OK.) */
void colld_rpc_fail(colld_rpc_call_t *call, grpc_status_code code, const char *message);
/* Streaming: queue one message (copied/packed now; sends are serialised internally). Returns 0,
 * or -1 when the client is gone (then still call colld_rpc_finish). Always -1 on a unary call. */
int colld_rpc_send(colld_rpc_call_t *call, const ProtobufCMessage *msg);
/* Streaming: end the stream with a status. */
void colld_rpc_finish(colld_rpc_call_t *call, grpc_status_code code, const char *message);
/* The call's deadline as milliseconds since the epoch (INT64_MAX if none). */
int64_t colld_rpc_call_deadline_ms(const colld_rpc_call_t *call);
/* True once the client cancelled the call or its deadline passed. Thread-safe. */
bool colld_rpc_call_cancelled(const colld_rpc_call_t *call);

#endif /* COLLD_SERVER_RPC_SERVER_H */
