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
/* The node name of a rank's daemon for display ("" when local or unknown) (lock held). */
const char *colld_cluster_rank_node(const colld_dcomm_t *c, int rank);
/* The collective a multi-node communicator is running among the nodes, as collctl trace shows
 * the one being waited for (status COLLD_INPROGRESS, arrivals[nranks] of the local ranks).
 * False when there is none (lock held). */
bool colld_cluster_trace_pending(const colld_dcomm_t *c, colld_trace_rec_t *t, uint64_t *arrivals);

#endif /* COLLD_SERVER_NET_NET_H */
