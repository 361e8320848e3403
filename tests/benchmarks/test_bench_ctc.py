"""benchmarks/bench_ctc.py's host measurements of the GPU path (--compile, --host-step) run without a GPU and
print one row per GPU benchmark shape."""

import pytest

from benchmarks import bench_ctc


@pytest.mark.parametrize("flag", ["--compile", "--host-step"])
def test_host_measurements_print_every_shape(flag, capsys):
    bench_ctc.main([flag, "--repeat", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("(")]
    assert [r.split(")")[0] + ")" for r in rows] == [str(s) for s in bench_ctc.GPU_SHAPES]
    assert all(float(x) > 0 for r in rows for x in r.split(")")[1].split())
