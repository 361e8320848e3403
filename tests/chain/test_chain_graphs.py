"""Graph building for chain training: lexicon/text/phones readers, topology
files, numerator graphs (alternatives, optional silence, OOV, too-short
transcripts), word-loop graphs, phone LM and denominator graph,
normalization FST."""

import paths  # tests/paths.py: the repository's and the tests' folders
import itertools
import math
import os
from collections import defaultdict

import numpy as np
import pytest

import chainfb
from chainfb import Fst
from chainfb.chain import (
    Topology, add_normalization, check_fits, den_graph, estimate_phone_lm, fits, intersect,
    merge_equivalent_states, min_frames, normalization_fst, numerator_graph, read_lexicon, read_phones,
    read_text, word_loop_graph, DenominatorGraph,
)
from chainfb.testing import random_fst
from oracles import chain_graphs as chain_oracle
from oracles.chain_graphs import pdf_sequences

ROOT = paths.REPO
LEX = ["a A B", "a A C", "b B", "c C A", "SIL SIL"]
PHONES = ["SIL", "A", "B", "C"]


def phone_alternatives(words, lex, sil_prob, sil="SIL"):
    """{phone tuple: prob} of a transcript over :data:`PHONES` (see :mod:`oracles.chain_graphs`)."""
    return chain_oracle.phone_alternatives(words, lex, sil_prob, PHONES, sil)


def alignments(phones, L, topo):
    """All pdf sequences of length L aligning ``phones`` under a topology (independent rules)."""
    res = []
    if topo == "chain":
        for cuts in itertools.combinations(range(1, L), len(phones) - 1) if phones else []:
            bounds = (0,) + cuts + (L,)
            seq = []
            for p, (b0, b1) in zip(phones, zip(bounds, bounds[1:])):
                seq += [2 * p] + [2 * p + 1] * (b1 - b0 - 1)
            res.append(tuple(seq))
    elif topo == "hmm3":
        states = [(p, k) for p in phones for k in range(3)]
        for cuts in itertools.combinations(range(1, L), len(states) - 1):
            bounds = (0,) + cuts + (L,)
            seq = []
            for (p, k), (b0, b1) in zip(states, zip(bounds, bounds[1:])):
                seq += [3 * p + k] * (b1 - b0)
            res.append(tuple(seq))
    elif topo == "ctc":
        for seq in itertools.product(range(len(PHONES) + 1), repeat=L):
            collapsed = [k for k, _ in itertools.groupby(seq) if k != 0]
            if tuple(c - 1 for c in collapsed) == tuple(phones):
                res.append(seq)
    return res


# ---------------------------------------------------------------- readers
def test_read_lexicon_text_phones(tmp_path):
    lex = read_lexicon(LEX)
    assert lex.prons["a"] == [(("A", "B"), 1.0), (("A", "C"), 1.0)]
    lexp = read_lexicon(["a 1.0 A B", "a 0.5 A C", "b 1 B"])
    assert lexp.prons["a"][1] == (("A", "C"), 0.5)
    (tmp_path / "lexicon.txt").write_text("\n".join(LEX) + "\n")
    assert read_lexicon(tmp_path / "lexicon.txt").prons == lex.prons
    with pytest.raises(ValueError, match="probability"):
        read_lexicon(["a 1.5 A"], with_probs=True)
    with pytest.raises(ValueError, match="no phones"):
        read_lexicon(["a"])
    (tmp_path / "text").write_text("u1 a b\nu2 c\n")
    assert read_text(tmp_path / "text") == [("u1", ["a", "b"]), ("u2", ["c"])]
    (tmp_path / "phones.txt").write_text("<eps> 0\nSIL 1\nA 2\nB 3\nC 4\n#0 5\n")
    assert read_phones(tmp_path / "phones.txt") == PHONES
    assert read_phones(["SIL", "A"]) == ["SIL", "A"]
    with pytest.raises(TypeError):
        read_lexicon(42)


