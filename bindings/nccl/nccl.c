/*
 * nccl.c - libnccl.so.2: the NCCL API over libcolld, so that a program written for NCCL reaches
 * colld without a rewrite (include/nccl.h says what differs; docs/nccl.md how to load it).
 *
 * One colld client per process, connected at the first call that needs the daemon
 * ($COLLD_SOCKET, else the default socket: colld_connect). An ncclComm_t wraps one
 * colld_comm_t. NCCL's calls map one to one onto colld's, with two things added here:
 *
 *   - Host memory. colld runs a collective whose buffers are host memory on its host backend, with
 *     no stream; NCCL's caller has no other way to learn it completed, so such a call waits for it
 *     (colld_comm_synchronize) before it returns, or, inside a group, at ncclGroupEnd.
 *   - Groups. ncclGroupStart/End wrap colld_group_start/end (collectives of several communicators
 *     from one thread). ncclCommInitRank inside a group is NCCL's way for one thread to create
 *     several ranks: it is recorded and run at ncclGroupEnd, each init on a thread of its own
 *     (colld_comm_init_rank waits for every rank), so that they can all join.
 *
 * Errors: a colld status becomes the nearest ncclResult_t (to_nccl) and its detail is kept for
 * ncclGetLastError (per thread; for a broken communicator, colld's detail of that communicator).
 *
 * The calls of NCCL 2.20-2.28 that PyTorch 2.x links are here too: ncclAlltoAll (colld_alltoall),
 * ncclCommInitRankScalable (a join with the first id), ncclCommShrink (a join of the ranks that
 * stay, the id handed over the parent's sends), ncclGroupSimulateEnd (the group discarded, no
 * estimate), and the refusals of memory windows and device communicators.
 */
#include "client/client_internal.h" /* colld__gpu_maybe_device, colld__gpu_is_device */
#include "bindings/nccl/include/nccl.h"

#include <colld/colld.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* What this library is, for a program (or a test) that must know which libnccl.so.2 it loaded. */
EXPORT const char colld_nccl_implementation[] = "colld libnccl.so.2 (NCCL 2.19.3 API)";

#define GROUP_MAX_INITS 1024 /* ncclCommInitRank calls one group may hold */
#define GROUP_MAX_HOST 1024  /* communicators with host collectives one group may hold */

struct ncclComm {
    colld_comm_t *c;        /* NULL while its init waits for ncclGroupEnd */
    colld_client_t *client; /* the process's client, set at init */
    int nranks, rank, device;
};

/* A deferred ncclCommInitRank (inside a group). */
typedef struct {
    ncclComm_t comm;
    colld_unique_id_t id;
    colld_status_t status;
    char detail[512];
    pthread_t thread;
    bool started;
} pending_init_t;

/* This thread's group. */
typedef struct {
    int depth;
    ncclResult_t error; /* first error of a call inside the group */
    pending_init_t *inits;
    int ninits;
    ncclComm_t host[GROUP_MAX_HOST]; /* communicators with host collectives to wait for */
    int nhost;
} group_t;

static _Thread_local group_t group;
static _Thread_local char last_error[1024];

static pthread_mutex_t client_mu = PTHREAD_MUTEX_INITIALIZER;
static colld_client_t *client;

/* ============================================================================================
 * Errors
 * ========================================================================================== */

/* Remember why the call fails, for ncclGetLastError. Returns res. */
__attribute__((format(printf, 2, 3))) static ncclResult_t fail(ncclResult_t res, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    if (group.depth > 0 && group.error == ncclSuccess)
        group.error = res;
    return res;
}

/* The ncclResult_t nearest to a colld status. */
static ncclResult_t to_nccl(colld_status_t st)
{
    switch (st) {
    case COLLD_OK:
        return ncclSuccess;
    case COLLD_INPROGRESS:
        return ncclInProgress;
    case COLLD_ERR_INVALID_ARGUMENT:
    case COLLD_ERR_NUMERIC: /* a NaN or infinity in some rank's input (colld's --nan-check) */
        return ncclInvalidArgument;
    case COLLD_ERR_INVALID_USAGE:
    case COLLD_ERR_NOT_SUPPORTED:
    case COLLD_ERR_DEADLOCK: /* collectives of two communicators called in different orders */
    case COLLD_ERR_PERMISSION_DENIED:
        return ncclInvalidUsage;
    case COLLD_ERR_PEER_LOST:
    case COLLD_ERR_NODE_LOST:
    case COLLD_ERR_TIMEOUT:
    case COLLD_ERR_MISMATCH:
    case COLLD_ERR_ABORTED:
    case COLLD_ERR_CORRUPTED: /* a rank's or node's all-reduce result differs (colld's --verify-results) */
        return ncclRemoteError;
    case COLLD_ERR_DEVICE:
        return ncclUnhandledCudaError;
    case COLLD_ERR_INTERNAL:
    case COLLD_ERR_PROTOCOL:
        return ncclInternalError;
    default: /* no memory, system, daemon unavailable or lost, quota */
        return ncclSystemError;
    }
}

/* A failed colld call on a communicator: its status and colld's detail. The detail must be this
 * failure's: colld's names its status first, and one that names another status (the handle's
 * earlier failure) is not used. */
