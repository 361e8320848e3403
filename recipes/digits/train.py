"""Training of the digit recognizer with one of the recipe's criteria (chain/LF-MMI, CTC, RNN-T, pruned RNN-T,
TDT): graphs, training loop (one process, or one shard of the batches per process under torchrun), evaluation,
checkpoints, results and plot."""
from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import time

import numpy as np
import torch
from torch import nn

from chainfb.chain import (BiphoneSet, DenominatorGraph, Topology, add_normalization, den_graph, estimate_phone_lm,
                           min_frames, normalization_fst, numerator_graph, word_loop_graph)
from .config import TrainConfig, objective_label
from .corpus import Corpus, DIGIT_WORDS
from .decode import wer
from .files import DirLock, atomic_write, save_figure
from .lexicon import SILENCE, cmudict_lexicon, phone_inventory, sample_phone_sequence, to_chain_lexicon, write_lexicon
from .model import build_model, subsampled_lengths
from .signals import held as held_signals
from .tasks import make_task

__all__ = ["TrainConfig", "Recipe", "train", "evaluate", "plot_history", "shard_batches", "run_criterion",
           "OtherCriterionRun", "OtherModelRun", "model_differences", "vocabulary", "make_recipe"]


class Recipe:
    """Everything graph-shaped for a training corpus over ``words``, built with :mod:`chainfb.chain`:
    CMUdict lexicon, phone set (``SIL`` first), Kaldi chain topology, a phone LM of order ``phone_lm_order``
    estimated on phone sequences of the training transcripts (random pronunciation, optional silence with
    ``sil_prob``), the denominator graph, numerator graphs per transcript (optionally composed with Kaldi's
    normalization FST) and the word-loop decoding graph.

    ``context="mono"``: one HMM per phone (``2 * num_phones`` pdfs).  ``context="biphone"``: left biphones as in
    Kaldi's e2e recipes (:class:`chainfb.chain.BiphoneSet`): counted over the training transcripts (every
    pronunciation, no silence), a biphone seen fewer than ``min_biphone_count`` times shares its phone's monophone
    pdfs (a phone seen at most ``min_monophone_count`` times: the shared zerophone pdfs); ``2 * num_units`` pdfs."""

    def __init__(self, train: Corpus, words=DIGIT_WORDS, sil_prob: float = 0.5, phone_lm_order: int = 3,
                 normalize_numerators: bool = True, seed: int = 0, context: str = "mono",
                 min_biphone_count: int = 100, min_monophone_count: int = 20):
        if context not in ("mono", "biphone"):
            raise ValueError(f"context: expected 'mono' or 'biphone', got {context!r}")
        self.words = list(words)
        self.lexicon = cmudict_lexicon(self.words)
        self.chain_lexicon = to_chain_lexicon(self.lexicon)
        self.phones = phone_inventory(self.lexicon, SILENCE)
        self.phone_ids = {p: i for i, p in enumerate(self.phones)}
        self.topology = Topology.chain()
        self.context = None
        if context == "biphone":
            self.context = BiphoneSet.from_transcripts(train.texts, self.chain_lexicon, self.phones,
                                                       min_biphone_count, min_monophone_count)
            self.num_pdfs = self.context.num_pdfs(self.topology)
        else:
            self.num_pdfs = self.topology.num_pdfs(len(self.phones))
        self.sil_prob = sil_prob
        rng = np.random.default_rng(seed)
        seqs = [[self.phone_ids[p] for p in sample_phone_sequence(t, self.lexicon, rng, SILENCE, sil_prob)]
                for t in train.texts]
        self.phone_lm = estimate_phone_lm(seqs, order=phone_lm_order, no_prune_order=min(phone_lm_order, 3))
        self.den = DenominatorGraph(den_graph(self.phone_lm, self.topology, context=self.context), self.num_pdfs)
        self._norm = normalization_fst(self.den) if normalize_numerators else None
        self.decode_graph, self.decode_labels = word_loop_graph(self.words, self.chain_lexicon, self.topology,
                                                                self.phones, SILENCE, sil_prob, context=self.context)
        self._num_cache: dict[tuple, object] = {}

    def numerator(self, words):
        """(numerator pdf acceptor, its minimum number of frames) of a transcript, cached per transcript."""
        key = tuple(words)
        if key not in self._num_cache:
            g = numerator_graph(list(words), self.chain_lexicon, self.topology, self.phones, SILENCE,
                                self.sil_prob, context=self.context)
            if self._norm is not None:
                g = add_normalization(g, self._norm)
            self._num_cache[key] = (g, min_frames(g))
        return self._num_cache[key]

    def describe(self) -> str:
        """One line: phones, context units and pdfs, and the denominator and decoding graph sizes."""
        units = f"{self.context}; " if self.context is not None else "monophone; "
        return (f"{len(self.phones)} phones, {units}{self.num_pdfs} pdfs; den graph {self.den.num_states} states / "
                f"{self.den.num_arcs} arcs; decoding graph {self.decode_graph.num_states} states / "
                f"{self.decode_graph.num_arcs} arcs")

    def graph_sizes(self, texts) -> dict:
        """Sizes of the graphs: pdfs, context units, den / decoding graph states and arcs, and the mean numerator
        graph states and arcs over ``texts`` (normalization FST composed in when the recipe composes it)."""
        nums = [self.numerator(t)[0] for t in texts]
        return dict(context="mono" if self.context is None else "biphone", num_pdfs=self.num_pdfs,
                    num_units=len(self.phones) if self.context is None else self.context.num_units,
                    den_states=self.den.num_states, den_arcs=self.den.num_arcs,
                    decode_states=self.decode_graph.num_states, decode_arcs=self.decode_graph.num_arcs,
                    num_states_mean=float(np.mean([g.num_states for g in nums])) if nums else 0.0,
                    num_arcs_mean=float(np.mean([g.num_arcs for g in nums])) if nums else 0.0)

    def write(self, out_dir: str) -> None:
        """Write lexicon.txt, phones.txt, den.fst and decode.fst (OpenFst text) into ``out_dir``; with biphones also
        units.txt (``left-context phone unit`` per line, ``<s>`` for the utterance start)."""
        os.makedirs(out_dir, exist_ok=True)
        if self.context is not None:
            with open(os.path.join(out_dir, "units.txt"), "w") as f:
                for q in range(-1, len(self.phones)):
                    for p in range(len(self.phones)):
                        left = "<s>" if q < 0 else self.phones[q]
                        f.write(f"{left} {self.phones[p]} {self.context.unit_of(q, p)}\n")
        write_lexicon(self.lexicon, os.path.join(out_dir, "lexicon.txt"))
        with open(os.path.join(out_dir, "phones.txt"), "w") as f:
            for i, p in enumerate(self.phones):
                f.write(f"{p} {i}\n")
        self.den.fst.write(os.path.join(out_dir, "den.fst"))
        self.decode_graph.write(os.path.join(out_dir, "decode.fst"))


