"""Array plumbing shared by the public entry points: which library an input
belongs to, zero-copy views between torch and NumPy/CuPy, and argument
checks (which live in :mod:`chainfb.checks`).  (Which engine runs is decided in
:mod:`chainfb.engines` alone.)"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, TypeGuard

import numpy as np
import torch

from . import checks
from .checks import FLOATS, INTS

__all__ = ["is_torch", "is_cupy", "is_cuda", "as_array", "wrap_like", "check_lengths", "check_tensor",
           "FLOATS", "INTS", "Array", "Ints"]

#: An array argument: a NumPy array, a torch tensor (CPU or CUDA) or a CuPy array.  CuPy is optional, so its
#: type cannot be named: the alias is ``Any``; each function's docstring gives the shape and dtypes it takes.
Array = Any
#: Integers given per sequence or per frame (lengths, labels): a list or tuple of ints, or an integer array.
Ints = Sequence[int] | Array

check_tensor = checks.tensor


def is_torch(x: object) -> TypeGuard[torch.Tensor]:
    """True for torch tensors (CPU or CUDA)."""
    return isinstance(x, torch.Tensor)


def is_cupy(x: object) -> bool:
    """True for CuPy arrays (told by their module: CuPy is not imported)."""
    return type(x).__module__.startswith("cupy")


def is_cuda(x: object) -> bool:
    """True for CUDA torch tensors and CuPy arrays."""
    return (is_torch(x) and x.is_cuda) or is_cupy(x)


def as_array(x: Array, name: str,
             float_dtypes: tuple | None = (np.float32, np.float64)) -> tuple[Array, ModuleType]:
    """``(array, xp)``: a NumPy view of a NumPy array or CPU tensor, or a CuPy
    view of a CuPy array or CUDA tensor (no copy), and its array module."""
    if is_torch(x):
        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.float()
        if x.is_cuda:
            from .cuda.interop import cupy_view

            x = cupy_view(x)
        else:
            x = x.numpy()
    elif not (isinstance(x, np.ndarray) or is_cupy(x)):
        raise TypeError(f"{name}: expected a NumPy array or torch tensor, got {type(x).__name__}")
    if float_dtypes is not None and x.dtype not in float_dtypes:
        names = ", ".join(np.dtype(d).name for d in float_dtypes)
        raise TypeError(f"{name}: expected dtype {names}, got {x.dtype}")
    if is_cupy(x):
        import cupy

        return x, cupy
    return x, np


def wrap_like(arr: Array, like: Array) -> Array:
    """``arr`` as a torch tensor when ``like`` is one (zero-copy), else as is."""
    if not is_torch(like):
        return arr
    if isinstance(arr, np.ndarray):
        return torch.from_numpy(arr)
    return torch.from_dlpack(arr)


def check_lengths(lengths: Ints | None, N: int, T: int, name: str = "lengths") -> np.ndarray:
    """``lengths`` as int64 ``[N]`` in ``[0, T]`` (NumPy); ``None`` means all ``T``
    (:func:`chainfb.checks.lengths`)."""
    return checks.lengths(lengths, name, N, T)
