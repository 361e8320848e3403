"""The transducer kernels' duration axis and TDT's kernel route, run on the
CPU (tests/emulation): the gather and gradient kernels against their NumPy
twins (duration logits, per-entry frame counts, a shift, every input dtype,
rows at every alignment, X written whole), and ``tdt_loss`` through the
kernels against the CPU route (float32 scores and engine against the float64
path, 16-bit inputs, NaN and infinite logits kept in their utterance,
padding, FastEmit, clamp, sigma, omega), with one launch per kernel and no
torch pass over the logits."""

import numpy as np
import pytest
import torch

import chainfb
from chainfb.cuda.transducer_maps import transducer_gather, transducer_grad

from emulation import find_compiler, run_on
from oracles import cuda_twins as twins
from test_cuda_emulated import TOL, _as_input, _case

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler")


@pytest.fixture
def be(emulated_backend):
    return emulated_backend


def _tdt_case(rng, B=3, T=6, Umax=3, V=7, D=3, dtype=np.float32, with_counts=True):
    """Random logits ``[B, T, U1, V + D]`` and TDT-like tables: kinds
    ``kind * D + i`` (blank, label) of duration index ``i``, plus one kind
    reading a token and no duration; columns numbered in order (some entries
    -1), frame counts around ``T_b``."""
    T_len = rng.integers(1, T + 1, B)
    T_len[0] = T
    U_len = rng.integers(0, Umax + 1, B)
    U_len[0] = Umax
    U1 = Umax + 1
    J = 2 * D + 1
    blank = V - 1
    labels = rng.integers(0, V - 1, (B, U1))
    sym = np.empty((B, U1, J), dtype=np.int64)
    sym[:, :, :D] = blank
    sym[:, :, D:2 * D] = labels[..., None]
    sym[:, :, 2 * D] = rng.integers(0, V, (B, U1))
    colidx = -np.ones((B, U1, J), dtype=np.int32)
    c = 0
    for b in range(B):
        for u in range(U_len[b] + 1):
            for j in range(J):
                if D <= j < 2 * D and u >= U_len[b]:
                    continue
                if rng.random() < 0.1:
                    continue
                colidx[b, u, j] = c
                c += 1
    kind_duration = np.r_[np.arange(D), np.arange(D), -1]
    counts = (T_len[:, None, None] - rng.integers(-1, 3, (B, U1, J))) if with_counts else None
    logits = (rng.normal(size=(B, T, U1, V + D)) * 2).astype(dtype)
    args = dict(sym=sym, colidx=colidx, logit_lengths=T_len, target_lengths=U_len, num_durations=D,
                kind_duration=kind_duration, counts=counts)
    return logits, args, c, T + U1 - 1


@pytest.mark.parametrize("kind", ["f32", "f64", "f16", "bf16", "torch32"])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("with_counts", [True, False])
def test_duration_gather_matches_twin(be, kind, fused, with_counts):
    rng = np.random.default_rng(hash((kind, fused, with_counts)) % 2**32)
    logits, args, C, rows = _tdt_case(rng, with_counts=with_counts)
    x = _as_input(logits, kind)
    kw = dict(num_rows=rows, num_columns=C, fused_log_softmax=fused, shift=0.07, **args)
    Xe, lse_e = transducer_gather(be, x, threads_per_row=4, block_size=8, **kw)
    Xt, lse_t = twins.transducer_gather(x, **kw)
    B, T, U1 = logits.shape[:3]
    assert Xe.dtype == Xt.dtype == (np.float64 if kind == "f64" else np.float32)
    assert lse_e.shape == lse_t.shape == (B, T, U1, 2)
    np.testing.assert_array_equal(np.isneginf(Xe), np.isneginf(Xt))
    tol = 1e-12 if kind == "f64" else 4e-6
    np.testing.assert_allclose(Xe, Xt, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse_e, lse_t, rtol=tol, atol=tol)
    # the per-entry counts restrict the frames: fewer scores than with every live frame
    if with_counts:
        Xa, _ = transducer_gather(be, x, threads_per_row=4, block_size=8, **dict(kw, counts=None))
        assert np.isfinite(Xa).sum() > np.isfinite(Xe).sum()


@pytest.mark.parametrize("kind", ["f32", "f64", "f16", "bf16", "torch32"])
@pytest.mark.parametrize("fastemit,clamp,fused", [(0.0, -1.0, True), (0.25, -1.0, True), (0.1, 0.05, True),
                                                  (0.0, -1.0, False)])
