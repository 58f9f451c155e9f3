#!/usr/bin/env bash
# NVIDIA's nccl-tests built against colld's nccl.h and libnccl.so.2 (issue 16 item 4), and run where
# a GPU is visible.
#
#   bench/nccl-tests.sh --src DIR [--build DIR] [--out DIR] [--gencode FLAGS] [--run]
#
# --src     a checkout of https://github.com/NVIDIA/nccl-tests (not packaged by Debian, so not
#           fetched here: this project's CI reaches only Debian's archive)
# --build   colld's CMake build directory with bindings/nccl/lib/libnccl.so.2 (default
#           <repo>/build; built first if the library is missing)
# --out     where nccl-tests is built (default BUILD/nccl-tests)
# --gencode nvcc's -gencode flags (default sm_90: one architecture keeps the build short)
# --run     then run sendrecv_perf, alltoall_perf and all_reduce_perf on one GPU (-g 1) through a
#           colld daemon of its own (exit 77 when no GPU is visible)
#
# It makes an NCCL_HOME of colld's header and library, builds every nccl-tests benchmark with the
# CUDA toolkit (CUDA_HOME, default /usr/local/cuda), and checks that each binary loads colld's
# libnccl.so.2 (never an NVIDIA NCCL that may sit in the toolkit's lib folder or the ld.so cache).
# Exit status: 0 built (and ran), 1 a step failed, 2 bad options, 77 --run without a GPU.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
src="" build="$root/build" out="" run=0
gencode="-gencode=arch=compute_90,code=sm_90"
cuda_home=${CUDA_HOME:-/usr/local/cuda}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --src) src=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --gencode) gencode=$2; shift 2 ;;
    --run) run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "nccl-tests.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
if [ -z "$src" ] || [ ! -f "$src/src/common.h" ]; then
  echo "nccl-tests.sh: --src must name a checkout of NVIDIA/nccl-tests" >&2
  exit 2
fi
[ -n "$out" ] || out="$build/nccl-tests"
if [ ! -x "$cuda_home/bin/nvcc" ]; then
  echo "nccl-tests.sh: no nvcc in $cuda_home (set CUDA_HOME)" >&2
  exit 1
fi

lib="$build/bindings/nccl/lib"
if [ ! -e "$lib/libnccl.so.2" ]; then
  cmake -S "$root" -B "$build" -G Ninja >/dev/null
  cmake --build "$build" --target colld_nccl
fi

# NCCL_HOME: colld's header and library only.
home="$out/nccl-home"
rm -rf "$home"
mkdir -p "$home/include" "$home/lib"
cp "$root/bindings/nccl/include/nccl.h" "$home/include/"
cp -P "$lib"/libnccl.so* "$home/lib/"

# A copy of the sources, so that the checkout stays clean.
rm -rf "$out/src-tree"
mkdir -p "$out"
cp -r "$src" "$out/src-tree"
make -C "$out/src-tree" -j"$(nproc)" CUDA_HOME="$cuda_home" NCCL_HOME="$home" NVCC_GENCODE="$gencode" \
  BUILDDIR="$out/bin"

status=0
for b in "$out"/bin/*_perf; do
  resolved=$(LD_LIBRARY_PATH="$home/lib" ldd "$b" | awk '/libnccl.so.2/ {print $3}')
  if [ "$(readlink -f "$resolved")" != "$(readlink -f "$home/lib/libnccl.so.2")" ]; then
    echo "nccl-tests.sh: $(basename "$b") loads $resolved, not colld's libnccl.so.2" >&2
    status=1
  else
    echo "$(basename "$b"): built, libnccl.so.2 -> colld's ($resolved)"
  fi
done
[ "$status" = 0 ] || exit 1
[ "$run" = 1 ] || exit 0

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "nccl-tests.sh: no GPU visible: nothing run" >&2
  exit 77
fi
sock="$out/colld.sock"
"$build/server/colld" --socket "$sock" >"$out/colld.log" 2>&1 &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
for t in sendrecv_perf alltoall_perf all_reduce_perf; do
  COLLD_SOCKET="$sock" LD_LIBRARY_PATH="$home/lib" "$out/bin/$t" -b 8 -e 64M -f 4 -g 1 -c 1
done
