"""Forced alignment from the one engine: every criterion's compiled graph
run in the max semiring (:func:`chainfb.engines.best_path`), its winning
arcs read back as labels, frames and durations.

- :mod:`.ctc`: :func:`forced_align` (torchaudio's signature, any batch
  size, CPU and CUDA) and :func:`merge_tokens`;
- :mod:`.transducer`: :func:`rnnt_align` (RNN-T and multi-blank),
  :func:`tdt_align`, :func:`grid_align` and :func:`pruned_rnnt_align`;
- :mod:`.chain`: :func:`align_pdfs` (pdf alignments through numerator
  graphs), :func:`phone_segments`, :func:`word_segments`;
- :mod:`.paths`: the shared Viterbi call.
"""

from .chain import PdfAlignment, Segment, align_pdfs, phone_segments, word_segments
from .ctc import TokenSpan, ctc_min_frames, forced_align, merge_tokens
from .transducer import TransducerAlignment, grid_align, pruned_rnnt_align, rnnt_align, tdt_align

__all__ = [
    "forced_align", "merge_tokens", "TokenSpan", "ctc_min_frames",
    "TransducerAlignment", "rnnt_align", "tdt_align", "grid_align", "pruned_rnnt_align",
    "PdfAlignment", "Segment", "align_pdfs", "phone_segments", "word_segments",
]
