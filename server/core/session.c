/*
 * session.c - a client session as the rest of the daemon uses it: its references, its registered
 * buffers, its rings, and the replies and the kill request sent to it.
 *
 * The engine, the completions, the fast area and the backends reach a session only through these;
 * nothing here reaches communicators. How a session comes and goes (the socket, its messages, the
 * watch on its process, the communicators it leaves) is session_socket.c's.
 */
#include "server/core/daemon.h"
#include "server/core/tenant.h"

#include "common/log.h"
#include "common/util.h"
#include "transport/shm/shm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

/* ============================================================================================
 * Registrations
 * ========================================================================================== */

/* Drop one reference of a registration; the mapping goes away with the last one (lock held). */
void colld_session_release_reg(colld_reg_t *r)
{
    if (--r->refs > 0)
        return;
    if (r->charged)
        colld_tenant_uncharge_reg(r->daemon, r->tenant, r->charged);
    colld_tenant_uncharge_mem(r->daemon, r->tenant, r->mem_charged);
    if (r->device)
        r->backend->ops->mem_release(r->backend, r);
    else
        (void)SYS_CHECK(MEM, munmap(r->base, r->size));
    free(r);
}

/* Find a live registration of a session by id (lock held). */
colld_reg_t *colld_session_find_reg(colld_session_t *s, uint32_t id)
{
    for (colld_reg_t *r = s->regs; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

/* ============================================================================================
 * Session lifetime
 * ========================================================================================== */

/* Drop a reference; the last one unmaps the rings and registrations and frees (lock held). */
void colld_session_unref(colld_session_t *s)
{
    if (--s->refs > 0)
        return;
    while (s->regs) {
        colld_reg_t *r = s->regs;
        s->regs = r->next;
        colld_session_release_reg(r);
    }
    if (s->seg_charged) /* a GPU registration left half-assembled (its segments: the backend's) */
        colld_tenant_uncharge_reg(s->daemon, s->uid, s->seg_charged);
    s->seg_charged = 0;
    colld_backends_session_free(s->daemon, s);
    colld_tenant_uncharge_mem(s->daemon, s->uid, s->mem_charged);
    s->mem_charged = 0;
    if (s->shm)
        (void)SYS_CHECK(SESSION, munmap(s->shm, s->shm_size));
    if (s->shm_fd >= 0)
        close(s->shm_fd);
    if (s->efd >= 0)
        close(s->efd);
    if (s->pending_fd >= 0)
        close(s->pending_fd);
    free(s->handles);
    free(s);
}

/* Find a live session by id and token, comparing the token in constant time (lock held). */
colld_session_t *colld_session_find(colld_daemon_t *d, uint64_t id, const uint8_t *token)
{
    for (colld_session_t *s = d->sessions; s; s = s->next) {
        if (s->id != id || s->dead || !s->shm)
            continue; /* no token before WELCOME */
        unsigned diff = 0;
        for (int i = 0; i < COLLD_WIRE_TOKEN_BYTES; i++)
            diff |= (unsigned)(s->token[i] ^ token[i]);
        return diff == 0 ? s : NULL;
    }
    return NULL;
}

/* ============================================================================================
 * Sending
 * ========================================================================================== */

/* Send one message with up to two fds. Never blocks: a client that does not read its socket
 * loses its session. Returns 0 or -1. */
int colld_session_send(colld_session_t *s, colld_wire_msg_t *m, const int *fds, int nfds)
{
    m->magic = COLLD_WIRE_MAGIC;
    m->version = COLLD_WIRE_VERSION;
    struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } cm;
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (nfds > 0) {
        memset(&cm, 0, sizeof(cm));
        mh.msg_control = cm.buf;
        mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
    }
    ssize_t n;
    do {
        n = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof(*m)) {
        LOG_WARN_RL(SESSION, "session %llu (pid %d): cannot send reply: %s", (unsigned long long)s->id,
                    (int)s->pid, n < 0 ? strerror(errno) : "short write");
        return -1;
    }
    return 0;
}

/* Send an error reply of the given type. */
int colld_session_send_status(colld_session_t *s, uint16_t type, colld_status_t st, const char *detail)
{
    colld_wire_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.status = st;
    colld_strlcpy(m.u.detail, detail, sizeof(m.u.detail));
    return colld_session_send(s, &m, NULL, 0);
}

/* Send an error reply with err's status and message (its first COLLD_WIRE_DETAIL_BYTES - 1). */
int colld_session_send_error(colld_session_t *s, uint16_t type, const colld_err_t *err)
{
    return colld_session_send_status(s, type, err->status, err->msg);
}

/* ============================================================================================
 * Messages
 * ========================================================================================== */

/* The bytes of a session's rings (its shared memory). */
uint64_t colld_session_rings_bytes(const colld_daemon_t *d)
{
    uint64_t entries = (uint64_t)d->cfg.ring_entries;
    uint64_t hdr = (sizeof(colld_wire_shm_t) + 4095) & ~(uint64_t)4095;
    return (hdr + entries * (sizeof(colld_wire_sqe_t) + sizeof(colld_wire_cqe_t)) + 4095) & ~(uint64_t)4095;
}

/* Create the session's shared memory (sealed so the client cannot shrink it under the daemon)
 * and its eventfd. Returns 0 or -1. */
int colld_session_make_rings(colld_session_t *s)
{
    uint32_t entries = (uint32_t)s->daemon->cfg.ring_entries;
    size_t hdr = (sizeof(colld_wire_shm_t) + 4095) & ~(size_t)4095;
    size_t sq = (size_t)entries * sizeof(colld_wire_sqe_t);
    size_t total = colld_session_rings_bytes(s->daemon);
    char name[64];
    void *p;
    snprintf(name, sizeof(name), "colld-session-%llu", (unsigned long long)s->id);
    if (colld_shm_create(name, total, &s->shm_fd, &p) < 0)
        goto fail;
    s->shm = p;
    s->shm_size = total;
    s->entries = entries;
    s->shm->magic = COLLD_WIRE_MAGIC;
    s->shm->version = COLLD_WIRE_VERSION;
    s->shm->sq_entries = entries;
    s->shm->cq_entries = entries;
    s->shm->sq_offset = hdr;
    s->shm->cq_offset = hdr + sq;
    s->shm->total_size = total;
    s->sqes = (colld_wire_sqe_t *)((char *)s->shm + hdr);
    s->cqes = (colld_wire_cqe_t *)((char *)s->shm + hdr + sq);
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0)
        goto fail;
    return 0;
fail:
    LOG_ERROR_RL(SESSION, "session %llu: cannot create rings: %s", (unsigned long long)s->id,
                 strerror(errno));
    return -1;
}

/* ============================================================================================
 * Kill and creation
 * ========================================================================================== */

/* Ask the loop thread to drop a session that broke the ring protocol (lock held). */
void colld_session_kill(colld_session_t *s, const char *why)
{
    if (s->kill_requested)
        return;
    LOG_WARN_RL(ENGINE, "session %llu (pid %d): %s; dropping it", (unsigned long long)s->id, (int)s->pid, why);
    s->kill_requested = true;
    uv_async_send(&s->daemon->async);
}

colld_session_t *colld_session_new(colld_daemon_t *d, pid_t pid, uid_t uid, gid_t gid)
{
    colld_session_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->daemon = d;
    s->pid = pid;
    s->uid = uid;
    s->gid = gid;
    s->fd = s->shm_fd = s->efd = s->pending_fd = s->pidfd = -1;
    s->attached_ms = colld_wall_ms();
    s->refs = 1;
    return s;
}
