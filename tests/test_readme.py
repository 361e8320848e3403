"""Every ```python block of README.md runs as pasted: each in a fresh interpreter, from an empty directory."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")


def python_blocks(text):
    """The bodies of the fenced blocks whose info string is ``python``, in order."""
    return [m.group(1) for m in re.finditer(r"^```python[ \t]*\n(.*?)^```[ \t]*$", text, re.M | re.S)]


with open(README, encoding="utf-8") as f:
    BLOCKS = python_blocks(f.read())


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


def test_python_blocks_parser():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\nz = 3\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = 2\nz = 3\n"]


@pytest.mark.parametrize("number", range(1, len(BLOCKS) + 1))
def test_readme_block_runs(number, tmp_path):
    code = BLOCKS[number - 1]
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["MPLBACKEND"] = "Agg"
    try:
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"README.md python block {number} did not finish in 60 s:\n{code}")
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-15:])
        pytest.fail(f"README.md python block {number} failed (exit code {r.returncode}):\n{code}\n"
                    f"--- stderr (tail) ---\n{tail}")
