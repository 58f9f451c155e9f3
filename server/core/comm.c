/*
 * comm.c - the communicator registry: unique ids, joining at a rank, leaving, breaking.
 *
 * A unique id is issued to a tenant (uid) and names one communicator. The first rank to join
 * creates the communicator; CommInit answers are held back until every rank has joined (or the
 * join times out, or a joined rank's process dies), then all ranks are answered together. All
 * functions here run with daemon->lock held; RPC answers are queued on the daemon
 * (colld_reply_add) and sent when the lock is released.
 *
 * The state machine: JOINING (ranks arrive) -> READY (every rank joined: colld_comm_formed) ->
 * BROKEN (a fault: every queued and later operation fails with the first error) or CLOSING (a rank
 * destroyed its handle: the operations waiting for it fail with PEER_LOST, later ones with
 * INVALID_USAGE; a fault afterwards still becomes the reported error). A JOINING communicator that fails is dissolved: every waiting join is
 * answered with the error. Whatever else must happen at each step (the fast area, the flight
 * recorder, the events, the metrics, the backends' state) is done by the hooks of the modules and
 * backends the daemon is composed of (backend.h): this file names none of them.
 *
 * What a tenant can make the daemon hold is charged to it (tenant.c): one membership per joined
 * rank (max-comms-per-tenant) and, while a communicator forms, its nranks
 * (max-joining-ranks-per-tenant). A forming single-node communicator holds memory only for the
 * ranks that joined; its member array and flight recorder are made when the last rank joins.
 * Teardown is linear in what a session held: communicators unlink in O(1).
 */
#include "server/core/daemon.h"
#include "server/core/tenant.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_UIDS_PER_SESSION 1024

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
    colld_backend_t *f = colld_backend_former(d); /* a multi-node id when this daemon listens for peers */
    if (f && f->ops->stamp_uid)
        f->ops->stamp_uid(f, u->bytes);
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

/* Take an issued unique id for the communicator it names (see daemon.h). */
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

/* The lowest free handle of a session, growing the table; 0 without memory. The slot is not
 * taken: the caller stores the member in it. The hint makes a run of joins linear. */
