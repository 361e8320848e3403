"""Which states of a graph lie on some path from the start to a final state
(the states a trim keeps): :func:`chainfb.fst_algo.useful_states`, which
lives in :mod:`chainfb.fst_algo` now; this path keeps working."""

from ...fst_algo import useful_states

__all__ = ["useful_states"]
