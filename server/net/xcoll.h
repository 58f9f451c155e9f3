/*
 * xcoll.h - one collective among the member daemons of a communicator (internal to server/net):
 * the object the driver (xcoll.c: stages, Ready, DATA, deadlines) and the inter-node algorithms
 * share, one algorithm per file as UCC's allreduce_knomial.c:
 *
 *   ring.c  ring reduce-scatter + all-gather over k blocks (all-reduce, reduce), reduce-scatter,
 *           all-gather, and the broadcast chain; DATA phases XPHASE_RS and XPHASE_AG
 *   rd.c    recursive doubling for small all-reduces and reduces; DATA phases XPHASE_RD_PRE,
 *           XPHASE_RD, XPHASE_RD_POST
 *
 * An algorithm starts (once Ready went out), checks each DATA message of its phases before a byte
 * is used (valid: always says why when it refuses), takes it (data), and says what it waits for
 * (waiting, for the time-out's detail). It sends and fails only through the driver's xc->send and
 * xc->fail, so the algorithms link nothing of the driver.
 */
#ifndef COLLD_SERVER_NET_XCOLL_H
#define COLLD_SERVER_NET_XCOLL_H

#include "server/net/cluster.h"

#include <stdio.h>

typedef struct {
    uint64_t off, len;
    int block;
    uint32_t chunk0; /* index of its first chunk among all chunks of the layout */
} xrange_t;

/* What a collective has to do with one other node; the transport's done callback of a send to
 * it gets a pointer to this. */
typedef struct {
    struct xcoll *xc;
    int node;
    bool ready;        /* Ready(seq) seen with the same signature */
    unsigned inflight; /* DATA sends to it not written yet */
    uint64_t moved_ns; /* the last of them written, or the first queued when none was yet */
} xnode_t;

/* A send waiting for its destination's Ready. */
typedef struct pend {
    int node;
    colld_net_hdr_t h;
    const uint8_t *src;
    struct pend *next;
} pend_t;

struct xcoll {
    colld_daemon_t *d;
    colld_coll_t *k;
    colld_dcomm_t *c;
    colld_xcomm_t *x;
    xsig_t sig;
    colld_dtype_t dt;
    colld_redop_t op;  /* the collective's op (COLLD_REDOP_PREMUL_SUM included) */
    colld_redop_t pop; /* the op that combines partials (avg, premultiplied sum: sum) */
    size_t es;
    bool active, failed, rd;
    bool verify;     /* result verification: this node's or another's Ready asked for it (all-reduce) */
    uint64_t vsum;   /* with verify: this node's result checksum, sent in Verify */
    bool vdone;      /* with verify: every node's checksum came and all were equal */
    int stage;       /* STAGE_IN, STAGE_NET, STAGE_OUT, STAGE_VERIFY */
    uint64_t cursor; /* bytes of X the local stage has done */
    int busy;        /* > 0 while a handler runs: finishing waits for it */
    colld_status_t status;
    uint8_t *X;
    uint64_t xbytes;
    xrange_t *ranges; /* ring layout */
    int nranges;
    uint32_t nchunks; /* chunks of the ring layout */
    uint8_t *got;     /* [2][nchunks]: ring chunks received in reduce-scatter, all-gather */
    xnode_t *nodes;   /* [nnodes] */
    int nready;       /* other nodes ready */
    uint64_t recv_left;
    unsigned inflight; /* DATA sends not written yet */
    pend_t *pend, *pend_tail;
    uint64_t deadline_ns; /* every node's Ready by then */
    uint64_t progress_ns; /* the last progress, once every node is ready (deadlines above) */
    uint64_t fail_ns;     /* when it failed */
    /* recursive doubling */
    int rd_p, rd_nsteps, rd_step;
    bool rd_pre_wait, rd_finished;
    uint8_t *rd_buf;   /* [pre | steps recv | steps send], each xbytes */
    uint64_t *rd_left; /* [1 + nsteps]: bytes still to receive (0: pre) */
    bool *rd_sent;     /* [nsteps]: this node's data of the step went out */
    uint64_t rd_charged; /* (driver) rd_buf's bytes, charged to the communicator's tenant (tenant.h) */
    xcoll_t *next;     /* in x's queue */
    xcoll_t *rnext;    /* in the cluster's running list */
    /* what the driver (xcoll.c) does for the algorithms: send one chunk to a node (or hold it
     * until the node is ready), fail the collective (with break_comm, the communicator too) */
    void (*send)(xcoll_t *xc, int node, int phase, int step, uint64_t off, uint64_t len, const uint8_t *src);
    void (*fail)(xcoll_t *xc, colld_status_t st, const char *detail, bool break_comm);
};

