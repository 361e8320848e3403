"""chainfb: one generic FST forward-backward engine (Kaldi's e2e chain
numerator) with NumPy and CuPy backends, and compilers that turn training
criteria (chain numerators, transducer losses) into graphs for it."""

from .autograd import NumeratorLoss, fst_loglike
from .batch import FstBatch
from .fst import Fst
from .kaldi import GenericNumeratorComputation, Supervision
from .lattice import Lattice
from .numerator import forward_backward

__version__ = "0.1.0"

__all__ = [
    "Fst",
    "FstBatch",
    "Lattice",
    "forward_backward",
    "fst_loglike",
    "NumeratorLoss",
    "Supervision",
    "GenericNumeratorComputation",
]

# chain (LF-MMI), issue 5
from . import chain  # noqa: E402
from .chain import ChainLoss, DenominatorComputation, DenominatorGraph  # noqa: E402

__all__ += ["chain", "ChainLoss", "DenominatorGraph", "DenominatorComputation"]
