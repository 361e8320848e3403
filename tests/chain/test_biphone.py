"""Left-biphone context dependency (Kaldi e2e): counting, count-based tying,
numerator / denominator / word-loop graphs over biphone pdfs, Kaldi's initial
probabilities of the biphone denominator, and the graph tools' options."""

import paths  # tests/paths.py: the repository's and the tests' folders
import itertools
import math
import os
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest

from chainfb.chain import (
    BiphoneSet, DenominatorGraph, Topology, biphone_counts, den_graph, estimate_phone_lm,
    numerator_graph, read_lexicon, transcript_biphone_counts, word_loop_graph,
)
from oracles import chain_graphs as chain_oracle
from oracles.chain_graphs import pdf_sequences

ROOT = paths.REPO
PHONES = ["SIL", "A", "B", "C"]
LEX = ["a 1.0 A B", "a 0.5 A C", "b 1.0 B", "c 1.0 C A", "SIL 1.0 SIL"]


def phone_alternatives(words, lex, sil_prob, sil="SIL"):
    """{phone tuple: prob} of a transcript over :data:`PHONES` (see :mod:`oracles.chain_graphs`)."""
    return chain_oracle.phone_alternatives(words, lex, sil_prob, PHONES, sil)


def units_of(phones, table, ci=()):
    """Units of a phone sequence from a {(left, phone): unit} table written out by hand (left -1: the start;
    a context-independent left phone counts as the start)."""
    out, left = [], -1
    for p in phones:
        out.append(table[(left, p)])
        left = -1 if p in ci else p
    return out


def alignments(units, L, topo):
    """All pdf sequences of length L aligning ``units`` (chain: entering pdf 2u, loop 2u+1; hmm3: 3u+state)."""
    res = []
    if topo == "chain":
        for cuts in itertools.combinations(range(1, L), len(units) - 1):
            bounds = (0,) + cuts + (L,)
            seq = []
            for u, (b0, b1) in zip(units, zip(bounds, bounds[1:])):
                seq += [2 * u] + [2 * u + 1] * (b1 - b0 - 1)
            res.append(tuple(seq))
    else:
        states = [(u, k) for u in units for k in range(3)]
        for cuts in itertools.combinations(range(1, L), len(states) - 1):
            bounds = (0,) + cuts + (L,)
            seq = []
            for (u, k), (b0, b1) in zip(states, zip(bounds, bounds[1:])):
                seq += [3 * u + k] * (b1 - b0)
            res.append(tuple(seq))
    return res


def tied_set(min_biphone_count=2, ci=()):
    lex = read_lexicon(LEX)
    texts = [["a", "b"], ["c"], ["b", "a"], ["a", "a"], ["c", "b"]]
    return lex, BiphoneSet.from_transcripts(texts, lex, PHONES, min_biphone_count, 1, context_independent=ci)


# ---------------------------------------------------------------- counting and tying
def test_counts_follow_kaldi_and_all_pronunciations():
    # Kaldi (compute_biphone_stats.py): every phone with its left context, the start included
    c, m = biphone_counts([[1, 2], [1, 1, 3]], 4)
    assert c[0, 1] == 2 and c[2, 2] == 1 and c[2, 1] == 1 and c[2, 4 - 1] == 1 and c.sum() == 5
    np.testing.assert_array_equal(m, [0, 3, 1, 1])
    lex = read_lexicon(LEX)
    texts = [["a", "b"], ["b", "a"]]
    # "last": Kaldi's text_to_phones.py keeps the last pronunciation of a word (a = A C), no silence
    c, m = transcript_biphone_counts(texts, lex, PHONES, prons="last")
    ref, mref = biphone_counts([[1, 3, 2], [2, 1, 3]], 4)
    np.testing.assert_array_equal(c, ref)
    np.testing.assert_array_equal(m, mref)
    c, _ = transcript_biphone_counts(texts, lex, PHONES, prons="first")
    np.testing.assert_array_equal(c, biphone_counts([[1, 2, 2], [2, 1, 2]], 4)[0])
    # "all": each word occurrence counts every biphone of its pronunciations once
    c, m = transcript_biphone_counts(texts + [["a", "a"]], lex, PHONES)
    assert c[0, 1] == 2 and c[0, 2] == 1  # <s>-A (twice), <s>-B
    assert c[1 + 1, 2] == 4 and c[1 + 1, 3] == 4  # A-B, A-C: a b, b a, a a (each a once)
    assert c[2 + 1, 2] == 1 and c[2 + 1, 1] == 2 and c[3 + 1, 1] == 1  # B-B; B-A (b a, a a); C-A (a a)
    assert c[:, 0].sum() == 0  # no silence is counted (Kaldi: --edge-silprob 0 --between-silprob 0)
    np.testing.assert_array_equal(m, [0, 4, 6, 4])  # per word occurrence, the most any pronunciation has
    with pytest.raises(ValueError, match="OOV"):
        transcript_biphone_counts([["a", "zz"]], lex, PHONES)
    with pytest.raises(ValueError, match="prons"):
        transcript_biphone_counts(texts, lex, PHONES, prons="some")


