/*
 * ctl_listen.c - connections to the control socket (<socket>.rpc) and the control plane's
 * self-probe.
 *
 * The daemon accepts the control socket itself (a listener of fds.c) instead of letting gRPC bind
 * it. That is how it learns who connected (SO_PEERCRED), bounds connections per tenant
 * (max-rpc-conns-per-tenant, charged in tenant.c) and in all (max-rpc-conns, of which the last few
 * are kept for operators), survives descriptor exhaustion (a gRPC listener stops accepting for
 * good after one EMFILE), and closes connections that start no call (rpc-handshake-ms). An admitted
 * connection is handed to the gRPC server (colld_rpc_server_add_conn). A refused one is handed over
 * too, with its refusal, so that its client's first call fails RESOURCE_EXHAUSTED with a message
 * naming the limit (libcolld returns COLLD_ERR_QUOTA_EXCEEDED); it is closed REFUSED_LINGER_MS
 * later, and at most REFUSED_MAX are held like that at once (more are closed at once).
 *
 * gRPC owns a connection's descriptor and says nothing when it is done with it. The daemon keeps
 * a duplicate and watches it for the hang-up: gRPC shuts a connection's socket down before it
 * closes it, and a peer that closes hangs it up as well; either way the duplicate sees it, and the
 * connection is uncharged, forgotten and its duplicate closed. Shutting the duplicate down is how
 * the daemon ends a connection itself: gRPC sees the socket end and lets it go.
 *
 * The self-probe thread makes a real call (Attach with an empty request, answered by the control
 * handlers under daemon->lock) on a new connection every self-probe-ms. After
 * self-probe-failures failures in a row it logs why and ends the process with status 3, so the
 * supervisor restarts a daemon whose control plane no longer answers. A probe that cannot even
 * create its socket for lack of descriptors is skipped, not counted: exhaustion is refused and
 * survived (fds.c), and restarting would end every tenant's jobs.
 *
 * Everything but the probe runs on the loop thread.
 */
#include "server/control/control.h"

#include "server/core/daemon.h"
#include "server/core/tenant.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define REFUSED_LINGER_MS 2000 /* a refused connection is closed this long after it was accepted */
#define REFUSED_MAX 64         /* refused connections held at once to tell their clients why */
#define PROBE_TIMEOUT_MS 5000  /* one self-probe call */
#define PROBE_EXIT_STATUS 3
#define PROBE_METHOD "/colld.v1.Colld/Attach"

typedef struct ctl_conn {
    colld_ctl_t *ctl;
    int fd;                 /* gRPC's descriptor (its number names the connection) */
    int dupfd;              /* the daemon's duplicate, watched for the hang-up */
    uint64_t id;            /* the gRPC wrapper's id of the connection */
    uid_t uid;
    pid_t pid;
    bool charged;           /* holds a unit of its tenant's COLLD_LIMIT_RPC_CONNS */
    bool refused;
    bool ending;            /* closing its handles */
    int open_handles;
    uv_poll_t poll;
    uv_timer_t timer;       /* handshake deadline, or the linger of a refused connection */
    struct ctl_conn *prev, *next;
} ctl_conn_t;

struct colld_ctl {
    colld_daemon_t *d;
    colld_listener_t l;
    ctl_conn_t *conns;
    unsigned admitted;      /* connections served (counted against max-rpc-conns) */
    unsigned refused_held;
    uint64_t refused_total;
    /* the self-probe thread */
    pthread_t probe;
    bool probe_started;
    bool probe_stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* ============================================================================================
 * Connections
 * ========================================================================================== */

static void conn_on_close(uv_handle_t *h)
{
    ctl_conn_t *c = h->data;
    if (--c->open_handles > 0)
        return;
    if (c->dupfd >= 0)
        close(c->dupfd);
    free(c);
}

/* The connection is over (hang-up seen, or the daemon stops): give back what it held. */
static void conn_end(ctl_conn_t *c, const char *why)
{
    colld_ctl_t *ctl = c->ctl;
    colld_daemon_t *d = ctl->d;
    if (c->ending)
        return;
    c->ending = true;
    LOG_DEBUG(RPC, "control connection of pid %d uid %u ended: %s", (int)c->pid, (unsigned)c->uid, why);
    if (d->rpc)
        colld_rpc_server_conn_forget(d->rpc, c->fd, c->id);
    if (c->charged) {
        pthread_mutex_lock(&d->lock);
        colld_tenant_uncharge(d, c->uid, COLLD_LIMIT_RPC_CONNS, 1);
        pthread_mutex_unlock(&d->lock);
    }
    if (c->refused)
        ctl->refused_held--;
    else
        ctl->admitted--;
    if (c->prev)
        c->prev->next = c->next;
    else
        ctl->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    uv_poll_stop(&c->poll);
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->poll, conn_on_close);
    uv_close((uv_handle_t *)&c->timer, conn_on_close);
}

