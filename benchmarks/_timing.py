"""Single-call timings through ``torch.utils.benchmark.Timer``, for the benchmarks that take the least (or the
median) of a few calls of one step: each reading is one call (``number=1``) after the Timer's own warm-up calls, at
torch's current thread count (the Timer's default is one thread), with the device synchronized around the reading
where an accelerator is present (the Timer's default clock)."""
from __future__ import annotations

from collections.abc import Callable


def call_times(fn: Callable[[], object], repeat: int, timer: Callable[[], float] | None = None) -> list[float]:
    """Seconds of ``repeat`` single calls of ``fn``, in order; ``timer`` another clock (``time.process_time``: CPU
    seconds of this process), else the Timer's (wall time, the device synchronized)."""
    import torch
    from torch.utils.benchmark import Timer

    kw = {} if timer is None else {"timer": timer}
    t = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads(), **kw)
    return [t.timeit(number=1).times[0] for _ in range(repeat)]
