"""Transducer losses compiled into the generic engine: RNN-T, multi-blank
RNN-T (and, through :mod:`chainfb.compat`, the torchaudio, NeMo/ESPnet and
SpeechBrain flavours).  The compilers (``rnnt_graphs``,
``multiblank_graphs``) return ordinary :class:`~chainfb.FstBatch` objects."""

from .graphs import TransducerLayout, compile_layout, multiblank_graphs, rnnt_graphs, step_graph
from .loss import multiblank_rnnt_loss, rnnt_loss

__all__ = [
    "step_graph",
    "rnnt_graphs",
    "multiblank_graphs",
    "TransducerLayout",
    "compile_layout",
    "rnnt_loss",
    "multiblank_rnnt_loss",
]
