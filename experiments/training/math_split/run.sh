#!/usr/bin/env bash
# Issue 60, item 4: the second task, where the two roles need each other (recipes/configs/math_split_at_grpo.yaml:
# the reasoner plans with the question's numbers hidden, the tool computes with the numbers and the plan). Every
# command behind experiments/training/math_split/, in order.
#
# 1. The choice on TRAINING problems (seed 0, validation split: 90 problems of the training arithmetic), before any
#    held-out result of this task existed: the training problems as they come (train) or each operation equally
#    often (train_balanced, chosen) -> validation/<split>/.
# 2. The team on the held-out problems, seeds 0, 1, 2 (the main job's 120 problems per seed, the same task ids)
#    -> seed<N>/ (the untrained members alone, with their own half of the problem, come with it).
# 3. Each member trained ALONE with TRL's GRPOTrainer on the team's budget of generated tokens, seeing only its own
#    half (train-single) -> single/seed<N>/.
# Then table.py compares the team with every single agent: the members of this task alone (untrained, trained
# alone) and the single agents that see the WHOLE problem (the main job's records, the same problems).
#   STEPS="1 2 3" SEEDS="0 1 2" experiments/training/math_split/run.sh
# On the 2-core machine (AMD EPYC) step 1 and each seed of step 2 take about 5 min; step 3 about 25 min a member a seed.
set -euo pipefail
cd "$(dirname "$0")/../../.."
BIN=.venv/bin
HERE=experiments/training/math_split
OUT=${OUT:-outputs/math_split}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
launch() { "$BIN/accelerate" launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no "$@"; }
keep() {  # the files of a run worth keeping (no adapters)
  mkdir -p "$2"; for f in summary.json report.md eval_per_task.jsonl eval_texts_before.jsonl eval_texts_after.jsonl \
    metrics.jsonl result.json per_task.jsonl texts.jsonl; do [ -f "$1/$f" ] && cp "$1/$f" "$2/"; done; true; }
for step in ${STEPS-1 2 3}; do
  case $step in
  1) for split in train train_balanced; do
       launch recipes/at_grpo.py --config recipes/configs/math_split_at_grpo.yaml --seed 0 --dataset_split "$split" \
         --eval_dataset_split validation --eval_num_problems 90 --output_dir "$OUT/validation_$split" \
         --overwrite_output_dir true
       keep "$OUT/validation_$split" "$HERE/validation/$split"
     done ;;
  2) for seed in ${SEEDS-0 1 2}; do
       launch recipes/at_grpo.py --config recipes/configs/math_split_at_grpo.yaml --seed "$seed" \
         --output_dir "$OUT/seed$seed" --overwrite_output_dir true
       keep "$OUT/seed$seed" "$HERE/seed$seed"
     done ;;
  3) for seed in ${SEEDS-0 1 2}; do
       for agent in ${AGENTS-tool reasoner}; do
         "$BIN/python" -m trl_multiagent train-single --team "$HERE/seed$seed" --agent "$agent" \
           --out "$HERE/single/seed$seed/$agent" --work "$OUT/single_s$seed"
       done
     done ;;
  esac
done
"$BIN/python" "$HERE/table.py"
