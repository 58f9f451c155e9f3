#!/bin/sh
# The cost of a GPU health pass (docs/performance.md, "GPU health"), on the CUDA driver and NVML test
# doubles: a daemon on N fake GPUs, each with 18 active NVLinks (the most NVML calls a pass makes),
# health read every 10 ms; `collctl --json status` gives each GPU's last pass time (the NVML reads,
# lock dropped) SAMPLES times. On the doubles the time is the NVML double's own (it reads its
# control file at every call): it bounds colld's side of a pass, it is not NVML's cost.
#   bench/gpu_health_cost.sh [BUILD_DIR] [GPUS] [SAMPLES]
set -eu
build=${1:-build}
gpus=${2:-8}
samples=${3:-20}
dir=$(mktemp -d /tmp/colld-health-XXXXXX)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
: > "$dir/ctl"
i=0
while [ "$i" -lt "$gpus" ]; do echo "gpu=$i nvlinks=18" >> "$dir/ctl"; i=$((i + 1)); done
LD_LIBRARY_PATH="$build/tests/cudafake/lib:$build/tests/nvmlfake/lib" COLLD_CUDAFAKE_DEVICES=$gpus \
COLLD_NVMLFAKE_CONTROL="$dir/ctl" "$build/server/colld" --socket "$dir/s" --gpu-health-ms 10 \
  > "$dir/log" 2>&1 &
pid=$!
sleep 1
k=0
while [ "$k" -lt "$samples" ]; do
  "$build/tools/collctl" --socket "$dir/s" --json status
  sleep 0.05
  k=$((k + 1))
done | python3 -c '
import json, statistics, sys
ns = [g["pass_ns"] for line in sys.stdin for g in json.loads(line)["gpus"] if g["nvml"]]
ns.sort()
print("%d samples over %s GPUs: per GPU median %.1f us, p90 %.1f us, max %.1f us" % (
    len(ns), sys.argv[1], statistics.median(ns) / 1e3, ns[int(len(ns) * 0.9)] / 1e3, ns[-1] / 1e3))' "$gpus"
