#!/usr/bin/env bash
# The measurement protocol for one classification suite: choose every method's hyper-parameters
# on the suite's validation split (seed 0), then run the chosen settings on seeds 0-4 and write
# results/<suite>/ (results.json records both commands and every pick).
#   scripts/bench_protocol.sh <suite> <method,method,...> [results dir]
set -euo pipefail
suite=$1; methods=$2; out=${3:-results/$suite}
BIN=${BIN:-.venv/bin}
"$BIN/hf-clroute" tune --suite "$suite" --methods "$methods" --seed 0 --out "$out" --no-progress
"$BIN/hf-clroute" bench --suite "$suite" --methods "$methods" --seeds 0,1,2,3,4 --out "$out" \
    --selection "$out/selection.json" --no-progress
