"""Compiling transcripts into pdf graphs (numerator graphs), and word-loop
decoding graphs.

Pipeline: words -> pronunciations (alternatives, optional silence between
words) -> a :class:`~chainfb.chain.graphs.phone_graph.PhoneGraph` -> epsilon
removal -> expansion by a :class:`~chainfb.chain.graphs.topology.Topology` ->
an epsilon-free pdf acceptor (:class:`chainfb.Fst`) with self-loops ->
exact state merging (:func:`chainfb.fst_algo.merge_equivalent_states`).

Expansion: the HMM state "phone ``p`` ended at phone-graph node ``v``, now
in template state ``k``" is keyed ``(v, p, k)``; a phone arc ``u -> v``
gives the topology's entering arcs from every exit state of a phone ending
at ``u`` (or from the start state when ``u`` is the start node) into
``(v, p, k)``, carrying the phone arc's weight plus the topology's
probabilities.  The same expansion makes denominator graphs from phone LMs
(:mod:`chainfb.chain.graphs.phone_lm`).

Context dependency: with ``context=`` a
:class:`~chainfb.chain.graphs.biphone.BiphoneSet` the phone graph is split by
left context first (:meth:`~chainfb.chain.graphs.biphone.BiphoneSet.split`)
and each biphone takes the pdfs of its (tied) unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ... import checks
from ...fst import Fst
from ...fst_algo import canonical_fst, has_path_of_length, merge_equivalent_states, min_frames, trim
from ...fst_algo import determinize as determinize_fst
from .biphone import BiphoneSet
from .lexicon import Lexicon, PhoneIds, phone_index
from .phone_graph import EPS, PhoneGraph
from .topology import ENTER, Topology

__all__ = ["phone_index", "expand", "numerator_graph", "word_loop_graph", "min_frames", "fits", "check_fits"]


def expand(pg: PhoneGraph, topology: Topology, all_final: bool = False,
           context: BiphoneSet | None = None) -> tuple[Fst, np.ndarray]:
    """Expand an epsilon-free phone graph by ``topology``.

    Parameters
    ----------
    pg : PhoneGraph without epsilons (phone labels are 0-based phone ids;
        with ``context``, biphone labels from
        :meth:`~chainfb.chain.graphs.biphone.BiphoneSet.split`).
    topology : Topology
    all_final : bool — make every state final with probability 1 (den graphs).
    context : BiphoneSet or None — label ``l`` takes the pdfs of unit
        ``context.unit_of_label[l]``; the topology's ``no_repeat_from``
        compares the phones of the labels.

    Returns
    -------
    ``(Fst, word_of_arc [A])``: the trimmed pdf acceptor and, per arc, the
    word id of the phone arc it enters (``-1`` on non-entering arcs).
    """
    all_final = checks.flag(all_final, "all_final")
    if not isinstance(topology, Topology):
        raise TypeError(f"topology: expected a chainfb.chain.Topology, got {type(topology).__name__}")
    if context is not None and not isinstance(context, BiphoneSet):
        raise TypeError(f"context: expected a chainfb.chain.BiphoneSet or None, got {type(context).__name__}")
    if context is None:
        def unit(p):
            return p

        phone_of = unit
    else:
        unit_of, phone_ids = context.unit_of_label, context.phone_of_label

        def unit(p):
            return int(unit_of[p])

        def phone_of(p):
            return int(phone_ids[p])
    ids: dict = {}

    def sid(key):
        i = ids.get(key)
        if i is None:
            i = ids[key] = len(ids)
        return i

    START = ("start",)
    sid(START)
    in_phones: dict[int, set] = {}
    for (_u, v, p, _lp, _w) in pg.arcs:
        if p == EPS:
            raise ValueError("expand: the phone graph still has epsilon arcs; call remove_epsilons() first")
        in_phones.setdefault(v, set()).add(p)
    exits = sorted(topology.exits.items())
    enter = [a for a in topology.arcs if a[0] == ENTER]
    inner = [a for a in topology.arcs if a[0] != ENTER]
    src, dst, pdf, lps, words = [], [], [], [], []

    def add(s, d, p, lp, w=-1):
        src.append(s)
        dst.append(d)
        pdf.append(p)
        lps.append(lp)
        words.append(w)

    sources_cache: dict[int, list] = {}

    def sources(u):
        r = sources_cache.get(u)
        if r is None:
            r = [(sid(START), 0.0, None, None)] if u == pg.start else []
            for p2 in sorted(in_phones.get(u, ())):
                for f, ew in exits:
                    r.append((sid((u, p2, f)), ew, p2, f))
            sources_cache[u] = r
        return r

    ends = set()
    for (u, v, p, lp, w) in pg.arcs:
        ends.add((v, p))
        for (_, k, tp, q) in enter:
            d = sid((v, p, k))
            pid = topology.pdf_id(tp, unit(p))
            for s, ew, p2, f in sources(u):
                if p2 is not None and phone_of(p2) == phone_of(p) and f in topology.no_repeat_from:
                    continue
                add(s, d, pid, lp + q + ew, w)
    for (v, p) in sorted(ends):
        for (i, k, tp, q) in inner:
            add(sid((v, p, i)), sid((v, p, k)), topology.pdf_id(tp, unit(p)), q)
    if topology.prefix_loop is not None:
        if topology.prefix_loop[0] != "shared":
            raise ValueError("topology: prefix_loop must use a shared pdf")
        add(sid(START), sid(START), topology.pdf_id(topology.prefix_loop, 0), 0.0)
    S = len(ids)
    final = np.full(S, -np.inf)
    if all_final:
        final[:] = 0.0
    else:
        if pg.start in pg.final:
            final[sid(START)] = pg.final[pg.start]
        for key, i in ids.items():
            if len(key) == 3 and key[0] in pg.final and key[2] in topology.exits:
                final[i] = pg.final[key[0]] + topology.exits[key[2]]
    fst, words = canonical_fst(S, sid(START), src, dst, pdf, lps, final, words)
    return trim(fst, words)


def _check_sil(optional_silence, sil_prob, ids):
    if not (isinstance(sil_prob, (int, float)) and 0.0 <= sil_prob < 1.0):
        raise ValueError(f"sil_prob: expected a probability in [0, 1), got {sil_prob!r}")
    if optional_silence is not None and sil_prob > 0 and optional_silence not in ids:
        raise ValueError(f"optional_silence: phone {optional_silence!r} is not in phone_ids")


def _check_context(context, ids):
    if not isinstance(context, BiphoneSet):
        raise TypeError(f"context: expected a chainfb.chain.BiphoneSet or None, got {type(context).__name__}")
    if context.num_phones != len(ids):
        raise ValueError(f"context: a BiphoneSet of {context.num_phones} phones, but phone_ids has {len(ids)}")
    return context


def _pron_ids(word, lexicon: Lexicon, ids):
    if not isinstance(lexicon, Lexicon):
        raise TypeError(f"lexicon: expected a chainfb.chain.Lexicon, got {type(lexicon).__name__}")
    if word not in lexicon:
        raise ValueError(f"words: word {word!r} is not in the lexicon (OOV)")
    out = []
    for phones, prob in lexicon.prons[word]:
        for ph in phones:
            if ph not in ids:
                raise ValueError(f"lexicon: phone {ph!r} of word {word!r} is not in phone_ids")
        out.append(([ids[ph] for ph in phones], math.log(prob)))
    return out


def numerator_graph(
    words: Sequence[str],
    lexicon: Lexicon,
    topology: Topology,
    phone_ids: PhoneIds,
    optional_silence: str | None = "SIL",
    sil_prob: float = 0.5,
    sil_at_ends: bool = True,
    minimize: bool = True,
    determinize: bool = True,
    context: BiphoneSet | None = None,
) -> Fst:
    """The numerator (supervision) graph of one transcript.

    Parameters
    ----------
    words : list of str — the transcript.
    lexicon : Lexicon — alternative pronunciations become parallel paths
        weighted by their probabilities.
    topology : Topology
    phone_ids : list of phones (index = id) or ``{phone: id}``.
    optional_silence : str or None — phone that may occur between words
        (and, with ``sil_at_ends``, before the first and after the last word)
        with probability ``sil_prob``; ``None`` disables it.
    minimize : bool — exact state merging (:func:`chainfb.fst_algo.merge_equivalent_states`).
    determinize : bool — weighted determinization first
        (:func:`chainfb.fst_algo.determinize`; skipped when it would
        blow up), so that no state has two arcs with the same pdf.

    Returns
    -------
    Fst — epsilon-free pdf acceptor (pdf numbering: :class:`Topology`).

    Raises ``ValueError`` for an OOV word or a phone missing from ``phone_ids``.
    """
    if isinstance(words, str):
        raise TypeError("words: expected a list of words, got a str (split it first)")
    ids = phone_index(phone_ids)
    _check_sil(optional_silence, sil_prob, ids)
    prons = [_pron_ids(w, lexicon, ids) for w in words]
    pg = PhoneGraph()
    use_sil = optional_silence is not None and sil_prob > 0
    sil = ids.get(optional_silence) if use_sil else None

    def boundary(b, at_end):
        c = pg.add_node()
        if use_sil and (sil_at_ends or not at_end):
            pg.add_arc(b, c, EPS, math.log1p(-sil_prob))
            pg.add_arc(b, c, sil, math.log(sil_prob))
        else:
            pg.add_arc(b, c, EPS, 0.0)
        return c

    b = pg.add_node()
    pg.start = b
    c = boundary(b, True)
    for i, alts in enumerate(prons):
        nb = pg.add_node()
        for phones, lp in alts:
            u = c
            for j, ph in enumerate(phones):
                v = nb if j == len(phones) - 1 else pg.add_node()
                pg.add_arc(u, v, ph, lp if j == 0 else 0.0)
                u = v
        c = boundary(nb, i == len(prons) - 1)
    pg.final[c] = 0.0
    pg = pg.remove_epsilons()
    fst, _ = expand(_check_context(context, ids).split(pg) if context is not None else pg, topology, context=context)
    if determinize:
        det = determinize_fst(fst)
        if det is not None:
            fst = det
    if minimize:
        fst, _ = merge_equivalent_states(fst)
    return fst


def word_loop_graph(
    words: Sequence[str],
    lexicon: Lexicon,
    topology: Topology,
    phone_ids: PhoneIds,
    optional_silence: str | None = "SIL",
    sil_prob: float = 0.5,
    minimize: bool = True,
    context: BiphoneSet | None = None,
) -> tuple[Fst, np.ndarray]:
    """A decoding graph: any sequence of ``words`` (a uniform word loop) with
    optional silence between them.

    Parameters
    ----------
    words : list of str — the vocabulary; word id = index in this list.
    lexicon, topology, phone_ids, optional_silence, sil_prob : as in
        :func:`numerator_graph`.  Each word has probability
        ``(1 - sil_prob) / len(words)`` times its pronunciation probability
        per step of the loop; silence ``sil_prob``.
    context : BiphoneSet or None — left-biphone pdfs, as in :func:`numerator_graph`
        (the loop state is split by the last phone of the previous word).

    Returns
    -------
    ``(Fst, word_of_arc)``: ``word_of_arc`` int64 ``[A]`` is the word id on
    the arc that enters a word's first phone, ``-1`` on every other arc.
    The start state is final (the empty sequence).
    """
    if isinstance(words, str) or not len(words):
        raise ValueError("words: expected a non-empty list of words")
    ids = phone_index(phone_ids)
    _check_sil(optional_silence, sil_prob, ids)
    use_sil = optional_silence is not None and sil_prob > 0
    pg = PhoneGraph()
    loop = pg.add_node()
    pg.start = loop
    pg.final[loop] = 0.0
    w_lp = math.log1p(-sil_prob) - math.log(len(words)) if use_sil else -math.log(len(words))
    if use_sil:
        pg.add_arc(loop, loop, ids[optional_silence], math.log(sil_prob))
    for wid, word in enumerate(words):
        for phones, lp in _pron_ids(word, lexicon, ids):
            u = loop
            for j, ph in enumerate(phones):
                v = loop if j == len(phones) - 1 else pg.add_node()
                pg.add_arc(u, v, ph, (w_lp + lp) if j == 0 else 0.0, wid if j == 0 else -1)
                u = v
    if context is not None:
        pg = _check_context(context, ids).split(pg)
    fst, word_of_arc = expand(pg, topology, context=context)
    if minimize:
        fst, word_of_arc = merge_equivalent_states(fst, word_of_arc)
    return fst, word_of_arc


def fits(fst: Fst, num_frames: int) -> tuple[bool, str]:
    """``(ok, message)``: whether some path of ``fst`` has exactly ``num_frames``
    arcs.  ``ok`` is False (with the reason) when the shortest path is longer
    than ``num_frames`` (Kaldi's check) or no path has exactly that length."""
    n = int(num_frames)
    if n < 0:
        raise ValueError(f"num_frames: expected >= 0, got {num_frames}")
    m = min_frames(fst)
    if m == math.inf:
        return False, "the graph has no complete path"
    if m > n:
        return False, f"the transcript needs at least {m} frames but only {n} are available"
    # exact-length reachability (graphs without self-loops may not fit every length)
    if not has_path_of_length(fst, n):
        return False, f"no path of the graph has exactly {n} frames (shortest: {m})"
    return True, ""


def check_fits(fst: Fst, num_frames: int, utt_id: str | None = None) -> None:
    """Raise ``ValueError`` (naming ``utt_id``) unless :func:`fits` holds."""
    ok, msg = fits(fst, num_frames)
    if not ok:
        raise ValueError(f"utterance {utt_id!r}: {msg}" if utt_id is not None else msg)
