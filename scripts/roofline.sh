#!/usr/bin/env bash
# This machine's roofline and the thread benchmark (results/speed/):
#   roofline.json  matmul peaks (fp32, bf16, fp64) and the main workloads' FLOP/s in fp32 and under bf16
#                  autocast, interleaved (python -m hf_clroute.bench.studies.roofline)
#   threads.json   small-ViT training with one core kept busy by another process: torch's default
#                  threads, the library's default, one thread (python -m hf_clroute.bench.studies.thread_bench)
#   threads-demo.json  the same three settings timing `hf-clroute demo` (DEMO=1; minutes per run)
# Measured on a shared machine: the JSON records the load average; only ratios within a pair mean much.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
"$BIN/python" -m hf_clroute.bench.studies.roofline --out results/speed/roofline.json --pairs "${PAIRS:-5}"
"$BIN/python" -m hf_clroute.bench.studies.thread_bench --out results/speed/threads.json --pairs "${PAIRS:-3}"
if [ "${DEMO:-0}" = 1 ]; then
  "$BIN/python" -m hf_clroute.bench.studies.thread_bench --out results/speed/threads-demo.json --pairs 1 \
    --command "$BIN/hf-clroute demo --out runs/threads-demo --no-progress"
fi
