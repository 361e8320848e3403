import math

import numpy as np
import pytest

from chainfb import Fst, FstBatch
from chainfb.testing import random_fst


def simple():
    return Fst.from_arcs(
        [(0, 0, 0, -0.5), (0, 1, 1, math.log(0.25)), (1, 1, 2, -0.2), (1, 2, 0, -math.inf)],
        {1: -0.7, 2: 0.0},
    )


def test_from_arcs_arrays():
    f = simple()
    assert f.num_states == 3 and f.num_arcs == 4 and f.start == 0
    assert f.final[0] == -np.inf and f.final[1] == -0.7
    assert f.num_pdfs == 3
    assert f.finals() == {1: -0.7, 2: 0.0}


def test_canonical_order_start_first():
    f = Fst.from_arcs([(0, 1, 0, 0.0), (2, 0, 1, 0.0), (1, 2, 2, 0.0)], {0: 0.0}, start=2)
    assert f.src.tolist() == [2, 0, 1]


def test_text_round_trip_exact(rng, tmp_path):
    for _ in range(20):
        f = random_fst(rng, num_states=5, num_arcs=9, num_pdfs=4)
        text = f.to_openfst_text()
        g = Fst.from_openfst_text(text)
        assert g == f
        assert g.to_openfst_text() == text
        f.write(tmp_path / "g.fst")
        assert Fst.read(tmp_path / "g.fst") == f


def test_text_format():
    f = simple()
    text = f.to_openfst_text()
    lines = text.splitlines()
    assert lines[0].split("\t")[:3] == ["0", "0", "1"]
    assert "Infinity" in text  # the -inf arc is written as an infinite cost
    assert lines[-1] == "2"  # final with cost 0 has no weight
    assert lines[-2] == "1\t0.7"


def test_parse_kaldi_transducer_format():
    text = "3 4 5 5 0.5\n4 4 2 2\n4 1.25\n"
    f = Fst.from_openfst_text(text)
    assert f.start == 3
    assert f.arcs() == [(3, 4, 4, -0.5), (4, 4, 1, 0.0)]
    assert f.finals() == {4: -1.25}


def test_parse_acceptor_with_weights_and_infinite_costs():
    f = Fst.from_openfst_text("0 1 1 Infinity\n0 0 2 1.5\n1 Infinity\n0\n")
    assert f.log_prob.tolist() == [-math.inf, -1.5]
    assert f.final[1] == -np.inf and f.final[0] == 0.0


@pytest.mark.parametrize(
    "text, match",
    [
        ("0 1 0\n1\n", "line 1: label 0"),
        ("0 1 1\n1 2 3 4 5 6\n2\n", "line 2: malformed"),
        ("0 1 x\n1\n", "line 1: label 'x'"),
        ("0 1 1 nan\n1\n", "line 1: weight is NaN"),
        ("0 1 1 -Infinity\n1\n", "line 1: weight -Infinity"),
        ("0 1 1\n1 2 1\n", "no final state"),
        ("0 -1 1\n1\n", "line 1: destination state -1 is negative"),
        ("0 1 2 3 0.5\n1\n", "line 1: input label 2 != output label 3"),
        ("\n\n", "empty"),
    ],
)
def test_parse_errors(text, match):
    with pytest.raises(ValueError, match=match):
        Fst.from_openfst_text(text)


