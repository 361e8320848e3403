"""End-to-end chain (LF-MMI): graph building (:mod:`chainfb.chain.graphs`:
lexicon and transcripts, topologies, numerator graphs, phone LM and
denominator graph, normalization FST, archives), the denominator
computation (:mod:`~chainfb.chain.denominator`) and the objective
(:mod:`~chainfb.chain.loss`)."""

from .denominator import DenominatorGraph, initial_probs
from .graphs import (
    Lexicon, PhoneGraph, PhoneLM, Topology, add_normalization, check_fits, den_graph, determinize,
    estimate_phone_lm, expand, fits, have_kaldifst, intersect, merge_equivalent_states, min_frames,
    normalization_fst, numerator_graph, phone_index, read_fst_archive, read_kaldi_fst_archive, read_lexicon,
    read_phones, read_text, transcript_phones, trim, word_loop_graph, write_fst_archive, write_kaldi_fst_archive,
)
from .loss import ChainLoss, chain_objective

__all__ = [
    # graph building
    "Lexicon", "read_lexicon", "read_text", "read_phones", "Topology", "PhoneGraph",
    "numerator_graph", "word_loop_graph", "expand", "min_frames", "fits", "check_fits", "phone_index",
    "merge_equivalent_states", "trim", "determinize", "PhoneLM", "den_graph", "estimate_phone_lm",
    "transcript_phones", "add_normalization", "intersect", "normalization_fst",
    "read_fst_archive", "write_fst_archive", "read_kaldi_fst_archive", "write_kaldi_fst_archive", "have_kaldifst",
    # the denominator and the objective
    "DenominatorGraph", "initial_probs", "ChainLoss", "chain_objective",
]
