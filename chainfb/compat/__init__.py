"""Drop-in replacements for the transducer losses of other toolkits, each
reproducing its signature, its numbers and its documented quirks on top of
chainfb's compiled transducer losses:

- :mod:`chainfb.compat.torchaudio`: ``rnnt_loss``, ``RNNTLoss``;
- :mod:`chainfb.compat.espnet`: NeMo/ESPnet ``rnnt_loss``, ``RNNTLossNumba``, ``MultiblankRNNTLossNumba``;
- :mod:`chainfb.compat.speechbrain`: ``TransducerLoss``.
"""
