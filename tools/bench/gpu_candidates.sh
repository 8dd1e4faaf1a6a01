#!/usr/bin/env bash
# tools/bench/gpu_candidates.sh hacks [CANDIDATE...] | variants [FILTER...]: one verdict of each of
# a set of candidates on cuda:0 (docs/PERFORMANCE.md, "Reward hacks and legitimate kernels (issue
# 50)"), from crucible in BUILD (default build) to one JSON line a verdict in OUT (default
# runs/bench/candidates).
#   hacks     each GPU hack candidate (default: every file of tests/candidates/gpu) on the task its
#             '# task:' line names; none may be credited. Output: OUT/hacks.jsonl.
#   variants  every correct variant of env/tasks/gpu/variants (not wrong_*) whose LEVEL/TASK
#             contains a FILTER (default: all) on its task; none may be refused.
#             Output: OUT/variants.jsonl.
# Each verdict is `crucible eval --json --no-cache` (status, speedup, checks failed, wall time,
# message), once from each side of SIDES (default "new"): new is this checkout, old the checkout
# OLD_SRC (default old-src), built in OLD_SRC/build (configured here when it is not yet), the two
# alternated candidate by candidate. Each side's stderr goes to OUT/eval-sides-stderr-SIDE.log.
# EVAL_ARGS: more options of crucible eval for both sides (`--set evaluator.cuda_mps=on`).
# PYTHON: the interpreter (default .venv/bin/python, else python3).
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/candidates}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
SIDES="${SIDES:-new}"
[[ $# -gt 0 ]] || { echo "usage: tools/bench/gpu_candidates.sh hacks [CANDIDATE...] | variants [FILTER...] (--help)" >&2; exit 2; }
WHAT="$1"
shift
case "$WHAT" in hacks | variants) ;; *) echo "gpu_candidates: unknown set '$WHAT' (hacks, variants)" >&2; exit 2 ;; esac
mkdir -p "$OUT"

# crucible in BUILD, and in OLD_SRC/build where SIDES has old.
CRUCIBLE_BUILD_DIR="$BUILD" tools/build.sh crucible >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
OLD=""
if [[ " $SIDES " == *" old "* ]]; then
  OLD="$(cd "${OLD_SRC:-old-src}" && pwd)" || { echo "gpu_candidates: OLD_SRC (${OLD_SRC:-old-src}) is not a checkout" >&2; exit 2; }
  [[ -f "$OLD/build/build.ninja" ]] || cmake -S "$OLD" -B "$OLD/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    >"$OUT/configure-old.log" 2>&1 || { tail -30 "$OUT/configure-old.log"; exit 1; }
  cmake --build "$OLD/build" --target crucible -j "$(nproc)" > "$OUT/build-old.log" 2>&1 || { tail -30 "$OUT/build-old.log"; exit 1; }
fi

# One verdict of CANDIDATE on TASK (absolute paths) from each side in SIDES, one JSON line a
# verdict appended to JSONL (KEY: LABEL, side, status, speedup, checks, wall time, message).
eval_sides() { # KEY LABEL TASK CANDIDATE JSONL
  local key="$1" label="$2" task="$3" cand="$4" jsonl="$5" side bin base
  for side in $SIDES; do
    if [[ $side == new ]]; then bin="$BUILD/tools/crucible"; base="$ROOT"; else bin="$OLD/build/tools/crucible"; base="$OLD"; fi
    # shellcheck disable=SC2086 # EVAL_ARGS is a list of options
    (cd "$base" && timeout 300 "$bin" eval --task "$task" --candidate "$cand" --device cuda:0 --json --no-cache ${EVAL_ARGS:-} \
      2>>"$(dirname "$jsonl")/eval-sides-stderr-$side.log") |
      "$PYTHON" -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        v = json.loads(line)
        print(json.dumps({sys.argv[1]: sys.argv[2], "side": sys.argv[3], "status": v["status"], "speedup": v["speedup"],
                          "checks": v["checks_failed"], "wall_s": v.get("wall_s"), "message": v["message"][:300]}))' \
        "$key" "$label" "$side" | tee -a "$jsonl"
  done
}

if [[ $WHAT == hacks ]]; then # CANDIDATE...: relative to the checkout
  files=("$@")
  [[ ${#files[@]} -gt 0 ]] || files=(tests/candidates/gpu/*.py)
  for f in "${files[@]}"; do
    task="$(sed -n 's/^# task:[[:space:]]*//p' "$ROOT/$f" | head -1)"
    start=$(date +%s)
    eval_sides candidate "$(basename "$f")" "$ROOT/$task" "$ROOT/$f" "$OUT/hacks.jsonl"
    echo "gpu_candidates hacks: $(basename "$f") took $(( $(date +%s) - start )) s"
  done
else # FILTER...
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
fi
