"""Reading and writing many graphs at once.

Text archives (Kaldi's text-archive layout for FSTs): for each entry a line
with the key, then the OpenFst text of the graph (label = pdf + 1, weight =
cost), then an empty line.  Kaldi binary archives go through ``kaldifst``
when it is installed (optional extra ``kaldi``).
"""

from __future__ import annotations

import os
import re
import struct
from typing import Iterable

import numpy as np

from ...fst import Fst

__all__ = ["write_fst_archive", "read_fst_archive", "have_kaldifst", "write_kaldi_fst_archive", "read_kaldi_fst_archive"]


def write_fst_archive(path: str | os.PathLike, items: Iterable[tuple[str, Fst]]) -> int:
    """Write ``(key, Fst)`` pairs as a text archive; returns the count."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for key, fst in items:
            if not key or any(ch.isspace() for ch in key):
                raise ValueError(f"items: key {key!r} must be non-empty without whitespace")
            f.write(f"{key}\n{fst.to_openfst_text()}\n")
            n += 1
    return n


def _damaged(path, message: str) -> ValueError:
    return ValueError(f"{os.fspath(path)}: damaged FST archive: {message}")


def _parse_entry(path, key: str, first_line: int, lines: list[str]) -> Fst:
    """The Fst of one text entry whose graph lines start at file line
    ``first_line``; errors name the file, the key and the file line."""
    try:
        return Fst.from_openfst_text("\n".join(lines))
    except ValueError as e:
        m = _LINE.match(str(e))
        if m:  # the parser counts lines from the entry's first graph line
            raise _damaged(path, f"line {first_line + int(m.group(1)) - 1}: entry {key!r}: {m.group(2)}") from None
        raise _damaged(path, f"entry {key!r} (lines {first_line}-{first_line + len(lines) - 1}): {e}") from None


_LINE = re.compile(r"line (\d+): (.*)", re.S)


def read_fst_archive(path: str | os.PathLike) -> dict[str, Fst]:
    """Read a text archive written by :func:`write_fst_archive` (or Kaldi's
    ``fstcopy ark:- ark,t:-`` for acceptors): ``{key: Fst}`` in file order.

    Each entry is a line holding only its key, the graph's lines, and an
    empty line that ends it.  A damaged archive is a ``ValueError`` naming
    the file, the entry's key and the file line: bytes that are not UTF-8,
    a malformed graph line (e.g. a wrong number of fields), a duplicate key,
    or a last entry without its empty line (a truncated archive, which
    could otherwise turn the arc line ``1 1 2 0.5`` cut to ``1 1`` into a
    final state).
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise _damaged(path, f"line {line}: not UTF-8 text (byte {e.start}); Kaldi binary archives are read by "
                             f"read_kaldi_fst_archive") from None
    out: dict[str, Fst] = {}
    key, key_line, body = None, 0, []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()  # the empty string after the last newline is not a line
    for lineno, line in enumerate(lines, 1):
        fields = line.split()
        if key is None:
            if not fields:
                continue  # blank lines between entries
            if len(fields) != 1:
                raise _damaged(path, f"line {lineno}: expected a key line, got {line!r}")
            key, key_line, body = fields[0], lineno, []
            if key in out:
                raise _damaged(path, f"line {lineno}: duplicate key {key!r}")
        elif fields:
            body.append(line)
        else:  # the empty line ending the entry
            if not body:
                raise _damaged(path, f"line {lineno}: entry {key!r} (line {key_line}) has no graph lines")
            out[key] = _parse_entry(path, key, key_line + 1, body)
            key = None
    if key is not None:
        last = key_line + len(body)
        raise _damaged(path, f"line {last}: entry {key!r} (line {key_line}) does not end with an empty line; "
                             f"the archive is truncated")
    return out


def have_kaldifst() -> bool:
    """Whether the optional ``kaldifst`` package is importable."""
    try:
        import kaldifst  # noqa: F401
    except ImportError:
        return False
    return True


