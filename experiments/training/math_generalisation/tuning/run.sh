#!/usr/bin/env bash
# Choosing the math team's configuration on TRAINING arithmetic only (issue 37): each candidate trains with seed 0
# and is evaluated on the validation split of math_tool_generalisation (problems of the training arithmetic, each
# operation a third; never a held-out problem), then per_operation.py tabulates the team's accuracy per operation.
#
#   experiments/training/math_generalisation/tuning/run.sh                 # every candidate, one after another
#   experiments/training/math_generalisation/tuning/run.sh balanced        # some of them
#
# Candidates (the rest of each run's settings: recipes/configs/math_generalisation_at_grpo.yaml as first committed):
#   natural      the training problems as the forms come (addition about half of them), 12 steps
#   balanced     the training problems with each operation a third (dataset_split train_balanced), 12 steps
#   balanced_24  as balanced, 24 steps
#   balanced_lr1e-4_24  as balanced, learning rate 1e-4 (not 3e-4), 24 steps
#   each_op      as natural, with a worked example per operation (worked_examples each_operation: the recipe's two
#                examples show an addition and a product only, and the untrained team subtracts right on 0.11 of the
#                validation subtractions)
#   each_op_balanced  as each_op, on train_balanced
# Only natural and each_op evaluate the untrained team as well ("before"): the same model on the same validation
# problems for every candidate with the same prompts.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
BIN=.venv/bin
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
EACH_OP='{"max_turns": 2, "max_feedback_chars": 300, "worked_examples": "each_operation"}'
if [ $# -eq 0 ]; then set -- natural balanced balanced_24 balanced_lr1e-4_24 each_op each_op_balanced; fi
runs=()
for name in "$@"; do
  case $name in
    natural) extra=() ;;
    balanced) extra=(--dataset_split train_balanced --eval_stages after) ;;
    balanced_24) extra=(--dataset_split train_balanced --max_steps 24 --eval_stages after) ;;
    balanced_lr1e-4_24) extra=(--dataset_split train_balanced --max_steps 24 --learning_rate 1e-4 --eval_stages after) ;;
    each_op) extra=(--env_kwargs "$EACH_OP") ;;
    each_op_balanced) extra=(--env_kwargs "$EACH_OP" --dataset_split train_balanced --eval_stages after) ;;
    *) echo "unknown candidate: $name" >&2; exit 2 ;;
  esac
  echo "== $(date -u +%H:%M:%S) candidate $name" >&2
  "$BIN/accelerate" launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
    recipes/at_grpo.py --config recipes/configs/math_generalisation_at_grpo.yaml --seed 0 \
    --eval_dataset_split validation --eval_num_problems 90 --output_dir "outputs/tune_$name" \
    --overwrite_output_dir true "${extra[@]}"
  runs+=("outputs/tune_$name")
done
for run in outputs/tune_*; do  # every tuning run on disk, so that the table holds all candidates run so far
  [ -e "$run/summary.json" ] && runs+=("$run")
done
"$BIN/python" experiments/training/math_generalisation/tuning/per_operation.py $(printf '%s\n' "${runs[@]}" | sort -u)
