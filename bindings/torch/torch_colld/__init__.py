"""torch_colld: a torch.distributed backend over colld, the per-node collective offload service.

    import torch.distributed as dist
    import torch_colld  # registers the backend "colld"
    dist.init_process_group("colld", rank=rank, world_size=world_size)  # MASTER_ADDR/PORT, or init_method, or store
    # or "cpu:colld" (e.g. "cpu:colld,cuda:nccl")

Every process reaches the local colld daemon at $COLLD_SOCKET (else colld's default socket).
torch 2.x, CPU tensors only; see docs/torch.md for what is supported.
"""
import atexit as _atexit

import torch as _torch
import torch.distributed as _dist

from ._torch_colld import ProcessGroupColld, _empty, _stop_all, colld_api_version, cuda_built  # noqa: F401

__all__ = ["ProcessGroupColld", "BACKEND", "empty"]

BACKEND = "colld"


def empty(*size, dtype=None, group=None):
    """A CPU tensor (contents uninitialized, as torch.empty) in memory shared with the colld daemon
    of `group` (default: the default process group, which must be "colld"). That group's
    operations on it, or on any view of it, are zero copy; other tensors are staged by libcolld.
    Its memory is freed with its storage. empty(4, 8) and empty((4, 8)) are alike."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, _torch.Size)):
        size = tuple(size[0])
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(_torch.device("cpu"))
    except RuntimeError as e:
        raise RuntimeError(f"torch_colld.empty: the group has no CPU backend ({e})") from None
    like = _torch.empty(0, dtype=dtype if dtype is not None else _torch.get_default_dtype())
    return _empty(backend, [int(s) for s in size], like)


def _create(store, rank, world_size, timeout):
    """The creator torch.distributed calls for each group of backend "colld": it returns the CPU
    c10d.Backend, which torch wraps in its ProcessGroup. Its store is prefixed with the group's
    name (and "cpu/"), so each subgroup's colld unique id has a key of its own."""
    return ProcessGroupColld(store, rank, world_size, timeout)


# Importing twice (or after another registration of the name) must not fail. The plain creator
# (store, rank, size, timeout), not extended_api: nothing here needs the group's name or global ranks.
if BACKEND.upper() not in _dist.Backend._plugins:
    # CUDA tensors only where the extension was built with -DCOLLD_TORCH_CUDA=ON (docs/torch.md):
    # then one backend object serves both devices.
    _dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"] if cuda_built else ["cpu"])

# Process groups still alive at exit (no destroy_process_group) stop their worker threads before
# Python finalizes: a worker that touches Python objects afterwards would abort the process.
_atexit.register(_stop_all)
