/*
 * rpc_server.c - the daemon's small wrapper around the gRPC C core server (see rpc_server.h).
 *
 * One completion queue served by one thread. Every registered method keeps one
 * grpc_server_request_registered_call armed, and one generic grpc_server_request_call stays armed
 * so that calls to unknown methods are answered UNIMPLEMENTED at once instead of hanging until
 * their deadline.
 *
 * Call lifetime. A call object (colld_rpc_call_t) carries a reference count guarded by the server
 * mutex: one reference per batch (or request) outstanding on the completion queue, plus one while
 * the user owes an answer ("owed"). The object is freed when the count reaches zero, i.e. only
 * after its last batch completed on the queue and after it was answered. At shutdown, calls that
 * are still owed are "released": owed is cleared so later answers are no-ops, but the user
 * reference is kept so that the object stays valid until colld_rpc_server_destroy frees it.
 *
 * Batches per call: RECV_CLOSE_ON_SERVER in its own batch (it completes when the client cancels
 * or after the status went out, which is how cancellation is learnt); for streaming, one
 * SEND_MESSAGE outstanding at a time with the rest queued (within the bounds of the header); a
 * final batch with the status.
 *
 * Connections handed over by the owner (colld_rpc_server_add_conn) have a record indexed by the
 * descriptor number: gRPC names such a connection's peer "fd:N", so each arriving call finds its
 * connection, counts itself there while it lives, and inherits its credentials or refusal. A
 * record carries an id, because the number is reused once gRPC closed the descriptor.
 */
#include "common/rpc_codec.h"
#include "server/control/rpc/rpc_server.h"

#include "common/log.h"
#include "common/util.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Types                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef enum {
    RPC_TAG_REQUEST,  /* a requested call arrived (or the request was killed at shutdown) */
    RPC_TAG_CLOSE,    /* RECV_CLOSE_ON_SERVER completed */
    RPC_TAG_SEND,     /* one streaming SEND_MESSAGE completed */
    RPC_TAG_FINAL,    /* the batch with the status completed */
    RPC_TAG_SHUTDOWN, /* grpc_server_shutdown_and_notify completed */
} rpc_tag_kind_t;

/* What the completion queue hands back: which event, for which call (NULL for shutdown). */
typedef struct {
    rpc_tag_kind_t kind;
    colld_rpc_call_t *call;
} rpc_tag_t;

/* One queued streaming message waiting for the previous send to complete. */
typedef struct rpc_msg {
    struct rpc_msg *next;
    grpc_byte_buffer *bb;
} rpc_msg_t;

/* A connection handed over by the owner (colld_rpc_server_add_conn). */
typedef struct rpc_conn {
    uint64_t id;
    uid_t uid;
    pid_t pid;
    unsigned active;          /* calls of it not yet freed */
    uint64_t calls;           /* calls dispatched on it */
    char *refusal;            /* non-NULL: every call is answered RESOURCE_EXHAUSTED with it */
} rpc_conn_t;

/* Index of the generic (unknown method) slot in the arming functions. */
#define RPC_GENERIC_SLOT ((size_t)-1)

struct colld_rpc_call {
    colld_rpc_server_t *srv;
    const colld_rpc_method_t *method; /* NULL for the generic slot */
    size_t slot;                      /* method index, or RPC_GENERIC_SLOT */
    grpc_call *call;
    gpr_timespec deadline;            /* set when the call arrives, immutable afterwards */
    grpc_metadata_array request_md;
    grpc_call_details details;        /* filled by the generic request only */
    grpc_byte_buffer *payload;        /* request message of a registered method */
    int close_cancelled;              /* written by gRPC for RECV_CLOSE_ON_SERVER */
    atomic_bool cancelled;            /* client cancelled, deadline passed or send failed */
    rpc_tag_t tag_request, tag_close, tag_send, tag_final;

    /* Everything below is guarded by srv->mu. */
    int refs;                 /* outstanding queue operations + 1 while owed or released */
    bool owed;                /* the user still has to answer (cleared when released) */
    bool initial_md_sent;
    bool send_in_flight;
    grpc_byte_buffer *sending; /* buffer of the SEND_MESSAGE in flight */
    rpc_msg_t *queue_head, *queue_tail;
    size_t queued_msgs;        /* in queue_head..tail */
    uint64_t queued_bytes;
    bool full;                 /* a send was refused as full: call writable once it drains */
    colld_rpc_writable_fn writable;
    void *writable_arg;
    rpc_conn_t *conn;          /* the connection it came on, NULL when unknown */
    bool injected;             /* colld_rpc_server_inject: no gRPC call behind it */
    bool inject_answered;
    grpc_status_code inject_code;
    grpc_byte_buffer *inject_resp;
    bool finish_pending;       /* finish asked for while sends were still queued */
    grpc_status_code finish_code;
    char *finish_message;
    bool final_started;
    grpc_byte_buffer *final_msg; /* unary response in the final batch */
    grpc_slice final_details;    /* status message of the final batch */
    colld_rpc_call_t *prev, *next; /* srv->calls list */
};

