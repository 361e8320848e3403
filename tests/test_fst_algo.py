"""chainfb.fst_algo, the generic FST algorithms, against path enumeration on small random graphs; and the old
import paths of what moved into it (the same objects)."""
import math

import numpy as np
import pytest

import chainfb
from chainfb import Fst, fst_algo
from chainfb.testing import random_fst


def test_old_paths_are_the_same_objects():
    from chainfb.chain import graphs
    from chainfb.chain.graphs import connect, graph_compiler, lexicon, minimize, normalization

    assert minimize.determinize is graphs.determinize is fst_algo.determinize
    assert minimize.merge_equivalent_states is chainfb.chain.merge_equivalent_states is fst_algo.merge_equivalent_states
    assert minimize.trim is graphs.trim is fst_algo.trim
    assert connect.useful_states is fst_algo.useful_states
    assert normalization.intersect is chainfb.chain.intersect is fst_algo.intersect
    assert graph_compiler.min_frames is chainfb.chain.min_frames is fst_algo.min_frames
    assert graph_compiler.phone_index is chainfb.chain.phone_index is lexicon.phone_index


# ------------------------------------------------------------------ connect
def _reach(num_states, arcs, seeds):
    seen, todo = set(seeds), list(seeds)
    while todo:
        u = todo.pop()
        for s, d in arcs:
            if s == u and d not in seen:
                seen.add(d)
                todo.append(d)
    return np.array([s in seen for s in range(num_states)])


@pytest.mark.parametrize("seed", range(10))
def test_accessible_and_coaccessible(seed):
    rng = np.random.default_rng(seed)
    S = int(rng.integers(1, 8))
    src, dst = rng.integers(0, S, 10), rng.integers(0, S, 10)
    finals = rng.choice(S, size=int(rng.integers(0, S + 1)), replace=False)
    start = int(rng.integers(S))
    fwd = _reach(S, list(zip(src.tolist(), dst.tolist())), [start])
    bwd = _reach(S, list(zip(dst.tolist(), src.tolist())), finals.tolist())
    assert fst_algo.accessible(S, src, dst, start).tolist() == fwd.tolist()
    assert fst_algo.coaccessible(S, src, dst, finals).tolist() == bwd.tolist()
    assert fst_algo.useful_states(S, src, dst, start, finals).tolist() == (fwd & bwd).tolist()


def test_topological_order():
    # 0 -> 2 -> 1 -> 3, self-loop on 2, 4 unreachable
    src, dst = [0, 2, 2, 1, 4], [2, 2, 1, 3, 0]
    assert fst_algo.topological_order(5, src, dst, 0).tolist() == [0, 2, 1, 3]
    assert fst_algo.topological_order(5, src, dst, 0, last=3).tolist() == [0, 2, 1, 3]
    assert fst_algo.topological_order(5, src, dst, 0, last=4).tolist() == [0, 2, 1, 3, 4]  # appended anyway
    assert fst_algo.topological_order(5, src, dst, 0, last=2) is None  # 1 and 3 are reached through it only
    assert fst_algo.topological_order(5, src + [3], dst + [2], 0) is None  # the cycle 2 -> 1 -> 3 -> 2


@pytest.mark.parametrize("seed", range(10))
def test_topological_order_of_random_acyclic_graphs(seed):
    rng = np.random.default_rng(seed)
    S = 7
    perm = rng.permutation(S)  # arcs go forward in this order, plus self-loops
    a, b = rng.integers(0, S, 12), rng.integers(0, S, 12)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    src, dst = perm[lo], perm[hi]
    order = fst_algo.topological_order(S, src, dst, int(perm[0]))
    reach = _reach(S, list(zip(src.tolist(), dst.tolist())), [int(perm[0])])
    assert sorted(order.tolist()) == np.flatnonzero(reach).tolist()
    pos = {s: i for i, s in enumerate(order.tolist())}
    assert all(pos[s] < pos[d] for s, d in zip(src.tolist(), dst.tolist()) if s in pos and s != d)


