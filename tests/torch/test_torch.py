#!/usr/bin/env python3
"""test_torch: torch_colld (bindings/torch) through torch.distributed (torch 2.x) against a real colld daemon.

The driver starts `colld` on a private socket (as tests/integration/harness.c does), then runs each
scenario as N real processes of this file (`--worker`), joined with a FileStore in the test's
private directory, and checks their exit codes:

  ops   (2 and 4 ranks): every collective (all_reduce, reduce, broadcast, all_gather, reduce_scatter,
        gather, scatter, all_to_all, barrier) x every dtype colld has, value-checked exactly; async
        work with get_future; coalesced ops; subgroups; non-contiguous tensors; the clear errors
        of what is not supported.
  premul (2, 3 and 4 ranks): PREMUL_SUM (torch.distributed._make_nccl_premul_sum), each rank with its
        own factor (a float or a one-element tensor): all_reduce, reduce, reduce_scatter(_tensor),
        coalesced, every dtype, exact; averaging by 1 / world in the float types.
  ddp   (2 and 4 ranks): one DistributedDataParallel training step: every rank's gradients are
        bit-identical, and equal to a single-process reference's; after an optimizer step the
        parameters are identical too. Then DDP's buckets in colld memory (torch_colld's
        allocateTensor): the all-reduces zero copy (colld_client_stats), the gradients still
        right; with DDP_DISABLE_COMM_MEM=1 staged; torch_colld.colld_memory and its cap.
  inline (2 and 3 ranks): small operations issued on the caller's thread when the worker is
        idle: in call order with queued ones, Work.wait(timeout) with late peers, colld's error.
  kill  (3 ranks): rank 1 is killed with SIGKILL after a first all-reduce; the others' next
        all-reduce (wait() and its future) raises a RuntimeError naming rank 1.
  exit, zerocopy: a rank leaving with an operation in flight; torch_colld.empty's tensors.
  p2p   (2, 3 and 4 ranks): send, recv, isend/irecv, batch_isend_irecv (ring exchanges, PyTorch's
        rank-ordered blocking sends, tags, a rank sending to itself), all_to_all_single with uneven
        split sizes and all_to_all of unequal tensors, every dtype, exact; the refusals (any source).
  p2pfail (2 ranks): tags posted in another order, a tagged send against an untagged receive,
        sizes that differ: RuntimeErrors carrying colld's COLLD_ERR_MISMATCH detail.
  p2pkill (3 ranks): rank 1 is killed with SIGKILL while ranks 0 and 2 wait to receive from it:
        both fail with COLLD_ERR_PEER_LOST naming rank 1.
  api   (2 and 3 ranks): what torch 2.x adds, on a group made with "cpu:colld": the coalescing
        manager (allgather_into_tensor_coalesced, reduce_scatter_tensor_coalesced, start/end
        coalescing), a batch's one Work and its future, Work.wait(timeout), destroy_process_group
        and _abort_process_group of subgroups.
  split (2, 3 and 4 ranks): torch.distributed.split_group (colld_comm_split of the parent's
        communicator): exact results in the new groups and in the parent at the same time, their
        ranks, sizes and timeout, None for a rank in no split, and a rank in two splits or out of
        range refused on every rank.
  cuda  (2 ranks, only where torch sees a GPU; passed with 2 processes on an H200,
        docs/gpu-testing.md): CUDA tensors, stream-ordered, with a torch_colld built with
        -DCOLLD_TORCH_CUDA=ON.

By default (make test) the scenarios that need no fault of their own run as one 4-rank group
("ops+premul+ddp+zerocopy+p2p+api+split+inline": one start of torch per rank, which costs more
than the scenarios), then kill/3, exit/2, p2pfail/2 and p2pkill/3: 25 to 50 s on 2 cores. With
COLLD_TEST_FULL=1 (make test-full) every scenario runs on its own at every world size above.

Usage: .venv/bin/python test_torch.py --colld BUILD/server/colld --pythonpath BUILD/bindings/torch/python
           [SCENARIO[+SCENARIO...][/WORLD] ...]
       test_torch.py --colld ... --pythonpath ... --upstream tests/torch/upstream_pass.txt
         (PyTorch's own distributed_test.py, through upstream_suite.py: the listed tests must pass; by
         default those tagged "# quick", each test's ranks forked, 18 to 25 s; with COLLD_TEST_FULL=1
         all of them, spawned as upstream's test_distributed_spawn.py does, 10 to 17 min)
Exit 0 when every scenario passed, 1 otherwise, 77 (skip) when torch cannot be imported.
"""
import argparse
import datetime
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from colld_daemon import start_daemon  # noqa: E402  (tests/colld_daemon.py)

# ------------------------------------------------------------------------------------------------
# The worker side (one rank)
# ------------------------------------------------------------------------------------------------

# Every dtype colld reduces, and values that keep each result exact in each of them.
REDUCE_DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"]
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
COUNTS = [1, 1001, 70001]


def rank_input(torch, rank, count, dtype, salt=0):
    """Rank r's input: small positive integers (1..3), different on every rank and element, so
    that a sum, product (<= 3^4), min, max and average of up to 4 ranks is exact in every type."""
    i = torch.arange(count, dtype=torch.int64)
    return ((i + rank * 7 + salt) % 3 + 1).to(getattr(torch, dtype))


def expected_reduce(torch, op, world, count, dtype, salt=0):
    """The exact result of reducing every rank's rank_input with `op`, computed in int64."""
    xs = torch.stack([rank_input(torch, r, count, "int64", salt) for r in range(world)])
    if op == "SUM":
        out = xs.sum(0)
    elif op == "PRODUCT":
        out = xs.prod(0)
    elif op == "MIN":
        out = xs.min(0).values
    elif op == "MAX":
        out = xs.max(0).values
    else:  # AVG: integer average truncates (as NCCL); floats divide exactly (world is 2 or 4)
        if dtype.startswith("float") or dtype == "bfloat16":
            return (xs.sum(0).to(torch.float64) / world).to(getattr(torch, dtype))
        out = xs.sum(0) // world
    return out.to(getattr(torch, dtype))


class Checker:
    """Counts checks and keeps the first failures, so one run reports several."""

    def __init__(self, rank):
        self.rank, self.checks, self.failures = rank, 0, []

    def equal(self, what, got, want):
        self.checks += 1
        if got.dtype != want.dtype or got.shape != want.shape or not bool((got == want).all()):
            self.failures.append(f"rank {self.rank}: {what}: got {got.flatten()[:8].tolist()} "
                                 f"({got.dtype}, {tuple(got.shape)}), want {want.flatten()[:8].tolist()} "
                                 f"({want.dtype}, {tuple(want.shape)})")

    def raises(self, what, fn, text, exc=RuntimeError):
        self.checks += 1
        try:
            fn()
        except exc as e:
            if text not in str(e):
                self.failures.append(f"rank {self.rank}: {what}: {type(e).__name__} without {text!r}: {e}")
            return
        self.failures.append(f"rank {self.rank}: {what}: no {exc.__name__} (want one saying {text!r})")

    def true(self, what, cond):
        self.checks += 1
        if not cond:
            self.failures.append(f"rank {self.rank}: {what}")


