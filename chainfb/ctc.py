"""CTC compiled into the engine: :func:`ctc_graph` (the CTC topology as one
acceptor over vocabulary indices per sequence) and :func:`ctc_loss`
(``torch.nn.functional.ctc_loss``'s signature and numbers).

The graph of a label sequence ``y_1..y_U`` walks the extended sequence
``l' = (blank, y_1, blank, y_2, ..., y_U, blank)``.  State 0 is the start
(nothing read yet); state ``p + 1`` means "the last frame was read as
``l'_p``", so every arc into state ``p + 1`` carries pdf ``l'_p``:

- the start goes to ``l'_0`` (blank) and ``l'_1`` (``y_1``);
- every position has a self-loop (a blank or a label repeated over frames)
  and an arc to the next position;
- a label position ``p`` is also reached from ``p - 2`` (skipping the blank
  between two labels) when ``y`` differs there (``l'_p != l'_{p-2}``);
- the last blank and the last label are final (the start too when ``U =
  0``, so that zero frames and zero labels cost 0, as in torch).

All arc and final weights are 0: the scores are the log-probs, gathered
per frame by the pdf score map (Kaldi's strided column gather) straight
from ``log_probs [T, N, C]``, viewed as ``[N, T, C]`` without a copy.  The
engine does the rest; there is no CTC recursion here.

A new label set (every training step) is compiled in one compiled pass
(:func:`_ctc_arrays`, Numba) that also writes the arcs' order by destination
and each sequence's columns, which the batch and the lattice would otherwise
derive by sorting; where Numba does not run, by :func:`_ctc_batch`'s array
operations.  Both give the same arrays (the tests compare them with the
graphs written arc by arc, ``tests/oracles/ctc.py``).

Gradient convention: the gradient w.r.t. ``log_probs`` is the true one
(minus the label posteriors, as for free inputs; it passes
``gradcheck``).  ``torch.nn.functional.ctc_loss`` returns ``exp(log_probs)
- posteriors`` instead, which differs from it by a term that
``log_softmax``'s backward removes: for log-probs computed by
``log_softmax`` the gradients w.r.t. the logits are the same.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import numpy as np
import torch

from ._cache import LRU
from . import checks, engines
from ._arrays import Ints
from .api import PdfCriterion
from .criterion import apply
from .cuda.interop import torch_place
from .engines import numba_log
from .engines.cuda_memory import packing
from .engines.numba_cache import njit
from .engines.numba_log.arrays import counting_order
from .batch import FstBatch
from .lattice import Lattice
from .score_map import PdfScoreMap

__all__ = ["ctc_graph", "ctc_loss", "CtcCriterion", "CtcTargets"]


def _labels(targets, target_lengths) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths [N], labels [sum(lengths)])``, int64: every sequence's
    labels concatenated, from padded ``[N, S]`` or concatenated 1-D targets
    (or a list of label lists); ``target_lengths`` is None or a checked
    int64 array."""
    if isinstance(targets, (list, tuple)) and targets and not np.isscalar(targets[0]) and target_lengths is None:
        rows = []
        for i, r in enumerate(targets):
            try:
                rows.append(checks.int_array(r, f"targets[{i}]", 1))
            except ValueError:
                raise ValueError(f"targets[{i}]: expected a 1-D label list") from None
        return np.array([len(r) for r in rows], dtype=np.int64), np.concatenate(rows)
    try:
        tg = checks.int_array(targets, "targets")
    except ValueError as e:  # NumPy's own error for ragged lists does not name the argument
        if str(e).startswith("targets"):
            raise
        raise TypeError(f"targets: expected integers, got {type(targets).__name__}") from None
    if tg.ndim == 2:
        n, S = tg.shape
        if target_lengths is None:
            lens = np.full(n, S, dtype=np.int64)
        else:
            lens = target_lengths
            if lens.shape != (n,):
                raise ValueError(f"target_lengths: expected shape ({n},) to match targets [N={n}, S], "
                                 f"got {tuple(lens.shape)}")
        if n and (lens.min() < 0 or lens.max() > S):
            bad = lens[(lens < 0) | (lens > S)][0]
            raise ValueError(f"target_lengths: every length must lie in [0, S={S}] (targets' width), got {bad}")
        return lens, tg[np.arange(S) < lens[:, None]]
    if tg.ndim == 1:
        if target_lengths is None:
            return np.array([len(tg)], dtype=np.int64), tg
        lens = target_lengths
        if lens.size and lens.min() < 0:
            raise ValueError(f"target_lengths: lengths must be >= 0, got {lens.min()}")
        if int(lens.sum()) != tg.shape[0]:
            raise ValueError(f"target_lengths: concatenated targets hold {tg.shape[0]} labels but the lengths "
                             f"sum to {int(lens.sum())}")
        return lens, tg
    raise ValueError(f"targets: expected a padded [N, S] or a concatenated 1-D tensor, got shape {tuple(tg.shape)}")


