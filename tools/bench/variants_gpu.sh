#!/usr/bin/env bash
# tools/bench/variants_gpu.sh [FILTER...]: on a GPU machine, after tools/bench/isolation_cost.sh has
# built this checkout (build-gpu) and OLD_SRC (default old-src/, in OLD_SRC/build), one verdict of
# every correct variant of the GPU suite (env/tasks/gpu/variants/LEVEL/TASK/*.py, not wrong_*)
# whose LEVEL/TASK path contains a FILTER (default: all), from each side (SIDES="new old" by
# default, alternated; eval_sides.sh). It shows which legitimate kernels a change of the evaluator
# refuses. One JSON line a verdict in $OUT/variants.jsonl.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
OLD_SRC="$(cd "${OLD_SRC:-old-src}" && pwd)"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$ROOT/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
source "$ROOT/tools/bench/eval_sides.sh"
filters=("$@")
[[ ${#filters[@]} -gt 0 ]] || filters=("")
for dir in env/tasks/gpu/variants/*/*/; do
  rel="${dir#env/tasks/gpu/variants/}"; rel="${rel%/}"
  keep=0
  for f in "${filters[@]}"; do [[ "$rel" == *"$f"* ]] && keep=1; done
  [[ $keep == 1 ]] || continue
  for cand in "$dir"*.py; do
    [[ $(basename "$cand") == wrong_* ]] && continue
    eval_sides variant "$rel/$(basename "$cand")" "$ROOT/env/tasks/gpu/$rel.py" "$ROOT/$cand" "$OUT/variants.jsonl"
  done
done
