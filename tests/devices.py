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
"""

import numpy as np
import pytest
import torch


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


@pytest.mark.usefixtures("emulated_kernels")
class OnEmulatedKernels(DeviceCase):
    device = "cpu"