# Kaldi's data/local/dict and data/lang as its scripts write them (prepare_lang.sh with position-dependent
# phones, utils/dict_dir_add_pronprobs.sh): tab-separated probabilities, <eps> at 0, disambiguation symbols
KALDI_LEXICONP = "a\t1.0\tA B\na\t0.5\tA C\nb\t1.0\tB\nc\t1.0\tC A\nSIL\t1.0\tSIL\n"
KALDI_SILPROB = ("a\t1.0\t0.21\t1.05\t0.93\tA B\na\t0.5\t0.0\t0.98\t1.01\tA C\nb\t1.0\t0.5\t1.0\t1.0\tB\n"
                 "c\t1.0\t0.05\t0.8\t1.2\tC A\nSIL\t1.0\t0.0\t1.0\t1.0\tSIL\n")
KALDI_PHONES = "".join(f"{p} {i}\n" for i, p in enumerate(
    ["<eps>", "SIL", "SIL_B", "SIL_E", "SIL_I", "SIL_S"] + [f"{p}_{x}" for p in "ABC" for x in "BEIS"]
    + ["#0", "#1", "#2", "#3"]))


def test_kaldi_lexiconp_and_silprob(tmp_path):
    (tmp_path / "lexiconp.txt").write_text(KALDI_LEXICONP)
    lexp = read_lexicon(tmp_path / "lexiconp.txt")
    assert lexp.prons == read_lexicon(["a 1.0 A B", "a 0.5 A C", "b 1 B", "c 1 C A", "SIL 1 SIL"]).prons
    assert lexp.sil_probs == {}
    # lexiconp_silprob.txt: the three silence numbers are not phones
    (tmp_path / "lexiconp_silprob.txt").write_text(KALDI_SILPROB)
    lexs = read_lexicon(tmp_path / "lexiconp_silprob.txt")
    assert lexs.prons == lexp.prons
    assert lexs.sil_probs["a"] == [(0.21, 1.05, 0.93), (0.0, 0.98, 1.01)] and lexs.sil_probs["SIL"] == [(0.0, 1.0, 1.0)]
    assert read_lexicon(tmp_path / "lexiconp_silprob.txt", with_probs=True, sil_probs=True).prons == lexp.prons
    # asked for explicitly: the lexiconp form reads the numbers as phones, as told
    assert read_lexicon(["a 1.0 0.2 1 1 A"], sil_probs=False).prons["a"] == [(("0.2", "1", "1", "A"), 1.0)]
    g = numerator_graph(["a", "b"], lexs, Topology.chain(), PHONES, "SIL", 0.5)
    assert g == numerator_graph(["a", "b"], lexp, Topology.chain(), PHONES, "SIL", 0.5)
    # errors name the file and the line
    (tmp_path / "bad.txt").write_text(KALDI_SILPROB.replace("0.05", "1.5"))
    with pytest.raises(ValueError, match=r"bad.txt: line 4: silence probabilities '1.5 0.8 1.2'"):
        read_lexicon(tmp_path / "bad.txt", sil_probs=True)
    (tmp_path / "bad.txt").write_text(KALDI_LEXICONP.replace("0.5", "1.5"))
    with pytest.raises(ValueError, match=r"bad.txt: line 2: probability 1.5 is outside \(0, 1\]"):
        read_lexicon(tmp_path / "bad.txt", with_probs=True)
    (tmp_path / "bad.txt").write_text("a\t1.0\t0.2\t1.0\t1.0\n")
    with pytest.raises(ValueError, match="bad.txt: line 1: expected 'word prob p_sil f_sil f_nonsil phone...'"):
        read_lexicon(tmp_path / "bad.txt", sil_probs=True)
    with pytest.raises(ValueError, match="sil_probs: .*with_probs=False"):
        read_lexicon(tmp_path / "lexiconp_silprob.txt", with_probs=False, sil_probs=True)


