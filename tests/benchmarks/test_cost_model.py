"""The GPU cost model (tests/emulation/cost_model.py): its calibration
reproduces the measured figures, blocks are placed on the device's slots,
and the work it prices is the kernels' own count."""

import numpy as np
import pytest

from chainfb import FstBatch, Lattice
from chainfb.engines import cuda as cuda_engine
from chainfb.testing import numerator_like_fst

from emulation import cost_model as cm
from emulation import find_compiler


def test_calibration_reproduces_the_measured_times():
    costs, report = cm.calibrate()
    assert len(report) == 5
    for case, kernel, measured, fitted in report:
        assert 0.8 <= fitted / measured <= 1.25, (case, kernel, measured, fitted)
    assert costs.arc_d > costs.arc_f > 0 and costs.state_d > costs.state_f > 0 and costs.l2_factor >= 1


def test_blocks_fill_the_slots_then_queue():
    dev = cm.H200
    # 1024-thread blocks: two per SM, so 264 run at once and the 265th waits for the first to end
    assert cm.makespan([1.0] * 264, dev, 1024, 0) == 1.0
    assert cm.makespan([1.0] * 265, dev, 1024, 0) == 2.0
    assert cm.makespan([5.0, 1.0, 1.0], dev, 1024, 0) == 5.0
    # shared memory limits the blocks an SM holds: one 200 KiB block per SM
    assert cm.makespan([1.0] * 133, dev, 32, 200 * 1024) == 2.0


@pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler")
def test_staged_frames_wait_on_no_memory(emulated_counting, monkeypatch):
    """In the staged mode a frame's rows and scores are in shared memory: the
    recursion counts no memory wait and arc terms read from shared memory;
    with everything in device memory every busy thread waits once a frame."""
    be = emulated_counting
    rng = np.random.default_rng(0)
    lat = Lattice.of(FstBatch([numerator_like_fst(rng, num_phones=10, num_pdfs=30) for _ in range(2)]))
    X = rng.normal(size=(12, lat.num_columns)).astype(np.float32)
    lengths = np.array([12, 9])
    runs = {}
    for mode in (2, 0):
        monkeypatch.setattr(cuda_engine, "MODES", (mode, 0))
        be.stats.clear()
        cuda_engine.forward_backward(be, lat, X.copy(), lengths)
        runs[mode] = be.stats[0]  # the recursion
    staged, plain = runs[2], runs[0]
    assert staged.work["kWorkMemoryWait"] == 0 and plain.work["kWorkMemoryWait"] > 0
    assert staged.work["kWorkArcSharedF"] == plain.work["kWorkArcF"] > 0
    costs = cm.Costs(arc_d=100, arc_f=50, state_d=200, state_f=100, wait=500)
    assert cm.launch_time(staged, costs) < cm.launch_time(plain, costs)


@pytest.fixture
def emulated_counting(tmp_path):
    from emulation import EmulatedBackend, build

    be = EmulatedBackend(build(str(tmp_path)), count=True)
    be.set_work_weights(cm.Costs(arc_d=100, arc_f=50, state_d=200, state_f=100, wait=500).weights())
    return be


def test_recursion_refit_to_the_measured_h100_times():
    """The current recursion kernels' costs fitted to an H100's block-size sweep (benchmarks/gpu_block_sweep.py):
    every measured launch within 0.75x-1.35x of the fit, in each shared-memory mode, with a state costing more
    than a frame's barrier and reductions per thread; and the RNN-T batch's recursion, which the fit did not
    see, within 0.7x-1.4x of its measured 0.889 ms."""
    from emulation import recursion_fit as rf
    from emulation import shapes

    for mode in (2, 1, 0):
        p, rows = rf.fit(mode)
        ratios = np.array([fit / sec for *_, sec, fit in rows])
        assert len(rows) == 20 and 0.75 <= ratios.min() and ratios.max() <= 1.35, (mode, ratios)
        arc, state, frame, warp = p
        assert 2.5 * arc + state > 0.5 * frame > 0 and warp > 0
    p, _ = rf.fit(2)
    lat, lengths, _ = shapes.rnnt_lattice(*shapes.librispeech_batch(8))
    got = rf.predict(rf.recursion_blocks(lat, lengths, 128), p) * 1e3
    assert 0.7 <= got / rf.RNNT_H100 <= 1.4, got


def test_current_kernels_priced_from_the_h100():
    """The posterior kernels' one rate fits their four measured CTC launches within 0.7x-1.35x, and the RNN-T
    batch's four kernels, priced from the H100 (the recursion by the sweep's fit, which did not see it; the maps
    by the rates fitted to this batch and a larger one), sum within 0.8x-1.25x of their measured 1.93 ms."""
    from benchmarks.gpu_model import fitted_map_rates
    from benchmarks.count_map_work import criterion_layout, map_bytes
    from emulation import h100, shapes
    from emulation.recursion_fit import POSTERIORS_H100

    for (T, N, _C, S), ms in POSTERIORS_H100.items():
        assert 0.7 <= h100.posterior_time(T, N * (2 * S + 2)) * 1e3 / ms <= 1.35
    rates = fitted_map_rates()
    T, U = shapes.librispeech_batch(8)
    shape = (8, int(T.max()), int(U.max()) + 1, 500)
    moved = map_bytes(criterion_layout("rnnt", shape[2], T, U, ()), shape)
    lat, lengths, _ = shapes.rnnt_lattice(T, U)
    got = (h100.recursion_time(lat, lengths, 128, 2) + h100.posterior_time(int(lengths.max()), lat.num_states)
           + sum(h100.map_time(k, sum(moved[f"transducer_{k}"]), rates) for k in ("gather", "grad")))
    measured = h100.STEPS_H100["rnnt B=8 V=500"][2]
    assert 0.8 <= got * 1e3 / measured <= 1.25, (got, measured)


