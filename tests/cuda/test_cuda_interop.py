"""The torch caching-allocator blocks CuPy borrows (chainfb.cuda.interop.torch_malloc) are handed back to torch
when CuPy drops them -- also when that happens while the interpreter shuts down, without an error printed at exit.
Checked with a fake CuPy and a fake torch allocator (no GPU needed)."""

import paths  # tests/paths.py: the repository's and the tests' folders
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = paths.REPO

# A child interpreter: torch's allocator faked, a fake CuPy with the pieces torch_malloc uses; one block is
# dropped at once, another is kept in a chainfb module's global (as chainfb's caches keep device arrays), so CuPy
# drops it only while the interpreter shuts down (imports then fail: "sys.meta_path is None").
CHILD = textwrap.dedent("""
    import os, sys, types
    import torch

    made = []

    def fake_alloc(size, device, stream):
        made.append(size)
        return 4095 + len(made)

    def fake_delete(ptr, _write=os.write):  # uses only what it bound now: it also runs at interpreter shutdown
        _write(1, b"freed %d\\n" % ptr)

    if RAW:  # torch's raw allocator functions, which torch_malloc calls where this torch has them
        torch._C._cuda_cudaCachingAllocator_raw_alloc = lambda size, stream: fake_alloc(size, 0, stream)
        torch._C._cuda_cudaCachingAllocator_raw_delete = fake_delete
    else:  # a torch without them (a CPU build): the public functions
        for name in ("_cuda_cudaCachingAllocator_raw_alloc", "_cuda_cudaCachingAllocator_raw_delete"):
            if hasattr(torch._C, name):
                delattr(torch._C, name)
        torch.cuda.caching_allocator_alloc = fake_alloc
        torch.cuda.caching_allocator_delete = fake_delete

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.offset = mem, offset

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(
        Device=lambda *a: types.SimpleNamespace(id=0),
        get_current_stream=lambda: types.SimpleNamespace(ptr=0),
        UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer,
        runtime=types.SimpleNamespace(runtimeGetVersion=lambda: 13000))
    sys.modules["cupy"] = cupy
    import chainfb.cuda.kernels
    chainfb.cuda.kernels._torch_cuda_major = lambda: None  # no CUDA torch to match

    from chainfb.cuda.interop import torch_malloc

    dropped = torch_malloc(64)
    del dropped  # freed while everything is alive
    import chainfb.cuda.kernels
    chainfb.cuda.kernels.kept_for_the_test = torch_malloc(128)  # dropped at interpreter shutdown
    print("allocated", flush=True)
""")


def run_child(code, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.parametrize("raw", [True, False])
def test_blocks_freed_at_exit_go_back_to_torch_without_errors(tmp_path, raw):
    r = run_child(f"RAW = {raw}\n" + CHILD, tmp_path)
    assert r.stderr == "", r.stderr  # no "Exception ignored in: _TorchBlock.__del__ ... sys.meta_path is None"
    assert r.stdout.split("\n") == ["freed 4096", "allocated", "freed 4097", ""], r.stdout


@pytest.mark.parametrize("raw", [True, False])
def test_a_failing_free_at_exit_is_silent(tmp_path, raw):
    """torch's allocator already gone when the last block is dropped: nothing to hand back, nothing printed."""
    failing = CHILD.replace("_write(1, b", "if ptr == 4097:\n        raise RuntimeError('allocator gone')\n"
                                           "    _write(1, b")
    r = run_child(f"RAW = {raw}\n" + failing, tmp_path)
    assert r.stderr == "", r.stderr
    assert r.stdout.split("\n") == ["freed 4096", "allocated", ""], r.stdout