static uint32_t handle_free_slot(colld_session_t *s)
{
    for (uint32_t h = COLLD_MAX(s->handle_hint, 1u); h < s->nhandles; h++)
        if (!s->handles[h]) {
            s->handle_hint = h;
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
    s->handle_hint = h;
    return h;
}

/* Whether rank r has joined here (it may have left since). */
static bool rank_joined(const colld_dcomm_t *c, int r)
{
    if (c->ranks)
        return c->ranks[r].session || c->ranks[r].left;
    return (c->joined_mask[r / 64] >> (r % 64)) & 1u;
}

/* Give back the joining ranks charged when the communicator was created: it formed or is gone. */
static void joining_settle(colld_daemon_t *d, colld_dcomm_t *c)
{
    if (!c->joining_charged)
        return;
    colld_tenant_uncharge(d, c->tenant, COLLD_LIMIT_JOINING_RANKS, (uint64_t)c->nranks);
    c->joining_charged = false;
}

/* Detach a member from its session: the handle is freed, the membership given back to the
 * tenant, and the rank counts as gone. */
static void member_detach(colld_member_t *m)
{
    colld_session_t *s = m->session;
    if (!s)
        return;
    if (m->handle < s->nhandles && s->handles[m->handle] == m) {
        s->handles[m->handle] = NULL;
        if (m->handle < s->handle_hint)
            s->handle_hint = m->handle;
    }
    s->ncomms--;
    colld_tenant_uncharge(s->daemon, s->uid, COLLD_LIMIT_COMMS, 1);
    m->session = NULL;
    m->left = true;
    if (m->notify) {
        m->notify = false;
        m->comm->notices_pending--;
    }
    m->comm->present--;
}

/* Free the member storage of a communicator. */
static void comm_free_members(colld_dcomm_t *c)
{
    for (int i = 0; i < c->njoiners; i++)
        free(c->joiners[i]);
    free(c->joiners);
    free(c->joined_mask);
    free(c->ranks);
    c->joiners = NULL;
    c->joined_mask = NULL;
    c->ranks = NULL;
    c->njoiners = 0;
}

/* Free a communicator once no member and no executing collective refers to it. */
void colld_comm_unref(colld_daemon_t *d, colld_dcomm_t *c)
{
    if (--c->refs > 0)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else if (d->comms == c)
        d->comms = c->next;
    if (c->next)
        c->next->prev = c->prev;
    joining_settle(d, c);
    LOG_INFO(COLL, "communicator %llu (%s) freed", (unsigned long long)c->id, c->name);
    colld_hooks_freed(d, c);
    colld_p2p_comm_free(c);
    comm_free_members(c);
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

/* Fail every queued collective of a member, and its point-to-point operations: all of them, or
 * (`all` false: the communicator only closes because a rank left) those with a rank that left
 * and those on GPU streams.
 * Those whose transfer runs complete when it ends. */
static void member_fail_queue(colld_dcomm_t *c, colld_member_t *m, colld_status_t st, bool all)
{
    while (m->head) {
        colld_op_t *op = m->head;
        m->head = op->next;
        c->ops_failed++;
        colld_op_retire(op, st);
    }
    m->tail = NULL;
    colld_p2p_fail_queue(c, m, st, all);
}

/* A communicator that has not formed cannot be repaired: answer every waiting join with the
 * error and dissolve it. */
static void comm_dissolve(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st, int rank, const char *detail)
{
    c->error = st;
    colld_strlcpy(c->error_detail, detail, sizeof(c->error_detail));
    colld_hooks_faulted(d, c, COLLD_FAULT_DISSOLVED, rank, detail);
    for (int i = 0; i < colld_comm_nslots(c); i++) {
        colld_member_t *m = colld_comm_slot(c, i);
        colld_reply_add(d, m->join_call, st, detail);
        m->join_call = NULL;
        member_detach(m);
    }
    joining_settle(d, c);
    LOG_INFO(COLL, "communicator %llu (%s) dissolved before forming: %s", (unsigned long long)c->id, c->name,
             detail);
    comm_maybe_free(d, c);
}

/* Break a communicator: record the first error, fail queued operations; later ones fail fast. */
void colld_comm_break(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st, int rank, const char *detail)
{
    if (c->state == COLLD_COMM_JOINING) {
        comm_dissolve(d, c, st, rank, detail);
        return;
    }
    /* The first fault wins; a normal leave (INVALID_USAGE) only closes, and a fault after it
     * still becomes the reported error. */
    bool closing = st == COLLD_ERR_INVALID_USAGE;
    if (c->state == COLLD_COMM_READY || (c->state == COLLD_COMM_CLOSING && !closing)) {
        c->error = st;
        colld_strlcpy(c->error_detail, detail, sizeof(c->error_detail));
        c->state = closing ? COLLD_COMM_CLOSING : COLLD_COMM_BROKEN;
        /* The events, the metrics and (spanning nodes) the other nodes' ranks learn it. */
        colld_hooks_faulted(d, c, closing ? COLLD_FAULT_CLOSED : COLLD_FAULT_BROKEN, rank, detail);
        if (!closing) {
            /* At most a line a second: a tenant can break communicators as fast as it makes them
             * (every fault is still in the events, the flight recorder and the metrics). */
            COLLD_LOG_RL(COLLD_LOG_WARN, COLLD_SUB_COLL, 1000, "communicator %llu (%s) broken: %s: %s",
                         (unsigned long long)c->id, c->name, colld_status_name(st), detail);
            /* Ranks with nothing in flight learn of it too (their async-error query). */
            for (int r = 0; r < c->nranks; r++)
                if (c->ranks[r].session && !c->ranks[r].notify) {
                    c->ranks[r].notify = true;
                    c->notices_pending++;
                }
        }
    }
    colld_status_t waiting = colld_comm_waiting_status(c);
    colld_hooks_failing(d, c, waiting); /* the flight recorder notes who was waiting */
    /* A closing communicator keeps the sends and receives between the ranks still there. */
    for (int r = 0; r < c->nranks; r++)
        member_fail_queue(c, &c->ranks[r], waiting, c->state != COLLD_COMM_CLOSING);
    colld_complete_notices(c);
    colld_hooks_broken(d, c); /* ranks waiting beside the engine (fast area, GPU streams) are released */
}

/* Abort: every rank's pending and later operations fail with ABORTED. The handles stay valid
 * until each rank destroys its own. */
void colld_dcomm_abort(colld_daemon_t *d, colld_dcomm_t *c, int rank, const char *who)
{
    char why[COLLD_DETAIL_LEN];
    snprintf(why, sizeof(why), "communicator %llu aborted by %s", (unsigned long long)c->id, who);
    LOG_INFO(COLL, "%s", why);
    colld_comm_break(d, c, COLLD_ERR_ABORTED, rank, why);
}

/* Create a communicator for the first local join (lock held): charged to the tenant's joining
 * ranks until it forms; a single-node one holds room for a few joiners, not nranks members, and
 * one whose unique id names another daemon as root is formed by the backend that forms
 * communicators spanning nodes. Returns it (linked into daemon->comms), or NULL with err. */
static colld_dcomm_t *comm_create(colld_daemon_t *d, colld_session_t *s, const uint8_t *uid, bool multi_node,
                                  int nranks, int timeout_ms, const char *name, colld_err_t *err)
{
    colld_backend_t *former = multi_node ? colld_backend_former(d) : NULL;
    if (colld_tenant_charge(d, s->uid, COLLD_LIMIT_JOINING_RANKS, (uint64_t)nranks, err) != COLLD_OK)
        return NULL;
    if (multi_node && !former) {
        colld_err_set(err, COLLD_ERR_NOT_SUPPORTED,
                      "the unique id was made for a multi-node communicator; this daemon serves single-node "
                      "communicators only");
        goto fail;
    }
    /* A multi-node id is checked by its root daemon (it may be this one) when the join reaches
     * it; a local one must have been issued here. */
    colld_issued_uid_t *u = multi_node ? NULL : uid_take(d, uid, s->uid);
    if (!u && !multi_node) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      "unknown unique id: not issued by this daemon to this user (get it with "
                      "colld_get_unique_id on the same host)");
        goto fail;
    }
    if (u && u->owner)
        u->owner->nuids--;
    free(u);
    colld_dcomm_t *c = calloc(1, sizeof(*c));
    if (!c)
        goto nomem;
    c->nranks = nranks;
    c->tenant = s->uid;
    c->joining_charged = true;
    if (multi_node) {
        c->ranks = calloc((size_t)nranks, sizeof(*c->ranks));
        for (int r = 0; c->ranks && r < nranks; r++) {
            c->ranks[r].comm = c;
            c->ranks[r].rank = r;
        }
    } else {
        c->joiners_cap = COLLD_MIN(nranks, 4);
        c->joiners = calloc((size_t)c->joiners_cap, sizeof(*c->joiners));
        c->joined_mask = calloc((size_t)nranks / 64 + 1, sizeof(*c->joined_mask));
    }
    if (multi_node ? !c->ranks : !c->joiners || !c->joined_mask) {
        comm_free_members(c);
        free(c);
        goto nomem;
    }
    c->id = ++d->next_comm_id;
    memcpy(c->unique_id, uid, sizeof(c->unique_id));
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
    if (former) {
        c->former = former;
        if (former->ops->comm_form(former, c, err) < 0) {
            comm_free_members(c);
            free(c);
            goto fail;
        }
    }
    c->next = d->comms;
    if (d->comms)
        d->comms->prev = c;
    d->comms = c;
    LOG_INFO(COLL, "communicator %llu (%s) created: %d ranks, timeout %d ms", (unsigned long long)c->id, c->name,
             nranks, timeout_ms);
    return c;
nomem:
    colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
fail:
    colld_tenant_uncharge(d, s->uid, COLLD_LIMIT_JOINING_RANKS, (uint64_t)nranks);
    return NULL;
}