static ncclResult_t fail_comm(const char *what, colld_status_t st, ncclComm_t comm)
{
    const char *detail = comm && comm->c ? colld_comm_last_error(comm->c) : "";
    const char *name = colld_status_name(st);
    size_t nl = strlen(name);
    if (detail && strncmp(detail, name, nl) == 0 && (detail[nl] == ':' || detail[nl] == ' '))
        return fail(to_nccl(st), "%s: %s", what, detail);
    bool other = detail && strncmp(detail, "COLLD_", 6) == 0; /* another failure's */
    return fail(to_nccl(st), "%s: %s: %s", what, name, detail && detail[0] && !other ? detail : colld_status_string(st));
}

EXPORT const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with COLLD_LOG_LEVEL=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (the colld daemon is unreachable, out of memory or at a limit)";
    case ncclInternalError:
        return "internal error - please report this issue to the colld developers";
    case ncclInvalidArgument:
        return "invalid argument (run with COLLD_LOG_LEVEL=INFO for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with COLLD_LOG_LEVEL=INFO for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

EXPORT const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm; /* as NCCL's: the calling thread's last error */
    return last_error;
}

EXPORT ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

/* ============================================================================================
 * The client, communicators
 * ========================================================================================== */

/* The process's colld client, connected on first use; NULL (with the reason) when it cannot be. */
static colld_client_t *get_client(const char *what)
{
    pthread_mutex_lock(&client_mu);
    if (!client) {
        colld_status_t st = colld_connect(NULL, &client);
        if (st != COLLD_OK) {
            client = NULL;
            fail(to_nccl(st), "%s: cannot reach the colld daemon: %s", what, colld_last_error(NULL));
        }
    }
    colld_client_t *c = client;
    pthread_mutex_unlock(&client_mu);
    return c;
}

static ncclResult_t check_comm(const char *what, const ncclComm_t comm)
{
    if (!comm)
        return fail(ncclInvalidArgument, "%s: comm is NULL", what);
    if (!comm->c)
        return fail(ncclInvalidUsage,
                    "%s: the communicator is not initialised yet (its ncclCommInitRank waits for "
                    "ncclGroupEnd)",
                    what);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    colld_client_t *c = get_client("ncclGetUniqueId");
    if (!c)
        return ncclSystemError;
    colld_unique_id_t id;
    colld_status_t st = colld_get_unique_id(c, &id);
    if (st != COLLD_OK)
        return fail(to_nccl(st), "ncclGetUniqueId: %s: %s", colld_status_name(st), colld_last_error(c));
    _Static_assert(sizeof(id.internal) == sizeof(uniqueId->internal), "unique ids of one size");
    memcpy(uniqueId->internal, id.internal, sizeof(id.internal));
    return ncclSuccess;
}

/* Copy a string into buf of len bytes, cut if it must be. */
static void copy_str(char *buf, size_t len, const char *s)
{
    size_t n = strnlen(s, len - 1);
    memcpy(buf, s, n);
    buf[n] = '\0';
}

/* Join: colld_comm_init_rank for comm (blocks until every rank joined). */
static colld_status_t join(ncclComm_t comm, const colld_unique_id_t *id, char *detail, size_t len)
{
    colld_client_t *c = get_client("ncclCommInitRank");
    if (!c) {
        copy_str(detail, len, last_error);
        return COLLD_ERR_DAEMON_UNAVAILABLE;
    }
    comm->client = c;
    colld_status_t st = colld_comm_init_rank(c, &comm->c, comm->nranks, *id, comm->rank, NULL);
    if (st != COLLD_OK) {
        comm->c = NULL;
        copy_str(detail, len, colld_last_error(c));
    }
    return st;
}

static void *join_thread(void *arg)
{
    pending_init_t *p = arg;
    p->status = join(p->comm, &p->id, p->detail, sizeof(p->detail));
    return NULL;
}

/* Join as `rank` of `nranks` (what: the NCCL call, for messages); inside a group, at ncclGroupEnd. */
static ncclResult_t init_rank(const char *what, ncclComm_t *out, int nranks, ncclUniqueId commId, int rank, int device)
{
    if (!out)
        return fail(ncclInvalidArgument, "%s: comm is NULL", what);
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "%s: rank %d of %d ranks is out of range", what, rank, nranks);
    ncclComm_t comm = calloc(1, sizeof(*comm));
    if (!comm)
        return fail(ncclSystemError, "%s: out of memory", what);
    *comm = (struct ncclComm){ .nranks = nranks, .rank = rank, .device = device };
    colld_unique_id_t id;
    memcpy(id.internal, commId.internal, sizeof(id.internal));
    if (group.depth > 0) { /* at ncclGroupEnd, with the group's other inits */
        if (group.ninits >= GROUP_MAX_INITS) {
            free(comm);
            return fail(ncclInvalidUsage, "%s: more than %d in one group", what, GROUP_MAX_INITS);
        }
        if (!group.inits && !(group.inits = calloc(GROUP_MAX_INITS, sizeof(*group.inits)))) {
            free(comm);
            return fail(ncclSystemError, "%s: out of memory", what);
        }
        group.inits[group.ninits++] = (pending_init_t){ .comm = comm, .id = id };
        *out = comm;
        return ncclSuccess;
    }
    char detail[512];
    colld_status_t st = join(comm, &id, detail, sizeof(detail));
    if (st != COLLD_OK) {
        free(comm);
        return fail(to_nccl(st), "%s: rank %d of %d: %s: %s", what, rank, nranks, colld_status_name(st), detail);
    }
    *out = comm;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return init_rank("ncclCommInitRank", comm, nranks, commId, rank, 0);
}

