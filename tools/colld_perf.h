/*
 * colld_perf.h - what the files of colld-perf share (private to tools/):
 *   colld_perf.c         the options, --make-uid and main (which part runs in this process)
 *   colld_perf_launch.c  the launcher: a daemon if needed, the rank processes, their end
 *   colld_perf_bench.c   one rank of the collective benchmark: the measurement and its output
 *   colld_perf_check.c   the input generator and the reference results the check compares with
 *   colld_perf_attach.c  one rank of the attach + join benchmark (--attach-bench)
 *   colld_perf_gpu.c     GPU mode (-G/--gpu: the device buffers, the stream and every CUDA call;
 *                        empty bodies nothing calls in a build without CUDA, where -G is refused)
 *   colld_perf_names.c   the names of the collectives, datatypes and operations
 *   colld_perf_util.c    the clock, a read with a deadline, the median
 * colld_perf.c calls the launcher and the two benchmarks; they call down into check, gpu, names
 * and util, which call nothing of colld-perf's but the clock (now_us).
 */
#ifndef COLLD_TOOLS_COLLD_PERF_H
#define COLLD_TOOLS_COLLD_PERF_H

#include <colld/colld.h>

#include <stdbool.h>
#include <stddef.h>

#define PROG "colld-perf"
#define MAX_RANKS 64
#define SMALL_BYTES 4096 /* the registered scratch buffer: barrier, times, counts, pids, labels */
#define ID_FD 3                  /* where a rank process finds the pipe with the unique id(s) */
#define ID_READ_TIMEOUT_MS 30000 /* a rank waits at most this long for its id */

/* The collectives: perf_kind_names names them in this order, and -t all runs them in it. */
enum { K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCESCATTER, K_COUNT };

/* The options of the run (parse_options in colld_perf.c). */
typedef struct {
    size_t min_bytes, max_bytes;
    double factor;
    int iters, warmup, check, blocking, root, nranks, timeout_ms, attach_reps;
    unsigned kinds, dtypes, ops; /* bit masks */
    bool json, make_uid, gpu;
    bool finite; /* --finite: small-integer inputs (as --join's), never NaN or infinite */
    bool overlap; /* --overlap (GPU mode): the collective beside a busy kernel (run_overlap) */
    bool host_ahead; /* --host-ahead (GPU mode): each collective behind a busy kernel (run_host_ahead) */
    bool nan_check; /* --nan-check: the communicator's nan_check (its reductions' inputs checked) */
    const char *socket, *colld;
    /* this process is one rank: set by the launcher (--internal-rank, id from a pipe) or by the
     * caller (--rank with --join, id from the command line) */
    int rank;
    bool join;
    colld_unique_id_t join_id;
} opts_t;

/* The shape of one row: `bytes` requested becomes whole elements (make_shape in colld_perf_bench.c).
 * count is NCCL's count argument (per-rank for all-gather and reduce-scatter), total the "count"
 * column (all elements of S). */
typedef struct {
    int kind;
    colld_dtype_t dt;
    colld_redop_t op;
    int root;
    size_t count;      /* the API's count argument */
    size_t total;      /* elements of S */
    size_t size;       /* S in bytes */
    size_t send_elems; /* elements of this rank's send buffer */
    size_t recv_elems; /* elements of this rank's receive buffer */
} shape_t;

typedef void (*pattern_fn)(colld_dtype_t dt, int rank, unsigned salt, size_t first, size_t n, void *out);

/* Scratch for the reference computation: one chunk per rank plus the expected chunk; and the
 * input generator of the run. */
typedef struct {
    unsigned char *in[MAX_RANKS];
    unsigned char *want;
    pattern_fn pattern;
} ref_t;

/* One rank of the collective benchmark. */
typedef struct {
    const opts_t *o;
    colld_client_t *c;
    colld_comm_t *comm;
    int n, rank;
    unsigned char *sbuf, *rbuf; /* registered, max_bytes each (GPU mode: pinned host images) */
    unsigned char *small;       /* registered scratch: barrier, times, counts, pids (GPU mode: image) */
    ref_t ref;
    size_t bytes;               /* bytes of sbuf and rbuf */
    /* GPU mode: the device buffers that sbuf, rbuf and small mirror, and the rank's stream */
    unsigned char *dsbuf, *drbuf, *dsmall;
    void *stream;
    double *lat;                /* GPU mode: ITERS latency samples */
    void *busy_stream;          /* --overlap: the rank's second stream, for the busy kernel */
    void *ev[2];                /* --host-ahead: two timing events on the rank's stream */
} rank_t;

