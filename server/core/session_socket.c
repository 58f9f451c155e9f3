/*
 * session_socket.c - the session socket: one unix stream connection per client process.
 *
 * The daemon learns the client's uid/gid/pid from SO_PEERCRED (never from what the client says),
 * hands it its shared-memory rings and an eventfd, receives the memfds of its buffers, and sees
 * the process die when the socket closes. Messages are fixed-size colld_wire_msg_t; file
 * descriptors ride along as SCM_RIGHTS. The socket is served by the daemon's libuv loop.
 *
 * The socket alone does not always close with the process: a copy held by another process (a
 * child forked without libcolld's atfork cleanup, a helper the socket was passed to) keeps it
 * open. So the daemon also watches the process itself: a pidfd of the peer (SO_PEERPIDFD where
 * the kernel has it, else pidfd_open of SO_PEERCRED's pid), polled on the loop, readable when the
 * process exits; the session then ends as when its socket closes (its ranks leave, their peers
 * get COLLD_ERR_PEER_LOST). One pidfd per session; without one (an old kernel, EMFILE, a peer in
 * another pid namespace) the daemon says so once and relies on the socket.
 */
#include "server/core/counters.h"
#include "server/core/daemon.h"
#include "server/core/tenant.h"
#include "server/observability/events.h"

#include "common/log.h"
#include "common/util.h"
#include "transport/shm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

/* A registration's memfd: the client seals it against shrinking (the daemon's mapping would
 * SIGBUS); the daemon adds the rest once it has mapped it (session_on_reg). */
#define SEALS_REQUIRED (F_SEAL_SHRINK)
#define SEALS_DAEMON (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5 */
#endif

static void session_drop(colld_session_t *s, const char *why);

/* HELLO: check the version, make the rings, answer WELCOME with the shm fd and eventfd. */
static int session_on_hello(colld_session_t *s, const colld_wire_msg_t *m)
{
    colld_daemon_t *d = s->daemon;
    if (s->shm) {
        colld_session_send_status(s, COLLD_MSG_WELCOME, COLLD_ERR_PROTOCOL, "HELLO sent twice");
        return -1;
    }
    if (m->version != COLLD_WIRE_VERSION) {
        char detail[COLLD_WIRE_DETAIL_BYTES];
        snprintf(detail, sizeof(detail), "wire version %u not supported (daemon speaks %u)", m->version,
                 COLLD_WIRE_VERSION);
        colld_session_send_status(s, COLLD_MSG_WELCOME, COLLD_ERR_PROTOCOL, detail);
        return -1;
    }
    /* The process name is the client's word, shown to operators and logged: kept if it is
     * printable UTF-8, each unacceptable byte or character a '?' (a connection is not refused for
     * its name). The admin role (collctl's sessions, which make no attach/detach events) is
     * checked, not claimed: a tenant that is not an administrator gets the client role. */
    char name[sizeof(s->name)];
    colld_str_sanitize(name, sizeof(name), m->u.hello.process_name, sizeof(m->u.hello.process_name));
    bool admin = m->u.hello.role == COLLD_ROLE_ADMIN && colld_uid_is_admin(s->uid);
    if (m->u.hello.role == COLLD_ROLE_ADMIN && !admin)
        LOG_INFO(SESSION, "session %llu (pid %d, uid %u) asked for the admin role: not an administrator, served as "
                          "a client",
                 (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid);
    /* The engine and the control plane read these fields under the lock: publish them under it. */
    pthread_mutex_lock(&d->lock);
    s->role = admin ? COLLD_ROLE_ADMIN : COLLD_ROLE_CLIENT;
    colld_strlcpy(s->name, name, sizeof(s->name));
    /* The rings are the daemon's memory, made for this tenant: charged to it (an operator's
     * collctl session is not, so it always gets in). */
    colld_err_t err = COLLD_ERR_INIT;
    uint64_t rings = colld_session_rings_bytes(d);
    if (!admin && colld_tenant_charge_mem(d, s->uid, rings, &err) == COLLD_OK)
        s->mem_charged = rings;
    int rc = -2;
    if (err.status == COLLD_OK)
        rc = colld_random_bytes(s->token, sizeof(s->token)) < 0 || colld_session_make_rings(s) < 0 ? -1 : 0;
    if (rc == 0)
        rc = colld_engine_add_session(d, s);
    pthread_mutex_unlock(&d->lock);
    if (rc == -2) {
        LOG_WARN_RL(SESSION, "session %llu (pid %d, uid %u) refused: %s", (unsigned long long)s->id, (int)s->pid,
                    (unsigned)s->uid, err.msg);
        colld_session_send_error(s, COLLD_MSG_WELCOME, &err);
        return -1;
    }
    if (rc < 0) {
        char detail[COLLD_WIRE_DETAIL_BYTES];
        snprintf(detail, sizeof(detail), "daemon cannot create the session rings: %s", strerror(errno));
        colld_session_send_status(s, COLLD_MSG_WELCOME, COLLD_ERR_SYSTEM, detail);
        return -1;
    }
    colld_wire_msg_t w;
    memset(&w, 0, sizeof(w));
    w.type = COLLD_MSG_WELCOME;
    w.status = COLLD_OK;
    w.u.welcome.session_id = s->id;
    memcpy(w.u.welcome.token, s->token, sizeof(s->token));
    w.u.welcome.shm_size = s->shm_size;
    w.u.welcome.sq_entries = s->entries;
    w.u.welcome.cq_entries = s->entries;
    int fds[2] = { s->shm_fd, s->efd };
    if (colld_session_send(s, &w, fds, 2) < 0)
        return -1;
    LOG_INFO(SESSION, "session %llu attached: pid %d uid %u gid %u (%s)%s", (unsigned long long)s->id,
             (int)s->pid, (unsigned)s->uid, (unsigned)s->gid, s->name,
             s->role == COLLD_ROLE_ADMIN ? " [admin]" : "");
    pthread_mutex_lock(&d->lock);
    colld_count_session_opened(d);
    if (s->role == COLLD_ROLE_CLIENT) /* collctl's own sessions are not news */
        colld_event(d, "session_attached", NULL, -1, s->pid, s->id, s->uid, COLLD_OK, "%s, uid %u gid %u", s->name,
                    (unsigned)s->uid, (unsigned)s->gid);
    pthread_mutex_unlock(&d->lock);
    return 0;
}

/* Check a registration's memfd before anything is charged or mapped: shared memory (tmpfs, not
 * hugetlbfs or a file on disk, whose pages the daemon's faults would allocate or read in), at
 * least `bytes` long, sealed against shrinking, and open to the seals the daemon adds once it has
 * mapped it (none of F_SEAL_SEAL, F_SEAL_WRITE, F_SEAL_FUTURE_WRITE: a memfd registers once).
 * Returns 0, or -1 with err. */
static int reg_check_fd(int fd, uint64_t bytes, colld_err_t *err)
{
    struct stat sb;
    struct statfs fs;
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size < bytes || fstatfs(fd, &fs) < 0 ||
        fs.f_type != TMPFS_MAGIC) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "registration fd is not a memfd of at least %llu bytes",
                      (unsigned long long)bytes);
        return -1;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & SEALS_REQUIRED) != SEALS_REQUIRED) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      "registration memfd must be sealed against shrinking (F_SEAL_SHRINK)");
        return -1;
    }
    if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      "registration memfd is sealed against writable mappings (a memfd can be registered once)");
        return -1;
    }
    if (seals & F_SEAL_SEAL) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      "registration memfd must take the daemon's seals (F_SEAL_SEAL is set)");
        return -1;
    }
    return 0;
}

