#!/usr/bin/env bash
# colld against OpenMPI and against the memory-bandwidth bound, in one run (issue 5).
#
#   bench/compare.sh [--results DIR] [--build DIR] [--repeat R] [--max-bytes SIZE] [--quick]
#
# Builds what it needs (colld, colld-perf with CMake; bench/membw.c with cc; bench/mpi_allreduce.c
# with mpicc when OpenMPI is installed: `make bench-deps`), then measures on this machine:
#   1. memory bandwidth: bench/membw (copy, scale, 2-input add, in-place update; one thread per
#      CPU), before and again after the all-reduces; the bound uses the best figure of both runs;
#   2. an idle daemon's CPU use over 10 s (utime + stime from /proc/PID/stat), fresh;
#   3. all-reduce float32 sum, 2 and 4 ranks (processes), 8 B .. 64 MiB, with colld-perf -z 1 (each
#      call waited for, as MPI_Allreduce is blocking) and with MPI_Allreduce (mpirun, shared
#      memory: --mca pml ob1 --mca btl self,vader), the same sizes and iteration counts: 8 B .. 64 KiB
#      with 1000 timed iterations after 100 warm-up ones, 128 KiB .. 64 MiB with 20 after 5; each
#      sweep run R times (default 3) alternating colld and MPI, the best time per size kept; the first
#      sweep of each checks every result element (-c 1);
#   4. attach + join of a 4-rank communicator (colld-perf --attach-bench 20), p50 per process;
#   5. the daemon's idle CPU again over 10 s, after all that load.
# and prints, per size: colld/MPI bus bandwidth, colld/MPI latency, and colld against the zero-copy
# bound (n ranks read n x S and write n x S per all-reduce; bound time = 2nS / best membw figure),
# then the issue's targets, each MET or MISSED with the worst value. Raw outputs, results.tsv,
# ratios.tsv, summary.json and (with gnuplot or python3-matplotlib) busbw.png and latency.png go
# to the results directory (default BUILD/bench-results).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
results=""
repeat=3
max_bytes=64M
quick=0
small_iters=1000 small_warmup=100 large_iters=20 large_warmup=5
attach_reps=20
idle_s=10

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}
while [ $# -gt 0 ]; do
  case "$1" in
    --results) results=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --max-bytes) max_bytes=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$repeat" in ''|*[!0-9]*|0) echo "compare.sh: --repeat needs a positive integer" >&2; exit 2 ;; esac
if [ "$quick" = 1 ]; then # a smoke run: minutes become seconds, the numbers mean little
  repeat=1 max_bytes=4M small_iters=50 small_warmup=5 large_iters=3 large_warmup=1 attach_reps=5 idle_s=2
fi
build=$(mkdir -p "$build" && cd "$build" && pwd)
results=${results:-$build/bench-results}
mkdir -p "$results/raw" "$results/bin"
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
cc=${CC:-cc}
"$cc" -std=c11 -O2 -Wall -Wextra -Werror -pthread "$root/bench/membw.c" -o "$results/bin/membw"
have_mpi=0
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpicc -std=c11 -O2 -Wall -Wextra -Werror "$root/bench/mpi_allreduce.c" -o "$results/bin/mpi_allreduce"
  have_mpi=1
else
  log "compare.sh: mpicc/mpirun not found: no OpenMPI baseline (make bench-deps installs it)"
fi
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader)

# ---- the machine ----------------------------------------------------------------------------
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(uname -n), kernel $(uname -r)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) online CPU(s)"
  echo "caches: $(lscpu 2>/dev/null | grep -E '^L[123]' | sed 's/  */ /g' | paste -sd ';' -)"
  echo "memory (free -g):"; free -g
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "build: $(grep -m1 '^CMAKE_BUILD_TYPE' "$build/CMakeCache.txt" | cut -d= -f2)"
  [ "$have_mpi" = 1 ] && echo "mpi: $(mpirun --version 2>&1 | head -n1)"
} >"$results/machine.txt"
cat "$results/machine.txt" >&2

# ---- memory bandwidth -----------------------------------------------------------------------
log "== memory bandwidth (bench/membw)"
"$results/bin/membw" -r 10 | tee "$results/raw/membw.txt" >&2
# The last-level cache: all-reduces whose buffers fit in it are not bound by memory bandwidth.
l3_bytes=$(awk '/K$/ { v = $1 * 1024 } /M$/ { v = $1 * 1048576 } END { printf "%d", v }' \
  /sys/devices/system/cpu/cpu0/cache/index3/size 2>/dev/null || echo 0)

