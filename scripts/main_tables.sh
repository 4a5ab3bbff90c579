#!/usr/bin/env bash
# The main tables (results/split-mnist, results/split-fashion, results/wordnet) under the current
# protocol: every method gets 12 configurations on the suite's validation split (seed 0; an edge
# pick extends its axis, up to 3 times), then its pick runs on seeds 0-4 over the fixed test set.
# Methods run in groups, each into results/<suite>.parts/<group> (tune, then bench), and the groups
# are merged into results/<suite>. The statistics heads reuse the picks made for the
# first-session-adaptation tables on the same suite and seed (results/fsa-<suite>/selection.json).
#   scripts/main_tables.sh tune  <suite> <group>     choose on validation
#   scripts/main_tables.sh bench <suite> <group>     run the picks on seeds 0-4 (SEEDS=...; MERGE=1 adds
#                                                    them to the group's earlier seeds)
#   scripts/main_tables.sh rows  <suite> <group> [m,..]  tune and bench one method at a time, each into
#                                                    results/<suite>.parts/<group>-<method> (costly rows
#                                                    land one by one; wordnet's baselines ran this way)
#   scripts/main_tables.sh merge <suite>             join the groups and rebuild BENCHMARKS.md
#   scripts/main_tables.sh all                       everything, two suites side by side
#   scripts/main_tables.sh add <suite> <dir>...      add bench runs' rows to the committed results/<suite>
#   scripts/main_tables.sh extend <suite> <precision> <m,..>  the committed table's searches whose picks the
#                                                    extension limit left on an edge continue (tune --resume reads
#                                                    the scores recorded in results/<suite>/selection.json; up to
#                                                    EXTENSIONS=12 in all), then those rows' seeds re-run with the
#                                                    new picks and replace theirs. precision: the setting the rows
#                                                    ran with (their results.json; none recorded = fp32)
#   scripts/main_tables.sh mars-extended <suite>      MaRS's rows re-run by `mars_ablations.sh extend` into the table
#   scripts/main_tables.sh rule_cached <suite>        every row on cached features searched again by the one rule
#                                                    (MERGE_ONLY=1: only join the runs already there)
#   scripts/main_tables.sh mars <suite>              MaRS's rows as issue 32 left them (mars-paper re-run)
#   scripts/main_tables.sh room                      split-mnist-r's table from scratch (RwF against its paper's
#                                                    baselines, the statistics heads, cosine heads, OSF; two lanes)
#   scripts/main_tables.sh joint-offline <suite>     the suite's upper bound: joint training's offline form, tuned
#                                                    (unless results/<suite>/joint-offline-selection.json holds its
#                                                    committed search; TUNE=1 searches again), then 5 seeds, one job
#                                                    each, two at a time, added to the committed table. split-mnist-r:
#                                                    seeds of about 40 minutes here; wordnet: about 20
#   scripts/main_tables.sh room-joint                the same for split-mnist-r
#   scripts/main_tables.sh joint_again <suite>..      joint's committed rows again with their committed pick (the
#                                                    anytime points of its A_AUC sat early in each task before
#                                                    the trainer asked the method how much it reads); replaces them
#   scripts/main_tables.sh counts [m,..]              wordnet's 40 classes in 5/10/20/40 tasks (wordnet-<n>tasks) with
#                                                    wordnet's validation picks: RwF, its control, streaming LDA
#                                                    (or the methods given: dualprompt, coda-prompt; one job each)
#                                                    (SEEDS=...; COUNTS="5 40" for some task counts; the 8-task rows
#                                                    are wordnet's own)
#   scripts/main_tables.sh scarce <group> [m,..]     the same rows at 20% of the data (split-mnist-r-20pct),
#                                                    with split-mnist-r's picks; then add them to split-mnist-r-20pct
# Groups: heads (reused picks), cached (methods on cached frozen features), routing, qoa, joint,
# baselines (gradient CL baselines; on wordnet finetune, LoRA, ER), controls (mars-gaussian-align's control, added later);
# on split-mnist-r: cached (the statistics heads and RwF's control), prompts (RwF, its paper form,
# L2P, DualPrompt), adapters (CODA-Prompt, Online-LoRA, VPT, LoRA), readouts (RwF read by streaming LDA);
# mars-paper (MaRS's first reading); osf (OSF, its control); mars-memory (mars-memory-free, mars-prototypes); cosine (RwF,
# the prompt methods and RwF's control on a cosine head).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
SEEDS=${SEEDS:-0,1,2,3,4}

