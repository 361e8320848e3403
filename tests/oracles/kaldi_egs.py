"""A writer of Kaldi's binary chain examples, from Kaldi's format rules
(``NnetChainExample::Write``, ``NnetIo::Write``, ``WriteIndexVector``,
``Matrix``/``CompressedMatrix::Write``, ``Supervision::Write``,
``NnetChainSupervision::Write`` with ``<DW2>``) and OpenFst's
``compact_acceptor`` FSTs (``CompactFst::WriteFst`` with
``AcceptorCompactor``), written without reference to chainfb's reader.

Run as a script, it writes the Kaldi example files of
``graphs/examples/kaldi/`` (``python tests/oracles/kaldi_egs.py``).
"""

import os
import struct
import sys

import numpy as np


def tok(s):
    return s.encode() + b" "


def i32(v):
    return b"\x04" + struct.pack("<i", v)


def f32(v):
    return b"\x04" + struct.pack("<f", v)


def index_vector(indexes):
    """``<I1V>``, the size, then per index one byte (the change of t, n and x
    kept) or 127 and the three values."""
    out = tok("<I1V>") + i32(len(indexes))
    last = (0, 0, 0)
    for i, (n, t, x) in enumerate(indexes):
        same = (n, x) == (0, 0) if i == 0 else (n, x) == (last[0], last[2])
        dt = t - (0 if i == 0 else last[1])
        if same and -125 < dt < 125:
            out += struct.pack("<b", dt)
        else:
            out += b"\x7f" + i32(n) + i32(t) + i32(x)
        last = (n, t, x)
    return out


def fm(mat):
    mat = np.asarray(mat, dtype="<f4")
    return tok("FM") + i32(mat.shape[0]) + i32(mat.shape[1]) + mat.tobytes()


def compressed(kind, lo, span, rows, cols, body):
    """``CM``/``CM2``/``CM3``: the global header without its format field, then ``body``."""
    return tok(kind) + struct.pack("<ffii", lo, span, rows, cols) + body


def compact_acceptor(fst):
    """OpenFst's compact_acceptor FST: header, ``S + 1`` uint32 offsets, then
    per state its final (label -1, cost, -1) first, then its arcs."""
    elems, offsets = [], []
    for s in range(fst.num_states):
        offsets.append(len(elems))
        if fst.final[s] > -np.inf:
            elems.append((-1, -fst.final[s], -1))
        elems += [(p + 1, -lp, d) for src, d, p, lp in fst.arcs() if src == s]
    offsets.append(len(elems))
    out = struct.pack("<i", 2125659606)
    for name in (b"compact_acceptor", b"standard"):
        out += struct.pack("<i", len(name)) + name
    out += struct.pack("<iiQqqq", 2, 0, 0x3, fst.start, fst.num_states, fst.num_arcs)
    out += struct.pack(f"<{len(offsets)}I", *offsets)
    return out + b"".join(struct.pack("<ifi", *e) for e in elems)


def nnet_io(name, indexes, matrix_bytes):
    return tok("<NnetIo>") + tok(name) + index_vector(indexes) + matrix_bytes + tok("</NnetIo>")


def supervision(name, indexes, weight, num_seq, frames, label_dim, fsts, e2e=True, deriv=None, align=None):
    out = tok("<NnetChainSup>") + tok(name) + index_vector(indexes)
    out += tok("<Supervision>") + tok("<Weight>") + f32(weight) + tok("<NumSequences>") + i32(num_seq)
    out += tok("<FramesPerSeq>") + i32(frames) + tok("<LabelDim>") + i32(label_dim) + tok("<End2End>")
    out += b"T" if e2e else b"F"
    if e2e:
        out += tok("<Fsts>") + b"".join(compact_acceptor(f) for f in fsts) + tok("</Fsts>")
    else:
        out += compact_acceptor(fsts[0])
    if align is not None:
        out += tok("<AlignmentPdfs>") + b"\x04" + struct.pack("<i", len(align)) + struct.pack(f"<{len(align)}i", *align)
    out += tok("</Supervision>")
    d = np.asarray([] if deriv is None else deriv, dtype="<f4")
    out += tok("<DW2>") + tok("FV") + i32(d.size) + d.tobytes()
    return out + tok("</NnetChainSup>")


def example(inputs, outputs):
    return (tok("<Nnet3ChainEg>") + tok("<NumInputs>") + i32(len(inputs)) + b"".join(inputs)
            + tok("<NumOutputs>") + i32(len(outputs)) + b"".join(outputs) + tok("</Nnet3ChainEg>"))


def entry(key, eg):
    return key.encode() + b" \0B" + eg


# ------------------------------------------------------------ graphs/examples/kaldi


