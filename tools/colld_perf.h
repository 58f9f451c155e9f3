/*
 * colld_perf.h - what the two files of colld-perf share (private to tools/): colld_perf.c (options,
 * the measurement, the output, the launcher) and colld_perf_gpu.c (GPU mode, -G/--gpu: the device
 * buffers, the stream and every CUDA call; stubs that are never reached in a build without CUDA).
 */
#ifndef COLLD_TOOLS_COLLD_PERF_H
#define COLLD_TOOLS_COLLD_PERF_H

#include <colld/colld.h>

#include <stdbool.h>
#include <stddef.h>

#define PROG "colld-perf"
#define MAX_RANKS 64
#define SMALL_BYTES 4096 /* the registered scratch buffer: barrier, times, counts, pids, labels */

/* The options of the run (parse_options in colld_perf.c). */
typedef struct {
    size_t min_bytes, max_bytes;
    double factor;
    int iters, warmup, check, blocking, root, nranks, timeout_ms, attach_reps;
    unsigned kinds, dtypes, ops; /* bit masks */
    bool json, make_uid, gpu;
    bool finite; /* --finite: small-integer inputs (as --join's), never NaN or infinite */
    bool overlap; /* --overlap (GPU mode): the collective beside a busy kernel (run_overlap) */
    const char *socket, *colld;
    /* this process is one rank: set by the launcher (--internal-rank, id from a pipe) or by the
     * caller (--rank with --join, id from the command line) */
    int rank;
    bool join;
    colld_unique_id_t join_id;
} opts_t;

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
} rank_t;

/* colld_perf.c: CLOCK_MONOTONIC in microseconds. */
double now_us(void);

/* colld_perf_gpu.c. Without CUDA, -G is refused when the options are parsed and every function
 * below except dev_ptr is a stub that is never reached. */

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
/* The device name of GPU 0 for the header. */
void gpu_name(char *buf, size_t len);
/* The launcher's check before anything starts: is a GPU visible? 0, or -1 (printed). */
int gpu_visible(void);

#endif