methods() {  # suite group
  case "$2" in
    heads) echo simplecil,slda,ranpac,ranpac-gcv ;;
    cached) if [ "$1" = split-mnist-r ]; then echo simplecil,slda,ranpac,rwf-head-only
            elif [ "$1" = wordnet ]; then  # no reused picks here: the heads join this group (one feature pass)
              echo simplecil,slda,ranpac,ranpac-gcv,knn,joint-frozen,rwf-head-only,mars-head-only,mars,mars-gaussian-align,mars-gaussian-align-head-only
            else
              echo knn,joint-frozen,rwf-head-only,apn-head-only,mars-head-only,mars,mars-gaussian-align
            fi ;;
    routing) if [ "$1" = wordnet ]; then echo rwf,apn,apn-head-only  # apn and its control: `rows`, 3 seeds
             else echo rwf,apn; fi ;;
    qoa) echo qoa ;;
    joint) echo joint ;;
    baselines) if [ "$1" = wordnet ]; then echo finetune,lora,er  # the gradient baselines issue 35 asks of wordnet
               else echo finetune,er,lwf,ewc,lora,vpt; fi ;;
    controls) echo mars-gaussian-align-head-only ;;  # on the image suites, added after their cached group
    mars-paper) echo mars-paper,mars-paper-head-only ;;  # the first reading of MaRS, which the cached group's
                                                        # mars rows ran before issue 32 (re-run under its name)
    prompts) echo rwf,rwf-dot,l2p,dualprompt ;;  # split-mnist-r's room ran rwf,l2p,dualprompt (`rows`)
    adapters) echo coda-prompt,online-lora,vpt,lora ;;  # and lora,online-lora,coda-prompt
    readouts) echo rwf-slda ;;
    osf) echo osf,osf-head-only ;;  # PEFT's OSF and its control (issue 61; `rows`, one method at a time)
    cosine) echo rwf-head-only-cosine,l2p-cosine,rwf-cosine,coda-prompt-cosine,dualprompt-cosine ;;  # the cosine
                                    # head beside the paper's linear one (issue 60; `rows`, cheapest first)
    mars-memory) echo mars-memory-free,mars-prototypes ;;  # MaRS's control without memory, and prototypes
                                                            # distilled without the router (issue 60; `rows`)  # RwF's routing read by streaming LDA (its control: slda), beside the linear-head rows
    *) echo "unknown group: $2" >&2; exit 2 ;;
  esac
}

tune() {  # suite group
  local out=results/$1.parts/$2
  if [ "$2" = heads ]; then
    mkdir -p "$out"
    if [ -f "results/fsa-$1/selection.json" ]; then cp "results/fsa-$1/selection.json" "$out/selection.json"; return; fi
  fi
  "$BIN/hf-clroute" tune --suite "$1" --methods "$(methods "$1" "$2")" --seed 0 --out "$out" --no-progress
}

bench() {  # suite group
  local out=results/$1.parts/$2 run
  run=$(methods "$1" "$2")
  # rwf-dot (the paper's routing) is tuned beside rwf as a variant of it: the bench runs the one with the
  # higher validation A_T at its pick (a tie keeps rwf, the library's default)
  [ "$2" = prompts ] && run=${run/rwf,rwf-dot,/$(variant "$out/selection.json" rwf rwf-dot),}
  "$BIN/hf-clroute" bench --suite "$1" --methods "$run" --seeds "$SEEDS" --out "$out" \
      --selection "$out/selection.json" --no-progress ${MERGE:+--merge}
}

variant() {  # selection.json default alternative: the one whose pick scored higher on validation
  "$BIN/python" -c 'import json, sys
m = json.load(open(sys.argv[1]))["methods"]
print(sys.argv[3] if m[sys.argv[3]]["pick_validation_A_T"] > m[sys.argv[2]]["pick_validation_A_T"] else sys.argv[2])' "$@"
}

rows() {  # suite group [methods: some of the group's, comma-separated]
  local m
  for m in $(echo "${3:-$(methods "$1" "$2")}" | tr , ' '); do
    "$BIN/hf-clroute" tune --suite "$1" --methods "$m" --seed 0 --out "results/$1.parts/$2" --no-progress
    "$BIN/hf-clroute" bench --suite "$1" --methods "$m" --seeds "$SEEDS" --out "results/$1.parts/$2-$m" \
        --selection "results/$1.parts/$2/selection.json" --no-progress  # writes its picks beside its rows
  done
}

