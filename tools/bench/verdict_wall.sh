#!/usr/bin/env bash
# tools/bench/verdict_wall.sh OLD_SRC [PASSES]: a verdict's wall time on one GPU with this checkout
# against an older one (docs/PERFORMANCE.md: "Timed calls checked like trials", "Work after the
# clock ...", "The workers' sandbox"), from the candidates of tools/bench/eval_gpu to OUT (default
# runs/bench/verdict_wall). This checkout's crucible is built in BUILD (default build), OLD_SRC's
# (a checkout of the commit before the change: 216711e for issue 50's checks, ec61a03 for the
# sandbox) in OLD_SRC/build, configured here when it is not yet. PASSES passes (3), each running
# `crucible eval --repeat 3` (three verdicts in one evaluator) of every task from both sides, the
# sides alternated task by task; the first pass is left out of the medians.
#   TASKS       the tasks (default "relu_affine gelu_tanh_affine layernorm_manual row_sumsq
#               softmax_manual")
#   ROUNDS=N    every verdict times exactly N rounds, so that both sides time the same work
#               (evaluator.rounds, min_rounds and max_rounds N, recheck_above 1e9)
#   EVAL_ARGS   more options of every crucible eval
# Output: OUT/isolation_cost.jsonl (one line a verdict), then each task's medians and new/old.
# PYTHON: the interpreter (default .venv/bin/python, else python3).
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/verdict_wall}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
[[ $# -ge 1 ]] || { echo "usage: tools/bench/verdict_wall.sh OLD_SRC [PASSES] (--help)" >&2; exit 2; }
OLD="$(cd "$1" && pwd)" || { echo "verdict_wall: OLD_SRC ($1) is not a checkout" >&2; exit 2; }
passes="${2:-3}"
args=()
for a in ${EVAL_ARGS:-}; do args+=("$a"); done
if [[ -n "${ROUNDS:-}" ]]; then
  args+=(--set "evaluator.rounds=$ROUNDS" --set "evaluator.min_rounds=$ROUNDS" --set "evaluator.max_rounds=$ROUNDS"
    --set evaluator.recheck_above=1e9)
fi
mkdir -p "$OUT"

# Both sides built at once, the cores shared about 5:3.
for side in "$ROOT:$BUILD" "$OLD:$OLD/build"; do
  [[ -f "${side#*:}/build.ninja" ]] || cmake -S "${side%%:*}" -B "${side#*:}" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    >>"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
done
jobs_new=$(( ($(nproc) * 5 + 7) / 8 )); jobs_old=$(( $(nproc) - jobs_new )); (( jobs_old > 0 )) || jobs_old=1
start=$(date +%s)
cmake --build "$BUILD" --target crucible -j "$jobs_new" > "$OUT/build-new.log" 2>&1 &
cmake --build "$OLD/build" --target crucible -j "$jobs_old" > "$OUT/build-old.log" 2>&1 &
wait
echo "verdict_wall: builds took $(( $(date +%s) - start )) s"
[[ -x "$BUILD/tools/crucible" && -x "$OLD/build/tools/crucible" ]] || { tail -20 "$OUT"/build-*.log; exit 1; }

for pass in $(seq 1 "$passes"); do
  for task in ${TASKS:-relu_affine gelu_tanh_affine layernorm_manual row_sumsq softmax_manual}; do
    for side in new old; do
      if [[ $side == new ]]; then bin="$BUILD/tools/crucible"; base="$ROOT"; else bin="$OLD/build/tools/crucible"; base="$OLD"; fi
      (cd "$base" && "$bin" eval --task "tools/bench/eval_gpu/tasks/$task.py" \
        --candidate "tools/bench/eval_gpu/candidates/$task.py" --device cuda:0 --repeat 3 --json "${args[@]}" \
        2>>"$OUT/eval-stderr-$side.log") |
        "$PYTHON" -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        v = json.loads(line)
        print(json.dumps({"pass": int(sys.argv[1]), "task": sys.argv[2], "side": sys.argv[3], "status": v["status"],
                          "speedup": v["speedup"], "wall_s": v["wall_s"], "message": v["message"][:160]}))' "$pass" "$task" "$side" |
        tee -a "$OUT/isolation_cost.jsonl"
    done
  done
done
"$PYTHON" - "$OUT/isolation_cost.jsonl" <<'PY'
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
