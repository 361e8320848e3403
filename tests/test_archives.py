"""FST archives and single binary FSTs: round trips, Kaldi's own forms
(binary and text archives, ``den.fst``), spans, and every damaged file
(truncated, cut mid-line, not UTF-8, malformed, binary entries cut short,
overwritten or with counts that cannot fit) is a ``ValueError`` naming the
file, the key and the line (text) or byte (binary).  The binary files of the
tests are built here from OpenFst's format (``FstHeader``, then per state
the final cost, the arc count and the arcs); ``kaldifst``, where installed,
cross-checks them."""

import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainfb.chain import (DenominatorGraph, have_kaldifst, read_fst_archive, read_kaldi_fst_archive,
                           write_fst_archive, write_kaldi_fst_archive)
from chainfb.fst import Fst
from chainfb.testing import random_fst
from damage import draw_damage


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


kaldi = pytest.mark.skipif(not have_kaldifst(), reason="kaldifst not installed (optional; a cross-check only)")


def _openfst(start, finals, arcs_of_state, flags=0, symbols=(), fst_type=b"vector"):
    """One FST in OpenFst's binary form: header, the symbol tables, then per
    state the final cost (float32), the arc count (int64) and the arcs
    ``(ilabel, olabel, cost, dst)``; an arc ``(label, cost, dst)`` has the
    label on both sides.  OpenFst writes 0 for the header's arc count."""
    out = struct.pack("<i", 2125659606)
    for name in (fst_type, b"standard"):
        out += struct.pack("<i", len(name)) + name
    out += struct.pack("<iiQqqq", 2, flags, 0, start, len(finals), 0)
    for table in symbols:  # magic, name, available key, size, (symbol, key) pairs
        out += struct.pack("<i", 2125658996) + struct.pack("<i", 4) + b"syms"
        out += struct.pack("<qq", len(table), len(table))
        for k, sym in enumerate(table):
            out += struct.pack("<i", len(sym)) + sym.encode() + struct.pack("<q", k)
    for cost, arcs in zip(finals, arcs_of_state):
        out += struct.pack("<fq", cost, len(arcs))
        for arc in arcs:
            ilabel, olabel, cost_a, dst = arc if len(arc) == 4 else (arc[0], *arc)
            out += struct.pack("<iifi", ilabel, olabel, cost_a, dst)
    return out


def _binary_entry(key, start, finals, arcs_of_state, **kw):
    """One Kaldi archive entry: ``key``, a space, the FST in OpenFst's binary form."""
    return key.encode() + b" " + _openfst(start, finals, arcs_of_state, **kw)


INF = float("inf")
A_BYTES = ([INF, 0.5], [[(1, 0.25, 1)], [(2, 0.0, 1)]])
A_FST = Fst.from_arcs([(0, 1, 0, -0.25), (1, 1, 1, 0.0)], {1: -0.5})


def test_binary_archive_is_read_without_kaldifst(tmp_path):
    data = (_binary_entry("a", 0, *A_BYTES) + _binary_entry("b", 1, [0.0, INF], [[], [(3, 1.0, 0)]]))
    (tmp_path / "g.ark").write_bytes(data)
    back = read_kaldi_fst_archive(tmp_path / "g.ark")
    assert back["a"] == A_FST
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


def test_kaldi_round_trip(tmp_path, items):
    assert write_kaldi_fst_archive(tmp_path / "g.ark", items) == 3
    back = read_kaldi_fst_archive(tmp_path / "g.ark")
    assert list(back) == [k for k, _ in items]
    for k, f in items:  # float32 costs
        np.testing.assert_allclose(back[k].final, f.final, rtol=1e-6)
        np.testing.assert_allclose(back[k].log_prob, f.log_prob, rtol=1e-6)
        assert back[k] == Fst(f.num_states, f.start, f.src, f.dst, f.pdf, back[k].log_prob, back[k].final)


