/*
 * coll_data.h - what the two collective rank programs share: colld-test-coll (coll_rank.c, host
 * memory) and colld-test-gpu-rank (tests/gpu/gpu_rank.c, device memory through host images).
 *
 * A call_t describes one collective call on one rank. Its inputs come from a deterministic
 * generator of (rank, index, dtype, salt), so every rank can compute every rank's input; its
 * expected output comes from the scalar oracle (colld_cpu_reduce_scalar, rank order 0..n-1). The
 * buffers of a call are slots of GUARD + buffer + GUARD bytes, the guards filled with SENTINEL.
 * How a call is posted, waited for and reported stays with each program.
 */
#ifndef COLLD_TESTS_COLL_DATA_H
#define COLLD_TESTS_COLL_DATA_H

#include "tests/integration/harness_opts.h"

#include <colld/colld.h>
#include <stdbool.h>
#include <stddef.h>

enum { K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCESCATTER, K_GATHER, K_SCATTER, K_ALLTOALL, K_COUNT };
/* The kinds every backend runs (host and GPU buffers, several nodes); gather, scatter and all-to-all
 * run on single-node communicators only, so far (host and, since issue 16, GPU buffers). */
#define K_EVERYWHERE_MASK ((1u << K_GATHER) - 1)

extern const char *const kind_names[K_COUNT];
extern const char *const dtype_names[COLLD_DTYPE_COUNT];
/* The ops of the matrix: colld_redop_t's, then the premultiplied sum. A call's op COLL_OP_PREMUL
 * stands for a premultiplied-sum operator that each rank makes with its own scalar (coll_scalar)
 * when it posts the call (coll_op_make) and destroys right after (coll_op_release). */
#define COLL_OP_PREMUL ((colld_redop_t)COLLD_REDOP_COUNT)
#define COLL_OPS (COLLD_REDOP_COUNT + 1)
extern const char *const op_names[COLL_OPS];

#define GUARD 64             /* bytes before and after every buffer that must stay untouched */
#define SENTINEL 0xA5        /* what unwritten memory holds */
#define BIG_BYTES (4u << 20) /* the large count: at least this many bytes per buffer */
#define SMALL_COUNTS 3       /* counts 0, 1, 1001; the 4th is the big one */
#define MAX_RANKS 64         /* most ranks the programs handle */

/* The input generator: colld_cpu_pattern or colld_cpu_pattern_small (tools/testdata/pattern.h). */
typedef void (*coll_pattern_fn)(colld_dtype_t dt, int rank, unsigned salt, size_t first, size_t n, void *out);

/* One collective call: what it is, where its buffers are, and its inputs and expected output. */
typedef struct {
    int kind;
    colld_dtype_t dt;
    colld_redop_t op;
    size_t count;
    int root;
    bool inplace;
    bool null_unused; /* out of place, non-root: pass NULL for the buffer the call does not use */
    unsigned salt;
    bool small; /* exact inputs (colld_cpu_pattern_small) and exact premultiplied-sum scalars */
    /* the slots (GUARD + buffer + GUARD): in the registered memory (colld-test-coll) or in the
     * host images of the device buffers (colld-test-gpu-rank, which maps them to the device) */
    unsigned char *sreg, *rreg;
    const void *sendp;
    void *recvp;
    unsigned char *mine;   /* this rank's input (send_elems) */
    unsigned char *inputs; /* reductions: every rank's input for the elements this rank receives */
    unsigned char *expect; /* the expected output of this rank (recv_elems) */
} call_t;

/* True for the collectives that take a reduction op. */
bool coll_reduces(int kind);

/* Elements of the send and receive buffers of a call on one rank of n (NCCL's counts). */
void coll_call_sizes(const call_t *k, int n, size_t *send_elems, size_t *recv_elems);

/* Bytes of the one buffer an in-place call uses (the larger of send and receive). */
size_t coll_inplace_bytes(const call_t *k, int n);

/* Whether the receive buffer of `rank` gets a result. */
bool coll_receives(const call_t *k, int rank);

/* Fill mine/inputs/expect of a call for `rank` of n: every rank's input from `pattern`, the
 * expected output from the scalar oracle (reductions; the premultiplied sum with every rank's
 * coll_scalar), the root's input (broadcast) or every
 * rank's input side by side (all-gather). Returns 0, or -1 when out of memory or the oracle
 * refuses; either way coll_free_data releases what was allocated. */
int coll_prepare_data(call_t *k, int n, int rank, coll_pattern_fn pattern);

/* The scalar word (a uint64_t whose first bytes hold one value of the call's dtype) of rank `rank`
 * in a premultiplied-sum call: colld_cpu_pattern_scalar of (dtype, rank, salt), exact values with
 * k->small. Different per rank. */
