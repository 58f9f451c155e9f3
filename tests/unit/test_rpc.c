/*
 * test_rpc.c - unit tests of the gRPC wrappers: a real server (server/control/rpc) and a real client
 * (client/rpc) in one process, over a unix socket in a fresh temporary directory.
 *
 * Every wait is bounded: a hang fails the test instead of blocking until the CTest timeout.
 */
#include "client/rpc/rpc_client.h"
#include "common/log.h"
#include "common/rpc_codec.h"
#include "server/control/rpc/rpc_server.h"
#include "rpc_test.pb-c.h"

#include <errno.h>
#include <grpc/grpc_security.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define PATH_ECHO "/colld.test.Test/Echo"
#define PATH_ADD "/colld.test.Test/Add"
#define PATH_HOLD "/colld.test.Test/Hold"
#define PATH_LATER "/colld.test.Test/Later"
#define PATH_COUNT "/colld.test.Test/Count"
#define PATH_LATER_COUNT "/colld.test.Test/LaterCount"
#define PATH_UNKNOWN "/colld.test.Test/Nope"

#define MAX_HELD 16
#define WAIT_MS 5000 /* bound of every wait for something that should be quick */

/* Work handed by a handler to the worker thread, which answers from outside the queue thread. */
typedef struct later_item {
    struct later_item *next;
    colld_rpc_call_t *call;
    bool stream; /* LaterCount: send n items then finish; else Later: reply to an echo */
    int n;
    char text[64];
} later_item_t;