/* A communicator's configuration (NULL: the defaults), as far as colld reads it: it must come from
 * NCCL_CONFIG_INITIALIZER, and a non-blocking communicator is refused. */
static ncclResult_t check_config(const char *what, const ncclConfig_t *config)
{
    if (!config)
        return ncclSuccess;
    if (config->size < offsetof(ncclConfig_t, blocking) + sizeof(int) || config->magic != 0xcafebeef)
        return fail(ncclInvalidArgument,
                    "%s: config is not initialised with NCCL_CONFIG_INITIALIZER (size %zu, magic %#x)", what,
                    config->size, config->magic);
    if (config->blocking == 0)
        return fail(ncclInvalidUsage,
                    "%s: non-blocking communicators (config->blocking = 0) are not supported by colld yet", what);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                           ncclConfig_t *config)
{
    ncclResult_t res = check_config("ncclCommInitRankConfig", config);
    return res != ncclSuccess ? res : init_rank("ncclCommInitRankConfig", comm, nranks, commId, rank, 0);
}

/* NCCL 2.23: nId unique ids, made by as many ranks, spread NCCL's bootstrap over several roots.
 * Every rank passes the same ids in the same order, so commIds[0] is common to all of them, and a
 * colld communicator needs one: it joins with that one (the others were issued by their daemons
 * and stay unused until their makers disconnect). */
EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                             ncclUniqueId *commIds, ncclConfig_t *config)
{
    if (!commIds || nId < 1 || (nranks >= 1 && nId > nranks))
        return fail(ncclInvalidArgument, "ncclCommInitRankScalable: %s",
                    !commIds ? "commIds is NULL" : "nId must be at least 1 and at most nranks");
    ncclResult_t res = check_config("ncclCommInitRankScalable", config);
    return res != ncclSuccess ? res : init_rank("ncclCommInitRankScalable", newcomm, nranks, commIds[0], myrank, 0);
}

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (!comms || ndev < 1)
        return fail(ncclInvalidArgument, "ncclCommInitAll: comms is NULL or ndev (%d) < 1", ndev);
    ncclUniqueId id;
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess)
        return res;
    ncclGroupStart();
    for (int i = 0; i < ndev; i++)
        init_rank("ncclCommInitAll", &comms[i], ndev, id, i, devlist ? devlist[i] : i);
    return ncclGroupEnd();
}

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    if (!newcomm)
        return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
    *newcomm = NULL;
    ncclResult_t res = check_comm("ncclCommSplit", comm);
    if (res != ncclSuccess)
        return res;
    if (config && config->size >= offsetof(ncclConfig_t, blocking) + sizeof(int) && config->blocking == 0)
        return fail(ncclInvalidUsage, "ncclCommSplit: non-blocking communicators (config->blocking = 0) are not "
                                      "supported by colld yet");
    if (group.depth > 0)
        return fail(ncclInvalidUsage, "ncclCommSplit inside ncclGroupStart/End is not supported by colld yet");
    ncclComm_t sub = calloc(1, sizeof(*sub));
    if (!sub)
        return fail(ncclSystemError, "ncclCommSplit: out of memory");
    colld_status_t st = colld_comm_split(comm->c, color, key, &sub->c, NULL);
    if (st != COLLD_OK) {
        free(sub);
        return fail_comm("ncclCommSplit", st, comm);
    }
    if (!sub->c) { /* NCCL_SPLIT_NOCOLOR */
        free(sub);
        return ncclSuccess;
    }
    sub->client = comm->client;
    sub->device = comm->device;
    colld_comm_count(sub->c, &sub->nranks);
    colld_comm_user_rank(sub->c, &sub->rank);
    *newcomm = sub;
    return ncclSuccess;
}

/* The new communicator's unique id, from its rank 0 (parent rank `leader`, which makes it) to the
 * other ranks that stay (`stays`), over the parent's sends and receives: one send from the leader
 * to each of them, which runs on a parent whose other ranks are idle or have left (colld keeps the
 * sends between the ranks still there), not on a broken one. A leader that cannot make the id
 * sends zeros, which the others refuse. */