def test_kaldi_phones_txt_with_word_positions(tmp_path):
    (tmp_path / "phones.txt").write_text(KALDI_PHONES)
    with pytest.raises(ValueError, match=r"phones.txt: word-position-dependent phones \(A_B, A_E, A_I, A_S, ...\): "
                                         r"pass word_positions='strip' .* or word_positions='keep'"):
        read_phones(tmp_path / "phones.txt")
    assert read_phones(tmp_path / "phones.txt", word_positions="strip") == PHONES
    kept = read_phones(tmp_path / "phones.txt", word_positions="keep")
    assert kept == KALDI_PHONES.split()[2:2 + 2 * 17:2] and len(kept) == 17 and "#0" not in kept
    with pytest.raises(ValueError, match="word_positions"):
        read_phones(tmp_path / "phones.txt", word_positions="base")
    # an inventory without them reads the same whatever the choice
    (tmp_path / "plain.txt").write_text("<eps> 0\nSIL 1\nA 2\nB 3\nC 4\n#0 5\n#1 6\n")
    assert read_phones(tmp_path / "plain.txt") == read_phones(tmp_path / "plain.txt", word_positions="keep") == PHONES
    # a lexicon in base phones fits the stripped list; the kept list takes Kaldi's positions
    lex = read_lexicon(LEX)
    plex = lex.with_word_positions()
    assert plex.prons["a"] == [(("A_B", "B_E"), 1.0), (("A_B", "C_E"), 1.0)] and plex.prons["b"] == [(("B_S",), 1.0)]
    topo = Topology.chain()
    g = numerator_graph(["c", "a"], plex, topo, kept, "SIL", 0.5)
    seqs = pdf_sequences(g, 6)
    C_B, A_E, A_B, B_E = (kept.index(p) for p in ("C_B", "A_E", "A_B", "B_E"))
    assert (2 * C_B, 2 * A_E, 2 * A_B, 2 * B_E + 1, 2 * B_E, 2 * B_E + 1) not in seqs  # B_E is entered once
    assert (2 * C_B, 2 * A_E, 2 * A_B, 2 * B_E, 2 * B_E + 1, 2 * B_E + 1) in seqs
    assert (2 * C_B, 2 * A_E, 2 * kept.index("SIL"), 2 * A_B, 2 * B_E, 2 * B_E + 1) in seqs  # the optional silence
    assert numerator_graph(["c", "a"], lex, topo, read_phones(tmp_path / "phones.txt", word_positions="strip"),
                           "SIL", 0.5) == numerator_graph(["c", "a"], lex, topo, PHONES, "SIL", 0.5)


def test_phones_txt_ids(tmp_path):
    (tmp_path / "phones.txt").write_text("SIL 1\n<eps> 0\nB 3\nA 2\n#0 4\n#-1 5\n")
    assert read_phones(tmp_path / "phones.txt") == ["SIL", "A", "B"]  # by id; <eps> and disambiguation dropped
    (tmp_path / "phones.txt").write_text("<eps> 1\nSIL 0\nA 2\n")
    with pytest.raises(ValueError, match="phones.txt: <eps> has id 1"):
        read_phones(tmp_path / "phones.txt")
    (tmp_path / "phones.txt").write_text("<eps> 0\nSIL 1\nA 1\n")
    with pytest.raises(ValueError, match="phones.txt: phone id 1 is given to several symbols"):
        read_phones(tmp_path / "phones.txt")
    (tmp_path / "phones.txt").write_text("<eps> 0\nSIL 1 x\n")
    with pytest.raises(ValueError, match="phones.txt: expected 'phone id' lines"):
        read_phones(tmp_path / "phones.txt")


# ---------------------------------------------------------------- topology
@pytest.mark.parametrize("name", ["chain", "ctc", "hmm3"])
def test_topology_files_round_trip(name, tmp_path):
    topo = getattr(Topology, name)()
    from_file = Topology.read(os.path.join(ROOT, "graphs", "topologies", f"{name}.topo"))
    assert from_file == topo
    topo.write(tmp_path / "t.topo")
    assert Topology.read(tmp_path / "t.topo") == topo
    assert Topology.from_text(topo.to_text()) == topo


