"""k2's FSA algorithms on :class:`~chainfb.compat.k2.fsa.Fsa`, with k2's
semantics, arc maps and attribute rules (``k2/python/k2/fsa_algo.py`` and
``k2/csrc/host/``).

Every function takes a single FSA or an FsaVec (an FsaVec is processed FSA
by FSA) and derives its result's attributes through the arc map of the
algorithm, as k2 does:

- one source arc per result arc (or ``-1`` for a new arc): each tensor
  attribute is indexed, the attribute's filler (0) where the map is
  ``-1``; ``scores`` through torch, so gradients flow to the source;
- several source arcs per result arc (:func:`remove_epsilon`): ``scores``
  and other float attributes are summed over them, integer attributes
  become ragged (:class:`~chainfb.compat.k2.ragged.RaggedTensor`) with their
  fillers and the ``-1`` of final arcs left out;
- two sources (:func:`intersect`): an attribute only one side has is
  indexed from it; float attributes both sides have are added (``scores``);
  integer attributes both sides have are dropped.

Epsilon is label 0.  :func:`intersect` and :func:`compose` follow k2's host
intersection: state pairs numbered in breadth-first order from ``(0, 0)``,
the final pair last, no trimming (call :func:`connect`); with
``treat_epsilons_specially=True`` an epsilon arc on either side moves that
side alone (k2 has no epsilon filter, so both orders of two epsilons are
kept as separate paths).  :func:`remove_epsilon` and :func:`determinize`
are exact in the tropical semiring (max), as k2 documents.  The graph
algorithms themselves are chainfb's generic ones (:mod:`chainfb.fst_algo`):
:func:`connect` keeps :func:`~chainfb.fst_algo.useful_states`,
:func:`top_sort` orders by :func:`~chainfb.fst_algo.topological_order`,
:func:`remove_epsilon` is :func:`~chainfb.fst_algo.remove_epsilons_max` and
:func:`determinize` is :func:`~chainfb.fst_algo.determinize` in the max
semiring; what is k2's here is the FSA layout, the arc maps and the
attributes.
"""

from __future__ import annotations

from collections import deque
from typing import Literal, overload

import numpy as np
import torch

from ... import checks
from ...fst import Fst
from ...fst_algo import determinize as _determinize_fst
from ...fst_algo import remove_epsilons_max, topological_order, useful_states
from .fsa import ARC_SORTED, ARC_SORTED_AND_DETERMINISTIC, EPSILON_FREE, Fsa, _fix_final_labels, _label_order
from .ragged import RaggedTensor

__all__ = ["arc_sort", "add_epsilon_self_loops", "remove_epsilon_self_loops", "connect", "top_sort",
           "remove_epsilon", "remove_epsilon_and_add_self_loops", "intersect", "compose", "invert", "determinize"]


def _fsa(fsa, name: str = "fsa") -> Fsa:
    if not isinstance(fsa, Fsa):
        raise TypeError(f"{name}: expected a chainfb.compat.k2.Fsa, got {type(fsa).__name__}")
    return fsa


def _pieces(fsa: Fsa):
    """``(S, src, dst, labels, a0)`` of each FSA (local state ids, host arrays)."""
    lab = fsa.labels.cpu().numpy().astype(np.int64)
    for S, a0, a1 in fsa._parts():
        yield S, fsa._src[a0:a1], fsa._dst[a0:a1], lab[a0:a1], a0


def _index(value, arc_map: np.ndarray, filler):
    """``value`` (tensor or ragged, one row per source arc) indexed by
    ``arc_map`` (``-1``: the filler / an empty row)."""
    if isinstance(value, RaggedTensor):
        return value.index(arc_map)
    rest = tuple(value.shape[1:])
    if len(arc_map) == 0 or value.shape[0] == 0:
        return torch.full((len(arc_map),) + rest, filler, dtype=value.dtype, device=value.device)
    out = value.index_select(0, torch.as_tensor(np.maximum(arc_map, 0), device=value.device))
    if (arc_map < 0).any():
        missing = torch.as_tensor(arc_map < 0, device=value.device).view((-1,) + (1,) * len(rest))
        out = torch.where(missing, torch.full_like(out, filler), out)
    return out


