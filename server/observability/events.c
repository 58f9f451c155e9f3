/*
 * events.c - the daemon's event backlog and the Events stream (collctl events --follow).
 *
 * Events (session attached/detached, communicator created/destroyed, faults) are appended to a
 * ring of event-backlog records under events->mu, from whatever thread notices them (usually
 * with daemon->lock held; lock order daemon->lock -> events->mu). A pump thread sends them to
 * the subscribed streams outside every lock, so a slow or vanished subscriber never holds up the
 * engine: the ring overwrites the oldest records, and a subscriber that fell behind by more than
 * the ring is told how many it missed.
 *
 * A subscriber that does not read (an Events follower that grants no HTTP/2 window, a paused
 * `collctl events --follow`) costs a bounded amount: the gRPC wrapper queues at most
 * COLLD_RPC_STREAM_MAX_* per stream and refuses more; the subscriber then keeps its position in
 * the ring instead of a queue and waits (blocked) until the wrapper says its queue drained. What
 * the ring overwrote meanwhile is reported as one events_missed event. Each open stream holds a
 * unit of its tenant's max-event-followers-per-tenant (operators are not held to it). The
 * wrapper's wake-up (sub_writable) runs under the wrapper's lock and takes events->mu, so the pump
 * never calls the wrapper with events->mu held.
 */
#include "server/observability/events.h"

#include "server/core/daemon.h"
#include "server/core/tenant.h"

#include "colld.pb-c.h"
#include "common/log.h"
#include "common/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH_MAX 64           /* events copied per subscriber per round */
#define PUMP_POLL_MS 500       /* how often the pump looks for cancelled streams */

typedef struct {
    uint64_t seq;
    int64_t unix_us;
    const char *type;          /* a string literal */
    uint64_t comm_id;
    char comm_name[COLLD_NAME_LEN];
    int rank;
    pid_t pid;
    uint64_t session_id;
    uid_t uid;
    colld_status_t status;
    char detail[COLLD_DETAIL_LEN];
} event_rec_t;

typedef struct sub {
    colld_events_t *ev;
    colld_rpc_call_t *call;
    bool follow, admin;
    bool charged;              /* holds a unit of its tenant's COLLD_LIMIT_FOLLOWERS */
    uid_t uid;
    uint64_t next;             /* sequence number of the next event to consider (mu) */
    uint64_t missed;           /* overwritten events not reported yet (mu) */
    bool blocked;              /* its stream's queue is full: wait for the wrapper's call (mu) */
    uint64_t wakeups;          /* times the wrapper said its queue drained (mu) */
    struct sub *next_sub;
} sub_t;

struct colld_events {
    colld_daemon_t *d;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    event_rec_t *ring;
    uint64_t cap;
    uint64_t next_seq;         /* events ever recorded + 1 */
    sub_t *subs;
    bool running;
    pthread_t thread;
};

/* "timeout", "peer_lost", "mismatch", "abort", else "op_failed". */
const char *colld_event_type_of(colld_status_t st)
{
    switch (st) {
    case COLLD_ERR_TIMEOUT:
        return "timeout";
    case COLLD_ERR_PEER_LOST:
        return "peer_lost";
    case COLLD_ERR_MISMATCH:
        return "mismatch";
    case COLLD_ERR_ABORTED:
        return "abort";
    default:
        return "op_failed";
    }
}

/* Record an event (see events.h): the oldest record is overwritten when the ring is full. */
void colld_event(colld_daemon_t *d, const char *type, const colld_dcomm_t *c, int rank, pid_t pid,
                 uint64_t session_id, uid_t uid, colld_status_t st, const char *fmt, ...)
{
    colld_events_t *ev = d->events;
    if (!ev)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&ev->mu);
    event_rec_t *e = &ev->ring[ev->next_seq % ev->cap];
    e->seq = ev->next_seq++;
    e->unix_us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    e->type = type;
    e->comm_id = c ? c->id : 0;
    colld_strlcpy(e->comm_name, c ? c->name : "", sizeof(e->comm_name));
    e->rank = rank;
    e->pid = pid;
    e->session_id = session_id;
    e->uid = c ? c->tenant : uid;
    e->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->detail, sizeof(e->detail), fmt, ap);
    va_end(ap);
    pthread_cond_broadcast(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
}

