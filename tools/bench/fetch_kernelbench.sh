#!/usr/bin/env bash
# tools/bench/fetch_kernelbench.sh [DEST]: KernelBench's task levels 1-3
# (github.com/ScalingIntelligence/KernelBench, KernelBench/level{1,2,3}/*.py) at the commit the
# timing figures in docs/PERFORMANCE.md were taken from, into DEST (default data/kernelbench,
# ignored by git). tools/bench/reference_as_candidate.py turns a level into a set of pairs: the
# self-l1 step of tools/bench/gpu_session.sh timing, for the goals table's row on timing
# precision. Needs git and the network; no environment variables.
set -euo pipefail
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { sed -n 2,7p "$0" | sed 's/^# \{0,1\}//'; exit 0; }
COMMIT=423217d9fda91e0c2d67e4a43bf62f96f6d104f1
DEST="${1:-data/kernelbench}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
git -C "$tmp" init -q
git -C "$tmp" fetch -q --depth 1 https://github.com/ScalingIntelligence/KernelBench.git "$COMMIT"
mkdir -p "$DEST"
git -C "$tmp" archive FETCH_HEAD KernelBench/level1 KernelBench/level2 KernelBench/level3 |
  tar -x -C "$DEST" --strip-components=1
echo "KernelBench $COMMIT: $(ls "$DEST"/level1/*.py "$DEST"/level2/*.py "$DEST"/level3/*.py | wc -l) tasks in $DEST"
