/*
 * harness.h - helpers for integration tests: start and stop a real colld on a private socket,
 * spawn real client processes (posix_spawn), wait for them with a time limit.
 */
#ifndef COLLD_TESTS_HARNESS_H
#define COLLD_TESTS_HARNESS_H

#include "proto/wire.h"

#include <colld/colld.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct {
    char dir[256];          /* private temporary directory */
    char socket[300];       /* the daemon's session socket */
    char log[300];          /* the daemon's log file */
    pid_t pid;              /* the daemon, 0 when not running */
    colld_client_t *client; /* the driver's own connection */
} harness_t;

/* Start colld with optional extra arguments (NULL-terminated); waits until a client can connect.
 * Returns 0 or -1 (with the log printed). */
int harness_daemon_start(harness_t *h, const char *const *extra);
/* Send `sig` to the daemon and wait for it (at most timeout_ms). Returns its wait status, -1 if
 * it did not end in time (then it is killed). */
int harness_daemon_stop(harness_t *h, int sig, int timeout_ms);
/* Disconnect, stop the daemon if running (SIGTERM), remove the directory. Returns 0 when the
 * daemon (if it was running) exited with status 0 — so a sanitizer report or a leak in the
 * daemon fails the test — else -1. */
int harness_cleanup(harness_t *h);

/* cmocka setup/teardown for a test that wants a fresh daemon on a private socket: *state is
 * the harness_t. The teardown fails the test when the daemon does not exit cleanly. */
int harness_test_setup(void **state);
/* The same with extra daemon arguments (NULL-terminated; must outlive the test). */
int harness_test_setup_args(void **state, const char *const *extra);
int harness_test_teardown(void **state);

/* Spawn a program; returns its pid or -1. */
pid_t harness_spawn(const char *const *argv);
/* Wait for a child at most timeout_ms; returns its exit code (128+signal if killed by one), or
 * -1 on time-out (the child is then killed with SIGKILL and reaped). */
int harness_wait(pid_t pid, int timeout_ms);

/* Spawn `nranks` colld-test-rank processes joining one new communicator; extra arguments
 * (NULL-terminated) go to every rank. Pids in pids[]. Returns 0 or -1. */
int harness_spawn_ranks(harness_t *h, int nranks, const char *const *extra, pid_t *pids);
/* The same with colld-test-coll (COLL_BIN), the collective matrix's and scenes' rank program. */
int harness_spawn_coll(harness_t *h, int nranks, const char *const *extra, pid_t *pids);
/* The two ranks of colld-test-coll's mode crossed (two new communicators whose collectives they
 * call in crossed order, each rank a cycle's half), with --timeout-ms timeout_ms and --expect
 * expect, both timing out before either leaves (--sync-dir); with out, rank r's detail goes to
 * out[r] (<h->dir>/crossed-r). Pids in pids[]. Returns 0 or -1. */
int harness_spawn_crossed(harness_t *h, const char *timeout_ms, const char *expect, char (*out)[400], pid_t pids[2]);
/* Wait for all of them; returns the number that did not exit 0 in time. */
int harness_wait_all(pid_t *pids, int n, int timeout_ms);

/* A rank process of the integration tests (colld-test-coll, colld-test-p2p): connect to the daemon
 * at `socket` and join rank `rank` of the nranks-rank communicator whose unique id is the hex text
 * `uid_hex`, with cfg (NULL: the defaults); `who` names the program in messages. Returns 0; 2 for
 * a malformed id; 1 when the daemon refused (printed). On failure nothing is left to release. */
int harness_rank_join(const char *who, const char *socket, const char *uid_hex, int nranks, int rank,
                      const colld_comm_config_t *cfg, colld_client_t **c, colld_comm_t **comm);
/* Two buffers of *bytes each (rounded up to whole pages, as libcolld lets a buffer use its last
 * page to the end: bounds are then exact) from colld_mem_alloc, or (use_malloc) ordinary 64-byte
 * aligned memory that libcolld stages. Returns 0, or 1 (printed); what was made is released by
 * harness_rank_end either way. */
int harness_rank_buffers(colld_client_t *c, int rank, bool use_malloc, size_t *bytes, unsigned char **a,
                         unsigned char **b);
/* Release the buffers (NULL ones skipped), destroy the communicator and disconnect. */
void harness_rank_end(colld_client_t *c, colld_comm_t *comm, bool use_malloc, unsigned char *a, unsigned char *b);

/* A second communicator that keeps running exact all-reduces while a test injects a fault into
 * another one: the daemon must keep serving it throughout. */
typedef struct {
    pid_t pids[2];
    char stop[320], progress[320];
} harness_bg_t;
/* Start it (2 ranks, named "background"); returns once it has finished a first iteration. */
int harness_bg_start(harness_t *h, harness_bg_t *bg);
/* Iterations it has finished so far. */
long harness_bg_progress(const harness_bg_t *bg);
/* Its progress once it is past `before`, waiting at most timeout_ms (a loaded machine may
 * need a moment); `before` when it made none. */
long harness_bg_wait_progress(const harness_bg_t *bg, long before, int timeout_ms);
/* Stop it; returns 0 when both ranks ran every all-reduce exactly and exited 0. */
int harness_bg_stop(harness_bg_t *bg);

/* Wait (at most timeout_ms) until nothing is left behind in the daemon: the driver's own session
 * is the only one and no communicator remains. Returns 0, or -1 after printing what is left. */
