/*
 * graph.c - stream capture, CUDA graphs and user objects in the CUDA driver test double.
 *
 * Capture (cuStreamBeginCapture .. cuStreamEndCapture) records the work enqueued on the capturing
 * stream, and on every stream that forked from it (cuStreamWaitEvent on an event recorded in the
 * capture), as graph nodes instead of running it. The node kinds are those colld can enqueue:
 * kernels, stream memory operations, host functions, external event records
 * (cuEventRecordWithFlags(CU_EVENT_RECORD_EXTERNAL)) and external event waits
 * (cuStreamWaitEvent(CU_EVENT_WAIT_EXTERNAL)). A plain event record inside a capture adds no node:
 * it marks a point another stream can fork from or join at. Nodes keep the order in which they
 * were captured, which is a topological order of the graph; a launch runs them one after another,
 * in that order, on the launching stream (the double does not run a graph's branches
 * concurrently: a graph whose branches wait on each other with memory operations would hang here).
 *
 * What capture refuses, as the driver does: the legacy stream cannot capture; work on it while a
 * blocking stream of its context captures invalidates that capture
 * (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT); synchronizing or querying a capturing stream, and the
 * "potentially unsafe" calls (cuMemAlloc, cuMemFree, cuMemHostRegister/Unregister, the
 * synchronous copies and memset, cuCtxSynchronize) fail with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 * and invalidate the captures they conflict with, by the calling thread's capture interaction
 * mode (cuThreadExchangeStreamCaptureMode, cuda.h): in GLOBAL mode (the default) while the thread
 * has its own capture that was not begun RELAXED, or while any other thread has a GLOBAL capture;
 * in THREAD_LOCAL mode only for its own capture; in RELAXED mode never; waiting on an event recorded
 * outside the capture without CU_EVENT_WAIT_EXTERNAL is CUDA_ERROR_STREAM_CAPTURE_ISOLATION; a
 * capture whose forked streams did not join back fails at its end (UNJOINED), ended on another
 * stream (UNMATCHED) or thread (WRONG_THREAD, except relaxed mode); an invalidated capture ends
 * with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no graph.
 *
 * An executable graph's launches are ordered after the work before them on the stream and after
 * the previous launch of the same graph. User objects: their destructors run on a thread of the
 * double once their last reference is released, references held by a graph or an executable
 * graph included (those of an executable graph are released once its last launch has finished).
 * A destructor that calls the driver gets CUDA_ERROR_NOT_PERMITTED (cuda.h: "Destructor callbacks
 * cannot make CUDA API calls").
 */
#include "tests/cudafake/fake.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARTS 64

typedef struct {
    void *ptr;
    CUhostFn destroy;
    unsigned refs;
} uobj_t;

typedef struct {
    uobj_t *o;
    unsigned count;
} uref_t;

struct fk_graph {
    fk_op_t **nodes;
    int n, cap;
    uref_t *refs;
    int nrefs;
    bool capturing; /* still being captured into */
};

struct fk_exec {
    fk_op_t **nodes;
    int n;
    uref_t *refs;
    int nrefs;
    int pending;       /* launches not finished */
    bool handle_live;
    fk_stream_t *last_s; /* the last launch */
    uint64_t last_seq;
};

typedef struct {
    fk_stream_t *s;
    int nodes;
    fk_op_t *last;
    bool joined_back;
    CUgraphNode dep[1];
    CUgraphEdgeData edge[1];
} part_t;

struct fk_capture {
    fk_capture_t *next;
    uint64_t id;
    fk_graph_t *graph;
    CUstreamCaptureMode mode;
    pthread_t thread;
    bool invalid;
    part_t parts[MAX_PARTS];
    int nparts;
};

/* Destructors of user objects waiting for the service thread. */
typedef struct dtor {
    struct dtor *next;
    CUhostFn fn;
    void *ptr;
} dtor_t;