def _kaldifst():
    try:
        import kaldifst
    except ImportError:
        raise ImportError("Kaldi binary archives need the optional 'kaldifst' package "
                          "(pip install 'chainfb[kaldi]')") from None
    return kaldifst


def write_kaldi_fst_archive(path: str | os.PathLike, items: Iterable[tuple[str, Fst]]) -> int:
    """Write ``(key, Fst)`` pairs as a Kaldi binary archive of StdVectorFst
    (acceptors, label = pdf + 1) through ``kaldifst``; returns the count."""
    kaldifst = _kaldifst()
    writer = kaldifst.VectorFstWriter(f"ark:{os.fspath(path)}")
    n = 0
    try:
        for key, fst in items:
            writer.write(key, kaldifst.compile(fst.to_openfst_text(), acceptor=True, keep_state_numbering=True))
            n += 1
    finally:
        writer.close()
    return n


# OpenFst's binary VectorFst (fst.h FstHeader, vector-fst.h) with "standard" (tropical float) arcs
_FST_MAGIC = 2125659606
_FST_MAGIC_BYTES = struct.pack("<i", _FST_MAGIC)
_ARC = np.dtype([("ilabel", "<i4"), ("olabel", "<i4"), ("weight", "<f4"), ("nextstate", "<i4")])
_STATE_BYTES = 12  # final weight float32, number of arcs int64
_KEY = re.compile(rb"([^\s]+) ")


def _decode_kaldi_archive(path, data: bytes):
    """``[(key, byte offset, Fst)]``: the entries of a Kaldi archive of
    binary StdVectorFsts (each entry: the key, a space, the FST in OpenFst's
    binary form), decoded here; None when an entry is in a form this reader
    does not decode (a text entry, symbol tables, another FST or arc type:
    ``kaldifst`` reads those).  A truncated or damaged entry is a
    ``ValueError`` naming the file, the key and the entry's byte offset."""
    entries, pos, n = [], 0, len(data)
    while pos < n:
        after = f" after entry {entries[-1][0]!r}" if entries else ""
        m = _KEY.match(data, pos)
        if not m:
            rest = data[pos:]
            if rest and not re.search(rb"\s", rest):
                partial = rest.decode("utf-8", "replace")
                raise _damaged(path, f"byte {pos}: entry {partial!r}{after} is truncated: the file ends in its key")
            raise _damaged(path, f"byte {pos}{after}: expected a key followed by a space")
        try:
            key = m.group(1).decode("utf-8")
        except UnicodeDecodeError:
            raise _damaged(path, f"byte {pos}{after}: the key is not UTF-8 text") from None
        start, pos = pos, m.end()

        def damaged(what):
            return _damaged(path, f"byte {start}: entry {key!r} {what}")

        def need(size, what):
            if pos + size > n:
                raise damaged(f"is truncated: its {what} would run past the end of the file ({n} bytes)")

        need(1, "graph")
        if data[pos: pos + 1] != _FST_MAGIC_BYTES[:1]:
            return None  # a text entry (Kaldi tells binary FSTs by the magic number's first byte)
        need(4, "header")
        if data[pos: pos + 4] != _FST_MAGIC_BYTES:
            raise damaged("is not a binary OpenFst FST (bad magic number)")
        pos += 4
        names = []
        for _ in range(2):  # the FST type and the arc type
            need(4, "header")
            (size,) = struct.unpack_from("<i", data, pos)
            if not 0 <= size <= 64:
                raise damaged("has a damaged header")
            need(4 + size, "header")
            names.append(data[pos + 4: pos + 4 + size])
            pos += 4 + size
        need(40, "header")
        _version, flags, _props, start_state, num_states, _num_arcs = struct.unpack_from("<iiQqqq", data, pos)
        pos += 40
        if names != [b"vector", b"standard"] or flags & 7 or num_states == -1:
            return None  # symbol tables, alignment, a streamed state count: kaldifst reads these
        if num_states < 1 or not 0 <= start_state < num_states:
            raise damaged(f"has a damaged header ({num_states} states, start state {start_state})")
        final = np.empty(num_states, dtype=np.float64)
        arcs, src = [], []
        for s in range(num_states):
            need(_STATE_BYTES, "states")
            final[s], num_arcs = struct.unpack_from("<fq", data, pos)
            if num_arcs < 0:
                raise damaged(f"has a damaged arc count ({num_arcs}) at state {s}")
            need(_STATE_BYTES + _ARC.itemsize * num_arcs, "arcs")
            arcs.append(np.frombuffer(data, _ARC, num_arcs, pos + _STATE_BYTES))
            src.append(np.full(num_arcs, s, dtype=np.int64))
            pos += _STATE_BYTES + _ARC.itemsize * num_arcs
        arc = np.concatenate(arcs)
        if (arc["ilabel"] != arc["olabel"]).any():
            raise damaged("is not an acceptor (an arc's input and output labels differ)")
        if (arc["ilabel"] <= 0).any():
            raise damaged("has an epsilon or negative label (graphs are epsilon-free, label = pdf + 1)")
        if arc.size and (arc["nextstate"].min() < 0 or arc["nextstate"].max() >= num_states):
            raise damaged(f"has an arc to a state outside [0, {num_states})")
        try:
            fst = Fst(num_states, start_state, np.concatenate(src), arc["nextstate"], arc["ilabel"] - 1,
                      -arc["weight"].astype(np.float64), -final)
        except ValueError as e:
            raise damaged(f"is not a valid graph: {e}") from None
        entries.append((key, start, fst))
    return entries


