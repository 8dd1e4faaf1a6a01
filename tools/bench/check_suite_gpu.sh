#!/usr/bin/env bash
# tools/bench/check_suite_gpu.sh FILTER...: on a GPU machine, runs tools/check_tasks.py over the
# GPU suite's tasks whose names contain each FILTER (one check_tasks run per filter, one JSON
# report each under $OUT), with their variants. The variants' load_inline extensions are built
# first, all at once, so the checks time kernels instead of waiting on one compile after another.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-4}" PYTHONUNBUFFERED=1
start=$(date +%s)
for filter in "$@"; do
  for f in $(grep -l load_inline env/tasks/gpu/variants/"${filter%%/*}"/*/*.py 2>/dev/null); do
    [[ "$f" == *"/${filter#*/}"* ]] || continue
    python3 -c 'import importlib.util as u, sys
s = u.spec_from_file_location("variant", sys.argv[1]); m = u.module_from_spec(s); s.loader.exec_module(m)' "$f" \
      > /dev/null 2>> "$OUT/prebuild.log" &
  done
done
wait
echo "check_suite_gpu: extensions built in $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for filter in "$@"; do
  start=$(date +%s)
  python3 tools/check_tasks.py --suite env/tasks/gpu --device cuda --variants --only "$filter" --seeds 1 --rounds 15 \
    --timeout 150 --json "$OUT/check_${filter//\//_}.json" 2>&1 | tail -40
  echo "check_suite_gpu: $filter took $(( $(date +%s) - start )) s"
done
