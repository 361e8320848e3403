"""chainfb.compat.k2: k2's FSA training API.

k2's documented examples (its docstrings and its own tests: text formats,
``ctc_topo`` arc counts and behaviour, ``linear_fsa``, ``intersect_dense``'s
total scores and gradients), path enumeration on tiny FSAs for
``get_tot_scores`` in both semirings and its gradients, ``gradcheck`` in
float64, the CTC loss against ``chainfb.ctc_loss`` and torch's, an
icefall-style LF-MMI step against ``chainfb.ChainLoss``, icefall's
training-graph compilers against enumeration, and errors naming the
argument.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import chainfb
from chainfb.compat import k2

from devices import OnCPU, OnCUDA, OnEmulatedKernels
from oracles import k2 as ref


def _lines(s: str) -> str:
    """``s`` with its blank lines dropped and each line's fields separated by one space."""
    return "\n".join(" ".join(line.split()) for line in s.strip().splitlines() if line.strip())


def _bits(x: float) -> int:
    return int(np.float32(x).view(np.int32))


ACCEPTOR = """
    0 1 2 -1.2
    0 2  10 -2.2
    1 6 -1  -3.2
    1 3  3  -4.2
    2 6 -1  -5.2
    2 4  2  -6.2
    3 6 -1  -7.2
    5 0  1  -8.2
    6
"""

TRANSDUCER = """
    0 1 2 22  -1.2
    0 2  10 100 -2.2
    1 6 -1  16  -4.2
    1 3  3  33  -3.2
    2 6 -1  26  -5.2
    2 4  2  22  -6.2
    3 6 -1  36  -7.2
    5 0  1  50  -8.2
    6
"""

SIMPLE = """
    0 1 1 1.0
    1 1 1 50.0
    1 2 2 2.0
    2 3 -1 3.0
    3
"""


# ----------------------------------------------------------------- text formats (k2's tests)
class TestText:
    def test_acceptor_from_str(self):
        fsa = k2.Fsa.from_str(ACCEPTOR)
        assert _lines(k2.to_str(fsa)) == _lines(ACCEPTOR)
        arcs = fsa.arcs.values()[:, :-1]
        assert arcs.dtype == torch.int32 and arcs.shape == (8, 3)
        assert arcs[0].tolist() == [0, 1, 2]
        assert torch.allclose(fsa.scores, torch.tensor([-1.2, -2.2, -3.2, -4.2, -5.2, -6.2, -7.2, -8.2]))
        assert fsa.scores.dtype == torch.float32 and fsa.labels.dtype == torch.int32
        assert fsa.shape == (7, None) and fsa.num_arcs == 8
        assert str(fsa).startswith("k2.Fsa: 0 1 2 -1.2\n")
        assert 'properties_str = "Valid|Nonempty|EpsilonFree".' in str(fsa)

    def test_acceptor_from_tensor(self):
        rows = [(0, 1, 2, -1.2), (0, 2, 10, -2.2), (1, 6, -1, -3.2), (1, 3, 3, -4.2), (2, 6, -1, -5.2),
                (2, 4, 2, -6.2), (3, 6, -1, -7.2), (5, 0, 1, -8.2)]
        t = torch.tensor([[s, d, lab, _bits(w)] for s, d, lab, w in rows], dtype=torch.int32)
        fsa = k2.Fsa(t)
        assert k2.to_str(fsa) == k2.to_str(k2.Fsa.from_str(ACCEPTOR))
        assert torch.equal(fsa.arcs.values(), t)

    def test_transducer_from_str(self):
        for kwargs in ({"acceptor": False}, {"num_aux_labels": 1}, {"aux_label_names": ["aux_labels"]}):
            fsa = k2.Fsa.from_str(TRANSDUCER, **kwargs)
            assert fsa.aux_labels.dtype == torch.int32
            assert fsa.aux_labels.tolist() == [22, 100, 16, 33, 26, 22, 36, 50]
            assert _lines(k2.to_str(fsa)) == _lines(TRANSDUCER)

    def test_two_aux_labels_and_ragged(self):
        s = """
            0 1 1 10 20 [ 5 6 ] 0.5
            1 2 -1 -1 -1 [ ] 0.25
            2
        """
        fsa = k2.Fsa.from_str(s, num_aux_labels=2, ragged_label_names=["rag"])
        assert fsa.aux_labels.tolist() == [10, -1] and fsa.aux_labels2.tolist() == [20, -1]
        assert fsa.rag.tolist() == [[5, 6], []]
        assert _lines(k2.to_str(fsa)) == _lines("""
            0 1 1 10 20 [ 5 6 ] 0.5
            1 2 -1 -1 -1 [ ] 0.25
            2""")

    def test_from_openfst(self):
        # k2's test: costs negated, finals become -1 arcs into a super-final state
        s = """
            0 1 2 -1.2
            0 2  10 -2.2
            1 6  1  -3.2
            1 3  3  -4.2
            2 6  2  -5.2
            2 4  2  -6.2
            3 6  3  -7.2
            5 0  1  -8.2
            7
            6 -9.2
        """
        fsa = k2.Fsa.from_openfst(s, acceptor=True)
        assert fsa.num_arcs == 10 and fsa.shape == (9, None)
        assert torch.allclose(fsa.scores, torch.tensor([1.2, 2.2, 3.2, 4.2, 5.2, 6.2, 7.2, 8.2, 9.2, 0]))
        assert _lines(k2.to_str(fsa)) == _lines("""
            0 1 2 1.2
            0 2 10 2.2
            1 6 1 3.2
            1 3 3 4.2
            2 6 2 5.2
            2 4 2 6.2
            3 6 3 7.2
            5 0 1 8.2
            6 8 -1 9.2
            7 8 -1 -0
            8""")
        # written back in OpenFst form: a final arc is a final line with its cost
        assert _lines(k2.to_str(fsa, openfst=True)).endswith("5 0 1 -8.2\n6 -9.2\n7 0")

    def test_openfst_start_state_and_transducer(self):
        s = """
            2 1 3 30 0.5
            1 0 4 40
            0 1.5
            1 Infinity
        """
        fsa = k2.Fsa.from_openfst(s, acceptor=False)
        # state 2 (the first line's source) becomes 0 and 0 becomes 2; super-final state 3
        assert _lines(k2.to_str(fsa)) == _lines("""
            0 1 3 30 -0.5
            1 2 4 40 -0
            2 3 -1 -1 -1.5
            3""")

    @pytest.mark.parametrize("openfst", [False, True])
    def test_round_trip(self, openfst):
        fsa = k2.Fsa.from_str("""
            0 1 0 7 -0.5
            0 2 3 8 1.25
            1 2 2 0 -2
            1 3 -1 -1 0.75
            2 2 1 9 0
            2 3 -1 -1 -3.5
            3
        """, acceptor=False)
        text = k2.to_str(fsa, openfst=openfst)
        back = k2.Fsa.from_str(text, acceptor=False, openfst=openfst)
        assert k2.to_str(back) == k2.to_str(fsa)
        assert torch.equal(back.scores, fsa.scores) and torch.equal(back.aux_labels, fsa.aux_labels)

    @pytest.mark.parametrize("text, match", [
        ("0 1 x 0.5\n1", "label 'x'"),
        ("0 1 1 0.5\n1 2 -1\n2\n3", "already given"),
        ("0 2 -1 0.5\n1", "largest state"),
        ("1 2 -1 0\n0 1 3 0\n2", "non-decreasing"),
        ("0 1 5 0\n1 2 -1 0\n2 1 3 0\n2", "leave the final state"),
        ("0 1 -1 0\n1 2 3 0\n2", "label -1"),
        ("0 1 1 0.5", "final-state line"),
        ("0 1 1 2 0.5\n1", "unexpected fields"),
    ])
    def test_bad_text(self, text, match):
        with pytest.raises(ValueError, match=match):
            k2.Fsa.from_str(text)

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="num_aux_labels: give at most one"):
            k2.Fsa.from_str("0 1 -1 0\n1", acceptor=True, num_aux_labels=1)
        with pytest.raises(TypeError, match="acceptor"):
            k2.Fsa.from_str("0 1 -1 0\n1", acceptor="no")
        with pytest.raises(TypeError, match="s: expected str"):
            k2.Fsa.from_str(b"0 1 -1 0\n1")
        with pytest.raises(ValueError, match="aux label 1 '0.5' is not an integer"):
            k2.Fsa.from_str("0 1 2 0.5\n1 2 -1 0\n2", acceptor=False)

    def test_empty(self):
        fsa = k2.Fsa.from_str("")
        assert fsa.shape == (0, None) and fsa.num_arcs == 0 and k2.to_str(fsa) == ""


