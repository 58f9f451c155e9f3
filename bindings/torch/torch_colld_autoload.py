"""torch_colld_autoload: run by `import torch` where torch_colld is installed or on PYTHONPATH.

torch 2.x loads every entry point of the group "torch.backends" at the end of `import torch`
(unless TORCH_DEVICE_BACKEND_AUTOLOAD=0); torch_colld's dist-info names register() below, so
`dist.init_process_group("colld")` works without `import torch_colld` (docs/torch.md).

It must never make `import torch` fail (torch raises for an entry point that does, and nothing
could import torch any more): when torch_colld cannot be loaded (a torch other than the one it was
built for, libcolld missing), the name "colld" is registered with a creator that raises, so that
init_process_group("colld") says why instead of torch's bare "Unknown backend type colld".
"""


def register():
    try:
        import torch_colld  # noqa: F401  (registers "colld")
    except Exception as e:  # noqa: BLE001  (whatever it is, import torch must go on)
        why = f"{type(e).__name__}: {e}"
        try:
            import torch.distributed as dist

            def unavailable(store, rank, world_size, timeout):
                raise RuntimeError(
                    "torch_colld is installed but could not be loaded, so the backend \"colld\" is "
                    f"unavailable: {why} (`import torch_colld` shows the whole error; it must be built "
                    "for this Python's torch, and find libcolld)")

            if "COLLD" not in dist.Backend._plugins:
                dist.Backend.register_backend("colld", unavailable, devices=["cpu"])
        except Exception:  # noqa: BLE001  (no torch.distributed: nothing to register with)
            pass
