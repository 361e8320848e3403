"""Reading the text inputs of a Kaldi recipe: ``lexicon.txt`` /
``lexiconp.txt`` / ``lexiconp_silprob.txt``, ``text`` and ``phones.txt``.

* lexicon: one pronunciation per line, ``word phone1 phone2 ...``; in the
  ``lexiconp.txt`` form a probability follows the word
  (``word 0.5 phone1 ...``); in the ``lexiconp_silprob.txt`` form (Kaldi's
  ``utils/dict_dir_add_pronprobs.sh``) the probability is followed by three
  silence numbers, ``word prob P(sil after) F(sil before) F(no sil before)
  phone1 ...``, kept in :attr:`Lexicon.sil_probs`.  A word may have several
  lines (alternative pronunciations).  Without probabilities every
  pronunciation has probability 1 (Kaldi's convention: probabilities are
  relative to the most likely pronunciation, which has 1).
* text: ``utt_id word1 word2 ...``.
* phones: Kaldi's ``phones.txt`` (``phone id``, ``<eps>`` at id 0), or one
  phone per line.  ``<eps>`` and disambiguation symbols (``#0``, ``#1`` ...)
  are dropped, so the returned list is the 0-based phone inventory pdfs are
  numbered from.  Kaldi's word-position-dependent phones (``AA_B``,
  ``AA_E``, ``AA_I``, ``AA_S``, from ``prepare_lang.sh``'s default
  ``--position-dependent-phones true``) are read by an explicit choice:
  mapped to their base phone, or kept (the lexicon then takes them too,
  :meth:`Lexicon.with_word_positions`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from collections.abc import Iterable, Mapping, Sequence

from ... import checks

__all__ = ["Lexicon", "read_lexicon", "read_text", "read_phones", "phone_index"]

#: The phones by id: a list of names (index = id) or a ``{phone: id}`` mapping.
PhoneIds = Sequence[str] | Mapping[str, int]
#: A text file to read: its path, or its lines.
PathOrLines = str | os.PathLike | Iterable[str]


def phone_index(phone_ids: PhoneIds) -> dict[str, int]:
    """``{phone name: 0-based id}`` from a list of phones or a mapping."""
    if isinstance(phone_ids, Mapping):
        return {str(k): int(v) for k, v in phone_ids.items()}
    if isinstance(phone_ids, Sequence) and not isinstance(phone_ids, str):
        return {str(p): i for i, p in enumerate(phone_ids)}
    raise TypeError(f"phone_ids: expected a list of phones or a {{phone: id}} mapping, got {type(phone_ids).__name__}")


def _source(path_or_lines) -> str:
    """How errors name the input: the file, or the argument."""
    return os.fspath(path_or_lines) if isinstance(path_or_lines, (str, os.PathLike)) else "path_or_lines"


def _lines(path_or_lines, name: str) -> list[tuple[int, str]]:
    if isinstance(path_or_lines, (str, os.PathLike)):
        with open(path_or_lines, encoding="utf-8") as f:
            raw = f.read().splitlines()
    elif isinstance(path_or_lines, Iterable):
        raw = list(path_or_lines)
        for i, ln in enumerate(raw):
            if not isinstance(ln, str):
                raise TypeError(f"{name}: line {i + 1} is {type(ln).__name__}, expected str")
    else:
        raise TypeError(f"{name}: expected a path or an iterable of lines, got {type(path_or_lines).__name__}")
    return [(i + 1, ln) for i, ln in enumerate(raw) if ln.strip()]


def _number(tok: str) -> float | None:
    """``tok`` as a finite float, or None (a phone name such as ``inf`` or ``NaN`` is not a number here)."""
    try:
        v = float(tok)
    except ValueError:
        return None
    return v if math.isfinite(v) and not tok.isalpha() else None


def _is_prob(tok: str) -> bool:
    v = _number(tok)
    return v is not None and 0.0 < v <= 1.0


def _is_silprob_row(f: list[str]) -> bool:
    """``word prob p f f phone...``: a probability, then three non-negative numbers."""
    numbers = [_number(t) for t in f[2:5]]
    return len(f) >= 6 and _is_prob(f[1]) and all(v is not None and v >= 0.0 for v in numbers)


@dataclass
class Lexicon:
    """Pronunciations of words.

    Attributes
    ----------
    prons : dict ``word -> list of (phones tuple, probability)``
        In file order.  ``probability`` is in ``(0, 1]``.
    sil_probs : dict ``word -> list of (p_sil_after, f_sil_before, f_nonsil_before)``
        Read from ``lexiconp_silprob.txt``, one triple per pronunciation
        (parallel to ``prons``): the probability of silence after the word
        and Kaldi's correction factors for silence / no silence before it.
        Empty for the other forms.  The graph builders use one
        ``sil_prob`` for every word; these are kept for the user.
    """

    prons: dict = field(default_factory=dict)
    sil_probs: dict = field(default_factory=dict)

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

    def with_word_positions(self) -> Lexicon:
        """The lexicon in Kaldi's word-position-dependent phones, as
        ``prepare_lang.sh`` makes them: a one-phone word ``p_S``; otherwise
        ``p_B`` first, ``p_E`` last and ``p_I`` between.  For a phone list
        read with ``read_phones(..., word_positions="keep")``."""
        out = Lexicon(sil_probs={w: list(v) for w, v in self.sil_probs.items()})
        for word, prons in self.prons.items():
            out.prons[word] = [(_positioned(pron), prob) for pron, prob in prons]
        return out


_POSITIONS = ("_B", "_E", "_I", "_S")


def _positioned(pron: tuple[str, ...]) -> tuple[str, ...]:
    if len(pron) == 1:
        return (pron[0] + "_S",)
    return (pron[0] + "_B", *(p + "_I" for p in pron[1:-1]), pron[-1] + "_E")


def read_lexicon(path_or_lines: PathOrLines, with_probs: bool | None = None, sil_probs: bool | None = None) -> Lexicon:
    """Read a Kaldi ``lexicon.txt``, ``lexiconp.txt`` or ``lexiconp_silprob.txt``.

    Parameters
    ----------
    path_or_lines : path or iterable of str
    with_probs : bool or None
        Whether a pronunciation probability follows the word.  ``None``
        detects it: the second field of every line is a number in
        ``(0, 1]``.
    sil_probs : bool or None
        Whether three silence numbers follow the probability
        (``lexiconp_silprob.txt``; needs ``with_probs``).  ``None`` detects
        it: every line has a probability, then three non-negative numbers,
        then at least one phone.

    Returns
    -------
    Lexicon
        A malformed line is a ``ValueError`` naming the file (or
        ``path_or_lines``) and the line.
    """
    src = _source(path_or_lines)
    rows = [(n, ln.split()) for n, ln in _lines(path_or_lines, "path_or_lines")]
    if with_probs is not None:
        with_probs = checks.flag(with_probs, "with_probs")
    if sil_probs is not None:
        sil_probs = checks.flag(sil_probs, "sil_probs")
    if sil_probs is None:
        sil_probs = with_probs is not False and bool(rows) and all(_is_silprob_row(f) for _, f in rows)
    elif sil_probs and with_probs is False:
        raise ValueError("sil_probs: lexiconp_silprob.txt lines have a pronunciation probability; "
                         "with_probs=False contradicts sil_probs=True")
    if with_probs is None:
        with_probs = sil_probs or (bool(rows) and all(len(f) >= 3 and _is_prob(f[1]) for _, f in rows))
    first_phone = 5 if sil_probs else 2 if with_probs else 1
    form = "word prob p_sil f_sil f_nonsil phone..." if sil_probs else "word prob phone..." if with_probs \
        else "word phone..."
    lex = Lexicon()
    for n, f in rows:
        word = f[0]
        where = f"{src}: line {n}"
        if len(f) <= first_phone:
            if not with_probs:
                raise ValueError(f"{where}: word {word!r} has no phones")
            raise ValueError(f"{where}: expected {form!r}, got {' '.join(f)!r}")
        prob = 1.0
        if with_probs:
            prob = _number(f[1])
            if prob is None:
                raise ValueError(f"{where}: probability {f[1]!r} is not a number")
            if not (0.0 < prob <= 1.0):
                raise ValueError(f"{where}: probability {prob} is outside (0, 1]")
        if sil_probs:
            sil = tuple(_number(t) for t in f[2:5])
            if any(v is None or v < 0.0 for v in sil) or sil[0] > 1.0:
                raise ValueError(f"{where}: silence probabilities {' '.join(f[2:5])!r}: expected P(sil after) in "
                                 f"[0, 1] and two non-negative correction factors")
            lex.sil_probs.setdefault(word, []).append(sil)
        lex.prons.setdefault(word, []).append((tuple(f[first_phone:]), prob))
    return lex


def read_text(path_or_lines: PathOrLines) -> list[tuple[str, list[str]]]:
    """Read a Kaldi ``text`` file: ``[(utt_id, [words])]`` in file order."""
    out = []
    for _, ln in _lines(path_or_lines, "path_or_lines"):
        f = ln.split()
        out.append((f[0], f[1:]))
    return out


def _is_disambig(sym: str) -> bool:
    return sym.startswith("#") and sym[1:].lstrip("-").isdigit()


def _position_bases(phones: list[str]) -> set[str]:
    """The base phones that appear in all four word positions (``p_B``, ``p_E``, ``p_I``, ``p_S``)."""
    names = set(phones)
    return {p[:-2] for p in phones if p.endswith(_POSITIONS) and all(p[:-2] + x in names for x in _POSITIONS)}


def read_phones(path_or_lines: PathOrLines, word_positions: str | None = None) -> list[str]:
    """Read a phone inventory: ``phones.txt`` (``phone id`` lines, ordered by
    id; ``<eps>``, if present, has id 0) or one phone per line.  ``<eps>``
    and ``#N`` disambiguation symbols are dropped.  Returns the phones in
    order (index = phone id used for pdf numbering, 0-based).

    word_positions : None, ``"strip"`` or ``"keep"``
        What to do with Kaldi's word-position-dependent phones (a base phone
        ``p`` listed as ``p_B``, ``p_E``, ``p_I`` and ``p_S``, as
        ``prepare_lang.sh`` writes ``data/lang/phones.txt``).  ``"strip"``:
        each maps to its base phone, listed once where its first form is
        (a lexicon in base phones, ``data/local/dict/lexicon.txt``, fits).
        ``"keep"``: every form is its own phone (use
        :meth:`Lexicon.with_word_positions` on the lexicon).  ``None``
        (default): an inventory with them is a ``ValueError`` asking for
        the choice; one without them is read as it is, and so it is with
        either choice.
    """
    if word_positions not in (None, "strip", "keep"):
        raise ValueError(f"word_positions: expected None, 'strip' or 'keep', got {word_positions!r}")
    src = _source(path_or_lines)
    rows = [ln.split() for _, ln in _lines(path_or_lines, "path_or_lines")]
    if rows and all(len(r) == 2 and r[1].lstrip("-").isdigit() for r in rows):
        ids = [int(r[1]) for r in rows]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"{src}: phone id {dup} is given to several symbols")
        eps = [int(r[1]) for r in rows if r[0] == "<eps>"]
        if eps and eps[0] != 0:
            raise ValueError(f"{src}: <eps> has id {eps[0]}; Kaldi's phones.txt gives it id 0")
        rows = sorted(rows, key=lambda r: int(r[1]))
    elif any(len(r) != 1 for r in rows):
        raise ValueError(f"{src}: expected 'phone id' lines or one phone per line")
    phones = [r[0] for r in rows if r[0] != "<eps>" and not _is_disambig(r[0])]
    if len(set(phones)) != len(phones):
        raise ValueError(f"{src}: duplicate phone names")
    bases = _position_bases(phones)
    if bases and word_positions is None:
        example = sorted(bases)[0]
        raise ValueError(
            f"{src}: word-position-dependent phones ({', '.join(example + x for x in _POSITIONS)}, ...): pass "
            f"word_positions='strip' to map them to their base phones or word_positions='keep' to keep them "
            f"(then use Lexicon.with_word_positions())")
    if word_positions == "strip":
        base = [p[:-2] if p.endswith(_POSITIONS) and p[:-2] in bases else p for p in phones]
        phones = list(dict.fromkeys(base))
    return phones
