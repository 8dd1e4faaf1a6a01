#!/usr/bin/env bash
# tools/bench/hack_suite_gpu.sh [CANDIDATE...]: on a GPU machine, after tools/bench/isolation_cost.sh
# has built this checkout (build-gpu) and OLD_SRC (default old-src/, built in OLD_SRC/build), one
# verdict of each GPU hack candidate (default: every file under tests/candidates/gpu) from each
# side (SIDES="new old" by default), on its '# task:', the sides alternated (eval_sides.sh). One
# JSON line a verdict in $OUT/hacks.jsonl: candidate, side, status, speedup, checks, wall time,
# message.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
OLD_SRC="$(cd "${OLD_SRC:-old-src}" && pwd)"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$ROOT/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
source "$ROOT/tools/bench/eval_sides.sh"
files=("$@")
[[ ${#files[@]} -gt 0 ]] || files=(tests/candidates/gpu/*.py)
for f in "${files[@]}"; do
  task="$(sed -n 's/^# task:[[:space:]]*//p' "$ROOT/$f" | head -1)"
  start=$(date +%s)
  eval_sides candidate "$(basename "$f")" "$ROOT/$task" "$ROOT/$f" "$OUT/hacks.jsonl"
  echo "hack_suite_gpu: $(basename "$f") took $(( $(date +%s) - start )) s"
done