def test_topology_numbering_and_errors():
    assert Topology.chain().num_pdfs(10) == 20
    assert Topology.ctc().num_pdfs(10) == 11
    assert Topology.hmm3().num_pdfs(10) == 30
    t = Topology.chain()
    assert t.pdf_id(("class", 1), 3) == 7
    t2 = Topology.from_text("states 1\nshared_pdfs 0\npdfs_per_phone 1\narc enter 0 0 0.5\narc 0 0 0\nexit 0 0.25\n")
    assert t2.arcs[0][3] == pytest.approx(math.log(0.5)) and t2.exits[0] == pytest.approx(math.log(0.25))
    for bad in ["states 1\nshared_pdfs 0\npdfs_per_phone 1\narc enter 0 3\nexit 0\n",
                "states 1\nshared_pdfs 0\npdfs_per_phone 1\narc 0 0 0\nexit 0\n",
                "states 1\nshared_pdfs 0\npdfs_per_phone 1\narc enter 0 0\n",
                "states 1\npdfs_per_phone 1\narc enter 0 0\nexit 0\n",
                "bogus 1\n"]:
        with pytest.raises(ValueError):
            Topology.from_text(bad)


# ---------------------------------------------------------------- numerator graphs
@pytest.mark.parametrize("topo", ["chain", "hmm3", "ctc"])
@pytest.mark.parametrize("words", [["a", "b"], ["c"], ["b", "a"]])
def test_numerator_graph_accepts_exactly_the_alignments(topo, words):
    lex = read_lexicon(["a 1.0 A B", "a 0.5 A C", "b 1.0 B", "c 1.0 C A", "SIL 1.0 SIL"])
    sil_prob = 0.3
    fst = numerator_graph(words, lex, getattr(Topology, topo)(), PHONES, "SIL", sil_prob)
    raw = numerator_graph(words, lex, getattr(Topology, topo)(), PHONES, "SIL", sil_prob, minimize=False,
                          determinize=False)
    keys = [(s, p) for s, _, p, _ in fst.arcs()]
    assert len(keys) == len(set(keys))  # deterministic
    alts = phone_alternatives(words, lex, sil_prob)
    lengths = [5, 6] if topo != "hmm3" else [9, 10]
    if topo == "ctc":
        lengths = [4, 5]
    for L in lengths:
        expected = chain_oracle.expected_pdf_sequences(alts, L, lambda phones, n: alignments(list(phones), n, topo))
        got = pdf_sequences(fst, L)
        assert set(got) == set(expected)
        for k in got:
            assert got[k] == pytest.approx(expected[k], rel=1e-12)
        assert pdf_sequences(raw, L).keys() == got.keys()


def test_numerator_graph_errors_and_fit_check():
    lex = read_lexicon(LEX)
    topo = Topology.chain()
    with pytest.raises(ValueError, match="OOV"):
        numerator_graph(["a", "zzz"], lex, topo, PHONES)
    with pytest.raises(ValueError, match="not in phone_ids"):
        numerator_graph(["a"], lex, topo, ["SIL", "A"])
    with pytest.raises(ValueError, match="sil_prob"):
        numerator_graph(["a"], lex, topo, PHONES, sil_prob=1.0)
    with pytest.raises(TypeError):
        numerator_graph("a b", lex, topo, PHONES)
    no_ends = numerator_graph(["b"], lex, topo, PHONES, sil_at_ends=False)
    assert pdf_sequences(no_ends, 2) == {(4, 5): 1.0}  # B entered, B self-loop; no silence at the ends
    two = pdf_sequences(numerator_graph(["b", "b"], lex, topo, PHONES, sil_prob=0.25, sil_at_ends=False), 3)
    assert two == {(4, 0, 4): pytest.approx(0.25), (4, 5, 4): pytest.approx(0.75), (4, 4, 5): pytest.approx(0.75)}
    fst = numerator_graph(["a", "b", "c"], lex, topo, PHONES)
    assert min_frames(fst) == 5  # A B  B  C A
    assert min_frames(numerator_graph(["a", "b", "c"], lex, Topology.hmm3(), PHONES)) == 15
    ok, msg = fits(fst, 4)
    assert not ok and "at least 5 frames" in msg
    assert fits(fst, 5) == (True, "")
    with pytest.raises(ValueError, match="utt7"):
        check_fits(fst, 3, "utt7")
    # the engine agrees: too few frames -> -inf
    ll, _ = chainfb.forward_backward(fst, np.zeros((1, 4, topo.num_pdfs(4))))
    assert ll[0] == -np.inf
    # a graph without self-loops that cannot produce every length
    g = Fst.from_arcs([(0, 1, 0, 0.0), (1, 2, 0, 0.0)], {2: 0.0})
    assert fits(g, 3)[0] is False and "exactly 3" in fits(g, 3)[1]