def test_kaldi_archive_is_written_in_openfst_form(tmp_path):
    write_kaldi_fst_archive(tmp_path / "g.ark", [("a", A_FST)])
    data = (tmp_path / "g.ark").read_bytes()
    ref = _binary_entry("a", 0, *A_BYTES)
    # the same bytes as the format's, except the header's properties (written: acceptor, no epsilons)
    props = slice(2 + 4 + 10 + 12 + 8, 2 + 4 + 10 + 12 + 16)
    assert data[:props.start] + data[props.stop:] == ref[:props.start] + ref[props.stop:]
    assert struct.unpack("<Q", data[props])[0] == 0x1 | 0x2 | 0x10000 | 0x800000 | 0x2000000 | 0x8000000


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


# ------------------------------------------------------------ den.fst, normalization.fst: one binary FST


def test_single_binary_fst_is_read_and_written(tmp_path):
    (tmp_path / "den.fst").write_bytes(_openfst(0, *A_BYTES))
    assert Fst.read(tmp_path / "den.fst") == A_FST
    den = DenominatorGraph.read(tmp_path / "den.fst")
    assert den.fst.arcs() == A_FST.arcs() and den.num_pdfs == 2
    g = Fst.from_arcs([(0, 1, 4, -0.5), (1, 1, 1, -0.125), (1, 2, 0, -np.inf)], {1: -0.25, 2: 0.0}, start=0)
    g.write(tmp_path / "g.fst", binary=True)
    assert Fst.read(tmp_path / "g.fst") == g  # costs exact in float32
    A_FST.write(tmp_path / "a.fst", binary=True)
    assert (tmp_path / "a.fst").read_bytes()[45:] == _openfst(0, *A_BYTES)[45:]  # after the properties
    with pytest.raises(TypeError, match="binary"):
        g.write(tmp_path / "g.fst", binary="yes")


def test_single_binary_fst_damage_and_hints(tmp_path):
    data = _openfst(0, *A_BYTES)
    (tmp_path / "den.fst").write_bytes(data)
    for reader in (read_kaldi_fst_archive, read_fst_archive):  # one FST, not an archive: says so and where to go
        with pytest.raises(ValueError, match="den.fst: not an FST archive: it is one binary OpenFst FST.*Fst.read"):
            reader(tmp_path / "den.fst")
    (tmp_path / "cut.fst").write_bytes(data[:-6])
    with pytest.raises(ValueError, match=r"cut.fst: damaged binary FST: is truncated: .* at byte \d+"):
        Fst.read(tmp_path / "cut.fst")
    (tmp_path / "two.fst").write_bytes(data + data)
    with pytest.raises(ValueError, match=rf"two.fst: .*{len(data)} bytes follow the FST at byte {len(data)}"):
        Fst.read(tmp_path / "two.fst")
    (tmp_path / "const.fst").write_bytes(_openfst(0, *A_BYTES, fst_type=b"const"))
    with pytest.raises(ValueError, match="const.fst: .*a 'const' FST; chainfb reads OpenFst's 'vector' FSTs"):
        Fst.read(tmp_path / "const.fst")
    (tmp_path / "eps.fst").write_bytes(_openfst(0, [0.0], [[(0, 0.0, 0)]]))
    with pytest.raises(ValueError, match="eps.fst: .*epsilon"):
        Fst.read(tmp_path / "eps.fst")
    (tmp_path / "words.fst").write_bytes(_openfst(0, [INF, 0.0], [[(3, 7, 0.0, 1)], []]))
    with pytest.raises(ValueError, match="words.fst: .*input label 3 and output label 7"):
        Fst.read(tmp_path / "words.fst")


def test_spans_cannot_go_into_binary_fsts(tmp_path):
    g = Fst.from_arcs([(0, 0, 0, -0.5, 2), (0, 1, 1, 0.0)], {1: 0.0})
    with pytest.raises(ValueError, match="binary=True: has arcs spanning up to 2 frames"):
        g.write(tmp_path / "g.fst", binary=True)
    assert not (tmp_path / "g.fst").exists()
    with pytest.raises(ValueError, match="items: entry 'b': has arcs spanning up to 2 frames.*text form keeps them"):
        write_kaldi_fst_archive(tmp_path / "g.ark", [("a", A_FST), ("b", g)])
    assert not (tmp_path / "g.ark").exists()


