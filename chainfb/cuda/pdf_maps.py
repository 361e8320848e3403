"""The score map of pdf-labelled graphs through the kernels of ``pdf_map.cu``,
launched on a kernel backend (the GPU's: :func:`chainfb.cuda.kernels.cupy_backend`).

:class:`chainfb.score_map.PdfScoreMap` calls these for device arrays: the
engine's compact scores come out of the network output in one launch, and
the posteriors go back into its gradient in one (scaled per sequence on the
way), where CuPy's fancy indexing took a gather, a cast, an index, a
multiply and a scatter, each a launch with its own host work.  The results
are the NumPy path's to the bit (see the kernel file's header).

A strided ``[N, T, P]`` array reaches the kernels as its extent: the
elements from ``(0, 0, 0)`` to its last one, a contiguous 1-D view of the
same memory (:func:`extent`), with its row stride ``sT`` and each compact
column's offset ``offs[c] = n sN + p sP``.
"""

from __future__ import annotations

from types import ModuleType
import numpy as np
from numpy.typing import DTypeLike

from .._arrays import Array
from .kernels import KERNELS, REAL_TYPES, KernelBackend, extent_bytes, null_or

__all__ = ["extent", "gather_kernel", "scatter_kernel", "gather", "scatter"]

#: threads per block; the grid-stride loops need no more blocks than this many
BLOCK = 256
MAX_BLOCKS = 4096


def extent(xp: ModuleType, arr: Array) -> tuple[Array, int]:
    """``(flat, n)``: the ``n`` elements of ``arr``'s memory from its first
    element to its last (non-negative strides), as a contiguous 1-D ``xp``
    view; element ``(i, j, k)`` of ``arr`` is ``flat[i sN + j sT + k sP]``."""
    item = arr.itemsize
    n = extent_bytes(arr.shape, arr.strides, item) // item
    return xp.lib.stride_tricks.as_strided(arr, shape=(n,), strides=(item,)), n


def _instantiation(template: str, a: DTypeLike, b: DTypeLike) -> str | None:
    """``chainfb::template<A, B>`` for the C++ types of dtypes ``a`` and ``b``, where ``pdf_map.cu`` has it
    (:data:`~chainfb.cuda.kernels.KERNELS`), else None."""
    ta, tb = REAL_TYPES.get(np.dtype(a)), REAL_TYPES.get(np.dtype(b))
    name = f"chainfb::{template}<{ta}, {tb}>"
    return name if name in KERNELS else None


def gather_kernel(in_dtype: DTypeLike, out_dtype: DTypeLike) -> str | None:
    """The ``pdf_gather`` instantiation for these dtypes, or None (no kernel: the caller uses array operations)."""
    return _instantiation("pdf_gather", in_dtype, out_dtype)


def scatter_kernel(post_dtype: DTypeLike, target_dtype: DTypeLike) -> str | None:
    """The ``pdf_scatter`` instantiation for these dtypes, or None (no kernel: the caller uses array operations)."""
    return _instantiation("pdf_scatter", post_dtype, target_dtype)


def _grid(total: int) -> int:
    return min(MAX_BLOCKS, -(-total // BLOCK))


def gather(backend: KernelBackend, scores: Array, offs: Array, dtype: DTypeLike,
           clip: tuple[float, float] | None = None) -> Array:
    """Compact scores ``X [T, C]`` (``dtype``, row-major) of ``scores [N, T,
    P]`` (float32/float64, non-negative strides), column ``c`` at element
    offset ``offs[c]`` (int64 ``[C]`` on the device) of each frame, clipped
    to ``clip`` when it is given; for dtypes :func:`gather_kernel` has."""
    xp = backend.xp
    T, C = int(scores.shape[1]), int(offs.shape[0])
    out = xp.empty((T, C), dtype=dtype)
    flat, n = extent(xp, scores)
    lo, hi = clip if clip is not None else (0.0, 0.0)
    backend.launch(gather_kernel(scores.dtype, dtype), _grid(T * C), BLOCK,
                   [flat, np.int64(n), np.int64(scores.strides[1] // scores.itemsize), offs, np.int32(T),
                    np.int32(C), np.int32(clip is not None), np.float64(lo), np.float64(hi), out])
    return out


def scatter(backend: KernelBackend, target: Array, post: Array, offs: Array, scale: float = 1.0,
            seq_scale: Array | None = None, col_seq: Array | None = None, accumulate: bool = True) -> None:
    """``target[n, t, p] (+)= scale * seq_scale[n] * post[t, c]`` for each
    column ``c = (n, p)`` at element offset ``offs[c]`` and each frame ``t``
    of both arrays (``=`` without ``accumulate``); ``target [N, T, P]``
    (non-negative strides), ``post [T', C]``; ``seq_scale [N]`` (optional, with
    ``col_seq [C]``, int64, each column's sequence).  For dtypes
    :func:`scatter_kernel` has."""
    xp = backend.xp
    T, C = min(int(target.shape[1]), int(post.shape[0])), int(offs.shape[0])
    post = xp.ascontiguousarray(post)
    if seq_scale is not None:
        seq_scale = xp.ascontiguousarray(seq_scale.astype(post.dtype, copy=False))
    flat, n = extent(xp, target)
    backend.launch(scatter_kernel(post.dtype, target.dtype), _grid(T * C), BLOCK,
                   [flat, np.int64(n), np.int64(target.strides[1] // target.itemsize), offs, post, np.int32(T),
                    np.int32(C), np.int32(scale != 1.0), np.float64(scale),
                    null_or(seq_scale), null_or(None if seq_scale is None else col_seq),
                    np.int32(bool(accumulate))])
