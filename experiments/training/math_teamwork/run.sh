#!/usr/bin/env bash
# Issue 60: does the math team beat its best member? Every command behind experiments/training/math_teamwork/, in order.
#
# 1. The protocol choice on TRAINING problems (validation split, seed 0): the main job's team and the team whose final
#    word is the tool's, each trained and evaluated on 90 problems of the training arithmetic -> validation/.
# 2. The tool trained ALONE with TRL's GRPOTrainer on the budget of each recorded seed of the main job
#    (experiments/training/math_generalisation/seed<N>) -> main_job_single/seed<N>/ (the reasoner trained alone on the same
#    budgets is recorded in experiments/training/math_generalisation/single_agent/).
# 3. The team with a policy per role (AT-GRPO Table 1's "MAS + RL, role-specific policies"): the main job's recipe
#    and seed with policy_mapping: specialized -> specialized/seed<N>/. Only the team is evaluated (--eval_methods team):
#    the untrained agents alone are the same bases on the same problems as in the main job's records.
# 4. AT-GRPO's Table 4 ablation: each agent trained in the team's environment with its partner frozen
#    (frozen_policies), on the same recipe and budget as step 3, then the two trained agents evaluated together on
#    the held-out problems (evaluate --adapter) -> ablation/seed<N>/ (compare with specialized/seed<N>/).
# The configuration of steps 3 and 4 is the main job's, fixed before any of their held-out results existed.
# Then table.py builds table.md (AT-GRPO Table 1's shape) from the records.
#   STEPS="1 2" SEEDS="0 1 2" experiments/training/math_teamwork/run.sh
# On the 2-core machine step 1 takes about 15 min; step 2 about 20-30 min a seed when nothing else runs (TRL's
# GRPOTrainer generates with plain generate: 40-50 s a step, about 26 steps for the budget of 7,799 tokens).
set -euo pipefail
cd "$(dirname "$0")/../../.."
BIN=.venv/bin
HERE=experiments/training/math_teamwork
OUT=${OUT:-outputs/math_teamwork}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
launch() { "$BIN/accelerate" launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no "$@"; }
keep() {  # the files of a run worth keeping (no adapters)
  mkdir -p "$2"; for f in summary.json report.md eval_per_task.jsonl eval_texts_before.jsonl eval_texts_after.jsonl \
    metrics.jsonl result.json per_task.jsonl texts.jsonl; do [ -f "$1/$f" ] && cp "$1/$f" "$2/"; done; true; }
for step in ${STEPS-1 2}; do
  case $step in
  1) for final in tool reasoner; do
       launch recipes/at_grpo.py --config recipes/configs/math_generalisation_at_grpo.yaml --seed 0 \
         --env_kwargs "{\"max_turns\": 2, \"max_feedback_chars\": 300, \"worked_examples\": \"each_operation\", \"final_answer\": \"$final\"}" \
         --eval_dataset_split validation --eval_num_problems 90 --output_dir "$OUT/validation_$final" --overwrite_output_dir true
       keep "$OUT/validation_$final" "$HERE/validation/final_$final"
     done ;;
  2) for seed in ${SEEDS-0 1 2}; do
       "$BIN/python" -m trl_multiagent train-single --team "experiments/training/math_generalisation/seed$seed" --agent tool \
         --out "$HERE/main_job_single/seed$seed" --work "$OUT/main_job_single_s$seed"
     done ;;
  3) for seed in ${SEEDS-0 1 2}; do
       launch recipes/at_grpo.py --config recipes/configs/math_generalisation_at_grpo.yaml --seed "$seed" \
         --policy_mapping specialized --eval_methods team --output_dir "$OUT/specialized_s$seed" --overwrite_output_dir true
       keep "$OUT/specialized_s$seed" "$HERE/specialized/seed$seed"
     done ;;
  4) for seed in ${SEEDS-0 1 2}; do
       for frozen in tool reasoner; do  # the reasoner trained beside a frozen tool, then the tool beside a frozen reasoner
         launch recipes/at_grpo.py --config recipes/configs/math_generalisation_at_grpo.yaml --seed "$seed" \
           --policy_mapping specialized --frozen_policies "$frozen" --evaluator none \
           --output_dir "$OUT/ablation_frozen_${frozen}_s$seed" --overwrite_output_dir true
         keep "$OUT/ablation_frozen_${frozen}_s$seed" "$HERE/ablation/seed$seed/frozen_$frozen"
       done
       "$BIN/python" -m trl_multiagent evaluate --team "$OUT/ablation_frozen_tool_s$seed" \
         --adapter "tool=$OUT/ablation_frozen_reasoner_s$seed" --evaluator auto --methods team \
         --output_dir "$OUT/ablation_combined_s$seed"
       keep "$OUT/ablation_combined_s$seed" "$HERE/ablation/seed$seed/combined"
     done ;;
  esac
done
"$BIN/python" "$HERE/table.py"