def worker_ops(torch, dist, rank, world, ck):
    """Every collective x dtype x count, exact."""
    R = dist.ReduceOp
    for dtype in REDUCE_DTYPES:
        dt = getattr(torch, dtype)
        for count in COUNTS:
            for op in OPS:
                if op == "PRODUCT" and dtype == "int8" and world > 4:
                    continue
                t = rank_input(torch, rank, count, dtype)
                dist.all_reduce(t, op=getattr(R, op))
                ck.equal(f"all_reduce {op} {dtype} x{count}", t, expected_reduce(torch, op, world, count, dtype))
            # reduce to the last rank (SUM and MAX); non-roots keep their input
            for op in ["SUM", "MAX"]:
                t = rank_input(torch, rank, count, dtype, salt=1)
                dist.reduce(t, dst=world - 1, op=getattr(R, op))
                want = (expected_reduce(torch, op, world, count, dtype, salt=1) if rank == world - 1
                        else rank_input(torch, rank, count, dtype, salt=1))
                ck.equal(f"reduce {op} {dtype} x{count} to {world - 1}", t, want)
            # broadcast from the last rank
            t = rank_input(torch, rank, count, dtype, salt=2)
            dist.broadcast(t, src=world - 1)
            ck.equal(f"broadcast {dtype} x{count}", t, rank_input(torch, world - 1, count, dtype, salt=2))
            # all_gather (list) and all_gather_into_tensor
            outs = [torch.zeros(count, dtype=dt) for _ in range(world)]
            dist.all_gather(outs, rank_input(torch, rank, count, dtype, salt=3))
            for r in range(world):
                ck.equal(f"all_gather {dtype} x{count} [{r}]", outs[r], rank_input(torch, r, count, dtype, salt=3))
            flat = torch.zeros(world * count, dtype=dt)
            dist.all_gather_into_tensor(flat, rank_input(torch, rank, count, dtype, salt=4))
            ck.equal(f"all_gather_into_tensor {dtype} x{count}", flat,
                     torch.cat([rank_input(torch, r, count, dtype, salt=4) for r in range(world)]))
            # reduce_scatter (list) and reduce_scatter_tensor: rank r's part p is rank_input(r, salt=10+p)
            for op in ["SUM", "MIN", "AVG"]:
                out = torch.zeros(count, dtype=dt)
                dist.reduce_scatter(out, [rank_input(torch, rank, count, dtype, salt=10 + p) for p in range(world)],
                                    op=getattr(R, op))
                ck.equal(f"reduce_scatter {op} {dtype} x{count}", out,
                         expected_reduce(torch, op, world, count, dtype, salt=10 + rank))
                out = torch.zeros(count, dtype=dt)
                inp = torch.cat([rank_input(torch, rank, count, dtype, salt=20 + p) for p in range(world)])
                dist.reduce_scatter_tensor(out, inp, op=getattr(R, op))
                ck.equal(f"reduce_scatter_tensor {op} {dtype} x{count}", out,
                         expected_reduce(torch, op, world, count, dtype, salt=20 + rank))

    # gather, scatter, all_to_all (lists) and all_to_all_single (equal splits), every dtype
    for dtype in REDUCE_DTYPES:
        dt = getattr(torch, dtype)
        for count in [1, 1001]:
            root = world - 1
            outs = [torch.zeros(count, dtype=dt) for _ in range(world)] if rank == root else None
            dist.gather(rank_input(torch, rank, count, dtype, salt=5), outs, dst=root)
            if rank == root:
                for r in range(world):
                    ck.equal(f"gather {dtype} x{count} [{r}]", outs[r], rank_input(torch, r, count, dtype, salt=5))
            out = torch.zeros(count, dtype=dt)
            dist.scatter(out, [rank_input(torch, 100 + q, count, dtype) for q in range(world)] if rank == 0 else None,
                         src=0)
            ck.equal(f"scatter {dtype} x{count}", out, rank_input(torch, 100 + rank, count, dtype))
            # rank r sends rank_input(r * 10 + q) to rank q
            outs = [torch.zeros(count, dtype=dt) for _ in range(world)]
            dist.all_to_all(outs, [rank_input(torch, rank * 10 + q, count, dtype) for q in range(world)])
            for r in range(world):
                ck.equal(f"all_to_all {dtype} x{count} [{r}]", outs[r], rank_input(torch, r * 10 + rank, count, dtype))
            out = torch.zeros(world * count, dtype=dt)
            dist.all_to_all_single(out, torch.cat([rank_input(torch, rank * 10 + q, count, dtype, salt=1)
                                                   for q in range(world)]))
            ck.equal(f"all_to_all_single {dtype} x{count}", out,
                     torch.cat([rank_input(torch, r * 10 + rank, count, dtype, salt=1) for r in range(world)]))
    t = torch.zeros(2 * world)
    dist.all_to_all_single(t, torch.arange(2 * world, dtype=torch.float32) + 100 * rank,
                           output_split_sizes=[2] * world, input_split_sizes=[2] * world)
    ck.equal("all_to_all_single with equal split sizes given", t,
             torch.tensor([float(2 * rank + k + 100 * r) for r in range(world) for k in range(2)]))

    # Byte-moving collectives take any dtype: bool and complex through broadcast and all_gather.
    for dt in [torch.bool, torch.complex64, torch.int16]:
        src = (torch.arange(1001) % (world + 1) == rank) if dt == torch.bool else \
            (torch.arange(1001) + 100 * rank).to(dt)
        t = src.clone()
        dist.broadcast(t, src=0)
        want = (torch.arange(1001) % (world + 1) == 0) if dt == torch.bool else torch.arange(1001).to(dt)
        ck.equal(f"broadcast {dt}", t, want)
        outs = [torch.zeros(1001, dtype=dt) for _ in range(world)]
        dist.all_gather(outs, src)
        for r in range(world):
            w = (torch.arange(1001) % (world + 1) == r) if dt == torch.bool else (torch.arange(1001) + 100 * r).to(dt)
            ck.equal(f"all_gather {dt} [{r}]", outs[r], w)

    # Zero elements.
    t = torch.zeros(0, dtype=torch.float32)
    dist.all_reduce(t)
    ck.equal("all_reduce of 0 elements", t, torch.zeros(0, dtype=torch.float32))

    # Non-contiguous tensors: a transposed view is reduced in place through a contiguous copy.
    base = (torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank)
    view = base.t()
    ck.true("the transposed view is not contiguous", not view.is_contiguous())
    dist.all_reduce(view)
    want = sum(torch.arange(12, dtype=torch.float32).reshape(3, 4) + r for r in range(world))
    ck.equal("all_reduce of a non-contiguous view (the base tensor)", base, want)
    outs = [torch.zeros(4, 3).t() for _ in range(world)]
    dist.all_gather(outs, (torch.arange(12, dtype=torch.float32).reshape(4, 3) + rank).t())
    for r in range(world):
        ck.equal(f"all_gather into non-contiguous outputs [{r}]", outs[r],
                 (torch.arange(12, dtype=torch.float32).reshape(4, 3) + r).t())

    # Async: many in flight, then wait; the future carries the output tensors.
    works, ts = [], []
    for k in range(8):
        t = rank_input(torch, rank, 1001, "float32", salt=k)
        ts.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    futs = [w.get_future() for w in works]
    for k, (w, f) in enumerate(zip(works, futs)):
        w.wait()
        val = f.wait()
        ck.true(f"async all_reduce {k}: is_completed", w.is_completed() and w.is_success())
        ck.equal(f"async all_reduce {k}", ts[k], expected_reduce(torch, "SUM", world, 1001, "float32", salt=k))
        ck.true(f"async all_reduce {k}: the future's value is the tensor", len(val) == 1 and val[0] is not None
                and bool((val[0] == ts[k]).all()))
    # A future's then() runs once the work is done.
    t = rank_input(torch, rank, 33, "int64")
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    ck.equal("get_future().then()", fut.wait(), expected_reduce(torch, "SUM", world, 33, "int64") * 2)

    # Coalesced: several tensors in one colld group (torch wants one dtype per call).
    shapes = [(5, "bfloat16"), (1001, "bfloat16"), (7, "bfloat16")]
    ts = [rank_input(torch, rank, n, d, salt=k) for k, (n, d) in enumerate(shapes)]
    dist.all_reduce_coalesced(ts, op=R.MAX)
    for k, (t, (n, d)) in enumerate(zip(ts, shapes)):
        ck.equal(f"all_reduce_coalesced MAX {d} x{n}", t, expected_reduce(torch, "MAX", world, n, d, salt=k))
    ins = [rank_input(torch, rank, 3, "int32"), rank_input(torch, rank, 5, "int32", salt=1)]
    outs = [[torch.zeros(3, dtype=torch.int32), torch.zeros(5, dtype=torch.int32)] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(world):
        ck.equal(f"all_gather_coalesced [{r}][0]", outs[r][0], rank_input(torch, r, 3, "int32"))
        ck.equal(f"all_gather_coalesced [{r}][1]", outs[r][1], rank_input(torch, r, 5, "int32", salt=1))

    dist.barrier()

    # Subgroups: each a communicator of its own; every rank calls new_group for every group.
    even = dist.new_group([r for r in range(world) if r % 2 == 0])
    odd = dist.new_group([r for r in range(world) if r % 2 == 1])
    mine, members = (even, [r for r in range(world) if r % 2 == 0]) if rank % 2 == 0 else \
        (odd, [r for r in range(world) if r % 2 == 1])
    t = torch.full((1001,), float(rank + 1))
    dist.all_reduce(t, group=mine)
    ck.equal("all_reduce in a subgroup", t, torch.full((1001,), float(sum(r + 1 for r in members))))
    t = torch.full((3,), float(rank))
    dist.broadcast(t, src=members[-1], group=mine)
    ck.equal("broadcast in a subgroup from its last global rank", t, torch.full((3,), float(members[-1])))
    # interleaved with the world group
    t = torch.ones(17, dtype=torch.int32)
    dist.all_reduce(t)
    ck.equal("all_reduce in the world after subgroups", t, torch.full((17,), world, dtype=torch.int32))
    ck.true("get_backend of a subgroup", dist.get_backend(mine) == dist.get_backend())

    # What is not supported says so.
    ck.raises("all_reduce of bool", lambda: dist.all_reduce(torch.zeros(3, dtype=torch.bool)),
              "dtype Bool is not supported by colld")
    # torch sums complex tensors as their real view (float32 here)
    t = torch.complex(torch.full((3,), float(rank)), torch.ones(3)).to(torch.complex64)
    dist.all_reduce(t)
    ck.equal("all_reduce SUM of complex64", t,
             torch.complex(torch.full((3,), float(sum(range(world)))), torch.full((3,), float(world))))
    ck.raises("all_reduce of int16", lambda: dist.all_reduce(torch.zeros(3, dtype=torch.int16)),
              "dtype Short is not supported by colld")
    ck.raises("all_reduce of uint16", lambda: dist.all_reduce(torch.zeros(3, dtype=torch.uint16)),
              "dtype UInt16 is not supported by colld")
    ck.raises("all_reduce with BAND", lambda: dist.all_reduce(torch.zeros(3, dtype=torch.int32), op=R.BAND),
              "is not supported by colld (SUM, PRODUCT, MIN, MAX, AVG and PREMUL_SUM are")
    ck.raises("broadcast from a root out of range", lambda: dist.broadcast(torch.zeros(3), src=world + 5),
              "")  # torch or colld, either refuses
    # the group still works after the refusals
    t = torch.ones(4)
    dist.all_reduce(t)
    ck.equal("all_reduce after the refused calls", t, torch.full((4,), float(world)))


def expected_premul(torch, world, count, dtype, factors, salt=0):
    """The exact sum over ranks of factors[r] * rank_input(r) (small integers), in int64 or, for a
    fractional factor, float64 (exact: a power of two times small integers)."""
    acc = sum(rank_input(torch, r, count, "float64", salt) * factors[r] for r in range(world))
    return acc.to(getattr(torch, dtype))


def worker_premul(torch, dist, rank, world, ck):
    """PREMUL_SUM (torch.distributed._make_nccl_premul_sum): each rank's own factor multiplies its
    input before the sum. A float factor (rank + 1) and a one-element tensor factor, all_reduce,
    reduce, reduce_scatter(_tensor) and coalesced, every dtype, exact; gradient averaging (factor
    1 / world) in the float types."""
    factors = [float(r + 1) for r in range(world)]
    for dtype in REDUCE_DTYPES:
        dt = getattr(torch, dtype)
        for count in [1, 1001, 70001]:
            t = rank_input(torch, rank, count, dtype, salt=40)
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(factors[rank]))
            ck.equal(f"all_reduce PREMUL_SUM {dtype} x{count}", t,
                     expected_premul(torch, world, count, dtype, factors, salt=40))
            t = rank_input(torch, rank, count, dtype, salt=41)
            dist.reduce(t, dst=0, op=dist._make_nccl_premul_sum(torch.tensor([factors[rank]]).to(dt)))
            want = (expected_premul(torch, world, count, dtype, factors, salt=41) if rank == 0
                    else rank_input(torch, rank, count, dtype, salt=41))
            ck.equal(f"reduce PREMUL_SUM (tensor factor) {dtype} x{count}", t, want)
            out = torch.zeros(count, dtype=dt)
            inp = torch.cat([rank_input(torch, rank, count, dtype, salt=50 + p) for p in range(world)])
            dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(factors[rank]))
            ck.equal(f"reduce_scatter_tensor PREMUL_SUM {dtype} x{count}", out,
                     expected_premul(torch, world, count, dtype, factors, salt=50 + rank))
            out = torch.zeros(count, dtype=dt)
            dist.reduce_scatter(out, [rank_input(torch, rank, count, dtype, salt=60 + p) for p in range(world)],
                                op=dist._make_nccl_premul_sum(factors[rank]))
            ck.equal(f"reduce_scatter PREMUL_SUM {dtype} x{count}", out,
                     expected_premul(torch, world, count, dtype, factors, salt=60 + rank))
            if dtype.startswith("float") or dtype == "bfloat16":
                t = rank_input(torch, rank, count, dtype, salt=42)
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(1.0 / world))
                ck.equal(f"all_reduce PREMUL_SUM 1/world (averaging) {dtype} x{count}", t,
                         expected_premul(torch, world, count, dtype, [1.0 / world] * world, salt=42))
    ts = [rank_input(torch, rank, n, "float32", salt=43 + n) for n in [3, 1001]]
    dist.all_reduce_coalesced(ts, op=dist._make_nccl_premul_sum(factors[rank]))
    for t, n in zip(ts, [3, 1001]):
        ck.equal(f"all_reduce_coalesced PREMUL_SUM float32 x{n}", t,
                 expected_premul(torch, world, n, "float32", factors, salt=43 + n))
    # torch 2.x refuses a factor of two elements itself, when the op is made
    ck.raises("PREMUL_SUM with a two-element factor",
              lambda: dist.all_reduce(torch.zeros(3), op=dist._make_nccl_premul_sum(torch.ones(2))),
              "tensor_factor.numel() == 1")


