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
