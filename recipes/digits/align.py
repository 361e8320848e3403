"""Align the digit recipe's test set with a trained model and write word timings as CTM.

Reads the model that the recipe's training (python -m recipes.digits) saved in --exp (checkpoint.pt; any
criterion: chain, ctc, rnnt, pruned-rnnt, tdt; default: what the training writes by default, exp/digits/chain, else
the one criterion's run under exp/digits), rebuilds the same corpus (the checkpoint records the corpus options and cache
directory it was trained with; options given here override them), runs the model on the test utterances and
force-aligns each to its reference transcript with chainfb's aligners (the engine's Viterbi over the criterion's own
graph):

- chain: the pdf alignment through the numerator graph -> phone segments (chain topology; with --context biphone,
  the phones of the biphone units, a unit that several rare phones share resolved from the transcript) -> word
  segments (an exact search over the pronunciations and optional silences);
- ctc: chainfb.forced_align -> token spans (merge_tokens) -> words (units between '|');
- rnnt / tdt: the label frames of chainfb.rnnt_align / tdt_align -> words from their first letter's frame to
  their last letter's frame (+ its TDT duration);
- pruned-rnnt: the pruned pipeline (simple loss, prune ranges, joiner on the band) -> pruned_rnnt_align.

Output frames are converted to seconds with the feature frame shift and the model's subsampling:
frame k starts at k * subsampling * frame_shift. CTM lines: "utt channel start duration word".
"""
import argparse
import dataclasses
import os


def recipe_modules():
    """The digit recipe's modules (corpus, tasks, train, model, lexicon, units): those of this package."""
    import importlib

    return argparse.Namespace(**{m: importlib.import_module(f".{m}", __package__)
                                 for m in ("corpus", "tasks", "train", "model", "lexicon", "units")})


def frame_seconds(frame, frame_shift=0.01, subsampling=3):
    """Start time in seconds of output frame ``frame`` (input frames ``frame * subsampling`` onwards)."""
    return frame * subsampling * frame_shift


def ctm_lines(utt, words, frame_shift=0.01, subsampling=3, channel="1", digits=2):
    """CTM lines ``utt channel start duration word`` of ``words``: ``(word, start_frame, end_frame)`` with output
    frames ``[start, end)``."""
    out = []
    for w, s, e in words:
        start = frame_seconds(s, frame_shift, subsampling)
        dur = frame_seconds(e - s, frame_shift, subsampling)
        out.append(f"{utt} {channel} {start:.{digits}f} {dur:.{digits}f} {w}")
    return out


def char_words(tokens, spans, sep, units):
    """Words of a character-unit sequence: ``tokens`` (unit ids, no blanks), ``spans`` (``(start, end)`` frames of
    each token); words are the runs between ``sep`` tokens, spanning their first token's start to their last
    token's end. Returns ``[(word, start, end)]``."""
    out, cur = [], []
    for tok, (s, e) in list(zip(tokens, spans)) + [(sep, (0, 0))]:
        if tok == sep:
            if cur:
                out.append(("".join(units[t] for t, _, _ in cur), cur[0][1], cur[-1][2]))
            cur = []
        else:
            cur.append((tok, s, e))
    return out


def _pad(corpus, idx):
    import numpy as np
    import torch

    lens = np.array([len(corpus.features(i)) for i in idx], dtype=np.int64)
    x = np.zeros((len(idx), int(lens.max()), corpus.feats.shape[1]), np.float32)
    for k, i in enumerate(idx):
        x[k, :lens[k]] = corpus.features(i)
    return torch.from_numpy(x), torch.from_numpy(lens)


def _targets(units, texts, device):
    import torch

    ids = [units.encode(t) for t in texts]
    tg = torch.zeros((len(ids), max(1, max(len(i) for i in ids))), dtype=torch.int64)
    for n, i in enumerate(ids):
        tg[n, :len(i)] = torch.tensor(i, dtype=torch.int64)
    return ids, tg.to(device), torch.tensor([len(i) for i in ids], device=device)


