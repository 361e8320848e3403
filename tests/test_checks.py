"""The one checks module: each check's accepted forms and its error style."""

import numpy as np
import pytest
import torch

from chainfb import checks
from threads import in_threads


def test_flag_rejects_truthy_non_bools():
    assert checks.flag(True, "f") is True and checks.flag(np.bool_(False), "f") is False
    for bad in ("False", 1, 0, None):
        with pytest.raises(TypeError, match="^f: expected True or False"):
            checks.flag(bad, "f")


def test_number_and_integer():
    assert checks.number(np.float32(2.5), "x") == 2.5 and checks.number(3, "x") == 3.0
    with pytest.raises(TypeError, match="^x: expected a number"):
        checks.number("1", "x")
    with pytest.raises(TypeError, match="^x: expected a number"):
        checks.number(True, "x")
    with pytest.raises(ValueError, match="^x: expected a finite number"):
        checks.number(float("nan"), "x")
    assert np.isinf(checks.number(float("inf"), "x", finite=False))
    with pytest.raises(ValueError, match="^x: expected a value >= 0"):
        checks.number(-1, "x", lo=0)
    with pytest.raises(ValueError, match="^x: expected a value < 1"):
        checks.number(1, "x", hi=1, hi_open=True)
    assert checks.integer(np.int64(4), "k") == 4
    for bad in (4.0, True, "4"):
        with pytest.raises(TypeError, match="^k: expected an int"):
            checks.integer(bad, "k")
    with pytest.raises(ValueError, match="^k: expected an int >= 1"):
        checks.integer(0, "k", lo=1)


def test_lengths_never_truncate():
    np.testing.assert_array_equal(checks.lengths(torch.tensor([3, 0]), "L", 2, 4), [3, 0])
    assert checks.lengths(None, "L", 2, 5).tolist() == [5, 5]
    assert checks.lengths([], "L", 0, 5).shape == (0,)
    for bad in ([4.7, 5.0], torch.tensor([4.0, 5.0]), torch.tensor([True, False]), np.array([1.0])):
        with pytest.raises(TypeError, match="^L: expected integers"):
            checks.lengths(bad, "L", len(bad), 9)
    with pytest.raises(ValueError, match=r"^L: expected shape \(3,\)"):
        checks.lengths([1, 2], "L", 3, 9)
    with pytest.raises(ValueError, match="^L: every length must lie in"):
        checks.lengths([1, 10], "L", 2, 9)
    with pytest.raises(ValueError, match="^L: every length must lie in"):
        checks.lengths([1, -1], "L", 2, 9)
    with pytest.raises(ValueError, match="^L: every length must be >= 0"):
        checks.lengths([1, -1], "L", 2)
    with pytest.raises(ValueError, match="does not fit int64"):
        checks.int_array(np.array([2**64 - 1], dtype=np.uint64), "L")


def test_blank_and_durations():
    assert checks.blank(-1, 5, negative=True) == 4
    with pytest.raises(ValueError, match=r"^blank: expected an index in \[-5, 5\)"):
        checks.blank(5, 5, negative=True)
    with pytest.raises(ValueError, match=r"^blank: expected an index in \[2, 5\)"):
        checks.blank(1, 5, reserved=2)
    assert checks.durations(torch.tensor([0, 1, 2]), "durations", 0) == [0, 1, 2]
    with pytest.raises(TypeError, match="^durations: expected an int"):
        checks.durations([1, 2.5], "durations", 0)
    with pytest.raises(ValueError, match="^durations: every duration must be >= 2, got 1"):
        checks.durations([1, 2], "durations", 2)
    with pytest.raises(ValueError, match="^durations: expected at least one"):
        checks.durations([], "durations", 0)


def test_values_like():
    """Numbers, arrays and tensors as a tensor of another's dtype and device; a host tensor is copied, so a later
    change of the caller's data does not reach the result."""
    like = torch.zeros(2, dtype=torch.float64)
    for values in ([2, 6], np.array([2, 6]), torch.tensor([2, 6]), torch.tensor([2.0, 6.0], dtype=torch.float64)):
        got = checks.values_like(values, like)
        assert got.dtype == torch.float64 and got.device == like.device and got.tolist() == [2.0, 6.0]
        if isinstance(values, (np.ndarray, torch.Tensor)):
            values[0] = 5
            assert got.tolist() == [2.0, 6.0]
    seven = checks.values_like(7, like.float())
    assert seven.item() == 7.0 and seven.dtype == torch.float32


def test_reduce():
    v = torch.tensor([1.0, 3.0])
    assert checks.reduce(v, "none") is v
    assert float(checks.reduce(v, "sum")) == 4.0 and float(checks.reduce(v, "mean")) == 2.0
    assert float(checks.reduce(v, "mean_volume", torch.tensor([2, 6]))) == 0.5
    assert float(checks.reduce(v, "frame", 0)) == 4.0
    with pytest.raises(ValueError, match="^reduction: expected 'none', 'mean' or 'sum', got 'avg'"):
        checks.reduction("avg")


def test_lru_is_thread_safe_and_bounded():
    cache = checks.LRU(8)

    def work(seed):  # constant eviction: keys drawn from three times the cache's size
        for k in np.random.default_rng(seed).integers(0, 24, 4000).tolist():
            assert cache.get(k, lambda k=k: k * 10) == k * 10

    errors = in_threads(work, 8)
    assert not errors, errors[:3]
    assert len(cache) <= 8