def test_a_cluster_is_priced_as_its_threads_over_one_block_s_frame():
    """A cluster of K blocks of B threads (cluster.cu) gives each thread the states a block of K * B threads would,
    with the frame's fixed costs of one B-thread block: at T = 2000, N = 8, S = 1000 (2,001 states, one block
    carries two a thread) each cluster size halves or better the busiest thread's states and the priced recursion;
    the step's margin over the peer (the most the cluster barrier may add a frame) is what the report prints, and
    it is negative where the step is bound by the host (T = 500, N = 16)."""
    from emulation import h100, shapes
    from emulation import recursion_fit as rf

    lat, lengths, _ = shapes.ctc_lattice(2000, 8, 100, 1000)
    one = rf.recursion_blocks(lat, lengths, 1024)
    for K, B in ((2, 1024), (4, 512), (8, 256)):
        got = rf.recursion_blocks(lat, lengths, B, 1, K)
        wide = rf.recursion_blocks(lat, lengths, K * B)
        np.testing.assert_array_equal(got[:, :3], wide[:, :3])  # the busiest thread of K * B threads
        assert (got[:, 3] == B // 32).all() and (got[:, 2] == 1).all() and (one[:, 2] == 2).all()
    rows = {(r["case"], r["cluster"]): r for r in h100.cluster_rows()}
    long = [rows["ctc T=2000 N=8 C=100 S=1000", K] for K in (2, 4, 8)]
    assert [r["block"] for r in long] == [1024, 512, 256]
    assert all(r["recursion_ms"] < 0.7 * r["one_block_ms"] and r["meets_if_s_ns"] > 0 for r in long)
    assert rows["ctc T=500 N=16 C=500 S=100", 2]["meets_if_s_ns"] < 0
    assert ("ctc T=150 N=64 C=5000 S=50", 2) not in rows  # 256 clusters of 2 do not fit 132 SMs at once
    assert ("ctc T=4000 N=1 C=5000 S=3000", 2) not in rows  # one sequence: the shared-graph kernels
    assert "not measured" in h100.cluster_report()


@pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler")
def test_every_launch_of_a_ctc_step_is_priced(emulated_counting):
    """benchmarks/gpu_model.py prices each launch of a CTC step (forward + backward): the engine's kernels from the
    H100's measurements, the pdf score map's as part of the step's measured remainder (CuPy operations when the H100
    ran), and every one by the cost model's units -- a kernel the step launches that neither knows is an error."""
    from benchmarks import gpu_model

    be = emulated_counting
    be.max_shared_mem = 227 * 1024
    costs = cm.Costs(arc_d=100, arc_f=50, state_d=200, state_f=100, wait=500)
    launches, extra, calls = gpu_model.run_ctc(be, costs, cm.H100, 20, 3, 12, 4)
    names = [s.name for s, _ in launches]
    assert names == ["chainfb::pdf_gather<float, float>", "chainfb::fb_recursion<float>",
                     "chainfb::fb_posteriors<float>", "chainfb::pdf_scatter<float, float>"]
    assert all(t > 0 for _, t in launches) and extra == 20 * 3 * 12 * 4 / (cm.H100.bandwidth * 0.9)
    prices = gpu_model.h100_prices([s for s, _ in launches], calls, {"gather": 1.0, "grad": 1.0},
                                   cuda_engine.shared_budget(be))
    assert prices[0] is None and prices[3] is None and prices[1] > 0 and prices[2] > 0


def test_a_ctc_step_on_a_cluster_is_priced(emulated_counting):
    """A CTC sequence wide enough for ``cluster="auto"`` (200 labels: 401 states, two blocks a direction): its
    cluster recursion is priced from the H100's refit with the cluster's threads, at the block the engine plans."""
    from benchmarks import gpu_model

    be = emulated_counting
    be.max_shared_mem = 227 * 1024
    costs = cm.Costs(arc_d=100, arc_f=50, state_d=200, state_f=100, wait=500)
    launches, _, calls = gpu_model.run_ctc(be, costs, cm.H100, 410, 1, 12, 200)
    assert [s.name for s, _ in launches][1] == "chainfb::fb_cluster_recursion<float, 2>"
    prices = gpu_model.h100_prices([s for s, _ in launches], calls, {"gather": 1.0, "grad": 1.0},
                                   cuda_engine.shared_budget(be))
    assert prices[1] > 0 and prices[2] > 0
