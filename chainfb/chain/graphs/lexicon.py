"""Reading the text inputs of a Kaldi recipe: ``lexicon.txt`` /
``lexiconp.txt``, ``text`` and ``phones.txt``.

* lexicon: one pronunciation per line, ``word phone1 phone2 ...``; in the
  ``lexiconp.txt`` form a probability follows the word
  (``word 0.5 phone1 ...``).  A word may have several lines (alternative
  pronunciations).  Without probabilities every pronunciation has
  probability 1 (Kaldi's convention: probabilities are relative to the most
  likely pronunciation, which has 1).
* text: ``utt_id word1 word2 ...``.
* phones: Kaldi's ``phones.txt`` (``phone id``), or one phone per line.
  ``<eps>`` and disambiguation symbols (``#0``, ``#1`` ...) are dropped, so
  the returned list is the 0-based phone inventory pdfs are numbered from.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Iterable

from ... import checks

__all__ = ["Lexicon", "read_lexicon", "read_text", "read_phones"]


def _lines(path_or_lines, name: str) -> list[tuple[int, str]]:
    if isinstance(path_or_lines, (str, os.PathLike)):
        with open(path_or_lines, "r", encoding="utf-8") as f:
            raw = f.read().splitlines()
    elif isinstance(path_or_lines, Iterable):
        raw = list(path_or_lines)
        for i, ln in enumerate(raw):
            if not isinstance(ln, str):
                raise TypeError(f"{name}: line {i + 1} is {type(ln).__name__}, expected str")
    else:
        raise TypeError(f"{name}: expected a path or an iterable of lines, got {type(path_or_lines).__name__}")
    return [(i + 1, ln) for i, ln in enumerate(raw) if ln.strip()]


def _is_prob(tok: str) -> bool:
    try:
        v = float(tok)
    except ValueError:
        return False
    return math.isfinite(v) and 0.0 < v <= 1.0 and not tok.isalpha()


@dataclass
class Lexicon:
    """Pronunciations of words.

    Attributes
    ----------
    prons : dict ``word -> list of (phones tuple, probability)``
        In file order.  ``probability`` is in ``(0, 1]``.
    """

    prons: dict = field(default_factory=dict)

    def __contains__(self, word: str) -> bool:
        return word in self.prons

    def __len__(self) -> int:
        return len(self.prons)

    def lookup(self, word: str) -> list[tuple[tuple[str, ...], float]]:
        """The pronunciations of ``word``; ``KeyError`` naming it if absent."""
        try:
            return self.prons[word]
        except KeyError:
            raise KeyError(f"word {word!r} is not in the lexicon (OOV)") from None

    @property
    def phones(self) -> list[str]:
        """Distinct phones used, sorted."""
        return sorted({p for ps in self.prons.values() for pron, _ in ps for p in pron})


def read_lexicon(path_or_lines, with_probs: bool | None = None) -> Lexicon:
    """Read a Kaldi ``lexicon.txt`` or ``lexiconp.txt``.

    Parameters
    ----------
    path_or_lines : path or iterable of str
    with_probs : bool or None
        ``None`` detects the format: the second field of every line is a
        number in ``(0, 1]`` means ``lexiconp.txt``.

    Returns
    -------
    Lexicon
    """
    rows = [(n, ln.split()) for n, ln in _lines(path_or_lines, "path_or_lines")]
    if with_probs is not None:
        with_probs = checks.flag(with_probs, "with_probs")
    if with_probs is None:
        with_probs = bool(rows) and all(len(f) >= 3 and _is_prob(f[1]) for _, f in rows)
    lex = Lexicon()
    for n, f in rows:
        word = f[0]
        if with_probs:
            if len(f) < 3:
                raise ValueError(f"lexicon line {n}: expected 'word prob phone...', got {' '.join(f)!r}")
            try:
                prob = float(f[1])
            except ValueError:
                raise ValueError(f"lexicon line {n}: probability {f[1]!r} is not a number") from None
            if not (0.0 < prob <= 1.0):
                raise ValueError(f"lexicon line {n}: probability {prob} is outside (0, 1]")
            phones = tuple(f[2:])
        else:
            if len(f) < 2:
                raise ValueError(f"lexicon line {n}: word {word!r} has no phones")
            prob, phones = 1.0, tuple(f[1:])
        lex.prons.setdefault(word, []).append((phones, prob))
    return lex


def read_text(path_or_lines) -> list[tuple[str, list[str]]]:
    """Read a Kaldi ``text`` file: ``[(utt_id, [words])]`` in file order."""
    out = []
    for _, ln in _lines(path_or_lines, "path_or_lines"):
        f = ln.split()
        out.append((f[0], f[1:]))
    return out


def read_phones(path_or_lines) -> list[str]:
    """Read a phone inventory: ``phones.txt`` (``phone id`` lines, ordered by
    id) or one phone per line.  ``<eps>`` and ``#N`` disambiguation symbols
    are dropped.  Returns the phones in order (index = phone id used for pdf
    numbering, 0-based)."""
    rows = [ln.split() for _, ln in _lines(path_or_lines, "path_or_lines")]
    if rows and all(len(r) == 2 and r[1].lstrip("-").isdigit() for r in rows):
        rows = sorted(rows, key=lambda r: int(r[1]))
    elif any(len(r) != 1 for r in rows):
        raise ValueError("phones: expected 'phone id' lines or one phone per line")
    phones = [r[0] for r in rows if r[0] != "<eps>" and not (r[0].startswith("#") and r[0][1:].isdigit())]
    if len(set(phones)) != len(phones):
        raise ValueError("phones: duplicate phone names")
    return phones
