#!/usr/bin/env bash
# Two builds of colld against each other, alternating, on this machine (issue 14: the daemon's
# restructuring may not cost latency or bandwidth).
#
#   bench/ab.sh [--rounds R] [--nranks N] [--coll KIND] [--b-daemon-arg ARG]... BUILD_A BUILD_B
#
# --coll: the collective timed (colld-perf -t: allreduce, the default, broadcast, allgather, ...).
# With --b-daemon-arg (repeatable), B's daemons get that option too: one build against itself with
# an option on and off (e.g. --b-daemon-arg --nan-check build build; issue 18); colld-perf then
# runs with --finite and max instead of sum on both sides (inputs never NaN or infinite, and the
# in-place calls, which colld-perf also times, never sum their way to an infinity).
# BUILD_A and BUILD_B are CMake build directories of the same configuration (server/colld and
# tools/colld-perf built in each; e.g. main's in /tmp/build-main and this branch's in build/).
# Each round runs both builds, in alternating order (A B, then B A, ...), so that drift of a
# noisy machine falls on both; per build and round a fresh daemon, then colld-perf --coll (all-reduce)
# float32 sum, N ranks (default 2), each call waited for (-z 1):
#   small  8 B on the fast path (the default --fast-path-bytes): 2000 timed calls after 200;
#   engine 8 B through the engine (a daemon with --fast-path-bytes 0): 2000 after 200;
#   mid    64 KiB through the engine and host backend: 500 after 50;
#   large  64 MiB through the host backend's worker pool: 10 after 3.
# Prints, per case, the median time per call (µs) of each build over the rounds and B/A (< 1: B is
# faster), and for mid and large the median bus bandwidth and B/A (> 1: B is faster). The fast
# path's 8 B time is bimodal on a 2-CPU machine (sub-µs while both ranks spin on their CPUs, µs
# when a daemon thread takes one): compare medians over many rounds. AB_KEEP=1 keeps the raw
# numbers (the directory is printed).
set -euo pipefail

rounds=15
nranks=2
coll=allreduce
b_args=()

while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --nranks) nranks=$2; shift 2 ;;
    --coll) coll=$2; shift 2 ;;
    --b-daemon-arg) b_args+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "ab.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# = 2 ] || { echo "ab.sh: needs BUILD_A and BUILD_B (see --help)" >&2; exit 2; }
builds=("$1" "$2")
perf_args=(-o sum)
[ ${#b_args[@]} = 0 ] || perf_args=(--finite -o max)
for b in "${builds[@]}"; do
  [ -x "$b/server/colld" ] && [ -x "$b/tools/colld-perf" ] ||
    { echo "ab.sh: $b has no server/colld and tools/colld-perf" >&2; exit 2; }
done

run=$(mktemp -d /tmp/colld-ab.XXXXXX)
daemon=
stop_daemon() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then kill -TERM "$daemon"; wait "$daemon" || true; fi
  daemon=
}
trap 'stop_daemon; [ -n "${AB_KEEP:-}" ] || rm -rf "$run"' EXIT

# start_daemon BUILD [OPTION...]
start_daemon() {
  local b=$1; shift
  rm -f "$run/s.sock"
  "$b/server/colld" --socket "$run/s.sock" --log-file "$run/colld.log" "$@" >/dev/null 2>&1 &
  daemon=$!
  for _ in $(seq 1 500); do [ -S "$run/s.sock" ] && return 0; sleep 0.01; done
  echo "ab.sh: colld of $b did not start" >&2; cat "$run/colld.log" >&2; exit 1
}

# perf BUILD CASE BYTES ITERS WARMUP: appends "CASE time_us busbw_gbs" to $run/<A|B>.txt
perf() {
  local b=$1 tag=$2 case=$3 bytes=$4 n=$5 w=$6 out
  out=$("$b/tools/colld-perf" --socket "$run/s.sock" -p "$nranks" -t "$coll" -d float -z 1 -c 0 "${perf_args[@]}" \
    -b "$bytes" -e "$bytes" -n "$n" -w "$w" --json)
  python3 -c 'import json, sys
r = json.loads(sys.stdin.read())["rows"][0]["out_of_place"]
print(sys.argv[1], r["time_us"], r["busbw_gbs"])' "$case" <<<"$out" >>"$run/$tag.txt"
}

one() {
  local b=$1 tag=$2 extra=()
  [ "$tag" = A ] || extra=("${b_args[@]}")
  start_daemon "$b" "${extra[@]}"
  perf "$b" "$tag" small 8 2000 200
  perf "$b" "$tag" mid 64K 500 50
  perf "$b" "$tag" large 64M 10 3
  stop_daemon
  start_daemon "$b" --fast-path-bytes 0 "${extra[@]}"
  perf "$b" "$tag" engine 8 2000 200
  stop_daemon
}

for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then one "${builds[0]}" A; one "${builds[1]}" B; else one "${builds[1]}" B; one "${builds[0]}" A; fi
  echo "round $r/$rounds done" >&2
done
[ -z "${AB_KEEP:-}" ] || echo "raw numbers: $run/A.txt, $run/B.txt" >&2

python3 - "$run/A.txt" "$run/B.txt" "${builds[0]}" "${builds[1]}" "$rounds" <<'EOF'
import statistics, sys
def load(p):
    d = {}
    for line in open(p):
        c, t, bw = line.split()
        d.setdefault(c, []).append((float(t), float(bw)))
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
print(f"A = {sys.argv[3]}\nB = {sys.argv[4]}\nmedians over {sys.argv[5]} alternating rounds")
print(f"{'case':8} {'A us':>10} {'B us':>10} {'B/A time':>9} {'A GB/s':>8} {'B GB/s':>8} {'B/A busbw':>9}")
for c in ("small", "engine", "mid", "large"):
    ta = statistics.median(t for t, _ in a[c]); tb = statistics.median(t for t, _ in b[c])
    line = f"{c:8} {ta:10.2f} {tb:10.2f} {tb / ta:9.3f}"
    if c in ("mid", "large"):
        wa = statistics.median(w for _, w in a[c]); wb = statistics.median(w for _, w in b[c])
        line += f" {wa:8.3f} {wb:8.3f} {wb / wa:9.3f}"
    print(line)
EOF
