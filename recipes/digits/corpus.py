"""A synthesized spoken-digit corpus (eSpeak NG voices, noise at varied SNRs, Kaldi fbank features).

Every utterance is a random string of digit words ("zero", "oh", "one" ... "nine") spoken by an eSpeak NG voice
``accent+variant`` (English accents x the shipped voice variants) at a random rate, pitch, pitch range and word gap,
padded with random leading/trailing silence, mixed with white or pink noise at a random SNR, resampled to 16 kHz and
turned into 40-bin Kaldi fbank features.  Train and test *voices* are disjoint: the variants are split once,
deterministically, and the test set only uses the held-out variants.  Every random choice (words, voice, prosody,
padding, SNR, noise) is a function of ``seed`` and the utterance index; eSpeak NG itself is not bit-exact from call to
call (its output may differ by a sample or in low-level noise), so regenerated features match closely, not exactly.

The corpus is generated on first use into a cache directory (``~/.cache/chainfb/digits`` by default) as one
``.npz`` per split, a Kaldi ``text`` file per split, and a ``meta.json`` written last that records the configuration
and the size of every file; a later call with the same configuration reuses the entry after checking it (every file
there, with its recorded size, and readable).  An entry that fails the check -- a run killed while writing it, a
truncated or corrupted file -- is reported and synthesized again.  Concurrent runs on one cache entry take turns
(a lock in the entry's directory); every file is written through a unique temporary name and renamed into place.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zlib
from dataclasses import dataclass, field
from collections.abc import Sequence

import numpy as np

__all__ = ["DIGIT_WORDS", "CorpusConfig", "Corpus", "split_voices", "synthesize_utterance", "load_or_create",
           "default_cache_dir"]

DIGIT_WORDS = ("zero", "oh", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SAMPLE_RATE = 16000


def default_cache_dir() -> str:
    """``$CHAINFB_CACHE/digits`` if set, else ``~/.cache/chainfb/digits``."""
    root = os.environ.get("CHAINFB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "chainfb")
    return os.path.join(root, "digits")


@dataclass
class CorpusConfig:
    """What to synthesize. ``num_train``/``num_test`` utterances of ``min_words``..``max_words`` digit words;
    ``test_voice_fraction`` of the voice variants are held out for test; SNR uniform in ``snr_db`` (dB);
    rate (words/min), pitch and pitch range uniform in the given ranges."""

    num_train: int = 2000
    num_test: int = 300
    min_words: int = 1
    max_words: int = 7
    words: tuple[str, ...] = DIGIT_WORDS
    seed: int = 0
    test_voice_fraction: float = 0.2
    snr_db: tuple[float, float] = (10.0, 35.0)
    rate: tuple[int, int] = (120, 240)
    pitch: tuple[int, int] = (20, 80)
    pitch_range: tuple[int, int] = (20, 90)
    word_gap: tuple[int, int] = (0, 6)
    num_bins: int = 40

    @classmethod
    def from_dict(cls, d: dict) -> CorpusConfig:
        """The configuration ``dataclasses.asdict`` gave ``d`` (lists back to tuples; unknown keys are an
        error)."""
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"corpus configuration: unknown fields {unknown}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def key(self) -> str:
        """Short hash of the configuration (names the cache subdirectory)."""
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:12]


@dataclass
class Corpus:
    """One split: ``feats`` float32 ``[sum T, num_bins]`` with ``offsets[U + 1]``, ``texts`` (list of word lists),
    ``utt_ids`` and ``voices`` (the eSpeak voice of each utterance); ``origin``: where :func:`load_or_create` got
    it (``{"config": CorpusConfig as a dict, "cache_dir": str}``), None for a corpus made otherwise (a subset)."""

    feats: np.ndarray
    offsets: np.ndarray
    texts: list[list[str]]
    utt_ids: list[str]
    voices: list[str]
    origin: dict | None = field(default=None, compare=False)

    def __len__(self) -> int:
        return len(self.utt_ids)

    def features(self, i: int) -> np.ndarray:
        """Features of utterance ``i``: ``[T_i, num_bins]``."""
        return self.feats[self.offsets[i]:self.offsets[i + 1]]

    def num_frames(self) -> np.ndarray:
        """``[U]`` frame counts."""
        return np.diff(self.offsets)

    def subset(self, idx: Sequence[int]) -> Corpus:
        """A new corpus holding the utterances ``idx`` (in that order)."""
        idx = list(idx)
        parts = [self.features(i) for i in idx]
        lens = np.array([len(p) for p in parts], dtype=np.int64)
        feats = np.concatenate(parts) if parts else self.feats[:0]
        return Corpus(feats, np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                      [self.texts[i] for i in idx], [self.utt_ids[i] for i in idx], [self.voices[i] for i in idx])

    def save(self, path) -> None:
        """Write to an ``.npz`` path or binary file object (texts as space-joined strings)."""
        np.savez(path, feats=self.feats, offsets=self.offsets, texts=np.array([" ".join(t) for t in self.texts]),
                 utt_ids=np.array(self.utt_ids), voices=np.array(self.voices))

    @classmethod
    def load(cls, path: str) -> Corpus:
        """Read what :meth:`save` wrote."""
        with np.load(path) as z:
            return cls(z["feats"], z["offsets"].astype(np.int64), [str(t).split() for t in z["texts"]],
                       [str(u) for u in z["utt_ids"]], [str(v) for v in z["voices"]])

    def write_kaldi_text(self, path) -> None:
        """Kaldi ``text`` file (a path or a text file object): ``utt_id word word ...`` per line."""
        if not isinstance(path, (str, os.PathLike)):
            for u, t in zip(self.utt_ids, self.texts):
                path.write(u + " " + " ".join(t) + "\n")
            return
        with open(path, "w") as f:
            self.write_kaldi_text(f)


def _stable_hash(s: str) -> int:
    return zlib.crc32(s.encode())


def split_voices(test_fraction: float = 0.2, seed: int = 0) -> tuple[list[str], list[str]]:
    """All ``accent+variant`` voices split into (train, test) so that no *variant* occurs in both.

    The split depends only on ``seed`` and the shipped voice list.
    """
    from .espeak import english_voices, voice_variants

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction: expected a number in (0, 1), got {test_fraction}")
    variants = voice_variants()
    rng = np.random.default_rng(seed + 7919)
    order = rng.permutation(len(variants))
    n_test = max(1, int(round(test_fraction * len(variants))))
    test_var = sorted(variants[i] for i in order[:n_test])
    train_var = sorted(variants[i] for i in order[n_test:])
    accents = english_voices()
    # the plain accent (no variant) counts as a training voice
    train = accents + [f"{a}+{v}" for a in accents for v in train_var]
    test = [f"{a}+{v}" for a in accents for v in test_var]
    return train, test


def _pink(rng, n: int) -> np.ndarray:
    white = rng.standard_normal(n)
    spec = np.fft.rfft(white)
    f = np.arange(len(spec), dtype=np.float64)
    f[0] = 1.0
    return np.fft.irfft(spec / np.sqrt(f), n)


def synthesize_utterance(words: Sequence[str], voice: str, rng: np.random.Generator, cfg: CorpusConfig):
    """Speak ``words`` with ``voice`` and random prosody, pad, add noise; return (samples float64 [n] at 16 kHz
    in int16 scale, info dict)."""
    from .espeak import EspeakSynth
    from .features import resample

    synth = EspeakSynth()
    rate = int(rng.integers(cfg.rate[0], cfg.rate[1] + 1))
    pitch = int(rng.integers(cfg.pitch[0], cfg.pitch[1] + 1))
    prange = int(rng.integers(cfg.pitch_range[0], cfg.pitch_range[1] + 1))
    gap = int(rng.integers(cfg.word_gap[0], cfg.word_gap[1] + 1))
    pcm = synth.synth(" ".join(words), voice=voice, rate=rate, pitch=pitch, pitch_range=prange, word_gap=gap)
    x = resample(pcm.astype(np.float64), synth.sample_rate, SAMPLE_RATE)
    # random silence padding (eSpeak already adds a little)
    lead = np.zeros(int(rng.uniform(0.05, 0.4) * SAMPLE_RATE))
    trail = np.zeros(int(rng.uniform(0.05, 0.4) * SAMPLE_RATE))
    x = np.concatenate([lead, x, trail])
    gain = rng.uniform(0.3, 1.0)
    x = x * gain
    speech_power = np.mean(x[np.abs(x) > 1e-3] ** 2) if np.any(np.abs(x) > 1e-3) else 1.0
    snr = float(rng.uniform(cfg.snr_db[0], cfg.snr_db[1]))
    kind = "pink" if rng.random() < 0.5 else "white"
    noise = _pink(rng, len(x)) if kind == "pink" else rng.standard_normal(len(x))
    noise *= np.sqrt(speech_power / (np.mean(noise ** 2) * 10.0 ** (snr / 10.0)))
    x = np.clip(x + noise, -32768.0, 32767.0)
    return x, dict(rate=rate, pitch=pitch, range=prange, gap=gap, snr=snr, noise=kind)


def _make_split(name: str, n: int, voices: list[str], cfg: CorpusConfig, progress: bool) -> Corpus:
    from .features import fbank

    feats, texts, ids, used = [], [], [], []
    it = range(n)
    if progress:
        try:
            from tqdm import tqdm

            it = tqdm(it, desc=f"synthesizing {name}", unit="utt")
        except ImportError:
            pass
    for i in it:
        # one generator per utterance: eSpeak NG's output length can vary by a sample between calls, which must
        # not shift the random choices of the following utterances
        rng = np.random.default_rng([cfg.seed, _stable_hash(name), i])
        k = int(rng.integers(cfg.min_words, cfg.max_words + 1))
        words = [cfg.words[j] for j in rng.integers(0, len(cfg.words), size=k)]
        voice = voices[int(rng.integers(0, len(voices)))]
        x, _ = synthesize_utterance(words, voice, rng, cfg)
        feats.append(fbank(x, SAMPLE_RATE, cfg.num_bins))
        texts.append(words)
        ids.append(f"{name}-{voice.replace('+', '_').replace(' ', '_')}-{i:06d}")
        used.append(voice)
    lens = np.array([len(f) for f in feats], dtype=np.int64)
    return Corpus(np.concatenate(feats).astype(np.float32), np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                  texts, ids, used)


def _load_entry(d: str) -> dict[str, Corpus]:
    """The cache entry in ``d``, checked against its ``meta.json``; raises ``ValueError`` naming the bad file."""
    meta_path = os.path.join(d, "meta.json")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{meta_path}: missing or unreadable ({type(e).__name__})") from None
    names = meta.get("files") or {n: None for n in ("train.npz", "test.npz", "train.text", "test.text")}
    for name, size in names.items():
        path = os.path.join(d, name)
        if not os.path.exists(path):
            raise ValueError(f"{path}: missing")
        if size is not None and os.path.getsize(path) != size:
            raise ValueError(f"{path}: {os.path.getsize(path)} bytes, expected {size} (truncated or overwritten)")
        if size is None and name.endswith(".text") and os.path.getsize(path) == 0:
            raise ValueError(f"{path}: empty")
    out = {}
    for s in ("train", "test"):
        path = os.path.join(d, f"{s}.npz")
        try:
            out[s] = Corpus.load(path)
        except Exception as e:  # noqa: BLE001 -- zipfile, numpy and OS errors alike mean a corrupt file
            raise ValueError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    return out


def load_or_create(cfg: CorpusConfig | None = None, cache_dir: str | None = None,
                   progress: bool = True, log=print) -> dict[str, Corpus]:
    """Return ``{"train": Corpus, "test": Corpus}`` for ``cfg``, synthesizing into ``cache_dir/<cfg.key()>`` the
    first time and loading from there afterwards (see the module docstring for the checks and the lock)."""
    from .files import DirLock
    cfg = cfg or CorpusConfig()
    if cfg.num_train < 1 or cfg.num_test < 1:
        raise ValueError("num_train/num_test: expected at least one utterance each")
    if not 1 <= cfg.min_words <= cfg.max_words:
        raise ValueError(f"min_words/max_words: expected 1 <= min <= max, got {cfg.min_words}, {cfg.max_words}")
    cache_dir = cache_dir or default_cache_dir()
    d = os.path.join(cache_dir, cfg.key())
    with DirLock(d, wait=True):
        out = None
        if os.path.exists(os.path.join(d, "meta.json")) or os.path.exists(os.path.join(d, "train.npz")):
            try:
                out = _load_entry(d)
            except ValueError as e:
                log(f"corpus cache entry {d} is incomplete or corrupted ({e}); synthesizing it again")
        if out is None:
            out = _create_entry(d, cfg, progress)
    for c in out.values():
        c.origin = dict(config=dataclasses.asdict(cfg), cache_dir=os.path.abspath(cache_dir))
    return out


def _create_entry(d: str, cfg: CorpusConfig, progress: bool) -> dict[str, Corpus]:
    from .files import atomic_write

    meta_path = os.path.join(d, "meta.json")
    if os.path.exists(meta_path):
        os.unlink(meta_path)  # the entry is invalid until meta.json is written again, last
    train_voices, test_voices = split_voices(cfg.test_voice_fraction, cfg.seed)
    out = {"train": _make_split("train", cfg.num_train, train_voices, cfg, progress),
           "test": _make_split("test", cfg.num_test, test_voices, cfg, progress)}
    files = {}
    for s, c in out.items():
        with atomic_write(os.path.join(d, f"{s}.npz"), "wb", suffix=".npz") as f:
            c.save(f)
        with atomic_write(os.path.join(d, f"{s}.text")) as f:
            c.write_kaldi_text(f)
        for name in (f"{s}.npz", f"{s}.text"):
            files[name] = os.path.getsize(os.path.join(d, name))
    with atomic_write(meta_path) as f:
        json.dump(dict(config=dataclasses.asdict(cfg), train_voices=train_voices, test_voices=test_voices,
                       files=files), f, indent=1)
    return out