/* Seal a registration's memfd once the daemon has mapped it, then check that every page of
 * [0, bytes) exists. The daemon never makes a page of a tenant's buffer: the kernel charges a
 * shared-memory page to the memory cgroup of the task that makes it, so a fault of the daemon on
 * a page the tenant never touched would move the tenant's memory into the daemon's cgroup (issue
 * 26 row 3: an all-reduce over untouched colld_mem_alloc memory, the daemon OOM-killed). After
 * F_SEAL_FUTURE_WRITE no hole can be made in the file (fallocate PUNCH_HOLE and MADV_REMOVE fail
 * with EPERM) and no new writable mapping of it, while the mappings made before (the client's,
 * the daemon's) stay writable; F_SEAL_GROW and F_SEAL_SEAL keep it so. SEEK_HOLE then finds the
 * first offset without a page (a page in swap counts as allocated; a page fallocate()d but never
 * written counts as a hole, so the client writes its pages, MADV_POPULATE_WRITE). Returns 0, or
 * -1 with err. */
static int reg_seal_and_check(int fd, uint64_t bytes, colld_err_t *err)
{
    if (fcntl(fd, F_ADD_SEALS, SEALS_DAEMON) < 0) {
        if (errno == EINVAL)
            colld_err_set(err, COLLD_ERR_NOT_SUPPORTED,
                          "this kernel cannot seal memory against hole punching (F_SEAL_FUTURE_WRITE, Linux 5.1)");
        else
            colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT, "daemon cannot seal the registration memfd: %s",
                          strerror(errno));
        return -1;
    }
    off_t hole = lseek(fd, 0, SEEK_HOLE);
    if (hole < 0) {
        colld_err_set(err, COLLD_ERR_SYSTEM, "daemon cannot check the registration memfd: %s", strerror(errno));
        return -1;
    }
    if ((uint64_t)hole < bytes) {
        colld_err_set(err, COLLD_ERR_INVALID_ARGUMENT,
                      "memory not allocated: no page at offset %llu of %llu bytes (write every page before "
                      "registering)",
                      (unsigned long long)hole, (unsigned long long)bytes);
        return -1;
    }
    return 0;
}

