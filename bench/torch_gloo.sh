#!/usr/bin/env bash
# torch.distributed all_reduce through colld (staged and zero copy) against Gloo, in one run
# (issue 16 item 5, redone on torch 2.x for issue 25). Builds colld and torch_colld (CMake, in
# --build), then runs bench/torch_gloo.py with the project's Python (.venv/bin/python, torch 2.11,
# made by `make deps`; COLLD_TORCH_PYTHON to name another) against a private daemon; see that
# file for what is timed and how.
#   bench/torch_gloo.sh [--build DIR] [--ranks 2,4] [--sizes 8:64M] [--rounds 3] [--ddp STEPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build
python=${COLLD_TORCH_PYTHON:-$here/../.venv/bin/python}
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --ranks|--sizes|--rounds|--ddp) args+=("$1" "$2"); shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--ranks 2,4] [--sizes 8:64M] [--rounds 3] [--ddp STEPS]" >&2; exit 2 ;;
  esac
done
"$python" -c 'import torch.distributed' 2>/dev/null ||
  { echo "torch_gloo.sh: $python has no torch (make deps makes .venv with torch 2.11)" >&2; exit 77; }
[ -f "$build/build.ninja" ] || cmake -S "$here/.." -B "$build" -G Ninja >/dev/null
ninja -C "$build" colld torch_colld >/dev/null
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)," \
  "torch $("$python" -c 'import torch; print(torch.__version__)')"
exec "$python" "$here/torch_gloo.py" --colld "$build/server/colld" \
  --pythonpath "$build/bindings/torch/python" "${args[@]}"
