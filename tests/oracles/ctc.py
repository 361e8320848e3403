"""The CTC acceptor of one label sequence written arc by arc from its
definition (chainfb/ctc.py's module docstring), a reference for the
vectorised compiler :func:`chainfb.ctc._ctc_batch`."""

import numpy as np

from chainfb import Fst


def ctc_fst(labels, blank: int) -> Fst:
    """Start 0, then state ``p + 1`` for position ``p`` of ``blank, y_1,
    blank, ..., y_U, blank``; every arc into ``p + 1`` reads ``l'_p``."""
    ext = [blank]
    for y in labels:
        ext += [int(y), blank]
    arcs = [(0, 1)] + ([(0, 2)] if len(ext) > 1 else [])
    for p in range(len(ext)):
        arcs.append((p + 1, p + 1))  # stay
        if p + 1 < len(ext):
            arcs.append((p + 1, p + 2))  # advance
        if p % 2 == 1 and p + 2 < len(ext) and ext[p + 2] != ext[p]:
            arcs.append((p + 1, p + 3))  # skip the blank between two different labels
    final = np.full(len(ext) + 1, -np.inf)
    final[len(ext)] = final[len(ext) - 1] = 0.0
    src, dst = np.array(arcs).T
    return Fst(len(ext) + 1, 0, src, dst, [ext[d - 1] for d in dst], np.zeros(len(arcs)), final)
