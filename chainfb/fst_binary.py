"""OpenFst's binary form of one FST: what Kaldi writes for ``den.fst`` and
``normalization.fst`` (``chain-make-den-fst``) and for each entry of a
binary FST archive (``compile-train-graphs``, ``fstcopy``).

The layout (little-endian; OpenFst's ``FstHeader`` then
``VectorFst::WriteFst``):

* the header: the magic number 2125659606 (int32); the FST type and the arc
  type as strings (int32 length, then the bytes): ``"vector"`` and
  ``"standard"`` (tropical weights, float32); the version (int32, 2); flags
  (int32: 1 an input symbol table follows the header, 2 an output symbol
  table, 4 aligned); properties (uint64); the start state, the number of
  states and the number of arcs (int64 each; OpenFst writes 0 arcs for a
  vector FST, the states carry the counts);
* each symbol table the flags announce: its magic number 2125658996 (int32),
  its name (a string), the next free key and the number of symbols (int64),
  then per symbol its string and its key (int64);
* per state: the final weight (float32 cost; ``inf`` where not final), the
  number of arcs (int64), and the arcs: input label, output label (int32),
  weight (float32 cost), next state (int32).

Kaldi writes the graphs of its chain examples (``chain::Supervision``) as
``compact_acceptor`` FSTs: the same header (the number of arcs counts the
arcs), then ``number of states + 1`` uint32 offsets into the elements, then
the elements, each a label (int32), a cost (float32) and a next state
(int32); a final state's first element holds its final cost, with label
and next state -1.  Both forms are read; the ``vector`` form is written.

chainfb's graphs have label ``pdf + 1`` on both sides (Kaldi's chain tools
write them so); weights are ``-log p`` rounded to float32.  Every count
read from the bytes is checked against the bytes that remain before
anything is allocated, so a damaged file is a ``ValueError``, never a
``MemoryError``.  OpenFst's ``const`` FSTs (Kaldi writes them for decoding
graphs such as ``HCLG.fst``, not for the chain graphs) are refused by name.

This module sits beside :mod:`chainfb.fst` and below it (``Fst.read`` and
``Fst.write`` use it): it reads an :class:`~chainfb.Fst`'s fields and is
given its constructor, and imports nothing of chainfb.
"""

from __future__ import annotations

import mmap
import struct
from typing import Any
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .fst import Fst

__all__ = ["MAGIC", "MAGIC_BYTES", "encode", "decode"]

MAGIC = 2125659606
MAGIC_BYTES = struct.pack("<i", MAGIC)
_SYMBOL_TABLE_MAGIC = 2125658996
_VERSION = 2
_HAS_ISYMBOLS, _HAS_OSYMBOLS, _IS_ALIGNED = 1, 2, 4
# properties written: expanded | mutable | acceptor | no epsilons (input, output, both): all true of an Fst
_PROPERTIES = 0x1 | 0x2 | 0x10000 | 0x800000 | 0x2000000 | 0x8000000
_HEADER_TAIL = struct.Struct("<iiQqqq")  # version, flags, properties, start, states, arcs
_STATE = struct.Struct("<fq")  # final cost, number of arcs
_INT32, _INT64, _TWO_INT64 = struct.Struct("<i"), struct.Struct("<q"), struct.Struct("<qq")
ARC = np.dtype([("ilabel", "<i4"), ("olabel", "<i4"), ("weight", "<f4"), ("nextstate", "<i4")])
_COMPACT = np.dtype([("label", "<i4"), ("weight", "<f4"), ("nextstate", "<i4")])
_MAX_NAME = 256  # FST and arc type names are short words


def _string(name: bytes) -> bytes:
    return struct.pack("<i", len(name)) + name


