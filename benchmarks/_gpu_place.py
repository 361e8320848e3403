"""Where the GPU checks run (``benchmarks/gpu_check.py`` and the scripts it starts): on a CUDA device, or on the CPU
through the kernels' emulation of the test suite (``tests/emulation/``), with the same code paths.

A :class:`Place` gives the torch device of the inputs, a kernel backend wrapped in a :class:`LaunchRecorder`, the
scope in which every engine call and score map of chainfb runs on that backend (:meth:`Place.scope`), events that
time device work, and the peak memory.  The recorder counts every kernel launch by name and, when asked, times each
one with an event pair on the current stream and describes its arguments (shapes, dtypes, scalar values) so that
the same launches can be set up again under the emulation.
"""

from __future__ import annotations

import contextlib
import math
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: environment variable naming an already built emulation library (the orchestrator builds it once for its steps)
EMULATION_LIBRARY = "CHAINFB_EMULATION_LIBRARY"


def json_number(x):
    """``x`` as a JSON-safe value: non-finite floats as the strings ``"inf"``, ``"-inf"``, ``"nan"``."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def write_lines(path: str | None, lines: list[str]) -> None:
    """Write ``lines`` to ``path`` (None: nothing), one a line."""
    if path:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")


def write_json(path: str, obj) -> None:
    """Write ``obj`` to ``path`` whole or not at all (a reader, or a kill, never sees half a file)."""
    import json

    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def until(deadline: float, items, result: dict, json_path: str | None):
    """Yield the ``(name, item)`` pairs of ``items`` while the time is before ``deadline`` (Unix time): the name
    of each one started is ``result["current"]`` (``result`` written to ``json_path`` first, so a run stopped
    from outside shows where), the names of those not started go to ``result["skipped"]``."""
    for name, item in items:
        if time.time() >= deadline:
            result["skipped"].append(name)
            continue
        result["current"] = name
        if json_path:
            write_json(json_path, result)
        yield name, item
    result["current"] = None


def describe_args(args) -> list:
    """Each kernel argument as a dict: arrays ``{"shape", "dtype"}``, scalars ``{"dtype", "value"}``."""
    out = []
    for a in args:
        if hasattr(a, "shape") and hasattr(a, "dtype") and getattr(a, "ndim", 0) > 0:
            out.append({"shape": [int(s) for s in a.shape], "dtype": str(a.dtype)})
        elif hasattr(a, "dtype"):
            out.append({"dtype": str(a.dtype), "value": json_number(a.item())})
        else:
            out.append({"type": type(a).__name__, "value": json_number(a)})
    return out


class HostEvent:
    """An event of the emulated device: kernels run synchronously on the host, so a clock reading is exact."""

    def record(self):
        self.t = time.perf_counter()

    def elapsed_ms(self, start) -> float:
        return (self.t - start.t) * 1e3


class CupyEvent:
    """A CUDA event recorded on CuPy's current stream (where the backend launches)."""

    def __init__(self):
        import cupy

        self._cupy = cupy
        self.ev = cupy.cuda.Event()

    def record(self):
        self.ev.record()

    def elapsed_ms(self, start) -> float:
        self.ev.synchronize()
        return float(self._cupy.cuda.get_elapsed_time(start.ev, self.ev))


class TorchEvent:
    """A CUDA event recorded on torch's current stream."""

    def __init__(self):
        import torch

        self.ev = torch.cuda.Event(enable_timing=True)

    def record(self):
        self.ev.record()

    def elapsed_ms(self, start) -> float:
        self.ev.synchronize()
        return float(start.ev.elapsed_time(self.ev))


class LaunchRecorder:
    """A kernel backend (see :mod:`chainfb.cuda.kernels`) that forwards to ``inner`` and records every launch.

    ``counts`` maps each kernel name to its number of launches.  Between :meth:`start_trace` and
    :meth:`stop_trace` every launch is also traced: an ``event()`` pair around it (on the current stream) and the
    description of its arguments; :meth:`stop_trace` returns the traced launches with their device times in
    milliseconds.  Keyword arguments of ``launch`` are passed through and recorded."""

    def __init__(self, inner, event):
        self.inner = inner
        self.event = event
        self.counts: dict = {}
        self._trace = None

    @property
    def xp(self):
        return self.inner.xp

    def cache_key(self):
        return self.inner.cache_key()

    def __getattr__(self, name):  # anything else the wrapped backend offers
        return getattr(self.inner, name)

    def launch(self, name, grid, block, args, **kwargs):
        self.counts[name] = self.counts.get(name, 0) + 1
        if self._trace is None:
            return self.inner.launch(name, grid, block, args, **kwargs)
        start, end = self.event(), self.event()
        start.record()
        out = self.inner.launch(name, grid, block, args, **kwargs)
        end.record()
        self._trace.append((dict(name=name, grid=int(grid), block=int(block),
                                 kwargs={k: json_number(v) for k, v in kwargs.items()},
                                 args=describe_args(args)), start, end))
        return out

    def start_trace(self):
        self._trace = []

    def stop_trace(self) -> list:
        trace, self._trace = self._trace or [], None
        out = []
        for rec, start, end in trace:
            rec["ms"] = end.elapsed_ms(start)
            out.append(rec)
        return out


