/*
 * colld_perf.c - colld-perf: the collective benchmark, with nccl-tests' columns and conventions.
 *
 *   colld-perf [-t allreduce|broadcast|reduce|allgather|reducescatter|all] [-p NRANKS]
 *              [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1] [-z 0|1]
 *              [-d DTYPE|all] [-o OP|all] [-r ROOT] [-G] [--socket PATH] [--json]
 *   colld-perf --attach-bench REPS [-p NRANKS] [--socket PATH] [--json]
 *   colld-perf --make-uid [--socket PATH]
 *   colld-perf --join HEX -p NRANKS --rank R [benchmark options] [--socket PATH]
 *
 * Every rank is a separate process: the first process (the launcher) gets a unique id from the
 * daemon, re-executes itself once per rank (posix_spawn of /proc/self/exe, so nothing of gRPC
 * crosses a fork) and hands each rank the id through a pipe. Rank 0 prints the table. When no
 * daemon answers on the socket, the launcher starts its own colld (found next to colld-perf, in
 * the build tree's server/, or on PATH) on a private socket in a temporary directory and stops it
 * with SIGTERM at the end.
 *
 * Ranks on several daemons (multi-node, one process per rank started by the caller): --make-uid
 * prints a new unique id of the daemon at --socket as hex (when that daemon runs with --listen,
 * the id carries its address, so ranks on other hosts can join it) and keeps it valid: a daemon
 * drops the ids of a client that disconnects before the first rank joined, so the process stays
 * connected until SIGINT/SIGTERM or --timeout-ms (run it in the background, e.g.
 * `colld-perf --make-uid > uid & ... kill $!`). Each rank is then started as
 * `colld-perf --join HEX -p NRANKS --rank R --socket ITS_LOCAL_DAEMON ...` with the same
 * benchmark options everywhere; the process is rank R only (no launcher, no daemon of its own)
 * and runs exactly the code of a launched rank. Rank 0 prints the table or --json; the header
 * names each rank's host and daemon socket. bench/netns.sh runs it across network namespaces.
 *
 * Measurement, as nccl-tests: for each size, after the warm-up iterations and a barrier (a one
 * element all-reduce), each rank times ITERS back-to-back collectives (-z 1: each one waited for
 * before the next is posted) and divides by ITERS; the reported time is the maximum over ranks.
 * algbw = S / time, busbw = algbw x factor with factor 2(n-1)/n for all-reduce, (n-1)/n for
 * all-gather and reduce-scatter, 1 for broadcast and reduce. S is the send buffer of one rank for
 * all-reduce, broadcast and reduce, the whole receive buffer for all-gather and the whole send
 * buffer for reduce-scatter (nccl-tests' doc/PERFORMANCE.md); sizes are rounded down to whole
 * elements (and for all-gather and reduce-scatter to a multiple of NRANKS elements).
 *
 * Checking (-c 1, the default): after the timed iterations the inputs are regenerated from a
 * deterministic generator (a different salt than the timed ones, receive buffers filled with a
 * sentinel), the collective runs once more, and every element this rank receives is compared
 * bitwise with the result of the scalar reference kernel (rank order 0..n-1, the same
 * deterministic order the daemon guarantees). #wrong is the number of differing elements summed
 * over ranks; for reduce only the root receives. With --join the inputs are small integers
 * (colld_cpu_pattern_small), exact in any order: daemons on several nodes combine per node first,
 * so general float inputs would differ from the rank-order reference in the last bits.
 *
 * GPU mode (-G, --gpu; only in a build with the CUDA toolkit): every rank puts its buffers on GPU 0
 * (cudaMalloc; several ranks share the one GPU) and posts every collective on its own stream
 * (cudaStreamNonBlocking), stream-ordered; the communicator carries only GPU work (barriers and the
 * combining of results are stream-ordered all-reduces too). A call's time runs from the host call
 * to the stream's completion, observed by polling cudaStreamQuery (with colld_comm_get_async_error
 * checked while it waits), so the time column is "call -> stream complete" per iteration, averaged
 * over ITERS back-to-back calls as above. Three more columns per row: p50 (each mode), the median
 * over ITERS calls each waited for on its own (call -> stream complete; the worst rank's median);
 * d2d, the device-to-device copy bandwidth of the GPU at the row's size measured in the same run
 * (rank 0 alone, the other ranks idle: ITERS cudaMemcpyAsync D2D of S bytes, counted as read +
 * write, 2S / time); and for all-reduce hbm/d2d: the HBM traffic of the all-reduce (every rank's
 * input read once and output written once, 2 x nranks x S / time, out of place) as a fraction of
 * that copy bandwidth. Inputs are generated on the host, copied in, and results copied back for
 * the check exactly as in host mode. The device buffers, the stream and every CUDA call are in
 * colld_perf_gpu.c.
 *
 * --attach-bench REPS: each rank process connects (attach) and joins a new NRANKS communicator
 * REPS+1 times; the first repetition is cold (process start, library initialisation), the others
 * start together after a barrier of the previous communicator. Prints per-rank p50/min/max of
 * connect, join and connect+join.
 *
 * Exit status: 0 success (and no wrong element), 1 a failure or a wrong result, 2 bad options.
 */
#include "colld_perf.h"
#include "tools/testdata/pattern.h"
#include "kernels/cpu/reduce.h"

#include <colld/colld.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define ID_FD 3                  /* where a rank process finds the pipe with the unique id(s) */
#define ID_READ_TIMEOUT_MS 30000 /* a rank waits at most this long for its id */
#define DAEMON_START_MS 10000    /* a daemon we start must answer within this */
#define DAEMON_STOP_MS 10000     /* ... and end within this after SIGTERM */
#define FAIL_GRACE_MS 15000      /* after one rank fails, the others get this long to notice */
#define DEFAULT_TIMEOUT_MS 120000 /* communicator timeout: no collective waits longer */
#define CHECK_CHUNK 16384        /* elements per step of the reference computation */
#define MAX_ATTACH_REPS 1000
#define SENTINEL 0xA5            /* what a receive buffer holds before a checked call */
#define PIDS_OFF 256             /* where in the scratch buffer (SMALL_BYTES): every rank's pid (int64) */
#define LABELS_OFF 1024          /* ... and every rank's "host" or "host via socket" */
#define LABEL_BYTES 48

_Static_assert(PIDS_OFF + MAX_RANKS * 8 <= LABELS_OFF && LABELS_OFF + MAX_RANKS * LABEL_BYTES <= SMALL_BYTES,
               "the scratch buffer holds the pids and the labels of MAX_RANKS ranks");

/* =============================================================================================
 * Names and conventions
 * ========================================================================================== */

enum { K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCESCATTER, K_COUNT };

static const char *const kind_names[K_COUNT] = { "allreduce", "broadcast", "reduce", "allgather", "reducescatter" };
/* nccl-tests' type names, in colld_dtype_t order. */
static const char *const dtype_names[COLLD_DTYPE_COUNT] = { "int8",  "uint8", "int32",    "uint32", "int64",
                                                            "uint64", "half", "bfloat16", "float",  "double" };
/* Accepted as well: colld's own names. */
static const char *const dtype_aliases[COLLD_DTYPE_COUNT] = { "i8",      "u8",       "i32",      "u32",     "i64",
                                                              "u64",     "float16",  "bf16",     "float32", "float64" };
static const char *const op_names[COLLD_REDOP_COUNT] = { "sum", "prod", "min", "max", "avg" };

static bool kind_reduces(int kind)
{
    return kind == K_ALLREDUCE || kind == K_REDUCE || kind == K_REDUCESCATTER;
}

static bool kind_rooted(int kind)
{
    return kind == K_BROADCAST || kind == K_REDUCE;
}

