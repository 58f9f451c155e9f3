#!/usr/bin/env python3
"""test_example: examples/torch_ddp.py runs as docs/torch.md says, with torchrun, against a real colld.

Starts colld on a private socket, then:

  1. the documented command: `torchrun --standalone --nproc-per-node 2 examples/torch_ddp.py`
     (the torchrun beside this Python, the project's .venv/bin/torchrun), with COLLD_SOCKET and
     PYTHONPATH set as docs/torch.md says; it must exit 0 and print its "OK" line (DDP through
     colld: the loss fell and every rank's parameters are identical);
  2. torch's autoload of torch_colld (its "torch.backends" entry point): one process that never
     imports torch_colld calls init_process_group("colld") and all_reduce, and must find
     torch_colld loaded by `import torch` itself;
  3. a broken install (a copy of the package directory without its compiled extension):
     `import torch` must still work, and init_process_group("colld") must raise an error that
     names torch_colld and why it could not be loaded, not torch's bare "Unknown c10d backend".

Then the daemon must stop cleanly. Exit 0 when all passed, 1 otherwise, 77 (skip) without
torchrun or torch beside this Python.

Usage: .venv/bin/python test_example.py --colld BUILD/server/colld --pythonpath BUILD/bindings/torch/python
           --example examples/torch_ddp.py [--steps N]
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from colld_daemon import start_daemon  # noqa: E402  (tests/colld_daemon.py)

AUTOLOAD = r"""
import sys, torch, torch.distributed as dist
loaded = "torch_colld" in sys.modules  # by import torch itself: this program never imports it
dist.init_process_group("colld", init_method="file://" + sys.argv[1], rank=0, world_size=1)
t = torch.arange(4, dtype=torch.float32)
dist.all_reduce(t)
ok = loaded and dist.get_backend() == "colld" and t.tolist() == [0.0, 1.0, 2.0, 3.0]
dist.destroy_process_group()
print("autoload:", "loaded by import torch" if loaded else "NOT loaded by import torch", "-", "OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
"""

BROKEN = r"""
import sys, torch, torch.distributed as dist
try:
    dist.init_process_group("colld", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    print("broken install: init_process_group(\"colld\") did not fail - FAILED")
    sys.exit(1)
except Exception as e:
    msg = str(e)
print("broken install:", msg[:300])
ok = "torch_colld" in msg and "could not be loaded" in msg and "_torch_colld" in msg
print("OK" if ok else "FAILED: the error does not say torch_colld could not be loaded, and why")
sys.exit(0 if ok else 1)
"""


def run(name, cmd, env, timeout):
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        print(f"FAIL {name}: no end within {timeout} s\n{(e.stdout or '')[-2000:]}{(e.stderr or '')[-2000:]}")
        return False
    out = r.stdout + r.stderr
    ok = r.returncode == 0 and "OK" in r.stdout
    print(f"{'ok  ' if ok else 'FAIL'} {name} ({time.monotonic() - t0:.1f} s, exit {r.returncode})")
    if not ok:
        print(out[-4000:])
    else:
        print("     " + r.stdout.strip().splitlines()[-1])
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--colld", required=True)
    ap.add_argument("--pythonpath", required=True)
    ap.add_argument("--example", required=True)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.access(torchrun, os.X_OK):
        print(f"skip: no {torchrun} (make deps installs torch 2.x into .venv)")
        return 77
    if subprocess.run([sys.executable, "-c", "import torch.distributed"], capture_output=True).returncode:
        print(f"skip: {sys.executable} cannot import torch.distributed")
        return 77
    with tempfile.TemporaryDirectory(prefix="colld-torch-example-") as tmp:
        daemon, sock, log = start_daemon(args.colld, tmp, output=True)
        env = dict(os.environ, COLLD_SOCKET=sock, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([args.pythonpath] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
        ok = run("torchrun --standalone --nproc-per-node 2 examples/torch_ddp.py",
                 [torchrun, "--standalone", "--nproc-per-node", "2", args.example, "--steps", str(args.steps)],
                 env, 180)
        ok = run("init_process_group(\"colld\") without import torch_colld",
                 [sys.executable, "-c", AUTOLOAD, os.path.join(tmp, "store")], env, 120) and ok
        broken = os.path.join(tmp, "broken")
        shutil.copytree(args.pythonpath, broken)
        for f in os.listdir(os.path.join(broken, "torch_colld")):
            if f.startswith("_torch_colld") and f.endswith(".so"):
                os.unlink(os.path.join(broken, "torch_colld", f))
        ok = run("init_process_group(\"colld\") with torch_colld's extension missing",
                 [sys.executable, "-c", BROKEN, os.path.join(tmp, "store2")],
                 dict(env, PYTHONPATH=broken), 120) and ok
        daemon.send_signal(signal.SIGTERM)
        try:
            rc = daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            rc = daemon.wait()
        if rc != 0:
            print(f"FAIL the daemon exited with {rc}; its log:\n" + open(log).read()[-4000:])
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
