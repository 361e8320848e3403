#!/bin/sh
# The GPU check in one command (see benchmarks/gpu_check.py): sh benchmarks/gpu_check.sh OUT_DIR [more gpu_check options]
# writes OUT_DIR/results.md, results.json, launches.json and steps.tar.gz (the steps' logs) within 480 s.
out=${1:?usage: sh benchmarks/gpu_check.sh OUT_DIR [options]}; shift
case $out in /*) ;; *) out="$PWD/$out" ;; esac
cd "$(dirname "$0")/.." && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python}" -m benchmarks.gpu_check --compact --out "$out" "$@"
