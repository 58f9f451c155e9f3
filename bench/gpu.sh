#!/usr/bin/env bash
# colld's CUDA backend against issue 6's targets, in one run on a machine with an NVIDIA GPU.
#
#   bench/gpu.sh [--build DIR] [--results DIR] [--ranks "2 4"] [--quick]
#
# Builds what it needs (colld and colld-perf with CMake, in BUILD, default <repo>/build), starts a
# daemon of its own, then runs colld-perf --gpu (every rank's buffers on GPU 0, cudaMalloc; each
# rank posts on its own stream; all ranks share the one GPU as separate processes), all-reduce
# float32 sum, for 2 and 4 ranks:
#   small  8 B .. 64 KiB, 1000 timed iterations after 100 warm-up ones: the p50 of the host-observed
#          latency (call -> stream complete, each call waited for on its own; worst rank), target
#          <= 20 us in both modes (out of place, in place);
#   large  64 MiB .. 1 GiB, 20 timed iterations after 5: the all-reduce's HBM traffic (each rank's
#          input read once and output written once: 2 x nranks x size / time) against the
#          device-to-device copy bandwidth colld-perf measures in the same run at the same size
#          (cudaMemcpyAsync D2D, read + write: 2 x size / time), target >= 80% in both modes;
#   overlap 64 MiB, colld-perf --overlap: the all-reduces alone, a busy kernel alone on a second
#          stream of each rank (half the SMs in all), both at once; how much they overlapped (no
#          target: without MPS the GPU time-slices the daemon's context and the ranks').
#   ahead  64 B, 64 KiB and 64 MiB, colld-perf --host-ahead ("host runs ahead", as in training and
#          graph replay): each all-reduce queued behind a ~200 us kernel on the rank's own stream,
#          timed with CUDA events, minus that kernel alone in the same run (no target: record it).
#          This daemon runs the default hand-off; for --gpu-early-launch's, run bench/gpu-carry.sh's
#          perf phase (both, back to back).
# Every result element of every size is checked against the CPU oracle (-c 1). Prints the tables,
# then each target as MET or MISSED with the worst value (as bench/compare.sh does). Raw outputs
# and targets.txt go to the results directory (default BUILD/bench-gpu-results).
# --quick: a smoke run (few iterations, large sizes up to 256 MiB, unchecked large sweep); the
# numbers mean little.
# Exit status: 0 the runs completed (MET or MISSED is in the output), 1 a run failed, 2 bad
# options, 77 no GPU is visible (or colld-perf was built without CUDA): nothing was measured.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
results=""
ranks="2 4"
quick=0
small_iters=1000 small_warmup=100 large_iters=20 large_warmup=5 large_max=1G large_check=1 ahead_iters=200

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for p in $ranks; do
  case "$p" in ''|*[!0-9]*|0) echo "gpu.sh: --ranks needs positive integers, got '$ranks'" >&2; exit 2 ;; esac
done
if [ "$quick" = 1 ]; then
  small_iters=50 small_warmup=5 large_iters=3 large_warmup=1 large_max=256M large_check=0 ahead_iters=20
fi
build=$(mkdir -p "$build" && cd "$build" && pwd)
results=${results:-$build/bench-gpu-results}
mkdir -p "$results/raw"
results=$(cd "$results" && pwd)
log() { printf '%s\n' "$*" >&2; }

# ---- build ----------------------------------------------------------------------------------
log "== building colld and colld-perf in $build"
if [ ! -f "$build/CMakeCache.txt" ]; then
  generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$root" -B "$build" "${generator[@]}" -DCOLLD_WERROR=ON >"$results/raw/cmake.log" 2>&1 ||
    { cat "$results/raw/cmake.log" >&2; exit 1; }
fi
cmake --build "$build" --target colld colld-perf -j "$(nproc)" >"$results/raw/build.log" 2>&1 ||
  { tail -n 40 "$results/raw/build.log" >&2; exit 1; }
