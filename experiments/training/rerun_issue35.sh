#!/usr/bin/env bash
# Rerun the recorded results that issue 35's fidelity fixes change, on the papers' objectives, and collect them.
#
#   experiments/training/rerun_issue35.sh collm_dc debate at_grpo at_grpo_specialized mhgpo_rr strbuild_magrpo tldr_dc
#   SEEDS="1 2" COLLECT=no experiments/training/rerun_issue35.sh debate   # some seeds only; archive and collect later
#   SEEDS= experiments/training/rerun_issue35.sh debate                  # no seed: archive and collect outputs/ as they are
#
# Each group runs its seeds one after another (2-core machine: nothing else should run beside them), then moves the
# earlier rows of its folder (seed0-2, table.*, by_template.md) into <folder>/earlier_objective/ with a README line
# saying what changed, and collects the new runs (experiments/training/collect.py rebuilds the table in README.md).
# What changed (issue 35):
#   collm_dc             CoLLM-DC critics read m_t (App. E); the actor is Eq. 2/4's rho * delta, unclipped
#   debate               MAPoRL Def. 1's influence reward (own score at t + later turns' team mean, normalised);
#                        App. G.2's -10 enters the verifier score, not the final reward
#   at_grpo(_specialized) the parallel order executes the best-scoring joint action that was scored together
#   mhgpo_rr             Round-robin forks with the paper's probabilities (0.7, 0.1, 0.2), not uniform ones
#   strbuild_magrpo      MAGRPO with H = 4: each turn's objective averaged over its samples, the turns summed
#   tldr_dc              as collm_dc, on the TL;DR pair
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=.venv/bin
LAUNCH=("$BIN/accelerate" launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

archive() {  # archive <folder> <what changed>
  local dir=experiments/$1
  [ -d "$dir/earlier_objective" ] && return 0
  mkdir -p "$dir/earlier_objective"
  for f in seed0 seed1 seed2 table.json table.md by_template.md; do
    if [ -e "$dir/$f" ]; then mv "$dir/$f" "$dir/earlier_objective/"; fi
  done
  printf '# Earlier runs of this recipe, before issue 35\n\n%s\n\nThe rows here ran on the objective before that change; the runs one folder up replace them.\n' \
    "$2" > "$dir/earlier_objective/README.md"
}

seeds() {  # seeds <script> <config> <prefix> [extra args...]: seeds 0 1 2 into outputs/<prefix>_s<seed>
  local script=$1 config=$2 prefix=$3
  shift 3
  for seed in ${SEEDS-0 1 2}; do
    echo "== $(date -u +%H:%M:%S) $script $config seed $seed" >&2
    "${LAUNCH[@]}" "recipes/$script" --config "recipes/configs/$config" --seed "$seed" \
      --output_dir "outputs/${prefix}_s$seed" --overwrite_output_dir true "$@"
  done
}

seeded() {  # seeded <group>: the seeds of a seeded group (the other groups run their one command below)
  case $1 in
    collm_dc) seeds collm.py math_easy_dc.yaml math_dc ;;
    debate) seeds debate.py math_easy_debate.yaml debate ;;
    at_grpo) seeds at_grpo.py math_easy_at_grpo.yaml at_shared ;;
    at_grpo_specialized) seeds at_grpo.py math_easy_at_grpo_specialized.yaml at_spec ;;
    tldr_dc) seeds collm.py tldr_dc_small.yaml tldr_dc ;;
    mhgpo_rr|strbuild_magrpo) if [ "${COLLECT:-yes}" = no ]; then echo "COLLECT=no: $1 has no seeds to run" >&2; exit 2; fi ;;
    *) echo "unknown group: $1" >&2; exit 2 ;;
  esac
}

