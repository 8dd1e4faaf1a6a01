#!/usr/bin/env bash
# tools/bench/isolation_cost.sh [PASSES]: on a GPU machine (docs/building.md), a verdict's wall
# time on the GPU suite (tools/bench/eval_gpu, five tasks) with the workers' sandbox (this
# checkout) and without it (OLD_SRC, default old-src/: a checkout of the commit before the
# sandbox, built beside this one), the two alternated task by task in each pass, three verdicts
# per evaluator (--repeat 3). One JSON line per verdict in $OUT/isolation_cost.jsonl; the first
# pass fills the extension caches and is left out of the medians. TASKS="a b" limits the tasks;
# EVAL_ARGS goes to every `crucible eval` (e.g. fixed rounds: "--set evaluator.min_rounds=30
# --set evaluator.max_rounds=30 --set evaluator.recheck_above=1e9", so that both sides time the
# same number of rounds and the difference is the rest of the verdict).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
OLD_SRC="$(cd "${OLD_SRC:-old-src}" && pwd)"
PASSES="${1:-3}"
mkdir -p "$OUT" .deps/prefix
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/prefix; done
PREFIX="$ROOT/.deps/prefix/usr"
export LD_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
python3 -c 'import zmq' 2>/dev/null || python3 -m pip install -q --no-index --no-deps --break-system-packages .whl/*.whl
configure() { # SRC BUILD
  [[ -f $2/build.ninja ]] || cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$PREFIX;$PREFIX/lib/x86_64-linux-gnu/cmake;$PREFIX/share/cmake" \
    -DCRUCIBLE_PYTHON="$(command -v python3)" -DCRUCIBLE_CUDA=ON > "$OUT/configure-$(basename "$2").log" 2>&1
}
configure "$ROOT" "$ROOT/build-gpu"
configure "$OLD_SRC" "$OLD_SRC/build"
start=$(date +%s)
cmake --build "$ROOT/build-gpu" --target crucible -j 10 > "$OUT/build-new.log" 2>&1 &
cmake --build "$OLD_SRC/build" --target crucible -j 6 > "$OUT/build-old.log" 2>&1 &
wait
echo "isolation_cost: builds took $(( $(date +%s) - start )) s"
[[ -x build-gpu/tools/crucible && -x "$OLD_SRC/build/tools/crucible" ]] || { tail -20 "$OUT"/build-*.log; exit 1; }
for pass in $(seq 1 "$PASSES"); do
  for task in ${TASKS:-relu_affine gelu_tanh_affine layernorm_manual row_sumsq softmax_manual}; do
    for side in new old; do
      if [[ $side == new ]]; then bin="$ROOT/build-gpu/tools/crucible"; base="$ROOT"; else bin="$OLD_SRC/build/tools/crucible"; base="$OLD_SRC"; fi
      (cd "$base" && "$bin" eval --task tools/bench/eval_gpu/tasks/$task.py \
        --candidate tools/bench/eval_gpu/candidates/$task.py --device cuda:0 --repeat 3 --json ${EVAL_ARGS:-} 2>>"$OUT/eval-stderr-$side.log") |
        python3 -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        v = json.loads(line)
        print(json.dumps({"pass": int(sys.argv[1]), "task": sys.argv[2], "side": sys.argv[3], "status": v["status"],
                          "speedup": v["speedup"], "wall_s": v["wall_s"], "message": v["message"][:160]}))' "$pass" "$task" "$side" |
        tee -a "$OUT/isolation_cost.jsonl"
    done
  done
done
python3 - "$OUT/isolation_cost.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for task in sorted({r["task"] for r in rows}):
    line = [task]
    med = {}
    for side in ("old", "new"):
        w = [r["wall_s"] for r in rows if r["task"] == task and r["side"] == side and r["pass"] > 1]
        med[side] = statistics.median(w) if w else None
        line.append(f"{side} median {med[side]:.3f} s (n={len(w)})" if w else f"{side} -")
    if med["old"] and med["new"]:
        line.append(f"new/old {med['new'] / med['old']:.3f}")
    print("; ".join(line))
PY
