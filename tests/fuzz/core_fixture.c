/*
 * core_fixture.c - the daemon core in-process (see core_fixture.h).
 */
#include "tests/fuzz/core_fixture.h"

#include "common/log.h"
#include "transport/shm/ring.h"
#include "common/util.h"
#include "server/core/counters.h"
#include "server/core/tenant.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* The spy module: the last fault of any communicator, into the fixture. */
static void spy_faulted(colld_daemon_t *d, colld_dcomm_t *c, colld_fault_t how, int rank, const char *detail)
{
    fix_t *f = (fix_t *)d;
    f->faults++;
    f->fault_how = how;
    f->fault_status = c->error;
    f->fault_rank = rank;
    colld_strlcpy(f->fault_detail, detail, sizeof(f->fault_detail));
}

static const colld_comm_hooks_t spy_hooks = {
    .name = "fixture spy",
    .faulted = spy_faulted,
};

/* The daemon's own registry, with the spy after its modules. */
static void compose_registry(fix_t *f)
{
    int n = 0;
    for (const colld_comm_hooks_t *const *m = colld_registry.modules; m && *m && n < 14; m++)
        f->modules[n++] = *m;
    f->modules[n++] = &spy_hooks;
    f->modules[n] = NULL;
    f->reg = colld_registry;
    f->reg.modules = f->modules;
}

int fix_start(fix_t *f, uint64_t fast_path_bytes)
{
    memset(f, 0, sizeof(*f));
    colld_daemon_t *d = &f->d;
    char err[256];
    char arg0[] = "colld-fuzz";
    char *argv[] = { arg0, NULL };
    colld_log_init("colld-fuzz", "none", NULL, NULL, err, sizeof(err)); /* inputs fail by design: no log */
    pthread_mutex_init(&d->lock, NULL);
    d->spare_fd = d->lock_fd = d->epfd = d->wake_fd = -1;
    if (colld_config_load(colld_daemon_config_table, colld_daemon_config_table_len, &d->cfg, 1, argv, err,
                          sizeof(err)) != 0)
        return -1;
    d->cfg.workers = 1;
    d->cfg.fast_path_bytes = fast_path_bytes;
    d->cfg.ring_entries = 16; /* small rings: full rings are reached quickly */
    if (uv_loop_init(&d->loop) != 0 || uv_async_init(&d->loop, &d->async, NULL) != 0)
        return -1;
    compose_registry(f);
    if (colld_daemon_compose(d, &f->reg) < 0 || colld_counters_create(d) < 0 || colld_backends_start(d))
        return -1;
    d->engine_running = true;
    return 0;
}

colld_session_t *fix_session(fix_t *f, uid_t uid, uint8_t fill)
{
    colld_daemon_t *d = &f->d;
    if (f->nsessions >= FIX_MAX_SESSIONS)
        return NULL;
    colld_session_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->daemon = d;
    s->fd = s->shm_fd = s->efd = s->pending_fd = -1;
    s->pid = 1000 + f->nsessions;
    s->uid = uid;
    s->refs = 2; /* the session list's and the fixture's (f->s[] stays valid until fix_stop) */
    s->id = ++d->next_session_id;
    if (colld_session_make_rings(s) < 0) {
        free(s);
        return NULL;
    }
    for (uint32_t i = 0; i < FIX_REGS; i++) {
        colld_reg_t *r = calloc(1, sizeof(*r));
        void *p = mmap(NULL, FIX_REG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (!r || p == MAP_FAILED) {
            free(r);
            if (p != MAP_FAILED)
                munmap(p, FIX_REG_BYTES);
            break;
        }
        memset(p, fill, FIX_REG_BYTES);
        r->id = ++s->next_reg_id;
        r->base = p;
        r->size = FIX_REG_BYTES;
        r->refs = 1;
        r->daemon = d;
        r->next = s->regs;
        s->regs = r;
        s->registered_bytes += FIX_REG_BYTES;
    }
    pthread_mutex_lock(&d->lock);
    s->next = d->sessions;
    d->sessions = s;
    d->nsessions++;
    pthread_mutex_unlock(&d->lock);
    f->s[f->nsessions++] = s;
    return s;
}

colld_dcomm_t *fix_comm(fix_t *f, int nranks, int timeout_ms)
{
    colld_daemon_t *d = &f->d;
    uint8_t uid[COLLD_WIRE_UNIQUE_ID_BYTES];
    colld_dcomm_t *c = NULL;
    if (nranks > f->nsessions)
        return NULL;
    pthread_mutex_lock(&d->lock);
    if (colld_comm_issue_uid(d, f->s[0], uid) == COLLD_OK) {
        for (int r = 0; r < nranks; r++)
            colld_comm_join(d, f->s[r], uid, nranks, r, timeout_ms, "fuzz", false, NULL, NULL);
        for (colld_dcomm_t *x = d->comms; x; x = x->next)
            if (memcmp(x->unique_id, uid, sizeof(uid)) == 0 && x->state == COLLD_COMM_READY)
                c = x;
    }
    colld_daemon_unlock(d);
    return c;
}

bool fix_post(fix_t *f, colld_session_t *s, const colld_wire_sqe_t *sqe)
{
    (void)f;
    /* The client's own head is the shared one: this fixture is the only producer. */
    uint64_t head = COLLD_LOAD_RLX(&s->shm->sq.head);
    int64_t space = colld_ring_space(&s->shm->sq, head, s->entries);
    if (space <= 0)
        return false;
    s->sqes[head & (s->entries - 1)] = *sqe;
    COLLD_STORE_SC(&s->shm->sq.head, head + 1);
    return true;
}

int fix_reap(fix_t *f, colld_session_t *s)
{
    (void)f;
    uint64_t tail = COLLD_LOAD_RLX(&s->shm->cq.tail);
    int64_t avail = colld_ring_avail(&s->shm->cq, tail, s->entries);
    if (avail <= 0)
        return 0;
    COLLD_STORE_SC(&s->shm->cq.tail, tail + (uint64_t)avail);
    return (int)avail;
}

void fix_session_end(fix_t *f, colld_session_t *s)
{
    colld_daemon_t *d = &f->d;
    pthread_mutex_lock(&d->lock);
    if (s->dead) {
        pthread_mutex_unlock(&d->lock);
        return;
    }
    colld_session_forget(s, "the fixture ended it");
    colld_session_unref(s);
    colld_daemon_unlock(d);
}

void fix_stop(fix_t *f)
{
    colld_daemon_t *d = &f->d;
    for (int i = 0; i < f->nsessions; i++)
        fix_session_end(f, f->s[i]);
    /* Collectives of ended sessions finish (and release their references) in the next rounds. */
    for (int i = 0; i < 4 && d->comms; i++)
        colld_engine_run_once(d);
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < f->nsessions; i++)
        colld_session_unref(f->s[i]);
    pthread_mutex_unlock(&d->lock);
    d->engine_running = false;
    colld_engine_run_once(d); /* a stopped engine's round: the backends drain what they still hold */
    colld_backends_stop(d);
    colld_op_free_all(d);
    colld_deadlock_free(d);
    while (d->uids) {
        colld_issued_uid_t *u = d->uids;
        d->uids = u->next;
        free(u);
    }
    colld_counters_destroy(d);
    colld_tenants_free(d);
    colld_policy_free(d);
    uv_close((uv_handle_t *)&d->async, NULL);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    uv_loop_close(&d->loop);
    colld_config_free(colld_daemon_config_table, colld_daemon_config_table_len, &d->cfg);
    pthread_mutex_destroy(&d->lock);
}

