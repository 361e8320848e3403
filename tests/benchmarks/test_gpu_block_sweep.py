"""benchmarks/gpu_block_sweep.py's cases (the GPU needs CuPy; NumPy stands in for it here): each is a lattice
with compact scores of its shape and lengths the engine takes, and runs on the CPU engine."""

import numpy as np

import chainfb.engines as engines
from benchmarks.gpu_block_sweep import cases


def test_every_case_runs_on_the_engine():
    seen = []
    for name, lat, X, lengths, leaky in cases(np, {"rnnt", "multiblank", "tdt", "den"}):
        assert X.dtype == np.float32 and X.shape[1] == lat.num_columns and lengths.shape == (lat.num_sequences,)
        assert int(lengths.max()) == X.shape[0]
        loglike, post = engines.forward_backward(lat, X.astype(np.float64), lengths, leaky=leaky)
        assert np.isfinite(loglike).all() and post.shape == X.shape, name
        seen.append(name.split()[0])
    assert seen == ["rnnt", "multiblank", "tdt", "den"]


def test_a_launch_that_does_not_fit_is_recorded_not_failed(monkeypatch):
    """A launch whose arc table does not fit the device's shared memory (the denominator's) is a row with its
    error and ``fits`` False, which the GPU check does not count as a failure; any other error counts."""
    import types

    import benchmarks.gpu_block_sweep as sweep_module

    def engine(message):
        def forward_backward(*args, **kwargs):
            raise (ValueError if "fits" in message else RuntimeError)(message)

        return types.SimpleNamespace(forward_backward=forward_backward)

    X = np.zeros(1)
    items = [("a", ("den", None, X, None, None, "cuda", engine("no shared-memory mode of (0, 0) fits 9 bytes"), 0,
                    True, None, 1, 1)),
             ("b", ("ctc", None, X, None, None, "cuda", engine("CUDA_ERROR_INVALID_VALUE"), 0, True, None, 2, 1))]
    monkeypatch.setattr(sweep_module, "launches", lambda *a, **k: iter(items))
    place = types.SimpleNamespace(backend=types.SimpleNamespace(xp=np), emulated=True,
                                  timed_ms=lambda launch: (launch(), 1.0))
    rows = sweep_module.sweep(place, {"ctc"}, [0], [True], [None], 1)["rows"]
    assert [(r["case"], r["fits"], r["ms"].split(":")[0]) for r in rows] == [
        ("den", False, "ValueError"), ("ctc", True, "RuntimeError")]
