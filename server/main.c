/*
 * main.c - the colld daemon: configuration, the lock file, start-up and graceful shutdown.
 *
 * The daemon is the core composed with the registry's backends and modules (server/registry.c.in).
 * Start-up order: backends, engine, gRPC control plane, and last the session socket, so that a
 * client that can connect to the session socket finds everything else ready; then READY=1.
 * SIGINT, and SIGTERM with --drain-timeout-ms 0, end every session (clients report
 * COLLD_ERR_DAEMON_LOST), stop the control plane and the engine, and exit 0. SIGTERM with a drain
 * timeout first drains: new communicators are refused (control.c), the running ones go on until
 * none is left or the timeout passes, then the daemon stops as above; a second SIGTERM stops it
 * at once.
 */
#include "server/control/control.h"
#include "server/core/counters.h"
#include "server/core/daemon.h"
#include "server/core/tenant.h"
#include "server/core/verify.h"
#include "server/net/net.h"
#include "server/observability/metrics.h"
#include "server/observability/notify.h"

#include "common/log.h"
#include "common/util.h"
#include "kernels/cpu/reduce.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static const char USAGE[] = "usage: colld [options]\n"
                            "Runs the colld collective offload daemon in the foreground.\n";
/* Printed after the options' table. */
static const char USAGE_TAIL[] =
    "\n"
    "Commands:\n"
    "  --version       print the version and exit\n"
    "  --print-config  print the configuration the other options give, as a config file with every\n"
    "                  option documented (defaults commented out), and exit\n"
    "\n"
    "Signals: SIGTERM drains for up to --drain-timeout-ms, then stops (a second SIGTERM stops at\n"
    "once); SIGINT stops at once. Stopping ends every session: clients get COLLD_ERR_DAEMON_LOST.\n";

/* Drain progress is checked this often. */
#define DRAIN_POLL_MS 100

