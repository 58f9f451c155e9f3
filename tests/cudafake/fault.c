/*
 * fault.c - fault injection in the CUDA driver test double.
 *
 * Specifications come from COLLD_CUDAFAKE_FAULTS at start, from lines appended to the file named
 * by COLLD_CUDAFAKE_CONTROL at run time (read as it grows, so another process, e.g. a test
 * driving a daemon, can inject a fault at a chosen moment), and from colld_cudafake_control()
 * (cudafake.h) in the test's own process. Several are separated by ';', ',' or new lines:
 *
 *   fail:ENTRY:WHICH:RESULT     the WHICH-th call of ENTRY returns RESULT and does nothing
 *   sticky:ENTRY:WHICH:RESULT   the WHICH-th call of ENTRY faults the GPU: for an entry that
 *                               enqueues work (cuLaunchKernel, cuStreamWriteValue32, ...) the call
 *                               succeeds and its work fails when it executes; for any other entry
 *                               the call fails. Either way RESULT becomes the sticky error of the
 *                               context: every later call on it fails with RESULT until
 *                               cuDevicePrimaryCtxReset
 *   stall:STREAM[:AFTER]        STREAM stops before its (AFTER+1)-th operation (default: the next
 *                               one) until released; STREAM is N (the N-th stream created in the
 *                               process, 1-based) or L<dev> (the legacy default stream of device dev)
 *   release:STREAM | release:*  lets a stalled stream (every stalled stream) go on
 *   hold:ENTRY:WHICH            the WHICH-th call of ENTRY waits, before it does anything, until
 *                               release:hold; when it starts waiting, "# held: ENTRY call #N" is
 *                               appended to the control file (a comment: a test driving another
 *                               process sees that the call is being made, and when)
 *   release:hold                lets every held call go on
 *   clear                       drops every fail, sticky and hold specification not yet fired
 *   poll                        (colld_cudafake_control only) reads the control file now
 *
 * ENTRY is a base name as cuGetProcAddress takes it (cuMemAlloc, cuStreamWaitValue32), RESULT a
 * CUresult name (CUDA_ERROR_OUT_OF_MEMORY) or number, WHICH is N (the N-th call since the process
 * started, 1-based), +N (the N-th call from when the specification was read), either followed by
 * '-' (that call and every later one), or '*' (every call). The old-driver case is
 * COLLD_CUDAFAKE_DRIVER_VERSION (config.c).
 *
 * The module has its own lock, taken after fk.mu when both are held, never the other way round.
 */
#include "tests/cudafake/fake.h"

#include "tests/cudafake/cudafake.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum { F_FAIL = 1, F_STICKY, F_STALL, F_HOLD } spec_kind_t;

typedef struct {
    spec_kind_t kind;
    fk_entry_t entry;
    uint64_t first;   /* the call number it applies to (1-based) */
    bool every;       /* and every later call */
    bool done;        /* a one-call specification that fired */
    CUresult result;
    bool legacy;      /* stall: the legacy stream of device `dev`, else user stream `stream` */
    int dev;
    uint64_t stream;
    uint64_t after;
    bool released;
} spec_t;

static struct {
    pthread_mutex_t mu;
    spec_t specs[FK_MAX_FAULTS];
    int n;
    _Atomic uint64_t calls[FK_E_COUNT];
    char path[4096];
    off_t consumed;          /* bytes of the control file applied */
    char partial[1024];      /* an incomplete last line */
    size_t npartial;
    _Atomic uint64_t next_poll_ns;
    _Atomic uint64_t hold_releases; /* release:hold lines applied */
} ft = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* The CUresult named by s (a name or a number). */
static bool parse_result(const char *s, CUresult *out)
{
    char *end;
    long v = strtol(s, &end, 0);
    if (end != s && !*end && v >= 0) {
        *out = (CUresult)v;
        return fk_result_name(*out) != NULL;
    }
    for (int code = 0; code < 1000; code++) {
        const char *n = fk_result_name((CUresult)code);
        if (n && strcmp(n, s) == 0) {
            *out = (CUresult)code;
            return true;
        }
    }
    return false;
}

