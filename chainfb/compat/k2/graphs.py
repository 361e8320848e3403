"""k2's graph constructors -- ``linear_fsa``, ``linear_fst``,
``ctc_topo``, ``ctc_graph`` -- arc for arc as k2 builds them
(``k2/csrc/fsa_algo.cu``), and :func:`fst_to_fsa`, a
:class:`chainfb.Fst` as a k2 FSA.

``ctc_topo(max_token)`` (standard): states ``0..max_token`` ("the last
frame read token ``i``", 0 = blank) and the final state ``max_token + 1``;
every state ``i <= max_token`` has an arc to every state ``j`` labelled
``j`` (``-1`` into the final state) whose aux label is 0 when ``j == i``
(a repeat) and ``j`` otherwise: ``(max_token + 1) (max_token + 2)`` arcs.
``modified=True``: state 0 has a self-loop for every token ``0..max_token``
(aux label = label) and an arc to every other state ``j`` (label and aux
label ``j``, ``-1`` into the final state); every token state ``t`` has a
self-loop and an arc back to 0, both labelled ``t`` with aux label 0:
``4 max_token + 2`` arcs.

``ctc_graph(symbols)``: per sequence of ``U`` symbols, ``2 U + 2`` states
(blank and symbol states alternating, then the final state); a blank state
has a blank self-loop and an arc to the next symbol state; a symbol state
has an arc to the following blank state, a self-loop and, unless the next
symbol is the same (standard topology), an arc straight to the next symbol
state.  Labels are the tokens read, aux labels the tokens emitted (0 on
blanks and repeats).  All scores are 0.
"""

from __future__ import annotations


import numpy as np
import torch

from ... import checks
from ...fst import Fst
from .fsa import Fsa
from .ragged import Device, RaggedTensor

__all__ = ["linear_fsa", "linear_fst", "ctc_topo", "ctc_graph", "fst_to_fsa"]


def _device(device):
    if device is None:
        return torch.device("cpu")
    try:
        return torch.device(device)
    except (TypeError, RuntimeError):
        raise TypeError(f"device: expected a torch.device or a device string, got {device!r}") from None


def _rows(labels, name: str):
    """``(rows, is_vec)``: the label lists of ``labels`` (a list of ints, a
    list of lists, a 1-D tensor or a RaggedTensor)."""
    if isinstance(labels, RaggedTensor):
        return labels.rows(), True
    if isinstance(labels, torch.Tensor):
        return [checks.int_array(labels, name, 1)], False
    if isinstance(labels, (str, bytes)) or not isinstance(labels, (list, tuple)):
        raise TypeError(f"{name}: expected a list of ints, a list of lists of ints or a RaggedTensor, "
                        f"got {type(labels).__name__}")
    if labels and all(isinstance(r, (list, tuple, torch.Tensor, np.ndarray)) for r in labels):
        rows = []
        for i, r in enumerate(labels):
            rows.append(checks.int_array(np.asarray(r, dtype=np.int64) if len(r) == 0 else r, f"{name}[{i}]", 1))
        return rows, True
    return [checks.int_array(np.asarray(labels, dtype=np.int64) if not labels else labels, name, 1)], False


def _build(parts, vec: bool, device, aux=None) -> Fsa:
    """An Fsa from per-FSA ``(S, src, dst, labels)`` with zero scores."""
    counts = np.array([len(p[1]) for p in parts], dtype=np.int64)
    A = int(counts.sum())
    out = Fsa._make([p[0] for p in parts], np.concatenate([p[1] for p in parts]),
                    np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]),
                    torch.zeros(A, dtype=torch.float32, device=device), vec=vec,
                    arc_splits=np.concatenate([[0], np.cumsum(counts)]))
    if aux is not None:
        out.aux_labels = torch.as_tensor(np.concatenate(aux).astype(np.int32), device=device)
    return out


def _linear(row: np.ndarray):
    U = len(row)
    ar = np.arange(U + 1, dtype=np.int64)
    return U + 2, ar, ar + 1, np.concatenate([row, [-1]]).astype(np.int64)


def linear_fsa(labels: list[int] | list[list[int]] | RaggedTensor, device: Device | None = None) -> Fsa:
    """A linear acceptor of ``labels`` (``U + 2`` states: the labels, then
    a ``-1`` arc into the final state; scores 0): a single FSA for a list
    of ints, an FsaVec for a list of lists or a RaggedTensor."""
    rows, vec = _rows(labels, "labels")
    for i, r in enumerate(rows):
        if r.size and r.min() < 0:
            raise ValueError(f"labels: negative label {r.min()}" + (f" in sequence {i}" if vec else ""))
    return _build([_linear(r) for r in rows], vec, _device(device))


def linear_fst(labels: list[int] | list[list[int]], aux_labels: list[int] | list[list[int]]) -> Fsa:
    """A linear transducer: :func:`linear_fsa` of ``labels`` with
    ``aux_labels`` (``-1`` on the final arc)."""
    fsa = linear_fsa(labels)
    rows, vec = _rows(aux_labels, "aux_labels")
    if vec != fsa._vec or len(rows) != len(fsa._num_states) or any(
            len(a) != n - 2 for a, n in zip(rows, fsa._num_states)):
        raise ValueError("aux_labels: expected one aux label per label (lists of lists for lists of lists)")
    fsa.aux_labels = torch.as_tensor(np.concatenate([np.concatenate([a, [-1]]) for a in rows]).astype(np.int32))
    return fsa


