"""torch <-> CuPy without copies, and the scope in which chainfb's CuPy work
for CUDA torch tensors runs.

chainfb never changes CuPy's current device, stream or allocator outside
its own calls.  A public entry point that does CuPy work for CUDA torch
tensors runs it inside :func:`torch_stream` (directly, or through the
:func:`on_torch_stream` decorator): within the block CuPy works on the
tensors' device, on torch's current stream there (so it is ordered with
torch's work without any synchronisation), and allocates from torch's
caching allocator; on exit -- an exception included -- CuPy's own context
managers (``with cupy.cuda.Device``, ``with stream``,
``cupy.cuda.using_allocator``) restore what the caller had.  CuPy arrays
given by the caller run on the caller's CuPy stream and allocator, as CuPy
itself would.

Device arrays chainfb caches across calls (a lattice's arrays) are keyed by
device *and* stream (:func:`chainfb.engines.cuda.cached`), so a cached array
is only ever used on the stream it was allocated and uploaded on.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .kernels import extent_bytes, require_cupy

if TYPE_CHECKING:
    import torch

__all__ = ["cupy_view", "torch_stream", "on_torch_stream", "cuda_device_of", "current_torch_stream", "torch_place"]


def _dtypes() -> dict:
    import numpy as np
    import torch

    names = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex64",
             "complex128")
    return {getattr(torch, n): np.dtype(n) for n in names}


#: the tensor dtypes :func:`cupy_view` wraps directly, and their NumPy (CuPy) dtypes
_DTYPES = _dtypes()


def _torch_private(name: str) -> Callable[..., Any] | None:
    """``torch._C``'s function ``name``, or None where this torch lacks it (a CPU build, a torch that renamed
    it).  The few used here are what torch's own public wrappers call, without their Python argument handling
    (device-index parsing, a device context manager), which costs tens of microseconds a call -- a step on
    the GPU makes some ten such calls."""
    import torch

    return getattr(torch._C, name, None)


def current_torch_stream(device: int) -> int:
    """The handle (``cudaStream_t`` as an int; 0 for the default stream) of torch's current stream on CUDA
    device ``device``: ``torch.cuda.current_stream(device).cuda_stream``."""
    raw = _torch_private("_cuda_getCurrentRawStream")
    if raw is not None:
        return int(raw(device))
    import torch

    return int(torch.cuda.current_stream(device).cuda_stream)


def torch_place(device: torch.device) -> tuple:
    """Where torch tensors made now on ``device`` live and are ordered: ``(type,)`` off the GPU, ``("cuda",
    index, torch's current stream there)`` on it -- the key of tensors kept across calls (a tensor used only on
    the stream that made it needs no cross-stream synchronisation)."""
    if device.type != "cuda":
        return (device.type,)
    if device.index is None:
        import torch

        index = torch.cuda.current_device()
    else:
        index = device.index
    return ("cuda", index, current_torch_stream(index))


class _TorchBlock:
    """Owner of a block from torch's caching allocator; hands it back to
    torch (``free``, ``torch.cuda.caching_allocator_delete`` bound when the
    block is made) when CuPy drops it.

    CuPy may drop a block while the interpreter shuts down (a device array
    kept in a cache until then): ``__del__`` then can import nothing, so it
    uses only what it was given, and it never raises -- a block whose free
    fails then (torch's allocator already torn down) goes with the process."""

    __slots__ = ("ptr", "free")

    def __init__(self, ptr, free):
        self.ptr = ptr
        self.free = free

    def __del__(self):
        free, self.free = self.free, None
        if free is None:
            return
        try:
            free(self.ptr)
        except Exception:  # noqa: BLE001 -- nothing can take it back any more; never an error at exit
            pass


def torch_malloc(size: int) -> Any:
    """A CuPy allocator (``cupy.cuda.using_allocator``) drawing from torch's
    caching allocator, on CuPy's current device and stream."""
    import torch

    cupy = require_cupy()
    device = cupy.cuda.Device().id
    stream = cupy.cuda.get_current_stream().ptr
    n = max(int(size), 1)
    alloc = _torch_private("_cuda_cudaCachingAllocator_raw_alloc")
    free = _torch_private("_cuda_cudaCachingAllocator_raw_delete")
    if alloc is not None and free is not None:  # (on CUDA's current device, which CuPy's current device is)
        ptr = alloc(n, stream)
    else:
        ptr, free = torch.cuda.caching_allocator_alloc(n, device, stream), torch.cuda.caching_allocator_delete
    mem = cupy.cuda.UnownedMemory(ptr, size, _TorchBlock(ptr, free), device)
    return cupy.cuda.MemoryPointer(mem, 0)


def cuda_device_of(*xs: Any) -> int | None:
    """The device index of the first CUDA torch tensor among ``xs`` (tuples
    and lists are looked into, one level), or None when there is none."""
    import torch

    for x in xs:
        for t in x if isinstance(x, (tuple, list)) else (x,):
            if isinstance(t, torch.Tensor) and t.is_cuda:
                return t.device.index if t.device.index is not None else torch.cuda.current_device()
    return None


@contextlib.contextmanager
def torch_stream(device: int | None) -> Iterator[Any]:
    """Within the block, CuPy's current device is ``device``, its current
    stream is torch's current stream on that device, and its allocator is
    torch's caching allocator (:func:`torch_malloc`; set
    ``CHAINFB_CUPY_ALLOCATOR=cupy`` to keep the caller's CuPy allocator).
    All three are restored on exit.  Yields the CuPy stream, or None when
    ``device`` is None (no CUDA tensor involved: nothing is changed)."""
    if device is None:
        yield None
        return
    cupy = require_cupy()
    with cupy.cuda.Device(device):
        handle = current_torch_stream(device)
        stream = cupy.cuda.Stream.null if handle == 0 else _external_stream(cupy, handle, device)
        keep = os.environ.get("CHAINFB_CUPY_ALLOCATOR", "torch") == "cupy"
        with stream, contextlib.nullcontext() if keep else cupy.cuda.using_allocator(torch_malloc):
            yield stream


#: CuPy's wrappers of torch's streams, by (handle, device): a wrapper holds no resource, and making one costs more
#: than the rest of entering :func:`torch_stream`.  Cleared when it reaches :data:`_STREAMS_KEPT` (streams come and
#: go: a handle may later name another stream, which its wrapper then stands for just as well).
_streams: dict[tuple[int, int], Any] = {}
_STREAMS_KEPT = 64


def _external_stream(cupy: Any, handle: int, device: int) -> Any:
    key = (handle, device)
    stream = _streams.get(key)
    if stream is None:
        if len(_streams) >= _STREAMS_KEPT:
            _streams.clear()
        stream = _streams[key] = cupy.cuda.ExternalStream(handle, device)
    return stream


def on_torch_stream(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: run ``fn`` inside :func:`torch_stream` for the device of
    the first CUDA torch tensor among its arguments (none: run it as is)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch_stream(cuda_device_of(*args, *kwargs.values())):
            return fn(*args, **kwargs)

    return wrapper


def cupy_view(tensor: torch.Tensor) -> Any:
    """A CuPy array sharing memory with a CUDA torch ``tensor`` (no copy).
    Changes no CuPy state.  Where CuPy's current stream and device are
    torch's current ones (inside :func:`torch_stream`, where chainfb calls
    it) the array is made over the tensor's memory directly, keeping the
    tensor alive: the two libraries' work is already ordered on that one
    stream.  Elsewhere it goes through DLPack, whose hand-over orders CuPy's
    current stream after torch's.

    bfloat16 has no CuPy dtype: such a tensor comes back as an ``int16``
    view of its bits (convert with ``tensor.float()`` first for values)."""
    import torch

    cupy = require_cupy()  # a clear error when CuPy is missing or built for another CUDA major version
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        raise TypeError(f"tensor: expected a CUDA torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    dtype = _DTYPES.get(tensor.dtype)
    device = tensor.device.index
    if (dtype is None or tensor.numel() == 0 or cupy.cuda.Device().id != device
            or cupy.cuda.get_current_stream().ptr != current_torch_stream(device)):
        return cupy.from_dlpack(tensor)
    return _wrap(cupy, tensor, dtype)


def _wrap(cupy: Any, tensor: torch.Tensor, dtype: Any) -> Any:
    """A CuPy array over a non-empty CUDA ``tensor``'s memory, of NumPy ``dtype``, its shape and strides,
    holding a reference to the tensor (so to its storage) for as long as it lives."""
    size = tensor.element_size()
    strides = tuple(size * s for s in tensor.stride())
    mem = cupy.cuda.UnownedMemory(tensor.data_ptr(), extent_bytes(tensor.shape, strides, size), tensor,
                                  tensor.device.index)
    return cupy.ndarray(tuple(tensor.shape), dtype, cupy.cuda.MemoryPointer(mem, 0), strides)
