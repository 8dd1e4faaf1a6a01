#!/usr/bin/env bash
# tools/bench/verdict_rate.sh: verdicts per GPU-minute, crucible against KernelBench's harness on the
# same pairs and the same GPU, one run (docs/PERFORMANCE.md, "Verdicts per GPU-minute"). The pairs:
# tools/bench/rate_set.py out of RELEASE (default data/cuda-l1/h100.json, fetch_cuda_l1.sh) with
# SET_ARGS (default "--torch 8 --inline 4 --self 4 --copies 4"). Steps, in the order of STEPS
# (default "kb cold warm1 warm2"):
#   kb     tools/bench/kernelbench_timing.py over set.jsonl on cuda:0, builds in a fresh folder
#          (KernelBench's run_and_check.py a pair, one after another)
#   cold   crucible eval --pairs set.jsonl on cuda:0, a fresh extension cache (XDG_CACHE_HOME)
#   warm1  crucible eval --pairs copies.jsonl on cuda:0, the extension cache cold left (builds made)
#   warm2  the same on cuda:0,cuda:1; warmN (N up to 8) on cuda:0 to cuda:N-1 (issue 88: verdicts per
#          minute with one, two and three evaluator GPUs, STEPS="cold warm1 warm2 warm3")
#   cold2  set.jsonl on cuda:0,cuda:1 with a fresh extension cache
# crucible runs with --no-cache (no verdict cache), evaluator.concurrency CONC (6) and
# evaluator.warm_workers WARM (12) a device; EVAL_ARGS: more crucible eval options; LAPS=1: with
# --verbose, and each step's laps summed by tools/bench/eval_laps.py in STEP.laps.txt. Each step's wall
# time is the whole process's (start included); STEP.times stamps each line of its stderr (a verdict
# a line) with the time it arrived, from which the summary takes the steady rate (the middle 80% of
# the verdicts, the start and the last stragglers left out). BUILD: the build (default build); OUT (default
# runs/bench/rate): the records (STEP.jsonl), logs (STEP.log), walls.txt and summary.txt
# (tools/bench/rate_summary.py). PYTHON: the interpreter with torch (.venv/bin/python, else python3).
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/rate}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
RELEASE="${RELEASE:-data/cuda-l1/h100.json}"
CONC="${CONC:-6}"
WARM="${WARM:-12}"
[[ -f "$RELEASE" ]] || { echo "verdict_rate.sh: $RELEASE: no such file (tools/bench/fetch_cuda_l1.sh)" >&2; exit 2; }
[[ -x "$BUILD/tools/crucible" ]] || { echo "verdict_rate.sh: $BUILD/tools/crucible: not built" >&2; exit 2; }
mkdir -p "$OUT"
# shellcheck disable=SC2086
"$PYTHON" tools/bench/rate_set.py "$RELEASE" "$OUT/set" ${SET_ARGS:---torch 8 --inline 4 --self 4 --copies 4} || exit 2
now() { date +%s.%N; }
stamp() { local l; while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done; }
crucible_step() { # NAME SET DEVICES CACHE
  local s
  rm -f "$OUT/$1.jsonl"
  s=$(now)
  # shellcheck disable=SC2086
  # stderr's lines (one a verdict on a pipe) each stamped with the time it arrived: STEP.times
  XDG_CACHE_HOME="$4" "$BUILD/tools/crucible" eval --pairs "$2" --device "$3" --no-cache --json --out "$OUT/$1.jsonl" \
    --set evaluator.concurrency="$CONC" --set evaluator.warm_workers="$WARM" ${EVAL_ARGS:-} \
    $([[ "${LAPS:-}" == 1 ]] && echo --verbose) 2>&1 > "$OUT/$1.log" | stamp > "$OUT/$1.times"
  local rc=${PIPESTATUS[0]} gpus
  [[ "${LAPS:-}" == 1 ]] && cut -d' ' -f2- "$OUT/$1.times" >> "$OUT/$1.log"
  [[ "${LAPS:-}" == 1 ]] && "$PYTHON" tools/bench/eval_laps.py --whole "$OUT/$1.log" > "$OUT/$1.laps.txt" 2>&1
  gpus=$(tr ',' '\n' <<< "$3" | grep -c .)
  echo "$1 $s $(now) $gpus $rc" >> "$OUT/walls.txt"
}
: > "$OUT/walls.txt"
for step in ${STEPS:-kb cold warm1 warm2}; do
  echo "== $step $(date +%T)"
  case "$step" in
    kb)
      rm -rf "$OUT/kb_build" "$OUT/kb.jsonl"; mkdir -p "$OUT/kb_build"
      s=$(now)
      "$PYTHON" tools/bench/kernelbench_timing.py --pairs "$OUT/set/set.jsonl" --device cuda:0 --out "$OUT/kb.jsonl" \
        --build-dir "$OUT/kb_build" > "$OUT/kb.log" 2>&1
      rc=$?
      echo "kb $s $(now) 1 $rc" >> "$OUT/walls.txt" ;;
    cold) rm -rf "$OUT/xdg_cold"; crucible_step cold "$OUT/set/set.jsonl" cuda:0 "$OUT/xdg_cold" ;;
    warm[1-8]) # warmN: the copies on cuda:0 to cuda:N-1
      n=${step#warm}
      (( n <= $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') )) ||
        { echo "verdict_rate.sh: $step needs $n GPUs; this machine has fewer" >&2; exit 2; }
      crucible_step "$step" "$OUT/set/copies.jsonl" "$(seq -s, -f 'cuda:%g' 0 $((n - 1)))" "$OUT/xdg_cold" ;;
    cold2) rm -rf "$OUT/xdg_cold2"; crucible_step cold2 "$OUT/set/set.jsonl" cuda:0,cuda:1 "$OUT/xdg_cold2" ;;
    *) echo "verdict_rate.sh: unknown step $step (kb, cold, warm1 to warm8, cold2)" >&2; exit 2 ;;
  esac
done
"$PYTHON" tools/bench/rate_summary.py "$OUT" | tee "$OUT/summary.txt"
