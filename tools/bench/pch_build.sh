#!/usr/bin/env bash
# tools/bench/pch_build.sh [DEVICE] [TASK CANDIDATE]: one C++ extension's verdict, whole
# (`crucible eval`, its process start included), with and without the build service's precompiled
# torch/extension.h. Each side builds a source of its own (a comment added to the C++ code) in a
# fresh extension cache; the "with" side's header is made first by a warm-up verdict of a third
# source and is not counted. The "without" side cannot make one (its cache's pch is a file).
# Defaults: cpu, env/tasks/cpu/01_relu_scale.py with tests/candidates/legit_cpp_extension.py.
# Prints the wall seconds of each side and their ratio. Reproduces docs/PERFORMANCE.md's
# "precompiled torch/extension.h" figure. CRUCIBLE: the crucible binary (build/tools/crucible).
set -euo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CRUCIBLE="${CRUCIBLE:-$ROOT/build/tools/crucible}"
DEVICE="${1:-cpu}"
TASK="${2:-$ROOT/env/tasks/cpu/01_relu_scale.py}"
CAND="${3:-$ROOT/tests/candidates/legit_cpp_extension.py}"
LINE='auto xc = x.contiguous();'
grep -qF "$LINE" "$CAND" || { echo "pch_build: $CAND has no line '$LINE' to vary" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for side in warm with without; do
  sed "s|$LINE|$LINE // $side $$|" "$CAND" > "$work/$side.py"
done
mkdir -p "$work/cache-with" "$work/cache-without"
touch "$work/cache-without/pch"
verdict() { # cache candidate -> wall seconds
  local start end
  start=$(date +%s.%N)
  "$CRUCIBLE" eval --task "$TASK" --candidate "$2" --device "$DEVICE" --no-cache --json \
    --set evaluator.extensions_dir="$1" --set evaluator.load_timeout_s=900 \
    --set evaluator.rounds=20 --set evaluator.max_rounds=20 > "$work/out.json" 2> "$work/err.log" || true
  end=$(date +%s.%N)
  grep -q '"status":"ok"' "$work/out.json" || { echo "pch_build: the verdict is not ok:" >&2; cat "$work/out.json" "$work/err.log" >&2; exit 1; }
  echo "$end - $start" | bc
}
verdict "$work/cache-with" "$work/warm.py" > /dev/null
ls "$work"/cache-with/pch/*/torch/extension.h.gch > /dev/null || { echo "pch_build: no header was made" >&2; exit 1; }
with=$(verdict "$work/cache-with" "$work/with.py")
without=$(verdict "$work/cache-without" "$work/without.py")
printf 'with the precompiled header: %.1f s\nwithout: %.1f s\nratio (without / with): %.2fx\n' \
  "$with" "$without" "$(echo "$without / $with" | bc -l)"