/* REG: map a memfd the client sent, allocated in full and sealed by the daemon (see above), and
 * answer with its registration id. */
static int session_on_reg(colld_session_t *s, const colld_wire_msg_t *m)
{
    colld_daemon_t *d = s->daemon;
    int fd = s->pending_fd;
    s->pending_fd = -1;
    colld_err_t err = COLLD_ERR_INIT;
    void *base = MAP_FAILED;
    uint64_t bytes = m->u.reg.bytes, charged = 0;
    colld_reg_t *r = NULL;

    if (fd < 0) {
        colld_err_set(&err, COLLD_ERR_INVALID_ARGUMENT, "registration without a file descriptor");
        goto reply;
    }
    if (bytes == 0) {
        colld_err_set(&err, COLLD_ERR_INVALID_ARGUMENT, "registration of 0 bytes");
        goto reply;
    }
    if (reg_check_fd(fd, bytes, &err) < 0)
        goto reply;
    /* The session's bytes, then the tenant's count and bytes and the daemon-wide backstop, and the
     * page tables of the daemon's mapping as the daemon's memory, all charged before the mapping
     * exists (given back if it cannot be made). */
    pthread_mutex_lock(&d->lock);
    uint64_t max = d->cfg.max_registered_bytes;
    if (s->registered_bytes > max || bytes > max - s->registered_bytes)
        colld_err_set(&err, COLLD_ERR_QUOTA_EXCEEDED,
                      "this process is at its limit max-registered-bytes = %llu (holds %llu, asked for %llu more)",
                      (unsigned long long)max, (unsigned long long)s->registered_bytes, (unsigned long long)bytes);
    else if (colld_tenant_charge_reg(d, s->uid, bytes, &charged, &err) == COLLD_OK &&
             colld_tenant_charge_mem(d, s->uid, COLLD_REG_PT_BYTES(bytes), &err) != COLLD_OK)
        colld_tenant_uncharge_reg(d, s->uid, charged);
    pthread_mutex_unlock(&d->lock);
    if (err.status != COLLD_OK)
        goto reply;
    /* Mapped without populating: every page is the tenant's and exists (checked next); the
     * daemon's faults only map them. No transparent huge pages here either: khugepaged would
     * collapse the tenant's pages into a huge page charged to the daemon. */
    base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    r = base == MAP_FAILED ? NULL : calloc(1, sizeof(*r));
    if (!r) {
        colld_err_set(&err, base == MAP_FAILED && errno != ENOMEM ? COLLD_ERR_SYSTEM : COLLD_ERR_NO_MEMORY,
                      "daemon cannot map the buffer: %s", base == MAP_FAILED ? strerror(errno) : "out of memory");
        goto unmap;
    }
    (void)madvise(base, bytes, MADV_NOHUGEPAGE);
    if (reg_seal_and_check(fd, bytes, &err) < 0)
        goto unmap;
    r->base = base;
    r->size = bytes;
    r->refs = 1;
    r->daemon = d;
    r->tenant = s->uid;
    r->charged = charged;
    r->mem_charged = COLLD_REG_PT_BYTES(bytes);
    pthread_mutex_lock(&d->lock);
    r->id = ++s->next_reg_id;
    r->next = s->regs;
    s->regs = r;
    s->registered_bytes += bytes;
    pthread_mutex_unlock(&d->lock);
    colld_wire_msg_t ok;
    memset(&ok, 0, sizeof(ok));
    ok.type = COLLD_MSG_REG_REPLY;
    ok.u.reg_reply.reg_id = r->id;
    ok.u.reg_reply.cookie = m->u.reg.cookie;
    LOG_DEBUG(MEM, "session %llu: registered %llu bytes as %u", (unsigned long long)s->id,
              (unsigned long long)bytes, r->id);
    close(fd);
    return colld_session_send(s, &ok, NULL, 0);
unmap:
    free(r);
    if (base != MAP_FAILED)
        (void)SYS_CHECK(MEM, munmap(base, bytes));
    pthread_mutex_lock(&d->lock);
    colld_tenant_uncharge_reg(d, s->uid, charged);
    colld_tenant_uncharge_mem(d, s->uid, COLLD_REG_PT_BYTES(bytes));
    pthread_mutex_unlock(&d->lock);
reply:
    if (fd >= 0)
        close(fd);
    LOG_INFO_RL(MEM, "session %llu: registration refused: %s", (unsigned long long)s->id, err.msg);
    return colld_session_send_error(s, COLLD_MSG_REG_REPLY, &err);
}

