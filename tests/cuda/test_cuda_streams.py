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
    stream:`` restores the previous one on exit, from a per-device stack, so
    one stream object may be entered again inside itself); an allocator
    (``set_allocator``, ``using_allocator`` restores on exit); ``from_dlpack``
    records the device and stream it ran on."""

    def __init__(self):
        fake = self
        self.device = 0
        self.streams = {}  # device -> current stream
        self.allocator = "cupy default pool"
        self.dlpack_calls = []
        self.stack = []  # (device, previous stream) of each stream entered
        self.made = []  # the ExternalStream wrappers made

        class Stream:
            def __init__(self, ptr, device_id=None):
                self.ptr, self.device_id = ptr, device_id

            def use(self):
                fake.streams[fake.device if self.device_id is None else self.device_id] = self
                return self

            def __enter__(self):
                dev = fake.device if self.device_id is None else self.device_id
                fake.stack.append((dev, fake.streams.get(dev, Stream.null)))
                return self.use()

            def __exit__(self, *exc):
                dev, prev = fake.stack.pop()
                fake.streams[dev] = prev

        Stream.null = Stream(0)

        def external_stream(ptr, device_id=None):
            fake.made.append((ptr, device_id))
            return Stream(ptr, device_id)

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
            Stream=Stream, ExternalStream=external_stream, Device=Device, using_allocator=using_allocator,
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
    monkeypatch.setattr(interop, "current_torch_stream", lambda device: TORCH_STREAM)
    monkeypatch.setattr(interop, "_streams", {})
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
    monkeypatch.setattr(interop, "current_torch_stream", lambda device: 0)
    before = fake.state()
    with interop.torch_stream(0) as s:
        assert s is fake.Stream.null and fake.cuda.get_current_stream() is fake.Stream.null
    assert fake.state() == before


def test_torch_stream_wraps_each_stream_once(fake, monkeypatch):
    """CuPy's wrapper of torch's stream is made once per (stream, device) and kept (a bounded number of them)."""
    for _ in range(3):
        with interop.torch_stream(0):
            with interop.torch_stream(1):
                pass
    assert fake.made == [(TORCH_STREAM, 0), (TORCH_STREAM, 1)]
    monkeypatch.setattr(interop, "_STREAMS_KEPT", 2)
    monkeypatch.setattr(interop, "current_torch_stream", lambda device: 99)
    with interop.torch_stream(0):  # a third: the kept ones are dropped first
        assert fake.cuda.get_current_stream().ptr == 99
    assert list(interop._streams) == [(99, 0)]


def test_current_torch_stream_falls_back_to_the_public_call(monkeypatch):
    """Without ``torch._C._cuda_getCurrentRawStream`` (a CPU build) the handle comes from
    ``torch.cuda.current_stream``."""
    monkeypatch.setattr(interop, "_torch_private", lambda name: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=4321))
    assert interop.current_torch_stream(0) == 4321
    monkeypatch.setattr(interop, "_torch_private", lambda name: (lambda device: 1234 + device))
    assert interop.current_torch_stream(1) == 1235


def test_torch_malloc_takes_torch_blocks_and_gives_them_back(fake, monkeypatch):
    """The allocator draws from torch's caching allocator on CuPy's current stream, through torch's raw
    functions or, without them, the public ones, and hands each block back when CuPy drops it."""
    log = []

    class Memory:
        def __init__(self, ptr, size, owner, device):
            self.ptr, self.size, self.owner, self.device = ptr, size, owner, device

    fake.cuda.UnownedMemory = Memory
    fake.cuda.MemoryPointer = lambda mem, offset: mem
    raw = {"_cuda_cudaCachingAllocator_raw_alloc": lambda size, stream: log.append(("alloc", size, stream)) or 640,
           "_cuda_cudaCachingAllocator_raw_delete": lambda ptr: log.append(("free", ptr))}
    monkeypatch.setattr(interop, "_torch_private", raw.get)
    with fake.Stream(55):
        mem = interop.torch_malloc(100)
    assert (mem.ptr, mem.size, mem.device) == (640, 100, 0) and log == [("alloc", 100, 55)]
    del mem
    assert log[-1] == ("free", 640)
    monkeypatch.setattr(interop, "_torch_private", lambda name: None)
    monkeypatch.setattr(torch.cuda, "caching_allocator_alloc",
                        lambda size, device, stream: log.append(("public alloc", size, device, stream)) or 960)
    monkeypatch.setattr(torch.cuda, "caching_allocator_delete", lambda ptr: log.append(("public free", ptr)))
    mem = interop.torch_malloc(0)
    assert mem.ptr == 960 and log[-1] == ("public alloc", 1, 0, 77)  # (never a 0-byte request)
    del mem
    assert log[-1] == ("public free", 960)


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


# ---------------------------------------------------------------- cupy_view's direct wrap


class _HostCupy:
    """The part of CuPy :func:`chainfb.cuda.interop._wrap` uses, over host memory: ``ndarray(shape, dtype, memptr,
    strides)`` is NumPy's over exactly the ``size`` bytes the memory was given (NumPy refuses strides that reach
    past them), so the wrap's pointer, extent, shape and strides are checked against the tensor's values."""

    made = []

    class cuda:  # noqa: N801 -- CuPy's module name
        class UnownedMemory:
            def __init__(self, ptr, size, owner, device_id):
                self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id
                _HostCupy.made.append(self)

        @staticmethod
        def MemoryPointer(mem, offset):  # noqa: N802 -- CuPy's name
            assert offset == 0
            return mem

    @staticmethod
    def ndarray(shape, dtype, memptr, strides):
        import ctypes

        buf = (ctypes.c_char * memptr.size).from_address(memptr.ptr)
        return np.ndarray(shape, dtype, buffer=buf, strides=strides)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset slice", "strided", "expanded", "one element",
                                    "int16"])
def test_wrap_covers_exactly_the_tensor(layout):
    """The direct wrap reads the tensor's elements, for any layout torch makes, from memory that ends at its last
    element and is owned by the tensor (kept alive as long as the array)."""
    base = torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)
    t = {"contiguous": base, "transposed": base.transpose(0, 2), "offset slice": base[1:3, 2:, 1:4],
         "strided": base[::2, ::3, ::2], "expanded": base[:1, :1].expand(3, 6, 5), "one element": base[3, 5, 4:],
         "int16": base.to(torch.int16)[:, 1]}[layout]
    _HostCupy.made.clear()
    got = interop._wrap(_HostCupy, t, interop._DTYPES[t.dtype])
    np.testing.assert_array_equal(got, t.numpy())
    (mem,) = _HostCupy.made
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))  # in elements, from the first
    assert mem.ptr == t.data_ptr() and mem.size == (last + 1) * t.element_size() and mem.owner is t