def kernel_totals(launches) -> list:
    """Per kernel name of traced launches: ``{"name", "launches", "ms"}``, the longest first."""
    tot = {}
    for r in launches:
        n, ms = tot.get(r["name"], (0, 0.0))
        tot[r["name"]] = (n + 1, ms + r["ms"])
    return [dict(name=k, launches=n, ms=ms) for k, (n, ms) in sorted(tot.items(), key=lambda kv: -kv[1][1])]


@contextlib.contextmanager
def _patched(obj, **attrs):
    old = {k: getattr(obj, k) for k in attrs}
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


class Place:
    """Base of the two places; see the module docstring."""

    emulated = False
    name = "?"

    def tensor(self, x, dtype=None):
        """``x`` (array or tensor) as a torch tensor on this place's device (``dtype`` if given)."""
        import numpy as np
        import torch

        t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        return t.to(device=self.device, dtype=dtype) if dtype is not None else t.to(self.device)

    def scope(self):
        raise NotImplementedError

    def timed_ms(self, fn):
        """``(result of fn(), milliseconds)``: ``fn()`` between two events on torch's current stream."""
        start, end = self.step_event(), self.step_event()
        start.record()
        out = fn()
        end.record()
        return out, end.elapsed_ms(start)


class CudaPlace(Place):
    """The CUDA device: torch CUDA tensors, CuPy's kernel backend."""

    name = "cuda"

    def __init__(self):
        import torch

        from chainfb.cuda.kernels import cupy_backend

        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device (use --emulate to run on the CPU)")
        self.device = torch.device("cuda")
        self.backend = LaunchRecorder(cupy_backend(), CupyEvent)
        self.step_event = TorchEvent

    def scope(self):
        """chainfb's kernel backend for device data is the recorder (``chainfb.cuda.kernels.backend_for``)."""
        import chainfb.cuda.kernels as kernels

        rec = self.backend
        return _patched(kernels, backend_for=lambda x: rec if kernels.on_device(x) else None)

    def sync(self):
        import torch

        torch.cuda.synchronize()

    def reset_peak(self):
        """Start a peak-memory measurement; returns the bytes allocated now."""
        import torch

        self.sync()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def peak_bytes(self, base):
        """Peak bytes allocated by torch since :meth:`reset_peak` (CuPy's work inside chainfb's calls on torch
        tensors allocates from torch's caching allocator, so it is counted) above ``base``."""
        import torch

        self.sync()
        return int(torch.cuda.max_memory_allocated() - base)


class EmulatedPlace(Place):
    """The CPU, with every engine call and score map of chainfb on the emulated kernels (CPU tensors count as
    device data inside :meth:`scope`).  Times are host times of the emulation, not GPU times."""

    name = "emulated"
    emulated = True

    def __init__(self, library: str | None = None):
        import torch

        from ._emulation import emulation

        emu = emulation()
        EmulatedBackend, build = emu.EmulatedBackend, emu.build

        library = library or os.environ.get(EMULATION_LIBRARY)
        if not library:
            import tempfile

            library = build(tempfile.mkdtemp(prefix="chainfb-emu-"))
        self.device = torch.device("cpu")
        self.backend = LaunchRecorder(EmulatedBackend(library), HostEvent)
        self.step_event = HostEvent

    def scope(self):
        from ._emulation import emulation

        return emulation().run_on(self.backend)

    def sync(self):
        pass

    def reset_peak(self):
        return 0

    def peak_bytes(self, base):
        return None  # not measured: the emulation's memory is not the GPU's


def make_place(emulate: bool) -> Place:
    """The place of a run: :class:`EmulatedPlace` for ``emulate``, else :class:`CudaPlace`."""
    return EmulatedPlace() if emulate else CudaPlace()
