"""The GPU layer: CUDA sources (``*.cu``, shipped as package data), their
run-time compilation and launch (:mod:`~chainfb.cuda.kernels`), torch <->
CuPy interop (:mod:`~chainfb.cuda.interop`), the host emulation that runs
the same sources on the CPU (:mod:`~chainfb.cuda.emulation`), and the
launchers of the transducer score-map kernels
(:mod:`~chainfb.cuda.transducer_maps`).  The engine's kernels are driven by
:mod:`chainfb.engines.cuda`.

Importing this package imports neither CuPy nor the rest of chainfb.
"""

from .interop import cupy_view, torch_stream
from .kernels import cupy_backend

__all__ = ["cupy_view", "torch_stream", "cupy_backend"]
