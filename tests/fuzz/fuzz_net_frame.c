/*
 * fuzz_net_frame.c - libFuzzer harness: bytes a peer or a stranger sends to a daemon's --listen,
 * through the TCP transport's real receive path (transport/tcp: colld__tcp_conn_read, the frame
 * header checks, HELLO/AUTH decoding and the handshake steps, CTRL and DATA delivery).
 *
 * A detached colld_net_t (no listener, no thread) holds one connection whose socket is one end of
 * a Unix socketpair; the harness writes the input into the other end, then has the connection
 * read it as the network thread would. The first byte picks the connection's side: a stranger
 * that must say HELLO (acceptor side), a connection this daemon opened waiting for the
 * acceptor's HELLO (initiator side), or an authenticated peer (every frame type after the
 * handshake, DATA into a caller's buffer or the transport's). Callbacks read every payload byte
 * they are given, so a length the transport did not check shows up under ASan.
 */
#include "transport/tcp/tcp_internal.h"

#include "common/log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHUNK 65536

typedef struct {
    uint8_t dest[CHUNK]; /* a caller's buffer for DATA with flags bit 0 */
    uint64_t sum;        /* every byte delivered, so that each is read */
} sink_t;

static void *cb_data_dest(void *arg, colld_net_peer_t *p, const colld_net_hdr_t *h)
{
    sink_t *s = arg;
    (void)p;
    return (h->flags & 1) ? s->dest : NULL;
}

static void cb_data(void *arg, colld_net_peer_t *p, const colld_net_hdr_t *h, void *payload)
{
    sink_t *s = arg;
    (void)p;
    for (uint32_t i = 0; i < h->len; i++)
        s->sum += ((const uint8_t *)payload)[i];
}

static void cb_ctrl(void *arg, colld_net_peer_t *p, const void *payload, size_t len)
{
    sink_t *s = arg;
    (void)p;
    for (size_t i = 0; i < len; i++)
        s->sum += ((const uint8_t *)payload)[i];
}

static bool cb_unused(void *arg, colld_net_peer_t *p)
{
    (void)arg;
    (void)p;
    return true;
}

/* Whether c is still one of n's connections (it is freed once closed and reaped). */
static bool alive(const colld_net_t *n, const conn_t *c)
{
    for (const conn_t *x = n->conns; x; x = x->next)
        if (x == c)
            return !x->closed;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t secret[] = "fuzz-cluster-secret-0123456789ab";
    sink_t *sink = calloc(1, sizeof(*sink));
    colld_net_t *n = NULL;
    int sv[2] = { -1, -1 };
    char err[256];
    static bool quiet;
    if (!quiet) /* inputs fail by design: no log */
        quiet = colld_log_init("fuzz_net_frame", "none", NULL, NULL, err, sizeof(err)) == 0;
    if (!sink || size < 1)
        goto out;
    colld_net_config_t cfg = { .node_name = "fuzz",
                               .listen_addr = "127.0.0.1:7077",
                               .secret = secret,
                               .secret_len = sizeof(secret) - 1,
                               .conns_per_peer = 1,
                               .heartbeat_ms = 1000,
                               .heartbeat_misses = 3,
                               .chunk_bytes = CHUNK,
                               .cb = { .data_dest = cb_data_dest,
                                       .data = cb_data,
                                       .ctrl = cb_ctrl,
                                       .peer_unused = cb_unused,
                                       .arg = sink } };
    if (colld__tcp_net_detached(&cfg, &n, err, sizeof(err)) < 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    conn_t *c;
    unsigned side = data[0] % 3;
    if (side == 0) { /* a stranger */
        c = colld__tcp_conn_new(n, sv[0], NULL, CONN_ACCEPTED, "192.0.2.1:5000");
    } else {
        colld_net_peer_t *p = colld__tcp_peer_new(n, "192.0.2.2:7077");
        if (!p)
            abort();
        c = colld__tcp_conn_new(n, sv[0], p, side == 1 ? CONN_HELLO_SENT : CONN_ACCEPTED, p->addr);
        if (c && side == 2)
            colld__tcp_conn_attach(c, p, "peer");
    }
    if (!c)
        abort();
    sv[0] = -1; /* the connection owns it */
    /* The rest of the input arrives in pieces whose sizes the input's second byte varies. */
    size_t piece = size > 1 ? 1 + data[1] % 64 : 1;
    for (size_t off = 2; off < size && alive(n, c);) {
        size_t k = piece < size - off ? piece : size - off;
        if (write(sv[1], data + off, k) != (ssize_t)k)
            break;
        off += k;
        colld__tcp_conn_read(c);
        colld__tcp_net_step(n);
    }
    if (alive(n, c)) {
        shutdown(sv[1], SHUT_WR); /* EOF: the connection fails as on a peer's close */
        colld__tcp_conn_read(c);
    }
    colld__tcp_net_step(n);
out:
    colld_net_stop(n);
    if (sv[1] >= 0)
        close(sv[1]);
    if (sv[0] >= 0)
        close(sv[0]);
    free(sink);
    return 0;
}
