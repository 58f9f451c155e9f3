/*
 * conn.c - the primitives of libcolld's connection to the daemon, below everything else of the
 * library: request/reply on the session socket, unary control calls, the communicator table,
 * memory shared with the daemon (registrations and the lookup of pointers in them), the
 * client's last error and why a client is lost. It calls nothing else of the library.
 */
#include "client/client_internal.h"

#include "colld.pb-c.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* ============================================================================================
 * The session socket and the control channel
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
        struct msghdr rh = {
            .msg_iov = &riov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf)
        };
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

/* Why c is lost (see client_internal.h): the daemon went away, or this process is a fork of the
 * one that connected (client.c marks a forked child's clients lost). */
const char *colld__lost_detail(const colld_client_t *c)
{
    static __thread char buf[256];
    if (!c->forked_from)
        return "the connection to the colld daemon was lost";
    snprintf(buf, sizeof(buf),
             "this process (pid %d) is a fork of pid %d, which connected to colld: a forked child cannot use its "
             "parent's connection (colld_connect in the child)",
             (int)getpid(), (int)c->forked_from);
    return buf;
}

/* Fill a request's SessionRef from the client (see client_internal.h). */
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
                                 const ProtobufCMessageDescriptor *resp_desc, int timeout_ms, ProtobufCMessage **resp,
                                 char *detail, size_t detail_len)
{
    *resp = NULL;
    if (atomic_load(&c->lost)) {
        colld_strlcpy(detail, colld__lost_detail(c), detail_len);
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
 * Communicator table (mu held by callers that race with reap)
 * ========================================================================================== */

/* Put a communicator in the table by its daemon handle (growing it). Returns 0 or -1. */
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

/* Take a communicator out of the table. */
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

/* The registration a pointer range lies in (see client_internal.h). */
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
        out->aux = 0;
        out->offset = a - b;
        return 0;
    }
    return -1;
}

/* Both buffers of a collective under one lock (see client_internal.h). */
void colld__client_lookup2(colld_client_t *c, const void *send, size_t send_bytes, const void *recv, size_t recv_bytes,
                           colld_wire_buf_t *wsend, colld_wire_buf_t *wrecv, int *ls, int *lr)
{
    memset(wsend, 0, sizeof(*wsend));
    memset(wrecv, 0, sizeof(*wrecv));
    pthread_mutex_lock(&c->mu);
    *ls = send_bytes ? colld__client_lookup(c, send, send_bytes, wsend) : 0;
    *lr = recv_bytes ? colld__client_lookup(c, recv, recv_bytes, wrecv) : 0;
    pthread_mutex_unlock(&c->mu);
}

/* Allocate every page of a new shared mapping of `bytes`, here and now, so that the memory is
 * charged to this process's memory cgroup: the kernel charges a shared-memory page to the cgroup of
 * the task that makes it, and the daemon refuses a buffer with a page that does not exist yet
 * rather than make it in its own cgroup (issue 26 row 3). MADV_POPULATE_WRITE (Linux 5.14) reports
 * failure; before it, each page is written (a zero, on memory that is zero). Returns 0 or an
 * errno. */
static int populate(void *p, size_t bytes, size_t page)
{
    for (;;) {
        if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0)
            return 0;
        if (errno != EINTR && errno != EAGAIN)
            break;
    }
    if (errno != EINVAL)
        return errno;
    for (size_t off = 0; off < bytes; off += page)
        ((volatile char *)p)[off] = 0;
    return 0;
}

/* Create a memfd of at least `bytes`, sealed against shrinking and growing, allocate it (populate:
 * the pages are this process's memory, not the daemon's), map it and register it with the daemon,
 * which seals it against new writable mappings and hole punching (F_SEAL_FUTURE_WRITE: this
 * mapping stays writable) and against further seals. On success *base, *size and *reg_id describe
 * the mapping; nothing else records it. A refusal is not retried: the daemon's status and detail
 * go to the caller (err). */
colld_status_t colld__register(colld_client_t *c, size_t bytes, void **base, size_t *size, uint32_t *reg_id,
                               colld_err_t *err)
{
    colld_err_clear(err);
    if (atomic_load(&c->lost)) {
        return colld_err_set(err, COLLD_ERR_DAEMON_LOST, "%s", colld__lost_detail(c));
    }
    colld_status_t st = COLLD_ERR_SYSTEM;
    void *p = MAP_FAILED;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes == 0 || bytes > SIZE_MAX - page) {
        return colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "cannot share %zu bytes", bytes);
    }
    size_t sz = (bytes + page - 1) & ~(page - 1);
    int fd = memfd_create("colld-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)sz) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
        st = errno == ENOMEM || errno == ENOSPC ? COLLD_ERR_NO_MEMORY : COLLD_ERR_SYSTEM;
        (void)colld_err_set(err, st, "cannot create shared memory: %s", strerror(errno));
        goto out;
    }
    p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        st = COLLD_ERR_NO_MEMORY;
        (void)colld_err_set(err, st, "cannot map shared memory: %s", strerror(errno));
        goto out;
    }
    int e = populate(p, sz, page);
    if (e) {
        st = e == ENOMEM || e == EFAULT ? COLLD_ERR_NO_MEMORY : COLLD_ERR_SYSTEM;
        (void)colld_err_set(err, st, "cannot allocate %zu bytes of shared memory: %s", sz, strerror(e));
        goto out;
    }
    colld_wire_msg_t m, r;
    memset(&m, 0, sizeof(m));
    memset(&r, 0, sizeof(r));
    m.type = COLLD_MSG_REG;
    m.u.reg.bytes = sz;
    m.u.reg.cookie = (uintptr_t)p;
    st = colld__sock_request(c, &m, fd, COLLD_MSG_REG_REPLY, &r, NULL, 0);
    char detail[COLLD_WIRE_DETAIL_BYTES];
    if (st == COLLD_OK && (st = colld__reply_status(&r, detail)) != COLLD_OK) {
        (void)colld_err_set(err, st, "the daemon refused to register %zu bytes: %s", bytes, detail);
        LOG_WARN(CLIENT, "registering %zu bytes with colld: %s: %s", bytes, colld_status_name(st), detail);
    } else if (st != COLLD_OK)
        (void)colld_err_set(err, st, "registering %zu bytes: %s", bytes, colld_status_string(st));
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

/* Record a client-level error (colld_last_error) and return st. */
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
