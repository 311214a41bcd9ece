#!/usr/bin/env bash
# The device bench, prepared for a lent CUDA machine (<= 8 minutes on one H100/H200-class GPU):
# real-geometry random-weight models (Qwen2.5-1.5B -> Qwen2.5-7B shapes from manifests/), fit
# statistics, mapping, RoPE, pack restore and transfer-vs-prefill at 2k / 8k / 32k tokens, then
# the RoPE section again with the compiled kernel. Results: $OUT/gpu.json, gpu-rope-compiled.json
# and gpu.md (markdown for BENCHMARKS.md).
#
#   bash bench/gpu.sh [OUT]          # OUT defaults to bench/results
#   PYTHON=.venv/bin/python bash bench/gpu.sh
#
# The same code runs on the CPU at tiny sizes (tests/test_bench_gpu.py):
#   python bench/bench_gpu.py --device cpu --sizes tiny --tokens 32,64
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results}
PY=${PYTHON:-python}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'error: no CUDA device (fix: run on a GPU machine, or bench/bench_gpu.py --device cpu --sizes tiny)')"
(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true) > "$OUT/gpu-device.txt"
timeout 400 "$PY" bench/bench_gpu.py --device cuda --sizes real --tokens 2048,8192,32768 --repeats 3 \
    --out "$OUT/gpu.json" | tee "$OUT/gpu.md"
echo >> "$OUT/gpu.md"
KVBRIDGE_ROPE_COMPILE=1 timeout 60 "$PY" bench/bench_gpu.py --device cuda --sizes real --tokens 8192,32768 \
    --sections rope --repeats 5 --out "$OUT/gpu-rope-compiled.json" | tee -a "$OUT/gpu.md"
echo "results in $OUT"
