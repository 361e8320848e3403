"""How the CUDA engines lay out their arrays in device memory: few
allocations and transfers a call.

- :func:`pack` builds host arrays as views of one host buffer;
- :func:`upload` copies a lattice's host arrays (:func:`chainfb.engines.cuda.lattice_host_arrays`) to the
  device as such buffers, each device array a view of its buffer's copy: two transfers and two allocations
  a new lattice instead of some twenty of each (a new lattice every training step when the labels change);
- :func:`scratch` gives the arrays a call uses and drops together (the rows, their offsets) as views of one
  allocation.

Every array starts at a multiple of :data:`PACK_ALIGN` bytes of its buffer.
A kernel backend whose ``separate_arrays`` is true (a run under a memory
checker, AddressSanitizer or compute-sanitizer, which sees an access past an
array only at the end of its allocation) gets one allocation an array from
:func:`upload` and :func:`scratch` instead.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from .._arrays import Array
from ..cuda.kernels import KernelBackend

__all__ = ["PACK_ALIGN", "pack", "upload", "scratch"]


#: where each array packed into one allocation starts: a multiple of this many bytes
PACK_ALIGN = 256


def _packing(nbytes: list[int]) -> tuple[list[int], int]:
    """``(starts, total)``: arrays of ``nbytes`` bytes one after another in one
    buffer, each at a multiple of :data:`PACK_ALIGN` bytes."""
    starts, end = [], 0
    for n in nbytes:
        starts.append(end)
        end += -(-n // PACK_ALIGN) * PACK_ALIGN
    return starts, max(end, 1)


def pack(arrays: dict[str, tuple[np.ndarray, DTypeLike]]) -> dict[str, np.ndarray]:
    """``{name: (array, dtype)}`` -> ``{name: array in dtype}``, every result
    a view of one new host buffer (:func:`_packing`), written by one
    conversion each (no copy besides)."""
    sizes = [v.size * np.dtype(dt).itemsize for v, dt in arrays.values()]
    starts, total = _packing(sizes)
    buf = np.empty(total, dtype=np.uint8)
    out = {}
    for a, n, (k, (v, dt)) in zip(starts, sizes, arrays.items()):
        view = buf[a: a + n].view(dt).reshape(np.shape(v))
        np.copyto(view, v, casting="unsafe")
        out[k] = view
    return out


def _packed_buffers(arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """``(buffers, loose)``: the arrays that are C-contiguous views of a 1-D
    byte buffer they cover up to :func:`_packing`'s padding (what
    :func:`pack` made), grouped by buffer (``{id: (buffer, [names])}``), and
    the others (``{name: array}``)."""
    groups: dict[int, tuple[np.ndarray, list]] = {}
    loose = {}
    for k, v in arrays.items():
        base = v.base
        if isinstance(base, np.ndarray) and base.dtype == np.uint8 and base.ndim == 1 and v.flags.c_contiguous:
            groups.setdefault(id(base), (base, []))[1].append(k)
        else:
            loose[k] = v
    buffers = {}
    for key, (base, names) in groups.items():
        if _packing([arrays[k].nbytes for k in names])[1] >= base.nbytes:
            buffers[key] = (base, names)
        else:  # a view of something larger: copied on its own, not the whole of it
            loose.update({k: arrays[k] for k in names})
    return buffers, loose


def upload(backend: KernelBackend, host: dict, dtype: DTypeLike) -> dict:
    """``host`` (arrays, ints and Nones from
    :func:`~chainfb.engines.cuda.lattice_host_arrays`) on ``backend``'s
    device, float arrays in ``dtype``.

    Few transfers: the int32 arrays, views of one host buffer
    (:func:`~chainfb.engines.cuda.lattice_host_arrays` packs them), are copied to the device as that
    buffer, and the float arrays are packed into one more (:func:`pack`);
    each device array is a view of its buffer's copy.  A lattice's arrays
    are some twenty; one device allocation and one copy apiece would be
    twenty of each on every new lattice (new labels every training step).
    A backend whose ``separate_arrays`` is true (a run under a memory
    checker, AddressSanitizer or compute-sanitizer, which sees an access
    past an array only at the end of its allocation) gets one allocation an
    array instead."""
    xp = backend.xp
    arrays = {k: v for k, v in host.items() if isinstance(v, np.ndarray)}
    if getattr(backend, "separate_arrays", False):
        return {**host, **{k: xp.array(v.astype(dtype) if v.dtype.kind == "f" else v)  # (a copy: its own buffer)
                           for k, v in arrays.items()}}
    buffers, loose = _packed_buffers({k: v for k, v in arrays.items() if v.dtype.kind != "f"})
    rest = pack({**{k: (v, v.dtype) for k, v in loose.items()},
                 **{k: (v, dtype) for k, v in arrays.items() if v.dtype.kind == "f"}})
    if rest:  # (views of one new buffer)
        base = next(iter(rest.values())).base
        buffers[id(base)] = (base, list(rest))
    views = {**arrays, **rest}
    out = dict(host)
    for base, names in buffers.values():
        device = xp.asarray(base)
        origin = base.__array_interface__["data"][0]
        for k in names:
            v = views[k]
            a = v.__array_interface__["data"][0] - origin
            out[k] = device[a: a + v.nbytes].view(v.dtype).reshape(v.shape)
    return out


def scratch(backend: KernelBackend, specs: list[tuple[tuple[int, ...], DTypeLike]]) -> list[Array]:
    """Uninitialised device arrays of the ``(shape, dtype)`` of ``specs``, as
    views of one allocation (:func:`_packing`; one allocation each where the
    backend's ``separate_arrays`` is true, see :func:`upload`).  For the
    arrays a call uses and drops together: one allocation instead of one
    an array, on every call."""
    xp = backend.xp
    if getattr(backend, "separate_arrays", False):
        return [xp.empty(shape, dtype=dtype) for shape, dtype in specs]
    sizes = [int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in specs]
    starts, total = _packing(sizes)
    buf = xp.empty(total, dtype=np.uint8)
    return [buf[a: a + n].view(dtype).reshape(shape) for a, n, (shape, dtype) in zip(starts, sizes, specs)]
