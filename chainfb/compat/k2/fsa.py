"""k2's ``Fsa``: one FSA, or a vector of FSAs (an FsaVec), with k2's
conventions and attribute rules.

An FSA has states ``0..S-1``; 0 is the start state and ``S - 1`` the one
final state, which no arc leaves and which only arcs labelled ``-1`` enter
(every ``-1`` arc enters it).  Arcs are grouped by source state in
increasing order.  ``S = 0`` is the empty FSA.  An FsaVec holds several
such FSAs with local state numbers; ``fsa_vec[i]`` is one of them, sharing
(through autograd) its slice of ``fsa_vec.scores``.

Per-arc attributes live beside the arcs: ``labels`` (int32), ``scores``
(log-probabilities; float32 as in k2, float64 accepted; may require grad)
and any tensor whose first dimension is the number of arcs, set with
``fsa.name = tensor`` (``aux_labels`` is the usual one; a
:class:`~chainfb.compat.k2.ragged.RaggedTensor` with one row per arc is
also accepted).  Other values (symbol tables, ...) are kept as they are.
Setting ``labels`` applies k2's ``fix_final_labels``: arcs entering the
final state get ``-1``, other arcs labelled ``-1`` get 0.  Every operation
that derives an FSA (:mod:`chainfb.compat.k2.ops`) indexes the attributes
through its arc map as k2 does (``scores`` through torch, so gradients
flow back).

``labels`` and ``scores`` are read and set like the other attributes.  The
graph structure (states, arcs) is kept on the host as NumPy arrays; the
attribute tensors live on ``fsa.device``.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from ... import checks
from . import text
from .ragged import Device, RaggedTensor

__all__ = ["Fsa", "create_fsa_vec", "to_str", "to_str_simple", "fsa_properties"]

#: k2's property flags (``k2.fsa_properties``)
VALID, NONEMPTY, TOPSORTED, TOPSORTED_AND_ACYCLIC = 0x01, 0x02, 0x04, 0x08
ARC_SORTED, ARC_SORTED_AND_DETERMINISTIC, EPSILON_FREE = 0x10, 0x20, 0x40
MAYBE_ACCESSIBLE, MAYBE_COACCESSIBLE = 0x80, 0x100
_PROPERTY_NAMES = [(VALID, "Valid"), (NONEMPTY, "Nonempty"), (TOPSORTED, "TopSorted"),
                   (TOPSORTED_AND_ACYCLIC, "TopSortedAndAcyclic"), (ARC_SORTED, "ArcSorted"),
                   (ARC_SORTED_AND_DETERMINISTIC, "ArcSortedAndDeterministic"), (EPSILON_FREE, "EpsilonFree"),
                   (MAYBE_ACCESSIBLE, "MaybeAccessible"), (MAYBE_COACCESSIBLE, "MaybeCoaccessible")]

_SCORE_DTYPES = (torch.float32, torch.float64)


class fsa_properties:  # noqa: N801 -- k2's module name, used as a namespace
    """k2's property flags and ``to_str``."""

    VALID, NONEMPTY, TOPSORTED, TOPSORTED_AND_ACYCLIC = VALID, NONEMPTY, TOPSORTED, TOPSORTED_AND_ACYCLIC
    ARC_SORTED, ARC_SORTED_AND_DETERMINISTIC, EPSILON_FREE = ARC_SORTED, ARC_SORTED_AND_DETERMINISTIC, EPSILON_FREE
    MAYBE_ACCESSIBLE, MAYBE_COACCESSIBLE = MAYBE_ACCESSIBLE, MAYBE_COACCESSIBLE

    @staticmethod
    def to_str(p: int) -> str:
        return "|".join(name for flag, name in _PROPERTY_NAMES if p & flag)


def _label_order(labels: np.ndarray) -> np.ndarray:
    """Labels as k2 compares them when sorting arcs: as uint32 (``-1`` last)."""
    return labels.astype(np.int64) & 0xFFFFFFFF


