#!/usr/bin/env bash
# The reliability benchmarks of issue 13, against one real daemon (not timed tests: results and
# this command go into docs/reliability.md).
#
#   bench/reliability.sh [--build DIR] [--quick] [--soak SECONDS] [--trials N]
#
# Builds what it needs, starts colld on a private socket, then:
#   1. churn-connect: 10,000 connect / unique id / 4 KiB alloc+free / disconnect cycles;
#   2. churn-comm: 2,000 cycles of a 2-rank communicator formed, one exact all-reduce, destroyed;
#   3. kill -9 trials (default 200): 4 ranks in exact all-reduces, one killed at a random moment;
#      every survivor must fail with COLLD_ERR_PEER_LOST (detection time kill -> error: p50, p99,
#      max; target < 100 ms);
#   4. soak (default 600 s): 12 processes (6 two-rank communicators) running exact all-reduces of
#      8 B .. 1 MiB;
#   5. teardown (on a second daemon with the communicator limits raised and no fast areas): a
#      process with 8,000 one-rank communicators exits; the longest attach (colld_connect) of
#      another process meanwhile is the stall every tenant sees (issue 13 #14: 0.86 s before);
# sampling the daemon's RSS (kB), open descriptors and memory mappings before, after each phase
# and at the end, and its CPU time. "Flat" means the values after each phase are within a small
# margin of the baseline taken after a short warm-up of every phase (allocator caches may keep a
# few hundred kB; a leak grows with the thousands of cycles). --quick runs every
# phase at a tenth of its size. Exits 0 when every phase behaved exactly and ends flat.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
quick=0
soak_s=600
trials=200
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --soak) soak_s=$2; shift 2 ;;
    --trials) trials=$2; shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
connects=10000 comms=2000 teardown=8000
if [ "$quick" = 1 ]; then
  connects=1000 comms=200 trials=$((trials / 10)) soak_s=$((soak_s / 10)) teardown=800
fi

[ -f "$build/build.ninja" ] || cmake -S "$root" -B "$build" -G Ninja >/dev/null
cmake --build "$build" --target colld colld-reliability >/dev/null
tool="$build/tools/colld-reliability"
dir=$(mktemp -d /tmp/colld-reliability-XXXXXX)
sock="$dir/colld.sock"
"$build/server/colld" --socket "$sock" --log-level warn --log-file "$dir/colld.log" &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done

sample() { # label
  local rss fds maps cpu
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$daemon/status")
  fds=$(ls "/proc/$daemon/fd" | wc -l)
  maps=$(wc -l < "/proc/$daemon/maps")
  cpu=$(awk '{print ($14 + $15) * 10}' "/proc/$daemon/stat") # ms with 100 ticks/s
  printf '%-22s rss_kb=%-8s fds=%-5s maps=%-6s cpu_ms=%s\n' "$1" "$rss" "$fds" "$maps" "$cpu"
  echo "$rss $fds $maps" > "$dir/last"
}
flat() { # label: compare with the baseline (RSS within 2 MiB, fds equal, maps within 8: a new
          # malloc arena of a busy thread adds one; a leak of registrations or areas adds thousands)
  read -r rss fds maps < "$dir/last"
  read -r brss bfds bmaps < "$dir/base"
  if [ $((rss - brss)) -gt 2048 ] || [ "$fds" != "$bfds" ] || [ $((maps - bmaps)) -gt 8 ]; then
    echo "NOT FLAT after $1: rss $brss -> $rss kB, fds $bfds -> $fds, maps $bmaps -> $maps"; status=1
  else
    echo "flat after $1"
  fi
}
status=0
echo "colld reliability on $(hostname), $(nproc) CPUs, $(date -u +%F)"
sample start
# A short warm-up of every phase, so the baseline includes what the first use of each path
# allocates once (malloc arenas of the daemon's threads, gRPC's and the pool's buffers).
"$tool" --socket "$sock" churn-connect 20 >/dev/null
"$tool" --socket "$sock" churn-comm 20 >/dev/null
"$tool" --socket "$sock" kill 4 4 >/dev/null
"$tool" --socket "$sock" soak 3 6 >/dev/null
sleep 1
sample baseline
cp "$dir/last" "$dir/base"

"$tool" --socket "$sock" churn-connect "$connects" || status=1
sleep 0.5; sample after-churn-connect; flat churn-connect
"$tool" --socket "$sock" churn-comm "$comms" || status=1
sleep 0.5; sample after-churn-comm; flat churn-comm
"$tool" --socket "$sock" kill "$trials" 4 || status=1
sleep 1; sample after-kill-trials; flat kill-trials
"$tool" --socket "$sock" soak "$soak_s" 6 || status=1
sleep 1; sample after-soak; flat soak
"$build/tools/collctl" --socket "$sock" status | head -3

sock2="$dir/teardown.sock"
"$build/server/colld" --socket "$sock2" --log-level warn --log-file "$dir/teardown.log" --fast-path-bytes 0 \
  --max-comms-per-session 100000 --max-comms-per-tenant 100000 &
daemon2=$!
for _ in $(seq 100); do [ -S "$sock2" ] && break; sleep 0.1; done
"$tool" --socket "$sock2" teardown "$teardown" || status=1
kill $daemon2; wait $daemon2 || true
exit $status
