#!/usr/bin/env python3
"""test_nccl_torch: PyTorch 2.x's own "nccl" backend links colld's libnccl.so.2 (issue 25 item 3).

PyTorch's wheel links libtorch_cuda.so against libnccl.so.2 with a DT_RPATH to the wheel's NVIDIA
NCCL (nvidia/nccl/lib), which the loader searches before LD_LIBRARY_PATH, and `import torch` also
opens a libnccl.so.2 by path itself (torch/__init__.py preloads the CUDA libraries it finds under
sys.path). docs/nccl.md's way round both: LD_PRELOAD of colld's libnccl.so.2 (the soname is then
taken, and libtorch_cuda's NEEDED entry is that library) and colld's torch-path first on PYTHONPATH
(its nccl/lib/libnccl.so.2 is colld's, so torch's preload opens the library already loaded).

The driver, with no NCCL of its own loaded:
  - reads libtorch_cuda.so's ELF (not hard-coded): every undefined dynamic symbol named nccl*, and
    its DT_RPATH; colld's library must define every one of them;
  - starts a colld daemon on a private socket and runs a worker python that way, with LD_BIND_NOW=1
    (every relocation of every library bound at load: an NCCL symbol colld lacks fails the import).
The worker imports torch, then checks: /proc/self/maps holds no libnccl but colld's (NVIDIA's in the
ld.so cache, /usr/local/cuda's and the wheel's, listed by the driver, never); each symbol resolves
(dlsym: the global scope, and libtorch_cuda's own scope opened RTLD_NOW | RTLD_NOLOAD; dladdr) into
colld's library; torch's runtime NCCL version (ProcessGroupNCCL.get_runtime_nccl_version, which
calls ncclGetVersion) is colld's 2.19.3, while torch.cuda.nccl.version() is the version of the
nccl.h torch was compiled with (2.28.9 for torch 2.11's wheel), a constant, not the library's;
torch.cuda.nccl.unique_id() (torch's own call of ncclGetUniqueId) is an id colld's daemon issued
(a one-rank ncclCommInitRank with it, then an all-reduce, succeed).

With a CUDA GPU (torch.cuda.is_available()), 2 processes then form torch.distributed's "nccl"
process group on that ONE GPU (NVIDIA's NCCL refuses two ranks on one GPU: "Duplicate GPU
detected") and run its collectives, every result exact. Without one that part is skipped with a
message: the import and the binding are all this machine can show.

Usage: test_nccl_torch.py --lib BUILD/bindings/nccl/lib/libnccl.so.2
           --torch-path BUILD/bindings/nccl/torch-path --colld BUILD/server/colld
Exit 0 when every check passed, 1 otherwise, 77 (skip) without torch or without libtorch_cuda.so.
"""
import argparse
import ctypes
import importlib.util
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nccl_py_common as common  # noqa: E402

# ------------------------------------------------------------------------------------------------
# ELF: a shared library's dynamic symbols and its search path, read from the file
# ------------------------------------------------------------------------------------------------

SHT_DYNAMIC, SHT_DYNSYM = 6, 11
DT_RPATH, DT_RUNPATH = 15, 29


def elf_dynamic(path):
    """(undefined symbol names, defined symbol names, DT_RPATH entries, DT_RUNPATH entries) of a
    64-bit little-endian ELF shared library, from its .dynsym and .dynamic sections."""
    with open(path, "rb") as f:
        ident = f.read(64)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", ident, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", ident, 0x3A)
        f.seek(shoff)
        raw = f.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQIIQQ", raw, i * shentsize) for i in range(shnum)]

        def read(sec):
            f.seek(sec[4])
            return f.read(sec[5])

        def string(table, off):
            return table[off:table.index(b"\0", off)].decode()

        undefined, defined, rpath, runpath = set(), set(), [], []
        for sec in sections:
            if sec[1] == SHT_DYNSYM:
                strtab, data = read(sections[sec[6]]), read(sec)
                for off in range(24, len(data), 24):  # entry 0 is the null symbol
                    name, _info, _other, shndx = struct.unpack_from("<IBBH", data, off)
                    (defined if shndx else undefined).add(string(strtab, name))
            elif sec[1] == SHT_DYNAMIC:
                strtab, data = read(sections[sec[6]]), read(sec)
                for off in range(0, len(data), 16):
                    tag, val = struct.unpack_from("<qQ", data, off)
                    if tag == DT_RPATH:
                        rpath += string(strtab, val).split(":")
                    elif tag == DT_RUNPATH:
                        runpath += string(strtab, val).split(":")
        return undefined, defined, rpath, runpath


