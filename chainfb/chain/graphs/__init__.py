"""Graph building for chain (LF-MMI) training: lexicons and transcripts,
HMM topologies, left-biphone context dependency, numerator and word-loop graphs, the
phone LM and denominator graph, Kaldi's normalization FST, and FST
archives.  Every function returns plain :class:`~chainfb.Fst` objects.  The
generic algorithms they use (determinize, state merging, trim, intersect,
epsilon removal) live in :mod:`chainfb.fst_algo`; the ones listed here stay
importable from here."""

from .archive import have_kaldifst, read_fst_archive, read_kaldi_fst_archive, write_fst_archive, write_kaldi_fst_archive
from .biphone import BiphoneSet, biphone_counts, transcript_biphone_counts
from ...fst_algo import determinize, intersect, merge_equivalent_states, min_frames, trim
from .graph_compiler import check_fits, expand, fits, numerator_graph, word_loop_graph
from .lexicon import Lexicon, phone_index, read_lexicon, read_phones, read_text
from .normalization import add_normalization, normalization_fst
from .phone_graph import PhoneGraph
from .phone_lm import PhoneLM, den_graph, estimate_phone_lm, transcript_phones
from .topology import Topology

__all__ = [
    "BiphoneSet", "biphone_counts", "transcript_biphone_counts",
    "Lexicon", "read_lexicon", "read_text", "read_phones", "Topology", "PhoneGraph",
    "numerator_graph", "word_loop_graph", "expand", "min_frames", "fits", "check_fits", "phone_index",
    "merge_equivalent_states", "trim", "determinize", "PhoneLM", "den_graph", "estimate_phone_lm",
    "transcript_phones", "add_normalization", "intersect", "normalization_fst",
    "read_fst_archive", "write_fst_archive", "read_kaldi_fst_archive", "write_kaldi_fst_archive", "have_kaldifst",
]
