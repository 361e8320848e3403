"""How the CUDA engines lay out their arrays in device memory: few
allocations and transfers a call.

- :func:`pack` builds host arrays as views of one host buffer;
- :func:`upload` copies a lattice's host arrays (:func:`chainfb.engines.cuda.lattice_host_arrays`) to the
  device as one such buffer, each device array a view of its copy: one transfer and one allocation a new
  lattice instead of some twenty of each (a new lattice every training step when the labels change);
- :func:`scratch` gives the arrays a call uses and drops together (the rows, their offsets) as views of one
  allocation.

Every array starts at a multiple of :data:`PACK_ALIGN` bytes of its buffer.
A kernel backend whose ``separate_arrays`` is true (a run under a memory
checker, AddressSanitizer or compute-sanitizer, which sees an access past an
array only at the end of its allocation) gets one allocation an array from
:func:`upload` and :func:`scratch` instead.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
from numpy.typing import DTypeLike

from .._arrays import Array
from ..cuda.kernels import KernelBackend

__all__ = ["PACK_ALIGN", "packing", "pack", "upload", "scratch"]


#: where each array packed into one allocation starts: a multiple of this many bytes
PACK_ALIGN = 256


def packing(nbytes: list[int]) -> tuple[list[int], int]:
    """``(starts, total)``: arrays of ``nbytes`` bytes one after another in one
    buffer, each at a multiple of :data:`PACK_ALIGN` bytes."""
    starts, end = [], 0
    for n in nbytes:
        starts.append(end)
        end += -(-n // PACK_ALIGN) * PACK_ALIGN
    return starts, max(end, 1)


def pack(arrays: dict[str, tuple[np.ndarray, DTypeLike]]) -> dict[str, np.ndarray]:
    """``{name: (array, dtype)}`` -> ``{name: array in dtype}``, every result
    a view of one new host buffer (:func:`packing`), written by one
    conversion each (no copy besides)."""
    sizes = [v.size * np.dtype(dt).itemsize for v, dt in arrays.values()]
    starts, total = packing(sizes)
    buf = np.empty(total, dtype=np.uint8)
    out = {}
    for a, n, (k, (v, dt)) in zip(starts, sizes, arrays.items()):
        view = buf[a: a + n].view(dt).reshape(np.shape(v))
        np.copyto(view, v, casting="unsafe")
        out[k] = view
    return out


def _view(buf: Array, offset: int, shape: tuple, dtype: DTypeLike) -> Array:
    """The C-contiguous array of ``shape`` and ``dtype`` at byte ``offset`` of
    the 1-D byte buffer ``buf`` (NumPy or CuPy), keeping ``buf``'s memory
    alive, made in one step (a slice, a view and a reshape are three CuPy
    operations, each with its host cost, for each of a lattice's twenty
    arrays)."""
    if isinstance(buf, np.ndarray):
        return np.ndarray(shape, dtype, buffer=buf, offset=offset)
    return type(buf)(shape, dtype, buf.data + offset)  # cupy.ndarray over the allocation's MemoryPointer


def _on_device(xp: ModuleType, views: dict[str, np.ndarray]) -> dict:
    """The views of one host buffer (:func:`pack`'s) as the same views of its
    device copy: one transfer."""
    if not views:
        return {}
    base = next(iter(views.values())).base
    device = xp.asarray(base)
    origin = base.__array_interface__["data"][0]
    return {k: _view(device, v.__array_interface__["data"][0] - origin, v.shape, v.dtype) for k, v in views.items()}


def upload(backend: KernelBackend, host: dict, dtype: DTypeLike) -> dict:
    """``host`` (arrays, ints and Nones from
    :func:`~chainfb.engines.cuda.lattice_host_arrays`) on ``backend``'s
    device, float arrays in ``dtype``, the others in their own dtypes.

    One transfer: the arrays are packed into one host buffer (:func:`pack`),
    copied to the device as it is, and each device array is a view of the
    copy.  A lattice's arrays are some twenty; one device allocation and one
    copy apiece would be twenty of each on every new lattice (new labels
    every training step), and each copy costs the host about a tenth of a
    millisecond on a GPU machine.  A backend whose ``separate_arrays`` is
    true (a run under a memory checker, AddressSanitizer or
    compute-sanitizer, which sees an access past an array only at the end of
    its allocation) gets one allocation an array instead."""
    xp = backend.xp
    arrays = {k: v for k, v in host.items() if isinstance(v, np.ndarray)}
    if getattr(backend, "separate_arrays", False):
        return {**host, **{k: xp.array(v.astype(dtype) if v.dtype.kind == "f" else v)  # (a copy: its own buffer)
                           for k, v in arrays.items()}}
    return {**host, **_on_device(xp, pack({k: (v, dtype if v.dtype.kind == "f" else v.dtype)
                                           for k, v in arrays.items()}))}


def scratch(backend: KernelBackend, specs: list[tuple[tuple[int, ...], DTypeLike]]) -> list[Array]:
    """Uninitialised device arrays of the ``(shape, dtype)`` of ``specs``, as
    views of one allocation (:func:`packing`; one allocation each where the
    backend's ``separate_arrays`` is true, see :func:`upload`).  For the
    arrays a call uses and drops together: one allocation instead of one
    an array, on every call."""
    xp = backend.xp
    if getattr(backend, "separate_arrays", False):
        return [xp.empty(shape, dtype=dtype) for shape, dtype in specs]
    sizes = [int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in specs]
    starts, total = packing(sizes)
    buf = xp.empty(total, dtype=np.uint8)
    return [_view(buf, a, shape, dtype) for a, (shape, dtype) in zip(starts, specs)]
