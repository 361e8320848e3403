"""The shapes of the GPU measurements the cost model is calibrated on and
judged by (benchmarks/bench_ctc.py, benchmarks/bench_transducer.py,
benchmarks/bench_durations.py, benchmarks/bench_engine.py --den), as inputs of the
public losses and as the lattices those build."""

from __future__ import annotations

import functools

import numpy as np
import torch

__all__ = ["CTC_SHAPES", "ctc_inputs", "ctc_lattice", "librispeech_batch", "transducer_inputs", "rnnt_lattice",
           "den_inputs", "den_lattice"]

#: (T, N, C, S) of the CTC table (forward + backward against torch's CUDA ctc_loss)
CTC_SHAPES = ((500, 16, 500, 100), (2000, 8, 100, 1000), (4000, 1, 5000, 3000), (150, 64, 5000, 50))


def ctc_inputs(T: int, N: int, C: int, S: int, seed: int = 0):
    """``(log_probs [T, N, C] float32, targets [N, S], input_lengths, target_lengths)``,
    every sequence full length, labels drawn uniformly from ``1..C-1``."""
    g = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(T, N, C, generator=g).log_softmax(-1)
    targets = torch.randint(1, C, (N, S), generator=g)
    return log_probs, targets, torch.full((N,), T), torch.full((N,), S)


def ctc_lattice(T: int, N: int, C: int, S: int, seed: int = 0):
    """``(lattice, lengths, leaky)`` that ``chainfb.ctc_loss`` runs on :func:`ctc_inputs`."""
    from chainfb import Lattice, ctc_graph

    _, targets, _, _ = ctc_inputs(1, N, C, S, seed)  # the labels do not depend on T
    return Lattice.of(ctc_graph(targets)), np.full(N, T), False


def librispeech_batch(batch: int = 8, seed: int = 0):
    """``(T [B], U [B])``: utterance lengths like LibriSpeech after 4x
    subsampling (benchmarks/bench_transducer.py's draw)."""
    rng = np.random.default_rng(seed)
    T = np.clip(rng.gamma(6.0, 318 / 6.0, batch), 40, 680).astype(int)
    U = np.clip(np.round(T * rng.normal(68 / 318, 0.03, batch)), 1, 151).astype(int)
    return T, U


def transducer_inputs(T, U, V: int, extra: int = 0, seed: int = 0):
    """``(logits [B, T, U + 1, V + extra] float32, targets [B, U], T, U)`` for
    RNN-T (``extra = 0``), multi-blank (big blanks inside V) and TDT
    (``extra`` durations); labels in ``0..V-6`` (the blanks above)."""
    g = torch.Generator().manual_seed(seed)
    T, U = np.asarray(T), np.asarray(U)
    logits = torch.randn(len(T), int(T.max()), int(U.max()) + 1, V + extra, generator=g)
    targets = torch.randint(0, V - 5, (len(T), int(U.max())), generator=g, dtype=torch.int32)
    return logits, targets, torch.as_tensor(T, dtype=torch.int32), torch.as_tensor(U, dtype=torch.int32)


def rnnt_lattice(T, U):
    """``(lattice, lengths, leaky)`` of the RNN-T step graphs (``T + U`` steps)."""
    from chainfb import Lattice
    from chainfb.transducer.graphs import rnnt_graphs

    T, U = np.asarray(T), np.asarray(U)
    return Lattice.of(rnnt_graphs(U, T)), T + U, False


@functools.lru_cache(maxsize=2)
def _den(seed):
    from chainfb.testing import kaldi_sized_denominator

    rng = np.random.default_rng(seed)
    return kaldi_sized_denominator(rng), rng.bit_generator.state


def den_inputs(N: int = 128, T: int = 150, seed: int = 0):
    """``(DenominatorGraph, scores [N, T, P] float32, lengths)``: benchmarks/bench_engine.py --den."""
    den, state = _den(seed)
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    scores = rng.normal(size=(N, T, den.num_pdfs)).astype(np.float32)
    lengths = np.full(N, T)
    lengths[N // 2:] = T - rng.integers(0, 20, N - N // 2)
    return den, scores, lengths


def den_lattice(N: int = 128, T: int = 150, seed: int = 0):
    """``(lattice, lengths, leaky)`` of :func:`den_inputs`."""
    den, _, lengths = den_inputs(N, T, seed)
    return den._lattice(N), lengths, True