# ----------------------------------------------------------------- the Fsa object
class TestFsa:
    def test_getitem_gradients(self):
        fsa0 = k2.Fsa.from_str("0 1 1 0.1\n1 2 2 0.2\n2 3 -1 0.3\n3").requires_grad_(True)
        fsa1 = k2.Fsa.from_str("0 1 -1 0.4\n1").requires_grad_(True)
        vec = k2.create_fsa_vec([fsa0, fsa1])
        assert vec.shape == (2, None, None) and vec.requires_grad
        new0 = vec[0]
        assert new0.shape == (4, None)
        (new0.scores * torch.arange(3)).sum().backward()
        assert fsa0.scores.grad.tolist() == [0.0, 1.0, 2.0]
        (vec[1].scores * 5).sum().backward()
        assert fsa1.scores.grad.tolist() == [5.0]
        assert vec.arcs.row_splits(1).tolist() == [0, 4, 6] and vec.arcs.row_splits(2).tolist() == [0, 1, 2, 3, 3, 4, 4]
        with pytest.raises(IndexError, match="i: expected an index in"):
            vec[2]
        with pytest.raises(TypeError, match="FsaVec"):
            fsa0[0]

    def test_invert(self):
        fsa0 = k2.Fsa.from_str("0 1 1 4 0.1\n1 2 2 5 0.2\n2 3 -1 -1 0.3\n3", acceptor=False)
        fsa1 = k2.Fsa.from_str("0 1 4 1 0.1\n1 2 5 2 0.2\n2 3 -1 -1 0.3\n3", acceptor=False)
        fsa0.invert_()
        assert str(fsa0) == str(fsa1)
        assert str(k2.invert(fsa1)) != str(fsa1)
        with pytest.raises(ValueError, match="aux_labels"):
            k2.Fsa.from_str("0 1 -1 0\n1").invert_()

    def test_labels_setter_fixes_final_labels(self):
        fsa = k2.Fsa.from_str(ACCEPTOR)
        fsa.labels = torch.zeros(8, dtype=torch.int32)
        assert fsa.labels.tolist() == [0, 0, -1, 0, -1, 0, -1, 0]
        with pytest.raises(TypeError, match="labels: expected an int32"):
            fsa.labels = torch.zeros(8)
        with pytest.raises(ValueError, match="aux_labels: expected a tensor with 8"):
            fsa.aux_labels = torch.zeros(3, dtype=torch.int32)
        with pytest.raises(TypeError, match="scores: expected a float32 or float64"):
            fsa.scores = torch.zeros(8, dtype=torch.int64)
        with pytest.raises(AttributeError, match="shape: cannot be assigned"):
            fsa.shape = (3, None)
        fsa.symbols = "a table"
        assert fsa.symbols == "a table"
        del fsa.symbols
        assert not hasattr(fsa, "symbols")

    def test_properties(self):
        fsa = k2.Fsa.from_str(ACCEPTOR)
        assert fsa.properties == k2.fsa_properties.VALID | k2.fsa_properties.NONEMPTY | k2.fsa_properties.EPSILON_FREE
        line = k2.linear_fsa([1, 0, 2])
        assert line.properties_str == ("Valid|Nonempty|TopSorted|TopSortedAndAcyclic|ArcSorted|"
                                       "ArcSortedAndDeterministic|MaybeAccessible|MaybeCoaccessible")

    def test_dict_round_trip_and_copies(self):
        fsa = k2.Fsa.from_str(TRANSDUCER, acceptor=False)
        back = k2.Fsa.from_dict(fsa.as_dict())
        assert str(back) == str(fsa)
        fsa.requires_grad_(True)
        assert not fsa.detach().requires_grad and fsa.clone().requires_grad
        assert fsa.to("cpu") is fsa and fsa.is_cpu() and not fsa.is_cuda()

    def test_index_and_cat(self):
        a = k2.linear_fsa([[1], [2, 3], [4]])
        picked = k2.index_fsa(a, torch.tensor([2, 0, 0], dtype=torch.int32))
        assert [k2.to_str(picked[i]) for i in range(3)] == [k2.to_str(a[2]), k2.to_str(a[0]), k2.to_str(a[0])]
        both = k2.cat([a, picked])
        assert both.shape == (6, None, None) and k2.to_str(both[4]) == k2.to_str(a[0])
        with pytest.raises(ValueError, match="indexes: expected indexes in"):
            k2.index_fsa(a, torch.tensor([3]))
        with pytest.raises(ValueError, match="src: expected an FsaVec"):
            k2.index_fsa(a[0], torch.tensor([0]))


