/*
 * colld_perf_launch.c - colld-perf's launcher (the process model: colld_perf.c's top comment): a
 * daemon if none answers on the socket, the rank processes and their end. Each rank is this
 * executable again with --internal-rank R and reads its unique id(s) from a pipe on ID_FD
 * (perf_read_full); SIGINT/SIGTERM stop the ranks, and after one rank fails the others get
 * FAIL_GRACE_MS to notice before they are killed.
 */
#include "colld_perf.h"

#include <colld/colld.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define DAEMON_START_MS 10000    /* a daemon we start must answer within this */
#define DAEMON_STOP_MS 10000     /* ... and end within this after SIGTERM */
#define FAIL_GRACE_MS 15000      /* after one rank fails, the others get this long to notice */

typedef struct {
    char dir[256];    /* our temporary directory, "" when we started no daemon */
    char socket[300]; /* the socket the ranks use */
    char log[300];
    pid_t pid;        /* our daemon, 0 when none */
} daemon_t;

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Spawn argv with every signal at its default and none blocked (the launcher blocks some).
 * id_fd >= 0 becomes the child's ID_FD. Returns the pid or -1. */
static pid_t spawn(const char *path, char *const *argv, int id_fd, bool search_path)
{
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t fa;
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGCHLD);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawn_file_actions_init(&fa);
    if (id_fd >= 0)
        posix_spawn_file_actions_adddup2(&fa, id_fd, ID_FD);
    pid_t pid;
    int rc = search_path ? posix_spawnp(&pid, path, &fa, &attr, argv, environ)
                         : posix_spawn(&pid, path, &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    return pid;
}

/* Wait for one child at most timeout_ms; its wait status, or -1 when it is still running. */
static int wait_child(pid_t pid, int timeout_ms)
{
    double end = now_us() + timeout_ms * 1e3;
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0 && errno != EINTR)
            return -1;
        if (now_us() > end)
            return -1;
        sleep_ms(2);
    }
}

static void print_daemon_log(const daemon_t *d)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return;
    char line[512];
    fprintf(stderr, "---- %s ----\n", d->log);
    while (fgets(line, sizeof(line), f))
        fputs(line, stderr);
    fclose(f);
}

/* The directory of this executable, "" when unknown. */
static void self_dir(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    buf[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash)
        *slash = '\0';
    else
        buf[0] = '\0';
}

/* Start colld on a private socket in a new temporary directory and wait until it answers.
 * Returns 0, or -1 with the reason printed. */
static int daemon_start(const opts_t *o, daemon_t *d)
{
    char here[PATH_MAX - 32], path[PATH_MAX] = "";
    snprintf(d->dir, sizeof(d->dir), "/tmp/colld-perf-XXXXXX");
    if (!mkdtemp(d->dir)) {
        fprintf(stderr, PROG ": cannot create a temporary directory: %s\n", strerror(errno));
        d->dir[0] = '\0';
        return -1;
    }
    snprintf(d->socket, sizeof(d->socket), "%s/colld.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/colld.log", d->dir);
    /* Which colld: --colld, next to us (installed), the build tree's server/, then PATH. */
    bool search = false;
    self_dir(here, sizeof(here));
    if (o->colld) {
        snprintf(path, sizeof(path), "%s", o->colld);
    } else {
        snprintf(path, sizeof(path), "%s/colld", here);
        if (access(path, X_OK) != 0)
            snprintf(path, sizeof(path), "%s/../server/colld", here);
        if (access(path, X_OK) != 0) {
            snprintf(path, sizeof(path), "colld");
            search = true;
        }
    }
    char *argv[] = { path, "--socket", d->socket, "--log-file", d->log, NULL };
    d->pid = spawn(path, argv, -1, search);
    if (d->pid < 0) {
        fprintf(stderr, PROG ": no daemon answers and cannot start %s: %s (give its path with --colld)\n", path,
                strerror(errno));
        d->pid = 0;
        return -1;
    }
    double end = now_us() + DAEMON_START_MS * 1e3;
    while (now_us() < end) {
        colld_client_t *c;
        if (access(d->socket, F_OK) == 0 && colld_connect(d->socket, &c) == COLLD_OK) {
            colld_disconnect(c);
            fprintf(stderr, PROG ": started %s on %s (pid %d)\n", path, d->socket, (int)d->pid);
            return 0;
        }
        int status;
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            fprintf(stderr, PROG ": %s exited during start-up (wait status %d)\n", path, status);
            d->pid = 0;
            print_daemon_log(d);
            return -1;
        }
        sleep_ms(5);
    }
    fprintf(stderr, PROG ": %s did not answer within %d ms\n", path, DAEMON_START_MS);
    print_daemon_log(d);
    return -1;
}