def test_duration_grad_matches_twin(be, kind, fastemit, clamp, fused):
    rng = np.random.default_rng(hash((kind, fastemit, clamp, fused)) % 2**32)
    logits, args, C, rows = _tdt_case(rng)
    x = _as_input(logits, kind)
    _, lse = twins.transducer_gather(x, num_rows=rows, num_columns=C, fused_log_softmax=fused, **args)
    post = rng.random((rows, C)).astype(lse.dtype)
    scale = rng.random(logits.shape[0]) + 0.5
    scale[-1] = 0.0  # an utterance whose cost is not finite: zero gradient
    D = args["num_durations"]
    w = np.r_[np.ones(D), np.full(D, 1.0 + fastemit), 0.5]  # FastEmit weighs the label kinds' token terms
    kw = dict(post=post, lse=lse, scale=scale, kind_weight=w, clamp=clamp, fused_log_softmax=fused, **args)
    ge = transducer_grad(be, x, threads_per_row=2, block_size=4, **kw)
    gt = twins.transducer_grad(x, **kw)
    assert type(ge) is type(gt) and ge.dtype == gt.dtype and tuple(ge.shape) == tuple(gt.shape)
    ge = ge.float().numpy() if isinstance(ge, torch.Tensor) else ge.astype(np.float64)
    gt = gt.float().numpy() if isinstance(gt, torch.Tensor) else gt.astype(np.float64)
    np.testing.assert_allclose(ge, gt, rtol=TOL[kind], atol=TOL[kind])
    V = logits.shape[-1] - D
    assert not ge[-1].any()
    if clamp > 0:  # the clamp bounds the token part only
        assert np.abs(ge[..., :V]).max() <= clamp * scale.max() * (1 + TOL[kind])
    # the duration part is the plain derivative: its rows sum to zero where the token softmax is used
    live = np.abs(ge[:-1]).sum(-1) > 0
    np.testing.assert_allclose(ge[:-1][live][:, V:].sum(-1), 0.0, atol=10 * TOL[kind])


@pytest.mark.parametrize("durations", [False, True])
def test_gather_writes_every_column(be, monkeypatch, durations):
    """With tables naming every column once (``every_column``) X is not
    filled beforehand: the gather alone writes each element (X starts as
    NaN here), the steps no frame reaches and the zero columns included,
    for grids shorter and longer than X."""
    rng = np.random.default_rng(17)
    for T, extra in ((6, 0), (6, 5), (2, 9), (6, -2)):
        if durations:
            logits, args, C, rows = _tdt_case(rng, T=T, Umax=4)
            zc = None
        else:  # columns of unused entries are still named once; a zero column per utterance
            logits, args, C, rows, zc = _case(rng, T=T, Umax=4, M=2)
        rows = max(rows + extra, 1)
        kw = dict(num_rows=rows, num_columns=C, zero_col=zc, threads_per_row=2, block_size=8, **args)
        with monkeypatch.context() as m:
            m.setattr(np, "empty", lambda shape, dtype=float: np.full(shape, np.nan, dtype=dtype))
            Xw, lse_w = transducer_gather(be, logits, every_column=True, **kw)
        Xf, lse_f = transducer_gather(be, logits, **kw)
        assert not np.isnan(Xw).any() and not np.isnan(lse_w).any()
        np.testing.assert_array_equal(Xw, Xf)
        np.testing.assert_array_equal(lse_w, lse_f)
        kt = {k: v for k, v in kw.items() if k not in ("threads_per_row", "block_size")}
        np.testing.assert_allclose(Xw, twins.transducer_gather(logits, **kt)[0], rtol=4e-6, atol=4e-6)


@pytest.mark.parametrize("family, durations", [("rnnt", ()), ("rnnt", (2, 4, 50)), ("tdt", (0, 1, 2, 4)),
                                               ("tdt", (1, 3, 50))])
def test_layout_tables_name_every_column_once(family, durations):
    """The criteria pass ``every_column=True``: their layout's ``colidx``
    names each engine column exactly once (durations no utterance can take
    get no columns)."""
    from chainfb.transducer.graphs import compile_layout

    lay = compile_layout([3, 0, 2, 5], [7, 1, 4, 6], durations, umax=6, family=family)
    named = lay.colidx[lay.colidx >= 0]
    np.testing.assert_array_equal(np.sort(named), np.arange(lay.lat.num_columns))


