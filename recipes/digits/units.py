"""Character output units for the CTC and transducer recognizers.

Units: ``<blk>`` (index 0, the blank), the letters of the vocabulary in
sorted order, and ``|`` between words.  A transcript ``["two", "oh"]`` is
``t w o | o h``; decoding splits the unit sequence at ``|`` and keeps the
pieces that are words of the vocabulary (a greedy decoder may spell a
non-word, which counts as an error against the reference).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CharUnits", "BLANK", "WORD_SEP"]

BLANK = "<blk>"
WORD_SEP = "|"


class CharUnits:
    """The unit inventory of a vocabulary ``words`` (see the module docstring)."""

    def __init__(self, words: Sequence[str]):
        self.words = list(words)
        letters = sorted({c for w in self.words for c in w})
        if WORD_SEP in letters:
            raise ValueError(f"words: {WORD_SEP!r} is reserved for the word boundary")
        self.units = [BLANK, *letters, WORD_SEP]
        self.index = {u: i for i, u in enumerate(self.units)}
        self.blank = 0
        self.sep = self.index[WORD_SEP]

    def __len__(self) -> int:
        return len(self.units)

    def encode(self, words: Sequence[str]) -> list[int]:
        """Unit ids of a transcript (``|`` between words, not at the ends)."""
        out: list[int] = []
        for k, w in enumerate(words):
            if k:
                out.append(self.sep)
            try:
                out.extend(self.index[c] for c in w)
            except KeyError:
                raise ValueError(f"words: {w!r} has a character outside the units") from None
        return out

    def allowed_next(self, prefix: Sequence[int]):
        """Boolean mask ``[len(units)]`` of the units that may follow the
        letters ``prefix`` of the current word so that it stays a prefix of a
        vocabulary word: its possible next letters, ``|`` once it is a whole
        word (and not at the start of a word), and the blank always."""
        key = tuple(int(i) for i in prefix)
        cache = self.__dict__.setdefault("_allowed", {})
        mask = cache.get(key)
        if mask is None:
            import torch

            word = "".join(self.units[i] for i in key)
            mask = torch.zeros(len(self.units), dtype=torch.bool)
            mask[self.blank] = True
            for w in self.words:
                if w.startswith(word) and len(w) > len(word):
                    mask[self.index[w[len(word)]]] = True
            if word in self.words:
                mask[self.sep] = True
            cache[key] = mask
        return mask

    def decode(self, ids: Sequence[int]) -> list[str]:
        """Words of a unit sequence (blanks ignored, split at ``|``)."""
        words, cur = [], []
        for i in ids:
            i = int(i)
            if i == self.sep:
                if cur:
                    words.append("".join(cur))
                cur = []
            elif i != self.blank:
                cur.append(self.units[i])
        if cur:
            words.append("".join(cur))
        return words
