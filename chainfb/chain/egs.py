"""Kaldi's chain training examples: archives of ``NnetChainExample``, as
``nnet3-chain-e2e-get-egs`` (end-to-end) and ``nnet3-chain-get-egs`` write
them in binary (``ark:``).

An archive entry is the key, a space, Kaldi's binary mark ``\\0B`` and the
example.  Binary Kaldi objects are tokens (the text, then a space) and basic
values (a size byte, 4 or 8, then the value; a bool is ``T`` or ``F``)::

    <Nnet3ChainEg> <NumInputs> int32  NnetIo * NumInputs
                   <NumOutputs> int32 NnetChainSupervision * NumOutputs
    </Nnet3ChainEg>
    NnetIo:  <NnetIo> name <I1V> int32 indexes  matrix  </NnetIo>
    NnetChainSupervision:  <NnetChainSup> name <I1V> int32 indexes
        <Supervision> <Weight> float <NumSequences> int32 <FramesPerSeq> int32
        <LabelDim> int32 <End2End> bool
        (e2e: <Fsts> one FST per sequence </Fsts>; otherwise one FST)
        [<AlignmentPdfs> int32 vector] </Supervision>
        [<DW2> FV int32 float32 * n] </NnetChainSup>

Index vectors hold ``(n, t, x)`` triples: one byte per index, the change of
``t`` from the index before (``n`` and ``x`` kept; the first relative to
``(0, 0, 0)``) when it is in ``(-125, 125)``, else the byte 127 and the
three values.  Matrices are ``FM``/``DM`` (rows, columns, then float32 /
float64 values) or Kaldi's compressed ``CM`` (per-column percentile
headers, one byte per value, column by column), ``CM2`` (two bytes per
value) and ``CM3`` (one byte); the FSTs are OpenFst ``compact_acceptor``
FSTs (:mod:`chainfb.fst_binary`), label ``pdf + 1``.

Every count is checked against the bytes that remain before anything is
allocated: a damaged archive is a ``ValueError`` naming the file, the
entry's key and the byte offset.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from collections.abc import Iterator

import numpy as np

from .. import fst_binary
from .._arrays import Ints
from ..fst import Fst
from .supervision import Supervision

__all__ = ["NnetIo", "ChainSupervision", "ChainExample", "read_chain_egs"]


@dataclass
class NnetIo:
    """One input of an example (``NnetIo``).

    Attributes
    ----------
    name : str — ``"input"``, ``"ivector"``, ...
    indexes : int32 ``[R, 3]`` — the ``(n, t, x)`` of each row.
    features : float32 ``[R, C]`` — decompressed where Kaldi compressed them.
    """

    name: str
    indexes: np.ndarray
    features: np.ndarray


@dataclass
class ChainSupervision:
    """One output of an example (``NnetChainSupervision`` and its
    ``chain::Supervision``).

    Attributes
    ----------
    name : str — ``"output"`` normally.
    indexes : int32 ``[num_sequences * frames_per_sequence, 3]`` — ``(n, t, x)``,
        ``t`` major (row ``t * num_sequences + n``, Kaldi's layout).
    weight : float
    num_sequences, frames_per_sequence, label_dim : int
    e2e : bool — end-to-end: ``fsts`` holds one graph per sequence;
        otherwise Kaldi's single graph of the (merged) sequences.
    fsts : list of Fst — label ``pdf + 1`` read as 0-based pdfs.
    deriv_weights : float32 ``[len(indexes)]`` or None
    alignment_pdfs : int32 array or None
    """

    name: str
    indexes: np.ndarray
    weight: float
    num_sequences: int
    frames_per_sequence: int
    label_dim: int
    e2e: bool
    fsts: list
    deriv_weights: np.ndarray | None = None
    alignment_pdfs: np.ndarray | None = None

    def supervision(self, lengths: Ints | None = None) -> Supervision:
        """The :class:`chainfb.Supervision` of an end-to-end output, for
        :class:`chainfb.GenericNumeratorComputation` (``weight`` and
        ``frames_per_sequence`` as Kaldi wrote them)."""
        if not self.e2e:
            raise ValueError("supervision: a non-e2e example holds one graph of all its sequences (Kaldi's "
                             "numerator, not GenericNumeratorComputation's); its graph is fsts[0]")
        return Supervision(self.fsts, self.frames_per_sequence, weight=self.weight, lengths=lengths)


@dataclass
class ChainExample:
    """A Kaldi chain example (``NnetChainExample``): ``inputs`` (list of
    :class:`NnetIo`) and ``outputs`` (list of :class:`ChainSupervision`)."""

    inputs: list
    outputs: list


_MAX_TOKEN = 256


class _Reader:
    """Kaldi's binary basic types from ``pos`` on; every size is checked
    against the bytes that remain."""

    def __init__(self, data, pos: int, fail):
        self.data, self.pos, self.fail = data, pos, fail

    def need(self, size: int, what: str) -> None:
        left = len(self.data) - self.pos
        if size > left:
            raise self.fail(f"is truncated: its {what} at byte {self.pos} needs {size} bytes, {left} remain")

    def token(self) -> str:
        end = self.data.find(b" ", self.pos, self.pos + _MAX_TOKEN + 1)
        if end < 0:
            if self.pos + _MAX_TOKEN + 1 > len(self.data):
                raise self.fail(f"is truncated: the token at byte {self.pos} runs past the end of the file")
            raise self.fail(f"has no token at byte {self.pos}")
        tok = bytes(self.data[self.pos:end])
        if not tok or any(c <= 32 or c >= 127 for c in tok):
            raise self.fail(f"has no token at byte {self.pos} (found {tok[:20]!r})")
        self.pos = end + 1
        return tok.decode("ascii")

    def expect(self, token: str) -> None:
        at = self.pos
        got = self.token()
        if got != token:
            raise self.fail(f"expected {token} at byte {at}, found {got}")

    def basic(self, fmt: str, what: str):
        """A size byte, then the value (``fmt``: ``i`` int32, ``f`` float, read as float or double)."""
        self.need(1, what)
        size = self.data[self.pos]
        sizes = {"i": {4: "<i"}, "f": {4: "<f", 8: "<d"}}[fmt]
        if size not in sizes:
            raise self.fail(f"has a damaged {what} at byte {self.pos} (size byte {size})")
        self.need(1 + size, what)
        (value,) = struct.unpack_from(sizes[size], self.data, self.pos + 1)
        self.pos += 1 + size
        return value

    def count(self, what: str, item_bytes: int) -> int:
        """An int32 count of items of at least ``item_bytes`` bytes each, checked against the bytes left."""
        at = self.pos
        n = self.basic("i", what)
        left = len(self.data) - self.pos
        if n < 0 or n * item_bytes > left:
            raise self.fail(f"has a damaged {what} at byte {at}: {n} cannot fit in the {left} bytes that remain")
        return n

    def boolean(self, what: str) -> bool:
        self.need(1, what)
        c = bytes(self.data[self.pos:self.pos + 1])
        if c not in (b"T", b"F"):
            raise self.fail(f"has a damaged {what} at byte {self.pos} (expected T or F)")
        self.pos += 1
        return c == b"T"

    def array(self, dtype, n: int, what: str) -> np.ndarray:
        dtype = np.dtype(dtype)
        self.need(dtype.itemsize * n, what)
        out = np.frombuffer(self.data, dtype, n, self.pos).copy()
        self.pos += dtype.itemsize * n
        return out

    def index_vector(self, what: str) -> np.ndarray:
        self.expect("<I1V>")
        n = self.count(f"{what} size", 1)
        out = np.zeros((n, 3), dtype=np.int64)
        last = (0, 0, 0)
        for i in range(n):
            self.need(1, what)
            c = struct.unpack_from("<b", self.data, self.pos)[0]
            self.pos += 1
            if -125 < c < 125:
                last = (last[0], last[1] + c, last[2])
            elif c == 127:
                last = tuple(self.basic("i", what) for _ in range(3))
            else:
                raise self.fail(f"has a damaged {what} at byte {self.pos - 1} (byte {c})")
            out[i] = last
        if n and (np.abs(out) > np.iinfo(np.int32).max).any():
            raise self.fail(f"has a damaged {what}: a t value outside int32")
        return out.astype(np.int32)

    def matrix(self, what: str) -> np.ndarray:
        at = self.pos
        kind = self.token()
        if kind in ("FM", "DM"):
            rows = self.count(f"{what} rows", 0)
            cols = self.count(f"{what} columns", 0)
            dtype = "<f4" if kind == "FM" else "<f8"
            self._fits(rows * cols * np.dtype(dtype).itemsize, what, at)
            return self.array(dtype, rows * cols, what).reshape(rows, cols).astype(np.float32)
        if kind in ("CM", "CM2", "CM3"):
            self.need(16, f"{what} header")
            lo, span, rows, cols = struct.unpack_from("<ffii", self.data, self.pos)
            self.pos += 16
            if rows < 0 or cols < 0:
                raise self.fail(f"has a damaged {what} header at byte {at}: {rows} x {cols}")
            if cols == 0:
                return np.zeros((0, 0), dtype=np.float32)
            return self._compressed(kind, lo, span, rows, cols, what, at)
        if kind == "SM":
            raise self.fail(f"has a sparse {what} at byte {at}; chainfb reads dense and compressed matrices")
        raise self.fail(f"expected a matrix (FM, DM, CM, CM2 or CM3) at byte {at}, found {kind}")

    def _fits(self, size: int, what: str, at: int) -> None:
        left = len(self.data) - self.pos
        if size > left:
            raise self.fail(f"has a damaged {what} at byte {at}: its {size} bytes cannot fit in the {left} "
                            f"bytes that remain")

    def _compressed(self, kind, lo, span, rows, cols, what, at) -> np.ndarray:
        """Kaldi's ``CompressedMatrix::CopyToMat``, in float32 as Kaldi computes it."""
        lo, span = np.float32(lo), np.float32(span)
        if kind == "CM":
            self._fits(cols * 8 + rows * cols, what, at)
            head = self.array("<u2", 4 * cols, what).reshape(cols, 4)
            p = lo + span * np.float32(1.52590218966964e-05) * head.astype(np.float32)  # [cols, 4]
            v = self.array("u1", rows * cols, what).reshape(cols, rows).astype(np.float32)
            p0, p25, p75, p100 = (p[:, k:k + 1] for k in range(4))
            out = np.where(v <= 64, p0 + (p25 - p0) * v * np.float32(1 / 64.0),
                           np.where(v <= 192, p25 + (p75 - p25) * (v - 64) * np.float32(1 / 128.0),
                                    p75 + (p100 - p75) * (v - 192) * np.float32(1 / 63.0)))
            return np.ascontiguousarray(out.T, dtype=np.float32)
        dtype, top = ("<u2", 65535.0) if kind == "CM2" else ("u1", 255.0)
        self._fits(rows * cols * np.dtype(dtype).itemsize, what, at)
        v = self.array(dtype, rows * cols, what).reshape(rows, cols).astype(np.float32)
        return (lo + v * (span * np.float32(1.0 / top))).astype(np.float32)

    def float_vector(self, what: str) -> np.ndarray:
        at = self.pos
        kind = self.token()
        if kind not in ("FV", "DV"):
            raise self.fail(f"expected a vector (FV or DV) at byte {at}, found {kind}")
        dtype = "<f4" if kind == "FV" else "<f8"
        n = self.count(f"{what} size", np.dtype(dtype).itemsize)
        return self.array(dtype, n, what).astype(np.float32)

    def int_vector(self, what: str) -> np.ndarray:
        self.need(1, what)
        if self.data[self.pos] != 4:
            raise self.fail(f"has a damaged {what} at byte {self.pos} (element size {self.data[self.pos]})")
        self.pos += 1
        self.need(4, what)
        (n,) = struct.unpack_from("<i", self.data, self.pos)
        self.pos += 4
        self._fits(4 * max(n, 0), what, self.pos)
        if n < 0:
            raise self.fail(f"has a damaged {what} size {n}")
        return self.array("<i4", n, what)

    def fst(self, what: str) -> Fst:
        fst, self.pos = fst_binary.decode(self.data, self.pos, lambda msg: self.fail(f"{what}: {msg}"), Fst)
        return fst


def _nnet_io(r: _Reader) -> NnetIo:
    r.expect("<NnetIo>")
    name = r.token()
    indexes = r.index_vector(f"input {name!r} indexes")
    features = r.matrix(f"input {name!r} matrix")
    if features.shape[0] != len(indexes):
        raise r.fail(f"has input {name!r} with {features.shape[0]} rows for {len(indexes)} indexes")
    r.expect("</NnetIo>")
    return NnetIo(name, indexes, features)


def _supervision(r: _Reader) -> ChainSupervision:
    r.expect("<NnetChainSup>")
    name = r.token()
    what = f"output {name!r}"
    indexes = r.index_vector(f"{what} indexes")
    r.expect("<Supervision>")
    r.expect("<Weight>")
    weight = r.basic("f", f"{what} weight")
    r.expect("<NumSequences>")
    num_sequences = r.basic("i", f"{what} number of sequences")
    r.expect("<FramesPerSeq>")
    frames = r.basic("i", f"{what} frames per sequence")
    r.expect("<LabelDim>")
    label_dim = r.basic("i", f"{what} label dimension")
    if num_sequences < 1 or frames < 1 or label_dim < 1 or len(indexes) != num_sequences * frames:
        raise r.fail(f"has a damaged {what}: {num_sequences} sequences of {frames} frames, label dimension "
                     f"{label_dim}, {len(indexes)} indexes")
    r.expect("<End2End>")
    e2e = r.boolean(f"{what} end-to-end flag")
    if e2e:
        r.expect("<Fsts>")
        fsts = [r.fst(f"{what} graph {i}") for i in range(num_sequences)]
        r.expect("</Fsts>")
    else:
        fsts = [r.fst(f"{what} graph")]
    for i, g in enumerate(fsts):
        if g.num_pdfs > label_dim:
            raise r.fail(f"has {what} graph {i} with pdf {g.num_pdfs - 1} >= label dimension {label_dim}")
    alignment = None
    at = r.pos
    tok = r.token()
    if tok == "<AlignmentPdfs>":
        alignment = r.int_vector(f"{what} alignment")
        at = r.pos
        tok = r.token()
    if tok != "</Supervision>":
        raise r.fail(f"expected </Supervision> at byte {at}, found {tok}")
    at = r.pos
    tok = r.token()
    deriv = None
    if tok == "<DW2>":
        deriv = r.float_vector(f"{what} derivative weights")
        if deriv.size == 0:
            deriv = None
        elif deriv.size != len(indexes):
            raise r.fail(f"has {deriv.size} derivative weights for {len(indexes)} indexes in {what}")
        at = r.pos
        tok = r.token()
    elif tok == "<DW>":
        raise r.fail(f"has derivative weights in the old <DW> form at byte {at}; nnet3-chain-copy-egs rewrites "
                     f"them")
    if tok != "</NnetChainSup>":
        raise r.fail(f"expected </NnetChainSup> at byte {at}, found {tok}")
    return ChainSupervision(name, indexes, float(weight), num_sequences, frames, label_dim, e2e, fsts, deriv,
                            alignment)


def _example(r: _Reader) -> ChainExample:
    r.expect("<Nnet3ChainEg>")
    r.expect("<NumInputs>")
    inputs = [_nnet_io(r) for _ in range(r.count("number of inputs", 16))]
    r.expect("<NumOutputs>")
    outputs = [_supervision(r) for _ in range(r.count("number of outputs", 16))]
    r.expect("</Nnet3ChainEg>")
    if not inputs or not outputs:
        raise r.fail(f"has {len(inputs)} inputs and {len(outputs)} outputs (Kaldi writes at least one of each)")
    return ChainExample(inputs, outputs)


_KEY = re.compile(rb"([^\s]+) ")


def read_chain_egs(path: str | os.PathLike) -> Iterator[tuple[str, ChainExample]]:
    """The ``(key, ChainExample)`` entries of a binary Kaldi archive of chain
    examples (``nnet3-chain-e2e-get-egs``, ``nnet3-chain-get-egs``,
    ``nnet3-chain-copy-egs``, ``nnet3-chain-merge-egs``), in file order,
    one at a time (the file is memory-mapped, not read whole).

    A damaged archive (truncated, a wrong token, a count that cannot fit in
    the file) is a ``ValueError`` naming the file, the entry's key and the
    byte offset.  Text archives (``ark,t:``) are refused by name.
    """
    where = os.fspath(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        pos, n, last = 0, len(data), None
        while pos < n:
            after = f" after entry {last!r}" if last is not None else ""
            m = _KEY.match(data, pos)
            if not m:
                raise ValueError(f"{where}: damaged chain-example archive: byte {pos}{after}: expected a key "
                                 f"followed by a space")
            key = m.group(1).decode("utf-8", "replace")
            start = pos

            def fail(what, key=key, start=start):
                return ValueError(f"{where}: damaged chain-example archive: byte {start}: entry {key!r} {what}")

            pos = m.end()
            if data[pos:pos + 2] != b"\0B":
                if data[pos:pos + 1].isspace() or data[pos:pos + 1] == b"<":
                    raise fail("is in Kaldi's text form; chainfb reads binary archives (nnet3-chain-copy-egs "
                               "ark,t:IN ark:OUT converts one)")
                raise fail(f"is not a binary Kaldi object (no \\0B mark at byte {pos})")
            r = _Reader(data, pos + 2, fail)
            eg = _example(r)
            pos, last = r.pos, key
            yield key, eg
    finally:
        try:
            data.close()
        except BufferError:  # a view is still alive (an error's traceback): the map closes when it goes
            pass