static struct {
    fk_capture_t *live;
    uint64_t next_id;
    dtor_t *dtors, *dtors_tail;
    bool service;
} gs;

/* ============================================================================================
 * User objects (lock held)
 * ========================================================================================== */

/* The service thread: runs user object destructors, in order, outside the lock. */
static void *service(void *arg)
{
    (void)arg;
    fk_in_destructor = true; /* fk_enter refuses every call from here */
    pthread_mutex_lock(&fk.mu);
    for (;;) {
        while (!gs.dtors)
            pthread_cond_wait(&fk.cv, &fk.mu);
        dtor_t *d = gs.dtors;
        gs.dtors = d->next;
        if (!gs.dtors)
            gs.dtors_tail = NULL;
        pthread_mutex_unlock(&fk.mu);
        d->fn(d->ptr);
        free(d);
        pthread_mutex_lock(&fk.mu);
    }
    return NULL;
}

/* Drop n references; at the last one the destructor goes to the service thread (lock held). */
static void uobj_release(uobj_t *o, unsigned n)
{
    o->refs -= n < o->refs ? n : o->refs;
    if (o->refs)
        return;
    fk_handle_del(o);
    dtor_t *d = calloc(1, sizeof(*d));
    if (!gs.service) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        gs.service = pthread_create(&t, &attr, service, NULL) == 0;
        pthread_attr_destroy(&attr);
    }
    if (!d || !gs.service) {
        fk_log("cannot run a user object's destructor (out of memory or threads)");
        free(d);
        free(o);
        return;
    }
    *d = (dtor_t){ .fn = o->destroy, .ptr = o->ptr };
    if (gs.dtors_tail)
        gs.dtors_tail->next = d;
    else
        gs.dtors = d;
    gs.dtors_tail = d;
    free(o);
    pthread_cond_broadcast(&fk.cv);
}

/* Release the references a graph or an executable graph holds (lock held). */
static void refs_release(uref_t *refs, int n)
{
    for (int i = 0; i < n; i++)
        uobj_release(refs[i].o, refs[i].count);
    free(refs);
}

