"""FST archives: round trips, and every damaged archive (truncated, cut
mid-line, not UTF-8, malformed, binary entries cut short or overwritten) is
an error naming the file, the key and the line (text) or byte (binary)."""

import struct

import numpy as np
import pytest

from chainfb.chain import have_kaldifst, read_fst_archive, read_kaldi_fst_archive, write_fst_archive
from chainfb.chain import write_kaldi_fst_archive
from chainfb.fst import Fst
from chainfb.testing import random_fst


@pytest.fixture
def items():
    rng = np.random.default_rng(0)
    return [(f"utt{i}", random_fst(rng, num_states=4, num_arcs=6, num_pdfs=3, start=0)) for i in range(3)]


def _text(tmp_path, items):
    write_fst_archive(tmp_path / "g.txt", items)
    return (tmp_path / "g.txt").read_text()


def test_text_round_trip(tmp_path, items):
    assert write_fst_archive(tmp_path / "g.txt", items) == 3
    back = read_fst_archive(tmp_path / "g.txt")
    assert list(back) == [k for k, _ in items] and all(back[k] == f for k, f in items)
    (tmp_path / "e.txt").write_text("")
    assert read_fst_archive(tmp_path / "e.txt") == {}


def test_text_cut_mid_line_is_an_error(tmp_path):
    f = Fst.from_arcs([(0, 1, 0, -0.5), (1, 1, 1, -0.5)], {1: 0.0})
    write_fst_archive(tmp_path / "g.txt", [("a", f), ("b", f)])
    text = (tmp_path / "g.txt").read_text()
    cut = text.rindex("1\t1\t2\t0.5") + 3  # the arc "1 1 2 0.5" cut to "1 1": a final state with cost 1
    (tmp_path / "cut.txt").write_text(text[:cut])
    last = text[:cut].count("\n") + 1
    with pytest.raises(ValueError, match=rf"cut.txt: .*line {last}: entry 'b' \(line \d+\) .*truncated"):
        read_fst_archive(tmp_path / "cut.txt")


@pytest.mark.parametrize("drop", [1, 2, 5])
def test_text_truncated_is_an_error(tmp_path, items, drop):
    text = _text(tmp_path, items)
    (tmp_path / "cut.txt").write_text(text[:-drop])
    with pytest.raises(ValueError, match="cut.txt: .*entry 'utt2'.*truncated"):
        read_fst_archive(tmp_path / "cut.txt")


def test_text_errors_name_file_key_and_file_line(tmp_path, items):
    lines = _text(tmp_path, items).split("\n")
    key_line = lines.index("utt1") + 1
    bad = list(lines)
    bad[key_line + 1] = "0 1 2 3 4 5"  # the second graph line of utt1: a wrong number of fields
    (tmp_path / "bad.txt").write_text("\n".join(bad))
    with pytest.raises(ValueError, match=rf"bad.txt: .*line {key_line + 2}: entry 'utt1': malformed line"):
        read_fst_archive(tmp_path / "bad.txt")
    bad = list(lines)
    bad[key_line] = "0 1 1_0"
    (tmp_path / "bad.txt").write_text("\n".join(bad))
    with pytest.raises(ValueError, match=rf"line {key_line + 1}: entry 'utt1': label '1_0' is not an integer"):
        read_fst_archive(tmp_path / "bad.txt")
    (tmp_path / "dup.txt").write_text("\n".join(lines[:key_line - 1] + lines[:key_line - 1]))
    with pytest.raises(ValueError, match=rf"dup.txt: .*line {key_line}: duplicate key 'utt0'"):
        read_fst_archive(tmp_path / "dup.txt")
    (tmp_path / "key.txt").write_text("utt0 extra\n0 1 1\n1\n\n")
    with pytest.raises(ValueError, match="key.txt: .*line 1: expected a key line"):
        read_fst_archive(tmp_path / "key.txt")


def test_text_binary_garbage_is_a_value_error(tmp_path, items):
    data = _text(tmp_path, items).encode()
    (tmp_path / "bin.txt").write_bytes(data[:40] + b"\xff\xfe\x00" + data[40:])
    line = data[:40].count(b"\n") + 1
    with pytest.raises(ValueError, match=rf"bin.txt: .*line {line}: not UTF-8"):
        read_fst_archive(tmp_path / "bin.txt")


kaldi = pytest.mark.skipif(not have_kaldifst(), reason="kaldifst not installed (optional extra 'kaldi')")