enum { STAGE_IN = 0, STAGE_NET = 1, STAGE_OUT = 2, STAGE_VERIFY = 3 };

/* a mod k, in [0, k). */
static inline int xmod(int a, int k)
{
    return ((a % k) + k) % k;
}

/* The collectives that reduce (they have a reduce-scatter phase). */
static inline bool xkind_reduces(unsigned kind)
{
    return kind == COLLD_KIND_ALLREDUCE || kind == COLLD_KIND_REDUCE || kind == COLLD_KIND_REDUCESCATTER;
}

/* All but reduce-scatter have an all-gather phase. */
static inline bool xkind_has_ag(unsigned kind)
{
    return kind != COLLD_KIND_REDUCESCATTER;
}

/* The name of a DATA phase, for messages. */
static inline const char *xphase_name(unsigned phase)
{
    switch (phase) {
    case XPHASE_RS:
        return "ring reduce-scatter";
    case XPHASE_AG:
        return "ring all-gather";
    case XPHASE_RD_PRE:
        return "recursive doubling hand-in";
    case XPHASE_RD:
        return "recursive doubling";
    case XPHASE_RD_POST:
        return "recursive doubling result";
    }
    return "unknown phase";
}

/* ---- ring.c ---- */
/* The ring layout (which byte ranges of X make up each node's block) and its chunks. 0 or -1. */
int colld_xring_layout(xcoll_t *xc);
/* Start: how much is due from the previous node, and the first sends. */
void colld_xring_start(xcoll_t *xc);
/* Check a DATA message of phase RS or AG from node `from`; on success *chunk is the ring chunk it
 * fills. False with the reason in why. */
bool colld_xring_valid(const xcoll_t *xc, int from, const colld_net_hdr_t *h, int64_t *chunk, colld_err_t *err);
/* Take a checked DATA message of phase RS or AG (reduce or copy it into X, forward it). */
void colld_xring_data(xcoll_t *xc, const colld_net_hdr_t *h, int64_t chunk, const void *payload);
/* The phase, step and node the ring waits for; *from -1 when it waits for nothing. */
void colld_xring_waiting(const xcoll_t *xc, unsigned *phase, int *step, int *from);

/* ---- rd.c ---- */
/* Start: the buffers, the hand-in or the first exchange. */
void colld_xrd_start(xcoll_t *xc);
/* The bytes of the step buffers colld_xrd_start allocates (the driver charges them to the tenant). */
uint64_t colld_xrd_buf_bytes(const xcoll_t *xc);
/* Check a DATA message of a recursive doubling phase from node `from`. */
bool colld_xrd_valid(const xcoll_t *xc, int from, const colld_net_hdr_t *h, colld_err_t *err);
/* Take a checked DATA message of a recursive doubling phase. */
void colld_xrd_data(xcoll_t *xc, const colld_net_hdr_t *h, const void *payload);
/* The phase, step and node it waits for; *from -1 when it waits for nothing. */
void colld_xrd_waiting(const xcoll_t *xc, unsigned *phase, int *step, int *from);
/* Free its buffers. */
void colld_xrd_free(xcoll_t *xc);

#endif /* COLLD_SERVER_NET_XCOLL_H */
