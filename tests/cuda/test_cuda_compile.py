"""Every CUDA kernel compiles for sm_80 and sm_90 without errors or warnings.

NVRTC through CuPy when CuPy (e.g. ``cupy-cuda12x`` with
``nvidia-cuda-nvrtc-cu12``) is importable and finds libnvrtc; otherwise the
``nvcc`` binary; otherwise the test skips.  Neither needs a GPU.
"""

import io
import os
import shutil
import subprocess

import pytest

from chainfb.cuda.kernels import KERNELS, MIN_COMPUTE, SOURCES, load_source, nvrtc_options

ARCHS = ["sm_80", "sm_90"]


def _skip_below(src: str, arch: str) -> None:
    """Skip a source on an architecture its kernels do not support (thread block clusters: sm_90 on)."""
    if int(arch.split("_")[1]) < MIN_COMPUTE.get(src, 0):
        pytest.skip(f"{src} needs compute capability {MIN_COMPUTE[src]}")


def _nvrtc():
    try:
        from cupy.cuda import compiler, nvrtc

        nvrtc.getVersion()  # loads libnvrtc
        return compiler
    except Exception:
        return None


NVRTC = _nvrtc()
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVRTC is None, reason="CuPy with NVRTC not available")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("src", sorted(SOURCES))
def test_nvrtc_compiles_without_warnings(src, arch):
    _skip_below(src, arch)
    prog = NVRTC._NVRTCProgram(load_source(src), src, name_expressions=SOURCES[src])
    log = io.StringIO()
    ptx, mapping = prog.compile(nvrtc_options(arch), log)
    assert log.getvalue().strip() == "", log.getvalue()
    assert set(mapping) == set(SOURCES[src])  # every instantiation was generated
    assert ptx


@pytest.mark.skipif(NVCC is None, reason="nvcc not available")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("src", sorted(SOURCES))
def test_nvcc_compiles_without_warnings(src, arch, tmp_path):
    _skip_below(src, arch)
    # instantiate every kernel by taking its address (what name_expressions does for NVRTC)
    refs = ",\n".join(f"  (const void*)&{name}" for name in SOURCES[src])
    code = load_source(src) + f"\nconst void* chainfb_instantiate[] = {{\n{refs}\n}};\n"
    cu = tmp_path / src
    cu.write_text(code)
    arch_num = arch.split("_")[1]
    cmd = [NVCC, f"-arch=compute_{arch_num}", "--ptx", "-std=c++17", "-Werror", "all-warnings",
           "-o", str(tmp_path / "out.ptx"), str(cu)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr.lower(), res.stderr
    ptx = (tmp_path / "out.ptx").read_text()
    for name in SOURCES[src]:
        base = name.split("<")[0].split("::")[-1]
        assert base in ptx


def test_sources_are_package_data():
    import configparser
    import fnmatch

    here = os.path.dirname(os.path.abspath(__import__("chainfb.cuda").cuda.__file__))
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(os.path.dirname(os.path.dirname(here)), "setup.cfg"))
    shipped = [p.strip() for p in cfg["options.package_data"]["chainfb"].split(",")]
    for src in set(KERNELS.values()) | {"common.cuh", "forward_backward.cuh"}:
        assert os.path.isfile(os.path.join(here, src)), src
        assert any(fnmatch.fnmatch(f"cuda/{src}", p) for p in shipped), src
    # the host emulation belongs to the tests: not in the package, not shipped
    assert not [f for f in os.listdir(here) if f.startswith("emulat")]
    assert not any(p.endswith((".h", ".cpp")) for p in shipped)
    assert '#include "common.cuh"' not in load_source("engine.cu")  # inlined for NVRTC


@pytest.mark.skipif(NVCC is None, reason="nvcc not available")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("src", sorted(SOURCES))
def test_kernels_fit_1024_thread_blocks(src, arch, tmp_path):
    """Every kernel (declared __launch_bounds__(1024)) can be launched with
    1024 threads: at most 64 registers per thread (64K per SM) and at most
    48 KiB of static shared memory, read from ptxas' resource report; the
    recursion kernels spill no registers."""
    import re

    _skip_below(src, arch)
    refs = ",\n".join(f"  (const void*)&{name}" for name in SOURCES[src])
    cu = tmp_path / src
    cu.write_text(load_source(src) + f"\nconst void* chainfb_instantiate[] = {{\n{refs}\n}};\n")
    cmd = [NVCC, "-cubin", f"-arch={arch}", "-std=c++17", "--resource-usage", "-o", str(tmp_path / "out.cubin"),
           str(cu)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    report = res.stdout + res.stderr
    used = re.findall(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?", report)
    assert len(used) >= len(SOURCES[src]), report
    for regs, smem in used:
        assert int(regs) * 1024 <= 65536, report
        assert int(smem or 0) <= 48 * 1024, report
    if src in ("engine.cu", "shared_graph.cu", "cluster.cu"):  # dynamic shared memory planned beside the static
        from chainfb.engines.cuda import STATIC_SHARED

        assert max(int(smem or 0) for _, smem in used) <= STATIC_SHARED, report
    # the recursions' frame loop keeps its state in registers: no spills to local memory
    spills = re.findall(r"Function properties for (\w+)\s+\d+ bytes stack frame, (\d+) bytes spill stores", report)
    recursions = [(name, int(n)) for name, n in spills if "recursion" in name]
    assert len(recursions) == sum("recursion" in name for name in SOURCES[src]), report
    assert all(n == 0 for _, n in recursions), recursions


_PROBE = r'''
template <typename R>
CHAINFB_KERNEL void chainfb_probe(const R* x, R* out, int n) {
  CHAINFB_DYNAMIC_SHARED(R, buf);
  CHAINFB_DYNAMIC_SHARED(int, again);
  const int t = threadIdx.x;
  buf[t] = x[t];
  __syncthreads();
  R v = buf[(t + 1) % n] + (R)again[0];
  CHAINFB_WORK(chainfb::work_arc<R>(), 1);
  CHAINFB_WORK(chainfb::work_state<R>(), n);
  CHAINFB_WORK(chainfb::kWorkBytes, sizeof(R));
  out[t] = chainfb::Num<R>::exp_(v) + chainfb::Num<R>::log_(v) + chainfb::Num<R>::log1p_(v);
}
const void* chainfb_instantiate[] = {(const void*)&chainfb_probe<float>, (const void*)&chainfb_probe<double>};
'''


@pytest.mark.skipif(NVCC is None, reason="nvcc not available")
@pytest.mark.parametrize("arch", ARCHS)
def test_nvcc_compiles_the_kernel_annotations(arch, tmp_path):
    """What common.cuh gives kernels beyond today's (CHAINFB_DYNAMIC_SHARED,
    twice in one scope; CHAINFB_WORK with the work_arc / work_state
    categories) compiles without warnings, the dynamic shared memory
    16-byte aligned."""
    cu = tmp_path / "probe.cu"
    cu.write_text(load_source("common.cuh") + _PROBE)
    arch_num = arch.split("_")[1]
    cmd = [NVCC, f"-arch=compute_{arch_num}", "--ptx", "-std=c++17", "-Werror", "all-warnings",
           "-o", str(tmp_path / "out.ptx"), str(cu)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0 and "warning" not in res.stderr.lower(), res.stderr
    ptx = (tmp_path / "out.ptx").read_text()
    assert ".extern .shared .align 16 .b8 chainfb_dynamic_shared_[]" in ptx
