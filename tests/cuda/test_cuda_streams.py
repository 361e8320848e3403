"""chainfb leaves CuPy's current device, stream and allocator as the caller
had them: its CuPy work for CUDA torch tensors runs inside
chainfb.cuda.interop.torch_stream, which sets torch's stream and allocator
and restores CuPy's state on exit.  Checked on a fake CuPy with CuPy's
semantics (no GPU needed); the same on a GPU is in test_cuda_device.py.
Device arrays cached on a lattice are kept per stream."""

import contextlib
import types

import numpy as np
import pytest
import torch

import chainfb
import chainfb.cuda.interop as interop
import chainfb.cuda.kernels as kernels
from chainfb import FstBatch, Lattice
from chainfb.api import PdfCriterion
from chainfb.engines import numpy_log
from chainfb.engines.cuda import lattice_arrays
from chainfb.testing import random_fst


class FakeCupy:
    """The part of CuPy chainfb uses around streams, with CuPy's semantics:
    a current device; a current stream per device (``stream.use()``, ``with
    stream:`` restores the previous one on exit); an allocator
    (``set_allocator``, ``using_allocator`` restores on exit); ``from_dlpack``
    records the device and stream it ran on."""

    def __init__(self):
        fake = self
        self.device = 0
        self.streams = {}  # device -> current stream
        self.allocator = "cupy default pool"
        self.dlpack_calls = []

        class Stream:
            def __init__(self, ptr, device_id=None):
                self.ptr, self.device_id = ptr, device_id

            def use(self):
                fake.streams[fake.device if self.device_id is None else self.device_id] = self
                return self

            def __enter__(self):
                dev = fake.device if self.device_id is None else self.device_id
                self._prev = (dev, fake.streams.get(dev, Stream.null))
                return self.use()

            def __exit__(self, *exc):
                dev, prev = self._prev
                fake.streams[dev] = prev

        Stream.null = Stream(0)

        class Device:
            def __init__(self, device_id=None):
                self.id = fake.device if device_id is None else device_id

            def use(self):
                fake.device = self.id

            def __enter__(self):
                self._prev = fake.device
                fake.device = self.id
                return self

            def __exit__(self, *exc):
                fake.device = self._prev

        @contextlib.contextmanager
        def using_allocator(allocator=None):
            prev, fake.allocator = fake.allocator, allocator
            try:
                yield
            finally:
                fake.allocator = prev

        def get_current_stream():
            return fake.streams.get(fake.device, Stream.null)

        def from_dlpack(x):
            fake.dlpack_calls.append((fake.device, get_current_stream().ptr))
            return np.asarray(x)

        self.Stream = Stream
        self.cuda = types.SimpleNamespace(
            Stream=Stream, ExternalStream=Stream, Device=Device, using_allocator=using_allocator,
            get_current_stream=get_current_stream, get_allocator=lambda: fake.allocator,
            set_allocator=lambda a: setattr(fake, "allocator", a),
            runtime=types.SimpleNamespace(runtimeGetVersion=lambda: 13000))
        self.from_dlpack = from_dlpack
        self.asarray = lambda a, dtype=None: np.array(a, dtype=dtype)  # an upload: a new array
        self.ascontiguousarray = np.ascontiguousarray

    def state(self):
        """Everything chainfb must leave as it found it (the current stream of
        devices 0 and 1)."""
        return self.device, [self.streams.get(d, self.Stream.null) for d in (0, 1)], self.allocator


TORCH_STREAM = 0x5EED  # the handle of torch's current stream in these tests


@pytest.fixture
def fake(monkeypatch):
    """A fake CuPy, torch's current stream faked, and a caller's CuPy state:
    device 0 with its own stream, a custom allocator."""
    cp = FakeCupy()
    monkeypatch.setattr(kernels, "_import_cupy", lambda: cp)
    monkeypatch.setattr(kernels, "_torch_cuda_major", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(
        cuda_stream=TORCH_STREAM))
    monkeypatch.delenv("CHAINFB_CUPY_ALLOCATOR", raising=False)
    cp.Stream(77).use()
    cp.allocator = "the caller's allocator"
    return cp


def test_torch_stream_sets_and_restores(fake):
    before = fake.state()
    with interop.torch_stream(1) as s:
        assert fake.device == 1
        assert fake.cuda.get_current_stream() is s and s.ptr == TORCH_STREAM
        assert fake.allocator is interop.torch_malloc
        with interop.torch_stream(1):  # nested, as when a criterion runs inside a public function
            assert fake.cuda.get_current_stream().ptr == TORCH_STREAM
        assert fake.cuda.get_current_stream() is s and fake.allocator is interop.torch_malloc
    assert fake.state() == before


def test_torch_stream_restores_after_an_error(fake):
    before = fake.state()
    with pytest.raises(RuntimeError, match="inside"):
        with interop.torch_stream(0):
            assert fake.cuda.get_current_stream().ptr == TORCH_STREAM
            raise RuntimeError("inside")
    assert fake.state() == before