def worker_ddp(torch, dist, rank, world, ck):
    """One DDP step on a small float64 model: gradients identical on every rank and equal to a
    single-process reference over every rank's batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model():
        torch.manual_seed(1234)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()

    def batch(r):
        g = torch.Generator().manual_seed(100 + r)
        return torch.randn(5, 8, generator=g, dtype=torch.float64), torch.randn(5, 3, generator=g, dtype=torch.float64)

    net = DDP(model(), bucket_cap_mb=0.0005)  # several buckets, so several all-reduces overlap backward
    x, y = batch(rank)
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in net.parameters()])

    # identical on every rank (bit for bit)
    everyone = [torch.zeros_like(grads) for _ in range(world)]
    dist.all_gather(everyone, grads)
    for r in range(world):
        ck.true(f"DDP gradients of rank {r} are bit-identical to rank {rank}'s", bool((everyone[r] == grads).all()))

    # equal to one process's: the mean of every rank's loss gradient
    ref = model()
    loss = sum(torch.nn.functional.mse_loss(ref(xr), yr) for xr, yr in (batch(r) for r in range(world))) / world
    loss.backward()
    want = torch.cat([p.grad.flatten() for p in ref.parameters()])
    ck.true(f"DDP gradients equal the single-process reference (max difference "
            f"{(grads - want).abs().max().item():.3g})", torch.allclose(grads, want, rtol=1e-12, atol=1e-15))

    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    opt.step()
    params = torch.cat([p.detach().flatten() for p in net.parameters()])
    everyone = [torch.zeros_like(params) for _ in range(world)]
    dist.all_gather(everyone, params)
    for r in range(world):
        ck.true(f"parameters of rank {r} after a step are bit-identical", bool((everyone[r] == params).all()))
    return ddp_zero_copy(torch, dist, rank, world, ck, batch)


def ddp_zero_copy(torch, dist, rank, world, ck, batch):
    """DDP's buckets in colld memory (the backend's allocateTensor): buckets above the fast path's
    16 KiB, so that their all-reduces go through the engine, where libcolld counts what it staged
    (colld_client_stats); gradient_as_bucket_view, so that each gradient is a view of its bucket.
    Then the same with torch's switch off (DDP_DISABLE_COMM_MEM=1): staged, still exact. Then
    torch_colld.colld_memory's cap (TORCH_COLLD_ALLOC_MAX_BYTES, 32 MiB in this test): a tensor
    over it comes from torch's allocator, counted, and works. Returns a gradient (a view of a
    bucket) to be checked after destroy_process_group."""
    import torch_colld
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model():
        torch.manual_seed(99)
        layers = [torch.nn.Linear(8, 48), torch.nn.Tanh()]
        for _ in range(3):
            layers += [torch.nn.Linear(48, 48), torch.nn.Tanh()]  # 18.4 KiB of float64 each
        return torch.nn.Sequential(*layers, torch.nn.Linear(48, 3)).double()

    def grads_of(m):
        return torch.cat([p.grad.flatten() for p in m.parameters()])

    pg = dist.distributed_c10d._get_default_group()
    if dist.get_backend() != "colld":
        # "cpu:colld": torch 2.11 sets no default backend for a third-party backend given as
        # device:backend, and DDP then cannot ask it for buckets; the workaround docs/torch.md gives
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
    ref = model()
    loss = sum(torch.nn.functional.mse_loss(ref(xr), yr) for xr, yr in (batch(r) for r in range(world))) / world
    loss.backward()
    want = grads_of(ref)
    kept = None
    for where in ["colld", "torch"]:
        os.environ["DDP_DISABLE_COMM_MEM"] = "0" if where == "colld" else "1"
        a0 = torch_colld.memory_stats()
        # 20 KiB: 2 buckets once rebuilt (here), each above the fast path's 16 KiB
        net = DDP(model(), bucket_cap_mb=0.02, gradient_as_bucket_view=True)
        grads = [p for p in net.parameters()]
        x, y = batch(rank)
        # two steps (without an optimizer, gradients zeroed in between): DDP rebuilds its buckets at
        # the second (bucket_cap_mb applies from then on; the first bucket holds up to 1 MiB)
        torch.nn.functional.mse_loss(net(x), y).backward()
        net.zero_grad(set_to_none=False)
        a1 = torch_colld.memory_stats()
        torch.nn.functional.mse_loss(net(x), y).backward()
        s1 = torch_colld.memory_stats()
        buckets = s1["colld_allocs"] - a0["colld_allocs"]
        in_colld = [in_colld_memory(p.grad.data_ptr()) for p in grads]
        zc, staged = s1["zero_copy"] - a1["zero_copy"], s1["staged"] - a1["staged"]
        print(f"rank {rank}: DDP buckets in {where} memory: {buckets} colld allocations, 2nd backward: {zc} zero-copy "
              f"all-reduces, {staged} staged ({s1['staged_bytes'] - a1['staged_bytes']} bytes)", flush=True)
        if where == "colld":
            ck.true(f"DDP made its buckets in colld memory ({buckets} allocations: 1, then the rebuilt ones)",
                    buckets >= 3)
            ck.true("every gradient (a view of its bucket) lies in colld memory", all(in_colld))
            ck.true(f"the second backward's all-reduces were zero copy ({zc} of them)", zc >= 2)
            ck.true(f"... and none was staged ({staged})", staged == 0)
            kept = (grads[0].grad, grads[0].grad.clone())
        else:
            ck.true(f"with DDP_DISABLE_COMM_MEM=1 no bucket in colld memory ({buckets})", buckets == 0)
            ck.true("... no gradient in colld memory", not any(in_colld))
            ck.true(f"... and the second backward's all-reduces were staged ({staged})", staged >= 2)
        ck.true(f"DDP gradients with buckets in {where} memory equal the single-process reference (max "
                f"difference {(grads_of(net) - want).abs().max().item():.3g})",
                torch.allclose(grads_of(net), want, rtol=1e-12, atol=1e-15))
    os.environ["DDP_DISABLE_COMM_MEM"] = "0"

    # torch_colld.colld_memory(): torch's CPU allocations in colld memory while it is in force,
    # bounded by this process's cap
    f0 = torch_colld.memory_stats()
    with torch_colld.colld_memory():
        t = torch.empty(70001)
        over = torch.empty(9 << 20)  # 36 MiB: over the test's 32 MiB cap
        small = torch.empty(10)
    outside = torch.empty(70001)
    f1 = torch_colld.memory_stats()
    ck.true("colld_memory: a tensor made inside lies in colld memory", in_colld_memory(t.data_ptr()))
    ck.true("colld_memory: not one made after it", not in_colld_memory(outside.data_ptr()))
    ck.true("colld_memory: nor a small one (below min_bytes)", not in_colld_memory(small.data_ptr()))
    ck.true(f"colld_memory: over the cap, torch's memory, counted ({f1['fallbacks'] - f0['fallbacks']}, "
            f"{f1['last_fallback']!r})", not in_colld_memory(over.data_ptr()) and f1["fallbacks"] > f0["fallbacks"]
            and "TORCH_COLLD_ALLOC_MAX_BYTES" in f1["last_fallback"])
    t.copy_(rank_input(torch, rank, 70001, "float32"))
    over[:1001].copy_(rank_input(torch, rank, 1001, "float32"))
    dist.all_reduce(t)
    dist.all_reduce(over[:1001])
    ck.equal("all_reduce in colld_memory's tensor", t, expected_reduce(torch, "SUM", world, 70001, "float32"))
    ck.equal("all_reduce in the fallen-back tensor", over[:1001], expected_reduce(torch, "SUM", world, 1001, "float32"))
    return kept


def worker_inline(torch, dist, rank, world, ck):
    """Small operations issued on the caller's thread when the group's worker is idle (run_inline):
    they are, and still run in call order with the queued ones, keep Work.wait(timeout) and carry
    colld's error detail."""
    import torch_colld
    s0 = torch_colld.memory_stats()
    for i in range(100):
        t = torch.full((8,), float(rank + i))
        dist.all_reduce(t)
        if i % 25 == 0:
            ck.equal(f"blocking all_reduce #{i}", t, torch.full((8,), float(sum(r + i for r in range(world)))))
    s1 = torch_colld.memory_stats()
    n = (s1["inline"] + s1["inline_handed_off"]) - (s0["inline"] + s0["inline_handed_off"])
    print(f"rank {rank}: 100 blocking all_reduce: {s1['inline'] - s0['inline']} completed on the caller's thread, "
          f"{s1['inline_handed_off'] - s0['inline_handed_off']} handed to the worker", flush=True)
    ck.true(f"the blocking small all_reduces were issued on the caller's thread ({n} of 100)", n == 100)
    # async large work queued, then small blocking ones: queued behind it, in call order
    for k in range(3):
        big = rank_input(torch, rank, 70001, "float32", salt=k)
        w = dist.all_reduce(big, async_op=True)
        small = rank_input(torch, rank, 3, "int32", salt=k)
        dist.all_reduce(small, op=dist.ReduceOp.MAX)
        ck.true("the queued all_reduce completed before the small one posted after it returned", w.is_completed())
        w.wait()
        ck.equal(f"async all_reduce before a small one #{k}", big,
                 expected_reduce(torch, "SUM", world, 70001, "float32", salt=k))
        ck.equal(f"the small one after it #{k}", small, expected_reduce(torch, "MAX", world, 3, "int32", salt=k))
    # a late peer: rank 0's small all_reduce is handed to the worker; wait(timeout) raises, then it completes
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        h0 = torch_colld.memory_stats()["inline_handed_off"]
        t = torch.ones(5)
        w = dist.all_reduce(t, async_op=True)
        ck.raises("wait(timeout) while the peers are late", lambda: w.wait(timeout=datetime.timedelta(milliseconds=200)),
                  "timed out")
        store.set("inline-go", "1")
        w.wait()
        ck.equal("the late all_reduce", t, torch.full((5,), float(world)))
        ck.true("it was handed to the worker", torch_colld.memory_stats()["inline_handed_off"] > h0)
    else:
        store.wait(["inline-go"])
        dist.all_reduce(torch.ones(5))
    # an error on the caller's thread carries colld's detail: a mismatch, in a group of its own
    bad = dist.new_group(list(range(world)))
    ck.raises("a mismatched small all_reduce", lambda: dist.all_reduce(torch.ones(10 + rank), group=bad),
              "COLLD_ERR_MISMATCH")
    dist.destroy_process_group(bad)
    t = torch.ones(4)
    dist.all_reduce(t)
    ck.equal("the world group after the mismatch", t, torch.full((4,), float(world)))