def _check_labels(lens: np.ndarray, labels: np.ndarray, C: int | None) -> None:
    """A ``ValueError`` naming the first label outside ``[0, C)`` (``C`` None:
    the first negative one) and its sequence."""
    bad = labels < 0 if C is None else (labels < 0) | (labels >= C)
    if bad.any():
        i = int(np.argmax(bad))
        seq = int(np.searchsorted(np.cumsum(lens), i, side="right"))
        if C is None:
            raise ValueError(f"targets: label {labels[i]} (sequence {seq}) is negative")
        raise ValueError(f"targets: label {labels[i]} (sequence {seq}) is outside the vocabulary [0, C={C})")


def _ctc_batch(U: np.ndarray, y: np.ndarray, blank: int) -> FstBatch:
    """The CTC acceptors of ``N`` label sequences (see the module
    docstring), built for all sequences at once as one :class:`FstBatch`:
    ``U [N]`` their lengths, ``y [sum(U)]`` their labels concatenated.

    Sequence ``n`` (``U`` labels, ``P = 2 U + 1`` positions) owns ``P + 1``
    states: its start, then one per position.  Each state's arcs, in the
    canonical order of :class:`Fst` (by source): the start's to positions 0
    and 1; a position's self-loop, its arc to the next position, and (a
    label position whose next label differs) its skip over the blank."""
    N = len(U)
    so = np.zeros(N + 1, dtype=np.int64)  # each sequence's first state (its start)
    np.cumsum(2 * U + 2, out=so[1:])
    S = int(so[-1])
    yo = np.zeros(N + 1, dtype=np.int64)  # each sequence's first label in y
    np.cumsum(U, out=yo[1:])
    # the state of label j of y: its sequence's start + 2 + twice its index there
    lab_state = np.repeat(so[:-1] + 2 - 2 * yo[:-1], U) + 2 * np.arange(len(y), dtype=np.int64)
    lab = np.full(S, blank, dtype=np.int64)  # the label every arc into a state reads
    lab[lab_state] = y
    # skips: from label j to label j + 1 of the same sequence when they differ
    later = np.ones(len(y), dtype=bool)  # label j is followed by another of its sequence
    later[yo[1:][U > 0] - 1] = False
    skip_src = lab_state[:-1][later[:-1] & (y[1:] != y[:-1])]
    # arcs a state: a start 2 (1 when U = 0); a position its stay, its advance (not the last), its skip
    counts = np.full(S, 2, dtype=np.int64)
    counts[so[1:] - 1] = 1
    counts[so[:-1]] = np.where(U > 0, 2, 1)
    counts[skip_src] += 1
    off = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    state = np.arange(S, dtype=np.int64)
    src = np.repeat(state, counts)
    dst = np.empty(int(off[-1]), dtype=np.int64)
    dst[off[:-1]] = state  # stay
    second = off[:-1][counts > 1] + 1
    dst[second] = state[counts > 1] + 1  # advance
    starts = so[:-1]
    dst[off[starts]] = starts + 1  # the start's arcs: to positions 0 and 1
    dst[off[starts[U > 0]] + 1] = starts[U > 0] + 2
    dst[off[skip_src] + 2] = skip_src + 2  # skip the blank between two different labels
    final = np.full(S, -np.inf)
    final[so[1:] - 1] = 0.0  # the last blank
    final[so[1:] - 2] = 0.0  # the last label (the start itself when U = 0)
    return FstBatch.packed(so, off[so], starts.copy(), final, src, dst, lab[dst])


