#!/usr/bin/env bash
# tools/quickstart.sh: the README's main-job command. Installs what is missing, builds the CLI
# and runs the CPU quickstart (configs/quickstart.yaml) in a fresh run directory: the run pauses
# after PAUSE_AFTER learner steps (default 20), is resumed from its checkpoint, finishes, and the
# report shows how the share of correct samples and their speedup changed over the RL steps.
# Extra arguments go to `crucible train` (e.g. --set run.seed=7).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
tools/setup.sh
tools/build.sh crucible
name="quickstart-$(date +%Y%m%d-%H%M%S)"
run="runs/$name"
start=$(date +%s)
echo "== crucible train configs/quickstart.yaml (pauses after ${PAUSE_AFTER:-20} steps)"
build/tools/crucible train configs/quickstart.yaml --set "run.name=$name" --pause-after "${PAUSE_AFTER:-20}" "$@"
build/tools/crucible status "$run"
echo "== crucible resume $run"
build/tools/crucible resume "$run"
echo "== crucible report $run"
build/tools/crucible report "$run"
echo "quickstart: $(( $(date +%s) - start )) s for the run; report in $run/report/report.html"
