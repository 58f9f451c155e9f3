/*
 * client.c - libcolld's connection to the local daemon: the session socket, the shared-memory
 * rings, the monitor thread that turns a lost daemon into COLLD_ERR_DAEMON_LOST (and releases the
 * GPU streams waiting on it), and memory shared with the daemon (host here, GPU in cuda.c).
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

#define SPIN_ITERS 2000        /* polls before a waiter sleeps on the futex */
#define WAIT_SLICE_NS 50000000 /* a sleeping waiter re-checks at least this often */

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
 * Session socket
 * ========================================================================================== */

/* Send one message (and an optional fd) and receive the reply of `reply_type`. Serialised by
 * sock_mu. Returns COLLD_OK or DAEMON_LOST / PROTOCOL. */
colld_status_t colld__sock_request(colld_client_t *c, colld_wire_msg_t *m, int fd, uint16_t reply_type,
                                   colld_wire_msg_t *reply, int *fds_out, int nfds_out)
{
    colld_status_t st = COLLD_ERR_DAEMON_LOST;
    m->magic = COLLD_WIRE_MAGIC;
    m->version = COLLD_WIRE_VERSION;
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } cm;
    memset(&cm, 0, sizeof(cm));
    struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (fd >= 0) {
        mh.msg_control = cm.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int));
        struct cmsghdr *h = CMSG_FIRSTHDR(&mh);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &fd, sizeof(int));
    }
    for (int i = 0; i < nfds_out; i++)
        fds_out[i] = -1;
    pthread_mutex_lock(&c->sock_mu);
    ssize_t n;
    do {
        n = sendmsg(c->sock, &mh, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    /* A daemon that refuses a connection answers before it reads and closes at once, so the
     * request may fail to go out while the answer waits to be read: read it anyway. */
    if (n != (ssize_t)sizeof(*m) && !(n < 0 && (errno == EPIPE || errno == ECONNRESET)))
        goto out;
    size_t got = 0;
    while (got < sizeof(*reply)) {
        struct iovec riov = { .iov_base = (char *)reply + got, .iov_len = sizeof(*reply) - got };
        memset(&cm, 0, sizeof(cm));
        struct msghdr rh = { .msg_iov = &riov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf) };
        n = recvmsg(c->sock, &rh, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            goto out;
        for (struct cmsghdr *h = CMSG_FIRSTHDR(&rh); h; h = CMSG_NXTHDR(&rh, h)) {
            if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
                continue;
            int nf = (int)((h->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < nf; i++) {
                int rfd;
                memcpy(&rfd, CMSG_DATA(h) + (size_t)i * sizeof(int), sizeof(int));
                if (i < nfds_out && fds_out[i] < 0)
                    fds_out[i] = rfd;
                else
                    close(rfd);
            }
        }
        got += (size_t)n;
    }
    st = (reply->magic == COLLD_WIRE_MAGIC && reply->type == reply_type) ? COLLD_OK : COLLD_ERR_PROTOCOL;
out:
    pthread_mutex_unlock(&c->sock_mu);
    if (st != COLLD_OK) {
        for (int i = 0; i < nfds_out; i++)
            if (fds_out[i] >= 0) {
                close(fds_out[i]);
                fds_out[i] = -1;
            }
        if (st == COLLD_ERR_DAEMON_LOST)
            atomic_store(&c->lost, true);
    }
    return st;
}

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
        st = welcome.status >= COLLD_ERR_INTERNAL && welcome.status < COLLD_OK ? welcome.status : COLLD_ERR_PROTOCOL;
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
    for (uint32_t h = 0; h < c->ncomms_slots; h++)
        if (c->comms[h])
            LOG_WARN(CLIENT, "disconnect with communicator %llu still alive: its peers will see this rank as lost",
                     (unsigned long long)c->comms[h]->comm_id);
    client_free(c);
    return COLLD_OK;
}

/* ============================================================================================
 * Control-plane calls
 * ========================================================================================== */

void colld__client_session_ref(colld_client_t *c, void *ref)
{
    Colld__V1__SessionRef *r = ref;
    r->id = c->session_id;
    r->token.data = c->token;
    r->token.len = sizeof(c->token);
}

/* One unary call; maps transport failures to colld statuses and the response's own status
 * field (every response starts with status and detail) to the return value. */
colld_status_t colld__client_rpc(colld_client_t *c, const char *method, const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                                 ProtobufCMessage **resp, char *detail, size_t detail_len)
{
    *resp = NULL;
    if (atomic_load(&c->lost)) {
        colld_strlcpy(detail, "the connection to the colld daemon was lost", detail_len);
        return COLLD_ERR_DAEMON_LOST;
    }
    grpc_status_code code = colld_rpc_unary(c->rpc, method, req, resp_desc, timeout_ms, resp, detail, detail_len);
    switch (code) {
    case GRPC_STATUS_OK:
        break;
    case GRPC_STATUS_UNAVAILABLE:
    case GRPC_STATUS_CANCELLED:
        atomic_store(&c->lost, true);
        return COLLD_ERR_DAEMON_LOST;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return COLLD_ERR_TIMEOUT;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: /* a limit of the daemon (the detail names it) */
        return COLLD_ERR_QUOTA_EXCEEDED;
    case GRPC_STATUS_UNIMPLEMENTED:
        return COLLD_ERR_PROTOCOL;
    default:
        return COLLD_ERR_INTERNAL;
    }
    /* Field 1 is `int32 status`, field 2 `string detail` in every colld response. */
    const ProtobufCFieldDescriptor *fs = protobuf_c_message_descriptor_get_field(resp_desc, 1);
    const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(resp_desc, 2);
    int32_t status = *(const int32_t *)((const char *)*resp + fs->offset);
    const char *text = *(char *const *)((const char *)*resp + fd->offset);
    if (status != COLLD_OK) {
        colld_strlcpy(detail, text ? text : "", detail_len);
        protobuf_c_message_free_unpacked(*resp, NULL);
        *resp = NULL;
    }
    return (colld_status_t)status;
}

/* ============================================================================================
 * Rings
 * ========================================================================================== */

/* Reap completions into their communicators (mu held). */
static void reap(colld_client_t *c)
{
    int64_t avail = colld_ring_avail(&c->shm->cq, c->cq_tail, c->entries);
    if (avail < 0) {
        if (!atomic_exchange(&c->lost, true))
            LOG_ERROR(CLIENT, "corrupt completion ring; treating the daemon as lost");
        return;
    }
    for (int64_t i = 0; i < avail; i++) {
        colld_wire_cqe_t e = c->cqes[c->cq_tail & (c->entries - 1)];
        c->cq_tail++;
        colld_comm_t *comm = e.comm < c->ncomms_slots ? c->comms[e.comm] : NULL;
        if (!comm)
            continue;
        if (e.seq == 0) { /* a notice: the communicator broke, nothing completed */
            if (e.status != COLLD_OK && __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED) == COLLD_OK)
                __atomic_store_n(&comm->async_error, (colld_status_t)e.status, __ATOMIC_RELAXED);
            continue;
        }
        if (comm->pending)
            colld__pending_complete(c, comm, e.seq, (colld_status_t)e.status);
        if (e.status != COLLD_OK && __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED) == COLLD_OK)
            __atomic_store_n(&comm->async_error, (colld_status_t)e.status, __ATOMIC_RELAXED);
        __atomic_add_fetch(&comm->completed, 1, __ATOMIC_RELEASE);
    }
    if (!avail)
        return;
    COLLD_STORE_SC(&c->shm->cq.tail, c->cq_tail);
    /* The daemon holds descriptors back until completion space frees up: tell it. */
    if (COLLD_LOAD_SC(&c->shm->cq.need_wakeup)) {
        uint64_t one = 1;
        ssize_t rc = write(c->efd, &one, sizeof(one));
        (void)rc; /* EAGAIN: the counter is saturated, the daemon is being woken anyway */
    }
}