/* colld_perf_names.c: nccl-tests' names of the collectives (K_* order), the datatypes and the
 * operations (colld_dtype_t and colld_redop_t order); colld's own datatype names, accepted as well. */
extern const char *const perf_kind_names[K_COUNT];
extern const char *const perf_dtype_names[COLLD_DTYPE_COUNT];
extern const char *const perf_dtype_aliases[COLLD_DTYPE_COUNT];
extern const char *const perf_op_names[COLLD_REDOP_COUNT];

/* colld_perf_util.c: CLOCK_MONOTONIC in microseconds. */
double now_us(void);
/* Read exactly len bytes from fd, waiting at most timeout_ms in all. Returns 0 or -1. */
int perf_read_full(int fd, void *buf, size_t len, int timeout_ms);
/* The median of v[0..n) (sorts v); 0 when n <= 0. */
double perf_median(double *v, int n);

/* colld_perf_check.c. The reference's scratch for n ranks and the run's generator: with any_order
 * (--join, --finite) small integers, exact in any order of reduction. 0, or -1 when out of memory;
 * then perf_ref_free in any case. */
int perf_ref_alloc(ref_t *f, int n, bool any_order);
void perf_ref_free(ref_t *f);
/* The number of elements of `got` (this rank's receive elements of a call of shape s) that differ
 * bitwise from the reference result for inputs generated with `salt`; SIZE_MAX when the reference
 * kernel refuses. */
size_t perf_count_wrong(const shape_t *s, int n, int rank, unsigned salt, const unsigned char *got, ref_t *f);

/* colld_perf_bench.c: a rank process of the collective benchmark (launched, or --join): connect,
 * join the communicator `id`, allocate, benchmark, clean up. Returns the exit status. */
int perf_rank_main(const opts_t *o, colld_unique_id_t id);

/* colld_perf_attach.c: a rank process of --attach-bench (its ids from the launcher's pipe); rank 0
 * prints the report. Returns the exit status. */
int perf_attach_main(const opts_t *o);

/* colld_perf_launch.c: the launcher (this process is no rank): a daemon if none answers, the
 * ranks (argv again, with --internal-rank), their end. Returns the exit status. */
int perf_launch(const opts_t *o, int argc, char **argv);

/* colld_perf_gpu.c. Without CUDA, -G is refused when the options are parsed and every function
 * below except dev_ptr has an empty body that nothing calls. */

/* The device address of a byte of the host images (GPU mode), or the host address itself. */
void *dev_ptr(const rank_t *R, const void *host);
/* Copy len bytes at host image address p to the device (to_dev) or back, on the stream. */
colld_status_t gpu_copy(rank_t *R, void *p, size_t len, bool to_dev);
/* Wait for the stream (polling it and the communicator's asynchronous error). */
colld_status_t gpu_wait(rank_t *R);
/* Rank 0's device-to-device copy bandwidth at `bytes` (read + write: 2 x bytes / time), GB/s. */
double gpu_d2d_gbs(rank_t *R, size_t bytes);
/* Device 0, a stream, device buffers and pinned host images. 0 or -1 (printed); then
 * gpu_teardown in any case. */
int gpu_setup(rank_t *R);
void gpu_teardown(rank_t *R);
/* --overlap: launch the busy kernel (`blocks` blocks spinning `cycles` SM clock cycles) on the
 * rank's second stream; wait for that stream; the number of SMs of GPU 0 (0 if unknown). */
colld_status_t gpu_busy(rank_t *R, int blocks, long long cycles);
colld_status_t gpu_busy_wait(rank_t *R);
int gpu_sm_count(void);
/* --host-ahead: the busy kernel on the rank's own stream (queued ahead of what is posted next);
 * record timing event `which` (0 or 1) on the rank's stream; after the stream has completed, the
 * time from event 0 to event 1 in us (CUDA events), or -1 (printed). */
colld_status_t gpu_busy_here(rank_t *R, int blocks, long long cycles);
colld_status_t gpu_mark(rank_t *R, int which);
double gpu_marks_us(rank_t *R);
/* The device name of GPU 0 for the header. */
void gpu_name(char *buf, size_t len);
/* The launcher's check before anything starts: is a GPU visible? 0, or -1 (printed). */
int gpu_visible(void);

#endif