def test_zero_column_in_the_gather_launch(be):
    """The zero column is written by the gather itself: one launch."""
    rng = np.random.default_rng(18)
    logits, args, C, rows, zc = _case(rng, M=2)
    before = len(be.launches)
    X, _ = transducer_gather(be, logits, num_rows=rows, num_columns=C, zero_col=zc, threads_per_row=2,
                             block_size=4, **args)
    assert [n.split("<")[0] for n, _, _ in be.launches[before:]] == ["chainfb::transducer_gather"]
    Xt, _ = twins.transducer_gather(logits, num_rows=rows, num_columns=C, zero_col=zc, **args)
    np.testing.assert_allclose(X, Xt, rtol=2e-6, atol=2e-6)


def _offset(a, k):
    """A C-contiguous copy of ``a`` whose data starts ``k`` elements past an
    aligned address (16-byte packs then start mid-row)."""
    buf = np.empty(a.size + 64, dtype=a.dtype)
    base = (-buf.ctypes.data % 64) // a.itemsize
    out = buf[base + k: base + k + a.size].reshape(a.shape)
    out[...] = a
    assert out.flags.c_contiguous and out.ctypes.data % 16 == (k * a.itemsize) % 16
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("V", [3, 8, 29])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_rows_at_any_alignment(be, dtype, V, offset):
    """Rows read and written in 16-byte packs where the addresses allow, one
    element at a time around them (and throughout when the gradient and the
    logits sit at different offsets): the twins' numbers at every V and
    offset, for every threads-per-row."""
    rng = np.random.default_rng(hash((np.dtype(dtype).name, V, offset)) % 2**32)
    logits, args, C, rows = _tdt_case(rng, V=V, D=2, dtype=dtype)
    x = _offset(logits, offset)
    kw = dict(num_rows=rows, num_columns=C, shift=0.05, **args)
    Xt, lse = twins.transducer_gather(x, **kw)
    post = rng.random((rows, C)).astype(lse.dtype)
    gk = dict(post=post, lse=lse, scale=1.0, kind_weight=np.linspace(0.5, 1.5, args["sym"].shape[2]), clamp=0.4,
              **args)
    gt = twins.transducer_grad(x, **gk).astype(np.float64)
    tol = {np.float64: 1e-12, np.float32: 4e-6, np.float16: 2e-3}[dtype]
    for tpr in (1, 4, 32):
        Xe, lse_e = transducer_gather(be, x, threads_per_row=tpr, block_size=32, **kw)
        np.testing.assert_array_equal(np.isneginf(Xe), np.isneginf(Xt))
        np.testing.assert_allclose(Xe, Xt, rtol=tol, atol=tol)
        ge = transducer_grad(be, x, threads_per_row=tpr, block_size=32, **gk)
        np.testing.assert_allclose(ge.astype(np.float64), gt, rtol=tol, atol=tol)


def test_duration_argument_errors(be):
    rng = np.random.default_rng(19)
    logits, args, C, rows = _tdt_case(rng)
    kw = dict(num_rows=rows, num_columns=C)
    J = args["sym"].shape[2]
    W = logits.shape[-1]
    for fn in (lambda x, **a: transducer_gather(be, x, **a), twins.transducer_gather):
        with pytest.raises(ValueError, match="num_durations"):
            fn(logits, **kw, **dict(args, num_durations=W))
        with pytest.raises(ValueError, match="kind_duration"):
            fn(logits, **kw, **dict(args, kind_duration=np.full(J, 3)))
        with pytest.raises(ValueError, match="kind_duration"):
            fn(logits, **kw, **dict(args, kind_duration=np.zeros(J + 1, dtype=int)))
        with pytest.raises(ValueError, match="counts"):
            fn(logits, **kw, **dict(args, counts=args["counts"][:, :-1]))
        with pytest.raises(TypeError, match="counts"):
            fn(logits, **kw, **dict(args, counts=args["counts"].astype(float)))
    _, lse = twins.transducer_gather(logits, **kw, **args)
    post = np.ones((rows, C), dtype=np.float32)
    with pytest.raises(ValueError, match="lse"):
        transducer_grad(be, logits, post=post, lse=lse[..., 0], scale=1.0, kind_weight=np.ones(J), **args)