# ------------------------------------------------------------------ epsilon removal
def _label_sequences(arcs, final, start, max_labels, max_eps, plus, eps):
    """{label tuple: total (plus over paths)} over the paths from ``start`` with at most ``max_labels``
    non-epsilon arcs and at most ``max_eps`` epsilon arcs in a row (enumeration)."""
    out = {}

    def walk(u, labels, w, eps_run):
        if u in final:
            key = tuple(labels)
            v = w + final[u]
            out[key] = plus(out[key], v) if key in out else v
        for a in arcs:
            if a[0] != u:
                continue
            if a[2] == eps:
                if eps_run < max_eps:
                    walk(a[1], labels, w + a[3], eps_run + 1)
            elif len(labels) < max_labels:
                walk(a[1], labels + [a[2]], w + a[3], 0)

    walk(start, [], 0.0, 0)
    return out


def _lae(a, b):
    return float(np.logaddexp(a, b))


@pytest.mark.parametrize("seed", range(12))
def test_remove_epsilons_sums_every_path(seed):
    rng = np.random.default_rng(seed)
    S = 4
    arcs = []
    for _ in range(10):
        u, v = sorted(rng.integers(0, S, 2).tolist())
        if u < v and rng.random() < 0.5:  # epsilons only go forward: no epsilon cycle
            arcs.append((u, v, -1, float(rng.normal()), -1))
        else:
            arcs.append((int(rng.integers(S)), int(rng.integers(S)), int(rng.integers(2)), float(rng.normal()),
                         int(rng.integers(3))))
    final = {int(s): float(rng.normal()) for s in rng.choice(S, 2, replace=False)}
    new_arcs, new_final = fst_algo.remove_epsilons(S, arcs, final)
    assert all(a[2] != -1 for a in new_arcs)
    want = _label_sequences(arcs, final, 0, 3, S, _lae, -1)  # forward epsilons: at most S - 1 in a row
    got = _label_sequences(new_arcs, new_final, 0, 3, 0, _lae, -1)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-12)
    # the labels after the first four fields follow their arcs
    assert {a[2:3] + a[4:] for a in new_arcs} <= {a[2:3] + a[4:] for a in arcs if a[2] != -1}


def test_remove_epsilons_refuses_an_epsilon_cycle():
    with pytest.raises(ValueError, match="the epsilon arcs of the phone graph form a cycle"):
        fst_algo.remove_epsilons(2, [(0, 1, -1, 0.0), (1, 0, -1, 0.0)], {1: 0.0}, what="phone graph")


@pytest.mark.parametrize("seed", range(12))
def test_remove_epsilons_max_keeps_the_best_paths(seed):
    # k2's convention: the last state is final, entered only by labelled arcs (label 3 here), left by none
    rng = np.random.default_rng(seed)
    S, A = 4, 12
    src, dst = rng.integers(0, S - 1, A), rng.integers(0, S - 1, A)
    label = np.where(rng.random(A) < 0.6, 0, rng.integers(1, 3, A))
    score = np.where(label == 0, -rng.random(A), rng.normal(size=A))  # epsilon cycles score <= 0
    into_final = rng.integers(0, S - 1, 2)
    src, dst = np.concatenate([src, into_final]), np.concatenate([dst, [S - 1, S - 1]])
    label, score = np.concatenate([label, [3, 3]]), np.concatenate([score, rng.normal(size=2)])
    n, ns, nd, nl, paths = fst_algo.remove_epsilons_max(S, src, dst, label, score)
    assert n == S and (nl != 0).all()
    for k, p in enumerate(paths):  # each result arc stands for a path of source arcs: epsilons, then its arc
        assert src[p[0]] == ns[k] and dst[p[-1]] == nd[k] and label[p[-1]] == nl[k]
        assert all(dst[a] == src[b] for a, b in zip(p, p[1:])) and (label[p[:-1]] == 0).all()
    old = list(zip(src.tolist(), dst.tolist(), label.tolist(), score.tolist()))
    new = list(zip(ns.tolist(), nd.tolist(), nl.tolist(), [float(score[p].sum()) for p in paths]))
    # epsilon cycles cannot help a best path: the simple ones (at most S - 2 epsilons in a row) are enough
    want = _label_sequences(old, {S - 1: 0.0}, 0, 3, S - 2, max, 0)
    got = _label_sequences(new, {S - 1: 0.0}, 0, 3, 0, max, 0)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-12)