/* Copy the events a subscriber may see, from sub->next on, into out (mu held). Returns how many;
 * *missed counts events that were overwritten before it saw them. */
static size_t collect(colld_events_t *ev, sub_t *sub, event_rec_t *out, size_t max, uint64_t *missed)
{
    uint64_t oldest = ev->next_seq > ev->cap ? ev->next_seq - ev->cap : 1;
    *missed = 0;
    if (sub->next < oldest) {
        *missed = oldest - sub->next;
        sub->next = oldest;
    }
    size_t n = 0;
    for (; sub->next < ev->next_seq && n < max; sub->next++) {
        const event_rec_t *e = &ev->ring[sub->next % ev->cap];
        if (sub->admin || e->uid == sub->uid)
            out[n++] = *e;
    }
    return n;
}

struct colld_event_copy {
    event_rec_t rec;
};

/* Whether an event is a fault doctor reports (collctl_doctor.c judges the rest from the status). */
static bool is_fault(const event_rec_t *e)
{
    return e->status != COLLD_OK && strcmp(e->type, "comm_destroyed") != 0 &&
           strcmp(e->type, "session_detached") != 0 && strcmp(e->type, "coll_waiting") != 0 &&
           strncmp(e->type, "gpu_", 4) != 0;
}

size_t colld_events_faults(colld_daemon_t *d, bool admin, uid_t uid, int64_t since_unix_us, size_t max,
                           Colld__V1__Event *out, colld_event_copy_t **recs, uint32_t *dropped)
{
    colld_events_t *ev = d->events;
    *recs = NULL;
    *dropped = 0;
    if (!ev || !max)
        return 0;
    colld_event_copy_t *r = calloc(max, sizeof(*r));
    if (!r)
        return 0;
    size_t n = 0, match = 0;
    pthread_mutex_lock(&ev->mu);
    uint64_t oldest = ev->next_seq > ev->cap ? ev->next_seq - ev->cap : 1;
    for (int pass = 0; pass < 2; pass++) /* count, then copy the most recent max */
        for (uint64_t q = oldest, k = 0; q < ev->next_seq; q++) {
            const event_rec_t *e = &ev->ring[q % ev->cap];
            if ((!admin && e->uid != uid) || e->unix_us < since_unix_us || !is_fault(e))
                continue;
            if (pass == 0)
                match++;
            else if (k++ >= match - COLLD_MIN(match, max))
                r[n++].rec = *e;
        }
    *dropped = (uint32_t)COLLD_MIN(match - n, UINT32_MAX);
    pthread_mutex_unlock(&ev->mu);
    for (size_t i = 0; i < n; i++) {
        const event_rec_t *e = &r[i].rec;
        Colld__V1__Event *m = &out[i];
        colld__v1__event__init(m);
        m->seq = e->seq;
        m->unix_us = e->unix_us;
        m->type = (char *)e->type;
        m->comm_id = e->comm_id;
        m->comm_name = (char *)e->comm_name;
        m->rank = e->rank;
        m->pid = e->pid;
        m->session_id = e->session_id;
        m->uid = e->uid;
        m->status = e->status;
        m->detail = (char *)e->detail;
    }
    *recs = r;
    return n;
}

/* Send one event. Returns 0, COLLD_RPC_SEND_FULL when the stream's queue is full, or -1 when the
 * subscriber is gone. */