/* nccl-tests' bus bandwidth factor. */
static double busbw_factor(int kind, int n)
{
    switch (kind) {
    case K_ALLREDUCE: return 2.0 * (n - 1) / n;
    case K_ALLGATHER:
    case K_REDUCESCATTER: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

/* The shape of one row: `bytes` requested becomes whole elements. count is NCCL's count argument
 * (per-rank for all-gather and reduce-scatter), total the "count" column (all elements of S). */
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

static shape_t make_shape(int kind, colld_dtype_t dt, colld_redop_t op, int root, size_t bytes, int n)
{
    shape_t s = { .kind = kind, .dt = dt, .op = op, .root = root };
    size_t es = colld_dtype_size(dt), elems = bytes / es;
    if (kind == K_ALLGATHER || kind == K_REDUCESCATTER) {
        s.count = elems / (size_t)n;
        s.total = s.count * (size_t)n;
        s.send_elems = kind == K_ALLGATHER ? s.count : s.total;
        s.recv_elems = kind == K_ALLGATHER ? s.total : s.count;
    } else {
        s.count = s.total = s.send_elems = s.recv_elems = elems;
    }
    s.size = s.total * es;
    return s;
}

/* =============================================================================================
 * Options (opts_t: colld_perf.h)
 * ========================================================================================== */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [options]\n"
            "Benchmarks colld's collectives with nccl-tests' columns; each rank is a process.\n"
            "  -t, --collective NAME   allreduce, broadcast, reduce, allgather, reducescatter or all"
            " (default allreduce)\n"
            "  -p, --nranks N          ranks (processes), 1..%d (default 2)\n"
            "  -b, --minbytes SIZE     smallest size, K/M/G suffixes (default 8)\n"
            "  -e, --maxbytes SIZE     largest size (default 32M)\n"
            "  -f, --stepfactor F      size multiplier between rows, > 1 (default 2)\n"
            "  -n, --iters N           timed iterations per size (default 20)\n"
            "  -w, --warmup_iters N    untimed iterations before them (default 5)\n"
            "  -c, --check 0|1         check every result element (default 1)\n"
            "  -z, --blocking 0|1      wait for each collective before posting the next (default 0)\n"
            "  -d, --datatype NAME     int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double"
            " or all (default float)\n"
            "  -o, --op NAME           sum prod min max avg or all (default sum)\n"
            "  -r, --root R            root of broadcast and reduce (default 0)\n"
            "  -G, --gpu               buffers on GPU 0 (cudaMalloc), stream-ordered calls on a stream\n"
            "                          per rank; adds p50 latency, D2D copy bandwidth and HBM/D2D\n"
            "      --socket PATH       the daemon's socket (default $COLLD_SOCKET or the standard one);\n"
            "                          when none answers, " PROG " starts its own colld\n"
            "      --colld PATH        the colld binary to start (default: next to " PROG ", then PATH)\n"
            "      --timeout-ms MS     communicator timeout (default %d)\n"
            "      --attach-bench REPS time connect + join of an NRANKS communicator REPS times\n"
            "      --json              print one JSON object instead of the table\n"
            "      --finite            inputs are small integers (never NaN or infinite), for a\n"
            "                          daemon with --nan-check\n"
            "      --overlap           with -G, after the table: all-reduce at -e beside a busy kernel\n"
            "                          on a second stream of each rank; prints how much they overlap\n"
            "Ranks on several daemons (hosts), one process per rank started by you:\n"
            "      --make-uid          print a new unique id (hex) of the daemon at --socket (one\n"
            "                          started with --listen) and hold it: the daemon forgets it when\n"
            "                          this process disconnects before a rank has joined; ends on\n"
            "                          SIGINT/SIGTERM or after --timeout-ms\n"
            "      --join HEX          be one rank of the communicator with this id (from --make-uid),\n"
            "                          through the daemon at --socket; needs -p and --rank, and the\n"
            "                          same benchmark options in every rank; rank 0 prints the results\n"
            "      --rank R            this process's rank with --join, 0..N-1\n"
            "      --version           print the version and exit\n"
            "  -h, --help              this text\n",
            MAX_RANKS, DEFAULT_TIMEOUT_MS);
}

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* A bad option: say what is wrong, point at --help, exit 2. */
static void die_usage(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, PROG ": ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nRun '" PROG " --help' for the options.\n");
    exit(2);
}

/* A size with an optional K/M/G suffix (powers of 1024). */
static size_t parse_size(const char *opt, const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    switch (*end) {
    case 'K': case 'k': mul = 1024.0; end++; break;
    case 'M': case 'm': mul = 1024.0 * 1024; end++; break;
    case 'G': case 'g': mul = 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (end == s || *end || errno || !(v >= 0) || v * mul > 1e15)
        die_usage("%s: '%s' is not a size (a number of bytes, optionally with K, M or G)", opt, s);
    return (size_t)(v * mul);
}

static int parse_int(const char *opt, const char *s, int lo, int hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        die_usage("%s: '%s' is not an integer in %d..%d", opt, s, lo, hi);
    return (int)v;
}

/* Parse a name against a table (plus an optional alias table, and "all"): a bit mask. */
static unsigned parse_names(const char *opt, const char *s, const char *const *names, const char *const *aliases,
                            int n)
{
    if (!strcmp(s, "all"))
        return (1u << n) - 1;
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i]) || (aliases && !strcmp(s, aliases[i])))
            return 1u << i;
    char list[256] = "";
    size_t off = 0;
    for (int i = 0; i < n && off < sizeof(list) - 20; i++)
        off += (size_t)snprintf(list + off, sizeof(list) - off, "%s ", names[i]);
    die_usage("%s: unknown value '%s' (one of: %sall)", opt, s, list);
}

enum {
    OPT_SOCKET = 256,
    OPT_JSON,
    OPT_COLLD,
    OPT_TIMEOUT,
    OPT_ATTACH,
    OPT_RANK,
    OPT_MAKE_UID,
    OPT_JOIN,
    OPT_JOIN_RANK,
    OPT_VERSION,
    OPT_FINITE,
    OPT_OVERLAP
};

/* A unique id as lowercase hex, 2 digits per byte (the integration tests' format). */
static void uid_to_hex(const colld_unique_id_t *id, char *hex)
{
    for (size_t i = 0; i < sizeof(id->internal); i++)
        sprintf(hex + 2 * i, "%02x", (unsigned char)id->internal[i]);
    hex[2 * sizeof(id->internal)] = '\0';
}

/* The reverse; dies with a usage error when `hex` is not exactly one id. */
static void uid_from_hex(const char *hex, colld_unique_id_t *id)
{
    static const char digits[] = "0123456789abcdef";
    size_t len = strlen(hex);
    if (len != 2 * sizeof(id->internal))
        die_usage("--join: the id has %zu hex digits, not %zu (use the output of --make-uid)", len,
                  2 * sizeof(id->internal));
    for (size_t i = 0; i < sizeof(id->internal); i++) {
        const char *hi = strchr(digits, tolower((unsigned char)hex[2 * i]));
        const char *lo = strchr(digits, tolower((unsigned char)hex[2 * i + 1]));
        if (!hi || !lo || !*hi || !*lo)
            die_usage("--join: '%.2s' at offset %zu is not a hex byte", hex + 2 * i, 2 * i);
        id->internal[i] = (char)((hi - digits) << 4 | (lo - digits));
    }
}

