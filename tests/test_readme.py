"""The documentation runs as written.

- Every ```python block of README.md runs as pasted, each in a fresh interpreter, from an empty directory.
- Every ```python block of docs/*.md runs as pasted, each in a fresh interpreter, from a directory that holds
  copies of the repository's ``graphs/``, ``benchmarks/``, ``examples/`` and ``recipes/`` (the docs' examples run
  from the repository root and read the shipped example files).
- Every ```bash block of docs/*.md that installs nothing (no ``pip install``) runs the same way under
  ``bash -e``, with the package's console scripts (setup.cfg's entry points) on ``PATH`` as pip installs them.
- The package's long description (setup.cfg) links to nothing by a relative path: a package index renders it
  outside the repository.
"""
import configparser
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
SHIPPED = ("graphs", "benchmarks", "examples", "recipes")  # what a docs example may use, as from the repository root


def fenced_blocks(text, lang="python"):
    """The bodies of the fenced blocks whose info string is ``lang``, in order."""
    return [m.group(1) for m in re.finditer(rf"^```{lang}[ \t]*\n(.*?)^```[ \t]*$", text, re.M | re.S)]


def python_blocks(text):
    """The bodies of the fenced blocks whose info string is ``python``, in order."""
    return fenced_blocks(text, "python")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


BLOCKS = python_blocks(_read(README))
DOC_BLOCKS = [(os.path.basename(p), i + 1, "python", b) for p in DOCS
              for i, b in enumerate(python_blocks(_read(p)))]
DOC_BLOCKS += [(os.path.basename(p), i + 1, "bash", b) for p in DOCS
               for i, b in enumerate(fenced_blocks(_read(p), "bash")) if "pip install" not in b]


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


def test_docs_have_runnable_blocks():
    assert ("chain.md", 1, "python") in {d[:3] for d in DOC_BLOCKS}
    assert ("chain.md", 1, "bash") in {d[:3] for d in DOC_BLOCKS}


def test_long_description_is_self_contained():
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    field = cfg["metadata"]["long_description"]
    assert field.startswith("file:"), field
    text = _read(os.path.join(ROOT, field[len("file:"):].strip()))
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)", text)  # [text](target) and ![alt](target)
    targets += re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", text, re.M)  # [label]: target
    targets += re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)""", text, re.I)  # HTML links and images
    relative = [t for t in targets if not re.match(r"https?://", t)]
    assert not relative, f"{field}: relative links or images {relative}"


def test_ci_runs_the_readme_test_command():
    """``.ci/run`` runs the README's test command (the linter, then pytest), with pip's ``-q`` flags alone
    added."""
    command = [b.strip() for b in fenced_blocks(_read(README), "bash") if "python -m pytest -q tests" in b]
    assert len(command) == 1, command
    ci = [line for line in _read(os.path.join(ROOT, ".ci", "run")).splitlines() if "pytest" in line]
    assert len(ci) == 1, ci
    assert ci[0].replace("pip install -q ", "pip install ") == command[0]
    assert "ruff check . && python -m pytest" in command[0]


def test_python_blocks_parser():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\nz = 3\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = 2\nz = 3\n"]
    assert fenced_blocks(text, "bash") == ["ls\n"]


def _run(argv, code, cwd, what, timeout, bin_dir=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if bin_dir:
        env["PATH"] = str(bin_dir) + os.pathsep + env.get("PATH", "")
    env["MPLBACKEND"] = "Agg"
    try:
        r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not finish in {timeout} s:\n{code}")
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-15:])
        pytest.fail(f"{what} failed (exit code {r.returncode}):\n{code}\n--- stderr (tail) ---\n{tail}")


@pytest.mark.parametrize("number", range(1, len(BLOCKS) + 1))
def test_readme_block_runs(number, tmp_path):
    code = BLOCKS[number - 1]
    _run([sys.executable, "-c", code], code, tmp_path, f"README.md python block {number}", 60)


@pytest.fixture(scope="module")
def console_scripts(tmp_path_factory):
    """A directory holding the console scripts of setup.cfg's entry points, each what pip writes for one (this
    interpreter imports ``module`` and exits with ``function()``), running this tree's chainfb."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    bin_dir = tmp_path_factory.mktemp("bin")
    for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines():
        name, target = (part.strip() for part in line.split("="))
        module, function = target.split(":")
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n")
        path.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("doc, number, lang, code", DOC_BLOCKS, ids=[f"{d}-{lang}{n}" for d, n, lang, _ in DOC_BLOCKS])
def test_docs_block_runs(doc, number, lang, code, tmp_path, console_scripts):
    for name in SHIPPED:
        shutil.copytree(os.path.join(ROOT, name), tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    argv = [sys.executable, "-c", code] if lang == "python" else ["bash", "-e", "-c", code]
    _run(argv, code, tmp_path, f"docs/{doc} {lang} block {number}", 120, console_scripts)