# ----------------------------------------------------------------- constructors
class TestConstructors:
    def test_linear_fsa(self):
        assert _lines(k2.to_str(k2.linear_fsa([2, 5]))) == _lines("0 1 2 0\n1 2 5 0\n2 3 -1 0\n3")
        vec = k2.linear_fsa([[1, 2], [3]])
        assert vec.shape == (2, None, None)
        assert _lines(k2.to_str(vec[1])) == _lines("0 1 3 0\n1 2 -1 0\n2")
        assert str(k2.linear_fsa(k2.RaggedTensor([[1, 2], [3]]))) == str(vec)
        assert k2.linear_fsa([]).shape == (2, None)
        with pytest.raises(ValueError, match="labels: negative label"):
            k2.linear_fsa([1, -1])
        fst = k2.linear_fst([1, 2], [7, 0])
        assert fst.aux_labels.tolist() == [7, 0, -1]

    @pytest.mark.parametrize("n", [1, 2, 3, 5])
    def test_ctc_topo_arc_counts(self, n):
        standard = k2.ctc_topo(n)
        modified = k2.ctc_topo(n, modified=True)
        assert standard.num_arcs == (n + 1) * (n + 2) and standard.shape == (n + 2, None)
        assert modified.num_arcs == 4 * n + 2 and modified.shape == (n + 2, None)
        # a repeat emits nothing in the standard topology: aux label 0 on i -> i
        lab, aux = standard.labels.tolist(), standard.aux_labels.tolist()
        v = standard.arcs.values()
        for a in range(standard.num_arcs):
            s, d = int(v[a, 0]), int(v[a, 1])
            assert lab[a] == (-1 if d == n + 1 else d)
            assert aux[a] == (0 if s == d else lab[a])

    def test_ctc_topo_text(self):
        assert _lines(k2.to_str_simple(k2.ctc_topo(1, modified=True))) == _lines("""
            0 0 0 0 0
            0 0 1 1 0
            0 1 1 1 0
            0 2 -1 -1 0
            1 1 1 0 0
            1 0 1 0 0
            2""")

    def _lattice_aux(self, graph, frames):
        # (k2's test intersects the composed graph directly; intersect needs it arc-sorted)
        lat = k2.connect(k2.intersect(k2.arc_sort(graph), k2.linear_fsa(frames), treat_epsilons_specially=False))
        if lat.num_arcs == 0:
            return None
        aux = lat.aux_labels[lat.aux_labels != 0]
        return aux[:-1].tolist()

    def test_ctc_topo_no_repeated(self):
        # k2's ctc_topo_test: standard and modified agree without repeated neighbours
        standard = k2.compose(k2.ctc_topo(3), k2.linear_fsa([1, 2, 3]))
        modified = k2.compose(k2.ctc_topo(3, modified=True), k2.linear_fsa([1, 2, 3]))
        for frames in ([1, 1, 1, 0, 0, 2, 2, 3, 3], [1, 1, 0, 0, 2, 2, 0, 3, 3]):
            assert self._lattice_aux(standard, frames) == self._lattice_aux(modified, frames) == [1, 2, 3]

    def test_ctc_topo_with_repeated(self):
        standard = k2.compose(k2.ctc_topo(2), k2.linear_fsa([1, 2, 2]))
        modified = k2.compose(k2.ctc_topo(2, modified=True), k2.linear_fsa([1, 2, 2]))
        frames = [1, 1, 2, 2, 0, 2, 2, 0, 0]
        assert self._lattice_aux(standard, frames) == self._lattice_aux(modified, frames) == [1, 2, 2]
        # without a blank between the two 2s the standard topology has no path
        assert self._lattice_aux(standard, [1, 1, 2, 2, 0, 0]) is None
        assert self._lattice_aux(modified, [1, 1, 2, 2, 0, 0]) == [1, 2, 2]

    def test_ctc_graph_structure(self):
        g = k2.ctc_graph([[1, 2, 2]])
        assert g.shape == (1, None, None) and g[0].shape == (8, None)
        assert _lines(k2.to_str(g[0])) == _lines("""
            0 0 0 0 0
            0 1 1 1 0
            1 2 0 0 0
            1 1 1 0 0
            1 3 2 2 0
            2 2 0 0 0
            2 3 2 2 0
            3 4 0 0 0
            3 3 2 0 0
            4 4 0 0 0
            4 5 2 2 0
            5 6 0 0 0
            5 5 2 0 0
            5 7 -1 -1 0
            6 6 0 0 0
            6 7 -1 -1 0
            7""")
        assert k2.ctc_graph([[1, 2, 2]], modified=True).num_arcs == 17
        assert str(k2.ctc_graph(k2.RaggedTensor([[1, 2], [3]]))) == str(k2.ctc_graph([[1, 2], [3]]))
        with pytest.raises(ValueError, match="symbols: sequence 0 has symbol 0"):
            k2.ctc_graph([[1, 0]])
        with pytest.raises(TypeError, match="symbols: expected a list of lists"):
            k2.ctc_graph([1, 2])

    @pytest.mark.parametrize("modified", [False, True])
    def test_ctc_graph_equals_composed_topology(self, modified, rng):
        symbols = [[1, 2, 2], [3], [2, 1, 3, 3]]
        graphs = k2.ctc_graph(symbols, modified=modified)
        composed = k2.create_fsa_vec([k2.connect(k2.compose(k2.ctc_topo(3, modified=modified), k2.linear_fsa(s)))
                                      for s in symbols])
        lp = torch.randn(3, 9, 4, dtype=torch.float64).log_softmax(-1)
        seg = torch.tensor([[0, 0, 9], [1, 1, 6], [2, 0, 8]], dtype=torch.int32)
        dense = k2.DenseFsaVec(lp, seg)
        for log in (True, False):
            a = k2.intersect_dense(graphs, dense, 10.0).get_tot_scores(log_semiring=log, use_double_scores=True)
            b = k2.intersect_dense(composed, dense, 10.0).get_tot_scores(log_semiring=log, use_double_scores=True)
            torch.testing.assert_close(a, b)


