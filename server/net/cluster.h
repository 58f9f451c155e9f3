/*
 * cluster.h - what cluster.c (membership, faults across daemons) and xcoll.c (the inter-node
 * collective algorithms) share. Internal to the daemon.
 *
 * Threads: the network thread of transport/tcp runs every callback here. Other threads reach it
 * only through the inbox (under daemon->lock) and colld_net_wake, so no transport call is ever made
 * with daemon->lock held by a thread other than the network thread.
 */
#ifndef COLLD_SERVER_CLUSTER_H
#define COLLD_SERVER_CLUSTER_H

#include "server/net/allow.h"
#include "server/net/net.h"
#include "transport/tcp/tcp.h"

#include <stdatomic.h>

#define COLLD_NET_MAX_CHUNK (1u << 20) /* the transport's receive buffer per connection */

/* DATA phases of the algorithms (colld_net_hdr_t.phase). */
enum {
    XPHASE_RS = 1,      /* ring reduce-scatter */
    XPHASE_AG = 2,      /* ring all-gather (and the broadcast chain) */
    XPHASE_RD_PRE = 3,  /* recursive doubling: a node beyond the power of two hands its data in */
    XPHASE_RD = 4,      /* recursive doubling: exchange with partner self ^ (1 << step) */
    XPHASE_RD_POST = 5, /* recursive doubling: the result back to that node */
    XPHASE_PROBE = 64,  /* collctl probe's data (probe.c), no communicator's */
};

typedef struct xcoll xcoll_t;
typedef struct colld_xcomm colld_xcomm_t;
typedef struct colld_cluster colld_cluster_t;

/* What one node announced for a sequence number (Ready). */
typedef struct {
    uint64_t seq; /* 0: empty */
    uint32_t kind, dtype, redop;
    int32_t root;
    uint64_t count;
    bool verify; /* the node verifies the result (Ready.verify); not part of the signature */
} xsig_t;

/* A node's result checksum for a sequence number (Verify). */
typedef struct {
    uint64_t seq; /* 0: empty */
    uint64_t sum;
} xverified_t;

/* A communicator's multi-node state. Set under daemon->lock at join and at formation (then
 * fixed); the fields marked (net) belong to the network thread. */
struct colld_xcomm {
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    char root_addr[COLLD_NET_ADDR_LEN];
    bool formed;
    uint64_t xid;
    int nnodes, self;
    char (*node_name)[COLLD_NET_NAME_LEN];
    char (*node_addr)[COLLD_NET_ADDR_LEN];
    int *rank_node;           /* [nranks] */
    int *node_nranks;         /* [nnodes] ranks per node */
    int algo;                 /* COLLD_NET_ALGO_* */
    uint64_t small_bytes, chunk_bytes;
    colld_net_peer_t **peers; /* (net) [nnodes], NULL for self */
    xsig_t (*ready)[2];       /* (net) [nnodes][seq & 1] */
    xverified_t (*verified)[2]; /* (net) [nnodes][seq & 1] */
    xcoll_t *qhead, *qtail;   /* (net) collectives handed over, the head one running */
    void *scratch;            /* (net) the collective's buffer, kept for the next one */
    size_t scratch_size;
    colld_coll_t *net_coll;   /* (daemon->lock) the collective running among the nodes, for collctl trace */
    bool fault_from_peer;     /* (daemon->lock) the fault being recorded came from another node: do not echo it */
};

/* The multi-node state of a communicator the net backend forms, NULL for any other (the net
 * backend is the one that forms communicators: colld_backend_ops_t.comm_form). */
static inline colld_xcomm_t *colld_xcomm(const colld_dcomm_t *c)
{
    return c->former ? (colld_xcomm_t *)c->bslot[c->former->slot] : NULL;
}

/* A message for the network thread: a CTRL message to a daemon (this one included), or a matched
 * collective. */
typedef struct cjob {
    colld_coll_t *coll;
    uint64_t probe_bytes; /* > 0: start a probe (probe.c) */
    int gather;           /* > 0: start gather slot gather - 1 (gather.c) */
    char addr[COLLD_NET_ADDR_LEN];
    bool nodial;  /* send only over a link that exists: never connect to addr for it */
    uint8_t *buf;
    size_t len;
    struct cjob *next;
} cjob_t;

/* A communicator this daemon's ranks left while it was forming, whose Formed may still come:
 * its nodes are then told (cluster.c, "Who is dialed"). */
#define COLLD_CLUSTER_LEFT_MAX 16
typedef struct {
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    uid_t tenant;
    bool used;
} cleft_t;

/* A member's message by xid that came before this daemon had the communicator's Formed: the
 * root's Formed and the members' messages travel on different links, in either order. Kept until
 * that Formed (cluster.c, "Early messages"): a Ready for collective #1 or a Fail. */
