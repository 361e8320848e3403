"""Chain (pdf-graph) forced alignment: the Viterbi pdf sequence of each
utterance through its numerator graph (Kaldi's alignment format: one pdf per
frame), and the phone and word segments it implies.

Numerator graphs (:func:`chainfb.chain.numerator_graph`) are pdf acceptors:
after minimisation their arcs keep no phone or word labels.  So phones are
read back from the pdfs through the topology's numbering
(:class:`chainfb.chain.Topology`: pdf ``shared_pdfs + phone *
pdfs_per_phone + class``; shared pdfs such as the CTC blank belong to no
phone), and words from the phone sequence and the transcript's
pronunciations (:func:`word_segments`).

What can be told apart: a new phone starts where the phone changes, and,
when the topology has pdf classes that only ever *enter* a phone (the
chain topology's class 0, one frame per phone), also at every such frame,
so a phone repeated back to back is two segments.  With topologies whose
entry pdf is also a self-loop (``hmm3``, ``ctc``) two back-to-back copies
of one phone are one segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Sequence

import numpy as np

from .. import checks
from ..api import PdfCriterion
from ..cuda.interop import on_torch_stream
from .paths import best_arcs

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
    """A labelled span of frames ``[start, end)`` (``end`` exclusive)."""

    label: object
    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start


@on_torch_stream
def align_pdfs(fsts, scores, lengths=None) -> List[PdfAlignment]:
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


def phone_segments(pdfs, topology, phones: Sequence[str] | None = None) -> List[Segment]:
    """Phone segments of a pdf alignment (see the module docstring).

    Parameters
    ----------
    pdfs : ``[T]`` ints, e.g. :attr:`PdfAlignment.pdfs`.
    topology : the :class:`chainfb.chain.Topology` the graph was built with.
    phones : phone names by id (the ``phone_ids`` list given to the graph
        compiler), optional.

    Returns
    -------
    list of :class:`Segment` in time order, ``label`` the phone name (or its
    id without ``phones``); frames of shared pdfs are in no segment.
    """
    from ..chain import Topology

    if not isinstance(topology, Topology):
        raise TypeError(f"topology: expected a chainfb.chain.Topology, got {type(topology).__name__}")
    p = checks.int_array(pdfs, "pdfs", 1)
    if p.size and p.min() < 0:
        raise ValueError(f"pdfs: pdf ids must be >= 0, got {p.min()}")
    k = p - topology.shared_pdfs
    phone = np.where(k >= 0, k // topology.pdfs_per_phone, -1)
    cls = np.where(k >= 0, k % topology.pdfs_per_phone, -1)
    if phones is not None and phone.size and phone.max() >= len(phones):
        raise ValueError(f"pdfs: pdf {p[phone.argmax()]} is phone {phone.max()} but phones lists {len(phones)}")
    entry = np.isin(cls, sorted(_entry_only_classes(topology)))
    T = len(p)
    start = (phone >= 0) & (np.r_[True, phone[1:] != phone[:-1]] | entry)
    out = []
    for s in np.flatnonzero(start).tolist():
        e = s + 1
        while e < T and phone[e] == phone[s] and not start[e]:
            e += 1
        out.append(Segment(phones[phone[s]] if phones is not None else int(phone[s]), s, e))
    return out


def _prons(lexicon, word):
    if isinstance(lexicon, Mapping):
        if word not in lexicon:
            raise ValueError(f"words: word {word!r} is not in the lexicon")
        return [tuple(p) for p in lexicon[word]]
    prons = getattr(lexicon, "prons", None)
    if prons is None:
        raise TypeError(f"lexicon: expected a chainfb.chain.Lexicon or a {{word: [phones, ...]}} mapping, "
                        f"got {type(lexicon).__name__}")
    if word not in prons:
        raise ValueError(f"words: word {word!r} is not in the lexicon")
    return [tuple(ph) for ph, _ in prons[word]]


def word_segments(phone_segs: Sequence[Segment], words: Sequence[str], lexicon,
                  silence: str | None = "SIL") -> List[Segment]:
    """Word segments from phone segments and the transcript.

    The phone segments (``label`` = phone names, :func:`phone_segments` with
    ``phones``) are matched left to right against the words'
    pronunciations, skipping ``silence`` segments between words; a word
    spans from its first phone's start to its last phone's end.  With several
    pronunciations the longest one that matches is taken.

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
    segs = [s for s in phone_segs if s.label != silence]
    labels = [s.label for s in segs]
    out, i = [], 0
    for w in words:
        match = None
        for pron in sorted(_prons(lexicon, w), key=len, reverse=True):
            if len(pron) and tuple(labels[i:i + len(pron)]) == pron:
                match = pron
                break
        if match is None:
            raise ValueError(f"phone_segs: the phones from segment {i} ({labels[i:i + 4]}...) do not spell "
                             f"word {w!r}")
        out.append(Segment(w, segs[i].start, segs[i + len(match) - 1].end))
        i += len(match)
    if i != len(segs):
        raise ValueError(f"phone_segs: {len(segs) - i} phone segment(s) left after the transcript's last word")
    return out
