"""Viterbi decoding over a word-labelled pdf graph, and word error rate."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chainfb import Fst, best_path

__all__ = ["viterbi", "viterbi_batch", "word_errors", "wer"]


def viterbi_batch(fst: Fst, labels: np.ndarray, scores: np.ndarray, lengths: Sequence[int],
                  acoustic_scale: float = 1.0) -> tuple[list[list[int]], np.ndarray]:
    """Best paths of ``N`` sequences through one graph (the engine's max-plus
    pass, :func:`chainfb.best_path`): the ``labels [A]`` >= 0 along each, and
    the best scores ``[N]`` (max over paths of arc log-probs +
    ``acoustic_scale`` * ``scores[n, t, pdf]`` + final log-prob).

    ``scores [N, T, P]`` float array; ``lengths [N]``. No path -> ``([], -inf)``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 3:
        raise ValueError(f"scores: expected [N, T, P], got shape {scores.shape}")
    labels = np.asarray(labels)
    if labels.shape != (fst.num_arcs,):
        raise ValueError(f"labels: expected shape [{fst.num_arcs}] (one per arc), got {labels.shape}")
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.shape != (scores.shape[0],) or (lengths.size and (lengths.min() < 0 or lengths.max() > scores.shape[1])):
        raise ValueError(f"length: expected {scores.shape[0]} lengths in 0..{scores.shape[1]}, got {lengths.tolist()}")
    if fst.num_arcs and fst.pdf.max() >= scores.shape[2]:
        raise ValueError(f"scores: graph uses pdf {int(fst.pdf.max())} but scores has {scores.shape[2]} columns")
    best, paths = best_path(fst, acoustic_scale * scores, lengths)
    words = [[int(w) for w in labels[p] if w >= 0] for p in paths]
    return words, best


def viterbi(fst: Fst, labels: np.ndarray, scores: np.ndarray, length: int | None = None,
            acoustic_scale: float = 1.0) -> tuple[list[int], float]:
    """Best path of exactly ``length`` arcs through ``fst``: the ``labels [A]``
    >= 0 along it and its score (see :func:`viterbi_batch`).

    ``scores [T, P]`` float array; ``length`` defaults to ``T``. No path -> ``([], -inf)``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2:
        raise ValueError(f"scores: expected [T, P], got shape {scores.shape}")
    T = scores.shape[0] if length is None else int(length)
    words, best = viterbi_batch(fst, labels, scores[None], [T], acoustic_scale)
    return words[0], float(best[0])


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