def test_tying_respects_the_count_threshold():
    P = 4
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 10, (P + 1, P))
    counts[:, 3] = 0  # phone 3 unseen: its biphones share the zerophone unit
    for threshold in (0, 1, 4, 7, 11):
        bs = BiphoneSet(PHONES, counts, min_biphone_count=threshold, min_monophone_count=5)
        mono = counts.sum(0)
        owner = defaultdict(set)
        for q in range(-1, P):
            for p in range(P):
                u = bs.unit_of(q, p)
                owner[u].add((q, p))
                name = bs.unit_names[u]
                if q == -1:
                    assert name == f"<s>-{PHONES[p]}"  # the start context is never tied (Kaldi)
                elif counts[q + 1, p] >= threshold:
                    assert name == f"{PHONES[q]}-{PHONES[p]}"
                elif mono[p] > 5:
                    assert name == PHONES[p]
                else:
                    assert name == "<zero>"
        # a kept biphone owns its unit alone; a tied one shares its monophone's (or the zerophone) unit
        for u, members in owner.items():
            if "-" in bs.unit_names[u]:
                assert len(members) == 1
        assert bs.num_units == len(owner) == len(bs.unit_names)
        assert bs.num_pdfs(Topology.chain()) == 2 * bs.num_units
        pm = bs.pdf_map(Topology.chain())
        assert pm.shape == (P + 1, P, 2) and (pm[..., 0] == 2 * bs.unit).all() and (pm[..., 1] == pm[..., 0] + 1).all()
    full = BiphoneSet(PHONES, counts, min_biphone_count=0)
    assert full.num_units == (P + 1) * P and full.num_biphone_units == (P + 1) * P
    assert BiphoneSet(PHONES).num_units == (P + 1) * P  # no counts: no tying
    # Kaldi's numbering: per phone its start unit, then its left contexts in order (monophone unit when first needed)
    bs = BiphoneSet(PHONES, np.full((P + 1, P), 3), min_biphone_count=4, min_monophone_count=0)
    assert bs.unit_names[:4] == ["<s>-SIL", "SIL", "<s>-A", "A"] and bs.num_units == 2 * P
    # context-independent phones: one unit, first; as a left context they are the start
    ci = BiphoneSet(PHONES, counts, min_biphone_count=0, context_independent=["SIL"])
    assert ci.unit_names[0] == "SIL" and set(ci.unit[:, 0]) == {0}
    assert all(ci.unit_of(0, p) == ci.unit_of(-1, p) for p in range(P))
    with pytest.raises(ValueError, match="counts"):
        BiphoneSet(PHONES, counts[:P])
    with pytest.raises(ValueError, match="min_biphone_count"):
        BiphoneSet(PHONES, counts, min_biphone_count=-1)
    with pytest.raises(ValueError, match="context_independent"):
        BiphoneSet(PHONES, counts, context_independent=["XX"])


# ---------------------------------------------------------------- graphs
@pytest.mark.parametrize("topo", ["chain", "hmm3"])
@pytest.mark.parametrize("words", [["a", "b"], ["c"], ["b", "a"]])
@pytest.mark.parametrize("ci", [(), (0,)])
def test_numerator_graph_accepts_exactly_the_biphone_alignments(topo, words, ci):
    lex, bs = tied_set(2, ci)
    assert bs.num_biphone_units > 0 and bs.num_monophone_units > 0  # both kinds in play
    table = {(q, p): bs.unit_of(q, p) for q in range(-1, 4) for p in range(4)}
    sil_prob = 0.3
    fst = numerator_graph(words, lex, getattr(Topology, topo)(), PHONES, "SIL", sil_prob, context=bs)
    raw = numerator_graph(words, lex, getattr(Topology, topo)(), PHONES, "SIL", sil_prob, minimize=False,
                          determinize=False, context=bs)
    keys = [(s, p) for s, _, p, _ in fst.arcs()]
    assert len(keys) == len(set(keys))  # deterministic
    assert fst.num_pdfs <= bs.num_pdfs(getattr(Topology, topo)())
    alts = phone_alternatives(words, lex, sil_prob)
    for L in ([5, 6] if topo == "chain" else [9, 10]):
        expected = chain_oracle.expected_pdf_sequences(
            alts, L, lambda phones, n: alignments(units_of(phones, table, ci), n, topo))
        got = pdf_sequences(fst, L)
        assert set(got) == set(expected)
        for k in got:
            assert got[k] == pytest.approx(expected[k], rel=1e-12)
        assert pdf_sequences(raw, L).keys() == got.keys()


