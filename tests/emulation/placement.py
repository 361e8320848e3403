"""Run the package's GPU code path on a kernel backend of the tests.

chainfb decides where data runs in one place,
:func:`chainfb.cuda.kernels.on_device` (which data take the CUDA path) and
:func:`chainfb.cuda.kernels.backend_for` (the kernel backend that runs it).
:func:`run_on` replaces both for the duration of a block: every array and
tensor counts as device data and runs on the given backend, so the public
API (engines, criteria, score maps) goes through the CUDA engines and
launchers with, e.g., :class:`~emulation.backend.EmulatedBackend`'s NumPy
arrays as device memory.
"""

from __future__ import annotations

import contextlib

import pytest

import chainfb.cuda.kernels as kernels

__all__ = ["run_on"]


@contextlib.contextmanager
def run_on(backend):
    """Within the block every engine call and score map of chainfb runs on
    ``backend``; restored on exit.  Yields ``backend``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels, "on_device", lambda x: True)
        mp.setattr(kernels, "backend_for", lambda x: backend)
        yield backend
