"""The CPU emulation of chainfb's CUDA kernels, for the tests: the same
``.cu`` sources (``chainfb/cuda/``) built by the host C++ compiler under
``emulate.h`` and loaded with ctypes (:mod:`.backend`), and the switch that
runs the package's whole GPU code path on it (:mod:`.placement`).

Files here: ``emulate.h`` (the CUDA subset on std::threads, with the checks
a GPU run would not make), ``emulate_half.h`` (the 16-bit float conversions
in software, bit-exact), ``emulate_launch.cpp`` (the C entry points),
``emulate_replay.cpp`` (a standalone replayer of recorded launches, for
ThreadSanitizer), ``emulate_selftest.h`` (kernels that break the rules on
purpose).  None of it is part of the installed package.
"""

from .backend import EMULATION_DIR, EmulatedBackend, build, build_replay, find_compiler, host_build_flags
from .placement import run_on

__all__ = ["EMULATION_DIR", "EmulatedBackend", "build", "build_replay", "find_compiler", "host_build_flags", "run_on"]
