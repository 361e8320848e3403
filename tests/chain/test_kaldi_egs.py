"""Kaldi chain examples (``NnetChainExample`` archives of
``nnet3-chain-e2e-get-egs``): written by :mod:`oracles.kaldi_egs` from
Kaldi's format rules, read back by :func:`chainfb.chain.read_chain_egs`;
damaged archives are ValueErrors naming the file, the key and the byte
offset."""

import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chainfb
from chainfb import Fst, GenericNumeratorComputation
from chainfb.chain import read_chain_egs
from damage import draw_damage
from oracles.kaldi_egs import compressed, entry, example, fm, nnet_io, supervision

# ------------------------------------------------------------ examples

G1 = Fst.from_arcs([(0, 0, 3, 0.0), (0, 1, 1, -0.5), (1, 1, 2, -0.25)], {1: 0.0, 0: -1.5})
G2 = Fst.from_arcs([(0, 1, 0, 0.0), (1, 1, 4, -0.125), (1, 2, 2, 0.0)], {2: -0.75})


def _e2e_eg(rng):
    """One unmerged e2e example: 20 input frames (t = -5 .. 14), an ivector, 5 output frames (t = 0, 3, ...)."""
    feats = rng.normal(size=(20, 3)).astype(np.float32)
    ivec = compressed("CM3", 10.0, 255.0, 1, 4, bytes([0, 1, 128, 255]))
    out_idx = [(0, 3 * t, 0) for t in range(5)]
    eg = example([nnet_io("input", [(0, t, 0) for t in range(-5, 15)], fm(feats)),
                  nnet_io("ivector", [(0, 0, 0)], ivec)],
                 [supervision("output", out_idx, 1.0, 1, 5, 6, [G1], deriv=[1, 1, 0.5, 1, 1])])
    return eg, feats


def test_e2e_example_round_trip(tmp_path, rng):
    eg, feats = _e2e_eg(rng)
    (tmp_path / "egs.ark").write_bytes(entry("utt1-0", eg) + entry("utt2-0", eg))
    got = list(read_chain_egs(tmp_path / "egs.ark"))
    assert [k for k, _ in got] == ["utt1-0", "utt2-0"]
    x = got[0][1]
    assert [io.name for io in x.inputs] == ["input", "ivector"]
    np.testing.assert_array_equal(x.inputs[0].features, feats)
    np.testing.assert_array_equal(x.inputs[0].indexes, [(0, t, 0) for t in range(-5, 15)])
    np.testing.assert_array_equal(x.inputs[1].features, [[10, 11, 138, 265]])  # CM3: min + range / 255 * byte
    (sup,) = x.outputs
    assert (sup.name, sup.weight, sup.num_sequences, sup.frames_per_sequence, sup.label_dim, sup.e2e) == \
        ("output", 1.0, 1, 5, 6, True)
    np.testing.assert_array_equal(sup.indexes, [(0, 3 * t, 0) for t in range(5)])
    assert sup.fsts == [G1]
    np.testing.assert_array_equal(sup.deriv_weights, [1, 1, 0.5, 1, 1])
    assert sup.alignment_pdfs is None


def test_merged_example_runs_the_numerator(tmp_path, rng):
    """Two sequences merged (``nnet3-chain-merge-egs``: indexes t-major, n
    changing at every index), compressed features; the supervision runs
    GenericNumeratorComputation as Kaldi would."""
    cm = [0, 64, 192, 255]  # p0, p25, p75, p100 as uint16 with min 0 and range 65535: the bytes decode to themselves
    cols = struct.pack("<4H", *cm) + struct.pack("<4H", 100, 200, 300, 400)
    body = cols + bytes([0, 64, 128, 200, 255]) + bytes([0, 64, 128, 192, 255])  # column-major bytes
    inputs = [nnet_io("input", [(n, t, 0) for t in range(0, 5) for n in range(1)],
                      compressed("CM", 0.0, 65535.0, 5, 2, body)),
              nnet_io("extra", [(0, t, 0) for t in range(3)],
                      compressed("CM2", -1.0, 2.0, 3, 1, struct.pack("<3H", 0, 13107, 65535)))]
    frames, N = 4, 2
    out_idx = [(n, 3 * t, 0) for t in range(frames) for n in range(N)]
    eg = example(inputs, [supervision("output", out_idx, 0.5, N, frames, 5, [G1, G2])])
    (tmp_path / "merged.ark").write_bytes(entry("merged-0", eg))
    ((key, x),) = list(read_chain_egs(tmp_path / "merged.ark"))
    np.testing.assert_allclose(x.inputs[0].features[:, 0], [0, 64, 128, 200, 255], rtol=1e-6)
    np.testing.assert_allclose(x.inputs[0].features[:, 1], [100, 200, 250, 300, 400], rtol=1e-6)
    np.testing.assert_allclose(x.inputs[1].features[:, 0], [-1, -0.6, 1], rtol=1e-6)
    sup = x.outputs[0]
    np.testing.assert_array_equal(sup.indexes, out_idx)
    assert sup.fsts == [G1, G2] and sup.weight == 0.5 and sup.deriv_weights is None
    out = rng.normal(size=(frames * N, sup.label_dim))  # Kaldi's layout: row t * N + n
    deriv = np.zeros_like(out)
    ok, total = GenericNumeratorComputation(sup.supervision(), out).forward_backward(deriv)
    ll, _ = chainfb.forward_backward([G1, G2], out.reshape(frames, N, -1).transpose(1, 0, 2))
    assert ok and total == pytest.approx(0.5 * ll.sum())


