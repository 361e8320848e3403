"""The old path of Kaldi's chain API, which lives in
:mod:`chainfb.compat.kaldi` now, beside chainfb's other drop-ins:
``Supervision``, ``GenericNumeratorComputation`` and
``DenominatorComputation``.  ``import chainfb.kaldi`` and ``from chainfb.kaldi
import ...`` keep working (the same classes); new code imports them from
:mod:`chainfb.compat.kaldi` or from :mod:`chainfb` itself."""

from .compat.kaldi import DenominatorComputation, GenericNumeratorComputation, Supervision

__all__ = ["Supervision", "GenericNumeratorComputation", "DenominatorComputation"]
