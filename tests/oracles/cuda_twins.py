"""NumPy twins of the GPU kernels, with the signatures of their GPU
counterparts less the leading kernel backend (as in CuPy's cupyx): the
reference the kernel tests compare against, written straightforwardly and
independently of the ``.cu`` code.

- engine: :func:`chainfb.engines.numpy_log.forward_backward` is the twin of
  :func:`chainfb.engines.cuda.forward_backward`.
- :func:`transducer_gather`, :func:`transducer_grad`: twins of
  :func:`chainfb.cuda.transducer_maps.transducer_gather` /
  :func:`chainfb.cuda.transducer_maps.transducer_grad` (conventions there:
  token and duration logits, entries read at frames ``t < counts``).
"""

from __future__ import annotations

import numpy as np

from chainfb.cuda.transducer_maps import _check_columns, check_common, check_kind_weight, kernel_float_dtype

__all__ = ["transducer_gather", "transducer_grad"]


def _values(arr, tag):
    """Logit values in the compute dtype."""
    if tag == "bf16":
        bits = arr.view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    return arr.astype(kernel_float_dtype(tag))


def _store(g, tag, like):
    """Gradient ``g`` (compute dtype) in the logits' dtype and container."""
    import torch

    if tag == "bf16":
        return torch.from_numpy(np.ascontiguousarray(g, dtype=np.float32)).to(torch.bfloat16)
    out = g.astype({"f16": np.float16, "f32": np.float32, "f64": np.float64}[tag])
    return torch.from_numpy(out) if isinstance(like, torch.Tensor) else out


def _lse(x, R):
    """log-sum-exp over the last axis in ``R`` (NaN stays NaN, all ``-inf`` gives ``-inf``)."""
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0).astype(R)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.log(np.exp(x - m).sum(axis=-1, keepdims=True, dtype=R)) + m)[..., 0].astype(R)


class _Entries:
    """Which entries ``(b, u, j)`` are read at which frames, and which rows
    (module docstring of :mod:`chainfb.cuda.transducer_maps`)."""

    def __init__(self, a):
        self.a = a
        sym, colidx = np.asarray(a.sym), np.asarray(a.colidx)
        self.dur = np.full(a.J, -1) if a.kind_duration is None else np.asarray(a.kind_duration)
        self.used = (colidx >= 0) & (sym >= 0)
        self.counts = None if a.counts is None else np.asarray(a.counts)

    def read(self, b, t, u):
        """The ``j`` read at frame ``t`` of row ``(b, u)``."""
        ok = self.used[b, u] & ((self.counts[b, u] > t) if self.counts is not None else True)
        return [j for j in range(self.a.J) if ok[j]]

    def rows(self):
        """Every read row ``(b, t, u)`` with its entries read there."""
        a = self.a
        Tl, Ul = np.asarray(a.logit_lengths), np.asarray(a.target_lengths)
        for b in range(a.B):
            for t in range(int(Tl[b])):
                for u in range(int(Ul[b]) + 1):
                    js = self.read(b, t, u)
                    if self.counts is None or js:
                        yield b, t, u, js


def transducer_gather(logits, sym, colidx, logit_lengths, target_lengths, num_rows, num_columns, zero_col=None,
                      fused_log_softmax=True, num_durations=0, kind_duration=None, counts=None, shift=0.0):
    """NumPy twin of :func:`chainfb.cuda.transducer_gather` (same arguments,
    NumPy arrays or CPU tensors; returns NumPy ``X``, ``lse``)."""
    _check_columns(colidx, zero_col, int(num_columns))
    a = check_common(np, logits, sym, colidx, logit_lengths, target_lengths, num_durations, kind_duration, counts)
    R = kernel_float_dtype(a.tag)
    x = _values(a.arr, a.tag)
    V, D = a.V, a.D
    lse = np.zeros((a.B, a.T, a.U1, 2), dtype=R)
    X = np.full((int(num_rows), int(num_columns)), -np.inf, dtype=R)
    e = _Entries(a)
    for b, t, u, js in e.rows():
        row = x[b, t, u]
        norm = _lse(row[:V], R) if fused_log_softmax else R.type(0)
        dnorm = _lse(row[V:], R) if D else R.type(0)
        lse[b, t, u] = norm, dnorm
        n = t + u
        if n >= num_rows:
            continue
        for j in js:
            v = row[a.sym[b, u, j]] - norm
            if e.dur[j] >= 0:
                v += row[V + e.dur[j]] - dnorm
            X[n, a.colidx[b, u, j]] = v - R.type(shift)
    if zero_col is not None:
        zc = np.asarray(zero_col).reshape(a.B)
        for b in range(a.B):
            if zc[b] >= 0:
                X[: min(int(num_rows), int(a.logit_lengths[b] + a.target_lengths[b])), zc[b]] = 0.0
    return X, (lse if D else lse[..., 0])


def transducer_grad(logits, sym, colidx, logit_lengths, target_lengths, post, lse, scale, kind_weight, clamp=-1.0,
                    fused_log_softmax=True, num_durations=0, kind_duration=None, counts=None):
    """NumPy twin of :func:`chainfb.cuda.transducer_grad` (returns the same
    container and dtype as ``logits``: NumPy array or CPU tensor)."""
    _check_columns(colidx, None, int(np.shape(post)[1]))
    a = check_common(np, logits, sym, colidx, logit_lengths, target_lengths, num_durations, kind_duration, counts)
    R = kernel_float_dtype(a.tag)
    x = _values(a.arr, a.tag)
    V, D = a.V, a.D
    w = check_kind_weight(np, kind_weight, a.J, R)
    post = np.asarray(post, dtype=R)
    lse = np.asarray(lse, dtype=R).reshape(a.B, a.T, a.U1, -1)
    scale = np.broadcast_to(np.asarray(scale, dtype=R), (a.B,))
    e = _Entries(a)
    g = np.zeros(x.shape, dtype=R)
    for b, t, u, js in e.rows():
        n = t + u
        if n >= post.shape[0] or scale[b] == 0:  # scale 0 zeroes the sample, NaN too
            continue
        P = {j: post[n, a.colidx[b, u, j]] for j in js}
        row = np.zeros(V + D, dtype=R)
        norm = lse[b, t, u, 0]
        if fused_log_softmax and np.isfinite(norm):
            row[:V] += np.exp(x[b, t, u, :V] - norm) * sum((w[j] * P[j] for j in js), R.type(0))
        for j in js:
            row[a.sym[b, u, j]] -= w[j] * P[j]
        if clamp > 0:
            row[:V] = np.clip(row[:V], -R.type(clamp), R.type(clamp))
        if D:
            dnorm = lse[b, t, u, 1]
            if np.isfinite(dnorm):
                row[V:] += np.exp(x[b, t, u, V:] - dnorm) * sum((P[j] for j in js if e.dur[j] >= 0), R.type(0))
            for j in js:
                if e.dur[j] >= 0:
                    row[V + e.dur[j]] -= P[j]
        g[b, t, u] = scale[b] * row
    return _store(g, a.tag, logits)
