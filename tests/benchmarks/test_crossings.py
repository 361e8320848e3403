"""torch <-> NumPy crossings per CPU call (benchmarks/count_crossings.py): the
scores cross once each way, the gradient once, the incoming gradient once,
the labels and lengths of ctc_loss once together."""

import importlib

import pytest


@pytest.fixture(scope="module")
def tool():
    return importlib.import_module("benchmarks.count_crossings")


# input 1 + value 1 + gradient 1, plus the integer inputs: ctc_loss's targets and both lengths in one transfer,
# fst_loglike's lengths; plus the incoming gradient in backward where the gradient is written there (a view: it
# scales the posteriors before they are written; not where the posteriors are over half the gradient's size)
@pytest.mark.parametrize("name, most", [("ctc_loss", 5), ("fst_loglike", 5)])
def test_crossings_per_call(tool, name, most):
    counter = tool.Counter()
    with counter.installed():
        counts, sites = tool.count(name, counter)
    assert sum(counts.values()) <= most, sites
    assert counts["torch.from_numpy"] == 2 and counts[".numpy()"] in (2, 3), counts


def test_counter_counts_and_restores(tool):
    import numpy as np
    import torch

    counter = tool.Counter()
    numpy_method = torch.Tensor.numpy
    with counter.installed():
        t = torch.zeros(3)
        with counter.counting():
            t.numpy()
            torch.from_numpy(np.zeros(2))
            torch.as_tensor([1, 2])  # a list: not a NumPy crossing
            bool(t[0])
            t.tolist()
    assert dict(counter.counts) == {".numpy()": 1, "torch.from_numpy": 1, "bool(t)": 1, ".tolist()": 1}
    assert torch.Tensor.numpy is numpy_method
