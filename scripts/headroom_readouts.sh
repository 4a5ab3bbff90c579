#!/usr/bin/env bash
# The image headroom tests re-run with readouts chosen by hf-clroute tune's rule (RanPAC's lambda in units of
# trace(G)/M over tune's grid, SLDA's shrinkage over tune's grid, the probe's L2 on validation; edge picks
# extend, a pick still on an edge is flagged), at a shared 2-core CPU's budget: seed 0, the positive control
# (lastblock) and LoRA, one suite after the other on one thread each (about 10 core-minutes per suite here).
#   scripts/headroom_readouts.sh            both image suites, then BENCHMARKS.md
#   scripts/headroom_readouts.sh SEEDS ADAPTERS   e.g. 1,2 lastblock,lora,rwf-identity-cosine,apn (more compute)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
SEEDS=${1:-0}
ADAPTERS=${2:-lastblock,lora}
for suite in headroom-split-mnist-cpu headroom-split-fashion-cpu; do
  "$BIN/hf-clroute" bench --suite "$suite" --seeds "$SEEDS" --methods "$ADAPTERS" --out "results/$suite"
done
"$BIN/hf-clroute" report
