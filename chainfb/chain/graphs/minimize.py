"""Exact state merging and determinization of epsilon-free acceptors:
:func:`~chainfb.fst_algo.merge_equivalent_states`,
:func:`~chainfb.fst_algo.determinize` and :func:`~chainfb.fst_algo.trim`
live in :mod:`chainfb.fst_algo` (the generic FST algorithms) now; this path
keeps working."""

from ...fst_algo import SELF, _combine_parallel, determinize, merge_equivalent_states, trim
from ...fst_algo import canonical_fst as _build

__all__ = ["merge_equivalent_states", "trim", "determinize"]