# ----------------------------------------------------------------- algorithms
class TestAlgorithms:
    def test_arc_sort(self):
        fsa = k2.Fsa.from_str("0 2 -1 0\n0 1 5 0\n0 1 2 0\n0 0 2 0\n1 2 -1 0\n2")
        out, amap = k2.arc_sort(fsa, ret_arc_map=True)
        assert out.labels.tolist() == [2, 2, 5, -1, -1] and amap.tolist() == [3, 2, 1, 0, 4]
        assert out.properties & k2.fsa_properties.ARC_SORTED
        assert k2.arc_sort(out) is out

    def test_add_epsilon_self_loops(self):
        fsa = k2.Fsa.from_str("0 1 3 7 0.5\n1 2 -1 -1 0.25\n2", acceptor=False).requires_grad_(True)
        out, amap = k2.add_epsilon_self_loops(fsa, ret_arc_map=True)
        assert _lines(k2.to_str(out)) == _lines("0 0 0 0 0\n0 1 3 7 0.5\n1 1 0 0 0\n1 2 -1 -1 0.25\n2")
        assert amap.tolist() == [-1, 0, -1, 1]
        out.scores.sum().backward()
        assert fsa.scores.grad.tolist() == [1.0, 1.0]
        assert k2.remove_epsilon_self_loops(out).num_arcs == 2

    def test_connect(self):
        fsa = k2.Fsa.from_str("0 1 1 0\n0 2 2 0\n1 4 -1 0\n2 3 3 0\n4")
        out = k2.connect(fsa)
        assert _lines(k2.to_str(out)) == _lines("0 1 1 0\n1 2 -1 0\n2")
        assert k2.connect(out) is out
        assert k2.connect(k2.Fsa.from_str("0 1 1 0\n2 3 -1 0\n3")).shape == (0, None)

    def test_top_sort(self):
        fsa = k2.Fsa.from_str("0 2 1 0.5\n1 3 -1 0.25\n2 2 3 0.125\n2 1 2 1\n3")
        out = k2.top_sort(fsa)
        assert out.properties & k2.fsa_properties.TOPSORTED
        assert _lines(k2.to_str(out)) == _lines("0 1 1 0.5\n1 1 3 0.125\n1 2 2 1\n2 3 -1 0.25\n3")
        with pytest.raises(ValueError, match="fsa: top_sort needs an FSA without cycles"):
            k2.top_sort(k2.Fsa.from_str("0 1 1 0\n1 0 2 0\n1 2 -1 0\n2"))

    def test_remove_epsilon(self):
        # two epsilon paths into state 3: the better one (max) is kept, as k2's tropical equivalence
        fsa = k2.Fsa.from_str("""
            0 1 0 10 -1
            0 2 0 20 -0.5
            0 3 5 50 -2
            1 3 0 30 -1
            2 3 0 40 -0.25
            3 4 6 60 -0.125
            4 5 -1 -1 0
            5
        """, acceptor=False)
        out = k2.remove_epsilon(fsa)
        assert out.properties & k2.fsa_properties.EPSILON_FREE
        assert ref.label_sequence_weights(out, 4, log_semiring=False) == pytest.approx(
            ref.label_sequence_weights(fsa, 6, log_semiring=False))
        assert isinstance(out.aux_labels, k2.RaggedTensor)
        # the arc reading 6 from the start carries the best epsilon path's aux labels, 20 and 40
        lab, aux = out.labels.tolist(), out.aux_labels.tolist()
        v = out.arcs.values()
        first = [a for a in range(out.num_arcs) if int(v[a, 0]) == 0 and lab[a] == 6]
        assert [aux[a] for a in first] == [[20, 40, 60]]
        with pytest.raises(ValueError, match="epsilon cycles of score > 0"):
            k2.remove_epsilon(k2.Fsa.from_str("0 1 0 1\n1 0 0 1\n1 2 -1 0\n2"))

    def test_remove_epsilon_and_add_self_loops(self):
        free = k2.linear_fsa([1, 2])
        out = k2.remove_epsilon_and_add_self_loops(free)
        assert str(out) == str(k2.add_epsilon_self_loops(free))
        eps = k2.Fsa.from_str("0 1 0 0\n1 2 3 0\n2 3 -1 0\n3")
        out = k2.remove_epsilon_and_add_self_loops(eps)
        assert out.labels.tolist() == [0, 3, 0, -1]

    @pytest.mark.parametrize("treat", [False, True])
    def test_intersect_weights(self, treat):
        # epsilons on one side only: every label sequence both accept gets the sum of the two weights
        # (log-sums: the paths pair up); with treat_epsilons_specially=False 0 is an ordinary label
        a = k2.arc_sort(k2.Fsa.from_str("0 1 1 -1\n0 1 0 -2\n1 1 2 -0.5\n1 2 -1 0\n2"))
        b = k2.arc_sort(k2.Fsa.from_str("0 0 2 -0.25\n0 1 1 -3\n0 1 0 -0.5\n1 1 2 -1\n1 2 -1 -1\n2"))
        if treat:
            b = k2.remove_epsilon(b)
        out = k2.intersect(a, b, treat_epsilons_specially=treat)
        assert out.shape[0] >= 3 and not out.requires_grad
        got = ref.label_sequence_weights(out, 7, keep_epsilon=not treat)
        wa = ref.label_sequence_weights(a, 7, keep_epsilon=not treat)
        wb = ref.label_sequence_weights(b, 7, keep_epsilon=not treat)
        common = {k: wa[k] + wb[k] for k in wa if k in wb and len(k) <= 4}
        assert common and {k: v for k, v in got.items() if len(k) <= 4} == pytest.approx(common)

    def test_intersect_has_no_epsilon_filter(self):
        # k2's host intersection: an epsilon on each side gives two paths (either order)
        a = k2.Fsa.from_str("0 1 0 0\n1 2 -1 0\n2")
        out = k2.connect(k2.intersect(a, a, treat_epsilons_specially=True))
        assert ref.label_sequence_weights(out, 4) == pytest.approx({(): math.log(2.0)})
        assert ref.label_sequence_weights(k2.intersect(a, a, treat_epsilons_specially=False), 4) == {(): 0.0}

    def test_intersect_attributes_and_grad(self):
        a = k2.Fsa.from_str("0 1 1 7 0.5\n1 2 -1 -1 0\n2", acceptor=False).requires_grad_(True)
        b = k2.Fsa.from_str("0 0 0 0.25\n0 1 1 1\n1 2 -1 0\n2").requires_grad_(True)
        out, amap, bmap = k2.intersect(a, b, treat_epsilons_specially=True, ret_arc_maps=True)
        assert amap.tolist() == [-1, 0, 1] and bmap.tolist() == [0, 1, 2]
        assert out.aux_labels.tolist() == [0, 7, -1]  # the filler where a has no arc
        out.scores.sum().backward()
        assert a.scores.grad.tolist() == [1.0, 1.0] and b.scores.grad.tolist() == [1.0, 1.0, 1.0]
        with pytest.raises(ValueError, match="b_fsa: must be arc-sorted"):
            k2.intersect(a, k2.Fsa.from_str("0 1 2 0\n0 1 1 0\n1 2 -1 0\n2"))

    def test_compose(self):
        a = k2.Fsa.from_str("0 1 1 10 0.5\n0 1 2 20 0\n1 2 -1 -1 0\n2", acceptor=False)
        b = k2.arc_sort(k2.Fsa.from_str("0 1 20 200 1\n1 2 -1 -1 0\n2", acceptor=False))
        out = k2.connect(k2.compose(a, b))
        assert _lines(k2.to_str(out)) == _lines("0 1 2 200 1\n1 2 -1 -1 0\n2")
        acc = k2.connect(k2.compose(a, k2.linear_fsa([10]), inner_labels=None))
        assert acc.labels.tolist() == [1, -1] and acc.aux_labels.tolist() == [10, -1]
        with pytest.raises(ValueError, match="a_fsa: compose needs"):
            k2.compose(k2.linear_fsa([1]), b)

    def test_determinize(self):
        fsa = k2.Fsa.from_str("0 1 1 -1\n0 2 1 -0.5\n1 3 2 -1\n1 4 -1 0\n2 3 2 -2\n3 4 -1 -0.25\n4")
        out = k2.determinize(fsa)
        assert out.properties & k2.fsa_properties.ARC_SORTED_AND_DETERMINISTIC
        assert ref.label_sequence_weights(out, 5, log_semiring=False) == pytest.approx(
            ref.label_sequence_weights(fsa, 5, log_semiring=False))
        with pytest.raises(ValueError, match="requires? grad"):
            k2.determinize(fsa.requires_grad_(True))