def test_non_e2e_supervision_and_alignment(tmp_path):
    chain = Fst.from_arcs([(0, 1, 0, 0.0), (1, 2, 1, 0.0), (1, 2, 2, 0.0), (2, 3, 1, 0.0)], {3: 0.0})
    eg = example([nnet_io("input", [(0, t, 0) for t in range(3)], fm(np.ones((3, 2))))],
                 [supervision("output", [(0, t, 0) for t in range(3)], 1.0, 1, 3, 3, [chain], e2e=False,
                              align=[0, 1, 1])])
    (tmp_path / "egs.ark").write_bytes(entry("a", eg))
    ((_, x),) = list(read_chain_egs(tmp_path / "egs.ark"))
    sup = x.outputs[0]
    assert not sup.e2e and sup.fsts == [chain]
    np.testing.assert_array_equal(sup.alignment_pdfs, [0, 1, 1])
    with pytest.raises(ValueError, match="supervision: a non-e2e example"):
        sup.supervision()


def test_empty_archive(tmp_path):
    (tmp_path / "e.ark").write_bytes(b"")
    assert list(read_chain_egs(tmp_path / "e.ark")) == []


# ------------------------------------------------------------ damage


def test_damaged_egs_name_file_key_and_offset(tmp_path, rng):
    eg, _ = _e2e_eg(rng)
    data = entry("a", eg) + entry("bb", eg)
    b = data.index(b"bb ")
    (tmp_path / "cut.ark").write_bytes(data[:-7])
    with pytest.raises(ValueError, match=rf"cut.ark: damaged chain-example archive: byte {b}: entry 'bb' "
                                         r"is truncated: the token at byte \d+ runs past the end"):
        list(read_chain_egs(tmp_path / "cut.ark"))
    (tmp_path / "cut.ark").write_bytes(data[:b + 300])
    with pytest.raises(ValueError, match=rf"cut.ark: .*byte {b}: entry 'bb' .*matrix at byte \d+: its 240 bytes "
                                         r"cannot fit in the 204 bytes that remain"):
        list(read_chain_egs(tmp_path / "cut.ark"))
    (tmp_path / "text.ark").write_bytes(b"a <Nnet3ChainEg> <NumInputs> 1\n")
    with pytest.raises(ValueError, match="text.ark: .*entry 'a' is in Kaldi's text form"):
        list(read_chain_egs(tmp_path / "text.ark"))
    bad = data.replace(b"<NumOutputs> ", b"<NumOutputz> ", 1)
    (tmp_path / "tok.ark").write_bytes(bad)
    with pytest.raises(ValueError, match=r"tok.ark: .*byte 0: entry 'a' expected <NumOutputs> at byte \d+, "
                                         r"found <NumOutputz>"):
        list(read_chain_egs(tmp_path / "tok.ark"))


@pytest.mark.parametrize("after, value, what", [
    (b"<NumInputs> ", 10**9, "number of inputs at byte"),
    (b"<I1V> ", 2**31 - 1, "indexes size at byte"),
    (b"FM ", 10**9, r"matrix at byte \d+: its 12000000000 bytes cannot fit"),
    (b"<NumSequences> ", 10**9, "damaged output 'output': 1000000000 sequences"),
])
def test_counts_that_cannot_fit_are_errors(tmp_path, rng, after, value, what):
    eg, _ = _e2e_eg(rng)
    data = bytearray(entry("k", eg))
    at = data.index(after) + len(after)
    struct.pack_into("<i", data, at + 1, value)
    (tmp_path / "big.ark").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"big.ark: damaged chain-example archive: byte 0: entry 'k' .*{what}"):
        list(read_chain_egs(tmp_path / "big.ark"))


def test_compact_fst_counts_are_checked(tmp_path, rng):
    eg, _ = _e2e_eg(rng)
    data = bytearray(entry("k", eg))
    fst_at = data.index(struct.pack("<i", 2125659606))
    header = fst_at + 4 + 4 + len("compact_acceptor") + 4 + len("standard")
    struct.pack_into("<q", data, header + 4 + 4 + 8 + 8, 10**12)  # the number of states
    (tmp_path / "big.ark").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="big.ark: .*entry 'k' output 'output' graph 0: has a damaged header: "
                                         "1000000000000 states cannot fit"):
        list(read_chain_egs(tmp_path / "big.ark"))


CORPUS = None


def _corpus():
    global CORPUS
    if CORPUS is None:
        eg, _ = _e2e_eg(np.random.default_rng(3))
        CORPUS = entry("a", eg) + entry("b", eg)
    return CORPUS


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_damaged_egs_are_value_errors(tmp_path, data):
    """Truncated archives and archives with bytes flipped or overwritten read
    as examples or fail with a ValueError naming the file: never a
    MemoryError, another exception, a crash or a hang."""
    path = tmp_path / "fuzz.ark"
    path.write_bytes(draw_damage(data, _corpus()))
    try:
        list(read_chain_egs(path))
    except ValueError as e:
        assert str(e).startswith(os.fspath(path) + ": "), str(e)