def vocabulary(train_set: Corpus) -> list[str]:
    """The words of the training transcripts (the decoding vocabulary): the digits in their usual order, other
    vocabularies sorted."""
    vocab = sorted({w for t in train_set.texts for w in t})
    if set(vocab) <= set(DIGIT_WORDS):
        vocab = [w for w in DIGIT_WORDS if w in vocab]
    return vocab


def make_recipe(train_set: Corpus, vocab: list[str], cfg: TrainConfig) -> Recipe:
    """The chain :class:`Recipe` of ``cfg`` (phone LM, numerator normalization, context units) over ``vocab``."""
    return Recipe(train_set, words=vocab, sil_prob=cfg.sil_prob, phone_lm_order=cfg.phone_lm_order,
                  normalize_numerators=cfg.normalize_numerators, seed=cfg.seed, context=cfg.context,
                  min_biphone_count=cfg.min_biphone_count, min_monophone_count=cfg.min_monophone_count)


def _pad(corpus: Corpus, idx) -> tuple:
    lens = corpus.num_frames()[idx]
    T = int(lens.max())
    F = corpus.feats.shape[1]
    x = np.zeros((len(idx), T, F), np.float32)
    for k, i in enumerate(idx):
        f = corpus.features(i)
        x[k, :len(f)] = f
    return torch.from_numpy(x), torch.from_numpy(lens.astype(np.int64))