/* DEREG: forget a registration; the mapping stays until operations using it have finished. */
static int session_on_dereg(colld_session_t *s, const colld_wire_msg_t *m)
{
    colld_daemon_t *d = s->daemon;
    colld_status_t st = COLLD_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->lock);
    for (colld_reg_t **pp = &s->regs; *pp; pp = &(*pp)->next) {
        colld_reg_t *r = *pp;
        if (r->id != m->u.dereg.reg_id)
            continue;
        st = COLLD_OK;
        if (r->device && --r->users > 0)
            break; /* the same device allocation is still registered */
        *pp = r->next;
        if (!r->device)
            s->registered_bytes -= r->size;
        colld_session_release_reg(r);
        break;
    }
    pthread_mutex_unlock(&d->lock);
    if (st != COLLD_OK)
        return colld_session_send_status(s, COLLD_MSG_DEREG_REPLY, st, "unknown registration id");
    colld_wire_msg_t ok;
    memset(&ok, 0, sizeof(ok));
    ok.type = COLLD_MSG_DEREG_REPLY;
    return colld_session_send(s, &ok, NULL, 0);
}

/* REG_CUDA: open a GPU allocation (an IPC handle, or a VMM fd) for this session, through the
 * backend that serves device memory. It is charged to the tenant as any registration (when that
 * backend is present; without, it is refused anyway); the same allocation registered again is the
 * same registration and is charged once. */
static int session_on_reg_cuda(colld_session_t *s, const colld_wire_msg_t *m)
{
    colld_daemon_t *d = s->daemon;
    colld_backend_t *dev = colld_backend_device(d);
    int fd = s->pending_fd;
    s->pending_fd = -1;
    colld_err_t err = COLLD_ERR_INIT;
    uint32_t id = 0;
    uint64_t charged = 0;
    if (dev && dev->present) {
        pthread_mutex_lock(&d->lock);
        colld_tenant_charge_reg(d, s->uid, m->u.reg_cuda.bytes, &charged, &err);
        pthread_mutex_unlock(&d->lock);
    }
    if (err.status == COLLD_OK) {
        if (dev)
            dev->ops->mem_register(dev, s, m, fd, &id, &err);
        else
            colld_err_set(&err, COLLD_ERR_NOT_SUPPORTED, "%s", d->device_none);
    }
    if (charged) {
        pthread_mutex_lock(&d->lock);
        colld_reg_t *r = err.status == COLLD_OK ? colld_session_find_reg(s, id) : NULL;
        if (r && !r->charged) {
            r->tenant = s->uid;
            r->charged = charged;
        } else
            colld_tenant_uncharge_reg(d, s->uid, charged);
        pthread_mutex_unlock(&d->lock);
    }
    if (fd >= 0)
        close(fd);
    if (err.status != COLLD_OK) {
        LOG_INFO_RL(MEM, "session %llu: GPU registration refused: %s", (unsigned long long)s->id, err.msg);
        return colld_session_send_error(s, COLLD_MSG_REG_REPLY, &err);
    }
    colld_wire_msg_t ok;
    memset(&ok, 0, sizeof(ok));
    ok.type = COLLD_MSG_REG_REPLY;
    ok.u.reg_reply.reg_id = id;
    ok.u.reg_reply.cookie = m->u.reg_cuda.cookie;
    return colld_session_send(s, &ok, NULL, 0);
}

/* REG_CUDA_SEG: one segment of a GPU registration across several VMM allocations (issue 15 D2;
 * proto/wire.h), which the device backend assembles. The tenant is charged the registration's
 * whole `total` at its first segment, so one that cannot fit is refused before anything is
 * imported; the charge waits in s->seg_charged until the last segment makes the registration (it
 * is then the registration's), or is given back when the assembly fails, starts over or the
 * session ends. The answer of every segment but the last carries registration id 0. */
