"""Float64 reference for the k2 / fast_rnnt RNN-T function family, written
from the math with plain loops (tiny sizes only; speed does not matter).

Conventions (those of k2's ``rnnt_loss.py`` / ``mutual_information.py``):

- ``B`` batch, ``S`` symbols (padded), ``T`` frames (padded), ``C`` classes.
- ``boundary`` is ``[B, 4]`` int64 rows ``[s_begin, t_begin, s_end, t_end]``;
  ``None`` means ``[0, 0, S, T]`` for every row.
- ``px`` is ``[B][S][T+1]`` ("regular", column ``t`` = emit a symbol without
  leaving frame ``t``) or ``[B][S][T]`` ("modified"/"constrained", emitting a
  symbol also moves to the next frame); ``py`` is ``[B][S+1][T]`` (emit the
  termination symbol = blank, move to the next frame).
- ``p[s_begin, t_begin] = 0``; for cells ``(s, t)`` inside the rectangle
  ``s_begin <= s <= s_end``, ``t_begin <= t <= t_end``::

      regular:  p[s,t] = logadd(p[s-1,t]   + px[s-1,t],   p[s,t-1] + py[s,t-1])
      modified: p[s,t] = logadd(p[s-1,t-1] + px[s-1,t-1], p[s,t-1] + py[s,t-1])

  terms whose source cell lies outside the rectangle are ``-inf``; the
  result is ``p[s_end, t_end]``.  Indices into ``px``/``py`` are absolute
  (no offset by ``s_begin``/``t_begin``).

Every function takes torch tensors (or arrays) and returns float64 torch
tensors (``ranges``: int64).
"""

from __future__ import annotations

import math

import numpy as np
import torch

NEG_INF = float("-inf")
RNNT_TYPES = ("regular", "modified", "constrained")

__all__ = [
    "mi_reference",
    "logprobs_simple",
    "logprobs_joint",
    "logprobs_smoothed",
    "apply_delay_penalty",
    "prune_ranges_reference",
    "do_rnnt_pruning_reference",
    "pruned_logprobs_reference",
    "reduce_loss",
    "loss_from_logprobs",
    "rnnt_loss_simple_reference",
    "rnnt_loss_reference",
    "rnnt_loss_smoothed_reference",
    "rnnt_loss_pruned_reference",
]


# ----------------------------------------------------------------------------
# small helpers


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _f64(x) -> np.ndarray:
    return _np(x).astype(np.float64)


def _logadd(a: float, b: float) -> float:
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))


def _logsumexp(values) -> float:
    tot = NEG_INF
    for v in values:
        tot = _logadd(tot, float(v))
    return tot


def _boundary_rows(boundary, B: int, S: int, T: int):
    if boundary is None:
        return [(0, 0, S, T)] * B
    rows = [tuple(int(v) for v in r) for r in _np(boundary).reshape(B, 4)]
    for sb, tb, se, te in rows:
        assert 0 <= sb <= se <= S and 0 <= tb <= te <= T, (sb, tb, se, te)
    return rows


def _check_type(rnnt_type: str) -> None:
    assert rnnt_type in RNNT_TYPES, rnnt_type


