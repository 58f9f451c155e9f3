#!/usr/bin/env bash
# torch.distributed all_reduce through colld (staged and zero copy) against Gloo, in one run
# (issue 16 item 5). Builds colld and torch_colld (CMake, in --build), then runs
# bench/torch_gloo.py against a private daemon; see that file for what is timed and how.
#   bench/torch_gloo.sh [--build DIR] [--ranks 2,4] [--sizes 8:64M] [--rounds 3]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --ranks|--sizes|--rounds) args+=("$1" "$2"); shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--ranks 2,4] [--sizes 8:64M] [--rounds 3]" >&2; exit 2 ;;
  esac
done
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "torch_gloo.sh: /usr/bin/python3 has no torch (make deps installs python3-torch)" >&2; exit 77; }
[ -f "$build/build.ninja" ] || cmake -S "$here/.." -B "$build" -G Ninja >/dev/null
ninja -C "$build" colld torch_colld >/dev/null
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
exec /usr/bin/python3 "$here/torch_gloo.py" --colld "$build/server/colld" \
  --pythonpath "$build/bindings/torch/python" "${args[@]}"