/* The entry point named s (a base name). */
static bool parse_entry(const char *s, fk_entry_t *out)
{
    for (int e = 0; e < FK_E_COUNT; e++)
        if (strcmp(fk_entry_name((fk_entry_t)e), s) == 0) {
            *out = (fk_entry_t)e;
            return true;
        }
    return false;
}

/* WHICH: "N", "+N", either with a trailing '-', or "*". */
static bool parse_which(const char *s, fk_entry_t e, spec_t *sp)
{
    if (strcmp(s, "*") == 0) {
        sp->first = 1;
        sp->every = true;
        return true;
    }
    bool rel = *s == '+';
    char *end;
    errno = 0;
    unsigned long long n = strtoull(s + rel, &end, 10);
    if (end == s + rel || errno || n == 0)
        return false;
    sp->every = *end == '-';
    if (*end && !(sp->every && !end[1]))
        return false;
    sp->first = rel ? atomic_load(&ft.calls[e]) + n : n;
    return true;
}

/* STREAM: "N" or "L<dev>". */
static bool parse_stream(const char *s, spec_t *sp)
{
    char *end;
    errno = 0;
    if (s[0] == 'L') {
        long d = strtol(s + 1, &end, 10);
        if (end == s + 1 || *end || d < 0 || d >= FK_MAX_DEVICES)
            return false;
        sp->legacy = true;
        sp->dev = (int)d;
        return true;
    }
    unsigned long long n = strtoull(s, &end, 10);
    if (end == s || *end || errno || n == 0)
        return false;
    sp->stream = n;
    return true;
}

/* Apply one specification (ft.mu held). Returns false, and says why, when it is malformed. */
static bool apply_one(char *line, const char *origin)
{
    while (isspace((unsigned char)*line))
        line++;
    size_t len = strlen(line);
    while (len && isspace((unsigned char)line[len - 1]))
        line[--len] = '\0';
    if (!*line || *line == '#')
        return true;
    char copy[512];
    snprintf(copy, sizeof(copy), "%s", line);
    char *f[5] = { NULL };
    int nf = 0;
    for (char *save = NULL, *t = strtok_r(line, ":", &save); t && nf < 5; t = strtok_r(NULL, ":", &save))
        f[nf++] = t;
    spec_t sp;
    memset(&sp, 0, sizeof(sp));
    bool ok = false;
    if (nf == 4 && (strcmp(f[0], "fail") == 0 || strcmp(f[0], "sticky") == 0)) {
        sp.kind = f[0][0] == 'f' ? F_FAIL : F_STICKY;
        ok = parse_entry(f[1], &sp.entry) && parse_which(f[2], sp.entry, &sp) && parse_result(f[3], &sp.result) &&
             sp.result != CUDA_SUCCESS;
    } else if (nf == 3 && strcmp(f[0], "hold") == 0) {
        sp.kind = F_HOLD;
        ok = parse_entry(f[1], &sp.entry) && parse_which(f[2], sp.entry, &sp);
    } else if (nf == 2 && strcmp(f[0], "release") == 0 && strcmp(f[1], "hold") == 0) {
        atomic_fetch_add(&ft.hold_releases, 1);
        return true;
    } else if ((nf == 2 || nf == 3) && strcmp(f[0], "stall") == 0) {
        sp.kind = F_STALL;
        ok = parse_stream(f[1], &sp);
        if (ok && nf == 3) {
            char *end;
            errno = 0;
            sp.after = strtoull(f[2], &end, 10);
            ok = end != f[2] && !*end && !errno;
        }
    } else if (nf == 1 && strcmp(f[0], "clear") == 0) {
        for (int i = 0; i < ft.n; i++)
            if (ft.specs[i].kind != F_STALL)
                ft.specs[i].done = true;
        return true;
    } else if (nf == 1 && strcmp(f[0], "poll") == 0) {
        atomic_store(&ft.next_poll_ns, 0); /* colld_cudafake_control reads the file after this */
        return true;
    } else if (nf == 2 && strcmp(f[0], "release") == 0) {
        spec_t which;
        memset(&which, 0, sizeof(which));
        bool all = strcmp(f[1], "*") == 0;
        if (!all && !parse_stream(f[1], &which))
            goto bad;
        for (int i = 0; i < ft.n; i++) {
            spec_t *s = &ft.specs[i];
            if (s->kind == F_STALL && (all || (s->legacy == which.legacy && s->dev == which.dev &&
                                               s->stream == which.stream)))
                s->released = true;
        }
        return true;
    }
    if (!ok)
        goto bad;
    int kept = 0; /* drop the specifications that are over: fired once, released */
    for (int i = 0; i < ft.n; i++)
        if (!ft.specs[i].done && !ft.specs[i].released)
            ft.specs[kept++] = ft.specs[i];
    ft.n = kept;
    if (ft.n == FK_MAX_FAULTS) {
        fk_log("%s: more than %d fault specifications; '%s' ignored", origin, FK_MAX_FAULTS, copy);
        return false;
    }
    ft.specs[ft.n++] = sp;
    return true;
bad:
    fk_log("%s: malformed fault specification '%s' (see tests/cudafake/README.md)", origin, copy);
    return false;
}