def _assemble(fsa: Fsa, results, vec: bool) -> tuple[Fsa, np.ndarray]:
    """The Fsa of per-FSA ``(S, src, dst, labels, arc_map)`` results (local
    arc maps into the FSA whose first arc is ``a0``: ``results`` holds
    ``(..., arc_map, a0)``), attributes indexed through the maps."""
    num_states = [r[0] for r in results]
    counts = np.array([len(r[1]) for r in results], dtype=np.int64)
    cat = (lambda k: np.concatenate([np.asarray(r[k], dtype=np.int64) for r in results])
           if results else np.zeros(0, np.int64))
    glob = np.concatenate([np.where(np.asarray(r[4]) >= 0, np.asarray(r[4]) + r[5], -1) for r in results]
                          ) if results else np.zeros(0, np.int64)
    glob = glob.astype(np.int64)
    out = Fsa._make(num_states, cat(1), cat(2), cat(3), _index(fsa.scores, glob, 0.0), vec=vec,
                    arc_splits=np.concatenate([[0], np.cumsum(counts)]), check=False)
    for name, value in fsa.named_tensor_attr(include_scores=False):
        out._tensor_attr[name] = _index(value, glob, fsa.get_filler(name))
    out._non_tensor_attr.update(fsa._non_tensor_attr)
    return out, glob


def _unary(fsa: Fsa, kernel, ret_arc_map: bool = False):
    results = [kernel(S, src, dst, lab) + (a0,) for S, src, dst, lab, a0 in _pieces(fsa)]
    out, glob = _assemble(fsa, results, fsa._vec)
    return (out, torch.as_tensor(glob.astype(np.int32))) if ret_arc_map else out


# --------------------------------------------------------------- unary
def _arc_sort_one(S, src, dst, lab):
    order = np.lexsort((dst, _label_order(lab), src))
    return S, src[order], dst[order], lab[order], order


@overload
def arc_sort(fsa: Fsa, ret_arc_map: Literal[False] = False) -> Fsa: ...
@overload
def arc_sort(fsa: Fsa, ret_arc_map: Literal[True]) -> tuple[Fsa, torch.Tensor]: ...
@overload
def arc_sort(fsa: Fsa, ret_arc_map: bool) -> Fsa | tuple[Fsa, torch.Tensor]: ...
def arc_sort(fsa: Fsa, ret_arc_map: bool = False) -> Fsa | tuple[Fsa, torch.Tensor]:
    """Arcs of each state sorted by label (as unsigned, so ``-1`` last),
    then destination; ``fsa`` itself when already sorted."""
    fsa = _fsa(fsa)
    if fsa.properties & ARC_SORTED:
        ident = torch.arange(fsa.num_arcs, dtype=torch.int32)
        return (fsa, ident) if checks.flag(ret_arc_map, "ret_arc_map") else fsa
    return _unary(fsa, _arc_sort_one, checks.flag(ret_arc_map, "ret_arc_map"))


def _self_loops_one(S, src, dst, lab):
    states = np.arange(max(S - 1, 0))
    ns = np.concatenate([src, states])
    nd = np.concatenate([dst, states])
    nl = np.concatenate([lab, np.zeros(len(states), np.int64)])
    amap = np.concatenate([np.arange(len(src)), np.full(len(states), -1)])
    first = np.concatenate([np.ones(len(src), np.int64), np.zeros(len(states), np.int64)])
    order = np.lexsort((first, ns))  # the new loop first among each state's arcs
    return S, ns[order], nd[order], nl[order], amap[order]