# ----------------------------------------------------------------- dense intersection
SMALL_FSAS = [
    SIMPLE,
    # blanks, parallel arcs, two final arcs from one state, a dead end
    "0 0 0 -0.5\n0 1 1 0.25\n0 1 1 -1\n0 2 2 0.5\n1 1 2 -0.25\n1 3 -1 0.5\n2 3 -1 -0.5\n2 2 0 0\n2 1 1 0.75\n"
    "2 3 -1 1\n3",
    "0 1 2 0\n1 1 0 0.5\n1 2 0 0\n1 3 -1 0\n2 3 -1 -1\n3",
]


def _fsa_vec(texts, dtype=torch.float64, requires_grad=True):
    fsas = [k2.Fsa.from_str(t) for t in texts]
    for f in fsas:
        f.scores = f.scores.to(dtype)
        f.requires_grad_(requires_grad)
    return fsas, k2.create_fsa_vec(fsas)


class DenseCases:
    """``intersect_dense`` against enumeration (run per device)."""

    def _setup(self, rng, dtype=torch.float64):
        lp = self.tensor(rng.normal(size=(2, 6, 3)), dtype).log_softmax(-1).detach().requires_grad_(True)
        seg = torch.tensor([[0, 0, 4], [1, 2, 3], [0, 1, 5]], dtype=torch.int32)
        return lp, seg

    @pytest.mark.parametrize("log_semiring", [True, False])
    def test_against_enumeration(self, rng, log_semiring):
        lp, seg = self._setup(rng)
        fsas, vec = _fsa_vec(SMALL_FSAS)
        vec = vec.to(self.device)
        dense = k2.DenseFsaVec(lp, seg)
        tot = k2.intersect_dense(vec, dense, 10.0).get_tot_scores(log_semiring=log_semiring, use_double_scores=True)
        assert tot.dtype == torch.float64 and tot.device == lp.device
        (tot * torch.tensor([1.0, -2.0, 0.5], dtype=tot.dtype, device=tot.device)).sum().backward()
        got_lp, got_sc = lp.grad.clone(), [f.scores.grad.clone() for f in fsas]

        lp2 = lp.detach().cpu().requires_grad_(True)
        sc2 = [f.scores.detach().clone().requires_grad_(True) for f in fsas]
        want = torch.stack([ref.dense_tot_score(fsas[i], sc2[i], lp2[n, s:s + d], log_semiring)
                            for i, (n, s, d) in enumerate(seg.tolist())])
        (want * torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)).sum().backward()
        torch.testing.assert_close(tot.detach().cpu(), want.detach())
        torch.testing.assert_close(got_lp.cpu(), lp2.grad)
        for g, w in zip(got_sc, sc2):
            torch.testing.assert_close(g, w.grad)

    def test_k2_example(self):
        # k2's intersect_dense test_simple (expected values computed there with gtn)
        fsa = k2.Fsa.from_str(SIMPLE).to(self.device).requires_grad_(True)
        log_prob = self.tensor([[[0.1, 0.2, 0.3], [0.04, 0.05, 0.06]]], torch.float32).requires_grad_(True)
        dense = k2.DenseFsaVec(log_prob, torch.tensor([[0, 0, 2]], dtype=torch.int32))
        tot = k2.intersect_dense(k2.create_fsa_vec([fsa]), dense, 100000).get_tot_scores(
            log_semiring=False, use_double_scores=False)
        assert tot.dtype == torch.float32
        tot.sum().backward()
        torch.testing.assert_close(tot.detach().cpu(), torch.tensor([1.2 + 2.06 + 3.0]))
        assert fsa.scores.grad.tolist() == [1.0, 0.0, 1.0, 1.0]
        assert log_prob.grad.cpu().reshape(-1).tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]

    @pytest.mark.parametrize("use_map", [True, False])
    def test_k2_two_dense(self, use_map):
        # k2's test_two_dense: the same FSA twice, on segments of 3 and 2 frames (or both on the first)
        fsa = k2.Fsa.from_str(SIMPLE).to(self.device).requires_grad_(True)
        lp = self.tensor([[[0.1, 0.2, 0.3], [0.04, 0.05, 0.06], [0.0, 0.0, 0.0]],
                          [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.0, 0.0, 0.0]]], torch.float32)
        dense = k2.DenseFsaVec(lp, torch.tensor([[0, 0, 3], [1, 0, 2]], dtype=torch.int32))
        m = torch.tensor([0, 0], dtype=torch.int32) if use_map else None
        lat = k2.intersect_dense(k2.create_fsa_vec([fsa, fsa]), dense, 100000, a_to_b_map=m)
        assert lat.shape == (2, None, None)
        lat.get_tot_scores(log_semiring=False, use_double_scores=False).sum().backward()
        assert fsa.scores.grad.tolist() == ([2.0, 2.0, 2.0, 2.0] if use_map else [2.0, 1.0, 2.0, 2.0])

    def test_gradcheck(self, rng):
        lp, seg = self._setup(rng)
        fsas, _ = _fsa_vec(SMALL_FSAS)
        dev = self.device

        def total(log_probs, *scores):
            vec = k2.create_fsa_vec([k2.Fsa.from_str(t) for t in SMALL_FSAS])
            vec.scores = torch.cat(scores)
            vec = vec.to(dev)
            return k2.intersect_dense(vec, k2.DenseFsaVec(log_probs, seg), 10.0).get_tot_scores(True, True)

        scores = [f.scores.detach().clone().requires_grad_(True) for f in fsas]
        assert torch.autograd.gradcheck(total, (lp.detach().requires_grad_(True), *scores))

    def test_shared_graph_and_float32(self, rng):
        lp, seg = self._setup(rng, torch.float32)
        den = k2.Fsa.from_str(SMALL_FSAS[1]).to(self.device)
        dense = k2.DenseFsaVec(lp, seg)
        tot = k2.intersect_dense_pruned(k2.create_fsa_vec([den]), dense, 20.0, 8.0, 30, 10000).get_tot_scores(
            log_semiring=True, use_double_scores=False)
        assert tot.dtype == torch.float32
        rep = k2.index_fsa(k2.create_fsa_vec([den]), torch.zeros(3, dtype=torch.int32))
        tot2 = k2.intersect_dense(rep, dense, 8.0).get_tot_scores(log_semiring=True, use_double_scores=True)
        want = torch.stack([ref.dense_tot_score(den, den.scores.cpu(), lp.detach().cpu()[n, s:s + d].double())
                            for n, s, d in seg.tolist()])
        torch.testing.assert_close(tot.detach().cpu().double(), want, rtol=1e-5, atol=1e-5)
        # use_double_scores: the engine runs in float64 on float32 log-probs, as k2 accumulates in double
        torch.testing.assert_close(tot2.detach().cpu(), want, rtol=1e-12, atol=1e-12)

    def test_no_path_and_nan(self, rng):
        lp, seg = self._setup(rng)
        lp = lp.detach().clone()
        lp[1, 3, 0] = float("nan")  # inside segment 1 only
        lp.requires_grad_(True)
        # "0 1 1 .. -1": exactly one frame, so no path on segments of 3-5 frames
        vec = k2.create_fsa_vec([k2.Fsa.from_str("0 1 1 0\n1 2 -1 0\n2"), k2.Fsa.from_str(SMALL_FSAS[1]),
                                 k2.Fsa.from_str(SMALL_FSAS[1])]).to(self.device)
        tot = k2.intersect_dense(vec, k2.DenseFsaVec(lp, seg), 10.0).get_tot_scores(True, True)
        assert tot[0].item() == -math.inf and math.isnan(tot[1].item()) and math.isfinite(tot[2].item())
        tot[[0, 2]].sum().backward()
        g = lp.grad.cpu()
        # segment 0 (no path) gives nothing, segment 2 covers sequence 0's frames 1..5; the NaN stays in
        # segment 1's frames (sequence 1, frames 2..4)
        assert torch.isfinite(g[0]).all() and g[0, 0].abs().sum() == 0 and g[0, 1:6].abs().sum() > 0
        assert torch.isfinite(g[1, :2]).all() and torch.isfinite(g[1, 5:]).all()

    def test_truncate_and_duration(self, rng):
        lp, _ = self._setup(rng)
        dense = k2.DenseFsaVec(lp, torch.tensor([[1, 4, 5]], dtype=torch.int32), allow_truncate=3)
        assert dense.duration.tolist() == [2] and dense.dim0() == 1
        assert dense.scores.shape == (3, 4)
        assert dense.scores[2].tolist() == [0.0] + [-math.inf] * 3
        with pytest.raises(ValueError, match="exceeds T=6"):
            k2.DenseFsaVec(lp, torch.tensor([[1, 4, 5]], dtype=torch.int32))


