"""Test oracles, in one place: straightforward float64 references written
independently of the engine and the kernels.

- :mod:`oracles.fst`: path enumeration, best path by enumeration, and a
  loop forward-backward for pdf-labelled graphs;
- :mod:`oracles.transducer`: transducer alignments enumerated on the
  ``(t, u)`` grid, a grid-loop reference (big blanks, sigma, FastEmit), and
  a differentiable torch RNN-T recursion;
- :mod:`oracles.chain`: the LF-MMI objective of ``ChainLoss`` in NumPy
  float64;
- :mod:`oracles.cuda_twins`: NumPy twins of the CUDA score-map kernels;
- :mod:`oracles.fast_rnnt`: loop references for the k2 / fast_rnnt RNN-T
  functions (mutual-information recursion, px/py construction, delay
  penalty, prune ranges, pruned px/py);
- :mod:`oracles.kaldi_egs`: a writer of Kaldi's binary chain examples from
  Kaldi's format rules (and of the files in ``graphs/examples/kaldi/``).
"""
