#!/usr/bin/env python3
"""waits.py: what waiting costs a colld client: context switches and CPU time per step (issue 25).

    .venv/bin/python bench/waits.py [--build DIR]... [--ranks 2,4] [--rounds 3]
                                    [--cases ddp,loop8,loop64k,perf] [--steps 100] [--iters 2000]

Each --build (default `build`) is a CMake build directory with server/colld, tools/colld-perf and
bindings/torch/python (torch_colld); give two or more to compare builds (before/after) in one run,
labelled A, B, ...: per round every build runs every case, in alternating order (A B, then B A,
...), each with a fresh daemon of its own, so that the load of this shared machine falls on both. Gloo runs once per round
beside them (the first build's torch_colld is imported, unused) as the reference.

Cases, each with N processes (--ranks) joined by a file store, torch.set_num_threads(1):

  ddp      --steps DistributedDataParallel steps of a 4-layer 256-wide float32 MLP (264 K
           parameters, batch 32, buckets of 0.25 MiB: 5 all-reduces per step through the engine,
           overlapping backward), after 10 warm-up steps;
  loop8    --iters blocking dist.all_reduce of 8 B (colld's fast path);
  loop64k  --iters / 4 blocking dist.all_reduce of 64 KiB (colld's engine path);
  perf     colld-perf (the C client alone, no torch) -z 1 -c 0: all-reduce float32 8 B .. 256 KiB
           (x8), --iters calls per size after 200 (out of place, then in place); its own time
           per call, with its ranks' context switches and CPU from getrusage(RUSAGE_CHILDREN).

Per rank, around the timed part (after a barrier): getrusage(RUSAGE_SELF) (every thread of the
process: user + system CPU, voluntary and involuntary context switches) and the wall time; rank 0
also reads the daemon's /proc/PID/stat (CPU) and /proc/PID/task/*/status (context switches).
Printed per case, world size and backend, the median over the rounds of: wall µs per step (the
slowest rank), the median step (p50, the slowest rank's), each rank's CPU µs per step, each rank's involuntary and voluntary context
switches per 100 steps (mean over ranks), and the daemon's CPU µs and context switches per 100
steps. An involuntary switch is what sched_yield costs when another thread can run: the number to
watch when ranks outnumber CPUs.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from colld_daemon import start_daemon, stop_daemon  # noqa: E402  (tests/colld_daemon.py)

HERE = os.path.dirname(os.path.abspath(__file__))


def usage_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu": r.ru_utime + r.ru_stime, "vol": r.ru_nvcsw, "invol": r.ru_nivcsw, "wall": time.perf_counter()}


def usage_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu": r.ru_utime + r.ru_stime, "vol": r.ru_nvcsw, "invol": r.ru_nivcsw, "wall": time.perf_counter()}


def usage_daemon(pid):
    """The daemon's CPU seconds and context switches, summed over its threads from /proc
    (schedstat's run time in ns: the 10 ms ticks of /proc/PID/stat are too coarse here)."""
    if not pid:
        return None
    cpu, vol, invol = 0.0, 0, 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for t in tasks:
        try:
            cpu += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0]) / 1e9
            for line in open(f"/proc/{pid}/task/{t}/status"):
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    invol += int(line.split()[1])
        except OSError:
            pass  # a thread that just exited
    return {"cpu": cpu, "vol": vol, "invol": invol}


def delta(a, b):
    return {k: b[k] - a[k] for k in a} if a and b else None


# ---------------------------------------------------------------- the ranks