static int session_on_reg_cuda_seg(colld_session_t *s, const colld_wire_msg_t *m)
{
    colld_daemon_t *d = s->daemon;
    colld_backend_t *dev = colld_backend_device(d);
    int fd = s->pending_fd;
    s->pending_fd = -1;
    colld_err_t err = COLLD_ERR_INIT;
    uint32_t id = 0;
    if (!dev || !dev->present) {
        colld_err_set(&err, COLLD_ERR_NOT_SUPPORTED, "%s", d->device_none);
    } else {
        pthread_mutex_lock(&d->lock);
        if (m->u.reg_cuda_seg.index == 0) { /* a new registration: the one under way, if any, is dropped */
            if (s->seg_charged)
                colld_tenant_uncharge_reg(d, s->uid, s->seg_charged);
            s->seg_charged = 0;
            colld_tenant_charge_reg(d, s->uid, m->u.reg_cuda_seg.total, &s->seg_charged, &err);
        } else if (!s->seg_charged) {
            /* No charged assembly (its first segment was refused here, e.g. over the quota): what
             * the backend may still hold of an earlier one must not become a registration. */
            colld_err_set(&err, COLLD_ERR_INVALID_ARGUMENT,
                          "GPU segment %u of a registration that is not being assembled (its first segment was "
                          "refused, or never sent)",
                          m->u.reg_cuda_seg.index);
        }
        pthread_mutex_unlock(&d->lock);
        if (err.status == COLLD_OK)
            dev->ops->mem_register(dev, s, m, fd, &id, &err);
    }
    pthread_mutex_lock(&d->lock);
    colld_reg_t *r = err.status == COLLD_OK && id ? colld_session_find_reg(s, id) : NULL;
    if (r) {
        r->tenant = s->uid;
        r->charged = s->seg_charged;
        s->seg_charged = 0;
    } else if (err.status != COLLD_OK && s->seg_charged) {
        colld_tenant_uncharge_reg(d, s->uid, s->seg_charged);
        s->seg_charged = 0;
    }
    pthread_mutex_unlock(&d->lock);
    if (fd >= 0)
        close(fd);
    if (err.status != COLLD_OK) {
        LOG_INFO_RL(MEM, "session %llu: GPU registration (segment %u of %u) refused: %s", (unsigned long long)s->id,
                    m->u.reg_cuda_seg.index, m->u.reg_cuda_seg.count, err.msg);
        return colld_session_send_error(s, COLLD_MSG_REG_REPLY, &err);
    }
    colld_wire_msg_t ok;
    memset(&ok, 0, sizeof(ok));
    ok.type = COLLD_MSG_REG_REPLY;
    ok.u.reg_reply.reg_id = id;
    ok.u.reg_reply.cookie = m->u.reg_cuda_seg.cookie;
    return colld_session_send(s, &ok, NULL, 0);
}

/* GPU_FLAGS: hand the session its GPU stream flag area (the device backend's). */
static int session_on_gpu_flags(colld_session_t *s)
{
    colld_backend_t *dev = colld_backend_device(s->daemon);
    colld_err_t err = COLLD_ERR_INIT;
    uint64_t size = 0;
    uint32_t lines = 0, plans = 0;
    int fd = -1;
    if (dev && dev->ops->sync_area)
        fd = dev->ops->sync_area(dev, s, &size, &lines, &plans, &err);
    else
        colld_err_set(&err, COLLD_ERR_NOT_SUPPORTED, "%s", s->daemon->device_none);
    if (fd < 0)
        return colld_session_send_error(s, COLLD_MSG_GPU_FLAGS_REPLY, &err);
    colld_wire_msg_t ok;
    memset(&ok, 0, sizeof(ok));
    ok.type = COLLD_MSG_GPU_FLAGS_REPLY;
    ok.u.gpu_flags.size = size;
    ok.u.gpu_flags.lines = lines;
    ok.u.gpu_flags.plans = plans;
    int rc = colld_session_send(s, &ok, &fd, 1);
    close(fd);
    return rc;
}

/* Dispatch one complete message. Returns -1 to drop the session. */
static int session_dispatch(colld_session_t *s, const colld_wire_msg_t *m)
{
    if (m->magic != COLLD_WIRE_MAGIC) {
        LOG_WARN_RL(SESSION, "session %llu (pid %d): bad message magic", (unsigned long long)s->id,
                    (int)s->pid);
        return -1;
    }
    if (m->type != COLLD_MSG_HELLO && !s->shm) {
        LOG_WARN_RL(SESSION, "session %llu (pid %d): message before HELLO", (unsigned long long)s->id,
                    (int)s->pid);
        return -1;
    }
    if (m->type != COLLD_MSG_REG && m->type != COLLD_MSG_REG_CUDA && m->type != COLLD_MSG_REG_CUDA_SEG &&
        s->pending_fd >= 0) {
        close(s->pending_fd); /* fds only make sense with REG, REG_CUDA and REG_CUDA_SEG */
        s->pending_fd = -1;
    }
    switch (m->type) {
    case COLLD_MSG_HELLO:
        return session_on_hello(s, m);
    case COLLD_MSG_REG:
        return session_on_reg(s, m);
    case COLLD_MSG_DEREG:
        return session_on_dereg(s, m);
    case COLLD_MSG_REG_CUDA:
        return session_on_reg_cuda(s, m);
    case COLLD_MSG_GPU_FLAGS:
        return session_on_gpu_flags(s);
    case COLLD_MSG_REG_CUDA_SEG:
        return session_on_reg_cuda_seg(s, m);
    default: {
        int rc = colld_hooks_session_msg(s, m); /* COLLD_MSG_FAST_AREA: the fast area's */
        if (rc != -2)
            return rc;
        LOG_WARN_RL(SESSION, "session %llu (pid %d): unknown message type %u", (unsigned long long)s->id,
                    (int)s->pid, m->type);
        return -1;
    }
    }
}

int colld_session_dispatch(colld_session_t *s, const colld_wire_msg_t *m, int fd)
{
    if (fd >= 0) {
        if (s->pending_fd >= 0)
            close(s->pending_fd); /* as the read path: one fd per message */
        s->pending_fd = fd;
    }
    return session_dispatch(s, m);
}

