"""Train a spoken-digit recognizer end to end with one of chainfb's criteria (--criterion chain, ctc, rnnt,
pruned-rnnt or tdt; default chain = LF-MMI), decode held-out voices, report WER; --criterion all trains each in
turn and writes a comparison (compare.json, compare.png).

The corpus (eSpeak NG voices, noise, Kaldi fbank) is synthesized on first run into the cache directory (about
30 s) and reused. The default run (chain) takes about 2 minutes on a 2-core CPU. Outputs go to --out (default
exp/digits/<criterion>; for --criterion all, exp/digits holds compare.json and compare.png and one directory per
criterion): results.json and history.json (rewritten after every epoch), test_hyps.txt, training.png,
checkpoint.pt, graphs. Re-running the same command resumes from the last completed epoch; an --out holding
another criterion's run, or (without --no-resume) a checkpoint of another model configuration, is refused.
Ctrl-C and SIGTERM stop the run after the checkpoint being written, if any, is complete (exit status 130 and 143).
Under torchrun (torch.distributed, DDP: gloo on CPU, nccl on GPU) each process trains on an equal share of the
batches:
    torchrun --standalone --nproc_per_node 2 -m recipes.digits --criterion ctc

Run from the repository root: python -m recipes.digits [options]; this module is the recipe's command line, the
rest of the package recipes/digits its code.
"""
import argparse
import os
import sys
import time

# OpenMP threads that wait for each other spin first (GNU libgomp, torch's runtime on Linux: some milliseconds)
# and hold the core while the thread they wait for may need it: where other work keeps every core busy, the
# recipe's steps ran 12x slower than on one thread (benchmarks/bench_contention.py).  Set before torch starts its
# runtime, unless the user chose a waiting policy: threads that wait sleep, and the thread count (so the numbers)
# stays torch's.
WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
if not any(v in os.environ for v in WAIT_SETTINGS):
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

