"""What the kernel emulation (tests/emulation/emulate.h) catches beyond a plain
run: barriers after an exited thread, uninitialised shared memory (poisoned
with NaN, one copy per block, static and dynamic), launch limits, blocks and
threads in a random order, deadlocks and misused warp intrinsics, and data
races (ThreadSanitizer on a replay of recorded launches); and what it
reproduces or measures: CUDA's warp shuffles, the work kernels annotate,
the math modes."""

import ctypes
import os
import subprocess

import numpy as np
import pytest

from emulation import EmulatedBackend, build, build_replay, find_compiler

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler")


@pytest.fixture(scope="module")
def selftest(emulated_selftest_library):
    return EmulatedBackend(emulated_selftest_library)


def test_barrier_after_exit_is_an_error(selftest):
    out = np.zeros(8, dtype=np.int32)
    with pytest.raises(RuntimeError, match="exited"):
        selftest.launch("cfb_selftest::early_exit_then_sync", 2, 8, [out])
    selftest.launch("cfb_selftest::early_exit_then_sync", 1, 1, [out])  # one thread: no barrier is left waiting


def test_shared_memory_is_per_block_and_poisoned(selftest):
    out = np.zeros(6 * 8, dtype=np.float32)
    selftest.launch("cfb_selftest::read_shared_first", 6, 8, [out])
    assert np.isnan(out).all()  # every block reads its own fresh, poisoned copy


def test_launch_limits(selftest):
    out = np.zeros(2, dtype=np.float64)
    with pytest.raises(RuntimeError, match="shared memory"):
        selftest.launch("cfb_selftest::too_much_shared", 2, 32, [out])
    with pytest.raises(ValueError, match="1024"):
        selftest.launch("cfb_selftest::block_order", 1, 1025, [np.zeros(1, np.int32), np.zeros(1, np.int32)])

    args = (ctypes.c_void_p * 2)()
    assert selftest.lib.cfb_launch(b"cfb_selftest::block_order", 1, 2048, args) == 1
    assert b"1024" in selftest.lib.cfb_last_error()


def test_clusters_share_memory_and_a_barrier(selftest):
    """A kernel declared with thread block clusters of 2: the two blocks of a
    cluster write into each other's shared memory and meet at the cluster's
    barrier; misusing either is an error, not a hang or a stray write."""
    n, grid = 8, 6
    out = np.zeros(grid * n, dtype=np.float32)
    selftest.launch("cfb_selftest::cluster_exchange", grid, n, [out, np.int32(0), np.int32(0)], shared_mem=4 * n)
    partner = np.arange(grid) ^ 1  # block 2c + r's partner is 2c + 1 - r
    np.testing.assert_array_equal(out.reshape(grid, n), 1000 * partner[:, None] + np.arange(n)[None, :])
    with pytest.raises(RuntimeError, match="the other barrier"):
        selftest.launch("cfb_selftest::cluster_exchange", 2, n, [out, np.int32(1), np.int32(0)], shared_mem=4 * n)
    with pytest.raises(RuntimeError, match="outside the dynamic shared memory"):
        selftest.launch("cfb_selftest::cluster_exchange", 2, n, [out, np.int32(0), np.int32(1)], shared_mem=4 * n)
    with pytest.raises(RuntimeError, match="dividing the grid"):
        selftest.launch("cfb_selftest::cluster_exchange", 3, n, [out, np.int32(0), np.int32(0)], shared_mem=4 * n)


def test_blocks_run_in_random_order(selftest):
    order = np.full(64, -1, dtype=np.int32)
    counter = np.zeros(1, dtype=np.int32)
    selftest.launch("cfb_selftest::block_order", 64, 2, [order, counter])
    assert sorted(order) == list(range(64)) and list(order) != list(range(64))


def test_threads_of_each_phase_run_in_a_shuffled_order(selftest):
    n, phases = 16, 6
    order = np.full(phases * n, -1, dtype=np.int32)
    counter = np.zeros(phases, dtype=np.int32)
    selftest.launch("cfb_selftest::phase_order", 1, n, [order, counter, np.int32(phases)])
    rows = order.reshape(phases, n)
    assert all(sorted(r) == list(range(n)) for r in rows)
    assert len({tuple(r) for r in rows}) == phases  # a new order in every phase


def _race(be, monkeypatch, seed):
    monkeypatch.setenv("CHAINFB_EMULATE_SEED", str(seed))
    out = np.zeros(64, dtype=np.float32)
    be.launch("cfb_selftest::shared_race", 64, 2, [out])
    return out


