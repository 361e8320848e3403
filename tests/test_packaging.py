"""The sdist is the whole project and the wheel is the library alone.

Builds both from a copy of the source tree (``python -m build --no-isolation``: the sdist, then the wheel
from the unpacked sdist), checks their contents by rule, and runs pytest on the unpacked sdist (the whole
tests/ directory collected with no error, one quick file run). About 30 s in all.
"""
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

pytestmark = pytest.mark.slow  # about 30 s on 2 idle cores: two builds and a pytest run in a subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what the sdist must carry besides the library: the tests with their helpers, graphs, benchmarks, examples, docs,
# recipes
PROJECT_DIRS = ("chainfb", "tests", "graphs", "benchmarks", "examples", "docs", "recipes", ".ci")
SKIP_PARTS = {"__pycache__", ".pytest_cache", "build", "dist", ".git", ".venv", "exp"}
QUICK_TEST_FILE = "test_fst.py"
# caches that a checkout holds once its code has run (bytecode, Numba's compiled functions), planted in the
# copy that is built
CACHE_FILES = ("chainfb/engines/numba_log/__pycache__/one_frame.run-120.py311.nbi",
               "chainfb/engines/numba_log/__pycache__/one_frame.run-120.py311.1.nbc",
               "chainfb/transducer/maps/__pycache__/cells.cpython-311.pyc",
               "benchmarks/__pycache__/_memory.cpython-311.pyc")


def _source_files():
    """Paths (relative, '/'-separated) of the files that make up the source tree: git's tracked and
    untracked-but-not-ignored files in a checkout, otherwise every file outside build outputs and caches."""
    if os.path.isdir(os.path.join(ROOT, ".git")) and shutil.which("git"):
        r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True)
        names = [n for n in r.stdout.split("\0") if n]
        return sorted(n for n in names if os.path.isfile(os.path.join(ROOT, n)))
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in SKIP_PARTS and not x.endswith(".egg-info")]
        out += [os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/") for f in files
                if not f.endswith((".pyc", ".pyo"))]
    return sorted(out)


SOURCE = _source_files()