/* Stop our daemon (SIGTERM, then SIGKILL after DAEMON_STOP_MS) and remove its directory.
 * Returns 0 when it exited cleanly or there was none. */
static int daemon_stop(daemon_t *d)
{
    int rc = 0;
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        int status = wait_child(d->pid, DAEMON_STOP_MS);
        if (status < 0) {
            fprintf(stderr, PROG ": colld (pid %d) did not stop within %d ms; killed\n", (int)d->pid, DAEMON_STOP_MS);
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &status, 0);
            rc = -1;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, PROG ": colld (pid %d) ended with wait status %d\n", (int)d->pid, status);
            print_daemon_log(d);
            rc = -1;
        }
        d->pid = 0;
    }
    if (d->dir[0]) {
        /* Our directory holds only what the daemon made there (sockets, lock, log): flat. */
        DIR *dir = opendir(d->dir);
        struct dirent *e;
        while (dir && (e = readdir(dir)) != NULL)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                unlinkat(dirfd(dir), e->d_name, 0);
        if (dir)
            closedir(dir);
        if (rmdir(d->dir) != 0)
            fprintf(stderr, PROG ": cannot remove %s: %s\n", d->dir, strerror(errno));
        d->dir[0] = '\0';
    }
    return rc;
}

/* Spawn the ranks, hand each its id(s), and wait for them. SIGINT/SIGTERM to the launcher stop
 * the ranks; when one rank fails the others get FAIL_GRACE_MS to notice before they are killed.
 * Returns the number of ranks that did not exit 0. */
