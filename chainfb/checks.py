"""Argument checks, in one place and one style, for every public function.

Each check takes the value and the argument's ``name`` and returns the
value in the form the library uses (a Python ``int``/``float``/``bool``, an
int64 NumPy array, the tensor itself), or raises ``TypeError`` (wrong kind
of thing) / ``ValueError`` (right kind, wrong value) whose message starts
with ``name``.  Public functions call these once, at the top; the layers
below take the checked values and do not check again.

Also here: :func:`reduce`, the one reduction of per-sequence values
(:class:`LRU`, the cache, lives in :mod:`chainfb._cache` and is served from
here under its old name).
"""

from __future__ import annotations

import numbers
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._cache import LRU  # noqa: F401 -- its old import path

if TYPE_CHECKING:  # chainfb._arrays imports this module
    from ._arrays import Ints

__all__ = [
    "FLOATS", "INTS", "tensor", "flag", "number", "integer", "choice", "reduction", "reduce", "values_like",
    "lengths", "int_array", "blank", "durations",
]

#: float dtypes the losses take (half types are computed in float32)
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: integer dtypes of labels, lengths and ranges
INTS = (torch.int32, torch.int64)


def _listed(items) -> str:
    items = [repr(i) if isinstance(i, str) else str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def tensor(x: Any, name: str, dtypes: Collection[torch.dtype] | None = None, ndim: int | None = None,
           layout: str = "") -> torch.Tensor:
    """``x`` itself, checked: a torch tensor (else ``TypeError``), of one of
    ``dtypes`` (else ``TypeError``), with ``ndim`` dimensions (else
    ``ValueError``; ``layout`` such as ``"[B, T, U, V]"`` is named)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"{name}: expected {_listed([str(d).replace('torch.', '') for d in dtypes])}, "
                        f"got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor{' ' + layout if layout else ''}, "
                         f"got shape {tuple(x.shape)}")
    return x


def flag(value: Any, name: str) -> bool:
    """A boolean flag: ``True``/``False`` (or a NumPy bool) only -- a string
    such as ``"False"`` or a number is a ``TypeError``, not silently truthy."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name}: expected True or False, got {value!r} ({type(value).__name__})")


def number(value: Any, name: str, lo: float | None = None, hi: float | None = None, *, finite: bool = True,
           lo_open: bool = False, hi_open: bool = False) -> float:
    """A real number (Python or NumPy scalar; not a bool, a string or a
    tensor) as a float, checked against ``[lo, hi]`` (``lo_open`` /
    ``hi_open`` exclude the ends).  ``finite=False`` lets NaN and infinities
    through (unless the bounds exclude them)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name}: expected a number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if finite and not np.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {v}")
    if np.isnan(v) and (lo is not None or hi is not None):
        raise ValueError(f"{name}: expected a number, got NaN")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ValueError(f"{name}: expected a value {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and (v > hi or (hi_open and v == hi)):
        raise ValueError(f"{name}: expected a value {'<' if hi_open else '<='} {hi}, got {v}")
    return v


def integer(value: Any, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (Python or NumPy; not a bool, a float or a string) as an
    ``int`` in ``[lo, hi]``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"{name}: expected an int, got {value!r} ({type(value).__name__})")
    v = int(value)
    if lo is not None and v < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name}: expected an int <= {hi}, got {v}")
    return v


def choice(value: Any, name: str, allowed: Sequence[str]) -> str:
    """``value`` if it is one of ``allowed`` (strings), else ``ValueError``."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name}: expected {_listed(allowed)}, got {value!r}")
    return value


#: the reductions :func:`reduce` knows, and what each means
REDUCTIONS = {
    "none": "the per-sequence values [N]",
    "sum": "their sum",
    "mean": "their batch mean",
    "mean_batch": "their batch mean (NeMo's name)",
    "mean_volume": "their sum divided by the total target length (NeMo)",
    "frame": "their sum divided by the total frame count",
}


def reduction(value: Any, allowed: Sequence[str] = ("none", "mean", "sum"), name: str = "reduction") -> str:
    """A reduction name among ``allowed`` (a subset of :data:`REDUCTIONS`)."""
    return choice(value, name, allowed)


def reduce(values: torch.Tensor, how: str, total: Ints | float | None = None) -> torch.Tensor:
    """``values [N]`` reduced: ``"none"``, ``"sum"``, ``"mean"`` /
    ``"mean_batch"`` (batch mean), or ``"mean_volume"`` / ``"frame"`` (the
    sum divided by ``total``: target lengths or frame counts ``[N]``, or
    their sum; a total of 0 divides by 1)."""
    if how == "none":
        return values
    if how == "sum":
        return values.sum()
    if how in ("mean", "mean_batch"):
        return values.mean()
    if how in ("mean_volume", "frame"):
        if total is None:
            raise ValueError(f"reduction: {how!r} needs the total length")
        return values.sum() / torch.clamp(values_like(total, values).sum(), min=1)
    raise ValueError(f"reduction: expected one of {_listed(REDUCTIONS)}, got {how!r}")


