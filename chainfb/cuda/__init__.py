"""The GPU backend: CuPy RawKernels compiled at run time from the ``.cu``
files in this package (NVRTC, cached per device).

- :func:`forward_backward_lattice_cuda`: the engine, same contract as
  :func:`chainfb.engine.forward_backward_lattice`.
- :func:`transducer_gather` / :func:`transducer_grad`: the transducer score
  maps (fused log-softmax + skewed gather, fused gradient); their NumPy twins
  with identical signatures are in :mod:`chainfb.cuda.twins`.
- :func:`cupy_view`: zero-copy torch CUDA tensor -> CuPy array on torch's
  current stream.

Importing this package does not import CuPy; calling into it does.
"""

from .engine_cuda import forward_backward_lattice_cuda
from .interop import cupy_view
from .transducer_maps import transducer_costs_cuda, transducer_gather, transducer_grad

__all__ = [
    "forward_backward_lattice_cuda",
    "cupy_view",
    "transducer_gather",
    "transducer_grad",
    "transducer_costs_cuda",
]