def test_a_race_changes_results_between_seeds_and_repeats_for_one(selftest, monkeypatch):
    """Thread 1 reads a slot thread 0 writes, with no barrier between: it
    sees the poison or the value depending on which runs first."""
    a = _race(selftest, monkeypatch, 1)
    assert np.isnan(a).any() and (a == 1).any()
    np.testing.assert_array_equal(_race(selftest, monkeypatch, 1), a)  # the schedule is a function of the seed
    assert not np.array_equal(_race(selftest, monkeypatch, 2), a, equal_nan=True)


@pytest.mark.parametrize("mode, block, match", [
    (0, 2, r"deadlock in block \d+: .*exited"),
    (1, 2, r"deadlock in block \d+: warp 0 diverged: .*__shfl_sync\(0x00000003\) at emulate_selftest.h:\d+"),
    (2, 2, r"deadlock in block \d+: .*__syncthreads\(\)"),
    (3, 2, r"thread 0 \(warp 0, lane 0\) of block \d+ calls __shfl_sync\(0x00000002\).*without its own lane"),
    (4, 8, r"__shfl_xor_sync\(0xffffffff\).*names lanes 8-31 that warp 0 does not have \(it has lanes 0-7\)"),
    (5, 2, r"reads lane 2 .*outside the mask"),
    (6, 4, r"width 3"),
])
def test_misused_warp_intrinsics_are_errors_not_hangs(selftest, monkeypatch, mode, block, match):
    for seed in (1, 2, 3):  # both orders of the two lanes
        monkeypatch.setenv("CHAINFB_EMULATE_SEED", str(seed))
        with pytest.raises(RuntimeError, match=match):
            selftest.launch("cfb_selftest::warp_misuse", 3, block, [np.int32(mode), np.zeros(block, np.int32)])
    selftest.launch("cfb_selftest::warp_misuse", 3, block, [np.int32(99), np.zeros(block, np.int32)])  # no misuse


def _run_kernels(be):
    """A few engine and transducer launches (inputs as in the other tests)."""
    import test_cuda_emulated as t

    rng = np.random.default_rng(0)
    lat = t.Lattice.of(t.FstBatch([t.random_fst(rng, num_states=5, num_arcs=12) for _ in range(3)]))
    X = rng.normal(size=(5, lat.num_columns))
    t._compare(be, lat, X, np.array([5, 2, 0]), block=4, leaky=(0.1, np.log(np.full(lat.num_states, 0.2))))
    t._compare(be, lat, X, np.array([5, 3, 1]), block=8, dtype=np.float32, rtol=2e-5, atol=2e-6)
    for K in (2, 4):  # each direction over a cluster of blocks: its barrier and distributed shared memory
        t.lattice_forward_backward(be, lat, X.copy(), np.array([5, 2, 0]), block_size=32, cluster=K)
    logits, args, C, rows, zc = t._case(rng, M=2)
    x = t._as_input(logits, "f16")
    Xe, lse = t.transducer_gather(be, x, num_rows=rows, num_columns=C, zero_col=zc, threads_per_row=4,
                                     block_size=8, **args)
    t.transducer_grad(be, x, post=np.abs(np.nan_to_num(Xe, neginf=0.0)), lse=lse, scale=1.0,
                         kind_weight=np.ones(4), clamp=0.5, threads_per_row=4, block_size=8, **args)
    import test_cuda_emulated_durations as du  # the duration axis, X written whole

    logits, args, C, rows = du._tdt_case(rng)
    Xe, lse = t.transducer_gather(be, logits, num_rows=rows, num_columns=C, threads_per_row=4, block_size=8,
                                  every_column=True, **args)
    t.transducer_grad(be, logits, post=np.abs(np.nan_to_num(Xe, neginf=0.0)), lse=lse, scale=1.0,
                      kind_weight=np.ones(args["sym"].shape[2]), threads_per_row=4, block_size=8, **args)


def test_portable_fiber_switch(tmp_path):
    """The swapcontext fibers (the emulation's switch off x86-64) run the
    kernels as the hand-written switch does."""
    be = EmulatedBackend(build(str(tmp_path), extra_flags=("-DCHAINFB_EMULATE_UCONTEXT",
                                                           "-DCHAINFB_EMULATE_SELFTEST")))
    _run_kernels(be)
    out = np.zeros(2 * 40, dtype=np.int64)
    be.launch("cfb_selftest::warp_sum", 2, 40, [out])
    np.testing.assert_array_equal(out[0::2], [496] * 32 + [284] * 8)
    with pytest.raises(RuntimeError, match="deadlock in block"):
        be.launch("cfb_selftest::warp_misuse", 2, 2, [np.int32(2), np.zeros(2, np.int32)])


