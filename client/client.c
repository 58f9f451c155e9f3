/*
 * client.c - the life of libcolld's connection to the local daemon: connect (the session socket,
 * HELLO / WELCOME, the rings, the control channel, Attach), the monitor thread that turns a lost
 * daemon into COLLD_ERR_DAEMON_LOST (and releases the GPU streams waiting on it), disconnect. The
 * primitives the rest of the library uses on a connection are conn.c's and rings.c's.
 */
#include "client/client_internal.h"

#include "colld.pb-c.h"
#include "common/config.h"
#include "common/log.h"
#include "transport/shm/ring.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>


/* ============================================================================================
 * Logging set-up, once per process, from COLLD_LOG_* (through the config module)
 * ========================================================================================== */

static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void client_log_init(void)
{
    char err[256];
    if (colld_log_init("libcolld", colld_config_env("COLLD_LOG_LEVEL"), colld_config_env("COLLD_LOG_SUBSYS"),
                       colld_config_env("COLLD_LOG_FILE"), err, sizeof(err)) < 0)
        fprintf(stderr, "libcolld: ignoring log settings: %s\n", err);
}

/* ============================================================================================
 * The monitor
 * ========================================================================================== */


/* Wake everyone who waits on completions (after the daemon was lost). */
static void wake_waiters(colld_client_t *c)
{
    __atomic_add_fetch(&c->shm->cq.doorbell, 1, __ATOMIC_SEQ_CST);
    colld_futex_wake_all(&c->shm->cq.doorbell);
}

/* The monitor thread: sleeps until the session socket hangs up (the daemon died or closed the
 * session) or disconnect wakes it through the pipe. */
static void *monitor_main(void *arg)
{
    colld_client_t *c = arg;
    struct pollfd p[2] = { { .fd = c->sock, .events = 0 }, { .fd = c->wake_pipe[0], .events = POLLIN } };
    for (;;) {
        int n = poll(p, 2, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || (p[0].revents & (POLLHUP | POLLERR | POLLNVAL))) {
            if (!atomic_exchange(&c->lost, true))
                LOG_WARN(CLIENT, "lost the colld daemon at %s: every pending and later call fails with "
                                 "COLLD_ERR_DAEMON_LOST", c->socket_path);
            colld__gpu_daemon_lost(c); /* no application stream may wait for a daemon that is gone */
            wake_waiters(c);
            return NULL;
        }
        if (p[1].revents)
            return NULL;
    }
}

/* ============================================================================================
 * Fork
 *
 * A forked child (a DataLoader worker, a subprocess started without exec) inherits the
 * session socket: were it kept open there, the daemon would not see the parent die until the
 * child exits, and the parent's peers would wait for the time-out instead of getting PEER_LOST at
 * once. So the child closes its copies of the session's descriptors at fork (pthread_atfork) and
 * its clients are lost: every call fails with COLLD_ERR_DAEMON_LOST saying the process is a fork,
 * and colld_disconnect there forgets the client without touching the parent's daemon state or
 * gRPC (whose threads did not survive the fork). The child may colld_connect anew.
 * ========================================================================================== */

static pthread_mutex_t fork_mu = PTHREAD_MUTEX_INITIALIZER;
static colld_client_t *live_clients; /* this process's connected clients (fork_mu) */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* Before fork: no client is being added or removed while the child's copy is made. */
static void fork_prepare(void)
{
    pthread_mutex_lock(&fork_mu);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&fork_mu);
}

/* In the child (one thread, the forking one, which holds fork_mu): drop the session's descriptors
 * and mark every client lost. Only close() and stores: nothing that could wait for a lock another
 * thread of the parent held at the fork. */
static void fork_child(void)
{
    for (colld_client_t *c = live_clients; c; c = c->fork_next) {
        c->forked_from = c->pid;
        atomic_store(&c->lost, true);
        int *fds[] = { &c->sock, &c->efd, &c->wake_pipe[0], &c->wake_pipe[1] };
        for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
            if (*fds[i] >= 0)
                close(*fds[i]);
            *fds[i] = -1;
        }
        c->monitor_started = false; /* the monitor thread is not in this process */
    }
    pthread_mutex_unlock(&fork_mu);
}

