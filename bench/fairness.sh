#!/usr/bin/env bash
# Fairness between tenants (issue 26 row 5): a tenant's small all-reduces beside another tenant's
# large ones, against one real daemon (a benchmark, not a timed test: the results and this command
# go into docs/performance.md).
#
#   bench/fairness.sh [--build DIR] [--colld PATH] [--seconds S] [--hog BYTES] [--victim BYTES,...]
#                     [-- COLLD_OPTIONS...]
#
# Starts colld (--colld, default DIR/server/colld) on a private socket with --socket-mode 0666, then
# for each victim size (default 4K,32K): the victim (2 ranks of this uid) alone for S seconds
# (default 3), then beside the hog (2 ranks of uid 65534 when run as root, else of this uid: then
# the daemon sees one tenant) running in-place all-reduces of --hog bytes (default 256M) back to
# back; and the hog alone. Prints each JSON line of colld-fairness and, per victim size, p50 and p99
# loaded against idle (the goal: p99 at most 2x idle) and the hog's bandwidth beside the victim
# against alone. Run it with --colld of two builds to compare them in one run.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
colld=""
seconds=3
hog_bytes=256M
victims=4K,32K
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --colld) colld=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --hog) hog_bytes=$2; shift 2 ;;
    --victim) victims=$2; shift 2 ;;
    --) shift; break ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done

[ -f "$build/build.ninja" ] || cmake -S "$root" -B "$build" -G Ninja >/dev/null
cmake --build "$build" --target colld colld-fairness >/dev/null
colld=${colld:-$build/server/colld}
tool="$build/tools/colld-fairness"
dir=$(mktemp -d /tmp/colld-fairness-XXXXXX)
chmod 0777 "$dir"
sock="$dir/colld.sock"
"$colld" --socket "$sock" --socket-mode 0666 --log-level warn --log-file "$dir/colld.log" "$@" &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done

as_hog=()
if [ "$(id -u)" = 0 ]; then as_hog=(setpriv --reuid 65534 --regid 65534 --clear-groups); fi

field() { # json name
  sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" <<<"$1"
}

echo "# colld: $colld $*; hog: ${as_hog[*]:+uid 65534, }$hog_bytes all-reduces; $seconds s per run; $(nproc) CPUs"
alone=$("${as_hog[@]}" "$tool" --socket "$sock" --hog "$hog_bytes" --seconds "$seconds")
echo "hog alone:         $alone"
IFS=, read -ra sizes <<<"$victims"
for v in "${sizes[@]}"; do
  idle=$("$tool" --socket "$sock" --victim "$v" --seconds "$seconds")
  echo "victim $v idle:    $idle"
  "${as_hog[@]}" "$tool" --socket "$sock" --hog "$hog_bytes" --seconds "$((seconds * 2))" >"$dir/hog.json" &
  hog=$!
  sleep 0.5
  loaded=$("$tool" --socket "$sock" --victim "$v" --seconds "$seconds" || true)
  wait $hog
  beside=$(cat "$dir/hog.json")
  echo "victim $v loaded:  $loaded"
  echo "hog beside it:     $beside"
  if [ -z "$loaded" ]; then
    echo "victim $v: starved: not one all-reduce completed in $seconds s beside the hog"
    continue
  fi
  awk -v v="$v" -v i50="$(field "$idle" p50_us)" -v i99="$(field "$idle" p99_us)" \
      -v l50="$(field "$loaded" p50_us)" -v l99="$(field "$loaded" p99_us)" \
      -v ha="$(field "$alone" algbw_gbs)" -v hb="$(field "$beside" algbw_gbs)" \
      'BEGIN { printf "victim %s: p50 %.1f -> %.1f us (%.2fx), p99 %.1f -> %.1f us (%.2fx idle); hog %.2f -> %.2f GB/s (%.2fx)\n",
               v, i50, l50, l50 / i50, i99, l99, l99 / i99, ha, hb, hb / ha }'
done
