#!/usr/bin/env bash
# Split-MNIST-R, the suite with room to adapt (issue 33), as committed:
#   scripts/room_suite.sh backbone   pretrain vit-mnist-r-stream (Fashion-MNIST only, never a digit) and store
#                                    it as the committed asset; its report (frozen NCM and linear probe on
#                                    mnist_r) is copied to results/headroom-split-mnist-r/pretrain_report.json
#   scripts/room_suite.sh headroom   the headroom test: each (seed, adapter) its own job, two at a time,
#                                    then merged into results/headroom-split-mnist-r (SEEDS=, ADAPTERS= subsets;
#                                    default seed 0 with the positive controls, the last block and LoRA)
# One thread per job: the machine has 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
out=results/headroom-split-mnist-r

backbone() {
  "$BIN/hf-clroute" data prepare fashion_mnist mnist_r
  "$BIN/python" training/pretrain_vit.py --recipe vit-mnist-r-stream --out runs/vit-mnist-r-stream --asset
  mkdir -p "$out"
  cp runs/vit-mnist-r-stream/pretrain_report.json "$out/pretrain_report.json"
}

headroom() {
  parts=$out.parts
  for seed in ${SEEDS:-0}; do
    for a in ${ADAPTERS:-lastblock lora}; do
      "$BIN/hf-clroute" bench --suite headroom-split-mnist-r --seeds "$seed" --methods "$a" \
          --out "$parts/s$seed-$a" --no-progress &
      while [ "$(jobs -rp | wc -l)" -ge 2 ]; do sleep 10; done
    done
  done
  wait
  "$BIN/hf-clroute" merge --out "$out" "$parts"/s*
}

case "${1:-}" in
  backbone) backbone ;;
  headroom) headroom ;;
  *) echo "usage: scripts/room_suite.sh backbone|headroom" >&2; exit 2 ;;
esac