static int send_event(colld_rpc_call_t *call, const event_rec_t *e)
{
    Colld__V1__Event m = COLLD__V1__EVENT__INIT;
    m.seq = e->seq;
    m.unix_us = e->unix_us;
    m.type = (char *)e->type;
    m.comm_id = e->comm_id;
    m.comm_name = (char *)e->comm_name;
    m.rank = e->rank;
    m.pid = e->pid;
    m.session_id = e->session_id;
    m.uid = e->uid;
    m.status = e->status;
    m.detail = (char *)e->detail;
    return colld_rpc_send(call, &m.base);
}

/* The gRPC wrapper says a blocked subscriber's queue drained (its thread, its lock held: only
 * signal). */
static void sub_writable(void *arg)
{
    sub_t *sub = arg;
    colld_events_t *ev = sub->ev;
    pthread_mutex_lock(&ev->mu);
    sub->wakeups++;
    sub->blocked = false;
    pthread_cond_broadcast(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
}

/* Serve one subscriber a round of events (pump thread). A full queue leaves the subscriber at the
 * first event it could not take, blocked until the wrapper calls sub_writable. Returns true when
 * it is done with. */
static bool serve(colld_events_t *ev, sub_t *sub, event_rec_t *buf)
{
    uint64_t missed;
    pthread_mutex_lock(&ev->mu);
    if (sub->blocked) {
        pthread_mutex_unlock(&ev->mu);
        return colld_rpc_call_cancelled(sub->call);
    }
    uint64_t wakeups = sub->wakeups;
    size_t n = collect(ev, sub, buf, BATCH_MAX, &missed);
    sub->missed += missed;
    uint64_t gap_count = sub->missed;
    bool caught_up = sub->next == ev->next_seq;
    pthread_mutex_unlock(&ev->mu);

    int rc = 0;
    if (gap_count) {
        event_rec_t gap = { .seq = 0, .type = "events_missed", .rank = -1, .status = COLLD_OK };
        snprintf(gap.detail, sizeof(gap.detail), "%llu older events were overwritten before they could be sent "
                 "(raise --event-backlog, or read the stream faster)", (unsigned long long)gap_count);
        rc = send_event(sub->call, &gap);
        if (rc == 0) {
            pthread_mutex_lock(&ev->mu);
            sub->missed -= gap_count;
            pthread_mutex_unlock(&ev->mu);
        }
    }
    size_t sent = 0;
    while (rc == 0 && sent < n && (rc = send_event(sub->call, &buf[sent])) == 0)
        sent++;
    if (rc < 0)
        return true;
    if (rc == COLLD_RPC_SEND_FULL) {
        pthread_mutex_lock(&ev->mu);
        if (sent < n)
            sub->next = buf[sent].seq; /* keep its place: what did not go out is sent later */
        if (sub->wakeups == wakeups) /* else the queue drained meanwhile: go on at once */
            sub->blocked = true;
        pthread_mutex_unlock(&ev->mu);
        return colld_rpc_call_cancelled(sub->call);
    }
    if (colld_rpc_call_cancelled(sub->call))
        return true;
    return caught_up && !sub->follow;
}

/* Give back the tenant units of finished subscribers and free them (no lock held). */
static void subs_release(colld_events_t *ev, sub_t *list)
{
    if (!list)
        return;
    pthread_mutex_lock(&ev->d->lock);
    for (sub_t *s = list; s; s = s->next_sub)
        if (s->charged)
            colld_tenant_uncharge(ev->d, s->uid, COLLD_LIMIT_FOLLOWERS, 1);
    pthread_mutex_unlock(&ev->d->lock);
    while (list) {
        sub_t *s = list;
        list = s->next_sub;
        free(s);
    }
}

static void *pump_main(void *arg)
{
    colld_events_t *ev = arg;
    event_rec_t *buf = malloc(BATCH_MAX * sizeof(*buf));
    if (!buf) {
        LOG_ERROR(RPC, "event pump out of memory: event streams stop");
        return NULL;
    }
    pthread_mutex_lock(&ev->mu);
    while (ev->running) {
        bool pending = false;
        for (sub_t *s = ev->subs; s && !pending; s = s->next_sub)
            pending = !s->blocked && (s->next < ev->next_seq || !s->follow || s->missed);
        if (!pending && !ev->subs) {
            pthread_cond_wait(&ev->cv, &ev->mu); /* nobody listens: sleep until someone does */
            continue;
        }
        if (!pending) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += PUMP_POLL_MS * 1000000L;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&ev->cv, &ev->mu, &ts);
            if (!ev->running)
                break;
        }
        /* Only this thread removes subscribers, so the list can be walked without mu while
         * serving; new ones are pushed at the head, which the walk started after. */
        sub_t *list = ev->subs;
        pthread_mutex_unlock(&ev->mu);
        for (sub_t *s = list; s; s = s->next_sub) {
            bool done = serve(ev, s, buf);
            if (done) {
                colld_rpc_finish(s->call, GRPC_STATUS_OK, "");
                s->call = NULL;
            }
        }
        sub_t *gone = NULL;
        pthread_mutex_lock(&ev->mu);
        for (sub_t **pp = &ev->subs; *pp;) {
            sub_t *s = *pp;
            if (!s->call) {
                *pp = s->next_sub;
                s->next_sub = gone;
                gone = s;
            } else
                pp = &s->next_sub;
        }
        if (gone) {
            pthread_mutex_unlock(&ev->mu); /* lock order: daemon->lock before mu */
            subs_release(ev, gone);
            pthread_mutex_lock(&ev->mu);
        }
    }
    pthread_mutex_unlock(&ev->mu);
    free(buf);
    return NULL;
}

