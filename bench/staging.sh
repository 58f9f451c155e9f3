#!/usr/bin/env bash
# Cost of "any pointer": the same all-reduce with colld_mem_alloc buffers (zero copy) and with
# malloc buffers (staged by libcolld), against one daemon in one run, and their ratio per size.
#   bench/staging.sh [BUILD_DIR] [NRANKS]
set -euo pipefail
build=${1:-build}
nranks=${2:-4}
dir=$(mktemp -d /tmp/colld-bench.XXXXXX)
sock="$dir/colld.sock"
"$build/server/colld" --socket "$sock" --log-file "$dir/colld.log" 2>/dev/null &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 500); do [ -S "$sock" ] && break; sleep 0.01; done
args=(--socket "$sock" --nranks "$nranks" --min-bytes 8 --max-bytes 64M --iters 20)
"$build/tools/colld-demo" "${args[@]}" > "$dir/zero"
"$build/tools/colld-demo" "${args[@]}" --malloc > "$dir/staged"
echo "all-reduce float32 sum, $nranks ranks: time per call, zero-copy vs staged (malloc)"
printf "%12s %14s %14s %8s %s\n" "size(B)" "zero-copy(us)" "staged(us)" "ratio" "correct"
join <(awk '$1 ~ /^[0-9]+$/ {print $1, $3, $6}' "$dir/zero") \
     <(awk '$1 ~ /^[0-9]+$/ {print $1, $3, $6}' "$dir/staged") |
  sort -n | awk '{ printf "%12d %14.1f %14.1f %8.2f %s/%s\n", $1, $2, $4, $4 / $2, $3, $5 }'