#define COLLD_CLUSTER_EARLY_MAX 32     /* kept at most; the oldest is replaced */
#define COLLD_CLUSTER_EARLY_PER_PEER 4 /* from one sender at most; its oldest is replaced */
typedef struct {
    bool used, fail;
    char from[COLLD_NET_ADDR_LEN]; /* the sender as it authenticated */
    uint64_t xid, stamp;           /* stamp: arrival order */
    xsig_t sig;                    /* Ready */
    colld_status_t status;         /* Fail: status, rank, detail (sanitized, naming the sender) */
    int rank;
    char why[COLLD_DETAIL_LEN];
} cearly_t;

/* One log line per interval at most for a kind of bad message from peers (cluster.c). */
typedef struct {
    uint64_t last_ms, quiet;
} cratelimit_t;

typedef struct xjoin xjoin_t;

/* The timing of one direction of a probe (probe.c). */
typedef struct {
    uint64_t got, first_len, t_first, t_last;
} cprobe_rx_t;

/* The probe this daemon runs (net thread). */
typedef struct {
    bool active, started, acked, result;
    uint64_t bytes, id, t_req, deadline;
    colld_probe_link_t *links;
    size_t n, cur;
    cprobe_rx_t rx;
} cprobe_t;

/* A link the slow-link watch reported slow (links.c). */
#define COLLD_LINKS_WATCH_MAX 64
typedef struct {
    bool used, tx;
    char addr[COLLD_NET_ADDR_LEN];
} cwatch_t;

/* A peer's probe this daemon serves (net thread). */
#define COLLD_PROBE_SERVE_MAX 16
#define COLLD_PROBE_MIN_GAP_MS 1000
typedef struct {
    bool used, done;
    char addr[COLLD_NET_ADDR_LEN];
    uint64_t id, bytes, start_ms;
    cprobe_rx_t rx;
} cprobe_serve_t;

/* A doctor gather this daemon runs (gather.c): the owed answer (cl->probe_lock) and the run (net). */
#define COLLD_GATHER_MAX 4          /* gathers at once */
#define COLLD_GATHER_SERVE_PER_S 16 /* peers' DoctorReqs served per second, all peers together */
typedef struct {
    colld_gather_done_fn done; /* (probe_lock) non-NULL while the slot is owed an answer */
    void *arg;
    bool active; /* (net) started */
    uid_t uid;
    bool admin;
    int64_t since_us;
    uint32_t timeout_ms;
    uint64_t id, deadline_ns;
    colld_gather_node_t *nodes; /* (net) */
    bool *waiting;              /* (net) [n]: asked, not answered */
    size_t n;
} cgather_t;

/* Daemons that proved the cluster secret to this one (either side dialed), remembered so that a
 * tenant may name them as the root of a unique id (cluster.c, "Who is dialed"): at most this many,
 * the oldest forgotten first. */
#define COLLD_CLUSTER_KNOWN_MAX 1024

struct colld_cluster {
    colld_daemon_t *d;
    colld_net_t *net;
    char self_addr[COLLD_NET_ADDR_LEN];
    char node_name[COLLD_NET_NAME_LEN];
    colld_peer_allow_t *allow;  /* --peers: what this daemon may dial for its tenants (fixed) */
    char (*known)[COLLD_NET_ADDR_LEN]; /* (daemon->lock) [COLLD_CLUSTER_KNOWN_MAX], authenticated peers */
    unsigned nknown;            /* (daemon->lock) recorded so far; the next goes to nknown % MAX */
    cjob_t *inbox, *inbox_tail; /* under daemon->lock */
    xjoin_t *xjoins;            /* (net, and daemon->lock) communicators this daemon is forming */
    xcoll_t *running;           /* (net) every xcoll handed over and not finished */
    const char *lost_addr;      /* (daemon->lock) the peer being reported lost: no message goes to it */
    cleft_t left[COLLD_CLUSTER_LEFT_MAX]; /* (daemon->lock) ring, next at nleft % MAX */
    unsigned nleft;
    cratelimit_t bad_log;       /* (net) refused peer messages */
    cearly_t early[COLLD_CLUSTER_EARLY_MAX]; /* (net) messages that came before their Formed */
    uint64_t early_stamp;                    /* (net) */
    atomic_uint_fast64_t payload_sent, payload_received;
    atomic_uint_fast64_t bad_msgs; /* peer messages refused (invalid, from a node not entitled to send them) */
    cprobe_t probe;                              /* (net) */
    cprobe_serve_t serve[COLLD_PROBE_SERVE_MAX]; /* (net) */
    cwatch_t slow[COLLD_LINKS_WATCH_MAX];        /* (net) links reported slow */
    uint64_t links_next_ms;                      /* (net) the watch's next pass */
    cgather_t gather[COLLD_GATHER_MAX];          /* doctor gathers (gather.c) */
    uint64_t gather_serve_sec, gather_served;    /* (net) DoctorReqs served in the current second */
    pthread_mutex_t probe_lock;                  /* guards the owed answers (probe, gathers): */
    colld_probe_done_fn probe_done;              /* non-NULL while a probe is owed */
    void *probe_arg;
    struct colld_ib *ib;        /* (fixed) the RDMA device, NULL: none */
    char ib_name[64];           /* (fixed) its "DEVICE:PORT" */
    char ib_none[192];          /* (fixed) why there is none */
    struct ciblink *ib_pending; /* (net) links negotiating (iblink.c) */
};

