"""Optional tqdm progress bar (extra ``progress``); a plain iterator without it."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def progress(iterable: Iterable[T], **kw: Any) -> Iterable[T]:
    """``iterable`` behind a tqdm bar (``kw`` its options) where tqdm is installed, else itself."""
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, **kw)

