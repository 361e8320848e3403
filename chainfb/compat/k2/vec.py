"""FsaVecs from FSAs: k2's ``create_fsa_vec``, ``index_fsa`` and ``cat``.

The FSAs' tensor attributes are concatenated (``scores`` with their
autograd history, so gradients flow back to each source FSA); non-tensor
attributes are taken from the first FSA that has them.  The stacking itself
(and ``create_fsa_vec``, which ``Fsa.from_fsas`` is) lives with the FsaVec
layout in :mod:`chainfb.compat.k2.fsa`.
"""

from __future__ import annotations


from collections.abc import Sequence

import numpy as np
import torch

from ... import checks
from .fsa import Fsa, _stack, create_fsa_vec

__all__ = ["create_fsa_vec", "index_fsa", "cat"]


def _vec(fsa, name: str) -> Fsa:
    if not isinstance(fsa, Fsa):
        raise TypeError(f"{name}: expected a chainfb.compat.k2.Fsa, got {type(fsa).__name__}")
    if not fsa._vec:
        raise ValueError(f"{name}: expected an FsaVec (len(shape) == 3), got a single FSA")
    return fsa


def index_fsa(src: Fsa, indexes: Sequence[int] | np.ndarray | torch.Tensor) -> Fsa:
    """k2's ``index_fsa``: the FsaVec of ``src[indexes[0]], src[indexes[1]], ...``."""
    _vec(src, "src")
    idx = checks.int_array(indexes, "indexes", 1)
    n = src.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"indexes: expected indexes in [0, {n}), got {idx[(idx < 0) | (idx >= n)][0]}")
    return _stack([src[int(i)] for i in idx], "src")


def cat(srcs: list[Fsa]) -> Fsa:
    """k2's ``cat``: the FSAs of several FsaVecs, in order, as one FsaVec."""
    if not isinstance(srcs, (list, tuple)):
        raise TypeError(f"srcs: expected a list of FsaVecs, got {type(srcs).__name__}")
    return _stack([v[i] for k, v in enumerate(srcs) for i in range(_vec(v, f"srcs[{k}]").shape[0])], "srcs")
