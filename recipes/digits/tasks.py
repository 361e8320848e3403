"""One training criterion of the digit recipe each: what the encoder outputs,
the extra modules, the loss of a batch and the decoder.

- ``chain``: LF-MMI (:class:`chainfb.ChainLoss`) on pdfs of the Kaldi chain
  topology over CMUdict phones; Viterbi over the word loop.
- ``ctc``: :func:`chainfb.ctc_loss` on character units (:mod:`.units`);
  greedy decoding, and Viterbi over a word loop compiled with the CTC
  topology (through the engine, :func:`chainfb.best_path`); the word-loop
  result is the reported WER.
- ``rnnt``: the stateless transducer of :mod:`.transducer` with
  :func:`chainfb.rnnt_loss` on the full joiner output.
- ``pruned-rnnt``: the same transducer with the pruned pipeline
  (:mod:`chainfb.transducer`): the simple loss (scale 0.5, and a
  warm-up during which the pruned loss is scaled down), prune ranges, the
  joiner on the band only (``s_range`` 5), the pruned loss.
- ``tdt``: the transducer with duration outputs ``[0, 1, 2, 3, 4]`` and
  :func:`chainfb.tdt_loss`; TDT greedy decoding skips frames by the
  predicted duration.

The transducers' greedy search is lexicon-constrained: at each step the
best label is taken among those that keep the current word a prefix of a
vocabulary word (and ``|`` only after a whole word).

Transducer and CTC units are characters with a word separator: the same
units for every non-chain criterion, and the greedy decoders' output is a
word sequence without a lexicon.
"""

from __future__ import annotations


import numpy as np
import torch
from torch import nn

from chainfb.chain import ChainLoss, Topology, read_lexicon, word_loop_graph
from .config import CRITERIA
from .decode import viterbi_batch
from .transducer import Joiner, StatelessDecoder, greedy_search
from .units import WORD_SEP, CharUnits

__all__ = ["CRITERIA", "make_task"]

TDT_DURATIONS = (0, 1, 2, 3, 4)


class ChainTask:
    """LF-MMI on the chain recipe's graphs (see :class:`digits.train.Recipe`)."""

    name = "chain"

    def __init__(self, recipe, cfg):
        self.recipe = recipe
        self.out_dim = recipe.num_pdfs
        self.modules = nn.ModuleDict()
        self.loss_fn = ChainLoss(recipe.den, leaky_hmm_coefficient=cfg.leaky_hmm_coefficient,
                                 l2_regularize=cfg.l2_regularize, out_of_range_regularize=cfg.out_of_range_regularize,
                                 reduction="sum")

    def fits(self, words, frames: int) -> bool:
        return self.recipe.numerator(words)[1] <= frames

    def loss(self, y, ylens, texts, step):
        """``(loss to minimise (summed over the batch), objective summed over the batch)``."""
        nums = [self.recipe.numerator(t)[0] for t in texts]
        loss = self.loss_fn(y.double(), nums, ylens.cpu())
        return loss, self.loss_fn.info["num"] - self.loss_fn.info["den"]

    @torch.no_grad()
    def decode(self, y, ylens):
        labs, _ = viterbi_batch(self.recipe.decode_graph, self.recipe.decode_labels, y.double().cpu().numpy(),
                                ylens.cpu().numpy())
        return [[self.recipe.words[j] for j in w] for w in labs], None

    def write(self, out_dir):
        self.recipe.write(out_dir)


class CtcTask:
    """CTC on character units; greedy and word-loop Viterbi decoding."""

    name = "ctc"

    def __init__(self, words, cfg):
        self.units = CharUnits(words)
        self.words = list(words)
        self.out_dim = len(self.units)
        self.modules = nn.ModuleDict()
        lex = read_lexicon([f"{w} {' '.join(w)}" for w in self.words])
        # CTC topology: blank pdf 0, unit i at pdf i (the phone list is the units after the blank)
        self.graph, self.labels = word_loop_graph(self.words, lex, Topology.ctc(), self.units.units[1:],
                                                  optional_silence=WORD_SEP, sil_prob=0.5)

    def fits(self, words, frames: int) -> bool:
        ids = self.units.encode(words)
        return len(ids) + sum(a == b for a, b in zip(ids, ids[1:])) <= frames

    def _targets(self, texts):
        ids = [self.units.encode(t) for t in texts]
        lens = torch.tensor([len(i) for i in ids])
        return torch.tensor([u for i in ids for u in i], dtype=torch.long), lens

    def loss(self, y, ylens, texts, step):
        import chainfb

        targets, tlens = self._targets(texts)
        lp = y.log_softmax(-1).transpose(0, 1)  # [T, N, C]
        loss = chainfb.ctc_loss(lp, targets, ylens.cpu(), tlens, blank=self.units.blank, reduction="sum")
        return loss, -loss.item()

    @torch.no_grad()
    def decode(self, y, ylens):
        lp = y.log_softmax(-1)
        best = lp.argmax(-1).cpu().numpy()
        greedy = []
        for n, L in enumerate(ylens.tolist()):
            seq = best[n, :L]
            keep = seq[np.r_[True, seq[1:] != seq[:-1]]]
            greedy.append(self.units.decode(keep))
        labs, _ = viterbi_batch(self.graph, self.labels, lp.double().cpu().numpy(), ylens.cpu().numpy())
        return [[self.words[j] for j in w] for w in labs], greedy

    def write(self, out_dir):
        _write_units(self.units, out_dir)
        self.graph.write(f"{out_dir}/decode.fst")


