#!/usr/bin/env bash
# The host call of a stream-ordered all-reduce alone, with and without libcolld's host-call
# caches, against one daemon in one run (bench/hostcall.c; issue 28 item 2).
#   bench/hostcall.sh [BUILD_DIR] [--fake] [colld-hostcall options...]
# --fake: the daemon and the benchmark load the CUDA driver test double (2 fake GPUs) instead of
# the driver: call counts and the cached/uncached ratio only, its times are not a GPU's.
set -euo pipefail
build=build
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then build=$1; shift; fi
if [ "${1:-}" = "--fake" ]; then
  shift
  export LD_LIBRARY_PATH="$build/tests/cudafake/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export COLLD_CUDAFAKE_DEVICES=${COLLD_CUDAFAKE_DEVICES:-2}
fi
dir=$(mktemp -d /tmp/colld-bench.XXXXXX)
sock="$dir/colld.sock"
"$build/server/colld" --socket "$sock" --log-file "$dir/colld.log" 2>/dev/null &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 500); do [ -S "$sock" ] && break; sleep 0.01; done
"$build/tools/colld-hostcall" --socket "$sock" "$@"