colld_wire_sqe_t fix_sqe(const colld_dcomm_t *c, int rank, uint64_t seq, colld_kind_t kind, colld_dtype_t dtype,
                         colld_redop_t op, uint64_t count, int root)
{
    colld_wire_sqe_t sqe = { .seq = seq,
                             .count = count,
                             .comm = c->ranks[rank].handle,
                             .kind = (uint8_t)kind,
                             .dtype = (uint8_t)dtype,
                             .redop = (uint8_t)op,
                             .root = root,
                             .send = { .reg_id = 1, .offset = 0 },
                             .recv = { .reg_id = 2, .offset = 0 } };
    return sqe;
}

int fix_reap_cqes(fix_t *f, colld_session_t *s, colld_wire_cqe_t *out, int max)
{
    (void)f;
    uint64_t tail = COLLD_LOAD_RLX(&s->shm->cq.tail);
    int64_t avail = colld_ring_avail(&s->shm->cq, tail, s->entries);
    int n = 0;
    for (; n < avail && n < max; n++)
        out[n] = s->cqes[(tail + (uint64_t)n) & (s->entries - 1)];
    COLLD_STORE_SC(&s->shm->cq.tail, tail + (uint64_t)n);
    return n;
}

void *fix_reg(colld_session_t *s, uint32_t id)
{
    for (colld_reg_t *r = s->regs; r; r = r->next)
        if (r->id == id)
            return r->base;
    return NULL;
}

bool fix_run_until(fix_t *f, bool (*pred)(void *arg), void *arg, int ms)
{
    uint64_t end = colld_now_ns() + (uint64_t)ms * 1000000ull;
    for (;;) {
        colld_engine_run_once(&f->d);
        if (pred(arg))
            return true;
        if (colld_now_ns() >= end)
            return false;
        struct timespec ts = { 0, 100000 };
        nanosleep(&ts, NULL);
    }
}

void fix_fast_publish(colld_dcomm_t *c, int rank, const colld_wire_sqe_t *call, uint64_t arrival_ns)
{
    colld_wire_fast_slot_t *slot =
        (colld_wire_fast_slot_t *)((char *)c->fast + COLLD_WIRE_FAST_SLOTS_OFFSET(c->nranks) +
                                   ((size_t)rank * COLLD_WIRE_FAST_DEPTH + call->seq % COLLD_WIRE_FAST_DEPTH) *
                                       c->fast_stride);
    __atomic_store_n(&slot->seq, 0, __ATOMIC_RELEASE);
    slot->count = call->count;
    slot->kind = call->kind;
    slot->dtype = call->dtype;
    slot->redop = call->redop;
    slot->flags = 0;
    slot->root = call->root;
    slot->arrival_ns = arrival_ns;
    __atomic_store_n(&slot->seq, call->seq, __ATOMIC_RELEASE);
}