merge() {  # suite
  local parts=() g d
  for g in heads cached controls routing prompts adapters readouts qoa joint baselines mars-paper cosine osf; do
    for d in "results/$1.parts/$g" "results/$1.parts/$g"-*; do  # a group, or its rows run one by one
      [ -f "$d/results.json" ] && parts+=("$d")
    done
  done
  # MaRS and its control as issue 32 made them (scripts/mars_ablations.sh, tuned, 5 seeds): a later part's
  # rows replace an earlier part's rows of the same method and seeds, so these replace the cached group's.
  # wordnet's rows after mars ran together (mars_ablations.sh together): the control joins the table,
  # the ablations stay in results/mars-wordnet. A search continued past the extension limit
  # (mars_ablations.sh extend) re-ran its rows into <part>-extended, after the part it replaces.
  local drop=()
  for g in mars mars-head-only ablations mars-extended mars-head-only-extended ablations-extended; do
    [ -f "results/mars-$1/parts/$g/results.json" ] && parts+=("results/mars-$1/parts/$g")
  done
  [ -f "results/mars-$1/parts/ablations/results.json" ] && drop=(--drop mars-no-sgse,mars-no-anchor,mars-no-stage1,mars-no-stage2)
  "$BIN/hf-clroute" merge --out "results/$1" "${parts[@]}" "${drop[@]}"
  "$BIN/hf-clroute" report
}

all() {
  (for g in heads cached controls routing qoa joint baselines; do tune split-mnist $g; bench split-mnist $g; done
   for g in cached; do tune wordnet $g; bench wordnet $g; done) &
  (for g in heads cached controls routing qoa joint baselines; do tune split-fashion $g; bench split-fashion $g; done
   for g in routing qoa baselines; do tune wordnet $g; bench wordnet $g; done)
  wait
  merge split-mnist; merge split-fashion; merge wordnet
}

add() {  # suite run-dir...: rows added to (or, for the same method and seeds, replacing) the committed table
  local suite=$1; shift
  "$BIN/hf-clroute" merge --out "results/$suite" "results/$suite" "$@"
  "$BIN/hf-clroute" report
}

extend() {  # suite precision methods
  local out=results/$1.parts/extended-${3//,/-}
  "$BIN/hf-clroute" tune --suite "$1" --methods "$3" --seed 0 --out "$out" --no-progress \
      --resume "results/$1/selection.json" --max-extensions "${EXTENSIONS:-12}" --precision "$2"
  "$BIN/hf-clroute" bench --suite "$1" --methods "$3" --seeds "$SEEDS" --out "$out" \
      --selection "$out/selection.json" --no-progress --precision "$2"
  add "$1" "$out"
}

rule_cached() {  # suite: every row on cached frozen features searched again by tune's one rule (no resume), 5 seeds,
                 # fp32; MaRS and its ablations into results/mars-<suite>/{tune,parts}/rule (the ablations stay
                 # there), the rest into results/<suite>.parts/rule-cached; both replace the table's rows
  local mars=mars,mars-no-sgse,mars-no-anchor,mars-no-stage1,mars-no-stage2,mars-head-only
  local rest=simplecil,slda,ranpac,ranpac-gcv,knn,joint-frozen,rwf-head-only,apn-head-only,mars-gaussian-align
  rest=$rest,mars-gaussian-align-head-only,mars-paper,mars-paper-head-only,qoa
  local m=results/mars-$1 r=results/$1.parts/rule-cached
  if [ -z "${MERGE_ONLY:-}" ]; then
    "$BIN/hf-clroute" tune --suite "$1" --methods "$mars" --seed 0 --out "$m/tune/rule" --no-progress --precision fp32
    "$BIN/hf-clroute" bench --suite "$1" --methods "$mars" --seeds "$SEEDS" --out "$m/parts/rule" \
        --selection "$m/tune/rule/selection.json" --no-progress --precision fp32
    "$BIN/hf-clroute" tune --suite "$1" --methods "$rest" --seed 0 --out "$r" --no-progress --precision fp32
    "$BIN/hf-clroute" bench --suite "$1" --methods "$rest" --seeds "$SEEDS" --out "$r" --selection "$r/selection.json" \
        --no-progress --precision fp32
  fi
  "$BIN/hf-clroute" merge --out "results/$1" "results/$1" "$m/parts/rule" "$r" \
      --drop mars-no-sgse,mars-no-anchor,mars-no-stage1,mars-no-stage2
  "$BIN/hf-clroute" report
}

mars-extended() {  # suite: the mars rows (and the control) whose searches `mars_ablations.sh extend` continued
  local parts=() d ablations
  for d in mars-extended mars-head-only-extended ablations-extended; do
    [ -f "results/mars-$1/parts/$d/results.json" ] && parts+=("results/mars-$1/parts/$d")
  done
  # the ablations stay in results/mars-<suite>: drop those the re-runs carry
  ablations=$("$BIN/python" -c 'import json, sys
print(",".join(sorted({m for d in sys.argv[1:] for m in json.load(open(d + "/results.json"))["methods"] if m.startswith("mars-no-")})))' "${parts[@]}")
  "$BIN/hf-clroute" merge --out "results/$1" "results/$1" "${parts[@]}" ${ablations:+--drop "$ablations"}
  "$BIN/hf-clroute" report
}

mars() {  # suite: the cached group's mars rows ran MaRS's first reading; they become mars-paper rows (re-run
          # under that name), and mars / mars-head-only become issue 32's rows (scripts/mars_ablations.sh)
  tune "$1" mars-paper; bench "$1" mars-paper
  add "$1" "results/$1.parts/mars-paper" "results/mars-$1/parts/mars" "results/mars-$1/parts/mars-head-only"
}

scarce() {  # group: split-mnist-r at 20% of its data, with the picks made on split-mnist-r's validation split
            # (committed: every group with SCARCE_SEEDS=0,1,2,3,4 on the retrained backbone, then
            # `hf-clroute merge --out results/split-mnist-r-20pct results/split-mnist-r-20pct.parts/*`)
  local methods
  case "$1" in
    prompts) methods=${2:-rwf,l2p,dualprompt} ;;
    adapters) methods=coda-prompt,online-lora ;;
    cached) methods=rwf-head-only,slda ;;
  esac
  "$BIN/hf-clroute" bench --suite split-mnist-r-20pct --methods "$methods" --seeds "${SCARCE_SEEDS:-0,1,2}" \
      --out "results/split-mnist-r-20pct.parts/$1${2:+-${2//,/-}}" --selection results/split-mnist-r/selection.json --no-progress
}