CUresult CUDAAPI cuUserObjectCreate(CUuserObject *object_out, void *ptr, CUhostFn destroy,
                                    unsigned int initialRefcount, unsigned int flags)
{
    FK_BEGIN(cuUserObjectCreate);
    if (!object_out || !destroy || initialRefcount == 0 || flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
        return CUDA_ERROR_INVALID_VALUE;
    uobj_t *o = calloc(1, sizeof(*o));
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *o = (uobj_t){ .ptr = ptr, .destroy = destroy, .refs = initialRefcount };
    pthread_mutex_lock(&fk.mu);
    fk_handle_add(o, FK_K_UOBJ);
    pthread_mutex_unlock(&fk.mu);
    *object_out = (CUuserObject)o;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuUserObjectRetain(CUuserObject object, unsigned int count)
{
    FK_BEGIN(cuUserObjectRetain);
    if (count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_handle_ok(object, FK_K_UOBJ) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS)
        ((uobj_t *)object)->refs += count;
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuUserObjectRelease(CUuserObject object, unsigned int count)
{
    FK_BEGIN(cuUserObjectRelease);
    if (count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    uobj_t *o = (uobj_t *)object;
    CUresult r = fk_handle_ok(o, FK_K_UOBJ) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && count > o->refs) {
        fk_log("cuUserObjectRelease of %u references, but the object has %u (undefined behaviour with the driver)",
               count, o->refs);
        r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS)
        uobj_release(o, count);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* The entry of o among a graph's references, or NULL. */
static uref_t *ref_in(uref_t *refs, int n, const uobj_t *o)
{
    for (int i = 0; i < n; i++)
        if (refs[i].o == o)
            return &refs[i];
    return NULL;
}

CUresult CUDAAPI cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count, unsigned int flags)
{
    FK_BEGIN(cuGraphRetainUserObject);
    if (count == 0 || (flags & ~(unsigned)CU_GRAPH_USER_OBJECT_MOVE))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    fk_graph_t *g = (fk_graph_t *)graph;
    uobj_t *o = (uobj_t *)object;
    CUresult r = fk_handle_ok(g, FK_K_GRAPH) && fk_handle_ok(o, FK_K_UOBJ) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    uref_t *ref = r == CUDA_SUCCESS ? ref_in(g->refs, g->nrefs, o) : NULL;
    if (r == CUDA_SUCCESS && !ref) {
        uref_t *t = realloc(g->refs, (size_t)(g->nrefs + 1) * sizeof(*t));
        if (!t) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            g->refs = t;
            ref = &t[g->nrefs++];
            *ref = (uref_t){ .o = o };
        }
    }
    if (r == CUDA_SUCCESS) {
        ref->count += count;
        if (!(flags & CU_GRAPH_USER_OBJECT_MOVE))
            o->refs += count;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuGraphReleaseUserObject(CUgraph graph, CUuserObject object, unsigned int count)
{
    FK_BEGIN(cuGraphReleaseUserObject);
    if (count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    fk_graph_t *g = (fk_graph_t *)graph;
    uobj_t *o = (uobj_t *)object;
    CUresult r = fk_handle_ok(g, FK_K_GRAPH) && fk_handle_ok(o, FK_K_UOBJ) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    uref_t *ref = r == CUDA_SUCCESS ? ref_in(g->refs, g->nrefs, o) : NULL;
    if (r == CUDA_SUCCESS && (!ref || ref->count < count))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        ref->count -= count;
        uobj_release(o, count);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* ============================================================================================
 * Capture (lock held)
 * ========================================================================================== */

static fk_capture_t *capture_by_id(uint64_t id)
{
    for (fk_capture_t *c = gs.live; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

/* Stream s's part in capture c, or NULL. */
static part_t *part_of(fk_capture_t *c, const fk_stream_t *s)
{
    for (int i = 0; i < c->nparts; i++)
        if (c->parts[i].s == s)
            return &c->parts[i];
    return NULL;
}

/* The part of the stream with this creation number, or NULL. */
static part_t *part_by_id(fk_capture_t *c, uint64_t stream_id)
{
    for (int i = 0; i < c->nparts; i++)
        if (c->parts[i].s->id == stream_id)
            return &c->parts[i];
    return NULL;
}

/* Make s capture into c (the origin, or a stream that forked from it). */
static part_t *join(fk_capture_t *c, fk_stream_t *s)
{
    if (c->nparts == MAX_PARTS)
        return NULL;
    part_t *p = &c->parts[c->nparts++];
    memset(p, 0, sizeof(*p));
    p->s = s;
    s->refs++;
    s->capture = c;
    return p;
}

/* A call not permitted on a capturing stream: invalidate its capture, say why. */
CUresult fk_capture_invalidate(fk_stream_t *s, const char *what)
{
    if (s->capture && !s->capture->invalid) {
        s->capture->invalid = true;
        fk_log("%s: not permitted while capturing; the capture is invalidated", what);
    }
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode). */
static __thread CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    FK_BEGIN(cuThreadExchangeStreamCaptureMode);
    if (!mode || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                  *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode prev = thread_mode;
    thread_mode = *mode;
    *mode = prev;
    return CUDA_SUCCESS;
}

/* May a potentially unsafe call run now? By the calling thread's mode (cuda.h,
 * cuThreadExchangeStreamCaptureMode): GLOBAL, not while this thread has a capture that was not
 * begun RELAXED or another thread has a GLOBAL one; THREAD_LOCAL, only the first; RELAXED, always.
 * The captures it conflicts with are invalidated. */
CUresult fk_capture_unsafe(const char *what)
{
    pthread_t self = pthread_self();
    bool prohibited = false;
    for (fk_capture_t *c = gs.live; c && thread_mode != CU_STREAM_CAPTURE_MODE_RELAXED; c = c->next) {
        bool mine = pthread_equal(c->thread, self);
        if ((mine && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!mine && thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            prohibited = true;
            if (!c->invalid)
                fk_log("%s is a potentially unsafe call while a stream captures (%s mode): it fails and invalidates "
                       "the capture", what, c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL ? "global" : "thread-local");
            c->invalid = true;
        }
    }
    return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* Would work on ctx's legacy stream depend on a capturing blocking stream? Those captures are
 * invalidated. */
bool fk_capture_legacy_conflict(fk_ctx_t *ctx)
{
    bool conflict = false;
    for (fk_capture_t *c = gs.live; c; c = c->next)
        for (int i = 0; i < c->nparts; i++)
            if (c->parts[i].s->ctx == ctx && !(c->parts[i].s->flags & CU_STREAM_NON_BLOCKING)) {
                c->invalid = true;
                conflict = true;
            }
    if (conflict)
        fk_log("the legacy stream was used while a blocking stream of its context captures: the capture is invalidated");
    return conflict;
}

/* Add op to s's capture as a node (takes op). */
CUresult fk_capture_add(fk_stream_t *s, fk_op_t *op)
{
    fk_capture_t *c = s->capture;
    part_t *p = part_of(c, s);
    CUresult r = CUDA_SUCCESS;
    if (c->invalid)
        r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (op->kind == FK_OP_GRAPH || op->kind == FK_OP_COPY || op->kind == FK_OP_SET || !p)
        r = fk_capture_invalidate(s, "this operation (not modelled as a graph node by the double)");
    else if (c->graph->n == FK_MAX_NODES)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS && c->graph->n == c->graph->cap) {
        int n = c->graph->cap ? c->graph->cap * 2 : 16;
        fk_op_t **t = realloc(c->graph->nodes, (size_t)n * sizeof(*t));
        if (!t)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            c->graph->nodes = t;
            c->graph->cap = n;
        }
    }
    if (r != CUDA_SUCCESS) {
        fk_op_free(op);
        return r;
    }
    for (int i = 0; i < op->ndeps; i++)
        fk_stream_unref(op->deps[i].s);
    free(op->deps);
    op->deps = NULL;
    op->ndeps = 0;
    c->graph->nodes[c->graph->n++] = op;
    p->nodes++;
    p->last = op;
    p->joined_back = false;
    return CUDA_SUCCESS;
}

/* A plain event record inside a capture: a point to fork from or join at. */
void fk_capture_record(fk_stream_t *s, fk_event_t *e)
{
    part_t *p = part_of(s->capture, s);
    e->cap_id = s->capture->id;
    e->cap_s_id = s->id;
    e->cap_nodes = p ? p->nodes : 0;
}

/* cuStreamWaitEvent where a capture is involved (forks, joins, merges, external waits);
 * *handled is false when it is an ordinary wait. */
CUresult fk_capture_wait_event(fk_stream_t *s, fk_event_t *e, unsigned flags, bool *handled)
{
    *handled = false;
    if (e->cap_id) {
        fk_capture_t *c = capture_by_id(e->cap_id);
        *handled = true;
        if (!c)
            return CUDA_ERROR_CAPTURED_EVENT; /* recorded in a capture that has ended */
        if (!s->capture) /* a fork: s joins the capture */
            return join(c, s) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        if (s->capture != c) {
            s->capture->invalid = c->invalid = true;
            return CUDA_ERROR_STREAM_CAPTURE_MERGE;
        }
        part_t *from = part_by_id(c, e->cap_s_id);
        if (from && from->s != s && from->nodes == e->cap_nodes)
            from->joined_back = true; /* a join: everything `from` captured is before s now */
        return CUDA_SUCCESS;
    }
    if (!s->capture)
        return CUDA_SUCCESS;
    *handled = true;
    if (!(flags & CU_EVENT_WAIT_EXTERNAL)) {
        s->capture->invalid = true;
        fk_log("cuStreamWaitEvent in a capture on an event recorded outside it, without CU_EVENT_WAIT_EXTERNAL");
        return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    fk_op_t *op = fk_op_new(FK_OP_WAITEV);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.record.ev = e;
    e->refs++;
    return fk_capture_add(s, op);
}

/* ============================================================================================
 * Capture entry points
 * ========================================================================================== */

static void graph_free(fk_graph_t *g)
{
    for (int i = 0; i < g->n; i++)
        fk_op_free(g->nodes[i]);
    free(g->nodes);
    refs_release(g->refs, g->nrefs);
    fk_handle_del(g);
    free(g);
}

CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    FK_BEGIN(cuStreamBeginCapture);
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_stream_resolve(hStream, &s, false);
    if (r == CUDA_SUCCESS && s->legacy)
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    else if (r == CUDA_SUCCESS && s->capture)
        r = CUDA_ERROR_ILLEGAL_STATE;
    fk_capture_t *c = r == CUDA_SUCCESS ? calloc(1, sizeof(*c)) : NULL;
    fk_graph_t *g = c ? calloc(1, sizeof(*g)) : NULL;
    if (r == CUDA_SUCCESS && !g) {
        free(c);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) {
        *c = (fk_capture_t){ .next = gs.live, .id = ++gs.next_id, .graph = g, .mode = mode,
                             .thread = pthread_self() };
        g->capturing = true;
        fk_handle_add(g, FK_K_GRAPH);
        gs.live = c;
        join(c, s);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream)
{
    return cuStreamBeginCapture_v2(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

/* End capture c (lock held): its streams stop capturing. */
static void capture_end(fk_capture_t *c)
{
    for (fk_capture_t **pp = &gs.live; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    for (int i = 0; i < c->nparts; i++) {
        if (c->parts[i].s->capture == c)
            c->parts[i].s->capture = NULL;
        fk_stream_unref(c->parts[i].s);
    }
    c->graph->capturing = false;
    free(c);
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    FK_BEGIN(cuStreamEndCapture);
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_stream_resolve(hStream, &s, false);
    fk_capture_t *c = r == CUDA_SUCCESS ? s->capture : NULL;
    if (r == CUDA_SUCCESS && !c)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else if (r == CUDA_SUCCESS && c->parts[0].s != s)
        r = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    else if (r == CUDA_SUCCESS && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self()))
        r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    if (r == CUDA_SUCCESS) {
        for (int i = 1; i < c->nparts; i++)
            if (c->parts[i].nodes && !c->parts[i].joined_back && !c->invalid) {
                fk_log("cuStreamEndCapture: %s forked from the capture and did not join back", c->parts[i].s->label);
                r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
            }
        fk_graph_t *g = c->graph;
        if (r == CUDA_SUCCESS && c->invalid)
            r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        capture_end(c);
        if (r == CUDA_SUCCESS) {
            *phGraph = (CUgraph)g;
        } else {
            graph_free(g);
            *phGraph = NULL;
        }
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    FK_BEGIN(cuStreamIsCapturing);
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_stream_resolve(hStream, &s, false);
    if (r == CUDA_SUCCESS && s->legacy) {
        *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
        for (fk_capture_t *c = gs.live; c; c = c->next)
            for (int i = 0; i < c->nparts; i++)
                if (c->parts[i].s->ctx == s->ctx && !(c->parts[i].s->flags & CU_STREAM_NON_BLOCKING))
                    r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    } else if (r == CUDA_SUCCESS) {
        *captureStatus = !s->capture          ? CU_STREAM_CAPTURE_STATUS_NONE
                         : s->capture->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                               : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* cuStreamGetCaptureInfo: status, id, graph and the stream's last node (edge data all zero). */
static CUresult capture_info(CUstream hStream, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_stream_resolve(hStream, &s, false);
    if (r == CUDA_SUCCESS && s->legacy && fk_capture_legacy_conflict(s->ctx))
        r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    fk_capture_t *c = r == CUDA_SUCCESS ? s->capture : NULL;
    if (r == CUDA_SUCCESS) {
        *status = !c ? CU_STREAM_CAPTURE_STATUS_NONE
                     : c->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    }
    if (c) {
        part_t *p = part_of(c, s);
        size_t n = p && p->last ? 1 : 0;
        if (p) {
            p->dep[0] = (CUgraphNode)p->last;
            memset(p->edge, 0, sizeof(p->edge));
        }
        if (id)
            *id = c->id;
        if (graph)
            *graph = (CUgraph)c->graph;
        if (deps)
            *deps = n ? p->dep : NULL;
        if (edges)
            *edges = n ? p->edge : NULL;
        if (ndeps)
            *ndeps = n;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                           cuuint64_t *id_out, CUgraph *graph_out,
                                           const CUgraphNode **dependencies_out, size_t *numDependencies_out)
{
    FK_BEGIN(cuStreamGetCaptureInfo);
    return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, NULL, numDependencies_out);
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                           cuuint64_t *id_out, CUgraph *graph_out,
                                           const CUgraphNode **dependencies_out, const CUgraphEdgeData **edgeData_out,
                                           size_t *numDependencies_out)
{
    FK_BEGIN(cuStreamGetCaptureInfo);
    if (edgeData_out && !dependencies_out)
        return CUDA_ERROR_INVALID_VALUE;
    return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out);
}

/* ============================================================================================
 * Graphs and executable graphs
 * ========================================================================================== */

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph)
{
    FK_BEGIN(cuGraphDestroy);
    pthread_mutex_lock(&fk.mu);
    fk_graph_t *g = (fk_graph_t *)hGraph;
    CUresult r = fk_handle_ok(g, FK_K_GRAPH) && !g->capturing ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        graph_free(g);
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    FK_BEGIN(cuGraphGetNodes);
    if (!numNodes)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    fk_graph_t *g = (fk_graph_t *)hGraph;
    CUresult r = fk_handle_ok(g, FK_K_GRAPH) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && nodes) {
        for (size_t i = 0; i < *numNodes; i++)
            nodes[i] = i < (size_t)g->n ? (CUgraphNode)g->nodes[i] : NULL;
        if (*numNodes > (size_t)g->n)
            *numNodes = (size_t)g->n;
    } else if (r == CUDA_SUCCESS) {
        *numNodes = (size_t)g->n;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* Free an executable graph and release its references (lock held). */
static void exec_free(fk_exec_t *x)
{
    for (int i = 0; i < x->n; i++)
        fk_op_free(x->nodes[i]);
    free(x->nodes);
    refs_release(x->refs, x->nrefs);
    if (x->last_s)
        fk_stream_unref(x->last_s);
    free(x);
}

/* An executable graph: copies of the graph's nodes and references of its own on its user objects. */
static CUresult instantiate(CUgraphExec *out, CUgraph hGraph)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk.mu);
    fk_graph_t *g = (fk_graph_t *)hGraph;
    CUresult r = fk_handle_ok(g, FK_K_GRAPH) && !g->capturing ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    fk_exec_t *x = r == CUDA_SUCCESS ? calloc(1, sizeof(*x)) : NULL;
    if (r == CUDA_SUCCESS && (!x || (g->n && !(x->nodes = calloc((size_t)g->n, sizeof(*x->nodes)))) ||
                              (g->nrefs && !(x->refs = calloc((size_t)g->nrefs, sizeof(*x->refs)))))) {
        if (x)
            free(x->nodes);
        free(x);
        x = NULL;
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int i = 0; x && i < g->n; i++) {
        if (!(x->nodes[i] = fk_op_clone(g->nodes[i]))) {
            exec_free(x);
            x = NULL;
            r = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        x->n = i + 1;
    }
    if (x) {
        /* The executable graph holds references of its own on the graph's user objects. */
        for (int i = 0; i < g->nrefs; i++)
            if (g->refs[i].count) {
                x->refs[x->nrefs++] = g->refs[i];
                g->refs[i].o->refs += g->refs[i].count;
            }
        x->handle_live = true;
        fk_handle_add(x, FK_K_EXEC);
        *out = (CUgraphExec)x;
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    FK_BEGIN(cuGraphInstantiateWithFlags);
    const unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    if (flags & ~known)
        return CUDA_ERROR_INVALID_VALUE;
    return instantiate(phGraphExec, hGraph);
}

CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                       char *logBuffer, size_t bufferSize)
{
    FK_BEGIN(cuGraphInstantiate);
    if (phErrorNode)
        *phErrorNode = NULL;
    if (logBuffer && bufferSize)
        logBuffer[0] = '\0';
    return instantiate(phGraphExec, hGraph);
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    FK_BEGIN(cuGraphLaunch);
    fk_stream_t *s;
    pthread_mutex_lock(&fk.mu);
    fk_exec_t *x = (fk_exec_t *)hGraphExec;
    CUresult r = fk_handle_ok(x, FK_K_EXEC) ? fk_stream_resolve(hStream, &s, false) : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && s->capture)
        r = fk_capture_invalidate(s, "cuGraphLaunch inside a capture (child graphs are not modelled)");
    fk_op_t *op = r == CUDA_SUCCESS ? fk_op_new(FK_OP_GRAPH) : NULL;
    if (r == CUDA_SUCCESS && !op)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (op) {
        op->u.graph.exec = x;
        x->pending++; /* freeing op counts the launch as finished */
    }
    if (op && x->last_s && x->last_s != s) {
        /* Ordered after the previous launch of this graph, wherever it went. */
        fk_dep_t *d = malloc(sizeof(*d));
        if (d) {
            *d = (fk_dep_t){ .s = x->last_s, .seq = x->last_seq };
            x->last_s->refs++;
            op->deps = d;
            op->ndeps = 1;
        } else {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (op && r == CUDA_SUCCESS)
        r = fk_enqueue(s, op); /* takes op */
    else if (op)
        fk_op_free(op);
    if (r == CUDA_SUCCESS) {
        s->refs++;
        if (x->last_s)
            fk_stream_unref(x->last_s);
        x->last_s = s;
        x->last_seq = s->enqueued;
        /* Its external event records complete with this launch. */
        for (int i = 0; i < x->n; i++) {
            if (x->nodes[i]->kind != FK_OP_RECORD)
                continue;
            fk_event_t *e = x->nodes[i]->u.record.ev;
            s->refs++;
            if (e->rec_s)
                fk_stream_unref(e->rec_s);
            e->rec_s = s;
            e->rec_seq = s->enqueued;
            e->recorded = true;
            e->cap_id = 0;
        }
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    FK_BEGIN(cuGraphExecDestroy);
    pthread_mutex_lock(&fk.mu);
    fk_exec_t *x = (fk_exec_t *)hGraphExec;
    CUresult r = fk_handle_ok(x, FK_K_EXEC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        fk_handle_del(x);
        x->handle_live = false;
        if (x->pending == 0)
            exec_free(x);
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}

/* A launch of x has finished (or was dropped): free x if it was destroyed meanwhile (lock held). */
void fk_exec_launched(fk_exec_t *x)
{
    if (--x->pending == 0 && !x->handle_live)
        exec_free(x);
}

/* Run an executable graph's nodes in order on s's worker, as launch seq (lock not held). */
CUresult fk_exec_run(fk_stream_t *s, fk_exec_t *x, uint64_t seq)
{
    for (int i = 0; i < x->n && !atomic_load(&s->abort); i++) {
        fk_op_t *node = x->nodes[i];
        node->seq = seq; /* an event record node stamps the launch */
        CUresult r = node->fault != CUDA_SUCCESS ? node->fault : fk_op_exec(s, node);
        if (r != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}
