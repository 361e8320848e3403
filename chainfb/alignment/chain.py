"""Chain (pdf-graph) forced alignment: the Viterbi pdf sequence of each
utterance through its numerator graph (Kaldi's alignment format: one pdf per
frame), and the phone and word segments it implies.

Numerator graphs (:func:`chainfb.chain.numerator_graph`) are pdf acceptors:
after minimisation their arcs keep no phone or word labels.  So phones are
read back from the pdfs through the topology's numbering
(:class:`chainfb.chain.Topology`: pdf ``shared_pdfs + unit *
pdfs_per_phone + class``, a unit being a phone, or with left biphones a
:class:`chainfb.chain.BiphoneSet` unit; shared pdfs such as the CTC blank
belong to no phone), and words from the phone sequence and the
transcript's pronunciations (:func:`word_segments`).

What can be told apart: a new phone starts where the unit changes, and,
when the topology has pdf classes that only ever *enter* a unit (the
chain topology's class 0, one frame per phone), also at every such frame,
so a phone repeated back to back is two segments.  With topologies whose
entry pdf is also a self-loop (``hmm3``, ``ctc``) two back-to-back copies
of one unit are one segment.  With left biphones a unit is one phone (in
one or more left contexts), except a unit that tied biphones of several
phones share (the zerophone unit of rare phones): its segments name the
unit and list the phones it may be (:attr:`Segment.shared_by`), and
:func:`word_segments` resolves them from the transcript.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .. import checks
from .._arrays import Array, Ints
from ..api import Graphs, PdfCriterion
from ..cuda.interop import on_torch_stream
from .paths import best_arcs

if TYPE_CHECKING:
    from ..chain import BiphoneSet, Lexicon, Topology

__all__ = ["PdfAlignment", "Segment", "align_pdfs", "phone_segments", "word_segments"]


@dataclass
class PdfAlignment:
    """The best path of one utterance through its graph.

    Attributes
    ----------
    pdfs : int64 NumPy ``[T_b]`` -- the pdf of every frame (Kaldi's alignment).
    arcs : int64 NumPy ``[T_b]`` -- the arcs taken, indices into the
        utterance's own :class:`~chainfb.Fst`.
    score : float -- arc log-probs + pdf scores + final log-prob of the path;
        ``-inf`` (and empty arrays) when no path of ``T_b`` frames exists.
    """

    pdfs: np.ndarray
    arcs: np.ndarray
    score: float


@dataclass
class Segment:
    """A labelled span of frames ``[start, end)`` (``end`` exclusive).

    ``shared_by``: for a phone segment whose pdfs several phones share (a
    tied left-biphone unit, :func:`phone_segments` with ``context``), the
    phones it may be, and ``label`` is then the unit's name (``"<zero>"``);
    empty otherwise."""

    label: object
    start: int
    end: int
    shared_by: tuple = ()

    def __len__(self) -> int:
        return self.end - self.start


@on_torch_stream
def align_pdfs(fsts: Graphs, scores: Array, lengths: Ints | None = None) -> list[PdfAlignment]:
    """The Viterbi pdf alignment of each sequence through its graph.

    Parameters
    ----------
    fsts : Fst (shared), list of N Fst (e.g. numerator graphs), or FstBatch.
    scores : ``[N, T, P]`` NumPy/CuPy array or torch tensor (CPU or CUDA) of
        pdf log-likelihoods (the network output).
    lengths : ``[N]`` frame counts in ``[0, T]``, optional (default ``T``).

    Returns
    -------
    list of N :class:`PdfAlignment` (an utterance without a path of exactly
    ``lengths[n]`` frames gets ``score = -inf`` and empty arrays; no error).
    """
    from .._arrays import as_array

    arr, _ = as_array(scores, "scores")
    crit = PdfCriterion(fsts, arr.shape, lengths)
    return [PdfAlignment(p.pdf, p.arc, p.score)
            for p in best_arcs(crit.lattice, crit.gather(scores), crit.lengths)]


def _entry_only_classes(topology) -> set:
    from ..chain.graphs.topology import ENTER

    enter = {a[2] for a in topology.arcs if a[0] == ENTER and a[2][0] == "class"}
    inner = {a[2] for a in topology.arcs if a[0] != ENTER}
    return {p[1] for p in enter - inner}


def _unit_phones(context, phones):
    """Per unit of the :class:`~chainfb.chain.BiphoneSet` ``context``: ``(label, shared_by)`` -- the phone's
    label (name, or id without ``phones``) and ``()`` for a unit of one phone; the unit's name and the labels of
    its phones for a unit several phones share."""
    from ..chain import BiphoneSet

    if not isinstance(context, BiphoneSet):
        raise TypeError(f"context: expected a chainfb.chain.BiphoneSet or None, got {type(context).__name__}")
    if phones is not None and len(phones) != context.num_phones:
        raise ValueError(f"context: a BiphoneSet of {context.num_phones} phones, but phones lists {len(phones)}")
    out = []
    for u in range(context.num_units):
        ids = np.flatnonzero((context.unit == u).any(axis=0)).tolist()
        labels = tuple(phones[i] if phones is not None else i for i in ids)
        out.append((labels[0], ()) if len(labels) == 1 else (context.unit_names[u], labels))
    return out


def phone_segments(pdfs: Ints, topology: Topology, phones: Sequence[str] | None = None,
                   context: BiphoneSet | None = None) -> list[Segment]:
    """Phone segments of a pdf alignment (see the module docstring).

    Parameters
    ----------
    pdfs : ``[T]`` ints, e.g. :attr:`PdfAlignment.pdfs`.
    topology : the :class:`chainfb.chain.Topology` the graph was built with.
    phones : phone names by id (the ``phone_ids`` list given to the graph
        compiler), optional.
    context : the :class:`chainfb.chain.BiphoneSet` the graph was built
        with (left-biphone pdfs), or None (a unit per phone).

    Returns
    -------
    list of :class:`Segment` in time order, ``label`` the phone name (or its
    id without ``phones``); frames of shared pdfs are in no segment.  With
    ``context``, a segment of a unit several phones share has the unit's name
    as ``label`` and those phones in ``shared_by``.
    """
    from ..chain import Topology

    if not isinstance(topology, Topology):
        raise TypeError(f"topology: expected a chainfb.chain.Topology, got {type(topology).__name__}")
    p = checks.int_array(pdfs, "pdfs", 1)
    if p.size and p.min() < 0:
        raise ValueError(f"pdfs: pdf ids must be >= 0, got {p.min()}")
    k = p - topology.shared_pdfs
    unit = np.where(k >= 0, k // topology.pdfs_per_phone, -1)
    cls = np.where(k >= 0, k % topology.pdfs_per_phone, -1)
    units = _unit_phones(context, phones) if context is not None else None
    if units is not None and unit.size and unit.max() >= len(units):
        raise ValueError(f"pdfs: pdf {p[unit.argmax()]} is unit {unit.max()} but context has {len(units)} units")
    if units is None and phones is not None and unit.size and unit.max() >= len(phones):
        raise ValueError(f"pdfs: pdf {p[unit.argmax()]} is phone {unit.max()} but phones lists {len(phones)}")
    entry = np.isin(cls, sorted(_entry_only_classes(topology)))
    T = len(p)
    start = (unit >= 0) & (np.r_[True, unit[1:] != unit[:-1]] | entry)
    out = []
    for s in np.flatnonzero(start).tolist():
        e = s + 1
        while e < T and unit[e] == unit[s] and not start[e]:
            e += 1
        if units is not None:
            out.append(Segment(units[unit[s]][0], s, e, units[unit[s]][1]))
        else:
            out.append(Segment(phones[unit[s]] if phones is not None else int(unit[s]), s, e))
    return out


def _prons(lexicon, word):
    """``[(phones tuple, log-prob)]`` of ``word``, in the lexicon's order (a mapping's pronunciations: log-prob
    0)."""
    if isinstance(lexicon, Mapping):
        if word not in lexicon:
            raise ValueError(f"words: word {word!r} is not in the lexicon")
        return [(tuple(p), 0.0) for p in lexicon[word]]
    prons = getattr(lexicon, "prons", None)
    if prons is None:
        raise TypeError(f"lexicon: expected a chainfb.chain.Lexicon or a {{word: [phones, ...]}} mapping, "
                        f"got {type(lexicon).__name__}")
    if word not in prons:
        raise ValueError(f"words: word {word!r} is not in the lexicon")
    return [(tuple(ph), math.log(prob)) for ph, prob in prons[word]]


def _is(seg: Segment, phone) -> bool:
    """Whether the phone segment ``seg`` may be ``phone``."""
    return seg.label == phone or phone in getattr(seg, "shared_by", ())


#: scores this close count as equal when :func:`word_segments` breaks ties
_TIE = 1e-9


def word_segments(phone_segs: Sequence[Segment], words: Sequence[str],
                  lexicon: Lexicon | Mapping[str, Sequence[Sequence[str]]],
                  silence: str | None = "SIL") -> list[Segment]:
    """Word segments from phone segments and the transcript.

    The phone segments (``label`` = phone names, :func:`phone_segments` with
    ``phones``) are split into the transcript's words, each spelled by one of
    its pronunciations, with any number of ``silence`` segments before the
    first word, between words and after the last (the numerator graph's
    optional silence) -- and nowhere else: a silence inside a word's phones
    ends the word.  The search is exact (a dynamic programme over segment
    and word positions): every way of spelling the transcript is
    considered, and of those the one whose pronunciations are most probable
    (the product of the lexicon's probabilities) is taken; among equally
    probable ones, the earliest word where they differ takes the
    pronunciation listed first, and a word comes before a silence.  A
    segment with :attr:`Segment.shared_by` may be any of those phones.  A
    word spans from its first phone's start to its last phone's end.

    Parameters
    ----------
    phone_segs : phone segments of one utterance.
    words : the transcript.
    lexicon : :class:`chainfb.chain.Lexicon` or ``{word: [pronunciation (phone sequence), ...]}``.
    silence : the optional-silence phone (None: none).

    Returns
    -------
    list of :class:`Segment` with ``label`` the word.  Raises ``ValueError``
    when the phones do not spell the transcript.
    """
    if isinstance(words, str):
        raise TypeError("words: expected a list of words, got a str (split it first)")
    segs, words = list(phone_segs), list(words)
    prons = [[(ph, lp) for ph, lp in _prons(lexicon, w) if len(ph)] for w in words]
    n, W = len(segs), len(words)
    sil = [silence is not None and _is(s, silence) for s in segs]

    def spelled(j, i):  # the pronunciations of word j that the segments from i spell: [(length, log-prob)]
        return [(len(ph), lp) for ph, lp in prons[j]
                if i + len(ph) <= n and all(_is(segs[i + m], x) for m, x in enumerate(ph))]

    # best[j, i]: the highest log-prob of spelling words[j:] from segment i at a word boundary (-inf: none)
    best = np.full((W + 1, n + 1), -np.inf)
    for j in range(W, -1, -1):
        for i in range(n, -1, -1):
            v = 0.0 if (j, i) == (W, n) else -np.inf
            if i < n and sil[i]:
                v = max(v, best[j, i + 1])
            if j < W:
                for L, lp in spelled(j, i):
                    v = max(v, lp + best[j + 1, i + L])
            best[j, i] = v
    if best[0, 0] == -np.inf:
        raise ValueError(_unspelled(segs, words, sil, spelled))
    out, i = [], 0
    for j in range(W + 1):
        while True:  # at a boundary: the first choice that keeps the best score (the tie rule above)
            target = best[j, i] - _TIE * (1.0 + abs(best[j, i]))
            word = next(((L, lp) for L, lp in (spelled(j, i) if j < W else ()) if lp + best[j + 1, i + L] >= target),
                        None)
            if word is not None:
                out.append(Segment(words[j], segs[i].start, segs[i + word[0] - 1].end))
                i += word[0]
                break
            if j == W and i == n:
                break
            i += 1  # a silence segment (the only choice left that keeps the best score)
    return out


def _unspelled(segs, words, sil, spelled) -> str:
    """Why the segments do not spell ``words``: the first word no reachable position spells, or the segments
    left after the last word."""
    reach = {0}
    for j in range(len(words) + 1):
        todo = sorted(reach)
        while todo:  # optional silence at the boundary
            i = todo.pop()
            if i < len(segs) and sil[i] and i + 1 not in reach:
                reach.add(i + 1)
                todo.append(i + 1)
        if j == len(words):
            break
        nxt = {i + L for i in reach for L, _ in spelled(j, i)}
        if not nxt:
            i = max(reach)
            return (f"phone_segs: the phones from segment {i} ({[s.label for s in segs[i:i + 4]]}...) do not spell "
                    f"word {words[j]!r}")
        reach = nxt
    return (f"phone_segs: {len(segs) - max(reach)} phone segment(s) left after the transcript's last word "
            f"(none of its spellings ends at the last segment)")
