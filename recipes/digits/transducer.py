"""The stateless transducer of icefall's ``pruned_transducer_stateless``:
an embedding decoder with a context of two labels, an additive joiner with
``tanh`` and a projection, the two linear "simple" heads of the pruned
loss, and greedy search (RNN-T and TDT).

Shapes: encoder output ``enc [N, T, E]``; labels ``[N, U]``; the decoder
reads ``[blank, y_1 .. y_U]`` and gives ``dec [N, U + 1, D]``; the joiner
maps ``enc[:, :, None] + dec[:, None]`` (after projections) to ``[N, T, U +
1, V (+ num_durations)]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["StatelessDecoder", "Joiner", "greedy_search"]


class StatelessDecoder(nn.Module):
    """Embedding of the last ``context`` labels, mixed by a causal depthwise
    1-D convolution and a ReLU: ``[N, L] -> [N, L, D]``.  Training reads
    :meth:`prefix` (the blank, then the labels) and the convolution pads
    with zero vectors on the left, so the state before the first label sees
    ``[0, blank]``, not ``[blank, blank]``; :meth:`step` gives the state of a
    decoding history exactly as training computes it."""

    def __init__(self, vocab: int, dim: int, blank: int = 0, context: int = 2):
        super().__init__()
        self.blank, self.context = blank, context
        self.embedding = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, dim, context, groups=dim, bias=False) if context > 1 else None

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        e = self.embedding(labels.clamp(min=0))  # [N, L, D]
        if self.conv is not None:
            e = nn.functional.pad(e.transpose(1, 2), (self.context - 1, 0))
            e = self.conv(e).transpose(1, 2)
        return torch.relu(e)

    def prefix(self, targets: torch.Tensor) -> torch.Tensor:
        """``[N, U] -> [N, U + 1]``: the blank (start of sentence), then the labels."""
        return torch.cat([targets.new_full((targets.shape[0], 1), self.blank), targets], dim=1)

    def step(self, labels: Sequence[int], device=None) -> torch.Tensor:
        """``[1, D]``: the output after the emitted ``labels``, equal to
        ``self(self.prefix(labels))[:, len(labels)]`` (the last ``context``
        entries of ``[blank, *labels]``, zero padding before the blank)."""
        hist = ([self.blank] + [int(i) for i in labels])[-self.context:]
        return self(torch.tensor([hist], device=device))[:, -1]


class Joiner(nn.Module):
    """``out(tanh(enc_proj(enc) + dec_proj(dec)))``; :meth:`forward` takes
    already projected (and broadcastable) inputs, as the pruned pipeline
    gathers them on a band first."""

    def __init__(self, enc_dim: int, dec_dim: int, dim: int, out_dim: int):
        super().__init__()
        self.enc_proj = nn.Linear(enc_dim, dim)
        self.dec_proj = nn.Linear(dec_dim, dim)
        self.out = nn.Linear(dim, out_dim)

    def forward(self, enc_p: torch.Tensor, dec_p: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(enc_p + dec_p))

    def full(self, enc: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        """``[N, T, U + 1, out_dim]`` from ``enc [N, T, E]`` and ``dec [N, U + 1, D]``."""
        return self(self.enc_proj(enc)[:, :, None, :], self.dec_proj(dec)[:, None, :, :])


@torch.no_grad()
def greedy_search(enc: torch.Tensor, lengths: Sequence[int], decoder: StatelessDecoder, joiner: Joiner,
                  vocab: int, durations: Sequence[int] = (), max_symbols: int = 3, units=None) -> list[list[int]]:
    """Greedy decoding of each utterance: at frame ``t`` emit the best label
    while it is not the blank (at most ``max_symbols`` per frame); with TDT
    ``durations`` the best duration of the emitted token moves ``t`` on
    (a blank always moves at least one frame).  With ``units`` (a
    :class:`~digits.units.CharUnits`) the best label is taken among
    those that keep the current word a prefix of a vocabulary word
    (lexicon-constrained greedy search).  Returns label lists."""
    out = []
    for n in range(enc.shape[0]):
        hyp: list[int] = []
        # the decoder state as in training (decoder.step): a history of [blank, blank] instead of the start
        # state [0, blank] would be a context the model never saw
        dec_p = joiner.dec_proj(decoder.step(hyp, enc.device))  # [1, J]
        enc_p = joiner.enc_proj(enc[n, : int(lengths[n])])  # [T, J]
        t, emitted = 0, 0
        T = enc_p.shape[0]
        word: list[int] = []
        while t < T:
            logits = joiner(enc_p[t:t + 1], dec_p)[0]
            tok_logits = logits[:vocab]
            if units is not None:
                tok_logits = tok_logits.masked_fill(~units.allowed_next(word).to(tok_logits.device), -float("inf"))
            tok = int(tok_logits.argmax())
            step = int(durations[int(logits[vocab:].argmax())]) if durations else 0
            if tok != decoder.blank and emitted < max_symbols:
                hyp.append(tok)
                word = [] if units is not None and tok == units.sep else word + [tok]
                dec_p = joiner.dec_proj(decoder.step(hyp, enc.device))
                emitted += 1
                if step > 0:
                    t, emitted = t + step, 0
            else:
                t, emitted = t + max(step, 1), 0
        out.append(hyp)
    return out