@njit(nogil=True)
def _ctc_arrays(U: np.ndarray, y: np.ndarray, blank: np.int64, width: np.int64) -> tuple:
    """:func:`_ctc_batch`'s arrays in one compiled pass, with the indexes
    :meth:`FstBatch.packed` takes: ``(so, ao, start, final, src, dst, pdf,
    (fwd_order, in_ptr, bwd_order, out_ptr), (col_ptr, col_pdfs,
    col_local))``, each the value the NumPy compiler and the batch derive
    (tests/test_ctc.py checks them array for array).

    The arcs are written by source, as :func:`_ctc_batch` orders them (so
    ``bwd_order`` is the identity and ``out_ptr`` the arcs' offsets); the
    order by destination is a counting sort of ``dst`` (stable: by arc id
    within a state).  A sequence's columns are its distinct pdfs, sorted:
    the blank and its labels, marked in a table of the vocabulary (``width``
    entries: the largest label or blank, plus one) stamped with the
    sequence's index."""
    N = U.shape[0]
    so = np.zeros(N + 1, np.int64)
    for n in range(N):
        so[n + 1] = so[n] + 2 * U[n] + 2
    S = so[N]
    # arcs a state: the start 2 (1 when U = 0); a position its stay, its advance (not the last), its skip
    out_ptr = np.zeros(S + 1, np.int64)
    j = 0  # the label of y at hand
    for n in range(N):
        s0, u = so[n], U[n]
        out_ptr[s0 + 1] = 2 if u > 0 else 1
        for p in range(2 * u + 1):
            c = 1 if p == 2 * u else 2
            if p % 2 == 1 and p < 2 * u - 1 and y[j + p // 2 + 1] != y[j + p // 2]:
                c += 1
            out_ptr[s0 + 2 + p] = c
        j += u
    for s in range(S):
        out_ptr[s + 1] += out_ptr[s]
    A = out_ptr[S]
    src = np.empty(A, np.int64)
    dst = np.empty(A, np.int64)
    pdf = np.empty(A, np.int64)
    final = np.full(S, -np.inf)
    start = so[:N].copy()
    ao = np.empty(N + 1, np.int64)
    lab = np.empty(S, np.int64)  # the pdf every arc into a state reads
    j = 0
    for n in range(N):
        s0, u = so[n], U[n]
        ao[n] = out_ptr[s0]
        lab[s0] = blank
        for p in range(2 * u + 1):
            lab[s0 + 1 + p] = y[j + p // 2] if p % 2 == 1 else blank
        a = out_ptr[s0]
        for d in range(1, 3 if u > 0 else 2):  # the start's arcs: to positions 0 and 1
            src[a], dst[a] = s0, s0 + d
            a += 1
        for p in range(2 * u + 1):
            s = s0 + 1 + p
            for d in range(out_ptr[s + 1] - out_ptr[s]):  # stay, advance, skip
                src[a], dst[a] = s, s + d
                a += 1
        final[so[n + 1] - 1] = 0.0  # the last blank
        final[so[n + 1] - 2] = 0.0  # the last label (the start itself when U = 0)
        j += u
    ao[N] = A
    for a in range(A):
        pdf[a] = lab[dst[a]]
    fwd_order, in_ptr = counting_order(dst, S)  # by destination, stably
    bwd_order = np.arange(A)
    # columns: each sequence's distinct pdfs, sorted, and each arc's index among them
    stamp = np.full(width, -1, np.int64)
    rank = np.empty(width, np.int64)
    col_ptr = np.zeros(N + 1, np.int64)
    pdfs = np.empty(y.shape[0] + N, np.int64)
    local = np.empty(A, np.int64)
    k = 0
    for n in range(N):
        k0 = k
        for s in range(so[n] + 1, so[n + 1]):
            if stamp[lab[s]] != n:
                stamp[lab[s]] = n
                pdfs[k] = lab[s]
                k += 1
        pdfs[k0:k].sort()
        for i in range(k0, k):
            rank[pdfs[i]] = i - k0
        for a in range(ao[n], ao[n + 1]):
            local[a] = rank[pdf[a]]
        col_ptr[n + 1] = k
    return (so, ao, start, final, src, dst, pdf, (fwd_order, in_ptr, bwd_order, out_ptr),
            (col_ptr, pdfs[:k].copy(), local))


#: the widest vocabulary (largest label or blank, plus one) :func:`_ctc_arrays` takes a table of, beyond
#: four entries a label: wider ones (sparse label ids, only through :func:`ctc_graph`) take the NumPy compiler
TABLE_ENTRIES = 1 << 20


def _ctc_batch_compiled(U: np.ndarray, y: np.ndarray, blank: int) -> FstBatch:
    """:func:`_ctc_batch` by :func:`_ctc_arrays` (compiled), its indexes handed to the batch; by
    :func:`_ctc_batch` itself where the labels' ids are too sparse for its table (:data:`TABLE_ENTRIES`)."""
    width = max(blank, int(y.max(initial=0))) + 1
    if width > 4 * len(y) + TABLE_ENTRIES:
        return _ctc_batch(U, y, blank)
    so, ao, start, final, src, dst, pdf, index, columns = _ctc_arrays(U, y, np.int64(blank), np.int64(width))
    return FstBatch.packed(so, ao, start, final, src, dst, pdf, index=index, columns=columns)


def _compiler():
    """The CTC compiler this process uses: the compiled one where Numba runs (see
    :func:`chainfb.engines.numba_log.available`), else the NumPy one."""
    return _ctc_batch_compiled if numba_log.available() else _ctc_batch


def ctc_graph(targets: torch.Tensor | np.ndarray | Sequence[Sequence[int]], target_lengths: Ints | None = None,
              blank: int = 0) -> FstBatch:
    """The CTC topology of each label sequence, as one :class:`FstBatch`
    (one acceptor per sequence over pdfs = vocabulary indices).

    Parameters
    ----------
    targets : padded ``[N, S]`` or concatenated 1-D integer tensor/array,
        or a list of N label lists.
    target_lengths : ``[N]`` ints, optional (default: full rows of a padded
        ``targets``; required to split concatenated targets into several
        sequences).
    blank : int >= 0, the blank's index.

    Returns
    -------
    FstBatch
        Sequence ``n``'s acceptor has ``2 U_n + 2`` states (start 0, then
        one per position of ``blank, y_1, blank, ..., y_U, blank``) and arc
        weights 0; with scores ``log_probs[n]`` (``[T, C]``) its
        log-likelihood over ``T`` frames is minus the CTC loss.  Mix it with
        other graphs through :func:`chainfb.forward_backward` /
        :class:`chainfb.PdfCriterion`.
    """
    blank = checks.blank(blank)
    return _compiler()(*_label_sets(targets, target_lengths), blank)


def _label_sets(targets, target_lengths) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths [N], labels)`` of :func:`ctc_graph`'s arguments (:func:`_labels`), checked: at least one
    sequence, no negative label."""
    if target_lengths is not None:
        target_lengths = checks.int_array(target_lengths, "target_lengths").reshape(-1)
    lens, labels = _labels(targets, target_lengths)
    if not len(lens):
        raise ValueError("targets: expected at least one sequence")
    _check_labels(lens, labels, None)
    return lens, labels


def _compile(lens: np.ndarray, labels: np.ndarray, blank: int):
    """The lattice and score map of the CTC graphs of the label sequences
    ``labels`` (concatenated, ``lens [N]`` long; cached per label set and
    blank)."""
    key = (blank, lens.tobytes(), labels.tobytes())

    def build():
        lattice = Lattice.of(_compiler()(lens, labels, blank))
        return lattice, PdfScoreMap(lattice.col_seq, lattice.col_pdf, "log_probs")

    return _compiled.get(key, build)


#: compiled CTC lattices and their score maps, per label set and blank
_compiled = LRU(8)


class CtcTargets:
    """A batch of CTC label sequences compiled ahead of :func:`ctc_loss`, which
    takes it in place of ``targets``.

    A new label set costs a GPU training step its host work before the
    first kernel: the labels' transfer and checks, the graphs' compile and
    the engine's index arrays (about half of such a step's host time at
    short shapes, see docs/gpu.md).  Made where the batch is made -- a
    ``DataLoader``'s ``collate_fn``, which runs in its worker processes --
    that work overlaps the training step; the object pickles with what it
    built, as one tensor of its arrays (which the loader hands over through
    shared memory), and the step then uploads the arrays and runs::

        def collate(batch):
            ...
            return feats, feat_lens, chainfb.CtcTargets(targets, target_lengths, device="cuda")

        feats, feat_lens, targets = next(iter(loader))
        loss = chainfb.ctc_loss(log_probs, targets, input_lengths, targets.target_lengths)

    Parameters
    ----------
    targets, target_lengths : as :func:`ctc_graph` (padded ``[N, S]`` or
        concatenated 1-D integer tensor/array, or a list of label lists;
        ``[N]`` ints).
    blank : int >= 0, the blank's index (:func:`ctc_loss` must be given the
        same).
    device : where the loss will run (``"cpu"``, ``"cuda"``, a
        ``torch.device``; None: ``"cpu"``): which engine's index arrays are
        built now.  Nothing is put on a GPU here.

    Attributes
    ----------
    target_lengths : int64 NumPy ``[N]``
    labels : int64 NumPy ``[sum(target_lengths)]``, the sequences' labels
        concatenated.
    blank : int
    lattice : :class:`~chainfb.lattice.Lattice` of the CTC graphs.
    score_map : its :class:`~chainfb.score_map.PdfScoreMap`.
    """

    def __init__(self, targets: torch.Tensor | np.ndarray | Sequence[Sequence[int]],
                 target_lengths: Ints | None = None, blank: int = 0, device: str | torch.device | None = None):
        self.blank = checks.blank(blank)
        gpu = torch.device("cpu" if device is None else device).type == "cuda"
        self.target_lengths, self.labels = _label_sets(*_to_host(targets=targets, target_lengths=target_lengths))
        self.lattice, self.score_map = _compile(self.target_lengths, self.labels, self.blank)
        self._built = engines.prepare(self.lattice, gpu)

    @property
    def num_sequences(self) -> int:
        """``N``, the number of label sequences."""
        return len(self.target_lengths)

    def __reduce__(self) -> tuple:
        """Pickled as a small header and one ``uint8`` tensor holding every array the object keeps (the graphs',
        the lattice's, the index arrays built; the lattice's memo travels empty, the index arrays ride beside
        it): a ``DataLoader`` hands a tensor from its worker to the main process through shared memory, so the
        main process maps the arrays instead of unpickling them."""
        buffers: list = []
        header = pickle.dumps(self.__dict__, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        starts, end = packing([r.nbytes for r in raws])
        flat = np.empty(end, dtype=np.uint8)
        for a, r in zip(starts, raws):
            flat[a: a + r.nbytes] = np.frombuffer(r, dtype=np.uint8)
        layout = [(a, r.nbytes) for a, r in zip(starts, raws)]
        return _unpickled_targets, (header, torch.from_numpy(flat), layout)

    def _keep_built(self) -> None:
        """Seed the lattice's memo with the index arrays the object carries."""
        for key, value in self._built.items():
            self.lattice.cache(key, lambda v=value: v)

    def __repr__(self) -> str:
        return f"CtcTargets(num_sequences={self.num_sequences}, labels={len(self.labels)}, blank={self.blank})"