/* The member a joining rank takes (lock held): its slot by rank in a multi-node communicator, a
 * new joiner record in a forming single-node one (`fresh`, allocated by the caller, is used and
 * set to NULL). NULL without memory. */
static colld_member_t *member_take(colld_dcomm_t *c, int rank, colld_member_t **fresh)
{
    if (c->ranks)
        return &c->ranks[rank];
    if (c->njoiners == c->joiners_cap) {
        int cap = COLLD_MIN(c->joiners_cap * 2, c->nranks);
        colld_member_t **t = realloc(c->joiners, (size_t)cap * sizeof(*t));
        if (!t)
            return NULL;
        c->joiners = t;
        c->joiners_cap = cap;
    }
    colld_member_t *m = *fresh;
    *fresh = NULL;
    m->comm = c;
    m->rank = rank;
    c->joiners[c->njoiners++] = m;
    c->joined_mask[rank / 64] |= 1ull << (rank % 64);
    return m;
}

/* Every rank of a single-node communicator has joined: make its member array by rank and move
 * the joiners there (their sessions' handles follow). Returns 0 or -1 (no memory: it stays as it
 * is). */
static int comm_densify(colld_dcomm_t *c)
{
    if (c->ranks)
        return 0;
    colld_member_t *ranks = calloc((size_t)c->nranks, sizeof(*ranks));
    if (!ranks)
        return -1;
    for (int r = 0; r < c->nranks; r++) {
        ranks[r].comm = c;
        ranks[r].rank = r;
    }
    for (int i = 0; i < c->njoiners; i++) {
        colld_member_t *j = c->joiners[i];
        colld_member_t *m = &ranks[j->rank];
        *m = *j;
        if (m->session && m->handle < m->session->nhandles && m->session->handles[m->handle] == j)
            m->session->handles[m->handle] = m;
        free(j);
    }
    free(c->joiners);
    free(c->joined_mask);
    c->joiners = NULL;
    c->joined_mask = NULL;
    c->njoiners = c->joiners_cap = 0;
    c->ranks = ranks;
    return 0;
}

