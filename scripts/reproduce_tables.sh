#!/usr/bin/env bash
# Every committed table under results/, from scratch. The classification tables follow the measurement
# protocol (hyper-parameters chosen on each suite's validation split, seed 0; then seeds 0-4), in groups of
# methods joined with `hf-clroute merge` (results.json lists the commands); a method's row depends only on
# (suite, method, seed, pick). The other suites run their own settings on seeds 0,1,2. Hours on a 2-core CPU.
#   scripts/reproduce_tables.sh
set -euo pipefail
root=results
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
here=$(dirname "$0")
# The main tables (split-mnist, split-fashion, wordnet) and the first-session-adaptation tables, under
# the current protocol (12 configurations per method on validation, 5 seeds, fixed test sets):
"$here/fsa_tables.sh"
"$here/main_tables.sh" all
"$BIN/hf-clroute" bench --suite split-mnist-buffer --seeds 0,1,2 --out "$root/split-mnist-buffer" --no-progress
for suite in permuted-mnist drifting-regression charlm-domains charlm-domains-no-balance charlm-plateau; do
    "$BIN/hf-clroute" bench --suite "$suite" --seeds 0,1,2 --out "$root/$suite" --no-progress
done
"$BIN/hf-clroute" report
