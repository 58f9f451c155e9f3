/*
 * fuzz_control_rpc.c - libFuzzer harness: control-plane requests as a hostile client can send them,
 * through the daemon's own decoder and handlers (colld_rpc_server_inject: the protobuf-c unpacking
 * of the gRPC wrapper, then the handler of server/control/control.c with its validation, the communicator
 * registry, policy, the flight recorder and the event stream) on a daemon core in-process
 * (core_fixture.h).
 *
 * The input is a program of requests, each: method (1 byte), who (1 byte), length (1 byte) and
 * that many bytes of protobuf. `who` picks the SessionRef written first into the request (an
 * operator's session (uid 0), a tenant's (uid 1000), the tenant's with a wrong token, or none),
 * whether the unique id GetUniqueId issued last is appended (so CommInit forms communicators), and
 * whether the engine runs a round afterwards (join time-outs). Every request must be answered at
 * once or kept (a CommInit waiting for its peers); once every session has ended, no call may be
 * left owed. ASan/UBSan and LeakSanitizer find the rest.
 */
#include "tests/fuzz/core_fixture.h"

#include "colld.pb-c.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static fix_t fixture; /* static: the RPC server's context pointer stays valid across inputs */
static colld_rpc_server_t *server;

/* The gRPC wrapper without a listener or threads, with the control methods, made once. */
static colld_rpc_server_t *control_server(void)
{
    if (!server) {
        size_t n;
        const colld_rpc_method_t *methods = colld_control_methods(&n);
        char err[256];
        if (colld_rpc_server_create(NULL, methods, n, &fixture.d, &server, err, sizeof(err)) < 0)
            abort();
    }
    return server;
}

/* Append a protobuf length-delimited field (tag, varint length, bytes) if it fits. */
static size_t put_field(uint8_t *out, size_t at, size_t cap, uint8_t tag, const uint8_t *p, size_t len)
{
    if (len >= 16384 || at + 3 + len > cap)
        return at;
    out[at++] = tag;
    if (len >= 128) {
        out[at++] = (uint8_t)(len | 0x80);
        out[at++] = (uint8_t)(len >> 7);
    } else {
        out[at++] = (uint8_t)len;
    }
    memcpy(out + at, p, len);
    return at + len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    colld_rpc_server_t *srv = control_server();
    size_t nmethods;
    const colld_rpc_method_t *methods = colld_control_methods(&nmethods);
    if (fix_start(&fixture, 0) < 0 || colld_events_start(&fixture.d) < 0)
        abort();
    colld_session_t *who[2] = { fix_session(&fixture, 0, 1), fix_session(&fixture, 1000, 2) };
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    bool have_uid = false;

    while (size >= 3) {
        unsigned method = data[0] % (nmethods + 1), sel = data[1], len = data[2];
        data += 3;
        size -= 3;
        if (len > size)
            len = (unsigned)size;
        uint8_t req[512];
        size_t at = 0;
        if ((sel & 3) != 3) {
            colld_session_t *s = who[(sel & 3) ? 1 : 0];
            uint8_t token[COLLD_WIRE_TOKEN_BYTES], ref[64];
            memcpy(token, s->token, sizeof(token));
            if ((sel & 3) == 2)
                token[0] ^= 0xff;
            Colld__V1__SessionRef r = COLLD__V1__SESSION_REF__INIT;
            r.id = s->id;
            r.token.data = token;
            r.token.len = sizeof(token);
            size_t rl = colld__v1__session_ref__pack(&r, ref);
            at = put_field(req, at, sizeof(req), 0x0a, ref, rl);
        }
        memcpy(req + at, data, len);
        at += len;
        if ((sel & 4) && have_uid)
            at = put_field(req, at, sizeof(req), 0x12, uid, sizeof(uid));
        data += len;
        size -= len;

        const char *path = method < nmethods ? methods[method].path : "/colld.v1.Colld/NoSuchMethod";
        grpc_status_code code;
        uint8_t *resp = NULL;
        size_t resp_len = 0;
        int rc = colld_rpc_server_inject(srv, path, req, at, &code, &resp, &resp_len);
        if (rc < 0 && method < nmethods)
            abort(); /* a known method must be dispatched */
        if (rc == 0 && code == GRPC_STATUS_OK && strcmp(path, "/colld.v1.Colld/GetUniqueId") == 0) {
            Colld__V1__GetUniqueIdResponse *r = colld__v1__get_unique_id_response__unpack(NULL, resp_len, resp);
            if (r && r->unique_id.len == sizeof(uid)) {
                memcpy(uid, r->unique_id.data, sizeof(uid));
                have_uid = true;
            }
            if (r)
                colld__v1__get_unique_id_response__free_unpacked(r, NULL);
        }
        free(resp);
        if (sel & 8)
            colld_engine_run_once(&fixture.d);
    }
    colld_events_stop(&fixture.d);
    fix_stop(&fixture);
    if (!colld_rpc_server_idle(srv))
        abort(); /* a call left owed after every session ended */
    return 0;
}
