#!/usr/bin/env python3
"""test_pynccl: vLLM's pynccl pattern over colld's libnccl.so.2 (issue 25 item 4).

vLLM drives NCCL from Python through ctypes alone (vllm/distributed/device_communicators/
pynccl_wrapper.py): it loads libnccl.so.2 by path with ctypes.CDLL, declares each function's
argument types (the 128-byte ncclUniqueId passed by value, the communicator as a void pointer,
buffers as the addresses of tensors, the CUDA stream as a void pointer), checks every result with
ncclGetErrorString, and decodes ncclGetVersion's integer into "2.19.3". This test is such a caller,
written for colld (no vLLM code): rank 0 makes the unique id and hands it over (a file here; vLLM
broadcasts it over a CPU process group), every rank joins with ncclCommInitRank, then runs
ncclAllReduce (in and out of place, sum and max), ncclAllGather, ncclReduceScatter, ncclBroadcast
(each rank the root in turn), ncclSend/ncclRecv in a group (a ring) and alone (a pipeline: rank r
receives from r - 1, then sends to r + 1, as vLLM's pipeline stages do), for float32, float16,
bfloat16, int32, int64 and uint8, every element compared exactly (small integers), and
ncclCommDestroy.

Host mode (the default, this machine): the buffers are host memory (colld's extension: NVIDIA's
NCCL takes device memory only) and the stream argument is NULL; the workers import no torch and
must map no libnccl but colld's. 2 and 3 ranks against a colld daemon on a private socket. Then,
with --torch-path and a python that has torch, 2 ranks whose buffers are torch CPU tensors (their
data_ptr, stream NULL): the workers import torch first, as vLLM does, with colld's library loaded
as docs/nccl.md says, and ctypes.CDLL(path) then gives the library torch already bound to.

--cuda: the buffers are torch CUDA tensors (their data_ptr) and the stream
torch.cuda.current_stream().cuda_stream, every rank on GPU 0 (NVIDIA's NCCL refuses two ranks on
one GPU: "Duplicate GPU detected"), each result read back after a stream synchronize. The workers
import torch, so they load colld's library as docs/nccl.md says (LD_PRELOAD, and --torch-path first
on PYTHONPATH) and check that no other libnccl is mapped. Skipped (77) without a CUDA GPU.

Usage: test_pynccl.py --lib BUILD/bindings/nccl/lib/libnccl.so.2 --colld BUILD/server/colld
           [--torch-path BUILD/bindings/nccl/torch-path] [--cuda] [--ranks 2,3]
Exit 0 when every rank checked every result, 1 otherwise, 77 (skip) for --cuda without a GPU.
"""
import argparse
import ctypes
import importlib.util
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
# The NCCL library through ctypes, the way pynccl declares it
# ------------------------------------------------------------------------------------------------

ncclResult_t = ctypes.c_int
ncclComm_t = ctypes.c_void_p
cudaStream_t = ctypes.c_void_p
buffer_t = ctypes.c_void_p
ncclDataType_t = ctypes.c_int
ncclRedOp_t = ctypes.c_int


class ncclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


# name: (restype, argtypes)
FUNCTIONS = {
    "ncclGetErrorString": (ctypes.c_char_p, [ncclResult_t]),
    "ncclGetLastError": (ctypes.c_char_p, [ncclComm_t]),
    "ncclGetVersion": (ncclResult_t, [ctypes.POINTER(ctypes.c_int)]),
    "ncclGetUniqueId": (ncclResult_t, [ctypes.POINTER(ncclUniqueId)]),
    "ncclCommInitRank": (ncclResult_t, [ctypes.POINTER(ncclComm_t), ctypes.c_int, ncclUniqueId, ctypes.c_int]),
    "ncclAllReduce": (ncclResult_t, [buffer_t, buffer_t, ctypes.c_size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                     cudaStream_t]),
    "ncclAllGather": (ncclResult_t, [buffer_t, buffer_t, ctypes.c_size_t, ncclDataType_t, ncclComm_t, cudaStream_t]),
    "ncclReduceScatter": (ncclResult_t, [buffer_t, buffer_t, ctypes.c_size_t, ncclDataType_t, ncclRedOp_t,
                                         ncclComm_t, cudaStream_t]),
    "ncclBroadcast": (ncclResult_t, [buffer_t, buffer_t, ctypes.c_size_t, ncclDataType_t, ctypes.c_int, ncclComm_t,
                                     cudaStream_t]),
    "ncclSend": (ncclResult_t, [buffer_t, ctypes.c_size_t, ncclDataType_t, ctypes.c_int, ncclComm_t, cudaStream_t]),
    "ncclRecv": (ncclResult_t, [buffer_t, ctypes.c_size_t, ncclDataType_t, ctypes.c_int, ncclComm_t, cudaStream_t]),
    "ncclGroupStart": (ncclResult_t, []),
    "ncclGroupEnd": (ncclResult_t, []),
    "ncclCommDestroy": (ncclResult_t, [ncclComm_t]),
}