def test_duration_entries_out_of_range_on_the_device(be, monkeypatch):
    """Device tables are not checked on the host: an entry whose duration
    index is out of range is ignored as an unused one, any counts only
    restrict the frames read."""
    from test_cuda_emulated_nan_bounds import device_inputs

    device_inputs(monkeypatch.setattr)
    rng = np.random.default_rng(20)
    logits, args, C, rows = _tdt_case(rng)
    kd = args["kind_duration"].copy()
    kd[1], kd[4] = 7, -9  # out of [-1, D)
    counts = args["counts"].copy()
    counts[0, 0, 0], counts[1, 0, 2] = -5, 2**31 - 1
    drop = np.zeros(args["colidx"].shape, dtype=bool)
    drop[:, :, [1, 4]] = True
    bad = dict(args, kind_duration=kd, counts=counts)
    cut = dict(args, kind_duration=np.where(np.isin(np.arange(len(kd)), [1, 4]), -1, args["kind_duration"]),
               counts=counts, sym=np.where(drop, -1, args["sym"]))
    kw = dict(num_rows=rows, num_columns=C, threads_per_row=2, block_size=4)
    Xb, lseb = transducer_gather(be, logits, **kw, **bad)
    Xr, lser = transducer_gather(be, logits, **kw, **cut)
    np.testing.assert_array_equal(Xb, Xr)
    np.testing.assert_array_equal(lseb, lser)
    post = rng.random((rows, C)).astype(np.float32)
    gk = dict(post=post, lse=lseb, scale=1.0, kind_weight=np.ones(len(kd)), threads_per_row=2, block_size=4)
    np.testing.assert_array_equal(transducer_grad(be, logits, **gk, **bad), transducer_grad(be, logits, **gk, **cut))


def sanitizer_cases(be):
    """Duration cases for the sanitizer runs of test_cuda_emulated.py: every
    dtype, rows at several offsets, X written whole, out-of-range device
    tables."""
    from test_cuda_emulated_nan_bounds import device_inputs

    rng = np.random.default_rng(21)
    for kind in ("f16", "bf16", "f32", "f64"):
        for V, offset in ((7, 0), (29, 3)):
            logits, args, C, rows = _tdt_case(rng, V=V)
            x = _offset(_as_input(logits, kind), offset) if kind != "bf16" else _as_input(logits, kind)
            X, lse = transducer_gather(be, x, num_rows=rows + 2, num_columns=C, threads_per_row=2, block_size=4,
                                       shift=0.1, every_column=True, **args)
            post = np.abs(np.nan_to_num(X, neginf=0.0))
            transducer_grad(be, x, post=post, lse=lse, scale=1.0, kind_weight=np.ones(args["sym"].shape[2]),
                            clamp=0.5, threads_per_row=4, block_size=8, **args)
    logits, args, C, rows = _tdt_case(rng)
    kd, counts = args["kind_duration"].copy(), args["counts"].copy()
    kd[1], kd[4], counts[0, 0, 0] = 7, -9, 2**31 - 1
    bad = dict(args, kind_duration=kd, counts=counts)
    with pytest.MonkeyPatch.context() as mp:
        device_inputs(mp.setattr)
        X, lse = transducer_gather(be, logits, num_rows=rows, num_columns=C, threads_per_row=2, block_size=4, **bad)
        transducer_grad(be, logits, post=np.ones((rows, C), dtype=np.float32), lse=lse, scale=1.0,
                        kind_weight=np.ones(len(kd)), threads_per_row=2, block_size=4, **bad)


def test_annotated_bytes_match_the_count(tmp_path):
    """The score-map kernels' byte annotations (CHAINFB_WORK), counted under
    the emulation for one loss call of each family, equal the bytes
    benchmarks/count_map_work.py's map_bytes counts from the layout."""
    from benchmarks import count_map_work as cmw

    be, take = cmw.counting_backend()
    T, U, V = np.array([7, 5, 2]), np.array([2, 0, 1]), 21
    for name in cmw.CASES:
        for dtype in (torch.float32, torch.float16):
            case = cmw.make_case(name, T, U, V)
            case = (case[0].to(dtype),) + case[1:]
            names, ops, got = cmw.count_call(be, take, name, case)
            assert [n.split("<")[0].split("::")[-1] for n in names] == [
                "transducer_gather", "fb_recursion", "fb_posteriors", "transducer_grad"]
            lay = cmw.criterion_layout(name, case[0].shape[2], T, U, case[4])
            bytes_in = case[0].element_size()
            want = {k: sum(v) for k, v in cmw.map_bytes(lay, tuple(case[0].shape), bytes_in, 4).items()}
            assert {k: got[k] for k in want} == want, (name, dtype, got, want)