def values_like(values: Ints | float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` (numbers, a NumPy array, or a tensor) as a tensor of ``like``'s dtype on its device.  Host
    values reach a GPU without blocking: torch's blocking copy waits for all the device's queued work, where
    this one is made from a fresh host tensor of the target dtype -- pageable memory, which CUDA stages at
    once, so a later change of the caller's data cannot reach the copy.  So labels and lengths on the host (a
    data loader's) cost a loss's reduction no synchronisation."""
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            return values.to(device=like.device, dtype=like.dtype)
        host = values.detach().to(dtype=like.dtype, copy=True)
    else:
        host = torch.tensor(np.asarray(values), dtype=like.dtype)
    return host.to(device=like.device, non_blocking=True)


def int_array(x: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """Integers (a torch integer tensor, a NumPy integer array or a sequence
    of Python ints) as an int64 NumPy array; floats and bools are a
    ``TypeError`` (never truncated)."""
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise TypeError(f"{name}: expected integers, got a {x.dtype} tensor")
        arr = x.detach().cpu().numpy()
    else:
        if type(x).__module__.startswith("cupy"):
            x = x.get()
        arr = np.asarray(x)
        if arr.size == 0 and arr.dtype.kind == "f":  # [] -> float64 in NumPy
            arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array of ints, got shape {tuple(arr.shape)}")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name}: value {arr.max()} does not fit int64")
    return arr.astype(np.int64, copy=False)


def lengths(x: Any, name: str, N: int, T: int | None = None, bound: str = "T") -> np.ndarray:
    """Lengths ``[N]`` as int64 NumPy in ``[0, T]`` (``T=None``: no upper
    bound); ``None`` means all ``T``.  ``bound`` names what ``T`` is in the
    message (e.g. ``"targets.shape[1]"`` for label counts)."""
    if x is None:
        if T is None:
            raise ValueError(f"{name}: expected [{N}] lengths, got None")
        return np.full(N, T, dtype=np.int64)
    arr = int_array(x, name)
    if arr.size == 0 and N == 0:  # e.g. lengths=[] for an empty batch
        return np.zeros(0, dtype=np.int64)
    if arr.shape != (N,):
        raise ValueError(f"{name}: expected shape ({N},), got {tuple(arr.shape)}")
    if N and T is not None and (arr.min() < 0 or arr.max() > T):
        raise ValueError(f"{name}: every length must lie in [0, {bound}={T}], got {arr[(arr < 0) | (arr > T)][0]}")
    if N and arr.min() < 0:
        raise ValueError(f"{name}: every length must be >= 0, got {arr.min()}")
    return arr


def blank(value: Any, V: int | None = None, name: str = "blank", negative: bool = False, reserved: int = 0) -> int:
    """A blank index as an ``int`` in ``[0, V)``; ``negative=True`` lets
    ``-V <= blank < 0`` mean ``V + blank`` (torchaudio).  ``reserved``
    indices below the blank must also fit (multi-blank: the big blanks)."""
    b = integer(value, name)
    if V is None:
        if b < 0:
            raise ValueError(f"{name}: expected an index >= 0, got {b}")
        return b
    r = b + V if (negative and b < 0) else b
    if not reserved <= r < V:
        lo = -V if negative and not reserved else reserved
        raise ValueError(f"{name}: expected an index in [{lo}, {V}) for vocabulary size {V}, got {value}")
    return r


def durations(value: Any, name: str, lo: int, hi: int | None = None) -> list:
    """A non-empty sequence (list, tuple, 1-D integer tensor or array) of
    integer durations in ``[lo, hi]`` as a list of ``int``."""
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{name}: expected a sequence of ints, got {type(value).__name__}")
    if isinstance(value, (torch.Tensor, np.ndarray)):
        items = int_array(value, name, 1).tolist()
    else:
        try:
            items = list(value)
        except TypeError:
            raise TypeError(f"{name}: expected a sequence of ints, got {type(value).__name__}") from None
    out = [integer(d, name) for d in items]
    if not out:
        raise ValueError(f"{name}: expected at least one duration")
    bad = [d for d in out if d < lo or (hi is not None and d > hi)]
    if bad:
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: every duration must be {rng}, got {bad[0]}")
    return out
