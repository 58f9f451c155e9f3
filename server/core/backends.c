/*
 * backends.c - what a daemon is composed of (backend.h): its backends and modules, and the calls
 * that tell them of a communicator's life.
 *
 * The lists come from the caller (main.c, or an in-process test, from server/registry.c.in): the
 * core links no backend and no module, it only calls through their tables. A hook of the modules
 * runs before the same hook of the backends, each list in its order.
 */
#include "server/core/daemon.h"

#include "common/util.h"

int colld_daemon_compose(colld_daemon_t *d, const colld_registry_t *reg)
{
    int n = 0;
    while (reg->backends && reg->backends[n])
        n++;
    if (n > COLLD_BACKEND_MAX)
        return -1;
    for (int i = 0; i < n; i++)
        d->backends[i] = (colld_backend_t){ .ops = reg->backends[i], .d = d, .slot = i };
    d->nbackends = n;
    d->modules = reg->modules;
    colld_strlcpy(d->device_none, reg->device_none ? reg->device_none : "", sizeof(d->device_none));
    return 0;
}

colld_backend_t *colld_backends_start(colld_daemon_t *d)
{
    for (int i = 0; i < d->nbackends; i++) {
        colld_backend_t *b = &d->backends[i];
        if (b->ops->start && b->ops->start(b) < 0) {
            for (int j = i - 1; j >= 0; j--) {
                if (d->backends[j].ops->stop)
                    d->backends[j].ops->stop(&d->backends[j]);
                d->backends[j].present = false;
            }
            return b;
        }
    }
    return NULL;
}

void colld_backends_stop(colld_daemon_t *d)
{
    for (int i = d->nbackends - 1; i >= 0; i--) {
        colld_backend_t *b = &d->backends[i];
        if (b->ops->stop)
            b->ops->stop(b);
        b->present = false;
    }
}

colld_backend_t *colld_backend_find(colld_daemon_t *d, const colld_backend_ops_t *ops)
{
    for (int i = 0; i < d->nbackends; i++)
        if (d->backends[i].ops == ops)
            return &d->backends[i];
    return NULL;
}

colld_backend_t *colld_backend_device(colld_daemon_t *d)
{
    for (int i = 0; i < d->nbackends; i++)
        if (d->backends[i].ops->mem_register)
            return &d->backends[i];
    return NULL;
}

colld_backend_t *colld_backend_former(colld_daemon_t *d)
{
    for (int i = 0; i < d->nbackends; i++)
        if (d->backends[i].ops->comm_form)
            return &d->backends[i];
    return NULL;
}

colld_backend_t *colld_backend_claim(colld_daemon_t *d, const colld_dcomm_t *c, const colld_wire_sqe_t *sqe)
{
    for (int i = 0; i < d->nbackends; i++) {
        colld_backend_t *b = &d->backends[i];
        if (b->ops->claims && b->ops->claims(b, c, sqe))
            return b;
    }
    return NULL;
}

/* ============================================================================================
 * A communicator's life: modules first, then backends
 * ========================================================================================== */

/* Call `hook` (a member of colld_comm_hooks_t) of every module and backend that has it. */
#define EACH_HOOK(d, h, hook, call)                                                                                    \
    do {                                                                                                               \
        for (const colld_comm_hooks_t *const *m_ = (d)->modules; m_ && *m_; m_++) {                                    \
            const colld_comm_hooks_t *h = *m_;                                                                         \
            if (h->hook)                                                                                               \
                call;                                                                                                  \
        }                                                                                                              \
        for (int i_ = 0; i_ < (d)->nbackends; i_++) {                                                                  \
            const colld_comm_hooks_t *h = (d)->backends[i_].ops->hooks;                                                \
            if (h && h->hook)                                                                                          \
                call;                                                                                                  \
        }                                                                                                              \
    } while (0)

void colld_hooks_formed(colld_daemon_t *d, colld_dcomm_t *c)
{
    EACH_HOOK(d, h, formed, h->formed(d, c));
}

void colld_hooks_faulted(colld_daemon_t *d, colld_dcomm_t *c, colld_fault_t how, int rank, const char *detail)
{
    EACH_HOOK(d, h, faulted, h->faulted(d, c, how, rank, detail));
}

void colld_hooks_failing(colld_daemon_t *d, colld_dcomm_t *c, colld_status_t st)
{
    EACH_HOOK(d, h, failing, h->failing(d, c, st));
}

void colld_hooks_broken(colld_daemon_t *d, colld_dcomm_t *c)
{
    EACH_HOOK(d, h, broken, h->broken(d, c));
}

void colld_hooks_settle(colld_daemon_t *d, colld_dcomm_t *c)
{
    EACH_HOOK(d, h, settle, h->settle(d, c));
}

bool colld_hooks_judge(colld_daemon_t *d, colld_dcomm_t *c, uint64_t now, uint64_t *deadline)
{
    bool go = true;
    EACH_HOOK(d, h, judge, go = go && h->judge(d, c, now, deadline));
    return go;
}

void colld_hooks_finished(colld_daemon_t *d, colld_dcomm_t *c, colld_op_t *const *ops, uint64_t first_ns,
                          uint64_t start_ns, uint64_t end_ns, colld_status_t st)
{
    EACH_HOOK(d, h, finished, h->finished(d, c, ops, first_ns, start_ns, end_ns, st));
}

void colld_hooks_freed(colld_daemon_t *d, colld_dcomm_t *c)
{
    EACH_HOOK(d, h, freed, h->freed(d, c));
}

void colld_hooks_waiting(colld_daemon_t *d, colld_dcomm_t *c, int rank, uint64_t waited_ns, const char *detail)
{
    EACH_HOOK(d, h, waiting, h->waiting(d, c, rank, waited_ns, detail));
}

int colld_hooks_session_msg(colld_session_t *s, const colld_wire_msg_t *m)
{
    colld_daemon_t *d = s->daemon;
    int rc = -2;
    EACH_HOOK(d, h, session_msg, rc = rc == -2 ? h->session_msg(s, m) : rc);
    return rc;
}

/* ============================================================================================
 * Backends' parts of sessions and descriptors
 * ========================================================================================== */

void colld_backends_stream_failed(colld_daemon_t *d, colld_session_t *s, const colld_wire_sqe_t *sqe, uint64_t id,
                                  colld_status_t st)
{
    for (int i = 0; i < d->nbackends; i++) {
        colld_backend_t *b = &d->backends[i];
        if (b->ops->stream_failed)
            b->ops->stream_failed(b, s, sqe, id, st);
    }
}

void colld_backends_session_free(colld_daemon_t *d, colld_session_t *s)
{
    for (int i = 0; i < d->nbackends; i++) {
        colld_backend_t *b = &d->backends[i];
        if (b->ops->session_free)
            b->ops->session_free(b, s);
    }
}
