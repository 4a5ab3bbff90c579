#!/usr/bin/env bash
# Does a change move any number? Run the same bench rows with the code of git revision REV (checked out in
# a temporary worktree) and with the working tree, same suite, seed, threads and committed picks, and
# compare every method's accuracy matrix, anytime curve and forgetting probes exactly.
#   scripts/same-numbers/before_after.sh REV SUITE METHODS [SEED] [out dir]
# e.g. scripts/same-numbers/before_after.sh 21b6848 split-mnist finetune,er,slda,ranpac,knn,rwf,qoa
# Writes <out>/comparison.json and exits 1 if any matrix differs.
set -euo pipefail
rev=$1; suite=$2; methods=$3; seed=${4:-0}; out=${5:-runs/before-after/$suite}
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
selection=results/$suite/selection.json
picks=(); [ -f "$selection" ] && picks=(--selection "$selection")
worktree=$(mktemp -d)
trap 'git worktree remove --force "$worktree" >/dev/null 2>&1 || rm -rf "$worktree"' EXIT
git worktree add --detach "$worktree" "$rev" >/dev/null
mkdir -p "$out"
# The revision's package first on the path: its code and its suite/method files.
PYTHONPATH="$worktree" "$BIN/python" -m hf_clroute.cli bench --suite "$suite" --methods "$methods" \
    --seeds "$seed" --out "$out/before" --no-progress "${picks[@]}"
"$BIN/python" -m hf_clroute.cli bench --suite "$suite" --methods "$methods" --seeds "$seed" --out "$out/after" \
    --no-progress "${picks[@]}"
"$BIN/python" - "$out" "$rev" <<'PY'
import json, sys
out, rev = sys.argv[1], sys.argv[2]
before, after = (json.load(open(f"{out}/{side}/results.json"))["methods"] for side in ("before", "after"))
rows, differ = {}, 0
for method in before:
    a, b = before[method]["per_seed"][0], after[method]["per_seed"][0]
    same = {key: a.get(key) == b.get(key) for key in ("accuracy_matrix", "anytime", "probe_A_T", "deep_forgetting_per_task")
            if key in a or key in b}
    rows[method] = {"same": all(same.values()), "fields": same, "A_T": [a["A_T"], b["A_T"]],
                    "wall_s": [a["wall_s"], b["wall_s"]]}
    differ += not all(same.values())
    print(f"{method:16s} A_T {a['A_T']:.4f} -> {b['A_T']:.4f}, {a['wall_s']:.0f} s -> {b['wall_s']:.0f} s  "
          + ", ".join(f"{k} {'identical' if v else 'DIFFERENT'}" for k, v in same.items()))
json.dump({"revision_before": rev, "methods": rows}, open(f"{out}/comparison.json", "w"), indent=2)
sys.exit(1 if differ else 0)
PY
