#!/usr/bin/env bash
# Multi-node all-reduce through colld on one machine: hosts in network namespaces (issue 7).
#
#   bench/netns.sh [--build DIR] [--results DIR] [--rate RATE[,RATE...]] [--hosts K]
#                  [--ranks-per-host N,N,...] [--sizes MIN:MAX] [--iters N] [--warmup N]
#                  [--check 0|1] [--mtu BYTES] [--tcp-seconds S] [--timeline]
#
# Needs root and `ip netns` (iproute2) with `tc`; refuses otherwise (exit 77). It builds colld,
# collctl and colld-perf with CMake (in --build, default build/), then:
#   1. makes K "hosts" (default 3): one network namespace each, with a veth pair to a bridge in a
#      hub namespace (the root namespace is not touched), addresses 10.77.0.1.. /24, MTU --mtu
#      (default 1500), and a tbf rate limit of RATE (tc syntax, default 1gbit) on both ends of each
#      veth pair: on the host's egress and on the bridge's egress towards the host, so each
#      host's link is RATE in each direction. tbf counts whole Ethernet frames (IP and TCP headers
#      included): TCP payload tops out at about 1448/1514 = 95.6 % of RATE at MTU 1500;
#   2. starts one colld per namespace (`ip netns exec`) listening on its address, with one
#      cluster secret (a file of 32 random bytes, mode 600) and its own socket;
#   3. per RATE (a comma-separated list is run in order, on the same daemons):
#      a. a raw TCP ring for --tcp-seconds (default 4; python3, skipped without it): host i sends
#         to host i+1 as fast as it can; the payload rate each link carries is the ceiling of any
#         ring over these links on this machine;
#      b. colld-perf --make-uid on host 0, then the colld-perf ranks in their namespaces
#         (`--join`, ranks placed host by host: --ranks-per-host 2,1,1 puts ranks 0 and 1 on
#         host 0), all-reduce float32 sum, --sizes (default 16M:256M, factor 2), -n --iters
#         (default 5) after -w --warmup (default 1), -z 1, -c --check (default 1: one more call per
#         size, checked element by element; not timed);
#      c. prints the table, and per size: busbw as nccl-tests (factor 2(n-1)/n, n ranks), the
#         link busbw (algbw x 2(k-1)/k, what each host's link carries, k hosts) and both as % of
#         RATE in bytes/s (1gbit = 125e6 B/s); each daemon's net_payload_sent (collctl --json
#         status) against 2(k-1)/k x S summed over every timed, warm-up and checked call; the
#         CPU time of the machine during the run (user, system, softirq, idle: the 2-CPU test
#         machine must not be the limit) and of each daemon; any NODE_LOST or lost peer in the
#         daemons' logs (then it exits 1);
#      d. with --timeline (python3): each host's link during the run, from the bridge side's byte
#         counters read every 5 ms: each busy stretch (a collective's network step, or several
#         back to back), its payload rate, and how long the link was idle before it.
# Results go to --results (default BUILD/netns-results), named netns-<K>h<N>r-* (K hosts, N ranks):
# <RATES>-machine.txt and <RATES>-summary.tsv (RATES: the --rate list joined by '-'), per rate
# <RATE>-perf.txt (colld-perf's output), <RATE>-tcp.txt and <RATE>-traffic.txt, and the daemons'
# logs colld-host<I>.log (which end with the peers lost when the clean-up stops the daemons).
# Everything it made (namespaces, daemons, ranks, temporary files) is removed on exit, also on
# Ctrl-C.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
results=""
rates=1gbit
hosts=""
rph=""
sizes=16M:256M
iters=5
warmup=1
check=1
mtu=1500
tcp_seconds=4
timeline=0

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}
die() { printf 'netns.sh: %s\n' "$*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --rate) rates=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --ranks-per-host) rph=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --check) check=$2; shift 2 ;;
    --mtu) mtu=$2; shift 2 ;;
    --tcp-seconds) tcp_seconds=$2; shift 2 ;;
    --timeline) timeline=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