void colld__client_poll(colld_client_t *c)
{
    pthread_mutex_lock(&c->mu);
    reap(c);
    pthread_mutex_unlock(&c->mu);
}

/* Sleep on the completion doorbell unless something is already there (no lost wake-up: the
 * value is read before the ring is re-checked). */
static void sleep_on_doorbell(colld_client_t *c)
{
    uint32_t v = COLLD_LOAD_SC(&c->shm->cq.doorbell);
    __atomic_add_fetch(&c->shm->cq.waiters, 1, __ATOMIC_SEQ_CST);
    if (colld_ring_avail(&c->shm->cq, c->cq_tail, c->entries) == 0 && !atomic_load(&c->lost))
        colld_futex_wait(&c->shm->cq.doorbell, v, WAIT_SLICE_NS);
    __atomic_sub_fetch(&c->shm->cq.waiters, 1, __ATOMIC_SEQ_CST);
}

colld_status_t colld__client_submit(colld_client_t *c, const colld_wire_sqe_t *sqes, size_t n)
{
    size_t done = 0;
    for (unsigned spins = 0; done < n; spins++) {
        if (atomic_load(&c->lost))
            return COLLD_ERR_DAEMON_LOST;
        pthread_mutex_lock(&c->mu);
        int64_t space = colld_ring_space(&c->shm->sq, c->sq_head, c->entries);
        if (space < 0) {
            pthread_mutex_unlock(&c->mu);
            atomic_store(&c->lost, true);
            return COLLD_ERR_PROTOCOL;
        }
        if (space > 0) {
            /* Publish as many as fit, then one head store and at most one wake-up. */
            for (; space > 0 && done < n; space--, done++) {
                c->sqes[c->sq_head & (c->entries - 1)] = sqes[done];
                c->sq_head++;
            }
            COLLD_STORE_SC(&c->shm->sq.head, c->sq_head);
            if (COLLD_LOAD_SC(&c->shm->sq.need_wakeup)) {
                uint64_t one = 1;
                ssize_t rc = write(c->efd, &one, sizeof(one));
                (void)rc; /* EAGAIN: the counter is saturated, the daemon is being woken anyway */
            }
            pthread_mutex_unlock(&c->mu);
            spins = 0;
            continue;
        }
        /* Ring full: the daemon drains it as completions are consumed, so reap and retry. */
        reap(c);
        pthread_mutex_unlock(&c->mu);
        if (spins < SPIN_ITERS)
            sched_yield();
        else {
            struct timespec ts = { 0, 20000 };
            nanosleep(&ts, NULL);
        }
    }
    return COLLD_OK;
}

