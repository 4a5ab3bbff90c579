#!/usr/bin/env bash
# The first-session-adaptation tables and the headroom test, as committed under results/
# (fsa-split-mnist, fsa-split-fashion, headroom-split-mnist-cpu, headroom-split-fashion-cpu,
# headroom-wordnet-cpu).
#   scripts/fsa_tables.sh                  the image suites' tables and headroom tests
#   scripts/fsa_tables.sh extra <suite>    only the added rows (EXTRA= a subset)
#   scripts/fsa_tables.sh wordnet          WordNet's first-session-adaptation rows (ADAPTERS= a subset; default
#                                          ranpac-lora), each tuned on validation (seed 0) and run on seeds 0-2
#                                          and 3-4 side by side, then added to results/wordnet beside their
#                                          controls (ranpac-gcv, simplecil) and the statistics heads; about an
#                                          hour a row here (a stopped search continues: tune-progress.json)
#   scripts/fsa_tables.sh headroom-wordnet WordNet's headroom test, one job per seed and adapter
#                                          (SEEDS=, ADAPTERS= subsets), two at a time, then merged
#                                          into the committed study
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
# The other adaptation modules and heads (MaRS's memory and RwF under streaming LDA, APER's LoRA under
# SimpleCIL, and its VPT), added to the fsa-<suite> table on 5 seeds; and the floor rows (simplecil, slda: cached
# frozen features, the same A_T) again, so that the deep forgetting of the added rows is set against a
# floor measured by the same probe (the committed adaptation rows were probed by an earlier one).
extra_methods=${EXTRA:-mars-fsa-slda,rwf-fsa-slda,aper-lora,aper-vpt}
extra() {  # suite
  parts=results/fsa-$1.parts
  dirs=()
  for m in ${extra_methods//,/ }; do
    "$BIN/hf-clroute" tune --suite "$1" --methods "$m" --seed 0 --out "$parts/$m" --no-progress
    "$BIN/hf-clroute" bench --suite "$1" --methods "$m" --seeds 0,1,2,3,4 --out "$parts/$m" \
        --selection "$parts/$m/selection.json" --no-progress
    dirs+=("$parts/$m")
  done
  "$BIN/hf-clroute" bench --suite "$1" --methods simplecil,slda --seeds 0,1,2,3,4 --out "$parts/floor" \
      --selection "results/fsa-$1/selection.json" --no-progress
  "$BIN/hf-clroute" merge --out "results/fsa-$1" "results/fsa-$1" "${dirs[@]}" "$parts/floor"
}
# WordNet's adapters take 35-80 core-minutes each per seed here, so each (seed, adapter) is its own job.
headroom_wordnet() {
  parts=results/headroom-wordnet-cpu.parts
  for seed in ${SEEDS:-0 1 2}; do
    for a in ${ADAPTERS:-lastblock lora rwf-identity-cosine}; do
      "$BIN/hf-clroute" bench --suite headroom-wordnet-cpu --seeds "$seed" --methods "$a" --out "$parts/s$seed-$a" \
          --no-progress &
      while [ "$(jobs -rp | wc -l)" -ge 2 ]; do sleep 10; done
    done
  done
  wait
  # The parts are not committed: on a fresh clone a run of some seeds (SEEDS=2) joins the committed study,
  # whose rows a part of the same seed and adapter replaces.
  out=results/headroom-wordnet-cpu earlier=()
  if [ -f "$out/results.json" ]; then earlier=("$out"); fi
  "$BIN/hf-clroute" merge --out "$out" "${earlier[@]}" "$parts"/s*
}
wordnet_rows() {
  dirs=()
  for m in ${ADAPTERS:-ranpac-lora}; do
    out=results/wordnet.parts/fsa-$m
    "$BIN/hf-clroute" tune --suite wordnet --methods "$m" --seed 0 --out "$out" --no-progress --precision fp32
    "$BIN/hf-clroute" bench --suite wordnet --methods "$m" --seeds 0,1,2 --out "$out" \
        --selection "$out/selection.json" --no-progress --precision fp32 &
    "$BIN/hf-clroute" bench --suite wordnet --methods "$m" --seeds 3,4 --out "$out-s34" \
        --selection "$out/selection.json" --no-progress --precision fp32
    wait
    dirs+=("$out" "$out-s34")
  done
  "$BIN/hf-clroute" merge --out results/wordnet results/wordnet "${dirs[@]}"
}
if [ "${1:-}" = extra ]; then extra "$2"; exit; fi
if [ "${1:-}" = wordnet ]; then wordnet_rows; "$BIN/hf-clroute" report; exit; fi
if [ "${1:-}" = headroom-wordnet ]; then headroom_wordnet; "$BIN/hf-clroute" report; exit; fi
(fsa split-mnist; headroom headroom-split-mnist-cpu; extra split-mnist) &
(fsa split-fashion; headroom headroom-split-fashion-cpu; extra split-fashion)
wait
"$BIN/hf-clroute" report
