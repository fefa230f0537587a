#!/usr/bin/env bash
# The MAPoRL debate on easy arithmetic, three seeds, trained as the authors' released trainer does (issue 61), then
# collected here and read (analyse.py). From the repository's root; ~30 min a seed on 2 quiet CPU cores.
#   experiments/training/math_easy_debate/run.sh            # the seeds, then collect and analyse
#   SEEDS="1" experiments/training/math_easy_debate/run.sh   # some seeds only
set -euo pipefail
cd "$(dirname "$0")/../../.."
BIN=.venv/bin
HERE=experiments/training/math_easy_debate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
for seed in ${SEEDS-0 1 2}; do
  # log_completions writes completions.jsonl (every joint action with each answer's advantage; observation only)
  "$BIN/accelerate" launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
    recipes/maporl.py --config recipes/configs/math_easy_debate.yaml --seed "$seed" \
    --output_dir "outputs/debate_s$seed" --overwrite_output_dir true --log_completions true
done
"$BIN/python" experiments/training/collect.py math_easy_debate outputs/debate_s0 outputs/debate_s1 outputs/debate_s2
for seed in 0 1 2; do cp "outputs/debate_s$seed/completions.jsonl" "$HERE/seed$seed/" 2>/dev/null || true; done
"$BIN/python" experiments/training/by_template.py "$HERE" majority_accuracy
"$BIN/python" "$HERE/analyse.py" "$HERE"/seed0 "$HERE"/seed1 "$HERE"/seed2 > "$HERE/analysis.md"