def worker(args):
    import torch
    import torch.distributed as dist
    import torch_colld  # noqa: F401  (registers "colld"; unused for gloo)

    torch.set_num_threads(1)
    dist.init_process_group(args.backend, init_method=f"file://{args.store}", rank=args.rank, world_size=args.world)
    daemon = int(os.environ.get("WAITS_DAEMON_PID", "0")) if args.rank == 0 else 0
    if args.case == "ddp":
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(256, 256), torch.nn.ReLU())])
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        x, y = torch.randn(32, 256), torch.randn(32, 256)

        def step():
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()

        steps, warm = args.steps, 10
    else:
        n = 2 if args.case == "loop8" else 16384
        t = torch.ones(n)

        def step():
            dist.all_reduce(t)

        steps, warm = (args.iters if args.case == "loop8" else max(10, args.iters // 4)), 100
    for _ in range(warm):
        step()
    dist.barrier()
    d0, u0 = usage_daemon(daemon), usage_self()
    times = [0.0] * steps
    clock = time.perf_counter
    for i in range(steps):
        t0 = clock()
        step()
        times[i] = clock() - t0
    u1 = usage_self()
    dist.barrier()
    d1 = usage_daemon(daemon)
    out = {"rank": args.rank, "steps": steps, "self": delta(u0, u1), "daemon": delta(d0, d1),
           "p50": statistics.median(times)}
    with open(f"{args.out}.{args.rank}", "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- the driver

def run_torch(build, backend, case, world, args, tmp):
    """One case with `world` ranks; returns per-rank results, or None when a rank failed."""
    daemon, sock, _ = start_daemon(os.path.join(build, "server", "colld"), tmp)
    try:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out")
        if os.path.exists(store):
            os.unlink(store)
        env = dict(os.environ, COLLD_SOCKET=sock, OMP_NUM_THREADS="1", WAITS_DAEMON_PID=str(daemon.pid),
                   PYTHONPATH=os.pathsep.join([os.path.join(build, "bindings", "torch", "python")] +
                                              [p for p in [os.environ.get("PYTHONPATH")] if p]))
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(r),
                                   "--world", str(world), "--store", store, "--out", out, "--backend", backend,
                                   "--case", case, "--steps", str(args.steps), "--iters", str(args.iters)], env=env)
                 for r in range(world)]
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=600))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        if any(codes):
            print(f"  {case} {backend} {world} ranks ({build}): ranks exited with {codes}", flush=True)
            return None
        return [json.load(open(f"{out}.{r}")) for r in range(world)]
    finally:
        stop_daemon(daemon, tmp, quiet=True)


PERF_SIZES = [8, 64, 512, 4096, 32768, 262144]


