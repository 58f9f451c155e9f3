/*
 * notify.c - sd_notify for Type=notify units (see notify.h).
 *
 * The watchdog ping runs on the daemon's libuv loop and takes daemon->lock for a moment, so it
 * stops (and systemd restarts the daemon after WatchdogSec) when the loop or the lock is stuck,
 * the two things every session and every control call needs.
 */
#include "server/observability/notify.h"

#include "common/config.h"
#include "common/log.h"

#include <stdio.h>

#ifdef COLLD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

/* The watchdog timer exists on every build, so that shutdown closes the same handles. */
void colld_notify_init(colld_daemon_t *d)
{
    uv_timer_init(&d->loop, &d->watchdog);
    d->watchdog.data = d;
}

#ifdef COLLD_HAVE_SYSTEMD

/* One WATCHDOG=1, after proving that daemon->lock can be taken. */
static void on_watchdog(uv_timer_t *t)
{
    colld_daemon_t *d = t->data;
    pthread_mutex_lock(&d->lock);
    pthread_mutex_unlock(&d->lock);
    sd_notify(0, "WATCHDOG=1");
}

/* READY=1, then pings at half the interval systemd asked for (WATCHDOG_USEC), if it did. */
void colld_notify_ready(colld_daemon_t *d, const char *status)
{
    uint64_t usec = 0;
    sd_notifyf(0, "READY=1\nSTATUS=%s", status);
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        uint64_t ms = usec / 2000 ? usec / 2000 : 1; /* twice per interval */
        uv_timer_start(&d->watchdog, on_watchdog, ms, ms);
        LOG_INFO(INIT, "systemd watchdog: pinging every %llu ms", (unsigned long long)ms);
    }
}

/* STOPPING=1: systemd then waits for the exit (TimeoutStopSec) instead of expecting a restart. */
void colld_notify_stopping(const char *status)
{
    sd_notifyf(0, "STOPPING=1\nSTATUS=%s", status);
}

/* A STATUS= line, shown by systemctl status (the drain's progress). */
void colld_notify_status(const char *status)
{
    sd_notifyf(0, "STATUS=%s", status);
}

#else /* !COLLD_HAVE_SYSTEMD */

/* Without libsystemd nothing can be sent; say so when a service manager is waiting for it. */
void colld_notify_ready(colld_daemon_t *d, const char *status)
{
    (void)d;
    (void)status;
    if (colld_config_env("NOTIFY_SOCKET"))
        fprintf(stderr, "colld: this colld was built without libsystemd and cannot send READY=1: use Type=simple "
                        "in its unit, or rebuild with libsystemd-dev installed\n");
}

/* No-op without libsystemd. */
void colld_notify_stopping(const char *status)
{
    (void)status;
}

/* No-op without libsystemd. */
void colld_notify_status(const char *status)
{
    (void)status;
}

#endif /* COLLD_HAVE_SYSTEMD */

/* Stop the pings and close the timer (idempotent, loop thread). */
void colld_notify_close(colld_daemon_t *d)
{
    uv_timer_stop(&d->watchdog);
    if (!uv_is_closing((uv_handle_t *)&d->watchdog))
        uv_close((uv_handle_t *)&d->watchdog, NULL);
}
