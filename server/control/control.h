/*
 * control.h - the control plane: the gRPC handlers of proto/colld.proto (control.c) and the
 * daemon's own accepting of the control socket <socket>.rpc (ctl_listen.c).
 */
#ifndef COLLD_SERVER_CONTROL_CONTROL_H
#define COLLD_SERVER_CONTROL_CONTROL_H

#include "server/control/rpc/rpc_server.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <stdint.h>

typedef struct colld_daemon colld_daemon_t;

/* ---- control.c: gRPC handlers ---- */
int colld_control_start(colld_daemon_t *d);
void colld_control_stop(colld_daemon_t *d);
/* The control-plane methods (for colld_rpc_server_inject). */
const colld_rpc_method_t *colld_control_methods(size_t *n);

/* ---- node_report.c: collctl doctor across nodes ---- */
/* Make this node's reports for peers (d->node_report) from now on / no more. */
void colld_node_report_start(colld_daemon_t *d);
void colld_node_report_stop(colld_daemon_t *d);
/* Serve a NodeReports call of a session (admin or of tenant uid) that control.c authenticated. */
void colld_node_reports_rpc(colld_rpc_call_t *call, const ProtobufCMessage *msg, void *ctx, bool admin, uid_t uid);

/* ---- ctl_listen.c: connections to the control socket ---- */
/* Accept <socket>.rpc on the loop and hand the connections to the gRPC server (which must exist),
 * within per-tenant and global caps; start the self-probe. Returns 0 or -1. */
int colld_ctl_start(colld_daemon_t *d);
/* Stop accepting (loop thread); connections end with the gRPC server. */
void colld_ctl_stop(colld_daemon_t *d);
/* Free what is left once the gRPC server is destroyed and the loop has run. */
void colld_ctl_free(colld_daemon_t *d);
/* Control connections served now, refused ones still held, refused ones so far (loop thread). */
void colld_ctl_stats(const colld_daemon_t *d, unsigned *admitted, unsigned *refused_held, uint64_t *refused_total);
/* Control connections refused for lack of descriptors so far (loop thread). */
uint64_t colld_ctl_shed(const colld_daemon_t *d);

#endif /* COLLD_SERVER_CONTROL_CONTROL_H */