int harness_wait_clean(harness_t *h, int timeout_ms);
/* Wait (at most timeout_ms) until the daemon lists at least n communicators (joining ones
 * included). Returns 0 or -1. */
int harness_wait_comm_count(harness_t *h, size_t n, int timeout_ms);
/* The id of the live communicator named `name`, 0 if there is none. */
uint64_t harness_comm_id(harness_t *h, const char *name);

/* A daemon's multi-node counters and address (its Status). */
typedef struct {
    uint64_t sent, received; /* collective payload bytes to and from peer daemons */
    uint64_t refused;        /* connections refused for failing authentication */
    int peers_up;
    char listen[128];
} harness_net_t;
int harness_net_status(harness_t *h, harness_net_t *out);

/* A new unique id from the daemon, as hex text (HARNESS_UID_HEX_LEN bytes with the NUL). */
#define HARNESS_UID_HEX_LEN (2 * COLLD_WIRE_UNIQUE_ID_BYTES + 1)
int harness_new_uid_hex(harness_t *h, char *hex);
void harness_uid_to_hex(const colld_unique_id_t *id, char *hex);
int harness_uid_from_hex(const char *hex, colld_unique_id_t *id);

/* Read a small text file into buf (at most len-1 bytes; empty if it cannot be read). */
void harness_read_file(const char *path, char *buf, size_t len);
/* Wait until a file exists (at most timeout_ms). Returns 0 or -1. */
int harness_wait_file(const char *path, int timeout_ms);
/* Files as signals between a test and the processes it spawned: create dir/name (empty), whether it
 * exists, wait until it does (at most timeout_ms). */
void harness_touch(const char *dir, const char *name);
bool harness_exists(const char *dir, const char *name);
bool harness_wait_for(const char *dir, const char *name, int timeout_ms);
/* The uid/gid the adversarial tests give the other tenant ("nobody"). */
#define HARNESS_NOBODY 65534
/* Run this test program again in a mode: argv { argv0, mode, h->socket, h->dir }, as uid/gid
 * HARNESS_NOBODY when `nobody` (from an fd opened while still root, so that no path permission
 * stands in the way). Returns the pid, -1 on failure. */
pid_t harness_spawn_self(const harness_t *h, const char *argv0, const char *mode, bool nobody);
/* harness_test_setup_args with the daemon's sockets (--socket-mode 0666 is the caller's) and the
 * test's directory open to another uid (0777), for tests whose other tenant runs as
 * HARNESS_NOBODY. */
int harness_test_setup_shared(void **state, const char *const *extra);
/* A rank of a communicator made inside one test process: its own client (connection) and its
 * communicator; st is its join's status. */
typedef struct {
    colld_client_t *client;
    colld_comm_t *comm;
    colld_status_t st;
    /* for the joining thread */
    colld_unique_id_t id;
    int rank, nranks, timeout_ms;
    const char *name;
} harness_rank_t;
/* Fill p[n]: connect n ranks to socket (rank 0 on `first` instead when it is not NULL: a
 * connection made in another role), take a unique id and join them to one new communicator `name`
 * (timeout_ms), one thread each. 0, or 1 with what failed on stderr after `who`; either way
 * harness_leave_ranks releases what was made. */
int harness_join_ranks(const char *who, const char *socket, harness_rank_t *p, int n, int timeout_ms,
                       const char *name, colld_client_t *first);
/* Destroy each rank's communicator and disconnect its client. */
void harness_leave_ranks(harness_rank_t *p, int n);
/* Run a command and capture its stdout (at most len-1 bytes). Returns its exit code or -1. */
int harness_capture(const char *const *argv, char *out, size_t len, int timeout_ms);
/* The same with stderr into the same buffer. */
int harness_capture_all(const char *const *argv, char *out, size_t len, int timeout_ms);
/* Milliseconds on the monotonic clock. */
double harness_now_ms(void);

/* How big a test's matrices are. `make test` sizes them for CI (every kind of case, the large
 * counts on a subset); `make test-full` sets COLLD_TEST_FULL=1 for the full sizes;
 * `make test-asan` sets COLLD_TEST_SMALL=1 (each kind once at a large count); COLLD_TEST_NO_BIG=1
 * (`make test-tsan`) leaves the large counts out altogether. */
typedef enum { HARNESS_SIZE_NO_BIG, HARNESS_SIZE_SMALL, HARNESS_SIZE_CI, HARNESS_SIZE_FULL } harness_size_t;
harness_size_t harness_test_size(void);

/* The port of a daemon started with --metrics 127.0.0.1:0 (from its log, waiting up to 10 s), -1
 * if none. */
int harness_metrics_port(const harness_t *h);
/* GET /metrics of 127.0.0.1:port (each call a new connection, 10 s at most): the whole answer,
 * status line and headers included (malloc'd: free it), or NULL (what went wrong on stderr) when
 * the connection failed or the answer is not a 200. */
char *harness_scrape(int port);
/* The value of an unlabelled metric in a scraped answer, -1 when absent. */
double harness_metric_in(const char *answer, const char *name);
/* The value of an unlabelled metric in a GET /metrics of 127.0.0.1:port, -1 when absent or the
 * scrape failed. */
double harness_metric(int port, const char *name);

#endif /* COLLD_TESTS_HARNESS_H */