/* Join, step 1: the arguments alone (nranks, rank, timeout, name). COLLD_OK or the error. */
static colld_status_t join_check_args(int nranks, int rank, int timeout_ms, const char *name, colld_err_t *err)
{
    char why[96];
    if (nranks < 1 || nranks > COLLD_MAX_RANKS)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "nranks %d is out of range (1..%d)", nranks,
                             COLLD_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "rank %d is out of range for nranks %d (0..%d)", rank,
                             nranks, nranks - 1);
    if (timeout_ms < 0)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "timeout_ms %d is negative", timeout_ms);
    if (name && !colld_str_check(name, COLLD_NAME_LEN - 1, why, sizeof(why)))
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "communicator name refused: %s (a name is at most %d bytes of printable UTF-8, no "
                             "control or formatting characters)",
                             why, COLLD_NAME_LEN - 1);
    return COLLD_OK;
}

/* Join, step 2: the timeout a communicator gets: the one asked for (0: --timeout-ms), capped by
 * --max-timeout-ms and the tenant's policy. */
static int join_timeout(const colld_daemon_t *d, uid_t uid, int timeout_ms)
{
    if (timeout_ms == 0)
        timeout_ms = (int)d->cfg.timeout_ms;
    if (timeout_ms > d->cfg.max_timeout_ms)
        timeout_ms = (int)d->cfg.max_timeout_ms; /* the operator's cap */
    int tenant_cap = colld_policy_cap(d, uid);
    if (tenant_cap > 0 && timeout_ms > tenant_cap)
        timeout_ms = tenant_cap; /* the tenant's policy */
    return timeout_ms;
}

