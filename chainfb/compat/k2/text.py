"""k2's two text formats for FSAs, read and written as k2 reads and writes
them (``k2/csrc/fsa_utils.cu``).

k2 format (``openfst=False``)::

    src_state dest_state label [aux_label ...] [[ragged ...] ...] [score]
    ...
    final_state

Arcs come grouped by source state in non-decreasing order; the last line
names the one final state, which is the largest state number and is
entered only by arcs labelled ``-1`` (their aux labels are ``-1`` too).
Scores are log-probabilities (default 0).

OpenFst format (``openfst=True``): the same arc lines with *costs*
(``score = -cost``), any order of source states, the first line's source
state is the start state (swapped with state 0), and ``state [cost]`` lines
name final states; k2 adds a super-final state ``max_state + 1`` (at least
1) and an arc labelled ``-1`` (aux labels ``-1``) from every final state to
it carrying the final score, after that state's other arcs.  A cost of
``Inf``/``inf``/``Infinity`` on a final line means "not final".

Written back: ``src dst label [aux ...] [[ ragged ... ] ...] score`` with
scores printed as C++ prints a float (``%g``: six significant digits, so
``-0`` and ``1e-07`` appear as such), then the final state on its own line
when there are arcs; with ``openfst=True`` the costs, and a ``-1`` arc is
written as its source state and cost (a final line), no final-state line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

__all__ = ["parse", "format_arcs"]

_INT = re.compile(r"[+-]?[0-9]+")
_INF = {"inf", "Inf", "infinity", "Infinity", "INF"}


def _tokens(line: str) -> list:
    return line.replace("[", " [ ").replace("]", " ] ").split()


def _int(tok: str, what: str, lineno: int) -> int:
    if _INT.fullmatch(tok):
        return int(tok)
    try:  # k2 reads aux labels as floats and requires them to be integral
        v = float(tok)
    except ValueError:
        v = math.nan
    if what.startswith("aux label") and math.isfinite(v) and v.is_integer():
        return int(v)
    raise ValueError(f"s: line {lineno}: {what} {tok!r} is not an integer")


def _float(tok: str, what: str, lineno: int) -> float:
    try:
        return float(tok)
    except ValueError:
        raise ValueError(f"s: line {lineno}: {what} {tok!r} is not a number") from None


def _arc_fields(toks, lineno, num_aux, num_ragged):
    """``(src, dst, label, aux [num_aux], ragged [num_ragged lists], weight or None)`` of an arc line."""
    if len(toks) < 3:
        raise ValueError(f"s: line {lineno}: expected src_state dest_state label ..., got {' '.join(toks)!r}")
    src = _int(toks[0], "source state", lineno)
    dst = _int(toks[1], "destination state", lineno)
    label = _int(toks[2], "label", lineno)
    if src < 0 or dst < 0:
        raise ValueError(f"s: line {lineno}: negative state id")
    pos = 3
    aux = []
    for i in range(num_aux):
        if pos >= len(toks) or toks[pos] in "[]":
            raise ValueError(f"s: line {lineno}: expected {num_aux} aux label(s) after the label")
        aux.append(_int(toks[pos], f"aux label {i + 1}", lineno))
        pos += 1
    ragged = []
    for i in range(num_ragged):
        if pos >= len(toks) or toks[pos] != "[":
            raise ValueError(f"s: line {lineno}: expected ragged label list {i + 1} in [ ]")
        pos += 1
        row = []
        while pos < len(toks) and toks[pos] != "]":
            row.append(_int(toks[pos], "ragged label", lineno))
            pos += 1
        if pos >= len(toks):
            raise ValueError(f"s: line {lineno}: unclosed [ in ragged label list {i + 1}")
        pos += 1
        ragged.append(row)
    weight = None
    if pos < len(toks):
        weight = _float(toks[pos], "score", lineno)
        pos += 1
    if pos != len(toks):
        raise ValueError(f"s: line {lineno}: unexpected fields {' '.join(toks[pos:])!r} (num_aux_labels="
                         f"{num_aux}, ragged labels: {num_ragged})")
    return src, dst, label, aux, ragged, weight


def _parse_k2(lines, num_aux, num_ragged):
    arcs, final = [], None
    for lineno, toks in lines:
        if final is not None:
            raise ValueError(f"s: line {lineno}: the final state was already given; expected no more lines")
        if len(toks) == 1:
            final = _int(toks[0], "final state", lineno)
            if final < 0:
                raise ValueError(f"s: line {lineno}: final state {final} is negative")
            continue
        src, dst, label, aux, ragged, w = _arc_fields(toks, lineno, num_aux, num_ragged)
        if arcs and src < arcs[-1][0]:
            raise ValueError(f"s: line {lineno}: arcs must be grouped by source state in non-decreasing order "
                             f"({src} after {arcs[-1][0]})")
        arcs.append((src, dst, label, aux, ragged, 0.0 if w is None else w))
    if final is None:
        if arcs:
            raise ValueError("s: no final-state line (the last line names the final state)")
        return 0, arcs
    top = max([final] + [max(a[0], a[1]) for a in arcs])
    if top != final:
        raise ValueError(f"s: the final state {final} must be the largest state number (state {top} is used)")
    return final + 1, arcs


def _parse_openfst(lines, num_aux, num_ragged):
    start, per_state, finals, top = None, {}, [], -1
    for lineno, toks in lines:
        if len(toks) <= 2 and "[" not in toks:
            state = _int(toks[0], "final state", lineno)
            if state < 0:
                raise ValueError(f"s: line {lineno}: final state {state} is negative")
            cost = 0.0 if len(toks) == 1 else (math.inf if toks[1] in _INF else _float(toks[1], "cost", lineno))
            start = state if start is None else start
            top = max(top, state)
            if cost != math.inf:
                finals.append((state, -cost))
            continue
        src, dst, label, aux, ragged, w = _arc_fields(toks, lineno, num_aux, num_ragged)
        start = src if start is None else start
        top = max(top, src, dst)
        per_state.setdefault(src, []).append([src, dst, label, aux, ragged, -(0.0 if w is None else w)])
    if start is None:
        return 0, []
    super_final = max(top + 1, 1)
    for state, score in finals:
        per_state.setdefault(state, []).append([state, super_final, -1, [-1] * num_aux, [[]] * num_ragged, score])
    swap = {0: start, start: 0} if start > 0 else {}
    arcs = []
    for s in range(super_final + 1):
        for _src, dst, label, aux, ragged, w in per_state.get(swap.get(s, s), []):
            arcs.append((s, swap.get(dst, dst), label, aux, ragged, w))
    return super_final + 1, arcs


def parse(s: str, num_aux: int, num_ragged: int,
          openfst: bool) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[list]]:
    """``(num_states, src, dst, label, score, aux [num_aux x A], ragged
    [num_ragged lists of A rows])`` from k2 or OpenFst text (module
    docstring); errors name ``s`` and the line."""
    if not isinstance(s, str):
        raise TypeError(f"s: expected str, got {type(s).__name__}")
    lines = [(i, _tokens(line)) for i, line in enumerate(s.splitlines(), 1)]
    lines = [(i, t) for i, t in lines if t]
    S, arcs = (_parse_openfst if openfst else _parse_k2)(lines, num_aux, num_ragged)
    A = len(arcs)
    src = np.array([a[0] for a in arcs], dtype=np.int64)
    dst = np.array([a[1] for a in arcs], dtype=np.int64)
    label = np.array([a[2] for a in arcs], dtype=np.int64)
    score = np.array([a[5] for a in arcs], dtype=np.float64)
    aux = np.array([a[3] for a in arcs], dtype=np.int64).reshape(A, num_aux).T
    ragged = [[a[4][r] for a in arcs] for r in range(num_ragged)]
    return S, src, dst, label, score, aux, ragged


def _g(x: float) -> str:
    """A float as C++'s ``operator<<`` prints it (``%g``, six digits)."""
    return f"{x:g}"


def format_arcs(num_states: int, src: np.ndarray, dst: np.ndarray, label: np.ndarray, score: np.ndarray,
                int_labels: Sequence[np.ndarray] = (), ragged_rows: Sequence[Sequence[Sequence[int]]] = (),
                openfst: bool = False) -> str:
    """One FSA as k2 text (module docstring); ``int_labels`` are extra
    integer columns (``aux_labels`` first), ``ragged_rows`` lists of
    per-arc rows."""
    sign = -1.0 if openfst else 1.0
    out = []
    for a in range(len(src)):
        w = _g(sign * float(np.float32(score[a])))
        if openfst and label[a] == -1:
            out.append(f"{src[a]} {w}")
            continue
        fields = [str(src[a]), str(dst[a]), str(label[a])] + [str(col[a]) for col in int_labels]
        fields += ["[ " + "".join(f"{v} " for v in rows[a]) + "]" for rows in ragged_rows]
        out.append(" ".join(fields) + " " + w)
    if len(src) and not openfst:
        out.append(str(num_states - 1))
    return "".join(line + "\n" for line in out)
