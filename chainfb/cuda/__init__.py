"""The GPU layer: CUDA sources (``*.cu``, ``*.cuh``, shipped as package
data), their run-time compilation and launch, the kernel-backend interface
and where data runs (:mod:`~chainfb.cuda.kernels`), torch <-> CuPy interop
(:mod:`~chainfb.cuda.interop`), and the launchers of the transducer
score-map kernels (:mod:`~chainfb.cuda.transducer_maps`).  The engine's
kernels are driven by :mod:`chainfb.engines.cuda` and
:mod:`chainfb.engines.cuda_shared`.  (The test suite runs the same sources
on the CPU through an emulation of its own, ``tests/emulation/``.)

Importing this package imports neither CuPy nor the rest of chainfb.
"""

from .interop import cupy_view, torch_stream
from .kernels import cupy_backend

__all__ = ["cupy_view", "torch_stream", "cupy_backend"]
