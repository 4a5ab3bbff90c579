#!/usr/bin/env bash
# Paired fp32-vs-bf16 check of A_T (and speed) on the suites where `auto` could pick bf16, at a scale a
# 2-core CPU fits in about 15 CPU-minutes: wordnet (MiniLM), split-mnist and split-fashion (the small ViTs), each with a
# gradient-trained row (finetune: bf16 in training and evaluation) and a frozen-feature row (slda: bf16 in
# feature extraction), seeds 0-2. Every seed runs once in fp32 and once in bf16 (HF_CLROUTE_PRECISION),
# the order alternating by seed so the machine's load hits both alike; the load average is recorded
# around every run. Paired differences (bf16 - fp32) use the tables' paired t (hf_clroute.metrics).
# Writes results/speed/precision_check.json; the runs go to runs/precision-check/.
#   scripts/precision_check.sh [suite ...]     default: wordnet split-mnist split-fashion
# Scale: wordnet 20 training and 20 test definitions per class (800 / 800), split-mnist and split-fashion
# the quick size's 200 training and 100 test images per class; no anytime evaluation, no forgetting probes.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
SEEDS=${SEEDS:-0 1 2}
METHODS=${METHODS:-finetune,slda}
SUITES=${*:-wordnet split-mnist split-fashion}
RUNS=runs/precision-check
mkdir -p "$RUNS"

suite_file() {  # suite -> a suite JSON at the check's scale, based on the built-in suite
  local file=$RUNS/$1.json
  case "$1" in
    wordnet) echo '{"base": "wordnet", "name": "precision-check-wordnet", "train_per_class": 20, "test_per_class": 20,
                    "validation_per_class": 5, "probe_forgetting": false, "training": {"evals_per_task": 0}}' > "$file" ;;
    split-mnist) echo '{"base": "split-mnist", "name": "precision-check-split-mnist", "train_per_class": 200,
                        "test_per_class": 100, "validation_per_class": 20, "probe_forgetting": false,
                        "training": {"evals_per_task": 0}}' > "$file" ;;
    split-fashion) echo '{"base": "split-fashion", "name": "precision-check-split-fashion", "train_per_class": 200,
                          "test_per_class": 100, "validation_per_class": 20, "probe_forgetting": false,
                          "training": {"evals_per_task": 0}}' > "$file" ;;
    *) echo "no check scale for suite $1" >&2; exit 2 ;;
  esac
  echo "$file"
}

for suite in $SUITES; do
  file=$(suite_file "$suite")
  for seed in $SEEDS; do
    order="fp32 bf16"; [ $((seed % 2)) = 1 ] && order="bf16 fp32"
    for precision in $order; do
      out=$RUNS/$suite/$precision-seed$seed
      if [ -f "$out/results.json" ]; then continue; fi
      echo "== $suite seed $seed $precision (load $(cut -d' ' -f1 /proc/loadavg))"
      cut -d' ' -f1-3 /proc/loadavg > "$RUNS/$suite.$precision-seed$seed.load"
      HF_CLROUTE_PRECISION=$precision "$BIN/hf-clroute" bench --suite "$file" --methods "$METHODS" --seeds "$seed" \
        --out "$out" --no-progress
      cut -d' ' -f1-3 /proc/loadavg >> "$RUNS/$suite.$precision-seed$seed.load"
    done
  done
done

"$BIN/python" - "$RUNS" $SUITES <<'EOF'
import json, subprocess, sys
from pathlib import Path

from hf_clroute.metrics.aggregate import paired_difference
from hf_clroute.backbones.precision import MEASURED_BY

runs, suites = Path(sys.argv[1]), sys.argv[2:]
mean = lambda v: sum(v.values()) / len(v) if v else float("nan")  # noqa: E731
median = lambda v: f"{sorted(v.values())[len(v) // 2]:.2f}" if v else "-"  # noqa: E731
report = {"command": "scripts/precision_check.sh " + " ".join(suites), "measured_by": MEASURED_BY,
          "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
          "rule": "within the paired noise: paired t over seeds, p >= 0.05 (hf_clroute.metrics.aggregate.paired_difference)",
          "suites": {}}
for suite in suites:
    rows = {}  # (method, precision) -> {seed: row}
    for path in sorted((runs / suite).glob("*-seed*/results.json")):
        precision, seed = path.parent.name.split("-seed")
        load = [line.split() for line in (runs / f"{suite}.{path.parent.name}.load").read_text().splitlines()]
        results = json.loads(path.read_text())
        test_size = results.get("test_size")
        for method, entry in results["methods"].items():
            row = dict(entry["per_seed"][0], load_average=[float(v[0]) for v in load])
            rows.setdefault((method, precision), {})[int(seed)] = row
    methods = {}
    for method in sorted({m for m, _ in rows}):
        fp32, bf16 = rows.get((method, "fp32"), {}), rows.get((method, "bf16"), {})
        a_t = {p: {s: r["A_T"] * 100 for s, r in runs_.items()} for p, runs_ in (("fp32", fp32), ("bf16", bf16))}
        paired = paired_difference(a_t["bf16"], a_t["fp32"], min_seeds=3)
        speed = {}
        for key in ("train_samples_per_s", "infer_samples_per_s", "wall_s"):
            ratio = {s: bf16[s][key] / fp32[s][key] for s in set(fp32) & set(bf16) if fp32[s].get(key) and bf16[s].get(key)}
            speed[key] = {"fp32": {s: fp32[s].get(key) for s in fp32}, "bf16": {s: bf16[s].get(key) for s in bf16},
                          "bf16_over_fp32": ratio}
        methods[method] = {"A_T": a_t, "paired_bf16_minus_fp32": paired, "speed": speed,
                           "within_noise": paired is not None and paired["verdict"] == "tie",
                           "load_average": {p: {s: r["load_average"] for s, r in runs_.items()}
                                            for p, runs_ in (("fp32", fp32), ("bf16", bf16))}}
        d = paired or {}
        print(f"{suite:<12} {method:<10} A_T fp32 {mean(a_t['fp32']):5.1f} bf16 {mean(a_t['bf16']):5.1f}  "
              f"bf16-fp32 {d.get('mean', float('nan')):+.2f} +- {d.get('std', float('nan')):.2f} "
              f"(p {d.get('p')}, {d.get('verdict')})  train x{median(speed['train_samples_per_s']['bf16_over_fp32'])}"
              f"  infer x{median(speed['infer_samples_per_s']['bf16_over_fp32'])}")
    report["suites"][suite] = {"test_size": test_size, "methods": methods}
out = Path("results/speed/precision_check.json")
out.write_text(json.dumps(report, indent=1) + "\n")
print(f"wrote {out}")
EOF
