# Path and command moves of the scripts (tools/ -> chainfb/cli console scripts, benchmarks/, examples/,
# recipes/digits/), for README.md and docs/*.md:  sed -i -f PATH_MOVES.sed README.md docs/*.md
# Longest first: whole commands, then paths.
# -- rows and sentences about the tools/ folder as a whole
s#^| `tools/` | command-line scripts: .*|$#| `chainfb/cli/` | the console scripts (setup.cfg's entry points): `chainfb-make-den-graph`, `chainfb-make-numerator-graphs`, `chainfb-draw-transducer` (each also `python -m chainfb.cli.<module>`) |\n| `benchmarks/` | benchmarks and measurements, run from the repository root as `python -m benchmarks.<name>` (`bench_engine`, `bench_transducer`, `bench_pruned`, `bench_ctc`, `bench_durations`, `bench_transducer_maps`, `bench_cold_start`, `bench_contention`, `count_crossings`, `count_map_work`, `gpu_model`), and the GPU check (`sh benchmarks/gpu_check.sh OUT`: `gpu_check.py`, running `gpu_driver.py`, `gpu_compare.py`, `gpu_bench.py`); those that run the kernels under the CPU emulation take `PYTHONPATH=tests` |\n| `examples/` | demos, `python -m examples.demo_numerator`, `python -m examples.demo_chain` |#
s#run by `tools/train_digits.py` |$#run by `python -m recipes.digits` (training, `recipes/digits/__main__.py`) and `python -m recipes.digits.align` (alignment) |#
s#| progress bars in `tools/` |#| progress bars of the console scripts |#
s#`graphs/`, `tools/`, `recipes/`,#`graphs/`, `benchmarks/`, `examples/`, `recipes/`,#
s#the tests, the command-line tools and a spoken-digit#the tests, the benchmarks, the examples and a spoken-digit#
# -- docs/gpu.md: the GPU check's --emulate takes the test suite's emulation on the path
s#^`--emulate` runs the same steps on a machine without a GPU: the kernels' CPU emulation of the test suite, tiny$#`--emulate` (`PYTHONPATH=tests python -m benchmarks.gpu_check --emulate --out DIR`, from the repository root) runs the same steps on a machine without a GPU: the kernels' CPU emulation of the test suite, tiny#
# -- docs/layout.md: the layer of the console scripts (tests/test_layers.py's LAYERS)
/^| top | `chainfb`, `chainfb.testing` |/a\| cli | `chainfb.cli` | the console scripts (setup.cfg's entry points): graph building and drawing from the command line |
# -- the recipe: python -m recipes.digits (training), python -m recipes.digits.align
s|torchrun --standalone --nproc_per_node 2 tools/train_digits.py|torchrun --standalone --nproc_per_node 2 -m recipes.digits|g
s|python tools/train_digits.py|python -m recipes.digits|g
s|python tools/align.py|python -m recipes.digits.align|g
s|tools/train_digits.py|python -m recipes.digits|g
s|tools/align.py|python -m recipes.digits.align|g
# -- the graph tools: console scripts of the package
s|python tools/make_numerator_graphs.py|chainfb-make-numerator-graphs|g
s|python tools/draw_transducer.py|chainfb-draw-transducer|g
s|python tools/make_den_graph.py|chainfb-make-den-graph|g
s|tools/make_numerator_graphs.py|chainfb-make-numerator-graphs|g
s|tools/draw_transducer.py|chainfb-draw-transducer|g
s|tools/make_den_graph.py|chainfb-make-den-graph|g
# -- the demos: examples/
s|python tools/demo_numerator.py|python -m examples.demo_numerator|g
s|python tools/demo_chain.py|python -m examples.demo_chain|g
s|tools/demo_numerator.py|examples/demo_numerator.py|g
s|tools/demo_chain.py|examples/demo_chain.py|g
# -- benchmarks/ (the GPU check included); the kernel emulation given as PYTHONPATH=tests where it is used
# a command broken over two lines (docs/benchmarks.md): python at the end of one, the script at the start of the next
/python$/{N;s|python\ntools/\([a-z_]*\)\.py|python -m\nbenchmarks.\1|}
s|\.\.\. tools/bench_pruned.py|... -m benchmarks.bench_pruned|g
s|PYTHONPATH=\$PWD python tools/gpu_check.py|python -m benchmarks.gpu_check|g
s|PYTHONPATH=tests python benchmarks/gpu_model.py|PYTHONPATH=tests python -m benchmarks.gpu_model|g
s|python tools/count_map_work.py|PYTHONPATH=tests python -m benchmarks.count_map_work|g
s|tools/gpu_check.sh|benchmarks/gpu_check.sh|g
s|python tools/bench_transducer_maps.py|python -m benchmarks.bench_transducer_maps|g
s|python tools/bench_contention.py|python -m benchmarks.bench_contention|g
s|python tools/bench_transducer.py|python -m benchmarks.bench_transducer|g
s|python tools/bench_cold_start.py|python -m benchmarks.bench_cold_start|g
s|python tools/bench_durations.py|python -m benchmarks.bench_durations|g
s|python tools/gpu_block_sweep.py|python -m benchmarks.gpu_block_sweep|g
s|python tools/count_crossings.py|python -m benchmarks.count_crossings|g
s|python tools/count_map_work.py|python -m benchmarks.count_map_work|g
s|python tools/bench_engine.py|python -m benchmarks.bench_engine|g
s|python tools/bench_pruned.py|python -m benchmarks.bench_pruned|g
s|python tools/_gpu_report.py|python -m benchmarks._gpu_report|g
s|python tools/gpu_compare.py|python -m benchmarks.gpu_compare|g
s|python tools/gpu_profile.py|python -m benchmarks.gpu_profile|g
s|python tools/gpu_driver.py|python -m benchmarks.gpu_driver|g
s|python tools/_emulation.py|python -m benchmarks._emulation|g
s|python tools/_gpu_cases.py|python -m benchmarks._gpu_cases|g
s|python tools/_gpu_place.py|python -m benchmarks._gpu_place|g
s|python tools/gpu_bench.py|python -m benchmarks.gpu_bench|g
s|python tools/bench_ctc.py|python -m benchmarks.bench_ctc|g
s|python tools/gpu_check.py|python -m benchmarks.gpu_check|g
s|python tools/gpu_model.py|python -m benchmarks.gpu_model|g
s|python tools/_memory.py|python -m benchmarks._memory|g
s|tools/bench_transducer_maps.py|benchmarks/bench_transducer_maps.py|g
s|tools/bench_contention.py|benchmarks/bench_contention.py|g
s|tools/bench_transducer.py|benchmarks/bench_transducer.py|g
s|tools/bench_cold_start.py|benchmarks/bench_cold_start.py|g
s|tools/bench_durations.py|benchmarks/bench_durations.py|g
s|tools/gpu_block_sweep.py|benchmarks/gpu_block_sweep.py|g
s|tools/count_crossings.py|benchmarks/count_crossings.py|g
s|tools/count_map_work.py|benchmarks/count_map_work.py|g
s|tools/bench_engine.py|benchmarks/bench_engine.py|g
s|tools/bench_pruned.py|benchmarks/bench_pruned.py|g
s|tools/_gpu_report.py|benchmarks/_gpu_report.py|g
s|tools/gpu_compare.py|benchmarks/gpu_compare.py|g
s|tools/gpu_profile.py|benchmarks/gpu_profile.py|g
s|tools/gpu_driver.py|benchmarks/gpu_driver.py|g
s|tools/_emulation.py|benchmarks/_emulation.py|g
s|tools/_gpu_cases.py|benchmarks/_gpu_cases.py|g
s|tools/_gpu_place.py|benchmarks/_gpu_place.py|g
s|tools/gpu_bench.py|benchmarks/gpu_bench.py|g
s|tools/bench_ctc.py|benchmarks/bench_ctc.py|g
s|tools/gpu_check.py|benchmarks/gpu_check.py|g
s|tools/gpu_model.py|benchmarks/gpu_model.py|g
s|tools/_memory.py|benchmarks/_memory.py|g