def align_batch(task, criterion, y, ylens, texts, SIL="SIL"):
    """Word segments ``[(word, start, end)]`` in output frames for each utterance (None: no alignment)."""
    import torch

    import chainfb
    from chainfb.alignment import (align_pdfs, ctc_min_frames, merge_tokens, phone_segments, pruned_rnnt_align,
                                   rnnt_align, tdt_align, word_segments)

    N = len(texts)
    if criterion == "chain":
        r = task.recipe
        al = align_pdfs([r.numerator(t)[0] for t in texts], y.double(), ylens.cpu())
        out = []
        for a, t in zip(al, texts):
            if a.score == -float("inf"):
                out.append(None)
                continue
            segs = word_segments(phone_segments(a.pdfs, r.topology, r.phones, r.context), t, r.chain_lexicon, SIL)
            out.append([(s.label, s.start, s.end) for s in segs])
        return out
    units = task.units
    ids, tg, tl = _targets(units, texts, y.device)
    if criterion == "ctc":
        lp = y.log_softmax(-1)
        ok = [n for n in range(N) if ctc_min_frames(ids[n]) <= int(ylens[n])]
        out = [None] * N
        if ok:
            sel = torch.tensor(ok, device=y.device)
            al, sc = chainfb.forced_align(lp[sel], tg[sel], ylens[sel], tl[sel], blank=units.blank)
            for k, n in enumerate(ok):
                spans = merge_tokens(al[k, :int(ylens[n])], sc[k, :int(ylens[n])], blank=units.blank)
                out[n] = char_words([s.token for s in spans], [(s.start, s.end) for s in spans], units.sep,
                                    units.units)
        return out
    dec_mod, joiner = task.modules["decoder"], task.modules["joiner"]
    U = int(tl.max())
    dec = dec_mod(dec_mod.prefix(tg[:, :U]))
    blank = units.blank
    if criterion == "pruned-rnnt":
        from chainfb.transducer import prune, prune_ranges, simple_rnnt_loss

        _, grads = simple_rnnt_loss(task.modules["simple_am"](y), task.modules["simple_lm"](dec), tg[:, :U], ylens,
                                    tl, blank, reduction="none", return_grad=True)
        bd = torch.stack([torch.zeros_like(tl), torch.zeros_like(tl), tl, ylens.to(tl.device)], dim=1)
        ranges = prune_ranges(*grads, bd, task.s_range)
        enc_p, dec_p = prune(joiner.enc_proj(y), joiner.dec_proj(dec), ranges)
        al = pruned_rnnt_align(joiner(enc_p, dec_p), tg[:, :U], ranges, ylens, tl, blank)
    elif criterion == "tdt":
        al = tdt_align(joiner.full(y, dec), tg[:, :U], ylens, tl, blank, list(task.durations))
    else:
        al = rnnt_align(joiner.full(y, dec), tg[:, :U], ylens, tl, blank=blank)
    out = []
    for n, a in enumerate(al):
        if a.score == -float("inf"):
            out.append(None)
            continue
        f = a.frames.tolist()
        d = a.durations.tolist() if a.durations is not None else [0] * len(f)
        out.append(char_words(ids[n], [(t, t + max(k, 1)) for t, k in zip(f, d)], units.sep, units.units))
    return out


DEFAULT_EXP = os.path.join("exp", "digits")


def find_exp(exp):
    """``(directory holding checkpoint.pt, None)`` for ``--exp`` ``exp``, or ``(None, why not)``.  ``exp`` None:
    ``exp/digits/chain`` (``python -m recipes.digits``'s default output), else the one ``exp/digits/<criterion>`` that
    holds a checkpoint."""
    from .config import CRITERIA

    def runs(d):
        return [os.path.join(d, c) for c in CRITERIA if os.path.isfile(os.path.join(d, c, "checkpoint.pt"))]

    if exp is not None:
        if os.path.isfile(os.path.join(exp, "checkpoint.pt")):
            return exp, None
        inside = runs(exp)
        return None, (f"no checkpoint.pt in {exp!r}" + (f"; it holds the runs {', '.join(inside)}: name one" if inside
                                                         else " (train one with python -m recipes.digits --out)"))
    found = runs(DEFAULT_EXP)
    if len(found) == 1 or (found and found[0] == os.path.join(DEFAULT_EXP, "chain")):
        return found[0], None
    if not found:
        return None, (f"no trained model in {os.path.join(DEFAULT_EXP, '<criterion>')} (what python -m recipes.digits "
                      f"writes by default); train one, or name its output directory")
    return None, f"several trained models ({', '.join(found)}): name one"


