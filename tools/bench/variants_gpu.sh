#!/usr/bin/env bash
# tools/bench/variants_gpu.sh [FILTER...]: on a GPU machine, after tools/bench/isolation_cost.sh has
# built this checkout (build-gpu) and OLD_SRC (default old-src/, in OLD_SRC/build), one verdict of
# every correct variant of the GPU suite (env/tasks/gpu/variants/LEVEL/TASK/*.py, not wrong_*)
# whose LEVEL/TASK path contains a FILTER (default: all), from each side (SIDES="new old" by
# default, alternated), `crucible eval --json --no-cache`. It shows which legitimate kernels a
# change of the evaluator refuses. One JSON line a verdict in $OUT/variants.jsonl.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
OLD_SRC="$(cd "${OLD_SRC:-old-src}" && pwd)"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$ROOT/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
filters=("$@")
[[ ${#filters[@]} -gt 0 ]] || filters=("")
for dir in env/tasks/gpu/variants/*/*/; do
  rel="${dir#env/tasks/gpu/variants/}"; rel="${rel%/}"
  keep=0
  for f in "${filters[@]}"; do [[ "$rel" == *"$f"* ]] && keep=1; done
  [[ $keep == 1 ]] || continue
  for cand in "$dir"*.py; do
    name="$(basename "$cand")"
    [[ $name == wrong_* ]] && continue
    for side in ${SIDES:-new old}; do
      if [[ $side == new ]]; then bin="$ROOT/build-gpu/tools/crucible"; base="$ROOT"; else bin="$OLD_SRC/build/tools/crucible"; base="$OLD_SRC"; fi
      (cd "$base" && timeout 300 "$bin" eval --task "$ROOT/env/tasks/gpu/$rel.py" --candidate "$ROOT/$cand" --device cuda:0 \
        --json --no-cache 2>>"$OUT/variants-stderr-$side.log") |
        python3 -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        v = json.loads(line)
        print(json.dumps({"variant": sys.argv[1], "side": sys.argv[2], "status": v["status"], "speedup": v["speedup"],
                          "checks": v["checks_failed"], "wall_s": v.get("wall_s"), "message": v["message"][:300]}))' \
          "$rel/$name" "$side" | tee -a "$OUT/variants.jsonl"
    done
  done
done
