"""torch_colld: a torch.distributed backend over colld, the per-node collective offload service.

    import torch.distributed as dist
    import torch_colld  # registers the backend "colld"
    dist.init_process_group("colld", rank=rank, world_size=world_size)  # MASTER_ADDR/PORT, or init_method, or store
    # or "cpu:colld" (e.g. "cpu:colld,cuda:nccl")

Every process reaches the local colld daemon at $COLLD_SOCKET (else colld's default socket).
torch 2.x, CPU tensors only; see docs/torch.md for what is supported. DDP's gradient buckets are
allocated in colld memory (zero copy; DDP_DISABLE_COMM_MEM=1 or TORCH_COLLD_DDP_BUCKETS=0 turn it
off); colld_memory() does the same for any CPU tensor made within it; memory_stats() shows it.
"""
import atexit as _atexit
import contextlib as _contextlib
import os as _os

import torch as _torch
import torch.distributed as _dist

from ._torch_colld import (ProcessGroupColld, _alloc_stats, _client_stats, _empty, _pop_allocator,  # noqa: F401
                           _push_allocator, _stop_all, colld_api_version, cuda_built)

__all__ = ["ProcessGroupColld", "BACKEND", "empty", "colld_memory", "memory_stats"]

BACKEND = "colld"


def _cpu_backend(group, what):
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    try:
        return pg._get_backend(_torch.device("cpu"))
    except RuntimeError as e:
        raise RuntimeError(f"torch_colld.{what}: the group has no CPU backend ({e})") from None


@_contextlib.contextmanager
def colld_memory(group=None, min_bytes=16384):
    """Within the block, every CPU tensor torch allocates (of at least `min_bytes`; smaller ones stay
    in torch's memory) lies in memory shared with the colld daemon of `group` (default: the default
    group, which must be "colld"), so that group's operations on it are zero copy. Process-wide
    (torch has one CPU allocator for all threads); blocks nest. An allocation colld memory cannot
    hold (a limit of the daemon, TORCH_COLLD_ALLOC_MAX_BYTES, the daemon gone) comes from torch's
    allocator instead (memory_stats() counts them). Each allocation registers memory with the
    daemon: meant for long-lived buffers, not a training step's temporaries."""
    _push_allocator(_cpu_backend(group, "colld_memory"), int(min_bytes))
    try:
        yield
    finally:
        _pop_allocator()


def memory_stats(group=None):
    """What went zero copy: the group's colld client's counters (`zero_copy`: host collectives
    whose buffers all lay in colld memory; `staged`, `staged_bytes`: those libcolld staged, and the
    bytes it copied; the fast path's small calls are in neither), the group's small operations
    issued on the caller's thread (`inline`: completed there, `inline_handed_off`: handed to the
    worker, docs/torch.md), and this process's colld allocators' (`colld_allocs`, `colld_bytes`
    still allocated, `fallbacks` to torch's allocator and why the last one happened
    (`last_fallback`), `small` allocations left to torch's allocator)."""
    stats = dict(_client_stats(_cpu_backend(group, "memory_stats")))
    stats.update(_alloc_stats())
    return stats


def empty(*size, dtype=None, group=None):
    """A CPU tensor (contents uninitialized, as torch.empty) in memory shared with the colld daemon
    of `group` (default: the default process group, which must be "colld"). That group's
    operations on it, or on any view of it, are zero copy; other tensors are staged by libcolld.
    Its memory is freed with its storage. empty(4, 8) and empty((4, 8)) are alike."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, _torch.Size)):
        size = tuple(size[0])
    backend = _cpu_backend(group, "empty")
    like = _torch.empty(0, dtype=dtype if dtype is not None else _torch.get_default_dtype())
    return _empty(backend, [int(s) for s in size], like)


def _create(store, rank, world_size, timeout):
    """The creator torch.distributed calls for each group of backend "colld": it returns the CPU
    c10d.Backend, which torch wraps in its ProcessGroup. Its store is prefixed with the group's
    name (and "cpu/"), so each subgroup's colld unique id has a key of its own.

    DDP's gradient buckets: torch's reducer asks the group's backend for them (allocateTensor:
    colld memory, so DDP's all-reduces are zero copy) only where DDP_DISABLE_COMM_MEM is "0"
    (torch's default is "1"); it is set here, for this process, unless the user set it or
    TORCH_COLLD_DDP_BUCKETS is "0" (docs/torch.md, "Zero copy for DDP's buckets")."""
    if _os.environ.get("TORCH_COLLD_DDP_BUCKETS", "1") != "0":
        _os.environ.setdefault("DDP_DISABLE_COMM_MEM", "0")
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
