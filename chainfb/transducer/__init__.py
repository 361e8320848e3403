"""Transducer losses compiled into the generic engine: RNN-T, multi-blank
RNN-T, TDT (and, through :mod:`chainfb.compat`, the torchaudio, NeMo/ESPnet and
SpeechBrain flavours).

- :mod:`.graphs`: the one compiler of the family (``rnnt_graphs``,
  ``multiblank_graphs``, ``tdt_graphs`` return ordinary
  :class:`~chainfb.FstBatch` objects; ``compile_layout`` batches, caches
  and adds the column bookkeeping);
- :mod:`.criterion`: :class:`TransducerCriterion`, the step graphs plus the
  transducer score map;
- :mod:`.maps`: the score maps of RNN-T, TDT and the grid, one module per
  backend (torch ops, compiled CPU, CUDA kernels) and the one ``select``;
- :mod:`.loss`: the public losses;
- :mod:`.grid`: the ``(s, t)`` grid lattice of k2's mutual-information
  recursion as a step-graph criterion over ``(px, py)``;
- :mod:`.tdt`: the Token-and-Duration Transducer (``TDTCriterion``, a score
  map over token and duration logits, and ``tdt_loss``);
- :mod:`.pruned`: the pruned RNN-T family (simple / smoothed / full / pruned
  losses, prune ranges) on that grid.

The Viterbi aligners over the same lattices (``rnnt_align``, ``tdt_align``,
``grid_align``, ``pruned_rnnt_align``, ``TransducerAlignment``) live in
:mod:`chainfb.alignment.transducer`, a layer above this package; they stay
importable from here, resolved on first use.
"""

from .graphs import (TransducerLayout, compile_layout, multiblank_graphs, rnnt_graphs, step_graph, tdt_graphs,
                     tdt_step_graph)
from .loss import check_inputs, multiblank_rnnt_loss, reduce_costs, rnnt_loss
from . import pruned
from .grid import GridCriterion, grid_loglike
from .pruned import *  # noqa: F401,F403 -- the pruned family, listed in pruned.__all__
from .criterion import TransducerCriterion, symbol_table
from .tdt import TDTCriterion, tdt_loss

#: names served from chainfb.alignment.transducer (see the module docstring)
_ALIGNERS = ("TransducerAlignment", "rnnt_align", "tdt_align", "grid_align", "pruned_rnnt_align")

__all__ = [
    "step_graph",
    "rnnt_graphs",
    "multiblank_graphs",
    "TransducerLayout",
    "compile_layout",
    "TransducerCriterion",
    "symbol_table",
    "rnnt_loss",
    "multiblank_rnnt_loss",
    "check_inputs",
    "reduce_costs",
    # TDT
    "tdt_step_graph",
    "tdt_graphs",
    "TDTCriterion",
    "tdt_loss",
    # the (s, t) grid and the pruned family (k2 / fast_rnnt)
    "GridCriterion",
    "grid_loglike",
    *pruned.__all__,
    # Viterbi alignments over the same lattices (chainfb.alignment.transducer)
    *_ALIGNERS,
]


def __getattr__(name: str):
    """The aligners of :mod:`chainfb.alignment.transducer` under their old
    path ``chainfb.transducer.<name>``."""
    if name in _ALIGNERS:
        from ..alignment import transducer as aligners

        return getattr(aligners, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_ALIGNERS))
