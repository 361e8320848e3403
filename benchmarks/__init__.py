"""The benchmarks and measurements of chainfb, and the GPU check.  Each runs from the repository root as a module of
this package, ``python -m benchmarks.<name> [--help]``, and so measures the chainfb of this tree (the root is on the
path); the modules share code by relative imports (``_memory``: peak memory; ``_gpu_*``: the GPU check's cases,
places and report).  Those that run the CUDA kernels without a GPU use the test suite's CPU emulation, given on the
command line: ``PYTHONPATH=tests python -m benchmarks.<name>`` (``gpu_model``, ``count_map_work``,
``bench_transducer_maps --device cpu``, ``gpu_check --emulate``).  The GPU check in one command:
``sh benchmarks/gpu_check.sh OUT_DIR``."""
