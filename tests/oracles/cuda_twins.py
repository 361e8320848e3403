"""NumPy twins of the GPU kernels, with the signatures of their GPU
counterparts less the leading kernel backend (as in CuPy's cupyx): the
reference the kernel tests compare against, written straightforwardly and
independently of the ``.cu`` code.

- engine: :func:`chainfb.engines.numpy_log.forward_backward` is the twin of
  :func:`chainfb.engines.cuda.forward_backward`.
- :func:`transducer_gather`, :func:`transducer_grad`: twins of
  :func:`chainfb.cuda.transducer_maps.transducer_gather` /
  :func:`chainfb.cuda.transducer_maps.transducer_grad` (conventions there).
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


def _live(B, T, U1, logit_lengths, target_lengths):
    return (np.arange(T)[None, :, None] < logit_lengths[:, None, None]) & (
        np.arange(U1)[None, None, :] <= target_lengths[:, None, None]
    )


def transducer_gather(logits, sym, colidx, logit_lengths, target_lengths, num_rows, num_columns, zero_col=None,
                      fused_log_softmax=True):
    """NumPy twin of :func:`chainfb.cuda.transducer_gather` (same arguments,
    NumPy arrays or CPU tensors; returns NumPy ``X``, ``lse``)."""
    _check_columns(colidx, zero_col, int(num_columns))
    arr, tag, (B, T, U1, V, J), sym, colidx, Tl, Ul = check_common(
        np, logits, sym, colidx, logit_lengths, target_lengths
    )
    R = kernel_float_dtype(tag)
    x = _values(arr, tag)
    live = _live(B, T, U1, Tl, Ul)
    if fused_log_softmax:
        m = x.max(axis=3, keepdims=True)
        m = np.where(np.isfinite(m), m, 0).astype(R)
        with np.errstate(divide="ignore"):
            lse = (np.log(np.exp(x - m).sum(axis=3, keepdims=True, dtype=R)) + m)[..., 0].astype(R)
    else:
        lse = np.zeros((B, T, U1), dtype=R)
    lse = np.where(live, lse, R.type(0)).astype(R)
    X = np.full((int(num_rows), int(num_columns)), -np.inf, dtype=R)
    used = (colidx >= 0) & (sym >= 0)
    for b in range(B):
        for t in range(int(Tl[b])):
            for u in range(int(Ul[b]) + 1):
                n = t + u
                if n >= num_rows:
                    continue
                for j in range(J):
                    if used[b, u, j]:
                        X[n, colidx[b, u, j]] = x[b, t, u, sym[b, u, j]] - lse[b, t, u]
    if zero_col is not None:
        zc = np.asarray(zero_col).reshape(B)
        for b in range(B):
            if zc[b] >= 0:
                X[: min(int(num_rows), int(Tl[b] + Ul[b])), zc[b]] = 0.0
    return X, lse


def transducer_grad(logits, sym, colidx, logit_lengths, target_lengths, post, lse, scale, kind_weight, clamp=-1.0,
                    fused_log_softmax=True):
    """NumPy twin of :func:`chainfb.cuda.transducer_grad` (returns the same
    container and dtype as ``logits``: NumPy array or CPU tensor)."""
    _check_columns(colidx, None, int(np.shape(post)[1]))
    arr, tag, (B, T, U1, V, J), sym, colidx, Tl, Ul = check_common(
        np, logits, sym, colidx, logit_lengths, target_lengths
    )
    R = kernel_float_dtype(tag)
    x = _values(arr, tag)
    w = check_kind_weight(np, kind_weight, J, R)
    post = np.asarray(post, dtype=R)
    lse = np.asarray(lse, dtype=R)
    scale = np.broadcast_to(np.asarray(scale, dtype=R), (B,))
    used = (colidx >= 0) & (sym >= 0)
    g = np.zeros((B, T, U1, V), dtype=R)
    for b in range(B):
        for t in range(int(Tl[b])):
            for u in range(int(Ul[b]) + 1):
                n = t + u
                if n >= post.shape[0]:
                    continue
                # w_j post_j of every kind, 0 where unused
                wp = np.array([w[j] * post[n, colidx[b, u, j]] if used[b, u, j] else 0 for j in range(J)], dtype=R)
                row = np.zeros(V, dtype=R)
                if fused_log_softmax:
                    row += np.exp(x[b, t, u] - lse[b, t, u]) * wp.sum(dtype=R)
                for j in range(J):
                    if used[b, u, j]:
                        row[sym[b, u, j]] -= wp[j]
                if clamp > 0:
                    row = np.clip(row, -R.type(clamp), R.type(clamp))
                g[b, t, u] = scale[b] * row if scale[b] != 0 else 0  # scale 0 zeroes the sample, NaN too
    return _store(g, tag, logits)