# ---- a daemon of our own --------------------------------------------------------------------
run=$(mktemp -d /tmp/colld-bench.XXXXXX)
sock="$run/colld.sock"
daemon=
cleanup() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then kill -TERM "$daemon"; wait "$daemon" || true; fi
  rm -rf "$run"
}
trap cleanup EXIT
"$colld" --socket "$sock" --log-file "$results/raw/colld.log" >/dev/null 2>&1 &
daemon=$!
for _ in $(seq 1 500); do [ -S "$sock" ] && break; sleep 0.01; done
[ -S "$sock" ] || { log "compare.sh: colld did not start"; cat "$results/raw/colld.log" >&2; exit 1; }

# CPU percent of one core the daemon used over $idle_s seconds.
idle_cpu() {
  local tck a b
  tck=$(getconf CLK_TCK)
  a=$(awk '{ print $14 + $15 }' "/proc/$daemon/stat")
  sleep "$idle_s"
  b=$(awk '{ print $14 + $15 }' "/proc/$daemon/stat")
  awk -v a="$a" -v b="$b" -v t="$tck" -v s="$idle_s" \
    'BEGIN { printf "%d ticks (1/%d s) in %d s = %.2f%% of a core\n", b - a, t, s, (b - a) / t / s * 100 }'
}
sleep 1
log "== idle daemon CPU over ${idle_s} s (fresh)"
idle_cpu | tee "$results/raw/idle_fresh.txt" >&2

# ---- all-reduce: colld and MPI --------------------------------------------------------------
small_max=64K large_min=128K
sweeps=("8 $small_max $small_iters $small_warmup small" "$large_min $max_bytes $large_iters $large_warmup large")
for p in 2 4; do
  for r in $(seq 1 "$repeat"); do
    check=$([ "$r" = 1 ] && echo 1 || echo 0)
    for sw in "${sweeps[@]}"; do
      read -r b e n w tag <<<"$sw"
      args=(-b "$b" -e "$e" -f 2 -n "$n" -w "$w" -c "$check")
      log "== $p ranks, sweep $tag $b..$e, repetition $r/$repeat"
      "$perf" --socket "$sock" -p "$p" -t allreduce -d float -o sum -z 1 "${args[@]}" \
        >"$results/raw/colld_p${p}_${tag}_r$r.txt"
      if [ "$have_mpi" = 1 ]; then
        "${mpirun_cmd[@]}" -np "$p" "$results/bin/mpi_allreduce" "${args[@]}" \
          >"$results/raw/mpi_p${p}_${tag}_r$r.txt" 2>"$results/raw/mpi_p${p}_${tag}_r$r.err"
      fi
    done
  done
done

# ---- memory bandwidth again (the machine is shared: take the best of both runs) ------------
log "== memory bandwidth again (bench/membw)"
"$results/bin/membw" -r 10 | tee "$results/raw/membw2.txt" >&2
membw=$(cat "$results/raw/membw.txt" "$results/raw/membw2.txt" | awk '/^membw_/ && $2 > m { m = $2 } END { print m + 0 }')
log "bound uses the best figure: $membw GB/s"

# ---- attach + join, idle after load ---------------------------------------------------------
log "== attach + join, 4 ranks, $attach_reps repetitions"
"$perf" --socket "$sock" -p 4 --attach-bench "$attach_reps" | tee "$results/raw/attach.txt" >&2
attach_p50=$(awk -F'[:( ]+' '/^# attach\+join p50/ { print $4 }' "$results/raw/attach.txt")
sleep 1
log "== idle daemon CPU over ${idle_s} s (after the load)"
idle_cpu | tee "$results/raw/idle_after.txt" >&2
idle_fresh=$(awk '{ sub("%", "", $(NF-3)); print $(NF-3) }' "$results/raw/idle_fresh.txt")
idle_after=$(awk '{ sub("%", "", $(NF-3)); print $(NF-3) }' "$results/raw/idle_after.txt")
kill -TERM "$daemon"; wait "$daemon" || true; daemon=

# ---- combine --------------------------------------------------------------------------------
# results.tsv: every implementation x ranks x mode x size, best time of the repetitions.
for f in "$results"/raw/colld_p*_r*.txt "$results"/raw/mpi_p*_r*.txt; do
  [ -f "$f" ] || continue
  base=$(basename "$f" .txt)
  impl=${base%%_*}
  p=$(sed -E 's/.*_p([0-9]+)_.*/\1/' <<<"$base")
  awk -v impl="$impl" -v p="$p" '!/^#/ && NF == 13 {
      print impl, p, "out_of_place", $1, $6, $9; print impl, p, "in_place", $1, $10, $13 }' "$f"