static colld_status_t shrink_id(ncclComm_t comm, const bool *stays, int leader, colld_unique_id_t *id, char *detail,
                                size_t len)
{
    colld_status_t st = COLLD_OK;
    memset(id, 0, sizeof(*id));
    if (comm->rank == leader) {
        st = colld_get_unique_id(comm->client, id);
        if (st != COLLD_OK) {
            snprintf(detail, len, "cannot make the unique id: %s", colld_last_error(comm->client));
            memset(id, 0, sizeof(*id));
        }
        for (int r = 0; r < comm->nranks; r++) { /* each send runs once the one before it has */
            colld_status_t s = r != leader && stays[r] ? colld_send(id, sizeof(*id), COLLD_UINT8, r, comm->c, NULL)
                                                       : COLLD_OK;
            if (s != COLLD_OK) {
                snprintf(detail, len, "%s", colld_comm_last_error(comm->c));
                return s;
            }
        }
    } else {
        colld_status_t s = colld_recv(id, sizeof(*id), COLLD_UINT8, leader, comm->c, NULL);
        if (s != COLLD_OK) {
            snprintf(detail, len, "%s", colld_comm_last_error(comm->c));
            return s;
        }
    }
    colld_status_t s = colld_comm_synchronize(comm->c);
    if (s != COLLD_OK) {
        snprintf(detail, len, "%s", colld_comm_last_error(comm->c));
        return s;
    }
    static const colld_unique_id_t none;
    if (st == COLLD_OK && memcmp(id, &none, sizeof(none)) == 0) {
        snprintf(detail, len, "rank %d (the new rank 0) could not make the unique id (its ncclGetLastError says why)",
                 leader);
        st = COLLD_ERR_INTERNAL;
    }
    return st;
}

/* NCCL 2.27: the ranks of comm not in excludeRanksList form a new communicator, in their order in
 * comm; only they call it (an excluded rank may have failed). colld_comm_split cannot serve it: it
 * is collective over every rank of the parent. So the lowest rank that stays makes a unique id and
 * sends it to the others (shrink_id), and they all join it (colld_comm_init_rank). This needs a
 * parent that still runs sends between the ranks that stay: one whose excluded ranks are idle or
 * have destroyed their handles; after a rank died or an abort colld has broken the parent, and the
 * caller makes a new communicator with ncclGetUniqueId and ncclCommInitRank instead. For the same
 * reason NCCL_SHRINK_ABORT (abort the parent's operations, then shrink) is refused. */
EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                                   ncclConfig_t *config, int shrinkFlags)
{
    if (!newcomm)
        return fail(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL");
    *newcomm = NULL;
    ncclResult_t res = check_comm("ncclCommShrink", comm);
    if (res != ncclSuccess)
        return res;
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList))
        return fail(ncclInvalidArgument, "ncclCommShrink: excludeRanksCount is %d with excludeRanksList %s",
                    excludeRanksCount, excludeRanksList ? "set" : "NULL");
    if (shrinkFlags == NCCL_SHRINK_ABORT)
        return fail(ncclInvalidUsage,
                    "ncclCommShrink: NCCL_SHRINK_ABORT is not supported by colld: an abort breaks the parent "
                    "communicator, and colld's shrink hands the new communicator's unique id over the parent's "
                    "sends; shrink with NCCL_SHRINK_DEFAULT, or make a new communicator (ncclCommInitRank)");
    if (shrinkFlags != NCCL_SHRINK_DEFAULT)
        return fail(ncclInvalidArgument, "ncclCommShrink: unknown shrinkFlags %#x", (unsigned)shrinkFlags);
    if ((res = check_config("ncclCommShrink", config)) != ncclSuccess)
        return res;
    if (group.depth > 0)
        return fail(ncclInvalidUsage, "ncclCommShrink inside ncclGroupStart/End is not supported by colld");
    bool *stays = malloc((size_t)comm->nranks * sizeof(*stays));
    if (!stays)
        return fail(ncclSystemError, "ncclCommShrink: out of memory");
    for (int r = 0; r < comm->nranks; r++)
        stays[r] = true;
    for (int i = 0; i < excludeRanksCount; i++) {
        int x = excludeRanksList[i];
        if (x < 0 || x >= comm->nranks || x == comm->rank) {
            free(stays);
            return fail(ncclInvalidArgument,
                        x == comm->rank ? "ncclCommShrink: rank %d (this rank) is in excludeRanksList: the excluded "
                                          "ranks do not call ncclCommShrink"
                                        : "ncclCommShrink: excluded rank %d is out of range (%d ranks)",
                        x, comm->nranks);
        }
        stays[x] = false;
    }
    int leader = -1, newrank = 0, newn = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (!stays[r])
            continue;
        leader = leader < 0 ? r : leader;
        newrank += r < comm->rank;
        newn++;
    }
    char detail[512] = "";
    colld_unique_id_t id;
    colld_status_t st = shrink_id(comm, stays, leader, &id, detail, sizeof(detail));
    free(stays);
    if (st != COLLD_OK)
        return fail(to_nccl(st),
                    "ncclCommShrink: handing the new communicator's unique id from rank %d over the parent failed: "
                    "%s (colld's shrink needs a parent that still runs sends between the ranks that stay; after a "
                    "rank died or an abort make a new communicator with ncclGetUniqueId and ncclCommInitRank)",
                    leader, detail);
    ncclComm_t sub = calloc(1, sizeof(*sub));
    if (!sub)
        return fail(ncclSystemError, "ncclCommShrink: out of memory");
    *sub = (struct ncclComm){ .nranks = newn, .rank = newrank, .device = comm->device };
    if ((st = join(sub, &id, detail, sizeof(detail))) != COLLD_OK) {
        free(sub);
        return fail(to_nccl(st), "ncclCommShrink: joining as rank %d of %d: %s: %s", newrank, newn,
                    colld_status_name(st), detail);
    }
    *newcomm = sub;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t res = check_comm("ncclCommFinalize", comm);
    if (res != ncclSuccess)
        return res;
    colld_status_t st = colld_comm_synchronize(comm->c);
    return st == COLLD_OK ? ncclSuccess : fail_comm("ncclCommFinalize", st, comm);
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    /* As NCCL's: finalize first when the caller did not. What this rank issued completes (bounded
     * by the communicator's timeout; a broken communicator returns at once) before the handle goes:
     * destroyed at once, a send still queued on a stream was cancelled, and every peer's operation
     * failed with the communicator (on an H200: a pipeline's last stage received nothing). */
    if (comm->c)
        (void)colld_comm_synchronize(comm->c);
    colld_status_t st = comm->c ? colld_comm_destroy(comm->c) : COLLD_OK;
    comm->c = NULL;
    free(comm);
    return st == COLLD_OK ? ncclSuccess : fail(to_nccl(st), "ncclCommDestroy: %s", colld_status_name(st));
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    if (comm->c) {
        colld_comm_abort(comm->c);
        colld_comm_destroy(comm->c);
    }
    free(comm);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!asyncError)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    ncclResult_t res = check_comm("ncclCommGetAsyncError", comm);
    if (res != ncclSuccess)
        return res;
    colld_status_t err = COLLD_OK, st = colld_comm_get_async_error(comm->c, &err);
    if (st != COLLD_OK)
        return fail_comm("ncclCommGetAsyncError", st, comm);
    *asyncError = err == COLLD_INPROGRESS ? ncclSuccess : to_nccl(err);
    if (*asyncError != ncclSuccess)
        fail_comm("the communicator failed", err, comm); /* for ncclGetLastError */
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return fail(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || !device)
        return fail(ncclInvalidArgument, "ncclCommCuDevice: comm or device is NULL");
    *device = comm->device;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return fail(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

/* The handle of a buffer colld cannot register: host memory not from ncclMemAlloc, which colld's
 * host collectives stage (a colld extension; for NCCL a registration is a hint, and the call
 * succeeds). Deregistering it does nothing. */
static char host_handle;

/* colld_mem_register: the daemon maps the buffer's GPU allocation(s) now, until ncclCommDeregister
 * or ncclCommDestroy (the handles left). */
EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    ncclResult_t res = check_comm("ncclCommRegister", comm);
    if (res != ncclSuccess)
        return res;
    if (!buff || !handle)
        return fail(ncclInvalidArgument, "ncclCommRegister: buff or handle is NULL");
    colld_status_t st = colld_mem_register(comm->c, buff, size, handle);
    if (st == COLLD_ERR_NOT_SUPPORTED &&
        !(colld__gpu_maybe_device(comm->client) && colld__gpu_is_device(comm->client, buff))) {
        *handle = &host_handle;
        return ncclSuccess;
    }
    return st == COLLD_OK ? ncclSuccess : fail_comm("ncclCommRegister", st, comm);
}

EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    ncclResult_t res = check_comm("ncclCommDeregister", comm);
    if (res != ncclSuccess)
        return res;
    if (!handle)
        return fail(ncclInvalidArgument, "ncclCommDeregister: handle is NULL");
    if (handle == &host_handle)
        return ncclSuccess;
    colld_status_t st = colld_mem_deregister(comm->c, handle);
    return st == COLLD_OK ? ncclSuccess : fail_comm("ncclCommDeregister", st, comm);
}

/* NCCL 2.27's memory windows: a buffer registered on every rank at once, which NCCL's symmetric
 * kernels and its device API read and write in the peers' memory directly. colld's collectives run
 * in the daemon, never in the application's kernels, so it has no windows: refused. */
EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags)
{
    (void)buff;
    (void)size;
    (void)winFlags;
    if (win)
        *win = NULL;
    ncclResult_t res = check_comm("ncclCommWindowRegister", comm);
    if (res != ncclSuccess)
        return res;
    return fail(ncclInvalidUsage,
                "ncclCommWindowRegister: memory windows (symmetric memory) are not supported by colld: its "
                "collectives run in the daemon, not in kernels that reach the peers' windows; use ncclCommRegister, "
                "or nothing (colld registers a buffer at its first use)");
}

EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    ncclResult_t res = check_comm("ncclCommWindowDeregister", comm);
    if (res != ncclSuccess || !win)
        return res;
    return fail(ncclInvalidArgument,
                "ncclCommWindowDeregister: %p is not a window of this communicator: colld makes none "
                "(ncclCommWindowRegister is not supported)",
                (void *)win);
}

/* NCCL 2.28's device communicators: the handle with which the application's own kernels
 * communicate (NCCL's device API). colld has no device-side API: refused. */
EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs, ncclDevComm_t *outDevComm)
{
    (void)reqs;
    (void)outDevComm;
    ncclResult_t res = check_comm("ncclDevCommCreate", comm);
    if (res != ncclSuccess)
        return res;
    return fail(ncclInvalidUsage,
                "ncclDevCommCreate: device communicators (NCCL's device API, communicating from the "
                "application's kernels) are not supported by colld: its collectives run in the daemon; use the "
                "host API's collectives");
}

EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm)
{
    (void)devComm;
    ncclResult_t res = check_comm("ncclDevCommDestroy", comm);
    if (res != ncclSuccess)
        return res;
    return fail(ncclInvalidArgument, "ncclDevCommDestroy: not a device communicator of colld's: colld makes none "
                                     "(ncclDevCommCreate is not supported)");
}

/* ============================================================================================
 * Memory, reduction operators
 * ========================================================================================== */

EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr)
        return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    colld_client_t *c = get_client("ncclMemAlloc");
    if (!c)
        return ncclSystemError;
    colld_status_t st = colld_mem_alloc(c, ptr, size, COLLD_MEM_CUDA);
    return st == COLLD_OK
               ? ncclSuccess
               : fail(to_nccl(st), "ncclMemAlloc(%zu): %s: %s", size, colld_status_name(st), colld_last_error(c));
}

EXPORT ncclResult_t ncclMemFree(void *ptr)
{
    colld_client_t *c = get_client("ncclMemFree");
    if (!c)
        return ncclSystemError;
    colld_status_t st = colld_mem_free(c, ptr);
    return st == COLLD_OK ? ncclSuccess
                          : fail(to_nccl(st), "ncclMemFree: %s: %s", colld_status_name(st), colld_last_error(c));
}

static int dtype_of(ncclDataType_t t);

/* The premultiplied sum: colld_redop_create_premul_sum of the communicator, whose operator value
 * (above ncclNumOps, below 2^31) is the ncclRedOp_t. The scalar is read here, as NCCL reads a
 * host-immediate one, so the operator may be destroyed once the calls using it have returned. A
 * scalar in device memory (ncclScalarDevice) is read by NCCL's kernels when each collective runs;
 * colld has no such read (its kernels run in the daemon), so it is refused. */
EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                             ncclScalarResidence_t residence, ncclComm_t comm)
{
    ncclResult_t res = check_comm("ncclRedOpCreatePreMulSum", comm);
    if (res != ncclSuccess)
        return res;
    int dt = dtype_of(datatype);
    if (!op || !scalar || dt < 0)
        return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: %s",
                    !op       ? "op is NULL"
                    : !scalar ? "scalar is NULL"
                              : "unknown data type");
    if (residence == ncclScalarDevice)
        return fail(ncclInvalidUsage,
                    "ncclRedOpCreatePreMulSum: a scalar in device memory (ncclScalarDevice) is not supported by "
                    "colld: pass a pointer to the scalar in host memory with ncclScalarHostImmediate");
    if (residence != ncclScalarHostImmediate)
        return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: unknown scalar residence %d", (int)residence);
    colld_redop_t cop;
    colld_status_t st = colld_redop_create_premul_sum(comm->c, scalar, (colld_dtype_t)dt, &cop);
    if (st != COLLD_OK)
        return fail_comm("ncclRedOpCreatePreMulSum", st, comm);
    *op = (ncclRedOp_t)cop;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    ncclResult_t res = check_comm("ncclRedOpDestroy", comm);
    if (res != ncclSuccess)
        return res;
    if ((unsigned)op < ncclNumOps)
        return fail(ncclInvalidArgument,
                    "ncclRedOpDestroy: operator %d is a built-in operator, not one of "
                    "ncclRedOpCreatePreMulSum",
                    (int)op);
    colld_status_t st = colld_redop_destroy(comm->c, (colld_redop_t)op);
    return st == COLLD_OK ? ncclSuccess : fail_comm("ncclRedOpDestroy", st, comm);
}

/* ============================================================================================
 * Collectives
 * ========================================================================================== */

/* NCCL's data type as colld's; -1 for none. */
static int dtype_of(ncclDataType_t t)
{
    static const colld_dtype_t map[ncclNumTypes] = {
        [ncclInt8] = COLLD_INT8,         [ncclUint8] = COLLD_UINT8,     [ncclInt32] = COLLD_INT32,
        [ncclUint32] = COLLD_UINT32,     [ncclInt64] = COLLD_INT64,     [ncclUint64] = COLLD_UINT64,
        [ncclFloat16] = COLLD_FLOAT16,   [ncclFloat32] = COLLD_FLOAT32, [ncclFloat64] = COLLD_FLOAT64,
        [ncclBfloat16] = COLLD_BFLOAT16,
    };
    return (unsigned)t < ncclNumTypes ? (int)map[t] : -1;
}

/* NCCL's reduction operator as colld's: the built-in ones mapped, any other value passed on as it
 * is (an operator of ncclRedOpCreatePreMulSum is colld's own value; libcolld refuses an unknown
 * one, another communicator's, a destroyed one or one of another data type, saying which). */
static colld_redop_t op_of(ncclRedOp_t op)
{
    static const colld_redop_t map[ncclNumOps] = {
        [ncclSum] = COLLD_SUM, [ncclProd] = COLLD_PROD, [ncclMax] = COLLD_MAX,
        [ncclMin] = COLLD_MIN, [ncclAvg] = COLLD_AVG,
    };
    return (unsigned)op < ncclNumOps ? map[op] : (colld_redop_t)op;
}

/* Whether p is device memory (a CUDA driver loaded in the process and p one of its pointers). */
static bool on_device(colld_client_t *c, const void *p)
{
    return p && colld__gpu_maybe_device(c) && colld__gpu_is_device(c, p);
}

