"""Epsilon-free acceptors over pdfs: the graph data model of chainfb.

An :class:`Fst` has states ``0..S-1``, a start state, arcs
``(src, dst, pdf, log_prob, span)`` and a final log-probability per state
(``-inf`` where the state is not final).  An arc read at frame ``t`` (its
score is the pdf's score at frame ``t``) lands at frame ``t + span``;
``span >= 1``, and ``1`` (every arc consumes exactly one frame) is the
default and every graph of Kaldi's kind.  Arcs that span several frames
give durations without chains of auxiliary states.  Self-loops, cycles and
several final states are normal.

In memory ``pdf`` is 0-based.  In OpenFst/Kaldi text files the label is
``pdf + 1`` (label 0 is epsilon, which numerator graphs may not contain) and
weights are costs, ``cost = -log p``; a cost of ``Infinity`` (OpenFst's zero
weight) is legal and means the arc or final can never be taken.  A graph
with arcs spanning several frames is written in OpenFst's transducer format
with the span as the output label, ``src dst pdf+1 span cost`` on every arc
(the cost always written), and read back with ``spans=True``; graphs whose
arcs all span one frame keep the acceptor format.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping

import numpy as np
from numpy.typing import ArrayLike

from . import checks, fst_binary

__all__ = ["Fst"]


def _format_cost(log_prob: float) -> str:
    cost = -float(log_prob)
    if cost == math.inf:
        return "Infinity"
    if cost == 0.0:
        return "0"
    return repr(cost)


def _parse_cost(field: str, lineno: int) -> float:
    try:
        cost = float(field)
    except ValueError:
        raise ValueError(f"line {lineno}: weight {field!r} is not a number") from None
    if math.isnan(cost):
        raise ValueError(f"line {lineno}: weight is NaN")
    if cost == -math.inf:
        raise ValueError(f"line {lineno}: weight -Infinity (log-probability +inf) is not allowed")
    return cost


# a state id this far beyond the states actually used needs an explicit num_states
_SPARSE_SLACK = 1024
_MAX_ID = 2**62


def _id_array(values, where: str, what: str) -> np.ndarray:
    """int64 array of non-negative integer ids; fractional, boolean, huge or
    non-numeric values are errors naming ``where`` (no silent coercion)."""
    arr = np.asarray(values) if len(values) else np.zeros(0, dtype=np.int64)
    if arr.ndim == 1 and (arr.dtype.kind in "iu" or (arr.dtype.kind == "f" and np.isfinite(arr).all()
                                                     and (arr == np.floor(arr)).all())):
        if arr.size and (arr.min() < 0 or arr.max() >= _MAX_ID):
            i = int(np.argmax((arr < 0) | (arr >= _MAX_ID)))
            return _id_array_slow(values[i:i + 1], where.replace("{i}", str(i)), what)
        return arr.astype(np.int64)
    return _id_array_slow(values, where, what)


def _id_array_slow(values, where: str, what: str) -> np.ndarray:
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer, float, np.floating)):
            raise TypeError(f"{where.format(i=i)}: {what} must be an integer, got {v!r}")
        if isinstance(v, (float, np.floating)) and not float(v).is_integer():
            raise ValueError(f"{where.format(i=i)}: {what} must be an integer, got {v!r}")
        if v < 0:
            raise ValueError(f"{where.format(i=i)}: {what} {int(v)} is negative")
        if v >= _MAX_ID:
            raise ValueError(f"{where.format(i=i)}: {what} {int(v)} is outside [0, 2**62)")
        out[i] = int(v)
    return out


# ids in text FSTs: ASCII digits only (Python's int() would also take "1_0", "+0" and non-ASCII digits)
_ID = re.compile(r"[0-9]+")
_NEGATIVE_ID = re.compile(r"-[0-9]+")


def _parse_int(field: str, what: str, lineno: int) -> int:
    if _ID.fullmatch(field):
        return int(field)
    if _NEGATIVE_ID.fullmatch(field):
        raise ValueError(f"line {lineno}: {what} {field} is negative")
    raise ValueError(f"line {lineno}: {what} {field!r} is not an integer (ASCII digits only)")


def _whole(value, name: str) -> int:
    """``value`` (an int, or a float without a fractional part) as an ``int``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer, float, np.floating)):
        raise TypeError(f"{name}: expected an integer, got {value!r} ({type(value).__name__})")
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    return int(value)


