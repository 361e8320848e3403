"""Kaldi's ``chain::Supervision`` in its end-to-end form: the numerator
graphs of a minibatch, the frames per sequence, a weight and the lengths.
:class:`chainfb.compat.kaldi.GenericNumeratorComputation` runs it;
:meth:`chainfb.chain.ChainSupervision.supervision` makes one from a chain
example.  (``chainfb.Supervision`` and ``chainfb.compat.kaldi.Supervision``
are this class.)"""

from __future__ import annotations

from collections.abc import Sequence

from .. import checks
from .._arrays import Ints, check_lengths
from ..batch import FstBatch
from ..fst import Fst

__all__ = ["Supervision"]


class Supervision:
    """Numerator graphs of a minibatch (Kaldi's ``chain::Supervision``, e2e form).

    Parameters
    ----------
    fsts : list of Fst or FstBatch
        One graph per sequence (``num_sequences``).
    frames_per_sequence : int
        ``T``; every sequence has this many rows in the network output.
    weight : float
        Multiplies the log-likelihood and the derivatives.
    lengths : ``[num_sequences]`` ints, optional
        Frames actually used by each sequence (default all ``T``); rows past
        a sequence's length get no derivative.
    """

    def __init__(self, fsts: Fst | Sequence[Fst] | FstBatch, frames_per_sequence: int, weight: float = 1.0,
                 lengths: Ints | None = None):
        if isinstance(fsts, Fst):
            fsts = [fsts]
        self.batch = FstBatch.coerce(fsts)
        self.frames_per_sequence = checks.integer(frames_per_sequence, "frames_per_sequence", lo=0)
        self.weight = checks.number(weight, "weight")
        self.num_sequences = self.batch.num_sequences
        self.lengths = check_lengths(lengths, self.num_sequences, self.frames_per_sequence)