def test_remove_epsilons_max_refuses_a_positive_epsilon_cycle():
    with pytest.raises(ValueError, match="graph: remove_epsilon needs an FSA without epsilon cycles of score > 0"):
        fst_algo.remove_epsilons_max(3, [0, 1, 1], [1, 0, 2], [0, 0, 1], [1.0, 1.0, 0.0], name="graph")


# ------------------------------------------------------------------ path lengths, arc order
@pytest.mark.parametrize("seed", range(10))
def test_path_lengths(seed):
    rng = np.random.default_rng(seed)
    f = random_fst(rng, num_states=5, num_arcs=7, num_pdfs=2, self_loops=bool(seed % 2))
    arcs = [(s, d) for s, d, _, lp in f.arcs() if lp > -math.inf]
    finals = {s for s, w in f.finals().items() if w > -math.inf}

    def lengths(limit):
        cur, out = {f.start}, set()
        for n in range(limit + 1):
            if cur & finals:
                out.add(n)
            cur = {d for s, d in arcs if s in cur}
        return out

    have = lengths(8)
    assert fst_algo.min_frames(f) == (min(have) if have else math.inf)
    for n in range(9):
        assert fst_algo.has_path_of_length(f, n) == (n in have)


def test_canonical_fst_puts_the_start_state_first():
    f, words = fst_algo.canonical_fst(3, 2, [1, 2, 0, 2], [2, 0, 1, 1], [0, 1, 2, 3], [0.0, -1.0, -2.0, -3.0],
                                      [0.0, -np.inf, -np.inf], [10, 11, 12, 13])
    assert f.src.tolist() == [2, 2, 0, 1] and f.pdf.tolist() == [1, 3, 2, 0] and words.tolist() == [11, 13, 12, 10]
    assert fst_algo.canonical_fst(3, 2, [1], [2], [0], [0.0], [0.0, 0.0, 0.0])[1] is None


@pytest.mark.parametrize("seed", range(6))
def test_intersect_multiplies_every_pdf_sequence(seed):
    from oracles.chain_graphs import pdf_sequences

    rng = np.random.default_rng(seed)
    a = random_fst(rng, num_states=3, num_arcs=6, num_pdfs=2)
    b = random_fst(rng, num_states=3, num_arcs=6, num_pdfs=2)
    ab = fst_algo.intersect(a, b)
    for L in range(4):
        pa, pb, pab = pdf_sequences(a, L), pdf_sequences(b, L), pdf_sequences(ab, L)
        want = {k: pa[k] * pb[k] for k in pa.keys() & pb.keys() if pa[k] * pb[k] > 0}
        assert pab.keys() == want.keys()
        for k in want:
            assert pab[k] == pytest.approx(want[k], rel=1e-12)


def test_every_algorithm_returns_fst():
    rng = np.random.default_rng(0)
    f = random_fst(rng, num_states=4, num_arcs=8, num_pdfs=3)
    for out in (fst_algo.trim(f)[0], fst_algo.merge_equivalent_states(f)[0], fst_algo.intersect(f, f)):
        assert isinstance(out, Fst) and out.start == 0
    assert all(callable(getattr(fst_algo, name)) for name in fst_algo.__all__)