def _whole_array(values, name: str) -> np.ndarray:
    """``values`` as a 1-D int64 array; fractional, non-finite, boolean or
    non-numeric entries are errors naming ``name`` (never truncated)."""
    arr = np.asarray(values)
    if arr.dtype.kind == "b" or (arr.dtype.kind not in "iuf" and arr.size):
        raise TypeError(f"{name}: expected integer ids, got dtype {arr.dtype}")
    if arr.dtype.kind == "f" and arr.size:
        bad = ~np.isfinite(arr) | (arr != np.floor(arr))
        if bad.any():
            first = float(arr.reshape(-1)[np.argmax(bad.reshape(-1))])
            raise ValueError(f"{name}: expected integer ids, got {first!r}")
        if np.abs(arr).max() >= _MAX_ID:
            raise ValueError(f"{name}: id outside [0, 2**62)")
    return np.ascontiguousarray(arr, dtype=np.int64).reshape(-1)


class Fst:
    """An epsilon-free acceptor over pdfs, stored as arrays.

    Attributes
    ----------
    num_states : int
        ``S``.
    start : int
        The start state.
    src, dst, pdf : numpy.ndarray of int64, ``[A]``
        Arc source state, destination state and 0-based pdf.
    log_prob : numpy.ndarray of float64, ``[A]``
        Arc log-probability (``-inf`` allowed: the arc is never taken).
    final : numpy.ndarray of float64, ``[S]``
        Final log-probability per state, ``-inf`` where not final.
    span : numpy.ndarray of int64, ``[A]``
        Frames each arc covers (``>= 1``; default all 1): read at frame
        ``t``, the arc lands at frame ``t + span``.

    Arcs are kept in a canonical order (the start state's arcs first, then by
    source state, stable), so that text round trips are exact.
    """

    __slots__ = ("num_states", "start", "src", "dst", "pdf", "log_prob", "final", "span")

    def __init__(self, num_states: int, start: int, src: ArrayLike, dst: ArrayLike, pdf: ArrayLike,
                 log_prob: ArrayLike, final: ArrayLike, span: ArrayLike | None = None):
        num_states = _whole(num_states, "num_states")
        start = _whole(start, "start")
        src = _whole_array(src, "src")
        dst = _whole_array(dst, "dst")
        pdf = _whole_array(pdf, "pdf")
        log_prob = np.ascontiguousarray(log_prob, dtype=np.float64).reshape(-1)
        final = np.ascontiguousarray(final, dtype=np.float64).reshape(-1)
        if num_states <= 0:
            raise ValueError(f"num_states: expected a positive number of states, got {num_states}")
        if not 0 <= start < num_states:
            raise ValueError(f"start: expected a state in [0, {num_states}), got {start}")
        if not (len(src) == len(dst) == len(pdf) == len(log_prob)):
            raise ValueError("src, dst, pdf and log_prob must have the same length")
        if span is None:
            span = np.ones(len(src), dtype=np.int64)
        else:
            span = _whole_array(span, "span")
            if len(span) != len(src):
                raise ValueError(f"span: expected one span per arc ({len(src)}), got {len(span)}")
            if span.size and span.min() < 1:
                raise ValueError(f"span: every arc spans at least one frame, got {span.min()}")
        if final.shape != (num_states,):
            raise ValueError(f"final: expected shape ({num_states},), got {final.shape}")
        for name, arr in (("src", src), ("dst", dst)):
            if arr.size and (arr.min() < 0 or arr.max() >= num_states):
                bad = arr[(arr < 0) | (arr >= num_states)][0]
                raise ValueError(f"{name}: state id {bad} is outside [0, {num_states})")
        if pdf.size and pdf.min() < 0:
            raise ValueError(f"pdf: expected 0-based pdf ids >= 0, got {pdf.min()}")
        if np.isnan(log_prob).any():
            raise ValueError("log_prob: NaN arc weight")
        if (log_prob == np.inf).any():
            raise ValueError("log_prob: +inf arc log-probability (cost -inf) is not allowed")
        if np.isnan(final).any() or (final == np.inf).any():
            raise ValueError("final: NaN or +inf final log-probability")
        # canonical arc order: start state's arcs first, then by source (stable)
        key = np.where(src == start, -1, src)
        order = np.argsort(key, kind="stable")
        self.num_states = num_states
        self.start = start
        self.src = src[order]
        self.dst = dst[order]
        self.pdf = pdf[order]
        self.log_prob = log_prob[order]
        self.final = final
        self.span = span[order]

    # ------------------------------------------------------------------ build
    @classmethod
    def from_arcs(
        cls,
        arcs: Iterable[tuple],
        finals: Mapping[int, float],
        start: int = 0,
        num_states: int | None = None,
    ) -> Fst:
        """Build from ``(src, dst, pdf, log_prob)`` or ``(src, dst, pdf,
        log_prob, span)`` tuples and a ``{state: log_prob}`` map.

        States are numbered from 0.  Without ``num_states`` the FST has
        ``1 + `` the largest state id used by ``start``, ``finals`` or an arc,
        so ids between those used are states without arcs; an id more than
        1024 beyond the number of distinct states used (e.g. ``2**31 - 1`` in
        a three-state graph, which would allocate gigabytes) is a
        ``ValueError`` unless ``num_states`` is given.  With ``num_states``
        every state id must lie in ``[0, num_states)``; an id outside it is a
        ``ValueError`` naming the argument (``arcs[i]``, ``finals`` or
        ``start``) instead of a silently added state; states above the
        largest id used are states without arcs.  State ids and pdfs must be
        integers (``1.9`` is an error, not state 1); ids above ``2**62`` are
        a ``ValueError``.
        """
        arcs = list(arcs)
        for i, arc in enumerate(arcs):
            if len(arc) not in (4, 5):
                raise ValueError(f"arcs[{i}]: expected (src, dst, pdf, log_prob[, span]), got {arc!r}")
        if not isinstance(finals, Mapping):
            raise TypeError(f"finals: expected a mapping {{state: log_prob}}, got {type(finals).__name__}")
        if len(finals) == 0:
            raise ValueError("finals: the FST has no final state")
        src = _id_array([a[0] for a in arcs], "arcs[{i}]", "source state")
        dst = _id_array([a[1] for a in arcs], "arcs[{i}]", "destination state")
        pdf = _id_array([a[2] for a in arcs], "arcs[{i}]", "pdf")
        try:
            lp = np.array([a[3] for a in arcs], dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError("arcs: log_prob must be a number in every arc") from None
        span = _id_array([a[4] if len(a) == 5 else 1 for a in arcs], "arcs[{i}]", "span")
        start = int(_id_array([start], "start", "state")[0])
        final_ids = [int(s) for s in _id_array(list(finals), "finals", "state")]
        if num_states is not None:
            if isinstance(num_states, bool) or int(num_states) != num_states or num_states < 1:
                raise ValueError(f"num_states: expected a positive integer, got {num_states!r}")
            num_states = int(num_states)

        def check(where, what, state):
            if state < 0:
                raise ValueError(f"{where}: {what} {state} is negative")
            if num_states is not None and state >= num_states:
                raise ValueError(f"{where}: {what} {state} is outside [0, num_states={num_states})")

        for name, ids in (("source state", src), ("destination state", dst)):
            bad = (ids < 0) if num_states is None else (ids < 0) | (ids >= num_states)
            if bad.any():
                i = int(np.argmax(bad))
                check(f"arcs[{i}]", name, int(ids[i]))
        for s in final_ids:
            check("finals", "state", s)
        check("start", "state", start)
        if num_states is None:
            num_states = 1 + max([start, *final_ids, *(int(ids.max()) for ids in (src, dst) if ids.size)])
            used = len(set(np.concatenate([src, dst]).tolist()) | {start, *final_ids})
            if num_states > used + _SPARSE_SLACK:
                raise ValueError(
                    f"state id {num_states - 1} is far beyond the {used} states used; renumber the states or pass "
                    f"num_states explicitly")
        final = np.full(num_states, -np.inf)
        for s, w in finals.items():
            final[int(s)] = float(w)
        return cls(num_states, start, src, dst, pdf, lp, final, span)

    @classmethod
    def from_openfst_text(cls, text: str, acceptor: bool | None = None, spans: bool = False) -> Fst:
        """Parse an OpenFst/Kaldi text FST (label = pdf + 1, weight = cost).

        Arc lines are ``src dst label [cost]`` (acceptor format) or
        ``src dst ilabel olabel [cost]`` (transducer format, ilabel == olabel
        required).  ``state [cost]`` lines are finals.  The first line's
        source is the start state.  ``acceptor=None`` detects the format: any
        5-field line means transducer format; otherwise 4 fields are an
        acceptor arc with a cost.

        ``spans=True`` reads arcs that span several frames, as
        :meth:`to_openfst_text` writes them: in the transducer format the
        output label is the arc's span (``>= 1``), ``src dst pdf+1 span
        cost``; acceptor-format lines are arcs of span 1.
        """
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        if acceptor is not None:
            acceptor = checks.flag(acceptor, "acceptor")
        spans = checks.flag(spans, "spans")
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            if fields:
                rows.append((lineno, fields))
        if not rows:
            raise ValueError("text: empty FST (no lines)")
        if acceptor is None:
            acceptor = not any(len(f) == 5 for _, f in rows)
        arc_fields = 3 if acceptor else 4
        arcs, finals = [], {}
        start = None
        for lineno, fields in rows:
            n = len(fields)
            if n <= 2:
                s = _parse_int(fields[0], "state", lineno)
                cost = _parse_cost(fields[1], lineno) if n == 2 else 0.0
                finals[s] = -cost
            elif n in (arc_fields, arc_fields + 1):
                s = _parse_int(fields[0], "source state", lineno)
                d = _parse_int(fields[1], "destination state", lineno)
                label = _parse_int(fields[2], "label", lineno)
                span = 1
                if not acceptor:
                    olabel = _parse_int(fields[3], "output label", lineno)
                    if spans:
                        if olabel < 1:
                            raise ValueError(f"line {lineno}: span (output label) {olabel}; every arc "
                                             "spans at least one frame")
                        span = olabel
                    elif olabel != label:
                        raise ValueError(
                            f"line {lineno}: input label {label} != output label {olabel}: chainfb's graphs "
                            "have pdf + 1 on both sides (Kaldi's chain graphs are written so; a graph of "
                            "transition-ids or words is not one); only text that chainfb wrote for arcs "
                            "spanning several frames has the span as output label (read with spans=True)"
                        )
                if label == 0:
                    raise ValueError(
                        f"line {lineno}: label 0 (epsilon); numerator FSTs must be epsilon-free"
                    )
                cost = _parse_cost(fields[arc_fields], lineno) if n == arc_fields + 1 else 0.0
                arcs.append((s, d, label - 1, -cost, span))
            else:
                fmt = "acceptor" if acceptor else "transducer"
                raise ValueError(f"line {lineno}: malformed line for the {fmt} format: {' '.join(fields)!r}")
            if start is None:
                start = int(fields[0])
        if not finals:
            raise ValueError("text: the FST has no final state")
        return cls.from_arcs(arcs, finals, start=start)

    @classmethod
    def read(cls, path: str | os.PathLike, acceptor: bool | None = None, spans: bool = False) -> Fst:
        """Read one FST from ``path``: OpenFst/Kaldi text (arguments as for
        :meth:`from_openfst_text`), or OpenFst's binary ``vector`` form
        (what Kaldi writes for ``den.fst`` and ``normalization.fst``; told
        by its magic number; ``acceptor`` and ``spans`` do not apply to it).
        A damaged binary file is a ``ValueError`` naming the file and the
        byte offset."""
        with open(path, "rb") as f:
            data = f.read()
        if data[:4] == fst_binary.MAGIC_BYTES:
            where = os.fspath(path)
            fst, end = fst_binary.decode(data, 0, lambda what: ValueError(f"{where}: damaged binary FST: {what}"), Fst)
            if end != len(data):
                raise ValueError(f"{where}: damaged binary FST: {len(data) - end} bytes follow the FST at byte {end} "
                                 f"(an archive of several FSTs is read by chainfb.chain.read_kaldi_fst_archive)")
            return fst
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(
                f"{os.fspath(path)}: neither an OpenFst/Kaldi text FST nor a binary OpenFst FST (no magic number); "
                f"binary Kaldi FST archives (key, space, FST, ...) are read by chainfb.chain.read_kaldi_fst_archive"
            ) from None
        try:
            return cls.from_openfst_text(text, acceptor=acceptor, spans=spans)
        except ValueError as e:
            raise ValueError(f"{os.fspath(path)}: {e}") from None

    # ----------------------------------------------------------------- output
    def to_openfst_text(self) -> str:
        """OpenFst acceptor text (label = pdf + 1, cost = -log_prob).

        Arcs come in canonical order (start state first), finals last, in
        increasing state order.  ``Fst.from_openfst_text(f.to_openfst_text())``
        equals ``f``: a start state without arcs is named by a first final
        line (``Infinity`` if it is not final), and trailing isolated states
        by an ``Infinity`` final line for the last state.

        Arcs spanning several frames: when ``max_span > 1`` every arc is
        written in OpenFst's transducer format with its span as the output
        label and its cost always present, ``src dst pdf+1 span cost``
        (OpenFst tools read it as a transducer); read it back with
        ``Fst.from_openfst_text(text, spans=True)``.
        """
        spanning = self.max_span > 1

        def final_line(s):
            cost = _format_cost(self.final[s])
            return f"{s}" + ("" if cost == "0" else f"\t{cost}")

        lines = []
        start_has_arcs = self.num_arcs > 0 and self.src[0] == self.start
        if not start_has_arcs:
            lines.append(final_line(self.start))
        for s, d, p, lp, k in zip(self.src.tolist(), self.dst.tolist(), self.pdf.tolist(), self.log_prob.tolist(),
                                  self.span.tolist()):
            cost = _format_cost(lp)
            if spanning:
                lines.append(f"{s}\t{d}\t{p + 1}\t{k}\t{cost}")
            else:
                lines.append(f"{s}\t{d}\t{p + 1}" + ("" if cost == "0" else f"\t{cost}"))
        finals = [s for s in np.flatnonzero(self.final > -np.inf).tolist() if start_has_arcs or s != self.start]
        lines += [final_line(s) for s in finals]
        used = [self.start, *finals]
        if self.num_arcs:
            used += [int(self.src.max()), int(self.dst.max())]
        if max(used) < self.num_states - 1 or (start_has_arcs and not finals):
            # trailing isolated states, or no final state at all: an impossible final keeps the text readable
            lines.append(f"{self.num_states - 1}\tInfinity")
        return "\n".join(lines) + "\n"

    def write(self, path: str | os.PathLike, binary: bool = False) -> None:
        """Write :meth:`to_openfst_text` to ``path`` (acceptor text; the
        transducer form when arcs span several frames), or with
        ``binary=True`` OpenFst's binary ``vector`` form, as Kaldi writes
        ``den.fst`` (float32 costs; arcs spanning several frames cannot be
        held: a ``ValueError``)."""
        if checks.flag(binary, "binary"):
            data = fst_binary.encode(self, "binary=True")
            with open(path, "wb") as f:
                f.write(data)
            return
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_openfst_text())

    def to_dot(self, title: str | None = None) -> str:
        """Graphviz source: arcs labelled ``pdf:prob``, finals double circles."""
        out = ["digraph FST {", "  rankdir=LR;"]
        if title:
            out.append(f'  label="{title}";')
        for s in range(self.num_states):
            shape = "doublecircle" if self.final[s] > -np.inf else "circle"
            label = str(s)
            if self.final[s] > -np.inf and self.final[s] != 0.0:
                label += f"/{math.exp(self.final[s]):.3g}"
            style = ", style=bold" if s == self.start else ""
            out.append(f'  {s} [shape={shape}, label="{label}"{style}];')
        for s, d, p, lp in zip(self.src.tolist(), self.dst.tolist(), self.pdf.tolist(), self.log_prob.tolist()):
            out.append(f'  {s} -> {d} [label="{p}:{math.exp(lp):.3g}"];')
        out.append("}")
        return "\n".join(out) + "\n"

    # ------------------------------------------------------------- inspection
    @property
    def num_arcs(self) -> int:
        return int(self.src.shape[0])

    @property
    def num_pdfs(self) -> int:
        """One more than the largest pdf used (0 for an arc-less graph)."""
        return int(self.pdf.max()) + 1 if self.num_arcs else 0

    @property
    def max_span(self) -> int:
        """The most frames one arc covers (1 for an arc-less graph)."""
        return int(self.span.max()) if self.num_arcs else 1

    def arcs(self, spans: bool = False) -> list[tuple]:
        """The arcs as ``(src, dst, pdf, log_prob)`` tuples (``(src, dst, pdf,
        log_prob, span)`` with ``spans=True``), canonical order."""
        cols = [self.src.tolist(), self.dst.tolist(), self.pdf.tolist(), self.log_prob.tolist()]
        if checks.flag(spans, "spans"):
            cols.append(self.span.tolist())
        return list(zip(*cols))

    def finals(self) -> dict[int, float]:
        """``{state: final log_prob}`` for the final states."""
        return {int(s): float(self.final[s]) for s in np.flatnonzero(self.final > -np.inf)}

    def __eq__(self, other) -> bool:
        if not isinstance(other, Fst):
            return NotImplemented
        return (
            self.num_states == other.num_states
            and self.start == other.start
            and all(
                np.array_equal(getattr(self, k), getattr(other, k))
                for k in ("src", "dst", "pdf", "log_prob", "final", "span")
            )
        )

    __hash__ = None  # mutable arrays

    def __repr__(self) -> str:
        return (
            f"Fst(num_states={self.num_states}, num_arcs={self.num_arcs}, start={self.start}, "
            f"num_finals={int((self.final > -np.inf).sum())})"
        )