/* The duplicate hung up (or failed): gRPC or the peer ended the connection. */
static void conn_on_poll(uv_poll_t *h, int status, int events)
{
    ctl_conn_t *c = h->data;
    (void)events;
    conn_end(c, status < 0 ? uv_strerror(status) : "hang-up");
}

/* Deadline: a connection that started no call yet, or a refused one, is shut down (gRPC then
 * closes it and the duplicate sees the hang-up). */
static void conn_on_timer(uv_timer_t *t)
{
    ctl_conn_t *c = t->data;
    colld_daemon_t *d = c->ctl->d;
    uint64_t total = 0;
    unsigned active = 0;
    if (!c->refused && d->rpc && colld_rpc_server_conn_calls(d->rpc, c->fd, c->id, &total, &active) == 0 &&
        total > 0)
        return; /* it is in use: no deadline any more */
    if (!c->refused)
        LOG_INFO_RL(RPC, "closing a control connection of pid %d uid %u: no call within %lld ms (rpc-handshake-ms)",
                    (int)c->pid, (unsigned)c->uid, (long long)d->cfg.rpc_handshake_ms);
    (void)SYS_CHECK_EXPECT(RPC, ENOTCONN, shutdown(c->dupfd, SHUT_RDWR));
}

/* Admit a connection (lock held): the global cap (the last few kept for operators) and the
 * tenant's limit, which operators are not held to. Returns NULL, or why it is refused (in buf). */
static const char *ctl_admit(colld_ctl_t *ctl, uid_t uid, bool *charged, char *buf, size_t len)
{
    colld_daemon_t *d = ctl->d;
    bool admin = colld_uid_is_admin(uid);
    unsigned max = (unsigned)d->cfg.max_rpc_conns, reserve = colld_admin_reserve(d->cfg.max_rpc_conns);
    *charged = false;
    if (ctl->admitted >= max || (!admin && ctl->admitted + reserve >= max)) {
        snprintf(buf, len,
                 "the daemon is at its limit max-rpc-conns = %u (the last %u kept for operators); try again later",
                 max, reserve);
        return buf;
    }
    if (admin)
        return NULL;
    colld_err_t err = COLLD_ERR_INIT;
    if (colld_tenant_charge(d, uid, COLLD_LIMIT_RPC_CONNS, 1, &err) != COLLD_OK) {
        colld_strlcpy(buf, err.msg, len);
        return buf;
    }
    *charged = true;
    return NULL;
}

/* A new connection on the control socket: admit or refuse it, watch a duplicate, hand it to gRPC. */
static void ctl_on_accept(colld_listener_t *l, int fd, uid_t uid, gid_t gid, pid_t pid)
{
    colld_daemon_t *d = l->d;
    colld_ctl_t *ctl = d->ctl;
    char why[COLLD_DETAIL_LEN];
    bool charged;
    ctl_conn_t *c = NULL;
    (void)gid;

    pthread_mutex_lock(&d->lock);
    const char *refusal = ctl_admit(ctl, uid, &charged, why, sizeof(why));
    pthread_mutex_unlock(&d->lock);
    if (refusal) {
        ctl->refused_total++;
        LOG_WARN_RL(RPC, "refusing a control connection of pid %d uid %u: %s", (int)pid, (unsigned)uid, refusal);
        if (ctl->refused_held >= REFUSED_MAX)
            goto drop; /* too many already wait to be told: close this one at once */
    }
    c = calloc(1, sizeof(*c));
    if (!c)
        goto drop;
    *c = (ctl_conn_t){ .ctl = ctl, .fd = fd, .dupfd = fcntl(fd, F_DUPFD_CLOEXEC, 0), .uid = uid, .pid = pid,
                       .charged = charged, .refused = refusal != NULL };
    if (c->dupfd < 0) {
        LOG_WARN_RL(RPC, "cannot watch a control connection: %s; closing it", strerror(errno));
        goto drop;
    }
    c->poll.data = c;
    c->timer.data = c;
    if (uv_poll_init(&d->loop, &c->poll, c->dupfd) < 0)
        goto drop;
    uv_timer_init(&d->loop, &c->timer);
    c->open_handles = 2;
    c->id = colld_rpc_server_add_conn(d->rpc, fd, uid, pid, refusal);
    fd = -1; /* gRPC's now */
    c->next = ctl->conns;
    if (ctl->conns)
        ctl->conns->prev = c;
    ctl->conns = c;
    if (c->refused)
        ctl->refused_held++;
    else
        ctl->admitted++;
    if (!c->id) {
        conn_end(c, "the gRPC server cannot take it");
        return;
    }
    uv_poll_start(&c->poll, UV_DISCONNECT, conn_on_poll);
    uv_timer_start(&c->timer, conn_on_timer, c->refused ? REFUSED_LINGER_MS : (uint64_t)d->cfg.rpc_handshake_ms, 0);
    return;
drop:
    if (c && c->dupfd >= 0)
        close(c->dupfd);
    free(c);
    if (fd >= 0)
        close(fd);
    if (charged) {
        pthread_mutex_lock(&d->lock);
        colld_tenant_uncharge(d, uid, COLLD_LIMIT_RPC_CONNS, 1);
        pthread_mutex_unlock(&d->lock);
    }
}

