#!/usr/bin/env bash
# The README's "run it" command (make demo): start colld on a private socket, show `collctl status`
# while 4 client processes all-reduce over a range of sizes, print their table, stop the daemon.
set -euo pipefail
build=${1:-build}
dir=$(mktemp -d /tmp/colld-demo.XXXXXX)
sock="$dir/colld.sock"
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"; wait "$daemon_pid" || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

"$build/server/colld" --socket "$sock" --log-file "$dir/colld.log" --log-level info &
daemon_pid=$!
for _ in $(seq 1 500); do [ -S "$sock" ] && break; sleep 0.01; done
[ -S "$sock" ] || { echo "demo: colld did not start"; cat "$dir/colld.log"; exit 1; }

"$build/tools/colld-demo" --socket "$sock" --nranks 4 --min-bytes 8 --max-bytes 64M --iters 20 &
demo_pid=$!
sleep 1
echo "---- collctl status, while the demo runs ----"
"$build/tools/collctl" --socket "$sock" status || true
echo "---------------------------------------------"
rc=0
wait "$demo_pid" || rc=$?
echo "---- colld log (last lines) ----"
tail -n 5 "$dir/colld.log"
exit $rc
