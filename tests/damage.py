"""Damaged copies of valid files for the readers' fuzz tests (hypothesis):
cut short, bits flipped, or eight bytes overwritten with a word that makes a
count huge or negative."""

import struct

from hypothesis import strategies as st

WORDS = (b"\xff" * 8, struct.pack("<q", 10**12), struct.pack("<q", 2**62), b"\x04" + b"\xff\xff\xff\x7f" * 2)


def draw_damage(data, good: bytes) -> bytes:
    """``good`` truncated, with 1-4 bits flipped, or with 8 bytes overwritten by one of :data:`WORDS`
    (``data`` is hypothesis's ``st.data()``)."""
    how = data.draw(st.sampled_from(["truncate", "flip", "overwrite"]))
    if how == "truncate":
        return good[:data.draw(st.integers(0, len(good) - 1))]
    if how == "flip":
        bad = bytearray(good)
        for _ in range(data.draw(st.integers(1, 4))):
            bad[data.draw(st.integers(0, len(good) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        return bytes(bad)
    i = data.draw(st.integers(0, len(good) - 8))
    return good[:i] + data.draw(st.sampled_from(WORDS))[:8] + good[i + 8:]