@overload
def add_epsilon_self_loops(fsa: Fsa, ret_arc_map: Literal[False] = False) -> Fsa: ...
@overload
def add_epsilon_self_loops(fsa: Fsa, ret_arc_map: Literal[True]) -> tuple[Fsa, torch.Tensor]: ...
@overload
def add_epsilon_self_loops(fsa: Fsa, ret_arc_map: bool) -> Fsa | tuple[Fsa, torch.Tensor]: ...
def add_epsilon_self_loops(fsa: Fsa, ret_arc_map: bool = False) -> Fsa | tuple[Fsa, torch.Tensor]:
    """An epsilon (label 0, score 0) self-loop on every state but the final
    one, placed first among the state's arcs."""
    return _unary(_fsa(fsa), _self_loops_one, checks.flag(ret_arc_map, "ret_arc_map"))


def remove_epsilon_self_loops(fsa: Fsa) -> Fsa:
    """The FSA without its epsilon self-loops (other epsilon arcs stay)."""
    def kernel(S, src, dst, lab):
        keep = np.flatnonzero(~((lab == 0) & (src == dst)))
        return S, src[keep], dst[keep], lab[keep], keep
    return _unary(_fsa(fsa), kernel)


def _renumber(S, src, dst, lab, order):
    """Keep states ``order`` (new id = position), and the arcs between kept states."""
    new = np.full(S, -1, np.int64)
    new[order] = np.arange(len(order))
    keep = np.flatnonzero((new[src] >= 0) & (new[dst] >= 0))
    ns, nd = new[src[keep]], new[dst[keep]]
    o = np.argsort(ns, kind="stable")
    return len(order), ns[o], nd[o], lab[keep][o], keep[o]


def _empty():
    z = np.zeros(0, np.int64)
    return 0, z, z, z, z


def _connect_one(S, src, dst, lab):
    if S == 0:
        return _empty()
    keep = useful_states(S, src, dst, 0, [S - 1])
    if not keep[0]:
        return _empty()
    return _renumber(S, src, dst, lab, np.flatnonzero(keep))


def connect(fsa: Fsa) -> Fsa:
    """Only the states on some path from the start to the final state (the
    others and their arcs removed, the order of the rest kept); an FSA
    without a path becomes the empty FSA.  ``fsa`` itself when nothing is
    removed."""
    fsa = _fsa(fsa)
    out = _unary(fsa, _connect_one)
    same = (out._num_states == fsa._num_states).all() and out.num_arcs == fsa.num_arcs
    return fsa if same else out


def _top_sort_one(S, src, dst, lab):
    if S == 0:
        return _empty()
    order = topological_order(S, src, dst, 0, last=S - 1)  # the final state goes last
    if order is None:
        raise ValueError("fsa: top_sort needs an FSA without cycles (self-loops are allowed)")
    return _renumber(S, src, dst, lab, order)


def top_sort(fsa: Fsa) -> Fsa:
    """States renumbered so that every arc goes from a state to itself or a
    later one (start first, final last); states the start cannot reach are
    removed.  A cycle other than a self-loop is a ``ValueError``."""
    return _unary(_fsa(fsa), _top_sort_one)


def invert(fsa: Fsa, ret_arc_map: bool = False) -> Fsa | tuple[Fsa, torch.Tensor]:
    """A copy with ``labels`` and (tensor) ``aux_labels`` swapped."""
    out = _fsa(fsa).invert()
    if checks.flag(ret_arc_map, "ret_arc_map"):
        return out, torch.arange(out.num_arcs, dtype=torch.int32)
    return out


