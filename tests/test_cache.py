"""The package's one cache mechanism (chainfb._cache.Memo / LRU), the memos of
Lattice and FstBatch that every engine and score map keeps its data in, and
the one splitter of work over threads (chainfb.engines.threads.split)."""

import pickle
import threading

import numpy as np
import pytest
import torch

import chainfb
from chainfb import FstBatch, engines
from chainfb._cache import LRU, Memo
from chainfb.engines import threads
from chainfb.lattice import Lattice
from chainfb.testing import random_fst
from tests.cycles import cyclic_garbage


def test_memo_builds_once_per_key_and_clears():
    memo, calls = Memo(), []

    def build(v):
        return lambda: calls.append(v) or v

    assert memo.get(("a",), build(1)) == 1 and memo.get(("a",), build(2)) == 1
    assert memo.get(("b",), build(3)) == 3 and calls == [1, 3]
    assert ("a",) in memo and len(memo) == 2 and sorted(memo.keys()) == [("a",), ("b",)] and memo[("b",)] == 3
    memo.clear()
    assert len(memo) == 0 and memo.get(("a",), build(4)) == 4


def test_lru_keeps_the_most_recently_used():
    lru = LRU(2)
    lru.get(1, lambda: "one")
    lru.get(2, lambda: "two")
    lru.get(1, lambda: "again")  # used: 2 is now the oldest
    lru.get(3, lambda: "three")
    assert sorted(lru.keys()) == [1, 3] and lru.size == 2


def test_a_copied_memo_shares_its_values_and_keeps_its_own_keys():
    memo = LRU(2)
    value = memo.get("a", lambda: [1])
    copy = memo.copy()
    assert type(copy) is LRU and copy.size == 2 and copy["a"] is value
    copy.get("b", lambda: 2)
    copy.get("c", lambda: 3)  # the copy drops its least recently used, the original is untouched
    assert "a" not in copy and memo.keys() == ["a"]


def test_two_threads_building_one_key_get_the_value_kept_first():
    """The build runs outside the lock; the thread that finishes second gets
    the first thread's value, so every user of a key shares one object."""
    memo = Memo()
    started, release = threading.Event(), threading.Event()
    got = {}

    def slow():
        started.set()
        release.wait(30)
        return "slow"

    t = threading.Thread(target=lambda: got.update(slow=memo.get(("k",), slow)))
    t.start()
    assert started.wait(30)
    got["fast"] = memo.get(("k",), lambda: "fast")  # builds while the other thread is still building
    release.set()
    t.join(30)
    assert got == {"fast": "fast", "slow": "fast"}


def test_a_pickled_memo_travels_empty():
    memo = LRU(3)
    memo.get(1, lambda: np.zeros(4))
    back = pickle.loads(pickle.dumps(memo))
    assert len(back) == 0 and back.size == 3 and back.get(1, lambda: "new") == "new"


def _lattice(seed=3, n=4):
    rng = np.random.default_rng(seed)
    fsts = [random_fst(rng, num_states=5, num_arcs=12, num_pdfs=4) for _ in range(2)]
    return Lattice(FstBatch(fsts, seq_to_graph=rng.integers(0, 2, size=n))), rng


def test_the_engines_keep_their_data_in_the_lattice_memo_and_rebuild_it_after_clear_cache():
    """Nothing is poked into the lattice's attributes: every engine's data
    is a namespaced key of Lattice.cache; clear_cache drops it, and the next
    call rebuilds it with the same numbers."""
    from chainfb.engines import numba_log

    lat, rng = _lattice()
    X = rng.normal(size=(6, lat.num_columns))
    lengths = np.array([6, 4, 0, 5])
    names = ["numpy"] + (["numba"] if numba_log.available() else [])
    before = set(vars(lat))
    first = {e: engines.forward_backward(lat, X.copy(), lengths, engine=e) for e in names}
    assert set(vars(lat)) - before <= {"fwd", "bwd", "final", "seq_of_state", "_graph_states"}  # its properties
    users = {k[0] for k in lat.memo.keys()}
    assert set(names) <= users
    lat.clear_cache()
    assert len(lat.memo) == 0
    for e in names:
        again = engines.forward_backward(lat, X.copy(), lengths, engine=e)
        np.testing.assert_array_equal(again[0], first[e][0])
        np.testing.assert_array_equal(again[1], first[e][1])
    assert {k[0] for k in lat.memo.keys()} == users


def test_a_one_sequence_lattice_is_its_graphs_lattice():
    """A lattice of one sequence is the one-sequence lattice of its graph: ``graph_lattice`` gives the lattice
    itself (what the engines derive from the graph and from the lattice is then built once, e.g. the CUDA
    engine's arrays of a new CTC label set of one sequence), and it holds no reference to itself through its
    batch."""
    rng = np.random.default_rng(4)
    fsts = [random_fst(rng, num_states=5, num_arcs=12, num_pdfs=4) for _ in range(3)]
    for g in range(3):
        lat = Lattice.of(FstBatch(fsts, [g]))
        assert lat.graph_lattice() is lat
        assert lat.num_states == fsts[g].num_states and lat.start[0] == fsts[g].start  # graph-local ids
        two = Lattice.of(FstBatch(fsts, [g, g])).graph_lattice()
        for k in ("state_offsets", "start", "col_seq", "col_pdf", "final"):
            np.testing.assert_array_equal(getattr(lat, k), getattr(two, k))
    assert cyclic_garbage(lambda: Lattice.of(FstBatch(fsts, [1])).graph_lattice(), 3) == []


