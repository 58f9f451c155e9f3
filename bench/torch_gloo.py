#!/usr/bin/env python3
"""torch_gloo.py: torch.distributed all_reduce through colld against Gloo, in one run (issue 16 item 5; torch 2.x).

    bench/torch_gloo.sh [--build DIR] [--ranks 2,4] [--sizes 8:64M] [--rounds 3]

(the shell script builds colld and torch_colld and runs this driver with the project's .venv
Python, torch 2.x, and --colld/--pythonpath; the driver starts a private daemon). Per world size it starts that many processes joined by a file store; each
makes the default group on "colld" and a second group of the same ranks on "gloo". Per size
(powers of 8 from --sizes' low end, plus 4 KiB and 16 MiB, float32 elements, at least one) each
round times, in turn:

  gloo      dist.all_reduce(t, group=gloo) on a torch.empty tensor
  colld     dist.all_reduce(t) on a torch.empty tensor (libcolld stages it)
  colld-zc  dist.all_reduce(t) on a torch_colld.empty tensor (zero copy)
            (the default group is made with TORCH_COLLD_INLINE_BYTES=65536: small calls issued on
            the caller's thread, an opt-in, docs/torch.md)
  zc-worker the same on a third group, of "colld" made with TORCH_COLLD_INLINE_BYTES=0 (the
            default): every call through the group's worker thread, on that group's own
            torch_colld.empty tensor

blocking, in place, SUM: `iters` calls after up to 10 warm-up calls (all ranks agree on the count), the mean
time per call on the slowest rank. The backends alternate within each round so that the
machine's load falls on all three alike; the result per backend is the median over --rounds.
Prints one table per world size with the ratios gloo/colld and gloo/colld-zc, and the issue's
targets (>= 50x at <= 4 KiB and >= 4x at >= 16 MiB on the zero-copy path).

With --ddp STEPS (after the sizes): STEPS DistributedDataParallel steps (forward, backward, SGD) of
a 4-layer 1024-wide float32 MLP (3.2 M parameters, 12.6 MiB of gradients, batch 32, 4 MiB
buckets) on each of: colld with its buckets in colld memory (torch_colld's allocateTensor),
colld with DDP_DISABLE_COMM_MEM=1 (buckets in torch's memory: staged), and gloo; models made
afresh per round, the order rotating; the mean time per step on the slowest rank, the median
over --rounds, and colld_client_stats' zero-copy and staged counts over the timed steps.
"""
import argparse
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


def sizes_between(lo, hi):
    out, s = set(), lo
    while s <= hi:
        out.add(s)
        s *= 8
    out |= {x for x in (4 * KIB, 16 * MIB, hi) if lo <= x <= hi}
    return sorted(out)


