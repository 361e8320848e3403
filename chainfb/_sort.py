"""Stable sorting orders of small non-negative integer keys (state, column
and pdf ids), by radix: NumPy sorts 16-bit keys stably by counting, in
linear time, where its stable sort of wider integers is a merge sort.  A key
below ``2**32`` takes two such passes (low half, then high half: a least
significant digit radix sort).  Keys that are mostly in order already (few
descents: CTC's arcs by destination) keep the merge sort, which takes their
runs whole."""

from __future__ import annotations

import numpy as np

__all__ = ["stable_order"]


def stable_order(keys: np.ndarray, bound: int | None = None) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for integer ``keys [n]`` in ``[0,
    bound)`` (``bound`` defaults to ``keys.max() + 1``), as int64; keys already
    in order give ``arange(n)`` after one comparison pass."""
    n = len(keys)
    descents = int(np.count_nonzero(keys[1:] < keys[:-1])) if n > 1 else 0
    if descents == 0:
        return np.arange(n, dtype=np.int64)
    if descents * 16 < n:  # long runs already in order: the merge sort takes them whole
        return np.argsort(keys, kind="stable")
    bound = int(keys.max()) + 1 if bound is None else int(bound)
    if bound <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable").astype(np.int64)
    if bound <= 1 << 32:
        k = keys.astype(np.uint32)
        order = np.argsort((k & 0xFFFF).astype(np.uint16), kind="stable")
        return order[np.argsort((k[order] >> 16).astype(np.uint16), kind="stable")].astype(np.int64)
    return np.argsort(keys, kind="stable")
