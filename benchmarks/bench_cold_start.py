"""The first loss of a fresh process: what it costs with an empty Numba cache, and what the next process pays.

For each loss (``chainfb.ctc_loss``, ``chainfb.rnnt_loss``: a small batch, loss + ``backward()``) and each
install, two fresh processes one after the other, from an empty cache:

- ``writable``: a copy of the package whose ``__pycache__`` is writable (a checkout, a user's install);
- ``read-only``: the same copy read-only (clusters, containers): a read-only bind mount in a user and mount
  namespace of its own (``unshare -rm``) when run as root, the copy's write permissions removed otherwise;
  ``CHAINFB_CACHE`` points at an empty directory (chainfb's per-user cache, ``chainfb.engines.numba_cache``).

Printed per process: the seconds to import torch and chainfb, the seconds of the first loss + backward, the
number of chainfb functions it compiled (``numba_cache.compiled()``; 0: all loaded from the cache) and the lines
it wrote on stderr (the compile notice).  The copies and caches live in a temporary directory, removed at the end;
the checkout's own cache is not touched.

    python -m benchmarks.bench_cold_start [--losses ctc,rnnt] [--installs writable,read-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = r'''
import json, time
t0 = time.perf_counter()
import torch, chainfb
from chainfb.engines import numba_cache
t1 = time.perf_counter()
if {loss!r} == "ctc":
    lp = torch.randn(50, 2, 20, requires_grad=True)
    loss = chainfb.ctc_loss(lp.log_softmax(-1), torch.randint(1, 20, (2, 10)), torch.tensor([50, 42]),
                            torch.tensor([10, 7]))
else:
    logits = torch.randn(2, 12, 5, 10, requires_grad=True)
    loss = chainfb.rnnt_loss(logits, torch.randint(0, 7, (2, 4), dtype=torch.int32),
                             torch.tensor([12, 9], dtype=torch.int32), torch.tensor([4, 2], dtype=torch.int32))
loss.backward()
t2 = time.perf_counter()
assert chainfb.__file__.startswith({site!r}), chainfb.__file__
print("RESULT", json.dumps(dict(import_s=t1 - t0, first_s=t2 - t1, compiled=numba_cache.compiled())))
'''


def _copy(dst):
    shutil.copytree(os.path.join(ROOT, "chainfb"), os.path.join(dst, "chainfb"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))


def _runner(site, read_only, work):
    """``(argv prefix, site as the process sees it)`` for a probe on ``site``."""
    if not read_only:
        return [sys.executable, "-c"], site
    if os.geteuid() != 0:
        for d, _, files in os.walk(site):
            for f in files:
                os.chmod(os.path.join(d, f), 0o444)
            os.chmod(d, 0o555)
        return [sys.executable, "-c"], site
    mnt = os.path.join(work, "ro")
    os.makedirs(mnt, exist_ok=True)
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        raise SystemExit("bench_cold_start.py: error: running as root, and unshare -rm (for a read-only bind "
                         "mount) is not available; run as another user or with --installs writable")
    script = f'mount --bind {site} {mnt} && mount -o remount,bind,ro {mnt} && exec "{sys.executable}" -c "$1"'
    return ["unshare", "-rm", "sh", "-c", script, "probe"], mnt


def run(loss, install, tmp):
    work = tempfile.mkdtemp(prefix=f"{loss}-{install}-", dir=tmp)
    site = os.path.join(work, "site")
    _copy(site)
    argv, seen = _runner(site, install == "read-only", work)
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = seen  # the copy under test, as the probe's process sees it
    env["CHAINFB_CACHE"] = os.path.join(work, "cache")
    rows = []
    for proc in ("first", "second"):
        r = subprocess.run(argv + [PROBE.format(site=seen, loss=loss)], env=env, capture_output=True, text=True,
                           cwd=work)
        if r.returncode:
            raise SystemExit(f"bench_cold_start.py: error: the {loss} probe failed:\n{r.stderr[-3000:]}")
        (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        res = json.loads(line[len("RESULT "):])
        rows.append((loss, install, proc, res, [ln for ln in r.stderr.splitlines() if ln.strip()]))
    if install == "read-only" and os.geteuid() != 0:
        for d, _, _ in os.walk(site):
            os.chmod(d, 0o755)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--losses", default="ctc,rnnt", help="comma-separated: ctc, rnnt (default: %(default)s)")
    p.add_argument("--installs", default="writable,read-only",
                   help="comma-separated: writable, read-only (default: %(default)s)")
    a = p.parse_args(argv)
    losses, installs = a.losses.split(","), a.installs.split(",")
    for x in losses:
        if x not in ("ctc", "rnnt"):
            p.error(f"argument --losses: {x!r} is not ctc or rnnt")
    for x in installs:
        if x not in ("writable", "read-only"):
            p.error(f"argument --installs: {x!r} is not writable or read-only")
    print(f"{'loss':5} {'install':10} {'process':8} {'import s':>9} {'first loss s':>13} {'compiled':>9}  stderr")
    with tempfile.TemporaryDirectory(prefix="chainfb-cold-") as tmp:
        for loss in losses:
            for install in installs:
                for name, inst, proc, res, err in run(loss, install, tmp):
                    print(f"{name:5} {inst:10} {proc:8} {res['import_s']:9.1f} {res['first_s']:13.1f} "
                          f"{res['compiled']:9d}  {' | '.join(err) or '-'}", flush=True)


if __name__ == "__main__":
    main()
