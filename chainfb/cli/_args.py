"""The command line of the console scripts: errors in one line, and checks of input files and options before any
graph is built."""
from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from ..chain.graphs.lexicon import Lexicon


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line, ``<prog>: error: <message>`` (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def fail(self, message: str, status: int = 1) -> NoReturn:
        """Stop with ``<prog>: error: <message>`` (one line) and ``status``."""
        self.exit(status, f"{self.prog}: error: {message}\n")


def check_input_files(parser: Parser, args: argparse.Namespace, *options: str) -> None:
    """Each of ``options`` (``"--lexicon"`` ...) given in ``args`` names a readable file, else a one-line error."""
    for opt in options:
        path = getattr(args, opt.lstrip("-").replace("-", "_"))
        if path is None:
            continue
        if not os.path.exists(path):
            parser.error(f"argument {opt}: no such file: {path!r}")
        if os.path.isdir(path):
            parser.error(f"argument {opt}: {path!r} is a directory, expected a file")
        if not os.access(path, os.R_OK):
            parser.error(f"argument {opt}: {path!r} is not readable")


TOPOLOGIES = ("chain", "ctc", "hmm3")


def check_topology(parser: Parser, name: str) -> None:
    """``--topology``: one of :data:`TOPOLOGIES` or an existing topology file, else a one-line error."""
    if name not in TOPOLOGIES and not os.path.isfile(name):
        parser.error(f"argument --topology: {name!r} is neither a known topology ({', '.join(TOPOLOGIES)}) nor a "
                     f"topology file")


def check_symbol(parser: Parser, option: str, symbol: str, known: Iterable[str], what: str) -> None:
    """``symbol`` (the value of ``option``) is one of ``known``, else a one-line error naming it and the closest
    ``what`` (case-insensitive matches first)."""
    if symbol in known:
        return
    known = list(known)
    same_case = [k for k in known if k.lower() == symbol.lower()]
    close = same_case + [k for k in difflib.get_close_matches(symbol, known, n=5, cutoff=0.5) if k not in same_case]
    hint = (f"; close matches: {', '.join(close)}" if close else
            f"; the {what}: {', '.join(known[:10])}{' ...' if len(known) > 10 else ''}")
    parser.error(f"argument {option}: {symbol!r} is not in the {what}{hint}")


def add_word_positions_option(parser: Parser) -> None:
    """``--word-positions`` (Kaldi's word-position-dependent phones in ``--phones``,
    :func:`chainfb.chain.read_phones`)."""
    parser.add_argument("--word-positions", choices=["strip", "keep"],
                        help="Kaldi's word-position-dependent phones in --phones (data/lang/phones.txt: AA_B, AA_E, "
                             "AA_I, AA_S): strip maps them to their base phone, keep keeps them and gives the "
                             "lexicon's pronunciations their positions (needed when --phones has them)")


def positioned(lexicon: Lexicon, args: argparse.Namespace) -> Lexicon:
    """The lexicon in the phones of ``--word-positions``."""
    return lexicon.with_word_positions() if args.word_positions == "keep" else lexicon


def add_context_options(parser: Parser) -> None:
    """``--context``, ``--min-biphone-count``, ``--min-monophone-count`` and ``--biphone-prons`` (left-biphone pdfs,
    :class:`chainfb.chain.BiphoneSet`)."""
    g = parser.add_argument_group("context dependency")
    g.add_argument("--context", default="mono", choices=["mono", "biphone"],
                   help="mono: pdfs per phone; biphone: per phone after each left context (or the utterance start), "
                        "biphones rarer than --min-biphone-count in the transcripts tied to their monophone "
                        "(Kaldi e2e) (default: %(default)s)")
    g.add_argument("--min-biphone-count", type=int, default=100,
                   help="biphone: fewer occurrences share the monophone's pdfs; 0 ties none (default: %(default)s, "
                        "Kaldi's)")
    g.add_argument("--min-monophone-count", type=int, default=20,
                   help="biphone: a phone seen at most this often shares the zerophone pdfs (default: %(default)s, "
                        "Kaldi's)")
    g.add_argument("--biphone-prons", default="all", choices=["all", "last", "first"],
                   help="biphone: pronunciations counted per word: all, or the last listed (Kaldi's "
                        "text_to_phones.py), or the first (default: %(default)s)")


def check_context_options(parser: Parser, args: argparse.Namespace) -> None:
    """One-line errors for the values of :func:`add_context_options`."""
    for opt in ("--min-biphone-count", "--min-monophone-count"):
        v = getattr(args, opt.lstrip("-").replace("-", "_"))
        if v < 0:
            parser.error(f"argument {opt}: expected a count >= 0, got {v}")