/* Create the socket's directory (and its parents) if missing. */
static int make_parent_dirs(const char *path)
{
    char dir[256];
    colld_strlcpy(dir, path, sizeof(dir));
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* Take the lock file next to the socket so a second daemon cannot steal a running daemon's
 * socket (gRPC would unlink it). Returns 0, or -1 after printing why. */
static int take_lock(colld_daemon_t *d)
{
    snprintf(d->lock_path, sizeof(d->lock_path), "%s.lock", d->cfg.socket);
    d->lock_fd = open(d->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (d->lock_fd < 0) {
        fprintf(stderr, "colld: cannot open lock file %s: %s\n", d->lock_path, strerror(errno));
        return -1;
    }
    if (flock(d->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        char pid[32] = "?";
        ssize_t n = pread(d->lock_fd, pid, sizeof(pid) - 1, 0);
        if (n > 0) {
            pid[n] = '\0';
            pid[strcspn(pid, "\n")] = '\0';
        }
        fprintf(stderr,
                "colld: another colld (pid %s) is already serving %s; stop it first or choose another --socket\n",
                pid, d->cfg.socket);
        return -1;
    }
    char buf[32];
    int len = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
    if (ftruncate(d->lock_fd, 0) < 0 || pwrite(d->lock_fd, buf, (size_t)len, 0) != len)
        LOG_WARN(INIT, "cannot write pid to %s", d->lock_path);
    return 0;
}

/* Check values that the table's bounds cannot express and fill in computed defaults. Returns 0
 * or -1 after printing why. */
static int finish_config(colld_daemon_t *d)
{
    colld_daemon_config_t *c = &d->cfg;
    if (c->ring_entries & (c->ring_entries - 1)) {
        fprintf(stderr, "colld: --ring-entries: %lld is not a power of two\n", (long long)c->ring_entries);
        return -1;
    }
    char *end = NULL;
    unsigned long mode = strtoul(c->socket_mode_text ? c->socket_mode_text : "", &end, 8);
    if (!c->socket_mode_text || !*c->socket_mode_text || *end || mode > 0777) {
        fprintf(stderr, "colld: --socket-mode: '%s' is not an octal permission like 0660\n",
                c->socket_mode_text ? c->socket_mode_text : "");
        return -1;
    }
    c->socket_mode = (unsigned)mode;
    c->net_algo = colld_net_algo_parse(c->net_algo_text);
    if (c->net_algo < 0) {
        fprintf(stderr, "colld: --net-algo: '%s' is not auto, ring or rd\n", c->net_algo_text ? c->net_algo_text : "");
        return -1;
    }
    const char *tr = c->net_transport_text ? c->net_transport_text : "auto";
    c->net_transport = strcmp(tr, "auto") == 0  ? COLLD_NET_TRANSPORT_AUTO
                       : strcmp(tr, "ib") == 0  ? COLLD_NET_TRANSPORT_IB
                       : strcmp(tr, "tcp") == 0 ? COLLD_NET_TRANSPORT_TCP
                                                : -1;
    if (c->net_transport < 0) {
        fprintf(stderr, "colld: --net-transport: '%s' is not auto, ib or tcp\n", tr);
        return -1;
    }
    if (!colld_verify_hook_parse(c->test_corrupt_text, &c->test_corrupt_rank, &c->test_corrupt_elem)) {
        fprintf(stderr, "colld: --test-corrupt-result: '%s' is not R:E or node:E\n", c->test_corrupt_text);
        return -1;
    }
    c->test_corrupt = c->test_corrupt_rank > -2;
    if (c->net_chunk < 4096 || c->net_chunk > (1u << 20) || c->net_chunk % 64) {
        fprintf(stderr, "colld: --net-chunk: %llu must be 4K..1M and a multiple of 64\n",
                (unsigned long long)c->net_chunk);
        return -1;
    }
    if (c->fast_path_bytes > (1u << 20) || c->fast_path_bytes % 64) {
        fprintf(stderr, "colld: --fast-path-bytes: %llu must be 0..1M and a multiple of 64\n",
                (unsigned long long)c->fast_path_bytes);
        return -1;
    }
    if (c->workers == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        c->workers = n > 0 ? n : 1;
    }
    if (c->timeout_ms > c->max_timeout_ms)
        c->timeout_ms = c->max_timeout_ms;
    if (!c->socket || !*c->socket) {
        char path[256];
        colld_default_socket_path(path, sizeof(path));
        free(c->socket);
        c->socket = strdup(path);
        if (!c->socket)
            return -1;
    }
    if (strlen(c->socket) + 8 > sizeof(d->rpc_path)) {
        fprintf(stderr, "colld: --socket: path too long: %s\n", c->socket);
        return -1;
    }
    snprintf(d->rpc_path, sizeof(d->rpc_path), "%s.rpc", c->socket);
    snprintf(d->rpc_addr, sizeof(d->rpc_addr), "unix:%s", d->rpc_path);
    return 0;
}

/* End every session, stop the control plane and the engine, close the loop's handles so that
 * uv_run returns. */
static void stop_now(colld_daemon_t *d)
{
    d->stopping = true;
    colld_notify_stopping("stopping: ending every session");
    colld_metrics_stop(d);
    colld_sessions_close_all(d);
    colld_ctl_stop(d);
    colld_control_stop(d);
    colld_engine_stop(d);
    colld_backends_stop(d);
    colld_notify_close(d);
    uv_timer_stop(&d->drain_timer);
    uv_close((uv_handle_t *)&d->drain_timer, NULL);
    uv_close((uv_handle_t *)&d->async, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
}

/* Communicators a drain waits for: those forming or formed (broken and closing ones can run
 * nothing any more). Lock held. */
static unsigned running_comms(const colld_daemon_t *d)
{
    unsigned n = 0;
    for (const colld_dcomm_t *c = d->comms; c; c = c->next)
        if (c->state == COLLD_COMM_JOINING || c->state == COLLD_COMM_READY)
            n++;
    return n;
}

/* The drain's timer: stop once no communicator runs or the deadline has passed. */
static void on_drain_tick(uv_timer_t *t)
{
    colld_daemon_t *d = t->data;
    pthread_mutex_lock(&d->lock);
    unsigned left = running_comms(d);
    pthread_mutex_unlock(&d->lock);
    int64_t now = colld_wall_ms();
    if (left == 0) {
        LOG_WARN(INIT, "drain: no communicator left, stopping");
    } else if (now >= d->drain_deadline_ms) {
        LOG_WARN(INIT, "drain: deadline reached with %u communicator(s) still running; stopping (their ranks get "
                       "COLLD_ERR_DAEMON_LOST)",
                 left);
    } else {
        char status[128];
        snprintf(status, sizeof(status), "draining: %u communicator(s) running, stopping in at most %lld s", left,
                 (long long)((d->drain_deadline_ms - now + 999) / 1000));
        colld_notify_status(status);
        return;
    }
    stop_now(d);
}

/* Start draining: refuse new communicators from now on and check every DRAIN_POLL_MS whether the
 * running ones are done. */
static void start_drain(colld_daemon_t *d)
{
    pthread_mutex_lock(&d->lock);
    d->draining = true;
    d->drain_deadline_ms = colld_wall_ms() + d->cfg.drain_timeout_ms;
    unsigned left = running_comms(d);
    pthread_mutex_unlock(&d->lock);
    LOG_WARN(INIT, "SIGTERM: draining: new communicators are refused; %u running, stopping when they are done or in "
                   "%lld ms at the latest (SIGTERM again to stop now)",
             left, (long long)d->cfg.drain_timeout_ms);
    colld_notify_stopping("draining: refusing new communicators");
    uv_timer_start(&d->drain_timer, on_drain_tick, 0, DRAIN_POLL_MS);
}

/* SIGTERM drains first when --drain-timeout-ms is set; SIGINT, a second SIGTERM, or SIGTERM
 * without a drain timeout stop at once. */
static void on_signal(uv_signal_t *h, int signum)
{
    colld_daemon_t *d = h->data;
    if (d->stopping)
        return;
    if (signum == SIGTERM && d->cfg.drain_timeout_ms > 0 && !d->draining) {
        start_drain(d);
        return;
    }
    LOG_INFO(INIT, "signal %d: shutting down", signum);
    stop_now(d);
}

/* The start-up banner's backend lines: the one serving device memory first (or why there is none),
 * then the others that have something to say. */
static void print_backends(colld_daemon_t *d)
{
    char line[320];
    colld_backend_t *dev = colld_backend_device(d);
    if (!dev)
        fprintf(stderr, "colld: no CUDA backend: %s\n", d->device_none);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < d->nbackends; i++) {
            colld_backend_t *b = &d->backends[i];
            if ((b == dev) != (pass == 0) || !b->ops->describe)
                continue;
            b->ops->describe(b, line, sizeof(line));
            if (line[0])
                fprintf(stderr, "colld: %s\n", line);
        }
}

/* The engine asks the loop to drop sessions that broke the ring protocol. */
static void on_async(uv_async_t *h)
{
    colld_sessions_reap(h->data);
}

int main(int argc, char **argv)
{
    colld_daemon_t d;
    char err[512] = "";
    int rc = 1;
    memset(&d, 0, sizeof(d));
    d.spare_fd = d.lock_fd = d.epfd = d.wake_fd = -1;
    pthread_mutex_init(&d.lock, NULL);

    /* --version and --print-config are commands, not options: taken out before the table sees
     * the arguments. */
    bool print_config = false;
    int nargs = 0;
    char **args = calloc((size_t)argc + 1, sizeof(*args));
    if (!args) {
        fprintf(stderr, "colld: out of memory\n");
        goto out_cfg;
    }
    for (int i = 0; i < argc; i++) {
        if (i > 0 && strcmp(argv[i], "--version") == 0) {
            printf("colld %s\n", COLLD_VERSION_STRING);
            free(args);
            rc = 0;
            goto out_cfg;
        }
        if (i > 0 && strcmp(argv[i], "--print-config") == 0)
            print_config = true;
        else
            args[nargs++] = argv[i];
    }
    int cr = colld_config_load(colld_daemon_config_table, colld_daemon_config_table_len, &d.cfg, nargs, args, err,
                               sizeof(err));
    free(args);
    if (cr == 0 && print_config) {
        printf("# colld %s configuration (colld --print-config). Every option of colld; the lines starting with\n"
               "# '#name =' hold the default. Precedence: command line > environment (COLLD_*) > this file.\n",
               COLLD_VERSION_STRING);
        colld_config_print_file(stdout, NULL, colld_daemon_config_table, colld_daemon_config_table_shown, &d.cfg);
        rc = 0;
        goto out_cfg;
    }
    if (cr == 1) {
        colld_config_print_help(stdout, USAGE, colld_daemon_config_table, colld_daemon_config_table_shown);
        fputs(USAGE_TAIL, stdout);
        rc = 0;
        goto out_cfg;
    }
    if (cr < 0) {
        fprintf(stderr, "colld: %s\n", err);
        rc = 2;
        goto out_cfg;
    }
    if (colld_log_init("colld", d.cfg.log_level, d.cfg.log_subsys, d.cfg.log_file, err, sizeof(err)) < 0) {
        fprintf(stderr, "colld: %s\n", err);
        rc = 2;
        goto out_cfg;
    }
    if (finish_config(&d) < 0) {
        rc = 2;
        goto out_cfg;
    }
    if (colld_fds_init(&d) < 0) {
        rc = 2;
        goto out_cfg;
    }
    signal(SIGPIPE, SIG_IGN);
    if (make_parent_dirs(d.cfg.socket) < 0) {
        fprintf(stderr, "colld: cannot create the directory of %s: %s\n", d.cfg.socket, strerror(errno));
        goto out_cfg;
    }
    if (take_lock(&d) < 0)
        goto out_cfg;

    d.started_ms = colld_wall_ms();
    uv_loop_init(&d.loop);
    d.async.data = &d;
    d.sigterm.data = &d;
    d.sigint.data = &d;
    uv_async_init(&d.loop, &d.async, on_async);
    uv_timer_init(&d.loop, &d.drain_timer);
    d.drain_timer.data = &d;
    colld_notify_init(&d);
    uv_signal_init(&d.loop, &d.sigterm);
    uv_signal_init(&d.loop, &d.sigint);
    uv_signal_start(&d.sigterm, on_signal, SIGTERM);
    uv_signal_start(&d.sigint, on_signal, SIGINT);

    if (colld_daemon_compose(&d, &colld_registry) < 0 || colld_counters_create(&d) < 0 ||
        colld_metrics_create(&d) < 0) {
        fprintf(stderr, "colld: out of memory\n");
        goto out_stop;
    }
    colld_backend_t *failed = colld_backends_start(&d);
    if (failed) {
        if (failed->ops == &colld_net_backend)
            fprintf(stderr, "colld: cannot serve peer daemons on --listen %s (see the log above)\n", d.cfg.listen);
        else
            fprintf(stderr, "colld: cannot start the %s backend; run with --log-level info for details\n",
                    failed->ops->name);
        goto out_stop;
    }
    if (colld_engine_start(&d) < 0 || colld_control_start(&d) < 0) {
        fprintf(stderr, "colld: start-up failed; run with --log-level info for details\n");
        goto out_stop;
    }
    if (colld_ctl_start(&d) < 0) {
        fprintf(stderr, "colld: cannot listen on %s: %s\n", d.rpc_path, strerror(errno));
        goto out_stop;
    }
    if (colld_sessions_listen(&d) < 0) {
        fprintf(stderr, "colld: cannot listen on %s: %s\n", d.cfg.socket, strerror(errno));
        goto out_stop;
    }
    if (colld_metrics_start(&d) < 0) {
        fprintf(stderr, "colld: %s\n", colld_metrics_error(&d));
        goto out_stop;
    }
    /* A start-up banner on stderr whatever the log level: someone running colld by hand sees it. */
    const char *metrics_url = colld_metrics_url(&d), *health_url = colld_metrics_health_url(&d);
    fprintf(stderr, "colld %s: serving %s (control %s), host backend with %lld workers, %s kernels%s%s%s%s\n",
            COLLD_VERSION_STRING, d.cfg.socket, d.rpc_path, (long long)d.cfg.workers,
            colld_cpu_reduce_impl(), metrics_url ? ", metrics on " : "", metrics_url ? metrics_url : "",
            health_url ? ", health on " : "", health_url ? health_url : "");
    print_backends(&d);
    char ready[160];
    snprintf(ready, sizeof(ready), "serving %s", d.cfg.socket);
    colld_notify_ready(&d, ready);
    uv_run(&d.loop, UV_RUN_DEFAULT);
    rc = 0;
    fprintf(stderr, "colld: stopped\n");
    goto out_loop;

out_stop:
    stop_now(&d);
    uv_run(&d.loop, UV_RUN_DEFAULT);
out_loop:
    uv_loop_close(&d.loop);
    colld_ctl_free(&d);
    colld_metrics_destroy(&d);
    colld_counters_destroy(&d);
    colld_tenants_free(&d);
    if (d.lock_fd >= 0)
        close(d.lock_fd);
out_cfg:
    colld_fds_fini(&d);
    colld_config_free(colld_daemon_config_table, colld_daemon_config_table_len, &d.cfg);
    colld_log_fini();
    pthread_mutex_destroy(&d.lock);
    return rc;
}