def test_merge_and_determinize_preserve_totals_random():
    from chainfb.chain import determinize

    rng = np.random.default_rng(5)
    ndet = 0
    for _ in range(20):
        f = random_fst(rng, num_states=6, num_arcs=14, num_pdfs=3)
        m, _ = merge_equivalent_states(f)
        x = rng.normal(size=(2, 6, 3))
        a, pa = chainfb.forward_backward(f, x)
        b, pb = chainfb.forward_backward(m, x)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        d = determinize(f)
        if d is None:
            continue
        ndet += 1
        keys = [(s, p) for s, _, p, _ in d.arcs()]
        assert len(keys) == len(set(keys))
        c, pc = chainfb.forward_backward(d, x)
        np.testing.assert_allclose(a, c, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(pa, pc, atol=1e-9)
    assert ndet >= 5
    # a graph without the twins property: determinization gives up
    nt = Fst.from_arcs([(0, 1, 0, 0.0), (0, 2, 0, 0.0), (1, 1, 1, -1.0), (2, 2, 1, -2.0)], {1: 0.0, 2: 0.0})
    assert determinize(nt, max_states=50) is None


def test_word_loop_graph_labels_words():
    lex = read_lexicon(LEX)
    topo = Topology.chain()
    vocab = ["a", "b", "c"]
    fst, word_of_arc = word_loop_graph(vocab, lex, topo, PHONES, optional_silence=None)
    assert word_of_arc.shape == (fst.num_arcs,)
    arcs = defaultdict(list)
    for i, (s, d, p, lp) in enumerate(fst.arcs()):
        arcs[s].append((d, p, lp, int(word_of_arc[i])))
    seen = set()

    def walk(s, pdfs, words, L):
        if len(pdfs) == L:
            if fst.final[s] > -math.inf:
                num = numerator_graph([vocab[w] for w in words], lex, topo, PHONES, optional_silence=None)
                assert tuple(pdfs) in pdf_sequences(num, L)
                seen.add(tuple(words))
            return
        for d, p, _lp, w in arcs[s]:
            walk(d, pdfs + [p], words + ([w] if w >= 0 else []), L)

    for L in (1, 2, 3, 4):
        walk(fst.start, [], [], L)
    assert {(1,), (0,), (2,), (1, 1), (0, 1), (1, 0)} <= seen
    g2, w2 = word_loop_graph(vocab, lex, topo, PHONES)  # with silence
    assert (w2 >= 0).sum() >= 3 and g2.final[g2.start] == 0.0


# ---------------------------------------------------------------- phone LM and den graph
def test_phone_lm_bigram_counts_and_normalisation():
    seqs = [[0, 1, 2], [0, 1, 1], [2]]
    lm = estimate_phone_lm(seqs, order=2, no_prune_order=2, num_extra_states=0)
    # ML bigram: P(0|BOS)=2/3, P(1|0)=1, P(2|1)=1/3, P(1|1)=1/3, P(EOS|1)=1/3, P(EOS|2)=1
    assert lm.log_prob([0, 1, 2]) == pytest.approx(math.log(2 / 3 * 1 * 1 / 3 * 1))
    assert lm.log_prob([0, 1, 1, 1]) == pytest.approx(math.log(2 / 3 * 1 / 3 * 1 / 3 * 1 / 3))
    assert lm.log_prob([1]) == -math.inf
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(0, 6, rng.integers(1, 15))) for _ in range(200)]
    for order, npo, extra in [(2, 2, 0), (3, 2, 5), (4, 3, 30), (4, 2, 0)]:
        lm = estimate_phone_lm(seqs, order, npo, extra)
        tot = np.exp(lm.final.copy())
        for s, _d, _p, lp in lm.arcs:
            tot[s] += math.exp(lp)
        np.testing.assert_allclose(tot, 1.0, rtol=1e-12)
        assert all(len(h) <= order - 1 for h in lm.histories)
        assert sum(len(h) >= npo for h in lm.histories) <= extra
        # every training sequence has non-zero probability
        assert all(lm.log_prob(s) > -math.inf for s in seqs)
    # pruning all long histories of a 4-gram = the bigram
    a = estimate_phone_lm(seqs, 4, 2, 0)
    b = estimate_phone_lm(seqs, 2, 2, 0)
    for s in seqs[:20]:
        assert a.log_prob(s) == pytest.approx(b.log_prob(s))
    with pytest.raises(ValueError):
        estimate_phone_lm([], 3)
    with pytest.raises(ValueError):
        estimate_phone_lm(seqs, 0)