static void parse_options(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){ .min_bytes = 8, .max_bytes = 32u << 20, .factor = 2, .iters = 20, .warmup = 5, .check = 1,
                   .nranks = 2, .timeout_ms = DEFAULT_TIMEOUT_MS, .kinds = 1u << K_ALLREDUCE,
                   .dtypes = 1u << COLLD_FLOAT32, .ops = 1u << COLLD_SUM, .rank = -1 };
    static const struct option longs[] = {
        { "collective", required_argument, NULL, 't' },
        { "nranks", required_argument, NULL, 'p' },
        { "minbytes", required_argument, NULL, 'b' },
        { "maxbytes", required_argument, NULL, 'e' },
        { "stepfactor", required_argument, NULL, 'f' },
        { "iters", required_argument, NULL, 'n' },
        { "warmup_iters", required_argument, NULL, 'w' },
        { "check", required_argument, NULL, 'c' },
        { "blocking", required_argument, NULL, 'z' },
        { "datatype", required_argument, NULL, 'd' },
        { "op", required_argument, NULL, 'o' },
        { "root", required_argument, NULL, 'r' },
        { "socket", required_argument, NULL, OPT_SOCKET },
        { "json", no_argument, NULL, OPT_JSON },
        { "colld", required_argument, NULL, OPT_COLLD },
        { "timeout-ms", required_argument, NULL, OPT_TIMEOUT },
        { "attach-bench", required_argument, NULL, OPT_ATTACH },
        { "make-uid", no_argument, NULL, OPT_MAKE_UID },
        { "join", required_argument, NULL, OPT_JOIN },
        { "rank", required_argument, NULL, OPT_JOIN_RANK },
        { "gpu", no_argument, NULL, 'G' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, OPT_VERSION },
        { "finite", no_argument, NULL, OPT_FINITE },
        { "overlap", no_argument, NULL, OPT_OVERLAP },
        { "internal-rank", required_argument, NULL, OPT_RANK }, /* set by the launcher */
        { NULL, 0, NULL, 0 },
    };
    opterr = 0;
    int c, join_rank = -1;
    while ((c = getopt_long(argc, argv, ":t:p:b:e:f:n:w:c:z:d:o:r:Gh", longs, NULL)) != -1) {
        switch (c) {
        case 't': o->kinds = parse_names("-t", optarg, kind_names, NULL, K_COUNT); break;
        case 'p': o->nranks = parse_int("-p", optarg, 1, MAX_RANKS); break;
        case 'b': o->min_bytes = parse_size("-b", optarg); break;
        case 'e': o->max_bytes = parse_size("-e", optarg); break;
        case 'f': {
            char *end;
            o->factor = strtod(optarg, &end);
            if (end == optarg || *end || !(o->factor > 1.0) || o->factor > 1e6)
                die_usage("-f: '%s' is not a step factor greater than 1", optarg);
            break;
        }
        case 'n': o->iters = parse_int("-n", optarg, 1, 100000000); break;
        case 'w': o->warmup = parse_int("-w", optarg, 0, 100000000); break;
        case 'c': o->check = parse_int("-c", optarg, 0, 1000000) > 0; break;
        case 'z': o->blocking = parse_int("-z", optarg, 0, 1); break;
        case 'd': o->dtypes = parse_names("-d", optarg, dtype_names, dtype_aliases, COLLD_DTYPE_COUNT); break;
        case 'o': o->ops = parse_names("-o", optarg, op_names, NULL, COLLD_REDOP_COUNT); break;
        case 'r': o->root = parse_int("-r", optarg, 0, MAX_RANKS - 1); break;
        case OPT_SOCKET: o->socket = optarg; break;
        case OPT_JSON: o->json = true; break;
        case OPT_COLLD: o->colld = optarg; break;
        case OPT_TIMEOUT: o->timeout_ms = parse_int("--timeout-ms", optarg, 1, 86400000); break;
        case OPT_ATTACH: o->attach_reps = parse_int("--attach-bench", optarg, 1, MAX_ATTACH_REPS); break;
        case OPT_RANK: o->rank = parse_int("--internal-rank", optarg, 0, MAX_RANKS - 1); break;
        case OPT_MAKE_UID: o->make_uid = true; break;
        case OPT_JOIN:
            uid_from_hex(optarg, &o->join_id);
            o->join = true;
            break;
        case OPT_JOIN_RANK: join_rank = parse_int("--rank", optarg, 0, MAX_RANKS - 1); break;
        case 'G': o->gpu = true; break;
        case 'h': usage(stdout); exit(0);
        case OPT_VERSION: printf(PROG " %s\n", COLLD_VERSION_STRING); exit(0);
        case OPT_FINITE:
            o->finite = true;
            break;
        case OPT_OVERLAP:
            o->overlap = true;
            break;
        case ':': die_usage("option '%s' needs a value", argv[optind - 1]);
        default: die_usage("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        die_usage("unexpected argument '%s'", argv[optind]);
    if (o->min_bytes > o->max_bytes)
        die_usage("-b %zu is larger than -e %zu", o->min_bytes, o->max_bytes);
    if (o->root >= o->nranks)
        die_usage("-r %d: the root must be below the number of ranks (-p %d)", o->root, o->nranks);
    if (o->rank >= o->nranks)
        die_usage("--internal-rank %d is not below -p %d", o->rank, o->nranks);
    if (o->make_uid && (o->join || o->attach_reps))
        die_usage("--make-uid goes alone (with --socket and --timeout-ms): it prints an id and holds it");
    if (o->join != (join_rank >= 0))
        die_usage(o->join ? "--join needs --rank R (this process's rank)" : "--rank goes with --join HEX");
    if (o->join && o->attach_reps)
        die_usage("--attach-bench makes its own communicators; it does not take --join");
    if (o->overlap && !o->gpu)
        die_usage("--overlap measures a GPU collective beside a GPU kernel: it needs -G/--gpu");
    if (o->gpu && (o->attach_reps || o->make_uid))
        die_usage("-G/--gpu is for the collective benchmark; --attach-bench and --make-uid use no buffers");
#ifndef COLLD_HAVE_CUDA
    if (o->gpu)
        die_usage("-G/--gpu: this " PROG " was built without CUDA (no CUDA toolkit was found when it was "
                  "configured); rebuild it where the CUDA toolkit is installed");
#endif
    if (o->join) {
        if (join_rank >= o->nranks)
            die_usage("--rank %d is not below -p %d", join_rank, o->nranks);
        o->rank = join_rank;
    }
}

/* =============================================================================================
 * Small utilities
 * ========================================================================================== */

double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Read exactly len bytes from fd, waiting at most timeout_ms in all. Returns 0 or -1. */
static int read_full(int fd, void *buf, size_t len, int timeout_ms)
{
    double end = now_us() + timeout_ms * 1e3;
    size_t got = 0;
    while (got < len) {
        int left = (int)((end - now_us()) / 1e3);
        if (left <= 0)
            return -1;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorts v). */
static double median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* =============================================================================================
 * Data: generator and reference results (ref_t: colld_perf.h)
 * ========================================================================================== */

/* Ranks that --join may sit on several daemons, which reduce per node first: an order other than
 * rank order, so float results would differ from the rank-order oracle in the last bits. Their
 * inputs are small integers, exact in any order (colld_cpu_pattern_small); launched ranks share
 * one daemon, which reduces in rank order, and get the general inputs. */
static int ref_alloc(ref_t *f, int n, bool any_order)
{
    memset(f, 0, sizeof(*f));
    f->pattern = any_order ? colld_cpu_pattern_small : colld_cpu_pattern;
    for (int r = 0; r < n; r++)
        if (!(f->in[r] = malloc(CHECK_CHUNK * 8)))
            return -1;
    return (f->want = malloc(CHECK_CHUNK * 8)) ? 0 : -1;
}

static void ref_free(ref_t *f)
{
    for (int r = 0; r < MAX_RANKS; r++)
        free(f->in[r]);
    free(f->want);
}

/* Count the elements of `got` (this rank's receive elements of the call) that differ bitwise from
 * the reference result for inputs generated with `salt`. Returns the count, or SIZE_MAX when the
 * reference kernel refuses (it should not). */
static size_t count_wrong(const shape_t *s, int n, int rank, unsigned salt, const unsigned char *got, ref_t *f)
{
    size_t es = colld_dtype_size(s->dt), wrong = 0;
    if (s->kind == K_REDUCE && rank != s->root)
        return 0; /* only the root receives */
    for (size_t base = 0; base < s->recv_elems; base += CHECK_CHUNK) {
        size_t m = s->recv_elems - base < CHECK_CHUNK ? s->recv_elems - base : CHECK_CHUNK;
        switch (s->kind) {
        case K_BROADCAST:
            f->pattern(s->dt, s->root, salt, base, m, f->want);
            break;
        case K_ALLGATHER: /* element j of the result is element j % count of rank j / count */
            for (size_t j = 0; j < m;) {
                size_t e = base + j, r = e / s->count, off = e % s->count;
                size_t run = s->count - off < m - j ? s->count - off : m - j;
                f->pattern(s->dt, (int)r, salt, off, run, f->want + j * es);
                j += run;
            }
            break;
        default: { /* the reductions: reduce-scatter receives slice `rank` */
            size_t first = (s->kind == K_REDUCESCATTER ? (size_t)rank * s->count : 0) + base;
            const void *in[MAX_RANKS];
            for (int r = 0; r < n; r++) {
                f->pattern(s->dt, r, salt, first, m, f->in[r]);
                in[r] = f->in[r];
            }
            void *out[1] = { f->want };
            if (colld_cpu_reduce_scalar(s->dt, s->op, in, n, out, 1, m) != COLLD_OK)
                return SIZE_MAX;
            break;
        }
        }
        const unsigned char *g = got + base * es;
        if (memcmp(g, f->want, m * es) == 0)
            continue;
        for (size_t i = 0; i < m; i++)
            wrong += memcmp(g + i * es, f->want + i * es, es) != 0;
    }
    return wrong;
}

/* =============================================================================================
 * One rank: the benchmark (rank_t: colld_perf.h; GPU mode's device buffers, stream and CUDA calls:
 * colld_perf_gpu.c)
 * ========================================================================================== */

/* One measured mode of one row, after the reduction over ranks. */
typedef struct {
    double time_us, algbw, busbw;
    double p50_us; /* GPU mode: median call -> stream complete (worst rank) */
    uint64_t wrong;
} mode_result_t;

typedef struct {
    shape_t s;
    mode_result_t m[2]; /* out of place, in place */
    double d2d_gbs;     /* GPU mode: device-to-device copy bandwidth at this size (read + write) */
} row_t;

/* Report a failed call of this rank and return 1. */
static int fail(rank_t *R, const char *what, colld_status_t st)
{
    fprintf(stderr, PROG ": rank %d: %s: %s: %s\n", R->rank, what, colld_status_name(st),
            R->comm ? colld_comm_last_error(R->comm) : colld_status_string(st));
    return 1;
}

/* Wait for everything this rank issued: colld_comm_synchronize, or in GPU mode the stream. */
static colld_status_t wait_issued(rank_t *R)
{
    return R->o->gpu ? gpu_wait(R) : colld_comm_synchronize(R->comm);
}

/* ---------------------------------------------------------------------------------------------
 * The measurement
 * ------------------------------------------------------------------------------------------- */

/* Post one collective of the given shape; `inplace` picks the buffers as NCCL defines in-place. */
static colld_status_t post(rank_t *R, const shape_t *s, bool inplace)
{
    size_t es = colld_dtype_size(s->dt);
    const unsigned char *send = R->sbuf;
    unsigned char *recv = R->rbuf;
    if (inplace) {
        send = R->rbuf;
        if (s->kind == K_ALLGATHER)
            send = R->rbuf + (size_t)R->rank * s->count * es;
        if (s->kind == K_REDUCESCATTER)
            recv = R->rbuf + (size_t)R->rank * s->count * es;
    }
    const void *sp = dev_ptr(R, send);
    void *rp = dev_ptr(R, recv), *st = R->stream;
    switch (s->kind) {
    case K_ALLREDUCE: return colld_allreduce(sp, rp, s->count, s->dt, s->op, R->comm, st);
    case K_BROADCAST: return colld_broadcast(sp, rp, s->count, s->dt, s->root, R->comm, st);
    case K_REDUCE: return colld_reduce(sp, rp, s->count, s->dt, s->op, s->root, R->comm, st);
    case K_ALLGATHER: return colld_allgather(sp, rp, s->count, s->dt, R->comm, st);
    default: return colld_reducescatter(sp, rp, s->count, s->dt, s->op, R->comm, st);
    }
}

/* Bytes of the receive buffer a call of this shape uses (in place: the larger of the two). */
static size_t recv_span(const shape_t *s, bool inplace)
{
    size_t es = colld_dtype_size(s->dt);
    return (inplace && s->send_elems > s->recv_elems ? s->send_elems : s->recv_elems) * es;
}

/* Fill this rank's input for a call with `salt` (and the receive buffer with the sentinel where
 * the input does not go), as the in-place or out-of-place form needs it; in GPU mode the images
 * are then copied to the device on the stream. */
static colld_status_t fill_inputs(rank_t *R, const shape_t *s, bool inplace, unsigned salt)
{
    size_t es = colld_dtype_size(s->dt);
    size_t span = recv_span(s, inplace);
    if (!inplace) {
        R->ref.pattern(s->dt, R->rank, salt, 0, s->send_elems, R->sbuf);
        memset(R->rbuf, SENTINEL, s->recv_elems * es);
        if (!R->o->gpu)
            return COLLD_OK;
        colld_status_t st = gpu_copy(R, R->sbuf, s->send_elems * es, true);
        return st == COLLD_OK ? gpu_copy(R, R->rbuf, span, true) : st;
    }
    memset(R->rbuf, SENTINEL, span);
    switch (s->kind) {
    case K_ALLGATHER:
        R->ref.pattern(s->dt, R->rank, salt, 0, s->count, R->rbuf + (size_t)R->rank * s->count * es);
        break;
    case K_BROADCAST:
        if (R->rank == s->root)
            R->ref.pattern(s->dt, R->rank, salt, 0, s->count, R->rbuf);
        break;
    default: /* all-reduce, reduce: count elements; reduce-scatter: n x count */
        R->ref.pattern(s->dt, R->rank, salt, 0, s->send_elems, R->rbuf);
        break;
    }
    return R->o->gpu ? gpu_copy(R, R->rbuf, span, true) : COLLD_OK;
}

/* All-reduce `count` elements of the scratch buffer at `off` in place, waited for (in GPU mode
 * through the device scratch buffer, on the stream). */
static colld_status_t small_allreduce(rank_t *R, size_t off, size_t count, colld_dtype_t dt, colld_redop_t op)
{
    size_t len = count * colld_dtype_size(dt);
    colld_status_t st = R->o->gpu ? gpu_copy(R, R->small + off, len, true) : COLLD_OK;
    if (st == COLLD_OK)
        st = colld_allreduce(dev_ptr(R, R->small + off), dev_ptr(R, R->small + off), count, dt, op, R->comm, R->stream);
    if (st == COLLD_OK && R->o->gpu)
        st = gpu_copy(R, R->small + off, len, false);
    return st == COLLD_OK ? wait_issued(R) : st;
}

/* A barrier: a one-element all-reduce, waited for. */
static colld_status_t barrier(rank_t *R)
{
    return small_allreduce(R, 0, 1, COLLD_INT32, COLLD_SUM);
}

/* Time one mode of one row on this rank: warm-up, barrier, ITERS collectives; in GPU mode then
 * ITERS more, each waited for on its own (*p50 their median); then, with -c 1, one more call on
 * fresh inputs, checked. *us is this rank's time per call. */
static int measure(rank_t *R, const shape_t *s, bool inplace, unsigned check_salt, double *us, double *p50,
                   uint64_t *wrong)
{
    const opts_t *o = R->o;
    colld_status_t st;
    if ((st = fill_inputs(R, s, inplace, 0)) != COLLD_OK)
        return fail(R, "filling the inputs", st);
    for (int i = 0; i < o->warmup; i++)
        if ((st = post(R, s, inplace)) != COLLD_OK || (st = wait_issued(R)) != COLLD_OK)
            return fail(R, "warm-up collective", st);
    if ((st = barrier(R)) != COLLD_OK)
        return fail(R, "barrier", st);
    double t0 = now_us();
    for (int i = 0; i < o->iters; i++) {
        if ((st = post(R, s, inplace)) != COLLD_OK)
            return fail(R, "collective", st);
        if (o->blocking && (st = wait_issued(R)) != COLLD_OK)
            return fail(R, "collective", st);
    }
    if (!o->blocking && (st = wait_issued(R)) != COLLD_OK)
        return fail(R, "collective", st);
    *us = (now_us() - t0) / o->iters;
    *p50 = 0;
    if (o->gpu) {
        for (int i = 0; i < o->iters; i++) {
            double t = now_us();
            if ((st = post(R, s, inplace)) != COLLD_OK || (st = wait_issued(R)) != COLLD_OK)
                return fail(R, "collective (latency)", st);
            R->lat[i] = now_us() - t;
        }
        *p50 = median(R->lat, o->iters);
    }
    *wrong = 0;
    if (!o->check)
        return 0;
    unsigned char *got = R->rbuf;
    if (inplace && s->kind == K_REDUCESCATTER)
        got += (size_t)R->rank * s->count * colld_dtype_size(s->dt);
    if ((st = fill_inputs(R, s, inplace, check_salt)) != COLLD_OK || (st = post(R, s, inplace)) != COLLD_OK ||
        (o->gpu && (st = gpu_copy(R, R->rbuf, recv_span(s, inplace), false)) != COLLD_OK) ||
        (st = wait_issued(R)) != COLLD_OK)
        return fail(R, "checked collective", st);
    size_t w = count_wrong(s, R->n, R->rank, check_salt, got, &R->ref);
    if (w == SIZE_MAX) {
        fprintf(stderr, PROG ": rank %d: the reference kernel refused %s %s %s\n", R->rank, kind_names[s->kind],
                dtype_names[s->dt], op_names[s->op]);
        return 1;
    }
    *wrong = w;
    return 0;
}

/* Measure one row in both modes and combine over ranks: the maximum times, the summed wrong
 * counts. In GPU mode first rank 0 measures the D2D copy bandwidth at this size while the others
 * wait in a barrier. Every rank gets the combined row. */
static int run_row(rank_t *R, const shape_t *s, unsigned check_salt, row_t *row)
{
    double t[5] = { 0 }; /* us[2], p50[2], d2d */
    uint64_t wrong[2];
    colld_status_t st;
    if (R->o->gpu) {
        if ((st = barrier(R)) != COLLD_OK)
            return fail(R, "barrier", st);
        if (R->rank == 0 && s->size <= R->bytes)
            t[4] = gpu_d2d_gbs(R, s->size);
        if ((st = barrier(R)) != COLLD_OK)
            return fail(R, "barrier", st);
    }
    for (int ip = 0; ip < 2; ip++)
        if (measure(R, s, ip == 1, check_salt + (unsigned)ip, &t[ip], &t[2 + ip], &wrong[ip]))
            return 1;
    memcpy(R->small + 64, t, sizeof(t));
    memcpy(R->small + 128, wrong, sizeof(wrong));
    st = small_allreduce(R, 64, 5, COLLD_FLOAT64, COLLD_MAX);
    if (st == COLLD_OK && R->o->check)
        st = small_allreduce(R, 128, 2, COLLD_UINT64, COLLD_SUM);
    if (st != COLLD_OK)
        return fail(R, "combining the results of the ranks", st);
    memcpy(t, R->small + 64, sizeof(t));
    memcpy(wrong, R->small + 128, sizeof(wrong));
    row->s = *s;
    row->d2d_gbs = t[4];
    double factor = busbw_factor(s->kind, R->n);
    for (int ip = 0; ip < 2; ip++) {
        mode_result_t *m = &row->m[ip];
        m->time_us = t[ip];
        m->p50_us = t[2 + ip];
        m->algbw = t[ip] > 0 ? (double)s->size / t[ip] / 1e3 : 0;
        m->busbw = m->algbw * factor;
        m->wrong = wrong[ip];
    }
    return 0;
}

/* GPU mode, all-reduce: the HBM traffic (each rank's input read once and output written once,
 * 2 x nranks x S per call) of mode ip in GB/s, 0 when it does not apply. */
static double hbm_gbs(const row_t *row, int n, int ip)
{
    const mode_result_t *m = &row->m[ip];
    return row->s.kind == K_ALLREDUCE && m->time_us > 0 ? 2.0 * n * (double)row->s.size / m->time_us / 1e3 : 0;
}

/* ---------------------------------------------------------------------------------------------
 * Output (rank 0)
 * ------------------------------------------------------------------------------------------- */

/* nccl-tests' time format: 2 decimals below 100 us, 1 below 10 ms, none above. */
static void fmt_time(double us, char *buf, size_t len)
{
    snprintf(buf, len, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
}

/* Rank 0's header; labels[r] says where rank r runs (LABEL_BYTES each). */
static void print_header(const rank_t *R, const int64_t *pids, const char *labels)
{
    const opts_t *o = R->o;
    printf("# colld-perf: nranks %d (processes)  minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d "
           "iters: %d validation: %d blocking: %d\n#\n# Using ranks\n",
           o->nranks, o->min_bytes, o->max_bytes, o->factor, o->warmup, o->iters, o->check, o->blocking);
    char gpu[160] = "";
    if (o->gpu)
        gpu_name(gpu, sizeof(gpu));
    for (int r = 0; r < R->n; r++)
        printf("#  Rank %2d Pid %7" PRId64 " on %s %s\n", r, pids[r], labels + (size_t)r * LABEL_BYTES,
               o->gpu ? "GPU 0 (cudaMalloc, stream-ordered on its own stream)"
                      : "host memory (colld_mem_alloc, zero copy)");
    if (o->gpu)
        printf("# GPU 0: %s\n# time: call -> stream complete (average of back-to-back calls); p50: median of calls "
               "each waited for; d2d: cudaMemcpyAsync D2D, 2 x size / time; hbm/d2d: all-reduce 2 x nranks x size / "
               "time (out of place, in place) over d2d\n", gpu);
}

static void print_table_head(int kind, bool gpu)
{
    /* The first five columns take 52 characters, each mode's four columns 33; GPU mode appends
     * p50 (us) of both modes, d2d (GB/s) and hbm/d2d of both modes. */
    printf("#\n# Collective test: %s\n#\n", kind_names[kind]);
    printf("#%51s%-10s%-23s%-12s%-21s%s\n", "", "", "out-of-place", "", "in-place",
           gpu ? "       p50 (us)         d2d     hbm/d2d" : "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s", "size", "count", "type",
           "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf(gpu ? "  %7s  %7s  %8s  %6s  %6s\n" : "\n", "oop", "ip", "(GB/s)", "oop", "ip");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "",
           "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static void print_row(const row_t *row, bool check, bool gpu, int n)
{
    const shape_t *s = &row->s;
    printf("  %10zu  %12zu  %8s  %6s  %6d", s->size, s->total, dtype_names[s->dt],
           kind_reduces(s->kind) ? op_names[s->op] : "none", kind_rooted(s->kind) ? s->root : -1);
    for (int ip = 0; ip < 2; ip++) {
        char t[32], w[32];
        fmt_time(row->m[ip].time_us, t, sizeof(t));
        if (check)
            snprintf(w, sizeof(w), "%" PRIu64, row->m[ip].wrong);
        else
            snprintf(w, sizeof(w), "N/A");
        printf("  %7s  %6.2f  %6.2f  %6s", t, row->m[ip].algbw, row->m[ip].busbw, w);
    }
    if (gpu) {
        char p[2][32], r[2][16];
        for (int ip = 0; ip < 2; ip++) {
            fmt_time(row->m[ip].p50_us, p[ip], sizeof(p[ip]));
            double h = hbm_gbs(row, n, ip);
            if (h > 0 && row->d2d_gbs > 0)
                snprintf(r[ip], sizeof(r[ip]), "%5.1f%%", 100.0 * h / row->d2d_gbs);
            else
                snprintf(r[ip], sizeof(r[ip]), "N/A");
        }
        printf("  %7s  %7s  %8.1f  %6s  %6s", p[0], p[1], row->d2d_gbs, r[0], r[1]);
    }
    printf("\n");
    fflush(stdout);
}

static void print_json(const rank_t *R, const row_t *rows, size_t nrows, uint64_t oob, double avg_busbw,
                       const int64_t *pids)
{
    const opts_t *o = R->o;
    printf("{\"schema_version\":1,\"colld_perf\":{%s\"nranks\":%d,\"min_bytes\":%zu,\"max_bytes\":%zu,\"step_factor\":%g,\"iters\":%d,"
           "\"warmup_iters\":%d,\"check\":%d,\"blocking\":%d,\"pids\":[",
           o->gpu ? "\"gpu\":true," : "", o->nranks, o->min_bytes, o->max_bytes, o->factor, o->iters, o->warmup,
           o->check, o->blocking);
    for (int r = 0; r < R->n; r++)
        printf("%s%" PRId64, r ? "," : "", pids[r]);
    printf("]},\"rows\":[");
    for (size_t i = 0; i < nrows; i++) {
        const shape_t *s = &rows[i].s;
        printf("%s\n{\"collective\":\"%s\",\"size\":%zu,\"count\":%zu,\"type\":\"%s\",\"redop\":\"%s\",\"root\":%d",
               i ? "," : "", kind_names[s->kind], s->size, s->total, dtype_names[s->dt],
               kind_reduces(s->kind) ? op_names[s->op] : "none", kind_rooted(s->kind) ? s->root : -1);
        for (int ip = 0; ip < 2; ip++) {
            const mode_result_t *m = &rows[i].m[ip];
            printf(",\"%s\":{\"time_us\":%.3f,\"algbw_gbs\":%.6g,\"busbw_gbs\":%.6g,", ip ? "in_place" : "out_of_place",
                   m->time_us, m->algbw, m->busbw);
            if (o->gpu) {
                double h = hbm_gbs(&rows[i], R->n, ip);
                printf("\"p50_us\":%.3f,", m->p50_us);
                if (h > 0)
                    printf("\"hbm_gbs\":%.6g,", h);
                else
                    printf("\"hbm_gbs\":null,");
                if (h > 0 && rows[i].d2d_gbs > 0)
                    printf("\"hbm_over_d2d\":%.6g,", h / rows[i].d2d_gbs);
                else
                    printf("\"hbm_over_d2d\":null,");
            }
            printf("\"wrong\":");
            if (o->check)
                printf("%" PRIu64 "}", m->wrong);
            else
                printf("null}");
        }
        if (o->gpu)
            printf(",\"d2d_gbs\":%.6g", rows[i].d2d_gbs);
        printf("}");
    }
    printf("],\n\"out_of_bounds\":");
    if (o->check)
        printf("%" PRIu64, oob);
    else
        printf("null");
    printf(",\"avg_busbw_gbs\":%.6g}\n", avg_busbw);
}

/* The sizes of the sweep, from -b by -f up to -e (inclusive). */
static size_t next_size(size_t bytes, double factor)
{
    double next = (double)bytes * factor;
    size_t n = (size_t)next;
    return n > bytes ? n : bytes + 1;
}

/* Every selected collective x dtype x op x size. */
static int run_bench(rank_t *R)
{
    const opts_t *o = R->o;
    int rc = 0;
    size_t nrows = 0, cap = 0;
    row_t *rows = NULL;
    double bw_sum = 0;
    long bw_count = 0;
    uint64_t oob = 0;

    /* Every rank's pid and where it runs, for the header: each rank fills its own slot of zeroed
     * arrays and a sum gathers them (the labels as bytes). With --join the ranks may be on other
     * hosts and daemons, so the label names the host and this rank's daemon socket. */
    int64_t pids[MAX_RANKS] = { 0 };
    char host[256] = "?", *label = (char *)R->small + LABELS_OFF + (size_t)R->rank * LABEL_BYTES;
    gethostname(host, sizeof(host) - 1);
    memset(R->small + PIDS_OFF, 0, SMALL_BYTES - PIDS_OFF);
    int64_t me = (int64_t)getpid();
    memcpy(R->small + PIDS_OFF + (size_t)R->rank * 8, &me, 8);
    if (o->join)
        snprintf(label, LABEL_BYTES, "%.16s via %.26s", host, o->socket ? o->socket : "the default socket");
    else
        snprintf(label, LABEL_BYTES, "%.47s", host); /* both fit LABEL_BYTES (48) with the NUL */
    colld_status_t st = small_allreduce(R, PIDS_OFF, (size_t)R->n, COLLD_INT64, COLLD_SUM);
    if (st == COLLD_OK)
        st = small_allreduce(R, LABELS_OFF, (size_t)R->n * LABEL_BYTES, COLLD_UINT8, COLLD_SUM);
    if (st != COLLD_OK)
        return fail(R, "exchanging pids and hosts", st);
    memcpy(pids, R->small + PIDS_OFF, (size_t)R->n * 8);
    if (R->rank == 0 && !o->json)
        print_header(R, pids, (const char *)R->small + LABELS_OFF);

    unsigned salt = 1;
    for (int kind = 0; kind < K_COUNT && !rc; kind++) {
        if (!(o->kinds & (1u << kind)))
            continue;
        if (R->rank == 0 && !o->json)
            print_table_head(kind, o->gpu);
        for (int dt = 0; dt < COLLD_DTYPE_COUNT && !rc; dt++) {
            if (!(o->dtypes & (1u << dt)))
                continue;
            for (int op = 0; op < COLLD_REDOP_COUNT && !rc; op++) {
                if (!(o->ops & (1u << op)))
                    continue;
                if (!kind_reduces(kind) && op != __builtin_ctz(o->ops))
                    continue; /* no op: one pass */
                for (size_t b = o->min_bytes; b <= o->max_bytes && !rc; b = next_size(b, o->factor)) {
                    shape_t s = make_shape(kind, (colld_dtype_t)dt, kind_reduces(kind) ? (colld_redop_t)op : COLLD_SUM,
                                           o->root, b, R->n);
                    row_t row;
                    salt += 2;
                    if ((rc = run_row(R, &s, salt, &row)) != 0)
                        break;
                    for (int ip = 0; ip < 2; ip++) {
                        bw_sum += row.m[ip].busbw;
                        bw_count++;
                        oob += row.m[ip].wrong;
                    }
                    if (R->rank != 0)
                        continue;
                    if (!o->json) {
                        print_row(&row, o->check, o->gpu, R->n);
                        continue;
                    }
                    if (nrows == cap) {
                        cap = cap ? cap * 2 : 64;
                        row_t *t = realloc(rows, cap * sizeof(*rows));
                        if (!t) {
                            fprintf(stderr, PROG ": out of memory\n");
                            rc = 1;
                            break;
                        }
                        rows = t;
                    }
                    rows[nrows++] = row;
                }
            }
        }
    }
    if (!rc && R->rank == 0) {
        double avg = bw_count ? bw_sum / (double)bw_count : 0;
        if (o->json) {
            print_json(R, rows, nrows, oob, avg, pids);
        } else {
            if (o->check)
                printf("# Out of bounds values : %" PRIu64 " %s\n", oob, oob ? "FAILED" : "OK");
            else
                printf("# Out of bounds values : N/A (-c 0)\n");
            printf("# Avg bus bandwidth    : %g \n#\n", avg);
        }
        fflush(stdout);
    }
    free(rows);
    if (!rc && oob) {
        if (R->rank == 0)
            fprintf(stderr, PROG ": %" PRIu64 " wrong element(s)\n", oob);
        rc = 1;
    }
    return rc;
}

/* --overlap (GPU mode): does a collective run beside the application's compute on the same GPU?
 * At -e bytes, all-reduce of the run's first dtype and op, each rank times
 *   alone  ITERS collectives back to back on its stream (Tc);
 *   busy   the busy kernel alone on its second stream (Tk), calibrated to take about Tc, on
 *          max(1, SMs / (2 x ranks)) blocks: every rank's busy kernel together leaves half the
 *          SMs free for the daemon's collective kernels;
 *   both   the busy kernel, then the ITERS collectives, at once (Tb).
 * overlap = (Tk + Tc - Tb) / min(Tk, Tc): 100 % when the collectives ran entirely beside the
 * compute, 0 % when one waited for the other (time slicing between the daemon's CUDA context and
 * the application's, without MPS: docs/operations.md). Rank 0 prints the slowest rank's times. */
static int run_overlap(rank_t *R)
{
    const opts_t *o = R->o;
    shape_t s = make_shape(K_ALLREDUCE, (colld_dtype_t)__builtin_ctz(o->dtypes), (colld_redop_t)__builtin_ctz(o->ops),
                           0, o->max_bytes, R->n);
    int sms = gpu_sm_count(), blocks = sms / (2 * R->n) > 1 ? sms / (2 * R->n) : 1;
    double t0, t[3];
    colld_status_t st = fill_inputs(R, &s, false, 1);
    const char *what = "overlap: inputs";
    if (st == COLLD_OK && (st = post(R, &s, false)) == COLLD_OK) /* warm-up */
        st = wait_issued(R);
    /* alone */
    if (st == COLLD_OK && (st = barrier(R)) == COLLD_OK) {
        what = "overlap: collectives alone";
        t0 = now_us();
        for (int i = 0; i < o->iters && st == COLLD_OK; i++)
            st = post(R, &s, false);
        if (st == COLLD_OK)
            st = wait_issued(R);
        t[0] = now_us() - t0;
    }
    /* the busy kernel: calibrated on 10^7 cycles (a few ms), then alone */
    long long cycles = 10000000;
    if (st == COLLD_OK) {
        what = "overlap: the busy kernel";
        t0 = now_us();
        if ((st = gpu_busy(R, blocks, cycles)) == COLLD_OK)
            st = gpu_busy_wait(R);
        double probe = now_us() - t0;
        if (probe > 0)
            cycles = (long long)((double)cycles * t[0] / probe);
        if (cycles < 1000)
            cycles = 1000;
    }
    if (st == COLLD_OK && (st = barrier(R)) == COLLD_OK) {
        t0 = now_us();
        if ((st = gpu_busy(R, blocks, cycles)) == COLLD_OK)
            st = gpu_busy_wait(R);
        t[1] = now_us() - t0;
    }
    /* both at once */
    if (st == COLLD_OK && (st = barrier(R)) == COLLD_OK) {
        what = "overlap: collectives beside the busy kernel";
        t0 = now_us();
        st = gpu_busy(R, blocks, cycles);
        for (int i = 0; i < o->iters && st == COLLD_OK; i++)
            st = post(R, &s, false);
        if (st == COLLD_OK)
            st = wait_issued(R);
        if (st == COLLD_OK)
            st = gpu_busy_wait(R);
        t[2] = now_us() - t0;
    }
    if (st == COLLD_OK) { /* the slowest rank's times */
        what = "overlap: gathering the times";
        memcpy(R->small + 8, t, sizeof(t));
        st = small_allreduce(R, 8, 3, COLLD_FLOAT64, COLLD_MAX);
        memcpy(t, R->small + 8, sizeof(t));
    }
    if (st != COLLD_OK)
        return fail(R, what, st);
    if (R->rank == 0) {
        double lo = t[0] < t[1] ? t[0] : t[1];
        double ov = lo > 0 ? (t[0] + t[1] - t[2]) / lo : 0;
        printf("# Overlap: %d x allreduce of %zu bytes (%.0f us) beside a busy kernel on %d of %d SMs per rank "
               "(%.0f us): together %.0f us, overlap %.0f %% (100 %%: side by side; 0 %%: one after the other)\n",
               o->iters, o->max_bytes, t[0], blocks, sms, t[1], t[2], ov * 100);
        fflush(stdout);
    }
    return 0;
}

/* A rank process (launched, or --join): connect, join the communicator `id`, allocate,
 * benchmark, clean up. */
static int rank_main(const opts_t *o, colld_unique_id_t id)
{
    rank_t R = { .o = o, .n = o->nranks, .rank = o->rank };
    int rc = 1;
    R.bytes = o->max_bytes > 64 ? o->max_bytes : 64;
    /* GPU mode: the device, its stream and buffers first, as an application sets up CUDA before
     * it joins (the images sbuf, rbuf and small are pinned host memory). */
    if (o->gpu && gpu_setup(&R) < 0) {
        gpu_teardown(&R);
        return 1;
    }
    colld_status_t st = colld_connect(o->socket, &R.c);
    if (st != COLLD_OK) {
        fprintf(stderr, PROG ": rank %d: connect: %s: %s\n", o->rank, colld_status_name(st), colld_status_string(st));
        if (o->gpu)
            gpu_teardown(&R);
        return 1;
    }
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.name = "colld-perf";
    cfg.timeout_ms = o->timeout_ms;
    if ((st = colld_comm_init_rank(R.c, &R.comm, R.n, id, R.rank, &cfg)) != COLLD_OK) {
        R.comm = NULL;
        fail(&R, "joining the communicator", st);
        goto out_client;
    }
    if (!o->gpu && ((st = colld_mem_alloc(R.c, (void **)&R.sbuf, R.bytes, COLLD_MEM_HOST)) != COLLD_OK ||
                    (st = colld_mem_alloc(R.c, (void **)&R.rbuf, R.bytes, COLLD_MEM_HOST)) != COLLD_OK ||
                    (st = colld_mem_alloc(R.c, (void **)&R.small, SMALL_BYTES, COLLD_MEM_HOST)) != COLLD_OK)) {
        fprintf(stderr, PROG ": rank %d: cannot share 2 x %zu bytes with the daemon: %s\n", R.rank, R.bytes,
                colld_status_name(st));
        goto out_comm;
    }
    if (ref_alloc(&R.ref, R.n, o->join || o->finite) < 0) {
        fprintf(stderr, PROG ": rank %d: out of memory\n", R.rank);
        goto out_comm;
    }
    memset(R.small, 0, SMALL_BYTES);
    rc = run_bench(&R);
    if (!rc && o->overlap)
        rc = run_overlap(&R);
out_comm:
    ref_free(&R.ref);
    if (!o->gpu) {
        if (R.sbuf)
            colld_mem_free(R.c, R.sbuf);
        if (R.rbuf)
            colld_mem_free(R.c, R.rbuf);
        if (R.small)
            colld_mem_free(R.c, R.small);
    }
    if ((st = colld_comm_destroy(R.comm)) != COLLD_OK && !rc)
        rc = fail(&R, "destroying the communicator", st);
out_client:
    colld_disconnect(R.c);
    if (o->gpu)
        gpu_teardown(&R);
    return rc;
}

/* =============================================================================================
 * One rank: the attach + join benchmark
 * ========================================================================================== */

/* Rank 0's report of the attach benchmark: samples[rank][rep][0=connect, 1=join] in us. */
static void print_attach(const opts_t *o, const double *samples, int reps)
{
    int n = o->nranks;
    double *v = malloc((size_t)reps * sizeof(*v));
    double worst_p50 = 0, worst_cold = 0, all_p50 = 0;
    double *all = malloc((size_t)n * (size_t)reps * sizeof(*all));
    if (!v || !all) {
        free(v);
        free(all);
        fprintf(stderr, PROG ": out of memory\n");
        return;
    }
    int nall = 0;
    if (o->json)
        printf("{\"schema_version\":1,\"attach_bench\":{\"nranks\":%d,\"reps\":%d,\"ranks\":[", n, reps - 1);
    else
        printf("# colld-perf attach+join: %d ranks (processes), %d warm repetitions after 1 cold one\n"
               "# connect = colld_connect, join = colld_comm_init_rank; times in us, per process\n"
               "# %4s  %12s  %12s  %12s  %12s  %12s  %14s\n",
               n, reps - 1, "rank", "connect p50", "join p50", "total p50", "total min", "total max", "cold (1st)");
    for (int r = 0; r < n; r++) {
        const double *s = samples + (size_t)r * (size_t)reps * 2;
        double p[3], mn = 1e30, mx = 0;
        for (int k = 0; k < 3; k++) {
            for (int i = 1; i < reps; i++)
                v[i - 1] = k == 2 ? s[2 * i] + s[2 * i + 1] : s[2 * i + k];
            if (k == 2)
                for (int i = 0; i < reps - 1; i++) {
                    mn = v[i] < mn ? v[i] : mn;
                    mx = v[i] > mx ? v[i] : mx;
                    all[nall++] = v[i];
                }
            p[k] = median(v, reps - 1);
        }
        double cold = s[0] + s[1];
        worst_p50 = p[2] > worst_p50 ? p[2] : worst_p50;
        worst_cold = cold > worst_cold ? cold : worst_cold;
        if (o->json)
            printf("%s{\"rank\":%d,\"connect_p50_us\":%.1f,\"join_p50_us\":%.1f,\"total_p50_us\":%.1f,"
                   "\"total_min_us\":%.1f,\"total_max_us\":%.1f,\"cold_us\":%.1f}",
                   r ? "," : "", r, p[0], p[1], p[2], mn, mx, cold);
        else
            printf("  %4d  %12.1f  %12.1f  %12.1f  %12.1f  %12.1f  %14.1f\n", r, p[0], p[1], p[2], mn, mx, cold);
    }
    all_p50 = median(all, nall);
    if (o->json)
        printf("],\"p50_us_worst_rank\":%.1f,\"p50_us_all\":%.1f,\"cold_us_worst_rank\":%.1f}}\n", worst_p50,
               all_p50, worst_cold);
    else
        printf("# attach+join p50: %.1f us (worst rank), %.1f us (all samples); cold: %.1f us (worst rank)\n",
               worst_p50, all_p50, worst_cold);
    fflush(stdout);
    free(v);
    free(all);
}

/* A rank of --attach-bench: REPS+1 times connect and join a new communicator (ids from the
 * launcher), a barrier on it so that the next repetition starts together, then destroy and
 * disconnect. The last communicator gathers every rank's samples to rank 0. */
static int attach_main(const opts_t *o)
{
    int reps = o->attach_reps + 1, n = o->nranks, rank = o->rank, rc = 1;
    size_t nsamples = (size_t)n * (size_t)reps * 2;
    colld_unique_id_t *ids = malloc((size_t)reps * sizeof(*ids));
    double *samples = calloc(nsamples, sizeof(*samples));
    if (!ids || !samples) {
        fprintf(stderr, PROG ": rank %d: out of memory\n", rank);
        goto out;
    }
    if (read_full(ID_FD, ids, (size_t)reps * sizeof(*ids), ID_READ_TIMEOUT_MS) < 0) {
        fprintf(stderr, PROG ": rank %d: did not receive the unique ids from the launcher\n", rank);
        goto out;
    }
    close(ID_FD);
    colld_comm_config_t cfg = COLLD_COMM_CONFIG_INIT;
    cfg.name = "colld-perf-attach";
    cfg.timeout_ms = o->timeout_ms;
    for (int k = 0; k < reps; k++) {
        colld_client_t *c;
        colld_comm_t *comm;
        double t0 = now_us();
        colld_status_t st = colld_connect(o->socket, &c);
        if (st != COLLD_OK) {
            fprintf(stderr, PROG ": rank %d: connect: %s\n", rank, colld_status_name(st));
            goto out;
        }
        double t1 = now_us();
        if ((st = colld_comm_init_rank(c, &comm, n, ids[k], rank, &cfg)) != COLLD_OK) {
            fprintf(stderr, PROG ": rank %d: join: %s\n", rank, colld_status_name(st));
            colld_disconnect(c);
            goto out;
        }
        double t2 = now_us();
        double *mine = samples + ((size_t)rank * (size_t)reps + (size_t)k) * 2;
        mine[0] = t1 - t0;
        mine[1] = t2 - t1;
        int32_t one = 1;
        if (k == reps - 1) /* the last one also gathers everything (ordinary memory: staged) */
            st = colld_allreduce(samples, samples, nsamples, COLLD_FLOAT64, COLLD_SUM, comm, NULL);
        else
            st = colld_allreduce(&one, &one, 1, COLLD_INT32, COLLD_SUM, comm, NULL);
        if (st == COLLD_OK)
            st = colld_comm_synchronize(comm);
        if (st != COLLD_OK)
            fprintf(stderr, PROG ": rank %d: barrier: %s: %s\n", rank, colld_status_name(st),
                    colld_comm_last_error(comm));
        colld_comm_destroy(comm);
        colld_disconnect(c);
        if (st != COLLD_OK)
            goto out;
    }
    if (rank == 0)
        print_attach(o, samples, reps);
    rc = 0;
out:
    free(ids);
    free(samples);
    return rc;
}

/* =============================================================================================
 * The launcher: a daemon if needed, the rank processes, their end
 * ========================================================================================== */

typedef struct {
    char dir[256];    /* our temporary directory, "" when we started no daemon */
    char socket[300]; /* the socket the ranks use */
    char log[300];
    pid_t pid;        /* our daemon, 0 when none */
} daemon_t;

/* Spawn argv with every signal at its default and none blocked (the launcher blocks some).
 * id_fd >= 0 becomes the child's ID_FD. Returns the pid or -1. */
static pid_t spawn(const char *path, char *const *argv, int id_fd, bool search_path)
{
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t fa;
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGCHLD);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawn_file_actions_init(&fa);
    if (id_fd >= 0)
        posix_spawn_file_actions_adddup2(&fa, id_fd, ID_FD);
    pid_t pid;
    int rc = search_path ? posix_spawnp(&pid, path, &fa, &attr, argv, environ)
                         : posix_spawn(&pid, path, &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    return pid;
}

/* Wait for one child at most timeout_ms; its wait status, or -1 when it is still running. */
static int wait_child(pid_t pid, int timeout_ms)
{
    double end = now_us() + timeout_ms * 1e3;
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0 && errno != EINTR)
            return -1;
        if (now_us() > end)
            return -1;
        sleep_ms(2);
    }
}

static void print_daemon_log(const daemon_t *d)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return;
    char line[512];
    fprintf(stderr, "---- %s ----\n", d->log);
    while (fgets(line, sizeof(line), f))
        fputs(line, stderr);
    fclose(f);
}

/* The directory of this executable, "" when unknown. */
static void self_dir(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    buf[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash)
        *slash = '\0';
    else
        buf[0] = '\0';
}

/* Start colld on a private socket in a new temporary directory and wait until it answers.
 * Returns 0, or -1 with the reason printed. */
static int daemon_start(const opts_t *o, daemon_t *d)
{
    char here[PATH_MAX - 32], path[PATH_MAX] = "";
    snprintf(d->dir, sizeof(d->dir), "/tmp/colld-perf-XXXXXX");
    if (!mkdtemp(d->dir)) {
        fprintf(stderr, PROG ": cannot create a temporary directory: %s\n", strerror(errno));
        d->dir[0] = '\0';
        return -1;
    }
    snprintf(d->socket, sizeof(d->socket), "%s/colld.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/colld.log", d->dir);
    /* Which colld: --colld, next to us (installed), the build tree's server/, then PATH. */
    bool search = false;
    self_dir(here, sizeof(here));
    if (o->colld) {
        snprintf(path, sizeof(path), "%s", o->colld);
    } else {
        snprintf(path, sizeof(path), "%s/colld", here);
        if (access(path, X_OK) != 0)
            snprintf(path, sizeof(path), "%s/../server/colld", here);
        if (access(path, X_OK) != 0) {
            snprintf(path, sizeof(path), "colld");
            search = true;
        }
    }
    char *argv[] = { path, "--socket", d->socket, "--log-file", d->log, NULL };
    d->pid = spawn(path, argv, -1, search);
    if (d->pid < 0) {
        fprintf(stderr, PROG ": no daemon answers and cannot start %s: %s (give its path with --colld)\n", path,
                strerror(errno));
        d->pid = 0;
        return -1;
    }
    double end = now_us() + DAEMON_START_MS * 1e3;
    while (now_us() < end) {
        colld_client_t *c;
        if (access(d->socket, F_OK) == 0 && colld_connect(d->socket, &c) == COLLD_OK) {
            colld_disconnect(c);
            fprintf(stderr, PROG ": started %s on %s (pid %d)\n", path, d->socket, (int)d->pid);
            return 0;
        }
        int status;
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            fprintf(stderr, PROG ": %s exited during start-up (wait status %d)\n", path, status);
            d->pid = 0;
            print_daemon_log(d);
            return -1;
        }
        sleep_ms(5);
    }
    fprintf(stderr, PROG ": %s did not answer within %d ms\n", path, DAEMON_START_MS);
    print_daemon_log(d);
    return -1;
}

/* Stop our daemon (SIGTERM, then SIGKILL after DAEMON_STOP_MS) and remove its directory.
 * Returns 0 when it exited cleanly or there was none. */
static int daemon_stop(daemon_t *d)
{
    int rc = 0;
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        int status = wait_child(d->pid, DAEMON_STOP_MS);
        if (status < 0) {
            fprintf(stderr, PROG ": colld (pid %d) did not stop within %d ms; killed\n", (int)d->pid, DAEMON_STOP_MS);
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &status, 0);
            rc = -1;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, PROG ": colld (pid %d) ended with wait status %d\n", (int)d->pid, status);
            print_daemon_log(d);
            rc = -1;
        }
        d->pid = 0;
    }
    if (d->dir[0]) {
        /* Our directory holds only what the daemon made there (sockets, lock, log): flat. */
        DIR *dir = opendir(d->dir);
        struct dirent *e;
        while (dir && (e = readdir(dir)) != NULL)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                unlinkat(dirfd(dir), e->d_name, 0);
        if (dir)
            closedir(dir);
        if (rmdir(d->dir) != 0)
            fprintf(stderr, PROG ": cannot remove %s: %s\n", d->dir, strerror(errno));
        d->dir[0] = '\0';
    }
    return rc;
}

