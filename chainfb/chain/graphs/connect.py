"""Which states of a graph lie on some path from the start to a final state
(the states a trim keeps)."""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order

__all__ = ["useful_states"]


def _reached(num_nodes: int, src: np.ndarray, dst: np.ndarray, seed: int) -> np.ndarray:
    graph = csr_matrix((np.ones(len(src)), (src, dst)), shape=(num_nodes, num_nodes))
    seen = np.zeros(num_nodes, dtype=bool)
    seen[breadth_first_order(graph, seed, directed=True, return_predecessors=False)] = True
    return seen


def useful_states(num_states: int, src, dst, start: int, final_states) -> np.ndarray:
    """Bool mask ``[num_states]``: reachable from ``start`` along arcs
    ``src[i] -> dst[i]`` and able to reach one of ``final_states``."""
    src = np.asarray(src, dtype=np.int64).reshape(-1)
    dst = np.asarray(dst, dtype=np.int64).reshape(-1)
    finals = np.asarray(final_states, dtype=np.int64).reshape(-1)
    S = int(num_states)
    accessible = _reached(S, src, dst, int(start))
    # co-accessible: reverse the arcs and start from a super node linked to every final state
    super_node = np.full(len(finals), S, dtype=np.int64)
    coaccessible = _reached(S + 1, np.concatenate([dst, super_node]), np.concatenate([src, finals]), S)[:S]
    return accessible & coaccessible
