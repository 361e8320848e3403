"""Transducer score maps through the kernels of ``transducer.cu``, launched
on a kernel backend (the GPU's: :func:`chainfb.cuda.kernels.cupy_backend`).

Conventions (shared with the NumPy twins the tests check them against,
``tests/oracles/cuda_twins.py``):

- ``logits [B, T, U1, V + D]`` contiguous (``U1 = Umax + 1``): ``V`` token
  logits, then ``num_durations = D >= 0`` duration logits (TDT; ``D = 0``
  for RNN-T and multi-blank); float16, bfloat16 (torch only), float32 or
  float64; math in float32, or float64 for float64 logits (the *compute
  dtype*).
- Each grid row ``(b, u)`` has ``J`` arc kinds ``j``, described by int
  tables of shape ``[B, U1, J]``: ``sym[b, u, j]``, the token the arc reads
  (or -1), ``colidx[b, u, j]``, its compact engine column (or -1), and,
  optionally, ``counts[b, u, j]``: the arc is read at frames ``t < counts``
  only (TDT's boundary rules); and by ``kind_duration [J]`` (optional): the
  duration logit kind ``j`` reads, or -1 for none.  Entry ``(b, u, j)`` is
  *used* iff ``colidx >= 0``, ``sym >= 0`` (and ``kind_duration < D``),
  *read at t* iff used and ``t < counts``.  The kernels attach no meaning to
  ``j``: what a kind is (blank, label, big blank, duration, ...) lives only
  in these tables and in ``kind_weight``.
- Step ``n = t + u``.  Row ``(b, t, u)`` is *live* iff ``t < T_b`` and
  ``u <= U_b``; *read* iff live and, when ``counts`` is given, some entry
  is read at ``t``.

``transducer_gather`` reads each read row once: ``X[n, colidx[b,u,j]] =
logits[b,t,u,sym[b,u,j]] - lse[b,t,u] (+ logits[b,t,u,V+d_j] - dlse[b,t,u]
when d_j = kind_duration[j] >= 0) - shift`` for the entries read at ``t``
(``lse`` the log-sum-exp over the ``V`` token logits, or 0 when
``fused_log_softmax`` is false; ``dlse`` over the ``D`` duration logits),
``-inf`` at every other step of the columns; ``X[n, zero_col[b]] = 0`` for
``n < T_b + U_b``.  ``transducer_grad`` reads the row once more and writes
the gradient row once::

    grad[b,t,u,k]   = scale[b] * clamp(softmax_k * sum_j w_j post_j - sum_j w_j post_j [k == sym_j])   (k < V)
    grad[b,t,u,V+i] = scale[b] * (dsoftmax_i * sum_{j: d_j >= 0} post_j - sum_j post_j [d_j == i])     (i < D)

with ``post_j = post[t+u, colidx[b,u,j]]`` for the entries read at ``t``
and 0 otherwise, ``w = kind_weight [J]``, a softmax taken as 0 where its
normaliser is not finite (and the token one when ``fused_log_softmax`` is
false), the clamp to ``[-clamp, clamp]`` only when ``clamp > 0`` and only
on the token part, and zero on rows that are not read.

Derivation: the arc of kind ``j`` at ``(b, t, u)`` scores ``x_j =
logits[sym_j] - lse (+ logits[V + d_j] - dlse) - shift``, so ``d x_j / d
logits[k] = [k == sym_j] - softmax_k`` (no softmax term when not fused) and
``d x_j / d logits[V + i] = [i == d_j] - dsoftmax_i``, and the engine's
``post_j`` is ``d logP / d x_j``.  For a cost whose gradient w.r.t. ``x_j``
is ``-w_j post_j`` through the tokens and ``-post_j`` through the durations,
the chain rule gives the formulas above.  With ``w = 1`` it is ``d(-logP) /
d logits`` (the gradient of the loss, not of the log-likelihood); RNN-T with
FastEmit passes ``w = [1, 1 + lambda, 1, ...]`` (blank, label, big blanks),
TDT ``1`` on its blank kinds and ``1 + lambda`` on its label kinds (NeMo's
FastEmit leaves the duration gradient alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from .._arrays import Array, is_torch
from .interop import on_torch_stream
from .kernels import KernelBackend, null_or

__all__ = [
    "transducer_gather",
    "transducer_grad",
    "logits_storage",
    "lse_shape",
]

_IN = {"f32": "float, float", "f64": "double, double", "f16": "chainfb::F16, float", "bf16": "chainfb::BF16, float"}


def logits_storage(xp: ModuleType, logits: Array) -> tuple[Array, str]:
    """``(array, tag)``: the logits as an ``xp`` array of their storage (an
    int16 bit view for bfloat16) and their type tag f16/bf16/f32/f64."""
    if is_torch(logits):
        import torch

        t = logits.detach()
        tag = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64"}.get(t.dtype)
        if tag is None:
            raise TypeError(f"logits: expected float16, bfloat16, float32 or float64, got {t.dtype}")
        if tag == "bf16":
            t = t.view(torch.int16)
        if xp is np:
            if t.is_cuda:
                raise TypeError("logits: expected a CPU tensor here, got a CUDA tensor")
            arr = t.numpy()
        else:
            if not t.is_cuda:
                raise TypeError("logits: expected a CUDA tensor or CuPy array, got a CPU tensor")
            from .interop import cupy_view

            arr = cupy_view(t)
    else:
        if xp is np and not isinstance(logits, np.ndarray):
            raise TypeError(f"logits: expected a NumPy array or torch tensor, got {type(logits).__name__}")
        if xp is not np and not type(logits).__module__.startswith("cupy"):
            raise TypeError(f"logits: expected a CuPy array or CUDA torch tensor, got {type(logits).__name__}")
        arr = logits
        tag = {np.dtype(np.float16): "f16", np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}.get(
            np.dtype(arr.dtype)
        )
        if tag is None:
            raise TypeError(f"logits: expected float16, float32 or float64, got {arr.dtype}")
    if arr.ndim != 4:
        raise ValueError(f"logits: expected 4-D [B, T, U1, V], got shape {tuple(arr.shape)}")
    if not arr.flags.c_contiguous:
        raise ValueError("logits: expected a contiguous [B, T, U1, V] array")
    return arr, tag


def kernel_float_dtype(tag: str) -> np.dtype:
    """The NumPy dtype the kernels compute in for input tag ``tag`` (float64 for ``"f64"``, else float32)."""
    return np.dtype(np.float64) if tag == "f64" else np.dtype(np.float32)


def _ints(xp, x, name, shape=None, ndim=None):
    if is_torch(x):
        x = x.detach()
        if xp is np:
            x = x.cpu().numpy()
        else:
            from .interop import cupy_view

            x = cupy_view(x) if x.is_cuda else x.numpy()
    a = xp.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got dtype {a.dtype}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(a.shape)}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim}-D, got shape {tuple(a.shape)}")
    return xp.ascontiguousarray(a.astype(np.int32, copy=False))


def _host(x):
    """``x`` as a NumPy array when it lives in host memory, else None."""
    if is_torch(x):
        return None if x.is_cuda else x.detach().numpy()
    if isinstance(x, (np.ndarray, list, tuple)):
        return np.asarray(x)
    return None


@dataclass
class RowArgs:
    """The validated arguments both row kernels take (:func:`check_common`):
    the logits' storage ``arr`` and type tag, the sizes, and the index tables
    as contiguous int32 ``xp`` arrays (``counts``, ``kind_duration``: None
    when not given)."""

    arr: Array
    tag: str
    B: int
    T: int
    U1: int
    V: int
    D: int
    J: int
    sym: Array
    colidx: Array
    counts: Array
    kind_duration: Array
    logit_lengths: Array
    target_lengths: Array

    def launch(self, backend: KernelBackend, kernel: str, fused_log_softmax: bool, threads_per_row: int,
               block_size: int, extra_args: Sequence[Any]) -> None:
        """Launch row kernel ``kernel`` (``threads_per_row`` threads per
        ``(b, t, u)`` row): the row arguments, then ``extra_args``."""
        i32 = np.int32
        rows = self.B * self.T * self.U1
        backend.launch(
            f"chainfb::{kernel}<{_IN[self.tag]}>",
            _launch_shape(rows, threads_per_row, block_size) if rows else 0,
            block_size,
            [self.arr, i32(self.B), i32(self.T), i32(self.U1), i32(self.V), i32(self.D), self.sym, self.colidx,
             null_or(self.counts), null_or(self.kind_duration), i32(self.J), self.logit_lengths,
             self.target_lengths, i32(bool(fused_log_softmax)), i32(threads_per_row)] + list(extra_args),
        )


def check_common(xp: ModuleType, logits: Array, sym: Array, colidx: Array, logit_lengths: Array, target_lengths: Array,
                 num_durations: int = 0, kind_duration: Array | None = None, counts: Array | None = None) -> RowArgs:
    """Validate and normalise the arguments shared by gather and grad."""
    arr, tag = logits_storage(xp, logits)
    B, T, U1, W = (int(s) for s in arr.shape)
    if U1 < 1:
        raise ValueError("logits: the U1 dimension (max target length + 1) must be >= 1")
    D = int(num_durations)
    if not 0 <= D < W:
        raise ValueError(f"num_durations: expected 0 <= D < {W} (the logits' last dimension holds V >= 1 token "
                         f"logits, then the D duration logits), got {num_durations}")
    V = W - D
    sym_host = _host(sym)
    sym = _ints(xp, sym, "sym", ndim=3)
    colidx = _ints(xp, colidx, "colidx", ndim=3)
    if sym.shape[:2] != (B, U1) or sym.shape[2] < 1:
        raise ValueError(f"sym: expected shape ({B}, {U1}, J), got {tuple(sym.shape)}")
    if colidx.shape != sym.shape:
        raise ValueError(f"colidx: expected the shape of sym {tuple(sym.shape)}, got {tuple(colidx.shape)}")
    J = int(sym.shape[2])
    if sym_host is not None and sym_host.size and (sym_host.min() < -1 or sym_host.max() >= V):
        raise ValueError(f"sym: symbols must lie in [-1, V={V}), got [{sym_host.min()}, {sym_host.max()}]")
    if kind_duration is not None:
        h = _host(kind_duration)
        kind_duration = _ints(xp, kind_duration, "kind_duration", shape=(J,))
        if h is not None and h.size and (h.min() < -1 or h.max() >= D):
            raise ValueError(f"kind_duration: duration indices must lie in [-1, D={D}), got [{h.min()}, {h.max()}]")
    if counts is not None:
        counts = _ints(xp, counts, "counts", shape=sym.shape)  # any values are safe: they only restrict reads
    for name, a, hi in (("logit_lengths", logit_lengths, T), ("target_lengths", target_lengths, U1 - 1)):
        h = _host(a)  # device lengths are safe: they only decide which in-bounds rows are live
        if h is not None and h.dtype.kind in "iu" and h.size and (h.min() < 0 or h.max() > hi):
            raise ValueError(f"{name}: every length must lie in [0, {hi}], got [{h.min()}, {h.max()}]")
    logit_lengths = _ints(xp, logit_lengths, "logit_lengths", shape=(B,))
    target_lengths = _ints(xp, target_lengths, "target_lengths", shape=(B,))
    return RowArgs(arr, tag, B, T, U1, V, D, J, sym, colidx, counts, kind_duration, logit_lengths, target_lengths)


def lse_shape(B: int, T: int, U1: int, D: int) -> tuple:
    """Shape of the gather's normalisers: ``[B, T, U1]``, or ``[B, T, U1, 2]``
    (token, duration) when there are ``D > 0`` duration logits."""
    return (B, T, U1, 2) if D else (B, T, U1)


def check_kind_weight(xp: ModuleType, kind_weight: Array, J: int, R: np.dtype) -> Array:
    """``kind_weight`` as a contiguous ``[J]`` array of the compute dtype."""
    if is_torch(kind_weight):
        kind_weight = kind_weight.detach()
        if xp is np or not kind_weight.is_cuda:
            kind_weight = kind_weight.cpu().numpy()
        else:
            from .interop import cupy_view

            kind_weight = cupy_view(kind_weight)
    w = xp.asarray(kind_weight)
    if w.dtype.kind not in "iuf":
        raise TypeError(f"kind_weight: expected real numbers, got dtype {w.dtype}")
    if tuple(w.shape) != (J,):
        raise ValueError(f"kind_weight: expected shape ({J},) (one weight per arc kind), got {tuple(w.shape)}")
    return xp.ascontiguousarray(w.astype(R, copy=False))


def _check_columns(colidx, zero_col, C):
    """Range-check host-side column indices (device arrays are not checked:
    that would synchronise; the kernels ignore out-of-range entries)."""
    for name, a in (("colidx", colidx), ("zero_col", zero_col)):
        a = None if a is None else _host(a)
        if a is None:
            continue
        if a.size and (a.min() < -1 or a.max() >= C):
            raise ValueError(f"{name}: column indices must lie in [-1, {C}), got [{a.min()}, {a.max()}]")


def _launch_shape(rows, tpr, block):
    if tpr & (tpr - 1) or block % tpr or not 1 <= block <= 1024:
        raise ValueError(f"threads_per_row must be a power of two dividing block_size <= 1024, got {tpr}, {block}")
    per = block // tpr
    return (rows + per - 1) // per


@on_torch_stream
def transducer_gather(backend: KernelBackend, logits: Array, sym: Array, colidx: Array, logit_lengths: Array,
                      target_lengths: Array, num_rows: int, num_columns: int, zero_col: Array | None = None,
                      fused_log_softmax: bool = True, threads_per_row: int = 32, block_size: int = 128,
                      num_durations: int = 0, kind_duration: Array | None = None, counts: Array | None = None,
                      shift: float = 0.0, every_column: bool = False) -> tuple[Array, Array]:
    """Fused log-softmax + skewed gather of the engine's scores.

    Parameters
    ----------
    backend : the kernel backend (:func:`chainfb.cuda.kernels.cupy_backend`
        on the GPU; interface in :mod:`chainfb.cuda.kernels`).
    logits : ``[B, T, U1, V + D]`` ``backend.xp`` array or torch tensor
        (CUDA for the GPU; float16, bfloat16, float32, float64), contiguous.
    sym, colidx : ``[B, U1, J]`` ints: the token and the compact column of
        each arc kind, -1 where unused (see the module docstring).
    logit_lengths, target_lengths : ``[B]`` ints.
    num_rows, num_columns : the shape of ``X`` (``num_rows >= T + U1 - 1``
        covers every step).
    zero_col : ``[B]`` ints or None: a column scoring 0 for ``n < T_b + U_b``.
    fused_log_softmax : bool (the token logits; the duration logits are
        always log-softmaxed)
    threads_per_row, block_size : launch shape (a power of two dividing
        ``block_size <= 1024`` threads per ``(b, t, u)`` row).
    num_durations : ``D``, the duration logits after the ``V`` token logits.
    kind_duration : ``[J]`` ints in ``[-1, D)`` or None (no kind reads a
        duration logit).
    counts : ``[B, U1, J]`` ints or None: entry ``(b, u, j)`` is read at
        frames ``t < counts[b, u, j]`` only.
    shift : a constant subtracted from every score (TDT's ``sigma``).
    every_column : ``colidx`` and ``zero_col`` name each of the
        ``num_columns`` columns exactly once (a compiled layout's tables):
        ``X`` is then not filled beforehand, the kernel writes all of it.

    Returns
    -------
    X : ``backend.xp`` ``[num_rows, num_columns]`` compute dtype (float32, or float64)
    lse : ``backend.xp`` compute dtype, ``[B, T, U1]`` (the token
        normalisers) or, when ``D > 0``, ``[B, T, U1, 2]`` (token, duration);
        0 on rows that are not read.
    """
    xp = backend.xp
    _check_columns(colidx, zero_col, int(num_columns))
    a = check_common(xp, logits, sym, colidx, logit_lengths, target_lengths, num_durations, kind_duration, counts)
    R = kernel_float_dtype(a.tag)
    shape = (int(num_rows), int(num_columns))
    # the kernel writes every step of the columns it is given; without rows (T = 0) nothing is written
    X = xp.empty(shape, dtype=R) if every_column and a.T > 0 else xp.full(shape, -np.inf, dtype=R)
    lse = xp.empty(lse_shape(a.B, a.T, a.U1, a.D), dtype=R)
    zc = None if zero_col is None else _ints(xp, zero_col, "zero_col", shape=(a.B,))
    i32 = np.int32
    a.launch(backend, "transducer_gather", fused_log_softmax, threads_per_row, block_size,
             [R.type(shift), X, i32(num_rows), i32(num_columns), null_or(zc), lse])
    return X, lse


@on_torch_stream
def transducer_grad(backend: KernelBackend, logits: Array, sym: Array, colidx: Array, logit_lengths: Array,
                    target_lengths: Array, post: Array, lse: Array, scale: Array | float, kind_weight: Array,
                    clamp: float = -1.0, fused_log_softmax: bool = True, threads_per_row: int = 32,
                    block_size: int = 128, num_durations: int = 0, kind_duration: Array | None = None,
                    counts: Array | None = None) -> Array:
    """Fused transducer gradient w.r.t. the logits.

    Parameters as :func:`transducer_gather`, plus ``post [num_rows, C]``
    (engine posteriors), ``lse`` (from the gather), ``scale [B]`` (or a
    scalar), ``kind_weight [J]`` (the weight ``w_j`` of each arc kind's
    token terms) and ``clamp`` (<= 0: none; the token part only).

    Returns
    -------
    grad : ``[B, T, U1, V + D]``, same type (``backend.xp`` array / torch
    tensor) and dtype as ``logits``.
    """
    xp = backend.xp
    colidx_in = colidx
    a = check_common(xp, logits, sym, colidx, logit_lengths, target_lengths, num_durations, kind_duration, counts)
    R = kernel_float_dtype(a.tag)
    if post.ndim != 2:
        raise ValueError(f"post: expected 2-D [num_rows, C], got shape {tuple(post.shape)}")
    _check_columns(colidx_in, None, int(post.shape[1]))
    kind_weight = check_kind_weight(xp, kind_weight, a.J, R)
    post = xp.ascontiguousarray(xp.asarray(post, dtype=R))
    lse = xp.ascontiguousarray(xp.asarray(lse, dtype=R))
    want = lse_shape(a.B, a.T, a.U1, a.D)
    if lse.shape != want:
        raise ValueError(f"lse: expected shape {want}, got {tuple(lse.shape)}")
    scale = xp.ascontiguousarray(xp.broadcast_to(xp.asarray(scale, dtype=R), (a.B,)))
    out = None
    if is_torch(logits) and xp is not np:
        # the gradient (as big as the logits) comes from torch's caching allocator, not CuPy's pool
        import torch

        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        from .interop import cupy_view

        grad = cupy_view(out)
    else:
        grad = xp.empty(a.arr.shape, dtype=a.arr.dtype)
    i32 = np.int32
    a.launch(backend, "transducer_grad", fused_log_softmax, threads_per_row, block_size,
             [post, i32(post.shape[0]), i32(post.shape[1]), lse, scale, kind_weight, R.type(clamp), grad])
    return out if out is not None else wrap_grad(grad, a.tag, logits)


def wrap_grad(grad: Array, tag: str, like: Array) -> Array:
    """The gradient as the same kind of object and dtype as ``like``."""
    if not is_torch(like):
        return grad
    import torch

    g = torch.from_numpy(grad) if isinstance(grad, np.ndarray) else torch.from_dlpack(grad)
    return g.view(torch.bfloat16) if tag == "bf16" else g