def test_den_graph_matches_phone_lm():
    seqs = [[0, 1, 2], [0, 1, 1, 2], [2, 0], [1, 2, 0, 1]]
    lm = estimate_phone_lm(seqs, 3, 2, 3)
    topo = Topology.chain()
    raw = den_graph(lm, topo)
    # finals are the LM's end-of-sequence probabilities; the denominator treats all states as final
    assert np.isclose(np.exp(raw.final).max(), np.exp(lm.final).max())
    fst = DenominatorGraph(raw).fst
    assert (fst.final == 0).all()

    def prefix_prob(phones):
        return chain_oracle.lm_prefix_prob(lm, phones)

    for L in (1, 3, 4):
        got = pdf_sequences(fst, L)
        expected = {}
        for seq in itertools.product(range(6), repeat=L):
            if seq[0] % 2 == 1 or any(b % 2 == 1 and b != a and b - 1 != a for a, b in zip(seq, seq[1:])):
                continue  # a self-loop pdf must follow its own phone
            phones = [p // 2 for p in seq if p % 2 == 0]
            pr = prefix_prob(phones)
            if pr > 0:
                expected[seq] = pr
        assert got.keys() == expected.keys()
        for k in got:
            assert got[k] == pytest.approx(expected[k], rel=1e-12)


def test_normalization_fst_and_intersection():
    rng = np.random.default_rng(3)
    for _ in range(5):
        a = random_fst(rng, 3, 7, 2)
        b = random_fst(rng, 3, 7, 2)
        ab = intersect(a, b)
        for L in (1, 2, 3):
            pa, pb, pab = pdf_sequences(a, L), pdf_sequences(b, L), pdf_sequences(ab, L)
            exp = {k: pa[k] * pb[k] for k in pa if k in pb and pa[k] * pb[k] > 0}
            assert pab.keys() == exp.keys()
            for k in exp:
                assert pab[k] == pytest.approx(exp[k], rel=1e-12)
    lm = estimate_phone_lm([[0, 1], [1, 0, 1]], 2, 2, 0)
    den = DenominatorGraph(den_graph(lm, Topology.chain()))
    norm = normalization_fst(den)
    assert norm.num_states == den.num_states + 1 and norm.start == den.num_states
    lex = read_lexicon(["x A", "y B"])
    num = numerator_graph(["x", "y"], lex, Topology.chain(), ["A", "B"], optional_silence=None)
    nn = add_normalization(num, den)
    # each path's weight gets init(state) times the den arc probs along it
    for L in (2, 3):
        pn, pd = pdf_sequences(num, L), pdf_sequences(nn, L)
        assert pd.keys() <= pn.keys() and pd
        for k, v in pd.items():
            assert 0 < v <= pn[k] + 1e-12


# ---------------------------------------------------------------- archives and tools
def _same_graph(a, b, tol):
    assert (a.num_states, a.num_arcs, a.start) == (b.num_states, b.num_arcs, b.start)
    ka = sorted(zip(a.src.tolist(), a.dst.tolist(), a.pdf.tolist()))
    kb = sorted(zip(b.src.tolist(), b.dst.tolist(), b.pdf.tolist()))
    assert ka == kb
    oa = np.lexsort((a.pdf, a.dst, a.src))
    ob = np.lexsort((b.pdf, b.dst, b.src))
    np.testing.assert_allclose(a.log_prob[oa], b.log_prob[ob], atol=tol)
    np.testing.assert_allclose(a.final, b.final, atol=tol)


def test_fst_archives(tmp_path):
    from chainfb.chain import read_fst_archive, read_kaldi_fst_archive, write_fst_archive, write_kaldi_fst_archive

    lex = read_lexicon(LEX)
    graphs = [(f"u{i}", numerator_graph(w, lex, Topology.chain(), PHONES))
              for i, w in enumerate((["a", "b"], ["c"]))]
    write_fst_archive(tmp_path / "g.txt", graphs)
    back = read_fst_archive(tmp_path / "g.txt")
    assert list(back) == ["u0", "u1"] and all(back[k] == g for k, g in graphs)
    with pytest.raises(ValueError, match="key"):
        write_fst_archive(tmp_path / "bad.txt", [("a b", graphs[0][1])])
    write_kaldi_fst_archive(tmp_path / "g.ark", graphs)
    kb = read_kaldi_fst_archive(tmp_path / "g.ark")
    for k, g in graphs:
        _same_graph(kb[k], g, 1e-6)  # Kaldi stores float32 costs


def test_tools_end_to_end(tmp_path):
    import subprocess
    import sys

    (tmp_path / "lexicon.txt").write_text("a A B\na A C\nb B\nc C A\nSIL SIL\n")
    (tmp_path / "phones.txt").write_text("<eps> 0\nSIL 1\nA 2\nB 3\nC 4\n#0 5\n")
    (tmp_path / "text").write_text("u1 a b\nu2 c a\nu3 a oov\nu4 c a b\n")
    (tmp_path / "utt2num_frames").write_text("u1 30\nu2 30\nu3 30\nu4 9\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "chainfb.cli.make_den_graph",
                        "--phones", str(tmp_path / "phones.txt"),
                        "--text", str(tmp_path / "text"), "--lexicon", str(tmp_path / "lexicon.txt"),
                        "--order", "3", "--out", str(tmp_path / "den.fst")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    den = DenominatorGraph.read(tmp_path / "den.fst")
    assert den.num_pdfs <= 10
    r = subprocess.run([sys.executable, "-m", "chainfb.cli.make_numerator_graphs",
                        "--lexicon", str(tmp_path / "lexicon.txt"), "--phones", str(tmp_path / "phones.txt"),
                        "--text", str(tmp_path / "text"), "--utt2num-frames", str(tmp_path / "utt2num_frames"),
                        "--frame-subsampling-factor", "3", "--den-graph", str(tmp_path / "den.fst"),
                        "--out", str(tmp_path / "num.txt"), "--rejected", str(tmp_path / "rej")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    from chainfb.chain import read_fst_archive

    got = read_fst_archive(tmp_path / "num.txt")
    assert set(got) == {"u1", "u2"}
    rej = (tmp_path / "rej").read_text()
    assert "u3" in rej and "OOV" in rej and "u4" in rej and "at least" in rej


def test_useful_states():
    from chainfb.chain.graphs.connect import useful_states

    # 0 -> 1 -> 2(final); 1 -> 3 (dead end); 4 -> 2 (unreachable); 5 isolated
    keep = useful_states(6, [0, 1, 1, 4, 2], [1, 2, 3, 2, 2], 0, [2])
    assert keep.tolist() == [True, True, True, False, False, False]
    assert not useful_states(3, [0], [1], 0, [2]).any()