def iters_for(nbytes):
    """Calls per timing: about 16 MiB moved per timing at large sizes, at most 400 small ones."""
    return max(3, min(400, (16 * MIB) // max(nbytes, 1)))


def fmt_size(n):
    for unit, div in (("MiB", MIB), ("KiB", KIB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def worker(args):
    import torch
    import torch.distributed as dist
    import torch_colld

    torch.set_num_threads(1)
    os.environ["TORCH_COLLD_INLINE_BYTES"] = "65536"  # read when a group's backend starts
    dist.init_process_group("colld", init_method=f"file://{args.store}", rank=args.rank, world_size=args.world)
    gloo = dist.new_group(list(range(args.world)), backend="gloo")
    os.environ["TORCH_COLLD_INLINE_BYTES"] = "0"  # read when a group's backend starts
    handoff = dist.new_group(list(range(args.world)), backend="colld")
    del os.environ["TORCH_COLLD_INLINE_BYTES"]
    world = args.world
    results = []  # (size, backend, seconds per call) on the slowest rank, one per round

    def timed(t, group, iters):
        for _ in range(min(iters, 10)):  # warm-up (the staging region, the fast path, caches)
            dist.all_reduce(t, group=group)
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)  # the slowest rank
        return dt.item()

    warm = torch.ones(2)  # once per backend before the first size: connections, threads, caches
    for group in (gloo, None, handoff):
        for _ in range(200):
            dist.all_reduce(warm, group=group)
    for nbytes in args.sizes:
        n = max(1, nbytes // 4)
        iters = iters_for(n * 4)
        plain = torch.ones(n)
        zc = torch_colld.empty(n)
        zc.fill_(1.0)
        zw = torch_colld.empty(n, group=handoff)
        zw.fill_(1.0)
        cases = (("gloo", plain, gloo), ("colld", plain, None), ("colld-zc", zc, None), ("zc-worker", zw, handoff))
        for _ in range(args.rounds):
            for name, t, group in cases:
                results.append((n * 4, name, timed(t, group, iters)))
        # The values after every call of every round: world^(calls) would overflow, so check a
        # fresh exact call on each backend instead.
        for name, t, group in cases:
            t.fill_(float(args.rank + 1))
            dist.all_reduce(t, group=group)
            want = float(world * (world + 1) // 2)
            if not bool((t == want).all()):
                print(f"rank {args.rank}: {name} {n * 4} B: wrong result {t[:4].tolist()}, want {want}", flush=True)
                return 1
    ddp = ddp_steps(torch, dist, torch_colld, args, gloo) if args.ddp else []
    dist.destroy_process_group()
    if args.rank == 0:
        with open(args.out, "w") as f:
            for size, name, sec in results:
                f.write(f"{size}\t{name}\t{sec!r}\n")
            for name, sec, zc, staged in ddp:
                f.write(f"ddp\t{name}\t{sec!r}\t{zc}\t{staged}\n")
    return 0


def ddp_steps(torch, dist, torch_colld, args, gloo):
    """--ddp: DDP steps with buckets in colld memory, in torch's memory (staged), and on gloo."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model():
        torch.manual_seed(7)
        layers = []
        for _ in range(3):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.Tanh()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(1024, 64))

    g = torch.Generator().manual_seed(args.rank)
    x, y = torch.randn(32, 1024, generator=g), torch.randn(32, 64, generator=g)
    out = []
    cases = [("colld-buckets", "0", None), ("colld-staged", "1", None), ("gloo", "1", gloo)]
    for rnd in range(args.rounds):
        for name, disable, group in cases[rnd % 3:] + cases[:rnd % 3]:
            os.environ["DDP_DISABLE_COMM_MEM"] = disable
            net = DDP(model(), bucket_cap_mb=4, process_group=group)
            opt = torch.optim.SGD(net.parameters(), lr=0.01)

            def step():
                opt.zero_grad()
                torch.nn.functional.mse_loss(net(x), y).backward()
                opt.step()

            for _ in range(3):  # warm-up; DDP rebuilds its buckets at the second step
                step()
            dist.barrier(group=gloo)
            s0 = torch_colld.memory_stats()
            t0 = time.perf_counter()
            for _ in range(args.ddp):
                step()
            dt = torch.tensor([(time.perf_counter() - t0) / args.ddp], dtype=torch.float64)
            s1 = torch_colld.memory_stats()
            dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
            out.append((name, dt.item(), s1["zero_copy"] - s0["zero_copy"], s1["staged"] - s0["staged"]))
            del net, opt
    return out


def report(world, path, rounds):
    rows, ddp = {}, {}
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if f[0] == "ddp":
            ddp.setdefault(f[1], []).append((float(f[2]), int(f[3]), int(f[4])))
            continue
        rows.setdefault(int(f[0]), {}).setdefault(f[1], []).append(float(f[2]))
    print(f"\n{world} processes, blocking float32 all_reduce SUM in place, median of {rounds} rounds "
          "(µs per call, slowest rank)")
    print(f"{'size':>9} {'gloo':>10} {'colld':>10} {'colld-zc':>10} {'zc-worker':>10} {'gloo/colld':>11} "
          f"{'gloo/colld-zc':>14} {'zc-worker/zc':>13}")
    verdict = []
    for size in sorted(rows):
        med = {k: statistics.median(v) * 1e6 for k, v in rows[size].items()}
        r1, r2 = med["gloo"] / med["colld"], med["gloo"] / med["colld-zc"]
        print(f"{fmt_size(size):>9} {med['gloo']:>10.1f} {med['colld']:>10.1f} {med['colld-zc']:>10.1f} "
              f"{med['zc-worker']:>10.1f} {r1:>10.1f}x {r2:>13.1f}x {med['zc-worker'] / med['colld-zc']:>12.2f}x")
        if size <= 4 * KIB:
            verdict.append((size, r2, 50.0))
        elif size >= 16 * MIB:
            verdict.append((size, r2, 4.0))
    for size, r, target in verdict:
        print(f"  target {fmt_size(size)}: colld-zc {r:.1f}x gloo, want >= {target:.0f}x: "
              f"{'met' if r >= target else 'NOT met'}")
    if ddp:
        print(f"\n{world} processes, DDP steps (ms per step, slowest rank, median of {rounds} rounds; "
              "colld_client_stats over the timed steps of each round)")
        gloo = statistics.median(v[0] for v in ddp["gloo"])
        for name, runs in ddp.items():
            med = statistics.median(v[0] for v in runs)
            print(f"  {name:>14}: {med * 1e3:8.2f} ms  gloo/this {gloo / med:5.2f}x  zero-copy all-reduces "
                  f"{[v[1] for v in runs]}, staged {[v[2] for v in runs]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--colld")
    ap.add_argument("--pythonpath")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="8:64M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--store")
    ap.add_argument("--out")
    ap.add_argument("--size-list")
    ap.add_argument("--ddp", type=int, default=0, help="also time this many DDP steps per case and round")
    args = ap.parse_args()
    if args.worker:
        args.sizes = [int(x) for x in args.size_list.split(",")]
        return worker(args)
    lo, hi = (parse_size(x) for x in args.sizes.split(":"))
    sizes = sizes_between(lo, hi)
    with tempfile.TemporaryDirectory(prefix="colld-torch-bench-") as tmp:
        daemon, sock, _ = start_daemon(args.colld, tmp, output=True)
        env = dict(os.environ, COLLD_SOCKET=sock, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([args.pythonpath] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        rc = 0
        try:
            for world in (int(x) for x in args.ranks.split(",")):
                store, out = os.path.join(tmp, f"store-{world}"), os.path.join(tmp, f"out-{world}.tsv")
                procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(r),
                                           "--world", str(world), "--store", store, "--out", out,
                                           "--rounds", str(args.rounds), "--ddp", str(args.ddp),
                                           "--size-list", ",".join(map(str, sizes))], env=env)
                         for r in range(world)]
                codes = [p.wait() for p in procs]
                if any(codes):
                    print(f"{world} processes: ranks exited with {codes}")
                    rc = 1
                    continue
                report(world, out, args.rounds)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
    return rc


if __name__ == "__main__":
    sys.exit(main())
