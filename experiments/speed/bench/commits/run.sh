#!/usr/bin/env bash
# The main job's step time (make bench's demo_step_s command) at several commits, one after another on one machine:
#   experiments/speed/bench/commits/run.sh 5ab09d3 e2c81de e6f70a8 > experiments/speed/bench/commits/<cpu>.log
# Each commit is checked out in a temporary worktree and run with its own package (PYTHONPATH), this checkout's .venv.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
PY=$ROOT/.venv/bin/python
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false
echo "cpu: $($PY -c 'from trl_multiagent.runtime.provenance import cpu_model, cpu_generation; print(cpu_model(), cpu_generation())')"
for commit in "$@"; do
  tree=$(mktemp -d); out=$(mktemp -d)
  trap 'git -C "$ROOT" worktree remove --force "$tree" 2>/dev/null; rm -rf "$out"' EXIT  # also when a run fails
  git -C "$ROOT" worktree add --detach -f "$tree" "$commit" >/dev/null 2>&1
  (cd "$tree" && PYTHONPATH="$tree" "$PY" -m trl_multiagent train --config recipes/configs/math_generalisation_at_grpo.yaml \
     --max_steps 5 --evaluator none --output_dir "$out/run" --disable_tqdm true >"$out/log" 2>&1)
  (cd "$ROOT/benchmarks" && "$PY" - "$commit" "$out/run/metrics.jsonl" <<'PY'
import json, statistics, sys
from measure import matmul_flops, packed_matmul_flops
rows = [json.loads(line) for line in open(sys.argv[2])]
steps = [r for r in rows if "step_time" in r]
times = [round(r["step_time"], 2) for r in steps]
print(f"{sys.argv[1]}: step_time_s {times}, mean after the first {statistics.fmean(times[1:]):.2f} s; "
      f"forward+backward after the first {statistics.fmean(r['time/forward'] + r['time/backward'] for r in steps[1:]):.2f} s; "
      f"matmul {matmul_flops() / 1e9:.0f} GFLOP/s, oneDNN packed {packed_matmul_flops() / 1e9:.0f} GFLOP/s")
PY
  )
  git -C "$ROOT" worktree remove --force "$tree"; rm -rf "$out"
done
