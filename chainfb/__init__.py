"""chainfb: one generic FST forward-backward engine (Kaldi's e2e chain
numerator) with NumPy, SciPy and CuPy implementations, and compilers that
turn training criteria (chain numerators and denominators, transducer
losses) into graphs for it.

Layers: :class:`Fst` (with the generic FST algorithms of
:mod:`chainfb.fst_algo`) -> :class:`FstBatch` -> :class:`Lattice` ->
:mod:`chainfb.engines` (the engine seam) and :mod:`chainfb.criterion` (the
criterion seam: a graph compiler plus a score map, run by one autograd
Function) -> the losses -> alignment and the drop-ins
(:mod:`chainfb.compat`); ``docs/layout.md`` lists them, and
``tests/test_layers.py`` checks that no module imports from a layer above
its own."""

from . import chain
from .api import NumeratorLoss, PdfCriterion, best_path, forward_backward, fst_loglike
from .batch import FstBatch
from .chain import ChainLoss, DenominatorGraph
from .fst import Fst
from .compat.kaldi import DenominatorComputation, GenericNumeratorComputation, Supervision
from . import kaldi  # noqa: F401 -- chainfb.kaldi, the old path of chainfb.compat.kaldi
from .ctc import CtcTargets, ctc_graph, ctc_loss
from .lattice import Lattice
from .transducer import multiblank_rnnt_loss, rnnt_loss, tdt_loss
from . import alignment
from .alignment import TokenSpan, align_pdfs, forced_align, merge_tokens, rnnt_align, tdt_align

__version__ = "0.1.0"

__all__ = [
    "Fst",
    "FstBatch",
    "Lattice",
    "forward_backward",
    "best_path",
    "fst_loglike",
    "NumeratorLoss",
    "PdfCriterion",
    "Supervision",
    "GenericNumeratorComputation",
    "DenominatorComputation",
    "rnnt_loss",
    "multiblank_rnnt_loss",
    "tdt_loss",
    "ctc_loss",
    "ctc_graph",
    "CtcTargets",
    "chain",
    "ChainLoss",
    "DenominatorGraph",
    "alignment",
    "forced_align",
    "merge_tokens",
    "TokenSpan",
    "rnnt_align",
    "tdt_align",
    "align_pdfs",
]
