"""k2's FSA training API (``import k2`` -> ``from chainfb.compat import
k2``): what icefall's and NeMo's CTC and LF-MMI training code calls, with
k2's names, arguments, conventions and numbers, the dense intersection
computed by chainfb's engine.

- FSAs: :class:`Fsa` (``from_str`` / ``from_openfst`` in k2's and
  OpenFst's text formats, ``to_str``, ``labels`` / ``aux_labels`` /
  ``scores``, ``requires_grad_``, FsaVec indexing), :class:`RaggedTensor`,
  :func:`to_str` (:mod:`chainfb.compat.k2.fsa`); :func:`create_fsa_vec`,
  :func:`index_fsa`, :func:`cat` (:mod:`chainfb.compat.k2.vec`).
- Graphs: :func:`linear_fsa`, :func:`linear_fst`, :func:`ctc_topo`,
  :func:`ctc_graph` (:mod:`chainfb.compat.k2.graphs`), and
  :func:`fst_to_fsa` for a :class:`chainfb.Fst`.
- Algorithms (:mod:`chainfb.compat.k2.ops`): :func:`arc_sort`,
  :func:`connect`, :func:`top_sort`, :func:`add_epsilon_self_loops`,
  :func:`remove_epsilon`, :func:`remove_epsilon_and_add_self_loops`,
  :func:`intersect`, :func:`compose`, :func:`invert`, :func:`determinize` --
  enough for icefall's ``CtcTrainingGraphCompiler``,
  ``BpeCtcTrainingGraphCompiler`` and ``MmiTrainingGraphCompiler``.
- Training (:mod:`chainfb.compat.k2.dense`, :mod:`chainfb.compat.k2.losses`):
  :class:`DenseFsaVec`, :func:`intersect_dense`,
  :func:`intersect_dense_pruned`, the lattice's ``get_tot_scores``,
  :func:`ctc_loss` / :class:`CtcLoss`.

k2's conventions hold throughout: state 0 is the start and the last state
the one final state, entered only by arcs labelled ``-1``; label 0 is
epsilon in graph algorithms and the blank in the dense intersection;
scores are log-probabilities.  What differs: intersections are exact where
k2 prunes to a beam; a dense lattice's arcs are not materialised (it
offers ``get_tot_scores``); FSA algorithms run on the host (the dense
intersection runs where the log-probs are, CUDA included); float64 scores
are accepted where k2 asserts float32.  ``docs/k2.md`` shows the switch.
"""

from .dense import DenseFsaVec, DenseLattice, intersect_dense, intersect_dense_pruned
from .fsa import Fsa, fsa_properties, to_str, to_str_simple
from .graphs import ctc_graph, ctc_topo, fst_to_fsa, linear_fsa, linear_fst
from .losses import CtcLoss, ctc_loss
from .ops import (add_epsilon_self_loops, arc_sort, compose, connect, determinize, intersect, invert,
                  remove_epsilon, remove_epsilon_and_add_self_loops, remove_epsilon_self_loops, top_sort)
from .ragged import RaggedTensor
from .vec import cat, create_fsa_vec, index_fsa

#: k2's generic ``index`` as far as FsaVecs go
index = index_fsa

__all__ = [
    "Fsa", "RaggedTensor", "create_fsa_vec", "index_fsa", "index", "cat", "to_str", "to_str_simple",
    "fsa_properties", "linear_fsa", "linear_fst", "ctc_topo", "ctc_graph", "fst_to_fsa", "arc_sort",
    "add_epsilon_self_loops", "remove_epsilon_self_loops", "connect", "top_sort", "remove_epsilon",
    "remove_epsilon_and_add_self_loops", "intersect", "compose", "invert", "determinize", "DenseFsaVec",
    "DenseLattice", "intersect_dense", "intersect_dense_pruned", "ctc_loss", "CtcLoss",
]