# ------------------------------------------------------------- tdt_loss through the kernels


def _tdt_batch(seed, dtype=torch.float64, B=4, T=7, U=3, V=6, durations=(0, 1, 2, 4), Tb=(7, 5, 2, 6),
               Ub=(3, 1, 2, 0), pad_t=0, pad_u=0):
    """Logits ``[B, T + pad_t, U + 1 + pad_u, V + D]`` (blank ``V - 1``),
    targets and lengths; the padding lies past every length."""
    rng = np.random.default_rng(seed)
    D = len(durations)
    x = torch.tensor(rng.normal(size=(B, T + pad_t, U + 1 + pad_u, V + D)) * 1.5, dtype=dtype)
    tg = torch.tensor(rng.integers(0, V - 1, (B, U + pad_u)))
    return x, tg, torch.tensor(Tb), torch.tensor(Ub)


def _costs_and_grads(x, tg, Tb, Ub, durations, kernels=None, reduce="none", **kw):
    xd = x.clone().requires_grad_()
    if kernels is None:
        c = chainfb.tdt_loss(xd, tg, Tb, Ub, x.shape[-1] - len(durations) - 1, list(durations), reduction=reduce,
                             **kw)
    else:
        with run_on(kernels):
            c = chainfb.tdt_loss(xd, tg, Tb, Ub, x.shape[-1] - len(durations) - 1, list(durations),
                                 reduction=reduce, **kw)
    (c.nansum() if c.dim() else c).backward()
    return c.detach(), xd.grad


@pytest.fixture
def float32_engine(monkeypatch):
    """The engine in the scores' dtype, as on the GPU (the emulation's
    NumPy scores would otherwise be widened to float64 on their way in)."""
    import chainfb.engines as engines

    monkeypatch.setattr(engines, "_float64", lambda X: X)


OPTIONS = [dict(), dict(sigma=0.05), dict(sigma=0.05, fastemit_lambda=0.3, clamp=0.2), dict(omega=0.25),
           dict(sigma=0.02, omega=0.5, fastemit_lambda=0.1)]


@pytest.mark.parametrize("kw", OPTIONS)
@pytest.mark.parametrize("pad", [(0, 0), (2, 1)])
def test_tdt_kernel_route_matches_cpu_float64(be, kw, pad):
    x, tg, Tb, Ub = _tdt_batch(30, pad_t=pad[0], pad_u=pad[1])
    durs = (0, 1, 2, 4)
    c_ref, g_ref = _costs_and_grads(x, tg, Tb, Ub, durs, **kw)
    c, g = _costs_and_grads(x, tg, Tb, Ub, durs, kernels=be, **kw)
    np.testing.assert_allclose(c.numpy(), c_ref.numpy(), rtol=1e-10)
    np.testing.assert_allclose(g.numpy(), g_ref.numpy(), atol=1e-10)
    if pad != (0, 0):  # the padding gets an exactly zero gradient
        assert not g[:, x.shape[1] - pad[0]:].any() and not g[:, :, x.shape[2] - pad[1]:].any()