def test_batch_memo_shares_the_graphs_and_keeps_each_batch_lattice_apart():
    lat, _ = _lattice()
    batch = lat.batch
    other = batch.with_sequences([0, 1])
    assert Lattice.of(batch) is Lattice.of(batch) and Lattice.of(other) is not Lattice.of(batch)
    assert other.cache(("batch", "columns"), list) is batch.columns()  # one per set of graphs
    g = Lattice.of(other).graph_lattice() if Lattice.of(other).graph is not None else None
    assert g is None or g is Lattice.of(batch.with_sequences([1, 1])).graph_lattice()
    first = Lattice.of(batch)
    assert other.cache(("test", "marker"), lambda: 1) == 1 and batch.cache(("test", "marker"), lambda: 2) == 1
    batch.clear_cache()  # this batch's lattice, and the graphs' memo it shares
    assert other.cache(("test", "marker"), lambda: 3) == 3
    assert Lattice.of(batch) is not first


def _loss_steps():
    """One training step of each loss family, each with graphs it has not compiled before (new labels, new
    shapes), as in training."""
    g = torch.Generator().manual_seed(5)

    def labels(n, s, hi):
        return torch.randint(0, hi, (n, s), generator=g)

    def ctc():
        lp = torch.randn(7, 3, 6, generator=g).log_softmax(-1).requires_grad_()
        chainfb.ctc_loss(lp, labels(3, 2, 5) + 1, [7, 6, 7], [2, 2, 1]).backward()

    def transducers():
        lens = (torch.randint(3, 6, (2,), generator=g, dtype=torch.int32),  # new shapes: a new graph
                torch.randint(0, 3, (2,), generator=g, dtype=torch.int32))
        y = labels(2, 2, 3).int()  # labels 0..2; the blanks follow them
        x = torch.randn(2, 5, 3, 4, generator=g, requires_grad=True)
        chainfb.rnnt_loss(x, y, *lens, blank=3).backward()
        x = torch.randn(2, 5, 3, 4 + 3, generator=g, requires_grad=True)  # 4 tokens, durations 0, 1, 2
        chainfb.tdt_loss(x, y, *lens, blank=3, durations=[0, 1, 2]).backward()
        x = torch.randn(2, 5, 3, 5, generator=g, requires_grad=True)  # the blank and one big blank
        chainfb.multiblank_rnnt_loss(x, y, *lens, blank=4, big_blank_durations=[2]).backward()

    def numerators():
        fsts = chainfb.ctc_graph(labels(2, 2, 4) + 1)
        chainfb.fst_loglike(torch.randn(2, 6, 5, generator=g, requires_grad=True), fsts).sum().backward()
        shared = chainfb.ctc_graph(labels(1, 2, 4) + 1).fsts[0]
        chainfb.fst_loglike(torch.randn(3, 6, 5, generator=g, requires_grad=True), shared).sum().backward()

    return ctc, transducers, numerators


@pytest.mark.parametrize("step", _loss_steps(), ids=lambda f: f.__name__)
def test_a_step_leaves_no_reference_cycle(step):
    """What a loss compiles for a step (its graphs, lattice, index arrays, and on a GPU their device copies)
    is freed by reference counting once nothing holds it: no reference cycle among chainfb's objects leaves
    it to Python's cyclic collector (a step compiling new graphs would otherwise keep every earlier step's
    arrays until a collection, and touch fresh memory each step)."""
    for _ in range(2):  # the first calls fill the module-level caches
        step()
    assert cyclic_garbage(step, 20) == []  # more graphs than the losses' compile caches keep


@pytest.mark.parametrize("threads_", [1, 2, 3])
def test_split_covers_the_items_in_order(threads_):
    rng = np.random.default_rng(threads_)
    for work in (rng.integers(1, 50, size=17).astype(float), 17, np.zeros(0), 1):
        N = work if isinstance(work, int) else len(work)
        for min_work in (0, 1e9):
            ranges = threads.split(work, threads_, min_work)
            assert ranges[0][0] == 0 and ranges[-1][1] == N
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            if threads_ < 2 or N < 2 or min_work:
                assert ranges == [(0, N)]
            else:
                assert 2 <= len(ranges) <= threads_ * threads.PARTS_PER_THREAD and all(a < b for a, b in ranges)
    # items of equal cost: range k starts at N * k // parts
    assert threads.split(10, 2, 0) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert threads.split(10, 2, 11) == [(0, 10)]
