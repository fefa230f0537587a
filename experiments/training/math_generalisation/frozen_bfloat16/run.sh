#!/usr/bin/env bash
# The main job (recipes/configs/math_generalisation_at_grpo.yaml, unchanged) with the frozen linears computed from
# bfloat16 copies (frozen_matmul_dtype: bfloat16, issue 40), the seeds of ../run.sh, collected into this folder: does
# the team still learn, and how much time do the runs take? Compare with ../table.md (float32, the same seeds).
#
#   experiments/training/math_generalisation/frozen_bfloat16/run.sh            # seeds 0 1 2 (nothing else on the machine)
#   SEEDS="0" experiments/training/math_generalisation/frozen_bfloat16/run.sh  # some seeds
set -euo pipefail
cd "$(dirname "$0")/../../../.."
BIN=.venv/bin
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
runs=()
for seed in ${SEEDS-0 1 2}; do
  echo "== $(date -u +%H:%M:%S) team seed $seed, frozen_matmul_dtype bfloat16" >&2
  "$BIN/accelerate" launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
    recipes/at_grpo.py --config recipes/configs/math_generalisation_at_grpo.yaml --seed "$seed" \
    --frozen_matmul_dtype bfloat16 --output_dir "outputs/math_gen_bf16_s$seed" --overwrite_output_dir true
  runs+=("outputs/math_gen_bf16_s$seed")
done
"$BIN/python" experiments/training/collect.py math_generalisation/frozen_bfloat16 "${runs[@]}"