def _torch(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


# ----------------------------------------------------------------------------
# the recursion


def mi_reference(px, py, boundary=None):
    """Total log-score per sequence and arc occupation probabilities.

    Returns ``(total [B], px_grad, py_grad)``; the grads are
    ``d total[b] / d px`` and ``d total[b] / d py`` (non-negative posteriors
    of the arcs, zero outside the boundary rectangle).  A sequence with no
    finite path gets ``total = -inf`` and all-zero grads.
    """
    px = _f64(px)
    py = _f64(py)
    B, S, T1 = px.shape
    T = py.shape[2]
    assert py.shape == (B, S + 1, T), (px.shape, py.shape)
    assert T1 in (T, T + 1), (px.shape, py.shape)
    modified = T1 == T
    dt = 1 if modified else 0  # a symbol arc from (s, t) lands on (s+1, t+dt)
    rows = _boundary_rows(boundary, B, S, T)

    total = np.zeros(B)
    px_grad = np.zeros_like(px)
    py_grad = np.zeros_like(py)
    for b, (sb, tb, se, te) in enumerate(rows):
        inside = lambda s, t, sb=sb, se=se, tb=tb, te=te: sb <= s <= se and tb <= t <= te  # noqa: E731
        # forward
        alpha = np.full((S + 1, T + 1), NEG_INF)
        alpha[sb, tb] = 0.0
        for s in range(sb, se + 1):
            for t in range(tb, te + 1):
                if (s, t) == (sb, tb):
                    continue
                terms = []
                if inside(s - 1, t - dt):
                    terms.append(alpha[s - 1, t - dt] + px[b, s - 1, t - dt])
                if inside(s, t - 1):
                    terms.append(alpha[s, t - 1] + py[b, s, t - 1])
                alpha[s, t] = _logsumexp(terms)
        tot = alpha[se, te]
        total[b] = tot
        # backward
        beta = np.full((S + 1, T + 1), NEG_INF)
        beta[se, te] = 0.0
        for s in range(se, sb - 1, -1):
            for t in range(te, tb - 1, -1):
                if (s, t) == (se, te):
                    continue
                terms = []
                if inside(s + 1, t + dt):
                    terms.append(px[b, s, t] + beta[s + 1, t + dt])
                if inside(s, t + 1):
                    terms.append(py[b, s, t] + beta[s, t + 1])
                beta[s, t] = _logsumexp(terms)
        if tot == NEG_INF:
            continue
        # occupation probabilities of the arcs inside the rectangle
        for s in range(sb, se + 1):
            for t in range(tb, te + 1):
                if inside(s + 1, t + dt):
                    v = alpha[s, t] + px[b, s, t] + beta[s + 1, t + dt] - tot
                    px_grad[b, s, t] = math.exp(v) if v > NEG_INF else 0.0
                if inside(s, t + 1):
                    v = alpha[s, t] + py[b, s, t] + beta[s, t + 1] - tot
                    py_grad[b, s, t] = math.exp(v) if v > NEG_INF else 0.0
    return _torch(total), _torch(px_grad), _torch(py_grad)


# ----------------------------------------------------------------------------
# px / py construction


def _finish(px: np.ndarray, py: np.ndarray, boundary, rnnt_type: str):
    """The regular / constrained post-processing shared by every get_* function.

    regular: ``px`` already has its extra column ``T`` at ``-inf``; in addition
    ``px[b, :, t_end_b] = -inf`` (no symbol after the last frame).
    constrained: ``px[b, s, t] += py[b, s+1, t]`` (a symbol is followed by a
    forced blank in the next context on the same frame).
    """
    B, S, _ = px.shape
    T = py.shape[2]
    if rnnt_type == "regular":
        if boundary is not None:
            for b, (_sb, _tb, _se, te) in enumerate(_boundary_rows(boundary, B, S, T)):
                px[b, :, te] = NEG_INF
    elif rnnt_type == "constrained":
        for b in range(B):
            for s in range(S):
                for t in range(T):
                    px[b, s, t] += py[b, s + 1, t]
    return px, py


def _empty_px(B: int, S: int, T: int, rnnt_type: str) -> np.ndarray:
    return np.full((B, S, T + 1 if rnnt_type == "regular" else T), NEG_INF)


def logprobs_simple(lm, am, symbols, termination_symbol: int, boundary=None,
                    rnnt_type: str = "regular", delay_penalty: float = 0.0):
    """k2 ``get_rnnt_logprobs`` (joiner = ``am[t] + lm[s]``), then the delay
    penalty exactly as ``rnnt_loss_simple`` adds it (``delay_penalty=0``:
    plain ``get_rnnt_logprobs``)."""
    _check_type(rnnt_type)
    lm, am, sym = _f64(lm), _f64(am), _np(symbols).astype(np.int64)
    B, T, C = am.shape
    S = lm.shape[1] - 1
    assert lm.shape == (B, S + 1, C) and sym.shape == (B, S)
    px = _empty_px(B, S, T, rnnt_type)
    py = np.zeros((B, S + 1, T))
    for b in range(B):
        for s in range(S + 1):
            for t in range(T):
                z = am[b, t] + lm[b, s]
                norm = _logsumexp(z)
                py[b, s, t] = z[termination_symbol] - norm
                if s < S:
                    px[b, s, t] = z[sym[b, s]] - norm
    px, py = _finish(px, py, boundary, rnnt_type)
    px = apply_delay_penalty(px, boundary, rnnt_type, delay_penalty)
    return _torch(px), _torch(py)


def logprobs_joint(logits, symbols, termination_symbol: int, boundary=None,
                   rnnt_type: str = "regular", delay_penalty: float = 0.0):
    """k2 ``get_rnnt_logprobs_joint`` for ``logits [B][T][S+1][C]`` (log-softmax
    over ``C`` per ``(t, s)``), then the delay penalty as in ``rnnt_loss``."""
    _check_type(rnnt_type)
    x, sym = _f64(logits), _np(symbols).astype(np.int64)
    B, T, S1, C = x.shape
    S = S1 - 1
    assert sym.shape == (B, S)
    px = _empty_px(B, S, T, rnnt_type)
    py = np.zeros((B, S + 1, T))
    for b in range(B):
        for t in range(T):
            for s in range(S + 1):
                norm = _logsumexp(x[b, t, s])
                py[b, s, t] = x[b, t, s, termination_symbol] - norm
                if s < S:
                    px[b, s, t] = x[b, t, s, sym[b, s]] - norm
    px, py = _finish(px, py, boundary, rnnt_type)
    px = apply_delay_penalty(px, boundary, rnnt_type, delay_penalty)
    return _torch(px), _torch(py)


def logprobs_smoothed(lm, am, symbols, termination_symbol: int,
                      lm_only_scale: float = 0.1, am_only_scale: float = 0.1,
                      boundary=None, rnnt_type: str = "regular",
                      delay_penalty: float = 0.0):
    """k2 ``get_rnnt_logprobs_smoothed`` (then the delay penalty as in
    ``rnnt_loss_smoothed``).

    Each of ``px``, ``py`` is the interpolation, in the log domain::

        c * combined + l * lm_only + a * am_only,   c = 1 - lm_only_scale - am_only_scale

    where ``l``, ``a`` are the scales with an exact ``0.0`` replaced by
    ``1e-20`` (``c`` is computed before that replacement), and

    - combined: ``log softmax_c(am[t] + lm[s])`` at the symbol (as ``logprobs_simple``);
    - lm_only:  ``log softmax_c(lm[s])`` at the symbol (constant over ``t``);
    - am_only:  ``am[t, y] + log u[y] - log sum_c exp(am[t, c]) u[c]`` with the
      "unigram" ``u[c] = mean over all B*(S+1) rows (b, s) of softmax(lm[b, s])[c]
      + tiny`` (``tiny`` = smallest normal float of the input dtype; the mean
      includes padded rows and couples the batch).
    """
    _check_type(rnnt_type)
    lm, am, sym = _f64(lm), _f64(am), _np(symbols).astype(np.int64)
    tiny = float(torch.finfo(torch.float64).tiny)  # k2: finfo(input dtype).tiny
    B, T, C = am.shape
    S = lm.shape[1] - 1
    assert lm.shape == (B, S + 1, C) and sym.shape == (B, S)

    lm_lsm = np.zeros_like(lm)  # log softmax of lm rows
    for b in range(B):
        for s in range(S + 1):
            lm_lsm[b, s] = lm[b, s] - _logsumexp(lm[b, s])
    unigram = np.zeros(C)
    for b in range(B):
        for s in range(S + 1):
            unigram += np.exp(lm_lsm[b, s])
    unigram = unigram / (B * (S + 1)) + tiny
    log_unigram = np.log(unigram)
    am_norm = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            am_norm[b, t] = _logsumexp(am[b, t] + log_unigram)

    combined_scale = 1.0 - lm_only_scale - am_only_scale
    l_scale = 1.0e-20 if lm_only_scale == 0.0 else lm_only_scale
    a_scale = 1.0e-20 if am_only_scale == 0.0 else am_only_scale

    def mix(comb, lmo, amo):
        return comb * combined_scale + lmo * l_scale + amo * a_scale

    px = _empty_px(B, S, T, rnnt_type)
    py = np.zeros((B, S + 1, T))
    for b in range(B):
        for s in range(S + 1):
            for t in range(T):
                z = am[b, t] + lm[b, s]
                norm = _logsumexp(z)
                k = termination_symbol
                py[b, s, t] = mix(z[k] - norm, lm_lsm[b, s, k],
                                  am[b, t, k] + log_unigram[k] - am_norm[b, t])
                if s < S:
                    y = sym[b, s]
                    px[b, s, t] = mix(z[y] - norm, lm_lsm[b, s, y],
                                      am[b, t, y] + log_unigram[y] - am_norm[b, t])
            if s < S and rnnt_type == "regular":
                # column T: combined and am-only parts are -inf there
                px[b, s, T] = mix(NEG_INF, lm_lsm[b, s, sym[b, s]], NEG_INF)
    px, py = _finish(px, py, boundary, rnnt_type)
    px = apply_delay_penalty(px, boundary, rnnt_type, delay_penalty)
    return _torch(px), _torch(py)


def apply_delay_penalty(px, boundary, rnnt_type: str, delay_penalty: float):
    """What the k2 loss wrappers add to ``px`` (after the get_* function, so
    after the constrained ``px += py[:, 1:]``), only when ``delay_penalty > 0``
    (a negative value is silently ignored)::

        px[b, s, t] += delay_penalty * (offset_b - t),   t = 0 .. px.shape[2]-1
        offset_b = (t_end_b - 1) / 2   (boundary given)  else  (T - 1) / 2

    ``py`` is untouched.  Summed over a path this is
    ``delay_penalty * sum_symbols (offset_b - t_emit)``: early emissions are
    rewarded, late ones penalised."""
    px = np.array(_f64(px), copy=True)
    if not delay_penalty > 0.0:
        return px
    B, S, T0 = px.shape
    T = T0 if rnnt_type != "regular" else T0 - 1
    if boundary is None:
        offsets = [(T - 1) / 2] * B
    else:
        offsets = [(int(r[3]) - 1) / 2 for r in _np(boundary).reshape(B, 4)]
    for b in range(B):
        for t in range(T0):
            px[b, :, t] += delay_penalty * (offsets[b] - t)
    return px


# ----------------------------------------------------------------------------
# pruning


def _reverse_cummin(x):
    out = list(x)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


def _adjust_lower_bound(s_begin, r: int):
    """Lower ``s_begin`` (one row over t) until: non-decreasing, step
    ``<= r - 1`` between neighbouring frames, ``s_begin[0] == 0`` (k2's
    two-pass trick: reverse cummin of ``s_begin``, then of
    ``(r-1)*t - s_begin`` clamped at 0)."""
    x = _reverse_cummin(s_begin)
    y = [(r - 1) * t - v for t, v in enumerate(x)]
    y = [max(v, 0) for v in _reverse_cummin(y)]
    return [(r - 1) * t - v for t, v in enumerate(y)]


def prune_ranges_reference(px_grad, py_grad, boundary, s_range: int, legacy: bool = False,
                           score_dtype=np.float64):
    """k2 ``get_rnnt_prune_ranges`` (``legacy=True``: the older algorithm, kept
    in k2 as ``get_rnnt_prune_ranges_deprecated`` and used by the fast_rnnt
    releases that still take ``modified: bool``).  Returns int64
    ``[B][T][s_range']`` with ``s_range'`` the possibly clamped width.

    New algorithm, per sequence ``b`` and frame ``t < T``:

    - regular (``px`` is ``[B][S][T+1]``): ``s_range`` below
      ``max_b (s_end_b - 1) // t_end_b + 2`` (rows with ``s_end_b, t_end_b
      >= 1``) is widened to it (a narrower band cannot reach the last symbol);
    - ``s_range > S`` -> ``s_range = S + 1``;
    - candidates ``j = 0 .. S + 1 - s_range``; score
      ``sum_{k=j}^{j+s_range-1} py_grad[b,k,t] - (px_grad[b,j-1,t] if j > 0 else 0)``;
      ``s_begin = first argmax``, the sum accumulated in ``score_dtype``
      term by term (``np.float32``: k2's float32 arithmetic);
    - frames ``t >= t_end_b - 1`` get ``max(s_end_b - s_range + 1, 0)``;
    - ``_adjust_lower_bound(s_begin, 2 if px is [B][S][T] else s_range)``;
    - ``ranges[b, t, k] = s_begin[b, t] + k``.

    Legacy: ``s_range > S`` -> ``s_range = S``; score
    ``sum_{k=j}^{j+s_range-1} (px_grad[b,k,t] [k<S] + py_grad[b,k,t] [t<T])`` for
    ``j = 0 .. S + 1 - s_range`` and ``t < T``; rest identical.
    """
    pxg, pyg = _f64(px_grad), _f64(py_grad)
    B, S, T1 = pxg.shape
    T = pyg.shape[2]
    assert T1 in (T, T + 1) and pyg.shape == (B, S + 1, T)
    assert boundary is not None
    rows = _boundary_rows(boundary, B, S, T)
    modified = T1 == T
    if legacy:
        assert s_range >= 1
        if s_range > S:
            s_range = S
    else:
        assert s_range >= 1, s_range
        if not modified:  # the band end reaches at most (s_range - 1) * t_end at the last frame
            for _sb, _tb, se, te in rows:
                while se >= 1 and te >= 1 and (s_range - 1) * te < se:
                    s_range += 1
        if s_range > S:
            s_range = S + 1
    ranges = np.zeros((B, T, s_range), dtype=np.int64)
    for b, (_sb, _tb, se, te) in enumerate(rows):
        s_begin = []
        for t in range(T):
            best_j, best = 0, None
            for j in range(S + 2 - s_range):
                if legacy:
                    score = sum(
                        (pxg[b, k, t] if k < S else 0.0) + pyg[b, k, t]
                        for k in range(j, j + s_range)
                    )
                else:
                    score = score_dtype(0.0)
                    for k in range(j, j + s_range):
                        score = score_dtype(score + score_dtype(pyg[b, k, t]))
                    score = score_dtype(score - score_dtype(pxg[b, j - 1, t] if j > 0 else 0.0))
                if best is None or score > best:
                    best_j, best = j, score
            s_begin.append(best_j)
        pad = max(se - s_range + 1, 0)
        s_begin = [v if t < te - 1 else pad for t, v in enumerate(s_begin)]
        s_begin = _adjust_lower_bound(s_begin, 2 if modified else s_range)
        for t in range(T):
            for k in range(s_range):
                ranges[b, t, k] = s_begin[t] + k
    return torch.from_numpy(ranges)


def do_rnnt_pruning_reference(am, lm, ranges):
    """``(am_pruned, lm_pruned)``, both ``[B][T][s_range][C]``:
    ``am_pruned[b,t,k] = am[b,t]``, ``lm_pruned[b,t,k] = lm[b, ranges[b,t,k]]``."""
    am, lm, rg = _f64(am), _f64(lm), _np(ranges).astype(np.int64)
    B, T, s_range = rg.shape
    C = am.shape[2]
    am_p = np.zeros((B, T, s_range, C))
    lm_p = np.zeros((B, T, s_range, C))
    for b in range(B):
        for t in range(T):
            for k in range(s_range):
                am_p[b, t, k] = am[b, t]
                lm_p[b, t, k] = lm[b, rg[b, t, k]]
    return _torch(am_p), _torch(lm_p)


def pruned_logprobs_reference(logits, symbols, ranges, termination_symbol: int,
                              boundary=None, rnnt_type: str = "regular",
                              delay_penalty: float = 0.0):
    """k2 ``get_rnnt_logprobs_pruned`` (then the delay penalty as in
    ``rnnt_loss_pruned``).  ``logits[b,t,k]`` belongs to position
    ``s = ranges[b,t,0] + k`` (k2 uses only ``ranges[:, :, 0]`` for the
    placement, and ``ranges[b,t,k]`` for the symbol look-up); full-size
    ``px``/``py`` are ``-inf`` outside the band; the px entry of position
    ``S`` (the band may reach it) is dropped."""
    _check_type(rnnt_type)
    x, sym, rg = _f64(logits), _np(symbols).astype(np.int64), _np(ranges).astype(np.int64)
    B, T, s_range, C = x.shape
    S = sym.shape[1]
    assert rg.shape == (B, T, s_range)
    sym_ext = np.concatenate([sym, np.full((B, 1), termination_symbol)], axis=1)
    px = _empty_px(B, S, T, rnnt_type)
    py = np.full((B, S + 1, T), NEG_INF)
    for b in range(B):
        for t in range(T):
            start = int(rg[b, t, 0])
            assert 0 <= start and start + s_range <= S + 1, "ranges out of [0, S]"
            for k in range(s_range):
                s = start + k
                norm = _logsumexp(x[b, t, k])
                py[b, s, t] = x[b, t, k, termination_symbol] - norm
                if s < S:
                    px[b, s, t] = x[b, t, k, sym_ext[b, rg[b, t, k]]] - norm
    px, py = _finish(px, py, boundary, rnnt_type)
    px = apply_delay_penalty(px, boundary, rnnt_type, delay_penalty)
    return _torch(px), _torch(py)


# ----------------------------------------------------------------------------
# loss wrappers


def reduce_loss(per_seq: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``none``: ``[B]``; ``sum``: sum; ``mean``: mean over the batch (divides
    by ``B``, not by lengths)."""
    if reduction == "none":
        return per_seq
    if reduction == "mean":
        return per_seq.mean()
    if reduction == "sum":
        return per_seq.sum()
    raise ValueError(f"reduction should be ('none' | 'mean' | 'sum'), given {reduction}")


def loss_from_logprobs(px, py, boundary=None, reduction: str = "mean", return_grad: bool = False):
    """``loss = reduce(-total)``; with ``return_grad`` the k2 return form
    ``(loss, (px_grad, py_grad))`` where the grads are the occupation
    probabilities ``d total / d px`` (= ``d(-loss_none.sum()) / d px``,
    independent of ``reduction``)."""
    total, pxg, pyg = mi_reference(px, py, boundary)
    loss = reduce_loss(-total, reduction)
    return (loss, (pxg, pyg)) if return_grad else loss


def rnnt_loss_simple_reference(lm, am, symbols, termination_symbol, boundary=None,
                               rnnt_type="regular", delay_penalty=0.0,
                               reduction="mean", return_grad=False):
    px, py = logprobs_simple(lm, am, symbols, termination_symbol, boundary, rnnt_type, delay_penalty)
    return loss_from_logprobs(px, py, boundary, reduction, return_grad)


def rnnt_loss_reference(logits, symbols, termination_symbol, boundary=None,
                        rnnt_type="regular", delay_penalty=0.0, reduction="mean", return_grad=False):
    px, py = logprobs_joint(logits, symbols, termination_symbol, boundary, rnnt_type, delay_penalty)
    return loss_from_logprobs(px, py, boundary, reduction, return_grad)


def rnnt_loss_smoothed_reference(lm, am, symbols, termination_symbol, lm_only_scale=0.1,
                                 am_only_scale=0.1, boundary=None, rnnt_type="regular",
                                 delay_penalty=0.0, reduction="mean", return_grad=False):
    px, py = logprobs_smoothed(lm, am, symbols, termination_symbol, lm_only_scale,
                               am_only_scale, boundary, rnnt_type, delay_penalty)
    return loss_from_logprobs(px, py, boundary, reduction, return_grad)


def rnnt_loss_pruned_reference(logits, symbols, ranges, termination_symbol, boundary=None,
                               rnnt_type="regular", delay_penalty=0.0, reduction="mean",
                               return_grad=False):
    px, py = pruned_logprobs_reference(logits, symbols, ranges, termination_symbol,
                                       boundary, rnnt_type, delay_penalty)
    return loss_from_logprobs(px, py, boundary, reduction, return_grad)