static int run_ranks(const opts_t *o, int argc, char **argv, const char *socket, const colld_unique_id_t *ids,
                     int nids)
{
    int n = o->nranks, bad = 0, left = 0;
    pid_t pids[MAX_RANKS];
    char rk[MAX_RANKS][16];
    char **args = calloc((size_t)argc + 8, sizeof(*args));
    if (!args) {
        fprintf(stderr, PROG ": out of memory\n");
        return n;
    }
    int na = 0;
    args[na++] = argv[0];
    for (int i = 1; i < argc; i++)
        args[na++] = argv[i];
    if (socket[0]) {
        args[na++] = "--socket";
        args[na++] = (char *)socket;
    }
    args[na++] = "--internal-rank";
    int rank_slot = na++;
    args[na] = NULL;

    for (int r = 0; r < n; r++) {
        pids[r] = -1;
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0) {
            fprintf(stderr, PROG ": pipe: %s\n", strerror(errno));
            bad++;
            continue;
        }
        snprintf(rk[r], sizeof(rk[r]), "%d", r);
        args[rank_slot] = rk[r];
        pids[r] = spawn("/proc/self/exe", args, p[0], false);
        close(p[0]);
        if (pids[r] < 0) {
            fprintf(stderr, PROG ": cannot start rank %d: %s\n", r, strerror(errno));
            close(p[1]);
            bad++;
            continue;
        }
        left++;
        /* The rank reads everything at once, so this cannot block for long; EPIPE if it died. */
        const char *buf = (const char *)ids;
        size_t len = (size_t)nids * sizeof(*ids), off = 0;
        while (off < len) {
            ssize_t w = write(p[1], buf + off, len - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        close(p[1]);
    }
    free(args);

    /* Wait: SIGCHLD, SIGINT and SIGTERM are blocked in the launcher and taken here. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    double kill_at = 0;
    while (left > 0) {
        struct timespec ts = { 0, 200 * 1000000L };
        int sig = sigtimedwait(&set, NULL, &ts);
        if ((sig == SIGINT || sig == SIGTERM) && kill_at == 0) {
            fprintf(stderr, PROG ": interrupted; stopping the ranks\n");
            for (int r = 0; r < n; r++)
                if (pids[r] > 0)
                    kill(pids[r], SIGTERM);
            kill_at = now_us() + 2e6;
        }
        for (int r = 0; r < n; r++) {
            int status;
            if (pids[r] <= 0 || waitpid(pids[r], &status, WNOHANG) != pids[r])
                continue;
            pids[r] = -1;
            left--;
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                continue;
            bad++;
            if (WIFSIGNALED(status))
                fprintf(stderr, PROG ": rank %d was killed by signal %d\n", r, WTERMSIG(status));
            if (kill_at == 0 && left > 0)
                kill_at = now_us() + FAIL_GRACE_MS * 1e3;
        }
        if (kill_at != 0 && left > 0 && now_us() > kill_at) {
            for (int r = 0; r < n; r++)
                if (pids[r] > 0) {
                    fprintf(stderr, PROG ": rank %d did not end after a failure; killed\n", r);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    pids[r] = -1;
                    left--;
                    bad++;
                }
        }
    }
    return bad;
}

/* The launcher: with --gpu, first the check for a GPU; the daemon at --socket (or the default one),
 * else our own colld; the unique id(s); the rank processes; their end, and our daemon's. Returns the
 * exit status. */
int perf_launch(const opts_t *o, int argc, char **argv)
{
    /* With --gpu, say at once when there is no GPU (before a daemon or a rank starts). */
    if (o->gpu && gpu_visible() < 0)
        return 1;
    /* Signals that end the run are taken synchronously in run_ranks. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);

    daemon_t d = { .pid = 0 };
    colld_client_t *c = NULL;
    /* A given socket that does not exist: no need to ask (and have libcolld warn about it). */
    colld_status_t st = o->socket && access(o->socket, F_OK) != 0 ? COLLD_ERR_DAEMON_UNAVAILABLE
                                                                  : colld_connect(o->socket, &c);
    if (st == COLLD_ERR_DAEMON_UNAVAILABLE) {
        if (daemon_start(o, &d) < 0) {
            daemon_stop(&d);
            return 1;
        }
        st = colld_connect(d.socket, &c);
    } else if (o->socket) {
        snprintf(d.socket, sizeof(d.socket), "%s", o->socket);
    }
    if (st != COLLD_OK) {
        fprintf(stderr, PROG ": cannot connect to colld: %s: %s\n", colld_status_name(st), colld_status_string(st));
        daemon_stop(&d);
        return 1;
    }
    int nids = o->attach_reps ? o->attach_reps + 1 : 1, rc = 1;
    colld_unique_id_t *ids = calloc((size_t)nids, sizeof(*ids));
    if (!ids) {
        fprintf(stderr, PROG ": out of memory\n");
        goto out;
    }
    for (int i = 0; i < nids; i++)
        if ((st = colld_get_unique_id(c, &ids[i])) != COLLD_OK) {
            fprintf(stderr, PROG ": cannot get a unique id: %s: %s\n", colld_status_name(st), colld_status_string(st));
            goto out;
        }
    /* The ranks use our socket: the one given, the default one (then they find it the same way
     * we did), or our own daemon's. */
    int bad = run_ranks(o, argc, argv, d.socket[0] ? d.socket : "", ids, nids);
    if (bad)
        fprintf(stderr, PROG ": %d rank process(es) ended with an error\n", bad);
    rc = bad ? 1 : 0;
out:
    free(ids);
    colld_disconnect(c);
    if (daemon_stop(&d) < 0 && rc == 0)
        rc = 1;
    return rc;
}
