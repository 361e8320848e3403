"""Running a test body on several threads at once."""

import sys
import threading


def in_threads(work, n: int, switch: float = 1e-6) -> list:
    """Run ``work(k)`` for ``k in range(n)``, each on its own thread, all at
    once, with the interpreter switching threads every ``switch`` seconds
    (as often as it can by default); returns the exceptions they raised."""
    errors = []

    def run(k):
        try:
            work(k)
        except Exception as e:  # noqa: BLE001 -- returned to the test
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(switch)
    try:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return errors