done >"$results/raw/all_rows.txt"
awk '{ k = $1 "\t" $2 "\t" $3 "\t" $4
       if (!(k in best) || $5 < best[k]) best[k] = $5
       if ($6 != "N/A") { chk[k] = 1; wrong[k] += $6 } }
     END { for (k in best) { split(k, f, "\t"); n = f[2]; s = f[4]; t = best[k]
             alg = t > 0 ? s / t / 1e3 : 0; w = (k in chk) ? wrong[k] : "NA"
             printf "%s\t%d\t%s\t%d\t%.3f\t%.4f\t%.4f\t%s\n", f[1], n, f[3], s, t, alg, alg * 2 * (n - 1) / n, w } }' "$results/raw/all_rows.txt" |
  sort -k1,1 -k2,2n -k3,3r -k4,4n >"$results/results.body"
{ printf "impl\tnranks\tmode\tsize_B\ttime_us\talgbw_GBs\tbusbw_GBs\twrong\n"; cat "$results/results.body"; } \
  >"$results/results.tsv"

# ratios.tsv: colld against MPI and against the zero-copy bound, per ranks x mode x size.
awk -v bw="$membw" -F'\t' '
  { k = $2 "\t" $3 "\t" $4; t[$1, k] = $5; b[$1, k] = $7; keys[k] = 1 }
  END { for (k in keys) { if (!(("colld", k) in t)) continue
          split(k, f, "\t"); n = f[1]; s = f[3]
          ct = t["colld", k]; cb = b["colld", k]
          mt = (("mpi", k) in t) ? t["mpi", k] : 0; mb = (("mpi", k) in b) ? b["mpi", k] : 0
          bound = bw > 0 ? 2 * n * s / (bw * 1e3) : 0
          bus = mb > 0 ? sprintf("%.3f", cb / mb) : "NA"; lat = mt > 0 ? sprintf("%.3f", ct / mt) : "NA"
          frac = ct > 0 ? bound / ct : 0
          printf "%d\t%s\t%d\t%.3f\t%.3f\t%.4f\t%.4f\t%s\t%s\t%.3f\t%.3f\n", n, f[2], s, ct, mt, cb, mb,
                 bus, lat, bound, frac } }' "$results/results.body" |
  sort -k1,1n -k2,2r -k3,3n >"$results/ratios.body"
{ printf "nranks\tmode\tsize_B\tcolld_us\tmpi_us\tcolld_busbw\tmpi_busbw\tbusbw_ratio\tlatency_ratio\tbound_us\tbound_fraction\n"
  cat "$results/ratios.body"; } >"$results/ratios.tsv"

# ---- report ---------------------------------------------------------------------------------
echo
echo "colld vs OpenMPI, all-reduce float32 sum ($(date -u '+%Y-%m-%d'), $(nproc) CPUs, membw bound $membw GB/s)"
for mode in out_of_place in_place; do
  echo
  echo "$mode: time in us, busbw in GB/s; bus x = colld/MPI busbw; lat x = colld/MPI time;"
  echo "bound = zero-copy bound time (2nS / $membw GB/s) / colld time; * = the buffers fit in the L3 ($l3_bytes B)"
  awk -F'\t' -v m="$mode" -v l3="$l3_bytes" '$2 == m { sizes[$3] = 1; ws = (m == "in_place" ? 1 : 2) * $1 * $3
        v[$1, $3] = sprintf("%9.2f %9.2f %7.2f %7.2f %6s %6s %5.0f%%%s", $4, $5, $6, $7, $8, $9, $11 * 100,
                            ws <= l3 ? "*" : " ") }
    END { printf "%6s | %9s %9s %7s %7s %6s %6s %7s | %9s %9s %7s %7s %6s %6s %7s\n", "", "2 ranks", "", "", "", "",
                 "", "", "4 ranks", "", "", "", "", "", ""
          printf "%6s | %9s %9s %7s %7s %6s %6s %7s | %9s %9s %7s %7s %6s %6s %7s\n", "size", "colld us", "MPI us",
                 "colld", "MPI", "bus x", "lat x", "bound", "colld us", "MPI us", "colld", "MPI", "bus x", "lat x", "bound"
          n = 0; for (s in sizes) list[++n] = s + 0
          for (i = 2; i <= n; i++) { x = list[i]; for (j = i - 1; j > 0 && list[j] > x; j--) list[j + 1] = list[j]; list[j + 1] = x }
          for (i = 1; i <= n; i++) { s = list[i]
            hs = s >= 1048576 ? sprintf("%gM", s / 1048576) : s >= 1024 ? sprintf("%gK", s / 1024) : s
            printf "%6s | %s | %s\n", hs, ((2, s) in v) ? v[2, s] : "", ((4, s) in v) ? v[4, s] : "" } }' \
    "$results/ratios.body"
