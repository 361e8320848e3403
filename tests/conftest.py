import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def emulated_backend(tmp_path_factory):
    """The CUDA sources built for the host (one process-wide library, see
    ``tests/emulation/``)."""
    from emulation import EmulatedBackend, build, find_compiler

    if find_compiler() is None:
        pytest.skip("no host C++ compiler for the kernel emulation")
    return EmulatedBackend(build(str(tmp_path_factory.mktemp("emu"))))


@pytest.fixture(scope="session")
def emulated_selftest_library(tmp_path_factory):
    """The emulation library with the self-test kernels built in
    (``tests/emulation/emulate_selftest.h``): its path."""
    from emulation import build, find_compiler

    if find_compiler() is None:
        pytest.skip("no host C++ compiler for the kernel emulation")
    return build(str(tmp_path_factory.mktemp("emu_selftest")), extra_flags=("-DCHAINFB_EMULATE_SELFTEST",))


@pytest.fixture
def emulated_kernels(emulated_backend):
    """Run every engine call and score map of the test on the emulated
    kernels: where chainfb decides that data is on the device and which
    kernel backend runs it (``chainfb.cuda.kernels.on_device`` /
    ``backend_for``) are patched for the test (:func:`emulation.run_on`)."""
    from emulation import run_on

    with run_on(emulated_backend):
        yield emulated_backend


@pytest.fixture
def numpy_engine(monkeypatch):
    """Hide Numba from the engine picker: ``auto`` runs the NumPy engine."""
    from chainfb.engines import numba_log

    monkeypatch.setattr(numba_log, "numba", None)
