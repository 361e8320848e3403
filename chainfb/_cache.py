"""The package's one caching mechanism: :class:`Memo`, a thread-safe map from
keys to values built on first use, optionally bounded (least recently used
out first, :class:`LRU`).

Where cached data lives:

- data derived from one lattice (engine arrays, device copies, the NumPy
  engine's segments, sub-lattices): :meth:`chainfb.lattice.Lattice.cache`;
- data derived from a batch's graphs alone (distinct pdfs, shared-graph
  matrices, one-graph lattices), shared by every batch
  :meth:`~chainfb.batch.FstBatch.with_sequences` derives, and data of one
  batch (its lattice): :meth:`chainfb.batch.FstBatch.cache`;
- compiled graphs and plans kept across calls (CTC's lattices, the
  transducer step graphs and layouts, the grids' score plans): a module-level
  :class:`LRU` each;
- a transducer layout's index tables per device and stream:
  :meth:`chainfb.transducer.graphs.TransducerLayout.cache`.

Keys are tuples whose first element names the user (``("numba",
"arrays")``, ``("cuda", "arrays", device_and_stream, "float32")``), so two
users of one memo never collide.  Device arrays are keyed by device and
stream (see :func:`chainfb.engines.cuda.cached`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

__all__ = ["Memo", "LRU"]


_T = TypeVar("_T")

class Memo:
    """A thread-safe memo.

    ``get(key, build)`` returns the value kept for ``key``, or builds it
    with ``build()``, keeps it and returns it.  The build runs outside the
    lock (a build may use the memo itself; two threads may build the same
    key once each, and both get the value kept first).  With ``size``, at
    most ``size`` keys are kept, the least recently used dropped first;
    without, every key is kept until :meth:`clear`."""

    def __init__(self, size: int | None = None):
        self.size = None if size is None else int(size)
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], _T]) -> _T:
        with self._lock:
            if key in self._items:
                if self.size is not None:
                    self._items.move_to_end(key)
                return self._items[key]
        value = build()
        with self._lock:
            if key in self._items:  # another thread built it meanwhile: one value for everyone
                return self._items[key]
            self._items[key] = value
            if self.size is not None:
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return value

    def copy(self) -> Memo:
        """A new memo of the same size holding the same values (shared, not
        copied)."""
        out = type(self).__new__(type(self))
        Memo.__init__(out, self.size)
        with self._lock:
            out._items.update(self._items)
        return out

    def clear(self) -> None:
        """Drop every value kept."""
        with self._lock:
            self._items.clear()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __getitem__(self, key: Hashable):
        return self._items[key]

    def __getstate__(self) -> dict:
        """A pickled memo travels empty (what it keeps is rebuilt on use)."""
        return {"size": self.size}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["size"])

    def keys(self) -> list:
        """The keys kept now (a copy)."""
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        return len(self._items)


class LRU(Memo):
    """A :class:`Memo` of at most ``size`` keys (least recently used dropped first)."""

    def __init__(self, size: int):
        super().__init__(size)