/* ---- cluster_base.c (what links.c, probe.c and xcoll.c reach; never cluster.c) ---- */
/* The daemon's cluster (the net backend's state), NULL without --listen. */
colld_cluster_t *colld_cluster_of(const colld_daemon_t *d);
/* Queue a job for the network thread (lock held). */
void colld_cluster_inbox_push(colld_daemon_t *d, cjob_t *j);
/* Log a refused peer message, at most one line per 10 s with the count of the others (net). */
void colld_cluster_log_bad(colld_cluster_t *cl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- cluster.c ---- */
/* Stop the transport and end what runs on it (the backend's stop; also for in-process tests). */
void colld_cluster_stop(colld_daemon_t *d);
/* The cluster on a detached transport (no listening socket, no thread; see
 * colld__tcp_net_detached), for fuzzers and in-process tests: its caller runs the network
 * thread's passes (colld__tcp_net_step) and hands it peer messages through the transport's
 * callbacks. colld_cluster_stop ends it. Returns 0 or -1. */
int colld__cluster_start_detached(colld_daemon_t *d, const char *self_addr, const char *node_name);
/* Pin / unpin the communicator with this xid (takes the lock). NULL if unknown. */
colld_dcomm_t *colld_cluster_pin(colld_daemon_t *d, uint64_t xid);
void colld_cluster_unpin(colld_daemon_t *d, colld_dcomm_t *c);

/* ---- gather.c (network thread) ---- */
struct Colld__Net__V1__Msg;
void colld_gather_begin(colld_daemon_t *d, int slot);
void colld_gather_tick(colld_daemon_t *d);
void colld_gather_ctrl(colld_daemon_t *d, colld_net_peer_t *p, const struct Colld__Net__V1__Msg *m);
/* The transport stopped: free what the gathers hold (after colld_cluster_gather_abandon). */
void colld_gather_free(colld_cluster_t *cl);

/* ---- probe.c (network thread) ---- */
struct Colld__Net__V1__Msg;
void colld_probe_begin(colld_daemon_t *d, uint64_t bytes);
void colld_probe_tick(colld_daemon_t *d);
void colld_probe_ctrl(colld_daemon_t *d, colld_net_peer_t *p, const struct Colld__Net__V1__Msg *m);
void colld_probe_data(colld_daemon_t *d, colld_net_peer_t *p, const colld_net_hdr_t *h);

/* ---- iblink.c: --net-transport, the IB offer over the authenticated CTRL channel ---- */
/* Open the RDMA device as --net-transport asks (net_start). Returns 0, or -1 when `ib` is
 * required and there is none (the reason logged). */
int colld_iblink_start(colld_cluster_t *cl);
/* Close every negotiating link and the device (after the transport stopped). */
void colld_iblink_stop(colld_cluster_t *cl);
/* A peer came up: offer IB (or say why not) (net thread). */
void colld_iblink_peer_up(colld_cluster_t *cl, colld_net_peer_t *p);
/* A peer was lost: drop its negotiation (the transport closed its path) (net thread). */
void colld_iblink_peer_lost(colld_cluster_t *cl, colld_net_peer_t *p);
/* An IbHello or IbReady from p (net thread). */
void colld_iblink_ctrl(colld_cluster_t *cl, colld_net_peer_t *p, const struct Colld__Net__V1__Msg *m);
/* Offers unanswered too long fall back (net thread). */
void colld_iblink_tick(colld_cluster_t *cl);

/* ---- links.c (network thread): the slow-link watch, at most once a second ---- */
void colld_links_tick(colld_daemon_t *d);

/* ---- xcoll.c (network thread) ---- */
void colld_xcoll_add(colld_daemon_t *d, colld_coll_t *k);
/* A Ready from node `node` of communicator c (pinned). */
void colld_xcoll_ready(colld_daemon_t *d, colld_dcomm_t *c, int node, const xsig_t *sig);
/* A Verify (result checksum `sum` of collective `seq`) from node `node` of communicator c (pinned). */
void colld_xcoll_verified(colld_daemon_t *d, colld_dcomm_t *c, int node, uint64_t seq, uint64_t sum);
void colld_xcoll_data(colld_daemon_t *d, colld_net_peer_t *p, const colld_net_hdr_t *h, const void *payload);
/* Fail what must fail (broken communicators, time-outs) and start what can start. */
void colld_xcoll_tick(colld_daemon_t *d);
/* The transport has stopped: end every collective with an error (daemon shutting down). */
void colld_xcoll_abort_all(colld_daemon_t *d);

#endif /* COLLD_SERVER_CLUSTER_H */