static void fork_install(void)
{
    if (pthread_atfork(fork_prepare, fork_parent, fork_child) != 0)
        LOG_WARN(CLIENT, "pthread_atfork failed: a forked child would keep this process's colld session open");
}

/* Add c to this process's clients (at the end of a successful connect). */
static void fork_track(colld_client_t *c)
{
    pthread_once(&fork_once, fork_install);
    c->pid = getpid();
    pthread_mutex_lock(&fork_mu);
    c->fork_next = live_clients;
    live_clients = c;
    pthread_mutex_unlock(&fork_mu);
}

/* Remove c from this process's clients (no-op when it was never added). */
static void fork_untrack(colld_client_t *c)
{
    pthread_mutex_lock(&fork_mu);
    for (colld_client_t **pp = &live_clients; *pp; pp = &(*pp)->fork_next)
        if (*pp == c) {
            *pp = c->fork_next;
            break;
        }
    pthread_mutex_unlock(&fork_mu);
}

/* ============================================================================================
 * Connect / disconnect
 * ========================================================================================== */

/* Map the daemon's ring memory and check its header. */
static colld_status_t map_rings(colld_client_t *c, int shm_fd, const colld_wire_msg_t *w)
{
    uint64_t size = w->u.welcome.shm_size;
    uint32_t entries = w->u.welcome.sq_entries;
    if (size < sizeof(colld_wire_shm_t) || entries == 0 || (entries & (entries - 1)) ||
        w->u.welcome.cq_entries != entries)
        return COLLD_ERR_PROTOCOL;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, 0);
    if (p == MAP_FAILED)
        return COLLD_ERR_SYSTEM;
    c->shm = p;
    c->shm_size = size;
    if (c->shm->magic != COLLD_WIRE_MAGIC || c->shm->total_size != size ||
        c->shm->sq_offset + (uint64_t)entries * sizeof(colld_wire_sqe_t) > size ||
        c->shm->cq_offset + (uint64_t)entries * sizeof(colld_wire_cqe_t) > size)
        return COLLD_ERR_PROTOCOL;
    c->entries = entries;
    c->sqes = (colld_wire_sqe_t *)((char *)p + c->shm->sq_offset);
    c->cqes = (colld_wire_cqe_t *)((char *)p + c->shm->cq_offset);
    c->sq_head = COLLD_LOAD_ACQ(&c->shm->sq.head);
    c->cq_tail = COLLD_LOAD_ACQ(&c->shm->cq.tail);
    return COLLD_OK;
}

/* Free everything of a client (whatever was set up). */
static void client_free(colld_client_t *c)
{
    if (c->monitor_started) {
        char b = 1;
        ssize_t rc = write(c->wake_pipe[1], &b, 1);
        (void)rc;
        pthread_join(c->monitor, NULL);
    }
    colld_rpc_channel_destroy(c->rpc);
    if (c->gpu)
        colld__gpu_client_free(c); /* deregisters through the session socket: before it closes */
    colld__mem_client_free(c);
    if (c->sock >= 0)
        close(c->sock);
    for (int i = 0; i < 2; i++)
        if (c->wake_pipe[i] >= 0)
            close(c->wake_pipe[i]);
    for (uint32_t h = 0; h < c->ncomms_slots; h++)
        if (c->comms[h])
            colld__pending_drop_all(c, c->comms[h]);
    colld__stage_free_all(c);
    for (size_t i = 0; i < c->nregs; i++)
        munmap(c->regs[i].base, c->regs[i].size);
    free(c->regs);
    if (c->shm)
        munmap(c->shm, c->shm_size);
    if (c->efd >= 0)
        close(c->efd);
    for (uint32_t h = 0; h < c->ncomms_slots; h++)
        if (c->comms[h]) {
            colld__fast_detach(c->comms[h]);
            free(c->comms[h]);
        }
    free(c->comms);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->sock_mu);
    free(c);
}

