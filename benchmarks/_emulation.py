"""The test suite's CPU emulation of the CUDA kernels (``tests/emulation``), for the benchmarks that run the kernels
without a GPU.  It is not part of the package: the command line puts it on the path, from the repository root
``PYTHONPATH=tests python -m benchmarks.<name> ...``."""
from __future__ import annotations

import importlib
import types


def emulation() -> types.ModuleType:
    """The ``emulation`` package of the test suite, or an ``ImportError`` saying how to put it on the path."""
    try:
        return importlib.import_module("emulation")
    except ModuleNotFoundError as e:
        if e.name != "emulation":
            raise
        raise ImportError("the CPU emulation of the kernels is the test suite's (tests/emulation): run from the "
                          "repository root with PYTHONPATH=tests, e.g. PYTHONPATH=tests python -m "
                          "benchmarks.count_map_work") from None
