"""Drop-ins for other toolkits' users, each reproducing its names,
signatures, numbers and documented quirks on top of chainfb's engine and
losses:

- :mod:`chainfb.compat.k2`: k2's FSA training API (``Fsa``,
  ``create_fsa_vec``, ``linear_fsa``, ``ctc_topo``, ``ctc_graph``, the
  graph algorithms icefall's training-graph compilers need,
  ``DenseFsaVec``, ``intersect_dense`` with ``get_tot_scores``,
  ``ctc_loss`` / ``CtcLoss``); exact where k2 prunes;
- :mod:`chainfb.compat.torchaudio`: ``rnnt_loss``, ``RNNTLoss``,
  ``forced_align``, ``merge_tokens`` (an input error is also a
  ``RuntimeError``, as torchaudio's are);
- :mod:`chainfb.compat.espnet`: NeMo/ESPnet ``RNNTLossNumba``,
  ``MultiblankRNNTLossNumba`` and ``TDTLossNumba`` (NeMo's random ``omega``
  draw included), the functional ``rnnt_loss``, ``multiblank_rnnt_loss``
  and ``tdt_loss`` in NeMo's argument order, ``certify_inputs``;
- :mod:`chainfb.compat.nemo`: NeMo's ``RNNTLoss`` wrapper (reductions
  ``mean_batch``, ``mean``, ``sum``, ``mean_volume``) and
  ``resolve_rnnt_loss``;
- :mod:`chainfb.compat.speechbrain`: ``transducer_loss`` (relative
  lengths) and ``TransducerLoss``;
- :mod:`chainfb.compat.fast_rnnt`: k2 / fast_rnnt's ``rnnt_loss``,
  ``rnnt_loss_simple``, ``rnnt_loss_smoothed``, ``rnnt_loss_pruned`` (with
  k2's HAT loss), ``get_rnnt_prune_ranges`` (and the deprecated one),
  ``do_rnnt_pruning``, the ``get_rnnt_logprobs*`` helpers and
  ``get_hat_logprobs_pruned``, ``mutual_information_recursion``,
  ``joint_mutual_information_recursion`` and ``with_cuda``;
- :mod:`chainfb.compat.kaldi`: Kaldi's chain API, ``Supervision``,
  ``GenericNumeratorComputation`` and ``DenominatorComputation``, on a
  Kaldi-layout network output (``chainfb.kaldi`` is its old path).
"""
