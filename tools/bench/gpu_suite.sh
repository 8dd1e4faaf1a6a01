#!/usr/bin/env bash
# tools/bench/gpu_suite.sh FILTER...: the GPU task suite's checks on one GPU (docs/PERFORMANCE.md,
# "GPU task suite"), from env/tasks/gpu to one report a FILTER in OUT (default runs/bench/suite).
# tools/check_tasks.py over the tasks whose names contain each FILTER (level1, level2, level2/0,
# ...), with their variants, whose load_inline extensions are built first, all at once
# (MAX_JOBS compile jobs each, default 4; TORCH_CUDA_ARCH_LIST as set, else the visible device's).
# Needs no build of crucible. Output: OUT/check_FILTER.json. PYTHON: the interpreter with torch
# (default .venv/bin/python, else python3).
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/suite}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
[[ $# -gt 0 ]] || { echo "gpu_suite: name at least one FILTER (level1, level2/0, ...)" >&2; exit 2; }
mkdir -p "$OUT"
export MAX_JOBS="${MAX_JOBS:-4}" PYTHONUNBUFFERED=1
start=$(date +%s)
for filter in "$@"; do
  # shellcheck disable=SC2013 # the suite's file names have no spaces
  for f in $(grep -l load_inline env/tasks/gpu/variants/"${filter%%/*}"/*/*.py 2>/dev/null); do
    [[ "$f" == *"/${filter#*/}"* ]] || continue
    "$PYTHON" -c 'import importlib.util as u, sys
s = u.spec_from_file_location("variant", sys.argv[1]); m = u.module_from_spec(s); s.loader.exec_module(m)' "$f" \
      > /dev/null 2>> "$OUT/prebuild.log" &
  done
done
wait
echo "gpu_suite: extensions built in $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for filter in "$@"; do
  start=$(date +%s)
  "$PYTHON" tools/check_tasks.py --suite env/tasks/gpu --device cuda --variants --only "$filter" --seeds 1 --rounds 15 \
    --timeout 150 --json "$OUT/check_${filter//\//_}.json" 2>&1 | tail -40
  echo "gpu_suite: $filter took $(( $(date +%s) - start )) s"
done