colld_status_t colld__client_wait(colld_client_t *c, colld_comm_t *comm)
{
    (void)colld__fast_finish(comm, true); /* a failure is the communicator's error, returned below */
    for (unsigned spins = 0;; spins++) {
        pthread_mutex_lock(&c->mu);
        reap(c);
        bool done = comm->completed >= comm->issued;
        colld_status_t err = comm->async_error;
        pthread_mutex_unlock(&c->mu);
        if (done)
            return err;
        if (atomic_load(&c->lost))
            return COLLD_ERR_DAEMON_LOST;
        if (spins < SPIN_ITERS) {
            sched_yield();
            continue;
        }
        sleep_on_doorbell(c);
    }
}

/* ============================================================================================
 * Communicator table (mu held by callers that race with reap)
 * ========================================================================================== */

int colld__client_add_comm(colld_client_t *c, colld_comm_t *comm)
{
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (comm->handle >= c->ncomms_slots) {
        uint32_t n = c->ncomms_slots ? c->ncomms_slots : 8;
        while (n <= comm->handle)
            n *= 2;
        colld_comm_t **t = realloc(c->comms, n * sizeof(*t));
        if (!t) {
            rc = -1;
            goto out;
        }
        memset(t + c->ncomms_slots, 0, (n - c->ncomms_slots) * sizeof(*t));
        c->comms = t;
        c->ncomms_slots = n;
    }
    c->comms[comm->handle] = comm;
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void colld__client_remove_comm(colld_client_t *c, colld_comm_t *comm)
{
    pthread_mutex_lock(&c->mu);
    if (comm->handle < c->ncomms_slots && c->comms[comm->handle] == comm)
        c->comms[comm->handle] = NULL;
    pthread_mutex_unlock(&c->mu);
}

/* ============================================================================================
 * Memory shared with the daemon
 * ========================================================================================== */

int colld__client_lookup(colld_client_t *c, const void *p, size_t bytes, colld_wire_buf_t *out)
{
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < c->nregs; i++) {
        uintptr_t b = (uintptr_t)c->regs[i].base;
        if (a < b || a - b >= c->regs[i].bytes)
            continue;
        if (bytes > c->regs[i].bytes - (a - b))
            return -2; /* starts inside, runs past the end */
        out->reg_id = c->regs[i].reg_id;
        out->reserved = 0;
        out->offset = a - b;
        return 0;
    }
    return -1;
}

