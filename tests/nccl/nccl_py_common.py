"""nccl_py_common: what the Python tests of colld's libnccl.so.2 share (test_nccl_torch.py,
test_pynccl.py): a colld daemon on a private socket, the unique id handed over through a file, and
which libnccl files a process has mapped. Standard library only."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from colld_daemon import start_daemon, stop_daemon  # noqa: E402,F401  (tests/colld_daemon.py)


def run_ranks(argv_of_rank, n, env, timeout):
    """Run n rank processes (argv_of_rank(r) each); True when every one exits 0 within timeout s."""
    t0 = time.monotonic()
    procs = [subprocess.Popen(argv_of_rank(r), env=env) for r in range(n)]
    ok = True
    for r, p in enumerate(procs):
        try:
            rc = p.wait(timeout=max(1, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print(f"rank {r} did not finish within {timeout} s", flush=True)
            return False
        if rc != 0:
            print(f"rank {r} exited with {rc}", flush=True)
            ok = False
    return ok


def put_file(path, data):
    """Write data to path whole (aside, then renamed), for the others' get_file."""
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)


def get_file(path, timeout=60):
    """Wait for put_file's path and return its bytes."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"no {path} within {timeout} s")
        time.sleep(0.01)
    with open(path, "rb") as f:
        return f.read()


def mapped_nccl():
    """The real paths of every file named libnccl* that this process has mapped."""
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libnccl"):
                paths.add(os.path.realpath(parts[5].strip()))
    return paths


def other_nccls(colld_lib):
    """NVIDIA NCCL libraries a test must never load: the one in the ld.so cache (the CUDA toolkit's
    lib folder on this project's machines), /usr/local/cuda's, and any wheel's nvidia/nccl/lib on
    sys.path; as real paths, colld's excluded."""
    found = set()
    try:
        out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            if "libnccl" in line and "=>" in line:
                found.add(line.split("=>", 1)[1].strip())
    except (OSError, subprocess.SubprocessError):
        pass
    for d in ["/usr/local/cuda/lib", "/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu"] + \
             [os.path.join(p, "nvidia", "nccl", "lib") for p in sys.path if p]:
        if os.path.isdir(d):
            found.update(os.path.join(d, f) for f in os.listdir(d) if f.startswith("libnccl.so"))
    mine = os.path.realpath(colld_lib)
    return sorted({os.path.realpath(p) for p in found if os.path.exists(p)} - {mine})
