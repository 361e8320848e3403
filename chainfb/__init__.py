"""chainfb: one generic FST forward-backward engine (Kaldi's e2e chain
numerator) with NumPy and CuPy backends, and compilers that turn training
criteria (chain numerators and denominators, transducer losses) into graphs
for it."""

from . import chain
from .autograd import NumeratorLoss, fst_loglike
from .batch import FstBatch
from .chain import ChainLoss, DenominatorComputation, DenominatorGraph
from .fst import Fst
from .kaldi import GenericNumeratorComputation, Supervision
from .lattice import Lattice
from .numerator import best_path, forward_backward
from .transducer import multiblank_rnnt_loss, rnnt_loss

__version__ = "0.1.0"

__all__ = [
    "Fst",
    "FstBatch",
    "Lattice",
    "forward_backward",
    "best_path",
    "fst_loglike",
    "NumeratorLoss",
    "Supervision",
    "GenericNumeratorComputation",
    "rnnt_loss",
    "multiblank_rnnt_loss",
    "chain",
    "ChainLoss",
    "DenominatorGraph",
    "DenominatorComputation",
]