void colld__client_lookup2(colld_client_t *c, const void *send, size_t send_bytes, const void *recv,
                           size_t recv_bytes, colld_wire_buf_t *wsend, colld_wire_buf_t *wrecv, int *ls, int *lr)
{
    memset(wsend, 0, sizeof(*wsend));
    memset(wrecv, 0, sizeof(*wrecv));
    pthread_mutex_lock(&c->mu);
    *ls = send_bytes ? colld__client_lookup(c, send, send_bytes, wsend) : 0;
    *lr = recv_bytes ? colld__client_lookup(c, recv, recv_bytes, wrecv) : 0;
    pthread_mutex_unlock(&c->mu);
}

/* Create a sealed memfd of at least `bytes`, map it and register it with the daemon. On success
 * *base, *size and *reg_id describe the mapping; nothing else records it. A refusal is not retried:
 * the daemon's status and detail go to the caller (why). */
colld_status_t colld__register(colld_client_t *c, size_t bytes, void **base, size_t *size, uint32_t *reg_id,
                               char *why, size_t why_len)
{
    colld_set_err(why, why_len, "%s", "");
    if (atomic_load(&c->lost)) {
        colld_set_err(why, why_len, "the connection to the colld daemon was lost");
        return COLLD_ERR_DAEMON_LOST;
    }
    colld_status_t st = COLLD_ERR_SYSTEM;
    void *p = MAP_FAILED;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes == 0 || bytes > SIZE_MAX - page) {
        colld_set_err(why, why_len, "cannot share %zu bytes", bytes);
        return COLLD_ERR_INVALID_ARGUMENT;
    }
    size_t sz = (bytes + page - 1) & ~(page - 1);
    int fd = memfd_create("colld-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)sz) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        st = errno == ENOMEM || errno == ENOSPC ? COLLD_ERR_NO_MEMORY : COLLD_ERR_SYSTEM;
        colld_set_err(why, why_len, "cannot create shared memory: %s", strerror(errno));
        goto out;
    }
    p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        st = COLLD_ERR_NO_MEMORY;
        colld_set_err(why, why_len, "cannot map shared memory: %s", strerror(errno));
        goto out;
    }
    colld_wire_msg_t m, r;
    memset(&m, 0, sizeof(m));
    memset(&r, 0, sizeof(r));
    m.type = COLLD_MSG_REG;
    m.u.reg.bytes = sz;
    m.u.reg.cookie = (uintptr_t)p;
    st = colld__sock_request(c, &m, fd, COLLD_MSG_REG_REPLY, &r, NULL, 0);
    if (st == COLLD_OK && r.status != COLLD_OK) {
        /* The daemon's detail is a tenant-visible string from the wire: bounded and checked. */
        char detail[sizeof(r.u.detail)];
        colld_str_sanitize(detail, sizeof(detail), r.u.detail, sizeof(r.u.detail));
        st = r.status < 0 ? (colld_status_t)r.status : COLLD_ERR_PROTOCOL;
        colld_set_err(why, why_len, "the daemon refused to register %zu bytes: %s", bytes, detail);
        LOG_WARN(CLIENT, "registering %zu bytes with colld: %s: %s", bytes, colld_status_name(st), detail);
    } else if (st != COLLD_OK)
        colld_set_err(why, why_len, "registering %zu bytes: %s", bytes, colld_status_string(st));
    if (st != COLLD_OK)
        goto out;
    *base = p;
    *size = sz;
    *reg_id = r.u.reg_reply.reg_id;
    p = MAP_FAILED;
out:
    if (p != MAP_FAILED)
        munmap(p, sz);
    if (fd >= 0)
        close(fd);
    return st;
}

