"""Draw the step graphs chainfb compiles transducer losses into.

Writes Graphviz dot for a small RNN-T example (``U = 3`` labels) and a
multi-blank example (``U = 2``, big-blank durations 2 and 3, sigma 0.05),
twice each: the plain ``Fst.to_dot()`` (arcs ``pdf:prob``, as the engine
sees them) and an annotated version naming each pdf (``blank@u``,
``y_{u+1}``, ``big<d>@u``) and the steps an arc spans when more than one
(a big blank of duration ``d`` is one self-loop spanning ``d`` steps).  Renders PNGs when ``dot`` is on PATH.

The files go to ``--out DIR`` (created if needed); without ``--out`` they go
to a new temporary directory, so that nothing is written into the current
directory (often the source tree).  Every file written is printed, and the
directory last.

    chainfb-draw-transducer [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._args import Parser

if TYPE_CHECKING:
    from ..fst import Fst


def annotated_dot(fst: Fst, num_labels: int, durations: Sequence[int], title: str) -> str:
    """Graphviz dot of a step graph with ``num_labels`` labels and big-blank ``durations``, each pdf named."""
    W = len(durations) + 2

    def name(pdf):
        u, j = divmod(pdf, W)
        if j == 0:
            return f"blank@{u}"
        if j == 1:
            return f"y{u + 1}"
        return f"big{durations[j - 2]}@{u}"

    out = ["digraph transducer {", "  rankdir=LR;", f'  label="{title}";']
    for s in range(fst.num_states):
        main = s <= num_labels
        shape = "doublecircle" if fst.final[s] > -math.inf else ("circle" if main else "point")
        label = f"u={s}" if main else ""
        out.append(f'  {s} [shape={shape}, label="{label}"{", style=bold" if s == fst.start else ""}];')
    for s, d, p, lp, k in fst.arcs(spans=True):
        w = "" if lp == 0.0 else f" (-{-lp:g})"
        steps = "" if k == 1 else f", {k} steps"
        out.append(f'  {s} -> {d} [label="{name(p)}{w}{steps}"];')
    out.append("}")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (``argv``, default ``sys.argv[1:]``); see the module's docstring."""
    ap = Parser(prog="chainfb-draw-transducer", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", metavar="DIR", default=None,
                    help="output directory (created if needed; default: a new temporary directory)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = tempfile.mkdtemp(prefix="chainfb-transducer-graphs-")
    else:
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as e:
            ap.error(f"argument --out: cannot create {args.out!r}: {e.strerror or e}")

    from chainfb.transducer import multiblank_graphs, rnnt_graphs

    cases = [
        ("rnnt_U3", rnnt_graphs([3]).fsts[0], 3, (), "RNN-T step graph, U=3: run T+3 steps"),
        (
            "multiblank_U2_d2_3",
            multiblank_graphs([2], [2, 3], sigma=0.05).fsts[0],
            2,
            (2, 3),
            "multi-blank step graph, U=2, durations 2,3, sigma 0.05",
        ),
    ]
    have_dot = shutil.which("dot") is not None
    for stem, fst, U, durations, title in cases:
        for suffix, text in (("", annotated_dot(fst, U, durations, title)), ("_pdfs", fst.to_dot(title))):
            path = os.path.join(args.out, f"{stem}{suffix}.dot")
            with open(path, "w") as f:
                f.write(text)
            print(path)
            if have_dot:
                png = path[:-4] + ".png"
                subprocess.run(["dot", "-Tpng", path, "-o", png], check=True)
                print(png)
    if not have_dot:
        print("# graphviz 'dot' not found: wrote .dot files only")
    print(f"# graphs written to {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