uint64_t coll_scalar(const call_t *k, int rank);

/* The op `rank` passes for a call: k->op, or for COLL_OP_PREMUL an operator of comm made now with
 * the rank's coll_scalar (colld_redop_create_premul_sum). Returns its status. */
colld_status_t coll_op_make(const call_t *k, int rank, colld_comm_t *comm, colld_redop_t *op);

/* Release what coll_op_make made (nothing for a built-in op); returns st, or the destroy's error
 * when st is COLLD_OK. */
colld_status_t coll_op_release(const call_t *k, colld_comm_t *comm, colld_redop_t op, colld_status_t st);

/* Free what coll_prepare_data allocated (safe to call twice). */
void coll_free_data(call_t *k);

/* Fill the call's slots (sentinels, this rank's input) and set its send/recv pointers, for
 * `rank` of n. The data must have been prepared. */
void coll_prepare_buffers(call_t *k, int n, int rank);

/* True when len bytes at p all hold SENTINEL. */
bool coll_untouched(const unsigned char *p, size_t len);

/* Format one element as its value and, for floating types, its bits. */
void coll_fmt_elem(colld_dtype_t dt, const void *p, char *buf, size_t len);

/* How a program reports the mismatches of its calls: every report counts in *reported, only the
 * first max_report are printed (stderr), each as "MISMATCH <describe(ctx, call)>: <what>". */
typedef struct {
    int n, rank;
    int *reported;
    int max_report;
    const char *where; /* appended to the messages about overwritten guards ("" or " on the device") */
    void (*describe)(const void *ctx, const call_t *k, char *buf, size_t len);
    const void *ctx;
} coll_check_t;

/* Report a failure of a call (while the report budget lasts). */
void coll_report(const coll_check_t *c, const call_t *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Check a completed call in its slots: the result bitwise, the guards, the unchanged send buffer
 * (out of place) and unused buffers. Returns 0 when everything is exact, else 1 (reported, the
 * first differing elements printed with the inputs that went into them). */
int coll_check_call(const coll_check_t *c, const call_t *k);

/* The big count of a dtype: at least BIG_BYTES per buffer, odd, not a multiple of any chunk. */
size_t coll_big_count(colld_dtype_t dt);

/* Which combinations run at the big count unless big_all: broadcast and all-gather for every
 * dtype; the reducing collectives for every dtype with sum and for float32 with every op. (The
 * small counts run every combination; the big ones are there for the chunked, multi-threaded
 * paths, which do not depend on the op.) With big_min, only float32 (with sum where the
 * collective reduces): every kind once at the big count, what `make test` runs on 3 or more ranks
 * (the full subset is `make test-full`'s, COLLD_TEST_FULL=1). */
bool coll_big_selected(bool big_all, bool big_min, int kind, colld_dtype_t dt, colld_redop_t op);

/* What one pass over the matrix covers: collective x dtype x op (reducing kinds only; the
 * premultiplied sum included) x count {0, 1, 1001, big} x {out-of-place, in-place}. */
typedef struct {
    unsigned kinds, dtypes, ops; /* bit masks */
    int rotate;                  /* start at the rotate-th kind */
    bool inplace, outofplace;    /* which modes run */
    bool big, big_all, big_min;  /* the big count at all; every combination at it; one per kind */
    unsigned salt;
    int n;      /* ranks */
    bool small; /* exact values (the calls' `small`) */
} coll_matrix_t;

/* Run the matrix once (pass `iter`) through run(ctx, call), which returns < 0 on a fatal error.
 * *cases counts the combinations (roots, NULL buffers and salts derive from it). Returns 0, or 1
 * after a fatal error (the pass stops there). */
int coll_run_matrix(const coll_matrix_t *m, int iter, long *cases, int (*run)(void *ctx, call_t *k), void *ctx);

/* Look a name up in a table; -1 when absent. */
int coll_lookup(const char *name, const char *const *names, int n);

/* A comma list of names (or "all") as a bit mask; 0 on an unknown name (printed, prefixed with
 * `prog`). */
unsigned coll_parse_mask(const char *prog, const char *list, const char *const *names, int n);
/* A --kinds/--dtypes/--ops option for harness_parse_opts (ctx: a coll_mask_opt_t): the mask of
 * the names listed, "all" for every one; an unknown name or an empty list is refused. */
typedef struct {
    const char *const *names;
    int n;
    unsigned *mask;
} coll_mask_opt_t;
int coll_opt_mask(void *ctx, const char *list);
#define COLL_MASK_OPT(opt, nm, count, dst) HARNESS_FN(opt, coll_opt_mask, (&(coll_mask_opt_t){ (nm), (count), (dst) }))

#endif