def test_parse_type_error():
    with pytest.raises(TypeError, match="text"):
        Fst.from_openfst_text(b"0 1 1\n1\n")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(arcs=[(0, -1, 0, 0.0)], finals={0: 0.0}), r"arcs\[0\]: destination state -1 is negative"),
        (dict(arcs=[(0, 1, 0, 0.0), (-2, 1, 0, 0.0)], finals={1: 0.0}), r"arcs\[1\]: source state -2 is negative"),
        (dict(arcs=[(0, 1, 0, 0.0)], finals={-1: 0.0}), "finals: state -1 is negative"),
        (dict(arcs=[(0, 1, 0, 0.0)], finals={1: 0.0}, start=-1), "start: state -1 is negative"),
        (dict(arcs=[(0, 5, 0, 0.0)], finals={0: 0.0}, num_states=3),
         r"arcs\[0\]: destination state 5 is outside \[0, num_states=3\)"),
        (dict(arcs=[(0, 1, 0, 0.0), (1, 2, 0, 0.0), (3, 1, 0, 0.0)], finals={1: 0.0}, num_states=3),
         r"arcs\[2\]: source state 3 is outside \[0, num_states=3\)"),
        (dict(arcs=[(0, 1, 0, 0.0)], finals={2: 0.0}, num_states=2), r"finals: state 2 is outside \[0, num_states=2\)"),
        (dict(arcs=[(0, 1, 0, 0.0)], finals={1: 0.0}, start=2, num_states=2),
         r"start: state 2 is outside \[0, num_states=2\)"),
        (dict(arcs=[(0, 1, 0, 0.0)], finals={1: 0.0}, num_states=0), "num_states: expected a positive integer"),
        (dict(arcs=[(0, 1, 0, 0.0)], finals={1: 0.0}, num_states=2.5), "num_states: expected a positive integer"),
        (dict(arcs=[(0, 1, 0, 0.0)], finals={1: 0.0}, num_states=True), "num_states: expected a positive integer"),
        (dict(arcs=[(0, 1, 0, float("nan"))], finals={1: 0.0}), "NaN"),
        (dict(arcs=[(0, 1, 0, float("inf"))], finals={1: 0.0}), r"\+inf"),
        (dict(arcs=[(0, 1, -1, 0.0)], finals={1: 0.0}), "pdf"),
        (dict(arcs=[(0, 1, 0, 0.0)], finals={}), "no final state"),
        (dict(arcs=[(0, 1, 0)], finals={1: 0.0}), r"arcs\[0\]"),
        (dict(arcs=[(0, 1, 0, 0.0)], finals={1: float("nan")}), "final"),
    ],
)
def test_from_arcs_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Fst.from_arcs(**kwargs)


def test_from_arcs_num_states_default_is_one_more_than_the_largest_id():
    f = Fst.from_arcs([(0, 1, 0, 0.0), (1, 1, 1, 0.0)], {1: 0.0})
    assert f.num_states == 2
    # ids between those used become states without arcs; finals and start count too
    f = Fst.from_arcs([(0, 3, 0, 0.0)], {3: 0.0})
    assert f.num_states == 4 and f.final[1] == f.final[2] == -np.inf
    assert Fst.from_arcs([(0, 1, 0, 0.0)], {5: 0.0}).num_states == 6
    assert Fst.from_arcs([(0, 1, 0, 0.0)], {1: 0.0}, start=7).num_states == 8
    assert Fst.from_arcs([], {0: 0.0}).num_states == 1


def test_from_arcs_explicit_num_states():
    # every id inside [0, num_states): accepted, trailing states have no arcs
    f = Fst.from_arcs([(0, 1, 0, 0.0)], {1: 0.0}, num_states=4)
    assert f.num_states == 4 and f.final.tolist() == [-np.inf, 0.0, -np.inf, -np.inf]
    f = Fst.from_arcs([(0, 2, 0, 0.0)], {2: 0.0}, num_states=np.int64(3))
    assert f.num_states == 3 and isinstance(f.num_states, int)
    # an arc to an undeclared state is an error, not a new state
    with pytest.raises(ValueError, match="num_states=2"):
        Fst.from_arcs([(0, 1, 0, 0.0), (1, 2, 0, 0.0)], {1: 0.0}, num_states=2)


def test_from_arcs_finals_type():
    with pytest.raises(TypeError, match="finals"):
        Fst.from_arcs([(0, 1, 0, 0.0)], [1])


def test_to_dot():
    dot = simple().to_dot(title="demo")
    assert dot.startswith("digraph FST {")
    assert '0 -> 1 [label="1:0.25"]' in dot
    assert "doublecircle" in dot and "style=bold" in dot