/* Tell the daemon to forget a registration (its mapping there goes once no operation uses it). */
colld_status_t colld__deregister(colld_client_t *c, uint32_t reg_id)
{
    if (atomic_load(&c->lost))
        return COLLD_OK; /* the memory is ours alone now */
    colld_wire_msg_t m, r;
    memset(&m, 0, sizeof(m));
    memset(&r, 0, sizeof(r));
    m.type = COLLD_MSG_DEREG;
    m.u.dereg.reg_id = reg_id;
    colld_status_t st = colld__sock_request(c, &m, -1, COLLD_MSG_DEREG_REPLY, &r, NULL, 0);
    if (st == COLLD_OK)
        st = r.status;
    return st == COLLD_ERR_DAEMON_LOST ? COLLD_OK : st;
}

colld_status_t colld__client_error(colld_client_t *c, colld_status_t st, const char *fmt, ...)
{
    char text[COLLD_CLIENT_DETAIL_LEN - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    snprintf(c->last_error, sizeof(c->last_error), "%s: %s", colld_status_name(st), text);
    pthread_mutex_unlock(&c->mu);
    LOG_INFO(CLIENT, "%s: %s", colld_status_name(st), text);
    return st;
}

const char *colld_last_error(colld_client_t *c)
{
    if (!c)
        return connect_error;
    return c->last_error;
}

colld_status_t colld_mem_alloc(colld_client_t *c, void **ptr, size_t bytes, colld_memtype_t type)
{
    if (!c)
        return COLLD_ERR_INVALID_ARGUMENT;
    if (!ptr || bytes == 0)
        return colld__client_error(c, COLLD_ERR_INVALID_ARGUMENT, "colld_mem_alloc: %s",
                                   !ptr ? "ptr is NULL" : "0 bytes");
    *ptr = NULL;
    char why[360];
    if (type == COLLD_MEM_CUDA) {
        colld_status_t st = colld__gpu_mem_alloc(c, ptr, bytes, why, sizeof(why));
        return st == COLLD_OK ? st : colld__client_error(c, st, "colld_mem_alloc(%zu bytes, COLLD_MEM_CUDA): %s", bytes, why);
    }
    if (type != COLLD_MEM_HOST)
        return colld__client_error(c, COLLD_ERR_INVALID_ARGUMENT, "colld_mem_alloc: unknown memory type %d", (int)type);
    void *base;
    size_t size;
    uint32_t reg_id;
    colld_status_t st = colld__register(c, bytes, &base, &size, &reg_id, why, sizeof(why));
    if (st != COLLD_OK)
        return colld__client_error(c, st, "colld_mem_alloc(%zu bytes, COLLD_MEM_HOST): %s", bytes, why);
    pthread_mutex_lock(&c->mu);
    if (c->nregs == c->cap_regs) {
        size_t n = c->cap_regs ? c->cap_regs * 2 : 16;
        colld_client_reg_t *t = realloc(c->regs, n * sizeof(*t));
        if (!t) {
            pthread_mutex_unlock(&c->mu);
            colld__deregister(c, reg_id);
            munmap(base, size);
            return COLLD_ERR_NO_MEMORY;
        }
        c->regs = t;
        c->cap_regs = n;
    }
    c->regs[c->nregs++] = (colld_client_reg_t){ .base = base, .size = size, .bytes = bytes, .reg_id = reg_id };
    pthread_mutex_unlock(&c->mu);
    *ptr = base;
    return COLLD_OK;
}

colld_status_t colld_mem_free(colld_client_t *c, void *ptr)
{
    if (!c || !ptr)
        return COLLD_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    size_t i = 0;
    while (i < c->nregs && c->regs[i].base != ptr)
        i++;
    if (i == c->nregs) {
        pthread_mutex_unlock(&c->mu);
        char why[360];
        colld_status_t st = colld__gpu_mem_free(c, ptr, why, sizeof(why)); /* GPU memory, or not ours */
        return st == COLLD_OK ? st : colld__client_error(c, st, "colld_mem_free: %s", why);
    }
    colld_client_reg_t reg = c->regs[i];
    c->regs[i] = c->regs[--c->nregs];
    pthread_mutex_unlock(&c->mu);
    colld_status_t st = colld__deregister(c, reg.reg_id);
    munmap(reg.base, reg.size);
    return st;
}
