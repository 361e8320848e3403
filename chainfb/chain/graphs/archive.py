"""Reading and writing many graphs at once.

Text archives (Kaldi's text-archive layout for FSTs): for each entry a line
with the key, then the OpenFst text of the graph (label = pdf + 1, weight =
cost), then an empty line.  Kaldi binary archives go through ``kaldifst``
when it is installed (optional extra ``kaldi``).
"""

from __future__ import annotations

import os
from typing import Iterable

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


def read_fst_archive(path: str | os.PathLike) -> dict[str, Fst]:
    """Read a text archive written by :func:`write_fst_archive` (or Kaldi's
    ``fstcopy ark:- ark,t:-`` for acceptors): ``{key: Fst}`` in file order."""
    out: dict[str, Fst] = {}
    with open(path, "r", encoding="utf-8") as f:
        blocks = f.read().split("\n\n")
    for block in blocks:
        lines = [ln for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        key = lines[0].split()[0]
        if len(lines[0].split()) != 1:
            raise ValueError(f"{path}: expected a key line, got {lines[0]!r}")
        if key in out:
            raise ValueError(f"{path}: duplicate key {key!r}")
        out[key] = Fst.from_openfst_text("\n".join(lines[1:]))
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


def read_kaldi_fst_archive(path: str | os.PathLike) -> dict[str, Fst]:
    """Read a Kaldi archive of StdVectorFst acceptors (e.g. e2e supervision
    graphs, label = pdf + 1) through ``kaldifst``: ``{key: Fst}``."""
    kaldifst = _kaldifst()
    reader = kaldifst.SequentialVectorFstReader(f"ark:{os.fspath(path)}")
    out: dict[str, Fst] = {}
    while not reader.done:
        out[reader.key] = Fst.from_openfst_text(str(reader.value))
        reader.next()
    return out