def test_replay_of_recorded_launches(tmp_path):
    rec = tmp_path / "rec"
    rec.mkdir()
    be = EmulatedBackend(build(str(tmp_path)), record_to=str(rec))
    _run_kernels(be)
    files = sorted(str(p) for p in rec.iterdir())
    assert len(files) == len(be.launches) >= 5
    res = subprocess.run([build_replay(str(tmp_path)), *files], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "REPLAYED" in res.stdout, res.stderr


def test_emulation_under_tsan(tmp_path):
    """No data race in the kernels (a missing __syncthreads would be one):
    the launches of a few engine and transducer calls, recorded and replayed
    by a ThreadSanitizer build."""
    rec = tmp_path / "rec"
    rec.mkdir()
    be = EmulatedBackend(build(str(tmp_path)), record_to=str(rec))
    _run_kernels(be)
    try:
        exe = build_replay(str(tmp_path), extra_flags=("-fsanitize=thread",))
    except RuntimeError as e:
        pytest.skip(f"ThreadSanitizer build not available: {str(e)[-200:]}")
    files = sorted(str(p) for p in rec.iterdir())
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66")
    res = subprocess.run([exe, *files], capture_output=True, text=True, env=env, timeout=300)
    if "REPLAYED" not in res.stdout and "ThreadSanitizer" not in res.stderr:
        pytest.skip(f"could not run under TSan: {res.stderr[-300:]}")
    assert "WARNING: ThreadSanitizer" not in res.stderr, res.stderr[-3000:]
    assert res.returncode == 0 and "REPLAYED" in res.stdout, res.stderr[-2000:]


def _tsan_replay(tmp_path, library, launches):
    """Record `launches` ((name, grid, block, args, shared_mem) each) and
    replay each alone under ThreadSanitizer; the replays' results."""
    rec = tmp_path / "rec"
    rec.mkdir()
    be = EmulatedBackend(library, record_to=str(rec))
    for name, grid, block, args, shared_mem in launches:
        be.launch(name, grid, block, args, shared_mem=shared_mem)
    try:
        exe = build_replay(str(tmp_path), extra_flags=("-fsanitize=thread", "-DCHAINFB_EMULATE_SELFTEST"))
    except RuntimeError as e:
        pytest.skip(f"ThreadSanitizer build not available: {str(e)[-200:]}")
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66")
    out = []
    for f in sorted(rec.iterdir()):
        res = subprocess.run([exe, str(f)], capture_output=True, text=True, env=env, timeout=120)
        if "REPLAYED" not in res.stdout and "ThreadSanitizer" not in res.stderr:
            pytest.skip(f"could not run under TSan: {res.stderr[-300:]}")
        out.append(res)
    return out


def test_tsan_sees_each_emulated_thread(tmp_path, emulated_selftest_library):
    """Each CUDA thread is its own thread to ThreadSanitizer: a shared slot
    written by one and read by another with no barrier between is a data
    race, as is one ordered by a shuffle only; __syncwarp and __syncthreads
    order them (no report)."""
    f32 = np.float32
    synced, dynamic, race, shuffled = _tsan_replay(tmp_path, emulated_selftest_library, [
        ("cfb_selftest::warp_handoff", 3, 2, [np.int32(0), np.zeros(3, f32)], 0),
        ("cfb_selftest::dynamic_shared", 3, 8, [np.zeros(3 * 16, f32), np.int32(0)], 8 * 4),
        ("cfb_selftest::shared_race", 3, 2, [np.zeros(3, f32)], 0),
        ("cfb_selftest::warp_handoff", 3, 2, [np.int32(1), np.zeros(3, f32)], 0),
    ])
    for res in (synced, dynamic):
        assert res.returncode == 0 and "WARNING: ThreadSanitizer" not in res.stderr, res.stderr[-3000:]
    for res in (race, shuffled):
        assert "WARNING: ThreadSanitizer: data race" in res.stderr and res.returncode == 66, res.stderr[-3000:]
    assert "shared_race" in race.stderr and "warp_handoff" in shuffled.stderr
