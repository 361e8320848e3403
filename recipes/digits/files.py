"""Files a recipe writes, safe against interruption and against a second run
on the same directory: atomic writes through unique temporary names, and a
directory lock.

- :func:`atomic_write`: write into a fresh temporary file in the target's
  directory, fsync it, then ``os.replace`` it over the target (and fsync the
  directory): a reader (or a rerun after a kill or a crash) sees the old file
  or the new one, never half of one, and two writers never share a
  temporary name.
- :class:`DirLock`: an advisory ``fcntl`` lock on ``<dir>/.lock``; the
  second run on a directory waits for it (the corpus cache) or stops with
  :class:`DirectoryBusy` (an output directory).  The lock dies with its
  process, so a killed run never leaves a stale lock.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager

__all__ = ["atomic_write", "save_figure", "DirLock", "DirectoryBusy"]


@contextmanager
def atomic_write(path: str, mode: str = "w", suffix: str = ""):
    """``with atomic_write(path) as f: ...`` writes ``path`` atomically.

    ``suffix`` is kept on the temporary name (``np.savez`` appends ``.npz``
    to names without it).  On an exception the temporary file is removed and
    ``path`` is untouched."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=suffix + ".tmp", dir=d)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 -> what open() would have given
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(d)  # the rename itself survives a crash
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # a directory that cannot be opened for reading: the rename stands, unsynced
        return
    try:
        os.fsync(fd)
    except OSError:  # file systems that do not sync directories
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_figure(fig, path: str) -> None:
    """Lay out a matplotlib figure, write it as a PNG atomically and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_write(path, "wb", suffix=".png") as f:
        fig.savefig(f, dpi=100, format="png")
    plt.close(fig)


class DirectoryBusy(RuntimeError):
    """Another process holds the directory's lock."""


class DirLock:
    """Advisory lock on ``directory`` (the file ``.lock`` in it).

    ``wait=True`` blocks until the other holder is done; ``wait=False``
    raises :class:`DirectoryBusy` naming the directory and the holder's pid."""

    def __init__(self, directory: str, wait: bool = True):
        self.directory = directory
        self.wait = wait
        self._fd = None

    def __enter__(self):
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DirectoryBusy(f"{self.directory} is in use by another run (pid {holder}); wait for it to finish "
                                f"or choose another directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc):
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        return False
