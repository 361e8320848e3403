"""Transducer losses compiled into the generic engine: RNN-T, multi-blank
RNN-T (and, through :mod:`chainfb.compat`, the torchaudio, NeMo/ESPnet and
SpeechBrain flavours).

- :mod:`.graphs`: the compilers (``rnnt_graphs``, ``multiblank_graphs``
  return ordinary :class:`~chainfb.FstBatch` objects; ``compile_layout``
  adds the column bookkeeping);
- :mod:`.score_map`: :class:`TransducerCriterion`, the step graphs plus the
  transducer score map (torch and CUDA-kernel backends);
- :mod:`.loss`: the public losses.
"""

from .graphs import TransducerLayout, compile_layout, multiblank_graphs, rnnt_graphs, step_graph
from .loss import check_inputs, multiblank_rnnt_loss, reduce_costs, rnnt_loss
from .score_map import TransducerCriterion, symbol_table

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
]
