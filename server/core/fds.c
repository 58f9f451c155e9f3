/*
 * fds.c - descriptor exhaustion handled as production servers do.
 *
 * At start the soft RLIMIT_NOFILE is raised (to --max-fds, or to the hard limit) and compared
 * with what the configured maxima need; a warning names the shortfall and what to change.
 *
 * Each listening unix socket (the session socket, the control socket) is a colld_listener_t
 * served by the loop: it accepts, reads SO_PEERCRED and hands the connection on. When accept
 * fails for lack of descriptors (EMFILE, ENFILE) the listener closes the daemon's spare
 * descriptor, accepts the connection with the slot that frees, tells the client why (the
 * listener's refuse function), closes it and takes the spare back: a client is refused at once
 * instead of hanging in the backlog, and the loop never spins on a connection it cannot take.
 * When even that fails (another thread took the freed slot, or accept fails otherwise) the
 * listener pauses for LISTEN_PAUSE_MS and tries again. Every message about it is rate-limited.
 */
#include "server/core/daemon.h"
#include "server/core/tenant.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define LISTEN_BACKLOG 512
#define LISTEN_PAUSE_MS 100   /* a listener that cannot accept waits this long before it tries again */
#define ACCEPT_BATCH 64       /* connections taken per loop iteration, so others get a turn */
#define FDS_PER_SESSION 4     /* socket, ring memory, doorbell, pidfd (a GPU flag area adds one) */
#define FDS_PER_RPC_CONN 2    /* gRPC's descriptor and the daemon's watch on it (ctl_listen.c) */
#define FDS_BASE 256          /* logs, the engine, gRPC's own, the metrics endpoint, peers, slack */

unsigned colld_admin_reserve(int64_t max)
{
    return (unsigned)COLLD_MIN(8, max / 4);
}

/* ============================================================================================
 * The descriptor limit
 * ========================================================================================== */