def test_denominator_maps_each_lm_arc_to_its_biphone_and_keeps_kaldi_initial_probs():
    seqs = [[0, 1, 2], [0, 1, 1, 2], [2, 0], [1, 2, 0, 1], [3, 1, 0]]
    lm = estimate_phone_lm(seqs, 3, 2, 3)
    bs = BiphoneSet.from_phone_sequences(seqs, PHONES, min_biphone_count=2, min_monophone_count=0)
    topo = Topology.chain()
    fst = DenominatorGraph(den_graph(lm, topo, context=bs)).fst

    def prefix_prob(phones):
        return chain_oracle.lm_prefix_prob(lm, phones)

    # every phone path of the LM, read through the biphone units, with the LM's probability
    for L in (1, 3, 4):
        expected = defaultdict(float)
        for n in range(1, L + 1):
            for phones in itertools.product(range(4), repeat=n):
                pr = prefix_prob(phones)
                if pr == 0:
                    continue
                units = units_of(phones, {(q, p): bs.unit_of(q, p) for q in range(-1, 4) for p in range(4)})
                for seq in alignments(units, L, "chain"):
                    expected[seq] += pr
        got = pdf_sequences(fst, L)
        assert got.keys() == expected.keys()
        for k in got:
            assert got[k] == pytest.approx(expected[k], rel=1e-12)
    # Kaldi's initial probabilities (DenominatorGraph::SetInitialProbs) of the biphone graph: dense reference
    raw = den_graph(lm, topo, context=bs)
    S = raw.num_states
    A = np.zeros((S, S))
    for s, d, _, lp in raw.arcs():
        A[s, d] += math.exp(lp)
    tot = A.sum(1) + np.exp(raw.final)
    A = A / tot[:, None]
    cur, avg = np.eye(S)[raw.start], np.zeros(S)
    for _ in range(100):
        avg += cur / 100
        cur = cur @ A
        cur /= cur.sum()
    np.testing.assert_allclose(DenominatorGraph(raw).init_probs, avg / avg.sum(), rtol=1e-10, atol=1e-15)
    # an LM state of order >= 2 knows its last phone: splitting the LM by left context adds no state or arc (the
    # HMM states multiply only where arcs of several left contexts enter one LM state)
    pg = lm.to_phone_graph()
    split = bs.split(pg)
    assert (split.num_nodes, len(split.arcs)) == (pg.num_nodes, len(pg.arcs))
    assert sorted(a[3] for a in split.arcs) == sorted(a[3] for a in pg.arcs)
    # an order-1 LM (one state, no history) is split into one state per last phone
    uni = estimate_phone_lm(seqs, 1)
    assert uni.num_states == 1 and bs.split(uni.to_phone_graph()).num_nodes == 1 + 4


def test_word_loop_graph_with_biphones_and_errors():
    lex, bs = tied_set(2)
    topo = Topology.chain()
    fst, word_of_arc = word_loop_graph(["a", "b", "c"], lex, topo, PHONES, context=bs)
    assert set(word_of_arc[word_of_arc >= 0].tolist()) == {0, 1, 2}
    table = {(q, p): bs.unit_of(q, p) for q in range(-1, 4) for p in range(4)}
    # "c b": C A B after the start; no silence: weight (1 - 0.5) / 3 per word
    seq = tuple(alignments(units_of([3, 1, 2], table), 3, "chain")[0])
    assert pdf_sequences(fst, 3)[seq] == pytest.approx((0.5 / 3) ** 2)
    with pytest.raises(ValueError, match="context"):
        numerator_graph(["a"], lex, topo, PHONES + ["D"], context=bs)
    with pytest.raises(TypeError, match="context"):
        numerator_graph(["a"], lex, topo, PHONES, context="biphone")
    with pytest.raises(ValueError, match="context"):
        den_graph(estimate_phone_lm([[4, 1]], 2), topo, context=bs)


# ---------------------------------------------------------------- tools
def test_graph_tools_take_the_context_options(tmp_path):
    ex = os.path.join(ROOT, "graphs", "examples", "digits")
    common = ["--lexicon", f"{ex}/lexicon.txt", "--phones", f"{ex}/phones.txt", "--text", f"{ex}/text"]
    den = str(tmp_path / "den.fst")

    def run(tool, *args):
        return subprocess.run([sys.executable, "-m", f"chainfb.cli.{tool}", *args], capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=ROOT))

    r = run("make_den_graph", *common, "--context", "biphone", "--min-biphone-count", "2", "--out", den)
    assert r.returncode == 0, r.stderr
    assert "biphone" in r.stderr and "units" in r.stderr
    r = run("make_numerator_graphs", *common, "--context", "biphone", "--min-biphone-count", "2",
            "--den-graph", den, "--out", str(tmp_path / "num.txt"))
    assert r.returncode == 0, r.stderr
    r = run("make_den_graph", *common, "--context", "triphone", "--out", den)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--context" in r.stderr
    r = run("make_numerator_graphs", *common, "--min-biphone-count", "-1", "--out", den)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--min-biphone-count" in r.stderr
    # numerators against a den graph of other units: one line naming the options
    r = run("make_numerator_graphs", *common, "--den-graph", den, "--out", str(tmp_path / "num2.txt"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "--context mono" in r.stderr