# ------------------------------------------------------------------------------------------------
# The worker: one python process with colld's library loaded as docs/nccl.md says
# ------------------------------------------------------------------------------------------------

class Checks:
    def __init__(self, who):
        self.who, self.failed = who, 0

    def true(self, what, ok, detail=""):
        print(f"{self.who}: {'ok' if ok else 'FAILED'}: {what}{': ' + str(detail) if detail else ''}", flush=True)
        self.failed += not ok


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def dladdr_file(addr):
    """The real path of the object holding address addr (dladdr)."""
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except AttributeError:  # glibc before 2.34 keeps it in libdl
        dladdr = ctypes.CDLL("libdl.so.2").dladdr
    dladdr.argtypes, dladdr.restype = [ctypes.c_void_p, ctypes.POINTER(DlInfo)], ctypes.c_int
    info = DlInfo()
    if not dladdr(addr, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(info.dli_fname.decode())


def symbol_address(lib, name):
    try:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    except AttributeError:
        return None


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def worker(args):
    ck = Checks("torch")
    plan = json.loads(args.plan)
    mine, others = plan["colld"], plan["others"]
    before = common.mapped_nccl()
    ck.true("before `import torch` only colld's libnccl is mapped (LD_PRELOAD)", before == {mine}, sorted(before))
    t0 = time.monotonic()
    import torch
    import torch.distributed as dist
    ck.true(f"import torch {torch.__version__} with LD_BIND_NOW=1 ({time.monotonic() - t0:.1f} s): every "
            "relocation bound", True)
    mapped = common.mapped_nccl()
    ck.true("after `import torch` only colld's libnccl is mapped", mapped == {mine}, sorted(mapped))
    ck.true("none of NVIDIA's NCCL libraries is mapped", not (mapped & set(others)),
            f"{sorted(mapped & set(others))} mapped of {others}")

    # Every NCCL symbol libtorch_cuda.so needs, looked up the way the loader binds it.
    glob = ctypes.CDLL(None, mode=os.RTLD_NOW)
    tcuda = ctypes.CDLL(plan["libtorch_cuda"], mode=os.RTLD_NOW | os.RTLD_NOLOAD)
    wrong = []
    for name in plan["symbols"]:
        g, t = symbol_address(glob, name), symbol_address(tcuda, name)
        where = dladdr_file(g) if g else None
        if not g or g != t or where != mine:
            wrong.append(f"{name}: global {g and hex(g)} in {where}, libtorch_cuda's scope {t and hex(t)}")
    ck.true(f"all {len(plan['symbols'])} NCCL symbols of libtorch_cuda.so resolve to colld's library "
            "(dlsym in the global scope and in libtorch_cuda's, dladdr)", not wrong, "; ".join(wrong))
    impl = ctypes.string_at(symbol_address(glob, "colld_nccl_implementation")).decode()  # a char array
    ck.true("colld_nccl_implementation", impl.startswith("colld libnccl.so.2"), impl)

    # Versions: what torch reports, and what the library says.
    ver = ctypes.c_int()
    glob.ncclGetVersion(ctypes.byref(ver))
    runtime = torch._C._distributed_c10d.ProcessGroupNCCL.get_runtime_nccl_version()
    ck.true("ncclGetVersion is colld's 21903", ver.value == 21903, ver.value)
    ck.true("torch's runtime NCCL version (ProcessGroupNCCL.get_runtime_nccl_version) is colld's",
            tuple(runtime) == (2, 19, 3), runtime)
    built = torch.cuda.nccl.version()
    ck.true("torch.cuda.nccl.version() is the nccl.h torch was built with (a compile-time constant)",
            tuple(built[:3]) == tuple(plan["built_with"]) if plan["built_with"] else True,
            f"{built}, the wheel's nccl.h says {plan['built_with']}")
    ck.true("torch.distributed.is_nccl_available()", dist.is_nccl_available())

    # torch's own ncclGetUniqueId call reaches colld's daemon: the id is one it issued.
    uid = torch.cuda.nccl.unique_id()
    ck.true("torch.cuda.nccl.unique_id() gives 128 bytes", isinstance(uid, bytes) and len(uid) == 128, type(uid))
    comm = ctypes.c_void_p()
    u = UniqueId.from_buffer_copy(uid)
    glob.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    r = glob.ncclCommInitRank(ctypes.byref(comm), 1, u, 0)
    glob.ncclGetLastError.restype = ctypes.c_char_p
    ck.true("ncclCommInitRank (1 rank) with torch's unique id: colld's daemon issued it", r == 0,
            f"{r}: {glob.ncclGetLastError(None).decode()}")
    if r == 0:
        x = (ctypes.c_float * 4)(1, 2, 3, 4)
        glob.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        r = glob.ncclAllReduce(x, x, 4, 7, 0, comm, None)
        ck.true("an all-reduce on it", r == 0 and list(x) == [1, 2, 3, 4], list(x))
        ck.true("ncclCommDestroy", glob.ncclCommDestroy(comm) == 0)

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not gpus:
        try:
            dist.init_process_group("nccl", init_method="file://" + plan["store"], rank=0, world_size=1)
            refusal = "none"
        except ValueError as e:
            refusal = str(e)
        ck.true("without a GPU ProcessGroupNCCL refuses to start", "no GPUs found" in refusal, refusal)
        print("torch: no CUDA GPU (torch.cuda.is_available() is False): ProcessGroupNCCL needs one, so its "
              "collectives, communicator creation and stream handling through colld are not shown here; "
              "shown: the import, the binding of every NCCL symbol, the versions, torch's ncclGetUniqueId",
              flush=True)
    ck.true("nothing else loaded a libnccl since", common.mapped_nccl() == {mine}, sorted(common.mapped_nccl()))
    print("RESULT " + json.dumps({"gpus": gpus}), flush=True)
    return 1 if ck.failed else 0


def gpu_rank(args):
    """One rank of torch.distributed's "nccl" process group; every rank on GPU 0."""
    ck = Checks(f"gpu rank {args.rank}")
    import torch
    import torch.distributed as dist
    r, w = args.rank, args.world
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", init_method="file://" + args.store, rank=r, world_size=w)
    n = 70001
    base = torch.arange(n, dtype=torch.int64, device=dev) % 5

    def val(rank, dtype):
        return (base + rank).to(dtype)

    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64):
        x = val(r, dtype)
        dist.all_reduce(x)
        want = sum(val(q, torch.int64) for q in range(w)).to(dtype)
        ck.true(f"all_reduce {dtype}", torch.equal(x, want))
        out = torch.empty(w * n, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(out, val(r, dtype))
        ck.true(f"all_gather_into_tensor {dtype}", torch.equal(out, torch.cat([val(q, dtype) for q in range(w)])))
        rs = torch.empty(n, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(rs, torch.cat([val(r + q, dtype) for q in range(w)]))
        ck.true(f"reduce_scatter_tensor {dtype}", torch.equal(rs, sum(val(q + r, torch.int64)
                                                                     for q in range(w)).to(dtype)))
        b = val(r, dtype)
        dist.broadcast(b, src=w - 1)
        ck.true(f"broadcast {dtype}", torch.equal(b, val(w - 1, dtype)))
        a2a = torch.empty(w * 1000, dtype=dtype, device=dev)
        dist.all_to_all_single(a2a, torch.cat([val(10 * r + q, dtype)[:1000] for q in range(w)]))
        ck.true(f"all_to_all_single {dtype}", torch.equal(a2a, torch.cat([val(10 * q + r, dtype)[:1000]
                                                                          for q in range(w)])))
    got = torch.empty(n, device=dev)
    ops = [dist.P2POp(dist.isend, val(r, torch.float32), (r + 1) % w),
           dist.P2POp(dist.irecv, got, (r - 1) % w)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    torch.cuda.synchronize()
    ck.true("batch_isend_irecv ring", torch.equal(got, val((r - 1) % w, torch.float32)))
    dist.barrier()
    ck.true("only colld's libnccl is mapped", common.mapped_nccl() == {args.colld_real})
    dist.destroy_process_group()
    return 1 if ck.failed else 0


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------

def wheel_header_version(torch_dir):
    """(major, minor, patch) of the nccl.h in the wheel's nvidia/nccl/include, or None."""
    h = os.path.join(os.path.dirname(torch_dir), "nvidia", "nccl", "include", "nccl.h")
    if not os.path.exists(h):
        return None
    v = {}
    for line in open(h, errors="replace"):
        p = line.split()
        if len(p) >= 3 and p[0] == "#define" and p[1] in ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"):
            v[p[1]] = int(p[2])
    return [v["NCCL_MAJOR"], v["NCCL_MINOR"], v["NCCL_PATCH"]] if len(v) == 3 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--torch-path", required=True)
    ap.add_argument("--colld", required=True)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--plan")
    ap.add_argument("--gpu-rank", dest="rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--store")
    args = ap.parse_args()
    args.colld_real = os.path.realpath(args.lib)
    if args.worker:
        return worker(args)
    if args.rank is not None:
        return gpu_rank(args)

    spec = importlib.util.find_spec("torch")  # finds the package without importing it (no NCCL loaded)
    if spec is None or not spec.origin:
        print(f"skip: {sys.executable} has no torch (run `make deps`: requirements.txt installs it into .venv)")
        return 77
    torch_dir = os.path.dirname(spec.origin)
    libtorch_cuda = os.path.join(torch_dir, "lib", "libtorch_cuda.so")
    if not os.path.exists(libtorch_cuda):
        print(f"skip: {torch_dir} is a torch without CUDA (no lib/libtorch_cuda.so), so without NCCL")
        return 77
    ck = Checks("driver")
    undefined, _, rpath, runpath = elf_dynamic(libtorch_cuda)
    symbols = sorted(s for s in undefined if s.startswith("nccl"))
    _, colld_defined, _, _ = elf_dynamic(args.colld_real)
    ck.true(f"libtorch_cuda.so needs {len(symbols)} NCCL symbols", len(symbols) > 0, " ".join(symbols))
    missing = [s for s in symbols if s not in colld_defined]
    ck.true("colld's libnccl.so.2 defines every one", not missing, " ".join(missing))
    nccl_rpath = [p for p in rpath if "nccl" in p]
    print(f"driver: libtorch_cuda.so DT_RPATH {rpath}, DT_RUNPATH {runpath}", flush=True)
    if nccl_rpath and not runpath:
        print("driver: its DT_RPATH names the wheel's NCCL and it has no DT_RUNPATH: the loader searches that "
              "RPATH before LD_LIBRARY_PATH, so LD_LIBRARY_PATH alone cannot make torch load colld's "
              "libnccl.so.2; LD_PRELOAD can", flush=True)
    others = common.other_nccls(args.lib)
    print(f"driver: NVIDIA NCCL libraries on this machine, never to be loaded: {others}", flush=True)
    plan = {"colld": args.colld_real, "others": others, "symbols": symbols, "libtorch_cuda": libtorch_cuda,
            "built_with": wheel_header_version(torch_dir)}

    with tempfile.TemporaryDirectory(prefix="colld-nccl-torch-") as tmp:
        daemon, sock, _ = common.start_daemon(args.colld, tmp, ("--log-level", "info"))
        env = dict(os.environ, COLLD_SOCKET=sock, LD_PRELOAD=os.path.abspath(args.lib), LD_BIND_NOW="1",
                   PYTHONPATH=os.pathsep.join([os.path.abspath(args.torch_path)] +
                                              [p for p in [os.environ.get("PYTHONPATH")] if p]),
                   OMP_NUM_THREADS="1")
        env.pop("LD_LIBRARY_PATH", None)
        common_args = [sys.executable, os.path.abspath(__file__), "--lib", args.lib, "--torch-path",
                       args.torch_path, "--colld", args.colld]
        try:
            t0 = time.monotonic()
            plan["store"] = os.path.join(tmp, "store-1")
            p = subprocess.run(common_args + ["--worker", "--plan", json.dumps(plan)], env=env, timeout=120,
                               stdout=subprocess.PIPE, text=True)
            sys.stdout.write(p.stdout)
            ck.true(f"the worker ({time.monotonic() - t0:.1f} s)", p.returncode == 0, f"exit {p.returncode}")
            result = [json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            gpus = result[0]["gpus"] if result else 0
            if gpus:
                store = os.path.join(tmp, "store")
                ok = common.run_ranks(lambda r: common_args + ["--gpu-rank", str(r), "--world", "2", "--store",
                                                               store], 2, env, 300)
                ck.true("torch.distributed \"nccl\": 2 ranks on one GPU", ok)
            else:
                print("driver: skipped the 2-rank \"nccl\" process group on one GPU: no CUDA GPU here", flush=True)
        finally:
            ck.true("colld exited cleanly", common.stop_daemon(daemon, tmp))
    return 1 if ck.failed else 0


if __name__ == "__main__":
    sys.exit(main())