/* ============================================================================================
 * The self-probe
 * ========================================================================================== */

/* Sleep for ms unless stopped. Returns true when stopped. */
static bool probe_sleep(colld_ctl_t *ctl, int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&ctl->mu);
    while (!ctl->probe_stop && pthread_cond_timedwait(&ctl->cv, &ctl->mu, &ts) == 0)
        ;
    bool stop = ctl->probe_stop;
    pthread_mutex_unlock(&ctl->mu);
    return stop;
}

static void *probe_main(void *arg)
{
    colld_ctl_t *ctl = arg;
    colld_daemon_t *d = ctl->d;
    int64_t failures = 0;
    char why[COLLD_DETAIL_LEN];

    while (!probe_sleep(ctl, d->cfg.self_probe_ms)) {
        int t = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (t < 0) {
            LOG_WARN_RL(RPC, "self-probe skipped: cannot create a socket: %s", strerror(errno));
            continue;
        }
        close(t);
        if (colld_rpc_probe(d->rpc_addr, PROBE_METHOD, PROBE_TIMEOUT_MS, why, sizeof(why)) == 0) {
            if (failures)
                LOG_WARN(RPC, "self-probe: the control plane answers again after %lld failed probe(s)",
                         (long long)failures);
            failures = 0;
            continue;
        }
        pthread_mutex_lock(&ctl->mu);
        bool stop = ctl->probe_stop;
        pthread_mutex_unlock(&ctl->mu);
        if (stop)
            break; /* the daemon is stopping: the listener is gone on purpose */
        failures++;
        LOG_WARN(RPC, "self-probe %lld of %lld failed: %s", (long long)failures, (long long)d->cfg.self_probe_failures,
                 why);
        if (failures >= d->cfg.self_probe_failures) {
            LOG_ERROR(RPC, "the control plane on %s failed %lld self-probes in a row (last: %s); exiting with "
                           "status %d so that the supervisor restarts colld",
                      d->rpc_path, (long long)failures, why, PROBE_EXIT_STATUS);
            fprintf(stderr, "colld: the control plane on %s stopped answering (%s); exiting with status %d\n",
                    d->rpc_path, why, PROBE_EXIT_STATUS);
            _exit(PROBE_EXIT_STATUS);
        }
    }
    return NULL;
}

/* ============================================================================================
 * Start and stop
 * ========================================================================================== */

int colld_ctl_start(colld_daemon_t *d)
{
    colld_ctl_t *ctl = calloc(1, sizeof(*ctl));
    if (!ctl)
        return -1;
    ctl->d = d;
    pthread_mutex_init(&ctl->mu, NULL);
    pthread_cond_init(&ctl->cv, NULL);
    d->ctl = ctl;
    if (colld_listener_open(d, &ctl->l, "control socket", d->rpc_path, ctl_on_accept, NULL) < 0)
        return -1;
    if (d->cfg.self_probe_ms > 0) {
        if (pthread_create(&ctl->probe, NULL, probe_main, ctl) != 0) {
            LOG_ERROR(RPC, "cannot start the self-probe thread");
            return -1;
        }
        ctl->probe_started = true;
    }
    return 0;
}

void colld_ctl_stop(colld_daemon_t *d)
{
    colld_ctl_t *ctl = d->ctl;
    if (!ctl)
        return;
    if (ctl->l.open) {
        colld_listener_close(&ctl->l);
        (void)SYS_CHECK_EXPECT(RPC, ENOENT, unlink(d->rpc_path));
    }
    while (ctl->conns) /* gRPC closes the connections themselves when its server is destroyed */
        conn_end(ctl->conns, "daemon stopping");
    if (ctl->probe_started) {
        pthread_mutex_lock(&ctl->mu);
        ctl->probe_stop = true;
        pthread_cond_broadcast(&ctl->cv);
        pthread_mutex_unlock(&ctl->mu);
        pthread_join(ctl->probe, NULL);
        ctl->probe_started = false;
    }
}

void colld_ctl_stats(const colld_daemon_t *d, unsigned *admitted, unsigned *refused_held, uint64_t *refused_total)
{
    const colld_ctl_t *ctl = d->ctl;
    *admitted = ctl ? ctl->admitted : 0;
    *refused_held = ctl ? ctl->refused_held : 0;
    *refused_total = ctl ? ctl->refused_total : 0;
}

uint64_t colld_ctl_shed(const colld_daemon_t *d)
{
    return d->ctl ? d->ctl->l.shed : 0;
}

void colld_ctl_free(colld_daemon_t *d)
{
    colld_ctl_t *ctl = d->ctl;
    if (!ctl)
        return;
    pthread_cond_destroy(&ctl->cv);
    pthread_mutex_destroy(&ctl->mu);
    free(ctl);
    d->ctl = NULL;
}
