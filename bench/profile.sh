#!/usr/bin/env bash
# Where the time of an all-reduce goes: perf profiles of colld with colld-perf (issue 5).
#
#   bench/profile.sh [--build DIR] [--out DIR] [--seconds S]
#
# Needs perf (Debian: linux-perf) and root or kernel.perf_event_paranoid <= 0 for -a. Starts its own
# daemon, then for each case runs colld-perf (all-reduce float32 sum, -z 1, -c 0) in the background,
# waits until it is in its timed loop and samples the whole machine for S seconds (default 1.5)
# with `perf record -a -g -F 999` (cpu-clock: works in VMs without hardware counters):
#   small2  2 ranks, 8 B        small4  4 ranks, 8 B
#   large2  2 ranks, 64 MiB     large4  4 ranks, 64 MiB
# and prints the share of samples per process and the top functions (colld's and libcolld's
# addresses are resolved with addr2line, as this perf cannot always read their symbols). Then it
# counts system calls and context switches per collective over 100,000 8-byte all-reduces
# (perf stat -a, so the daemon, the ranks and the kernel all count). perf.data files and the
# reports stay in the output directory (default BUILD/bench-profile).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
out=""
seconds=1.5
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "profile.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v perf >/dev/null || { echo "profile.sh: perf not found (Debian: apt-get install linux-perf)" >&2; exit 1; }
build=$(mkdir -p "$build" && cd "$build" && pwd)
out=${out:-$build/bench-profile}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ ! -f "$build/CMakeCache.txt" ]; then
  generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$root" -B "$build" "${generator[@]}" -DCOLLD_WERROR=ON >"$out/cmake.log"
fi
cmake --build "$build" --target colld colld-perf >"$out/build.log"
perf_bin="$build/tools/colld-perf"

run=$(mktemp -d /tmp/colld-profile.XXXXXX)
sock="$run/colld.sock"
"$build/server/colld" --socket "$sock" --log-file "$out/colld.log" >/dev/null 2>&1 &
daemon=$!
bg=
cleanup() {
  [ -n "$bg" ] && kill "$bg" 2>/dev/null && wait "$bg" 2>/dev/null
  kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$run"
}
trap cleanup EXIT
for _ in $(seq 1 500); do [ -S "$sock" ] && break; sleep 0.01; done

# Top functions of a perf.data by process, dso and function, our binaries' addresses resolved.
report() {
  perf report -i "$1" --no-children --sort comm,dso,sym --stdio -g none --percent-limit 0.05 2>/dev/null |
    awk -v bdir="$build" '
      /^ +[0-9.]+%/ {
        pct = $1; sub("%", "", pct); comm = $2; dso = $3; sym = $0; sub(/.*\] /, "", sym)
        if (comm ~ /^colld-perf-r[0-9]/) comm = "ranks"
        path = ""
        if (dso == "colld") path = bdir "/server/colld"
        else if (dso == "colld-perf") path = bdir "/tools/colld-perf"
        else if (dso ~ /^libcolld\.so/) path = bdir "/client/" dso
        if (sym ~ /^0x/ && path != "") {
          cmd = "addr2line -f -e " path " " sym; cmd | getline fn; close(cmd); sym = fn
        }
        key = comm "\t" dso "\t" sym; v[key] += pct; byproc[comm] += pct
        cat = "other"
        if (sym ~ /sched|task_switch|do_syscall_64|rseq|exit_to_user|clock_gettime/) cat = "yield+scheduler"
        else if (sym ~ /^colld__r_|colld_cpu_reduce|^mem(cpy|move)|__memmove/) cat = "reduce+copy"
        else if (sym ~ /malloc|free|calloc/) cat = "malloc"
        bycat[comm ": " cat] += pct
      }
      END {
        printf "by process:"; for (c in byproc) printf " %s %.1f%%", c, byproc[c]
        printf "; by kind:"; for (c in bycat) printf " %s %.1f%%", c, bycat[c]; printf "\n"
        for (k in v) { split(k, f, "\t"); printf "%6.2f%%  %-12s %-22s %s\n", v[k], f[1], f[2], f[3] }
      }' | { IFS= read -r first; echo "$first"; sort -rn | head -n 18; }
}

cases=("small2 2 8 8 400000 0.7" "small4 4 8 8 300000 0.7" "large2 2 64M 64M 400 1.2" "large4 4 64M 64M 200 1.0")
for c in "${cases[@]}"; do
  read -r name p b e n warm <<<"$c"
  "$perf_bin" --socket "$sock" -p "$p" -b "$b" -e "$e" -n "$n" -w 2 -z 1 -c 0 >"$out/$name.txt" 2>&1 &
  bg=$!
  sleep "$warm"
  perf record -F 999 -a -g -o "$out/$name.data" -- sleep "$seconds" >/dev/null 2>&1
  wait "$bg"; bg=
  echo "== $name: $p ranks, $b B, all-reduce float32 sum, -z 1"
  grep -v '^#' "$out/$name.txt" | grep float || true
  report "$out/$name.data" | tee "$out/$name.report"
  echo
done

echo "== system calls and context switches per collective (100,000 all-reduces of 8 B, whole machine)"
for p in 2 4; do
  perf stat -x, -o "$out/syscalls$p.txt" -a -e raw_syscalls:sys_enter,syscalls:sys_enter_sched_yield \
    -e syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_write,context-switches -- \
    "$perf_bin" --socket "$sock" -p "$p" -b 8 -e 8 -n 50000 -w 0 -z 1 -c 0 >/dev/null
  awk -F, -v p="$p" '$3 != "" && $1 ~ /^[0-9]+$/ { printf "  %d ranks: %-34s %8.2f per collective\n", p, $3, $1 / 100000 }' \
    "$out/syscalls$p.txt"
done
echo "profiles: $out"