def _batches(corpus: Corpus, batch_size: int, rng: np.random.Generator | None) -> list[np.ndarray]:
    order = np.argsort(corpus.num_frames(), kind="stable")
    bs = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if rng is not None:
        bs = [bs[i] for i in rng.permutation(len(bs))]
    return bs


def shard_batches(batches: list, rank: int, world: int) -> list:
    """Rank ``rank``'s share of ``batches`` when ``world`` processes train together: every rank gets the same
    number of batches, ``ceil(len(batches) / world)`` (so that no rank waits for a gradient exchange the others
    never start); the list is padded by repeating batches from its start, as torch's ``DistributedSampler`` pads
    its indices.  ``world == 1`` returns ``batches`` unchanged."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank/world: expected 0 <= rank < world, got {rank}, {world}")
    if world == 1 or not batches:
        return list(batches)
    total = -(-len(batches) // world) * world
    padded = [batches[i % len(batches)] for i in range(total)]
    return padded[rank::world]


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
def evaluate(model: torch.nn.Module, task, corpus: Corpus, batch_size: int = 64, device="cpu",
             progress: bool = False):
    """Decode ``corpus`` with the task's decoder (chain: Viterbi over the word loop; CTC: Viterbi over a
    CTC word loop, and greedy; transducers: greedy search). Returns ``(WER %, hypotheses as word lists,
    greedy WER % or None)``."""
    model.eval()
    hyps: list[list[str] | None] = [None] * len(corpus)
    greedy: list[list[str] | None] = [None] * len(corpus)
    bs = _batches(corpus, batch_size, None)
    for idx in (_tqdm(bs, desc="decoding", leave=False) if progress else bs):
        x, lens = _pad(corpus, idx)
        y, olens = model(x.to(device), lens.to(device))
        words, greedy_words = task.decode(y, olens)
        for k, i in enumerate(idx):
            hyps[i] = words[k]
            if greedy_words is not None:
                greedy[i] = greedy_words[k]
    greedy_wer = wer(corpus.texts, greedy) if len(corpus) and greedy[0] is not None else None
    return wer(corpus.texts, hyps), hyps, greedy_wer


def plot_history(history: list[dict], path: str, criterion: str = "chain") -> bool:
    """PNG of the training objective per frame (labelled for ``criterion``) and the test WER per epoch; False if
    matplotlib is missing."""
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
    ax[0].set_ylabel(f"{objective_label(criterion)} / frame (train)")
    ax[1].plot(ep, [h["test_wer"] for h in history], "o-", color="C3")
    ax[1].set_xlabel("epoch")
    ax[1].set_ylabel("WER % (held-out voices)")
    ax[1].set_ylim(bottom=0)
    for a in ax:
        a.xaxis.get_major_locator().set_params(integer=True)
        a.grid(alpha=0.3)
    save_figure(fig, path)
    return True


def _write_json(path: str, obj) -> None:
    with atomic_write(path) as f:
        json.dump(obj, f, indent=1)


def write_outputs(out_dir: str, history: list[dict], hyps, test_set: Corpus, results: dict) -> None:
    """``test_hyps.txt``, ``training.png``, ``results.json`` and ``history.json`` of one checkpoint, each written
    atomically."""
    with atomic_write(os.path.join(out_dir, "test_hyps.txt")) as f:
        for u, r, hy in zip(test_set.utt_ids, test_set.texts, hyps):
            f.write(f"{u}\tREF: {' '.join(r)}\tHYP: {' '.join(hy)}\n")
    plot_history(history, os.path.join(out_dir, "training.png"), results["criterion"])
    _write_json(os.path.join(out_dir, "results.json"), results)
    _write_json(os.path.join(out_dir, "history.json"), history)


class OtherCriterionRun(ValueError):
    """The output directory holds a run of another criterion."""


def run_criterion(out_dir: str) -> str | None:
    """The criterion of the run in ``out_dir`` (from its ``results.json``, else its ``checkpoint.pt``), or None
    when it holds none (or only unreadable files)."""
    path = os.path.join(out_dir, "results.json")
    if os.path.exists(path):
        try:
            with open(path) as f:
                c = json.load(f).get("criterion")
            if isinstance(c, str):
                return c
        except (OSError, ValueError, AttributeError):
            pass
    path = os.path.join(out_dir, "checkpoint.pt")
    if os.path.exists(path):
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
            return (state.get("config") or {}).get("criterion", "chain")
        except Exception:  # noqa: BLE001 -- an unreadable checkpoint is reported (and moved aside) by train()
            return None
    return None


def check_criterion(out_dir: str, criterion: str) -> None:
    """Raise :class:`OtherCriterionRun` when ``out_dir`` holds a run of a criterion other than ``criterion``."""
    other = run_criterion(out_dir)
    if other is not None and other != criterion:
        raise OtherCriterionRun(f"{out_dir} holds a run of criterion {other!r}, not {criterion!r}; choose another "
                                f"directory (or remove it)")


class OtherModelRun(ValueError):
    """The output directory holds a checkpoint of another model configuration."""


def model_differences(out_dir: str, cfg: TrainConfig) -> list[str]:
    """The settings that a resumed run must share with its checkpoint (model, sizes, learning rate, batch size,
    seed, criterion, context units) and that differ between the checkpoint in ``out_dir`` and ``cfg``, as
    ``"name <checkpoint's> -> <cfg's>"``; empty when ``out_dir`` holds no readable checkpoint or one of the same
    configuration."""
    path = os.path.join(out_dir, "checkpoint.pt")
    if not os.path.exists(path):
        return []
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        there = state.get("config_model")
        if there is None:
            fields = TrainConfig.__dataclass_fields__
            there = _model_key(TrainConfig(**{k: v for k, v in state["config"].items() if k in fields}))
    except Exception:  # noqa: BLE001 -- an unreadable checkpoint is reported (and moved aside) by train()
        return []
    here = _model_key(cfg)
    there, here = {"context": "mono", **there}, {"context": "mono", **here}  # monophone keys name no context
    if "mono" in (there["context"], here["context"]):  # the tying counts of biphones only
        for k in ("min_biphone_count", "min_monophone_count"):
            there.pop(k, None)
            here.pop(k, None)
    return [f"{k} {there.get(k)!r} -> {here.get(k)!r}" for k in sorted(set(there) | set(here))
            if there.get(k) != here.get(k)]


def check_model(out_dir: str, cfg: TrainConfig) -> None:
    """Raise :class:`OtherModelRun` when ``out_dir`` holds a checkpoint that ``cfg`` cannot resume
    (:func:`model_differences`)."""
    diff = model_differences(out_dir, cfg)
    if diff:
        raise OtherModelRun(f"{out_dir} holds a run of another model configuration ({', '.join(diff)}); choose "
                            f"another directory (or remove it, or start it over without resuming)")


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
    """Train with ``cfg.criterion`` (:mod:`.tasks`: chain, ctc, rnnt, pruned-rnnt, tdt), decoding ``test_set`` after
    every epoch (the decoding vocabulary is the training vocabulary); checkpoint to ``out_dir/checkpoint.pt`` after
    every epoch and resume from it when ``resume`` (also when only ``epochs`` changed: the run is extended, the
    learning-rate decay of the checkpoint continues). Writes ``results.json``, ``history.json``, ``test_hyps.txt``,
    ``training.png`` and the graphs (lexicon.txt, phones.txt, den.fst, decode.fst) into ``out_dir``; returns the results
    dict. Utterances whose transcript needs more frames than they have after subsampling are skipped and counted in the
    log.

    Every output belongs to the checkpoint it reports: the checkpoint holds the test hypotheses of its epoch,
    and the outputs are (re)written from it, atomically, after every epoch; a rerun after a kill rewrites them.
    The checkpoint also records where the corpus came from (``corpus``: ``train_set.origin``, the corpus
    configuration and cache directory of :func:`digits.corpus.load_or_create`), for tools that rebuild it.
    ``out_dir`` is locked for the run: a second run on it raises :class:`digits.files.DirectoryBusy`; a directory
    holding another criterion's run raises :class:`OtherCriterionRun`, and one holding a checkpoint of another
    model configuration :class:`OtherModelRun` unless ``resume`` is False (which starts it over).  The checkpoint
    and the outputs of an epoch are written with SIGINT and SIGTERM held (:func:`digits.signals.held`): a signal
    while they are written takes effect once they are complete.

    Under torchrun every process trains on its shard of each epoch's batches (:func:`shard_batches`: equal
    counts); only rank 0 evaluates and writes."""
    os.makedirs(out_dir, exist_ok=True)
    if int(os.environ.get("RANK", "0")) > 0:  # under torchrun only rank 0 writes (and holds the lock)
        return _train(train_set, test_set, cfg, out_dir, resume, log)
    with DirLock(out_dir, wait=False):
        check_criterion(out_dir, cfg.criterion)
        if resume:
            check_model(out_dir, cfg)
        return _train(train_set, test_set, cfg, out_dir, resume, log)


class _Net(nn.Module):
    """The encoder and the criterion's extra modules (decoder, joiner, simple
    heads) as one module, so one optimizer, one checkpoint and one DDP
    wrapper cover everything; ``forward`` runs the encoder."""

    def __init__(self, encoder: nn.Module, heads: nn.ModuleDict):
        super().__init__()
        self.encoder = encoder
        self.heads = heads

    def forward(self, feats, lengths):
        return self.encoder(feats, lengths)


def _distributed():
    """``(rank, world_size, started)`` under ``torchrun`` (the process group started here when ``started``), else
    ``(0, 1, False)``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, False
    import torch.distributed as dist

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size(), started