def encode(fst: Fst, name: str = "fst") -> bytes:
    """``fst`` (a :class:`chainfb.Fst`, checked by the caller) in OpenFst's
    binary ``vector`` form (label ``pdf + 1`` on both sides, float32 costs).
    Arcs spanning several frames cannot be held: a ``ValueError`` naming
    ``name``."""
    if fst.max_span > 1:
        raise ValueError(f"{name}: has arcs spanning up to {fst.max_span} frames; OpenFst's and Kaldi's binary "
                         f"FSTs cannot hold spans (chainfb's text form keeps them)")
    if fst.num_arcs and int(fst.pdf.max()) + 1 > np.iinfo(np.int32).max:
        raise ValueError(f"{name}: pdf {int(fst.pdf.max())} does not fit a 32-bit label")
    S = fst.num_states
    out = [MAGIC_BYTES, _string(b"vector"), _string(b"standard"),
           _HEADER_TAIL.pack(_VERSION, 0, _PROPERTIES, fst.start, S, 0)]
    order = np.argsort(fst.src, kind="stable")
    arcs = np.empty(fst.num_arcs, dtype=ARC)
    arcs["ilabel"] = arcs["olabel"] = fst.pdf[order] + 1
    arcs["weight"] = 0.0 - fst.log_prob[order]  # a cost of 0 written +0
    arcs["nextstate"] = fst.dst[order]
    bounds = np.searchsorted(fst.src[order], np.arange(S + 1))
    final = 0.0 - fst.final
    for s in range(S):
        a, b = bounds[s], bounds[s + 1]
        out.append(_STATE.pack(final[s], b - a))
        out.append(arcs[a:b].tobytes())
    return b"".join(out)


class _Reader:
    """Bytes read from ``pos`` on, every size checked against what remains."""

    def __init__(self, data, pos: int, fail: Callable[[str], ValueError]):
        self.data, self.pos, self.fail = data, pos, fail

    def need(self, size: int, what: str) -> None:
        left = len(self.data) - self.pos
        if size > left:
            raise self.fail(f"is truncated: its {what} at byte {self.pos} needs {size} bytes, "
                            f"{left} remain in the file")

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        self.need(fmt.size, what)
        out = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return out

    def string(self, what: str, limit: int | None = None) -> bytes:
        (size,) = self.unpack(_INT32, what)
        if size < 0 or (limit is not None and size > limit):
            raise self.fail(f"has a damaged header: the {what} at byte {self.pos - 4} has length {size}")
        self.need(size, what)
        out = bytes(self.data[self.pos: self.pos + size])
        self.pos += size
        return out

    def symbol_table(self, what: str) -> None:
        """Skip one symbol table (its keys and strings are not needed)."""
        start = self.pos
        (magic,) = self.unpack(_INT32, what)
        if magic != _SYMBOL_TABLE_MAGIC:
            raise self.fail(f"has a damaged {what} at byte {start} (bad magic number)")
        self.string(f"{what}'s name")
        _available, count = self.unpack(_TWO_INT64, what)
        if count < 0 or 12 * count > len(self.data) - self.pos:  # each symbol: a length, its key
            raise self.fail(f"has a damaged {what} at byte {start}: {count} symbols cannot fit in the "
                            f"{len(self.data) - self.pos} bytes that remain")
        for _ in range(count):
            self.string(f"{what}'s symbol")
            self.unpack(_INT64, f"{what}'s key")


