/*
 * fast.c - small collectives run by the ranks themselves on the communicator's fast area.
 *
 * A collective whose input per rank fits in a slot of the area (the daemon's --fast-path-bytes)
 * skips the hand-off to the engine thread: this rank copies its input into its slot and publishes
 * it, waits until every rank has published the same collective, then computes its own output from
 * the slots in rank order with the same CPU kernels the daemon uses (so results are bitwise those
 * of the engine path). A premultiplied sum runs here too: each rank publishes its scalar word in
 * its slot header, and every rank multiplies each peer's input by that peer's scalar. The protocol
 * and layout are in proto/wire.h. Whether a collective takes this path depends only on its
 * signature and the communicator, so every rank decides alike.
 *
 * The daemon is off this path but stays the authority: a rank that has waited a while (or that
 * finds a different call in a peer's slot) posts a record of its collective and wakes the
 * daemon, which checks it against the other ranks' records, engine descriptors and slots
 * (MISMATCH naming each call), times it out naming the ranks that never came, and records it in
 * the flight recorder. When the communicator breaks, the daemon writes the error into the area
 * and wakes the waiting ranks. A waiting rank polls the slots for as long as its peers usually take
 * to come (a pause between looks while a CPU is free, at most 50 us; a yield while the CPUs are
 * crowded, at most 200 us; client/spin.h), then sleeps on the area's futex word (a peer that
 * publishes wakes it); after RECORD_AFTER_NS it posts its record and sleeps on. Each rank counts
 * what it finished in its stats block of the area, which the daemon's metrics read.
 */
#include "client/client_internal.h"

#include "common/log.h"
#include "transport/shm/ring.h"
#include "common/util.h"
#include "kernels/cpu/reduce.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define RECORD_AFTER_NS 200000ull  /* a rank that waited this long posts its record to the daemon */
#define SLEEP_SLICE_NS 10000000ull /* a sleeper re-checks at least this often */
#define NAP_POLLS 32               /* colld__fast_nap: polls of a group before it naps... */
#define NAP_NS 100000ull           /* ...for at most this long each */
#define LOCAL_GRACE_MS 2000        /* the daemon's time-out is the rule; this is the last resort */

static colld_wire_fast_slot_t *slot_of(const colld_comm_t *comm, int rank, uint64_t seq)
{
    size_t i = (size_t)rank * COLLD_WIRE_FAST_DEPTH + (size_t)(seq % COLLD_WIRE_FAST_DEPTH);
    return (colld_wire_fast_slot_t *)((char *)comm->fast + COLLD_WIRE_FAST_SLOTS_OFFSET(comm->nranks) +
                                      i * comm->fast_stride);
}

static colld_wire_fast_stats_t *my_stats(const colld_comm_t *comm)
{
    return (colld_wire_fast_stats_t *)((char *)comm->fast + COLLD_WIRE_FAST_STATS_OFFSET) + comm->rank;
}

static char *payload_of(colld_wire_fast_slot_t *s)
{
    return (char *)(s + 1);
}

static bool has_op(unsigned kind)
{
    return kind == COLLD_KIND_ALLREDUCE || kind == COLLD_KIND_REDUCE || kind == COLLD_KIND_REDUCESCATTER;
}

static bool has_root(unsigned kind)
{
    return kind == COLLD_KIND_BROADCAST || kind == COLLD_KIND_REDUCE;
}

/* ============================================================================================
 * Attaching
 * ========================================================================================== */

