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
 *
 * Connections: a server created without an address serves only the connections its owner
 * accepts itself and hands over with colld_rpc_server_add_conn (the daemon does, to learn the
 * peer's credentials and to bound connections per tenant). The wrapper counts the calls of each
 * such connection, and can refuse every call on one with a message.
 *
 * Streaming sends are bounded: at most COLLD_RPC_STREAM_MAX_MSGS messages and
 * COLLD_RPC_STREAM_MAX_BYTES bytes wait per call (a client that grants no HTTP/2 window cannot
 * make the daemon queue without bound); a send over it is refused with COLLD_RPC_SEND_FULL and
 * the sender learns through its writable callback when there is room again.
 */
#ifndef COLLD_SERVER_RPC_SERVER_H
#define COLLD_SERVER_RPC_SERVER_H

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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

/* Per streaming call: messages and bytes queued behind the one being sent. */
#define COLLD_RPC_STREAM_MAX_MSGS 1024
#define COLLD_RPC_STREAM_MAX_BYTES (1u << 20)
/* colld_rpc_send: the call's queue is full; nothing was queued. */
#define COLLD_RPC_SEND_FULL 1

/* Create a server listening on `address` ("unix:/path" or "HOST:PORT"), or on nothing (NULL:
 * connections come from colld_rpc_server_add_conn). The method table must outlive the server.
 * Returns 0, or -1 with a message in err (err_len bytes). */
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

/* Serve a connection the caller accepted (a connected stream socket from uid/pid). gRPC owns fd
 * afterwards, also on failure; when the connection ends it shuts the socket down and closes it,
 * so a duplicate the caller keeps sees the hang-up. refusal: NULL to serve the connection, else
 * every call on it is answered RESOURCE_EXHAUSTED with this message. Returns an id for the
 * connection (> 0), or 0 when it could not be served (no memory, not started). Thread-safe. */
uint64_t colld_rpc_server_add_conn(colld_rpc_server_t *srv, int fd, uid_t uid, pid_t pid, const char *refusal);
/* Calls ever dispatched on connection `id` (added with fd) and those not finished yet. Returns
 * 0, or -1 when the wrapper does not know it. Thread-safe. */
int colld_rpc_server_conn_calls(colld_rpc_server_t *srv, int fd, uint64_t id, uint64_t *total, unsigned *active);
/* Forget connection `id` (its owner saw it end). Thread-safe. */
void colld_rpc_server_conn_forget(colld_rpc_server_t *srv, int fd, uint64_t id);
/* Bytes of streaming messages queued now, over every call, and sends refused as full so far. */
void colld_rpc_server_queue_stats(colld_rpc_server_t *srv, uint64_t *queued_bytes, uint64_t *refused_full);

/* One unary call to `target` ("unix:/path") with an empty request, on a new channel (so it goes
 * through the target's accept): the daemon's self-probe of its control plane. Returns 0 when the
 * call completed with OK, else -1 with the reason in why. Blocks at most timeout_ms. */
int colld_rpc_probe(const char *target, const char *path, int timeout_ms, char *why, size_t why_len);

/* Run the handler of method `path` on request bytes as if a call had arrived with them: unpacked
 * and validated as on_request does, then dispatched, on the caller's thread. No gRPC call is
 * behind it: an answer given at once comes back here (*code, and the packed response in *resp,
 * malloc'd, NULL when none); streamed messages go nowhere, and a stream is cancelled once its
 * handler returned, so its sender ends it. A call the handler keeps (a CommInit waiting for its
 * peers) stays owed until its owner answers it. For fuzzers and in-process tests; the server need
 * not be started. Returns 0 (answered), 1 (kept) or -1 (unknown method, no memory). */
int colld_rpc_server_inject(colld_rpc_server_t *srv, const char *path, const uint8_t *bytes, size_t len,
                            grpc_status_code *code, uint8_t **resp, size_t *resp_len);
/* No injected call is alive (all answered and gone). */
bool colld_rpc_server_idle(colld_rpc_server_t *srv);

/* The credentials of the connection a call came on (colld_rpc_server_add_conn). Returns 0, or -1
 * when not known. Thread-safe. */
int colld_rpc_call_peer(const colld_rpc_call_t *call, uid_t *uid, pid_t *pid);

/* Answer a unary call with OK and `resp`. Thread-safe. The wrapper packs resp before returning. */
void colld_rpc_reply(colld_rpc_call_t *call, const ProtobufCMessage *resp);
/* Answer with a non-OK gRPC status and message. Thread-safe. (For a streaming call this is the
 * same as colld_rpc_finish; reply on a streaming call is one last message then finish OK.) */
void colld_rpc_fail(colld_rpc_call_t *call, grpc_status_code code, const char *message);
/* Streaming: queue one message (copied/packed now; sends are serialised internally). Returns 0,
 * COLLD_RPC_SEND_FULL when the call's queue is at its bound (the message was not queued: send it
 * again once the writable callback said there is room), or -1 when the client is gone (then still
 * call colld_rpc_finish). Always -1 on a unary call. */
int colld_rpc_send(colld_rpc_call_t *call, const ProtobufCMessage *msg);
/* Streaming: have fn(arg) called when a send was refused as full and the queue has drained to
 * half its bound. It runs on the server thread with the wrapper's lock held: it must only signal
 * (never call back into this module). Cleared when the call is answered; after colld_rpc_finish
 * returns it is never called again. */
typedef void (*colld_rpc_writable_fn)(void *arg);
void colld_rpc_set_writable(colld_rpc_call_t *call, colld_rpc_writable_fn fn, void *arg);
/* Streaming: end the stream with a status. */
void colld_rpc_finish(colld_rpc_call_t *call, grpc_status_code code, const char *message);
/* The call's deadline as milliseconds since the epoch (INT64_MAX if none). */
int64_t colld_rpc_call_deadline_ms(const colld_rpc_call_t *call);
/* True once the client cancelled the call or its deadline passed. Thread-safe. */
bool colld_rpc_call_cancelled(const colld_rpc_call_t *call);

#endif /* COLLD_SERVER_RPC_SERVER_H */
