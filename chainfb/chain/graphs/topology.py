"""HMM topologies: how one phone becomes pdf-labelled arcs.

A :class:`Topology` is a per-phone template, the same for every phone
(Kaldi's chain recipes use one topology for all phones).  It is read from
and written to a small plain-text format (see ``graphs/topologies/*.topo``)::

    # comments start with '#'
    name chain
    shared_pdfs 0          # pdfs common to all phones (e.g. CTC blank), numbered first
    pdfs_per_phone 2       # pdf classes per phone
    states 1               # template states 0 .. states-1
    arc enter 0 0          # arc FROM TO PDF [PROB]; FROM 'enter' = the arc entering the phone
    arc 0 0 1              # PDF is a class 0..pdfs_per_phone-1, or 'shared:K' for shared pdf K
    exit 0                 # exit STATE [PROB]: the phone may end in this state
    prefix_loop shared:0   # optional: a self-loop on the utterance start state (leading CTC blank)
    no_repeat_from 0       # optional: the same phone may not be entered again directly from this exit state

Every arc consumes one frame.  PROB defaults to 1 (weight 0 in the log
domain); Kaldi's chain training ignores transition probabilities, so the
shipped topologies use none.

pdf numbering (0-based, as in :class:`chainfb.Fst`): shared pdf ``K`` is
``K``; class ``c`` of phone ``i`` (its 0-based index in the phone list) is
``shared_pdfs + i * pdfs_per_phone + c``.  So ``num_pdfs(num_phones) =
shared_pdfs + num_phones * pdfs_per_phone``:

* ``chain``: 1 state; entering arc pdf ``2i``, self-loop pdf ``2i+1``
  (Kaldi's chain topology: distinct pdfs for entering and for the loop).
* ``ctc``: pdf 0 is the blank; token ``i`` is pdf ``1 + i``; a token may
  repeat (self-loop), be followed by blanks, and the same token twice needs
  a blank in between; blanks may also lead.
* ``hmm3``: 3-state left-to-right, self-loops, pdf ``3i + state``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

__all__ = ["Topology"]

ENTER = -1


def _pdf_token(tok: str, shared: int, per_phone: int, where: str):
    if tok.startswith("shared:"):
        k = int(tok[7:])
        if not 0 <= k < shared:
            raise ValueError(f"{where}: shared pdf {k} outside [0, {shared})")
        return ("shared", k)
    c = int(tok)
    if not 0 <= c < per_phone:
        raise ValueError(f"{where}: pdf class {c} outside [0, {per_phone})")
    return ("class", c)


def _fmt_pdf(p) -> str:
    return f"shared:{p[1]}" if p[0] == "shared" else str(p[1])


def _prob(tok: str | None, where: str) -> float:
    if tok is None:
        return 0.0
    v = float(tok)
    if not 0.0 < v <= 1.0:
        raise ValueError(f"{where}: probability {v} outside (0, 1]")
    return math.log(v)


@dataclass
class Topology:
    """A per-phone HMM template (see the module docstring for the format).

    Attributes
    ----------
    name : str
    shared_pdfs, pdfs_per_phone, num_states : int
    arcs : list of ``(from, to, pdf, log_prob)``; ``from = -1`` is the
        entering arc; ``pdf`` is ``("class", c)`` or ``("shared", k)``.
    exits : dict ``state -> log_prob`` of ending the phone there.
    prefix_loop : pdf or None — self-loop on the utterance start state.
    no_repeat_from : set of exit states from which the same phone may not
        be entered again directly.
    """

    name: str
    shared_pdfs: int
    pdfs_per_phone: int
    num_states: int
    arcs: list
    exits: dict
    prefix_loop: tuple | None = None
    no_repeat_from: set = field(default_factory=set)

    def __post_init__(self):
        if self.num_states <= 0:
            raise ValueError("states: a topology needs at least one state")
        if not any(a[0] == ENTER for a in self.arcs):
            raise ValueError("arcs: a topology needs at least one 'enter' arc")
        if not self.exits:
            raise ValueError("exits: a topology needs at least one exit state")
        for a in self.arcs:
            if not (a[0] == ENTER or 0 <= a[0] < self.num_states) or not 0 <= a[1] < self.num_states:
                raise ValueError(f"arcs: state out of range in {a}")

    # ------------------------------------------------------------ numbering
    def num_pdfs(self, num_phones: int) -> int:
        """Number of pdfs for ``num_phones`` phones."""
        return self.shared_pdfs + num_phones * self.pdfs_per_phone

    def pdf_id(self, pdf: tuple[str, int], phone: int) -> int:
        """0-based pdf id of template pdf ``pdf`` for phone index ``phone``."""
        kind, k = pdf
        return k if kind == "shared" else self.shared_pdfs + phone * self.pdfs_per_phone + k

    # ------------------------------------------------------------ built-ins
    @classmethod
    def chain(cls) -> Topology:
        """Kaldi's chain topology: one state; entering pdf ``2i``, self-loop pdf ``2i+1``."""
        return cls("chain", 0, 2, 1, [(ENTER, 0, ("class", 0), 0.0), (0, 0, ("class", 1), 0.0)], {0: 0.0})

    @classmethod
    def ctc(cls) -> Topology:
        """CTC: blank pdf 0, token ``i`` pdf ``1+i`` with repeats and optional blanks."""
        blank = ("shared", 0)
        arcs = [(ENTER, 0, ("class", 0), 0.0), (0, 0, ("class", 0), 0.0), (0, 1, blank, 0.0), (1, 1, blank, 0.0)]
        return cls("ctc", 1, 1, 2, arcs, {0: 0.0, 1: 0.0}, prefix_loop=blank, no_repeat_from={0})

    @classmethod
    def hmm3(cls) -> Topology:
        """Conventional 3-state left-to-right HMM with self-loops, pdf ``3i + state``."""
        arcs = [(ENTER, 0, ("class", 0), 0.0)]
        for s in range(3):
            arcs.append((s, s, ("class", s), 0.0))
            if s < 2:
                arcs.append((s, s + 1, ("class", s + 1), 0.0))
        return cls("hmm3", 0, 3, 3, arcs, {2: 0.0})

    # ------------------------------------------------------------ text I/O
    @classmethod
    def from_text(cls, text: str) -> Topology:
        """Parse the plain-text topology format."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        kv = {}
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            f = line.split("#", 1)[0].split()
            if not f:
                continue
            if f[0] in ("name", "shared_pdfs", "pdfs_per_phone", "states"):
                if len(f) != 2:
                    raise ValueError(f"topology line {n}: expected '{f[0]} VALUE'")
                kv[f[0]] = f[1]
            elif f[0] in ("arc", "exit", "prefix_loop", "no_repeat_from"):
                rows.append((n, f))
            else:
                raise ValueError(f"topology line {n}: unknown keyword {f[0]!r}")
        for k in ("shared_pdfs", "pdfs_per_phone", "states"):
            if k not in kv:
                raise ValueError(f"topology: missing '{k}' line")
        try:
            shared, per, ns = int(kv["shared_pdfs"]), int(kv["pdfs_per_phone"]), int(kv["states"])
        except ValueError:
            raise ValueError("topology: shared_pdfs, pdfs_per_phone and states must be integers") from None
        arcs, exits, prefix, norep = [], {}, None, set()
        for n, f in rows:
            where = f"topology line {n}"
            try:
                if f[0] == "arc":
                    if len(f) not in (4, 5):
                        raise ValueError(f"{where}: expected 'arc FROM TO PDF [PROB]'")
                    src = ENTER if f[1] == "enter" else int(f[1])
                    arcs.append((src, int(f[2]), _pdf_token(f[3], shared, per, where),
                                 _prob(f[4] if len(f) == 5 else None, where)))
                elif f[0] == "exit":
                    if len(f) not in (2, 3):
                        raise ValueError(f"{where}: expected 'exit STATE [PROB]'")
                    exits[int(f[1])] = _prob(f[2] if len(f) == 3 else None, where)
                elif f[0] == "prefix_loop":
                    prefix = _pdf_token(f[1], shared, per, where)
                else:
                    norep.update(int(x) for x in f[1:])
            except (ValueError, IndexError) as e:
                if str(e).startswith("topology"):
                    raise
                raise ValueError(f"{where}: malformed line {' '.join(f)!r}") from None
        for s in list(exits) + sorted(norep):
            if not 0 <= s < ns:
                raise ValueError(f"topology: exit/no_repeat_from state {s} outside [0, {ns})")
        return cls(kv.get("name", "custom"), shared, per, ns, arcs, exits, prefix, norep)

    @classmethod
    def read(cls, path: str | os.PathLike) -> Topology:
        """Read a topology file; the names ``chain``, ``ctc`` and ``hmm3`` load
        the files shipped in ``graphs/topologies`` (or the built-ins)."""
        if str(path) in ("chain", "ctc", "hmm3") and not os.path.exists(path):
            return getattr(cls, str(path))()
        with open(path, encoding="utf-8") as f:
            return cls.from_text(f.read())

    def to_text(self) -> str:
        """The plain-text form; ``Topology.from_text(t.to_text()) == t``."""

        def prob(lp):
            return "" if lp == 0.0 else f" {math.exp(lp)!r}"

        out = [f"name {self.name}", f"shared_pdfs {self.shared_pdfs}", f"pdfs_per_phone {self.pdfs_per_phone}",
               f"states {self.num_states}"]
        for s, d, p, lp in self.arcs:
            out.append(f"arc {'enter' if s == ENTER else s} {d} {_fmt_pdf(p)}{prob(lp)}")
        for s, lp in self.exits.items():
            out.append(f"exit {s}{prob(lp)}")
        if self.prefix_loop is not None:
            out.append(f"prefix_loop {_fmt_pdf(self.prefix_loop)}")
        if self.no_repeat_from:
            out.append("no_repeat_from " + " ".join(str(s) for s in sorted(self.no_repeat_from)))
        return "\n".join(out) + "\n"

    def write(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_text())
