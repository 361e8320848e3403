"""Exact state merging and determinization of epsilon-free acceptors:
:func:`~chainfb.fst_algo.merge_equivalent_states`,
:func:`~chainfb.fst_algo.determinize` and :func:`~chainfb.fst_algo.trim`
live in :mod:`chainfb.fst_algo` (the generic FST algorithms) now; this path
keeps working."""

from ...fst_algo import SELF, _combine_parallel, determinize, merge_equivalent_states, trim  # noqa: F401
from ...fst_algo import canonical_fst as _build  # noqa: F401 -- the old private names, for old importers

__all__ = ["merge_equivalent_states", "trim", "determinize"]
