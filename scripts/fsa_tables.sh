#!/usr/bin/env bash
# The first-session-adaptation tables and the headroom test, as committed under results/
# (fsa-split-mnist, fsa-split-fashion, headroom-split-mnist-cpu, headroom-split-fashion-cpu).
# Each suite: every method tuned on the validation split (seed 0, 12 configurations each, edge
# picks extended), then the picks run on seeds 0-4 over the fixed test set. About an hour per
# suite on one core of a 2-core CPU; the suites run side by side, one thread each.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
methods=simplecil,slda,ranpac,ranpac-gcv,rwf-fsa-ranpac,ranpac-lora,apn-fsa-ranpac,lastblock-fsa-ranpac
fsa() {  # suite
  out=results/fsa-$1
  "$BIN/hf-clroute" tune --suite "$1" --methods "$methods" --seed 0 --out "$out" --no-progress
  "$BIN/hf-clroute" bench --suite "$1" --methods "$methods" --seeds 0,1,2,3,4 --out "$out" \
      --selection "$out/selection.json" --no-progress
}
headroom() {  # suite
  "$BIN/hf-clroute" bench --suite "$1" --seeds 0,1,2 --out "results/$1" --no-progress
}
(fsa split-mnist; headroom headroom-split-mnist-cpu) &
(fsa split-fashion; headroom headroom-split-fashion-cpu)
wait
"$BIN/hf-clroute" report