def run_perf(build, world, args, tmp):
    """colld-perf's C client; its ranks' usage from getrusage(RUSAGE_CHILDREN)."""
    daemon, sock, _ = start_daemon(os.path.join(build, "server", "colld"), tmp)
    try:
        d0, u0 = usage_daemon(daemon.pid), usage_children()
        cmd = [os.path.join(build, "tools", "colld-perf"), "-p", str(world), "-b", "8", "-e", "256K", "-f", "8",
               "-z", "1", "-c", "0", "-n", str(args.iters), "-w", "200", "--socket", sock, "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        u1, d1 = usage_children(), usage_daemon(daemon.pid)
        if r.returncode:
            print(f"  perf {world} ranks ({build}): colld-perf exited with {r.returncode}: {r.stderr[-500:]}", flush=True)
            return None
        js = json.loads(r.stdout)
        calls = 2 * len(PERF_SIZES) * (args.iters + 200)  # out of place and in place, warm-up included
        times = {}
        for row in js.get("rows", js.get("results", [])):
            size = row.get("size") or row.get("bytes")
            t = row.get("time_us", row.get("oop_time_us"))
            if t is None and isinstance(row.get("out_of_place"), dict):
                t = row["out_of_place"].get("time_us")
            times[int(size)] = float(t)
        return {"steps": calls, "self": delta(u0, u1), "daemon": delta(d0, d1), "times": times, "world": world}
    finally:
        stop_daemon(daemon, tmp, quiet=True)


def summarise(res):
    """One run's numbers: per step, per rank."""
    if res is None:
        return None
    if isinstance(res, dict):  # colld-perf: every rank together
        n, w = res["steps"], res["world"]
        s, d = res["self"], res["daemon"]
        return {"wall_us": None, "p50_us": None, "cpu_us": s["cpu"] / n / w * 1e6, "invol": s["invol"] / n / w * 100,
                "vol": s["vol"] / n / w * 100, "d_cpu_us": d["cpu"] / n * 1e6 if d else None,
                "d_csw": (d["vol"] + d["invol"]) / n * 100 if d else None, "times": res["times"]}
    n = res[0]["steps"]
    d = res[0]["daemon"]
    return {"wall_us": max(r["self"]["wall"] for r in res) / n * 1e6,
            "p50_us": max(r["p50"] for r in res) * 1e6,
            "cpu_us": statistics.mean(r["self"]["cpu"] for r in res) / n * 1e6,
            "invol": statistics.mean(r["self"]["invol"] for r in res) / n * 100,
            "vol": statistics.mean(r["self"]["vol"] for r in res) / n * 100,
            "d_cpu_us": d["cpu"] / n * 1e6 if d else None,
            "d_csw": (d["vol"] + d["invol"]) / n * 100 if d else None}


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="append", help="a CMake build directory (repeat to compare builds)")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="ddp,loop8,loop64k,perf")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--no-gloo", action="store_true", help="skip the Gloo reference")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    builds = args.build or ["build"]
    cases = args.cases.split(",")
    for c in cases:
        if c not in ("ddp", "loop8", "loop64k", "perf"):
            ap.error(f"unknown case {c!r}")
    for b in builds:
        for p in ("server/colld", "tools/colld-perf"):
            if not os.access(os.path.join(b, p), os.X_OK):
                ap.error(f"{b} has no {p} (build it first)")
        if not os.path.isdir(os.path.join(b, "bindings", "torch", "python", "torch_colld")) and cases != ["perf"]:
            ap.error(f"{b} has no bindings/torch/python/torch_colld (torch_colld was not built there)")
    try:
        import torch  # noqa: F401
    except ImportError:
        ap.error(f"{sys.executable} has no torch: run it with .venv/bin/python (make deps)")
    worlds = [int(x) for x in args.ranks.split(",")]
    print(f"machine: {os.cpu_count()} CPUs, load average {open('/proc/loadavg').read().split()[:3]}, "
          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}", flush=True)
    # (case, world, label) -> [summary per round]
    got = {}
    labels = [f"{chr(65 + i)}" for i in range(len(builds))]
    with tempfile.TemporaryDirectory(prefix="colld-waits-") as tmp:
        for rnd in range(args.rounds):
            order = list(range(len(builds)))
            if rnd % 2:
                order.reverse()
            for case in cases:
                for world in worlds:
                    runs = [(labels[i], builds[i], "colld") for i in order]
                    if case != "perf" and not args.no_gloo:
                        runs.append(("gloo", builds[0], "gloo"))
                    for label, build, backend in runs:
                        if case == "perf":
                            s = summarise(run_perf(build, world, args, tmp))
                        else:
                            s = summarise(run_torch(build, backend, case, world, args, tmp))
                        if s:
                            got.setdefault((case, world, label), []).append(s)
            print(f"round {rnd + 1}/{args.rounds} done, load average {open('/proc/loadavg').read().split()[:3]}",
                  flush=True)
    for i, b in enumerate(builds):
        print(f"{labels[i]} = {b}")
    steps_name = {"ddp": "step", "loop8": "call", "loop64k": "call", "perf": "call"}
    for case in cases:
        for world in worlds:
            print(f"\n{case}, {world} ranks: median of {args.rounds} rounds [min-max]; per {steps_name[case]}, per rank "
                  f"(context switches per 100 {steps_name[case]}s)")
            print(f"{'':6} {'wall µs':>20} {'p50 µs':>20} {'CPU µs':>20} {'invol. csw':>22} {'vol. csw':>20} "
                  f"{'daemon CPU µs':>14} {'daemon csw':>11}")
            for label in labels + ["gloo"]:
                rows = got.get((case, world, label))
                if not rows:
                    continue

                def col(key, spec, width):
                    v = [r[key] for r in rows if r[key] is not None]
                    if not v:
                        return f"{'-':>{width}}"
                    return f"{fmt(statistics.median(v), spec)} [{fmt(min(v), spec)}-{fmt(max(v), spec)}]".rjust(width)

                print(f"{label:6} {col('wall_us', '.1f', 20)} {col('p50_us', '.1f', 20)} {col('cpu_us', '.1f', 20)} "
                      f"{col('invol', '.0f', 22)} "
                      f"{col('vol', '.0f', 20)} {col('d_cpu_us', '.1f', 14)} {col('d_csw', '.0f', 11)}")
            if case == "perf":
                print(f"  colld-perf time per call (µs, out of place), median [min-max] of the rounds:")
                for size in PERF_SIZES:
                    line = f"  {size:>8} B"
                    for label in labels:
                        v = [r["times"].get(size) for r in got.get((case, world, label), []) if r["times"].get(size)]
                        if v:
                            line += f"   {label} {statistics.median(v):8.2f} [{min(v):.2f}-{max(v):.2f}]"
                    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
