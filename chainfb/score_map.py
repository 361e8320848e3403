"""The score map for pdf-labelled graphs: Kaldi's strided activation copy.

Kaldi copies only the ``(sequence, pdf)`` columns a minibatch's graphs use
out of the network output, viewed as ``T`` rows of ``num_sequences *
stride`` columns (``CopySpecificPdfsIndirect``), and adds derivatives back
through the same view (``AddSpecificPdfsIndirect``).  Here the network
output is any strided ``[N, T, P]`` array: element ``(n, t, p)`` lives at
``n*sN + t*sT + p*sP``, so column ``(n, p)`` is the fixed offset
``n*sN + p*sP`` into a ``T x width`` view whose row stride is ``sT``.  For
Kaldi's layout (row ``t*N + n`` of a matrix with row stride ``R``) that is
``sN = R, sT = N*R, sP = 1``: exactly Kaldi's strided view.

Works for NumPy and CuPy arrays (``xp`` is the array module); device arrays
go through the kernels of ``pdf_map.cu`` (:mod:`chainfb.cuda.pdf_maps`: one
launch each way, the same bits).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ._arrays import Array
from ._cache import LRU
from .cuda import kernels, pdf_maps

__all__ = ["PdfScoreMap"]


def _frame_view(xp, scores, width: int):
    """``[T, width]`` view of ``scores`` (``[N, T, P]``) with row stride ``sT``,
    whose column ``c`` is element offset ``c`` from ``scores[0, 0, 0]``."""
    item = scores.itemsize
    sT = scores.strides[1]
    T = scores.shape[1]
    return xp.lib.stride_tricks.as_strided(scores, shape=(T, width), strides=(sT, item))


class PdfScoreMap:
    """Gather ``[T, C]`` scores for columns ``(col_seq, col_pdf)`` from a strided
    ``[N, T, P]`` array, and scatter-add ``[T, C]`` posteriors back.

    Parameters
    ----------
    col_seq, col_pdf : int arrays ``[C]``
        The sequence and pdf of each compact column (``Lattice.col_seq`` and
        ``Lattice.col_pdf``), i.e. Kaldi's ``index_to_pdf``.
    name : the argument named in errors (``"scores"``, ``"nnet_output"``...).

    The column offsets and the view's width depend only on the array's
    strides (and its array module): they are computed once per layout and
    kept (a handful of layouts per map at most).
    """

    _MAX_LAYOUTS = 8

    def __init__(self, col_seq: ArrayLike, col_pdf: ArrayLike, name: str = "scores"):
        self.col_seq = np.asarray(col_seq, dtype=np.int64)
        self.col_pdf = np.asarray(col_pdf, dtype=np.int64)
        self.name = name
        self._layouts = LRU(self._MAX_LAYOUTS)

    def _offsets(self, xp, arr, name=None):
        """``(offsets [C] as an ``xp`` array, width)`` of ``arr``'s layout."""
        item = arr.itemsize
        strides = tuple(arr.strides)
        if any(s < 0 for s in strides) or any(s % item for s in strides):
            raise ValueError(f"{name or self.name}: strides must be non-negative multiples of the item size, "
                             f"got {strides} for item size {item}")

        device = getattr(getattr(arr, "device", None), "id", None)  # CuPy: one offsets copy per GPU

        def build():
            sN, _, sP = (s // item for s in strides)
            offs = self.col_seq * sN + self.col_pdf * sP
            width = int(offs.max()) + 1 if offs.size else 1
            # the sequences ride along (one transfer to a GPU, not two): scatter_add's seq_scale reads them
            both = xp.asarray(np.stack([offs, self.col_seq]))
            self._layouts.get((xp.__name__, device, "sequences"), lambda: both[1])
            return both[0], width

        return self._layouts.get((xp.__name__, device, item, strides), build)

    def _sequences(self, xp, arr):
        """``col_seq`` as an ``xp`` array on ``arr``'s device (kept, one per device)."""
        device = getattr(getattr(arr, "device", None), "id", None)
        return self._layouts.get((xp.__name__, device, "sequences"), lambda: xp.asarray(self.col_seq))

    def gather(self, xp: ModuleType, scores: Array, dtype: DTypeLike = np.float64, name: str | None = None,
               clip: tuple[float, float] | None = None) -> Array:
        """Compact scores ``[T, C]`` (``dtype``, row-major: the engines read a
        frame at a time) from ``scores`` ``[N, T, P]``, clipped to ``clip =
        (lo, hi)`` when it is given."""
        offs, width = self._offsets(xp, scores, name)
        if kernels.on_device(scores) and pdf_maps.gather_kernel(scores.dtype, dtype):
            return pdf_maps.gather(kernels.backend_for(scores), scores, offs, dtype, clip)
        view = _frame_view(xp, scores, width)
        X = xp.ascontiguousarray(view[:, offs], dtype=dtype)  # (take() would copy the whole strided view)
        if clip is not None:
            xp.clip(X, clip[0], clip[1], out=X)
        return X

    def scatter_add(self, xp: ModuleType, target: Array, post: Array, scale: float = 1.0, accumulate: bool = True,
                    name: str | None = None, seq_scale: Array | None = None) -> None:
        """``target[n, t, p] += scale * post[t, c]`` for each column ``c = (n, p)``
        (``=`` instead of ``+=`` when ``accumulate`` is False), times
        ``seq_scale[n]`` when it is given (an ``xp`` array ``[N]``; ``post``
        may then be scaled in place -- no copy of it).

        ``target`` is ``[N, T, P]`` (any non-negative strides); columns are
        distinct, so the fancy-index add is exact and deterministic.
        """
        offs, width = self._offsets(xp, target, name)
        if kernels.on_device(target) and pdf_maps.scatter_kernel(post.dtype, target.dtype):
            col_seq = None if seq_scale is None else self._sequences(xp, target)
            pdf_maps.scatter(kernels.backend_for(target), target, post, offs, scale, seq_scale, col_seq, accumulate)
            return
        view = _frame_view(xp, target, width)
        T = min(target.shape[1], post.shape[0])
        if scale != 1.0:
            post = post * scale
        if seq_scale is not None:  # each column by its sequence's factor: [T, C] work, not [N, T, P]
            post *= seq_scale.astype(post.dtype, copy=False)[self._sequences(xp, target)]
        if accumulate:
            view[:T, offs] += post[:T].astype(target.dtype, copy=False)
        else:
            view[:T, offs] = post[:T]
