/*
 * comm.c - the communicator registry: unique ids, joining at a rank, leaving, breaking.
 *
 * A unique id is issued to a tenant (uid) and names one communicator. The first rank to join
 * creates the communicator; CommInit answers are held back until every rank has joined (or the
 * join times out, or a joined rank's process dies), then all ranks are answered together. All
 * functions here run with daemon->lock held; RPC answers are collected in a reply list and sent
 * after the lock is released.
 */
#include "server/daemon.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_UIDS_PER_SESSION 1024

/* Queue an answer to a CommInit call (or drop it if there is no call). */
void colld_reply_add(colld_reply_t **list, colld_rpc_call_t *call, colld_status_t st, const char *detail)
{
    if (!call)
        return;
    colld_reply_t *r = calloc(1, sizeof(*r));
    if (!r) {
        /* Without memory the answer cannot be queued; fail the call directly (gRPC is safe to call
         * here: nothing of the wrapper's is locked by us). */
        colld_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "colld daemon out of memory");
        return;
    }
    r->call = call;
    r->status = st;
    colld_strlcpy(r->detail, detail ? detail : "", sizeof(r->detail));
    r->next = *list;
    *list = r;
}

const char *colld_comm_state_name(colld_comm_state_t s)
{
    switch (s) {
    case COLLD_COMM_JOINING:
        return "joining";
    case COLLD_COMM_READY:
        return "ready";
    case COLLD_COMM_BROKEN:
        return "broken";
    case COLLD_COMM_CLOSING:
        return "closing";
    }
    return "unknown";
}

/* The member behind a session-local handle, or NULL. */
colld_member_t *colld_comm_member(colld_session_t *s, uint32_t handle)
{
    if (handle == 0 || handle >= s->nhandles)
        return NULL;
    return s->handles[handle];
}

/* Issue a new unique id for the session's tenant. */
colld_status_t colld_comm_issue_uid(colld_daemon_t *d, colld_session_t *s, uint8_t *out)
{
    if (s->nuids >= MAX_UIDS_PER_SESSION)
        return COLLD_ERR_QUOTA_EXCEEDED;
    colld_issued_uid_t *u = calloc(1, sizeof(*u));
    if (!u)
        return COLLD_ERR_NO_MEMORY;
    if (colld_random_bytes(u->bytes, COLLD_WIRE_UID_RANDOM_BYTES) < 0) {
        free(u);
        return COLLD_ERR_SYSTEM;
    }
    colld_cluster_stamp_uid(d, u->bytes); /* a multi-node id when this daemon listens for peers */
    u->tenant = s->uid;
    u->owner = s;
    u->next = d->uids;
    d->uids = u;
    s->nuids++;
    memcpy(out, u->bytes, sizeof(u->bytes));
    return COLLD_OK;
}

/* Find and unlink an issued unique id of this tenant; NULL if there is none. */
static colld_issued_uid_t *uid_take(colld_daemon_t *d, const uint8_t *uid, uid_t tenant)
{
    for (colld_issued_uid_t **pp = &d->uids; *pp; pp = &(*pp)->next) {
        colld_issued_uid_t *u = *pp;
        if (u->tenant == tenant && memcmp(u->bytes, uid, sizeof(u->bytes)) == 0) {
            *pp = u->next;
            return u;
        }
    }
    return NULL;
}

bool colld_comm_take_uid(colld_daemon_t *d, const uint8_t *uid, uid_t tenant)
{
    colld_issued_uid_t *u = uid_take(d, uid, tenant);
    if (!u)
        return false;
    if (u->owner)
        u->owner->nuids--;
    free(u);
    return true;
}