def _properties_one(S: int, src, dst, lab) -> int:
    if S == 0:
        return VALID
    p = VALID | NONEMPTY * (len(src) > 0)
    if (dst >= src).all():
        p |= TOPSORTED
        if (dst > src).all():
            p |= TOPSORTED_AND_ACYCLIC
    key = _label_order(lab)
    same = src[1:] == src[:-1]
    up = (key[1:] > key[:-1]) | ((key[1:] == key[:-1]) & (dst[1:] >= dst[:-1]))
    if (~same | up).all():
        p |= ARC_SORTED
        if (~same | (key[1:] > key[:-1])).all():
            p |= ARC_SORTED_AND_DETERMINISTIC
    if not (lab == 0).any():
        p |= EPSILON_FREE
    entered = np.zeros(S, bool)
    entered[dst] = True
    entered[0] = True
    left = np.zeros(S, bool)
    left[src] = True
    left[S - 1] = True
    if entered.all():
        p |= MAYBE_ACCESSIBLE
    if left.all():
        p |= MAYBE_COACCESSIBLE
    return p


def _check_structure(num_states, arc_splits, src, dst, labels, name="arcs") -> None:
    """k2's validity rules for every FSA (module docstring); ``ValueError`` naming ``name``."""
    for i, S in enumerate(num_states.tolist()):
        a0, a1 = int(arc_splits[i]), int(arc_splits[i + 1])
        s, d, lab = src[a0:a1], dst[a0:a1], labels[a0:a1]
        where = name if len(num_states) == 1 else f"{name} (FSA {i})"
        if S == 0:
            if a1 > a0:
                raise ValueError(f"{where}: an FSA with no states has no arcs")
            continue
        if len(s) and (s.min() < 0 or d.min() < 0 or s.max() >= S or d.max() >= S):
            raise ValueError(f"{where}: state ids must lie in [0, {S})")
        if len(s) and (np.diff(s) < 0).any():
            raise ValueError(f"{where}: arcs must be grouped by source state in increasing order")
        if (s == S - 1).any():
            raise ValueError(f"{where}: no arc may leave the final state {S - 1}")
        bad = (lab == -1) != (d == S - 1)
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"{where}: arc {k} ({s[k]} -> {d[k]}, label {lab[k]}): arcs into the final state "
                             f"{S - 1} and only they carry label -1")


class _Arcs:
    """What ``fsa.arcs`` gives in k2 (a RaggedArc), as far as user code reads it."""

    def __init__(self, fsa: Fsa):
        self._fsa = fsa

    def values(self) -> torch.Tensor:
        """``[num_arcs, 4]`` int32: src, dst, label, and the score's float32 bits (k2's layout)."""
        f = self._fsa
        bits = f.scores.detach().to(torch.float32).cpu().numpy().view(np.int32)
        v = np.stack([f._src, f._dst, f.labels.cpu().numpy(), bits], axis=1).astype(np.int32)
        return torch.from_numpy(v).to(f.device)

    def num_axes(self) -> int:
        return 3 if self._fsa._vec else 2

    def dim0(self) -> int:
        return self._fsa.shape[0]

    def num_elements(self) -> int:
        return self._fsa.num_arcs

    def row_splits(self, axis: int) -> torch.Tensor:
        """State splits (``axis`` 1 of an FsaVec) or arc splits (the last axis), int32."""
        f = self._fsa
        if f._vec and axis == 1:
            return torch.as_tensor(np.concatenate([[0], np.cumsum(f._num_states)]).astype(np.int32))
        if axis == (2 if f._vec else 1):
            return torch.as_tensor(f._state_arc_splits().astype(np.int32))
        raise ValueError(f"axis: expected 1{' or 2' if f._vec else ''}, got {axis}")

    def __str__(self) -> str:
        return str(self.values()[:, :3].tolist())


class OnDevice:
    """``is_cpu()`` / ``is_cuda()`` from a ``device`` property."""

    def is_cpu(self) -> bool:
        return self.device.type == "cpu"

    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


