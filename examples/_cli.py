"""The command line of the examples: errors in one line, before anything heavy is imported (``--help`` and
argument errors never wait for torch)."""
from __future__ import annotations

import argparse
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line, ``<prog>: error: <message>`` (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def fail(self, message: str, status: int = 1) -> NoReturn:
        """Stop with ``<prog>: error: <message>`` (one line) and ``status``."""
        self.exit(status, f"{self.prog}: error: {message}\n")

