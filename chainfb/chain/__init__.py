"""End-to-end chain (LF-MMI): graph building (:mod:`chainfb.chain.graphs`:
lexicon and transcripts, topologies, numerator graphs, phone LM and
denominator graph, normalization FST, archives), the denominator
computation (:mod:`~chainfb.chain.denominator`) and the objective
(:mod:`~chainfb.chain.loss`)."""

from . import graphs
from .denominator import DenominatorGraph, initial_probs
from .graphs import *  # noqa: F401,F403 -- the graph-building API, listed in graphs.__all__
from .loss import ChainLoss

__all__ = [*graphs.__all__, "DenominatorGraph", "initial_probs", "ChainLoss"]
