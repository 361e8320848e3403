"""Kaldi-compatible log-mel filterbank features through ``kaldi-native-fbank``."""
from __future__ import annotations

import numpy as np

__all__ = ["fbank", "resample"]


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Polyphase resampling of ``samples [num_samples]`` from ``from_rate`` to ``to_rate`` Hz (float64 out)."""
    from math import gcd

    from scipy.signal import resample_poly

    if from_rate <= 0 or to_rate <= 0:
        raise ValueError(f"from_rate/to_rate: expected positive sample rates, got {from_rate}, {to_rate}")
    x = np.asarray(samples, dtype=np.float64)
    if from_rate == to_rate:
        return x
    g = gcd(int(from_rate), int(to_rate))
    return resample_poly(x, int(to_rate) // g, int(from_rate) // g)


def fbank(samples: np.ndarray, sample_rate: int = 16000, num_bins: int = 40) -> np.ndarray:
    """Kaldi ``compute-fbank-feats`` defaults (25 ms window, 10 ms shift, povey window, no dither) with
    ``num_bins`` mel bins. ``samples [num_samples]`` are in int16 scale. Returns float32 ``[num_frames, num_bins]``."""
    try:
        import kaldi_native_fbank as knf  # type: ignore
    except ImportError as exc:  # pragma: no cover
        raise ImportError("the 'recipe' extra is needed: pip install kaldi-native-fbank") from exc
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"samples: expected a 1-D array [num_samples], got shape {x.shape}")
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.frame_opts.samp_freq = float(sample_rate)
    opts.mel_opts.num_bins = int(num_bins)
    comp = knf.OnlineFbank(opts)
    comp.accept_waveform(float(sample_rate), x.tolist())
    comp.input_finished()
    n = comp.num_frames_ready
    if n == 0:
        return np.zeros((0, num_bins), np.float32)
    return np.stack([np.asarray(comp.get_frame(i), dtype=np.float32) for i in range(n)])