/* Whether a collective's buffers are host memory (colld then takes no stream). */
static bool host_buffers(const ncclComm_t comm, const void *send, const void *recv)
{
    colld_client_t *c = comm->client;
    return !on_device(c, send) && !on_device(c, recv);
}

/* The arguments common to every collective, checked; *dt set, and *op when asked (colld's op, which
 * libcolld checks when the collective is called). */
static ncclResult_t check_args(const char *what, ncclComm_t comm, ncclDataType_t datatype, int *dt, ncclRedOp_t op_in,
                               int *op)
{
    ncclResult_t res = check_comm(what, comm);
    if (res != ncclSuccess)
        return res;
    if ((*dt = dtype_of(datatype)) < 0)
        return fail(ncclInvalidArgument, "%s: unknown data type %d", what, (int)datatype);
    if (op && (*op = (int)op_of(op_in)) < 0) /* NCCL's operators are never negative */
        return fail(ncclInvalidArgument, "%s: unknown reduction operator %d", what, (int)op_in);
    return ncclSuccess;
}

/* After a collective was issued: for host buffers (stream ignored), wait for it, here or at the
 * end of the group. */
static ncclResult_t issued(const char *what, colld_status_t st, ncclComm_t comm, bool host)
{
    if (st != COLLD_OK)
        return fail_comm(what, st, comm);
    if (!host)
        return ncclSuccess;
    if (group.depth > 0) {
        for (int i = 0; i < group.nhost; i++)
            if (group.host[i] == comm)
                return ncclSuccess;
        if (group.nhost >= GROUP_MAX_HOST)
            return fail(ncclInvalidUsage, "%s: host collectives of more than %d communicators in one group", what,
                        GROUP_MAX_HOST);
        group.host[group.nhost++] = comm;
        return ncclSuccess;
    }
    st = colld_comm_synchronize(comm->c);
    return st == COLLD_OK ? ncclSuccess : fail_comm(what, st, comm);
}

/* The stream colld gets: none for host buffers. */
static void *stream_for(bool host, cudaStream_t stream)
{
    return host ? NULL : (void *)stream;
}

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    int dt, cop;
    ncclResult_t res = check_args("ncclAllReduce", comm, datatype, &dt, op, &cop);
    if (res != ncclSuccess)
        return res;
    bool host = host_buffers(comm, sendbuff, recvbuff);
    colld_status_t st = colld_allreduce(sendbuff, recvbuff, count, (colld_dtype_t)dt, (colld_redop_t)cop, comm->c,
                                        stream_for(host, stream));
    return issued("ncclAllReduce", st, comm, host);
}

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                                  ncclComm_t comm, cudaStream_t stream)
{
    int dt;
    ncclResult_t res = check_args("ncclBroadcast", comm, datatype, &dt, ncclSum, NULL);
    if (res != ncclSuccess)
        return res;
    bool host = host_buffers(comm, sendbuff, recvbuff);
    colld_status_t st = colld_broadcast(sendbuff, recvbuff, count, (colld_dtype_t)dt, root, comm->c,
                                        stream_for(host, stream));
    return issued("ncclBroadcast", st, comm, host);
}

EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                              cudaStream_t stream)
{
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    int dt, cop;
    ncclResult_t res = check_args("ncclReduce", comm, datatype, &dt, op, &cop);
    if (res != ncclSuccess)
        return res;
    bool host = host_buffers(comm, sendbuff, recvbuff);
    colld_status_t st = colld_reduce(sendbuff, recvbuff, count, (colld_dtype_t)dt, (colld_redop_t)cop, root, comm->c,
                                     stream_for(host, stream));
    return issued("ncclReduce", st, comm, host);
}

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream)
{
    int dt;
    ncclResult_t res = check_args("ncclAllGather", comm, datatype, &dt, ncclSum, NULL);
    if (res != ncclSuccess)
        return res;
    bool host = host_buffers(comm, sendbuff, recvbuff);
    colld_status_t st = colld_allgather(sendbuff, recvbuff, sendcount, (colld_dtype_t)dt, comm->c,
                                        stream_for(host, stream));
    return issued("ncclAllGather", st, comm, host);
}

/* NCCL 2.28's all-to-all: colld_alltoall (block j of sendbuff to rank j; no in-place form). */
EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclComm_t comm, cudaStream_t stream)
{
    int dt;
    ncclResult_t res = check_args("ncclAlltoAll", comm, datatype, &dt, ncclSum, NULL);
    if (res != ncclSuccess)
        return res;
    bool host = host_buffers(comm, sendbuff, recvbuff);
    colld_status_t st = colld_alltoall(sendbuff, recvbuff, count, (colld_dtype_t)dt, comm->c, stream_for(host, stream));
    return issued("ncclAlltoAll", st, comm, host);
}

EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    int dt, cop;
    ncclResult_t res = check_args("ncclReduceScatter", comm, datatype, &dt, op, &cop);
    if (res != ncclSuccess)
        return res;
    bool host = host_buffers(comm, sendbuff, recvbuff);
    colld_status_t st = colld_reducescatter(sendbuff, recvbuff, recvcount, (colld_dtype_t)dt, (colld_redop_t)cop,
                                            comm->c, stream_for(host, stream));
    return issued("ncclReduceScatter", st, comm, host);
}

