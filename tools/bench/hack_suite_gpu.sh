#!/usr/bin/env bash
# tools/bench/hack_suite_gpu.sh [CANDIDATE...]: on a GPU machine, after tools/bench/isolation_cost.sh
# has built this checkout (build-gpu) and OLD_SRC (default old-src/, built in OLD_SRC/build), one
# verdict of each GPU hack candidate (default: every file under tests/candidates/gpu) from each
# side (SIDES="new old" by default), `crucible eval --json --no-cache` on its '# task:', the sides
# alternated. One JSON line a verdict in $OUT/hacks.jsonl: candidate, side, status, speedup,
# checks, wall time, message.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
OLD_SRC="$(cd "${OLD_SRC:-old-src}" && pwd)"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$ROOT/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
files=("$@")
[[ ${#files[@]} -gt 0 ]] || files=(tests/candidates/gpu/*.py)
for f in "${files[@]}"; do
  cand="$ROOT/$f"
  task="$(sed -n 's/^# task:[[:space:]]*//p' "$cand" | head -1)"
  for side in ${SIDES:-new old}; do
    if [[ $side == new ]]; then bin="$ROOT/build-gpu/tools/crucible"; base="$ROOT"; else bin="$OLD_SRC/build/tools/crucible"; base="$OLD_SRC"; fi
    start=$(date +%s)
    (cd "$base" && timeout 300 "$bin" eval --task "$ROOT/$task" --candidate "$cand" --device cuda:0 --json --no-cache \
      2>>"$OUT/hacks-stderr-$side.log") |
      python3 -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        v = json.loads(line)
        print(json.dumps({"candidate": sys.argv[1], "side": sys.argv[2], "status": v["status"], "speedup": v["speedup"],
                          "checks": v["checks_failed"], "wall_s": v.get("wall_s"), "message": v["message"][:300]}))' \
        "$(basename "$f")" "$side" | tee -a "$OUT/hacks.jsonl"
    echo "hack_suite_gpu: $(basename "$f") $side took $(( $(date +%s) - start )) s"
  done
done
