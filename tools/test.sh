#!/usr/bin/env bash
# tools/test.sh: the README's test command. Installs what is missing, builds everything, runs
# every test. GPU tests (label gpu) report "skipped" on machines without a CUDA device.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
tools/setup.sh
start=$(date +%s)
tools/build.sh
echo "test: build took $(( $(date +%s) - start )) s"
ctest --test-dir "${CRUCIBLE_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
