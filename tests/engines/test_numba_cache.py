"""The compiled engine's cache on read-only installs (chainfb.engines.numba_cache): a second process loads
what the first compiled, counted (compilations and cache hits), never timed.

A read-only install is a read-only bind mount of a copy of the package (``unshare -rm``: a user and mount
namespace of the test's own) when the tests run as root, who may write anywhere else; otherwise the copy's
write permissions are removed.  Skipped where neither can be had."""
import paths  # tests/paths.py: the repository's and the tests' folders
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("numba")

ROOT = paths.REPO

MODULE = '''
from chainfb.engines.numba_cache import njit


@njit(nogil=True)
def add_one(x):
    return x + 1
'''

PROBE = '''
import json, sys
sys.path.insert(0, {site!r})
import chainfb
from chainfb.engines import numba_cache, numba_log
import probe_module
assert probe_module.add_one(1) == 2
print("RESULT", json.dumps(dict(
    compiled=numba_cache.compiled(), hits=sum(probe_module.add_one.stats.cache_hits.values()),
    module_cache=getattr(probe_module.add_one._cache, "cache_path", None),
    engine_cache=getattr(numba_log.one_frame.run._cache, "cache_path", None), chainfb=chainfb.__file__)))
'''


def _can_unshare():
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return r.returncode == 0


@pytest.fixture
def read_only_install(tmp_path):
    """``run(env) -> (result dict, stderr)``: the probe run in a fresh process on a read-only copy of the
    package (with a module of one compiled function beside it)."""
    src = tmp_path / "site"
    shutil.copytree(os.path.join(ROOT, "chainfb"), src / "chainfb",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    (src / "probe_module.py").write_text(MODULE)
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if os.geteuid() == 0:
        if not _can_unshare():
            pytest.skip("running as root without unshare -rm: no way to make a read-only directory")
        script = (f"mount --bind {src} {mnt} && mount -o remount,bind,ro {mnt} && "
                  f"exec {sys.executable} -c \"$PROBE\"")
        argv = ["unshare", "-rm", "sh", "-c", script]
        site = str(mnt)
    else:
        for d, _, files in os.walk(src):
            for f in files:
                os.chmod(os.path.join(d, f), 0o444)
            os.chmod(d, 0o555)
        argv = [sys.executable, "-c", "exec(__import__('os').environ['PROBE'])"]
        site = str(src)

    def run(**env):
        e = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "CHAINFB_CACHE", "XDG_CACHE_HOME")}
        e.update(env, PROBE=PROBE.format(site=site), PYTHONPATH="")
        r = subprocess.run(argv, cwd=tmp_path, env=e, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        out = json.loads(line[len("RESULT "):])
        assert out["chainfb"].startswith(site), out  # the read-only copy, not the checkout
        return out, r.stderr

    yield run, site
    if os.geteuid() != 0:
        for d, _, _ in os.walk(src):
            os.chmod(d, 0o755)


def test_a_read_only_install_compiles_once_into_the_user_cache(read_only_install, tmp_path):
    run, site = read_only_install
    cache = tmp_path / "cache"
    first, err = run(CHAINFB_CACHE=str(cache), HOME=str(tmp_path / "home"))
    assert first["compiled"] == 1 and first["hits"] == 0
    assert first["module_cache"].startswith(str(cache / "numba") + os.sep)
    notices = [ln for ln in err.splitlines() if "compiling its CPU code with Numba" in ln]
    assert len(notices) == 1 and str(cache / "numba") in notices[0], err
    assert [n for n in os.listdir(first["module_cache"]) if n.startswith("probe_module.add_one")]
    second, err = run(CHAINFB_CACHE=str(cache), HOME=str(tmp_path / "home"))
    assert second["compiled"] == 0 and second["hits"] == 1  # loaded, not compiled
    assert "compiling" not in err
    assert not os.path.exists(os.path.join(site, "__pycache__"))


def test_a_read_only_install_with_a_read_only_home_caches_in_the_temporary_directory(read_only_install, tmp_path):
    run, site = read_only_install
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(HOME=site, TMPDIR=str(tmp))  # HOME: a read-only directory; no CHAINFB_CACHE, no XDG_CACHE_HOME
    first, _ = run(**env)  # Numba's cache=True raised at import here ("no locator available")
    temp_root = os.path.join(str(tmp), f"chainfb-{0 if os.geteuid() == 0 else os.getuid()}", "numba")
    assert first["engine_cache"].startswith(temp_root + os.sep), first
    assert first["compiled"] == 1
    second, _ = run(**env)
    assert second["compiled"] == 0 and second["hits"] == 1


EDITED_PROBE = '''
import json, sys
sys.path.insert(0, {site!r})
import numpy as np
import chainfb
from chainfb.engines.numba_log import columns
m = columns.frame_max(np.array([1.0, 3.0, 2.0]), 0, 3)
print("RESULT", json.dumps(dict(max=m, hits=sum(columns.frame_max.stats.cache_hits.values()),
                                chainfb=chainfb.__file__)))
'''


def test_a_change_to_a_module_a_compiled_function_calls_compiles_it_again(tmp_path):
    """``frame_max`` (the engine's ``columns``) calls ``row_max`` and inlines ``has_nan`` of ``vector_math``, so its
    machine code holds theirs: after ``vector_math.py`` changes, a new process compiles it again (Numba alone
    checks only ``columns.py`` and would load the old code) -- while a change to a module without compiled
    functions keeps the cache."""
    site = tmp_path / "site"
    shutil.copytree(os.path.join(ROOT, "chainfb"), site / "chainfb",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "CHAINFB_CACHE", "XDG_CACHE_HOME")}
    env["PYTHONPATH"] = ""

    def run():
        r = subprocess.run([sys.executable, "-c", EDITED_PROBE.format(site=str(site))], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        out = json.loads(line[len("RESULT "):])
        assert out["chainfb"].startswith(str(site)), out
        return out["max"], out["hits"]

    assert run() == (3.0, 0)  # compiled
    assert run() == (3.0, 1)  # loaded from the cache beside the source
    fst = site / "chainfb" / "fst.py"
    fst.write_text(fst.read_text() + "\n# no compiled function here\n")
    assert run() == (3.0, 1)
    vm = site / "chainfb" / "engines" / "vector_math.py"
    old = "    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))\n"
    assert vm.read_text().count(old) == 1
    vm.write_text(vm.read_text().replace(old, old.replace("\n", " + 1.0\n")))
    assert run() == (4.0, 0)  # the new row_max, compiled into a new frame_max