def read_kaldi_fst_archive(path: str | os.PathLike) -> dict[str, Fst]:
    """Read a Kaldi archive of StdVectorFst acceptors (e.g. e2e supervision
    graphs, label = pdf + 1): ``{key: Fst}`` in file order.

    Binary vector FSTs (what Kaldi's ``fstcopy`` and
    :func:`write_kaldi_fst_archive` write) are decoded here; archives with
    other entries (text, symbol tables) go through ``kaldifst``.  A damaged
    archive (truncated, or with bytes that are not an FST) is a
    ``ValueError`` naming the file, the entry's key and its byte offset;
    ``kaldifst`` alone would print an error and return the entries before
    the damage.
    """
    with open(path, "rb") as f:  # a missing file is the usual OSError
        data = f.read()
    entries = _decode_kaldi_archive(path, data)
    if entries is not None:
        out: dict[str, Fst] = {}
        for key, offset, fst in entries:
            if key in out:
                raise _damaged(path, f"byte {offset}: duplicate key {key!r}")
            out[key] = fst
        return out
    return _read_with_kaldifst(path)


def _read_with_kaldifst(path) -> dict[str, Fst]:
    kaldifst = _kaldifst()
    try:
        reader = kaldifst.SequentialVectorFstReader(f"ark:{os.fspath(path)}")
    except RuntimeError:
        raise _damaged(path, "kaldifst cannot read its first entry") from None
    out: dict[str, Fst] = {}
    try:
        while not reader.done:
            key = reader.key
            if key in out:
                raise _damaged(path, f"entry {key!r}: duplicate key")
            try:
                out[key] = Fst.from_openfst_text(str(reader.value))
            except ValueError as e:
                raise _damaged(path, f"entry {key!r}: {e}") from None
            reader.next()
    finally:
        impl = getattr(reader, "_impl", None)  # kaldifst's close() drops Kaldi's status; its binding returns it
        closed_ok = impl.close() if impl is not None and impl.is_open else True
    if closed_ok is False:
        after = f" after entry {list(out)[-1]!r}" if out else ""
        raise _damaged(path, f"kaldifst stopped{after} with an error (the next entry is damaged)")
    return out