done

# Targets of issue 5 (both modes, 2 and 4 ranks).
eval "$(awk -F'\t' '
  $3 >= 4194304 { if ($8 != "NA" && (bus == "" || $8 + 0 < bus)) bus = $8 + 0
                  if (frac == "" || $11 + 0 < frac) frac = $11 + 0 }
  $3 >= 8 && $3 <= 4096 { if ($9 != "NA" && (lat == "" || $9 + 0 > lat)) lat = $9 + 0 }
  END { printf "worst_bus=%s worst_frac=%s worst_lat=%s\n", bus == "" ? "NA" : bus, frac == "" ? "NA" : frac,
               lat == "" ? "NA" : lat }' "$results/ratios.body")"
wrong_total=$(awk -F'\t' '$8 != "NA" && $8 != "wrong" { w += $8 } END { print w + 0 }' "$results/results.tsv")
verdict() { # name, value, op, limit, unit
  local ok
  if [ "$2" = NA ] || [ -z "$2" ]; then echo "  NOT MEASURED  $1"; return; fi
  ok=$(awk -v v="$2" -v l="$4" -v op="$3" 'BEGIN { r = op == ">=" ? (v + 0 >= l + 0) : (v + 0 < l + 0); print (r ? "MET" : "MISSED") }')
  printf "  %-7s %s: worst %s %s (target %s %s)\n" "$ok" "$1" "$2" "$5" "$3" "$4"
}
{
  echo
  echo "targets (issue 5), worst case over 2 and 4 ranks, in place and out of place:"
  verdict ">= 4 MiB all-reduce busbw / OpenMPI" "$worst_bus" ">=" 2 "x"
  verdict ">= 4 MiB all-reduce time at the zero-copy bound" "$worst_frac" ">=" 0.7 "(fraction)"
  worst_lat_inv=NA; [ "$worst_lat" != NA ] && worst_lat_inv=$worst_lat
  ok=$(awk -v v="$worst_lat_inv" 'BEGIN { r = v == "NA" ? "NOT MEASURED" : (v + 0 <= 2 ? "MET" : "MISSED"); print r }')
  printf "  %-7s 8 B - 4 KiB latency / OpenMPI: worst %s x (target <= 2)\n" "$ok" "$worst_lat"
  verdict "idle daemon CPU, fresh" "$idle_fresh" "<" 1 "% of a core"
  verdict "idle daemon CPU, after the load" "$idle_after" "<" 1 "% of a core"
  verdict "attach+join p50, 4 ranks (worst rank)" "$(awk -v v="$attach_p50" 'BEGIN { printf "%.2f", v / 1000 }')" "<" 5 "ms"
  echo "  wrong elements in the checked sweeps (colld and MPI): $wrong_total"
} | tee "$results/targets.txt"

# summary.json: the headline numbers and where the rest is.
cat >"$results/summary.json" <<EOF
{"date":"$(date -u '+%Y-%m-%dT%H:%M:%SZ')","cpus":$(nproc),"membw_bound_gbs":$membw,
 "membw":{$(awk '/^membw_/ { printf "%s\"%s\":%s", n++ ? "," : "", $1, $2 }' "$results/raw/membw.txt")},
 "membw_again":{$(awk '/^membw_/ { printf "%s\"%s\":%s", n++ ? "," : "", $1, $2 }' "$results/raw/membw2.txt")},
 "l3_bytes":$l3_bytes,
 "worst_busbw_ratio_ge_4MiB":"$worst_bus","worst_bound_fraction_ge_4MiB":"$worst_frac",
 "worst_latency_ratio_8B_4KiB":"$worst_lat","idle_cpu_percent_fresh":$idle_fresh,
 "idle_cpu_percent_after_load":$idle_after,"attach_join_p50_us_worst_rank":${attach_p50:-null},
 "wrong_elements":$wrong_total,"repeat":$repeat,
 "files":{"results":"results.tsv","ratios":"ratios.tsv","machine":"machine.txt","raw":"raw/"}}
EOF
rm -f "$results/results.body" "$results/ratios.body"

