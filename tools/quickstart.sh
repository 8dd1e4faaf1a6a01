#!/usr/bin/env bash
# tools/quickstart.sh: the README's main-job command. Installs what is missing, builds the CLI
# and runs `crucible train configs/quickstart.yaml` on the CPU in a fresh run directory.
# Extra arguments go to `crucible train` (e.g. --set run.seed=7).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
tools/setup.sh
tools/build.sh crucible
name="quickstart-$(date +%Y%m%d-%H%M%S)"
exec build/tools/crucible train configs/quickstart.yaml --set "run.name=$name" "$@"