void colld__fast_attach(colld_comm_t *comm)
{
    colld_client_t *c = comm->client;
    colld_wire_msg_t m, r;
    memset(&m, 0, sizeof(m));
    memset(&r, 0, sizeof(r));
    m.type = COLLD_MSG_FAST_AREA;
    m.u.fast.handle = comm->handle;
    int fd = -1;
    colld_status_t st = colld__sock_request(c, &m, -1, COLLD_MSG_FAST_AREA_REPLY, &r, &fd, 1);
    if (st == COLLD_OK && r.status != COLLD_OK) {
        r.u.detail[sizeof(r.u.detail) - 1] = '\0';
        LOG_DEBUG(CLIENT, "communicator %llu: every collective goes through the daemon: %s",
                  (unsigned long long)comm->comm_id, r.u.detail);
        return;
    }
    if (st != COLLD_OK || fd < 0) {
        if (fd >= 0)
            close(fd);
        return;
    }
    uint64_t size = r.u.fast.size;
    size_t slots = COLLD_WIRE_FAST_SLOTS_OFFSET(comm->nranks);
    void *p = size >= slots && size <= SIZE_MAX ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                                                : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) {
        LOG_WARN(CLIENT, "communicator %llu: cannot map its fast area; using the daemon for every collective",
                 (unsigned long long)comm->comm_id);
        return;
    }
    /* Copy the layout, then validate the copy, and use only the copy from here on: every member
     * of the communicator can write the area's header. */
    colld_wire_fast_t hdr;
    memcpy(&hdr, p, sizeof(hdr));
    uint64_t need = 0;
    bool ok = hdr.magic == COLLD_WIRE_FAST_MAGIC && hdr.nranks == (uint32_t)comm->nranks && hdr.total_size == size &&
              hdr.slot_stride % COLLD_WIRE_CACHELINE == 0 &&
              hdr.slot_stride >= sizeof(colld_wire_fast_slot_t) + (uint64_t)hdr.slot_bytes &&
              colld_mul_ok((uint64_t)hdr.slot_stride, (uint64_t)comm->nranks * COLLD_WIRE_FAST_DEPTH, &need) &&
              need <= size - slots;
    void *scratch = NULL;
    const void **in = NULL;
    uint64_t *scalars = NULL;
    if (ok) {
        scratch = aligned_alloc(COLLD_WIRE_CACHELINE, ((size_t)hdr.slot_bytes + 63) & ~(size_t)63);
        in = calloc((size_t)comm->nranks, sizeof(*in));
        scalars = calloc((size_t)comm->nranks, sizeof(*scalars));
    }
    if (!ok || !scratch || !in || !scalars) {
        if (!ok)
            LOG_WARN(CLIENT, "communicator %llu: the daemon's fast area is malformed; not using it",
                     (unsigned long long)comm->comm_id);
        free(scratch);
        free(in);
        free(scalars);
        munmap(p, size);
        return;
    }
    comm->fast = p;
    comm->fast_size = size;
    comm->fast_stride = hdr.slot_stride;
    comm->fast_slot_bytes = hdr.slot_bytes;
    comm->fast_scratch = scratch;
    comm->fast_in = in;
    comm->fast_scalars = scalars;
}

void colld__fast_detach(colld_comm_t *comm)
{
    if (!comm->fast)
        return;
    munmap(comm->fast, comm->fast_size);
    free(comm->fast_scratch);
    free(comm->fast_in);
    free(comm->fast_scalars);
    comm->fast = NULL;
    comm->fast_scratch = NULL;
    comm->fast_in = NULL;
    comm->fast_scalars = NULL;
}

/* Bytes of this rank's input that go into its slot (the same on every rank but for a broadcast
 * non-root, which writes none; eligibility uses the full size so that every rank decides alike). */
static bool input_bytes(const colld_comm_t *comm, colld_kind_t kind, size_t count, colld_dtype_t dtype, uint64_t *out)
{
    uint64_t b;
    if (!colld_mul_ok(count, colld_dtype_size(dtype), &b))
        return false;
    if (kind == COLLD_KIND_REDUCESCATTER && !colld_mul_ok(b, (uint64_t)comm->nranks, &b))
        return false;
    *out = b;
    return true;
}

bool colld__fast_eligible(const colld_comm_t *comm, colld_kind_t kind, size_t count, colld_dtype_t dtype)
{
    uint64_t b;
    return comm->fast && kind <= COLLD_KIND_REDUCESCATTER && input_bytes(comm, kind, count, dtype, &b) &&
           b <= comm->fast_slot_bytes;
}

/* ============================================================================================
 * Starting
 * ========================================================================================== */