# --------------------------------------------------------------- epsilon removal
def _ragged_attr(value, maps, source_final: np.ndarray, filler, device):
    """Integer attribute ``value`` gathered along ``maps`` (rows of source
    arcs), fillers and the ``-1`` of final arcs left out, as a RaggedTensor."""
    vals = value.rows() if isinstance(value, RaggedTensor) else None
    flat = None if vals is not None else value.cpu().numpy().astype(np.int64)
    rows = []
    for m in maps:
        if vals is not None:
            row = [v for a in m for v in vals[a].tolist()]
        else:
            row = [int(flat[a]) for a in m if not (flat[a] == filler or (flat[a] == -1 and source_final[a]))]
        rows.append(row)
    return RaggedTensor.from_rows(rows, device=device)


def remove_epsilon(fsa: Fsa) -> Fsa:
    """The FSA without epsilon arcs, equivalent in the tropical semiring:
    from each state, the best (max-score) epsilon path to every state it
    reaches is followed by that state's non-epsilon arcs; the result is
    connected.  Integer attributes (``aux_labels``) become ragged: the
    values met along each path, fillers (0) and final ``-1`` left out.  An
    epsilon cycle of positive score is a ``ValueError``."""
    fsa = _fsa(fsa)
    score = fsa.scores.detach().cpu().numpy().astype(np.float64)
    results = []
    for S, src, dst, lab, a0 in _pieces(fsa):
        S, ns, nd, nl, maps = remove_epsilons_max(S, src, dst, lab, score[a0:a0 + len(src)])
        results.append((S, ns, nd, nl, [[a + a0 for a in m] for m in maps]))
    counts = np.array([len(r[1]) for r in results], dtype=np.int64)
    maps = [m for r in results for m in r[4]]
    flat = np.array([a for m in maps for a in m], dtype=np.int64)
    row = np.repeat(np.arange(len(maps)), [len(m) for m in maps]).astype(np.int64)
    dev = fsa.device

    def summed(value):
        out = torch.zeros((len(maps),) + tuple(value.shape[1:]), dtype=value.dtype, device=dev)
        if len(flat):
            out = out.index_add(0, torch.as_tensor(row, device=dev),
                                value.index_select(0, torch.as_tensor(flat, device=dev)))
        return out

    cat = (lambda k: np.concatenate([r[k] for r in results]) if results else np.zeros(0, np.int64))
    out = Fsa._make([r[0] for r in results], cat(1), cat(2), cat(3), summed(fsa.scores), vec=fsa._vec,
                    arc_splits=np.concatenate([[0], np.cumsum(counts)]), check=False)
    source_final = fsa.labels.cpu().numpy() == -1
    for name, value in fsa.named_tensor_attr(include_scores=False):
        if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
            out._tensor_attr[name] = summed(value)
        else:
            out._tensor_attr[name] = _ragged_attr(value, maps, source_final, fsa.get_filler(name), dev)
    out._non_tensor_attr.update(fsa._non_tensor_attr)
    return connect(out)


def remove_epsilon_and_add_self_loops(fsa: Fsa, remove_filler: bool = True) -> Fsa:
    """:func:`remove_epsilon` then :func:`add_epsilon_self_loops`; an
    epsilon-free ``fsa`` only gets the self-loops (its attributes stay
    linear), as in k2."""
    fsa = _fsa(fsa)
    checks.flag(remove_filler, "remove_filler")
    if fsa.properties & EPSILON_FREE:
        return add_epsilon_self_loops(fsa)
    return add_epsilon_self_loops(remove_epsilon(fsa))


# --------------------------------------------------------------- intersection
def _by_label(lab, lo, hi):
    table: dict = {}
    for i in range(lo, hi):
        table.setdefault(int(lab[i]), []).append(i)
    return table