/* Join, step 3: the communicator of this tenant and unique id that earlier ranks made (NULL: none
 * yet), checked against this join: still forming, the same nranks, the rank not taken. */
static colld_status_t join_find(colld_daemon_t *d, colld_session_t *s, const uint8_t *uid, int nranks, int rank,
                                colld_dcomm_t **out, colld_err_t *err)
{
    colld_dcomm_t *c = NULL;
    *out = NULL;
    if (s->ncomms >= (unsigned)d->cfg.max_comms_per_session)
        return colld_err_set(err, COLLD_ERR_QUOTA_EXCEEDED,
                             "this process is at its limit max-comms-per-session = %lld (holds %u)",
                             (long long)d->cfg.max_comms_per_session, s->ncomms);
    for (colld_dcomm_t *x = d->comms; x; x = x->next)
        if (x->tenant == s->uid && memcmp(x->unique_id, uid, sizeof(x->unique_id)) == 0) {
            c = x;
            break;
        }
    if (c && c->state != COLLD_COMM_JOINING)
        return colld_err_set(err, COLLD_ERR_INVALID_USAGE,
                             "unique id already used by communicator %llu, which has formed",
                             (unsigned long long)c->id);
    if (c && c->nranks != nranks)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                             "nranks %d differs from %d given by the ranks that joined first", nranks, c->nranks);
    if (c && rank_joined(c, rank))
        return colld_err_set(err, COLLD_ERR_INVALID_USAGE, "rank %d of communicator %llu already joined (pid %d)",
                             rank, (unsigned long long)c->id, (int)colld_comm_rank_pid(c, rank));
    *out = c;
    return COLLD_OK;
}

/* Join, step 5: the rank is a member now; the communicator forms when the last one came (spanning
 * nodes: when the root daemon says so). */
static void join_complete(colld_daemon_t *d, colld_dcomm_t *c, colld_member_t *m)
{
    if (c->former) {
        c->former->ops->rank_joined(c->former, c, m); /* formed when the root daemon has every rank */
        return;
    }
    if (c->joined < c->nranks)
        return;
    if (comm_densify(c) < 0) {
        comm_dissolve(d, c, COLLD_ERR_NO_MEMORY, -1, "daemon out of memory while the communicator formed");
        return;
    }
    colld_comm_formed(d, c);
}

/* Join rank `rank` of the communicator named by `uid`. Answers now on error; otherwise the answer
 * comes when the last rank joins. The name is the tenant's: it must be printable UTF-8 of at most
 * COLLD_NAME_LEN - 1 bytes (it is shown to operators, logged, and sent in every Status and event),
 * else the join is refused with INVALID_ARGUMENT saying what is wrong. */