counts() {  # [methods]: the task-count study; each suite's runs land in results/wordnet-<n>tasks.parts/<seeds>
  # A count's committed rows keep the picks they ran with (its own selection.json), so that seeds added later
  # run with the same picks (merge refuses mixed ones); wordnet's picks only start a study from scratch.
  local n selection
  for n in ${COUNTS:-5 10 20 40}; do
    selection=results/wordnet-${n}tasks/selection.json
    [ -f "$selection" ] || selection=results/wordnet/selection.json
    "$BIN/hf-clroute" bench --suite "wordnet-${n}tasks" --methods "${1:-rwf,rwf-head-only,slda}" --seeds "$SEEDS" \
        --out "results/wordnet-${n}tasks.parts/${1:-rows}-s${SEEDS//,/}" --selection "$selection" --no-progress
  done
}

joint_offline() {  # suite: the offline form (the cumulative one costs T(T+1)/2 / T times as much)
  local suite=$1 out=results/$1.parts/joint-offline s dirs=()
  local committed=results/$suite/joint-offline-selection.json
  # its search (hours here) is committed and the seeds read it there, unless TUNE=1 searches again (a search
  # stopped part-way continues from the tune-progress.json in $out)
  if [ -n "${TUNE:-}" ] || [ ! -f "$committed" ]; then
    "$BIN/hf-clroute" tune --suite "$suite" --methods joint-offline --seed 0 --out "$out" --no-progress --precision fp32
    cp "$out/selection.json" "$committed"
  fi
  for s in ${SEEDS//,/ }; do  # one job per seed, two at a time: each lands whole, whatever stops later
    "$BIN/hf-clroute" bench --suite "$suite" --methods joint-offline --seeds "$s" --out "$out-s$s" \
        --selection "$committed" --no-progress --precision fp32 &
    dirs+=("$out-s$s")
    while [ "$(jobs -rp | wc -l)" -ge 2 ]; do sleep 10; done
  done
  wait
  add "$suite" "${dirs[@]}"
}

joint_again() {  # suite...: one job per suite, side by side
  local s
  for s in "$@"; do
    "$BIN/hf-clroute" bench --suite "$s" --methods joint --seeds "$SEEDS" --out "results/$s.parts/joint-again" \
        --selection "results/$s/selection.json" --no-progress --precision fp32 &
  done
  wait
  for s in "$@"; do add "$s" "results/$s.parts/joint-again"; done
}

room() {  # split-mnist-r's table from its backbone up, two lanes: every row tuned by the one rule, then 5 seeds;
          # then its upper bound (room-joint) and the 20%-data rows (scarce) with the new picks
  (tune split-mnist-r cached; bench split-mnist-r cached; rows split-mnist-r prompts rwf,l2p,dualprompt
   rows split-mnist-r cosine rwf-head-only-cosine,rwf-cosine) &
  (rows split-mnist-r adapters lora,online-lora,coda-prompt; rows split-mnist-r osf osf-head-only,osf)
  wait
  merge split-mnist-r
}

case "${1:-}" in
  room-joint) joint_offline split-mnist-r; exit ;;
  joint-offline) joint_offline "${2:?joint-offline needs a suite: wordnet or split-mnist-r}"; exit ;;
esac
"$@"
