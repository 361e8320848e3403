#!/usr/bin/env python
"""Train a spoken-digit recognizer end to end with one of chainfb's criteria (--criterion chain, ctc, rnnt,
pruned-rnnt or tdt; default chain = LF-MMI), decode held-out voices, report WER; --criterion all trains each in
turn and writes a comparison (compare.json, compare.png).

The corpus (eSpeak NG voices, noise, Kaldi fbank) is synthesized on first run into the cache directory and reused.
Defaults finish in well under 15 minutes on a 2-core CPU. Outputs go to --out (results.json, history.json,
test_hyps.txt, training.png, checkpoint.pt, graphs). Re-running with the same --out resumes from the checkpoint.
Under torchrun (torch.distributed, DDP: gloo on CPU, nccl on GPU) each process trains on its shard of the batches:
    torchrun --standalone --nproc_per_node 2 tools/train_digits.py --criterion ctc
"""
import argparse
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)  # chainfb from this checkout when it is not installed
sys.path.insert(0, os.path.join(_ROOT, "recipes"))  # the recipe: recipes/digits, imported as `digits`


def _child_argv(argv, criterion, out):
    """``argv`` with ``--criterion`` and ``--out`` replaced (for one run of ``--criterion all``)."""
    rest, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--criterion", "--out"):
            skip = True
            continue
        if arg.startswith(("--criterion=", "--out=")):
            continue
        rest.append(arg)
    return rest + ["--criterion", criterion, "--out", out]


def run_all(argv, out, criteria):
    """Train every criterion in its own process (so each peak memory is its own), then write
    ``<out>/compare.json`` and ``<out>/compare.png``."""
    import json
    import subprocess

    from digits.compare import write_comparison

    results = {}
    for c in criteria:
        print(f"=== criterion {c} ===", flush=True)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), *_child_argv(argv, c, os.path.join(out, c))])
        if r.returncode:
            raise SystemExit(f"train_digits.py: error: --criterion {c} failed (exit {r.returncode})")
        with open(os.path.join(out, c, "results.json")) as f:
            results[c] = json.load(f)
    table = write_comparison(out, results)
    print(table)
    return results


