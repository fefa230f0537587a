#!/bin/bash
# Team-level generation of the `agents` workload timed for two libraries: BASE (a git worktree) and the checkout,
# alternating, ROUNDS rounds (default 3), 1 and 4 agents each round, CALLS timed calls per run (default 5), a fresh
# process per run (benchmarks/targets.py team-time, with PYTHONPATH choosing the library); each run's record ->
# OUT/{base,head}_{agents}_{round}.json (OUT: experiments/speed/agents_paired/ab).
#   bash experiments/speed/agents_paired/ab.sh c7de393 [OUT] [ROUNDS] [CALLS]
set -e
BASE=${1:?usage: ab.sh BASE_COMMIT [OUT] [ROUNDS] [CALLS]}
ROOT=$(git rev-parse --show-toplevel)
OUT=$(realpath -m "${2:-$ROOT/experiments/speed/agents_paired/ab}")  # absolute: the runs start in the libraries' trees
mkdir -p "$OUT"
WT=$(mktemp -d)/base
git -C "$ROOT" worktree add --detach "$WT" "$BASE" -q
trap 'git -C "$ROOT" worktree remove --force "$WT"' EXIT
for round in $(seq 1 "${3:-3}"); do
  for lib in base head; do
    if [ $lib = base ]; then dir=$WT; else dir=$ROOT; fi
    for agents in 1 4; do
      out="$OUT/${lib}_${agents}_${round}.json"
      (cd "$dir" && PYTHONPATH="$dir" "$ROOT/.venv/bin/python" "$ROOT/benchmarks/targets.py" team-time \
          --agents "$agents" --calls "${4:-5}" --out "$out" > /dev/null 2>&1)
      python3 -c "import json; d = json.load(open('$out')); print('$lib', $round, $agents, 'agents:', \
round(d['median_s'], 3), 's median of', [round(s, 2) for s in d['seconds']])"
    done
  done
done
