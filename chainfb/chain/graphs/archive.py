"""Reading and writing many graphs at once.

Text archives (Kaldi's text-archive layout for FSTs): for each entry a line
with the key, then the OpenFst text of the graph (label = pdf + 1, weight =
cost), then an empty line.  A graph with arcs spanning several frames is
written in the transducer form of :meth:`~chainfb.Fst.to_openfst_text`
(``src dst pdf+1 span cost``) under the key line ``key spans``, so that it
is read back with its spans.  Kaldi writes the key line as ``key `` (a space
after the key) and its graphs in OpenFst's transducer form (``src dst
ilabel olabel [cost]``, label ``pdf + 1`` on both sides); such entries are
read in that form.

Kaldi binary archives (for each entry: the key, a space, the FST in
OpenFst's binary form, :mod:`chainfb.fst_binary`) are read and written
here, with no extra package; they cannot hold spans.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from ... import checks, fst_binary
from ...fst import Fst

__all__ = ["write_fst_archive", "read_fst_archive", "have_kaldifst", "write_kaldi_fst_archive",
           "read_kaldi_fst_archive"]


def _check_item(n: int, item) -> tuple[str, Fst]:
    try:
        key, fst = item
    except (TypeError, ValueError):
        raise TypeError(f"items[{n}]: expected a (key, Fst) pair, got {type(item).__name__}") from None
    if not isinstance(key, str) or not key or any(ch.isspace() for ch in key):
        raise ValueError(f"items: key {key!r} must be a non-empty string without whitespace")
    if not isinstance(fst, Fst):
        raise TypeError(f"items: entry {key!r}: expected chainfb.Fst, got {type(fst).__name__}")
    return key, fst


def write_fst_archive(path: str | os.PathLike, items: Iterable[tuple[str, Fst]]) -> int:
    """Write ``(key, Fst)`` pairs as a text archive; returns the count.

    A graph with arcs spanning several frames gets the key line ``key
    spans`` and keeps its spans (:func:`read_fst_archive` reads them back).
    """
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for item in items:
            key, fst = _check_item(n, item)
            mark = f" {_SPANS}" if fst.max_span > 1 else ""
            f.write(f"{key}{mark}\n{fst.to_openfst_text()}\n")
            n += 1
    return n


_SPANS = "spans"  # the key line's mark of a graph whose arcs span several frames


def _damaged(path, message: str) -> ValueError:
    return ValueError(f"{os.fspath(path)}: damaged FST archive: {message}")


def _parse_entry(path, key: str, first_line: int, lines: list[str], acceptor: bool | None = None,
                 spans: bool = False) -> Fst:
    """The Fst of one text entry whose graph lines start at file line
    ``first_line``; errors name the file, the key and the file line."""
    try:
        return Fst.from_openfst_text("\n".join(lines), acceptor=acceptor, spans=spans)
    except ValueError as e:
        m = _LINE.match(str(e))
        if m:  # the parser counts lines from the entry's first graph line
            raise _damaged(path, f"line {first_line + int(m.group(1)) - 1}: entry {key!r}: {m.group(2)}") from None
        raise _damaged(path, f"entry {key!r} (lines {first_line}-{first_line + len(lines) - 1}): {e}") from None


_LINE = re.compile(r"line (\d+): (.*)", re.S)


def read_fst_archive(path: str | os.PathLike, acceptor: bool | None = None) -> dict[str, Fst]:
    """Read a text archive written by :func:`write_fst_archive` or by Kaldi
    (``fstcopy ark:- ark,t:-``, ``copy-...`` with ``ark,t:``): ``{key: Fst}``
    in file order.

    Each entry is a line holding its key, the graph's lines, and an empty
    line that ends it.  The form of an entry's lines: ``acceptor=None``
    tells it per entry -- under a key line ``key spans`` the span form of
    :meth:`~chainfb.Fst.to_openfst_text`; under Kaldi's key line (the key
    and a space) OpenFst's transducer form, ``src dst ilabel olabel
    [cost]`` with ``ilabel == olabel = pdf + 1``, as Kaldi always writes
    FSTs; otherwise as :meth:`~chainfb.Fst.from_openfst_text` detects it
    (a five-field line means the transducer form, else the acceptor form
    ``src dst label [cost]``).  ``acceptor=True`` / ``False`` sets the form
    of every entry without a ``spans`` mark.

    A damaged archive is a ``ValueError`` naming the file, the entry's key
    and the file line: bytes that are not UTF-8, a malformed graph line
    (e.g. a wrong number of fields), a duplicate key, or a last entry
    without its empty line (a truncated archive, which could otherwise turn
    the arc line ``1 1 2 0.5`` cut to ``1 1`` into a final state).
    """
    if acceptor is not None:
        acceptor = checks.flag(acceptor, "acceptor")
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        if data[:4] == fst_binary.MAGIC_BYTES:
            raise _single_fst(path) from None
        raise _damaged(path, f"line {line}: not UTF-8 text (byte {e.start}); Kaldi binary archives are read by "
                             f"read_kaldi_fst_archive") from None
    out: dict[str, Fst] = {}
    key, key_line, body, form = None, 0, [], (acceptor, False)
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()  # the empty string after the last newline is not a line
    for lineno, line in enumerate(lines, 1):
        fields = line.split()
        if key is None:
            if not fields:
                continue  # blank lines between entries
            if len(fields) == 2 and fields[1] == _SPANS:
                form = (False, True)
            elif len(fields) != 1:
                raise _damaged(path, f"line {lineno}: expected a key line, got {line!r}")
            elif acceptor is None and line.endswith(" "):
                form = (False, False)  # Kaldi's key line: its FSTs are in the transducer form
            else:
                form = (acceptor, False)
            key, key_line, body = fields[0], lineno, []
            if key in out:
                raise _damaged(path, f"line {lineno}: duplicate key {key!r}")
        elif fields:
            body.append(line)
        else:  # the empty line ending the entry
            if not body:
                raise _damaged(path, f"line {lineno}: entry {key!r} (line {key_line}) has no graph lines")
            out[key] = _parse_entry(path, key, key_line + 1, body, *form)
            key = None
    if key is not None:
        last = key_line + len(body)
        raise _damaged(path, f"line {last}: entry {key!r} (line {key_line}) does not end with an empty line; "
                             f"the archive is truncated")
    return out


def _single_fst(path) -> ValueError:
    return ValueError(f"{os.fspath(path)}: not an FST archive: it is one binary OpenFst FST (no key), "
                      f"read by chainfb.Fst.read")


def have_kaldifst() -> bool:
    """Whether the optional ``kaldifst`` package is importable (chainfb
    reads and writes Kaldi archives without it; tests cross-check with it)."""
    try:
        import kaldifst  # noqa: F401
    except ImportError:
        return False
    return True


def write_kaldi_fst_archive(path: str | os.PathLike, items: Iterable[tuple[str, Fst]]) -> int:
    """Write ``(key, Fst)`` pairs as a Kaldi binary archive of OpenFst
    ``vector`` FSTs (label ``pdf + 1`` on both sides, float32 costs), as
    Kaldi's ``copy-fst``/``compile-train-graphs`` write them; returns the
    count.  A graph with arcs spanning several frames is a ``ValueError``
    naming ``items`` (Kaldi's FSTs cannot hold spans; :func:`write_fst_archive`
    keeps them); nothing is written then."""
    chunks, n = [], 0
    for item in items:
        key, fst = _check_item(n, item)
        chunks.append(key.encode("utf-8") + b" " + fst_binary.encode(fst, f"items: entry {key!r}"))
        n += 1
    with open(path, "wb") as f:
        f.write(b"".join(chunks))
    return n


_KEY = re.compile(rb"([^\s]+) ")
_EMPTY_LINE = re.compile(rb"\n[ \t\r]*\n")


def _decode_kaldi_archive(path, data: bytes) -> list[tuple[str, int, Fst]]:
    """``[(key, byte offset, Fst)]``: the entries of a Kaldi FST archive
    (each entry: the key, a space, then the FST in OpenFst's binary form, or
    in Kaldi's text form: a newline, the transducer text, an empty line).
    A truncated or damaged entry is a ``ValueError`` naming the file, the
    key and the entry's byte offset."""
    entries, pos, n = [], 0, len(data)
    while pos < n:
        after = f" after entry {entries[-1][0]!r}" if entries else ""
        m = _KEY.match(data, pos)
        if not m:
            rest = data[pos:]
            if pos == 0 and rest[:4] == fst_binary.MAGIC_BYTES:
                raise _single_fst(path)
            if rest and not re.search(rb"\s", rest):
                partial = rest.decode("utf-8", "replace")
                raise _damaged(path, f"byte {pos}: entry {partial!r}{after} is truncated: the file ends in its key")
            raise _damaged(path, f"byte {pos}{after}: expected a key followed by a space")
        try:
            key = m.group(1).decode("utf-8")
        except UnicodeDecodeError:
            raise _damaged(path, f"byte {pos}{after}: the key is not UTF-8 text") from None
        start, pos = pos, m.end()

        def fail(what, key=key, start=start):
            return _damaged(path, f"byte {start}: entry {key!r} {what}")

        if pos == n:
            raise fail(f"is truncated: the file ends after its key ({n} bytes)")
        if data[pos:pos + 1].isspace():  # Kaldi's text form (binary FSTs start with the magic number)
            end = _EMPTY_LINE.search(data, pos)
            if end is None:
                raise fail("is truncated: its text graph does not end with an empty line")
            try:
                text = data[pos:end.start()].decode("utf-8")
                fst = Fst.from_openfst_text(text, acceptor=False)
            except (UnicodeDecodeError, ValueError) as e:
                raise fail(f"(a text graph) is damaged: {e}") from None
            pos = end.end()
        else:
            fst, pos = fst_binary.decode(data, pos, fail, Fst)
        entries.append((key, start, fst))
    return entries


def read_kaldi_fst_archive(path: str | os.PathLike) -> dict[str, Fst]:
    """Read a Kaldi archive of FSTs over ``pdf + 1`` (e.g. e2e supervision
    graphs, ``compile-train-graphs`` mapped to pdfs): ``{key: Fst}`` in file
    order, with no extra package.

    Entries in OpenFst's binary ``vector`` form (what Kaldi's ``ark:``
    writers and :func:`write_kaldi_fst_archive` write; symbol tables are
    skipped) and in Kaldi's text form (``ark,t:``: OpenFst's transducer
    text) are read; the label must be the same on both sides of every arc
    (Kaldi's chain graphs are written so).  A damaged archive (truncated,
    bytes that are not an FST, a count that cannot fit in the file) is a
    ``ValueError`` naming the file, the entry's key and its byte offset.
    """
    with open(path, "rb") as f:  # a missing file is the usual OSError
        data = f.read()
    out: dict[str, Fst] = {}
    for key, offset, fst in _decode_kaldi_archive(path, data):
        if key in out:
            raise _damaged(path, f"byte {offset}: duplicate key {key!r}")
        out[key] = fst
    return out