def test_text_archive_keeps_spans(tmp_path):
    # span == pdf + 1 on every arc: the transducer line equals Kaldi's line of a span-1 arc
    g = Fst.from_arcs([(0, 0, 1, -0.5, 2), (0, 1, 2, 0.0, 3)], {1: 0.0})
    h = Fst.from_arcs([(0, 0, 0, -0.5, 4), (0, 1, 1, 0.0)], {1: 0.0})
    write_fst_archive(tmp_path / "g.txt", [("g", g), ("plain", A_FST), ("h", h)])
    back = read_fst_archive(tmp_path / "g.txt")
    assert back == {"g": g, "plain": A_FST, "h": h}
    assert back["g"].max_span == 3 and back["h"].max_span == 4


# ------------------------------------------------------------ Kaldi's own forms


def test_symbol_tables_are_skipped(tmp_path):
    data = _binary_entry("a", 0, *A_BYTES, flags=3, symbols=(["<eps>", "x", "y"], ["<eps>", "p"]))
    (tmp_path / "s.ark").write_bytes(data)
    assert read_kaldi_fst_archive(tmp_path / "s.ark") == {"a": A_FST}
    (tmp_path / "s.fst").write_bytes(data[2:])
    assert Fst.read(tmp_path / "s.fst") == A_FST


KALDI_TEXT = "u1 \n0\t1\t3\t3\n1\t1\t4\t4\n1\t2\t5\t5\t0.5\n1\n2\t0.25\n\nu2 \n0\t1\t3\t3\n1\n\n"


def test_kaldi_text_archive_in_transducer_form(tmp_path):
    """Kaldi writes FSTs in OpenFst's transducer text (``src dst ilabel
    olabel [cost]``) under a key line ending in a space: ``0 1 3 3`` is pdf 2
    with cost 0, not label 3 with cost 3."""
    (tmp_path / "num.txt").write_text(KALDI_TEXT)
    u1 = Fst.from_arcs([(0, 1, 2, 0.0), (1, 1, 3, 0.0), (1, 2, 4, -0.5)], {1: 0.0, 2: -0.25})
    u2 = Fst.from_arcs([(0, 1, 2, 0.0)], {1: 0.0})
    assert read_fst_archive(tmp_path / "num.txt") == {"u1": u1, "u2": u2}
    assert read_kaldi_fst_archive(tmp_path / "num.txt") == {"u1": u1, "u2": u2}
    # chainfb's key line (no space) keeps the detected form; acceptor=False asks for the transducer form
    (tmp_path / "plain.txt").write_text(KALDI_TEXT.replace(" \n", "\n"))
    assert read_fst_archive(tmp_path / "plain.txt", acceptor=False) == {"u1": u1, "u2": u2}
    with pytest.raises(TypeError, match="acceptor"):
        read_fst_archive(tmp_path / "plain.txt", acceptor="no")
    # a mixed archive: a binary entry, then text entries
    (tmp_path / "mixed.ark").write_bytes(_binary_entry("a", 0, *A_BYTES) + KALDI_TEXT.encode())
    assert read_kaldi_fst_archive(tmp_path / "mixed.ark") == {"a": A_FST, "u1": u1, "u2": u2}
    (tmp_path / "cut.ark").write_bytes(KALDI_TEXT.encode()[:-1])
    with pytest.raises(ValueError, match=rf"cut.ark: .*byte {KALDI_TEXT.index('u2')}: entry 'u2' is truncated"):
        read_kaldi_fst_archive(tmp_path / "cut.ark")


def test_transducer_text_hint_names_the_label_rule():
    with pytest.raises(ValueError, match=r"line 1: input label 3 != output label 7: .*pdf \+ 1 on both sides"):
        Fst.from_openfst_text("0 1 3 7 0.5\n1\n")


