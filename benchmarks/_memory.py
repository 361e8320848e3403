"""Peak resident memory of this process, for the benchmarks (Linux ``/proc``)."""


def status_bytes(key: str) -> int:
    """A ``/proc/self/status`` field in bytes (``"VmHWM:"`` the peak, ``"VmRSS:"`` the current resident size);
    0 where the field is missing."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> bool:
    """Reset the peak (``VmHWM``) to the current resident size; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False