/* Read what is available: assemble fixed-size messages, collect passed fds. Returns -1 on EOF,
 * error or protocol violation. */
static int session_read(colld_session_t *s)
{
    for (;;) {
        union {
            char buf[CMSG_SPACE(4 * sizeof(int))];
            struct cmsghdr align;
        } cm;
        struct iovec iov = { .iov_base = s->rbuf + s->rlen, .iov_len = sizeof(s->rbuf) - s->rlen };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                             .msg_controllen = sizeof(cm.buf) };
        ssize_t n = recvmsg(s->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        int bad_fds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            int nf = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < nf; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + (size_t)i * sizeof(int), sizeof(int));
                if (s->pending_fd < 0 && i == 0)
                    s->pending_fd = fd;
                else {
                    close(fd);
                    bad_fds = 1;
                }
            }
        }
        if ((mh.msg_flags & MSG_CTRUNC) || bad_fds) {
            LOG_WARN_RL(SESSION, "session %llu (pid %d): too many file descriptors in one message",
                        (unsigned long long)s->id, (int)s->pid);
            return -1;
        }
        if (n == 0)
            return -1;
        s->rlen += (size_t)n;
        if (s->rlen == sizeof(s->rbuf)) {
            colld_wire_msg_t m;
            memcpy(&m, s->rbuf, sizeof(m));
            s->rlen = 0;
            if (session_dispatch(s, &m) < 0)
                return -1;
        }
    }
}

/* ============================================================================================
 * The loop side
 * ========================================================================================== */

/* Final close of a session's poll handle: close the socket and drop the list's reference. */
static void session_on_close(uv_handle_t *h)
{
    colld_session_t *s = h->data;
    colld_daemon_t *d = s->daemon;
    close(s->fd);
    s->fd = -1;
    pthread_mutex_lock(&d->lock);
    colld_session_unref(s);
    pthread_mutex_unlock(&d->lock);
}

/* The daemon's side of a session ending (lock held): its ranks leave their communicators (peers
 * get PEER_LOST), its unused unique ids go, the engine forgets it and it leaves the session list.
 * The list's reference is the caller's to drop. */
void colld_session_forget(colld_session_t *s, const char *why)
{
    colld_daemon_t *d = s->daemon;
    s->dead = true;
    LOG_INFO(SESSION, "session %llu (pid %d) ended: %s", (unsigned long long)s->id, (int)s->pid, why);
    if (s->shm && s->role == COLLD_ROLE_CLIENT)
        colld_event(d, "session_detached", NULL, -1, s->pid, s->id, s->uid, COLLD_OK, "%s: %s", s->name, why);
    colld_comm_session_gone(d, s);
    for (colld_issued_uid_t **pp = &d->uids; *pp && s->nuids > 0;) { /* its unused unique ids, if any */
        colld_issued_uid_t *u = *pp;
        if (u->owner == s) {
            *pp = u->next;
            s->nuids--;
            free(u);
        } else
            pp = &u->next;
    }
    if (s->shm)
        colld_engine_remove_session(d, s);
    for (colld_session_t **pp = &d->sessions; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            d->nsessions--;
            if (s->charged)
                colld_tenant_uncharge(d, s->uid, COLLD_LIMIT_SESSIONS, 1);
            s->charged = false;
            break;
        }
}

/* Final close of a session's pidfd watch: close the pidfd and drop the watch's reference. */
static void session_on_pid_close(uv_handle_t *h)
{
    colld_session_t *s = h->data;
    colld_daemon_t *d = s->daemon;
    close(s->pidfd);
    s->pidfd = -1;
    pthread_mutex_lock(&d->lock);
    colld_session_unref(s);
    pthread_mutex_unlock(&d->lock);
}

/* Stop watching the session's process (loop thread). */
static void session_unwatch_pid(colld_session_t *s)
{
    if (!s->pidpoll_open)
        return;
    s->pidpoll_open = false;
    uv_poll_stop(&s->pidpoll);
    uv_close((uv_handle_t *)&s->pidpoll, session_on_pid_close);
}

/* A session is over (socket closed, its process gone, protocol error, daemon stopping): the
 * daemon forgets it and the loop stops watching its socket and its process. */
static void session_drop(colld_session_t *s, const char *why)
{
    colld_daemon_t *d = s->daemon;
    pthread_mutex_lock(&d->lock);
    if (!s->poll_active) {
        pthread_mutex_unlock(&d->lock);
        return;
    }
    colld_session_forget(s, why);
    s->poll_active = false;
    colld_daemon_unlock(d);
    colld_engine_wake(d);
    uv_poll_stop(&s->poll);
    uv_close((uv_handle_t *)&s->poll, session_on_close);
    session_unwatch_pid(s);
}

