"""The acoustic models of the recipe: a TDNN (1-D convolutions) and a TDNN-LSTM, both subsampling frames by 3."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["TdnnModel", "TdnnLstmModel", "build_model", "subsampled_lengths"]


def subsampled_lengths(lengths: torch.Tensor, factor: int = 3) -> torch.Tensor:
    """Output frames for input ``lengths [N]``: ``ceil(T / factor)``."""
    return (lengths + factor - 1) // factor


class TdnnModel(nn.Module):
    """TDNN: per-utterance mean normalization, an input layer with 5 frames of context and stride 3 (frame
    subsampling by 3, like Kaldi's chain models), then ``num_layers`` residual dilated context-3 layers at the low
    frame rate, then a linear layer to ``num_pdfs`` outputs.

    ``forward(feats [N, T, F], lengths [N]) -> (scores [N, ceil(T/3), num_pdfs], out_lengths [N])``; padded frames
    are ignored by the normalization; the scores are unnormalized pdf log-likelihood-like values (chain models
    have no softmax).
    """

    def __init__(self, feat_dim: int, num_pdfs: int, hidden: int = 256, num_layers: int = 4, dropout: float = 0.1,
                 subsampling: int = 3):
        super().__init__()
        if feat_dim < 1 or num_pdfs < 1 or hidden < 1 or num_layers < 0 or subsampling < 1:
            raise ValueError("feat_dim, num_pdfs, hidden, subsampling must be >= 1 and num_layers >= 0")
        self.subsampling = subsampling
        ctx = 2 * ((subsampling + 1) // 2) + 1  # odd context covering the stride (5 for 3)
        self.inp = nn.Sequential(nn.Conv1d(feat_dim, hidden, ctx, stride=subsampling, padding=ctx // 2), nn.ReLU(),
                                 nn.BatchNorm1d(hidden))
        layers = []
        for i in range(num_layers):
            dil = 1 if i % 2 == 0 else 2
            layers.append(nn.Sequential(nn.Conv1d(hidden, hidden, 3, padding=dil, dilation=dil), nn.ReLU(),
                                        nn.BatchNorm1d(hidden), nn.Dropout(dropout)))
        self.layers = nn.ModuleList(layers)
        self.out = nn.Conv1d(hidden, num_pdfs, 1)

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor):
        if feats.dim() != 3:
            raise ValueError(f"feats: expected [N, T, F], got shape {tuple(feats.shape)}")
        N, T, F = feats.shape
        lengths = torch.as_tensor(lengths, device=feats.device)
        mask = (torch.arange(T, device=feats.device)[None, :] < lengths[:, None]).to(feats.dtype)  # [N, T]
        mean = (feats * mask[..., None]).sum(1) / lengths.clamp(min=1)[:, None].to(feats.dtype)
        x = ((feats - mean[:, None, :]) * mask[..., None]).transpose(1, 2)  # [N, F, T]
        x = self.inp(x)
        x = x[:, :, :(T + self.subsampling - 1) // self.subsampling]
        for layer in self.layers:
            x = x + layer(x)
        y = self.out(x).transpose(1, 2)  # [N, T', P]
        return y, subsampled_lengths(lengths, self.subsampling)


class TdnnLstmModel(nn.Module):
    """TDNN-LSTM: the :class:`TdnnModel` front end (stride-3 input layer, ``num_tdnn`` residual context layers at
    the low frame rate) followed by a ``num_lstm``-layer bidirectional LSTM (``hidden // 2`` units per direction,
    padded frames packed away) and a linear layer to ``num_pdfs`` outputs.

    ``forward(feats [N, T, F], lengths [N]) -> (scores [N, ceil(T/3), num_pdfs], out_lengths [N])``.
    """

    def __init__(self, feat_dim: int, num_pdfs: int, hidden: int = 256, num_tdnn: int = 2, num_lstm: int = 2,
                 dropout: float = 0.1, subsampling: int = 3):
        super().__init__()
        if num_lstm < 1 or hidden < 2:
            raise ValueError("num_lstm must be >= 1 and hidden >= 2")
        self.front = TdnnModel(feat_dim, 1, hidden, num_tdnn, dropout, subsampling)
        self.front.out = nn.Identity()
        self.lstm = nn.LSTM(hidden, hidden // 2, num_layers=num_lstm, batch_first=True, bidirectional=True,
                            dropout=dropout if num_lstm > 1 else 0.0)
        self.out = nn.Linear(2 * (hidden // 2), num_pdfs)

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor):
        h, olens = self.front(feats, lengths)  # [N, T', hidden]
        packed = nn.utils.rnn.pack_padded_sequence(h, olens.cpu().clamp(min=1), batch_first=True,
                                                   enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=h.shape[1])
        return self.out(out), olens


def build_model(kind: str, feat_dim: int, num_pdfs: int, hidden: int, num_layers: int, dropout: float) -> nn.Module:
    """``kind`` = ``"tdnn"`` (:class:`TdnnModel` with ``num_layers`` context layers) or ``"tdnn-lstm"``
    (:class:`TdnnLstmModel` with 2 TDNN layers and ``num_layers`` BLSTM layers)."""
    if kind == "tdnn":
        return TdnnModel(feat_dim, num_pdfs, hidden, num_layers, dropout)
    if kind == "tdnn-lstm":
        return TdnnLstmModel(feat_dim, num_pdfs, hidden, 2, num_layers, dropout)
    raise ValueError(f"kind: expected 'tdnn' or 'tdnn-lstm', got {kind!r}")
