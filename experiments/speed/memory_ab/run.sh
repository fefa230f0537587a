#!/bin/bash
# make bench's memory runs only (bench.py --skip-speed --skip-targets), the library of BASE (a git worktree) and the
# checkout's, alternating, ROUNDS rounds (default 2); each run's record -> OUT/{base,head}_{round}.json (OUT:
# experiments/speed/memory_ab).
#   bash experiments/speed/memory_ab/run.sh 90da415 [OUT] [ROUNDS]
set -e
BASE=${1:?usage: run.sh BASE_COMMIT}
ROOT=$(git rev-parse --show-toplevel)
OUT=${2:-$ROOT/experiments/memory_ab}
mkdir -p "$OUT"
WT=$(mktemp -d)/base
git -C "$ROOT" worktree add --detach "$WT" "$BASE" -q
trap 'git -C "$ROOT" worktree remove --force "$WT"' EXIT
for round in $(seq 1 "${3:-2}"); do
  for lib in base head; do
    if [ $lib = base ]; then dir=$WT; else dir=$ROOT; fi
    out=$(mktemp -d)
    (cd "$dir" && PYTHONPATH="$dir" "$ROOT/.venv/bin/python" benchmarks/bench.py --skip-speed --skip-targets \
        --out-dir "$out" > "$out/log" 2>&1)
    cp "$out/bench.json" "$OUT/${lib}_${round}.json"
    python3 -c "import json; d = json.load(open('$out/bench.json')); m = d['memory']; print('$lib', $round, \
{k: round(v['shared_peak_mib']) for k, v in m['summary'].items()}, round(m['ratio_shared_nmax_over_one'], 4))"
  done
done
