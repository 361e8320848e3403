"""torch <-> CuPy without copies, on torch's current CUDA stream."""

from __future__ import annotations

import os

__all__ = ["cupy_view", "use_torch_stream", "use_torch_allocator"]

_allocator_installed = False


class _TorchBlock:
    """Owner of a block from torch's caching allocator; frees it when CuPy drops it."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr

    def __del__(self):
        import torch

        torch.cuda.caching_allocator_delete(self.ptr)


def _torch_malloc(size: int):
    import cupy
    import torch

    device = cupy.cuda.Device().id
    stream = cupy.cuda.get_current_stream().ptr
    ptr = torch.cuda.caching_allocator_alloc(max(int(size), 1), device, stream)
    mem = cupy.cuda.UnownedMemory(ptr, size, _TorchBlock(ptr), device)
    return cupy.cuda.MemoryPointer(mem, 0)


def use_torch_allocator() -> None:
    """Route CuPy's device allocations (the engine's scratch: X, alphas,
    posteriors) through torch's caching allocator, so one pool serves both
    libraries and ``torch.cuda.max_memory_allocated`` counts chainfb's memory.
    Set ``CHAINFB_CUPY_ALLOCATOR=cupy`` to keep CuPy's own pool."""
    global _allocator_installed
    if _allocator_installed or os.environ.get("CHAINFB_CUPY_ALLOCATOR", "torch") == "cupy":
        return
    import cupy

    cupy.cuda.set_allocator(_torch_malloc)
    _allocator_installed = True


def use_torch_stream(device_index: int):
    """Make torch's current stream on ``device_index`` CuPy's current stream
    for that device (thread-local in CuPy), so CuPy work is ordered with
    torch's without any synchronisation.  Returns the CuPy stream."""
    import cupy
    import torch

    with cupy.cuda.Device(device_index):
        ts = torch.cuda.current_stream(device_index)
        cs = cupy.cuda.get_current_stream()
        if cs.ptr != ts.cuda_stream:
            cs = cupy.cuda.ExternalStream(ts.cuda_stream, device_index)
            cs.use()
        return cs


def cupy_view(tensor):
    """A CuPy array sharing memory with a CUDA torch ``tensor`` (DLPack, no
    copy), with CuPy's current device set to the tensor's device and CuPy's
    current stream set to torch's current stream there.

    bfloat16 has no CuPy dtype: such a tensor comes back as an ``int16``
    view of its bits (convert with ``tensor.float()`` first for values)."""
    import torch

    from .kernels import require_cupy

    cupy = require_cupy()  # a clear error when CuPy is missing or built for another CUDA major version

    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        raise TypeError(f"tensor: expected a CUDA torch.Tensor, got {type(tensor).__name__}")
    dev = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    cupy.cuda.Device(dev).use()
    use_torch_allocator()
    use_torch_stream(dev)
    return cupy.from_dlpack(tensor)
