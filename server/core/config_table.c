/*
 * config_table.c - every option of the daemon: flag, environment name, default and doc, in one
 * table (colld --help prints it).
 */
#include "server/core/daemon.h"

#include <stddef.h>

#define OPT(field) offsetof(colld_daemon_config_t, field)

const colld_config_entry_t colld_daemon_config_table[] = {
    { "socket", "COLLD_SOCKET", COLLD_CFG_STRING, NULL,
      "session socket path (the gRPC control socket is <socket>.rpc); default /run/colld/colld.sock for root, "
      "$XDG_RUNTIME_DIR/colld.sock otherwise",
      OPT(socket), 0, 0 },
    { "config", "COLLD_CONFIG", COLLD_CFG_STRING, NULL, "configuration file of 'name = value' lines", OPT(config), 0,
      0 },
    { "log-level", "COLLD_LOG_LEVEL", COLLD_CFG_STRING, "warn", "none, error, warn, info, debug or trace",
      OPT(log_level), 0, 0 },
    { "log-subsys", "COLLD_LOG_SUBSYS", COLLD_CFG_STRING, "ALL",
      "subsystems to log: ALL or a list like SESSION,ENGINE,COLL; ^NAME excludes", OPT(log_subsys), 0, 0 },
    { "log-file", "COLLD_LOG_FILE", COLLD_CFG_STRING, NULL, "log file (%h = host, %p = pid); default stderr",
      OPT(log_file), 0, 0 },
    { "workers", "COLLD_WORKERS", COLLD_CFG_INT, "0", "host backend threads; 0 = one per online CPU", OPT(workers), 0,
      256 },
    { "timeout-ms", "COLLD_TIMEOUT_MS", COLLD_CFG_INT, "300000",
      "default timeout of a collective and of forming a communicator (ms)", OPT(timeout_ms), 1, 86400000 },
    { "max-timeout-ms", "COLLD_MAX_TIMEOUT_MS", COLLD_CFG_INT, "3600000",
      "largest timeout a communicator may ask for; larger requests are capped (ms)", OPT(max_timeout_ms), 1, 86400000 },
    { "parallel-min-bytes", "COLLD_PARALLEL_MIN_BYTES", COLLD_CFG_SIZE, "1M",
      "collectives moving fewer bytes than this run on the engine thread alone; larger ones are split "
      "across the workers (waking them costs about 10 us)",
      OPT(parallel_min_bytes), 0, 0 },
    { "ring-entries", "COLLD_RING_ENTRIES", COLLD_CFG_INT, "256",
      "entries of each session's submission and completion ring (a power of two)", OPT(ring_entries), 8, 65536 },
    { "spin-us", "COLLD_SPIN_US", COLLD_CFG_INT, "50", "engine busy-poll time before it sleeps (us)", OPT(spin_us), 0,
      1000000 },
    { "max-sessions", "COLLD_MAX_SESSIONS", COLLD_CFG_INT, "4096",
      "client connections served at once (the last few are kept for root and the daemon's uid)", OPT(max_sessions), 1,
      1000000 },
    { "max-comms-per-session", "COLLD_MAX_COMMS_PER_SESSION", COLLD_CFG_INT, "1024",
      "communicators one client process may belong to", OPT(max_comms_per_session), 1, 1000000 },
    { "max-plans-per-session", "COLLD_MAX_PLANS_PER_SESSION", COLLD_CFG_INT, "64",
      "collectives captured into CUDA graphs that one client process may hold at once (each a persistent plan, "
      "freed when its graph is destroyed); one more capture fails with COLLD_ERR_QUOTA_EXCEEDED",
      OPT(max_plans_per_session), 1, 65536 },
    { "max-registered-bytes", "COLLD_MAX_REGISTERED_BYTES", COLLD_CFG_SIZE, "64G",
      "memory one client process may share with the daemon (K/M/G suffixes)", OPT(max_registered_bytes), 0, 0 },
    { "max-registrations", "COLLD_MAX_REGISTRATIONS", COLLD_CFG_INT, "0",
      "memory registrations the daemon holds for all users together (each is a mapping); 0 = derived from "
      "vm.max_map_count, keeping 4096 + 2 x max-sessions + an eighth of it for the daemon's own mappings (a larger "
      "value is capped there)",
      OPT(max_registrations), 0, 100000000 },
    { "max-daemon-bytes", "COLLD_MAX_DAEMON_BYTES", COLLD_CFG_SIZE, "0",
      "memory the daemon may allocate for all users together (session rings, GPU flag areas, fast areas, "
      "multi-node collective buffers, page tables of registrations; K/M/G suffixes); 0 = 3/4 of its memory limit "
      "(its memory cgroup's, else the host's) less 256 MiB",
      OPT(max_daemon_bytes), 0, 0 },
    { "max-sessions-per-tenant", "COLLD_MAX_SESSIONS_PER_TENANT", COLLD_CFG_INT, "1024",
      "client connections one uid may hold (collctl policy overrides it per uid)", OPT(max_sessions_per_tenant), 1,
      1000000 },
    { "max-comms-per-tenant", "COLLD_MAX_COMMS_PER_TENANT", COLLD_CFG_INT, "4096",
      "communicator memberships (joining or formed) one uid may hold", OPT(max_comms_per_tenant), 1, 10000000 },
    { "max-joining-ranks-per-tenant", "COLLD_MAX_JOINING_RANKS_PER_TENANT", COLLD_CFG_INT, "16384",
      "ranks (nranks summed) of the communicators one uid is forming at once", OPT(max_joining_ranks_per_tenant), 1,
      100000000 },
    { "max-regs-per-tenant", "COLLD_MAX_REGS_PER_TENANT", COLLD_CFG_INT, "16384",
      "memory registrations one uid may hold (each is a mapping in the daemon; the kernel allows about 65000 per "
      "process)",
      OPT(max_regs_per_tenant), 1, 1000000 },
    { "max-registered-bytes-per-tenant", "COLLD_MAX_REGISTERED_BYTES_PER_TENANT", COLLD_CFG_SIZE, "256G",
      "memory one uid may share with the daemon, each registration counted as at least a page (K/M/G suffixes)",
      OPT(max_registered_bytes_per_tenant), 0, 0 },
    { "max-event-followers-per-tenant", "COLLD_MAX_EVENT_FOLLOWERS_PER_TENANT", COLLD_CFG_INT, "16",
      "event streams (collctl events) one uid may hold open", OPT(max_followers_per_tenant), 1, 100000 },
    { "max-rpc-conns-per-tenant", "COLLD_MAX_RPC_CONNS_PER_TENANT", COLLD_CFG_INT, "1152",
      "connections one uid may hold to the control socket (<socket>.rpc); every libcolld session holds one, "
      "collctl one while it runs; root and the daemon's uid are not held to it",
      OPT(max_rpc_conns_per_tenant), 1, 1000000 },
    { "max-daemon-bytes-per-tenant", "COLLD_MAX_DAEMON_BYTES_PER_TENANT", COLLD_CFG_SIZE, "1G",
      "memory the daemon may allocate for one uid: its sessions' rings and GPU flag areas, its communicators' fast "
      "areas and multi-node collective buffers, the page tables of its registrations (K/M/G suffixes); a tenant's "
      "own buffers are its memory, not counted here",
      OPT(max_daemon_bytes_per_tenant), 0, 0 },
    { "max-rpc-conns", "COLLD_MAX_RPC_CONNS", COLLD_CFG_INT, "3072",
      "connections to the control socket from all tenants (the last few are kept for root and the daemon's uid)",
      OPT(max_rpc_conns), 1, 1000000 },
    { "rpc-handshake-ms", "COLLD_RPC_HANDSHAKE_MS", COLLD_CFG_INT, "10000",
      "a connection to the control socket that has not started a call this long after it was accepted is closed "
      "(ms)",
      OPT(rpc_handshake_ms), 10, 3600000 },
    { "self-probe-ms", "COLLD_SELF_PROBE_MS", COLLD_CFG_INT, "10000",
      "how often the daemon makes a call on its own control socket to check that it is served (ms); 0 = never",
      OPT(self_probe_ms), 0, 3600000 },
    { "self-probe-failures", "COLLD_SELF_PROBE_FAILURES", COLLD_CFG_INT, "3",
      "consecutive failed self-probes after which the daemon logs why and exits with status 3, so that its "
      "supervisor restarts it",
      OPT(self_probe_failures), 1, 1000 },
    { "max-fds", "COLLD_MAX_FDS", COLLD_CFG_INT, "0",
      "open-file limit (RLIMIT_NOFILE) to run with; 0 = raise the soft limit to the hard limit", OPT(max_fds), 0,
      100000000 },
    { "trace-entries", "COLLD_TRACE_ENTRIES", COLLD_CFG_INT, "256",
      "collectives each communicator's flight recorder keeps (collctl trace); 0 = none", OPT(trace_entries), 0, 65536 },
    { "event-backlog", "COLLD_EVENT_BACKLOG", COLLD_CFG_INT, "1024", "past events the daemon keeps for collctl events",
      OPT(event_backlog), 1, 1000000 },
    { "tenant-timeout-caps", "COLLD_TENANT_TIMEOUT_CAPS", COLLD_CFG_STRING, NULL,
      "per-tenant caps of communicator timeouts, uid:ms pairs like 1000:60000,1001:5000 (collctl policy changes "
      "them at run time)",
      OPT(tenant_caps_text), 0, 0 },
    { "metrics", "COLLD_METRICS", COLLD_CFG_STRING, NULL,
      "HOST:PORT to serve Prometheus metrics over HTTP (GET /metrics); off by default, loopback suggested "
      "(127.0.0.1:9464)",
      OPT(metrics_addr), 0, 0 },
    { "health", "COLLD_HEALTH", COLLD_CFG_STRING, NULL,
      "HOST:PORT to serve /healthz and /readyz alone over HTTP, on a listener no metrics client can fill (point "
      "liveness and readiness probes here); off by default",
      OPT(health_addr), 0, 0 },
    { "listen", "COLLD_LISTEN", COLLD_CFG_STRING, NULL,
      "HOST:PORT where peer daemons reach this one (multi-node communicators); off by default. HOST must be an "
      "address the peers can connect to; port 0 picks a free one",
      OPT(listen), 0, 0 },
    { "node-name", "COLLD_NODE_NAME", COLLD_CFG_STRING, NULL,
      "this daemon's name in multi-node errors and collctl status; default the host name", OPT(node_name), 0, 0 },
    { "cluster-secret-file", "COLLD_CLUSTER_SECRET_FILE", COLLD_CFG_STRING, NULL,
      "file holding the cluster secret (at least 16 bytes, mode 600) that daemons prove to each other with an "
      "HMAC-SHA256 challenge before any message is accepted; required with --listen",
      OPT(secret_file), 0, 0 },
    { "peers", "COLLD_PEERS", COLLD_CFG_STRING, NULL,
      "peer daemons this one may connect to for its tenants' communicators, besides those that authenticated to it: "
      "a comma-separated list of HOST:PORT, ADDR/PREFIX:PORT (a network) or *:PORT (any host), PORT * for any "
      "port; a unique id naming another root daemon is refused (COLLD_ERR_PERMISSION_DENIED)",
      OPT(peers), 0, 0 },
    { "net-conns", "COLLD_NET_CONNS", COLLD_CFG_INT, "2", "TCP connections this daemon opens to each peer daemon",
      OPT(net_conns), 1, 16 },
    { "net-chunk", "COLLD_NET_CHUNK", COLLD_CFG_SIZE, "512K",
      "bytes per network message of a multi-node collective (4K..1M, a multiple of 64); the root daemon's value "
      "applies to a communicator",
      OPT(net_chunk), 0, 0 },
    { "heartbeat-ms", "COLLD_HEARTBEAT_MS", COLLD_CFG_INT, "500",
      "a heartbeat goes to a peer daemon over a connection idle this long (ms)", OPT(heartbeat_ms), 10, 60000 },
    { "heartbeat-misses", "COLLD_HEARTBEAT_MISSES", COLLD_CFG_INT, "3",
      "a peer daemon silent for this many heartbeat intervals is lost (COLLD_ERR_NODE_LOST)", OPT(heartbeat_misses), 2,
      100 },
    { "peer-handshake-ms", "COLLD_PEER_HANDSHAKE_MS", COLLD_CFG_INT, "2000",
      "a connection to --listen must prove the cluster secret within this (ms); strangers in their handshake are "
      "also bounded per source address and in all, the oldest evicted first",
      OPT(peer_handshake_ms), 100, 60000 },
    { "net-small-bytes", "COLLD_NET_SMALL_BYTES", COLLD_CFG_SIZE, "64K",
      "multi-node all-reduces up to this size use recursive doubling, larger ones the ring", OPT(net_small_bytes), 0,
      0 },
    { "net-algo", "COLLD_NET_ALGO", COLLD_CFG_STRING, "auto",
      "multi-node all-reduce algorithm: auto (by size), ring or rd (recursive doubling, for buffers up to "
      "--net-chunk); collctl policy overrides it per tenant",
      OPT(net_algo_text), 0, 0 },
    { "net-transport", "COLLD_NET_TRANSPORT", COLLD_CFG_STRING, "auto",
      "transport of collective data between daemons: auto (InfiniBand/RoCE verbs when both daemons have an active "
      "RDMA port and say so in their authenticated handshake, else TCP), ib (verbs or the link fails, naming why) "
      "or tcp (docs/ib.md)",
      OPT(net_transport_text), 0, 0 },
    { "ib-device", "COLLD_IB_DEVICE", COLLD_CFG_STRING, NULL,
      "RDMA device for --net-transport auto|ib, e.g. mlx5_0 or rxe0 (default: the first with an active port)",
      OPT(ib_device), 0, 0 },
    { "fast-path-bytes", "COLLD_FAST_PATH_BYTES", COLLD_CFG_SIZE, "16K",
      "collectives of a single-node communicator whose input per rank is at most this are run by the ranks "
      "themselves on shared memory (no hand-off to the engine; the daemon still checks and records them); 0 = off",
      OPT(fast_path_bytes), 0, 0 },
    { "nan-check", "COLLD_NAN_CHECK", COLLD_CFG_BOOL, "false",
      "fail a floating-point reduction (all-reduce, reduce, reduce-scatter) whose input holds NaN or an infinity "
      "on some rank, on every rank, with COLLD_ERR_NUMERIC naming the rank(s) and the first element; such "
      "communicators get no fast area (their small collectives go through the daemon)",
      OPT(nan_check), 0, 0 },
    { "verify-results", "COLLD_VERIFY_RESULTS", COLLD_CFG_BOOL, "false",
      "result verification: after every all-reduce, broadcast and all-gather, checksum (XXH3) each rank's result "
      "and, across nodes, each node's, and fail the collective on every rank with COLLD_ERR_CORRUPTED naming the "
      "rank, its node and the first element whose result differs (colld_comm_config_t.verify_results asks for it "
      "per communicator, collctl policy --verify-results per tenant); such communicators get no fast area",
      OPT(verify_results), 0, 0 },
    { "deadlock-ms", "COLLD_DEADLOCK_MS", COLLD_CFG_INT, "10000",
      "report ranks that wait for each other across communicators (a cycle of collectives called in different "
      "orders) once the cycle has lasted this long (ms; a log line and a deadlock event naming it); 0 = off",
      OPT(deadlock_ms), 0, 86400000 },
    { "deadlock-fail", "COLLD_DEADLOCK_FAIL", COLLD_CFG_BOOL, "false",
      "and fail every communicator of such a cycle with COLLD_ERR_DEADLOCK (a process whose other thread would "
      "still post can be taken for deadlocked: see docs/operations.md)",
      OPT(deadlock_fail), 0, 0 },
    { "wait-event-ms", "COLLD_WAIT_EVENT_MS", COLLD_CFG_INT, "10000",
      "a collective that some ranks have posted and others not for this long is reported once (ms; a "
      "coll_waiting event and a log line naming the ranks that have not posted it, long before the "
      "communicator's timeout); 0 = off",
      OPT(wait_event_ms), 0, 86400000 },
    { "socket-mode", "COLLD_SOCKET_MODE", COLLD_CFG_STRING, "0660", "permission bits of both sockets, in octal",
      OPT(socket_mode_text), 0, 0 },
    { "gpu-early-launch", "COLLD_GPU_EARLY_LAUNCH", COLLD_CFG_BOOL, "false",
      "queue each GPU collective on its GPU as soon as it matches, behind stream waits on the ranks' streams' "
      "ready words, instead of launching it from the daemon's host thread once every rank's stream reached it "
      "(issue 28; only collectives on one GPU, never graph replays). Opt-in: not yet measured on a GPU; without "
      "MPS the daemon's context, with work queued while the ranks' streams are behind, may take time slices "
      "from the application's kernels",
      OPT(gpu_early_launch), 0, 0 },
    { "gpu-health-ms", "COLLD_GPU_HEALTH_MS", COLLD_CFG_INT, "5000",
      "how often GPU health is read from NVML (ECC, row remaps, Xid events, NVLink and PCIe errors, throttling; "
      "docs/operations.md, \"GPU health\") (ms); 0 = off",
      OPT(gpu_health_ms), 0, 3600000 },
    { "drain-timeout-ms", "COLLD_DRAIN_TIMEOUT_MS", COLLD_CFG_INT, "0",
      "on SIGTERM, refuse new communicators and let the running ones finish for up to this long before stopping "
      "(ms; a second SIGTERM or SIGINT stops at once); 0 = stop at once",
      OPT(drain_timeout_ms), 0, 86400000 },
/* Test hooks last: --help and --print-config (the sample configuration) leave them out. */
#ifdef COLLD_TEST_HOOKS
    { "test-corrupt-result", "COLLD_TEST_CORRUPT_RESULT", COLLD_CFG_STRING, NULL,
      "TEST HOOK (test builds only): R:E flips element E of rank R's verified result (all-reduce, broadcast, "
      "all-gather) after the collective, node:E element E of this node's multi-node result, so that "
      "--verify-results has something to find",
      OPT(test_corrupt_text), 0, 0 },
    { "test-ib-fault-file", "COLLD_TEST_IB_FAULT_FILE", COLLD_CFG_STRING, NULL,
      "TEST HOOK (test builds only): when this file appears, it is removed and every IB link's queue pair is moved "
      "to the error state (the Soft-RoCE test's QP error injection, tests/softroce)",
      OPT(test_ib_fault_file), 0, 0 },
#endif
};

const size_t colld_daemon_config_table_len = sizeof(colld_daemon_config_table) / sizeof(colld_daemon_config_table[0]);
#ifdef COLLD_TEST_HOOKS
const size_t colld_daemon_config_table_shown = colld_daemon_config_table_len - 2; /* the hooks above */
#else
const size_t colld_daemon_config_table_shown = colld_daemon_config_table_len;
#endif
