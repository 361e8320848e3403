"""The recipe's training settings and criterion names, importable without torch (the command line reads its
defaults from here before it imports anything heavy)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CRITERIA", "TrainConfig", "objective_label"]

CRITERIA = ("chain", "ctc", "rnnt", "pruned-rnnt", "tdt")


@dataclass
class TrainConfig:
    """Training hyper-parameters (see ``python -m recipes.digits --help``)."""

    epochs: int = 4
    batch_size: int = 16
    lr: float = 3e-3
    final_lr: float = 3e-4
    model: str = "tdnn-lstm"
    hidden: int = 256
    num_layers: int = 1
    dropout: float = 0.0
    leaky_hmm_coefficient: float = 0.1
    l2_regularize: float = 5e-4
    out_of_range_regularize: float = 0.01
    sil_prob: float = 0.5
    phone_lm_order: int = 3
    normalize_numerators: bool = True
    context: str = "mono"  # chain: "mono" or "biphone" (left biphones, Kaldi e2e)
    min_biphone_count: int = 100  # chain biphone: rarer biphones share their monophone's pdfs (Kaldi's default)
    min_monophone_count: int = 20  # chain biphone: phones seen at most this often share the zerophone pdfs
    seed: int = 0
    device: str = "auto"
    max_steps: int = 0  # > 0: stop each epoch after this many batches (tests / smoke runs)
    progress: bool = True
    criterion: str = "chain"  # one of CRITERIA
    encoder_dim: int = 256  # transducers: encoder output size
    decoder_dim: int = 128  # transducers: stateless decoder embedding size
    joiner_dim: int = 256  # transducers: joiner hidden size
    warm_steps: int = 100  # pruned RNN-T: steps with the pruned loss scaled by 0.1


_OBJECTIVES = {"chain": "LF-MMI objective", "ctc": "CTC log-likelihood", "rnnt": "RNN-T log-likelihood",
               "pruned-rnnt": "pruned RNN-T log-likelihood", "tdt": "TDT log-likelihood"}


def objective_label(criterion: str) -> str:
    """What ``train_objf_per_frame`` of ``criterion`` measures (LF-MMI: numerator minus denominator log-likelihood;
    the others: the log-likelihood of the transcript), for plot axes and tables."""
    if criterion not in _OBJECTIVES:
        raise ValueError(f"criterion: expected one of {', '.join(CRITERIA)}, got {criterion!r}")
    return _OBJECTIVES[criterion]