/* libuv: the session's pidfd is readable: its process exited, whoever still holds a copy of its
 * socket. An error of the poll itself only ends the watch (the socket still tells). */
static void session_on_pid_exit(uv_poll_t *h, int status, int events)
{
    colld_session_t *s = h->data;
    (void)events;
    if (status < 0) {
        LOG_WARN_RL(SESSION,
                    "session %llu (pid %d): cannot watch its process any more (%s); its socket still tells "
                    "when it ends",
                    (unsigned long long)s->id, (int)s->pid, uv_strerror(status));
        session_unwatch_pid(s);
        return;
    }
    char why[96];
    snprintf(why, sizeof(why), "its process (pid %d) exited", (int)s->pid);
    session_drop(s, why);
}

/* A pidfd of the peer of session socket fd: race-free from the socket (SO_PEERPIDFD), else by its
 * pid, which SO_PEERCRED gave at connect (the process may have exited since: then the pid is
 * either gone, ESRCH, or names a process that the dead peer's session must not outlive anyway).
 * -1 with errno. */
static int peer_pidfd(int fd, pid_t pid)
{
    int pidfd = -1;
    socklen_t len = sizeof(pidfd);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 && len == sizeof(pidfd) && pidfd >= 0)
        return pidfd;
    if (pid <= 0) {
        errno = ESRCH; /* a peer in a pid namespace the daemon cannot see */
        return -1;
    }
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* Watch the session's process on the loop (loop thread, at accept). One pidfd per session, which
 * holds a reference on it while open; without one, the socket alone tells, and the daemon says so
 * once. */
static void session_watch_pid(colld_session_t *s)
{
    colld_daemon_t *d = s->daemon;
    int fd = peer_pidfd(s->fd, s->pid);
    int err = errno;
    if (fd >= 0) {
        (void)SYS_CHECK(SESSION, fcntl(fd, F_SETFD, FD_CLOEXEC));
        s->pidpoll.data = s;
        int rc = uv_poll_init(&d->loop, &s->pidpoll, fd);
        if (rc == 0) {
            s->pidfd = fd;
            s->pidpoll_open = true;
            pthread_mutex_lock(&d->lock);
            s->refs++; /* the watch's, dropped by session_on_pid_close */
            pthread_mutex_unlock(&d->lock);
            uv_poll_start(&s->pidpoll, UV_READABLE, session_on_pid_exit);
            return;
        }
        close(fd);
        err = -rc;
    }
    if (!d->pidfd_warned)
        LOG_WARN(SESSION,
                 "session %llu (pid %d): cannot watch its process (pidfd: %s): a process that dies while "
                 "another one holds a copy of its session socket is seen gone only when that copy closes "
                 "(said once)",
                 (unsigned long long)s->id, (int)s->pid, strerror(err));
    else
        LOG_DEBUG(SESSION, "session %llu (pid %d): no pidfd watch: %s", (unsigned long long)s->id, (int)s->pid,
                  strerror(err));
    d->pidfd_warned = true;
}

/* libuv: the session socket is readable or the peer hung up. */
static void session_on_poll(uv_poll_t *h, int status, int events)
{
    colld_session_t *s = h->data;
    if (status < 0) {
        session_drop(s, uv_strerror(status));
        return;
    }
    if (events & UV_READABLE) {
        if (session_read(s) < 0) {
            session_drop(s, "socket closed");
            return;
        }
    }
    if (events & UV_DISCONNECT)
        session_drop(s, "peer disconnected");
}

/* Refuse a connection before any session exists: an error WELCOME with the reason (libcolld's
 * colld_connect returns its status and detail), then the socket is closed. Never blocks: the
 * socket is new, so its send buffer is empty. What the client sent already is read and dropped,
 * so the close is not turned into a reset that could destroy the answer. */
static void session_refuse(int fd, colld_status_t st, const char *why)
{
    colld_wire_msg_t m;
    char sink[sizeof(colld_wire_msg_t)];
    memset(&m, 0, sizeof(m));
    m.magic = COLLD_WIRE_MAGIC;
    m.version = COLLD_WIRE_VERSION;
    m.type = COLLD_MSG_WELCOME;
    m.status = st;
    colld_strlcpy(m.u.detail, why, sizeof(m.u.detail));
    ssize_t n = send(fd, &m, sizeof(m), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
    n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT); /* passed descriptors are discarded by the kernel */
    (void)n;
    (void)SYS_CHECK_EXPECT(SESSION, ENOTCONN, shutdown(fd, SHUT_WR));
}

/* Admit a connection (lock held): the global backstop (max-sessions, of which the last few are
 * kept for operators) and the tenant's max-sessions-per-tenant, which operators are not held to.
 * Returns COLLD_OK (with *charged when a tenant unit was taken), or a status with the reason in
 * why, in tenant.c's wording (the client sees its first COLLD_WIRE_DETAIL_BYTES - 1 bytes). */
