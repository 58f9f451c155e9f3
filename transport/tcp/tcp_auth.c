/*
 * tcp_auth.c - the TCP transport's wire format (frame headers, HELLO payloads), the HMAC-SHA256
 * proofs of its handshake and the handshake's steps on a connection. See tcp_internal.h for the
 * format and the exchange.
 */
#include "transport/tcp/tcp_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* A decoded HELLO. */
typedef struct {
    char name[COLLD_NET_NAME_LEN];
    char addr[COLLD_NET_ADDR_LEN];
    uint64_t session;
    uint8_t nonce[TCP_NONCE_LEN];
    uint8_t mac[TCP_MAC_LEN];
} hello_t;

/* ============================================================================================
 * Little-endian fields
 * ========================================================================================== */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ============================================================================================
 * Frame headers
 * ========================================================================================== */

const char *colld__tcp_frame_name(unsigned type, char *buf, size_t len)
{
    switch (type) {
    case TCP_HELLO:
        return "HELLO";
    case TCP_AUTH:
        return "AUTH";
    case TCP_HEARTBEAT:
        return "HEARTBEAT";
    case TCP_CTRL:
        return "CTRL";
    case TCP_DATA:
        return "DATA";
    }
    snprintf(buf, len, "type %u", type);
    return buf;
}

void colld__tcp_frame_encode(uint8_t out[TCP_HDR_LEN], unsigned type, const colld_net_hdr_t *h, uint32_t len)
{
    memset(out, 0, TCP_HDR_LEN);
    put32(out, TCP_FRAME_MAGIC);
    out[4] = (uint8_t)type;
    put32(out + 12, len);
    if (h) {
        out[5] = h->phase;
        out[6] = h->flags;
        put16(out + 8, h->step);
        put64(out + 16, h->xid);
        put64(out + 24, h->seq);
        put64(out + 32, h->offset);
    }
}

void colld__tcp_frame_decode(const uint8_t in[TCP_HDR_LEN], tcp_frame_t *f)
{
    memset(f, 0, sizeof(*f));
    f->magic = get32(in);
    f->type = in[4];
    f->len = get32(in + 12);
    f->h.phase = in[5];
    f->h.flags = in[6];
    f->h.step = get16(in + 8);
    f->h.len = f->len;
    f->h.xid = get64(in + 16);
    f->h.seq = get64(in + 24);
    f->h.offset = get64(in + 32);
}

/* ============================================================================================
 * HELLO
 * ========================================================================================== */

/* Write a HELLO payload into out (TCP_HELLO_MAX bytes); mac NULL: zeros. Returns its length. */
static size_t hello_encode(uint8_t *out, const char *name, const char *addr, uint64_t session, const uint8_t *nonce,
                           const uint8_t *mac)
{
    size_t nl = strnlen(name, COLLD_NET_NAME_LEN - 1), al = strnlen(addr, COLLD_NET_ADDR_LEN - 1);
    put16(out, TCP_PROTO_VERSION);
    out[2] = (uint8_t)nl;
    out[3] = (uint8_t)al;
    put64(out + 4, session);
    memcpy(out + 12, nonce, TCP_NONCE_LEN);
    if (mac)
        memcpy(out + 12 + TCP_NONCE_LEN, mac, TCP_MAC_LEN);
    else
        memset(out + 12 + TCP_NONCE_LEN, 0, TCP_MAC_LEN);
    memcpy(out + TCP_HELLO_FIXED, name, nl);
    memcpy(out + TCP_HELLO_FIXED + nl, addr, al);
    return TCP_HELLO_FIXED + nl + al;
}

/* Copy a printable-ASCII field of n bytes into dst as a string; false if it holds anything else
 * (a NUL, a control character), which keeps names and addresses safe to log. */
static bool copy_field(char *dst, const uint8_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (src[i] < 0x20 || src[i] > 0x7e)
            return false;
        dst[i] = (char)src[i];
    }
    dst[n] = '\0';
    return true;
}

