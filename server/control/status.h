/*
 * status.h - the Status a caller sees (status.c): for the Status RPC and for this node's report to
 * a peer's doctor (node_report.c).
 */
#ifndef COLLD_SERVER_CONTROL_STATUS_H
#define COLLD_SERVER_CONTROL_STATUS_H

#include "colld.pb-c.h"
#include "server/core/daemon.h"
#include "transport/tcp/tcp.h"

#include <stdbool.h>

#define COLLD_STATUS_PEERS_MAX 64

/* A StatusResponse and the memory behind it (large: allocate it). */
typedef struct {
    Colld__V1__StatusResponse resp;
    Colld__V1__SessionInfo *sinfo, **sptr;
    Colld__V1__CommInfo *cinfo, **cptr;
    Colld__V1__CommMemberInfo *minfo, **mptr;
    uint64_t *posted; /* CommInfo.member_posted */
    colld_gpu_health_t *gh;
    Colld__V1__GpuHealth *ginfo, **gptr;
    colld_net_peer_info_t peers[COLLD_STATUS_PEERS_MAX];
    Colld__V1__PeerInfo pinfo[COLLD_STATUS_PEERS_MAX], *pptr[COLLD_STATUS_PEERS_MAX];
    char gh_none[192];
} colld_status_buf_t;

/* Fill b (zeroed) with the status a caller of uid `uid` sees: an admin every tenant's, anyone else
 * only its own tenant's communicators and sessions; with sessions false, no session is listed
 * (takes daemon->lock; call without it). b->resp.status says whether it worked. */
void colld_status_build(colld_daemon_t *d, bool admin, uid_t uid, bool sessions, colld_status_buf_t *b);
/* Free what colld_status_build allocated, and b. */
void colld_status_buf_free(colld_status_buf_t *b);

#endif /* COLLD_SERVER_CONTROL_STATUS_H */
