#!/usr/bin/env bash
# tools/bench/eval_throughput.sh: the evaluator's throughput on one GPU (docs/PERFORMANCE.md,
# "Evaluator throughput and sequential verdicts"), from bench_eval_throughput in BUILD (default
# build) to OUT (default runs/bench/throughput). Runs it once at each concurrency of CONCURRENCIES
# (default "5 6 5") with CANDIDATES candidates (40), both passes, and each measured pass's gate
# timeline in OUT/timeline_N_cC.txt with its breakdown (gate_timeline.py). EVAL_SETS: --set options
# for every run ("key=value key=value"); RUN_SETS: "|"-separated, the Nth field's --set options for
# the Nth run; LAPS=1: --verbose 1, each run's log kept in OUT/laps_N.txt with its steps' medians
# (eval_laps.py). Output: OUT/concurrency.txt. PYTHON: the interpreter with torch (default
# .venv/bin/python, else python3).
#
# The goals table's figure (a burst of 20 at concurrency 6, the pool refilled while idle) alone:
#   CANDIDATES=20 CONCURRENCIES=6 EVAL_SETS="evaluator.refill=when-idle evaluator.warm_workers=20" \
#     tools/bench/eval_throughput.sh
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/throughput}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
# The Python lines that only say the worker's NVML or fork warnings, left out of the logs shown.
NOISE="NVML|raw_cnt|DeprecationWarning|pid = os.fork"
mkdir -p "$OUT"
CRUCIBLE_BUILD_DIR="$BUILD" tools/build.sh crucible bench_eval_throughput >>"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }

n=0
IFS='|' read -r -a run_sets <<< "${RUN_SETS:-}"
for c in ${CONCURRENCIES:-5 6 5}; do
  n=$((n + 1))
  extra="${EVAL_SETS:-} ${run_sets[$((n - 1))]:-}"
  sets=(); for s in $extra; do sets+=(--set "$s"); done
  echo "== concurrency $c $extra" | tee -a "$OUT/concurrency.txt"
  verbose=(); [[ "${LAPS:-}" == 1 ]] && verbose=(--verbose 1)
  "$BUILD/tools/bench/bench_eval_throughput" --device cuda:0 --concurrency "$c" --candidates "${CANDIDATES:-40}" \
    "${sets[@]}" "${verbose[@]}" --timeline "$OUT/timeline_${n}_c$c.txt" > "$OUT/laps_$n.txt" 2>&1
  grep -Ev "$NOISE| DEBUG |^\s*$" "$OUT/laps_$n.txt" | tee -a "$OUT/concurrency.txt"
  "$PYTHON" tools/bench/gate_timeline.py "$OUT/timeline_${n}_c$c.txt" 2>&1 | tee -a "$OUT/concurrency.txt"
  [[ "${LAPS:-}" == 1 ]] && "$PYTHON" tools/bench/eval_laps.py "$OUT/laps_$n.txt" 2>&1 | tee -a "$OUT/concurrency.txt"
  [[ "${LAPS:-}" == 1 ]] || rm -f "$OUT/laps_$n.txt"
done
