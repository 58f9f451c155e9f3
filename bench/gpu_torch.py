#!/usr/bin/env python3
"""gpu_torch.py: a DDP step and all_reduce timings on CUDA tensors through colld (issue 25 item 5).

    python3 bench/gpu_torch.py --colld BUILD/server/colld --backend colld --pythonpath BUILD/bindings/torch/python
    python3 bench/gpu_torch.py --colld BUILD/server/colld --backend nccl \\
        --nccl-lib BUILD/bindings/nccl/lib/libnccl.so.2 --torch-path BUILD/bindings/nccl/torch-path
      [--ranks 2] [--small 8,1K,64K] [--large 64M,256M] [--timeout 240]

Starts colld on a private socket, then --ranks processes, every one on GPU 0, joined by a file
store, with the process group on --backend:

  colld  torch_colld (a build with -DCOLLD_TORCH_CUDA=ON, on --pythonpath): stream-ordered CUDA
         tensors through the daemon;
  nccl   PyTorch's own ProcessGroupNCCL over colld's libnccl.so.2 (docs/nccl.md: LD_PRELOAD of the
         library and --torch-path first on PYTHONPATH); each rank checks that no other libnccl is
         mapped into it. NVIDIA's NCCL refuses two ranks on one GPU; colld's takes them.

Each rank then runs:
  ddp     one DistributedDataParallel step of a small float64 MLP on CUDA (buckets of 0.1 MiB, so
          several all-reduces overlap the backward pass): every rank's gradients must be
          bit-identical (an all_gather through the same group) and equal to a single-process
          reference over every rank's batch (relative 1e-10), the parameters after an SGD step
          bit-identical;
  small   in-place float32 all_reduce SUM at each --small size, each call followed by
          sync(): the latency a blocking caller sees (median of 200 after 20);
  large   the same at each --large size, 10 calls back to back then one synchronize: time per
          call and bus bandwidth (2 (n-1)/n x size / time, as nccl-tests);
  exact   a last all_reduce of rank + 1 everywhere must give n (n + 1) / 2 exactly.
Prints one line per check and a table; the times are the slowest rank's. Exit 0 when every check
passed, 1 otherwise, 77 (skip) without a CUDA GPU (or, for colld, a torch_colld without CUDA).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from colld_daemon import start_daemon  # noqa: E402  (tests/colld_daemon.py)

KIB, MIB = 1 << 10, 1 << 20


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": KIB, "M": MIB, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def fmt_size(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------- one rank

def worker(args):
    import faulthandler
    import torch
    import torch.distributed as dist

    # A hang shows where: every thread's Python stack on stderr before the driver kills the rank.
    faulthandler.dump_traceback_later(max(5, args.timeout - 10), exit=False)

    def step(what):
        print(f"rank {args.rank}: {what}", file=sys.stderr, flush=True)

    if args.cpu:  # the script's own dry run, without a GPU
        dev, sync = torch.device("cpu"), (lambda: None)
    else:
        torch.cuda.set_device(0)
        dev, sync = torch.device("cuda", 0), torch.cuda.synchronize
    res = {"rank": args.rank, "checks": [], "small": {}, "large": {}}

    def check(name, ok, detail=""):
        res["checks"].append([name, bool(ok), detail])

    if args.backend == "colld":
        import torch_colld
        if not torch_colld.cuda_built and not args.cpu:
            print("skip: torch_colld was built without -DCOLLD_TORCH_CUDA=ON (torch_colld.cuda_built is False)")
            return 77
    else:
        maps = open("/proc/self/maps").read()
        ncclmaps = sorted({line.split()[-1] for line in maps.splitlines() if "libnccl" in line})
        ours = os.path.realpath(args.nccl_lib)
        check("only colld's libnccl.so.2 is mapped", ncclmaps and all(os.path.realpath(m) == ours for m in ncclmaps),
              ", ".join(ncclmaps) or "none mapped")
    step("init_process_group")
    dist.init_process_group(args.backend, init_method=f"file://{args.store}", rank=args.rank, world_size=args.world)
    world, rank = args.world, args.rank

    # ddp: one step, gradients identical on every rank and equal to the reference.
    def make_model():  # the same weights every time
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 128),
                                   torch.nn.Tanh(), torch.nn.Linear(128, 4)).double()

    model, ref = make_model().to(dev), make_model()
    step("DistributedDataParallel(...)")
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=None if args.cpu else [0], bucket_cap_mb=0.1)
    batches = [(torch.randn(16, 64, generator=torch.Generator().manual_seed(100 + r), dtype=torch.float64),
                torch.randn(16, 4, generator=torch.Generator().manual_seed(200 + r), dtype=torch.float64))
               for r in range(world)]
    x, y = (t.to(dev) for t in batches[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    opt.zero_grad()
    step("ddp forward and backward")
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    every = [torch.empty_like(grads) for _ in range(world)]
    dist.all_gather(every, grads)
    sync()
    check("ddp: gradients bit-identical on every rank", all(torch.equal(every[0], g) for g in every))
    loss = sum(torch.nn.functional.mse_loss(ref(bx), by) for bx, by in batches) / world
    loss.backward()
    want = torch.cat([p.grad.flatten() for p in ref.parameters()])
    err = ((grads.cpu() - want).abs().max() / want.abs().max()).item()
    check("ddp: gradients equal the single-process reference (rel 1e-10)", err <= 1e-10, f"max rel error {err:.2e}")
    opt.step()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    every = [torch.empty_like(params) for _ in range(world)]
    dist.all_gather(every, params)
    sync()
    check("ddp: parameters bit-identical after the step", all(torch.equal(every[0], p) for p in every))

    # small: latency of a blocking caller.
    step("small all_reduce timings")
    for nbytes in args.small:
        t = torch.ones(max(1, nbytes // 4), device=dev)
        times = []
        for i in range(220):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            sync()
            if i >= 20:
                times.append(time.perf_counter() - t0)
        res["small"][nbytes] = statistics.median(times) * 1e6
    # large: back to back, one synchronize.
    step("large all_reduce timings")
    for nbytes in args.large:
        t = torch.ones(nbytes // 4, device=dev)
        for _ in range(3):
            dist.all_reduce(t)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(t)
        sync()
        res["large"][nbytes] = (time.perf_counter() - t0) / 10 * 1e6
        del t
    # exact
    t = torch.full((1 << 20,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    want = float(world * (world + 1) // 2)
    check("exact: all_reduce of rank + 1 over 1M floats", bool((t == want).all().item()), f"want {want}")
    dist.barrier()
    dist.destroy_process_group()
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump(res, f)
    return 0


# ---------------------------------------------------------------- the driver

def main():
    ap = argparse.ArgumentParser(description="DDP step and all_reduce timings on CUDA tensors through colld")
    ap.add_argument("--colld", help="the colld binary (a daemon is started on a private socket)")
    ap.add_argument("--backend", choices=("colld", "nccl"), required=True)
    ap.add_argument("--pythonpath", help="torch_colld's directory (backend colld)")
    ap.add_argument("--nccl-lib", help="colld's libnccl.so.2 (backend nccl)")
    ap.add_argument("--torch-path", help="colld's torch-path directory (backend nccl)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--small", default="8,1K,64K")
    ap.add_argument("--large", default="64M,256M")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--cpu", action="store_true", help="a dry run of this script on CPU tensors (backend colld only)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.small = [parse_size(s) for s in args.small.split(",") if s]
    args.large = [parse_size(s) for s in args.large.split(",") if s]
    if args.worker:
        return worker(args)
    if not args.colld:
        ap.error("--colld is needed")
    if args.backend == "colld" and not args.pythonpath:
        ap.error("--backend colld needs --pythonpath (torch_colld's directory)")
    if args.backend == "nccl" and not (args.nccl_lib and args.torch_path):
        ap.error("--backend nccl needs --nccl-lib and --torch-path (docs/nccl.md)")
    probe = subprocess.run([sys.executable, "-c", "import torch; print(int(torch.cuda.is_available()), "
                            "torch.cuda.device_count(), torch.__version__)"], capture_output=True, text=True)
    if probe.returncode:
        print(f"skip: {sys.executable} cannot import torch: {probe.stderr.strip()[-300:]}")
        return 77
    avail, count, version = probe.stdout.split()
    if args.cpu and args.backend == "nccl":
        ap.error("--cpu: backend colld only (ProcessGroupNCCL needs a GPU)")
    if avail != "1" and not args.cpu:
        print(f"skip: no CUDA GPU (torch {version}: torch.cuda.is_available() is False)")
        return 77
    env = dict(os.environ, OMP_NUM_THREADS="1")
    path = [p for p in [os.environ.get("PYTHONPATH")] if p]
    if args.backend == "colld":
        env["PYTHONPATH"] = os.pathsep.join([args.pythonpath] + path)
    else:
        env["PYTHONPATH"] = os.pathsep.join([args.torch_path] + path)
        env["LD_PRELOAD"] = os.path.abspath(args.nccl_lib)
    with tempfile.TemporaryDirectory(prefix="colld-gpu-torch-") as tmp:
        daemon, sock, log = start_daemon(args.colld, tmp)
        env["COLLD_SOCKET"] = sock
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out")
        t0 = time.monotonic()
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--backend", args.backend,
                                   "--rank", str(r), "--world", str(args.ranks), "--store", store, "--out", out,
                                   "--timeout", str(args.timeout), "--small", ",".join(map(str, args.small)),
                                   "--large", ",".join(map(str, args.large))]
                                  + (["--nccl-lib", args.nccl_lib] if args.nccl_lib else [])
                                  + (["--cpu"] if args.cpu else []), env=env)
                 for r in range(args.ranks)]
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1, args.timeout - (time.monotonic() - t0))))
            except subprocess.TimeoutExpired:
                ctl = os.path.join(os.path.dirname(os.path.abspath(args.colld)), "..", "tools", "collctl")
                if os.path.exists(ctl):  # what the daemon says about the hung group, before the kill
                    print(f"timeout after {args.timeout} s: collctl status and doctor", flush=True)
                    for what in ("status", "doctor"):
                        subprocess.run([ctl, "--socket", sock, what], timeout=20)
                for q in procs:
                    q.kill()
                codes.append(f"killed after {args.timeout} s")
        daemon.send_signal(signal.SIGTERM)
        try:
            drc = daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            drc = "killed"
        if all(c == 77 for c in codes):
            return 77
        where = "CPU tensors (--cpu dry run)" if args.cpu else f"GPU 0 of {count}"
        label = f"gpu_torch {args.backend}, {args.ranks} ranks on {where}, torch {version}"
        if any(c != 0 for c in codes):
            print(f"FAIL {label}: ranks exited with {codes}; daemon log tail:\n" + open(log).read()[-3000:])
            return 1
        res = [json.load(open(f"{out}.{r}")) for r in range(args.ranks)]
    ok = drc == 0
    print(f"{label}: daemon exit {drc}")
    for i, (name, _, _) in enumerate(res[0]["checks"]):
        good = all(r["checks"][i][1] for r in res)
        detail = "; ".join(sorted({r["checks"][i][2] for r in res if r["checks"][i][2]}))
        print(f"  {'ok  ' if good else 'FAIL'} {name}{': ' + detail if detail else ''}")
        ok = ok and good
    n = args.ranks
    print(f"  {'size':>9} {'µs per call':>12} {'busbw GB/s':>11}   (slowest rank; small: each call synchronized, "
          "median of 200; large: 10 back to back)")
    for kind in ("small", "large"):
        for size in (args.small if kind == "small" else args.large):
            us = max(r[kind][str(size)] for r in res)
            bw = 2 * (n - 1) / n * size / (us * 1e-6) / 1e9
            print(f"  {fmt_size(size):>9} {us:>12.1f} {bw:>11.2f}   {args.backend} {kind}")
    print(f"gpu_torch {args.backend}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
