/*
 * notify.h - telling the service manager how the daemon is doing (sd_notify): READY=1 once it
 * serves, STOPPING=1 when it drains or stops, STATUS= lines for `systemctl status`, and WATCHDOG=1
 * from the event loop while systemd asks for it (WatchdogSec=). Built on libsystemd where the
 * build found it (COLLD_HAVE_SYSTEMD); without it every call is a no-op and the start-up says so
 * when a service manager waits for READY=1.
 */
#ifndef COLLD_SERVER_NOTIFY_H
#define COLLD_SERVER_NOTIFY_H

#include "server/core/daemon.h"

/* Initialise d->watchdog on d->loop (call once after uv_loop_init; close with
 * colld_notify_close). */
void colld_notify_init(colld_daemon_t *d);
/* READY=1 with a STATUS line; starts the watchdog pings when systemd set WATCHDOG_USEC. */
void colld_notify_ready(colld_daemon_t *d, const char *status);
/* STOPPING=1 with a STATUS line. */
void colld_notify_stopping(const char *status);
/* A STATUS line alone. */
void colld_notify_status(const char *status);
/* Stop the watchdog pings and close the timer handle (loop thread). */
void colld_notify_close(colld_daemon_t *d);

#endif /* COLLD_SERVER_NOTIFY_H */