class Fsa(OnDevice):
    """k2's ``Fsa`` (see the module docstring).

    ``Fsa(arcs [num_arcs, 4] int32 tensor, aux_labels=None)``: k2's layout,
    src, dst, label and the float32 score's bits reinterpreted as int32
    (``Fsa.arcs.values()`` gives it back).  The final state is the one the
    ``-1`` arcs enter (without them: one more than the largest state used;
    no arcs: the empty FSA).  The usual constructors are
    :meth:`from_str`, :func:`~chainfb.compat.k2.linear_fsa`,
    :func:`~chainfb.compat.k2.ctc_topo` and the other graph functions.
    """

    def __init__(self, arcs: torch.Tensor, aux_labels: torch.Tensor | None = None, properties: int | None = None):
        if not isinstance(arcs, torch.Tensor):
            raise TypeError(f"arcs: expected an int32 tensor [num_arcs, 4], got {type(arcs).__name__}")
        if arcs.dtype != torch.int32 or arcs.dim() != 2 or arcs.shape[1] != 4:
            raise ValueError(f"arcs: expected an int32 tensor [num_arcs, 4], got {arcs.dtype} {tuple(arcs.shape)}")
        v = arcs.detach().cpu().numpy()
        src, dst, lab = (v[:, i].astype(np.int64) for i in range(3))
        score = v[:, 3].copy().view(np.float32)
        if len(src) == 0:
            S = 0
        elif (lab == -1).any():
            S = int(dst[lab == -1].max()) + 1
        else:
            S = int(max(src.max(), dst.max())) + 2
        self._init([S], src, dst, torch.as_tensor(lab.astype(np.int32), device=arcs.device),
                   torch.as_tensor(score, device=arcs.device), vec=False)
        if aux_labels is not None:
            self.aux_labels = aux_labels

    # ------------------------------------------------------------ internals
    def _init(self, num_states, src, dst, labels: torch.Tensor, scores: torch.Tensor, vec: bool,
              arc_splits=None, check: bool = True) -> None:
        d = self.__dict__
        d["_num_states"] = np.asarray(num_states, dtype=np.int64).reshape(-1)
        d["_src"] = np.asarray(src, dtype=np.int64)
        d["_dst"] = np.asarray(dst, dtype=np.int64)
        d["_arc_splits"] = (np.array([0, len(d["_src"])], dtype=np.int64) if arc_splits is None
                            else np.asarray(arc_splits, dtype=np.int64))
        d["_vec"] = bool(vec)
        d["_tensor_attr"] = {"labels": labels, "scores": scores}
        d["_non_tensor_attr"] = {}
        if check:
            _check_structure(d["_num_states"], d["_arc_splits"], d["_src"], d["_dst"], labels.cpu().numpy())

    @classmethod
    def _make(cls, num_states, src, dst, labels, scores, vec: bool, arc_splits=None, device=None,
              check: bool = True) -> Fsa:
        """An Fsa from host arrays (``labels`` int, ``scores`` a tensor or array)."""
        out = cls.__new__(cls)
        if not isinstance(scores, torch.Tensor):
            scores = torch.as_tensor(np.asarray(scores, dtype=np.float32), device=device)
        lab = torch.as_tensor(np.asarray(labels, dtype=np.int64).astype(np.int32), device=scores.device)
        out._init(num_states, src, dst, lab, scores, vec, arc_splits, check)
        return out

    def _state_arc_splits(self) -> np.ndarray:
        """Arc offsets per state (global state order), ``[total states + 1]``."""
        offs = np.concatenate([[0], np.cumsum(self._num_states)])
        glob = self._src + np.repeat(offs[:-1], np.diff(self._arc_splits))
        return np.searchsorted(glob, np.arange(int(offs[-1]) + 1), side="left").astype(np.int64)

    def _parts(self) -> Iterator[tuple[int, int, int]]:
        """``(num_states, first_arc, end_arc)`` of each FSA."""
        for i, S in enumerate(self._num_states.tolist()):
            yield S, int(self._arc_splits[i]), int(self._arc_splits[i + 1])

    # ------------------------------------------------------------ attributes
    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("_tensor_attr", "_non_tensor_attr") or isinstance(getattr(type(self), name, None), property):
            raise AttributeError(f"{name}: cannot be assigned")
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 or value.shape[0] != self.num_arcs:
                raise ValueError(f"{name}: expected a tensor with {self.num_arcs} (the number of arcs) rows, got "
                                 f"shape {tuple(value.shape)}")
            if value.device != self.device:
                raise ValueError(f"{name}: expected a tensor on {self.device}, got {value.device}")
            if name == "labels":
                if value.dtype != torch.int32:
                    raise TypeError(f"labels: expected an int32 tensor, got {value.dtype}")
                value = _fix_final_labels(self, value)
            elif name == "scores" and value.dtype not in _SCORE_DTYPES:
                raise TypeError(f"scores: expected a float32 or float64 tensor, got {value.dtype}")
            self._tensor_attr[name] = value
        elif isinstance(value, RaggedTensor):
            if value.dim0 != self.num_arcs:
                raise ValueError(f"{name}: expected {self.num_arcs} rows (one per arc), got {value.dim0}")
            self._tensor_attr[name] = value.to(self.device)
        else:
            if name in ("labels", "scores"):
                raise TypeError(f"{name}: expected a tensor, got {type(value).__name__}")
            self._non_tensor_attr[name] = value

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if name in d.get("_tensor_attr", {}):
            return d["_tensor_attr"][name]
        if name in d.get("_non_tensor_attr", {}):
            return d["_non_tensor_attr"][name]
        raise AttributeError(f"Unknown attribute {name}")

    def __delattr__(self, name: str) -> None:
        if name in ("labels", "scores") or name in type(self).__dict__:
            raise AttributeError(f"{name}: cannot be deleted")
        if name in self._tensor_attr:
            del self._tensor_attr[name]
        elif name in self._non_tensor_attr:
            del self._non_tensor_attr[name]
        else:
            raise AttributeError(f"No such attribute in Fsa: {name}")

    def named_tensor_attr(self, include_scores: bool = True) -> Iterator[tuple[str, Any]]:
        """``(name, value)`` of the per-arc attributes (not ``labels``)."""
        for name, value in list(self._tensor_attr.items()):
            if name != "labels" and (include_scores or name != "scores"):
                yield name, value

    def named_non_tensor_attr(self) -> Iterator[tuple[str, Any]]:
        yield from list(self._non_tensor_attr.items())

    def get_filler(self, attribute_name: str) -> int | float:
        """The value meaning "nothing here" for an attribute (``name_filler``, default 0)."""
        return self._non_tensor_attr.get(attribute_name + "_filler", 0)

    # ------------------------------------------------------------ properties
    @property
    def arcs(self) -> _Arcs:
        return _Arcs(self)

    @property
    def num_arcs(self) -> int:
        return int(self._src.shape[0])

    @property
    def shape(self) -> tuple:
        """``(num_states, None)`` for an FSA, ``(num_fsas, None, None)`` for an FsaVec."""
        if self._vec:
            return (len(self._num_states), None, None)
        return (int(self._num_states[0]), None)

    @property
    def device(self) -> torch.device:
        return self.scores.device

    @property
    def requires_grad(self) -> bool:
        return self.scores.requires_grad

    @property
    def grad(self) -> torch.Tensor | None:
        return self.scores.grad

    def requires_grad_(self, requires_grad: bool) -> Fsa:
        """Sets ``scores.requires_grad`` in place; returns ``self``."""
        self.scores.requires_grad_(checks.flag(requires_grad, "requires_grad"))
        return self

    @property
    def properties(self) -> int:
        """k2's property flags (the AND over the FSAs of an FsaVec)."""
        lab = self.labels.cpu().numpy().astype(np.int64)
        p = 0x1FF
        for S, a0, a1 in self._parts():
            p &= _properties_one(S, self._src[a0:a1], self._dst[a0:a1], lab[a0:a1])
        return p

    @property
    def properties_str(self) -> str:
        return fsa_properties.to_str(self.properties)

    # ------------------------------------------------------------ copies
    def _derived(self, num_states, src, dst, labels, arc_splits=None, vec=None) -> Fsa:
        """A new Fsa with this one's scores (same arcs order), before its attributes are set."""
        return Fsa._make(num_states, src, dst, labels, self.scores, self._vec if vec is None else vec,
                         self._arc_splits if arc_splits is None else arc_splits, check=False)

    def _copy_attrs_to(self, out: Fsa, transform) -> Fsa:
        for name, value in self.named_tensor_attr(include_scores=True):
            out._tensor_attr[name] = transform(value)
        out._tensor_attr["labels"] = transform(self.labels)
        out._non_tensor_attr.update(self._non_tensor_attr)
        return out

    def to(self, device: Device) -> Fsa:
        """This FSA on ``device`` (``self`` when already there); scores keep their autograd history."""
        device = torch.device(device)
        if device == self.device:
            return self
        out = self._derived(self._num_states, self._src, self._dst, self.labels.cpu().numpy())
        return self._copy_attrs_to(out, lambda v: v.to(device))

    def clone(self) -> Fsa:
        out = self._derived(self._num_states, self._src, self._dst, self.labels.cpu().numpy())
        return self._copy_attrs_to(out, lambda v: v.clone() if isinstance(v, torch.Tensor) else v)

    def detach(self) -> Fsa:
        out = self._derived(self._num_states, self._src, self._dst, self.labels.cpu().numpy())
        return self._copy_attrs_to(out, lambda v: v.detach() if isinstance(v, torch.Tensor) else v)

    def __getitem__(self, i: int) -> Fsa:
        """The ``i``-th FSA of an FsaVec (its attributes are slices: gradients flow back)."""
        if not self._vec:
            raise TypeError("fsa[i]: indexing needs an FsaVec (len(fsa.shape) == 3)")
        n = len(self._num_states)
        i = checks.integer(i, "i")
        if not 0 <= i < n:
            raise IndexError(f"i: expected an index in [0, {n}), got {i}")
        a0, a1 = int(self._arc_splits[i]), int(self._arc_splits[i + 1])
        out = Fsa._make([self._num_states[i]], self._src[a0:a1], self._dst[a0:a1],
                        self.labels[a0:a1].cpu().numpy(), self.scores[a0:a1], vec=False, check=False)
        for name, value in self.named_tensor_attr(include_scores=False):
            out._tensor_attr[name] = value[a0:a1] if isinstance(value, torch.Tensor) else value.index(
                np.arange(a0, a1))
        out._non_tensor_attr.update(self._non_tensor_attr)
        return out

    def invert_(self) -> Fsa:
        """Swap ``labels`` and ``aux_labels`` in place (``-1`` kept on the
        final arcs); a tensor ``aux_labels`` is needed."""
        aux = self._tensor_attr.get("aux_labels")
        if aux is None:
            raise ValueError("fsa: invert_ needs aux_labels (an acceptor has none)")
        if not isinstance(aux, torch.Tensor):
            raise ValueError("fsa: invert_ needs a tensor aux_labels (got a ragged one)")
        labels = self.labels
        self._tensor_attr["labels"] = _fix_final_labels(self, aux.to(torch.int32))
        self._tensor_attr["aux_labels"] = labels
        return self

    def invert(self) -> Fsa:
        """A copy with ``labels`` and ``aux_labels`` swapped."""
        return self.clone().invert_()

    def get_tot_scores(self, use_double_scores: bool, log_semiring: bool) -> torch.Tensor:
        raise NotImplementedError(
            "get_tot_scores: on this package's Fsa it is computed for the lattices intersect_dense returns "
            "(chainfb.compat.k2.intersect_dense); a general acyclic FSA's total is not implemented")

    # ------------------------------------------------------------ text
    @classmethod
    def from_str(cls, s: str, acceptor: bool | None = None, num_aux_labels: int | None = None,
                 aux_label_names: list[str] | None = None, ragged_label_names: Sequence[str] = (),
                 openfst: bool = False) -> Fsa:
        """An FSA from k2 text (or OpenFst text with ``openfst=True``); see
        :mod:`chainfb.compat.k2.text` for both formats.

        At most one of ``acceptor`` (True: no aux labels; False: one,
        ``aux_labels``), ``num_aux_labels`` (names ``aux_labels``,
        ``aux_labels2``, ...) and ``aux_label_names`` may be given; none
        means an acceptor.  ``ragged_label_names`` name ragged label lists
        written ``[ 1 2 ]`` after the aux labels.
        """
        names = _aux_label_names(acceptor, num_aux_labels, aux_label_names)
        ragged_label_names = list(ragged_label_names)
        openfst = checks.flag(openfst, "openfst")
        S, src, dst, lab, score, aux, ragged = text.parse(s, len(names), len(ragged_label_names), openfst)
        out = cls._make([S], src, dst, lab, torch.as_tensor(score.astype(np.float32)), vec=False, check=False)
        try:
            _check_structure(out._num_states, out._arc_splits, src, dst, lab, name="s")
        except ValueError as e:
            raise ValueError(f"{e} (with num_aux_labels={len(names)}{', openfst' if openfst else ''})") from None
        for name, row in zip(names, aux):
            out._tensor_attr[name] = torch.as_tensor(row.astype(np.int32))
        for name, rows in zip(ragged_label_names, ragged):
            out._tensor_attr[name] = RaggedTensor(rows)
        return out

    @classmethod
    def from_openfst(cls, s: str, acceptor: bool | None = None, num_aux_labels: int | None = None,
                     aux_label_names: list[str] | None = None, ragged_label_names: Sequence[str] = ()) -> Fsa:
        """``from_str(..., openfst=True)``."""
        return cls.from_str(s, acceptor, num_aux_labels, aux_label_names, ragged_label_names, openfst=True)

    @staticmethod
    def from_fsas(fsas: list[Fsa]) -> Fsa:
        return create_fsa_vec(fsas)

    def to_str(self, openfst: bool = False) -> str:
        """k2's ``Fsa.to_str``: a ``k2.Fsa: `` (or ``k2.FsaVec:``) header,
        the text of each FSA with every int32 attribute, the properties and
        the attributes."""
        openfst = checks.flag(openfst, "openfst")
        if self._vec:
            body = "k2.FsaVec: \n" + "".join(f"FsaVec[{i}]: " + _text(self[i], openfst, True)
                                            for i in range(self.shape[0]))
        else:
            body = "k2.Fsa: " + _text(self, openfst, True)
        body += f'properties_str = "{self.properties_str}".'
        for name, value in self.named_tensor_attr(include_scores=False):
            body += f"\n{name}: {value}"
        for name, value in self.named_non_tensor_attr():
            body += f"\n{name}: {value}"
        return body

    def __str__(self) -> str:
        return self.to_str(openfst=False)

    def __repr__(self) -> str:
        return self.__str__()

    # ------------------------------------------------------------ serialization
    def as_dict(self) -> dict:
        """``{"arcs": arcs.values(), <attributes>}`` (a single FSA; for ``torch.save``)."""
        if self._vec:
            raise ValueError("fsa: as_dict supports a single FSA (index an FsaVec first)")
        out = {"arcs": self.arcs.values()}
        out.update(self.named_tensor_attr(include_scores=False))
        out.update(self.named_non_tensor_attr())
        return out

    @classmethod
    def from_dict(cls, dict_in: dict) -> Fsa:
        """The inverse of :meth:`as_dict`."""
        if not isinstance(dict_in, dict) or "arcs" not in dict_in:
            raise ValueError("dict_in: expected a dict with an 'arcs' entry (from Fsa.as_dict)")
        out = cls(dict_in["arcs"], aux_labels=dict_in.get("aux_labels"))
        for key, value in dict_in.items():
            if key not in ("arcs", "aux_labels"):
                setattr(out, key, value)
        return out