def test_torch_default_stream_is_cupy_null_stream(fake, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0))
    before = fake.state()
    with interop.torch_stream(0) as s:
        assert s is fake.Stream.null and fake.cuda.get_current_stream() is fake.Stream.null
    assert fake.state() == before


def test_cupy_allocator_kept_on_request(fake, monkeypatch):
    monkeypatch.setenv("CHAINFB_CUPY_ALLOCATOR", "cupy")
    with interop.torch_stream(0):
        assert fake.allocator == "the caller's allocator"
        assert fake.cuda.get_current_stream().ptr == TORCH_STREAM
    assert fake.cuda.get_current_stream().ptr == 77


def test_no_cuda_tensor_no_cupy(monkeypatch):
    def no_cupy():
        raise AssertionError("CuPy must not be imported without a CUDA tensor")

    monkeypatch.setattr(kernels, "_import_cupy", no_cupy)
    with interop.torch_stream(interop.cuda_device_of(torch.zeros(2), (np.zeros(1), torch.ones(1)), 3)) as s:
        assert s is None
    assert interop.cuda_device_of() is None


class _Probe:
    """Records the fake CuPy's stream and allocator while the engine runs."""

    def __init__(self, cp):
        self.cp, self.seen = cp, []

    def __call__(self, *args, **kwargs):
        self.seen.append((self.cp.device, self.cp.cuda.get_current_stream().ptr, self.cp.allocator))
        return numpy_log.forward_backward(*args, **kwargs)


@pytest.fixture
def pretend_cuda(fake, monkeypatch):
    """Every torch tensor counts as a CUDA tensor of device 0 (the CPU data
    stays where it is); the engine is probed."""
    import chainfb.compat.kaldi

    for module in (interop, chainfb.compat.kaldi):
        monkeypatch.setattr(module, "cuda_device_of", lambda *xs: 0)
    probe = _Probe(fake)
    monkeypatch.setattr(chainfb.engines, "_module", lambda name: types.SimpleNamespace(forward_backward=probe))
    return probe


def _case():
    rng = np.random.default_rng(0)
    fsts = [random_fst(rng, num_states=4, num_arcs=10, num_pdfs=3) for _ in range(2)]
    return fsts, torch.from_numpy(rng.normal(size=(2, 4, 3)))


def test_criterion_run_leaves_cupy_state(pretend_cuda, fake):
    fsts, scores = _case()
    before = fake.state()
    crit = PdfCriterion(fsts, scores.shape)
    ll, grad = crit.run(scores)
    assert pretend_cuda.seen == [(0, TORCH_STREAM, interop.torch_malloc)]
    assert fake.state() == before
    want = chainfb.forward_backward(fsts, scores.numpy())
    np.testing.assert_allclose(ll.numpy(), want[0])
    np.testing.assert_allclose(grad.numpy(), want[1])


@pytest.mark.parametrize("call", ["forward_backward", "fst_loglike", "denominator", "kaldi"])
def test_public_calls_leave_cupy_state(pretend_cuda, fake, call):
    from chainfb.chain import DenominatorGraph
    from chainfb.kaldi import GenericNumeratorComputation, Supervision

    fsts, scores = _case()
    before = fake.state()
    if call == "forward_backward":
        chainfb.forward_backward(fsts, scores)
    elif call == "fst_loglike":
        chainfb.fst_loglike(scores.requires_grad_(), fsts).sum().backward()
    elif call == "denominator":
        DenominatorGraph(fsts[0], num_pdfs=3).forward_backward(scores, None, 0.1)
    else:
        out = scores.transpose(0, 1).reshape(8, 3)  # Kaldi's layout: row t * N + n
        comp = GenericNumeratorComputation(Supervision(fsts, 4), out)
        comp.compute_objf()
        comp.forward_backward(torch.zeros(8, 3, dtype=torch.float64))
    assert pretend_cuda.seen and set(pretend_cuda.seen) == {(0, TORCH_STREAM, interop.torch_malloc)}
    assert fake.state() == before


# ---------------------------------------------------------------- the lattice cache, per stream


def test_lattice_arrays_cached_per_stream(fake):
    backend = kernels.CupyBackend()
    lat = Lattice.of(FstBatch([random_fst(np.random.default_rng(1))]))
    side = fake.Stream(1234)
    with fake.Stream(99):
        first = lattice_arrays(backend, lat, np.float64)
        assert lattice_arrays(backend, lat, np.float64) is first
    with side:
        other = lattice_arrays(backend, lat, np.float64)
    assert other is not first and other["in_ptr"] is not first["in_ptr"]
    np.testing.assert_array_equal(other["in_ptr"], first["in_ptr"])
    keys = {k[2] for k in lat.memo.keys() if k[:2] == ("cuda", "arrays")}
    assert keys == {("cuda", 0, 99), ("cuda", 0, 1234)}
    with fake.Stream(99):
        assert lattice_arrays(backend, lat, np.float64) is first
