"""FsaVecs from FSAs: k2's ``create_fsa_vec``, ``index_fsa`` and ``cat``.

The FSAs' tensor attributes are concatenated (``scores`` with their
autograd history, so gradients flow back to each source FSA); non-tensor
attributes are taken from the first FSA that has them.
"""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from ... import checks
from .fsa import Fsa, _single
from .ragged import RaggedTensor

__all__ = ["create_fsa_vec", "index_fsa", "cat"]


def _stack(parts: List[Fsa], name: str) -> Fsa:
    """An FsaVec of the single FSAs ``parts`` (attributes concatenated; all
    of ``parts`` must have the same tensor attributes)."""
    if not parts:
        raise ValueError(f"{name}: expected at least one FSA")
    devices = {p.device for p in parts}
    if len(devices) > 1:
        raise ValueError(f"{name}: the FSAs are on different devices {sorted(map(str, devices))}")
    counts = np.array([p.num_arcs for p in parts], dtype=np.int64)
    out = Fsa._make(np.concatenate([p._num_states for p in parts]), np.concatenate([p._src for p in parts]),
                    np.concatenate([p._dst for p in parts]),
                    np.concatenate([p.labels.cpu().numpy() for p in parts]),
                    torch.cat([p.scores for p in parts]) if len({p.scores.dtype for p in parts}) == 1
                    else torch.cat([p.scores.to(torch.float64) for p in parts]),
                    vec=True, arc_splits=np.concatenate([[0], np.cumsum(counts)]), check=False)
    names = [n for n, _ in parts[0].named_tensor_attr(include_scores=False)]
    for i, p in enumerate(parts):
        mine = sorted(n for n, _ in p.named_tensor_attr(include_scores=False))
        if mine != sorted(names):
            raise ValueError(f"{name}[{i}]: tensor attributes {mine} differ from those of the first FSA "
                             f"{sorted(names)}")
    for n in names:
        values = [getattr(p, n) for p in parts]
        if all(isinstance(v, torch.Tensor) for v in values):
            out._tensor_attr[n] = torch.cat(values)
        else:
            rows = [r for v in values for r in (v.rows() if isinstance(v, RaggedTensor) else
                                                [np.array([x]) for x in v.tolist()])]
            out._tensor_attr[n] = RaggedTensor.from_rows(rows, device=out.device)
    for p in parts:
        for n, v in p.named_non_tensor_attr():
            out._non_tensor_attr.setdefault(n, v)
    return out


def create_fsa_vec(fsas: List[Fsa]) -> Fsa:
    """k2's ``create_fsa_vec``: an FsaVec of single FSAs; tensor attributes
    (``scores`` included, with their autograd history) are concatenated."""
    if isinstance(fsas, Fsa) or not isinstance(fsas, (list, tuple)):
        raise TypeError(f"fsas: expected a list of single FSAs, got {type(fsas).__name__}")
    return _stack([_single(f, f"fsas[{i}]") for i, f in enumerate(fsas)], "fsas")


def _vec(fsa, name: str) -> Fsa:
    if not isinstance(fsa, Fsa):
        raise TypeError(f"{name}: expected a chainfb.compat.k2.Fsa, got {type(fsa).__name__}")
    if not fsa._vec:
        raise ValueError(f"{name}: expected an FsaVec (len(shape) == 3), got a single FSA")
    return fsa


def index_fsa(src: Fsa, indexes) -> Fsa:
    """k2's ``index_fsa``: the FsaVec of ``src[indexes[0]], src[indexes[1]], ...``."""
    _vec(src, "src")
    idx = checks.int_array(indexes, "indexes", 1)
    n = src.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"indexes: expected indexes in [0, {n}), got {idx[(idx < 0) | (idx >= n)][0]}")
    return _stack([src[int(i)] for i in idx], "src")


def cat(srcs: List[Fsa]) -> Fsa:
    """k2's ``cat``: the FSAs of several FsaVecs, in order, as one FsaVec."""
    if not isinstance(srcs, (list, tuple)):
        raise TypeError(f"srcs: expected a list of FsaVecs, got {type(srcs).__name__}")
    return _stack([v[i] for k, v in enumerate(srcs) for i in range(_vec(v, f"srcs[{k}]").shape[0])], "srcs")