@kaldi
def test_kaldi_round_trip(tmp_path, items):
    write_kaldi_fst_archive(tmp_path / "g.ark", items)
    back = read_kaldi_fst_archive(tmp_path / "g.ark")
    assert list(back) == [k for k, _ in items]
    for k, f in items:
        np.testing.assert_allclose(back[k].final, f.final, rtol=1e-5)  # float32 costs, printed by kaldifst


@kaldi
def test_kaldi_truncated_is_an_error(tmp_path, items):
    write_kaldi_fst_archive(tmp_path / "g.ark", items)
    data = (tmp_path / "g.ark").read_bytes()
    starts = [data.index(k.encode() + b" ") for k, _ in items]
    for cut, key, start in [(len(data) - 5, "utt2", starts[2]), (starts[1] + 20, "utt1", starts[1]),
                            (starts[1] + 5, "utt1", starts[1]), (4, "utt0", 0),
                            (starts[1] + 3, "utt", starts[1])]:
        (tmp_path / "cut.ark").write_bytes(data[:cut])
        with pytest.raises(ValueError, match=rf"cut.ark: .*byte {start}: entry '{key}'.* is truncated"):
            read_kaldi_fst_archive(tmp_path / "cut.ark")


@kaldi
@pytest.mark.parametrize("offset, what", [(7, "bad magic number"), (20, "damaged header"), (45, "damaged header"),
                                          (75, "damaged arc count"), (90, "not an acceptor")])
def test_kaldi_garbage_is_an_error(tmp_path, items, offset, what):
    write_kaldi_fst_archive(tmp_path / "g.ark", items)
    data = (tmp_path / "g.ark").read_bytes()
    start = data.index(b"utt1 ")
    (tmp_path / "bad.ark").write_bytes(data[:start + offset] + b"\xff" * 8 + data[start + offset + 8:])
    with pytest.raises(ValueError, match=rf"bad.ark: .*byte {start}: entry 'utt1' .*{what}"):
        read_kaldi_fst_archive(tmp_path / "bad.ark")
    (tmp_path / "junk.ark").write_bytes(data + b"\x00\x01junk")
    with pytest.raises(ValueError, match="junk.ark: .*after entry 'utt2'"):
        read_kaldi_fst_archive(tmp_path / "junk.ark")


def _binary_entry(key, start, finals, arcs_of_state):
    """One Kaldi archive entry: ``key``, a space, an OpenFst binary
    StdVectorFst (header, then per state: final cost, arc count, arcs)."""
    out = key.encode() + b" " + struct.pack("<i", 2125659606)
    for name in (b"vector", b"standard"):
        out += struct.pack("<i", len(name)) + name
    out += struct.pack("<iiQqqq", 2, 0, 0, start, len(finals), sum(len(a) for a in arcs_of_state))
    for cost, arcs in zip(finals, arcs_of_state):
        out += struct.pack("<fq", cost, len(arcs))
        for label, cost_a, dst in arcs:
            out += struct.pack("<iifi", label, label, cost_a, dst)
    return out


def test_binary_archive_is_read_without_kaldifst(tmp_path):
    inf = float("inf")
    data = (_binary_entry("a", 0, [inf, 0.5], [[(1, 0.25, 1)], [(2, 0.0, 1)]])
            + _binary_entry("b", 1, [0.0, inf], [[], [(3, 1.0, 0)]]))
    (tmp_path / "g.ark").write_bytes(data)
    back = read_kaldi_fst_archive(tmp_path / "g.ark")
    assert back["a"] == Fst.from_arcs([(0, 1, 0, -0.25), (1, 1, 1, 0.0)], {1: -0.5})
    assert back["b"] == Fst.from_arcs([(1, 0, 2, -1.0)], {0: 0.0}, start=1)
    (tmp_path / "cut.ark").write_bytes(data[:-3])
    with pytest.raises(ValueError, match=rf"cut.ark: .*byte {data.index(b'b ')}: entry 'b' is truncated"):
        read_kaldi_fst_archive(tmp_path / "cut.ark")
    (tmp_path / "dup.ark").write_bytes(data + data[:data.index(b"b ")])
    with pytest.raises(ValueError, match="dup.ark: .*duplicate key 'a'"):
        read_kaldi_fst_archive(tmp_path / "dup.ark")
    (tmp_path / "eps.ark").write_bytes(_binary_entry("e", 0, [0.0], [[(0, 0.0, 0)]]))
    with pytest.raises(ValueError, match="eps.ark: .*entry 'e' has an epsilon"):
        read_kaldi_fst_archive(tmp_path / "eps.ark")
