"""Where the compiled CPU engine keeps its machine code, and a notice while
it compiles.

Numba compiles the engine (:mod:`~chainfb.engines.numba_log`) and the
transducer score maps (:mod:`chainfb.transducer.maps.cells`) the first time a
process calls them -- about a minute of one core; the few functions the GPU
path runs on the host (CTC's compiler, the CUDA engine's index arrays), a few
seconds -- and keeps the result on
disk, so that later processes load it in about a second.  Numba's own
``cache=True`` keeps it next to the source (``__pycache__``) or, where
that is not writable, in ``~/.cache/numba``; where neither is writable (a
read-only install with a read-only or missing home directory: clusters,
containers), ``cache=True`` fails at import.  :func:`njit` declares the
functions with this module's cache instead, which looks, in order, for:

1. ``NUMBA_CACHE_DIR``, when the user set it (Numba's own override);
2. the ``__pycache__`` directory next to the source (a writable install);
3. chainfb's per-user cache: ``$CHAINFB_CACHE/numba`` if set, else
   ``$XDG_CACHE_HOME/chainfb/numba``, else ``~/.cache/chainfb/numba``;
4. a per-user directory in the temporary directory
   (``<tmp>/chainfb-<uid>/numba``, mode 0700);

the first one writable is used (one subdirectory per source directory).
Where none is, the functions are compiled in every process, as without a
cache.  No environment variable or Numba setting of the process is changed.

A compiled function holds the code of the functions it calls, which may be
in other modules (the engine's modules inline each other's and
:mod:`~chainfb.engines.vector_math`'s), while Numba checks only the
function's own source file before it loads the cached result.  So the
cache of a chainfb function is valid only for the sources of every chainfb
module that declares compiled functions (those that name this module) as
they were when it was compiled: changing any of them compiles them all
again.

While chainfb's functions compile, the logger ``chainfb`` says so once per
process (a warning: one line on stderr when logging is not configured),
with the directory the result goes to.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile
from collections.abc import Callable
from typing import Any

__all__ = ["njit", "cache_dirs", "compiled"]

try:
    import numba
    from numba.core import caching
    from numba.core import event as _event
except ImportError:  # no Numba: nothing to compile (the engines fall back to NumPy)
    numba = None

_log = logging.getLogger("chainfb")
_ours: set = set()  # ids of the dispatchers declared through njit
_compiled = [0]  # chainfb functions compiled (not loaded from a cache) in this process
_noticed = [False]


def _user_root():
    """chainfb's per-user cache directory for Numba (see the module docstring), or None."""
    if os.environ.get("CHAINFB_CACHE"):
        return os.path.join(os.environ["CHAINFB_CACHE"], "numba")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "chainfb", "numba") if os.path.isabs(base) else None


def _temp_root():
    """``<tmp>/chainfb-<uid>/numba``, its parent created private to this user; None when it cannot be (or is
    someone else's, or a link)."""
    top = os.path.join(tempfile.gettempdir(), f"chainfb-{os.getuid()}")
    try:
        os.makedirs(top, mode=0o700, exist_ok=True)
        st = os.lstat(top)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return os.path.join(top, "numba")


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the chainfb package
_digest: dict = {}


def _sources_digest() -> bytes:
    """A digest of the sources of every chainfb module that declares compiled functions (those that name this
    module), read once per process."""
    if not _digest:
        h = hashlib.sha256()
        for d, dirs, files in os.walk(_ROOT):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    with open(os.path.join(d, f), "rb") as fh:
                        text = fh.read()
                    if b"numba_cache" in text:
                        h.update(os.path.relpath(os.path.join(d, f), _ROOT).encode() + b"\0" + text)
        _digest["sources"] = h.digest()
    return _digest["sources"]


def cache_dirs() -> list:
    """The directories chainfb's own locators try, in order, after ``NUMBA_CACHE_DIR`` and ``__pycache__``
    (each one's subdirectories are per source directory)."""
    return [d for d in (_user_root(), _temp_root()) if d is not None]


def compiled() -> int:
    """How many of chainfb's functions this process has compiled rather than loaded from a cache."""
    return _compiled[0]


if numba is not None:
    _InTree = getattr(caching, "InTreeCacheLocator", None) or caching._InTreeCacheLocator
    _UserProvided = getattr(caching, "UserProvidedCacheLocator", None) or caching._UserProvidedCacheLocator

    class _Stamped:
        """A locator whose source stamp, for a function of chainfb, also covers :func:`_sources_digest`."""

        def get_source_stamp(self):
            stamp = super().get_source_stamp()
            if os.path.abspath(self._py_file).startswith(_ROOT + os.sep):
                return stamp, _sources_digest()
            return stamp

    class _RootLocator(_InTree):
        """A cache in ``<root()>/<source directory name>_<hash of its path>`` (as Numba's user-wide
        locator names it); no locator when ``root()`` is None or not writable."""

        root = staticmethod(lambda: None)

        def __init__(self, py_func, py_file):
            super().__init__(py_func, py_file)
            self._cache_path = os.path.join(self.root(), self.get_suitable_cache_subpath(py_file))

        @classmethod
        def from_function(cls, py_func, py_file):
            if cls.root() is None:
                return None
            return super().from_function(py_func, py_file)

    class _UserLocator(_RootLocator):
        root = staticmethod(_user_root)

    class _TempLocator(_RootLocator):
        root = staticmethod(_temp_root)

    class _Impl(caching.CompileResultCacheImpl):
        _locator_classes = [type(c.__name__, (_Stamped, c), {}) for c in (_UserProvided, _InTree, _UserLocator,
                                                                          _TempLocator)]

    class _FunctionCache(caching.FunctionCache):
        _impl_class = _Impl

    class _Notice(_event.Listener):
        """Counts the compilations of chainfb's functions and says once per process that they compile."""

        def on_start(self, event):
            d = event.data["dispatcher"]
            if id(d) not in _ours:
                return
            _compiled[0] += 1
            if not _noticed[0]:
                _noticed[0] = True
                cache = getattr(d, "_cache", None)
                where = getattr(cache, "cache_path", None)
                _log.warning(
                    "chainfb: compiling its CPU code with Numba (the CPU engine: about a minute of one core; "
                    "what the GPU path compiles on the host: seconds) "
                    + (f"(once: later processes load it from the cache, e.g. {where})" if where else
                       "(in every process: no writable cache directory; set CHAINFB_CACHE to one)"))

        def on_end(self, event):
            pass

    _event.register("numba:compile", _Notice())


def njit(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``numba.njit(**options)`` with the cache of this module (the module docstring) in place of
    ``cache=True``; without Numba, the function itself."""
    def declare(fn):
        if numba is None:
            return fn
        d = numba.njit(**options)(fn)
        try:
            d._cache = _FunctionCache(fn)  # what Dispatcher.enable_caching() sets, with these locators
        except (RuntimeError, OSError):  # no writable directory at all: compiled in every process
            pass
        _ours.add(id(d))
        return d

    return declare