def decode(data: bytes | bytearray | memoryview | mmap.mmap, pos: int,
           fail: Callable[[str], ValueError], make: Callable[..., Any]) -> tuple[Any, int]:
    """The FST in OpenFst's binary form at byte ``pos`` of ``data`` (a
    ``vector`` FST, or the ``compact_acceptor`` form Kaldi writes into
    chain examples), built by ``make`` (:class:`chainfb.Fst`, or a class
    with its constructor), and the byte after it.  ``fail(what)`` makes the
    ``ValueError`` for a damaged FST (``what`` says what is wrong and at
    which byte)."""
    r = _Reader(data, pos, fail)
    r.need(4, "header")
    if bytes(data[pos: pos + 4]) != MAGIC_BYTES:
        raise fail(f"is not a binary OpenFst FST (bad magic number at byte {pos})")
    r.pos += 4
    fst_type = r.string("FST type", _MAX_NAME)
    arc_type = r.string("arc type", _MAX_NAME)
    _version, flags, _props, start, num_states, _num_arcs = r.unpack(_HEADER_TAIL, "header")
    if fst_type not in (b"vector", b"compact_acceptor"):
        kind = fst_type.decode("utf-8", "replace")
        raise fail(f"is a {kind!r} FST; chainfb reads OpenFst's 'vector' FSTs, which Kaldi's chain tools write "
                   f"(fstconvert --fst_type=vector converts one)")
    if arc_type != b"standard":
        kind = arc_type.decode("utf-8", "replace")
        raise fail(f"has {kind!r} arcs; chainfb reads 'standard' (tropical, float32) arcs")
    if flags & _HAS_ISYMBOLS:
        r.symbol_table("input symbol table")
    if flags & _HAS_OSYMBOLS:
        r.symbol_table("output symbol table")
    per_state = _STATE.size if fst_type == b"vector" else 4  # a vector state's final and count; a compact offset
    left = len(data) - r.pos
    if num_states < 1 or per_state * num_states > left:
        raise fail(f"has a damaged header: {num_states} states"
                   + ("" if num_states < 1 else f" cannot fit in the {left} bytes that remain"))
    if not 0 <= start < num_states:
        raise fail(f"has a damaged header: start state {start} of {num_states} states")
    if fst_type == b"vector":
        final, counts, ilabel, olabel, weight, nextstate = _vector_states(r, num_states)
    else:
        if flags & _IS_ALIGNED:
            raise fail("is an aligned compact FST (written with --fst_align); chainfb reads unaligned ones")
        final, counts, ilabel, weight, nextstate = _compact_acceptor_states(r, num_states)
        olabel = ilabel
    if (ilabel != olabel).any():
        i = int(np.argmax(ilabel != olabel))
        raise fail(f"is not an acceptor over pdf + 1: an arc has input label {ilabel[i]} and output label "
                   f"{olabel[i]} (Kaldi's chain graphs have pdf + 1 on both sides; a graph of "
                   f"transition-ids or words is not one)")
    if (ilabel <= 0).any():
        raise fail("has an epsilon or negative label (graphs are epsilon-free, label = pdf + 1)")
    if nextstate.size and (nextstate.min() < 0 or nextstate.max() >= num_states):
        raise fail(f"has an arc to a state outside [0, {num_states})")
    try:
        fst = make(num_states, start, np.repeat(np.arange(num_states), counts), nextstate,
                   ilabel - 1, 0.0 - weight.astype(np.float64), 0.0 - final)
    except ValueError as e:
        raise fail(f"is not a valid graph: {e}") from None
    return fst, r.pos


def _vector_states(r: _Reader, num_states: int):
    """A vector FST's states: per state the final cost, the arc count and the arcs."""
    final = np.empty(num_states, dtype=np.float64)
    counts = np.empty(num_states, dtype=np.int64)
    chunks = []
    for s in range(num_states):
        final[s], n = r.unpack(_STATE, "states")
        if n < 0:
            raise r.fail(f"has a damaged arc count ({n}) at state {s} (byte {r.pos - 8})")
        r.need(ARC.itemsize * n, f"{n} arcs of state {s}")
        chunks.append(np.frombuffer(r.data, ARC, n, r.pos))
        counts[s] = n
        r.pos += ARC.itemsize * n
    arc = np.concatenate(chunks)
    return final, counts, arc["ilabel"], arc["olabel"], arc["weight"], arc["nextstate"]


def _compact_acceptor_states(r: _Reader, num_states: int):
    """A ``compact_acceptor`` FST (OpenFst's ``DefaultCompactStore`` of
    ``AcceptorCompactor`` elements): ``num_states + 1`` uint32 offsets into
    the elements, then the elements ``((label int32, cost float32),
    nextstate int32)``; a final state's first element is its final cost
    with label and next state -1."""
    r.need(4 * (num_states + 1), "state offsets")
    offsets = np.frombuffer(r.data, "<u4", num_states + 1, r.pos).astype(np.int64)
    at = r.pos
    r.pos += 4 * (num_states + 1)
    if offsets[0] != 0 or (np.diff(offsets) < 0).any():
        raise r.fail(f"has damaged state offsets at byte {at}")
    count = int(offsets[-1])
    r.need(_COMPACT.itemsize * count, f"{count} arcs and finals")
    elem = np.frombuffer(r.data, _COMPACT, count, r.pos)
    r.pos += _COMPACT.itemsize * count
    first = np.zeros(count, dtype=bool)
    first[offsets[:-1][np.diff(offsets) > 0]] = True
    is_final = elem["label"] == -1
    if (is_final & ~first).any() or (elem["nextstate"][is_final] != -1).any():
        raise r.fail("has a damaged final weight (a superfinal element that is not its state's first)")
    final = np.full(num_states, np.inf)
    state_of = np.repeat(np.arange(num_states), np.diff(offsets))
    final[state_of[is_final]] = elem["weight"][is_final]
    arcs = elem[~is_final]
    counts = np.bincount(state_of[~is_final], minlength=num_states)
    return final, counts, arcs["label"], arcs["weight"], arcs["nextstate"]
