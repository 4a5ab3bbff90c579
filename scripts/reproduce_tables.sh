#!/usr/bin/env bash
# Every committed table under results/, from scratch, under the measurement protocol (hyper-parameters
# chosen on each suite's validation split, seed 0; then seeds 0,1,2). The committed tables were made in
# groups of methods, each group by scripts/bench_protocol.sh into its own directory and then joined with
# `hf-clroute merge` (results.json lists those commands); a method's row depends only on (suite, method,
# seed, pick), so one protocol run per suite gives the same rows. Hours on a 2-core CPU.
#   scripts/reproduce_tables.sh [out root, default results]
set -euo pipefail
root=${1:-results}
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
here=$(dirname "$0")
routing=rwf-head-only,rwf,rwf-ranpac,rwf-slda,mars-head-only,mars,knn,qoa
heads=simplecil,slda,ranpac,joint-frozen
"$here/bench_protocol.sh" split-mnist "$heads,$routing,rwf-dot,joint,finetune,er,lwf,ewc,lora,vpt,apn,apn-head-only" "$root/split-mnist"
"$here/bench_protocol.sh" split-fashion "$heads,$routing,joint,finetune,er,lwf,ewc,lora,vpt,apn,apn-head-only" "$root/split-fashion"
"$here/bench_protocol.sh" wordnet "$heads,rwf-head-only,rwf,rwf-slda,mars-head-only,mars,knn,qoa" "$root/wordnet"
"$BIN/hf-clroute" bench --suite split-mnist-buffer --seeds 0,1,2 --out "$root/split-mnist-buffer" --no-progress
for suite in permuted-mnist drifting-regression charlm-domains charlm-domains-no-balance charlm-plateau; do
    "$BIN/hf-clroute" bench --suite "$suite" --seeds 0,1,2 --out "$root/$suite" --no-progress
done
"$BIN/hf-clroute" report