/* Apply specifications separated by ';' or new lines (ft.mu held). */
static bool apply_all(const char *text, const char *origin)
{
    char *buf = strdup(text);
    if (!buf)
        return false;
    bool ok = true;
    for (char *save = NULL, *t = strtok_r(buf, ";,\n", &save); t; t = strtok_r(NULL, ";,\n", &save))
        ok &= apply_one(t, origin);
    free(buf);
    return ok;
}

/* Apply COLLD_CUDAFAKE_FAULTS and note the control file; false when a specification is malformed. */
bool fk_fault_init(const char *specs, const char *control_path)
{
    pthread_mutex_lock(&ft.mu);
    bool ok = !specs || !*specs || apply_all(specs, "COLLD_CUDAFAKE_FAULTS");
    snprintf(ft.path, sizeof(ft.path), "%s", control_path ? control_path : "");
    pthread_mutex_unlock(&ft.mu);
    fk_fault_poll();
    return ok;
}

/* Read what was appended to the control file since the last time (at most every millisecond). */
void fk_fault_poll(void)
{
    uint64_t now = fk_now_ns();
    if (!ft.path[0] || now < atomic_load(&ft.next_poll_ns))
        return;
    atomic_store(&ft.next_poll_ns, now + 1000000ull);
    pthread_mutex_lock(&ft.mu);
    struct stat st;
    int fd = open(ft.path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) < 0) {
        if (fd >= 0)
            close(fd);
        pthread_mutex_unlock(&ft.mu);
        return;
    }
    if (st.st_size < ft.consumed) { /* rewritten from scratch: read it again */
        ft.consumed = 0;
        ft.npartial = 0;
    }
    char buf[4096];
    while (ft.consumed < st.st_size) {
        ssize_t got = pread(fd, buf, sizeof(buf), ft.consumed);
        if (got <= 0)
            break;
        ft.consumed += got;
        for (ssize_t i = 0; i < got; i++) {
            if (buf[i] != '\n') {
                if (ft.npartial < sizeof(ft.partial) - 1)
                    ft.partial[ft.npartial++] = buf[i];
                continue;
            }
            ft.partial[ft.npartial] = '\0';
            apply_one(ft.partial, "COLLD_CUDAFAKE_CONTROL");
            ft.npartial = 0;
        }
    }
    close(fd);
    pthread_mutex_unlock(&ft.mu);
}

/* Hold call n of e until a release:hold is applied after `releases` of them; say so in the
 * control file (a comment line) and on stderr first. */
