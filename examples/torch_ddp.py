#!/usr/bin/env python3
"""torch_ddp.py: DistributedDataParallel training through colld (the torch_colld backend), run by torchrun.

With a colld daemon running (README, "Running the daemon"; here on a private socket) and colld
built in build/, from the repository root:

    build/server/colld --socket /tmp/colld.sock &
    COLLD_SOCKET=/tmp/colld.sock PYTHONPATH=build/bindings/torch/python \\
        .venv/bin/torchrun --standalone --nproc-per-node 2 examples/torch_ddp.py

torchrun starts the ranks and gives each its rendezvous (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE); every rank reaches the colld daemon of its node at $COLLD_SOCKET (else colld's
default socket). Each rank trains the same small regression model on its own shard of synthetic
data; DDP all-reduces the gradients through colld while the backward pass runs. At the end every
rank's parameters must be identical (checked with an all_gather) and the loss must have fallen;
the exit status says whether they were and did. `--backend gloo` runs the same on torch's Gloo.

`import torch_colld` registers the backend "colld"; where torch_colld's package directory is on
sys.path (PYTHONPATH, or installed) torch also registers it by itself at `import torch` (its
"torch.backends" entry point, docs/torch.md), so the import is only needed where that is switched
off (TORCH_DEVICE_BACKEND_AUTOLOAD=0).
"""
import argparse
import sys

import torch
import torch.distributed as dist
import torch_colld  # noqa: F401  (registers the backend "colld")


def main():
    ap = argparse.ArgumentParser(description="DDP training through colld (run it with torchrun)")
    ap.add_argument("--backend", default="colld", help="colld (default), gloo, or cpu:colld")
    ap.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    ap.add_argument("--batch", type=int, default=64, help="samples per rank and step (default 64)")
    args = ap.parse_args()

    dist.init_process_group(args.backend)  # env:// from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    torch.manual_seed(0)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02)

    w_true = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    data = torch.Generator().manual_seed(1000 + rank)  # this rank's shard
    losses = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 32, generator=data)
        y = x @ w_true
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()  # gradients all-reduced (averaged) over the ranks
        opt.step()
        losses.append(loss.item())
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

    # Every rank must hold the same parameters after the same averaged steps.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    same = all(torch.equal(every[0], other) for other in every)
    # The loss, averaged over the ranks, at the start and at the end.
    first_last = torch.tensor([losses[0], losses[-1]], dtype=torch.float64)
    dist.all_reduce(first_last)
    first, last = (first_last / world).tolist()
    ok = same and last < first
    if rank == 0:
        print(f"{world} ranks on {dist.get_backend()}: loss {first:.4f} -> {last:.4f}, parameters identical on "
              f"every rank: {same}: {'OK' if ok else 'FAILED'}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
