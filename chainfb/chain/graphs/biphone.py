"""Left-biphone context dependency without a decision tree, as Kaldi's
end-to-end chain recipes build it (``steps/nnet3/chain/e2e/prepare_e2e.sh
--type biphone`` with ``gmm-init-biphone``; Hadian et al., Interspeech
2018).

Every phone ``p`` after the left context ``q`` (a phone, or the utterance
start) is its own HMM *unit* with its own pdfs -- the "full biphone tree".
With counts from the training transcripts, units are tied by Kaldi's rule:

* the start context ``(<s>, p)`` always keeps its own unit;
* ``(q, p)`` keeps its own unit when the biphone was seen at least
  ``min_biphone_count`` times (Kaldi's default 100; ``0`` ties nothing);
* otherwise it shares the monophone unit of ``p`` when ``p`` was seen *more
  than* ``min_monophone_count`` times (Kaldi's default 20);
* otherwise it shares one global "zerophone" unit.

Context-independent phones (Kaldi's ``--ci-phones``, e.g. silence with
``ci_silence=true``) have one unit whatever their left context, and as a
left context they count as the utterance start.  By default every phone,
silence included, is context-dependent and is a left context (Kaldi's
default).

Units are numbered in Kaldi's order: context-independent phones first, then
for each phone ``p`` (phone-id order) its start-context unit followed by the
units its left contexts need, a monophone or zerophone unit allocated the
first time it is needed.  With a :class:`~chainfb.chain.graphs.topology.Topology`
unit ``u`` owns pdfs ``shared_pdfs + u * pdfs_per_phone + class`` (the
topology's numbering with units in place of phones).

Counting (:func:`transcript_biphone_counts`): Kaldi counts the phone
sequences of ``text_to_phones.py --edge-silprob 0 --between-silprob 0``:
*no* optional silence, and one pronunciation per word -- the last one listed
(the script keeps the last line of a word in its lexicon dictionary).
``prons="last"`` reproduces that; the default ``prons="all"`` counts every
biphone any pronunciation of the transcript makes (once per word
occurrence), so that no biphone a numerator graph uses is left uncounted.
Silence therefore has zero counts: by default every biphone with silence as
left context is tied to the following phone's monophone, and silence after
a phone to its monophone (or the zerophone unit).

Graphs (:meth:`BiphoneSet.split`): a phone graph's nodes are split by the
last phone read into them (the start node by the utterance start), and every
arc ``u -> v`` reading ``p`` from the copy of ``u`` whose last phone is
``q`` is relabelled with the biphone label ``(q, p)``; the expansion by a
topology then gives it the pdfs of the unit of ``(q, p)``.  A phone-LM
state of order 2 or more already knows its last phone, so splitting adds no
LM state; the HMM states of the expansion multiply only where arcs from
states of different last phones enter one LM state (and merge again where
their units are tied).  Numerator graphs split after optional silences and
alternative pronunciations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from ... import checks
from ..._arrays import Array
from .lexicon import Lexicon, PhoneIds, phone_index
from .phone_graph import EPS, PhoneGraph
from .topology import Topology

__all__ = ["BiphoneSet", "biphone_counts", "transcript_biphone_counts", "START"]

#: The phones: a list of names (index = phone id), or their number.
Phones = Sequence[str] | int

START = -1  # the left context of the first phone of an utterance


def _num_phones(phones) -> tuple[int, list]:
    if isinstance(phones, (int, np.integer)) and not isinstance(phones, bool):
        n = checks.integer(phones, "phones", 1)
        return n, [str(i) for i in range(n)]
    if isinstance(phones, Sequence) and not isinstance(phones, str):
        names = [str(p) for p in phones]
        if not names:
            raise ValueError("phones: expected at least one phone")
        if len(set(names)) != len(names):
            raise ValueError("phones: duplicate phone names")
        return len(names), names
    raise TypeError(f"phones: expected a list of phone names or a number of phones, got {type(phones).__name__}")


def biphone_counts(phone_seqs: Iterable[Sequence[int]], num_phones: int) -> tuple[np.ndarray, np.ndarray]:
    """Kaldi's biphone and phone counts of phone sequences
    (``compute_biphone_stats.py``): every phone is counted once with its left
    context (the previous phone, or the utterance start).

    Parameters
    ----------
    phone_seqs : iterable of int sequences (0-based phone ids < ``num_phones``)
    num_phones : int

    Returns
    -------
    ``(counts [P+1, P], phone_counts [P])`` int64: ``counts[q + 1, p]`` is how
    often ``p`` followed ``q``; row 0 is the utterance start.
    """
    P = checks.integer(num_phones, "num_phones", 1)
    counts = np.zeros((P + 1, P), np.int64)
    for seq in phone_seqs:
        seq = [int(p) for p in seq]
        if any(not 0 <= p < P for p in seq):
            raise ValueError(f"phone_seqs: phone ids must be in [0, {P}), got {seq}")
        for q, p in zip([START] + seq, seq):
            counts[q + 1, p] += 1
    return counts, counts.sum(axis=0)


def transcript_biphone_counts(texts: Iterable[Sequence[str]], lexicon: Lexicon, phone_ids: PhoneIds,
                              prons: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """Biphone and phone counts of word transcripts, without optional silence
    (as Kaldi's ``prepare_e2e.sh`` counts them).

    Parameters
    ----------
    texts : iterable of word lists
    lexicon : :class:`~chainfb.chain.Lexicon`
    phone_ids : list of phones (index = id) or ``{phone: id}``
    prons : ``"all"`` (default) -- each word occurrence counts every biphone
        of every pronunciation once (a biphone two pronunciations share, or
        the boundary pairs of alternative pronunciations of neighbouring
        words, once), and a phone as often as the pronunciation using it most
        contains it; ``"last"`` -- the last pronunciation listed (Kaldi's
        ``text_to_phones.py``); ``"first"`` -- the first.

    Returns
    -------
    ``(counts [P+1, P], phone_counts [P])`` int64 as :func:`biphone_counts`.
    """
    if not isinstance(lexicon, Lexicon):
        raise TypeError(f"lexicon: expected a chainfb.chain.Lexicon, got {type(lexicon).__name__}")
    prons = checks.choice(prons, "prons", ("all", "last", "first"))
    ids = phone_index(phone_ids)
    P = len(ids)
    if sorted(ids.values()) != list(range(P)):
        raise ValueError("phone_ids: ids must be 0 .. num_phones - 1")

    def alternatives(w):
        if w not in lexicon:
            raise ValueError(f"texts: word {w!r} is not in the lexicon (OOV)")
        alts = [ph for ph, _ in lexicon.prons[w]]
        alts = alts if prons == "all" else [alts[-1] if prons == "last" else alts[0]]
        out = []
        for ph in alts:
            missing = [x for x in ph if x not in ids]
            if missing:
                raise ValueError(f"lexicon: phone {missing[0]!r} of word {w!r} is not in phone_ids")
            out.append([ids[x] for x in ph])
        return out

    counts = np.zeros((P + 1, P), np.int64)
    phone_counts = np.zeros(P, np.int64)
    if isinstance(texts, str):
        raise TypeError("texts: expected an iterable of word lists, got a str")
    for words in texts:
        if isinstance(words, str):
            raise TypeError("texts: each transcript must be a list of words, got a str (split it first)")
        lefts = {START}
        for w in words:
            alts = alternatives(w)
            pairs = set()
            for ph in alts:
                pairs.update((q, ph[0]) for q in lefts)
                pairs.update(zip(ph, ph[1:]))
            for q, p in pairs:
                counts[q + 1, p] += 1
            most = Counter()
            for ph in alts:
                for p, c in Counter(ph).items():
                    most[p] = max(most[p], c)
            for p, c in most.items():
                phone_counts[p] += c
            lefts = {ph[-1] for ph in alts}
    return counts, phone_counts


class BiphoneSet:
    """Left-biphone units and their tying (see the module docstring).

    Parameters
    ----------
    phones : list of phone names (index = phone id), or the number of phones ``P``.
    counts : int array ``[P+1, P]`` or None -- biphone counts (row ``q + 1``
        for left context ``q``, row 0 for the utterance start; e.g. from
        :func:`transcript_biphone_counts`).  ``None``: no tying (the full
        biphone set, Kaldi's ``--tie false``).
    phone_counts : int array ``[P]`` or None -- default: the column sums of ``counts``.
    min_biphone_count : int >= 0 -- a biphone seen fewer times shares its
        monophone's unit (Kaldi's default 100).
    min_monophone_count : int >= 0 -- a phone seen at most this often shares
        the zerophone unit instead (Kaldi's default 20).
    context_independent : phone names or ids with a single unit; as left
        contexts they count as the utterance start.

    Attributes
    ----------
    num_phones : int ``P``; ``phones`` : list of names.
    counts : int64 ``[P+1, P]``; ``phone_counts`` : int64 ``[P]``.
    unit : int64 ``[P+1, P]`` -- the unit of ``(q, p)`` at ``unit[q + 1, p]``.
    num_units : int; ``unit_names`` : list of str (``q-p``, ``<s>-p``, ``p``
        for a monophone unit, ``<zero>``).
    num_biphone_units, num_monophone_units : int; ``has_zerophone`` : bool.
    """

    def __init__(self, phones: Phones, counts: Array | None = None, phone_counts: Array | None = None,
                 min_biphone_count: int = 100, min_monophone_count: int = 20,
                 context_independent: Sequence[str | int] = ()):
        P, names = _num_phones(phones)
        self.num_phones, self.phones = P, names
        self.min_biphone_count = checks.integer(min_biphone_count, "min_biphone_count", 0)
        self.min_monophone_count = checks.integer(min_monophone_count, "min_monophone_count", 0)
        tie = counts is not None
        if tie:
            counts = checks.int_array(counts, "counts", 2)
            if counts.shape != (P + 1, P):
                raise ValueError(f"counts: expected shape [{P + 1}, {P}] (row 0: the utterance start), "
                                 f"got {list(counts.shape)}")
            if (counts < 0).any():
                raise ValueError("counts: expected counts >= 0")
        else:
            counts = np.zeros((P + 1, P), np.int64)
        if phone_counts is None:
            phone_counts = counts.sum(axis=0)
        else:
            phone_counts = checks.int_array(phone_counts, "phone_counts", 1)
            if phone_counts.shape != (P,) or (phone_counts < 0).any():
                raise ValueError(f"phone_counts: expected {P} counts >= 0, got shape {list(phone_counts.shape)}")
        self.counts = np.asarray(counts, np.int64)
        self.phone_counts = np.asarray(phone_counts, np.int64)
        index = {n: i for i, n in enumerate(names)}
        ci = set()
        if isinstance(context_independent, str):
            raise TypeError("context_independent: expected a list of phones, got a str")
        for x in context_independent:
            if isinstance(x, str):
                if x not in index:
                    raise ValueError(f"context_independent: phone {x!r} is not in phones")
                ci.add(index[x])
            else:
                ci.add(checks.integer(x, "context_independent", 0, P - 1))
        self.context_independent = sorted(ci)
        unit = np.full((P + 1, P), -1, np.int64)
        unit_names: list = []
        kinds = Counter()

        def new(name, kind):
            unit_names.append(name)
            kinds[kind] += 1
            return len(unit_names) - 1

        for p in self.context_independent:
            unit[:, p] = new(names[p], "ci")
        zero = -1
        for p in range(P):
            if p in ci:
                continue
            start = new(f"<s>-{names[p]}", "biphone")
            unit[0, p] = start
            mono = -1
            for q in range(P):
                if q in ci:
                    unit[q + 1, p] = start
                elif not tie or self.counts[q + 1, p] >= self.min_biphone_count:
                    unit[q + 1, p] = new(f"{names[q]}-{names[p]}", "biphone")
                elif self.phone_counts[p] > self.min_monophone_count:
                    if mono < 0:
                        mono = new(names[p], "mono")
                    unit[q + 1, p] = mono
                else:
                    if zero < 0:
                        zero = new("<zero>", "zero")
                    unit[q + 1, p] = zero
        self.unit = unit
        self.unit_names = unit_names
        self.num_units = len(unit_names)
        self.num_biphone_units = kinds["biphone"]
        self.num_monophone_units = kinds["mono"] + kinds["ci"]
        self.has_zerophone = zero >= 0
        # per biphone label (q + 1) * P + p: its unit and its phone
        self.unit_of_label = unit.reshape(-1).copy()
        self.phone_of_label = np.tile(np.arange(P, dtype=np.int64), P + 1)
        self._ci_mask = np.zeros(P, bool)
        self._ci_mask[self.context_independent] = True

    # ------------------------------------------------------------ construction
    @classmethod
    def from_transcripts(cls, texts: Iterable[Sequence[str]], lexicon: Lexicon, phones: Sequence[str],
                         min_biphone_count: int = 100, min_monophone_count: int = 20, prons: str = "all",
                         context_independent: Sequence[str | int] = ()) -> BiphoneSet:
        """The tied set of the biphones of ``texts`` (counted by
        :func:`transcript_biphone_counts` with ``prons``)."""
        counts, phone_counts = transcript_biphone_counts(texts, lexicon, phones, prons)
        return cls(phones, counts, phone_counts, min_biphone_count, min_monophone_count, context_independent)

    @classmethod
    def from_phone_sequences(cls, phone_seqs: Iterable[Sequence[int]], phones: Phones,
                             min_biphone_count: int = 100, min_monophone_count: int = 20,
                             context_independent: Sequence[str | int] = ()) -> BiphoneSet:
        """The tied set of the biphones of ``phone_seqs`` (phone-id sequences,
        counted as given by :func:`biphone_counts`)."""
        P, _ = _num_phones(phones)
        counts, phone_counts = biphone_counts(phone_seqs, P)
        return cls(phones, counts, phone_counts, min_biphone_count, min_monophone_count, context_independent)

    # ------------------------------------------------------------ numbering
    def label(self, left: int, phone: int) -> int:
        """The biphone label of ``phone`` after ``left`` (``START`` = -1 for the utterance start)."""
        return (int(left) + 1) * self.num_phones + int(phone)

    def unit_of(self, left: int, phone: int) -> int:
        """The (tied) unit of ``phone`` after ``left`` (``START`` = -1 for the utterance start)."""
        return int(self.unit[int(left) + 1, int(phone)])

    def num_pdfs(self, topology: Topology) -> int:
        """Network output dimension under ``topology``: ``shared_pdfs + num_units * pdfs_per_phone``."""
        return topology.num_pdfs(self.num_units)

    def pdf_map(self, topology: Topology) -> np.ndarray:
        """int64 ``[P+1, P, pdfs_per_phone]``: the pdf of class ``c`` of
        ``phone`` after ``left`` at ``[left + 1, phone, c]``."""
        c = np.arange(topology.pdfs_per_phone, dtype=np.int64)
        return topology.shared_pdfs + self.unit[:, :, None] * topology.pdfs_per_phone + c

    def __repr__(self) -> str:
        return (f"BiphoneSet(num_phones={self.num_phones}, num_units={self.num_units}: "
                f"{self.num_biphone_units} biphone, {self.num_monophone_units} monophone"
                f"{', zerophone' if self.has_zerophone else ''}; min_biphone_count={self.min_biphone_count})")

    # ------------------------------------------------------------ graphs
    def split(self, pg: PhoneGraph) -> PhoneGraph:
        """``pg`` (epsilon-free, phone ids as labels) with its nodes split by
        their last phone and its arcs labelled with biphone labels
        (:meth:`label`); weights, word labels and finals are kept.  Only
        copies reachable from the start are built; the result is trimmed."""
        if not isinstance(pg, PhoneGraph):
            raise TypeError(f"pg: expected a PhoneGraph, got {type(pg).__name__}")
        P = self.num_phones
        out_arcs: dict = {}
        for a in pg.arcs:
            if a[2] == EPS:
                raise ValueError("split: the phone graph still has epsilon arcs; call remove_epsilons() first")
            if not 0 <= a[2] < P:
                raise ValueError(f"split: phone id {a[2]} outside [0, {P})")
            out_arcs.setdefault(a[0], []).append(a)
        ids = {(pg.start, START): 0}
        order = [(pg.start, START)]
        out = PhoneGraph(0, 0)
        i = 0
        while i < len(order):
            u, q = order[i]
            for (_, v, p, lp, w) in out_arcs.get(u, ()):
                key = (v, START if self._ci_mask[p] else p)
                j = ids.get(key)
                if j is None:
                    j = ids[key] = len(order)
                    order.append(key)
                out.arcs.append((i, j, self.label(q, p), lp, w))
            i += 1
        out.num_nodes = len(order)
        out.final = {ids[k]: pg.final[k[0]] for k in order if k[0] in pg.final}
        return out.trim()
