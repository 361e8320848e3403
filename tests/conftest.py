import numpy as np
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "engines(**wants): the capabilities of chainfb.engines.CAPABILITIES a test "
                                       "that uses the pinned_engine fixture needs (see devices.engine_names)")


_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


def pytest_generate_tests(metafunc):
    """A test that uses ``pinned_engine`` runs once per engine of its class's
    device that the capability table lists for it (``devices.engine_names``)."""
    if "pinned_engine" in metafunc.fixturenames and metafunc.cls is not None:
        from devices import engine_names

        names = engine_names(metafunc.cls, metafunc.definition.get_closest_marker("engines"))
        if names is not None:
            metafunc.parametrize("pinned_engine", names, indirect=True)


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


@pytest.fixture
def pinned_engine(request, monkeypatch):
    """The engine the test runs on (a parameter from ``devices.engine_names``):
    ``engine="auto"`` runs it (``devices.pin_engine``); skipped where the
    optional dependency its row of the table needs is missing; an error if
    the test never ran it.  None (nothing pinned) for a test whose
    ``engines`` mark says ``runs=False``."""
    name = getattr(request, "param", None)
    if name is None:
        yield None
        return
    from chainfb.engines import CAPABILITIES
    from devices import pin_engine

    if CAPABILITIES[name].needs:
        pytest.importorskip(CAPABILITIES[name].needs)
    ran = pin_engine(name, monkeypatch)
    yield name
    passed = request.node.stash.get(_PASSED, False)
    assert ran or not passed, f"the test never ran engine {name!r}: mark it with the capabilities it needs"
