"""chainfb._sort.stable_order: NumPy's stable argsort of small integer keys,
by 16-bit radix passes; and the compiled counting sort beside it."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chainfb._sort import stable_order


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.sampled_from([1, 2, 7, 1 << 16, (1 << 16) + 1, 1 << 32, 1 << 40]), st.integers(0, 2**32))
def test_stable_order_is_the_stable_argsort(n, bound, seed):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, bound, n, dtype=np.int64)
    if n > 3 and seed % 3 == 0:
        keys[: n // 2] = keys[0]  # ties: stability decides their order
    if seed % 5 == 0:
        keys.sort()  # already in order
    elif seed % 5 == 1 and n > 3:
        keys.sort()
        keys[[1, n - 2]] = keys[[n - 2, 1]]  # a few descents: runs already in order
    got = stable_order(keys, bound if seed % 2 else None)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.argsort(keys, kind="stable"))


def test_keys_at_the_digit_boundaries():
    keys = np.array([1 << 16, (1 << 16) - 1, 0, (1 << 32) - 1, 1 << 16, 65537, 1, 0], dtype=np.int64)
    np.testing.assert_array_equal(stable_order(keys, 1 << 32), np.argsort(keys, kind="stable"))
    np.testing.assert_array_equal(stable_order(np.zeros(0, np.int64)), np.zeros(0, np.int64))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 60), st.integers(1, 50), st.integers(0, 2**32))
def test_counting_order_is_the_stable_argsort(n, bound, seed):
    """The compiled counting sort of the CUDA engine's index arrays and CTC's compiler
    (``chainfb.engines.numba_log.arrays.counting_order``) is the stable argsort, with each key's
    CSR pointer."""
    from chainfb.engines.numba_log.arrays import counting_order

    keys = np.random.default_rng(seed).integers(0, bound, n, dtype=np.int64)
    order, ptr = counting_order(keys, bound)
    assert order.dtype == ptr.dtype == np.int64
    np.testing.assert_array_equal(order, np.argsort(keys, kind="stable"))
    np.testing.assert_array_equal(ptr, np.concatenate([[0], np.cumsum(np.bincount(keys, minlength=bound))]))