struct colld_rpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    const colld_rpc_method_t *methods;
    size_t nmethods;
    void **handles;           /* registered method handles, one per method */
    void *ctx;
    pthread_t thread;
    bool thread_started;
    bool server_started;
    rpc_tag_t tag_shutdown;

    pthread_mutex_t mu;       /* guards the fields below and the call state */
    bool shutting_down;       /* destroy began: dispatch no new calls, arm no new requests */
    bool cq_closing;          /* the queue is being shut down: start no batch */
    colld_rpc_call_t *calls;  /* every live call object, armed ones included */
    grpc_server_credentials *fd_creds; /* for connections handed over */
    rpc_conn_t **conns;       /* by descriptor number */
    size_t nconn_slots;
    uint64_t next_conn_id;
    uint64_t queued_bytes;    /* streaming messages waiting, over every call */
    uint64_t refused_full;    /* sends refused because a call's queue was full */
};

/* ------------------------------------------------------------------------------------------ */
/* Call objects (all functions named *_locked run with srv->mu held)                           */
/* ------------------------------------------------------------------------------------------ */

/* Tell the sender of a call whose send was refused as full that it may send again (its next
 * send learns whether the client is still there). */
static void call_wake_sender_locked(colld_rpc_call_t *c)
{
    if (!c->full)
        return;
    c->full = false;
    if (c->writable != NULL)
        c->writable(c->writable_arg);
}

/* Drop every queued streaming message (the client is gone or the server is shutting down). */
static void call_drop_queue_locked(colld_rpc_call_t *c)
{
    while (c->queue_head != NULL) {
        rpc_msg_t *m = c->queue_head;
        c->queue_head = m->next;
        grpc_byte_buffer_destroy(m->bb);
        free(m);
    }
    c->queue_tail = NULL;
    c->srv->queued_bytes -= c->queued_bytes;
    c->queued_bytes = 0;
    c->queued_msgs = 0;
    call_wake_sender_locked(c);
}

/* Free a call object whose reference count reached zero (or, at destroy, a released one): all
 * its queue operations have completed, so nothing in gRPC points into it any more. */
static void call_free_locked(colld_rpc_call_t *c)
{
    colld_rpc_server_t *srv = c->srv;

    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        srv->calls = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    if (c->conn != NULL)
        c->conn->active--;
    if (c->call != NULL)
        grpc_call_unref(c->call);
    grpc_metadata_array_destroy(&c->request_md);
    grpc_call_details_destroy(&c->details);
    if (c->payload != NULL)
        grpc_byte_buffer_destroy(c->payload);
    if (c->sending != NULL)
        grpc_byte_buffer_destroy(c->sending);
    if (c->final_msg != NULL)
        grpc_byte_buffer_destroy(c->final_msg);
    if (c->inject_resp != NULL)
        grpc_byte_buffer_destroy(c->inject_resp);
    if (c->final_started)
        grpc_slice_unref(c->final_details);
    c->writable = NULL;
    call_drop_queue_locked(c);
    free(c->finish_message);
    free(c);
}

/* Drop one reference; free the call when none is left. The caller must not touch c afterwards
 * unless it holds another reference. */
static void call_unref_locked(colld_rpc_call_t *c)
{
    if (--c->refs == 0)
        call_free_locked(c);
}

/* Free a connection record (NULL-safe). */
static void conn_free(rpc_conn_t *conn)
{
    if (conn == NULL)
        return;
    free(conn->refusal);
    free(conn);
}

/* Take the record of the connection on descriptor fd out of the table and free it: its calls no
 * longer point to it. */
static void conn_detach_locked(colld_rpc_server_t *srv, int fd)
{
    rpc_conn_t *conn = srv->conns[fd];

    for (colld_rpc_call_t *c = srv->calls; c != NULL; c = c->next)
        if (c->conn == conn) {
            c->conn = NULL;
            conn->active--;
        }
    srv->conns[fd] = NULL;
    conn_free(conn);
}

/* Start a batch on the call and take a reference for its completion. Refused once the queue is
 * being shut down (a batch started then would never be reported). Returns 0 or -1. */
static int call_start_batch_locked(colld_rpc_call_t *c, const grpc_op *ops, size_t nops, rpc_tag_t *tag)
{
    if (c->srv->cq_closing || c->injected)
        return -1;
    if (GRPC_CHECK(grpc_call_start_batch, c->call, ops, nops, tag, NULL) != GRPC_CALL_OK)
        return -1;
    c->refs++;
    return 0;
}

/* Start the final batch: initial metadata if not sent yet, an optional message (unary), and the
 * status. Takes ownership of bb. A failed start leaves nothing outstanding. */
static void call_send_final_locked(colld_rpc_call_t *c, grpc_status_code code, const char *message,
                                   grpc_byte_buffer *bb)
{
    grpc_op ops[3];
    size_t n = 0;

    if (c->injected) { /* keep the answer for colld_rpc_server_inject */
        c->inject_answered = true;
        c->inject_code = code;
        c->inject_resp = bb;
        return;
    }
    memset(ops, 0, sizeof(ops));
    if (!c->initial_md_sent)
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (bb != NULL) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = bb;
    }
    c->final_details = grpc_slice_from_copied_string(message != NULL ? message : "");
    c->final_started = true;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = code;
    ops[n++].data.send_status_from_server.status_details = &c->final_details;
    c->final_msg = bb;
    if (call_start_batch_locked(c, ops, n, &c->tag_final) == 0)
        c->initial_md_sent = true;
}

