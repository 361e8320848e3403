"""Reference cycles among chainfb's objects: what a step leaves to Python's
cyclic collector instead of freeing it by reference counting."""

from __future__ import annotations

import gc
from collections.abc import Callable


def cyclic_garbage(step: Callable[[], object], repeat: int) -> list[str]:
    """The sorted names of chainfb's types among the objects that only the
    cyclic collector would free after ``repeat`` calls of ``step()`` (run
    with the collector off; everything collectable before is collected
    first)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(repeat):
            step()
        gc.collect()
        return sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("chainfb")})
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()