typedef struct {
    char dir[64];
    char sock[128];
    char target[160];
    colld_rpc_server_t *srv;
    colld_rpc_channel_t *ch;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    colld_rpc_call_t *held[MAX_HELD]; /* calls kept unanswered by Hold and held streams */
    size_t nheld;
    int64_t last_deadline_ms;         /* seen by the Echo handler */

    later_item_t *later_head, *later_tail;
    bool worker_stop;
    pthread_t worker;
    bool worker_started;
} fixture_t;

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Monotonic milliseconds, for measuring how long things take. */
static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wall-clock milliseconds, to compare with colld_rpc_call_deadline_ms. */
static int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* An absolute CLOCK_REALTIME time ms from now, for pthread_cond_timedwait. */
static struct timespec abs_after_ms(int ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Wait until at least n calls are held. Returns true if they are, false after WAIT_MS. */
static bool wait_held(fixture_t *f, size_t n)
{
    struct timespec until = abs_after_ms(WAIT_MS);
    bool ok;

    pthread_mutex_lock(&f->mu);
    while (f->nheld < n)
        if (pthread_cond_timedwait(&f->cv, &f->mu, &until) == ETIMEDOUT)
            break;
    ok = f->nheld >= n;
    pthread_mutex_unlock(&f->mu);
    return ok;
}

/* Keep a call unanswered for the test to deal with later. */
static void hold_call(fixture_t *f, colld_rpc_call_t *call)
{
    pthread_mutex_lock(&f->mu);
    assert_true(f->nheld < MAX_HELD);
    f->held[f->nheld++] = call;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* Take the oldest held call (the test answers it). */
static colld_rpc_call_t *take_held(fixture_t *f)
{
    colld_rpc_call_t *call;

    pthread_mutex_lock(&f->mu);
    assert_true(f->nheld > 0);
    call = f->held[0];
    memmove(&f->held[0], &f->held[1], (f->nheld - 1) * sizeof(f->held[0]));
    f->nheld--;
    pthread_mutex_unlock(&f->mu);
    return call;
}

/* Send items 0..n-1 of a stream. */
static void send_items(colld_rpc_call_t *call, int n)
{
    char text[32];
    int i;

    for (i = 0; i < n; i++) {
        Colld__Test__StreamItem item = COLLD__TEST__STREAM_ITEM__INIT;
        snprintf(text, sizeof(text), "item-%d", i);
        item.index = i;
        item.text = text;
        if (colld_rpc_send(call, &item.base) != 0)
            break;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Handlers (run on the server's queue thread)                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Echo: reply at once with "echo:" + text and n + 1; note the call's deadline. */
static void handle_echo(colld_rpc_call_t *call, const ProtobufCMessage *req, void *ctx)
{
    fixture_t *f = ctx;
    const Colld__Test__EchoRequest *r = (const Colld__Test__EchoRequest *)req;
    Colld__Test__EchoReply rep = COLLD__TEST__ECHO_REPLY__INIT;
    char text[128];

    snprintf(text, sizeof(text), "echo:%s", r->text);
    rep.text = text;
    rep.n = r->n + 1;
    pthread_mutex_lock(&f->mu);
    f->last_deadline_ms = colld_rpc_call_deadline_ms(call);
    pthread_mutex_unlock(&f->mu);
    colld_rpc_reply(call, &rep.base);
}

/* Add: reply at once with a + b. */
static void handle_add(colld_rpc_call_t *call, const ProtobufCMessage *req, void *ctx)
{
    const Colld__Test__AddRequest *r = (const Colld__Test__AddRequest *)req;
    Colld__Test__AddReply rep = COLLD__TEST__ADD_REPLY__INIT;

    (void)ctx;
    rep.sum = r->a + r->b;
    colld_rpc_reply(call, &rep.base);
}

/* Hold: keep the call unanswered (the test answers it, or never does). */
static void handle_hold(colld_rpc_call_t *call, const ProtobufCMessage *req, void *ctx)
{
    (void)req;
    hold_call(ctx, call);
}

/* Queue work for the worker thread, which answers the call later. */
static void enqueue_later(fixture_t *f, colld_rpc_call_t *call, bool stream, int n, const char *text)
{
    later_item_t *it = calloc(1, sizeof(*it));

    assert_non_null(it);
    it->call = call;
    it->stream = stream;
    it->n = n;
    snprintf(it->text, sizeof(it->text), "%s", text);
    pthread_mutex_lock(&f->mu);
    if (f->later_tail != NULL)
        f->later_tail->next = it;
    else
        f->later_head = it;
    f->later_tail = it;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* Later: deferred echo, answered by the worker thread. */
static void handle_later(colld_rpc_call_t *call, const ProtobufCMessage *req, void *ctx)
{
    const Colld__Test__EchoRequest *r = (const Colld__Test__EchoRequest *)req;

    enqueue_later(ctx, call, false, r->n, r->text);
}

/* Count: stream `count` items, then finish with fail_code, or hold the stream open. */
static void handle_count(colld_rpc_call_t *call, const ProtobufCMessage *req, void *ctx)
{
    const Colld__Test__StreamRequest *r = (const Colld__Test__StreamRequest *)req;

    send_items(call, r->count);
    if (r->hold)
        hold_call(ctx, call);
    else
        colld_rpc_finish(call, (grpc_status_code)r->fail_code, r->fail_code != 0 ? "stopped" : NULL);
}

/* LaterCount: a stream served entirely by the worker thread. */
static void handle_later_count(colld_rpc_call_t *call, const ProtobufCMessage *req, void *ctx)
{
    const Colld__Test__StreamRequest *r = (const Colld__Test__StreamRequest *)req;

    enqueue_later(ctx, call, true, r->count, "");
}

static const colld_rpc_method_t test_methods[] = {
    {.path = PATH_ECHO, .request = &colld__test__echo_request__descriptor, .handler = handle_echo},
    {.path = PATH_ADD, .request = &colld__test__add_request__descriptor, .handler = handle_add},
    {.path = PATH_HOLD, .request = &colld__test__echo_request__descriptor, .handler = handle_hold},
    {.path = PATH_LATER, .request = &colld__test__echo_request__descriptor, .handler = handle_later},
    {.path = PATH_COUNT,
     .request = &colld__test__stream_request__descriptor,
     .handler = handle_count,
     .server_streaming = true},
    {.path = PATH_LATER_COUNT,
     .request = &colld__test__stream_request__descriptor,
     .handler = handle_later_count,
     .server_streaming = true},
};

/* The worker: answers queued calls from a thread that is not the server's. Drains the queue
 * before it stops. */
static void *worker_main(void *arg)
{
    fixture_t *f = arg;
    later_item_t *it;

    for (;;) {
        pthread_mutex_lock(&f->mu);
        while (f->later_head == NULL && !f->worker_stop)
            pthread_cond_wait(&f->cv, &f->mu);
        it = f->later_head;
        if (it != NULL) {
            f->later_head = it->next;
            if (f->later_head == NULL)
                f->later_tail = NULL;
        }
        pthread_mutex_unlock(&f->mu);
        if (it == NULL)
            break;
        if (it->stream) {
            send_items(it->call, it->n);
            colld_rpc_finish(it->call, GRPC_STATUS_OK, NULL);
        } else {
            Colld__Test__EchoReply rep = COLLD__TEST__ECHO_REPLY__INIT;
            char text[128];
            snprintf(text, sizeof(text), "later:%s", it->text);
            rep.text = text;
            rep.n = it->n * 2;
            colld_rpc_reply(it->call, &rep.base);
        }
        free(it);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Fixture                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* A server with the test methods on a socket in a new temporary directory, its worker thread
 * and a client channel to it. */
static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    char err[256] = "";

    if (f == NULL)
        return -1;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    snprintf(f->dir, sizeof(f->dir), "/tmp/colld-rpc-test-XXXXXX");
    if (mkdtemp(f->dir) == NULL)
        return -1;
    snprintf(f->sock, sizeof(f->sock), "%s/rpc.sock", f->dir);
    snprintf(f->target, sizeof(f->target), "unix:%s", f->sock);
    if (colld_rpc_server_create(f->target, test_methods, sizeof(test_methods) / sizeof(test_methods[0]), f,
                                &f->srv, err, sizeof(err)) != 0) {
        fprintf(stderr, "server create: %s\n", err);
        return -1;
    }
    if (colld_rpc_server_start(f->srv) != 0)
        return -1;
    if (pthread_create(&f->worker, NULL, worker_main, f) != 0)
        return -1;
    f->worker_started = true;
    if (colld_rpc_channel_create(f->target, &f->ch) != 0)
        return -1;
    *state = f;
    return 0;
}

/* Stop the worker (after it answered what it had), destroy the server (freeing calls still
 * held), the channel and the directory. */
static int teardown(void **state)
{
    fixture_t *f = *state;

    if (f->worker_started) {
        pthread_mutex_lock(&f->mu);
        f->worker_stop = true;
        pthread_cond_broadcast(&f->cv);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->worker, NULL);
    }
    colld_rpc_server_destroy(f->srv);
    colld_rpc_channel_destroy(f->ch);
    unlink(f->sock);
    rmdir(f->dir);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
    return 0;
}

/* An echo call; checks the reply. */
static void check_echo(colld_rpc_channel_t *ch, const char *path, const char *text, int n, const char *prefix,
                       int expect_n)
{
    Colld__Test__EchoRequest req = COLLD__TEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    char details[128];
    char expect[160];
    grpc_status_code code;

    req.text = (char *)text;
    req.n = n;
    code = colld_rpc_unary(ch, path, &req.base, &colld__test__echo_reply__descriptor, WAIT_MS, &resp, details,
                           sizeof(details));
    assert_int_equal(code, GRPC_STATUS_OK);
    assert_non_null(resp);
    snprintf(expect, sizeof(expect), "%s%s", prefix, text);
    assert_string_equal(((Colld__Test__EchoReply *)resp)->text, expect);
    assert_int_equal(((Colld__Test__EchoReply *)resp)->n, expect_n);
    protobuf_c_message_free_unpacked(resp, NULL);
}

/* An add call; checks the sum. */
static void check_add(colld_rpc_channel_t *ch, int64_t a, int64_t b)
{
    Colld__Test__AddRequest req = COLLD__TEST__ADD_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    grpc_status_code code;

    req.a = a;
    req.b = b;
    code = colld_rpc_unary(ch, PATH_ADD, &req.base, &colld__test__add_reply__descriptor, WAIT_MS, &resp, NULL, 0);
    assert_int_equal(code, GRPC_STATUS_OK);
    assert_non_null(resp);
    assert_true(((Colld__Test__AddReply *)resp)->sum == a + b);
    protobuf_c_message_free_unpacked(resp, NULL);
}

/* A unary echo call made by another thread while the test thread acts. */
typedef struct {
    colld_rpc_channel_t *ch;
    const char *path;
    int timeout_ms;
    grpc_status_code code;
    char text[128]; /* reply text on OK */
    char details[128];
    pthread_t thread;
} async_call_t;

/* Thread body of async_call_start. */
static void *async_call_main(void *arg)
{
    async_call_t *a = arg;
    Colld__Test__EchoRequest req = COLLD__TEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;

    req.text = "async";
    a->code = colld_rpc_unary(a->ch, a->path, &req.base, &colld__test__echo_reply__descriptor, a->timeout_ms, &resp,
                              a->details, sizeof(a->details));
    if (resp != NULL) {
        snprintf(a->text, sizeof(a->text), "%s", ((Colld__Test__EchoReply *)resp)->text);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return NULL;
}

/* Start an echo call on path in a new thread. */
static void async_call_start(async_call_t *a, colld_rpc_channel_t *ch, const char *path, int timeout_ms)
{
    memset(a, 0, sizeof(*a));
    a->ch = ch;
    a->path = path;
    a->timeout_ms = timeout_ms;
    a->code = GRPC_STATUS_UNKNOWN;
    assert_int_equal(pthread_create(&a->thread, NULL, async_call_main, a), 0);
}

/* Join a thread, failing the test if it does not end within WAIT_MS. */
static void join_bounded(pthread_t t)
{
    struct timespec until = abs_after_ms(WAIT_MS);

    assert_int_equal(pthread_timedjoin_np(t, NULL, &until), 0);
}

/* Read a whole stream of `count` items; checks them and returns the final status. */
static grpc_status_code read_stream(colld_rpc_channel_t *ch, const char *path, int count, int fail_code,
                                    int expect_items, char *details, size_t details_len)
{
    Colld__Test__StreamRequest req = COLLD__TEST__STREAM_REQUEST__INIT;
    colld_rpc_stream_t *s = NULL;
    ProtobufCMessage *msg = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    char expect[32];
    int got = 0;
    int rc;

    req.count = count;
    req.fail_code = fail_code;
    assert_int_equal(colld_rpc_stream_open(ch, path, &req.base, &colld__test__stream_item__descriptor, WAIT_MS, &s),
                     GRPC_STATUS_OK);
    while ((rc = colld_rpc_stream_next(s, &msg, &code, details, details_len)) == 0) {
        Colld__Test__StreamItem *item = (Colld__Test__StreamItem *)msg;
        snprintf(expect, sizeof(expect), "item-%d", got);
        assert_int_equal(item->index, got);
        assert_string_equal(item->text, expect);
        protobuf_c_message_free_unpacked(msg, NULL);
        got++;
    }
    assert_int_equal(rc, 1);
    assert_int_equal(got, expect_items);
    /* After the end, next keeps saying so. */
    assert_int_equal(colld_rpc_stream_next(s, &msg, NULL, NULL, 0), 1);
    assert_null(msg);
    colld_rpc_stream_close(s);
    return code;
}

/* ------------------------------------------------------------------------------------------ */
/* Tests                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Two methods dispatch to their handlers with the right request and response contents, and the
 * handler sees the client's deadline (or none). */
static void test_unary_dispatch(void **state)
{
    fixture_t *f = *state;
    int64_t before = wall_ms(), dl;
    Colld__Test__EchoRequest empty = COLLD__TEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;

    check_echo(f->ch, PATH_ECHO, "hello", 41, "echo:", 42);
    pthread_mutex_lock(&f->mu);
    dl = f->last_deadline_ms;
    pthread_mutex_unlock(&f->mu);
    assert_true(dl >= before + WAIT_MS - 1000 && dl <= wall_ms() + WAIT_MS + 1000);
    check_add(f->ch, 40, 2);
    check_add(f->ch, -7, INT64_C(1) << 40);

    /* No deadline: the handler sees INT64_MAX. An empty request is a valid message. */
    assert_int_equal(colld_rpc_unary(f->ch, PATH_ECHO, &empty.base, &colld__test__echo_reply__descriptor, 0, &resp,
                                     NULL, 0),
                     GRPC_STATUS_OK);
    assert_string_equal(((Colld__Test__EchoReply *)resp)->text, "echo:");
    assert_int_equal(((Colld__Test__EchoReply *)resp)->n, 1);
    protobuf_c_message_free_unpacked(resp, NULL);
    pthread_mutex_lock(&f->mu);
    dl = f->last_deadline_ms;
    pthread_mutex_unlock(&f->mu);
    assert_true(dl == INT64_MAX);
}

/* A method the server does not know fails UNIMPLEMENTED at once (unary and streaming). */
static void test_unknown_method(void **state)
{
    fixture_t *f = *state;
    Colld__Test__EchoRequest req = COLLD__TEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    char details[128];
    int64_t t0 = mono_ms();
    grpc_status_code code;

    code = colld_rpc_unary(f->ch, PATH_UNKNOWN, &req.base, &colld__test__echo_reply__descriptor, 20000, &resp,
                           details, sizeof(details));
    assert_int_equal(code, GRPC_STATUS_UNIMPLEMENTED);
    assert_null(resp);
    assert_true(mono_ms() - t0 < 2000);
    assert_string_equal(details, "unknown method");

    t0 = mono_ms();
    code = read_stream(f->ch, PATH_UNKNOWN, 3, 0, 0, details, sizeof(details));
    assert_int_equal(code, GRPC_STATUS_UNIMPLEMENTED);
    assert_true(mono_ms() - t0 < 2000);

    /* The server still serves known methods afterwards. */
    check_echo(f->ch, PATH_ECHO, "after", 1, "echo:", 2);
}

/* A handler that defers and never answers: the client's deadline ends the call, the server's
 * call object reports cancelled, and a late answer is harmless. A second such call is never
 * answered at all: destroy frees it (ASan would report a leak otherwise). */
static void test_deadline_exceeded(void **state)
{
    fixture_t *f = *state;
    Colld__Test__EchoRequest req = COLLD__TEST__ECHO_REQUEST__INIT;
    Colld__Test__EchoReply rep = COLLD__TEST__ECHO_REPLY__INIT;
    ProtobufCMessage *resp = NULL;
    colld_rpc_call_t *call;
    int64_t t0 = mono_ms(), elapsed;
    int64_t dl;
    grpc_status_code code;

    code = colld_rpc_unary(f->ch, PATH_HOLD, &req.base, &colld__test__echo_reply__descriptor, 300, &resp, NULL, 0);
    elapsed = mono_ms() - t0;
    assert_int_equal(code, GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_null(resp);
    assert_true(elapsed >= 250 && elapsed < 3000);

    assert_true(wait_held(f, 1));
    call = take_held(f);
    dl = colld_rpc_call_deadline_ms(call);
    /* The server derives the deadline from the timeout it was sent: roughly the client's. */
    assert_true(dl != INT64_MAX && dl <= wall_ms() + 1000 && dl >= wall_ms() - WAIT_MS);
    t0 = mono_ms();
    while (!colld_rpc_call_cancelled(call) && mono_ms() - t0 < WAIT_MS)
        usleep(1000);
    assert_true(colld_rpc_call_cancelled(call));
    colld_rpc_reply(call, &rep.base); /* too late: goes nowhere, frees the call */

    code = colld_rpc_unary(f->ch, PATH_HOLD, &req.base, &colld__test__echo_reply__descriptor, 100, &resp, NULL, 0);
    assert_int_equal(code, GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_true(wait_held(f, 1)); /* left unanswered for destroy */

    check_echo(f->ch, PATH_ECHO, "still", 1, "echo:", 2);
}

/* Deferred answers from other threads: unary and streaming calls answered by the worker, and
 * held calls answered by the test thread while the client waits in another thread. */
static void test_deferred_reply(void **state)
{
    fixture_t *f = *state;
    Colld__Test__EchoReply rep = COLLD__TEST__ECHO_REPLY__INIT;
    async_call_t a;
    char details[64];
    int i;

    for (i = 0; i < 5; i++)
        check_echo(f->ch, PATH_LATER, "x", 21 + i, "later:", 42 + 2 * i);
    assert_int_equal(read_stream(f->ch, PATH_LATER_COUNT, 7, 0, 7, details, sizeof(details)), GRPC_STATUS_OK);

    async_call_start(&a, f->ch, PATH_HOLD, WAIT_MS);
    assert_true(wait_held(f, 1));
    usleep(20000);
    rep.text = "from the test thread";
    colld_rpc_reply(take_held(f), &rep.base);
    join_bounded(a.thread);
    assert_int_equal(a.code, GRPC_STATUS_OK);
    assert_string_equal(a.text, "from the test thread");

    async_call_start(&a, f->ch, PATH_HOLD, WAIT_MS);
    assert_true(wait_held(f, 1));
    colld_rpc_fail(take_held(f), GRPC_STATUS_FAILED_PRECONDITION, "not yet");
    join_bounded(a.thread);
    assert_int_equal(a.code, GRPC_STATUS_FAILED_PRECONDITION);
    assert_string_equal(a.details, "not yet");
}

/* Server streaming: several messages then finish OK; many messages (sends queue up behind the
 * one in flight); an error status after some messages; a stream finished by the test thread. */
static void test_stream(void **state)
{
    fixture_t *f = *state;
    Colld__Test__StreamRequest req = COLLD__TEST__STREAM_REQUEST__INIT;
    colld_rpc_stream_t *s = NULL;
    ProtobufCMessage *msg = NULL;
    colld_rpc_call_t *call;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    char details[64];

    assert_int_equal(read_stream(f->ch, PATH_COUNT, 5, 0, 5, details, sizeof(details)), GRPC_STATUS_OK);
    assert_int_equal(read_stream(f->ch, PATH_COUNT, 0, 0, 0, details, sizeof(details)), GRPC_STATUS_OK);
    assert_int_equal(read_stream(f->ch, PATH_COUNT, 500, 0, 500, details, sizeof(details)), GRPC_STATUS_OK);
    assert_int_equal(read_stream(f->ch, PATH_COUNT, 2, GRPC_STATUS_ABORTED, 2, details, sizeof(details)),
                     GRPC_STATUS_ABORTED);
    assert_string_equal(details, "stopped");

    /* Held open after 2 messages; the test thread sends one more and finishes it. */
    req.count = 2;
    req.hold = true;
    assert_int_equal(colld_rpc_stream_open(f->ch, PATH_COUNT, &req.base, &colld__test__stream_item__descriptor,
                                           WAIT_MS, &s),
                     GRPC_STATUS_OK);
    assert_true(wait_held(f, 1));
    call = take_held(f);
    {
        Colld__Test__StreamItem item = COLLD__TEST__STREAM_ITEM__INIT;
        item.index = 2;
        item.text = "item-2";
        assert_int_equal(colld_rpc_send(call, &item.base), 0);
    }
    colld_rpc_finish(call, GRPC_STATUS_OK, NULL);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(colld_rpc_stream_next(s, &msg, &code, NULL, 0), 0);
        assert_int_equal(((Colld__Test__StreamItem *)msg)->index, i);
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    assert_int_equal(colld_rpc_stream_next(s, &msg, &code, NULL, 0), 1);
    assert_int_equal(code, GRPC_STATUS_OK);
    colld_rpc_stream_close(s);

    /* Closed by the client early: the server's sends start failing, finish is still fine. */
    req.count = 1;
    assert_int_equal(colld_rpc_stream_open(f->ch, PATH_COUNT, &req.base, &colld__test__stream_item__descriptor,
                                           WAIT_MS, &s),
                     GRPC_STATUS_OK);
    assert_true(wait_held(f, 1));
    colld_rpc_stream_close(s);
    call = take_held(f);
    {
        int64_t t0 = mono_ms();
        while (!colld_rpc_call_cancelled(call) && mono_ms() - t0 < WAIT_MS)
            usleep(1000);
        assert_true(colld_rpc_call_cancelled(call));
    }
    {
        Colld__Test__StreamItem item = COLLD__TEST__STREAM_ITEM__INIT;
        assert_int_equal(colld_rpc_send(call, &item.base), -1);
    }
    colld_rpc_finish(call, GRPC_STATUS_OK, NULL);
}

/* Bytes that are not the method's request message give INVALID_ARGUMENT; a response that is not
 * the expected type gives INTERNAL on the client. Neither hurts the server. */
static void test_garbage(void **state)
{
    fixture_t *f = *state;
    Colld__Test__Bogus bogus = COLLD__TEST__BOGUS__INIT;
    Colld__Test__AddRequest add = COLLD__TEST__ADD_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    char details[128];

    bogus.text = 0x0123456789abcdefULL;
    assert_int_equal(colld_rpc_unary(f->ch, PATH_ECHO, &bogus.base, &colld__test__echo_reply__descriptor, WAIT_MS,
                                     &resp, details, sizeof(details)),
                     GRPC_STATUS_INVALID_ARGUMENT);
    assert_null(resp);
    assert_string_equal(details, "cannot parse the request message");

    add.a = 5;
    add.b = 2;
    assert_int_equal(colld_rpc_unary(f->ch, PATH_ADD, &add.base, &colld__test__echo_reply__descriptor, WAIT_MS, &resp,
                                     details, sizeof(details)),
                     GRPC_STATUS_INTERNAL);
    assert_null(resp);

    check_echo(f->ch, PATH_ECHO, "fine", 0, "echo:", 1);
}

/* Destroying the server with calls in flight: a held unary call, a held stream that already sent
 * a message, and a held call the worker will never see. Every client gets an error promptly,
 * destroy returns promptly, and ASan sees no leak. */
static void test_shutdown_in_flight(void **state)
{
    fixture_t *f = *state;
    Colld__Test__StreamRequest req = COLLD__TEST__STREAM_REQUEST__INIT;
    colld_rpc_stream_t *s = NULL;
    ProtobufCMessage *msg = NULL;
    grpc_status_code code = GRPC_STATUS_OK;
    async_call_t a1, a2;
    int64_t t0;
    int rc;

    async_call_start(&a1, f->ch, PATH_HOLD, 60000);
    async_call_start(&a2, f->ch, PATH_HOLD, 0); /* no deadline at all */
    req.count = 1;
    req.hold = true;
    assert_int_equal(colld_rpc_stream_open(f->ch, PATH_COUNT, &req.base, &colld__test__stream_item__descriptor,
                                           60000, &s),
                     GRPC_STATUS_OK);
    assert_int_equal(colld_rpc_stream_next(s, &msg, &code, NULL, 0), 0);
    protobuf_c_message_free_unpacked(msg, NULL);
    assert_true(wait_held(f, 3));

    t0 = mono_ms();
    colld_rpc_server_destroy(f->srv);
    f->srv = NULL;
    f->nheld = 0; /* those call pointers died with the server */
    assert_true(mono_ms() - t0 < WAIT_MS);

    join_bounded(a1.thread);
    join_bounded(a2.thread);
    assert_true(a1.code == GRPC_STATUS_UNAVAILABLE || a1.code == GRPC_STATUS_CANCELLED);
    assert_true(a2.code == GRPC_STATUS_UNAVAILABLE || a2.code == GRPC_STATUS_CANCELLED);
    rc = colld_rpc_stream_next(s, &msg, &code, NULL, 0);
    assert_true(rc == 1 || rc == -1);
    assert_null(msg);
    if (rc == 1)
        assert_true(code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_CANCELLED);
    colld_rpc_stream_close(s);

    /* With the server gone, a new call fails quickly instead of hanging. */
    {
        Colld__Test__EchoRequest echo = COLLD__TEST__ECHO_REQUEST__INIT;
        ProtobufCMessage *resp = NULL;
        t0 = mono_ms();
        code = colld_rpc_unary(f->ch, PATH_ECHO, &echo.base, &colld__test__echo_reply__descriptor, 2000, &resp, NULL,
                               0);
        assert_true(code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_DEADLINE_EXCEEDED);
        assert_true(mono_ms() - t0 < 3000);
    }
}

#define CONC_THREADS 6
#define CONC_CALLS 150

/* Arguments of one concurrent client thread. */
typedef struct {
    colld_rpc_channel_t *ch;
    int id;
    int failures;
} conc_arg_t;

/* One concurrent client: a mix of immediate, deferred and streaming calls on the shared channel,
 * counting every wrong answer. */
static void *conc_main(void *arg)
{
    conc_arg_t *c = arg;
    char text[32], expect[64];
    int i;

    for (i = 0; i < CONC_CALLS; i++) {
        Colld__Test__EchoRequest req = COLLD__TEST__ECHO_REQUEST__INIT;
        ProtobufCMessage *resp = NULL;
        const bool later = (i % 2) == 1;
        grpc_status_code code;

        snprintf(text, sizeof(text), "t%d-%d", c->id, i);
        req.text = text;
        req.n = i;
        code = colld_rpc_unary(c->ch, later ? PATH_LATER : PATH_ECHO, &req.base, &colld__test__echo_reply__descriptor,
                               WAIT_MS * 2, &resp, NULL, 0);
        snprintf(expect, sizeof(expect), "%s%s", later ? "later:" : "echo:", text);
        if (code != GRPC_STATUS_OK || strcmp(((Colld__Test__EchoReply *)resp)->text, expect) != 0 ||
            ((Colld__Test__EchoReply *)resp)->n != (later ? i * 2 : i + 1))
            c->failures++;
        if (resp != NULL)
            protobuf_c_message_free_unpacked(resp, NULL);
        if (i % 25 == 0) {
            Colld__Test__StreamRequest sreq = COLLD__TEST__STREAM_REQUEST__INIT;
            colld_rpc_stream_t *s = NULL;
            ProtobufCMessage *msg = NULL;
            int n = 0, rc;
            sreq.count = 10;
            if (colld_rpc_stream_open(c->ch, (i % 50) ? PATH_COUNT : PATH_LATER_COUNT, &sreq.base,
                                      &colld__test__stream_item__descriptor, WAIT_MS * 2, &s) != GRPC_STATUS_OK) {
                c->failures++;
                continue;
            }
            while ((rc = colld_rpc_stream_next(s, &msg, &code, NULL, 0)) == 0) {
                if (((Colld__Test__StreamItem *)msg)->index != n)
                    c->failures++;
                n++;
                protobuf_c_message_free_unpacked(msg, NULL);
            }
            if (rc != 1 || code != GRPC_STATUS_OK || n != 10)
                c->failures++;
            colld_rpc_stream_close(s);
        }
    }
    return NULL;
}

/* Many concurrent calls from several threads on one channel. */
static void test_concurrent(void **state)
{
    fixture_t *f = *state;
    pthread_t threads[CONC_THREADS];
    conc_arg_t args[CONC_THREADS];
    int i;

    for (i = 0; i < CONC_THREADS; i++) {
        args[i] = (conc_arg_t){.ch = f->ch, .id = i};
        assert_int_equal(pthread_create(&threads[i], NULL, conc_main, &args[i]), 0);
    }
    for (i = 0; i < CONC_THREADS; i++)
        pthread_join(threads[i], NULL);
    for (i = 0; i < CONC_THREADS; i++)
        assert_int_equal(args[i].failures, 0);
}

/* Errors and edge cases of the lifetimes: an unusable address, a duplicate method, a server
 * destroyed without being started, NULL destroys, and a client with no server. */
static void test_lifetimes(void **state)
{
    char dir[] = "/tmp/colld-rpc-test-XXXXXX";
    char target[128], err[256];
    colld_rpc_server_t *srv = NULL;
    colld_rpc_channel_t *ch = NULL;
    colld_rpc_stream_t *s = NULL;
    Colld__Test__EchoRequest req = COLLD__TEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    colld_rpc_method_t dup[2];
    grpc_status_code code;
    int64_t t0;

    (void)state;
    assert_non_null(mkdtemp(dir));

    err[0] = '\0';
    snprintf(target, sizeof(target), "unix:%s/missing/dir/rpc.sock", dir);
    assert_int_equal(colld_rpc_server_create(target, test_methods, 1, NULL, &srv, err, sizeof(err)), -1);
    assert_null(srv);
    assert_true(strlen(err) > 0);

    dup[0] = test_methods[0];
    dup[1] = test_methods[0];
    snprintf(target, sizeof(target), "unix:%s/rpc.sock", dir);
    err[0] = '\0';
    assert_int_equal(colld_rpc_server_create(target, dup, 2, NULL, &srv, err, sizeof(err)), -1);
    assert_null(srv);
    assert_true(strlen(err) > 0);

    assert_int_equal(colld_rpc_server_create(target, test_methods, 2, NULL, &srv, err, sizeof(err)), 0);
    colld_rpc_server_destroy(srv);
    colld_rpc_server_destroy(NULL);
    colld_rpc_channel_destroy(NULL);
    colld_rpc_stream_close(NULL);

    /* No server behind the socket path. */
    assert_int_equal(colld_rpc_channel_create(target, &ch), 0);
    t0 = mono_ms();
    code = colld_rpc_unary(ch, PATH_ECHO, &req.base, &colld__test__echo_reply__descriptor, 3000, &resp, err,
                           sizeof(err));
    assert_true(code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_null(resp);
    code = colld_rpc_stream_open(ch, PATH_COUNT, &req.base, &colld__test__stream_item__descriptor, 3000, &s);
    assert_true(code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_null(s);
    assert_true(mono_ms() - t0 < 7000);
    colld_rpc_channel_destroy(ch);

    unlink(target + strlen("unix:"));
    rmdir(dir);
}

/* GRPC_CHECK at the gRPC boundary: a batch gRPC refuses (two ops of one kind) comes back with
 * gRPC's own result, and the log names the call, gRPC's error and this file's line; an accepted
 * call logs nothing. */
static void test_grpc_check(void **state)
{
    (void)state;
    char dir[] = "/tmp/colld-rpc-test-XXXXXX", path[PATH_MAX], err[256] = "";
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/rpc.log", dir);
    assert_int_equal(colld_log_init("test_rpc", "warn", NULL, path, err, sizeof(err)), 0);

    grpc_init();
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create("unix:/nonexistent/colld-rpc-test.sock", creds, NULL);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice method = grpc_slice_from_static_string(PATH_ECHO);
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                               gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    assert_non_null(call);
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_INITIAL_METADATA;
    int line = __LINE__ + 1;
    grpc_call_error e = GRPC_CHECK(grpc_call_start_batch, call, ops, 2, NULL, NULL);
    assert_int_equal(e, GRPC_CALL_ERROR_TOO_MANY_OPERATIONS);
    assert_int_equal(GRPC_CHECK(grpc_call_cancel, call, NULL), GRPC_CALL_OK);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    grpc_channel_destroy(ch);
    grpc_channel_credentials_release(creds);
    grpc_shutdown();
    colld_log_fini();

    char text[4096] = "", want[160];
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    snprintf(want, sizeof(want),
             " WARN RPC test_rpc.c:%d grpc_call_start_batch refused: GRPC_CALL_ERROR_TOO_MANY_OPERATIONS (%d)\n", line,
             (int)GRPC_CALL_ERROR_TOO_MANY_OPERATIONS);
    assert_non_null(strstr(text, want));
    assert_null(strstr(text, "grpc_call_cancel"));
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unary_dispatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_method, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline_exceeded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deferred_reply, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent, setup, teardown),
        cmocka_unit_test(test_lifetimes),
        cmocka_unit_test(test_grpc_check),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