def _leave(started: bool) -> None:
    """Every process waits here for the others (rank 0 decodes and writes the results last); then the process
    group this process started is destroyed (the caller has let its DistributedDataParallel go), so that no
    process exits with the group's threads still running (a process that does may abort at exit: "terminate
    called without an active exception")."""
    import torch.distributed as dist

    dist.barrier()
    if started:
        dist.destroy_process_group()


def _train(train_set, test_set, cfg, out_dir, resume, log):
    rank, world, started = _distributed()
    if rank:
        log = _silent
    torch.manual_seed(cfg.seed)
    device = _device(cfg.device)
    if world > 1 and device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    vocab = vocabulary(train_set)
    task = make_task(cfg.criterion, lambda: make_recipe(train_set, vocab, cfg), vocab, cfg)

    def graph_sizes():  # after the epochs, when the numerator graphs are built (and cached) already
        return task.recipe.graph_sizes(train_set.texts) if cfg.criterion == "chain" else None

    if rank == 0:
        task.write(out_dir)
    encoder = build_model(cfg.model, train_set.feats.shape[1], task.out_dim, cfg.hidden, cfg.num_layers, cfg.dropout)
    net = _Net(encoder, task.modules).to(device)
    task.modules = net.heads
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    batches_per_epoch = math.ceil(len(train_set) / cfg.batch_size)
    if cfg.max_steps > 0:
        batches_per_epoch = min(batches_per_epoch, cfg.max_steps)
    steps_per_epoch = math.ceil(batches_per_epoch / world)  # optimizer steps of each process
    total = max(1, cfg.epochs * steps_per_epoch)
    gamma = (cfg.final_lr / cfg.lr) ** (1.0 / total)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma)
    ckpt = os.path.join(out_dir, "checkpoint.pt")
    history: list[dict] = []
    hyps = None
    start_epoch = 0
    elapsed_before = cpu_before = 0.0
    state = _load_checkpoint(ckpt, device, log) if resume and os.path.exists(ckpt) else None
    if state is not None:
        if state.get("config") == dataclasses.asdict(cfg) or state.get("config_model") == _model_key(cfg):
            encoder.load_state_dict(state["model"])
            net.heads.load_state_dict(state.get("heads", {}))
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            history = state["history"]
            hyps = state.get("hyps")
            start_epoch = state["epoch"]
            elapsed_before = state.get("elapsed", 0.0)
            cpu_before = state.get("cpu", 0.0)
            log(f"resumed from {ckpt} after epoch {start_epoch}")
        else:
            log(f"{ckpt} was written with a different model configuration; starting from scratch")
    what = (f"phone LM order {cfg.phone_lm_order}; {task.recipe.describe()}"
            if cfg.criterion == "chain" else f"{len(task.units)} character units")
    log(f"criterion {cfg.criterion}; device {device}" + (f" x {world} processes" if world > 1 else "") +
        f"; {len(train_set)} train / {len(test_set)} test utterances; {what}; "
        f"{sum(p.numel() for p in net.parameters())} parameters")
    model = net
    if world > 1:
        model = nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    t0, c0 = time.time(), time.process_time()
    rng = np.random.default_rng(cfg.seed + 1)
    for _ in range(start_epoch):  # keep the batch order of a resumed run identical to an uninterrupted one
        rng.permutation(len(_batches(train_set, cfg.batch_size, None)))
    step = start_epoch * steps_per_epoch
    for epoch in range(start_epoch, cfg.epochs):
        net.train()
        bs = shard_batches(_batches(train_set, cfg.batch_size, rng)[:batches_per_epoch], rank, world)
        tot_obj, tot_frames, skipped = 0.0, 0, 0
        bar = _tqdm(bs, desc=f"epoch {epoch + 1}/{cfg.epochs}", leave=False) if cfg.progress and not rank else bs
        for idx in bar:
            x, lens = _pad(train_set, idx)
            olens = subsampled_lengths(lens)
            keep = [k for k, i in enumerate(idx) if task.fits(train_set.texts[i], int(olens[k]))]
            skipped += len(idx) - len(keep)
            if not keep and world == 1:
                continue
            if keep:
                keep_t = torch.tensor(keep)
                x, lens = x[keep_t].to(device), lens[keep_t].to(device)
                y, ylens = model(x, lens)
                loss, obj = task.loss(y, ylens, [train_set.texts[idx[k]] for k in keep], step)
                frames = int(ylens.sum())
            else:  # no utterance of this batch fits, but the other processes wait for this one's gradients
                y, _ = model(x.to(device), lens.to(device))
                loss = 0.0 * (y.sum() + sum(p.sum() for p in net.heads.parameters()))
                obj, frames = 0.0, 0
            opt.zero_grad()
            (loss / max(frames, 1)).backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
            opt.step()
            sched.step()
            step += 1
            tot_obj += obj
            tot_frames += frames
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(objf=f"{tot_obj / max(tot_frames, 1):.4f}")
        if world > 1:
            tot_obj, tot_frames, skipped = _all_sum([tot_obj, tot_frames, skipped])
        if rank == 0:
            test_wer, hyps, greedy_wer = evaluate(net, task, test_set, device=device, progress=cfg.progress)
            h = dict(epoch=epoch + 1, train_objf_per_frame=tot_obj / max(tot_frames, 1), test_wer=test_wer,
                     skipped_too_short=int(skipped), lr=sched.get_last_lr()[0],
                     elapsed_s=elapsed_before + time.time() - t0, cpu_s=cpu_before + time.process_time() - c0)
            if greedy_wer is not None:
                h["test_wer_greedy"] = greedy_wer
            history.append(h)
            log(f"epoch {epoch + 1}: train objf/frame {h['train_objf_per_frame']:.4f}  test WER {test_wer:.2f}%"
                + (f" (greedy {greedy_wer:.2f}%)" if greedy_wer is not None else "")
                + f"  (wall {h['elapsed_s']:.0f} s, CPU {h['cpu_s']:.0f} s)"
                + (f"; skipped {skipped} utterance(s) whose transcript needs more frames than they have"
                   if skipped else ""))
            with held_signals():  # Ctrl-C / SIGTERM while the epoch is saved: saved first, then stopped
                with atomic_write(ckpt, "wb") as f:
                    torch.save(dict(model=encoder.state_dict(), heads=net.heads.state_dict(),
                                    optimizer=opt.state_dict(), scheduler=sched.state_dict(), history=history,
                                    hyps=hyps, epoch=epoch + 1, config=dataclasses.asdict(cfg),
                                    config_model=_model_key(cfg), elapsed=h["elapsed_s"], cpu=h["cpu_s"],
                                    corpus=train_set.origin), f)
                write_outputs(out_dir, history, hyps, test_set, _results(cfg, history, train_set, test_set, device,
                                                                         world, graph_sizes()))
        if world > 1:
            import torch.distributed as dist

            dist.barrier()
    results = None
    if rank == 0:
        if history and (hyps is None or len(hyps) != len(test_set)):
            # a checkpoint without its hypotheses (or for another test set): decode again
            test_wer, hyps, _ = evaluate(net, task, test_set, device=device, progress=cfg.progress)
            history[-1] = dict(history[-1], test_wer=test_wer)
        results = _results(cfg, history, train_set, test_set, device, world, graph_sizes())
        if history:
            write_outputs(out_dir, history, hyps, test_set, results)
    if world > 1:
        del model  # DistributedDataParallel holds the process group: let it go before the group is destroyed
        gc.collect()
        _leave(started)
    return results