def _intersect_one(A, B, treat_eps: bool):
    """k2's host intersection of two single FSAs ``(S, src, dst, labels)``:
    ``(S, src, dst, labels, a_map, b_map)``."""
    (Sa, sa_, da, la), (Sb, sb_, db, lb) = A, B
    if Sa < 2 or Sb < 2:
        e = _empty()
        return e + (e[4],)
    pa = np.searchsorted(sa_, np.arange(Sa + 1))
    pb = np.searchsorted(sb_, np.arange(Sb + 1))
    FINAL = -1
    ids = {(0, 0): 0, (Sa - 1, Sb - 1): FINAL}
    queue = deque([(0, 0)])
    n = 0
    src, dst, lab, amap, bmap = [], [], [], [], []
    tables_a, tables_b = {}, {}

    def state(pair):
        nonlocal n
        got = ids.get(pair)
        if got is None:
            n += 1
            got = ids[pair] = n
            queue.append(pair)
        return got

    while queue:
        x, y = queue.popleft()
        cur = ids[(x, y)]
        ai, ae, bi, be = pa[x], pa[x + 1], pb[y], pb[y + 1]
        if treat_eps:
            while ai < ae and la[ai] == 0:
                src.append(cur), dst.append(state((da[ai], y))), lab.append(0), amap.append(ai), bmap.append(-1)
                ai += 1
            while bi < be and lb[bi] == 0:
                src.append(cur), dst.append(state((x, db[bi]))), lab.append(0), amap.append(-1), bmap.append(bi)
                bi += 1
        if ae - ai > be - bi:  # iterate over the side with fewer arcs
            ta = tables_a.setdefault(x, _by_label(la, pa[x], pa[x + 1]))
            pairs = [(i, j) for j in range(bi, be) for i in ta.get(int(lb[j]), ())]
        else:
            tb = tables_b.setdefault(y, _by_label(lb, pb[y], pb[y + 1]))
            pairs = [(i, j) for i in range(ai, ae) for j in tb.get(int(la[i]), ())]
        for i, j in pairs:
            src.append(cur), dst.append(state((da[i], db[j]))), lab.append(la[i]), amap.append(i), bmap.append(j)
    final = n + 1
    dst = [final if d == FINAL else d for d in dst]
    arr = (lambda v: np.array(v, dtype=np.int64))
    return final + 1, arr(src), arr(dst), arr(lab), arr(amap), arr(bmap)


def _pairs(a: Fsa, b: Fsa):
    """Which FSAs of ``a`` and ``b`` are intersected: both single, or FsaVecs
    of equal size, or one side (a single FSA or an FsaVec of one) broadcast."""
    na, nb = len(a._num_states), len(b._num_states)
    if na != nb and na != 1 and nb != 1:
        raise ValueError(f"b_fsa: {nb} FSAs do not match a_fsa's {na}")
    n = max(na, nb)
    return [(i if na > 1 else 0, i if nb > 1 else 0) for i in range(n)], (a._vec or b._vec)


def _check_sorted(fsa: Fsa, name: str) -> None:
    if not fsa.properties & ARC_SORTED:
        raise ValueError(f"{name}: must be arc-sorted (call arc_sort first)")


@overload
def intersect(a_fsa: Fsa, b_fsa: Fsa, treat_epsilons_specially: bool = True,
              ret_arc_maps: Literal[False] = False) -> Fsa: ...
@overload
def intersect(a_fsa: Fsa, b_fsa: Fsa, treat_epsilons_specially: bool,
              ret_arc_maps: Literal[True]) -> tuple[Fsa, torch.Tensor, torch.Tensor]: ...
@overload
def intersect(a_fsa: Fsa, b_fsa: Fsa, treat_epsilons_specially: bool = True, *,
              ret_arc_maps: Literal[True]) -> tuple[Fsa, torch.Tensor, torch.Tensor]: ...
@overload
def intersect(a_fsa: Fsa, b_fsa: Fsa, treat_epsilons_specially: bool = True,
              ret_arc_maps: bool = False) -> Fsa | tuple[Fsa, torch.Tensor, torch.Tensor]: ...
