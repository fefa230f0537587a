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
# 4. The team with a policy per role (AT-GRPO Table 1's "MAS + RL, role-specific policies"): the same recipe and
#    seed with policy_mapping: specialized -> specialized/seed<N>/ (only the team is evaluated: the untrained members
#    alone are the same bases on the same problems as in step 2).
# 5. AT-GRPO's Table 4 ablation: each member trained in the team's environment with its partner frozen
#    (frozen_policies), same recipe and budget as step 4, then the two trained members evaluated together on the
#    held-out problems (evaluate --adapter) -> ablation/seed<N>/ (compare with specialized/seed<N>/), and the team of
#    step 4 with its two policies swapped between the roles (evaluate --adapter reasoner=tool@...) -> swapped/.
#    Steps 4 and 5 keep the configuration of step 2, fixed before any of their held-out results existed.
# Then table.py compares the team with every single agent: the members of this task alone (untrained, trained
# alone) and the single agents that see the WHOLE problem (the main job's records, the same problems).
#   STEPS="1 2 3" SEEDS="0 1 2" experiments/training/math_split/run.sh
# On the 2-core machine (AMD EPYC) step 1 and each seed of step 2 take about 5 min; step 3 about 20-30 min a member a seed;
# steps 4 and 5 about 15 min a seed together.
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
  4) for seed in ${SEEDS-0 1 2}; do
       launch recipes/at_grpo.py --config recipes/configs/math_split_at_grpo.yaml --seed "$seed" \
         --policy_mapping specialized --eval_methods team --output_dir "$OUT/specialized_s$seed" --overwrite_output_dir true
       keep "$OUT/specialized_s$seed" "$HERE/specialized/seed$seed"
     done ;;
  5) for seed in ${SEEDS-0 1 2}; do
       for frozen in tool reasoner; do  # the reasoner trained beside a frozen tool, then the tool beside a frozen reasoner
         launch recipes/at_grpo.py --config recipes/configs/math_split_at_grpo.yaml --seed "$seed" \
           --policy_mapping specialized --frozen_policies "$frozen" --evaluator none \
           --output_dir "$OUT/ablation_frozen_${frozen}_s$seed" --overwrite_output_dir true
         keep "$OUT/ablation_frozen_${frozen}_s$seed" "$HERE/ablation/seed$seed/frozen_$frozen"
       done
       "$BIN/python" -m trl_multiagent evaluate --team "$OUT/ablation_frozen_tool_s$seed" \
         --adapter "tool=$OUT/ablation_frozen_reasoner_s$seed" --evaluator auto --methods team \
         --output_dir "$OUT/ablation_combined_s$seed"
       keep "$OUT/ablation_combined_s$seed" "$HERE/ablation/seed$seed/combined"
       # Table 4's last row: the team of step 4 with its two trained policies swapped between the roles
       "$BIN/python" -m trl_multiagent evaluate --team "$OUT/specialized_s$seed" \
         --adapter "reasoner=tool@$OUT/specialized_s$seed" --adapter "tool=reasoner@$OUT/specialized_s$seed" \
         --evaluator auto --methods team --output_dir "$OUT/ablation_swapped_s$seed"
       keep "$OUT/ablation_swapped_s$seed" "$HERE/ablation/seed$seed/swapped"
     done ;;
  esac
done
"$BIN/python" "$HERE/table.py"
