"""benchmarks/bench_ctc.py's host measurements of the GPU path (--compile, --host-step, --host-step-loader) run
without a GPU and
print one row per GPU benchmark shape."""

import pytest

from benchmarks import bench_ctc


@pytest.mark.parametrize("flag", ["--compile", "--host-step", "--host-step-loader"])
def test_host_measurements_print_every_shape(flag, capsys):
    bench_ctc.main([flag, "--repeat", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("(")]
    assert [r.split(")")[0] + ")" for r in rows] == [str(s) for s in bench_ctc.GPU_SHAPES]
    values = [[float(x) for x in r.split(")")[1].split()] for r in rows]
    if flag == "--host-step":  # two times, then the page faults of a step with new labels (0 or more)
        assert all(len(v) == 3 and v[0] > 0 and v[1] > 0 and v[2] >= 0 and v[2] == int(v[2]) for v in values)
    elif flag == "--host-step-loader":  # four times
        assert all(len(v) == 4 and min(v) > 0 for v in values)
    else:  # the arcs and the time
        assert all(len(v) == 2 and v[0] > 0 and v[1] > 0 for v in values)