def intersect(a_fsa: Fsa, b_fsa: Fsa, treat_epsilons_specially: bool = True,
              ret_arc_maps: bool = False) -> Fsa | tuple[Fsa, torch.Tensor, torch.Tensor]:
    """k2's ``intersect`` (see the module docstring): both inputs must be
    arc-sorted; labels must match (0 with 0 as well when
    ``treat_epsilons_specially`` is False).  Single FSAs give a single FSA;
    an FsaVec gives an FsaVec (a single FSA or an FsaVec of one on the
    other side is used for each of its FSAs)."""
    a_fsa, b_fsa = _fsa(a_fsa, "a_fsa"), _fsa(b_fsa, "b_fsa")
    treat = checks.flag(treat_epsilons_specially, "treat_epsilons_specially")
    ret = checks.flag(ret_arc_maps, "ret_arc_maps")
    _check_sorted(a_fsa, "a_fsa")
    _check_sorted(b_fsa, "b_fsa")
    if a_fsa.device != b_fsa.device:
        raise ValueError(f"b_fsa: on {b_fsa.device}, a_fsa on {a_fsa.device}")
    pairs, vec = _pairs(a_fsa, b_fsa)
    A, B = list(_pieces(a_fsa)), list(_pieces(b_fsa))
    results, amaps, bmaps = [], [], []
    for i, j in pairs:
        S, src, dst, lab, am, bm = _intersect_one(A[i][:4], B[j][:4], treat)
        results.append((S, src, dst, lab))
        amaps.append(np.where(am >= 0, am + A[i][4], -1))
        bmaps.append(np.where(bm >= 0, bm + B[j][4], -1))
    amap = np.concatenate(amaps).astype(np.int64)
    bmap = np.concatenate(bmaps).astype(np.int64)
    counts = np.array([len(r[1]) for r in results], dtype=np.int64)
    cat = (lambda k: np.concatenate([r[k] for r in results]))
    scores = _index(a_fsa.scores, amap, 0.0) + _index(b_fsa.scores, bmap, 0.0)
    out = Fsa._make([r[0] for r in results], cat(1), cat(2), cat(3), scores, vec=vec,
                    arc_splits=np.concatenate([[0], np.cumsum(counts)]), check=False)
    b_attrs = dict(b_fsa.named_tensor_attr(include_scores=False))
    for name, value in a_fsa.named_tensor_attr(include_scores=False):
        if name in b_attrs:
            other = b_attrs.pop(name)
            if isinstance(value, torch.Tensor) and value.dtype.is_floating_point and isinstance(other, torch.Tensor):
                out._tensor_attr[name] = _index(value, amap, 0.0) + _index(other, bmap, 0.0)
            continue  # integer attributes on both sides are dropped
        out._tensor_attr[name] = _index(value, amap, a_fsa.get_filler(name))
    for name, value in b_attrs.items():
        out._tensor_attr[name] = _index(value, bmap, b_fsa.get_filler(name))
    for name, value in list(b_fsa.named_non_tensor_attr()) + list(a_fsa.named_non_tensor_attr()):
        out._non_tensor_attr[name] = value
    if ret:
        return out, torch.as_tensor(amap.astype(np.int32)), torch.as_tensor(bmap.astype(np.int32))
    return out


