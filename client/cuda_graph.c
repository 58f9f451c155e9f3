/*
 * cuda_graph.c - collectives captured into CUDA graphs (issue 15 item 3): each becomes a
 * persistent plan of its communicator in the daemon, run once per replay of the graph.
 *
 * A collective called on a stream that is being captured (cuda.c prepares it as any stream-ordered
 * collective, its registrations made outside the capture) is posted here:
 *   1. It takes a free plan line of the session's GPU flag area (the daemon's
 *      --max-plans-per-session of them; COLLD_ERR_QUOTA_EXCEEDED when none is left) and resets it.
 *   2. Its registration descriptor (COLLD_SQE_STREAM | COLLD_SQE_PLAN, the line in `reserved`) is
 *      numbered and posted like any collective, and the call waits for its completion: every rank
 *      must capture the same collective (else COLLD_ERR_MISMATCH, the communicator broken as for
 *      any mismatch), within the communicator's timeout. Until then nothing is enqueued, so any
 *      error leaves the application's capture as it was.
 *   3. A CUDA user object, owned by the graph being captured (cuGraphRetainUserObject with
 *      CU_GRAPH_USER_OBJECT_MOVE), ties the plan's life to the graph and to every executable graph
 *      made from it: its destructor runs once all of them are destroyed and their launches done.
 *   4. The capture gets three stream memory operations with fixed values (proto/wire.h,
 *      "Persistent plans"): ready = 1, wait done == 1, done = 0.
 *
 * The destructor runs on a thread of the driver, which must not call CUDA and should not block:
 * it only queues the line for the keeper, a thread of libcolld (one per process, while plans or
 * their flag areas exist), which tells the daemon (COLLD_MSG_PLAN_FREE) and frees the line. The
 * keeper also releases the replays itself when the daemon is gone (or the client disconnected
 * while graphs still hold its plans): every ready = 1 of a live plan line is taken and answered
 * with status, then done = 1, so no graph replay waits forever; and after a disconnect it keeps
 * the flag area mapped and registered until the last such graph is gone. Plan lines outlive their
 * client for that reason, and so live in the keeper, not in the client.
 *
 * Locking: keeper.mu guards every field below; no CUDA call and no socket exchange is made with
 * it held.
 */
#include "client/client_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef COLLD_HAVE_CUDA

#include "client/cuda_internal.h"

/* How long a capture waits for a free plan line when none is (the destructor of a graph just
 * destroyed runs a little later, on the driver's thread, and a graph's executable graphs hold its
 * user object until their last launch has finished), and how often the keeper looks at plan lines
 * whose replays it releases itself. */
#define LINE_WAIT_NS 1000000000ull
/* The keeper's look at lines it releases itself: every RELEASE_PERIOD_NS while replays arrive,
 * doubling up to RELEASE_PERIOD_MAX_NS while none does (graphs kept until the process exits must
 * not cost 5000 wake-ups a second). */
#define RELEASE_PERIOD_NS 200000L
#define RELEASE_PERIOD_MAX_NS 10000000L

typedef struct gclient gclient_t;

/* A captured collective: the user object's pointer. */
typedef struct plan_rec {
    gclient_t *gc;
    uint32_t line;
    bool daemon_freed;          /* the daemon was told already (the capture failed part-way) */
    struct plan_rec *next_dead; /* keeper.dead */
} plan_rec_t;

/* The plan lines of one client's flag area; they outlive the client while graphs hold them. */
struct gclient {
    colld_client_t *c; /* NULL once it disconnected */
    plan_rec_t **line; /* [plans]: the plan on each line, NULL when free */
    uint32_t plans;
    unsigned nlive; /* lines held */
    unsigned busy;  /* the keeper is in an exchange with c's daemon */
    bool release;   /* libcolld releases the replays itself (daemon lost, or disconnected) */
    colld_status_t release_status;
    colld_wire_gpu_plan_t *plan0; /* host address of plan line 0 */
    void *area;                   /* adopted at disconnect: unregistered (in ctx) and unmapped with the last plan */
    size_t area_size;
    void *area_ctx;
    gclient_t *next;
};

/* The keeper of the process: the state that the graphs' destructors reach (they get one pointer
 * and may run after the client is gone), and its thread. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the keeper's work, a line freed, an exchange over */
    gclient_t *clients;
    plan_rec_t *dead; /* lines whose graphs are gone */
    bool running;
} keeper = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

/* ============================================================================================
 * The keeper
 * ========================================================================================== */