/* Why this thread's last colld_connect failed (colld_last_error(NULL)). */
static _Thread_local char connect_error[COLLD_CLIENT_DETAIL_LEN];

/* Record why a connect failed, for colld_last_error(NULL), and log it. Returns st. */
static colld_status_t connect_failed(colld_status_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static colld_status_t connect_failed(colld_status_t st, const char *fmt, ...)
{
    char text[COLLD_CLIENT_DETAIL_LEN - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    snprintf(connect_error, sizeof(connect_error), "%s: %s", colld_status_name(st), text);
    LOG_WARN(CLIENT, "%s", connect_error);
    return st;
}

colld_status_t colld_connect(const char *socket_path, colld_client_t **out)
{
    return colld__connect_role(socket_path, COLLD_ROLE_CLIENT, out);
}

/* Connect with a role: collctl connects as COLLD_ROLE_ADMIN so operators' tools are not counted
 * as workload sessions. */
colld_status_t colld__connect_role(const char *socket_path, int role, colld_client_t **out)
{
    colld_status_t st = COLLD_ERR_INVALID_ARGUMENT;
    colld_client_t *c = NULL;
    int fds[2] = { -1, -1 };
    if (!out)
        return COLLD_ERR_INVALID_ARGUMENT;
    *out = NULL;
    pthread_once(&log_once, client_log_init);
    connect_error[0] = '\0';

    c = calloc(1, sizeof(*c));
    if (!c)
        return COLLD_ERR_NO_MEMORY;
    c->sock = c->efd = c->wake_pipe[0] = c->wake_pipe[1] = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->sock_mu, NULL);
    c->hooks = (colld_client_hooks_t){ .fast_finish = colld__fast_finish };
    if (colld__gpu_client_init(c) != COLLD_OK) {
        client_free(c);
        return COLLD_ERR_NO_MEMORY;
    }
    if (!socket_path)
        socket_path = colld_config_env("COLLD_SOCKET");
    if (socket_path)
        colld_strlcpy(c->socket_path, socket_path, sizeof(c->socket_path));
    else
        colld_default_socket_path(c->socket_path, sizeof(c->socket_path));

    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(c->socket_path) >= sizeof(sa.sun_path) - 8) {
        connect_failed(st, "socket path too long: %s", c->socket_path);
        goto fail;
    }
    strcpy(sa.sun_path, c->socket_path);
    c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->sock < 0) {
        st = COLLD_ERR_SYSTEM;
        goto fail;
    }
    if (connect(c->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        st = errno == EACCES ? COLLD_ERR_PERMISSION_DENIED : COLLD_ERR_DAEMON_UNAVAILABLE;
        connect_failed(st, "cannot connect to colld at %s: %s (is colld running? set COLLD_SOCKET to its socket)",
                       c->socket_path, strerror(errno));
        goto fail;
    }
    struct timeval tv = { .tv_sec = COLLD_CLIENT_RPC_TIMEOUT_MS / 1000 };
    setsockopt(c->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

    colld_wire_msg_t hello, welcome;
    memset(&hello, 0, sizeof(hello));
    memset(&welcome, 0, sizeof(welcome));
    hello.type = COLLD_MSG_HELLO;
    hello.u.hello.role = (uint32_t)role;
    colld_str_sanitize(hello.u.hello.process_name, sizeof(hello.u.hello.process_name), program_invocation_short_name,
                       SIZE_MAX); /* cut between characters */
    st = colld__sock_request(c, &hello, -1, COLLD_MSG_WELCOME, &welcome, fds, 2);
    if (st == COLLD_OK && welcome.status != COLLD_OK) {
        st = welcome.status >= COLLD_ERR_LAST && welcome.status < COLLD_OK ? welcome.status : COLLD_ERR_PROTOCOL;
        welcome.u.detail[sizeof(welcome.u.detail) - 1] = '\0';
        for (char *p = welcome.u.detail; *p; p++) /* the daemon's words, printed: no control characters */
            if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
                *p = '?';
        connect_failed(st, "colld at %s refused the session: %s", c->socket_path, welcome.u.detail);
        goto fail;
    }
    if (st != COLLD_OK || fds[0] < 0 || fds[1] < 0) {
        st = st == COLLD_OK ? COLLD_ERR_PROTOCOL : st;
        connect_failed(st, "no valid answer from colld at %s", c->socket_path);
        goto fail;
    }
    c->session_id = welcome.u.welcome.session_id;
    memcpy(c->token, welcome.u.welcome.token, sizeof(c->token));
    c->efd = fds[1];
    fds[1] = -1;
    st = map_rings(c, fds[0], &welcome);
    close(fds[0]);
    fds[0] = -1;
    if (st != COLLD_OK)
        goto fail;

    char target[300];
    snprintf(target, sizeof(target), "unix:%s.rpc", c->socket_path);
    if (colld_rpc_channel_create(target, &c->rpc) < 0) {
        st = COLLD_ERR_SYSTEM;
        goto fail;
    }
    Colld__V1__AttachRequest req = COLLD__V1__ATTACH_REQUEST__INIT;
    Colld__V1__SessionRef ref = COLLD__V1__SESSION_REF__INIT;
    colld__client_session_ref(c, &ref);
    req.session = &ref;
    req.api_version = COLLD_API_VERSION;
    Colld__V1__AttachResponse *resp = NULL;
    char detail[256] = "";
    st = colld__client_rpc(c, "/colld.v1.Colld/Attach", &req.base, &colld__v1__attach_response__descriptor,
                           COLLD_CLIENT_RPC_TIMEOUT_MS, (ProtobufCMessage **)&resp, detail, sizeof(detail));
    if (st != COLLD_OK) {
        connect_failed(st, "attach to colld at %s failed: %s", c->socket_path, detail);
        goto fail;
    }
    c->default_timeout_ms = (int)resp->default_timeout_ms;
    protobuf_c_message_free_unpacked(&resp->base, NULL);

    if (pipe2(c->wake_pipe, O_CLOEXEC) < 0 || pthread_create(&c->monitor, NULL, monitor_main, c) != 0) {
        st = COLLD_ERR_SYSTEM;
        goto fail;
    }
    c->monitor_started = true;
    fork_track(c);
    *out = c;
    return COLLD_OK;
fail:
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    client_free(c);
    return st;
}

colld_status_t colld_disconnect(colld_client_t *c)
{
    if (!c)
        return COLLD_ERR_INVALID_ARGUMENT;
    fork_untrack(c);
    if (c->forked_from)
        return COLLD_OK; /* a fork's copy: the parent's state is not this process's to release */
    for (uint32_t h = 0; h < c->ncomms_slots; h++)
        if (c->comms[h])
            LOG_WARN(CLIENT, "disconnect with communicator %llu still alive: its peers will see this rank as lost",
                     (unsigned long long)c->comms[h]->comm_id);
    client_free(c);
    return COLLD_OK;
}

/* The client's zero-copy and staging counters (staging.c counts them), up to stats->size. */
colld_status_t colld_client_stats(colld_client_t *c, colld_client_stats_t *stats)
{
    if (!c || !stats || stats->size < offsetof(colld_client_stats_t, zero_copy) + sizeof(uint64_t))
        return COLLD_ERR_INVALID_ARGUMENT;
    colld_client_stats_t all = {
        .size = stats->size < sizeof(all) ? stats->size : sizeof(all),
        .zero_copy = atomic_load_explicit(&c->zero_copy_ops, memory_order_relaxed),
        .staged = atomic_load_explicit(&c->staged_ops, memory_order_relaxed),
        .staged_bytes = atomic_load_explicit(&c->staged_bytes, memory_order_relaxed),
    };
    memcpy(stats, &all, all.size);
    return COLLD_OK;
}

/* The detail of the last error of a client, or of this thread's last failed connect (c NULL). */
const char *colld_last_error(colld_client_t *c)
{
    if (!c)
        return connect_error;
    return c->last_error;
}
