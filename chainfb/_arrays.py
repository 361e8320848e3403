"""Array plumbing shared by the public entry points: which library an input
belongs to, zero-copy views between torch and NumPy/CuPy, and argument
checks with clear messages.  (Which engine runs is decided in
:mod:`chainfb.engines` alone.)"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["is_torch", "is_cupy", "is_cuda", "as_array", "wrap_like", "check_lengths", "check_tensor",
           "FLOATS", "INTS"]

#: float dtypes the losses take (half types are computed in float32)
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: integer dtypes of labels, lengths and ranges
INTS = (torch.int32, torch.int64)


def check_tensor(x, name: str, dtypes=None, ndim=None, layout: str = ""):
    """``x`` itself, checked: a torch tensor (else ``TypeError``), of one of
    ``dtypes`` (else ``TypeError``), with ``ndim`` dimensions (else
    ``ValueError``; ``layout`` such as ``"[B, T, U, V]"`` is named in the
    message).  Every message starts with ``name``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if dtypes is not None and x.dtype not in dtypes:
        names = [str(d).replace("torch.", "") for d in dtypes]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        raise TypeError(f"{name}: expected {listed}, got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor{' ' + layout if layout else ''}, "
                         f"got shape {tuple(x.shape)}")
    return x


def is_torch(x) -> bool:
    return isinstance(x, torch.Tensor)


def is_cupy(x) -> bool:
    return type(x).__module__.startswith("cupy")


def is_cuda(x) -> bool:
    """True for CUDA torch tensors and CuPy arrays."""
    return (is_torch(x) and x.is_cuda) or is_cupy(x)


def as_array(x, name: str, float_dtypes=(np.float32, np.float64)):
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


def wrap_like(arr, like):
    """``arr`` as a torch tensor when ``like`` is one (zero-copy), else as is."""
    if not is_torch(like):
        return arr
    if isinstance(arr, np.ndarray):
        return torch.from_numpy(arr)
    return torch.from_dlpack(arr)


def check_lengths(lengths, N: int, T: int, name: str = "lengths") -> np.ndarray:
    """``lengths`` as int64 ``[N]`` in ``[0, T]`` (NumPy); ``None`` means all ``T``."""
    if lengths is None:
        return np.full(N, T, dtype=np.int64)
    if is_torch(lengths):
        lengths = lengths.detach().cpu().numpy()
    elif is_cupy(lengths):
        lengths = lengths.get()
    lengths = np.asarray(lengths)
    if lengths.size == 0 and N == 0:  # e.g. lengths=[] for an empty batch
        return np.zeros(0, dtype=np.int64)
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer frame counts, got dtype {lengths.dtype}")
    if lengths.shape != (N,):
        raise ValueError(f"{name}: expected shape ({N},), got {tuple(lengths.shape)}")
    lengths = lengths.astype(np.int64)
    if N and (lengths.min() < 0 or lengths.max() > T):
        bad = lengths[(lengths < 0) | (lengths > T)][0]
        raise ValueError(f"{name}: every length must lie in [0, T={T}], got {bad}")
    return lengths