def write_examples(root: str) -> None:
    """Kaldi's files for the digits example of ``graphs/examples/digits``:
    ``data/lang/phones.txt`` (word-position-dependent, as ``prepare_lang.sh``
    writes it), ``data/local/dict/lexiconp.txt`` and
    ``lexiconp_silprob.txt``, ``exp/chain/den.fst`` and
    ``normalization.fst`` (OpenFst binary), ``exp/chain/fst.1.ark`` (the
    e2e numerator graphs, a binary FST archive) and ``exp/chain/egs/cegs.1.ark``
    (e2e chain examples of the first three utterances: random 13-dim
    features, compressed as Kaldi compresses speech features, three input
    frames per output frame)."""
    from chainfb import Fst
    from chainfb.chain import (DenominatorGraph, Topology, add_normalization, den_graph, estimate_phone_lm,
                               normalization_fst, numerator_graph, read_lexicon, read_phones, read_text,
                               transcript_phones, write_kaldi_fst_archive)

    digits = os.path.join(os.path.dirname(root.rstrip("/")), "digits")
    lex = read_lexicon(os.path.join(digits, "lexicon.txt"))
    phones = read_phones(os.path.join(digits, "phones.txt"))
    utts = read_text(os.path.join(digits, "text"))
    frames = dict((u, int(n)) for u, n in (ln.split() for ln in open(os.path.join(digits, "utt2num_frames"))))
    for sub in ("data/lang", "data/local/dict", "exp/chain/egs"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    symbols = ["<eps>"] + [p for p in phones if p == "SIL"] + [f"{p}_{x}" for p in phones for x in "BEIS"]
    symbols += [f"#{k}" for k in range(4)]
    with open(os.path.join(root, "data/lang/phones.txt"), "w") as f:
        f.writelines(f"{s} {i}\n" for i, s in enumerate(symbols))
    rng = np.random.default_rng(0)
    with open(os.path.join(root, "data/local/dict/lexiconp.txt"), "w") as fp, \
            open(os.path.join(root, "data/local/dict/lexiconp_silprob.txt"), "w") as fs:
        for word, prons in lex.prons.items():
            for k, (pron, _) in enumerate(prons):
                prob = 1.0 if k == 0 else 0.4
                sil = rng.uniform(0.05, 0.3), rng.uniform(0.8, 1.2), rng.uniform(0.8, 1.2)
                fp.write(f"{word}\t{prob}\t{' '.join(pron)}\n")
                fs.write(f"{word}\t{prob}\t{sil[0]:.2f}\t{sil[1]:.2f}\t{sil[2]:.2f}\t{' '.join(pron)}\n")
    topo = Topology.chain()
    lm = estimate_phone_lm([transcript_phones(w, lex, phones, "SIL", 0.5, rng) for _, w in utts], order=3)
    den_fst = den_graph(lm, topo)
    den = DenominatorGraph(den_fst, topo.num_pdfs(len(phones)))
    den_fst.write(os.path.join(root, "exp/chain/den.fst"), binary=True)
    norm = normalization_fst(den)
    norm.write(os.path.join(root, "exp/chain/normalization.fst"), binary=True)
    nums = [(u, add_normalization(numerator_graph(w, lex, topo, phones, "SIL", 0.5), norm)) for u, w in utts]
    # Kaldi's graphs hold float32 costs
    nums = [(u, Fst(g.num_states, g.start, g.src, g.dst, g.pdf, g.log_prob.astype(np.float32),
                    g.final.astype(np.float32))) for u, g in nums]
    write_kaldi_fst_archive(os.path.join(root, "exp/chain/fst.1.ark"), nums)
    with open(os.path.join(root, "exp/chain/egs/cegs.1.ark"), "wb") as f:
        for u, g in nums[:3]:
            T = -(-frames[u] // 3)
            # 13-dim features in Kaldi's default compression for speech features (CM: per-column percentiles,
            # one byte per value, column by column)
            heads = np.sort(rng.integers(0, 65536, size=(13, 4)), axis=1).astype("<u2")
            body = heads.tobytes() + rng.integers(0, 256, size=13 * 3 * T).astype("u1").tobytes()
            feats = compressed("CM", -20.0, 40.0, 3 * T, 13, body)
            eg = example([nnet_io("input", [(0, t, 0) for t in range(3 * T)], feats)],
                         [supervision("output", [(0, 3 * t, 0) for t in range(T)], 1.0, 1, T, den.num_pdfs, [g])])
            f.write(entry(u, eg))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    here = os.path.dirname(os.path.abspath(__file__))
    write_examples(os.path.join(os.path.dirname(os.path.dirname(here)), "graphs", "examples", "kaldi"))