def _same_graphs(a: dict, b: dict, rtol: float):
    assert list(a) == list(b)
    for k in a:
        f, g = a[k], b[k]
        assert (f.num_states, f.start) == (g.num_states, g.start)
        assert [arc[:3] for arc in f.arcs()] == [arc[:3] for arc in g.arcs()]
        np.testing.assert_allclose(f.log_prob, g.log_prob, rtol=rtol)
        np.testing.assert_allclose(f.final, g.final, rtol=rtol)


@kaldi
def test_kaldifst_reads_what_chainfb_writes_and_back(tmp_path, items):
    import kaldifst

    write_kaldi_fst_archive(tmp_path / "g.ark", items)
    reader = kaldifst.SequentialVectorFstReader(f"ark:{tmp_path / 'g.ark'}")
    seen = {}
    while not reader.done:
        seen[reader.key] = Fst.from_openfst_text(str(reader.value), acceptor=False)
        reader.next()
    ours = read_kaldi_fst_archive(tmp_path / "g.ark")
    _same_graphs(seen, ours, rtol=1e-5)  # kaldifst prints costs with 6 significant digits
    for form in ("ark", "ark,t"):  # kaldifst's writers (Kaldi's table code): binary and text archives
        writer = kaldifst.VectorFstWriter(f"{form}:{tmp_path / 'k.ark'}")
        for key, fst in items:
            writer.write(key, kaldifst.compile(fst.to_openfst_text(), acceptor=True, keep_state_numbering=True))
        writer.close()
        back = read_kaldi_fst_archive(tmp_path / "k.ark")
        if form == "ark":
            assert back == ours
        else:  # Kaldi's text form: transducer lines, 6 significant digits
            _same_graphs(back, ours, rtol=1e-5)
            assert read_fst_archive(tmp_path / "k.ark") == back
    one = kaldifst.compile(items[0][1].to_openfst_text(), acceptor=True, keep_state_numbering=True)
    one.write(str(tmp_path / "den.fst"))
    assert Fst.read(tmp_path / "den.fst") == ours["utt0"]
    table = kaldifst.SymbolTable()  # symbol tables written by OpenFst are skipped
    for i, sym in enumerate(["<eps>", "a", "b"]):
        table.add_symbol(sym, i)
    kaldifst.compile("0 1 a a 0.5\n1 1 b b\n1 0.25\n", isymbols=table, osymbols=table, keep_isymbols=True,
                     keep_osymbols=True).write(str(tmp_path / "sym.fst"))
    assert Fst.read(tmp_path / "sym.fst") == Fst.from_arcs([(0, 1, 0, -0.5), (1, 1, 1, 0.0)], {1: -0.25})
    kaldifst.compile("0 1 1 1\n1\n", fst_type="const").write(str(tmp_path / "const.fst"))
    with pytest.raises(ValueError, match="const.fst: .*a 'const' FST"):
        Fst.read(tmp_path / "const.fst")


# ------------------------------------------------------------ counts that cannot fit, fuzzing


@pytest.mark.parametrize("field, value, what", [
    ("states", 10**12, r"1000000000000 states cannot fit in the \d+ bytes that remain"),
    ("states", -5, "-5 states"),
    ("arcs", 10**12, r"1000000000000 arcs of state 0 at byte \d+ needs 16000000000000 bytes"),
    ("type", 2**31 - 1, r"FST type at byte \d+ has length 2147483647"),
    ("symbols", 10**15, r"1000000000000000 symbols cannot fit"),
])
def test_counts_that_cannot_fit_are_errors(tmp_path, field, value, what):
    """A count read from the file is checked against the bytes that remain
    before anything is allocated (a state count of 1e12 once asked NumPy
    for 7.28 TiB)."""
    entry = bytearray(_binary_entry("b", 0, *A_BYTES, flags=1 if field == "symbols" else 0,
                                    symbols=[["<eps>"]] if field == "symbols" else ()))
    body = 2  # after "b "
    at = {"type": body + 4, "states": body + 4 + 10 + 12 + 4 + 4 + 8 + 8, "arcs": body + 4 + 10 + 12 + 40 + 4,
          "symbols": body + 4 + 10 + 12 + 40 + 4 + 8 + 8}[field]
    fmt = "<i" if field == "type" else "<q"
    struct.pack_into(fmt, entry, at, value)
    data = _binary_entry("a", 0, *A_BYTES) + bytes(entry)
    (tmp_path / "big.ark").write_bytes(data)
    with pytest.raises(ValueError,
                       match=rf"big.ark: damaged FST archive: byte {data.index(b'b ')}: entry 'b' .*{what}"):
        read_kaldi_fst_archive(tmp_path / "big.ark")
    (tmp_path / "big.fst").write_bytes(bytes(entry[body:]))
    with pytest.raises(ValueError, match=f"big.fst: damaged binary FST: .*{what}"):
        Fst.read(tmp_path / "big.fst")


