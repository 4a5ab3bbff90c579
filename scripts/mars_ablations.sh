#!/usr/bin/env bash
# MaRS as its theory requires (issue 32): defaults chosen on validation, then the ablations under the
# protocol (each row tuned on validation, seed 0; 5 seeds on the fixed test set), and the paired table.
#   scripts/mars_ablations.sh validate   # the mars row's options, each set back one at a time, tuned
#   scripts/mars_ablations.sh rows       # each ablation and control tuned, then 5 seeds with its pick
#   scripts/mars_ablations.sh row NAME   # one of them (rows can run as parallel processes)
#   scripts/mars_ablations.sh together   # the ablations and the control after the mars row: each tuned alone (the
#                                        # same budget), then benched in one process, which encodes each seed's
#                                        # features once (wordnet's rows ran this way: its backbone pass is the cost)
#   scripts/mars_ablations.sh baseline   # the suite's committed fine-tuning row (results/$SUITE, tuned with the
#                                        # same budget) as parts/finetune, instead of tuning it again (wordnet)
#   scripts/mars_ablations.sh extend DIR ROWS  # rows (comma-separated) of tune/DIR whose pick the extension limit left
#                                        # on an edge: their searches continue (tune --resume: the runs recorded are
#                                        # read, not trained again; EXTENSIONS in all, default 6) into tune/DIR-extended
#                                        # (again: from there), then their seeds re-run into parts/DIR-extended (an
#                                        # -extended run replaces the earlier). PRECISION (required): the setting the
#                                        # rows it continues ran with (their results.json; none recorded = fp32), so
#                                        # a search and a table hold one precision
#   scripts/mars_ablations.sh paired     # per-seed paired differences -> results/mars-split-mnist/paired.json
# SUITE (default split-mnist) and SEEDS (default 0,1,2,3,4) override; results go to results/mars-$SUITE.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
SUITE=${SUITE:-split-mnist}
SEEDS=${SEEDS:-0,1,2,3,4}
OUT=results/mars-$SUITE
BIN=${BIN:-.venv/bin}
VALIDATION=mars-val-calibrated-sgse,mars-val-old-logits,mars-val-lwf-all,mars-val-live-anchors,mars-val-expansion-anchors,mars-val-tracked-sgse,mars-val-energy
# The paper's four ablations and the memory's control; mars-paper (the first reading) is in results/split-mnist.
ABLATIONS=mars,mars-no-sgse,mars-no-anchor,mars-no-stage2,mars-head-only,mars-no-stage1
BASELINE=finetune

tune() { "$BIN/hf-clroute" tune --suite "$SUITE" --methods "$1" --seed 0 --out "$2" --no-progress; }

row() {  # tune one row into its own file (rows can run in parallel), then its seeds with the pick
  tune "$1" "$OUT/tune/$1"
  "$BIN/hf-clroute" bench --suite "$SUITE" --methods "$1" --seeds "$SEEDS" --out "$OUT/parts/$1" \
    --selection "$OUT/tune/$1/selection.json" --no-progress
}

case "${1:-all}" in
  validate) tune "$VALIDATION" "$OUT" ;;
  # Each row tuned, then run on every seed; naive fine-tuning too (the same budget on validation).
  rows) for method in ${ABLATIONS//,/ } $BASELINE; do row "$method"; done ;;
  row) row "$2" ;;
  together) rows=${ABLATIONS#mars,}
            tune "$rows" "$OUT/tune/ablations"
            "$BIN/hf-clroute" bench --suite "$SUITE" --methods "$rows" --seeds "$SEEDS" --out "$OUT/parts/ablations" \
              --selection "$OUT/tune/ablations/selection.json" --no-progress ;;
  baseline) others=$("$BIN/python" -c "import json, sys; print(','.join(m for m in json.load(open(sys.argv[1]))['methods'] if m != sys.argv[2]))" "results/$SUITE/results.json" "$BASELINE")
            "$BIN/hf-clroute" merge --out "$OUT/parts/$BASELINE" "results/$SUITE" --drop "$others" ;;
  extend) from=$OUT/tune/$2-extended/selection.json; [ -f "$from" ] || from=$OUT/tune/$2/selection.json
          "$BIN/hf-clroute" tune --suite "$SUITE" --methods "$3" --seed 0 --out "$OUT/tune/$2-extended" --no-progress \
            --resume "$from" --max-extensions "${EXTENSIONS:-6}" --precision "${PRECISION:?set PRECISION to the setting the rows ran with}"
          "$BIN/hf-clroute" bench --suite "$SUITE" --methods "$3" --seeds "$SEEDS" --out "$OUT/parts/$2-extended" \
            --selection "$OUT/tune/$2-extended/selection.json" --no-progress --precision "$PRECISION" ;;
  paired) "$BIN/python" scripts/mars_paired.py "$OUT" ;;
  all) "$0" validate; "$0" rows; "$0" paired ;;
  *) echo "usage: $0 [validate|rows|row METHOD|together|extend DIR ROWS|baseline|paired|all]" >&2; exit 2 ;;
esac
