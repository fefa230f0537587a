#!/usr/bin/env bash
# The math team's generalisation experiment (issue 37), one command: three seeds of the team trained with AT-GRPO
# (recipes/configs/math_generalisation_at_grpo.yaml, fixed before any held-out result), collected into this folder;
# then, per seed, ONE agent trained with TRL's own GRPOTrainer on that seed's budget of generated completion tokens
# and compared with the team on the same held-out problems (now `python -m trl_multiagent train-single --team ... --agent reasoner` -> single_agent/seed<N>/; these records were made by its earlier form, a script here).
#
#   experiments/training/math_generalisation/run.sh            # seeds 0 1 2 (2-core machine: nothing else beside it)
#   SEEDS="0" experiments/training/math_generalisation/run.sh  # some seeds
set -euo pipefail
cd "$(dirname "$0")/../../.."
BIN=.venv/bin
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
runs=()
for seed in ${SEEDS-0 1 2}; do
  echo "== $(date -u +%H:%M:%S) team seed $seed" >&2
  "$BIN/accelerate" launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
    recipes/at_grpo.py --config recipes/configs/math_generalisation_at_grpo.yaml --seed "$seed" \
    --output_dir "outputs/math_gen_s$seed" --overwrite_output_dir true
  runs+=("outputs/math_gen_s$seed")
done
"$BIN/python" experiments/training/collect.py math_generalisation "${runs[@]}"
for seed in ${SEEDS-0 1 2}; do
  echo "== $(date -u +%H:%M:%S) single agent (TRL GRPOTrainer) seed $seed" >&2
  "$BIN/python" -m trl_multiagent train-single --agent reasoner --team "outputs/math_gen_s$seed" \
    --out "experiments/training/math_generalisation/single_agent/seed$seed" --work "outputs/single_agent_s$seed"
done
