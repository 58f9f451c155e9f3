/*
 * fuzz_engine.c - libFuzzer harness: what hostile clients can write into the shared memory of a
 * real daemon core (tests/fuzz/core_fixture.h), run through the engine a round at a time.
 *
 * The input is a program of operations by 1..4 sessions that are the ranks of one communicator:
 * well-formed descriptors with fuzzed fields (kind, dtype, op, root, count, sequence number,
 * buffers and offsets, flags), raw 64-byte descriptors, garbage in the ring counters, writes into
 * the communicator's fast area (slot headers and the area header, as a member can), reading
 * completions, ending a session, and engine rounds. Descriptor admission, matching, the fast-area
 * judgement (resolve_fast), time-outs, execution on the host backend and communicator breaks all
 * run as in the daemon. The harness asserts nothing itself: ASan/UBSan and LeakSanitizer find
 * what goes wrong, and the engine must finish every input (no spin: each round is bounded).
 */
#include "tests/fuzz/core_fixture.h"

#include "transport/shm/ring.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

static uint64_t take(input_t *in, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)take8(in) << (8 * i);
    return v;
}

/* A descriptor whose fields are fuzzed within the ranges that reach deep into the engine. */
static void structured_sqe(input_t *in, colld_session_t *s, uint32_t handle, colld_wire_sqe_t *sqe)
{
    memset(sqe, 0, sizeof(*sqe));
    colld_member_t *m = handle < s->nhandles ? s->handles[handle] : NULL;
    int8_t dseq = (int8_t)take8(in);
    uint64_t next = m ? m->next_seq : 1;
    sqe->seq = (dseq >= -2 && dseq <= 2) ? next + (uint64_t)(int64_t)dseq : take(in, 8);
    sqe->comm = handle;
    sqe->kind = (uint8_t)(take8(in) % (COLLD_KIND_MAX + 2)); /* every kind and an unknown one */
    sqe->dtype = (uint8_t)(take8(in) % 12);
    sqe->redop = (uint8_t)(take8(in) % 7);
    sqe->flags = (uint8_t)(take8(in) & 0x03);
    sqe->root = (int8_t)take8(in);
    sqe->count = take(in, 2);
    sqe->send.reg_id = take8(in) % 4;
    sqe->send.offset = take(in, 2);
    sqe->recv.reg_id = take8(in) % 4;
    sqe->recv.offset = take(in, 2);
    if (sqe->flags & COLLD_SQE_FAST)
        sqe->send.offset = take(in, 8); /* a record's arrival time */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input_t in = { data, size };
    fix_t *f = calloc(1, sizeof(*f));
    if (!f)
        return 0;
    uint8_t cfg = take8(&in);
    int nranks = 1 + (cfg & 3);
    uint64_t fast_bytes = (cfg & 4) ? 0 : 16384;
    if (fix_start(f, fast_bytes) < 0)
        abort();
    for (int r = 0; r < nranks; r++)
        if (!fix_session(f, 1000, (uint8_t)(r + 1)))
            abort();
    colld_dcomm_t *c = fix_comm(f, nranks, 1 + (cfg >> 4)); /* 1..16 ms: time-outs are reached */
    if (!c)
        abort();
    colld_daemon_t *d = &f->d;
    uint32_t handle = c->ranks[0].handle; /* each session's first communicator: handle 1 */
    /* The area's layout as the ranks know it (the daemon keeps its own copy). */
    colld_wire_fast_t *area = c->fast;
    uint64_t stride = c->fast_stride;

    for (int ops = 0; in.n && ops < 256; ops++) {
        uint8_t op = take8(&in);
        colld_session_t *s = f->s[(op >> 4) % (unsigned)nranks];
        colld_wire_sqe_t sqe;
        switch (op & 0x0f) {
        case 0:
        case 1:
        case 2:
            structured_sqe(&in, s, handle, &sqe);
            fix_post(f, s, &sqe);
            break;
        case 3: /* a raw descriptor */
            for (size_t i = 0; i < sizeof(sqe); i++)
                ((uint8_t *)&sqe)[i] = take8(&in);
            fix_post(f, s, &sqe);
            break;
        case 4: /* garbage ring counters */
            if (s->shm) {
                if (take8(&in) & 1)
                    COLLD_STORE_SC(&s->shm->sq.head, take(&in, 8));
                else
                    COLLD_STORE_SC(&s->shm->cq.tail, take(&in, 8));
            }
            break;
        case 5: /* a slot header, as its rank (or a scribbling peer) writes it */
            if (area) {
                unsigned rank = take8(&in) % (unsigned)nranks, parity = take8(&in) & 1;
                colld_wire_fast_slot_t *slot =
                    (colld_wire_fast_slot_t *)((char *)area + COLLD_WIRE_FAST_SLOTS_OFFSET(nranks) +
                                               (rank * COLLD_WIRE_FAST_DEPTH + parity) * stride);
                colld_wire_fast_slot_t h;
                structured_sqe(&in, s, handle, &sqe);
                h = (colld_wire_fast_slot_t){ .seq = sqe.seq, .count = sqe.count, .kind = sqe.kind,
                                              .dtype = sqe.dtype, .redop = sqe.redop, .root = sqe.root,
                                              .arrival_ns = take(&in, 8) };
                memcpy(slot, &h, sizeof(h));
            }
            break;
        case 6: /* the area header and stats, as any member can write them */
            if (area) {
                size_t off = take(&in, 2) % COLLD_WIRE_FAST_SLOTS_OFFSET(nranks);
                uint64_t v = take(&in, 8);
                memcpy((char *)area + (off & ~(size_t)7), &v, sizeof(v));
            }
            break;
        case 7:
            fix_reap(f, s);
            break;
        case 8:
            if (take8(&in) == 0x5a) {
                fix_session_end(f, s);
                area = NULL; /* the communicator may be gone with its area */
            }
            break;
        default:
            colld_engine_run_once(d);
            break;
        }
    }
    for (int i = 0; i < 3; i++)
        colld_engine_run_once(d);
    fix_stop(f);
    free(f);
    return 0;
}