def compose(a_fsa: Fsa, b_fsa: Fsa, treat_epsilons_specially: bool = True,
            inner_labels: str | None = None) -> Fsa:
    """k2's ``compose``: ``a_fsa``'s ``aux_labels`` (a tensor; its output
    side) matched with ``b_fsa``'s labels.  ``a_fsa`` is inverted and
    arc-sorted, intersected with ``b_fsa`` (which must be arc-sorted), and
    the result's labels are ``a_fsa``'s labels, its ``aux_labels`` those of
    ``b_fsa`` (or, for an acceptor ``b_fsa``, the matched labels, which
    ``inner_labels`` names otherwise)."""
    a_fsa, b_fsa = _fsa(a_fsa, "a_fsa"), _fsa(b_fsa, "b_fsa")
    if not isinstance(a_fsa._tensor_attr.get("aux_labels"), torch.Tensor):
        raise ValueError("a_fsa: compose needs a_fsa to have aux_labels (a tensor, not ragged)")
    if inner_labels is not None and not isinstance(inner_labels, str):
        raise TypeError(f"inner_labels: expected an attribute name, got {type(inner_labels).__name__}")
    _check_sorted(b_fsa, "b_fsa")
    a_inv = arc_sort(a_fsa.invert())
    a_inv._tensor_attr["left_labels"] = a_inv._tensor_attr.pop("aux_labels")
    ans = intersect(a_inv, b_fsa, treat_epsilons_specially=treat_epsilons_specially)
    if inner_labels is not None:
        ans._tensor_attr[inner_labels] = ans.labels.clone()
    if "aux_labels" not in b_fsa._tensor_attr:
        if inner_labels is not None:
            raise ValueError("inner_labels: not needed when b_fsa has no aux_labels (they are the inner labels)")
        ans._tensor_attr["aux_labels"] = ans.labels.clone()
    ans._tensor_attr["labels"] = _fix_final_labels(ans, ans._tensor_attr.pop("left_labels").to(torch.int32))
    return ans


# --------------------------------------------------------------- determinization
def _determinize_one(S, src, dst, lab, score):
    if S <= 1:
        z = np.zeros(0, np.int64)
        return S, z, z, z, np.zeros(0)
    final = np.full(S - 1, -np.inf)
    reg = lab >= 0
    np.maximum.at(final, src[~reg], score[~reg])
    fst = Fst(S - 1, 0, src[reg], dst[reg], lab[reg], score[reg], final)
    det = _determinize_fst(fst, semiring="tropical")
    if det is None:
        raise ValueError("fsa: the determinization does not terminate (no twins property)")
    fin = np.flatnonzero(det.final > -np.inf)
    n = det.num_states
    ns = np.concatenate([det.src, fin])
    nd = np.concatenate([det.dst, np.full(len(fin), n)])
    nl = np.concatenate([det.pdf, np.full(len(fin), -1)])
    nw = np.concatenate([det.log_prob, det.final[fin]])
    o = np.lexsort((_label_order(nl), ns))
    return n + 1, ns[o], nd[o], nl[o], nw[o]


def determinize(fsa: Fsa, weight_pushing_type: object = None) -> Fsa:
    """A deterministic acceptor equivalent to ``fsa`` in the tropical
    semiring (epsilon is an ordinary label; ``fsa`` must not require grad
    and must have no ``aux_labels``); ``fsa`` itself when it is already
    arc-sorted and deterministic.  The weights are pushed as the subset
    construction pushes them (any ``weight_pushing_type`` gives an
    equivalent result)."""
    fsa = _fsa(fsa)
    if fsa.requires_grad:
        raise ValueError("fsa: determinize needs an FSA whose scores do not require grad")
    if any(name != "scores" for name, _ in fsa.named_tensor_attr()):
        raise ValueError("fsa: determinize supports acceptors (no aux_labels or other per-arc attributes)")
    if fsa.properties & ARC_SORTED_AND_DETERMINISTIC:
        return fsa
    score = fsa.scores.detach().cpu().numpy().astype(np.float64)
    parts = [_determinize_one(S, src, dst, lab, score[a0:a0 + len(src)]) for S, src, dst, lab, a0 in _pieces(fsa)]
    counts = np.array([len(p[1]) for p in parts], dtype=np.int64)
    out = Fsa._make([p[0] for p in parts], np.concatenate([p[1] for p in parts]),
                    np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]),
                    torch.as_tensor(np.concatenate([p[4] for p in parts]), dtype=fsa.scores.dtype,
                                    device=fsa.device),
                    vec=fsa._vec, arc_splits=np.concatenate([[0], np.cumsum(counts)]))
    out._non_tensor_attr.update(fsa._non_tensor_attr)
    return out