def worker_kill(torch, dist, rank, world, ck):
    """Rank 1 dies with SIGKILL after a first all-reduce; the others' next one fails naming it."""
    t = torch.ones(1001)
    dist.all_reduce(t)
    ck.equal("all_reduce before the kill", t, torch.full((1001,), float(world)))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    work = dist.all_reduce(torch.ones(1001), async_op=True)
    fut = work.get_future()
    ck.raises("wait() after rank 1 was killed", work.wait, "rank 1")
    ck.raises("the future after rank 1 was killed", fut.wait, "rank 1")
    try:
        work.wait()
    except RuntimeError as e:
        print(f"rank {rank}: the error: {e}", flush=True)
    ck.true("the work failed", work.is_completed() and not work.is_success())


def worker_exit(torch, dist, rank, world, ck):
    """Rank 0 leaves with an all-reduce its peer never joins (no wait, no destroy): it must exit at
    once, not after the group's 30-minute timeout; the peer's next all-reduce then fails naming
    what happened (the abort, or rank 0's exit)."""
    t = torch.ones(8)
    dist.all_reduce(t)
    ck.equal("all_reduce before the exit", t, torch.full((8,), float(world)))
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("rank0-pid", str(os.getpid()))
        dist.all_reduce(torch.ones(1001), async_op=True)
        print(f"rank {rank}: exit: 0 checks, 0 failed", flush=True)
        sys.exit(0)  # atexit: torch_colld aborts the all-reduce in flight
    pid = int(store.get("rank0-pid"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until rank 0 is gone (the driver reaps it)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    ck.true("rank 0 exited within 60 s with an all-reduce in flight", time.monotonic() < deadline)
    work = dist.all_reduce(torch.ones(1001), async_op=True)
    ck.raises("the peer's all_reduce after rank 0 left", work.wait, "COLLD_ERR_")
    try:
        work.wait()
    except RuntimeError as e:
        print(f"rank {rank}: the error: {e}", flush=True)


# Every dtype a send, a receive or an all-to-all moves (they move bytes: any dtype).
P2P_DTYPES = REDUCE_DTYPES + ["int16", "bool", "complex64", "complex128"]


def p2p_value(torch, tag, count, dtype):
    """The message identified by `tag` (an int): count elements of dtype, different for every tag
    and element, exact in every dtype (bool: a pattern of the tag)."""
    i = torch.arange(count, dtype=torch.int64)
    v = (i * 7 + tag * 13) % 61 + 1
    if dtype == "bool":
        return (v % 2 == 1)
    if dtype.startswith("complex"):
        return torch.complex(v.to(torch.float64), -v.to(torch.float64)).to(getattr(torch, dtype))
    return v.to(getattr(torch, dtype))


def msg(a, b, k=0):
    """A tag naming the k-th message from rank a to rank b."""
    return a * 1000 + b * 10 + k


def worker_p2p(torch, dist, rank, world, ck):
    """send, recv, isend/irecv and batch_isend_irecv, and the uneven all-to-alls, every dtype, exact."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for dtype in P2P_DTYPES:
        dt = getattr(torch, dtype)
        for count in [1, 1001, 70001]:
            # Ring exchange in one batch: to the next rank and to the previous one, from both.
            s1, s2 = p2p_value(torch, msg(rank, nxt), count, dtype), p2p_value(torch, msg(rank, prv, 1), count, dtype)
            r1, r2 = torch.zeros(count, dtype=dt), torch.zeros(count, dtype=dt)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s1, nxt), dist.P2POp(dist.isend, s2, prv),
                                           dist.P2POp(dist.irecv, r1, prv), dist.P2POp(dist.irecv, r2, nxt)])
            for q in reqs:
                q.wait()
            ck.equal(f"ring from the previous rank {dtype} x{count}", r1,
                     p2p_value(torch, msg(prv, rank), count, dtype))
            ck.equal(f"ring from the next rank {dtype} x{count}", r2,
                     p2p_value(torch, msg(nxt, rank, 1), count, dtype))
            # torch 2.x returns one Work for a coalesced batch (endCoalescing's), as with NCCL
            ck.true(f"batch_isend_irecv {dtype} x{count}: one work, completed",
                    len(reqs) == 1 and all(q.is_completed() and q.is_success() for q in reqs))
        for count in [1, 1001]:
            # PyTorch's pattern: each rank in turn sends to every other with blocking sends (its own
            # size: rank + count), the others receive.
            for src in range(world):
                if src == rank:
                    for dst in range(world):
                        if dst != rank:
                            dist.send(p2p_value(torch, msg(rank, dst), count + rank, dtype), dst)
                else:
                    t = torch.zeros(count + src, dtype=dt)
                    dist.recv(t, src)
                    ck.equal(f"blocking recv from {src} {dtype} x{count + src}", t,
                             p2p_value(torch, msg(src, rank), count + src, dtype))
            # isend / irecv with wait: rank 0 sends to all, then receives from all (waits in reverse).
            if rank == 0:
                works = [dist.isend(p2p_value(torch, msg(0, d, 2), count * d, dtype), d) for d in range(1, world)]
                outs = [torch.zeros(count + d, dtype=dt) for d in range(1, world)]
                rworks = [dist.irecv(outs[d - 1], d) for d in range(1, world)]
                for w in reversed(works + rworks):
                    w.wait()
                ck.true(f"isend works completed {dtype} x{count}",
                        all(w.is_completed() and w.is_success() for w in works))
                for d in range(1, world):
                    ck.equal(f"irecv from {d} {dtype} x{count + d}", outs[d - 1],
                             p2p_value(torch, msg(d, 0, 3), count + d, dtype))
                    ck.true(f"irecv from {d}: _source_rank", rworks[d - 1]._source_rank() == d)
            else:
                t = torch.zeros(count * rank, dtype=dt)
                w = dist.irecv(t, 0)
                fut = w.get_future()
                ws = dist.isend(p2p_value(torch, msg(rank, 0, 3), count + rank, dtype), 0)
                w.wait()
                ck.equal(f"irecv from 0 {dtype} x{count * rank}", t,
                         p2p_value(torch, msg(0, rank, 2), count * rank, dtype))
                # torch 2.x hands a complex tensor to the backend as its real view (view_as_real)
                ck.equal(f"irecv's future holds the tensor {dtype}", fut.wait()[0],
                         torch.view_as_real(t) if t.is_complex() else t)
                ws.wait()
        # Uneven all_to_all_single: rank r sends (r + 2q) % 3 rows of 2 (zero included) to rank q.
        rows = lambda a, b: (a + 2 * b) % 3  # noqa: E731
        ins = [p2p_value(torch, msg(rank, q, 4), 2 * rows(rank, q), dtype).reshape(-1, 2) for q in range(world)]
        out = torch.zeros(sum(rows(q, rank) for q in range(world)), 2, dtype=dt)
        dist.all_to_all_single(out, torch.cat(ins), [rows(q, rank) for q in range(world)],
                               [rows(rank, q) for q in range(world)])
        want = torch.cat([p2p_value(torch, msg(q, rank, 4), 2 * rows(q, rank), dtype).reshape(-1, 2)
                          for q in range(world)])
        ck.equal(f"all_to_all_single with uneven splits {dtype}", out, want)
        # all_to_all with lists of unequal tensors: rank r sends 3 * (r + q) + 1 elements to rank q.
        n = lambda a, b: 3 * (a + b) + 1  # noqa: E731
        outs = [torch.zeros(n(q, rank), dtype=dt) for q in range(world)]
        dist.all_to_all(outs, [p2p_value(torch, msg(rank, q, 5), n(rank, q), dtype) for q in range(world)])
        for q in range(world):
            ck.equal(f"all_to_all of unequal tensors {dtype} [{q}]", outs[q],
                     p2p_value(torch, msg(q, rank, 5), n(q, rank), dtype))

    # Tags: the same non-zero tags on both sides, blocking (PyTorch's test_send_recv_with_tag) and in a
    # batch (its gloo_tags pattern).
    for src in range(world):
        if src == rank:
            for dst in range(world):
                if dst != rank:
                    dist.send(p2p_value(torch, msg(rank, dst, 6), 10, "float32"), dst, tag=rank + 7)
        else:
            t = torch.zeros(10)
            dist.recv(t, src, tag=src + 7)
            ck.equal(f"recv with tag {src + 7} from {src}", t, p2p_value(torch, msg(src, rank, 6), 10, "float32"))
    ops, got = [], {}
    for q in range(world):
        if q != rank:
            got[q] = torch.zeros(q + 1, dtype=torch.int64)
            ops.append(dist.P2POp(dist.irecv, got[q], q, tag=q))
            ops.append(dist.P2POp(dist.isend, p2p_value(torch, msg(rank, q, 7), rank + 1, "int64"), q, tag=rank))
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for q in got:
        ck.equal(f"batch with tags from {q}", got[q], p2p_value(torch, msg(q, rank, 7), q + 1, "int64"))

    # A rank sends to itself inside a batch.
    t = torch.zeros(5, dtype=torch.float64)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, t, rank),
                                     dist.P2POp(dist.isend, p2p_value(torch, msg(rank, rank), 5, "float64"), rank)]):
        w.wait()
    ck.equal("a batch sending to this rank itself", t, p2p_value(torch, msg(rank, rank), 5, "float64"))

    # Non-contiguous tensors both ways, zero elements, and a send in the middle of collectives.
    base = torch.zeros(4, 3)
    view = base.t()
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, (torch.arange(12.) + 100 * rank).reshape(4, 3).t(), nxt),
                                   dist.P2POp(dist.irecv, view, prv)])
    for w in reqs:
        w.wait()
    ck.equal("a ring into a non-contiguous view (the base)", base, (torch.arange(12.) + 100 * prv).reshape(4, 3))
    z = torch.zeros(0, dtype=torch.int32)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.zeros(0, dtype=torch.int32), nxt),
                                     dist.P2POp(dist.irecv, z, prv)]):
        w.wait()
    ck.equal("a ring of zero elements", z, torch.zeros(0, dtype=torch.int32))
    t = torch.ones(3)
    dist.all_reduce(t)
    # a chain 0 -> 1 -> ... -> world-1 between two all-reduces: each rank receives, then sends on
    r = torch.full((2,), -1.0)
    if rank > 0:
        dist.recv(r, rank - 1)
    w = dist.isend(r + 1, rank + 1) if rank < world - 1 else None
    if w is not None:
        w.wait()
    ck.equal("a chain of recv then isend", r, torch.full((2,), -1.0 + rank))
    dist.all_reduce(t)
    ck.equal("all_reduce around point-to-point", t, torch.full((3,), float(world * world)))

    # In place: all_to_all_single with the same tensor as input and output, split sizes given.
    t = torch.arange(world, dtype=torch.float32) + 10 * rank
    dist.all_to_all_single(t, t, [1] * world, [1] * world)
    ck.equal("all_to_all_single in place", t, torch.tensor([10. * q + rank for q in range(world)]))

    # A subgroup: its ranks are global ranks in torch, translated to the group's.
    evens = [r for r in range(world) if r % 2 == 0]
    sub = dist.new_group(evens)
    if rank in evens and len(evens) > 1:
        i = evens.index(rank)
        to, frm = evens[(i + 1) % len(evens)], evens[(i - 1) % len(evens)]
        r = torch.zeros(3, dtype=torch.int32)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((3,), rank, dtype=torch.int32), to, sub),
                                         dist.P2POp(dist.irecv, r, frm, sub)]):
            w.wait()
        ck.equal("a ring in a subgroup", r, torch.full((3,), frm, dtype=torch.int32))

    # What colld has not: a receive from any source; a lone send to this rank itself.
    ck.raises("recv from any source", lambda: dist.recv(torch.zeros(1)),
              "recv from any source (src=None) is not supported")
    ck.raises("irecv from any source", lambda: dist.irecv(torch.zeros(1)), "colld_recv has no any-source form")
    # torch 2.x refuses it itself (torch_colld's own refusal stays for a direct backend call)
    ck.raises("a send to this rank itself", lambda: dist.send(torch.zeros(1), rank),
              "should not be the same as the rank of the current process", ValueError)
    ck.raises("a send to a rank out of range", lambda: dist.send(torch.zeros(1), world + 3), "")
    ck.raises("all_to_all_single with split sizes that do not add up",
              lambda: dist.all_to_all_single(torch.zeros(world), torch.zeros(world), [1] * world, [2] * world),
              "the input split sizes add up to")
    # the group still works
    t = torch.ones(4)
    dist.all_reduce(t)
    ck.equal("all_reduce after the refused calls", t, torch.full((4,), float(world)))


def worker_p2pfail(torch, dist, rank, world, ck):
    """Two ranks disagree: tags posted in another order (the receiver fails, the group goes on),
    sends that cross outside a batch (COLLD_ERR_TIMEOUT at the group's time-out, naming them), sizes
    that differ and a tagged send against an untagged receive (colld's COLLD_ERR_MISMATCH, naming
    both calls, on both ranks)."""
    other = dist.new_group([0, 1])  # a second communicator, for the second mismatch
    if rank == 0:
        dist.send(torch.full((4,), 1.0), 1, tag=1)
        dist.send(torch.full((4,), 2.0), 1, tag=2)
    else:
        a, b = torch.zeros(4), torch.zeros(4)
        ck.raises("recv with tag 2 that gets the message of tag 1", lambda: dist.recv(a, 0, tag=2),
                  "recv from rank 0 with tag 2 got the message rank 0 sent with tag 1")
        ck.raises("recv with tag 1 that gets the message of tag 2", lambda: dist.recv(b, 0, tag=1),
                  "with tag 1 got the message rank 0 sent with tag 2")
    t = torch.ones(3)
    dist.all_reduce(t)
    ck.equal("all_reduce after the tag error", t, torch.full((3,), 2.0))
    # Both ranks send first, outside a batch: each send waits for a receive posted after the other's
    # send, until the group's time-out, which names it.
    crossed = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=3))
    work = dist.isend(torch.ones(4), 1 - rank, group=crossed)
    ck.raises("crossed sends outside a batch", lambda: dist.recv(torch.zeros(4), 1 - rank, group=crossed),
              "COLLD_ERR_TIMEOUT: point-to-point timed out after 3000 ms")
    ck.raises("... the send's work", work.wait, "never posted the receive from rank")
    try:
        work.wait()
    except RuntimeError as e:
        print(f"rank {rank}: the error: {e}", flush=True)
    # Sizes differ: 100 float32 sent, 50 received.
    want = ("COLLD_ERR_MISMATCH: point-to-point from rank 0 to rank 1 differs: rank 0 sends 400 x uint8 (400 B)")
    if rank == 0:
        work = dist.isend(torch.ones(100), 1)
    else:
        work = dist.irecv(torch.zeros(50), 0)
    ck.raises("a send and a recv of different sizes", work.wait, want)
    ck.raises("... carries the receive", work.wait, "rank 1 receives 200 x uint8 (200 B)")
    ck.raises("... and says how torch_colld sends", work.wait, "torch_colld sends a tensor as its bytes")
    try:
        work.wait()
    except RuntimeError as e:
        print(f"rank {rank}: the error: {e}", flush=True)
    ck.raises("the broken group's next operation", lambda: dist.all_reduce(torch.ones(1)), "COLLD_ERR_MISMATCH")
    # A tagged send meets an untagged receive.
    if rank == 0:
        work = dist.isend(torch.ones(2), 1, group=other, tag=5)
    else:
        work = dist.irecv(torch.zeros(2), 0, group=other)
    ck.raises("a tagged send against an untagged receive", work.wait,
              "rank 0 sends 1 x int64 (8 B) (operation #1), rank 1 receives 8 x uint8")


def worker_p2pkill(torch, dist, rank, world, ck):
    """Rank 1 dies with SIGKILL while ranks 0 and 2 wait to receive from it: both fail naming it."""
    prv, nxt = (rank - 1) % world, (rank + 1) % world
    r = torch.zeros(7)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((7,), float(rank)), nxt),
                                     dist.P2POp(dist.irecv, r, prv)]):
        w.wait()
    ck.equal("a ring before the kill", r, torch.full((7,), float(prv)))
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        store.wait(["posted-0", "posted-2"])
        time.sleep(0.5)  # their receives reach the daemon
        os.kill(os.getpid(), signal.SIGKILL)
    work = dist.irecv(torch.zeros(1001), 1)
    store.set(f"posted-{rank}", "1")
    t0 = time.monotonic()
    ck.raises("a recv from the killed rank 1", work.wait, "rank 1")
    ck.raises("... is COLLD_ERR_PEER_LOST", work.wait, "COLLD_ERR_PEER_LOST")
    ck.true(f"... within 20 s (took {time.monotonic() - t0:.1f} s)", time.monotonic() - t0 < 20)
    try:
        work.wait()
    except RuntimeError as e:
        print(f"rank {rank}: the error: {e}", flush=True)


def worker_api(torch, dist, rank, world, ck):
    """What torch 2.x adds, on a group made with "cpu:colld": the backend object, the coalescing
    manager (its fast path: all_gather_into_tensor, reduce_scatter_tensor and all_reduce coalesced;
    with a device: one batch between startCoalescing and endCoalescing), a batch's one Work and its
    future, Work.wait(timeout), destroy_process_group and _abort_process_group of a subgroup (an
    operation in flight fails at once), after which the world group still works."""
    import torch_colld
    pg = dist.distributed_c10d._get_default_group()
    ck.true("the CPU backend is torch_colld's", isinstance(pg._get_backend(torch.device("cpu")),
                                                         torch_colld.ProcessGroupColld))
    ck.true(f"get_backend ({dist.get_backend()!r})", dist.get_backend() in ("colld", "cpu:colld"))
    sizes = [3, 1001, 70001]
    # the fast path: one allgather_into_tensor_coalesced
    ins = [rank_input(torch, rank, n, "float32", salt=k) for k, n in enumerate(sizes)]
    outs = [torch.zeros(world * n) for n in sizes]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for k, n in enumerate(sizes):
        ck.equal(f"coalesced all_gather_into_tensor x{n}", outs[k],
                 torch.cat([rank_input(torch, r, n, "float32", salt=k) for r in range(world)]))
    # one reduce_scatter_tensor_coalesced, of every reduce dtype in turn
    for dtype in REDUCE_DTYPES:
        for op in ["SUM", "AVG"]:
            ins = [torch.cat([rank_input(torch, rank, n, dtype, salt=30 + k + p) for p in range(world)])
                   for k, n in enumerate(sizes)]
            outs = [torch.zeros(n, dtype=getattr(torch, dtype)) for n in sizes]
            with dist._coalescing_manager():
                for o, i in zip(outs, ins):
                    dist.reduce_scatter_tensor(o, i, op=getattr(dist.ReduceOp, op))
            for k, n in enumerate(sizes):
                ck.equal(f"coalesced reduce_scatter_tensor {op} {dtype} x{n}", outs[k],
                         expected_reduce(torch, op, world, n, dtype, salt=30 + k + rank))
    outs = [torch.zeros(n, dtype=torch.bfloat16) for n in sizes]
    with dist._coalescing_manager():
        for o, n in zip(outs, sizes):
            dist.reduce_scatter_tensor(o, torch.cat([rank_input(torch, rank, n, "bfloat16", salt=p)
                                                     for p in range(world)]),
                                       op=dist._make_nccl_premul_sum(float(rank + 1)))
    for o, n in zip(outs, sizes):
        ck.equal(f"coalesced reduce_scatter_tensor PREMUL_SUM bfloat16 x{n}", o,
                 expected_premul(torch, world, n, "bfloat16", [float(r + 1) for r in range(world)], salt=rank))
    # with a device: torch brackets the fast path with startCoalescing / endCoalescing, one Work
    ts = [rank_input(torch, rank, n, "int64", salt=k) for k, n in enumerate(sizes)]
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ck.true(f"one Work for the coalesced all_reduce ({len(cm.works)})", len(cm.works) == 1)
    cm.wait()
    for k, n in enumerate(sizes):
        ck.equal(f"coalesced all_reduce MAX (device) x{n}", ts[k], expected_reduce(torch, "MAX", world, n, "int64",
                                                                                    salt=k))
    # a batch's one Work: its future holds every tensor of the batch
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    r = torch.zeros(5, dtype=torch.int32)
    s = torch.full((5,), rank, dtype=torch.int32)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt), dist.P2POp(dist.irecv, r, prv)])
    val = reqs[0].get_future().wait()
    ck.equal("the batch's receive", r, torch.full((5,), prv, dtype=torch.int32))
    ck.true("the batch's future holds its two tensors", len(val) == 2 and bool((val[1] == r).all()))
    # Work.wait(timeout): raises while the send is not there, then completes
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        t = torch.zeros(7)
        w = dist.irecv(t, 0)
        ck.raises("wait(timeout) before the send", lambda: w.wait(timeout=datetime.timedelta(milliseconds=300)),
                  "timed out")
        store.set("api-go", "1")
        ck.true("wait(timeout) once the send is there", w.wait(timeout=datetime.timedelta(seconds=60)))
        ck.equal("the receive waited with a timeout", t, torch.full((7,), 3.0))
    elif rank == 0:
        store.wait(["api-go"])
        dist.send(torch.full((7,), 3.0), 1)
    # destroy_process_group of a subgroup (shutdown), then _abort_process_group of another with an
    # all-reduce in flight on rank 0 that no other rank joins
    sub = dist.new_group(list(range(world)))
    t = torch.ones(3)
    dist.all_reduce(t, group=sub)
    ck.equal("all_reduce in a subgroup before its destroy", t, torch.full((3,), float(world)))
    dist.destroy_process_group(sub)
    doomed = dist.new_group(list(range(world)))
    if rank == 0:
        w = dist.all_reduce(torch.ones(1001), group=doomed, async_op=True)
        time.sleep(0.3)  # in flight
        t0 = time.monotonic()
        dist.distributed_c10d._abort_process_group(doomed)
        ck.raises("the all_reduce in flight at the abort", w.wait, "torch_colld: allreduce")
        ck.true(f"... failed at once ({time.monotonic() - t0:.1f} s)", time.monotonic() - t0 < 10)
        try:
            w.wait()
        except RuntimeError as e:
            print(f"rank {rank}: the error: {e}", flush=True)
    else:
        dist.distributed_c10d._abort_process_group(doomed)
    t = torch.ones(4, dtype=torch.uint64)
    dist.all_reduce(t)
    ck.equal("all_reduce in the world group after the destroy and the abort", t,
             torch.full((4,), world, dtype=torch.uint64))


def worker_split(torch, dist, rank, world, ck):
    """torch.distributed.split_group: one colld_comm_split of the parent's communicator. torch
    2.11's split_group is written for NCCL: it needs a device bound to the default group (which
    init_process_group only takes for an accelerator) and the parent's backend for "cuda"; so the
    parent is a group made with "cpu:colld,cuda:colld" (one torch_colld backend for both) and the
    default group is bound to the CPU for the split, then unbound (new_group refuses a CPU-bound
    default group). Exact results in the new groups and the parent, their ranks, sizes and
    timeout, a rank in no split (None), then the refusals: a rank in two splits, a rank out of
    range (every rank raises, none hangs), after which the parent still works."""
    import torch_colld
    parent = dist.new_group(list(range(world)), backend="cpu:colld,cuda:colld")
    cpu = torch.device("cpu")
    default = dist.distributed_c10d._get_default_group()
    default.bound_device_id = torch.device("cpu", 0)
    try:
        h = world // 2
        splits = [list(range(h)), list(range(h, world))]
        mine = splits[0] if rank < h else splits[1]
        g = dist.split_group(parent_pg=parent, split_ranks=splits, timeout=datetime.timedelta(seconds=77))
        # the same parent split again, given unsorted: torch sorts each split (new ranks in rank order)
        odd = [r for r in reversed(range(world)) if r % 2 == 1]
        g2 = dist.split_group(parent_pg=parent, split_ranks=[odd])
        # the first half again, alone: its ranks get the group name they had in the first split
        # (torch names a split by its ranks), the others are in no split; each split_group is one
        # colld_comm_split on every rank all the same
        g3 = dist.split_group(parent_pg=parent, split_ranks=[splits[0]])
        bad = []
        if world >= 3:
            bad.append(("a rank in two splits", [[0, 1], list(range(1, world))], "which only"))
        bad.append(("a rank out of range", [[0, world + 3]], "not valid"))
        for what, sr, text in bad:
            ck.raises(f"split_group with {what}", lambda sr=sr: dist.split_group(parent_pg=parent, split_ranks=sr),
                      text)
    finally:
        default.bound_device_id = None
    ck.true(f"split_group gave a group ({g})", g is not None)
    ck.true(f"its rank and size ({g.rank()}, {g.size()})", (g.rank(), g.size()) == (mine.index(rank), len(mine)))
    ck.true("its ranks", dist.get_process_group_ranks(g) == mine)
    backend = g._get_backend(cpu)
    ck.true("its backend is a torch_colld backend of its own", isinstance(backend, torch_colld.ProcessGroupColld)
            and backend is not parent._get_backend(cpu))
    ck.true(f"its timeout ({backend.options._timeout})", backend.options._timeout == datetime.timedelta(seconds=77))
    ck.true(f"the parent's timeout unchanged ({parent._get_backend(cpu).options._timeout})",
            parent._get_backend(cpu).options._timeout == datetime.timedelta(minutes=30))
    sorted_odd = sorted(odd)
    ck.true(f"the second split ({g2})", (g2 is None) == (rank % 2 == 0))
    if g2 is not None:
        ck.true("its rank and size", (g2.rank(), g2.size()) == (sorted_odd.index(rank), len(sorted_odd)))
    ck.true(f"the first half again ({g3})", (g3 is None) == (rank >= h))
    if g3 is not None:
        t = torch.full((4,), rank + 1, dtype=torch.int64)
        dist.all_reduce(t, group=g3)
        ck.equal("all_reduce in the first half again", t, torch.full((4,), sum(r + 1 for r in splits[0]),
                                                                     dtype=torch.int64))
        ck.true("... its own backend", g3._get_backend(cpu) is not g._get_backend(cpu))
    for n in [1, 1001, 70001]:
        t = torch.full((n,), rank + 1, dtype=torch.int64)
        w = dist.all_reduce(t, group=g, async_op=True)
        p = torch.full((n,), rank + 1, dtype=torch.int64)
        dist.all_reduce(p, group=parent)  # the parent at the same time
        w.wait()
        ck.equal(f"all_reduce of rank + 1 in the split x{n}", t,
                 torch.full((n,), sum(r + 1 for r in mine), dtype=torch.int64))
        ck.equal(f"all_reduce of rank + 1 in the parent x{n}", p,
                 torch.full((n,), sum(r + 1 for r in range(world)), dtype=torch.int64))
    out = torch.zeros(len(mine) * 3, dtype=torch.float32)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank)), group=g)
    ck.equal("all_gather_into_tensor in the split", out, torch.tensor([float(r) for r in mine]).repeat_interleave(3))
    if g2 is not None:
        t = torch.full((5,), rank, dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g2)
        ck.equal("all_reduce MAX in the second split", t, torch.full((5,), max(sorted_odd), dtype=torch.int32))
    dist.destroy_process_group(g)
    t = torch.ones(3, dtype=torch.float64)
    dist.all_reduce(t, group=parent)
    ck.equal("all_reduce in the parent after the refusals and the split's destroy", t,
             torch.full((3,), float(world), dtype=torch.float64))


def worker_cuda(torch, dist, rank, world, ck):
    """CUDA tensors, stream-ordered (a torch_colld built with -DCOLLD_TORCH_CUDA=ON, on a machine
    with a GPU; the driver skips it otherwise). Passed with 2 processes on an H200
    (docs/gpu-testing.md). Every reduce dtype through all_reduce (SUM, AVG), and
    all_gather_into_tensor, reduce_scatter_tensor, broadcast, all_to_all_single and a
    batch_isend_irecv ring on CUDA tensors, exact; a kernel queued after the collective on the
    same stream sees its result; Work.wait() makes the current stream wait."""
    import torch_colld
    if not torch_colld.cuda_built:
        ck.true("torch_colld was built with -DCOLLD_TORCH_CUDA=ON (the driver saw a GPU)", False)
        return None
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    for dtype in REDUCE_DTYPES:
        for count in [1, 1001, 70001]:
            for op in ["SUM", "AVG"]:
                t = rank_input(torch, rank, count, dtype).to(dev)
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
                t = t.clone()  # a kernel after the collective on the same stream (a copy: every dtype has one)
                ck.equal(f"cuda all_reduce {op} {dtype} x{count}", t.cpu(),
                         expected_reduce(torch, op, world, count, dtype))
        out = torch.zeros(world * 1001, dtype=getattr(torch, dtype), device=dev)
        dist.all_gather_into_tensor(out, rank_input(torch, rank, 1001, dtype, salt=4).to(dev))
        ck.equal(f"cuda all_gather_into_tensor {dtype}", out.cpu(),
                 torch.cat([rank_input(torch, r, 1001, dtype, salt=4) for r in range(world)]))
        out = torch.zeros(1001, dtype=getattr(torch, dtype), device=dev)
        dist.reduce_scatter_tensor(out, torch.cat([rank_input(torch, rank, 1001, dtype, salt=20 + p)
                                                   for p in range(world)]).to(dev))
        ck.equal(f"cuda reduce_scatter_tensor {dtype}", out.cpu(),
                 expected_reduce(torch, "SUM", world, 1001, dtype, salt=20 + rank))
    t = rank_input(torch, rank, 1001, "float32", salt=2).to(dev)
    dist.broadcast(t, src=world - 1)
    ck.equal("cuda broadcast", t.cpu(), rank_input(torch, world - 1, 1001, "float32", salt=2))
    out = torch.zeros(world * 3, device=dev)
    dist.all_to_all_single(out, (torch.arange(world * 3, dtype=torch.float32) + 100 * rank).to(dev))
    ck.equal("cuda all_to_all_single", out.cpu(),
             torch.tensor([float(3 * rank + k + 100 * r) for r in range(world) for k in range(3)]))
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    r = torch.zeros(70001, device=dev)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((70001,), float(rank), device=dev), nxt),
                                   dist.P2POp(dist.irecv, r, prv)])
    for w in reqs:
        w.wait()  # the current stream waits
    ck.equal("cuda ring in a batch", r.cpu(), torch.full((70001,), float(prv)))
    t = torch.ones(1 << 20, device=dev)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    ck.equal("cuda async all_reduce after wait()", t.sum().cpu(), torch.tensor(float(world << 20)))
    fut = dist.all_reduce(torch.ones(5, device=dev), async_op=True).get_future()
    ck.equal("cuda future's value", fut.wait()[0].cpu(), torch.full((5,), float(world)))
    torch.cuda.synchronize()
    return None


def in_colld_memory(ptr):
    """Whether address `ptr` lies in a mapping of colld's shared memory (libcolld's memfds)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= ptr < hi:
                return "colld-buffer" in line
    return False


def worker_zerocopy(torch, dist, rank, world, ck):
    """torch_colld.empty: tensors in colld's shared memory, used by the group's operations without
    staging; exact results, views, a subgroup's own tensors and another group's (staged), and a
    tensor that outlives the group (returned: checked after destroy_process_group)."""
    import torch_colld
    ck.true("a torch.empty tensor is not in colld memory (the check can tell)",
            not in_colld_memory(torch.empty(1 << 20).data_ptr()))
    for dtype in ["float32", "int64", "bfloat16"]:
        dt = getattr(torch, dtype)
        t = torch_colld.empty(1001, dtype=dt)
        ck.true(f"empty({dtype}) is a CPU {dtype} tensor of 1001", t.dtype == dt and t.shape == (1001,) and not t.is_cuda)
        ck.true(f"empty({dtype}) lies in colld's shared memory", in_colld_memory(t.data_ptr()))
        t.copy_(rank_input(torch, rank, 1001, dtype))
        dist.all_reduce(t)
        ck.equal(f"all_reduce SUM of {dtype} in colld memory", t, expected_reduce(torch, "SUM", world, 1001, dtype))
    m = torch_colld.empty((4, 1001))  # a tuple as torch.empty takes it
    m.fill_(-1.0)
    m[2].copy_(rank_input(torch, rank, 1001, "float32"))
    dist.all_reduce(m[2], op=dist.ReduceOp.MAX)  # a view: a slice of the colld allocation
    ck.equal("all_reduce MAX of a row view", m[2], expected_reduce(torch, "MAX", world, 1001, "float32"))
    ck.equal("the other rows untouched", m[0], torch.full((1001,), -1.0))
    out = torch_colld.empty(world * 3, dtype=torch.int32)
    dist.all_gather_into_tensor(out, torch.full((3,), rank, dtype=torch.int32))
    ck.equal("all_gather_into_tensor into colld memory", out,
             torch.arange(world, dtype=torch.int32).repeat_interleave(3))
    sub = dist.new_group([r for r in range(world) if r % 2 == 0])
    if rank % 2 == 0:
        n = len(range(0, world, 2))
        s = torch_colld.empty(5, group=sub)
        s.fill_(float(rank + 1))
        dist.all_reduce(s, group=sub)
        ck.equal("all_reduce in a subgroup on its own colld memory", s,
                 torch.full((5,), float(sum(r + 1 for r in range(0, world, 2)))))
        w = torch_colld.empty(5)  # the world group's memory in the subgroup: staged, still exact
        w.fill_(1.0)
        dist.all_reduce(w, group=sub)
        ck.equal("all_reduce in a subgroup on the world group's colld memory", w, torch.full((5,), float(n)))
    ck.equal("empty(0)", torch_colld.empty(0), torch.empty(0))
    ck.raises("empty(-1)", lambda: torch_colld.empty(-1), "negative dimension")
    kept = torch_colld.empty(7, dtype=torch.float64)
    kept.fill_(1.0)
    dist.all_reduce(kept)
    return kept, torch.full((7,), float(world), dtype=torch.float64)


def worker_main(args):
    import faulthandler
    # A hang shows where: every thread's Python stack on stderr before the driver kills the rank.
    faulthandler.dump_traceback_later(max(5, args.timeout - 10), exit=False)
    import torch
    import torch.distributed as dist
    import torch_colld  # noqa: F401  (registers "colld")

    torch.set_num_threads(1)
    # A scenario "a+b+c" runs a, b and c one after the other in one group (one start of torch per
    # rank instead of three). "cpu:colld" (torch 2.x's device:backend form) where api is among
    # them, "colld" otherwise.
    names = args.worker.split("+")
    backend = "cpu:colld" if "api" in names else "colld"
    dist.init_process_group(backend, init_method=f"file://{args.store}", rank=args.rank, world_size=args.world)
    ck = Checker(args.rank)
    ck.true(f"get_backend ({dist.get_backend()!r})", dist.get_backend() == backend)
    workers = {"ops": worker_ops, "premul": worker_premul, "ddp": worker_ddp, "kill": worker_kill,
               "exit": worker_exit, "zerocopy": worker_zerocopy, "p2p": worker_p2p, "p2pfail": worker_p2pfail,
               "p2pkill": worker_p2pkill, "api": worker_api, "split": worker_split, "cuda": worker_cuda,
               "inline": worker_inline}
    kept = []
    for name in names:
        t0 = time.monotonic()
        kept.append(workers[name](torch, dist, args.rank, args.world, ck))
        if len(names) > 1:
            dist.barrier()
            print(f"rank {args.rank}: {name}: {time.monotonic() - t0:.1f} s", flush=True)
    dist.destroy_process_group()
    for k in kept:  # a tensor from torch_colld.empty outlives its group
        if k is not None:
            ck.equal("a colld tensor after destroy_process_group", k[0], k[1])
    del kept
    for f in ck.failures[:20]:
        print("FAIL", f, flush=True)
    print(f"rank {args.rank}: {args.worker}: {ck.checks} checks, {len(ck.failures)} failed", flush=True)
    return 1 if ck.failures else 0


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------

def run_scenario(args, tmp, env, name, world, timeout):
    """Run `world` ranks of one scenario; returns True when every rank did what it should."""
    store = os.path.join(tmp, f"store-{name.replace('+', '-')}-{world}")
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", name, "--rank", str(r),
                               "--world", str(world), "--store", store, "--timeout", str(timeout)], env=env)
             for r in range(world)]
    ok = True
    for r, p in enumerate(procs):
        try:
            rc = p.wait(timeout=max(1, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print(f"{name}/{world}: rank {r} did not finish in {timeout} s", flush=True)
            return False
        want = -signal.SIGKILL if (name in ("kill", "p2pkill") and r == 1) else 0
        if rc != want:
            print(f"{name}/{world}: rank {r} exited with {rc}, want {want}", flush=True)
            ok = False
    print(f"{name}/{world}: {'ok' if ok else 'FAILED'} ({time.monotonic() - t0:.1f} s)", flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--colld")
    ap.add_argument("--pythonpath")
    ap.add_argument("--worker")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--store")
    ap.add_argument("--upstream", help="instead of the scenarios: run upstream_suite.py for colld with "
                    "the tests listed in this file, all of which must pass")
    ap.add_argument("--timeout", type=int, default=300,
                    help="seconds for each scenario named as NAME/WORLD (each rank's Python stacks are "
                         "printed 10 s before)")
    ap.add_argument("scenarios", nargs="*")
    args = ap.parse_args()
    if args.worker:
        return worker_main(args)
    try:
        import torch
    except ImportError as e:
        print(f"skip: {sys.executable} cannot import torch ({e})")
        return 77
    # Every scenario at every world size with COLLD_TEST_FULL=1 (make test-full); by default (make
    # test, CI's 2-core machine) each scenario once, at the world size that covers most.
    full = os.environ.get("COLLD_TEST_FULL", "") not in ("", "0")
    plan = [("ops", 2, 120), ("ops", 4, 180), ("premul", 2, 90), ("premul", 3, 90), ("premul", 4, 120),
            ("ddp", 2, 90), ("ddp", 4, 90), ("kill", 3, 90), ("exit", 2, 90),
            ("zerocopy", 2, 90), ("zerocopy", 3, 90), ("p2p", 2, 120), ("p2p", 3, 150), ("p2p", 4, 180),
            ("p2pfail", 2, 90), ("p2pkill", 3, 90), ("api", 2, 90), ("api", 3, 90), ("split", 2, 90),
            ("split", 3, 90), ("split", 4, 90), ("inline", 2, 90), ("inline", 3, 90)]
    gpu = [("cuda", 2, 300)]  # only where torch sees a GPU (none here; bench/gpu-carry.sh runs it on one)
    if not full:
        plan = [("ops+premul+ddp+zerocopy+p2p+api+split+inline", 4, 240), ("kill", 3, 90), ("exit", 2, 90),
                ("p2pfail", 2, 90), ("p2pkill", 3, 90)]
    if torch.cuda.is_available():
        plan += gpu
    else:
        print("test_torch: no GPU (torch.cuda.is_available() is false): the cuda scenario is skipped", flush=True)
    if args.scenarios:
        plan = [p for p in plan if p[0] in args.scenarios] or [(s, int(w), args.timeout) for s, w in
                                                               (a.split("/") for a in args.scenarios if "/" in a)]
        if not torch.cuda.is_available() and any(p[0] == "cuda" for p in plan):
            print("test_torch: no GPU (torch.cuda.is_available() is false): cuda/N is skipped", flush=True)
            plan = [p for p in plan if p[0] != "cuda"]
            if not plan:
                return 77
    with tempfile.TemporaryDirectory(prefix="colld-torch-") as tmp:
        daemon, sock, _ = start_daemon(args.colld, tmp, ("--log-level", "info"), output=True)
        env = dict(os.environ, COLLD_SOCKET=sock,
                   PYTHONPATH=os.pathsep.join([args.pythonpath] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
                   OMP_NUM_THREADS="1", TORCH_COLLD_ALLOC_MAX_BYTES=str(32 << 20))
        results = []
        try:
            if args.upstream:
                suite = os.path.join(os.path.dirname(os.path.abspath(__file__)), "upstream_suite.py")
                env["TEMP_DIR"] = tempfile.mkdtemp(dir=tmp)
                mode = [] if full else ["--quick", "--fork"]
                rc = subprocess.run([sys.executable, suite, "--backend", "colld", "--world-size", "3",
                                     "--tests-from", args.upstream] + mode, env=env, cwd=tmp,
                                    timeout=1700).returncode
                results.append(rc == 0)
            else:
                for p in plan:  # the caller-thread path is opt-in: on for the scenarios that test it
                    on = "inline" in p[0].split("+")
                    results.append(run_scenario(args, tmp, dict(env, TORCH_COLLD_INLINE_BYTES="65536") if on else env,
                                                *p))
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                rc = daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                rc = "killed after 30 s"
            if rc != 0:
                print(f"colld exited with {rc}; its log:\n" + open(os.path.join(tmp, "colld.log")).read())
                results.append(False)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