colld_status_t colld_comm_join(colld_daemon_t *d, colld_session_t *s, const uint8_t *uid, int nranks, int rank,
                               int timeout_ms, const char *name, unsigned checks, colld_rpc_call_t *call,
                               colld_err_t *refusal)
{
    colld_err_t local = COLLD_ERR_INIT, *err = refusal ? refusal : &local;
    colld_dcomm_t *c = NULL;
    colld_member_t *fresh = NULL;
    bool charged = false;

    colld_err_clear(err);
    if (join_check_args(nranks, rank, timeout_ms, name, err) != COLLD_OK)
        goto fail;
    timeout_ms = join_timeout(d, s->uid, timeout_ms);
    if (join_find(d, s, uid, nranks, rank, &c, err) != COLLD_OK)
        goto fail;
    char root_addr[COLLD_WIRE_UNIQUE_ID_BYTES];
    bool multi_node = c ? colld_comm_multi_node(c) : colld_uid_root_addr(uid, root_addr, sizeof(root_addr)) != NULL;
    /* Step 4: everything that can fail for want of memory or quota comes before anything changes. */
    uint32_t h = handle_free_slot(s);
    if (!multi_node)
        fresh = calloc(1, sizeof(*fresh));
    if (!h || (!multi_node && !fresh)) {
        colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
        goto fail;
    }
    if (colld_tenant_charge(d, s->uid, COLLD_LIMIT_COMMS, 1, err) != COLLD_OK)
        goto fail;
    charged = true;
    if (!c && !(c = comm_create(d, s, uid, multi_node, nranks, timeout_ms, name, err)))
        goto fail;
    colld_member_t *m = member_take(c, rank, &fresh);
    if (!m) {
        colld_err_set(err, COLLD_ERR_NO_MEMORY, "daemon out of memory");
        goto fail;
    }
    s->handles[h] = m;
    m->session = s;
    m->handle = h;
    m->pid = s->pid;
    m->next_seq = 1;
    m->join_call = call;
    s->ncomms++;
    c->joined++;
    c->present++;
    /* any rank's request holds for the whole communicator */
    c->nan_check |= (checks & COLLD_JOIN_NAN_CHECK) != 0;
    c->verify |= (checks & COLLD_JOIN_VERIFY) != 0 || colld_policy_verify(d, c->tenant); /* collctl policy */
    join_complete(d, c, m);
    return COLLD_OK;
fail:
    free(fresh);
    if (charged)
        colld_tenant_uncharge(d, s->uid, COLLD_LIMIT_COMMS, 1);
    LOG_INFO_RL(COLL, "pid %d: join refused: %s", (int)s->pid, err->msg);
    colld_reply_add(d, call, err->status, err->msg);
    return err->status;
}

/* Every rank has joined: the communicator is ready; answer the joins (lock held). What else it
 * needs (its flight recorder, its fast area, ...) the modules make in their `formed` hooks. */
void colld_comm_formed(colld_daemon_t *d, colld_dcomm_t *c)
{
    c->state = COLLD_COMM_READY;
    joining_settle(d, c);
    colld_hooks_formed(d, c);
    LOG_INFO(COLL, "communicator %llu (%s) formed with %d ranks", (unsigned long long)c->id, c->name, c->nranks);
    for (int r = 0; r < c->nranks; r++) {
        colld_member_t *x = &c->ranks[r];
        colld_reply_t *reply = colld_reply_add(d, x->join_call, COLLD_OK, "");
        if (reply) {
            reply->handle = x->handle;
            reply->comm_id = c->id;
            reply->timeout_ms = c->timeout_ms;
        }
        x->join_call = NULL;
    }
}

/* A rank of a formed communicator leaves (a destroyed handle, or its process gone): what the ranks
 * finished beside the engine is settled, its queued operations fail with st, and the
 * communicator breaks (or closes) with `why` for the others (lock held). */
static void member_leave(colld_daemon_t *d, colld_member_t *m, colld_status_t st, const char *why)
{
    colld_dcomm_t *c = m->comm;
    colld_hooks_settle(d, c);
    if (c->state == COLLD_COMM_READY)
        colld_hooks_failing(d, c, st);
    member_fail_queue(c, m, st, true);
    member_detach(m);
    colld_comm_break(d, c, st, m->rank, why);
    comm_maybe_free(d, c);
}

/* CommDestroy: the rank leaves. Peers that post later collectives, or sends to or receives from
 * it, get INVALID_USAGE at once instead of waiting for a rank that will never come; sends and
 * receives between the other ranks go on. */