def ctc_topo(max_token: int, modified: bool = False, device: Device | None = None) -> Fsa:
    """k2's CTC topology over tokens ``1..max_token`` (0 = blank), a
    transducer: labels are the tokens read, ``aux_labels`` the tokens
    emitted (see the module docstring for both topologies)."""
    n = checks.integer(max_token, "max_token", lo=0)
    modified = checks.flag(modified, "modified")
    S = n + 2
    if not modified:
        i, j = np.divmod(np.arange((n + 1) * (n + 2), dtype=np.int64), n + 2)
        lab = np.where(j == n + 1, -1, j)
        aux = np.where(i == j, 0, lab)
        return _build([(S, i, j, lab)], False, _device(device), [aux])
    loops = np.arange(n + 1, dtype=np.int64)
    dests = np.arange(1, n + 2, dtype=np.int64)
    tokens = np.arange(1, n + 1, dtype=np.int64)
    src = np.concatenate([np.zeros(2 * (n + 1), np.int64), np.repeat(tokens, 2)])
    dst = np.concatenate([np.zeros(n + 1, np.int64), dests, np.stack([tokens, np.zeros(n, np.int64)], 1).ravel()])
    to_dest = np.where(dests == n + 1, -1, dests)
    lab = np.concatenate([loops, to_dest, np.repeat(tokens, 2)])
    aux = np.concatenate([loops, to_dest, np.zeros(2 * n, np.int64)])
    return _build([(S, src, dst, lab)], False, _device(device), [aux])


def _ctc_graph_one(y: np.ndarray, modified: bool):
    U = len(y)
    src, dst, lab, aux = [], [], [], []

    def arc(s, d, label, out):
        src.append(s), dst.append(d), lab.append(label), aux.append(out)

    for k in range(U + 1):
        sym = int(y[k]) if k < U else -1
        arc(2 * k, 2 * k, 0, 0)  # blank state: blank self-loop, then the symbol
        arc(2 * k, 2 * k + 1, sym, sym)
        if k == U:
            break
        nxt = int(y[k + 1]) if k + 1 < U else -1
        arc(2 * k + 1, 2 * k + 2, 0, 0)  # symbol state: to the next blank, self-loop, next symbol
        arc(2 * k + 1, 2 * k + 1, sym, 0)
        if modified or sym != nxt:
            arc(2 * k + 1, 2 * k + 3, nxt, nxt)
    arr = (lambda v: np.array(v, dtype=np.int64))
    return (2 * U + 2, arr(src), arr(dst), arr(lab)), arr(aux)


def ctc_graph(symbols: list[list[int]] | RaggedTensor, modified: bool = False, device: Device = "cpu") -> Fsa:
    """k2's ``ctc_graph``: the CTC graph of each symbol sequence (symbols
    ``>= 1``; 0 is blank), an FsaVec with ``aux_labels`` (see the module
    docstring).  ``symbols`` is a list of lists of ints or a
    :class:`~chainfb.compat.k2.ragged.RaggedTensor`."""
    modified = checks.flag(modified, "modified")
    rows, vec = _rows(symbols, "symbols")
    if not vec:
        raise TypeError("symbols: expected a list of lists of ints or a RaggedTensor (one list per sequence)")
    for i, r in enumerate(rows):
        if r.size and r.min() <= 0:
            raise ValueError(f"symbols: sequence {i} has symbol {r.min()}; symbols must be >= 1 (0 is blank)")
    built = [_ctc_graph_one(r, modified) for r in rows]
    return _build([b[0] for b in built], True, _device(device), [b[1] for b in built])


def fst_to_fsa(fst: Fst, dtype: torch.dtype = torch.float32) -> Fsa:
    """A :class:`chainfb.Fst` as a k2 acceptor: label = pdf (the log-probs
    column it reads in :func:`~chainfb.compat.k2.intersect_dense`), score =
    the arc's log-probability (``dtype``: float32 as in k2, or float64), the
    start state renumbered 0, and a ``-1`` arc carrying the final
    log-probability from every final state into a new final state."""
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype: expected torch.float32 or torch.float64, got {dtype}")
    if not isinstance(fst, Fst):
        raise TypeError(f"fst: expected a chainfb.Fst, got {type(fst).__name__}")
    if fst.max_span > 1:
        raise ValueError("fst: arcs spanning several frames have no k2 equivalent")
    S = fst.num_states
    new = np.empty(S, dtype=np.int64)
    new[[fst.start] + [s for s in range(S) if s != fst.start]] = np.arange(S)
    fin = np.flatnonzero(fst.final > -np.inf)
    src = np.concatenate([new[fst.src], new[fin]])
    dst = np.concatenate([new[fst.dst], np.full(len(fin), S)])
    lab = np.concatenate([fst.pdf, np.full(len(fin), -1)])
    w = np.concatenate([fst.log_prob, fst.final[fin]])
    o = np.lexsort((lab == -1, src))
    return Fsa._make([S + 1], src[o], dst[o], lab[o], torch.as_tensor(w[o], dtype=dtype), vec=False)