def main(argv=None):
    from digits.corpus import CorpusConfig, default_cache_dir, load_or_create
    from digits.tasks import CRITERIA
    from digits.train import TrainConfig, train

    argv = sys.argv[1:] if argv is None else list(argv)

    dc, dt = CorpusConfig(), TrainConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("corpus")
    g.add_argument("--cache-dir", default=default_cache_dir(), help="where the synthesized corpus is kept")
    g.add_argument("--num-train", type=int, default=dc.num_train, help="training utterances")
    g.add_argument("--num-test", type=int, default=dc.num_test, help="test utterances (held-out voices)")
    g.add_argument("--words", default=",".join(dc.words),
                   help="comma-separated vocabulary (words CMUdict knows), e.g. add yes,no,stop,go for short commands")
    g.add_argument("--max-words", type=int, default=dc.max_words, help="longest digit string")
    g.add_argument("--min-snr", type=float, default=dc.snr_db[0], help="lowest SNR in dB")
    g.add_argument("--corpus-seed", type=int, default=dc.seed)
    g = p.add_argument_group("training")
    g.add_argument("--criterion", default="chain", choices=[*CRITERIA, "all"],
                   help="training criterion; 'all' trains each in turn (one process each) and writes "
                        "<out>/compare.json and <out>/compare.png")
    g.add_argument("--out", default="exp/digits", help="output directory (checkpoints, results, plot)")
    g.add_argument("--epochs", type=int, default=dt.epochs)
    g.add_argument("--batch-size", type=int, default=dt.batch_size)
    g.add_argument("--lr", type=float, default=dt.lr)
    g.add_argument("--model", default=dt.model, choices=["tdnn", "tdnn-lstm"], help="acoustic model")
    g.add_argument("--dropout", type=float, default=dt.dropout)
    g.add_argument("--final-lr", type=float, default=None, help="learning rate at the end (default: lr / 10)")
    g.add_argument("--hidden", type=int, default=dt.hidden, help="TDNN width")
    g.add_argument("--layers", type=int, default=dt.num_layers,
                   help="tdnn: context layers after subsampling; tdnn-lstm: BLSTM layers")
    g.add_argument("--leaky-hmm", type=float, default=dt.leaky_hmm_coefficient)
    g.add_argument("--phone-lm-order", type=int, default=dt.phone_lm_order, help="n-gram order of the phone LM")
    g.add_argument("--l2", type=float, default=dt.l2_regularize, help="l2 regularization of the output")
    g.add_argument("--device", default=dt.device,
                   help="auto (cuda when torch sees a GPU, else cpu), cpu, cuda or cuda:N")
    g.add_argument("--seed", type=int, default=dt.seed)
    g.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    g.add_argument("--max-steps", type=int, default=0, help="cap on batches per epoch (smoke tests)")
    g.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    a = p.parse_args(argv)

    import torch

    from digits.lexicon import parse_words

    if a.device not in ("auto", "cpu"):
        try:
            dev = torch.device(a.device)
        except RuntimeError:
            dev = None
        if dev is None or dev.type not in ("cpu", "cuda"):
            p.error(f"argument --device: expected auto, cpu or cuda[:N], got {a.device!r}")
        if dev.type == "cuda" and not torch.cuda.is_available():
            p.error(f"argument --device: {a.device!r} requested but torch sees no CUDA device "
                    f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use --device cpu")
        if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
            p.error(f"argument --device: {a.device!r} requested but torch sees {torch.cuda.device_count()} "
                    f"CUDA device(s)")
    try:
        words = parse_words(a.words)
    except ImportError as exc:
        p.error(f"argument --words: {exc}")
    except ValueError as exc:
        p.error(f"argument --words: {str(exc).removeprefix('words: ')}")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.criterion == "all" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        p.error("argument --criterion: 'all' runs one process per criterion; under torchrun name one criterion")
    t0 = time.time()
    ccfg = CorpusConfig(words=words, num_train=a.num_train, num_test=a.num_test, max_words=a.max_words,
                        snr_db=(a.min_snr, max(a.min_snr, dc.snr_db[1])), seed=a.corpus_seed)
    data = load_or_create(ccfg, a.cache_dir, progress=not a.no_progress)
    t1 = time.time()
    print(f"corpus ready in {t1 - t0:.1f} s ({os.path.join(a.cache_dir, ccfg.key())})")
    if a.criterion == "all":
        return run_all(argv, a.out, CRITERIA)
    tcfg = TrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, final_lr=a.final_lr or a.lr / 10,
                       model=a.model, hidden=a.hidden, num_layers=a.layers, dropout=a.dropout,
                       leaky_hmm_coefficient=a.leaky_hmm, l2_regularize=a.l2, phone_lm_order=a.phone_lm_order,
                       seed=a.seed, device=a.device, max_steps=a.max_steps, progress=not a.no_progress,
                       criterion=a.criterion)
    from digits.files import DirectoryBusy

    try:
        res = train(data["train"], data["test"], tcfg, a.out, resume=not a.no_resume)
    except DirectoryBusy as e:
        raise SystemExit(f"train_digits.py: error: --out {e}") from None
    t2 = time.time()
    if res is None:  # a rank other than 0 under torchrun
        return res
    print(f"WER on held-out voices: {res['test_wer']:.2f}% ({res['test_words']} words, {res['test_utts']} "
          f"utterances); total wall time {t2 - t0:.0f} s "
          f"(corpus {t1 - t0:.0f} s, training+decoding {t2 - t1:.0f} s); results in {a.out}")
    return res


if __name__ == "__main__":
    main()