def _aux_label_names(acceptor, num_aux_labels, aux_label_names) -> list:
    given = [n for n, v in (("acceptor", acceptor), ("num_aux_labels", num_aux_labels),
                            ("aux_label_names", aux_label_names)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"{given[1]}: give at most one of acceptor, num_aux_labels and aux_label_names "
                         f"(got {' and '.join(given)})")
    if acceptor is not None:
        return [] if checks.flag(acceptor, "acceptor") else ["aux_labels"]
    if aux_label_names is not None:
        if isinstance(aux_label_names, str) or not all(isinstance(n, str) for n in aux_label_names):
            raise TypeError("aux_label_names: expected a list of names")
        return list(aux_label_names)
    if num_aux_labels is not None:
        n = checks.integer(num_aux_labels, "num_aux_labels", lo=0)
        return ["aux_labels" if i == 0 else f"aux_labels{i + 1}" for i in range(n)]
    return []


def _fix_final_labels(fsa: Fsa, labels: torch.Tensor) -> torch.Tensor:
    """k2's ``fix_final_labels``: ``-1`` on arcs into each final state, 0 for other ``-1`` labels."""
    final = np.repeat(fsa._num_states - 1, np.diff(fsa._arc_splits))
    into_final = torch.as_tensor(fsa._dst == final, device=labels.device)
    minus = torch.full_like(labels, -1)
    return torch.where(into_final, minus, torch.where(labels == -1, torch.zeros_like(labels), labels))


def _int_attrs(fsa: Fsa):
    """The int32 tensor and ragged attributes, sorted by name (k2's ``to_str`` order)."""
    ints, ragged = [], []
    for _name, value in sorted(fsa.named_tensor_attr(include_scores=False), key=lambda kv: kv[0]):
        if isinstance(value, torch.Tensor) and value.dtype == torch.int32:
            ints.append(value.cpu().numpy())
        elif isinstance(value, RaggedTensor):
            ragged.append(value.tolist())
    return ints, ragged


def _text(fsa: Fsa, openfst: bool, all_labels: bool) -> str:
    if all_labels:
        ints, ragged = _int_attrs(fsa)
    else:
        aux = fsa._tensor_attr.get("aux_labels")
        ints, ragged = ([aux.cpu().numpy()] if isinstance(aux, torch.Tensor) else []), []
    return text.format_arcs(fsa.shape[0], fsa._src.tolist(), fsa._dst.tolist(), fsa.labels.cpu().tolist(),
                            fsa.scores.detach().cpu().numpy(), ints, ragged, openfst)


def _single(fsa, name: str) -> Fsa:
    if not isinstance(fsa, Fsa):
        raise TypeError(f"{name}: expected a chainfb.compat.k2.Fsa, got {type(fsa).__name__}")
    if fsa._vec:
        raise ValueError(f"{name}: expected a single FSA, got an FsaVec (index it first)")
    return fsa


def _stack(parts: list[Fsa], name: str) -> Fsa:
    """An FsaVec of the single FSAs ``parts`` (attributes concatenated; all
    of ``parts`` must have the same tensor attributes)."""
    if not parts:
        raise ValueError(f"{name}: expected at least one FSA")
    devices = {p.device for p in parts}
    if len(devices) > 1:
        raise ValueError(f"{name}: the FSAs are on different devices {sorted(map(str, devices))}")
    counts = np.array([p.num_arcs for p in parts], dtype=np.int64)
    out = Fsa._make(np.concatenate([p._num_states for p in parts]), np.concatenate([p._src for p in parts]),
                    np.concatenate([p._dst for p in parts]),
                    np.concatenate([p.labels.cpu().numpy() for p in parts]),
                    torch.cat([p.scores for p in parts]) if len({p.scores.dtype for p in parts}) == 1
                    else torch.cat([p.scores.to(torch.float64) for p in parts]),
                    vec=True, arc_splits=np.concatenate([[0], np.cumsum(counts)]), check=False)
    names = [n for n, _ in parts[0].named_tensor_attr(include_scores=False)]
    for i, p in enumerate(parts):
        mine = sorted(n for n, _ in p.named_tensor_attr(include_scores=False))
        if mine != sorted(names):
            raise ValueError(f"{name}[{i}]: tensor attributes {mine} differ from those of the first FSA "
                             f"{sorted(names)}")
    for n in names:
        values = [getattr(p, n) for p in parts]
        if all(isinstance(v, torch.Tensor) for v in values):
            out._tensor_attr[n] = torch.cat(values)
        else:
            rows = [r for v in values for r in (v.rows() if isinstance(v, RaggedTensor) else
                                                [np.array([x]) for x in v.tolist()])]
            out._tensor_attr[n] = RaggedTensor.from_rows(rows, device=out.device)
    for p in parts:
        for n, v in p.named_non_tensor_attr():
            out._non_tensor_attr.setdefault(n, v)
    return out


def create_fsa_vec(fsas: list[Fsa]) -> Fsa:
    """k2's ``create_fsa_vec``: an FsaVec of single FSAs; tensor attributes
    (``scores`` included, with their autograd history) are concatenated."""
    if isinstance(fsas, Fsa) or not isinstance(fsas, (list, tuple)):
        raise TypeError(f"fsas: expected a list of single FSAs, got {type(fsas).__name__}")
    return _stack([_single(f, f"fsas[{i}]") for i, f in enumerate(fsas)], "fsas")


def to_str(fsa: Fsa, openfst: bool = False) -> str:
    """k2's ``k2.to_str``: the text of a single FSA with every int32 and
    ragged attribute as extra labels (sorted by name), readable by
    :meth:`Fsa.from_str` given those names."""
    return _text(_single(fsa, "fsa"), checks.flag(openfst, "openfst"), True)


def to_str_simple(fsa: Fsa, openfst: bool = False) -> str:
    """k2's ``k2.to_str_simple``: the text of a single FSA with
    ``aux_labels`` only."""
    return _text(_single(fsa, "fsa"), checks.flag(openfst, "openfst"), False)
