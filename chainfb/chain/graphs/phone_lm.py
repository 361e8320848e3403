"""Phone language model for the denominator graph, in the spirit of Kaldi's
``chain-est-phone-lm``: an *unsmoothed* n-gram over phones with history
pruning instead of smoothing (unseen n-grams get probability 0, which keeps
the graph small; the denominator only has to cover training sequences).

Estimation (orders 2..4 and beyond):

1. Every phone sequence is read as ``BOS p1 ... pn EOS``; each event
   ``(history, next)`` uses the last ``order - 1`` symbols as its history
   (never reaching before BOS).
2. Kept histories: every history seen of length ``< no_prune_order``, plus
   the ``num_extra_states`` longer histories whose removal would cost the
   most training log-likelihood (count-weighted log-ratio of their
   maximum-likelihood distribution to their suffix's), closed under taking
   suffixes.  A pruned history's events go to its longest kept suffix (its
   "backoff" state; Kaldi likewise folds counts into lower orders instead
   of adding backoff arcs).
3. ``P(x | h) = c(h, x) / c(h)`` with ``x`` a phone or EOS; reading ``x``
   from history ``h`` leads to the longest kept suffix of ``h + x``.
   EOS is the final probability.  Probabilities out of each state (arcs and
   final) sum to 1.

:func:`den_graph` expands the LM by a topology (every state final with
probability 1, as Kaldi's denominator treats it).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from collections.abc import Iterable, Sequence

import numpy as np

from ... import checks
from ...fst import Fst
from ...fst_algo import merge_equivalent_states
from .biphone import BiphoneSet
from .graph_compiler import expand
from .lexicon import Lexicon, PhoneIds, phone_index
from .phone_graph import PhoneGraph
from .topology import Topology

__all__ = ["PhoneLM", "estimate_phone_lm", "den_graph", "transcript_phones"]

BOS = -1
EOS = -2


@dataclass
class PhoneLM:
    """An n-gram phone LM as a deterministic acceptor.

    Attributes
    ----------
    order : int
    histories : list of tuples — state ``i``'s history (``-1`` = BOS).
    start : int — the state of history ``(BOS,)``.
    arcs : list of ``(src, dst, phone, log_prob)``.
    final : float64 ``[num_states]`` — log P(EOS | history) (``-inf`` if never).
    """

    order: int
    histories: list
    start: int
    arcs: list
    final: np.ndarray

    @property
    def num_states(self) -> int:
        return len(self.histories)

    @property
    def num_arcs(self) -> int:
        return len(self.arcs)

    def to_phone_graph(self) -> PhoneGraph:
        pg = PhoneGraph(self.num_states, self.start)
        for s, d, p, lp in self.arcs:
            pg.add_arc(s, d, p, lp)
        pg.final = {i: float(w) for i, w in enumerate(self.final) if w > -np.inf}
        return pg

    def log_prob(self, phones: Sequence[int]) -> float:
        """Log-probability of a phone sequence (EOS included)."""
        out = {}
        for s, d, p, lp in self.arcs:
            out[(s, p)] = (d, lp)
        s, tot = self.start, 0.0
        for p in phones:
            if (s, int(p)) not in out:
                return -math.inf
            s, lp = out[(s, int(p))]
            tot += lp
        return tot + float(self.final[s])


def _history(seq, i, n):
    """History of position i (0-based over seq = [BOS] + phones + [EOS]) of length <= n-1."""
    return tuple(seq[max(0, i - (n - 1)):i])


def estimate_phone_lm(
    phone_seqs: Iterable[Sequence[int]],
    order: int = 4,
    no_prune_order: int = 3,
    num_extra_states: int = 1000,
) -> PhoneLM:
    """Estimate an unsmoothed pruned n-gram phone LM.

    Parameters
    ----------
    phone_seqs : iterable of int sequences (0-based phone ids)
    order : int >= 1 — n-gram order (histories of up to ``order - 1`` phones).
    no_prune_order : int — histories shorter than this are all kept.
    num_extra_states : int — how many longer histories to keep.

    Returns
    -------
    PhoneLM
    """
    if not isinstance(order, int) or order < 1:
        raise ValueError(f"order: expected an integer >= 1, got {order!r}")
    if not isinstance(no_prune_order, int) or no_prune_order < 1:
        raise ValueError(f"no_prune_order: expected an integer >= 1, got {no_prune_order!r}")
    if num_extra_states < 0:
        raise ValueError(f"num_extra_states: expected >= 0, got {num_extra_states}")
    events: Counter = Counter()
    nseq = 0
    for seq in phone_seqs:
        seq = [int(p) for p in seq]
        if any(p < 0 for p in seq):
            raise ValueError("phone_seqs: phone ids must be >= 0")
        full = [BOS] + seq + [EOS]
        for i in range(1, len(full)):
            events[(_history(full, i, order), full[i])] += 1
        nseq += 1
    if nseq == 0:
        raise ValueError("phone_seqs: no sequences")
    # counts of every suffix of every full history
    suff: dict = defaultdict(Counter)
    for (h, x), c in events.items():
        for k in range(len(h) + 1):
            suff[h[k:]][x] += c
    # BOS-anchored histories are always at least (BOS,): drop the empty history unless needed
    keep = {h for h in suff if len(h) < no_prune_order and h != ()}
    extra = [h for h in suff if len(h) >= no_prune_order]

    def gain(h):
        a, b = suff[h], suff[h[1:]]
        ta, tb = sum(a.values()), sum(b.values())
        return sum(c * (math.log(c / ta) - math.log(b[x] / tb)) for x, c in a.items())

    extra.sort(key=lambda h: (-gain(h), h))
    for h in extra[:num_extra_states]:
        keep.add(h)
    for h in list(keep):  # suffix closure
        for k in range(1, len(h)):
            keep.add(h[k:])
    if () in suff and any(len(h) == 0 for (h, _) in events):
        keep.add(())

    def longest_kept(h):
        for k in range(len(h) + 1):
            if h[k:] in keep:
                return h[k:]
        return None

    counts: dict = defaultdict(Counter)
    for (h, x), c in events.items():
        counts[longest_kept(h)][x] += c
    hist = sorted(counts, key=lambda h: (len(h), h))
    idx = {h: i for i, h in enumerate(hist)}
    arcs = []
    final = np.full(len(hist), -np.inf)
    for h in hist:
        cnt = counts[h]
        tot = sum(cnt.values())
        for x, c in sorted(cnt.items()):
            lp = math.log(c / tot)
            if x == EOS:
                final[idx[h]] = lp
            else:
                nxt = longest_kept((h + (x,))[-(order - 1):] if order > 1 else ())
                if nxt not in idx:  # cannot happen: h+x was followed by something
                    raise AssertionError("phone LM: missing successor history")
                arcs.append((idx[h], idx[nxt], x, lp))
    start = idx[longest_kept((BOS,))] if order > 1 else idx[()]
    return PhoneLM(order, hist, start, arcs, final)


def transcript_phones(words: Sequence[str], lexicon: Lexicon, phone_ids: PhoneIds, optional_silence: str | None = "SIL",
                      sil_prob: float = 0.5, rng: np.random.Generator | None = None,
                      pron: str = "first") -> list[int]:
    """One phone-id sequence for a transcript, for phone-LM estimation (as
    Kaldi's e2e recipe does from the text): the first pronunciation of each
    word (``pron="first"``) or one drawn by probability (``"sample"``), and
    ``optional_silence`` inserted between words with probability
    ``sil_prob`` (drawn with ``rng``, a ``numpy.random.Generator``; with
    ``rng=None`` silence is never inserted)."""
    ids = phone_index(phone_ids)
    if pron not in ("first", "sample"):
        raise ValueError(f"pron: expected 'first' or 'sample', got {pron!r}")
    out: list[int] = []
    for i, w in enumerate(words):
        if w not in lexicon:
            raise ValueError(f"words: word {w!r} is not in the lexicon (OOV)")
        alts = lexicon.prons[w]
        if pron == "sample" and rng is not None and len(alts) > 1:
            p = np.array([a[1] for a in alts])
            phones = alts[int(rng.choice(len(alts), p=p / p.sum()))][0]
        else:
            phones = alts[0][0]
        for ph in phones:
            if ph not in ids:
                raise ValueError(f"lexicon: phone {ph!r} of word {w!r} is not in phone_ids")
            out.append(ids[ph])
        if (i + 1 < len(words) and optional_silence is not None and rng is not None
                and rng.random() < sil_prob):
            out.append(ids[optional_silence])
    return out


def den_graph(phone_lm: PhoneLM, topology: Topology, minimize: bool = True, context: BiphoneSet | None = None) -> Fst:
    """The denominator graph: ``phone_lm`` expanded by ``topology``.

    Final probabilities are the LM's end-of-sequence probabilities (as in
    Kaldi's den.fst); :class:`~chainfb.chain.denominator.DenominatorGraph`
    uses them only for the initial probabilities and treats every state as
    final with probability 1.  ``minimize`` merges equivalent states exactly.

    ``context`` (a :class:`~chainfb.chain.graphs.biphone.BiphoneSet`): an arc
    reading phone ``p`` from an LM state whose last phone is ``q`` (the start
    state: the utterance start) takes the pdfs of the unit of ``(q, p)``.
    LM states of order 2 or more know their last phone, so only states of a
    shorter history are split (the HMM states are per LM state and biphone).

    Returns
    -------
    Fst — epsilon-free pdf acceptor, start state 0 (pdf numbering: the
    topology's, with ``context`` its units in place of phones).
    """
    minimize = checks.flag(minimize, "minimize")
    if not isinstance(phone_lm, PhoneLM):
        raise TypeError(f"phone_lm: expected a PhoneLM, got {type(phone_lm).__name__}")
    pg = phone_lm.to_phone_graph()
    if context is not None:
        if not isinstance(context, BiphoneSet):
            raise TypeError(f"context: expected a chainfb.chain.BiphoneSet or None, got {type(context).__name__}")
        used = max((a[2] for a in phone_lm.arcs), default=-1)
        if used >= context.num_phones:
            raise ValueError(f"context: the phone LM reads phone {used} but the BiphoneSet has "
                             f"{context.num_phones} phones")
        pg = context.split(pg)
    fst, _ = expand(pg, topology, context=context)
    if minimize:
        fst, _ = merge_equivalent_states(fst)
    return fst