/* The user object's destructor (a driver thread: no CUDA call, nothing that blocks for long). */
static void plan_destroyed(void *arg)
{
    plan_rec_t *rec = arg;
    pthread_mutex_lock(&keeper.mu);
    rec->next_dead = keeper.dead;
    keeper.dead = rec;
    pthread_cond_broadcast(&keeper.cv);
    pthread_mutex_unlock(&keeper.mu);
}

/* Tell the daemon that a plan line's graph is gone (it frees the rank's part of the plan). */
static colld_status_t plan_free_msg(colld_client_t *c, uint32_t line)
{
    colld_wire_msg_t m, rep;
    memset(&m, 0, sizeof(m));
    memset(&rep, 0, sizeof(rep));
    m.type = COLLD_MSG_PLAN_FREE;
    m.u.plan_free.line = line;
    colld_status_t st = colld__sock_request(c, &m, -1, COLLD_MSG_PLAN_FREE_REPLY, &rep, NULL, 0);
    char detail[COLLD_WIRE_DETAIL_BYTES];
    if (st == COLLD_OK && (st = colld__reply_status(&rep, detail)) != COLLD_OK)
        LOG_WARN(GPU, "freeing plan line %u: colld answered %s: %s", line, colld_status_name(st), detail);
    return st;
}

/* A line is free again (keeper.mu held). */
static void line_put(plan_rec_t *rec)
{
    gclient_t *gc = rec->gc;
    gc->line[rec->line] = NULL;
    gc->nlive--;
    free(rec);
    pthread_cond_broadcast(&keeper.cv);
}

/* Release every replay that reached a live plan line of gc (keeper.mu held). */
static int release_lines(gclient_t *gc)
{
    int released = 0;
    for (uint32_t i = 0; i < gc->plans; i++) {
        colld_wire_gpu_plan_t *l = &gc->plan0[i];
        if (!gc->line[i] || __atomic_load_n(&l->ready, __ATOMIC_ACQUIRE) != 1)
            continue;
        __atomic_store_n(&l->ready, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&l->status, (int32_t)gc->release_status, __ATOMIC_RELAXED);
        __atomic_store_n(&l->done, 1, __ATOMIC_SEQ_CST);
        released++;
    }
    return released;
}

/* Unregister and unmap a flag area adopted at disconnect (keeper.mu NOT held). */
static void area_free(gclient_t *gc)
{
    if (gc->area)
        flags_unmap(colld_cu_load(NULL, 0), gc->area, gc->area_size, (CUcontext)gc->area_ctx);
}

/* One pass: the lines of destroyed graphs, the replays released here, the clients whose plans are
 * all gone. Returns whether some client's replays are released here, and *released whether this
 * pass released one (keeper.mu held; dropped around exchanges and CUDA calls). */
static bool keeper_pass(bool *released)
{
    plan_rec_t *rec;
    while ((rec = keeper.dead)) {
        keeper.dead = rec->next_dead;
        gclient_t *gc = rec->gc;
        if (gc->c && !gc->release && !rec->daemon_freed) {
            colld_client_t *c = gc->c;
            gc->busy++;
            pthread_mutex_unlock(&keeper.mu);
            (void)plan_free_msg(c, rec->line);
            pthread_mutex_lock(&keeper.mu);
            gc->busy--;
        }
        line_put(rec);
    }
    bool releasing = false;
    for (gclient_t **pp = &keeper.clients; *pp;) {
        gclient_t *gc = *pp;
        if (gc->release && gc->nlive) {
            *released |= release_lines(gc) > 0;
            releasing = true;
        }
        if (gc->c || gc->nlive) {
            pp = &gc->next;
            continue;
        }
        /* Disconnected, and its last graph is gone. Only the keeper unlinks clients, and only
         * at the head do others insert: *pp is still right after the lock is dropped. */
        *pp = gc->next;
        pthread_mutex_unlock(&keeper.mu);
        area_free(gc);
        free(gc->line);
        free(gc);
        pthread_mutex_lock(&keeper.mu);
    }
    return releasing;
}

static void *keeper_main(void *arg)
{
    (void)arg;
    long period = RELEASE_PERIOD_NS;
    pthread_mutex_lock(&keeper.mu);
    for (;;) {
        bool released = false;
        bool releasing = keeper_pass(&released);
        period = released ? RELEASE_PERIOD_NS : COLLD_MIN(2 * period, RELEASE_PERIOD_MAX_NS);
        if (keeper.dead)
            continue;
        if (!keeper.clients) {
            keeper.running = false;
            break;
        }
        if (releasing) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += period;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&keeper.cv, &keeper.mu, &ts);
        } else {
            pthread_cond_wait(&keeper.cv, &keeper.mu);
        }
    }
    pthread_mutex_unlock(&keeper.mu);
    return NULL;
}