/* The fast path's poster: publish this rank's input for its next sequence number. The buffers
 * were checked by the router (coll.c, when the call was made): not NULL where used, not running
 * past the end of a registration, not device memory. */
colld_status_t colld__fast_post(colld_comm_t *comm, colld_kind_t kind, const void *send, size_t send_bytes, void *recv,
                                size_t recv_bytes, size_t count, colld_dtype_t dtype, uint8_t op, uint64_t scalar,
                                int root, colld_err_t *err)
{
    (void)recv_bytes, (void)err;
    uint64_t seq = ++comm->seq;
    uint64_t ord = seq - comm->p2p; /* the collective ordinal: the slots name the collective by it */
    uint8_t redop = has_op(kind) ? op : 0;
    uint64_t now = colld_now_ns();
    colld_wire_fast_slot_t *s = slot_of(comm, comm->rank, ord);
    /* Mark the slot as being rewritten (seq 0) before touching it: the daemon may still be
     * reading the collective it held (seq - 2) and must see that its copy is torn. Peers are done
     * with that one (see proto/wire.h). */
    (void)__atomic_exchange_n(&s->seq, 0, __ATOMIC_ACQ_REL); /* acquire: no later store moves above it */
    if (send_bytes)
        memcpy(payload_of(s), send, send_bytes);
    s->count = count;
    s->kind = (uint8_t)kind;
    s->dtype = (uint8_t)dtype;
    s->redop = redop;
    s->flags = 0;
    s->root = root;
    s->arrival_ns = now;
    s->scalar = redop == COLLD_REDOP_PREMUL_SUM ? scalar : 0;
    __atomic_store_n(&s->seq, ord, __ATOMIC_RELEASE);
    __atomic_add_fetch(&comm->fast->gen, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&comm->fast->sleepers, __ATOMIC_SEQ_CST))
        colld_futex_wake_all(&comm->fast->gen);
    comm->fop = (colld_fast_op_t){ .active = true,
                                   .seq = seq,
                                   .ord = ord,
                                   .kind = (uint8_t)kind,
                                   .dtype = (uint8_t)dtype,
                                   .redop = redop,
                                   .root = root,
                                   .count = count,
                                   .recv = recv,
                                   .arrival_ns = now };
    return COLLD_OK;
}

/* Tell the daemon that this rank waits for the collective in flight (once per collective), and
 * wake it: it checks the call against the other ranks and starts the time-out clock. */
static void post_record(colld_comm_t *comm)
{
    colld_fast_op_t *f = &comm->fop;
    if (f->recorded)
        return;
    f->recorded = true;
    colld_wire_sqe_t rec;
    memset(&rec, 0, sizeof(rec));
    rec.seq = f->seq;
    rec.count = f->count;
    rec.comm = comm->handle;
    rec.kind = f->kind;
    rec.dtype = f->dtype;
    rec.redop = f->redop;
    rec.flags = COLLD_SQE_FAST;
    rec.root = f->root;
    rec.send.offset = f->arrival_ns;
    (void)colld__client_submit(comm->client, &rec, 1); /* wakes a sleeping daemon; fails only when it is lost */
}

/* ============================================================================================
 * Finishing
 * ========================================================================================== */

/* 1: every rank published this collective with our signature; 0: not all yet; -1: a slot holds
 * something else (a different call: the daemon's signature check will name it). */
static int slots_ready(const colld_comm_t *comm)
{
    const colld_fast_op_t *f = &comm->fop;
    for (int j = 0; j < comm->nranks; j++) {
        const colld_wire_fast_slot_t *s = slot_of(comm, j, f->ord);
        uint64_t seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
        if (seq < f->ord)
            return 0;
        if (seq > f->ord || s->kind != f->kind || s->dtype != f->dtype || s->count != f->count ||
            (has_op(f->kind) && s->redop != f->redop) || (has_root(f->kind) && s->root != f->root))
            return -1;
    }
    return 1;
}