@st.composite
def _random_case(draw):
    """A random FSA in k2's form (final state last, entered by -1 arcs only) and log-probs ``[T, C]``."""
    S = draw(st.integers(2, 5))
    C = draw(st.integers(1, 3))
    arcs = draw(st.lists(st.tuples(st.integers(0, S - 2), st.integers(0, S - 2), st.integers(0, C - 1),
                                   st.floats(-2, 1)), max_size=8))
    finals = draw(st.lists(st.tuples(st.integers(0, S - 2), st.floats(-2, 1)), min_size=1, max_size=3))
    rows = sorted([(s, d, lab, w) for s, d, lab, w in arcs] + [(s, S - 1, -1, w) for s, w in finals],
                  key=lambda r: r[0])
    text = "".join(f"{s} {d} {lab} {w!r}\n" for s, d, lab, w in rows) + f"{S - 1}\n"
    T = draw(st.integers(1, 4))
    lp = draw(st.lists(st.floats(-3, 0), min_size=T * C, max_size=T * C))
    return text, torch.tensor(lp, dtype=torch.float64).reshape(1, T, C)


@settings(max_examples=40, deadline=None)
@given(_random_case(), st.booleans(), st.booleans())
def test_tot_scores_property(case, log_semiring, graph_grad):
    # graph_grad: the scores require grad (a column per arc), else the final arcs become final weights
    text, lp = case
    fsa = k2.Fsa.from_str(text)
    fsa.scores = fsa.scores.double()
    fsa.requires_grad_(graph_grad)
    lp.requires_grad_(True)
    dense = k2.DenseFsaVec(lp, torch.tensor([[0, 0, lp.shape[1]]], dtype=torch.int32))
    tot = k2.intersect_dense(k2.create_fsa_vec([fsa]), dense, 1.0).get_tot_scores(
        log_semiring=log_semiring, use_double_scores=True)
    sc = fsa.scores.detach().clone().requires_grad_(True)
    lp2 = lp.detach().clone().requires_grad_(True)
    want = ref.dense_tot_score(fsa, sc, lp2[0], log_semiring)
    torch.testing.assert_close(tot.detach()[0], want.detach())
    if math.isfinite(want.item()) and log_semiring:
        tot.sum().backward()
        want.backward()
        torch.testing.assert_close(lp.grad, lp2.grad)
        if graph_grad:
            torch.testing.assert_close(fsa.scores.grad, sc.grad)


class TestDenseCPU(DenseCases, OnCPU):
    pass


class TestDenseEmulatedKernels(DenseCases, OnEmulatedKernels):
    pass


class TestDenseCUDA(DenseCases, OnCUDA):
    pass


