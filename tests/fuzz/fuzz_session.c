/*
 * fuzz_session.c - libFuzzer harness: the session socket's messages (server/core/session.c) as a hostile
 * client sends them, through colld_session_dispatch, the entry point the loop's read path uses,
 * into a real daemon core (tests/fuzz/core_fixture.h) with low per-tenant limits.
 *
 * Three sessions: one fresh (no HELLO yet) of uid 1001 and the two ranks of a formed communicator
 * of uid 1000 (rings made, as after HELLO). The input is a program of messages, each with:
 *   ctl (1 byte): bits 0-1 the session (fresh, rank 0, rank 1, fresh); bits 2-3 the descriptor
 *     that comes with it (none, a memfd sealed against shrinking, an unsealed memfd, a pipe);
 *     bit 4 leaves a memfd's pages unallocated (else every page is written, as libcolld does and
 *     the daemon requires of a registration); bit 5 steers the type into the known ones; bit 6 sets the wire version; bit 7 leaves the
 *     magic as the input has it (else it is set)
 *   size (2 bytes): the memfd's size in units of 256 bytes
 *   the message (128 bytes, zero padded)
 * HELLO (role, process name), REG (sizes, seals, the tenant's and the daemon's limits), DEREG,
 * FAST_AREA, REG_CUDA, GPU_FLAGS and REG_CUDA_SEG (no GPU here) and unknown types run as in the
 * daemon; a message that ends a session ends it as a closing socket would. Replies are read from the other
 * end of each session's socket and their descriptors closed. The harness asserts nothing itself:
 * ASan/UBSan and LeakSanitizer find what goes wrong.
 */
#include "tests/fuzz/core_fixture.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define MSG_OPS_MAX 64

typedef struct {
    const uint8_t *p;
    size_t n;
} input_t;

static uint8_t take8(input_t *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

/* A session of `uid` that has connected but sent nothing (no HELLO, no rings), in the daemon's
 * list and the fixture's (fix_stop ends and frees it). NULL when the fixture is full. */
static colld_session_t *bare_session(fix_t *f, uid_t uid)
{
    colld_daemon_t *d = &f->d;
    if (f->nsessions >= FIX_MAX_SESSIONS)
        return NULL;
    colld_session_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->daemon = d;
    s->fd = s->shm_fd = s->efd = s->pending_fd = -1;
    s->pid = 2000 + f->nsessions;
    s->uid = uid;
    s->refs = 2; /* the session list's and the fixture's */
    pthread_mutex_lock(&d->lock);
    s->id = ++d->next_session_id;
    s->next = d->sessions;
    d->sessions = s;
    d->nsessions++;
    pthread_mutex_unlock(&d->lock);
    f->s[f->nsessions++] = s;
    return s;
}

/* The descriptor sent with a message: kind 1 a sealed memfd, 2 an unsealed one, 3 a pipe; a
 * memfd's pages written unless `holes`. */
static int make_fd(unsigned kind, size_t bytes, bool holes)
{
    static const char zero[1 << 16];
    if (kind == 3) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
            return -1;
        close(p[1]);
        return p[0];
    }
    int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)bytes) < 0 || (kind == 1 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)) {
        close(fd);
        return -1;
    }
    for (size_t off = 0; !holes && off < bytes; off += sizeof(zero))
        if (pwrite(fd, zero, bytes - off < sizeof(zero) ? bytes - off : sizeof(zero), (off_t)off) < 0)
            break;
    return fd;
}

/* Read every reply waiting on the client's end of a session socket, closing the descriptors they
 * carry (WELCOME's rings, FAST_AREA's area). */
static void drain(int fd)
{
    for (;;) {
        colld_wire_msg_t m;
        union {
            char buf[CMSG_SPACE(4 * sizeof(int))];
            struct cmsghdr align;
        } cm;
        struct iovec iov = { .iov_base = &m, .iov_len = sizeof(m) };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                             .msg_controllen = sizeof(cm.buf) };
        if (recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) <= 0)
            return;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
            for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                int x;
                memcpy(&x, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                close(x);
            }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input_t in = { data, size };
    fix_t *f = calloc(1, sizeof(*f));
    if (!f)
        return 0;
    if (fix_start(f, 16384) < 0)
        abort();
    colld_daemon_t *d = &f->d;
    /* Limits low enough for inputs to reach every refusal. */
    d->cfg.max_registered_bytes = 192 * 1024;
    d->cfg.max_regs_per_tenant = 6;
    d->cfg.max_registered_bytes_per_tenant = 256 * 1024;
    d->cfg.max_registrations = 10;
    d->epfd = epoll_create1(EPOLL_CLOEXEC); /* HELLO adds the session's eventfd */
    colld_session_t *s[3] = { NULL, NULL, NULL };
    int peer[3] = { -1, -1, -1 }, mine[3] = { -1, -1, -1 };
    s[1] = fix_session(f, 1000, 1);
    s[2] = fix_session(f, 1000, 2);
    if (!s[1] || !s[2] || !fix_comm(f, 2, 1000) || !(s[0] = bare_session(f, 1001)))
        abort();
    for (int i = 0; i < 3; i++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
            abort();
        s[i]->fd = mine[i] = sv[0];
        peer[i] = sv[1];
    }
    for (int op = 0; op < MSG_OPS_MAX && in.n > 0; op++) {
        uint8_t ctl = take8(&in);
        size_t bytes = ((size_t)take8(&in) | (size_t)take8(&in) << 8) % 1024 * 256;
        colld_wire_msg_t m;
        memset(&m, 0, sizeof(m));
        size_t n = in.n < sizeof(m) ? in.n : sizeof(m);
        memcpy(&m, in.p, n);
        in.p += n;
        in.n -= n;
        colld_session_t *x = s[(ctl & 3) == 3 ? 0 : ctl & 3];
        if (x->dead)
            continue;
        if (!(ctl & 0x80))
            m.magic = COLLD_WIRE_MAGIC;
        if (ctl & 0x40)
            m.version = COLLD_WIRE_VERSION;
        if (ctl & 0x20)
            m.type = (uint16_t)(1 + m.type % COLLD_MSG_REG_CUDA_SEG);
        unsigned kind = (ctl >> 2) & 3;
        int fd = kind ? make_fd(kind, bytes, (ctl & 0x10) != 0) : -1;
        int rc = colld_session_dispatch(x, &m, fd);
        drain(peer[(ctl & 3) == 3 ? 0 : ctl & 3]);
        if (rc < 0)
            fix_session_end(f, x); /* as the loop does when dispatch says the session is over */
        if (op % 8 == 7)
            colld_engine_run_once(d);
    }
    fix_stop(f);
    for (int i = 0; i < 3; i++) {
        close(mine[i]);
        close(peer[i]);
    }
    close(d->epfd);
    free(f);
    return 0;
}
