"""Stopping a run without losing work: SIGTERM stops it as Ctrl-C does, and neither signal cuts a checkpoint write
in half.

- :func:`terminate_as_interrupt`: a block in which SIGTERM (what ``kill``, schedulers and container runtimes send)
  raises :class:`Terminated`, a ``KeyboardInterrupt``, so the code that cleans up after Ctrl-C runs for it too.
- :func:`held`: a block during which SIGINT and SIGTERM are recorded instead of acted on; when the block ends, the
  signal is delivered again to the handler that was in place before.  A checkpoint and the outputs that belong to
  it are written inside such a block: Ctrl-C while they are written keeps the finished epoch, and the run stops
  right after.  (A ``KeyboardInterrupt`` raised in the middle of ``torch.save`` reaches the caller as a
  ``RuntimeError`` from its zip writer, ``unexpected pos``, after the epoch's checkpoint is lost.)

Signal handlers belong to the main thread: called from another thread, both leave the handlers alone.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

__all__ = ["Terminated", "terminate_as_interrupt", "held", "SIGNALS"]

#: the signals :func:`held` holds back
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """The run received SIGTERM (see :func:`terminate_as_interrupt`)."""


def _raise_terminated(signum, frame):
    raise Terminated(f"signal {signal.Signals(signum).name}")


@contextmanager
def terminate_as_interrupt():
    """``with terminate_as_interrupt(): ...`` -- inside the block SIGTERM raises :class:`Terminated` in the main
    thread; the handler before the block is put back after it.  Outside the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


@contextmanager
def held():
    """``with held(): ...`` -- SIGINT and SIGTERM received inside the block take effect when it ends (the first
    one received, through the handler in place before the block); an exception raised inside the block
    propagates as usual, and then the held signal is dropped.  Signals that are ignored (``SIG_IGN``) or handled
    outside Python stay as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    before = {}
    for sig in SIGNALS:
        handler = signal.getsignal(sig)
        if handler is None or handler == signal.SIG_IGN:
            continue
        before[sig] = handler
        signal.signal(sig, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if received:
        signal.raise_signal(received[0])