class TestDenseErrors:
    def _dense(self):
        return k2.DenseFsaVec(torch.randn(2, 5, 4).log_softmax(-1), torch.tensor([[0, 0, 5], [1, 0, 3]],
                                                                                  dtype=torch.int32))

    @pytest.mark.parametrize("seg, err, match", [
        ([[2, 0, 3]], ValueError, "sequence_index must lie in"),
        ([[0, 5, 1]], ValueError, "start_frame must lie in"),
        ([[0, 0, 0]], ValueError, "duration must be > 0"),
        ([[0, 2, 4]], ValueError, "exceeds T=5"),
        ([[0, 0]], ValueError, r"supervision_segments: expected shape \[S, 3\]"),
    ])
    def test_bad_segments(self, seg, err, match):
        with pytest.raises(err, match=match):
            k2.DenseFsaVec(torch.randn(2, 5, 4), torch.tensor(seg, dtype=torch.int32))

    def test_bad_inputs(self):
        with pytest.raises(TypeError, match="supervision_segments: expected integers"):
            k2.DenseFsaVec(torch.randn(2, 5, 4), torch.tensor([[0.0, 0.0, 1.0]]))
        with pytest.raises(TypeError, match="log_probs: expected 'float32' or 'float64'"):
            k2.DenseFsaVec(torch.zeros(2, 5, 4, dtype=torch.int64), torch.tensor([[0, 0, 1]], dtype=torch.int32))
        with pytest.raises(ValueError, match=r"log_probs: expected a 3-D tensor \[N, T, C\]"):
            k2.DenseFsaVec(torch.randn(5, 4), torch.tensor([[0, 0, 1]], dtype=torch.int32))
        dense = self._dense()
        two = k2.ctc_graph([[1], [2]])
        with pytest.raises(ValueError, match="a_fsas: 1 FSAs but b_fsas has 2 segments"):
            k2.intersect_dense(k2.ctc_graph([[1]]), dense, 10.0)
        with pytest.raises(ValueError, match="a_to_b_map: must be non-decreasing"):
            k2.intersect_dense(two, dense, 10.0, a_to_b_map=torch.tensor([1, 0], dtype=torch.int32))
        with pytest.raises(ValueError, match="a_to_b_map: segment indexes must lie in"):
            k2.intersect_dense(two, dense, 10.0, a_to_b_map=torch.tensor([0, 2], dtype=torch.int32))
        with pytest.raises(ValueError, match="a_to_b_map: expected 2 entries"):
            k2.intersect_dense(two, dense, 10.0, a_to_b_map=torch.tensor([0], dtype=torch.int32))
        with pytest.raises(ValueError, match=r"a_fsas: label 7 is outside \[-1, C=4\)"):
            k2.intersect_dense(k2.ctc_graph([[7], [1]]), dense, 10.0)
        with pytest.raises(ValueError, match="seqframe_idx_name: not supported"):
            k2.intersect_dense(two, dense, 10.0, seqframe_idx_name="seqframe")
        with pytest.raises(ValueError, match="output_beam: expected a value > 0"):
            k2.intersect_dense(two, dense, 0.0)
        with pytest.raises(TypeError, match="b_fsas: expected a DenseFsaVec"):
            k2.intersect_dense(two, torch.zeros(2, 5, 4), 10.0)
        with pytest.raises(TypeError, match="use_double_scores: expected True or False"):
            k2.intersect_dense(two, dense, 10.0).get_tot_scores(use_double_scores=1, log_semiring=True)
        with pytest.raises(ValueError, match="delay_penalty: only 0 is supported"):
            k2.ctc_loss(two, dense, delay_penalty=0.1)
        with pytest.raises(ValueError, match='target_lengths: needed for reduction="mean"'):
            k2.ctc_loss(two, dense, reduction="mean")
        with pytest.raises(ValueError, match="reduction: expected"):
            k2.CtcLoss(10.0, reduction="avg")


# ----------------------------------------------------------------- CTC and LF-MMI equalities
class TestLosses:
    def _batch(self, rng):
        N, T, C = 3, 12, 6
        logits = torch.tensor(rng.normal(size=(N, T, C)), dtype=torch.float64, requires_grad=True)
        targets = [[1, 2, 2, 3], [5], [4, 1, 4]]
        lengths = [12, 7, 10]
        return logits, targets, lengths

    @pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
    def test_ctc_loss_equals_chainfb_and_torch(self, rng, reduction):
        logits, targets, lengths = self._batch(rng)
        lp = logits.log_softmax(-1)
        seg = torch.tensor([[i, 0, n] for i, n in enumerate(lengths)], dtype=torch.int32)
        tl = torch.tensor([len(t) for t in targets])
        got = k2.ctc_loss(k2.ctc_graph(targets), k2.DenseFsaVec(lp, seg), reduction=reduction, target_lengths=tl)
        assert got.dtype == torch.float32  # k2's loss is float32
        padded = torch.tensor([t + [0] * (4 - len(t)) for t in targets])
        want = chainfb.ctc_loss(lp.transpose(0, 1), padded, torch.tensor(lengths), tl, reduction=reduction)
        torch_loss = torch.nn.functional.ctc_loss(lp.transpose(0, 1), padded, torch.tensor(lengths), tl,
                                                  reduction=reduction)
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(want, torch_loss)
        g_k2, = torch.autograd.grad(got.sum(), logits, retain_graph=True)
        g_cf, = torch.autograd.grad(want.sum(), logits, retain_graph=True)
        g_torch, = torch.autograd.grad(torch_loss.sum(), logits)
        torch.testing.assert_close(g_k2, g_cf, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g_cf, g_torch)

    def test_ctc_loss_module_float32(self, rng):
        logits, targets, lengths = self._batch(rng)
        lp = logits.float().log_softmax(-1)
        seg = torch.tensor([[i, 0, n] for i, n in enumerate(lengths)], dtype=torch.int32)
        loss = k2.CtcLoss(output_beam=10, use_double_scores=False)(k2.ctc_graph(targets), k2.DenseFsaVec(lp, seg))
        padded = torch.tensor([t + [0] * (4 - len(t)) for t in targets])
        want = chainfb.ctc_loss(lp.double().transpose(0, 1), padded, torch.tensor(lengths),
                                torch.tensor([len(t) for t in targets]), reduction="sum")
        torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-4)

    def test_lf_mmi_equals_chain_loss(self, rng):
        from chainfb.chain.graphs import normalization_fst
        from chainfb.testing import numerator_like_fst

        P = 7
        den_fst = chainfb.Fst.from_arcs(
            [(s, d, int(rng.integers(0, P)), float(np.log(rng.uniform(0.2, 1.0))))
             for s in range(5) for d in range(5) if rng.uniform() < 0.6]
            + [(s, (s + 1) % 5, s, -0.3) for s in range(5)],
            finals={s: 0.0 for s in range(5)}, num_states=5)
        den = chainfb.DenominatorGraph(den_fst, num_pdfs=P)
        nums = [numerator_like_fst(rng, num_phones=2, num_pdfs=P) for _ in range(3)]
        y = torch.tensor(rng.normal(size=(3, 9, P)), dtype=torch.float64, requires_grad=True)
        lengths = [9, 8, 7]
        want = chainfb.ChainLoss(den, leaky_hmm_coefficient=0.0, out_of_range_regularize=0.0)(y, nums, lengths)
        g_want, = torch.autograd.grad(want, y)

        # the icefall step: numerator and denominator intersect_dense, den_scale 1
        num_graphs = k2.create_fsa_vec([k2.fst_to_fsa(f, torch.float64) for f in nums])
        den_graph = k2.fst_to_fsa(normalization_fst(den), torch.float64)
        den_graphs = k2.index_fsa(k2.create_fsa_vec([den_graph]), torch.zeros(3, dtype=torch.int32))
        dense = k2.DenseFsaVec(y, torch.tensor([[i, 0, n] for i, n in enumerate(lengths)], dtype=torch.int32))
        num_tot = k2.intersect_dense(num_graphs, dense, 8.0).get_tot_scores(log_semiring=True, use_double_scores=True)
        den_tot = k2.intersect_dense(den_graphs, dense, 8.0).get_tot_scores(log_semiring=True, use_double_scores=True)
        loss = -(num_tot - 1.0 * den_tot).sum()
        g_got, = torch.autograd.grad(loss, y)
        torch.testing.assert_close(loss, want)
        torch.testing.assert_close(g_got, g_want)


