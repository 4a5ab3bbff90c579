#!/usr/bin/env bash
# APN in the paper's LM setting (issue 32): Shakespeare (A) with warm-up + cosine, then the King James
# Bible (B) under a stated adaptation budget; dense and APN, all-parameter and FFN-only adaptation,
# routing frozen after A (suite charlm-shakespeare-kjv), and APN's other locality options (LOCALITY=1:
# per-patch encoders and a long balance horizon, each needing its own run on A).
#   scripts/apn_repro.sh            seeds 0,1,2 (SEEDS= others; the committed short table: SEEDS='0 1 2 3 4',
#                                   seeds 3-4 added later), one run per seed, then merged
#   scripts/apn_repro.sh merge      merge the per-seed runs and write the paired comparisons
#   SUITE=charlm-shakespeare-kjv-long scripts/apn_repro.sh   the same, trained ten times longer on A and on B
#   METHODS=apn-lb-horizon-all scripts/apn_repro.sh   only these rows, into seed<n>-<methods> beside the others
#                                   (the merge joins every seed* run; the same seed's rows share its stream)
# Output: results/apn-shakespeare-kjv (results.json, results.md, paired.json); results/apn-<suite less
# its charlm- prefix> for another SUITE.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
SUITE=${SUITE:-charlm-shakespeare-kjv}
out=results/apn-${SUITE#charlm-}
runs=$out-runs
methods=dense-all,dense-ffn,apn-all,apn-ffn,apn-frozen-routing-all
[ "${LOCALITY:-0}" = 1 ] && methods=$methods,apn-per-patch-all,apn-lb-horizon-all
methods=${METHODS:-$methods}
merge() {
  "$BIN/hf-clroute" merge --out "$out" "$runs"/seed*
  # Paired (per-seed) differences: APN's retention and adaptation against dense's, per adaptation scope.
  "$BIN/python" scripts/paired_rows.py "$out" --out "$out/paired.json" \
      retention:apn-all/dense-all retention:apn-ffn/dense-ffn retention:apn-frozen-routing-all/dense-all \
      adaptation:apn-all/dense-all adaptation:apn-ffn/dense-ffn $(locality_pairs)
}
locality_pairs() {  # the locality options against dense (retention; PPL_A after A, ppl_matrix.0.0; PPL_A
  local m           # after B, ppl_matrix.1.0) and against shared-encoder APN, for those the runs hold
  for m in apn-per-patch-all apn-lb-horizon-all; do
    grep -qs "\"$m\"" "$runs"/seed*/results.json &&
        echo "retention:$m/dense-all retention:$m/apn-all ppl_matrix.0.0:$m/dense-all ppl_matrix.1.0:$m/dense-all"
  done
  return 0
}
if [ "${1:-}" = merge ]; then merge; exit 0; fi
for seed in ${SEEDS:-0 1 2}; do
  "$BIN/hf-clroute" bench --suite "$SUITE" --methods "$methods" --seeds "$seed" \
      --out "$runs/seed$seed${METHODS:+-${METHODS//,/-}}" --no-progress
done
# Per-seed jobs run side by side, so another job's run may still be going: merge only once every run is
# written, and one merge at a time (the last job to end merges them all).
pending=$(for d in "$runs"/seed*; do [ -f "$d/results.json" ] || echo "$d"; done)
if [ -n "$pending" ]; then
  echo "not merged yet, still running: $pending (the last job merges, or: scripts/apn_repro.sh merge)"
  exit 0
fi
exec 9>"$runs/.merge.lock"
flock 9
merge
