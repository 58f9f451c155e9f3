/*
 * ib.h - daemon-to-daemon DATA over InfiniBand or RoCE verbs (libibverbs): one reliable-connected
 * queue pair per peer link, registered bounce rings, RDMA_WRITE_WITH_IMM with credits.
 *
 * A link carries only DATA messages (colld_net_hdr_t + payload). Everything else a peer link
 * needs (authentication, CTRL messages, heartbeats, the exchange of this file's endpoints) stays
 * on the TCP transport: the endpoints (QP number, GID, PSN, the receive ring's address and rkey)
 * travel as CTRL messages after the HMAC handshake, never in unauthenticated rdma_cm private data
 * (so librdmacm is not used).
 *
 * Memory: each link registers two rings of IB_SLOTS slots of (32 + slot_payload) bytes: a send
 * ring (local access only) and a receive ring (remote write). A DATA message is copied into the
 * send slot k and written with RDMA_WRITE_WITH_IMM into the peer's receive slot k (imm = k); the
 * receiver hands the slot to its deliver callback, reposts a receive and returns a credit. A
 * sender holds IB_SLOTS credits at first and never writes a slot the receiver has not returned,
 * so the rings cannot overrun. The only rkey a peer learns is that of its own link's receive
 * ring: it can write nothing but the DATA it could send over TCP anyway, into memory that holds
 * nothing else and is deregistered when the link is closed. Tenant buffers are never registered
 * (no zero-copy of large host buffers, no GPU memory by ibv_reg_dmabuf_mr: see docs/ib.md).
 *
 * Completions arrive on a completion channel whose fd the caller polls (the TCP transport's
 * network thread, through colld_net_path_ops_t); colld_ib_link_event processes them. Every call
 * on a link is from that one thread.
 *
 * Built without libibverbs (COLLD_HAVE_IB 0), colld_ib_open fails saying so.
 */
#ifndef COLLD_TRANSPORT_IB_H
#define COLLD_TRANSPORT_IB_H

#include "transport/tcp/tcp.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IB_SLOTS 8      /* ring slots per direction per link (the credits) */
#define IB_SLOT_HDR 32  /* colld_net_hdr_t at the start of each slot */
#define IB_MAX_LINKS 64 /* links per daemon: peers beyond this use TCP */
#define IB_MAX_SLOT_PAYLOAD (1u << 20)

typedef struct colld_ib colld_ib_t;
typedef struct colld_ib_link colld_ib_link_t;

/* What one side of a link tells the other (over the authenticated CTRL channel). */
typedef struct {
    uint8_t gid[16];
    uint32_t qpn;       /* 24 bits */
    uint32_t psn;       /* 24 bits */
    uint32_t lid;       /* 16 bits; 0 on RoCE */
    uint32_t mtu;       /* enum ibv_mtu, 1..5 */
    uint64_t ring_addr; /* the receive ring */
    uint32_t ring_rkey;
    uint32_t slots;        /* IB_SLOTS */
    uint32_t slot_payload; /* payload bytes per slot */
} colld_ib_endpoint_t;

typedef struct {
    /* A DATA message arrived in the link's receive ring (payload valid only during the call). */
    void (*deliver)(void *arg, const colld_net_hdr_t *h, void *payload);
    /* The link failed (a completion error, a protocol error from the peer): it stops; the caller
     * closes it. `why` names the verbs status. */
    void (*failed)(void *arg, const char *why);
    void *arg;
} colld_ib_link_callbacks_t;

/* Open the RDMA device `dev` (NULL or "": the first with an active port) and port (0: the first
 * active one). Returns 0, or -1 with the reason in err: no verbs in the kernel (ENOSYS), no
 * device, no active port, built without libibverbs. On failure there is nothing to close. */
int colld_ib_open(const char *dev, int port, colld_ib_t **out, char *err, size_t err_len);
/* Close the device (every link closed first). NULL is a no-op. */
void colld_ib_close(colld_ib_t *ib);
/* "DEVICE:PORT" of an open device. */
const char *colld_ib_name(const colld_ib_t *ib);
/* Links open now. */
int colld_ib_links(const colld_ib_t *ib);

/* Check an endpoint a peer offered: known MTU, 24-bit QP number and PSN, the slot geometry this
 * build uses, a non-zero ring. Returns 0, or -1 with the reason in err. */
int colld_ib_endpoint_check(const colld_ib_endpoint_t *e, uint32_t slot_payload, char *err, size_t err_len);

/* Make a link: a QP in INIT with its receives posted and its rings registered, and this side's
 * endpoint in *local. Returns 0, or -1 with the reason in err (nothing to close). */
int colld_ib_link_new(colld_ib_t *ib, uint32_t slot_payload, const colld_ib_link_callbacks_t *cb, colld_ib_link_t **out,
                      colld_ib_endpoint_t *local, char *err, size_t err_len);
/* Connect it to the peer's endpoint (checked): RTR, then RTS. Returns 0, or -1 with the reason. */
int colld_ib_link_connect(colld_ib_link_t *l, const colld_ib_endpoint_t *remote, char *err, size_t err_len);
/* Move the QP to the error state (a test's fault injection: collctl ib-fault); the completions
 * that follow fail the link. */
int colld_ib_link_inject_error(colld_ib_link_t *l);
/* The completion channel's fd (readable: call colld_ib_link_event). */
int colld_ib_link_fd(const colld_ib_link_t *l);
void colld_ib_link_event(colld_ib_link_t *l);
/* Queue a DATA message (copied into a send slot when one is free; done(cookie, ok) runs once it
 * was written, or with ok false when the link fails or closes first). Returns 0, or -1 (too long,
 * link failed, out of memory): then done never runs. */
int colld_ib_link_send(colld_ib_link_t *l, const colld_net_hdr_t *h, const void *payload,
                       void (*done)(void *cookie, bool ok), void *cookie);
/* Close: queued DATA done(false) (with notify; without, no callback runs), QP destroyed, rings
 * deregistered and freed. NULL is a no-op. */
void colld_ib_link_close(colld_ib_link_t *l, bool notify);

#endif /* COLLD_TRANSPORT_IB_H */