/* The plan lines of client c, made at its first capture; the keeper runs while any exist. */
static colld_status_t gclient_get(colld_client_t *c, const colld_gpu_area_t *area, gclient_t **out, colld_err_t *err)
{
    colld_status_t st = COLLD_OK;
    pthread_mutex_lock(&keeper.mu);
    gclient_t *gc = keeper.clients;
    bool made = false;
    while (gc && gc->c != c)
        gc = gc->next;
    if (!gc) {
        made = true;
        gc = calloc(1, sizeof(*gc));
        plan_rec_t **line = calloc(area->plans, sizeof(*line));
        if (!gc || !line) {
            free(gc);
            free(line);
            st = colld_err_set(err, COLLD_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
        *gc = (gclient_t){ .c = c,
                           .line = line,
                           .plans = area->plans,
                           .plan0 = (colld_wire_gpu_plan_t *)((char *)area->base +
                                                              (size_t)area->lines * sizeof(colld_wire_gpu_flag_t)),
                           .next = keeper.clients };
        keeper.clients = gc;
    }
    if (!keeper.running) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, keeper_main, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            st = colld_err_set(err, COLLD_ERR_SYSTEM,
                               "cannot start libcolld's thread for CUDA graph plans (%s): the collective was not "
                               "captured",
                               strerror(rc));
            if (made) { /* still the head: clients are added only under keeper.mu, held since */
                keeper.clients = gc->next;
                free(gc->line);
                free(gc);
            }
            goto out;
        }
        pthread_setname_np(t, "colld-graphs");
        keeper.running = true;
    }
    *out = gc;
out:
    pthread_mutex_unlock(&keeper.mu);
    return st;
}

/* A free plan line of gc (waiting a moment for the lines of graphs just destroyed), or
 * COLLD_ERR_QUOTA_EXCEEDED. */
static colld_status_t line_get(gclient_t *gc, plan_rec_t **out, colld_err_t *err)
{
    colld_status_t st = COLLD_OK;
    plan_rec_t *rec = calloc(1, sizeof(*rec));
    if (!rec)
        return colld_err_set(err, COLLD_ERR_NO_MEMORY, "out of memory");
    uint64_t until = colld_now_ns() + LINE_WAIT_NS;
    pthread_mutex_lock(&keeper.mu);
    for (;;) {
        uint32_t i = 0;
        while (i < gc->plans && gc->line[i])
            i++;
        if (i < gc->plans) {
            *rec = (plan_rec_t){ .gc = gc, .line = i };
            gc->line[i] = rec;
            gc->nlive++;
            *out = rec;
            rec = NULL;
            break;
        }
        if (colld_now_ns() >= until) {
            st = colld_err_set(err, COLLD_ERR_QUOTA_EXCEEDED,
                               "this process already holds %u collectives captured into CUDA graphs (colld's "
                               "--max-plans-per-session): the collective was not captured (nothing was enqueued); "
                               "destroy the graphs that hold captured collectives (a plan goes once its graph and "
                               "every executable graph made from it are destroyed), or raise the limit",
                               gc->plans);
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&keeper.cv, &keeper.mu, &ts);
    }
    pthread_mutex_unlock(&keeper.mu);
    free(rec);
    return st;
}

/* A line taken by a capture that failed before a graph held it. */
static void line_abandon(plan_rec_t *rec)
{
    pthread_mutex_lock(&keeper.mu);
    line_put(rec);
    pthread_mutex_unlock(&keeper.mu);
}

void colld__graph_daemon_lost(colld_client_t *c)
{
    pthread_mutex_lock(&keeper.mu);
    for (gclient_t *gc = keeper.clients; gc; gc = gc->next)
        if (gc->c == c && !gc->release) {
            gc->release = true;
            gc->release_status = COLLD_ERR_DAEMON_LOST;
            if (gc->nlive)
                LOG_WARN(GPU,
                         "the replays of %u collective(s) captured into CUDA graphs are released with "
                         "COLLD_ERR_DAEMON_LOST from now on, without running",
                         gc->nlive);
        }
    pthread_cond_broadcast(&keeper.cv);
    pthread_mutex_unlock(&keeper.mu);
}

