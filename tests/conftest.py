import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def emulated_backend(tmp_path_factory):
    """The CUDA sources built for the host (one process-wide library)."""
    from chainfb.cuda.emulation import EmulatedBackend, build, find_compiler

    if find_compiler() is None:
        pytest.skip("no host C++ compiler for the kernel emulation")
    return EmulatedBackend(build(str(tmp_path_factory.mktemp("emu"))))


@pytest.fixture
def emulated_kernels(emulated_backend):
    """Run every engine call and score map of the test on the emulated kernels."""
    from chainfb.engines import use_kernel_backend

    with use_kernel_backend(emulated_backend):
        yield emulated_backend


@pytest.fixture
def numpy_engine(monkeypatch):
    """Hide Numba from the engine picker: ``auto`` runs the NumPy engine."""
    from chainfb.engines import numba_log

    monkeypatch.setattr(numba_log, "numba", None)