/* Compute this rank's output from the published slots. */
static void compute(colld_comm_t *comm)
{
    const colld_fast_op_t *f = &comm->fop;
    colld_dtype_t dt = (colld_dtype_t)f->dtype;
    size_t es = colld_dtype_size(dt), bytes = (size_t)f->count * es;
    int n = comm->nranks, me = comm->rank;
    if (!bytes)
        return;
    switch ((colld_kind_t)f->kind) {
    case COLLD_KIND_BROADCAST:
        memmove(f->recv, payload_of(slot_of(comm, f->root, f->ord)), bytes);
        return;
    case COLLD_KIND_ALLGATHER:
        for (int j = 0; j < n; j++)
            memmove((char *)f->recv + (size_t)j * bytes, payload_of(slot_of(comm, j, f->ord)), bytes);
        return;
    case COLLD_KIND_REDUCE:
        if (me != f->root)
            return;
        /* fall through */
    case COLLD_KIND_ALLREDUCE:
    case COLLD_KIND_REDUCESCATTER: {
        size_t off = f->kind == COLLD_KIND_REDUCESCATTER ? (size_t)me * bytes : 0;
        bool premul = f->redop == COLLD_REDOP_PREMUL_SUM;
        for (int j = 0; j < n; j++) {
            colld_wire_fast_slot_t *sj = slot_of(comm, j, f->ord);
            comm->fast_in[j] = payload_of(sj) + off;
            /* A peer's scalar is read once, and used only as a number (a bad one only changes this
             * communicator's own result). */
            comm->fast_scalars[j] = premul ? __atomic_load_n(&sj->scalar, __ATOMIC_RELAXED) : 0;
        }
        /* The kernels want element-aligned pointers; the slots are, the caller's buffer may not be. */
        bool aligned = (uintptr_t)f->recv % es == 0;
        void *out = aligned ? f->recv : comm->fast_scratch;
        if (premul)
            colld_cpu_reduce_premul(dt, comm->fast_scalars, comm->fast_in, n, &out, 1, f->count);
        else
            colld_cpu_reduce(dt, (colld_redop_t)f->redop, comm->fast_in, n, &out, 1, f->count);
        if (!aligned)
            memcpy(f->recv, comm->fast_scratch, bytes);
        return;
    }
    case COLLD_KIND_GATHER:
    case COLLD_KIND_SCATTER:
    case COLLD_KIND_ALLTOALL:
    case COLLD_KIND_SEND:
    case COLLD_KIND_RECV:
        return; /* never on the fast area (colld__fast_eligible) */
    }
}

/* The collective failed: the communicator keeps the first error (its detail comes from the
 * daemon, or was written here). */
static colld_status_t fail(colld_comm_t *comm, colld_status_t st, const char *detail)
{
    if (comm->fop.active)
        colld__seq_lower(&comm->failed_seq, comm->fop.seq);
    comm->fop.active = false;
    colld__comm_break_here(comm, st, detail);
    return st;
}

/* The last resort when the daemon has said nothing long after the time-out: name the ranks this
 * rank never saw. */
static colld_status_t local_timeout(colld_comm_t *comm)
{
    char why[COLLD_CLIENT_DETAIL_LEN];
    int off = snprintf(why, sizeof(why),
                       "collective #%llu: no verdict from the daemon %d ms after the %d ms "
                       "time-out; ranks not seen on the fast area:",
                       (unsigned long long)comm->fop.ord, LOCAL_GRACE_MS, comm->timeout_ms);
    for (int j = 0; j < comm->nranks && off < (int)sizeof(why) - 12; j++)
        if (__atomic_load_n(&slot_of(comm, j, comm->fop.ord)->seq, __ATOMIC_ACQUIRE) != comm->fop.ord)
            off += snprintf(why + off, sizeof(why) - (size_t)off, " %d", j);
    LOG_WARN(CLIENT, "%s", why);
    return fail(comm, COLLD_ERR_TIMEOUT, why);
}

/* Sleep on the area's futex word, at most timeout_ns, unless something changed since `gen` was
 * read (a peer that publishes, and the daemon when the communicator breaks, bump it and wake the
 * sleepers). */
