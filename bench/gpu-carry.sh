#!/usr/bin/env bash
# colld's GPU checks on a machine that has a GPU but cannot build colld (no Debian packages, no
# network: a lent GPU machine), from a build made here. Two steps:
#
#   bench/gpu-carry.sh pack [--build DIR] [--nccl-tests DIR] [--dir DIR]     (here, after a build)
#   DIR/gpu-carry.sh run [PHASES...]                                         (there, in the
#                                                                              checkout's root)
#
# pack copies into DIR (default <repo>/.gpu; keep it out of git, e.g. .git/info/exclude) the
# daemon, libcolld, libnccl.so.2, collctl, colld-perf, the programs of the `hardware` tests
# (tests/gpu's gpu_hw_* and gpu_hw_graph), the libraries they need beyond glibc and libstdc++
# (Debian's gRPC, protobuf-c, libuv, cmocka, ... and the CUDA runtime colld-perf links; never a
# libcuda: the driver is the GPU machine's own), nccl-tests' all_reduce_perf and sendrecv_perf
# when --nccl-tests names a build of them (bench/nccl-tests.sh), and this script. About 40 MB.
# run puts the build where its programs expect it (they hold the build directory's absolute path:
# a symbolic link is made there when nothing is), and runs each phase, every program under a time
# limit, the logs in /tmp/gpulogs and packed into $OUT/logs.tgz (or /tmp/gpuout) after each step:
#   info     the GPU, the driver, the libraries found
#   kernels  gpu_hw_kernels, and beside it the collectives matrix, p2p exchange and fault, fault and
#            deadlock groups (2 to 8 rank processes on GPU 0; one GPU is enough for all of these)
#   stream   the stream-semantics groups, alone on the GPU (their timing limits)
#   graph    gpu_hw_graph: collectives captured into CUDA graphs and replayed
#   repeat   the stream groups three times, p2p exchange and fault again (a race shows as a flake)
#   bench    bench/gpu.sh's sweeps (colld-perf --gpu all-reduce, 2, 4 and 8 ranks, small, large and
#            --overlap)
#   mps      the stream, p2p exchange and graph groups and the bench's small and overlap sweeps
#            again with the daemon and every rank as clients of an MPS server started for it
#   perf     a short colld-perf --gpu sweep; nccl  nccl-tests through colld's libnccl.so.2
#   torch    PyTorch on CUDA tensors through colld, with the GPU machine's own python3 and torch
#            (never packed; TORCH_PYTHON to name another): test_torch's cuda scenario (torch_colld
#            built here with -DCOLLD_TORCH_CUDA=ON) on 2 and 4 processes, a DDP step and all_reduce
#            timings with backend "colld" and with backend "nccl" over colld's libnccl.so.2
#            (bench/gpu_torch.py), test_pynccl --cuda; a summary to record in docs/gpu-testing.md.
#            The packed extension is for this project's Python (3.11); for another (the lent
#            machines' python3 is 3.12) it is compiled there first from the packed sources (g++,
#            that Python's headers, its torch's). At most TORCH_BUDGET s (default 480) in all,
#            every step under its own limit (TORCH_SKIP names steps to leave out, e.g.
#            "torch_ddp_nccl torch_cuda4"); run it on its own: `run info torch`.
# Default: info kernels stream graph bench. BUDGET (seconds, default 500): a step that could run
# past it is not started. It prints a summary line per step and the failing logs' tails.
# Here, without a GPU, `DIR/gpu-carry.sh run info torch` dry-runs the torch phase: every GPU step
# skips (77), TORCH_COLLD_REBUILD=1 compiles the extension as the GPU machine would.
# docs/gpu-testing.md ("On a real GPU") says what each shows and what the first run found.
set -u