# ---- options --------------------------------------------------------------------------------
posint() { case "$2" in ''|*[!0-9]*) die "$1 needs a non-negative integer, not '$2'" ;; esac; }
posint --iters "$iters"; posint --warmup "$warmup"; posint --mtu "$mtu"; posint --tcp-seconds "$tcp_seconds"
[ "$iters" -ge 1 ] || die "--iters must be at least 1"
case "$check" in 0|1) ;; *) die "--check is 0 or 1" ;; esac
[ "$mtu" -ge 576 ] && [ "$mtu" -le 65000 ] || die "--mtu must be in 576..65000"
if [ -z "$rph" ]; then
  [ -n "$hosts" ] || hosts=3
  posint --hosts "$hosts"
  rph=$(printf '1%.0s,' $(seq 1 "$hosts")); rph=${rph%,}
fi
IFS=, read -r -a per_host <<<"$rph"
[ -z "$hosts" ] || [ "$hosts" = "${#per_host[@]}" ] ||
  die "--hosts $hosts but --ranks-per-host lists ${#per_host[@]} hosts"
hosts=${#per_host[@]}
[ "$hosts" -ge 2 ] && [ "$hosts" -le 200 ] || die "--hosts must be in 2..200"
nranks=0
for n in "${per_host[@]}"; do posint --ranks-per-host "$n"; nranks=$((nranks + n)); done
pre="netns-${hosts}h${nranks}r" # result file names: netns-3h4r-1gbit-perf.txt
[ "$nranks" -ge 1 ] && [ "$nranks" -le 64 ] || die "--ranks-per-host: 1..64 ranks in all (colld-perf's limit)"
[ "${per_host[0]}" -ge 1 ] || die "--ranks-per-host: host 0 (where the id is made and rank 0 runs) needs a rank"
min_size=${sizes%%:*} max_size=${sizes##*:}
[ -n "$min_size" ] && [ -n "$max_size" ] && [ "$sizes" = "$min_size:$max_size" ] ||
  die "--sizes is MIN:MAX, e.g. 16M:256M"

# A tc rate (Nbit, Nkbit, Nmbit, Ngbit; SI units as tc) in bits per second.
rate_bits() {
  awk -v r="$1" 'BEGIN { if (r !~ /^[0-9]+(\.[0-9]+)?[kmg]?bit$/) exit 1
    m = 1; if (r ~ /kbit$/) m = 1e3; else if (r ~ /mbit$/) m = 1e6; else if (r ~ /gbit$/) m = 1e9
    v = r; sub(/[kmg]?bit$/, "", v); printf "%.0f\n", v * m }'
}
IFS=, read -r -a rate_list <<<"$rates"
for r in "${rate_list[@]}"; do
  rate_bits "$r" >/dev/null || die "--rate '$r' is not a tc rate like 1gbit, 500mbit or 200000kbit"
done
ratetag=${rates//,/-}

# ---- can we? --------------------------------------------------------------------------------
refuse() { printf 'netns.sh: %s\n' "$*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || refuse "needs root (it creates network namespaces, veth pairs and tc qdiscs); run it with sudo"
command -v ip >/dev/null && command -v tc >/dev/null ||
  refuse "needs 'ip' and 'tc' (Debian: apt-get install iproute2)"
ip netns list >/dev/null 2>&1 || refuse "'ip netns' does not work here (no network namespace support?)"
python=""
for p in /usr/bin/python3 python3; do command -v "$p" >/dev/null && { python=$(command -v "$p"); break; }; done
[ "$timeline" = 0 ] || [ -n "$python" ] || die "--timeline needs python3"

build=$(mkdir -p "$build" && cd "$build" && pwd)
results=${results:-$build/netns-results}
mkdir -p "$results"
results=$(cd "$results" && pwd)
log() { printf '%s\n' "$*" >&2; }

# ---- build ----------------------------------------------------------------------------------
log "== building colld, collctl and colld-perf in $build"
if [ ! -f "$build/CMakeCache.txt" ]; then
  generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$root" -B "$build" "${generator[@]}" -DCOLLD_WERROR=ON >"$results/netns-cmake.log" 2>&1 ||
    { cat "$results/netns-cmake.log" >&2; exit 1; }
fi
cmake --build "$build" --target colld collctl colld-perf -j "$(nproc)" >"$results/netns-build.log" 2>&1 ||
  { tail -n 40 "$results/netns-build.log" >&2; exit 1; }
colld="$build/server/colld" collctl="$build/tools/collctl" perf="$build/tools/colld-perf"

# ---- clean-up of everything below, on any exit ------------------------------------------------
tag="cn$$"                      # namespace names: $tag-hub, $tag-h0 ...
run=$(mktemp -d /tmp/colld-netns.XXXXXX)
daemons=() bg=()
cleanup() {
  local p n
  for p in "${bg[@]}" "${daemons[@]}"; do
    kill -TERM "$p" 2>/dev/null || true
  done
  for p in "${bg[@]}" "${daemons[@]}"; do
    wait "$p" 2>/dev/null || true
  done
  for n in $(ip netns list 2>/dev/null | awk -v t="$tag-" 'index($1, t) == 1 { print $1 }'); do
    ip netns del "$n" 2>/dev/null || true # deleting a namespace deletes its veth ends and bridge
  done
  rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the network ----------------------------------------------------------------------------
hub="$tag-hub"
ns() { printf '%s-h%d' "$tag" "$1"; }
addr() { printf '10.77.0.%d' $(($1 + 1)); }
log "== $hosts namespaces ($tag-h0..), bridge in $hub, MTU $mtu"
ip netns add "$hub"
ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 mtu "$mtu" up
ip -n "$hub" link set lo up
for i in $(seq 0 $((hosts - 1))); do
  ip netns add "$(ns "$i")"
  ip link add eth0 netns "$(ns "$i")" mtu "$mtu" type veth peer name "vh$i" netns "$hub" mtu "$mtu"
  ip -n "$hub" link set "vh$i" master br0 up
  ip -n "$(ns "$i")" addr add "$(addr "$i")/24" dev eth0
  ip -n "$(ns "$i")" link set eth0 up
  ip -n "$(ns "$i")" link set lo up
done

# tbf on both ends of each host's veth pair: burst 1 ms at the rate (at least 64 KiB + 2 KB, so
# that a full-size GSO packet passes whole), queue 50 ms. A call can run ahead of the rate by at
# most one burst per link: 0.6 % of the 21 MB each host sends in a 16 MiB all-reduce on 3 hosts.
set_rate() {
  local bits=$1 burst verb=$2 i
  burst=$(awk -v b="$bits" 'BEGIN { x = b / 8 * 0.001; if (x < 65536 + 2048) x = 65536 + 2048; printf "%d", x }')
  for i in $(seq 0 $((hosts - 1))); do
    tc -n "$(ns "$i")" qdisc "$verb" dev eth0 root tbf rate "$bits"bit burst "$burst" latency 50ms
    tc -n "$hub" qdisc "$verb" dev "vh$i" root tbf rate "$bits"bit burst "$burst" latency 50ms
  done
}
set_rate "$(rate_bits "${rate_list[0]}")" add

# ---- the daemons ----------------------------------------------------------------------------
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$run/secret"
chmod 600 "$run/secret"
port=7700
for i in $(seq 0 $((hosts - 1))); do
  : >"$results/$pre-colld-host$i.log" # colld appends to its log file
  # `ip netns exec` execs colld: $! is the daemon's pid
  ip netns exec "$(ns "$i")" "$colld" --socket "$run/h$i.sock" --listen "$(addr "$i"):$port" \
    --node-name "host$i" --cluster-secret-file "$run/secret" --peers "10.77.0.0/24:$port" --log-level info \
    --log-file "$results/$pre-colld-host$i.log" >/dev/null 2>&1 &
  daemons+=($!)
done
for i in $(seq 0 $((hosts - 1))); do
  for _ in $(seq 1 500); do [ -S "$run/h$i.sock" ] && break; sleep 0.01; done
  [ -S "$run/h$i.sock" ] ||
    { log "netns.sh: colld on host$i did not start"; cat "$results/$pre-colld-host$i.log" >&2; exit 1; }
done

# ---- the machine ----------------------------------------------------------------------------
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(uname -n), kernel $(uname -r)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) online CPU(s)"
  echo "memory (free -g):"; free -g
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "build: $(grep -m1 '^CMAKE_BUILD_TYPE' "$build/CMakeCache.txt" | cut -d= -f2)"
  echo "hosts: $hosts, ranks per host: $rph ($nranks ranks), MTU $mtu, rates: $rates"
  # the defaults that matter here, from colld --help ("  --NAME VALUE  (env ..., default D, ...)")
  defaults=$("$colld" --help | awk '
    /^  --(heartbeat-ms|heartbeat-misses|net-conns|net-chunk|net-small-bytes|workers) / {
      match($0, /default [^,)]*/); printf "%s%s %s", n++ ? ", " : "", $1, substr($0, RSTART + 8, RLENGTH - 8) }')
  echo "colld per host: --listen 10.77.0.I:$port --node-name hostI --peers 10.77.0.0/24:$port, otherwise defaults ($defaults)"
  echo "tc (host0 eth0, hub vh0):"
  tc -n "$(ns 0)" qdisc show dev eth0; tc -n "$hub" qdisc show dev vh0
} >"$results/$pre-$ratetag-machine.txt"
cat "$results/$pre-$ratetag-machine.txt" >&2

# ---- helpers --------------------------------------------------------------------------------
# Each daemon's net_payload_sent, one per line.
payload_sent() {
  local i
  for i in $(seq 0 $((hosts - 1))); do
    "$collctl" --socket "$run/h$i.sock" --json status |
      sed -E 's/.*"net_payload_sent":([0-9]+).*/\1/'
  done
}
# utime+stime ticks of each daemon, one per line.
daemon_ticks() {
  local p
  for p in "${daemons[@]}"; do awk '{ print $14 + $15 }' "/proc/$p/stat"; done
}
cpu_line() { awk '/^cpu / { print $2 + $3, $4, $7 + $8, $5 + $6 }' /proc/stat; } # user sys irq+softirq idle+iowait

# The raw TCP ring: host i sends to host i+1 for $tcp_seconds; prints each link's payload rate.
tcp_ring() {
  local i out="$1"
  local recv='import socket,sys,time
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 7800)); s.listen(1)
c,_=s.accept(); n=0; t0=None; b=bytearray(1<<20)
while True:
    k=c.recv_into(b)
    if not k: break
    if t0 is None: t0=time.monotonic()
    else: n+=k
print(n, time.monotonic()-t0)'
  local send='import socket,sys,time
end=time.monotonic()+float(sys.argv[2])
for _ in range(200):
    try: c=socket.create_connection((sys.argv[1], 7800)); break
    except OSError: time.sleep(0.02)
b=bytes(1<<20)
while time.monotonic()<end: c.sendall(b)
c.close()'
  local rpids=() spids=()
  for i in $(seq 0 $((hosts - 1))); do
    ip netns exec "$(ns "$i")" "$python" -c "$recv" "$(addr "$i")" >"$run/tcp$i" & rpids+=($!); bg+=($!)
  done
  sleep 0.3
  for i in $(seq 0 $((hosts - 1))); do
    ip netns exec "$(ns "$i")" "$python" -c "$send" "$(addr $(((i + 1) % hosts)))" "$tcp_seconds" &
    spids+=($!); bg+=($!)
  done
  for p in "${spids[@]}" "${rpids[@]}"; do wait "$p"; done
  bg=()
  for i in $(seq 0 $((hosts - 1))); do
    read -r n t <"$run/tcp$((( i + 1) % hosts))"
    awk -v i="$i" -v j=$(((i + 1) % hosts)) -v n="$n" -v t="$t" 'BEGIN {
      printf "host%d -> host%d: %.1f MB/s TCP payload\n", i, j, n / t / 1e6 }'
  done | tee "$out" >&2
}