bool colld__graph_client_free(colld_client_t *c, void *area, size_t size, void *ctx)
{
    pthread_mutex_lock(&keeper.mu);
    gclient_t *gc = keeper.clients;
    while (gc && gc->c != c)
        gc = gc->next;
    if (!gc) {
        pthread_mutex_unlock(&keeper.mu);
        return false;
    }
    while (gc->busy) /* an exchange of the keeper with this client's daemon */
        pthread_cond_wait(&keeper.cv, &keeper.mu);
    gc->c = NULL;
    unsigned held = gc->nlive;
    if (held && !gc->release) {
        gc->release = true;
        gc->release_status = COLLD_ERR_ABORTED;
    }
    if (held && area) {
        gc->area = area;
        gc->area_size = size;
        gc->area_ctx = ctx;
    }
    pthread_cond_broadcast(&keeper.cv); /* the keeper frees gc once no graph holds its lines */
    pthread_mutex_unlock(&keeper.mu);
    if (held)
        LOG_WARN(GPU,
                 "colld_disconnect while %u CUDA graph(s) still hold collectives captured on this client: their "
                 "replays are released without running them (COLLD_ERR_ABORTED); destroy such graphs first",
                 held);
    return held && area;
}

/* ============================================================================================
 * Capturing a collective
 * ========================================================================================== */

/* Record st for a failed CUDA call of the capture. */
static colld_status_t graph_cu_fail(const colld_cu_t *cu, colld_err_t *err, CUresult r, const char *what,
                                    const char *then)
{
    char desc[160];
    return colld_err_set(err, COLLD_ERR_DEVICE, "capturing the collective into a CUDA graph: %s: %s; %s", what,
                         colld_cu_describe(cu, r, desc, sizeof(desc)), then);
}

/* Enqueue the plan's three memory operations into the capture (proto/wire.h): ready = 1, wait
 * done == 1, done = 0. Returns the first failure, with *what naming the call. */
static CUresult enqueue_nodes(const colld_cu_t *cu, const colld_gpu_op_t *op, CUdeviceptr line, const char **what)
{
    bool pushed;
    CUresult r = ctx_enter(cu, (CUcontext)op->ctx, &pushed);
    *what = "making the stream's context current";
    CUstream s = (CUstream)op->stream;
    unsigned wait = (unsigned)CU_STREAM_WAIT_VALUE_EQ | (op->wait_flags & (unsigned)CU_STREAM_WAIT_VALUE_FLUSH);
    if (r == CUDA_SUCCESS) {
        *what = "cuStreamWriteValue32 (ready = 1)";
        r = CU_CHECK(cu, cuStreamWriteValue32, s, line + offsetof(colld_wire_gpu_plan_t, ready), 1,
                     CU_STREAM_WRITE_VALUE_DEFAULT);
    }
    if (r == CUDA_SUCCESS) {
        *what = "cuStreamWaitValue32 (done == 1)";
        r = CU_CHECK(cu, cuStreamWaitValue32, s, line + offsetof(colld_wire_gpu_plan_t, done), 1, wait);
    }
    if (r == CUDA_SUCCESS) {
        *what = "cuStreamWriteValue32 (done = 0)";
        r = CU_CHECK(cu, cuStreamWriteValue32, s, line + offsetof(colld_wire_gpu_plan_t, done), 0,
                     CU_STREAM_WRITE_VALUE_DEFAULT);
    }
    ctx_leave(cu, pushed);
    return r;
}

/* The daemon will not hear of plan line rec from the keeper (it is told here). */
static void daemon_told(plan_rec_t *rec)
{
    pthread_mutex_lock(&keeper.mu);
    rec->daemon_freed = true;
    pthread_mutex_unlock(&keeper.mu);
}