colld="$build/server/colld" perf="$build/tools/colld-perf"

# ---- is there a GPU? ------------------------------------------------------------------------
# colld-perf says so itself before it starts anything: "built without CUDA" (exit 2) or "no CUDA
# GPU is visible" (exit 1). With a GPU this is a one-rank smoke run on a daemon of its own.
run=$(mktemp -d /tmp/colld-bench-gpu.XXXXXX)
sock="$run/colld.sock"
daemon=
cleanup() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then kill -TERM "$daemon"; wait "$daemon" || true; fi
  rm -rf "$run"
}
trap cleanup EXIT
if ! "$perf" --gpu --socket "$run/probe.sock" -p 1 -b 8 -e 8 -n 1 -w 0 -c 1 >"$results/raw/probe.txt" 2>&1; then
  if grep -q -e "no CUDA GPU is visible" -e "built without CUDA" "$results/raw/probe.txt"; then
    log "gpu.sh: nothing measured: $(grep -m1 -e "no CUDA GPU" -e "without CUDA" "$results/raw/probe.txt")"
    log "gpu.sh: run it on a machine with an NVIDIA GPU and driver, in a build with the CUDA toolkit"
    exit 77
  fi
  log "gpu.sh: the one-rank GPU smoke run failed:"; cat "$results/raw/probe.txt" >&2; exit 1
fi

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(uname -n), kernel $(uname -r), $(nproc) online CPU(s)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || true
  fi
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "build: $(grep -m1 '^CMAKE_BUILD_TYPE' "$build/CMakeCache.txt" | cut -d= -f2)"
} >"$results/machine.txt"
cat "$results/machine.txt" >&2

# ---- a daemon of our own --------------------------------------------------------------------
"$colld" --socket "$sock" --log-file "$results/raw/colld.log" >/dev/null 2>&1 &
daemon=$!
for _ in $(seq 1 1000); do [ -S "$sock" ] && break; sleep 0.01; done
[ -S "$sock" ] || { log "gpu.sh: colld did not start"; cat "$results/raw/colld.log" >&2; exit 1; }

# ---- the sweeps -----------------------------------------------------------------------------
for p in $ranks; do
  log "== $p ranks on GPU 0, small sizes 8 B .. 64 KiB ($small_iters iterations)"
  "$perf" --socket "$sock" --gpu -p "$p" -t allreduce -d float -o sum -b 8 -e 64K -f 2 \
    -n "$small_iters" -w "$small_warmup" -c 1 | tee "$results/raw/gpu_p${p}_small.txt" >&2
  log "== $p ranks on GPU 0, large sizes 64 MiB .. $large_max ($large_iters iterations)"
  "$perf" --socket "$sock" --gpu -p "$p" -t allreduce -d float -o sum -b 64M -e "$large_max" -f 2 \
    -n "$large_iters" -w "$large_warmup" -c "$large_check" | tee "$results/raw/gpu_p${p}_large.txt" >&2
  log "== $p ranks on GPU 0, overlap: 64 MiB all-reduces beside a busy kernel (--overlap)"
  "$perf" --socket "$sock" --gpu -p "$p" -t allreduce -d float -o sum -b 64M -e 64M \
    -n "$large_iters" -w 1 -c 0 --overlap | tee "$results/raw/gpu_p${p}_overlap.txt" >&2
  log "== $p ranks on GPU 0, host runs ahead: all-reduce behind a ~200 us kernel on each stream (--host-ahead)"
  "$perf" --socket "$sock" --gpu -p "$p" -t allreduce -d float -o sum -b 64 -e 64M -f 1024 \
    -n "$ahead_iters" -w 5 -c 0 --host-ahead | tee "$results/raw/gpu_p${p}_ahead.txt" >&2
done
kill -TERM "$daemon"; wait "$daemon" || true; daemon=

