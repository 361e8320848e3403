"""References for :mod:`chainfb.compat.k2`, written from k2's documented
semantics and independent of the package's algorithms: path enumeration
of k2 FSAs (arcs read as ``(src, dst, label)`` from ``arcs.values()``),
the dense-intersection total by enumeration (differentiable through torch),
the CTC collapse of a frame sequence and label-sequence weights of an FSA
with epsilons.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch


def arcs_of(fsa):
    """``(num_states, src, dst, label)`` of a single k2 FSA, from its public arcs."""
    v = fsa.arcs.values()[:, :3].cpu().numpy().astype(np.int64)
    return fsa.shape[0], v[:, 0], v[:, 1], v[:, 2]


def dense_paths(S, src, dst, label, T):
    """Every path of ``T`` arcs labelled ``>= 0`` from state 0, then one
    ``-1`` arc (into the final state ``S - 1``): lists of arc indices."""
    out = [[] for _ in range(S)]
    for a in range(len(src)):
        out[src[a]].append(a)
    paths = []

    def walk(s, t, acc):
        if t == T:
            paths.extend(acc + [a] for a in out[s] if label[a] == -1)
            return
        for a in out[s]:
            if label[a] >= 0:
                walk(dst[a], t + 1, acc + [a])

    if S:
        walk(0, 0, [])
    return paths


def dense_tot_score(fsa, scores: torch.Tensor, log_probs: torch.Tensor, log_semiring: bool = True) -> torch.Tensor:
    """k2's ``intersect_dense(...).get_tot_scores`` of one FSA and one
    segment ``log_probs [T, C]``, by enumeration: label ``l`` reads column
    ``l`` (0 = blank), the ``-1`` arc the appended frame (score 0)."""
    S, src, dst, label = arcs_of(fsa)
    T = log_probs.shape[0]
    paths = dense_paths(S, src, dst, label, T)
    if not paths:
        return torch.tensor(-np.inf, dtype=log_probs.dtype)
    vals = torch.stack([sum(log_probs[t, int(label[a])] for t, a in enumerate(p[:-1]))
                        + scores[p].sum().to(log_probs.dtype)
                        for p in paths])
    return torch.logsumexp(vals, 0) if log_semiring else vals.max()


def ctc_collapse(frames) -> tuple:
    """The tokens of a CTC frame sequence (repeats merged, blanks 0 removed)."""
    out, prev = [], None
    for f in frames:
        if f != prev and f != 0:
            out.append(f)
        prev = f
    return tuple(out)


def label_sequence_weights(fsa, max_len: int, log_semiring: bool = True, output: str = "labels",
                           keep_epsilon: bool = False) -> dict:
    """``{sequence: weight}`` over the paths of a single FSA with at most
    ``max_len`` arcs from state 0 to the final state: ``sequence`` is the
    path's non-zero ``labels`` (or ``aux_labels`` with ``output="aux"``;
    zeros too with ``keep_epsilon``), ``-1`` left out; weights combine by
    log-sum or max."""
    S, src, dst, label = arcs_of(fsa)
    out_seq = label if output == "labels" else fsa.aux_labels.cpu().numpy().astype(np.int64)
    w = fsa.scores.detach().double().cpu().numpy()
    out = [[] for _ in range(S)]
    for a in range(len(src)):
        out[src[a]].append(a)
    acc: dict = {}

    def walk(s, depth, seq, score):
        if s == S - 1:
            key = tuple(seq)
            prev = acc.get(key)
            acc[key] = score if prev is None else (np.logaddexp(prev, score) if log_semiring else max(prev, score))
            return
        if depth == max_len:
            return
        for a in out[s]:
            sym = int(out_seq[a])
            keep = sym > 0 or (keep_epsilon and sym == 0)
            walk(dst[a], depth + 1, seq + ([sym] if keep else []), score + w[a])

    if S:
        walk(0, 0, [], 0.0)
    return acc


def ctc_total(log_probs: np.ndarray, weights: dict) -> float:
    """``log sum`` over frame sequences of ``sum_t log_probs[t, f_t] +
    weights[ctc_collapse(f)]`` (sequences not in ``weights`` excluded)."""
    T, C = log_probs.shape
    vals = []
    for frames in itertools.product(range(C), repeat=T):
        key = ctc_collapse(frames)
        if key in weights:
            vals.append(log_probs[np.arange(T), list(frames)].sum() + weights[key])
    return float(np.logaddexp.reduce(vals)) if vals else -np.inf