# The link timeline: samples each host's link (bytes its bridge port received = what the host
# sent; GSO packets count one header each, so this is the payload + ~0.2 %) every 5 ms until
# $run/stop-timeline exists, then prints the busy stretches of each link.
timeline_py='import os,sys,time
k=int(sys.argv[1]); stop=sys.argv[2]
fs=[open("/sys/class/net/vh%d/statistics/rx_bytes" % i) for i in range(k)]
rows=[]
while not os.path.exists(stop):
    t=time.monotonic(); v=[]
    for f in fs:
        f.seek(0); v.append(int(f.read()))
    rows.append((t, v)); time.sleep(0.005)
t0=rows[0][0]
for i in range(k):
    segs=[]; cur=None; last=None
    for (ta, va), (tb, vb) in zip(rows, rows[1:]):
        d=vb[i]-va[i]
        if d <= 0: continue
        if cur is None or ta-last > 0.010:
            if cur: segs.append(cur)
            cur=[ta, tb, 0]
        cur[1]=tb; cur[2]+=d; last=tb
    if cur: segs.append(cur)
    print("host%d sends:" % i)
    prev=None
    for a, b, n in segs:
        if n < 1e6: continue
        idle="" if prev is None else "  idle before %6.1f ms" % ((a-prev)*1e3)
        print("  at %8.3f s  busy %7.3f s  %8.1f MB  %6.1f MB/s%s" % (a-t0, b-a, n/1e6, n/(b-a)/1e6, idle))
        prev=b'

