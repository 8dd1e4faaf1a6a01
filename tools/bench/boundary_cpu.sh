#!/usr/bin/env bash
# tools/bench/boundary_cpu.sh [identity|hacks [CANDIDATE...]]: the trust boundary's CPU figures
# (docs/PERFORMANCE.md, "The reward's trust boundary"), from crucible in BUILD (default build) to
# records in OUT (default runs/bench/boundary_cpu), for each value of evaluator.boundary in MODES
# (default "process", the one path; "shared", the single worker of before, only with CRUCIBLE
# naming a tree from before 0df72da, which removed it).
#   identity  the CPU suite's references against themselves (reference_as_candidate.py), one
#             verdict each in each mode: OUT/self_MODE.jsonl, each mode's wall time, then
#             band_check.py --self (within 1.00 ± 2%, bands, wall time a verdict)
#   hacks     one verdict of each CANDIDATE (default: the two hacks of tests/candidates/boundary
#             measured in both modes before, hack_harness_logging_refwrap.py and
#             hack_dispatcher_cpp_library_impl.py) on the task its '# task:' line names, in each
#             mode: OUT/hacks.jsonl (candidate, mode, status, speedup, band, message)
# Without a step, both. The whole set of boundary hacks, with the verdict each must get:
# ctest --test-dir build -R "candidate boundary". PYTHON: the interpreter with torch (default
# .venv/bin/python, else python3). CRUCIBLE: a crucible binary to measure instead of BUILD's (an
# older tree's, with LD_LIBRARY_PATH at its libraries), which is then not built.
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/boundary_cpu}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
C="${CRUCIBLE:-$BUILD/tools/crucible}"
case "${1:-}" in
  identity | hacks) steps=("$1"); shift ;;
  "") steps=(identity hacks) ;;
  *) echo "usage: tools/bench/boundary_cpu.sh [identity|hacks [CANDIDATE...]] (--help)" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
[[ -n "${CRUCIBLE:-}" ]] || CRUCIBLE_BUILD_DIR="$BUILD" tools/build.sh crucible >>"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }

for step in "${steps[@]}"; do
  case "$step" in
    identity)
      "$PYTHON" tools/bench/reference_as_candidate.py env/tasks/cpu "$OUT/self" 2>/dev/null
      for mode in ${MODES:-process}; do
        s=$(date +%s)
        rm -f "$OUT/self_$mode.jsonl"
        "$C" eval --pairs "$OUT/self/pairs.tsv" --device cpu --no-cache --json --set evaluator.boundary="$mode" \
          --out "$OUT/self_$mode.jsonl" > /dev/null 2> "$OUT/self_$mode.err"
        echo "identity boundary=$mode rc=$? $(( $(date +%s) - s )) s"
        "$PYTHON" tools/bench/band_check.py "$OUT/self_$mode.jsonl" --self 2>&1
      done ;;
    hacks)
      files=("$@")
      [[ ${#files[@]} -gt 0 ]] || files=(tests/candidates/boundary/hack_harness_logging_refwrap.py
        tests/candidates/boundary/hack_dispatcher_cpp_library_impl.py)
      for f in "${files[@]}"; do
        task="$(sed -n 's/^# task:[[:space:]]*//p' "$f" | head -1)"
        for mode in ${MODES:-process}; do
          "$C" eval --task "$task" --candidate "$f" --device cpu --no-cache --json --set evaluator.boundary="$mode" \
            2>>"$OUT/hacks.err" | "$PYTHON" -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        v = json.loads(line)
        print(json.dumps({"candidate": sys.argv[1], "mode": sys.argv[2], "status": v["status"], "speedup": v["speedup"],
                          "band": v.get("speedup_spread"), "message": v["message"][:300]}))' "$(basename "$f")" "$mode" |
            tee -a "$OUT/hacks.jsonl"
        done
      done ;;
  esac
done