def _unpickled_targets(header: bytes, flat: torch.Tensor, layout: list) -> CtcTargets:
    """:meth:`CtcTargets.__reduce__`'s inverse: the arrays are views of ``flat``'s memory (no copy)."""
    memory = flat.numpy()
    state = pickle.loads(header, buffers=[memory[a: a + n] for a, n in layout])
    out = CtcTargets.__new__(CtcTargets)
    out.__dict__.update(state)
    out._keep_built()
    return out


class CtcCriterion(PdfCriterion):
    """CTC over ``log_probs [T, N, C]``: value = minus the CTC loss per
    sequence (the log-likelihood of the targets), gradient w.r.t.
    ``log_probs``.  It runs on ``log_probs.transpose(0, 1)``, the zero-copy
    ``[N, T, C]`` view, through the pdf column gather; the gradient is
    returned in that view of a buffer laid out like ``log_probs``.

    ``lattice`` (from :func:`ctc_graph`'s graphs), ``input_lengths`` a
    checked int64 ``[N]`` array; ``score_map`` defaults to the lattice's
    :class:`~chainfb.score_map.PdfScoreMap`."""

    name = "log_probs"

    def __init__(self, lattice: Lattice, input_lengths: np.ndarray, score_map: PdfScoreMap | None = None):
        self.lattice = lattice
        self.lengths = input_lengths
        self.score_map = score_map or PdfScoreMap(lattice.col_seq, lattice.col_pdf, self.name)
        self.clamp = self.leaky = self.value_dtype = None
        self._given = None

    def _grad_buffer(self, xp, arr):
        N, T, C = arr.shape
        return xp.zeros((T, N, C), dtype=arr.dtype).transpose(1, 0, 2)  # laid out like log_probs