PROG = "recipes.digits"


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line, ``<prog>: error: <message>`` (exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


DEFAULT_OUT = os.path.join("exp", "digits")


CHAIN_ONLY = ("--context", "--min-biphone-count", "--min-monophone-count")


def _child_argv(argv, criterion, out):
    """``argv`` with ``--criterion`` and ``--out`` replaced (for one run of ``--criterion all``); the chain-only
    options are dropped for the other criteria."""
    drop = ("--criterion", "--out") + (CHAIN_ONLY if criterion != "chain" else ())
    rest, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in drop:
            skip = True
            continue
        if arg.startswith(tuple(d + "=" for d in drop)):
            continue
        rest.append(arg)
    return rest + ["--criterion", criterion, "--out", out]


def run_all(argv, out, criteria):
    """Train every criterion in its own process (so each peak memory is its own) into ``<out>/<criterion>``, then
    write ``<out>/compare.json`` and ``<out>/compare.png``."""
    import json
    import subprocess

    from .compare import write_comparison
    from .signals import Terminated

    results = {}
    for c in criteria:
        print(f"=== criterion {c} ===", flush=True)
        child = subprocess.Popen([sys.executable, "-m", __package__,
                                  *_child_argv(argv, c, os.path.join(out, c))])
        try:
            code = child.wait()
        except KeyboardInterrupt as e:
            # Ctrl-C in a terminal reaches the child too; SIGTERM was sent to this process alone: pass it on.
            # Either way the child stops after saving what it has done, and this process waits for it.
            if isinstance(e, Terminated):
                child.terminate()
            _wait_out(child)
            raise
        if code in (130, 143):
            raise Terminated() if code == 143 else KeyboardInterrupt()
        if code:
            raise SystemExit(f"{PROG}: error: --criterion {c} failed (exit {code})")
        with open(os.path.join(out, c, "results.json")) as f:
            results[c] = json.load(f)
    table = write_comparison(out, results)
    print(table)
    return results


def _wait_out(child):
    """Wait for ``child`` to exit, through further Ctrl-C / SIGTERM (each passed on to it as SIGTERM)."""
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            child.terminate()


def _typed(kind, low=None, high=None, low_open=False, high_open=False):
    """An argparse ``type``: ``kind`` within ``[low, high]`` (``low_open``/``high_open``: excluding the bound)."""
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if v != v or (low is not None and (v < low or (low_open and v == low))) or \
                (high is not None and (v > high or (high_open and v == high))):
            lo = "" if low is None else f"{'>' if low_open else '>='} {low}"
            hi = "" if high is None else f"{'<' if high_open else '<='} {high}"
            raise argparse.ArgumentTypeError(f"expected a value {' and '.join(x for x in (lo, hi) if x)}, "
                                             f"got {text!r}")
        return v
    parse.__name__ = kind.__name__
    return parse


def build_parser(criteria, dc, dt, cache_dir):
    """The command line; ``dc``/``dt``: the default corpus and training configurations."""
    p = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pos_int, nonneg_int = _typed(int, 1), _typed(int, 0)
    g = p.add_argument_group("corpus")
    g.add_argument("--cache-dir", default=cache_dir,
                   help="where the synthesized corpus is kept (default: %(default)s; $CHAINFB_CACHE/digits if set)")
    g.add_argument("--num-train", type=pos_int, default=dc.num_train, help="training utterances (default: %(default)s)")
    g.add_argument("--num-test", type=pos_int, default=dc.num_test,
                   help="test utterances, held-out voices (default: %(default)s)")
    g.add_argument("--words", default=",".join(dc.words),
                   help="comma-separated vocabulary (words CMUdict knows), e.g. add yes,no,stop,go for short commands "
                        "(default: %(default)s)")
    g.add_argument("--max-words", type=pos_int, default=dc.max_words,
                   help="longest digit string (default: %(default)s)")
    g.add_argument("--min-snr", type=_typed(float), default=dc.snr_db[0],
                   help="lowest SNR in dB (default: %(default)s)")
    g.add_argument("--corpus-seed", type=int, default=dc.seed,
                   help="seed of the corpus (texts, voices, noise); another seed is another corpus "
                        "(default: %(default)s)")
    g = p.add_argument_group("training")
    g.add_argument("--criterion", default="chain", choices=[*criteria, "all"],
                   help="training criterion; 'all' trains each in turn (one process each) into <out>/<criterion> "
                        "and writes <out>/compare.json and <out>/compare.png (default: %(default)s)")
    g.add_argument("--out", default=None,
                   help=f"output directory: checkpoint, results, plot (default: {DEFAULT_OUT}/<criterion>; "
                        f"{DEFAULT_OUT} for --criterion all)")
    g.add_argument("--epochs", type=pos_int, default=dt.epochs,
                   help="training epochs; a rerun with more epochs extends a finished run (default: %(default)s)")
    g.add_argument("--batch-size", type=pos_int, default=dt.batch_size,
                   help="utterances per batch (per process under torchrun) (default: %(default)s)")
    g.add_argument("--lr", type=_typed(float, 0, low_open=True), default=dt.lr,
                   help="initial learning rate of Adam, decayed exponentially to --final-lr (default: %(default)s)")
    g.add_argument("--final-lr", type=_typed(float, 0, low_open=True), default=None,
                   help="learning rate at the end (default: lr / 10)")
    g.add_argument("--model", default=dt.model, choices=["tdnn", "tdnn-lstm"],
                   help="acoustic model (default: %(default)s)")
    g.add_argument("--dropout", type=_typed(float, 0, 1, high_open=True), default=dt.dropout,
                   help="dropout probability in the acoustic model (default: %(default)s)")
    g.add_argument("--hidden", type=pos_int, default=dt.hidden,
                   help="width of the TDNN layers and of the BLSTM (both directions together) (default: %(default)s)")
    g.add_argument("--layers", type=nonneg_int, default=dt.num_layers,
                   help="tdnn: context layers after subsampling; tdnn-lstm: BLSTM layers (default: %(default)s)")
    g.add_argument("--leaky-hmm", type=_typed(float, 0, 1, high_open=True), default=dt.leaky_hmm_coefficient,
                   help="chain: leaky-HMM coefficient of the denominator (default: %(default)s)")
    g.add_argument("--phone-lm-order", type=pos_int, default=dt.phone_lm_order,
                   help="chain: n-gram order of the phone LM (default: %(default)s)")
    g.add_argument("--context", default=dt.context, choices=["mono", "biphone"],
                   help="chain: mono (one HMM per phone) or biphone (each phone after each left context its own HMM, "
                        "rare biphones tied to their monophone; Kaldi's e2e biphone recipes) (default: %(default)s)")
    g.add_argument("--min-biphone-count", type=nonneg_int, default=dt.min_biphone_count,
                   help="chain, --context biphone: a biphone seen fewer times in the training transcripts shares its "
                        "monophone's pdfs; 0 ties none (default: %(default)s, Kaldi's)")
    g.add_argument("--min-monophone-count", type=nonneg_int, default=dt.min_monophone_count,
                   help="chain, --context biphone: a phone seen at most this often shares the one 'zerophone' pdf "
                        "pair instead (default: %(default)s, Kaldi's)")
    g.add_argument("--l2", type=_typed(float, 0), default=dt.l2_regularize,
                   help="chain: l2 regularization of the output (default: %(default)s)")
    g.add_argument("--device", default=dt.device,
                   help="auto (cuda when torch sees a GPU, else cpu), cpu, cuda or cuda:N (default: %(default)s)")
    g.add_argument("--seed", type=int, default=dt.seed,
                   help="seed of the model initialization and the batch order (default: %(default)s)")
    g.add_argument("--threads", type=nonneg_int, default=0, help="torch CPU threads (default: 0 = torch's default)")
    g.add_argument("--max-steps", type=nonneg_int, default=0,
                   help="cap on batches per epoch, for smoke tests (default: 0 = no cap)")
    g.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _make_dir(p, option, path):
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        p.error(f"argument {option}: cannot create {path!r}: {e.strerror or e}")
    if not os.access(path, os.W_OK):
        p.error(f"argument {option}: {path!r} is not writable")


def _interrupted(out, criterion, how="interrupted"):
    """The one line printed on Ctrl-C (``how``: "interrupted") or SIGTERM: where a rerun of the same command
    continues."""
    import json

    if criterion == "all":
        return (f"{PROG}: {how}; rerunning the same command resumes each criterion in {out} from its last "
                f"completed epoch")
    done = 0
    try:
        with open(os.path.join(out, "history.json")) as f:
            done = len(json.load(f))
    except (OSError, ValueError, TypeError):
        pass
    where = f"epoch {done} is" if done else "no epoch is"
    return (f"{PROG}: {how} ({where} complete in {out}); rerunning the same command resumes from the last "
            f"completed epoch")


def main(argv=None):
    from .config import CRITERIA, TrainConfig
    from .corpus import CorpusConfig, default_cache_dir
    from .signals import Terminated, terminate_as_interrupt

    argv = sys.argv[1:] if argv is None else list(argv)
    dc, dt = CorpusConfig(), TrainConfig()
    p = build_parser(CRITERIA, dc, dt, default_cache_dir())
    a = p.parse_args(argv)
    out = a.out if a.out is not None else (DEFAULT_OUT if a.criterion == "all" else os.path.join(DEFAULT_OUT,
                                                                                                 a.criterion))
    try:
        with terminate_as_interrupt():  # SIGTERM stops the run as Ctrl-C does: after saving what is done
            return _run(p, a, argv, out, dc, CRITERIA)
    except KeyboardInterrupt as e:
        term = isinstance(e, Terminated)
        if int(os.environ.get("RANK", "0")) == 0:
            print(_interrupted(out, a.criterion, "terminated (SIGTERM)" if term else "interrupted"), file=sys.stderr)
        raise SystemExit(143 if term else 130) from None


def _train_config(a):
    """The training configuration of the command line ``a``."""
    from .config import TrainConfig

    return TrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, final_lr=a.final_lr or a.lr / 10,
                       model=a.model, hidden=a.hidden, num_layers=a.layers, dropout=a.dropout,
                       leaky_hmm_coefficient=a.leaky_hmm, l2_regularize=a.l2, phone_lm_order=a.phone_lm_order,
                       context=a.context if a.criterion == "chain" else "mono",
                       min_biphone_count=a.min_biphone_count, min_monophone_count=a.min_monophone_count,
                       seed=a.seed, device=a.device, max_steps=a.max_steps, progress=not a.no_progress,
                       criterion=a.criterion)