/* Start one streaming SEND_MESSAGE (with the initial metadata the first time). Takes ownership
 * of bb on success only. Returns 0 or -1. */
static int call_start_send_locked(colld_rpc_call_t *c, grpc_byte_buffer *bb)
{
    grpc_op ops[2];
    size_t n = 0;

    memset(ops, 0, sizeof(ops));
    if (!c->initial_md_sent)
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
    if (call_start_batch_locked(c, ops, n, &c->tag_send) != 0)
        return -1;
    c->initial_md_sent = true;
    c->send_in_flight = true;
    c->sending = bb;
    return 0;
}

/* Queue or start one streaming message. Takes ownership of bb in every case. Returns 0,
 * COLLD_RPC_SEND_FULL when the queue is at its bound (the sender is told when it drained), or -1
 * when the message cannot go out (client gone, shutdown, out of memory). */
static int call_send_locked(colld_rpc_call_t *c, grpc_byte_buffer *bb)
{
    rpc_msg_t *m;
    int rc = -1;
    size_t len;

    if (atomic_load(&c->cancelled) || c->srv->cq_closing)
        goto out;
    if (!c->send_in_flight) {
        rc = call_start_send_locked(c, bb);
        if (rc == 0)
            bb = NULL;
        goto out;
    }
    len = grpc_byte_buffer_length(bb);
    if (c->queued_msgs >= COLLD_RPC_STREAM_MAX_MSGS || c->queued_bytes + len > COLLD_RPC_STREAM_MAX_BYTES) {
        c->full = true;
        c->srv->refused_full++;
        rc = COLLD_RPC_SEND_FULL;
        goto out;
    }
    m = malloc(sizeof(*m));
    if (m == NULL)
        goto out;
    m->next = NULL;
    m->bb = bb;
    bb = NULL;
    if (c->queue_tail != NULL)
        c->queue_tail->next = m;
    else
        c->queue_head = m;
    c->queue_tail = m;
    c->queued_msgs++;
    c->queued_bytes += len;
    c->srv->queued_bytes += len;
    rc = 0;
out:
    if (bb != NULL)
        grpc_byte_buffer_destroy(bb);
    return rc;
}

/* Answer an owed call: the status (and, for unary, the response bb, owned afterwards) goes out
 * now, or after the queued streaming messages. Drops the user's reference: c may be gone on
 * return. A call no longer owed (answered or released) makes this a no-op. */
static void call_answer_locked(colld_rpc_call_t *c, grpc_status_code code, const char *message,
                               grpc_byte_buffer *bb)
{
    if (!c->owed) {
        if (bb != NULL)
            grpc_byte_buffer_destroy(bb);
        return;
    }
    c->owed = false;
    c->writable = NULL; /* the sender is done with the call */
    if (c->send_in_flight) {
        /* Only streaming calls have sends in flight, and they never carry bb here. */
        if (bb != NULL)
            grpc_byte_buffer_destroy(bb);
        c->finish_pending = true;
        c->finish_code = code;
        c->finish_message = message != NULL ? strdup(message) : NULL;
    } else {
        call_send_final_locked(c, code, message, bb);
    }
    call_unref_locked(c);
}

/* Arm one request slot: a registered method (slot < nmethods) or the generic one. The new call
 * object holds one reference for the request. Returns 0 or -1. */
