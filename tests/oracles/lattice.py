"""A batch lattice run through the per-graph loop oracle
(:func:`oracles.fst.reference_forward_backward`), one sequence at a time:
the engine protocol's ``(loglike [N], posteriors [T, C])`` with no engine
code involved, so a compiler and its score map can be checked on their own."""

import numpy as np

from oracles.fst import reference_forward_backward


def lattice_forward_backward(lat, X, lengths):
    """``(loglike [N], post [T, C])`` of ``lat`` with compact scores ``X [T, C]``."""
    X = np.asarray(X, dtype=np.float64)
    T, C = X.shape
    N = lat.num_sequences
    loglike = np.full(N, -np.inf)
    post = np.zeros((T, C))
    g = lat.batch.seq_to_graph
    for n in range(N):
        fst = lat.batch.fsts[int(g[n])]
        cols = np.arange(lat.col_offsets[n], lat.col_offsets[n + 1])
        pdfs = lat.col_pdf[cols]
        P = int(fst.pdf.max()) + 1 if fst.num_arcs else 1
        scores = np.full((T, P), -np.inf)
        scores[:, pdfs] = X[:, cols]
        loglike[n], p = reference_forward_backward(fst, scores, int(lengths[n]))
        post[:, cols] = p[:, pdfs]
    return loglike, post