def _fuzz_corpus():
    rng = np.random.default_rng(7)
    graphs = []
    for i in range(3):  # float32 costs: the binary and the text forms hold the same graph
        f = random_fst(rng, num_states=4, num_arcs=6, num_pdfs=3, start=0)
        graphs.append((f"utt{i}", Fst(f.num_states, f.start, f.src, f.dst, f.pdf, f.log_prob.astype(np.float32),
                                      f.final.astype(np.float32))))
    binary = b"".join(k.encode() + b" " + _openfst_of(g) for k, g in graphs)
    text = "".join(f"{k} \n" + _kaldi_text(g) + "\n" for k, g in graphs).encode()
    return {"binary": binary, "text": text, "mixed": binary[: binary.index(b"utt1 ")] + text[text.index(b"utt1 "):],
            "single": _openfst_of(graphs[0][1])}


def _openfst_of(fst):
    arcs = [[] for _ in range(fst.num_states)]
    for s, d, p, lp in fst.arcs():
        arcs[s].append((p + 1, -lp, d))
    return _openfst(fst.start, [-x for x in fst.final.tolist()], arcs)


def _kaldi_text(fst):
    """Kaldi's text form: the acceptor text with each arc's label on both sides."""
    lines = [f.split("\t") for f in fst.to_openfst_text().splitlines()]
    return "".join("\t".join(f[:3] + f[2:] if len(f) >= 3 else f) + "\n" for f in lines)


CORPUS = _fuzz_corpus()


def _read_damaged(tmp_path, kind, data):
    """Read ``data`` as ``kind`` reads it: a dict / an Fst, or a ValueError naming the file."""
    path = tmp_path / f"fuzz-{kind}.bin"
    path.write_bytes(data)
    readers = [Fst.read] if kind == "single" else [read_kaldi_fst_archive]
    if kind == "text":
        readers.append(read_fst_archive)
    for reader in readers:
        try:
            reader(path)
        except ValueError as e:
            assert str(e).startswith(os.fspath(path) + ": "), str(e)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(CORPUS)), data=st.data())
def test_fuzz_damaged_files_are_value_errors(tmp_path, kind, data):
    """Truncated files and files with bits flipped or 8 bytes overwritten (a
    huge or negative count) read as graphs or fail with a ValueError naming
    the file: never a MemoryError, another exception, a crash or a hang."""
    _read_damaged(tmp_path, kind, draw_damage(data, CORPUS[kind]))


def test_fuzz_corpus_reads(tmp_path):
    """The files the fuzzing damages are read whole, to the same graphs."""
    graphs = {}
    for kind, data in CORPUS.items():
        (tmp_path / kind).write_bytes(data)
        graphs[kind] = Fst.read(tmp_path / kind) if kind == "single" else read_kaldi_fst_archive(tmp_path / kind)
    assert graphs["binary"] == graphs["text"] == graphs["mixed"] == read_fst_archive(tmp_path / "text")
    assert graphs["single"] == graphs["binary"]["utt0"] and len(graphs["binary"]) == 3