# ---- the targets ----------------------------------------------------------------------------
# colld-perf --gpu rows: 1 size, 2 count, 3 type, 4 redop, 5 root, 6-9 out of place (time, algbw,
# busbw, #wrong), 10-13 in place, 14 p50 oop, 15 p50 ip, 16 d2d GB/s, 17 hbm/d2d oop, 18 ip.
summary() { # tag: small | large
  for p in $ranks; do
    awk -v p="$p" '!/^#/ && NF == 18 { print p, $0 }' "$results/raw/gpu_p${p}_$1.txt"
  done
}
echo
echo "colld CUDA backend, all-reduce float32 sum, ranks as processes on GPU 0 ($(date -u '+%Y-%m-%d'))"
printf "%6s %10s | %10s %10s | %10s %10s | %10s %8s %8s\n" ranks size "time oop" "time ip" "p50 oop" "p50 ip" \
  "d2d GB/s" "hbm oop" "hbm ip"
{ summary small; summary large; } |
  awk '{ printf "%6s %10s | %10s %10s | %10s %10s | %10s %8s %8s\n", $1, $2, $7, $11, $15, $16, $17, $18, $19 }'

small_worst=$(summary small | awk '{ for (c = 15; c <= 16; c++) if (w == "" || $c + 0 > w + 0) { w = $c; at = $1 " ranks " $2 " B" } }
  END { print (w == "" ? "NA" : w " " at) }')
large_worst=$(summary large | awk '{ for (c = 18; c <= 19; c++) { v = $c; sub("%", "", v)
    if (v == "N/A") { na = 1; continue } if (w == "" || v + 0 < w + 0) { w = v; at = $1 " ranks " $2 " B" } } }
  END { print (w == "" || na ? "NA" : w " " at) }')
wrong=$({ summary small; summary large; } | awk '$10 != "N/A" { w += $10 } $14 != "N/A" { w += $14 } END { print w + 0 }')
checked=$({ summary small; summary large; } | awk '$10 == "N/A" { u++ } END { print u + 0 }')
verdict() { # name, "value where", op, limit, unit
  local v=${2%% *} where=${2#* } ok
  if [ "$v" = NA ]; then printf "  %-12s %s\n" "NOT MEASURED" "$1"; return; fi
  ok=$(awk -v v="$v" -v l="$4" -v op="$3" 'BEGIN { r = op == ">=" ? (v + 0 >= l + 0) : (v + 0 <= l + 0); print (r ? "MET" : "MISSED") }')
  printf "  %-7s %s: worst %s %s at %s (target %s %s)\n" "$ok" "$1" "$v" "$5" "$where" "$3" "$4"
}
{
  echo
  echo "targets (issue 6), worst case over $(echo $ranks | sed 's/ /, /g') ranks, out of place and in place:"
  verdict "8 B - 64 KiB all-reduce p50 latency, call -> stream complete" "$small_worst" "<=" 20 "us"
  verdict ">= 64 MiB all-reduce HBM traffic / D2D copy bandwidth" "$large_worst" ">=" 80 "%"
  ok=$([ "$wrong" = 0 ] && echo MET || echo MISSED)
  printf "  %-7s results exact: %s wrong elements (%s rows unchecked)\n" "$ok" "$wrong" "$checked"
  echo "overlap with the application's compute (no target: record it; without MPS expect little, docs/operations.md):"
  for p in $ranks; do
    printf "  %s ranks: %s\n" "$p" "$(grep -m1 '^# Overlap:' "$results/raw/gpu_p${p}_overlap.txt" | sed 's/^# Overlap: //' || echo 'not measured')"
  done
  echo "host runs ahead (--host-ahead; no target: record it): all-reduce behind a ~200 us kernel, us:"
  for p in $ranks; do
    echo "  $p ranks:"
    grep -A4 '^# Host runs ahead' "$results/raw/gpu_p${p}_ahead.txt" | tail -n +2 | sed 's/^/    /' || echo '    not measured'
  done
} | tee "$results/targets.txt"
echo "results: $results (targets.txt, machine.txt, raw/)"
