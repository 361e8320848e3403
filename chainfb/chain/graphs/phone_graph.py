"""Phone-level acceptors (before topology expansion).

A :class:`PhoneGraph` is a weighted acceptor over phone ids whose arcs may
be epsilons (``phone = -1``) and may carry a word id (``word >= 0``, used by
decoding graphs; ``-1`` otherwise).  Transcripts, lexicons and phone LMs are
first written as phone graphs; :func:`PhoneGraph.remove_epsilons` and
:func:`PhoneGraph.trim` prepare them for expansion by a topology.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...fst_algo import remove_epsilons, useful_states

__all__ = ["PhoneGraph"]

EPS = -1


@dataclass
class PhoneGraph:
    """Weighted phone acceptor with optional epsilons.

    Attributes
    ----------
    num_nodes : int
    start : int
    arcs : list of ``(src, dst, phone, log_prob, word)``; ``phone = -1`` is epsilon.
    final : dict ``node -> log_prob``
    """

    num_nodes: int = 0
    start: int = 0
    arcs: list = field(default_factory=list)
    final: dict = field(default_factory=dict)

    def add_node(self) -> int:
        self.num_nodes += 1
        return self.num_nodes - 1

    def add_arc(self, src: int, dst: int, phone: int, log_prob: float = 0.0, word: int = -1) -> None:
        self.arcs.append((int(src), int(dst), int(phone), float(log_prob), int(word)))

    def remove_epsilons(self) -> PhoneGraph:
        """An equivalent graph without epsilon arcs (the epsilon sub-graph must
        be acyclic; path weights through epsilons are summed exactly:
        :func:`chainfb.fst_algo.remove_epsilons`).  Epsilon arcs may not
        carry words."""
        if any(a[2] == EPS and a[4] >= 0 for a in self.arcs):
            raise ValueError("an epsilon arc may not carry a word label")
        arcs, final = remove_epsilons(self.num_nodes, self.arcs, self.final, EPS, "phone graph")
        return PhoneGraph(self.num_nodes, self.start, arcs, final).trim()

    def trim(self) -> PhoneGraph:
        """Keep only nodes on some start-to-final path, renumbered (start first)."""
        live = [a for a in self.arcs if a[3] > -np.inf]
        mask = useful_states(self.num_nodes, [a[0] for a in live], [a[1] for a in live], self.start,
                             [s for s, w in self.final.items() if w > -np.inf])
        keep = set(np.flatnonzero(mask).tolist())
        if self.start not in keep:
            raise ValueError("the phone graph has no path from the start to a final node")
        order = [self.start] + sorted(keep - {self.start})
        new = {u: i for i, u in enumerate(order)}
        out = PhoneGraph(len(order), 0)
        out.arcs = [(new[a[0]], new[a[1]], a[2], a[3], a[4]) for a in self.arcs
                    if a[0] in keep and a[1] in keep and a[3] > -np.inf]
        out.final = {new[s]: w for s, w in self.final.items() if s in keep and w > -np.inf}
        return out
