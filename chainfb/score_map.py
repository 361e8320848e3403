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

Works for NumPy and CuPy arrays (``xp`` is the array module).
"""

from __future__ import annotations

import numpy as np

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
    """

    def __init__(self, col_seq, col_pdf):
        self.col_seq = np.asarray(col_seq, dtype=np.int64)
        self.col_pdf = np.asarray(col_pdf, dtype=np.int64)

    def _offsets(self, xp, arr):
        item = arr.itemsize
        sN, _, sP = (s // item for s in arr.strides)
        if any(s < 0 for s in arr.strides) or any(s % item for s in arr.strides):
            raise ValueError("scores: strides must be non-negative multiples of the item size")
        offs = self.col_seq * sN + self.col_pdf * sP
        width = int(offs.max()) + 1 if offs.size else 1
        return xp.asarray(offs), width

    def gather(self, xp, scores, dtype=np.float64):
        """Compact scores ``[T, C]`` (``dtype``) from ``scores`` ``[N, T, P]``."""
        offs, width = self._offsets(xp, scores)
        view = _frame_view(xp, scores, width)
        return view[:, offs].astype(dtype, copy=False)

    def scatter_add(self, xp, target, post, scale: float = 1.0, accumulate: bool = True):
        """``target[n, t, p] += scale * post[t, c]`` for each column ``c = (n, p)``
        (``=`` instead of ``+=`` when ``accumulate`` is False).

        ``target`` is ``[N, T, P]`` (any strides); columns are distinct, so
        the fancy-index add is exact and deterministic.
        """
        offs, width = self._offsets(xp, target)
        view = _frame_view(xp, target, width)
        T = min(target.shape[1], post.shape[0])
        if scale != 1.0:
            post = post * scale
        if accumulate:
            view[:T, offs] += post[:T].astype(target.dtype, copy=False)
        else:
            view[:T, offs] = post[:T]