# ----------------------------------------------------------------- icefall's training-graph compilers
LEXICON_L = """
    0 1 0 0 -0.6931471805599453
    0 1 3 0 -0.6931471805599453
    1 2 1 1 0
    1 3 2 2 0
    1 4 -1 -1 0
    2 1 2 0 0
    3 1 0 0 0
    4
"""  # tokens: 1 = a, 2 = b, 3 = SIL (optional at the start); words: 1 = "a b", 2 = "b"


def _ctc_compile(L: k2.Fsa, word_ids, max_token: int) -> k2.Fsa:
    """icefall's CtcTrainingGraphCompiler.compile, step by step."""
    L_inv = k2.arc_sort(L.invert())
    ctc_topo = k2.ctc_topo(max_token, modified=False)
    word_fsa = k2.add_epsilon_self_loops(k2.linear_fsa(word_ids))
    fsa = k2.intersect(L_inv, word_fsa, treat_epsilons_specially=False)
    transcript = k2.arc_sort(fsa.invert_())
    with_loops = k2.arc_sort(k2.remove_epsilon_and_add_self_loops(transcript))
    graph = k2.compose(ctc_topo, with_loops, treat_epsilons_specially=False)
    assert graph.requires_grad is False
    return graph


class TestIcefallCompilers:
    def test_ctc_training_graph_compiler(self, rng):
        L = k2.Fsa.from_str(LEXICON_L, acceptor=False)
        graphs = _ctc_compile(L, [[1, 2], [2]], max_token=3)
        assert graphs.shape == (2, None, None)
        T = 6
        lp = torch.tensor(rng.normal(size=(2, T, 4)), dtype=torch.float64).log_softmax(-1)
        seg = torch.tensor([[0, 0, T], [1, 0, T]], dtype=torch.int32)
        got = k2.intersect_dense(graphs, k2.DenseFsaVec(lp, seg), 10.0).get_tot_scores(True, True)
        half = math.log(0.5)
        expected = [ref.ctc_total(lp[0].numpy(), {(1, 2, 2): half, (3, 1, 2, 2): half}),
                    ref.ctc_total(lp[1].numpy(), {(2,): half, (3, 2): half})]
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))

    def test_mmi_training_graph_compiler(self, rng):
        # a bigram token LM with a back-off state 3, as in icefall's P.fst.txt (costs; #0 = 4 on back-off arcs)
        P_text = """
            0 1 1 1 0.5
            0 2 2 2 1.0
            1 3 4 0 1.2
            1 2 2 2 0.3
            2 3 4 0 0.7
            3 1 1 1 0.9
            3 2 2 2 1.1
            1 0.2
            2 0.4
        """
        P = k2.Fsa.from_openfst(P_text, acceptor=False)
        del P.aux_labels
        labels = P.labels
        labels[labels >= 4] = 0
        P.labels = labels
        P = k2.arc_sort(k2.remove_epsilon(P))
        P_with_self_loops = k2.add_epsilon_self_loops(P)
        ctc_topo_inv = k2.arc_sort(k2.ctc_topo(2, modified=False).invert_())
        ctc_topo_P = k2.arc_sort(k2.intersect(ctc_topo_inv, P_with_self_loops,
                                              treat_epsilons_specially=False).invert())
        transcript = k2.arc_sort(k2.remove_epsilon_and_add_self_loops(k2.linear_fsa([[1, 2], [2]])))
        num = k2.arc_sort(k2.compose(ctc_topo_P, transcript, treat_epsilons_specially=False))
        den = k2.index_fsa(k2.create_fsa_vec([ctc_topo_P]), torch.zeros(2, dtype=torch.int32))

        T = 5
        lp = torch.tensor(rng.normal(size=(2, T, 3)), dtype=torch.float64).log_softmax(-1)
        dense = k2.DenseFsaVec(lp, torch.tensor([[0, 0, T], [1, 0, T]], dtype=torch.int32))
        num_tot = k2.intersect_dense(num, dense, 8.0).get_tot_scores(True, True)
        den_tot = k2.intersect_dense(den, dense, 8.0).get_tot_scores(True, True)

        P_ref = k2.Fsa.from_openfst(P_text.replace(" 4 0 ", " 0 0 "), acceptor=False)
        weights = ref.label_sequence_weights(P_ref, 12)  # log-sum over P's paths per token sequence
        for n, tokens in enumerate([(1, 2), (2,)]):
            assert num_tot[n].item() == pytest.approx(ref.ctc_total(lp[n].numpy(), {tokens: weights[tokens]}))
            assert den_tot[n].item() == pytest.approx(ref.ctc_total(lp[n].numpy(), weights))

    def test_bpe_compiler(self):
        # BpeCtcTrainingGraphCompiler.compile is k2.ctc_graph(piece_ids, modified, device)
        g = k2.ctc_graph([[3, 1]], modified=False, device="cpu")
        assert g.device == torch.device("cpu")
        assert g.labels.tolist() == [0, 3, 0, 3, 1, 0, 1, 0, 1, -1, 0, -1]
        assert g.aux_labels.tolist() == [0, 3, 0, 0, 1, 0, 1, 0, 0, -1, 0, -1]
