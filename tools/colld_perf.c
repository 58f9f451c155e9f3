/*
 * colld_perf.c - colld-perf: the collective benchmark, with nccl-tests' columns and conventions.
 *
 *   colld-perf [-t allreduce|broadcast|reduce|allgather|reducescatter|all] [-p NRANKS]
 *              [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1] [-z 0|1]
 *              [-d DTYPE|all] [-o OP|all] [-r ROOT] [-G [--overlap] [--host-ahead]] [--socket PATH] [--json]
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
 * How a run is measured and checked (and GPU mode's columns) is told at the top of
 * colld_perf_bench.c and colld_perf_check.c, --attach-bench at the top of colld_perf_attach.c;
 * colld_perf.h lists the files.
 *
 * Exit status: 0 success (and no wrong element), 1 a failure or a wrong result, 2 bad options.
 */
#include "colld_perf.h"

#include <colld/colld.h>

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_MS 120000 /* communicator timeout: no collective waits longer */
#define MAX_ATTACH_REPS 1000

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
            "      --nan-check         the communicator asks for --nan-check's checks of its\n"
            "                          reductions (colld_comm_config_t.nan_check; implies --finite):\n"
            "                          run with and without it to measure what the checks cost\n"
            "      --overlap           with -G, after the table: all-reduce at -e beside a busy kernel\n"
            "                          on a second stream of each rank; prints how much they overlap\n"
            "      --host-ahead        with -G, after the table: \"host runs ahead\" (as in training and\n"
            "                          graph replay): for each size, all-reduce queued behind a ~200 us\n"
            "                          kernel on each rank's own stream, so the host call returns long\n"
            "                          before the stream reaches it; timed with CUDA events from before\n"
            "                          the kernel to after the collective, minus the kernel alone (same\n"
            "                          run). --overlap and --host-ahead time the daemon's hand-off as it\n"
            "                          runs: for both paths run them against two daemons, one started\n"
            "                          with --gpu-early-launch (docs/performance.md)\n"
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
    OPT_OVERLAP,
    OPT_HOST_AHEAD,
    OPT_NAN_CHECK
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
        { "host-ahead", no_argument, NULL, OPT_HOST_AHEAD },
        { "nan-check", no_argument, NULL, OPT_NAN_CHECK },
        { "internal-rank", required_argument, NULL, OPT_RANK }, /* set by the launcher */
        { NULL, 0, NULL, 0 },
    };
    opterr = 0;
    int c, join_rank = -1;
    while ((c = getopt_long(argc, argv, ":t:p:b:e:f:n:w:c:z:d:o:r:Gh", longs, NULL)) != -1) {
        switch (c) {
        case 't': o->kinds = parse_names("-t", optarg, perf_kind_names, NULL, K_COUNT); break;
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
        case 'd': o->dtypes = parse_names("-d", optarg, perf_dtype_names, perf_dtype_aliases, COLLD_DTYPE_COUNT); break;
        case 'o': o->ops = parse_names("-o", optarg, perf_op_names, NULL, COLLD_REDOP_COUNT); break;
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
        case OPT_HOST_AHEAD:
            o->host_ahead = true;
            break;
        case OPT_NAN_CHECK:
            o->nan_check = true;
            o->finite = true; /* inputs the checks pass */
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
    if (o->host_ahead && !o->gpu)
        die_usage("--host-ahead times GPU collectives queued behind a GPU kernel on the rank's stream: it needs "
                  "-G/--gpu");
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
 * --make-uid and main
 * ========================================================================================== */

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
            return perf_attach_main(&o);
        if (o.join)
            return perf_rank_main(&o, o.join_id);
        colld_unique_id_t id;
        if (perf_read_full(ID_FD, &id, sizeof(id), ID_READ_TIMEOUT_MS) < 0) {
            fprintf(stderr, PROG ": rank %d: did not receive the unique id from the launcher\n", o.rank);
            return 1;
        }
        close(ID_FD);
        return perf_rank_main(&o, id);
    }
    return perf_launch(&o, argc, argv);
}