/* Give a session a handle for a member: the lowest free slot, growing the table. 0 on failure. */
static uint32_t handle_alloc(colld_session_t *s, colld_member_t *m)
{
    for (uint32_t h = 1; h < s->nhandles; h++)
        if (!s->handles[h]) {
            s->handles[h] = m;
            return h;
        }
    uint32_t n = s->nhandles ? s->nhandles * 2 : 8;
    colld_member_t **t = realloc(s->handles, n * sizeof(*t));
    if (!t)
        return 0;
    memset(t + s->nhandles, 0, (n - s->nhandles) * sizeof(*t));
    uint32_t h = s->nhandles ? s->nhandles : 1;
    s->handles = t;
    s->nhandles = n;
    s->handles[h] = m;
    return h;
}

/* Detach a member from its session: the handle is freed and the rank counts as gone. */
static void member_detach(colld_member_t *m)
{
    colld_session_t *s = m->session;
    if (!s)
        return;
    if (m->handle < s->nhandles && s->handles[m->handle] == m)
        s->handles[m->handle] = NULL;
    s->ncomms--;
    m->session = NULL;
    m->left = true;
    if (m->notify) {
        m->notify = false;
        m->comm->notices_pending--;
    }
    m->comm->present--;
}

/* Free a communicator once no member and no executing collective refers to it. */
void colld_comm_unref(colld_daemon_t *d, colld_dcomm_t *c)
{
    if (--c->refs > 0)
        return;
    for (colld_dcomm_t **pp = &d->comms; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    LOG_INFO(COLL, "communicator %llu (%s) freed", (unsigned long long)c->id, c->name);
    colld_event(d, "comm_destroyed", c, -1, 0, 0, c->tenant, c->error,
                "%s after %llu collectives completed, %llu failed", colld_comm_state_name(c->state),
                (unsigned long long)c->ops_completed, (unsigned long long)c->ops_failed);
    colld_recorder_free(c);
    colld_fast_free(d, c);
    colld_gpu_comm_free(d, c);
    if (c->x)
        colld_xcomm_free(c->x);
    free(c->ranks);
    free(c);
}

/* Drop the registry's reference once every member has gone. */
static void comm_maybe_free(colld_daemon_t *d, colld_dcomm_t *c)
{
    if (c->present == 0 && c->joined > 0) {
        c->joined = 0; /* marks the registry reference as dropped */
        colld_comm_unref(d, c);
    }
}

/* Fail every queued operation of a member. */
static void member_fail_queue(colld_dcomm_t *c, colld_member_t *m, colld_status_t st)
{
    while (m->head) {
        colld_op_t *op = m->head;
        m->head = op->next;
        c->ops_failed++;
        colld_engine_fail_op(op, st);
    }
    m->tail = NULL;
}

/* A communicator that has not formed cannot be repaired: answer every waiting join with the
 * error and dissolve it. */
static void comm_dissolve(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st, int rank, const char *detail,
                          colld_reply_t **replies)
{
    c->error = st;
    colld_strlcpy(c->error_detail, detail, sizeof(c->error_detail));
    colld_metrics_comm_error(d, st);
    colld_event(d, colld_event_type_of(st), c, rank, rank >= 0 ? c->ranks[rank].pid : 0, 0, c->tenant, st,
                "while forming: %s", detail);
    for (int r = 0; r < c->nranks; r++) {
        colld_member_t *m = &c->ranks[r];
        colld_reply_add(replies, m->join_call, st, detail);
        m->join_call = NULL;
        member_detach(m);
    }
    LOG_INFO(COLL, "communicator %llu (%s) dissolved before forming: %s", (unsigned long long)c->id, c->name,
             detail);
    if (c->x)
        colld_cluster_comm_failed(d, c, st, rank, detail);
    comm_maybe_free(d, c);
}

/* Break a communicator: record the first error, fail queued operations; later ones fail fast. */
void colld_comm_break(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st, int rank, const char *detail,
                      colld_reply_t **replies)
{
    if (c->state == COLLD_COMM_JOINING) {
        comm_dissolve(d, c, st, rank, detail, replies);
        return;
    }
    /* The first fault wins; a normal leave (INVALID_USAGE) only closes, and a fault after it
     * still becomes the reported error. */
    bool closing = st == COLLD_ERR_INVALID_USAGE;
    if (c->state == COLLD_COMM_READY || (c->state == COLLD_COMM_CLOSING && !closing)) {
        c->error = st;
        colld_strlcpy(c->error_detail, detail, sizeof(c->error_detail));
        c->state = closing ? COLLD_COMM_CLOSING : COLLD_COMM_BROKEN;
        if (c->x)
            colld_cluster_comm_failed(d, c, st, rank, detail); /* the other nodes' ranks learn it too */
        if (!closing) {
            LOG_WARN(COLL, "communicator %llu (%s) broken: %s: %s", (unsigned long long)c->id, c->name,
                     colld_status_name(st), detail);
            colld_metrics_comm_error(d, st);
            colld_event(d, colld_event_type_of(st), c, rank, rank >= 0 ? c->ranks[rank].pid : 0,
                        rank >= 0 && c->ranks[rank].session ? c->ranks[rank].session->id : 0, c->tenant, st, "%s",
                        detail);
            /* Ranks with nothing in flight learn of it too (their async-error query). */
            for (int r = 0; r < c->nranks; r++)
                if (c->ranks[r].session && !c->ranks[r].notify) {
                    c->ranks[r].notify = true;
                    c->notices_pending++;
                }
        }
    }
    colld_recorder_failed(c, c->error, colld_now_ns());
    for (int r = 0; r < c->nranks; r++)
        member_fail_queue(c, &c->ranks[r], c->error);
    colld_engine_post_notices(c);
    colld_fast_break(c); /* ranks waiting on the fast area wake with the error */
    colld_gpu_comm_broken(d, c); /* and no GPU stream of theirs waits forever */
}

/* Abort: every rank's pending and later operations fail with ABORTED. The handles stay valid
 * until each rank destroys its own. */
void colld_dcomm_abort(colld_daemon_t *d, colld_dcomm_t *c, int rank, const char *who, colld_reply_t **replies)
{
    char why[COLLD_DETAIL_LEN];
    snprintf(why, sizeof(why), "communicator %llu aborted by %s", (unsigned long long)c->id, who);
    LOG_INFO(COLL, "%s", why);
    colld_comm_break(d, c, COLLD_ERR_ABORTED, rank, why, replies);
}

/* ---- per-tenant policy ---- */

int colld_policy_cap(const colld_daemon_t *d, uid_t uid)
{
    for (const colld_policy_t *p = d->policies; p; p = p->next)
        if (p->uid == uid)
            return p->max_timeout_ms;
    return 0;
}

void colld_policy_free(colld_daemon_t *d)
{
    while (d->policies) {
        colld_policy_t *p = d->policies;
        d->policies = p->next;
        free(p);
    }
}

/* Parse "uid:ms,uid:ms" (whitespace allowed around items). */
int colld_policy_parse(colld_daemon_t *d, const char *text, char *err, size_t err_len)
{
    const char *p = text;
    while (p && *p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        unsigned long long uid = strtoull(p, &end, 10);
        if (end == p || *end != ':' || errno || uid > UINT32_MAX - 1) {
            snprintf(err, err_len, "tenant-timeout-caps: expected uid:ms at '%s'", p);
            return -1;
        }
        p = end + 1;
        long long ms = strtoll(p, &end, 10);
        if (end == p || errno || ms < 1 || ms > 86400000 || (*end && *end != ',' && *end != ' ')) {
            snprintf(err, err_len, "tenant-timeout-caps: timeout of uid %llu must be 1..86400000 ms at '%s'", uid, p);
            return -1;
        }
        p = end;
        if (colld_policy_set(d, (uid_t)uid, (int)ms) < 0) {
            snprintf(err, err_len, "out of memory");
            return -1;
        }
    }
    return 0;
}

int colld_policy_set(colld_daemon_t *d, uid_t uid, int max_timeout_ms)
{
    colld_policy_t *pol = NULL;
    for (colld_policy_t *x = d->policies; x; x = x->next)
        if (x->uid == uid)
            pol = x;
    if (!pol) {
        pol = calloc(1, sizeof(*pol));
        if (!pol)
            return -1;
        pol->uid = uid;
        pol->net_algo = -1;
        pol->next = d->policies;
        d->policies = pol;
    }
    pol->max_timeout_ms = max_timeout_ms;
    return 0;
}

void colld_policy_clear(colld_daemon_t *d, uid_t uid)
{
    for (colld_policy_t **pp = &d->policies; *pp; pp = &(*pp)->next)
        if ((*pp)->uid == uid) {
            colld_policy_t *p = *pp;
            *pp = p->next;
            free(p);
            return;
        }
}

/* Join rank `rank` of the communicator named by `uid`. Answers now on error; otherwise the answer
 * comes when the last rank joins. */
void colld_comm_join(colld_daemon_t *d, colld_session_t *s, const uint8_t *uid, int nranks, int rank,
                     int timeout_ms, const char *name, colld_rpc_call_t *call, colld_reply_t **replies)
{
    char detail[COLLD_DETAIL_LEN];
    colld_status_t st = COLLD_ERR_INVALID_ARGUMENT;
    colld_dcomm_t *c = NULL;

    if (nranks < 1 || nranks > COLLD_MAX_RANKS) {
        snprintf(detail, sizeof(detail), "nranks %d is out of range (1..%d)", nranks, COLLD_MAX_RANKS);
        goto fail;
    }
    if (rank < 0 || rank >= nranks) {
        snprintf(detail, sizeof(detail), "rank %d is out of range for nranks %d (0..%d)", rank, nranks, nranks - 1);
        goto fail;
    }
    if (timeout_ms < 0) {
        snprintf(detail, sizeof(detail), "timeout_ms %d is negative", timeout_ms);
        goto fail;
    }
    if (timeout_ms == 0)
        timeout_ms = (int)d->cfg.timeout_ms;
    if (timeout_ms > d->cfg.max_timeout_ms)
        timeout_ms = (int)d->cfg.max_timeout_ms; /* the operator's cap */
    int tenant_cap = colld_policy_cap(d, s->uid);
    if (tenant_cap > 0 && timeout_ms > tenant_cap)
        timeout_ms = tenant_cap; /* the tenant's policy */
    if (s->ncomms >= (unsigned)d->cfg.max_comms_per_session) {
        st = COLLD_ERR_QUOTA_EXCEEDED;
        snprintf(detail, sizeof(detail), "session already has %u communicators (max-comms-per-session)", s->ncomms);
        goto fail;
    }
    for (colld_dcomm_t *x = d->comms; x; x = x->next)
        if (x->tenant == s->uid && memcmp(x->unique_id, uid, sizeof(x->unique_id)) == 0) {
            c = x;
            break;
        }
    if (c && c->state != COLLD_COMM_JOINING) {
        st = COLLD_ERR_INVALID_USAGE;
        snprintf(detail, sizeof(detail), "unique id already used by communicator %llu, which has formed",
                 (unsigned long long)c->id);
        goto fail;
    }
    char root_addr[COLLD_WIRE_UNIQUE_ID_BYTES];
    bool multi_node = colld_uid_root_addr(uid, root_addr, sizeof(root_addr)) != NULL;
    if (!c) {
        /* A multi-node id is checked by its root daemon (it may be this one) when the join
         * reaches it; a local one must have been issued here. */
        colld_issued_uid_t *u = multi_node ? NULL : uid_take(d, uid, s->uid);
        if (!u && !multi_node) {
            snprintf(detail, sizeof(detail), "unknown unique id: not issued by this daemon to this user "
                                             "(get it with colld_get_unique_id on the same host)");
            goto fail;
        }
        if (u && u->owner)
            u->owner->nuids--;
        free(u);
        c = calloc(1, sizeof(*c));
        if (c) {
            c->nranks = nranks;
            c->ranks = calloc((size_t)nranks, sizeof(*c->ranks));
        }
        if (!c || !c->ranks || colld_recorder_init(d, c) < 0) {
            if (c)
                free(c->ranks);
            free(c);
            st = COLLD_ERR_NO_MEMORY;
            snprintf(detail, sizeof(detail), "daemon out of memory");
            goto fail;
        }
        c->id = ++d->next_comm_id;
        memcpy(c->unique_id, uid, sizeof(c->unique_id));
        c->tenant = s->uid;
        c->nranks = nranks;
        c->timeout_ms = timeout_ms;
        c->refs = 1;
        c->state = COLLD_COMM_JOINING;
        c->created_ns = colld_now_ns();
        c->exec_seq = 1;
        c->fast_fd = -1;
        if (name && *name)
            colld_strlcpy(c->name, name, sizeof(c->name));
        else
            snprintf(c->name, sizeof(c->name), "comm-%llu", (unsigned long long)c->id);
        for (int r = 0; r < nranks; r++) {
            c->ranks[r].comm = c;
            c->ranks[r].rank = r;
        }
        if (multi_node && colld_cluster_comm_init(d, c, &st, detail, sizeof(detail)) < 0) {
            colld_recorder_free(c);
            free(c->ranks);
            free(c);
            goto fail;
        }
        c->next = d->comms;
        d->comms = c;
        LOG_INFO(COLL, "communicator %llu (%s) created: %d ranks, timeout %d ms", (unsigned long long)c->id,
                 c->name, nranks, timeout_ms);
    } else if (c->nranks != nranks) {
        snprintf(detail, sizeof(detail), "nranks %d differs from %d given by the ranks that joined first", nranks,
                 c->nranks);
        goto fail;
    }
    colld_member_t *m = &c->ranks[rank];
    if (m->session || m->left) {
        st = COLLD_ERR_INVALID_USAGE;
        snprintf(detail, sizeof(detail), "rank %d of communicator %llu already joined (pid %d)", rank,
                 (unsigned long long)c->id, (int)m->pid);
        goto fail;
    }
    uint32_t h = handle_alloc(s, m);
    if (!h) {
        st = COLLD_ERR_NO_MEMORY;
        snprintf(detail, sizeof(detail), "daemon out of memory");
        goto fail;
    }
    m->session = s;
    m->handle = h;
    m->pid = s->pid;
    m->next_seq = 1;
    m->join_call = call;
    s->ncomms++;
    c->joined++;
    c->present++;
    if (c->x) {
        colld_cluster_joined(d, c, m); /* formed when the root daemon has every rank */
        return;
    }
    if (c->joined < c->nranks)
        return;
    colld_comm_formed(d, c, replies);
    return;
fail:
    LOG_INFO(COLL, "pid %d: join refused: %s", (int)s->pid, detail);
    colld_reply_add(replies, call, st, detail);
}

/* Every rank has joined: the communicator is ready; answer the joins (lock held). */
void colld_comm_formed(colld_daemon_t *d, colld_dcomm_t *c, colld_reply_t **replies)
{
    c->state = COLLD_COMM_READY;
    colld_fast_create(d, c);
    LOG_INFO(COLL, "communicator %llu (%s) formed with %d ranks", (unsigned long long)c->id, c->name, c->nranks);
    colld_metrics_comm_formed(d);
    colld_event(d, "comm_created", c, -1, 0, 0, c->tenant, COLLD_OK, "%d ranks, timeout %d ms", c->nranks,
                c->timeout_ms);
    for (int r = 0; r < c->nranks; r++) {
        colld_member_t *x = &c->ranks[r];
        colld_reply_add(replies, x->join_call, COLLD_OK, "");
        if (*replies && (*replies)->call == x->join_call) {
            (*replies)->handle = x->handle;
            (*replies)->comm_id = c->id;
            (*replies)->timeout_ms = c->timeout_ms;
        }
        x->join_call = NULL;
    }
}

/* CommDestroy: the rank leaves. Peers that post later collectives get INVALID_USAGE at once
 * instead of waiting for a rank that will never come. */
colld_status_t colld_comm_leave(colld_daemon_t *d, colld_session_t *s, uint32_t handle, char *detail,
                                size_t detail_len, colld_reply_t **replies)
{
    colld_member_t *m = colld_comm_member(s, handle);
    if (!m) {
        snprintf(detail, detail_len, "unknown communicator handle %u", handle);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    colld_dcomm_t *c = m->comm;
    char why[COLLD_DETAIL_LEN];
    if (c->state == COLLD_COMM_JOINING) {
        snprintf(why, sizeof(why), "rank %d (pid %d) left before all ranks joined", m->rank, (int)s->pid);
        comm_dissolve(d, c, COLLD_ERR_ABORTED, m->rank, why, replies);
        return COLLD_OK;
    }
    colld_engine_settle_fast(d, c, replies);
    snprintf(why, sizeof(why), "rank %d (pid %d) has destroyed its handle of communicator %llu", m->rank,
             (int)s->pid, (unsigned long long)c->id);
    if (c->state == COLLD_COMM_READY)
        colld_recorder_failed(c, COLLD_ERR_INVALID_USAGE, colld_now_ns());
    member_fail_queue(c, m, COLLD_ERR_INVALID_USAGE);
    member_detach(m);
    colld_comm_break(d, c, COLLD_ERR_INVALID_USAGE, m->rank, why, replies);
    comm_maybe_free(d, c);
    return COLLD_OK;
}

/* A session ended: each of its ranks is lost to its communicators. */
void colld_comm_session_gone(colld_daemon_t *d, colld_session_t *s, colld_reply_t **replies)
{
    for (uint32_t h = 1; h < s->nhandles; h++) {
        colld_member_t *m = s->handles[h];
        if (!m)
            continue;
        colld_dcomm_t *c = m->comm;
        char why[COLLD_DETAIL_LEN];
        if (c->state == COLLD_COMM_JOINING) {
            snprintf(why, sizeof(why), "rank %d (pid %d) disconnected before all ranks joined", m->rank, (int)s->pid);
            comm_dissolve(d, c, COLLD_ERR_PEER_LOST, m->rank, why, replies);
            continue;
        }
        colld_engine_settle_fast(d, c, replies);
        snprintf(why, sizeof(why), "rank %d (pid %d) disconnected: its process exited or was killed", m->rank,
                 (int)s->pid);
        if (c->state == COLLD_COMM_READY)
            colld_recorder_failed(c, COLLD_ERR_PEER_LOST, colld_now_ns());
        member_fail_queue(c, m, COLLD_ERR_PEER_LOST);
        member_detach(m);
        colld_comm_break(d, c, COLLD_ERR_PEER_LOST, m->rank, why, replies);
        comm_maybe_free(d, c);
    }
}

/* Dissolve communicators whose ranks did not all join in time. Returns the next deadline. */
uint64_t colld_comm_check_join_timeouts(colld_daemon_t *d, uint64_t now, colld_reply_t **replies)
{
    uint64_t next = UINT64_MAX;
    colld_dcomm_t *c = d->comms;
    while (c) {
        colld_dcomm_t *following = c->next;
        if (c->state == COLLD_COMM_JOINING) {
            /* A multi-node communicator's root daemon times the join out and names the missing
             * ranks; this daemon's own deadline is a second later, for a lost root. */
            uint64_t grace = c->x ? 1000000000ull : 0;
            uint64_t deadline = c->created_ns + (uint64_t)c->timeout_ms * 1000000ull + grace;
            if (now >= deadline) {
                char why[COLLD_DETAIL_LEN];
                int off = snprintf(why, sizeof(why), "only %d of %d ranks joined within %d ms; missing ranks:",
                                   c->joined, c->nranks, c->timeout_ms);
                for (int r = 0; r < c->nranks && off < (int)sizeof(why) - 8; r++)
                    if (!c->ranks[r].session && !c->ranks[r].left)
                        off += snprintf(why + off, sizeof(why) - (size_t)off, " %d", r);
                comm_dissolve(d, c, COLLD_ERR_TIMEOUT, -1, why, replies);
            } else if (deadline < next)
                next = deadline;
        }
        c = following;
    }
    return next;
}
