"""A two-axis ragged integer tensor, as far as k2's graph API needs one:
the ragged ``aux_labels`` that :func:`~chainfb.compat.k2.remove_epsilon`
leaves (the output labels met along a removed epsilon path) and the ragged
label lists :func:`~chainfb.compat.k2.linear_fsa` and
:func:`~chainfb.compat.k2.ctc_graph` accept.

Only k2's ``RaggedTensor`` members those uses need are here: construction
from a list of lists, ``values``, ``row_splits(1)``, ``dim0``,
``num_axes``, ``tolist``, ``to``, ``remove_values_eq`` and
``remove_values_leq``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ... import checks

__all__ = ["RaggedTensor"]

#: Where tensors live: a ``torch.device``, or what ``torch.device()`` takes (``"cpu"``, ``"cuda:0"``, an index).
Device = torch.device | str | int


class RaggedTensor:
    """``[dim0][?]`` int32 values: row ``i`` is
    ``values[row_splits[i]:row_splits[i + 1]]``.

    Parameters
    ----------
    data : list of lists of ints (``[[1, 2], [3]]``), or a RaggedTensor.
    dtype : ``torch.int32`` (the only dtype k2 uses for labels).
    device : where ``values`` lives (default CPU).
    """

    def __init__(self, data: Sequence[Sequence[int]] | RaggedTensor, dtype: torch.dtype = torch.int32,
                 device: Device | None = None):
        if isinstance(data, RaggedTensor):
            rows = data.tolist()
        else:
            if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
                raise TypeError(f"data: expected a list of lists of ints, got {type(data).__name__}")
            rows = []
            for i, r in enumerate(data):
                if isinstance(r, torch.Tensor):
                    r = r.tolist()
                if isinstance(r, (str, bytes)) or not isinstance(r, Sequence):
                    raise TypeError(f"data[{i}]: expected a list of ints, got {type(r).__name__}")
                rows.append(checks.int_array(np.asarray(r, dtype=np.int64) if len(r) else np.zeros(0, np.int64),
                                             f"data[{i}]", 1).tolist())
        if dtype != torch.int32:
            raise TypeError(f"dtype: expected torch.int32, got {dtype}")
        lens = np.array([len(r) for r in rows], dtype=np.int64)
        self._splits = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        flat = [v for r in rows for v in r]
        self.values = torch.tensor(flat, dtype=torch.int32, device=device)

    @classmethod
    def from_rows(cls, rows: list, device: Device | None = None) -> RaggedTensor:
        """From a list of integer NumPy arrays / lists (checked by the caller)."""
        out = cls.__new__(cls)
        lens = np.array([len(r) for r in rows], dtype=np.int64)
        out._splits = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        flat = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]) if rows else np.zeros(0, np.int64)
        out.values = torch.as_tensor(flat.astype(np.int32), device=device)
        return out

    @property
    def dim0(self) -> int:
        """The number of rows."""
        return len(self._splits) - 1

    @property
    def num_axes(self) -> int:
        return 2

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    def row_splits(self, axis: int) -> torch.Tensor:
        """``[dim0 + 1]`` int32 row splits (``axis`` must be 1)."""
        if checks.integer(axis, "axis") != 1:
            raise ValueError(f"axis: a two-axis ragged tensor has row splits for axis 1 only, got {axis}")
        return torch.as_tensor(self._splits.astype(np.int32), device=self.device)

    def rows(self) -> list:
        """The rows as int64 NumPy arrays."""
        v = self.values.cpu().numpy().astype(np.int64)
        return [v[a:b] for a, b in zip(self._splits[:-1], self._splits[1:])]

    def tolist(self) -> list:
        return [r.tolist() for r in self.rows()]

    def to(self, device: Device) -> RaggedTensor:
        if torch.device(device) == self.device:
            return self
        out = RaggedTensor.__new__(RaggedTensor)
        out._splits, out.values = self._splits, self.values.to(device)
        return out

    def index(self, rows: np.ndarray) -> RaggedTensor:
        """Rows ``rows`` (``-1``: an empty row), as a new ragged tensor."""
        mine = self.rows()
        empty = np.zeros(0, np.int64)
        return RaggedTensor.from_rows([mine[r] if r >= 0 else empty for r in np.asarray(rows).tolist()],
                                      device=self.device)

    def remove_values_eq(self, target: int) -> RaggedTensor:
        """A copy without the values equal to ``target``."""
        t = checks.integer(target, "target")
        return RaggedTensor.from_rows([r[r != t] for r in self.rows()], device=self.device)

    def remove_values_leq(self, cutoff: int) -> RaggedTensor:
        """A copy without the values ``<= cutoff``."""
        c = checks.integer(cutoff, "cutoff")
        return RaggedTensor.from_rows([r[r > c] for r in self.rows()], device=self.device)

    def __eq__(self, other) -> bool:
        if not isinstance(other, RaggedTensor):
            return NotImplemented
        return self.tolist() == other.tolist()

    __hash__ = None

    def __str__(self) -> str:
        return "[ " + " ".join("[ " + " ".join(str(v) for v in r) + (" ]" if r else "]") for r in self.tolist()) + " ]"

    __repr__ = __str__
