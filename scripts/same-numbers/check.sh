#!/usr/bin/env bash
# Re-run a few rows of every committed table with the code of today and the settings those tables were
# made with (no validation split, one evaluation per task), then compare seed 0 with the table as first
# committed (git commit 1c56cf3, before the layers were split): the restructuring must not move a number.
# Tolerance: 5 test examples of 2000 on A_T (0.0025): a cosine near-tie can flip with the float summation
# order (NCM's class statistics are now float64 sums; fine-tuned rows differ in the last bits), nothing more.
#   scripts/same-numbers/check.sh [out dir]
set -euo pipefail
out=${1:-runs/same-numbers}
BIN=${BIN:-.venv/bin}
here=$(dirname "$0")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
"$BIN/hf-clroute" bench --suite "$here/split-mnist-previous-protocol.json" --methods ncm,finetune,er,lwf --seeds 0 --out "$out/split-mnist" --no-progress
"$BIN/hf-clroute" bench --suite "$here/wordnet-previous-protocol.json" --methods ncm,lora --seeds 0 --out "$out/wordnet" --no-progress
"$BIN/hf-clroute" bench --suite permuted-mnist --methods backprop --seeds 0 --out "$out/permuted-mnist" --no-progress
"$BIN/hf-clroute" bench --suite charlm-domains --methods dense-ffn --seeds 0 --out "$out/charlm-domains" --no-progress
"$BIN/python" - "$out" <<'PY'
import json, subprocess, sys
out = sys.argv[1]
def old(suite):
    return json.loads(subprocess.run(["git", "show", f"1c56cf3:results/{suite}/results.json"], check=True,
                                     capture_output=True, text=True).stdout)["methods"]
checks = {"split-mnist": ("A_T", ["ncm", "finetune", "er", "lwf"]), "wordnet": ("A_T", ["ncm", "lora"]),
          "permuted-mnist": ("last_window", ["backprop"]), "charlm-domains": ("ppl_matrix", ["dense-ffn"])}
failed = 0
for suite, (key, methods) in checks.items():
    new = json.load(open(f"{out}/{suite}/results.json"))["methods"]
    for m in methods:
        a, b = old(suite)[m]["per_seed"][0][key], new[m]["per_seed"][0][key]
        flat = lambda v: [x for row in v for x in row] if isinstance(v, list) else [v]  # noqa: E731
        same = all(abs(x - y) <= (0.0025 if key != "ppl_matrix" else 1e-6 * x) for x, y in zip(flat(a), flat(b)))
        failed += not same
        print(f"{suite:15s} {m:10s} {key}: committed {a} | today {b} | {('same' if a == b else 'within tolerance') if same else 'DIFFERENT'}")
sys.exit(1 if failed else 0)
PY
