/*
 * net.h - the multi-node backend (server/net): communicators spanning several daemons, formed
 * through a root daemon and run by the inter-node algorithms (ring.c, rd.c) over the TCP
 * transport. What the rest of the daemon (the control plane, the metrics, main) may ask of it.
 */
#ifndef COLLD_SERVER_NET_NET_H
#define COLLD_SERVER_NET_NET_H

#include "server/core/daemon.h"

/* The backend (registered in the registry, server/registry.c.in). */
extern const colld_backend_ops_t colld_net_backend;

/* Whether this daemon serves peers (started with --listen). */
bool colld_cluster_running(const colld_daemon_t *d);
/* Peers and counters for collctl status (call without the lock). Returns the number of peers. */
struct colld_net_peer_info;
/* Peer messages refused since the start (invalid, or from a node not entitled to send them). */
uint64_t colld_cluster_bad_msgs(colld_daemon_t *d);
size_t colld_cluster_peers(colld_daemon_t *d, struct colld_net_peer_info *out, size_t max, uint64_t *sent,
                           uint64_t *received, uint64_t *refused);
/* Close the connections to a peer (operator, tests). Returns 0 or -1 (no such peer up). */
int colld_cluster_disconnect(colld_daemon_t *d, const char *peer);
/* This daemon's node name and peer address (cluster running). */
const char *colld_cluster_node_name(const colld_daemon_t *d);
const char *colld_cluster_listen_addr(const colld_daemon_t *d);
/* The cluster-wide id of a multi-node communicator (the same on every node), 0 for any other
 * (lock held). */
uint64_t colld_cluster_comm_xid(const colld_dcomm_t *c);
/* The RDMA device peer links may use ("" none) and why there is none ("" when there is one)
 * (fixed once the cluster runs; docs/ib.md). */
const char *colld_cluster_ib_device(const colld_daemon_t *d);
const char *colld_cluster_ib_none(const colld_daemon_t *d);
/* The node name of a rank's daemon for display ("" when local or unknown) (lock held). */
const char *colld_cluster_rank_node(const colld_dcomm_t *c, int rank);
/* The collective a multi-node communicator is running among the nodes, as collctl trace shows
 * the one being waited for (status COLLD_INPROGRESS, arrivals[nranks] of the local ranks).
 * False when there is none (lock held). */
bool colld_cluster_trace_pending(const colld_dcomm_t *c, colld_trace_rec_t *t, uint64_t *arrivals);

/* collctl probe (probe.c): one link's measurement. */
#define COLLD_PROBE_MIN_BYTES (256u << 10)
#define COLLD_PROBE_MAX_BYTES (64u << 20)
#define COLLD_PROBE_DEFAULT_BYTES (2u << 20)
typedef struct {
    char name[64], addr[128];
    uint64_t tx_bytes, tx_ns; /* to the peer, as the peer timed it */
    uint64_t rx_bytes, rx_ns; /* from the peer, as this daemon timed it */
    uint64_t rtt_ns;
    char error[192];
} colld_probe_link_t;
/* The answer of a probe: links[n] (NULL, 0 when the daemon stops first). Runs on the network
 * thread (or the one stopping the control plane) under the probe's own lock: it must not call
 * back into the net backend. */
typedef void (*colld_probe_done_fn)(void *arg, const colld_probe_link_t *links, size_t n);
/* Probe every peer that is up with `bytes` each way (COLLD_PROBE_MIN_BYTES..MAX); done(arg, ...)
 * runs exactly once when it is over. Returns 0, or -1 with the reason in err (no cluster, a probe
 * running already, a bad size): then done never runs. */
int colld_cluster_probe(colld_daemon_t *d, uint64_t bytes, colld_probe_done_fn done, void *arg, char *err,
                        size_t err_len);
/* Answer an owed probe now with nothing (the control plane stops before the net backend). */
void colld_cluster_probe_abandon(colld_daemon_t *d);

/* collctl doctor across nodes (gather.c): one peer daemon's answer. */
#define COLLD_GATHER_REPORT_MAX (512u << 10) /* a report's packed size, at most */
#define COLLD_GATHER_PEERS_MAX 64            /* peers asked per gather, at most */
typedef struct {
    char name[64], addr[128];
    bool answered;   /* report holds what the peer sent (not yet validated: the caller does) */
    char error[256]; /* why there is no report */
    uint8_t *report; /* a packed colld.v1.NodeReport, at most COLLD_GATHER_REPORT_MAX bytes */
    size_t report_len;
} colld_gather_node_t;
/* The answer of a gather: nodes[n] (NULL, 0 when the daemon stops first); the reports are freed
 * after it returns. Runs on the network thread (or the one stopping the control plane) under the
 * gather's lock: it must not call back into the net backend. */
typedef void (*colld_gather_done_fn)(void *arg, const colld_gather_node_t *nodes, size_t n);
/* Ask every peer daemon for its report (DoctorReq, for a caller of uid `uid`, admin or not, with
 * the fault events since since_unix_us): done(arg, ...) runs exactly once, when every peer that
 * is up answered or timeout_ms passed (a peer that did not is an entry saying so; a peer that is
 * not up, one saying what it is). Returns 0, or -1 with the reason in err (no cluster, too many
 * gathers at once): then done never runs. */
int colld_cluster_gather(colld_daemon_t *d, uid_t uid, bool admin, int64_t since_unix_us, uint32_t timeout_ms,
                         colld_gather_done_fn done, void *arg, char *err, size_t err_len);
/* Answer every owed gather now with nothing (the control plane stops before the net backend). */
void colld_cluster_gather_abandon(colld_daemon_t *d);

#endif /* COLLD_SERVER_NET_NET_H */