def _results(cfg, history, train_set, test_set, device, world, graphs=None) -> dict:
    """``results.json`` of the epochs in ``history``: final test WER, wall and CPU seconds (this process's CPU
    time, all its threads: rank 0's under torchrun), peak resident memory, the configuration and the history;
    chain: the graph sizes (``graphs``, :meth:`Recipe.graph_sizes`)."""
    import resource

    last = history[-1] if history else {}
    return dict(criterion=cfg.criterion, test_wer=last.get("test_wer", float("nan")), epochs=len(history),
                train_utts=len(train_set), test_utts=len(test_set), test_words=int(sum(len(t) for t in test_set.texts)),
                device=str(device), processes=world, train_seconds=last.get("elapsed_s", 0.0),
                train_cpu_seconds=last.get("cpu_s", 0.0),
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                config=dataclasses.asdict(cfg), history=history, **({"graphs": graphs} if graphs else {}))


def _silent(*_args, **_kw):
    return None


def _all_sum(values):
    import torch.distributed as dist

    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def _model_key(cfg: TrainConfig) -> dict:
    key = dict(model=cfg.model, hidden=cfg.hidden, num_layers=cfg.num_layers, lr=cfg.lr, batch_size=cfg.batch_size,
               seed=cfg.seed, criterion=cfg.criterion, encoder_dim=cfg.encoder_dim, decoder_dim=cfg.decoder_dim,
               joiner_dim=cfg.joiner_dim)
    if cfg.context != "mono":  # the output layer depends on the context units (monophone keys stay as they were)
        key.update(context=cfg.context, min_biphone_count=cfg.min_biphone_count,
                   min_monophone_count=cfg.min_monophone_count)
    return key