/* Point-to-point: colld_send / colld_recv. Host buffers complete before the call returns (or at
 * ncclGroupEnd), so, as with NCCL's blocking semantics, two ranks that send to each other must
 * put their sends and receives in one group. */
EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                             cudaStream_t stream)
{
    int dt;
    ncclResult_t res = check_args("ncclSend", comm, datatype, &dt, ncclSum, NULL);
    if (res != ncclSuccess)
        return res;
    bool host = host_buffers(comm, sendbuff, NULL);
    colld_status_t st = colld_send(sendbuff, count, (colld_dtype_t)dt, peer, comm->c, stream_for(host, stream));
    return issued("ncclSend", st, comm, host);
}

EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                             cudaStream_t stream)
{
    int dt;
    ncclResult_t res = check_args("ncclRecv", comm, datatype, &dt, ncclSum, NULL);
    if (res != ncclSuccess)
        return res;
    bool host = host_buffers(comm, NULL, recvbuff);
    colld_status_t st = colld_recv(recvbuff, count, (colld_dtype_t)dt, peer, comm->c, stream_for(host, stream));
    return issued("ncclRecv", st, comm, host);
}

/* ============================================================================================
 * Groups
 * ========================================================================================== */

EXPORT ncclResult_t ncclGroupStart(void)
{
    if (group.depth++ == 0)
        group.error = ncclSuccess;
    colld_status_t st = colld_group_start();
    return st == COLLD_OK ? ncclSuccess : fail(to_nccl(st), "ncclGroupStart: %s", colld_status_name(st));
}

/* The group's deferred inits, each on a thread of its own; the first failure. The handle of an
 * init that failed stays valid and uninitialised (every call on it but ncclCommDestroy and
 * ncclCommAbort, which release it, is ncclInvalidUsage). */
static ncclResult_t run_inits(void)
{
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < group.ninits; i++) {
        pending_init_t *p = &group.inits[i];
        p->started = pthread_create(&p->thread, NULL, join_thread, p) == 0;
        if (!p->started) {
            p->status = COLLD_ERR_SYSTEM;
            snprintf(p->detail, sizeof(p->detail), "cannot start a thread for it");
        }
    }
    for (int i = 0; i < group.ninits; i++) {
        pending_init_t *p = &group.inits[i];
        if (p->started)
            pthread_join(p->thread, NULL);
        if (p->status != COLLD_OK && res == ncclSuccess)
            res = fail(to_nccl(p->status), "ncclCommInitRank (in a group): rank %d of %d: %s: %s", p->comm->rank,
                       p->comm->nranks, colld_status_name(p->status), p->detail);
    }
    free(group.inits);
    group.inits = NULL;
    group.ninits = 0;
    return res;
}

EXPORT ncclResult_t ncclGroupEnd(void)
{
    if (group.depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    colld_status_t st = colld_group_end();
    if (--group.depth > 0)
        return st == COLLD_OK ? ncclSuccess : fail(to_nccl(st), "ncclGroupEnd: %s", colld_status_name(st));
    ncclResult_t res = group.error;
    if (group.ninits > 0) {
        ncclResult_t r = run_inits();
        res = res != ncclSuccess ? res : r;
    }
    if (st != COLLD_OK && res == ncclSuccess)
        res = fail(to_nccl(st), "ncclGroupEnd: %s: a collective of the group could not be started",
                   colld_status_name(st));
    for (int i = 0; i < group.nhost; i++) { /* the group's host collectives have completed */
        colld_status_t s = colld_comm_synchronize(group.host[i]->c);
        if (s != COLLD_OK && res == ncclSuccess)
            res = fail_comm("ncclGroupEnd", s, group.host[i]);
    }
    group.nhost = 0;
    group.error = ncclSuccess;
    return res;
}

/* NCCL 2.22: end the group as ncclGroupEnd would, but run nothing, and report NCCL's estimate of
 * the time the group would take. colld has no cost model of its own to estimate with, so the
 * outermost level ends the group with none of its collectives, sends or receives started (libcolld
 * discards a failed group whole and leaves its communicators as they were: colld__group_fail) and
 * fails with ncclInvalidUsage; the group's deferred inits run (other processes' ranks wait for
 * them). An inner level only closes that level, as with NCCL. */
EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    if (!simInfo || simInfo->size < offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float) ||
        simInfo->magic != 0x74685283)
        return fail(ncclInvalidArgument,
                    "ncclGroupSimulateEnd: simInfo is NULL or not initialised with NCCL_SIM_INFO_INITIALIZER");
    if (group.depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupSimulateEnd without ncclGroupStart");
    if (group.depth > 1)
        return ncclGroupEnd();
    colld__group_fail(COLLD_ERR_NOT_SUPPORTED); /* colld_group_end starts nothing */
    colld_group_end();
    group.depth = 0;
    ncclResult_t res = group.ninits > 0 ? run_inits() : ncclSuccess;
    group.nhost = 0;
    group.error = ncclSuccess;
    if (res != ncclSuccess)
        return res;
    return fail(ncclInvalidUsage,
                "ncclGroupSimulateEnd: colld cannot estimate a group's time (it has no cost model); the group has "
                "ended and none of its operations ran (its communicators are as they were)");
}
