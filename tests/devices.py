"""Per-device test classes, torchaudio's pattern: a test body is written once
in a base class against ``self.device`` / ``self.tensor``; thin subclasses
run it

- ``OnCPU``: torch CPU tensors (the compiled engine where Numba is
  installed, else NumPy; SciPy's for shared graphs; torch score maps);
- ``OnCPUNumPy``: the same with Numba hidden, so the NumPy engine runs;
- ``OnCUDA``: CUDA tensors (CuPy kernels; skipped without a GPU);
- ``OnEmulatedKernels``: CPU tensors, but every engine call and score map
  runs through the CUDA kernels' CPU emulation (``tests/emulation/``: the
  ``emulated_kernels`` fixture makes ``chainfb.cuda.kernels.on_device``
  take all data for device data and ``backend_for`` return the emulated
  backend), so the GPU code path is exercised on every machine.

A class's ``engine_device`` is the device of its engines in
``chainfb.engines.CAPABILITIES`` ("cpu", or "gpu" for the CUDA kernels, real
or emulated).  A test that asks for the ``pinned_engine`` fixture runs once
per engine of that device that :func:`chainfb.engines.engines_with` lists
for what it needs (:func:`engine_names`, from its ``engines`` mark): the
table, not the test, says which engine runs which body.
"""

import numpy as np
import pytest
import torch

from chainfb import engines
from chainfb.cuda import kernels


def _cuda_available():
    try:
        import cupy

        return torch.cuda.is_available() and cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


CUDA = _cuda_available()
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU, torch with CUDA and CuPy")


class DeviceCase:
    device = "cpu"
    engine_device = "cpu"

    def tensor(self, x, dtype=None):
        t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        return t.to(device=self.device, dtype=dtype) if dtype is not None else t.to(self.device)

    @staticmethod
    def numpy(t):
        return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


class OnCPU(DeviceCase):
    device = "cpu"


@pytest.mark.usefixtures("numpy_engine")
class OnCPUNumPy(DeviceCase):
    device = "cpu"


@pytest.mark.cuda
@requires_cuda
class OnCUDA(DeviceCase):
    device = "cuda"
    engine_device = "gpu"


@pytest.mark.usefixtures("emulated_kernels")
class OnEmulatedKernels(DeviceCase):
    device = "cpu"
    engine_device = "gpu"


#: engines exact only on scores whose per-frame spread is under a bound
#: (``chainfb.engines.scipy_shared.is_exact``: the scaled-probability
#: engine; ``auto`` never gives it other scores); the table has no column
#: for it, so a body of scores spread wider says ``wide_scores=True``
NARROW_SCORES_ONLY = ("shared",)


def engine_names(cls: type, mark: pytest.Mark | None) -> tuple[str, ...] | None:
    """The engines a test of class ``cls`` runs on: those of
    ``cls.engine_device`` with the capabilities its ``engines`` mark asks
    for (``@pytest.mark.engines(viterbi=True)``, ``leaky=True``,
    ``spans=True``, ``float32=True``, ...; any field of
    ``chainfb.engines.Capabilities``).  A body whose every lattice is one
    graph shared by all its sequences says ``one_graph=True`` and runs on the
    shared-graph-only engines too; the others do not.  ``wide_scores=True``:
    not on :data:`NARROW_SCORES_ONLY`.  ``runs=False``: the
    body stops at the argument checks, so no engine is pinned (None)."""
    wants = dict(mark.kwargs) if mark is not None else {}
    if not wants.pop("runs", True):
        return None
    if not wants.pop("one_graph", False):
        wants["shared_graph_only"] = False
    narrow = NARROW_SCORES_ONLY if wants.pop("wide_scores", False) else ()
    return tuple(name for name in engines.engines_with(device=cls.engine_device, **wants) if name not in narrow)


def pin_engine(name: str, monkeypatch: pytest.MonkeyPatch) -> list:
    """Make ``engine="auto"`` run engine ``name`` on the scores of its device
    wherever its row of ``CAPABILITIES`` lets it run the lattice (a
    shared-graph-only engine: where every sequence uses one graph; elsewhere
    ``auto`` picks as ever, so a body that mixes both compares the two).  A
    refusal of ``chainfb.engines.select`` is an error, never a skip.  Returns
    the list the ops run on ``name`` are appended to."""
    caps = engines.CAPABILITIES[name]
    real = engines.select
    ran = []

    def select(lat, X, op="forward_backward", engine="auto", leaky=None):
        if (engine == "auto" and kernels.on_device(X) == (caps.device == "gpu")
                and (not caps.shared_graph_only or lat.shared_fst is not None)):
            engine = name
            ran.append(op)
        return real(lat, X, op, engine, leaky)

    monkeypatch.setattr(engines, "select", select)
    return ran