/* Make the backlog and start the pump thread. Returns 0 or -1 (no memory, no thread). */
int colld_events_start(colld_daemon_t *d)
{
    colld_events_t *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return -1;
    ev->d = d;
    ev->cap = (uint64_t)d->cfg.event_backlog;
    ev->ring = calloc(ev->cap, sizeof(*ev->ring));
    ev->next_seq = 1;
    if (!ev->ring) {
        free(ev);
        return -1;
    }
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->cv, NULL);
    ev->running = true;
    if (pthread_create(&ev->thread, NULL, pump_main, ev) != 0) {
        free(ev->ring);
        free(ev);
        return -1;
    }
    pthread_mutex_lock(&d->lock);
    d->events = ev;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

/* End every stream and the pump, free the backlog. */
void colld_events_stop(colld_daemon_t *d)
{
    pthread_mutex_lock(&d->lock);
    colld_events_t *ev = d->events;
    d->events = NULL; /* emitters check it under daemon->lock or see the ring still alive */
    pthread_mutex_unlock(&d->lock);
    if (!ev)
        return;
    pthread_mutex_lock(&ev->mu);
    ev->running = false;
    pthread_cond_broadcast(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
    pthread_join(ev->thread, NULL);
    for (sub_t *s = ev->subs; s; s = s->next_sub)
        colld_rpc_finish(s->call, GRPC_STATUS_UNAVAILABLE, "the colld daemon is shutting down");
    subs_release(ev, ev->subs);
    ev->subs = NULL;
    pthread_cond_destroy(&ev->cv);
    pthread_mutex_destroy(&ev->mu);
    free(ev->ring);
    free(ev);
}

/* A new Events stream: charged to its tenant (operators are not held to the limit), placed in the
 * backlog as asked, served by the pump. */
void colld_events_subscribe(colld_daemon_t *d, colld_rpc_call_t *call, bool follow, uint32_t backlog,
                            bool only_new, bool admin, uid_t uid)
{
    colld_err_t err = COLLD_ERR_INIT;
    pthread_mutex_lock(&d->lock);
    colld_events_t *ev = d->events;
    sub_t *s = ev ? calloc(1, sizeof(*s)) : NULL;
    if (!s) {
        pthread_mutex_unlock(&d->lock);
        colld_rpc_finish(call, ev ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_UNAVAILABLE,
                         ev ? "colld daemon out of memory" : "the colld daemon is shutting down");
        return;
    }
    if (!admin && colld_tenant_charge(d, uid, COLLD_LIMIT_FOLLOWERS, 1, &err) != COLLD_OK) {
        pthread_mutex_unlock(&d->lock);
        free(s);
        LOG_WARN_RL(RPC, "refusing an event stream: %s", err.msg);
        colld_rpc_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, err.msg);
        return;
    }
    s->charged = !admin;
    s->ev = ev;
    s->call = call;
    colld_rpc_set_writable(call, sub_writable, s); /* before the pump can find the queue full */
    s->follow = follow;
    s->admin = admin;
    s->uid = uid;
    pthread_mutex_lock(&ev->mu);
    uint64_t oldest = ev->next_seq > ev->cap ? ev->next_seq - ev->cap : 1;
    s->next = oldest;
    if (only_new)
        s->next = ev->next_seq;
    else if (backlog && ev->next_seq - oldest > backlog)
        s->next = ev->next_seq - backlog; /* approximately: counts events of every tenant */
    s->next_sub = ev->subs;
    ev->subs = s;
    pthread_cond_broadcast(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
    pthread_mutex_unlock(&d->lock);
}

/* ============================================================================================
 * The module's hooks: what happens to communicators
 * ========================================================================================== */

static void events_formed(colld_daemon_t *d, colld_dcomm_t *c)
{
    colld_event(d, "comm_created", c, -1, 0, 0, c->tenant, COLLD_OK, "%d ranks, timeout %d ms", c->nranks,
                c->timeout_ms);
}

/* A fault (a rank closing its handle is not one): the rank at fault and its process, if known. */
static void events_faulted(colld_daemon_t *d, colld_dcomm_t *c, colld_fault_t how, int rank, const char *detail)
{
    colld_status_t st = c->error;
    if (how == COLLD_FAULT_DISSOLVED) {
        colld_event(d, colld_event_type_of(st), c, rank, colld_comm_rank_pid(c, rank), 0, c->tenant, st,
                    "while forming: %s", detail);
        return;
    }
    if (how == COLLD_FAULT_BROKEN)
        colld_event(d, colld_event_type_of(st), c, rank, rank >= 0 ? c->ranks[rank].pid : 0,
                    rank >= 0 && c->ranks[rank].session ? c->ranks[rank].session->id : 0, c->tenant, st, "%s",
                    detail);
}

/* Freed: a communicator its ranks closed (destroyed their handles) ends with COLLD_OK, not with
 * the COLLD_ERR_INVALID_USAGE its later operations would get (log shippers and alerts read a
 * status as an error); a broken one with its first fault. */
static void events_freed(colld_daemon_t *d, colld_dcomm_t *c)
{
    bool closed = c->state == COLLD_COMM_CLOSING;
    colld_event(d, "comm_destroyed", c, -1, 0, 0, c->tenant, closed ? COLLD_OK : c->error,
                "%s after %llu collectives completed, %llu failed", closed ? "closed" : colld_comm_state_name(c->state),
                (unsigned long long)c->ops_completed, (unsigned long long)c->ops_failed);
}

/* A collective has waited --wait-event-ms: in progress, naming the first rank that has not
 * posted it (the detail names them all). */
static void events_waiting(colld_daemon_t *d, colld_dcomm_t *c, int rank, uint64_t waited_ns, const char *detail)
{
    (void)waited_ns;
    colld_event(d, "coll_waiting", c, rank, colld_comm_rank_pid(c, rank),
                rank >= 0 && c->ranks[rank].session ? c->ranks[rank].session->id : 0, c->tenant, COLLD_INPROGRESS,
                "%s", detail);
}

const colld_comm_hooks_t colld_events_hooks = {
    .name = "events",
    .formed = events_formed,
    .faulted = events_faulted,
    .freed = events_freed,
    .waiting = events_waiting,
};