/* The kernel's ceiling for RLIMIT_NOFILE when the hard limit is unlimited. */
static rlim_t nr_open(void)
{
    long long v = 0;
    FILE *f = fopen("/proc/sys/fs/nr_open", "r");
    if (f) {
        if (fscanf(f, "%lld", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v > 0 ? (rlim_t)v : 1048576;
}

int colld_fds_init(colld_daemon_t *d)
{
    const colld_daemon_config_t *c = &d->cfg;
    struct rlimit rl;

    d->spare_fd = -1;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
        fprintf(stderr, "colld: cannot read the open-file limit: %s\n", strerror(errno));
        return -1;
    }
    rlim_t hard = rl.rlim_max == RLIM_INFINITY ? nr_open() : rl.rlim_max;
    rlim_t want = c->max_fds > 0 ? (rlim_t)c->max_fds : hard;
    if (want > hard) {
        fprintf(stderr, "colld: --max-fds %lld is above the hard open-file limit %llu; raise the hard limit "
                        "(LimitNOFILE=, ulimit -Hn) or ask for less\n",
                (long long)c->max_fds, (unsigned long long)hard);
        return -1;
    }
    if (want != rl.rlim_cur) {
        rl.rlim_cur = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
            fprintf(stderr, "colld: cannot set the open-file limit to %llu: %s\n", (unsigned long long)want,
                    strerror(errno));
            return -1;
        }
    }
    uint64_t need = (uint64_t)c->max_sessions * FDS_PER_SESSION + (uint64_t)c->max_rpc_conns * FDS_PER_RPC_CONN +
                    FDS_BASE;
    if (want < need) {
        char text[512];
        snprintf(text, sizeof(text),
                 "the open-file limit %llu is below the %llu descriptors the configured maxima may need "
                 "(max-sessions %lld x %d + max-rpc-conns %lld x %d + %d); connections beyond it are refused. "
                 "Raise LimitNOFILE= (ulimit -n) or lower --max-sessions / --max-rpc-conns",
                 (unsigned long long)want, (unsigned long long)need, (long long)c->max_sessions, FDS_PER_SESSION,
                 (long long)c->max_rpc_conns, FDS_PER_RPC_CONN, FDS_BASE);
        fprintf(stderr, "colld: warning: %s\n", text);
        LOG_WARN(INIT, "%s", text);
    }
    LOG_INFO(INIT, "open-file limit %llu (hard %llu)", (unsigned long long)want, (unsigned long long)hard);
    d->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (d->spare_fd < 0) {
        fprintf(stderr, "colld: cannot open /dev/null: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

void colld_fds_fini(colld_daemon_t *d)
{
    if (d->spare_fd >= 0)
        close(d->spare_fd);
    d->spare_fd = -1;
}

/* Take the spare descriptor back after it was used (or after another thread kept it). */
static void spare_take(colld_daemon_t *d)
{
    if (d->spare_fd >= 0)
        return;
    d->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (d->spare_fd < 0)
        LOG_WARN_RL(INIT, "cannot take back the spare descriptor (%s): a listener that runs out of descriptors "
                          "pauses instead of refusing",
                    strerror(errno));
}

/* ============================================================================================
 * Listeners
 * ========================================================================================== */

static void listener_on_poll(uv_poll_t *h, int status, int events);

/* The pause is over: accept again. */
static void listener_on_pause_end(uv_timer_t *t)
{
    colld_listener_t *l = t->data;
    if (!l->open)
        return;
    l->paused = false;
    spare_take(l->d);
    uv_poll_start(&l->poll, UV_READABLE, listener_on_poll);
}

/* Stop accepting for LISTEN_PAUSE_MS (accept failed and a refusal was impossible). */
static void listener_pause(colld_listener_t *l, int err)
{
    LOG_WARN_RL(INIT, "%s: accept: %s; not accepting for %d ms", l->what, strerror(err), LISTEN_PAUSE_MS);
    if (l->paused)
        return;
    uv_poll_stop(&l->poll);
    l->paused = true;
    uv_timer_start(&l->pause, listener_on_pause_end, LISTEN_PAUSE_MS, 0);
}

/* Out of descriptors: accept one pending connection with the spare slot and refuse it. Returns 0
 * when the listener may go on (a connection was refused, or none was pending), -1 when it must
 * pause. */
static int listener_shed_one(colld_listener_t *l)
{
    colld_daemon_t *d = l->d;
    if (d->spare_fd < 0)
        return -1;
    close(d->spare_fd);
    d->spare_fd = -1;
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    int err = errno;
    if (fd >= 0) {
        l->shed++;
        LOG_WARN_RL(INIT, "%s: out of file descriptors: refused a connection (%llu so far); the open-file limit is "
                          "too low for this load (raise LimitNOFILE= or --max-fds)",
                    l->what, (unsigned long long)l->shed);
        if (l->refuse)
            l->refuse(fd, COLLD_ERR_SYSTEM,
                      "colld is out of file descriptors (EMFILE); try again later or ask the operator to raise "
                      "its open-file limit");
        close(fd);
    }
    spare_take(d);
    return fd >= 0 || err == EAGAIN || err == EWOULDBLOCK ? 0 : -1;
}

/* A new connection: read who it is and hand it on. */
static void listener_take(colld_listener_t *l, int fd)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
        LOG_WARN_RL(INIT, "%s: SO_PEERCRED: %s", l->what, strerror(errno));
        close(fd);
        return;
    }
    l->on_accept(l, fd, cred.uid, cred.gid, cred.pid);
}

/* The listening socket is readable: accept what is pending (a batch at a time). */
static void listener_on_poll(uv_poll_t *h, int status, int events)
{
    colld_listener_t *l = h->data;
    (void)events;
    if (status < 0) {
        listener_pause(l, -status);
        return;
    }
    spare_take(l->d);
    for (int i = 0; i < ACCEPT_BATCH && l->open; i++) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            listener_take(l, fd);
            continue;
        }
        int err = errno;
        if (err == EINTR || err == ECONNABORTED)
            continue;
        if (err == EAGAIN || err == EWOULDBLOCK)
            return;
        if ((err == EMFILE || err == ENFILE) && listener_shed_one(l) == 0)
            continue;
        listener_pause(l, err);
        return;
    }
}

int colld_listener_open(colld_daemon_t *d, colld_listener_t *l, const char *what, const char *path,
                        colld_accept_fn on_accept, colld_refuse_fn refuse)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int saved;

    *l = (colld_listener_t){ .d = d, .what = what, .fd = -1, .on_accept = on_accept, .refuse = refuse };
    if (strlen(path) >= sizeof(sa.sun_path)) {
        LOG_ERROR(INIT, "socket path too long (max %zu bytes): %s", sizeof(sa.sun_path) - 1, path);
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(sa.sun_path, path);
    (void)SYS_CHECK_EXPECT(INIT, ENOENT, unlink(path)); /* a stale socket of an earlier run */
    l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0 || bind(l->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        chmod(path, (mode_t)d->cfg.socket_mode) < 0 || listen(l->fd, LISTEN_BACKLOG) < 0)
        goto fail;
    l->poll.data = l;
    l->pause.data = l;
    if (uv_poll_init(&d->loop, &l->poll, l->fd) < 0) {
        errno = ENOMEM;
        goto fail;
    }
    uv_timer_init(&d->loop, &l->pause);
    l->open = true;
    uv_poll_start(&l->poll, UV_READABLE, listener_on_poll);
    return 0;
fail:
    saved = errno;
    LOG_ERROR(INIT, "cannot listen on %s: %s", path, strerror(saved));
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
    errno = saved;
    return -1;
}

void colld_listener_close(colld_listener_t *l)
{
    if (!l->open)
        return;
    l->open = false;
    uv_poll_stop(&l->poll);
    uv_timer_stop(&l->pause);
    uv_close((uv_handle_t *)&l->poll, NULL);
    uv_close((uv_handle_t *)&l->pause, NULL);
    close(l->fd);
    l->fd = -1;
}