/* Parse and bound-check a HELLO payload. Returns 0, or -1 with the reason in err. */
static int hello_decode(const uint8_t *in, size_t len, hello_t *out, char *err, size_t err_len)
{
    if (len < TCP_HELLO_FIXED) {
        colld_set_err(err, err_len, "HELLO of %zu bytes is too short", len);
        return -1;
    }
    unsigned version = get16(in);
    if (version != TCP_PROTO_VERSION) {
        colld_set_err(err, err_len, "protocol version %u, this daemon speaks %d (upgrade both to the same release)",
                      version, TCP_PROTO_VERSION);
        return -1;
    }
    size_t nl = in[2], al = in[3];
    if (nl == 0 || nl >= COLLD_NET_NAME_LEN || al == 0 || al >= COLLD_NET_ADDR_LEN ||
        len != TCP_HELLO_FIXED + nl + al) {
        colld_set_err(err, err_len, "malformed HELLO (name %zu, address %zu, total %zu bytes)", nl, al, len);
        return -1;
    }
    if (!copy_field(out->name, in + TCP_HELLO_FIXED, nl) || !copy_field(out->addr, in + TCP_HELLO_FIXED + nl, al)) {
        colld_set_err(err, err_len, "HELLO name or address is not printable text");
        return -1;
    }
    out->session = get64(in + 4);
    memcpy(out->nonce, in + 12, TCP_NONCE_LEN);
    memcpy(out->mac, in + 12 + TCP_NONCE_LEN, TCP_MAC_LEN);
    return 0;
}

/* ============================================================================================
 * Proofs
 * ========================================================================================== */

/* Append a length-prefixed string (at most 255 bytes) to buf at *off. */
static void put_str(uint8_t *buf, size_t *off, const char *s)
{
    size_t l = strnlen(s, 255);
    buf[(*off)++] = (uint8_t)l;
    memcpy(buf + *off, s, l);
    *off += l;
}

/* The acceptor's proof (acceptor = true) or the initiator's, over c's nonces and session:
 * HMAC-SHA256(secret, label || first nonce || second nonce || session || iname || iaddr || aname
 * || aaddr), the acceptor's with nonce_i first, the initiator's with nonce_a first. Returns 0 or
 * -1. */
static int auth_mac(const colld_net_t *n, const conn_t *c, bool acceptor, const char *iname, const char *iaddr,
                    const char *aname, const char *aaddr, uint8_t out[TCP_MAC_LEN])
{
    static const char acc_label[] = "colld-acceptor", ini_label[] = "colld-initiator";
    uint8_t buf[sizeof(ini_label) + 2 * TCP_NONCE_LEN + 8 + 4 * 256];
    const char *label = acceptor ? acc_label : ini_label;
    size_t off = strlen(label);
    memcpy(buf, label, off);
    memcpy(buf + off, acceptor ? c->nonce_i : c->nonce_a, TCP_NONCE_LEN);
    off += TCP_NONCE_LEN;
    memcpy(buf + off, acceptor ? c->nonce_a : c->nonce_i, TCP_NONCE_LEN);
    off += TCP_NONCE_LEN;
    put64(buf + off, c->session);
    off += 8;
    put_str(buf, &off, iname);
    put_str(buf, &off, iaddr);
    put_str(buf, &off, aname);
    put_str(buf, &off, aaddr);
    if (n->cfg.secret_len > INT_MAX)
        return -1;
    unsigned int out_len = 0;
    if (!HMAC(EVP_sha256(), n->secret, (int)n->cfg.secret_len, buf, off, out, &out_len) || out_len != TCP_MAC_LEN)
        return -1;
    return 0;
}

/* Constant-time comparison of two MACs. */
static bool mac_equal(const uint8_t a[TCP_MAC_LEN], const uint8_t b[TCP_MAC_LEN])
{
    return CRYPTO_memcmp(a, b, TCP_MAC_LEN) == 0;
}

/* A fresh nonce from OpenSSL's generator. Returns 0 or -1. */
static int new_nonce(uint8_t out[TCP_NONCE_LEN])
{
    return RAND_bytes(out, TCP_NONCE_LEN) == 1 ? 0 : -1;
}

/* ============================================================================================
 * Handshake steps (net thread)
 * ========================================================================================== */

/* Initiator: TCP is connected; say HELLO. */
void colld__tcp_on_connected(conn_t *c)
{
    colld_net_t *n = c->net;
    uint8_t hello[TCP_HELLO_MAX];
    msg_t *m = NULL;
    if (new_nonce(c->nonce_i) == 0) {
        size_t len = hello_encode(hello, n->name, n->addr, c->session, c->nonce_i, NULL);
        m = colld__tcp_msg_new(TCP_HELLO, NULL, hello, len, true);
    }
    if (!m) {
        colld__tcp_conn_failed(c, "cannot prepare HELLO (out of memory or no randomness)");
        return;
    }
    c->state = CONN_HELLO_SENT;
    colld__tcp_conn_send(c, m);
    colld__tcp_conn_update_events(c);
}

