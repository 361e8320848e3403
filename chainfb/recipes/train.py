"""End-to-end LF-MMI training of the digit recognizer: graphs, training loop, evaluation, checkpoints, plot."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from ..chain import ChainLoss, DenominatorGraph, Topology, min_frames, numerator_graph, word_loop_graph
from ..chain.graphs.normalization import add_normalization, normalization_fst
from ..chain.graphs.phone_lm import den_graph, estimate_phone_lm
from .corpus import Corpus, DIGIT_WORDS
from .decode import viterbi_batch, wer
from .files import DirLock, atomic_write
from .lexicon import SILENCE, cmudict_lexicon, phone_inventory, sample_phone_sequence, to_chain_lexicon, write_lexicon
from .model import build_model, subsampled_lengths

__all__ = ["TrainConfig", "Recipe", "train", "evaluate", "plot_history"]


@dataclass
class TrainConfig:
    """Training hyper-parameters (see ``tools/train_digits.py --help``)."""

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
    seed: int = 0
    device: str = "auto"
    max_steps: int = 0  # > 0: stop each epoch after this many batches (tests / smoke runs)
    progress: bool = True


class Recipe:
    """Everything graph-shaped for a training corpus over ``words``, built with :mod:`chainfb.chain`:
    CMUdict lexicon, phone set (``SIL`` first), Kaldi chain topology (``2 * num_phones`` pdfs), a phone LM of order
    ``phone_lm_order`` estimated on phone sequences of the training transcripts (random pronunciation, optional
    silence with ``sil_prob``), the denominator graph, numerator graphs per transcript (optionally composed with
    Kaldi's normalization FST) and the word-loop decoding graph."""

    def __init__(self, train: Corpus, words=DIGIT_WORDS, sil_prob: float = 0.5, phone_lm_order: int = 3,
                 normalize_numerators: bool = True, seed: int = 0):
        self.words = list(words)
        self.lexicon = cmudict_lexicon(self.words)
        self.chain_lexicon = to_chain_lexicon(self.lexicon)
        self.phones = phone_inventory(self.lexicon, SILENCE)
        self.phone_ids = {p: i for i, p in enumerate(self.phones)}
        self.topology = Topology.chain()
        self.num_pdfs = self.topology.num_pdfs(len(self.phones))
        self.sil_prob = sil_prob
        rng = np.random.default_rng(seed)
        seqs = [[self.phone_ids[p] for p in sample_phone_sequence(t, self.lexicon, rng, SILENCE, sil_prob)]
                for t in train.texts]
        self.phone_lm = estimate_phone_lm(seqs, order=phone_lm_order, no_prune_order=min(phone_lm_order, 3))
        self.den = DenominatorGraph(den_graph(self.phone_lm, self.topology), self.num_pdfs)
        self._norm = normalization_fst(self.den) if normalize_numerators else None
        self.decode_graph, self.decode_labels = word_loop_graph(self.words, self.chain_lexicon, self.topology,
                                                                self.phones, SILENCE, sil_prob)
        self._num_cache: Dict[tuple, object] = {}

    def numerator(self, words):
        """(numerator pdf acceptor, its minimum number of frames) of a transcript, cached per transcript."""
        key = tuple(words)
        if key not in self._num_cache:
            g = numerator_graph(list(words), self.chain_lexicon, self.topology, self.phones, SILENCE,
                                self.sil_prob)
            if self._norm is not None:
                g = add_normalization(g, self._norm)
            self._num_cache[key] = (g, min_frames(g))
        return self._num_cache[key]

    def write(self, out_dir: str) -> None:
        """Write lexicon.txt, phones.txt, den.fst and decode.fst (OpenFst text) into ``out_dir``."""
        os.makedirs(out_dir, exist_ok=True)
        write_lexicon(self.lexicon, os.path.join(out_dir, "lexicon.txt"))
        with open(os.path.join(out_dir, "phones.txt"), "w") as f:
            for i, p in enumerate(self.phones):
                f.write(f"{p} {i}\n")
        self.den.fst.write(os.path.join(out_dir, "den.fst"))
        self.decode_graph.write(os.path.join(out_dir, "decode.fst"))


def _pad(corpus: Corpus, idx) -> tuple:
    lens = corpus.num_frames()[idx]
    T = int(lens.max())
    F = corpus.feats.shape[1]
    x = np.zeros((len(idx), T, F), np.float32)
    for k, i in enumerate(idx):
        f = corpus.features(i)
        x[k, :len(f)] = f
    return torch.from_numpy(x), torch.from_numpy(lens.astype(np.int64))


def _batches(corpus: Corpus, batch_size: int, rng: Optional[np.random.Generator]) -> List[np.ndarray]:
    order = np.argsort(corpus.num_frames(), kind="stable")
    bs = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if rng is not None:
        bs = [bs[i] for i in rng.permutation(len(bs))]
    return bs


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _tqdm(it, **kw):
    try:
        from tqdm import tqdm

        return tqdm(it, **kw)
    except ImportError:
        return it


@torch.no_grad()
def evaluate(model: torch.nn.Module, recipe: Recipe, corpus: Corpus, batch_size: int = 64, device="cpu",
             progress: bool = False):
    """Decode ``corpus`` with Viterbi over the recipe's word loop. Returns (WER %, hypotheses as word lists)."""
    model.eval()
    hyps: List[Optional[List[str]]] = [None] * len(corpus)
    bs = _batches(corpus, batch_size, None)
    for idx in (_tqdm(bs, desc="decoding", leave=False) if progress else bs):
        x, lens = _pad(corpus, idx)
        y, olens = model(x.to(device), lens.to(device))
        y = y.double().cpu().numpy()
        labs, _ = viterbi_batch(recipe.decode_graph, recipe.decode_labels, y, olens.cpu().numpy())
        for k, i in enumerate(idx):
            hyps[i] = [recipe.words[j] for j in labs[k]]
    return wer(corpus.texts, hyps), hyps


def plot_history(history: List[dict], path: str) -> bool:
    """PNG of the training objective per frame and the test WER per epoch; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ep = [h["epoch"] for h in history]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    ax[0].plot(ep, [h["train_objf_per_frame"] for h in history], "o-")
    ax[0].set_xlabel("epoch")
    ax[0].set_ylabel("LF-MMI objective / frame (train)")
    ax[1].plot(ep, [h["test_wer"] for h in history], "o-", color="C3")
    ax[1].set_xlabel("epoch")
    ax[1].set_ylabel("WER % (held-out voices)")
    ax[1].set_ylim(bottom=0)
    for a in ax:
        a.xaxis.get_major_locator().set_params(integer=True)
        a.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_write(path, "wb", suffix=".png") as f:
        fig.savefig(f, dpi=100, format="png")
    plt.close(fig)
    return True


def _write_json(path: str, obj) -> None:
    with atomic_write(path) as f:
        json.dump(obj, f, indent=1)


def write_outputs(out_dir: str, history: List[dict], hyps, test_set: Corpus, results: Optional[dict]) -> None:
    """``test_hyps.txt`` and ``training.png`` (and, given ``results``, ``results.json`` and ``history.json``) of one
    checkpoint, each written atomically."""
    with atomic_write(os.path.join(out_dir, "test_hyps.txt")) as f:
        for u, r, hy in zip(test_set.utt_ids, test_set.texts, hyps):
            f.write(f"{u}\tREF: {' '.join(r)}\tHYP: {' '.join(hy)}\n")
    plot_history(history, os.path.join(out_dir, "training.png"))
    if results is not None:
        _write_json(os.path.join(out_dir, "results.json"), results)
        _write_json(os.path.join(out_dir, "history.json"), history)


def _load_checkpoint(path: str, device, log):
    """The checkpoint's state, or None: an unreadable file (a truncated or corrupted write) is reported, moved
    aside to ``<path>.corrupt`` and training starts from scratch."""
    try:
        state = torch.load(path, map_location=device, weights_only=False)
        if not isinstance(state, dict) or "model" not in state or "epoch" not in state:
            raise ValueError("not a checkpoint of this recipe")
        return state
    except Exception as e:  # noqa: BLE001 -- pickle, zip and OS errors alike mean an unusable file
        os.replace(path, path + ".corrupt")
        log(f"{path} is unreadable ({type(e).__name__}: {e}); moved to {path}.corrupt, starting from scratch")
        return None


def train(train_set: Corpus, test_set: Corpus, cfg: TrainConfig, out_dir: str, resume: bool = True,
          log=print) -> dict:
    """Train with :class:`chainfb.ChainLoss`, decoding ``test_set`` after every epoch (the decoding vocabulary is
    the training vocabulary); checkpoint to ``out_dir/checkpoint.pt`` after every epoch and resume from it when
    ``resume`` (also when only ``epochs`` changed: the run is extended, the learning-rate decay of the checkpoint
    continues). Writes ``results.json``, ``history.json``, ``test_hyps.txt``, ``training.png`` and the graphs
    (lexicon.txt, phones.txt, den.fst, decode.fst) into ``out_dir``; returns the results dict. Utterances whose
    transcript needs more frames than they have after subsampling are skipped and counted in the log.

    Every output belongs to the checkpoint it reports: the checkpoint holds the test hypotheses of its epoch,
    and the outputs are (re)written from it, atomically; a rerun after a kill rewrites them. ``out_dir`` is locked
    for the run: a second run on it raises :class:`chainfb.recipes.files.DirectoryBusy`."""
    os.makedirs(out_dir, exist_ok=True)
    with DirLock(out_dir, wait=False):
        return _train(train_set, test_set, cfg, out_dir, resume, log)


def _train(train_set, test_set, cfg, out_dir, resume, log):
    torch.manual_seed(cfg.seed)
    device = _device(cfg.device)
    vocab = sorted({w for t in train_set.texts for w in t})
    if set(vocab) <= set(DIGIT_WORDS):
        vocab = [w for w in DIGIT_WORDS if w in vocab]
    recipe = Recipe(train_set, words=vocab, sil_prob=cfg.sil_prob, phone_lm_order=cfg.phone_lm_order,
                    normalize_numerators=cfg.normalize_numerators, seed=cfg.seed)
    recipe.write(out_dir)
    model = build_model(cfg.model, train_set.feats.shape[1], recipe.num_pdfs, cfg.hidden, cfg.num_layers,
                        cfg.dropout).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    steps_per_epoch = math.ceil(len(train_set) / cfg.batch_size)
    if cfg.max_steps > 0:
        steps_per_epoch = min(steps_per_epoch, cfg.max_steps)
    total = max(1, cfg.epochs * steps_per_epoch)
    gamma = (cfg.final_lr / cfg.lr) ** (1.0 / total)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma)
    loss_fn = ChainLoss(recipe.den, leaky_hmm_coefficient=cfg.leaky_hmm_coefficient,
                        l2_regularize=cfg.l2_regularize, out_of_range_regularize=cfg.out_of_range_regularize,
                        reduction="sum")
    ckpt = os.path.join(out_dir, "checkpoint.pt")
    history: List[dict] = []
    hyps = None
    start_epoch = 0
    elapsed_before = 0.0
    state = _load_checkpoint(ckpt, device, log) if resume and os.path.exists(ckpt) else None
    if state is not None:
        if state.get("config") == dataclasses.asdict(cfg) or state.get("config_model") == _model_key(cfg):
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            history = state["history"]
            hyps = state.get("hyps")
            start_epoch = state["epoch"]
            elapsed_before = state.get("elapsed", 0.0)
            log(f"resumed from {ckpt} after epoch {start_epoch}")
        else:
            log(f"{ckpt} was written with a different model configuration; starting from scratch")
    log(f"device {device}; {len(train_set)} train / {len(test_set)} test utterances; {len(recipe.phones)} phones, "
        f"{recipe.num_pdfs} pdfs; phone LM order {cfg.phone_lm_order}, den graph {recipe.den.num_states} states / "
        f"{recipe.den.num_arcs} arcs; {sum(p.numel() for p in model.parameters())} parameters")
    t0 = time.time()
    rng = np.random.default_rng(cfg.seed + 1)
    for _ in range(start_epoch):  # keep the batch order of a resumed run identical to an uninterrupted one
        rng.permutation(len(_batches(train_set, cfg.batch_size, None)))
    for epoch in range(start_epoch, cfg.epochs):
        model.train()
        bs = _batches(train_set, cfg.batch_size, rng)[:steps_per_epoch]
        tot_obj, tot_frames, skipped = 0.0, 0, 0
        bar = _tqdm(bs, desc=f"epoch {epoch + 1}/{cfg.epochs}", leave=False) if cfg.progress else bs
        for idx in bar:
            x, lens = _pad(train_set, idx)
            olens = subsampled_lengths(lens)
            keep, nums = [], []
            for k, i in enumerate(idx):
                g, mf = recipe.numerator(train_set.texts[i])
                if mf <= int(olens[k]):
                    keep.append(k)
                    nums.append(g)
            skipped += len(idx) - len(keep)
            if not keep:
                continue
            keep_t = torch.tensor(keep)
            x, lens = x[keep_t].to(device), lens[keep_t].to(device)
            y, ylens = model(x, lens)
            loss = loss_fn(y.double(), nums, ylens.cpu())
            obj = loss_fn.info["num"] - loss_fn.info["den"]  # chain objective without regularizers
            frames = int(ylens.sum())
            opt.zero_grad()
            (loss / frames).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            sched.step()
            tot_obj += obj
            tot_frames += frames
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(objf=f"{tot_obj / max(tot_frames, 1):.4f}")
        test_wer, hyps = evaluate(model, recipe, test_set, device=device, progress=cfg.progress)
        h = dict(epoch=epoch + 1, train_objf_per_frame=tot_obj / max(tot_frames, 1), test_wer=test_wer,
                 skipped_too_short=skipped, lr=sched.get_last_lr()[0],
                 elapsed_s=elapsed_before + time.time() - t0)
        history.append(h)
        log(f"epoch {epoch + 1}: train objf/frame {h['train_objf_per_frame']:.4f}  test WER {test_wer:.2f}%  "
            f"({h['elapsed_s']:.0f} s)" + (f"; skipped {skipped} utterance(s) whose transcript needs more frames "
                                           f"than they have" if skipped else ""))
        with atomic_write(ckpt, "wb") as f:
            torch.save(dict(model=model.state_dict(), optimizer=opt.state_dict(), scheduler=sched.state_dict(),
                            history=history, hyps=hyps, epoch=epoch + 1, config=dataclasses.asdict(cfg),
                            config_model=_model_key(cfg), elapsed=h["elapsed_s"]), f)
        write_outputs(out_dir, history, hyps, test_set, None)
    if history and (hyps is None or len(hyps) != len(test_set)):
        # a checkpoint without its hypotheses (or for another test set): decode again
        test_wer, hyps = evaluate(model, recipe, test_set, device=device, progress=cfg.progress)
        history[-1] = dict(history[-1], test_wer=test_wer)
    final_wer = history[-1]["test_wer"] if history else float("nan")
    results = dict(test_wer=final_wer, epochs=len(history), train_utts=len(train_set), test_utts=len(test_set),
                   test_words=int(sum(len(t) for t in test_set.texts)),
                   device=str(device), train_seconds=history[-1]["elapsed_s"] if history else 0.0,
                   config=dataclasses.asdict(cfg), history=history)
    if history:
        write_outputs(out_dir, history, hyps, test_set, results)
    return results


def _model_key(cfg: TrainConfig) -> dict:
    return dict(model=cfg.model, hidden=cfg.hidden, num_layers=cfg.num_layers, lr=cfg.lr, batch_size=cfg.batch_size,
                seed=cfg.seed)