# ---- the runs -------------------------------------------------------------------------------
summary="$results/$pre-$ratetag-summary.tsv"
printf '%s\t' rate rate_Bps hosts ranks size_B mode time_us algbw_GBs busbw_GBs link_busbw_GBs busbw_pct link_pct \
  >"$summary"
printf 'tcp_ring_pct\n' >>"$summary"
status=0
first=1
for rate in "${rate_list[@]}"; do
  bits=$(rate_bits "$rate")
  Bps=$(awk -v b="$bits" 'BEGIN { printf "%.0f", b / 8 }')
  [ "$first" = 1 ] || set_rate "$bits" change
  first=0
  log ""
  log "== link rate $rate = $Bps bytes/s per direction per host"
  tcp_pct=NA
  if [ -n "$python" ] && [ "$tcp_seconds" -gt 0 ]; then
    log "-- raw TCP ring (each host sends to the next) for $tcp_seconds s"
    tcp_ring "$results/$pre-$rate-tcp.txt"
    tcp_pct=$(awk -v B="$Bps" '{ s += $4; n++ } END { printf "%.1f", s / n * 1e6 / B * 100 }' \
      "$results/$pre-$rate-tcp.txt")
    log "   mean: $tcp_pct % of the link rate"
  fi

  # The longest call: an all-reduce of MAX over the slowest link, x 4 for margin.
  max_bytes=$(awk -v s="$max_size" 'BEGIN { m = 1; if (s ~ /[kK]$/) m = 1024; if (s ~ /[mM]$/) m = 1048576
    if (s ~ /[gG]$/) m = 1073741824; sub(/[kKmMgG]$/, "", s); printf "%.0f", s * m }')
  timeout_ms=$(awk -v s="$max_bytes" -v B="$Bps" -v k="$hosts" 'BEGIN { t = 4 * 2 * (k - 1) / k * s / B * 1000
    if (t < 120000) t = 120000; printf "%d", t }')
  calls=$((2 * (warmup + iters + check))) # per size: both modes
  sent0=$(payload_sent) ticks0=$(daemon_ticks) cpu0=$(cpu_line)
  if [ "$timeline" = 1 ]; then
    rm -f "$run/stop-timeline"
    ip netns exec "$hub" "$python" -c "$timeline_py" "$hosts" "$run/stop-timeline" \
      >"$results/$pre-$rate-timeline.txt" &
    tlpid=$!; bg+=("$tlpid")
  fi

  ip netns exec "$(ns 0)" "$perf" --make-uid --socket "$run/h0.sock" --timeout-ms "$timeout_ms" >"$run/uid" &
  uidpid=$!; bg+=("$uidpid")
  for _ in $(seq 1 500); do [ -s "$run/uid" ] && break; sleep 0.01; done
  [ -s "$run/uid" ] || { log "netns.sh: colld-perf --make-uid gave no id"; exit 1; }
  hex=$(cat "$run/uid")
  log "-- colld-perf: $nranks ranks on $hosts hosts ($rph), all-reduce float32 sum $min_size..$max_size"
  rank=0 rpids=()
  t0=$(date +%s.%N)
  for i in $(seq 0 $((hosts - 1))); do
    for _ in $(seq 1 "${per_host[$i]}"); do
      out=/dev/null; [ "$rank" = 0 ] && out="$results/$pre-$rate-perf.txt"
      ip netns exec "$(ns "$i")" "$perf" --join "$hex" -p "$nranks" --rank "$rank" --socket "$run/h$i.sock" \
        -t allreduce -d float -o sum -b "$min_size" -e "$max_size" -f 2 -n "$iters" -w "$warmup" -z 1 \
        -c "$check" --timeout-ms "$timeout_ms" >"$out" 2>"$run/rank$rank.err" &
      rpids+=($!); bg+=($!)
      rank=$((rank + 1))
    done
  done
  bad=0
  for r in $(seq 0 $((nranks - 1))); do
    if ! wait "${rpids[$r]}"; then bad=$((bad + 1)); log "netns.sh: rank $r failed:"; cat "$run/rank$r.err" >&2; fi
  done
  t1=$(date +%s.%N)
  kill -TERM "$uidpid" 2>/dev/null || true; wait "$uidpid" 2>/dev/null || true
  if [ "$timeline" = 1 ]; then
    touch "$run/stop-timeline"; wait "$tlpid" || true
    log "-- link timeline (busy stretches of each host's sending side)"
    cat "$results/$pre-$rate-timeline.txt" >&2
  fi
  bg=()
  sent1=$(payload_sent) ticks1=$(daemon_ticks) cpu1=$(cpu_line)
  cat "$results/$pre-$rate-perf.txt" >&2
  [ "$bad" = 0 ] || { status=1; log "netns.sh: $bad rank(s) failed at $rate"; continue; }

  # Per size: busbw (n ranks) and link busbw (k hosts) against the rate; the TCP ceiling.
  log "-- against the link rate ($rate = $Bps B/s; link busbw = algbw x 2(k-1)/k, k = $hosts hosts)"
  ratio=$(awk -v n="$nranks" -v k="$hosts" 'BEGIN { printf "%.3f", (n - 1) / n * k / (k - 1) }')
  [ "$nranks" = "$hosts" ] || log "   (busbw uses nccl-tests' 2(n-1)/n for n = $nranks ranks, but each host's" \
    "link carries 2(k-1)/k: busbw = link busbw x $ratio)"
  awk -v rate="$rate" -v B="$Bps" -v k="$hosts" -v n="$nranks" -v tcp="$tcp_pct" '
    !/^#/ && NF == 13 {
      for (m = 0; m < 2; m++) {
        t = $(6 + 4 * m) # algbw and busbw again from the time, with more digits than the table
        alg = t > 0 ? $1 / t / 1e3 : 0; bus = alg * 2 * (n - 1) / n; link = alg * 2 * (k - 1) / k
        printf "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%.4f\t%.4f\t%.4f\t%.1f\t%.1f\t%s\n", rate, B, k, n, $1,
               m ? "in_place" : "out_of_place", t, alg, bus, link, bus * 1e9 / B * 100, link * 1e9 / B * 100, tcp
      } }' "$results/$pre-$rate-perf.txt" | tee -a "$summary" |
    awk -F'\t' 'BEGIN { printf "%12s  %-12s  %10s  %12s  %12s  %7s  %7s  %9s\n", "size (B)", "mode", "time (us)",
                          "busbw (GB/s)", "link (GB/s)", "busbw%", "link%", "link/TCP%" }
                { printf "%12s  %-12s  %10s  %12.4f  %12.4f  %6.1f%%  %6.1f%%  %9s\n", $5, $6, $7, $9, $10, $11, $12,
                         $13 == "NA" ? "NA" : sprintf("%.1f%%", $12 / $13 * 100) }' >&2

  # Traffic: each daemon's payload bytes against 2(k-1)/k x S over all calls.
  want=$(awk -v a="$min_size" -v b="$max_bytes" -v k="$hosts" -v c="$calls" 'BEGIN {
    m = 1; if (a ~ /[kK]$/) m = 1024; if (a ~ /[mM]$/) m = 1048576; if (a ~ /[gG]$/) m = 1073741824
    sub(/[kKmMgG]$/, "", a); s = a * m; t = 0
    while (s <= b) { t += c * 2 * (k - 1) / k * int(s / 4) * 4; s *= 2 }
    printf "%.0f", t }')
  paste <(echo "$sent0") <(echo "$sent1") <(echo "$ticks0") <(echo "$ticks1") |
    awk -v want="$want" -v c="$calls" -v k="$hosts" -v tck="$(getconf CLK_TCK)" -v t0="$t0" -v t1="$t1" '
      { d = $2 - $1
        printf "host%d: sent %.0f payload bytes, expected 2(k-1)/k x S over %d calls per size = %.0f (%.4f x);",
          NR - 1, d, c, want, (want > 0 ? d / want : 0)
        printf " daemon CPU %.1f s in %.1f s\n", ($4 - $3) / tck, t1 - t0 }' |
    tee "$results/$pre-$rate-traffic.txt" >&2
  read -r u0 s0 q0 i0 <<<"$cpu0"; read -r u1 s1 q1 i1 <<<"$cpu1"
  awk -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v q=$((q1 - q0)) -v i=$((i1 - i0)) -v n="$(nproc)" 'BEGIN {
    t = u + s + q + i; if (t == 0) t = 1
    printf "machine CPU during the run (%d CPUs, all processes): user %.1f %%, system %.1f %%,", n, u / t * 100,
      s / t * 100
    printf " irq+softirq %.1f %%, idle %.1f %%\n", q / t * 100, i / t * 100 }' |
    tee -a "$results/$pre-$rate-traffic.txt" >&2
done

# ---- lost peers? ----------------------------------------------------------------------------
# (before the clean-up stops the daemons, which then lose each other on purpose)
warnings=$(grep -H -E ' (WARN|ERROR) ' "$results/$pre"-colld-host*.log || true)
if [ -n "$warnings" ]; then
  log ""
  log "netns.sh: the daemons logged warnings or errors:"
  printf '%s\n' "$warnings" >&2
fi
[ -n "$warnings" ] || log "no daemon logged a warning or an error (no peer lost, no missed heartbeats)"
if grep -q -i -E 'NODE_LOST|lost' <<<"$warnings"; then
  log "netns.sh: a daemon lost a peer during the benchmark (see above and $pre-colld-host*.log)"
  status=1
fi
log ""
log "summary: $summary"
exit "$status"