class TransducerTask:
    """The stateless transducer: ``rnnt`` (full loss), ``pruned-rnnt`` or ``tdt``."""

    def __init__(self, name, words, cfg, enc_dim):
        self.name = name
        self.units = CharUnits(words)
        V = len(self.units)
        self.vocab = V
        self.durations = TDT_DURATIONS if name == "tdt" else ()
        self.out_dim = enc_dim
        dec_dim = cfg.decoder_dim
        self.modules = nn.ModuleDict(dict(
            decoder=StatelessDecoder(V, dec_dim, blank=self.units.blank, context=2),
            joiner=Joiner(enc_dim, dec_dim, cfg.joiner_dim, V + len(self.durations)),
        ))
        if name == "pruned-rnnt":
            self.modules["simple_am"] = nn.Linear(enc_dim, V)
            self.modules["simple_lm"] = nn.Linear(dec_dim, V)
        self.s_range = 5
        self.warm_steps = cfg.warm_steps

    def fits(self, words, frames: int) -> bool:
        return frames >= 1

    def loss(self, enc, elens, texts, step):
        import chainfb
        from chainfb.transducer import prune, prune_ranges, pruned_rnnt_loss, simple_rnnt_loss

        dev = enc.device
        ids = [self.units.encode(t) for t in texts]
        U = max(len(i) for i in ids)
        targets = torch.zeros((len(ids), max(U, 1)), dtype=torch.long)
        for n, i in enumerate(ids):
            targets[n, :len(i)] = torch.tensor(i)
        tlens = torch.tensor([len(i) for i in ids])
        targets, tlens, elens = targets.to(dev), tlens.to(dev), elens.to(dev)
        dec = self.modules["decoder"](self.modules["decoder"].prefix(targets[:, :U]))  # [N, U + 1, D]
        joiner = self.modules["joiner"]
        blank = self.units.blank
        if self.name == "rnnt":
            logits = joiner.full(enc, dec)
            loss = chainfb.rnnt_loss(logits, targets[:, :U].int(), elens.int(), tlens.int(), blank=blank,
                                     reduction="sum")
            return loss, -loss.item()
        if self.name == "tdt":
            logits = joiner.full(enc, dec)
            loss = chainfb.tdt_loss(logits, targets[:, :U], elens, tlens, blank=blank, durations=list(self.durations),
                                    reduction="sum")
            return loss, -loss.item()
        simple, grads = simple_rnnt_loss(self.modules["simple_am"](enc), self.modules["simple_lm"](dec),
                                         targets[:, :U], elens, tlens, blank, reduction="sum", return_grad=True)
        boundary = torch.stack([torch.zeros_like(tlens), torch.zeros_like(tlens), tlens, elens], dim=1)
        ranges = prune_ranges(*grads, boundary, self.s_range)
        enc_p, dec_p = prune(joiner.enc_proj(enc), joiner.dec_proj(dec), ranges)
        pruned = pruned_rnnt_loss(joiner(enc_p, dec_p), targets[:, :U], ranges, elens, tlens, blank,
                                  reduction="sum")
        # icefall's warm-up: the pruned loss (whose ranges come from a still poor simple loss) starts small
        pruned_scale = 0.1 if step < self.warm_steps else 1.0
        return 0.5 * simple + pruned_scale * pruned, -pruned.item()

    @torch.no_grad()
    def decode(self, enc, elens):
        hyps = greedy_search(enc, elens.tolist(), self.modules["decoder"], self.modules["joiner"], self.vocab,
                             self.durations, max_symbols=3, units=self.units)
        return [self.units.decode(h) for h in hyps], None

    def write(self, out_dir):
        _write_units(self.units, out_dir)


def _write_units(units: CharUnits, out_dir: str) -> None:
    with open(f"{out_dir}/units.txt", "w") as f:
        for i, u in enumerate(units.units):
            f.write(f"{u} {i}\n")


def make_task(name: str, recipe_factory, words: list[str], cfg):
    """The task of criterion ``name``; ``recipe_factory()`` builds the chain graphs (only the chain task needs them)."""
    if name == "chain":
        return ChainTask(recipe_factory(), cfg)
    if name == "ctc":
        return CtcTask(words, cfg)
    if name in ("rnnt", "pruned-rnnt", "tdt"):
        return TransducerTask(name, words, cfg, cfg.encoder_dim)
    raise ValueError(f"criterion: expected one of {', '.join(CRITERIA)}, got {name!r}")
