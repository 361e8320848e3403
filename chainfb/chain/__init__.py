"""End-to-end chain (LF-MMI): graph building (:mod:`chainfb.chain.graphs`:
lexicon and transcripts, topologies, numerator graphs, phone LM and
denominator graph, normalization FST, archives), the denominator
computation (:mod:`~chainfb.chain.denominator`), the objective
(:mod:`~chainfb.chain.loss`) and Kaldi's chain examples
(:mod:`~chainfb.chain.egs`)."""

from . import graphs
from .denominator import DenominatorGraph, initial_probs
from .egs import ChainExample, ChainSupervision, NnetIo, read_chain_egs
from .graphs import *  # noqa: F401,F403 -- the graph-building API, listed in graphs.__all__
from .loss import ChainLoss

__all__ = [*graphs.__all__, "DenominatorGraph", "initial_probs", "ChainLoss", "read_chain_egs", "ChainExample",
           "ChainSupervision", "NnetIo"]