def corpus_config(R, state, a):
    """``(CorpusConfig, cache directory, where the options came from)``: the checkpoint's corpus (``state``),
    or the recipe's default corpus for a checkpoint that does not record one, with the options given in ``a``
    in place of its values."""
    origin = state.get("corpus") or {}
    dc = R.corpus.CorpusConfig.from_dict(origin["config"]) if origin.get("config") else R.corpus.CorpusConfig()
    words = tuple(R.lexicon.parse_words(a.words)) if a.words else dc.words
    snr = dc.snr_db if a.min_snr is None else (a.min_snr, max(a.min_snr, dc.snr_db[1]))
    given = dict(num_train=a.num_train, num_test=a.num_test, max_words=a.max_words, seed=a.corpus_seed)
    ccfg = dataclasses.replace(dc, words=words, snr_db=snr, **{k: v for k, v in given.items() if v is not None})
    cache = a.cache_dir or origin.get("cache_dir") or R.corpus.default_cache_dir()
    return ccfg, cache, "the checkpoint" if origin.get("config") else "the recipe's defaults"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exp", default=None,
                   help=f"the training output directory (holds checkpoint.pt; default: "
                        f"{os.path.join(DEFAULT_EXP, 'chain')}, else the one run under {DEFAULT_EXP})")
    p.add_argument("--ctm", default=None, help="CTM file to write (default <exp>/test.ctm)")
    p.add_argument("--frame-shift", type=float, default=0.01, help="feature frame shift in seconds")
    p.add_argument("--subsampling", type=int, default=0, help="output frame subsampling (0: the model's)")
    p.add_argument("--channel", default="1", help="CTM channel field")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    g = p.add_argument_group("corpus (default: the options and cache directory the checkpoint records)")
    g.add_argument("--cache-dir", default=None, help="where the synthesized corpus is kept")
    g.add_argument("--num-train", type=int, default=None)
    g.add_argument("--num-test", type=int, default=None)
    g.add_argument("--words", default=None, help="comma-separated vocabulary")
    g.add_argument("--max-words", type=int, default=None)
    g.add_argument("--min-snr", type=float, default=None)
    g.add_argument("--corpus-seed", type=int, default=None)
    a = p.parse_args(argv)
    exp, why = find_exp(a.exp)
    if exp is None:
        p.error(f"argument --exp: {why}")
    ckpt = os.path.join(exp, "checkpoint.pt")
    if a.frame_shift <= 0 or a.subsampling < 0 or a.batch_size < 1:
        p.error("--frame-shift must be > 0, --subsampling >= 0 and --batch-size >= 1")

    import torch

    R = recipe_modules()
    device = torch.device(a.device)
    state = torch.load(ckpt, map_location=device, weights_only=False)
    ccfg, cache_dir, source = corpus_config(R, state, a)
    print(f"{ckpt}: corpus {ccfg.key()} in {cache_dir} (options from {source})")
    data = R.corpus.load_or_create(ccfg, cache_dir, progress=False)
    train_set, test_set = data["train"], data["test"]
    cfg = R.train.TrainConfig(**{k: v for k, v in state["config"].items()
                                 if k in R.train.TrainConfig.__dataclass_fields__})
    vocab = R.train.vocabulary(train_set)
    task = R.tasks.make_task(cfg.criterion, lambda: R.train.make_recipe(train_set, vocab, cfg), vocab, cfg)
    encoder = R.model.build_model(cfg.model, train_set.feats.shape[1], task.out_dim, cfg.hidden, cfg.num_layers,
                                  cfg.dropout)
    encoder.load_state_dict(state["model"])
    task.modules.load_state_dict(state.get("heads", {}))
    encoder.to(device).eval()
    task.modules.to(device).eval()
    sub = a.subsampling or getattr(encoder, "subsampling", None) or encoder.front.subsampling
    lines, skipped = [], []
    with torch.no_grad():
        for b0 in range(0, len(test_set), a.batch_size):
            idx = list(range(b0, min(len(test_set), b0 + a.batch_size)))
            x, lens = _pad(test_set, idx)
            y, ylens = encoder(x.to(device), lens.to(device))
            texts = [test_set.texts[i] for i in idx]
            for i, segs in zip(idx, align_batch(task, cfg.criterion, y, ylens, texts)):
                if segs is None:
                    skipped.append(test_set.utt_ids[i])
                    continue
                lines += ctm_lines(test_set.utt_ids[i], segs, a.frame_shift, sub, a.channel)
    path = a.ctm or os.path.join(exp, "test.ctm")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    print(f"{cfg.criterion}: {len(test_set) - len(skipped)} of {len(test_set)} test utterances aligned, "
          f"{len(lines)} words -> {path}" + (f"; no alignment for {', '.join(skipped)}" if skipped else ""))
    return path


if __name__ == "__main__":
    main()