# ---- plots ----------------------------------------------------------------------------------
plot_gnuplot() {
  local tsv="$results/results.tsv"
  gnuplot <<EOF
set terminal pngcairo size 1000,620 noenhanced font ",10"
set datafile separator "\t"
set logscale x 2
set format x "%.0b%B"
set grid
set key top left
set xlabel "message size (bytes per rank)"
set output "$results/busbw.png"
set title "all-reduce float32 sum, out of place: bus bandwidth (best of $repeat), zero-copy bound from membw $membw GB/s"
set ylabel "busbw (GB/s)"
plot "< awk -F'\t' '\$1==\"colld\" && \$2==2 && \$3==\"out_of_place\"' $tsv" using 4:7 with linespoints lw 2 title "colld 2 ranks", \
     "< awk -F'\t' '\$1==\"colld\" && \$2==4 && \$3==\"out_of_place\"' $tsv" using 4:7 with linespoints lw 2 title "colld 4 ranks", \
     "< awk -F'\t' '\$1==\"mpi\" && \$2==2 && \$3==\"out_of_place\"' $tsv" using 4:7 with linespoints dt 2 title "OpenMPI 2 ranks", \
     "< awk -F'\t' '\$1==\"mpi\" && \$2==4 && \$3==\"out_of_place\"' $tsv" using 4:7 with linespoints dt 2 title "OpenMPI 4 ranks", \
     $membw/4.0 with lines dt 3 lw 2 title "bound 2 ranks (BW/4)", \
     $membw*3.0/16 with lines dt 3 lw 2 title "bound 4 ranks (3BW/16)"
set output "$results/latency.png"
set logscale y 10
set key top left
set title "all-reduce float32 sum, out of place: time per call (best of $repeat)"
set ylabel "time (us)"
plot "< awk -F'\t' '\$1==\"colld\" && \$2==2 && \$3==\"out_of_place\"' $tsv" using 4:5 with linespoints lw 2 title "colld 2 ranks", \
     "< awk -F'\t' '\$1==\"colld\" && \$2==4 && \$3==\"out_of_place\"' $tsv" using 4:5 with linespoints lw 2 title "colld 4 ranks", \
     "< awk -F'\t' '\$1==\"mpi\" && \$2==2 && \$3==\"out_of_place\"' $tsv" using 4:5 with linespoints dt 2 title "OpenMPI 2 ranks", \
     "< awk -F'\t' '\$1==\"mpi\" && \$2==4 && \$3==\"out_of_place\"' $tsv" using 4:5 with linespoints dt 2 title "OpenMPI 4 ranks"
EOF
}
plot_matplotlib() {
  python3 - "$results" "$membw" <<'EOF'
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
res, bw = sys.argv[1], float(sys.argv[2])
rows = list(csv.DictReader(open(res + "/results.tsv"), delimiter="\t"))
for col, name, ylab in (("busbw_GBs", "busbw", "busbw (GB/s)"), ("time_us", "latency", "time (us)")):
    plt.figure(figsize=(10, 6.2))
    for impl in ("colld", "mpi"):
        for n in ("2", "4"):
            pts = [(int(r["size_B"]), float(r[col])) for r in rows
                   if r["impl"] == impl and r["nranks"] == n and r["mode"] == "out_of_place"]
            if pts:
                pts.sort()
                plt.plot(*zip(*pts), marker="o", linestyle="-" if impl == "colld" else "--",
                         label=f"{'colld' if impl == 'colld' else 'OpenMPI'} {n} ranks")
    if name == "busbw":
        plt.axhline(bw / 4, linestyle=":", label="bound 2 ranks (BW/4)")
        plt.axhline(bw * 3 / 16, linestyle=":", label="bound 4 ranks (3BW/16)")
    else:
        plt.yscale("log")
    plt.xscale("log", base=2)
    plt.xlabel("message size (bytes per rank)")
    plt.ylabel(ylab)
    plt.grid(True)
    plt.legend()
    plt.title(f"all-reduce float32 sum, out of place ({name})")
    plt.savefig(f"{res}/{name}.png", dpi=100)
EOF
}
if command -v gnuplot >/dev/null && plot_gnuplot 2>"$results/raw/plot.log"; then
  echo "plots: $results/busbw.png $results/latency.png"
elif command -v python3 >/dev/null && python3 -c 'import matplotlib' 2>/dev/null &&
     plot_matplotlib 2>"$results/raw/plot.log"; then
  echo "plots: $results/busbw.png $results/latency.png"
else
  echo "plots: skipped (neither gnuplot nor python3-matplotlib works; make bench-deps installs gnuplot-nox)"
fi
echo "results: $results (results.tsv, ratios.tsv, targets.txt, summary.json, machine.txt, raw/)"