colld_status_t colld__graph_post(colld_comm_t *comm, const colld_gpu_area_t *area, const colld_wire_sqe_t *sqe,
                                 const colld_gpu_op_t *op, colld_err_t *err)
{
    colld_client_t *c = comm->client;
    const colld_cu_t *cu = colld_cu_load(NULL, 0);
    gclient_t *gc = NULL;
    plan_rec_t *rec = NULL;
    colld_status_t st;
    if (!cu)
        return colld_err_set(err, COLLD_ERR_INTERNAL, "captured collective posted without preparation");
    if (area->plans == 0)
        return colld_err_set(err, COLLD_ERR_NOT_SUPPORTED,
                             "colld offers no plan lines for collectives captured into CUDA graphs (an older daemon?): "
                             "the collective was not captured (nothing was enqueued)");
    if ((st = gclient_get(c, area, &gc, err)) != COLLD_OK || (st = line_get(gc, &rec, err)) != COLLD_OK)
        return st;
    /* What a failure undoes: the line, until a graph holds it (its destructor frees it then); the
     * daemon's plan, once it holds one, until the capture holds the plan's operations. */
    bool abandon = true, tell_daemon = false;
    uint32_t line = rec->line;
    colld_wire_gpu_plan_t *l = &gc->plan0[line];
    /* No graph holds the line and the daemon watches it no more: it starts clean. */
    __atomic_store_n(&l->status, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&l->done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&l->ready, 0, __ATOMIC_SEQ_CST);

    /* 1. The plan, registered: numbered and posted like an engine collective (engine_path.c),
     * matched like one; wait until every rank has it. A registration that fails lets its line's
     * reservation in the daemon go. */
    colld_wire_sqe_t d = *sqe;
    d.flags |= COLLD_SQE_STREAM | COLLD_SQE_PLAN;
    d.reserved = line;
    if ((st = colld__engine_post(comm, &d, NULL, err)) != COLLD_OK)
        goto out;
    uint64_t seq = comm->seq;
    if ((st = colld__ring_wait_op(c, comm, seq, true)) != COLLD_OK) {
        char detail[COLLD_CLIENT_DETAIL_LEN];
        colld__comm_fail_async(comm, st);
        comm->detail_fetched = false; /* the daemon's detail of this failure, not an earlier one's */
        snprintf(detail, sizeof(detail), "%s", colld_comm_last_error(comm));
        st = colld_err_set(err, st,
                           "the collective could not be captured into the CUDA graph (nothing was enqueued, the "
                           "capture is as it was): %s",
                           detail);
        goto out;
    }
    tell_daemon = true;

    /* 2. The plan lives as long as the graph and its executable graphs. */
    CUuserObject obj;
    CUresult r = CU_CHECK(cu, cuUserObjectCreate, &obj, rec, plan_destroyed, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
    if (r != CUDA_SUCCESS) {
        st = graph_cu_fail(cu, err, r, "cuUserObjectCreate", "nothing was enqueued");
        goto out;
    }
    if ((r = CU_CHECK(cu, cuGraphRetainUserObject, (CUgraph)op->graph, obj, 1, CU_GRAPH_USER_OBJECT_MOVE)) !=
        CUDA_SUCCESS) {
        daemon_told(rec);
        abandon = false;
        CU_CHECK(cu, cuUserObjectRelease, obj, 1); /* its destructor frees the line */
        st = graph_cu_fail(cu, err, r, "cuGraphRetainUserObject", "nothing was enqueued");
        goto out;
    }
    abandon = false; /* the graph holds the line now */

    /* 3. Its three memory operations, into the capture. Should one fail, part of the plan may be
     * in the capture: the daemon drops this rank's part (its peers' replays are released with an
     * error), and the line stays with the graph until the graph goes. */
    const char *what;
    CUdeviceptr dline = (CUdeviceptr)(area->dptr + (uint64_t)area->lines * sizeof(colld_wire_gpu_flag_t) +
                                      (uint64_t)line * sizeof(colld_wire_gpu_plan_t));
    if ((r = enqueue_nodes(cu, op, dline, &what)) != CUDA_SUCCESS) {
        daemon_told(rec);
        st = graph_cu_fail(cu, err, r, what,
                           "the capture may hold part of the collective: end it and destroy its graph");
        goto out;
    }
    tell_daemon = false;
    st = COLLD_OK;
    LOG_DEBUG(GPU, "communicator %llu: collective #%llu captured into a CUDA graph (plan line %u)",
              (unsigned long long)comm->comm_id, (unsigned long long)seq, line);
out:
    if (tell_daemon)
        (void)plan_free_msg(c, line);
    if (abandon)
        line_abandon(rec);
    return st;
}

#else /* COLLD_HAVE_CUDA */

/* Without CUDA support nothing is ever captured (cuda.c refuses every stream). */
void colld__graph_daemon_lost(colld_client_t *c)
{
    (void)c;
}

bool colld__graph_client_free(colld_client_t *c, void *area, size_t size, void *ctx)
{
    (void)c, (void)area, (void)size, (void)ctx;
    return false;
}

#endif /* COLLD_HAVE_CUDA */
