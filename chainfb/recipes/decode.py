"""Viterbi decoding over a word-labelled pdf graph, and word error rate."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from ..fst import Fst

__all__ = ["viterbi", "word_errors", "wer"]


def viterbi(fst: Fst, labels: np.ndarray, scores: np.ndarray, length: int | None = None,
            acoustic_scale: float = 1.0) -> Tuple[List[int], float]:
    """Best path of exactly ``length`` arcs through ``fst`` (max over paths of arc log-probs + ``acoustic_scale`` *
    ``scores[t, pdf]`` + final log-prob), returning (the ``labels [A]`` >= 0 along it, its score).

    ``scores [T, P]`` float array; ``length`` defaults to ``T``. No path -> ``([], -inf)``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2:
        raise ValueError(f"scores: expected [T, P], got shape {scores.shape}")
    labels = np.asarray(labels)
    if labels.shape != (fst.num_arcs,):
        raise ValueError(f"labels: expected shape [{fst.num_arcs}] (one per arc), got {labels.shape}")
    T = scores.shape[0] if length is None else int(length)
    if not 0 <= T <= scores.shape[0]:
        raise ValueError(f"length: expected 0..{scores.shape[0]}, got {length}")
    if fst.num_arcs and fst.pdf.max() >= scores.shape[1]:
        raise ValueError(f"scores: graph uses pdf {int(fst.pdf.max())} but scores has {scores.shape[1]} columns")
    S = fst.num_states
    alpha = np.full(S, -np.inf)
    alpha[fst.start] = 0.0
    bp = np.full((T, S), -1, dtype=np.int64)
    arc_ids = np.arange(fst.num_arcs)
    for t in range(T):
        cand = alpha[fst.src] + fst.log_prob + acoustic_scale * scores[t, fst.pdf]
        best = np.full(S, -np.inf)
        np.maximum.at(best, fst.dst, cand)
        hit = np.isfinite(cand) & (cand >= best[fst.dst])
        bp[t, fst.dst[hit]] = arc_ids[hit]
        alpha = best
    tot = alpha + fst.final
    s = int(np.argmax(tot))
    if not np.isfinite(tot[s]):
        return [], float("-inf")
    out = []
    for t in range(T - 1, -1, -1):
        a = bp[t, s]
        if labels[a] >= 0:
            out.append(int(labels[a]))
        s = int(fst.src[a])
    return out[::-1], float(tot.max())


def word_errors(ref: Sequence, hyp: Sequence) -> int:
    """Levenshtein distance (substitutions + deletions + insertions) between two word sequences."""
    d = np.arange(len(hyp) + 1)
    for i, r in enumerate(ref, 1):
        prev = d.copy()
        d[0] = i
        for j, h in enumerate(hyp, 1):
            d[j] = min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (r != h))
    return int(d[-1])


def wer(refs: Sequence[Sequence], hyps: Sequence[Sequence]) -> float:
    """Corpus word error rate in percent: total edits / total reference words * 100."""
    if len(refs) != len(hyps):
        raise ValueError(f"hyps: expected {len(refs)} hypotheses (one per reference), got {len(hyps)}")
    n = sum(len(r) for r in refs)
    if n == 0:
        raise ValueError("refs: no reference words")
    return 100.0 * sum(word_errors(r, h) for r, h in zip(refs, hyps)) / n
