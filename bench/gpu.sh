#!/usr/bin/env bash
# The device bench, prepared for a lent CUDA machine (<= 8 minutes on one H100/H200-class GPU):
# real-geometry random-weight models (Qwen2.5-1.5B -> Qwen2.5-7B shapes from manifests/), fit
# statistics, mapping, RoPE (eager kernels on a GPU), pack restore and transfer-vs-prefill at
# 2k / 8k / 32k tokens. Results: $OUT/gpu.json and gpu.md (markdown for BENCHMARKS.md).
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
# HumanEval pass@1 on the real pair, all 164 problems (bench/bench_humaneval_pair.py: llama.cpp
# generation on the Q4_K_M GGUFs, the 0.5B's transformers prefill on CUDA), only where the GGUFs and
# the mapping are on the machine (HE_MODELS, HE_MAPPING); resumable: a rerun continues the JSONL.
HE_MODELS=${HE_MODELS:-$HOME/.cache/kvbridge/models}
HE_MAPPING=${HE_MAPPING:-/work/pair-runs/run1/map-k4-a0.01}
if [ -f "$HE_MODELS/qwen2.5-coder-1.5b-instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" ] && [ -d "$HE_MAPPING" ]; then
    timeout "${HE_TIMEOUT:-900}" "$PY" bench/bench_humaneval_pair.py --problems 0-163 --models "$HE_MODELS" \
        --mapping "$HE_MAPPING" --device cuda --threads 8 --out "$OUT/humaneval-pair.jsonl" || true
    "$PY" bench/bench_humaneval_pair.py --summary "$OUT/humaneval-pair.jsonl" | tee "$OUT/humaneval-pair.md" || true
else
    echo "skipped HumanEval on the pair: no GGUFs under $HE_MODELS or no mapping $HE_MAPPING" | tee "$OUT/humaneval-pair.md"
fi
echo "results in $OUT"