pack() {
  local root build dir nt
  root=$(cd "$(dirname "$0")/.." && pwd)
  build=$root/build dir=$root/.gpu nt=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --build) build=$2; shift 2 ;;
      --dir) dir=$2; shift 2 ;;
      --nccl-tests) nt=$2; shift 2 ;;
      *) echo "gpu-carry.sh pack: unknown option '$1'" >&2; exit 2 ;;
    esac
  done
  build=$(cd "$build" && pwd) || exit 1
  local files="server/colld client/libcolld.so client/libcolld.so.0 client/libcolld.so.0.1.0
    tools/colld-perf tools/colld-hostcall tools/collctl tests/gpu/test_cuda_kernels tests/gpu/test_gpu_collectives
    tests/gpu/colld-test-gpu-rank tests/gpu/test_gpu_p2p tests/gpu/colld-test-gpu-p2p
    tests/integration/colld-test-rank tests/integration/test_gpu_cudafake_graph"
  rm -rf "$dir"
  mkdir -p "$dir/lib" "$dir/nccl-tests"
  for f in $files; do
    [ -e "$build/$f" ] || { echo "gpu-carry.sh pack: $build/$f is missing (build it first)" >&2; exit 1; }
    mkdir -p "$dir/build/$(dirname "$f")"
    cp -a "$build/$f" "$dir/build/$f"
  done
  mkdir -p "$dir/build/bindings/nccl"
  cp -a "$build/bindings/nccl/lib" "$build/bindings/nccl/torch-path" "$dir/build/bindings/nccl/"
  # The torch phase: torch_colld as built here (its package, the autoload module, its dist-info),
  # its sources and libcolld's header (to compile it there for another Python), and the Python
  # programs it runs. Never torch itself: the GPU machine's own is used.
  if [ -d "$build/bindings/torch/python/torch_colld" ]; then
    mkdir -p "$dir/build/bindings/torch"
    cp -a "$build/bindings/torch/python" "$dir/build/bindings/torch/"
    if ! grep -q "COLLD_TORCH_CUDA:BOOL=ON" "$build/CMakeCache.txt" 2>/dev/null; then
      # Without its CUDA path it cannot serve the torch phase: that compiles one there instead.
      rm -f "$dir"/build/bindings/torch/python/torch_colld/_torch_colld*.so
      echo "gpu-carry.sh pack: note: $build's torch_colld has no CUDA path (-DCOLLD_TORCH_CUDA=ON): not packed; the torch phase compiles it there" >&2
    fi
  else
    echo "gpu-carry.sh pack: note: $build has no torch_colld (no .venv when configured?): the torch phase will compile it there" >&2
  fi
  mkdir -p "$dir/src/bindings/torch/torch_colld" "$dir/src/include/colld" "$dir/src/tests/torch" "$dir/src/tests/nccl" \
    "$dir/src/bench" "$dir/src/examples"
  cp "$root"/bindings/torch/*.cpp "$root"/bindings/torch/*.h "$root/bindings/torch/torch_colld_autoload.py" \
    "$dir/src/bindings/torch/"
  cp "$root/bindings/torch/torch_colld/__init__.py" "$dir/src/bindings/torch/torch_colld/"
  cp "$root/include/colld/colld.h" "$dir/src/include/colld/"
  # torch's CUDA headers include cuda_runtime.h, which needs crt/host_config.h: the nvidia wheels of
  # CUDA 13 leave crt/ out, so the toolkit's (here, same major version) is carried as a fallback.
  if [ -d /usr/local/cuda/include/crt ]; then
    mkdir -p "$dir/src/cuda-include"
    cp -r /usr/local/cuda/include/crt "$dir/src/cuda-include/"
  fi
  cp "$root/tests/torch/test_torch.py" "$dir/src/tests/torch/"
  cp "$root/tests/nccl/test_pynccl.py" "$root/tests/nccl/nccl_py_common.py" "$dir/src/tests/nccl/"
  cp "$root/tests/colld_daemon.py" "$dir/src/tests/"
  cp "$root/bench/gpu_torch.py" "$dir/src/bench/"
  cp "$root/examples/torch_ddp.py" "$dir/src/examples/"
  if [ -n "$nt" ]; then
    for t in all_reduce_perf sendrecv_perf; do cp "$nt/$t" "$dir/nccl-tests/"; done
  fi
  echo "$build" >"$dir/build-path"
  # Every library the programs need beyond glibc, libstdc++ and libgcc (newer on the GPU machine).
  find "$dir/build" "$dir/nccl-tests" -type f -perm -u+x -exec ldd {} \; 2>/dev/null |
    awk '/=> \// { print $3 }' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcuda|libnccl)\.so|/site-packages/|^'"$build" |
    while read -r l; do cp -L "$l" "$dir/lib/"; done
  find "$dir/build" -type f -perm -u+x -exec strip --strip-debug {} \; 2>/dev/null
  cp "$0" "$dir/gpu-carry.sh"
  echo "gpu-carry.sh: packed $(du -sh "$dir" | cut -f1) into $dir (build $build)"
}

case "${1:-}" in
  pack) shift; pack "$@"; exit $? ;;
  run) shift ;;
  *) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

C=$(cd "$(dirname "$0")" && pwd)   # the packed directory
OUTDIR=${OUT:-/tmp/gpuout}
O=/tmp/gpulogs
rm -rf "$O"
mkdir -p "$O" "$OUTDIR"
pack_logs() { tar czf "$OUTDIR/logs.tgz" -C /tmp gpulogs 2>/dev/null; }
PHASES=${*:-"info kernels stream graph bench"}
for p in $PHASES; do
  case " info kernels stream graph repeat bench mps perf nccl torch " in
    *" $p "*) ;;
    *) echo "gpu-carry.sh run: unknown phase '$p' (info kernels stream graph repeat bench mps perf nccl torch)" >&2; exit 2 ;;
  esac
done
t0=$(date +%s)
step() { echo; echo "=== [$(($(date +%s) - t0))s] $*"; }
has() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }

# The programs hold the build directory's absolute path (the daemon, the rank programs, rpaths).
B=$(cat "$C/build-path")
if [ ! -e "$B/server/colld" ]; then
  if [ -e "$B" ] && [ ! -L "$B" ]; then
    echo "gpu-carry.sh: $B exists and holds no colld build; the packed programs need their build" \
      "there: move it away" >&2
    exit 2
  fi
  mkdir -p "$(dirname "$B")"
  ln -sfn "$C/build" "$B"
fi
echo "gpu-carry.sh: the programs of $B ($(readlink -f "$B"))"
chmod +x "$C"/build/*/* "$C"/build/tests/*/* "$C"/nccl-tests/* 2>/dev/null
SYS_LD=${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH="$C/lib:$B/client${SYS_LD:+:$SYS_LD}"

run() { # name timeout cmd...
  local name=$1 to=$2
  if [ $(($(date +%s) - t0 + to)) -gt "${BUDGET:-500}" ]; then
    echo "--- $name: not run (would pass the ${BUDGET:-500} s budget)"
    echo "$name not-run" >>"$O/summary.txt"
    return 0
  fi
  run_now "$@"
}

run_now() { # name timeout cmd...: run() without the budget check
  local name=$1 to=$2
  shift 2
  local s=$(date +%s)
  timeout -k 5 "$to" "$@" >"$O/$name.log" 2>&1
  local rc=$?
  echo "--- $name: rc=$rc in $(($(date +%s) - s))s"
  echo "$name rc=$rc $(($(date +%s) - s))s" >>"$O/summary.txt"
  pack_logs
  return $rc
}

if has info; then
  step info
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  echo "system LD_LIBRARY_PATH=$SYS_LD"
  ldconfig -p | grep -E "libcuda\.so|libnccl" | head
  ldd $B/server/colld | grep -E "not found" && echo "MISSING LIBS"
  uname -r; nproc
fi

if has kernels; then
  step "kernels (gpu_hw_kernels) in parallel with the matrix, p2p exchange+fault, fault+deadlock"
  run kernels 120 $B/tests/gpu/test_cuda_kernels &
  run matrix 200 $B/tests/gpu/test_gpu_collectives matrix &
  (run p2p_exchange 120 $B/tests/gpu/test_gpu_p2p exchange; run p2p_fault 120 $B/tests/gpu/test_gpu_p2p fault) &
  (run fault 120 $B/tests/gpu/test_gpu_collectives fault; run deadlock 60 $B/tests/gpu/test_gpu_collectives deadlock) &
  wait
fi

if has stream; then
  step "stream semantics, alone on the GPU (timing limits)"
  run stream 90 $B/tests/gpu/test_gpu_collectives stream
  run p2p_stream 60 $B/tests/gpu/test_gpu_p2p stream
fi

if has graph; then
  step "CUDA graph capture and replay (test_gpu_cudafake_graph graph, COLLD_TEST_HARDWARE=1)"
  COLLD_TEST_HARDWARE=1 run graph 150 $B/tests/integration/test_gpu_cudafake_graph graph
fi

if has repeat; then
  step "repeats (race hunt): stream x3, p2p stream x3, then p2p exchange and fault side by side"
  for i in 1 2 3; do run stream_r$i 60 $B/tests/gpu/test_gpu_collectives stream; done
  for i in 1 2 3; do run p2p_stream_r$i 45 $B/tests/gpu/test_gpu_p2p stream; done
  run p2p_exchange_r2 90 $B/tests/gpu/test_gpu_p2p exchange &
  run fault_r2 90 $B/tests/gpu/test_gpu_collectives fault &
  wait
fi

if has bench; then
  step "bench/gpu.sh's sweeps (colld-perf --gpu, all-reduce float32 sum), 2, 4 and 8 ranks on GPU 0"
  sock=/tmp/colld-bench.sock
  rm -f $sock
  $B/server/colld --socket $sock --log-file "$O/bench-colld.log" >/dev/null 2>&1 &
  d=$!
  for _ in $(seq 200); do [ -S $sock ] && break; sleep 0.05; done
  for p in 2 4 8; do
    max=1G; [ $p = 8 ] && max=512M
    run gpu_p${p}_small 60 $B/tools/colld-perf --socket $sock --gpu -p $p -t allreduce -d float -o sum \
      -b 8 -e 64K -f 2 -n 1000 -w 100 -c 1
    run gpu_p${p}_large 90 $B/tools/colld-perf --socket $sock --gpu -p $p -t allreduce -d float -o sum \
      -b 64M -e $max -f 2 -n 20 -w 5 -c 1
    run gpu_p${p}_overlap 45 $B/tools/colld-perf --socket $sock --gpu -p $p -t allreduce -d float -o sum \
      -b 64M -e 64M -n 20 -w 1 -c 0 --overlap
  done
  kill -TERM $d
  wait $d
fi

if has mps; then
  step "under MPS (daemon and ranks as MPS clients of one MPS server)"
  ctl=$(command -v nvidia-cuda-mps-control || ls /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null)
  echo "mps control: ${ctl:-none}"
  if [ -n "$ctl" ]; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    $ctl -d && echo "mps started"
    sleep 1
    run mps_stream 60 $B/tests/gpu/test_gpu_collectives stream
    run mps_p2p_exchange 60 $B/tests/gpu/test_gpu_p2p exchange
    COLLD_TEST_HARDWARE=1 run mps_graph 90 $B/tests/integration/test_gpu_cudafake_graph graph
    sock=/tmp/colld-mps.sock
    rm -f $sock
    $B/server/colld --socket $sock --log-file "$O/mps-colld.log" >/dev/null 2>&1 &
    d=$!
    for _ in $(seq 200); do [ -S $sock ] && break; sleep 0.05; done
    for p in 2 4 8; do
      run mps_p${p}_small 45 $B/tools/colld-perf --socket $sock --gpu -p $p -t allreduce -d float -o sum \
        -b 8 -e 64K -f 2 -n 1000 -w 100 -c 1
      run mps_p${p}_overlap 45 $B/tools/colld-perf --socket $sock --gpu -p $p -t allreduce -d float -o sum \
        -b 64M -e 64M -n 20 -w 1 -c 0 --overlap
    done
    run mps_p2_large 60 $B/tools/colld-perf --socket $sock --gpu -p 2 -t allreduce -d float -o sum \
      -b 64M -e 256M -f 2 -n 20 -w 5 -c 1
    kill -TERM $d
    wait $d
    echo quit | $ctl
    sleep 1
    cp -r $CUDA_MPS_LOG_DIRECTORY "$O/mps-log" 2>/dev/null
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
fi

if has perf; then
  step "colld-perf --gpu"
  sock=/tmp/colld-perf.sock
  rm -f $sock
  $B/server/colld --socket $sock --log-file "$O/perf-colld.log" >/dev/null 2>&1 &
  d=$!
  for _ in $(seq 200); do [ -S $sock ] && break; sleep 0.05; done
  for p in 2 4; do
    run perf_p${p}_small 45 $B/tools/colld-perf --socket $sock --gpu -p $p -t allreduce -d float -o sum \
      -b 8 -e 64K -f 4 -n 300 -w 30 -c 1
    run perf_p${p}_large 60 $B/tools/colld-perf --socket $sock --gpu -p $p -t allreduce -d float -o sum \
      -b 64M -e 256M -f 2 -n 10 -w 2 -c 1
  done
  run perf_p2_all 60 $B/tools/colld-perf --socket $sock --gpu -p 2 -t all -d float -o sum \
    -b 1K -e 16M -f 16 -n 20 -w 3 -c 1
  # --nan-check's cost on GPU buffers (issue 30 item 1): the same rows with the communicator's check.
  run perf_p2_small_nan 45 $B/tools/colld-perf --socket $sock --gpu -p 2 -t allreduce -d float -o sum \
    -b 8 -e 64K -f 4 -n 300 -w 30 -c 1 --nan-check
  run perf_p2_large_nan 60 $B/tools/colld-perf --socket $sock --gpu -p 2 -t allreduce -d float -o sum \
    -b 64M -e 256M -f 2 -n 10 -w 2 -c 1 --nan-check
  # The stream-ordered host call alone, with and without libcolld's caches (issue 28 item 2).
  run hostcall 45 $B/tools/colld-hostcall --socket $sock --ranks 2 --calls 1000 --rounds 10
  kill -TERM $d
  wait $d
  # The hand-off without the host (issue 28 item 1, opt-in: --gpu-early-launch) against the host's
  # hand-off (the default, which the daemon above ran), in the same run: the same small and 64 MiB
  # rows (2 and 8 ranks) on a default daemon, then on one with --gpu-early-launch, twice, so that
  # each pair is measured back to back (perf_hosthandoff{1,2}_* / perf_handoff{1,2}_*), and the
  # 64 MiB overlap with a busy kernel of the ranks' own (--overlap, 2 ranks): without MPS the
  # early launch queues work in the daemon's context while the ranks' streams are behind,
  # which may take time slices from the application's kernels, what these rows size
  # (docs/performance.md says what to read).
  for round in hosthandoff1 handoff1 hosthandoff2 handoff2; do
    mode=${round%?}
    rm -f $sock
    opt=""
    [ $mode = handoff ] && opt="--gpu-early-launch"
    $B/server/colld --socket $sock $opt --log-file "$O/perf-$round-colld.log" >/dev/null 2>&1 &
    d=$!
    for _ in $(seq 200); do [ -S $sock ] && break; sleep 0.05; done
    for p in 2 8; do
      run perf_${round}_p${p}_small 45 $B/tools/colld-perf --socket $sock --gpu -p $p -t allreduce -d float -o sum \
        -b 8 -e 64K -f 8 -n 300 -w 30 -c 1
      run perf_${round}_p${p}_64M 45 $B/tools/colld-perf --socket $sock --gpu -p $p -t allreduce -d float -o sum \
        -b 64M -e 64M -n 10 -w 2 -c 1
    done
    run perf_${round}_p2_overlap 45 $B/tools/colld-perf --socket $sock --gpu -p 2 -t allreduce -d float -o sum \
      -b 64M -e 64M -n 20 -w 1 -c 0 --overlap
    # "Host runs ahead" (issue 28 item 5): each all-reduce behind a ~200 us kernel on the rank's
    # own stream, CUDA events, the kernel alone subtracted; about 1-3 s each on a GPU.
    for p in 2 8; do
      run perf_${round}_p${p}_ahead 20 $B/tools/colld-perf --socket $sock --gpu -p $p -t allreduce -d float -o sum \
        -b 64 -e 64M -f 1024 -n 50 -w 5 -c 0 --host-ahead
    done
    kill -TERM $d
    wait $d
  done
fi

if has nccl; then
  step "nccl-tests through colld's libnccl.so.2"
  sock=/tmp/colld-nccl.sock
  rm -f $sock
  $B/server/colld --socket $sock --log-file "$O/nccl-colld.log" >/dev/null 2>&1 &
  d=$!
  for _ in $(seq 200); do [ -S $sock ] && break; sleep 0.05; done
  for t in all_reduce_perf sendrecv_perf; do
    [ -x "$C/nccl-tests/$t" ] || { echo "--- nccl_$t: not packed (pack --nccl-tests DIR)"; continue; }
    COLLD_SOCKET=$sock LD_LIBRARY_PATH="$B/bindings/nccl/lib:$C/lib${SYS_LD:+:$SYS_LD}" \
      run nccl_$t 40 "$C/nccl-tests/$t" -b 8 -e 64M -f 8 -g 1 -c 1 -n 10 -w 2
  done
  COLLD_SOCKET=$sock LD_LIBRARY_PATH="$B/bindings/nccl/lib:$C/lib${SYS_LD:+:$SYS_LD}" \
    ldd "$C/nccl-tests/all_reduce_perf" | grep -E "nccl|cudart" >"$O/nccl_ldd.log"
  kill -TERM $d
  wait $d
fi

if has torch; then
  TB=${TORCH_BUDGET:-480}
  step "torch: PyTorch on CUDA tensors through colld (at most $TB s, each step under its own limit)"
  tb0=$(date +%s)
  PY=${TORCH_PYTHON:-python3}
  S=$C/src
  NCCL_LIB=$B/bindings/nccl/lib/libnccl.so.2
  TORCH_PATH=$B/bindings/nccl/torch-path
  PYD=$B/bindings/torch/python
  # The carried libraries libcolld needs, but not the CUDA runtime packed for colld-perf: torch
  # brings its own, and a torch library with a RUNPATH would take the first one on the path.
  TLIB=/tmp/gpu-torch-lib
  rm -rf "$TLIB"
  mkdir -p "$TLIB"
  for l in "$C"/lib/*; do
    case "$(basename "$l")" in libcudart*|libcublas*|libnvrtc*) ;; *) ln -s "$l" "$TLIB/" ;; esac
  done
  TLD="$TLIB:$B/client${SYS_LD:+:$SYS_LD}"
  trun() { # name timeout cmd...: a step of this phase, within its budget, unless in TORCH_SKIP
    case " ${TORCH_SKIP:-} " in
      *" $1 "*) echo "--- $1: skipped (TORCH_SKIP)"; echo "$1 not-run" >>"$O/summary.txt"; return 0 ;;
    esac
    if [ $(($(date +%s) - tb0 + $2)) -gt "$TB" ]; then
      echo "--- $1: not run (would pass the torch phase's $TB s)"
      echo "$1 not-run" >>"$O/summary.txt"
      return 0
    fi
    LD_LIBRARY_PATH=$TLD run_now "$@"
  }
  trun torch_env 60 "$PY" -c '
import os, sys, sysconfig, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), "x", torch.cuda.device_count())
print("EXT_SUFFIX", sysconfig.get_config_var("EXT_SUFFIX"), "Python.h", os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
'
  cat "$O/torch_env.log"
  # torch_colld for this python: the packed one when it was built for it, else compiled here.
  suffix=$(LD_LIBRARY_PATH=$TLD "$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
  if [ -n "${TORCH_COLLD_REBUILD:-}" ] || [ ! -e "$PYD/torch_colld/_torch_colld$suffix" ]; then
    echo "torch_colld: no packed extension for this python ($suffix): compiling it here"
    rm -rf /tmp/gpu-torch-py
    mkdir -p /tmp/gpu-torch-py
    cp -a "$PYD"/. /tmp/gpu-torch-py/ 2>/dev/null
    mkdir -p /tmp/gpu-torch-py/torch_colld
    cp "$S/bindings/torch/torch_colld/__init__.py" /tmp/gpu-torch-py/torch_colld/
    cp "$S/bindings/torch/torch_colld_autoload.py" /tmp/gpu-torch-py/
    rm -f /tmp/gpu-torch-py/torch_colld/_torch_colld*.so
    PYD=/tmp/gpu-torch-py
    trun torch_build 240 bash -c 'set -e
      eval "$("$0" -c "
import glob, os, shlex, sysconfig, torch
d = os.path.dirname(torch.__file__); sp = os.path.dirname(d)
inc = [x for x in sorted(glob.glob(os.path.join(sp, \"nvidia\", \"*\", \"include\"))) if os.path.exists(os.path.join(x, \"cuda_runtime_api.h\"))]
rt = sorted(glob.glob(os.path.join(sp, \"nvidia\", \"*\", \"lib\", \"libcudart.so.*\")))
for k, v in dict(TI=os.path.join(d, \"include\"), TL=os.path.join(d, \"lib\"), PYI=sysconfig.get_paths()[\"include\"],
                 SUF=sysconfig.get_config_var(\"EXT_SUFFIX\"), ABI=int(torch._C._GLIBCXX_USE_CXX11_ABI),
                 CUI=inc[0] if inc else \"\", CUDART=rt[0] if rt else \"\", CUDA=torch.version.cuda or \"\").items():
    print(k + \"=\" + shlex.quote(str(v)))
")"
      CXX=$(command -v g++ || command -v c++) || { echo "no C++ compiler here"; exit 1; }
      [ -f "$PYI/Python.h" ] || { echo "no $PYI/Python.h here: torch_colld cannot be compiled for this python"; exit 1; }
      src=$1/bindings/torch out=$2 b=$3
      files="torch_colld.cpp torch_colld_convert.cpp" defs="" libs=""
      if [ -n "$CUDA" ] && [ -n "$CUI" ] && [ -n "$CUDART" ] && [ -e "$TL/libc10_cuda.so" ]; then
        files="$files torch_colld_cuda.cpp" defs="-DCOLLD_TORCH_CUDA -isystem $CUI" libs="-lc10_cuda $CUDART"
      else
        echo "torch $CUDA: no CUDA runtime headers or libc10_cuda: built for CPU tensors only"
      fi
      flags="-std=c++17 -O2 -fPIC -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI=$ABI -DTORCH_EXTENSION_NAME=_torch_colld
        -DTORCH_API_INCLUDE_EXTENSION_H -I$1/include -isystem $TI -isystem $TI/torch/csrc/api/include -isystem $PYI $defs
        -idirafter $1/cuda-include"
      echo "$CXX $flags"
      objs=""
      for f in $files; do
        $CXX $flags -c "$src/$f" -o "/tmp/gpu-torch-$f.o" & objs="$objs /tmp/gpu-torch-$f.o"
      done
      for _ in $files; do wait -n; done
      $CXX -shared -o "$out/torch_colld/_torch_colld$SUF" $objs -L"$b/client" -lcolld -L"$TL" -ltorch_python \
        -ltorch_cpu -lc10 $libs -Wl,-rpath,"$b/client"
      echo "built $out/torch_colld/_torch_colld$SUF"' "$PY" "$S" "$PYD" "$B"
  fi
  trun torch_ddp_colld 150 "$PY" "$S/bench/gpu_torch.py" --colld "$B/server/colld" --backend colld --timeout "${GPU_TORCH_TIMEOUT:-110}" \
    --pythonpath "$PYD" --ranks 2
  trun torch_ddp_nccl 150 "$PY" "$S/bench/gpu_torch.py" --colld "$B/server/colld" --backend nccl --timeout "${GPU_TORCH_TIMEOUT:-110}" \
    --nccl-lib "$NCCL_LIB" --torch-path "$TORCH_PATH" --ranks 2
  trun torch_pynccl 120 "$PY" "$S/tests/nccl/test_pynccl.py" --lib "$NCCL_LIB" --colld "$B/server/colld" \
    --torch-path "$TORCH_PATH" --cuda --ranks 2,3
  trun torch_cuda2 90 "$PY" "$S/tests/torch/test_torch.py" --colld "$B/server/colld" --pythonpath "$PYD" \
    --timeout 70 cuda/2
  trun torch_cuda4 90 "$PY" "$S/tests/torch/test_torch.py" --colld "$B/server/colld" --pythonpath "$PYD" \
    --timeout 70 cuda/4
  echo "##### torch summary (record in docs/gpu-testing.md), $(($(date +%s) - tb0)) s"
  grep "^torch_" "$O/summary.txt"
  head -n 5 "$O/torch_env.log"
  grep -h -E "^(cuda/[0-9]|test_torch:|gpu_torch|  (ok  |FAIL)|  +[0-9]+ (B|KiB|MiB|GiB) |skip:|FAIL|ok  )" \
    "$O"/torch_cuda2.log "$O"/torch_ddp_colld.log "$O"/torch_ddp_nccl.log "$O"/torch_pynccl.log "$O"/torch_cuda4.log \
    2>/dev/null
fi

step "done"
pack_logs
cat "$O/summary.txt"
# the end of every log that failed, then the tables
for f in "$O"/*.log; do
  n=$(basename "$f" .log)
  if grep -q "^$n rc=[1-9]" "$O/summary.txt" 2>/dev/null; then
    echo "##### $n (failed): last lines"
    tail -n 25 "$f"
  fi
done
if [ -z "${BRIEF:-}" ]; then
  for f in "$O"/perf_p*.log "$O"/perf_*handoff*.log "$O"/nccl_*perf.log; do
    [ -f "$f" ] && { echo "##### $(basename "$f")"; grep -v "^#  *[A-Za-z]" "$f" | tail -n 14; }
  done
fi
grep -H "Overlap" "$O"/*overlap*.log 2>/dev/null
grep -H -A4 "^# Host runs ahead" "$O"/*_ahead.log 2>/dev/null
grep -h "^\[  \(PASSED\|FAILED\)\|^\[  FAILED  \] test" "$O"/*.log 2>/dev/null | sort | uniq -c
# 0: every step ran and passed; 1: one failed, was skipped (77) or not run.
! grep -q "rc=[1-9]\|not-run" "$O/summary.txt"
