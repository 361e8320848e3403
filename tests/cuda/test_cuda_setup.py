"""The CuPy check at first use of the GPU path (no GPU needed: fakes)."""

import paths  # tests/paths.py: the repository's and the tests' folders
import types

import pytest

import chainfb.cuda.kernels as k


def _fake_cupy(runtime_version):
    rt = types.SimpleNamespace(runtimeGetVersion=lambda: runtime_version)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=rt))


def test_missing_cupy_names_the_install_line(monkeypatch):
    def no_cupy():
        raise ImportError("No module named 'cupy'")

    monkeypatch.setattr(k, "_import_cupy", no_cupy)
    for major in (12, 13):
        monkeypatch.setattr(k, "_torch_cuda_major", lambda m=major: m)
        with pytest.raises(ImportError, match=rf"CUDA {major}.*chainfb\[gpu-cu{major}\].*cupy-cuda{major}x\[ctk\]"):
            k.require_cupy()


def test_mismatched_cupy_is_an_error(monkeypatch):
    monkeypatch.setattr(k, "_import_cupy", lambda: _fake_cupy(12080))
    monkeypatch.setattr(k, "_torch_cuda_major", lambda: 13)
    monkeypatch.setattr(k, "_torch_version_cuda", lambda: "13.0")
    with pytest.raises(RuntimeError, match=r"CUDA 12 but torch for CUDA 13.*cupy-cuda12x.*gpu-cu13"):
        k.require_cupy()


def test_matching_cupy_is_returned(monkeypatch):
    fake = _fake_cupy(13000)
    monkeypatch.setattr(k, "_import_cupy", lambda: fake)
    monkeypatch.setattr(k, "_torch_cuda_major", lambda: 13)
    assert k.require_cupy() is fake
    monkeypatch.setattr(k, "_torch_cuda_major", lambda: None)  # CPU torch: nothing to compare with
    assert k.require_cupy() is fake


def test_extras_name_both_cuda_majors():
    import configparser
    import os

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(paths.REPO, "setup.cfg"))
    extras = cfg["options.extras_require"]
    assert "cupy-cuda12x[ctk]" in extras["gpu-cu12"] and "cupy-cuda13x[ctk]" in extras["gpu-cu13"]
    assert extras["gpu"].strip() == extras["gpu-cu13"].strip()


class _FakeKernel:
    """A RawKernel stand-in: records its launches and attribute changes.  ``static``: its static shared memory;
    ``counts_static``: whether the default of max_dynamic_shared_size_bytes is 48 KiB less the static shared
    memory (as CUDA reports it) rather than 48 KiB."""

    def __init__(self, static=0, counts_static=True):
        self._static = static
        self._max = 48 * 1024 - (static if counts_static else 0)
        self.sets = []
        self.calls = []
        self.queries = 0  # attribute reads: each a driver call on a real kernel

    @property
    def shared_size_bytes(self):
        self.queries += 1
        return self._static

    @property
    def max_dynamic_shared_size_bytes(self):
        self.queries += 1
        return self._max

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value):
        self.sets.append(value)
        self._max = value

    def __call__(self, grid, block, args, *, shared_mem=0):
        self.calls.append((grid, block, args, shared_mem, self._max))


def _fake_backend(monkeypatch, kern):
    monkeypatch.setattr(k, "_import_cupy", lambda: _fake_cupy(13000))
    monkeypatch.setattr(k, "_torch_cuda_major", lambda: None)
    be = k.CupyBackend()
    be.xp = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0)))
    monkeypatch.setattr(be, "function", lambda name: kern)
    return be


def test_cupy_backend_passes_dynamic_shared_memory(monkeypatch):
    """``shared_mem`` reaches the RawKernel call; above 48 KiB the kernel's
    max_dynamic_shared_size_bytes is raised first."""
    kern = _FakeKernel()
    be = _fake_backend(monkeypatch, kern)
    be.launch("chainfb::fb_recursion<float>", 3, 64, [1, 2])
    be.launch("chainfb::fb_recursion<float>", 3, 64, [1, 2], shared_mem=1024)
    be.launch("chainfb::fb_recursion<float>", 3, 64, [1, 2], shared_mem=100 * 1024)
    be.launch("chainfb::fb_recursion<float>", 0, 64, [1, 2], shared_mem=100 * 1024)  # an empty grid: nothing
    assert kern.calls == [((3,), (64,), (1, 2), 0, 48 * 1024), ((3,), (64,), (1, 2), 1024, 48 * 1024),
                          ((3,), (64,), (1, 2), 100 * 1024, 100 * 1024)]
    with pytest.raises(ValueError, match="shared_mem"):
        be.launch("chainfb::fb_recursion<float>", 3, 64, [1, 2], shared_mem=-1)


@pytest.mark.parametrize("counts_static", [True, False])
def test_cupy_backend_opts_in_when_static_and_dynamic_pass_48_kib(monkeypatch, counts_static):
    """A launch whose dynamic shared memory is under 48 KiB but, with the kernel's static shared memory, over it
    (the cluster recursion with its arc table at T = 2000, N = 8: 48,484 bytes) opts the kernel in first -- CUDA
    refuses it otherwise -- whichever default the attribute reports; the opt-in happens once."""
    kern = _FakeKernel(static=1024, counts_static=counts_static)
    be = _fake_backend(monkeypatch, kern)
    for _ in range(2):
        be.launch("chainfb::fb_cluster_recursion<float, 2>", 16, 1024, [1], shared_mem=48484)
    assert kern.sets == [48484] if counts_static else kern.sets == [48 * 1024]
    assert kern.calls[-1][3:] == (48484, max(48484, kern.max_dynamic_shared_size_bytes))
    kern = _FakeKernel(static=1024, counts_static=counts_static)  # under 48 KiB together: nothing to set
    be = _fake_backend(monkeypatch, kern)
    for _ in range(3):
        be.launch("chainfb::fb_recursion<float>", 3, 64, [1], shared_mem=47 * 1024)
    assert kern.sets == [] and len(kern.calls) == 3
    assert kern.queries == 1  # the static size, read once: no driver query at every launch
