"""The CPU emulation of chainfb's CUDA kernels, for the tests: the same
``.cu`` sources (``chainfb/cuda/``) built by the host C++ compiler under
``emulate.h`` and loaded with ctypes (:mod:`.backend`), and the switch that
runs the package's whole GPU code path on it (:mod:`.placement`).

Every CUDA thread is a user-level fiber on the launching thread, switched
at ``__syncthreads`` and at warp intrinsics: several blocks interleaved in a
random order, the threads of each phase in a shuffled order (seeded by
``CHAINFB_EMULATE_SEED``), warp shuffles, ``__syncwarp`` and
``__activemask`` as CUDA defines them, static and dynamic shared memory
poisoned per block, deadlocks and misused intrinsics reported as errors.  On
request it counts the work kernels annotate (``CHAINFB_WORK``: phases,
spans and totals per launch and block, ``EmulatedBackend(count=True)``) and
moves exp / log / log1p results by a few ulps (``CHAINFB_EMULATE_MATH``).

Files here: ``emulate.h`` (the CUDA subset: launches, blocks, the fiber
schedule, shared memory, the checks a GPU run would not make),
``emulate_fiber.h`` (the fibers' context switch and stacks, with the
sanitizers' annotations), ``emulate_warp.h`` (the warp intrinsics),
``emulate_math.h`` (the math modes), ``emulate_half.h`` (the 16-bit float
conversions in software, bit-exact), ``emulate_launch.cpp`` (the C entry
points), ``emulate_replay.cpp`` (a standalone replayer of recorded
launches, for ThreadSanitizer), ``emulate_selftest.h`` (kernels that break
the rules on purpose, or whose results and counts are known), ``speed.py``
(times long sequences through the engine kernels).  None of it is part of
the installed package.
"""

from .backend import EMULATION_DIR, EmulatedBackend, LaunchStats, build, build_replay, find_compiler, host_build_flags
from .placement import run_on

__all__ = ["EMULATION_DIR", "EmulatedBackend", "LaunchStats", "build", "build_replay", "find_compiler",
           "host_build_flags", "run_on"]