def _run(p, a, argv, out, dc, criteria):
    import torch

    from .lexicon import parse_words

    if a.criterion not in ("chain", "all") and a.context != "mono":
        p.error(f"argument --context: {a.context!r} is for --criterion chain (its pdfs); {a.criterion} uses "
                f"character units")
    if a.model == "tdnn-lstm" and a.layers < 1:
        p.error("argument --layers: --model tdnn-lstm needs at least one BLSTM layer")
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
    if a.criterion == "all" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        p.error("argument --criterion: 'all' runs one process per criterion; under torchrun name one criterion")
    from .train import model_differences, run_criterion

    held = run_criterion(out)
    if held is not None and held != a.criterion:
        p.error(f"argument --out: {out} holds a run of criterion {held!r}" +
                (" (a single run; --criterion all writes one directory per criterion)" if a.criterion == "all" else
                 f", not {a.criterion!r}") + "; choose another directory (or remove it)")
    tcfg = _train_config(a)
    diff = [] if a.criterion == "all" or a.no_resume else model_differences(out, tcfg)
    if diff:
        p.error(f"argument --out: {out} holds a run of another model configuration ({', '.join(diff)}); choose "
                f"another directory (or remove it, or start it over with --no-resume)")
    if a.criterion != "all" and os.path.exists(os.path.join(out, "compare.json")):
        p.error(f"argument --out: {out} holds the comparison of --criterion all; name a directory of its own "
                f"(default: {os.path.join(DEFAULT_OUT, a.criterion)})")
    _make_dir(p, "--cache-dir", a.cache_dir)
    if int(os.environ.get("RANK", "0")) == 0:
        _make_dir(p, "--out", out)
    if a.threads > 0:
        torch.set_num_threads(a.threads)

    from .corpus import CorpusConfig, load_or_create

    t0 = time.time()
    ccfg = CorpusConfig(words=words, num_train=a.num_train, num_test=a.num_test, max_words=a.max_words,
                        snr_db=(a.min_snr, max(a.min_snr, dc.snr_db[1])), seed=a.corpus_seed)
    data = load_or_create(ccfg, a.cache_dir, progress=not a.no_progress)
    t1 = time.time()
    print(f"corpus ready in {t1 - t0:.1f} s ({os.path.join(a.cache_dir, ccfg.key())})")
    if a.criterion == "all":
        return run_all(argv, out, criteria)

    from .files import DirectoryBusy
    from .train import OtherCriterionRun, OtherModelRun, train

    try:
        res = train(data["train"], data["test"], tcfg, out, resume=not a.no_resume)
    except (DirectoryBusy, OtherCriterionRun, OtherModelRun) as e:
        raise SystemExit(f"{PROG}: error: --out {e}") from None
    t2 = time.time()
    if res is None:  # a rank other than 0 under torchrun
        return res
    print(f"WER on held-out voices: {res['test_wer']:.2f}% ({res['test_words']} words, {res['test_utts']} "
          f"utterances); total wall time {t2 - t0:.0f} s "
          f"(corpus {t1 - t0:.0f} s, training+decoding {t2 - t1:.0f} s); results in {out}")
    return res


if __name__ == "__main__":
    main()