static void sleep_on_area(colld_comm_t *comm, uint32_t gen, uint64_t timeout_ns)
{
    colld_wire_fast_t *f = comm->fast;
    __atomic_add_fetch(&f->sleepers, 1, __ATOMIC_SEQ_CST);
    if (slots_ready(comm) != 1 && !__atomic_load_n(&f->status, __ATOMIC_SEQ_CST) && !atomic_load(&comm->client->lost))
        colld_futex_wait(&f->gen, gen, timeout_ns);
    __atomic_sub_fetch(&f->sleepers, 1, __ATOMIC_SEQ_CST);
}

void colld__fast_nap(colld_comm_t *comm, unsigned idle)
{
    colld_client_t *c = comm->client;
    if (idle < NAP_POLLS) {
        if (comm->crowded || colld__cpus_busy(&c->load, colld_now_ns()))
            sched_yield();
        else
            for (int i = 0; i < 64; i++)
                colld__cpu_relax();
        return;
    }
    if (comm->fast && comm->fop.active)
        sleep_on_area(comm, __atomic_load_n(&comm->fast->gen, __ATOMIC_SEQ_CST), NAP_NS);
    else
        colld__ring_nap(c, NAP_NS);
}

colld_status_t colld__fast_finish(colld_comm_t *comm, bool block)
{
    if (!comm->fop.active)
        return COLLD_OK;
    colld_client_t *c = comm->client;
    uint64_t start = 0, now = 0;
    colld_spin_plan_t plan = { 0, false };
    for (unsigned iter = 0;; iter++) {
        uint32_t gen = __atomic_load_n(&comm->fast->gen, __ATOMIC_SEQ_CST);
        int ready = slots_ready(comm);
        if (ready == 1) {
            compute(comm);
            comm->fop.active = false;
            colld__seq_raise(&comm->done_upto, comm->fop.seq); /* those before it had completed when it started */
            colld_wire_fast_stats_t *st = my_stats(comm);
            unsigned k = comm->fop.kind - 1u, t = comm->fop.dtype;
            if (k < COLLD_WIRE_FAST_KINDS && t < COLLD_WIRE_FAST_DTYPES) {
                st->ops[k][t]++;
                st->bytes[k][t] += comm->fop.count * colld_dtype_size((colld_dtype_t)t);
            }
            /* How soon the peers came: the next waits' busy-poll follows it. */
            if (block)
                colld__spin_record(&comm->fast_spin, plan.window_ns, start ? colld_now_ns() - start : 0);
            return COLLD_OK;
        }
        int32_t area = __atomic_load_n(&comm->fast->status, __ATOMIC_SEQ_CST);
        if (area != COLLD_OK)
            return fail(comm, (colld_status_t)area, NULL);
        colld_status_t err = __atomic_load_n(&comm->async_error, __ATOMIC_RELAXED);
        if (err != COLLD_OK) /* aborted here, or a notice of a fault */
            return fail(comm, err, NULL);
        if (atomic_load(&c->lost))
            return fail(comm, COLLD_ERR_DAEMON_LOST, colld__lost_detail(c));
        if (!block)
            return COLLD_INPROGRESS;
        if ((iter & 31) == 0 || plan.yield) { /* a yield may take long: the clock at every look */
            now = colld_now_ns();
            if (!start) {
                start = now;
                plan = colld__spin_plan(&comm->fast_spin, &c->load, comm->crowded, now);
            }
        }
        uint64_t waited = now - start;
        if (ready == 0 && waited < plan.window_ns) {
            colld__spin_between(&plan);
            continue;
        }
        if (ready == 0 && waited < RECORD_AFTER_NS) {
            /* Sleep until a peer publishes, without the daemon: most waits end here. */
            sleep_on_area(comm, gen, RECORD_AFTER_NS - waited);
            now = colld_now_ns();
            continue;
        }
        /* Sleep: first tell the daemon (a different call on another rank, ready == -1, is its
         * to report), and keep reading its notices. */
        post_record(comm);
        colld__client_poll(c);
        if (waited > ((uint64_t)comm->timeout_ms + LOCAL_GRACE_MS) * 1000000ull)
            return local_timeout(comm);
        sleep_on_area(comm, gen, SLEEP_SLICE_NS);
        now = colld_now_ns();
    }
}