/* Acceptor: the initiator's HELLO arrived; answer with ours and our proof. */
void colld__tcp_on_initiator_hello(conn_t *c)
{
    colld_net_t *n = c->net;
    char err[TCP_WHY_LEN];
    hello_t h;
    uint8_t mac[TCP_MAC_LEN], hello[TCP_HELLO_MAX];
    if (hello_decode(c->cbuf, c->frame.len, &h, err, sizeof(err)) < 0) {
        colld__tcp_refuse(c, err);
        return;
    }
    char why[TCP_WHY_LEN];
    if (colld_net_check_addr(h.addr, why, sizeof(why)) < 0) { /* it keys the peer this connection joins */
        colld_set_err(err, sizeof(err), "HELLO gives a listen address this daemon could not dial: %s", why);
        colld__tcp_refuse(c, err);
        return;
    }
    colld_strlcpy(c->other_name, h.name, sizeof(c->other_name));
    colld_strlcpy(c->other_addr, h.addr, sizeof(c->other_addr));
    c->session = h.session;
    memcpy(c->nonce_i, h.nonce, TCP_NONCE_LEN);
    msg_t *m = NULL;
    if (new_nonce(c->nonce_a) == 0 && auth_mac(n, c, true, h.name, h.addr, n->name, n->addr, mac) == 0) {
        size_t len = hello_encode(hello, n->name, n->addr, c->session, c->nonce_a, mac);
        m = colld__tcp_msg_new(TCP_HELLO, NULL, hello, len, true);
    }
    if (!m) {
        colld__tcp_refuse(c, "cannot answer HELLO (out of memory or no randomness)");
        return;
    }
    c->state = CONN_CHALLENGED;
    colld__tcp_conn_send(c, m);
}

/* Initiator: the acceptor's HELLO arrived; check its proof, send ours, and the connection is up. */
void colld__tcp_on_acceptor_hello(conn_t *c)
{
    colld_net_t *n = c->net;
    colld_net_peer_t *p = c->peer;
    char err[TCP_WHY_LEN];
    hello_t h;
    uint8_t mac[TCP_MAC_LEN];
    if (hello_decode(c->cbuf, c->frame.len, &h, err, sizeof(err)) < 0) {
        colld__tcp_conn_failed(c, err);
        return;
    }
    memcpy(c->nonce_a, h.nonce, TCP_NONCE_LEN);
    if (auth_mac(n, c, true, n->name, n->addr, h.name, h.addr, mac) < 0) {
        colld__tcp_conn_failed(c, "cannot compute HMAC");
        return;
    }
    if (h.session != c->session || !mac_equal(mac, h.mac)) {
        colld_set_err(err, sizeof(err), "peer at %s failed authentication (different cluster secret?)", p->addr);
        colld__tcp_peer_lose(p, err);
        return;
    }
    msg_t *m = NULL;
    if (auth_mac(n, c, false, n->name, n->addr, h.name, h.addr, mac) == 0)
        m = colld__tcp_msg_new(TCP_AUTH, NULL, mac, TCP_MAC_LEN, true);
    if (!m) {
        colld__tcp_conn_failed(c, "cannot send AUTH (out of memory)");
        return;
    }
    colld__tcp_conn_send(c, m);
    colld__tcp_conn_attach(c, p, h.name);
}

/* Acceptor: the initiator's proof arrived; on success the connection joins the peer keyed by the
 * initiator's listen address, unless it belongs to a round of connections lost already. */
void colld__tcp_on_auth(conn_t *c)
{
    colld_net_t *n = c->net;
    uint8_t mac[TCP_MAC_LEN];
    if (auth_mac(n, c, false, c->other_name, c->other_addr, n->name, n->addr, mac) < 0 || !mac_equal(mac, c->cbuf)) {
        colld__tcp_refuse(c, "authentication failed (different cluster secret?)");
        return;
    }
    colld_net_peer_t *p = colld__tcp_peer_find(n, c->other_addr);
    if (!p && !(p = colld__tcp_peer_new(n, c->other_addr))) {
        colld__tcp_refuse(c, "out of memory, or the peer table is full");
        return;
    }
    if (p->nconns >= TCP_MAX_INCOMING) {
        colld__tcp_refuse(c, "too many connections from this peer");
        return;
    }
    for (unsigned i = 0; i < p->ndead && i < TCP_DEAD_SESSIONS; i++) {
        if (p->dead_sessions[i] == c->session) {
            LOG_INFO_RL(NET, "closing connection from %s (%s): its round of connections was lost", c->other_name,
                        c->remote);
            msgq_t none = { 0 };
            colld__tcp_conn_close(c, &none);
            colld__tcp_q_release(&none, false, false);
            return;
        }
    }
    colld__tcp_conn_attach(c, p, c->other_name);
}