static colld_status_t session_admit(colld_daemon_t *d, uid_t uid, bool *charged, colld_err_t *err)
{
    bool admin = colld_uid_is_admin(uid);
    unsigned max = (unsigned)d->cfg.max_sessions, reserve = colld_admin_reserve(d->cfg.max_sessions);
    *charged = false;
    if (d->nsessions >= max || (!admin && d->nsessions + reserve >= max))
        return colld_err_set(err, COLLD_ERR_QUOTA_EXCEEDED,
                             "the daemon is at its limit max-sessions = %u (the last %u kept for operators); try "
                             "again later",
                             max, reserve);
    if (admin)
        return COLLD_OK;
    colld_status_t st = colld_tenant_charge(d, uid, COLLD_LIMIT_SESSIONS, 1, err);
    *charged = st == COLLD_OK;
    return st;
}

/* A new connection on the session socket (listener in fds.c): admit it against the limits, then
 * start watching it; a refused one gets an error WELCOME that says which limit. */
static void session_on_accept(colld_listener_t *l, int fd, uid_t uid, gid_t gid, pid_t pid)
{
    colld_daemon_t *d = l->d;
    colld_err_t err = COLLD_ERR_INIT;
    bool charged;
    pthread_mutex_lock(&d->lock);
    colld_status_t st = session_admit(d, uid, &charged, &err);
    pthread_mutex_unlock(&d->lock);
    if (st != COLLD_OK) {
        LOG_WARN_RL(SESSION, "refusing pid %d uid %u: %s", (int)pid, (unsigned)uid, err.msg);
        session_refuse(fd, st, err.msg);
        close(fd);
        return;
    }
    colld_session_t *s = colld_session_new(d, pid, uid, gid);
    if (!s)
        goto fail;
    s->fd = fd;
    s->charged = charged;
    s->poll.data = s;
    if (uv_poll_init(&d->loop, &s->poll, fd) < 0)
        goto fail;
    s->poll_active = true;
    pthread_mutex_lock(&d->lock);
    s->id = ++d->next_session_id;
    s->next = d->sessions;
    d->sessions = s;
    d->nsessions++;
    pthread_mutex_unlock(&d->lock);
    uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT, session_on_poll);
    session_watch_pid(s);
    return;
fail:
    LOG_WARN_RL(SESSION, "refusing pid %d uid %u: out of memory", (int)pid, (unsigned)uid);
    session_refuse(fd, COLLD_ERR_NO_MEMORY, "colld is out of memory");
    close(fd);
    free(s);
    if (charged) {
        pthread_mutex_lock(&d->lock);
        colld_tenant_uncharge(d, uid, COLLD_LIMIT_SESSIONS, 1);
        pthread_mutex_unlock(&d->lock);
    }
}

/* Drop every session the engine marked for killing (protocol errors seen on its rings). */
void colld_sessions_reap(colld_daemon_t *d)
{
    for (;;) {
        colld_session_t *victim = NULL;
        pthread_mutex_lock(&d->lock);
        for (colld_session_t *s = d->sessions; s; s = s->next)
            if (s->kill_requested && s->poll_active) {
                victim = s;
                break;
            }
        pthread_mutex_unlock(&d->lock);
        if (!victim)
            return;
        session_drop(victim, "protocol violation on its rings");
    }
}

/* Create the session socket (mode from the configuration) and serve it (fds.c). The lock file
 * is already held, so an existing socket file is a stale one. Returns 0 or -1. */
int colld_sessions_listen(colld_daemon_t *d)
{
    return colld_listener_open(d, &d->sessions_l, "session socket", d->cfg.socket, session_on_accept,
                               session_refuse);
}

/* Daemon shutdown: stop accepting and end every session (clients see their socket close and
 * report COLLD_ERR_DAEMON_LOST). */
void colld_sessions_close_all(colld_daemon_t *d)
{
    if (d->sessions_l.open) {
        colld_listener_close(&d->sessions_l);
        (void)SYS_CHECK_EXPECT(SESSION, ENOENT, unlink(d->cfg.socket));
    }
    /* Every communicator fails with DAEMON_LOST before any session goes, so no rank mistakes the
     * shutdown for a peer's death. */
    pthread_mutex_lock(&d->lock);
    for (colld_dcomm_t *c = d->comms, *following; c; c = following) {
        following = c->next; /* a forming communicator is dissolved and freed */
        colld_comm_break(d, c, COLLD_ERR_DAEMON_LOST, -1, "the colld daemon is shutting down");
    }
    colld_daemon_unlock(d);
    for (;;) {
        pthread_mutex_lock(&d->lock);
        colld_session_t *s = d->sessions;
        pthread_mutex_unlock(&d->lock);
        if (!s)
            break;
        session_drop(s, "daemon shutting down");
    }
}