def _to_host(**named):
    """The integer tensors among ``named`` (labels and lengths) as int64
    NumPy arrays of the same shapes, brought to the host in one transfer
    when they share a device; other values are returned as they are (the
    checks downstream take lists and arrays).  A tensor that is not of an
    integer dtype is a ``TypeError`` naming its argument."""
    tensors = {k: v for k, v in named.items() if isinstance(v, torch.Tensor)}
    for name, t in tensors.items():
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            checks.int_array(t, name)  # raises, naming the argument
    out = dict(named)
    if len({t.device for t in tensors.values()}) == 1:
        # (integers: no autograd to detach from; an int64 tensor is not converted, a call for nothing)
        flat = torch.cat([t.reshape(-1) if t.dtype == torch.int64 else t.reshape(-1).to(torch.int64)
                          for t in tensors.values()])
        host = flat.cpu().numpy()  # the one device -> host crossing
        pos = 0
        for name, t in tensors.items():
            out[name] = host[pos: pos + t.numel()].reshape(tuple(t.shape))
            pos += t.numel()
    else:
        out.update({name: checks.int_array(t, name) for name, t in tensors.items()})
    return tuple(out.values())


def ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor | CtcTargets, input_lengths: Ints | int,
             target_lengths: Ints | int | None, blank: int = 0, reduction: str = "mean",
             zero_infinity: bool = False) -> torch.Tensor:
    """The CTC loss, ``torch.nn.functional.ctc_loss``'s signature and numbers.

    Parameters
    ----------
    log_probs : ``[T, N, C]`` (or unbatched ``[T, C]``) float32/float64
        tensor, CPU or CUDA: per-frame log-probabilities (e.g.
        ``log_softmax`` outputs).
    targets : padded ``[N, S]`` or concatenated 1-D (``sum(target_lengths)``)
        integer tensor of labels in ``[0, C)``, none equal to ``blank``; or
        a :class:`CtcTargets` (the labels compiled ahead, e.g. in a
        ``DataLoader`` worker), whose ``blank`` must be ``blank``.
    input_lengths, target_lengths : ``[N]`` ints (tensors or sequences; an
        int for unbatched input).  With :class:`CtcTargets`,
        ``target_lengths`` may be None (its own); if given, they must be
        its ``target_lengths``.
    blank : int in ``[0, C)``.
    reduction : ``"none"`` (``[N]``), ``"sum"``, or ``"mean"``: each loss
        divided by its target length (clamped to at least 1), then the
        batch mean.
    zero_infinity : bool
        Infinite losses (no alignment fits) become 0, with zero gradient.

    Returns
    -------
    The loss, dtype of ``log_probs``, on its device.  Its gradient w.r.t.
    ``log_probs`` is the true gradient (minus the label posteriors per
    frame); see the module docstring for how it relates to torch's.
    """
    checks.tensor(log_probs, "log_probs", (torch.float32, torch.float64))
    reduction = checks.reduction(reduction)
    zero_infinity = checks.flag(zero_infinity, "zero_infinity")
    unbatched = log_probs.dim() == 2
    if unbatched:
        log_probs = log_probs.unsqueeze(1)
        if isinstance(targets, torch.Tensor) and targets.dim() == 1:
            targets = targets.unsqueeze(0)
    checks.tensor(log_probs, "log_probs", ndim=3, layout="[T, N, C]")
    T, N, C = log_probs.shape
    blank = checks.blank(blank, C)
    prepared = targets if isinstance(targets, CtcTargets) else None
    if prepared is not None:
        targets = None
        if prepared.blank != blank:
            raise ValueError(f"blank: {blank} is not the blank the targets were compiled with ({prepared.blank})")
        if prepared.num_sequences != N:
            raise ValueError(f"targets: {prepared.num_sequences} sequences do not match log_probs' batch size {N}")
    if isinstance(targets, torch.Tensor) and targets.dim() not in (1, 2):
        raise ValueError(f"targets: expected a padded [N, S] or a concatenated 1-D tensor, "
                         f"got shape {tuple(targets.shape)}")
    if isinstance(targets, torch.Tensor) and targets.dim() == 2 and targets.shape[0] != N:
        raise ValueError(f"targets: batch size {targets.shape[0]} does not match log_probs' batch size {N}")
    targets, input_lengths, target_lengths = _to_host(
        targets=targets, input_lengths=input_lengths, target_lengths=target_lengths)
    if prepared is not None and target_lengths is None:
        target_lengths = prepared.target_lengths
    if unbatched:
        input_lengths = checks.int_array(input_lengths, "input_lengths").reshape(-1)
        target_lengths = checks.int_array(target_lengths, "target_lengths").reshape(-1)
    il = checks.lengths(input_lengths, "input_lengths", N, T)
    tl = checks.lengths(target_lengths, "target_lengths", N)
    if prepared is None:
        lens, labels = _labels(targets, tl)
        _check_labels(lens, labels, C)
    else:
        lens, labels = prepared.target_lengths, prepared.labels
        if not np.array_equal(tl, lens):
            raise ValueError(f"target_lengths: {tl.tolist()} are not the lengths the targets were compiled with, "
                             f"{lens.tolist()} (CtcTargets.target_lengths; or pass None)")
        if labels.size and labels.max() >= C:
            _check_labels(lens, labels, C)
    if N == 0:
        costs = log_probs.sum((0, 2)) * 0
    else:
        lattice, score_map = (_compile(lens, labels, blank) if prepared is None else
                              (prepared.lattice, prepared.score_map))
        criterion = CtcCriterion(lattice, il, score_map)
        if reduction != "none" and not zero_infinity:  # the reduced loss in one step (criterion.apply's weights)
            return apply(log_probs.transpose(0, 1), criterion, weights=_weights(lattice, tl, reduction, log_probs))
        costs = -apply(log_probs.transpose(0, 1), criterion)
    if zero_infinity:
        costs = torch.where(torch.isinf(costs), torch.zeros_like(costs), costs)
    if unbatched:
        costs = costs.squeeze(0)
    if reduction == "none" or N == 0:  # (an empty batch: sum 0, mean NaN)
        return checks.reduce(costs, reduction)
    return (costs.reshape(-1) * checks.values_like(_shares(tl, reduction), costs)).sum()


def _weights(lattice: Lattice, target_lengths: np.ndarray, reduction: str, like: torch.Tensor) -> torch.Tensor:
    """Minus each sequence's share of the reduced loss (:func:`_shares`) as a tensor of ``like``'s dtype on its
    device, kept by the lattice (whose graphs fix the target lengths) per reduction, dtype, device and stream: a
    step with the labels of an earlier step copies nothing to the device for it."""
    key = ("ctc", "weights", reduction, str(like.dtype)) + torch_place(like.device)
    return lattice.cache(key, lambda: checks.values_like(-_shares(target_lengths, reduction), like))


def _shares(target_lengths: np.ndarray, reduction: str) -> np.ndarray:
    """Each sequence's weight in the reduced loss, ``[N]``: ``"mean"`` divides
    its loss by its target length (at least 1), then by ``N``; ``"sum"``
    weighs each 1."""
    if reduction == "mean":
        return 1.0 / np.maximum(target_lengths, 1) / len(target_lengths)
    return np.ones(len(target_lengths))