@pytest.mark.parametrize("kw", OPTIONS[:3])
def test_tdt_kernel_route_float32_against_float64_cpu(be, float32_engine, kw):
    """float32 logits: float32 scores, engine and gradient on the kernel
    route, within float32 rounding of the float64 CPU path on the same
    values."""
    x, tg, Tb, Ub = _tdt_batch(31, dtype=torch.float32, pad_t=1)
    durs = (0, 1, 2, 4)
    before = len(be.launches)
    c, g = _costs_and_grads(x, tg, Tb, Ub, durs, kernels=be, **kw)
    names = [n for n, _, _ in be.launches[before:]]
    assert names == ["chainfb::transducer_gather<float, float>", "chainfb::fb_recursion<float>",
                     "chainfb::fb_posteriors<float>", "chainfb::transducer_grad<float, float>"]
    c_ref, g_ref = _costs_and_grads(x.double(), tg, Tb, Ub, durs, **kw)
    assert c.dtype == g.dtype == torch.float32
    np.testing.assert_allclose(c.numpy(), c_ref.numpy(), rtol=2e-6)
    np.testing.assert_allclose(g.numpy(), g_ref.numpy(), atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tdt_kernel_route_16bit(be, float32_engine, dtype):
    """16-bit logits: read as stored, computed in float32, the gradient
    rounded once to the logits' dtype."""
    x, tg, Tb, Ub = _tdt_batch(32, dtype=torch.float32)
    x = x.to(dtype)
    durs = (0, 1, 2, 4)
    kw = dict(sigma=0.05, fastemit_lambda=0.2, clamp=0.3)
    c, g = _costs_and_grads(x, tg, Tb, Ub, durs, kernels=be, **kw)
    c_ref, g_ref = _costs_and_grads(x.double(), tg, Tb, Ub, durs, **kw)
    assert c.dtype == g.dtype == dtype
    np.testing.assert_allclose(c.double().numpy(), c_ref.numpy(), rtol=1e-2)
    eps = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    np.testing.assert_allclose(g.double().numpy(), g_ref.to(dtype).double().numpy(), atol=eps)


PUT = [((1, 2, 1, 3), float("nan")), ((1, 2, 1, 6 + 1), float("nan")), ((1, 3, 0, slice(0, 6)), float("-inf")),
       ((1, 1, 1, slice(6, 10)), float("-inf")), ((1, 0, 1, 2), float("inf")), ((1, 4, 0, 6 + 2), float("inf")),
       ((1, 5, 2, slice(None)), float("-inf")), ((1, 6, 0, 4), float("nan"))]


@pytest.mark.parametrize("where, value", PUT)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tdt_kernel_route_non_finite_logits(be, where, value, dtype):
    """A NaN, -inf or (single) +inf logit in the tokens or the durations of
    utterance 1: the kernel route's costs and gradients are the CPU route's
    (NaN where it has NaN, utterance 1 only), the other utterances are
    untouched and finite."""
    x, tg, Tb, Ub = _tdt_batch(33, dtype=dtype, Tb=(7, 6, 7, 5), Ub=(3, 2, 0, 3))
    x[where] = value
    durs = (0, 1, 2, 4)
    for kw in ({}, dict(sigma=0.05, fastemit_lambda=0.3, clamp=0.2)):
        c_ref, g_ref = _costs_and_grads(x, tg, Tb, Ub, durs, **kw)
        c, g = _costs_and_grads(x, tg, Tb, Ub, durs, kernels=be, **kw)
        tol = 1e-10 if dtype == torch.float64 else 1e-5
        np.testing.assert_allclose(c.numpy(), c_ref.numpy(), rtol=tol, equal_nan=True)
        np.testing.assert_allclose(g.numpy(), g_ref.numpy(), rtol=tol, atol=tol, equal_nan=True)
        keep = [0, 2, 3]
        assert torch.isfinite(c[keep]).all() and torch.isfinite(g[keep]).all()
        assert torch.isfinite(g).all()  # utterances whose cost is not finite get a zero gradient
        if value != value and where[1] < 6:  # a NaN in a frame utterance 1 reads: its cost is NaN
            assert torch.isnan(c[1])


def test_tdt_kernel_route_makes_no_torch_pass_over_the_logits(be):
    """A tdt_loss forward + backward on the kernel route: one gather, the
    engine, one gradient kernel; no torch op produces a tensor as large as
    the logits (the gradient comes out of the kernel, and the backward
    scales it in place only when the incoming gradient is not all ones)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    x, tg, Tb, Ub = _tdt_batch(34, dtype=torch.float32)
    big = []

    class Sizes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(o, torch.Tensor) and o.numel() >= x.numel() and not func.is_view:
                    big.append(func.__name__)
            return out

    xd = x.clone().requires_grad_()
    before = len(be.launches)
    with run_on(be), Sizes():
        chainfb.tdt_loss(xd, tg, Tb, Ub, 5, [0, 1, 2, 4], sigma=0.05, reduction="sum").backward()
    assert [n.split("<")[0] for n, _, _ in be.launches[before:]] == [
        "chainfb::transducer_gather", "chainfb::fb_recursion", "chainfb::fb_posteriors", "chainfb::transducer_grad"]
    assert big == [], big
