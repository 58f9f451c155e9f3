/*
 * engine_wake.c - the engine's epoll set: every session's eventfd (the client's doorbell) and the
 * engine's own wake eventfd (control paths that changed something the engine must look at), and
 * the engine's sleep on it.
 */
#include "server/core/daemon.h"

#include "common/log.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

int colld_engine_wake_init(colld_daemon_t *d)
{
    d->epfd = epoll_create1(EPOLL_CLOEXEC);
    d->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (d->epfd < 0 || d->wake_fd < 0) {
        LOG_ERROR(ENGINE, "cannot create the engine's epoll set: %s", strerror(errno));
        return -1;
    }
    struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.u64 = 0 };
    if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, d->wake_fd, &ev) < 0)
        return -1;
    return 0;
}

void colld_engine_wake_fini(colld_daemon_t *d)
{
    if (d->epfd >= 0)
        close(d->epfd);
    if (d->wake_fd >= 0)
        close(d->wake_fd);
    d->epfd = d->wake_fd = -1;
}

/* Wake the engine from another thread. */
void colld_engine_wake(colld_daemon_t *d)
{
    uint64_t one = 1;
    ssize_t rc = write(d->wake_fd, &one, sizeof(one));
    (void)rc; /* EAGAIN only when the counter is saturated: the engine is awake anyway */
}

/* Watch a session's eventfd (lock held). Edge-triggered: each client write is an event, and the
 * counter never needs reading. */
int colld_engine_add_session(colld_daemon_t *d, colld_session_t *s)
{
    struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.u64 = s->id };
    if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, s->efd, &ev) < 0) {
        LOG_ERROR(ENGINE, "epoll_ctl: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* Stop watching a session's eventfd (lock held). */
void colld_engine_remove_session(colld_daemon_t *d, colld_session_t *s)
{
    if (s->efd >= 0 && d->epfd >= 0) /* ENOENT: it was never added (its session failed to start) */
        (void)SYS_CHECK_EXPECT(ENGINE, ENOENT, epoll_ctl(d->epfd, EPOLL_CTL_DEL, s->efd, NULL));
}

void colld_engine_sleep(colld_daemon_t *d, int timeout_ms)
{
    struct epoll_event ev[64];
    int n = epoll_wait(d->epfd, ev, 64, timeout_ms);
    if (n < 0 && errno != EINTR)
        LOG_ERROR(ENGINE, "epoll_wait: %s", strerror(errno));
}
