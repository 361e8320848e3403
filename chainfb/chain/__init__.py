"""End-to-end chain (LF-MMI): lexicon and transcripts, topologies, numerator
graphs, phone LM and denominator graph, and the chain objective."""

from .graph_compiler import check_fits, expand, fits, min_frames, numerator_graph, phone_index, word_loop_graph
from .lexicon import Lexicon, read_lexicon, read_phones, read_text
from .minimize import determinize, merge_equivalent_states, trim
from .phone_graph import PhoneGraph
from .topology import Topology

__all__ = [
    "Lexicon", "read_lexicon", "read_text", "read_phones", "Topology", "PhoneGraph",
    "numerator_graph", "word_loop_graph", "expand", "min_frames", "fits", "check_fits", "phone_index",
    "merge_equivalent_states", "trim", "determinize",
]

from .denominator import DenominatorComputation, DenominatorGraph, initial_probs
from .loss import ChainLoss, chain_objective
from .phone_lm import PhoneLM, den_graph, estimate_phone_lm

__all__ += ["DenominatorGraph", "DenominatorComputation", "initial_probs", "ChainLoss", "chain_objective", "PhoneLM", "den_graph",
            "estimate_phone_lm"]

from .normalization import add_normalization, intersect, normalization_fst

__all__ += ["add_normalization", "intersect", "normalization_fst"]

from .archive import have_kaldifst, read_fst_archive, read_kaldi_fst_archive, write_fst_archive, write_kaldi_fst_archive
from .phone_lm import transcript_phones

__all__ += ["read_fst_archive", "write_fst_archive", "read_kaldi_fst_archive", "write_kaldi_fst_archive",
            "have_kaldifst", "transcript_phones"]