def _under(names, top):
    return {n for n in names if n.split("/", 1)[0] == top}


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """(sdist path, wheel path, unpacked sdist directory), built once for the module."""
    pytest.importorskip("build", reason="the `build` package (in the test extra) builds the sdist and wheel")
    base = tmp_path_factory.mktemp("packaging")
    src, out = base / "src", base / "dist"
    for name in SOURCE:
        os.makedirs(src / os.path.dirname(name), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), src / name)
    for name in CACHE_FILES:  # what running the code leaves in a checkout: none of it may ship
        os.makedirs(src / os.path.dirname(name), exist_ok=True)
        (src / name).write_bytes(b"\0" * 64)
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, f"python -m build failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    sdists = list(out.glob("*.tar.gz"))
    wheels = list(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, os.listdir(out)
    unpacked = base / "unpacked"
    with tarfile.open(sdists[0]) as tf:
        if hasattr(tarfile, "data_filter"):
            tf.extractall(unpacked, filter="data")
        else:  # Python without extraction filters (before 3.10.12 / 3.11.4); the archive is our own
            tf.extractall(unpacked)
    (top,) = unpacked.iterdir()
    return sdists[0], wheels[0], top


def _wheel_names(path):
    with zipfile.ZipFile(path) as zf:
        return sorted(zf.namelist())


def _sdist_names(path):
    with tarfile.open(path) as tf:
        names = [m.name for m in tf.getmembers() if m.isfile()]
    return sorted(n.split("/", 1)[1] for n in names)


def test_wheel_holds_the_library_only(dists):
    names = _wheel_names(dists[1])
    dist_info = {n for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    library = set(names) - dist_info
    assert library and all(n.startswith("chainfb/") for n in library), sorted(
        n for n in library if not n.startswith("chainfb/"))
    # the kernels and the typing marker travel with the code
    source_lib = _under(SOURCE, "chainfb")
    kernels = {n for n in source_lib if n.endswith((".cu", ".cuh"))}
    assert kernels and kernels <= library, sorted(kernels - library)
    assert "chainfb/py.typed" in library
    # no recipe, no test-only emulation (the C++ host emulation and its selftest kernels)
    assert not [n for n in library if "recipes" in n.split("/")]
    assert not [n for n in library if n.endswith((".h", ".cpp", ".c", ".so", ".pyc", ".nbi", ".nbc"))]
    emulation = sorted(n for n in library if os.path.basename(n).startswith("emulat"))
    if os.path.isdir(os.path.join(ROOT, "tests", "emulation")):
        assert emulation == []
    else:  # the emulation's Python driver may ship only while it still lives inside the package
        assert set(emulation) <= {n for n in source_lib if n.endswith(".py")}
    # every module of the library is there
    modules = {n for n in source_lib if n.endswith(".py") and "recipes" not in n.split("/")
               and not os.path.basename(n).startswith("emulat")}
    assert modules <= library, sorted(modules - library)
    # licensed: the license file sits in the metadata and the metadata names the license
    assert any(n.endswith("/LICENSE") for n in dist_info), sorted(dist_info)
    with zipfile.ZipFile(dists[1]) as zf:
        (meta,) = [n for n in dist_info if n.endswith("/METADATA")]
        metadata = zf.read(meta).decode()
    assert "Apache-2.0" in metadata
    assert "Requires-Dist: numba" in metadata


CONSOLE_SCRIPTS = {"chainfb-make-den-graph": "chainfb.cli.make_den_graph:main",
                   "chainfb-make-numerator-graphs": "chainfb.cli.make_numerator_graphs:main",
                   "chainfb-draw-transducer": "chainfb.cli.draw_transducer:main"}


def test_wheel_installs_the_console_scripts(dists):
    """The wheel's entry points are the package's command-line tools, each naming a ``main`` of chainfb.cli."""
    import configparser
    import importlib

    with zipfile.ZipFile(dists[1]) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        cfg = configparser.ConfigParser()
        cfg.read_string(zf.read(name).decode())
    assert dict(cfg["console_scripts"]) == CONSOLE_SCRIPTS
    for target in CONSOLE_SCRIPTS.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target


def test_sdist_is_the_whole_project(dists):
    names = set(_sdist_names(dists[0]))
    for required in ("LICENSE", "README.md", "setup.cfg", "pyproject.toml", "MANIFEST.in", "PKG-INFO",
                     "tests/conftest.py", "tests/devices.py", "tests/oracles/__init__.py"):
        assert required in names, required
    for top in ("graphs", "benchmarks", "examples", "docs"):
        assert _under(names, top), f"no {top}/ in the sdist"
    # every source file of the project's directories, tests/emulation and recipes/ included where they exist
    wanted = {n for n in SOURCE if n.split("/", 1)[0] in PROJECT_DIRS}
    assert wanted - names == set()
    assert not [n for n in names if "__pycache__" in n.split("/") or n.endswith((".pyc", ".nbi", ".nbc"))]
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
        assert "Apache License" in f.read() and "LICENSE" in names


def test_tests_run_from_the_unpacked_sdist(dists):
    top = dists[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(top) + os.pathsep + env.get("PYTHONPATH", "")
    env["MPLBACKEND"] = "Agg"
    r = subprocess.run([sys.executable, "-c", "import chainfb; print(chainfb.__file__)"], cwd=top, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().startswith(str(top)), (r.stdout, r.stderr)
    # one run: the whole tests/ directory is collected (a collection error fails it), one quick file is run
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests",
                        "-k", QUICK_TEST_FILE], cwd=top, env=env, capture_output=True, text=True, timeout=300)
    tail = "\n".join(r.stdout.strip().splitlines()[-15:])
    assert r.returncode == 0, f"pytest on the unpacked sdist failed (exit {r.returncode}):\n{tail}\n{r.stderr[-2000:]}"
    last = r.stdout.strip().splitlines()[-1]
    assert " passed" in last and " deselected" in last and "error" not in last, last
