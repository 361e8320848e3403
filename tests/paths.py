"""Where the tests live: the repository's root and the tests' folder (test modules sit in folders that mirror
the package and the repository, so they find these here rather than from their own file)."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
