"""Test helpers: RNN-T as step graphs for the engine, and a direct
differentiable RNN-T recursion to check it against (tests only)."""

import numpy as np
import torch

from chainfb import Fst, FstBatch, Lattice


def rnnt_reference(logits, targets, T_len, U_len, blank):
    """Direct float64 alpha recursion in torch (differentiable): -logP per utterance."""
    lp = torch.log_softmax(logits, dim=-1)
    out = []
    for b in range(logits.shape[0]):
        T, U = int(T_len[b]), int(U_len[b])
        alpha = {}
        for t in range(T):
            for u in range(U + 1):
                if t == 0 and u == 0:
                    alpha[t, u] = logits.new_zeros(())
                    continue
                terms = []
                if t > 0:
                    terms.append(alpha[t - 1, u] + lp[b, t - 1, u, blank])
                if u > 0:
                    terms.append(alpha[t, u - 1] + lp[b, t, u - 1, targets[b, u - 1]])
                alpha[t, u] = torch.logsumexp(torch.stack(terms), 0)
        out.append(-(alpha[T - 1, U] + lp[b, T - 1, U, blank]))
    return torch.stack(out)


def rnnt_step_case(rng, B=3, T=5, Umax=3, V=6, blank=0, T_len=(5, 3, 4), U_len=(3, 1, 0)):
    """Random float64 logits, the step graphs (state u: blank self-loop with
    pdf 2u, label arc u -> u+1 with pdf 2u+1), their lattice, the column
    layout ``colidx``, the score-map arguments (``sym``: kind 0 the blank,
    kind 1 the label) and the reference's ``targets`` / ``blank``."""
    T_len = np.asarray(T_len)
    U_len = np.asarray(U_len)
    targets = rng.integers(1, V, (B, Umax))
    logits = rng.normal(size=(B, T, Umax + 1, V))
    fsts = []
    for b in range(B):
        U = int(U_len[b])
        arcs = [(u, u, 2 * u, 0.0) for u in range(U + 1)] + [(u, u + 1, 2 * u + 1, 0.0) for u in range(U)]
        fsts.append(Fst.from_arcs(arcs, {U: 0.0}, num_states=U + 1))
    lat = Lattice.of(FstBatch(fsts))
    col_off = np.searchsorted(lat.col_seq, np.arange(B + 1))
    colidx = -np.ones((B, Umax + 1, 2), dtype=np.int32)
    for b in range(B):
        for u in range(U_len[b] + 1):
            colidx[b, u, 0] = col_off[b] + 2 * u
            if u < U_len[b]:
                colidx[b, u, 1] = col_off[b] + 2 * u + 1
    sym = np.stack([np.full((B, Umax + 1), blank), np.pad(targets, ((0, 0), (0, 1)), constant_values=-1)], axis=2)
    sym[:, :, 1][np.arange(Umax + 1)[None, :] >= U_len[:, None]] = -1
    args = dict(sym=sym, colidx=colidx, logit_lengths=T_len, target_lengths=U_len)
    return logits, lat, args, T + Umax, T_len, U_len, dict(targets=targets, blank=blank)
