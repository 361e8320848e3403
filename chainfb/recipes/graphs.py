"""Phone graphs -> epsilon-free pdf acceptors with Kaldi's chain topology, for the digit recipe.

Topology (Kaldi's chain topology, one HMM state per phone): phone ``p`` (0-based id) is entered through an arc
with pdf ``2 p`` and stays through a self-loop with pdf ``2 p + 1``; ``num_pdfs = 2 * num_phones``.

A *phone graph* is a list of arcs ``(src, dst, phone, log_prob, label)`` over states ``0..S-1`` with start 0 and a
dict of final log-probs. :func:`expand_chain_topology` turns it into a pdf acceptor (:class:`chainfb.Fst`) without
epsilons: every phone arc ``a`` becomes an HMM state ``s_a``; ``s_a`` has the self-loop pdf of ``phone(a)``; an arc
``b`` leaving ``dst(a)`` becomes the transition ``s_a -> s_b`` with the entry pdf of ``phone(b)`` and weight of ``b``;
``s_a`` is final with the final weight of ``dst(a)``. With ``merge=True`` HMM states with the same
``(dst(a), phone(a))`` are merged (exact: their futures are identical), which turns a bigram phone LM into a graph with
one state per phone. ``label`` (e.g. a word id, -1 for none) is carried onto the entry arcs and returned per arc.

These are the recipe's own small compilers (numerator graphs for digit transcripts, a bigram phone-LM denominator and
a word-loop decoding graph); the general ones live in :mod:`chainfb.chain` and are used by the recipe when present.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..fst import Fst

__all__ = ["PhoneArc", "expand_chain_topology", "transcript_phone_graph", "numerator_graph", "bigram_phone_lm",
           "phone_lm_graph", "denominator_graph", "word_loop_graph", "sample_phone_sequence", "min_frames"]

PhoneArc = Tuple[int, int, int, float, int]  # (src, dst, phone, log_prob, label)


def expand_chain_topology(arcs: Sequence[PhoneArc], finals: Dict[int, float], num_states: int, merge: bool = False):
    """Phone graph -> (``Fst`` over pdfs ``2*phone`` / ``2*phone+1``, ``labels [A]`` int64 per FST arc).

    The FST's start state is a fresh state 0 standing for the phone graph's start state 0."""
    if num_states < 1:
        raise ValueError(f"num_states: expected >= 1, got {num_states}")
    out_arcs: Dict[int, List[int]] = {s: [] for s in range(num_states)}
    for i, (s, d, p, lp, lab) in enumerate(arcs):
        if not (0 <= s < num_states and 0 <= d < num_states):
            raise ValueError(f"arcs: arc {i} has a state outside 0..{num_states - 1}")
        if p < 0:
            raise ValueError(f"arcs: arc {i} has a negative phone id {p}")
        out_arcs[s].append(i)
    key_of_arc = {}
    state_of_key: Dict[Tuple[int, int], int] = {}
    hmm_state = np.zeros(len(arcs), dtype=np.int64)
    for i, (s, d, p, lp, lab) in enumerate(arcs):
        key = (d, p) if merge else (i, -1)
        if key not in state_of_key:
            state_of_key[key] = 1 + len(state_of_key)
        hmm_state[i] = state_of_key[key]
        key_of_arc[i] = key
    S = 1 + len(state_of_key)
    src, dst, pdf, lps, labels = [], [], [], [], []
    done_keys = set()

    def emit(from_state, phone_state_of):
        for b in out_arcs[phone_state_of]:
            _, _, pb, lpb, labb = arcs[b]
            src.append(from_state)
            dst.append(hmm_state[b])
            pdf.append(2 * pb)
            lps.append(lpb)
            labels.append(labb)

    emit(0, 0)
    final = np.full(S, -np.inf)
    if 0 in finals:
        final[0] = finals[0]
    for i, (s, d, p, lp, lab) in enumerate(arcs):
        k = key_of_arc[i]
        if k in done_keys:
            continue
        done_keys.add(k)
        st = hmm_state[i]
        src.append(st)
        dst.append(st)
        pdf.append(2 * p + 1)
        lps.append(0.0)
        labels.append(-1)
        emit(st, d)
        if d in finals:
            final[st] = finals[d]
    fst = Fst(S, 0, np.array(src, np.int64), np.array(dst, np.int64), np.array(pdf, np.int64),
              np.array(lps, np.float64), final)
    return fst, np.array(labels, np.int64)


def _word_ids(words: Sequence[str], lexicon) -> None:
    missing = [w for w in words if w not in lexicon]
    if missing:
        raise ValueError(f"words: not in the lexicon: {missing}")


def transcript_phone_graph(words: Sequence[str], lexicon, phone_ids: Dict[str, int], silence: str = "SIL",
                           sil_prob: float = 0.5):
    """Phone graph of a transcript: optional silence before/between/after words, alternative pronunciations.

    Returns ``(arcs, finals, num_states)`` (see the module docstring)."""
    _word_ids(words, lexicon)
    if not 0.0 < sil_prob < 1.0:
        raise ValueError(f"sil_prob: expected a number in (0, 1), got {sil_prob}")
    sil = phone_ids[silence]
    ls, lns = float(np.log(sil_prob)), float(np.log1p(-sil_prob))
    arcs: List[PhoneArc] = []
    n = [0]

    def new():
        n[0] += 1
        return n[0] - 1

    b = new()
    bsil = new()
    arcs.append((b, bsil, sil, ls, -1))
    for w in words:
        nb, nbsil = new(), new()
        prons = lexicon[w]
        for pron in prons:
            for origin, w0 in ((b, lns), (bsil, 0.0)):
                cur = origin
                for j, ph in enumerate(pron):
                    nxt = nb if j == len(pron) - 1 else new()
                    arcs.append((cur, nxt, phone_ids[ph], float(w0 - np.log(len(prons))) if j == 0 else 0.0, -1))
                    cur = nxt
        arcs.append((nb, nbsil, sil, ls, -1))
        b, bsil = nb, nbsil
    finals = {b: lns, bsil: 0.0}
    return arcs, finals, n[0]


def numerator_graph(words: Sequence[str], lexicon, phone_ids: Dict[str, int], silence: str = "SIL",
                    sil_prob: float = 0.5) -> Fst:
    """Epsilon-free pdf acceptor of a transcript with the chain topology (merged HMM states)."""
    arcs, finals, S = transcript_phone_graph(words, lexicon, phone_ids, silence, sil_prob)
    return expand_chain_topology(arcs, finals, S, merge=True)[0]


def min_frames(fst: Fst) -> int:
    """Number of arcs on the shortest start->final path (frames the sequence needs); large if none."""
    INF = np.iinfo(np.int64).max // 4
    dist = np.full(fst.num_states, INF, np.int64)
    dist[fst.start] = 0
    for _ in range(fst.num_states):
        cand = dist[fst.src] + 1
        new = dist.copy()
        np.minimum.at(new, fst.dst, np.where(dist[fst.src] >= INF, INF, cand))
        if np.array_equal(new, dist):
            break
        dist = new
    fin = np.isfinite(fst.final)
    return int(dist[fin].min()) if fin.any() else int(INF)


def sample_phone_sequence(words: Sequence[str], lexicon, rng: np.random.Generator, silence: str = "SIL",
                          sil_prob: float = 0.5) -> List[str]:
    """One phone sequence of a transcript: a random pronunciation per word, optional silences with ``sil_prob``."""
    seq: List[str] = []
    if rng.random() < sil_prob:
        seq.append(silence)
    for w in words:
        prons = lexicon[w]
        seq.extend(prons[int(rng.integers(0, len(prons)))])
        if rng.random() < sil_prob:
            seq.append(silence)
    return seq


def bigram_phone_lm(sequences: Sequence[Sequence[int]], num_phones: int, add_k: float = 0.1):
    """Add-``k`` smoothed bigram phone LM. Returns ``(log_p [num_phones + 1, num_phones + 1])``: row = history
    (``num_phones`` = sentence start), column = next phone (``num_phones`` = sentence end); rows sum to 1."""
    V = num_phones + 1
    counts = np.zeros((V, V))
    for s in sequences:
        h = num_phones
        for p in s:
            if not 0 <= p < num_phones:
                raise ValueError(f"sequences: phone id {p} outside 0..{num_phones - 1}")
            counts[h, p] += 1
            h = p
        counts[h, num_phones] += 1
    counts += add_k
    counts[:, num_phones][num_phones] = 0.0  # empty sentence not allowed
    with np.errstate(divide="ignore"):
        return np.log(counts / counts.sum(axis=1, keepdims=True))


def phone_lm_graph(log_p: np.ndarray):
    """Bigram phone LM -> phone graph ``(arcs, finals, num_states)``: state ``num_phones`` is the start (moved to 0)."""
    V = log_p.shape[0]
    P = V - 1
    # states: 0 = start, 1 + p = history p
    arcs: List[PhoneArc] = []
    for h in range(V):
        s = 0 if h == P else 1 + h
        for p in range(P):
            if np.isfinite(log_p[h, p]):
                arcs.append((s, 1 + p, p, float(log_p[h, p]), -1))
    finals = {1 + h: float(log_p[h, P]) for h in range(P) if np.isfinite(log_p[h, P])}
    return arcs, finals, V


def denominator_graph(log_p: np.ndarray) -> Fst:
    """Denominator pdf graph: bigram phone LM composed with the chain topology (one HMM state per phone)."""
    arcs, finals, S = phone_lm_graph(log_p)
    return expand_chain_topology(arcs, finals, S, merge=True)[0]


def word_loop_graph(words: Sequence[str], lexicon, phone_ids: Dict[str, int], silence: str = "SIL",
                    word_penalty: float = 0.0):
    """Decoding graph: a loop over ``words`` (uniform, each pronunciation equally likely) and optional silence.

    Returns ``(Fst, word_of_arc [A])`` where ``word_of_arc`` is the index into ``words`` on word-entry arcs, -1
    elsewhere. ``word_penalty`` is added (log domain) to every word entry."""
    _word_ids(words, lexicon)
    arcs: List[PhoneArc] = []
    n = [1]
    lw = -float(np.log(len(words))) + word_penalty
    for wi, w in enumerate(words):
        prons = lexicon[w]
        for pron in prons:
            cur = 0
            for j, ph in enumerate(pron):
                nxt = 0 if j == len(pron) - 1 else n[0]
                if nxt:
                    n[0] += 1
                arcs.append((cur, nxt, phone_ids[ph], (lw - np.log(len(prons))) if j == 0 else 0.0,
                             wi if j == 0 else -1))
                cur = nxt
    arcs.append((0, 0, phone_ids[silence], 0.0, -1))
    return expand_chain_topology(arcs, {0: 0.0}, n[0], merge=False)