colld_status_t colld_comm_leave(colld_daemon_t *d, colld_session_t *s, uint32_t handle, colld_err_t *err)
{
    colld_member_t *m = colld_comm_member(s, handle);
    if (!m)
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "unknown communicator handle %u", handle);
    colld_dcomm_t *c = m->comm;
    char why[COLLD_DETAIL_LEN];
    if (c->state == COLLD_COMM_JOINING) {
        snprintf(why, sizeof(why), "rank %d (pid %d) left before all ranks joined", m->rank, (int)s->pid);
        comm_dissolve(d, c, COLLD_ERR_ABORTED, m->rank, why);
        return COLLD_OK;
    }
    snprintf(why, sizeof(why), "rank %d (pid %d) has destroyed its handle of communicator %llu", m->rank,
             (int)s->pid, (unsigned long long)c->id);
    member_leave(d, m, COLLD_ERR_INVALID_USAGE, why);
    return COLLD_OK;
}

/* A session ended: each of its ranks is lost to its communicators. */
void colld_comm_session_gone(colld_daemon_t *d, colld_session_t *s)
{
    for (uint32_t h = 1; h < s->nhandles; h++) {
        colld_member_t *m = s->handles[h];
        if (!m)
            continue;
        colld_dcomm_t *c = m->comm;
        char why[COLLD_DETAIL_LEN];
        if (c->state == COLLD_COMM_JOINING) {
            snprintf(why, sizeof(why), "rank %d (pid %d) disconnected before all ranks joined", m->rank, (int)s->pid);
            comm_dissolve(d, c, COLLD_ERR_PEER_LOST, m->rank, why);
            continue;
        }
        snprintf(why, sizeof(why), "rank %d (pid %d) disconnected: its process exited or was killed", m->rank,
                 (int)s->pid);
        member_leave(d, m, COLLD_ERR_PEER_LOST, why);
    }
}

/* Dissolve communicators whose ranks did not all join in time. Returns the next deadline. */
uint64_t colld_comm_check_join_timeouts(colld_daemon_t *d, uint64_t now)
{
    uint64_t next = UINT64_MAX;
    colld_dcomm_t *c = d->comms;
    while (c) {
        colld_dcomm_t *following = c->next;
        if (c->state == COLLD_COMM_JOINING) {
            /* A multi-node communicator's root daemon times the join out and names the missing
             * ranks; this daemon's own deadline comes its former's grace later, for a lost root. */
            uint64_t grace = c->former ? c->former->ops->join_grace_ns : 0;
            uint64_t deadline = c->created_ns + (uint64_t)c->timeout_ms * 1000000ull + grace;
            if (now >= deadline) {
                char why[COLLD_DETAIL_LEN];
                int off = snprintf(why, sizeof(why), "only %d of %d ranks joined within %d ms; missing ranks:",
                                   c->joined, c->nranks, c->timeout_ms);
                for (int r = 0; r < c->nranks && off < (int)sizeof(why) - 8; r++)
                    if (!rank_joined(c, r))
                        off += snprintf(why + off, sizeof(why) - (size_t)off, " %d", r);
                comm_dissolve(d, c, COLLD_ERR_TIMEOUT, -1, why);
            } else if (deadline < next)
                next = deadline;
        }
        c = following;
    }
    return next;
}

/* ============================================================================================
 * Unique ids that name a root daemon (communicators spanning nodes; proto/wire.h)
 * ========================================================================================== */

/* The root daemon's address in a multi-node unique id (see daemon.h). */
const char *colld_uid_root_addr(const uint8_t *uid, char *buf, size_t len)
{
    if (memcmp(uid + COLLD_WIRE_UID_RANDOM_BYTES, COLLD_WIRE_UID_NET_MAGIC, 4) != 0)
        return NULL;
    const char *a = (const char *)uid + COLLD_WIRE_UID_ADDR_OFFSET;
    size_t n = strnlen(a, COLLD_WIRE_UNIQUE_ID_BYTES - COLLD_WIRE_UID_ADDR_OFFSET);
    if (n == 0 || n >= COLLD_WIRE_UNIQUE_ID_BYTES - COLLD_WIRE_UID_ADDR_OFFSET || n >= len)
        return NULL;
    memcpy(buf, a, n);
    buf[n] = '\0';
    return buf;
}