SUM, PROD, MAX, MIN, AVG = range(5)


class Nccl:
    """libnccl.so.2 loaded by path; each call checked."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        for name, (restype, argtypes) in FUNCTIONS.items():
            f = getattr(self.lib, name)
            f.restype, f.argtypes = restype, argtypes

    def check(self, name, *args):
        r = getattr(self.lib, name)(*args)
        if r != 0:
            err = self.lib.ncclGetErrorString(r).decode()
            last = self.lib.ncclGetLastError(None).decode()  # colld's detail
            raise RuntimeError(f"{name}: NCCL error {r}: {err}: {last}")

    def version(self):
        v = ctypes.c_int()
        self.check("ncclGetVersion", ctypes.byref(v))
        s = str(v.value)  # 21903 -> "2.19.3", as pynccl decodes it
        return f"{s[0]}.{s[1:3].lstrip('0') or '0'}.{s[3:].lstrip('0') or '0'}"

    def unique_id(self):
        uid = ncclUniqueId()
        self.check("ncclGetUniqueId", ctypes.byref(uid))
        return uid

    def init_rank(self, world, uid, rank):
        comm = ncclComm_t()
        self.check("ncclCommInitRank", ctypes.byref(comm), world, uid, rank)
        return comm


# ------------------------------------------------------------------------------------------------
# Data: small integers in each type, as bytes
# ------------------------------------------------------------------------------------------------

# name: (ncclDataType_t, bytes per element, struct code or None for bfloat16)
TYPES = {"float32": (7, 4, "f"), "float16": (6, 2, "e"), "bfloat16": (9, 2, None), "int32": (2, 4, "i"),
         "int64": (4, 8, "q"), "uint8": (1, 1, "B")}


def encode(dtype, values):
    _, size, code = TYPES[dtype]
    if code:
        return bytearray(struct.pack(f"<{len(values)}{code}", *values))
    f32 = struct.pack(f"<{len(values)}f", *values)  # bfloat16: the upper half of each float32 (exact)
    out = bytearray(2 * len(values))
    out[0::2], out[1::2] = f32[2::4], f32[3::4]
    return out


def decode(dtype, data):
    _, size, code = TYPES[dtype]
    n = len(data) // size
    if code:
        return list(struct.unpack(f"<{n}{code}", data))
    f32 = bytearray(4 * n)
    f32[2::4], f32[3::4] = data[0::2], data[1::2]
    return list(struct.unpack(f"<{n}f", f32))


def inputs(rank, n, salt):
    """Rank r's n inputs: 0..4, different per rank, element and call ((7 i + 3 r + salt) mod 5, whose
    period in i is 5)."""
    period = [(i * 7 + rank * 3 + salt) % 5 for i in range(5)]
    return (period * (n // 5 + 1))[:n]


class HostBuffers:
    """Host memory: the addresses of bytearrays; no stream."""
    stream = None

    def make(self, data):
        return data

    def ptr(self, buf):
        return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))

    def read(self, buf):
        return bytes(buf)


class TorchBuffers:
    """torch tensors (their data_ptr), as vLLM passes them: on GPU 0 with the current stream
    (--cuda), or in host memory with no stream (torch-cpu)."""

    def __init__(self, cuda):
        import torch
        self.torch, self.cuda, self.stream = torch, cuda, None
        if cuda:
            torch.cuda.set_device(0)
            self.stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def make(self, data):
        t = self.torch.frombuffer(bytearray(data), dtype=self.torch.uint8)
        return t.to("cuda:0") if self.cuda else t

    def ptr(self, buf):
        return buf.data_ptr()

    def read(self, buf):
        if self.cuda:
            self.torch.cuda.current_stream().synchronize()
        return buf.cpu().numpy().tobytes()


# ------------------------------------------------------------------------------------------------
# One rank
# ------------------------------------------------------------------------------------------------

def rank_main(args):
    r, w = args.rank, args.world
    bufs = HostBuffers() if args.mode == "host" else TorchBuffers(args.mode == "cuda")
    nccl = Nccl(args.lib)
    mapped = common.mapped_nccl()
    if mapped != {os.path.realpath(args.lib)}:
        print(f"rank {r}: libnccl files mapped: {sorted(mapped)}, want only colld's", flush=True)
        return 1
    version = nccl.version()
    if version != "2.19.3":
        print(f"rank {r}: ncclGetVersion decodes to {version}, want colld's 2.19.3", flush=True)
        return 1
    uid_file = os.path.join(args.dir, "unique-id")
    if r == 0:
        common.put_file(uid_file, bytes(nccl.unique_id()))
    uid = ncclUniqueId.from_buffer_copy(common.get_file(uid_file))
    comm = nccl.init_rank(w, uid, r)
    stream = bufs.stream
    checked, wrong = 0, []

    def compare(what, dtype, got_bytes, want):
        nonlocal checked
        got = decode(dtype, got_bytes)
        checked += len(want)
        if got != want:  # 3.0 == 3: the floating-point types compare with the integers they hold
            bad = [i for i in range(len(want)) if got[i] != want[i]][:3]
            wrong.append(f"{what} {dtype}: elements {bad} are {[got[i] for i in bad]}, want {[want[i] for i in bad]}")

    salt = 0
    for dtype, (nt, size, _) in TYPES.items():
        for n in (1, 1000) if args.mode == "torch-cpu" else (1, 1000, 70001):  # torch-cpu: the plumbing
            salt += 1
            for op, fold in ((SUM, sum), (MAX, max)):  # all-reduce, out of and in place
                for inplace in (False, True):
                    src = bufs.make(encode(dtype, inputs(r, n, salt)))
                    dst = src if inplace else bufs.make(bytearray(n * size))
                    nccl.check("ncclAllReduce", bufs.ptr(src), bufs.ptr(dst), n, nt, op, comm, stream)
                    want = [fold(vals) for vals in zip(*(inputs(q, n, salt) for q in range(w)))]
                    compare(f"allreduce {'max' if op == MAX else 'sum'}{' in place' if inplace else ''} n={n}",
                            dtype, bufs.read(dst), want)
            src = bufs.make(encode(dtype, inputs(r, n, salt)))  # all-gather
            dst = bufs.make(bytearray(w * n * size))
            nccl.check("ncclAllGather", bufs.ptr(src), bufs.ptr(dst), n, nt, comm, stream)
            compare(f"allgather n={n}", dtype, bufs.read(dst), sum((inputs(q, n, salt) for q in range(w)), []))
            src = bufs.make(encode(dtype, inputs(r, w * n, salt)))  # reduce-scatter: block r of the sum
            dst = bufs.make(bytearray(n * size))
            nccl.check("ncclReduceScatter", bufs.ptr(src), bufs.ptr(dst), n, nt, SUM, comm, stream)
            total = [sum(vals) for vals in zip(*(inputs(q, w * n, salt) for q in range(w)))]
            compare(f"reducescatter n={n}", dtype, bufs.read(dst), total[r * n:(r + 1) * n])
            for root in range(w):  # broadcast, out of place
                src = bufs.make(encode(dtype, inputs(r, n, salt + root)))
                dst = bufs.make(bytearray(n * size))
                nccl.check("ncclBroadcast", bufs.ptr(src), bufs.ptr(dst), n, nt, root, comm, stream)
                compare(f"broadcast root {root} n={n}", dtype, bufs.read(dst), inputs(root, n, salt + root))
            nxt, prv = (r + 1) % w, (r - 1) % w  # a ring of sends and receives in one group
            src = bufs.make(encode(dtype, inputs(r, n, salt)))
            dst = bufs.make(bytearray(n * size))
            nccl.check("ncclGroupStart")
            nccl.check("ncclSend", bufs.ptr(src), n, nt, nxt, comm, stream)
            nccl.check("ncclRecv", bufs.ptr(dst), n, nt, prv, comm, stream)
            nccl.check("ncclGroupEnd")
            compare(f"send/recv ring n={n}", dtype, bufs.read(dst), inputs(prv, n, salt))
        # a pipeline without groups: rank r receives from r - 1, adds r, sends to r + 1
        n = 1000
        buf = bufs.make(encode(dtype, [0] * n) if r else encode(dtype, inputs(0, n, salt)))
        if r > 0:
            nccl.check("ncclRecv", bufs.ptr(buf), n, nt, r - 1, comm, stream)
            compare("pipeline recv", dtype, bufs.read(buf),
                    [v + sum(range(r)) for v in inputs(0, n, salt)])
            buf = bufs.make(encode(dtype, [v + r for v in decode(dtype, bufs.read(buf))]))
        if r < w - 1:
            nccl.check("ncclSend", bufs.ptr(buf), n, nt, r + 1, comm, stream)
    nccl.check("ncclCommDestroy", comm)
    mapped = common.mapped_nccl()
    if mapped != {os.path.realpath(args.lib)}:
        wrong.append(f"libnccl files mapped at the end: {sorted(mapped)}")
    print(f"rank {r} of {w} ({args.mode} buffers, NCCL {version}): {checked} elements "
          f"checked, {len(wrong)} wrong", flush=True)
    for line in wrong[:10]:
        print(f"rank {r}: {line}", flush=True)
    return 1 if wrong else 0


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--colld", required=True)
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--torch-path")
    ap.add_argument("--ranks", default="2,3")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--dir")
    ap.add_argument("--mode", choices=("host", "torch-cpu", "cuda"))
    args = ap.parse_args()
    if args.rank is not None:
        return rank_main(args)

    others = common.other_nccls(args.lib)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # The library path may name the folders of the libraries colld's needs (a machine without
    # them installed, bench/gpu-carry.sh); a folder that holds any libnccl is dropped from it.
    keep = [d for d in env.pop("LD_LIBRARY_PATH", "").split(os.pathsep)
            if d and not (os.path.isdir(d) and any(f.startswith("libnccl.so") for f in os.listdir(d)))]
    if keep:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(keep)
    torch_env = None  # colld's library loaded as docs/nccl.md says, for workers that import torch
    if args.torch_path and importlib.util.find_spec("torch"):  # found, not imported: no NCCL loaded here
        torch_env = dict(env, LD_PRELOAD=os.path.abspath(args.lib),
                         PYTHONPATH=os.pathsep.join([os.path.abspath(args.torch_path)] +
                                                    [p for p in [os.environ.get("PYTHONPATH")] if p]))
    plan = [("host", int(w)) for w in args.ranks.split(",")]
    if args.cuda:
        if not torch_env:
            print(f"skip: --cuda needs --torch-path and a python with torch ({sys.executable} has none)")
            return 77
        probe = subprocess.run([sys.executable, "-c", "import torch; print(int(torch.cuda.is_available()))"],
                               env=torch_env, capture_output=True, text=True, timeout=120)
        if probe.returncode != 0:
            print(f"skip: --cuda: {sys.executable} cannot import torch: {probe.stderr.strip()[-300:]}")
            return 77
        if probe.stdout.strip() != "1":
            print("skip: --cuda needs a CUDA GPU and torch.cuda.is_available() is False here: the tensors' "
                  "data_ptr and the current stream through colld's library are not shown; test_pynccl shows "
                  "the same calls on host memory and on torch CPU tensors")
            return 77
        plan = [("cuda", int(w)) for w in args.ranks.split(",")]
    elif torch_env:
        plan.append(("torch-cpu", 2))
    else:
        print("not run: the ranks on torch CPU tensors (no --torch-path, or no torch in this python)")
    ok = True
    with tempfile.TemporaryDirectory(prefix="colld-pynccl-") as tmp:
        daemon, sock, _ = common.start_daemon(args.colld, tmp, ("--log-level", "info"))
        try:
            for mode, world in plan:
                d = os.path.join(tmp, f"{mode}-{world}")
                os.mkdir(d)
                t0 = time.monotonic()
                good = common.run_ranks(lambda r: [sys.executable, os.path.abspath(__file__), "--lib", args.lib,
                                                   "--colld", args.colld, "--rank", str(r), "--world", str(world),
                                                   "--dir", d, "--mode", mode],
                                        world, dict(env if mode == "host" else torch_env, COLLD_SOCKET=sock), 120)
                print(f"{world} ranks, {mode} buffers: {'ok' if good else 'FAILED'} ({time.monotonic() - t0:.1f} s)",
                      flush=True)
                ok = ok and good
        finally:
            ok = common.stop_daemon(daemon, tmp) and ok
    print(f"NVIDIA NCCL libraries on this machine (none of them mapped by a rank): {others}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