/* Spawn the ranks, hand each its id(s), and wait for them. SIGINT/SIGTERM to the launcher stop
 * the ranks; when one rank fails the others get FAIL_GRACE_MS to notice before they are killed.
 * Returns the number of ranks that did not exit 0. */
static int run_ranks(const opts_t *o, int argc, char **argv, const char *socket, const colld_unique_id_t *ids,
                     int nids)
{
    int n = o->nranks, bad = 0, left = 0;
    pid_t pids[MAX_RANKS];
    char rk[MAX_RANKS][16];
    char **args = calloc((size_t)argc + 8, sizeof(*args));
    if (!args) {
        fprintf(stderr, PROG ": out of memory\n");
        return n;
    }
    int na = 0;
    args[na++] = argv[0];
    for (int i = 1; i < argc; i++)
        args[na++] = argv[i];
    if (socket[0]) {
        args[na++] = "--socket";
        args[na++] = (char *)socket;
    }
    args[na++] = "--internal-rank";
    int rank_slot = na++;
    args[na] = NULL;

    for (int r = 0; r < n; r++) {
        pids[r] = -1;
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0) {
            fprintf(stderr, PROG ": pipe: %s\n", strerror(errno));
            bad++;
            continue;
        }
        snprintf(rk[r], sizeof(rk[r]), "%d", r);
        args[rank_slot] = rk[r];
        pids[r] = spawn("/proc/self/exe", args, p[0], false);
        close(p[0]);
        if (pids[r] < 0) {
            fprintf(stderr, PROG ": cannot start rank %d: %s\n", r, strerror(errno));
            close(p[1]);
            bad++;
            continue;
        }
        left++;
        /* The rank reads everything at once, so this cannot block for long; EPIPE if it died. */
        const char *buf = (const char *)ids;
        size_t len = (size_t)nids * sizeof(*ids), off = 0;
        while (off < len) {
            ssize_t w = write(p[1], buf + off, len - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        close(p[1]);
    }
    free(args);

    /* Wait: SIGCHLD, SIGINT and SIGTERM are blocked in the launcher and taken here. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    double kill_at = 0;
    while (left > 0) {
        struct timespec ts = { 0, 200 * 1000000L };
        int sig = sigtimedwait(&set, NULL, &ts);
        if ((sig == SIGINT || sig == SIGTERM) && kill_at == 0) {
            fprintf(stderr, PROG ": interrupted; stopping the ranks\n");
            for (int r = 0; r < n; r++)
                if (pids[r] > 0)
                    kill(pids[r], SIGTERM);
            kill_at = now_us() + 2e6;
        }
        for (int r = 0; r < n; r++) {
            int status;
            if (pids[r] <= 0 || waitpid(pids[r], &status, WNOHANG) != pids[r])
                continue;
            pids[r] = -1;
            left--;
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                continue;
            bad++;
            if (WIFSIGNALED(status))
                fprintf(stderr, PROG ": rank %d was killed by signal %d\n", r, WTERMSIG(status));
            if (kill_at == 0 && left > 0)
                kill_at = now_us() + FAIL_GRACE_MS * 1e3;
        }
        if (kill_at != 0 && left > 0 && now_us() > kill_at) {
            for (int r = 0; r < n; r++)
                if (pids[r] > 0) {
                    fprintf(stderr, PROG ": rank %d did not end after a failure; killed\n", r);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    pids[r] = -1;
                    left--;
                    bad++;
                }
        }
    }
    return bad;
}

/* --make-uid: print a new unique id of the daemon at --socket (never of one we start: it would be
 * gone when the ranks join), then hold it. The daemon forgets the ids a client was issued when
 * that client disconnects (until the first rank has joined with it), so this process stays
 * connected until SIGINT or SIGTERM (exit 0) or --timeout-ms (exit 0 as well: by then the ranks
 * have joined or given up). Returns the exit status. */
static int make_uid_main(const opts_t *o)
{
    colld_client_t *c;
    colld_unique_id_t id;
    char hex[2 * sizeof(id.internal) + 1];
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    colld_status_t st = colld_connect(o->socket, &c);
    if (st != COLLD_OK) {
        fprintf(stderr, PROG ": --make-uid: cannot connect to colld%s%s: %s: %s\n", o->socket ? " at " : "",
                o->socket ? o->socket : "", colld_status_name(st), colld_status_string(st));
        return 1;
    }
    int rc = 1;
    if ((st = colld_get_unique_id(c, &id)) != COLLD_OK) {
        fprintf(stderr, PROG ": --make-uid: %s: %s\n", colld_status_name(st), colld_status_string(st));
        goto out;
    }
    uid_to_hex(&id, hex);
    printf("%s\n", hex);
    if (fflush(stdout) != 0)
        goto out;
    struct timespec ts = { o->timeout_ms / 1000, (long)(o->timeout_ms % 1000) * 1000000L };
    while (sigtimedwait(&set, NULL, &ts) < 0 && errno == EINTR)
        ; /* the remaining time is not tracked across EINTR: it only comes from a debugger */
    rc = 0;
out:
    colld_disconnect(c);
    return rc;
}

int main(int argc, char **argv)
{
    opts_t o;
    parse_options(argc, argv, &o);
    signal(SIGPIPE, SIG_IGN);
    if (o.make_uid)
        return make_uid_main(&o);
    if (o.rank >= 0) {
        char name[32]; /* "colld-perf-r3" in top and perf, not "exe" (the kernel keeps 15 bytes) */
        snprintf(name, sizeof(name), "colld-perf-r%d", o.rank);
        prctl(PR_SET_NAME, name, 0, 0, 0);
        if (o.attach_reps)
            return attach_main(&o);
        if (o.join)
            return rank_main(&o, o.join_id);
        colld_unique_id_t id;
        if (read_full(ID_FD, &id, sizeof(id), ID_READ_TIMEOUT_MS) < 0) {
            fprintf(stderr, PROG ": rank %d: did not receive the unique id from the launcher\n", o.rank);
            return 1;
        }
        close(ID_FD);
        return rank_main(&o, id);
    }

    /* The launcher: with --gpu, say at once when there is no GPU (before a daemon or a rank starts). */
    if (o.gpu && gpu_visible() < 0)
        return 1;
    /* Signals that end the run are taken synchronously in run_ranks. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);

    daemon_t d = { .pid = 0 };
    colld_client_t *c = NULL;
    /* A given socket that does not exist: no need to ask (and have libcolld warn about it). */
    colld_status_t st = o.socket && access(o.socket, F_OK) != 0 ? COLLD_ERR_DAEMON_UNAVAILABLE
                                                                 : colld_connect(o.socket, &c);
    if (st == COLLD_ERR_DAEMON_UNAVAILABLE) {
        if (daemon_start(&o, &d) < 0) {
            daemon_stop(&d);
            return 1;
        }
        st = colld_connect(d.socket, &c);
    } else if (o.socket) {
        snprintf(d.socket, sizeof(d.socket), "%s", o.socket);
    }
    if (st != COLLD_OK) {
        fprintf(stderr, PROG ": cannot connect to colld: %s: %s\n", colld_status_name(st), colld_status_string(st));
        daemon_stop(&d);
        return 1;
    }
    int nids = o.attach_reps ? o.attach_reps + 1 : 1, rc = 1;
    colld_unique_id_t *ids = calloc((size_t)nids, sizeof(*ids));
    if (!ids) {
        fprintf(stderr, PROG ": out of memory\n");
        goto out;
    }
    for (int i = 0; i < nids; i++)
        if ((st = colld_get_unique_id(c, &ids[i])) != COLLD_OK) {
            fprintf(stderr, PROG ": cannot get a unique id: %s: %s\n", colld_status_name(st), colld_status_string(st));
            goto out;
        }
    /* The ranks use our socket: the one given, the default one (then they find it the same way
     * we did), or our own daemon's. */
    int bad = run_ranks(&o, argc, argv, d.socket[0] ? d.socket : "", ids, nids);
    if (bad)
        fprintf(stderr, PROG ": %d rank process(es) ended with an error\n", bad);
    rc = bad ? 1 : 0;
out:
    free(ids);
    colld_disconnect(c);
    if (daemon_stop(&d) < 0 && rc == 0)
        rc = 1;
    return rc;
}