static int server_arm_locked(colld_rpc_server_t *srv, size_t slot)
{
    colld_rpc_call_t *c;
    grpc_call_error err;
    int rc = -1;

    if (srv->shutting_down)
        return 0;
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        goto out;
    c->srv = srv;
    c->slot = slot;
    c->method = slot == RPC_GENERIC_SLOT ? NULL : &srv->methods[slot];
    c->deadline = gpr_inf_future(GPR_CLOCK_REALTIME);
    atomic_init(&c->cancelled, false);
    grpc_metadata_array_init(&c->request_md);
    grpc_call_details_init(&c->details);
    c->tag_request = (rpc_tag_t){.kind = RPC_TAG_REQUEST, .call = c};
    c->tag_close = (rpc_tag_t){.kind = RPC_TAG_CLOSE, .call = c};
    c->tag_send = (rpc_tag_t){.kind = RPC_TAG_SEND, .call = c};
    c->tag_final = (rpc_tag_t){.kind = RPC_TAG_FINAL, .call = c};
    c->refs = 1;
    c->next = srv->calls;
    if (srv->calls != NULL)
        srv->calls->prev = c;
    srv->calls = c;
    if (c->method == NULL)
        err = GRPC_CHECK(grpc_server_request_call, srv->server, &c->call, &c->details, &c->request_md, srv->cq,
                         srv->cq, &c->tag_request);
    else
        err = GRPC_CHECK(grpc_server_request_registered_call, srv->server, srv->handles[slot], &c->call,
                         &c->deadline, &c->request_md, &c->payload, srv->cq, srv->cq, &c->tag_request);
    if (err != GRPC_CALL_OK) {
        call_unref_locked(c);
        goto out;
    }
    rc = 0;
out:
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Completion-queue events                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* The descriptor number of a call's connection when it is one handed over ("fd:N"), else -1. */
static int call_peer_fd(grpc_call *call)
{
    char *peer = grpc_call_get_peer(call);
    int fd = -1;

    if (peer != NULL && strncmp(peer, "fd:", 3) == 0 && peer[3] >= '0' && peer[3] <= '9') {
        char *end = NULL;
        long v = strtol(peer + 3, &end, 10);
        if (*end == '\0' && v >= 0 && v <= INT_MAX)
            fd = (int)v;
    }
    gpr_free(peer);
    return fd;
}

/* A requested call arrived: re-arm its slot, watch for cancellation, then answer it ourselves
 * (unknown method, unparseable request, shutdown) or hand it to the method's handler. */
static void on_request(colld_rpc_call_t *c, bool ok)
{
    colld_rpc_server_t *srv = c->srv;
    ProtobufCMessage *req = NULL;
    colld_rpc_handler_fn handler = NULL;
    grpc_op op;
    int fd = ok ? call_peer_fd(c->call) : -1;

    pthread_mutex_lock(&srv->mu);
    if (!ok) {
        call_unref_locked(c); /* killed at shutdown: no call came */
        goto unlock;
    }
    if (server_arm_locked(srv, c->slot) != 0)
        LOG_ERROR_RL(RPC, "cannot re-arm RPC method %s: it is no longer served",
                     c->method != NULL ? c->method->path : "(generic)");
    if (c->method == NULL)
        c->deadline = c->details.deadline;
    if (fd >= 0 && (size_t)fd < srv->nconn_slots && srv->conns[fd] != NULL) {
        c->conn = srv->conns[fd];
        c->conn->active++;
        c->conn->calls++;
    }

    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    (void)call_start_batch_locked(c, &op, 1, &c->tag_close);

    c->owed = true;
    c->refs++; /* the user's reference, dropped by the answer */
    if (c->conn != NULL && c->conn->refusal != NULL) {
        call_answer_locked(c, GRPC_STATUS_RESOURCE_EXHAUSTED, c->conn->refusal, NULL);
    } else if (c->method == NULL) {
        call_answer_locked(c, GRPC_STATUS_UNIMPLEMENTED, "unknown method", NULL);
    } else if (srv->shutting_down) {
        call_answer_locked(c, GRPC_STATUS_UNAVAILABLE, "server shutting down", NULL);
    } else {
        req = colld_rpc_unpack(c->payload, c->method->request);
        if (c->payload != NULL) {
            grpc_byte_buffer_destroy(c->payload);
            c->payload = NULL;
        }
        if (req == NULL)
            call_answer_locked(c, GRPC_STATUS_INVALID_ARGUMENT, "cannot parse the request message", NULL);
        else
            handler = c->method->handler;
    }
    call_unref_locked(c); /* the request's reference; the user's keeps c alive for the handler */
unlock:
    pthread_mutex_unlock(&srv->mu);
    if (handler != NULL)
        handler(c, req, srv->ctx);
    if (req != NULL)
        protobuf_c_message_free_unpacked(req, NULL);
}

/* RECV_CLOSE_ON_SERVER completed: the call is over for the client (cancelled or not). */
static void on_close(colld_rpc_call_t *c)
{
    colld_rpc_server_t *srv = c->srv;

    pthread_mutex_lock(&srv->mu);
    if (c->close_cancelled) {
        atomic_store(&c->cancelled, true);
        call_drop_queue_locked(c);
    }
    call_unref_locked(c);
    pthread_mutex_unlock(&srv->mu);
}

/* A streaming send completed: start the next queued one, or the pending finish. */
static void on_send(colld_rpc_call_t *c, bool ok)
{
    colld_rpc_server_t *srv = c->srv;
    rpc_msg_t *m;

    pthread_mutex_lock(&srv->mu);
    grpc_byte_buffer_destroy(c->sending);
    c->sending = NULL;
    c->send_in_flight = false;
    if (!ok) {
        atomic_store(&c->cancelled, true);
        call_drop_queue_locked(c);
    }
    while (c->queue_head != NULL && !c->send_in_flight) {
        m = c->queue_head;
        c->queue_head = m->next;
        if (c->queue_head == NULL)
            c->queue_tail = NULL;
        size_t len = grpc_byte_buffer_length(m->bb);
        c->queued_msgs--;
        c->queued_bytes -= len;
        srv->queued_bytes -= len;
        if (call_start_send_locked(c, m->bb) != 0) {
            grpc_byte_buffer_destroy(m->bb);
            call_drop_queue_locked(c);
        }
        free(m);
    }
    if (c->queued_msgs <= COLLD_RPC_STREAM_MAX_MSGS / 2 && c->queued_bytes <= COLLD_RPC_STREAM_MAX_BYTES / 2)
        call_wake_sender_locked(c);
    if (!c->send_in_flight && c->finish_pending) {
        c->finish_pending = false;
        call_send_final_locked(c, c->finish_code, c->finish_message, NULL);
    }
    call_unref_locked(c);
    pthread_mutex_unlock(&srv->mu);
}

/* The final batch completed: release what it used. */
static void on_final(colld_rpc_call_t *c)
{
    colld_rpc_server_t *srv = c->srv;

    pthread_mutex_lock(&srv->mu);
    call_unref_locked(c);
    pthread_mutex_unlock(&srv->mu);
}

/* The server finished shutting down: release every call still owed (later answers become
 * no-ops, the objects stay until destroy frees them), refuse new batches, close the queue. */
static void on_shutdown(colld_rpc_server_t *srv)
{
    colld_rpc_call_t *c;

    pthread_mutex_lock(&srv->mu);
    srv->cq_closing = true;
    for (c = srv->calls; c != NULL; c = c->next) {
        c->owed = false; /* a released call keeps its user reference until destroy */
        c->finish_pending = false;
        c->writable = NULL;
        call_drop_queue_locked(c);
    }
    pthread_mutex_unlock(&srv->mu);
    grpc_completion_queue_shutdown(srv->cq);
}

/* Serve the completion queue until it is shut down and drained. Runs on the server thread, or
 * in destroy for a server that was never started. */
static void *server_cq_loop(void *arg)
{
    colld_rpc_server_t *srv = arg;
    grpc_event ev;
    rpc_tag_t *tag;

    for (;;) {
        ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        tag = ev.tag;
        switch (tag->kind) {
        case RPC_TAG_REQUEST:
            on_request(tag->call, ev.success != 0);
            break;
        case RPC_TAG_CLOSE:
            on_close(tag->call);
            break;
        case RPC_TAG_SEND:
            on_send(tag->call, ev.success != 0);
            break;
        case RPC_TAG_FINAL:
            on_final(tag->call);
            break;
        case RPC_TAG_SHUTDOWN:
            on_shutdown(srv);
            break;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Server lifetime                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* Create the server, register the methods and bind the address (see the header). On failure
 * everything is released here and *out stays NULL. */
int colld_rpc_server_create(const char *address, const colld_rpc_method_t *methods, size_t nmethods,
                            void *ctx, colld_rpc_server_t **out, char *err, size_t err_len)
{
    colld_rpc_server_t *srv = NULL;
    grpc_server_credentials *creds = NULL;
    int rc = -1;
    size_t i;

    *out = NULL;
    grpc_init();
    srv = calloc(1, sizeof(*srv));
    if (srv == NULL || (nmethods > 0 && (srv->handles = calloc(nmethods, sizeof(void *))) == NULL)) {
        snprintf(err, err_len, "out of memory creating the RPC server");
        goto out;
    }
    pthread_mutex_init(&srv->mu, NULL);
    srv->methods = methods;
    srv->nmethods = nmethods;
    srv->ctx = ctx;
    srv->tag_shutdown = (rpc_tag_t){.kind = RPC_TAG_SHUTDOWN, .call = NULL};
    srv->server = grpc_server_create(NULL, NULL);
    srv->cq = grpc_completion_queue_create_for_next(NULL);
    if (srv->server == NULL || srv->cq == NULL) {
        snprintf(err, err_len, "cannot create the gRPC server");
        goto out;
    }
    grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
    for (i = 0; i < nmethods; i++) {
        srv->handles[i] = grpc_server_register_method(srv->server, methods[i].path, NULL,
                                                      GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
        if (srv->handles[i] == NULL) {
            snprintf(err, err_len, "cannot register RPC method %s (duplicate?)", methods[i].path);
            goto out;
        }
    }
    srv->fd_creds = grpc_insecure_server_credentials_create();
    creds = grpc_insecure_server_credentials_create();
    if (srv->fd_creds == NULL || creds == NULL) {
        snprintf(err, err_len, "cannot create the gRPC server credentials");
        goto out;
    }
    if (address != NULL && grpc_server_add_http2_port(srv->server, address, creds) == 0) {
        snprintf(err, err_len, "cannot listen on %s (bad address, missing directory or no permission)",
                 address);
        goto out;
    }
    *out = srv;
    rc = 0;
out:
    if (creds != NULL)
        grpc_server_credentials_release(creds);
    if (rc != 0 && srv != NULL) {
        if (srv->server != NULL)
            grpc_server_destroy(srv->server);
        if (srv->cq != NULL) {
            grpc_completion_queue_shutdown(srv->cq);
            while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
                   GRPC_QUEUE_SHUTDOWN)
                ;
            grpc_completion_queue_destroy(srv->cq);
        }
        if (srv->fd_creds != NULL)
            grpc_server_credentials_release(srv->fd_creds);
        pthread_mutex_destroy(&srv->mu);
        free(srv->handles);
        free(srv);
    }
    if (rc != 0)
        grpc_shutdown();
    return rc;
}

/* Start serving: start gRPC, arm one request per method plus the generic one, start the
 * completion-queue thread. */
int colld_rpc_server_start(colld_rpc_server_t *srv)
{
    int rc = -1;
    size_t i;

    if (srv->server_started)
        goto out;
    grpc_server_start(srv->server);
    srv->server_started = true;
    pthread_mutex_lock(&srv->mu);
    rc = server_arm_locked(srv, RPC_GENERIC_SLOT);
    for (i = 0; i < srv->nmethods && rc == 0; i++)
        rc = server_arm_locked(srv, i);
    pthread_mutex_unlock(&srv->mu);
    if (rc != 0) {
        LOG_ERROR(RPC, "cannot arm the RPC methods");
        goto out;
    }
    if (pthread_create(&srv->thread, NULL, server_cq_loop, srv) != 0) {
        LOG_ERROR(RPC, "cannot start the RPC server thread");
        rc = -1;
        goto out;
    }
    srv->thread_started = true;
out:
    return rc;
}

/* Shut down (see the header): stop accepting, cancel every call, let the queue thread drain the
 * queue, then free the calls still held for an answer, the server and the queue. */
void colld_rpc_server_destroy(colld_rpc_server_t *srv)
{
    if (srv == NULL)
        return;
    pthread_mutex_lock(&srv->mu);
    srv->shutting_down = true;
    pthread_mutex_unlock(&srv->mu);

    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->tag_shutdown);
    grpc_server_cancel_all_calls(srv->server);
    if (srv->thread_started)
        pthread_join(srv->thread, NULL);
    else
        (void)server_cq_loop(srv);

    /* The queue is drained: only released calls remain, nothing in gRPC refers to them. */
    pthread_mutex_lock(&srv->mu);
    while (srv->calls != NULL)
        call_free_locked(srv->calls);
    pthread_mutex_unlock(&srv->mu);

    grpc_server_destroy(srv->server);
    grpc_completion_queue_destroy(srv->cq);
    for (size_t i = 0; i < srv->nconn_slots; i++)
        conn_free(srv->conns[i]);
    free(srv->conns);
    grpc_server_credentials_release(srv->fd_creds);
    pthread_mutex_destroy(&srv->mu);
    free(srv->handles);
    free(srv);
    grpc_shutdown();
}

/* ------------------------------------------------------------------------------------------ */
/* Connections handed over                                                                     */
/* ------------------------------------------------------------------------------------------ */

uint64_t colld_rpc_server_add_conn(colld_rpc_server_t *srv, int fd, uid_t uid, pid_t pid, const char *refusal)
{
    rpc_conn_t *conn = calloc(1, sizeof(*conn));
    uint64_t id = 0;

    if (conn == NULL || (refusal != NULL && (conn->refusal = strdup(refusal)) == NULL))
        goto out;
    conn->uid = uid;
    conn->pid = pid;
    pthread_mutex_lock(&srv->mu);
    if (srv->shutting_down || !srv->server_started) {
        pthread_mutex_unlock(&srv->mu);
        goto out;
    }
    if ((size_t)fd >= srv->nconn_slots) {
        size_t n = COLLD_MAX((size_t)fd + 1, srv->nconn_slots * 2);
        rpc_conn_t **grown = realloc(srv->conns, n * sizeof(*grown));
        if (grown == NULL) {
            pthread_mutex_unlock(&srv->mu);
            goto out;
        }
        memset(grown + srv->nconn_slots, 0, (n - srv->nconn_slots) * sizeof(*grown));
        srv->conns = grown;
        srv->nconn_slots = n;
    }
    if (srv->conns[fd] != NULL) /* the number's previous connection ended before its owner noticed */
        conn_detach_locked(srv, fd);
    conn->id = id = ++srv->next_conn_id;
    srv->conns[fd] = conn;
    conn = NULL;
    pthread_mutex_unlock(&srv->mu);
    grpc_server_add_channel_from_fd(srv->server, fd, srv->fd_creds);
    return id;
out:
    conn_free(conn);
    close(fd);
    return 0;
}

int colld_rpc_server_conn_calls(colld_rpc_server_t *srv, int fd, uint64_t id, uint64_t *total, unsigned *active)
{
    int rc = -1;

    pthread_mutex_lock(&srv->mu);
    if (fd >= 0 && (size_t)fd < srv->nconn_slots && srv->conns[fd] != NULL && srv->conns[fd]->id == id) {
        *total = srv->conns[fd]->calls;
        *active = srv->conns[fd]->active;
        rc = 0;
    }
    pthread_mutex_unlock(&srv->mu);
    return rc;
}

void colld_rpc_server_conn_forget(colld_rpc_server_t *srv, int fd, uint64_t id)
{
    pthread_mutex_lock(&srv->mu);
    if (fd >= 0 && (size_t)fd < srv->nconn_slots && srv->conns[fd] != NULL && srv->conns[fd]->id == id)
        conn_detach_locked(srv, fd);
    pthread_mutex_unlock(&srv->mu);
}

void colld_rpc_server_queue_stats(colld_rpc_server_t *srv, uint64_t *queued_bytes, uint64_t *refused_full)
{
    pthread_mutex_lock(&srv->mu);
    *queued_bytes = srv->queued_bytes;
    *refused_full = srv->refused_full;
    pthread_mutex_unlock(&srv->mu);
}

int colld_rpc_call_peer(const colld_rpc_call_t *call, uid_t *uid, pid_t *pid)
{
    colld_rpc_server_t *srv = call->srv;
    int rc = -1;

    pthread_mutex_lock(&srv->mu);
    if (call->conn != NULL) {
        *uid = call->conn->uid;
        *pid = call->conn->pid;
        rc = 0;
    }
    pthread_mutex_unlock(&srv->mu);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* In-process calls                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* A call object as on_request makes one, but with no gRPC call behind it: its batches are never
 * started, its answer is kept for the injector, its streamed messages go nowhere. */
int colld_rpc_server_inject(colld_rpc_server_t *srv, const char *path, const uint8_t *bytes, size_t len,
                            grpc_status_code *code, uint8_t **resp, size_t *resp_len)
{
    const colld_rpc_method_t *m = NULL;
    ProtobufCMessage *req = NULL;
    colld_rpc_call_t *c;
    grpc_byte_buffer *bb;
    grpc_slice slice;
    size_t i;
    int rc;

    *code = GRPC_STATUS_UNKNOWN;
    *resp = NULL;
    *resp_len = 0;
    for (i = 0; i < srv->nmethods && m == NULL; i++)
        if (strcmp(srv->methods[i].path, path) == 0)
            m = &srv->methods[i];
    c = m != NULL ? calloc(1, sizeof(*c)) : NULL;
    if (c == NULL)
        return -1;
    c->srv = srv;
    c->method = m;
    c->slot = (size_t)(m - srv->methods);
    c->injected = true;
    c->deadline = gpr_inf_future(GPR_CLOCK_REALTIME);
    atomic_init(&c->cancelled, false);
    grpc_metadata_array_init(&c->request_md);
    grpc_call_details_init(&c->details);
    c->refs = 2; /* the user's (dropped by the answer) and ours */
    c->owed = true;
    pthread_mutex_lock(&srv->mu);
    c->next = srv->calls;
    if (srv->calls != NULL)
        srv->calls->prev = c;
    srv->calls = c;
    pthread_mutex_unlock(&srv->mu);

    slice = grpc_slice_from_copied_buffer((const char *)bytes, len);
    bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    req = colld_rpc_unpack(bb, m->request); /* the decoder on_request uses */
    grpc_byte_buffer_destroy(bb);
    if (req == NULL) {
        pthread_mutex_lock(&srv->mu);
        call_answer_locked(c, GRPC_STATUS_INVALID_ARGUMENT, "cannot parse the request message", NULL);
        pthread_mutex_unlock(&srv->mu);
    } else {
        m->handler(c, req, srv->ctx);
        protobuf_c_message_free_unpacked(req, NULL);
    }

    pthread_mutex_lock(&srv->mu);
    if (m->server_streaming)
        atomic_store(&c->cancelled, true); /* nobody reads it: its sender ends it */
    rc = c->inject_answered ? 0 : 1;
    if (c->inject_answered) {
        grpc_byte_buffer_reader reader;
        *code = c->inject_code;
        if (c->inject_resp != NULL && grpc_byte_buffer_reader_init(&reader, c->inject_resp)) {
            grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
            *resp_len = GRPC_SLICE_LENGTH(all);
            *resp = malloc(*resp_len + 1);
            if (*resp != NULL)
                memcpy(*resp, GRPC_SLICE_START_PTR(all), *resp_len);
            else
                *resp_len = 0;
            grpc_slice_unref(all);
            grpc_byte_buffer_reader_destroy(&reader);
        }
    }
    call_unref_locked(c);
    pthread_mutex_unlock(&srv->mu);
    return rc;
}

bool colld_rpc_server_idle(colld_rpc_server_t *srv)
{
    bool idle = true;

    pthread_mutex_lock(&srv->mu);
    for (colld_rpc_call_t *c = srv->calls; c != NULL && idle; c = c->next)
        idle = !c->injected;
    pthread_mutex_unlock(&srv->mu);
    return idle;
}

/* ------------------------------------------------------------------------------------------ */
/* The self-probe                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* One unary call with everything in one batch, on its own channel and pluck queue. */
int colld_rpc_probe(const char *target, const char *path, int timeout_ms, char *why, size_t why_len)
{
    grpc_channel_credentials *creds;
    grpc_channel *ch = NULL;
    grpc_completion_queue *cq = NULL;
    grpc_call *call = NULL;
    grpc_byte_buffer *req = NULL, *resp = NULL;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_slice method = grpc_slice_from_copied_string(path);
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_op ops[6];
    grpc_event ev;
    int rc = -1;

    grpc_init();
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    creds = grpc_insecure_credentials_create();
    if (creds != NULL)
        ch = grpc_channel_create(target, creds, NULL);
    cq = grpc_completion_queue_create_for_pluck(NULL);
    req = grpc_raw_byte_buffer_create(NULL, 0);
    if (ch == NULL || cq == NULL || req == NULL) {
        snprintf(why, why_len, "cannot create a channel to %s", target);
        goto out;
    }
    call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL, deadline, NULL);
    if (call == NULL) {
        snprintf(why, why_len, "cannot create a call to %s", target);
        goto out;
    }
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &resp;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    if (GRPC_CHECK(grpc_call_start_batch, call, ops, 6, ops, NULL) != GRPC_CALL_OK) {
        snprintf(why, why_len, "cannot start a call to %s", target);
        goto out;
    }
    /* The call's own deadline ends it; the queue always reports the batch. */
    ev = grpc_completion_queue_pluck(cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE) {
        snprintf(why, why_len, "the probe's completion queue failed");
        goto out;
    }
    if (code != GRPC_STATUS_OK) {
        char *text = grpc_slice_to_c_string(details);
        snprintf(why, why_len, "%s on %s: gRPC status %d (%s)", path, target, (int)code, text ? text : "");
        gpr_free(text);
        goto out;
    }
    rc = 0;
out:
    if (call != NULL)
        grpc_call_unref(call);
    if (ch != NULL)
        grpc_channel_destroy(ch);
    if (creds != NULL)
        grpc_channel_credentials_release(creds);
    if (cq != NULL) {
        grpc_completion_queue_shutdown(cq);
        grpc_completion_queue_destroy(cq);
    }
    if (req != NULL)
        grpc_byte_buffer_destroy(req);
    if (resp != NULL)
        grpc_byte_buffer_destroy(resp);
    grpc_slice_unref(details);
    grpc_slice_unref(method);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    grpc_shutdown();
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Answering calls                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* Answer with OK and resp. For a streaming method this is one last message then finish OK. */
void colld_rpc_reply(colld_rpc_call_t *call, const ProtobufCMessage *resp)
{
    colld_rpc_server_t *srv = call->srv;
    grpc_byte_buffer *bb = colld_rpc_pack(resp);

    pthread_mutex_lock(&srv->mu);
    if (!call->owed) {
        if (bb != NULL)
            grpc_byte_buffer_destroy(bb);
    } else if (bb == NULL) {
        call_answer_locked(call, GRPC_STATUS_INTERNAL, "cannot pack the response message", NULL);
    } else if (call->method->server_streaming) {
        (void)call_send_locked(call, bb);
        call_answer_locked(call, GRPC_STATUS_OK, NULL, NULL);
    } else {
        call_answer_locked(call, GRPC_STATUS_OK, NULL, bb);
    }
    pthread_mutex_unlock(&srv->mu);
}

/* Answer with a non-OK status (an OK code here sends no message, which a unary client reports as
 * an error: use colld_rpc_reply for success). */
void colld_rpc_fail(colld_rpc_call_t *call, grpc_status_code code, const char *message)
{
    colld_rpc_server_t *srv = call->srv;

    pthread_mutex_lock(&srv->mu);
    call_answer_locked(call, code, message, NULL);
    pthread_mutex_unlock(&srv->mu);
}

/* Queue one message of a streaming call; refused for unary calls and answered calls. */
int colld_rpc_send(colld_rpc_call_t *call, const ProtobufCMessage *msg)
{
    colld_rpc_server_t *srv = call->srv;
    grpc_byte_buffer *bb;
    int rc = -1;

    if (!call->method->server_streaming)
        return -1;
    bb = colld_rpc_pack(msg);
    if (bb == NULL)
        return -1;
    pthread_mutex_lock(&srv->mu);
    if (call->owed)
        rc = call_send_locked(call, bb);
    else
        grpc_byte_buffer_destroy(bb);
    pthread_mutex_unlock(&srv->mu);
    return rc;
}

/* Register the sender's wake-up for a full queue (see the header). */
void colld_rpc_set_writable(colld_rpc_call_t *call, colld_rpc_writable_fn fn, void *arg)
{
    colld_rpc_server_t *srv = call->srv;

    pthread_mutex_lock(&srv->mu);
    if (call->owed) {
        call->writable = fn;
        call->writable_arg = arg;
    }
    pthread_mutex_unlock(&srv->mu);
}

/* End a stream: the status follows the queued messages. */
void colld_rpc_finish(colld_rpc_call_t *call, grpc_status_code code, const char *message)
{
    colld_rpc_fail(call, code, message);
}

/* The deadline, converted to the wall clock. Immutable once the call was dispatched. */
int64_t colld_rpc_call_deadline_ms(const colld_rpc_call_t *call)
{
    gpr_timespec t = gpr_convert_clock_type(call->deadline, GPR_CLOCK_REALTIME);

    if (gpr_time_cmp(t, gpr_inf_future(GPR_CLOCK_REALTIME)) == 0)
        return INT64_MAX;
    return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Cancelled by the client, failed to send, or past the deadline. */
bool colld_rpc_call_cancelled(const colld_rpc_call_t *call)
{
    gpr_timespec t;

    if (atomic_load(&call->cancelled))
        return true;
    t = gpr_convert_clock_type(call->deadline, GPR_CLOCK_REALTIME);
    return gpr_time_cmp(gpr_now(GPR_CLOCK_REALTIME), t) >= 0;
}