static void hold_call(fk_entry_t e, uint64_t n, uint64_t releases)
{
    fk_log("held: %s call #%llu, until release:hold", fk_entry_name(e), (unsigned long long)n);
    int fd = ft.path[0] ? open(ft.path, O_WRONLY | O_APPEND | O_CLOEXEC) : -1;
    if (fd >= 0) {
        char line[128];
        int len = snprintf(line, sizeof(line), "# held: %s call #%llu\n", fk_entry_name(e), (unsigned long long)n);
        if (write(fd, line, (size_t)len) != len)
            fk_log("cannot announce the held call in %s", ft.path);
        close(fd);
    }
    while (atomic_load(&ft.hold_releases) == releases) {
        usleep(1000);
        fk_fault_poll();
    }
}

/* Count a call of e and return the fault it must fail with (CUDA_SUCCESS: none); *sticky says
 * whether the fault is a sticky one. */
CUresult fk_fault_call(fk_entry_t e, bool *sticky)
{
    uint64_t n = atomic_fetch_add(&ft.calls[e], 1) + 1;
    fk_fault_poll();
    CUresult r = CUDA_SUCCESS;
    bool hold = false;
    pthread_mutex_lock(&ft.mu);
    uint64_t releases = atomic_load(&ft.hold_releases);
    for (int i = 0; i < ft.n && r == CUDA_SUCCESS; i++) {
        spec_t *s = &ft.specs[i];
        if (s->kind == F_STALL || s->entry != e || s->done)
            continue;
        if (s->kind == F_HOLD && (n == s->first || (s->every && n > s->first))) {
            hold = true;
            s->done = !s->every;
        } else if (s->kind != F_HOLD && (n == s->first || (s->every && n > s->first))) {
            r = s->result;
            *sticky = s->kind == F_STICKY;
            s->done = !s->every;
        }
    }
    pthread_mutex_unlock(&ft.mu);
    if (hold)
        hold_call(e, n, releases);
    if (r != CUDA_SUCCESS)
        fk_log("injected fault: %s call #%llu -> %s%s", fk_entry_name(e), (unsigned long long)n, fk_result_name(r),
               *sticky ? " (sticky)" : "");
    return r;
}

/* Must stream s stop before its next operation? (fk.mu held: s is read) */
bool fk_fault_stalled(const fk_stream_t *s)
{
    bool stalled = false;
    pthread_mutex_lock(&ft.mu);
    for (int i = 0; i < ft.n && !stalled; i++) {
        const spec_t *sp = &ft.specs[i];
        if (sp->kind != F_STALL || sp->released || s->executed < sp->after)
            continue;
        stalled = sp->legacy ? s->legacy && s->ctx->dev == sp->dev : !s->legacy && s->id == sp->stream;
    }
    pthread_mutex_unlock(&ft.mu);
    return stalled;
}

/* The calls of e so far. */
uint64_t fk_fault_count(fk_entry_t e)
{
    return atomic_load(&ft.calls[e]);
}

FK_EXPORT int colld_cudafake_control(const char *specs)
{
    fk_boot();
    pthread_mutex_lock(&ft.mu);
    bool ok = specs && apply_all(specs, "colld_cudafake_control");
    pthread_mutex_unlock(&ft.mu);
    fk_fault_poll();
    /* Stalled workers wait on fk.cv: let them look again. */
    pthread_mutex_lock(&fk.mu);
    pthread_cond_broadcast(&fk.cv);
    pthread_mutex_unlock(&fk.mu);
    return ok ? 0 : -1;
}

FK_EXPORT unsigned long long colld_cudafake_calls(const char *entry)
{
    fk_entry_t e;
    if (!entry || !parse_entry(entry, &e))
        return 0;
    return fk_fault_count(e);
}

FK_EXPORT unsigned long long colld_cudafake_stream_id(void *stream)
{
    fk_boot();
    pthread_mutex_lock(&fk.mu);
    fk_stream_t *s = stream;
    unsigned long long id = fk_handle_ok(s, FK_K_STREAM) ? s->id : 0;
    pthread_mutex_unlock(&fk.mu);
    return id;
}