def test_batch_csr(rng):
    fsts = [random_fst(rng, num_states=4, num_arcs=7) for _ in range(3)]
    b = FstBatch(fsts, seq_to_graph=[2, 0, 0, 1])
    assert b.num_sequences == 4 and b.num_graphs == 3
    assert b.num_arcs == 21 and b.num_states == 12
    # forward order sorted by destination, backward by source, CSR pointers consistent
    assert np.all(np.diff(b.dst[b.fwd_order]) >= 0)
    assert np.all(np.diff(b.src[b.bwd_order]) >= 0)
    for s in range(b.num_states):
        assert np.all(b.dst[b.fwd_order[b.in_ptr[s]:b.in_ptr[s + 1]]] == s)
        assert np.all(b.src[b.bwd_order[b.out_ptr[s]:b.out_ptr[s + 1]]] == s)


@pytest.mark.parametrize("largest_pdf", [6, 10**6, 2**61])
def test_batch_columns_are_each_graphs_distinct_pdfs(rng, largest_pdf):
    """One pass for the batch gives every graph's sorted distinct pdfs and
    each arc's index among them, as np.unique graph by graph (few pdfs: the
    pairs used marked; many: one sort; pdf ids up to 2**61 included); graphs
    with no arcs too."""
    for _ in range(20):
        fsts = []
        for _ in range(int(rng.integers(1, 5))):
            A = int(rng.integers(0, 6))
            fsts.append(Fst(3, 0, rng.integers(0, 3, A), rng.integers(0, 3, A), rng.integers(0, largest_pdf + 1, A),
                            np.zeros(A), np.zeros(3)))
        b = FstBatch(fsts)
        for g, f in enumerate(fsts):
            pdfs, local = b.graph_columns(g)
            want, inverse = np.unique(f.pdf, return_inverse=True)
            assert np.array_equal(pdfs, want) and np.array_equal(local, inverse.reshape(-1))


def test_batch_errors(rng):
    f = random_fst(rng)
    with pytest.raises(ValueError, match="seq_to_graph"):
        FstBatch([f], seq_to_graph=[0, 1])
    with pytest.raises(TypeError, match=r"fsts\[1\]"):
        FstBatch([f, "x"])
    with pytest.raises(ValueError, match="at least one"):
        FstBatch([])


def test_constructor_rejects_fractional_ids():
    final = [-math.inf, 0.0]
    with pytest.raises(ValueError, match="src: expected integer ids, got 0.5"):
        Fst(2, 0, [0.5], [1], [0], [0.0], final)
    with pytest.raises(ValueError, match="pdf"):
        Fst(2, 0, [0], [1], [1.9], [0.0], final)
    with pytest.raises(ValueError, match="num_states"):
        Fst(2.5, 0, [0], [1], [0], [0.0], final)
    with pytest.raises(ValueError, match="start"):
        Fst(2, 0.2, [0], [1], [0], [0.0], final)
    with pytest.raises(TypeError, match="dst"):
        Fst(2, 0, [0], [True], [0], [0.0], final)
    f = Fst(2.0, 0, [0.0], [1.0], [2.0], [0.0], final)  # whole floats are ids
    assert f.arcs() == [(0, 1, 2, 0.0)] and Fst(1, 0, [], [], [], [], [0.0]).num_arcs == 0


@pytest.mark.parametrize("field", ["1_0", "+0", "\u0661", "0x1", "1.0", "\uff11"])
def test_text_ids_are_ascii_digits_only(field):
    with pytest.raises(ValueError, match="line 1: .*not an integer"):
        Fst.from_openfst_text(f"0 {field} 1\n1\n")
    with pytest.raises(ValueError, match="line 2: state .*not an integer"):
        Fst.from_openfst_text(f"0 1 1\n{field}\n")
    with pytest.raises(ValueError, match="line 1: label .*not an integer"):
        Fst.from_openfst_text(f"0 1 {field}\n1\n")
