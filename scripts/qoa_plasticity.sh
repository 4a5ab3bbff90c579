#!/usr/bin/env bash
# QOA's plasticity claim in its regime (issue 32): 7x7 permuted MNIST, 120 tasks x 200 steps with Adam at
# lr 0.01, where plain backprop loses plasticity; continual backprop and QOA on the same stream
# (suite permuted-mnist-plasticity; QOA's support size and why are in the suite's description).
#   scripts/qoa_plasticity.sh          seeds 0,1,2 (SEEDS= a subset), one job per seed, then merged
#   METHODS=qoa-s1000 scripts/qoa_plasticity.sh
#                                      QOA at the paper's support of 1000 (a named row of the suite) on the
#                                      same seeds' streams, into its own per-seed folders, then merged; the
#                                      same for the controls: METHODS=backprop-memory (backprop with QOA's
#                                      buffer and task heads; backprop-memory-s1000 replays 1000 items a step),
#                                      METHODS=full_attention
#   scripts/qoa_plasticity.sh merge    merge the per-seed runs and write the paired comparisons
# Output: results/qoa-plasticity (results.json, results.md, plasticity.png, paired.json).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
runs=results/qoa-plasticity-runs
out=results/qoa-plasticity
merge() {
  "$BIN/hf-clroute" merge --out "$out" "$runs"/seed*
  local pairs=(last_window:qoa/backprop last_window:qoa/cbp plasticity_drop:qoa/backprop plasticity_drop:cbp/backprop
               erank_last:qoa/backprop)
  # the rows run apart (METHODS=...) join the pairs once some seed of theirs is in
  has qoa-s1000 && pairs+=(last_window:qoa-s1000/backprop last_window:qoa-s1000/cbp plasticity_drop:qoa-s1000/backprop
                           plasticity_drop:qoa-s1000/cbp plasticity_drop:qoa-s1000/qoa erank_last:qoa-s1000/backprop)
  has backprop-memory && pairs+=(final_old:qoa/backprop-memory final_old:qoa-s1000/backprop-memory
                                 last_window:qoa/backprop-memory)
  has backprop-memory-s1000 && pairs+=(final_old:qoa-s1000/backprop-memory-s1000 last_window:qoa-s1000/backprop-memory-s1000)
  has full_attention && pairs+=(last_window:qoa/full_attention final_old:qoa/full_attention
                                last_window:qoa-s1000/full_attention)
  "$BIN/python" scripts/paired_rows.py "$out" --out "$out/paired.json" "${pairs[@]}"
}
has() {  # a row of the merged table
  "$BIN/python" -c 'import json, sys; sys.exit(sys.argv[2] not in json.load(open(sys.argv[1]))["methods"])' \
      "$out/results.json" "$1"
}
if [ "${1:-}" = merge ]; then merge; exit 0; fi
for seed in ${SEEDS:-0 1 2}; do
  "$BIN/hf-clroute" bench --suite permuted-mnist-plasticity --seeds "$seed" --no-progress \
      ${METHODS:+--methods "$METHODS"} --out "$runs/seed$seed${METHODS:+-${METHODS//,/-}}"
done
merge