for group in "$@"; do
  seeded $group
  if [ "${COLLECT:-yes}" = no ]; then continue; fi  # the seeds only
  case $group in
    collm_dc)
      archive math_easy_collm_dc "Changed: the DC critics now read the global information m_t (App. E), and the actor's objective is Eq. 2/4's unclipped rho * delta (the 0.2 ratio clip is now the option actor_ratio_clip)."
      $BIN/python experiments/training/collect.py math_easy_collm_dc outputs/math_dc_s0 outputs/math_dc_s1 outputs/math_dc_s2
      $BIN/python experiments/training/by_template.py experiments/training/math_easy_collm_dc final/team_correct ;;
    debate)
      archive math_easy_debate "Changed: the influence-aware reward is Def. 1's (the agent's own score at turn t plus the discounted team mean of later turns, divided by the discount sum; before, all agents' scores at turn t were averaged too, unnormalised), and App. G.2's -10 penalty replaces the answer's verifier score (entering every reward that aggregates it) instead of its final reward."
      $BIN/python experiments/training/collect.py math_easy_debate outputs/debate_s0 outputs/debate_s1 outputs/debate_s2
      $BIN/python experiments/training/by_template.py experiments/training/math_easy_debate majority_accuracy ;;
    at_grpo)
      archive math_easy_at_grpo "Changed: in the parallel agent order the executed joint action is the scored one with the highest summed Eq. 3 reward; before, each agent's best candidate was executed, a pair never scored together."
      $BIN/python experiments/training/collect.py math_easy_at_grpo outputs/at_shared_s0 outputs/at_shared_s1 outputs/at_shared_s2
      $BIN/python experiments/training/by_template.py experiments/training/math_easy_at_grpo final/team_correct ;;
    at_grpo_specialized)
      archive math_easy_at_grpo_specialized "Changed: in the parallel agent order the executed joint action is the scored one with the highest summed Eq. 3 reward; before, each agent's best candidate was executed, a pair never scored together."
      $BIN/python experiments/training/collect.py math_easy_at_grpo_specialized outputs/at_spec_s0 outputs/at_spec_s1 outputs/at_spec_s2
      $BIN/python experiments/training/by_template.py experiments/training/math_easy_at_grpo_specialized final/team_correct ;;
    mhgpo_rr)
      echo "== $(date -u +%H:%M:%S) mhgpo round robin seed 0" >&2
      "${LAUNCH[@]}" recipes/mhgpo.py --config recipes/configs/search_qa_mhgpo_small.yaml --sampling round_robin \
        --output_dir outputs/mhgpo_rr_s0 --overwrite_output_dir true
      archive search_qa_mhgpo_rr "Changed: Round-robin's fork agent is drawn with the paper's probabilities (0.7, 0.1, 0.2) by default; before, uniformly."
      $BIN/python experiments/training/collect.py search_qa_mhgpo_rr outputs/mhgpo_rr_s0 ;;
    strbuild_magrpo)
      echo "== $(date -u +%H:%M:%S) strbuild magrpo" >&2
      OMP_NUM_THREADS=1 "${LAUNCH[@]}" recipes/magrpo.py --config recipes/configs/strbuild_magrpo.yaml \
        --output_dir outputs/strbuild_magrpo --overwrite_output_dir true
      mkdir -p experiments/training/strbuild/earlier_objective
      for f in magrpo_summary.json magrpo_metrics.jsonl; do
        if [ -e experiments/training/strbuild/$f ]; then mv experiments/training/strbuild/$f experiments/training/strbuild/earlier_objective/; fi
      done
      cp outputs/strbuild_magrpo/summary.json experiments/training/strbuild/magrpo_summary.json
      cp outputs/strbuild_magrpo/metrics.jsonl experiments/training/strbuild/magrpo_metrics.jsonl ;;
    tldr_dc)
      archive tldr_collm_dc "Changed: the DC critics now read the global information m_t (App. E), and the actor's objective is Eq. 2/4's unclipped rho * delta."
      $BIN/python experiments/training/collect.py tldr_collm_dc outputs/tldr_dc_s0 outputs/tldr_dc_s1 outputs/tldr_dc_s2 ;;
    *) echo "unknown group: $group" >&2; exit 2 ;;
  esac
done
