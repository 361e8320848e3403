"""Drop-in replacements for the transducer losses of other toolkits, each
reproducing its signature, its numbers and its documented quirks on top of
chainfb's compiled transducer losses:

- :mod:`chainfb.compat.torchaudio`: ``rnnt_loss``, ``RNNTLoss``;
- :mod:`chainfb.compat.espnet`: NeMo/ESPnet ``rnnt_loss``, ``RNNTLossNumba``,
  ``MultiblankRNNTLossNumba`` and ``TDTLossNumba`` (NeMo's random ``omega``
  draw included);
- :mod:`chainfb.compat.speechbrain`: ``TransducerLoss``;
- :mod:`chainfb.compat.fast_rnnt`: k2 / fast_rnnt's ``rnnt_loss``,
  ``rnnt_loss_simple``, ``rnnt_loss_smoothed``, ``rnnt_loss_pruned``,
  ``get_rnnt_prune_ranges``, ``do_rnnt_pruning``, the ``get_rnnt_logprobs*``
  helpers and ``mutual_information_recursion``.
"""
